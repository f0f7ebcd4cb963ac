/* Portable scalar kernels (fallback and reference path). */
#include "backend/cpu/cpu_internal.h"
#include "backend/kv_quant.h"
#include <math.h>
#include <string.h>

#define PANEL 8

static void prep_x(const sm_weight *w, const float *x, float *xp, float *xsum) {
  int64_t K = w->cols;
  memcpy(xp, x, (size_t)K * sizeof(float));
  if (w->bits == 0) return;
  int gs = w->group_size;
  for (int64_t g = 0; g < K / gs; g++) {
    float s = 0.f;
    for (int j = 0; j < gs; j++) s += x[g * gs + j];
    xsum[g] = s;
  }
}

static void matvec(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols;
  if (w->bits == 0) {
    for (int64_t r = r0; r < r1; r++) {
      float s = 0.f;
      size_t base = (size_t)(r * K);
      if (w->dtype == SM_DT_F32) {
        const float *row = (const float *)w->data + base;
        for (int64_t k = 0; k < K; k++) s += row[k] * a->xp[k];
      } else {
        for (int64_t k = 0; k < K; k++) s += sm_cpu_ldf(w->data, base + (size_t)k, w->dtype) * a->xp[k];
      }
      y[r - r0] = s;
    }
    return;
  }
  const int bits = w->bits;
  const int64_t gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K * (size_t)bits / 8;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    float tot = 0.f;
    for (int64_t g = 0; g < ng; g++) {
      float acc = 0.f;
      const float *xg = a->xp + g * gs;
      if (bits == 4) {
        const uint8_t *q = row + g * gs / 2;
        for (int64_t j = 0; j < gs / 2; j++) acc += (float)(q[j] & 15) * xg[2 * j] + (float)(q[j] >> 4) * xg[2 * j + 1];
      } else if (bits == 8) {
        const uint8_t *q = row + g * gs;
        for (int64_t j = 0; j < gs; j++) acc += (float)q[j] * xg[j];
      } else {
        for (int64_t j = 0; j < gs; j++) acc += (float)sm_cpu_getq(row, g * gs + j, bits) * xg[j];
      }
      size_t si = (size_t)(r * ng + g);
      tot += sm_cpu_ldf(w->scales, si, w->dtype) * acc;
      if (w->biases) tot += sm_cpu_ldf(w->biases, si, w->dtype) * a->xsum[g];
    }
    y[r - r0] = tot;
  }
}

static void deq_range(const sm_weight *w, int64_t r, int64_t k0, int kc, float *out) {
  const int64_t K = w->cols;
  if (w->bits == 0) {
    for (int k = 0; k < kc; k++) out[k] = sm_cpu_ldf(w->data, (size_t)(r * K + k0 + k), w->dtype);
    return;
  }
  const int64_t gs = w->group_size, ng = K / gs;
  const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)K * (size_t)w->bits / 8;
  for (int k = 0; k < kc; k++) {
    int64_t kk = k0 + k;
    size_t si = (size_t)(r * ng + kk / gs);
    float s = sm_cpu_ldf(w->scales, si, w->dtype), b = w->biases ? sm_cpu_ldf(w->biases, si, w->dtype) : 0.f;
    out[k] = s * (float)sm_cpu_getq(row, kk, w->bits) + b;
  }
}

static void pack_panel(const sm_weight *w, int64_t r0, int nr, int64_t k0, int kc, float *dst, float *tmp) {
  for (int rr = 0; rr < PANEL; rr++) {
    if (rr < nr) deq_range(w, r0 + rr, k0, kc, tmp + (size_t)rr * kc);
    else memset(tmp + (size_t)rr * kc, 0, (size_t)kc * sizeof(float));
  }
  for (int k = 0; k < kc; k++)
    for (int rr = 0; rr < PANEL; rr++) dst[(size_t)k * PANEL + rr] = tmp[(size_t)rr * kc + k];
}

