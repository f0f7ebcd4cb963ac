/* Weights on the device (cuda_weights.cu) and the GEMM path of larger batches (cuda_gemm.cu). */
#ifndef SM_CUDA_WEIGHTS_CUH
#define SM_CUDA_WEIGHTS_CUH
#include <cublas_v2.h>
#include "backend/cuda/cuda_common.cuh"

/* whether the backend can hold w (dtype, bits, group size, sizes) */
bool cu_weight_ok(const sm_weight *w);
/* upload w and repack it into the layout its kernels read; q4_mode: tuning q4 (which 4-bit weights
 * get the int8-kernel layout CW_Q4). Waits for the copies. */
smelt_status cu_weight_upload(const cu_ctx *cx, const sm_weight *w, int q4_mode, cu_weight **out);
void cu_weight_free(cu_weight *cw);
/* dequantize/convert rows [r0, r0+nr) of w to bf16 [nr][cols] (or to f16 when to_f16) */
void cu_dequant_rows(const cu_weight *w, int64_t r0, int64_t nr, void *out, bool to_f16, cudaStream_t s);
/* rows tokens[t] of an embedding, dequantized to float */
void cu_embed(const cu_ctx *cx, const cu_weight *w, const int32_t *tokens, int n_tokens, float *out);

/* y[n][rows] = x[n][cols] . W^T with cuBLAS: f32 weights directly, others through bf16/f16 copies of x
 * (x16: n * cols halves) and of weight row tiles (deq: deq_bytes); x_ready: x16 already holds x in the
 * half type of w (cu_gemm_prep; only where cu_gemm_half holds) */
void cu_gemm(const cu_ctx *cx, cublasHandle_t blas, const cu_weight *w, const float *x, int n, float *y, void *x16,
             void *deq, size_t deq_bytes, bool x_ready);
/* Does the matmul of w over n tokens of x (not batch-invariant, past the matvec kernels) take cu_gemm's
 * cuBLAS path with x converted to a half type? *bf16: that type is bf16 (dense bf16 weights), else f16. */
bool cu_gemm_half(const cu_ctx *cx, const cu_weight *w, int n, const float *x, bool *bf16);
/* x [n][cols] f32 into x16 as bf16 or f16 (clamped to +-65504), exactly as cu_gemm converts it; with xu,
 * act(x) * xu (act 1: silu, 2: gelu_tanh; as the unfused silu/gelu op computes it), which needs
 * cu_gemm_prep_ok */
bool cu_gemm_prep_ok(const float *x, const float *xu, int n, int64_t cols);
void cu_gemm_prep(const cu_ctx *cx, bool bf16, const float *x, const float *xu, int act, int n, int64_t cols, void *x16);

#endif
