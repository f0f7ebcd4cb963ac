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
 * +-65504), as there. Blocks: 4 or 8 warps of 32 weight rows x 32 or 64 tokens; x, the weights and their
 * scales staged in shared memory by cp.async (3-4 stages of 128 values); k split over blocks until
 * there are about two blocks an SM, the partial sums added in a fixed order by a second kernel
 * (results do not depend on the schedule). */
#include "backend/cuda/cuda_qmma.cuh"
#include "backend/cuda/cuda_ldst.cuh"

#define QM_BN 64  /* tokens a block */
#define QM_BK 128 /* values of a row a stage */
#define QM_XS 160 /* halves per token of a staged x tile: 128 + 32 padding (conflict-free 16-byte reads) */

bool cu_qmma_ok(const cu_ctx *cx, const cu_weight *w, int n) {
  return cx->arch >= 80 && w->kind == CW_Q4 && w->bits == 4 && w->cols % QM_BK == 0 && n > 0 && n <= cx->t->qmma;
}

static __device__ __forceinline__ __half fh(float v) { return __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f)); }

/* x [n][K] f32 -> f16, each 8 values stored as x0 x4 x1 x5 x2 x6 x3 x7 */
__global__ void k_qmma_prep(const float4 *__restrict__ x, int64_t n8, uint4 *__restrict__ xp) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
    const float4 a = x[2 * i], b = x[2 * i + 1];
    __half2 p[4] = {__halves2half2(fh(a.x), fh(b.x)), __halves2half2(fh(a.y), fh(b.y)),
                    __halves2half2(fh(a.z), fh(b.z)), __halves2half2(fh(a.w), fh(b.w))};
    xp[i] = *(const uint4 *)p;
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
static __device__ __forceinline__ void qm_cp16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src));
}
static __device__ __forceinline__ void qm_cp8(void *dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src));
}
static __device__ __forceinline__ void qm_cp4(void *dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src));
}
static __device__ __forceinline__ void qm_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void qm_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
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
/* the 8 nibbles of w as f16x2 pairs (e, e + 4), each s q + b */
static __device__ __forceinline__ void qm_dq(uint32_t w, __half2 s, __half2 b, uint32_t o[4]) {
  const __half2 k1024 = __float2half2_rn(1024.f);
#pragma unroll
  for (int e = 0; e < 4; e++) {
    uint32_t v = ((w >> (4 * e)) & 0x000F000Fu) | 0x64006400u;
    __half2 h = __hfma2(__hsub2(*(__half2 *)&v, k1024), s, b);
    o[e] = *(uint32_t *)&h;
  }
}
#endif

/* shared memory of one pipeline stage: x (BN tokens x QM_XS halves), the block's rows' 64 bytes of
 * weights, and their (scale, bias) units (at most 4 a row: group size 32) */
template <int BN, int BM> struct qm_stage {
  __half x[BN * QM_XS];
  uint4 w[BM * 4];
  float2 sb[BM * 4];
};
/* pipeline stages (all but one in flight while one is computed): as many as leave room for two blocks
 * an SM (BM 128) or one (BM 256) */
template <int BN, int BM> struct qm_cfg { static constexpr int STG = BN == 64 || BM == 256 ? 3 : 4; };

