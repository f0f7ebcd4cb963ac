/* The family registry (family.h): the list of entries, lookups, and what a recipe gives each layer
 * (window, RoPE), each slot (shape) and the activation. Each entry is defined in its fam_*.c file. */
#include "model/family.h"
#include <string.h>

extern const sm_family sm_family_llama, sm_family_mistral, sm_family_ministral3, sm_family_smollm3, sm_family_granite,
  sm_family_qwen2, sm_family_qwen3, sm_family_qwen2_5_vl_text, sm_family_qwen3_vl_text, sm_family_qwen2_vl_text,
  sm_family_gemma, sm_family_gemma2, sm_family_gemma3_text, sm_family_phi3, sm_family_olmo2, sm_family_olmo3,
  sm_family_exaone4, sm_family_glm4, sm_family_cohere2, sm_family_gemma4_text, sm_family_qwen3_moe, sm_family_qwen2_moe,
  sm_family_mixtral, sm_family_gpt_oss, sm_family_glm4_moe, sm_family_deepseek_v3, sm_family_glm4_moe_lite,
  sm_family_lfm2, sm_family_lfm2_moe, sm_family_nemotron_h, sm_family_granitemoehybrid, sm_family_qwen3_5_text,
  sm_family_qwen3_next, sm_family_qwen3_5_moe_text, sm_family_qwen3_vl_moe_text;
extern const sm_vlm_packaging sm_vlm_gemma3, sm_vlm_mistral3, sm_vlm_qwen2_5_vl, sm_vlm_qwen3_vl, sm_vlm_gemma4,
  sm_vlm_qwen3_5, sm_vlm_qwen3_5_moe, sm_vlm_idefics3, sm_vlm_smolvlm, sm_vlm_qwen2_vl, sm_vlm_qwen3_vl_moe;

static const sm_family *const g_families[] = {
  &sm_family_llama,
  &sm_family_mistral,
  &sm_family_ministral3,
  &sm_family_qwen2,
  &sm_family_qwen3,
  &sm_family_gemma,
  &sm_family_gemma2,
  &sm_family_gemma3_text,
  &sm_family_phi3,
  &sm_family_smollm3,
  &sm_family_olmo2,
  &sm_family_olmo3,
  &sm_family_granite,
  &sm_family_glm4,
  &sm_family_exaone4,
  &sm_family_cohere2,
  &sm_family_qwen2_5_vl_text,
  &sm_family_qwen3_vl_text,
  &sm_family_qwen2_vl_text,
  /* mixtures of experts (fam_moe.c) */
  &sm_family_qwen3_moe,
  &sm_family_qwen3_vl_moe_text,
  &sm_family_qwen2_moe,
  &sm_family_mixtral,
  &sm_family_gpt_oss,
  &sm_family_glm4_moe,
  &sm_family_deepseek_v3,
  &sm_family_glm4_moe_lite,
  /* hybrid (recurrent + attention) families */
  &sm_family_qwen3_5_text,
  &sm_family_qwen3_next,
  &sm_family_qwen3_5_moe_text,
  &sm_family_lfm2,
  &sm_family_lfm2_moe,
  &sm_family_nemotron_h,
  &sm_family_granitemoehybrid,
  /* known configs, not runnable */
  &sm_family_gemma4_text,
};

static const sm_vlm_packaging *const g_vlms[] = {
  &sm_vlm_gemma3,      &sm_vlm_mistral3, &sm_vlm_qwen2_5_vl, &sm_vlm_qwen3_vl, &sm_vlm_gemma4,       &sm_vlm_qwen3_5,
  &sm_vlm_qwen3_5_moe, &sm_vlm_idefics3, &sm_vlm_smolvlm,    &sm_vlm_qwen2_vl, &sm_vlm_qwen3_vl_moe,
};

const sm_family *sm_family_find(const char *model_type) {
  if (!model_type) return NULL;
  for (size_t i = 0; i < SM_ARRAY_LEN(g_families); i++) {
    const sm_family *f = g_families[i];
    if (!strcmp(f->model_type, model_type)) return f;
    for (const char *const *a = f->aliases; a && *a; a++)
      if (!strcmp(*a, model_type)) return f;
  }
  return NULL;
}

const sm_family *sm_family_runnable(const char *model_type) {
  const sm_family *f = sm_family_find(model_type);
  return f && f->names && f->recipe ? f : NULL;
}

bool sm_family_type_runnable(const char *model_type) {
  if (sm_family_runnable(model_type)) return true;
  const sm_vlm_packaging *v = sm_vlm_find(model_type);
  return v && v->defaults && sm_family_runnable(v->defaults->text_type);
}

