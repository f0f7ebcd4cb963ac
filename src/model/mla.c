/* Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash; recipe mla, config.h sm_mla_config):
 * its tensors as mlx-lm writes them, and the attention of one layer in the absorbed form, whose KV cache is
 * the compressed latent. With H heads, dn = qk_nope_head_dim, dr = qk_rope_head_dim, dc = kv_lora_rank and
 * dv = v_head_dim:
 *
 *   q       = q_b(rmsnorm(q_a(x)))  (or q_proj(x))       [H][dn | dr]    matmul Q (row views: q_nope, q_pe)
 *   c, kpe  = kv_a_proj_with_mqa(x)                       [dc | dr]       matmul K (row views)
 *   c       = rmsnorm(c); q_pe, kpe rotated (dr dims)                     rmsnorm, rope (or rope_ext)
 *   q_lat_h = W_UK_h q_nope_h                             [H][dc]         matmul_experts MLA_UK (a head an expert)
 *   lat_h   = softmax_j(scale (q_lat_h . c_j + q_pe_h . kpe_j)) c_j      attention_mla (caches [c | kpe])
 *   o_h     = W_UV_h lat_h                                [H][dv]         matmul_experts MLA_UV
 *   out     = o_proj(o)                                                   matmul O
 *
 * which is the reference's softmax(q_nope . k_nope + q_pe . k_pe) v with k_nope_h = W_UK_h^T c and
 * v_h = W_UV_h c (mlx-lm computes it this way for one token; the same algebra at any length). The cache holds
 * one row of dc + dr values a position (the layer's V buffer is its K buffer).
 *
 * Checkpoints: W_UK and W_UV are mlx-lm's per-head embed_q [H][dc][dn] and unembed_out [H][dv][dc] (what its
 * sanitize writes since it split them), or, in older conversions, kv_b_proj [H * (dn + dv)][dc] as in the
 * Hugging Face checkpoint: its value rows are gathered into unembed_out's layout, and its key rows, which
 * embed_q has transposed, are transposed at load into a [H][dc][dn] matrix of the checkpoint's dtype, or of
 * float32 where it is quantized (its dequantized values, exactly: mlx-lm quantizes the transposed rows again
 * instead): 4 * H * dc * dn bytes a layer, 32 MiB for DeepSeek-V3's, against 8 MiB in 4 bits. RoPE
 * rotates interleaved pairs (mlx-lm traditional=True, transformers rope_interleave): q_pe and kpe rows are
 * permuted at load into the rotate-half order of the backends' rope. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/kv_quant.h"
#include "model/model.h"
#include "model/tp.h"

typedef struct sm_mla_layer {
  sm_weight q_a, q_full, kv_full;      /* q_a (data NULL without q_lora_rank); the permuted q_b / q_proj and kv_a */
  sm_weight q_nope, q_pe, kv_c, kv_pe; /* row views of q_full and kv_full */
  sm_weight uk, uv;                    /* stacked per head: [H][dc][dn], [H][dv][dc] */
  sm_weight o;
  float *q_a_norm, *kv_norm;
  float *q_a_bias, *kv_bias, *o_bias; /* attention_bias (kv_bias: [dc | dr] permuted alike) */
} sm_mla_layer;

typedef struct sm_mla_scratch {
  int tokens;
  float *qa, *qn, *qpe, *ql, *c, *kpe, *lat, *vo;
  int32_t *ids; /* [tokens][H]: head h of every token (the "expert" of matmul_experts) */
} sm_mla_scratch;

static float norm_eps(const smelt_model *m) {
  const float e = m->fam->recipe->mla_norm_eps;
  return e > 0 ? e : m->cfg.rms_norm_eps;
}

smelt_status sm_mla_check(smelt_model *m) {
  if (!m->fam->recipe->mla) return SMELT_OK;
  const sm_mla_config *a = &m->cfg.mla;
  if (a->kv_rank <= 0)
    return sm_err(SMELT_ERR_FORMAT, "family %s: multi-head latent attention without its config", m->fam->model_type);
  if (!m->be->attention_mla || !m->be->matmul_experts)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: the %s backend has no multi-head latent attention (needed by %s)", m->dir,
                  m->be->name, m->fam->model_type);
  if (m->kv_dtype != SM_DT_F16 && m->kv_dtype != SM_DT_BF16 && m->kv_dtype != SM_DT_F32)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s: KV cache type %s is not supported with multi-head latent attention (f16, bf16, f32)", m->dir,
                  smelt_kv_type_name(sm_kv_type_of(m->kv_dtype)));
  return SMELT_OK;
}

