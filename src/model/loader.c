/* Loading a checkpoint's tensors into a smelt_model: the family's tensor names (family.h) are
 * looked up in the safetensors, checked against the config's shapes and quantization, and handed
 * to the backend. Every tensor of the checkpoint must be read by some slot: one that is not (a
 * bias, a norm or a projection the family's recipe does not have) fails the load with its name,
 * so that a checkpoint never runs with part of its weights ignored. The only tensors skipped are
 * the vision tower of a vision-language packaging (family.h sm_vlm_packaging), named by prefix,
 * rotary_emb.inv_freq buffers and multi-token-prediction heads (mtp.*; mlx-lm's sanitize drops both).
 * Fused projections (qkv_proj, gate_up_proj) become row views; for families whose RoPE rotates
 * interleaved pairs, the q/k rows of each head are permuted here so that the rotate-half RoPE of
 * the backends computes the same scores. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/model.h"
#include "model/tp.h"
#include "vision/vision.h"

void *sm_model_own(smelt_model *m, void *p) {
  m->owned = sm_xrealloc(m->owned, sizeof(void *) * (size_t)(m->n_owned + 1));
  m->owned[m->n_owned++] = p;
  return p;
}
static void *own(smelt_model *m, void *p) { return sm_model_own(m, p); }

static void *host_own(smelt_model *m, void *p) {
  m->host_owned = sm_xrealloc(m->host_owned, sizeof(void *) * (size_t)(m->n_host_owned + 1));
  m->host_owned[m->n_host_owned++] = p;
  return p;
}

static const sm_tensor *take(smelt_model *m, sm_load_ctx *ts, const char *name) {
  const sm_tensor *t = sm_st_find(m->st, name);
  if (t) {
    if (ts->n == ts->cap) {
      ts->cap = ts->cap ? 2 * ts->cap : 256;
      ts->p = sm_xrealloc(ts->p, sizeof *ts->p * ts->cap);
    }
    ts->p[ts->n++] = t;
  }
  return t;
}

const sm_tensor *sm_load_take(smelt_model *m, sm_load_ctx *ts, const char *name) { return take(m, ts, name); }

static int ptr_cmp(const void *a, const void *b) {
  const void *x = *(const void *const *)a, *y = *(const void *const *)b;
  return x < y ? -1 : x > y;
}

static bool valid_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }

/* does tensor t have the shape [n_stack][rows][last] ([rows][last] when n_stack is 0) */
static bool shape_is(const sm_tensor *t, int64_t n_stack, int64_t rows, int64_t last) {
  if (n_stack)
    return t->ndim == 3 && t->shape[0] == n_stack && t->shape[1] == rows && (last < 0 || t->shape[2] == last);
  return t->ndim == 2 && t->shape[0] == rows && (last < 0 || t->shape[1] == last);
}

