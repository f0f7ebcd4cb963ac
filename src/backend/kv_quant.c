/* The KV cache's row formats and the reference quantizer / dequantizer of q8_0 and q4_0 (see
 * kv_quant.h). Hand-written: llama.cpp's block formats are tied to its ggml tensors, and the layout
 * here is per head row so that attention reads a head's keys without touching the other heads'. */
#include "backend/kv_quant.h"
#include "backend/backend.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "base/base.h"

static size_t ngroups(int hd) { return ((size_t)hd + SM_KV_QGROUP - 1) / SM_KV_QGROUP; }
static size_t up(size_t n, size_t a) { return (n + a - 1) / a * a; }

size_t sm_kv_scale_offset(sm_dtype dt, int head_dim) {
  if (dt == SM_DT_Q8_0) return up((size_t)head_dim, 2);
  if (dt == SM_DT_Q4_0) return up(((size_t)head_dim + 1) / 2, 2);
  return 0;
}

size_t sm_kv_head_bytes(sm_dtype dt, int head_dim) {
  if (head_dim <= 0) return 0;
  switch (dt) {
    case SM_DT_F32: return 4 * (size_t)head_dim;
    case SM_DT_F16:
    case SM_DT_BF16: return 2 * (size_t)head_dim;
    case SM_DT_Q8_0:
    case SM_DT_Q4_0: return up(sm_kv_scale_offset(dt, head_dim) + 2 * ngroups(head_dim), 4);
    default: return 0;
  }
}

const char *sm_kv_dtype_name(sm_dtype dt) {
  switch (dt) {
    case SM_DT_F32: return "f32";
    case SM_DT_F16: return "f16";
    case SM_DT_BF16: return "bf16";
    case SM_DT_Q8_0: return "q8_0";
    case SM_DT_Q4_0: return "q4_0";
    default: return "?";
  }
}

static const sm_dtype k_of_type[] = {[SMELT_KV_F16] = SM_DT_F16,
                                     [SMELT_KV_BF16] = SM_DT_BF16,
                                     [SMELT_KV_F32] = SM_DT_F32,
                                     [SMELT_KV_Q8_0] = SM_DT_Q8_0,
                                     [SMELT_KV_Q4_0] = SM_DT_Q4_0};
sm_dtype sm_kv_dtype_of(smelt_kv_type t) {
  return (unsigned)t < sizeof k_of_type / sizeof k_of_type[0] ? k_of_type[t] : SM_DT_COUNT;
}
smelt_kv_type sm_kv_type_of(sm_dtype dt) {
  for (unsigned i = 0; i < sizeof k_of_type / sizeof k_of_type[0]; i++)
    if (k_of_type[i] == dt) return (smelt_kv_type)i;
  return SMELT_KV_F16;
}

/* the scale as stored (f16), finite: a group beyond the f16 range saturates its codes (NaN: the
 * largest scale) */
static uint16_t scale16(float d) { return sm_f32_to_f16(copysignf(fminf(fabsf(d), 65504.f), d)); }

void sm_kv_quantize_row(void *dst, sm_dtype dt, const float *x, int head_dim) {
  uint8_t *row = dst;
  const size_t so = sm_kv_scale_offset(dt, head_dim), ng = ngroups(head_dim);
  memset(row, 0, sm_kv_head_bytes(dt, head_dim));
  for (size_t g = 0; g < ng; g++) {
    const int i0 = (int)g * SM_KV_QGROUP, i1 = SM_MIN(i0 + SM_KV_QGROUP, head_dim);
    float amax = 0.f, mx = 0.f;
    for (int i = i0; i < i1; i++)
      if (fabsf(x[i]) > amax) {
        amax = fabsf(x[i]);
        mx = x[i];
      }
    uint16_t s16;
    if (dt == SM_DT_Q8_0) {
      s16 = scale16(amax / 127.f);
      const float d = sm_f16_to_f32(s16), id = d > 0.f ? 1.f / d : 0.f;
      for (int i = i0; i < i1; i++) {
        float q = rintf(x[i] * id);
        q = q > 127.f ? 127.f : q < -127.f ? -127.f : q == q ? q : 0.f; /* NaN: 0 */
        ((int8_t *)row)[i] = (int8_t)q;
      }
    } else {
      /* d = -mx/8: mx maps to code 0 (-8 d) exactly; the other sign reaches +7 d */
      const float dr = -mx / 8.f;
      s16 = scale16(dr);
      const float d = sm_f16_to_f32(s16), id = d != 0.f ? 1.f / d : 0.f;
      for (int i = i0; i < i1; i++) {
        float q = rintf(x[i] * id) + 8.f;
        q = q > 15.f ? 15.f : q < 0.f ? 0.f : q == q ? q : 8.f; /* NaN: 0 */
        row[i / 2] |= (uint8_t)((unsigned)q << (4 * (i & 1)));
      }
    }
    memcpy(row + so + 2 * g, &s16, 2);
  }
}

void sm_kv_dequantize_tail(float *out, const void *src, sm_dtype dt, int head_dim, int i0) {
  const uint8_t *row = src;
  const size_t so = sm_kv_scale_offset(dt, head_dim);
  for (int g0 = i0 - i0 % SM_KV_QGROUP; g0 < head_dim; g0 += SM_KV_QGROUP) {
    uint16_t s16;
    memcpy(&s16, row + so + 2 * (size_t)(g0 / SM_KV_QGROUP), 2);
    const float d = sm_f16_to_f32(s16);
    const int i1 = SM_MIN(g0 + SM_KV_QGROUP, head_dim);
    if (dt == SM_DT_Q8_0)
      for (int i = SM_MAX(g0, i0); i < i1; i++) out[i] = (float)((const int8_t *)row)[i] * d;
    else
      for (int i = SM_MAX(g0, i0); i < i1; i++) out[i] = (float)((int)((row[i / 2] >> (4 * (i & 1))) & 15) - 8) * d;
  }
}

void sm_kv_dequantize_row(float *out, const void *src, sm_dtype dt, int head_dim) {
  sm_kv_dequantize_tail(out, src, dt, head_dim, 0);
}

size_t sm_kv_row_bytes(const sm_kv_cache *kv, int layer) {
  const int nkv = kv->layer_kv_heads ? kv->layer_kv_heads[layer] : kv->n_kv_heads;
  const int hd = kv->layer_head_dim ? kv->layer_head_dim[layer] : kv->head_dim;
  return (size_t)nkv * sm_kv_head_bytes(kv->dtype, hd);
}