/* rotate-half order of dr interleaved dims: dim i < dr/2 is pair i's first element (2i), dr/2 + i its second */
static int64_t deint(int64_t d, int dr) { return d < dr / 2 ? 2 * d : 2 * (d - dr / 2) + 1; }

/* W_UK from kv_b_proj's key rows: [H][dc][dn] with element [h][r][j] = kv_b[h * (dn + dv) + j][r], in the
 * checkpoint's dtype, or float32 (exactly the dequantized values) where it is quantized */
static smelt_status transpose_uk(smelt_model *m, const sm_weight *kvb, sm_weight *uk) {
  const sm_mla_config *a = &m->cfg.mla;
  const int64_t H = m->cfg.num_attention_heads, dn = a->nope_dim, dv = a->v_dim, dc = a->kv_rank;
  const sm_dtype dt = kvb->bits ? SM_DT_F32 : kvb->dtype;
  const size_t es = sm_dtype_size(dt);
  uint8_t *d = sm_model_host_own(m, sm_xmalloc(es * (size_t)(H * dc * dn)));
  float *row = sm_xmalloc(sizeof(float) * (size_t)dc);
  for (int64_t h = 0; h < H; h++)
    for (int64_t j = 0; j < dn; j++) {
      sm_weight_row_f32(kvb, h * (dn + dv) + j, row);
      for (int64_t r = 0; r < dc; r++) {
        const size_t at = (size_t)((h * dc + r) * dn + j);
        if (dt == SM_DT_F32) memcpy(d + at * 4, &row[r], 4);
        else {
          const uint16_t v = dt == SM_DT_BF16 ? sm_f32_to_bf16(row[r]) : sm_f32_to_f16(row[r]);
          memcpy(d + at * 2, &v, 2);
        }
      }
    }
  free(row);
  memset(uk, 0, sizeof *uk);
  uk->rows = H * dc;
  uk->cols = dn;
  uk->dtype = dt;
  uk->data = d;
  return SMELT_OK;
}

