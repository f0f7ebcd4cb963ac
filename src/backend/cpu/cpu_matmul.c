/* CPU matmuls. Quantized weights that prepare_weight packed (cpu_internal.h, "packed weights")
 * run the int8 path for every batch size: activations quantized per group, then the decode
 * matvec (one token), the VNNI GEMM or the AMX GEMM (batches), all with the same canonical
 * arithmetic, so a token's output does not depend on its batch. Everything else (dense weights,
 * narrow or unpacked quantized weights, SMELT_CPU_EXACT=1) runs the float kernels: per-token
 * matvecs below GEMM_MIN_N tokens, else a GEMM over dequantized panels; in batch-invariant mode
 * (SMELT_CPU_BATCH_INVARIANT=1, sm_backend.batch_invariant) the GEMM for every batch size, whose
 * outputs are each one multiply-add chain in k order. MLX microscaling weights (mxfp4, mxfp8, nvfp4)
 * run cpu_mxq.c (the same rule). */
#include "backend/cpu/cpu_be.h"
#include <stdlib.h>
#include <string.h>

#define GEMM_KC 256
#define GEMM_MIN_N 4 /* n below this: one matvec per token */
#define RBG 4        /* row blocks per work item of the packed GEMM */

typedef struct {
  const sm_cpu_kern *k;
  sm_mv_arg a;
  float *y;
  bool i8;
} mv_ctx;
static void mv_range(void *vctx, size_t r0, size_t r1) {
  mv_ctx *m = vctx;
  if (m->i8) m->k->matvec_i8(&m->a, (int64_t)r0, (int64_t)r1, m->y + r0);
  else m->k->matvec(&m->a, (int64_t)r0, (int64_t)r1, m->y + r0);
}

typedef struct {
  cpu_be *c;
  const sm_weight *w;
  const float *x;
  int n;
  float *y;
  int64_t n_panels;
  _Atomic int64_t next;
} gemm_ctx;

static void gemm_job(void *vctx, int tid, int nth) {
  (void)nth;
  gemm_ctx *g = vctx;
  const sm_cpu_kern *k = g->c->k;
  const int panel = k->panel;
  const int64_t M = g->w->rows, K = g->w->cols;
  float *P = g->c->gscratch[tid], *tmp = P + (size_t)panel * GEMM_KC;
  for (;;) {
    int64_t p = atomic_fetch_add_explicit(&g->next, 1, memory_order_relaxed);
    if (p >= g->n_panels) break;
    int64_t r0 = p * panel;
    int nr = (int)(M - r0 < panel ? M - r0 : panel);
    for (int t = 0; t < g->n; t++) memset(g->y + (size_t)t * (size_t)M + r0, 0, (size_t)nr * sizeof(float));
    for (int64_t k0 = 0; k0 < K; k0 += GEMM_KC) {
      int kc = (int)(K - k0 < GEMM_KC ? K - k0 : GEMM_KC);
      k->pack_panel(g->w, r0, nr, k0, kc, P, tmp);
      k->gemm_panel(P, kc, g->x + k0, K, g->n, g->y + r0, M, nr);
    }
  }
}

