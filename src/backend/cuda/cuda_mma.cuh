/* Warp-level tensor-core helpers of the flash-attention kernels (cuda_attn_flash.cu,
 * cuda_attn_seg.cu): ldmatrix loads of shared memory, mma.sync m16n8k16 with f32 accumulators,
 * packing of float pairs into f16 / bf16 operands, and a base-2 exponential. sm_80+ only: the hosts
 * of these kernels launch them there alone. */
#ifndef SM_CUDA_MMA_CUH
#define SM_CUDA_MMA_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

static __device__ __forceinline__ uint32_t cu_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
static __device__ __forceinline__ void ldsm4(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(cu_smem_u32(p)));
}
static __device__ __forceinline__ void ldsm4t(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(cu_smem_u32(p)));
}
#endif
/* D += A B: m16n8k16, A row-major 16x16, B column-major 16x8, f32 accumulators; MT: __half or __nv_bfloat16 */
template <typename MT> static __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same<MT, __half>::value)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap(); /* the host launches these kernels on sm_80+ only */
#endif
}
/* two floats as a packed pair of MT */
template <typename MT> static __device__ __forceinline__ uint32_t pk2(float lo, float hi) {
  if constexpr (std::is_same<MT, __half>::value) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
  }
}
static __device__ __forceinline__ float cu_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#endif
