/* Decode attention (flash-decoding): every token of the batch is the only one of its sequence
 * (n_tiles == n_tokens). Grid = (token, kv head, split z); NW = 8 (or 4) warps a block. The split's
 * positions are dealt round-robin to the warps; a warp streams K and V rows of B positions at a
 * time (lane = one or two float4 of the head dim, so a row is one coalesced load), keeps its own
 * online softmax (max, sum, P.V accumulator) for all G query heads of the kv head in registers:
 * no block barrier inside the loop. With S > 1 splits in a cluster (the default for short
 * contexts) every warp sends its (max, sum, accumulator) straight to the block that owns the
 * 32-output chunk (RSC), which combines the S * NW partials after one cluster barrier; otherwise
 * the warps merge through shared memory and the splits combine through the cluster's shared
 * memory, or (long contexts) each block writes (max, sum, unnormalized output) and the last block
 * of a (token, kv head) (atomic counter, reset by it) combines them with per-split weights computed
 * once in shared memory. The split count depends only on the batch shape (not on the context
 * length), so a decode graph stays valid as the context grows.
 *
 * The kernel takes its variants as bits of a runtime flags word (cl). The launcher sets the measured
 * winners (AT_DEFAULT below); the losing alternatives that the bits still select (the cluster
 * combine loading one split at a time, scores all-reduced in every lane, per-output merge weights,
 * plain remote stores and a cluster barrier instead of st.async, one or four combining warps, the
 * new position read after q) stay in the kernel only because compiling them out changes ptxas's
 * register allocation at this kernel's 128-register cap: every variant measured so far spilled
 * 8-28 bytes (docs/cuda.md). The file is that one kernel with its launcher, hence its ~1,000 lines. */
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_attn_dev.cuh"
#include "backend/cuda/cuda_attn_dec2_smem.cuh"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_q4dev.cuh"
#include "backend/cuda/cuda_qmma_dev.cuh"
#include <cooperative_groups.h>
#include <math.h>
namespace cg = cooperative_groups;

static __device__ __forceinline__ float4 f4z() { return make_float4(0.f, 0.f, 0.f, 0.f); }
static __device__ __forceinline__ float dot4(float4 a, float4 b, float s) {
  return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, s))));
}

/* GM: max query heads per kv head (G <= GM); NJ: float4 chunks of the head dim per lane
 * (hd/4 <= 32*NJ); HW (hd <= 64): each half-warp takes its own positions (2 * AT_B a batch), the
 * halves share the running max and sum and add their accumulators at the end */
/* one level of the scores' reduce-scatter (offset 2H): keep the half of the 2H values selected by
 * the lane bit, add the partner's */
template <int H> static __device__ __forceinline__ void at_rs_level(float (&v)[16], int lane) {
  const bool up = lane & (2 * H);
#pragma unroll
  for (int k = 0; k < H; k++) {
    const float keep = up ? v[k + H] : v[k], send = up ? v[k] : v[k + H];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * H);
  }
}

#ifdef SMELT_CUDA_TRACE
__device__ unsigned long long *tr_a;
/* buffer: [0] attention launches, [1] target launch index, [2] last q/k/v block exit (max),
 * [3] last attention block exit (max), [16..24] block (0,0,0) of the target launch, [40] [2] read
 * after its wait */
#define TRA_BEGIN                                                                                  \
  const unsigned long long tr_t0 = tr_a ? tr_now() : 0;                                           \
  bool tr0 = tr_a && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;   \
  if (tr0) { tr0 = atomicAdd(tr_a, 1ull) == tr_a[1]; if (tr0) tr_a[16] = tr_t0; }
#define TRA(k) do { if (tr0) tr_a[16 + (k)] = tr_now(); } while (0)
#define TRA_END do { if (tr_a && threadIdx.x == 0) atomicMax(tr_a + 3, tr_now()); } while (0)
#else
#define TRA_BEGIN
#define TRA(k) do { } while (0)
#define TRA_END do { } while (0)
#endif
void cu_attn_set_trace(unsigned long long *buf) {
#ifdef SMELT_CUDA_TRACE
  cudaMemcpyToSymbol(tr_a, &buf, sizeof buf);
#else
  (void)buf;
#endif
}

/* K/V elements through L2, evict-first when kvef (pol: the policy): four floats, or four 16-bit values
 * (raw: kv_cvt4 widens them) */
