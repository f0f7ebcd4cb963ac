/* MLX's microscaling quantization codes (mxq.h). Written out here rather than taken from a library:
 * the values must be MLX's own (its E4M3 decoding has no NaN, unlike the OCP definition that libraries
 * follow), and the whole definition is a few lines. */
#include "format/mxq.h"
#include <math.h>
#include <string.h>

static const char *const k_names[SM_QMODE_COUNT] = {"affine", "mxfp4", "mxfp8", "nvfp4"};

const char *sm_qmode_name(sm_qmode m) { return (unsigned)m < SM_QMODE_COUNT ? k_names[m] : "?"; }

int sm_qmode_parse(const char *name) {
  for (int i = 0; name && i < SM_QMODE_COUNT; i++)
    if (!strcmp(name, k_names[i])) return i;
  return -1;
}

int sm_qmode_bits(sm_qmode m) { return m == SM_QMODE_MXFP8 ? 8 : m == SM_QMODE_AFFINE ? 0 : 4; }
int sm_qmode_group(sm_qmode m) { return m == SM_QMODE_NVFP4 ? 16 : m == SM_QMODE_AFFINE ? 0 : 32; }

const float sm_fp4_e2m1_lut[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float sm_fp8_e4m3_to_f32(uint8_t c) {
  /* MLX: the code's low 7 bits shifted into a half's exponent/mantissa, times 256 */
  const int e = (c >> 3) & 15, m = c & 7;
  float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
  return c & 0x80 ? -v : v;
}

float sm_e8m0_to_f32(uint8_t c) {
  /* MLX: the code as a float's exponent field (0: the denormal 2^-127; 255: +Inf) */
  uint32_t bits = c == 0 ? 0x400000u : (uint32_t)c << 23;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

float sm_mxq_scale(sm_qmode m, uint8_t c) { return m == SM_QMODE_NVFP4 ? sm_fp8_e4m3_to_f32(c) : sm_e8m0_to_f32(c); }

float sm_mxq_elem(sm_qmode m, const uint8_t *row, int64_t j) {
  if (m == SM_QMODE_MXFP8) return sm_fp8_e4m3_to_f32(row[j]);
  return sm_fp4_e2m1_lut[(row[j >> 1] >> ((j & 1) * 4)) & 15];
}

void sm_mxq_dequant_row(sm_qmode m, const uint8_t *row, const uint8_t *scales, int64_t n, float *out) {
  const int gs = sm_qmode_group(m);
  if (gs <= 0) return;
  for (int64_t j = 0; j < n; j++) out[j] = sm_mxq_scale(m, scales[j / gs]) * sm_mxq_elem(m, row, j);
}
