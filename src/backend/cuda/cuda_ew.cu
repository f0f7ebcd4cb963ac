/* Elementwise and row kernels of the op table: rmsnorm (with the residual add before it), layernorm,
 * RoPE (and its position-dependent variant), the KV-cache store (and RoPE of q and k fused with it), silu/gelu gating, adds, scaling, softcap
 * and the gather of output rows. */
#include <math.h>
#include "backend/cuda/cuda_ew.cuh"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/kv_quant.h"


__global__ void k_rmsnorm(float *out, const float *x, const float *w, int dim, float eps, float off) {
  const float *xr = x + (int64_t)blockIdx.x * dim;
  float *o = out + (int64_t)blockIdx.x * dim;
  float ss = 0.f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) ss = fmaf(xr[j], xr[j], ss);
  __shared__ float red[32];
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)dim + eps);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * inv * (w[j] + off);
}

/* x += a (residual add), then out = rmsnorm(x): one block per row */
__global__ void k_add_rmsnorm(float *out, float *x, const float *a, const float *w, int dim, float eps, float off) {
  float *xr = x + (int64_t)blockIdx.x * dim;
  const float *ar = a + (int64_t)blockIdx.x * dim;
  float *o = out + (int64_t)blockIdx.x * dim;
  float ss = 0.f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = xr[j] + ar[j];
    xr[j] = v;
    ss = fmaf(v, v, ss);
  }
  __shared__ float red[32];
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)dim + eps);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * inv * (w[j] + off);
}

__global__ void k_rope(float *x, const int32_t *pos, const float *inv, int n_tokens, int nh, int hd, int half) {
  int64_t total = (int64_t)n_tokens * nh * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    int i = (int)(idx % half);
    int64_t th = idx / half;
    int t = (int)(th / nh);
    float a = (float)pos[t] * inv[i], sn, cs;
    sincosf(a, &sn, &cs);
    float *v = x + th * hd;
    float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * cs - x1 * sn;
    v[i + half] = x0 * sn + x1 * cs;
  }
}

/* LayerNorm: one block per row; mean, then variance of (x - mean), in float */
__global__ void k_layernorm(float *out, const float *x, const float *w, const float *b, int dim, float eps) {
  const float *xr = x + (int64_t)blockIdx.x * dim;
  float *o = out + (int64_t)blockIdx.x * dim;
  __shared__ float red[32];
  __shared__ float stat;
  float s = 0.f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) s += xr[j];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) stat = v / (float)dim;
  }
  __syncthreads();
  const float mean = stat;
  float ss = 0.f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) { float d = xr[j] - mean; ss = fmaf(d, d, ss); }
  ss = warp_sum(ss);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) stat = 1.0f / sqrtf(v / (float)dim + eps);
  }
  __syncthreads();
  const float inv = stat;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = (xr[j] - mean) * inv * w[j] + (b ? b[j] : 0.f);
}

/* RoPE with a frequency row per position range, scaled rotated dims and the Llama-4 query scaling
 * (backend.h sm_rope_ext): one thread per (token, head, pair); the whole-head scaling of the pass
 * dims by the threads of pairs i < hd - rot */
__global__ void k_rope_ext(float *x, const int32_t *pos, cu_rope_ext_args a, int n_tokens, int nh, int hd) {
  const int half = a.rot / 2, npass = hd - a.rot, per = half > npass ? half : npass;
  const int64_t total = (int64_t)n_tokens * nh * per;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    const int i = (int)(idx % per);
    const int64_t th = idx / per;
    const int t = (int)(th / nh);
    const int p = pos[t];
    const float all = a.beta > 0.f ? 1.f + a.beta * logf(1.f + floorf((float)p / (float)a.beta_pos)) : 1.f;
    float *v = x + th * hd;
    if (i < half) {
      const int row = p < a.pos0 ? 0 : min(p - a.pos0 + 1, a.n_rows - 1);
      float sn, cs;
      sincosf((float)p * a.inv[(int64_t)row * half + i], &sn, &cs);
      const float x0 = v[i], x1 = v[i + half], m = a.mscale * all;
      v[i] = (x0 * cs - x1 * sn) * m;
      v[i + half] = (x0 * sn + x1 * cs) * m;
    }
    if (i < npass && all != 1.f) v[a.rot + i] *= all;
  }
}

static __device__ __forceinline__ int64_t kv_slot(const int32_t *table, int max_blocks, int bs, int nblocks, int s,
                                                  int p) {
  if (p < 0) return -1;
  int bi = p / bs;
  if (bi >= max_blocks) return -1;
  int blk = table[(int64_t)s * max_blocks + bi];
  if (blk < 0 || blk >= nblocks) return -1;
  return (int64_t)blk * bs + p % bs;
}

