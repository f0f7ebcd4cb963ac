/* AVX2 kernels of the int8 path on packed weights (layout and canonical arithmetic: cpu_internal.h,
 * "packed weights"), for CPUs without AVX-512 VNNI. A 64-byte quad of the packed layout is two
 * 256-bit halves (rows 0-7, rows 8-15). The integer dot products are exact: AVX2 multiplies with
 * vpmaddubsw (codes of up to 6 bits: |sum of two products| <= 2*63*127 < 2^15, no saturation;
 * 8-bit codes are split into two nibbles) and widens with vpmaddwd; with AVX-VNNI (this file
 * compiled again by kern_i8_avxvnni.c) one vpdpbusd does it. The float epilogue is the canonical
 * per-row chain, so the outputs equal the AVX-512 kernels' bit for bit.
 *
 * Compiled for its target only; used after a run-time CPU check. */
#if defined(__x86_64__)
#ifdef SM_I8_AVXVNNI
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define I8(x) sm_i8avxvnni_##x
#else
#pragma GCC target("avx2,fma,f16c")
#define I8(x) sm_i8avx2_##x
#endif
#include "backend/cpu/cpu_internal.h"
#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

bool I8(ok)(void) {
  __builtin_cpu_init();
  bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#ifdef SM_I8_AVXVNNI
  ok = ok && __builtin_cpu_supports("avxvnni");
#endif
  return ok;
}

/* ---- activations: the 16-lane summation of the canonical arithmetic with two 8-lane halves ---- */
AI float sum16(__m256 lo, __m256 hi) {
  __m256 a = _mm256_add_ps(lo, hi); /* l[i] + l[i+8] */
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
AI float max8(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_max_ss(a, _mm_shuffle_ps(a, a, 1)));
}

void I8(quant)(const float *x, int64_t K, int gs, int t0, int t1, int8_t *xq, float *xs, float *xsum) {
  const int64_t ng = K / gs;
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int t = t0; t < t1; t++)
    for (int64_t g = 0; g < ng; g++) {
      const float *xg = x + (size_t)t * (size_t)K + g * gs;
      __m256 slo = _mm256_setzero_ps(), shi = slo, m = slo;
      for (int j = 0; j < gs; j += 16) {
        __m256 a = _mm256_loadu_ps(xg + j), b = _mm256_loadu_ps(xg + j + 8);
        slo = _mm256_add_ps(slo, a);
        shi = _mm256_add_ps(shi, b);
        m = _mm256_max_ps(m, _mm256_max_ps(_mm256_and_ps(a, absm), _mm256_and_ps(b, absm)));
      }
      const float mx = max8(m);
      xsum[(size_t)t * (size_t)ng + (size_t)g] = sum16(slo, shi);
      xs[(size_t)t * (size_t)ng + (size_t)g] = mx / 127.f;
      const __m256 inv = _mm256_set1_ps(mx > 0.f ? 127.f / mx : 0.f);
      int8_t *q = xq + (size_t)t * (size_t)K + g * gs;
      for (int j = 0; j < gs; j += 16) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + j), inv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + j + 8), inv));
        __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8); /* a0..7, b0..7 as int16 */
        _mm_storeu_si128((__m128i *)(q + j),
                         _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
      }
    }
}

/* ---- quad v, half h (rows 8h..8h+7) of the super block at src, unpacked ---- */
AI __m256i ld(const uint8_t *p) { return _mm256_load_si256((const __m256i *)p); }
AI __m256i srl(__m256i v, int s) { return _mm256_srli_epi16(v, s); }
AI __m256i mv_bit(__m256i v, int from, int to) {
  return to >= from ? _mm256_slli_epi16(v, to - from) : srl(v, from - to);
}
AI __m256i quad(const uint8_t *src, int v, int h, const int BITS) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
  const int o = 32 * h;
  if (BITS == 8) return ld(src + 64 * v + o);
  if (BITS == 4 || BITS == 5 || BITS == 6) {
    __m256i q = _mm256_and_si256(srl(ld(src + 64 * (v % 4) + o), 4 * (v / 4)), m4);
    if (BITS == 6)
      q = _mm256_or_si256(q, _mm256_and_si256(mv_bit(ld(src + 256 + 64 * (v % 2) + o), 2 * (v / 2), 4),
                                              _mm256_set1_epi8(0x30)));
    if (BITS == 5) q = _mm256_or_si256(q, _mm256_and_si256(mv_bit(ld(src + 256 + o), v, 4), _mm256_set1_epi8(0x10)));
    return q;
  }
  __m256i q = _mm256_and_si256(srl(ld(src + 64 * (v % 2) + o), 2 * (v / 2)), m2);
  if (BITS == 3) q = _mm256_or_si256(q, _mm256_and_si256(mv_bit(ld(src + 128 + o), v, 2), _mm256_set1_epi8(0x04)));
  return q;
}