smelt_status sm_load_linear(smelt_model *m, sm_load_ctx *ts, const char *prefix, int64_t n_stack, int64_t rows,
                            int64_t cols, sm_weight *w, bool optional) {
  char name[320];
  snprintf(name, sizeof name, "%s.weight", prefix);
  const sm_tensor *tw = take(m, ts, name);
  memset(w, 0, sizeof *w);
  if (!tw) {
    if (optional) return SMELT_OK;
    return sm_err(SMELT_ERR_FORMAT, "missing tensor %s", name);
  }
  snprintf(name, sizeof name, "%s.scales", prefix);
  const sm_tensor *tsc = take(m, ts, name);
  const int64_t R = n_stack ? n_stack * rows : rows;
  char want[64];
  if (n_stack) snprintf(want, sizeof want, "[%lld, %lld, ", (long long)n_stack, (long long)rows);
  else snprintf(want, sizeof want, "[%lld, ", (long long)rows);
  w->rows = R;
  w->cols = cols;
  if (!tsc) {
    if (tw->dtype != SM_DT_F32 && tw->dtype != SM_DT_F16 && tw->dtype != SM_DT_BF16)
      return sm_err(SMELT_ERR_UNSUPPORTED, "%s.weight: dtype %s is not supported for dense weights (no .scales found)",
                    prefix, sm_dtype_name(tw->dtype));
    if (!shape_is(tw, n_stack, rows, cols))
      return sm_err(SMELT_ERR_FORMAT, "%s.weight: shape mismatch, expected %s%lld]", prefix, want, (long long)cols);
    w->bits = 0;
    w->dtype = tw->dtype;
    w->data = tw->data;
    m->weight_bytes += tw->nbytes;
    return SMELT_OK;
  }
  snprintf(name, sizeof name, "%s.biases", prefix);
  const sm_tensor *tb = take(m, ts, name);
  int cbits = 0, cgs = 0, cmode = 0;
  sm_config_quant_mode_for(&m->cfg, prefix, &cbits, &cgs, &cmode);
  if (!tb && (!cbits || cmode == SM_QMODE_AFFINE))
    return sm_err(SMELT_ERR_FORMAT,
                  "%s has .scales but no .biases, and config.json gives it no microscaling mode "
                  "(mxfp4, mxfp8, nvfp4)",
                  prefix);
  if (tb && cbits && cmode != SM_QMODE_AFFINE)
    return sm_err(SMELT_ERR_FORMAT, "%s: config.json says mode %s but the checkpoint has affine .biases", prefix,
                  sm_qmode_name((sm_qmode)cmode));
  const int64_t last = n_stack ? (tw->ndim == 3 ? tw->shape[2] : 0) : (tw->ndim == 2 ? tw->shape[1] : 0);
  if (tw->dtype != SM_DT_U32 || !shape_is(tw, n_stack, rows, -1) || (last * 32) % cols != 0)
    return sm_err(SMELT_ERR_FORMAT, "%s.weight: expected packed uint32 %scols*bits/32] for %lld input features", prefix,
                  want, (long long)cols);
  const int bits = (int)(last * 32 / cols);
  const int64_t sl = n_stack ? (tsc->ndim == 3 ? tsc->shape[2] : 0) : (tsc->ndim == 2 ? tsc->shape[1] : 0);
  if (!shape_is(tsc, n_stack, rows, -1) || sl <= 0 || cols % sl != 0)
    return sm_err(SMELT_ERR_FORMAT, "%s.scales: bad shape", prefix);
  const int gs = (int)(cols / sl);
  if (!tb) { /* a microscaling mode: the config's, checked against the shapes */
    if (bits != sm_qmode_bits((sm_qmode)cmode) || gs != sm_qmode_group((sm_qmode)cmode))
      return sm_err(SMELT_ERR_FORMAT, "%s: tensor shapes imply %d bits / group %d but mode %s has %d / %d", prefix,
                    bits, gs, sm_qmode_name((sm_qmode)cmode), sm_qmode_bits((sm_qmode)cmode),
                    sm_qmode_group((sm_qmode)cmode));
    if (tsc->dtype != SM_DT_U8)
      return sm_err(SMELT_ERR_FORMAT, "%s.scales: mode %s needs uint8 scale codes, not %s", prefix,
                    sm_qmode_name((sm_qmode)cmode), sm_dtype_name(tsc->dtype));
    w->bits = bits;
    w->group_size = gs;
    w->qmode = cmode;
    w->dtype = SM_DT_U8;
    w->data = tw->data;
    w->scales = tsc->data;
    m->weight_bytes += tw->nbytes + tsc->nbytes;
    return SMELT_OK;
  }
  if (!valid_bits(bits)) return sm_err(SMELT_ERR_UNSUPPORTED, "%s: %d-bit quantization is not supported", prefix, bits);
  if (gs != 32 && gs != 64 && gs != 128)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: group size %d is not supported (32, 64, 128)", prefix, gs);
  if (cbits && (cbits != bits || cgs != gs))
    return sm_err(SMELT_ERR_FORMAT, "%s: tensor shapes imply %d bits / group %d but config.json says %d / %d", prefix,
                  bits, gs, cbits, cgs);
  if (tb->ndim != tsc->ndim || memcmp(tb->shape, tsc->shape, sizeof(int64_t) * (size_t)tsc->ndim) ||
      tb->dtype != tsc->dtype)
    return sm_err(SMELT_ERR_FORMAT, "%s.biases: shape/dtype differs from .scales", prefix);
  if (tsc->dtype != SM_DT_F32 && tsc->dtype != SM_DT_F16 && tsc->dtype != SM_DT_BF16)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s.scales: dtype %s not supported", prefix, sm_dtype_name(tsc->dtype));
  w->bits = bits;
  w->group_size = gs;
  w->dtype = tsc->dtype;
  w->data = tw->data;
  w->scales = tsc->data;
  w->biases = tb->data;
  m->weight_bytes += tw->nbytes + tsc->nbytes + tb->nbytes;
  return SMELT_OK;
}

static smelt_status load_linear(smelt_model *m, sm_load_ctx *ts, const char *prefix, int64_t rows, int64_t cols,
                                sm_weight *w, bool optional) {
  return sm_load_linear(m, ts, prefix, 0, rows, cols, w, optional);
}

/* A 1-D vector (norm weight, bias) as a float32 backend buffer; perm (may be NULL): element i of the
 * result is element perm[i] of the tensor. n_stack > 0: a [n_stack][n] tensor (stacked experts' biases). */
/* the first n elements of a float tensor (f32, f16, bf16) into h */
static smelt_status host_floats(const sm_tensor *t, const char *name, int64_t n, float *h) {
  for (int64_t i = 0; i < n; i++) {
    switch (t->dtype) {
      case SM_DT_F32: memcpy(&h[i], (const char *)t->data + 4 * i, 4); break;
      case SM_DT_F16: {
        uint16_t v;
        memcpy(&v, (const char *)t->data + 2 * i, 2);
        h[i] = sm_f16_to_f32(v);
      } break;
      case SM_DT_BF16: {
        uint16_t v;
        memcpy(&v, (const char *)t->data + 2 * i, 2);
        h[i] = sm_bf16_to_f32(v);
      } break;
      default: return sm_err(SMELT_ERR_UNSUPPORTED, "%s: dtype %s not supported", name, sm_dtype_name(t->dtype));
    }
  }
  return SMELT_OK;
}

/* sm_load_vec with every element times mul */
static smelt_status load_vec_mul(smelt_model *m, sm_load_ctx *ts, const char *name, int64_t n_stack, int64_t n0,
                                 float **out, bool optional, const int64_t *perm, float mul) {
  const sm_tensor *t = take(m, ts, name);
  *out = NULL;
  if (!t) return optional ? SMELT_OK : sm_err(SMELT_ERR_FORMAT, "missing tensor %s", name);
  if (n_stack ? (t->ndim != 2 || t->shape[0] != n_stack || t->shape[1] != n0) : (t->ndim != 1 || t->shape[0] != n0)) {
    if (n_stack)
      return sm_err(SMELT_ERR_FORMAT, "%s: shape mismatch, expected [%lld, %lld]", name, (long long)n_stack,
                    (long long)n0);
    return sm_err(SMELT_ERR_FORMAT, "%s: shape mismatch, expected [%lld]", name, (long long)n0);
  }
  const int64_t n = n_stack ? n_stack * n0 : n0;
  float *h = sm_xmalloc(sizeof(float) * (size_t)n);
  smelt_status st = host_floats(t, name, n, h);
  if (st) {
    free(h);
    return st;
  }
  if (perm) {
    float *p = sm_xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = h[perm[i]];
    free(h);
    h = p;
  }
  if (mul != 1.0f)
    for (int64_t i = 0; i < n; i++) h[i] *= mul;
  float *d = m->be->alloc(m->be, sizeof(float) * (size_t)n);
  if (!d) {
    free(h);
    return sm_err(SMELT_ERR_OOM, "out of backend memory");
  }
  m->be->upload(m->be, d, h, sizeof(float) * (size_t)n);
  free(h);
  *out = own(m, d);
  m->weight_bytes += t->nbytes;
  return SMELT_OK;
}