/* float kernels (and the int8 matvec of unpacked weights) */
static void matmul_unpacked(sm_backend *be, const sm_weight *w, const float *x, int n, float *y) {
  cpu_be *c = CB(be);
  const int64_t M = w->rows, K = w->cols;
  const bool i8 = sm_cpu_backend_uses_i8(be, w, n);
  /* batch-invariant mode: the int8 matvec per token where it applies, else the GEMM for every n (it
   * computes each output as one multiply-add chain over k in order, whatever the batch and the token's
   * place in it; the float matvec's summation tree differs) */
  if (c->tune.invariant ? i8 : n < GEMM_MIN_N) {
    size_t ng = w->bits ? (size_t)(K / w->group_size) : 1;
    if ((size_t)K + 64 > c->cap_x || ng + 16 > c->cap_x) {
      free(c->xp);
      free(c->xsum);
      free(c->xs);
      free(c->xq);
      c->cap_x = (size_t)K + 64;
      c->xp = sm_aligned_alloc(c->cap_x * sizeof(float));
      c->xsum = sm_aligned_alloc(c->cap_x * sizeof(float));
      c->xs = sm_aligned_alloc(c->cap_x * sizeof(float));
      c->xq = sm_aligned_alloc(c->cap_x);
      if (!c->xp || !c->xsum || !c->xs || !c->xq) abort();
    }
    for (int t = 0; t < n; t++) {
      mv_ctx m = {.k = c->k,
                  .a = {.w = w, .xp = c->xp, .xsum = c->xsum, .xq = c->xq, .xs = c->xs, .gfni = c->gfni},
                  .y = y + (size_t)t * (size_t)M,
                  .i8 = i8};
      if (i8) c->k->prep_xq(w, x + (size_t)t * (size_t)K, c->xq, c->xs, c->xsum);
      else c->k->prep_x(w, x + (size_t)t * (size_t)K, c->xp, c->xsum);
      if (c->nth == 1 || M * K < PAR_MIN_ELEMS) {
        mv_range(&m, 0, (size_t)M);
        continue;
      }
      size_t chunk = (size_t)M / ((size_t)c->nth * 16);
      chunk = (chunk + 15) & ~(size_t)15;
      sm_cpu_pfor_chunk(c, (size_t)M, chunk < 16 ? 16 : chunk, mv_range, &m);
    }
    return;
  }
  gemm_ctx g = {.c = c, .w = w, .x = x, .n = n, .y = y};
  g.n_panels = (M + c->k->panel - 1) / c->k->panel;
  atomic_init(&g.next, 0);
  if (c->nth == 1) gemm_job(&g, 0, 1);
  else sm_pool_run(c->pool, gemm_job, &g);
}

/* ---------------- packed int8 path ---------------- */
static const sm_i8_kern i8_avx512 = {"avx512vnni",       sm_i8avx512_quant, sm_i8avx512_matvec,
                                     sm_i8avx512_unpack, sm_i8avx512_gemm,  sm_i8avx512_matvec_n};
static const sm_i8_kern i8_avxvnni = {"avxvnni",           sm_i8avxvnni_quant, sm_i8avxvnni_matvec,
                                      sm_i8avxvnni_unpack, sm_i8avxvnni_gemm,  sm_i8avxvnni_matvec_n};
static const sm_i8_kern i8_avx2 = {"avx2",           sm_i8avx2_quant, sm_i8avx2_matvec,
                                   sm_i8avx2_unpack, sm_i8avx2_gemm,  sm_i8avx2_matvec_n};
const sm_i8_kern *sm_i8_kernels_for(const sm_cpu_kern *k) {
  if (k == &sm_cpu_kern_avx512 && sm_i8avx512_ok()) return &i8_avx512;
  if (k == &sm_cpu_kern_avx512 || k == &sm_cpu_kern_avx2) {
    if (sm_i8avxvnni_ok()) return &i8_avxvnni;
    if (sm_i8avx2_ok()) return &i8_avx2;
  }
  return NULL;
}

static void *grow_aligned(void *p, size_t *cap, size_t need) {
  if (need <= *cap) return p;
  free(p);
  p = sm_aligned_alloc(need);
  if (!p) abort();
  *cap = need;
  return p;
}

typedef struct {
  const float *x;
  int64_t K;
  int gs;
  cpu_be *c;
} quant_ctx;
static void quant_range(void *v, size_t t0, size_t t1) {
  quant_ctx *q = v;
  q->c->ik->quant(q->x, q->K, q->gs, (int)t0, (int)t1, q->c->pxq, q->c->pxs, q->c->pxsum);
}

typedef struct {
  void (*mv)(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y); /* the int8 set's matvec or matvec_n */
  sm_i8_arg a;
  float *y;
  int64_t chunk;
  bool stat; /* static split: thread tid takes the row blocks it packed (NUMA placement) */
  _Atomic int64_t next __attribute__((aligned(64))); /* its own cache line */
} pmv_ctx;
static void pmv_job(void *v, int tid, int nth) {
  pmv_ctx *m = v;
  const int64_t nrb = m->a.p->nrb;
  if (m->stat) {
    m->mv(&m->a, nrb * tid / nth, nrb * (tid + 1) / nth, m->y);
    return;
  }
  for (;;) {
    int64_t rb0 = atomic_fetch_add_explicit(&m->next, m->chunk, memory_order_relaxed);
    if (rb0 >= nrb) break;
    m->mv(&m->a, rb0, rb0 + m->chunk < nrb ? rb0 + m->chunk : nrb, m->y);
  }
}

