/* AVX-512 VNNI kernels of the int8 path on packed weights (layout and canonical arithmetic:
 * cpu_internal.h, "packed weights"): activation quantization, the one-token matvec that streams
 * the packed row blocks (decode), the row-block unpacker and the VNNI GEMM micro-kernel for
 * batches (prefill). 16 weight rows sit in the 16 int32 lanes: vpdpbusd multiplies a quad of 4
 * codes per row by 4 broadcast int8 activations, so no horizontal sums are needed and every
 * output follows the canonical per-row chain exactly.
 *
 * Compiled for the VNNI target only; used after a run-time CPU check (sm_i8avx512_ok). */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include "backend/cpu/cpu_internal.h"
#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

bool sm_i8avx512_ok(void) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }
  return have == 1;
}

/* the summation tree of sm_cpu_sum16 */
AI float sum16(__m512 v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

void sm_i8avx512_quant(const float *x, int64_t K, int gs, int t0, int t1, int8_t *xq, float *xs, float *xsum) {
  const int64_t ng = K / gs;
  const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int t = t0; t < t1; t++)
    for (int64_t g = 0; g < ng; g++) {
      const float *xg = x + (size_t)t * (size_t)K + g * gs;
      __m512 s = _mm512_setzero_ps(), m = _mm512_setzero_ps();
      for (int j = 0; j < gs; j += 16) {
        __m512 v = _mm512_loadu_ps(xg + j);
        s = _mm512_add_ps(s, v);
        m = _mm512_max_ps(m, _mm512_and_ps(v, absm));
      }
      const float mx = _mm512_reduce_max_ps(m);
      xsum[(size_t)t * (size_t)ng + (size_t)g] = sum16(s);
      xs[(size_t)t * (size_t)ng + (size_t)g] = mx / 127.f;
      const __m512 inv = _mm512_set1_ps(mx > 0.f ? 127.f / mx : 0.f);
      int8_t *q = xq + (size_t)t * (size_t)K + g * gs;
      for (int j = 0; j < gs; j += 16)
        _mm_storeu_si128((__m128i *)(q + j),
                         _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + j), inv))));
    }
}

/* ---- unpacking a super block into its 8 quads ---- */
AI __m512i srl(__m512i v, int s) { return _mm512_srli_epi16(v, s); }
AI __m512i sll(__m512i v, int s) { return _mm512_slli_epi16(v, s); }
/* v shifted so that its bit `from` lands on bit `to` of each byte (bits in between unaffected) */
AI __m512i mv_bit(__m512i v, int from, int to) { return to >= from ? sll(v, to - from) : srl(v, from - to); }

AI void unpack_sb(const uint8_t *src, __m512i Q[8], const int BITS) {
  const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03), m1 = _mm512_set1_epi8(0x01);
  if (BITS == 8) {
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++) Q[v] = _mm512_load_si512(src + 64 * v);
  } else if (BITS == 4 || BITS == 5 || BITS == 6) {
#pragma GCC unroll 8
    for (int v = 0; v < 4; v++) {
      __m512i p = _mm512_load_si512(src + 64 * v);
      Q[v] = _mm512_and_si512(p, m4);
      Q[v + 4] = _mm512_and_si512(srl(p, 4), m4);
    }
    if (BITS == 6) {
      const __m512i h = _mm512_set1_epi8(0x30);
#pragma GCC unroll 8
      for (int v = 0; v < 2; v++) {
        __m512i p = _mm512_load_si512(src + 256 + 64 * v);
#pragma GCC unroll 8
        for (int j = 0; j < 4; j++) /* quad v+2j at bits 2j..2j+1 -> bits 4..5 */
          Q[v + 2 * j] = _mm512_ternarylogic_epi32(Q[v + 2 * j], mv_bit(p, 2 * j, 4), h, 0xF8); /* a | (b & c) */
      }
    } else if (BITS == 5) {
      const __m512i h = _mm512_set1_epi8(0x10);
      __m512i p = _mm512_load_si512(src + 256);
#pragma GCC unroll 8
      for (int v = 0; v < 8; v++) Q[v] = _mm512_ternarylogic_epi32(Q[v], mv_bit(p, v, 4), h, 0xF8);
    }
  } else { /* 2, 3 */
#pragma GCC unroll 8
    for (int v = 0; v < 2; v++) {
      __m512i p = _mm512_load_si512(src + 64 * v);
#pragma GCC unroll 8
      for (int j = 0; j < 4; j++) Q[v + 2 * j] = _mm512_and_si512(srl(p, 2 * j), m2);
    }
    if (BITS == 3) {
      const __m512i h = _mm512_set1_epi8(0x04);
      __m512i p = _mm512_load_si512(src + 128);
#pragma GCC unroll 8
      for (int v = 0; v < 8; v++) Q[v] = _mm512_ternarylogic_epi32(Q[v], mv_bit(p, v, 2), h, 0xF8);
    }
  }
  (void)m1;
}

