/* Matvecs of 4-bit microscaling weights (mxfp4, nvfp4; format/mxq.h) with AVX-512, for one token or a few
 * (a chosen expert's tokens), and the dequantized GEMM panels of larger batches: 16 codes widened to 32-bit
 * indices look their values up in a 16-float table held in a register (vpermps), then meet x in fused
 * multiply-adds (a group's sum times its scale), or are times the scale into the panel (the products the
 * scalar code forms, so the same panel). The scalar loop of cpu_mxq.c looked each pair of codes up in
 * memory and ran about ten times as many instructions, so that gpt-oss's experts were bound by arithmetic
 * rather than by the bytes they read. A row is decoded once for up to four tokens; each token's sums are
 * formed in the same order whatever the others, so its result does not depend on them. Compiled for that
 * target only; used after a run-time CPU check (the AVX-512 kernel table). */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#include "backend/cpu/cpu_internal.h"
#include "format/mxq.h"
#include <immintrin.h>

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

void sm_avx512_mv_fp4(const sm_weight *w, const float *const *x, float *const *y, int n, int64_t r0, int64_t r1,
                      const float *st) {
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
