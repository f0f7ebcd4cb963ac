/* safetensors reader tests: images are written byte by byte here following the
 * format spec (8-byte LE header length, JSON header, data block). */
#include "format/safetensors.h"
#include "check.h"
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* header json + data block (data filled with byte i & 0xff at data offset i) */
static uint8_t *image(const char *json, size_t data_len, size_t *out_len) {
  size_t h = strlen(json);
  uint8_t *b = malloc(8 + h + data_len + 1);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
  memcpy(b + 8, json, h);
  for (size_t i = 0; i < data_len; i++) b[8 + h + i] = (uint8_t)(i & 0xff);
  *out_len = 8 + h + data_len;
  return b;
}

static void write_file(const char *path, const void *d, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(2);
  }
  fwrite(d, 1, n, f);
  fclose(f);
}

static void write_image(const char *dir, const char *name, const char *json, size_t data_len) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  size_t n;
  uint8_t *b = image(json, data_len, &n);
  write_file(p, b, n);
  free(b);
}

/* parse a header that must fail; check status and that the message mentions `needle` */
static void expect_fail(const char *json, size_t data_len, smelt_status want, const char *needle, int line) {
  size_t n;
  uint8_t *b = image(json, data_len, &n);
  sm_st *st = (sm_st *)1;
  smelt_status rc = sm_st_parse_buffer(b, n, &st);
  g_checks++;
  if (rc == SMELT_OK || (want != SMELT_OK && rc != want) || st != NULL || (needle && !strstr(sm_errmsg(), needle))) {
    g_fail++;
    fprintf(stderr, "line %d: expected failure (%d, '%s'), got %d '%s'\n", line, want, needle ? needle : "", rc,
            sm_errmsg());
  }
  if (rc == SMELT_OK) sm_st_close(st);
  free(b);
}
#define FAIL(json, dl, want, needle) expect_fail(json, dl, want, needle, __LINE__)

static void test_basic(void) {
  const char *j = "{\"__metadata__\":{\"format\":\"mlx\"},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                  "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                  "\"scalar\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[32,33]},"
                  "\"empty\":{\"dtype\":\"BOOL\",\"shape\":[0,5],\"data_offsets\":[33,33]}}";
  size_t n;
  uint8_t *b = image(j, 33, &n);
  sm_st *st = NULL;
  CHECK_EQ_I(sm_st_parse_buffer(b, n, &st), SMELT_OK);
  if (!st) {
    fprintf(stderr, "%s\n", sm_errmsg());
    free(b);
    return;
  }
  CHECK_EQ_I(sm_st_count(st), 4);
  CHECK_EQ_I(sm_st_total_bytes(st), 33);
  const uint8_t *data = b + 8 + strlen(j);
  const sm_tensor *a = sm_st_find(st, "a");
  CHECK(a != NULL);
  if (a) {
    CHECK_EQ_I(a->dtype, SM_DT_F32);
    CHECK_EQ_I(a->ndim, 2);
    CHECK_EQ_I(a->shape[0], 2);
    CHECK_EQ_I(a->shape[1], 3);
    CHECK_EQ_I(a->nbytes, 24);
    CHECK(a->data == data);
  }
  const sm_tensor *bb = sm_st_find(st, "b");
  CHECK(bb && bb->dtype == SM_DT_BF16 && bb->nbytes == 8 && bb->data == data + 24);
  if (bb) CHECK_EQ_I(((const uint8_t *)bb->data)[0], 24); /* byte at data offset 24 */
  const sm_tensor *s = sm_st_find(st, "scalar");
  CHECK(s && s->ndim == 0 && s->nbytes == 1 && ((const uint8_t *)s->data)[0] == 32);
  const sm_tensor *e = sm_st_find(st, "empty");
  CHECK(e && e->ndim == 2 && e->shape[0] == 0 && e->shape[1] == 5 && e->nbytes == 0);
  CHECK(sm_st_find(st, "__metadata__") == NULL);
  CHECK(sm_st_find(st, "c") == NULL);
  CHECK(sm_st_find(st, "") == NULL);
  /* sm_st_at walks all entries */
  size_t seen = 0;
  for (size_t i = 0; i < sm_st_count(st); i++) {
    const sm_tensor *t = sm_st_at(st, i);
    CHECK(t && sm_st_find(st, t->name) == t);
    seen += t ? t->nbytes : 0;
  }
  CHECK_EQ_I(seen, 33);
  CHECK(sm_st_at(st, 4) == NULL);
  sm_st_close(st);
  free(b);
}