const sm_family *const *sm_family_all(size_t *n) {
  *n = SM_ARRAY_LEN(g_families);
  return g_families;
}

const sm_vlm_packaging *const *sm_vlm_all(size_t *n) {
  *n = SM_ARRAY_LEN(g_vlms);
  return g_vlms;
}

const sm_vlm_packaging *sm_vlm_find(const char *model_type) {
  for (size_t i = 0; model_type && i < SM_ARRAY_LEN(g_vlms); i++)
    if (!strcmp(g_vlms[i]->model_type, model_type)) return g_vlms[i];
  return NULL;
}

const char *sm_vlm_list(void) {
  static char list[256];
  if (!list[0])
    for (size_t i = 0; i < SM_ARRAY_LEN(g_vlms); i++) {
      if (list[0]) strncat(list, ", ", sizeof list - strlen(list) - 1);
      strncat(list, g_vlms[i]->model_type, sizeof list - strlen(list) - 1);
    }
  return list;
}

const sm_config_defaults *sm_family_defaults(const char *model_type) {
  const sm_family *f = sm_family_find(model_type);
  if (f) return f->defaults;
  const sm_vlm_packaging *v = sm_vlm_find(model_type);
  return v ? v->defaults : NULL;
}

smelt_status sm_family_config_load(const char *model_dir, sm_config *out) {
  return sm_config_load(model_dir, sm_family_defaults, out);
}

const char *sm_family_runnable_list(void) {
  static char list[512];
  if (!list[0])
    for (size_t i = 0; i < SM_ARRAY_LEN(g_families); i++) {
      if (!g_families[i]->recipe) continue;
      if (list[0]) strncat(list, ", ", sizeof list - strlen(list) - 1);
      strncat(list, g_families[i]->model_type, sizeof list - strlen(list) - 1);
    }
  return list;
}

static bool layer_rotates(const sm_recipe *r, const sm_config *c, int l, bool sliding) {
  switch (r->rope) {
    case SM_ROPE_ALL: return true;
    case SM_ROPE_SLIDING_ONLY: return sliding && c->sliding_window > 0;
    case SM_ROPE_GLOBAL_NOPE: return c->sliding_window == 0 || sliding;
    case SM_ROPE_LIST:
      if (c->has_no_rope_layers) return c->layer_rope[l] != 0;
      return c->no_rope_layer_interval <= 0 || (l + 1) % c->no_rope_layer_interval != 0;
  }
  return true;
}

static bool layer_sliding(const sm_recipe *r, const sm_config *c, int layer) {
  bool sliding = false;
  switch (r->window) {
    case SM_WIN_NONE: break;
    case SM_WIN_ALL: sliding = c->sliding_window > 0; break;
    case SM_WIN_PATTERN:
      if (c->has_layer_types) sliding = c->layer_sliding[layer];
      else sliding = c->sliding_window_pattern > 0 && (layer + 1) % c->sliding_window_pattern != 0;
      break;
    case SM_WIN_NOPE:
      if (c->has_layer_types) sliding = c->layer_sliding[layer];
      else sliding = c->use_sliding_window && c->sliding_window > 0 && !layer_rotates(r, c, layer, false);
      break;
    case SM_WIN_FROM_LAYER:
      if (c->has_layer_types) sliding = c->layer_sliding[layer];
      else sliding = c->use_sliding_window && c->sliding_window > 0 && layer >= c->max_window_layers;
      break;
  }
  return sliding;
}

void sm_family_layer_spec(const sm_family *f, const sm_config *c, int layer, sm_layer_spec *out) {
  const sm_recipe *r = f->recipe;
  memset(out, 0, sizeof *out);
  const bool sliding = layer_sliding(r, c, layer);
  out->sliding = sliding;
  out->window = sliding ? c->sliding_window : 0;
  if (!layer_rotates(r, c, layer, sliding) || c->rec.no_rope) out->rope = -1;
  else out->rope = sliding && r->local_rope != SM_LOCAL_ROPE_SAME ? 1 : 0;
  out->kind = (sm_layer_kind)c->layer_kind[layer];
  out->ffn = r->single_block ? out->kind == SM_LK_MLP : out->kind != SM_LK_MOE;
  out->head_dim = c->head_dim;
  out->kv_heads = c->num_key_value_heads;
  out->ffn_dim = c->intermediate_size;
  out->kv_src = layer;
  if (out->kind != SM_LK_ATTN) {
    out->sliding = false;
    out->window = 0;
    out->rope = -1;
    return;
  }
  /* Gemma 4: full layers' own head size and (keys as values) KV heads; per_layer_config overrides */
  if (!sliding && c->global_head_dim) out->head_dim = c->global_head_dim;
  if (!sliding && c->attn_k_eq_v) {
    out->k_eq_v = true;
    if (c->global_kv_heads) out->kv_heads = c->global_kv_heads;
  }
  if (c->layer_head_dim[layer]) out->head_dim = c->layer_head_dim[layer];
  if (c->layer_kv_heads[layer]) out->kv_heads = c->layer_kv_heads[layer];
  /* KV sharing: the last non-shared layer of the same kind before the shared ones */
  const int first_shared = c->num_hidden_layers - c->kv_shared_layers;
  if (c->kv_shared_layers > 0 && layer >= first_shared) {
    out->kv_src = -1;
    for (int j = first_shared - 1; j >= 0 && out->kv_src < 0; j--)
      if (c->layer_kind[j] == SM_LK_ATTN && layer_sliding(r, c, j) == sliding) out->kv_src = j;
    if (c->double_wide_mlp) out->ffn_dim *= 2;
  }
}

