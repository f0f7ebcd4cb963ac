/* Sessions keep the KV of a conversation between calls (asserted by the prefill token counts, and
 * by the output equalling a cold run), stop at the context and on cancel; prompt cache files
 * round-trip to the output of a cold run, feed a prefix cache, and corrupt or mismatched files are
 * refused. Runs on the built-in models with exact CPU kernels (SMELT_CPU_EXACT=1). */
#include <string.h>
#include <unistd.h>
#include "engine/prompt_cache.h"
#include "engine/session.h"
#include "../test_util.h"

typedef struct {
  char buf[16384];
  size_t len;
} text;
static bool collect(const char *p, size_t l, void *u) {
  text *t = u;
  if (t->len + l < sizeof t->buf) {
    memcpy(t->buf + t->len, p, l);
    t->len += l;
    t->buf[t->len] = 0;
  }
  return true;
}

static smelt_model *load_kv(const char *root, const char *name, int ctx, smelt_kv_type kv) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/models/%s", root, name);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  mp.max_context = ctx;
  mp.kv_type = kv;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    fprintf(stderr, "%s: %s\n", name, smelt_last_error());
    exit(1);
  }
  return m;
}

static smelt_model *load(const char *root, const char *name, int ctx) {
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  return load_kv(root, name, ctx, mp.kv_type);
}

static int32_t *tokenize(smelt_model *m, const char *s, int *n) {
  int32_t *ids = NULL;
  size_t k = 0;
  if (smelt_tokenize(smelt_model_tokenizer(m), s, strlen(s), true, &ids, &k)) exit(1);
  *n = (int)k;
  return ids;
}

static int cancel_after;
static bool cancel_cb(void *ud) {
  (void)ud;
  return --cancel_after < 0;
}

/* generate greedily on a fresh session: the reference of a cold run */
static void cold(smelt_model *m, smelt_model *d, const int32_t *ids, int n, int max, text *out, sm_session_stats *st) {
  sm_session *s;
  if (sm_session_create(m, d, 4, 0, 0, &s)) {
    fprintf(stderr, "%s\n", smelt_last_error());
    exit(1);
  }
  sm_session_opts o = {.max_tokens = max, .on_piece = collect, .user = out};
  CHECK(sm_session_generate(s, ids, n, &o, st) == SMELT_OK, "cold run: %s", smelt_last_error());
  sm_session_free(s);
}

static void flip_byte(const char *src, const char *dst, long off, int trunc) {
  FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
  int c;
  long i = 0;
  while ((c = fgetc(a)) != EOF) {
    if (trunc && i >= off) break;
    fputc(!trunc && i == off ? c ^ 0x5a : c, b);
    i++;
  }
  fclose(a);
  fclose(b);
}

