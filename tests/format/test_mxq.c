/* MLX's microscaling modes (format/mxq.h) on hand-built codes and blocks, with the values MLX's CPU and
 * Metal code gives them (mlx/backend/cpu/quantized.cpp FP4_LUT and dequantize_scale, mlx/backend/metal/
 * kernels/fp8.h): E8M0 is 2^(c - 127) with 0 the denormal 2^-127 and 255 +Inf; E4M3 decodes through half
 * precision ((c & 127) << 7 as half bits, times 256), so 0x7F is 480, not NaN; FP4 E2M1 is the LUT
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; a row packs two FP4 codes a byte, low nibble first. The
 * expected values below are written from those definitions, as powers of two, not computed by the code
 * under test. Also the config.json side: mode per module, MLX's per-mode bits and group sizes, errors. */
#include <math.h>
#include <string.h>
#include "format/config.h"
#include "format/mxq.h"
#include "../test_util.h"

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void test_codes(void) {
  /* E8M0 scales */
  CHECK(bits_of(sm_e8m0_to_f32(0)) == 0x00400000u, "e8m0 0 -> 2^-127 (float denormal), got %a", sm_e8m0_to_f32(0));
  CHECK(sm_e8m0_to_f32(1) == ldexpf(1.f, -126), "e8m0 1");
  CHECK(sm_e8m0_to_f32(127) == 1.f, "e8m0 127");
  CHECK(sm_e8m0_to_f32(128) == 2.f, "e8m0 128");
  CHECK(sm_e8m0_to_f32(120) == 0.0078125f, "e8m0 120 = 2^-7");
  CHECK(sm_e8m0_to_f32(254) == ldexpf(1.f, 127), "e8m0 254");
  CHECK(isinf(sm_e8m0_to_f32(255)) && sm_e8m0_to_f32(255) > 0, "e8m0 255 -> +Inf (MLX), got %g", sm_e8m0_to_f32(255));
  /* E4M3 */
  CHECK(sm_fp8_e4m3_to_f32(0x00) == 0.f && !signbit(sm_fp8_e4m3_to_f32(0x00)), "e4m3 +0");
  CHECK(sm_fp8_e4m3_to_f32(0x80) == 0.f && signbit(sm_fp8_e4m3_to_f32(0x80)), "e4m3 -0");
  CHECK(sm_fp8_e4m3_to_f32(0x01) == 0.001953125f, "e4m3 0x01 = 2^-9 (smallest denormal)");
  CHECK(sm_fp8_e4m3_to_f32(0x07) == 7 * 0.001953125f, "e4m3 0x07 = 7 * 2^-9");
  CHECK(sm_fp8_e4m3_to_f32(0x08) == 0.015625f, "e4m3 0x08 = 2^-6 (smallest normal)");
  CHECK(sm_fp8_e4m3_to_f32(0x38) == 1.f, "e4m3 0x38 = 1");
  CHECK(sm_fp8_e4m3_to_f32(0x3C) == 1.5f, "e4m3 0x3C = 1.5");
  CHECK(sm_fp8_e4m3_to_f32(0xB8) == -1.f, "e4m3 0xB8 = -1");
  CHECK(sm_fp8_e4m3_to_f32(0x7E) == 448.f, "e4m3 0x7E = 448");
  CHECK(sm_fp8_e4m3_to_f32(0x7F) == 480.f, "e4m3 0x7F = 480 in MLX (no NaN), got %g", sm_fp8_e4m3_to_f32(0x7F));
  CHECK(sm_fp8_e4m3_to_f32(0xFF) == -480.f, "e4m3 0xFF = -480");
  CHECK(sm_fp8_e4m3_to_f32(0x78) == 256.f, "e4m3 0x78 = 256");
  /* FP4 E2M1 */
  static const float want[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int c = 0; c < 16; c++) {
    const float v = sm_fp4_e2m1_lut[c], w = c & 8 ? -want[c & 7] : want[c & 7];
    CHECK(v == w && signbit(v) == signbit(w), "fp4 code %d: %g, want %g", c, v, w);
  }
  /* names and per-mode shapes */
  CHECK(sm_qmode_parse("mxfp4") == SM_QMODE_MXFP4 && sm_qmode_parse("nvfp4") == SM_QMODE_NVFP4 &&
          sm_qmode_parse("mxfp8") == SM_QMODE_MXFP8 && sm_qmode_parse("affine") == SM_QMODE_AFFINE &&
          sm_qmode_parse("fp4") == -1,
        "mode names");
  CHECK(sm_qmode_bits(SM_QMODE_MXFP4) == 4 && sm_qmode_group(SM_QMODE_MXFP4) == 32 &&
          sm_qmode_bits(SM_QMODE_MXFP8) == 8 && sm_qmode_group(SM_QMODE_MXFP8) == 32 &&
          sm_qmode_bits(SM_QMODE_NVFP4) == 4 && sm_qmode_group(SM_QMODE_NVFP4) == 16,
        "mode shapes");
}

