/* The KV cache's element types on the device (sm_kv_cache.dtype): float, __half and __nv_bfloat16.
 * Kernels that read or write the cache are templates over the element type KT and go through these
 * helpers, so the float instances compile to exactly the code they had before half-precision caches
 * existed; launchers pick the instance with CU_KV_DISPATCH. */
#ifndef SM_CUDA_KV_CUH
#define SM_CUDA_KV_CUH
#include "backend/cuda/cuda_common.cuh"

/* float -> KT (round to nearest even) and back */
template <typename KT> static __device__ __forceinline__ KT kv_from_f(float x);
template <> __device__ __forceinline__ float kv_from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half kv_from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 kv_from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
static __device__ __forceinline__ float kv_to_f(float x) { return x; }
static __device__ __forceinline__ float kv_to_f(__half x) { return __half2float(x); }
static __device__ __forceinline__ float kv_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
/* the value a cache of KT holds for x */
template <typename KT> static __device__ __forceinline__ float kv_round(float x) { return kv_to_f(kv_from_f<KT>(x)); }

/* four consecutive 16-bit elements (8 bytes) as a float4 */
static __device__ __forceinline__ float4 kv_h4(uint2 u, __half) {
  const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
static __device__ __forceinline__ float4 kv_h4(uint2 u, __nv_bfloat16) {
  /* bf16 -> f32 is a shift into the high half */
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xffff0000u));
}
/* four elements as loaded, kept in registers until used: float4 for a float cache, the 8 raw bytes
 * for a 16-bit one (half the registers, and no conversion between a load and the next load);
 * kv_cvt4 widens them where they are used, kv_raw4_of packs four values a KT holds exactly */
template <typename KT> struct kv_raw4 { typedef uint2 T; };
template <> struct kv_raw4<float> { typedef float4 T; };
static __device__ __forceinline__ float4 kv_cvt4(float4 r, float) { return r; }
template <typename KT> static __device__ __forceinline__ float4 kv_cvt4(uint2 r, KT) { return kv_h4(r, KT()); }
static __device__ __forceinline__ float4 kv_raw4_of(float4 v, float) { return v; }
static __device__ __forceinline__ uint2 kv_raw4_of(float4 v, __half) {
  const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
  return make_uint2(*(const unsigned *)&a, *(const unsigned *)&b);
}
static __device__ __forceinline__ uint2 kv_raw4_of(float4 v, __nv_bfloat16) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  return make_uint2(*(const unsigned *)&a, *(const unsigned *)&b);
}
template <typename KT> static __device__ __forceinline__ typename kv_raw4<KT>::T kv_raw4_zero() {
  if constexpr (sizeof(KT) == 4) return make_float4(0.f, 0.f, 0.f, 0.f);
  else return make_uint2(0u, 0u);
}
template <typename KT> static __device__ __forceinline__ typename kv_raw4<KT>::T kv_raw4_ld(const KT *p) {
  return *(const typename kv_raw4<KT>::T *)p;
}

/* elements p[0..3] (p 4-element aligned) through the read-only path, widened to floats */
static __device__ __forceinline__ float4 kv_ldg4(const float *p) { return __ldg((const float4 *)p); }
template <typename KT> static __device__ __forceinline__ float4 kv_ldg4(const KT *p) {
  return kv_h4(__ldg((const uint2 *)p), KT());
}

/* the instance of a kernel template for a cache of sm_dtype dt: body(KT) with KT the element type */
#define CU_KV_DISPATCH(dt, ...)                                                                     \
  do {                                                                                              \
    if ((dt) == SM_DT_F16) { typedef __half KT; __VA_ARGS__; }                                     \
    else if ((dt) == SM_DT_BF16) { typedef __nv_bfloat16 KT; __VA_ARGS__; }                        \
    else { typedef float KT; __VA_ARGS__; }                                                         \
  } while (0)

#endif
