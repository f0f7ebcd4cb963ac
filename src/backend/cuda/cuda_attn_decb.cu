/* Decode attention of many sequences at once: cu_attn_decode's one-split case (at least as many
 * (token, kv head) pairs as the GPU has SMs, e.g. 64 sequences of the 1B shape's 8 KV heads), on a
 * 16-bit cache with head dims of 32 or 64 and at most 8 query heads a KV head. (Head dims of 128 stay
 * on k_attn_dec2, whose whole-warp rows with staged batches served the 8B shape at 64 clients 1-2%
 * faster than this kernel with chunks of 128 positions: H200, three rounds each.)
 *
 * Why a kernel of its own: k_attn_dec2 (cuda_attn.cu) deals a sequence's positions round-robin to
 * warps that each keep an online softmax, a few positions a memory round trip, with shuffle
 * reductions in between: right for one sequence with a long context spread over many blocks. With
 * 64 sequences of a few hundred positions its blocks (8 warps, 2 an SM) are two waves of chains of
 * dependent round trips: 27-33 us a layer on an H200 for ~14 MB of K/V (a few us of bandwidth).
 *
 * Here one block of 128 threads takes a (token, kv head) and walks its positions in chunks of
 * C = 256 positions, two a thread. A thread loads the whole K rows
 * of its positions into registers (16-byte loads, every load of the chunk in flight at once) and
 * computes their scores for all G query heads against q in shared memory (broadcast reads, no
 * shuffles), while cp.async brings the chunk's V rows into shared memory. The chunk's softmax is
 * one pass a head (a warp a head), then each warp accumulates P.V over a quarter of the chunk's
 * positions (lane: hd / 32 output dims of every head), and the four warps' sums meet at the end. The
 * first chunk's K and V rows are requested before pdl_wait (positions before the token's own do not
 * depend on the previous kernel); the token's own k and v (rotated and stored here when the
 * rotation is fused in, as k_attn_dec2 does) come from shared memory. A chunk costs about one round
 * trip, and 4 blocks an SM (registers; 22-43 KB of shared memory each) fit 64 sequences of 8 KV heads
 * with at most 4 query heads each in one wave on an H100 / H200. */
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_attn_dev.cuh"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_q4dev.cuh"
#include "backend/cuda/cuda_qmma_dev.cuh"

enum { DB_NT = 128, DB_NW = 4 };
enum { DB_C = 256 }; /* positions a chunk */

/* eight 16-bit elements as floats */
static __device__ __forceinline__ void db_cvt8(uint4 u, float (&f)[8], __half) {
  const float4 a = kv_h4(make_uint2(u.x, u.y), __half()), b = kv_h4(make_uint2(u.z, u.w), __half());
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
  f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}
static __device__ __forceinline__ void db_cvt8(uint4 u, float (&f)[8], __nv_bfloat16) {
  const float4 a = kv_h4(make_uint2(u.x, u.y), __nv_bfloat16()), b = kv_h4(make_uint2(u.z, u.w), __nv_bfloat16());
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
  f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}

