/* The expert matvecs of decode and small batches (everything a CUDA graph records), reading only the
 * chosen experts' rows:
 * - k_rows, the matmul_experts op alone: one warp a row of its slot's expert, any weight layout;
 * - the two fused kernels the executor runs in place of the routed-expert op chains (cuda_fuse.cu):
 *   gate/up + activation, h[s][r] = act((Wg_e[r] . x_t) (+ bias), (Wu_e[r] . x_t) (+ bias)) for each slot
 *   s = (t, j) with e = ids[s] (k_xgu_*; act silu(g) * u or gpt-oss's clamped SwiGLU), and down + combine,
 *   out[t][r] = sum_j wts[t][j] * (Wd_e[r] . h[t*k + j] (+ bias[e][r])) (k_xdc_*: a row of a token, all its
 *   slots' rows). Each has a fast path for 4-bit affine (CW_Q4), whose blocks request all the bytes they need
 *   at once (cp.async into shared memory: 8 or 16 rows, their scales, x) and compute from there, one for
 *   mxfp4 (streaming loads, int16 x, dp2a: k_xgu_mx4 / k_xdc_mx4) and a path for any layout (one warp a
 *   row, row_dot_part).
 * Every (row, token) is summed in the same order whatever the batch, like k_rows. */
#include "backend/cuda/cuda_ldst.cuh"
#include "backend/cuda/cuda_mxq.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_weights.cuh"

/* lane's part of W[r] . x (any layout); the caller sums over the warp */
static __device__ float row_dot_part(const cu_weight &w, int64_t r, const float *x, int lane) {
  const int64_t K = w.cols;
  float acc = 0.f;
  if (w.kind == CW_DENSE) {
    if (w.dtype == SM_DT_BF16) {
      const __nv_bfloat16 *p = (const __nv_bfloat16 *)w.q + r * K;
      for (int64_t j = lane; j < K; j += 32) acc += __bfloat162float(p[j]) * x[j];
    } else if (w.dtype == SM_DT_F16) {
      const __half *p = (const __half *)w.q + r * K;
      for (int64_t j = lane; j < K; j += 32) acc += __half2float(p[j]) * x[j];
    } else {
      const float *p = (const float *)w.q + r * K;
      for (int64_t j = lane; j < K; j += 32) acc += p[j] * x[j];
    }
  } else if (w.kind == CW_QFAST || w.kind == CW_Q4) { /* 2/4/8-bit words, E whole elements each */
    const int bits = w.bits, E = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    const int64_t W = K / E, G = K / w.gs;
    const uint32_t *q = (const uint32_t *)w.q + r * W;
    for (int64_t u = lane; u < W; u += 32) {
      const uint32_t wd = q[w.kind == CW_Q4 ? u : cu_qfast_store_index(u, W)];
      const int64_t j0 = u * E;
      const float2 p = load_sb_rt(w.sb, r * G + j0 / w.gs, w.sbk);
      const float4 *x4 = reinterpret_cast<const float4 *>(x + j0); /* E >= 4; rows of x 16-byte aligned */
      float qx = 0.f, xs = 0.f;
      for (int e4 = 0; e4 < E; e4 += 4) {
        const float4 v = x4[e4 >> 2];
        const float xv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
          qx += (float)((wd >> ((e4 + i) * bits)) & mask) * xv[i];
          xs += xv[i];
        }
      }
      acc += p.x * qx + p.y * xs;
    }
  } else if (w.kind == CW_MXQ) {
    const int E = w.bits == 4 ? 8 : 4;
    const int64_t W = K / E;
    const uint32_t *q = (const uint32_t *)w.q + r * W;
    for (int64_t u = lane; u < W; u += 32) {
      const uint32_t wd = q[u];
      const int64_t j0 = u * E;
      const float4 *x4 = reinterpret_cast<const float4 *>(x + j0);
      float d = 0.f;
      if (E == 8) {
        const float4 a = x4[0], b = x4[1];
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; e++) d += mxq_fp4((wd >> (4 * e)) & 15) * xv[e];
      } else {
        const float4 a = x4[0];
        const float xv[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int e = 0; e < 4; e++) d += mxq_e4m3((wd >> (8 * e)) & 255) * xv[e];
      }
      acc += mxq_scale(w, r, j0 / w.gs) * d;
    }
  } else { /* 3/5/6-bit bit streams */
    for (int64_t j = lane; j < K; j += 32) acc += dq_elem(w, r, j) * x[j];
  }
  return acc;
}

