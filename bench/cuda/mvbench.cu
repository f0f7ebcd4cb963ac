/* Microbenchmark of the CUDA quantized matvec kernels on the Llama-3.1-8B shapes.
 * usage: cuda_mvbench [gs]   (built by tests/cuda/CMakeLists.txt when SMELT_CUDA is on)
 * For each shape and n it times (CUDA events, weights rotated over > 256 MiB of copies so
 * that nothing is served from L2):
 *   q4   : CW_Q4 int8-activation dp4a kernel (x quantization included), automatic tiling;
 *          for n > CU_Q4_MAX_N this is what the backend runs: dequant + cuBLAS
 *   old  : n <= 8: the permuted-layout fp32 kernel (CW_QFAST); n > 8: dequant to bf16 + cuBLAS
 * and for n = 1 every (rows per thread, threads per row) variant of q4.
 * GB/s counts the 4-bit weights + (scale, bias) pairs read once per call. */
#include "backend/cuda/cuda_mv.cuh"
#include "backend/cuda/cuda_q4.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void k_fill(uint32_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = x;
  }
}
/* bf16 (scale, bias) pairs: scale ~0.01, bias ~-0.075 */
__global__ void k_fill_sb(uint32_t *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = 0x3C23u | (0xBD9Au << 16);
}
__global__ void k_fillf(float *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (float)((i * 7919) % 2001) / 1000.f - 1.f;
}
__global__ void k_tobf(__nv_bfloat16 *o, const float *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    o[i] = __float2bfloat16(x[i]);
}

static int env_int(const char *k, int d) { const char *v = getenv(k); return v ? atoi(v) : d; }

