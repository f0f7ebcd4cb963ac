/* Flash attention for prefill and mixed batches on tensor cores (sm_80+: mma.sync m16n8k16, f32
 * accumulation; written by hand because no library reads this paged cache layout).
 *
 * A block takes one tile of <= CU_ATT_TQ consecutive tokens of one sequence (the tiles the backend
 * builds for every batch), one kv head and one chunk of FA_BM rows of that tile's (token, query head
 * of the group) grid: all query heads of a GQA group share every K/V tile the block loads. Four
 * warps own 16 rows each. Keys and values come FA_BN positions at a time from the paged cache into
 * shared memory: an f16 / bf16 cache by cp.async, double-buffered, an f32 cache converted to f16
 * through registers. S = Q K^T and O += P V run on tensor cores (f16 operands, bf16 for a bf16
 * cache) with the scores kept in registers (the accumulator layout of S is the operand layout of
 * P), online softmax in the base-2 domain (q is pre-scaled by scale * log2 e). Warps skip key steps
 * wholly outside their rows' causal / sliding-window range; blocks run longest tiles first. With
 * S > 1 splits of the key range the partials (max in natural log, sum, unnormalized output) go to
 * k_attn_combine (cuda_attn_prefill.cu), exactly as the CUDA-core kernel's. Softcap: cap * tanh(s /
 * cap) on the scores before the mask. Precision: q and p rounded to the operand type (f16: relative
 * error ~5e-4 each); SMELT_CUDA_ATTN_FA=0 selects the f32 CUDA-core kernel. */
#include <math.h>
#include <type_traits>
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_mma.cuh"

#define FA_BM 64 /* rows (token x query head) a block */
#define FA_BN 64 /* key positions a step */
#define FA_NW 4  /* warps a block (16 rows each) */

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800 /* the device helpers: sm_80+ */
static __device__ __forceinline__ int fa_slot(const int32_t *table, int max_blocks, int bs, int nblocks, int s, int p) {
  const int bi = p / bs;
  if (p < 0 || bi >= max_blocks) return -1;
  const int blk = table[(int64_t)s * max_blocks + bi];
  return blk < 0 || blk >= nblocks ? -1 : blk * bs + p % bs;
}

/* K/V staging of one step (positions p0 .. p0 + FA_BN - 1 of the block's range):
 *  - a half-precision cache (KT = MT): cp.async 16-byte copies straight into shared memory, zero-filled
 *    where the position is unmapped or past the block's range, and a validity flag per position;
 *  - an f32 cache, or a q8_0 / q4_0 one (dequantized): loads through registers, converted to f16
 *    (synchronous). */
#endif

template <int HD, typename KT, typename MT>
static __device__ __forceinline__ void fa_stage(MT *Ks, MT *Vs, unsigned char *valid, const KT *Kc, const KT *Vc,
                                                const int32_t *table, int max_blocks, int bs, int nblocks, int sq,
                                                int p0, int hi, int row_stride, int kvh) {
  constexpr int HDP = HD + 8;
  if constexpr (sizeof(KT) == 2) {
    constexpr int CPR = HD / 8; /* 16-byte chunks a row */
    constexpr int PER = FA_BN * CPR / (FA_NW * 32);
#pragma unroll
    for (int it = 0; it < PER; it++) {
      const int idx = it * FA_NW * 32 + threadIdx.x, j = idx / CPR, c = idx % CPR, p = p0 + j;
      const int sl = p <= hi ? fa_slot(table, max_blocks, bs, nblocks, sq, p) : -1;
      if (c == 0) valid[j] = sl >= 0;
      const int64_t o = (int64_t)(sl >= 0 ? sl : 0) * row_stride + (int64_t)kvh * HD + 8 * c;
      const unsigned n = sl >= 0 ? 16u : 0u;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(cu_smem_u32(Ks + j * HDP + 8 * c)), "l"(Kc + o),
                   "r"(n) : "memory");
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(cu_smem_u32(Vs + j * HDP + 8 * c)), "l"(Vc + o),
                   "r"(n) : "memory");
    }
  } else {
    constexpr int PER = FA_BN * (HD / 4) / (FA_NW * 32);
#pragma unroll 4
    for (int it = 0; it < PER; it++) {
      const int idx = it * FA_NW * 32 + threadIdx.x, j = idx / (HD / 4), d4 = idx % (HD / 4), p = p0 + j;
      const int sl = p <= hi ? fa_slot(table, max_blocks, bs, nblocks, sq, p) : -1;
      if (d4 == 0) valid[j] = sl >= 0;
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
      if (sl >= 0) {
        kv = kv_hget4(kv_head(Kc, sl, row_stride / HD, kvh, HD), HD, 4 * d4);
        vv = kv_hget4(kv_head(Vc, sl, row_stride / HD, kvh, HD), HD, 4 * d4);
      }
      *(uint2 *)(Ks + j * HDP + 4 * d4) = make_uint2(pk2<MT>(kv.x, kv.y), pk2<MT>(kv.z, kv.w));
      *(uint2 *)(Vs + j * HDP + 4 * d4) = make_uint2(pk2<MT>(vv.x, vv.y), pk2<MT>(vv.z, vv.w));
    }
  }
}

