/* Batched products of 4-bit weights on Hopper's warpgroup MMAs (wgmma, sm_90a): the Hopper form of
 * cuda_qmma.cu's kernel, for the same steps (more tokens than the dp4a matvecs take, up to the tuning
 * value qmma). Hand-written for the reason cuda_qmma.cu gives: cuBLAS has no 4-bit affine operand.
 *
 * Why another kernel: at 64 tokens a step the mma.sync kernel is bound by latency (one block of 8 warps
 * an SM, the tensor pipe busy 30% of the time: docs/cuda.md), while wgmma's m64nNk16 is the instruction
 * that reaches Hopper's dense tensor peak, reads x by itself from shared memory (no shared-memory loads
 * into registers) and runs asynchronously, so one warpgroup's MMAs overlap the others' dequantization
 * (14336 x 4096 at 64 tokens: 30.3 against 40.7 us on the H200, docs/cuda.md).
 *
 * A block is NWG warpgroups (2 or 4) of 64 weight rows each and BN tokens (32, 64 or 128). Each warp
 * holds 16 rows as mma.sync's A fragment: thread (g = lane / 4, q = lane % 4) rows g and g + 8; in a
 * 128-value stage of a row it takes words 4q..4q+3 (values 32q..32q+31) and makes of word j the f16
 * pairs (nibble e, nibble e + 4) (qm_dq, shared with cuda_qmma.cu: s q + b rounded once). k16 step
 * u = 2j + h takes pairs e = 2h (A's k 2q, 2q+1) and 2h + 1 (k 2q+8, 2q+9), so logical k l of step u is
 * the value 32 (l % 8 / 2) + 8j + 2h + (l >= 8) + 4 (l % 2) of the stage. The conversion of x
 * (k_qwg_prep) writes x in that order, as no-swizzle K-major core matrices of 8 tokens x 8 logical k:
 * core (token group tg, k half c) of step u at byte (u (BN / 8) 2 + 2 tg + c) 128 of the stage, so a
 * stage of x is one contiguous copy and wgmma's descriptor has strides 128 (k) and 256 (tokens).
 *
 * Pipeline: 4 or 5 buffers of a stage's x, the rows' packed weights and their (scale, bias) units in
 * shared memory by cp.async, all threads copying, 2 or 3 stages requested ahead; the first stages'
 * weights are requested before the wait for the kernel before (programmatic dependent launch). Each
 * warpgroup dequantizes half a stage into A registers while its MMAs of the half before run, and the
 * warpgroups of the block (and of a second block where 2 fit an SM) take turns on the tensor cores. k is
 * split as cuda_qmma.cu splits it, and k_qmma_reduce adds the slices in a fixed order. */
#include "backend/cuda/cuda_qmma.cuh"
#include <string.h>
#include "backend/cuda/cuda_ldst.cuh"
#include "backend/cuda/cuda_q4pair.cuh"
#include "backend/cuda/cuda_qmma_dev.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QW_DEVICE 1 /* this pass of the compiler makes sm_90a code */
#endif

bool cu_qwg_ok(const cu_ctx *cx) {
#ifdef SMELT_CUDA_WGMMA
  return cx->arch == 90 && cx->t->qwg;
#else
  (void)cx;
  return false;
#endif
}

/* x [n][K] f32 -> f16 in tiles of BN tokens (tokens n.. of the last tile 0), each tile's stages one
 * after another, a stage in the order above. A thread takes token t's values 8j..8j+7 of the four
 * 32-value quarters of stage s (the pairs of word j) and writes the four 16-byte core rows they make. */
