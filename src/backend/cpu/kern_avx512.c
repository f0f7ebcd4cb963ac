/* AVX-512 (F/BW/VL/DQ + FMA + F16C) kernels. Compiled for that target only; used after a
 * run-time CPU check, so the binary still runs on any x86-64. */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2")
#include "backend/cpu/cpu_internal.h"
#include "backend/kv_quant.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define V 16
#ifndef SM_PF_DIST
#define SM_PF_DIST 2048 /* software prefetch distance (bytes) for streamed weights */
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

static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

/* ---------------- x preparation ---------------- */
static void prep_x(const sm_weight *w, const float *x, float *xp, float *xsum) {
  int64_t K = w->cols;
  if (w->bits == 0) {
    memcpy(xp, x, (size_t)K * sizeof(float));
    return;
  }
  int gs = w->group_size;
  for (int64_t g = 0; g < K / gs; g++) {
    __m512 s = _mm512_setzero_ps();
    for (int j = 0; j < gs; j += V) s = _mm512_add_ps(s, _mm512_loadu_ps(x + g * gs + j));
    xsum[g] = hsum(s);
  }
  if (w->bits == 4) {
    for (int64_t b = 0; b < K; b += 32)
      for (int j = 0; j < 16; j++) {
        xp[b + j] = x[b + 2 * j];
        xp[b + 16 + j] = x[b + 2 * j + 1];
      }
  } else if (w->bits == 2) {
    for (int64_t b = 0; b < K; b += 32)
      for (int j = 0; j < 8; j++)
        for (int s = 0; s < 4; s++) xp[b + s * 8 + j] = x[b + 4 * j + s];
  } else {
    memcpy(xp, x, (size_t)K * sizeof(float));
  }
}

/* generic unpack of 16 consecutive b-bit values (natural order) from p (16 readable bytes) */
typedef struct {
  __m256i ctrl;
  __m512i shift;
  __m512i mask;
} gen_unpack;
static inline gen_unpack gen_init(int bits) {
  gen_unpack u;
  uint8_t c[32];
  uint32_t sh[16];
  for (int i = 0; i < 16; i++) {
    int off = (i * bits) >> 3;
    c[2 * i] = (uint8_t)off;
    c[2 * i + 1] = (uint8_t)(off + 1);
    sh[i] = (uint32_t)((i * bits) & 7);
  }
  u.ctrl = _mm256_loadu_si256((const __m256i *)c);
  u.shift = _mm512_loadu_si512(sh);
  u.mask = _mm512_set1_epi32((1 << bits) - 1);
  return u;
}
static inline __m512 gen_load16(const gen_unpack *u, const uint8_t *p) {
  __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
  __m256i w16 = _mm256_shuffle_epi8(b, u->ctrl);
  __m512i w = _mm512_cvtepu16_epi32(w16);
  w = _mm512_and_si512(_mm512_srlv_epi32(w, u->shift), u->mask);
  return _mm512_cvtepi32_ps(w);
}

