/* Batched products of 4-bit weights on tensor cores (CW_Q4, steps of more tokens than the dp4a
 * matvecs take, up to the tuning value qmma): the packed weights are read once per block of 64
 * tokens and dequantized in registers straight into mma.sync m16n8k16 operand fragments (f16
 * operands, f32 accumulators), the mixed-input approach of Marlin. Hand-written because cuBLAS has
 * no 4-bit affine operand: the path it replaces wrote every weight out as f16 on every step.
 *
 * The reduction order of a k16 step is free, so each thread's operands are chosen to need no
 * shuffles: in a 128-value stage of a weight row, thread q (lane % 4) loads the 16 bytes of words
 * 4q..4q+3 (values 32q..32q+31) and pairs nibbles e and e+4 of a word into one f16x2 register (the
 * 0x6400 exponent trick: half(0x6400 | v) = 1024 + v, exact). x is converted to f16 beforehand
 * (k_qmma_prep) with each 8 values stored as x0 x4 x1 x5 x2 x6 x3 x7, so that the matching B
 * fragments are plain 32-bit halves of one 16-byte shared-memory read. A weight is s q + b rounded
 * once to f16 (hfma2), as the dequantize + cuBLAS path rounds it; x is rounded to f16 (clamped to
 * +-65504), as there. Blocks: 4 or 8 warps of 32 weight rows x 32 or 64 tokens; x, the weights and
 * their scales staged in shared memory by cp.async (3-4 stages of 128 values); k split into as many
 * slices as give the fewest rounds of blocks an SM (cu_qmma_multi), whose partial sums a second
 * kernel adds in a fixed order (results do not depend on the schedule).
 *
 * One launch takes up to three weights of the same x (q/k/v, gate/up: the "gemm group" fusion), and
 * the conversion of x can compute a gated MLP's silu(gate) * up (or gelu) on the way ("silu+gemm").
 * The three kernels use programmatic dependent launch: the matmul requests its first weight stages
 * before it waits for the conversion, and each lets the next one launch early. At 64 tokens a step
 * these kernels are bound by latency more than by bandwidth (docs/cuda.md), so fewer and overlapped
 * launches are what pays there. A thread-block-cluster sum of the split-k slices through distributed
 * shared memory, instead of the second kernel, measured slower on the H200 and is not used. */
#include "backend/cuda/cuda_qmma.cuh"
#include <string.h>
#include "backend/cuda/cuda_ldst.cuh"
#include "backend/cuda/cuda_q4pair.cuh"
#include "backend/cuda/cuda_qmma_dev.cuh"

#define QM_FILL 2 /* stages of time a round of blocks spends filling its pipeline (the split-k choice) */

bool cu_qmma_ok(const cu_ctx *cx, const cu_weight *w, int n) {
  return cx->arch >= 80 && w->kind == CW_Q4 && w->bits == 4 && w->cols % QM_BK == 0 && n > 0 && n <= cx->t->qmma;
}

/* x [n][K] f32 -> f16, each 8 values stored as x0 x4 x1 x5 x2 x6 x3 x7; with xu: x is act(x) * xu first
 * (qm_act) */
__global__ void k_qmma_prep(const float4 *x, const float4 *xu, int act, int64_t n8, uint4 *xp) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
    const float4 a = qm_act(__ldcg(x + 2 * i), xu, 2 * i, act), b = qm_act(__ldcg(x + 2 * i + 1), xu, 2 * i + 1, act);
    __half2 p[4] = {__halves2half2(qm_h(a.x), qm_h(b.x)), __halves2half2(qm_h(a.y), qm_h(b.y)),
                    __halves2half2(qm_h(a.z), qm_h(b.z)), __halves2half2(qm_h(a.w), qm_h(b.w))};
    xp[i] = *(const uint4 *)p;
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
/* a staged (scale, bias) unit as floats */
template <int SBK> static __device__ __forceinline__ float2 qm_sb(const float2 *p) {
  if (SBK == SBK_F32) return *p;
  return sb16_decode(*(const uint32_t *)p, SBK == SBK_BF16);
}
static __device__ __forceinline__ void qm_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                              uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* i, or i % n past n (the rows and tokens past the end of a tile) */
static __device__ __forceinline__ int qm_wrap(int i, int n) { return i < n ? i : i % n; }
#endif

