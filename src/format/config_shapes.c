/* Layers of their own shape in config.json (config.h: Gemma 4's global_head_dim, num_global_key_value_heads
 * with attention_k_eq_v, num_kv_shared_layers, use_double_wide_mlp, the per-layer inputs, per_layer_config),
 * with the family's class defaults, and the Gemma4TextConfig rules that come with them: its default RoPE, the
 * last layer always full, experts only with enable_moe_block. */
#include <stdlib.h>
#include <string.h>
#include "format/config.h"
#include "format/config_read.h"

#define TRY(x) \
  do { \
    smelt_status rc_ = (x); \
    if (rc_ != SMELT_OK) return rc_; \
  } while (0)

/* an explicit null in the LM's config: the feature is off */
static bool is_null(const sm_config *c, const char *key) {
  return c->text && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(c->text, key));
}

/* per_layer_config (newer transformers): {"<layer>": {"head_dim", "num_key_value_heads"}} */
static smelt_status per_layer(sm_config *c, const char *file) {
  const int nl = c->num_hidden_layers, nh = c->num_attention_heads;
  const cJSON *plc = sm_cfg_val(c, "per_layer_config");
  if (plc && !cJSON_IsObject(plc)) return sm_err(SMELT_ERR_FORMAT, "%s: per_layer_config must be an object", file);
  for (const cJSON *e = plc ? plc->child : NULL; e; e = e->next) {
    char *end = NULL;
    const long l = strtol(e->string, &end, 10);
    if (!e->string[0] || *end || l < 0 || l >= nl || !cJSON_IsObject(e))
      return sm_err(SMELT_ERR_FORMAT, "%s: per_layer_config key '%.20s' is not a layer of %d", file, e->string, nl);
    const cJSON *hv = cJSON_GetObjectItemCaseSensitive(e, "head_dim"),
                *kv = cJSON_GetObjectItemCaseSensitive(e, "num_key_value_heads");
    const double hd = cJSON_IsNumber(hv) ? hv->valuedouble : 0, nk = cJSON_IsNumber(kv) ? kv->valuedouble : 0;
    if ((hv && !cJSON_IsNumber(hv) && !cJSON_IsNull(hv)) || (kv && !cJSON_IsNumber(kv) && !cJSON_IsNull(kv)) ||
        hd < 0 || hd > 1024 || hd != (int)hd || (int)hd % 2 || nk < 0 || nk > nh || nk != (int)nk ||
        (nk > 0 && nh % (int)nk))
      return sm_err(SMELT_ERR_FORMAT, "%s: per_layer_config of layer %ld has a bad head_dim or num_key_value_heads",
                    file, l);
    c->layer_head_dim[l] = (uint16_t)hd;
    c->layer_kv_heads[l] = (uint16_t)nk;
  }
  return SMELT_OK;
}

smelt_status sm_config_parse_shapes(sm_config *c, const sm_config_defaults *d, const char *file) {
  const int nl = c->num_hidden_layers, nh = c->num_attention_heads;
  c->global_head_dim = is_null(c, "global_head_dim") ? 0 : d->global_head_dim;
  c->ple_dim = is_null(c, "hidden_size_per_layer_input") ? 0 : d->ple_dim;
  c->ple_vocab = d->ple_vocab;
  bool moe = false;
  TRY(sm_cfg_int(c, file, "global_head_dim", 0, 1024, &c->global_head_dim));
  TRY(sm_cfg_int(c, file, "num_global_key_value_heads", 0, nh, &c->global_kv_heads));
  TRY(sm_cfg_bool(c, file, "attention_k_eq_v", &c->attn_k_eq_v));
  TRY(sm_cfg_int(c, file, "num_kv_shared_layers", 0, nl - 1, &c->kv_shared_layers));
  TRY(sm_cfg_bool(c, file, "use_double_wide_mlp", &c->double_wide_mlp));
  TRY(sm_cfg_int(c, file, "hidden_size_per_layer_input", 0, 1 << 14, &c->ple_dim));
  TRY(sm_cfg_int(c, file, "vocab_size_per_layer_input", 1, 1 << 24, &c->ple_vocab));
  TRY(sm_cfg_bool(c, file, "enable_moe_block", &moe));
  const cJSON *bidir = sm_cfg_val(c, "use_bidirectional_attention");
  if (cJSON_IsString(bidir) && !strcmp(bidir->valuestring, "all"))
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: use_bidirectional_attention \"all\" is not supported", file);
  /* the experts (every layer, beside its MLP) only with enable_moe_block */
  if (!moe) {
    const int qk = c->moe.use_qk_norm;
    memset(&c->moe, 0, sizeof c->moe);
    c->moe.use_qk_norm = qk;
  } else if (c->moe.n_experts <= 0) {
    return sm_err(SMELT_ERR_FORMAT, "%s: enable_moe_block without num_experts", file);
  }
  if (c->global_head_dim % 2) return sm_err(SMELT_ERR_FORMAT, "%s: global_head_dim must be even", file);
  if (!c->attn_k_eq_v) c->global_kv_heads = 0; /* transformers reads it only with attention_k_eq_v */
  if (c->global_kv_heads && nh % c->global_kv_heads)
    return sm_err(SMELT_ERR_FORMAT, "%s: num_attention_heads (%d) is not a multiple of num_global_key_value_heads (%d)",
                  file, nh, c->global_kv_heads);
  if (c->ple_dim && (long long)c->ple_dim * nl > (1 << 20))
    return sm_err(SMELT_ERR_FORMAT, "%s: hidden_size_per_layer_input * num_hidden_layers is too large", file);
  /* Gemma4TextConfig: without rope_parameters, full layers rotate a quarter of their head (proportional, theta
   * 1e6) and sliding ones all of it (theta 1e4); the last layer is always full */
  if (!sm_cfg_val(c, "rope_parameters") && !sm_cfg_val(c, "rope_scaling")) {
    c->rope_type = SM_ROPE_PROPORTIONAL;
    c->rope_factor = 1.0f;
    c->rope_partial_factor = 0.25f;
    c->partial_rotary_dim = c->head_dim;
  }
  if (!c->has_layer_types) {
    for (int l = 0; l < nl; l++)
      c->layer_sliding[l] = c->sliding_window_pattern > 0 && (l + 1) % c->sliding_window_pattern != 0;
    c->has_layer_types = true;
  }
  c->layer_sliding[nl - 1] = 0;
  return per_layer(c, file);
}