typedef struct {
  cpu_be *c;
  sm_i8_arg a;
  float *y;
  int64_t n_rbg;
  int tchunk, n_tc;
  bool amx;
  _Atomic int64_t next __attribute__((aligned(64)));
} pgemm_ctx;
static void pgemm_job(void *v, int tid, int nth) {
  (void)nth;
  pgemm_ctx *g = v;
  const sm_cpu_packed *p = g->a.p;
  const int64_t K = p->cols, ng = p->ng, M = p->rows;
  uint8_t *U = g->c->pu[tid];
  float *SC = g->c->psc[tid], *BI = SC + (size_t)RBG * (size_t)ng * 16;
  const int64_t items = g->n_rbg * g->n_tc;
  int64_t have = -1; /* the row-block group in U */
  for (;;) {
    const int64_t it = atomic_fetch_add_explicit(&g->next, 1, memory_order_relaxed);
    if (it >= items) break;
    /* items of one row-block group are consecutive: a thread that takes the next one keeps U */
    const int64_t rbg = it / g->n_tc;
    const int tc = (int)(it % g->n_tc);
    const int64_t rb0 = rbg * RBG;
    const int nrb = (int)(p->nrb - rb0 < RBG ? p->nrb - rb0 : RBG);
    const int t0 = tc * g->tchunk, t1 = t0 + g->tchunk < g->a.n ? t0 + g->tchunk : g->a.n;
    if (rbg != have)
      for (int j = 0; j < nrb; j++)
        g->c->ik->unpack(p, rb0 + j, U + (size_t)j * 16 * (size_t)K, SC + (size_t)j * (size_t)ng * 16,
                         BI + (size_t)j * (size_t)ng * 16);
    have = rbg;
    if (g->amx) {
      sm_amx_gemm(&g->a, U, SC, BI, rb0, nrb, t0, t1, g->y, M, g->c->amxw[tid]);
    } else {
      for (int j = 0; j < nrb; j++)
        g->c->ik->gemm(&g->a, U + (size_t)j * 16 * (size_t)K, SC + (size_t)j * (size_t)ng * 16,
                       BI + (size_t)j * (size_t)ng * 16, rb0 + j, t0, t1, g->y, M);
    }
  }
  if (g->amx) sm_amx_release();
}