/* BM weight rows a block: BM / 32 warps of 32 rows (BM threads) */
template <int SBK, int BN, int BM>
__global__ void __launch_bounds__(BM) k_qmma4(const uint32_t *__restrict__ wq, const void *__restrict__ sb, int M,
                                               int K, int gs, const __half *__restrict__ xp, int n, int per,
                                               float *__restrict__ ws, float *__restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int STG = qm_cfg<BN, BM>::STG;
  extern __shared__ __align__(16) unsigned char qm_smem[];
  qm_stage<BN, BM> *stg = (qm_stage<BN, BM> *)qm_smem;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.x * BM, tok0 = blockIdx.y * BN;
  const int64_t W4 = K / 32; /* 16-byte units a row */
  const int G = K / gs, nst = K / QM_BK, ngr = QM_BK / gs;
  const int kc0 = blockIdx.z * per, ns = min(per, nst - kc0);
  const uint4 z4 = make_uint4(0, 0, 0, 0);
  constexpr int SBB = SBK == SBK_F32 ? 8 : 4; /* bytes of a (scale, bias) unit */

  /* stage i (k-stage kc0 + i): x unit c (values 8c..8c+7, c = 4 q' + j) of a token at [token][4 j + q'],
   * so that a warp's reads of one j are 64 contiguous bytes a token; weights [row][unit]; the rows'
   * (scale, bias) units of the stage in order */
  auto issue = [&](int i) {
    qm_stage<BN, BM> &S = stg[i % STG];
    const int kc = kc0 + i;
    for (int u = threadIdx.x; u < BN * 16; u += BM) {
      const int t = u >> 4, c = u & 15;
      __half *dst = &S.x[t * QM_XS + ((c & 3) * 4 + (c >> 2)) * 8];
      if (tok0 + t < n) qm_cp16(dst, xp + (int64_t)(tok0 + t) * K + (int64_t)kc * QM_BK + c * 8);
      else *(uint4 *)dst = z4;
    }
    for (int u = threadIdx.x; u < BM * 4; u += BM) {
      const int r = u >> 2, c = u & 3;
      if (row0 + r < M) qm_cp16(&S.w[u], (const uint4 *)wq + (int64_t)(row0 + r) * W4 + kc * 4 + c);
      else S.w[u] = z4;
    }
    for (int u = threadIdx.x; u < BM * ngr; u += BM) {
      const int r = u / ngr, c = u % ngr;
      const char *src = (const char *)sb + ((int64_t)(row0 + r) * G + (int64_t)kc * ngr + c) * SBB;
      if (row0 + r < M) {
        if (SBB == 8) qm_cp8(&S.sb[r * 4 + c], src);
        else qm_cp4(&S.sb[r * 4 + c], src);
      }
    }
  };

  /* the warp's 32 rows: m16 tile m holds rows warp * 32 + 16 m + g and + 8 */
  float acc[2][BN / 8][4];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int t = 0; t < BN / 8; t++) acc[m][t][0] = acc[m][t][1] = acc[m][t][2] = acc[m][t][3] = 0.f;
