/* Loading an MLX-format checkpoint directory into a smelt_model. */
#include "model/model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tokenizer/tokenizer.h"

void smelt_model_params_default(smelt_model_params *p) {
  memset(p, 0, sizeof *p);
  p->device = SMELT_DEVICE_AUTO;
}

static void *own(smelt_model *m, void *p) {
  m->owned = sm_xrealloc(m->owned, sizeof(void *) * (size_t)(m->n_owned + 1));
  m->owned[m->n_owned++] = p;
  return p;
}

static bool valid_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }

/* Fill w from "<prefix>.weight" (+ .scales/.biases when quantized), expecting [rows][cols]. */
static smelt_status load_linear(smelt_model *m, const char *prefix, int64_t rows, int64_t cols, sm_weight *w,
                                bool optional) {
  char name[256];
  snprintf(name, sizeof name, "%s.weight", prefix);
  const sm_tensor *tw = sm_st_find(m->st, name);
  memset(w, 0, sizeof *w);
  if (!tw) {
    if (optional) return SMELT_OK;
    return sm_err(SMELT_ERR_FORMAT, "missing tensor %s", name);
  }
  snprintf(name, sizeof name, "%s.scales", prefix);
  const sm_tensor *ts = sm_st_find(m->st, name);
  w->rows = rows;
  w->cols = cols;
  if (!ts) {
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
  const sm_tensor *tb = sm_st_find(m->st, name);
  if (!tb) return sm_err(SMELT_ERR_FORMAT, "%s has .scales but no .biases (only MLX affine quantization is supported)", prefix);
  if (tw->dtype != SM_DT_U32 || tw->ndim != 2 || tw->shape[0] != rows || (tw->shape[1] * 32) % cols != 0)
    return sm_err(SMELT_ERR_FORMAT, "%s.weight: expected packed uint32 [%lld, cols*bits/32] for %lld input features",
                  prefix, (long long)rows, (long long)cols);
  int bits = (int)(tw->shape[1] * 32 / cols);
  if (ts->ndim != 2 || ts->shape[0] != rows || ts->shape[1] <= 0 || cols % ts->shape[1] != 0)
    return sm_err(SMELT_ERR_FORMAT, "%s.scales: bad shape", prefix);
  int gs = (int)(cols / ts->shape[1]);
  if (!valid_bits(bits)) return sm_err(SMELT_ERR_UNSUPPORTED, "%s: %d-bit quantization is not supported", prefix, bits);
  if (gs != 32 && gs != 64 && gs != 128)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: group size %d is not supported (32, 64, 128)", prefix, gs);
  int cbits = 0, cgs = 0;
  sm_config_quant_for(&m->cfg, prefix, &cbits, &cgs);
  if (cbits && (cbits != bits || cgs != gs))
    return sm_err(SMELT_ERR_FORMAT, "%s: tensor shapes imply %d bits / group %d but config.json says %d / %d", prefix,
                  bits, gs, cbits, cgs);
  if (tb->ndim != 2 || tb->shape[0] != ts->shape[0] || tb->shape[1] != ts->shape[1] || tb->dtype != ts->dtype)
    return sm_err(SMELT_ERR_FORMAT, "%s.biases: shape/dtype differs from .scales", prefix);
  if (ts->dtype != SM_DT_F32 && ts->dtype != SM_DT_F16 && ts->dtype != SM_DT_BF16)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s.scales: dtype %s not supported", prefix, sm_dtype_name(ts->dtype));
  w->bits = bits;
  w->group_size = gs;
  w->dtype = ts->dtype;
  w->data = tw->data;
  w->scales = ts->data;
  w->biases = tb->data;
  m->weight_bytes += tw->nbytes + ts->nbytes + tb->nbytes;
  return SMELT_OK;
}

/* A 1-D vector (norm weight, bias) as a float32 backend buffer. */
static smelt_status load_vec(smelt_model *m, const char *name, int64_t n, float **out, bool optional) {
  const sm_tensor *t = sm_st_find(m->st, name);
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

static smelt_status setup_rope(smelt_model *m) {
  const sm_config *c = &m->cfg;
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
    const char *rt = "";
    (void)rt;
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

static smelt_status make_backend(smelt_model *m, const smelt_model_params *p) {
  smelt_device dev = p->device;
  const char *env = getenv("SMELT_DEVICE");
  if (dev == SMELT_DEVICE_AUTO && env) {
    if (!strcmp(env, "cpu")) dev = SMELT_DEVICE_CPU;
    else if (!strcmp(env, "cuda")) dev = SMELT_DEVICE_CUDA;
  }
#ifdef SMELT_HAVE_CUDA
  if (dev == SMELT_DEVICE_AUTO || dev == SMELT_DEVICE_CUDA) {
    m->be = sm_cuda_backend_create(0);
    if (m->be) return SMELT_OK;
    if (dev == SMELT_DEVICE_CUDA) return sm_err(SMELT_ERR_BACKEND, "CUDA backend unavailable: %s", sm_errmsg());
  }
#else
  if (dev == SMELT_DEVICE_CUDA) return sm_err(SMELT_ERR_UNSUPPORTED, "this smelt was built without CUDA");
#endif
  m->be = sm_cpu_backend_create(p->n_threads);
  if (!m->be) return sm_err(SMELT_ERR_BACKEND, "cannot create CPU backend: %s", sm_errmsg());
  return SMELT_OK;
}

static smelt_status load_weights(smelt_model *m) {
  const sm_config *c = &m->cfg;
  int64_t H = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
  int64_t nq = (int64_t)c->num_attention_heads * hd, nkv = (int64_t)c->num_key_value_heads * hd;
  smelt_status st;
  if ((st = load_linear(m, "model.embed_tokens", c->vocab_size, H, &m->embed, false))) return st;
  if ((st = load_linear(m, "lm_head", c->vocab_size, H, &m->lm_head, true))) return st;
  if (!m->lm_head.data) m->lm_head = m->embed; /* tied */
  if ((st = load_vec(m, "model.norm.weight", H, &m->final_norm, false))) return st;
  m->layers = sm_xcalloc((size_t)c->num_hidden_layers, sizeof(sm_layer));
  char p[200], n[256];
  for (int l = 0; l < c->num_hidden_layers; l++) {
    sm_layer *L = &m->layers[l];
    snprintf(p, sizeof p, "model.layers.%d", l);
#define LIN(field, sub, r, cc) do { snprintf(n, sizeof n, "%s.%s", p, sub); \
      if ((st = load_linear(m, n, r, cc, &L->field, false))) return st; } while (0)
#define VEC(field, sub, len, opt) do { snprintf(n, sizeof n, "%s.%s", p, sub); \
      if ((st = load_vec(m, n, len, &L->field, opt))) return st; } while (0)
    LIN(wq, "self_attn.q_proj", nq, H);
    LIN(wk, "self_attn.k_proj", nkv, H);
    LIN(wv, "self_attn.v_proj", nkv, H);
    LIN(wo, "self_attn.o_proj", H, nq);
    LIN(w_gate, "mlp.gate_proj", F, H);
    LIN(w_up, "mlp.up_proj", F, H);
    LIN(w_down, "mlp.down_proj", H, F);
    VEC(attn_norm, "input_layernorm.weight", H, false);
    VEC(ffn_norm, "post_attention_layernorm.weight", H, false);
    bool bias = m->fam->qkv_bias || c->attention_bias;
    VEC(bq, "self_attn.q_proj.bias", nq, !bias);
    VEC(bk, "self_attn.k_proj.bias", nkv, !bias);
    VEC(bv, "self_attn.v_proj.bias", nkv, !bias);
    if (m->fam->qk_norm) {
      VEC(q_norm, "self_attn.q_norm.weight", hd, false);
      VEC(k_norm, "self_attn.k_norm.weight", hd, false);
    }
#undef LIN
#undef VEC
  }
  /* let the backend upload / repack */
  sm_weight *all[] = { &m->embed, &m->lm_head };
  for (size_t i = 0; i < 2; i++) {
    if (i == 1 && m->lm_head.data == m->embed.data) { m->lm_head.dev = m->embed.dev; break; }
    if ((st = m->be->prepare_weight(m->be, all[i]))) return st;
  }
  for (int l = 0; l < c->num_hidden_layers; l++) {
    sm_layer *L = &m->layers[l];
    sm_weight *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
    for (size_t i = 0; i < SM_ARRAY_LEN(ws); i++)
      if ((st = m->be->prepare_weight(m->be, ws[i]))) return st;
  }
  return SMELT_OK;
}

smelt_status smelt_model_load(const char *dir, const smelt_model_params *params, smelt_model **out) {
  smelt_model_params defp;
  if (!params) { smelt_model_params_default(&defp); params = &defp; }
  *out = NULL;
  if (!dir || !sm_dir_exists(dir)) return sm_err(SMELT_ERR_IO, "model directory not found: %s", dir ? dir : "(null)");
  smelt_model *m = sm_xcalloc(1, sizeof *m);
  m->dir = sm_xstrdup(dir);
  smelt_status st = sm_config_load(dir, &m->cfg);
  if (st) { free(m->dir); free(m); return st; }
  m->fam = sm_family_find(m->cfg.model_type);
  if (!m->fam) {
    char list[256] = "";
    for (const char *const *n = sm_family_names(); *n; n++) {
      strncat(list, *n, sizeof list - strlen(list) - 3);
      if (n[1]) strcat(list, ", ");
    }
    st = sm_err(SMELT_ERR_UNSUPPORTED, "unsupported model family '%s' (supported: %s)", m->cfg.model_type, list);
    goto fail;
  }
  if ((st = sm_st_open(dir, &m->st))) goto fail;
  if ((st = make_backend(m, params))) goto fail;
  if ((st = load_weights(m))) goto fail;
  if ((st = setup_rope(m))) goto fail;
  m->max_context = params->max_context > 0 ? params->max_context : SM_MIN(m->cfg.max_position_embeddings, 8192);
  if (m->max_context <= 0) m->max_context = 2048;
  char *tj = sm_path_join(dir, "tokenizer.json");
  if (sm_file_exists(tj)) {
    st = smelt_tokenizer_load(dir, &m->tok);
    if (st) { free(tj); goto fail; }
  }
  free(tj);
  *out = m;
  return SMELT_OK;
fail:
  {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sm_errmsg());
    smelt_model_free(m);
    return sm_err(st, "%s", msg);
  }
}