static void matmul_packed(cpu_be *c, const sm_cpu_packed *p, const float *x, int n, float *y) {
  const int64_t K = p->cols, ng = p->ng;
  const int n16 = (n + 15) & ~15;
  c->pxq = grow_aligned(c->pxq, &c->cap_pxq, (size_t)n16 * (size_t)K);
  c->pxs = grow_aligned(c->pxs, &c->cap_pxs, sizeof(float) * 2 * (size_t)n * (size_t)ng);
  c->pxsum = c->pxs + (size_t)n * (size_t)ng;
  /* the GEMM reads whole tiles of 16 tokens; one token's matvec only its own row */
  if (n > 1 && n16 > n) memset(c->pxq + (size_t)n * (size_t)K, 0, (size_t)(n16 - n) * (size_t)K);
  quant_ctx q = {x, K, p->gs, c};
  sm_cpu_pfor(c, (size_t)n, (size_t)K * 4, quant_range, &q);
  sm_i8_arg a = {.p = p, .xq = c->pxq, .xs = c->pxs, .xsum = c->pxsum, .n = n, .pf = c->tune.pf};
  /* one token: the decode matvec; up to tuning mvn_max tokens (fewer than take AMX): the blocks streamed
   * once for every 4 of them (AVX2: 2 a decode of the codes; the same bits); more: the GEMM on unpacked
   * row blocks */
  if (n == 1 || (c->ik->matvec_n && n <= c->tune.mvn_max && !(c->amx && n >= c->tune.amx_min_n))) {
    pmv_ctx m = {.y = y, .stat = c->numa || c->tune.mv_chunks == 0};
    const int64_t per = p->nrb / ((int64_t)c->nth * (c->tune.mv_chunks ? c->tune.mv_chunks : 1));
    m.chunk = per > 0 ? per : 1;
    for (int t0 = 0; t0 < n; t0 += 4) {
      const int nt = n - t0 < 4 ? n - t0 : 4;
      m.a = a;
      m.a.n = nt;
      m.a.xq = a.xq + (size_t)t0 * (size_t)K;
      m.a.xs = a.xs + (size_t)t0 * (size_t)ng;
      m.a.xsum = a.xsum + (size_t)t0 * (size_t)ng;
      m.mv = nt == 1 ? c->ik->matvec : c->ik->matvec_n;
      m.y = y + (size_t)t0 * (size_t)p->rows;
      atomic_init(&m.next, 0);
      if (c->nth == 1 || p->rows * K * nt < PAR_MIN_ELEMS) pmv_job(&m, 0, 1);
      else sm_pool_run(c->pool, pmv_job, &m);
    }
    return;
  }
  /* per-thread unpacked row blocks */
  const size_t need_u = (size_t)RBG * 16 * (size_t)K, need_s = sizeof(float) * 2 * RBG * (size_t)ng * 16;
  if (need_u > c->cap_pu || need_s > c->cap_psc) {
    for (int i = 0; i < c->nth; i++) {
      free(c->pu[i]);
      free(c->psc[i]);
      c->pu[i] = sm_aligned_alloc(need_u);
      c->psc[i] = sm_aligned_alloc(need_s);
      if (!c->pu[i] || !c->psc[i]) abort();
    }
    c->cap_pu = need_u;
    c->cap_psc = need_s;
  }
  pgemm_ctx g = {.c = c, .a = a, .y = y, .amx = c->amx && n >= c->tune.amx_min_n};
  g.n_rbg = (p->nrb + RBG - 1) / RBG;
  /* token chunks (multiples of 16) small enough for every thread to get work */
  int tchunk = n16;
  while (tchunk > 16 && g.n_rbg * ((n + tchunk - 1) / tchunk) < 2 * (int64_t)c->nth) tchunk = ((tchunk / 2) + 15) & ~15;
  g.tchunk = tchunk;
  g.n_tc = (n + tchunk - 1) / tchunk;
  atomic_init(&g.next, 0);
  if (c->nth == 1) pgemm_job(&g, 0, 1);
  else sm_pool_run(c->pool, pgemm_job, &g);
}

void sm_cpu_matmul(sm_backend *be, sm_mm_role role, const sm_weight *w, const float *x, int n, float *y) {
  (void)role;
  cpu_be *c = CB(be);
  if (n <= 0 || !w) return;
  if (!sm_cpu_weight_ok(w)) { /* unsupported: defined output instead of a crash */
    if (w->rows > 0) memset(y, 0, (size_t)n * (size_t)w->rows * sizeof(float));
    return;
  }
  if (w->rows == 0) return;
  if (w->qmode != SM_QMODE_AFFINE) {
    sm_cpu_mxq_matmul(c->pool, c->k, w, x, n, y, c->tune.invariant, c->exact);
    return;
  }
  if (w->dev && !c->exact) matmul_packed(c, (const sm_cpu_packed *)w->dev, x, n, y);
  else matmul_unpacked(be, w, x, n, y);
}

/* nw matmuls of one x (a layer's q/k/v or gate/up). One token: one dispatch of the threads over all their
 * rows (sm_cpu_matvec_batch: x quantized once for the packed weights, each row computed by the kernel a
 * matmul of its own uses, so the same bits), instead of a dispatch, a wait for the slowest thread and a
 * gap on the caller for each. Batches of tokens, batch-invariant mode (whose float path runs even one
 * token through the GEMM), NUMA placement (each thread reads the row blocks it packed) and microscaling
 * weights run a matmul each. */