__global__ void k_qwg_prep(const float4 *x, const float4 *xu, int act, int n, int K, int BN, int64_t tot, uint4 *xp) {
  pdl_wait();
  pdl_trigger();
  const int nst = K / QM_BK, ntg = BN / 8;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < tot; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i;
    const int t8 = (int)(r % 8);
    r /= 8;
    const int j = (int)(r % 4);
    r /= 4;
    const int tg = (int)(r % ntg);
    r /= ntg;
    const int s = (int)(r % nst);
    const int64_t tile = r / nst;
    const int64_t t = tile * BN + tg * 8 + t8;
    float v[4][8];
    if (t < n) {
#pragma unroll
      for (int qq = 0; qq < 4; qq++) {
        const int64_t o = (t * K + (int64_t)s * QM_BK + 32 * qq + 8 * j) / 4;
        const float4 a = qm_act(__ldcg(x + o), xu, o, act), b = qm_act(__ldcg(x + o + 1), xu, o + 1, act);
        v[qq][0] = a.x, v[qq][1] = a.y, v[qq][2] = a.z, v[qq][3] = a.w;
        v[qq][4] = b.x, v[qq][5] = b.y, v[qq][6] = b.z, v[qq][7] = b.w;
      }
    } else {
#pragma unroll
      for (int qq = 0; qq < 4; qq++)
#pragma unroll
        for (int e = 0; e < 8; e++) v[qq][e] = 0.f;
    }
    qw_put(xp, tile, nst, BN, s, j, tg, t8, v);
  }
}

#ifdef QW_DEVICE
/* a no-swizzle shared-memory matrix descriptor: k-direction core stride 128 bytes, token-direction 256 */
static __device__ __forceinline__ uint64_t qw_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
}
static __device__ __forceinline__ void qw_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void qw_mcommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void qw_mwait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* d[16] += A (4 registers: rows of the warp, mma.sync's A fragment) . B (descriptor), m64n32k16 */
static __device__ __forceinline__ void qw_mma32(float *d, const uint32_t *a, uint64_t bd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(1)
               : "memory");
}
/* d[32] += A (4 registers: rows of the warp, mma.sync's A fragment) . B (descriptor), m64n64k16 */
static __device__ __forceinline__ void qw_mma64(float *d, const uint32_t *a, uint64_t bd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(1)
               : "memory");
}
/* d[64] += A (4 registers: rows of the warp, mma.sync's A fragment) . B (descriptor), m64n128k16 */
static __device__ __forceinline__ void qw_mma128(float *d, const uint32_t *a, uint64_t bd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(1)
               : "memory");
}
template <int BN> static __device__ __forceinline__ void qw_mma(float *d, const uint32_t *a, uint64_t bd) {
  if (BN == 32) qw_mma32(d, a, bd);
  else if (BN == 64) qw_mma64(d, a, bd);
  else qw_mma128(d, a, bd);
}
#endif

/* the stages a block pipelines, its shared memory */
template <int SBK, int BN, int NWG> struct qw_cfg {
  static constexpr int STG = BN == 128 || (BN == 64 && NWG == 2) ? 4 : 5; /* (2 blocks an SM for 64 x 128) */
  static constexpr int BM = NWG * 64, NT = NWG * 128;
  static constexpr int XB = BN * QM_BK * 2;                 /* x bytes a stage */
  static constexpr int WB = BM * 64;                        /* packed weight bytes a stage */
  static constexpr int SBB = SBK == SBK_F32 ? 8 : 4;        /* bytes of a (scale, bias) unit */
  static constexpr int SZ = XB + WB + BM * 4 * SBB;         /* a stage: x, weights, up to 4 units a row */
  static constexpr size_t SMEM = (size_t)SZ * STG;
};