smelt_status sm_load_vec(smelt_model *m, sm_load_ctx *ts, const char *name, int64_t n_stack, int64_t n0, float **out,
                         bool optional, const int64_t *perm) {
  return load_vec_mul(m, ts, name, n_stack, n0, out, optional, perm, 1.0f);
}

smelt_status sm_load_vec_times(smelt_model *m, sm_load_ctx *ts, const char *name, int64_t n, float mul, float **out) {
  return load_vec_mul(m, ts, name, 0, n, out, false, NULL, mul);
}

static smelt_status load_vec(smelt_model *m, sm_load_ctx *ts, const char *name, int64_t n, float **out, bool optional,
                             const int64_t *perm) {
  return sm_load_vec(m, ts, name, 0, n, out, optional, perm);
}

/* does the recipe (with config.json's attention_bias) give this slot a bias */
static bool slot_bias(const smelt_model *m, sm_layer_tensor s) {
  const sm_recipe *r = m->fam->recipe;
  const sm_rec_config *rc = &m->cfg.rec;
  if (s == SM_T_REC_CONV) return rc->conv_bias;
  if (s == SM_T_REC_IN_FUSED || s == SM_T_REC_OUT)
    return (rc->kind == SM_REC_MAMBA2 && rc->m_proj_bias) || (rc->kind == SM_REC_SHORTCONV && rc->conv_bias);
  const bool qkv = s == SM_T_Q || s == SM_T_K || s == SM_T_V || s == SM_T_QKV;
  if (qkv && r->qkv_bias) return true;
  if (!m->cfg.attention_bias) return false;
  return (qkv && r->attn_bias != SM_BIAS_NONE) || (s == SM_T_O && r->attn_bias == SM_BIAS_QKVO);
}

static smelt_status check_recipe(smelt_model *m) {
  const sm_recipe *r = m->fam->recipe;
  const sm_tensor_names *nm = m->fam->names;
  if (r->qk_norm != SM_QK_NORM_NONE && (!nm->t[SM_T_Q_NORM] || !nm->t[SM_T_K_NORM]))
    return sm_err(SMELT_ERR_FORMAT, "family %s: qk_norm without q/k norm tensor names", m->fam->model_type);
  if (!r->mla && !(nm->t[SM_T_QKV] ? 1 : 0) == !(nm->t[SM_T_Q] && nm->t[SM_T_K] && nm->t[SM_T_V]))
    return sm_err(SMELT_ERR_FORMAT, "family %s: names need either qkv or q, k and v", m->fam->model_type);
  const bool dense_mlp = nm->t[SM_T_GATE_UP] || nm->t[SM_T_GATE] || nm->t[SM_T_UP] || nm->t[SM_T_DOWN];
  if ((dense_mlp || !m->fam->moe) &&
      (r->ffn == SM_FFN_PLAIN ? nm->t[SM_T_GATE] || nm->t[SM_T_GATE_UP] || !nm->t[SM_T_UP]
                              : !(nm->t[SM_T_GATE_UP] ? 1 : 0) == !(nm->t[SM_T_GATE] && nm->t[SM_T_UP])))
    return sm_err(SMELT_ERR_FORMAT, "family %s: names need either gate_up or gate and up (a plain MLP: up only)",
                  m->fam->model_type);
  for (int l = 0; !dense_mlp && l < m->cfg.num_hidden_layers; l++)
    if (!m->cfg.moe.moe_layer[l])
      return sm_err(SMELT_ERR_UNSUPPORTED,
                    "%s: layer %d of this %s model would be dense, which the family does not have", m->dir, l,
                    m->fam->model_type);
  if (m->cfg.rec.n_experts > 0 && !m->fam->moe)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s: this %s checkpoint has mixture-of-experts layers, which smelt does not run "
                  "yet (its dense variants run)",
                  m->dir, m->fam->model_type);
  if (m->cfg.rec.kind != SM_REC_NONE) {
    const sm_backend *be = m->be;
    if (!be->copy || !be->mul || !be->sigmoid_mul || !be->relu2 || !be->conv1d || !be->ssm_scan || !be->gated_delta ||
        !be->gated_rmsnorm)
      return sm_err(SMELT_ERR_UNSUPPORTED, "%s: the %s backend has no ops for recurrent layers (model family %s)",
                    m->dir, be->name, m->fam->model_type);
  }
  if (m->cfg.mlp_bias)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: mlp_bias is not supported for model family %s", m->dir,
                  m->fam->model_type);
  smelt_status st = sm_family_act(m->fam, &m->cfg, &m->act);
  if (st) return sm_err(st, "%s: %s", m->dir, sm_errmsg());
  if ((r->ffn == SM_FFN_PLAIN) != (m->act == SM_ACT_RELU2))
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: activation '%s' is not supported for model family %s", m->dir,
                  m->cfg.hidden_act, m->fam->model_type);
  if (r->rope_interleaved && nm->t[SM_T_QKV])
    return sm_err(SMELT_ERR_FORMAT, "family %s: interleaved RoPE needs separate q and k", m->fam->model_type);
  /* per-layer attention shapes (Gemma 4): each KV-shared layer has a layer to read, and the splits of a model
   * over several devices do not know such layers yet */
  const sm_config *c = &m->cfg;
  m->max_q = m->max_kv = m->max_ffn = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    sm_layer_spec sp;
    sm_family_layer_spec(m->fam, c, l, &sp);
    if (sp.kind == SM_LK_ATTN && sp.kv_src < 0)
      return sm_err(SMELT_ERR_FORMAT,
                    "%s: layer %d shares K/V (num_kv_shared_layers %d) but no earlier layer has its kind", m->dir, l,
                    c->kv_shared_layers);
    m->max_q = SM_MAX(m->max_q, c->num_attention_heads * sp.head_dim);
    m->max_kv = SM_MAX(m->max_kv, sp.kv_heads * sp.head_dim);
    m->max_ffn = SM_MAX(m->max_ffn, sp.ffn_dim);
  }
  if (m->tp && m->fam->moe && m->fam->moe->beside_mlp && c->moe.n_experts > 0)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: experts beside the MLP (%s) are not supported split over several devices",
                  m->dir, m->fam->model_type);
  if (sm_family_varied_layers(m->fam, c) && (m->tp || nm->t[SM_T_QKV] || r->rope_interleaved || r->mla))
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s: layers of their own head size or shared K/V (model family %s) are not supported %s", m->dir,
                  m->fam->model_type, m->tp ? "split over several devices" : "with this recipe");
  if (r->per_layer_input && c->ple_dim > 0 && (!nm->ple_embed || !nm->ple_proj || !nm->ple_norm))
    return sm_err(SMELT_ERR_FORMAT, "family %s: per-layer inputs without their tensor names", m->fam->model_type);
  if ((r->per_layer_input && c->ple_dim > 0 && !m->be->gather_rows) || (c->attn_k_eq_v && !m->be->copy))
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: the %s backend lacks the ops of model family %s", m->dir, m->be->name,
                  m->fam->model_type);
  /* q/k norms: the recipe's, or only when config.json's use_qk_norm says so (GLM-4 MoE) */
  m->qk_norm = r->qk_norm_if_config && m->cfg.moe.use_qk_norm != 1 ? SM_QK_NORM_NONE : r->qk_norm;
  if ((st = sm_mla_check(m))) return st;
  return sm_moe_check(m);
}

