/* One-token (and small-batch) matrix-vector products of 4-bit weights with int8 activations
 * (CW_Q4, the dp4a kernels of decode): x quantized per 32 values (k_quant_x, or by the kernel
 * before: k_norm_q, decode attention, k_mlp1), k_mvq4 (rows streamed, several a thread), k_mvr
 * (a block's whole weight slice held in registers, all of it requested before the wait), k_gu_q4
 * (gate and up with silu(gate) * up quantized for the down projection), and their dispatch by
 * role and shape. Defaults measured on the H100 (docs/cuda.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_ldst.cuh"
#include "backend/cuda/cuda_mv.cuh"
#include "backend/cuda/cuda_q4.cuh"
#include "backend/cuda/cuda_q4dev.cuh"
#include "backend/cuda/cuda_qmma_dev.cuh"

/* ---------------- 4-bit x int8 dp4a matvec (CW_Q4, 1 <= n <= 64) ----------------
 * x is quantized once per call (k_quant_x): per 32 values d = max|x|/127, q = rint(x/d),
 * plus the exact float sum S of the 32 values. The int8s are stored in the order the weight
 * nibbles unpack to: for each 8-value word j of the block, the int32s
 * [x0 x2 x4 x6] and [x1 x3 x5 x7], so that  w & 0x0F0F0F0F  (nibbles 0,2,4,6) and
 * (w >> 4) & 0x0F0F0F0F  (nibbles 1,3,5,7) feed dp4a directly. Per 32-value block of a row:
 *   y += scale * d * dot(q_w, q_x) + bias * S
 * (the bias term is exact; the error is the int8 rounding of x: |x - d q_x| <= d/2). */
__global__ void __launch_bounds__(256) k_quant_x(const float *__restrict__ x, const float *__restrict__ xu,
                                                 int64_t nblk, uint8_t *__restrict__ xq, float2 *__restrict__ xs,
                                                 int gelu) {
  const int lane = threadIdx.x & 31;
  const int64_t b = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  pdl_trigger();
  pdl_wait();
  if (b >= nblk) return;
  float v = __ldca(x + b * 32 + lane);
  if (xu) v = (gelu ? cu_gelu_tanh(v) : cu_silu(v)) * __ldca(xu + b * 32 + lane);
  quant_x32(v, lane, b, xq, xs);
}

/* UNR vectors of each of the RB rows are loaded before any is used (UNR*RB independent
 * 16-byte loads in flight per thread); threads per row (tpr) are chosen so that one or two
 * such rounds cover a row */
/* GLU epilogue (gate/up pair, glu.cnt != NULL; measured slower than k_quant_x before the down
 * projection and never launched: the launcher passes glu.cnt = NULL and mv_args.pf = 0, but the code
 * stays, as compiling it out changes ptxas's register allocation of the n = 1 variants at their
 * register caps, 16-116 bytes of spills, docs/cuda.md): weights 0 and 1 are gate and up with M rows
 * each (M % 32 == 0, rows per block divide 32); the last block to finish a 32-row chunk of
 * both (atomic counter per chunk, reset by it) writes silu(gate) * up of the chunk in the
 * int8 x layout (k_quant_x) for the down projection. */
struct glu_args {
  int *cnt;
  uint8_t *hq;
  float2 *hs;
};
static __device__ __forceinline__ void glu_finish(const mv_args &a, const glu_args &glu, int rowb, int rpb, int n,
                                                  int nch) {
  __shared__ int last;
  const int M = a.M[0], chunk = rowb >> 5;
  const int need = 2 * (32 / rpb) * nch;
  /* the barrier orders the block's y writes before thread 0's fence + atomic (a release, which is
   * cumulative); thread 0's fence after it and the second barrier order the other blocks' writes
   * before the reads below (measured: 8B 2.48 vs 2.51 ms a step against a fence in every thread) */
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence(); /* release: fence + relaxed atomic */
    last = atomicAdd(glu.cnt + chunk, 1) == need - 1;
    if (last) {
      __threadfence(); /* acquire */
      glu.cnt[chunk] = 0;
    }
  }
  __syncthreads();
  if (!last) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int V = M >> 5;
  for (int c = warp; c < n; c += 4) {
    const int64_t i = (int64_t)c * M + chunk * 32 + lane;
    const float g = __ldcg(a.y[0] + i), u = __ldcg(a.y[1] + i);
    float v = cu_silu(g) * u;
    float am = fabsf(v), sum = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    int qi = am > 0.f ? __float2int_rn(v * (127.f / am)) : 0;
    qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
    const int64_t b = (int64_t)c * V + chunk;
    const int j = lane >> 3, e = lane & 7;
    glu.hq[b * 32 + (2 * j + (e & 1)) * 4 + (e >> 1)] = (uint8_t)(int8_t)qi;
    if (lane == 0) glu.hs[b] = make_float2(am * (1.f / 127.f), sum);
  }
}

#ifdef SMELT_CUDA_TRACE
__device__ unsigned long long *tr_m;
/* k_mvq4 launches with one weight of 4096 x 4096 (o projection of the 8B shape): [4] launches,
 * [32..35] block 0 of the target launch ([1]), [5] last block exit (max); q/k/v launches (3
 * weights) keep [2] = last block exit */
#endif
void cu_q4_set_trace(unsigned long long *buf) {
#ifdef SMELT_CUDA_TRACE
  cudaMemcpyToSymbol(tr_m, &buf, sizeof buf);
#else
  (void)buf;
#endif
}

template <int N, int RB, int UNR, int MINB = 1>
__global__ void __launch_bounds__(128, MINB) k_mvq4(const mv_args a, const uint4 *__restrict__ xq,
                                              const float2 *__restrict__ xs, int K, int lg, int sbk, int n, int tl,
                                              int nch, const glu_args glu) {
  __shared__ float red[4][RB * N];
  const int tile = (int)blockIdx.x / nch, c0 = ((int)blockIdx.x % nch) * N;
  const int wi = tile >= a.bstart[2] ? 2 : tile >= a.bstart[1] ? 1 : 0;
  const uint4 *__restrict__ q = (const uint4 *)(wi == 0 ? a.q[0] : wi == 1 ? a.q[1] : a.q[2]);
  const void *__restrict__ sb = wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2];
  float *__restrict__ y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int bst = wi == 0 ? a.bstart[0] : wi == 1 ? a.bstart[1] : a.bstart[2];
  const int tpr = 1 << tl, grp = threadIdx.x >> tl, tt = threadIdx.x & (tpr - 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rowb = (tile - bst) * ((128 >> tl) * RB), row0 = rowb + grp * RB;
  const int V = K >> 5, G = V >> lg;
  int64_t rows[RB];
#pragma unroll
  for (int r = 0; r < RB; r++) rows[r] = row0 + r < M ? row0 + r : M - 1;
  float acc[RB][N];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int c = 0; c < N; c++) acc[r][c] = 0.f;
  constexpr int MK = 0x0F0F0F0F;
