/* Decode attention over a quantized KV cache (q8_0 / q4_0 head rows, src/backend/kv_quant.h): every
 * token of the batch is the only one of its sequence. Written by hand: no library reads this paged,
 * per-head quantized layout, and the float-cache decode kernel (cuda_attn.cu) keeps its rows raw in
 * registers at a 128-register cap that a second layout would not fit.
 *
 * Grid = (token, kv head, split z of the key range); DQ_NW warps a block. A warp takes the split's
 * positions a0 + warp + DQ_NW i; lane l holds the cache slots of 32 of them at a time (one read of the
 * block table per 32 positions) and the 4-value chunks l, l + 32, ... of the head row: it loads the
 * codes and scales of U = 2 positions before using any, widens them in registers, all-reduces their
 * scores across the warp and keeps an online softmax (max, sum, accumulator) for each of the G query
 * heads of the kv head, rescaled once a batch (measured on the H200, 8B shape at 16k positions: U = 2
 * 222 tok/s, U = 4 169, U = 8 186; the tiled kernel 170). The warps merge through shared memory; with S > 1
 * splits the block writes (max, sum, unnormalized output) for k_attn_combine (cuda_attn_prefill.cu),
 * the tiled kernels' format. f32 arithmetic throughout (the values are the cache's exactly). */
#include <math.h>
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_kv.cuh"

#define DQ_NW 8 /* warps a block */

/* NJ: 4-value chunks of the head row a lane (hd <= 128 NJ); GM: most query heads a kv head; U:
 * positions a warp loads at once */
template <typename KT, int NJ, int GM, int U>
__global__ void __launch_bounds__(DQ_NW * 32)
    k_attn_decq(float *__restrict__ out, float *__restrict__ part, const float *__restrict__ q, const KT *__restrict__ Kc,
                const KT *__restrict__ Vc, const int32_t *__restrict__ pos, const int32_t *__restrict__ seq,
                const int32_t *__restrict__ table, int max_blocks, int bs, int nblocks, int n_heads, int nkv, int hd,
                float scale, int window, float softcap, int S) {
  extern __shared__ float4 dq_sm[]; /* [DQ_NW][G][hd / 4] accumulators */
  __shared__ float wm[DQ_NW][GM], wl[DQ_NW][GM];
  const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = n_heads / nkv, hd4 = hd >> 2;
  const int p = pos[t], sq = seq[t];
  const int lo = window > 0 ? max(0, p - window + 1) : 0, len = p - lo + 1, per = (len + S - 1) / S;
  const int a0 = lo + z * per, n = max(0, min(p + 1, a0 + per) - a0);
  const int npos = n > warp ? (n - warp + DQ_NW - 1) / DQ_NW : 0; /* this warp's positions */
  float4 qv[GM][NJ], acc[GM][NJ];
  float m[GM], l[GM];
#pragma unroll
  for (int g = 0; g < GM; g++) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int c = lane + 32 * j;
      qv[g][j] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc[g][j] = qv[g][j];
      if (g < G && c < hd4) {
        const float4 x = *(const float4 *)(q + ((int64_t)t * n_heads + kvh * G + g) * hd + 4 * c);
        qv[g][j] = make_float4(x.x * scale, x.y * scale, x.z * scale, x.w * scale);
      }
    }
  }
  int64_t slot = -1; /* lane l: the slot of this warp's position 32 (i0 / 32) + l */
  for (int i0 = 0; i0 < npos; i0 += U) {
    if ((i0 & 31) == 0) {
      const int i = i0 + lane;
      slot = -1;
      if (i < npos) {
        const int pp = a0 + warp + DQ_NW * i, bi = pp / bs;
        const int blk = bi < max_blocks ? table[(int64_t)sq * max_blocks + bi] : -1;
        if (blk >= 0 && blk < nblocks) slot = (int64_t)blk * bs + pp % bs;
      }
    }
    kv_qraw kr[U][NJ], vr[U][NJ];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t sl = __shfl_sync(0xffffffffu, slot, (i0 + u) & 31);
      ok[u] = i0 + u < npos && sl >= 0;
      const KT *kh = kv_head(Kc, ok[u] ? sl : 0, nkv, kvh, hd), *vh = kv_head(Vc, ok[u] ? sl : 0, nkv, kvh, hd);
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const int c = lane + 32 * j;
        const bool in = ok[u] && c < hd4;
        kr[u][j] = in ? kv_qload(kh, hd, 4 * c) : kv_qraw{ 0u, 0.f };
        vr[u][j] = in ? kv_qload(vh, hd, 4 * c) : kv_qraw{ 0u, 0.f };
      }
    }
    /* the batch's U positions at once: independent score reductions, one rescale a query head */
    float4 kf[U][NJ], vf[U][NJ];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        kf[u][j] = kv_qwiden<KT>(kr[u][j]);
        vf[u][j] = kv_qwiden<KT>(vr[u][j]);
      }