static void gemm_panel(const float *P, int kc, const float *x, int64_t ldx, int nt, float *y, int64_t ldy, int nr) {
  for (int t = 0; t < nt; t++) {
    float acc[PANEL];
    for (int r = 0; r < PANEL; r++) acc[r] = r < nr ? y[t * ldy + r] : 0.f;
    const float *xt = x + t * ldx;
    for (int k = 0; k < kc; k++) {
      float xv = xt[k];
      for (int r = 0; r < PANEL; r++) acc[r] += xv * P[(size_t)k * PANEL + r];
    }
    for (int r = 0; r < nr; r++) y[t * ldy + r] = acc[r];
  }
}

static float dot(const float *a, const float *b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}
static void axpy(float *y, float a, const float *x, int n) {
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}
static void scal(float *y, float a, int n) {
  for (int i = 0; i < n; i++) y[i] *= a;
}

static void silu_mul(float *out, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = g[i];
    out[i] = v / (1.f + expf(-v)) * u[i];
  }
}
static void gelu_mul(float *out, const float *g, const float *u, size_t n) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  for (size_t i = 0; i < n; i++) {
    float v = g[i];
    out[i] = 0.5f * v * (1.f + tanhf(k0 * (v + k1 * v * v * v))) * u[i];
  }
}
static void softcap(float *y, float cap, size_t n) {
  float inv = 1.f / cap;
  for (size_t i = 0; i < n; i++) y[i] = cap * tanhf(y[i] * inv);
}

static void widen(float *out, const void *src, sm_dtype dt, size_t n) {
  const uint16_t *s = src;
  if (sm_kv_quantized(dt)) sm_kv_dequantize_row(out, src, dt, (int)n);
  else if (dt == SM_DT_F16)
    for (size_t i = 0; i < n; i++) out[i] = sm_f16_to_f32(s[i]);
  else
    for (size_t i = 0; i < n; i++) out[i] = sm_bf16_to_f32(s[i]);
}

static void narrow(void *dst, const float *x, sm_dtype dt, size_t n) {
  uint16_t *d = dst;
  if (dt == SM_DT_F16)
    for (size_t i = 0; i < n; i++) d[i] = sm_f32_to_f16(x[i]);
  else
    for (size_t i = 0; i < n; i++) d[i] = sm_f32_to_bf16(x[i]);
}

const sm_cpu_kern sm_cpu_kern_scalar = {
  .name = "scalar",
  .panel = PANEL,
  .prep_x = prep_x,
  .matvec = matvec,
  .pack_panel = pack_panel,
  .gemm_panel = gemm_panel,
  .dot = dot,
  .axpy = axpy,
  .scal = scal,
  .silu_mul = silu_mul,
  .gelu_mul = gelu_mul,
  .softcap = softcap,
  .widen = widen,
  .narrow = narrow,
};

#if defined(__x86_64__)
static bool has_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("bmi2");
}
static bool has_avx512(void) {
  __builtin_cpu_init();
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
const sm_cpu_kern *sm_cpu_kernels_by_name(const char *name) {
  if (!strcmp(name, "scalar")) return &sm_cpu_kern_scalar;
  if (!strcmp(name, "avx2")) return has_avx2() ? &sm_cpu_kern_avx2 : NULL;
  if (!strcmp(name, "avx512")) return has_avx512() ? &sm_cpu_kern_avx512 : NULL;
  return NULL;
}
bool sm_cpu_has_gfni(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("gfni");
}
const sm_cpu_kern *sm_cpu_best_kernels(void) {
  if (has_avx512()) return &sm_cpu_kern_avx512;
  if (has_avx2()) return &sm_cpu_kern_avx2;
  return &sm_cpu_kern_scalar;
}
#else
const sm_cpu_kern *sm_cpu_kernels_by_name(const char *name) {
  return !strcmp(name, "scalar") ? &sm_cpu_kern_scalar : NULL;
}
bool sm_cpu_has_gfni(void) { return false; }
const sm_cpu_kern *sm_cpu_best_kernels(void) { return &sm_cpu_kern_scalar; }
#endif
