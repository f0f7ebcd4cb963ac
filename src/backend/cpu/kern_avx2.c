/* AVX2 + FMA + F16C kernels (run-time selected). */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#include "backend/cpu/cpu_internal.h"
#include "backend/kv_quant.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>
#ifndef SM_PF_DIST
#define SM_PF_DIST 2048
#endif

static inline float ldsc(const void *p, size_t i, sm_dtype t) {
  switch (t) {
    case SM_DT_F32: return ((const float *)p)[i];
    case SM_DT_F16: return _cvtsh_ss(((const uint16_t *)p)[i]);
    case SM_DT_BF16: {
      union {
        uint32_t u;
        float f;
      } v;
      v.u = (uint32_t)((const uint16_t *)p)[i] << 16;
      return v.f;
    }
    default: return 0.f;
  }
}
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline __m256i tailmask(int n) { /* first n lanes (0..8) */
  static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256((const __m256i *)(m + 8 - n));
}

static void prep_x(const sm_weight *w, const float *x, float *xp, float *xsum) {
  int64_t K = w->cols;
  if (w->bits == 0) {
    memcpy(xp, x, (size_t)K * sizeof(float));
    return;
  }
  int gs = w->group_size;
  for (int64_t g = 0; g < K / gs; g++) {
    __m256 s = _mm256_setzero_ps();
    for (int j = 0; j < gs; j += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(x + g * gs + j));
    xsum[g] = hsum(s);
  }
  if (w->bits == 4) {
    for (int64_t b = 0; b < K; b += 16)
      for (int j = 0; j < 8; j++) {
        xp[b + j] = x[b + 2 * j];
        xp[b + 8 + j] = x[b + 2 * j + 1];
      }
  } else if (w->bits == 2) {
    for (int64_t b = 0; b < K; b += 16)
      for (int j = 0; j < 4; j++)
        for (int s = 0; s < 4; s++) xp[b + s * 4 + j] = x[b + 4 * j + s];
  } else {
    memcpy(xp, x, (size_t)K * sizeof(float));
  }
}

/* generic: 8 b-bit values in natural order from p (8 readable bytes) */
typedef struct {
  __m128i ctrl;
  __m256i shift, mask;
} gen_unpack;
static inline gen_unpack gen_init(int bits) {
  gen_unpack u;
  uint8_t c[16];
  int32_t sh[8];
  for (int i = 0; i < 8; i++) {
    int off = (i * bits) >> 3;
    c[2 * i] = (uint8_t)off;
    c[2 * i + 1] = (uint8_t)(off + 1);
    sh[i] = (i * bits) & 7;
  }
  u.ctrl = _mm_loadu_si128((const __m128i *)c);
  u.shift = _mm256_loadu_si256((const __m256i *)sh);
  u.mask = _mm256_set1_epi32((1 << bits) - 1);
  return u;
}
static inline __m256 gen_load8(const gen_unpack *u, const uint8_t *p) {
  __m128i b = _mm_loadl_epi64((const __m128i *)p);
  __m256i w = _mm256_cvtepu16_epi32(_mm_shuffle_epi8(b, u->ctrl));
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, u->shift), u->mask));
}

static void mv_q4(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K / 2;
  const __m256i m4 = _mm256_set1_epi32(15);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * rb;
    const float *xp = a->xp;
    __m256 tot = _mm256_setzero_ps();
    float bsum = 0.f;
    for (int64_t g = 0; g < ng; g++) {
      _mm_prefetch((const char *)q + SM_PF_DIST, _MM_HINT_T0);
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      for (int j = 0; j < gs; j += 16) {
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, m4)), _mm256_loadu_ps(xp), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), _mm256_loadu_ps(xp + 8), a1);
        q += 8;
        xp += 16;
      }
      size_t si = (size_t)(r * ng + g);
      tot = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(ldsc(w->scales, si, w->dtype)), tot);
      if (w->biases) bsum += ldsc(w->biases, si, w->dtype) * a->xsum[g];
    }
    y[r - r0] = hsum(tot) + bsum;
  }
}