/* acc += per int32 lane, sum of the 4 products of unsigned codes w and signed x (exact) */
AI __m256i dot(__m256i acc, __m256i w, __m256i x, const int BITS) {
#ifdef SM_I8_AVXVNNI
  (void)BITS;
  return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
  const __m256i one = _mm256_set1_epi16(1);
  if (BITS == 8) { /* w = 16 hi + lo with 4-bit halves: no saturation in vpmaddubsw */
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(w, m4), x);
    __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(srl(w, 4), m4), x);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(lo, one));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(hi, _mm256_set1_epi16(16)));
  }
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), one));
#endif
}

AI __m256 ld_sc(const uint8_t *p, int h, const int DT) {
  if (DT == SM_DT_F16) return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)p + h));
  if (DT == SM_DT_BF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_load_si128((const __m128i *)p + h)), 16));
  return _mm256_load_ps((const float *)p + 8 * h);
}
AI __m256i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
/* the valid rows of half h of row block rb: 8 floats from v to y (y = row 16 rb + 8 h) */
AI void store_rows(float *y, __m256 v, int64_t rows, int64_t rb, int h) {
  const int64_t n = rows - rb * 16 - 8 * h;
  if (n >= 8) {
    _mm256_storeu_ps(y, v);
    return;
  }
  float t[8];
  _mm256_storeu_ps(t, v);
  for (int64_t i = 0; i < n; i++) y[i] = t[i];
}

/* ---- decode: one or two tokens ---- */
/* NT tokens (xq, xs, xsum of token t a row after token t - 1's) into y + t rows: each row block's codes
 * decoded once for them, each token's operations and their order independent of NT (the same bits alone
 * and in a batch; with 16 registers two tokens are the most without spills) */
AI void mvn_t(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y, const int BITS, const int DT, const int NT) {
  const sm_cpu_packed *p = a->p;
  const int gs = p->gs, es = DT == SM_DT_F32 ? 4 : 2;
  const int64_t K = p->cols, ng = p->ng;
  for (int64_t rb = rb0; rb < rb1; rb++) {
    const uint8_t *s = p->data + (size_t)rb * p->rbbytes;
    __m256 acc[2][2], bacc[2][2];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = bacc[t][0] = bacc[t][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++, s += p->gbytes) {
      if (a->pf)
        for (size_t o = 0; o < p->gbytes; o += 64) _mm_prefetch((const char *)s + a->pf + o, _MM_HINT_T0);
      const uint8_t *d = s + 32 * es;
      __m256i i0[2], i1[2];
      for (int t = 0; t < NT; t++) i0[t] = i1[t] = _mm256_setzero_si256();
      for (int sb = 0; sb < gs / 32; sb++) {
        const uint8_t *src = d + (size_t)sb * 64 * BITS;
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
          const __m256i q0 = quad(src, v, 0, BITS), q1 = quad(src, v, 1, BITS);
#pragma GCC unroll 2
          for (int t = 0; t < NT; t++) {
            const __m256i x = bcast4(a->xq + (size_t)t * (size_t)K + g * gs + sb * 32 + 4 * v);
            i0[t] = dot(i0[t], q0, x, BITS);
            i1[t] = dot(i1[t], q1, x, BITS);
          }
        }
      }
      const __m256 s0 = ld_sc(s, 0, DT), s1 = ld_sc(s, 1, DT), b0 = ld_sc(s + 16 * es, 0, DT),
                   b1 = ld_sc(s + 16 * es, 1, DT);
#pragma GCC unroll 2
      for (int t = 0; t < NT; t++) {
        const __m256 xs = _mm256_set1_ps(a->xs[(size_t)t * (size_t)ng + (size_t)g]),
                     xm = _mm256_set1_ps(a->xsum[(size_t)t * (size_t)ng + (size_t)g]);
        acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0[t]), _mm256_mul_ps(s0, xs), acc[t][0]);
        acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1[t]), _mm256_mul_ps(s1, xs), acc[t][1]);
        bacc[t][0] = _mm256_fmadd_ps(b0, xm, bacc[t][0]);
        bacc[t][1] = _mm256_fmadd_ps(b1, xm, bacc[t][1]);
      }
    }
    for (int t = 0; t < NT; t++)
      for (int h = 0; h < 2; h++)
        if (rb * 16 + 8 * h < p->rows)
          store_rows(y + (size_t)t * (size_t)p->rows + rb * 16 + 8 * h, _mm256_add_ps(acc[t][h], bacc[t][h]), p->rows,
                     rb, h);
  }
}

