/* Matrix-vector products with float activations for decode batches (n <= 8 columns): the dense
 * (bf16/f16/f32) and the quantized 2/4/8-bit "fast" layout kernels read weights as 16-byte
 * vectors; other bit widths go through the generic MLX-layout kernel. 4-bit weights of the int8
 * layout (CW_Q4) are handed to cuda_q4.cu. See cuda_common.cuh for the weight layouts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_ew.cuh"
#include "backend/cuda/cuda_ldst.cuh"
#include "backend/cuda/cuda_mv.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_q4.cuh"
#include "backend/cuda/cuda_q4dev.cuh"

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

/* k_mv_qfast: a warp R rows, 4 warps a block. SPLIT (R = 1; small weights, few rows: routers, Gated DeltaNet's
 * b and a): a block one row, its 4 warps taking every fourth 128-word chunk of it, summed at the end, so
 * that a row's loads are in flight at once instead of one chunk after the other */
/* a warp's R rows x N columns of sums (one partial a lane) into y[c][row0 + r], rows below M, columns below n */
template <int R, int N>
static __device__ __forceinline__ void mv_store(const float (&acc)[R][N], int lane, float *__restrict__ y, int row0,
                                                int M, int n, const mv_args &a, int wi) {
#pragma unroll
  for (int r = 0; r < R; r++) {
    const float b = lane == 0 && row0 + r < M ? mv_bias(a, wi, row0 + r) : 0.f;
#pragma unroll
    for (int c = 0; c < N; c++) {
      float v = warp_sum(acc[r][c]);
      if (lane == 0 && row0 + r < M && c < n) y[(int64_t)c * M + row0 + r] = v + b;
    }
  }
}

template <int BITS, int R, int N, int SBK, bool SPLIT = false>
__global__ void __launch_bounds__(128) k_mv_qfast(const mv_args a, const float *__restrict__ x, int K, int gs, int n) {
  static_assert(!SPLIT || R == 1, "a split row");
  constexpr int E = 32 / BITS;
  const int wi = (int)blockIdx.x >= a.bstart[2] ? 2 : (int)blockIdx.x >= a.bstart[1] ? 1 : 0;
  /* selects, not indexing: a dynamically indexed parameter array would go to local memory */
  const uint32_t *__restrict__ q = (const uint32_t *)(wi == 0 ? a.q[0] : wi == 1 ? a.q[1] : a.q[2]);
  const void *__restrict__ sb = wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2];
  float *__restrict__ y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int bst = wi == 0 ? a.bstart[0] : wi == 1 ? a.bstart[1] : a.bstart[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = SPLIT ? (int)blockIdx.x - bst : (((int)blockIdx.x - bst) * 4 + warp) * R;
  if (row0 >= M) return; /* SPLIT: the whole block */
  const int W = K / E, C = W / 128, G = K / gs;
  const int c0 = SPLIT ? warp : 0, cs = SPLIT ? 4 : 1;
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
  for (int c = c0; c < C; c += cs) {
    uint4 v[R];
#pragma unroll
    for (int r = 0; r < R; r++) v[r] = ld_stream(q + rows[r] * W + (int64_t)c * 128 + lane * 4);
    if (c == c0) pdl_wait(); /* weights of the first chunk are requested before waiting for x */
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
  for (int u = C * 128 + 32 * c0 + lane; u < W; u += 32 * cs) {
    uint32_t wd[R];
#pragma unroll
    for (int r = 0; r < R; r++) wd[r] = __ldg(q + rows[r] * W + u);
    mv_word<BITS, R, N, SBK>(wd, u, rows, sb, G, gs, x, K, n, acc);
  }
  if constexpr (SPLIT) {
    __shared__ float red[4][N];
#pragma unroll
    for (int c = 0; c < N; c++) {
      const float v = warp_sum(acc[0][c]);
      if (lane == 0) red[warp][c] = v;
    }
    __syncthreads();
    if (threadIdx.x < N && (int)threadIdx.x < n)
      y[(int64_t)threadIdx.x * M + row0] =
          (red[0][threadIdx.x] + red[1][threadIdx.x]) + (red[2][threadIdx.x] + red[3][threadIdx.x]) + mv_bias(a, wi, row0);
  } else {
    mv_store<R, N>(acc, lane, y, row0, M, n, a, wi);
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
  mv_store<R, N>(acc, lane, y, row0, M, n, a, wi);
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
      t.x = cu_silu(t.x) * u.x;
      t.y = cu_silu(t.y) * u.y;
      t.z = cu_silu(t.z) * u.z;
      t.w = cu_silu(t.w) * u.w;
    }
    xv[4 * e] = t.x; xv[4 * e + 1] = t.y; xv[4 * e + 2] = t.z; xv[4 * e + 3] = t.w;
  }
}