template <typename KT>
__global__ void k_kv_store(KT *K, KT *V, const float *k, const float *v, const int32_t *pos, const int32_t *seq,
                           const int32_t *table, int n_tokens, int row, int max_blocks, int bs, int nblocks) {
  int64_t total = (int64_t)n_tokens * row;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    int t = (int)(idx / row), e = (int)(idx % row);
    int64_t sl = kv_slot(table, max_blocks, bs, nblocks, seq[t], pos[t]);
    if (sl < 0) continue;
    K[sl * row + e] = kv_from_f<KT>(k[idx]);
    V[sl * row + e] = kv_from_f<KT>(v[idx]);
  }
}

/* kv_store into a q8_0 / q4_0 cache: one warp a group of 32 values of one head row of K or V (lane =
 * value), the same arithmetic as sm_kv_quantize_row (IEEE division and reciprocal, round to nearest
 * even, the f16 scale saturated, NaN values stored as 0, q4_0's scale from the first value of
 * largest magnitude) so that both backends hold the same bytes; the last group's lane 0 zeroes the
 * row's padding */
template <typename KT>
__global__ void k_kv_store_q(KT *K, KT *V, const float *k, const float *v, const int32_t *pos, const int32_t *seq,
                             const int32_t *table, int n_tokens, int nkv, int hd, int max_blocks, int bs, int nblocks) {
  const int ng = (hd + 31) / 32, lane = threadIdx.x & 31;
  const int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  if (w >= (int64_t)n_tokens * nkv * ng * 2) return;
  const bool isv = w & 1;
  const int g = (int)((w >> 1) % ng), h = (int)((w >> 1) / ng % nkv), t = (int)((w >> 1) / ng / nkv);
  const int64_t sl = kv_slot(table, max_blocks, bs, nblocks, seq[t], pos[t]);
  if (sl < 0) return;
  const int i = g * 32 + lane, so = kv_scale_off<KT>(hd), hb = kv_head_bytes<KT>(hd);
  const bool in = i < hd;
  const float x = in ? (isv ? v : k)[((int64_t)t * nkv + h) * hd + i] : 0.f;
  char *row = (char *)(isv ? V : K) + (sl * nkv + h) * (int64_t)hb;
  /* the largest magnitude (NaN never wins) and, for q4_0, the first lane holding it */
  const float ax = x == x ? fabsf(x) : 0.f;
  float amax = ax;
#pragma unroll
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  float d;
  __half s16;
  if constexpr (std::is_same<KT, kv_q8>::value) {
    s16 = __float2half_rn(fminf(__fdiv_rn(amax, 127.f), 65504.f));
  } else {
    const unsigned first = __ffs(__ballot_sync(0xffffffffu, amax > 0.f && ax == amax)) - 1;
    const float mx = amax > 0.f ? __shfl_sync(0xffffffffu, x, first & 31) : 0.f;
    const float dr = __fdiv_rn(-mx, 8.f);
    s16 = __float2half_rn(copysignf(fminf(fabsf(dr), 65504.f), dr));
  }
  d = __half2float(s16);
  if constexpr (std::is_same<KT, kv_q8>::value) {
    const float id = d > 0.f ? __frcp_rn(d) : 0.f;
    float q = rintf(__fmul_rn(x, id));
    q = q > 127.f ? 127.f : q < -127.f ? -127.f : q == q ? q : 0.f;
    if (in) row[i] = (char)(int)q;
  } else {
    const float id = d != 0.f ? __frcp_rn(d) : 0.f;
    float q = rintf(__fmul_rn(x, id)) + 8.f;
    q = q > 15.f ? 15.f : q < 0.f ? 0.f : q == q ? q : 8.f;
    const unsigned c = in ? (unsigned)q : 0u, hi = __shfl_down_sync(0xffffffffu, c, 1);
    if (in && !(lane & 1)) row[i / 2] = (char)(c | hi << 4);
  }
  if (lane == 0) {
    ((__half *)(row + so))[g] = s16;
    if (g == ng - 1)
      for (int b = so + 2 * ng; b < hb; b++) row[b] = 0;
  }
}

/* rope(q) + rope(k) + kv_store(k, v) of one decode/prefill step in one launch (same math
 * as k_rope and k_kv_store). Index space: q rotation pairs, then every k/v element. */
