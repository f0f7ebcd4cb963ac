/* Matvecs of mxfp4 weights with AVX2, for one token or a few (a chosen expert's tokens): the scheme of the
 * AVX-512 VNNI kernel (kern_fp4_avx512.c) in 256-bit registers. x is rounded to int16 per group of 32
 * (scale = the group's largest |x| / 32767), each 64 values stored as the 32 even ones then the 32 odd
 * ones; a 32-byte load's low and high nibbles become int8 twice their fp4 value by vpshufb, int16 by sign
 * extension, and meet x in vpmaddwd. The scalar loop of cpu_mxq.c, which AVX2 machines ran before, looked
 * each pair of codes up in memory. mxfp4 rows of a multiple of 64 columns only (sm_avx2_fp4_ok); nvfp4,
 * and everything under SMELT_CPU_EXACT=1 (float activations), keeps the scalar loop. Compiled for that target only; used after a run-time CPU check (the AVX2 kernel
 * table). */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma")
#include "backend/cpu/cpu_internal.h"
#include "format/mxq.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

bool sm_avx2_fp4_ok(const sm_weight *w, bool f32x) {
  return !f32x && w->bits == 4 && w->qmode == SM_QMODE_MXFP4 && w->group_size == 32 && w->cols % 64 == 0;
}

/* x[0..K) to int16 per group of 32 (q, in the even-then-odd order of each 64) and the groups' scales */
/* 16 int16 codes in order: the even ones in the low half, the odd ones in the high half */
static inline __m256i even_odd(__m256i n) {
  const __m256i m = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2,
                                     3, 6, 7, 10, 11, 14, 15);
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(n, m), 0xD8);
}
static void quant_x16(const float *x, int64_t K, int16_t *q, float *sc) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t c = 0; c < K / 64; c++) {
    __m256i n[4]; /* the chunk's 64 codes in order, 16 a vector */
    for (int g = 0; g < 2; g++) {
      const float *xg = x + 64 * c + 32 * g;
      __m256 v[4], m = _mm256_setzero_ps();
      for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(xg + 8 * i);
        m = _mm256_max_ps(m, _mm256_and_ps(v[i], absm));
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
      const float a = _mm_cvtss_f32(h), inv = a > 0.f ? 32767.f / a : 0.f;
      sc[2 * c + g] = a / 32767.f;
      /* round to nearest even (the default MXCSR mode, as lrintf), |x| * inv <= 32767 */
      const __m256 iv = _mm256_set1_ps(inv);
      __m256i r[4];
      for (int i = 0; i < 4; i++) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], iv));
      /* packs interleaves the 128-bit lanes: restore the order */
      n[2 * g] = _mm256_permute4x64_epi64(_mm256_packs_epi32(r[0], r[1]), 0xD8);
      n[2 * g + 1] = _mm256_permute4x64_epi64(_mm256_packs_epi32(r[2], r[3]), 0xD8);
    }
    /* each 64 values as the 32 even ones then the 32 odd ones */
    const __m256i s0 = even_odd(n[0]), s1 = even_odd(n[1]), s2 = even_odd(n[2]), s3 = even_odd(n[3]);
    int16_t *o = q + 64 * c;
    _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(s0, s1, 0x20));
    _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute2x128_si256(s2, s3, 0x20));
    _mm256_storeu_si256((__m256i *)(o + 32), _mm256_permute2x128_si256(s0, s1, 0x31));
    _mm256_storeu_si256((__m256i *)(o + 48), _mm256_permute2x128_si256(s2, s3, 0x31));
  }
}

/* the int32 sums of a chunk's two groups (lanes summed later) for one token's int16 x q */
static inline void chunk_sums(__m256i wl0, __m256i wl1, __m256i wh0, __m256i wh1, const int16_t *q, __m256i *g0,
                              __m256i *g1) {
  /* wl0: the even elements 0..30 (group 0), wl1: 32..62 (group 1), wh0 / wh1 the odd ones */
  *g0 = _mm256_add_epi32(_mm256_madd_epi16(wl0, _mm256_loadu_si256((const __m256i *)q)),
                         _mm256_madd_epi16(wh0, _mm256_loadu_si256((const __m256i *)(q + 32))));
  *g1 = _mm256_add_epi32(_mm256_madd_epi16(wl1, _mm256_loadu_si256((const __m256i *)(q + 16))),
                         _mm256_madd_epi16(wh1, _mm256_loadu_si256((const __m256i *)(q + 48))));
}

static inline __attribute__((always_inline)) void row_nt(const uint8_t *row, const uint8_t *sc, int64_t nc,
                                                         int16_t *const *q, float *const *xs, float *const *y,
                                                         int64_t r, const float *st, const int NT) {
  const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8, 12,
                                       0, -1, -2, -3, -4, -6, -8, -12);
  const __m256i m4 = _mm256_set1_epi8(15);
  __m256 t[4];
#pragma GCC unroll 4
  for (int i = 0; i < NT; i++) t[i] = _mm256_setzero_ps();
  for (int64_t c = 0; c < nc; c++) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(row + 32 * c));
    const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
    const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    const __m256i wl0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(lo)),
                  wl1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(lo, 1)),
                  wh0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(hi)),
                  wh1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(hi, 1));
    const float s0 = 0.5f * st[sc[2 * c]], s1 = 0.5f * st[sc[2 * c + 1]];
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++) {
      __m256i g0, g1;
      chunk_sums(wl0, wl1, wh0, wh1, q[i] + 64 * c, &g0, &g1);
      t[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g0), _mm256_set1_ps(s0 * xs[i][2 * c]), t[i]);
      t[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g1), _mm256_set1_ps(s1 * xs[i][2 * c + 1]), t[i]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < NT; i++) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(t[i]), _mm256_extractf128_ps(t[i], 1));
    const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
    y[i][r] = _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
  }
}

void sm_avx2_mv_fp4(const sm_weight *w, const float *const *x, float *const *y, int n, int64_t r0, int64_t r1,
                    const float *st, bool f32x) {
  (void)f32x;
  const int64_t K = w->cols, nc = K / 64;
  int16_t **q = malloc(sizeof(int16_t *) * (size_t)n);
  float **xs = malloc(sizeof(float *) * (size_t)n);
  char *buf = sm_aligned_alloc(((size_t)K * 2 + (size_t)K / 32 * sizeof(float)) * (size_t)n + 64);
  if (!q || !xs || !buf) abort();
  for (int i = 0; i < n; i++) {
    q[i] = (int16_t *)(buf + (size_t)i * (size_t)K * 2);
    xs[i] = (float *)(buf + (size_t)n * (size_t)K * 2) + (size_t)i * (size_t)(K / 32);
    quant_x16(x[i], K, q[i], xs[i]);
  }
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(K / 2);
    const uint8_t *sc = (const uint8_t *)w->scales + (size_t)r * (size_t)(K / 32);
    for (int t0 = 0; t0 < n; t0 += 4) { /* the row stays in the first-level cache for the next four */
      switch (n - t0 < 4 ? n - t0 : 4) {
        case 1: row_nt(row, sc, nc, q + t0, xs + t0, y + t0, r, st, 1); break;
        case 2: row_nt(row, sc, nc, q + t0, xs + t0, y + t0, r, st, 2); break;
        case 3: row_nt(row, sc, nc, q + t0, xs + t0, y + t0, r, st, 3); break;
        default: row_nt(row, sc, nc, q + t0, xs + t0, y + t0, r, st, 4); break;
      }
    }
  }
  free(buf);
  free(xs);
  free(q);
}
#endif