/* shared memory of one pipeline stage: x (BN tokens x 128 halves; the 16-byte slot s of token t at
 * s ^ 4 (t & 1), so that the warps' 16-byte reads and copies meet no bank conflicts without padding),
 * the block's rows' 64 bytes of weights, and their (scale, bias) units (at most 4 a row: group size
 * 32; 8 bytes for f32 scales, else 4) */
template <int SBK, int BN, int BM> struct qm_stage {
  __half x[BN * QM_BK];
  uint4 w[BM * 4];
  uint32_t sb[BM * 4 * (SBK == SBK_F32 ? 2 : 1)];
};
/* pipeline stages (all but one in flight while one is computed): 3 for 64-token tiles, 4 for 32 (the
 * shared memory of two blocks fits an SM either way with 16-bit scales); MB, the blocks an SM the
 * registers are capped for: 1 for 64 tokens x 256 rows (the cap of two, 128 registers, spills and
 * measured slower), so that instance runs one block an SM */
template <int BN, int BM> struct qm_cfg {
  static constexpr int STG = BN == 64 ? 3 : 4;
  static constexpr int MB = BN == 64 && BM == 256 ? 1 : 2;
};

/* BM weight rows a block: BM / 32 warps of 32 rows (BM threads) */
template <int SBK, int BN, int BM>
__global__ void __launch_bounds__(BM, (qm_cfg<BN, BM>::MB)) k_qmma4(const qm_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int STG = qm_cfg<BN, BM>::STG;
  constexpr int SBW = SBK == SBK_F32 ? 2 : 1; /* words of a (scale, bias) unit */
  constexpr int SBB = 4 * SBW; /* SBK_MX: a unit is a stage's 4 scale codes of a row */
  constexpr int XU = BN * 16 / BM; /* x copies a thread a stage */
  extern __shared__ __align__(16) unsigned char qm_smem[];
  qm_stage<SBK, BN, BM> *stg = (qm_stage<SBK, BN, BM> *)qm_smem;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int wi = (a.nw > 1 && (int)blockIdx.x >= a.b0[1]) + (a.nw > 2 && (int)blockIdx.x >= a.b0[2]);
  const uint32_t *wq0 = wi == 0 ? a.wq[0] : wi == 1 ? a.wq[1] : a.wq[2];
  const char *sb0 = (const char *)(wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2]);
  float *y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  float *ws = wi == 0 ? a.ws[0] : wi == 1 ? a.ws[1] : a.ws[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int K = a.K, gs = a.gs, per = a.per;
  const int row0 = ((int)blockIdx.x - (wi == 0 ? 0 : wi == 1 ? a.b0[1] : a.b0[2])) * BM;
  int n = a.n, tok0 = blockIdx.y * BN;
  const __half *xp = a.xp;
  if (a.tiles) { /* grouped experts: the tile's expert, its rows of x and y (tokens from 0 in the tile) */
    const int4 tl = a.tiles[blockIdx.y];
    wq0 += (int64_t)tl.x * M * (K / 8);
    sb0 += (int64_t)tl.x * M * (SBK == SBK_MX ? K / 32 : K / gs * SBB);
    xp += (int64_t)tl.y * K;
    y += (int64_t)tl.y * M;
    n = tl.z;
    tok0 = 0;
  }
  const uint32_t *__restrict__ wq = wq0;
  const char *__restrict__ sb = sb0;
  const int64_t W4 = K / 32; /* 16-byte units a row */
  /* units a row, and log2 of the units a stage (SBK_MX: one unit a stage, its group codes) */
  const int G = SBK == SBK_MX ? K / QM_BK : K / gs, nst = (K + QM_BK - 1) / QM_BK,
            lg = SBK == SBK_MX ? 0 : gs == 32 ? 2 : gs == 64 ? 1 : 0;
  /* K % 128 == 64 (grouped experts only): the last stage holds 64 values; its copies of the second 64
   * (thread q >= 2's weights, scales and x) read the first 64 again, and those threads' scales are 0 */
  const int lasth = K % QM_BK ? nst - 1 : -1;
  const int kc0 = blockIdx.z * per, ns = min(per, nst - kc0);

  /* The thread's copies of a stage: weight units tid + j BM (row tid / 4 + j BM / 4, unit tid % 4);
   * (scale, bias) units tid + j BM of the stage's [row][group] block, j < 2^lg; x slots tid + j BM
   * (token tid / 16 + j BM / 16, slot tid % 16, which holds values 8c..8c+7 with c = 4 (slot % 4) +
   * slot / 4: thread q' reads units 4 q' + j of a token as slots 4 j + q', 64 contiguous bytes).
   * Their sources are 32-bit offsets from bases that move a stage at a time, and rows past M and
   * tokens past n copy row r % M and token t % n instead (a row of the product depends only on its
   * own weight row, a token only on its own x, and those outputs are never stored): no predicates
   * and no 64-bit address arithmetic a copy. Wrapping, not clamping: 15 tokens of a 32-token tile
   * all reading the last token's row made every block of a 17-token step hit one L2 line (1.5 times
   * slower on the H200). */
  const uint4 *__restrict__ wb = (const uint4 *)wq + (int64_t)kc0 * 4;
  const char *__restrict__ sbb = sb + ((int64_t)kc0 << lg) * SBB;
  const __half *__restrict__ xb = xp + (int64_t)kc0 * QM_BK;
  uint32_t wo[4], so[4], xo[XU];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    wo[j] = (uint32_t)(qm_wrap(row0 + (tid >> 2) + j * (BM / 4), M) * W4 + (tid & 3));
    so[j] = (uint32_t)((qm_wrap(row0 + (tid >> lg) + j * (BM >> lg), M) * G + (tid & ((1 << lg) - 1))) * SBB);
  }
  const int xs = tid & 15, xt = tid >> 4;
