/* The CPU int8 path on packed weights, held to its canonical arithmetic (cpu_internal.h, "packed
 * weights") bit for bit:
 *  - packing: every code, scale and bias comes back from the packed copy (scalar and AVX-512
 *    unpackers) for every bit width, group size and scale dtype, rows not a multiple of 16;
 *  - activation quantization: the vector quantizer equals the scalar one exactly (zero groups,
 *    large and tiny values);
 *  - matmuls: for n = 1 (decode matvec) and batches (up to SMELT_CPU_MVN_MAX tokens the streaming
 *    matvec of 2-4 tokens at a time with AVX-512 VNNI; the VNNI GEMM; AMX GEMM where the CPU has it,
 *    skipped elsewhere) the backend's output equals sm_cpu_i8_ref, the scalar canonical
 *    computation on the original weight, bit for bit, with 1..4 threads;
 *  - batch invariance: each token's output is the same alone, in batches of any size and at any
 *    position of a batch;
 *  - the AMX kernel's tiling, strides and epilogue with the tile instructions emulated in C
 *    (amx_emu.c), on any AVX-512 CPU: equal to the canonical arithmetic too.
 * (Closeness of the int8 path to the exact product is tested in test_cpu_backend.c.) */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail = 0;
#define CHECK(c, ...) \
  do { \
    if (!(c)) { \
      g_fail++; \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__); \
      printf("\n"); \
    } \
  } while (0)

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t urand32(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(urand32() & 0xffffff) / 16777216.f; }

static void st_f(void *p, size_t i, sm_dtype t, float v) {
  if (t == SM_DT_F32) ((float *)p)[i] = v;
  else if (t == SM_DT_F16) ((uint16_t *)p)[i] = sm_f32_to_f16(v);
  else ((uint16_t *)p)[i] = sm_f32_to_bf16(v);
}

/* random codes (little-endian bit stream per row), scales, biases (NULL with no_bias) */
typedef struct {
  sm_weight w;
  uint8_t *q;
  void *s, *b;
} qw;
static void make_w(qw *t, int64_t rows, int64_t cols, int bits, int gs, sm_dtype dt, bool no_bias) {
  const size_t rowb = (size_t)cols * (size_t)bits / 8, ng = (size_t)(cols / gs), es = dt == SM_DT_F32 ? 4 : 2;
  t->q = calloc((size_t)rows * rowb, 1);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) {
      uint32_t v = urand32() & ((1u << bits) - 1);
      if (j % 97 == 0) v = (1u << bits) - 1; /* extreme codes */
      uint64_t bit = (uint64_t)j * (uint64_t)bits;
      uint8_t *row = t->q + (size_t)r * rowb;
      row[bit >> 3] |= (uint8_t)(v << (bit & 7));
      if ((bit & 7) + (uint64_t)bits > 8) row[(bit >> 3) + 1] |= (uint8_t)(v >> (8 - (bit & 7)));
    }
  t->s = malloc(es * (size_t)rows * ng);
  t->b = no_bias ? NULL : malloc(es * (size_t)rows * ng);
  for (size_t i = 0; i < (size_t)rows * ng; i++) {
    st_f(t->s, i, dt, frand(0.001f, 0.05f) * (i % 11 == 0 ? -1.f : 1.f));
    if (t->b) st_f(t->b, i, dt, frand(-0.5f, 0.5f));
  }
  t->w = (sm_weight){.rows = rows,
                     .cols = cols,
                     .bits = bits,
                     .group_size = gs,
                     .dtype = dt,
                     .data = t->q,
                     .scales = t->s,
                     .biases = t->b};
}
static void free_w(qw *t) {
  free(t->q);
  free(t->s);
  free(t->b);
}

static void fill_x(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    x[i] = frand(-1.f, 1.f) * (i % 13 == 0 ? 8.f : 1.f);
    if (i % 211 == 5) x[i] = 0.f;
  }
}

