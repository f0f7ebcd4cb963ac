/* Segmented bidirectional attention of the vision encoders (backend.h attention_seg) on tensor cores
 * (sm_80+: mma.sync m16n8k16, f16 operands, f32 accumulation). Hand-written for the same reason as
 * cuda_attn_flash.cu: no library on the machine takes f32 activations with per-token key ranges.
 *
 * Every token attends to the keys [lo, hi) of its segment (one image, or one window of it), in both
 * directions. A first kernel converts q (scaled by scale * log2 e), k and v to f16, head-major and
 * zero-padded to a head dim HDK that is a multiple of 16 ([head][token][HDK]); the main kernel takes
 * 64 consecutive tokens of one head a block (four warps of 16), walks the union of their key ranges 64
 * keys a step with the copies of the next step in flight (cp.async, double-buffered), keeps the scores
 * in registers (the accumulator layout of S = Q K^T is the operand layout of P in O += P V), masks
 * each row to its own range and runs the online softmax in the base-2 domain. Warps skip steps that
 * none of their rows sees (Qwen2.5-VL's window layers read two windows at most). Precision: q, k, v
 * and p rounded to f16 (relative error ~1e-3 on the output); SMELT_CUDA_ATTN_FA=0 selects the f32
 * CUDA-core kernel (cuda_encoder.cu), as for prefill attention. */
#include <limits.h>
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_ew.cuh"
#include "backend/cuda/cuda_mma.cuh"

#define SG_BM 64 /* tokens (rows) a block */
#define SG_BN 64 /* keys a step */
#define SG_NW 4  /* warps a block */

/* q, k, v [n][heads * hd] f32 -> f16 [head][n][HDK], q times qs; columns hd .. HDK - 1 zero */
__global__ void k_attseg_prep(__half *__restrict__ dst, const float *__restrict__ src, int n, int nh, int hd, int hdk,
                              float qs) {
  const int c8 = hdk / 8;
  const int64_t total = (int64_t)n * nh * c8;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int c = (int)(i % c8);
    const int64_t th = i / c8;
    const int h = (int)(th % nh);
    const int64_t t = th / nh;
    float f[8];
    if (8 * c < hd) { /* hd % 8 == 0: a chunk is wholly inside or wholly padding */
      const float4 *p = (const float4 *)(src + t * nh * hd + (int64_t)h * hd + 8 * c);
      const float4 a = p[0], b = p[1];
      f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) f[e] = 0.f;
    }
    const uint4 o = make_uint4(pk2<__half>(f[0] * qs, f[1] * qs), pk2<__half>(f[2] * qs, f[3] * qs),
                               pk2<__half>(f[4] * qs, f[5] * qs), pk2<__half>(f[6] * qs, f[7] * qs));
    *(uint4 *)(dst + ((int64_t)h * n + t) * hdk + 8 * c) = o;
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
/* rows r0 .. r0 + 63 of a [n][HDK] f16 matrix into shared rows of HDK + 8; rows past n zero-filled */
template <int HDK>
static __device__ __forceinline__ void sg_stage(__half *dst, const __half *src, int r0, int n) {
  constexpr int HDP = HDK + 8, CPR = HDK / 8, PER = (SG_BN * CPR + SG_NW * 32 - 1) / (SG_NW * 32);
#pragma unroll
  for (int it = 0; it < PER; it++) {
    const int idx = it * SG_NW * 32 + threadIdx.x;
    if (idx >= SG_BN * CPR) break;
    const int j = idx / CPR, c = idx % CPR, r = r0 + j;
    const unsigned bytes = r < n ? 16u : 0u;
    const __half *s = src + (int64_t)(r < n ? r : 0) * HDK + 8 * c;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(cu_smem_u32(dst + j * HDP + 8 * c)), "l"(s),
                 "r"(bytes) : "memory");
  }
}
#endif

template <int HDK>
__global__ void __launch_bounds__(SG_NW * 32)
    k_attseg_fa(float *__restrict__ out, const __half *__restrict__ qh, const __half *__restrict__ kh,
                const __half *__restrict__ vh, const int32_t *__restrict__ lohi, int n, int nh, int nkv, int hd) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap(); /* the host launches this kernel on sm_80+ only */
