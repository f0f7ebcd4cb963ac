/* AVX-512 VNNI int8-activation matvec for 4- and 8-bit weights (decode path; 2/3/5/6 bits:
 * kern_avx512vbmi.c).
 *
 * x is quantized once per call, per weight group g: xs[g] = max|x_g|/127, xq = round(x/xs[g]).
 * The unsigned weight codes q (0..15 or 0..255) are dotted with xq by vpdpbusd (u8 x s8,
 * 4 products per int32 lane); each 64-byte weight block's 16 lanes belong to 1..4 groups,
 * so the int32 lane sums are converted once per block and multiplied by a per-lane
 * scale[r,g] * xs[g]. The bias term uses the exact float group sums of x. Error vs the
 * float product: |dy| <= sum_g scale[r,g] * xs[g]/2 * sum_j q_j (+ float rounding).
 *
 * Compiled for the VNNI target only; used after a run-time CPU check. */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2")
#include "backend/cpu/cpu_internal.h"
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

/* Software prefetch of the streamed weights: far ahead into L2 (measured on a 2-core Zen 4:
 * T1 at 16 KB reads ~29 GB/s of 33, T0 at 2 KB ~21 GB/s). */
#ifndef SM_PF_DIST
#define SM_PF_DIST 16384
#endif
#ifndef SM_PF_HINT
#define SM_PF_HINT _MM_HINT_T1
#endif

bool sm_avx512vnni_i8_ok(const sm_weight *w) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
  }
  if (!have || !w) return false;
  if (w->bits == 4) return w->cols % 128 == 0;
  if (w->bits == 8) return w->cols % 64 == 0;
  if (w->bits == 2 || w->bits == 3 || w->bits == 5 || w->bits == 6) return w->cols % 64 == 0 && sm_avx512vbmi_ok();
  return false;
}

/* ---------------- x quantization ---------------- */
static inline __m128i q16(__m512 v, __m512 inv) {
  return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv))); /* round to nearest even */
}

void sm_avx512vnni_prep_xq(const sm_weight *w, const float *x, int8_t *xq, float *xs, float *xsum) {
  const int64_t K = w->cols;
  const int gs = w->group_size;
  /* 4-bit: per 128-element block, the 64 even elements then the 64 odd ones (the low and
   * high nibbles of the block's 64 bytes) */
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t g = 0; g < K / gs; g++) {
    const float *xg = x + g * gs;
    __m512 s = _mm512_setzero_ps(), m = _mm512_setzero_ps();
    for (int j = 0; j < gs; j += 16) {
      __m512 v = _mm512_loadu_ps(xg + j);
      s = _mm512_add_ps(s, v);
      m = _mm512_max_ps(m, _mm512_and_ps(v, absm));
    }
    xsum[g] = _mm512_reduce_add_ps(s);
    float mx = _mm512_reduce_max_ps(m);
    float d = mx / 127.f;
    xs[g] = d;
    __m512 inv = _mm512_set1_ps(d > 0.f ? 127.f / mx : 0.f);
    if (w->bits == 4) {
      for (int j = 0; j < gs; j += 32) {
        int64_t k = g * gs + j, blk = k & ~(int64_t)127, off = (k & 127) / 2;
        __m512 a = _mm512_loadu_ps(x + k), b = _mm512_loadu_ps(x + k + 16);
        _mm_storeu_si128((__m128i *)(xq + blk + off), q16(_mm512_permutex2var_ps(a, ev, b), inv));
        _mm_storeu_si128((__m128i *)(xq + blk + 64 + off), q16(_mm512_permutex2var_ps(a, od, b), inv));
      }
    } else if (w->bits == 8 || (g * gs) / 128 == K / 128) { /* natural order (also the 64-element tail) */
      for (int j = 0; j < gs; j += 16)
        _mm_storeu_si128((__m128i *)(xq + g * gs + j), q16(_mm512_loadu_ps(xg + j), inv));
    } else {
      /* 2/3/5/6 bits (kern_avx512vbmi.c): per 128-element chunk, the runs of 8 elements are
       * split in two 64-byte halves A, B so that lane l of A and of B belong to one group:
       * with R = gs/8 runs per group, run r goes to half (r % R >= R/2) at slot
       * (r / R) * (R/2) + r % (R/2) */
      const int R = gs / 8, hr = R / 2;
      for (int j = 0; j < gs; j += 16) {
        int64_t k = g * gs + j, blk = k & ~(int64_t)127;
        uint64_t v[2];
        _mm_storeu_si128((__m128i *)v, q16(_mm512_loadu_ps(xg + j), inv));
        for (int u = 0; u < 2; u++) {
          int run = (int)((k & 127) / 8) + u;
          int slot = (run / R) * hr + run % hr;
          memcpy(xq + blk + (run % R >= hr ? 64 : 0) + 8 * slot, &v[u], 8);
        }
      }
    }
  }
}

