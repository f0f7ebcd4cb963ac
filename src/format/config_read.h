/* Reading one field of the language model's part of a parsed config.json (text_config first, then the top
 * level; null counts as absent), for the config_*.c parsers of groups of fields. */
#ifndef SM_CONFIG_READ_H
#define SM_CONFIG_READ_H
#include <math.h>
#include "format/config.h"

static inline const cJSON *sm_cfg_val(const sm_config *c, const char *key) {
  const cJSON *v = c->text ? cJSON_GetObjectItemCaseSensitive(c->text, key) : NULL;
  if ((!v || cJSON_IsNull(v)) && c->json != c->text) v = cJSON_GetObjectItemCaseSensitive(c->json, key);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

/* *out unchanged when absent */
static inline smelt_status sm_cfg_int(const sm_config *c, const char *file, const char *key, int lo, int hi, int *out) {
  const cJSON *v = sm_cfg_val(c, key);
  if (!v) return SMELT_OK;
  double d = v->valuedouble;
  if (!cJSON_IsNumber(v) || !isfinite(d) || floor(d) != d || d < lo || d > hi)
    return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be an integer in [%d, %d]", file, key, lo, hi);
  *out = (int)d;
  return SMELT_OK;
}

static inline smelt_status sm_cfg_pos_float(const sm_config *c, const char *file, const char *key, float *out) {
  const cJSON *v = sm_cfg_val(c, key);
  if (!v) return SMELT_OK;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || !(v->valuedouble > 0) || v->valuedouble > 1e30)
    return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be a positive number", file, key);
  *out = (float)v->valuedouble;
  return SMELT_OK;
}

static inline smelt_status sm_cfg_bool(const sm_config *c, const char *file, const char *key, bool *out) {
  const cJSON *v = sm_cfg_val(c, key);
  if (!v) return SMELT_OK;
  if (!cJSON_IsBool(v)) return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be true or false", file, key);
  *out = cJSON_IsTrue(v);
  return SMELT_OK;
}

#endif