template <typename KT> static __device__ __forceinline__ float4 at_ldkv(const float4 *p, bool kvef, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (kvef) {
    float4 r;
    asm volatile("ld.global.cg.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p), "l"(pol));
    return r;
  }
#endif
  return __ldcg(p);
}
template <typename KT> static __device__ __forceinline__ uint2 at_ldkv(const uint2 *p, bool kvef, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (kvef) {
    uint2 r;
    asm volatile("ld.global.cg.L2::cache_hint.v2.u32 {%0,%1}, [%2], %3;" : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(pol));
    return r;
  }
#endif
  return __ldcg(p);
}

/* the new position's k or v element i: f is the projection (rope fused) or, for a float cache, the
 * cache row already selected; c the cache row */
template <typename KT> static __device__ __forceinline__ float at_new(bool fused, const float *f, const KT *c, int i) {
  if constexpr (sizeof(KT) == 4) return f[i];
  else return fused ? f[i] : kv_to_f(c[i]);
}

/* KT: the cache's element type (cuda_kv.cuh) */
template <typename KT, int GM, int NJ, int AT_B, bool HW, int NW>
__global__ void __launch_bounds__(NW * 32, NW >= 8 ? 2 : 1) k_attn_dec2(float *__restrict__ out, uint8_t *__restrict__ xq,
                                                   float2 *__restrict__ xs, float *__restrict__ part,
                                                   int *__restrict__ cnt, const float *__restrict__ q, const at_rope rp,
                                                   KT *__restrict__ Kc, KT *__restrict__ Vc,
                                                   const int32_t *__restrict__ pos, const int32_t *__restrict__ seq,
                                                   const int32_t *__restrict__ table, int max_blocks, int bs,
                                                   int nblocks, int n_heads, int nkv, int hd, float scale, int window,
                                                   float softcap, int S, int cl) {
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
  /* AT_HS (bit 20): the Gr (5..8, bits 21-24) query heads of a KV head are split over two blocks, the
   * first 4 and the rest (grid.y = 2 x the KV heads, nkv the launch's); K/V rows and the new k/v are
   * addressed by the real KV head kvh >> 1; h0: this block's first query head */
  const int vsh = (cl >> 20) & 1, Gr = vsh ? (cl >> 21) & 15 : n_heads / nkv;
  const int G = vsh ? ((kvh & 1) ? Gr - 4 : 4) : Gr, h0 = vsh ? (kvh >> 1) * Gr + 4 * (kvh & 1) : kvh * G;
  const int hd4 = hd >> 2, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float *Qs = sm;                        /* [G][hd] (scaled q) */
  float *Ws = Qs + G * hd;               /* [NW warps][G][hd] accumulators, then [G][S] weights */
  float *Ml = Ws + NW * G * hd;          /* [NW warps][G][2] (max, sum) */
  __shared__ int last;
  const int64_t row = (int64_t)(nkv >> vsh) * hd, koff = (int64_t)(kvh >> vsh) * hd;
  const int64_t kvt = (int64_t)t * (nkv >> vsh) + (kvh >> vsh); /* the new k/v's row of rp.k / rp.v */
  const int p = pos[t], sq = seq[t];
  const int lo = window > 0 ? max(0, p - window + 1) : 0;
  const int len = p - lo + 1, per = (len + S - 1) / S;
  const int a0 = lo + z * per, a1 = min(p + 1, a0 + per);
  const float *qg = q + ((int64_t)t * n_heads + (int64_t)h0) * hd;
  const bool fused = rp.k != NULL;
  const int rrow = rp.n_rows > 1 ? (p < rp.pos0 ? 0 : min(p - rp.pos0 + 1, rp.n_rows - 1)) : 0;
  const float *invq = rp.invq + (int64_t)rrow * rp.halfq, *invk = rp.invk + (int64_t)rrow * rp.halfk;
  float *Kp = Ml + 2 * NW * G, *Vp = Kp + hd; /* the new position's k (rotated) and v */
  TRA_BEGIN
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* RSC with st.async (cl & 8192, SMELT_CUDA_ATTN_STA): the partials of this block's chunk arrive
   * through st.async and complete the transaction count of an mbarrier, armed here with their
   * bytes (P (32 + 2) floats), so that the owner waits for its own partials, without a cluster
   * barrier and its GPU-scope fence */
  __shared__ __align__(8) unsigned long long rsc_mb;
  const bool sta = (cl & 8448) == 8448 && z < G * (hd >> 5);
  if (sta && threadIdx.x == 0) {
    const unsigned mb = (unsigned)__cvta_generic_to_shared(&rsc_mb);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mb) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb),
                 "r"((unsigned)(S * NW * 34 * 4)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (cl & 256) __cluster_barrier_arrive_relaxed(); /* RSC: waited for before the first remote store */
#endif
  const int trig = (cl >> 3) & 3; /* where the next kernel may launch: 0 here, 1 after the first K/V loads, 2 after the loop */
  if (trig == 0) pdl_trigger();
  /* This warp's positions are a0 + warp + NW i (i < npos), AT_B per batch; lane l holds the cache
   * slot of i = 32 c + l for the current chunk c of 32. The slots (batch metadata) and the K/V
   * rows of older positions do not depend on the previous kernel: the first batch is loaded
   * before waiting for it. The token's own position p is written by the previous kernel (or by
   * this one, rope fused) and is read after the wait. */
  const int npos = a1 > a0 + warp ? (a1 - a0 - warp + NW - 1) / NW : 0;
  /* slots of this warp's positions 32 c .. 32 c + 31 (lane l: 32 c + l); a batch spans at most
   * two such chunks: my_slot holds chunk cur, my_slot2 chunk cur + 1 */
  auto chunk_slots = [&](int c) -> int64_t {
    const int i = 32 * c + lane;
    return i < npos ? at_slot(table, max_blocks, bs, nblocks, sq, a0 + warp + NW * i) : -1;
  };
  /* K/V rows read with the L2 evict-first policy (cl & 4096, SMELT_CUDA_ATTN_KVEF): each is read once a
   * step and not again before ~4 GB more have passed through L2 */
  const bool kvef = (cl & 4096) != 0;
  const int kdiag = (cl >> 15) & 31;
  uint64_t kvpol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (kvef) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(kvpol));
#endif
  /* a row's elements 4 ch .. 4 ch + 3: kv4(row, ch) is their address (float4 or uint2), at_ldkv loads them */
  auto kv4 = [](const KT *row_p, int ch) {
    if constexpr (sizeof(KT) == 4) return (const float4 *)row_p + ch;
    else return (const uint2 *)row_p + ch;
  };
  int cur = 0;
  int64_t my_slot = chunk_slots(0), my_slot2 = -1;
  bool have2 = false;
  typedef typename kv_raw4<KT>::T RT; /* K/V elements as loaded (kv_cuh: raw 16-bit until used) */
  RT kr[AT_B][NJ], vr[AT_B][NJ];
  bool ok[AT_B], own[AT_B];
  constexpr int SPAN = (HW ? 2 : 1) * AT_B; /* positions a batch (<= 32) */
  static_assert(SPAN <= 32, "a batch spans at most two chunks of 32 positions");
  auto load_batch = [&](int i0) {
    if ((i0 >> 5) != cur) { /* the batch starts in the next chunk */
      my_slot = have2 ? my_slot2 : chunk_slots(i0 >> 5);
      cur = i0 >> 5;
      have2 = false;
    }
    if (((i0 + SPAN - 1) >> 5) != cur && !have2 && 32 * (cur + 1) < npos) { /* it ends in the next one */
      my_slot2 = chunk_slots(cur + 1);
      have2 = true;
    }
#pragma unroll
    for (int b = 0; b < AT_B; b++) {
      const int i = i0 + (HW ? 2 * b + (lane >> 4) : b);
      const int64_t s1 = __shfl_sync(0xffffffffu, my_slot, i & 31), s2 = __shfl_sync(0xffffffffu, my_slot2, i & 31);
      const int64_t sl = (i >> 5) == cur ? s1 : s2;
      own[b] = i < npos && a0 + warp + NW * i == p;
      ok[b] = i < npos && sl >= 0;
      const bool ld = ok[b] && !own[b] && !(kdiag & 16) && !((kdiag & 8) && lane >= 16);
      const KT *kp = Kc + (ld ? sl : 0) * row + koff;
      const KT *vp = Vc + (ld ? sl : 0) * row + koff;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int ch = HW ? (lane & 15) + 16 * j : lane + 32 * j;
        const bool in = ld && ch < hd4;
        kr[b][j] = in ? at_ldkv<KT>(kv4(kp, ch), kvef, kvpol) : kv_raw4_zero<KT>();
        vr[b][j] = in ? at_ldkv<KT>(kv4(vp, ch), kvef, kvpol) : kv_raw4_zero<KT>();
      }
    }
  };
  /* the block whose range holds the new position: its cache slot (batch metadata) and rotation
   * frequencies are read before the wait, its k/v rows right after it, with q (one round trip) */
  const bool ownb = a0 <= p && p < a1, hoist = ownb && (cl & 4);
  int64_t own_sl = -1;
  float hk[2] = { 0.f, 0.f }, hk0[2] = { 0.f, 0.f }, hk1[2] = { 0.f, 0.f }, hv[2] = { 0.f, 0.f };
  float hc[2] = { 1.f, 1.f }, hs[2] = { 0.f, 0.f }; /* cos / sin of the new k's rotation (known before the wait) */
  if (hoist) {
    own_sl = at_slot(table, max_blocks, bs, nblocks, sq, p);
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const int d = tid + NW * 32 * u;
      if (fused && d < 2 * rp.halfk) sincosf((float)p * invk[d < rp.halfk ? d : d - rp.halfk], &hs[u], &hc[u]);
    }
  }
  load_batch(0);
  /* STG: the K/V rows of this warp's next nstg batches do not depend on the previous kernel
   * either: copied into shared memory (cp.async) before the wait, so that the position loop's
   * later batches need no memory round trip (whole-warp positions, one float4 a lane) */
  const int nstg = (!HW && NJ == 1) ? (cl >> 9) & 3 : 0;
  KT *St = (KT *)((char *)sm4 + at_stg_off(hd, G, S, NW, (cl & 256) != 0)) + (size_t)warp * nstg * AT_B * 2 * hd;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (nstg) {
    for (int i = AT_B; i < AT_B * (1 + nstg) && i < npos; i++) { /* i < 32: chunk 0, in my_slot */
      const int64_t sl = __shfl_sync(0xffffffffu, my_slot, i & 31);
      if (sl < 0 || a0 + warp + NW * i == p || lane >= hd4 || (kdiag & 16) || ((kdiag & 8) && lane >= 16)) continue;
      KT *d = St + (size_t)(i - AT_B) * 2 * hd + 4 * lane;
      const unsigned dk = (unsigned)__cvta_generic_to_shared(d), dv = (unsigned)__cvta_generic_to_shared(d + hd);
      if constexpr (sizeof(KT) == 4) {
        if (kvef) {
          asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dk), "l"(Kc + sl * row + koff + 4 * lane), "l"(kvpol) : "memory");
          asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dv), "l"(Vc + sl * row + koff + 4 * lane), "l"(kvpol) : "memory");
        } else {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dk), "l"(Kc + sl * row + koff + 4 * lane) : "memory");
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dv), "l"(Vc + sl * row + koff + 4 * lane) : "memory");
        }
      } else { /* 8 bytes a lane: .ca (.cg copies 16), without an L2 cache hint: with the hint, ptxas
                * 13.0 gave one register allocation of the f16 instance an LDGSTS whose policy descriptor
                * was an odd uniform register, an illegal instruction on the H100 */
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dk), "l"(Kc + sl * row + koff + 4 * lane) : "memory");
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dv), "l"(Vc + sl * row + koff + 4 * lane) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
#endif
  /* q's rotation (rope fused): this thread's QU elements i = tid + NW 32 u of q are
   * q[i] * qa[u] + q[partner] * qb[u] (the rotation's cos / -+sin, times scale); the offsets and
   * coefficients do not depend on the previous kernel: computed before the wait, after it only the
   * loads (all issued before any is used) */
  constexpr int QU = (GM * (HW ? 64 : 128 * NJ) + NW * 32 - 1) / (NW * 32); /* hd <= 64 with HW */
  constexpr bool QPRE = QU <= 2;
  float qa[QPRE ? QU : 1], qb[QPRE ? QU : 1];
  int qpo[QPRE ? QU : 1]; /* partner offset from i (0: not rotated) */
  if (QPRE && fused) {
#pragma unroll
    for (int u = 0; u < (QPRE ? QU : 1); u++) {
      const int i = tid + NW * 32 * u, d = i % hd;
      qa[u] = scale;
      qb[u] = 0.f;
      qpo[u] = 0;
      if (i < G * hd && d < 2 * rp.halfq) {
        float sn, cs;
        sincosf((float)p * invq[d < rp.halfq ? d : d - rp.halfq], &sn, &cs);
        qa[u] = cs * scale * rp.msq;
        qb[u] = (d < rp.halfq ? -sn : sn) * scale * rp.msq;
        qpo[u] = d < rp.halfq ? rp.halfq : -rp.halfq;
      }
    }
  }
  if (trig == 1) pdl_trigger();
  TRA(1);
  pdl_wait();
  const int diag = (cl >> 15) & 31;
  /* (the float instance keeps its pointer select: other forms changed its register allocation) */
  if (hoist) {
    const float *kt = fused ? rp.k + kvt * hd : (const float *)(Kc + (own_sl >= 0 ? own_sl : 0) * row + koff);
    const float *vt = fused ? rp.v + kvt * hd : (const float *)(Vc + (own_sl >= 0 ? own_sl : 0) * row + koff);
    const KT *kc = Kc + (own_sl >= 0 ? own_sl : 0) * row + koff, *vc = Vc + (own_sl >= 0 ? own_sl : 0) * row + koff;
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const int d = tid + NW * 32 * u;
      if (d < hd) {
        hk[u] = at_new(fused, kt, kc, d);
        hv[u] = at_new(fused, vt, vc, d);
        if (fused && d < 2 * rp.halfk) {
          const int j = d < rp.halfk ? d : d - rp.halfk;
          hk0[u] = at_new(fused, kt, kc, j);
          hk1[u] = at_new(fused, kt, kc, j + rp.halfk);
        }
      }
    }
  }
  TRA(2);
