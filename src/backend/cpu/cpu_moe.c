/* The CPU backend's mixture-of-experts ops (backend.h): routing (the reference, moe_route.c, per token),
 * the routed experts' matmul, the weighted combine, gpt-oss's clamped SwiGLU and the sigmoid gate of a
 * shared expert.
 *
 * matmul_experts reads only the chosen experts' rows of the stacked weight (of its packed copy where
 * prepare_weight made one: an expert's row blocks): a decode step runs the k
 * chosen experts' matvecs in one dispatch of the backend's threads (sm_cpu_matvec_batch), and a batch
 * groups the (token, slot) pairs by expert and runs the backend's own matmul once per chosen expert (a
 * GEMM of its tokens instead of one matvec per token). Which kernel a token's row gets depends only on the
 * batch size, as for dense matmuls (matvec below GEMM_MIN tokens, GEMM from there on, an expert's few rows
 * padded up to it): a token's result does not depend on which other tokens chose its experts. 4-bit
 * microscaling stacks (mxfp4, nvfp4) on an ISA with mv_fp4 run it for every batch size, each chosen expert's
 * rows once for all its tokens (cpu_mxq.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_internal.h"

#define GEMM_MIN 4 /* the backend's matmul runs a GEMM from this many rows on (cpu_matmul.c GEMM_MIN_N) */

/* rows [r0, r0 + n) of the expert stack w: a view of the original, and of the packed copy (pv) where w has
 * one (prepare_weight) and the rows are whole row blocks of 16 */
static sm_weight expert_rows(const sm_weight *w, int64_t r0, int64_t n, sm_cpu_packed *pv) {
  sm_weight v = sm_weight_rows(w, r0, n);
  const sm_cpu_packed *p = w->dev;
  if (p && v.rows == n && r0 % 16 == 0 && n % 16 == 0) {
    *pv = *p;
    pv->rows = n;
    pv->nrb = n / 16;
    pv->data = p->data + (size_t)(r0 / 16) * p->rbbytes;
    v.dev = pv;
  }
  return v;
}

static void be_moe_route(sm_backend *be, const float *logits, int n, const sm_moe_route *r, int32_t *ids, float *wts) {
  (void)be;
  if (n <= 0 || !r || r->n_experts <= 0 || r->top_k <= 0 || r->top_k > 64 || r->top_k > r->n_experts) return;
  float *scratch = sm_xmalloc(sizeof(float) * 2 * (size_t)r->n_experts);
  for (int t = 0; t < n; t++)
    sm_moe_route_row(r, logits + (size_t)t * (size_t)r->n_experts, r->correction, r->expert_scale,
                     ids + (size_t)t * (size_t)r->top_k, wts + (size_t)t * (size_t)r->top_k, scratch);
  free(scratch);
}