bool sm_family_varied_layers(const sm_family *f, const sm_config *c) {
  for (int l = 0; l < c->num_hidden_layers; l++) {
    sm_layer_spec sp;
    sm_family_layer_spec(f, c, l, &sp);
    if (sp.kind == SM_LK_ATTN &&
        (sp.head_dim != c->head_dim || sp.kv_heads != c->num_key_value_heads || sp.kv_src != l || sp.k_eq_v))
      return true;
  }
  return false;
}

bool sm_family_slot_used(const sm_family *f, const sm_config *c, int layer, sm_layer_tensor s) {
  sm_layer_spec sp;
  sm_family_layer_spec(f, c, layer, &sp);
  const bool attn = sp.kind == SM_LK_ATTN, rec = sp.kind == SM_LK_REC;
  switch (s) {
    case SM_T_ATTN_NORM:
    case SM_T_ATTN_OUT_NORM: return attn || rec;
    case SM_T_Q:
    case SM_T_O:
    case SM_T_QKV:
    case SM_T_Q_NORM: return attn;
    case SM_T_K:
    case SM_T_K_NORM: return attn && sp.kv_src == layer;
    case SM_T_V: return attn && sp.kv_src == layer && !sp.k_eq_v;
    case SM_T_ATTN_GATE: return attn && f->recipe->attn_out_gate;
    case SM_T_PLE_GATE:
    case SM_T_PLE_PROJ:
    case SM_T_PLE_NORM: return f->recipe->per_layer_input && c->ple_dim > 0;
    case SM_T_LAYER_SCALAR: return f->recipe->layer_scalar;
    case SM_T_MLP_OUT_NORM:
    case SM_T_MOE_NORM:
    case SM_T_MOE_OUT_NORM: return f->moe && f->moe->beside_mlp && c->moe.n_experts > 0 && c->moe.moe_layer[layer];
    case SM_T_FFN_NORM:
    case SM_T_GATE:
    case SM_T_UP:
    case SM_T_GATE_UP:
    case SM_T_DOWN:
    case SM_T_FFN_OUT_NORM: return sp.ffn;
    case SM_T_REC_IN_FUSED:
    case SM_T_REC_BA_FUSED:
    case SM_T_REC_IN:
    case SM_T_REC_Z:
    case SM_T_REC_B:
    case SM_T_REC_A:
    case SM_T_REC_CONV:
    case SM_T_REC_DT_BIAS:
    case SM_T_REC_A_LOG:
    case SM_T_REC_D:
    case SM_T_REC_NORM:
    case SM_T_REC_OUT: return rec;
    case SM_T_LAYER_COUNT: break;
  }
  return false;
}