template <int SBK, int BN, int NWG>
__global__ void __launch_bounds__(NWG * 128, (NWG == 2 && BN <= 64 ? 2 : 1)) k_qwg(const qm_args a) {
#ifdef QW_DEVICE
  typedef qw_cfg<SBK, BN, NWG> C;
  constexpr int STG = C::STG, BM = C::BM, NT = C::NT, SZ = C::SZ, SBB = C::SBB;
  extern __shared__ __align__(128) unsigned char qw_smem[];
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int wi = (a.nw > 1 && (int)blockIdx.x >= a.b0[1]) + (a.nw > 2 && (int)blockIdx.x >= a.b0[2]);
  const uint32_t *__restrict__ wq = wi == 0 ? a.wq[0] : wi == 1 ? a.wq[1] : a.wq[2];
  const char *__restrict__ sb = (const char *)(wi == 0 ? a.sb[0] : wi == 1 ? a.sb[1] : a.sb[2]);
  float *y = wi == 0 ? a.y[0] : wi == 1 ? a.y[1] : a.y[2];
  float *ws = wi == 0 ? a.ws[0] : wi == 1 ? a.ws[1] : a.ws[2];
  const int M = wi == 0 ? a.M[0] : wi == 1 ? a.M[1] : a.M[2];
  const int K = a.K, gs = a.gs, n = a.n, per = a.per;
  const int row0 = ((int)blockIdx.x - (wi == 0 ? 0 : wi == 1 ? a.b0[1] : a.b0[2])) * BM, tile = blockIdx.y;
  const int64_t W4 = K / 32; /* 16-byte units a row */
  const int G = K / gs, nst = K / QM_BK, lg = gs == 32 ? 2 : gs == 64 ? 1 : 0; /* log2 of the groups a stage */
  const int kc0 = blockIdx.z * per, ns = min(per, nst - kc0);
  const uint32_t sm0 = (uint32_t)__cvta_generic_to_shared(qw_smem);

  /* stage i into buffer b: weights (rows past M copy row r % M: those outputs are never stored), their
   * (scale, bias) units, then x. The thread's sources are fixed rows: their pointers are made once and
   * move a stage at a time (no row arithmetic a stage) */
  constexpr int NWC = BM * 4 / NT;             /* weight copies a thread a stage (2) */
  constexpr int NSC = (BM * 4 + NT - 1) / NT; /* most (scale, bias) copies a thread a stage (group 32: 2) */
  const int nsb = BM << lg;                   /* (scale, bias) units a stage */
  const uint4 *wsrc[NWC];
  uint32_t wdst[NWC];
#pragma unroll
  for (int j = 0; j < NWC; j++) {
    const int u = tid + j * NT, r = u >> 2;
    const int rr = row0 + r < M ? row0 + r : (row0 + r) % M;
    wsrc[j] = (const uint4 *)wq + rr * W4 + (int64_t)kc0 * 4 + (u & 3);
    wdst[j] = C::XB + u * 16;
  }
  const char *ssrc[NSC];
  uint32_t sdst[NSC];
#pragma unroll
  for (int j = 0; j < NSC; j++) {
    const int u = tid + j * NT, r = u >> lg, gi = u & ((1 << lg) - 1);
    const int rr = u >= nsb ? 0 : row0 + r < M ? row0 + r : (row0 + r) % M;
    ssrc[j] = sb + ((int64_t)rr * G + ((int64_t)kc0 << lg) + gi) * SBB;
    sdst[j] = C::XB + C::WB + (r * 4 + gi) * SBB;
  }
  auto issue_w = [&](int i, int b) {
    const uint32_t base = sm0 + b * SZ;
#pragma unroll
    for (int j = 0; j < NWC; j++) qm_cp16(base + wdst[j], wsrc[j] + i * 4);
#pragma unroll
    for (int j = 0; j < NSC; j++)
      if (tid + j * NT < nsb) {
        if (SBB == 8) qm_cp8(base + sdst[j], ssrc[j] + ((i << lg) << 3));
        else qm_cp4(base + sdst[j], ssrc[j] + ((i << lg) << 2));
      }
  };
  const __half *xsrc = a.xp + ((int64_t)tile * nst + kc0) * (BN * QM_BK);
  auto issue_x = [&](int i, int b) {
    const char *src = (const char *)(xsrc + (int64_t)i * (BN * QM_BK));
#pragma unroll
    for (int j = 0; j < C::XB / 16 / NT; j++) qm_cp16(sm0 + b * SZ + (tid + j * NT) * 16, src + (tid + j * NT) * 16);
  };

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
  qm_prologue<STG - 2>(ns, issue_w, issue_x);
  const int lr = wg * 64 + warp * 16 + g; /* the thread's rows lr and lr + 8 of the block */
  const int gi = 32 * q / gs;            /* its group in a stage */
  /* The MMAs of a stage go out in two groups of 4 k16 steps (words 0-1 and 2-3 of the thread's 4), each
   * from its own A registers: a half's fragments are made while the other half's MMAs run, and at most
   * one group is in flight past a wait. So at the barrier of stage i a warpgroup may still read stage
   * i - 1, and the buffer refilled there is stage i - 2's (STG - 2 stages in flight). */
  uint32_t A0[4][4], A1[4][4];
  for (int i = 0; i < ns; i++) {
    qm_wait<STG - 3>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async's writes, seen by wgmma */
    __syncthreads(); /* stage i is in; every warpgroup is done with stage i - 2: refill its buffer */
    if (i + STG - 2 < ns) {
      issue_w(i + STG - 2, (i + STG - 2) % STG);
      issue_x(i + STG - 2, (i + STG - 2) % STG);
    }
    qm_commit();
    const int b = i % STG;
    const unsigned char *S = qw_smem + b * SZ;
    const uint4 w0 = ((const uint4 *)(S + C::XB))[lr * 4 + q], w1 = ((const uint4 *)(S + C::XB))[(lr + 8) * 4 + q];
    const float *sbs = (const float *)(S + C::XB + C::WB);
    float2 p0, p1;
    if (SBK == SBK_F32) {
      p0 = *(const float2 *)(sbs + (lr * 4 + gi) * 2);
      p1 = *(const float2 *)(sbs + ((lr + 8) * 4 + gi) * 2);
    } else {
      p0 = sb16_decode(*(const uint32_t *)(sbs + lr * 4 + gi), SBK == SBK_BF16);
      p1 = sb16_decode(*(const uint32_t *)(sbs + (lr + 8) * 4 + gi), SBK == SBK_BF16);
    }
    const __half2 s0 = __float2half2_rn(p0.x), b0 = __float2half2_rn(p0.y), s1 = __float2half2_rn(p1.x),
                  b1 = __float2half2_rn(p1.y);
    const uint32_t xs = sm0 + b * SZ;
    /* the A fragments of k16 steps 2 j0 .. 2 j0 + 3 (the thread's words j0 and j0 + 1) */
    auto frag = [&](int j0, uint32_t(&A)[4][4]) {
#pragma unroll
      for (int j = 0; j < 2; j++) {
        uint32_t d0[4], d1[4];
        qm_dq((&w0.x)[j0 + j], s0, b0, d0);
        qm_dq((&w1.x)[j0 + j], s1, b1, d1);
#pragma unroll
        for (int h = 0; h < 2; h++) {
          A[2 * j + h][0] = d0[2 * h];
          A[2 * j + h][1] = d1[2 * h];
          A[2 * j + h][2] = d0[2 * h + 1];
          A[2 * j + h][3] = d1[2 * h + 1];
        }
      }
    };
    frag(0, A0); /* half 0: k16 steps 0-3 */
    qw_fence();
#pragma unroll
    for (int u = 0; u < 4; u++) qw_mma<BN>(acc, A0[u], qw_desc(xs + u * (BN / 8) * 256));
    qw_mcommit();
    qw_mwait<1>(); /* the previous stage's second half: A1 is free */
    frag(2, A1); /* half 1: k16 steps 4-7 */
    qw_fence();
#pragma unroll
    for (int u = 0; u < 4; u++) qw_mma<BN>(acc, A1[u], qw_desc(xs + (u + 4) * (BN / 8) * 256));
    qw_mcommit();
    qw_mwait<1>(); /* this stage's first half: A0 is free */
  }
  qw_mwait<0>();
  /* acc[4t + c]: row lr + 8 (c / 2), token 8t + 2q + c % 2 of the tile */
  float *dst = gridDim.z > 1 ? ws + (int64_t)blockIdx.z * n * M : y;
  const int ra = row0 + lr, rb = ra + 8;
#pragma unroll
  for (int t = 0; t < BN / 8; t++) {
    const int tk = tile * BN + t * 8 + 2 * q;
    if (ra < M) {
      if (tk < n) dst[(int64_t)tk * M + ra] = acc[4 * t];
      if (tk + 1 < n) dst[(int64_t)(tk + 1) * M + ra] = acc[4 * t + 1];
    }
    if (rb < M) {
      if (tk < n) dst[(int64_t)tk * M + rb] = acc[4 * t + 2];
      if (tk + 1 < n) dst[(int64_t)(tk + 1) * M + rb] = acc[4 * t + 3];
    }
  }
#else
  __trap(); /* launched on sm_90a code only (cu_qwg_ok) */
#endif
}

