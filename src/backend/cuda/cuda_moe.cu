/* The CUDA backend's mixture-of-experts ops (backend.h) and gpt-oss's attention with sinks: their
 * recording (typed ops of cuda_be.cuh, run unfused by cu_moe_exec) and their kernels.
 *
 * - moe_route: one warp a token: softmax / sigmoid scores in shared memory, group-limited choice, then
 *   k rounds of a warp arg-max (ties to the lower expert index, as the reference sm_moe_route_row).
 * - matmul_experts: decode and small batches (everything a CUDA graph records) run one row kernel over
 *   the (token, slot) pairs, each warp a row of its slot's expert, so only the chosen experts are read
 *   and the expert ids never leave the device (cuda_moe_mv.cu, with the fused gate/up and down kernels
 *   the executor runs in their place). Larger batches, which run eagerly, download the ids, sort
 *   the slots by expert and multiply the gathered rows: 4-bit and mxfp4 experts all in one launch
 *   (cu_qmma_experts), others one cuBLAS GEMM per chosen expert (cu_gemm: the expert's rows dequantized
 *   to f16 a tile at a time); then scatter the rows back.
 * - moe_combine, swiglu_clamp, sigmoid_gate_rows: elementwise kernels.
 * - attention_sinks: one block a (token, head) whose warps take chunks of 32 positions (a lane scores a
 *   position), online softmaxes combined at the end with the head's sink in the denominator. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_qmma.cuh"
#include "backend/kv_quant.h"
#include "backend/cuda/cuda_ldst.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_route.cuh"
#include "backend/cuda/cuda_weights.cuh"


/* ================= kernels ================= */

/* one warp a token (cu_route_token); shared: 2 E floats */
__global__ void k_route(const cu_route r) {
  extern __shared__ float sm[];
  __shared__ int sel[CU_ROUTE_MAX_K];
  cu_route_token(r, blockIdx.x, sm, sel, true);
}

__global__ void k_combine(float *out, const float *y, const float *w, int n, int k, int dim) {
  const int64_t total = (int64_t)n * dim;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / dim, d = i % dim;
    float acc = 0.f;
    for (int j = 0; j < k; j++) acc += w[t * k + j] * y[(t * k + j) * dim + d];
    out[i] = acc;
  }
}

__global__ void k_swiglu_clamp(float *out, const float *g, const float *u, size_t n, float alpha, float limit) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    out[i] = cu_swiglu_clamp(g[i], u[i], alpha, limit);
  }
}

__global__ void k_sigmoid_gate(float *y, const float *g, int n, int dim) {
  const int64_t total = (int64_t)n * dim;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    y[i] *= 1.f / (1.f + expf(-g[i / dim]));
}

/* gather rows (slot order perm) / scatter them back with the expert's bias */
__global__ void k_gather_rows(float *xg, const float *x, const int32_t *perm, int ns, int64_t cols, int per_slot, int k) {
  const int64_t total = (int64_t)ns * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols, j = i % cols, s = perm[r];
    xg[i] = x[(per_slot ? s : s / k) * cols + j];
  }
}
__global__ void k_scatter_rows(float *y, const float *yg, const int32_t *perm, const int32_t *ids, const float *bias,
                               int ns, int64_t rows) {
  const int64_t total = (int64_t)ns * rows;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / rows, c = i % rows, s = perm[r];
    y[s * rows + c] = yg[i] + (bias ? bias[(int64_t)ids[s] * rows + c] : 0.f);
  }
}

/* one block a (token, head), its warps taking chunks of 32 positions in turn: each lane scores one
 * position of the chunk (its whole K row against q, kept scaled in shared memory), the warp keeps an
 * online softmax and adds the chunk's V rows (a lane a few dims); the warps' partial sums are then
 * combined and normalized with the sink in the denominator. shared: (hd + NW * (hd + 2)) floats */