/* Rows of q or k (heads of hd) in the rotate-half order of interleaved-RoPE weights: within the first
 * rot dims of each head, dim i < rot/2 takes pair i's first element (2i), dim rot/2 + i its second. */
static int64_t *interleave_perm(int64_t rows, int hd, int rot) {
  int64_t *p = sm_xmalloc(sizeof(int64_t) * (size_t)rows);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t h = r / hd;
    const int d = (int)(r % hd), half = rot / 2;
    p[r] = h * hd + (d >= rot ? d : d < half ? 2 * d : 2 * (d - half) + 1);
  }
  return p;
}

/* w becomes n rows of itself (row i = row perm[i] of w), in host memory the model owns */
void sm_load_gather_rows(smelt_model *m, sm_weight *w, const int64_t *perm, int64_t n) {
  const size_t es = sm_dtype_size(w->dtype);
  const size_t rb = w->bits ? (size_t)w->cols * (size_t)w->bits / 8 : (size_t)w->cols * es;
  const size_t gb = w->bits ? (size_t)(w->cols / w->group_size) * es : 0;
  uint8_t *d = host_own(m, sm_xmalloc(rb * (size_t)n));
  uint8_t *sc = gb ? host_own(m, sm_xmalloc(gb * (size_t)n)) : NULL;
  uint8_t *bi = gb && w->biases ? host_own(m, sm_xmalloc(gb * (size_t)n)) : NULL;
  for (int64_t i = 0; i < n; i++) {
    memcpy(d + (size_t)i * rb, (const uint8_t *)w->data + (size_t)perm[i] * rb, rb);
    if (gb) memcpy(sc + (size_t)i * gb, (const uint8_t *)w->scales + (size_t)perm[i] * gb, gb);
    if (bi) memcpy(bi + (size_t)i * gb, (const uint8_t *)w->biases + (size_t)perm[i] * gb, gb);
  }
  w->data = d;
  w->rows = n;
  if (gb) {
    w->scales = sc;
    w->biases = bi;
  }
}
static void permute_weight(smelt_model *m, sm_weight *w, const int64_t *perm) {
  sm_load_gather_rows(m, w, perm, w->rows);
}

void *sm_model_host_own(smelt_model *m, void *p) { return host_own(m, p); }

/* A depthwise convolution's weight as [channels][kernel] floats: MLX checkpoints store [C, K, 1] (the
 * PyTorch layout [C, 1, K] and [C, K] have the same element order) */
static smelt_status load_conv(smelt_model *m, sm_load_ctx *ts, const char *name, int64_t C, int64_t K, float **out) {
  const sm_tensor *t = take(m, ts, name);
  *out = NULL;
  if (!t) return sm_err(SMELT_ERR_FORMAT, "missing tensor %s", name);
  const bool ok = (t->ndim == 3 && t->shape[0] == C &&
                   ((t->shape[1] == K && t->shape[2] == 1) || (t->shape[1] == 1 && t->shape[2] == K))) ||
                  (t->ndim == 2 && t->shape[0] == C && t->shape[1] == K);
  if (!ok)
    return sm_err(SMELT_ERR_FORMAT, "%s: shape mismatch, expected [%lld, %lld, 1]", name, (long long)C, (long long)K);
  float *h = sm_xmalloc(sizeof(float) * (size_t)(C * K));
  for (int64_t i = 0; i < C * K; i++) {
    switch (t->dtype) {
      case SM_DT_F32: memcpy(&h[i], (const char *)t->data + 4 * i, 4); break;
      case SM_DT_F16: {
        uint16_t v;
        memcpy(&v, (const char *)t->data + 2 * i, 2);
        h[i] = sm_f16_to_f32(v);
      } break;
      case SM_DT_BF16: {
        uint16_t v;
        memcpy(&v, (const char *)t->data + 2 * i, 2);
        h[i] = sm_bf16_to_f32(v);
      } break;
      default:
        free(h);
        return sm_err(SMELT_ERR_UNSUPPORTED, "%s: dtype %s not supported", name, sm_dtype_name(t->dtype));
    }
  }
  float *d = m->be->alloc(m->be, sizeof(float) * (size_t)(C * K));
  if (!d) {
    free(h);
    return sm_err(SMELT_ERR_OOM, "out of backend memory");
  }
  m->be->upload(m->be, d, h, sizeof(float) * (size_t)(C * K));
  free(h);
  *out = own(m, d);
  m->weight_bytes += t->nbytes;
  return SMELT_OK;
}

