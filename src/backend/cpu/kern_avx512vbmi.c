/* AVX-512 VBMI + VNNI int8-activation matvec for 2-, 3-, 5- and 6-bit weights (decode path).
 *
 * MLX packs b-bit codes as a little-endian bit stream, so the 64 codes of a 64-element block
 * occupy 8*b bytes and each run of 8 codes occupies exactly b bytes. One vpermb copies the b
 * bytes of run j into qword j, one vpmultishiftqb extracts the 8-bit window starting at bit
 * k*b of that qword into byte k (k = 0..7), and one AND keeps the low b bits: 64 codes
 * from 3 instructions. Per 128-element chunk the runs of 8 codes are split into two vectors
 * A, B (vpermt2b picks the runs) such that lane l of A and lane l of B lie in the same
 * group, so both are accumulated by vpdpbusd into one int32 vector and converted/scaled once
 * per 128 elements (as the 4-bit kernel does). sm_avx512vnni_prep_xq stores the int8 x in
 * the same order. The error bound of cpu_internal.h applies unchanged.
 *
 * Compiled for the VBMI target only; used after a run-time CPU check (sm_avx512vbmi_ok). */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c,bmi,bmi2")
#include "backend/cpu/cpu_internal.h"
#include <immintrin.h>
#include <stdlib.h>

#ifndef SM_PF_DIST
#define SM_PF_DIST 16384 /* bytes ahead, into L2 (see kern_avx512vnni.c) */
#endif

bool sm_avx512vbmi_ok(void) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  }
  return have == 1;
}