#ifdef SMELT_CUDA_TRACE
  const bool tro = tr_m && N == 1 && a.bstart[1] == 0x7fffffff && a.M[0] == 4096 && K == 4096;
  const bool trq = tr_m && N == 1 && a.bstart[2] != 0x7fffffff;
  bool trk = false;
  if (tro && blockIdx.x == 0 && threadIdx.x == 0) {
    const unsigned long long t0 = tr_now();
    trk = atomicAdd(tr_m + 4, 1ull) == tr_m[1];
    if (trk) tr_m[32] = t0;
  }
#endif
  pdl_trigger();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* weights do not depend on the previous kernel: while it finishes, this block's rows (contiguous
   * in memory) are requested into L2, so that memory is busy across the kernel boundary */
  if (N == 1 && a.pf && threadIdx.x == 0 && rowb < M) {
    const int nr = min((128 >> tl) * RB, M - rowb);
    long long qn = (long long)nr * V * 16, sn = (long long)nr * G * (sbk == SBK_F32 ? 8 : 4);
    if (a.pf > 0 && qn > a.pf) qn = a.pf;
    if (a.pf > 0 && sn > a.pf / 8) sn = a.pf / 8;
    const char *qa = (const char *)(q + (int64_t)rowb * V);
    const char *sa = (const char *)sb + (int64_t)rowb * G * (sbk == SBK_F32 ? 8 : 4);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(qa), "r"((unsigned)qn) : "memory");
    sn &= ~15LL;
    if (!((uintptr_t)sa & 15) && sn > 0)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(sa), "r"((unsigned)sn) : "memory");
  }
#endif
  uint4 raw[UNR][RB];
  float2 p[UNR][RB];
  float4 dn_v = make_float4(0.f, 0.f, 0.f, 0.f); /* deferred rmsnorm: this lane's share of the partial sums of squares */
  uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (a.hint >= 3 || a.ef) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
  const int hint = (a.ef & 1) && a.hint < 3 ? (a.hint == 1 ? 4 : 3) : a.hint;
  const bool efs = a.ef & 2;
  /* the first round of weight loads is issued before waiting for the previous kernel */
  for (int v0 = tt, first = 1; v0 < V; v0 += UNR * tpr, first = 0) {
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int v = v0 + u * tpr;
#pragma unroll
      for (int r = 0; r < RB; r++) raw[u][r] = v < V ? ld_stream_h(q + rows[r] * V + v, hint, pol) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int v = v0 + u * tpr;
#pragma unroll
      for (int r = 0; r < RB; r++) p[u][r] = v < V ? load_sb_p(sb, rows[r] * G + (v >> lg), sbk, efs, pol) : make_float2(0.f, 0.f);
    }
    if (first) {
      pdl_wait();
      if (N == 1 && a.ssp) dn_v = dn_load(a.ssp, a.nss, lane);
#ifdef SMELT_CUDA_TRACE
      if (trk) {
        tr_m[33] = tr_now();
        tr_m[34] = *(volatile unsigned long long *)(tr_m + 3);
      }
#endif
    }
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int v = v0 + u * tpr;
      if (v >= V) break;
#pragma unroll
      for (int c = 0; c < N; c++) {
        const int col = c0 + c < n ? c0 + c : n - 1;
        const int64_t xi = (int64_t)col * V + v;
        const uint4 x0 = __ldca(xq + 2 * xi), x1 = __ldca(xq + 2 * xi + 1);
        const float2 xd = __ldca(xs + xi);
#pragma unroll
        for (int r = 0; r < RB; r++) {
          int d = __dp4a((int)(raw[u][r].x & MK), (int)x0.x, 0);
          d = __dp4a((int)((raw[u][r].x >> 4) & MK), (int)x0.y, d);
          d = __dp4a((int)(raw[u][r].y & MK), (int)x0.z, d);
          d = __dp4a((int)((raw[u][r].y >> 4) & MK), (int)x0.w, d);
          d = __dp4a((int)(raw[u][r].z & MK), (int)x1.x, d);
          d = __dp4a((int)((raw[u][r].z >> 4) & MK), (int)x1.y, d);
          d = __dp4a((int)(raw[u][r].w & MK), (int)x1.z, d);
          d = __dp4a((int)((raw[u][r].w >> 4) & MK), (int)x1.w, d);
          acc[r][c] = fmaf(p[u][r].x, (float)d * xd.x, fmaf(p[u][r].y, xd.y, acc[r][c]));
        }
      }
    }
  }
  pdl_wait(); /* threads without a vector still write y below */
  float vals[RB * N];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int c = 0; c < N; c++) vals[r * N + c] = warp_sum(acc[r][c]);
  if (N == 1 && a.ssp) { /* deferred rmsnorm: the same inverse as k_norm_q's in every warp */
    if (tt >= V) dn_v = dn_load(a.ssp, a.nss, lane); /* lanes that had no vector */
    const float inv = 1.0f / sqrtf(warp_sum(dn_sum(dn_v)) / a.dn_dim + a.dn_eps);
#pragma unroll
    for (int i = 0; i < RB * N; i++) vals[i] *= inv;
  }
  if (tl == 5) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < RB; r++)
#pragma unroll
        for (int c = 0; c < N; c++)
          if (row0 + r < M && c0 + c < n) y[(int64_t)(c0 + c) * M + row0 + r] = vals[r * N + c] + mv_bias(a, wi, row0 + r);
    }
  } else {
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < RB * N; i++) red[warp][i] = vals[i];
    }
    __syncthreads();
    const int wpg = tpr >> 5;
    for (int i = threadIdx.x; i < (128 >> tl) * RB * N; i += 128) {
      const int gi = i / (RB * N), k = i % (RB * N);
      float sum = 0.f;
      for (int w = 0; w < wpg; w++) sum += red[gi * wpg + w][k];
      const int r = k / N, c = k % N, row = rowb + gi * RB + r;
      if (row < M && c0 + c < n) y[(int64_t)(c0 + c) * M + row] = sum + mv_bias(a, wi, row);
    }
  }
