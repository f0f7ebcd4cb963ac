/* Loading a vision tower: its config (config.json "vision_config" and the packaging's own fields,
 * preprocessor_config.json / processor_config.json for the image processor) and its tensors in the
 * MLX layout mlx-vlm writes (vision_tower.*, multi_modal_projector.*; Idefics3 / SmolVLM:
 * vision_model.*, connector.*; conv weights channels-last, PyTorch's channels-first layout is also
 * accepted). Dense and MLX-quantized linear weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tokenizer.h"
#include "vision/vit.h"

void *sm_vit_own(sm_vision *v, void *p) {
  v->owned = sm_xrealloc(v->owned, sizeof(void *) * (size_t)(v->n_owned + 1));
  v->owned[v->n_owned++] = p;
  return p;
}
static float *host_own(sm_vision *v, float *p) {
  v->host_owned = sm_xrealloc(v->host_owned, sizeof(float *) * (size_t)(v->n_host_owned + 1));
  v->host_owned[v->n_host_owned++] = p;
  return p;
}

bool sm_vision_tensor(const char *name) {
  return !strncmp(name, "vision_tower.", 13) || !strncmp(name, "multi_modal_projector.", 22) ||
         !strncmp(name, "vision_model.", 13) || !strncmp(name, "connector.", 10);
}

/* ---------------- config ---------------- */
typedef struct {
  const cJSON *o;
  const char *what;
} cfg;

static smelt_status get_int(cfg c, const char *key, int lo, int hi, int def, int *out) {
  const cJSON *v = c.o ? cJSON_GetObjectItemCaseSensitive(c.o, key) : NULL;
  *out = def;
  if (!v || cJSON_IsNull(v)) return SMELT_OK;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
    return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be an integer in [%d, %d]", c.what, key, lo, hi);
  *out = v->valueint;
  return SMELT_OK;
}
static smelt_status get_num(cfg c, const char *key, double def, double *out) {
  const cJSON *v = c.o ? cJSON_GetObjectItemCaseSensitive(c.o, key) : NULL;
  *out = def;
  if (!v || cJSON_IsNull(v)) return SMELT_OK;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be a number", c.what, key);
  *out = v->valuedouble;
  return SMELT_OK;
}
static const char *get_str(cfg c, const char *key, const char *def) {
  const cJSON *v = c.o ? cJSON_GetObjectItemCaseSensitive(c.o, key) : NULL;
  return cJSON_IsString(v) ? v->valuestring : def;
}
/* a list of block indexes (fullatt_block_indexes, deepstack_visual_indexes) */
static smelt_status get_list(cfg c, const char *key, int n_layers, int **out, int *n) {
  const cJSON *v = c.o ? cJSON_GetObjectItemCaseSensitive(c.o, key) : NULL;
  *out = NULL;
  *n = 0;
  if (!v || cJSON_IsNull(v)) return SMELT_OK;
  if (!cJSON_IsArray(v)) return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be a list of block indexes", c.what, key);
  *out = sm_xmalloc(sizeof(int) * (size_t)(cJSON_GetArraySize(v) + 1));
  for (const cJSON *e = v->child; e; e = e->next) {
    if (!cJSON_IsNumber(e) || e->valueint < 0 || e->valueint >= n_layers) {
      free(*out);
      *out = NULL;
      return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" holds %g, not a block index below %d", c.what, key,
                    cJSON_IsNumber(e) ? e->valuedouble : -1.0, n_layers);
    }
    (*out)[(*n)++] = e->valueint;
  }
  return SMELT_OK;
}

/* ---------------- tensors ---------------- */
typedef struct {
  sm_vision *v;
  smelt_model *m;
  sm_load_ctx *ctx;
} ld;

static smelt_status lin(ld *l, const char *name, int64_t rows, int64_t cols, sm_weight *w, float **bias,
                        bool has_bias) {
  smelt_status st = sm_load_linear(l->m, l->ctx, name, 0, rows, cols, w, false);
  if (st) return st;
  if (bias) {
    char n[320];
    snprintf(n, sizeof n, "%s.bias", name);
    if ((st = sm_load_vec(l->m, l->ctx, n, 0, rows, bias, !has_bias, NULL))) return st;
    if (has_bias && !*bias) return sm_err(SMELT_ERR_FORMAT, "missing tensor %s", n);
  }
  return SMELT_OK;
}
static smelt_status vec(ld *l, const char *name, int64_t n, float **out, bool optional) {
  return sm_load_vec(l->m, l->ctx, name, 0, n, out, optional, NULL);
}

static float ld_el(const sm_tensor *t, size_t i) {
  switch (t->dtype) {
    case SM_DT_F32: {
      float f;
      memcpy(&f, (const char *)t->data + 4 * i, 4);
      return f;
    }
    case SM_DT_F16: {
      uint16_t h;
      memcpy(&h, (const char *)t->data + 2 * i, 2);
      return sm_f16_to_f32(h);
    }
    case SM_DT_BF16: {
      uint16_t h;
      memcpy(&h, (const char *)t->data + 2 * i, 2);
      return sm_bf16_to_f32(h);
    }
    default: return 0.f;
  }
}

/* The patch conv weight as [out][k] with columns in (t, y, x, c) order (MLX's channels-last layout, as
 * stored by mlx-vlm); a PyTorch layout (channels after out) is transposed into it. */