static inline __attribute__((always_inline)) __m512 ld16(const void *p, size_t i, __mmask16 m, const int DT) {
  if (DT == SM_DT_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
  if (DT == SM_DT_BF16)
    return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
  return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

#define NR 4 /* rows per pass: x loads, lane->group indices and unpack constants shared */

/* 64 codes (natural order, one per byte) from the 8*BITS bytes at p */
static inline __attribute__((always_inline)) __m512i unpack64(const uint8_t *p, __m512i perm, __m512i shc, __m512i msk,
                                                              const int BITS) {
  const __mmask64 lm = BITS == 8 ? ~(__mmask64)0 : (((__mmask64)1 << (8 * BITS)) - 1);
  __m512i v = _mm512_maskz_loadu_epi8(lm, p); /* masked: never reads past the row */
  v = _mm512_permutexvar_epi8(perm, v);
  return _mm512_and_si512(_mm512_multishift_epi64_epi8(shc, v), msk);
}

static inline __attribute__((always_inline)) void mv_t(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y,
                                                       const int BITS, const int GS, const int DT) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols, ng = K / GS;
  const size_t rb = (size_t)K * BITS / 8;
  const int CB = 16 * BITS;                    /* bytes per 128-element chunk */
  const int LSH = __builtin_ctz((unsigned)GS); /* group of element e: e >> LSH */
  /* chunk of 128 codes = 16 runs of 8 (BITS bytes each); halves A, B (see prep_xq): with
   * R = GS/8 runs per group, qword j of A holds run R*(j/(R/2)) + j%(R/2), of B that run + R/2,
   * so lane l of A and of B covers elements of group l*8/GS of the chunk */
  uint8_t ia[64], ib[64], si[64], pn[64];
  const int R = GS / 8, hr = R / 2;
  for (int j = 0; j < 8; j++)
    for (int k = 0; k < 8; k++) {
      int ra = R * (j / hr) + j % hr, rbn = ra + hr;
      ia[8 * j + k] = (uint8_t)(k < BITS ? ra * BITS + k : 0);
      ib[8 * j + k] = (uint8_t)(k < BITS ? rbn * BITS + k : 0);
      pn[8 * j + k] = (uint8_t)(k < BITS ? j * BITS + k : 0);
      si[8 * j + k] = (uint8_t)(k * BITS);
    }
  const __m512i pa = _mm512_loadu_si512(ia), pb = _mm512_loadu_si512(ib), perm = _mm512_loadu_si512(pn);
  const __m512i shc = _mm512_loadu_si512(si);
  const __m512i msk = _mm512_set1_epi8((char)((1 << BITS) - 1));
  const __mmask64 m0 = CB >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << CB) - 1);
  const __mmask64 m1 = CB > 64 ? (((__mmask64)1 << (CB - 64)) - 1) : 0;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i lane8 = _mm512_slli_epi32(lane, 3), lane4 = _mm512_slli_epi32(lane, 2);
  const void *S = w->scales, *B = w->biases;
  const int8_t *xq = a->xq;
  for (int64_t r = r0; r < r1; r += NR) {
    const int nr = r1 - r >= NR ? NR : (int)(r1 - r); /* tail: the missing rows repeat row r */
    const uint8_t *q[NR];
    __m512 f[NR], bacc[NR];
    for (int i = 0; i < NR; i++) {
      q[i] = (const uint8_t *)w->data + (size_t)(r + (i < nr ? i : 0)) * rb;
      f[i] = bacc[i] = _mm512_setzero_ps();
    }
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
      const int ngs = ng - g0 < 16 ? (int)(ng - g0) : 16;
      const __mmask16 mk = (__mmask16)((1u << ngs) - 1);
      const __m512 xs16 = _mm512_maskz_loadu_ps(mk, a->xs + g0);
      __m512 c[NR];
      for (int i = 0; i < NR; i++) {
        size_t sx = (size_t)(r + (i < nr ? i : 0)) * (size_t)ng + (size_t)g0;
        c[i] = _mm512_mul_ps(ld16(S, sx, mk, DT), xs16);
        if (B) bacc[i] = _mm512_fmadd_ps(ld16(B, sx, mk, DT), _mm512_maskz_loadu_ps(mk, a->xsum + g0), bacc[i]);
      }
      const int64_t e0 = g0 * GS, e1 = e0 + (int64_t)ngs * GS;
      int64_t e = e0;
      for (; e + 128 <= e1; e += 128) {
        const __m512i gi = _mm512_srli_epi32(_mm512_add_epi32(lane8, _mm512_set1_epi32((int)(e - e0))), LSH);
        const __m512i xa = _mm512_loadu_si512(xq + e), xb = _mm512_loadu_si512(xq + e + 64);
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
          _mm_prefetch((const char *)q[i] + SM_PF_DIST, _MM_HINT_T1);
          if (CB > 64) _mm_prefetch((const char *)q[i] + SM_PF_DIST + 64, _MM_HINT_T1);
          __m512i s0 = _mm512_maskz_loadu_epi8(m0, q[i]), va, vb; /* masked: never reads past the row */
          if (CB > 64) {
            __m512i s1 = _mm512_maskz_loadu_epi8(m1, q[i] + 64);
            va = _mm512_permutex2var_epi8(s0, pa, s1);
            vb = _mm512_permutex2var_epi8(s0, pb, s1);
          } else {
            va = _mm512_permutexvar_epi8(pa, s0);
            vb = _mm512_permutexvar_epi8(pb, s0);
          }
          va = _mm512_and_si512(_mm512_multishift_epi64_epi8(shc, va), msk);
          vb = _mm512_and_si512(_mm512_multishift_epi64_epi8(shc, vb), msk);
          __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), va, xa), vb, xb);
          f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_permutexvar_ps(gi, c[i]), f[i]);
          q[i] += CB;
        }
      }
      if (e < e1) { /* last 64 elements of a row with K % 128 == 64: natural order */
        const __m512i gi = _mm512_srli_epi32(_mm512_add_epi32(lane4, _mm512_set1_epi32((int)(e - e0))), LSH);
        const __m512i xa = _mm512_loadu_si512(xq + e);
        for (int i = 0; i < NR; i++) {
          __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), unpack64(q[i], perm, shc, msk, BITS), xa);
          f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_permutexvar_ps(gi, c[i]), f[i]);
          q[i] += 8 * BITS;
        }
      }
    }
    for (int i = 0; i < nr; i++) y[r + i - r0] = _mm512_reduce_add_ps(_mm512_add_ps(f[i], bacc[i]));
  }
}

#define MV_DT(BITS, GS) \
  static void mv_q##BITS##_g##GS(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) { \
    switch (a->w->dtype) { \
      case SM_DT_F16: mv_t(a, r0, r1, y, BITS, GS, SM_DT_F16); break; \
      case SM_DT_BF16: mv_t(a, r0, r1, y, BITS, GS, SM_DT_BF16); break; \
      default: mv_t(a, r0, r1, y, BITS, GS, SM_DT_F32); break; \
    } \
  }
#define MV_GS(BITS) MV_DT(BITS, 32) MV_DT(BITS, 64) MV_DT(BITS, 128)
MV_GS(2)
MV_GS(3)
MV_GS(5)
MV_GS(6)

#define DISPATCH(BITS) \
  case BITS: \
    if (gs == 32) mv_q##BITS##_g32(a, r0, r1, y); \
    else if (gs == 64) mv_q##BITS##_g64(a, r0, r1, y); \
    else mv_q##BITS##_g128(a, r0, r1, y); \
    break;
/* bits 2, 3, 5, 6; cols % 64 == 0; group size 32, 64 or 128 */
void sm_avx512vbmi_matvec_i8(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const int gs = a->w->group_size;
  switch (a->w->bits) {
    DISPATCH(2)
    DISPATCH(3)
    DISPATCH(5)
    DISPATCH(6)
    default: break;
  }
}
#endif