/* Gated attention: q_proj rows per head are q (hd) | gate (hd); rearranged to all q | all gates */
static int64_t *gate_perm(int64_t nq, int hd) {
  int64_t *p = sm_xmalloc(sizeof(int64_t) * (size_t)(2 * nq));
  for (int64_t i = 0; i < 2 * nq; i++) {
    const int64_t j = i % nq, h = j / hd, d = j % hd;
    p[i] = h * 2 * hd + (i >= nq ? hd : 0) + d;
  }
  return p;
}

/* Qwen3-Next's fused Gated DeltaNet projections, grouped per key head, rearranged to whole blocks:
 * in_proj_qkvz (per key head q dk | k dk | v r*dv | z r*dv) to q | k | v | z, and in_proj_ba (per key
 * head b r | a r) to b | a, with r = value heads per key head */
static int64_t *qkvz_perm(const sm_rec_config *rc) {
  const int64_t nk = rc->gdn_k_heads, dk = rc->gdn_k_dim, rdv = (int64_t)rc->gdn_v_heads / nk * rc->gdn_v_dim;
  const int64_t blk = 2 * dk + 2 * rdv, kd = nk * dk, vd = nk * rdv;
  int64_t *p = sm_xmalloc(sizeof(int64_t) * (size_t)(nk * blk));
  for (int64_t h = 0; h < nk; h++) {
    for (int64_t d = 0; d < dk; d++) {
      p[h * dk + d] = h * blk + d;
      p[kd + h * dk + d] = h * blk + dk + d;
    }
    for (int64_t e = 0; e < rdv; e++) {
      p[2 * kd + h * rdv + e] = h * blk + 2 * dk + e;
      p[2 * kd + vd + h * rdv + e] = h * blk + 2 * dk + rdv + e;
    }
  }
  return p;
}
static int64_t *ba_perm(const sm_rec_config *rc) {
  const int64_t nk = rc->gdn_k_heads, r = rc->gdn_v_heads / nk, nv = rc->gdn_v_heads;
  int64_t *p = sm_xmalloc(sizeof(int64_t) * (size_t)(2 * nv));
  for (int64_t h = 0; h < nk; h++)
    for (int64_t i = 0; i < r; i++) {
      p[h * r + i] = h * 2 * r + i;
      p[nv + h * r + i] = h * 2 * r + r + i;
    }
  return p;
}

/* the row views of a fused weight and its bias: n parts of rows[i] rows into slots dst[i] */
static void split_rows(sm_layer *L, sm_layer_tensor fused, int n, const sm_layer_tensor *dst, const int64_t *rows) {
  int64_t r0 = 0;
  for (int i = 0; i < n; i++) {
    L->w[dst[i]] = sm_weight_rows(&L->w[fused], r0, rows[i]);
    if (L->bias[fused]) L->bias[dst[i]] = L->bias[fused] + r0;
    r0 += rows[i];
  }
}

/* the fused projections of a recurrent mixer: row views into the slots the forward uses */
static void split_rec(const smelt_model *m, sm_layer *L) {
  const sm_config *c = &m->cfg;
  const sm_rec_config *rc = &c->rec;
  const int64_t conv = sm_config_rec_conv_dim(c), H = c->hidden_size;
  if (L->w[SM_T_REC_IN_FUSED].data) {
    if (rc->kind == SM_REC_GDN) {
      const int64_t vd = (int64_t)rc->gdn_v_heads * rc->gdn_v_dim;
      split_rows(L, SM_T_REC_IN_FUSED, 2, (const sm_layer_tensor[]){SM_T_REC_IN, SM_T_REC_Z},
                 (const int64_t[]){conv, vd});
    } else if (rc->kind == SM_REC_MAMBA2) {
      const int64_t I = (int64_t)rc->m_heads * rc->m_head_dim;
      split_rows(L, SM_T_REC_IN_FUSED, 3, (const sm_layer_tensor[]){SM_T_REC_Z, SM_T_REC_IN, SM_T_REC_A},
                 (const int64_t[]){I, conv, rc->m_heads});
    } else if (rc->kind == SM_REC_SHORTCONV) {
      split_rows(L, SM_T_REC_IN_FUSED, 3, (const sm_layer_tensor[]){SM_T_REC_B, SM_T_REC_Z, SM_T_REC_IN},
                 (const int64_t[]){H, H, H});
    }
  }
  if (L->w[SM_T_REC_BA_FUSED].data)
    split_rows(L, SM_T_REC_BA_FUSED, 2, (const sm_layer_tensor[]){SM_T_REC_B, SM_T_REC_A},
               (const int64_t[]){rc->gdn_v_heads, rc->gdn_v_heads});
}

