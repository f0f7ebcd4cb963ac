/* This rank's shard of a loaded model (tp.h): the whole weights as loaded (views of the checkpoint) become
 * the rank's rows or columns, and the config's head and MLP sizes the rank's, so the forward pass runs
 * unchanged on the smaller shapes. Row splits are views; column splits (the attention output and the
 * MLP's down projection) are host copies of the rank's columns, whole quantization groups each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/tp.h"

smelt_status sm_tp_cols(smelt_model *m, sm_weight *w, int64_t c0, int64_t nc, const char *what, int layer) {
  if (!w->data) return SMELT_OK;
  if (w->bits && (c0 % w->group_size || nc % w->group_size))
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "tensor parallelism over %d ranks: layer %d's %s splits into %lld columns a rank, not a "
                  "multiple of its quantization group (%d)",
                  m->tp->n, layer, what, (long long)nc, w->group_size);
  sm_weight v = *w;
  v.dev = NULL;
  v.cols = nc;
  const size_t rows = (size_t)w->rows;
  if (!w->bits) {
    const size_t es = sm_dtype_size(w->dtype), rb = (size_t)nc * es, wb = (size_t)w->cols * es;
    uint8_t *d = sm_model_host_own(m, sm_xmalloc(rows * rb));
    for (size_t r = 0; r < rows; r++) memcpy(d + r * rb, (const uint8_t *)w->data + r * wb + (size_t)c0 * es, rb);
    v.data = d;
  } else {
    const size_t rb = (size_t)nc * w->bits / 8, wb = (size_t)w->cols * w->bits / 8, o = (size_t)c0 * w->bits / 8;
    uint8_t *d = sm_model_host_own(m, sm_xmalloc(rows * rb));
    for (size_t r = 0; r < rows; r++) memcpy(d + r * rb, (const uint8_t *)w->data + r * wb + o, rb);
    v.data = d;
    const size_t es = sm_dtype_size(w->dtype), gn = (size_t)(nc / w->group_size),
                 gw = (size_t)(w->cols / w->group_size), g0 = (size_t)(c0 / w->group_size);
    const void *src[2] = {w->scales, w->biases};
    const void **dst[2] = {&v.scales, &v.biases};
    for (int k = 0; k < 2; k++) {
      if (!src[k]) continue;
      uint8_t *s = sm_model_host_own(m, sm_xmalloc(rows * gn * es));
      for (size_t r = 0; r < rows; r++) memcpy(s + r * gn * es, (const uint8_t *)src[k] + (r * gw + g0) * es, gn * es);
      *dst[k] = s;
    }
  }
  *w = v;
  return SMELT_OK;
}

bool sm_tp_split_problem(const sm_config *c, const sm_family *fam, int n, char *why, size_t len) {
  const sm_recipe *rc = fam ? fam->recipe : NULL;
  const int64_t nh = c->num_attention_heads, nkv = c->num_key_value_heads > 0 ? c->num_key_value_heads : nh,
                hd = c->head_dim > 0 ? c->head_dim : (nh > 0 ? c->hidden_size / nh : 0), F = c->intermediate_size,
                gs = c->q_bits ? c->q_group_size : 0;
  const char *kind = !rc                                                    ? "this family's"
                   : c->rec.kind == SM_REC_MAMBA2 && !c->rec.m_norm_grouped ? "Mamba-2 (a norm over all its heads)"
                   : rc->qk_norm == SM_QK_NORM_FULL                         ? "whole-projection q/k norm"
                                                                            : NULL;
  if (kind) {
    snprintf(why, len, "tensor parallelism (--tensor-parallel %d) does not split %s models yet (%s)", n, kind,
             c->model_type);
    return true;
  }
  if (nh <= 0 || nh % n || F % n || (nkv % n && n % nkv)) {
    snprintf(why, len,
             "tensor parallelism over %d ranks: %lld attention heads, %lld KV heads and an MLP of %lld do not split "
             "evenly (heads and MLP size must divide by the ranks, KV heads divide or be divided by them)",
             n, (long long)nh, (long long)nkv, (long long)F);
    return true;
  }
  const int64_t Fe = fam->moe && c->moe.n_experts > 0 ? c->moe.expert_inter : 0,
                Fs = Fe ? (c->moe.shared_inter > 0 ? c->moe.shared_inter : 0) : 0;
  const sm_rec_config *rec = &c->rec;
  if ((rec->kind == SM_REC_MAMBA2 && (rec->m_heads % n || rec->m_groups % n)) ||
      (rec->kind == SM_REC_SHORTCONV && c->hidden_size % n)) {
    snprintf(
      why, len,
      "tensor parallelism over %d ranks: the recurrent layers' %d heads in %d groups (or %d channels) do not split evenly",
      n, rec->m_heads, rec->m_groups, c->hidden_size);
    return true;
  }
  if (c->rec.kind == SM_REC_GDN && (c->rec.gdn_k_heads % n || c->rec.gdn_v_heads % n)) {
    snprintf(why, len,
             "tensor parallelism over %d ranks: %d linear-attention key heads (%d value heads) do not split evenly", n,
             c->rec.gdn_k_heads, c->rec.gdn_v_heads);
    return true;
  }
  if (Fe % n || Fs % n) {
    snprintf(
      why, len,
      "tensor parallelism over %d ranks: experts of %lld and a shared expert of %lld columns do not split evenly", n,
      (long long)Fe, (long long)Fs);
    return true;
  }
  if (gs > 0 && ((Fe / n) % gs || (Fs / n) % gs)) {
    snprintf(why, len,
             "tensor parallelism over %d ranks: the experts' down_proj splits into %lld columns a rank (shared: "
             "%lld), not multiples of the quantization group (%lld)",
             n, (long long)(Fe / n), (long long)(Fs / n), (long long)gs);
    return true;
  }
  const int64_t ocols = nh / n * (rc->mla ? c->mla.v_dim : hd); /* o_proj's columns a rank */
  if (gs > 0 && (ocols % gs || (F / n) % gs)) {
    snprintf(why, len,
             "tensor parallelism over %d ranks: o_proj and down_proj split into %lld and %lld columns a rank, not "
             "multiples of the quantization group (%lld)",
             n, (long long)ocols, (long long)(F / n), (long long)gs);
    return true;
  }
  return false;
}

