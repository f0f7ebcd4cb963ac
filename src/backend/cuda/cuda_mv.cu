/* CUDA matrix-vector kernels (decode, n <= 8 columns), weight dequantization for the
 * GEMM path, and embedding rows. See cuda_internal.h for the weight layouts. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_q4dev.cuh"
#include <cooperative_groups.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>


/* SMELT_CUDA_WEF: weight streams of the one-token kernels read with the L2 evict-first policy, a
 * bit mask (default 63): 1 / 2 k_mlp1's weights / scales, 4 / 8 k_mvq4's, 16 / 32 k_mvr's. Other
 * data (activations, K/V, the gate weight prefetched by attention) then stays in L2 */
extern int g_cu_wef;

/* streaming 16-byte load that skips L1 (weights are read once; keep L1 for x) */
static __device__ __forceinline__ uint4 ld_stream(const void *p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

/* the same with an L2 cache policy (createpolicy), and a 4-byte read-only load with one */
static __device__ __forceinline__ uint4 ld_stream_p(const void *p, uint64_t pol) {
  uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
#else
  (void)pol;
  r = ld_stream(p);
#endif
  return r;
}
static __device__ __forceinline__ uint32_t ldg_p(const uint32_t *p, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(r) : "l"(p), "l"(pol));
  return r;
#else
  (void)pol;
  return __ldg(p);
#endif
}

/* the same with an L2 prefetch-size hint (h = 1: 128 bytes, 2: 256 bytes), (3) evict-first (pol) or
 * (4) both evict-first and 128 bytes */
static __device__ __forceinline__ uint4 ld_stream_h(const void *p, int h, uint64_t pol) {
  uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  (void)h; (void)pol;
  r = ld_stream(p);
#else
  if (h == 2)
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else if (h == 1)
    asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else if (h == 3)
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  else if (h == 4)
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  else
    r = ld_stream(p);
#endif
  return r;
}

template <int SBK> static __device__ __forceinline__ float2 load_sb(const void *sb, int64_t idx) {
  if (SBK == SBK_F32) return __ldg((const float2 *)sb + idx);
  uint32_t v = __ldg((const uint32_t *)sb + idx);
  if (SBK == SBK_BF16) return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  __half2 h = *reinterpret_cast<__half2 *>(&v);
  return __half22float2(h);
}
static __device__ __forceinline__ uint32_t ldg_p(const uint32_t *p, uint64_t pol);
/* 16-bit scales read with an L2 policy when ef (else load_sb) */
static __device__ __forceinline__ float2 load_sb_p(const void *sb, int64_t idx, int sbk, bool ef, uint64_t pol) {
  if (sbk == SBK_F32 || !ef) return sbk == SBK_F32 ? load_sb<SBK_F32>(sb, idx) : sbk == SBK_F16 ? load_sb<SBK_F16>(sb, idx) : load_sb<SBK_BF16>(sb, idx);
  uint32_t v = ldg_p((const uint32_t *)sb + idx, pol);
  if (sbk == SBK_BF16) return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  __half2 h = *reinterpret_cast<__half2 *>(&v);
  return __half22float2(h);
}
static __device__ __forceinline__ float2 load_sb_rt(const void *sb, int64_t idx, int sbk) {
  if (sbk == SBK_F32) return load_sb<SBK_F32>(sb, idx);
  if (sbk == SBK_F16) return load_sb<SBK_F16>(sb, idx);
  return load_sb<SBK_BF16>(sb, idx);
}

/* Decode the E = 32/BITS elements of word w into floats f such that
 * sum_e q_e x_e = A * sum_e f_e x_e - B0 * sum_e x_e  (A = 64, B0 = 128 for 2/4-bit;
 * A = 1, B0 = 0 for 8-bit). For 2/4-bit, f = 2 + q/64 built with one byte permute. */
template <int BITS> static __device__ __forceinline__ void decode_word(uint32_t w, float *f) {
  if (BITS == 4) {
    uint32_t w0 = w & 0x0F0F0F0Fu, w1 = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      f[2 * i] = __uint_as_float(__byte_perm(w0, 0x40000000u, 0x7044u | (i << 8)));
      f[2 * i + 1] = __uint_as_float(__byte_perm(w1, 0x40000000u, 0x7044u | (i << 8)));
    }
  } else if (BITS == 2) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      uint32_t wk = (w >> (2 * k)) & 0x03030303u;
#pragma unroll
      for (int i = 0; i < 4; i++) f[4 * i + k] = __uint_as_float(__byte_perm(wk, 0x40000000u, 0x7044u | (i << 8)));
    }
  } else { /* 8 */
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | i)) - 8388608.f;
  }
}

/* up to 3 weights sharing x (fused q/k/v or gate/up); block ranges select the weight */
struct mv_args {
  const void *q[3];
  const void *sb[3];
  float *y[3];
  int M[3];
  int bstart[4];
  int pf; /* k_mvq4, n = 1: bytes of its weight rows a block prefetches into L2 before the wait (-1: all) */
  int hint; /* k_mvq4 weight loads: ld_stream_h's h */
  int ef;   /* n = 1 (g_cu_wef): 1 the weights, 2 the scales read with the L2 evict-first policy */
  /* k_mvq4, n = 1, deferred rmsnorm (cu_q4_set_dnorm): x was quantized un-normalized and ssp[0..nss)
   * hold partial sums of its squares: every output is scaled by 1 / sqrt(sum / dim + eps) */
  const float *ssp;
  int nss;
  float dn_eps, dn_dim;
};

template <int BITS, int R, int N, int SBK>
static __device__ __forceinline__ void mv_word(const uint32_t (&wd)[R], int u, const int64_t (&rows)[R],
                                             const void *__restrict__ sb, int G, int gs,
                                             const float *__restrict__ x, int K, int n, float (&acc)[R][N]) {
  constexpr int E = 32 / BITS;
  constexpr float A = BITS == 8 ? 1.f : 64.f, B0 = BITS == 8 ? 0.f : 128.f;
  const int g = (u * E) / gs;
  float sc[R], bb[R], f[R][E];
#pragma unroll
  for (int r = 0; r < R; r++) {
    float2 p = load_sb<SBK>(sb, rows[r] * G + g);
    sc[r] = A * p.x;
    bb[r] = p.y - B0 * p.x;
    decode_word<BITS>(wd[r], f[r]);
  }
#pragma unroll
  for (int c = 0; c < N; c++) {
    const int col = c < n ? c : n - 1;
    const float4 *xp = reinterpret_cast<const float4 *>(x + (int64_t)col * K + (int64_t)u * E);
    float xv[E];
#pragma unroll
    for (int e = 0; e < E / 4; e++) {
      float4 t = __ldca(xp + e);
      xv[4 * e] = t.x; xv[4 * e + 1] = t.y; xv[4 * e + 2] = t.z; xv[4 * e + 3] = t.w;
    }
    float xs = 0.f;
#pragma unroll
    for (int e = 0; e < E; e++) xs += xv[e];
#pragma unroll
    for (int r = 0; r < R; r++) {
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < E; e++) d = fmaf(f[r][e], xv[e], d);
      acc[r][c] = fmaf(sc[r], d, fmaf(bb[r], xs, acc[r][c]));
    }
  }
  }

template <int BITS, int R, int N, int SBK>
__global__ void __launch_bounds__(128) k_mv_qfast(const mv_args a, const float *__restrict__ x, int K, int gs, int n) {
  constexpr int E = 32 / BITS;
  const int wi = (int)blockIdx.x >= a.bstart[2] ? 2 : (int)blockIdx.x >= a.bstart[1] ? 1 : 0;
  /* selects, not indexing: a dynamically indexed parameter array would go to local memory */
  const uint32_t *__restrict__ q = (const uint32_t *)(wi == 0 ? a.q[0] : wi == 1 ? a.q[1] : a.q[2]);
  const void *__restrict__ sb = wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2];
  float *__restrict__ y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int bst = wi == 0 ? a.bstart[0] : wi == 1 ? a.bstart[1] : a.bstart[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (((int)blockIdx.x - bst) * 4 + warp) * R;
  if (row0 >= M) return;
  const int W = K / E, C = W / 128, G = K / gs;
  int64_t rows[R];
#pragma unroll
  for (int r = 0; r < R; r++) rows[r] = row0 + r < M ? row0 + r : M - 1;
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < N; c++) acc[r][c] = 0.f;

  pdl_trigger();
#pragma unroll 2
  for (int c = 0; c < C; c++) {
    uint4 v[R];
#pragma unroll
    for (int r = 0; r < R; r++) v[r] = ld_stream(q + rows[r] * W + (int64_t)c * 128 + lane * 4);
    if (c == 0) pdl_wait(); /* weights of the first chunk are requested before waiting for x */
    uint32_t wd[R];
#pragma unroll
    for (int r = 0; r < R; r++) wd[r] = v[r].x;
    mv_word<BITS, R, N, SBK>(wd, c * 128 + lane, rows, sb, G, gs, x, K, n, acc);
#pragma unroll
    for (int r = 0; r < R; r++) wd[r] = v[r].y;
    mv_word<BITS, R, N, SBK>(wd, c * 128 + 32 + lane, rows, sb, G, gs, x, K, n, acc);
#pragma unroll
    for (int r = 0; r < R; r++) wd[r] = v[r].z;
    mv_word<BITS, R, N, SBK>(wd, c * 128 + 64 + lane, rows, sb, G, gs, x, K, n, acc);
#pragma unroll
    for (int r = 0; r < R; r++) wd[r] = v[r].w;
    mv_word<BITS, R, N, SBK>(wd, c * 128 + 96 + lane, rows, sb, G, gs, x, K, n, acc);
  }
  pdl_wait();
  for (int u = C * 128 + lane; u < W; u += 32) {
    uint32_t wd[R];
#pragma unroll
    for (int r = 0; r < R; r++) wd[r] = __ldg(q + rows[r] * W + u);
    mv_word<BITS, R, N, SBK>(wd, u, rows, sb, G, gs, x, K, n, acc);
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < N; c++) {
      float v = warp_sum(acc[r][c]);
      if (lane == 0 && row0 + r < M && c < n) y[(int64_t)c * M + row0 + r] = v;
    }
}

/* Generic MLX-layout quantized matvec (any bits): a warp per row, a lane per 32-element
 * unit (BITS words). */
template <int BITS>
__global__ void __launch_bounds__(128) k_mv_qgen(const uint32_t *__restrict__ q, const void *__restrict__ sb, int sbk,
                                                 const float *__restrict__ x, float *__restrict__ y, int M, int K,
                                                 int gs, int n) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x * 4 + warp;
  if (row >= M) return;
  const int U = K / 32, G = K / gs;
  const uint32_t *qr = q + (int64_t)row * U * BITS;
  constexpr uint32_t mask = (1u << BITS) - 1;
  float acc[CU_MAX_N];
#pragma unroll
  for (int c = 0; c < CU_MAX_N; c++) acc[c] = 0.f;
  for (int t = lane; t < U; t += 32) {
    uint32_t wd[BITS + 1];
#pragma unroll
    for (int i = 0; i < BITS; i++) wd[i] = __ldg(qr + t * BITS + i);
    wd[BITS] = 0;
    float f[32];
#pragma unroll
    for (int e = 0; e < 32; e++) {
      const int bit = e * BITS, wi = bit / 32, off = bit % 32;
      uint32_t v = wd[wi] >> off;
      if (off + BITS > 32) v |= wd[wi + 1] << (32 - off);
      f[e] = (float)(v & mask);
    }
    float2 p = load_sb_rt(sb, (int64_t)row * G + (t * 32) / gs, sbk);
#pragma unroll
    for (int c = 0; c < CU_MAX_N; c++) {
      if (c >= n) break;
      const float *xp = x + (int64_t)c * K + t * 32;
      float d = 0.f, xs = 0.f;
#pragma unroll
      for (int e = 0; e < 32; e++) {
        float xv = __ldg(xp + e);
        d = fmaf(f[e], xv, d);
        xs += xv;
      }
      acc[c] += p.x * d + p.y * xs;
    }
  }
#pragma unroll
  for (int c = 0; c < CU_MAX_N; c++) {
    if (c >= n) break;
    float v = warp_sum(acc[c]);
    if (lane == 0) y[(int64_t)c * M + row] = v;
  }
}

template <typename T> static __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }

template <typename T> static __device__ __forceinline__ float h16_to_f(unsigned short u);
template <> __device__ __forceinline__ float h16_to_f<__nv_bfloat16>(unsigned short u) { return __uint_as_float((uint32_t)u << 16); }
template <> __device__ __forceinline__ float h16_to_f<__half>(unsigned short u) { return __half2float(__ushort_as_half(u)); }
template <> __device__ __forceinline__ float h16_to_f<float>(unsigned short u) { return 0.f; }

/* unpack a 16-byte vector of T into floats */
template <typename T> static __device__ __forceinline__ void unpack16(uint4 v, float *f) {
  if (sizeof(T) == 4) {
    f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y); f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
  } else {
    uint32_t a[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
      f[2 * i] = h16_to_f<T>((unsigned short)(a[i] & 0xffff));
      f[2 * i + 1] = h16_to_f<T>((unsigned short)(a[i] >> 16));
    }
  }
}

/* Dense matvec: lane loads 16 bytes (VE elements), a warp covers 32*VE contiguous elements. */
template <typename T, int R, int N>
__global__ void __launch_bounds__(128) k_mv_dense(const mv_args a, const float *__restrict__ x, int K, int n, int vec) {
  constexpr int VE = 16 / sizeof(T);
  const int wi = (int)blockIdx.x >= a.bstart[2] ? 2 : (int)blockIdx.x >= a.bstart[1] ? 1 : 0;
  const T *__restrict__ w = (const T *)(wi == 0 ? a.q[0] : wi == 1 ? a.q[1] : a.q[2]);
  float *__restrict__ y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int bst = wi == 0 ? a.bstart[0] : wi == 1 ? a.bstart[1] : a.bstart[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (((int)blockIdx.x - bst) * 4 + warp) * R;
  if (row0 >= M) return;
  int64_t rows[R];
#pragma unroll
  for (int r = 0; r < R; r++) rows[r] = row0 + r < M ? row0 + r : M - 1;
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < N; c++) acc[r][c] = 0.f;
  const int C = vec ? K / (32 * VE) : 0;
#pragma unroll 2
  for (int ch = 0; ch < C; ch++) {
    const int k0 = ch * 32 * VE + lane * VE;
    float f[R][VE];
#pragma unroll
    for (int r = 0; r < R; r++) unpack16<T>(ld_stream(w + rows[r] * K + k0), f[r]);
#pragma unroll
    for (int c = 0; c < N; c++) {
      const int col = c < n ? c : n - 1;
      const float4 *xp = reinterpret_cast<const float4 *>(x + (int64_t)col * K + k0);
      float xv[VE];
#pragma unroll
      for (int e = 0; e < VE / 4; e++) {
        float4 t = __ldg(xp + e);
        xv[4 * e] = t.x; xv[4 * e + 1] = t.y; xv[4 * e + 2] = t.z; xv[4 * e + 3] = t.w;
      }
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int e = 0; e < VE; e++) acc[r][c] = fmaf(f[r][e], xv[e], acc[r][c]);
    }
  }
  for (int k = C * 32 * VE + lane; k < K; k += 32) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      float wv = to_f<T>(w[rows[r] * K + k]);