template <typename KT>
__global__ void __launch_bounds__(256)
  k_attn_sinks(float *out, const float *q, const KT *K, const KT *V, const float *sinks, const int32_t *pos,
               const int32_t *seq, const int32_t *table, int max_blocks, int bs, int nblocks, int nh, int nkv, int hd,
               float scale, int window, float softcap) {
  extern __shared__ float sm[];
  const int t = blockIdx.x / nh, h = blockIdx.x % nh, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int NW = blockDim.x >> 5, kvh = h / (nh / nkv);
  const int p1 = pos[t], sq = seq[t], p0 = window > 0 && p1 - window + 1 > 0 ? p1 - window + 1 : 0;
  float *qs = sm, *wacc = sm + hd, *wm = wacc + NW * hd, *wl = wm + NW;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[((int64_t)t * nh + h) * hd + i] * scale;
  __syncthreads();
  float m = -INFINITY, l = 0.f, acc[8];
#pragma unroll
  for (int i = 0; i < 8; i++) acc[i] = 0.f;
  for (int c0 = p0 + warp * 32; c0 <= p1; c0 += NW * 32) {
    const int p = c0 + lane;
    float sc = -INFINITY;
    long long base = -1;
    if (p <= p1) {
      const int32_t blk = table[(int64_t)sq * max_blocks + p / bs];
      if (blk >= 0 && blk < nblocks) {
        base = (int64_t)blk * bs + p % bs; /* the slot */
        const KT *kr = kv_head(K, base, nkv, kvh, hd);
        float d = 0.f;
        for (int i = 0; i < hd; i++) d += qs[i] * kv_hget(kr, hd, i);
        sc = softcap > 0.f ? softcap * tanhf(d / softcap) : d;
      }
    }
    float cm = sc;
#pragma unroll
    for (int o = 16; o; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
    if (cm == -INFINITY) continue; /* no allowed position in the chunk (the same for the whole warp) */
    const float mn = fmaxf(m, cm), f = expf(m - mn);
    const float e = base >= 0 ? expf(sc - mn) : 0.f;
    float es = e;
#pragma unroll
    for (int o = 16; o; o >>= 1) es += __shfl_xor_sync(0xffffffffu, es, o);
    l = l * f + es;
    m = mn;
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] *= f;
    for (int j = 0; j < 32; j++) {
      const float ej = __shfl_sync(0xffffffffu, e, j);
      const long long bj = __shfl_sync(0xffffffffu, base, j);
      if (bj < 0) continue;
      const KT *vr = kv_head(V, bj, nkv, kvh, hd);
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const int d = lane + 32 * i;
        if (d < hd) acc[i] += ej * kv_hget(vr, hd, d);
      }
    }
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int d = lane + 32 * i;
    if (d < hd) wacc[warp * hd + d] = acc[i];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < NW; w++) M = fmaxf(M, wm[w]);
  float L = 0.f;
  for (int w = 0; w < NW; w++)
    if (wm[w] > -INFINITY) L += wl[w] * expf(wm[w] - M);
  float inv = 0.f;
  if (L > 0.f) {
    const float sk = sinks[h];
    if (sk > M) {
      const float f = expf(M - sk);
      inv = f / (L * f + 1.f);
    } else {
      inv = 1.f / (L + expf(sk - M));
    }
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float A = 0.f;
    for (int w = 0; w < NW; w++)
      if (wm[w] > -INFINITY) A += wacc[w * hd + d] * expf(wm[w] - M);
    out[((int64_t)t * nh + h) * hd + d] = A * inv;
  }
}

/* ================= launchers ================= */

/* rows [r0, r0 + nr) of w as a weight of its own (a row range of every layout is contiguous) */
static cu_weight row_view(const cu_weight *w, int64_t r0, int64_t nr) {
  cu_weight v = *w;
  v.rows = nr;
  if (w->kind == CW_DENSE) {
    v.q = (char *)w->q + r0 * w->cols * (int64_t)sm_dtype_size(w->dtype);
    return v;
  }
  v.q = (char *)w->q + r0 * w->cols * w->bits / 8;
  const int64_t G = w->cols / w->gs;
  v.sb = (char *)w->sb + r0 * G * (w->kind == CW_MXQ ? 1 : w->sbk == SBK_F32 ? 8 : 4);
  return v;
}

