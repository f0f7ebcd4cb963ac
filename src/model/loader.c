/* Loading a checkpoint's tensors into a smelt_model: the family's tensor names (family.h) are
 * looked up in the safetensors, checked against the config's shapes and quantization, and handed
 * to the backend. Every tensor of the checkpoint must be read by some slot: one that is not (a
 * bias, a norm or a projection the family's recipe does not have) fails the load with its name,
 * so that a checkpoint never runs with part of its weights ignored. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/model.h"

static void *own(smelt_model *m, void *p) {
  m->owned = sm_xrealloc(m->owned, sizeof(void *) * (size_t)(m->n_owned + 1));
  m->owned[m->n_owned++] = p;
  return p;
}

/* the tensors the loader has taken (pointers into the safetensors index) */
typedef struct {
  const sm_tensor **p;
  size_t n, cap;
} taken_set;

static const sm_tensor *take(smelt_model *m, taken_set *ts, const char *name) {
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

static int ptr_cmp(const void *a, const void *b) {
  const void *x = *(const void *const *)a, *y = *(const void *const *)b;
  return x < y ? -1 : x > y;
}

static bool valid_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }

/* Fill w from "<prefix>.weight" (+ .scales/.biases when quantized), expecting [rows][cols]. */
static smelt_status load_linear(smelt_model *m, taken_set *ts, const char *prefix, int64_t rows, int64_t cols,
                                sm_weight *w, bool optional) {
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
  w->rows = rows;
  w->cols = cols;
  if (!tsc) {
    if (tw->dtype != SM_DT_F32 && tw->dtype != SM_DT_F16 && tw->dtype != SM_DT_BF16)
      return sm_err(SMELT_ERR_UNSUPPORTED, "%s.weight: dtype %s is not supported for dense weights (no .scales found)",
                    prefix, sm_dtype_name(tw->dtype));
    if (tw->ndim != 2 || tw->shape[0] != rows || tw->shape[1] != cols)
      return sm_err(SMELT_ERR_FORMAT, "%s.weight: shape mismatch, expected [%lld, %lld]", prefix, (long long)rows,
                    (long long)cols);
    w->bits = 0;
    w->dtype = tw->dtype;
    w->data = tw->data;
    m->weight_bytes += tw->nbytes;
    return SMELT_OK;
  }
  snprintf(name, sizeof name, "%s.biases", prefix);
  const sm_tensor *tb = take(m, ts, name);
  if (!tb)
    return sm_err(SMELT_ERR_FORMAT, "%s has .scales but no .biases (only MLX affine quantization is supported)", prefix);
  if (tw->dtype != SM_DT_U32 || tw->ndim != 2 || tw->shape[0] != rows || (tw->shape[1] * 32) % cols != 0)
    return sm_err(SMELT_ERR_FORMAT, "%s.weight: expected packed uint32 [%lld, cols*bits/32] for %lld input features",
                  prefix, (long long)rows, (long long)cols);
  int bits = (int)(tw->shape[1] * 32 / cols);
  if (tsc->ndim != 2 || tsc->shape[0] != rows || tsc->shape[1] <= 0 || cols % tsc->shape[1] != 0)
    return sm_err(SMELT_ERR_FORMAT, "%s.scales: bad shape", prefix);
  int gs = (int)(cols / tsc->shape[1]);
  if (!valid_bits(bits)) return sm_err(SMELT_ERR_UNSUPPORTED, "%s: %d-bit quantization is not supported", prefix, bits);
  if (gs != 32 && gs != 64 && gs != 128)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: group size %d is not supported (32, 64, 128)", prefix, gs);
  int cbits = 0, cgs = 0;
  sm_config_quant_for(&m->cfg, prefix, &cbits, &cgs);
  if (cbits && (cbits != bits || cgs != gs))
    return sm_err(SMELT_ERR_FORMAT, "%s: tensor shapes imply %d bits / group %d but config.json says %d / %d", prefix,
                  bits, gs, cbits, cgs);
  if (tb->ndim != 2 || tb->shape[0] != tsc->shape[0] || tb->shape[1] != tsc->shape[1] || tb->dtype != tsc->dtype)
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

/* A 1-D vector (norm weight, bias) as a float32 backend buffer. */
static smelt_status load_vec(smelt_model *m, taken_set *ts, const char *name, int64_t n, float **out, bool optional) {
  const sm_tensor *t = take(m, ts, name);
  *out = NULL;
  if (!t) return optional ? SMELT_OK : sm_err(SMELT_ERR_FORMAT, "missing tensor %s", name);
  if (t->ndim != 1 || t->shape[0] != n)
    return sm_err(SMELT_ERR_FORMAT, "%s: shape mismatch, expected [%lld]", name, (long long)n);
  float *h = sm_xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    switch (t->dtype) {
    case SM_DT_F32: memcpy(&h[i], (const char *)t->data + 4 * i, 4); break;
    case SM_DT_F16: { uint16_t v; memcpy(&v, (const char *)t->data + 2 * i, 2); h[i] = sm_f16_to_f32(v); } break;
    case SM_DT_BF16: { uint16_t v; memcpy(&v, (const char *)t->data + 2 * i, 2); h[i] = sm_bf16_to_f32(v); } break;
    default: free(h); return sm_err(SMELT_ERR_UNSUPPORTED, "%s: dtype %s not supported", name, sm_dtype_name(t->dtype));
    }
  }
  float *d = m->be->alloc(m->be, sizeof(float) * (size_t)n);
  if (!d) { free(h); return sm_err(SMELT_ERR_OOM, "out of backend memory"); }
  m->be->upload(m->be, d, h, sizeof(float) * (size_t)n);
  free(h);
  *out = own(m, d);
  m->weight_bytes += t->nbytes;
  return SMELT_OK;
}