/* ---------------- matvec ---------------- */
/* 4-bit: two rows per pass (x loads shared), group size and scale dtype as constants */
static inline __attribute__((always_inline)) float ldsc_c(const void *p, size_t i, const int DT) {
  if (DT == SM_DT_F32) return ((const float *)p)[i];
  if (DT == SM_DT_F16) return _cvtsh_ss(((const uint16_t *)p)[i]);
  union {
    uint32_t u;
    float f;
  } v;
  v.u = (uint32_t)((const uint16_t *)p)[i] << 16;
  return v.f;
}
static inline __attribute__((always_inline)) void mv_q4_t(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y,
                                                          const int GS, const int DT) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols, ng = K / GS;
  const size_t rb = (size_t)K / 2;
  const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const void *S = w->scales, *B = w->biases;
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) {
    const uint8_t *q0 = (const uint8_t *)w->data + (size_t)r * rb, *q1 = q0 + rb;
    const float *xp = a->xp;
    __m512 t0 = _mm512_setzero_ps(), t1 = _mm512_setzero_ps();
    __m512 bs = _mm512_setzero_ps();
    size_t si0 = (size_t)r * (size_t)ng, si1 = si0 + (size_t)ng;
    for (int64_t g = 0; g < ng; g++) {
      if (GS >= 64 || (g & 1) == 0) { /* one prefetch per 64-byte line and row */
        _mm_prefetch((const char *)q0 + SM_PF_DIST, _MM_HINT_T0);
        _mm_prefetch((const char *)q1 + SM_PF_DIST, _MM_HINT_T0);
      }
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int j = 0; j < GS; j += 32) {
        __m512i u0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q0));
        __m512i u1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q1));
        __m512 xl = _mm512_loadu_ps(xp), xh = _mm512_loadu_ps(xp + 16);
        a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(u0, lut), xl, a0);
        a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(u0, 4), lut), xh, a1);
        b0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(u1, lut), xl, b0);
        b1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(u1, 4), lut), xh, b1);
        q0 += 16;
        q1 += 16;
        xp += 32;
      }
      t0 = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), _mm512_set1_ps(ldsc_c(S, si0 + (size_t)g, DT)), t0);
      t1 = _mm512_fmadd_ps(_mm512_add_ps(b0, b1), _mm512_set1_ps(ldsc_c(S, si1 + (size_t)g, DT)), t1);
      if (B) {
        float xs = a->xsum[g];
        bs = _mm512_fmadd_ps(_mm512_setr_ps(ldsc_c(B, si0 + (size_t)g, DT), ldsc_c(B, si1 + (size_t)g, DT), 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                             _mm512_set1_ps(xs), bs);
      }
    }
    float bb[16];
    _mm512_storeu_ps(bb, bs);
    y[r - r0] = hsum(t0) + bb[0];
    y[r + 1 - r0] = hsum(t1) + bb[1];
  }
  for (; r < r1; r++) {
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * rb;
    const float *xp = a->xp;
    __m512 tot = _mm512_setzero_ps();
    float bsum = 0.f;
    for (int64_t g = 0; g < ng; g++) {
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      for (int j = 0; j < GS; j += 32) {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
        a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(b, lut), _mm512_loadu_ps(xp), a0);
        a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut), _mm512_loadu_ps(xp + 16), a1);
        q += 16;
        xp += 32;
      }
      size_t si = (size_t)(r * ng + g);
      tot = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), _mm512_set1_ps(ldsc_c(S, si, DT)), tot);
      if (B) bsum += ldsc_c(B, si, DT) * a->xsum[g];
    }
    y[r - r0] = hsum(tot) + bsum;
  }
}
#define MV_Q4_DT(GS) \
  static void mv_q4_g##GS(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) { \
    switch (a->w->dtype) { \
      case SM_DT_F16: mv_q4_t(a, r0, r1, y, GS, SM_DT_F16); break; \
      case SM_DT_BF16: mv_q4_t(a, r0, r1, y, GS, SM_DT_BF16); break; \
      default: mv_q4_t(a, r0, r1, y, GS, SM_DT_F32); break; \
    } \
  }
MV_Q4_DT(32)
MV_Q4_DT(64)
MV_Q4_DT(128)
static void mv_q4(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  switch (a->w->group_size) {
    case 32: mv_q4_g32(a, r0, r1, y); break;
    case 64: mv_q4_g64(a, r0, r1, y); break;
    default: mv_q4_g128(a, r0, r1, y); break;
  }
}

static void mv_q2(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K / 4;
  const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
  const __m512i shA = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i shB = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * rb;
    const float *xp = a->xp;
    __m512 tot = _mm512_setzero_ps();
    float bsum = 0.f;
    for (int64_t g = 0; g < ng; g++) {
      _mm_prefetch((const char *)q + SM_PF_DIST, _MM_HINT_T0);
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      for (int j = 0; j < gs; j += 32) {
        uint64_t v;
        memcpy(&v, q, 8);
        __m512i b = _mm512_cvtepu8_epi32(_mm_set1_epi64x((long long)v));
        a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srlv_epi32(b, shA), lut), _mm512_loadu_ps(xp), a0);
        a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srlv_epi32(b, shB), lut), _mm512_loadu_ps(xp + 16), a1);
        q += 8;
        xp += 32;
      }
      size_t si = (size_t)(r * ng + g);
      tot = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), _mm512_set1_ps(ldsc(w->scales, si, w->dtype)), tot);
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
    __m512 tot = _mm512_setzero_ps();
    float bsum = 0.f;
    for (int64_t g = 0; g < ng; g++) {
      for (int j = 0; j < gs; j += 64) _mm_prefetch((const char *)q + j + SM_PF_DIST, _MM_HINT_T0);
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      for (int j = 0; j < gs; j += 32) {
        __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q)));
        __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
        a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp), a0);
        a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp + 16), a1);
        q += 32;
        xp += 32;
      }
      size_t si = (size_t)(r * ng + g);
      tot = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), _mm512_set1_ps(ldsc(w->scales, si, w->dtype)), tot);
      if (w->biases) bsum += ldsc(w->biases, si, w->dtype) * a->xsum[g];
    }
    y[r - r0] = hsum(tot) + bsum;
  }
}

