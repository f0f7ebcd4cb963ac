/* The one-token MLP of 4-bit models in one persistent kernel (k_mlp1): the residual add and rmsnorm
 * before it, gate and up, silu(gate) * up quantized, a grid barrier, down, and (deferred) the add and
 * rmsnorm after it; silu(gate) * up, or gelu_tanh(gate) * up (Gemma). Shapes of Llama-3.2-1B,
 * Llama-3.2-3B / Phi-4-mini, Qwen3-8B, Llama-3.1-8B, Gemma-3-4B and Gemma-3-12B (K <= 1024 VG, F = 1024 VD). */
#include <mutex>
#include <stdio.h>
#include <string.h>
#include "backend/cuda/cuda_ldst.cuh"
#include "backend/cuda/cuda_mlp.cuh"
#include "backend/cuda/cuda_q4dev.cuh"

#ifdef SMELT_CUDA_TRACE
__device__ unsigned long long *tr_m;
#endif
void cu_mlp_set_trace(unsigned long long *buf) {
#ifdef SMELT_CUDA_TRACE
  cudaMemcpyToSymbol(tr_m, &buf, sizeof buf);
#else
  (void)buf;
#endif
}

/* ---------------- fused one-token MLP: gate/up, silu(gate)*up quantized, down (k_mlp1) ----------------
 * With the residual add + rmsnorm before it (measured on the H100: 8B 2.23-2.24 vs 2.30-2.31 ms a step
 * against separate kernels, docs/cuda.md). A persistent kernel, one block of 16 warps an SM
 * (grid = the blocks that fit at once): the blocks take the 32-row chunks of gate and up in turn
 * (k_mvr's register layout: warps 0-7 gate, 8-15 up, 4 rows a warp; the next chunk's weights are
 * requested as the current one's are consumed), write gate and up, quantize h = silu(gate) * up of
 * each chunk into hq/hs (k_quant_x's layout and formulas), arrive at a grid barrier (a counter
 * pair per launch, zero, left zero), request their first down rows, wait at the barrier (split so
 * that the arrival's fences do not wait for those loads), stage h in shared memory and take
 * 16-row items of the down projection (a warp a row, pipelined the same way). One launch instead
 * of gate/up, the quantization of h and down. Needs K a multiple of 32 with K / 32 <= 32 VG (a lane's
 * vectors past K / 32 are zero), F = 1024 VD, 16-bit scales. */
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
struct mlp_args {
  const uint4 *gq, *uq, *dq;
  const uint32_t *gsb, *usb, *dsb;
  float *gy, *uy, *y;
  uint8_t *hq;
  float2 *hs;
  int K, F, lg, sbk;
  unsigned *bar; /* the grid barrier's counter pair (zero, left zero) */
  /* NORM: x is rmsnorm(nx + na) * (nw + off), computed by every block as k_norm_q does (bitwise);
   * block 0 writes nx + na to hout */
  const float *nx, *na, *nw;
  float off, eps;
  float *hout;
  /* NORM 2: the sandwich norm before (na normed first with pw, poff, peps: mlp_norm_q<true>) */
  const float *pw;
  float poff, peps;
  /* DNORM (with NORM; dx != NULL): the residual add after down and the next norm's int8
   * x, deferred: block b takes the down items 2b, 2b + 1 (rows 32b .. 32b + 31), then writes
   * dx = hout + y for them, dq8 / dxs = their int8 quantization of dx * (dw + doff) (not divided by
   * the rms) and dssp[b] = the sum of dx^2; the consumer scales by the rms (cu_q4_dnorm) */
  float *dx;
  const float *dw;
  float doff;
  uint8_t *dq8;
  float2 *dxs;
  float *dssp;
  int ef;   /* tuning wef & 3: 1 the weights, 2 their scales read with the L2 evict-first policy */
  int gelu; /* h = gelu_tanh(gate) * up (else silu) */
};
/* NORM: 0 x given (xq, xs), 1 the add + rmsnorm before (nx, na, nw), 2 also na's own norm (pw) */
template <int VG, int VD, int NORM>
__global__ void __launch_bounds__(512, 1) k_mlp1(const mlp_args m, const uint4 *__restrict__ xq,
                                                const float2 *__restrict__ xs) {
  __shared__ uint4 xa[32 * (VD > VG ? VD : VG)], xb[32 * (VD > VG ? VD : VG)];
  __shared__ float2 xd[32 * (VD > VG ? VD : VG)];
  __shared__ float hsm[2][64];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = warp >> 3, wr = warp & 7;
  const int V = m.K >> 5, VF = 32 * VD, lg = m.lg, sbk = m.sbk;
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
      for (int k = 0; k < VG; k++)
        w[r][k] = lane + 32 * k < V ? MLP_LDW(wq + row * V + lane + 32 * k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int64_t row = (int64_t)c * 32 + wr * 4 + r;
#pragma unroll
      for (int k = 0; k < VG; k++) p[r][k] = lane + 32 * k < V ? MLP_LDS(wsb + row * G + ((lane + 32 * k) >> lg)) : 0u;
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
    mlp_norm_q<NORM == 2>(m.nx, m.na, gw, m.off, m.eps, m.hout, dim4, xa, xb, xd, &hsm[0][0], m.pw, m.poff,
                          m.peps); /* hsm is free until the first chunk */
  }
  for (int v = V + threadIdx.x; v < 32 * VG; v += 512) { /* the vectors past K / 32: zero (their weights are zero) */
    xa[v] = make_uint4(0, 0, 0, 0);
    xb[v] = make_uint4(0, 0, 0, 0);
    xd[v] = make_float2(0.f, 0.f);
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
        if (cn < nch && v < V) { /* the next chunk's vector into the consumed registers */
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
      const float g = hsm[it & 1][lane], hv = (m.gelu ? cu_gelu_tanh(g) : cu_silu(g)) * hsm[it & 1][32 + lane];
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
  /* the first down rows do not depend on h: requested before the barrier, after this block's
   * arrival, so that the arrival's fences do not wait for them */
  blocks_arrive(m.bar);
  uint4 wd[VD];
  uint32_t pd[VD];
  const bool dn = m.dx != NULL;
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
  blocks_wait(m.bar, gridDim.x);
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
  /* the last block out resets the barriers for the next launch (a later graph replay) */
  if (threadIdx.x == 0 && atomicAdd(m.bar + 1, 1u) == gridDim.x - 1) {
    m.bar[0] = 0;
    m.bar[1] = 0;
  }
}

#undef MLP_LDW
#undef MLP_LDS
#undef MLP_LDW
#undef MLP_LDS

/* the shapes k_mlp1 has a variant for (gate/up K x F, down F x K), as VG * 100 + VD
 * (K <= 1024 VG, F = 1024 VD), 0 for none */
static int mlp_shape(const cu_weight *g, const cu_weight *u, const cu_weight *d) {
  if (g->kind != CW_Q4 || u->kind != CW_Q4 || d->kind != CW_Q4 || g->sbk == SBK_F32 || u->sbk != g->sbk ||
      d->sbk != g->sbk || u->gs != g->gs || d->gs != g->gs || g->rows != u->rows || g->cols != u->cols ||
      d->cols != g->rows || d->rows != g->cols || (g->gs != 32 && g->gs != 64 && g->gs != 128))
    return 0;
  const int64_t K = g->cols, F = g->rows;
  if (K % 32 || F % 1024 || K > 4096) return 0;
  const int code = (int)((K / 32 + 31) / 32) * 100 + (int)(F / 1024);
  switch (code) {
  case 208: /* Llama-3.2-1B */
  case 308: /* Llama-3.2-3B, Phi-4-mini */
  case 310: /* Gemma-3-4B */
  case 412: /* Qwen3-8B */
  case 414: /* Llama-3.1-8B, Mistral-7B, Gemma-2-9B */
  case 415: /* Gemma-3-12B */
    return code;
  default: return 0;
  }
}
/* NORM 2 (the sandwich norm before) is built for VG <= this: at VG 4 it made ptxas spill 32 bytes */
#define MLP_PRE_VG 3
/* the grid: as many blocks as fit at once on the device (every block must be resident for the grid
 * barrier), the same for the variants of a shape */
template <int VG, int VD> static int mlp_grid() {
  static int grid = -1;
  if (grid < 0) {
    int nb = 0, nb2 = 0, dev = 0, nsm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    int nb3 = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_mlp1<VG, VD, 0>, 512, 0) != cudaSuccess) nb = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb2, k_mlp1<VG, VD, 1>, 512, 0) != cudaSuccess) nb2 = 0;
    nb = nb < nb2 ? nb : nb2;
    if constexpr (VG <= MLP_PRE_VG) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb3, k_mlp1<VG, VD, 2>, 512, 0) != cudaSuccess) nb3 = 0;
      nb = nb < nb3 ? nb : nb3;
    }
    grid = nb * nsm;
  }
  return grid;
}

