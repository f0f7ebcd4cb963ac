/* The mixture-of-experts fields of config.json (config.h sm_moe_config): read under each family's
 * names, with the family's class defaults, and checked. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "format/config.h"
#include "format/config_read.h"

#define TRY(x) \
  do { \
    smelt_status rc_ = (x); \
    if (rc_ != SMELT_OK) return rc_; \
  } while (0)

smelt_status sm_config_parse_moe(sm_config *c, const sm_moe_defaults *d, const char *file) {
  sm_moe_config *m = &c->moe;
  memset(m, 0, sizeof *m);
  m->use_qk_norm = -1;
  const cJSON *qk = sm_cfg_val(c, "use_qk_norm");
  if (qk && !cJSON_IsBool(qk)) return sm_err(SMELT_ERR_FORMAT, "%s: \"use_qk_norm\" must be true or false", file);
  if (qk) m->use_qk_norm = cJSON_IsTrue(qk);
  if (!d) return SMELT_OK;
  const int nl = c->num_hidden_layers;
  m->n_experts = d->n_experts;
  m->top_k = d->top_k;
  m->norm_topk = d->norm_topk;
  m->routed_scale = d->routed_scale > 0 ? d->routed_scale : 1.0f;
  m->n_group = d->n_group > 0 ? d->n_group : 1;
  m->topk_group = d->topk_group > 0 ? d->topk_group : 1;
  m->swiglu_limit = d->swiglu_limit;
  m->swiglu_alpha = d->swiglu_alpha;
  const char *ek[] = {"num_experts", "num_local_experts", "n_routed_experts"};
  for (size_t i = 0; i < sizeof ek / sizeof ek[0]; i++)
    TRY(sm_cfg_int(c, file, ek[i], d->optional ? 0 : 1, 4096, &m->n_experts));
  if (d->optional && m->n_experts == 0) { /* a dense model of the family: no layer has the mixture */
    memset(m, 0, sizeof *m);
    m->use_qk_norm = qk ? cJSON_IsTrue(qk) : -1;
    return SMELT_OK;
  }
  TRY(sm_cfg_int(c, file, "num_experts_per_tok", 1, 1 << 16, &m->top_k));
  TRY(sm_cfg_int(c, file, "top_k_experts", 1, 1 << 16, &m->top_k)); /* Gemma 4's name */
  if (m->n_experts <= 0)
    return sm_err(SMELT_ERR_FORMAT, "%s: a %s model needs the number of experts", file, c->model_type);
  if (m->top_k < 1 || m->top_k > m->n_experts || m->top_k > 64)
    return sm_err(SMELT_ERR_FORMAT, "%s: num_experts_per_tok = %d must be in [1, min(64, %d experts)]", file, m->top_k,
                  m->n_experts);
  /* an expert's size: moe_intermediate_size, or (Mixtral, gpt-oss) intermediate_size */
  m->expert_inter = d->expert_inter > 0 ? d->expert_inter : c->intermediate_size;
  TRY(sm_cfg_int(c, file, "moe_intermediate_size", 1, 1 << 20, &m->expert_inter));
  /* shared experts */
  int n_shared = d->n_shared;
  m->shared_inter = d->shared_inter;
  if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(c->text, "n_shared_experts"))) n_shared = 0;
  TRY(sm_cfg_int(c, file, "n_shared_experts", 0, 1 << 10, &n_shared));
  if (n_shared > 0) m->shared_inter = n_shared * m->expert_inter;
  TRY(sm_cfg_int(c, file, "shared_expert_intermediate_size", 0, 1 << 20, &m->shared_inter));
  TRY(sm_cfg_bool(c, file, "norm_topk_prob", &m->norm_topk));
  bool use_bias = true;
  TRY(sm_cfg_bool(c, file, "use_expert_bias", &use_bias));
  m->no_correction = !use_bias;
  TRY(sm_cfg_pos_float(c, file, "routed_scaling_factor", &m->routed_scale));
  TRY(sm_cfg_int(c, file, "n_group", 1, 64, &m->n_group));
  TRY(sm_cfg_int(c, file, "topk_group", 1, 64, &m->topk_group));
  TRY(sm_cfg_pos_float(c, file, "swiglu_limit", &m->swiglu_limit));
  TRY(sm_cfg_pos_float(c, file, "swiglu_alpha", &m->swiglu_alpha));
  if (m->n_experts % m->n_group || m->topk_group > m->n_group || m->top_k > m->topk_group * (m->n_experts / m->n_group))
    return sm_err(SMELT_ERR_FORMAT, "%s: n_group %d / topk_group %d do not fit %d experts with %d per token", file,
                  m->n_group, m->topk_group, m->n_experts, m->top_k);
  if (m->n_group > 1 && m->n_experts / m->n_group < 2)
    return sm_err(SMELT_ERR_FORMAT, "%s: group-limited routing needs at least 2 experts per group", file);
  /* the routing the families' configs may name: only what the reference models implement */
  const cJSON *tm = sm_cfg_val(c, "topk_method"), *sf = sm_cfg_val(c, "scoring_func");
  if (tm && (!cJSON_IsString(tm) || strcmp(tm->valuestring, "noaux_tc")))
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: topk_method '%.40s' is not supported (noaux_tc)", file,
                  cJSON_IsString(tm) ? tm->valuestring : "?");
  if (sf && (!cJSON_IsString(sf) || strcmp(sf->valuestring, "sigmoid")))
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: scoring_func '%.40s' is not supported (sigmoid)", file,
                  cJSON_IsString(sf) ? sf->valuestring : "?");
  /* which layers have the mixture */
  int first = d->first_dense, freq = d->layer_freq, step = d->sparse_step;
  TRY(sm_cfg_int(c, file, "first_k_dense_replace", 0, 1 << 20, &first));
  TRY(sm_cfg_int(c, file, "num_dense_layers", 0, 1 << 20, &first)); /* LFM2-MoE's name */
  TRY(sm_cfg_int(c, file, "moe_layer_freq", 1, 1 << 20, &freq));
  TRY(sm_cfg_int(c, file, "decoder_sparse_step", 1, 1 << 20, &step));
  for (int l = 0; l < nl; l++)
    m->moe_layer[l] = l >= first && (freq <= 1 || l % freq == 0) && (step <= 1 || (l + 1) % step == 0);
  const cJSON *mo = sm_cfg_val(c, "mlp_only_layers");
  if (mo) {
    if (!cJSON_IsArray(mo))
      return sm_err(SMELT_ERR_FORMAT, "%s: \"mlp_only_layers\" must be a list of layer indices", file);
    for (const cJSON *e = mo->child; e; e = e->next) {
      if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble >= nl)
        return sm_err(SMELT_ERR_FORMAT, "%s: mlp_only_layers: entries must be layer indices below %d", file, nl);
      m->moe_layer[(int)e->valuedouble] = 0;
    }
  }
  return SMELT_OK;
}