/* 3, 5, 6 bits (and any other width): shuffle-based unpack, 16 values per step */
static void mv_qgen(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int bits = w->bits;
  const int64_t K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rb = (size_t)K * (size_t)bits / 8;
  const size_t step = 2 * (size_t)bits; /* bytes per 16 values */
  gen_unpack u = gen_init(bits);
  uint8_t tmp[32];
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    const float *xp = a->xp;
    __m512 tot = _mm512_setzero_ps();
    float bsum = 0.f;
    size_t off = 0;
    for (int64_t g = 0; g < ng; g++) {
      _mm_prefetch((const char *)row + off + SM_PF_DIST, _MM_HINT_T0);
      if (gs * bits > 512) _mm_prefetch((const char *)row + off + 64 + SM_PF_DIST, _MM_HINT_T0);
      __m512 a0 = _mm512_setzero_ps();
      for (int j = 0; j < gs; j += 16) {
        const uint8_t *p = row + off;
        if (off + 16 > rb) {
          memset(tmp, 0, sizeof tmp);
          memcpy(tmp, p, rb - off);
          p = tmp;
        }
        a0 = _mm512_fmadd_ps(gen_load16(&u, p), _mm512_loadu_ps(xp), a0);
        off += step;
        xp += 16;
      }
      size_t si = (size_t)(r * ng + g);
      tot = _mm512_fmadd_ps(a0, _mm512_set1_ps(ldsc(w->scales, si, w->dtype)), tot);
      if (w->biases) bsum += ldsc(w->biases, si, w->dtype) * a->xsum[g];
    }
    y[r - r0] = hsum(tot) + bsum;
  }
}

static inline __m512 ld_dense(const void *p, int64_t i, sm_dtype t) {
  switch (t) {
    case SM_DT_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    case SM_DT_BF16:
      return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i))), 16));
    default: return _mm512_loadu_ps((const float *)p + i);
  }
}
static inline __m512 ld_dense_mask(const void *p, int64_t i, sm_dtype t, __mmask16 m) {
  switch (t) {
    case SM_DT_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    case SM_DT_BF16:
      return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    default: return _mm512_maskz_loadu_ps(m, (const float *)p + i);
  }
}