static smelt_status patch_conv(ld *l, const char *name, int out, int t, int p, bool *has_bias) {
  sm_vision *v = l->v;
  char n[320];
  snprintf(n, sizeof n, "%s.weight", name);
  const sm_tensor *w = sm_load_take(l->m, l->ctx, n);
  if (!w) return sm_err(SMELT_ERR_FORMAT, "missing tensor %s", n);
  if (w->dtype != SM_DT_F32 && w->dtype != SM_DT_F16 && w->dtype != SM_DT_BF16)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: dtype %s (a dense float conv weight is expected)", n,
                  sm_dtype_name(w->dtype));
  const int k = 3 * t * p * p, nd = t > 1 ? 5 : 4;
  const bool mlx = w->ndim == nd && w->shape[0] == out && w->shape[nd - 1] == 3 && w->shape[nd - 2] == p &&
                   w->shape[nd - 3] == p && (t == 1 || w->shape[1] == t);
  const bool torch = w->ndim == nd && w->shape[0] == out && w->shape[1] == 3 && w->shape[nd - 1] == p &&
                     w->shape[nd - 2] == p && (t == 1 || w->shape[2] == t);
  if (!mlx && !torch)
    return sm_err(SMELT_ERR_FORMAT, "%s: shape does not match a %d-channel conv of %dx%d%s patches to %d features", n,
                  3, p, p, t > 1 ? " x2 frames" : "", out);
  v->patch_k = k;
  sm_weight *pw = &v->patch_w;
  memset(pw, 0, sizeof *pw);
  pw->rows = out;
  pw->cols = k;
  if (mlx) {
    pw->dtype = w->dtype;
    pw->data = w->data;
  } else { /* [out][c][t][y][x] -> [out][t][y][x][c], as float32 */
    float *d = host_own(v, sm_xmalloc(sizeof(float) * (size_t)out * k));
    for (int o = 0; o < out; o++)
      for (int c = 0; c < 3; c++)
        for (int tt = 0; tt < t; tt++)
          for (int y = 0; y < p; y++)
            for (int x = 0; x < p; x++)
              d[(size_t)o * k + (((size_t)tt * p + y) * p + x) * 3 + c] =
                ld_el(w, (size_t)o * k + (((size_t)c * t + tt) * p + y) * p + x);
    pw->dtype = SM_DT_F32;
    pw->data = d;
  }
  v->weight_bytes += w->nbytes;
  snprintf(n, sizeof n, "%s.bias", name);
  *has_bias = sm_st_find(l->m->st, n) != NULL;
  return *has_bias ? vec(l, n, out, &v->patch_b, false) : SMELT_OK;
}

/* all rows of a (possibly quantized) [rows][cols] tensor as float32 on the host */
static float *dense_rows(const sm_weight *w) {
  float *d = sm_xmalloc(sizeof(float) * (size_t)w->rows * w->cols);
  for (int64_t r = 0; r < w->rows; r++) sm_weight_row_f32(w, r, d + (size_t)r * w->cols);
  return d;
}

/* SigLIP's learned position embeddings [npos][hidden] as a backend table */
static smelt_status pos_table(ld *l, const char *name, int npos) {
  sm_vision *v = l->v;
  sm_weight pe;
  smelt_status st = sm_load_linear(l->m, l->ctx, name, 0, npos, v->hidden, &pe, false);
  if (st) return st;
  float *ph = dense_rows(&pe);
  v->pos_embed = v->be->alloc(v->be, sizeof(float) * (size_t)npos * v->hidden);
  if (!v->pos_embed) {
    free(ph);
    return sm_err(SMELT_ERR_OOM, "vision position embeddings");
  }
  sm_vit_own(v, v->pos_embed);
  v->be->upload(v->be, v->pos_embed, ph, sizeof(float) * (size_t)npos * v->hidden);
  free(ph);
  return SMELT_OK;
}

/* SigLIP's embeddings and post-LayerNorm, under root (Gemma 3: "vision_tower.vision_model.", Idefics3:
 * "vision_model."): image_size / patch_size patches a side, learned positions, layer_norm_eps */
static smelt_status siglip_common(ld *l, cfg vc, const char *root, bool *has_bias) {
  sm_vision *v = l->v;
  int image_size;
  double d;
  char n[320];
  smelt_status st;
  if ((st = get_int(vc, "image_size", 1, 1 << 14, 224, &image_size)) || (st = get_num(vc, "layer_norm_eps", 1e-6, &d)))
    return st;
  v->eps = (float)d;
  v->layernorm = true;
  v->side = image_size / v->patch;
  if (v->side * v->patch != image_size)
    return sm_err(SMELT_ERR_FORMAT, "%s: image_size is not a multiple of patch_size", l->m->dir);
  snprintf(n, sizeof n, "%sembeddings.patch_embedding", root);
  if ((st = patch_conv(l, n, v->hidden, 1, v->patch, has_bias))) return st;
  snprintf(n, sizeof n, "%sembeddings.position_embedding", root);
  if ((st = pos_table(l, n, v->side * v->side))) return st;
  snprintf(n, sizeof n, "%spost_layernorm.weight", root);
  if ((st = vec(l, n, v->hidden, &v->post_w, false))) return st;
  snprintf(n, sizeof n, "%spost_layernorm.bias", root);
  return vec(l, n, v->hidden, &v->post_b, false);
}