static void be_matmul_experts(sm_backend *be, sm_mm_role role, const sm_weight *w, int64_t rows, const float *bias,
                              const float *x, bool x_per_slot, int n, int k, const int32_t *ids, float *y) {
  if (n <= 0 || k <= 0 || !w || rows <= 0) return;
  const int ns = n * k;
  const int64_t K = w->cols;
  if (w->rows % rows) {
    memset(y, 0, sizeof(float) * (size_t)ns * (size_t)rows);
    return;
  }
  const int E = (int)(w->rows / rows);
  /* slots by expert (counting sort; an id out of range gets zeros) */
  int *cnt = sm_xcalloc((size_t)E + 1, sizeof(int)), *order = sm_xmalloc(sizeof(int) * (size_t)ns);
  for (int s = 0; s < ns; s++) {
    if (ids[s] >= 0 && ids[s] < E) cnt[ids[s] + 1]++;
    else memset(y + (size_t)s * (size_t)rows, 0, sizeof(float) * (size_t)rows);
  }
  for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
  int *pos = sm_xmalloc(sizeof(int) * (size_t)E);
  memcpy(pos, cnt, sizeof(int) * (size_t)E);
  for (int s = 0; s < ns; s++)
    if (ids[s] >= 0 && ids[s] < E) order[pos[ids[s]]++] = s;
  float *xg = NULL, *yg = NULL;
  const sm_cpu_kern *kern = sm_cpu_backend_kern(be);
  const bool fp4 = sm_cpu_mxq_experts_ok(kern, w, sm_cpu_backend_exact(be));
  if (fp4) { /* mxfp4 / nvfp4: each chosen expert's rows once for all its tokens */
    const float **xs = sm_xmalloc(sizeof(float *) * (size_t)ns);
    float **ys = sm_xmalloc(sizeof(float *) * (size_t)ns);
    for (int i = 0; i < cnt[E]; i++) {
      xs[i] = x + (size_t)(x_per_slot ? order[i] : order[i] / k) * (size_t)K;
      ys[i] = y + (size_t)order[i] * (size_t)rows;
    }
    sm_cpu_mxq_experts(sm_cpu_backend_pool(be), kern, w, rows, E, cnt, xs, ys, sm_cpu_backend_exact(be));
    free(xs);
    free(ys);
  } else if (n < GEMM_MIN) { /* decode: every slot's matvec in one dispatch of the backend's threads */
    sm_weight *ws = sm_xmalloc(sizeof(sm_weight) * (size_t)ns);
    sm_cpu_packed *pv = sm_xmalloc(sizeof(sm_cpu_packed) * (size_t)ns);
    const float **xs = sm_xmalloc(sizeof(float *) * (size_t)ns);
    float **ys = sm_xmalloc(sizeof(float *) * (size_t)ns);
    int nv = 0;
    for (int s = 0; s < ns; s++) {
      if (ids[s] < 0 || ids[s] >= E) continue;
      ws[nv] = expert_rows(w, (int64_t)ids[s] * rows, rows, &pv[nv]);
      xs[nv] = x + (size_t)(x_per_slot ? s : s / k) * (size_t)K;
      ys[nv++] = y + (size_t)s * (size_t)rows;
    }
    sm_cpu_matvec_batch(be, ws, xs, ys, nv);
    free(pv);
    free(ws);
    free(xs);
    free(ys);
  }
  for (int e = 0; n >= GEMM_MIN && !fp4 && e < E; e++) {
    const int m = cnt[e + 1] - cnt[e];
    if (!m) continue;
    const int *sl = order + cnt[e];
    sm_cpu_packed pve;
    const sm_weight v = expert_rows(w, (int64_t)e * rows, rows, &pve);
    const int mp = m < GEMM_MIN ? GEMM_MIN : m; /* rows the matmul gets (padding: zeros) */
    if (!xg) {
      const size_t cap = (size_t)(ns > GEMM_MIN ? ns : GEMM_MIN);
      xg = sm_xcalloc(cap * (size_t)K, sizeof(float));
      yg = sm_xmalloc(sizeof(float) * cap * (size_t)rows);
    }
    for (int i = 0; i < m; i++)
      memcpy(xg + (size_t)i * (size_t)K, x + (size_t)(x_per_slot ? sl[i] : sl[i] / k) * (size_t)K,
             sizeof(float) * (size_t)K);
    if (mp > m) memset(xg + (size_t)m * (size_t)K, 0, sizeof(float) * (size_t)(mp - m) * (size_t)K);
    be->matmul(be, role, &v, xg, mp, yg);
    for (int i = 0; i < m; i++)
      memcpy(y + (size_t)sl[i] * (size_t)rows, yg + (size_t)i * (size_t)rows, sizeof(float) * (size_t)rows);
  }
  if (bias)
    for (int s = 0; s < ns; s++) {
      if (ids[s] < 0 || ids[s] >= E) continue;
      const float *b = bias + (size_t)ids[s] * (size_t)rows;
      float *ys = y + (size_t)s * (size_t)rows;
      for (int64_t r = 0; r < rows; r++) ys[r] += b[r];
    }
  free(xg);
  free(yg);
  free(pos);
  free(order);
  free(cnt);
}

static void be_moe_combine(sm_backend *be, float *out, const float *y, const float *wts, int n, int k, int dim) {
  (void)be;
  for (int t = 0; t < n; t++) {
    float *o = out + (size_t)t * (size_t)dim;
    for (int d = 0; d < dim; d++) o[d] = 0.f;
    for (int j = 0; j < k; j++) {
      const float wj = wts[(size_t)t * (size_t)k + (size_t)j];
      const float *yj = y + ((size_t)t * (size_t)k + (size_t)j) * (size_t)dim;
      for (int d = 0; d < dim; d++) o[d] += wj * yj[d];
    }
  }
}

static void be_swiglu_clamp(sm_backend *be, float *out, const float *gate, const float *up, size_t n, float alpha,
                            float limit) {
  (void)be;
  for (size_t i = 0; i < n; i++) {
    const float g = fminf(gate[i], limit), u = fminf(fmaxf(up[i], -limit), limit);
    out[i] = g / (1.f + expf(-alpha * g)) * (u + 1.f);
  }
}

static void be_sigmoid_gate_rows(sm_backend *be, float *y, const float *g, int n, int dim) {
  (void)be;
  for (int t = 0; t < n; t++) {
    const float s = 1.f / (1.f + expf(-g[t]));
    for (int d = 0; d < dim; d++) y[(size_t)t * (size_t)dim + (size_t)d] *= s;
  }
}

void sm_cpu_moe_install(sm_backend *b) {
  b->moe_route = be_moe_route;
  b->matmul_experts = be_matmul_experts;
  b->moe_combine = be_moe_combine;
  b->swiglu_clamp = be_swiglu_clamp;
  b->sigmoid_gate_rows = be_sigmoid_gate_rows;
}