smelt_status sm_mla_load_layer(smelt_model *m, sm_load_ctx *ts, int l, const char *p) {
  const sm_config *c = &m->cfg;
  const sm_mla_config *a = &c->mla;
  const int64_t H = c->num_attention_heads, hid = c->hidden_size, dn = a->nope_dim, dr = a->rope_dim, dc = a->kv_rank,
                dv = a->v_dim, qh = dn + dr;
  sm_mla_layer *M = sm_xcalloc(1, sizeof *M);
  m->layers[l].mla = M;
  char n[384];
  smelt_status st;
  const bool bias = c->attention_bias;
  /* queries */
  const int64_t q_in = a->q_rank > 0 ? a->q_rank : hid;
  if (a->q_rank > 0) {
    snprintf(n, sizeof n, "%s.self_attn.q_a_proj", p);
    if ((st = sm_load_linear(m, ts, n, 0, a->q_rank, hid, &M->q_a, false))) return st;
    if (bias) {
      snprintf(n, sizeof n, "%s.self_attn.q_a_proj.bias", p);
      if ((st = sm_load_vec(m, ts, n, 0, a->q_rank, &M->q_a_bias, false, NULL))) return st;
    }
    snprintf(n, sizeof n, "%s.self_attn.q_a_layernorm.weight", p);
    if ((st = sm_load_vec(m, ts, n, 0, a->q_rank, &M->q_a_norm, false, NULL))) return st;
    snprintf(n, sizeof n, "%s.self_attn.q_b_proj", p);
  } else {
    snprintf(n, sizeof n, "%s.self_attn.q_proj", p);
  }
  if ((st = sm_load_linear(m, ts, n, 0, H * qh, q_in, &M->q_full, false))) return st;
  /* rows: every head's nope dims, then every head's rope dims (rotate-half order) */
  int64_t *perm = sm_xmalloc(sizeof(int64_t) * (size_t)(H * (qh + dv + dn) + dc + dr));
  for (int64_t i = 0; i < H * qh; i++)
    perm[i] = i < H * dn ? (i / dn) * qh + i % dn : ((i - H * dn) / dr) * qh + dn + deint((i - H * dn) % dr, (int)dr);
  sm_load_gather_rows(m, &M->q_full, perm, H * qh);
  M->q_nope = sm_weight_rows(&M->q_full, 0, H * dn);
  M->q_pe = sm_weight_rows(&M->q_full, H * dn, H * dr);
  /* the compressed KV and the shared rotated key */
  snprintf(n, sizeof n, "%s.self_attn.kv_a_proj_with_mqa", p);
  if ((st = sm_load_linear(m, ts, n, 0, dc + dr, hid, &M->kv_full, false))) goto out;
  for (int64_t i = 0; i < dc + dr; i++) perm[i] = i < dc ? i : dc + deint(i - dc, (int)dr);
  sm_load_gather_rows(m, &M->kv_full, perm, dc + dr);
  M->kv_c = sm_weight_rows(&M->kv_full, 0, dc);
  M->kv_pe = sm_weight_rows(&M->kv_full, dc, dr);
  if (bias) {
    snprintf(n, sizeof n, "%s.self_attn.kv_a_proj_with_mqa.bias", p);
    if ((st = sm_load_vec(m, ts, n, 0, dc + dr, &M->kv_bias, false, perm))) goto out;
  }
  snprintf(n, sizeof n, "%s.self_attn.kv_a_layernorm.weight", p);
  if ((st = sm_load_vec(m, ts, n, 0, dc, &M->kv_norm, false, NULL))) goto out;
  /* the per-head up-projections: embed_q / unembed_out, or kv_b_proj */
  snprintf(n, sizeof n, "%s.self_attn.embed_q.weight", p);
  if (sm_st_find(m->st, n)) {
    snprintf(n, sizeof n, "%s.self_attn.embed_q", p);
    if ((st = sm_load_linear(m, ts, n, H, dc, dn, &M->uk, false))) goto out;
    snprintf(n, sizeof n, "%s.self_attn.unembed_out", p);
    if ((st = sm_load_linear(m, ts, n, H, dv, dc, &M->uv, false))) goto out;
  } else {
    sm_weight kvb;
    snprintf(n, sizeof n, "%s.self_attn.kv_b_proj.weight", p);
    if (!sm_st_find(m->st, n)) {
      st = sm_err(SMELT_ERR_FORMAT, "missing tensor %s.self_attn.embed_q.weight (or kv_b_proj.weight)", p);
      goto out;
    }
    snprintf(n, sizeof n, "%s.self_attn.kv_b_proj", p);
    if ((st = sm_load_linear(m, ts, n, 0, H * (dn + dv), dc, &kvb, false))) goto out;
    if ((st = transpose_uk(m, &kvb, &M->uk))) goto out;
    for (int64_t i = 0; i < H * dv; i++) perm[i] = (i / dv) * (dn + dv) + dn + i % dv;
    M->uv = kvb;
    sm_load_gather_rows(m, &M->uv, perm, H * dv);
  }
  M->uk.stacked = M->uv.stacked = true;
  snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
  if ((st = sm_load_linear(m, ts, n, 0, hid, H * dv, &M->o, false))) goto out;
  if (bias) {
    snprintf(n, sizeof n, "%s.self_attn.o_proj.bias", p);
    if ((st = sm_load_vec(m, ts, n, 0, hid, &M->o_bias, false, NULL))) goto out;
  }
  st = SMELT_OK;
out:
  free(perm);
  return st;
}

/* Tensor parallelism (tp_shard.c): rank r of n keeps its heads' rows of q_b (nope and rope parts), W_UK and
 * W_UV, and their columns of o_proj; q_a, kv_a and their norms stay whole, so every rank keeps the whole
 * latent cache (one KV head, replicated like the KV heads of a model with fewer than the ranks) */