static void exec_grouped(cuda_be *c, const cu_op *o) {
  const cu_weight *cw = o->mx.cw;
  const int ns = o->mx.n * o->mx.k;
  const int64_t rows = o->mx.rows, cols = cw->cols, E = cw->rows / rows;
  cudaStream_t s = c->s;
  /* the expert ids on the host: the slots sorted by expert */
  if (!cu_ck(c, cudaMemcpyAsync(c->h_moe, o->mx.ids, sizeof(int32_t) * (size_t)ns, cudaMemcpyDeviceToHost, s),
             "expert ids") ||
      !cu_ck(c, cudaStreamSynchronize(s), "expert ids"))
    return;
  int32_t *ids = c->h_moe, *perm = c->h_moe + ns;
  int *off = (int *)sm_xcalloc((size_t)E + 1, sizeof(int));
  for (int i = 0; i < ns; i++)
    if (ids[i] >= 0 && ids[i] < E) off[ids[i] + 1]++;
  for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
  int *at = (int *)sm_xmalloc(sizeof(int) * (size_t)(E + 1));
  memcpy(at, off, sizeof(int) * (size_t)(E + 1));
  int n_in = 0;
  for (int i = 0; i < ns; i++)
    if (ids[i] >= 0 && ids[i] < E) { perm[at[ids[i]]++] = i; n_in++; }
  float *xg = (float *)c->moe, *yg = xg + (size_t)ns * cols;
  int32_t *dperm = (int32_t *)(yg + (size_t)ns * rows);
  if (n_in < ns) cudaMemsetAsync(o->mx.y, 0, sizeof(float) * (size_t)ns * rows, s); /* ids out of range: zeros */
  cu_ck(c, cudaMemcpyAsync(dperm, perm, sizeof(int32_t) * (size_t)n_in, cudaMemcpyHostToDevice, s), "slot order");
  k_gather_rows<<<cu_ew_blocks((size_t)n_in * cols), 256, 0, s>>>(xg, o->mx.x, dperm, n_in, cols, o->mx.per_slot, o->mx.k);
  if (cu_qmma_experts_ok(&c->cx, cw)) {
    int4 *th = (int4 *)(c->h_moe + ((2 * ns + 3) & ~3)), *td = (int4 *)(((uintptr_t)(dperm + ns) + 15) & ~(uintptr_t)15);
    cu_qmma_experts(&c->cx, cw, rows, xg, n_in, off, (int)E, yg, c->x16, th, td);
  } else for (int64_t e = 0; e < E; e++) {
    const int m = off[e + 1] - off[e];
    if (!m) continue;
    const cu_weight v = row_view(cw, e * rows, rows);
    cu_gemm(&c->cx, c->blas, &v, xg + (size_t)off[e] * cols, m, yg + (size_t)off[e] * rows, c->x16, c->deq, c->deq_cap,
            false);
  }
  k_scatter_rows<<<cu_ew_blocks((size_t)n_in * rows), 256, 0, s>>>(o->mx.y, yg, dperm, o->mx.ids, o->mx.bias, n_in, rows);
  free(off);
  free(at);
}

void cu_moe_exec(cuda_be *c, const cu_op *o) {
  const cu_ctx *cx = &c->cx;
  cudaStream_t s = c->s;
  switch (o->type) {
  case OP_MOE_ROUTE: {
    const size_t smem = sizeof(float) * 2 * (size_t)o->rt.ne;
    k_route<<<o->rt.n, 32, smem, s>>>(cu_route_of(o));
    break;
  }
  case OP_MM_EXPERTS:
    if (o->mx.grouped) exec_grouped(c, o);
    else cu_rows_matvec(cx, o->mx.cw, o->mx.rows, o->mx.ids, o->mx.k, o->mx.x, o->mx.per_slot, o->mx.bias, o->mx.y,
                        o->mx.n * o->mx.k);
    break;
  case OP_MOE_COMBINE:
    k_combine<<<cu_ew_blocks((size_t)o->cb.n * o->cb.dim), 256, 0, s>>>(o->cb.out, o->cb.y, o->cb.w, o->cb.n, o->cb.k,
                                                                       o->cb.dim);
    break;
  case OP_SWIGLU_CLAMP:
    k_swiglu_clamp<<<cu_ew_blocks(o->sw.n), 256, 0, s>>>(o->sw.out, o->sw.g, o->sw.u, o->sw.n, o->sw.alpha, o->sw.limit);
    break;
  case OP_SIGMOID_GATE:
    k_sigmoid_gate<<<cu_ew_blocks((size_t)o->sg.n * o->sg.dim), 256, 0, s>>>(o->sg.y, o->sg.g, o->sg.n, o->sg.dim);
    break;
  case OP_ATTN_SINKS: {
    const unsigned blocks = (unsigned)(c->n_tokens * o->as.nh);
    const size_t smem = sizeof(float) * ((size_t)o->as.hd + 8 * ((size_t)o->as.hd + 2));
    CU_KV_DISPATCH_Q((sm_dtype)o->as.dt,
                   k_attn_sinks<KT><<<blocks, 256, smem, s>>>(o->as.out, o->as.q, (const KT *)o->as.K,
                                                             (const KT *)o->as.V, o->as.sinks, c->d_pos, c->d_seq,
                                                             c->d_table, c->max_blocks, o->as.bs, o->as.nblocks,
                                                             o->as.nh, o->as.nkv, o->as.hd, o->as.scale, o->as.window,
                                                             o->as.softcap));
    break;
  }
  }
}