static void mv_q2(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K / 4;
  const __m256i m2 = _mm256_set1_epi32(3);
  const __m256i shA = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), shB = _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * rb;
    const float *xp = a->xp;
    __m256 tot = _mm256_setzero_ps();
    float bsum = 0.f;
    for (int64_t g = 0; g < ng; g++) {
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      for (int j = 0; j < gs; j += 16) {
        int32_t v;
        memcpy(&v, q, 4);
        __m256i b = _mm256_cvtepu8_epi32(_mm_set1_epi32(v));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(b, shA), m2)), _mm256_loadu_ps(xp),
                             a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(b, shB), m2)),
                             _mm256_loadu_ps(xp + 8), a1);
        q += 4;
        xp += 16;
      }
      size_t si = (size_t)(r * ng + g);
      tot = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(ldsc(w->scales, si, w->dtype)), tot);
      if (w->biases) bsum += ldsc(w->biases, si, w->dtype) * a->xsum[g];
    }
    y[r - r0] = hsum(tot) + bsum;
  }
}

static void mv_q8(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (size_t)K;
    const float *xp = a->xp;
    __m256 tot = _mm256_setzero_ps();
    float bsum = 0.f;
    for (int64_t g = 0; g < ng; g++) {
      for (int j = 0; j < gs; j += 64) _mm_prefetch((const char *)q + j + SM_PF_DIST, _MM_HINT_T0);
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      for (int j = 0; j < gs; j += 16) {
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q))),
                             _mm256_loadu_ps(xp), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)))),
                             _mm256_loadu_ps(xp + 8), a1);
        q += 16;
        xp += 16;
      }
      size_t si = (size_t)(r * ng + g);
      tot = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(ldsc(w->scales, si, w->dtype)), tot);
      if (w->biases) bsum += ldsc(w->biases, si, w->dtype) * a->xsum[g];
    }
    y[r - r0] = hsum(tot) + bsum;
  }
}

static void mv_qgen(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int bits = w->bits;
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K * (size_t)bits / 8;
  gen_unpack u = gen_init(bits);
  uint8_t tmp[16];
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    const float *xp = a->xp;
    __m256 tot = _mm256_setzero_ps();
    float bsum = 0.f;
    size_t off = 0;
    for (int64_t g = 0; g < ng; g++) {
      __m256 a0 = _mm256_setzero_ps();
      for (int j = 0; j < gs; j += 8) {
        const uint8_t *p = row + off;
        if (off + 8 > rb) {
          memset(tmp, 0, sizeof tmp);
          memcpy(tmp, p, rb - off);
          p = tmp;
        }
        a0 = _mm256_fmadd_ps(gen_load8(&u, p), _mm256_loadu_ps(xp), a0);
        off += (size_t)bits;
        xp += 8;
      }
      size_t si = (size_t)(r * ng + g);
      tot = _mm256_fmadd_ps(a0, _mm256_set1_ps(ldsc(w->scales, si, w->dtype)), tot);
      if (w->biases) bsum += ldsc(w->biases, si, w->dtype) * a->xsum[g];
    }
    y[r - r0] = hsum(tot) + bsum;
  }
}

static inline __m256 ld_dense(const void *p, int64_t i, sm_dtype t) {
  switch (t) {
    case SM_DT_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case SM_DT_BF16:
      return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
    default: return _mm256_loadu_ps((const float *)p + i);
  }
}