AI __m512 ld_sc(const uint8_t *p, const int DT) {
  if (DT == SM_DT_F16) return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p));
  if (DT == SM_DT_BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)p)), 16));
  return _mm512_load_ps((const float *)p);
}
AI __m512i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
AI __mmask16 row_mask(int64_t rows, int64_t rb) {
  const int64_t n = rows - rb * 16;
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* ---- decode: one to four tokens against packed row blocks ---- */
/* NT tokens (1 to 4) against packed row blocks, each super block unpacked once for all of them: y[t][r]
 * (row stride rows); each token's operations and their order do not depend on NT (the same bits alone
 * and in a batch) */
AI void mvn_t(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y, const int BITS, const int DT, const int NT) {
  const sm_cpu_packed *p = a->p;
  const int gs = p->gs, es = DT == SM_DT_F32 ? 4 : 2, nsb = gs / 32;
  const int64_t ng = p->ng, K = p->cols;
  const size_t gb = p->gbytes;
  const int pf = a->pf;
  for (int64_t rb = rb0; rb < rb1; rb++) {
    const uint8_t *s = p->data + (size_t)rb * p->rbbytes;
    __m512 acc[4], bacc[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = bacc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++, s += gb) {
      if (pf)
        for (size_t o = 0; o < gb; o += 64) _mm_prefetch((const char *)s + pf + o, _MM_HINT_T0);
      const __m512 sc = ld_sc(s, DT), bi = ld_sc(s + 16 * es, DT);
      const uint8_t *d = s + 32 * es;
      __m512i i0[4], i1[4];
#pragma GCC unroll 4
      for (int t = 0; t < NT; t++) i0[t] = i1[t] = _mm512_setzero_si512();
      for (int sb = 0; sb < nsb; sb++) {
        __m512i Q[8];
        unpack_sb(d + (size_t)sb * 64 * BITS, Q, BITS);
#pragma GCC unroll 8
        for (int v = 0; v < 8; v += 2)
#pragma GCC unroll 4
          for (int t = 0; t < NT; t++) {
            const int8_t *xg = a->xq + (size_t)t * (size_t)K + g * gs + sb * 32 + 4 * v;
            i0[t] = _mm512_dpbusd_epi32(i0[t], Q[v], bcast4(xg));
            i1[t] = _mm512_dpbusd_epi32(i1[t], Q[v + 1], bcast4(xg + 4));
          }
      }
#pragma GCC unroll 4
      for (int t = 0; t < NT; t++) {
        const __m512 c = _mm512_mul_ps(sc, _mm512_set1_ps(a->xs[(size_t)t * (size_t)ng + (size_t)g]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0[t], i1[t])), c, acc[t]);
        bacc[t] = _mm512_fmadd_ps(bi, _mm512_set1_ps(a->xsum[(size_t)t * (size_t)ng + (size_t)g]), bacc[t]);
      }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
      _mm512_mask_storeu_ps(y + (size_t)t * (size_t)p->rows + rb * 16, row_mask(p->rows, rb),
                            _mm512_add_ps(acc[t], bacc[t]));
  }
}
#define MVN_DT(B, NT) \
  switch (a->p->sdt) { \
    case SM_DT_F16: mvn_t(a, rb0, rb1, y, B, SM_DT_F16, NT); break; \
    case SM_DT_BF16: mvn_t(a, rb0, rb1, y, B, SM_DT_BF16, NT); break; \
    default: mvn_t(a, rb0, rb1, y, B, SM_DT_F32, NT); break; \
  }
/* nt tokens (1 to 4): each bit width's instance */
#define MVN(B) \
  static void mvn_q##B(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y, int nt) { \
    if (nt == 1) { \
      MVN_DT(B, 1) \
    } else if (nt == 2) { \
      MVN_DT(B, 2) \
    } else if (nt == 3) { \
      MVN_DT(B, 3) \
    } else { \
      MVN_DT(B, 4) \
    } \
  }