/* ================= recording (the op table) ================= */

static void be_moe_route(sm_backend *be, const float *logits, int n, const sm_moe_route *r, int32_t *ids, float *wts) {
  cuda_be *c = CB(be);
  if (n <= 0 || !r || r->n_experts <= 0 || r->n_experts > 4096 || r->top_k <= 0 || r->top_k > 64 ||
      r->top_k > r->n_experts || r->n_group > 64 || r->topk_group > 64) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: moe_route: unsupported routing shape");
    return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_MOE_ROUTE;
  o.rt.logits = logits; o.rt.ids = ids; o.rt.wts = wts; o.rt.corr = r->correction; o.rt.es = r->expert_scale;
  o.rt.n = n; o.rt.kind = r->kind;
  o.rt.ne = r->n_experts; o.rt.k = r->top_k; o.rt.norm = r->norm; o.rt.scale = r->scale;
  o.rt.eps = r->norm_eps > 0 ? r->norm_eps : 1e-20f;
  o.rt.ng = r->n_group > 1 ? r->n_group : 1; o.rt.tkg = r->topk_group;
  cu_submit(c, &o);
}

static void be_matmul_experts(sm_backend *be, sm_mm_role role, const sm_weight *w, int64_t rows, const float *bias,
                              const float *x, bool per_slot, int n, int k, const int32_t *ids, float *y) {
  cuda_be *c = CB(be);
  if (n <= 0 || k <= 0 || !w || rows <= 0) return;
  if (!w->dev || w->rows % rows) {
    sm_err(SMELT_ERR_INVALID, "cuda: matmul_experts: weight not prepared or not a stack of %lld-row experts",
           (long long)rows);
    cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n * (size_t)k * (size_t)rows, c->s);
    return;
  }
  const cu_weight *cw = (const cu_weight *)w->dev;
  const int ns = n * k;
  /* batches of many slots not captured for a graph: grouped GEMMs (cu_qmma_experts, or one per chosen
   * expert), which read the routing on the host, so the ops recorded before run first and the rest of the
   * step runs eagerly */
  /* batch-invariant mode: the row kernel for every batch, as for one token (a grouped GEMM rounds
   * differently) */
  const bool inv = c->base.batch_invariant;
  if (!inv && c->rec && c->n_tokens > GRAPH_MAX_TOKENS && ns > c->t.moe_grp) cu_flush(c);
  const bool grouped = !inv && !c->rec && ns > c->t.moe_grp;
  if (grouped) {
    /* device: x and y rows in slot order, the order, and the tiles of cu_qmma_experts (16-byte aligned
     * after the order: one tile's room to spare) */
    const size_t tiles = cu_qmma_experts_tiles(ns, cw->rows / rows);
    const size_t need = sizeof(float) * (size_t)ns * (size_t)(cw->cols + rows) + sizeof(int32_t) * (size_t)ns +
                        sizeof(int4) * (tiles + 1);
    size_t hcap = c->h_moe_cap;
    if (!cu_ensure_buf(c, &c->moe, &c->moe_cap, need) ||
        !cu_ensure_buf(c, &c->x16, &c->x16_cap, cu_qmma_x16_bytes(ns, cw->cols)))
      return;
    if (cw->kind != CW_DENSE) { /* cu_gemm dequantizes a tile of rows at a time */
      size_t want = (size_t)rows * (size_t)cw->cols * 2, minb = (size_t)cw->cols * 2 * 128;
      if (want > DEQ_BYTES) want = DEQ_BYTES;
      if (want < minb) want = minb;
      if (!cu_ensure_buf(c, &c->deq, &c->deq_cap, want)) return;
    }
    const size_t hneed = (size_t)ns * 2 + 3 + 4 * tiles; /* ids, order, tiles (16-byte aligned) */
    if (hneed > hcap) {
      free(c->h_moe);
      c->h_moe_cap = hneed;
      c->h_moe = (int32_t *)sm_xmalloc(sizeof(int32_t) * c->h_moe_cap);
    }
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_MM_EXPERTS;
  o.mx.cw = cw; o.mx.x = x; o.mx.bias = bias; o.mx.ids = ids; o.mx.y = y; o.mx.rows = rows; o.mx.n = n; o.mx.k = k;
  o.mx.per_slot = per_slot; o.mx.role = (int)role; o.mx.grouped = grouped;
  cu_submit(c, &o);
}