/* ---- batches: unpack a row block, then 2 tokens x 16 rows a step ---- */
AI void unpack_t(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI, const int BITS, const int DT) {
  const int gs = p->gs, es = DT == SM_DT_F32 ? 4 : 2;
  const uint8_t *s = p->data + (size_t)rb * p->rbbytes;
  for (int64_t g = 0; g < p->ng; g++, s += p->gbytes) {
    for (int h = 0; h < 2; h++) {
      _mm256_store_ps(SC + g * 16 + 8 * h, ld_sc(s, h, DT));
      _mm256_store_ps(BI + g * 16 + 8 * h, ld_sc(s + 16 * es, h, DT));
    }
    for (int sb = 0; sb < gs / 32; sb++) {
      const uint8_t *src = s + 32 * es + (size_t)sb * 64 * BITS;
      uint8_t *u = U + ((size_t)g * (size_t)gs + (size_t)sb * 32) * 16;
#pragma GCC unroll 8
      for (int v = 0; v < 8; v++) {
        _mm256_store_si256((__m256i *)(u + 64 * v), quad(src, v, 0, BITS));
        _mm256_store_si256((__m256i *)(u + 64 * v + 32), quad(src, v, 1, BITS));
      }
    }
  }
}

AI void gemm_t(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0, float *y,
               int64_t ldy, const int T, const int BITS) {
  const sm_cpu_packed *p = a->p;
  const int64_t K = p->cols, ng = p->ng;
  const int gs = p->gs;
  const int8_t *xq = a->xq + (size_t)t0 * (size_t)K;
  __m256 acc[2][2];
  for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; g++) {
    __m256i is[2][2];
    for (int t = 0; t < T; t++) is[t][0] = is[t][1] = _mm256_setzero_si256();
    const uint8_t *u = U + (size_t)g * (size_t)gs * 16;
    const int8_t *xg = xq + g * gs;
    for (int q = 0; q < gs / 4; q++) {
      const __m256i w0 = ld(u + 64 * q), w1 = ld(u + 64 * q + 32);
      for (int t = 0; t < T; t++) {
        const __m256i x = bcast4(xg + (size_t)t * (size_t)K + 4 * q);
        is[t][0] = dot(is[t][0], w0, x, BITS);
        is[t][1] = dot(is[t][1], w1, x, BITS);
      }
    }
    for (int t = 0; t < T; t++) {
      const __m256 xs = _mm256_set1_ps(a->xs[(size_t)(t0 + t) * (size_t)ng + (size_t)g]);
      for (int h = 0; h < 2; h++)
        acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t][h]),
                                    _mm256_mul_ps(_mm256_load_ps(SC + g * 16 + 8 * h), xs), acc[t][h]);
    }
  }
  for (int t = 0; t < T; t++) {
    const float *xsum = a->xsum + (size_t)(t0 + t) * (size_t)ng;
    for (int h = 0; h < 2; h++) {
      if (rb * 16 + 8 * h >= p->rows) continue;
      __m256 bacc = _mm256_setzero_ps();
      for (int64_t g = 0; g < ng; g++)
        bacc = _mm256_fmadd_ps(_mm256_load_ps(BI + g * 16 + 8 * h), _mm256_set1_ps(xsum[g]), bacc);
      store_rows(y + (size_t)(t0 + t) * (size_t)ldy + (size_t)rb * 16 + 8 * h, _mm256_add_ps(acc[t][h], bacc), p->rows,
                 rb, h);
    }
  }
}