#ifdef SMELT_CUDA_TRACE
  if (tr0) tr_a[40] = *(volatile unsigned long long *)(tr_a + 2);
#endif
  if (diag & 4) {
    for (int i = tid; i < G * hd; i += NW * 32) Qs[i] = scale;
  } else if (!fused) {
#pragma unroll 4
    for (int i = tid; i < G * hd; i += NW * 32) Qs[i] = __ldca(qg + i) * scale;
  } else if (QPRE) { /* the loop below's values, the scale folded into the coefficients */
    float qo[QPRE ? QU : 1], qp[QPRE ? QU : 1];
#pragma unroll
    for (int u = 0; u < (QPRE ? QU : 1); u++) {
      const int i = tid + NW * 32 * u;
      qo[u] = i < G * hd ? __ldca(qg + i) : 0.f;
      qp[u] = qpo[u] ? __ldca(qg + i + qpo[u]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < (QPRE ? QU : 1); u++) {
      const int i = tid + NW * 32 * u;
      if (i < G * hd) Qs[i] = fmaf(qo[u], qa[u], qp[u] * qb[u]);
    }
  } else {
#pragma unroll 4
    for (int i = tid; i < G * hd; i += NW * 32) {
      const int d = i % hd;
      float v = __ldca(qg + i);
      if (d < 2 * rp.halfq) v = at_rot(qg + i - d, d, rp.halfq, invq, p, rp.msq);
      Qs[i] = v * scale;
    }
  }
  if (hoist) {
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const int d = tid + NW * 32 * u;
      if (d >= hd) continue;
      float v = hk[u];
      if (fused && d < 2 * rp.halfk) {
        const float sn = hs[u], cs = hc[u];
        v = (d < rp.halfk ? hk0[u] * cs - hk1[u] * sn : hk0[u] * sn + hk1[u] * cs) * rp.msk;
      }
      Kp[d] = kv_round<KT>(v); /* as the cache holds it */
      Vp[d] = kv_round<KT>(hv[u]);
      if (fused && own_sl >= 0) {
        Kc[own_sl * row + koff + d] = kv_from_f<KT>(v);
        Vc[own_sl * row + koff + d] = kv_from_f<KT>(hv[u]);
      }
    }
  } else if (ownb) { /* this block's range holds the new position */
    const int64_t sl = at_slot(table, max_blocks, bs, nblocks, sq, p);
    const float *kt = fused ? rp.k + kvt * hd : (const float *)(Kc + (sl >= 0 ? sl : 0) * row + koff);
    const float *vt = fused ? rp.v + kvt * hd : (const float *)(Vc + (sl >= 0 ? sl : 0) * row + koff);
    const KT *kc = Kc + (sl >= 0 ? sl : 0) * row + koff, *vc = Vc + (sl >= 0 ? sl : 0) * row + koff;
    for (int d = tid; d < hd; d += NW * 32) {
      float v = at_new(fused, kt, kc, d);
      if (fused && d < 2 * rp.halfk) {
        const int j = d < rp.halfk ? d : d - rp.halfk;
        float sn, cs;
        sincosf((float)p * invk[j], &sn, &cs);
        const float x0 = at_new(fused, kt, kc, j), x1 = at_new(fused, kt, kc, j + rp.halfk);
        v = (d < rp.halfk ? x0 * cs - x1 * sn : x0 * sn + x1 * cs) * rp.msk;
      }
      Kp[d] = kv_round<KT>(v);
      const float vv = at_new(fused, vt, vc, d);
      Vp[d] = kv_round<KT>(vv);
      if (fused && sl >= 0) {
        Kc[sl * row + koff + d] = kv_from_f<KT>(v);
        Vc[sl * row + koff + d] = kv_from_f<KT>(vv);
      }
    }
  }
  __syncthreads();
  TRA(3);
  float4 qr[GM][NJ];