#pragma unroll
      for (int c = 0; c < N; c++) {
        const int col = c < n ? c : n - 1;
        acc[r][c] = fmaf(wv, __ldg(x + (int64_t)col * K + k), acc[r][c]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < N; c++) {
      float v = warp_sum(acc[r][c]);
      if (lane == 0 && row0 + r < M && c < n) y[(int64_t)c * M + row0 + r] = v;
    }
}

/* ---------------- decode matvec (16-byte vectors, several rows per thread) ----------------
 * Thread tt of a row group (tpr = 32/64/128 threads) owns the 16-byte vectors v = tt,
 * tt+tpr, ... of each row; it streams RB rows at once (RB independent 16-byte loads in
 * flight), reads its x slice once per vector for all RB rows (L1), and for quantized
 * weights loads one (scale, bias) pair per row and vector. Partial sums are reduced in the
 * warp and, for tpr > 32, across the group's warps through shared memory. With SILU the x
 * operand is silu(x) * xu, computed on the fly (fused silu_mul + down projection). */
template <int EPV, bool SILU>
static __device__ __forceinline__ void load_x(float (&xv)[EPV], const float *__restrict__ x,
                                              const float *__restrict__ xu, int64_t off) {
  const float4 *xp = reinterpret_cast<const float4 *>(x + off);
#pragma unroll
  for (int e = 0; e < EPV / 4; e++) {
    float4 t = __ldca(xp + e);
    if (SILU) {
      const float4 u = __ldca(reinterpret_cast<const float4 *>(xu + off) + e);
      t.x = t.x / (1.f + expf(-t.x)) * u.x;
      t.y = t.y / (1.f + expf(-t.y)) * u.y;
      t.z = t.z / (1.f + expf(-t.z)) * u.z;
      t.w = t.w / (1.f + expf(-t.w)) * u.w;
    }
    xv[4 * e] = t.x; xv[4 * e + 1] = t.y; xv[4 * e + 2] = t.z; xv[4 * e + 3] = t.w;
  }
}

/* padded shared-memory index of x element e (4 floats of padding per 32: conflict-free
 * 16-byte reads when consecutive lanes read consecutive 16..128-byte slices) */
static __device__ __forceinline__ int xs_idx(int e) { return (e >> 5) * 36 + (e & 31); }

template <int BITS, typename T, int N, int RB, bool SILU>
__global__ void __launch_bounds__(128, N == 1 ? 3 : 1) k_mv2(const mv_args a, const float *__restrict__ x,
                                                            const float *__restrict__ xu, int K, int gs, int sbk,
                                                            int n, int tl, int n_tiles, int smx) {
  constexpr int EPV = BITS ? 128 / BITS : 16 / (int)sizeof(T); /* elements per 16-byte vector */
  constexpr int WE = BITS ? 32 / BITS : 1;                      /* elements per 32-bit word */
  constexpr float A = BITS == 8 ? 1.f : 64.f, B0 = BITS == 8 ? 0.f : 128.f;
  __shared__ float red[4][RB * N];
  extern __shared__ float4 xs4[];
  float *xs = (float *)xs4;
  pdl_trigger();
  if (N == 1 && smx) pdl_wait();
  if (N == 1 && smx) { /* stage x (or silu(x)*xu) once per block */
    for (int e = threadIdx.x * 4; e < K; e += 128 * 4) {
      float4 t = __ldca(reinterpret_cast<const float4 *>(x + e));
      if (SILU) {
        const float4 u = __ldca(reinterpret_cast<const float4 *>(xu + e));
        t.x = t.x / (1.f + expf(-t.x)) * u.x;
        t.y = t.y / (1.f + expf(-t.y)) * u.y;
        t.z = t.z / (1.f + expf(-t.z)) * u.z;
        t.w = t.w / (1.f + expf(-t.w)) * u.w;
      }
      *reinterpret_cast<float4 *>(xs + xs_idx(e)) = t;
    }
    __syncthreads();
  }
  const int tpr = 1 << tl, grp = threadIdx.x >> tl, tt = threadIdx.x & (tpr - 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rpb = (128 >> tl) * RB;
  const int V = K / EPV, G = BITS ? K / gs : 1;
  const bool two = BITS && EPV > gs; /* 2-bit, group 32: two groups per vector */
  for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
  const int wi = tile >= a.bstart[2] ? 2 : tile >= a.bstart[1] ? 1 : 0;
  const uint4 *__restrict__ q = (const uint4 *)(wi == 0 ? a.q[0] : wi == 1 ? a.q[1] : a.q[2]);
  const void *__restrict__ sb = wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2];
  float *__restrict__ y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int bst = wi == 0 ? a.bstart[0] : wi == 1 ? a.bstart[1] : a.bstart[2];
  const int rowb = (tile - bst) * rpb;
  const int row0 = rowb + grp * RB;
  int64_t rows[RB];
#pragma unroll
  for (int r = 0; r < RB; r++) rows[r] = row0 + r < M ? row0 + r : M - 1;
  float acc[RB][N];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int c = 0; c < N; c++) acc[r][c] = 0.f;

  for (int v = tt; v < V; v += tpr) {
    uint4 raw[RB];
#pragma unroll
    for (int r = 0; r < RB; r++) raw[r] = ld_stream(q + rows[r] * V + v);
    if (v == tt) pdl_wait(); /* the first weight loads are issued before waiting for x */
    float sc0[RB], bb0[RB], sc1[RB], bb1[RB];
    if (BITS) {
      const int g0 = (v * EPV) / gs;
#pragma unroll
      for (int r = 0; r < RB; r++) {
        float2 p = load_sb_rt(sb, rows[r] * G + g0, sbk);
        sc0[r] = A * p.x; bb0[r] = p.y - B0 * p.x;
        if (two) p = load_sb_rt(sb, rows[r] * G + g0 + 1, sbk);
        sc1[r] = A * p.x; bb1[r] = p.y - B0 * p.x;
      }
    }
#pragma unroll
    for (int c = 0; c < N; c++) {
      const int col = c < n ? c : n - 1;
      float xv[EPV];
      if (N == 1 && smx) {
#pragma unroll
        for (int e = 0; e < EPV / 4; e++) {
          const float4 t = *reinterpret_cast<const float4 *>(xs + xs_idx(v * EPV + 4 * e));
          xv[4 * e] = t.x; xv[4 * e + 1] = t.y; xv[4 * e + 2] = t.z; xv[4 * e + 3] = t.w;
        }
      } else {
        load_x<EPV, SILU>(xv, x, xu, (int64_t)col * K + (int64_t)v * EPV);
      }
      if (BITS) {
        float X0 = 0.f, X1 = 0.f;
#pragma unroll
        for (int e = 0; e < EPV / 2; e++) { X0 += xv[e]; X1 += xv[EPV / 2 + e]; }
#pragma unroll
        for (int r = 0; r < RB; r++) {
          const uint32_t wd[4] = { raw[r].x, raw[r].y, raw[r].z, raw[r].w };
          float D0 = 0.f, D1 = 0.f;
#pragma unroll
          for (int j = 0; j < 4; j++) {
            float f[WE];
            decode_word<BITS == 0 ? 8 : BITS>(wd[j], f);
#pragma unroll
            for (int e = 0; e < WE; e++) {
              if (j < 2) D0 = fmaf(f[e], xv[j * WE + e], D0);
              else D1 = fmaf(f[e], xv[j * WE + e], D1);
            }
          }
          acc[r][c] = fmaf(sc0[r], D0, fmaf(bb0[r], X0, fmaf(sc1[r], D1, fmaf(bb1[r], X1, acc[r][c]))));
        }
      } else {
#pragma unroll
        for (int r = 0; r < RB; r++) {
          float f[EPV];
          unpack16<T>(raw[r], f);
          float D0 = 0.f, D1 = 0.f;
#pragma unroll
          for (int e = 0; e < EPV / 2; e++) {
            D0 = fmaf(f[e], xv[e], D0);
            D1 = fmaf(f[EPV / 2 + e], xv[EPV / 2 + e], D1);
          }
          acc[r][c] += D0 + D1;
        }
      }
    }
  }
  pdl_wait();
  float vals[RB * N];
#pragma unroll
  for (int r = 0; r < RB; r++)
#pragma unroll
    for (int c = 0; c < N; c++) vals[r * N + c] = warp_sum(acc[r][c]);
  if (tl == 5) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < RB; r++)
#pragma unroll
        for (int c = 0; c < N; c++)
          if (row0 + r < M && c < n) y[(int64_t)c * M + row0 + r] = vals[r * N + c];
    }
    continue;
  }
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
    if (row < M && c < n) y[(int64_t)c * M + row] = sum;
  }
  __syncthreads();
  }
}


/* ---------------- 4-bit x int8 dp4a matvec (CW_Q4, 1 <= n <= 64) ----------------
 * x is quantized once per call (k_quant_x): per 32 values d = max|x|/127, q = rint(x/d),
 * plus the exact float sum S of the 32 values. The int8s are stored in the order the weight
 * nibbles unpack to: for each 8-value word j of the block, the int32s
 * [x0 x2 x4 x6] and [x1 x3 x5 x7], so that  w & 0x0F0F0F0F  (nibbles 0,2,4,6) and
 * (w >> 4) & 0x0F0F0F0F  (nibbles 1,3,5,7) feed dp4a directly. Per 32-value block of a row:
 *   y += scale * d * dot(q_w, q_x) + bias * S
 * (the bias term is exact; the error is the int8 rounding of x: |x - d q_x| <= d/2). */
__global__ void __launch_bounds__(256) k_quant_x(const float *__restrict__ x, const float *__restrict__ xu,
                                                 int64_t nblk, uint8_t *__restrict__ xq, float2 *__restrict__ xs) {
  const int lane = threadIdx.x & 31;
  const int64_t b = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  pdl_trigger();
  pdl_wait();
  if (b >= nblk) return;
  float v = __ldca(x + b * 32 + lane);
  if (xu) v = v / (1.f + expf(-v)) * __ldca(xu + b * 32 + lane);
  float a = fabsf(v), sum = v;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  int qi = a > 0.f ? __float2int_rn(v * (127.f / a)) : 0;
  qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
  const int j = lane >> 3, e = lane & 7;
  xq[b * 32 + (2 * j + (e & 1)) * 4 + (e >> 1)] = (uint8_t)(int8_t)qi;
  if (lane == 0) xs[b] = make_float2(a * (1.f / 127.f), sum);
}

/* UNR vectors of each of the RB rows are loaded before any is used (UNR*RB independent
 * 16-byte loads in flight per thread); threads per row (tpr) are chosen so that one or two
 * such rounds cover a row */
/* GLU epilogue (gate/up pair, glu.cnt != NULL): weights 0 and 1 are gate and up with M rows
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
    float v = g / (1.f + expf(-g)) * u;
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
void cu_mv_set_trace(unsigned long long *buf) {
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
          if (row0 + r < M && c0 + c < n) y[(int64_t)(c0 + c) * M + row0 + r] = vals[r * N + c];
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
      if (row < M && c0 + c < n) y[(int64_t)(c0 + c) * M + row] = sum;
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


/* ---------------- 4-bit x int8 matvec, rows streamed by the bulk-copy engine (n = 1) ----------------
 * Opt-in (SMELT_CUDA_MVT; measured slower than k_mvq4 in the decode graph, docs/benchmarks.md).
 * Same arithmetic as k_mvq4 (int8 x from k_quant_x / k_norm_q, one lane a 16-byte vector of a
 * row), but each warp owns groups of R consecutive rows and keeps S of them in flight in shared
 * memory: lane 0 requests a group (packed words + scale/bias pairs, each contiguous) with two
 * cp.async.bulk copies completing on the stage's mbarrier, and requests the next group into the
 * stage once the warp has consumed it. Every block requests its first NW * S groups before
 * waiting for the previous kernel. Groups are split statically over the grid (SMELT_CUDA_MVT_BPS
 * blocks an SM, 0: one-shot blocks of NW * S groups) or claimed from a per-launch counter
 * (SMELT_CUDA_MVT_DYN). Shared memory: x (int8 halves xa/xb, scales xd), NW * S stages, their
 * mbarriers, the group each stage holds. */
int g_cu_mvt = 0;     /* SMELT_CUDA_MVT: bit mask of CU_Q4_* roles (bit 5: no role) that use it for n = 1 */
int g_cu_mvt_kb = 96; /* SMELT_CUDA_MVT_KB: shared memory budget of the row stages a block */
int g_cu_mvt_bps = 1; /* SMELT_CUDA_MVT_BPS: blocks an SM */

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void mvt_issue(uint64_t *bar, void *dst, const void *q, uint32_t qn, const void *sb,
                                                 uint32_t sn) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(qn + sn) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(q), "r"(qn), "r"(smem_u32(bar))
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32((char *)dst + qn)),
               "l"(sb), "r"(sn), "r"(smem_u32(bar))
               : "memory");
#else
  (void)bar; (void)dst; (void)q; (void)qn; (void)sb; (void)sn;
#endif
}
static __device__ __forceinline__ void mvt_wait(uint64_t *bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ok;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
  } while (!ok);
#else
  (void)bar; (void)parity;
#endif
}

/* a group: up to R consecutive rows of one weight (one stage); groups are numbered weight by
 * weight, ng[i] groups of weight i */
struct mvt_grp {
  const char *q, *sb;
  float *y;
  int nr;
  int64_t row;
};
template <int R>
static __device__ __forceinline__ mvt_grp mvt_group(const mv_args &a, int64_t g, uint32_t qn, uint32_t sn) {
  const int64_t n0 = ((int64_t)a.M[0] + R - 1) / R, n1 = a.bstart[1] != 0x7fffffff ? ((int64_t)a.M[1] + R - 1) / R : 0;
  const int wi = g >= n0 + n1 ? 2 : g >= n0 ? 1 : 0;
  const int64_t lg = g - (wi == 2 ? n0 + n1 : wi == 1 ? n0 : 0);
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  mvt_grp r;
  r.row = lg * R;
  r.nr = M - r.row < R ? (int)(M - r.row) : R;
  r.q = (const char *)(wi == 0 ? a.q[0] : wi == 1 ? a.q[1] : a.q[2]) + r.row * qn;
  r.sb = (const char *)(wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2]) + r.row * sn;
  r.y = (wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2]) + r.row;
  return r;
}

