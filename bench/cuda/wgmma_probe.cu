/* Hopper wgmma probe for the batched 4-bit matmul (not a test, not part of the product; sm_90a only).
 * The question it answers: how fast can y[64][M] = x[64][K] . W^T run when the 4-bit MLX weights are
 * dequantized in registers into wgmma's A operand (m64n64k16, f16, f32 sums) and x is read by the
 * tensor cores straight from shared memory (no shared-memory loads into registers, the MMAs
 * asynchronous), against cuda_qmma.cu's mma.sync kernel (docs/cuda.md: 40.6 us for 14336 x 4096 at 64
 * tokens on the H200, bound by latency with one block of 8 warps an SM).
 *
 * Layout. A block is one warpgroup (128 threads) of 64 weight rows: warp w holds rows 16w..16w+15 of
 * the m64 tile, thread (g = lane / 4, q = lane % 4) rows g and g + 8, as mma.sync's A fragment. In a
 * 128-value stage of a row, thread q loads words 4q..4q+3 (values 32q..32q+31) and makes of word j
 * the f16 pairs (nibble e, nibble e + 4), e = 0..3 (qm_dq, the product's); k16 step
 * u = 2j + h takes pairs e = 2h (k 2q, 2q+1) and 2h + 1 (k 2q+8, 2q+9). So the logical k l of step u
 * is the value 32 (l % 8 / 2) + 8j + 2h + (l >= 8) + 4 (l % 2) of the stage, and x is stored in that
 * order (xprep): in no-swizzle K-major core matrices of 8 tokens x 8 logical k (8 rows of 16 bytes),
 * core (token group tg, k half c) of step u at byte (u * 16 + tg * 2 + c) * 128 of a 16 KB stage, so
 * the descriptor's two strides are 128 (k halves) and 256 (token groups). Which of LBO and SBO is
 * which for this layout is checked, not assumed: the probe runs both (SWAP) against a CPU reference.
 *
 * Pipeline: the x stages by cp.async (3 buffers); while a stage's 8 wgmmas run, the next stage's A
 * fragments are made and the weight words of the one after are loaded into registers; k split over
 * gridDim.z with atomicAdd (results depend on the schedule: fine for a probe).
 *
 * Build and run on the GPU machine: nvcc -O3 -std=c++17 -gencode
 * arch=compute_90a,code=sm_90a -I src -o /tmp/wgp bench/cuda/wgmma_probe.cu
 * && /tmp/wgp [M K S]   (default 14336 4096 and S = 1, 2, 4) */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "backend/cuda/cuda_q4pair.cuh"

#define CK(x)                                                                                                \
  do {                                                                                                       \
    cudaError_t e_ = (x);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                 \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                     \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)

constexpr int N = 64, GS = 64, BK = 128, STG = 3, XSTAGE = N * BK * 2; /* bytes of an x stage */