static smelt_status block(ld *l, const char *p, sm_vit_layer *L) {
  sm_vision *v = l->v;
  const int H = v->hidden, I = v->inter;
  char n[512];
  smelt_status st;
#define NM(fmt) (snprintf(n, sizeof n, "%.200s" fmt, p), n)
  switch (v->kind) {
    case SM_VIT_QWEN25:
    case SM_VIT_QWEN3:
    case SM_VIT_QWEN2:
      if ((st = vec(l, NM("norm1.weight"), H, &L->n1w, false)) || (st = vec(l, NM("norm2.weight"), H, &L->n2w, false)))
        return st;
      if (v->layernorm &&
          ((st = vec(l, NM("norm1.bias"), H, &L->n1b, false)) || (st = vec(l, NM("norm2.bias"), H, &L->n2b, false))))
        return st;
      if ((st = lin(l, NM("attn.qkv"), 3 * H, H, &L->qkv, &L->qb, true)) ||
          (st = lin(l, NM("attn.proj"), H, H, &L->o, &L->ob, true)))
        return st;
      L->q = sm_weight_rows(&L->qkv, 0, H);
      L->k = sm_weight_rows(&L->qkv, H, H);
      L->v = sm_weight_rows(&L->qkv, 2 * H, H);
      L->kb = L->qb + H;
      L->vb = L->qb + 2 * H;
      if (v->gated)
        return (st = lin(l, NM("mlp.gate_proj"), I, H, &L->gate, &L->gateb, true)) ? st
             : (st = lin(l, NM("mlp.up_proj"), I, H, &L->up, &L->upb, true))
               ? st
               : lin(l, NM("mlp.down_proj"), H, I, &L->down, &L->downb, true);
      if (v->kind == SM_VIT_QWEN2)
        return (st = lin(l, NM("mlp.fc1"), I, H, &L->fc1, &L->fc1b, true))
               ? st
               : lin(l, NM("mlp.fc2"), H, I, &L->fc2, &L->fc2b, true);
      if ((st = lin(l, NM("mlp.linear_fc1"), I, H, &L->fc1, &L->fc1b, true))) return st;
      return lin(l, NM("mlp.linear_fc2"), H, I, &L->fc2, &L->fc2b, true);
    case SM_VIT_SIGLIP:
    case SM_VIT_IDEFICS3:
      if ((st = vec(l, NM("layer_norm1.weight"), H, &L->n1w, false)) ||
          (st = vec(l, NM("layer_norm1.bias"), H, &L->n1b, false)) ||
          (st = vec(l, NM("layer_norm2.weight"), H, &L->n2w, false)) ||
          (st = vec(l, NM("layer_norm2.bias"), H, &L->n2b, false)))
        return st;
      if ((st = lin(l, NM("self_attn.q_proj"), H, H, &L->q, &L->qb, true)) ||
          (st = lin(l, NM("self_attn.k_proj"), H, H, &L->k, &L->kb, true)) ||
          (st = lin(l, NM("self_attn.v_proj"), H, H, &L->v, &L->vb, true)) ||
          (st = lin(l, NM("self_attn.out_proj"), H, H, &L->o, &L->ob, true)))
        return st;
      if ((st = lin(l, NM("mlp.fc1"), I, H, &L->fc1, &L->fc1b, true))) return st;
      return lin(l, NM("mlp.fc2"), H, I, &L->fc2, &L->fc2b, true);
    case SM_VIT_PIXTRAL:
      if ((st = vec(l, NM("attention_norm.weight"), H, &L->n1w, false)) ||
          (st = vec(l, NM("ffn_norm.weight"), H, &L->n2w, false)))
        return st;
      if ((st = lin(l, NM("attention.q_proj"), H, H, &L->q, NULL, false)) ||
          (st = lin(l, NM("attention.k_proj"), H, H, &L->k, NULL, false)) ||
          (st = lin(l, NM("attention.v_proj"), H, H, &L->v, NULL, false)) ||
          (st = lin(l, NM("attention.o_proj"), H, H, &L->o, NULL, false)))
        return st;
      if ((st = lin(l, NM("feed_forward.gate_proj"), I, H, &L->gate, NULL, false)) ||
          (st = lin(l, NM("feed_forward.up_proj"), I, H, &L->up, NULL, false)))
        return st;
      return lin(l, NM("feed_forward.down_proj"), H, I, &L->down, NULL, false);
  }
#undef NM
  return SMELT_OK;
}

static smelt_status qwen_merger(ld *l, const char *p, bool post, sm_vit_merger *mg) {
  sm_vision *v = l->v;
  const int H = v->hidden, M = H * v->merge * v->merge;
  char n[320];
  smelt_status st;
  mg->post_norm = post;
  mg->rms = v->kind == SM_VIT_QWEN25;
  /* Qwen2-VL and Qwen2.5-VL: ln_q (LayerNorm / RMSNorm), mlp.0, mlp.2; Qwen3-VL: norm, linear_fc1/2 */
  const bool ln_q = v->kind != SM_VIT_QWEN3;
  const int nd = post ? M : H;
  snprintf(n, sizeof n, "%s%s.weight", p, ln_q ? "ln_q" : "norm");
  if ((st = vec(l, n, nd, &mg->nw, false))) return st;
  if (!mg->rms) {
    snprintf(n, sizeof n, "%s%s.bias", p, ln_q ? "ln_q" : "norm");
    if ((st = vec(l, n, nd, &mg->nb, false))) return st;
  }
  snprintf(n, sizeof n, "%s%s", p, ln_q ? "mlp.0" : "linear_fc1");
  if ((st = lin(l, n, M, M, &mg->fc1, &mg->fc1b, true))) return st;
  snprintf(n, sizeof n, "%s%s", p, ln_q ? "mlp.2" : "linear_fc2");
  return lin(l, n, v->out_dim, M, &mg->fc2, &mg->fc2b, true);
}