static void mv_dense(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y) {
  const sm_weight *w = a->w;
  const int64_t K = w->cols;
  const size_t es = w->dtype == SM_DT_F32 ? 4 : 2;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)K * es;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
      _mm_prefetch((const char *)row + (size_t)k * es + SM_PF_DIST, _MM_HINT_T0);
      _mm_prefetch((const char *)row + (size_t)k * es + 64 + SM_PF_DIST, _MM_HINT_T0);
      if (es == 4) {
        _mm_prefetch((const char *)row + (size_t)k * es + 128 + SM_PF_DIST, _MM_HINT_T0);
        _mm_prefetch((const char *)row + (size_t)k * es + 192 + SM_PF_DIST, _MM_HINT_T0);
      }
      s0 = _mm512_fmadd_ps(ld_dense(row, k, w->dtype), _mm512_loadu_ps(a->xp + k), s0);
      s1 = _mm512_fmadd_ps(ld_dense(row, k + 16, w->dtype), _mm512_loadu_ps(a->xp + k + 16), s1);
      s2 = _mm512_fmadd_ps(ld_dense(row, k + 32, w->dtype), _mm512_loadu_ps(a->xp + k + 32), s2);
      s3 = _mm512_fmadd_ps(ld_dense(row, k + 48, w->dtype), _mm512_loadu_ps(a->xp + k + 48), s3);
    }
    for (; k < K; k += 16) {
      __mmask16 m = K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1);
      s0 = _mm512_fmadd_ps(ld_dense_mask(row, k, w->dtype, m), _mm512_maskz_loadu_ps(m, a->xp + k), s0);
    }
    y[r - r0] = hsum(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
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

/* ---------------- gemm (prefill) ---------------- */
#define PANEL 32

/* dequantize/convert row r, columns [k0, k0+kc) into out (natural order) */
static void deq_range(const sm_weight *w, int64_t r, int64_t k0, int kc, float *out) {
  const int64_t K = w->cols;
  if (w->bits == 0) {
    const size_t es = w->dtype == SM_DT_F32 ? 4 : 2;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)K * es;
    int k = 0;
    for (; k + 16 <= kc; k += 16) _mm512_storeu_ps(out + k, ld_dense(row, k0 + k, w->dtype));
    if (k < kc) {
      __mmask16 m = (__mmask16)((1u << (kc - k)) - 1);
      _mm512_mask_storeu_ps(out + k, m, ld_dense_mask(row, k0 + k, w->dtype, m));
    }
    return;
  }
  const int bits = w->bits, gs = w->group_size;
  const int64_t ng = K / gs;
  const size_t rb = (size_t)K * (size_t)bits / 8;
  const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
  gen_unpack u = gen_init(bits);
  uint8_t tmp[32];
  for (int k = 0; k < kc; k += 16) {
    int64_t kk = k0 + k;
    size_t off = (size_t)kk * (size_t)bits / 8;
    const uint8_t *p = row + off;
    if (off + 16 > rb) {
      memset(tmp, 0, sizeof tmp);
      memcpy(tmp, p, rb - off);
      p = tmp;
    }
    size_t si = (size_t)(r * ng + kk / gs);
    float s = ldsc(w->scales, si, w->dtype), b = w->biases ? ldsc(w->biases, si, w->dtype) : 0.f;
    _mm512_storeu_ps(out + k, _mm512_fmadd_ps(gen_load16(&u, p), _mm512_set1_ps(s), _mm512_set1_ps(b)));
  }
}