#pragma unroll
    for (int g = 0; g < GM; g++) {
      if (g >= G) break;
      float sc[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        float x = 0.f;
#pragma unroll
        for (int j = 0; j < NJ; j++)
          x = fmaf(qv[g][j].x, kf[u][j].x, fmaf(qv[g][j].y, kf[u][j].y, fmaf(qv[g][j].z, kf[u][j].z, fmaf(qv[g][j].w, kf[u][j].w, x))));
        sc[u] = x;
      }
#pragma unroll
      for (int o = 16; o; o >>= 1)
#pragma unroll
        for (int u = 0; u < U; u++) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
      float bm = -INFINITY;
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (softcap > 0.f) sc[u] = softcap * tanhf(sc[u] / softcap);
        sc[u] = ok[u] ? sc[u] : -INFINITY;
        bm = fmaxf(bm, sc[u]);
      }
      if (bm == -INFINITY) continue; /* no position of the batch (the same for the whole warp) */
      const float mn = fmaxf(m[g], bm), corr = expf(m[g] - mn);
      float ls = 0.f;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        acc[g][j].x *= corr;
        acc[g][j].y *= corr;
        acc[g][j].z *= corr;
        acc[g][j].w *= corr;
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const float pe = ok[u] ? expf(sc[u] - mn) : 0.f;
        ls += pe;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
          acc[g][j].x = fmaf(pe, vf[u][j].x, acc[g][j].x);
          acc[g][j].y = fmaf(pe, vf[u][j].y, acc[g][j].y);
          acc[g][j].z = fmaf(pe, vf[u][j].z, acc[g][j].z);
          acc[g][j].w = fmaf(pe, vf[u][j].w, acc[g][j].w);
        }
      }
      l[g] = l[g] * corr + ls;
      m[g] = mn;
    }
  }
  /* merge the warps */
#pragma unroll
  for (int g = 0; g < GM; g++) {
    if (g >= G) break;
    if (lane == 0) {
      wm[warp][g] = m[g];
      wl[warp][g] = l[g];
    }
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int c = lane + 32 * j;
      if (c < hd4) dq_sm[((size_t)warp * G + g) * hd4 + c] = acc[g][j];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * hd4; idx += DQ_NW * 32) {
    const int g = idx / hd4, c = idx % hd4, h = kvh * G + g;
    float M = -INFINITY;
    for (int w = 0; w < DQ_NW; w++) M = fmaxf(M, wm[w][g]);
    float L = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    if (M != -INFINITY)
      for (int w = 0; w < DQ_NW; w++) {
        if (wm[w][g] == -INFINITY) continue;
        const float f = expf(wm[w][g] - M);
        const float4 a = dq_sm[((size_t)w * G + g) * hd4 + c];
        L += wl[w][g] * f;
        o.x += a.x * f;
        o.y += a.y * f;
        o.z += a.z * f;
        o.w += a.w * f;
      }
    if (S == 1) {
      const float inv = L > 0.f ? 1.f / L : 0.f;
      *(float4 *)(out + ((int64_t)t * n_heads + h) * hd + 4 * c) = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
    } else {
      float *pp = part + (((int64_t)t * n_heads + h) * S + z) * (hd + 2);
      if (c == 0) {
        pp[0] = M;
        pp[1] = L;
      }
      pp[2 + 4 * c] = o.x;
      pp[3 + 4 * c] = o.y;
      pp[4 + 4 * c] = o.z;
      pp[5 + 4 * c] = o.w;
    }
  }
}

/* the instance for a head dim: chunks a lane, most query heads a kv head (registers: GM * NJ <= 8) */
static int dq_nj(int hd) { return hd <= 128 ? 1 : hd <= 256 ? 2 : 4; }

bool cu_attn_decq_ok(int hd, int G, sm_dtype dt) {
  return (dt == SM_DT_Q8_0 || dt == SM_DT_Q4_0) && hd % 4 == 0 && hd <= 512 && G >= 1 && G * dq_nj(hd) <= 8;
}

void cu_attn_decq_run(const cu_ctx *cx, const cu_attn_tiled *a, int S) {
  const int G = a->n_heads / a->nkv;
  const dim3 grid((unsigned)a->n_tokens, (unsigned)a->nkv, (unsigned)S);
  const size_t smem = (size_t)DQ_NW * G * (a->hd / 4) * sizeof(float4);
#define DQ_ARGS a->out, a->part, a->q, (const KT *)a->K, (const KT *)a->V, a->pos, a->seq, a->table, a->max_blocks, a->bs, \
                a->nblocks, a->n_heads, a->nkv, a->hd, a->scale, a->window, a->softcap, S
#define DQ_LAUNCH(KT_)                                                                                              \
  do {                                                                                                              \
    typedef KT_ KT;                                                                                                 \
    switch (dq_nj(a->hd)) {                                                                                         \
    case 1: k_attn_decq<KT, 1, 8, 2><<<grid, DQ_NW * 32, smem, cx->s>>>(DQ_ARGS); break;                             \
    case 2: k_attn_decq<KT, 2, 4, 2><<<grid, DQ_NW * 32, smem, cx->s>>>(DQ_ARGS); break;                             \
    default: k_attn_decq<KT, 4, 2, 2><<<grid, DQ_NW * 32, smem, cx->s>>>(DQ_ARGS); break;                            \
    }                                                                                                               \
  } while (0)
  if (a->dt == SM_DT_Q8_0) DQ_LAUNCH(kv_q8);
  else DQ_LAUNCH(kv_q4);
#undef DQ_LAUNCH
#undef DQ_ARGS
  if (S > 1) cu_attn_combine(cx, a->out, a->part, a->n_tokens * a->n_heads, S, a->hd);
}
