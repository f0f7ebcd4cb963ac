/* Matvecs of 4-bit microscaling weights (mxfp4, nvfp4; format/mxq.h) with AVX-512, for one token or a few
 * (a chosen expert's tokens), and the dequantized GEMM panels of larger batches. With AVX-512 VNNI, mxfp4
 * rows of a multiple of 64 columns turn their codes into int8 (twice the fp4 value) with vpshufb and meet x
 * rounded to int16 per group of 32 in vpdpwssd; otherwise 16 codes widened to 32-bit indices look their
 * values up in a 16-float table held in a register (vpermps), then meet x in fused multiply-adds (a group's
 * sum times its scale), or are times the scale into a GEMM panel (the products the scalar code forms, so the
 * same panel). The scalar loop of cpu_mxq.c looked each pair of codes up in memory and ran about ten times
 * as many instructions, so that gpt-oss's experts were bound by arithmetic rather than by the bytes they
 * read. A row is decoded once for up to four tokens; each token's sums are formed in the same order whatever
 * the others, so its result does not depend on them. Compiled for these targets only; used after run-time
 * CPU checks (the AVX-512 kernel table, then cpuid for VNNI). */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#include "backend/cpu/cpu_internal.h"
#include "format/mxq.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

/* the values of the 16 codes in the low 8 bytes of b (low nibble first) */
static inline __m512 fp4x16(__m128i b, const __m512 lut) {
  const __m128i m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), lut);
}
/* ... of codes 0..15 and 16..31 of the 16 bytes b */
static inline void fp4x32(__m128i b, const __m512 lut, __m512 *v0, __m512 *v1) {
  const __m128i m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  *v0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), lut);
  *v1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), lut);
}

/* group g of row r for NT tokens: t[i] += (sum of the group's values times x[i]) * its scale */
static inline __attribute__((always_inline)) void group_nt(const uint8_t *row, const uint8_t *sc, int64_t g, int64_t gs,
                                                           const float *const *x, const float *st, const __m512 lut,
                                                           __m512 *t, const int NT) {
  const __m512 s = _mm512_set1_ps(st[sc[g]]);
  if (gs == 32) {
    __m512 v0, v1;
    fp4x32(_mm_loadu_si128((const __m128i *)(row + 16 * g)), lut, &v0, &v1);
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++) {
      const float *xg = x[i] + 32 * g;
      const __m512 a = _mm512_fmadd_ps(v1, _mm512_loadu_ps(xg + 16), _mm512_mul_ps(v0, _mm512_loadu_ps(xg)));
      t[i] = _mm512_fmadd_ps(a, s, t[i]);
    }
    return;
  }
  __m512 a[4]; /* gs a multiple of 16 (nvfp4: 16) */
#pragma GCC unroll 4
  for (int i = 0; i < NT; i++) a[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < gs; j += 16) {
    const __m512 v = fp4x16(_mm_loadl_epi64((const __m128i *)(row + (g * gs + j) / 2)), lut);
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++) a[i] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x[i] + g * gs + j), a[i]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < NT; i++) t[i] = _mm512_fmadd_ps(a[i], s, t[i]);
}
/* row r for NT tokens x[0..NT) into y[t][r]. Two totals a token (even and odd groups): one chain would wait
 * on each multiply-add. */
static inline __attribute__((always_inline)) void row_nt(const uint8_t *row, const uint8_t *sc, int64_t ng, int64_t gs,
                                                         const float *const *x, float *const *y, int64_t r,
                                                         const float *st, const __m512 lut, const int NT) {
  __m512 t0[4], t1[4];
#pragma GCC unroll 4
  for (int i = 0; i < NT; i++) t0[i] = t1[i] = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + 1 < ng; g += 2) {
    group_nt(row, sc, g, gs, x, st, lut, t0, NT);
    group_nt(row, sc, g + 1, gs, x, st, lut, t1, NT);
  }
  if (g < ng) group_nt(row, sc, g, gs, x, st, lut, t0, NT);
#pragma GCC unroll 4
  for (int i = 0; i < NT; i++) y[i][r] = _mm512_reduce_add_ps(_mm512_add_ps(t0[i], t1[i]));
}

