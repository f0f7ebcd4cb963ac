/* The multi-head latent attention fields of config.json (config.h sm_mla_config): DeepSeek-V2/V3's
 * kv_lora_rank, q_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim, with the family's class
 * defaults, checked; and the latent KV cache's geometry (one head of kv_lora_rank + qk_rope_head_dim). */
#include <math.h>
#include <string.h>
#include "format/config.h"

/* the LM's value of key (text_config first, then the top level); *is_null: given as null */
static const cJSON *val(const sm_config *c, const char *key, bool *is_null) {
  const cJSON *v = c->text ? cJSON_GetObjectItemCaseSensitive(c->text, key) : NULL;
  if (!v && c->json != c->text) v = cJSON_GetObjectItemCaseSensitive(c->json, key);
  if (is_null) *is_null = v && cJSON_IsNull(v);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

static smelt_status dim_of(const sm_config *c, const char *file, const char *key, int lo, int *out) {
  const cJSON *v = val(c, key, NULL);
  if (!v) return SMELT_OK;
  const double d = v->valuedouble;
  if (!cJSON_IsNumber(v) || !isfinite(d) || floor(d) != d || d < lo || d > 65536)
    return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be an integer in [%d, 65536]", file, key, lo);
  *out = (int)d;
  return SMELT_OK;
}

smelt_status sm_config_parse_mla(sm_config *c, const sm_mla_config *d, const char *file) {
  sm_mla_config *m = &c->mla;
  memset(m, 0, sizeof *m);
  if (!d) return SMELT_OK;
  *m = *d;
  smelt_status st;
  bool q_null = false;
  val(c, "q_lora_rank", &q_null);
  if (q_null) m->q_rank = 0; /* DeepSeek-V2-Lite: a plain q_proj */
  if ((st = dim_of(c, file, "kv_lora_rank", 1, &m->kv_rank)) || (st = dim_of(c, file, "q_lora_rank", 0, &m->q_rank)) ||
      (st = dim_of(c, file, "qk_rope_head_dim", 2, &m->rope_dim)) ||
      (st = dim_of(c, file, "qk_nope_head_dim", 1, &m->nope_dim)) || (st = dim_of(c, file, "v_head_dim", 1, &m->v_dim)))
    return st;
  if (m->rope_dim % 2) return sm_err(SMELT_ERR_FORMAT, "%s: qk_rope_head_dim %d must be even", file, m->rope_dim);
  if (m->kv_rank % 4 || m->rope_dim % 4 || m->nope_dim % 4 || m->v_dim % 4)
    return sm_err(SMELT_ERR_FORMAT,
                  "%s: kv_lora_rank %d, qk_rope_head_dim %d, qk_nope_head_dim %d and v_head_dim %d must be multiples "
                  "of 4",
                  file, m->kv_rank, m->rope_dim, m->nope_dim, m->v_dim);
  /* the latent cache: one KV head of the normalized latent and the rotated key part */
  c->head_dim = m->kv_rank + m->rope_dim;
  c->num_key_value_heads = 1;
  c->partial_rotary_dim = m->rope_dim;
  return SMELT_OK;
}
