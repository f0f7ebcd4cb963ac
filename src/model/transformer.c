/* The shared decoder-only transformer forward pass: one layer recipe (family.h) for every family. */
#include "model/model.h"
#include "model/tp.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static smelt_status grow(smelt_model *m, float **p, size_t floats) {
  if (*p) m->be->free(m->be, *p);
  *p = m->be->alloc(m->be, floats * sizeof(float));
  return *p ? SMELT_OK : sm_err(SMELT_ERR_OOM, "out of backend memory for activations");
}

smelt_status sm_model_reserve(smelt_model *m, int n_tokens, int n_out) {
  const sm_config *c = &m->cfg;
  smelt_status st;
  if (n_tokens > m->scratch_tokens) {
    /* the widest layer's (loader.c check_recipe; a split model's rank: tp_shard.c) */
    size_t n = (size_t)n_tokens, H = (size_t)c->hidden_size, F = (size_t)m->max_ffn;
    size_t nq = (size_t)m->max_q, nkv = (size_t)m->max_kv;
    if (m->fam->recipe->mla) nq = nkv = 1; /* mla.c has its own activations */
    size_t wide = SM_MAX(H, nq);
    if ((st = grow(m, &m->x, n * H)) || (st = grow(m, &m->xb, n * wide)) || (st = grow(m, &m->xb2, n * H)) ||
        (st = grow(m, &m->q, n * nq)) || (st = grow(m, &m->k, n * nkv)) || (st = grow(m, &m->v, n * nkv)) ||
        (st = grow(m, &m->att, n * nq)) || (st = grow(m, &m->gate, n * F)) || (st = grow(m, &m->up, n * F)))
      return st;
    if ((st = sm_moe_reserve(m, n_tokens)) || (st = sm_mla_reserve(m, n_tokens))) return st;
    if (sm_pp_stages(m)) { /* zeros for the stages' hand-over (pp.c) */
      if ((st = grow(m, &m->pp_zero, n * H))) return st;
      float *z = sm_xcalloc(n * H, sizeof(float));
      m->be->upload(m->be, m->pp_zero, z, n * H * sizeof(float));
      free(z);
    }
    if (m->fam->recipe->attn_out_gate && (st = grow(m, &m->agate, n * nq))) return st;
    if (m->ple_embed.data) { /* per-layer inputs: the batch's, a layer's part, its gate, and the part's rows */
      const size_t L = (size_t)c->num_hidden_layers, P = (size_t)c->ple_dim;
      if ((st = grow(m, &m->ple, n * L * P)) || (st = grow(m, &m->ple_part, n * L * P)) ||
          (st = grow(m, &m->ple_gate, n * P)))
        return st;
      if (m->ple_idx) m->be->free(m->be, m->ple_idx);
      m->ple_idx = m->be->alloc(m->be, sizeof(int32_t) * n * L);
      if (!m->ple_idx) return sm_err(SMELT_ERR_OOM, "out of backend memory for activations");
      int32_t *idx = sm_xmalloc(sizeof(int32_t) * n * L);
      for (size_t l = 0; l < L; l++)
        for (size_t t = 0; t < n; t++) idx[l * n + t] = (int32_t)(t * L + l);
      m->be->upload(m->be, m->ple_idx, idx, sizeof(int32_t) * n * L);
      free(idx);
      m->ple_idx_cap = n_tokens;
    }
    if (c->rec.kind != SM_REC_NONE) { /* the recurrent mixer's activations (recurrent.c) */
      size_t per[SM_REC_SCRATCH];
      sm_rec_scratch(c, per);
      for (int i = 0; i < SM_REC_SCRATCH; i++)
        if ((st = grow(m, &m->rec[i], n * per[i]))) return st;
    }
    m->scratch_tokens = n_tokens;
  }
  if (n_out > m->scratch_out) {
    if ((st = grow(m, &m->xo, (size_t)n_out * c->hidden_size)) ||
        (st = grow(m, &m->logits, (size_t)n_out * c->vocab_size)))
      return st;
    /* tensor parallelism with the vocabulary split: this rank's logits, and (rank 0) all ranks' */
    if (m->tp && m->tp->vocab_split &&
        ((st = grow(m, &m->tp_part, (size_t)n_out * (c->vocab_size / m->tp->n))) ||
         (m->tp->rank == 0 && (st = grow(m, &m->tp_lg, (size_t)n_out * c->vocab_size)))))
      return st;
    m->scratch_out = n_out;
  }
  return SMELT_OK;
}

