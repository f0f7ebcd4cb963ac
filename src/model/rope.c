/* The RoPE frequency tables of a loaded model, one per kind of layer (the model's RoPE, and the local
 * RoPE of sliding-window layers where the recipe has one), computed as transformers'
 * modeling_rope_utils computes them for every rope_type smelt parses: default, linear, llama3,
 * dynamic (NTK), yarn and longrope; mrope is the default RoPE for text positions. The YaRN/longrope
 * attention factor multiplies cos and sin of the rotated dims: with a fully rotated head and one
 * frequency row it is folded into the attention scale (its square), otherwise the layer uses the
 * backend's rope_ext op. Position-dependent frequencies (longrope's long factors and dynamic NTK past
 * the trained length) are rows of the table selected per token (backend.h sm_rope_ext). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/model.h"

/* 1 / theta^(2i/rot) for i < rot/2, as transformers (exponent in float32) */
static void default_inv(double theta, int rot, double *out) {
  for (int i = 0; i < rot / 2; i++) {
    float expo = (float)(2 * i) / (float)rot;
    out[i] = 1.0 / pow(theta, (double)expo);
  }
}

static smelt_status factor_list(const sm_config *c, const char *key, int half, double *out) {
  const cJSON *a = c->rope_params ? cJSON_GetObjectItemCaseSensitive(c->rope_params, key) : NULL;
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != half)
    return sm_err(SMELT_ERR_FORMAT, "rope_scaling %s must be a list of %d numbers (rotary dims / 2)", key, half);
  int i = 0;
  for (const cJSON *e = a->child; e; e = e->next, i++) {
    if (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || !isfinite(e->valuedouble))
      return sm_err(SMELT_ERR_FORMAT, "rope_scaling %s[%d] must be a positive number", key, i);
    out[i] = e->valuedouble;
  }
  return SMELT_OK;
}