static void test_dtypes(void) {
  /* element sizes from the safetensors spec */
  static const struct {
    const char *n;
    size_t sz;
    sm_dtype dt;
  } dts[] = {{"F32", 4, SM_DT_F32},  {"F16", 2, SM_DT_F16}, {"BF16", 2, SM_DT_BF16}, {"F64", 8, SM_DT_F64},
             {"U8", 1, SM_DT_U8},    {"I8", 1, SM_DT_I8},   {"U16", 2, SM_DT_U16},   {"I16", 2, SM_DT_I16},
             {"U32", 4, SM_DT_U32},  {"I32", 4, SM_DT_I32}, {"U64", 8, SM_DT_U64},   {"I64", 8, SM_DT_I64},
             {"BOOL", 1, SM_DT_BOOL}};
  char json[4096] = "{";
  size_t off = 0;
  for (size_t i = 0; i < SM_ARRAY_LEN(dts); i++) {
    char e[128];
    snprintf(e, sizeof e, "%s\"t_%s\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[%zu,%zu]}", i ? "," : "",
             dts[i].n, dts[i].n, off, off + 3 * dts[i].sz);
    strcat(json, e);
    off += 3 * dts[i].sz;
    CHECK_EQ_I(sm_dtype_size(dts[i].dt), dts[i].sz);
    CHECK_STR(sm_dtype_name(dts[i].dt), dts[i].n);
  }
  strcat(json, "}");
  size_t n;
  uint8_t *b = image(json, off, &n);
  sm_st *st = NULL;
  CHECK_EQ_I(sm_st_parse_buffer(b, n, &st), SMELT_OK);
  for (size_t i = 0; st && i < SM_ARRAY_LEN(dts); i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "t_%s", dts[i].n);
    const sm_tensor *t = sm_st_find(st, nm);
    CHECK(t && t->dtype == dts[i].dt && t->nbytes == 3 * dts[i].sz);
  }
  CHECK_EQ_I(sm_st_total_bytes(st), off);
  sm_st_close(st);
  free(b);
  CHECK_EQ_I(sm_dtype_size(SM_DT_COUNT), 0);
}

static void test_padding_and_many(void) {
  /* header padded with spaces (as writers align the data block to 8 bytes) */
  size_t n;
  uint8_t *b = image("{\"x\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}       ", 4, &n);
  sm_st *st = NULL;
  CHECK_EQ_I(sm_st_parse_buffer(b, n, &st), SMELT_OK);
  CHECK(st && sm_st_find(st, "x"));
  sm_st_close(st);
  free(b);

  /* many tensors: hash lookup of every name */
  enum { N = 3000 };
  size_t cap = (size_t)N * 96 + 16, len = 0;
  char *j = malloc(cap);
  len += (size_t)snprintf(j + len, cap - len, "{");
  for (int i = 0; i < N; i++)
    len += (size_t)snprintf(j + len, cap - len,
                            "%s\"model.layers.%d.w\":{\"dtype\":\"F16\",\"shape\":[%d,0],\"data_offsets\":[%d,%d]}",
                            i ? "," : "", i, i % 7, 0, 0);
  snprintf(j + len, cap - len, "}");
  /* all zero-sized at offset 0: legal, no overlap */
  b = image(j, 0, &n);
  CHECK_EQ_I(sm_st_parse_buffer(b, n, &st), SMELT_OK);
  free(b);
  sm_st_close(st);
  len = 0;
  len += (size_t)snprintf(j + len, cap - len, "{");
  for (int i = 0; i < N; i++)
    len += (size_t)snprintf(j + len, cap - len,
                            "%s\"model.layers.%d.w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[%d,%d]}",
                            i ? "," : "", N - 1 - i, 4 * i, 4 * i + 4);
  snprintf(j + len, cap - len, "}");
  b = image(j, 4 * N, &n);
  CHECK_EQ_I(sm_st_parse_buffer(b, n, &st), SMELT_OK);
  int ok = 0;
  for (int i = 0; st && i < N; i++) {
    char nm[64];
    snprintf(nm, sizeof nm, "model.layers.%d.w", i);
    const sm_tensor *t = sm_st_find(st, nm);
    /* tensor named N-1-k lives at offset 4k */
    ok += t && (const uint8_t *)t->data == b + 8 + strlen(j) + 4 * (N - 1 - i);
  }
  CHECK_EQ_I(ok, N);
  CHECK(sm_st_find(st, "model.layers.3000.w") == NULL);
  sm_st_close(st);
  free(b);
  free(j);
}