template <int NW, int R>
__global__ void __launch_bounds__(NW * 32, 32 / NW) k_mvt(const mv_args a, const uint4 *__restrict__ xq,
                                                         const float2 *__restrict__ xs, int K, int lg, int sbk, int S,
                                                         int64_t T, int *__restrict__ ctr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char mvt_sm[];
  const int V = K >> 5, G = V >> lg;
  const uint32_t qn = (uint32_t)K >> 1, sn = (uint32_t)G * (sbk == SBK_F32 ? 8u : 4u);
  const uint32_t rs = R * (qn + sn); /* stage bytes: R rows of words, then their R scale/bias rows */
  uint4 *xa = (uint4 *)mvt_sm, *xb = xa + V;
  float2 *xd = (float2 *)(xb + V);
  unsigned char *stg = (unsigned char *)(xd + V); /* V * 40 bytes: 16-aligned when V is even */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t *bar = (uint64_t *)(stg + (size_t)NW * S * rs) + warp * S;
  volatile int *sg = (volatile int *)((uint64_t *)(stg + (size_t)NW * S * rs) + NW * S) + warp * S; /* group a stage holds, -1 none */
  unsigned char *my = stg + (size_t)warp * S * rs;
  const int64_t g0 = T * blockIdx.x / gridDim.x, g1 = T * (blockIdx.x + 1) / gridDim.x;
  const int ngr = g1 - g0 > warp ? (int)((g1 - g0 - warp + NW - 1) / NW) : 0; /* groups of this warp */
  pdl_trigger();
  if (lane == 0) {
    for (int s = 0; s < S; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    /* groups: static (g0 + warp + NW i) or, with ctr, claimed from a counter (S at once here,
     * one a refill), so that blocks that became resident early do the work of late ones */
    const int base = ctr ? atomicAdd(ctr, S) : 0;
    for (int i = 0; i < S; i++) { /* weights only: before the wait */
      const int64_t g = ctr ? (int64_t)base + i : (i < ngr ? g0 + warp + (int64_t)NW * i : T);
      sg[i] = g < T ? (int)g : -1;
      if (g >= T) continue;
      const mvt_grp gr = mvt_group<R>(a, g, qn, sn);
      mvt_issue(bar + i, my + (size_t)i * rs, gr.q, gr.nr * qn, gr.sb, gr.nr * sn);
    }
  }
  __syncwarp();
  pdl_wait();
  for (int v = threadIdx.x; v < V; v += NW * 32) {
    xa[v] = __ldcg(xq + 2 * v);
    xb[v] = __ldcg(xq + 2 * v + 1);
    xd[v] = __ldcg(xs + v);
  }
  __syncthreads();
  constexpr int MK = 0x0F0F0F0F;
  /* stages are consumed round-robin; one without a group stays without (its parity then only
   * counts valid uses); the loop ends after S empty stages in a row */
  for (int i = 0, empty = 0; empty < S; i++) {
    const int s = i % S;
    __syncwarp();
    const int gi = sg[s];
    if (gi < 0) { empty++; continue; }
    empty = 0;
    mvt_wait(bar + s, (uint32_t)(i / S) & 1u);
    const unsigned char *st = my + (size_t)s * rs;
    const mvt_grp gr = mvt_group<R>(a, gi, qn, sn);
    const unsigned char *sbs = st + (size_t)gr.nr * qn; /* scale/bias rows follow the nr word rows */
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    /* rows r >= gr.nr of a partial group read stage bytes that are not theirs (never stored) */
    constexpr int UV = R >= 8 ? 1 : R >= 4 ? 2 : 4;
#pragma unroll UV
    for (int v = lane; v < V; v += 32) {
      const uint4 x0 = xa[v], x1 = xb[v];
      const float2 d2 = xd[v];
#pragma unroll
      for (int r = 0; r < R; r++) {
        const uint4 w = ((const uint4 *)(st + (size_t)r * qn))[v];
        float2 p;
        if (sbk == SBK_F32) p = ((const float2 *)(sbs + (size_t)r * sn))[v >> lg];
        else {
          const uint32_t u = ((const uint32_t *)(sbs + (size_t)r * sn))[v >> lg];
          if (sbk == SBK_BF16) p = make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
          else p = __half22float2(*reinterpret_cast<const __half2 *>(&u));
        }
        int d = __dp4a((int)(w.x & MK), (int)x0.x, 0), e = __dp4a((int)(w.z & MK), (int)x1.x, 0);
        d = __dp4a((int)((w.x >> 4) & MK), (int)x0.y, d);
        e = __dp4a((int)((w.z >> 4) & MK), (int)x1.y, e);
        d = __dp4a((int)(w.y & MK), (int)x0.z, d);
        e = __dp4a((int)(w.w & MK), (int)x1.z, e);
        d = __dp4a((int)((w.y >> 4) & MK), (int)x0.w, d);
        e = __dp4a((int)((w.w >> 4) & MK), (int)x1.w, e);
        acc[r] = fmaf(p.x, (float)(d + e) * d2.x, fmaf(p.y, d2.y, acc[r]));
      }
    }
    __syncwarp();
    if (lane == 0) { /* the stage is consumed: request the next group into it */
      const int64_t g = ctr ? (int64_t)atomicAdd(ctr, 1) : (i + S < ngr ? g0 + warp + (int64_t)NW * (i + S) : T);
      sg[s] = g < T ? (int)g : -1;
      if (g < T) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        const mvt_grp gn = mvt_group<R>(a, g, qn, sn);
        mvt_issue(bar + s, (void *)st, gn.q, gn.nr * qn, gn.sb, gn.nr * sn);
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      const float t = warp_sum(acc[r]);
      if (lane == r && r < gr.nr) gr.y[r] = t;
    }
  }
  /* the last warp of the launch resets the claim counter ([0]) and the warp count ([1]) for the
   * next launch that uses them (a later graph replay) */
  if (ctr && lane == 0 && atomicAdd(ctr + 1, 1) == (int)gridDim.x * NW - 1) {
    ctr[0] = 0;
    ctr[1] = 0;
  }
#else
  (void)a; (void)xq; (void)xs; (void)K; (void)lg; (void)sbk; (void)S; (void)T; (void)ctr;
#endif
}

/* bytes of one row stage (packed words + scale/bias pairs); 0 when k_mvt cannot run w */
static uint32_t mvt_row_bytes(const cu_weight *w) {
  if (w->kind != CW_Q4 || w->cols % 64 || w->cols > (1 << 20)) return 0;
  const int64_t G = w->cols / w->gs;
  const int64_t rs = w->cols / 2 + G * (w->sbk == SBK_F32 ? 8 : 4);
  if (rs % 16 || ((uintptr_t)w->q & 15) || ((uintptr_t)w->sb & 15)) return 0;
  return (uint32_t)rs;
}
static int mvt_n_sm() {
  static int n = 0;
  if (!n) {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    n = major >= 9 && v > 0 ? v : -1; /* bulk copies and mbarrier transaction counts: sm_90 */
  }
  return n;
}
/* launches k_mvt when it applies (n = 1, sm_90, layout), else returns false */
int g_cu_mvt_nw = 0, g_cu_mvt_r = 0; /* SMELT_CUDA_MVT_NW (4/8), SMELT_CUDA_MVT_R (rows a stage): 0 automatic */
int g_cu_mvt_stage = 10; /* SMELT_CUDA_MVT_STAGE: KB of one stage (R = rows that fit, at most 8) */
template <int NW, int R>
static void mvt_go(const mv_args &a, const uint4 *xq, const float2 *xs, int K, int lg, int sbk, int S, int64_t T,
                   unsigned grid, size_t smem, cudaStream_t s, int *ctr) {
  static size_t set = 0; /* dynamic shared memory limit already raised to */
  if (smem > set) {
    cudaFuncSetAttribute(k_mvt<NW, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    set = smem;
  }
  cu_launch(k_mvt<NW, R>, dim3(grid), dim3(NW * 32), smem, s, a, xq, xs, K, lg, sbk, S, T, ctr);
}
template <int NW>
static void mvt_go_r(int R, const mv_args &a, const uint4 *xq, const float2 *xs, int K, int lg, int sbk, int S,
                     int64_t T, unsigned grid, size_t smem, cudaStream_t s, int *ctr) {
  switch (R) {
  case 1: mvt_go<NW, 1>(a, xq, xs, K, lg, sbk, S, T, grid, smem, s, ctr); break;
  case 2: mvt_go<NW, 2>(a, xq, xs, K, lg, sbk, S, T, grid, smem, s, ctr); break;
  case 4: mvt_go<NW, 4>(a, xq, xs, K, lg, sbk, S, T, grid, smem, s, ctr); break;
  default: mvt_go<NW, 8>(a, xq, xs, K, lg, sbk, S, T, grid, smem, s, ctr); break;
  }
}
/* claim counters of the dynamic mode (SMELT_CUDA_MVT_DYN): pairs of zeroed ints per device, one
 * pair a launch (recorded launches keep theirs), reused round-robin */
int g_cu_mvt_dyn = 0;
#define MVT_CTR_PAIRS 4096
static int *s_mvt_ctr[16];
static unsigned s_mvt_next[16];
static void mlp_init();
void cu_mv_init(int dev) {
  mlp_init(); /* occupancy queries outside any stream capture */
  if (dev < 0 || dev >= 16 || s_mvt_ctr[dev]) return;
  if (cudaMalloc(&s_mvt_ctr[dev], MVT_CTR_PAIRS * 2 * sizeof(int)) != cudaSuccess) { s_mvt_ctr[dev] = NULL; return; }
  cudaMemset(s_mvt_ctr[dev], 0, MVT_CTR_PAIRS * 2 * sizeof(int));
  cudaDeviceSynchronize();
}
static int *mvt_ctr() {
  if (!g_cu_mvt_dyn) return NULL;
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 16 || !s_mvt_ctr[dev]) return NULL;
  return s_mvt_ctr[dev] + 2 * (s_mvt_next[dev]++ % MVT_CTR_PAIRS);
}
static bool mvt_launch(const cu_weight *const *ws, float *const *ys, int nw, const uint4 *xq, const float2 *xs,
                       cudaStream_t s) {
  if (!g_cu_mvt || nw < 1 || nw > 3) return false;
  const int n_sm = mvt_n_sm();
  if (n_sm <= 0) return false;
  const uint32_t rs = mvt_row_bytes(ws[0]);
  if (!rs) return false;
  for (int i = 0; i < nw; i++)
    if (mvt_row_bytes(ws[i]) != rs || ws[i]->cols != ws[0]->cols || ws[i]->sbk != ws[0]->sbk || ws[i]->gs != ws[0]->gs ||
        ws[i]->rows > INT32_MAX)
      return false;
  int R = 1;
  while (R < 8 && (size_t)(2 * R) * rs <= ((size_t)g_cu_mvt_stage << 10)) R *= 2;
  if (g_cu_mvt_r == 1 || g_cu_mvt_r == 2 || g_cu_mvt_r == 4 || g_cu_mvt_r == 8) R = g_cu_mvt_r;
  int64_t T = 0;
  for (int i = 0; i < nw; i++) T += (ws[i]->rows + R - 1) / R;
  const size_t stage = (size_t)R * rs;
  const int K = (int)ws[0]->cols, V = K / 32;
  const size_t xbytes = (size_t)V * 40;
  const size_t budget = (size_t)(g_cu_mvt_kb > 8 ? g_cu_mvt_kb : 8) << 10;
  int NW = g_cu_mvt_nw == 4 || g_cu_mvt_nw == 8 ? g_cu_mvt_nw : 8;
  int S = (int)(budget / ((size_t)NW * stage));
  int64_t grid;
  if (g_cu_mvt_bps == 0) { /* one-shot blocks: S groups a warp, all requested before the wait */
    if (!g_cu_mvt_nw) NW = 4;
    S = (int)(budget / ((size_t)NW * stage));
    if (S < 1) S = 1;
    if (S > 16) S = 16;
    grid = (T + (int64_t)NW * S - 1) / ((int64_t)NW * S);
  } else {
    if (S < 2 && !g_cu_mvt_nw) { NW = 4; S = (int)(budget / ((size_t)NW * stage)); }
    if (S < 2) S = 2;
    const int bps = g_cu_mvt_bps >= 1 && g_cu_mvt_bps <= 4 ? g_cu_mvt_bps : 1;
    const int64_t need = (T + NW - 1) / NW;
    grid = (int64_t)n_sm * bps;
    if (grid > need) grid = need;
    const int64_t gpw = (T + grid * NW - 1) / (grid * NW); /* groups of the busiest warp */
    if (S > gpw) S = (int)gpw;
    if (S > 16) S = 16;
  }
  const size_t smem = xbytes + (size_t)NW * S * (stage + 8 + 4);
  if (smem > 220 * 1024) return false;
  mv_args a;
  memset(&a, 0, sizeof a);
  for (int i = 0; i < 3; i++) {
    a.bstart[i] = i < nw ? 0 : 0x7fffffff;
    if (i < nw) { a.q[i] = ws[i]->q; a.sb[i] = ws[i]->sb; a.y[i] = ys[i]; a.M[i] = (int)ws[i]->rows; }
  }
  a.bstart[3] = 0x7fffffff;
  const int lg = ws[0]->gs == 32 ? 0 : ws[0]->gs == 64 ? 1 : 2;
  int *ctr = mvt_ctr();
  if (NW == 8) mvt_go_r<8>(R, a, xq, xs, K, lg, ws[0]->sbk, S, T, (unsigned)grid, smem, s, ctr);
  else mvt_go_r<4>(R, a, xq, xs, K, lg, ws[0]->sbk, S, T, (unsigned)grid, smem, s, ctr);
  return true;
}

/* ---------------- one-token matvec with the block's weights held in registers (k_mvr) ----------------
 * Warp w of a block owns RT consecutive rows, lane l the 16-byte vectors l + 32 k (k < VT) of
 * each row (and their scale/bias words): every weight load of the block is issued before the
 * wait, so a matvec queued behind a latency-bound kernel (decode attention, a norm) has its whole
 * weight slice in flight while that kernel runs, and after the wait only x (staged once in shared
 * memory) and the dot products remain. Same arithmetic as k_mvq4. Needs V = K/32 <= 32 VT and
 * 16-bit scales; VT = ceil(V / 32) in 1..4, 8, 14. SMELT_CUDA_MVR: bit mask of CU_Q4_* roles that use it (n = 1). */
int g_cu_mvr = -1;   /* -1: automatic (mvr_on) */
int g_cu_mvr_glu = 0; /* SMELT_CUDA_MVR_GLU 1 / 2: gate/up with silu(gate)*up quantized in it (k_mvr<GLU>) */
int g_cu_mvr_nw = 8; /* SMELT_CUDA_MVR_NW: warps a block (4 or 8) */
int g_cu_mvr_rt = -1; /* SMELT_CUDA_MVR_RT: rows a warp (0: 16 / VT vectors a thread; -1, the default: 2 for K = 4096, else 0) */
int g_cu_mvr_count = 0; /* k_mvr launches (tests) */
/* GLU (gate/up, weights 0 and 1 with the same rows; the chunk's gate and up are written too and
 * h = silu(gate) * up of the chunk is quantized into hq/hs in the layout of k_quant_x, same
 * formulas, for the down projection):
 *   1: block c owns the 32-row chunk c of both (the first NW / 2 warps gate, the others up);
 *   2: a cluster of two blocks per chunk (block 2c gate, 2c + 1 up, NW * RT == 32): the up block
 *      writes its 32 values into the gate block's shared memory (sm_90) */
template <int VT, int RT, int NW, int GLU>
__global__ void __launch_bounds__(NW * 32, NW * 32 >= 512 ? 1 : 512 / (NW * 32)) /* <= 128 registers */
    k_mvr(const mv_args a, const uint4 *__restrict__ xq, const float2 *__restrict__ xs, int K, int lg, int sbk,
          uint8_t *__restrict__ hq, float2 *__restrict__ hs) {
  static_assert(GLU != 1 || (NW / 2) * RT == 32, "a GLU block owns 32 rows of gate and of up");
  static_assert(GLU != 2 || NW * RT == 32, "a GLU cluster block owns 32 rows of gate or of up");
  __shared__ uint4 xa[32 * VT], xb[32 * VT];
  __shared__ float2 xd[32 * VT];
  __shared__ float hsm[GLU ? 64 : 1];
  const int tile = GLU == 1 ? (int)(threadIdx.x >> 5) / (NW / 2) : GLU == 2 ? (int)(blockIdx.x & 1) : blockIdx.x;
  const int wi = tile >= a.bstart[2] ? 2 : tile >= a.bstart[1] ? 1 : 0;
  const uint4 *__restrict__ q = (const uint4 *)(wi == 0 ? a.q[0] : wi == 1 ? a.q[1] : a.q[2]);
  const uint32_t *__restrict__ sb = (const uint32_t *)(wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2]);
  float *__restrict__ y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int bst = wi == 0 ? a.bstart[0] : wi == 1 ? a.bstart[1] : a.bstart[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int V = K >> 5, G = V >> lg;
  const int row0 = GLU == 1 ? (int)blockIdx.x * 32 + (warp % (NW / 2)) * RT
                 : GLU == 2 ? (int)(blockIdx.x >> 1) * 32 + warp * RT : (tile - bst) * (NW * RT) + warp * RT;
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
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* GLU 2: the pair's blocks must both have started before the up block writes into the gate
   * block's shared memory (arrive here, wait before that store) */
  if (GLU == 2) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
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
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (GLU == 2) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
#pragma unroll
  for (int r = 0; r < RT; r++) {
    const float t = warp_sum(acc[r]);
    if (lane == r && row0 + r < M) y[row0 + r] = t;
    if (GLU == 1 && lane == r) hsm[wi * 32 + (warp % (NW / 2)) * RT + r] = t;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (GLU == 2 && lane == r) /* gate: own shared memory; up: the gate block's */
      *cooperative_groups::this_cluster().map_shared_rank(hsm + wi * 32 + warp * RT + r, 0) = t;
#endif
  }
  bool quant = GLU == 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (GLU == 2) {
    cooperative_groups::this_cluster().sync(); /* the up block's values are in the gate block */
    quant = wi == 0;
  }
#endif
  if (GLU == 1) __syncthreads();
  if (quant) {
    if (threadIdx.x < 32) { /* the chunk's quantization, as k_quant_x */
      const float g = hsm[lane], v = g / (1.f + expf(-g)) * hsm[32 + lane];
      float am = fabsf(v), sum = v;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      }
      int qi = am > 0.f ? __float2int_rn(v * (127.f / am)) : 0;
      qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
      const int jj = lane >> 3, e = lane & 7;
      const int64_t b = GLU == 2 ? blockIdx.x >> 1 : blockIdx.x;
      hq[b * 32 + (2 * jj + (e & 1)) * 4 + (e >> 1)] = (uint8_t)(int8_t)qi;
      if (lane == 0) hs[b] = make_float2(am * (1.f / 127.f), sum);
    }
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
static bool mvr_on(int role, const cu_weight *w) {
  if (g_cu_mvr >= 0) return (g_cu_mvr >> role) & 1;
  if (role == CU_Q4_LM) return true;
  return role == CU_Q4_GU && w->rows * w->cols >= ((int64_t)32 << 20);
}
static bool mvr_launch(const cu_weight *const *ws, float *const *ys, int nw, const uint4 *xq, const float2 *xs,
                       int role, cudaStream_t s, bool dry = false) {
  if (role < 0 || role >= CU_Q4_ROLES || nw < 1 || nw > 3 || !mvr_on(role, ws[0])) return false;
  const cu_weight *w0 = ws[0];
  if (w0->kind != CW_Q4 || w0->sbk == SBK_F32 || w0->cols % 64 || w0->cols > 16384 || w0->cols < 1024) return false;
  for (int i = 0; i < nw; i++)
    if (ws[i]->kind != CW_Q4 || ws[i]->cols != w0->cols || ws[i]->sbk != w0->sbk || ws[i]->gs != w0->gs ||
        ws[i]->rows > INT32_MAX)
      return false;
  const int K = (int)w0->cols, V = K / 32, VT = (V + 31) / 32;
  const int NW = g_cu_mvr_nw == 4 ? 4 : 8;
  if (VT > 4 && VT != 8 && VT != 14) return false;
  if (w0->gs != 32 && w0->gs != 64 && w0->gs != 128) return false;
  int RT = VT >= 14 ? 1 : VT >= 8 ? 2 : VT >= 3 ? 4 : 8;
  /* SMELT_CUDA_MVR_RT: only the instantiated (VT, RT) pairs of the switch below */
  const int rt = g_cu_mvr_rt >= 0 ? g_cu_mvr_rt : VT == 4 ? 2 : 0; /* 2: 8B lm_head 481-484 vs 480 tok/s; 1B (VT 2) slower */
  if ((rt == 1 && (VT == 2 || VT == 4 || VT == 8)) || (rt == 2 && VT <= 8) || (rt == 4 && VT <= 4) ||
      (rt == 8 && VT <= 2))
    RT = rt;
  if (dry) return true;
  mv_args a;
  memset(&a, 0, sizeof a);
  a.ef = (g_cu_wef >> 4) & 3;
  int nb = 0;
  for (int i = 0; i < 3; i++) {
    a.bstart[i] = i < nw ? nb : 0x7fffffff;
    if (i < nw) {
      a.q[i] = ws[i]->q; a.sb[i] = ws[i]->sb; a.y[i] = ys[i]; a.M[i] = (int)ws[i]->rows;
      nb += (int)((ws[i]->rows + NW * RT - 1) / (NW * RT));
    }
  }
  a.bstart[3] = 0x7fffffff;
  const int lg = w0->gs == 32 ? 0 : w0->gs == 64 ? 1 : 2;
  const int sbk = w0->sbk;
#define MVR_GO(VT_, RT_, NW_) \
  cu_launch(k_mvr<VT_, RT_, NW_, 0>, dim3(nb), dim3(NW_ * 32), 0, s, a, xq, xs, K, lg, sbk, (uint8_t *)NULL, (float2 *)NULL)
#define MVR_NW(VT_, RT_) do { if (NW == 4) MVR_GO(VT_, RT_, 4); else MVR_GO(VT_, RT_, 8); } while (0)
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
#undef MVR_GO
  g_cu_mvr_count++;
  return true;
}

/* launch with a cluster of two blocks (and programmatic dependent launch when on) */
template <typename... KArgs, typename... Args>
static void mvr_cluster2(void (*kern)(KArgs...), dim3 grid, dim3 block, cudaStream_t s, Args... args) {
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 2;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg;
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = g_cu_pdl ? 2 : 1;
  cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
}
/* gate/up (+ silu(gate)*up quantized into hq) by k_mvr<GLU> (SMELT_CUDA_MVR_GLU 1 or 2): false when
 * no variant applies */
static bool mvr_glu_launch(const cu_weight *const *ws, float *const *ys, const uint4 *xq, const float2 *xs, uint8_t *hq,
                           float2 *hs, cudaStream_t s, bool dry = false) {
  const cu_weight *g = ws[0], *u = ws[1];
  if (!g_cu_mvr_glu || !mvr_on(CU_Q4_GU, g)) return false;
  if (g->kind != CW_Q4 || u->kind != CW_Q4 || g->sbk == SBK_F32 || g->sbk != u->sbk || g->gs != u->gs ||
      g->cols != u->cols || g->rows != u->rows || g->rows % 32 || g->rows > INT32_MAX || g->cols % 64)
    return false;
  const int K = (int)g->cols, V = K / 32;
  if (V != 128 && V != 64) return false;
  if (g->gs != 32 && g->gs != 64 && g->gs != 128) return false;
  if (g_cu_mvr_glu == 2 && mvt_n_sm() <= 0) return false; /* clusters: sm_90 */
  if (dry) return true;
  mv_args a;
  memset(&a, 0, sizeof a);
  for (int i = 0; i < 2; i++) { a.q[i] = ws[i]->q; a.sb[i] = ws[i]->sb; a.y[i] = ys[i]; a.M[i] = (int)ws[i]->rows; }
  a.bstart[0] = 0; a.bstart[1] = 1; a.bstart[2] = a.bstart[3] = 0x7fffffff; /* "tile" = warp half */
  const int lg = g->gs == 32 ? 0 : g->gs == 64 ? 1 : 2, sbk = g->sbk;
  const dim3 grid((unsigned)(g->rows / 32));
#define MVRG_GO(VT_, RT_) \
  cu_launch(k_mvr<VT_, RT_, 64 / RT_, 1>, grid, dim3(64 / RT_ * 32), 0, s, a, xq, xs, K, lg, sbk, hq, hs)
#define MVRC_GO(VT_, RT_) \
  mvr_cluster2(k_mvr<VT_, RT_, 32 / RT_, 2>, dim3(2 * grid.x), dim3(32 / RT_ * 32), s, a, xq, xs, K, lg, sbk, hq, hs)
  if (g_cu_mvr_glu == 2) {
    if (V == 128) MVRC_GO(4, 4);
    else MVRC_GO(2, 8);
  } else if (V == 128 && g_cu_mvr_rt == 2) MVRG_GO(4, 2);
  else if (V == 128) MVRG_GO(4, 4);
  else if (V == 64 && g_cu_mvr_rt == 4) MVRG_GO(2, 4);
  else if (V == 64) MVRG_GO(2, 8);
  else return false;
#undef MVRG_GO
#undef MVRC_GO
  g_cu_mvr_count++;
  return true;
}

/* ---------------- fused one-token MLP: gate/up, silu(gate)*up quantized, down (k_mlp1) ----------------
 * SMELT_CUDA_MLP (default 2: with the residual add + rmsnorm before it; measured on the H100, 8B
 * 2.23-2.24 vs 2.30-2.31 ms a step, docs/benchmarks.md). A persistent kernel, one block of 16 warps an SM
 * (grid = the blocks that fit at once): the blocks take the 32-row chunks of gate and up in turn
 * (k_mvr's register layout: warps 0-7 gate, 8-15 up, 4 rows a warp; the next chunk's weights are
 * requested as the current one's are consumed), write gate and up, quantize h = silu(gate) * up of
 * each chunk into hq/hs (k_quant_x's layout and formulas), arrive at a grid barrier (a counter
 * pair per launch, zero, left zero), request their first down rows, wait at the barrier (split so
 * that the arrival's fences do not wait for those loads: SMELT_CUDA_MLP_BAR), stage h in shared memory and take
 * 16-row items of the down projection (a warp a row, pipelined the same way). One launch instead
 * of gate/up, the quantization of h and down. Needs K = 1024 VG, F = 1024 VD, 16-bit scales. */
#ifdef SMELT_CUDA_TRACE
/* MLP launches: [64] block arrivals (launch = arrivals / grid), [65] the launch traced, [66 + 2k] /
 * [67 + 2k] first / last block at event k (TRM(k)) */
#define TRM_BEGIN                                                                                  \
  __shared__ int trm_s;                                                                            \
  const unsigned long long trm_t0 = tr_now();                                                      \
  if (threadIdx.x == 0) trm_s = tr_m && atomicAdd(tr_m + 64, 1ull) / gridDim.x == tr_m[65];        \
  __syncthreads();                                                                                 \
  const bool trm = trm_s;                                                                          \
  if (trm && threadIdx.x == 0) { atomicMin(tr_m + 66, trm_t0); atomicMax(tr_m + 67, trm_t0); }
#define TRM(k) do { if (trm) { const unsigned long long t_ = tr_now(); atomicMin(tr_m + 66 + 2 * (k), t_); atomicMax(tr_m + 67 + 2 * (k), t_); } } while (0)
#else
#define TRM_BEGIN
#define TRM(k) do { } while (0)
#endif
int g_cu_mlp = 2; /* SMELT_CUDA_MLP: 0 off, 1, 2 (default: with the add + rmsnorm before it), 3 */
int g_cu_mlp_count = 0, g_cu_mlp_qkv_count = 0, g_cu_dnorm_count = 0; /* k_mlp1 launches, those with q/k/v, deferred norm (tests) */
struct mlp_args {
  const uint4 *gq, *uq, *dq;
  const uint32_t *gsb, *usb, *dsb;
  float *gy, *uy, *y;
  uint8_t *hq;
  float2 *hs;
  int K, F, lg, sbk;
  int split; /* the grid barriers as blocks_arrive / blocks_wait around the weight prefetch (SMELT_CUDA_MLP_BAR) */
  unsigned *bar;
  /* NORM: x is rmsnorm(nx + na) * (nw + off), computed by every block as k_norm_q does (bitwise);
   * block 0 writes nx + na to hout */
  const float *nx, *na, *nw;
  float off, eps;
  float *hout;
  /* QKV (with NORM): after down, a second grid barrier (bar2), then x = hout + y is written to xres,
   * x1 = rmsnorm(x) * (nw1 + off1) quantized, and the three weights q/k/v (64-row items) of x1 */
  unsigned *bar2;
  float *xres;
  const float *nw1;
  float off1, eps1;
  const uint4 *qq[3];
  const uint32_t *qsb[3];
  float *qy[3];
  int qitems[3]; /* 64-row items of each (rows / 64) */
  /* DNORM (with NORM, not QKV; dx != NULL): the residual add after down and the next norm's int8
   * x, deferred: block b takes the down items 2b, 2b + 1 (rows 32b .. 32b + 31), then writes
   * dx = hout + y for them, dq8 / dxs = their int8 quantization of dx * (dw + doff) (not divided by
   * the rms) and dssp[b] = the sum of dx^2; the consumer scales by the rms (cu_q4_set_dnorm) */
  float *dx;
  const float *dw;
  float doff;
  uint8_t *dq8;
  float2 *dxs;
  float *dssp;
  int ef; /* g_cu_wef & 3: 1 the weights, 2 their scales read with the L2 evict-first policy */
};
template <int VG, int VD, bool NORM, bool QKV>
__global__ void __launch_bounds__(512, 1) k_mlp1(const mlp_args m, const uint4 *__restrict__ xq,
                                                const float2 *__restrict__ xs) {
  __shared__ uint4 xa[32 * (VD > VG ? VD : VG)], xb[32 * (VD > VG ? VD : VG)];
  __shared__ float2 xd[32 * (VD > VG ? VD : VG)];
  __shared__ float hsm[2][64];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = warp >> 3, wr = warp & 7;
  const int V = 32 * VG, VF = 32 * VD, lg = m.lg, sbk = m.sbk;
  const int G = V >> lg, GF = VF >> lg, nch = m.F >> 5, ndn = m.K >> 4;
  const uint4 *__restrict__ wq = half ? m.uq : m.gq;
  const uint32_t *__restrict__ wsb = half ? m.usb : m.gsb;
  float *__restrict__ wy = half ? m.uy : m.gy;
  TRM_BEGIN
  pdl_trigger();
  uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (m.ef) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
  const bool efw = m.ef & 1, efs = m.ef & 2;
#define MLP_LDW(ptr) (efw ? ld_stream_p((ptr), pol) : ld_stream(ptr))
#define MLP_LDS(ptr) (efs ? ldg_p((ptr), pol) : __ldg(ptr))
  uint4 w[4][VG];
  uint32_t p[4][VG];
  int c = blockIdx.x;
  if (c < nch) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int64_t row = (int64_t)c * 32 + wr * 4 + r;
#pragma unroll
      for (int k = 0; k < VG; k++) w[r][k] = MLP_LDW(wq + row * V + lane + 32 * k);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int64_t row = (int64_t)c * 32 + wr * 4 + r;
#pragma unroll
      for (int k = 0; k < VG; k++) p[r][k] = MLP_LDS(wsb + row * G + ((lane + 32 * k) >> lg));
    }
  }
  /* NORM: the norm weight does not depend on the previous kernel: read before the wait */
  const int dim4 = V * 8;
  float4 gw[2];
  if (NORM) {
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const int idx = threadIdx.x + 512 * k;
      gw[k] = idx < dim4 ? ((const float4 *)m.nw)[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  pdl_wait();
  if (threadIdx.x == 0) TRM(1);
  if (!NORM) {
    for (int v = threadIdx.x; v < V; v += 512) {
      xa[v] = __ldcg(xq + 2 * v);
      xb[v] = __ldcg(xq + 2 * v + 1);
      xd[v] = __ldcg(xs + v);
    }
  } else {
    mlp_norm_q(m.nx, m.na, gw, m.off, m.eps, m.hout, dim4, xa, xb, xd, &hsm[0][0]); /* hsm is free until the first chunk */
  }
  __syncthreads();
  if (threadIdx.x == 0) TRM(2);
  for (int it = 0; c < nch; c += gridDim.x, it++) {
    const int cn = c + gridDim.x;
    float acc[4] = { 0.f, 0.f, 0.f, 0.f };
#pragma unroll
    for (int k = 0; k < VG; k++) {
      const int v = lane + 32 * k;
      const uint4 x0 = xa[v], x1 = xb[v];
      const float2 d2 = xd[v];
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const float2 pp = sb_pair(p[r][k], sbk);
        acc[r] = fmaf(pp.x, (float)dot_q4(w[r][k], x0, x1) * d2.x, fmaf(pp.y, d2.y, acc[r]));
        if (cn < nch) { /* the next chunk's vector into the consumed registers */
          const int64_t row = (int64_t)cn * 32 + wr * 4 + r;
          w[r][k] = MLP_LDW(wq + row * V + v);
          p[r][k] = MLP_LDS(wsb + row * G + (v >> lg));
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const float t = warp_sum(acc[r]);
      if (lane == r) {
        wy[(int64_t)c * 32 + wr * 4 + r] = t;
        hsm[it & 1][half * 32 + wr * 4 + r] = t;
      }
    }
    __syncthreads(); /* hsm[it & 1] is complete; hsm[(it + 1) & 1] was read by warp 0 before this */
    if (warp == 0) { /* the chunk's quantization, as k_quant_x */
      const float g = hsm[it & 1][lane], hv = g / (1.f + expf(-g)) * hsm[it & 1][32 + lane];
      float am = fabsf(hv), sum = hv;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      }
      int qi = am > 0.f ? __float2int_rn(hv * (127.f / am)) : 0;
      qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
      const int jj = lane >> 3, e = lane & 7;
      m.hq[(int64_t)c * 32 + (2 * jj + (e & 1)) * 4 + (e >> 1)] = (uint8_t)(int8_t)qi;
      if (lane == 0) m.hs[c] = make_float2(am * (1.f / 127.f), sum);
    }
  }
  if (threadIdx.x == 0) TRM(3);
  /* the first down rows do not depend on h: requested before the barrier (m.split: after this
   * block's arrival, so that the arrival's fences do not wait for them) */
  if (m.split) blocks_arrive(m.bar);
  uint4 wd[VD];
  uint32_t pd[VD];
  const bool dn = !QKV && m.dx != NULL;
  int e = dn ? 2 * (int)blockIdx.x : (int)blockIdx.x;
  if (e < ndn) {
    const int64_t row = (int64_t)e * 16 + warp;
#pragma unroll
    for (int k = 0; k < VD; k++) wd[k] = MLP_LDW(m.dq + row * VF + lane + 32 * k);
#pragma unroll
    for (int k = 0; k < VD; k++) pd[k] = MLP_LDS(m.dsb + row * GF + ((lane + 32 * k) >> lg));
  }
  /* grid barrier: every block's chunks of h are written (all blocks are resident: the grid is the
   * number that fits at once, and the previous kernel has completed) */
  if (m.split) blocks_wait(m.bar, gridDim.x);
  else mlp_grid_sync(m.bar);
  if (threadIdx.x == 0) TRM(4);
  for (int v = threadIdx.x; v < VF; v += 512) {
    xa[v] = __ldcg((const uint4 *)m.hq + 2 * v);
    xb[v] = __ldcg((const uint4 *)m.hq + 2 * v + 1);
    xd[v] = __ldcg(m.hs + v);
  }
  __syncthreads();
  float dh = 0.f, dwt = 0.f; /* DNORM, warp 0: x + a and the norm weight of the current pair's row lane */
  for (int pi = 0; e < ndn; pi++) {
    const int en = dn ? ((e & 1) ? e - 1 + 2 * (int)gridDim.x : e + 1) : e + (int)gridDim.x;
    if (dn && !(e & 1) && warp == 0) {
      const int r = 16 * e + lane;
      dh = __ldcg(m.hout + r); /* used after the pair: the loads stay in flight */
      dwt = __ldg(m.dw + r);
    }
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < VD; k++) {
      const int v = lane + 32 * k;
      const uint4 x0 = xa[v], x1 = xb[v];
      const float2 d2 = xd[v];
      const float2 pp = sb_pair(pd[k], sbk);
      acc = fmaf(pp.x, (float)dot_q4(wd[k], x0, x1) * d2.x, fmaf(pp.y, d2.y, acc));
      if (en < ndn) {
        const int64_t row = (int64_t)en * 16 + warp;
        wd[k] = MLP_LDW(m.dq + row * VF + v);
        pd[k] = MLP_LDS(m.dsb + row * GF + (v >> lg));
      }
    }
    const float t = warp_sum(acc);
    if (lane == 0) m.y[(int64_t)e * 16 + warp] = t;
    if (dn) {
      float *hb = &hsm[(pi >> 1) & 1][0]; /* alternate pairs: warp 0 may still read the last one */
      if (lane == 0) hb[(e & 1) * 16 + warp] = t;
      if (e & 1) {
        __syncthreads();
        if (warp == 0) { /* the pair's 32 rows: as the add + k_norm_q would, without 1 / rms */
          const int j = e >> 1;
          const float v = dh + hb[lane], tv = v * (dwt + m.doff);
          m.dx[32 * j + lane] = v;
          float am = fabsf(tv), sum = tv, ss = v * v;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) {
            am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
          }
          int qi = am > 0.f ? __float2int_rn(tv * (127.f / am)) : 0;
          qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
          const int jj = lane >> 3, e8 = lane & 7;
          m.dq8[(int64_t)j * 32 + (2 * jj + (e8 & 1)) * 4 + (e8 >> 1)] = (uint8_t)(int8_t)qi;
          if (lane == 0) {
            m.dxs[j] = make_float2(am * (1.f / 127.f), sum);
            m.dssp[j] = ss;
          }
        }
      }
    }
    e = en;
  }
  if (threadIdx.x == 0) TRM(5);
  if (QKV) {
    /* the next layer's q/k/v: 64-row items (4 rows a warp), their first weights before barrier 2 */
    const int n0 = m.qitems[0], n01 = n0 + m.qitems[1], nit = n01 + m.qitems[2];
    uint4 wv[4][VG];
    uint32_t pv[4][VG];
    int f = blockIdx.x;
    if (m.split) blocks_arrive(m.bar2);
    auto item = [&](int i, int &wi, int64_t &row) {
      wi = i >= n01 ? 2 : i >= n0 ? 1 : 0;
      row = (int64_t)(i - (wi == 2 ? n01 : wi == 1 ? n0 : 0)) * 64 + warp * 4;
    };
    if (f < nit) {
      int wi;
      int64_t row;
      item(f, wi, row);
      const uint4 *qw = m.qq[wi];
      const uint32_t *qs = m.qsb[wi];
#pragma unroll
      for (int r = 0; r < 4; r++)
#pragma unroll
        for (int k = 0; k < VG; k++) wv[r][k] = ld_stream(qw + (row + r) * V + lane + 32 * k);
#pragma unroll
      for (int r = 0; r < 4; r++)
#pragma unroll
        for (int k = 0; k < VG; k++) pv[r][k] = __ldg(qs + (row + r) * G + ((lane + 32 * k) >> lg));
    }
    if (m.split) blocks_wait(m.bar2, gridDim.x); /* every block's down rows are written */
    else mlp_grid_sync(m.bar2);
    float4 gw1[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const int idx = threadIdx.x + 512 * k;
      gw1[k] = idx < dim4 ? ((const float4 *)m.nw1)[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    /* x = (x + a) + down, as the add + rmsnorm kernel after down would compute it */
    mlp_norm_q(m.hout, m.y, gw1, m.off1, m.eps1, m.xres, dim4, xa, xb, xd, &hsm[0][0]);
    for (; f < nit; f += gridDim.x) {
      const int fn = f + gridDim.x;
      int wi, win = 0;
      int64_t row, rown = 0;
      item(f, wi, row);
      if (fn < nit) item(fn, win, rown);
      const uint4 *qwn = m.qq[win];
      const uint32_t *qsn = m.qsb[win];
      float acc[4] = { 0.f, 0.f, 0.f, 0.f };
#pragma unroll
      for (int k = 0; k < VG; k++) {
        const int v = lane + 32 * k;
        const uint4 x0 = xa[v], x1 = xb[v];
        const float2 d2 = xd[v];
#pragma unroll
        for (int r = 0; r < 4; r++) {
          const float2 pp = sb_pair(pv[r][k], sbk);
          acc[r] = fmaf(pp.x, (float)dot_q4(wv[r][k], x0, x1) * d2.x, fmaf(pp.y, d2.y, acc[r]));
          if (fn < nit) {
            wv[r][k] = ld_stream(qwn + (rown + r) * V + v);
            pv[r][k] = __ldg(qsn + (rown + r) * G + (v >> lg));
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const float t = warp_sum(acc[r]);
        if (lane == r) m.qy[wi][row + r] = t;
      }
    }
  }
  /* the last block out resets the barriers for the next launch (a later graph replay) */
  if (threadIdx.x == 0 && atomicAdd(m.bar + 1, 1u) == gridDim.x - 1) {
    m.bar[0] = 0;
    m.bar[1] = 0;
    if (QKV) m.bar2[0] = 0;
  }
}

#undef MLP_LDW
#undef MLP_LDS
int g_cu_wef = 63; /* SMELT_CUDA_WEF (mv_args::ef, mlp_args::ef) */
int g_cu_carve = -1; /* cu_carve's value: set by the backend (cuda_be::carve) before its launches */
#include <mutex>
void cu_carve(const void *kern) {
  static std::mutex mu;
  static const void *done[1024];
  static int nd = 0, val = -2;
  if (g_cu_carve < 0 && val == -2) return;
  std::lock_guard<std::mutex> lk(mu);
  if (val != g_cu_carve) { nd = 0; val = g_cu_carve; } /* changed (tests): set every kernel again */
  for (int i = 0; i < nd; i++)
    if (done[i] == kern) return;
  cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, val < 0 ? -1 : val);
  if (nd < 1024) done[nd++] = kern;
}
int g_cu_mlp_bar = 1; /* SMELT_CUDA_MLP_BAR (default 1): k_mlp1's grid barriers split around the weight prefetch
                       * after them (8B 2.18-2.20 vs 2.23 ms a step on the H100; 0: one blocks_sync) */

/* shapes k_mlp1 has a variant for (gate/up K x F, down F x K) */
static bool mlp_shape(const cu_weight *g, const cu_weight *u, const cu_weight *d) {
  if (g->kind != CW_Q4 || u->kind != CW_Q4 || d->kind != CW_Q4 || g->sbk == SBK_F32 || u->sbk != g->sbk ||
      d->sbk != g->sbk || u->gs != g->gs || d->gs != g->gs || g->rows != u->rows || g->cols != u->cols ||
      d->cols != g->rows || d->rows != g->cols || (g->gs != 32 && g->gs != 64 && g->gs != 128))
    return false;
  const int64_t K = g->cols, F = g->rows;
  return (K == 4096 && F == 14336) || (K == 2048 && F == 8192);
}
template <int VG, int VD> static int mlp_grid() {
  static int grid = -1;
  if (grid < 0) {
    int nb = 0, nb2 = 0, dev = 0, nsm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    int nb3 = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_mlp1<VG, VD, false, false>, 512, 0) != cudaSuccess) nb = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb2, k_mlp1<VG, VD, true, false>, 512, 0) != cudaSuccess) nb2 = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb3, k_mlp1<VG, VD, true, true>, 512, 0) != cudaSuccess) nb3 = 0;
    nb = nb < nb2 ? nb : nb2;
    nb = nb < nb3 ? nb : nb3;
    grid = nb * nsm; /* the same grid for all: every block must be resident at once */
  }
  return grid;
}
static void mlp_init() {
  mlp_grid<4, 14>();
  mlp_grid<2, 8>();
}
/* one stream a device may use k_mlp1 (two persistent kernels on two streams could each wait for
 * the other's SMs): the first that asks, until it releases */