/* the [rows, cols] of a layer matrix, or the length of a layer vector (cols = 0) */
static void slot_shape(const sm_config *c, sm_layer_tensor s, int64_t *rows, int64_t *cols) {
  const int64_t H = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
  const int64_t nq = (int64_t)c->num_attention_heads * hd, nkv = (int64_t)c->num_key_value_heads * hd;
  *cols = 0;
  switch (s) {
  case SM_T_ATTN_NORM: case SM_T_FFN_NORM: *rows = H; break;
  case SM_T_Q_NORM: case SM_T_K_NORM: *rows = hd; break;
  case SM_T_Q: *rows = nq; *cols = H; break;
  case SM_T_K: case SM_T_V: *rows = nkv; *cols = H; break;
  case SM_T_O: *rows = H; *cols = nq; break;
  case SM_T_GATE: case SM_T_UP: *rows = F; *cols = H; break;
  case SM_T_DOWN: *rows = H; *cols = F; break;
  case SM_T_LAYER_COUNT: *rows = 0; break;
  }
}

/* does the recipe give this slot a bias */
static bool slot_bias(const smelt_model *m, sm_layer_tensor s) {
  const bool qkv = m->fam->recipe->qkv_bias || m->cfg.attention_bias;
  return qkv && (s == SM_T_Q || s == SM_T_K || s == SM_T_V);
}

static smelt_status check_recipe(const smelt_model *m) {
  const sm_recipe *r = m->fam->recipe;
  const sm_tensor_names *nm = m->fam->names;
  if (r->qk_norm && (!nm->t[SM_T_Q_NORM] || !nm->t[SM_T_K_NORM]))
    return sm_err(SMELT_ERR_FORMAT, "family %s: qk_norm without q/k norm tensor names", m->fam->model_type);
  if (m->cfg.mlp_bias)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: mlp_bias is not supported for model family %s", m->dir,
                  m->fam->model_type);
  if (strcmp(m->cfg.hidden_act, "silu") && strcmp(m->cfg.hidden_act, "swish"))
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported for model family %s", m->dir,
                  m->cfg.hidden_act, m->fam->model_type);
  return SMELT_OK;
}