static void pack_panel(const sm_weight *w, int64_t r0, int nr, int64_t k0, int kc, float *dst, float *tmp) {
  int kc16 = (kc + 15) & ~15;
  for (int rr = 0; rr < PANEL; rr++) {
    if (rr < nr) deq_range(w, r0 + rr, k0, kc, tmp + (size_t)rr * kc16);
    else memset(tmp + (size_t)rr * kc16, 0, (size_t)kc16 * sizeof(float));
  }
  /* transpose 16x16 blocks: tmp[rr][k] -> dst[k][rr] */
  for (int k = 0; k < kc; k += 16) {
    for (int rb = 0; rb < PANEL; rb += 16) {
      __m512 m[16];
      for (int i = 0; i < 16; i++) m[i] = _mm512_loadu_ps(tmp + (size_t)(rb + i) * kc16 + k);
      /* 16x16 transpose */
      __m512 t[16];
      for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(m[i], m[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(m[i], m[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {
        m[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        m[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        m[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        m[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(m[i], m[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(m[i], m[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(m[i + 8], m[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(m[i + 8], m[i + 12], 0xDD);
      }
      for (int i = 0; i < 4; i++) {
        m[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        m[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
        m[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        m[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
      }
      /* m[j] now holds column k+j of rows rb..rb+15 */
      for (int j = 0; j < 16 && k + j < kc; j++) _mm512_storeu_ps(dst + (size_t)(k + j) * PANEL + rb, m[j]);
    }
  }
}

static inline __attribute__((always_inline)) void gemm_micro(const float *P, int kc, const float *x, int64_t ldx,
                                                             float *y, int64_t ldy, __mmask16 m0, __mmask16 m1,
                                                             const int NT) {
  __m512 c0[6], c1[6];
#pragma GCC unroll 6
  for (int i = 0; i < NT; i++) {
    c0[i] = _mm512_maskz_loadu_ps(m0, y + i * ldy);
    c1[i] = _mm512_maskz_loadu_ps(m1, y + i * ldy + 16);
  }
  for (int k = 0; k < kc; k++) {
    __m512 w0 = _mm512_loadu_ps(P + (size_t)k * PANEL), w1 = _mm512_loadu_ps(P + (size_t)k * PANEL + 16);
#pragma GCC unroll 6
    for (int i = 0; i < NT; i++) {
      __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
      c0[i] = _mm512_fmadd_ps(w0, xb, c0[i]);
      c1[i] = _mm512_fmadd_ps(w1, xb, c1[i]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < NT; i++) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, c0[i]);
    _mm512_mask_storeu_ps(y + i * ldy + 16, m1, c1[i]);
  }
}

static void gemm_panel(const float *P, int kc, const float *x, int64_t ldx, int nt, float *y, int64_t ldy, int nr) {
  __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
  __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
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

/* ---------------- vector helpers ---------------- */
static float dot(const float *a, const float *b, int n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return hsum(_mm512_add_ps(s0, s1));
}
static void axpy(float *y, float a, const float *x, int n) {
  __m512 va = _mm512_set1_ps(a);
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}
static void scal(float *y, float a, int n) {
  __m512 va = _mm512_set1_ps(a);
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(y + i)));
  for (; i < n; i++) y[i] *= a;
}

/* ---------------- attention tiles ---------------- */
static inline __attribute__((always_inline)) void sc_tile(const float *q, int ldq, const float *const *kr, int np,
                                                          int hd, float *s, int lds, const int NQ) {
  int j = 0;
  for (; j + 2 <= np; j += 2) {
    __m512 a[NQ], b[NQ];
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) a[i] = b[i] = _mm512_setzero_ps();
    const float *k0 = kr[j], *k1 = kr[j + 1];
    for (int d = 0; d < hd; d += 16) {
      __mmask16 m = hd - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (hd - d)) - 1);
      __m512 v0 = _mm512_maskz_loadu_ps(m, k0 + d), v1 = _mm512_maskz_loadu_ps(m, k1 + d);
#pragma GCC unroll 8
      for (int i = 0; i < NQ; i++) {
        __m512 qv = _mm512_maskz_loadu_ps(m, q + (size_t)i * ldq + d);
        a[i] = _mm512_fmadd_ps(qv, v0, a[i]);
        b[i] = _mm512_fmadd_ps(qv, v1, b[i]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) {
      s[(size_t)i * lds + j] = hsum(a[i]);
      s[(size_t)i * lds + j + 1] = hsum(b[i]);
    }
  }
  for (; j < np; j++) {
    __m512 a[NQ];
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) a[i] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 16) {
      __mmask16 m = hd - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (hd - d)) - 1);
      __m512 v0 = _mm512_maskz_loadu_ps(m, kr[j] + d);
#pragma GCC unroll 8
      for (int i = 0; i < NQ; i++) a[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + (size_t)i * ldq + d), v0, a[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) s[(size_t)i * lds + j] = hsum(a[i]);
  }
}
/* in-register 16x16 transpose: m[i][j] -> m[j][i] */
static inline __attribute__((always_inline)) void tr16(__m512 m[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(m[i], m[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(m[i], m[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    m[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    m[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    m[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    m[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_f32x4(m[i], m[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(m[i], m[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(m[i + 8], m[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(m[i + 8], m[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; i++) {
    m[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    m[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    m[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    m[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
  }
}
/* scores as a small GEMM against the transposed key chunk KT[d][64] (built once per call,
 * shared by all nq rows): no horizontal sums */
static inline __attribute__((always_inline)) void sct_tile(const float *q, int ldq, const float *KT, int hd, int np,
                                                           float *s, int lds, const int NQ) {
  __m512 a[NQ][4];
#pragma GCC unroll 8
  for (int i = 0; i < NQ; i++)
#pragma GCC unroll 8
    for (int v = 0; v < 4; v++) a[i][v] = _mm512_setzero_ps();
  for (int d = 0; d < hd; d++) {
    const float *kt = KT + (size_t)d * 64;
    __m512 k0 = _mm512_load_ps(kt), k1 = _mm512_load_ps(kt + 16), k2 = _mm512_load_ps(kt + 32),
           k3 = _mm512_load_ps(kt + 48);
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) {
      __m512 qb = _mm512_set1_ps(q[(size_t)i * ldq + d]);
      a[i][0] = _mm512_fmadd_ps(qb, k0, a[i][0]);
      a[i][1] = _mm512_fmadd_ps(qb, k1, a[i][1]);
      a[i][2] = _mm512_fmadd_ps(qb, k2, a[i][2]);
      a[i][3] = _mm512_fmadd_ps(qb, k3, a[i][3]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NQ; i++)
#pragma GCC unroll 8
    for (int v = 0; v < 4; v++) {
      int n = np - 16 * v;
      if (n <= 0) break;
      __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
      _mm512_mask_storeu_ps(s + (size_t)i * lds + 16 * v, m, a[i][v]);
    }
}
/* 16 values d.. of a K/V row: f32, or f16 widened in the register (H) */
static inline __attribute__((always_inline)) __m512 ldrow16(const void *p, int d, __mmask16 m, const int H) {
  return H ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + d))
           : _mm512_maskz_loadu_ps(m, (const float *)p + d);
}
static inline __attribute__((always_inline)) void att_scores_g(const float *q, int ldq, int nq, const void *const *kr,
                                                               int np, int hd, float *s, int lds, const int H) {
  if (H || (hd % 16 == 0 && hd <= 256 && np <= 64)) { /* by head_dim only: a row's scores don't depend on nq */
    float KT[256 * 64] __attribute__((aligned(64)));
    for (int j0 = 0; j0 < 64; j0 += 16)
      for (int d0 = 0; d0 < hd; d0 += 16) {
        __m512 m[16];
        for (int j = 0; j < 16; j++) m[j] = j0 + j < np ? ldrow16(kr[j0 + j], d0, 0xFFFF, H) : _mm512_setzero_ps();
        tr16(m); /* m[dd] = positions j0..j0+15 of dimension d0+dd */
        for (int dd = 0; dd < 16; dd++) _mm512_store_ps(KT + (size_t)(d0 + dd) * 64 + j0, m[dd]);
      }
    int i = 0;
    for (; i + 4 <= nq; i += 4) sct_tile(q + (size_t)i * ldq, ldq, KT, hd, np, s + (size_t)i * lds, lds, 4);
    for (; i < nq; i++) sct_tile(q + (size_t)i * ldq, ldq, KT, hd, np, s + (size_t)i * lds, lds, 1);
    return;
  }
  const float *const *kf = (const float *const *)kr;
  int i = 0;
  for (; i + 4 <= nq; i += 4) sc_tile(q + (size_t)i * ldq, ldq, kf, np, hd, s + (size_t)i * lds, lds, 4);
  for (; i < nq; i++) sc_tile(q + (size_t)i * ldq, ldq, kf, np, hd, s + (size_t)i * lds, lds, 1);
}
static void att_scores(const float *q, int ldq, int nq, const float *const *kr, int np, int hd, float *s, int lds) {
  att_scores_g(q, ldq, nq, (const void *const *)kr, np, hd, s, lds, 0);
}
static void att_scores_f16(const float *q, int ldq, int nq, const void *const *kr, int np, int hd, float *s, int lds) {
  att_scores_g(q, ldq, nq, kr, np, hd, s, lds, 1);
}
static inline __attribute__((always_inline)) void pv_tile(const float *p, int ldp, const void *const *vr, int np, int d,
                                                          __mmask16 m, float *acc, int hd, const int NQ, const int H) {
  __m512 a[NQ];
#pragma GCC unroll 8
  for (int i = 0; i < NQ; i++) a[i] = _mm512_maskz_loadu_ps(m, acc + (size_t)i * hd + d);
  for (int j = 0; j < np; j++) {
    __m512 v = ldrow16(vr[j], d, m, H);
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) a[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)i * ldp + j]), v, a[i]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < NQ; i++) _mm512_mask_storeu_ps(acc + (size_t)i * hd + d, m, a[i]);
}
static inline __attribute__((always_inline)) void att_pv_g(const float *p, int ldp, int nq, const void *const *vr,
                                                           int np, int hd, float *acc, const int H) {
  for (int d = 0; d < hd; d += 16) {
    __mmask16 m = hd - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (hd - d)) - 1);
    int i = 0;
    for (; i + 8 <= nq; i += 8) pv_tile(p + (size_t)i * ldp, ldp, vr, np, d, m, acc + (size_t)i * hd, hd, 8, H);
    for (; i + 4 <= nq; i += 4) pv_tile(p + (size_t)i * ldp, ldp, vr, np, d, m, acc + (size_t)i * hd, hd, 4, H);
    for (; i < nq; i++) pv_tile(p + (size_t)i * ldp, ldp, vr, np, d, m, acc + (size_t)i * hd, hd, 1, H);
  }
}
static void att_pv(const float *p, int ldp, int nq, const float *const *vr, int np, int hd, float *acc) {
  att_pv_g(p, ldp, nq, (const void *const *)vr, np, hd, acc, 0);
}
static void att_pv_f16(const float *p, int ldp, int nq, const void *const *vr, int np, int hd, float *acc) {
  att_pv_g(p, ldp, nq, vr, np, hd, acc, 1);
}

/* ---------------- elementwise (vector exp; rel. error ~2e-7) ---------------- */
static inline __m512 vexp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
/* tanh(x) = 1 - 2/(exp(2x)+1), odd-symmetric via |x| (abs. error ~2e-7) */
static inline __m512 vtanh(__m512 x) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  __m512 ax = _mm512_andnot_ps(sign, x);
  __m512 t =
    _mm512_sub_ps(_mm512_set1_ps(1.f),
                  _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(vexp(_mm512_add_ps(ax, ax)), _mm512_set1_ps(1.f))));
  return _mm512_or_ps(t, _mm512_and_ps(x, sign));
}
static inline __mmask16 tmask(size_t i, size_t n) {
  return n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
}
static void silu_mul(float *out, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = tmask(i, n);
    __m512 v = _mm512_maskz_loadu_ps(m, g + i);
    __m512 s = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.f), vexp(_mm512_sub_ps(_mm512_setzero_ps(), v))));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
  }
}
static void gelu_mul(float *out, const float *g, const float *u, size_t n) {
  const __m512 k0 = _mm512_set1_ps(0.7978845608028654f), k1 = _mm512_set1_ps(0.044715f), h = _mm512_set1_ps(0.5f);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = tmask(i, n);
    __m512 v = _mm512_maskz_loadu_ps(m, g + i);
    __m512 in = _mm512_mul_ps(k0, _mm512_fmadd_ps(_mm512_mul_ps(k1, v), _mm512_mul_ps(v, v), v));
    __m512 r = _mm512_mul_ps(_mm512_mul_ps(h, v), _mm512_add_ps(_mm512_set1_ps(1.f), vtanh(in)));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, u + i)));
  }
}
static void softcap(float *y, float cap, size_t n) {
  const __m512 c = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.f / cap);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = tmask(i, n);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(c, vtanh(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), inv))));
  }
}

/* a q8_0 head row of n values: 16 codes at a time sign-extended, converted and scaled by their group's
 * f16 scale (masked for a last, shorter group) */
static void widen_q8(float *out, const void *src, size_t n) {
  const int8_t *q = src;
  const uint16_t *sc = (const uint16_t *)((const char *)src + sm_kv_scale_offset(SM_DT_Q8_0, (int)n));
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tmask(i, n);
    const __m512 d = _mm512_set1_ps(sm_f16_to_f32(sc[i / SM_KV_QGROUP]));
    const __m512i w = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + i));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_cvtepi32_ps(w), d));
  }
}

/* a q4_0 head row of n values: a group of 32 from 16 bytes, nibbles split and interleaved back into
 * order (a last, shorter group by the reference) */
static void widen_q4(float *out, const void *src, size_t n) {
  const uint8_t *q = src;
  const uint16_t *sc = (const uint16_t *)((const char *)src + sm_kv_scale_offset(SM_DT_Q4_0, (int)n));
  const __m128i m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
  size_t i = 0;
  for (; i + SM_KV_QGROUP <= n; i += SM_KV_QGROUP) {
    const __m512 d = _mm512_set1_ps(sm_f16_to_f32(sc[i / SM_KV_QGROUP]));
    const __m128i x = _mm_loadu_si128((const __m128i *)(q + i / 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(x, m), e),
                  hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m), e);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(lo, hi))), d));
    _mm512_storeu_ps(out + i + 16,
                     _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(lo, hi))), d));
  }
  sm_kv_dequantize_tail(out, src, SM_DT_Q4_0, (int)n, (int)i);
}