/* save the KV of p[0..n1) and continue p[0..n2) from the loaded file: equal to a cold run */
static void roundtrip(smelt_model *m, const int32_t *p, int n1, int n2, const char *path) {
  sm_session *s;
  sm_session_stats st;
  sm_session_create(m, NULL, 0, 0, 0, &s);
  CHECK(sm_session_prefill(s, p, n1, NULL, &st) == SMELT_OK, "prefill: %s", smelt_last_error());
  CHECK(sm_prompt_cache_save(sm_session_engine(s), sm_session_seq(s), n1, path) == SMELT_OK, "save: %s",
        smelt_last_error());
  sm_session_free(s);
  sm_prompt_cache *pc = NULL;
  CHECK(sm_prompt_cache_open(path, m, &pc) == SMELT_OK, "open: %s", smelt_last_error());
  if (!pc) return;
  sm_session_create(m, NULL, 0, 0, 0, &s);
  CHECK(sm_prompt_cache_restore(pc, sm_session_engine(s), sm_session_seq(s), n1) == SMELT_OK, "restore: %s",
        smelt_last_error());
  sm_prompt_cache_close(pc);
  text warm = {.len = 0}, ref = {.len = 0};
  sm_session_opts o = {.max_tokens = 32, .on_piece = collect, .user = &warm};
  CHECK(sm_session_generate(s, p, n2, &o, &st) == SMELT_OK && st.n_reused == n1 && st.n_prefilled == n2 - n1,
        "loaded cache: %d reused, %d prefilled", st.n_reused, st.n_prefilled);
  sm_session_free(s);
  cold(m, NULL, p, n2, 32, &ref, &st);
  smelt_model_info info;
  smelt_model_get_info(m, &info);
  CHECK(warm.len > 0 && !strcmp(warm.buf, ref.buf),
        "%s KV: cache run differs from a cold run\n  cache: %s\n  cold:  %s", smelt_kv_type_name(info.kv_type),
        warm.buf, ref.buf);
  unlink(path);
}

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : ".", *tmp = argc > 2 ? argv[2] : "/tmp";
  smelt_model *m = load(root, "smelt-tiny", 512), *dm = load(root, "smelt-tiny-draft", 512);
  int n1, nx;
  int32_t *p1 = tokenize(
    m,
    "In the beginning God created the heaven and the earth. And God said, Let there be light: and there was light. And God saw the light, that it was good.",
    &n1);
  int32_t *x = tokenize(m, " And the earth was without form, and void", &nx);

  for (int spec = 0; spec < 2; spec++) {
    sm_session *s;
    CHECK(sm_session_create(m, spec ? dm : NULL, 4, 0, 0, &s) == SMELT_OK, "create: %s", smelt_last_error());
    text t1 = {.len = 0}, t2 = {.len = 0};
    sm_session_stats a, b;
    sm_session_opts o = {.max_tokens = 24, .on_piece = collect, .user = &t1};
    CHECK(sm_session_generate(s, p1, n1, &o, &a) == SMELT_OK, "turn 1: %s", smelt_last_error());
    CHECK(a.n_reused == 0 && a.n_prefilled == n1, "turn 1 prefills the whole prompt: %d reused, %d prefilled of %d",
          a.n_reused, a.n_prefilled, n1);
    CHECK(a.st.n_generated == 24 && a.stop == SM_STOP_LENGTH, "turn 1: %d tokens, stop %s", a.st.n_generated,
          sm_stop_name(a.stop));
    /* the session holds the prompt and every generated token but the last */
    int held = sm_session_len(s);
    CHECK(held == n1 + 24 - 1, "held %d tokens, expected %d", held, n1 + 24 - 1);
    /* turn 2: everything held + new text: only the new tokens are prefilled */
    int n2 = held + nx - 1; /* x without its BOS */
    int32_t *p2 = malloc(sizeof(int32_t) * n2);
    memcpy(p2, sm_session_tokens(s), sizeof(int32_t) * held);
    memcpy(p2 + held, x + 1, sizeof(int32_t) * (nx - 1));
    o.user = &t2;
    CHECK(sm_session_generate(s, p2, n2, &o, &b) == SMELT_OK, "turn 2: %s", smelt_last_error());
    CHECK(b.n_reused == held && b.n_prefilled == nx - 1, "turn 2 (spec %d): %d reused, %d prefilled; expected %d, %d",
          spec, b.n_reused, b.n_prefilled, held, nx - 1);
    text c2 = {.len = 0};
    sm_session_stats c;
    cold(m, spec ? dm : NULL, p2, n2, 24, &c2, &c);
    CHECK(c.n_prefilled == n2, "the cold run prefills all %d tokens (%d)", n2, c.n_prefilled);
    CHECK(t2.len > 0 && !strcmp(t2.buf, c2.buf), "spec %d: turn 2 differs from a cold run\n  kept: %s\n  cold: %s",
          spec, t2.buf, c2.buf);
    /* the same prompt again: all but its last token reused */
    text t3 = {.len = 0};
    o.user = &t3;
    CHECK(sm_session_generate(s, p2, n2, &o, &b) == SMELT_OK && b.n_reused == n2 - 1 && b.n_prefilled == 1,
          "same prompt again: %d reused, %d prefilled", b.n_reused, b.n_prefilled);
    CHECK(!strcmp(t3.buf, c2.buf), "regenerated reply differs from the cold run: %s", t3.buf);
    /* a prompt that diverges early keeps only the common prefix */
    CHECK(sm_session_generate(s, x, nx, &o, &b) == SMELT_OK && b.n_reused == 1 && b.n_prefilled == nx - 1,
          "diverging prompt: %d reused (BOS only), %d prefilled", b.n_reused, b.n_prefilled);
    free(p2);
    sm_session_free(s);
  }

  /* cancel: stops after the cancelled callback says so, the session stays usable */
  {
    sm_session *s;
    sm_session_create(m, NULL, 0, 0, 0, &s);
    text t = {.len = 0};
    sm_session_stats st;
    cancel_after = 6; /* 1 poll before the prefill step, then one per token: the 6th token stops */
    sm_session_opts o = {.max_tokens = 100,
                         .on_piece = collect,
                         .user = &t,
                         .cancelled = cancel_cb,
                         .ignore_eos = true};
    CHECK(sm_session_generate(s, p1, n1, &o, &st) == SMELT_OK, "cancelled run: %s", smelt_last_error());
    CHECK(st.stop == SM_STOP_CANCELLED && st.st.n_generated == 6, "cancel: stop %s after %d tokens",
          sm_stop_name(st.stop), st.st.n_generated);
    cancel_after = 0; /* cancelled before the prefill: nothing computed */
    sm_session_reset(s);
    CHECK(sm_session_generate(s, p1, n1, &o, &st) == SMELT_OK && st.stop == SM_STOP_CANCELLED && st.n_prefilled == 0 &&
            st.st.n_generated == 0,
          "cancel before prefill: %s, %d prefilled", sm_stop_name(st.stop), st.n_prefilled);
    sm_session_free(s);
  }

  /* the context limit: generation stops there and says so */
  {
    sm_session *s;
    sm_session_create(m, NULL, 0, n1 + 20, 0, &s);
    sm_session_stats st;
    sm_session_opts o = {.max_tokens = -1, .ignore_eos = true};
    CHECK(sm_session_generate(s, p1, n1, &o, &st) == SMELT_OK, "context run: %s", smelt_last_error());
    CHECK(st.stop == SM_STOP_CONTEXT && st.st.n_generated == 20, "context stop: %s after %d (want 20)",
          sm_stop_name(st.stop), st.st.n_generated);
    o.max_tokens = 1000;
    CHECK(sm_session_generate(s, p1, n1, &o, &st) == SMELT_OK && st.stop == SM_STOP_CONTEXT, "-n beyond the context");
    int32_t big[256] = {0};
    CHECK(sm_session_generate(s, big, n1 + 20, &o, &st) == SMELT_ERR_LIMIT, "a prompt filling the context is refused");
    sm_session_free(s);
  }

  /* prompt cache: save the KV of a prefix, load it into a fresh session: equal to a cold run */
  char path[1024], bad[1100];
  snprintf(path, sizeof path, "%s/test-session-%d.kv", tmp, (int)getpid());
  snprintf(bad, sizeof bad, "%s.bad", path);
  {
    sm_session *s;
    sm_session_create(m, NULL, 0, 0, 0, &s);
    sm_session_stats st;
    CHECK(sm_session_prefill(s, p1, n1, NULL, &st) == SMELT_OK && st.n_prefilled == n1, "prefill: %s",
          smelt_last_error());
    CHECK(sm_prompt_cache_save(sm_session_engine(s), sm_session_seq(s), n1, path) == SMELT_OK, "save: %s",
          smelt_last_error());
    sm_session_free(s);

    int n2 = n1 + nx - 1;
    int32_t *p2 = malloc(sizeof(int32_t) * n2);
    memcpy(p2, p1, sizeof(int32_t) * n1);
    memcpy(p2 + n1, x + 1, sizeof(int32_t) * (nx - 1));
    sm_prompt_cache *pc;
    CHECK(sm_prompt_cache_open(path, m, &pc) == SMELT_OK, "open: %s", smelt_last_error());
    CHECK(sm_prompt_cache_len(pc) == n1 && sm_prompt_cache_match(pc, p2, n2) == n1, "cache holds the prefix");
    sm_session_create(m, NULL, 0, 0, 0, &s);
    CHECK(sm_prompt_cache_restore(pc, sm_session_engine(s), sm_session_seq(s), n1) == SMELT_OK, "restore: %s",
          smelt_last_error());
    text warm = {.len = 0}, ref = {.len = 0};
    sm_session_opts o = {.max_tokens = 32, .on_piece = collect, .user = &warm};
    CHECK(sm_session_generate(s, p2, n2, &o, &st) == SMELT_OK && st.n_reused == n1 && st.n_prefilled == nx - 1,
          "after loading the cache only the new tokens are prefilled (%d reused, %d prefilled)", st.n_reused,
          st.n_prefilled);
    sm_session_stats cst;
    cold(m, NULL, p2, n2, 32, &ref, &cst);
    CHECK(warm.len > 0 && !strcmp(warm.buf, ref.buf),
          "prompt cache run differs from a cold run\n  cache: %s\n  cold:  %s", warm.buf, ref.buf);
    sm_session_free(s);

    /* seeding a prefix-cache engine: a later sequence with that prefix reuses its full blocks */
    sm_engine_params ep;
    sm_engine_params_default(&ep);
    ep.max_context = 512;
    sm_engine *e;
    sm_engine_create(m, &ep, &e);
    int held = 0;
    CHECK(sm_prompt_cache_seed(pc, e, &held) == SMELT_OK && held == n1 / 16 * 16, "seed: %d tokens", held);
    sm_seq *q = sm_seq_new(e);
    sm_seq_append(e, q, p2, n2);
    int hit = sm_seq_use_prefix_cache(e, q);
    CHECK(hit == n1 / 16 * 16 && hit > 0, "prefix hit %d tokens after seeding (want %d)", hit, n1 / 16 * 16);
    sm_seq_free(e, q);
    sm_engine_free(e);
    sm_prompt_cache_close(pc);
    free(p2);

    /* damaged or mismatched files are refused with a message naming the problem */
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    struct {
      long off;
      int trunc;
      const char *want;
    } cases[] = {
      {size / 2, 0, "checksum"},    /* a flipped KV byte */
      {130, 0, "checksum"},         /* a flipped token byte */
      {size - 100, 1, "truncated"}, /* cut short */
      {0, 0, "not a smelt prompt cache"},
      {8, 0, "version"},
      {20, 0, "another model"}, /* fingerprint */
      {52, 0, "KV format"},     /* layer count */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      flip_byte(path, bad, cases[i].off, cases[i].trunc);
      sm_prompt_cache *p = NULL;
      smelt_status r = sm_prompt_cache_open(bad, m, &p);
      CHECK(r != SMELT_OK && !p && strstr(smelt_last_error(), cases[i].want), "case %zu: status %d, '%s' (want '%s')",
            i, r, smelt_last_error(), cases[i].want);
    }
    /* the draft model has the same KV shape per layer but other weights */
    sm_prompt_cache *p = NULL;
    CHECK(sm_prompt_cache_open(path, dm, &p) != SMELT_OK && strstr(smelt_last_error(), "another model"),
          "other model: %s", smelt_last_error());
    CHECK(sm_prompt_cache_open(root, m, &p) != SMELT_OK, "a directory is refused");
    /* the same model with another KV element type: another KV format */
    smelt_model_info info;
    smelt_model_get_info(m, &info);
    smelt_model *mo = load_kv(root, "smelt-tiny", 512, info.kv_type == SMELT_KV_F32 ? SMELT_KV_F16 : SMELT_KV_F32);
    CHECK(sm_prompt_cache_open(path, mo, &p) != SMELT_OK && strstr(smelt_last_error(), "KV format"),
          "another KV type: %s", smelt_last_error());
    smelt_model_free(mo);
    /* a quantized cache of the same bytes-per-row family is another format too (q8_0 vs f16) */
    mo = load_kv(root, "smelt-tiny", 512, SMELT_KV_Q8_0);
    CHECK(sm_prompt_cache_open(path, mo, &p) != SMELT_OK && strstr(smelt_last_error(), "KV format") &&
            strstr(smelt_last_error(), "q8_0"),
          "a q8_0 cache refuses the file: %s", smelt_last_error());
    smelt_model_free(mo);
    unlink(bad);
    unlink(path);
  }
  /* every KV element type round-trips */
  {
    int n2 = n1 + nx - 1;
    int32_t *p2 = malloc(sizeof(int32_t) * n2);
    memcpy(p2, p1, sizeof(int32_t) * n1);
    memcpy(p2 + n1, x + 1, sizeof(int32_t) * (nx - 1));
    const smelt_kv_type types[] = {SMELT_KV_F16, SMELT_KV_BF16, SMELT_KV_F32, SMELT_KV_Q8_0, SMELT_KV_Q4_0};
    for (int i = 0; i < 5; i++) {
      smelt_model *mk = load_kv(root, "smelt-tiny", 512, types[i]);
      roundtrip(mk, p2, n1, n2, path);
      smelt_model_free(mk);
    }
    free(p2);
  }
  free(p1);
  free(x);
  smelt_model_free(m);
  smelt_model_free(dm);
  TEST_END();
}
