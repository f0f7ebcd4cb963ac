/* fuzz_smoke: a plain (no libFuzzer) replay of the fuzz targets, run by ctest.
 *  1. every file of the seed corpus (tests/fuzz/corpus/{safetensors,config}: hand-written seeds plus
 *     lf_* inputs kept from libFuzzer runs, minimized with -merge=1) through the parsers;
 *  2. randomly generated valid safetensors images, which must be accepted with exactly the
 *     generated tensors (names, dtypes, shapes, byte ranges);
 *  3. ~20,000 random mutations of valid safetensors images and ~20,000 of valid configs.
 * Invariant violations are counted and the offending input is written to fuzz_smoke_fail_*.bin.
 * Usage: fuzz_smoke <corpus dir> [iterations] (seed: env SMELT_FUZZ_SEED). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failures;
static const uint8_t *g_cur;
static size_t g_cur_len;
static void fuzz_fail(const char *msg, int line) {
  if (g_failures < 20) {
    char fn[64];
    snprintf(fn, sizeof fn, "fuzz_smoke_fail_%d.bin", g_failures);
    FILE *f = fopen(fn, "wb");
    if (f) {
      fwrite(g_cur, 1, g_cur_len, f);
      fclose(f);
    }
    fprintf(stderr, "FAIL (line %d): %s; input saved to %s\n", line, msg, fn);
  }
  g_failures++;
}
#define FUZZ_FAIL(msg) fuzz_fail(msg, __LINE__)
#include "fuzz_targets.h"

static void run_st(const uint8_t *d, size_t n) {
  g_cur = d;
  g_cur_len = n;
  fuzz_safetensors_one(d, n);
}
static void run_cfg(const uint8_t *d, size_t n) {
  g_cur = d;
  g_cur_len = n;
  fuzz_config_one(d, n);
}

/* ------------------------------------------------------------------ rng */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
static size_t rn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* ---------------------------------------------------------------- buffer */
typedef struct {
  char *p;
  size_t n, cap;
} buf;
static void b_reserve(buf *b, size_t extra) {
  if (b->n + extra + 1 > b->cap) {
    b->cap = (b->n + extra + 1) * 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) {
      fprintf(stderr, "oom\n");
      exit(2);
    }
  }
}
static void b_add(buf *b, const void *s, size_t n) {
  b_reserve(b, n);
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
static void b_str(buf *b, const char *s) { b_add(b, s, strlen(s)); }
static void b_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#include <stdarg.h>
static void b_printf(buf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  b_add(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}
static void b_insert(buf *b, size_t at, const char *s, size_t n) {
  if (at > b->n) at = b->n;
  b_reserve(b, n);
  memmove(b->p + at + n, b->p + at, b->n - at);
  memcpy(b->p + at, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
static void b_erase(buf *b, size_t at, size_t n) {
  if (at >= b->n) return;
  if (n > b->n - at) n = b->n - at;
  memmove(b->p + at, b->p + at + n, b->n - at - n);
  b->n -= n;
  b->p[b->n] = 0;
}

/* ------------------------------------------------------- valid images */
static const char *k_dt[] = {"F32", "F16", "BF16", "F64", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "BOOL"};
static const size_t k_dt_size[] = {4, 2, 2, 8, 1, 1, 2, 2, 4, 4, 8, 8, 1};

typedef struct {
  char name[48];
  int dt, ndim;
  int64_t shape[8];
  uint64_t begin, end;
} gen_tensor;

/* random valid header; fills ts (<= 16 tensors); returns data size */
static size_t gen_header(buf *h, gen_tensor *ts, int *nt) {
  int n = (int)rn(9);
  uint64_t off = rn(3) ? 0 : rn(16); /* sometimes a gap at the start */
  b_str(h, "{");
  bool meta = rn(2);
  int meta_at = (int)rn((size_t)n + 1);
  bool first = true;
  for (int i = 0; i <= n; i++) {
    if (meta && i == meta_at) {
      b_str(h, first ? "" : ",");
      b_str(h, "\"__metadata__\":{\"format\":\"mlx\",\"k\":\"v\"}");
      first = false;
    }
    if (i == n) break;
    gen_tensor *t = &ts[i];
    snprintf(t->name, sizeof t->name, "model.layers.%d.%s", (int)rn(40),
             (const char *[]){"w", "scales", "biases", "q_proj.weight"}[rn(4)]);
    /* make names unique */
    char suffix[16];
    snprintf(suffix, sizeof suffix, ".%d", i);
    strncat(t->name, suffix, sizeof t->name - strlen(t->name) - 1);
    t->dt = (int)rn(13);
    t->ndim = (int)rn(5);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      t->shape[d] = (int64_t)rn(rn(8) ? 5 : 1) + (rn(6) ? 1 : 0);
      numel *= (uint64_t)t->shape[d];
    }
    t->begin = off;
    t->end = off + numel * k_dt_size[t->dt];
    off = t->end + (rn(5) ? 0 : rn(8)); /* occasional gaps */
    b_printf(h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", first ? "" : ",", t->name, k_dt[t->dt]);
    for (int d = 0; d < t->ndim; d++) b_printf(h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    b_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin, (unsigned long long)t->end);
    first = false;
  }
  b_str(h, "}");
  int pad = (int)rn(8);
  for (int i = 0; i < pad; i++) b_str(h, " ");
  *nt = n;
  return (size_t)off + (rn(4) ? 0 : rn(16));
}

static void make_image(buf *img, const char *hdr, size_t hlen, uint64_t claimed, size_t dlen) {
  img->n = 0;
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(claimed >> (8 * i));
  b_add(img, le, 8);
  b_add(img, hdr, hlen);
  b_reserve(img, dlen);
  for (size_t i = 0; i < dlen; i++) img->p[img->n++] = (char)(i * 31 + 7);
}

/* a valid generated image must be accepted exactly */
static void check_valid(const buf *img, const buf *h, const gen_tensor *ts, int nt) {
  g_cur = (const uint8_t *)img->p;
  g_cur_len = img->n;
  sm_st *st = NULL;
  if (sm_st_parse_buffer(img->p, img->n, &st) != SMELT_OK) {
    fprintf(stderr, "valid image rejected: %s\n", sm_errmsg());
    FUZZ_FAIL("valid image rejected");
    return;
  }
  if ((int)sm_st_count(st) != nt) FUZZ_FAIL("tensor count");
  const uint8_t *base = (const uint8_t *)img->p + 8 + h->n;
  for (int i = 0; i < nt; i++) {
    const sm_tensor *t = sm_st_find(st, ts[i].name);
    if (!t) {
      FUZZ_FAIL("generated tensor missing");
      continue;
    }
    if ((int)t->dtype != ts[i].dt || t->ndim != ts[i].ndim || (const uint8_t *)t->data != base + ts[i].begin ||
        t->nbytes != ts[i].end - ts[i].begin)
      FUZZ_FAIL("generated tensor differs");
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] != ts[i].shape[d]) FUZZ_FAIL("shape differs");
  }
  sm_st_close(st);
  fuzz_safetensors_one((const uint8_t *)img->p, img->n);
}

/* ---------------------------------------------------------- mutators */
static const char *k_tokens[] = {
  "-1",
  "0",
  "1",
  "-0",
  "0.5",
  "1e308",
  "-1e308",
  "1e-320",
  "4294967296",
  "9007199254740993",
  "18446744073709551615",
  "18446744073709551616",
  "9223372036854775807",
  "2147483648",
  "-2147483649",
  "NaN",
  "Infinity",
  "null",
  "true",
  "false",
  "[]",
  "{}",
  "[0,0]",
  "[1,2,3]",
  "\"\"",
  "\"F32\"",
  "\"BF16\"",
  "\"F8_E4M3\"",
  "\"I4\"",
  "\"x\"",
  "\"__metadata__\"",
  "\"dtype\"",
  "\"shape\"",
  "\"data_offsets\"",
  "{\"a\":1}",
  "\"\\u0000\"",
  "\"\\ud800\"",
  "[[[[[[[[[[",
  "]]]]",
  "{{{{",
  "}}}",
  ",",
  ":",
  "\"",
  "\\",
  " ",
  "\n",
  "\xff",
  "\xc3\xa9",
  "\"text_config\"",
  "\"quantization\"",
  "\"bits\"",
  "\"group_size\"",
  "\"rope_scaling\"",
  "\"rope_type\"",
  "\"llama3\"",
  "\"yarn\"",
  "\"linear\"",
  "\"longrope\"",
  "\"eos_token_id\"",
  "\"head_dim\"",
  "\"hidden_size\"",
  "\"num_key_value_heads\"",
  "\"num_attention_heads\"",
  "\"model_type\"",
  "\"gemma3\"",
  "\"qwen2\"",
  "\"phi3\"",
  "\"partial_rotary_factor\"",
  "\"sliding_window\"",
  "\"use_sliding_window\"",
  "\"rope_parameters\"",
  "{\"bits\":8,\"group_size\":32}",
  "{\"bits\":3}",
  "{\"group_size\":7}",
  "\"mode\"",
  "\"mxfp4\"",
  "[1,106]",
  "[128001,128008,128009]",
  "\"full_attention\"",
  "{\"rope_type\":\"yarn\",\"factor\":2}",
};

/* number or token boundaries */
static size_t find_number(const buf *b, size_t from) {
  for (size_t i = from; i < b->n; i++)
    if ((b->p[i] >= '0' && b->p[i] <= '9') || b->p[i] == '-') return i;
  for (size_t i = 0; i < from && i < b->n; i++)
    if ((b->p[i] >= '0' && b->p[i] <= '9') || b->p[i] == '-') return i;
  return b->n;
}

static void mutate_text(buf *b) {
  int k = 1 + (int)rn(3);
  for (int m = 0; m < k; m++) {
    switch (rn(8)) {
      case 0: { /* replace a number by a token */
        size_t at = find_number(b, rn(b->n));
        if (at >= b->n) break;
        size_t e = at + 1;
        while (e < b->n && ((b->p[e] >= '0' && b->p[e] <= '9') || strchr(".eE+-", b->p[e]))) e++;
        b_erase(b, at, e - at);
        const char *t = k_tokens[rn(SM_ARRAY_LEN(k_tokens))];
        b_insert(b, at, t, strlen(t));
        break;
      }
      case 1: { /* insert a token anywhere */
        const char *t = k_tokens[rn(SM_ARRAY_LEN(k_tokens))];
        b_insert(b, rn(b->n + 1), t, strlen(t));
        break;
      }
      case 2: /* delete a span */ b_erase(b, rn(b->n), 1 + rn(rn(4) ? 4 : 64)); break;
      case 3: { /* duplicate a span */
        if (!b->n) break;
        size_t at = rn(b->n), len = 1 + rn(SM_MIN((size_t)80, b->n - at));
        char tmp[128];
        memcpy(tmp, b->p + at, len);
        b_insert(b, rn(b->n + 1), tmp, len);
        break;
      }
      case 4: /* random byte */
        if (b->n) b->p[rn(b->n)] = (char)rn(256);
        break;
      case 5: /* ASCII punctuation */
        if (b->n) b->p[rn(b->n)] = "{}[]\",:-0123456789 eE."[rn(22)];
        break;
      case 6: { /* negate or grow a number */
        size_t at = find_number(b, rn(b->n));
        const char *t = rn(2) ? "-" : "99999";
        if (at < b->n) b_insert(b, at, t, strlen(t));
        break;
      }
      default: { /* swap two digits far apart (reorders offsets) */
        size_t x = find_number(b, rn(b->n)), y = find_number(b, rn(b->n));
        if (x < b->n && y < b->n) {
          char c = b->p[x];
          b->p[x] = b->p[y];
          b->p[y] = c;
        }
        break;
      }
    }
  }
}

static void mutate_binary(buf *img) {
  switch (rn(5)) {
    case 0:
      if (img->n) img->p[rn(img->n)] ^= (char)(1u << rn(8));
      break;
    case 1:
      if (img->n) img->n = rn(img->n);
      break;
    case 2:
      if (img->n >= 8) img->p[rn(8)] = (char)rn(256);
      break; /* length prefix */
    case 3: {
      char junk[16];
      for (int i = 0; i < 16; i++) junk[i] = (char)rnd();
      b_add(img, junk, 1 + rn(16));
      break;
    }
    default:
      if (img->n >= 8) { /* plausible but wrong length */
        uint64_t l = 0;
        for (int i = 7; i >= 0; i--) l = (l << 8) | (uint8_t)img->p[i];
        l += (uint64_t)(int64_t)((int)rn(33) - 16);
        for (int i = 0; i < 8; i++) img->p[i] = (char)(l >> (8 * i));
      }
  }
}

/* ------------------------------------------------------------- corpus */
static int run_corpus_dir(const char *dir, void (*fn)(const uint8_t *, size_t), buf *keep, int *nkeep) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "cannot open corpus dir %s\n", dir);
    return -1;
  }
  struct dirent *de;
  int n = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    FILE *f = fopen(p, "rb");
    if (!f) continue;
    buf b = {0};
    char tmp[4096];
    size_t r;
    while ((r = fread(tmp, 1, sizeof tmp, f)) > 0) b_add(&b, tmp, r);
    fclose(f);
    fn((const uint8_t *)(b.p ? b.p : ""), b.n);
    n++;
    /* hand-written seeds (not the lf_* inputs libFuzzer found) are the bases for mutation */
    if (keep && *nkeep < 32 && strncmp(de->d_name, "lf_", 3) != 0) keep[(*nkeep)++] = b;
    else free(b.p);
  }
  closedir(d);
  return n;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <corpus dir> [iterations]\n", argv[0]);
    return 2;
  }
  int iters = argc > 2 ? atoi(argv[2]) : 20000;
  const char *seed = getenv("SMELT_FUZZ_SEED");
  if (seed) g_rng = strtoull(seed, NULL, 0) | 1;
  char p[1024];

  buf cfgs[32];
  int ncfg = 0;
  snprintf(p, sizeof p, "%s/safetensors", argv[1]);
  int n1 = run_corpus_dir(p, run_st, NULL, NULL);
  snprintf(p, sizeof p, "%s/config", argv[1]);
  int n2 = run_corpus_dir(p, run_cfg, cfgs, &ncfg);
  if (n1 <= 0 || n2 <= 0 || ncfg == 0) {
    fprintf(stderr, "empty corpus\n");
    return 2;
  }
  printf("corpus: %d safetensors, %d config files\n", n1, n2);

  /* safetensors: valid images, then mutations */
  buf h = {0}, img = {0};
  gen_tensor ts[16];
  int accepted = 0;
  for (int it = 0; it < iters; it++) {
    h.n = 0;
    int nt;
    size_t dlen = gen_header(&h, ts, &nt);
    make_image(&img, h.p, h.n, h.n, dlen);
    if (it % 4 == 0) check_valid(&img, &h, ts, nt);
    if (rn(5)) { /* mutate the JSON and fix up the length prefix */
      mutate_text(&h);
      make_image(&img, h.p, h.n, rn(10) ? h.n : rnd() >> rn(64), dlen);
    } else {
      mutate_binary(&img);
    }
    g_cur = (const uint8_t *)img.p;
    g_cur_len = img.n;
    sm_st *st = NULL;
    if (sm_st_parse_buffer(img.p, img.n, &st) == SMELT_OK) {
      accepted++;
      sm_st_close(st);
    }
    fuzz_safetensors_one((const uint8_t *)img.p, img.n);
  }
  printf("safetensors: %d mutated images, %d still accepted\n", iters, accepted);

  /* configs: mutations of the corpus configs */
  int cfg_ok = 0;
  buf c = {0};
  for (int it = 0; it < iters; it++) {
    const buf *src = &cfgs[rn((size_t)ncfg)];
    c.n = 0;
    b_add(&c, src->p, src->n);
    mutate_text(&c);
    if (rn(3) == 0) mutate_text(&c);
    g_cur = (const uint8_t *)c.p;
    g_cur_len = c.n;
    sm_config cc;
    if (sm_config_parse(c.p, c.n, NULL, 0, sm_family_defaults, &cc) == SMELT_OK) {
      cfg_ok++;
      sm_config_free(&cc);
    }
    fuzz_config_one((const uint8_t *)c.p, c.n);
  }
  printf("config: %d mutated configs, %d still accepted\n", iters, cfg_ok);
  free(h.p);
  free(img.p);
  free(c.p);
  for (int i = 0; i < ncfg; i++) free(cfgs[i].p);
  printf("%d invariant violations\n", g_failures);
  return g_failures ? 1 : 0;
}