#ifdef SMELT_CUDA_TRACE
  if (threadIdx.x == 0) {
    if (trq) atomicMax(tr_m + 2, tr_now());
    if (tro) {
      atomicMax(tr_m + 5, tr_now());
      if (trk) tr_m[35] = tr_now();
    }
  }
#endif
  if (glu.cnt) glu_finish(a, glu, rowb, (128 >> tl) * RB, n, nch);
}


/* ---------------- one-token matvec with the block's weights held in registers (k_mvr) ----------------
 * Warp w of a block owns RT consecutive rows, lane l the 16-byte vectors l + 32 k (k < VT) of
 * each row (and their scale/bias words): every weight load of the block is issued before the
 * wait, so a matvec queued behind a latency-bound kernel (decode attention, a norm) has its whole
 * weight slice in flight while that kernel runs, and after the wait only x (staged once in shared
 * memory) and the dot products remain. Same arithmetic as k_mvq4, with its deferred rmsnorm (a.ssp: the
 * rows scaled by 1 / rms of the partial sums of squares the kernel before left). Needs V = K/32 <= 32 VT and
 * 16-bit scales; VT = ceil(V / 32) in 1..4, 8, 14. Tuning mvr: bit mask of CU_Q4_* roles that use it (n = 1). */
template <int VT, int RT, int NW>
__global__ void __launch_bounds__(NW * 32, NW * 32 >= 512 ? 1 : 512 / (NW * 32)) /* <= 128 registers */
    k_mvr(const mv_args a, const uint4 *__restrict__ xq, const float2 *__restrict__ xs, int K, int lg, int sbk) {
  __shared__ uint4 xa[32 * VT], xb[32 * VT];
  __shared__ float2 xd[32 * VT];
  const int tile = blockIdx.x;
  const int wi = tile >= a.bstart[2] ? 2 : tile >= a.bstart[1] ? 1 : 0;
  const uint4 *__restrict__ q = (const uint4 *)(wi == 0 ? a.q[0] : wi == 1 ? a.q[1] : a.q[2]);
  const uint32_t *__restrict__ sb = (const uint32_t *)(wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2]);
  float *__restrict__ y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int bst = wi == 0 ? a.bstart[0] : wi == 1 ? a.bstart[1] : a.bstart[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int V = K >> 5, G = V >> lg;
  const int row0 = (tile - bst) * (NW * RT) + warp * RT;
#ifdef SMELT_CUDA_TRACE
  const bool tro = tr_m && a.bstart[1] == 0x7fffffff && a.M[0] == 4096 && K == 4096;
  const bool trq = tr_m && a.bstart[2] != 0x7fffffff;
  const unsigned long long tr_t0 = tr_m ? tr_now() : 0;
  unsigned long long tr_ld = 0;
  bool trk = false;
  if (tro && threadIdx.x == 0) {
    if (blockIdx.x == 0) {
      trk = atomicAdd(tr_m + 4, 1ull) == tr_m[1];
      if (trk) tr_m[32] = tr_t0;
    }
  }
#endif
  pdl_trigger();
  uint4 w[RT][VT];
  uint32_t p[RT][VT];
  uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (a.ef) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
#pragma unroll
  for (int r = 0; r < RT; r++) {
    const int64_t row = row0 + r < M ? row0 + r : M - 1;
#pragma unroll
    for (int k = 0; k < VT; k++) {
      const int v = lane + 32 * k;
      w[r][k] = v < V ? ((a.ef & 1) ? ld_stream_p(q + row * V + v, pol) : ld_stream(q + row * V + v)) : make_uint4(0, 0, 0, 0);
    }
  }
#pragma unroll
  for (int r = 0; r < RT; r++) {
    const int64_t row = row0 + r < M ? row0 + r : M - 1;
#pragma unroll
    for (int k = 0; k < VT; k++) {
      const int v = lane + 32 * k;
      p[r][k] = v < V ? ((a.ef & 2) ? ldg_p(sb + row * G + (v >> lg), pol) : __ldg(sb + row * G + (v >> lg))) : 0u;
    }
  }
#ifdef SMELT_CUDA_TRACE
  if (tro) { /* diagnostic: wait for this block's weights, record when the last block had them */
    uint32_t z = 0;
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
      for (int k = 0; k < VT; k++) z |= w[r][k].x | p[r][k];
    __syncthreads();
    if (z != 0x9e3779b9u) tr_ld = tr_now();
  }
#endif
  pdl_wait();
  const float4 dn_v = a.ssp ? dn_load(a.ssp, a.nss, lane) : make_float4(0.f, 0.f, 0.f, 0.f);
#ifdef SMELT_CUDA_TRACE
  if (trk) {
    tr_m[33] = tr_now();
    tr_m[34] = *(volatile unsigned long long *)(tr_m + 3);
  }
  /* blocks of the o launch of the traced layer: entered within 50 us of its attention's block 0 */
  const unsigned long long ta = tro ? *(volatile unsigned long long *)(tr_m + 16) : 0;
  const bool tgt = tro && ta && tr_t0 >= ta && tr_t0 < ta + 50000;
  if (tgt && threadIdx.x == 0) {
    atomicMax(tr_m + 36, tr_t0);
    atomicMax(tr_m + 37, tr_ld);
  }
#endif
  for (int v = threadIdx.x; v < V; v += NW * 32) {
    xa[v] = __ldcg(xq + 2 * v);
    xb[v] = __ldcg(xq + 2 * v + 1);
    xd[v] = __ldcg(xs + v);
  }
  __syncthreads();
  constexpr int MK = 0x0F0F0F0F;
  float acc[RT];
#pragma unroll
  for (int r = 0; r < RT; r++) acc[r] = 0.f;
#pragma unroll
  for (int k = 0; k < VT; k++) {
    const int v = lane + 32 * k;
    if (v >= V) break;
    const uint4 x0 = xa[v], x1 = xb[v];
    const float2 d2 = xd[v];
#pragma unroll
    for (int r = 0; r < RT; r++) {
      const uint4 u = w[r][k];
      int d = __dp4a((int)(u.x & MK), (int)x0.x, 0);
      d = __dp4a((int)((u.x >> 4) & MK), (int)x0.y, d);
      d = __dp4a((int)(u.y & MK), (int)x0.z, d);
      d = __dp4a((int)((u.y >> 4) & MK), (int)x0.w, d);
      d = __dp4a((int)(u.z & MK), (int)x1.x, d);
      d = __dp4a((int)((u.z >> 4) & MK), (int)x1.y, d);
      d = __dp4a((int)(u.w & MK), (int)x1.z, d);
      d = __dp4a((int)((u.w >> 4) & MK), (int)x1.w, d);
      const uint32_t s = p[r][k];
      float2 pp;
      if (sbk == SBK_BF16) pp = make_float2(__uint_as_float(s << 16), __uint_as_float(s & 0xffff0000u));
      else pp = __half22float2(*reinterpret_cast<const __half2 *>(&s));
      acc[r] = fmaf(pp.x, (float)d * d2.x, fmaf(pp.y, d2.y, acc[r]));
    }
  }
  /* deferred rmsnorm: the same inverse as k_norm_q's in every warp */
  const float inv = a.ssp ? 1.0f / sqrtf(warp_sum(dn_sum(dn_v)) / a.dn_dim + a.dn_eps) : 1.f;
#pragma unroll
  for (int r = 0; r < RT; r++) {
    const float t = warp_sum(acc[r]) * inv;
    if (lane == r && row0 + r < M) y[row0 + r] = t + mv_bias(a, wi, row0 + r);
  }
#ifdef SMELT_CUDA_TRACE
  if (threadIdx.x == 0) {
    if (trq) atomicMax(tr_m + 2, tr_now());
    if (tro) {
      if (tgt) atomicMax(tr_m + 38, tr_now());
      if (trk) tr_m[35] = tr_now();
    }
  }
#endif
}