static void test_pack(const qw *t) {
  const sm_weight *w = &t->w;
  sm_cpu_packed *p = sm_cpu_pack(w, NULL, false);
  CHECK(p != NULL, "pack");
  if (!p) return;
  const int64_t K = w->cols, ng = p->ng;
  uint8_t *U = sm_aligned_alloc((size_t)16 * (size_t)K), *U2 = sm_aligned_alloc((size_t)16 * (size_t)K);
  float *S = sm_aligned_alloc(sizeof(float) * 4 * (size_t)ng * 16), *B = S + ng * 16, *S2 = B + ng * 16,
        *B2 = S2 + ng * 16;
  const size_t rowb = (size_t)K * (size_t)w->bits / 8;
  int bad = 0;
  for (int64_t rb = 0; rb < p->nrb; rb++) {
    sm_cpu_unpack_rb_ref(p, rb, U, S, B);
    for (int r = 0; r < 16; r++) {
      const int64_t row = rb * 16 + r;
      for (int64_t k = 0; k < K; k++) {
        unsigned want = row < w->rows ? sm_cpu_getq((const uint8_t *)w->data + (size_t)row * rowb, k, w->bits) : 0;
        if (U[(size_t)(k / 4) * 64 + (size_t)r * 4 + (size_t)(k % 4)] != want) bad++;
      }
      for (int64_t g = 0; g < ng; g++) {
        float ws = row < w->rows ? sm_cpu_ldf(w->scales, (size_t)(row * ng + g), w->dtype) : 0.f;
        float wb = row < w->rows && w->biases ? sm_cpu_ldf(w->biases, (size_t)(row * ng + g), w->dtype) : 0.f;
        if (S[g * 16 + r] != ws || B[g * 16 + r] != wb) bad++;
      }
    }
    for (int v = 0; v < 2; v++) { /* the vector unpackers */
      if (!(v ? sm_i8avx2_ok() : sm_i8avx512_ok())) continue;
      memset(U2, 0xAA, (size_t)16 * (size_t)K);
      (v ? sm_i8avx2_unpack : sm_i8avx512_unpack)(p, rb, U2, S2, B2);
      if (memcmp(U, U2, (size_t)16 * (size_t)K) || memcmp(S, S2, sizeof(float) * (size_t)ng * 16) ||
          memcmp(B, B2, sizeof(float) * (size_t)ng * 16))
        bad++;
    }
  }
  CHECK(!bad, "pack/unpack q%d g%d dt%d %lldx%lld: %d mismatches", w->bits, w->group_size, (int)w->dtype,
        (long long)w->rows, (long long)K, bad);
  free(U);
  free(U2);
  free(S);
  sm_cpu_packed_free(p);
}

static void test_quant(void) {
  static const int gsv[] = {32, 64, 128};
  for (int vi = 0; vi < 2; vi++)
    for (int gi = 0; gi < 3; gi++) {
      if (!(vi ? sm_i8avx2_ok() : sm_i8avx512_ok())) break;
      const int gs = gsv[gi], K = gs * 9, n = 3;
      float *x = malloc(sizeof(float) * (size_t)(n * K));
      fill_x(x, (size_t)(n * K));
      for (int j = 0; j < gs; j++) x[2 * gs + j] = 0.f;                       /* an all-zero group */
      for (int j = 0; j < gs; j++) x[3 * gs + j] = 1e-30f * (float)(j - 7);   /* tiny values */
      for (int j = 0; j < gs; j++) x[4 * gs + j] = 3e4f * (float)(j % 5 - 2); /* large ones, exact ties */
      int8_t *q1 = malloc((size_t)(n * K)), *q2 = malloc((size_t)(n * K));
      float *s1 = malloc(sizeof(float) * 4 * (size_t)(n * K / gs)), *u1 = s1 + n * K / gs, *s2 = u1 + n * K / gs,
            *u2 = s2 + n * K / gs;
      for (int t = 0; t < n; t++)
        sm_cpu_quant_x_ref(x + t * K, K, gs, q1 + t * K, s1 + t * (K / gs), u1 + t * (K / gs));
      (vi ? sm_i8avx2_quant : sm_i8avx512_quant)(x, K, gs, 0, n, q2, s2, u2);
      CHECK(!memcmp(q1, q2, (size_t)(n * K)), "quant %s g%d: xq differs", vi ? "avx2" : "avx512", gs);
      CHECK(!memcmp(s1, s2, sizeof(float) * (size_t)(n * K / gs)), "quant %s g%d: xs differs", vi ? "avx2" : "avx512",
            gs);
      CHECK(!memcmp(u1, u2, sizeof(float) * (size_t)(n * K / gs)), "quant %s g%d: xsum differs", vi ? "avx2" : "avx512",
            gs);
      free(x);
      free(q1);
      free(q2);
      free(s1);
    }
}

/* kern_amx.c compiled with emulated tiles (amx_emu.c) */
void sm_amx_gemm_emu(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb0, int nrb,
                     int t0, int t1, float *y, int64_t ldy, void *work);
void sm_amx_release_emu(void);

/* the AMX kernel as cpu_matmul.c drives it (items of up to 4 row blocks x chunks of 16k tokens),
 * tiles emulated, against sm_cpu_i8_ref */