static double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* the model's RoPE (rope_theta, rope_scaling): rows of inv (n_rows x half, malloc'd) */
static smelt_status model_rope(const smelt_model *m, sm_rope_tab *t, double **rows_out) {
  const sm_config *c = &m->cfg;
  const int rot = t->rot, half = rot / 2;
  const double theta = c->rope_theta;
  double *inv = sm_xmalloc(sizeof(double) * (size_t)half * 2);
  default_inv(theta, rot, inv);
  t->n_rows = 1;
  t->mscale = 1.0f;
  switch ((sm_rope_type)c->rope_type) {
    case SM_ROPE_NONE: break;
    case SM_ROPE_LINEAR:
      for (int i = 0; i < half; i++) inv[i] /= c->rope_factor;
      break;
    case SM_ROPE_LLAMA3: {
      const double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
      const double old = c->rope_original_max_pos, low_wl = old / lo, high_wl = old / hi;
      for (int i = 0; i < half; i++) {
        double f = inv[i], wl = 2 * M_PI / f;
        if (wl < high_wl) continue;
        if (wl > low_wl) inv[i] = f / factor;
        else {
          double smooth = (old / wl - lo) / (hi - lo);
          inv[i] = (1 - smooth) * f / factor + smooth * f;
        }
      }
      break;
    }
    case SM_ROPE_DYNAMIC: {
      /* _compute_dynamic_ntk_parameters: seq_len = max(seq_len, max_position_embeddings); a token at
     * position p is rotated with seq_len = p + 1 (transformers' decode step); rows past max_pos */
      const int mp = c->max_position_embeddings;
      const int n_rows = m->max_context > mp ? 1 + (m->max_context - mp) : 1;
      inv = sm_xrealloc(inv, sizeof(double) * (size_t)half * (size_t)n_rows);
      for (int r = 1; r < n_rows; r++) {
        const double seq_len = (double)mp + r; /* position mp + r - 1 */
        const double base = theta * pow(c->rope_factor * seq_len / mp - (c->rope_factor - 1), (double)rot / (rot - 2));
        default_inv(base, rot, inv + (size_t)r * half);
      }
      t->n_rows = n_rows;
      t->pos0 = mp;
      t->pos_limit = n_rows > 1 ? m->max_context : 0;
      if (n_rows == 1) t->pos_limit = mp; /* default frequencies only up to max_position_embeddings */
      break;
    }
    case SM_ROPE_YARN: {
      const double factor = c->rope_factor, orig = c->rope_original_max_pos;
      double af = c->rope_attn_factor;
      if (!(af > 0)) {
        if (c->rope_mscale > 0 && c->rope_mscale_all_dim > 0)
          af = yarn_get_mscale(factor, c->rope_mscale) / yarn_get_mscale(factor, c->rope_mscale_all_dim);
        else af = yarn_get_mscale(factor, 1.0);
      }
      const double bf = c->rope_beta_fast, bs = c->rope_beta_slow;
      double lo = rot * log(orig / (bf * 2 * M_PI)) / (2 * log(theta));
      double hi = rot * log(orig / (bs * 2 * M_PI)) / (2 * log(theta));
      if (c->rope_truncate) {
        lo = floor(lo);
        hi = ceil(hi);
      }
      if (lo < 0) lo = 0;
      if (hi > rot - 1) hi = rot - 1;
      if (lo == hi) hi += 0.001;
      for (int i = 0; i < half; i++) {
        double pos_freq = pow(theta, (double)((float)(2 * i) / (float)rot));
        double extra = 1.0 / pos_freq, inter = 1.0 / (factor * pos_freq);
        double ramp = ((double)(float)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double ef = 1.0 - ramp; /* inv_freq_extrapolation_factor */
        inv[i] = inter * (1 - ef) + extra * ef;
      }
      t->mscale = (float)af;
      break;
    }
    case SM_ROPE_PROPORTIONAL: { /* transformers' _compute_proportional_rope_parameters */
      const int angles = (int)floor(c->rope_partial_factor * rot / 2.0);
      for (int i = 0; i < half; i++) inv[i] = i < angles ? inv[i] / c->rope_factor : 0.0;
      break;
    }
    case SM_ROPE_LONGROPE: {
      const int orig = c->rope_original_max_pos;
      double factor = c->rope_factor > 0 ? c->rope_factor : (double)c->max_position_embeddings / orig;
      double af = c->rope_attn_factor;
      if (!(af > 0)) af = factor <= 1.0 ? 1.0 : sqrt(1 + log(factor) / log((double)orig));
      double *sf = sm_xmalloc(sizeof(double) * (size_t)half * 2), *lf = sf + half;
      smelt_status st = factor_list(c, "short_factor", half, sf);
      if (!st) st = factor_list(c, "long_factor", half, lf);
      if (st) {
        free(sf);
        free(inv);
        return st;
      }
      double base[1024];
      default_inv(theta, rot, base);
      /* short factors up to orig, the long ones past it (per position; see the file comment) */
      const int n_rows = m->max_context > orig ? 2 : 1;
      for (int i = 0; i < half; i++) {
        inv[i] = base[i] / sf[i];
        inv[half + i] = base[i] / lf[i];
      }
      free(sf);
      t->n_rows = n_rows;
      t->pos0 = orig;
      t->mscale = (float)af;
      break;
    }
  }
  *rows_out = inv;
  return SMELT_OK;
}

static smelt_status upload(smelt_model *m, sm_rope_tab *t, const double *rows) {
  const size_t n = (size_t)t->n_rows * (size_t)(t->rot / 2);
  float *f = sm_xmalloc(sizeof(float) * n);
  for (size_t i = 0; i < n; i++) f[i] = (float)rows[i];
  t->inv = m->be->alloc(m->be, sizeof(float) * n);
  if (!t->inv) {
    free(f);
    return sm_err(SMELT_ERR_OOM, "out of backend memory");
  }
  m->be->upload(m->be, t->inv, f, sizeof(float) * n);
  sm_model_own(m, t->inv);
  free(f);
  return SMELT_OK;
}

/* M-RoPE (Qwen-VL, rope_scaling "mrope_section"): the position axis (0 temporal, 1 height, 2 width) of
 * each frequency, sections in order ([16, 24, 24]: 16 frequencies of axis 0, ...) or, with
 * "mrope_interleaved" (Qwen3-VL), axes 1 and 2 on every third frequency below 3 * section. Text
 * positions give every axis the same value; the table serves image positions (rope_axes). */
static smelt_status mrope_table(smelt_model *m, int rot) {
  const cJSON *rp = m->cfg.rope_params, *sec = rp ? cJSON_GetObjectItemCaseSensitive(rp, "mrope_section") : NULL;
  if (!sec) return SMELT_OK;
  const int half = rot / 2;
  int s[3], sum = 0;
  if (!cJSON_IsArray(sec) || cJSON_GetArraySize(sec) != 3)
    return sm_err(SMELT_ERR_FORMAT, "%s: mrope_section must list 3 sizes", m->dir);
  for (int i = 0; i < 3; i++) {
    const cJSON *e = cJSON_GetArrayItem(sec, i);
    if (!cJSON_IsNumber(e) || e->valueint < 0)
      return sm_err(SMELT_ERR_FORMAT, "%s: mrope_section[%d] is not a size", m->dir, i);
    sum += (s[i] = e->valueint);
  }
  if (sum != half)
    return sm_err(SMELT_ERR_FORMAT, "%s: mrope_section sums to %d, not rotary dims / 2 = %d", m->dir, sum, half);
  const bool inter = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rp, "mrope_interleaved"));
  int32_t ax[1024];
  for (int i = 0; i < half; i++) {
    if (inter) ax[i] = i % 3 == 1 && i < 3 * s[1] ? 1 : i % 3 == 2 && i < 3 * s[2] ? 2 : 0;
    else ax[i] = i < s[0] ? 0 : i < s[0] + s[1] ? 1 : 2;
  }
  m->mrope_axis = m->be->alloc(m->be, sizeof(int32_t) * (size_t)half);
  if (!m->mrope_axis) return sm_err(SMELT_ERR_OOM, "out of backend memory");
  m->be->upload(m->be, m->mrope_axis, ax, sizeof(int32_t) * (size_t)half);
  sm_model_own(m, m->mrope_axis);
  return SMELT_OK;
}

