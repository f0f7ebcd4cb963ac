/* Device load helpers of the matvec kernels (cuda_mv.cu, cuda_q4.cu, cuda_mlp.cu, cuda_weights.cu):
 * streaming 16-byte weight loads with L2 policies and hints, (scale, bias) pairs, the decoding of
 * packed words, elements of any weight layout, and the argument block of matvecs over up to three
 * weights that share x. */
#ifndef SM_CUDA_LDST_CUH
#define SM_CUDA_LDST_CUH
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mxq.cuh"

/* streaming 16-byte load that skips L1 (weights are read once; keep L1 for x) */
static __device__ __forceinline__ uint4 ld_stream(const void *p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

/* the same with an L2 cache policy (createpolicy), and a 4-byte read-only load with one */
static __device__ __forceinline__ uint4 ld_stream_p(const void *p, uint64_t pol) {
  uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
#else
  (void)pol;
  r = ld_stream(p);
#endif
  return r;
}
static __device__ __forceinline__ uint32_t ldg_p(const uint32_t *p, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(r) : "l"(p), "l"(pol));
  return r;
#else
  (void)pol;
  return __ldg(p);
#endif
}

/* the same with an L2 prefetch-size hint (h = 1: 128 bytes, 2: 256 bytes), (3) evict-first (pol) or
 * (4) both evict-first and 128 bytes */
static __device__ __forceinline__ uint4 ld_stream_h(const void *p, int h, uint64_t pol) {
  uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  (void)h; (void)pol;
  r = ld_stream(p);
#else
  if (h == 2)
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else if (h == 1)
    asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  else if (h == 3)
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  else if (h == 4)
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  else
    r = ld_stream(p);
#endif
  return r;
}


/* a 16-bit (scale, bias) pair (scale in the low half) as floats */
static __device__ __forceinline__ float2 sb16_decode(uint32_t v, bool bf16) {
  if (bf16) return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  __half2 h = *reinterpret_cast<__half2 *>(&v);
  return __half22float2(h);
}
template <int SBK> static __device__ __forceinline__ float2 load_sb(const void *sb, int64_t idx) {
  if (SBK == SBK_F32) return __ldg((const float2 *)sb + idx);
  return sb16_decode(__ldg((const uint32_t *)sb + idx), SBK == SBK_BF16);
}
/* 16-bit scales read with an L2 policy when ef (else load_sb) */
static __device__ __forceinline__ float2 load_sb_p(const void *sb, int64_t idx, int sbk, bool ef, uint64_t pol) {
  if (sbk == SBK_F32 || !ef) return sbk == SBK_F32 ? load_sb<SBK_F32>(sb, idx) : sbk == SBK_F16 ? load_sb<SBK_F16>(sb, idx) : load_sb<SBK_BF16>(sb, idx);
  return sb16_decode(ldg_p((const uint32_t *)sb + idx, pol), sbk == SBK_BF16);
}
static __device__ __forceinline__ float2 load_sb_rt(const void *sb, int64_t idx, int sbk) {
  if (sbk == SBK_F32) return load_sb<SBK_F32>(sb, idx);
  if (sbk == SBK_F16) return load_sb<SBK_F16>(sb, idx);
  return load_sb<SBK_BF16>(sb, idx);
}

/* Decode the E = 32/BITS elements of word w into floats f such that
 * sum_e q_e x_e = A * sum_e f_e x_e - B0 * sum_e x_e  (A = 64, B0 = 128 for 2/4-bit;
 * A = 1, B0 = 0 for 8-bit). For 2/4-bit, f = 2 + q/64 built with one byte permute. */
template <int BITS> static __device__ __forceinline__ void decode_word(uint32_t w, float *f) {
  if (BITS == 4) {
    uint32_t w0 = w & 0x0F0F0F0Fu, w1 = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      f[2 * i] = __uint_as_float(__byte_perm(w0, 0x40000000u, 0x7044u | (i << 8)));
      f[2 * i + 1] = __uint_as_float(__byte_perm(w1, 0x40000000u, 0x7044u | (i << 8)));
    }
  } else if (BITS == 2) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      uint32_t wk = (w >> (2 * k)) & 0x03030303u;
