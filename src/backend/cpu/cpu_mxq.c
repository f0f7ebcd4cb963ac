/* CPU matmul of weights in MLX's microscaling modes (mxfp4, mxfp8, nvfp4; format/mxq.h): one-token
 * matvecs straight from the codes (a group's dot product with the element values, times the group's
 * scale, as MLX's fp_qmm_t; 4-bit codes through the ISA's mv_fp4 where it has one), and larger batches
 * through the ISA's GEMM panels, which these weights fill with their dequantized values (exact in float).
 * Rows are split over the backend's thread pool. The chosen experts of a 4-bit stack run the ISA's mv_fp4
 * for every batch size, an expert's rows read once for all its tokens (sm_cpu_mxq_experts): with a few
 * tokens an expert, dequantizing every chosen expert's panels cost more than the products. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_internal.h"

#define MXQ_KC SM_CPU_FP4_PACK_KC /* columns of a GEMM panel */

/* values of both nibbles of a byte of FP4 codes (low nibble first) */
static float g_fp4_pair[256][2];
/* values of the FP8 E4M3 codes and of the scale codes (E8M0 and E4M3) */
static float g_e4m3[256], g_e8m0[256];
static atomic_int g_init;

static void init_tables(void) {
  if (atomic_load_explicit(&g_init, memory_order_acquire)) return;
  for (int b = 0; b < 256; b++) {
    g_fp4_pair[b][0] = sm_fp4_e2m1_lut[b & 15];
    g_fp4_pair[b][1] = sm_fp4_e2m1_lut[b >> 4];
    g_e4m3[b] = sm_fp8_e4m3_to_f32((uint8_t)b);
    g_e8m0[b] = sm_e8m0_to_f32((uint8_t)b);
  }
  atomic_store_explicit(&g_init, 1, memory_order_release);
}

static inline const float *scale_table(int qmode) { return qmode == SM_QMODE_NVFP4 ? g_e4m3 : g_e8m0; }

/* y[r - r0] = row r of w . x, r in [r0, r1) */
static void mv_rows(const sm_weight *w, const float *x, int64_t r0, int64_t r1, float *y) {
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K * (size_t)w->bits / 8;
  const float *st = scale_table(w->qmode);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    const uint8_t *sc = (const uint8_t *)w->scales + (size_t)r * (size_t)ng;
    float tot = 0.f;
    for (int64_t g = 0; g < ng; g++) {
      const float *xg = x + g * gs;
      float acc = 0.f;
      if (w->bits == 4) {
        const uint8_t *q = row + g * gs / 2;
        for (int64_t j = 0; j < gs / 2; j++)
          acc += g_fp4_pair[q[j]][0] * xg[2 * j] + g_fp4_pair[q[j]][1] * xg[2 * j + 1];
      } else {
        const uint8_t *q = row + g * gs;
        for (int64_t j = 0; j < gs; j++) acc += g_e4m3[q[j]] * xg[j];
      }
      tot += st[sc[g]] * acc;
    }
    y[r - r0] = tot;
  }
}

/* rows [r0, r0+nr) x columns [k0, k0+kc) dequantized into dst[k][panel] (rows >= nr zero) */
static void pack(const sm_weight *w, int64_t r0, int nr, int64_t k0, int kc, int panel, float *dst) {
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K * (size_t)w->bits / 8;
  const float *st = scale_table(w->qmode);
  for (int rr = 0; rr < panel; rr++) {
    if (rr >= nr) {
      for (int k = 0; k < kc; k++) dst[(size_t)k * panel + rr] = 0.f;
      continue;
    }
    const int64_t r = r0 + rr;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    const uint8_t *sc = (const uint8_t *)w->scales + (size_t)r * (size_t)ng;
    for (int k = 0; k < kc; k++) {
      const int64_t j = k0 + k;
      const float e = w->bits == 4 ? g_fp4_pair[row[j >> 1]][j & 1] : g_e4m3[row[j]];
      dst[(size_t)k * panel + rr] = st[sc[j / gs]] * e;
    }
  }
}

typedef struct {
  const sm_cpu_kern *k;
  const sm_weight *w;
  const float *x;
  int n;
  float *y;
  int64_t n_items, chunk;
  bool f32x;
  _Atomic int64_t next;
} mxq_job;

static void mv_job(void *v, int tid, int nth) {
  (void)tid;
  (void)nth;
  mxq_job *j = v;
  const int64_t M = j->w->rows;
  for (;;) {
    int64_t i0 = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
    if (i0 >= j->n_items) break;
    /* item = (token, row chunk) */
    const int64_t per = (M + j->chunk - 1) / j->chunk * j->chunk;
    const int64_t t = i0 / per, r0 = i0 % per;
    if (r0 >= M) continue;
    const int64_t r1 = r0 + j->chunk < M ? r0 + j->chunk : M;
    const float *x = j->x + (size_t)t * (size_t)j->w->cols;
    float *y = j->y + (size_t)t * (size_t)M;
    if (j->k->mv_fp4 && j->k->fp4_ok(j->w, j->f32x))
      j->k->mv_fp4(j->w, &x, &y, 1, r0, r1, scale_table(j->w->qmode), j->f32x);
    else mv_rows(j->w, x, r0, r1, y + r0);
  }
}