/* floats to f16 (vcvtps2ph, round to nearest even) or bf16 (the integer rounding of sm_f32_to_bf16), 16
 * at a time (masked for the tail); NaN lanes get the bits sm_f32_to_f16 / sm_f32_to_bf16 give them */
static void narrow(void *dst, const float *x, sm_dtype dt, size_t n) {
  uint16_t *d = dst;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tmask(i, n);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i sign16 = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000));
    __m512i r;
    if (dt == SM_DT_F16) {
      r = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(sign16, _mm512_set1_epi32(0x7e00)));
    } else {
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    }
    _mm256_mask_storeu_epi16(d + i, m, _mm512_cvtepi32_epi16(r));
  }
}

/* half-precision KV rows to float: vcvtph2ps (f16), a 16-bit shift (bf16); quantized head rows
 * dequantized */
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
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tmask(i, n);
    const __m256i h = _mm256_maskz_loadu_epi16(m, s + i);
    const __m512 v = dt == SM_DT_F16 ? _mm512_cvtph_ps(h)
                                     : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}

/* ---------------- attention softmax rows ---------------- */
static float att_mask_max(float *s, const int32_t *pp, int n, int32_t lo, int32_t hi, float scale, float cap) {
  const __m512i vlo = _mm512_set1_epi32(lo), vhi = _mm512_set1_epi32(hi);
  const __m512 vs = _mm512_set1_ps(scale), vc = _mm512_set1_ps(cap), ninf = _mm512_set1_ps(-INFINITY);
  __m512 mx = ninf;
  for (int j = 0; j < n; j += 16) {
    const __mmask16 t = tmask((size_t)j, (size_t)n);
    const __m512i p = _mm512_maskz_loadu_epi32(t, pp + j);
    const __mmask16 in = _mm512_mask_cmpge_epi32_mask(t, p, vlo) & _mm512_mask_cmple_epi32_mask(t, p, vhi);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(t, s + j), vs);
    if (cap > 0.f) x = _mm512_mul_ps(vc, vtanh(_mm512_div_ps(x, vc)));
    x = _mm512_mask_mov_ps(ninf, in, x);
    _mm512_mask_storeu_ps(s + j, t, x);
    mx = _mm512_max_ps(mx, x);
  }
  return _mm512_reduce_max_ps(mx);
}
static float att_exp_sum(float *s, int n, float m) {
  const __m512 vm = _mm512_set1_ps(m), ninf = _mm512_set1_ps(-INFINITY);
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 16) {
    const __mmask16 t = tmask((size_t)j, (size_t)n);
    const __m512 x = _mm512_maskz_loadu_ps(t, s + j);
    const __mmask16 ok = _mm512_mask_cmp_ps_mask(t, x, ninf, _CMP_NEQ_OQ);
    const __m512 e = _mm512_maskz_mov_ps(ok, vexp(_mm512_sub_ps(x, vm)));
    _mm512_mask_storeu_ps(s + j, t, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

const sm_cpu_kern sm_cpu_kern_avx512 = {
  .name = "avx512",
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
  .att_scores = att_scores,
  .att_pv = att_pv,
  .att_scores_f16 = att_scores_f16,
  .att_pv_f16 = att_pv_f16,
  .att_mask_max = att_mask_max,
  .att_exp_sum = att_exp_sum,
  .widen = widen,
  .narrow = narrow,
  .i8_ok = sm_avx512vnni_i8_ok,
  .prep_xq = sm_avx512vnni_prep_xq,
  .matvec_i8 = sm_avx512vnni_matvec_i8,
  .mv_fp4 = sm_avx512_mv_fp4,
  .fp4_ok = sm_avx512_fp4_ok,
  .pack_fp4 = sm_avx512_pack_fp4,
};
#endif