static void be_moe_combine(sm_backend *be, float *out, const float *y, const float *wts, int n, int k, int dim) {
  if (n <= 0 || k <= 0 || dim <= 0) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_MOE_COMBINE;
  o.cb.out = out; o.cb.y = y; o.cb.w = wts; o.cb.n = n; o.cb.k = k; o.cb.dim = dim;
  cu_submit(CB(be), &o);
}

static void be_swiglu_clamp(sm_backend *be, float *out, const float *gate, const float *up, size_t n, float alpha,
                            float limit) {
  if (!n) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_SWIGLU_CLAMP;
  o.sw.out = out; o.sw.g = gate; o.sw.u = up; o.sw.n = n; o.sw.alpha = alpha; o.sw.limit = limit;
  cu_submit(CB(be), &o);
}

static void be_sigmoid_gate_rows(sm_backend *be, float *y, const float *g, int n, int dim) {
  if (n <= 0 || dim <= 0) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_SIGMOID_GATE;
  o.sg.y = y; o.sg.g = g; o.sg.n = n; o.sg.dim = dim;
  cu_submit(CB(be), &o);
}

static void be_attention_sinks(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer,
                               int n_heads, float scale, int window, float softcap, const float *sinks) {
  cuda_be *c = CB(be);
  if (c->n_tokens <= 0) return;
  if (!kv || layer < 0 || layer >= kv->n_layers || n_heads <= 0 || kv->n_kv_heads <= 0 || kv->head_dim <= 0 ||
      kv->head_dim > 256 || n_heads % kv->n_kv_heads || kv->block_size <= 0 || !sinks ||
      (sm_kv_quantized(kv->dtype) && kv->head_dim % 4)) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: attention with sinks: shape not supported");
    if (kv && kv->head_dim > 0 && n_heads > 0)
      cudaMemsetAsync(out, 0, (size_t)c->n_tokens * n_heads * kv->head_dim * 4, c->s);
    return;
  }
  if (!c->base.batch_invariant && cu_attn_shape_ok(c, kv, layer, n_heads)) {
    /* the decode kernel for one token a sequence (with rope and the KV store fused in), else the tiled kernels:
     * the sinks in their softmax */
    cu_record_attention(c, out, q, kv, layer, n_heads, scale, window, softcap, sinks);
    return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_ATTN_SINKS;
  o.as.out = out; o.as.q = q; o.as.sinks = sinks; o.as.K = kv->k[layer]; o.as.V = kv->v[layer]; o.as.nh = n_heads;
  o.as.nkv = kv->n_kv_heads; o.as.hd = kv->head_dim; o.as.bs = kv->block_size; o.as.nblocks = kv->n_blocks;
  o.as.window = window > 0 ? window : 0; o.as.dt = (int)kv->dtype; o.as.scale = scale;
  o.as.softcap = softcap > 0.f ? softcap : 0.f;
  cu_submit(c, &o);
}

void cu_moe_install(sm_backend *b) {
  b->moe_route = be_moe_route;
  b->matmul_experts = be_matmul_experts;
  b->moe_combine = be_moe_combine;
  b->swiglu_clamp = be_swiglu_clamp;
  b->sigmoid_gate_rows = be_sigmoid_gate_rows;
  b->attention_sinks = be_attention_sinks;
}
