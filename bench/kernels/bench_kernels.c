/* CPU kernel benchmark: DRAM read bandwidth, quantized matvec bandwidth, prefill GFLOP/s, attention.
 * usage: bench_kernels [n_threads] [all|q4|lowbit|gemm|att|hot] (hot: one thread's compute rate, mxfp4 too)
 *   (env SMELT_CPU_ISA=scalar|avx2|avx512 picks the kernels, SMELT_CPU_EXACT=1 the float path,
 *   SMELT_CPU_PACK=0 the int8 kernels of unpacked weights, SMELT_CPU_AMX=0 VNNI instead of AMX) */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static uint16_t rnd16(void) { return (uint16_t)rand(); }

static double g_bw;

static void bench_matvec(sm_backend *be, int64_t M, int64_t K, int bits, int gs) {
  size_t wbytes = (size_t)M * (size_t)K * (size_t)bits / 8, ng = (size_t)M * (size_t)(K / gs);
  size_t per = wbytes + 2 * ng * 2;             /* packed + f16 scales + f16 biases */
  int copies = (int)((512ull << 20) / per) + 1; /* > 512 MB in total: never L3-resident */
  if (copies > 64) copies = 64;
  sm_weight *w = calloc((size_t)copies, sizeof *w);
  for (int c = 0; c < copies; c++) {
    uint8_t *d = sm_aligned_alloc(wbytes);
    uint16_t *s = sm_aligned_alloc(ng * 2), *b = sm_aligned_alloc(ng * 2);
    for (size_t i = 0; i < wbytes; i++) d[i] = (uint8_t)rand();
    for (size_t i = 0; i < ng; i++) {
      s[i] = sm_f32_to_f16(0.01f + (rnd16() & 255) * 1e-4f);
      b[i] = sm_f32_to_f16(-0.05f);
    }
    w[c] = (sm_weight){.rows = M,
                       .cols = K,
                       .bits = bits,
                       .group_size = gs,
                       .dtype = SM_DT_F16,
                       .data = d,
                       .scales = s,
                       .biases = b};
    be->prepare_weight(be, &w[c]); /* packed copy where the backend packs (SMELT_CPU_PACK=0: none) */
  }
  float *x = sm_aligned_alloc((size_t)K * 4), *y = sm_aligned_alloc((size_t)M * 4);
  for (int64_t i = 0; i < K; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
  int iters = (int)((4ull << 30) / per);
  if (iters < 2 * copies) iters = 2 * copies;
  if (iters > 4000) iters = 4000;
  for (int c = 0; c < copies; c++) be->matmul(be, SM_MM_OTHER, &w[c], x, 1, y); /* warm up / fault in */
  double t0 = sm_now();
  for (int i = 0; i < iters; i++) be->matmul(be, SM_MM_OTHER, &w[i % copies], x, 1, y);
  double dt = sm_now() - t0;
  double gbs = (double)per * iters / dt / 1e9;
  /* hot: the same matrix again and again (L3-resident when it fits) */
  int hot_iters = iters;
  t0 = sm_now();
  for (int i = 0; i < hot_iters; i++) be->matmul(be, SM_MM_OTHER, &w[0], x, 1, y);
  double dth = sm_now() - t0;
  printf("matvec q%d g%d %6lldx%-5lld  %7.1f us  %6.2f GB/s  = %3.0f%% of DRAM bw   (hot/L3: %7.1f us, %6.2f GB/s)\n",
         bits, gs, (long long)M, (long long)K, dt / iters * 1e6, gbs, 100 * gbs / g_bw, dth / hot_iters * 1e6,
         (double)per * hot_iters / dth / 1e9);
  for (int c = 0; c < copies; c++) {
    be->release_weight(be, &w[c]);
    free((void *)w[c].data);
    free((void *)w[c].scales);
    free((void *)w[c].biases);
  }
  free(w);
  free(x);
  free(y);
}

static void bench_gemm(sm_backend *be, int64_t M, int64_t K, int bits, int gs, int n) {
  size_t wbytes = (size_t)M * (size_t)K * (size_t)bits / 8, ng = (size_t)M * (size_t)(K / gs);
  uint8_t *d = sm_aligned_alloc(wbytes);
  uint16_t *s = sm_aligned_alloc(ng * 2), *b = sm_aligned_alloc(ng * 2);
  for (size_t i = 0; i < wbytes; i++) d[i] = (uint8_t)rand();
  for (size_t i = 0; i < ng; i++) {
    s[i] = sm_f32_to_f16(0.01f);
    b[i] = sm_f32_to_f16(-0.05f);
  }
  sm_weight w =
    {.rows = M, .cols = K, .bits = bits, .group_size = gs, .dtype = SM_DT_F16, .data = d, .scales = s, .biases = b};
  be->prepare_weight(be, &w);
  float *x = sm_aligned_alloc((size_t)n * K * 4), *y = sm_aligned_alloc((size_t)n * M * 4);
  for (int64_t i = 0; i < n * K; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
  be->matmul(be, SM_MM_OTHER, &w, x, n, y);
  int iters = 0;
  double t0 = sm_now(), dt;
  do {
    be->matmul(be, SM_MM_OTHER, &w, x, n, y);
    iters++;
    dt = sm_now() - t0;
  } while (dt < 1.0);
  double gf = 2.0 * n * M * K * iters / dt / 1e9;
  printf("gemm   q%d g%d %6lldx%-5lld n=%-4d %8.2f ms  %7.1f GFLOP/s\n", bits, gs, (long long)M, (long long)K, n,
         dt / iters * 1e3, gf);
  be->release_weight(be, &w);
  free(d);
  free(s);
  free(b);
  free(x);
  free(y);
}


/* One thread's compute rate: the same L2-sized weight again and again, timed in this thread's CPU
 * time (so other jobs on a shared machine don't count). n = 1: the decode matvec; n > 1: a batch. */
static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
/* seconds of this thread's CPU time a call of w times n random tokens, over half a second of calls */
static double hot_per_call(sm_backend *be, const sm_weight *w, int n) {
  const int64_t M = w->rows, K = w->cols;
  float *x = sm_aligned_alloc((size_t)n * K * 4), *y = sm_aligned_alloc((size_t)n * M * 4);
  for (int64_t i = 0; i < n * K; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
  be->matmul(be, SM_MM_OTHER, w, x, n, y);
  int iters = 0;
  double t0 = cpu_now(), dt;
  do {
    be->matmul(be, SM_MM_OTHER, w, x, n, y);
    iters++;
    dt = cpu_now() - t0;
  } while (dt < 0.5);
  free(x);
  free(y);
  return dt / iters;
}
static void bench_hot(sm_backend *be, int64_t M, int64_t K, int bits, int gs, int n) {
  size_t wbytes = (size_t)M * (size_t)K * (size_t)bits / 8, ng = (size_t)M * (size_t)(K / gs);
  uint8_t *d = sm_aligned_alloc(wbytes);
  uint16_t *s = sm_aligned_alloc(ng * 2), *b = sm_aligned_alloc(ng * 2);
  for (size_t i = 0; i < wbytes; i++) d[i] = (uint8_t)rand();
  for (size_t i = 0; i < ng; i++) {
    s[i] = sm_f32_to_f16(0.01f);
    b[i] = sm_f32_to_f16(-0.05f);
  }
  sm_weight w =
    {.rows = M, .cols = K, .bits = bits, .group_size = gs, .dtype = SM_DT_F16, .data = d, .scales = s, .biases = b};
  be->prepare_weight(be, &w);
  const double per = hot_per_call(be, &w, n);
  printf("hot    q%d g%d %6lldx%-5lld n=%-4d %9.1f us CPU  %7.2f G MAC/s  %6.2f GB/s of weights\n", bits, gs,
         (long long)M, (long long)K, n, per * 1e6, (double)n * M * K / per / 1e9, (wbytes + 4.0 * ng) / per / 1e9);
  be->release_weight(be, &w);
  free(d);
  free(s);
  free(b);
}
/* the same for an mxfp4 weight (gpt-oss's experts: E8M0 scales near 2^-8, a group of 32) */
static void bench_hot_mx(sm_backend *be, int64_t M, int64_t K, int n) {
  const size_t wbytes = (size_t)M * (size_t)K / 2, ng = (size_t)M * (size_t)(K / 32);
  uint8_t *d = sm_aligned_alloc(wbytes), *s = sm_aligned_alloc(ng);
  for (size_t i = 0; i < wbytes; i++) d[i] = (uint8_t)rand();
  for (size_t i = 0; i < ng; i++) s[i] = (uint8_t)(119 + i % 3);
  sm_weight w = {.rows = M,
                 .cols = K,
                 .bits = 4,
                 .group_size = 32,
                 .qmode = SM_QMODE_MXFP4,
                 .dtype = SM_DT_U8,
                 .data = d,
                 .scales = s};
  be->prepare_weight(be, &w);
  const double per = hot_per_call(be, &w, n);
  printf("hot    mxfp4  %6lldx%-5lld n=%-4d %9.1f us CPU  %7.2f G MAC/s  %6.2f GB/s of weights\n", (long long)M,
         (long long)K, n, per * 1e6, (double)n * M * K / per / 1e9, (wbytes + (double)ng) / per / 1e9);
  be->release_weight(be, &w);
  free(d);
  free(s);
}

/* GQA attention over a long context: decode (1 token) and a prefill chunk of nt tokens at the
 * end of a ctx-position sequence. Reports time and the K/V bytes one pass over the cache reads. */
static void bench_att(sm_backend *be, int nh, int nkv, int hd, int ctx, int nt) {
  const int BS = 16, nb = (ctx + BS - 1) / BS;
  size_t row = (size_t)nkv * (size_t)hd, slots = (size_t)nb * BS;
  float *K = sm_aligned_alloc(slots * row * 4), *V = sm_aligned_alloc(slots * row * 4);
  for (size_t i = 0; i < slots * row; i++) {
    K[i] = (float)rand() / RAND_MAX - 0.5f;
    V[i] = (float)rand() / RAND_MAX - 0.5f;
  }
  void *kk[1] = {K}, *vv[1] = {V};
  sm_kv_cache kv =
    {.n_layers = 1, .n_kv_heads = nkv, .head_dim = hd, .block_size = BS, .n_blocks = nb, .k = kk, .v = vv};
  int32_t *table = malloc((size_t)nb * 4), *tok = calloc((size_t)nt, 4), *pos = malloc((size_t)nt * 4),
          *seq = calloc((size_t)nt, 4);
  for (int i = 0; i < nb; i++) table[i] = nb - 1 - i; /* scattered blocks */
  for (int t = 0; t < nt; t++) pos[t] = ctx - nt + t;
  sm_batch b =
    {.n_tokens = nt, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 1, .max_blocks = nb, .block_table = table};
  be->set_batch(be, &b);
  float *q = sm_aligned_alloc((size_t)nt * nh * hd * 4), *o = sm_aligned_alloc((size_t)nt * nh * hd * 4);
  for (size_t i = 0; i < (size_t)nt * nh * hd; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
  be->attention(be, o, q, &kv, 0, nh, 1.f / 8.f, 0, 0.f);
  double best = 1e30, tot = 0;
  int iters = 0;
  double t0 = sm_now();
  do {
    double t1 = sm_now();
    be->attention(be, o, q, &kv, 0, nh, 1.f / 8.f, 0, 0.f);
    double dt = sm_now() - t1;
    if (dt < best) best = dt;
    tot += dt;
    iters++;
  } while (sm_now() - t0 < 1.0 && iters < 10000);
  double kvb = (double)ctx * (double)row * 8;
  double fl = 4.0 * nh * hd * ((double)nt * ctx - (double)nt * (nt - 1) / 2);
  printf("attn   %2dq/%dkv hd%-3d ctx %-5d n=%-4d %9.1f us best %9.1f us mean  %6.2f GB/s of K/V  %6.1f GFLOP/s\n", nh,
         nkv, hd, ctx, nt, best * 1e6, tot / iters * 1e6, kvb / best / 1e9, fl / best / 1e9);
  free(K);
  free(V);
  free(table);
  free(tok);
  free(pos);
  free(seq);
  free(q);
  free(o);
}

int main(int argc, char **argv) {
  int nth = argc > 1 ? atoi(argv[1]) : 0;
  sm_backend *be = sm_cpu_backend_create(nth);
  if (!be) {
    fprintf(stderr, "bench_kernels: %s\n", sm_errmsg());
    return 1;
  }
  printf("kernels: %s, threads: %d\n", sm_cpu_backend_isa(be), be->n_threads);
  const bool need_bw = !(argc > 2 &&
                         (!strcmp(argv[2], "gemm") || !strncmp(argv[2], "att", 3) || !strcmp(argv[2], "hot")));
  /* the backend's own probe: all its threads, a buffer well past the caches (bandwidth.c) */
  g_bw = need_bw ? be->measure_bandwidth(be) / 1e9 : 1;
  if (need_bw) printf("read bandwidth (the backend's probe): %.2f GB/s\n", g_bw);
  const char *sel = argc > 2 ? argv[2] : "all";
  const bool all = !strcmp(sel, "all");
  if (all || !strcmp(sel, "q4")) {
    bench_matvec(be, 512, 2048, 4, 64);
    bench_matvec(be, 2048, 2048, 4, 64);
    bench_matvec(be, 8192, 2048, 4, 64);
    bench_matvec(be, 2048, 8192, 4, 64);
    bench_matvec(be, 128256, 2048, 4, 64);
    bench_matvec(be, 4096, 4096, 4, 64);
    bench_matvec(be, 14336, 4096, 4, 64);
    bench_matvec(be, 4096, 14336, 4, 64);
  }
  if (all || !strcmp(sel, "lowbit")) {
    static const int bv[] = {4, 8, 2, 3, 5, 6};
    for (int i = 0; i < 6; i++) bench_matvec(be, 8192, 2048, bv[i], 64);
    bench_matvec(be, 8192, 2048, 3, 32);
    bench_matvec(be, 8192, 2048, 6, 128);
    bench_matvec(be, 2048, 8192, 6, 64);
    bench_matvec(be, 2048, 8192, 3, 64);
  }
  if (all || !strcmp(sel, "gemm")) {
    bench_gemm(be, 2048, 2048, 4, 64, 64);
    bench_gemm(be, 2048, 2048, 4, 64, 512);
    bench_gemm(be, 8192, 2048, 4, 64, 64);
    bench_gemm(be, 8192, 2048, 4, 64, 512);
    static const int bv[] = {2, 3, 5, 6, 8};
    bench_gemm(be, 8192, 2048, 4, 64, 64);
    for (int i = 0; i < 5; i++) bench_gemm(be, 8192, 2048, bv[i], 64, 64);
    for (int i = 0; i < 5; i++) bench_gemm(be, 8192, 2048, bv[i], 64, 8);
    bench_gemm(be, 8192, 2048, 4, 64, 8);
    bench_gemm(be, 8192, 2048, 6, 64, 512);
    bench_gemm(be, 8192, 2048, 3, 64, 512);
  }
  if (!strcmp(sel, "hot1")) { /* the 4-bit decode matvec alone (for a profiler) */
    for (int i = 0; i < 4; i++) bench_hot(be, 1024, 2048, 4, 64, 1);
  }
  if (!strcmp(sel, "hot")) { /* one thread's compute rate (run with 1 thread) */
    static const int bv[] = {4, 8, 2, 3, 5, 6};
    for (int i = 0; i < 6; i++) bench_hot(be, 256, 2048, bv[i], 64, 1);
    bench_hot(be, 256, 2048, 4, 32, 1);
    bench_hot(be, 256, 2048, 4, 128, 1);
    for (int i = 0; i < 6; i++) bench_hot(be, 256, 2048, bv[i], 64, 64);
    bench_hot(be, 256, 2048, 4, 64, 8);
    bench_hot(be, 256, 2048, 4, 64, 512);
    bench_hot_mx(be, 256, 2880, 1); /* gpt-oss's expert rows */
  }
  if (all || !strncmp(sel, "att", 3)) { /* "attd": decode only */
    bench_att(be, 32, 8, 64, 4096, 1);
    bench_att(be, 32, 8, 128, 4096, 1);
    bench_att(be, 32, 8, 128, 512, 1); /* K/V in cache */
    if (strcmp(sel, "attd")) {
      bench_att(be, 32, 8, 64, 4096, 64);
      bench_att(be, 32, 8, 128, 4096, 64);
    }
  }
  be->destroy(be);
  return 0;
}