/* block: 8 warps = 8 rows of one slot (blockIdx.y) */
__global__ void k_rows(cu_weight w, int64_t rows, const int32_t *ids, int k, const float *x, int per_slot,
                       const float *bias, float *y) {
  const int lane = threadIdx.x & 31;
  const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  const int s = blockIdx.y;
  if (r >= rows) return;
  const int64_t E = w.rows / rows;
  const int e = ids ? ids[s] : 0;
  float v = 0.f;
  if (e >= 0 && e < E) {
    v = row_dot_part(w, (int64_t)e * rows + r, x + (int64_t)(per_slot ? s : s / k) * w.cols, lane);
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (bias) v += bias[(int64_t)e * rows + r];
  }
  if (lane == 0) y[(int64_t)s * rows + r] = v;
}


void cu_rows_matvec(const cu_ctx *cx, const cu_weight *w, int64_t rows, const int32_t *ids, int k, const float *x,
                    bool per_slot, const float *bias, float *y, int n_slots) {
  if (n_slots <= 0 || rows <= 0 || k <= 0) return;
  const int step = 65535 - 65535 % k; /* slots a launch (its grid's y), whole tokens */
  for (int s0 = 0; s0 < n_slots; s0 += step) {
    const int ns = n_slots - s0 < step ? n_slots - s0 : step;
    const dim3 grid((unsigned)((rows + 7) / 8), (unsigned)ns);
    k_rows<<<grid, 256, 0, cx->s>>>(*w, rows, ids ? ids + s0 : NULL, k, x + (int64_t)(per_slot ? s0 : s0 / k) * w->cols,
                                     per_slot ? 1 : 0, bias, y + (int64_t)s0 * rows);
  }
}


/* ---------------- fused: gate/up + silu, down + combine ---------------- */

/* x as the 4-bit kernels keep it in shared memory: 32-value chunk c (one 16-byte weight load) is 8
 * float4s, its float4 i at c * 8 + (i ^ (c & 7)), so that the 8 lanes of a shared-memory phase, which
 * read consecutive chunks, hit different banks */
static __device__ __forceinline__ int xs_at(int64_t c, int i) { return (int)(c * 8 + (i ^ (int)(c & 7))); }
/* chunk c of the staged x into xv, and its sum */
static __device__ __forceinline__ float xs_load(const float4 *xs, int64_t c, float (&xv)[32]) {
  float sx = 0.f;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const float4 v = xs[xs_at(c, i)];
    xv[4 * i] = v.x;
    xv[4 * i + 1] = v.y;
    xv[4 * i + 2] = v.z;
    xv[4 * i + 3] = v.w;
    sx += (v.x + v.y) + (v.z + v.w);
  }
  return sx;
}
/* scale * sum_e q_e x_e + bias * sum_e x_e over the 32 values of a 16-byte CW_Q4 load, sx = sum_e x_e
 * (decode_word's f = 2 + q/64: sum_e q_e x_e = 64 sum_e f_e x_e - 128 sx) */
static __device__ __forceinline__ float q4_dot(const uint4 &q, float2 sb, const float (&xv)[32], float sx) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  float fx = 0.f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float f[8];
    decode_word<4>(w[i], f);
#pragma unroll
    for (int e = 0; e < 8; e++) fx = fmaf(f[e], xv[8 * i + e], fx);
  }
  return 64.f * sb.x * fx + (sb.y - 128.f * sb.x) * sx;
}

/* 16-byte asynchronous copy global -> shared (no registers held while in flight) */
static __device__ __forceinline__ void cp16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
}
static __device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* pair idx of (scale, bias) pairs held as the weight keeps them (sbk) */
static __device__ __forceinline__ float2 sb_at(const void *sb, int64_t idx, int sbk) {
  if (sbk == SBK_F32) return ((const float2 *)sb)[idx];
  return sb16_decode(((const uint32_t *)sb)[idx], sbk == SBK_BF16);
}

/* The layouts with a fast path: 4-bit affine (CW_Q4) whose groups hold whole 16-byte loads and whose
 * rows of (scale, bias) pairs are whole 16-byte copies (the staged kernels), and mxfp4 (CW_MXQ, 4-bit, one
 * E8M0 scale per 32 values: the streaming kernels k_xgu_mx4 / k_xdc_mx4); 0: none (the warp-a-row kernels). */
enum { XF_ANY = 0, XF_Q4 = 1, XF_MX4 = 2 };
static int fast_fmt(const cu_weight *w) {
  if (w->cols % 32) return XF_ANY;
  if (w->kind == CW_Q4 && w->gs % 32 == 0 && ((w->cols / w->gs) * (w->sbk == SBK_F32 ? 8 : 4)) % 16 == 0) return XF_Q4;
  if (w->kind == CW_MXQ && w->bits == 4 && w->gs == 32 && w->qmode != SM_QMODE_NVFP4) return XF_MX4;
  return XF_ANY;
}
/* uint4s of a CW_Q4 row's (scale, bias) pairs kept in shared memory by the staged kernels */
static __host__ __device__ __forceinline__ int64_t sb_words(int64_t cols, int gs, int sbk) {
  return (cols / gs) * (sbk == SBK_F32 ? 8 : 4) / 16;
}