void smelt_model_free(smelt_model *m) {
  if (!m) return;
  if (m->be) {
    sm_backend *be = m->be;
    if (m->layers) {
      for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        sm_layer *L = &m->layers[l];
        sm_weight *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
        for (size_t i = 0; i < SM_ARRAY_LEN(ws); i++) if (ws[i]->dev) be->release_weight(be, ws[i]);
      }
    }
    if (m->lm_head.dev && m->lm_head.dev != m->embed.dev) be->release_weight(be, &m->lm_head);
    if (m->embed.dev) be->release_weight(be, &m->embed);
    for (int i = 0; i < m->n_owned; i++) be->free(be, m->owned[i]);
    float **scr[] = { &m->x, &m->xb, &m->xb2, &m->q, &m->k, &m->v, &m->att, &m->gate, &m->up, &m->xo, &m->logits };
    for (size_t i = 0; i < SM_ARRAY_LEN(scr); i++) if (*scr[i]) be->free(be, *scr[i]);
    be->destroy(be);
  }
  free(m->owned);
  free(m->layers);
  if (m->tok) smelt_tokenizer_free(m->tok);
  if (m->st) sm_st_close(m->st);
  sm_config_free(&m->cfg);
  free(m->dir);
  free(m);
}

const smelt_tokenizer *smelt_model_tokenizer(const smelt_model *m) { return m->tok; }
int32_t smelt_model_vocab_size(const smelt_model *m) { return m->cfg.vocab_size; }
const char *smelt_model_arch(const smelt_model *m) { return m->cfg.model_type; }

