/* The CUDA backend's multi-head latent attention (backend.h attention_mla): its recording (OP_ATTN_MLA, run
 * unfused) and its kernels. The batch's latent rows [c | kpe] are stored into the paged cache (one block a
 * token), then one warp a (token, head) runs an online softmax over the positions the token attends to,
 * with the query's dc + dr dims spread over the lanes; the four warps of a block are four heads of one token,
 * so each cached row is read from memory once a block. Written for correctness (no tiling, no split over the
 * positions): the reference for faster kernels. kv_lora_rank up to 512 and qk_rope_head_dim up to 64 (the
 * published models' 512 and 64). */
#include <math.h>
#include <string.h>
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_mla.cuh"

#define MLA_C 16 /* dc / 32 */
#define MLA_R 2  /* dr / 32 */

template <typename KT>
__global__ void k_mla_store(KT *K, const float *c, const float *kpe, const int32_t *pos, const int32_t *seq,
                            const int32_t *table, int max_blocks, int bs, int nblocks, int dc, int dr) {
  const int t = blockIdx.x, D = dc + dr;
  const int32_t p = pos[t], blk = table[(int64_t)seq[t] * max_blocks + p / bs];
  if (blk < 0 || blk >= nblocks) return;
  KT *row = K + ((int64_t)blk * bs + p % bs) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    row[d] = kv_from_f<KT>(d < dc ? c[(int64_t)t * dc + d] : kpe[(int64_t)t * dr + d - dc]);
}

template <typename KT>
__global__ void k_mla_attn(float *out, const float *ql, const float *qpe, const KT *K, const int32_t *pos,
                           const int32_t *seq, const int32_t *table, int max_blocks, int bs, int nblocks, int n_tokens,
                           int nh, int dc, int dr, float scale) {
  const int hpb = (nh + 3) / 4; /* blocks a token */
  const int t = blockIdx.x / hpb, h = (blockIdx.x % hpb) * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (t >= n_tokens || h >= nh) return;
  const int D = dc + dr, p1 = pos[t], sq = seq[t];
  float qc[MLA_C], qr[MLA_R], acc[MLA_C];
#pragma unroll
  for (int i = 0; i < MLA_C; i++) {
    const int d = lane + 32 * i;
    qc[i] = d < dc ? ql[((int64_t)t * nh + h) * dc + d] : 0.f;
    acc[i] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < MLA_R; i++) {
    const int d = lane + 32 * i;
    qr[i] = d < dr ? qpe[((int64_t)t * nh + h) * dr + d] : 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int p = 0; p <= p1; p++) {
    const int32_t blk = table[(int64_t)sq * max_blocks + p / bs];
    if (blk < 0 || blk >= nblocks) continue;
    const KT *row = K + ((int64_t)blk * bs + p % bs) * D;
    float cv[MLA_C], s = 0.f;
#pragma unroll
    for (int i = 0; i < MLA_C; i++) {
      const int d = lane + 32 * i;
      cv[i] = d < dc ? kv_to_f(row[d]) : 0.f;
      s += qc[i] * cv[i];
    }
#pragma unroll
    for (int i = 0; i < MLA_R; i++) {
      const int d = lane + 32 * i;
      if (d < dr) s += qr[i] * kv_to_f(row[dc + d]);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    s *= scale;
    if (s > m) {
      const float f = expf(m - s);
      l *= f;
#pragma unroll
      for (int i = 0; i < MLA_C; i++) acc[i] *= f;
      m = s;
    }
    const float e = expf(s - m);
    l += e;
#pragma unroll
    for (int i = 0; i < MLA_C; i++) acc[i] += e * cv[i];
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int i = 0; i < MLA_C; i++) {
    const int d = lane + 32 * i;
    if (d < dc) out[((int64_t)t * nh + h) * dc + d] = acc[i] * inv;
  }
}

void cu_mla_exec(cuda_be *c, const cu_op *o) {
  const int nt = c->n_tokens;
  if (nt <= 0) return;
  cudaStream_t s = c->s;
  const int dc = o->mla.dc, dr = o->mla.dr;
  const unsigned blocks = (unsigned)(nt * ((o->mla.nh + 3) / 4));
  CU_KV_DISPATCH((sm_dtype)o->mla.dt, {
    k_mla_store<KT><<<nt, 128, 0, s>>>((KT *)o->mla.K, o->mla.c, o->mla.kpe, c->d_pos, c->d_seq, c->d_table,
                                        c->max_blocks, o->mla.bs, o->mla.nblocks, dc, dr);
    k_mla_attn<KT><<<blocks, 128, 0, s>>>(o->mla.out, o->mla.ql, o->mla.qpe, (const KT *)o->mla.K, c->d_pos, c->d_seq,
                                          c->d_table, c->max_blocks, o->mla.bs, o->mla.nblocks, nt, o->mla.nh, dc, dr,
                                          o->mla.scale);
  });
}

static void be_attention_mla(sm_backend *be, float *out, const float *q_lat, const float *q_pe, const float *cl,
                             const float *kpe, const sm_kv_cache *kv, int layer, int n_heads, int dr, float scale) {
  cuda_be *c = CB(be);
  if (c->n_tokens <= 0) return;
  const int dc = kv ? kv->head_dim - dr : 0;
  if (!kv || layer < 0 || layer >= kv->n_layers || !kv->k[layer] || kv->n_kv_heads != 1 || n_heads <= 0 || dr <= 0 ||
      dr > 32 * MLA_R || dc <= 0 || dc > 32 * MLA_C || kv->block_size <= 0 ||
      (kv->dtype != SM_DT_F32 && kv->dtype != SM_DT_F16 && kv->dtype != SM_DT_BF16)) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: attention_mla: shape or cache type not supported (kv_lora_rank <= %d, "
           "qk_rope_head_dim <= %d, f32 / f16 / bf16 caches)", 32 * MLA_C, 32 * MLA_R);
    if (dc > 0) cudaMemsetAsync(out, 0, sizeof(float) * (size_t)c->n_tokens * n_heads * dc, c->s);
    return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_ATTN_MLA;
  o.mla.out = out; o.mla.ql = q_lat; o.mla.qpe = q_pe; o.mla.c = cl; o.mla.kpe = kpe; o.mla.K = kv->k[layer];
  o.mla.nh = n_heads; o.mla.dc = dc; o.mla.dr = dr; o.mla.bs = kv->block_size; o.mla.nblocks = kv->n_blocks;
  o.mla.dt = (int)kv->dtype; o.mla.scale = scale;
  cu_submit(c, &o);
}

void cu_mla_install(sm_backend *b) { b->attention_mla = be_attention_mla; }