static smelt_status unsupported(const smelt_model *m, const char *what) {
  return sm_err(SMELT_ERR_UNSUPPORTED, "tensor parallelism (--tensor-parallel %d) does not split %s models yet (%s)",
                m->tp->n, what, m->cfg.model_type);
}

/* rows of the recurrent mixer's input projection and the same channels of its convolution (weights [C][K], bias,
 * a bias of the projection) as rank r keeps them: nseg segments {first local channel, first global one, count} */
static smelt_status gather_channels(smelt_model *m, sm_layer *L, const int64_t (*seg)[3], int nseg, int64_t C) {
  sm_backend *be = m->be;
  const int64_t K = m->cfg.rec.conv_kernel;
  int64_t *ch = sm_xmalloc(sizeof(int64_t) * (size_t)C);
  for (int s = 0; s < nseg; s++)
    for (int64_t i = 0; i < seg[s][2]; i++) ch[seg[s][0] + i] = seg[s][1] + i;
  sm_load_gather_rows(m, &L->w[SM_T_REC_IN], ch, C);
  free(ch);
  float *src[3] = {L->vec[SM_T_REC_CONV], L->bias[SM_T_REC_CONV], L->bias[SM_T_REC_IN]};
  float **dst[3] = {&L->vec[SM_T_REC_CONV], &L->bias[SM_T_REC_CONV], &L->bias[SM_T_REC_IN]};
  for (int k = 0; k < 3; k++) {
    if (!src[k]) continue;
    const int64_t w = k ? 1 : K;
    float *d = be->alloc(be, sizeof(float) * (size_t)(C * w));
    if (!d) return sm_err(SMELT_ERR_OOM, "out of backend memory for a split recurrent layer");
    sm_model_own(m, d);
    for (int s = 0; s < nseg; s++)
      be->copy(be, d + seg[s][0] * w, src[k] + seg[s][1] * w, sizeof(float) * (size_t)(seg[s][2] * w));
    *dst[k] = d;
  }
  return SMELT_OK;
}

/* rows [r0, r0 + n) of slot s, with its bias */
static void rows_of(sm_layer *L, sm_layer_tensor s, int64_t r0, int64_t n) {
  L->w[s] = sm_weight_rows(&L->w[s], r0, n);
  if (L->bias[s]) L->bias[s] += r0;
}