#pragma unroll
  for (int g = 0; g < GM; g++)
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int ch = HW ? (lane & 15) + 16 * j : lane + 32 * j;
      qr[g][j] = (g < G && ch < hd4) ? *(const float4 *)(Qs + g * hd + 4 * ch) : f4z();
    }
  /* RS (whole warps a position, GM * AT_B == 16 scores a batch): the 16 partial dot products are
   * reduced by a reduce-scatter (16 shuffles instead of 80); lane L then holds score
   * k = (L >> 1) & 15 = g * AT_B + b and does that score's softmax step alone (one exp), keeping
   * the running max / sum of its own head g in m[0] / l[0] */
  constexpr bool RS = !HW && GM * AT_B == 16;
  float m[GM], l[GM];
  float4 acc[GM][NJ];
#pragma unroll
  for (int g = 0; g < GM; g++) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[g][j] = f4z();
  }
  for (int i0 = 0; i0 < ((diag & 1) ? 0 : npos); i0 += (HW ? 2 : 1) * AT_B) {
    if (i0 && i0 < AT_B * (1 + nstg)) { /* staged: read back what this lane copied */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
      asm volatile("cp.async.wait_all;" ::: "memory");
#endif
#pragma unroll
      for (int b = 0; b < AT_B; b++) {
        const int i = i0 + b;
        const int64_t sl = __shfl_sync(0xffffffffu, my_slot, i & 31);
        own[b] = i < npos && a0 + warp + NW * i == p;
        ok[b] = i < npos && sl >= 0;
        const bool in = ok[b] && !own[b] && lane < hd4;
        const KT *sp = St + (size_t)(i - AT_B) * 2 * hd + 4 * lane;
        kr[b][0] = in ? kv_raw4_ld(sp) : kv_raw4_zero<KT>();
        vr[b][0] = in ? kv_raw4_ld(sp + hd) : kv_raw4_zero<KT>();
      }
    } else if (i0) load_batch(i0);
#pragma unroll
    for (int b = 0; b < AT_B; b++)
      if (own[b] && ok[b]) {
#pragma unroll
        for (int j = 0; j < NJ; j++) {
          const int ch = HW ? (lane & 15) + 16 * j : lane + 32 * j;
          if (ch < hd4) { /* Kp / Vp hold values the cache type holds exactly */
            kr[b][j] = kv_raw4_of(*(const float4 *)(Kp + 4 * ch), KT());
            vr[b][j] = kv_raw4_of(*(const float4 *)(Vp + 4 * ch), KT());
          }
        }
      }
      float s[GM][AT_B];
#pragma unroll
      for (int g = 0; g < GM; g++)
#pragma unroll
        for (int b = 0; b < AT_B; b++) {
          float d = 0.f;
#pragma unroll
          for (int j = 0; j < NJ; j++) d = dot4(qr[g][j], kv_cvt4(kr[b][j], KT()), d);
          s[g][b] = d;
        }
      if (RS && !(cl & 64)) {
        float v[16];
#pragma unroll
        for (int g = 0; g < GM; g++)
#pragma unroll
          for (int b = 0; b < AT_B; b++) v[g * AT_B + b] = s[g][b];
        at_rs_level<8>(v, lane); /* explicit levels: as a loop nvcc kept v[] in local memory */
        at_rs_level<4>(v, lane);
        at_rs_level<2>(v, lane);
        at_rs_level<1>(v, lane);
        float sc = v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
        const int k = (lane >> 1) & 15, gk = k / AT_B, bk = k % AT_B;
        bool okk = false;
#pragma unroll
        for (int b = 0; b < AT_B; b++) okk = bk == b ? ok[b] : okk;
        if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);
        if (!okk || gk >= G) sc = -INFINITY;
        float mx = sc; /* max over the batch's positions of head gk: lanes differing in b's bits */
#pragma unroll
        for (int o = 2; o < 2 * AT_B; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        mx = fmaxf(mx, m[0]);
        const float corr = mx == -INFINITY || m[0] == -INFINITY ? (mx == -INFINITY ? 1.f : 0.f) : expf(m[0] - mx);
        const float pk = sc == -INFINITY ? 0.f : expf(sc - mx);
        float ps = pk;
#pragma unroll
        for (int o = 2; o < 2 * AT_B; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        m[0] = mx;
        l[0] = l[0] * corr + ps;
#pragma unroll
        for (int g = 0; g < GM; g++) {
          const float cg = __shfl_sync(0xffffffffu, corr, 2 * g * AT_B);
          float pb[AT_B];
#pragma unroll
          for (int b = 0; b < AT_B; b++) pb[b] = __shfl_sync(0xffffffffu, pk, 2 * (g * AT_B + b));
#pragma unroll
          for (int j = 0; j < NJ; j++) {
            float4 a = acc[g][j];
            a.x *= cg; a.y *= cg; a.z *= cg; a.w *= cg;
#pragma unroll
            for (int b = 0; b < AT_B; b++) {
              const float4 v4 = kv_cvt4(vr[b][j], KT());
              a.x = fmaf(pb[b], v4.x, a.x); a.y = fmaf(pb[b], v4.y, a.y);
              a.z = fmaf(pb[b], v4.z, a.z); a.w = fmaf(pb[b], v4.w, a.w);
            }
            acc[g][j] = a;
          }
        }
      } else {
#pragma unroll
      for (int o = HW ? 8 : 16; o > 0; o >>= 1)
#pragma unroll
        for (int g = 0; g < GM; g++)
#pragma unroll
          for (int b = 0; b < AT_B; b++) s[g][b] += __shfl_xor_sync(0xffffffffu, s[g][b], o);
#pragma unroll
      for (int g = 0; g < GM; g++) {
        if (g >= G) break;
        float mx = m[g];
#pragma unroll
        for (int b = 0; b < AT_B; b++) {
          if (softcap > 0.f) s[g][b] = softcap * tanhf(s[g][b] / softcap);
          if (!ok[b]) s[g][b] = -INFINITY;
          mx = fmaxf(mx, s[g][b]);
        }
        if (HW) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16)); /* both halves' positions */
        if (mx == -INFINITY) continue;
        const float corr = m[g] == -INFINITY ? 0.f : expf(m[g] - mx);
        m[g] = mx;
        float pb[AT_B], ps = 0.f;
#pragma unroll
        for (int b = 0; b < AT_B; b++) { pb[b] = ok[b] ? expf(s[g][b] - mx) : 0.f; ps += pb[b]; }
        if (HW) ps += __shfl_xor_sync(0xffffffffu, ps, 16);
        l[g] = l[g] * corr + ps;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
          float4 a = acc[g][j];
          a.x *= corr; a.y *= corr; a.z *= corr; a.w *= corr;
#pragma unroll
          for (int b = 0; b < AT_B; b++) {
            const float4 v4 = kv_cvt4(vr[b][j], KT());
            a.x = fmaf(pb[b], v4.x, a.x); a.y = fmaf(pb[b], v4.y, a.y);
            a.z = fmaf(pb[b], v4.z, a.z); a.w = fmaf(pb[b], v4.w, a.w);
          }
          acc[g][j] = a;
        }
      }
      }
  }
  TRA(4);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (diag & 1) asm volatile("cp.async.wait_all;" ::: "memory");