/* The staged kernels (k_xgu_fast, k_xdc_fast: CW_Q4 weights of fast_fmt XF_Q4) copy n rows from row `row`
 * into shared memory: the quants at W (n * cols / 32 uint4s), the (scale, bias) pairs at S (n * sb_words
 * uint4s). */
static __device__ __forceinline__ void rows_async(uint4 *W, uint4 *S, const cu_weight &w, int64_t row, int n) {
  const int64_t nch = w.cols >> 5, sbw = sb_words(w.cols, w.gs, w.sbk);
  const uint4 *q = (const uint4 *)w.q + row * nch, *sb = (const uint4 *)w.sb + row * sbw;
  for (int64_t i = threadIdx.x; i < n * nch; i += blockDim.x) cp16(W + i, q + i);
  for (int64_t i = threadIdx.x; i < n * sbw; i += blockDim.x) cp16(S + i, sb + i);
}

/* W[r] . x over chunk c (32 values) of row r, srow its row in the shared S */
static __device__ __forceinline__ float chunk_dot(const uint4 &q, const cu_weight &w, const uint4 *S, int64_t srow,
                                                  int64_t c, const float (&xv)[32], float sx) {
  return q4_dot(q, sb_at(S, srow * (w.cols / w.gs) + (c << 5) / w.gs, w.sbk), xv, sx);
}

/* v plus the experts' down biases of token slots j < k, weighted as their outputs, in slot order (down +
 * combine kernels): row r of each slot's expert e = id[j] (out-of-range experts add nothing) */
static __device__ __forceinline__ float xdc_bias(float v, const float *bias, const int32_t *id, const float *wt, int k,
                                                 int64_t E, int64_t rows, int64_t r) {
  for (int j = 0; j < k; j++) {
    const int e = id[j];
    if (e >= 0 && e < E) v += wt[j] * bias[(int64_t)e * rows + r];
  }
  return v;
}

/* the activations of the gate/up kernels: silu(g) * u, gpt-oss's clamped SwiGLU (swiglu_clamp, kind 1) or
 * gelu_tanh(g) * u (Gemma 4's experts, kind 2) */
struct xact {
  int kind;
  float alpha, limit;
};
static __device__ __forceinline__ float act_f(const xact &a, float g, float u) {
  return a.kind == 1 ? cu_swiglu_clamp(g, u, a.alpha, a.limit) : a.kind == 2 ? cu_gelu_tanh(g) * u : cu_silu(g) * u;
}

/* block: 8 warps of R rows each (8R rows) of one slot (blockIdx.y). Every byte the block needs (the
 * rows of both weights, their scales and x) is requested at once (cp.async) into shared memory:
 * W_g, W_u [8R][nch] uint4, S_g, S_u [8R][sbw] uint4, then x (xs_at order). bg / bu: the experts'
 * biases or NULL. */