static void test_errors(void) {
  /* truncated below 8 bytes */
  sm_st *st = (sm_st *)1;
  uint8_t tiny[5] = {1, 0, 0, 0, 0};
  CHECK(sm_st_parse_buffer(tiny, sizeof tiny, &st) == SMELT_ERR_FORMAT && st == NULL);
  CHECK(strstr(sm_errmsg(), "truncated") != NULL);
  CHECK(sm_st_parse_buffer(NULL, 0, &st) == SMELT_ERR_FORMAT);

  /* header length beyond the file / beyond 100 MB */
  size_t n;
  uint8_t *b = image("{}", 0, &n);
  b[0] = 200; /* claims 200 bytes of header */
  CHECK(sm_st_parse_buffer(b, n, &st) == SMELT_ERR_FORMAT);
  CHECK(strstr(sm_errmsg(), "larger than the file") != NULL);
  memset(b, 0xff, 8);
  CHECK(sm_st_parse_buffer(b, n, &st) == SMELT_ERR_FORMAT);
  CHECK(strstr(sm_errmsg(), "100 MB") != NULL);
  b[0] = 0;
  b[1] = 0;
  b[2] = 0;
  b[3] = 0x40;
  b[4] = b[5] = b[6] = b[7] = 0; /* 1 GiB */
  CHECK(sm_st_parse_buffer(b, n, &st) == SMELT_ERR_FORMAT);
  free(b);

  /* truncated file: data block shorter than the offsets claim */
  const char *ok1 = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
  b = image(ok1, 16, &n);
  CHECK(sm_st_parse_buffer(b, n, &st) == SMELT_OK);
  sm_st_close(st);
  CHECK(sm_st_parse_buffer(b, n - 1, &st) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "'w'"));
  CHECK(sm_st_parse_buffer(b, 8 + 10, &st) == SMELT_ERR_FORMAT); /* cut inside the header */
  free(b);

  FAIL("not json at all", 0, SMELT_ERR_FORMAT, "header");
  FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, SMELT_ERR_FORMAT, "JSON");
  FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} xx", 4, SMELT_ERR_FORMAT, "trailing");
  FAIL("[1,2,3]", 0, SMELT_ERR_FORMAT, NULL);
  FAIL("{\"w\":[1]}", 0, SMELT_ERR_FORMAT, "'w'");
  FAIL("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, SMELT_ERR_UNSUPPORTED, "F8_E4M3");
  FAIL("{\"w\":{\"dtype\":\"f32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, SMELT_ERR_UNSUPPORTED, "dtype");
  FAIL("{\"w\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,16]}}", 16, SMELT_ERR_FORMAT, "dtype");
  FAIL("{\"w\":{\"shape\":[4],\"data_offsets\":[0,16]}}", 16, SMELT_ERR_FORMAT, "dtype");
  FAIL("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}", 16, SMELT_ERR_FORMAT, "shape");
  FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16, SMELT_ERR_FORMAT, "data_offsets");
  /* shape vs byte range */
  FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16, SMELT_ERR_FORMAT, "'w'");
  FAIL("{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 16, SMELT_ERR_FORMAT, "12 bytes");
  /* offsets out of range / reversed / not integers */
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[14,18]}}", 16, SMELT_ERR_FORMAT, "outside");
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,4]}}", 16, SMELT_ERR_FORMAT, "begin");
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[-1,-1]}}", 16, SMELT_ERR_FORMAT, "data_offsets");
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.5,1.5]}}", 16, SMELT_ERR_FORMAT, "data_offsets");
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 16, SMELT_ERR_FORMAT, "data_offsets");
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[\"0\",\"1\"]}}", 16, SMELT_ERR_FORMAT, "data_offsets");
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1e300,1e300]}}", 16, SMELT_ERR_FORMAT, "data_offsets");
  /* overlapping */
  FAIL("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
       16, SMELT_ERR_FORMAT, "overlapping");
  FAIL("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]},"
       "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]}}",
       16, SMELT_ERR_FORMAT, "overlapping");
  /* negative / fractional / huge dims */
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 16, SMELT_ERR_FORMAT, "negative");
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[2,-2],\"data_offsets\":[0,4]}}", 16, SMELT_ERR_FORMAT, "negative");
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,4]}}", 16, SMELT_ERR_FORMAT, "shape");
  FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,0]}}", 16, SMELT_ERR_FORMAT,
       "overflow");
  FAIL("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 16, SMELT_ERR_FORMAT,
       NULL);
  FAIL("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 16, SMELT_ERR_UNSUPPORTED,
       "dimensions");
  /* duplicate names in one header */
  FAIL("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
       16, SMELT_ERR_FORMAT, "twice");
  /* NUL byte inside the header */
  char withnul[] = "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  b = image(withnul, 1, &n);
  b[8 + 3] = 0;
  CHECK(sm_st_parse_buffer(b, n, &st) == SMELT_ERR_FORMAT);
  free(b);
}