/* ---- mxfp4 on AVX-512 VNNI: int16 x ----
 * x is quantized per group of 32 to int16 (scale = the group's largest |x| / 32767, so 2^-15 of it at most
 * off), each 64 values stored as the 32 even ones then the 32 odd ones: the order of a 32-byte load's low
 * nibbles and high nibbles. Codes become int8 twice their value by vpshufb, int16 by sign extension, and
 * meet x in vpdpwssd (32 multiply-adds an instruction); lanes 0-7 of the sums are a chunk's first group,
 * 8-15 its second, each times its two scales. */
#define XQ_ALIGN 64
typedef struct {
  int16_t *q; /* [K] */
  __m512 *sc; /* [K / 64]: lanes 0-7 half the first group's scale, 8-15 the second's */
} xq16;

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma"))) static void
quant_x16(const float *x, int64_t K, xq16 *o) {
  /* word indices of the even and the odd elements of a 64-element chunk held as two vectors of 32 words */
  const __m512i ev = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24,
                                      22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i od = _mm512_add_epi16(ev, _mm512_set1_epi16(1));
  for (int64_t c = 0; c < K / 64; c++) {
    float s[2];
    __m512i h[2]; /* the chunk's 64 codes in order, 32 a vector */
    for (int g = 0; g < 2; g++) {
      const float *xg = x + 64 * c + 32 * g;
      const __m512 v0 = _mm512_loadu_ps(xg), v1 = _mm512_loadu_ps(xg + 16);
      const __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
      const float a = _mm512_reduce_max_ps(m), inv = a > 0.f ? 32767.f / a : 0.f;
      s[g] = a / 32767.f;
      /* round to nearest even (the default MXCSR mode, as lrintf), |x| * inv <= 32767 */
      const __m512 iv = _mm512_set1_ps(inv);
      const __m256i q0 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v0, iv)));
      const __m256i q1 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v1, iv)));
      h[g] = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    }
    _mm512_storeu_si512(o->q + 64 * c, _mm512_permutex2var_epi16(h[0], ev, h[1]));      /* even elements */
    _mm512_storeu_si512(o->q + 64 * c + 32, _mm512_permutex2var_epi16(h[0], od, h[1])); /* odd elements */
    o->sc[c] = _mm512_insertf32x8(_mm512_set1_ps(0.5f * s[0]), _mm256_set1_ps(0.5f * s[1]), 1);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma"))) static inline void
row_vnni(const uint8_t *row, const uint8_t *sc, int64_t nc, const xq16 *xq, float *const *y, int64_t r, const float *st,
         const int NT) {
  const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8, 12,
                                       0, -1, -2, -3, -4, -6, -8, -12);
  const __m256i m4 = _mm256_set1_epi8(15);
  __m512 t0[4], t1[4];
#pragma GCC unroll 4
  for (int i = 0; i < NT; i++) t0[i] = t1[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; c++) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(row + 32 * c));
    const __m512i wl = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)));
    const __m512i wh = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)));
    const __m512 sw = _mm512_insertf32x8(_mm512_set1_ps(st[sc[2 * c]]), _mm256_set1_ps(st[sc[2 * c + 1]]), 1);
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++) {
      const int16_t *q = xq[i].q + 64 * c;
      __m512i a = _mm512_dpwssd_epi32(_mm512_setzero_si512(), wl, _mm512_loadu_si512(q));
      a = _mm512_dpwssd_epi32(a, wh, _mm512_loadu_si512(q + 32));
      const __m512 f = _mm512_mul_ps(sw, xq[i].sc[c]);
      if (c & 1) t1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), f, t1[i]);
      else t0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), f, t0[i]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < NT; i++) y[i][r] = _mm512_reduce_add_ps(_mm512_add_ps(t0[i], t1[i]));
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma"))) static void
mv_mx4_vnni(const sm_weight *w, const float *const *x, float *const *y, int n, int64_t r0, int64_t r1,
            const float *st) {
  const int64_t K = w->cols, nc = K / 64;
  const size_t per = (size_t)K * 2 + (size_t)nc * sizeof(__m512);
  char *buf = sm_aligned_alloc(per * (size_t)n + XQ_ALIGN);
  if (!buf) abort();
  xq16 *xq = malloc(sizeof(xq16) * (size_t)n);
  if (!xq) abort();
  for (int i = 0; i < n; i++) {
    char *b = buf + per * (size_t)i;
    xq[i].sc = (__m512 *)b;
    xq[i].q = (int16_t *)(b + (size_t)nc * sizeof(__m512));
    quant_x16(x[i], K, &xq[i]);
  }
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(K / 2);
    const uint8_t *sc = (const uint8_t *)w->scales + (size_t)r * (size_t)(K / 32);
    for (int t0 = 0; t0 < n; t0 += 4) { /* the row stays in the first-level cache for the next four */
      switch (n - t0 < 4 ? n - t0 : 4) {
        case 1: row_vnni(row, sc, nc, xq + t0, y + t0, r, st, 1); break;
        case 2: row_vnni(row, sc, nc, xq + t0, y + t0, r, st, 2); break;
        case 3: row_vnni(row, sc, nc, xq + t0, y + t0, r, st, 3); break;
        default: row_vnni(row, sc, nc, xq + t0, y + t0, r, st, 4); break;
      }
    }
  }
  free(xq);
  free(buf);
}