/* ---------------- matvec ---------------- */
static inline __attribute__((always_inline)) __m512 ld16(const void *p, size_t i, __mmask16 m, const int DT) {
  if (DT == SM_DT_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
  if (DT == SM_DT_BF16)
    return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
  return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* BITS 4: a 64-byte block holds 128 elements; lane i covers elements 8i..8i+7.
 * BITS 8: a 64-byte block holds 64 elements; lane i covers elements 4i..4i+3.
 * Groups are processed 16 at a time (one vector of scales per row). */
#ifndef NR
#define NR 4 /* rows per pass: x loads and lane->group indices shared */
#endif
/* one 64-byte block of each of the NR rows; accumulates into f[i][P] */
static inline __attribute__((always_inline)) void blk_step(__m512 f[][2], const int P, const uint8_t **q,
                                                           const int8_t *xq, int64_t e, int64_t ew, __m512i lane_el,
                                                           __m512i m4, const __m512 *c, const int BITS, const int LSH,
                                                           const int GF) {
  const __m512i gfm = _mm512_set1_epi64(0x1020408000000000ll); /* affine matrix: bit i <- bit i+4 */
  const __m512i gi = _mm512_srli_epi32(_mm512_add_epi32(lane_el, _mm512_set1_epi32((int)ew)), LSH); /* lane -> group */
  __m512i x0 = _mm512_loadu_si512(xq + e), x1 = BITS == 4 ? _mm512_loadu_si512(xq + e + 64) : x0;
#pragma GCC unroll 4
  for (int i = 0; i < NR; i++) {
    _mm_prefetch((const char *)q[i] + SM_PF_DIST, SM_PF_HINT);
    __m512i wv = _mm512_loadu_si512(q[i]);
    __m512i acc;
    if (BITS == 4) {
      acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(wv, m4), x0);
      /* high nibbles: one GFNI affine op (bit i <- bit i+4) where available */
      __m512i hi;
      if (GF) __asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(hi) : "v"(wv), "v"(gfm)); /* GFNI: no target needed */
      else hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
      acc = _mm512_dpbusd_epi32(acc, hi, x1);
    } else {
      acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, x0);
    }
    f[i][P] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_permutexvar_ps(gi, c[i]), f[i][P]);
    q[i] += 64;
  }
}
static inline __attribute__((always_inline)) void mv_i8_t(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y,
                                                          const int BITS, const int GS, const int DT, const int GF) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols, ng = K / GS;
  const size_t rb = (size_t)K * BITS / 8;
  const int EPB = BITS == 4 ? 128 : 64;        /* elements per 64-byte block */
  const int LSH = __builtin_ctz((unsigned)GS); /* group of element e: e >> LSH */
  const int EPL = EPB / 16;                    /* elements per lane */
  const __m512i lane_el = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(EPL));
  const __m512i m4 = _mm512_set1_epi8(15);
  const void *S = w->scales, *B = w->biases;
  const int8_t *xq = a->xq;
  int64_t r = r0;
  for (; r < r1; r += NR) {
    const int nr = r1 - r >= NR ? NR : (int)(r1 - r); /* tail: the missing rows repeat row r */
    const uint8_t *q[NR];
    __m512 f[NR][2], bacc[NR];
    for (int i = 0; i < NR; i++) {
      q[i] = (const uint8_t *)w->data + (size_t)(r + (i < nr ? i : 0)) * rb;
      f[i][0] = f[i][1] = bacc[i] = _mm512_setzero_ps();
    }
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
      const int ngs = ng - g0 < 16 ? (int)(ng - g0) : 16;
      const __mmask16 mk = (__mmask16)((1u << ngs) - 1);
      const __m512 xs16 = _mm512_maskz_loadu_ps(mk, a->xs + g0);
      __m512 c[NR];
      for (int i = 0; i < NR; i++) {
        size_t si = (size_t)(r + (i < nr ? i : 0)) * (size_t)ng + (size_t)g0;
        c[i] = _mm512_mul_ps(ld16(S, si, mk, DT), xs16);
        if (B) bacc[i] = _mm512_fmadd_ps(ld16(B, si, mk, DT), _mm512_maskz_loadu_ps(mk, a->xsum + g0), bacc[i]);
      }
      const int64_t e0 = g0 * GS, e1 = e0 + (int64_t)ngs * GS;
      int64_t e = e0;
      for (; e + 2 * EPB <= e1; e += 2 * EPB) {
        blk_step(f, 0, q, xq, e, e - e0, lane_el, m4, c, BITS, LSH, GF);
        blk_step(f, 1, q, xq, e + EPB, e + EPB - e0, lane_el, m4, c, BITS, LSH, GF);
      }
      if (e < e1) blk_step(f, 0, q, xq, e, e - e0, lane_el, m4, c, BITS, LSH, GF);
    }
    for (int i = 0; i < nr; i++)
      y[r + i - r0] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(f[i][0], f[i][1]), bacc[i]));
  }
}

