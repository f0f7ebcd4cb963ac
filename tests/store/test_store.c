/* Unit tests of src/store: SHA-256 (FIPS 180-2 vectors), name resolution, HF cache
 * layout, listing, removal safety, and the memory estimate on a hand-made fixture
 * model whose expected numbers are computed by hand below. */
#include "store/store.h"
#include "model/family.h"
#include "model/model.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

static int g_fail = 0;
#define CHECK(c) \
  do { \
    if (!(c)) { \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
      g_fail++; \
    } \
  } while (0)
#define CHECK_EQ_U(a, b) \
  do { \
    unsigned long long _a = (unsigned long long)(a), _b = (unsigned long long)(b); \
    if (_a != _b) { \
      fprintf(stderr, "FAIL %s:%d: %s = %llu, want %llu\n", __FILE__, __LINE__, #a, _a, _b); \
      g_fail++; \
    } \
  } while (0)
#define CHECK_STR(a, b) \
  do { \
    const char *_a = (a), *_b = (b); \
    if (!_a || strcmp(_a, _b)) { \
      fprintf(stderr, "FAIL %s:%d: %s = '%s', want '%s'\n", __FILE__, __LINE__, #a, _a ? _a : "(null)", _b); \
      g_fail++; \
    } \
  } while (0)

static char g_tmp[256];

static void mkdirs(const char *path) {
  char b[1024];
  snprintf(b, sizeof b, "%s", path);
  for (char *p = b + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(b, 0755);
      *p = '/';
    }
  mkdir(b, 0755);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fwrite(data, 1, n, f);
  fclose(f);
}

static void write_text(const char *dir, const char *name, const char *txt) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  write_file(p, txt, strlen(txt));
}

static char *tmp_path(const char *rel) { return sm_path_join(g_tmp, rel); }

/* ---------------- SHA-256 ---------------- */
static void sha_hex(const void *d, size_t n, char out[65]) {
  sm_sha256 s;
  uint8_t dg[32];
  sm_sha256_init(&s);
  sm_sha256_update(&s, d, n);
  sm_sha256_final(&s, dg);
  sm_sha256_hex(dg, out);
}

static void test_sha256(void) {
  char h[65];
  sha_hex("", 0, h);
  CHECK_STR(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  sha_hex("abc", 3, h);
  CHECK_STR(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  sha_hex(m, strlen(m), h);
  CHECK_STR(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* one million 'a', fed in odd-sized pieces */
  sm_sha256 s;
  sm_sha256_init(&s);
  char buf[997];
  memset(buf, 'a', sizeof buf);
  size_t left = 1000000;
  while (left) {
    size_t k = left < sizeof buf ? left : sizeof buf;
    sm_sha256_update(&s, buf, k);
    left -= k;
  }
  uint8_t dg[32];
  sm_sha256_final(&s, dg);
  sm_sha256_hex(dg, h);
  CHECK_STR(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* ---------------- resolution ---------------- */
/* the store's settings for these tests (the cli fills them from the environment); the strings
 * are this file's copies */
static sm_store_settings g_ss = {.pull_retries = -1};
static void set_store(const char **field, const char *value) {
  free((char *)*field);
  *field = value ? strdup(value) : NULL;
  sm_store_configure(&g_ss);
}

static void make_model_dir(const char *dir, const char *config) {
  mkdirs(dir);
  write_text(dir, "config.json", config);
}

static void test_parse_ref(void) {
  char *o, *n;
  set_store(&g_ss.default_org, NULL);
  CHECK(sm_store_parse_ref("Qwen3-0.6B-4bit", &o, &n) == SMELT_OK);
  CHECK_STR(o, "mlx-community");
  CHECK_STR(n, "Qwen3-0.6B-4bit");
  free(o);
  free(n);
  set_store(&g_ss.default_org, "acme");
  CHECK(sm_store_parse_ref("tiny", &o, &n) == SMELT_OK);
  CHECK_STR(o, "acme");
  CHECK_STR(n, "tiny");
  free(o);
  free(n);
  set_store(&g_ss.default_org, NULL);
  CHECK(sm_store_parse_ref("meta-llama/Llama-3.2-1B", &o, &n) == SMELT_OK);
  CHECK_STR(o, "meta-llama");
  CHECK_STR(n, "Llama-3.2-1B");
  free(o);
  free(n);
  const char *bad[] = {"", "a/b/c", "../x", "a/..", "a b", "a/.hidden", "/", "a/", "x;rm"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    smelt_status s = sm_store_parse_ref(bad[i], &o, &n);
    if (s == SMELT_OK) {
      fprintf(stderr, "FAIL: parse_ref accepted '%s'\n", bad[i]);
      g_fail++;
      free(o);
      free(n);
    }
  }
}

static void test_resolve(void) {
  char *cache = tmp_path("cache"), *hf = tmp_path("hf");
  set_store(&g_ss.cache_dir, cache);
  set_store(&g_ss.hf_hub_cache, hf);
  set_store(&g_ss.default_org, NULL);
  char *root = sm_store_root();
  char *want_root = tmp_path("cache/models");
  CHECK_STR(root, want_root);

  /* store model */
  char *m1 = tmp_path("cache/models/mlx-community/m1");
  make_model_dir(m1, "{\"model_type\":\"qwen3\",\"quantization\":{\"bits\":4,\"group_size\":64}}");
  write_text(m1, "model.safetensors", "0123456789"); /* 10 bytes + config */
  char *d = NULL;
  CHECK(sm_store_resolve("m1", false, &d) == SMELT_OK);
  CHECK_STR(d, m1);
  free(d);
  CHECK(sm_store_resolve("mlx-community/m1", false, &d) == SMELT_OK);
  CHECK_STR(d, m1);
  free(d);
  /* a plain path resolves to itself */
  CHECK(sm_store_resolve(m1, false, &d) == SMELT_OK);
  CHECK_STR(d, m1);
  free(d);
  /* missing: clear NOT_FOUND, nothing downloaded */
  CHECK(sm_store_resolve("nope-model", false, &d) == SMELT_ERR_NOT_FOUND);
  CHECK(strstr(sm_errmsg(), "smelt pull") != NULL);
  CHECK(sm_store_resolve("/definitely/not/here", false, &d) == SMELT_ERR_NOT_FOUND);
  CHECK(sm_store_resolve("bad name", false, &d) == SMELT_ERR_INVALID);

  /* HF cache: refs/main wins over a newer snapshot */
  char *snap = tmp_path("hf/models--acme--tiny/snapshots/abc123");
  char *old = tmp_path("hf/models--acme--tiny/snapshots/zzz999");
  make_model_dir(snap, "{\"model_type\":\"llama\"}");
  make_model_dir(old, "{\"model_type\":\"llama\"}");
  struct timeval tv[2];
  gettimeofday(&tv[0], NULL);
  tv[0].tv_sec += 1000;
  tv[1] = tv[0];
  utimes(old, tv);
  char *refs = tmp_path("hf/models--acme--tiny/refs");
  mkdirs(refs);
  write_text(refs, "main", "abc123\n");
  CHECK(sm_store_resolve("acme/tiny", false, &d) == SMELT_OK);
  CHECK_STR(d, snap);
  free(d);
  /* no refs/main -> newest snapshot */
  char *rm = tmp_path("hf/models--acme--tiny/refs/main");
  unlink(rm);
  CHECK(sm_store_resolve("acme/tiny", false, &d) == SMELT_OK);
  CHECK_STR(d, old);
  free(d);
  write_text(refs, "main", "abc123\n");
  /* HF_HOME fallback */
  set_store(&g_ss.hf_hub_cache, NULL);
  char *hfhome = tmp_path("hfhome");
  set_store(&g_ss.hf_home, hfhome);
  char *hc = sm_store_hf_cache(), *want_hc = tmp_path("hfhome/hub");
  CHECK_STR(hc, want_hc);
  free(hc);
  free(want_hc);
  free(hfhome);
  set_store(&g_ss.hf_hub_cache, hf);

  /* list: both, sorted, with arch/bits */
  sm_store_entry *e;
  size_t n;
  CHECK(sm_store_list(&e, &n) == SMELT_OK);
  CHECK_EQ_U(n, 2);
  if (n == 2) {
    CHECK_STR(e[0].name, "acme/tiny");
    CHECK_STR(e[0].source, "hf");
    CHECK_STR(e[0].arch, "llama");
    CHECK(e[0].supported);
    CHECK_STR(e[1].name, "mlx-community/m1");
    CHECK_STR(e[1].source, "store");
    CHECK_STR(e[1].arch, "qwen3");
    CHECK_EQ_U(e[1].bits, 4);
    CHECK_EQ_U(e[1].group_size, 64);
    size_t cfglen = strlen("{\"model_type\":\"qwen3\",\"quantization\":{\"bits\":4,\"group_size\":64}}");
    CHECK_EQ_U(e[1].size_bytes, 10 + cfglen);
  }
  sm_store_list_free(e, n);

  /* removal: only <root>/<owner>/<name> */
  char *outside = tmp_path("outside");
  make_model_dir(outside, "{}");
  CHECK(sm_store_locate_removable(outside, &d) == SMELT_ERR_INVALID);
  CHECK(sm_store_locate_removable(snap, &d) == SMELT_ERR_INVALID);          /* HF cache */
  CHECK(sm_store_locate_removable("acme/tiny", &d) == SMELT_ERR_NOT_FOUND); /* only in HF cache */
  char *ownerdir = tmp_path("cache/models/mlx-community");
  CHECK(sm_store_locate_removable(ownerdir, &d) == SMELT_ERR_INVALID);
  CHECK(sm_store_locate_removable(root, &d) == SMELT_ERR_INVALID);
  CHECK(sm_store_locate_removable("/", &d) == SMELT_ERR_INVALID);
  /* a symlink in the store pointing outside it */
  char *evil = tmp_path("cache/models/evil");
  mkdirs(evil);
  char *evil_link = tmp_path("cache/models/evil/link");
  CHECK(symlink(outside, evil_link) == 0);
  CHECK(sm_store_locate_removable("evil/link", &d) == SMELT_ERR_INVALID);
  CHECK(sm_store_remove("evil/link") == SMELT_ERR_INVALID);
  CHECK(sm_dir_exists(outside));
  unlink(evil_link);
  rmdir(evil);
  CHECK(sm_store_locate_removable("m1", &d) == SMELT_OK);
  CHECK_STR(d, m1);
  free(d);
  CHECK(sm_store_remove("mlx-community/m1") == SMELT_OK);
  CHECK(!sm_dir_exists(m1));
  CHECK(!sm_dir_exists(ownerdir)); /* empty owner folder removed too */
  CHECK(sm_dir_exists(snap));
  CHECK(sm_dir_exists(outside));

  /* default model */
  set_store(&g_ss.default_model, snap);
  CHECK(sm_store_resolve(NULL, false, &d) == SMELT_OK);
  CHECK_STR(d, snap);
  free(d);
  set_store(&g_ss.default_model, NULL);

  free(cache);
  free(hf);
  free(root);
  free(want_root);
  free(m1);
  free(snap);
  free(old);
  free(refs);
  free(rm);
  free(outside);
  free(ownerdir);
  free(evil);
  free(evil_link);
}

/* ---------------- memory estimate ---------------- */
typedef struct {
  const char *name, *dtype;
  int ndim;
  int64_t shape[2];
  size_t nbytes;
} fx_tensor;

static void write_safetensors(const char *path, const fx_tensor *t, int n) {
  char hdr[8192];
  size_t off = 0, p = 0;
  p += (size_t)snprintf(hdr + p, sizeof hdr - p, "{");
  for (int i = 0; i < n; i++) {
    p += (size_t)snprintf(hdr + p, sizeof hdr - p, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name,
                          t[i].dtype);
    for (int d = 0; d < t[i].ndim; d++)
      p += (size_t)snprintf(hdr + p, sizeof hdr - p, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
    p += (size_t)snprintf(hdr + p, sizeof hdr - p, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
    off += t[i].nbytes;
  }
  p += (size_t)snprintf(hdr + p, sizeof hdr - p, "}");
  while (p % 8) hdr[p++] = ' ';
  FILE *f = fopen(path, "wb");
  uint64_t hl = p;
  fwrite(&hl, 8, 1, f);
  fwrite(hdr, 1, p, f);
  char *zeros = calloc(1, off ? off : 1);
  fwrite(zeros, 1, off, f);
  free(zeros);
  fclose(f);
}

static void test_estimate(void) {
  char *dir = tmp_path("fixture");
  mkdirs(dir);
  write_text(dir, "config.json",
             "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":100,"
             "\"max_position_embeddings\":1024,\"rms_norm_eps\":1e-6,\"rope_theta\":10000,"
             "\"quantization\":{\"group_size\":32,\"bits\":4,"
             "\"model.layers.1.mlp.down_proj\":{\"group_size\":32,\"bits\":8}}}");
  /* 4-bit embedding [100 x 64]: packed 64*4/32 = 8 u32 per row; scales/biases [100 x 64/32] bf16 */
  /* 4-bit down_proj [64 x 128]: 16 u32 per row; 8-bit override: 32 u32 per row; scales [64 x 4] bf16 */
  fx_tensor t[] = {
    {"model.embed_tokens.weight", "U32", 2, {100, 8}, 100 * 8 * 4},
    {"model.embed_tokens.scales", "BF16", 2, {100, 2}, 100 * 2 * 2},
    {"model.embed_tokens.biases", "BF16", 2, {100, 2}, 100 * 2 * 2},
    {"model.layers.0.mlp.down_proj.weight", "U32", 2, {64, 16}, 64 * 16 * 4},
    {"model.layers.0.mlp.down_proj.scales", "BF16", 2, {64, 4}, 64 * 4 * 2},
    {"model.layers.0.mlp.down_proj.biases", "BF16", 2, {64, 4}, 64 * 4 * 2},
    {"model.layers.1.mlp.down_proj.weight", "U32", 2, {64, 32}, 64 * 32 * 4},
    {"model.layers.1.mlp.down_proj.scales", "BF16", 2, {64, 4}, 64 * 4 * 2},
    {"model.layers.1.mlp.down_proj.biases", "BF16", 2, {64, 4}, 64 * 4 * 2},
    {"model.norm.weight", "BF16", 1, {64, 0}, 64 * 2},
    {"model.layers.0.self_attn.q_proj.bias", "F32", 1, {128, 0}, 128 * 4},
  };
  char *st = sm_path_join(dir, "model.safetensors");
  write_safetensors(st, t, (int)(sizeof t / sizeof t[0]));
  free(st);

  set_store(&g_ss.available_memory, "1G");
  sm_mem_estimate e;
  smelt_status s = sm_store_estimate(dir, 100, SMELT_KV_F16, false, &e);
  if (s) fprintf(stderr, "estimate: %s\n", sm_errmsg());
  CHECK(s == SMELT_OK);
  CHECK_STR(e.arch, "qwen3");
  CHECK_EQ_U(e.n_layers, 2);
  CHECK_EQ_U(e.n_kv_heads, 2);
  CHECK_EQ_U(e.head_dim, 32);
  CHECK_EQ_U(e.quant_bits, 4);
  CHECK_EQ_U(e.n_tensors, 11);
  /* weights: 3200+400+400 + 4096+512+512 + 8192+512+512 + 128 + 512 */
  CHECK_EQ_U(e.weights_bytes, 18976);
  /* params: embed 100*64 + down0 64*128 + down1 64*128 (8-bit) + norm 64 + bias 128; scales/biases excluded */
  CHECK_EQ_U(e.n_params, 6400 + 8192 + 8192 + 64 + 128);
  /* KV f16: 2 (K,V) * 2 layers * 2 kv heads * 32 head dim * 2 bytes = 512 B/token; 100 tokens */
  CHECK_EQ_U(e.kv_bytes_per_token, 512);
  CHECK_EQ_U(e.kv_bytes, 51200);
  /* activations, T = min(100, 512) = 100 rows of
   * 4*64 (x,xb,xb2,xo) + 4*32 (q) + 2*2*32 (k,v) + 2*128 (gate,up) + 4*100 (scores) = 1168 floats,
   * plus one logits row of 100: 4 * (100*1168 + 100) = 467600 */
  CHECK_EQ_U(e.activation_bytes, 467600);
  /* runtime = 467600 + (18976 + 51200) / 10 = 467600 + 7017 */
  CHECK_EQ_U(e.runtime_bytes, 474617);
  CHECK_EQ_U(e.total_bytes, 18976 + 51200 + 474617);
  CHECK(e.available_known);
  CHECK_EQ_U(e.available_bytes, 1073741824ull);
  CHECK(e.fits);

  /* exactly enough / one byte short */
  set_store(&g_ss.available_memory, "544793");
  CHECK(sm_store_estimate(dir, 100, SMELT_KV_F16, false, &e) == SMELT_OK);
  CHECK(e.fits);
  set_store(&g_ss.available_memory, "544792");
  CHECK(sm_store_estimate(dir, 100, SMELT_KV_F16, false, &e) == SMELT_OK);
  CHECK(!e.fits);

  /* f32 and q8_0 KV; default context = max_position_embeddings (1024) */
  CHECK(sm_store_estimate(dir, 0, SMELT_KV_F32, false, &e) == SMELT_OK);
  CHECK_EQ_U(e.max_tokens, 1024);
  CHECK_EQ_U(e.kv_bytes_per_token, 1024);
  CHECK_EQ_U(e.kv_bytes, 1024 * 1024);
  /* q8_0: a head row of 32 values is 32 int8 codes + one f16 scale, padded to 36 bytes: 2 * 2 * 2 * 36 */
  CHECK(sm_store_estimate(dir, 7, SMELT_KV_Q8_0, false, &e) == SMELT_OK);
  CHECK_EQ_U(e.kv_bytes_per_token, 288);
  CHECK_EQ_U(e.kv_bytes, 288 * 7);
  /* q4_0: 16 bytes of nibbles + the scale, padded to 20 */
  CHECK(sm_store_estimate(dir, 7, SMELT_KV_Q4_0, false, &e) == SMELT_OK);
  CHECK_EQ_U(e.kv_bytes_per_token, 160);
  set_store(&g_ss.available_memory, NULL);

  /* host memory from /proc/meminfo */
  uint64_t avail = 0;
  CHECK(sm_store_host_mem_available(&avail));
  CHECK(avail > (1u << 20));
  CHECK(sm_store_estimate(dir, 100, SMELT_KV_F16, false, &e) == SMELT_OK);
  CHECK(e.available_known && e.available_bytes > 0);
  /* cuda without a query hook: unknown, not refused */
  CHECK(sm_store_estimate(dir, 100, SMELT_KV_F16, true, &e) == SMELT_OK);
  CHECK(!e.available_known && e.fits);

  CHECK(sm_store_estimate(dir, 100, (smelt_kv_type)99, false, &e) == SMELT_ERR_INVALID);

  /* a vision tower and projector: counted in the weights and parameters, and on their own
   * (a 4-bit qkv [96 x 32]: 4 u32 a row, scales/biases [96 x 1]; a dense bf16 projector [64 x 32]) */
  char *vdir = tmp_path("vfixture");
  mkdirs(vdir);
  write_text(vdir, "config.json",
             "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":100,"
             "\"quantization\":{\"group_size\":32,\"bits\":4}}");
  fx_tensor vt[] = {
    {"model.norm.weight", "BF16", 1, {64, 0}, 64 * 2},
    {"vision_tower.blocks.0.attn.qkv.weight", "U32", 2, {96, 4}, 96 * 4 * 4},
    {"vision_tower.blocks.0.attn.qkv.scales", "BF16", 2, {96, 1}, 96 * 2},
    {"vision_tower.blocks.0.attn.qkv.biases", "BF16", 2, {96, 1}, 96 * 2},
    {"multi_modal_projector.linear_1.weight", "BF16", 2, {64, 32}, 64 * 32 * 2},
  };
  st = sm_path_join(vdir, "model.safetensors");
  write_safetensors(st, vt, (int)(sizeof vt / sizeof vt[0]));
  free(st);
  CHECK(sm_store_estimate(vdir, 100, SMELT_KV_F16, false, &e) == SMELT_OK);
  CHECK_EQ_U(e.n_tensors, 5);
  CHECK_EQ_U(e.n_vision_tensors, 4);
  CHECK_EQ_U(e.vision_bytes, 96 * 16 + 96 * 2 * 2 + 64 * 64);
  CHECK_EQ_U(e.weights_bytes, 128 + 96 * 16 + 96 * 2 * 2 + 64 * 64);
  CHECK_EQ_U(e.vision_params, 96 * 32 + 64 * 32);
  CHECK_EQ_U(e.n_params, 64 + 96 * 32 + 64 * 32);
  free(vdir);

  /* bad inputs: clean errors */
  char *bad = tmp_path("badfixture");
  mkdirs(bad);
  CHECK(sm_store_estimate(bad, 100, SMELT_KV_F16, false, &e) != SMELT_OK); /* no config */
  write_text(bad, "config.json", "{\"model_type\":\"llama\",\"num_hidden_layers\":2}");
  CHECK(sm_store_estimate(bad, 100, SMELT_KV_F16, false, &e) != SMELT_OK); /* no heads */
  write_text(bad, "config.json", "{not json");
  CHECK(sm_store_estimate(bad, 100, SMELT_KV_F16, false, &e) != SMELT_OK);
  write_text(bad, "config.json",
             "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
             "\"vocab_size\":10,\"intermediate_size\":8}");
  write_text(bad, "model.safetensors", "\xff\xff\xff\xff\xff\xff\xff\xff{}");
  CHECK(sm_store_estimate(bad, 100, SMELT_KV_F16, false, &e) != SMELT_OK); /* corrupt header */
  free(bad);
  free(dir);
}

/* a hybrid model (Qwen3.5 layout, 3 Gated DeltaNet layers and 1 attention layer): KV for the attention
 * layer only, plus the recurrent state of a sequence (float32) times the engine's 3 slots */
static void test_estimate_hybrid(void) {
  char *dir = tmp_path("hybrid");
  mkdirs(dir);
  write_text(dir, "config.json",
             "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":4,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":100,"
             "\"max_position_embeddings\":1024,\"layer_types\":[\"linear_attention\",\"linear_attention\","
             "\"linear_attention\",\"full_attention\"],\"linear_conv_kernel_dim\":4,\"linear_num_key_heads\":2,"
             "\"linear_key_head_dim\":16,\"linear_num_value_heads\":4,\"linear_value_head_dim\":16}");
  fx_tensor t[] = {{"model.norm.weight", "BF16", 1, {64, 0}, 64 * 2}};
  char *st = sm_path_join(dir, "model.safetensors");
  write_safetensors(st, t, 1);
  free(st);
  sm_mem_estimate e;
  smelt_status s = sm_store_estimate(dir, 100, SMELT_KV_F16, false, &e);
  if (s) fprintf(stderr, "estimate: %s\n", sm_errmsg());
  CHECK(s == SMELT_OK);
  CHECK_EQ_U(e.n_layers, 4);
  CHECK_EQ_U(e.attn_layers, 1);
  /* KV f16: 2 (K,V) * 1 attention layer * 2 kv heads * 32 head dim * 2 bytes */
  CHECK_EQ_U(e.kv_bytes_per_token, 256);
  CHECK_EQ_U(e.kv_bytes, 25600);
  /* per recurrent layer: convolution window (4-1) * (2*2*16 + 4*16) + delta-rule state 4 heads * 16 * 16,
   * 1408 floats; 3 layers */
  CHECK_EQ_U(e.state_bytes, 4 * 1408 * 3);
  CHECK_EQ_U(e.state_slots, 3);
  CHECK_EQ_U(e.total_bytes, e.weights_bytes + e.kv_bytes + e.runtime_bytes + 3 * e.state_bytes);
  /* a plain model has no state */
  write_text(dir, "config.json",
             "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":4,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":100}");
  CHECK(sm_store_estimate(dir, 100, SMELT_KV_F16, false, &e) == SMELT_OK);
  CHECK_EQ_U(e.attn_layers, 4);
  CHECK_EQ_U(e.state_bytes, 0);
  CHECK_EQ_U(e.kv_bytes_per_token, 1024);
  CHECK_EQ_U(e.total_bytes, e.weights_bytes + e.kv_bytes + e.runtime_bytes);
  free(dir);
}

static void test_arch(void) {
  /* the store's notion of "supported" is the family registry's */
  const char *want[] = {"llama", "mistral", "qwen2", "qwen3"};
  for (size_t i = 0; i < 4; i++) CHECK(sm_family_runnable(want[i]) != NULL);
  CHECK(sm_family_runnable("gpt2") == NULL);
  CHECK(sm_family_runnable(NULL) == NULL);
  /* Gemma 4 runs, also through its packaging (which is not a family of its own) */
  CHECK(sm_family_runnable("gemma4_text") != NULL && sm_family_find("gemma4") == NULL);
  CHECK(sm_family_type_runnable("gemma4_text") && sm_family_type_runnable("gemma4"));
  /* vision-language packagings run their text model */
  CHECK(sm_family_find("gemma3") == NULL && sm_family_type_runnable("gemma3") && sm_family_type_runnable("mistral3"));
  CHECK(sm_family_type_runnable("gemma3_text") && !sm_family_type_runnable("gpt2"));
  size_t n;
  const sm_family *const *all = sm_family_all(&n);
  size_t runnable = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK(all[i]->model_type && all[i]->description && all[i]->defaults);
    if (all[i]->recipe) {
      runnable++;
      CHECK(all[i]->names && all[i]->example);
      CHECK(sm_family_runnable(all[i]->model_type) == all[i]);
    }
  }
  CHECK(runnable >= 4);
}

/* the built-in models resolve by name without the store, the HF cache or the hub (an unreachable
 * HF_ENDPOINT: a download attempt would fail), and are listed as built-in */
static void test_builtin(void) {
  setenv("HF_ENDPOINT", "http://127.0.0.1:9", 1);
  const char *names[] = {"smelt-tiny", "smelt-tiny-draft", "models/smelt-tiny"};
  for (int i = 0; i < 3; i++) {
    char *d = NULL;
    CHECK(sm_store_resolve(names[i], true, &d) == SMELT_OK);
    const char *base = names[i] + (strncmp(names[i], "models/", 7) ? 0 : 7);
    size_t dl = d ? strlen(d) : 0, bl = strlen(base);
    CHECK(d && dl > bl && !strcmp(d + dl - bl, base) && d[dl - bl - 1] == '/');
    free(d);
  }
  char *d = NULL;
  CHECK(sm_store_resolve("smelt-tiny-nonexistent", false, &d) == SMELT_ERR_NOT_FOUND);
  CHECK(sm_store_builtin("../smelt-tiny") == NULL && sm_store_builtin("") == NULL);
  sm_store_entry *e;
  size_t n;
  CHECK(sm_store_list_builtin(&e, &n) == SMELT_OK);
  int found = 0;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(e[i].name, "smelt-tiny") || !strcmp(e[i].name, "smelt-tiny-draft")) {
      found++;
      CHECK_STR(e[i].source, "built-in");
      CHECK_STR(e[i].arch, "llama");
    }
  CHECK(found == 2);
  sm_store_list_free(e, n);
  unsetenv("HF_ENDPOINT");
}

int main(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/smelt-store-test-XXXXXX");
  if (!mkdtemp(g_tmp)) {
    perror("mkdtemp");
    return 1;
  }
  test_sha256();
  test_parse_ref();
  test_arch();
  test_resolve();
  test_builtin();
  test_estimate();
  test_estimate_hybrid();
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not clean %s\n", g_tmp);
  if (g_fail) {
    fprintf(stderr, "%d check(s) failed\n", g_fail);
    return 1;
  }
  printf("store tests passed\n");
  return 0;
}
