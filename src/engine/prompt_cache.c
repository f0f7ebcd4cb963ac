/* Prompt cache files (see prompt_cache.h). Layout, little-endian, version 1:
 *   0   "SMELTKV\0"                 magic
 *   8   u32 version (1)             12  u32 header bytes (128)
 *   16  u8[32] model fingerprint    48  u32 KV element type (1 f32, 2 f16, 3 bf16)
 *   52  u32 layers  56 u32 KV heads  60 u32 head size  64 u32 tokens (n)
 *   68  char[60] model name (for messages; NUL-padded)
 *   128 i32 tokens[n]
 *   then per layer: K [n][kv_heads * head_size] elements of that type, V likewise
 *   last 32 bytes: SHA-256 of everything before them. */
#include "engine/prompt_cache.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base/strbuf.h"
#include "backend/kv_quant.h"
#include "store/store.h" /* sm_sha256 */

#define HDR_BYTES 128
/* the KV element type codes of the file */
/* the KV format's code in the header (part of what a file must match to load) */
static uint32_t kv_code(sm_dtype t) {
  return t == SM_DT_F32 ? 1 : t == SM_DT_F16 ? 2 : t == SM_DT_BF16 ? 3 : t == SM_DT_Q8_0 ? 4 : t == SM_DT_Q4_0 ? 5 : 0;
}
static const char *kv_code_name(uint32_t c) {
  static const char *const n[] = {"unknown", "f32", "f16", "bf16", "q8_0", "q4_0"};
  return c < sizeof n / sizeof n[0] ? n[c] : "unknown";
}
#define MAX_TOKENS (1 << 24)
static const char k_magic[8] = {'S', 'M', 'E', 'L', 'T', 'K', 'V', 0};

struct sm_prompt_cache {
  FILE *f;
  char *path;
  int n, n_layers;
  size_t row; /* bytes per token per layer, for K and for V */
  int32_t *tok;
};

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

smelt_status sm_model_fingerprint(const smelt_model *m, uint8_t out[32]) {
  sm_sha256 h;
  sm_sha256_init(&h);
  static const char tag[] = "smelt model fingerprint 1";
  sm_sha256_update(&h, tag, sizeof tag);
  char *cfg_path = sm_path_join(m->dir, "config.json"), *cfg = NULL;
  size_t cfg_len = 0;
  smelt_status st = sm_read_file_max(cfg_path, SM_FILE_MAX_JSON, &cfg, &cfg_len);
  free(cfg_path);
  if (st) return st;
  sm_sha256_update(&h, cfg, cfg_len);
  free(cfg);
  for (size_t i = 0; i < sm_st_count(m->st); i++) {
    const sm_tensor *t = sm_st_at(m->st, i);
    uint8_t meta[16 + 8 * SM_ST_MAX_DIMS];
    memset(meta, 0, sizeof meta);
    put_u32(meta, (uint32_t)t->dtype);
    put_u32(meta + 4, (uint32_t)t->ndim);
    put_u32(meta + 8, (uint32_t)t->nbytes);
    put_u32(meta + 12, (uint32_t)((uint64_t)t->nbytes >> 32));
    for (int d = 0; d < t->ndim && d < SM_ST_MAX_DIMS; d++) {
      put_u32(meta + 16 + 8 * d, (uint32_t)t->shape[d]);
      put_u32(meta + 20 + 8 * d, (uint32_t)((uint64_t)t->shape[d] >> 32));
    }
    sm_sha256_update(&h, t->name, strlen(t->name) + 1);
    sm_sha256_update(&h, meta, sizeof meta);
    const uint8_t *data = t->data;
    const size_t win = 256, n_win = 16;
    if (t->nbytes <= win * n_win) sm_sha256_update(&h, data, t->nbytes);
    else
      for (size_t k = 0; k < n_win; k++) sm_sha256_update(&h, data + k * ((t->nbytes - win) / (n_win - 1)), win);
  }
  sm_sha256_final(&h, out);
  return SMELT_OK;
}

static void model_name(const smelt_model *m, char out[60]) {
  memset(out, 0, 60);
  const char *d = m->dir, *end = d + strlen(d);
  while (end > d && end[-1] == '/') end--;
  const char *b = end;
  while (b > d && b[-1] != '/') b--;
  size_t l = SM_MIN((size_t)(end - b), (size_t)59);
  memcpy(out, b, l);
}