MVN(2)
MVN(3)
MVN(4)
MVN(5)
MVN(6)
MVN(8)
static void mvn(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y, int nt) {
  switch (a->p->bits) {
    case 2: mvn_q2(a, rb0, rb1, y, nt); break;
    case 3: mvn_q3(a, rb0, rb1, y, nt); break;
    case 4: mvn_q4(a, rb0, rb1, y, nt); break;
    case 5: mvn_q5(a, rb0, rb1, y, nt); break;
    case 6: mvn_q6(a, rb0, rb1, y, nt); break;
    default: mvn_q8(a, rb0, rb1, y, nt); break;
  }
}
void sm_i8avx512_matvec(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) { mvn(a, rb0, rb1, y, 1); }
void sm_i8avx512_matvec_n(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) { mvn(a, rb0, rb1, y, a->n); }

/* ---- batches: unpack a row block once, then the GEMM micro-kernel over tokens ---- */
AI void unpack_t(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI, const int BITS, const int DT) {
  const int gs = p->gs, es = DT == SM_DT_F32 ? 4 : 2;
  const uint8_t *s = p->data + (size_t)rb * p->rbbytes;
  for (int64_t g = 0; g < p->ng; g++, s += p->gbytes) {
    _mm512_store_ps(SC + g * 16, ld_sc(s, DT));
    _mm512_store_ps(BI + g * 16, ld_sc(s + 16 * es, DT));
    for (int sb = 0; sb < gs / 32; sb++) {
      __m512i Q[8];
      unpack_sb(s + 32 * es + (size_t)sb * 64 * BITS, Q, BITS);
      uint8_t *u = U + ((size_t)g * (size_t)gs + (size_t)sb * 32) * 16;
      for (int v = 0; v < 8; v++) _mm512_store_si512(u + 64 * v, Q[v]);
    }
  }
}
#define UNP(B) \
  static void unp_q##B(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI) { \
    switch (p->sdt) { \
      case SM_DT_F16: unpack_t(p, rb, U, SC, BI, B, SM_DT_F16); break; \
      case SM_DT_BF16: unpack_t(p, rb, U, SC, BI, B, SM_DT_BF16); break; \
      default: unpack_t(p, rb, U, SC, BI, B, SM_DT_F32); break; \
    } \
  }
UNP(2)
UNP(3)
UNP(4)
UNP(5)
UNP(6)
UNP(8)
void sm_i8avx512_unpack(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI) {
  switch (p->bits) {
    case 2: unp_q2(p, rb, U, SC, BI); break;
    case 3: unp_q3(p, rb, U, SC, BI); break;
    case 4: unp_q4(p, rb, U, SC, BI); break;
    case 5: unp_q5(p, rb, U, SC, BI); break;
    case 6: unp_q6(p, rb, U, SC, BI); break;
    default: unp_q8(p, rb, U, SC, BI); break;
  }
}