#include <mutex>
static std::mutex s_mlp_mu;
static cudaStream_t s_mlp_owner[16];
static bool s_mlp_owned[16];
bool cu_mlp_claim(cudaStream_t s) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 16) return false;
  std::lock_guard<std::mutex> lk(s_mlp_mu);
  if (!s_mlp_owned[dev]) {
    s_mlp_owned[dev] = true;
    s_mlp_owner[dev] = s;
  }
  return s_mlp_owner[dev] == s;
}
void cu_mlp_release(cudaStream_t s) {
  std::lock_guard<std::mutex> lk(s_mlp_mu);
  for (int d = 0; d < 16; d++)
    if (s_mlp_owned[d] && s_mlp_owner[d] == s) s_mlp_owned[d] = false;
}
/* cu_q4_mlp launches exactly when this is true */
bool cu_q4_mlp_ok(const cu_weight *g, const cu_weight *u, const cu_weight *d, int n) {
  if (!g_cu_mlp || n != 1 || !mlp_shape(g, u, d) || mvt_n_sm() <= 0) return false;
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 16 || !s_mvt_ctr[dev]) return false; /* barrier counters (cu_mv_init) */
  return (g->cols == 4096 ? mlp_grid<4, 14>() : mlp_grid<2, 8>()) > 0;
}
bool cu_q4_mlp_qkv_ok(const cu_weight *g, const cu_weight *const *qkv) {
  for (int i = 0; i < 3; i++) {
    const cu_weight *w = qkv[i];
    if (w->kind != CW_Q4 || w->sbk != g->sbk || w->gs != g->gs || w->cols != g->cols || w->rows % 64 ||
        w->rows > INT32_MAX)
      return false;
  }
  return true;
}
int g_cu_dnorm = 1; /* SMELT_CUDA_DNORM=0: the add + rmsnorm after k_mlp1 as its own kernel */
bool cu_q4_mlp_dnorm_ok(const cu_weight *g, const cu_weight *u, const cu_weight *d) {
  if (!g_cu_dnorm || !cu_q4_mlp_ok(g, u, d, 1)) return false;
  const int grid = g->cols == 4096 ? mlp_grid<4, 14>() : mlp_grid<2, 8>();
  const int ndn = (int)(g->cols / 16);
  /* the pairs of down items take no more rounds of the grid than single items */
  return grid > 0 && ndn % 2 == 0 && 2 * ((ndn / 2 + grid - 1) / grid) == (ndn + grid - 1) / grid;
}
bool cu_q4_mlp(const cu_weight *g, const cu_weight *u, const cu_weight *d, float *gy, float *uy, float *y,
               const void *xqv, void *hqv, cudaStream_t s, const cu_gu_norm *norm, const cu_mlp_qkv *qkv,
               const cu_mlp_dnorm *dnm) {
  if (!cu_q4_mlp_ok(g, u, d, 1)) return false;
  if (dnm && (qkv || !norm || !norm->hout || !cu_q4_mlp_dnorm_ok(g, u, d))) return false;
  if (norm && (((uintptr_t)norm->x | (uintptr_t)norm->a | (uintptr_t)norm->w | (uintptr_t)norm->hout) & 15)) return false;
  if (qkv && (!norm || !norm->hout || !cu_q4_mlp_qkv_ok(g, qkv->w) || (((uintptr_t)qkv->xres | (uintptr_t)qkv->nw) & 15)))
    return false;
  int dev = 0;
  cudaGetDevice(&dev);
  const bool big = g->cols == 4096;
  const int grid = big ? mlp_grid<4, 14>() : mlp_grid<2, 8>();
  mlp_args m;
  m.gq = (const uint4 *)g->q; m.uq = (const uint4 *)u->q; m.dq = (const uint4 *)d->q;
  m.gsb = (const uint32_t *)g->sb; m.usb = (const uint32_t *)u->sb; m.dsb = (const uint32_t *)d->sb;
  m.gy = gy; m.uy = uy; m.y = y;
  m.hq = (uint8_t *)hqv;
  m.hs = (float2 *)(m.hq + (size_t)g->rows);
  m.K = (int)g->cols; m.F = (int)g->rows;
  m.lg = g->gs == 32 ? 0 : g->gs == 64 ? 1 : 2;
  m.sbk = g->sbk;
  m.bar = (unsigned *)(s_mvt_ctr[dev] + 2 * (s_mvt_next[dev]++ % MVT_CTR_PAIRS));
  m.split = g_cu_mlp_bar;
  m.ef = g_cu_wef;
  m.nx = norm ? norm->x : NULL; m.na = norm ? norm->a : NULL; m.nw = norm ? norm->w : NULL;
  m.off = norm ? norm->off : 0.f; m.eps = norm ? norm->eps : 0.f; m.hout = norm ? norm->hout : NULL;
  m.bar2 = NULL; m.xres = NULL; m.nw1 = NULL; m.off1 = m.eps1 = 0.f;
  for (int i = 0; i < 3; i++) { m.qq[i] = NULL; m.qsb[i] = NULL; m.qy[i] = NULL; m.qitems[i] = 0; }
  m.dx = dnm ? dnm->xres : NULL;
  m.dw = dnm ? dnm->w : NULL;
  m.doff = dnm ? dnm->off : 0.f;
  m.dq8 = dnm ? (uint8_t *)dnm->xq : NULL;
  m.dxs = dnm ? (float2 *)((uint8_t *)dnm->xq + (size_t)g->cols) : NULL;
  m.dssp = dnm ? dnm->ssp : NULL;
  if (qkv) {
    m.bar2 = (unsigned *)(s_mvt_ctr[dev] + 2 * (s_mvt_next[dev]++ % MVT_CTR_PAIRS));
    m.xres = qkv->xres; m.nw1 = qkv->nw; m.off1 = qkv->off; m.eps1 = qkv->eps;
    for (int i = 0; i < 3; i++) {
      m.qq[i] = (const uint4 *)qkv->w[i]->q;
      m.qsb[i] = (const uint32_t *)qkv->w[i]->sb;
      m.qy[i] = qkv->y[i];
      m.qitems[i] = (int)(qkv->w[i]->rows / 64);
    }
  }
  const uint4 *xq = (const uint4 *)xqv;
  const float2 *xs = xqv ? (const float2 *)((const uint8_t *)xqv + (size_t)g->cols) : NULL;
#define MLP_GO(VG_, VD_)                                                                              \
  do {                                                                                                \
    if (qkv) cu_launch(k_mlp1<VG_, VD_, true, true>, dim3(grid), dim3(512), 0, s, m, xq, xs);          \
    else if (norm) cu_launch(k_mlp1<VG_, VD_, true, false>, dim3(grid), dim3(512), 0, s, m, xq, xs);   \
    else cu_launch(k_mlp1<VG_, VD_, false, false>, dim3(grid), dim3(512), 0, s, m, xq, xs);            \
  } while (0)
  if (big) MLP_GO(4, 14);
  else MLP_GO(2, 8);
#undef MLP_GO
  g_cu_mlp_count++;
  if (qkv) g_cu_mlp_qkv_count++;
  if (dnm) g_cu_dnorm_count++;
  return true;
}