static smelt_status read_layer(smelt_model *m, sm_load_ctx *ts, int l) {
  const sm_config *c = &m->cfg;
  const sm_tensor_names *nm = m->fam->names;
  const sm_recipe *r = m->fam->recipe;
  sm_layer *L = &m->layers[l];
  char p[256], n[320];
  smelt_status st;
  sm_family_layer_spec(m->fam, c, l, &L->spec);
  const int64_t hd = L->spec.head_dim, nq = (int64_t)c->num_attention_heads * hd, nkv = (int64_t)L->spec.kv_heads * hd;
  L->scalar = 1.0f;
  snprintf(p, sizeof p, "%s%s%s.%d", m->prefix, m->root, nm->layers, l);
  /* interleaved RoPE: q/k rows (and their biases and norms) in rotate-half order */
  int64_t *perm_q = NULL, *perm_k = NULL, *perm_in = NULL, *perm_ba = NULL;
  if (r->rope_interleaved) {
    perm_q = interleave_perm(nq, (int)hd, c->partial_rotary_dim);
    perm_k = interleave_perm(nkv, (int)hd, c->partial_rotary_dim);
  }
  /* a mixture-of-experts layer (moe.c) has no dense MLP */
  const bool moe = m->fam->moe && c->moe.moe_layer[l] && !m->fam->moe->beside_mlp;
  if (r->attn_out_gate) perm_q = gate_perm(nq, (int)hd);
  if (c->rec.kind == SM_REC_GDN) {
    perm_in = qkvz_perm(&c->rec);
    perm_ba = ba_perm(&c->rec);
  }
  for (int s = 0; s < SM_T_LAYER_COUNT; s++) {
    if (!nm->t[s] || !sm_family_slot_used(m->fam, c, l, (sm_layer_tensor)s)) continue;
    if ((s == SM_T_Q_NORM || s == SM_T_K_NORM) && m->qk_norm == SM_QK_NORM_NONE) continue;
    if (moe && (s == SM_T_GATE || s == SM_T_UP || s == SM_T_DOWN || s == SM_T_GATE_UP)) continue;
    const int64_t *perm = s == SM_T_Q || (s == SM_T_Q_NORM && r->qk_norm == SM_QK_NORM_FULL) ? perm_q
                        : s == SM_T_K || (s == SM_T_K_NORM && r->qk_norm == SM_QK_NORM_FULL) ? perm_k
                        : s == SM_T_REC_IN_FUSED                                             ? perm_in
                        : s == SM_T_REC_BA_FUSED                                             ? perm_ba
                                                                                             : NULL;
    if ((s == SM_T_Q_NORM || s == SM_T_K_NORM) && r->qk_norm == SM_QK_NORM_HEAD && r->rope_interleaved)
      perm = perm_q; /* first hd */
    int64_t rows, cols;
    sm_family_slot_shape(m->fam, c, l, (sm_layer_tensor)s, &rows, &cols);
    snprintf(n, sizeof n, "%s.%s", p, nm->t[s]);
    if (s == SM_T_LAYER_SCALAR) { /* a parameter of one number, read here (no ".weight") */
      const sm_tensor *t = take(m, ts, n);
      if (!t) {
        st = sm_err(SMELT_ERR_FORMAT, "missing tensor %s", n);
        goto out;
      }
      if (t->ndim > 1 || (t->ndim == 1 && t->shape[0] != 1)) {
        st = sm_err(SMELT_ERR_FORMAT, "%s: shape mismatch, expected [1]", n);
        goto out;
      }
      if ((st = host_floats(t, n, 1, &L->scalar))) goto out;
      if (!isfinite(L->scalar)) {
        st = sm_err(SMELT_ERR_FORMAT, "%s is not a finite number", n);
        goto out;
      }
    } else if (s == SM_T_REC_CONV) {
      snprintf(n, sizeof n, "%s.%s.weight", p, nm->t[s]);
      if ((st = load_conv(m, ts, n, rows, cols, &L->vec[s]))) goto out;
      snprintf(n, sizeof n, "%s.%s.bias", p, nm->t[s]);
      if (slot_bias(m, (sm_layer_tensor)s) && (st = load_vec(m, ts, n, rows, &L->bias[s], false, NULL))) goto out;
    } else if (s == SM_T_REC_DT_BIAS || s == SM_T_REC_A_LOG || s == SM_T_REC_D) {
      if ((st = load_vec(m, ts, n, rows, &L->vec[s], false, NULL))) goto out; /* a parameter: no ".weight" */
    } else if (cols) {
      if ((st = load_linear(m, ts, n, rows, cols, &L->w[s], false))) goto out;
      if (perm) permute_weight(m, &L->w[s], perm);
      if (slot_bias(m, (sm_layer_tensor)s)) {
        snprintf(n, sizeof n, "%s.%s.bias", p, nm->t[s]);
        if ((st = load_vec(m, ts, n, rows, &L->bias[s], false, perm))) goto out;
      }
    } else {
      snprintf(n, sizeof n, "%s.%s.weight", p, nm->t[s]);
      if ((st = load_vec(m, ts, n, rows, &L->vec[s], false, perm))) goto out;
    }
  }
  /* fused projections: row views (their biases: offsets into the fused bias) */
  if (nm->t[SM_T_QKV] && L->w[SM_T_QKV].data) {
    const sm_weight *f = &L->w[SM_T_QKV];
    L->w[SM_T_Q] = sm_weight_rows(f, 0, nq);
    L->w[SM_T_K] = sm_weight_rows(f, nq, nkv);
    L->w[SM_T_V] = sm_weight_rows(f, nq + nkv, nkv);
    if (L->bias[SM_T_QKV]) {
      L->bias[SM_T_Q] = L->bias[SM_T_QKV];
      L->bias[SM_T_K] = L->bias[SM_T_QKV] + nq;
      L->bias[SM_T_V] = L->bias[SM_T_QKV] + nq + nkv;
    }
  }
  /* KV-shared layers (Gemma 4): the k/v projections and norms transformers keeps and ignores (mlx-lm's sanitize
   * drops them) */
  if (L->spec.kind == SM_LK_ATTN && L->spec.kv_src != l) {
    const char *drop[] = {"self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm", "self_attn.v_norm"};
    const char *sfx[] = {"weight", "scales", "biases", "bias"};
    for (size_t i = 0; i < SM_ARRAY_LEN(drop); i++)
      for (size_t j = 0; j < SM_ARRAY_LEN(sfx); j++) {
        snprintf(n, sizeof n, "%s.%s.%s", p, drop[i], sfx[j]);
        take(m, ts, n);
      }
  }
  if ((st = sm_moe_load_layer(m, ts, l, p))) goto out;
  if (r->mla && (st = sm_mla_load_layer(m, ts, l, p))) goto out;
  if (nm->t[SM_T_GATE_UP] && !moe && L->w[SM_T_GATE_UP].data) {
    const sm_weight *f = &L->w[SM_T_GATE_UP];
    L->w[SM_T_GATE] = sm_weight_rows(f, 0, L->spec.ffn_dim);
    L->w[SM_T_UP] = sm_weight_rows(f, L->spec.ffn_dim, L->spec.ffn_dim);
  }
  /* gated attention: the q rows and the gate rows of the rearranged q_proj */
  if (r->attn_out_gate && L->w[SM_T_Q].data) {
    const sm_weight f = L->w[SM_T_Q];
    L->w[SM_T_ATTN_GATE] = sm_weight_rows(&f, nq, nq);
    L->w[SM_T_Q] = sm_weight_rows(&f, 0, nq);
    if (L->bias[SM_T_Q]) L->bias[SM_T_ATTN_GATE] = L->bias[SM_T_Q] + nq;
  }
  split_rec(m, L);
  st = SMELT_OK;
out:
  free(perm_q);
  free(perm_k);
  free(perm_in);
  free(perm_ba);
  return st;
}

