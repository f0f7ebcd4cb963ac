/* Device helpers the two batched 4-bit kernels share (cuda_qmma.cu: mma.sync; cuda_qwg.cu: wgmma):
 * copies into shared memory by cp.async, and x's conversion to f16 with a gated MLP's activation. */
#ifndef SM_CUDA_QMMA_DEV_CUH
#define SM_CUDA_QMMA_DEV_CUH
#include <cuda_fp16.h>
#include <stdint.h>
#include "backend/cuda/cuda_common.cuh"

/* x rounded to f16, clamped to +-65504 (as the dequantize + cuBLAS path rounds it) */
static __device__ __forceinline__ __half qm_h(float v) { return __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f)); }
/* with xu: act(v) * xu[j] (act 1 silu, 2 gelu_tanh: a gated MLP's down projection); else v */
static __device__ __forceinline__ float4 qm_act(float4 v, const float4 *xu, int64_t j, int act) {
  if (!xu) return v;
  const float4 u = __ldcg(xu + j);
  if (act == 2) return make_float4(cu_gelu_tanh(v.x) * u.x, cu_gelu_tanh(v.y) * u.y, cu_gelu_tanh(v.z) * u.z,
                                   cu_gelu_tanh(v.w) * u.w);
  return make_float4(cu_silu(v.x) * u.x, cu_silu(v.y) * u.y, cu_silu(v.z) * u.z, cu_silu(v.w) * u.w);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
/* cp.async to a shared-window address (32 bits: no conversion of a generic pointer a copy) */
static __device__ __forceinline__ void qm_cp16(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
static __device__ __forceinline__ void qm_cp8(uint32_t dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src));
}
static __device__ __forceinline__ void qm_cp4(uint32_t dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}
static __device__ __forceinline__ void qm_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void qm_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
#endif

#endif