#pragma unroll
  for (int j = 0; j < XU; j++)
    xo[j] = (uint32_t)(qm_wrap(tok0 + xt + j * (BM / 16), n) * K + ((xs & 3) * 4 + (xs >> 2)) * 8);
  /* shared-window addresses of the thread's first copies in stage 0 (the j-th is a constant further) */
  const uint32_t sm0 = (uint32_t)__cvta_generic_to_shared(qm_smem);
  typedef qm_stage<SBK, BN, BM> stage_t;
  constexpr uint32_t SZ = sizeof(stage_t);
  const uint32_t sw = sm0 + (uint32_t)offsetof(stage_t, w) + tid * 16,
                 ss = sm0 + (uint32_t)offsetof(stage_t, sb) +
                      ((tid >> lg) * 4 + (tid & ((1 << lg) - 1))) * SBB,
                 sx = sm0 + (xt * QM_BK + (xs ^ ((xt & 1) << 2)) * 8) * 2; /* BM / 16 is even: one parity */
  const int ssj = (BM >> lg) * 4 * SBB;                                   /* (scale, bias) copies apart */

  /* stage i of the block into buffer st */
  auto issue_w = [&](int i, uint32_t st) {
    const bool h = i + kc0 == lasth;
    const uint4 *w = wb + i * 4 - (h && (tid & 3) >= 2 ? 2 : 0);
#pragma unroll
    for (int j = 0; j < 4; j++) qm_cp16(sw + st * SZ + j * BM * 16, w + wo[j]);
    if constexpr (SBK != SBK_MX) {
      const char *src = sbb + ((i << lg) * SBB) -
                        (h && (tid & ((1 << lg) - 1)) >= (1 << lg) / 2 ? ((1 << lg) / 2) * SBB : 0);
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (j < (1 << lg)) {
          if (SBW == 2) qm_cp8(ss + st * SZ + j * ssj, src + so[j]);
          else qm_cp4(ss + st * SZ + j * ssj, src + so[j]);
        }
    }
  };
  auto issue_x = [&](int i, uint32_t st) {
    /* the slot's values start at 8 (4 (xs % 4) + xs / 4): xs % 4 >= 2 is the second 64 */
    const __half *x = xb + i * QM_BK - (i + kc0 == lasth && (xs & 3) >= 2 ? 64 : 0);
#pragma unroll
    for (int j = 0; j < XU; j++) qm_cp16(sx + st * SZ + j * (BM / 16) * QM_BK * 2, x + xo[j]);
  };
  /* SBK_MX: the block's rows' scale codes (K / 32 a row) in shared memory after the stages, copied once
   * (a row's codes need not be 4-byte aligned, as cp.async wants) */
  const unsigned char *mxt = qm_smem + STG * sizeof(stage_t);
  if constexpr (SBK == SBK_MX) {
    const int KS = K / 32;
    for (int idx = tid; idx < BM * KS; idx += BM) {
      const int lr = idx / KS, c = idx - lr * KS;
      qm_smem[STG * sizeof(stage_t) + idx] = (unsigned char)sb[(int64_t)qm_wrap(row0 + lr, M) * KS + c];
    }
  }

  /* the warp's 32 rows: m16 tile m holds rows warp * 32 + 16 m + g and + 8 */
  float acc[2][BN / 8][4];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int t = 0; t < BN / 8; t++) acc[m][t][0] = acc[m][t][1] = acc[m][t][2] = acc[m][t][3] = 0.f;
  qm_prologue<STG - 1>(ns, issue_w, issue_x);
  const int gi = 32 * q / gs; /* the thread's group in a stage */
  uint32_t rd = 0, wr = STG - 1; /* the buffers read and written */
  for (int i = 0; i < ns; i++) {
    qm_wait<STG - 2>();
    __syncthreads();
    if (i + STG - 1 < ns) {
      issue_w(i + STG - 1, wr);
      issue_x(i + STG - 1, wr);
    }
    qm_commit();
    wr = wr == STG - 1 ? 0 : wr + 1;
    const qm_stage<SBK, BN, BM> &S = stg[rd];
    rd = rd == STG - 1 ? 0 : rd + 1;
    const bool zq = i + kc0 == lasth && q >= 2; /* the half stage's values past 64: weights 0 */
    uint4 wv[4];
    __half2 sc[4], bi[4];
#pragma unroll
    for (int r = 0; r < 4; r++) { /* rows g, g + 8, g + 16, g + 24 of the warp */
      const int lr = warp * 32 + 8 * r + g;
      wv[r] = S.w[lr * 4 + q];
      if constexpr (SBK == SBK_MX) { /* E8M0 code c: 2^(c - 127), times the 2^14 qm_dq_fp4 leaves out */
        const uint32_t c = zq ? 0u : mxt[lr * (K / 32) + 4 * (i + kc0) + q]; /* (past the row's codes) */
        sc[r] = __float2half2_rn(zq ? 0.f : __uint_as_float((c + 14u) << 23));
        bi[r] = sc[r];
      } else {
        const float2 p = qm_sb<SBK>((const float2 *)&S.sb[(lr * 4 + gi) * SBW]);
        sc[r] = __float2half2_rn(zq ? 0.f : p.x);
        bi[r] = __float2half2_rn(zq ? 0.f : p.y);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
      uint32_t a[4][4];
#pragma unroll
      for (int r = 0; r < 4; r++) {
        if constexpr (SBK == SBK_MX) qm_dq_fp4((&wv[r].x)[j], sc[r], a[r]);
        else qm_dq((&wv[r].x)[j], sc[r], bi[r], a[r]);
      }
#pragma unroll
      for (int t = 0; t < BN / 8; t++) {
        const uint4 xv = *(const uint4 *)&S.x[(t * 8 + g) * QM_BK + ((j * 4 + q) ^ ((g & 1) << 2)) * 8];
#pragma unroll
        for (int m = 0; m < 2; m++) {
          qm_mma(acc[m][t], a[2 * m][0], a[2 * m + 1][0], a[2 * m][1], a[2 * m + 1][1], xv.x, xv.y);
          qm_mma(acc[m][t], a[2 * m][2], a[2 * m + 1][2], a[2 * m][3], a[2 * m + 1][3], xv.z, xv.w);
        }
      }
    }
  }
  /* one k slice (gridDim.z == 1): straight to y; else partial sums to ws[blockIdx.z] (k_qmma_reduce) */
  float *dst = gridDim.z > 1 ? ws + (int64_t)blockIdx.z * n * M : y;
#pragma unroll
  for (int m = 0; m < 2; m++) {
    const int ra = row0 + warp * 32 + 16 * m + g, rb = ra + 8;
#pragma unroll
    for (int t = 0; t < BN / 8; t++) {
      const int tk = tok0 + t * 8 + 2 * q;
      if (ra < M) {
        if (tk < n) dst[(int64_t)tk * M + ra] = acc[m][t][0];
        if (tk + 1 < n) dst[(int64_t)(tk + 1) * M + ra] = acc[m][t][1];
      }
      if (rb < M) {
        if (tk < n) dst[(int64_t)tk * M + rb] = acc[m][t][2];
        if (tk + 1 < n) dst[(int64_t)(tk + 1) * M + rb] = acc[m][t][3];
      }
    }
  }
#else
  __trap(); /* launched on sm_80+ only (cu_qmma_ok) */
#endif
}

