/* MLX's microscaling weights on the device (format/mxq.h: mxfp4, mxfp8, nvfp4): the cu_weight layout
 * CW_MXQ keeps the checkpoint's bytes (rows of cols * bits / 8 bytes of codes, low nibble first; sb: the
 * uint8 scale codes [rows][cols / gs]), and these decoders give the values MLX's CPU and Metal code give
 * them (E4M3 without NaN: 0x7F is 480; E8M0 0 is 2^-127, 255 +Inf). The kernels (dequantization to f16
 * for the GEMM path) are in cuda_mxq.cu; matvecs go through the row kernels of cuda_moe.cu. */
#ifndef SM_CUDA_MXQ_CUH
#define SM_CUDA_MXQ_CUH
#include "backend/cuda/cuda_common.cuh"

static __device__ __forceinline__ float mxq_e8m0(uint32_t c) {
  return __uint_as_float(c == 0 ? 0x400000u : c << 23);
}
static __device__ __forceinline__ float mxq_e4m3(uint32_t c) {
  const uint32_t e = (c >> 3) & 15, m = c & 7;
  const float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
  return c & 0x80 ? -v : v;
}
static __device__ __forceinline__ float mxq_fp4(uint32_t c) {
  const uint32_t e = (c >> 1) & 3, m = c & 1;
  const float v = e ? __uint_as_float(((e + 126u) << 23) | (m << 22)) : (m ? 0.5f : 0.f);
  return c & 8 ? -v : v;
}
/* the 8 mxfp4 codes of a word (low nibble first) as int8 twice their value (0, 1, 2, 3, 4, 6, 8, 12 and the
 * negatives; code 8, -0, is 0): codes 0-3 in lo's bytes 0-3, 4-7 in hi's. Byte permutes look four codes up
 * at a time in the positive and the negative table, then pick by each code's sign bit. */
static __device__ __forceinline__ void mxq_fp4_i8x8(uint32_t w, int &lo, int &hi) {
  const uint32_t sel = ((w & 0x88888888u) >> 1) | 0x32103210u; /* __byte_perm reads bits 2:0 of each nibble */
  const uint32_t p0 = __byte_perm(0x03020100u, 0x0C080604u, w), n0 = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, w);
  const uint32_t p1 = __byte_perm(0x03020100u, 0x0C080604u, w >> 16), n1 = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, w >> 16);
  lo = (int)__byte_perm(p0, n0, sel);
  hi = (int)__byte_perm(p1, n1, sel >> 16);
}
/* the scale of group g of row r */
static __device__ __forceinline__ float mxq_scale(const cu_weight &w, int64_t r, int64_t g) {
  const uint32_t c = ((const uint8_t *)w.sb)[r * (w.cols / w.gs) + g];
  return w.qmode == SM_QMODE_NVFP4 ? mxq_e4m3(c) : mxq_e8m0(c);
}
/* element j of row r, dequantized */
static __device__ __forceinline__ float mxq_elem(const cu_weight &w, int64_t r, int64_t j) {
  const uint8_t *row = (const uint8_t *)w.q + r * (w.cols * w.bits / 8);
  const float e = w.bits == 8 ? mxq_e4m3(row[j]) : mxq_fp4((row[j >> 1] >> ((j & 1) * 4)) & 15);
  return mxq_scale(w, r, j / w.gs) * e;
}

/* rows [r0, r0 + nr) of a CW_MXQ weight as bf16 (exact: every value is representable) or f16 */
void cu_mxq_dequant_rows(const cu_weight *w, int64_t r0, int64_t nr, void *out, bool to_f16, cudaStream_t s);

#endif