/* ---------------- gate/up + silu(gate)*up quantized, one token (n = 1) ----------------
 * A block of 256 threads owns 32 consecutive rows of both gate and up (8 threads a row, each
 * UNR 16-byte vectors of both rows a round, the first round requested before the wait), so it
 * holds a whole 32-value chunk of h = silu(gate) * up and quantizes it itself into the int8 x
 * layout of k_quant_x (same formulas) for the down projection: no counter, no extra kernel.
 * Also writes gate and up. Needs rows % 32 == 0 and K % 256 == 0. */
/* SMELT_CUDA_GUQ: UNR (1/2/4), 0 off; -1 (default): 1 for gate weights of >= 32 Mi elements
 * (measured on the H100: faster for the 8B shape, not for the 1B one; 4 threads a row, tried,
 * was slower) */
int g_cu_guq = -1;
/* SMELT_CUDA_GUQ_NORM=1: the residual add + rmsnorm before it folded into it (opt-in: measured
 * 2.340-2.355 vs 2.334-2.339 ms a step on the 8B shape, docs/benchmarks.md) */
int g_cu_guq_norm = 0;
/* gate/up input from a fused residual add + rmsnorm (NORM; K % 256 == 0, K <= 4096): every block
 * computes h = x + a and its int8 rmsnorm into shared memory exactly as k_norm_q<1> does (its 1024 /
 * 512 / ... thread reduction tree replayed by 256 threads), block 0 stores h in hout */