static void mv_dense(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols;
  const size_t es = w->dtype == SM_DT_F32 ? 4 : 2;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)K * es;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      s0 = _mm256_fmadd_ps(ld_dense(row, k, w->dtype), _mm256_loadu_ps(a->xp + k), s0);
      s1 = _mm256_fmadd_ps(ld_dense(row, k + 8, w->dtype), _mm256_loadu_ps(a->xp + k + 8), s1);
      s2 = _mm256_fmadd_ps(ld_dense(row, k + 16, w->dtype), _mm256_loadu_ps(a->xp + k + 16), s2);
      s3 = _mm256_fmadd_ps(ld_dense(row, k + 24, w->dtype), _mm256_loadu_ps(a->xp + k + 24), s3);
    }
    for (; k + 8 <= K; k += 8) s0 = _mm256_fmadd_ps(ld_dense(row, k, w->dtype), _mm256_loadu_ps(a->xp + k), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; k < K; k++) s += sm_cpu_ldf(row, (size_t)k, w->dtype) * a->xp[k];
    y[r - r0] = s;
  }
}

static void matvec(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  switch (a->w->bits) {
    case 0: mv_dense(a, r0, r1, y); break;
    case 2: mv_q2(a, r0, r1, y); break;
    case 4: mv_q4(a, r0, r1, y); break;
    case 8: mv_q8(a, r0, r1, y); break;
    default: mv_qgen(a, r0, r1, y); break;
  }
}

#define PANEL 16

static void deq_range(const sm_weight *w, int64_t r, int64_t k0, int kc, float *out) {
  const int64_t K = w->cols;
  if (w->bits == 0) {
    const size_t es = w->dtype == SM_DT_F32 ? 4 : 2;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)K * es;
    int k = 0;
    for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(out + k, ld_dense(row, k0 + k, w->dtype));
    for (; k < kc; k++) out[k] = sm_cpu_ldf(row, (size_t)(k0 + k), w->dtype);
    return;
  }
  const int bits = w->bits, gs = w->group_size;
  const int64_t ng = K / gs;
  const size_t rb = (size_t)K * (size_t)bits / 8;
  const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
  gen_unpack u = gen_init(bits);
  uint8_t tmp[16];
  for (int k = 0; k < kc; k += 8) {
    int64_t kk = k0 + k;
    size_t off = (size_t)kk * (size_t)bits / 8;
    const uint8_t *p = row + off;
    if (off + 8 > rb) {
      memset(tmp, 0, sizeof tmp);
      memcpy(tmp, p, rb - off);
      p = tmp;
    }
    size_t si = (size_t)(r * ng + kk / gs);
    float s = ldsc(w->scales, si, w->dtype), b = w->biases ? ldsc(w->biases, si, w->dtype) : 0.f;
    _mm256_storeu_ps(out + k, _mm256_fmadd_ps(gen_load8(&u, p), _mm256_set1_ps(s), _mm256_set1_ps(b)));
  }
}

static void pack_panel(const sm_weight *w, int64_t r0, int nr, int64_t k0, int kc, float *dst, float *tmp) {
  int kc8 = (kc + 7) & ~7;
  for (int rr = 0; rr < PANEL; rr++) {
    if (rr < nr) deq_range(w, r0 + rr, k0, kc, tmp + (size_t)rr * kc8);
    else memset(tmp + (size_t)rr * kc8, 0, (size_t)kc8 * sizeof(float));
  }
  for (int k = 0; k < kc; k++)
    for (int rr = 0; rr < PANEL; rr++) dst[(size_t)k * PANEL + rr] = tmp[(size_t)rr * kc8 + k];
}