/* one instance: its shared memory set up once, its blocks an SM, its launch */
template <int SBK, int BN, int BM> struct qm_kern {
  /* the stages, and for SBK_MX the scale codes of K values a row (at most QM_MX_KMAX) */
  static size_t smem(int K = 0) {
    return sizeof(qm_stage<SBK, BN, BM>) * qm_cfg<BN, BM>::STG + (SBK == SBK_MX ? (size_t)BM * (K / 32) : 0);
  }
  static int occ() {
    static int o; /* blocks an SM, once per instance */
    if (!o) {
      cudaFuncSetAttribute(k_qmma4<SBK, BN, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           (int)smem(SBK == SBK_MX ? QM_MX_KMAX : 0));
      cudaFuncSetAttribute(k_qmma4<SBK, BN, BM>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
      int v = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k_qmma4<SBK, BN, BM>, BM, smem()) != cudaSuccess) v = 1;
      o = v < 1 ? 1 : v;
    }
    return o;
  }
  static void launch(const cu_ctx *cx, const qm_args &a, int blocks, int S) {
    occ();
    const unsigned ny = a.tiles ? (unsigned)a.ntiles : (unsigned)((a.n + BN - 1) / BN);
    cu_launch(cx, k_qmma4<SBK, BN, BM>, dim3((unsigned)blocks, ny, (unsigned)S),
              dim3(BM), smem(a.K), a);
  }
};
/* S 0: the instance's blocks an SM; else its launch with S k slices */
template <int SBK> static int qm_pick(const cu_ctx *cx, const qm_args &a, int blocks, int BN, int BM, int S) {
#define QM_DO(bn, bm)                                                                                          \
  do {                                                                                                         \
    if (!S) return qm_kern<SBK, bn, bm>::occ();                                                                \
    qm_kern<SBK, bn, bm>::launch(cx, a, blocks, S);                                                            \
    return 0;                                                                                                  \
  } while (0)
  if (BM == 256) {
    if (BN == 32) QM_DO(32, 256);
    QM_DO(64, 256);
  }
  if (BN == 32) QM_DO(32, 128);
  QM_DO(64, 128);
#undef QM_DO
}
static int qm_dispatch(const cu_ctx *cx, int sbk, const qm_args &a, int blocks, int BN, int BM, int S) {
  if (sbk == SBK_MX) return qm_pick<SBK_MX>(cx, a, blocks, BN, BM, S);
  if (sbk == SBK_F32) return qm_pick<SBK_F32>(cx, a, blocks, BN, BM, S);
  if (sbk == SBK_F16) return qm_pick<SBK_F16>(cx, a, blocks, BN, BM, S);
  return qm_pick<SBK_BF16>(cx, a, blocks, BN, BM, S);
}