static smelt_status read_tensors(smelt_model *m, taken_set *ts) {
  const sm_config *c = &m->cfg;
  const sm_tensor_names *nm = m->fam->names;
  const int64_t H = c->hidden_size;
  smelt_status st;
  char p[256], n[320];
  snprintf(p, sizeof p, "%s%s", nm->root, nm->embed);
  if ((st = load_linear(m, ts, p, c->vocab_size, H, &m->embed, false))) return st;
  /* as mlx-lm: with tie_word_embeddings the embedding is the LM head, and a lm_head tensor is dropped */
  if (c->tie_word_embeddings) {
    snprintf(n, sizeof n, "%s.weight", nm->lm_head);
    take(m, ts, n);
    snprintf(n, sizeof n, "%s.scales", nm->lm_head);
    take(m, ts, n);
    snprintf(n, sizeof n, "%s.biases", nm->lm_head);
    take(m, ts, n);
  } else {
    if ((st = load_linear(m, ts, nm->lm_head, c->vocab_size, H, &m->lm_head, true))) return st;
  }
  if (!m->lm_head.data) m->lm_head = m->embed;
  snprintf(n, sizeof n, "%s%s.weight", nm->root, nm->final_norm);
  if ((st = load_vec(m, ts, n, H, &m->final_norm, false))) return st;
  m->layers = sm_xcalloc((size_t)c->num_hidden_layers, sizeof(sm_layer));
  for (int l = 0; l < c->num_hidden_layers; l++) {
    sm_layer *L = &m->layers[l];
    sm_family_layer_spec(m->fam, c, l, &L->spec);
    snprintf(p, sizeof p, "%s%s.%d", nm->root, nm->layers, l);
    for (int s = 0; s < SM_T_LAYER_COUNT; s++) {
      if (!nm->t[s]) continue;
      if ((s == SM_T_Q_NORM || s == SM_T_K_NORM) && !m->fam->recipe->qk_norm) continue;
      int64_t rows, cols;
      slot_shape(c, (sm_layer_tensor)s, &rows, &cols);
      snprintf(n, sizeof n, "%s.%s", p, nm->t[s]);
      if (cols) {
        if ((st = load_linear(m, ts, n, rows, cols, &L->w[s], false))) return st;
        if (slot_bias(m, (sm_layer_tensor)s)) {
          snprintf(n, sizeof n, "%s.%s.bias", p, nm->t[s]);
          if ((st = load_vec(m, ts, n, rows, &L->bias[s], false))) return st;
        }
      } else {
        snprintf(n, sizeof n, "%s.%s.weight", p, nm->t[s]);
        if ((st = load_vec(m, ts, n, rows, &L->vec[s], false))) return st;
      }
    }
  }
  return SMELT_OK;
}

/* names of tensors that checkpoints carry but no family reads (mlx-lm's sanitize drops them) */
static bool ignorable(const char *name) {
  return strstr(name, "rotary_emb.inv_freq") != NULL;
}

static smelt_status check_all_taken(smelt_model *m, taken_set *ts) {
  qsort(ts->p, ts->n, sizeof *ts->p, ptr_cmp);
  size_t n_left = 0;
  const char *first = NULL;
  for (size_t i = 0; i < sm_st_count(m->st); i++) {
    const sm_tensor *t = sm_st_at(m->st, i);
    if (bsearch(&t, ts->p, ts->n, sizeof *ts->p, ptr_cmp) || ignorable(t->name)) continue;
    if (!first) first = t->name;
    n_left++;
  }
  if (n_left)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s: tensor %s (and %zu more) is not used by the %s recipe: this checkpoint has parts smelt does "
                  "not implement for this family", m->dir, first, n_left - 1, m->fam->model_type);
  return SMELT_OK;
}