smelt_status sm_mla_split(smelt_model *m, int l, int r, int n) {
  sm_mla_layer *M = m->layers[l].mla;
  const sm_mla_config *a = &m->cfg.mla;
  const int64_t Hl = m->cfg.num_attention_heads / n, dn = a->nope_dim, dr = a->rope_dim, dc = a->kv_rank, dv = a->v_dim;
  M->q_nope = sm_weight_rows(&M->q_nope, r * Hl * dn, Hl * dn);
  M->q_pe = sm_weight_rows(&M->q_pe, r * Hl * dr, Hl * dr);
  M->uk = sm_weight_rows(&M->uk, r * Hl * dc, Hl * dc);
  M->uv = sm_weight_rows(&M->uv, r * Hl * dv, Hl * dv);
  M->uk.stacked = M->uv.stacked = true;
  return sm_tp_cols(m, &M->o, r * Hl * dv, Hl * dv, "o_proj", l); /* its bias: after the sum */
}

static sm_weight *layer_weights(sm_mla_layer *M, int i) {
  sm_weight *w[] = {&M->q_a, &M->q_nope, &M->q_pe, &M->kv_c, &M->kv_pe, &M->uk, &M->uv, &M->o};
  return i < (int)SM_ARRAY_LEN(w) ? w[i] : NULL;
}

smelt_status sm_mla_prepare(smelt_model *m) {
  for (int l = 0; m->layers && l < m->cfg.num_hidden_layers; l++) {
    sm_mla_layer *M = m->layers[l].mla;
    for (int i = 0; M && layer_weights(M, i); i++) {
      sm_weight *w = layer_weights(M, i);
      smelt_status st;
      if (w->data && (st = m->be->prepare_weight(m->be, w))) return st;
    }
  }
  return SMELT_OK;
}

static void free_scratch(smelt_model *m) {
  sm_mla_scratch *s = m->mla_scr;
  if (!s) return;
  float *b[] = {s->qa, s->qn, s->qpe, s->ql, s->c, s->kpe, s->lat, s->vo};
  for (size_t i = 0; i < SM_ARRAY_LEN(b); i++)
    if (b[i]) m->be->free(m->be, b[i]);
  if (s->ids) m->be->free(m->be, s->ids);
  free(s);
  m->mla_scr = NULL;
}

void sm_mla_release(smelt_model *m) {
  free_scratch(m);
  for (int l = 0; m->layers && l < m->cfg.num_hidden_layers; l++) {
    sm_mla_layer *M = m->layers[l].mla;
    for (int i = 0; M && layer_weights(M, i); i++)
      if (layer_weights(M, i)->dev) m->be->release_weight(m->be, layer_weights(M, i));
    free(M);
    m->layers[l].mla = NULL;
  }
}

smelt_status sm_mla_reserve(smelt_model *m, int n_tokens) {
  if (!m->fam->recipe->mla) return SMELT_OK;
  if (m->mla_scr && m->mla_scr->tokens >= n_tokens) return SMELT_OK;
  free_scratch(m);
  const sm_mla_config *a = &m->cfg.mla;
  const size_t n = (size_t)n_tokens, H = (size_t)m->cfg.num_attention_heads;
  sm_mla_scratch *s = m->mla_scr = sm_xcalloc(1, sizeof *s);
  const size_t fl[] = {n * (size_t)(a->q_rank > 0 ? a->q_rank : 1),
                       n * H * (size_t)a->nope_dim,
                       n * H * (size_t)a->rope_dim,
                       n * H * (size_t)a->kv_rank,
                       n * (size_t)a->kv_rank,
                       n * (size_t)a->rope_dim,
                       n * H * (size_t)a->kv_rank,
                       n * H * (size_t)a->v_dim};
  float **b[] = {&s->qa, &s->qn, &s->qpe, &s->ql, &s->c, &s->kpe, &s->lat, &s->vo};
  for (size_t i = 0; i < SM_ARRAY_LEN(b); i++)
    if (!(*b[i] = m->be->alloc(m->be, sizeof(float) * fl[i]))) {
      free_scratch(m);
      return sm_err(SMELT_ERR_OOM, "out of backend memory for attention activations");
    }
  s->ids = m->be->alloc(m->be, sizeof(int32_t) * n * H);
  if (!s->ids) {
    free_scratch(m);
    return sm_err(SMELT_ERR_OOM, "out of backend memory for attention activations");
  }
  int32_t *h = sm_xmalloc(sizeof(int32_t) * n * H);
  for (size_t i = 0; i < n * H; i++) h[i] = (int32_t)(i % H);
  m->be->upload(m->be, s->ids, h, sizeof(int32_t) * n * H);
  free(h);
  s->tokens = n_tokens;
  return SMELT_OK;
}