static inline __attribute__((always_inline)) void gemm_micro(const float *P, int kc, const float *x, int64_t ldx,
                                                             float *y, int64_t ldy, __m256i m0, __m256i m1,
                                                             const int NT) {
  __m256 c0[6], c1[6];
#pragma GCC unroll 6
  for (int i = 0; i < NT; i++) {
    c0[i] = _mm256_maskload_ps(y + i * ldy, m0);
    c1[i] = _mm256_maskload_ps(y + i * ldy + 8, m1);
  }
  for (int k = 0; k < kc; k++) {
    __m256 w0 = _mm256_loadu_ps(P + (size_t)k * PANEL), w1 = _mm256_loadu_ps(P + (size_t)k * PANEL + 8);
#pragma GCC unroll 6
    for (int i = 0; i < NT; i++) {
      __m256 xb = _mm256_broadcast_ss(x + i * ldx + k);
      c0[i] = _mm256_fmadd_ps(w0, xb, c0[i]);
      c1[i] = _mm256_fmadd_ps(w1, xb, c1[i]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < NT; i++) {
    _mm256_maskstore_ps(y + i * ldy, m0, c0[i]);
    _mm256_maskstore_ps(y + i * ldy + 8, m1, c1[i]);
  }
}

static void gemm_panel(const float *P, int kc, const float *x, int64_t ldx, int nt, float *y, int64_t ldy, int nr) {
  __m256i m0 = tailmask(nr >= 8 ? 8 : nr), m1 = tailmask(nr >= 16 ? 8 : nr > 8 ? nr - 8 : 0);
  int t = 0;
  for (; t + 6 <= nt; t += 6) gemm_micro(P, kc, x + t * ldx, ldx, y + t * ldy, ldy, m0, m1, 6);
  switch (nt - t) {
    case 5: gemm_micro(P, kc, x + t * ldx, ldx, y + t * ldy, ldy, m0, m1, 5); break;
    case 4: gemm_micro(P, kc, x + t * ldx, ldx, y + t * ldy, ldy, m0, m1, 4); break;
    case 3: gemm_micro(P, kc, x + t * ldx, ldx, y + t * ldy, ldy, m0, m1, 3); break;
    case 2: gemm_micro(P, kc, x + t * ldx, ldx, y + t * ldy, ldy, m0, m1, 2); break;
    case 1: gemm_micro(P, kc, x + t * ldx, ldx, y + t * ldy, ldy, m0, m1, 1); break;
    default: break;
  }
}

static float dot(const float *a, const float *b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}
static void axpy(float *y, float a, const float *x, int n) {
  __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * x[i];
}
static void scal(float *y, float a, int n) {
  __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] *= a;
}

/* ---------------- elementwise (vector exp; rel. error ~2e-7) ---------------- */
static inline __m256 vexp(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040.f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline __m256 vtanh(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 ax = _mm256_andnot_ps(sign, x);
  __m256 t =
    _mm256_sub_ps(_mm256_set1_ps(1.f),
                  _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(vexp(_mm256_add_ps(ax, ax)), _mm256_set1_ps(1.f))));
  return _mm256_or_ps(t, _mm256_and_ps(x, sign));
}
static inline __m256 ld_n(const float *p, size_t n) { /* n < 8 lanes, rest 0 */
  float t[8] = {0};
  memcpy(t, p, n * sizeof(float));
  return _mm256_loadu_ps(t);
}
static inline void st_n(float *p, __m256 v, size_t n) {
  float t[8];
  _mm256_storeu_ps(t, v);
  memcpy(p, t, n * sizeof(float));
}
static inline __m256 silu8(__m256 v, __m256 u) {
  return _mm256_mul_ps(_mm256_div_ps(v,
                                     _mm256_add_ps(_mm256_set1_ps(1.f), vexp(_mm256_sub_ps(_mm256_setzero_ps(), v)))),
                       u);
}
static inline __m256 gelu8(__m256 v, __m256 u) {
  const __m256 k0 = _mm256_set1_ps(0.7978845608028654f), k1 = _mm256_set1_ps(0.044715f), h = _mm256_set1_ps(0.5f);
  __m256 in = _mm256_mul_ps(k0, _mm256_fmadd_ps(_mm256_mul_ps(k1, v), _mm256_mul_ps(v, v), v));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(h, v), _mm256_add_ps(_mm256_set1_ps(1.f), vtanh(in))), u);
}
static void silu_mul(float *out, const float *g, const float *u, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, silu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) st_n(out + i, silu8(ld_n(g + i, n - i), ld_n(u + i, n - i)), n - i);
}
static void gelu_mul(float *out, const float *g, const float *u, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, gelu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) st_n(out + i, gelu8(ld_n(g + i, n - i), ld_n(u + i, n - i)), n - i);
}
static void softcap(float *y, float cap, size_t n) {
  const __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.f / cap);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(c, vtanh(_mm256_mul_ps(_mm256_loadu_ps(y + i), inv))));
  if (i < n) st_n(y + i, _mm256_mul_ps(c, vtanh(_mm256_mul_ps(ld_n(y + i, n - i), inv))), n - i);
}

