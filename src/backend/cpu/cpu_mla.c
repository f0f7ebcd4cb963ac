/* CPU backend: multi-head latent attention (backend.h attention_mla). The cache of an MLA layer holds one
 * row a position, the latent c then the rotated key part; every query head attends to the same rows, so
 * one work item is a token with all its heads: each cached row is widened once per chunk and read by every
 * head. Chunks of positions start at multiples of MLA_CHUNK whatever the batch, so a token's result does
 * not depend on the tokens it is batched with. */
#include "backend/cpu/cpu_be.h"
#include "backend/kv_quant.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MLA_CHUNK 32

/* the cache slot of position pos of sequence s, or -1 where the block table does not map it */
static int64_t slot_of(const cpu_be *c, const sm_kv_cache *kv, int s, int32_t pos) {
  if (kv->block_size <= 0) return -1;
  const int64_t bi = pos / kv->block_size;
  if (bi >= c->b.max_blocks) return -1;
  const int32_t blk = c->b.block_table[(size_t)s * (size_t)c->b.max_blocks + (size_t)bi];
  if (blk < 0 || blk >= kv->n_blocks) return -1;
  return (int64_t)blk * kv->block_size + pos % kv->block_size;
}

typedef struct {
  cpu_be *c;
  float *out;
  const float *ql, *qpe;
  const sm_kv_cache *kv;
  int layer, nh, dc, dr;
  float scale;
} mla_ctx;

static void mla_range(void *vctx, size_t i0, size_t i1) {
  const mla_ctx *a = vctx;
  const cpu_be *c = a->c;
  const sm_cpu_kern *k = c->k;
  const sm_kv_cache *kv = a->kv;
  const int D = kv->head_dim, dc = a->dc, dr = a->dr, nh = a->nh;
  const size_t rb = sm_kv_head_bytes(kv->dtype, D);
  const char *K = kv->k[a->layer];
  const bool wide = kv->dtype != SM_DT_F32;
  float *kw = wide ? sm_xmalloc(sizeof(float) * MLA_CHUNK * (size_t)D) : NULL;
  float *S = sm_xmalloc(sizeof(float) * MLA_CHUNK), *m = sm_xmalloc(sizeof(float) * 2 * (size_t)nh), *l = m + nh;
  const float *rows[MLA_CHUNK];
  for (size_t t = i0; t < i1; t++) {
    const int32_t pos = c->b.pos[t];
    const int sq = c->b.seq[t];
    float *out = a->out + t * (size_t)nh * (size_t)dc;
    memset(out, 0, sizeof(float) * (size_t)nh * (size_t)dc);
    for (int h = 0; h < nh; h++) {
      m[h] = -INFINITY;
      l[h] = 0.f;
    }
    for (int32_t p0 = 0; p0 <= pos; p0 += MLA_CHUNK) {
      const int np = pos - p0 + 1 < MLA_CHUNK ? pos - p0 + 1 : MLA_CHUNK;
      int nv = 0;
      for (int j = 0; j < np; j++) {
        const int64_t s = slot_of(c, kv, sq, p0 + j);
        if (s < 0) continue;
        const char *src = K + (size_t)s * rb;
        if (wide) {
          k->widen(kw + (size_t)nv * D, src, kv->dtype, (size_t)D);
          rows[nv] = kw + (size_t)nv * D;
        } else {
          rows[nv] = (const float *)src;
        }
        nv++;
      }
      if (!nv) continue;
      for (int h = 0; h < nh; h++) {
        const float *ql = a->ql + (t * (size_t)nh + (size_t)h) * (size_t)dc;
        const float *qp = a->qpe + (t * (size_t)nh + (size_t)h) * (size_t)dr;
        float *acc = out + (size_t)h * dc, cm = -INFINITY;
        for (int j = 0; j < nv; j++) {
          S[j] = a->scale * (k->dot(ql, rows[j], dc) + k->dot(qp, rows[j] + dc, dr));
          if (S[j] > cm) cm = S[j];
        }
        if (cm > m[h]) {
          const float f = m[h] == -INFINITY ? 0.f : expf(m[h] - cm);
          if (f != 1.f) k->scal(acc, f, dc);
          l[h] *= f;
          m[h] = cm;
        }
        for (int j = 0; j < nv; j++) {
          const float e = expf(S[j] - m[h]);
          l[h] += e;
          k->axpy(acc, e, rows[j], dc);
        }
      }
    }
    for (int h = 0; h < nh; h++) k->scal(out + (size_t)h * dc, l[h] > 0.f ? 1.f / l[h] : 0.f, dc);
  }
  free(kw);
  free(S);
  free(m);
}

void sm_cpu_attention_mla(sm_backend *be, float *out, const float *q_lat, const float *q_pe, const float *cl,
                          const float *kpe, const sm_kv_cache *kv, int layer, int n_heads, int dr, float scale) {
  cpu_be *c = CB(be);
  const int nt = c->b.n_tokens;
  if (nt <= 0) return;
  const int dc = kv ? kv->head_dim - dr : 0;
  if (!kv || layer < 0 || layer >= kv->n_layers || !kv->k[layer] || kv->n_kv_heads != 1 || n_heads <= 0 || dr <= 0 ||
      dc <= 0 || sm_kv_quantized(kv->dtype)) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cpu: attention_mla: cache shape or type not supported");
    if (dc > 0 && n_heads > 0) memset(out, 0, sizeof(float) * (size_t)nt * (size_t)n_heads * (size_t)dc);
    return;
  }
  /* the batch's rows: [c | kpe] */
  const int D = kv->head_dim;
  const size_t rb = sm_kv_head_bytes(kv->dtype, D), es = sm_dtype_size(kv->dtype);
  char *K = kv->k[layer];
  for (int t = 0; t < nt; t++) {
    const int64_t s = slot_of(c, kv, c->b.seq[t], c->b.pos[t]);
    if (s < 0) continue;
    sm_cpu_kv_narrow(c->k, K + (size_t)s * rb, kv->dtype, cl + (size_t)t * dc, (size_t)dc);
    sm_cpu_kv_narrow(c->k, K + (size_t)s * rb + (size_t)dc * es, kv->dtype, kpe + (size_t)t * dr, (size_t)dr);
  }
  mla_ctx a = {c, out, q_lat, q_pe, kv, layer, n_heads, dc, dr, scale};
  const size_t cost = (size_t)n_heads * (size_t)D * 2 * (size_t)(c->b.pos[nt - 1] + 1);
  sm_cpu_pfor(c, (size_t)nt, cost, mla_range, &a);
}