/* x f32 [N][K] -> f16 in the stage / step / core-matrix order above */
__global__ void xprep(const float *x, __half *xw, int K) {
  const int64_t tot = (int64_t)N * K;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < tot; i += (int64_t)gridDim.x * blockDim.x) {
    /* i = destination index: stage s, step u, token group tg, k half c, token t8, logical l8 */
    int64_t r = i;
    const int l8 = r % 8; r /= 8;
    const int t8 = r % 8; r /= 8;
    const int c = r % 2; r /= 2;
    const int tg = r % 8; r /= 8;
    const int u = r % 8; r /= 8;
    const int s = (int)r;
    const int j = u >> 1, h = u & 1, qq = l8 >> 1, p = l8 & 1;
    const int phys = 32 * qq + 8 * j + 2 * h + c + 4 * p;
    const int t = tg * 8 + t8;
    xw[i] = __float2half_rn(x[(int64_t)t * K + (int64_t)s * BK + phys]);
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ uint64_t desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int K> static __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(K) : "memory");
}
/* d[32] += A (4 registers) . B (descriptor), m64n64k16 */
static __device__ __forceinline__ void wg_mma(float *d, const uint32_t *a, uint64_t bd) {
  asm volatile("{\n"
               ".reg .pred p;\n"
               "setp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
               "}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                 "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                 "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                 "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(1)
               : "memory");
}
static __device__ __forceinline__ void cp16(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
static __device__ __forceinline__ float bf(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }
#endif

/* grid (M / 64, 1, S); y must be zero (k slices add with atomicAdd) */
template <bool SWAP>
__global__ void __launch_bounds__(128) kwg(const uint32_t *__restrict__ wq, const uint16_t *__restrict__ sc,
                                            const uint16_t *__restrict__ bi, const __half *__restrict__ xw, float *y,
                                            int M, int K, int per) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int nst = K / BK, s0 = blockIdx.z * per, ns = min(per, nst - s0), G = K / GS;
  const int r0 = blockIdx.x * 64 + warp * 16 + g, r1 = r0 + 8;
  const uint32_t sm0 = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t lbo = SWAP ? 256 : 128, sbo = SWAP ? 128 : 256;
  /* x stage s -> buffer b: 1024 chunks of 16 bytes, 8 a thread */
  auto issue_x = [&](int s, int b) {
    const char *src = (const char *)xw + (int64_t)(s0 + s) * XSTAGE;
#pragma unroll
    for (int i = 0; i < XSTAGE / 16 / 128; i++) cp16(sm0 + b * XSTAGE + (tid + i * 128) * 16, src + (tid + i * 128) * 16);
    asm volatile("cp.async.commit_group;");
  };
  /* the thread's weight words and (scale, bias) of stage s, rows r0 and r1 */
  auto load_w = [&](int s, uint4 *w, uint32_t *sb) {
    const int st = s0 + s, gi = st * 2 + (q >> 1);
    w[0] = __ldg((const uint4 *)(wq + (int64_t)r0 * (K / 8) + st * 16 + 4 * q));
    w[1] = __ldg((const uint4 *)(wq + (int64_t)r1 * (K / 8) + st * 16 + 4 * q));
    sb[0] = (uint32_t)__ldg(sc + (int64_t)r0 * G + gi) | (uint32_t)__ldg(bi + (int64_t)r0 * G + gi) << 16;
    sb[1] = (uint32_t)__ldg(sc + (int64_t)r1 * G + gi) | (uint32_t)__ldg(bi + (int64_t)r1 * G + gi) << 16;
  };
  /* the 8 steps' A fragments of a stage */
  auto dequant = [&](const uint4 *w, const uint32_t *sb, uint32_t (*A)[4]) {
    const __half2 s0h = __float2half2_rn(bf(sb[0] & 0xffff)), b0h = __float2half2_rn(bf(sb[0] >> 16));
    const __half2 s1h = __float2half2_rn(bf(sb[1] & 0xffff)), b1h = __float2half2_rn(bf(sb[1] >> 16));
#pragma unroll
    for (int j = 0; j < 4; j++) {
      uint32_t p0[4], p1[4];
      qm_dq((&w[0].x)[j], s0h, b0h, p0);
      qm_dq((&w[1].x)[j], s1h, b1h, p1);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        A[2 * j + h][0] = p0[2 * h];
        A[2 * j + h][1] = p1[2 * h];
        A[2 * j + h][2] = p0[2 * h + 1];
        A[2 * j + h][3] = p1[2 * h + 1];
      }
    }
  };
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; i++) d[i] = 0.f;
  /* A fragments and weight words of even and odd stages, as named arrays (registers). The next
   * stage's fragments are made while this stage's MMAs run, and the MMAs are waited for (wait_group
   * 0) before the next ones are issued: ptxas serializes the MMAs when registers that feed an MMA of
   * the group in flight are written meanwhile. */
  uint32_t A0[8][4], A1[8][4], sbA[2], sbB[2];
  uint4 wA[2], wB[2];
  for (int s = 0; s < STG - 1; s++) {
    if (s < ns) issue_x(s, s);
    else asm volatile("cp.async.commit_group;");
  }
  load_w(0, wA, sbA);
  dequant(wA, sbA, A0);
  if (ns > 1) load_w(1, wB, sbB);
  auto stage = [&](int s, uint32_t(*Acur)[4], uint32_t(*Anext)[4], uint4 *wnext, uint32_t *sbnext, uint4 *wfree,
                   uint32_t *sbfree) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STG - 2));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async's writes, seen by wgmma */
    __syncthreads();
    const uint32_t xb = sm0 + (s % STG) * XSTAGE;
    wg_fence();
#pragma unroll
    for (int u = 0; u < 8; u++) wg_mma(d, Acur[u], desc(xb + u * 2048, lbo, sbo));
    wg_commit();
    if (s + 1 < ns) dequant(wnext, sbnext, Anext);
    if (s + 2 < ns) load_w(s + 2, wfree, sbfree);
    wg_wait<0>();
    __syncthreads(); /* every warp's MMAs of stage s are done: its x buffer may be refilled */
    if (s + STG - 1 < ns) issue_x(s + STG - 1, (s + STG - 1) % STG);
    else asm volatile("cp.async.commit_group;");
  };
  for (int s = 0; s < ns; s += 2) {
    stage(s, A0, A1, wB, sbB, wA, sbA);
    if (s + 1 < ns) stage(s + 1, A1, A0, wA, sbA, wB, sbB);
  }
  wg_wait<0>();
  /* d[4t + c]: row g + 8 (c / 2) of the warp's 16, token 8t + 2q + c % 2 */
#pragma unroll
  for (int t = 0; t < 8; t++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const int row = (c < 2 ? r0 : r1), tok = 8 * t + 2 * q + (c & 1);
      if (gridDim.z == 1) y[(int64_t)tok * M + row] = d[4 * t + c];
      else atomicAdd(&y[(int64_t)tok * M + row], d[4 * t + c]);
    }
#endif
}