/* the 2-D RoPE table: frequency i of a head turns by pos[axis[i]] * inv[i] */
static smelt_status rope_tables(sm_vision *v, double theta) {
  const int hd = v->head_dim, half = hd / 2, q = hd / 4;
  float *inv = sm_xmalloc(sizeof(float) * half);
  int32_t *ax = sm_xmalloc(sizeof(int32_t) * half);
  for (int i = 0; i < half; i++) {
    if (v->kind == SM_VIT_PIXTRAL) { /* 1/theta^(2j/hd): rows use the even j, columns the odd j */
      const int j = i < q ? 2 * i : 2 * (i - q) + 1;
      inv[i] = (float)(1.0 / pow(theta, (double)((float)(2 * j) / (float)hd)));
    } else { /* Qwen: 1/theta^(2j/(hd/2)) for j < hd/4, the same table for rows and columns */
      const int j = i % q;
      inv[i] = 1.0f / powf((float)theta, (float)(2 * j) / (float)half);
    }
    ax[i] = i < q ? 0 : 1;
  }
  v->rope_inv = v->be->alloc(v->be, sizeof(float) * half);
  v->rope_axis = v->be->alloc(v->be, sizeof(int32_t) * half);
  if (!v->rope_inv || !v->rope_axis) {
    free(inv);
    free(ax);
    return sm_err(SMELT_ERR_OOM, "vision RoPE table");
  }
  sm_vit_own(v, v->rope_inv);
  sm_vit_own(v, v->rope_axis);
  v->be->upload(v->be, v->rope_inv, inv, sizeof(float) * half);
  v->be->upload(v->be, v->rope_axis, ax, sizeof(int32_t) * half);
  free(inv);
  free(ax);
  return SMELT_OK;
}

/* the image processor: the family's defaults, then preprocessor_config.json / processor_config.json */
static smelt_status load_proc(sm_vision *v, sm_imgproc_kind kind) {
  sm_imgproc_defaults(kind, &v->proc);
  cJSON *js[2] = {NULL, NULL};
  const char *files[2] = {"preprocessor_config.json", "processor_config.json"};
  smelt_status st = SMELT_OK;
  for (int i = 0; i < 2 && !st; i++) {
    char *path = sm_path_join(v->m->dir, files[i]), *txt = NULL;
    size_t len = 0;
    if (sm_file_exists(path)) {
      if ((st = sm_read_file_max(path, SM_FILE_MAX_JSON, &txt, &len))) {
        free(path);
        break;
      }
      js[i] = cJSON_ParseWithLength(txt, len);
      free(txt);
      if (!js[i]) st = sm_err(SMELT_ERR_FORMAT, "%s: not valid JSON", path);
    }
    free(path);
  }
  if (!st) {
    /* the tower's own patch size when the processor config does not give it */
    if (kind == SM_IMGPROC_QWEN) v->proc.patch = v->patch;
    if (kind == SM_IMGPROC_QWEN) v->proc.merge = v->merge;
    if (kind == SM_IMGPROC_QWEN) v->proc.temporal = v->temporal;
    if (kind == SM_IMGPROC_QWEN && v->kind == SM_VIT_QWEN3) { /* Qwen3-VL's processor class defaults */
      v->proc.min_pixels = 65536;
      v->proc.max_pixels = 16777216;
      for (int c = 0; c < 3; c++) v->proc.mean[c] = v->proc.std[c] = 0.5f;
    }
    if (kind == SM_IMGPROC_PIXTRAL) v->proc.patch = v->patch;
    if ((st = sm_imgproc_parse(js[0], js[1], &v->proc))) st = sm_err(st, "%s: %s", v->m->dir, sm_errmsg());
  }
  /* Idefics3 / SmolVLM: the processor's tokens per frame (processor_config.json) */
  const cJSON *sl = cJSON_IsObject(js[1]) ? cJSON_GetObjectItemCaseSensitive(js[1], "image_seq_len") : NULL;
  const double seq_len = cJSON_IsNumber(sl) ? sl->valuedouble : sl && !cJSON_IsNull(sl) ? -1 : 0;
  cJSON_Delete(js[0]);
  cJSON_Delete(js[1]);
  if (st) return st;
  /* what the tower needs of the processor */
  if (kind == SM_IMGPROC_QWEN &&
      (v->proc.patch != v->patch || v->proc.merge != v->merge || v->proc.temporal != v->temporal))
    return sm_err(SMELT_ERR_FORMAT,
                  "%s: the image processor's patch %d / merge %d / temporal %d differ from the vision "
                  "tower's %d / %d / %d",
                  v->m->dir, v->proc.patch, v->proc.merge, v->proc.temporal, v->patch, v->merge, v->temporal);
  if (kind == SM_IMGPROC_FIXED && (v->proc.height != v->side * v->patch || v->proc.width != v->side * v->patch))
    return sm_err(SMELT_ERR_FORMAT, "%s: the image processor's size %dx%d differs from the vision tower's %d",
                  v->m->dir, v->proc.width, v->proc.height, v->side * v->patch);
  if (kind == SM_IMGPROC_IDEFICS3) {
    /* every frame is a tile: whole patches, whole pixel-shuffle blocks, the processor's token count */
    const int fs = v->proc.tile / v->patch;
    if (fs * v->patch != v->proc.tile || fs % v->merge)
      return sm_err(SMELT_ERR_FORMAT,
                    "%s: the image processor's tiles of %d pixels are not a whole number of %dx%d patch blocks "
                    "(patch %d, scale_factor %d)",
                    v->m->dir, v->proc.tile, v->merge, v->merge, v->patch, v->merge);
    v->mm_side = fs / v->merge;
    const int seq = v->mm_side * v->mm_side;
    if (seq_len && seq_len != seq)
      return sm_err(SMELT_ERR_FORMAT,
                    "%s: processor_config.json's image_seq_len is not the %d tokens a %d-pixel tile gives (patch %d, "
                    "scale_factor %d)",
                    v->m->dir, seq, v->proc.tile, v->patch, v->merge);
  }
  if (kind == SM_IMGPROC_PIXTRAL) {
    /* Mistral 3 resizes to multiples of patch * spatial_merge_size */
    if (v->proc.patch != v->patch && v->proc.patch != v->patch * v->merge)
      return sm_err(SMELT_ERR_FORMAT, "%s: the image processor's patch size %d does not fit the vision tower's %d",
                    v->m->dir, v->proc.patch, v->patch);
    v->proc.patch = v->patch * v->merge;
  }
  return SMELT_OK;
}