void sm_cpu_matmul_group(sm_backend *be, const sm_mm_role *roles, const sm_weight *const *ws, const float *x, int n,
                         float *const *ys, int nw) {
  cpu_be *c = CB(be);
  bool one = n == 1 && nw <= 8 && c->nth > 1 && !c->tune.invariant && !c->numa;
  for (int i = 0; one && i < nw; i++)
    one = ws[i] && sm_cpu_weight_ok(ws[i]) && ws[i]->rows > 0 && ws[i]->qmode == SM_QMODE_AFFINE;
  if (!one) {
    for (int i = 0; i < nw; i++) sm_cpu_matmul(be, roles[i], ws[i], x, n, ys[i]);
    return;
  }
  sm_weight w[8];
  const float *xs[8];
  for (int i = 0; i < nw; i++) {
    w[i] = *ws[i];
    xs[i] = x;
  }
  sm_cpu_matvec_batch(be, w, xs, ys, nw);
}

size_t sm_cpu_gemm_scratch_bytes(void) { return (size_t)2 * 32 * GEMM_KC * sizeof(float) + 64 * 16 * sizeof(float); }

void sm_cpu_matmul_free(cpu_be *c) {
  for (int i = 0; i < c->nth; i++) {
    if (c->pu) free(c->pu[i]);
    if (c->psc) free(c->psc[i]);
    if (c->amxw) free(c->amxw[i]);
  }
  free(c->pu);
  free(c->psc);
  free(c->amxw);
  free(c->pxq);
  free(c->pxs);
}

/* ---------------- many one-token matvecs in one dispatch (cpu_internal.h) ---------------- */
typedef struct {
  const sm_cpu_kern *k;
  const sm_i8_kern *ik;
  sm_mv_arg *a;   /* [nw] prepared arguments */
  sm_i8_arg *ia;  /* [nw] ... of packed weights */
  const bool *pk; /* [nw] packed (its units are row blocks of 16 rows; else 16 rows of the weight) */
  float *const *ys;
  const bool *i8;
  const int64_t *c0;     /* [nw + 1] first chunk of each matvec */
  int64_t per, n_chunks; /* units of 16 rows a chunk */
  _Atomic int64_t next;
} mvb_ctx;
static void mvb_job(void *vctx, int tid, int nth) {
  (void)tid;
  (void)nth;
  mvb_ctx *m = vctx;
  for (;;) {
    const int64_t ci = atomic_fetch_add_explicit(&m->next, 1, memory_order_relaxed);
    if (ci >= m->n_chunks) break;
    int i = 0;
    while (m->c0[i + 1] <= ci) i++;
    const int64_t u0 = (ci - m->c0[i]) * m->per;
    if (m->pk[i]) {
      const int64_t nrb = m->ia[i].p->nrb;
      m->ik->matvec(&m->ia[i], u0, u0 + m->per < nrb ? u0 + m->per : nrb, m->ys[i]);
      continue;
    }
    const int64_t r0 = u0 * 16, rows = m->a[i].w->rows;
    const int64_t r1 = r0 + 16 * m->per < rows ? r0 + 16 * m->per : rows;
    if (m->i8[i]) m->k->matvec_i8(&m->a[i], r0, r1, m->ys[i] + r0);
    else m->k->matvec(&m->a[i], r0, r1, m->ys[i] + r0);
  }
}

/* The weights are row views: of the original (sm_weight_rows), run by the unpacked-weight kernels, or of
 * a packed copy (w->dev: an expert's row blocks, cpu_moe.c), run by the packed int8 matvec with x quantized
 * once for consecutive weights of the same x; other weights (microscaling, unsupported) run on their own
 * through sm_cpu_matmul. */