template <int SBK, int BN, int NWG> struct qw_kern {
  static int occ() {
    static int o; /* blocks an SM, once per instance */
    if (!o) {
      const size_t sm = qw_cfg<SBK, BN, NWG>::SMEM;
      cudaFuncSetAttribute(k_qwg<SBK, BN, NWG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
      cudaFuncSetAttribute(k_qwg<SBK, BN, NWG>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
      int v = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k_qwg<SBK, BN, NWG>, NWG * 128, sm) != cudaSuccess) v = 1;
      o = v < 1 ? 1 : v;
    }
    return o;
  }
  static int run(const cu_ctx *cx, const qm_args &a, int blocks, int S) {
    const int o = occ();
    if (!S) return o;
    cu_launch(cx, k_qwg<SBK, BN, NWG>, dim3((unsigned)blocks, (unsigned)((a.n + BN - 1) / BN), (unsigned)S),
              dim3(NWG * 128), qw_cfg<SBK, BN, NWG>::SMEM, a);
    return o;
  }
};
template <int SBK> static int qw_pick(const cu_ctx *cx, const qm_args &a, int blocks, int BN, int BM, int S) {
  if (BN == 128) return qw_kern<SBK, 128, 2>::run(cx, a, blocks, S);
  if (BN == 32) return BM == 256 ? qw_kern<SBK, 32, 4>::run(cx, a, blocks, S) : qw_kern<SBK, 32, 2>::run(cx, a, blocks, S);
  return BM == 256 ? qw_kern<SBK, 64, 4>::run(cx, a, blocks, S) : qw_kern<SBK, 64, 2>::run(cx, a, blocks, S);
}
int cu_qwg_launch(const cu_ctx *cx, int sbk, const qm_args &a, int blocks, int BN, int BM, int S) {
  if (sbk == SBK_F32) return qw_pick<SBK_F32>(cx, a, blocks, BN, BM, S);
  if (sbk == SBK_F16) return qw_pick<SBK_F16>(cx, a, blocks, BN, BM, S);
  return qw_pick<SBK_BF16>(cx, a, blocks, BN, BM, S);
}

void cu_qwg_prep(const cu_ctx *cx, const float *x, const float *xu, int act, int n, int64_t K, int BN, void *x16) {
  const int64_t tot = (int64_t)(n + BN - 1) / BN * BN * (K / QM_BK) * 4;
  int64_t pb = (tot + 255) / 256;
  if (pb > 4096) pb = 4096;
  cu_launch(cx, k_qwg_prep, dim3((unsigned)pb), dim3(256), 0, (const float4 *)x, (const float4 *)xu, act, n, (int)K,
            BN, tot, (uint4 *)x16);
  cu_count(cx, CU_K_QWG_PREP);
}