/* y[i] = the sum of the S partial products in ws[i], in order (the same result for any schedule); the
 * weights' outputs one after another along the grid */
__global__ void k_qmma_reduce(const qm_args a, int S, int64_t tot4) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < tot4; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = i;
    int w = 0;
    while (w + 1 < a.nw && j >= (int64_t)a.n * a.M[w] / 4) j -= (int64_t)a.n * a.M[w++] / 4;
    const int64_t n4 = (int64_t)a.n * a.M[w] / 4;
    const float4 *p = (const float4 *)a.ws[w];
    float4 s = __ldcg(p + j);
    for (int k = 1; k < S; k++) {
      const float4 b = __ldcg(p + (int64_t)k * n4 + j);
      s.x += b.x;
      s.y += b.y;
      s.z += b.z;
      s.w += b.w;
    }
    ((float4 *)a.y[w])[j] = s;
  }
}

bool cu_qmma_group_ok(const cu_ctx *cx, const cu_weight *const *ws, int nw, int n) {
  if (nw < 1 || nw > QM_MAXW) return false;
  for (int i = 0; i < nw; i++)
    if (!cu_qmma_ok(cx, ws[i], n) || ws[i]->cols != ws[0]->cols || ws[i]->gs != ws[0]->gs || ws[i]->sbk != ws[0]->sbk)
      return false;
  return true;
}

