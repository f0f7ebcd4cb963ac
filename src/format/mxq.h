/* MLX's microscaling quantization modes (mx.quantize mode "mxfp4", "mxfp8", "nvfp4"): the element and
 * scale codes and their values, bit-exact with MLX's CPU and Metal dequantization
 * (mlx/backend/cpu/quantized.cpp FP4_LUT and dequantize_scale, mlx/backend/metal/kernels/fp8.h):
 *
 *   mode    elements          scale (one uint8 per group)   group
 *   mxfp4   FP4 E2M1, 4 bits  E8M0: 2^(s - 127)              32
 *   mxfp8   FP8 E4M3, 8 bits  E8M0                           32
 *   nvfp4   FP4 E2M1, 4 bits  FP8 E4M3                       16
 *
 * A weight row is cols * bits / 8 bytes, elements low nibble first (4 bits) or one byte each (8 bits);
 * the scales are [rows][cols / group] bytes; there are no biases. Dequantized value = scale * element.
 *
 * Special codes, as MLX's CPU/Metal code defines them: E8M0 0 is 2^-127 (a float denormal), E8M0 255 is
 * +Inf (so a group with that scale gives +-Inf, and NaN for zero elements); E4M3 has no Inf or NaN:
 * 0x7F is 480 and 0xFF is -480 (MLX decodes E4M3 through half precision, bits << 7, times 256).
 * (MLX's CUDA backend decodes E4M3 with __nv_fp8_e4m3 instead, for which 0x7F is NaN; smelt follows the
 * CPU/Metal definition everywhere.) */
#ifndef SM_MXQ_H
#define SM_MXQ_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  SM_QMODE_AFFINE = 0, /* MLX affine: scale * q + bias (biases tensor) */
  SM_QMODE_MXFP4,
  SM_QMODE_MXFP8,
  SM_QMODE_NVFP4,
  SM_QMODE_COUNT
} sm_qmode;

/* "affine", "mxfp4", "mxfp8", "nvfp4" */
const char *sm_qmode_name(sm_qmode m);
/* -1 when the name is not a mode */
int sm_qmode_parse(const char *name);
/* the bits and group size a microscaling mode requires (affine: 0, 0: any of MLX's) */
int sm_qmode_bits(sm_qmode m);
int sm_qmode_group(sm_qmode m);

/* values of the FP4 E2M1 codes 0..15 */
extern const float sm_fp4_e2m1_lut[16];
/* an FP8 E4M3 code's value (MLX CPU/Metal: no NaN, 0x7F = 480) */
float sm_fp8_e4m3_to_f32(uint8_t c);
/* an E8M0 scale code's value: 2^(c - 127), 0 -> 2^-127, 255 -> +Inf */
float sm_e8m0_to_f32(uint8_t c);
/* the scale of a group of mode m (E8M0, or E4M3 for nvfp4) */
float sm_mxq_scale(sm_qmode m, uint8_t c);
/* element j of a row of mode m (before the scale) */
float sm_mxq_elem(sm_qmode m, const uint8_t *row, int64_t j);
/* n dequantized values of row (codes) with its scale codes: out[j] = scale[j / group] * elem[j] (float) */
void sm_mxq_dequant_row(sm_qmode m, const uint8_t *row, const uint8_t *scales, int64_t n, float *out);

#ifdef __cplusplus
}
#endif
#endif