smelt_status sm_model_load_weights(smelt_model *m) {
  smelt_status st = check_recipe(m);
  if (st) return st;
  taken_set ts = { 0 };
  st = read_tensors(m, &ts);
  if (!st) st = check_all_taken(m, &ts);
  free(ts.p);
  if (st) return st;
  /* let the backend upload / repack */
  if ((st = m->be->prepare_weight(m->be, &m->embed))) return st;
  if (m->lm_head.data == m->embed.data) m->lm_head.dev = m->embed.dev;
  else if ((st = m->be->prepare_weight(m->be, &m->lm_head))) return st;
  for (int l = 0; l < m->cfg.num_hidden_layers; l++)
    for (int s = 0; s < SM_T_LAYER_COUNT; s++)
      if (m->layers[l].w[s].data && (st = m->be->prepare_weight(m->be, &m->layers[l].w[s]))) return st;
  return SMELT_OK;
}

void sm_model_release_weights(smelt_model *m) {
  sm_backend *be = m->be;
  if (m->layers)
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
      for (int s = 0; s < SM_T_LAYER_COUNT; s++)
        if (m->layers[l].w[s].dev) be->release_weight(be, &m->layers[l].w[s]);
  if (m->lm_head.dev && m->lm_head.dev != m->embed.dev) be->release_weight(be, &m->lm_head);
  if (m->embed.dev) be->release_weight(be, &m->embed);
  for (int i = 0; i < m->n_owned; i++) be->free(be, m->owned[i]);
  m->n_owned = 0;
}

smelt_status sm_model_setup_rope(smelt_model *m) {
  const sm_config *c = &m->cfg;
  static const char *const unsupported[] = {
    [SM_ROPE_DYNAMIC] = "dynamic", [SM_ROPE_YARN] = "yarn", [SM_ROPE_LONGROPE] = "longrope",
  };
  if (c->rope_type < (int)SM_ARRAY_LEN(unsupported) && unsupported[c->rope_type])
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: rope_scaling type '%s' is not supported yet", m->dir,
                  unsupported[c->rope_type]);
  int rot = c->partial_rotary_dim > 0 ? c->partial_rotary_dim : c->head_dim;
  if (rot <= 0 || rot > c->head_dim || rot % 2) return sm_err(SMELT_ERR_FORMAT, "bad rotary dimension %d", rot);
  m->rot_dim = rot;
  int half = rot / 2;
  float *f = sm_xmalloc(sizeof(float) * (size_t)half);
  double theta = c->rope_theta > 0 ? c->rope_theta : 10000.0;
  for (int i = 0; i < half; i++) {
    /* as transformers: 1 / base^(2i/dim), computed in float32 */
    float expo = (float)(2 * i) / (float)rot;
    double freq = 1.0 / pow(theta, (double)expo);
    if (c->rope_type == SM_ROPE_LINEAR && c->rope_factor > 0) freq /= c->rope_factor;
    else if (c->rope_type == SM_ROPE_LLAMA3 && c->rope_factor > 0) {
      double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
      double old = c->rope_original_max_pos;
      double low_wl = old / lo, high_wl = old / hi, wl = 2 * M_PI / freq;
      if (wl < high_wl) { /* keep */
      } else if (wl > low_wl) freq = freq / factor;
      else {
        double smooth = (old / wl - lo) / (hi - lo);
        freq = (1 - smooth) * freq / factor + smooth * freq;
      }
    }
    f[i] = (float)freq;
  }
  m->inv_freq = m->be->alloc(m->be, sizeof(float) * (size_t)half);
  if (!m->inv_freq) { free(f); return sm_err(SMELT_ERR_OOM, "out of backend memory"); }
  m->be->upload(m->be, m->inv_freq, f, sizeof(float) * (size_t)half);
  own(m, m->inv_freq);
  free(f);
  return SMELT_OK;
}