static void check_amx_emu(const qw *t, int n, int tchunk) {
  const sm_weight *w = &t->w;
  const int64_t M = w->rows, K = w->cols;
  sm_cpu_packed *p = sm_cpu_pack(w, NULL, false);
  const int64_t ng = p->ng;
  const int n16 = (n + 15) & ~15;
  float *x = malloc(sizeof(float) * (size_t)n * (size_t)K), *y = malloc(sizeof(float) * (size_t)n * (size_t)M),
        *r = malloc(sizeof(float) * (size_t)n * (size_t)M);
  int8_t *xq = sm_aligned_alloc((size_t)n16 * (size_t)K);
  float *xs = malloc(sizeof(float) * 2 * (size_t)n * (size_t)ng), *xsum = xs + (size_t)n * (size_t)ng;
  uint8_t *U = sm_aligned_alloc((size_t)4 * 16 * (size_t)K);
  float *SC = sm_aligned_alloc(sizeof(float) * 8 * (size_t)ng * 16), *BI = SC + 4 * ng * 16;
  void *work = sm_aligned_alloc(SM_AMX_SCRATCH);
  fill_x(x, (size_t)n * (size_t)K);
  for (size_t i = 0; i < (size_t)n * (size_t)M; i++) y[i] = NAN;
  memset(xq, 0, (size_t)n16 * (size_t)K);
  sm_i8avx512_quant(x, K, w->group_size, 0, n, xq, xs, xsum);
  sm_i8_arg a = {.p = p, .xq = xq, .xs = xs, .xsum = xsum, .n = n};
  for (int64_t rb0 = 0; rb0 < p->nrb; rb0 += 4) {
    const int nrb = (int)(p->nrb - rb0 < 4 ? p->nrb - rb0 : 4);
    for (int j = 0; j < nrb; j++)
      sm_cpu_unpack_rb_ref(p, rb0 + j, U + (size_t)j * 16 * (size_t)K, SC + (size_t)j * (size_t)ng * 16,
                           BI + (size_t)j * (size_t)ng * 16);
    for (int t0 = 0; t0 < n; t0 += tchunk)
      sm_amx_gemm_emu(&a, U, SC, BI, rb0, nrb, t0, t0 + tchunk < n ? t0 + tchunk : n, y, M, work);
  }
  sm_amx_release_emu();
  sm_cpu_i8_ref(w, x, n, r);
  size_t bad = 0;
  for (size_t i = 0; i < (size_t)n * (size_t)M; i++) bad += memcmp(&y[i], &r[i], 4) != 0;
  CHECK(!bad, "AMX (emulated) q%d g%d dt%d %lldx%lld n=%d chunk %d: %zu outputs differ from the canonical arithmetic",
        w->bits, w->group_size, (int)w->dtype, (long long)M, (long long)K, n, tchunk, bad);
  free(x);
  free(y);
  free(r);
  free(xq);
  free(xs);
  free(U);
  free(SC);
  free(work);
  sm_cpu_packed_free(p);
}

static void test_amx_emu(void) {
  if (!sm_i8avx512_ok()) {
    printf("skip the AMX kernel with emulated tiles (its epilogue needs AVX-512)\n");
    return;
  }
  static const int bitsv[] = {2, 3, 4, 5, 6, 8}, gsv[] = {32, 64, 128}, nv[] = {1, 5, 16, 17, 40};
  static const sm_dtype dtv[] = {SM_DT_F16, SM_DT_BF16, SM_DT_F32};
  int ci = 0, f0 = g_fail;
  for (int bi = 0; bi < 6; bi++)
    for (int gi = 0; gi < 3; gi++, ci++) {
      qw t;
      make_w(&t, 1 + 13 * (ci % 6), 1024 + (int64_t)gsv[gi] * (ci % 3), bitsv[bi], gsv[gi], dtv[ci % 3], ci % 7 == 2);
      check_amx_emu(&t, nv[ci % 5], ci % 2 ? 16 : 32);
      if (ci % 4 == 0) check_amx_emu(&t, 33, 16);
      free_w(&t);
    }
  printf("AMX kernel with emulated tiles: %s\n", g_fail == f0 ? "ok" : "FAILED");
}