smelt_status sm_model_setup_rope(smelt_model *m) {
  const sm_config *c = &m->cfg;
  const int rot0 = c->partial_rotary_dim > 0 ? c->partial_rotary_dim : c->head_dim;
  bool used[2] = {false, false};
  int hd[2] = {c->head_dim, c->head_dim}; /* the head size of the layers of each table (Gemma 4: its own) */
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const sm_layer_spec *sp = &m->layers[l].spec;
    if (sp->rope < 0) continue;
    if (used[sp->rope] && hd[sp->rope] != sp->head_dim)
      return sm_err(SMELT_ERR_UNSUPPORTED, "%s: layers of one RoPE with head sizes %d and %d", m->dir, hd[sp->rope],
                    sp->head_dim);
    used[sp->rope] = true;
    hd[sp->rope] = sp->head_dim;
  }
  /* proportional RoPE: the table covers the whole head (its tail frequencies are 0) */
  const bool whole = c->rope_type == SM_ROPE_PROPORTIONAL;
  for (int k = 0; k < 2; k++) {
    const int rot = whole ? hd[k] : rot0;
    if (rot < 2 || rot > hd[k] || rot % 2 || rot / 2 > 1024)
      return sm_err(SMELT_ERR_FORMAT, "bad rotary dimension %d", rot);
    sm_rope_tab *t = &m->ropes[k];
    memset(t, 0, sizeof *t);
    t->rot = rot;
    t->attn_mul = 1.0f;
    t->mscale = 1.0f;
    t->n_rows = 1;
    if (!used[k]) continue;
    double *rows = NULL;
    smelt_status st;
    if (k == 0) {
      if ((st = model_rope(m, t, &rows))) return st;
    } else { /* the local RoPE of sliding layers: default type */
      double theta = m->fam->recipe->local_rope == SM_LOCAL_ROPE_THETA && c->rope_local_theta > 0 ? c->rope_local_theta
                                                                                                  : c->rope_theta;
      rows = sm_xmalloc(sizeof(double) * (size_t)(rot / 2));
      default_inv(theta, rot, rows);
    }
    st = upload(m, t, rows);
    free(rows);
    if (st) return st;
    /* the attention factor: folded into the attention scale when it scales the whole head and the
     * frequencies do not change with the position; else applied by rope_ext */
    if (t->n_rows == 1 && rot == hd[k]) {
      t->attn_mul = t->mscale * t->mscale;
      t->mscale = 1.0f;
    }
    t->ext = t->n_rows > 1 || t->mscale != 1.0f;
  }
  smelt_status mst = mrope_table(m, m->ropes[0].rot);
  if (mst) return mst;
  /* Ministral 3: queries scaled past original_max_position_embeddings (nothing to do below it) */
  m->q_beta = 0;
  if (m->fam->recipe->llama4_scaling && c->rope_llama4_beta > 0 && m->max_context > c->rope_original_max_pos) {
    for (int l = 0; l < c->num_hidden_layers; l++)
      if (m->layers[l].spec.rope < 0)
        return sm_err(SMELT_ERR_UNSUPPORTED, "%s: the Llama-4 query scaling on a layer without RoPE is not supported",
                      m->dir);
    m->q_beta = c->rope_llama4_beta;
    m->q_beta_pos = c->rope_original_max_pos;
  }
  return SMELT_OK;
}

void sm_rope_ext_params(const smelt_model *m, const sm_rope_tab *t, bool query, sm_rope_ext *out) {
  memset(out, 0, sizeof *out);
  out->inv_freq = t->inv;
  out->rot_dim = t->rot;
  out->n_rows = t->n_rows;
  out->pos0 = t->pos0;
  out->mscale = t->mscale;
  if (query && m->q_beta > 0) {
    out->beta = m->q_beta;
    out->beta_pos = m->q_beta_pos;
  }
}