void sm_cpu_matvec_batch(sm_backend *be, const sm_weight *ws, const float *const *xs, float *const *ys, int nw) {
  cpu_be *c = CB(be);
  if (nw <= 0) return;
  sm_mv_arg *a = sm_xcalloc((size_t)nw, sizeof *a);
  sm_i8_arg *ia = sm_xcalloc((size_t)nw, sizeof *ia);
  bool *i8 = sm_xcalloc((size_t)nw, sizeof *i8), *pk = sm_xcalloc((size_t)nw, sizeof *pk);
  int64_t *c0 = sm_xcalloc((size_t)nw + 1, sizeof *c0);
  void **bufs = sm_xcalloc((size_t)nw, sizeof *bufs);
  int64_t total = 0; /* units of 16 rows */
  int last_pk = -1;  /* the last packed weight, whose quantized x the next may share */
  for (int i = 0; i < nw; i++) {
    const sm_weight *w = &ws[i];
    c0[i] = total;
    if (w->dev && !c->exact && c->ik && w->qmode == SM_QMODE_AFFINE) {
      const sm_cpu_packed *p = w->dev;
      const int64_t K = p->cols, ng = p->ng;
      const sm_i8_arg *prev = last_pk >= 0 ? &ia[last_pk] : NULL;
      if (prev && xs[last_pk] == xs[i] && prev->p->cols == K && prev->p->gs == p->gs) {
        ia[i] = *prev;
      } else {
        char *b = sm_aligned_alloc((size_t)K + 64 + sizeof(float) * 2 * (size_t)ng);
        if (!b) abort();
        bufs[i] = b;
        ia[i] = (sm_i8_arg){.xq = (int8_t *)b, .xs = (float *)(b + K + 64), .xsum = (float *)(b + K + 64) + ng, .n = 1};
        c->ik->quant(xs[i], K, p->gs, 0, 1, (int8_t *)ia[i].xq, (float *)ia[i].xs, (float *)ia[i].xsum);
      }
      ia[i].p = p;
      ia[i].pf = c->tune.pf;
      pk[i] = true;
      last_pk = i;
      total += p->nrb;
      continue;
    }
    if (!sm_cpu_weight_ok(w) || w->qmode != SM_QMODE_AFFINE || (w->dev && !c->exact)) {
      sm_cpu_matmul(be, SM_MM_OTHER, w, xs[i], 1, ys[i]);
      continue;
    }
    const int64_t K = w->cols;
    /* the prepared x: floats (permuted), group sums, int8 codes and scales */
    char *b = sm_aligned_alloc(sizeof(float) * (size_t)(K + 64) * 3 + (size_t)K + 64);
    if (!b) abort();
    bufs[i] = b;
    a[i] = (sm_mv_arg){.w = w,
                       .xp = (float *)b,
                       .xsum = (float *)b + K + 64,
                       .xs = (float *)b + 2 * (K + 64),
                       .xq = (int8_t *)((float *)b + 3 * (K + 64)),
                       .gfni = c->gfni};
    i8[i] = sm_cpu_backend_uses_i8(be, w, 1);
    if (i8[i]) c->k->prep_xq(w, xs[i], (int8_t *)a[i].xq, (float *)a[i].xs, (float *)a[i].xsum);
    else c->k->prep_x(w, xs[i], (float *)a[i].xp, (float *)a[i].xsum);
    total += (w->rows + 15) / 16;
  }
  c0[nw] = total;
  /* chunks of `per` units, about mv_chunks a thread as the one-matvec path takes them: one 16-row unit a
   * chunk had the threads meet on the shared counter every ~10 KB of weights */
  int64_t per = total / ((int64_t)c->nth * (c->tune.mv_chunks > 0 ? c->tune.mv_chunks : 1));
  if (per < 1) per = 1;
  int64_t n_chunks = 0;
  for (int i = 0; i < nw; i++) {
    const int64_t u = c0[i + 1] - c0[i];
    c0[i] = n_chunks;
    n_chunks += (u + per - 1) / per;
  }
  c0[nw] = n_chunks;
  mvb_ctx m = {
    .k = c->k, .ik = c->ik, .a = a, .ia = ia, .pk = pk, .ys = ys, .i8 = i8, .c0 = c0, .per = per, .n_chunks = n_chunks};
  atomic_init(&m.next, 0);
  if (n_chunks > 0) {
    if (c->nth == 1) mvb_job(&m, 0, 1);
    else sm_pool_run(c->pool, mvb_job, &m);
  }
  for (int i = 0; i < nw; i++) free(bufs[i]);
  free(bufs);
  free(c0);
  free(i8);
  free(pk);
  free(ia);
  free(a);
}