/* A recurrent mixer (recurrent.c) split over the ranks; each rank keeps a share of every sequence's state and
 * its columns of out_proj (the all-reduce after it sums the ranks' shares, then the bias is added):
 *  - Gated DeltaNet: key heads with their value heads (q, k, v rows of in_proj and those convolution
 *    channels; rows of z, b and a; A_log, dt_bias);
 *  - Mamba-2: heads with their groups (x, B, C rows and channels; rows of z and dt; A_log, D, dt_bias, the
 *    norm's weights);
 *  - LFM2's short convolution: channels (rows of B, C and x, the convolution's). */
static smelt_status split_rec(smelt_model *m, sm_layer *L, int l, int r, int n) {
  const sm_rec_config *rc = &m->cfg.rec;
  const int64_t K = rc->conv_kernel;
  int64_t out_cols, out_n;
  smelt_status st;
  switch (rc->kind) {
    case SM_REC_GDN: {
      if (L->bias[SM_T_REC_Z]) return unsupported(m, "biased linear-attention");
      const int64_t dk = rc->gdn_k_dim, dv = rc->gdn_v_dim, kd = (int64_t)rc->gdn_k_heads * dk, kdl = kd / n,
                    vdl = (int64_t)rc->gdn_v_heads * dv / n, nvl = rc->gdn_v_heads / n;
      const int64_t seg[3][3] = {{0, r * kdl, kdl}, {kdl, kd + r * kdl, kdl}, {2 * kdl, 2 * kd + r * vdl, vdl}};
      if ((st = gather_channels(m, L, seg, 3, 2 * kdl + vdl))) return st;
      rows_of(L, SM_T_REC_Z, r * vdl, vdl);
      rows_of(L, SM_T_REC_B, r * nvl, nvl);
      rows_of(L, SM_T_REC_A, r * nvl, nvl);
      L->vec[SM_T_REC_A_LOG] += r * nvl;
      L->vec[SM_T_REC_DT_BIAS] += r * nvl;
      out_cols = r * vdl, out_n = vdl;
      break;
    }
    case SM_REC_MAMBA2: {
      const int64_t P = rc->m_head_dim, N = rc->m_state, I = (int64_t)rc->m_heads * P, GN = (int64_t)rc->m_groups * N,
                    nhl = rc->m_heads / n, Il = nhl * P, GNl = GN / n;
      const int64_t seg[3][3] = {{0, r * Il, Il}, {Il, I + r * GNl, GNl}, {Il + GNl, I + GN + r * GNl, GNl}};
      if ((st = gather_channels(m, L, seg, 3, Il + 2 * GNl))) return st;
      rows_of(L, SM_T_REC_Z, r * Il, Il);
      rows_of(L, SM_T_REC_A, r * nhl, nhl);
      L->vec[SM_T_REC_A_LOG] += r * nhl;
      L->vec[SM_T_REC_DT_BIAS] += r * nhl;
      if (L->vec[SM_T_REC_D]) L->vec[SM_T_REC_D] += r * nhl;
      L->vec[SM_T_REC_NORM] += r * Il;
      out_cols = r * Il, out_n = Il;
      break;
    }
    case SM_REC_SHORTCONV: {
      const int64_t Hl = m->cfg.hidden_size / n;
      rows_of(L, SM_T_REC_B, r * Hl, Hl);
      rows_of(L, SM_T_REC_Z, r * Hl, Hl);
      rows_of(L, SM_T_REC_IN, r * Hl, Hl);
      L->vec[SM_T_REC_CONV] += r * Hl * K;
      if (L->bias[SM_T_REC_CONV]) L->bias[SM_T_REC_CONV] += r * Hl;
      out_cols = r * Hl, out_n = Hl;
      break;
    }
    default: return unsupported(m, "this kind of recurrent");
  }
  return sm_tp_cols(m, &L->w[SM_T_REC_OUT], out_cols, out_n, "the recurrent mixer's out_proj", l);
}