/* KT: __half or __nv_bfloat16; HD: head dim (32 or 64); GM: most query heads a KV head (4 or 8) */
template <typename KT, int HD, int GM>
__global__ void __launch_bounds__(DB_NT, GM <= 4 ? 4 : 3) k_attn_decb(float *__restrict__ out, uint8_t *__restrict__ xq,
                                                    float2 *__restrict__ xs, const float *__restrict__ q,
                                                    const at_rope rp, KT *__restrict__ Kc, KT *__restrict__ Vc,
                                                    const int32_t *__restrict__ pos, const int32_t *__restrict__ seq,
                                                    const int32_t *__restrict__ table, int max_blocks, int bs,
                                                    int nblocks, int n_heads, int nkv, float scale, int window,
                                                    float softcap, int trig) {
  constexpr int C = DB_C, PPT = C / DB_NT, KC = HD / 8, VE = HD / 32, CW = C / DB_NW;
  static_assert(PPT >= 1 && C % (4 * DB_NW) == 0, "chunk");
  extern __shared__ float4 sm4[];
  const int G = n_heads / nkv;
  KT *Vs = (KT *)sm4;                /* [C][HD] the chunk's V rows */
  float *Qs = (float *)(Vs + C * HD); /* [G][HD] q, rotated and scaled */
  float *Ps = Qs + G * HD;           /* [G][C] scores, then probabilities */
  float *Kp = Ps + G * C, *Vp = Kp + HD; /* the token's own k and v, as the cache holds them */
  float *Ms = Vp + HD, *Ls = Ms + GM, *Cs = Ls + GM; /* running max, sum; the chunk's correction */
  const int t = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h0 = kvh * G;
  const int64_t row = (int64_t)nkv * HD, koff = (int64_t)kvh * HD;
  const int p = pos[t], sq = seq[t];
  const int lo = window > 0 ? max(0, p - window + 1) : 0;
  const bool fused = rp.k != NULL;

  uint4 kr[PPT][KC]; /* this thread's positions' K rows */
  bool ok[PPT];      /* a mapped position before the token's own */
  /* the chunk at c0: this thread's positions c0 + tid + 128 u; K rows into kr, V rows into Vs (zeros
   * where a slot is unmapped, so that its zero probability does not meet garbage) */
  auto load_chunk = [&](int c0) {
#pragma unroll
    for (int u = 0; u < PPT; u++) {
      const int j = tid + DB_NT * u, i = c0 + j;
      const int64_t sl = i < p ? at_slot(table, max_blocks, bs, nblocks, sq, i) : -1;
      ok[u] = sl >= 0;
      const KT *kp = Kc + (ok[u] ? sl : 0) * row + koff, *vp = Vc + (ok[u] ? sl : 0) * row + koff;
#pragma unroll
      for (int c = 0; c < KC; c++) kr[u][c] = ok[u] ? __ldcg((const uint4 *)kp + c) : make_uint4(0u, 0u, 0u, 0u);
      KT *d = Vs + (size_t)j * HD;
      if (ok[u]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
        for (int c = 0; c < KC; c++)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(d + 8 * c)),
                       "l"(vp + 8 * c)
                       : "memory");
#else
#pragma unroll
        for (int c = 0; c < KC; c++) ((uint4 *)d)[c] = __ldcg((const uint4 *)vp + c);
#endif
      } else if (i < p) {
#pragma unroll
        for (int c = 0; c < KC; c++) ((uint4 *)d)[c] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
  };
  load_chunk(lo);
  if (trig == 0) pdl_trigger();
  pdl_wait();

  /* q (rotated here when fused) and the token's own k / v */
  const int rrow = rp.n_rows > 1 ? (p < rp.pos0 ? 0 : min(p - rp.pos0 + 1, rp.n_rows - 1)) : 0;
  const float *qg = q + ((int64_t)t * n_heads + h0) * HD;
  for (int i = tid; i < G * HD; i += DB_NT) {
    const int d = i % HD;
    float v = __ldca(qg + i);
    if (fused && d < 2 * rp.halfq) v = at_rot(qg + i - d, d, rp.halfq, rp.invq + (int64_t)rrow * rp.halfq, p, rp.msq);
    Qs[i] = v * scale;
  }
  const int64_t osl = at_slot(table, max_blocks, bs, nblocks, sq, p);
  for (int d = tid; d < HD; d += DB_NT) {
    float kv = 0.f, vv = 0.f;
    if (fused) {
      const float *kt = rp.k + ((int64_t)t * nkv + kvh) * HD, *vt = rp.v + ((int64_t)t * nkv + kvh) * HD;
      kv = d < 2 * rp.halfk ? at_rot(kt, d, rp.halfk, rp.invk + (int64_t)rrow * rp.halfk, p, rp.msk) : __ldca(kt + d);
      vv = __ldca(vt + d);
      if (osl >= 0) {
        Kc[osl * row + koff + d] = kv_from_f<KT>(kv);
        Vc[osl * row + koff + d] = kv_from_f<KT>(vv);
      }
    } else if (osl >= 0) { /* stored by the previous kernel */
      kv = kv_to_f(Kc[osl * row + koff + d]);
      vv = kv_to_f(Vc[osl * row + koff + d]);
    }
    Kp[d] = kv_round<KT>(kv);
    Vp[d] = kv_round<KT>(vv);
  }
  if (tid < GM) {
    Ms[tid] = -INFINITY;
    Ls[tid] = 0.f;
  }
  __syncthreads();

  float acc[GM][VE];
#pragma unroll
  for (int g = 0; g < GM; g++)
#pragma unroll
    for (int e = 0; e < VE; e++) acc[g][e] = 0.f;
  for (int c0 = lo; c0 <= p; c0 += C) {
    if (c0 != lo) load_chunk(c0);
    const int jp = p - c0; /* the token's own position in this chunk (< C: the last chunk) */
    if (jp < C)
      for (int d = tid; d < HD; d += DB_NT) Vs[(size_t)jp * HD + d] = kv_from_f<KT>(Vp[d]);
    /* scores */
    float s[PPT][GM];
#pragma unroll
    for (int u = 0; u < PPT; u++)
#pragma unroll
      for (int g = 0; g < GM; g++) s[u][g] = 0.f;
#pragma unroll
    for (int c = 0; c < KC; c++) {
      float k8[PPT][8];
#pragma unroll
      for (int u = 0; u < PPT; u++) {
        if (tid + DB_NT * u == jp) {
#pragma unroll
          for (int e = 0; e < 8; e++) k8[u][e] = Kp[8 * c + e];
        } else
          db_cvt8(kr[u][c], k8[u], KT());
      }
#pragma unroll
      for (int g = 0; g < GM; g++) {
        if (g >= G) break;
        const float4 a = *(const float4 *)(Qs + g * HD + 8 * c), b = *(const float4 *)(Qs + g * HD + 8 * c + 4);
        const float qv[8] = { a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w };
#pragma unroll
        for (int u = 0; u < PPT; u++) {
          float d = s[u][g];
#pragma unroll
          for (int e = 0; e < 8; e++) d = fmaf(qv[e], k8[u][e], d);
          s[u][g] = d;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < PPT; u++) {
      const int j = tid + DB_NT * u;
      const bool valid = ok[u] || (j == jp && osl >= 0);
#pragma unroll
      for (int g = 0; g < GM; g++) {
        if (g >= G) break;
        float v = s[u][g];
        if (softcap > 0.f) v = softcap * tanhf(v / softcap);
        Ps[g * C + j] = valid ? v : -INFINITY;
      }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
    __syncthreads();
    /* the chunk's softmax: a warp a head */
    for (int g = warp; g < G; g += DB_NW) {
      float v[C / 32], mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < C / 32; k++) {
        v[k] = Ps[g * C + lane + 32 * k];
        mx = fmaxf(mx, v[k]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float mo = Ms[g], mn = fmaxf(mo, mx);
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < C / 32; k++) {
        const float e = v[k] == -INFINITY ? 0.f : expf(v[k] - mn);
        Ps[g * C + lane + 32 * k] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      __syncwarp();
      if (lane == 0) {
        const float cr = mo == -INFINITY ? 0.f : expf(mo - mn);
        Cs[g] = cr;
        Ls[g] = Ls[g] * cr + sum;
        Ms[g] = mn;
      }
    }
    __syncthreads();
    /* P.V: this warp's CW positions, lane's VE dims of every head */
#pragma unroll
    for (int g = 0; g < GM; g++) {
      if (g >= G) break;
      const float cr = Cs[g];
#pragma unroll
      for (int e = 0; e < VE; e++) acc[g][e] *= cr;
    }
    const int jn = min(C, p + 1 - c0), j1 = min(CW * (warp + 1), jn);
    for (int j = CW * warp; j < j1; j += 4) {
      float4 pg[GM];
#pragma unroll
      for (int g = 0; g < GM; g++) pg[g] = g < G ? *(const float4 *)(Ps + g * C + j) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int jj = 0; jj < 4; jj++) {
        if (j + jj >= j1) break;
        float vv[VE];
        const KT *vr = Vs + (size_t)(j + jj) * HD + lane * VE;
        if constexpr (VE == 1) vv[0] = kv_to_f(vr[0]);
        else if constexpr (VE == 2) {
          vv[0] = kv_to_f(vr[0]);
          vv[1] = kv_to_f(vr[1]);
        } else {
          const float4 f = kv_h4(*(const uint2 *)vr, KT());
          vv[0] = f.x; vv[1] = f.y; vv[2] = f.z; vv[3] = f.w;
        }
#pragma unroll
        for (int g = 0; g < GM; g++) {
          if (g >= G) break;
          const float pj = jj == 0 ? pg[g].x : jj == 1 ? pg[g].y : jj == 2 ? pg[g].z : pg[g].w;
#pragma unroll
          for (int e = 0; e < VE; e++) acc[g][e] = fmaf(pj, vv[e], acc[g][e]);
        }
      }
    }
    __syncthreads(); /* Ps and Vs are the next chunk's */
  }
  if (trig != 0) pdl_trigger();
  at_prefetch(rp);
  /* the warps' sums (in Vs's place) */
  float *Ws = (float *)sm4; /* [NW][G][HD] */
#pragma unroll
  for (int g = 0; g < GM; g++) {
    if (g >= G) break;
#pragma unroll
    for (int e = 0; e < VE; e++) Ws[(warp * G + g) * HD + lane * VE + e] = acc[g][e];
  }
  __syncthreads();
  for (int i = tid; i < G * HD; i += DB_NT) { /* whole warps: G * HD is a multiple of 32 */
    const int g = i / HD, d = i % HD, h = h0 + g;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < DB_NW; w++) o += Ws[(w * G + g) * HD + d];
    const float L = Ls[g], v = L > 0.f ? o / L : 0.f;
    out[((int64_t)t * n_heads + h) * HD + d] = v;
    if (xq) at_quant_store(v, lane, (((int64_t)t * n_heads + h) * HD + d) >> 5, xq, xs);
    if (rp.x16) rp.x16[qw_half(t, h * HD + d, n_heads * HD, rp.bn)] = qm_h(v);
  }
}

bool cu_attn_decb_ok(int hd, int G, sm_dtype dt) {
  return (dt == SM_DT_F16 || dt == SM_DT_BF16) && (hd == 32 || hd == 64) && G >= 1 && G <= 8;
}

/* its shared memory (bytes) */
static size_t decb_smem(int hd, int G) {
  const int C = DB_C, GM = G <= 4 ? 4 : 8;
  return (size_t)C * hd * 2 + sizeof(float) * ((size_t)G * hd + (size_t)G * C + 2 * (size_t)hd + 3 * (size_t)GM);
}

template <typename KT, int HD, int GM> static void decb_launch(const cu_ctx *cx, const cu_attn_args *x, const at_rope &rp) {
  static size_t done = 0;
  const int G = x->n_heads / x->nkv;
  const size_t smem = decb_smem(HD, G);
  if (smem > 48 * 1024 && smem > done) {
    cudaFuncSetAttribute(k_attn_decb<KT, HD, GM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    done = smem;
  }
  uint8_t *xq = (uint8_t *)x->xq;
  float2 *xs = xq ? (float2 *)(xq + (size_t)x->n_tokens * x->n_heads * HD) : NULL;
  cu_launch(cx, k_attn_decb<KT, HD, GM>, dim3((unsigned)x->n_tokens, (unsigned)x->nkv), dim3(DB_NT), smem, x->out, xq, xs,
            x->q, rp, (KT *)x->K, (KT *)x->V, x->pos, x->seq, x->table, x->max_blocks, x->bs, x->nblocks, x->n_heads,
            x->nkv, x->scale, x->window, x->softcap, cx->t->attn_trig);
}

void cu_attn_decb_run(const cu_ctx *cx, const cu_attn_args *x, const at_rope &rp) {
  const int G = x->n_heads / x->nkv;
#define DB_HD(HD)                                                                  \
  do {                                                                             \
    if (x->dt == SM_DT_F16) {                                                      \
      if (G <= 4) decb_launch<__half, HD, 4>(cx, x, rp);                           \
      else decb_launch<__half, HD, 8>(cx, x, rp);                                  \
    } else {                                                                       \
      if (G <= 4) decb_launch<__nv_bfloat16, HD, 4>(cx, x, rp);                    \
      else decb_launch<__nv_bfloat16, HD, 8>(cx, x, rp);                           \
    }                                                                              \
  } while (0)
  if (x->hd == 32) DB_HD(32);
  else DB_HD(64);
#undef DB_HD
  cu_count(cx, CU_K_ATTN_DECB);
}
