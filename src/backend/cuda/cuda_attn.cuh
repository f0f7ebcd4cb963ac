/* Attention kernels: decode (one token per sequence, flash-decoding with the splits of a (token,
 * kv head) combined in a thread-block cluster: cuda_attn.cu) and tiled prefill / mixed batches
 * (cuda_attn_prefill.cu). */
#ifndef SM_CUDA_ATTN_CUH
#define SM_CUDA_ATTN_CUH
#include "backend/cuda/cuda_common.cuh"

/* one decode-attention launch: every token alone in its sequence; grid (token, kv head, S) */
struct cu_attn_args {
  float *out;
  void *xq;        /* may be NULL (hd % 32 == 0): also the int8 layout of out (cu_q4_scratch_bytes) */
  float *part;     /* n_tokens * n_heads * S * (hd + 2) floats when S > 1 */
  int *cnt;        /* n_tokens * nkv * cu_attn_dec_hsplit ints, zero (left zero) */
  const float *q;
  /* kraw != NULL: rope + kv_store fused in: q, kraw, vraw are the projections before rotation (rotated
   * with invq / halfq, invk / halfk) and the new k, v are written into K, V here */
  const float *kraw, *vraw, *invq, *invk;
  int halfq, halfk;
  /* rope_ext fused in (rope_rows >= 1; 0: plain RoPE): rows of invq / invk by position (sm_rope_ext's
   * n_rows / pos0) and the rotated dims' multipliers msq / msk */
  int rope_rows, rope_pos0;
  float msq, msk;
  void *K, *V; /* the cache: elements of dt */
  sm_dtype dt;
  const int32_t *pos, *seq, *table;
  int max_blocks, bs, nblocks;
  int n_tokens, n_heads, nkv, hd;
  float scale;
  int window;
  float softcap;
  int S;               /* splits (cu_attn_dec_splits) */
  bool global_combine; /* combine the splits through global memory, not a cluster (long contexts) */
  const void *pf[2];   /* regions of a later kernel's weights to prefetch into L2 once K/V are read */
  size_t pfn[2];       /* (bytes, 16-byte aligned; NULL / 0: none) */
  void *x16;           /* may be NULL: also out as the wgmma kernel's f16 x for tiles of x16_bn tokens */
  int x16_bn;          /* (n_heads * hd a multiple of QM_BK; cuda_qmma_dev.cuh qw_half) */
  const float *sinks;  /* may be NULL: attention sinks, a logit per query head (gpt-oss; k_attn_dec2 only) */
};

bool cu_attn_dec_ok(int hd, int G, sm_dtype dt);
/* splits of every decode-attention launch in batch-invariant mode (backend.h; SMELT_CUDA_ATTN_S overrides) */
#define CU_ATTN_INV_SPLITS 8
int cu_attn_dec_splits(const cu_tune *t, int n_tokens, int nkv, int n_sm);
/* 2 where the decode kernel splits a KV head's query heads over two blocks (its launch then has
 * twice the KV heads: splits, smem and counters are counted for nkv * this), else 1 */
int cu_attn_dec_hsplit(const cu_tune *t, int hd, int G);
int cu_attn_dec_warps(const cu_tune *t, int hd, int G, sm_dtype dt);
size_t cu_attn_dec_smem(const cu_tune *t, int hd, int G, int S, sm_dtype dt);
void cu_attn_decode(const cu_ctx *cx, const cu_attn_args *a);
/* the kernel cu_attn_decode takes for a one-split launch (many sequences; cuda_attn_decb.cu) where the
 * tuning's attn_b is on: a 16-bit cache, hd 32 or 64, G <= 8 */
bool cu_attn_decb_ok(int hd, int G, sm_dtype dt);
void cu_attn_set_trace(unsigned long long *buf);

/* tiled attention (prefill, mixed batches): tiles of <= CU_ATT_TQ consecutive tokens of one sequence */
#define CU_ATT_TQ 16
struct cu_attn_tiled {
  float *out;
  float *part; /* n_tokens * n_heads * S * (hd + 2) floats when S > 1 (cu_attn_tiled_splits) */
  const float *q;
  const void *K, *V; /* the cache: elements of dt */
  sm_dtype dt;
  const int32_t *pos, *seq, *table, *tiles;
  int n_tiles, n_tokens, max_blocks, bs, nblocks;
  int n_heads, nkv, hd;
  float scale;
  int window;
  float softcap;
  const int32_t *span; /* NULL, or per token [lo, hi] widening its key range (sm_batch.attn_span) */
  bool inv;            /* batch-invariant mode: one split, the CUDA-core kernel for every batch */
  const float *sinks;  /* NULL, or attention sinks: a logit per query head (gpt-oss; not the decq kernel) */
};
int cu_attn_tiled_splits(int n_tiles, int nkv, int n_sm);
/* false when the shape does not fit (shared memory, warps) */
bool cu_attn_tiled_ok(int hd, int G, sm_dtype dt, size_t smem_optin);
void cu_attn_tiled_run(const cu_ctx *cx, const cu_attn_tiled *a, size_t smem_optin);
void cu_attn_tiled_init(size_t smem_optin); /* per device, at backend creation */
/* the partials of S splits ([rows][S][hd + 2]: max, sum, unnormalized output) into out [rows][hd]; with
 * sinks (rows token-major over n_heads) exp(sink - max) joins each row's denominator */
void cu_attn_combine(const cu_ctx *cx, float *out, const float *part, int rows, int S, int hd,
                     const float *sinks = NULL, int n_heads = 1);
/* decode over a quantized (q8_0 / q4_0) cache, every token alone in its sequence (cuda_attn_decq.cu):
 * the fields of a as for the tiled kernels (tiles unused), S splits (part holds them when S > 1) */
bool cu_attn_decq_ok(int hd, int G, sm_dtype dt);
void cu_attn_decq_run(const cu_ctx *cx, const cu_attn_tiled *a, int S);
/* the tensor-core flash-attention kernel (cuda_attn_flash.cu) for the same tiles; cu_attn_tiled_run
 * takes it where cu_attn_flash_ok */
bool cu_attn_flash_ok(const cu_ctx *cx, int hd, sm_dtype dt, size_t smem_optin);
void cu_attn_flash_init(size_t smem_optin);
void cu_attn_flash_run(const cu_ctx *cx, const cu_attn_tiled *a, int S);
/* the vision encoders' segmented attention on tensor cores (cuda_attn_seg.cu): q [n][nh * hd], k and
 * v [n][nkv * hd] (f32, 16-byte aligned), lohi [n][2] each token's key range [lo, hi) with segments
 * ascending; scratch holds cu_attseg_fa_scratch bytes */
bool cu_attseg_fa_ok(const cu_ctx *cx, int hd, size_t smem_optin);
size_t cu_attseg_fa_scratch(int n, int nh, int nkv, int hd);
void cu_attseg_fa_init(size_t smem_optin);
void cu_attseg_fa_run(const cu_ctx *cx, void *scratch, float *out, const float *q, const float *k, const float *v,
                      const int32_t *lohi, int n, int nh, int nkv, int hd, float scale);

#endif