int main(int argc, char **argv) {
  const int gs = argc > 1 ? atoi(argv[1]) : 64;
  /* MVB_QUICK=1: n = 1 only, the default q4 path (the SMELT_CUDA_* tuning variables apply) */
  const bool quick = env_int("MVB_QUICK", 0) != 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int n_sm = prop.multiProcessorCount;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cu_tune tune;
  if (cu_tune_read(prop.major * 10 + prop.minor, &tune)) { fprintf(stderr, "%s\n", smelt_last_error()); return 1; }
  const cu_ctx cx = { s, &tune, -1, 0, n_sm, prop.major * 10 + prop.minor, NULL };
  cublasHandle_t blas;
  cublasCreate(&blas);
  cublasSetStream(blas, s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  /* copy bandwidth (bytes read + written), as be->measure_bandwidth */
  double copy_bw;
  {
    size_t nb = (size_t)512 << 20;
    void *a, *b;
    CK(cudaMalloc(&a, nb));
    CK(cudaMalloc(&b, nb));
    cudaMemcpyAsync(b, a, nb, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e0, s);
    for (int i = 0; i < 10; i++) cudaMemcpyAsync(b, a, nb, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    copy_bw = 2.0 * nb * 10 / (ms * 1e-3);
    cudaFree(a);
    cudaFree(b);
  }
  printf("device %s, %d SMs, copy bandwidth %.0f GB/s, group size %d\n", prop.name, n_sm, copy_bw / 1e9, gs);
  const int shapes[][2] = { { 4096, 4096 }, { 1024, 4096 }, { 14336, 4096 }, { 4096, 14336 }, { 128256, 4096 } };
  const int ns[] = { 1, 2, 4, 8, 16, 33, 64 }; /* n > CU_Q4_MAX_N: q4 column = dequant+cuBLAS too */
  float *x, *y;
  CK(cudaMalloc(&x, (size_t)64 * 14336 * 4));
  CK(cudaMalloc(&y, (size_t)64 * 128256 * 4));
  k_fillf<<<1024, 256, 0, s>>>(x, (size_t)64 * 14336);
  void *xq;
  CK(cudaMalloc(&xq, cu_q4_scratch_bytes(64, 14336)));
  void *x16, *deq;
  const size_t deq_cap = (size_t)128 << 20;
  CK(cudaMalloc(&x16, (size_t)64 * 14336 * 2));
  CK(cudaMalloc(&deq, deq_cap));
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int M = shapes[si][0], K = shapes[si][1];
    const size_t qb = (size_t)M * K / 2, sbn = (size_t)M * (K / gs);
    const double bytes = (double)qb + (double)sbn * 4;
    int copies = (int)((((size_t)256 << 20) + qb - 1) / qb);
    if (copies < 2) copies = 2;
    std::vector<cu_weight> w4(copies), wf(copies);
    for (int i = 0; i < copies; i++) {
      cu_weight w = {};
      w.kind = CW_Q4; w.rows = M; w.cols = K; w.bits = 4; w.gs = gs; w.dtype = SM_DT_BF16; w.sbk = SBK_BF16;
      CK(cudaMalloc(&w.q, qb));
      CK(cudaMalloc(&w.sb, sbn * 4));
      k_fill<<<1024, 256, 0, s>>>((uint32_t *)w.q, qb / 4, 1234u + i);
      k_fill_sb<<<1024, 256, 0, s>>>((uint32_t *)w.sb, sbn);
      w4[i] = w;
      w.kind = CW_QFAST; /* same bytes, read as the permuted layout (timing only) */
      wf[i] = w;
    }
    CK(cudaStreamSynchronize(s));
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      const int n = ns[ni];
      if (quick && n != 1) continue;
      const int iters = 2 * copies > 40 ? 2 * copies : 40;
      auto timeit = [&](auto &&fn) {
        for (int i = 0; i < 3; i++) fn(i % copies);
        cudaEventRecord(e0, s);
        for (int i = 0; i < iters; i++) fn(i % copies);
        cudaEventRecord(e1, s);
        CK(cudaEventSynchronize(e1));
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        return (double)ms * 1e3 / iters;
      };
      double tq = timeit([&](int i) { const cu_weight *pw = &w4[i]; cu_matvec_multi(&cx, &pw, &y, 1, x, n, xq, -1); });
      if (quick) {
        printf("%6dx%-5d n=1  q4 %8.1f us %7.0f GB/s (%4.1f%% of copy)\n", M, K, tq, bytes / (tq * 1e-6) / 1e9,
               100.0 * bytes / (tq * 1e-6) / copy_bw);
        /* x already quantized, as the o projection (role O: k_mvr when SMELT_CUDA_MVR allows it) */
        const double tp = timeit([&](int i) {
          const cu_weight *pw = &w4[i];
          float *py = y;
          cu_q4_matvec_preq(&cx, &pw, &py, 1, 1, xq, CU_Q4_O);
        });
        printf("%6dx%-5d n=1  preq(o role) %8.1f us %7.0f GB/s (%4.1f%% of copy)\n", M, K, tp,
               bytes / (tp * 1e-6) / 1e9, 100.0 * bytes / (tp * 1e-6) / copy_bw);
        continue;
      }
      double to;
      const char *oname;
      if (n <= CU_MAX_N) {
        oname = "fp32 permuted";
        to = timeit([&](int i) { const cu_weight *pw = &wf[i]; cu_matvec_multi(&cx, &pw, &y, 1, x, n, NULL, -1); });
      } else {
        oname = "dequant+cuBLAS";
        to = timeit([&](int i) {
          const float one = 1.f, zero = 0.f;
          size_t nx = (size_t)n * K;
          k_tobf<<<1024, 256, 0, s>>>((__nv_bfloat16 *)x16, x, nx);
          int64_t chunk = (int64_t)(deq_cap / ((size_t)K * 2));
          if (chunk > M) chunk = M;
          if (chunk >= 128) chunk &= ~(int64_t)127;
          for (int64_t r0 = 0; r0 < M; r0 += chunk) {
            int64_t nr = M - r0 < chunk ? M - r0 : chunk;
            cu_dequant_rows(&w4[i], r0, nr, deq, false, s);
            cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, K, &one, deq, CUDA_R_16BF, K, x16, CUDA_R_16BF,
                         K, &zero, y + r0, CUDA_R_32F, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          }
        });
      }
      printf("%6dx%-5d n=%-2d  q4 %8.1f us %7.0f GB/s (%4.1f%% of copy)   %s %8.1f us %7.0f GB/s   speedup %.2fx\n", M,
             K, n, tq, bytes / (tq * 1e-6) / 1e9, 100.0 * bytes / (tq * 1e-6) / copy_bw, oname, to,
             bytes / (to * 1e-6) / 1e9, to / tq);
      if (n == 1) {
        for (int rb : { 14, 24, 44, 12, 22, 42, 18, 28 })
          for (int tl = 5; tl <= 7; tl++) {
            if ((K / 32) < (1 << tl) && tl > 5) continue;
            double t = timeit([&](int i) {
              cu_weight *pw = &w4[i];
              float *py = y;
              cu_q4_matvec(&cx, (const cu_weight *const *)&pw, &py, 1, x, NULL, 1, xq, -1, rb, tl);
            });
            printf("      variant rb=%d tpr=%3d  %8.1f us %7.0f GB/s (%4.1f%%)\n", rb, 1 << tl, t,
                   bytes / (t * 1e-6) / 1e9, 100.0 * bytes / (t * 1e-6) / copy_bw);
          }
      }
      CK(cudaGetLastError());
    }
    for (int i = 0; i < copies; i++) { cudaFree(w4[i].q); cudaFree(w4[i].sb); }
  }
  CK(cudaStreamSynchronize(s));
  printf("done\n");
  return 0;
}
