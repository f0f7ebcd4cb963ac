/* sm_weight helpers shared by all backends: row views and the reference dequantizer (affine, and the
 * microscaling modes of format/mxq.h). */
#include "backend/backend.h"
#include <string.h>

static size_t dt_size(sm_dtype t) {
  switch (t) {
    case SM_DT_F32: return 4;
    case SM_DT_F16:
    case SM_DT_BF16: return 2;
    case SM_DT_U8: return 1;
    default: return 0;
  }
}

sm_weight sm_weight_rows(const sm_weight *w, int64_t r0, int64_t n) {
  sm_weight v = *w;
  v.dev = NULL;
  v.stacked = false;
  if (r0 < 0 || n < 0 || r0 + n > w->rows) {
    v.rows = 0;
    return v;
  }
  v.rows = n;
  size_t es = dt_size(w->dtype);
  if (w->bits == 0) {
    v.data = (const uint8_t *)w->data + (size_t)r0 * (size_t)w->cols * es;
  } else {
    v.data = (const uint8_t *)w->data + (size_t)r0 * (size_t)w->cols * (size_t)w->bits / 8;
    size_t ng = w->group_size > 0 ? (size_t)(w->cols / w->group_size) : 0;
    v.scales = (const uint8_t *)w->scales + (size_t)r0 * ng * es;
    if (w->biases) v.biases = (const uint8_t *)w->biases + (size_t)r0 * ng * es;
  }
  return v;
}

static inline float load_f(const void *p, size_t i, sm_dtype t) {
  switch (t) {
    case SM_DT_F32: return ((const float *)p)[i];
    case SM_DT_F16: return sm_f16_to_f32(((const uint16_t *)p)[i]);
    case SM_DT_BF16: return sm_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return 0.f;
  }
}

void sm_weight_row_f32(const sm_weight *w, int64_t r, float *out) {
  int64_t cols = w->cols;
  if (r < 0 || r >= w->rows) {
    memset(out, 0, (size_t)cols * sizeof(float));
    return;
  }
  if (w->bits == 0) {
    for (int64_t j = 0; j < cols; j++) out[j] = load_f(w->data, (size_t)(r * cols + j), w->dtype);
    return;
  }
  int bits = w->bits, gs = w->group_size;
  if (gs <= 0 || bits < 1 || bits > 8) {
    memset(out, 0, (size_t)cols * sizeof(float));
    return;
  }
  if (w->qmode != SM_QMODE_AFFINE) {
    sm_mxq_dequant_row((sm_qmode)w->qmode, (const uint8_t *)w->data + (size_t)r * (size_t)cols * (size_t)bits / 8,
                       (const uint8_t *)w->scales + (size_t)r * (size_t)(cols / gs), cols, out);
    return;
  }
  const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)cols * (size_t)bits / 8;
  int64_t ng = cols / gs;
  uint32_t mask = (1u << bits) - 1;
  for (int64_t g = 0; g < ng; g++) {
    float s = load_f(w->scales, (size_t)(r * ng + g), w->dtype);
    float b = w->biases ? load_f(w->biases, (size_t)(r * ng + g), w->dtype) : 0.f;
    for (int64_t j = g * gs; j < (g + 1) * gs; j++) {
      uint64_t bit = (uint64_t)j * (uint64_t)bits;
      uint32_t v = row[bit >> 3];
      if ((bit & 7) + (uint64_t)bits > 8) v |= (uint32_t)row[(bit >> 3) + 1] << 8;
      uint32_t q = (v >> (bit & 7)) & mask;
      out[j] = s * (float)q + b;
    }
  }
}