/* the recipe's norm: RMSNorm with (w + offset), or LayerNorm (weight only) */
static void norm(const smelt_model *m, float *out, const float *x, const float *w, int n, int dim) {
  const sm_recipe *r = m->fam->recipe;
  if (r->norm == SM_NORM_LAYER) m->be->layernorm(m->be, out, x, w, NULL, n, dim, m->cfg.rms_norm_eps);
  else m->be->rmsnorm(m->be, out, x, w, n, dim, m->cfg.rms_norm_eps, r->norm_offset);
}

/* Attention of layer l on ain into out (before the output norm and the residual add); mrope: the
 * batch's M-RoPE positions (m->rope_pos_dev) rotate q and k */
static void attention_block(smelt_model *m, const sm_kv_cache *kv, int l, const float *ain, int n, bool mrope,
                            float *out) {
  const sm_config *c = &m->cfg;
  sm_backend *be = m->be;
  const sm_recipe *r = m->fam->recipe;
  const sm_layer *L = &m->layers[l];
  const int H = c->hidden_size, hd = L->spec.head_dim, nh = c->num_attention_heads, nkvh = L->spec.kv_heads;
  const float eps = c->rms_norm_eps, wofs = r->norm_offset;
  const float softcap = r->softcaps ? c->attn_logit_softcapping : 0.0f;
  /* a layer that reads an earlier layer's K/V (Gemma 4's KV sharing) computes its queries only; the cache is
   * seen with this layer's head size and KV heads */
  const bool own_kv = L->spec.kv_src == l;
  sm_kv_cache view = *kv;
  view.head_dim = hd;
  view.n_kv_heads = nkvh;
  if (own_kv && !L->spec.k_eq_v) { /* q, k and v of one x (one dispatch where the backend groups them) */
    const sm_mm_role roles[3] = {SM_MM_Q, SM_MM_K, SM_MM_V};
    const sm_weight *ws[3] = {&L->w[SM_T_Q], &L->w[SM_T_K], &L->w[SM_T_V]};
    float *ys[3] = {m->q, m->k, m->v};
    sm_matmul_group(be, roles, ws, ain, n, ys, 3);
  } else {
    be->matmul(be, SM_MM_Q, &L->w[SM_T_Q], ain, n, m->q);
    if (own_kv) {
      be->matmul(be, SM_MM_K, &L->w[SM_T_K], ain, n, m->k);
      be->copy(be, m->v, m->k, sizeof(float) * (size_t)n * nkvh * hd); /* k_eq_v: before k's norm */
    }
  }
  if (L->bias[SM_T_Q]) be->add_rows(be, m->q, L->bias[SM_T_Q], n, nh * hd);
  if (own_kv && L->bias[SM_T_K]) be->add_rows(be, m->k, L->bias[SM_T_K], n, nkvh * hd);
  if (own_kv && L->bias[SM_T_V]) be->add_rows(be, m->v, L->bias[SM_T_V], n, nkvh * hd);
  if (m->qk_norm == SM_QK_NORM_HEAD) {
    be->rmsnorm(be, m->q, m->q, L->vec[SM_T_Q_NORM], n * nh, hd, eps, wofs);
    if (own_kv) be->rmsnorm(be, m->k, m->k, L->vec[SM_T_K_NORM], n * nkvh, hd, eps, wofs);
  } else if (m->qk_norm == SM_QK_NORM_FULL) {
    be->rmsnorm(be, m->q, m->q, L->vec[SM_T_Q_NORM], n, nh * hd, eps, wofs);
    be->rmsnorm(be, m->k, m->k, L->vec[SM_T_K_NORM], n, nkvh * hd, eps, wofs);
  }
  if (own_kv && r->v_norm) be->rmsnorm(be, m->v, m->v, m->ones, n * nkvh, hd, eps, 0.0f); /* no weight */
  float scale = m->attn_scale;
  if (L->spec.rope >= 0) {
    const sm_rope_tab *t = &m->ropes[L->spec.rope];
    if (mrope) {
      be->rope_axes(be, m->q, n, nh, hd, t->rot, t->inv, m->mrope_axis, m->rope_pos_dev);
      be->rope_axes(be, m->k, n, nkvh, hd, t->rot, t->inv, m->mrope_axis, m->rope_pos_dev);
    } else if (t->ext || m->q_beta > 0) {
      sm_rope_ext pq, pk;
      sm_rope_ext_params(m, t, true, &pq);
      sm_rope_ext_params(m, t, false, &pk);
      be->rope_ext(be, m->q, nh, hd, &pq);
      if (own_kv) be->rope_ext(be, m->k, nkvh, hd, &pk);
    } else {
      be->rope(be, m->q, nh, hd, t->rot, t->inv);
      if (own_kv) be->rope(be, m->k, nkvh, hd, t->rot, t->inv);
    }
    scale *= t->attn_mul;
  }
  if (own_kv) be->kv_store(be, &view, l, m->k, m->v);
  const int src = L->spec.kv_src;
  if (L->sinks) be->attention_sinks(be, m->att, m->q, &view, src, nh, scale, L->spec.window, softcap, L->sinks);
  else be->attention(be, m->att, m->q, &view, src, nh, scale, L->spec.window, softcap);
  if (r->attn_out_gate) { /* the attention output times sigmoid of the gate rows of q_proj */
    be->matmul(be, SM_MM_ATTN_GATE, &L->w[SM_T_ATTN_GATE], ain, n, m->agate);
    if (L->bias[SM_T_ATTN_GATE]) be->add_rows(be, m->agate, L->bias[SM_T_ATTN_GATE], n, nh * hd);
    be->sigmoid_mul(be, m->att, m->agate, (size_t)n * nh * hd);
  }
  be->matmul(be, SM_MM_O, &L->w[SM_T_O], m->att, n, out);
  if (sm_tp_sums(m)) be->all_reduce(be, out, (size_t)n * H); /* the ranks' heads' shares */
  if (L->bias[SM_T_O]) be->add_rows(be, out, L->bias[SM_T_O], n, H);
}