static float h2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* returns microseconds a call (median of 20) or the relative error against the CPU (check) */
template <bool SWAP> static double run(int M, int K, int S, bool check) {
  const int G = K / GS;
  std::vector<uint32_t> hw((size_t)M * K / 8);
  std::vector<uint16_t> hs((size_t)M * G), hb((size_t)M * G);
  std::vector<float> hx((size_t)N * K), hy((size_t)N * M);
  srand(7);
  for (auto &v : hw) v = (uint32_t)rand() * 2654435761u ^ (uint32_t)rand();
  for (size_t i = 0; i < hs.size(); i++) {
    const float s = 0.002f + 0.01f * (float)rand() / RAND_MAX, b = -8 * s * (0.5f + (float)rand() / RAND_MAX);
    uint32_t us, ub;
    memcpy(&us, &s, 4);
    memcpy(&ub, &b, 4);
    hs[i] = (uint16_t)(us >> 16);
    hb[i] = (uint16_t)(ub >> 16);
  }
  for (auto &v : hx) v = (float)rand() / RAND_MAX * 2 - 1;
  uint32_t *dw;
  uint16_t *ds, *db;
  float *dx, *dy;
  __half *dxw;
  CK(cudaMalloc(&dw, hw.size() * 4));
  CK(cudaMalloc(&ds, hs.size() * 2));
  CK(cudaMalloc(&db, hb.size() * 2));
  CK(cudaMalloc(&dx, hx.size() * 4));
  CK(cudaMalloc(&dy, hy.size() * 4));
  CK(cudaMalloc(&dxw, (size_t)N * K * 2));
  CK(cudaMemcpy(dw, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ds, hs.data(), hs.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  const int nst = K / BK, per = (nst + S - 1) / S;
  S = (nst + per - 1) / per;
  const size_t smem = (size_t)STG * XSTAGE;
  CK(cudaFuncSetAttribute(kwg<SWAP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  auto call = [&]() {
    xprep<<<256, 256>>>(dx, dxw, K);
    if (S > 1) cudaMemsetAsync(dy, 0, hy.size() * 4);
    kwg<SWAP><<<dim3(M / 64, 1, S), 128, smem>>>(dw, ds, db, dxw, dy, M, K, per);
  };
  double out;
  if (check) {
    CK(cudaMemset(dy, 0xff, hy.size() * 4)); /* NaN: every output must be written */
    call();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy.data(), dy, hy.size() * 4, cudaMemcpyDeviceToHost));
    double e2 = 0, r2 = 0;
    for (int t = 0; t < N; t++)
      for (int r = 0; r < M; r++) {
        double ref = 0;
        for (int k = 0; k < K; k++) {
          const int qv = (hw[((size_t)r * K + k) / 8] >> (4 * (k % 8))) & 15;
          const double wv = (double)h2f(hs[(size_t)r * G + k / GS]) * qv + h2f(hb[(size_t)r * G + k / GS]);
          ref += wv * hx[(size_t)t * K + k];
        }
        const double got = hy[(size_t)t * M + r];
        e2 += (got - ref) * (got - ref);
        r2 += ref * ref;
      }
    out = e2 == e2 ? sqrt(e2 / r2) : INFINITY;
  } else {
    for (int i = 0; i < 3; i++) call();
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<float> ts;
    for (int i = 0; i < 20; i++) {
      cudaEventRecord(a);
      call();
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms;
      cudaEventElapsedTime(&ms, a, b);
      ts.push_back(ms);
    }
    CK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    out = ts[ts.size() / 2] * 1e3;
  }
  cudaFree(dw);
  cudaFree(ds);
  cudaFree(db);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dxw);
  return out;
}

int main(int argc, char **argv) {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
  if (p.major != 9) {
    printf("wgmma needs sm_90\n");
    return 0;
  }
  const double e0 = run<false>(256, 1024, 2, true), e1 = run<true>(256, 1024, 2, true);
  printf("relative error against the CPU (256 x 1024, 64 tokens): LBO 128 / SBO 256 %.3g, swapped %.3g\n", e0, e1);
  const bool swap = e1 < e0;
  if ((swap ? e1 : e0) > 5e-3) printf("neither layout matches: the timings below are of a wrong kernel\n");
  const int M = argc > 2 ? atoi(argv[1]) : 14336, K = argc > 2 ? atoi(argv[2]) : 4096;
  const int Ss[3] = {1, 2, 4};
  for (int i = 0; i < 3; i++) {
    const int S = argc > 3 ? atoi(argv[3]) : Ss[i];
    const double us = swap ? run<true>(M, K, S, false) : run<false>(M, K, S, false);
    const double gb = ((double)M * K / 2 + (double)M * (K / GS) * 4) / (us * 1e-6) / 1e9;
    printf("%d x %d, 64 tokens, %d k slices: %.1f us (x conversion included), weights at %.0f GB/s\n", M, K, S, us,
           gb);
    if (argc > 3) break;
  }
  return 0;
}