template <int BITS, typename T, int N, int RB, bool SILU>
__global__ void __launch_bounds__(128, N == 1 ? 3 : 1) k_mv2(const mv_args a, const float *__restrict__ x,
                                                            const float *__restrict__ xu, int K, int gs, int sbk,
                                                            int n, int tl, int n_tiles) {
  constexpr int EPV = BITS ? 128 / BITS : 16 / (int)sizeof(T); /* elements per 16-byte vector */
  constexpr int WE = BITS ? 32 / BITS : 1;                      /* elements per 32-bit word */
  constexpr float A = BITS == 8 ? 1.f : 64.f, B0 = BITS == 8 ? 0.f : 128.f;
  __shared__ float red[4][RB * N];
  pdl_trigger();
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
      load_x<EPV, SILU>(xv, x, xu, (int64_t)col * K + (int64_t)v * EPV);
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
          if (row0 + r < M && c < n) y[(int64_t)c * M + row0 + r] = vals[r * N + c] + mv_bias(a, wi, row0 + r);
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
    if (row < M && c < n) y[(int64_t)c * M + row] = sum + mv_bias(a, wi, row);
  }
  __syncthreads();
  }
}



/* ---------------- dispatch ---------------- */
/* rpb: rows per block */
mv_args cu_mv_args(const cu_weight *const *ws, float *const *ys, int nw, int rpb, unsigned *blocks,
                   const float *const *bias) {
  mv_args a;
  memset(&a, 0, sizeof a);
  int b = 0;
  for (int i = 0; i < 3; i++) {
    a.bstart[i] = i < nw ? b : 0x7fffffff;
    if (i < nw) {
      a.q[i] = ws[i]->q; a.sb[i] = ws[i]->sb; a.y[i] = ys[i]; a.M[i] = (int)ws[i]->rows;
      a.bias[i] = bias ? bias[i] : NULL;
      b += (int)((ws[i]->rows + rpb - 1) / rpb);
    }
  }
  a.bstart[3] = 0x7fffffff;
  *blocks = (unsigned)b;
  return a;
}
/* split rows (k_mv_qfast SPLIT) where the weights have at most this many rows in all and a row several
 * 128-word chunks: one block a row still fills the GPU with loads (measured on the H100, docs/cuda.md) */
#define QFAST_SPLIT_ROWS 1024
template <int BITS, int R, int N>
static void launch_qfast(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n,
                         const float *const *bias) {
  unsigned blocks;
  const int K = (int)ws[0]->cols, gs = ws[0]->gs;
  int64_t M = 0;
  for (int i = 0; i < nw; i++) M += ws[i]->rows;
  if (R == 1 && M <= QFAST_SPLIT_ROWS && K / (32 / BITS) >= 2 * 128) {
    mv_args a = cu_mv_args(ws, ys, nw, 1, &blocks, bias);
    switch (ws[0]->sbk) {
    case SBK_F16: cu_launch(cx, k_mv_qfast<BITS, 1, N, SBK_F16, true>, dim3(blocks), dim3(128), 0, a, x, K, gs, n); break;
    case SBK_F32: cu_launch(cx, k_mv_qfast<BITS, 1, N, SBK_F32, true>, dim3(blocks), dim3(128), 0, a, x, K, gs, n); break;
    default: cu_launch(cx, k_mv_qfast<BITS, 1, N, SBK_BF16, true>, dim3(blocks), dim3(128), 0, a, x, K, gs, n); break;
    }
    return;
  }
  mv_args a = cu_mv_args(ws, ys, nw, 4 * R, &blocks, bias);
  switch (ws[0]->sbk) {
  case SBK_F16: cu_launch(cx, k_mv_qfast<BITS, R, N, SBK_F16>, dim3(blocks), dim3(128), 0, a, x, K, gs, n); break;
  case SBK_F32: cu_launch(cx, k_mv_qfast<BITS, R, N, SBK_F32>, dim3(blocks), dim3(128), 0, a, x, K, gs, n); break;
  default: cu_launch(cx, k_mv_qfast<BITS, R, N, SBK_BF16>, dim3(blocks), dim3(128), 0, a, x, K, gs, n); break;
  }
}
template <int BITS, int R>
static void launch_qfast_n(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n,
                           const float *const *bias) {
  if (n == 1) launch_qfast<BITS, R, 1>(cx, ws, ys, nw, x, n, bias);
  else if (n == 2) launch_qfast<BITS, R, 2>(cx, ws, ys, nw, x, n, bias);
  else if (n <= 4) launch_qfast<BITS, R, 4>(cx, ws, ys, nw, x, n, bias);
  else launch_qfast<BITS, R, 8>(cx, ws, ys, nw, x, n, bias);
}
template <typename T, int R>
static void launch_dense_n(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n,
                           const float *const *bias) {
  unsigned blocks;
  mv_args a = cu_mv_args(ws, ys, nw, 4 * R, &blocks, bias);
  const int K = (int)ws[0]->cols;
  const int vec = (K % (16 / (int)sizeof(T))) == 0;
  if (n == 1) k_mv_dense<T, R, 1><<<blocks, 128, 0, cx->s>>>(a, x, K, n, vec); /* no PDL: it does not wait */
  else if (n == 2) k_mv_dense<T, R, 2><<<blocks, 128, 0, cx->s>>>(a, x, K, n, vec); /* no PDL: it does not wait */
  else if (n <= 4) k_mv_dense<T, R, 4><<<blocks, 128, 0, cx->s>>>(a, x, K, n, vec); /* no PDL: it does not wait */
  else k_mv_dense<T, R, 8><<<blocks, 128, 0, cx->s>>>(a, x, K, n, vec); /* no PDL: it does not wait */
}