#endif
  if (trig == 2) pdl_trigger();
  at_prefetch(rp);
  if (HW) /* each half-warp accumulated its own positions (same max and sum): add the halves */
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        acc[g][j].x += __shfl_xor_sync(0xffffffffu, acc[g][j].x, 16);
        acc[g][j].y += __shfl_xor_sync(0xffffffffu, acc[g][j].y, 16);
        acc[g][j].z += __shfl_xor_sync(0xffffffffu, acc[g][j].z, 16);
        acc[g][j].w += __shfl_xor_sync(0xffffffffu, acc[g][j].w, 16);
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (NJ == 1 && (cl & 256)) {
    /* RSC (SMELT_CUDA_ATTN_RSC, S > 1, hd % 32 == 0, G hd / 32 <= S): no merge of the warps in the
     * block: every warp's (max, sum, accumulator) of each head goes straight into the shared
     * memory of the cluster block that owns the 32-output chunk (rank c = g hd / 32 + d / 32), one
     * cluster barrier, then that block combines the S NW partials of its chunk alone (nothing is
     * read remotely: no barrier before exiting) */
    cg::cluster_group cluster = cg::this_cluster();
    const int P = S * NW, nq = hd >> 5, pi = z * NW + warp;
    float *Ra = (float *)((char *)sm4 + at_rsc_off(hd, G, S, NW)); /* [P][32] accumulators */
    float2 *Rm = (float2 *)(Ra + (size_t)P * 32);                  /* [P] (max, sum) */
    float *Rw = (float *)(Rm + P);                                 /* [P] weights */
    TRA(5);
    __cluster_barrier_wait(); /* every block of the cluster has started */
#pragma unroll
    for (int g = 0; g < GM; g++) {
      if (g >= G) break;
      const float mg = RS && !(cl & 64) ? __shfl_sync(0xffffffffu, m[0], 2 * g * AT_B) : m[g];
      const float lg = RS && !(cl & 64) ? __shfl_sync(0xffffffffu, l[0], 2 * g * AT_B) : l[g];
      const int ch = HW ? (lane & 15) : lane;
      if (diag & 2) break;
      if (cl & 8192) { /* st.async into the owner's buffers, completing bytes of its mbarrier */
        const unsigned mb = (unsigned)__cvta_generic_to_shared(&rsc_mb);
        if ((!HW || lane < 16) && ch < hd4) {
          const unsigned r = (unsigned)(g * nq + (ch >> 3));
          unsigned ra, rb;
          asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra)
                       : "r"((unsigned)__cvta_generic_to_shared(Ra + pi * 32 + (ch & 7) * 4)), "r"(r));
          asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(mb), "r"(r));
          asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                       ::"r"(ra), "f"(acc[g][0].x), "f"(acc[g][0].y), "f"(acc[g][0].z), "f"(acc[g][0].w), "r"(rb)
                       : "memory");
        }
        if (lane < nq) {
          const unsigned r = (unsigned)(g * nq + lane);
          unsigned ra, rb;
          asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra)
                       : "r"((unsigned)__cvta_generic_to_shared(Rm + pi)), "r"(r));
          asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(mb), "r"(r));
          asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                       ::"r"(ra), "f"(mg), "f"(lg), "r"(rb) : "memory");
        }
        continue;
      }
      if ((!HW || lane < 16) && ch < hd4)
        *(float4 *)(cluster.map_shared_rank(Ra, g * nq + (ch >> 3)) + pi * 32 + (ch & 7) * 4) = acc[g][0];
      if (lane < nq) cluster.map_shared_rank(Rm, g * nq + lane)[pi] = make_float2(mg, lg);
    }
    if (cl & 8192) { /* the owner's combining warps wait for its partials (phase 0 of its mbarrier) */
      if (sta && warp < ((cl & 2048) ? ((cl & 16384) && NW == 8 ? 8 : 4) : 1) && !(diag & 2)) {
        const unsigned mb = (unsigned)__cvta_generic_to_shared(&rsc_mb);
        unsigned done = 0;
        while (!done)
          asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                       : "=r"(done) : "r"(mb), "r"(0u) : "memory");
      }
    } else if (!(diag & 2)) {
      __cluster_barrier_arrive(); /* release: the stores above */
      __cluster_barrier_wait();   /* acquire: every partial of this block's chunk */
    }
    TRA(6);
    /* warps that combine (SMELT_CUDA_ATTN_CW): 1, 4 (a quarter of the partials each) or all 8 */
    const int cw = (cl & 2048) ? ((cl & 16384) && NW == 8 ? 8 : 4) : 1;
    if (warp < cw && z < G * nq) {
      const int g = z / nq, d = (z % nq) * 32 + lane, h = h0 + g;
      float2 ml[4];
      float wk[4];
      float M = -INFINITY, L = 0.f;
#pragma unroll
      for (int k = 0; k < 4; k++) { /* P <= 128 */
        const int q = lane + 32 * k;
        ml[k] = q < P ? Rm[q] : make_float2(-INFINITY, 0.f);
        M = fmaxf(M, ml[k].x);
      }
#pragma unroll
      for (int o2 = 16; o2 > 0; o2 >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o2));
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const int q = lane + 32 * k;
        const float w = M == -INFINITY || ml[k].x == -INFINITY ? 0.f : expf(ml[k].x - M);
        L = fmaf(ml[k].y, w, L);
        wk[k] = w;
        if (cw == 1 && q < P) Rw[q] = w;
      }