/* the softmax scale: 1/sqrt(dn + dr), times mscale^2 of YaRN's mscale_all_dim (DeepSeek-V3's attention) */
static float mla_scale(const smelt_model *m) {
  const sm_config *c = &m->cfg;
  float s = 1.0f / sqrtf((float)(c->mla.nope_dim + c->mla.rope_dim));
  if (c->rope_type == SM_ROPE_YARN && c->rope_mscale_all_dim > 0 && c->rope_factor > 1) {
    const float ms = 0.1f * c->rope_mscale_all_dim * logf(c->rope_factor) + 1.0f;
    s *= ms * ms;
  }
  return s;
}

void sm_mla_attention(smelt_model *m, const sm_kv_cache *kv, int l, const float *ain, int n, float *out) {
  const sm_config *c = &m->cfg;
  const sm_mla_config *a = &c->mla;
  sm_backend *be = m->be;
  const sm_layer *L = &m->layers[l];
  const sm_mla_layer *M = L->mla;
  sm_mla_scratch *s = m->mla_scr;
  const int H = c->num_attention_heads, dr = a->rope_dim, dc = a->kv_rank;
  const float eps = norm_eps(m);
  const float *qin = ain;
  if (M->q_a.data) {
    be->matmul(be, SM_MM_Q, &M->q_a, ain, n, s->qa);
    if (M->q_a_bias) be->add_rows(be, s->qa, M->q_a_bias, n, a->q_rank);
    be->rmsnorm(be, s->qa, s->qa, M->q_a_norm, n, a->q_rank, eps, 0.0f);
    qin = s->qa;
  }
  be->matmul(be, SM_MM_Q, &M->q_nope, qin, n, s->qn);
  be->matmul(be, SM_MM_Q, &M->q_pe, qin, n, s->qpe);
  be->matmul(be, SM_MM_K, &M->kv_c, ain, n, s->c);
  be->matmul(be, SM_MM_K, &M->kv_pe, ain, n, s->kpe);
  if (M->kv_bias) {
    be->add_rows(be, s->c, M->kv_bias, n, dc);
    be->add_rows(be, s->kpe, M->kv_bias + dc, n, dr);
  }
  be->rmsnorm(be, s->c, s->c, M->kv_norm, n, dc, eps, 0.0f);
  if (L->spec.rope >= 0) {
    const sm_rope_tab *t = &m->ropes[L->spec.rope];
    if (t->ext) {
      sm_rope_ext p;
      sm_rope_ext_params(m, t, false, &p);
      be->rope_ext(be, s->qpe, H, dr, &p);
      be->rope_ext(be, s->kpe, 1, dr, &p);
    } else {
      be->rope(be, s->qpe, H, dr, dr, t->inv);
      be->rope(be, s->kpe, 1, dr, dr, t->inv);
    }
  }
  be->matmul_experts(be, SM_MM_MLA_UK, &M->uk, dc, NULL, s->qn, true, n, H, s->ids, s->ql);
  be->attention_mla(be, s->lat, s->ql, s->qpe, s->c, s->kpe, kv, l, H, dr, mla_scale(m));
  be->matmul_experts(be, SM_MM_MLA_UV, &M->uv, a->v_dim, NULL, s->lat, true, n, H, s->ids, s->vo);
  be->matmul(be, SM_MM_O, &M->o, s->vo, n, out);
  if (sm_tp_sums(m)) be->all_reduce(be, out, (size_t)n * (size_t)c->hidden_size); /* the ranks' heads' shares */
  if (M->o_bias) be->add_rows(be, out, M->o_bias, n, c->hidden_size);
}