struct gu_norm {
  const float *x, *a, *w;
  float off, eps;
  float *hout;
};
template <int UNR, bool NORM>
__global__ void __launch_bounds__(256, 4) k_gu_q4(const mv_args a, const uint4 *__restrict__ xq,
                                                  const float2 *__restrict__ xs, int K, int lg, int sbk,
                                                  uint8_t *__restrict__ hq, float2 *__restrict__ hs, const gu_norm nm) {
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
  /* NORM: virtual warp W = warp + 8k (k < 4) of k_norm_q's block; its norm weights before the wait */
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, dim4 = K >> 2;
  const int nvw = (dim4 < 64 ? 64 : dim4) >> 5;
  float4 gw[4];
  if (NORM) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int idx = 32 * (warp + 8 * k) + lane;
      gw[k] = idx < dim4 ? ((const float4 *)nm.w)[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __shared__ uint4 sxq[NORM ? 4096 / 16 : 1];
  __shared__ float2 sxs[NORM ? 4096 / 32 : 1];
  __shared__ float red[NORM ? 32 : 1];
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
    if (NORM && first) { /* every thread has a vector (V % 8 == 0): the barriers are uniform */
      float4 hv[4];
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const int W = warp + 8 * k, idx = 32 * W + lane;
        hv[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (W >= nvw) continue;
        float ss = 0.f;
        if (idx < dim4) {
          float4 v = __ldcg((const float4 *)nm.x + idx);
          const float4 b = __ldcg((const float4 *)nm.a + idx);
          v.x += b.x; v.y += b.y; v.z += b.z; v.w += b.w;
          if (blockIdx.x == 0 && nm.hout) ((float4 *)nm.hout)[idx] = v;
          ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
          hv[k] = v;
        }
        ss = warp_sum(ss);
        if (lane == 0) red[W] = ss;
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        float t = threadIdx.x < nvw ? red[threadIdx.x] : 0.f;
        t = warp_sum(t);
        if (threadIdx.x == 0) red[0] = t;
      }
      __syncthreads();
      const float inv = 1.0f / sqrtf(red[0] / (float)K + nm.eps), off = nm.off;
      uint8_t *sx8 = (uint8_t *)sxq;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const int W = warp + 8 * k, idx = 32 * W + lane;
        if (W >= nvw) continue;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        if (idx < dim4) {
          const float4 g = gw[k];
          o.x = hv[k].x * inv * (g.x + off); o.y = hv[k].y * inv * (g.y + off);
          o.z = hv[k].z * inv * (g.z + off); o.w = hv[k].w * inv * (g.w + off);
        }
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
          const int sub = idx & 7, j = sub >> 1, b = idx >> 3, byte = 2 * (sub & 1);
          uint8_t *blk = sx8 + b * 32;
          *(uint16_t *)(blk + (2 * j) * 4 + byte) = (uint16_t)((q0 & 0xff) | ((q2 & 0xff) << 8));
          *(uint16_t *)(blk + (2 * j + 1) * 4 + byte) = (uint16_t)((q1 & 0xff) | ((q3 & 0xff) << 8));
          if (sub == 0) sxs[b] = make_float2(am * (1.f / 127.f), sum);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int v = v0 + u * TPR;
      if (v >= V) break;
      const uint4 x0 = NORM ? sxq[2 * v] : __ldca(xq + 2 * v), x1 = NORM ? sxq[2 * v + 1] : __ldca(xq + 2 * v + 1);
      const float2 xd = NORM ? sxs[v] : __ldca(xs + v);
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
    hsm[j] = ag / (1.f + expf(-ag)) * au;
  }
  __syncthreads();
  if (threadIdx.x < 32) { /* the chunk's quantization, as k_quant_x */
    const int lane = threadIdx.x;
    const float v = hsm[lane];
    float am = fabsf(v), sum = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    int qi = am > 0.f ? __float2int_rn(v * (127.f / am)) : 0;
    qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
    const int jj = lane >> 3, e = lane & 7;
    const int64_t b = blockIdx.x;
    hq[b * 32 + (2 * jj + (e & 1)) * 4 + (e >> 1)] = (uint8_t)(int8_t)qi;
    if (lane == 0) hs[b] = make_float2(am * (1.f / 127.f), sum);
  }
}
static int guq_cfg(const cu_weight *g) {
  return g_cu_guq >= 0 ? g_cu_guq : g->rows * g->cols >= ((int64_t)32 << 20) ? 1 : 0;
}
static bool guq_ok(const cu_weight *g, const cu_weight *u) {
  return guq_cfg(g) && g->kind == CW_Q4 && cu_matvec_compatible(g, u) && g->rows == u->rows && g->rows % 32 == 0 &&
         g->cols % 256 == 0 && g->rows / 32 <= INT32_MAX;
}

/* ---------------- dispatch ---------------- */
/* rpb: rows per block */
static mv_args make_args(const cu_weight *const *ws, float *const *ys, int nw, int rpb, unsigned *blocks) {
  mv_args a;
  memset(&a, 0, sizeof a);
  int b = 0;
  for (int i = 0; i < 3; i++) {
    a.bstart[i] = i < nw ? b : 0x7fffffff;
    if (i < nw) {
      a.q[i] = ws[i]->q; a.sb[i] = ws[i]->sb; a.y[i] = ys[i]; a.M[i] = (int)ws[i]->rows;
      b += (int)((ws[i]->rows + rpb - 1) / rpb);
    }
  }
  a.bstart[3] = 0x7fffffff;
  *blocks = (unsigned)b;
  return a;
}
template <int BITS, int R, int N>
static void launch_qfast(const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n, cudaStream_t s) {
  unsigned blocks;
  mv_args a = make_args(ws, ys, nw, 4 * R, &blocks);
  const int K = (int)ws[0]->cols, gs = ws[0]->gs;
  switch (ws[0]->sbk) {
  case SBK_F16: cu_launch(k_mv_qfast<BITS, R, N, SBK_F16>, dim3(blocks), dim3(128), 0, s, a, x, K, gs, n); break;
  case SBK_F32: cu_launch(k_mv_qfast<BITS, R, N, SBK_F32>, dim3(blocks), dim3(128), 0, s, a, x, K, gs, n); break;
  default: cu_launch(k_mv_qfast<BITS, R, N, SBK_BF16>, dim3(blocks), dim3(128), 0, s, a, x, K, gs, n); break;
  }
}
template <int BITS, int R>
static void launch_qfast_n(const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n, cudaStream_t s) {
  if (n == 1) launch_qfast<BITS, R, 1>(ws, ys, nw, x, n, s);
  else if (n == 2) launch_qfast<BITS, R, 2>(ws, ys, nw, x, n, s);
  else if (n <= 4) launch_qfast<BITS, R, 4>(ws, ys, nw, x, n, s);
  else launch_qfast<BITS, R, 8>(ws, ys, nw, x, n, s);
}
template <typename T, int R>
static void launch_dense_n(const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n, cudaStream_t s) {
  unsigned blocks;
  mv_args a = make_args(ws, ys, nw, 4 * R, &blocks);
  const int K = (int)ws[0]->cols;
  const int vec = (K % (16 / (int)sizeof(T))) == 0;
  if (n == 1) k_mv_dense<T, R, 1><<<blocks, 128, 0, s>>>(a, x, K, n, vec);
  else if (n == 2) k_mv_dense<T, R, 2><<<blocks, 128, 0, s>>>(a, x, K, n, vec);
  else if (n <= 4) k_mv_dense<T, R, 4><<<blocks, 128, 0, s>>>(a, x, K, n, vec);
  else k_mv_dense<T, R, 8><<<blocks, 128, 0, s>>>(a, x, K, n, vec);
}

static bool mv2_ok(const cu_weight *w, const float *x) {
  if (((uintptr_t)x & 15) || w->cols > INT32_MAX / 2) return false;
  if (w->kind == CW_DENSE) return w->cols % (16 / (int64_t)sm_dtype_size(w->dtype)) == 0;
  if (w->kind == CW_QFAST) return (w->cols * w->bits) % 128 == 0;
  return false;
}

template <int BITS, typename T, int N, int RB, bool SILU>
static void launch_mv2(const mv_args &a, unsigned tiles, const float *x, const float *xu, int K, int gs, int sbk, int n,
                       int tl, cudaStream_t s, int n_sm) {
  (void)n_sm;
  const size_t smem = 0;
  const int smx = 0;          /* x read through L1 (staging x in shared memory measured slower) */
  const unsigned grid = tiles; /* one block per row tile */
  cu_launch(k_mv2<BITS, T, N, RB, SILU>, dim3(grid), dim3(128), smem, s, a, x, xu, K, gs, sbk, n, tl, (int)tiles, smx);
}

/* SMELT_CUDA_MV2=RB,TL: rows per thread (4/8) and log2 threads per row (5..7) of the n = 1
 * 16-byte matvec (0: automatic) */
int g_cu_mv2_rb = 0, g_cu_mv2_tl = 0;
/* rows-per-thread choice and launch for one (bits, type) */
template <int BITS, typename T>
static void mv2_dispatch(const cu_weight *const *ws, float *const *ys, int nw, const float *x, const float *xu, int n,
                         cudaStream_t s, int n_sm) {
  const int K = (int)ws[0]->cols;
  const int EPV = BITS ? 128 / BITS : 16 / (int)sizeof(T);
  const int V = K / EPV;
  int tl = V <= 32 ? 5 : V <= 64 ? 6 : 7;
  if (n == 1 && g_cu_mv2_tl >= 5 && g_cu_mv2_tl <= 7 && (1 << g_cu_mv2_tl) <= V) tl = g_cu_mv2_tl;
  const int gs = ws[0]->gs, sbk = ws[0]->sbk;
  int RB = 4;
  if (n == 1) {
    unsigned b8;
    make_args(ws, ys, nw, (128 >> tl) * 8, &b8);
    RB = b8 >= (unsigned)(2 * n_sm) ? 8 : 4;
    if (g_cu_mv2_rb == 4 || g_cu_mv2_rb == 8) RB = g_cu_mv2_rb;
  }
  unsigned blocks;
  mv_args a = make_args(ws, ys, nw, (128 >> tl) * RB, &blocks);
  if (xu) {
    if (RB == 8) launch_mv2<BITS, T, 1, 8, true>(a, blocks, x, xu, K, gs, sbk, n, tl, s, n_sm);
    else launch_mv2<BITS, T, 1, 4, true>(a, blocks, x, xu, K, gs, sbk, n, tl, s, n_sm);
    return;
  }
  if (n == 1) {
    if (RB == 8) launch_mv2<BITS, T, 1, 8, false>(a, blocks, x, xu, K, gs, sbk, n, tl, s, n_sm);
    else launch_mv2<BITS, T, 1, 4, false>(a, blocks, x, xu, K, gs, sbk, n, tl, s, n_sm);
  } else if (n == 2) launch_mv2<BITS, T, 2, 4, false>(a, blocks, x, xu, K, gs, sbk, n, tl, s, n_sm);
  else if (n <= 4) launch_mv2<BITS, T, 4, 4, false>(a, blocks, x, xu, K, gs, sbk, n, tl, s, n_sm);
  else launch_mv2<BITS, T, 8, 4, false>(a, blocks, x, xu, K, gs, sbk, n, tl, s, n_sm);
}


/* ---------------- CW_Q4 dispatch ---------------- */
/* SMELT_CUDA_Q4MINB (tuning): minimum resident blocks an SM asked of the compiler (which caps the
 * registers) for the n = 1 kernels with two rows a thread: 1 (no cap), 9, 10, 12; 0 = the defaults
 * below (measured on the H100, docs/benchmarks.md) */
int g_cu_q4minb = 0;
int g_cu_q4hint = 1; /* SMELT_CUDA_Q4HINT: k_mvq4 weight load hint (ld_stream_h; 1 measured best on the H100) */
static bool s_no_mvt; /* the next q4_launch_n runs k_mvq4 for n = 1 too */
static int s_role = -1; /* CU_Q4_* role of the next q4_launch_n (-1 none) */
static int s_q4_pf; /* mv_args.pf of the next launch_q4 (set by the role-aware launchers) */
static const float *s_dn_ssp; /* deferred rmsnorm of the next launch_q4 (cu_q4_set_dnorm) */
static int s_dn_nss;
static float s_dn_eps, s_dn_dim;
template <int N, int RB, int UNR, int MINB = 1>
static void launch_q4(const cu_weight *const *ws, float *const *ys, int nw, const uint4 *xq, const float2 *xs, int n,
                      int tl, cudaStream_t s, const glu_args &glu) {
  unsigned tiles;
  mv_args a = make_args(ws, ys, nw, (128 >> tl) * RB, &tiles);
  a.pf = N == 1 ? s_q4_pf : 0;
  a.hint = g_cu_q4hint;
  a.ef = N == 1 ? (g_cu_wef >> 2) & 3 : 0;
  if (N == 1 && s_dn_ssp) {
    a.ssp = s_dn_ssp;
    a.nss = s_dn_nss;
    a.dn_eps = s_dn_eps;
    a.dn_dim = s_dn_dim;
  }
  s_dn_ssp = NULL;
  const int nch = (n + N - 1) / N;
  const int gs = ws[0]->gs, lg = gs == 32 ? 0 : gs == 64 ? 1 : 2;
  cu_launch(k_mvq4<N, RB, UNR, MINB>, dim3(tiles * (unsigned)nch), dim3(128), 0, s, a, xq, xs, (int)ws[0]->cols, lg,
            ws[0]->sbk, n, tl, nch, glu);
}
/* threads per row (log2): n = 1 loads 4 vectors of a row per round, n > 1 two; as few
 * threads as cover a row in one round (32..128) */
static int q4_unr(int n, int rb) { return n > 1 ? 2 : rb / 10; }
int g_cu_q4cfg = 0; /* SMELT_CUDA_Q4CFG: n = 1 CW_Q4 variant (q4_launch_n; 0 = automatic) */
/* n = 1 default, measured on the H100 (docs/benchmarks.md): two vectors of a row per round for
 * K = 2048 and 8192 (Llama-3.2-1B), one for K = 4096 and 14336 (Llama-3.1-8B); other K follow
 * the nearest (g_cu_q4long: SMELT_CUDA_Q4LONG for K > 8192) */
int g_cu_q4long = 12;
int g_cu_q4warps = 4000; /* SMELT_CUDA_Q4WARPS */
/* SMELT_CUDA_Q4ROLE (tuning): per-role n = 1 override "qkv=RB[:TL[:PF]],o=..,gu=..,dn=..,lm=.." (RB as
 * SMELT_CUDA_Q4CFG, TL log2 threads per row, 0 = automatic; PF below) */
int g_cu_q4role_rb[CU_Q4_ROLES], g_cu_q4role_tl[CU_Q4_ROLES];
/* bytes of its weight rows each block prefetches into L2 before waiting for the previous kernel
 * (k_mvq4, n = 1; -1: all of them, 0: none), per role (SMELT_CUDA_Q4ROLE third field, in KB) */
int g_cu_q4role_pf[CU_Q4_ROLES];

static int q4_rb(int n, int V, int role = -1) {
  if (n == 1 && role >= 0 && role < CU_Q4_ROLES && g_cu_q4role_rb[role]) return g_cu_q4role_rb[role];
  /* the o projection of K = 4096 (Llama-3.1-8B): four rows a thread, 128 threads a row (measured on
   * the H100 in the decode graph: 467.9-469.7 vs 462.3-466.0 tok/s for 12; "o=12" restores it) */
  if (n == 1 && role == CU_Q4_O && V == 128 && !g_cu_q4cfg) return 14;
  return n > 1 ? 4 : g_cu_q4cfg ? g_cu_q4cfg : V <= 64 ? 22 : V <= 128 ? 12 : V <= 256 ? 22 : g_cu_q4long;
}
static int q4_tl(int V, int n, int rb, int64_t M, int role = -1) {
  if (n == 1 && role >= 0 && role < CU_Q4_ROLES && g_cu_q4role_tl[role] >= 5 && g_cu_q4role_tl[role] <= 7 &&
      (1 << g_cu_q4role_tl[role]) <= V)
    return g_cu_q4role_tl[role];
  const int unr = q4_unr(n, rb);
  int tl = 5;
  if (unr == 1) /* fewest threads per row that still give >= g_cu_q4warps warps (loads in flight) */
    while (tl < 7 && (M / (rb % 10)) * (1 << (tl - 5)) < g_cu_q4warps && (1 << (tl + 1)) <= V) tl++;
  else /* as few threads as cover a row in one round */
    while (tl < 7 && (1 << tl) * unr < V) tl++;
  return tl;
}
static void q4_launch_n(const cu_weight *const *ws, float *const *ys, int nw, const uint4 *q4, const float2 *xs, int n,
                        int tl, int rb, cudaStream_t s, const glu_args &g = glu_args{ NULL, NULL, NULL }) {
  if (n == 1 && !g.cnt && !s_no_mvt && (g_cu_mvt >> (s_role >= 0 ? s_role : CU_Q4_ROLES) & 1) &&
      mvt_launch(ws, ys, nw, q4, xs, s))
    return;
  if (n == 1) {
    switch (rb) {
    case 11: launch_q4<1, 1, 1>(ws, ys, nw, q4, xs, n, tl, s, g); break;
    case 21: launch_q4<1, 1, 2>(ws, ys, nw, q4, xs, n, tl, s, g); break;
    case 41: launch_q4<1, 1, 4>(ws, ys, nw, q4, xs, n, tl, s, g); break;
    case 12: /* default 12 blocks an SM (<= 40 registers) */
      if (g_cu_q4minb == 1) launch_q4<1, 2, 1, 1>(ws, ys, nw, q4, xs, n, tl, s, g);
      else if (g_cu_q4minb == 9) launch_q4<1, 2, 1, 9>(ws, ys, nw, q4, xs, n, tl, s, g);
      else if (g_cu_q4minb == 10) launch_q4<1, 2, 1, 10>(ws, ys, nw, q4, xs, n, tl, s, g);
      else launch_q4<1, 2, 1, 12>(ws, ys, nw, q4, xs, n, tl, s, g);
      break;
    case 22: /* default 9 blocks an SM (<= 56 registers) */
      if (g_cu_q4minb == 1) launch_q4<1, 2, 2, 1>(ws, ys, nw, q4, xs, n, tl, s, g);
      else if (g_cu_q4minb == 10) launch_q4<1, 2, 2, 10>(ws, ys, nw, q4, xs, n, tl, s, g);
      else if (g_cu_q4minb == 12) launch_q4<1, 2, 2, 12>(ws, ys, nw, q4, xs, n, tl, s, g);
      else launch_q4<1, 2, 2, 9>(ws, ys, nw, q4, xs, n, tl, s, g);
      break;
    case 42: launch_q4<1, 2, 4>(ws, ys, nw, q4, xs, n, tl, s, g); break;
    case 14: /* 10 blocks an SM (<= 48 registers) */
      if (g_cu_q4minb == 1) launch_q4<1, 4, 1, 1>(ws, ys, nw, q4, xs, n, tl, s, g);
      else launch_q4<1, 4, 1, 10>(ws, ys, nw, q4, xs, n, tl, s, g);
      break;
    case 24: launch_q4<1, 4, 2>(ws, ys, nw, q4, xs, n, tl, s, g); break;
    case 44: launch_q4<1, 4, 4>(ws, ys, nw, q4, xs, n, tl, s, g); break;
    case 18: launch_q4<1, 8, 1>(ws, ys, nw, q4, xs, n, tl, s, g); break;
    default: launch_q4<1, 8, 2>(ws, ys, nw, q4, xs, n, tl, s, g); break;
    }
  } else if (n == 2) launch_q4<2, 4, 2>(ws, ys, nw, q4, xs, n, tl, s, g);
  else if (n <= 4) launch_q4<4, 4, 2>(ws, ys, nw, q4, xs, n, tl, s, g);
  else launch_q4<8, 4, 2>(ws, ys, nw, q4, xs, n, tl, s, g);
}

void cu_q4_matvec_cfg(const cu_weight *const *ws, float *const *ys, int nw, const float *x, const float *xu, int n,
                      void *xqv, cudaStream_t s, int n_sm, int rb, int tl, int role) {
  const int64_t K = ws[0]->cols;
  const int V = (int)(K / 32);
  s_no_mvt = rb > 0; /* an explicit tiling names a k_mvq4 variant */
  if (rb <= 0) rb = q4_rb(n, V, role);
  int64_t M = 0;
  for (int i = 0; i < nw; i++) M += ws[i]->rows;
  if (!tl) tl = q4_tl(V, n, rb, M, role);
  const int64_t nblk = (int64_t)n * V;
  uint8_t *xq = (uint8_t *)xqv;
  float2 *xs = (float2 *)(xq + (size_t)n * (size_t)K);
  cu_launch(k_quant_x, dim3((unsigned)((nblk + 7) / 8)), dim3(256), 0, s, x, xu, nblk, xq, xs);
  s_q4_pf = role >= 0 && role < CU_Q4_ROLES ? g_cu_q4role_pf[role] : 0;
  s_role = role >= 0 && role < CU_Q4_ROLES ? role : -1;
  q4_launch_n(ws, ys, nw, (const uint4 *)xq, xs, n, tl, rb, s);
  s_role = -1;
  s_q4_pf = 0;
  s_no_mvt = false;
}

bool cu_matvec_silu(const cu_weight *w, const float *g, const float *u, int n, float *y, void *xq, cudaStream_t s,
                    int n_sm) {
  if (w->kind == CW_Q4 && xq && n >= 1 && n <= CU_Q4_MAX_N) {
    cu_q4_matvec_cfg(&w, &y, 1, g, u, n, xq, s, n_sm, 0, 0, CU_Q4_DN);
    return true;
  }
  if (n != 1 || w->kind != CW_DENSE || !mv2_ok(w, g) || ((uintptr_t)u & 15)) return false;
  switch (w->dtype) {
  case SM_DT_BF16: mv2_dispatch<0, __nv_bfloat16>(&w, &y, 1, g, u, n, s, n_sm); break;
  case SM_DT_F16: mv2_dispatch<0, __half>(&w, &y, 1, g, u, n, s, n_sm); break;
  default: mv2_dispatch<0, float>(&w, &y, 1, g, u, n, s, n_sm); break;
  }
  return true;
}

bool cu_matvec_compatible(const cu_weight *a, const cu_weight *b) {
  return a->kind == b->kind && a->kind != CW_QGEN && a->cols == b->cols && a->bits == b->bits && a->gs == b->gs &&
         a->dtype == b->dtype && a->sbk == b->sbk;
}

void cu_matvec_multi(const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n, void *xq,
                     cudaStream_t s, int n_sm) {
  if (ws[0]->kind == CW_Q4) {
    cu_q4_matvec_cfg(ws, ys, nw, x, NULL, n, xq, s, n_sm, 0, 0);
    return;
  }
  int64_t M = 0;
  for (int i = 0; i < nw; i++) M += ws[i]->rows;
  /* two rows per warp when there are enough rows to fill the chip */
  const bool r2 = M >= (int64_t)n_sm * 16;
  const cu_weight *w = ws[0];
  bool fast = w->kind == CW_DENSE;
  for (int i = 0; i < nw; i++) fast &= mv2_ok(ws[i], x);
  if (fast) { /* 16-byte dense matvec, several rows per thread */
    switch (w->dtype) {
    case SM_DT_BF16: mv2_dispatch<0, __nv_bfloat16>(ws, ys, nw, x, NULL, n, s, n_sm); break;
    case SM_DT_F16: mv2_dispatch<0, __half>(ws, ys, nw, x, NULL, n, s, n_sm); break;
    default: mv2_dispatch<0, float>(ws, ys, nw, x, NULL, n, s, n_sm); break;
    }
    return;
  }
  if (w->kind == CW_DENSE) {
    switch (w->dtype) {
    case SM_DT_BF16: r2 ? launch_dense_n<__nv_bfloat16, 2>(ws, ys, nw, x, n, s) : launch_dense_n<__nv_bfloat16, 1>(ws, ys, nw, x, n, s); break;
    case SM_DT_F16: r2 ? launch_dense_n<__half, 2>(ws, ys, nw, x, n, s) : launch_dense_n<__half, 1>(ws, ys, nw, x, n, s); break;
    default: r2 ? launch_dense_n<float, 2>(ws, ys, nw, x, n, s) : launch_dense_n<float, 1>(ws, ys, nw, x, n, s); break;
    }
    return;
  }
  if (w->kind == CW_QFAST) {
    switch (w->bits) {
    case 2: r2 ? launch_qfast_n<2, 2>(ws, ys, nw, x, n, s) : launch_qfast_n<2, 1>(ws, ys, nw, x, n, s); break;
    case 8: r2 ? launch_qfast_n<8, 2>(ws, ys, nw, x, n, s) : launch_qfast_n<8, 1>(ws, ys, nw, x, n, s); break;
    default: r2 ? launch_qfast_n<4, 2>(ws, ys, nw, x, n, s) : launch_qfast_n<4, 1>(ws, ys, nw, x, n, s); break;
    }
    return;
  }
  for (int i = 0; i < nw; i++) {
    w = ws[i];
    float *y = ys[i];
    dim3 grid((unsigned)((w->rows + 3) / 4));
    const uint32_t *q = (const uint32_t *)w->q;
    const int Mi = (int)w->rows, K = (int)w->cols;
    switch (w->bits) {
    case 3: k_mv_qgen<3><<<grid, 128, 0, s>>>(q, w->sb, w->sbk, x, y, Mi, K, w->gs, n); break;
    case 5: k_mv_qgen<5><<<grid, 128, 0, s>>>(q, w->sb, w->sbk, x, y, Mi, K, w->gs, n); break;
    case 6: k_mv_qgen<6><<<grid, 128, 0, s>>>(q, w->sb, w->sbk, x, y, Mi, K, w->gs, n); break;
    case 2: k_mv_qgen<2><<<grid, 128, 0, s>>>(q, w->sb, w->sbk, x, y, Mi, K, w->gs, n); break;
    case 4: k_mv_qgen<4><<<grid, 128, 0, s>>>(q, w->sb, w->sbk, x, y, Mi, K, w->gs, n); break;
    default: k_mv_qgen<8><<<grid, 128, 0, s>>>(q, w->sb, w->sbk, x, y, Mi, K, w->gs, n); break;
    }
  }
}

void cu_matvec(const cu_weight *w, const float *x, int n, float *y, void *xq, cudaStream_t s, int n_sm) {
  cu_matvec_multi(&w, &y, 1, x, n, xq, s, n_sm);
}

/* ---------------- dequantization ---------------- */
/* element j of row r (any layout), as float */
static __device__ __forceinline__ float dq_elem(const cu_weight &w, int64_t r, int64_t j) {
  if (w.kind == CW_DENSE) {
    int64_t i = r * w.cols + j;
    if (w.dtype == SM_DT_BF16) return __bfloat162float(((const __nv_bfloat16 *)w.q)[i]);
    if (w.dtype == SM_DT_F16) return __half2float(((const __half *)w.q)[i]);
    return ((const float *)w.q)[i];
  }
  const int bits = w.bits;
  const int64_t G = w.cols / w.gs;
  float2 p = load_sb_rt(w.sb, r * G + j / w.gs, w.sbk);
  uint32_t qv;
  if (w.kind == CW_QFAST || w.kind == CW_Q4) {
    const int E = 32 / bits;
    const int64_t W = w.cols / E;
    uint32_t wd = ((const uint32_t *)w.q)[r * W + (w.kind == CW_Q4 ? j / E : cu_qfast_store_index(j / E, W))];
    qv = (wd >> ((j % E) * bits)) & ((1u << bits) - 1);
  } else {
    const uint8_t *row = (const uint8_t *)w.q + r * (w.cols * bits / 8);
    uint64_t bit = (uint64_t)j * bits;
    uint32_t v = row[bit >> 3];
    if ((bit & 7) + bits > 8) v |= (uint32_t)row[(bit >> 3) + 1] << 8;
    qv = (v >> (bit & 7)) & ((1u << bits) - 1);
  }
  return p.x * (float)qv + p.y;
}

/* fast path: one thread per natural word of a QFAST weight */
template <int BITS, typename O, bool PERM>
__global__ void k_dequant_qfast(cu_weight w, int64_t r0, int64_t nr, O *__restrict__ out) {
  constexpr int E = 32 / BITS;
  const int64_t W = w.cols / E, G = w.cols / w.gs;
  const int64_t total = nr * W;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t rr = i / W, u = i % W, r = r0 + rr;
    uint32_t wd = __ldg((const uint32_t *)w.q + r * W + (PERM ? cu_qfast_store_index(u, W) : u));
    float2 p = load_sb_rt(w.sb, r * G + (u * E) / w.gs, w.sbk);
    O o[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
      float v = p.x * (float)((wd >> (e * BITS)) & ((1u << BITS) - 1)) + p.y;
      o[e] = (O)v;
    }
    O *dst = out + rr * w.cols + u * E;
    if (E * sizeof(O) % 16 == 0) {
#pragma unroll
      for (int k = 0; k < (int)(E * sizeof(O) / 16); k++) ((uint4 *)dst)[k] = ((const uint4 *)o)[k];
    } else {
#pragma unroll
      for (int e = 0; e < E; e++) dst[e] = o[e];
    }
  }
}
template <typename O>
__global__ void k_dequant_gen(cu_weight w, int64_t r0, int64_t nr, O *__restrict__ out) {
  const int64_t total = nr * w.cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t rr = i / w.cols, j = i % w.cols;
    out[i] = (O)dq_elem(w, r0 + rr, j);
  }
}