/* launches k_mvr for n = 1 when it applies (layout, role mask), else returns false */
/* automatic choice, from in-graph A/Bs on the H100 (docs/benchmarks.md): lm_head (1B 0.546 vs
 * 0.569-0.573 ms a step, 8B equal) and gate/up of >= 32 Mi elements (8B 2.301 vs 2.325-2.334 ms
 * with k_gu_q4); q/k/v (8B 2.396 vs 2.33), o (equal) and down (2.352) measured slower */
/* the automatic roles (measured on the H100, docs/cuda.md): the lm_head, large gate/up, and the q/k/v, o and
 * gate/up projections of at most mvr_kmax inputs (Gemma-3-4B, Phi-4-mini, Llama-3.2-1B/3B; not the 8B shapes) */
static bool mvr_on(const cu_ctx *cx, int role, const cu_weight *w) {
  if (cx->t->mvr >= 0) return (cx->t->mvr >> role) & 1;
  if (role == CU_Q4_LM) return true;
  if ((role == CU_Q4_QKV || role == CU_Q4_O || role == CU_Q4_GU) && w->cols <= cx->t->mvr_kmax) return true;
  return role == CU_Q4_GU && w->rows * w->cols >= ((int64_t)32 << 20);
}
static bool mvr_launch(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const uint4 *xq,
                       const float2 *xs, int role, bool dry = false, const cu_q4_dnorm *dn = NULL,
                       const float *const *bias = NULL) {
  if (role < 0 || role >= CU_Q4_ROLES || nw < 1 || nw > 3 || !mvr_on(cx, role, ws[0])) return false;
  const cu_weight *w0 = ws[0];
  if (w0->kind != CW_Q4 || w0->sbk == SBK_F32 || w0->cols % 64 || w0->cols > 16384 || w0->cols < 1024) return false;
  for (int i = 0; i < nw; i++)
    if (ws[i]->kind != CW_Q4 || ws[i]->cols != w0->cols || ws[i]->sbk != w0->sbk || ws[i]->gs != w0->gs ||
        ws[i]->rows > INT32_MAX)
      return false;
  const int K = (int)w0->cols, V = K / 32, VT = (V + 31) / 32;
  constexpr int NW = 8;
  if (VT > 4 && VT != 8 && VT != 14) return false;
  if (w0->gs != 32 && w0->gs != 64 && w0->gs != 128) return false;
  int RT = VT >= 14 ? 1 : VT >= 8 ? 2 : VT >= 3 ? 4 : 8;
  if (VT == 4) RT = 2; /* two rows a warp for K = 4096: 8B lm_head 481-484 vs 480 tok/s; 1B (VT 2) slower */
  if (dry) return true;
  mv_args a;
  memset(&a, 0, sizeof a);
  a.ef = (cx->t->wef >> 4) & 3;
  if (dn) {
    a.ssp = dn->ssp;
    a.nss = dn->nss;
    a.dn_eps = dn->eps;
    a.dn_dim = (float)dn->dim;
  }
  int nb = 0;
  for (int i = 0; i < 3; i++) {
    a.bstart[i] = i < nw ? nb : 0x7fffffff;
    if (i < nw) {
      a.q[i] = ws[i]->q; a.sb[i] = ws[i]->sb; a.y[i] = ys[i]; a.M[i] = (int)ws[i]->rows;
      a.bias[i] = bias ? bias[i] : NULL;
      nb += (int)((ws[i]->rows + NW * RT - 1) / (NW * RT));
    }
  }
  a.bstart[3] = 0x7fffffff;
  const int lg = w0->gs == 32 ? 0 : w0->gs == 64 ? 1 : 2;
  const int sbk = w0->sbk;
#define MVR_NW(VT_, RT_) cu_launch(cx, k_mvr<VT_, RT_, NW>, dim3(nb), dim3(NW * 32), 0, a, xq, xs, K, lg, sbk)
  switch (VT * 10 + RT) {
  case 44: MVR_NW(4, 4); break;
  case 42: MVR_NW(4, 2); break;
  case 34: MVR_NW(3, 4); break;
  case 32: MVR_NW(3, 2); break;
  case 28: MVR_NW(2, 8); break;
  case 24: MVR_NW(2, 4); break;
  case 22: MVR_NW(2, 2); break;
  case 141: MVR_NW(14, 1); break;
  case 82: MVR_NW(8, 2); break;
  case 81: MVR_NW(8, 1); break;
  case 41: MVR_NW(4, 1); break;
  case 21: MVR_NW(2, 1); break;
  case 18: MVR_NW(1, 8); break;
  case 14: MVR_NW(1, 4); break;
  case 12: MVR_NW(1, 2); break;
  default: return false;
  }
#undef MVR_NW
  cu_count(cx, CU_K_MVR);
  return true;
}