static int g_amx_runs = 0;
/* backend matmul of n tokens == sm_cpu_i8_ref, bit for bit */
static void check_exact(sm_backend *be, qw *t, int n, const char *what) {
  const int64_t M = t->w.rows, K = t->w.cols;
  float *x = malloc(sizeof(float) * (size_t)n * (size_t)K), *y = malloc(sizeof(float) * (size_t)n * (size_t)M),
        *r = malloc(sizeof(float) * (size_t)n * (size_t)M);
  fill_x(x, (size_t)n * (size_t)K);
  for (size_t i = 0; i < (size_t)n * (size_t)M; i++) y[i] = NAN;
  be->matmul(be, SM_MM_OTHER, &t->w, x, n, y);
  sm_cpu_i8_ref(&t->w, x, n, r);
  if (sm_cpu_backend_uses_amx(be, &t->w, n)) g_amx_runs++;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < (size_t)n * (size_t)M; i++)
    if (memcmp(&y[i], &r[i], 4)) {
      if (!bad) first = i;
      bad++;
    }
  CHECK(!bad, "%s n=%d: %zu outputs differ from the canonical arithmetic (first: token %zu row %zu: %.9g vs %.9g)",
        what, n, bad, first / (size_t)M, first % (size_t)M, bad ? y[first] : 0.f, bad ? r[first] : 0.f);
  free(x);
  free(y);
  free(r);
}

/* token i alone, in one batch of all, and at another position of a shuffled batch: same bits */
static void check_invariance(sm_backend *be, qw *t, const char *what) {
  enum { N = 37 };
  const int64_t M = t->w.rows, K = t->w.cols;
  float *x = malloc(sizeof(float) * N * (size_t)K), *xr = malloc(sizeof(float) * N * (size_t)K);
  float *all = malloc(sizeof(float) * N * (size_t)M), *one = malloc(sizeof(float) * (size_t)M),
        *rev = malloc(sizeof(float) * N * (size_t)M), *part = malloc(sizeof(float) * N * (size_t)M);
  fill_x(x, N * (size_t)K);
  for (int i = 0; i < N; i++) memcpy(xr + (size_t)i * K, x + (size_t)(N - 1 - i) * K, sizeof(float) * (size_t)K);
  be->matmul(be, SM_MM_OTHER, &t->w, x, N, all);
  be->matmul(be, SM_MM_OTHER, &t->w, xr, N, rev);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    be->matmul(be, SM_MM_OTHER, &t->w, x + (size_t)i * K, 1, one);
    if (memcmp(one, all + (size_t)i * M, sizeof(float) * (size_t)M)) bad++;
    if (memcmp(one, rev + (size_t)(N - 1 - i) * M, sizeof(float) * (size_t)M)) bad++;
  }
  static const int sizes[] = {2, 3, 5, 8, 16, 17};
  for (int s = 0; s < 6; s++) {
    const int sz = sizes[s], off = N - sz - 1;
    be->matmul(be, SM_MM_OTHER, &t->w, x + (size_t)off * K, sz, part);
    if (memcmp(part, all + (size_t)off * M, sizeof(float) * (size_t)sz * (size_t)M)) bad++;
  }
  CHECK(!bad, "%s: %d token results depend on the batch", what, bad);
  free(x);
  free(xr);
  free(all);
  free(one);
  free(rev);
  free(part);
}

static void run_matmuls(sm_backend *be, const char *tag) {
  static const int bitsv[] = {2, 3, 4, 5, 6, 8}, gsv[] = {32, 64, 128};
  static const sm_dtype dtv[] = {SM_DT_F16, SM_DT_BF16, SM_DT_F32};
  static const int rowsv[] = {1, 15, 17, 33, 50, 64, 7};
  static const int nv[] = {1, 2, 3, 7, 8, 9, 16, 21, 40};
  char what[160];
  int ci = 0;
  for (int bi = 0; bi < 6; bi++)
    for (int gi = 0; gi < 3; gi++)
      for (int di = 0; di < 3; di++, ci++) {
        const int gs = gsv[gi];
        const int64_t cols = 1024 + (int64_t)gs * (ci % 5), rows = rowsv[ci % 7];
        qw t;
        make_w(&t, rows, cols, bitsv[bi], gs, dtv[di], ci % 8 == 3);
        CHECK(be->prepare_weight(be, &t.w) == SMELT_OK && t.w.dev, "%s: weight not packed", tag);
        snprintf(what, sizeof what, "%s q%d g%d dt%d %lldx%lld%s", tag, bitsv[bi], gs, (int)dtv[di], (long long)rows,
                 (long long)cols, t.b ? "" : " no-bias");
        for (int k = 0; k < 9; k++)
          if ((k + ci) % 3 == 0 || k < 2) check_exact(be, &t, nv[k], what);
        if (ci % 4 == 0) check_invariance(be, &t, what);
        be->release_weight(be, &t.w);
        free_w(&t);
      }
  /* a model-sized shape: many row blocks over the threads, several token chunks */
  qw t;
  make_w(&t, 300, 2048, 4, 64, SM_DT_BF16, false);
  be->prepare_weight(be, &t.w);
  snprintf(what, sizeof what, "%s q4 300x2048", tag);
  check_exact(be, &t, 1, what);
  check_exact(be, &t, 70, what);
  check_invariance(be, &t, what);
  be->release_weight(be, &t.w);
  free_w(&t);
}