void cu_qmma_multi(const cu_ctx *cx, const cu_weight *const *w, float *const *y, int nw, const float *x, int n,
                   void *x16, void *ws, size_t ws_bytes, const float *xu, int act, bool x_ready) {
  const int64_t K = w[0]->cols;
  int64_t rows = 0;
  bool even = true; /* every weight's n * rows a multiple of 4 (float4 partial sums) */
  for (int i = 0; i < nw; i++) {
    rows += w[i]->rows;
    even = even && (n * w[i]->rows) % 4 == 0;
  }
  /* 256-row blocks halve the reads of x (every block reads all of it) where there are rows enough; the
   * wgmma kernel takes 128 tokens in blocks of 128 rows */
  const bool wg = cu_qwg_ok(cx);
  const int BN = wg ? cu_qwg_bn(n) : n <= 32 ? 32 : 64, nst = (int)(K / QM_BK);
  const int BM = BN == 128 ? 128 : cx->t->qmma_bm ? cx->t->qmma_bm : rows >= 4096 || n >= 128 ? 256 : 128;
  if (wg) {
    if (!x_ready) cu_qwg_prep(cx, x, xu, act, n, K, BN, x16);
  } else {
    const int64_t n8 = (int64_t)n * K / 8;
    int64_t pb = (n8 + 255) / 256;
    if (pb > 4096) pb = 4096;
    cu_launch(cx, k_qmma_prep, dim3((unsigned)pb), dim3(256), 0, (const float4 *)x, (const float4 *)xu, act, n8,
              (uint4 *)x16);
  }
  qm_args a;
  memset(&a, 0, sizeof a);
  int blocks = 0;
  for (int i = 0; i < nw; i++) {
    a.wq[i] = (const uint32_t *)w[i]->q;
    a.sb[i] = w[i]->sb;
    a.y[i] = y[i];
    a.M[i] = (int)w[i]->rows;
    a.b0[i] = blocks;
    blocks += (int)((w[i]->rows + BM - 1) / BM);
  }
  a.nw = nw;
  a.K = (int)K;
  a.gs = w[0]->gs;
  a.n = n;
  a.xp = (const __half *)x16;
  /* split k into S slices of per stages: the fewest rounds of blocks an SM, with a pipeline fill a
   * round of resident blocks (QM_FILL stages), at most 8 slices of at least 2 stages, as the
   * workspace allows; ties go to fewer slices (less partial-sum traffic) */
  const int64_t tiles = (int64_t)blocks * ((n + BN - 1) / BN);
  const size_t part = (size_t)n * (size_t)rows * 4;
  const int64_t slots =
    (int64_t)(wg ? cu_qwg_launch(cx, w[0]->sbk, a, blocks, BN, BM, 0) : qm_dispatch(cx, w[0]->sbk, a, blocks, BN, BM, 0)) *
    cx->n_sm;
  int S = 1;
  if (cx->t->qmma_split) S = cx->t->qmma_split;
  else {
    double best = 0;
    for (int s = 1; s <= 8 && (s == 1 || 2 * s <= nst); s++) {
      if (s > 1 && (size_t)s * part > ws_bytes) break;
      const int p = (nst + s - 1) / s;
      const int64_t b = tiles * ((nst + p - 1) / p);
      const double c = (double)((b + cx->n_sm - 1) / cx->n_sm) * p + QM_FILL * (double)((b + slots - 1) / slots);
      if (s == 1 || c < best) {
        best = c;
        S = s;
      }
    }
  }
  if (S > nst) S = nst;
  if ((size_t)S * part > ws_bytes) S = (int)(ws_bytes / part);
  if (S < 1 || !even) S = 1;
  a.per = (nst + S - 1) / S;
  S = (nst + a.per - 1) / a.per;
  size_t off = 0;
  for (int i = 0; i < nw; i++) {
    a.ws[i] = (float *)ws + off;
    off += (size_t)S * n * w[i]->rows;
  }
  if (wg) cu_qwg_launch(cx, w[0]->sbk, a, blocks, BN, BM, S);
  else qm_dispatch(cx, w[0]->sbk, a, blocks, BN, BM, S);
  if (S > 1) {
    const int64_t tot4 = (int64_t)n * rows / 4;
    int64_t rb = (tot4 + 255) / 256;
    if (rb > 4096) rb = 4096;
    cu_launch(cx, k_qmma_reduce, dim3((unsigned)rb), dim3(256), 0, a, S, tot4);
  }
}

