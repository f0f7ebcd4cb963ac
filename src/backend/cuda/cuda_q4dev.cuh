/* Device helpers shared by the one-token CUDA kernels (cuda_q4.cu, cuda_mlp.cu, cuda_attn.cu, cuda_ssm.cu):
 * the CW_Q4 int8-activation dot product, the int8 x layout written by norms, attention and the gated
 * norm, barriers of resident blocks and the paged KV-cache slot lookup. Include after cuda_common.cuh. */
#ifndef SM_CUDA_Q4DEV_CUH
#define SM_CUDA_Q4DEV_CUH

/* The CW_Q4 int8 x of one 32-value block b held by a whole warp (lane l: value l): per block d =
 * max|x|/127, q = rint(x/d) in nibble order, and the exact float sum (cuda_q4.cu's k_quant_x) */
static __device__ __forceinline__ void quant_x32(float v, int lane, int64_t b, uint8_t *xq, float2 *xs) {
  float a = fabsf(v), sum = v;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  int qi = a > 0.f ? __float2int_rn(v * (127.f / a)) : 0;
  qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
  const int j = lane >> 3, e = lane & 7;
  xq[b * 32 + (2 * j + (e & 1)) * 4 + (e >> 1)] = (uint8_t)(int8_t)qi;
  if (lane == 0) xs[b] = make_float2(a * (1.f / 127.f), sum);
}

/* deferred rmsnorm: this lane's share of the n (<= 128, n % 4 == 0) partial sums of squares, one
 * float4; requested right after a wait and summed (dn_sum) only where used, so that the load stays
 * in flight meanwhile. warp_sum(dn_sum) is the same in every warp and lane */
static __device__ __forceinline__ float4 dn_load(const float *__restrict__ ssp, int n, int lane) {
  return 4 * lane < n ? __ldcg((const float4 *)ssp + lane) : make_float4(0.f, 0.f, 0.f, 0.f);
}
static __device__ __forceinline__ float dn_sum(const float4 v) { return (v.x + v.y) + (v.z + v.w); }

static __device__ __forceinline__ unsigned ld_acquire_u32(const unsigned *p) {
  unsigned v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
  v = *(const volatile unsigned *)p;
#endif
  return v;
}
static __device__ __forceinline__ float2 sb_pair(uint32_t s, int sbk) {
  if (sbk == SBK_BF16) return make_float2(__uint_as_float(s << 16), __uint_as_float(s & 0xffff0000u));
  return __half22float2(*reinterpret_cast<const __half2 *>(&s));
}
static __device__ __forceinline__ int dot_q4(const uint4 u, const uint4 x0, const uint4 x1) {
  constexpr int MK = 0x0F0F0F0F;
  int d = __dp4a((int)(u.x & MK), (int)x0.x, 0);
  d = __dp4a((int)((u.x >> 4) & MK), (int)x0.y, d);
  d = __dp4a((int)(u.y & MK), (int)x0.z, d);
  d = __dp4a((int)((u.y >> 4) & MK), (int)x0.w, d);
  d = __dp4a((int)(u.z & MK), (int)x1.x, d);
  d = __dp4a((int)((u.z >> 4) & MK), (int)x1.y, d);
  d = __dp4a((int)(u.w & MK), (int)x1.z, d);
  return __dp4a((int)((u.w >> 4) & MK), (int)x1.w, d);
}
/* mlp_norm_q's block sum, after each of k_norm_q's nvw warps (emulated) wrote its sum to red[W]: warp 0
 * adds them into red[32] as k_norm_q's block_sum does (bitwise); every thread returns the total */
static __device__ __forceinline__ float mlp_norm_total(int nvw, float *red) {
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < nvw ? red[threadIdx.x] : 0.f;
    t = warp_sum(t);
    if (threadIdx.x == 0) red[32] = t;
  }
  __syncthreads();
  return red[32];
}
/* k_mlp1's rmsnorm of v = src + add (dim4 float4s) into the int8 x layout in xa / xb / xd, as
 * k_norm_q computes it (bitwise): thread t holds float4 t + 512 k (k < 2), i.e. a lane of k_norm_q's
 * warp W = warp + 16 k (its block has max(dim4, 64) threads). gw: the norm weight's float4s of
 * this thread; add may be NULL (v = src); block 0 writes v to vout (may be NULL); red: 33 floats of
 * shared scratch. PRE (add not NULL): add is first normed itself, add * (pw + poff) / rms(add) with
 * peps, as k_norm_q<VPT, true> does (a sandwich norm's output norm). Needs 512 threads; ends with a
 * block barrier. */
template <bool PRE>
static __device__ __forceinline__ void mlp_norm_q(const float *src, const float *add, const float4 (&gw)[2],
                                                  float off, float eps, float *vout, int dim4, uint4 *xa, uint4 *xb,
                                                  float2 *xd, float *red, const float *pw, float poff,
                                                  float peps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvw = (dim4 < 64 ? 64 : dim4) >> 5;
  float4 hv[2], bv[2], pg[2];
  if (PRE) { /* add's own rms: its sum of squares reduced as k_norm_q's block_sum (pw's float4s are
              * loaded with add's: held over the wait they made ptxas spill at VG = 4) */
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const int W = warp + 16 * k, idx = threadIdx.x + 512 * k;
      bv[k] = pg[k] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (W >= nvw) continue;
      float sa = 0.f;
      if (idx < dim4) {
        const float4 b = __ldcg((const float4 *)add + idx);
        pg[k] = __ldg((const float4 *)pw + idx);
        sa = fmaf(b.x, b.x, fmaf(b.y, b.y, fmaf(b.z, b.z, fmaf(b.w, b.w, sa))));
        bv[k] = b;
      }
      sa = warp_sum(sa);
      if (lane == 0) red[W] = sa;
    }
    const float ia = 1.0f / sqrtf(mlp_norm_total(nvw, red) / (float)(4 * dim4) + peps);
    __syncthreads(); /* red[32] read by every thread before the next reduction writes red */
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const float4 g = pg[k];
      bv[k].x = bv[k].x * ia * (g.x + poff); bv[k].y = bv[k].y * ia * (g.y + poff);
      bv[k].z = bv[k].z * ia * (g.z + poff); bv[k].w = bv[k].w * ia * (g.w + poff);
    }
  }