/* ---------------- gate/up + silu(gate)*up quantized, one token (n = 1) ----------------
 * A block of 256 threads owns 32 consecutive rows of both gate and up (8 threads a row, each
 * UNR 16-byte vectors of both rows a round, the first round requested before the wait), so it
 * holds a whole 32-value chunk of h = silu(gate) * up and quantizes it itself into the int8 x
 * layout of k_quant_x (same formulas) for the down projection: no counter, no extra kernel.
 * Also writes gate and up. Needs rows % 32 == 0 and K % 256 == 0. */
/* used where gate weights are >= 32 Mi elements and k_mvr cannot take them (measured on the H100:
 * faster for the 8B shape, not for the 1B one; 4 threads a row, tried, was slower) */
template <int UNR>
__global__ void __launch_bounds__(256, 4) k_gu_q4(const mv_args a, const uint4 *__restrict__ xq,
                                                  const float2 *__restrict__ xs, int K, int lg, int sbk,
                                                  uint8_t *__restrict__ hq, float2 *__restrict__ hs) {
  __shared__ float hsm[32];
  constexpr int TPR = 8;
  const int j = threadIdx.x / TPR, sub = threadIdx.x % TPR;
  const int64_t row = (int64_t)blockIdx.x * 32 + j;
  const int V = K >> 5, G = V >> lg;
  const uint4 *__restrict__ gq = (const uint4 *)a.q[0] + row * V;
  const uint4 *__restrict__ uq = (const uint4 *)a.q[1] + row * V;
  constexpr int MK = 0x0F0F0F0F;
  pdl_trigger();
  float ag = 0.f, au = 0.f;
  uint4 rg[UNR], ru[UNR];
  float2 pg[UNR], pu[UNR];
  for (int v0 = sub, first = 1; v0 < V; v0 += UNR * TPR, first = 0) {
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int v = v0 + u * TPR;
      rg[u] = v < V ? ld_stream_h(gq + v, 1, 0) : make_uint4(0, 0, 0, 0);
      ru[u] = v < V ? ld_stream_h(uq + v, 1, 0) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int v = v0 + u * TPR;
      pg[u] = v < V ? load_sb_rt(a.sb[0], row * G + (v >> lg), sbk) : make_float2(0.f, 0.f);
      pu[u] = v < V ? load_sb_rt(a.sb[1], row * G + (v >> lg), sbk) : make_float2(0.f, 0.f);
    }
    if (first) pdl_wait();
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int v = v0 + u * TPR;
      if (v >= V) break;
      const uint4 x0 = __ldca(xq + 2 * v), x1 = __ldca(xq + 2 * v + 1);
      const float2 xd = __ldca(xs + v);
      int d = __dp4a((int)(rg[u].x & MK), (int)x0.x, 0), e = __dp4a((int)(ru[u].x & MK), (int)x0.x, 0);
      d = __dp4a((int)((rg[u].x >> 4) & MK), (int)x0.y, d); e = __dp4a((int)((ru[u].x >> 4) & MK), (int)x0.y, e);
      d = __dp4a((int)(rg[u].y & MK), (int)x0.z, d);        e = __dp4a((int)(ru[u].y & MK), (int)x0.z, e);
      d = __dp4a((int)((rg[u].y >> 4) & MK), (int)x0.w, d); e = __dp4a((int)((ru[u].y >> 4) & MK), (int)x0.w, e);
      d = __dp4a((int)(rg[u].z & MK), (int)x1.x, d);        e = __dp4a((int)(ru[u].z & MK), (int)x1.x, e);
      d = __dp4a((int)((rg[u].z >> 4) & MK), (int)x1.y, d); e = __dp4a((int)((ru[u].z >> 4) & MK), (int)x1.y, e);
      d = __dp4a((int)(rg[u].w & MK), (int)x1.z, d);        e = __dp4a((int)(ru[u].w & MK), (int)x1.z, e);
      d = __dp4a((int)((rg[u].w >> 4) & MK), (int)x1.w, d); e = __dp4a((int)((ru[u].w >> 4) & MK), (int)x1.w, e);
      ag = fmaf(pg[u].x, (float)d * xd.x, fmaf(pg[u].y, xd.y, ag));
      au = fmaf(pu[u].x, (float)e * xd.x, fmaf(pu[u].y, xd.y, au));
    }
  }
  pdl_wait(); /* threads without a vector */
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) {
    ag += __shfl_xor_sync(0xffffffffu, ag, o);
    au += __shfl_xor_sync(0xffffffffu, au, o);
  }
  if (sub == 0) {
    a.y[0][row] = ag;
    a.y[1][row] = au;
    hsm[j] = cu_silu(ag) * au;
  }
  __syncthreads();
  if (threadIdx.x < 32) { /* the chunk's quantization, as k_quant_x */
    quant_x32(hsm[threadIdx.x], threadIdx.x, blockIdx.x, hq, hs);
  }
}
static bool guq_shape(const cu_weight *g, const cu_weight *u) {
  return g->rows * g->cols >= ((int64_t)32 << 20) && g->kind == CW_Q4 && cu_matvec_compatible(g, u) &&
         g->rows == u->rows && g->rows % 32 == 0 && g->cols % 256 == 0 && g->rows / 32 <= INT32_MAX;
}

/* ---------------- fused (residual add +) rmsnorm (+ int8 x quantization) ----------------
 * One block per row, one float4 per thread and pass (values stay in registers: one read of
 * x and a). With xq: also writes the CW_Q4 x layout of k_quant_x (per 32 values: int8 in
 * nibble order, (max|v|/127, exact sum)) so the next dp4a matvec needs no quantize launch.
 * PRE: a is first normalized itself, a * rms(a)^-1 * (pw + poff) (the output norm of a sandwich:
 * Gemma's post-attention / post-feedforward norm before the residual add). Rows from n1 on are a
 * second norm of the same shape (out2, x2, w2; no a, no xq): the q and k head norms in one launch.
 * With x16: the output also goes, through shared memory, to the f16 x of the wgmma kernel (cuda_qwg.cu)
 * of a q/k/v or gate/up group of more tokens, whose own conversion launch is then not needed; or, with bn
 * CU_X16_F16 / CU_X16_BF16, straight to plain half rows (the x of the cuBLAS path, cu_gemm_prep's bits). */