/* a q8_0 head row of n values: 8 codes at a time sign-extended, converted and scaled by their group's
 * f16 scale (the last, shorter group and a row of other lengths by the reference) */
static void widen_q8(float *out, const void *src, size_t n) {
  const int8_t *q = src;
  const uint16_t *sc = (const uint16_t *)((const char *)src + sm_kv_scale_offset(SM_DT_Q8_0, (int)n));
  size_t i = 0;
  for (; i + SM_KV_QGROUP <= n; i += SM_KV_QGROUP) {
    const __m256 d = _mm256_set1_ps(sm_f16_to_f32(sc[i / SM_KV_QGROUP]));
    for (size_t j = i; j < i + SM_KV_QGROUP; j += 8) {
      const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + j)));
      _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(w), d));
    }
  }
  sm_kv_dequantize_tail(out, src, SM_DT_Q8_0, (int)n, (int)i);
}

/* the 32 signed 4-bit values (code - 8) of 16 bytes, in order: value 2i in the low nibble of byte i */
static inline void q4_unpack32(const uint8_t *b, __m128i *v0, __m128i *v1) {
  const __m128i x = _mm_loadu_si128((const __m128i *)b), m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(x, m), e), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m), e);
  *v0 = _mm_unpacklo_epi8(lo, hi);
  *v1 = _mm_unpackhi_epi8(lo, hi);
}

/* a q4_0 head row of n values: a group of 32 from 16 bytes (a last, shorter group by the reference) */
static void widen_q4(float *out, const void *src, size_t n) {
  const uint8_t *q = src;
  const uint16_t *sc = (const uint16_t *)((const char *)src + sm_kv_scale_offset(SM_DT_Q4_0, (int)n));
  size_t i = 0;
  for (; i + SM_KV_QGROUP <= n; i += SM_KV_QGROUP) {
    const __m256 d = _mm256_set1_ps(sm_f16_to_f32(sc[i / SM_KV_QGROUP]));
    __m128i v[2];
    q4_unpack32(q + i / 2, &v[0], &v[1]);
    for (int h = 0; h < 2; h++) {
      _mm256_storeu_ps(out + i + 16 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v[h])), d));
      _mm256_storeu_ps(out + i + 16 * h + 8,
                       _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v[h], 8))), d));
    }
  }
  sm_kv_dequantize_tail(out, src, SM_DT_Q4_0, (int)n, (int)i);
}

/* F16C / shift widening of half-precision KV rows; quantized head rows dequantized */
static void widen(float *out, const void *src, sm_dtype dt, size_t n) {
  if (dt == SM_DT_Q8_0) {
    widen_q8(out, src, n);
    return;
  }
  if (dt == SM_DT_Q4_0) {
    widen_q4(out, src, n);
    return;
  }
  const uint16_t *s = src;
  size_t i = 0;
  if (dt == SM_DT_F16)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  else
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i,
                       _mm256_castsi256_ps(
                         _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i))), 16)));
  for (; i < n; i++) out[i] = dt == SM_DT_F16 ? sm_f16_to_f32(s[i]) : sm_bf16_to_f32(s[i]);
}

/* floats to f16 (vcvtps2ph, round to nearest even) or bf16 (the integer rounding of sm_f32_to_bf16), 8
 * at a time; a group holding a NaN goes through the scalar conversion, whose NaN bits vcvtps2ph does
 * not give */