#pragma unroll
      for (int o2 = 16; o2 > 0; o2 >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o2);
      float o4[4] = { 0.f, 0.f, 0.f, 0.f };
      if (cw == 1) {
        __syncwarp();
        for (int q = 0; q < P; q += 4)
#pragma unroll
          for (int u = 0; u < 4; u++) o4[u] = fmaf(Ra[(q + u) * 32 + lane], Rw[q + u], o4[u]);
      } else { /* this warp's PW partials q = PW warp + j, the weight of q from lane q % 32's wk[q / 32] */
        const int PW = 128 / cw, q0 = PW * warp;
        const int kk = cw == 8 ? warp >> 1 : warp; /* q0 / 32 */
        float wq = wk[0];
#pragma unroll
        for (int k = 1; k < 4; k++) wq = kk == k ? wk[k] : wq;
#pragma unroll
        for (int j = 0; j < 32; j += 4) {
          if (j >= PW) break;
#pragma unroll
          for (int u = 0; u < 4; u++) {
            const int q = q0 + j + u;
            const float wv = __shfl_sync(0xffffffffu, wq, (q0 & 31) + j + u);
            o4[u] = q < P ? fmaf(Ra[q * 32 + lane], wv, o4[u]) : o4[u];
          }
        }
      }
      float o = (o4[0] + o4[1]) + (o4[2] + o4[3]);
      if (cw > 1) { /* the warps' sums meet in Qs (q is in registers by now) */
        Qs[warp * 32 + lane] = o;
        asm volatile("bar.sync 1, %0;" ::"r"(cw * 32) : "memory");
        if (warp) return;
        o = (Qs[lane] + Qs[32 + lane]) + (Qs[64 + lane] + Qs[96 + lane]);
        if (cw == 8) o += (Qs[128 + lane] + Qs[160 + lane]) + (Qs[192 + lane] + Qs[224 + lane]);
      }
      L = at_den(rp, h, L, M);
      const float v = L > 0.f ? o / L : 0.f;
      out[((int64_t)t * n_heads + h) * hd + d] = v;
      if (xq) at_quant_store(v, lane, (((int64_t)t * n_heads + h) * hd + d) >> 5, xq, xs);
    if (rp.x16) rp.x16[qw_half(t, h * hd + d, n_heads * hd, rp.bn)] = qm_h(v);
    }
    TRA(7);
    TRA_END;
    return;
  }
#endif
  /* merge the NW warps */
#pragma unroll
  for (int g = 0; g < GM; g++) {
    if (g >= G) break;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int ch = HW ? (lane & 15) + 16 * j : lane + 32 * j;
      if ((!HW || lane < 16) && ch < hd4) *(float4 *)(Ws + ((int64_t)warp * G + g) * hd + 4 * ch) = acc[g][j];
    }
    if (RS && !(cl & 64)) {
      const float mg = __shfl_sync(0xffffffffu, m[0], 2 * g * AT_B), lg = __shfl_sync(0xffffffffu, l[0], 2 * g * AT_B);
      if (lane == 0) { Ml[(warp * G + g) * 2] = mg; Ml[(warp * G + g) * 2 + 1] = lg; }
    } else if (lane == 0) { Ml[(warp * G + g) * 2] = m[g]; Ml[(warp * G + g) * 2 + 1] = l[g]; }
  }
  __syncthreads();
  /* the warps' weights exp(m_w - M) of each head, once (thread g) */
  float *Fw = Vp + hd, *FM = Fw + NW * G, *FL = FM + G; /* [NW][G] weights, [G] max, [G] sum */
  const bool oldm = cl & 128; /* SMELT_CUDA_ATTN_OLDM=1: weights recomputed for every output (A/B) */
  if (tid < G && !oldm) {
    float M = -INFINITY, L = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) M = fmaxf(M, Ml[(w * G + tid) * 2]);
