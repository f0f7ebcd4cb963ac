/* Matrix products of larger batches (more tokens than the matvec kernels take): cuBLAS GEMMs, with
 * x converted to the weights' half type (bf16 or f16 weights) and quantized weights dequantized to f16
 * a tile of rows at a time, with x in f16: 8x finer than bf16 (x clamped to f16's range, +-65504).
 * 4-bit weights of steps up to the tuning value qmma run on the tensor-core kernel (cuda_qmma.cu).
 * The executor (cuda_fuse.cu) converts x once for consecutive matmuls of one x (q/k/v, gate/up) and
 * computes a gated MLP's act(gate) * up straight into the down projection's half x (cu_gemm_prep). */
#include "backend/cuda/cuda_qmma.cuh"
#include "backend/cuda/cuda_qmma_dev.cuh"
#include "backend/cuda/cuda_weights.cuh"

#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
__global__ void k_to_bf16(__nv_bfloat16 *o, const float *x, size_t n) { GRID_STRIDE(i, n) o[i] = __float2bfloat16(x[i]); }
__global__ void k_to_f16(__half *o, const float *x, size_t n) {
  GRID_STRIDE(i, n) o[i] = __float2half(fminf(fmaxf(x[i], -65504.f), 65504.f));
}
/* four values a thread (x, xu and o 16-byte aligned); with xu: act(x) * xu (qm_act: 1 silu, 2 gelu_tanh) */
template <bool BF>
__global__ void k_to_half4(uint2 *o, const float4 *x, const float4 *xu, int act, size_t n4) {
  GRID_STRIDE(i, n4) o[i] = qm_half4(qm_act(__ldcg(x + i), xu, (int64_t)i, act), BF);
}

bool cu_gemm_half(const cu_ctx *cx, const cu_weight *cw, int n, const float *x, bool *bf16) {
  if (cw->kind == CW_DENSE && cw->dtype == SM_DT_F32) return false;
  if (cu_qmma_ok(cx, cw, n) && !((uintptr_t)x & 15)) return false;
  *bf16 = cw->kind == CW_DENSE && cw->dtype != SM_DT_F16;
  return true;
}

bool cu_gemm_prep_ok(const float *x, const float *xu, int n, int64_t cols) {
  return !((uintptr_t)x & 15) && !((uintptr_t)xu & 15) && ((size_t)n * (size_t)cols) % 4 == 0;
}

void cu_gemm_prep(const cu_ctx *cx, bool bf16, const float *x, const float *xu, int act, int n, int64_t cols, void *x16) {
  const size_t nx = (size_t)n * (size_t)cols;
  if (!xu && !cu_gemm_prep_ok(x, NULL, n, cols)) { /* unaligned: one value a thread */
    if (bf16) k_to_bf16<<<cu_ew_blocks(nx), 256, 0, cx->s>>>((__nv_bfloat16 *)x16, x, nx);
    else k_to_f16<<<cu_ew_blocks(nx), 256, 0, cx->s>>>((__half *)x16, x, nx);
    return;
  }
  if (bf16) k_to_half4<true><<<cu_ew_blocks(nx / 4), 256, 0, cx->s>>>((uint2 *)x16, (const float4 *)x, (const float4 *)xu, act, nx / 4);
  else k_to_half4<false><<<cu_ew_blocks(nx / 4), 256, 0, cx->s>>>((uint2 *)x16, (const float4 *)x, (const float4 *)xu, act, nx / 4);
}

void cu_gemm(const cu_ctx *cx, cublasHandle_t blas, const cu_weight *cw, const float *x, int n, float *y, void *x16,
             void *deq, size_t deq_bytes, bool x_ready) {
  const int64_t M = cw->rows, K = cw->cols;
  const float one = 1.f, zero = 0.f;
  if (!x_ready && cw->kind == CW_DENSE && cw->dtype == SM_DT_F32) {
    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, n, (int)K, &one, cw->q, CUDA_R_32F, (int)K, x, CUDA_R_32F,
                 (int)K, &zero, y, CUDA_R_32F, (int)M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return;
  }
  if (!x_ready && cu_qmma_ok(cx, cw, n) && !((uintptr_t)x & 15)) {
    cu_qmma(cx, cw, x, n, y, x16, deq, deq_bytes);
    return;
  }
  const bool f16 = cw->kind != CW_DENSE || cw->dtype == SM_DT_F16;
  const cudaDataType dt = f16 ? CUDA_R_16F : CUDA_R_16BF;
  if (!x_ready) cu_gemm_prep(cx, !f16, x, NULL, 0, n, K, x16);
  if (cw->kind == CW_DENSE) {
    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, n, (int)K, &one, cw->q, dt, (int)K, x16, dt, (int)K, &zero, y,
                 CUDA_R_32F, (int)M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return;
  }
  int64_t chunk = (int64_t)(deq_bytes / ((size_t)K * 2));
  if (chunk > M) chunk = M;
  if (chunk >= 128) chunk &= ~(int64_t)127;
  for (int64_t r0 = 0; r0 < M; r0 += chunk) {
    const int64_t nr = M - r0 < chunk ? M - r0 : chunk;
    cu_dequant_rows(cw, r0, nr, deq, true, cx->s);
    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, (int)K, &one, deq, CUDA_R_16F, (int)K, x16, CUDA_R_16F,
                 (int)K, &zero, y + r0, CUDA_R_32F, (int)M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
}