/* the grid barrier's counters: pairs of zeroed ints per device, one pair a launch (a recorded launch
 * keeps its pair), reused round-robin */
#define MLP_BAR_PAIRS 4096
static unsigned *s_bar[16];
static unsigned s_bar_next[16];
static std::mutex s_init_mu;
void cu_mlp_init(int dev) {
  std::lock_guard<std::mutex> lk(s_init_mu);
  mlp_grid<4, 14>(); /* occupancy queries outside any stream capture */
  mlp_grid<4, 12>();
  mlp_grid<3, 8>();
  mlp_grid<2, 8>();
  mlp_grid<3, 10>();
  mlp_grid<4, 15>();
  if (dev < 0 || dev >= 16 || s_bar[dev]) return;
  if (cudaMalloc(&s_bar[dev], MLP_BAR_PAIRS * 2 * sizeof(unsigned)) != cudaSuccess) { s_bar[dev] = NULL; return; }
  cudaMemset(s_bar[dev], 0, MLP_BAR_PAIRS * 2 * sizeof(unsigned));
  cudaDeviceSynchronize();
}

/* one stream a device may use k_mlp1 (two persistent kernels on two streams could each wait for
 * the other's SMs): the first that asks, until it releases */
static std::mutex s_mlp_mu;
static cudaStream_t s_mlp_owner[16];
static bool s_mlp_owned[16];
bool cu_mlp_claim(const cu_ctx *cx) {
  const int dev = cx->dev;
  if (dev < 0 || dev >= 16) return false;
  std::lock_guard<std::mutex> lk(s_mlp_mu);
  if (!s_mlp_owned[dev]) {
    s_mlp_owned[dev] = true;
    s_mlp_owner[dev] = cx->s;
  }
  return s_mlp_owner[dev] == cx->s;
}
void cu_mlp_release(cudaStream_t s) {
  std::lock_guard<std::mutex> lk(s_mlp_mu);
  for (int d = 0; d < 16; d++)
    if (s_mlp_owned[d] && s_mlp_owner[d] == s) s_mlp_owned[d] = false;
}

