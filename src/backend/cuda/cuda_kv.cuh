/* The KV cache's element types on the device (sm_kv_cache.dtype): float, __half and __nv_bfloat16,
 * and the quantized head rows of q8_0 / q4_0 (src/backend/kv_quant.h: a head's codes, then one f16
 * scale per 32 values), whose element types are the tags kv_q8 / kv_q4.
 * Kernels that read or write the cache are templates over the element type KT and go through these
 * helpers, so the float instances compile to exactly the code they had before half-precision caches
 * existed; launchers pick the instance with CU_KV_DISPATCH (float types) or CU_KV_DISPATCH_Q (every
 * type: the kernels that read a head row through kv_head / kv_hget4 and the quantizing store). */
#ifndef SM_CUDA_KV_CUH
#define SM_CUDA_KV_CUH
#include <type_traits>
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

/* ---- head rows of any cache type (the quantized ones included) ---- */
struct kv_q8 { signed char c; };   /* q8_0: int8 codes, x = q * d */
struct kv_q4 { unsigned char c; }; /* q4_0: two 4-bit codes a byte (value 2i low), x = (q - 8) * d */
template <typename KT> struct kv_is_q { static constexpr bool v = false; };
template <> struct kv_is_q<kv_q8> { static constexpr bool v = true; };
template <> struct kv_is_q<kv_q4> { static constexpr bool v = true; };
/* bytes of one head row (hd % 4 == 0), as sm_kv_head_bytes; offset of its f16 scales */
template <typename KT> static __host__ __device__ __forceinline__ int kv_scale_off(int hd) {
  return !kv_is_q<KT>::v ? 0 : std::is_same<KT, kv_q8>::value ? hd : hd / 2;
}
template <typename KT> static __host__ __device__ __forceinline__ int kv_head_bytes(int hd) {
  if constexpr (kv_is_q<KT>::v) return (kv_scale_off<KT>(hd) + 2 * ((hd + 31) / 32) + 3) & ~3;
  else return (int)sizeof(KT) * hd;
}
/* the head row of kv head kvh at cache slot sl (nkv heads a slot) */
template <typename KT>
static __device__ __forceinline__ const KT *kv_head(const KT *base, int64_t sl, int nkv, int kvh, int hd) {
  if constexpr (kv_is_q<KT>::v)
    return (const KT *)((const char *)base + (sl * nkv + kvh) * (int64_t)kv_head_bytes<KT>(hd));
  else return base + (sl * nkv + kvh) * (int64_t)hd;
}
/* values d .. d + 3 (d % 4 == 0) of a quantized head row as loaded (read-only path): their codes
 * (q8_0: four bytes; q4_0: two) and their group's scale; kv_qwiden turns them into floats, so that a
 * kernel can issue the loads of several rows before it widens any */
struct kv_qraw {
  unsigned c;
  float s;
};
template <typename KT> static __device__ __forceinline__ kv_qraw kv_qload(const KT *h, int hd, int d) {
  const char *r = (const char *)h;
  kv_qraw x;
  x.s = __half2float(__ldg((const __half *)(r + kv_scale_off<KT>(hd)) + d / 32));
  if constexpr (std::is_same<KT, kv_q8>::value) x.c = __ldg((const unsigned *)(r + d));
  else x.c = __ldg((const unsigned short *)(r + d / 2));
  return x;
}
template <typename KT> static __device__ __forceinline__ float4 kv_qwiden(kv_qraw x) {
  if constexpr (std::is_same<KT, kv_q8>::value) {
    const char4 c = *(const char4 *)&x.c;
    return make_float4(c.x * x.s, c.y * x.s, c.z * x.s, c.w * x.s);
  } else {
    const unsigned u = x.c;
    return make_float4((float)((int)(u & 15) - 8) * x.s, (float)((int)((u >> 4) & 15) - 8) * x.s,
                       (float)((int)((u >> 8) & 15) - 8) * x.s, (float)((int)((u >> 12) & 15) - 8) * x.s);
  }
}
/* values d .. d + 3 (d % 4 == 0) of a head row, widened to floats (read-only path) */
template <typename KT> static __device__ __forceinline__ float4 kv_hget4(const KT *h, int hd, int d) {
  if constexpr (kv_is_q<KT>::v) return kv_qwiden<KT>(kv_qload(h, hd, d));
  else return kv_ldg4(h + d);
}
/* value i of a head row */
template <typename KT> static __device__ __forceinline__ float kv_hget(const KT *h, int hd, int i) {
  if constexpr (kv_is_q<KT>::v) {
    const char *r = (const char *)h;
    const float s = __half2float(((const __half *)(r + kv_scale_off<KT>(hd)))[i / 32]);
    if constexpr (std::is_same<KT, kv_q8>::value) return (float)((const signed char *)r)[i] * s;
    else return (float)((int)((((const unsigned char *)r)[i / 2] >> (4 * (i & 1))) & 15) - 8) * s;
  } else {
    return kv_to_f(h[i]);
  }
}

/* the instance of a kernel template for a cache of sm_dtype dt: body(KT) with KT the element type */
#define CU_KV_DISPATCH(dt, ...)                                                                     \
  do {                                                                                              \
    if ((dt) == SM_DT_F16) { typedef __half KT; __VA_ARGS__; }                                     \
    else if ((dt) == SM_DT_BF16) { typedef __nv_bfloat16 KT; __VA_ARGS__; }                        \
    else { typedef float KT; __VA_ARGS__; }                                                         \
  } while (0)
/* the same over every cache type, the quantized ones included */
#define CU_KV_DISPATCH_Q(dt, ...)                                                                   \
  do {                                                                                              \
    if ((dt) == SM_DT_Q8_0) { typedef kv_q8 KT; __VA_ARGS__; }                                     \
    else if ((dt) == SM_DT_Q4_0) { typedef kv_q4 KT; __VA_ARGS__; }                                \
    else CU_KV_DISPATCH(dt, __VA_ARGS__);                                                           \
  } while (0)

#endif