int main(void) {
  static const int bitsv[] = {2, 3, 4, 5, 6, 8}, gsv[] = {32, 64, 128};
  static const sm_dtype dtv[] = {SM_DT_F16, SM_DT_BF16, SM_DT_F32};
  for (int bi = 0; bi < 6; bi++)
    for (int gi = 0; gi < 3; gi++) {
      qw t;
      make_w(&t, 1 + 7 * (bi + gi), 512 + (int64_t)gsv[gi] * (1 + gi), bitsv[bi], gsv[gi], dtv[(bi + gi) % 3], bi == 2);
      test_pack(&t);
      free_w(&t);
    }
  test_quant();
  if (!sm_i8avx512_ok() && !sm_i8avx2_ok()) {
    printf("skip packed int8 matmuls: this CPU has neither AVX-512 VNNI nor AVX2\n");
    printf(g_fail ? "%d FAILURES\n" : "all passed\n", g_fail);
    return g_fail != 0;
  }
  test_amx_emu();
  const bool amx = sm_amx_ok();
  /* the AVX-512 kernel set (VNNI, AMX) and the AVX2 one (AVX-VNNI where the CPU has it, else AVX2) */
  static const char *isas[] = {"avx512", "avx2"};
  for (int ii = 0; ii < 2; ii++) {
    if (!sm_cpu_kernels_by_name(isas[ii])) {
      printf("skip %s (not supported by this CPU)\n", isas[ii]);
      continue;
    }
    setenv("SMELT_CPU_ISA", isas[ii], 1);
    for (int use_amx = 0; use_amx <= (amx && ii == 0 ? 1 : 0); use_amx++) {
      setenv("SMELT_CPU_AMX", use_amx ? "1" : "0", 1);
      setenv("SMELT_CPU_AMX_MIN_N", "2", 1);
      for (int nth = 1; nth <= 4; nth++) {
        if (ii == 1 && nth == 3) continue;
        sm_backend *be = sm_cpu_backend_create(nth);
        CHECK(be != NULL, "create: %s", sm_errmsg());
        if (!be) continue;
        char tag[64];
        snprintf(tag, sizeof tag, "%s%s threads=%d", sm_cpu_backend_i8_name(be), use_amx ? "+amx" : "", nth);
        int f0 = g_fail;
        g_amx_runs = 0;
        run_matmuls(be, tag);
        if (use_amx) CHECK(g_amx_runs > 0, "%s: AMX never used", tag);
        else CHECK(g_amx_runs == 0, "%s: AMX used with SMELT_CPU_AMX=0", tag);
        printf("%s: %s\n", tag, g_fail == f0 ? "ok" : "FAILED");
        be->destroy(be);
      }
    }
  }
  /* tuning values documented as "same results" */
  static const char *const tv[][2] = {{"SMELT_CPU_MV_CHUNKS", "0"},
                                      {"SMELT_CPU_MV_CHUNKS", "64"},
                                      {"SMELT_CPU_PREFETCH", "4096"},
                                      {"SMELT_CPU_HUGEPAGES", "1"}};
  unsetenv("SMELT_CPU_ISA");
  for (int i = 0; i < 4; i++) {
    setenv(tv[i][0], tv[i][1], 1);
    sm_backend *be = sm_cpu_backend_create(3);
    CHECK(be != NULL, "create with %s=%s", tv[i][0], tv[i][1]);
    if (be) {
      char what[96];
      snprintf(what, sizeof what, "%s=%s", tv[i][0], tv[i][1]);
      qw t;
      make_w(&t, i == 3 ? 2100 : 333, 2048, 4 + 2 * (i % 2), 64, SM_DT_F16, false); /* 2100: a 2 MiB copy */
      be->prepare_weight(be, &t.w);
      check_exact(be, &t, 1, what);
      check_exact(be, &t, 19, what);
      be->release_weight(be, &t.w);
      free_w(&t);
      be->destroy(be);
    }
    unsetenv(tv[i][0]);
  }
  if (!amx) printf("skip AMX: this CPU or kernel has no AMX tile support\n");
  unsetenv("SMELT_CPU_AMX");
  unsetenv("SMELT_CPU_AMX_MIN_N");
  unsetenv("SMELT_CPU_ISA");
  printf(g_fail ? "%d FAILURES\n" : "all passed\n", g_fail);
  return g_fail != 0;
}