static smelt_status load_tower(sm_vision *v, sm_load_ctx *ctx) {
  smelt_model *m = v->m;
  const cJSON *root = m->cfg.json, *vcj = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
  cfg vc = {vcj, "vision_config"}, top = {root, "config.json"};
  ld l = {v, m, ctx};
  smelt_status st;
  char n[320];
  const char *vt = m->cfg.vlm_type;
  v->kind = !strcmp(vt, "qwen2_5_vl") ? SM_VIT_QWEN25
          : !strcmp(vt, "qwen3_vl") || !strcmp(vt, "qwen3_vl_moe") || !strcmp(vt, "qwen3_5") ||
                !strcmp(vt, "qwen3_5_moe")
            ? SM_VIT_QWEN3
          : !strcmp(vt, "qwen2_vl")                           ? SM_VIT_QWEN2
          : !strcmp(vt, "gemma3")                             ? SM_VIT_SIGLIP
          : !strcmp(vt, "mistral3")                           ? SM_VIT_PIXTRAL
          : !strcmp(vt, "idefics3") || !strcmp(vt, "smolvlm") ? SM_VIT_IDEFICS3
                                                              : 0;
  if (!v->kind) return sm_err(SMELT_ERR_UNSUPPORTED, "image input is not supported for %s checkpoints", vt);
  if (!cJSON_IsObject(vcj)) return sm_err(SMELT_ERR_FORMAT, "%s: config.json has no \"vision_config\" object", m->dir);
  const bool q2 = v->kind == SM_VIT_QWEN2, qwen = v->kind == SM_VIT_QWEN25 || v->kind == SM_VIT_QWEN3 || q2;
  const bool idf = v->kind == SM_VIT_IDEFICS3;
  /* Idefics3VisionConfig's defaults (transformers writes only the fields that differ from them); the
   * depth and widths, where the config omits them, from the checkpoint's tensors */
  int d_layers = 0, d_hidden = 0, d_inter = 0;
  if (idf) {
    while (d_layers < 256) {
      snprintf(n, sizeof n, "vision_model.encoder.layers.%d.layer_norm1.weight", d_layers);
      if (!sm_st_find(m->st, n)) break;
      d_layers++;
    }
    const sm_tensor *t = sm_st_find(m->st, "vision_model.embeddings.patch_embedding.weight");
    d_hidden = t && t->ndim == 4 ? (int)t->shape[0] : 1152;
    t = sm_st_find(m->st, "vision_model.encoder.layers.0.mlp.fc1.weight");
    d_inter = t && t->ndim == 2 ? (int)t->shape[0] : 3072;
  }
  /* Qwen2VLVisionConfig: embed_dim wide, mlp_ratio * embed_dim in the MLP; its hidden_size is the LM's */
  double ratio = 4.0;
  if (q2 && (st = get_num(vc, "mlp_ratio", 4.0, &ratio))) return st;
  if (q2) {
    d_layers = 32;
    d_hidden = 1280;
  }
  int in_ch;
  if ((st = get_int(vc, qwen ? "depth" : "num_hidden_layers", 1, 256, d_layers, &v->layers)) ||
      (st = get_int(vc, q2 ? "embed_dim" : "hidden_size", 1, 1 << 16, d_hidden, &v->hidden)) ||
      (st = get_int(vc, qwen ? "num_heads" : "num_attention_heads", 1, 1024, idf || q2 ? 16 : 0, &v->heads)) ||
      (!q2 && (st = get_int(vc, "intermediate_size", 1, 1 << 20, d_inter, &v->inter))) ||
      (st = get_int(vc, "patch_size", 1, 1024,
                    qwen  ? 14
                    : idf ? 32
                          : 16,
                    &v->patch)) ||
      (st = get_int(vc, qwen ? "in_chans" : "num_channels", 1, 16, 3, &in_ch)))
    return sm_err(st, "%s: %s", m->dir, sm_errmsg());
  if (qwen && in_ch == 3 && (st = get_int(vc, "in_channels", 1, 16, 3, &in_ch))) return st;
  if (q2) {
    if (!(ratio > 0) || ratio * v->hidden > (1 << 20))
      return sm_err(SMELT_ERR_FORMAT, "%s: vision_config mlp_ratio %g is out of range", m->dir, ratio);
    v->inter = (int)(v->hidden * ratio);
  }
  if (!v->layers || !v->hidden || !v->heads || !v->inter)
    return sm_err(SMELT_ERR_FORMAT,
                  "%s: vision_config needs depth/num_hidden_layers, hidden_size, heads and "
                  "intermediate_size",
                  m->dir);
  if (in_ch != 3) return sm_err(SMELT_ERR_UNSUPPORTED, "%s: vision input of %d channels (3 expected)", m->dir, in_ch);
  if (v->hidden % v->heads)
    return sm_err(SMELT_ERR_FORMAT, "%s: vision hidden_size %d is not a multiple of heads %d", m->dir, v->hidden,
                  v->heads);
  v->head_dim = v->hidden / v->heads;
  if (v->kind == SM_VIT_PIXTRAL && (st = get_int(vc, "head_dim", 1, 1024, v->head_dim, &v->head_dim))) return st;
  if (v->head_dim * v->heads != v->hidden || v->head_dim % 4)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: vision head_dim %d (a multiple of 4 with heads * head_dim = hidden)",
                  m->dir, v->head_dim);
  v->out_dim = m->cfg.hidden_size;
  v->temporal = 1;
  v->merge = 1;
  const char *want = v->kind == SM_VIT_QWEN25 || v->kind == SM_VIT_PIXTRAL ? "silu"
                   : q2                                                    ? "quick_gelu"
                                                                           : "gelu_pytorch_tanh";
  const char *act = get_str(vc, "hidden_act", want);
  v->gated = v->kind == SM_VIT_QWEN25 || v->kind == SM_VIT_PIXTRAL;
  if (strcmp(act, want) && !(!strcmp(want, "gelu_pytorch_tanh") && !strcmp(act, "gelu_tanh")))
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: vision hidden_act \"%s\" is not supported for %s (%s)", m->dir, act, vt,
                  want);
  double d;
  bool has_bias = false;
  sm_imgproc_kind pk = SM_IMGPROC_QWEN;
  const char *pfx = "vision_tower.";
  switch (v->kind) {
    case SM_VIT_QWEN25:
    case SM_VIT_QWEN3:
    case SM_VIT_QWEN2: {
      int out;
      if ((st = get_int(vc, "spatial_merge_size", 1, 8, 2, &v->merge)) ||
          (st = get_int(vc, "temporal_patch_size", 1, 8, 2, &v->temporal)) ||
          (st = get_int(vc, q2 ? "hidden_size" : "out_hidden_size", 1, 1 << 16, m->cfg.hidden_size, &out)))
        return st;
      if (out != m->cfg.hidden_size)
        return sm_err(SMELT_ERR_FORMAT, "%s: vision out_hidden_size %d differs from the text hidden_size %d", m->dir,
                      out, m->cfg.hidden_size);
      v->layernorm = v->kind != SM_VIT_QWEN25;
      v->eps = 1e-6f;
      if ((st = patch_conv(&l, "vision_tower.patch_embed.proj", v->hidden, v->temporal, v->patch, &has_bias)))
        return st;
      if (v->kind == SM_VIT_QWEN25) {
        int *full, nf;
        if ((st = get_int(vc, "window_size", 1, 1 << 16, 112, &v->window))) return st;
        if ((st = get_list(vc, "fullatt_block_indexes", v->layers, &full, &nf))) return st;
        v->full_layer = sm_xcalloc((size_t)v->layers, sizeof(bool));
        for (int i = 0; i < nf; i++) v->full_layer[full[i]] = true;
        free(full);
        if (v->window % (v->patch * v->merge))
          return sm_err(SMELT_ERR_UNSUPPORTED, "%s: window_size %d is not a multiple of patch * merge", m->dir,
                        v->window);
      } else if (v->kind == SM_VIT_QWEN3) {
        int npos;
        if ((st = get_int(vc, "num_position_embeddings", 1, 1 << 20, 2304, &npos))) return st;
        v->pos_side = (int)lround(sqrt((double)npos));
        if (v->pos_side * v->pos_side != npos)
          return sm_err(SMELT_ERR_FORMAT, "%s: num_position_embeddings %d is not a square", m->dir, npos);
        sm_weight pe;
        if ((st = sm_load_linear(m, ctx, "vision_tower.pos_embed", 0, npos, v->hidden, &pe, false))) return st;
        v->pos_host = host_own(v, dense_rows(&pe));
        if ((st = get_list(vc, "deepstack_visual_indexes", v->layers, &v->deep_layer, &v->n_deep))) return st;
      }
      if ((st = get_num(vc, "rope_theta", 10000.0, &d))) return st;
      if ((st = rope_tables(v, d))) return st;
      pfx = "vision_tower.blocks.";
      if ((st = get_int(top, "image_token_id", 0, m->cfg.vocab_size - 1, 151655, &v->image_token)) ||
          (st = get_int(top, "vision_start_token_id", 0, m->cfg.vocab_size - 1, 151652, &v->vision_start)) ||
          (st = get_int(top, "vision_end_token_id", 0, m->cfg.vocab_size - 1, 151653, &v->vision_end)))
        return st;
      break;
    }
    case SM_VIT_SIGLIP: {
      int mm_tokens;
      if ((st = siglip_common(&l, vc, "vision_tower.vision_model.", &has_bias))) return st;
      cfg tc = {m->cfg.text, "text_config"};
      if ((st = get_int(top, "mm_tokens_per_image", 1, 1 << 20, 256, &mm_tokens)) ||
          (st = get_int(tc, "mm_tokens_per_image", 1, 1 << 20, mm_tokens, &mm_tokens)))
        return st;
      v->mm_side = (int)lround(sqrt((double)mm_tokens));
      if (v->mm_side * v->mm_side != mm_tokens || v->side % v->mm_side)
        return sm_err(SMELT_ERR_FORMAT, "%s: mm_tokens_per_image %d does not pool the %dx%d patch grid", m->dir,
                      mm_tokens, v->side, v->side);
      if ((st = vec(&l, "multi_modal_projector.mm_soft_emb_norm.weight", v->hidden, &v->mm_norm, false))) return st;
      /* mm_input_projection_weight is [vision hidden][text hidden] (an einsum, not a Linear) */
      const sm_tensor *pw = sm_load_take(m, ctx, "multi_modal_projector.mm_input_projection_weight");
      if (!pw || pw->ndim != 2 || pw->shape[0] != v->hidden || pw->shape[1] != v->out_dim ||
          (pw->dtype != SM_DT_F32 && pw->dtype != SM_DT_F16 && pw->dtype != SM_DT_BF16))
        return sm_err(SMELT_ERR_FORMAT,
                      "multi_modal_projector.mm_input_projection_weight: a float [%d, %d] tensor expected", v->hidden,
                      v->out_dim);
      float *t = host_own(v, sm_xmalloc(sizeof(float) * (size_t)v->hidden * v->out_dim));
      for (int r = 0; r < v->out_dim; r++)
        for (int c = 0; c < v->hidden; c++) t[(size_t)r * v->hidden + c] = ld_el(pw, (size_t)c * v->out_dim + r);
      v->mm_proj = (sm_weight){.rows = v->out_dim, .cols = v->hidden, .dtype = SM_DT_F32, .data = t};
      v->weight_bytes += pw->nbytes;
      pfx = "vision_tower.vision_model.encoder.layers.";
      pk = SM_IMGPROC_FIXED;
      if ((st = get_int(top, "image_token_index", 0, m->cfg.vocab_size - 1, 262144, &v->image_token)) ||
          (st = get_int(top, "boi_token_index", 0, m->cfg.vocab_size - 1, 255999, &v->boi)) ||
          (st = get_int(top, "eoi_token_index", 0, m->cfg.vocab_size - 1, 256000, &v->eoi)))
        return st;
      break;
    }
    case SM_VIT_IDEFICS3: {
      if ((st = get_int(top, "scale_factor", 1, 16, 2, &v->merge)) ||
          (st = siglip_common(&l, vc, "vision_model.", &has_bias)) ||
          (st = lin(&l, "connector.modality_projection.proj", v->out_dim, (int64_t)v->hidden * v->merge * v->merge,
                    &v->mm_proj, NULL, false)))
        return st;
      pfx = "vision_model.encoder.layers.";
      pk = SM_IMGPROC_IDEFICS3;
      if ((st = get_int(top, "image_token_id", 0, m->cfg.vocab_size - 1, 128257, &v->image_token))) return st;
      break;
    }
    case SM_VIT_PIXTRAL: {
      int fl, image_size;
      if ((st = get_int(top, "spatial_merge_size", 1, 8, 2, &v->merge)) ||
          (st = get_int(vc, "image_size", 1, 1 << 16, 1024, &image_size)) ||
          (st = get_int(top, "vision_feature_layer", -1 - v->layers, v->layers, -1, &fl)))
        return st;
      v->side = image_size / v->patch; /* max patches per side: the position ids' row stride */
      v->feature_layer = fl < 0 ? v->layers + 1 + fl : fl;
      v->eps = 1e-5f;
      if ((st = get_num(vc, "rope_theta", 10000.0, &d))) return st;
      if ((st = rope_tables(v, d))) return st;
      if ((st = patch_conv(&l, "vision_tower.vision_model.patch_conv", v->hidden, 1, v->patch, &has_bias))) return st;
      if ((st = vec(&l, "vision_tower.vision_model.ln_pre.weight", v->hidden, &v->ln_pre, false))) return st;
      v->proj_eps = m->cfg.rms_norm_eps;
      const char *pact = get_str(top, "projector_hidden_act", "gelu");
      if (strcmp(pact, "gelu"))
        return sm_err(SMELT_ERR_UNSUPPORTED, "%s: projector_hidden_act \"%s\" (gelu expected)", m->dir, pact);
      const cJSON *pb = cJSON_GetObjectItemCaseSensitive(root, "multimodal_projector_bias");
      const bool bias = cJSON_IsTrue(pb);
      const int H = v->hidden, T = v->out_dim;
      if ((st = vec(&l, "multi_modal_projector.norm.weight", H, &v->proj_norm, false))) return st;
      sm_weight mw;
      if ((st = sm_load_linear(m, ctx, "multi_modal_projector.patch_merger.merging_layer", 0, H, 4 * H, &mw, false)))
        return st;
      /* columns c*4 + k (unfold's order) -> k*H + c, so that the input is 4 gathered rows */
      float *dm = dense_rows(&mw), *pm = host_own(v, sm_xmalloc(sizeof(float) * (size_t)H * 4 * H));
      for (int r = 0; r < H; r++)
        for (int c = 0; c < H; c++)
          for (int k = 0; k < 4; k++)
            pm[(size_t)r * 4 * H + (size_t)k * H + c] = dm[(size_t)r * 4 * H + (size_t)c * 4 + k];
      free(dm);
      v->merge_w = (sm_weight){.rows = H, .cols = 4 * H, .dtype = SM_DT_F32, .data = pm};
      if ((st = lin(&l, "multi_modal_projector.linear_1", T, H, &v->lin1, &v->lin1b, bias)) ||
          (st = lin(&l, "multi_modal_projector.linear_2", T, T, &v->lin2, &v->lin2b, bias)))
        return st;
      pfx = "vision_tower.vision_model.transformer.layers.";
      pk = SM_IMGPROC_PIXTRAL;
      if ((st = get_int(top, "image_token_index", 0, m->cfg.vocab_size - 1, 10, &v->image_token))) return st;
      v->img_break = v->img_end = -1; /* from the tokenizer (sm_vision_set_tokenizer) */
      if (v->merge != 2)
        return sm_err(SMELT_ERR_UNSUPPORTED, "%s: spatial_merge_size %d (2 is supported)", m->dir, v->merge);
      break;
    }
  }
  if (v->kind != SM_VIT_SIGLIP && v->kind != SM_VIT_IDEFICS3 && has_bias != (v->kind == SM_VIT_QWEN3))
    return sm_err(SMELT_ERR_FORMAT, "%s: the patch embedding %s a bias", m->dir, has_bias ? "has" : "lacks");
  v->L = sm_xcalloc((size_t)v->layers, sizeof(sm_vit_layer));
  for (int i = 0; i < v->layers; i++) {
    snprintf(n, sizeof n, "%s%d.", pfx, i);
    if ((st = block(&l, n, &v->L[i]))) return st;
  }
  if (qwen) {
    if ((st = qwen_merger(&l, "vision_tower.merger.", false, &v->merger))) return st;
    v->deep = sm_xcalloc((size_t)(v->n_deep ? v->n_deep : 1), sizeof(sm_vit_merger));
    for (int i = 0; i < v->n_deep; i++) {
      snprintf(n, sizeof n, "vision_tower.deepstack_merger_list.%d.", i);
      if ((st = qwen_merger(&l, n, true, &v->deep[i]))) return st;
    }
  }
  if ((st = load_proc(v, pk))) return st;
  if (idf)
    snprintf(v->desc, sizeof v->desc,
             "%s vision tower: %d blocks, %d wide, %d heads, patch %d, tiles of %d, %d tokens a tile", vt, v->layers,
             v->hidden, v->heads, v->patch, v->proc.tile, v->mm_side * v->mm_side);
  else
    snprintf(v->desc, sizeof v->desc, "%s vision tower: %d blocks, %d wide, %d heads, patch %d%s", vt, v->layers,
             v->hidden, v->heads, v->patch, v->kind == SM_VIT_PIXTRAL || v->merge > 1 ? ", 2x2 merge" : "");
  return SMELT_OK;
}