#else
  constexpr int HDP = HDK + 8; /* 16 bytes of padding a row: conflict-free ldmatrix */
  extern __shared__ float4 sg_sm4[];
  __half *Qs = (__half *)sg_sm4, *KV = Qs + SG_BM * HDP; /* KV: 2 x (K, V) of SG_BN rows */
  const int h = blockIdx.y, g = h / (nh / nkv), t0 = blockIdx.x * SG_BM;
  const int nr = min(SG_BM, n - t0), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  /* segments ascend: the first token's lo and the last one's hi bound the block's keys */
  const int lo = lohi[2 * t0], hi = lohi[2 * (t0 + nr - 1) + 1];
  const __half *Kg = kh + (int64_t)g * n * HDK, *Vg = vh + (int64_t)g * n * HDK;
  sg_stage<HDK>(Qs, qh + (int64_t)h * n * HDK, t0, n);
  if (lo < hi) {
    sg_stage<HDK>(KV, Kg, lo, hi);
    sg_stage<HDK>(KV + SG_BN * HDP, Vg, lo, hi);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  /* this thread's rows lane/4 and lane/4 + 8 of the warp's 16: their key ranges (rows past n: none) */
  int rlo[2], rhi[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int r = 16 * warp + (lane >> 2) + 8 * i;
    rlo[i] = r < nr ? lohi[2 * (t0 + r)] : INT_MAX;
    rhi[i] = r < nr ? lohi[2 * (t0 + r) + 1] : INT_MIN;
  }
  int wlo = min(rlo[0], rlo[1]), whi = max(rhi[0], rhi[1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
    whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
  }
  float acc[HDK / 8][4];
#pragma unroll
  for (int j = 0; j < HDK / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.f, 0.f };
  const int nsteps = lo < hi ? (hi - lo + SG_BN - 1) / SG_BN : 0;
  for (int st = 0; st < nsteps; st++) {
    const int p0 = lo + st * SG_BN, cur = st & 1;
    __half *Ks = KV + cur * 2 * SG_BN * HDP, *Vs = Ks + SG_BN * HDP;
    __syncthreads(); /* every warp is done with the buffers the next copies overwrite */
    if (st + 1 < nsteps) {
      __half *Kn = KV + (cur ^ 1) * 2 * SG_BN * HDP;
      sg_stage<HDK>(Kn, Kg, p0 + SG_BN, hi);
      sg_stage<HDK>(Kn + SG_BN * HDP, Vg, p0 + SG_BN, hi);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory"); /* all but the newest group: q and this step */
    __syncthreads();
    if (wlo >= whi || p0 >= whi || p0 + SG_BN <= wlo) continue; /* no row of the warp sees these keys */
    float s[SG_BN / 8][4];
    fa_scores<__half, HDK, SG_BN, HDP>(s, Qs + 16 * warp * HDP, Ks, lane);
#pragma unroll
    for (int j = 0; j < SG_BN / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) { /* each row sees the keys of its segment */
        const int i = e >> 1, p = p0 + j * 8 + 2 * (lane & 3) + (e & 1);
        if (p < rlo[i] || p >= rhi[i]) s[j][e] = -INFINITY;
      }
    fa_softmax<HDK, SG_BN>(s, acc, m, l);
    fa_pv<__half, HDK, SG_BN, HDP>(acc, s, Vs, lane);
  }
  asm volatile("cp.async.wait_all;" ::: "memory"); /* no copy outlives the block */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int r = 16 * warp + (lane >> 2) + 8 * i;
    if (r >= nr) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    float *o = out + ((int64_t)(t0 + r) * nh + h) * hd + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < HDK / 8; j++)
      if (j * 8 < hd) *(float2 *)(o + j * 8) = make_float2(acc[j][2 * i] * inv, acc[j][2 * i + 1] * inv);
  }
#endif
}

static int sg_hdk(int hd) { return hd <= 64 ? 64 : hd <= 80 ? 80 : hd <= 96 ? 96 : 128; }
static size_t sg_smem(int hdk) { return (size_t)(SG_BM + 4 * SG_BN) * (hdk + 8) * sizeof(__half); }

bool cu_attseg_fa_ok(const cu_ctx *cx, int hd, size_t smem_optin) {
  return cx->arch >= 80 && cx->t->attn_fa && hd % 8 == 0 && hd <= 128 && sg_smem(sg_hdk(hd)) <= smem_optin;
}

size_t cu_attseg_fa_scratch(int n, int nh, int nkv, int hd) {
  return (size_t)n * (nh + 2 * (size_t)nkv) * sg_hdk(hd) * sizeof(__half);
}

template <int HDK> static void sg_attr(size_t smem_optin) {
  if (sg_smem(HDK) <= smem_optin)
    cudaFuncSetAttribute(k_attseg_fa<HDK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sg_smem(HDK));
}
void cu_attseg_fa_init(size_t smem_optin) {
  sg_attr<64>(smem_optin);
  sg_attr<80>(smem_optin);
  sg_attr<96>(smem_optin);
  sg_attr<128>(smem_optin);
  cudaGetLastError();
}

void cu_attseg_fa_run(const cu_ctx *cx, void *scratch, float *out, const float *q, const float *k, const float *v,
                      const int32_t *lohi, int n, int nh, int nkv, int hd, float scale) {
  const int hdk = sg_hdk(hd);
  __half *qh = (__half *)scratch, *kh = qh + (size_t)n * nh * hdk, *vh = kh + (size_t)n * nkv * hdk;
  const float qs = scale * 1.4426950408889634f;
  k_attseg_prep<<<cu_ew_blocks((size_t)n * nh * hdk / 8), 256, 0, cx->s>>>(qh, q, n, nh, hd, hdk, qs);
  k_attseg_prep<<<cu_ew_blocks((size_t)n * nkv * hdk / 8), 256, 0, cx->s>>>(kh, k, n, nkv, hd, hdk, 1.f);
  k_attseg_prep<<<cu_ew_blocks((size_t)n * nkv * hdk / 8), 256, 0, cx->s>>>(vh, v, n, nkv, hd, hdk, 1.f);
  const dim3 grid((unsigned)((n + SG_BM - 1) / SG_BM), (unsigned)nh);
  const size_t smem = sg_smem(hdk);
#define SG_ARGS out, qh, kh, vh, lohi, n, nh, nkv, hd
  switch (hdk) {
  case 64: k_attseg_fa<64><<<grid, SG_NW * 32, smem, cx->s>>>(SG_ARGS); break;
  case 80: k_attseg_fa<80><<<grid, SG_NW * 32, smem, cx->s>>>(SG_ARGS); break;
  case 96: k_attseg_fa<96><<<grid, SG_NW * 32, smem, cx->s>>>(SG_ARGS); break;
  default: k_attseg_fa<128><<<grid, SG_NW * 32, smem, cx->s>>>(SG_ARGS); break;
  }
#undef SG_ARGS
}