static void gemm_job(void *v, int tid, int nth) {
  (void)tid;
  (void)nth;
  mxq_job *j = v;
  const int panel = j->k->panel;
  const int64_t M = j->w->rows, K = j->w->cols;
  float *P = sm_aligned_alloc(sizeof(float) * (size_t)panel * MXQ_KC);
  if (!P) abort();
  for (;;) {
    int64_t p = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (p >= j->n_items) break;
    const int64_t r0 = p * panel;
    const int nr = (int)(M - r0 < panel ? M - r0 : panel);
    for (int t = 0; t < j->n; t++) memset(j->y + (size_t)t * (size_t)M + r0, 0, (size_t)nr * sizeof(float));
    const bool fp4 = j->k->pack_fp4 && j->w->bits == 4 && j->w->group_size % 16 == 0 && K % 16 == 0;
    for (int64_t k0 = 0; k0 < K; k0 += MXQ_KC) {
      const int kc = (int)(K - k0 < MXQ_KC ? K - k0 : MXQ_KC);
      if (fp4) j->k->pack_fp4(j->w, r0, nr, k0, kc, panel, P, scale_table(j->w->qmode));
      else pack(j->w, r0, nr, k0, kc, panel, P);
      j->k->gemm_panel(P, kc, j->x + k0, K, j->n, j->y + r0, M, nr);
    }
  }
  free(P);
}

void sm_cpu_mxq_matmul(sm_pool *pool, const sm_cpu_kern *k, const sm_weight *w, const float *x, int n, float *y,
                       bool gemm, bool f32x) {
  init_tables();
  const int64_t M = w->rows;
  mxq_job j = {.k = k, .w = w, .x = x, .n = n, .y = y, .f32x = f32x};
  atomic_init(&j.next, 0);
  const int nth = sm_pool_size(pool);
  if (n < 4 && !gemm) {
    int64_t chunk = M / ((int64_t)nth * 8);
    j.chunk = chunk < 8 ? 8 : chunk;
    j.n_items = (M + j.chunk - 1) / j.chunk * j.chunk * n;
    if (nth == 1 || M * w->cols * n < (1 << 15)) mv_job(&j, 0, 1);
    else sm_pool_run(pool, mv_job, &j);
    return;
  }
  j.n_items = (M + k->panel - 1) / k->panel;
  if (nth == 1) gemm_job(&j, 0, 1);
  else sm_pool_run(pool, gemm_job, &j);
}

/* ---------------- the chosen experts' rows of a 4-bit microscaling stack (cpu_moe.c) ---------------- */
typedef struct {
  const sm_cpu_kern *k;
  const sm_weight *w;
  int64_t rows, chunk, per_e; /* rows of an expert; rows a work item; items an expert */
  const int *cnt;             /* [E + 1] first slot of each expert in order */
  const float **xs;           /* [slots] in expert order */
  float **ys;
  const float *st;
  int64_t n_items;
  bool f32x;
  _Atomic int64_t next;
} xmv_job;
static void xmv_run(void *v, int tid, int nth) {
  (void)tid;
  (void)nth;
  xmv_job *j = v;
  for (;;) {
    const int64_t it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (it >= j->n_items) break;
    const int e = (int)(it / j->per_e);
    const int m = j->cnt[e + 1] - j->cnt[e];
    if (!m) continue;
    const int64_t r0 = it % j->per_e * j->chunk, r1 = r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows;
    const sm_weight ve = sm_weight_rows(j->w, (int64_t)e * j->rows, j->rows);
    j->k->mv_fp4(&ve, j->xs + j->cnt[e], j->ys + j->cnt[e], m, r0, r1, j->st, j->f32x);
  }
}

bool sm_cpu_mxq_experts_ok(const sm_cpu_kern *k, const sm_weight *w, bool f32x) {
  return k->mv_fp4 && w->qmode != SM_QMODE_AFFINE && w->cols % w->group_size == 0 && k->fp4_ok(w, f32x);
}

void sm_cpu_mxq_experts(sm_pool *pool, const sm_cpu_kern *k, const sm_weight *w, int64_t rows, int E, const int *cnt,
                        const float **xs, float **ys, bool f32x) {
  init_tables();
  const int nth = sm_pool_size(pool);
  xmv_job j = {.k = k, .w = w, .rows = rows, .cnt = cnt, .xs = xs, .ys = ys, .st = scale_table(w->qmode), .f32x = f32x};
  int used = 0;
  for (int e = 0; e < E; e++) used += cnt[e + 1] > cnt[e];
  /* about 8 items a thread over the chosen experts, in multiples of 16 rows */
  int64_t chunk = used ? rows * used / ((int64_t)nth * 8) : rows;
  chunk = (chunk + 15) / 16 * 16;
  j.chunk = chunk < 16 ? 16 : chunk > rows ? rows : chunk;
  j.per_e = (rows + j.chunk - 1) / j.chunk;
  j.n_items = j.per_e * E;
  atomic_init(&j.next, 0);
  if (nth == 1) xmv_run(&j, 0, 1);
  else sm_pool_run(pool, xmv_run, &j);
}