/* T tokens from t0 against one unpacked row block */
AI void gemm_t(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0, float *y,
               int64_t ldy, const int T) {
  const sm_cpu_packed *p = a->p;
  const int64_t K = p->cols, ng = p->ng;
  const int gs = p->gs;
  const int8_t *xq = a->xq + (size_t)t0 * (size_t)K;
  __m512 acc[8];
#pragma GCC unroll 8
  for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; g++) {
    __m512i is[8];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) is[t] = _mm512_setzero_si512();
    const uint8_t *u = U + (size_t)g * (size_t)gs * 16;
    const int8_t *xg = xq + g * gs;
    for (int q = 0; q < gs / 4; q++) {
      const __m512i w = _mm512_load_si512(u + 64 * q);
#pragma GCC unroll 8
      for (int t = 0; t < T; t++) is[t] = _mm512_dpbusd_epi32(is[t], w, bcast4(xg + (size_t)t * (size_t)K + 4 * q));
    }
    const __m512 sc = _mm512_load_ps(SC + g * 16);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
      const __m512 c = _mm512_mul_ps(sc, _mm512_set1_ps(a->xs[(size_t)(t0 + t) * (size_t)ng + (size_t)g]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), c, acc[t]);
    }
  }
  const __mmask16 m = row_mask(p->rows, rb);
  for (int t = 0; t < T; t++) {
    const float *xsum = a->xsum + (size_t)(t0 + t) * (size_t)ng;
    __m512 bacc = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) bacc = _mm512_fmadd_ps(_mm512_load_ps(BI + g * 16), _mm512_set1_ps(xsum[g]), bacc);
    _mm512_mask_storeu_ps(y + (size_t)(t0 + t) * (size_t)ldy + (size_t)rb * 16, m, _mm512_add_ps(acc[t], bacc));
  }
}

void sm_i8avx512_gemm(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0,
                      int t1, float *y, int64_t ldy) {
  int t = t0;
  for (; t + 8 <= t1; t += 8) gemm_t(a, U, SC, BI, rb, t, y, ldy, 8);
  switch (t1 - t) {
    case 7: gemm_t(a, U, SC, BI, rb, t, y, ldy, 7); break;
    case 6: gemm_t(a, U, SC, BI, rb, t, y, ldy, 6); break;
    case 5: gemm_t(a, U, SC, BI, rb, t, y, ldy, 5); break;
    case 4: gemm_t(a, U, SC, BI, rb, t, y, ldy, 4); break;
    case 3: gemm_t(a, U, SC, BI, rb, t, y, ldy, 3); break;
    case 2: gemm_t(a, U, SC, BI, rb, t, y, ldy, 2); break;
    case 1: gemm_t(a, U, SC, BI, rb, t, y, ldy, 1); break;
    default: break;
  }
}
#else
#include "backend/cpu/cpu_internal.h"
bool sm_i8avx512_ok(void) { return false; }
void sm_i8avx512_quant(const float *x, int64_t K, int gs, int t0, int t1, int8_t *xq, float *xs, float *xsum) {
  (void)x;
  (void)K;
  (void)gs;
  (void)t0;
  (void)t1;
  (void)xq;
  (void)xs;
  (void)xsum;
}
void sm_i8avx512_matvec(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) {
  (void)a;
  (void)rb0;
  (void)rb1;
  (void)y;
}
void sm_i8avx512_matvec_n(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) {
  (void)a;
  (void)rb0;
  (void)rb1;
  (void)y;
}
void sm_i8avx512_unpack(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI) {
  (void)p;
  (void)rb;
  (void)U;
  (void)SC;
  (void)BI;
}
void sm_i8avx512_gemm(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0,
                      int t1, float *y, int64_t ldy) {
  (void)a;
  (void)U;
  (void)SC;
  (void)BI;
  (void)rb;
  (void)t0;
  (void)t1;
  (void)y;
  (void)ldy;
}
#endif