static bool mv2_ok(const cu_weight *w, const float *x) {
  if (((uintptr_t)x & 15) || w->cols > INT32_MAX / 2) return false;
  if (w->kind == CW_DENSE) return w->cols % (16 / (int64_t)sm_dtype_size(w->dtype)) == 0;
  if (w->kind == CW_QFAST) return (w->cols * w->bits) % 128 == 0;
  return false;
}

template <int BITS, typename T, int N, int RB, bool SILU>
static void launch_mv2(const cu_ctx *cx, const mv_args &a, unsigned tiles, const float *x, const float *xu, int K,
                       int gs, int sbk, int n, int tl) {
  /* one block per row tile; x read through L1 (staging x in shared memory measured slower) */
  cu_launch(cx, k_mv2<BITS, T, N, RB, SILU>, dim3(tiles), dim3(128), 0, a, x, xu, K, gs, sbk, n, tl, (int)tiles);
}

/* rows-per-thread choice and launch for one (bits, type) */
template <int BITS, typename T>
static void mv2_dispatch(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x,
                         const float *xu, int n, const float *const *bias = NULL) {
  const int K = (int)ws[0]->cols;
  const int EPV = BITS ? 128 / BITS : 16 / (int)sizeof(T);
  const int V = K / EPV;
  const int tl = V <= 32 ? 5 : V <= 64 ? 6 : 7;
  const int gs = ws[0]->gs, sbk = ws[0]->sbk;
  int RB = 4;
  if (n == 1) {
    unsigned b8;
    cu_mv_args(ws, ys, nw, (128 >> tl) * 8, &b8);
    RB = b8 >= (unsigned)(2 * cx->n_sm) ? 8 : 4;
  }
  unsigned blocks;
  mv_args a = cu_mv_args(ws, ys, nw, (128 >> tl) * RB, &blocks, bias);
  if (xu) {
    if (RB == 8) launch_mv2<BITS, T, 1, 8, true>(cx, a, blocks, x, xu, K, gs, sbk, n, tl);
    else launch_mv2<BITS, T, 1, 4, true>(cx, a, blocks, x, xu, K, gs, sbk, n, tl);
    return;
  }
  if (n == 1) {
    if (RB == 8) launch_mv2<BITS, T, 1, 8, false>(cx, a, blocks, x, xu, K, gs, sbk, n, tl);
    else launch_mv2<BITS, T, 1, 4, false>(cx, a, blocks, x, xu, K, gs, sbk, n, tl);
  } else if (n == 2) launch_mv2<BITS, T, 2, 4, false>(cx, a, blocks, x, xu, K, gs, sbk, n, tl);
  else if (n <= 4) launch_mv2<BITS, T, 4, 4, false>(cx, a, blocks, x, xu, K, gs, sbk, n, tl);
  else launch_mv2<BITS, T, 8, 4, false>(cx, a, blocks, x, xu, K, gs, sbk, n, tl);
}