template <int R>
__global__ void __launch_bounds__(256) k_xgu_fast(cu_weight wg, cu_weight wu, int64_t rows, const int32_t *ids, int k,
                                                 const float *x, float *h, const float *bg, const float *bu, xact act,
                                                 const cu_route rt) {
  extern __shared__ uint4 sm[];
  __shared__ int sel[CU_ROUTE_MAX_K];
  const int lane = threadIdx.x & 31, s = blockIdx.y, RB = 8 * R;
  const int64_t rb = (int64_t)blockIdx.x * RB, nch = wg.cols >> 5;
  const int nr = rows - rb < RB ? (int)(rows - rb) : RB;
  const int64_t sbw = sb_words(wg.cols, wg.gs, wg.sbk);
  uint4 *Wg = sm, *Wu = Wg + RB * nch, *Sg = Wu + RB * nch, *Su = Sg + RB * sbw;
  float4 *X = (float4 *)(Su + RB * sbw);
  pdl_wait();
  int e;
  if (rt.logits) { /* route the slot's token (warp 0); the token's first block writes its ids and weights */
    if (threadIdx.x < 32) cu_route_token(rt, s / k, (float *)(X + (wg.cols >> 2)), sel, blockIdx.x == 0 && s % k == 0);
    __syncthreads();
    e = sel[s % k];
  } else e = ids[s];
  const bool ok = e >= 0 && e < wg.rows / rows;
  const int64_t row0 = (int64_t)e * rows + rb;
  if (ok) {
    rows_async(Wg, Sg, wg, row0, nr);
    rows_async(Wu, Su, wu, row0, nr);
    const float4 *x4 = (const float4 *)(x + (int64_t)(s / k) * wg.cols);
    for (int g = threadIdx.x; g < (int)(wg.cols >> 2); g += blockDim.x) cp16(X + xs_at(g >> 3, g & 7), x4 + g);
    cp_wait_all();
  }
  __syncthreads();
  const int w0 = (threadIdx.x >> 5) * R;
  float ag[R], au[R];
#pragma unroll
  for (int j = 0; j < R; j++) ag[j] = au[j] = 0.f;
  if (ok)
    for (int64_t c = lane; c < nch; c += 32) {
      float xv[32];
      const float sx = xs_load(X, c, xv);
#pragma unroll
      for (int j = 0; j < R; j++)
        if (w0 + j < nr) {
          ag[j] += chunk_dot(Wg[(w0 + j) * nch + c], wg, Sg, w0 + j, c, xv, sx);
          au[j] += chunk_dot(Wu[(w0 + j) * nch + c], wu, Su, w0 + j, c, xv, sx);
        }
    }
#pragma unroll
  for (int j = 0; j < R; j++) {
    float g = warp_sum(ag[j]), u = warp_sum(au[j]);
    if (lane == 0 && w0 + j < nr) {
      if (ok && bg) g += bg[row0 + w0 + j];
      if (ok && bu) u += bu[row0 + w0 + j];
      h[(int64_t)s * rows + rb + w0 + j] = ok ? act_f(act, g, u) : 0.f;
    }
  }
}
static size_t gu_smem(const cu_weight *w, int R) {
  const size_t RB = 8 * (size_t)R, sbw = fast_fmt(w) == XF_Q4 ? (size_t)sb_words(w->cols, w->gs, w->sbk) : 0;
  return 16 * (2 * RB * (size_t)(w->cols >> 5) + 2 * RB * sbw) + 4 * (size_t)w->cols;
}

__global__ void __launch_bounds__(256) k_xgu_any(cu_weight wg, cu_weight wu, int64_t rows, const int32_t *ids, int k,
                                                const float *x, float *h, const float *bg, const float *bu, xact act) {
  const int lane = threadIdx.x & 31, s = blockIdx.y;
  const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  pdl_wait();
  if (r >= rows) return;
  const int e = ids[s];
  float out = 0.f;
  if (e >= 0 && e < wg.rows / rows) {
    const int64_t row = (int64_t)e * rows + r;
    const float *xt = x + (int64_t)(s / k) * wg.cols;
    const float ag = warp_sum(row_dot_part(wg, row, xt, lane)) + (bg ? bg[row] : 0.f);
    const float au = warp_sum(row_dot_part(wu, row, xt, lane)) + (bu ? bu[row] : 0.f);
    out = act_f(act, ag, au);
  }
  if (lane == 0) h[(int64_t)s * rows + r] = out;
}

/* block: 8 warps of R rows each (8R rows) of one token (blockIdx.y), for all its k slots, requested at
 * once into shared memory: W [k][8R][nch] uint4, S [k][8R][sbw] uint4, then the slots' x rows (chunk
 * j * nch + c = chunk c of slot j, xs_at order). A slot whose expert is out of range adds nothing. */