smelt_status sm_tp_shard(smelt_model *m) {
  sm_tp *tp = m->tp;
  sm_config *c = &m->cfg;
  const int n = tp->n, r = tp->rank;
  const int64_t hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads, F = c->intermediate_size,
                V = c->vocab_size;
  char why[320];
  /* (the weights' own quantization groups are checked below, tensor by tensor) */
  sm_config q = *c;
  q.q_bits = 0;
  if (sm_tp_split_problem(&q, m->fam, n, why, sizeof why)) return sm_err(SMELT_ERR_UNSUPPORTED, "%s", why);
  const int64_t nql = nh / n * hd, nkvl = (nkv >= n ? nkv / n : 1) * hd, Fl = F / n;
  const int64_t kv0 = nkv >= n ? r * nkvl : (int64_t)(r / (n / nkv)) * hd; /* first K/V row of the rank */
  smelt_status st;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    sm_layer *L = &m->layers[l];
    if (L->mla) {
      if ((st = sm_mla_split(m, l, r, n))) return st;
    } else if (L->spec.kind == SM_LK_REC) {
      if ((st = split_rec(m, L, l, r, n))) return st;
    } else if (L->spec.kind == SM_LK_ATTN) {
      L->w[SM_T_Q] = sm_weight_rows(&L->w[SM_T_Q], r * nql, nql);
      L->w[SM_T_K] = sm_weight_rows(&L->w[SM_T_K], kv0, nkvl);
      L->w[SM_T_V] = sm_weight_rows(&L->w[SM_T_V], kv0, nkvl);
      if (L->bias[SM_T_Q]) L->bias[SM_T_Q] += r * nql;
      if (L->sinks) L->sinks += r * (nh / n); /* one a head (gpt-oss) */
      if (L->w[SM_T_ATTN_GATE].data) {        /* gated attention: the gate rows of the rank's heads */
        L->w[SM_T_ATTN_GATE] = sm_weight_rows(&L->w[SM_T_ATTN_GATE], r * nql, nql);
        if (L->bias[SM_T_ATTN_GATE]) L->bias[SM_T_ATTN_GATE] += r * nql;
      }
      if (L->bias[SM_T_K]) L->bias[SM_T_K] += kv0;
      if (L->bias[SM_T_V]) L->bias[SM_T_V] += kv0;
      if ((st = sm_tp_cols(m, &L->w[SM_T_O], r * nql, nql, "o_proj", l))) return st; /* its bias: after the sum */
    }
    if (L->moe) {
      if ((st = sm_moe_split(m, l, r, n))) return st;
    } else if (L->spec.ffn) {
      if (L->w[SM_T_GATE].data) L->w[SM_T_GATE] = sm_weight_rows(&L->w[SM_T_GATE], r * Fl, Fl);
      L->w[SM_T_UP] = sm_weight_rows(&L->w[SM_T_UP], r * Fl, Fl);
      if ((st = sm_tp_cols(m, &L->w[SM_T_DOWN], r * Fl, Fl, "down_proj", l))) return st;
      if (L->bias[SM_T_GATE] || L->bias[SM_T_UP] || L->bias[SM_T_DOWN]) return unsupported(m, "MLP-bias");
    }
  }
  tp->vocab_split = V % n == 0;
  if (tp->vocab_split) m->lm_head = sm_weight_rows(&m->lm_head, r * (V / n), V / n);
  tp->full_heads = (int)nh;
  tp->full_kv_heads = (int)nkv;
  c->num_attention_heads = (int)(nh / n);
  c->num_key_value_heads = (int)(nkvl / hd);
  c->intermediate_size = (int)Fl;
  c->moe.expert_inter /= n;
  c->rec.gdn_k_heads /= n;
  c->rec.gdn_v_heads /= n;
  c->rec.m_heads /= n;
  c->rec.m_groups /= n;
  if (c->rec.kind == SM_REC_SHORTCONV) c->rec.sc_channels = c->hidden_size / n;
  c->moe.shared_inter /= n;
  /* the layers' shapes as this rank has them (a split model's layers all have the config's shape) */
  for (int l = 0; l < c->num_hidden_layers; l++) {
    m->layers[l].spec.kv_heads = c->num_key_value_heads;
    m->layers[l].spec.ffn_dim = c->intermediate_size;
  }
  m->max_q = c->num_attention_heads * c->head_dim;
  m->max_kv = c->num_key_value_heads * c->head_dim;
  m->max_ffn = c->intermediate_size;
  return SMELT_OK;
}
