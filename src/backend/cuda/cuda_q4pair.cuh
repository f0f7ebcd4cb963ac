/* 4-bit MLX words to f16 pairs in registers, for the tensor-core operands (cuda_qmma.cu). */
#ifndef SM_CUDA_Q4PAIR_CUH
#define SM_CUDA_Q4PAIR_CUH
#include <cuda_fp16.h>
#include <stdint.h>

/* (v & m) | 0x64006400 in one instruction */
static __device__ __forceinline__ uint32_t qm_lop(uint32_t v, uint32_t m) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(v), "r"(m), "r"(0x64006400u));
  return r;
}
/* the 8 nibbles of w as f16x2 pairs (e, e + 4), each s q + b rounded once: nibbles 0 and 2 come out as
 * 1024 + q (half(0x6400 | v) = 1024 + v, exact; minus 1024: q), nibbles 1 and 3 as 1024 + 16 q (times
 * 1/16 minus 64: q), both exact, so one shift, four lop3 and eight half2 operations make the 8 weights */
static __device__ __forceinline__ void qm_dq(uint32_t w, __half2 s, __half2 b, uint32_t o[4]) {
  const __half2 k1024 = __float2half2_rn(1024.f), k16 = __float2half2_rn(1.f / 16), km64 = __float2half2_rn(-64.f);
  const uint32_t h = w >> 8;
  const uint32_t v[4] = {qm_lop(w, 0x000F000Fu), qm_lop(w, 0x00F000F0u), qm_lop(h, 0x000F000Fu), qm_lop(h, 0x00F000F0u)};
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const __half2 q = e & 1 ? __hfma2(*(const __half2 *)&v[e], k16, km64) : __hsub2(*(const __half2 *)&v[e], k1024);
    const __half2 r = __hfma2(q, s, b);
    o[e] = *(const uint32_t *)&r;
  }
}

/* the 8 E2M1 codes of an mxfp4 word as f16x2 pairs (e, e + 4), times s: a code's sign bit to bit 15 and
 * its 3 exponent and mantissa bits to bits 11-9 make the f16 of its value times 2^-14 (exact, 0.5 a
 * subnormal), so s carries the 2^14 */
static __device__ __forceinline__ void qm_dq_fp4(uint32_t w, __half2 s, uint32_t o[4]) {
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const uint32_t t = w >> (4 * e);
    const uint32_t h = ((t << 12) & 0x80008000u) | ((t << 9) & 0x0E000E00u);
    const __half2 r = __hmul2(*(const __half2 *)&h, s);
    o[e] = *(const uint32_t *)&r;
  }
}

#endif