template <int R>
__global__ void __launch_bounds__(256) k_xdc_fast(cu_weight w, int64_t rows, const int32_t *ids, const float *wts, int k,
                                                 const float *hx, const float *bias, float *out) {
  extern __shared__ uint4 sm[];
  const int lane = threadIdx.x & 31, t = blockIdx.y, RB = 8 * R;
  const int64_t rb = (int64_t)blockIdx.x * RB, nch = w.cols >> 5, E = w.rows / rows;
  const int nr = rows - rb < RB ? (int)(rows - rb) : RB;
  const int64_t sbw = sb_words(w.cols, w.gs, w.sbk), tot = (int64_t)k * nch;
  uint4 *W = sm, *S = W + (int64_t)k * RB * nch;
  float4 *X = (float4 *)(S + (int64_t)k * RB * sbw);
  const int32_t *id = ids + (int64_t)t * k;
  const float *wt = wts + (int64_t)t * k;
  pdl_wait();
  for (int j = 0; j < k; j++) {
    const int e = id[j];
    if (e >= 0 && e < E) rows_async(W + (int64_t)j * RB * nch, S + (int64_t)j * RB * sbw, w, (int64_t)e * rows + rb, nr);
  }
  const float4 *x4 = (const float4 *)(hx + (int64_t)t * k * w.cols);
  for (int64_t g = threadIdx.x; g < tot * 8; g += blockDim.x) cp16(X + xs_at(g >> 3, (int)(g & 7)), x4 + g);
  cp_wait_all();
  __syncthreads();
  const int w0 = (threadIdx.x >> 5) * R;
  float acc[R];
#pragma unroll
  for (int m = 0; m < R; m++) acc[m] = 0.f;
  for (int i = lane; i < (int)tot; i += 32) {
    const int j = i / (int)nch;
    const int64_t c = i - j * (int)nch;
    const int e = id[j];
    if (e < 0 || e >= E) continue;
    const float wj = wt[j];
    float xv[32];
    const float sx = xs_load(X, i, xv);
#pragma unroll
    for (int m = 0; m < R; m++)
      if (w0 + m < nr) {
        const int64_t rr = (int64_t)j * RB + w0 + m;
        acc[m] += wj * chunk_dot(W[rr * nch + c], w, S, rr, c, xv, sx);
      }
  }
#pragma unroll
  for (int m = 0; m < R; m++) {
    float v = warp_sum(acc[m]);
    if (lane == 0 && w0 + m < nr) {
      if (bias) v = xdc_bias(v, bias, id, wt, k, E, rows, rb + w0 + m);
      out[(int64_t)t * rows + rb + w0 + m] = v;
    }
  }
}
static size_t dc_smem(const cu_weight *w, int k, int R) {
  const size_t RB = 8 * (size_t)R, sbw = fast_fmt(w) == XF_Q4 ? (size_t)sb_words(w->cols, w->gs, w->sbk) : 0;
  return (size_t)k * (16 * (RB * (size_t)(w->cols >> 5) + RB * sbw) + 4 * (size_t)w->cols);
}

__global__ void __launch_bounds__(256) k_xdc_any(cu_weight w, int64_t rows, const int32_t *ids, const float *wts, int k,
                                                const float *hx, const float *bias, float *out) {
  const int lane = threadIdx.x & 31, t = blockIdx.y;
  const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  pdl_wait();
  if (r >= rows) return;
  const int64_t E = w.rows / rows;
  float acc = 0.f;
  for (int j = 0; j < k; j++) {
    const int e = ids[(int64_t)t * k + j];
    if (e < 0 || e >= E) continue;
    float v = warp_sum(row_dot_part(w, (int64_t)e * rows + r, hx + ((int64_t)t * k + j) * w.cols, lane));
    if (bias) v += bias[(int64_t)e * rows + r];
    acc += wts[(int64_t)t * k + j] * v;
  }
  if (lane == 0) out[(int64_t)t * rows + r] = acc;
}

/* mxfp4 experts (XF_MX4) stream instead, on int16 x: a block first quantizes its x (the token's, or its k
 * slots' for down) into shared memory, symmetric int16 per 32 values with a float scale each (2^-15 of the
 * group's largest value), while warp 0 routes; then a warp takes R rows and requests all its loads (16 bytes
 * of codes and a scale byte a lane and chunk, MX_U chunks a lane at a time) before it computes on any. Codes
 * become int8 (twice the fp4 value: 0, 1, 2, 3, 4, 6, 8, 12 and negatives) by byte-permute table lookups
 * and meet x in dp2a: 32 values are ten lookups and sixteen dp2a, where the float path decoded each value
 * to a float (measured slower; int8 x, 2% faster, moved gpt-oss's decode logits by 0.2). Staging whole rows in
 * shared memory first had left the loads and the arithmetic one after the other. */
#define MX_U 3
/* x quantized: [K] int16 codes, then [K / 32] scales (K a multiple of 32) */
static __device__ __forceinline__ void mx_quant_x(const float *__restrict__ x, int K, int16_t *xq, float *xs, int t0,
                                                  int nt) {
  for (int g = t0; g < K / 32; g += nt) {
    const float4 *x4 = (const float4 *)(x + 32 * g);
    float4 v[8];
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      v[i] = x4[i];
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
    }
    const float inv = m > 0.f ? 32767.f / m : 0.f;
    int2 *q = (int2 *)(xq + 32 * g);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int a = __float2int_rn(v[i].x * inv), b = __float2int_rn(v[i].y * inv), c = __float2int_rn(v[i].z * inv),
                d = __float2int_rn(v[i].w * inv);
      q[i] = make_int2((a & 0xFFFF) | b << 16, (c & 0xFFFF) | d << 16);
    }
    xs[g] = m / 32767.f;
  }
}
/* the sum of 32 codes (one 16-byte load) times 2, times the 32 int16 x values of chunk c */
static __device__ __forceinline__ int mx4_idot(const uint4 &q, const int16_t *xq, int c) {
  const int4 *x4 = (const int4 *)xq + 4 * c;
  const uint32_t wd[4] = { q.x, q.y, q.z, q.w };
  int d = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int4 xv = x4[i]; /* values 8i .. 8i + 7, two a word */
    int lo, hi;
    mxq_fp4_i8x8(wd[i], lo, hi);
    d = __dp2a_lo(xv.x, lo, d);
    d = __dp2a_hi(xv.y, lo, d);
    d = __dp2a_lo(xv.z, hi, d);
    d = __dp2a_hi(xv.w, hi, d);
  }
  return d;
}

