/* Warp-level tensor-core helpers of the flash-attention kernels (cuda_attn_flash.cu,
 * cuda_attn_seg.cu): ldmatrix loads of shared memory, mma.sync m16n8k16 with f32 accumulators,
 * packing of float pairs into f16 / bf16 operands, a base-2 exponential, and the three steps of a
 * flash-attention key tile for a warp's 16 query rows (scores, online softmax, O += P V). sm_80+
 * only: the hosts of these kernels launch them there alone. */
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

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
/* A warp's 16 query rows against BN keys in shared memory (rows of HDP elements, HD of them used,
 * HD a multiple of 16). Register layout (mma's accumulator): s[j][e] is row lane/4 + 8 * (e >> 1),
 * key j * 8 + 2 * (lane & 3) + (e & 1); acc[j][e] the same rows, dims j * 8 + 2 * (lane & 3) + (e & 1).
 * Scores: s = Q K^T (Qs: the warp's 16 rows) */
template <typename MT, int HD, int BN, int HDP>
static __device__ __forceinline__ void fa_scores(float (&s)[BN / 8][4], const MT *Qs, const MT *Ks, int lane) {
#pragma unroll
  for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    uint32_t a[4];
    ldsm4(a, Qs + (lane & 15) * HDP + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int j = 0; j < BN / 8; j += 2) {
      uint32_t b[4];
      ldsm4(b, Ks + (j * 8 + (lane >> 4) * 8 + (lane & 7)) * HDP + kk * 16 + ((lane >> 3) & 1) * 8);
      mma16816<MT>(s[j], a, b[0], b[1]);
      mma16816<MT>(s[j + 1], a, b[2], b[3]);
    }
  }
}
/* The online softmax of masked scores (-inf: not seen; base-2 domain): the rows' running max m and sum
 * l and the accumulators rescaled, s replaced by the weights p */
template <int HD, int BN>
static __device__ __forceinline__ void fa_softmax(float (&s)[BN / 8][4], float (&acc)[HD / 8][4], float (&m)[2],
                                                  float (&l)[2]) {
  float mx[2] = { -INFINITY, -INFINITY }, corr[2];
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float mn = fmaxf(m[i], mx[i]);
    corr[i] = mn == -INFINITY ? 1.f : cu_exp2(m[i] - mn); /* m = -inf, mn finite: 0 */
    m[i] = mn;
    l[i] *= corr[i];
  }
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int i = e >> 1;
      const float pe = s[j][e] == -INFINITY ? 0.f : cu_exp2(s[j][e] - m[i]);
      s[j][e] = pe;
      l[i] += pe;
    }
  }
#pragma unroll
  for (int j = 0; j < HD / 8; j++) {
    acc[j][0] *= corr[0];
    acc[j][1] *= corr[0];
    acc[j][2] *= corr[1];
    acc[j][3] *= corr[1];
  }
}
/* O += P V: the weights' accumulator layout is the A-operand layout of two n8 tiles */
template <typename MT, int HD, int BN, int HDP>
static __device__ __forceinline__ void fa_pv(float (&acc)[HD / 8][4], const float (&s)[BN / 8][4], const MT *Vs,
                                             int lane) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++) {
    const uint32_t a[4] = { pk2<MT>(s[2 * kk][0], s[2 * kk][1]), pk2<MT>(s[2 * kk][2], s[2 * kk][3]),
                            pk2<MT>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pk2<MT>(s[2 * kk + 1][2], s[2 * kk + 1][3]) };
#pragma unroll
    for (int j = 0; j < HD / 8; j += 2) {
      uint32_t b[4];
      ldsm4t(b, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * HDP + j * 8 + (lane >> 4) * 8);
      mma16816<MT>(acc[j], a, b[0], b[1]);
      mma16816<MT>(acc[j + 1], a, b[2], b[3]);
    }
  }
}
#endif

#endif