static smelt_status read_tensors(smelt_model *m, sm_load_ctx *ts) {
  const sm_config *c = &m->cfg;
  const sm_tensor_names *nm = m->fam->names;
  const int64_t H = c->hidden_size;
  smelt_status st;
  char p[256], n[320];
  snprintf(p, sizeof p, "%s%s%s", m->prefix, m->root, nm->embed);
  if ((st = load_linear(m, ts, p, c->vocab_size, H, &m->embed, false))) return st;
  /* as mlx-lm: with tie_word_embeddings the embedding is the LM head, and a lm_head tensor is dropped */
  snprintf(p, sizeof p, "%s%s", m->prefix, nm->lm_head);
  if (c->tie_word_embeddings) {
    const char *sfx[] = {"weight", "scales", "biases"};
    for (size_t i = 0; i < SM_ARRAY_LEN(sfx); i++) {
      snprintf(n, sizeof n, "%s.%s", p, sfx[i]);
      take(m, ts, n);
    }
  } else {
    if ((st = load_linear(m, ts, p, c->vocab_size, H, &m->lm_head, true))) return st;
  }
  if (!m->lm_head.data) m->lm_head = m->embed;
  snprintf(n, sizeof n, "%s%s%s.weight", m->prefix, m->root, nm->final_norm);
  if ((st = load_vec(m, ts, n, H, &m->final_norm, false, NULL))) return st;
  if (m->fam->recipe->per_layer_input && c->ple_dim > 0) { /* Gemma 4's per-layer inputs */
    const int64_t LP = (int64_t)c->num_hidden_layers * c->ple_dim;
    snprintf(n, sizeof n, "%s%s%s", m->prefix, m->root, nm->ple_embed);
    if ((st = load_linear(m, ts, n, c->ple_vocab, LP, &m->ple_embed, false))) return st;
    snprintf(n, sizeof n, "%s%s%s", m->prefix, m->root, nm->ple_proj);
    if ((st = load_linear(m, ts, n, LP, H, &m->ple_proj, false))) return st;
    snprintf(n, sizeof n, "%s%s%s.weight", m->prefix, m->root, nm->ple_norm);
    if ((st = load_vec(m, ts, n, c->ple_dim, &m->ple_norm, false, NULL))) return st;
  }
  m->layers = sm_xcalloc((size_t)c->num_hidden_layers, sizeof(sm_layer));
  for (int l = 0; l < c->num_hidden_layers; l++)
    if ((st = read_layer(m, ts, l))) return st;
  return SMELT_OK;
}

/* names of tensors that checkpoints carry but no family reads (mlx-lm's sanitize drops them): RoPE
 * buffers, and the multi-token-prediction head of Qwen3.5 / Qwen3-Next / Nemotron (a drafter, not part
 * of the forward) */
static bool ignorable(const char *name) {
  return strstr(name, "rotary_emb.inv_freq") != NULL || !strncmp(name, "mtp.", 4) || strstr(name, ".mtp.") != NULL;
}

/* a tensor of the vision tower that a vision-language packaging puts next to the LM */
static bool vision_tensor(const smelt_model *m, const char *name) {
  for (const char *const *s = m->vlm ? m->vlm->skip : NULL; s && *s; s++)
    if (!strncmp(name, *s, strlen(*s))) return true;
  return false;
}