#define MV_DT(BITS, GS, GF, ATTR) \
  ATTR static void mv_q##BITS##_g##GS##_##GF(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) { \
    switch (a->w->dtype) { \
      case SM_DT_F16: mv_i8_t(a, r0, r1, y, BITS, GS, SM_DT_F16, GF); break; \
      case SM_DT_BF16: mv_i8_t(a, r0, r1, y, BITS, GS, SM_DT_BF16, GF); break; \
      default: mv_i8_t(a, r0, r1, y, BITS, GS, SM_DT_F32, GF); break; \
    } \
  }
MV_DT(4, 32, 0, )
MV_DT(4, 64, 0, )
MV_DT(4, 128, 0, )
MV_DT(4, 32, 1, )
MV_DT(4, 64, 1, )
MV_DT(4, 128, 1, )
MV_DT(8, 32, 0, )
MV_DT(8, 64, 0, )
MV_DT(8, 128, 0, )

void sm_avx512vnni_matvec_i8(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const int gs = a->w->group_size;
  if (a->w->bits != 4 && a->w->bits != 8) {
    sm_avx512vbmi_matvec_i8(a, r0, r1, y);
  } else if (a->w->bits == 4 && a->gfni) {
    if (gs == 32) mv_q4_g32_1(a, r0, r1, y);
    else if (gs == 64) mv_q4_g64_1(a, r0, r1, y);
    else mv_q4_g128_1(a, r0, r1, y);
  } else if (a->w->bits == 4) {
    if (gs == 32) mv_q4_g32_0(a, r0, r1, y);
    else if (gs == 64) mv_q4_g64_0(a, r0, r1, y);
    else mv_q4_g128_0(a, r0, r1, y);
  } else {
    if (gs == 32) mv_q8_g32_0(a, r0, r1, y);
    else if (gs == 64) mv_q8_g64_0(a, r0, r1, y);
    else mv_q8_g128_0(a, r0, r1, y);
  }
}
#endif
