/* Device helpers the two batched 4-bit kernels share (cuda_qmma.cu: mma.sync; cuda_qwg.cu: wgmma):
 * copies into shared memory by cp.async, and x's conversion to f16 with a gated MLP's activation. */
#ifndef SM_CUDA_QMMA_DEV_CUH
#define SM_CUDA_QMMA_DEV_CUH
#include <cuda_fp16.h>
#include <stdint.h>
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_qmma.cuh"

/* x rounded to f16, clamped to +-65504 (as the dequantize + cuBLAS path rounds it) */
static __device__ __forceinline__ __half qm_h(float v) { return __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f)); }
/* four floats as the half x of the cuBLAS path: bf16 (round to nearest) or f16 (qm_h), packed in order */
static __device__ __forceinline__ uint2 qm_half4(float4 v, bool bf) {
  if (bf) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    return make_uint2(*(const uint32_t *)&a, *(const uint32_t *)&b);
  }
  const __half2 a = __halves2half2(qm_h(v.x), qm_h(v.y)), b = __halves2half2(qm_h(v.z), qm_h(v.w));
  return make_uint2(*(const uint32_t *)&a, *(const uint32_t *)&b);
}
/* with xu: act(v) * xu[j] (act 1 silu, 2 gelu_tanh: a gated MLP's down projection); else v */
static __device__ __forceinline__ float4 qm_act(float4 v, const float4 *xu, int64_t j, int act) {
  if (!xu) return v;
  const float4 u = __ldcg(xu + j);
  if (act == 2) return make_float4(cu_gelu_tanh(v.x) * u.x, cu_gelu_tanh(v.y) * u.y, cu_gelu_tanh(v.z) * u.z,
                                   cu_gelu_tanh(v.w) * u.w);
  return make_float4(cu_silu(v.x) * u.x, cu_silu(v.y) * u.y, cu_silu(v.z) * u.z, cu_silu(v.w) * u.w);
}

/* The wgmma kernel's x layout (cuda_qwg.cu, whose opening comment derives it): values 8j..8j+7 of the
 * four 32-value quarters of stage s (v[quarter][e]) of token tg * 8 + t8 of tile `tile` (BN tokens, nst
 * stages of QM_BK values) as the four 16-byte core-matrix rows they make. Written by k_qwg_prep and by
 * the kernels that make x for it on the way (the rmsnorm before a q/k/v or gate/up group). */
static __device__ __forceinline__ void qw_put(uint4 *xp, int64_t tile, int nst, int BN, int s, int j, int tg, int t8,
                                              const float (&v)[4][8]) {
  const int ntg = BN / 8;
  uint4 *st = xp + (tile * nst + s) * (int64_t)(BN * QM_BK / 8);
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int c = 0; c < 2; c++) {
      __half o[8];
#pragma unroll
      for (int l = 0; l < 8; l++) o[l] = qm_h(v[l >> 1][2 * h + c + 4 * (l & 1)]);
      st[(((2 * j + h) * ntg + tg) * 2 + c) * 8 + t8] = *(const uint4 *)o;
    }
}
static_assert(QM_BK == 128, "qw_half's shifts and masks take a stage as 128 values");
/* where value k of token t's row of K values lies in that layout (in halves from xp): unit (2j + h, tg, c,
 * t8) of the stage, half l = 2 quarter + e / 4 for the value's e = 2h + c + 4 (e / 4) of its 8-value group j */
static __device__ __forceinline__ int64_t qw_half(int64_t t, int k, int K, int BN) {
  const int r = k & 127, q = r >> 5, j = (r >> 3) & 3, e = r & 7, h = (e & 3) >> 1, c = e & 1;
  const int tg = (int)(t % BN) >> 3, t8 = (int)(t & 7);
  const int64_t unit = ((t / BN) * (K >> 7) + (k >> 7)) * (int64_t)(BN * 16) + (((2 * j + h) * (BN / 8) + tg) * 2 + c) * 8 + t8;
  return unit * 8 + 2 * q + (e >> 2);
}
/* token t's row of K values (row: in shared memory) in that layout, by threads tid of nth */
static __device__ __forceinline__ void qw_put_row(uint4 *xp, const float *row, int K, int64_t t, int BN, int tid,
                                                  int nth) {
  const int nst = K / QM_BK, tg = (int)(t % BN) / 8, t8 = (int)(t % 8);
  for (int u = tid; u < K / 32; u += nth) {
    const int s = u >> 2, j = u & 3;
    float v[4][8];
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
      for (int e = 0; e < 8; e++) v[q][e] = row[s * QM_BK + 32 * q + 8 * j + e];
    qw_put(xp, t / BN, nst, BN, s, j, tg, t8, v);
  }
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
/* The pipeline's prologue: the first N stages' weights are requested before the wait for the kernel
 * before (they do not depend on it), then their x, one commit group a stage (empty past the ns stages) */
template <int N, class W, class X>
static __device__ __forceinline__ void qm_prologue(int ns, const W &issue_w, const X &issue_x) {
#pragma unroll
  for (int i = 0; i < N; i++)
    if (i < ns) issue_w(i, i);
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int i = 0; i < N; i++) {
    if (i < ns) issue_x(i, i);
    qm_commit();
  }
}
#endif

#endif