static sm_weight **all_weights(sm_vision *v, int *n) {
  static const size_t lw[] = {offsetof(sm_vit_layer, q),    offsetof(sm_vit_layer, k),   offsetof(sm_vit_layer, v),
                              offsetof(sm_vit_layer, o),    offsetof(sm_vit_layer, fc1), offsetof(sm_vit_layer, fc2),
                              offsetof(sm_vit_layer, gate), offsetof(sm_vit_layer, up),  offsetof(sm_vit_layer, down)};
  sm_weight **p = sm_xmalloc(sizeof(sm_weight *) * ((size_t)v->layers * 9 + 8 + 2 * (size_t)v->n_deep));
  int k = 0;
  for (int i = 0; v->L && i < v->layers; i++)
    for (size_t j = 0; j < SM_ARRAY_LEN(lw); j++) p[k++] = (sm_weight *)((char *)&v->L[i] + lw[j]);
  p[k++] = &v->patch_w;
  p[k++] = &v->merger.fc1;
  p[k++] = &v->merger.fc2;
  p[k++] = &v->mm_proj;
  p[k++] = &v->merge_w;
  p[k++] = &v->lin1;
  p[k++] = &v->lin2;
  for (int i = 0; v->deep && i < v->n_deep; i++) {
    p[k++] = &v->deep[i].fc1;
    p[k++] = &v->deep[i].fc2;
  }
  *n = k;
  return p;
}