/* deepstack: the image rows of the batch get the vision tower's layer-l features (after layer l) */
static void add_deepstack(smelt_model *m, const sm_batch *b, int l) {
  const size_t H = (size_t)m->cfg.hidden_size;
  for (int i = 0; i < b->n_embd; i++)
    if (l < b->embd[i].n_deep)
      m->be->add(m->be, m->x + (size_t)b->embd[i].row * H, b->embd[i].deep[l], (size_t)b->embd[i].n * H);
}

/* Per-layer inputs (Gemma 4), from the scaled embeddings in m->x: m->ple[t][l * P ..] =
 *   (norm(ple_proj(x_t) / sqrt(hidden)) + ple_embed[token_t] * sqrt(P)) / sqrt(2) */
static void per_layer_inputs(smelt_model *m, int n) {
  const sm_config *c = &m->cfg;
  sm_backend *be = m->be;
  const int L = c->num_hidden_layers, P = c->ple_dim;
  const size_t nlp = (size_t)n * L * P;
  be->matmul(be, SM_MM_PLE, &m->ple_proj, m->x, n, m->ple);
  be->scale(be, m->ple, 1.0f / sqrtf((float)c->hidden_size), nlp);
  be->rmsnorm(be, m->ple, m->ple, m->ple_norm, n * L, P, c->rms_norm_eps, 0.0f);
  be->embed(be, &m->ple_embed, m->ple_part);
  be->scale(be, m->ple_part, sqrtf((float)P), nlp);
  be->add(be, m->ple, m->ple_part, nlp);
  be->scale(be, m->ple, 1.0f / sqrtf(2.0f), nlp);
}