/* KT: the cache's element type; MT: the tensor-core operand type (bf16 for a bf16 cache, else f16).
 * A half-precision cache is double-buffered (the next step's copies fly during this step's math). */
template <int HD, typename KT>
__global__ void __launch_bounds__(FA_NW * 32)
    k_attn_fa(float *__restrict__ out, float *__restrict__ part, const float *__restrict__ q,
              const KT *__restrict__ Kc, const KT *__restrict__ Vc, const int32_t *__restrict__ pos,
              const int32_t *__restrict__ seq, const int32_t *__restrict__ table, const int32_t *__restrict__ tiles,
              int n_tiles, int max_blocks, int bs, int nblocks, int n_heads, int nkv, int chunks, float qscale,
              int window, float cap2, int S, const int32_t *__restrict__ span, const float *__restrict__ sinks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap(); /* the host launches this kernel on sm_80+ only */
#else
  typedef typename std::conditional<std::is_same<KT, __nv_bfloat16>::value, __nv_bfloat16, __half>::type MT;
  constexpr int HDP = HD + 8; /* elements a shared-memory row: 16 bytes of padding, conflict-free ldmatrix */
  constexpr int NBUF = sizeof(KT) == 2 ? 2 : 1;
  extern __shared__ float4 fa_sm4[];
  MT *Qs = (MT *)fa_sm4, *KV = Qs + FA_BM * HDP; /* KV: NBUF x (K, V) of FA_BN rows */
  unsigned char *valid = (unsigned char *)(KV + NBUF * 2 * FA_BN * HDP); /* [NBUF][FA_BN] */
  const int tile = n_tiles - 1 - (int)blockIdx.x; /* later tokens see more keys: start them first */
  const int kvh = blockIdx.y / chunks, r0 = (blockIdx.y % chunks) * FA_BM, z = blockIdx.z;
  const int t0 = tiles[tile], t1 = tiles[tile + 1], G = n_heads / nkv, rows = (t1 - t0) * G;
  if (r0 >= rows) return;
  const int nr = min(FA_BM, rows - r0), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int sq = seq[t0], row_stride = nkv * HD;
  /* the block's key range */
  int lo = 0x7fffffff, hi = -1;
  for (int t = t0 + r0 / G; t <= t0 + (r0 + nr - 1) / G; t++) {
    const int p = pos[t], l = window > 0 ? max(0, p - window + 1) : 0;
    lo = min(lo, span ? min(l, span[2 * t]) : l);
    hi = max(hi, span ? max(p, span[2 * t + 1]) : p);
  }
  const int nkb = (hi - lo + FA_BN) / FA_BN, per = (nkb + S - 1) / S;
  const int kb0 = z * per, kb1 = min(nkb, kb0 + per);
  if (NBUF == 2 && kb0 < kb1) { /* the first step's copies, before q */
    fa_stage<HD>(KV, KV + FA_BN * HDP, valid, Kc, Vc, table, max_blocks, bs, nblocks, sq, lo + kb0 * FA_BN, hi,
                 row_stride, kvh);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  /* q rows, scaled, as MT */
  for (int idx = threadIdx.x; idx < FA_BM * (HD / 4); idx += FA_NW * 32) {
    const int r = idx / (HD / 4), d4 = idx % (HD / 4);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < nr) {
      const int rr = r0 + r, t = t0 + rr / G, h = kvh * G + rr % G;
      v = *(const float4 *)(q + ((int64_t)t * n_heads + h) * HD + 4 * d4);
    }
    *(uint2 *)(Qs + r * HDP + 4 * d4) = make_uint2(pk2<MT>(v.x * qscale, v.y * qscale), pk2<MT>(v.z * qscale, v.w * qscale));
  }
  /* this thread's two rows (lane/4 and lane/4 + 8 of the warp's 16): position and lowest key */
  int prow[2], plo[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int r = 16 * warp + (lane >> 2) + 8 * i;
    prow[i] = -1;
    plo[i] = 0x7fffffff;
    if (r < nr) {
      const int t = t0 + (r0 + r) / G;
      prow[i] = pos[t];
      plo[i] = window > 0 ? max(0, prow[i] - window + 1) : 0;
      if (span) { /* widened key range (sm_batch.attn_span) */
        plo[i] = min(plo[i], span[2 * t]);
        prow[i] = max(prow[i], span[2 * t + 1]);
      }
    }
  }
  int whi = max(prow[0], prow[1]), wlo = min(plo[0], plo[1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
  }
  float acc[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.f, 0.f };
  for (int kb = kb0; kb < kb1; kb++) {
    const int p0 = lo + kb * FA_BN, cur = NBUF == 2 ? (kb - kb0) & 1 : 0;
    MT *Ks = KV + cur * 2 * FA_BN * HDP, *Vs = Ks + FA_BN * HDP;
    const unsigned char *vd = valid + cur * FA_BN;
    __syncthreads(); /* every warp is done with the previous step's buffers (and the q stores are visible) */
    if constexpr (NBUF == 2) {
      if (kb + 1 < kb1) {
        MT *Kn = KV + (cur ^ 1) * 2 * FA_BN * HDP;
        fa_stage<HD>(Kn, Kn + FA_BN * HDP, valid + (cur ^ 1) * FA_BN, Kc, Vc, table, max_blocks, bs, nblocks, sq,
                     p0 + FA_BN, hi, row_stride, kvh);
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory"); /* this step's copies (all but the newest group) */
    } else {
      fa_stage<HD>(Ks, Vs, valid, Kc, Vc, table, max_blocks, bs, nblocks, sq, p0, hi, row_stride, kvh);
    }
    __syncthreads();
    if (p0 > whi || p0 + FA_BN - 1 < wlo) continue; /* no key of this step is visible to the warp's rows */
    /* S = Q K^T (16 rows x FA_BN keys a warp), masked and softcapped; online softmax; O += P V */
    float s[FA_BN / 8][4];
    fa_scores<MT, HD, FA_BN, HDP>(s, Qs + 16 * warp * HDP, Ks, lane);
#pragma unroll
    for (int n = 0; n < FA_BN / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int i = e >> 1, c = n * 8 + 2 * (lane & 3) + (e & 1), p = p0 + c;
        float v = s[n][e];
        if (cap2 > 0.f) v = cap2 * tanhf(v / cap2);
        s[n][e] = (vd[c] && p <= prow[i] && p >= plo[i]) ? v : -INFINITY;
      }
    }
    fa_softmax<HD, FA_BN>(s, acc, m, l);
    fa_pv<MT, HD, FA_BN, HDP>(acc, s, Vs, lane);
  }
  if (NBUF == 2) asm volatile("cp.async.wait_all;" ::: "memory"); /* no copy outlives the block */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int r = 16 * warp + (lane >> 2) + 8 * i;
    if (r >= nr) continue;
    const int rr = r0 + r, t = t0 + rr / G, h = kvh * G + rr % G;
    if (S == 1) {
      /* attention sinks: exp(sink - max) in the denominator (m in log2 units) */
      const float L = sinks && m[i] != -INFINITY ? l[i] + exp2f(sinks[h] * 1.4426950408889634f - m[i]) : l[i];
      const float inv = L > 0.f ? 1.f / L : 0.f;
      float *o = out + ((int64_t)t * n_heads + h) * HD + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < HD / 8; n++) *(float2 *)(o + n * 8) = make_float2(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv);
    } else {
      float *pp = part + (((int64_t)t * n_heads + h) * S + z) * (HD + 2);
      if ((lane & 3) == 0) {
        pp[0] = m[i] == -INFINITY ? -INFINITY : m[i] * 0.69314718056f; /* back to natural log */
        pp[1] = l[i];
      }
      float *o = pp + 2 + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < HD / 8; n++) *(float2 *)(o + n * 8) = make_float2(acc[n][2 * i], acc[n][2 * i + 1]);
    }
  }