smelt_status sm_vision_load(smelt_model *m, sm_load_ctx *ctx, sm_vision **out) {
  *out = NULL;
  sm_vision *v = sm_xcalloc(1, sizeof *v);
  v->m = m;
  v->be = m->be;
  v->cache_max = (size_t)256 << 20;
  const size_t wb0 = m->weight_bytes;
  smelt_status st = load_tower(v, ctx);
  /* the tower's tensors counted apart from the language model's (decode reads only those) */
  v->weight_bytes += m->weight_bytes - wb0;
  m->weight_bytes = wb0;
  int nw = 0;
  sm_weight **ws = st ? NULL : all_weights(v, &nw);
  for (int i = 0; !st && i < nw; i++)
    if (ws[i]->data && (st = v->be->prepare_weight(v->be, ws[i]))) st = sm_err(st, "vision tower: %s", sm_errmsg());
  free(ws);
  if (st) {
    sm_vision_free(v);
    return st;
  }
  *out = v;
  return SMELT_OK;
}

void sm_vision_free(sm_vision *v) {
  if (!v) return;
  sm_backend *be = v->be;
  sm_vit_cache_clear(v);
  int nw = 0;
  sm_weight **ws = all_weights(v, &nw);
  for (int i = 0; i < nw; i++)
    if (ws[i]->dev) be->release_weight(be, ws[i]);
  free(ws);
  for (size_t i = 0; i < SM_ARRAY_LEN(v->buf); i++)
    if (v->buf[i]) be->free(be, v->buf[i]);
  for (size_t i = 0; i < SM_ARRAY_LEN(v->ibuf); i++)
    if (v->ibuf[i]) be->free(be, v->ibuf[i]);
  for (int i = 0; i < v->n_owned; i++) be->free(be, v->owned[i]);
  for (int i = 0; i < v->n_host_owned; i++) free(v->host_owned[i]);
  free(v->owned);
  free(v->host_owned);
  free(v->L);
  free(v->full_layer);
  free(v->deep_layer);
  free(v->deep);
  free(v);
}

void sm_vision_set_tokenizer(sm_vision *v, const smelt_tokenizer *tok) {
  if (v->kind != SM_VIT_PIXTRAL || !tok) return;
  v->img_break = sm_tok_token_id(tok, "[IMG_BREAK]");
  v->img_end = sm_tok_token_id(tok, "[IMG_END]");
}

size_t sm_vision_weight_bytes(const sm_vision *v) { return v ? v->weight_bytes : 0; }
const char *sm_vision_describe(const sm_vision *v) { return v ? v->desc : ""; }