struct nq_args {
  float *out, *x;
  const float *a, *w;
  int dim;
  float eps, off;
  uint8_t *xq;
  float2 *xs;
  const float *xsrc;
  const float *pw; /* PRE */
  float poff, peps;
  int n1; /* rows of the first norm */
  float *out2, *x2;
  const float *w2;
  uint4 *x16; /* bn > 0: the first norm's rows also go to x16 in the wgmma kernel's x layout (qw_put_row); */
  int bn;     /* CU_X16_F16 / CU_X16_BF16: as plain f16 / bf16 rows */
};
template <int VPT, bool PRE>
__global__ void __launch_bounds__(1024) k_norm_q(const nq_args na) {
  const int dim = na.dim, dim4 = dim >> 2;
  const bool second = (int)blockIdx.x >= na.n1;
  const int row = second ? (int)blockIdx.x - na.n1 : (int)blockIdx.x;
  float *out = second ? na.out2 : na.out, *x = second ? na.x2 : na.x;
  const float *w = second ? na.w2 : na.w;
  const float *a = second ? NULL : na.a, *xsrc = second ? NULL : na.xsrc;
  uint8_t *xq = second ? NULL : na.xq;
  uint4 *x16 = second || na.bn <= 0 ? NULL : na.x16;
  uint2 *xh = second || na.bn >= 0 || !na.x16 ? NULL : (uint2 *)na.x16 + (int64_t)row * dim4; /* plain half rows */
  extern __shared__ float4 nq_row[]; /* with x16: the row's output */
  float2 *xs = na.xs;
  const float eps = na.eps, off = na.off;
  pdl_trigger();
  float4 gw[VPT], pw[PRE ? VPT : 1]; /* the norm weights do not depend on the previous kernel: read before the wait */
  const float4 *w4 = (const float4 *)w;
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int idx = threadIdx.x + i * blockDim.x;
    gw[i] = idx < dim4 ? w4[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
    if (PRE) pw[PRE ? i : 0] = idx < dim4 ? ((const float4 *)na.pw)[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  pdl_wait();
  float4 *xr = (float4 *)(x + (int64_t)row * dim);
  const float4 *sr = xsrc ? (const float4 *)(xsrc + (int64_t)row * dim) : xr;
  const float4 *ar = a ? (const float4 *)(a + (int64_t)row * dim) : NULL;
  float4 v[VPT], b[VPT];
  float ss = 0.f;
  /* every load is issued before the first store (x and a may alias as far as the compiler knows) */
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int idx = threadIdx.x + i * blockDim.x;
    v[i] = b[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (idx < dim4) {
      v[i] = sr[idx];
      if (ar) b[i] = __ldca(ar + idx);
    }
  }
  __shared__ float red[32];
  if (PRE) { /* a's own norm, as a k_norm_q of a alone computes it */
    float sa = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; i++)
      sa = fmaf(b[i].x, b[i].x, fmaf(b[i].y, b[i].y, fmaf(b[i].z, b[i].z, fmaf(b[i].w, b[i].w, sa))));
    const float ia = 1.0f / sqrtf(block_sum(sa, red) / (float)dim + na.peps);
    __syncthreads(); /* red[0] read by every thread before the next reduction writes red */
#pragma unroll
    for (int i = 0; i < VPT; i++) {
      const float4 g = pw[PRE ? i : 0];
      b[i].x = b[i].x * ia * (g.x + na.poff); b[i].y = b[i].y * ia * (g.y + na.poff);
      b[i].z = b[i].z * ia * (g.z + na.poff); b[i].w = b[i].w * ia * (g.w + na.poff);
    }
  }
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int idx = threadIdx.x + i * blockDim.x;
    if (idx < dim4) {
      if (ar) {
        v[i].x += b[i].x; v[i].y += b[i].y; v[i].z += b[i].z; v[i].w += b[i].w;
      }
      if (ar || xsrc) xr[idx] = v[i];
      ss = fmaf(v[i].x, v[i].x, fmaf(v[i].y, v[i].y, fmaf(v[i].z, v[i].z, fmaf(v[i].w, v[i].w, ss))));
    }
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)dim + eps);
  float4 *o4 = out ? (float4 *)(out + (int64_t)row * dim) : NULL;
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int idx = threadIdx.x + i * blockDim.x;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    if (idx < dim4) {
      const float4 g = gw[i];
      o.x = v[i].x * inv * (g.x + off); o.y = v[i].y * inv * (g.y + off);
      o.z = v[i].z * inv * (g.z + off); o.w = v[i].w * inv * (g.w + off);
      if (out) o4[idx] = o;
      if (x16) nq_row[idx] = o;
      if (xh) xh[idx] = qm_half4(o, na.bn == CU_X16_BF16);
    }
    if (xq && i * blockDim.x < dim4) { /* whole warps: dim4 % 8 == 0 keeps 8-lane groups together */
      float am = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
      float sum = (o.x + o.y) + (o.z + o.w);
#pragma unroll
      for (int m = 4; m > 0; m >>= 1) {
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, m));
        sum += __shfl_xor_sync(0xffffffffu, sum, m);
      }
      if (idx < dim4) {
        const float sc = am > 0.f ? 127.f / am : 0.f;
        int q0 = __float2int_rn(o.x * sc), q1 = __float2int_rn(o.y * sc), q2 = __float2int_rn(o.z * sc),
            q3 = __float2int_rn(o.w * sc);
        q0 = max(-127, min(127, q0)); q1 = max(-127, min(127, q1));
        q2 = max(-127, min(127, q2)); q3 = max(-127, min(127, q3));
        const int sub = idx & 7, j = sub >> 1;
        const int64_t b = (int64_t)row * (dim >> 5) + (idx >> 3);
        uint8_t *blk = xq + b * 32;
        /* values 4sub+u: u = 0,2 -> word 2j bytes 2(sub&1)+{0,1}; u = 1,3 -> word 2j+1 */
        const int byte = 2 * (sub & 1);
        *(uint16_t *)(blk + (2 * j) * 4 + byte) = (uint16_t)((q0 & 0xff) | ((q2 & 0xff) << 8));
        *(uint16_t *)(blk + (2 * j + 1) * 4 + byte) = (uint16_t)((q1 & 0xff) | ((q3 & 0xff) << 8));
        if (sub == 0) xs[b] = make_float2(am * (1.f / 127.f), sum);
      }
    }
  }
  if (x16) {
    __syncthreads();
    qw_put_row(x16, (const float *)nq_row, dim, row, na.bn, threadIdx.x, blockDim.x);
  }
}