#endif
}

static size_t fa_smem_bytes(int hd, sm_dtype dt) {
  const int nbuf = dt == SM_DT_F16 || dt == SM_DT_BF16 ? 2 : 1;
  return (size_t)(FA_BM + nbuf * 2 * FA_BN) * (hd + 8) * 2 + (size_t)nbuf * FA_BN;
}

bool cu_attn_flash_ok(const cu_ctx *cx, int hd, sm_dtype dt, size_t smem_optin) {
  if (cx->arch < 80 || !cx->t->attn_fa) return false;
  if (hd != 64 && hd != 80 && hd != 96 && hd != 128 && hd != 256) return false;
  if (dt != SM_DT_F32 && dt != SM_DT_F16 && dt != SM_DT_BF16 && dt != SM_DT_Q8_0 && dt != SM_DT_Q4_0) return false;
  return fa_smem_bytes(hd, dt) <= smem_optin;
}

template <int HD, typename KT> static void fa_attr(size_t smem_optin, sm_dtype dt) {
  const size_t b = fa_smem_bytes(HD, dt);
  if (b <= smem_optin) cudaFuncSetAttribute(k_attn_fa<HD, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b);
}
template <typename KT> static void fa_init(size_t smem_optin, sm_dtype dt) {
  fa_attr<64, KT>(smem_optin, dt);
  fa_attr<80, KT>(smem_optin, dt);
  fa_attr<96, KT>(smem_optin, dt);
  fa_attr<128, KT>(smem_optin, dt);
  fa_attr<256, KT>(smem_optin, dt);
}
void cu_attn_flash_init(size_t smem_optin) {
  fa_init<float>(smem_optin, SM_DT_F32);
  fa_init<__half>(smem_optin, SM_DT_F16);
  fa_init<__nv_bfloat16>(smem_optin, SM_DT_BF16);
  fa_init<kv_q8>(smem_optin, SM_DT_Q8_0);
  fa_init<kv_q4>(smem_optin, SM_DT_Q4_0);
  cudaGetLastError();
}