#pragma unroll
      for (int i = 0; i < 4; i++) f[4 * i + k] = __uint_as_float(__byte_perm(wk, 0x40000000u, 0x7044u | (i << 8)));
    }
  } else { /* 8 */
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | i)) - 8388608.f;
  }
}


template <typename T> static __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }

template <typename T> static __device__ __forceinline__ float h16_to_f(unsigned short u);
template <> __device__ __forceinline__ float h16_to_f<__nv_bfloat16>(unsigned short u) { return __uint_as_float((uint32_t)u << 16); }
template <> __device__ __forceinline__ float h16_to_f<__half>(unsigned short u) { return __half2float(__ushort_as_half(u)); }
template <> __device__ __forceinline__ float h16_to_f<float>(unsigned short u) { return 0.f; }

/* unpack a 16-byte vector of T into floats */
template <typename T> static __device__ __forceinline__ void unpack16(uint4 v, float *f) {
  if (sizeof(T) == 4) {
    f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y); f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
  } else {
    uint32_t a[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
      f[2 * i] = h16_to_f<T>((unsigned short)(a[i] & 0xffff));
      f[2 * i + 1] = h16_to_f<T>((unsigned short)(a[i] >> 16));
    }
  }
}

/* up to 3 weights sharing x (fused q/k/v or gate/up); block ranges select the weight */
struct mv_args {
  const void *q[3];
  const void *sb[3];
  float *y[3];
  int M[3];
  int bstart[4];
  int pf; /* k_mvq4, n = 1: bytes of its weight rows a block prefetches into L2 before the wait (-1: all; 0, always) */
  int hint; /* k_mvq4 weight loads: ld_stream_h's h */
  int ef;   /* n = 1 (tuning wef): 1 the weights, 2 the scales read with the L2 evict-first policy */
  /* k_mvq4, n = 1, deferred rmsnorm (cu_q4_dnorm): x was quantized un-normalized and ssp[0..nss)
   * hold partial sums of its squares: every output is scaled by 1 / sqrt(sum / dim + eps) */
  const float *ssp;
  int nss;
  float dn_eps, dn_dim;
  /* per weight, NULL or its rows' bias, added to every output of the row (a matmul's add_rows folded in:
   * cuda_fuse.cu's matvec group) */
  const float *bias[3];
};
/* weight wi's bias of row `row`, 0 without one */
static __device__ __forceinline__ float mv_bias(const mv_args &a, int wi, int row) {
  const float *b = wi == 0 ? a.bias[0] : wi == 1 ? a.bias[1] : a.bias[2];
  return b ? __ldg(b + row) : 0.f;
}

/* element j of row r (any layout), as float */
static __device__ __forceinline__ float dq_elem(const cu_weight &w, int64_t r, int64_t j) {
  if (w.kind == CW_DENSE) {
    int64_t i = r * w.cols + j;
    if (w.dtype == SM_DT_BF16) return __bfloat162float(((const __nv_bfloat16 *)w.q)[i]);
    if (w.dtype == SM_DT_F16) return __half2float(((const __half *)w.q)[i]);
    return ((const float *)w.q)[i];
  }
  if (w.kind == CW_MXQ) return mxq_elem(w, r, j);
  const int bits = w.bits;
  const int64_t G = w.cols / w.gs;
  float2 p = load_sb_rt(w.sb, r * G + j / w.gs, w.sbk);
  uint32_t qv;
  if (w.kind == CW_QFAST || w.kind == CW_Q4) {
    const int E = 32 / bits;
    const int64_t W = w.cols / E;
    uint32_t wd = ((const uint32_t *)w.q)[r * W + (w.kind == CW_Q4 ? j / E : cu_qfast_store_index(j / E, W))];
    qv = (wd >> ((j % E) * bits)) & ((1u << bits) - 1);
  } else {
    const uint8_t *row = (const uint8_t *)w.q + r * (w.cols * bits / 8);
    uint64_t bit = (uint64_t)j * bits;
    uint32_t v = row[bit >> 3];
    if ((bit & 7) + bits > 8) v |= (uint32_t)row[(bit >> 3) + 1] << 8;
    qv = (v >> (bit & 7)) & ((1u << bits) - 1);
  }
  return p.x * (float)qv + p.y;
}

#endif