#pragma unroll
  for (int k = 0; k < 2; k++) {
    const int W = warp + 16 * k, idx = threadIdx.x + 512 * k;
    hv[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (W >= nvw) continue;
    float ss = 0.f;
    if (idx < dim4) {
      float4 v = __ldcg((const float4 *)src + idx);
      if (add) {
        const float4 b = PRE ? bv[k] : __ldcg((const float4 *)add + idx);
        v.x += b.x; v.y += b.y; v.z += b.z; v.w += b.w;
      }
      if (blockIdx.x == 0 && vout) ((float4 *)vout)[idx] = v;
      ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
      hv[k] = v;
    }
    ss = warp_sum(ss);
    if (lane == 0) red[W] = ss;
  }
  const float inv = 1.0f / sqrtf(mlp_norm_total(nvw, red) / (float)(4 * dim4) + eps);
#pragma unroll
  for (int k = 0; k < 2; k++) {
    const int W = warp + 16 * k, idx = threadIdx.x + 512 * k;
    if (W >= nvw) continue;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    if (idx < dim4) {
      const float4 g = gw[k];
      o.x = hv[k].x * inv * (g.x + off); o.y = hv[k].y * inv * (g.y + off);
      o.z = hv[k].z * inv * (g.z + off); o.w = hv[k].w * inv * (g.w + off);
    }
    float am = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
    float sum = (o.x + o.y) + (o.z + o.w);
#pragma unroll
    for (int mm = 4; mm > 0; mm >>= 1) {
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, mm));
      sum += __shfl_xor_sync(0xffffffffu, sum, mm);
    }
    if (idx < dim4) { /* k_norm_q's int8 layout; bytes 0-15 of a 32-value block in xa, 16-31 in xb */
      const float sc = am > 0.f ? 127.f / am : 0.f;
      int q0 = __float2int_rn(o.x * sc), q1 = __float2int_rn(o.y * sc), q2 = __float2int_rn(o.z * sc),
          q3 = __float2int_rn(o.w * sc);
      q0 = max(-127, min(127, q0)); q1 = max(-127, min(127, q1));
      q2 = max(-127, min(127, q2)); q3 = max(-127, min(127, q3));
      const int sub = idx & 7, j = sub >> 1, b = idx >> 3, byte = 2 * (sub & 1);
      const int o0 = (2 * j) * 4 + byte, o1 = (2 * j + 1) * 4 + byte;
      uint8_t *pa = (uint8_t *)(xa + b), *pb = (uint8_t *)(xb + b);
      *(uint16_t *)(o0 < 16 ? pa + o0 : pb + o0 - 16) = (uint16_t)((q0 & 0xff) | ((q2 & 0xff) << 8));
      *(uint16_t *)(o1 < 16 ? pa + o1 : pb + o1 - 16) = (uint16_t)((q1 & 0xff) | ((q3 & 0xff) << 8));
      if (sub == 0) xd[b] = make_float2(am * (1.f / 127.f), sum);
    }
  }
  __syncthreads();
}
/* A barrier of n blocks on the counter bar (the n blocks must be resident at once: see k_mlp1), in
 * two halves: every thread's earlier global stores are visible to the n blocks after it. Loads issued between them (weights that do not depend on the other
 * blocks) do not hold up the arrival, whose fences wait for every earlier access of the thread.
 * blocks_wait: thread 0's acquire load, then the block barrier, orders the other blocks' stores
 * before every thread's later loads (no trailing fence: it would wait for those weight loads) */
static __device__ __forceinline__ void blocks_arrive(unsigned *bar) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
  }
}
static __device__ __forceinline__ void blocks_wait(unsigned *bar, unsigned n) {
  if (threadIdx.x == 0)
    while (ld_acquire_u32(bar) < n) { }
  __syncthreads();
}

/* with xq: the output row of each token (n_heads*hd values) is also written in the int8 layout
 * of the CW_Q4 matvec (see k_quant_x in cuda_q4.cu): per 32 values int8 in nibble order and
 * (max|v|/127, exact sum); needs hd % 32 == 0. Called by a whole warp for 32 consecutive
 * outputs (b = block index). */
static __device__ __forceinline__ void at_quant_store(float v, int lane, int64_t b, uint8_t *xq, float2 *xs) {
  float a = fabsf(v), sum = v;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  int qi = a > 0.f ? __float2int_rn(v * (127.f / a)) : 0;
  qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
  const int j = lane >> 3, e = lane & 7;
  xq[b * 32 + (2 * j + (e & 1)) * 4 + (e >> 1)] = (uint8_t)(int8_t)qi;
  if (lane == 0) xs[b] = make_float2(a * (1.f / 127.f), sum);
}

static __device__ __forceinline__ int64_t at_slot(const int32_t *table, int max_blocks, int bs, int nblocks, int s,
                                                  int p) {
  const int bi = p / bs;
  if (p < 0 || bi >= max_blocks) return -1;
  const int blk = __ldg(table + (int64_t)s * max_blocks + bi);
  if (blk < 0 || blk >= nblocks) return -1;
  return (int64_t)blk * bs + p % bs;
}

#endif