template <int R>
__global__ void __launch_bounds__(256) k_xgu_mx4(cu_weight wg, cu_weight wu, int64_t rows, const int32_t *ids, int k,
                                                const float *x, float *h, const float *bg, const float *bu, xact act,
                                                const cu_route rt) {
  extern __shared__ int4 xsm[]; /* x: [cols] int16, [cols / 32] scales; then the routing's scores */
  __shared__ int sel[CU_ROUTE_MAX_K];
  const int lane = threadIdx.x & 31, s = blockIdx.y, K = (int)wg.cols, nch = K >> 5;
  const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  int16_t *xq = (int16_t *)xsm;
  float *xs = (float *)(xq + K), *rsc = xs + nch;
  pdl_wait();
  const float *xt = x + (int64_t)(s / k) * K;
  if (rt.logits) { /* warp 0 routes the slot's token (its first block writes the ids and weights); the others quantize x */
    if (threadIdx.x < 32) cu_route_token(rt, s / k, rsc, sel, blockIdx.x == 0 && s % k == 0);
    else mx_quant_x(xt, K, xq, xs, threadIdx.x - 32, blockDim.x - 32);
  } else {
    mx_quant_x(xt, K, xq, xs, threadIdx.x, blockDim.x);
  }
  __syncthreads();
  const int e = rt.logits ? sel[s % k] : ids[s];
  if (r0 >= rows) return;
  const bool ok = e >= 0 && e < wg.rows / rows;
  int64_t row[R]; /* rows past the end read the last one and are not written */
#pragma unroll
  for (int j = 0; j < R; j++) row[j] = (int64_t)(ok ? e : 0) * rows + (r0 + j < rows ? r0 + j : rows - 1);
  const uint4 *qg = (const uint4 *)wg.q, *qu = (const uint4 *)wu.q;
  const uint8_t *sg = (const uint8_t *)wg.sb, *su = (const uint8_t *)wu.sb;
  float ag[R], au[R];
#pragma unroll
  for (int j = 0; j < R; j++) ag[j] = au[j] = 0.f;
  for (int c0 = ok ? 0 : nch; c0 < nch; c0 += 32 * MX_U) {
    uint4 vg[MX_U][R], vu[MX_U][R];
    uint32_t cg[MX_U][R], cu[MX_U][R];
#pragma unroll
    for (int u = 0; u < MX_U; u++) {
      const int c = c0 + 32 * u + lane;
      if (c < nch)
#pragma unroll
        for (int j = 0; j < R; j++) {
          vg[u][j] = ld_stream(qg + row[j] * nch + c);
          vu[u][j] = ld_stream(qu + row[j] * nch + c);
          cg[u][j] = sg[row[j] * nch + c];
          cu[u][j] = su[row[j] * nch + c];
        }
    }
#pragma unroll
    for (int u = 0; u < MX_U; u++) {
      const int c = c0 + 32 * u + lane;
      if (c < nch) {
        const float xsc = 0.5f * xs[c];
#pragma unroll
        for (int j = 0; j < R; j++) {
          ag[j] += mxq_e8m0(cg[u][j]) * xsc * (float)mx4_idot(vg[u][j], xq, c);
          au[j] += mxq_e8m0(cu[u][j]) * xsc * (float)mx4_idot(vu[u][j], xq, c);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < R; j++) {
    float g = warp_sum(ag[j]), u = warp_sum(au[j]);
    if (lane == 0 && r0 + j < rows) {
      if (ok && bg) g += bg[row[j]];
      if (ok && bu) u += bu[row[j]];
      h[(int64_t)s * rows + r0 + j] = ok ? act_f(act, g, u) : 0.f;
    }
  }
}
static size_t mx_gu_smem(const cu_weight *w) { return 2 * (size_t)w->cols + 4 * (size_t)(w->cols / 32); }

/* down + combine of a token's k slots the same way: a lane's chunks i = lane, lane + 32, ... over all slots'
 * rows (slot i / nch, chunk i % nch), each chunk's dot times its slot's weight */
#define MXD_U 4
template <int R>
__global__ void __launch_bounds__(128) k_xdc_mx4(cu_weight w, int64_t rows, const int32_t *ids, const float *wts, int k,
                                                const float *hx, const float *bias, float *out) {
  extern __shared__ int4 xsm[]; /* the k slots' x: [k * cols] int16, [k * cols / 32] scales */
  const int lane = threadIdx.x & 31, t = blockIdx.y, K = (int)w.cols, nch = K >> 5, tot = k * nch;
  const int64_t r0 = ((int64_t)blockIdx.x * 4 + (threadIdx.x >> 5)) * R, E = w.rows / rows;
  int16_t *xq = (int16_t *)xsm;
  float *xs = (float *)(xq + (int64_t)k * K);
  const int32_t *id = ids + (int64_t)t * k;
  const float *wt = wts + (int64_t)t * k;
  pdl_wait();
  mx_quant_x(hx + (int64_t)t * k * K, k * K, xq, xs, threadIdx.x, blockDim.x);
  __syncthreads();
  if (r0 >= rows) return;
  int64_t rr[R];
#pragma unroll
  for (int m = 0; m < R; m++) rr[m] = r0 + m < rows ? r0 + m : rows - 1;
  const uint4 *q = (const uint4 *)w.q;
  const uint8_t *sc = (const uint8_t *)w.sb;
  float acc[R];
#pragma unroll
  for (int m = 0; m < R; m++) acc[m] = 0.f;
  for (int i0 = 0; i0 < tot; i0 += 32 * MXD_U) {
    uint4 v[MXD_U][R];
    uint32_t cs[MXD_U][R];
    int ev[MXD_U];
#pragma unroll
    for (int u = 0; u < MXD_U; u++) {
      const int i = i0 + 32 * u + lane, j = i / nch, c = i - j * nch;
      ev[u] = i < tot ? id[j] : -1;
      if (ev[u] >= 0 && ev[u] < E)
#pragma unroll
        for (int m = 0; m < R; m++) {
          const int64_t row = (int64_t)ev[u] * rows + rr[m];
          v[u][m] = ld_stream(q + row * nch + c);
          cs[u][m] = sc[row * nch + c];
        }
    }
#pragma unroll
    for (int u = 0; u < MXD_U; u++) {
      const int i = i0 + 32 * u + lane, j = i / nch;
      if (ev[u] < 0 || ev[u] >= E) continue;
      const float f = wt[j] * 0.5f * xs[i];
#pragma unroll
      for (int m = 0; m < R; m++) acc[m] += f * mxq_e8m0(cs[u][m]) * (float)mx4_idot(v[u][m], xq, i);
    }
  }
#pragma unroll
  for (int m = 0; m < R; m++) {
    float v = warp_sum(acc[m]);
    if (lane == 0 && r0 + m < rows) {
      if (bias) v = xdc_bias(v, bias, id, wt, k, E, rows, r0 + m);
      out[(int64_t)t * rows + r0 + m] = v;
    }
  }
}
static size_t mx_dc_smem(const cu_weight *w, int k) { return (size_t)k * (2 * (size_t)w->cols + 4 * (size_t)(w->cols / 32)); }

/* Rows a block of the staged kernels takes: 16 (R 2), or 8 where that needs too much shared memory (R 1);
 * 0: no fast path (the layout has none, or even 8 rows do not fit). */
#define SMEM_MAX (200 * 1024)
static int fast_rows(const cu_weight *w, size_t smem16, size_t smem8) {
  if (fast_fmt(w) != XF_Q4) return 0;
  return smem16 <= 100 * 1024 ? 2 : smem8 <= SMEM_MAX ? 1 : 0;
}
static int gu_rows(const cu_weight *w) { return fast_rows(w, gu_smem(w, 2), gu_smem(w, 1)); }
/* the routing's scores after x (k_xgu_fast with routing) */
static size_t route_smem(int E) { return sizeof(float) * 2 * (size_t)E; }
static int dc_rows(const cu_weight *w, int k) { return fast_rows(w, dc_smem(w, k, 2), dc_smem(w, k, 1)); }
/* a kernel's dynamic shared memory above the default 48 KiB */
template <typename K> static void smem_optin(K kern, size_t bytes) {
  if (bytes > 48 * 1024) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

bool cu_experts_gu_ok(const cu_weight *wg, const cu_weight *wu, int64_t rows) {
  if (wg->cols != wu->cols || wg->rows != wu->rows || rows <= 0 || wg->rows % rows || wg->cols % 4) return false;
  const int a = gu_rows(wg), b = gu_rows(wu);
  return a == b && fast_fmt(wg) == fast_fmt(wu) &&
         (!fast_fmt(wg) || (wg->gs == wu->gs && wg->sbk == wu->sbk && wg->qmode == wu->qmode));
}

bool cu_experts_gu_route_ok(const cu_weight *wg, int64_t rows, int E) {
  if (rows <= 0 || E <= 0 || E > 1024) return false;
  if (fast_fmt(wg) == XF_MX4) return mx_gu_smem(wg) + route_smem(E) <= SMEM_MAX;
  const int R = gu_rows(wg);
  return R && gu_smem(wg, R) + route_smem(E) <= SMEM_MAX;
}

void cu_experts_gu(const cu_ctx *cx, const cu_weight *wg, const cu_weight *wu, int64_t rows, const int32_t *ids, int n,
                   int k, const float *x, float *h, const float *bg, const float *bu, bool clamp, float alpha,
                   float limit, const cu_route *rt, bool gelu) {
  const int R = gu_rows(wg), F = fast_fmt(wg);
  const dim3 grid((unsigned)((rows + 8 * (R ? R : 1) - 1) / (8 * (R ? R : 1))), (unsigned)(n * k));
  const xact a = { clamp ? 1 : gelu ? 2 : 0, alpha, limit };
  cu_route r;
  memset(&r, 0, sizeof r);
  if (rt) r = *rt;
  const size_t rs = rt ? route_smem(rt->E) : 0;
  if (F == XF_MX4 && mx_gu_smem(wg) + rs <= SMEM_MAX) {
    /* 8 warps a block: half the blocks quantizing x and routing (gpt-oss-20b shape on the H200: 393.6-393.9
     * against 389.6-390.0 tok/s with 4; 8 in down+combine measured no faster) */
    const dim3 g2((unsigned)((rows + 15) / 16), (unsigned)(n * k));
    smem_optin(k_xgu_mx4<2>, mx_gu_smem(wg) + rs);
    cu_launch(cx, k_xgu_mx4<2>, g2, dim3(256), mx_gu_smem(wg) + rs, *wg, *wu, rows, ids, k, x, h, bg, bu, a, r);
    return;
  }
#define GU_GO(R_)                                                                                                  \
  do {                                                                                                             \
    smem_optin(k_xgu_fast<R_>, gu_smem(wg, R_) + rs);                                                              \
    cu_launch(cx, k_xgu_fast<R_>, grid, dim3(256), gu_smem(wg, R_) + rs, *wg, *wu, rows, ids, k, x, h, bg, bu, a, \
              r);                                                                                                  \
  } while (0)
  if (R == 2 && F == XF_Q4) GU_GO(2);
  else if (R == 1 && F == XF_Q4) GU_GO(1);
  else cu_launch(cx, k_xgu_any, grid, dim3(256), 0, *wg, *wu, rows, ids, k, x, h, bg, bu, a);
#undef GU_GO
}

bool cu_experts_dc_ok(const cu_weight *w, int64_t rows) { return rows > 0 && w->rows % rows == 0 && w->cols % 4 == 0; }

void cu_experts_dc(const cu_ctx *cx, const cu_weight *w, int64_t rows, const int32_t *ids, const float *wts, int n,
                   int k, const float *h, const float *bias, float *out) {
  const int R = dc_rows(w, k), F = fast_fmt(w);
  if (F == XF_MX4 && mx_dc_smem(w, k) <= SMEM_MAX) {
    smem_optin(k_xdc_mx4<2>, mx_dc_smem(w, k));
    cu_launch(cx, k_xdc_mx4<2>, dim3((unsigned)((rows + 7) / 8), (unsigned)n), dim3(128), mx_dc_smem(w, k), *w, rows, ids,
              wts, k, h, bias, out);
    return;
  }
  const dim3 grid((unsigned)((rows + 8 * (R ? R : 1) - 1) / (8 * (R ? R : 1))), (unsigned)n);
#define DC_GO(R_)                                                                                                  \
  do {                                                                                                             \
    smem_optin(k_xdc_fast<R_>, dc_smem(w, k, R_));                                                                 \
    cu_launch(cx, k_xdc_fast<R_>, grid, dim3(256), dc_smem(w, k, R_), *w, rows, ids, wts, k, h, bias, out);    \
  } while (0)
  if (R == 2 && F == XF_Q4) DC_GO(2);
  else if (R == 1 && F == XF_Q4) DC_GO(1);
  else cu_launch(cx, k_xdc_any, grid, dim3(256), 0, *w, rows, ids, wts, k, h, bias, out);
#undef DC_GO
}