/* the recurrent mixer's slots (config.h sm_rec_config) */
static void rec_slot_shape(const sm_config *c, sm_layer_tensor s, int64_t *rows, int64_t *cols) {
  const sm_rec_config *r = &c->rec;
  const int64_t H = c->hidden_size, conv = sm_config_rec_conv_dim(c);
  int64_t heads = 0, inner = 0, norm = 0, z = 0, b = 0, a = 0, fused = 0, ba = 0;
  switch (r->kind) {
    case SM_REC_GDN:
      heads = r->gdn_v_heads;
      inner = (int64_t)r->gdn_v_heads * r->gdn_v_dim;
      norm = r->gdn_v_dim;
      z = inner;
      b = a = heads;
      fused = conv + inner;
      ba = 2 * heads;
      break;
    case SM_REC_MAMBA2:
      heads = r->m_heads;
      inner = (int64_t)r->m_heads * r->m_head_dim;
      norm = inner;
      z = inner;
      a = heads;
      fused = inner + conv + heads;
      break;
    case SM_REC_SHORTCONV:
      inner = H;
      z = b = H;
      fused = 3 * H;
      break;
    case SM_REC_NONE: break;
  }
  *cols = H;
  switch (s) {
    case SM_T_REC_IN_FUSED: *rows = fused; break;
    case SM_T_REC_BA_FUSED: *rows = ba; break;
    case SM_T_REC_IN: *rows = conv; break;
    case SM_T_REC_Z: *rows = z; break;
    case SM_T_REC_B: *rows = b; break;
    case SM_T_REC_A: *rows = a; break;
    case SM_T_REC_CONV:
      *rows = conv;
      *cols = r->conv_kernel;
      break;
    case SM_T_REC_DT_BIAS:
    case SM_T_REC_A_LOG:
    case SM_T_REC_D:
      *rows = heads;
      *cols = 0;
      break;
    case SM_T_REC_NORM:
      *rows = norm;
      *cols = 0;
      break;
    case SM_T_REC_OUT:
      *rows = H;
      *cols = inner;
      break;
    default:
      *rows = 0;
      *cols = 0;
      break;
  }
}

void sm_family_slot_shape(const sm_family *f, const sm_config *c, int layer, sm_layer_tensor s, int64_t *rows,
                          int64_t *cols) {
  sm_layer_spec sp;
  sm_family_layer_spec(f, c, layer, &sp);
  const int64_t H = c->hidden_size, F = sp.ffn_dim, hd = sp.head_dim;
  const int64_t nq = (int64_t)c->num_attention_heads * hd, nkv = (int64_t)sp.kv_heads * hd;
  const bool full = f->recipe && f->recipe->qk_norm == SM_QK_NORM_FULL;
  *cols = 0;
  switch (s) {
    case SM_T_ATTN_NORM:
    case SM_T_FFN_NORM:
    case SM_T_ATTN_OUT_NORM:
    case SM_T_FFN_OUT_NORM: *rows = H; break;
    case SM_T_Q_NORM: *rows = full ? nq : hd; break;
    case SM_T_K_NORM: *rows = full ? nkv : hd; break;
    case SM_T_Q:
      *rows = f->recipe && f->recipe->attn_out_gate ? 2 * nq : nq;
      *cols = H;
      break;
    case SM_T_ATTN_GATE:
      *rows = nq;
      *cols = H;
      break;
    case SM_T_K:
    case SM_T_V:
      *rows = nkv;
      *cols = H;
      break;
    case SM_T_QKV:
      *rows = nq + 2 * nkv;
      *cols = H;
      break;
    case SM_T_O:
      *rows = H;
      *cols = nq;
      break;
    case SM_T_GATE:
    case SM_T_UP:
      *rows = F;
      *cols = H;
      break;
    case SM_T_GATE_UP:
      *rows = 2 * F;
      *cols = H;
      break;
    case SM_T_DOWN:
      *rows = H;
      *cols = F;
      break;
    case SM_T_PLE_GATE:
      *rows = c->ple_dim;
      *cols = H;
      break;
    case SM_T_PLE_PROJ:
      *rows = H;
      *cols = c->ple_dim;
      break;
    case SM_T_PLE_NORM:
    case SM_T_MLP_OUT_NORM:
    case SM_T_MOE_NORM:
    case SM_T_MOE_OUT_NORM: *rows = H; break;
    case SM_T_LAYER_SCALAR: *rows = 1; break;
    case SM_T_LAYER_COUNT: *rows = 0; break;
    default: rec_slot_shape(c, s, rows, cols); break;
  }
}

smelt_status sm_family_act(const sm_family *f, const sm_config *c, sm_act *out) {
  const char *a = c->hidden_act;
  if (!strcmp(a, "silu") || !strcmp(a, "swish")) {
    *out = SM_ACT_SILU;
    return SMELT_OK;
  }
  /* the tanh approximation of GELU, under its transformers names (ACT2FN) */
  if (!strcmp(a, "gelu_pytorch_tanh") || !strcmp(a, "gelu_new") || !strcmp(a, "gelu_fast")) {
    *out = SM_ACT_GELU_TANH;
    return SMELT_OK;
  }
  /* squared ReLU, in the feed-forward blocks without a gate (Nemotron-H) */
  if (!strcmp(a, "relu2") && f->recipe && f->recipe->ffn == SM_FFN_PLAIN) {
    *out = SM_ACT_RELU2;
    return SMELT_OK;
  }
  return sm_err(SMELT_ERR_UNSUPPORTED, "activation '%s' is not supported for model family %s (silu, gelu_pytorch_tanh)",
                a, f->model_type);
}