void cu_attn_flash_run(const cu_ctx *cx, const cu_attn_tiled *a, int S) {
  const int G = a->n_heads / a->nkv, chunks = (CU_ATT_TQ * G + FA_BM - 1) / FA_BM;
  const size_t smem = fa_smem_bytes(a->hd, a->dt);
  const dim3 grid((unsigned)a->n_tiles, (unsigned)(a->nkv * chunks), (unsigned)S);
  const float qscale = a->scale * 1.4426950408889634f, cap2 = a->softcap > 0.f ? a->softcap * 1.4426950408889634f : 0.f;
#define FA_ARGS a->out, a->part, a->q, (const KT *)a->K, (const KT *)a->V, a->pos, a->seq, a->table, a->tiles, a->n_tiles, \
                a->max_blocks, a->bs, a->nblocks, a->n_heads, a->nkv, chunks, qscale, a->window, cap2, S, a->span, a->sinks
  CU_KV_DISPATCH_Q(a->dt, switch (a->hd) {
    case 64: k_attn_fa<64, KT><<<grid, FA_NW * 32, smem, cx->s>>>(FA_ARGS); break;
    case 80: k_attn_fa<80, KT><<<grid, FA_NW * 32, smem, cx->s>>>(FA_ARGS); break;
    case 96: k_attn_fa<96, KT><<<grid, FA_NW * 32, smem, cx->s>>>(FA_ARGS); break;
    case 128: k_attn_fa<128, KT><<<grid, FA_NW * 32, smem, cx->s>>>(FA_ARGS); break;
    default: k_attn_fa<256, KT><<<grid, FA_NW * 32, smem, cx->s>>>(FA_ARGS); break;
  });
#undef FA_ARGS
}