template <typename KT>
__global__ void k_rope_qk_store(float *q, float *k, const float *v, KT *Kc, KT *Vc, const int32_t *pos,
                                const int32_t *seq, const int32_t *table, const float *invq, const float *invk,
                                int n_tokens, int nh, int nkv, int hd, int halfq, int halfk, int max_blocks, int bs,
                                int nblocks, cu_rope_rows rr) {
  const int64_t nq = (int64_t)n_tokens * nh * halfq, row = (int64_t)nkv * hd;
  const int64_t total = nq + (int64_t)n_tokens * row;
  pdl_trigger();
  pdl_wait();
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    if (idx < nq) {
      int i = (int)(idx % halfq);
      int64_t th = idx / halfq;
      int t = (int)(th / nh);
      const int p = pos[t], r = p < rr.pos0 ? 0 : min(p - rr.pos0 + 1, rr.n_rows - 1);
      float a = (float)p * invq[(int64_t)r * halfq + i], sn, cs;
      sincosf(a, &sn, &cs);
      float *x = q + th * hd;
      float x0 = x[i], x1 = x[i + halfq];
      x[i] = (x0 * cs - x1 * sn) * rr.mq;
      x[i + halfq] = (x0 * sn + x1 * cs) * rr.mq;
      continue;
    }
    const int64_t j = idx - nq;
    const int t = (int)(j / row), e = (int)(j % row), d = e % hd;
    const int64_t sl = kv_slot(table, max_blocks, bs, nblocks, seq[t], pos[t]);
    if (sl >= 0) Vc[sl * row + e] = kv_from_f<KT>(v[j]);
    if (d < halfk) {
      const int p = pos[t], r = p < rr.pos0 ? 0 : min(p - rr.pos0 + 1, rr.n_rows - 1);
      float a = (float)p * invk[(int64_t)r * halfk + d], sn, cs;
      sincosf(a, &sn, &cs);
      float x0 = k[j], x1 = k[j + halfk];
      float r0 = (x0 * cs - x1 * sn) * rr.mk, r1 = (x0 * sn + x1 * cs) * rr.mk;
      k[j] = r0;
      k[j + halfk] = r1;
      if (sl >= 0) { Kc[sl * row + e] = kv_from_f<KT>(r0); Kc[sl * row + e + halfk] = kv_from_f<KT>(r1); }
    } else if (d >= 2 * halfk) {
      if (sl >= 0) Kc[sl * row + e] = kv_from_f<KT>(k[j]);
    }
  }
}

#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
__global__ void k_silu_mul(float *o, const float *g, const float *u, size_t n) {
  GRID_STRIDE(i, n) o[i] = cu_silu(g[i]) * u[i];
}
__global__ void k_gelu_mul(float *o, const float *g, const float *u, size_t n) {
  GRID_STRIDE(i, n) o[i] = cu_gelu_tanh(g[i]) * u[i];
}
__global__ void k_add(float *y, const float *x, size_t n) { GRID_STRIDE(i, n) y[i] += x[i]; }
__global__ void k_add_rows(float *y, const float *b, size_t n, int dim) { GRID_STRIDE(i, n) y[i] += b[i % dim]; }
__global__ void k_scale(float *y, float s, size_t n) { GRID_STRIDE(i, n) y[i] *= s; }
__global__ void k_softcap(float *y, float cap, size_t n) {
  float inv = 1.f / cap;
  GRID_STRIDE(i, n) y[i] = cap * tanhf(y[i] * inv);
}
__global__ void k_gather(float *dst, const float *src, const int32_t *rows, int n_out, int dim) {
  size_t n = (size_t)n_out * dim;
  GRID_STRIDE(i, n) {
    size_t r = i / dim, j = i % dim;
    dst[i] = src[(size_t)rows[r] * dim + j];
  }
}