static char g_tmp[256];

static void test_files(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/smelt_st_test_XXXXXX");
  if (!mkdtemp(g_tmp)) {
    perror("mkdtemp");
    exit(2);
  }
  char d[512], p[600];

  /* sharded with index; a stray consolidated file that the index must make us ignore */
  snprintf(d, sizeof d, "%s/sharded", g_tmp);
  mkdir(d, 0755);
  write_image(d, "model-00001-of-00002.safetensors",
              "{\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
              "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
              24);
  write_image(d, "model-00002-of-00002.safetensors",
              "{\"lm_head.weight\":{\"dtype\":\"U32\",\"shape\":[4,1],\"data_offsets\":[0,16]}}", 16);
  write_image(d, "consolidated.safetensors",
              "{\"lm_head.weight\":{\"dtype\":\"U32\",\"shape\":[4,1],\"data_offsets\":[0,16]}}", 16);
  const char *idx = "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
                    "\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
                    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                    "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}";
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
  write_file(p, idx, strlen(idx));
  sm_st *st = NULL;
  CHECK_EQ_I(sm_st_open(d, &st), SMELT_OK);
  if (!st) fprintf(stderr, "%s\n", sm_errmsg());
  CHECK_EQ_I(sm_st_count(st), 3);
  CHECK_EQ_I(sm_st_total_bytes(st), 40);
  const sm_tensor *e = sm_st_find(st, "model.embed_tokens.weight"), *h = sm_st_find(st, "lm_head.weight");
  CHECK(e && h && e->file != h->file && e->shape[0] == 4 && h->dtype == SM_DT_U32);
  const sm_tensor *nw = sm_st_find(st, "model.norm.weight");
  CHECK(nw && nw->file == e->file && ((const uint8_t *)nw->data)[0] == 16);
  sm_st_close(st);

  /* index naming a missing shard */
  char idx2[1024];
  snprintf(idx2, sizeof idx2, "{\"weight_map\":{\"a\":\"model-00003-of-00003.safetensors\"}}");
  snprintf(d, sizeof d, "%s/badindex", g_tmp);
  mkdir(d, 0755);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
  write_file(p, idx2, strlen(idx2));
  CHECK(sm_st_open(d, &st) == SMELT_ERR_IO && st == NULL);
  CHECK(strstr(sm_errmsg(), "model-00003-of-00003") != NULL);
  /* index listing a tensor its shard does not have */
  write_image(d, "s.safetensors", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  snprintf(idx2, sizeof idx2, "{\"weight_map\":{\"a\":\"s.safetensors\",\"b\":\"s.safetensors\"}}");
  write_file(p, idx2, strlen(idx2));
  CHECK(sm_st_open(d, &st) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "'b'"));
  /* unsafe path and broken JSON in the index */
  snprintf(idx2, sizeof idx2, "{\"weight_map\":{\"a\":\"../s.safetensors\"}}");
  write_file(p, idx2, strlen(idx2));
  CHECK(sm_st_open(d, &st) == SMELT_ERR_FORMAT);
  write_file(p, "{\"weight_map\":", 14);
  CHECK(sm_st_open(d, &st) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "index.json"));

  /* no index: every *.safetensors, duplicate names across shards rejected */
  snprintf(d, sizeof d, "%s/dups", g_tmp);
  mkdir(d, 0755);
  write_image(d, "a.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  write_image(d, "b.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  CHECK(sm_st_open(d, &st) == SMELT_ERR_FORMAT && st == NULL);
  CHECK(strstr(sm_errmsg(), "'x'") && strstr(sm_errmsg(), "a.safetensors") && strstr(sm_errmsg(), "b.safetensors"));

  /* no index, distinct names: both files, sorted order (a before b) */
  snprintf(d, sizeof d, "%s/glob", g_tmp);
  mkdir(d, 0755);
  write_image(d, "b.safetensors", "{\"y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  write_image(d, "a.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
  snprintf(p, sizeof p, "%s/notes.txt", d);
  write_file(p, "hi", 2);
  CHECK_EQ_I(sm_st_open(d, &st), SMELT_OK);
  CHECK_EQ_I(sm_st_count(st), 2);
  CHECK(st && sm_st_find(st, "x") && sm_st_find(st, "x")->file == 0 && sm_st_find(st, "y")->file == 1);
  sm_st_close(st);

  /* a single file path */
  snprintf(p, sizeof p, "%s/glob/b.safetensors", g_tmp);
  CHECK_EQ_I(sm_st_open(p, &st), SMELT_OK);
  CHECK(st && sm_st_count(st) == 1 && sm_st_find(st, "y"));
  sm_st_close(st);

  /* corrupt shard: the message names the file and the tensor */
  snprintf(d, sizeof d, "%s/corrupt", g_tmp);
  mkdir(d, 0755);
  write_image(d, "m.safetensors", "{\"layer.w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16);
  CHECK(sm_st_open(d, &st) == SMELT_ERR_FORMAT);
  CHECK(strstr(sm_errmsg(), "m.safetensors") && strstr(sm_errmsg(), "layer.w"));

  /* empty file, empty dir, missing path */
  write_file(p, "", 0);
  CHECK(sm_st_open(p, &st) == SMELT_ERR_FORMAT);
  snprintf(d, sizeof d, "%s/empty", g_tmp);
  mkdir(d, 0755);
  CHECK(sm_st_open(d, &st) == SMELT_ERR_NOT_FOUND);
  snprintf(d, sizeof d, "%s/nope", g_tmp);
  CHECK(sm_st_open(d, &st) == SMELT_ERR_IO);
  CHECK(sm_st_find(NULL, "x") == NULL && sm_st_count(NULL) == 0);
  sm_st_close(NULL);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
}

int main(void) {
  test_basic();
  test_dtypes();
  test_padding_and_many();
  test_errors();
  test_files();
  return TEST_DONE();
}