#pragma unroll
  for (int i = 0; i < STG - 1; i++) {
    if (i < ns) issue(i);
    qm_commit();
  }
  const int gi = 32 * q / gs; /* the thread's group in a stage */
  for (int i = 0; i < ns; i++) {
    qm_wait<STG - 2>();
    __syncthreads();
    if (i + STG - 1 < ns) issue(i + STG - 1);
    qm_commit();
    const qm_stage<BN, BM> &S = stg[i % STG];
    uint4 wv[4];
    __half2 sc[4], bi[4];
#pragma unroll
    for (int r = 0; r < 4; r++) { /* rows g, g + 8, g + 16, g + 24 of the warp */
      const int lr = warp * 32 + 8 * r + g;
      wv[r] = S.w[lr * 4 + q];
      const float2 p = qm_sb<SBK>(&S.sb[lr * 4 + gi]);
      sc[r] = __float2half2_rn(p.x);
      bi[r] = __float2half2_rn(p.y);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
      uint32_t a[4][4];
#pragma unroll
      for (int r = 0; r < 4; r++) qm_dq((&wv[r].x)[j], sc[r], bi[r], a[r]);
#pragma unroll
      for (int t = 0; t < BN / 8; t++) {
        const uint4 xv = *(const uint4 *)&S.x[(t * 8 + g) * QM_XS + (j * 4 + q) * 8];
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

template <int SBK, int BN, int BM>
static void qmma_launch(const cu_ctx *cx, const cu_weight *w, const __half *x16, int n, int S, int per, float *ws,
                        float *y) {
  const size_t smem = sizeof(qm_stage<BN, BM>) * qm_cfg<BN, BM>::STG;
  static bool attr; /* one attribute per instance */
  if (!attr) {
    cudaFuncSetAttribute(k_qmma4<SBK, BN, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    attr = true;
  }
  const dim3 grid((unsigned)((w->rows + BM - 1) / BM), (unsigned)((n + BN - 1) / BN), (unsigned)S);
  k_qmma4<SBK, BN, BM><<<grid, BM, smem, cx->s>>>((const uint32_t *)w->q, w->sb, (int)w->rows, (int)w->cols, w->gs,
                                                  x16, n, per, ws, y);
}
template <int SBK>
static void qmma_pick(const cu_ctx *cx, const cu_weight *w, const __half *x16, int n, int BN, int BM, int S, int per,
                      float *ws, float *y) {
  if (BM == 256) {
    if (BN == 32) qmma_launch<SBK, 32, 256>(cx, w, x16, n, S, per, ws, y);
    else qmma_launch<SBK, 64, 256>(cx, w, x16, n, S, per, ws, y);
  } else {
    if (BN == 32) qmma_launch<SBK, 32, 128>(cx, w, x16, n, S, per, ws, y);
    else qmma_launch<SBK, 64, 128>(cx, w, x16, n, S, per, ws, y);
  }
}

/* y = the sum of the S partial products in ws, in order (the same result for any schedule) */
__global__ void k_qmma_reduce(const float4 *__restrict__ ws, int S, int64_t n4, float4 *__restrict__ y) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
    float4 a = ws[i];
    for (int s = 1; s < S; s++) {
      const float4 b = ws[(int64_t)s * n4 + i];
      a.x += b.x;
      a.y += b.y;
      a.z += b.z;
      a.w += b.w;
    }
    y[i] = a;
  }
}

void cu_qmma(const cu_ctx *cx, const cu_weight *w, const float *x, int n, float *y, void *x16, void *ws,
             size_t ws_bytes) {
  const int64_t n8 = (int64_t)n * w->cols / 8;
  int64_t pb = (n8 + 255) / 256;
  if (pb > 4096) pb = 4096;
  k_qmma_prep<<<(unsigned)pb, 256, 0, cx->s>>>((const float4 *)x, n8, (uint4 *)x16);
  /* split k (at most 8 slices of at least 2 stages) until there are about two blocks an SM, as the
   * workspace allows */
  /* 256-row blocks halve the reads of x (every block reads all of it) where there are rows enough */
  const int BM = cx->t->qmma_bm ? cx->t->qmma_bm : w->rows >= 4096 || n >= 128 ? 256 : 128;
  const int BN = n <= 32 ? 32 : 64, nst = (int)(w->cols / QM_BK);
  const int64_t tiles = ((w->rows + BM - 1) / BM) * ((n + BN - 1) / BN);
  const size_t part = (size_t)n * (size_t)w->rows * 4;
  int S = (int)((2 * cx->n_sm + tiles - 1) / tiles);
  if (S > nst / 2) S = nst / 2;
  if (S > 8) S = 8;
  if (S > 1 && (size_t)S * part > ws_bytes) S = (int)(ws_bytes / part);
  if (S < 1 || (n * w->rows) % 4) S = 1;
  const int per = (nst + S - 1) / S;
  S = (nst + per - 1) / per;
  float *wsf = (float *)ws;
  const __half *xh = (const __half *)x16;
  if (w->sbk == SBK_F32) qmma_pick<SBK_F32>(cx, w, xh, n, BN, BM, S, per, wsf, y);
  else if (w->sbk == SBK_F16) qmma_pick<SBK_F16>(cx, w, xh, n, BN, BM, S, per, wsf, y);
  else qmma_pick<SBK_BF16>(cx, w, xh, n, BN, BM, S, per, wsf, y);
  if (S > 1) {
    const int64_t n4 = (int64_t)n * w->rows / 4;
    int64_t rb = (n4 + 255) / 256;
    if (rb > 4096) rb = 4096;
    k_qmma_reduce<<<(unsigned)rb, 256, 0, cx->s>>>((const float4 *)ws, S, n4, (float4 *)y);
  }
}
