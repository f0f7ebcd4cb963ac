/* Dequantization of MLX microscaling weights (CW_MXQ, cuda_mxq.cuh) to bf16/f16 row tiles for the cuBLAS
 * path of larger batches (cuda_gemm.cu): one thread per 4 bytes of codes. */
#include "backend/cuda/cuda_mxq.cuh"

template <typename O>
__global__ void k_dequant_mxq(cu_weight w, int64_t r0, int64_t nr, O *__restrict__ out) {
  const int E = w.bits == 4 ? 8 : 4; /* elements a 32-bit word */
  const int64_t W = w.cols / E, total = nr * W;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t rr = i / W, u = i % W, r = r0 + rr, j0 = u * E;
    const uint32_t wd = ((const uint32_t *)w.q)[r * W + u];
    const float s = mxq_scale(w, r, j0 / w.gs); /* E divides the group size */
    O *dst = out + rr * w.cols + j0;
    if (w.bits == 4) {
#pragma unroll
      for (int e = 0; e < 8; e++) dst[e] = (O)(s * mxq_fp4((wd >> (4 * e)) & 15));
    } else {
#pragma unroll
      for (int e = 0; e < 4; e++) dst[e] = (O)(s * mxq_e4m3((wd >> (8 * e)) & 255));
    }
  }
}

void cu_mxq_dequant_rows(const cu_weight *w, int64_t r0, int64_t nr, void *out, bool to_f16, cudaStream_t s) {
  const int64_t work = nr * (w->cols / (w->bits == 4 ? 8 : 4));
  int64_t blocks = (work + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  if (blocks < 1) blocks = 1;
  if (to_f16) k_dequant_mxq<__half><<<(unsigned)blocks, 256, 0, s>>>(*w, r0, nr, (__half *)out);
  else k_dequant_mxq<__nv_bfloat16><<<(unsigned)blocks, 256, 0, s>>>(*w, r0, nr, (__nv_bfloat16 *)out);
}