/* ---------------- CW_Q4 dispatch ---------------- */
template <int N, int RB, int UNR, int MINB = 1>
static void launch_q4(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const uint4 *xq,
                      const float2 *xs, int n, int tl, const cu_q4_dnorm *dn, const float *const *bias) {
  unsigned tiles;
  mv_args a = cu_mv_args(ws, ys, nw, (128 >> tl) * RB, &tiles, bias);
  a.hint = cx->t->q4hint;
  a.ef = N == 1 ? (cx->t->wef >> 2) & 3 : 0;
  if (N == 1 && dn) {
    a.ssp = dn->ssp;
    a.nss = dn->nss;
    a.dn_eps = dn->eps;
    a.dn_dim = (float)dn->dim;
  }
  const int nch = (n + N - 1) / N;
  const int gs = ws[0]->gs, lg = gs == 32 ? 0 : gs == 64 ? 1 : 2;
  cu_launch(cx, k_mvq4<N, RB, UNR, MINB>, dim3(tiles * (unsigned)nch), dim3(128), 0, a, xq, xs, (int)ws[0]->cols, lg,
            ws[0]->sbk, n, tl, nch, glu_args{ NULL, NULL, NULL });
  cu_count(cx, CU_K_MVQ4);
}
/* threads per row (log2): n = 1 loads 4 vectors of a row per round, n > 1 two; as few
 * threads as cover a row in one round (32..128) */
static int q4_unr(int n, int rb) { return n > 1 ? 2 : rb / 10; }
/* the n = 1 tiling (rows a thread + 10 * vectors a round), measured on the H100 (docs/cuda.md): two
 * vectors of a row per round for K = 2048 and 8192 (Llama-3.2-1B), one for K = 4096 and 14336
 * (Llama-3.1-8B); other K follow the nearest (tuning q4long for K > 8192); the o projection of
 * K = 4096 takes four rows a thread, 128 threads a row (8B: 467.9-469.7 vs 462.3-466.0 tok/s for 12) */
static int q4_rb(const cu_ctx *cx, int n, int V, int role) {
  const int cfg = cx->t->q4cfg;
  if (n == 1 && role == CU_Q4_O && V == 128 && !cfg) return 14;
  return n > 1 ? 4 : cfg ? cfg : V <= 64 ? 22 : V <= 128 ? 12 : V <= 256 ? 22 : cx->t->q4long;
}
static int q4_tl(const cu_ctx *cx, int V, int n, int rb, int64_t M) {
  const int unr = q4_unr(n, rb);
  int tl = 5;
  if (unr == 1) /* fewest threads per row that still give >= q4warps warps (loads in flight) */
    while (tl < 7 && (M / (rb % 10)) * (1 << (tl - 5)) < cx->t->q4warps && (1 << (tl + 1)) <= V) tl++;
  else /* as few threads as cover a row in one round */
    while (tl < 7 && (1 << tl) * unr < V) tl++;
  return tl;
}
/* minimum resident blocks an SM asked of the compiler (which caps the registers) per n = 1 tiling,
 * measured on the H100 */
static void q4_launch_n(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const uint4 *q4,
                        const float2 *xs, int n, int tl, int rb, const cu_q4_dnorm *dn,
                        const float *const *bias) {
  if (n == 1) {
    switch (rb) {
    case 11: launch_q4<1, 1, 1>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;
    case 21: launch_q4<1, 1, 2>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;
    case 41: launch_q4<1, 1, 4>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;
    case 12: launch_q4<1, 2, 1, 12>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break; /* <= 40 registers */
    case 22: launch_q4<1, 2, 2, 9>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;  /* <= 56 registers */
    case 42: launch_q4<1, 2, 4>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;
    case 14: launch_q4<1, 4, 1, 10>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break; /* <= 48 registers */
    case 24: launch_q4<1, 4, 2>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;
    case 44: launch_q4<1, 4, 4>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;
    case 18: launch_q4<1, 8, 1>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;
    default: launch_q4<1, 8, 2>(cx, ws, ys, nw, q4, xs, n, tl, dn, bias); break;
    }
  } else if (n == 2) launch_q4<2, 4, 2>(cx, ws, ys, nw, q4, xs, n, tl, NULL, bias);
  else if (n <= 4) launch_q4<4, 4, 2>(cx, ws, ys, nw, q4, xs, n, tl, NULL, bias);
  else launch_q4<8, 4, 2>(cx, ws, ys, nw, q4, xs, n, tl, NULL, bias);
}

/* k_mvr is considered only for x quantized by the kernel before (a decode layer's norms, attention,
 * k_mlp1), as measured */
static void q4_run(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, int n, const void *xqv,
                   int role, const cu_q4_dnorm *dn, int rb, int tl, bool mvr, const float *const *bias) {
  const int64_t K = ws[0]->cols;
  const int V = (int)(K / 32);
  const uint4 *q4 = (const uint4 *)xqv;
  const float2 *xs = (const float2 *)((const uint8_t *)xqv + (size_t)n * (size_t)K);
  if (mvr && n == 1 && rb <= 0 && (!dn || dn->nss <= 128) && mvr_launch(cx, ws, ys, nw, q4, xs, role, false, dn, bias))
    return;
  if (rb <= 0) rb = q4_rb(cx, n, V, role);
  int64_t M = 0;
  for (int i = 0; i < nw; i++) M += ws[i]->rows;
  if (!tl) tl = q4_tl(cx, V, n, rb, M);
  q4_launch_n(cx, ws, ys, nw, q4, xs, n, tl, rb, dn, bias);
}

void cu_q4_matvec(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x,
                  const float *xu, int n, void *xqv, int role, int rb, int tl, bool gelu, const float *const *bias) {
  const int64_t K = ws[0]->cols;
  const int64_t nblk = (int64_t)n * (K / 32);
  uint8_t *xq = (uint8_t *)xqv;
  float2 *xs = (float2 *)(xq + (size_t)n * (size_t)K);
  cu_launch(cx, k_quant_x, dim3((unsigned)((nblk + 7) / 8)), dim3(256), 0, x, xu, nblk, xq, xs, gelu ? 1 : 0);
  q4_run(cx, ws, ys, nw, n, xqv, role, NULL, rb, tl, false, bias);
}

void cu_q4_matvec_preq(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, int n, const void *xqv,
                       int role, const cu_q4_dnorm *dn, const float *const *bias) {
  q4_run(cx, ws, ys, nw, n, xqv, role, dn, 0, 0, true, bias);
}