static void test_rows(void) {
  /* mxfp4: 64 elements, two groups; element j of group 0 has code j % 16 (bytes: low nibble = even j) */
  uint8_t row[32], sc[2] = {129, 0}; /* 4, and 2^-127 */
  for (int b = 0; b < 16; b++) row[b] = (uint8_t)((2 * b) % 16 | (((2 * b + 1) % 16) << 4));
  for (int b = 16; b < 32; b++) row[b] = 0x07 | 0x10; /* 6.0, then 0.5 */
  float out[64];
  sm_mxq_dequant_row(SM_QMODE_MXFP4, row, sc, 64, out);
  static const float lut[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  bool ok = true;
  for (int j = 0; j < 32; j++) ok &= out[j] == 4.f * lut[j % 16];
  CHECK(ok, "mxfp4 group 0 (scale 4)");
  CHECK(out[1] == 2.f && out[2] == 4.f && out[15] == -24.f, "mxfp4 nibble order: %g %g %g", out[1], out[2], out[15]);
  /* scale 2^-127 times 6 = 1.5 * 2^-125 and times 0.5 = 2^-128: float denormals, exact */
  CHECK(out[32] == ldexpf(1.5f, -125) && out[33] == ldexpf(1.f, -128), "mxfp4 denormal scale: %a %a", out[32], out[33]);
  /* scale code 255: +Inf times the elements: NaN for 0, +-Inf otherwise */
  uint8_t r2[16] = {0x90, 0x21}, s255 = 255;
  float o2[32];
  sm_mxq_dequant_row(SM_QMODE_MXFP4, r2, &s255, 32, o2);
  CHECK(isnan(o2[0]) && isinf(o2[1]) && o2[1] < 0 && isinf(o2[2]) && o2[2] > 0, "mxfp4 Inf scale: %g %g %g", o2[0],
        o2[1], o2[2]);
  /* nvfp4: groups of 16, E4M3 scales (0x7F = 480, 0x01 = 2^-9) */
  uint8_t r3[16], s3[2] = {0x7F, 0x01};
  memset(r3, 0x77, sizeof r3); /* 6, 6 */
  float o3[32];
  sm_mxq_dequant_row(SM_QMODE_NVFP4, r3, s3, 32, o3);
  CHECK(o3[0] == 2880.f && o3[15] == 2880.f && o3[16] == 6.f * 0.001953125f, "nvfp4: %g %g %g", o3[0], o3[15], o3[16]);
  /* mxfp8: E4M3 elements times E8M0 scales */
  uint8_t r4[32], s4 = 124; /* 2^-3 */
  for (int j = 0; j < 32; j++) r4[j] = (uint8_t)(j == 0 ? 0x7F : j == 1 ? 0xB8 : j == 2 ? 0x01 : 0x38);
  float o4[32];
  sm_mxq_dequant_row(SM_QMODE_MXFP8, r4, &s4, 32, o4);
  CHECK(o4[0] == 60.f && o4[1] == -0.125f && o4[2] == ldexpf(1.f, -12) && o4[3] == 0.125f, "mxfp8: %g %g %a %g", o4[0],
        o4[1], o4[2], o4[3]);
  CHECK(sm_mxq_elem(SM_QMODE_MXFP4, row, 3) == 1.5f && sm_mxq_scale(SM_QMODE_NVFP4, 0x38) == 1.f, "elem / scale");
}

static smelt_status parse(const char *js, sm_config *c) { return sm_config_parse(js, strlen(js), NULL, 0, NULL, c); }

#define BASE \
  "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2," \
  " \"num_attention_heads\": 4, \"vocab_size\": 100, "

static void test_config(void) {
  sm_config c;
  int b, g, md;
  /* gpt-oss MXFP4-Q8 as mlx-lm writes it: affine 8-bit by default, the experts mxfp4 */
  CHECK(parse(BASE "\"quantization\": {\"group_size\": 64, \"bits\": 8, \"mode\": \"affine\","
                   " \"model.layers.0.mlp.experts.gate_proj\": {\"group_size\": 32, \"bits\": 4, \"mode\": \"mxfp4\"},"
                   " \"model.layers.1.mlp.experts.down_proj\": {\"mode\": \"nvfp4\"}, \"lm_head\": false}}",
              &c) == SMELT_OK,
        "parse mixed modes: %s", sm_errmsg());
  sm_config_quant_mode_for(&c, "model.layers.0.self_attn.q_proj", &b, &g, &md);
  CHECK(b == 8 && g == 64 && md == SM_QMODE_AFFINE, "default module: %d %d %d", b, g, md);
  sm_config_quant_mode_for(&c, "model.layers.0.mlp.experts.gate_proj.weight", &b, &g, &md);
  CHECK(b == 4 && g == 32 && md == SM_QMODE_MXFP4, "mxfp4 module: %d %d %d", b, g, md);
  sm_config_quant_mode_for(&c, "model.layers.1.mlp.experts.down_proj", &b, &g, &md);
  CHECK(b == 4 && g == 16 && md == SM_QMODE_NVFP4, "nvfp4 module with MLX's defaults of the mode: %d %d %d", b, g, md);
  sm_config_quant_mode_for(&c, "lm_head", &b, &g, &md);
  CHECK(b == 0 && g == 0 && md == 0, "unquantized module");
  sm_config_free(&c);
  /* an entry without a mode is affine, whatever the default mode (MLX's to_quantized(**entry)), and its
   * missing bits / group size are that mode's defaults, not the block's */
  CHECK(parse(BASE "\"quantization\": {\"group_size\": 32, \"bits\": 4, \"mode\": \"mxfp4\","
                   " \"model.embed_tokens\": {\"group_size\": 64, \"bits\": 8}, \"lm_head\": {\"bits\": 6}}}",
              &c) == SMELT_OK,
        "parse: %s", sm_errmsg());
  sm_config_quant_mode_for(&c, "model.embed_tokens", &b, &g, &md);
  CHECK(b == 8 && g == 64 && md == SM_QMODE_AFFINE, "entry without a mode: %d %d %d", b, g, md);
  sm_config_quant_mode_for(&c, "lm_head", &b, &g, &md);
  CHECK(b == 6 && g == 64 && md == SM_QMODE_AFFINE, "entry without a mode or group size: %d %d %d", b, g, md);
  sm_config_quant_mode_for(&c, "model.layers.0.mlp.up_proj", &b, &g, &md);
  CHECK(b == 4 && g == 32 && md == SM_QMODE_MXFP4, "default mode: %d %d %d", b, g, md);
  sm_config_free(&c);
  /* a model quantized all in one mode; its defaults */
  CHECK(parse(BASE "\"quantization\": {\"mode\": \"mxfp8\"}}", &c) == SMELT_OK, "mxfp8: %s", sm_errmsg());
  CHECK(c.q_mode == SM_QMODE_MXFP8 && c.q_bits == 8 && c.q_group_size == 32, "mxfp8 defaults %d %d %d", c.q_mode,
        c.q_bits, c.q_group_size);
  sm_config_free(&c);
  /* errors: a mode's bits / group size, unknown modes, at the top and per module */
  static const char *bad[] = {
    BASE "\"quantization\": {\"mode\": \"mxfp4\", \"group_size\": 64, \"bits\": 4}}",
    BASE "\"quantization\": {\"mode\": \"nvfp4\", \"group_size\": 16, \"bits\": 8}}",
    BASE "\"quantization\": {\"mode\": \"fp6\"}}",
    BASE
    "\"quantization\": {\"bits\": 4, \"group_size\": 64, \"model.layers.0.mlp.up_proj\": {\"mode\": \"mxfp8\", \"bits\": 4}}}",
    BASE "\"quantization\": {\"bits\": 4, \"group_size\": 16}}",
  };
  static const char *want[] = {"group_size 32", "bits 4", "'fp6'", "model.layers.0.mlp.up_proj", "group_size 16"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    smelt_status st = parse(bad[i], &c);
    CHECK(st != SMELT_OK && strstr(sm_errmsg(), want[i]), "bad quantization %zu: status %d, message '%s'", i, st,
          sm_errmsg());
    if (st == SMELT_OK) sm_config_free(&c);
  }
}

int main(void) {
  test_codes();
  test_rows();
  test_config();
  TEST_END();
}