/* After layer l's MLP (Gemma 4): x += norm(proj(gelu_tanh(gate(x)) * the layer's input)) */
static void per_layer_input_add(smelt_model *m, const sm_layer *L, int l, int n) {
  const sm_config *c = &m->cfg;
  sm_backend *be = m->be;
  const int H = c->hidden_size, P = c->ple_dim;
  be->gather_rows(be, m->ple_part, m->ple, m->ple_idx + (size_t)l * m->ple_idx_cap, n, P);
  be->matmul(be, SM_MM_PLE, &L->w[SM_T_PLE_GATE], m->x, n, m->ple_gate);
  be->gelu_mul(be, m->ple_gate, m->ple_gate, m->ple_part, (size_t)n * P);
  be->matmul(be, SM_MM_PLE, &L->w[SM_T_PLE_PROJ], m->ple_gate, n, m->xb2);
  be->rmsnorm(be, m->xb2, m->xb2, L->vec[SM_T_PLE_NORM], n, H, c->rms_norm_eps, m->fam->recipe->norm_offset);
  be->add(be, m->x, m->xb2, (size_t)n * H);
}

smelt_status sm_model_forward(smelt_model *m, const sm_kv_cache *kv, const sm_batch *b, float *logits) {
  const sm_config *c = &m->cfg;
  sm_backend *be = m->be;
  if (b->n_tokens <= 0) return SMELT_OK;
  for (int i = 0; i < b->n_tokens; i++) {
    if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size)
      return sm_err(SMELT_ERR_INVALID, "token id %d out of range (vocab %d)", b->tokens[i], c->vocab_size);
    if (m->ple_embed.data && b->tokens[i] >= c->ple_vocab)
      return sm_err(SMELT_ERR_INVALID, "token id %d has no per-layer input (vocab_size_per_layer_input %d)",
                    b->tokens[i], c->ple_vocab);
    if (b->pos[i] < 0 || b->pos[i] >= b->max_blocks * kv->block_size)
      return sm_err(SMELT_ERR_LIMIT, "position %d beyond the KV cache", b->pos[i]);
  }
  if (c->rec.kind != SM_REC_NONE && (!b->state_slot || kv->n_slots <= 0))
    return sm_err(SMELT_ERR_INVALID, "a model with recurrent layers needs state slots in the cache and the batch");
  /* a RoPE table with rows per position (dynamic NTK) covers the positions of max_context */
  for (int k = 0; k < 2; k++) {
    const int lim = m->ropes[k].pos_limit;
    for (int i = 0; lim > 0 && i < b->n_tokens; i++)
      if (b->pos[i] >= lim)
        return sm_err(SMELT_ERR_LIMIT,
                      "position %d is past this model's dynamic-NTK RoPE table (%d positions: load "
                      "it with a larger max_context)",
                      b->pos[i], lim);
  }
  for (int i = 0; i < b->n_embd; i++) {
    const sm_batch_embd *e = &b->embd[i];
    if (e->row < 0 || e->n <= 0 || e->row + e->n > b->n_tokens || !e->src || e->n_deep < 0 ||
        e->n_deep > c->num_hidden_layers || (e->n_deep && !e->deep))
      return sm_err(SMELT_ERR_INVALID, "batch embedding run %d (rows %d+%d of %d) is invalid", i, e->row, e->n,
                    b->n_tokens);
  }
  smelt_status st = sm_model_reserve(m, b->n_tokens, b->n_out);
  if (st) return st;
  /* M-RoPE positions (before set_batch: an upload ends a recorded step) */
  const bool mrope = b->rope_pos && m->mrope_axis;
  if (b->rope_pos && !m->mrope_axis) return sm_err(SMELT_ERR_INVALID, "3-axis positions for a model without M-RoPE");
  if (mrope) {
    if (b->n_tokens > m->rope_pos_cap) {
      if (m->rope_pos_dev) be->free(be, m->rope_pos_dev);
      m->rope_pos_dev = be->alloc(be, sizeof(int32_t) * 3 * (size_t)b->n_tokens);
      m->rope_pos_cap = m->rope_pos_dev ? b->n_tokens : 0;
      if (!m->rope_pos_dev) return sm_err(SMELT_ERR_OOM, "out of backend memory for positions");
    }
    be->upload(be, m->rope_pos_dev, b->rope_pos, sizeof(int32_t) * 3 * (size_t)b->n_tokens);
  }
  if (m->tp && (st = sm_tp_step(m, kv, b))) return st; /* before set_batch: an upload ends a recorded step */
  if ((st = be->set_batch(be, b))) {
    if (m->tp) m->tp->broken = true; /* the other ranks run this step: the group's collectives are out of step */
    return st;
  }
  const sm_recipe *r = m->fam->recipe;
  const int n = b->n_tokens, H = c->hidden_size;
  const float resid = r->multipliers ? c->residual_multiplier : 1.0f;

  /* The order of these calls is what backends fuse (the CUDA fusion table, cuda_fuse.cu); tests/model
   * test_op_sequence pins it per family. */
  /* pipeline parallelism: stage s (rank s) runs layers [first[s], first[s + 1]); rank 0 embeds */
  const int pp = sm_pp_stages(m);
  if (!pp || m->tp->rank == 0) {
    be->embed(be, &m->embed, m->x);
    if (m->embed_scale != 1.0f) be->scale(be, m->x, m->embed_scale, (size_t)n * H);
    if (m->ple_embed.data) per_layer_inputs(m, n);
    for (int i = 0; i < b->n_embd; i++) /* image rows: their embeddings, unscaled */
      be->copy(be, m->x + (size_t)b->embd[i].row * H, b->embd[i].src, sizeof(float) * (size_t)b->embd[i].n * H);
  }
  /* tensor parallelism: a token only rank 0's device holds (pipelined decode) or image rows only rank 0
   * has: its embeddings go to the other ranks */
  if (sm_tp_sums(m) && m->tp->bcast_x) be->broadcast(be, m->x, (size_t)n * H);
  for (int l = 0, s = 0; l < c->num_hidden_layers; l++) {
    if (pp) { /* the stage's output to the next stage (every rank takes part in the collective) */
      if (l == m->tp->first[s + 1] && (st = sm_pp_pass(m, s++, (size_t)n * H))) return st;
      if (s != m->tp->rank) continue;
    }
    const sm_layer *L = &m->layers[l];
    const float *ain = m->x;
    if (L->spec.kind == SM_LK_ATTN || L->spec.kind == SM_LK_REC) { /* attention or a recurrent mixer */
      if (L->vec[SM_T_ATTN_NORM]) {
        norm(m, m->xb, m->x, L->vec[SM_T_ATTN_NORM], n, H);
        ain = m->xb;
      }
      if (L->spec.kind == SM_LK_REC) sm_rec_mixer(m, kv, l, ain, n, m->xb2);
      else if (L->mla) sm_mla_attention(m, kv, l, ain, n, m->xb2);
      else attention_block(m, kv, l, ain, n, mrope, m->xb2);
      if (L->vec[SM_T_ATTN_OUT_NORM]) norm(m, m->xb2, m->xb2, L->vec[SM_T_ATTN_OUT_NORM], n, H);
      if (resid != 1.0f) be->scale(be, m->xb2, resid, (size_t)n * H);
      if (!r->parallel_residual) be->add(be, m->x, m->xb2, (size_t)n * H);
    }
    if (!L->spec.ffn) {
      add_deepstack(m, b, l);
      continue;
    }
    /* MLP */
    const float *min = ain;
    if (!r->parallel_residual) {
      min = m->x;
      if (L->vec[SM_T_FFN_NORM]) {
        norm(m, m->xb, m->x, L->vec[SM_T_FFN_NORM], n, H);
        min = m->xb;
      }
    }
    const int F = L->spec.ffn_dim;
    float *mout = r->parallel_residual ? m->xb : m->xb2;   /* xb is free once gate and up have read it */
    const bool beside = L->moe && m->fam->moe->beside_mlp; /* experts beside the dense MLP (Gemma 4) */
    if (L->moe && !beside) {                               /* a mixture of experts (moe.c) */
      if ((st = sm_moe_forward(m, L, min, n, mout))) return st;
    } else if (r->ffn == SM_FFN_PLAIN) { /* down(act(up(x))) */
      be->matmul(be, SM_MM_UP, &L->w[SM_T_UP], min, n, m->up);
      be->relu2(be, m->up, (size_t)n * F);
      be->matmul(be, SM_MM_DOWN, &L->w[SM_T_DOWN], m->up, n, mout);
    } else {
      const sm_mm_role roles[2] = {SM_MM_GATE, SM_MM_UP};
      const sm_weight *ws[2] = {&L->w[SM_T_GATE], &L->w[SM_T_UP]};
      float *ys[2] = {m->gate, m->up};
      sm_matmul_group(be, roles, ws, min, n, ys, 2);
      if (m->act == SM_ACT_GELU_TANH) be->gelu_mul(be, m->gate, m->gate, m->up, (size_t)n * F);
      else be->silu_mul(be, m->gate, m->gate, m->up, (size_t)n * F);
      be->matmul(be, SM_MM_DOWN, &L->w[SM_T_DOWN], m->gate, n, mout);
    }
    if (beside) {
      norm(m, mout, mout, L->vec[SM_T_MLP_OUT_NORM], n, H);
      if ((st = sm_moe_beside(m, L, n, mout))) return st;
    }
    if (sm_tp_sums(m)) be->all_reduce(be, mout, (size_t)n * H); /* the ranks' MLP columns' shares */
    if (L->vec[SM_T_FFN_OUT_NORM]) norm(m, mout, mout, L->vec[SM_T_FFN_OUT_NORM], n, H);
    if (resid != 1.0f) be->scale(be, mout, resid, (size_t)n * H);
    if (r->parallel_residual) be->add(be, m->x, m->xb2, (size_t)n * H);
    be->add(be, m->x, mout, (size_t)n * H);
    if (m->ple_embed.data) per_layer_input_add(m, L, l, n);
    if (L->scalar != 1.0f) be->scale(be, m->x, L->scalar, (size_t)n * H);
    add_deepstack(m, b, l);
  }
  /* the last stage's output to rank 0, which holds the LM head */
  if (pp && (st = sm_pp_pass(m, pp - 1, (size_t)n * H))) return st;
  if (b->n_out > 0 && m->tp && m->tp->rank != 0 && !m->tp->vocab_split) {
    return SMELT_OK; /* rank 0 holds the whole LM head; the caller (tp.c) starts the step */
  } else if (b->n_out > 0) {
    be->gather_out(be, m->xo, m->x, H);
    norm(m, m->xo, m->xo, m->final_norm, b->n_out, H);
    if (m->tp && m->tp->vocab_split) { /* each rank's vocabulary rows, then all of them on rank 0 */
      const int nr = m->tp->n, vr = c->vocab_size / nr;
      be->matmul(be, SM_MM_LM_HEAD, &m->lm_head, m->xo, b->n_out, m->tp_part);
      const bool reorder = m->tp->rank == 0 && b->n_out > 1; /* [rank][row] to [row][rank] */
      be->all_gather(be, reorder ? m->tp_lg : m->logits, m->tp_part, (size_t)b->n_out * vr);
      if (reorder) be->gather_rows(be, m->logits, m->tp_lg, m->tp_idx, b->n_out * nr, vr);
      if (m->tp->rank != 0) return SMELT_OK; /* the caller (tp.c) starts the step */
    } else {
      be->matmul(be, SM_MM_LM_HEAD, &m->lm_head, m->xo, b->n_out, m->logits);
    }
    const size_t nl = (size_t)b->n_out * c->vocab_size;
    if (r->multipliers && c->logits_scaling != 1.0f) be->scale(be, m->logits, 1.0f / c->logits_scaling, nl);
    if (r->logit_scale && c->logit_scale != 1.0f) be->scale(be, m->logits, c->logit_scale, nl);
    if (r->softcaps && c->final_logit_softcapping > 0) be->softcap(be, m->logits, c->final_logit_softcapping, nl);
    /* logits == NULL: they stay in m->logits on the backend, for its sample op (the engine's
     * sm_engine_step_sample); the caller then issues that op (or a download/sync) */
    if (logits) be->download(be, logits, m->logits, sizeof(float) * nl);
  } else {
    be->sync(be);
  }
  return SMELT_OK;
}
