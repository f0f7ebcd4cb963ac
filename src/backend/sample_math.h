/* Arithmetic of the token sampler that every backend reproduces bit for bit (host C in
 * src/backend/sample.c, CUDA in src/backend/cuda/cuda_sample.cu). Each operation rounds once
 * (no FMA contraction: SM_F* are the _rn intrinsics on the device, and sample.c is compiled
 * with fp-contract off), exp() is our own polynomial rather than a libm whose last bit
 * differs between platforms, and probability masses are summed as 128-bit fixed-point
 * integers (weight q = floor(e * 2^100)), so sums do not depend on the summation order and
 * a parallel scan on the GPU gives exactly the sequential host result. */
#ifndef SM_SAMPLE_MATH_H
#define SM_SAMPLE_MATH_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SM_SD __host__ __device__ static inline
#else
#define SM_SD static inline
#endif

typedef unsigned __int128 sm_u128;

#ifdef __CUDA_ARCH__
#define SM_FADD(a, b) __fadd_rn((a), (b))
#define SM_FSUB(a, b) __fsub_rn((a), (b))
#define SM_FMUL(a, b) __fmul_rn((a), (b))
#define SM_FDIV(a, b) __fdiv_rn((a), (b))
#define SM_DADD(a, b) __dadd_rn((a), (b))
#define SM_DMUL(a, b) __dmul_rn((a), (b))
#else
#define SM_FADD(a, b) ((float)(a) + (float)(b))
#define SM_FSUB(a, b) ((float)(a) - (float)(b))
#define SM_FMUL(a, b) ((float)(a) * (float)(b))
#define SM_FDIV(a, b) ((float)(a) / (float)(b))
#define SM_DADD(a, b) ((double)(a) + (double)(b))
#define SM_DMUL(a, b) ((double)(a) * (double)(b))
#endif

SM_SD uint32_t sm_sf_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
SM_SD float sm_sf_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

/* The sort/compare key of a logit: NaN -> -inf, +inf -> FLT_MAX, -0 -> +0 (so that a total
 * order "key desc, index asc" exists and radix sorts agree with comparisons). */
SM_SD float sm_sample_key(float v) {
  if (v != v) return -INFINITY;
  if (v > FLT_MAX) return FLT_MAX;
  if (v == 0.0f) return 0.0f;
  return v;
}

/* Penalized logit (repetition: HF style; frequency/presence: OpenAI style). */
SM_SD float sm_sample_penalize(float l, int32_t count, float rep, float freq, float pres) {
  if (rep > 0 && rep != 1.0f) l = l > 0 ? SM_FDIV(l, rep) : SM_FMUL(l, rep);
  return SM_FSUB(l, SM_FADD(SM_FMUL(freq, (float)count), pres));
}

/* exp(x) for x <= 0 (x > 0 is clamped to 0), float arithmetic with one rounding per step:
 * x = k ln2 + r (Cody-Waite), degree-7 Taylor polynomial on |r| <= 0.35, times 2^k.
 * Relative error a few ulp; 0 below -86 (no subnormal results). exp(0) == 1 exactly.
 * sm_sample_exp_core is the arithmetic for x in [-86, 0], without branches (the CPU's row loop
 * runs it on every lane and selects). */
SM_SD float sm_sample_exp_core(float x) {
  const float shift = 0x1.8p23f;
  float kf = SM_FSUB(SM_FADD(SM_FMUL(x, 0x1.715476p+0f), shift), shift); /* rint(x / ln2) */
  float r = SM_FSUB(x, SM_FMUL(kf, 0x1.63p-1f));                         /* exact product */
  r = SM_FSUB(r, SM_FMUL(kf, -0x1.bd0106p-13f));
  float p = 0x1.a01a02p-13f;
  p = SM_FADD(SM_FMUL(p, r), 0x1.6c16c2p-10f);
  p = SM_FADD(SM_FMUL(p, r), 0x1.111112p-7f);
  p = SM_FADD(SM_FMUL(p, r), 0x1.555556p-5f);
  p = SM_FADD(SM_FMUL(p, r), 0x1.555556p-3f);
  p = SM_FADD(SM_FMUL(p, r), 0x1p-1f);
  p = SM_FADD(SM_FMUL(p, r), 1.0f);
  p = SM_FADD(SM_FMUL(p, r), 1.0f);
  int k = (int)kf; /* -124 .. 0 */
  return SM_FMUL(p, sm_sf_from_bits((uint32_t)(k + 127) << 23));
}
SM_SD float sm_sample_exp(float x) {
  if (!(x >= -86.0f)) return 0.0f; /* also -inf, NaN */
  if (x > 0.0f) x = 0.0f;
  return sm_sample_exp_core(x);
}

/* Fixed-point weight of e in [0, 1]: floor(e * 2^100), exact integer arithmetic. */
SM_SD sm_u128 sm_sample_weight(float e) {
  uint32_t b = sm_sf_bits(e);
  if (!(e > 0.0f)) return 0;
  int ex = (int)(b >> 23) - 127;
  uint32_t m = (b & 0x7fffffu) | 0x800000u; /* e = m * 2^(ex - 23) */
  int sh = ex - 23 + 100;
  if (sh >= 0) return (sm_u128)m << sh;
  if (sh <= -24) return 0;
  return (sm_u128)(m >> -sh);
}

/* 128-bit integer to double with fixed roundings (same on every backend). */
SM_SD double sm_sample_u128_to_double(sm_u128 v) {
  uint64_t hi = (uint64_t)(v >> 64), lo = (uint64_t)v;
  return SM_DADD(SM_DMUL((double)hi, 18446744073709551616.0), (double)lo);
}

/* How a request is sampled: 0 = greedy; else 1 + (candidates sorted ? 1 : 0), with *n the
 * number of candidates (top_k, or the vocabulary). */
enum { SM_SAMPLE_GREEDY = 0, SM_SAMPLE_NATURAL = 1, SM_SAMPLE_SORTED = 2 };
SM_SD int sm_sample_plan(float temperature, int top_k, float top_p, int vocab, int *n) {
  *n = vocab;
  if (!(temperature > 0)) return SM_SAMPLE_GREEDY;
  if (top_k > 0 && top_k < vocab) {
    *n = top_k;
    return SM_SAMPLE_SORTED;
  }
  return top_p < 1.0f ? SM_SAMPLE_SORTED : SM_SAMPLE_NATURAL;
}

#endif