bool cu_q4_mvr_ok(const cu_ctx *cx, const cu_weight *const *ws, int nw, int role) {
  return mvr_launch(cx, ws, NULL, nw, NULL, NULL, role, true);
}

bool cu_q4_dnorm_ok(const cu_ctx *cx, const cu_weight *const *ws, int nw, int role) {
  (void)cx;
  (void)role; /* k_mvq4 and k_mvr both apply it */
  return nw >= 1 && nw <= 3 && ws[0]->kind == CW_Q4 && ws[0]->cols <= 4096 && ws[0]->cols % 128 == 0; /* dn_load */
}

/* k_mvr takes gate/up where it applies (measured faster than k_gu_q4 for the 8B shape: silu(gate)*up is
 * then quantized by k_quant_x before the down projection) */
bool cu_q4_guq_ok(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, int n) {
  const cu_weight *ws[2] = { g, u };
  return n == 1 && guq_shape(g, u) && !cu_q4_mvr_ok(cx, ws, 2, CU_Q4_GU);
}

void cu_q4_guq(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, float *gy, float *uy, const void *xqv,
               void *hqv) {
  const int64_t K = g->cols;
  const uint4 *q4 = (const uint4 *)xqv;
  const float2 *xs = (const float2 *)((const uint8_t *)xqv + (size_t)K);
  uint8_t *hq = (uint8_t *)hqv;
  float2 *hs = (float2 *)(hq + (size_t)g->rows);
  mv_args a;
  memset(&a, 0, sizeof a);
  const cu_weight *ws[2] = { g, u };
  float *ys[2] = { gy, uy };
  for (int i = 0; i < 2; i++) { a.q[i] = ws[i]->q; a.sb[i] = ws[i]->sb; a.y[i] = ys[i]; a.M[i] = (int)ws[i]->rows; }
  const int lg = g->gs == 32 ? 0 : g->gs == 64 ? 1 : 2;
  cu_launch(cx, k_gu_q4<1>, dim3((unsigned)(g->rows / 32)), dim3(256), 0, a, q4, xs, (int)K, lg, g->sbk, hq, hs);
  cu_count(cx, CU_K_GUQ4);
}

/* threads a row and float4s a thread of k_norm_q for dim; false when dim is too large */
static bool norm_shape(int dim, int *th_out, int *vpt_out) {
  const int dim4 = dim / 4;
  int th = ((dim4 + 31) / 32) * 32, vpt = 1;
  while (th > 1024) { vpt *= 2; th = ((dim4 + vpt - 1) / vpt + 31) / 32 * 32; }
  if (vpt > 8) return false;
  *th_out = th < 64 ? 64 : th;
  *vpt_out = vpt;
  return true;
}
static bool norm_launch(const cu_ctx *cx, const nq_args &na, int rows, bool pre) {
  int th, vpt;
  if (!norm_shape(na.dim, &th, &vpt)) return false;
  const size_t sm = na.x16 && na.bn > 0 ? (size_t)na.dim * 4 : 0;
#define NQ_GO(V_)                                                                  \
  do {                                                                             \
    if (pre) cu_launch(cx, k_norm_q<V_, true>, dim3(rows), dim3(th), sm, na);     \
    else cu_launch(cx, k_norm_q<V_, false>, dim3(rows), dim3(th), sm, na);        \
  } while (0)
  switch (vpt) {
  case 1: NQ_GO(1); break;
  case 2: NQ_GO(2); break;
  case 4: NQ_GO(4); break;
  default: NQ_GO(8); break;
  }
#undef NQ_GO
  return true;
}
/* the row staged in shared memory: at most 48 KB without an opt-in */
bool cu_norm_x16_ok(int dim) { return dim % QM_BK == 0 && dim <= 12288; }
static bool nq_ok(int n, int dim, const void *xq, const void *p0, const void *p1, const void *p2, const void *p3,
                  const void *p4) {
  return n > 0 && dim > 0 && dim % 4 == 0 && !(xq && dim % 32) &&
         !(((uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2 | (uintptr_t)p3 | (uintptr_t)p4) & 15);
}

bool cu_norm_q(const cu_ctx *cx, float *out, float *x, const float *a, const float *w, int n, int dim, float eps,
               float off, void *xqv, const float *xsrc, void *x16, int bn) {
  return cu_norm_pre_q(cx, out, x, a, NULL, 0.f, 0.f, w, n, dim, eps, off, xqv, xsrc, x16, bn);
}

bool cu_norm_pre_q(const cu_ctx *cx, float *out, float *x, const float *a, const float *pw, float poff, float peps,
                   const float *w, int n, int dim, float eps, float off, void *xqv, const float *xsrc, void *x16,
                   int bn) {
  if (!nq_ok(n, dim, xqv, out, x, a, w, xsrc) || (pw && (!a || ((uintptr_t)pw & 15)))) return false;
  if (x16 && (bn > 0 ? !cu_norm_x16_ok(dim) : bn != CU_X16_F16 && bn != CU_X16_BF16)) return false;
  nq_args na;
  memset(&na, 0, sizeof na);
  na.out = out; na.x = x; na.a = a; na.w = w; na.dim = dim; na.eps = eps; na.off = off;
  na.xq = (uint8_t *)xqv;
  na.xs = xqv ? (float2 *)(na.xq + (size_t)n * (size_t)dim) : NULL;
  na.xsrc = xsrc;
  na.pw = pw; na.poff = poff; na.peps = peps;
  na.n1 = n;
  na.x16 = (uint4 *)x16;
  na.bn = bn;
  return norm_launch(cx, na, n, pw != NULL);
}

bool cu_norm_pair(const cu_ctx *cx, float *out1, float *x1, const float *w1, int n1, float *out2, float *x2,
                  const float *w2, int n2, int dim, float eps, float off) {
  if (!nq_ok(n1, dim, NULL, out1, x1, w1, out2, x2) || !nq_ok(n2, dim, NULL, w2, NULL, NULL, NULL, NULL)) return false;
  nq_args na;
  memset(&na, 0, sizeof na);
  na.out = out1; na.x = x1; na.w = w1; na.dim = dim; na.eps = eps; na.off = off;
  na.n1 = n1;
  na.out2 = out2; na.x2 = x2; na.w2 = w2;
  return norm_launch(cx, na, n1 + n2, false);
}