static smelt_status wr(FILE *f, sm_sha256 *h, const void *p, size_t n, const char *path) {
  if (n && fwrite(p, 1, n, f) != n) return sm_err(SMELT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  if (h) sm_sha256_update(h, p, n);
  return SMELT_OK;
}

smelt_status sm_prompt_cache_save(sm_engine *e, const sm_seq *s, int n, const char *path) {
  smelt_model *m = sm_engine_model(e);
  if (n < 1 || n > sm_seq_len(s) - sm_seq_pending(s))
    return sm_err(SMELT_ERR_INVALID, "prompt cache: %d tokens asked, %d computed", n,
                  sm_seq_len(s) - sm_seq_pending(s));
  const int L = m->cfg.num_hidden_layers;
  const sm_dtype dt = sm_engine_kv_dtype(e);
  const size_t row = (size_t)m->cfg.num_key_value_heads * sm_kv_head_bytes(dt, m->cfg.head_dim); /* bytes */
  if (!kv_code(dt)) return sm_err(SMELT_ERR_UNSUPPORTED, "prompt cache: KV element type %d", (int)dt);
  uint8_t hdr[HDR_BYTES];
  memset(hdr, 0, sizeof hdr);
  memcpy(hdr, k_magic, 8);
  put_u32(hdr + 8, SM_PCACHE_VERSION);
  put_u32(hdr + 12, HDR_BYTES);
  smelt_status st = sm_model_fingerprint(m, hdr + 16);
  if (st) return st;
  put_u32(hdr + 48, kv_code(dt));
  put_u32(hdr + 52, (uint32_t)L);
  put_u32(hdr + 56, (uint32_t)m->cfg.num_key_value_heads);
  put_u32(hdr + 60, (uint32_t)m->cfg.head_dim);
  put_u32(hdr + 64, (uint32_t)n);
  model_name(m, (char *)hdr + 68);
  sm_buf tmp = SM_BUF_INIT;
  sm_buf_printf(&tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(sm_buf_str(&tmp), "wb");
  if (!f) {
    st = sm_err(SMELT_ERR_IO, "cannot create %s: %s", sm_buf_str(&tmp), strerror(errno));
    sm_buf_free(&tmp);
    return st;
  }
  sm_sha256 h;
  sm_sha256_init(&h);
  st = wr(f, &h, hdr, sizeof hdr, path);
  if (!st) st = wr(f, &h, sm_seq_tokens(s), sizeof(int32_t) * (size_t)n, path);
  const int chunk = 256;
  char *k = sm_xmalloc(row * chunk), *v = sm_xmalloc(row * chunk);
  for (int l = 0; !st && l < L; l++)
    for (int pass = 0; !st && pass < 2; pass++) /* all K rows of the layer, then all V rows */
      for (int t0 = 0; !st && t0 < n; t0 += chunk) {
        int c = SM_MIN(chunk, n - t0);
        if (!(st = sm_seq_kv_read(e, s, l, t0, c, k, v))) st = wr(f, &h, pass ? v : k, row * c, path);
      }
  free(k);
  free(v);
  uint8_t dig[32];
  sm_sha256_final(&h, dig);
  if (!st) st = wr(f, NULL, dig, sizeof dig, path);
  if (fclose(f) != 0 && !st) st = sm_err(SMELT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  if (!st && rename(sm_buf_str(&tmp), path) != 0)
    st = sm_err(SMELT_ERR_IO, "cannot rename %s to %s: %s", sm_buf_str(&tmp), path, strerror(errno));
  if (st) unlink(sm_buf_str(&tmp));
  sm_buf_free(&tmp);
  return st;
}

void sm_prompt_cache_close(sm_prompt_cache *pc) {
  if (!pc) return;
  if (pc->f) fclose(pc->f);
  free(pc->path);
  free(pc->tok);
  free(pc);
}

#define BAD(code, ...) \
  do { \
    st = sm_err(code, __VA_ARGS__); \
    goto fail; \
  } while (0)

smelt_status sm_prompt_cache_open(const char *path, const smelt_model *m, sm_prompt_cache **out) {
  *out = NULL;
  smelt_status st = SMELT_OK;
  sm_prompt_cache *pc = sm_xcalloc(1, sizeof *pc);
  pc->path = sm_xstrdup(path);
  struct stat sb;
  if (stat(path, &sb) != 0) BAD(SMELT_ERR_IO, "prompt cache %s: %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode)) BAD(SMELT_ERR_IO, "prompt cache %s: not a regular file", path);
  if (!(pc->f = fopen(path, "rb"))) BAD(SMELT_ERR_IO, "prompt cache %s: %s", path, strerror(errno));
  /* size from the open file: what is read below is what was checked */
  if (fstat(fileno(pc->f), &sb) != 0) BAD(SMELT_ERR_IO, "prompt cache %s: %s", path, strerror(errno));
  const uint64_t size = (uint64_t)sb.st_size;
  uint8_t hdr[HDR_BYTES];
  if (size < HDR_BYTES + 32 || fread(hdr, 1, HDR_BYTES, pc->f) != HDR_BYTES || memcmp(hdr, k_magic, 8))
    BAD(SMELT_ERR_FORMAT, "prompt cache %s: not a smelt prompt cache file", path);
  uint32_t ver = get_u32(hdr + 8);
  if (ver != SM_PCACHE_VERSION)
    BAD(SMELT_ERR_FORMAT, "prompt cache %s: format version %u, this smelt reads version %d; delete the file", path, ver,
        SM_PCACHE_VERSION);
  if (get_u32(hdr + 12) != HDR_BYTES) BAD(SMELT_ERR_FORMAT, "prompt cache %s: bad header size", path);
  char name[61];
  memcpy(name, hdr + 68, 60);
  name[60] = 0;
  for (char *c = name; *c; c++)
    if ((unsigned char)*c < 0x20) *c = '?';
  uint8_t fp[32];
  if ((st = sm_model_fingerprint(m, fp))) goto fail;
  if (memcmp(fp, hdr + 16, 32))
    BAD(SMELT_ERR_INVALID,
        "prompt cache %s: made with another model ('%s'; config or weights differ); delete it or "
        "use another file",
        path, name);
  const uint32_t dt = get_u32(hdr + 48), L = get_u32(hdr + 52), H = get_u32(hdr + 56), D = get_u32(hdr + 60);
  if (dt != kv_code(m->kv_dtype) || L != (uint32_t)m->cfg.num_hidden_layers ||
      H != (uint32_t)m->cfg.num_key_value_heads || D != (uint32_t)m->cfg.head_dim)
    BAD(SMELT_ERR_INVALID,
        "prompt cache %s: KV format %u layers x %u KV heads x %u %s differs from the model's "
        "%d x %d x %d %s",
        path, L, H, D, kv_code_name(dt), m->cfg.num_hidden_layers, m->cfg.num_key_value_heads, m->cfg.head_dim,
        kv_code_name(kv_code(m->kv_dtype)));
  const uint32_t n = get_u32(hdr + 64);
  if (n < 1 || n > MAX_TOKENS) BAD(SMELT_ERR_FORMAT, "prompt cache %s: bad token count %u", path, n);
  pc->n = (int)n;
  pc->n_layers = (int)L;
  pc->row = (size_t)H * sm_kv_head_bytes(m->kv_dtype, (int)D);
  const uint64_t want = HDR_BYTES + 4ull * n + 2ull * L * n * pc->row + 32;
  if (size != want)
    BAD(SMELT_ERR_FORMAT, "prompt cache %s: %llu bytes, %llu expected for %u tokens (truncated or damaged)", path,
        (unsigned long long)size, (unsigned long long)want, n);
  pc->tok = sm_xmalloc(sizeof(int32_t) * n);
  uint8_t *tb = sm_xmalloc(4ull * n);
  if (fread(tb, 1, 4ull * n, pc->f) != 4ull * n) {
    free(tb);
    BAD(SMELT_ERR_IO, "prompt cache %s: short read", path);
  }
  for (uint32_t i = 0; i < n; i++) pc->tok[i] = (int32_t)get_u32(tb + 4ull * i);
  free(tb);
  /* the checksum over everything but itself */
  sm_sha256 h;
  sm_sha256_init(&h);
  rewind(pc->f);
  uint8_t *buf = sm_xmalloc(1 << 20);
  uint64_t left = size - 32;
  while (left) {
    size_t c = (size_t)SM_MIN(left, (uint64_t)(1 << 20));
    if (fread(buf, 1, c, pc->f) != c) {
      free(buf);
      BAD(SMELT_ERR_IO, "prompt cache %s: short read", path);
    }
    sm_sha256_update(&h, buf, c);
    left -= c;
  }
  uint8_t dig[32], want_dig[32];
  sm_sha256_final(&h, dig);
  size_t got = fread(want_dig, 1, 32, pc->f);
  free(buf);
  if (got != 32 || memcmp(dig, want_dig, 32))
    BAD(SMELT_ERR_FORMAT, "prompt cache %s: checksum mismatch (the file is corrupt); delete it", path);
  for (uint32_t i = 0; i < n; i++)
    if (pc->tok[i] < 0 || pc->tok[i] >= m->cfg.vocab_size)
      BAD(SMELT_ERR_FORMAT, "prompt cache %s: token %d out of the vocabulary", path, pc->tok[i]);
  *out = pc;
  return SMELT_OK;
fail:
  sm_prompt_cache_close(pc);
  return st;
}

int sm_prompt_cache_len(const sm_prompt_cache *pc) { return pc->n; }
const int32_t *sm_prompt_cache_tokens(const sm_prompt_cache *pc) { return pc->tok; }

int sm_prompt_cache_match(const sm_prompt_cache *pc, const int32_t *ids, int n) {
  int i = 0;
  while (i < n && i < pc->n && ids[i] == pc->tok[i]) i++;
  return i;
}

smelt_status sm_prompt_cache_restore(const sm_prompt_cache *pc, sm_engine *e, sm_seq *s, int n) {
  smelt_model *m = sm_engine_model(e);
  if (pc->n_layers != m->cfg.num_hidden_layers ||
      pc->row != (size_t)m->cfg.num_key_value_heads * sm_kv_head_bytes(sm_engine_kv_dtype(e), m->cfg.head_dim))
    return sm_err(SMELT_ERR_INVALID, "prompt cache %s: opened for another model", pc->path);
  if (n < 0 || n > pc->n)
    return sm_err(SMELT_ERR_INVALID, "prompt cache %s: %d of %d tokens asked", pc->path, n, pc->n);
  if (sm_seq_len(s)) return sm_err(SMELT_ERR_INVALID, "prompt cache restore into a sequence that is not empty");
  if (!n) return SMELT_OK;
  smelt_status st = sm_seq_append(e, s, pc->tok, n);
  if (!st) st = sm_seq_kv_reserve(e, s, n);
  const int chunk = 256;
  const size_t bytes_row = pc->row;
  char *k = sm_xmalloc(bytes_row * chunk), *v = sm_xmalloc(bytes_row * chunk);
  const uint64_t data0 = HDR_BYTES + 4ull * pc->n;
  for (int l = 0; !st && l < pc->n_layers; l++)
    for (int t0 = 0; !st && t0 < n; t0 += chunk) {
      const int c = SM_MIN(chunk, n - t0);
      const uint64_t koff = data0 + (2ull * l * pc->n + t0) * bytes_row, voff = koff + (uint64_t)pc->n * bytes_row;
      if (fseeko(pc->f, (off_t)koff, SEEK_SET) || fread(k, bytes_row, c, pc->f) != (size_t)c ||
          fseeko(pc->f, (off_t)voff, SEEK_SET) || fread(v, bytes_row, c, pc->f) != (size_t)c)
        st = sm_err(SMELT_ERR_IO, "prompt cache %s: read failed", pc->path);
      else st = sm_seq_kv_write(e, s, l, t0, c, k, v);
    }
  free(k);
  free(v);
  if (!st) st = sm_seq_kv_commit(e, s, n);
  if (st) sm_seq_truncate(e, s, 0);
  return st;
}

smelt_status sm_prompt_cache_seed(const sm_prompt_cache *pc, sm_engine *e, int *n_tokens) {
  if (n_tokens) *n_tokens = 0;
  sm_engine_stats es;
  sm_engine_get_stats(e, &es);
  const int n = pc->n / es.block_size * es.block_size;
  if (!n) return SMELT_OK;
  sm_seq *s = sm_seq_new(e);
  smelt_status st = sm_prompt_cache_restore(pc, e, s, n);
  sm_seq_free(e, s);
  if (!st && n_tokens) *n_tokens = n;
  return st;
}