static size_t weight_nbytes(const sm_weight *w) {
  if (!w->data) return 0;
  if (!w->bits) return (size_t)w->rows * (size_t)w->cols * sm_dtype_size(w->dtype);
  return (size_t)w->rows * (size_t)w->cols * (size_t)w->bits / 8 +
         2 * (size_t)w->rows * (size_t)(w->cols / w->group_size) * sm_dtype_size(w->dtype);
}

void smelt_model_get_info(const smelt_model *m, smelt_model_info *info) {
  const sm_config *c = &m->cfg;
  memset(info, 0, sizeof *info);
  info->arch = c->model_type;
  info->backend = m->be ? m->be->name : "";
  info->n_threads = m->be ? m->be->n_threads : 0;
  info->n_layers = c->num_hidden_layers;
  info->hidden = c->hidden_size;
  info->vocab = c->vocab_size;
  info->n_heads = c->num_attention_heads;
  info->n_kv_heads = c->num_key_value_heads;
  info->head_dim = c->head_dim;
  info->max_context = m->max_context;
  info->weight_bytes = m->weight_bytes;
  size_t emb = m->embed.data != m->lm_head.data ? weight_nbytes(&m->embed) : 0;
  info->decode_bytes = m->weight_bytes > emb ? m->weight_bytes - emb : m->weight_bytes;
  info->n_eos = c->n_eos;
  info->eos_ids = c->eos_ids;
  info->bos_id = c->bos_id;
}

double smelt_model_bandwidth(smelt_model *m) {
  return m->be && m->be->measure_bandwidth ? m->be->measure_bandwidth(m->be) : 0;
}

smelt_status sm_kv_alloc(smelt_model *m, int n_blocks, int block_size, sm_kv_cache *kv) {
  memset(kv, 0, sizeof *kv);
  kv->n_layers = m->cfg.num_hidden_layers;
  kv->n_kv_heads = m->cfg.num_key_value_heads;
  kv->head_dim = m->cfg.head_dim;
  kv->block_size = block_size;
  kv->n_blocks = n_blocks;
  kv->k = sm_xcalloc((size_t)kv->n_layers, sizeof(void *));
  kv->v = sm_xcalloc((size_t)kv->n_layers, sizeof(void *));
  size_t bytes = (size_t)n_blocks * block_size * kv->n_kv_heads * kv->head_dim * sizeof(float);
  for (int l = 0; l < kv->n_layers; l++) {
    kv->k[l] = m->be->alloc(m->be, bytes);
    kv->v[l] = m->be->alloc(m->be, bytes);
    if (!kv->k[l] || !kv->v[l]) {
      sm_kv_free(m, kv);
      return sm_err(SMELT_ERR_OOM, "cannot allocate KV cache (%zu MiB)", 2 * bytes * (size_t)m->cfg.num_hidden_layers >> 20);
    }
  }
  return SMELT_OK;
}

void sm_kv_free(smelt_model *m, sm_kv_cache *kv) {
  for (int l = 0; l < kv->n_layers; l++) {
    if (kv->k && kv->k[l]) m->be->free(m->be, kv->k[l]);
    if (kv->v && kv->v[l]) m->be->free(m->be, kv->v[l]);
  }
  free(kv->k);
  free(kv->v);
  memset(kv, 0, sizeof *kv);
}