bool sm_avx512_fp4_ok(const sm_weight *w, bool f32x) {
  (void)f32x;
  return w->bits == 4 && w->group_size % 16 == 0 && w->cols % 16 == 0;
}

void sm_avx512_mv_fp4(const sm_weight *w, const float *const *x, float *const *y, int n, int64_t r0, int64_t r1,
                      const float *st, bool f32x) {
  static int vnni = -1;
  if (vnni < 0) vnni = __builtin_cpu_supports("avx512vnni") ? 1 : 0;
  if (vnni && !f32x && w->qmode == SM_QMODE_MXFP4 && w->group_size == 32 && w->cols % 64 == 0) {
    mv_mx4_vnni(w, x, y, n, r0, r1, st);
    return;
  }
  const __m512 lut = _mm512_loadu_ps(sm_fp4_e2m1_lut);
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K / 2;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    const uint8_t *sc = (const uint8_t *)w->scales + (size_t)r * (size_t)ng;
    for (int t0 = 0; t0 < n; t0 += 4) { /* the row stays in the first-level cache for the next four */
      switch (n - t0 < 4 ? n - t0 : 4) {
        case 1: row_nt(row, sc, ng, gs, x + t0, y + t0, r, st, lut, 1); break;
        case 2: row_nt(row, sc, ng, gs, x + t0, y + t0, r, st, lut, 2); break;
        case 3: row_nt(row, sc, ng, gs, x + t0, y + t0, r, st, lut, 3); break;
        default: row_nt(row, sc, ng, gs, x + t0, y + t0, r, st, lut, 4); break;
      }
    }
  }
}

void sm_avx512_pack_fp4(const sm_weight *w, int64_t r0, int nr, int64_t k0, int kc, int panel, float *dst,
                        const float *st) {
  const __m512 lut = _mm512_loadu_ps(sm_fp4_e2m1_lut);
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K / 2;
  float tmp[SM_CPU_FP4_PACK_KC];
  for (int rr = 0; rr < panel; rr++) {
    if (rr >= nr) {
      for (int k = 0; k < kc; k++) dst[(size_t)k * panel + rr] = 0.f;
      continue;
    }
    const uint8_t *row = (const uint8_t *)w->data + (size_t)(r0 + rr) * rb;
    const uint8_t *sc = (const uint8_t *)w->scales + (size_t)(r0 + rr) * (size_t)ng;
    for (int k = 0; k < kc; k += 16) {
      const int64_t j = k0 + k;
      const __m512 v = fp4x16(_mm_loadl_epi64((const __m128i *)(row + j / 2)), lut);
      _mm512_storeu_ps(tmp + k, _mm512_mul_ps(_mm512_set1_ps(st[sc[j / gs]]), v));
    }
    for (int k = 0; k < kc; k++) dst[(size_t)k * panel + rr] = tmp[k];
  }
}
#endif