bool cu_matvec_silu(const cu_ctx *cx, const cu_weight *w, const float *g, const float *u, int n, float *y, void *xq,
                    bool gelu) {
  if (w->kind == CW_Q4 && xq && n >= 1 && n <= CU_Q4_MAX_N) {
    cu_q4_matvec(cx, &w, &y, 1, g, u, n, xq, CU_Q4_DN, 0, 0, gelu);
    return true;
  }
  if (gelu || n != 1 || w->kind != CW_DENSE || !mv2_ok(w, g) || ((uintptr_t)u & 15)) return false;
  switch (w->dtype) {
  case SM_DT_BF16: mv2_dispatch<0, __nv_bfloat16>(cx, &w, &y, 1, g, u, n); break;
  case SM_DT_F16: mv2_dispatch<0, __half>(cx, &w, &y, 1, g, u, n); break;
  default: mv2_dispatch<0, float>(cx, &w, &y, 1, g, u, n); break;
  }
  return true;
}

/* the bias of kernels without the epilogue (the row kernel of microscaling weights, k_mv_qgen) */
static void bias_after(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, int n,
                       const float *const *bias) {
  for (int i = 0; bias && i < nw; i++)
    if (bias[i]) cu_ew(cx, CU_EW_ADD_ROWS, ys[i], bias[i], NULL, 0.f, (size_t)n * ws[i]->rows, (int)ws[i]->rows);
}

bool cu_matvec_compatible(const cu_weight *a, const cu_weight *b) {
  return a->kind == b->kind && a->kind != CW_QGEN && a->kind != CW_MXQ && a->cols == b->cols && a->bits == b->bits && a->gs == b->gs &&
         a->dtype == b->dtype && a->sbk == b->sbk;
}

void cu_matvec_multi(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n,
                     void *xq, int role, const float *const *bias) {
  if (ws[0]->kind == CW_Q4) {
    cu_q4_matvec(cx, ws, ys, nw, x, NULL, n, xq, role, 0, 0, false, bias);
    return;
  }
  if (ws[0]->kind == CW_MXQ) { /* microscaling weights: the row kernel of cuda_moe.cu, n columns */
    for (int i = 0; i < nw; i++) cu_rows_matvec(cx, ws[i], ws[i]->rows, NULL, 1, x, true, NULL, ys[i], n);
    bias_after(cx, ws, ys, nw, n, bias);
    return;
  }
  const cudaStream_t s = cx->s;
  int64_t M = 0;
  for (int i = 0; i < nw; i++) M += ws[i]->rows;
  /* two rows per warp when there are enough rows to fill the chip */
  const bool r2 = M >= (int64_t)cx->n_sm * 16;
  const cu_weight *w = ws[0];
  bool fast = w->kind == CW_DENSE;
  for (int i = 0; i < nw; i++) fast &= mv2_ok(ws[i], x);
  if (fast) { /* 16-byte dense matvec, several rows per thread */
    switch (w->dtype) {
    case SM_DT_BF16: mv2_dispatch<0, __nv_bfloat16>(cx, ws, ys, nw, x, NULL, n, bias); break;
    case SM_DT_F16: mv2_dispatch<0, __half>(cx, ws, ys, nw, x, NULL, n, bias); break;
    default: mv2_dispatch<0, float>(cx, ws, ys, nw, x, NULL, n, bias); break;
    }
    return;
  }
  if (w->kind == CW_DENSE) {
    switch (w->dtype) {
    case SM_DT_BF16: r2 ? launch_dense_n<__nv_bfloat16, 2>(cx, ws, ys, nw, x, n, bias) : launch_dense_n<__nv_bfloat16, 1>(cx, ws, ys, nw, x, n, bias); break;
    case SM_DT_F16: r2 ? launch_dense_n<__half, 2>(cx, ws, ys, nw, x, n, bias) : launch_dense_n<__half, 1>(cx, ws, ys, nw, x, n, bias); break;
    default: r2 ? launch_dense_n<float, 2>(cx, ws, ys, nw, x, n, bias) : launch_dense_n<float, 1>(cx, ws, ys, nw, x, n, bias); break;
    }
    return;
  }
  if (w->kind == CW_QFAST) {
    switch (w->bits) {
    case 2: r2 ? launch_qfast_n<2, 2>(cx, ws, ys, nw, x, n, bias) : launch_qfast_n<2, 1>(cx, ws, ys, nw, x, n, bias); break;
    case 8: r2 ? launch_qfast_n<8, 2>(cx, ws, ys, nw, x, n, bias) : launch_qfast_n<8, 1>(cx, ws, ys, nw, x, n, bias); break;
    default: r2 ? launch_qfast_n<4, 2>(cx, ws, ys, nw, x, n, bias) : launch_qfast_n<4, 1>(cx, ws, ys, nw, x, n, bias); break;
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
  bias_after(cx, ws, ys, nw, n, bias);
}