/* the grid of a shape's variant (mlp_shape), 0 for none */
static int mlp_grid_of(int shape) {
  switch (shape) {
  case 414: return mlp_grid<4, 14>();
  case 412: return mlp_grid<4, 12>();
  case 308: return mlp_grid<3, 8>();
  case 208: return mlp_grid<2, 8>();
  case 310: return mlp_grid<3, 10>();
  case 415: return mlp_grid<4, 15>();
  default: return 0;
  }
}
/* the launch of a shape's variant (mode: k_mlp1's NORM) */
template <int VG, int VD>
static void mlp_go(const cu_ctx *cx, int grid, const mlp_args &m, const uint4 *xq, const float2 *xs, int mode) {
  if (mode == 2) {
    if constexpr (VG <= MLP_PRE_VG) cu_launch(cx, k_mlp1<VG, VD, 2>, dim3(grid), dim3(512), 0, m, xq, xs);
  } else if (mode == 1) cu_launch(cx, k_mlp1<VG, VD, 1>, dim3(grid), dim3(512), 0, m, xq, xs);
  else cu_launch(cx, k_mlp1<VG, VD, 0>, dim3(grid), dim3(512), 0, m, xq, xs);
}
bool cu_mlp_pre_ok(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, const cu_weight *d) {
  return cu_mlp_ok(cx, g, u, d, 1) && mlp_shape(g, u, d) / 100 <= MLP_PRE_VG;
}
bool cu_mlp_ok(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, const cu_weight *d, int n) {
  if (n != 1 || cx->arch < 90 || !mlp_shape(g, u, d)) return false;
  if (cx->dev < 0 || cx->dev >= 16 || !s_bar[cx->dev]) return false; /* cu_mlp_init */
  return mlp_grid_of(mlp_shape(g, u, d)) > 0;
}
bool cu_mlp_dnorm_ok(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, const cu_weight *d) {
  if (!cu_mlp_ok(cx, g, u, d, 1)) return false;
  const int grid = mlp_grid_of(mlp_shape(g, u, d));
  const int ndn = (int)(g->cols / 16);
  /* the pairs of down items take no more rounds of the grid than single items */
  return grid > 0 && ndn % 2 == 0 && 2 * ((ndn / 2 + grid - 1) / grid) == (ndn + grid - 1) / grid;
}
bool cu_mlp(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, const cu_weight *d, float *gy, float *uy,
            float *y, const void *xqv, void *hqv, const cu_mlp_norm *norm, const cu_mlp_dnorm *dnm, bool gelu) {
  if (!cu_mlp_ok(cx, g, u, d, 1)) return false;
  if (dnm && (!norm || !norm->hout || !cu_mlp_dnorm_ok(cx, g, u, d))) return false;
  if (norm && (((uintptr_t)norm->x | (uintptr_t)norm->a | (uintptr_t)norm->w | (uintptr_t)norm->hout |
                (uintptr_t)norm->pw) & 15))
    return false;
  if (norm && norm->pw && (!norm->a || !cu_mlp_pre_ok(cx, g, u, d))) return false;
  const int dev = cx->dev;
  const int shape = mlp_shape(g, u, d), grid = mlp_grid_of(shape);
  mlp_args m;
  memset(&m, 0, sizeof m);
  m.gq = (const uint4 *)g->q; m.uq = (const uint4 *)u->q; m.dq = (const uint4 *)d->q;
  m.gsb = (const uint32_t *)g->sb; m.usb = (const uint32_t *)u->sb; m.dsb = (const uint32_t *)d->sb;
  m.gy = gy; m.uy = uy; m.y = y;
  m.hq = (uint8_t *)hqv;
  m.hs = (float2 *)(m.hq + (size_t)g->rows);
  m.K = (int)g->cols; m.F = (int)g->rows;
  m.lg = g->gs == 32 ? 0 : g->gs == 64 ? 1 : 2;
  m.sbk = g->sbk;
  {
    std::lock_guard<std::mutex> lk(s_init_mu);
    m.bar = s_bar[dev] + 2 * (s_bar_next[dev]++ % MLP_BAR_PAIRS);
  }
  m.ef = cx->t->wef & 3;
  m.gelu = gelu ? 1 : 0;
  m.nx = norm ? norm->x : NULL; m.na = norm ? norm->a : NULL; m.nw = norm ? norm->w : NULL;
  m.off = norm ? norm->off : 0.f; m.eps = norm ? norm->eps : 0.f; m.hout = norm ? norm->hout : NULL;
  m.pw = norm ? norm->pw : NULL; m.poff = norm ? norm->poff : 0.f; m.peps = norm ? norm->peps : 0.f;
  m.dx = dnm ? dnm->xres : NULL;
  m.dw = dnm ? dnm->w : NULL;
  m.doff = dnm ? dnm->off : 0.f;
  m.dq8 = dnm ? (uint8_t *)dnm->xq : NULL;
  m.dxs = dnm ? (float2 *)((uint8_t *)dnm->xq + (size_t)g->cols) : NULL;
  m.dssp = dnm ? dnm->ssp : NULL;
  const uint4 *xq = (const uint4 *)xqv;
  const float2 *xs = xqv ? (const float2 *)((const uint8_t *)xqv + (size_t)g->cols) : NULL;
  const int mode = norm && norm->pw ? 2 : norm ? 1 : 0;
  switch (shape) {
  case 414: mlp_go<4, 14>(cx, grid, m, xq, xs, mode); break;
  case 412: mlp_go<4, 12>(cx, grid, m, xq, xs, mode); break;
  case 308: mlp_go<3, 8>(cx, grid, m, xq, xs, mode); break;
  case 310: mlp_go<3, 10>(cx, grid, m, xq, xs, mode); break;
  case 415: mlp_go<4, 15>(cx, grid, m, xq, xs, mode); break;
  default: mlp_go<2, 8>(cx, grid, m, xq, xs, mode); break;
  }
  cu_count(cx, dnm ? CU_K_MLP1_DNORM : CU_K_MLP1);
  return true;
}
