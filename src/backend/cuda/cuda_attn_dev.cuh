/* Device-side pieces the decode-attention kernels share (cuda_attn.cu's k_attn_dec2 and
 * cuda_attn_decb.cu's k_attn_decb): the fused rotation's arguments and the L2 prefetch of a later
 * kernel's weights. */
#ifndef SM_CUDA_ATTN_DEV_CUH
#define SM_CUDA_ATTN_DEV_CUH
#include "backend/cuda/cuda_common.cuh"

/* rope fused in (rp.halfq > 0 or rp.k != NULL): q is the un-rotated projection; q is rotated
 * in shared memory, and the block whose split holds the token's own position rotates k and
 * writes k and v into the cache (K/V rows are then read through L2, not the read-only path) */
struct at_rope {
  const float *k, *v, *invq, *invk;
  int halfq, halfk;
  /* position-dependent frequencies (rope_ext: longrope's short / long factors, dynamic NTK): the token at
   * position p takes row p < pos0 ? 0 : min(p - pos0 + 1, n_rows - 1) of invq / invk (rows of halfq /
   * halfk); the rotated dims are then multiplied by msq / msk (1 for plain RoPE) */
  int n_rows, pos0;
  float msq, msk;
  const char *pf[2]; /* weights of a later kernel to prefetch into L2 once K/V are consumed (may be NULL) */
  long long pfn[2];  /* bytes (multiples of 16) */
  __half *x16;       /* may be NULL: the output also as the wgmma kernel's f16 x (tiles of bn tokens) */
  int bn;
  const float *sinks; /* may be NULL: a logit per query head in every softmax's denominator (gpt-oss) */
};

/* the softmax denominator of head h: the sum L of exp(score - M) over the positions, plus exp(sink - M)
 * with attention sinks (the sink takes part in the softmax but has no value row) */
static __device__ __forceinline__ float at_den(const at_rope &rp, int h, float L, float M) {
  return rp.sinks && M != -INFINITY ? L + expf(rp.sinks[h] - M) : L;
}

/* element d (< 2 half) of a head row x rotated at position p: the NeoX halves, frequencies inv, the
 * rotated dims multiplied by ms; x is read through L2 (the previous kernel wrote it) */
static __device__ __forceinline__ float at_rot(const float *x, int d, int half, const float *inv, int p, float ms) {
  const int j = d < half ? d : d - half;
  float sn, cs;
  sincosf((float)p * inv[j], &sn, &cs);
  const float x0 = __ldca(x + j), x1 = __ldca(x + j + half);
  return (d < half ? x0 * cs - x1 * sn : x0 * sn + x1 * cs) * ms;
}

/* the blocks of the grid split regions pf[0..1] and each prefetches its share into L2 */
static __device__ __forceinline__ void at_prefetch(const at_rope &rp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x >= 2) return;
  const bool r1 = threadIdx.x == 1; /* selected, not indexed: an indexed parameter array goes to local memory */
  const char *pf = r1 ? rp.pf[1] : rp.pf[0];
  const long long n = r1 ? rp.pfn[1] : rp.pfn[0];
  if (!pf) return;
  const long long nb = (long long)gridDim.x * gridDim.y * gridDim.z;
  const long long b = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const long long per = ((n + nb - 1) / nb + 15) & ~15LL;
  long long o = b * per;
  const long long e = o + per < n ? o + per : n;
  for (; o < e; o += 1 << 20) {
    const long long len = e - o < (1 << 20) ? e - o : (1 << 20);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pf + o), "r"((unsigned)len) : "memory");
  }
#else
  (void)rp;
#endif
}

struct cu_attn_args;
/* cu_attn_decode's launch of k_attn_decb (cuda_attn_decb.cu) where cu_attn_decb_ok and one split */
void cu_attn_decb_run(const cu_ctx *cx, const cu_attn_args *x, const at_rope &rp);

#endif