#pragma unroll
    for (int w = 0; w < NW; w++) {
      const float mw = Ml[(w * G + tid) * 2];
      const float f = M == -INFINITY || mw == -INFINITY ? 0.f : expf(mw - M);
      L = fmaf(Ml[(w * G + tid) * 2 + 1], f, L);
      Fw[w * G + tid] = f;
    }
    FM[tid] = M;
    FL[tid] = L;
  }
  __syncthreads();
  for (int i = tid; i < G * hd; i += NW * 32) {
    const int g = i / hd, d = i % hd, h = h0 + g;
    float M = FM[g], L = FL[g], o = 0.f;
    if (!oldm) {
#pragma unroll
      for (int w = 0; w < NW; w++) o = fmaf(Ws[((int64_t)w * G + g) * hd + d], Fw[w * G + g], o);
    } else {
      M = -INFINITY;
      L = 0.f;
#pragma unroll
      for (int w = 0; w < NW; w++) M = fmaxf(M, Ml[(w * G + g) * 2]);
      if (M != -INFINITY) {
#pragma unroll
        for (int w = 0; w < NW; w++) {
          const float mw = Ml[(w * G + g) * 2];
          const float f = mw == -INFINITY ? 0.f : expf(mw - M);
          L = fmaf(Ml[(w * G + g) * 2 + 1], f, L);
          o = fmaf(Ws[((int64_t)w * G + g) * hd + d], f, o);
        }
      }
    }
    if (S == 1) {
      L = at_den(rp, h, L, M);
      const float v = L > 0.f ? o / L : 0.f;
      out[((int64_t)t * n_heads + h) * hd + d] = v;
      if (xq) at_quant_store(v, lane, (((int64_t)t * n_heads + h) * hd + d) >> 5, xq, xs);
    if (rp.x16) rp.x16[qw_half(t, h * hd + d, n_heads * hd, rp.bn)] = qm_h(v);
    } else if (cl & 3) { /* kept in shared memory for the cluster combine (q and the new k/v are consumed) */
      Qs[i] = o;
      if (d == 0) { Kp[2 * g] = M; Kp[2 * g + 1] = L; }
    } else {
      float *pp = part + (((int64_t)t * n_heads + h) * S + z) * (hd + 2);
      if (d == 0) { pp[0] = M; pp[1] = L; }
      pp[2 + d] = o;
    }
  }
  if (S == 1) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cl & 3) {
    /* the S blocks of (token, kv head) are one cluster: combine their (max, sum, output) through
     * distributed shared memory; block z does the 32-output chunks z, z + S, ... (a warp each) */
    cg::cluster_group cluster = cg::this_cluster();
    TRA(5);
    cluster.sync();
    TRA(6);
    const int nout = G * hd, nch = (nout + 31) / 32;
    for (int ch = z + S * warp; ch < nch; ch += NW * S) {
      const int i = ch * 32 + lane, ii = i < nout ? i : nout - 1;
      const int g = ii / hd, d = ii % hd, h = h0 + g;
      float o = 0.f, L = 0.f, M = -INFINITY;
      if ((cl & 3) == 2 && hd % 32 == 0 && !(cl & 128)) {
        /* S <= 16; the chunk's 32 outputs are of one head g: lane k < S reads split k's (max, sum)
         * and computes its weight once; every remote output is requested before any is used */
        const float2 mlk = lane < S ? *(const float2 *)(cluster.map_shared_rank(Kp, lane) + 2 * g)
                                    : make_float2(-INFINITY, 0.f);
        float ov[16];
#pragma unroll
        for (int k = 0; k < 16; k++) ov[k] = k < S ? cluster.map_shared_rank(Qs, k)[ii] : 0.f;
        M = mlk.x;
#pragma unroll
        for (int o2 = 16; o2 > 0; o2 >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o2));
        const float fk = M == -INFINITY || mlk.x == -INFINITY ? 0.f : expf(mlk.x - M);
        L = mlk.y * fk;
#pragma unroll
        for (int o2 = 16; o2 > 0; o2 >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o2);
#pragma unroll
        for (int k = 0; k < 16; k++) o = fmaf(ov[k], __shfl_sync(0xffffffffu, fk, k), o);
      } else if ((cl & 3) == 2) { /* S <= 16: every remote (max, sum) and output is requested before any is used */
        float2 ml[16];
        float ov[16];
#pragma unroll
        for (int k = 0; k < 16; k++) {
          ml[k] = k < S ? *(const float2 *)(cluster.map_shared_rank(Kp, k) + 2 * g) : make_float2(-INFINITY, 0.f);
          ov[k] = k < S ? cluster.map_shared_rank(Qs, k)[ii] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < 16; k++) M = fmaxf(M, ml[k].x);
        if (M != -INFINITY)
#pragma unroll
          for (int k = 0; k < 16; k++) {
            const float f = ml[k].x == -INFINITY ? 0.f : expf(ml[k].x - M);
            L = fmaf(ml[k].y, f, L);
            o = fmaf(ov[k], f, o);
          }
      } else {
        for (int k = 0; k < S; k++) M = fmaxf(M, cluster.map_shared_rank(Kp, k)[2 * g]);
        if (M != -INFINITY)
          for (int k = 0; k < S; k++) {
            const float *rk = cluster.map_shared_rank(Kp, k);
            const float mk = rk[2 * g];
            const float f = mk == -INFINITY ? 0.f : expf(mk - M);
            L = fmaf(rk[2 * g + 1], f, L);
            o = fmaf(cluster.map_shared_rank(Qs, k)[ii], f, o);
          }
      }
      L = at_den(rp, h, L, M);
      const float v = L > 0.f ? o / L : 0.f;
      if (i < nout) out[((int64_t)t * n_heads + h) * hd + d] = v;
      if (xq) at_quant_store(v, lane, (((int64_t)t * n_heads + h) * hd + d) >> 5, xq, xs);
      if (rp.x16 && i < nout) rp.x16[qw_half(t, h * hd + d, n_heads * hd, rp.bn)] = qm_h(v);
    }
    TRA(7);
    cluster.sync(); /* the other blocks' shared memory stays readable until all are done */
    TRA(8);
    TRA_END;
    return;
  }