#define DT_SWITCH(CALL) \
  switch (p->sdt) { \
    case SM_DT_F16: { \
      const int DT = SM_DT_F16; \
      CALL; \
    } break; \
    case SM_DT_BF16: { \
      const int DT = SM_DT_BF16; \
      CALL; \
    } break; \
    default: { \
      const int DT = SM_DT_F32; \
      CALL; \
    } break; \
  }
#define BITS_FNS(B) \
  static void mv_q##B(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) { \
    const sm_cpu_packed *p = a->p; \
    DT_SWITCH(mvn_t(a, rb0, rb1, y, B, DT, 1)) \
  } \
  static void mvn_q##B(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) { \
    const sm_cpu_packed *p = a->p; \
    for (int t = 0; t < a->n; t += 2) { \
      sm_i8_arg b = *a; \
      b.xq += (size_t)t * (size_t)p->cols; \
      b.xs += (size_t)t * (size_t)p->ng; \
      b.xsum += (size_t)t * (size_t)p->ng; \
      float *yt = y + (size_t)t * (size_t)p->rows; \
      if (a->n - t >= 2) { \
        DT_SWITCH(mvn_t(&b, rb0, rb1, yt, B, DT, 2)) \
      } else { \
        DT_SWITCH(mvn_t(&b, rb0, rb1, yt, B, DT, 1)) \
      } \
    } \
  } \
  static void unp_q##B(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI) { \
    DT_SWITCH(unpack_t(p, rb, U, SC, BI, B, DT)) \
  } \
  static void gemm_q##B(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0, \
                        int t1, float *y, int64_t ldy) { \
    int t = t0; \
    for (; t + 2 <= t1; t += 2) gemm_t(a, U, SC, BI, rb, t, y, ldy, 2, B); \
    if (t < t1) gemm_t(a, U, SC, BI, rb, t, y, ldy, 1, B); \
  }
BITS_FNS(2)
BITS_FNS(3)
BITS_FNS(4)
BITS_FNS(5)
BITS_FNS(6)
BITS_FNS(8)

#define BITS_SWITCH(F, ...) \
  switch (bits) { \
    case 2: F##_q2(__VA_ARGS__); break; \
    case 3: F##_q3(__VA_ARGS__); break; \
    case 4: F##_q4(__VA_ARGS__); break; \
    case 5: F##_q5(__VA_ARGS__); break; \
    case 6: F##_q6(__VA_ARGS__); break; \
    default: F##_q8(__VA_ARGS__); break; \
  }
void I8(matvec)(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) {
  const int bits = a->p->bits;
  BITS_SWITCH(mv, a, rb0, rb1, y)
}
void I8(matvec_n)(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) {
  const int bits = a->p->bits;
  BITS_SWITCH(mvn, a, rb0, rb1, y)
}
void I8(unpack)(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI) {
  const int bits = p->bits;
  BITS_SWITCH(unp, p, rb, U, SC, BI)
}
void I8(gemm)(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0, int t1,
              float *y, int64_t ldy) {
  const int bits = a->p->bits;
  BITS_SWITCH(gemm, a, U, SC, BI, rb, t0, t1, y, ldy)
}
#else
/* not x86-64: no such kernels (the ok check says so) */
#include "backend/cpu/cpu_internal.h"
#ifdef SM_I8_AVXVNNI
#define I8(x) sm_i8avxvnni_##x
#else
#define I8(x) sm_i8avx2_##x
#endif
bool I8(ok)(void) { return false; }
void I8(quant)(const float *x, int64_t K, int gs, int t0, int t1, int8_t *xq, float *xs, float *xsum) {
  (void)x;
  (void)K;
  (void)gs;
  (void)t0;
  (void)t1;
  (void)xq;
  (void)xs;
  (void)xsum;
}
void I8(matvec)(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) {
  (void)a;
  (void)rb0;
  (void)rb1;
  (void)y;
}
void I8(matvec_n)(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y) {
  (void)a;
  (void)rb0;
  (void)rb1;
  (void)y;
}
void I8(unpack)(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI) {
  (void)p;
  (void)rb;
  (void)U;
  (void)SC;
  (void)BI;
}
void I8(gemm)(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0, int t1,
              float *y, int64_t ldy) {
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