static smelt_status check_all_taken(smelt_model *m, sm_load_ctx *ts) {
  qsort(ts->p, ts->n, sizeof *ts->p, ptr_cmp);
  size_t n_left = 0, n_vision = 0;
  const char *first = NULL;
  for (size_t i = 0; i < sm_st_count(m->st); i++) {
    const sm_tensor *t = sm_st_at(m->st, i);
    if (bsearch(&t, ts->p, ts->n, sizeof *ts->p, ptr_cmp) || ignorable(t->name)) continue;
    if (vision_tensor(m, t->name)) {
      n_vision++;
      continue;
    }
    if (!first) first = t->name;
    n_left++;
  }
  if (n_left)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s: tensor %s (and %zu more) is not used by the %s recipe: this checkpoint has parts smelt does "
                  "not implement for this family",
                  m->dir, first, n_left - 1, m->fam->model_type);
  if (m->vlm && !m->vision && !m->note[0])
    snprintf(m->note, sizeof m->note,
             "%s is a vision-language checkpoint (%s) without %s: smelt runs its text model "
             "(%s)",
             m->dir, m->vlm->model_type, n_vision ? "a vision tower smelt can load" : "vision tensors",
             m->fam->model_type);
  return SMELT_OK;
}

/* the vision tower of a vision-language checkpoint (src/vision); when it cannot be loaded the text
 * model still runs, and the note says why images are refused */
static smelt_status load_vision(smelt_model *m, sm_load_ctx *ts) {
  if (!m->vlm) return SMELT_OK;
  bool any = false;
  for (size_t i = 0; i < sm_st_count(m->st) && !any; i++) any = sm_vision_tensor(sm_st_at(m->st, i)->name);
  if (!any) return SMELT_OK;
  smelt_status st = sm_vision_load(m, ts, &m->vision);
  if (st == SMELT_ERR_OOM || st == SMELT_ERR_BACKEND) return st;
  if (st)
    snprintf(m->note, sizeof m->note, "%s (%s): image input is not available: %.150s", m->dir, m->vlm->model_type,
             sm_errmsg());
  return SMELT_OK;
}

/* vision-language packaging: the LM's tensors are under its prefix (mlx-vlm's and mlx-lm's layout) */
static smelt_status find_packaging(smelt_model *m) {
  m->prefix = "";
  m->root = m->fam->names->root;
  m->vlm = NULL;
  if (!m->cfg.vlm_type[0]) return SMELT_OK;
  m->vlm = sm_vlm_find(m->cfg.vlm_type);
  if (!m->vlm)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s: '%s' is a vision-language checkpoint whose packaging smelt does not know "
                  "(known: %s)",
                  m->dir, m->cfg.vlm_type, sm_vlm_list());
  /* the LM under the packaging's prefix (and root, where it has its own), else at the top level */
  const char *roots[2] = {m->vlm->lm_root ? m->vlm->lm_root : m->fam->names->root, m->fam->names->root};
  const char *prefixes[2] = {m->vlm->lm_prefix, ""};
  char n[320];
  for (int i = 0; i < 2; i++) {
    snprintf(n, sizeof n, "%s%s%s.weight", prefixes[i], roots[i], m->fam->names->embed);
    if (sm_st_find(m->st, n)) {
      m->prefix = prefixes[i];
      m->root = roots[i];
      return SMELT_OK;
    }
  }
  m->prefix = m->vlm->lm_prefix; /* the loader names the missing embedding */
  m->root = roots[0];
  return SMELT_OK;
}

smelt_status sm_model_load_weights(smelt_model *m) {
  smelt_status st = check_recipe(m);
  if (!st) st = find_packaging(m);
  if (st) return st;
  sm_load_ctx ts = {0};
  st = read_tensors(m, &ts);
  if (!st) st = load_vision(m, &ts);
  if (!st) st = check_all_taken(m, &ts);
  free(ts.p);
  /* tensor parallelism: this rank's shard; pipeline parallelism: its layers */
  if (!st && m->tp) st = m->tp->pp ? sm_pp_shard(m) : sm_tp_shard(m);
  if (st) return st;
  /* let the backend upload / repack (fused weights: their row views) */
  if (m->embed.data && (st = m->be->prepare_weight(m->be, &m->embed))) return st;
  if (m->lm_head.data == m->embed.data && m->lm_head.rows == m->embed.rows) m->lm_head.dev = m->embed.dev;
  else if (m->lm_head.data && (st = m->be->prepare_weight(m->be, &m->lm_head))) return st;
  if (m->ple_embed.data && (st = m->be->prepare_weight(m->be, &m->ple_embed))) return st;
  if (m->ple_proj.data && (st = m->be->prepare_weight(m->be, &m->ple_proj))) return st;
  for (int l = 0; l < m->cfg.num_hidden_layers; l++)
    for (int s = 0; s < SM_T_LAYER_COUNT; s++) {
      if (s == SM_T_QKV || s == SM_T_GATE_UP || s == SM_T_REC_IN_FUSED || s == SM_T_REC_BA_FUSED) continue;
      if (m->layers[l].w[s].data && (st = m->be->prepare_weight(m->be, &m->layers[l].w[s]))) return st;
    }
  if ((st = sm_mla_prepare(m))) return st;
  return sm_moe_prepare(m);
}

void sm_model_release_weights(smelt_model *m) {
  sm_backend *be = m->be;
  sm_moe_release(m);
  sm_mla_release(m);
  sm_vision_free(m->vision);
  m->vision = NULL;
  if (m->layers)
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
      for (int s = 0; s < SM_T_LAYER_COUNT; s++)
        if (m->layers[l].w[s].dev) be->release_weight(be, &m->layers[l].w[s]);
  if (m->lm_head.dev && m->lm_head.dev != m->embed.dev) be->release_weight(be, &m->lm_head);
  if (m->embed.dev) be->release_weight(be, &m->embed);
  if (m->ple_embed.dev) be->release_weight(be, &m->ple_embed);
  if (m->ple_proj.dev) be->release_weight(be, &m->ple_proj);
  for (int i = 0; i < m->n_owned; i++) be->free(be, m->owned[i]);
  m->n_owned = 0;
  for (int i = 0; i < m->n_host_owned; i++) free(m->host_owned[i]);
  m->n_host_owned = 0;
}