void cu_qmma(const cu_ctx *cx, const cu_weight *w, const float *x, int n, float *y, void *x16, void *ws,
             size_t ws_bytes) {
  cu_qmma_multi(cx, &w, &y, 1, x, n, x16, ws, ws_bytes);
}

bool cu_qmma_experts_ok(const cu_ctx *cx, const cu_weight *w) {
  const bool q4 = w->kind == CW_Q4 && w->bits == 4,
             fp4 = w->kind == CW_MXQ && w->qmode == SM_QMODE_MXFP4 && w->gs == 32 && w->mx_f16 && w->cols <= QM_MX_KMAX;
  return cx->t->moe_qmma && cx->arch >= 80 && (q4 || fp4) && w->cols % (QM_BK / 2) == 0;
}

/* One launch for all the experts of a sorted batch (in place of a GEMM per expert): the mma.sync kernel
 * with a tile list, each block row of the grid one expert's tile of BN rows of x (32 where the experts
 * average 40 rows or fewer, else 64) and each block 128 of its weight rows; one k slice. mxfp4 experts
 * (SBK_MX) are decoded as 4-bit ones are: an E2M1 code is an f16 (its sign, exponent and mantissa bits
 * in place: the value times 2^-14, exact), times the E8M0 scale times 2^14 as an f16 (exact for scale
 * codes 89 to 128, which cu_weight.mx_f16 says every code of the weight is), so each weight is the f16
 * the dequantize + cuBLAS path rounds it to */
void cu_qmma_experts(const cu_ctx *cx, const cu_weight *w, int64_t rows, const float *xg, int n_in, const int *off,
                     int E, float *yg, void *x16, int4 *tiles_h, int4 *tiles_d) {
  const int64_t K = w->cols;
  int used = 0;
  for (int e = 0; e < E; e++) used += off[e + 1] > off[e];
  if (!used) return;
  const int BN = n_in / used <= 40 ? 32 : 64, BM = 128;
  int nt = 0;
  for (int e = 0; e < E; e++)
    for (int t0 = off[e]; t0 < off[e + 1]; t0 += BN)
      tiles_h[nt++] = make_int4(e, t0, off[e + 1] - t0 < BN ? off[e + 1] - t0 : BN, 0);
  cudaMemcpyAsync(tiles_d, tiles_h, sizeof(int4) * (size_t)nt, cudaMemcpyHostToDevice, cx->s);
  const int64_t n8 = (int64_t)n_in * K / 8;
  int64_t pb = (n8 + 255) / 256;
  if (pb > 4096) pb = 4096;
  cu_launch(cx, k_qmma_prep, dim3((unsigned)pb), dim3(256), 0, (const float4 *)xg, (const float4 *)NULL, 0, n8,
            (uint4 *)x16);
  qm_args a;
  memset(&a, 0, sizeof a);
  a.wq[0] = (const uint32_t *)w->q;
  a.sb[0] = w->sb;
  a.y[0] = yg;
  a.M[0] = (int)rows;
  a.nw = 1;
  a.K = (int)K;
  a.gs = w->gs;
  a.n = n_in;
  a.per = (int)((K + QM_BK - 1) / QM_BK);
  a.xp = (const __half *)x16;
  a.tiles = tiles_d;
  a.ntiles = nt;
  qm_dispatch(cx, w->kind == CW_MXQ ? SBK_MX : w->sbk, a, (int)((rows + BM - 1) / BM), BN, BM, 1);
}