static void narrow(void *dst, const float *x, sm_dtype dt, size_t n) {
  uint16_t *d = dst;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
      for (int j = 0; j < 8; j++) d[i + j] = dt == SM_DT_F16 ? sm_f32_to_f16(x[i + j]) : sm_f32_to_bf16(x[i + j]);
      continue;
    }
    __m128i h;
    if (dt == SM_DT_F16) h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    else {
      const __m256i u = _mm256_castps_si256(v);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
      h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    }
    _mm_storeu_si128((__m128i *)(d + i), h);
  }
  for (; i < n; i++) d[i] = dt == SM_DT_F16 ? sm_f32_to_f16(x[i]) : sm_f32_to_bf16(x[i]);
}

/* ---------------- attention softmax rows ----------------
 * 8 lanes; the tail is one more vector padded with masked lanes, so that element j is computed the same
 * way and summed into lane j % 8 whatever n is (a row's result does not depend on the chunk's length) */
static inline __m256 mask_max8(__m256 x, __m256i p, __m256i vlo, __m256i vhi, __m256 vs, __m256 vc, float cap) {
  const __m256 in = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(p, vlo), _mm256_cmpgt_epi32(vhi, p)));
  x = _mm256_mul_ps(x, vs);
  if (cap > 0.f) x = _mm256_mul_ps(vc, vtanh(_mm256_div_ps(x, vc)));
  return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, in);
}
static float att_mask_max(float *s, const int32_t *pp, int n, int32_t lo, int32_t hi, float scale, float cap) {
  const __m256i vlo = _mm256_set1_epi32(lo - 1), vhi = _mm256_set1_epi32(hi + 1);
  const __m256 vs = _mm256_set1_ps(scale), vc = _mm256_set1_ps(cap);
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = mask_max8(_mm256_loadu_ps(s + j), _mm256_loadu_si256((const __m256i *)(pp + j)), vlo, vhi, vs, vc,
                               cap);
    _mm256_storeu_ps(s + j, x);
    mx = _mm256_max_ps(mx, x);
  }
  if (j < n) {
    int32_t tp[8];
    for (int i = 0; i < 8; i++) tp[i] = j + i < n ? pp[j + i] : lo - 1; /* outside the range: -inf */
    const __m256 x = mask_max8(ld_n(s + j, (size_t)(n - j)), _mm256_loadu_si256((const __m256i *)tp), vlo, vhi, vs, vc,
                               cap);
    st_n(s + j, x, (size_t)(n - j));
    mx = _mm256_max_ps(mx, x);
  }
  float t[8], r = -INFINITY;
  _mm256_storeu_ps(t, mx);
  for (int i = 0; i < 8; i++) r = t[i] > r ? t[i] : r;
  return r;
}
static float att_exp_sum(float *s, int n, float m) {
  const __m256 vm = _mm256_set1_ps(m), ninf = _mm256_set1_ps(-INFINITY);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) {
    float tx[8];
    for (int i = 0; i < 8; i++) tx[i] = j + i < n ? s[j + i] : -INFINITY;
    const __m256 x = _mm256_loadu_ps(tx);
    const __m256 e = _mm256_and_ps(_mm256_cmp_ps(x, ninf, _CMP_NEQ_OQ), vexp(_mm256_sub_ps(x, vm)));
    if (j + 8 <= n) _mm256_storeu_ps(s + j, e);
    else st_n(s + j, e, (size_t)(n - j));
    sum = _mm256_add_ps(sum, e);
  }
  float t[8], r = 0.f;
  _mm256_storeu_ps(t, sum);
  for (int i = 0; i < 8; i++) r += t[i];
  return r;
}

const sm_cpu_kern sm_cpu_kern_avx2 = {
  .name = "avx2",
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
  .att_mask_max = att_mask_max,
  .att_exp_sum = att_exp_sum,
  .widen = widen,
  .narrow = narrow,
  .mv_fp4 = sm_avx2_mv_fp4,
  .fp4_ok = sm_avx2_fp4_ok,
};
#endif