void cu_dequant_rows(const cu_weight *w, int64_t r0, int64_t nr, void *out, bool to_f16, cudaStream_t s) {
  if (nr <= 0) return;
  const int threads = 256;
  const bool qf = w->kind == CW_QFAST || w->kind == CW_Q4;
  int64_t work = qf ? nr * (w->cols * w->bits / 32) : nr * w->cols;
  int64_t blocks = (work + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;
  if (w->kind == CW_Q4 && !to_f16) {
    k_dequant_qfast<4, __nv_bfloat16, false><<<(unsigned)blocks, threads, 0, s>>>(*w, r0, nr, (__nv_bfloat16 *)out);
    return;
  }
  if (w->kind == CW_QFAST && !to_f16) {
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    if (w->bits == 4) k_dequant_qfast<4, __nv_bfloat16, true><<<(unsigned)blocks, threads, 0, s>>>(*w, r0, nr, o);
    else if (w->bits == 8) k_dequant_qfast<8, __nv_bfloat16, true><<<(unsigned)blocks, threads, 0, s>>>(*w, r0, nr, o);
    else k_dequant_qfast<2, __nv_bfloat16, true><<<(unsigned)blocks, threads, 0, s>>>(*w, r0, nr, o);
    return;
  }
  if (to_f16) k_dequant_gen<__half><<<(unsigned)blocks, threads, 0, s>>>(*w, r0, nr, (__half *)out);
  else k_dequant_gen<__nv_bfloat16><<<(unsigned)blocks, threads, 0, s>>>(*w, r0, nr, (__nv_bfloat16 *)out);
}

__global__ void k_embed(cu_weight w, const int32_t *__restrict__ tokens, float *__restrict__ out) {
  const int t = blockIdx.x;
  pdl_trigger();
  pdl_wait();
  const int32_t tok = tokens[t];
  float *o = out + (int64_t)t * w.cols;
  for (int64_t j = threadIdx.x; j < w.cols; j += blockDim.x)
    o[j] = (tok < 0 || tok >= w.rows) ? 0.f : dq_elem(w, tok, j);
}

void cu_embed(const cu_weight *w, const int32_t *tokens, int n_tokens, float *out, cudaStream_t s) {
  if (n_tokens <= 0) return;
  cu_launch(k_embed, dim3(n_tokens), dim3(256), 0, s, *w, tokens, out);
}

/* ---------------- fused (residual add +) rmsnorm (+ int8 x quantization) ----------------
 * One block per row, one float4 per thread and pass (values stay in registers: one read of
 * x and a). With xq: also writes the CW_Q4 x layout of k_quant_x (per 32 values: int8 in
 * nibble order, (max|v|/127, exact sum)) so the next dp4a matvec needs no quantize launch. */
template <int VPT>
__global__ void __launch_bounds__(1024) k_norm_q(float *out, float *x,
                                                 const float *__restrict__ a, const float *__restrict__ w, int dim,
                                                 float eps, float off, uint8_t *__restrict__ xq,
                                                 float2 *__restrict__ xs, const float *xsrc) {
  const int dim4 = dim >> 2, row = blockIdx.x;
  pdl_trigger();
  float4 gw[VPT]; /* the norm weight does not depend on the previous kernel: read before the wait */
  const float4 *w4 = (const float4 *)w;
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int idx = threadIdx.x + i * blockDim.x;
    gw[i] = idx < dim4 ? w4[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
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
  __shared__ float red[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    t = warp_sum(t);
    if (threadIdx.x == 0) red[0] = t;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(red[0] / (float)dim + eps);
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
}

bool cu_norm_q(float *out, float *x, const float *a, const float *w, int n, int dim, float eps, float off, void *xqv,
               cudaStream_t s, const float *xsrc) {
  if (n <= 0 || dim <= 0 || dim % 4 || (xqv && dim % 32) || (((uintptr_t)out | (uintptr_t)x | (uintptr_t)a |
      (uintptr_t)w | (uintptr_t)xsrc) & 15))
    return false;
  const int dim4 = dim / 4;
  int th = ((dim4 + 31) / 32) * 32, vpt = 1;
  while (th > 1024) { vpt *= 2; th = ((dim4 + vpt - 1) / vpt + 31) / 32 * 32; }
  if (vpt > 8) return false;
  if (th < 64) th = 64;
  uint8_t *xq = (uint8_t *)xqv;
  float2 *xs = xq ? (float2 *)(xq + (size_t)n * (size_t)dim) : NULL;
  switch (vpt) {
  case 1: cu_launch(k_norm_q<1>, dim3(n), dim3(th), 0, s, out, x, a, w, dim, eps, off, xq, xs, xsrc); break;
  case 2: cu_launch(k_norm_q<2>, dim3(n), dim3(th), 0, s, out, x, a, w, dim, eps, off, xq, xs, xsrc); break;
  case 4: cu_launch(k_norm_q<4>, dim3(n), dim3(th), 0, s, out, x, a, w, dim, eps, off, xq, xs, xsrc); break;
  default: cu_launch(k_norm_q<8>, dim3(n), dim3(th), 0, s, out, x, a, w, dim, eps, off, xq, xs, xsrc); break;
  }
  return true;
}

void cu_q4_matvec_preq(const cu_weight *const *ws, float *const *ys, int nw, int n, const void *xqv, cudaStream_t s,
                       int *glu_cnt, void *hq, int role, const cu_gu_norm *norm) {
  const int64_t K = ws[0]->cols;
  const int V = (int)(K / 32);
  const uint4 *q4 = (const uint4 *)xqv;
  const float2 *xs = (const float2 *)((const uint8_t *)xqv + (size_t)n * (size_t)K);
  const int rb = q4_rb(n, V, role);
  int64_t M = 0;
  for (int i = 0; i < nw; i++) M += ws[i]->rows;
  glu_args g = { NULL, NULL, NULL };
  if (glu_cnt) {
    g.cnt = glu_cnt;
    g.hq = (uint8_t *)hq;
    g.hs = (float2 *)(g.hq + (size_t)n * (size_t)ws[0]->rows);
    if (n == 1 && nw == 2 && !norm && mvr_glu_launch(ws, ys, q4, xs, g.hq, g.hs, s)) return;
    if (n == 1 && nw == 2 && guq_ok(ws[0], ws[1])) { /* one kernel, no counters */
      mv_args a;
      memset(&a, 0, sizeof a);
      for (int i = 0; i < 2; i++) { a.q[i] = ws[i]->q; a.sb[i] = ws[i]->sb; a.y[i] = ys[i]; a.M[i] = (int)ws[i]->rows; }
      const int lg = ws[0]->gs == 32 ? 0 : ws[0]->gs == 64 ? 1 : 2;
      const dim3 grid((unsigned)(ws[0]->rows / 32));
      gu_norm gn = { NULL, NULL, NULL, 0.f, 0.f, NULL };
      if (norm) gn = gu_norm{ norm->x, norm->a, norm->w, norm->off, norm->eps, norm->hout };
      switch (guq_cfg(ws[0]) * 2 + (norm != NULL)) {
#define GUQ_GO(U, N) cu_launch(k_gu_q4<U, N>, grid, dim3(256), 0, s, a, q4, xs, (int)K, lg, ws[0]->sbk, g.hq, g.hs, gn)
      case 4: GUQ_GO(2, false); break;
      case 5: GUQ_GO(2, true); break;
      case 8: GUQ_GO(4, false); break;
      case 9: GUQ_GO(4, true); break;
      case 3: GUQ_GO(1, true); break;
      default: GUQ_GO(1, false); break;
#undef GUQ_GO
      }
      return;
    }
  }
  if (n == 1 && !glu_cnt && mvr_launch(ws, ys, nw, q4, xs, role, s)) return;
  s_q4_pf = role >= 0 && role < CU_Q4_ROLES ? g_cu_q4role_pf[role] : 0;
  s_role = role >= 0 && role < CU_Q4_ROLES ? role : -1;
  q4_launch_n(ws, ys, nw, q4, xs, n, q4_tl(V, n, rb, M, role), rb, s, g);
  s_role = -1;
  s_q4_pf = 0;
}

void cu_q4_set_dnorm(const float *ssp, int nss, float eps, int dim) {
  s_dn_ssp = ssp;
  s_dn_nss = nss;
  s_dn_eps = eps;
  s_dn_dim = (float)dim;
}
bool cu_q4_dnorm_ok(const cu_weight *const *ws, int nw, int role) {
  if (nw < 1 || nw > 3 || ws[0]->kind != CW_Q4 || ws[0]->cols > 4096 || ws[0]->cols % 128) return false; /* dn_load */
  if (mvr_launch(ws, NULL, nw, NULL, NULL, role, 0, true)) return false;
  const int r = role >= 0 && role < CU_Q4_ROLES ? role : CU_Q4_ROLES;
  return !((g_cu_mvt >> r) & 1);
}

static bool mvr_glu_ok(const cu_weight *g, const cu_weight *u) {
  const cu_weight *ws[2] = { g, u };
  float *ys[2] = { NULL, NULL };
  return mvr_glu_launch(ws, ys, NULL, NULL, NULL, NULL, 0, true);
}
/* k_mvr (without the GLU epilogue) takes gate/up where mvr_on unless SMELT_CUDA_GUQ asks for
 * k_gu_q4: silu(gate)*up is then quantized by k_quant_x before the down projection (measured
 * faster than k_gu_q4 for the 8B shape) */
bool cu_q4_guq_ok(const cu_weight *g, const cu_weight *u, int n) {
  if (n != 1) return false;
  if (mvr_glu_ok(g, u)) return true;
  const cu_weight *ws[2] = { g, u };
  return guq_ok(g, u) && (g_cu_guq > 0 || !mvr_launch(ws, NULL, 2, NULL, NULL, CU_Q4_GU, 0, true));
}
bool cu_q4_guq_norm_ok(const cu_weight *g, const cu_weight *u, int n) {
  return g_cu_guq_norm && n == 1 && guq_ok(g, u) && g->cols <= 4096;
}
bool cu_q4_glu_ok(const cu_weight *g, const cu_weight *u, int n) {
  if (n == 1 && (mvr_glu_ok(g, u) || guq_ok(g, u))) return true;
  if (g->kind != CW_Q4 || !cu_matvec_compatible(g, u) || g->rows != u->rows || g->rows % 32 || n < 1 ||
      n > CU_Q4_MAX_N)
    return false;
  const int rb = q4_rb(n, (int)(g->cols / 32), CU_Q4_GU);
  const int tl = q4_tl((int)(g->cols / 32), n, rb, 2 * g->rows, CU_Q4_GU);
  return 32 % ((128 >> tl) * (rb % 10)) == 0;
}