static int norm_threads(int dim) { return dim >= 1024 ? 512 : dim >= 256 ? 256 : dim >= 64 ? 64 : 32; }
void cu_rmsnorm(const cu_ctx *cx, float *out, const float *x, const float *w, int n, int dim, float eps, float off) {
  k_rmsnorm<<<n, norm_threads(dim), 0, cx->s>>>(out, x, w, dim, eps, off);
}
void cu_add_rmsnorm(const cu_ctx *cx, float *out, float *x, const float *a, const float *w, int n, int dim, float eps,
                    float off) {
  k_add_rmsnorm<<<n, norm_threads(dim), 0, cx->s>>>(out, x, a, w, dim, eps, off);
}
void cu_rope(const cu_ctx *cx, float *x, const int32_t *pos, const float *inv, int n_tokens, int nh, int hd, int rot) {
  const int64_t total = (int64_t)n_tokens * nh * (rot / 2);
  k_rope<<<cu_ew_blocks((size_t)total), 256, 0, cx->s>>>(x, pos, inv, n_tokens, nh, hd, rot / 2);
}
void cu_layernorm(const cu_ctx *cx, float *out, const float *x, const float *w, const float *b, int n, int dim, float eps) {
  k_layernorm<<<n, norm_threads(dim), 0, cx->s>>>(out, x, w, b, dim, eps);
}
void cu_rope_ext(const cu_ctx *cx, float *x, const int32_t *pos, const cu_rope_ext_args *a, int n_tokens, int nh, int hd) {
  const int half = a->rot / 2, npass = hd - a->rot;
  const int64_t total = (int64_t)n_tokens * nh * (half > npass ? half : npass);
  if (total > 0) k_rope_ext<<<cu_ew_blocks((size_t)total), 256, 0, cx->s>>>(x, pos, *a, n_tokens, nh, hd);
}
void cu_kv_store(const cu_ctx *cx, const cu_kv_dst *d, const float *k, const float *v, int n_tokens) {
  if (sm_kv_quantized(d->dt)) {
    const int nkv = d->row / d->hd;
    const size_t warps = (size_t)n_tokens * nkv * ((d->hd + 31) / 32) * 2;
    const unsigned blocks = (unsigned)((warps + 7) / 8);
    if (d->dt == SM_DT_Q8_0)
      k_kv_store_q<kv_q8><<<blocks, 256, 0, cx->s>>>((kv_q8 *)d->K, (kv_q8 *)d->V, k, v, d->pos, d->seq, d->table,
                                                    n_tokens, nkv, d->hd, d->max_blocks, d->bs, d->nblocks);
    else
      k_kv_store_q<kv_q4><<<blocks, 256, 0, cx->s>>>((kv_q4 *)d->K, (kv_q4 *)d->V, k, v, d->pos, d->seq, d->table,
                                                    n_tokens, nkv, d->hd, d->max_blocks, d->bs, d->nblocks);
    return;
  }
  const size_t total = (size_t)n_tokens * d->row;
  CU_KV_DISPATCH(d->dt, k_kv_store<KT><<<cu_ew_blocks(total), 256, 0, cx->s>>>(
                            (KT *)d->K, (KT *)d->V, k, v, d->pos, d->seq, d->table, n_tokens, d->row, d->max_blocks,
                            d->bs, d->nblocks));
}
void cu_rope_qk_store(const cu_ctx *cx, const cu_kv_dst *d, float *q, float *k, const float *v, const float *invq,
                      const float *invk, int n_tokens, int nh, int nkv, int hd, int rotq, int rotk,
                      const cu_rope_rows *rows) {
  const cu_rope_rows rr = rows ? *rows : cu_rope_rows{ 1, 0, 1.f, 1.f };
  const size_t total = (size_t)n_tokens * nh * (rotq / 2) + (size_t)n_tokens * d->row;
  CU_KV_DISPATCH(d->dt, cu_launch(cx, k_rope_qk_store<KT>, dim3(cu_ew_blocks(total)), dim3(256), 0, q, k, v,
                                  (KT *)d->K, (KT *)d->V, d->pos, d->seq, d->table, invq, invk, n_tokens, nh, nkv, hd,
                                  rotq / 2, rotk / 2, d->max_blocks, d->bs, d->nblocks, rr));
}
void cu_ew(const cu_ctx *cx, int kind, float *y, const float *a, const float *b, float s, size_t n, int dim) {
  const unsigned g = cu_ew_blocks(n);
  switch (kind) {
  case CU_EW_SILU: k_silu_mul<<<g, 256, 0, cx->s>>>(y, a, b, n); break;
  case CU_EW_GELU: k_gelu_mul<<<g, 256, 0, cx->s>>>(y, a, b, n); break;
  case CU_EW_ADD: k_add<<<g, 256, 0, cx->s>>>(y, a, n); break;
  case CU_EW_ADD_ROWS: k_add_rows<<<g, 256, 0, cx->s>>>(y, a, n, dim); break;
  case CU_EW_SCALE: k_scale<<<g, 256, 0, cx->s>>>(y, s, n); break;
  case CU_EW_SOFTCAP: k_softcap<<<g, 256, 0, cx->s>>>(y, s, n); break;
  }
}
void cu_gather(const cu_ctx *cx, float *dst, const float *src, const int32_t *rows, int n_out, int dim) {
  const size_t n = (size_t)n_out * dim;
  if (n) k_gather<<<cu_ew_blocks(n), 256, 0, cx->s>>>(dst, src, rows, n_out, dim);
}