#endif
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(cnt + (int64_t)t * nkv + kvh, 1) == S - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  /* combine: per (head, split) weight exp(m_z - M) / L once (one (m, l) load per split), then
   * the S partials of an output loaded together (16 at a time) */
  float *Wz = Ws; /* [G][S] (the accumulators are consumed) */
  for (int g = warp; g < G; g += NW) {
    const float *pp = part + ((int64_t)t * n_heads + h0 + g) * S * (hd + 2);
    float mz[2], lz[2];
#pragma unroll
    for (int k = 0; k < 2; k++) { /* S <= 64 */
      const int zz = lane + 32 * k;
      mz[k] = -INFINITY;
      lz[k] = 0.f;
      if (zz < S) { mz[k] = __ldcg(pp + (int64_t)zz * (hd + 2)); lz[k] = __ldcg(pp + (int64_t)zz * (hd + 2) + 1); }
    }
    float M = fmaxf(mz[0], mz[1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float wz[2], L = 0.f;
#pragma unroll
    for (int k = 0; k < 2; k++) {
      wz[k] = (M == -INFINITY || mz[k] == -INFINITY) ? 0.f : expf(mz[k] - M);
      L = fmaf(lz[k], wz[k], L);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    L = at_den(rp, h0 + g, L, M);
    const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const int zz = lane + 32 * k;
      if (zz < S) Wz[g * S + zz] = wz[k] * inv;
    }
  }
  __syncthreads();
  for (int i = tid; i < G * hd; i += NW * 32) {
    const int g = i / hd, d = i % hd, h = h0 + g;
    const float *pp = part + ((int64_t)t * n_heads + h) * S * (hd + 2) + 2 + d;
    float o = 0.f;
    for (int z0 = 0; z0 < S; z0 += 16) {
      float v[16];
#pragma unroll
      for (int k = 0; k < 16; k++) v[k] = z0 + k < S ? __ldcg(pp + (int64_t)(z0 + k) * (hd + 2)) : 0.f;
#pragma unroll
      for (int k = 0; k < 16; k++) o = z0 + k < S ? fmaf(v[k], Wz[g * S + z0 + k], o) : o;
    }
    const float v = o;
    out[((int64_t)t * n_heads + h) * hd + d] = v;
    if (xq) at_quant_store(v, lane, (((int64_t)t * n_heads + h) * hd + d) >> 5, xq, xs);
    if (rp.x16) rp.x16[qw_half(t, h * hd + d, n_heads * hd, rp.bn)] = qm_h(v);
  }
  if (tid == 0) cnt[(int64_t)t * nkv + kvh] = 0;
}

/* the launcher's flag bits (see above): where the next kernel may launch (trig, 2 bits from AT_TRIG),
 * the S splits are one cluster (AT_CL, combined loading all splits at once), RSC applies (AT_RSC), K/V
 * batches staged before the wait (2 bits from AT_STG), K/V rows read L2 evict-first (AT_KVEF),
 * developer diagnostics (5 bits from AT_DIAG: 1 no position loop, 2 no partial exchange, 4 no q load,
 * 8 half the K/V bytes, 16 no K/V loads; wrong results); AT_DEFAULT: the new position's k/v read
 * before q (4), RSC partials combined by all eight warps (2048 | 16384) and sent with st.async (8192) */
enum { AT_CL = 2, AT_TRIG = 3, AT_RSC = 256, AT_STG = 9, AT_KVEF = 4096, AT_DIAG = 15, AT_HS = 1 << 20,
       AT_DEFAULT = 4 | 2048 | 16384 | 8192 };

/* 5 to 8 query heads a KV head (Qwen2.5-7B's 7, Qwen3-30B-A3B's and Llama-70B's 8) run as two blocks
 * of at most 4 (attn_hsplit): the 8-warp kernel with the reduce-scatter of scores, instead of the
 * 4-warp one for G <= 8 */
int cu_attn_dec_hsplit(const cu_tune *t, int hd, int G) {
  return t->attn_hsplit && G >= 5 && G <= 8 && hd % 32 == 0 && (hd <= 128 || (hd <= 256 && t->attn_w256 == 8)) ? 2
                                                                                                              : 1;
}
size_t cu_attn_dec_smem(const cu_tune *t, int hd, int G, int S, sm_dtype dt) {
  if (cu_attn_dec_hsplit(t, hd, G) == 2) G = 4;
  const int Sc = S < 16 ? S : 16, nw = cu_attn_dec_warps(t, hd, G, dt);
  return at_smem(t, hd, G, Sc, nw, at_rsc(hd, G, Sc, nw, true));
}

bool cu_attn_dec_ok(int hd, int G, sm_dtype dt) {
  return (dt == SM_DT_F32 || dt == SM_DT_F16 || dt == SM_DT_BF16) && hd % 4 == 0 && hd <= 256 && G >= 1 && G <= 8;
}

/* 8 warps a block for G <= 4, hd <= 128 (the position loop is latency-bound: ncu showed ~1 eligible
 * warp a scheduler at 4 warps and 255 registers; 8 warps capped at 128 registers, 4 positions a batch,
 * measured fastest on the H100), and for G <= 4, hd <= 256 with attn_w256 8 and a 16-bit cache (two
 * chunks of a row a lane; G <= 2 four positions a batch, else two; an f32 cache spills there); else 4 */
/* (the same for every cache type: a 16-bit cache is read with the f32 layout, 8 bytes a lane; 16 bytes
 * a lane in half-warps with 4 warps measured slower on the H100: 8B 4-bit decode 464.9 vs 487.7 tok/s) */
int cu_attn_dec_warps(const cu_tune *t, int hd, int G, sm_dtype dt) {
  return G <= 4 && (hd <= 128 || (hd <= 256 && t->attn_w256 == 8 && dt != SM_DT_F32)) ? 8 : 4;
}
int cu_attn_dec_splits(const cu_tune *t, int n_tokens, int nkv, int n_sm) {
  if (t->attn_s >= 1) return t->attn_s;
  const int units = n_tokens * nkv;
  int S = 1;
  while (S < 64 && units * S * 2 <= 2 * n_sm) S *= 2;
  return S;
}

template <typename KT, int GM, int NJ, int B, bool HW, int NW> static void set_smem(size_t smem, bool big_cluster) {
  static size_t done = 0;
  static bool np = false;
  if (smem > 48 * 1024 && smem > done) {
    cudaFuncSetAttribute(k_attn_dec2<KT, GM, NJ, B, HW, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    done = smem;
  }
  if (!np && big_cluster) {
    cudaFuncSetAttribute(k_attn_dec2<KT, GM, NJ, B, HW, NW>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    np = true;
  }
}

void cu_attn_decode(const cu_ctx *cx, const cu_attn_args *x) {
  const cu_tune *t = cx->t;
  const int Gr = x->n_heads / x->nkv, hs = cu_attn_dec_hsplit(t, x->hd, Gr), nkv = x->nkv * hs;
  const int G = hs == 2 ? 4 : Gr, hd = x->hd, hd4 = hd / 4;
  int S = x->S;
  const bool cl = !x->global_combine && t->attn_cl >= 2 && S > 1;
  if (cl && S > t->attn_cl) S = t->attn_cl;
  dim3 grid((unsigned)x->n_tokens, (unsigned)nkv, (unsigned)S);
  uint8_t *xq = (uint8_t *)x->xq;
  float2 *xs = xq ? (float2 *)(xq + (size_t)x->n_tokens * x->n_heads * hd) : NULL;
  at_rope rp = { x->kraw, x->vraw, x->invq, x->invk, x->halfq, x->halfk, x->rope_rows > 1 ? x->rope_rows : 1,
                 x->rope_pos0, x->rope_rows > 0 ? x->msq : 1.f, x->rope_rows > 0 ? x->msk : 1.f,
                 { NULL, NULL }, { 0, 0 }, (__half *)x->x16, x->x16_bn, x->sinks };
  for (int i = 0; i < 2; i++)
    if (x->pf[i] && x->pfn[i] >= 16) {
      rp.pf[i] = (const char *)x->pf[i];
      rp.pfn[i] = (long long)(x->pfn[i] & ~(size_t)15);
    }
  if (S == 1 && t->attn_b && cu_attn_decb_ok(hd, Gr, x->dt) && !x->sinks) {
    cu_attn_decb_run(cx, x, rp);
    return;
  }
  const bool hw = hd4 <= 16; /* hd <= 64: half-warp positions */
  const int nw = cu_attn_dec_warps(t, hd, G, x->dt);
  const bool rsc = at_rsc(hd, G, S, nw, cl);
  const size_t sm = at_smem(t, hd, G, S, nw, rsc);
  const int nstg = at_nstg(t, hd, nw);
  const int flags = AT_DEFAULT | (cl ? AT_CL : 0) | (t->attn_trig << AT_TRIG) | (rsc ? AT_RSC : 0) |
                    (nstg << AT_STG) | (t->attn_kvef ? AT_KVEF : 0) | ((t->attn_diag & 31) << AT_DIAG) |
                    (hs == 2 ? AT_HS | Gr << 21 : 0);
#define AD2_LW(GM, NJ, B, HW, NW)                                                                           \
  do {                                                                                                    \
    set_smem<KT, GM, NJ, B, HW, NW>(sm, t->attn_cl > 8);                                                  \
    cu_launch_cl(cx, k_attn_dec2<KT, GM, NJ, B, HW, NW>, grid, dim3(NW * 32), sm, cl ? S : 0, x->out, xq, xs,  \
                 x->part, x->cnt, x->q, rp, (KT *)x->K, (KT *)x->V, x->pos, x->seq, x->table, x->max_blocks,   \
                 x->bs, x->nblocks, x->n_heads, nkv, hd, x->scale, x->window, x->softcap, S, flags);          \
  } while (0)
  CU_KV_DISPATCH(x->dt, {
    if (nw == 8) { /* 8 warps (128 registers) */
      if (hw) AD2_LW(4, 1, 4, true, 8);
      else if (hd4 <= 32) AD2_LW(4, 1, 4, false, 8);
      else if (G <= 2) AD2_LW(2, 2, 4, false, 8); /* hd > 128 */
      else AD2_LW(4, 2, 2, false, 8);
    } else if (G <= 4) AD2_LW(4, 2, 4, false, 4); /* hd > 128 */
    else if (hw) AD2_LW(8, 1, 4, true, 4);
    else if (hd4 <= 32) AD2_LW(8, 1, 4, false, 4);
    else AD2_LW(8, 2, 2, false, 4);
  });
#undef AD2_LW
  cu_count(cx, CU_K_ATTN_DEC);
}
