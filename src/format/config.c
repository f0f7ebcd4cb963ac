/* config.json / generation_config.json parsing (see config.h). */
#include "format/config.h"
#include "base/strbuf.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef sm_config_defaults family;

/* unknown model types: sizes required; PretrainedConfig defaults otherwise */
static const family k_generic =
  {.type = "", .eps = 1e-6f, .theta = 10000.f, .act = "silu", .tie = true, .sw_mode = 1, .bos = -1, .eos = -1};

static const family *find_family(sm_config_defaults_fn lookup, const char *type) {
  const family *f = lookup ? lookup(type) : NULL;
  return f ? f : &k_generic;
}

/* ------------------------------------------------------------- helpers */

typedef struct {
  const cJSON *text, *root; /* lookup order */
  const char *file;
} src;

static const cJSON *get(const src *s, const char *key) {
  const cJSON *v = s->text ? cJSON_GetObjectItemCaseSensitive(s->text, key) : NULL;
  if ((!v || cJSON_IsNull(v)) && s->root && s->root != s->text) v = cJSON_GetObjectItemCaseSensitive(s->root, key);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

static smelt_status to_int(const cJSON *v, const char *file, const char *key, int *out) {
  double d = v->valuedouble;
  if (!cJSON_IsNumber(v) || !isfinite(d) || floor(d) != d || d < -2147483648.0 || d > 2147483647.0)
    return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be an integer", file, key);
  *out = (int)d;
  return SMELT_OK;
}

static smelt_status to_float(const cJSON *v, const char *file, const char *key, float *out) {
  double d = v->valuedouble;
  if (!cJSON_IsNumber(v) || !isfinite(d) || fabs(d) > 3.0e38)
    return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be a finite number", file, key);
  *out = (float)d;
  return SMELT_OK;
}

/* *out unchanged when absent/null */
static smelt_status get_int(const src *s, const char *key, int *out) {
  const cJSON *v = get(s, key);
  return v ? to_int(v, s->file, key, out) : SMELT_OK;
}
static smelt_status get_float(const src *s, const char *key, float *out) {
  const cJSON *v = get(s, key);
  return v ? to_float(v, s->file, key, out) : SMELT_OK;
}
static smelt_status get_bool(const src *s, const char *key, bool *out) {
  const cJSON *v = get(s, key);
  if (!v) return SMELT_OK;
  if (!cJSON_IsBool(v)) return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be true or false", s->file, key);
  *out = cJSON_IsTrue(v);
  return SMELT_OK;
}
static smelt_status get_str(const src *s, const char *key, char *out, size_t cap) {
  const cJSON *v = get(s, key);
  if (!v) return SMELT_OK;
  if (!cJSON_IsString(v)) return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be a string", s->file, key);
  snprintf(out, cap, "%s", v->valuestring);
  return SMELT_OK;
}

static smelt_status add_token_ids(sm_config *c, const cJSON *v, const char *file, const char *key) {
  if (!v) return SMELT_OK;
  const cJSON *one = v;
  if (cJSON_IsArray(v)) one = v->child;
  for (; one; one = cJSON_IsArray(v) ? one->next : NULL) {
    int id;
    if (cJSON_IsNull(one)) continue;
    if (to_int(one, file, key, &id) != SMELT_OK || id < 0)
      return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be a token id or a list of token ids", file, key);
    bool dup = false;
    for (int i = 0; i < c->n_eos; i++) dup |= c->eos_ids[i] == id;
    if (dup) continue;
    if (c->n_eos >= (int)SM_ARRAY_LEN(c->eos_ids))
      return sm_err(SMELT_ERR_LIMIT, "%s: more than %zu distinct eos token ids", file, SM_ARRAY_LEN(c->eos_ids));
    c->eos_ids[c->n_eos++] = id;
  }
  return SMELT_OK;
}

#define TRY(x) \
  do { \
    smelt_status rc_ = (x); \
    if (rc_ != SMELT_OK) return rc_; \
  } while (0)

static smelt_status check_range(const char *file, const char *key, long long v, long long lo, long long hi) {
  if (v < lo || v > hi)
    return sm_err(SMELT_ERR_FORMAT, "%s: %s = %lld is out of range [%lld, %lld]", file, key, v, lo, hi);
  return SMELT_OK;
}

/* rope_scaling (or a transformers-v5 rope_parameters entry) */
static smelt_status parse_rope(sm_config *c, const cJSON *rs, const char *file) {
  if (!rs || cJSON_IsNull(rs)) return SMELT_OK;
  if (!cJSON_IsObject(rs)) return sm_err(SMELT_ERR_FORMAT, "%s: \"rope_scaling\" must be an object", file);
  c->rope_params = rs;
  src s = {rs, NULL, file};
  char type[32] = "";
  const cJSON *tv = get(&s, "rope_type");
  if (!tv) tv = get(&s, "type");
  if (tv && !cJSON_IsString(tv)) return sm_err(SMELT_ERR_FORMAT, "%s: rope_scaling type must be a string", file);
  if (tv) snprintf(type, sizeof type, "%s", tv->valuestring);
  if (get(&s, "rope_theta")) TRY(get_float(&s, "rope_theta", &c->rope_theta));
  if (get(&s, "partial_rotary_factor")) TRY(get_float(&s, "partial_rotary_factor", &c->rope_partial_factor));
  if (get(&s, "llama_4_scaling_beta")) TRY(get_float(&s, "llama_4_scaling_beta", &c->rope_llama4_beta));
  if (!(c->rope_llama4_beta >= 0)) return sm_err(SMELT_ERR_FORMAT, "%s: llama_4_scaling_beta must be >= 0", file);
  if (c->rope_llama4_beta > 0) TRY(get_int(&s, "original_max_position_embeddings", &c->rope_original_max_pos));
  if (!tv || !strcmp(type, "default") || !strcmp(type, "mrope")) {
    c->rope_type = SM_ROPE_NONE;
    return SMELT_OK;
  }
  float factor = 0;
  bool has_factor = get(&s, "factor") != NULL;
  TRY(get_float(&s, "factor", &factor));
  if (has_factor && !(factor > 0)) return sm_err(SMELT_ERR_FORMAT, "%s: rope_scaling factor must be > 0", file);
  c->rope_factor = factor;
  if (!strcmp(type, "linear") || !strcmp(type, "dynamic")) {
    if (!has_factor) return sm_err(SMELT_ERR_FORMAT, "%s: rope_scaling type '%s' needs \"factor\"", file, type);
    c->rope_type = type[0] == 'l' ? SM_ROPE_LINEAR : SM_ROPE_DYNAMIC;
  } else if (!strcmp(type, "llama3")) {
    const char *need[] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    for (size_t i = 0; i < SM_ARRAY_LEN(need); i++)
      if (!get(&s, need[i]))
        return sm_err(SMELT_ERR_FORMAT, "%s: rope_scaling type 'llama3' needs \"%s\"", file, need[i]);
    c->rope_type = SM_ROPE_LLAMA3;
    TRY(get_float(&s, "low_freq_factor", &c->rope_low_freq_factor));
    TRY(get_float(&s, "high_freq_factor", &c->rope_high_freq_factor));
    TRY(get_int(&s, "original_max_position_embeddings", &c->rope_original_max_pos));
    if (!(c->rope_low_freq_factor > 0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor))
      return sm_err(SMELT_ERR_FORMAT, "%s: rope_scaling llama3 needs 0 < low_freq_factor < high_freq_factor", file);
    TRY(check_range(file, "rope_scaling.original_max_position_embeddings", c->rope_original_max_pos, 1, 1 << 27));
  } else if (!strcmp(type, "yarn")) {
    if (!has_factor) return sm_err(SMELT_ERR_FORMAT, "%s: rope_scaling type 'yarn' needs \"factor\"", file);
    c->rope_type = SM_ROPE_YARN;
    c->rope_beta_fast = 32.f;
    c->rope_beta_slow = 1.f;
    TRY(get_float(&s, "beta_fast", &c->rope_beta_fast));
    TRY(get_float(&s, "beta_slow", &c->rope_beta_slow));
    TRY(get_float(&s, "attention_factor", &c->rope_attn_factor));
    TRY(get_float(&s, "mscale", &c->rope_mscale));
    TRY(get_float(&s, "mscale_all_dim", &c->rope_mscale_all_dim));
    TRY(get_bool(&s, "truncate", &c->rope_truncate));
    TRY(get_int(&s, "original_max_position_embeddings", &c->rope_original_max_pos));
    if (!(c->rope_beta_fast > 0) || !(c->rope_beta_slow > 0))
      return sm_err(SMELT_ERR_FORMAT, "%s: rope_scaling yarn needs beta_fast, beta_slow > 0", file);
  } else if (!strcmp(type, "proportional")) {
    c->rope_type = SM_ROPE_PROPORTIONAL;
    if (!has_factor) c->rope_factor = 1.0f;
  } else if (!strcmp(type, "longrope") || !strcmp(type, "su")) {
    c->rope_type = SM_ROPE_LONGROPE;
    if (!cJSON_IsArray(get(&s, "short_factor")) || !cJSON_IsArray(get(&s, "long_factor")))
      return sm_err(SMELT_ERR_FORMAT, "%s: rope_scaling type '%s' needs short_factor and long_factor lists", file,
                    type);
    TRY(get_float(&s, "attention_factor", &c->rope_attn_factor));
    TRY(get_int(&s, "original_max_position_embeddings", &c->rope_original_max_pos));
  } else {
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: unsupported rope_scaling type '%s'", file, type);
  }
  return SMELT_OK;
}

static bool valid_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
static bool valid_group(int g) { return g == 32 || g == 64 || g == 128; }

/* a quantization entry's mode, bits and group size (unset: from the defaults d*, which for a mode other than
 * the default's are MLX's defaults of that mode), checked */
static smelt_status quant_entry_params(const src *s, const char *what, int dmode, int dbits, int dgroup, int *mode,
                                       int *bits, int *group) {
  char mm[32] = "";
  TRY(get_str(s, "mode", mm, sizeof mm));
  *mode = dmode;
  if (mm[0]) {
    int m = sm_qmode_parse(mm);
    if (m < 0)
      return sm_err(SMELT_ERR_UNSUPPORTED,
                    "%s: quantization%s%s: mode '%s' is not supported (affine, mxfp4, mxfp8, "
                    "nvfp4)",
                    s->file, what[0] ? " of " : "", what, mm);
    *mode = m;
  }
  *bits = *mode == dmode ? dbits : (*mode == SM_QMODE_AFFINE ? 4 : sm_qmode_bits((sm_qmode)*mode));
  *group = *mode == dmode ? dgroup : (*mode == SM_QMODE_AFFINE ? 64 : sm_qmode_group((sm_qmode)*mode));
  TRY(get_int(s, "bits", bits));
  TRY(get_int(s, "group_size", group));
  if (*mode == SM_QMODE_AFFINE) {
    if (!valid_bits(*bits) || !valid_group(*group))
      return sm_err(SMELT_ERR_UNSUPPORTED,
                    "%s: quantization%s%s: bits %d / group_size %d not supported (bits 2,3,4,5,6,8; "
                    "group_size 32,64,128)",
                    s->file, what[0] ? " of " : "", what, *bits, *group);
  } else if (*bits != sm_qmode_bits((sm_qmode)*mode) || *group != sm_qmode_group((sm_qmode)*mode)) {
    return sm_err(SMELT_ERR_FORMAT, "%s: quantization%s%s: mode %s needs bits %d and group_size %d (not %d / %d)",
                  s->file, what[0] ? " of " : "", what, sm_qmode_name((sm_qmode)*mode), sm_qmode_bits((sm_qmode)*mode),
                  sm_qmode_group((sm_qmode)*mode), *bits, *group);
  }
  return SMELT_OK;
}

static smelt_status parse_quant(sm_config *c, const char *file) {
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(c->json, "quantization");
  const char *qname = "quantization";
  if (!q || cJSON_IsNull(q)) {
    q = cJSON_GetObjectItemCaseSensitive(c->json, "quantization_config");
    qname = "quantization_config";
  }
  if ((!q || cJSON_IsNull(q)) && c->text && c->text != c->json) {
    q = cJSON_GetObjectItemCaseSensitive(c->text, "quantization");
    if (!q || cJSON_IsNull(q)) q = cJSON_GetObjectItemCaseSensitive(c->text, "quantization_config");
  }
  if (!q || cJSON_IsNull(q)) return SMELT_OK;
  if (!cJSON_IsObject(q)) return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be an object", file, qname);
  src s = {q, NULL, file};
  char method[32] = "";
  TRY(get_str(&s, "quant_method", method, sizeof method));
  if (method[0] && strcmp(method, "mlx") && strcmp(method, "affine"))
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s: quantization method '%s' is not supported (MLX quantization: modes "
                  "affine, mxfp4, mxfp8, nvfp4)",
                  file, method);
  c->quant = (cJSON *)q;
  /* mlx defaults: affine 4-bit, group 64 */
  TRY(quant_entry_params(&s, "", SM_QMODE_AFFINE, 4, 64, &c->q_mode, &c->q_bits, &c->q_group_size));
  /* per-module overrides: as MLX's to_quantized(**entry), a missing mode is affine and missing bits / group
   * size are the mode's defaults */
  for (const cJSON *e = q->child; e; e = e->next) {
    if (!e->string || !cJSON_IsObject(e)) continue;
    src m = {e, NULL, file};
    int md, b, g;
    TRY(quant_entry_params(&m, e->string, SM_QMODE_AFFINE, 4, 64, &md, &b, &g));
  }
  return SMELT_OK;
}

static const cJSON *quant_entry(const cJSON *q, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, name);
  if (v && (cJSON_IsObject(v) || cJSON_IsBool(v))) return v;
  return NULL;
}

void sm_config_quant_mode_for(const sm_config *c, const char *module, int *bits, int *group_size, int *mode) {
  int b = c ? c->q_bits : 0, g = c ? c->q_group_size : 0, md = c ? c->q_mode : 0;
  if (c && c->quant && module) {
    char buf[512];
    size_t n = strlen(module);
    if (n >= 7 && !strcmp(module + n - 7, ".weight")) n -= 7;
    if (n < sizeof buf - 16) {
      memcpy(buf, module, n);
      buf[n] = 0;
      const cJSON *v = quant_entry(c->quant, buf);
      /* VLM checkpoints name the LM "language_model.<...>" */
      static const char pre[] = "language_model.";
      if (!v && !strncmp(buf, pre, sizeof pre - 1)) v = quant_entry(c->quant, buf + sizeof pre - 1);
      if (!v) {
        char alt[512 + sizeof pre];
        snprintf(alt, sizeof alt, "%s%s", pre, buf);
        v = quant_entry(c->quant, alt);
      }
      if (v && cJSON_IsFalse(v)) b = g = md = 0;
      else if (v && cJSON_IsObject(v)) {
        /* checked when parsed: the entry's mode (absent: affine) and MLX's defaults of that mode */
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, "mode");
        const int nm = cJSON_IsString(x) ? sm_qmode_parse(x->valuestring) : SM_QMODE_AFFINE;
        md = nm >= 0 ? nm : SM_QMODE_AFFINE;
        b = md == SM_QMODE_AFFINE ? 4 : sm_qmode_bits((sm_qmode)md);
        g = md == SM_QMODE_AFFINE ? 64 : sm_qmode_group((sm_qmode)md);
        x = cJSON_GetObjectItemCaseSensitive(v, "bits");
        if (cJSON_IsNumber(x)) b = (int)x->valueint;
        x = cJSON_GetObjectItemCaseSensitive(v, "group_size");
        if (cJSON_IsNumber(x)) g = (int)x->valueint;
      }
    }
  }
  if (bits) *bits = b;
  if (group_size) *group_size = b ? g : 0;
  if (mode) *mode = b ? md : 0;
}

void sm_config_quant_for(const sm_config *c, const char *module, int *bits, int *group_size) {
  sm_config_quant_mode_for(c, module, bits, group_size, NULL);
}

/* --------------------------------------------------------------- parse */

/* a layer kind name of hybrid models' layer lists; -1 if none */
static int hybrid_kind(const char *k) {
  if (!strcmp(k, "attention") || !strcmp(k, "full_attention")) return SM_LK_ATTN;
  if (!strcmp(k, "linear_attention") || !strcmp(k, "mamba") || !strcmp(k, "conv")) return SM_LK_REC;
  if (!strcmp(k, "mlp")) return SM_LK_MLP;
  if (!strcmp(k, "moe")) return SM_LK_MOE;
  return -1;
}

/* "layer_types" (a kind per layer), SmolLM3's "no_rope_layers" and "no_rope_layer_interval" */
static smelt_status parse_layer_lists(sm_config *c, const src *s, const family *f) {
  const int nl = c->num_hidden_layers;
  const cJSON *lt = get(s, "layer_types");
  if (lt) {
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != nl)
      return sm_err(SMELT_ERR_FORMAT, "%s: \"layer_types\" must be a list of %d layer kinds", s->file, nl);
    int l = 0;
    for (const cJSON *e = lt->child; e; e = e->next, l++) {
      if (!cJSON_IsString(e)) return sm_err(SMELT_ERR_FORMAT, "%s: layer_types[%d] must be a string", s->file, l);
      int kind = f->rec ? hybrid_kind(e->valuestring) : -1;
      if (!strcmp(e->valuestring, "sliding_attention")) c->layer_sliding[l] = 1;
      else if (!strcmp(e->valuestring, "full_attention")) c->layer_sliding[l] = 0;
      else if (kind >= 0) c->layer_kind[l] = (uint8_t)kind;
      else
        return sm_err(SMELT_ERR_UNSUPPORTED,
                      "%s: layer_types[%d] = '%.40s' is not supported (full_attention, "
                      "sliding_attention%s)",
                      s->file, l, e->valuestring, f->rec ? ", attention, linear_attention, mamba, conv, mlp, moe" : "");
    }
    c->has_layer_types = true;
  }
  c->no_rope_layer_interval = f->no_rope_interval;
  TRY(get_int(s, "no_rope_layer_interval", &c->no_rope_layer_interval));
  TRY(check_range(s->file, "no_rope_layer_interval", c->no_rope_layer_interval, 0, 1 << 20));
  const cJSON *nr = get(s, "no_rope_layers");
  if (nr) {
    /* transformers indexes it by layer: at least one entry per layer */
    if (!cJSON_IsArray(nr) || cJSON_GetArraySize(nr) < nl)
      return sm_err(SMELT_ERR_FORMAT, "%s: \"no_rope_layers\" must be a list of at least %d flags", s->file, nl);
    int l = 0;
    for (const cJSON *e = nr->child; e && l < nl; e = e->next, l++) {
      int v;
      if (to_int(e, s->file, "no_rope_layers", &v) || (v != 0 && v != 1))
        return sm_err(SMELT_ERR_FORMAT, "%s: no_rope_layers[%d] must be 0 or 1", s->file, l);
      c->layer_rope[l] = (uint8_t)v;
    }
    c->has_no_rope_layers = true;
  }
  bool bidir = false;
  TRY(get_bool(s, "use_bidirectional_attention", &bidir));
  if (bidir)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: use_bidirectional_attention (an embedding model) is not supported",
                  s->file);
  return SMELT_OK;
}

/* the first of keys present (NULL-terminated list) */
static const cJSON *get_any(const src *s, const char *const *keys, const char **which) {
  for (; *keys; keys++) {
    const cJSON *v = get(s, *keys);
    if (v) {
      if (which) *which = *keys;
      return v;
    }
  }
  return NULL;
}
static smelt_status get_int_any(const src *s, const char *const *keys, int *out) {
  const char *k = NULL;
  const cJSON *v = get_any(s, keys, &k);
  return v ? to_int(v, s->file, k, out) : SMELT_OK;
}
static smelt_status get_bool_any(const src *s, const char *const *keys, bool *out) {
  const char *k = NULL;
  const cJSON *v = get_any(s, keys, &k);
  if (!v) return SMELT_OK;
  if (!cJSON_IsBool(v)) return sm_err(SMELT_ERR_FORMAT, "%s: \"%s\" must be true or false", s->file, k);
  *out = cJSON_IsTrue(v);
  return SMELT_OK;
}
#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* a per-layer list of hybrid layer kinds: Nemotron-H's "hybrid_override_pattern" string (M * - E) or
 * "layers_block_type" list, LFM2's "full_attn_idxs" (the attention layers; the others recurrent) */
static smelt_status parse_rec_layers(sm_config *c, const src *s) {
  const cJSON *pat = get(s, "hybrid_override_pattern");
  const cJSON *lbt = get(s, "layers_block_type");
  const cJSON *fai = get(s, "full_attn_idxs");
  if (pat && !c->has_layer_types) {
    if (!cJSON_IsString(pat))
      return sm_err(SMELT_ERR_FORMAT, "%s: \"hybrid_override_pattern\" must be a string", s->file);
    const size_t n = strlen(pat->valuestring);
    if (n == 0 || n > SM_MAX_LAYERS || strspn(pat->valuestring, "M*-E") != n)
      return sm_err(SMELT_ERR_FORMAT, "%s: hybrid_override_pattern '%.40s' must be 1 to %d of M, *, - and E", s->file,
                    pat->valuestring, SM_MAX_LAYERS);
    c->num_hidden_layers = (int)n; /* transformers: the pattern sets the layer count */
    for (size_t l = 0; l < n; l++) {
      const char ch = pat->valuestring[l];
      c->layer_kind[l] = ch == 'M' ? SM_LK_REC : ch == '*' ? SM_LK_ATTN : ch == '-' ? SM_LK_MLP : SM_LK_MOE;
    }
    c->has_layer_types = true;
  } else if (lbt && !c->has_layer_types) {
    const int n = cJSON_IsArray(lbt) ? cJSON_GetArraySize(lbt) : 0;
    if (n < 1 || n > SM_MAX_LAYERS)
      return sm_err(SMELT_ERR_FORMAT, "%s: \"layers_block_type\" must be a list of 1 to %d layer kinds", s->file,
                    SM_MAX_LAYERS);
    c->num_hidden_layers = n;
    int l = 0;
    for (const cJSON *e = lbt->child; e; e = e->next, l++) {
      const int k = cJSON_IsString(e) ? hybrid_kind(e->valuestring) : -1;
      if (k < 0)
        return sm_err(SMELT_ERR_UNSUPPORTED,
                      "%s: layers_block_type[%d] is not one of attention, full_attention, "
                      "mamba, linear_attention, mlp, moe",
                      s->file, l);
      c->layer_kind[l] = (uint8_t)k;
    }
    c->has_layer_types = true;
  } else if (fai && !c->has_layer_types) {
    if (!cJSON_IsArray(fai))
      return sm_err(SMELT_ERR_FORMAT, "%s: \"full_attn_idxs\" must be a list of layer indices", s->file);
    for (int l = 0; l < c->num_hidden_layers; l++) c->layer_kind[l] = SM_LK_REC;
    for (const cJSON *e = fai->child; e; e = e->next) {
      int l;
      if (to_int(e, s->file, "full_attn_idxs", &l) || l < 0 || l >= c->num_hidden_layers)
        return sm_err(SMELT_ERR_FORMAT, "%s: full_attn_idxs must hold layer indices below %d", s->file,
                      c->num_hidden_layers);
      c->layer_kind[l] = SM_LK_ATTN;
    }
    c->has_layer_types = true;
  } else if (!c->has_layer_types) {
    const int iv = c->rec.attn_interval;
    for (int l = 0; l < c->num_hidden_layers; l++)
      c->layer_kind[l] = iv > 0 && (l + 1) % iv == 0 ? SM_LK_ATTN : SM_LK_REC;
  }
  return SMELT_OK;
}

/* a number of time_step_limit: a JSON number (Python's Infinity becomes one, see sm_config_parse), or
 * "Infinity" / {"__float__": "Infinity"} as other writers spell it; NaN if none */
static double limit_value(const cJSON *v) {
  if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "__float__");
  if (cJSON_IsNumber(v)) return v->valuedouble;
  if (cJSON_IsString(v) && (!strcmp(v->valuestring, "Infinity") || !strcmp(v->valuestring, "inf"))) return INFINITY;
  return NAN;
}

/* The recurrent layers of a hybrid family (f->rec: its defaults). The key names are those of the
 * transformers config classes (with their legacy aliases): Qwen3-Next / Qwen3.5 (linear_*), LFM2
 * (conv_*, block_*), Nemotron-H (mamba_num_heads, ssm_state_size, n_groups, ...) and
 * GraniteMoeHybrid (mamba_n_heads, mamba_d_state, ...). */
static smelt_status parse_rec(sm_config *c, const src *s, const family *f) {
  const char *file = s->file;
  sm_rec_config *r = &c->rec;
  *r = *f->rec;
  TRY(get_int(s, "full_attention_interval", &r->attn_interval));
  TRY(check_range(file, "full_attention_interval", r->attn_interval, 0, SM_MAX_LAYERS));
  TRY(parse_rec_layers(c, s));
  TRY(get_int_any(s, KEYS("linear_conv_kernel_dim", "conv_L_cache", "conv_kernel", "mamba_d_conv"), &r->conv_kernel));
  TRY(check_range(file, "conv kernel", r->conv_kernel, 2, 64));
  TRY(get_bool_any(s, KEYS("conv_bias", "use_conv_bias", "mamba_conv_bias"), &r->conv_bias));
  int n_exp = r->n_experts;
  TRY(get_int_any(s, KEYS("num_experts", "num_local_experts"), &n_exp));
  r->n_experts = n_exp > 0 ? n_exp : 0;
  for (int l = 0; l < c->num_hidden_layers; l++)
    if (c->layer_kind[l] == SM_LK_MOE && !r->n_experts) r->n_experts = 1;
  const int H = c->hidden_size;
  switch (r->kind) {
    case SM_REC_GDN:
      TRY(get_int(s, "linear_num_key_heads", &r->gdn_k_heads));
      TRY(get_int(s, "linear_num_value_heads", &r->gdn_v_heads));
      TRY(get_int(s, "linear_key_head_dim", &r->gdn_k_dim));
      TRY(get_int(s, "linear_value_head_dim", &r->gdn_v_dim));
      TRY(check_range(file, "linear_num_key_heads", r->gdn_k_heads, 1, 4096));
      TRY(check_range(file, "linear_num_value_heads", r->gdn_v_heads, 1, 4096));
      TRY(check_range(file, "linear_key_head_dim", r->gdn_k_dim, 1, 1024));
      TRY(check_range(file, "linear_value_head_dim", r->gdn_v_dim, 1, 1024));
      if (r->gdn_v_heads % r->gdn_k_heads)
        return sm_err(SMELT_ERR_FORMAT,
                      "%s: linear_num_value_heads (%d) is not a multiple of linear_num_key_heads (%d)", file,
                      r->gdn_v_heads, r->gdn_k_heads);
      if (r->n_experts) { /* Qwen3-Next: MoE unless every layer is in mlp_only_layers */
        int step = 1;
        TRY(get_int(s, "decoder_sparse_step", &step));
        const cJSON *mol = get(s, "mlp_only_layers");
        int n_only = cJSON_IsArray(mol) ? cJSON_GetArraySize(mol) : 0;
        if (step <= 0 || step > c->num_hidden_layers || n_only >= c->num_hidden_layers) r->n_experts = 0;
      }
      break;
    case SM_REC_SHORTCONV: {
      /* LFM2: the MLP size from block_ff_dim with its auto adjustment (Lfm2MLP), its other key names */
      int ff = c->intermediate_size, mult_of = 256;
      bool adjust = true;
      float ffm = 1.0f;
      const cJSON *m = NULL;
      if (!f->moe) { /* LFM2-MoE (Lfm2MoeMLP) takes intermediate_size as it is */
        TRY(get_int(s, "block_ff_dim", &ff));
        TRY(get_bool(s, "block_auto_adjust_ff_dim", &adjust));
        TRY(get_int(s, "block_multiple_of", &mult_of));
        m = get(s, "block_ffn_dim_multiplier");
        if (m) TRY(to_float(m, file, "block_ffn_dim_multiplier", &ffm));
        TRY(check_range(file, "block_multiple_of", mult_of, 1, 1 << 20));
      }
      if (adjust && !f->moe) {
        ff = (int)(2.0 * ff / 3.0);
        if (m) ff = (int)(ffm * ff);
        ff = mult_of * ((ff + mult_of - 1) / mult_of);
      }
      TRY(check_range(file, "feed-forward size", ff, 1, 1 << 20));
      c->intermediate_size = ff;
      if (get(s, "theta")) TRY(get_float(s, "theta", &c->rope_theta));
      if (!(c->rope_theta > 0)) return sm_err(SMELT_ERR_FORMAT, "%s: theta must be > 0", file);
      TRY(get_bool(s, "tie_embedding", &c->tie_word_embeddings));
      break;
    }
    case SM_REC_MAMBA2: {
      TRY(get_int_any(s, KEYS("mamba_num_heads", "mamba_n_heads"), &r->m_heads));
      TRY(get_int_any(s, KEYS("ssm_state_size", "mamba_d_state"), &r->m_state));
      TRY(get_int_any(s, KEYS("n_groups", "mamba_n_groups"), &r->m_groups));
      TRY(get_int_any(s, KEYS("expand", "mamba_expand"), &r->m_expand));
      const cJSON *hd = get_any(s, KEYS("mamba_head_dim", "mamba_d_head"), NULL);
      if (hd && !(cJSON_IsString(hd) && !strcmp(hd->valuestring, "auto")))
        TRY(to_int(hd, file, "mamba_head_dim", &r->m_head_dim));
      TRY(check_range(file, "mamba heads", r->m_heads, 1, 65536));
      if (r->m_head_dim == 0) {
        if ((r->m_expand * H) % r->m_heads)
          return sm_err(SMELT_ERR_FORMAT, "%s: mamba heads (%d) must divide mamba_expand * hidden_size", file,
                        r->m_heads);
        r->m_head_dim = r->m_expand * H / r->m_heads;
      }
      TRY(check_range(file, "mamba head dim", r->m_head_dim, 1, 4096));
      TRY(check_range(file, "ssm state size", r->m_state, 1, 4096));
      TRY(check_range(file, "mamba groups", r->m_groups, 1, r->m_heads));
      if (r->m_heads % r->m_groups)
        return sm_err(SMELT_ERR_FORMAT, "%s: mamba groups (%d) must divide the mamba heads (%d)", file, r->m_groups,
                      r->m_heads);
      bool use_bias = false;
      TRY(get_bool(s, "mamba_proj_bias", &r->m_proj_bias));
      TRY(get_bool(s, "use_bias", &use_bias)); /* Nemotron-H: transformers gives in/out_proj use_bias */
      r->m_proj_bias |= use_bias;
      const cJSON *tsl = get_any(s, KEYS("time_step_limit", "mamba_dt_limit"), NULL);
      if (tsl) {
        const cJSON *a = cJSON_IsArray(tsl) && cJSON_GetArraySize(tsl) == 2 ? tsl->child : NULL;
        double lo = a ? limit_value(a) : NAN, hi = a ? limit_value(a->next) : NAN;
        if (!(lo >= 0) || !(hi >= lo))
          return sm_err(SMELT_ERR_FORMAT, "%s: \"time_step_limit\" must be [min, max] with 0 <= min <= max", file);
        r->dt_min = (float)lo;
        r->dt_max = hi > 3e38 ? INFINITY : (float)hi;
      }
      char pe[32] = "";
      TRY(get_str(s, "position_embedding_type", pe, sizeof pe));
      if (pe[0]) r->no_rope = strcmp(pe, "rope") != 0;
      /* Nemotron-H's MLP activation; its earlier configs name the attention head size attention_head_dim */
      TRY(get_str(s, "mlp_hidden_act", c->hidden_act, sizeof c->hidden_act));
      if (!get(s, "head_dim") && get(s, "attention_head_dim")) {
        TRY(get_int(s, "attention_head_dim", &c->head_dim));
        TRY(check_range(file, "attention_head_dim", c->head_dim, 1, 1024));
      }
      /* GraniteMoeHybrid without experts: transformers' MLP is its shared_mlp */
      if (!r->n_experts) TRY(get_int(s, "shared_intermediate_size", &c->intermediate_size));
      TRY(check_range(file, "shared_intermediate_size", c->intermediate_size, 1, 1 << 20));
      break;
    }
    case SM_REC_NONE: break;
  }
  return SMELT_OK;
}

void sm_config_rec_state(const sm_config *c, size_t *conv_floats, size_t *ssm_floats) {
  const sm_rec_config *r = &c->rec;
  const size_t K1 = r->conv_kernel > 1 ? (size_t)r->conv_kernel - 1 : 0;
  *conv_floats = K1 * (size_t)sm_config_rec_conv_dim(c);
  switch (r->kind) {
    case SM_REC_GDN: *ssm_floats = (size_t)r->gdn_v_heads * r->gdn_v_dim * r->gdn_k_dim; break;
    case SM_REC_MAMBA2: *ssm_floats = (size_t)r->m_heads * r->m_head_dim * r->m_state; break;
    default: *ssm_floats = 0; break;
  }
}

int sm_config_rec_conv_dim(const sm_config *c) {
  const sm_rec_config *r = &c->rec;
  switch (r->kind) {
    case SM_REC_GDN: return 2 * r->gdn_k_heads * r->gdn_k_dim + r->gdn_v_heads * r->gdn_v_dim;
    case SM_REC_SHORTCONV: return r->sc_channels ? r->sc_channels : c->hidden_size;
    case SM_REC_MAMBA2: return r->m_heads * r->m_head_dim + 2 * r->m_groups * r->m_state;
    default: return 0;
  }
}

int sm_config_attn_layers(const sm_config *c) {
  int n = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) n += c->layer_kind[l] == SM_LK_ATTN;
  return n;
}

static smelt_status parse_config(sm_config *c, const char *file, sm_config_defaults_fn lookup) {
  const cJSON *root = c->json;
  if (!cJSON_IsObject(root)) return sm_err(SMELT_ERR_FORMAT, "%s: not a JSON object", file);
  const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
  if (tc && !cJSON_IsNull(tc) && !cJSON_IsObject(tc))
    return sm_err(SMELT_ERR_FORMAT, "%s: \"text_config\" must be an object", file);
  c->text = (cJSON *)(cJSON_IsObject(tc) ? tc : root);
  src s = {c->text, root, file};

  /* model type: the LM's (text_config's) if given. A vision-language checkpoint (text_config, or a
   * vision_config next to the LM's own fields) keeps its outer type in vlm_type. */
  const cJSON *rmt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  if (!cJSON_IsString(rmt) || !rmt->valuestring[0]) rmt = NULL;
  const cJSON *mt = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "model_type") : NULL;
  if (!cJSON_IsString(mt) || !mt->valuestring[0]) mt = NULL;
  if (!mt && !rmt) return sm_err(SMELT_ERR_FORMAT, "%s: missing \"model_type\"", file);
  const char *outer = rmt ? rmt->valuestring : "";
  const sm_config_defaults *of = rmt && lookup ? lookup(outer) : NULL;
  const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
  const bool vision = cJSON_IsObject(vc);
  const char *type = mt ? mt->valuestring : outer;
  /* the outer type names a packaging whose LM type is known: use it when the text config does not say */
  if (!mt && of && of->text_type && (cJSON_IsObject(tc) || vision)) type = of->text_type;
  if (strlen(type) >= sizeof c->model_type || strlen(outer) >= sizeof c->vlm_type)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: model_type '%.40s...' is too long", file,
                  strlen(type) >= sizeof c->model_type ? type : outer);
  snprintf(c->model_type, sizeof c->model_type, "%s", type);
  if ((cJSON_IsObject(tc) && rmt && strcmp(outer, type)) || vision)
    snprintf(c->vlm_type, sizeof c->vlm_type, "%s", outer);
  const family *f = find_family(lookup, c->model_type);

  c->vocab_size = f->vocab;
  c->hidden_size = f->hidden;
  c->intermediate_size = f->inter;
  c->num_hidden_layers = f->layers;
  c->num_attention_heads = f->heads;
  c->max_position_embeddings = f->max_pos;
  TRY(get_int(&s, "vocab_size", &c->vocab_size));
  TRY(get_int(&s, "hidden_size", &c->hidden_size));
  TRY(get_int(&s, "intermediate_size", &c->intermediate_size));
  TRY(get_int(&s, "num_hidden_layers", &c->num_hidden_layers));
  TRY(get_int(&s, "num_attention_heads", &c->num_attention_heads));
  TRY(get_int(&s, "max_position_embeddings", &c->max_position_embeddings));
  const char *req[] = {"vocab_size",        "hidden_size",         "intermediate_size",
                       "num_hidden_layers", "num_attention_heads", "max_position_embeddings"};
  int *reqv[] = {&c->vocab_size,        &c->hidden_size,         &c->intermediate_size,
                 &c->num_hidden_layers, &c->num_attention_heads, &c->max_position_embeddings};
  for (size_t i = 0; i < SM_ARRAY_LEN(req); i++)
    if (!get(&s, req[i]) && *reqv[i] == 0) {
      if (i == 5) c->max_position_embeddings = 2048; /* PretrainedConfig has no default; be lenient */
      else return sm_err(SMELT_ERR_FORMAT, "%s: missing \"%s\" (model_type '%s')", file, req[i], c->model_type);
    }
  TRY(check_range(file, "vocab_size", c->vocab_size, 1, 1 << 24));
  TRY(check_range(file, "hidden_size", c->hidden_size, 1, 1 << 16));
  TRY(check_range(file, "intermediate_size", c->intermediate_size, 1, 1 << 20));
  TRY(check_range(file, "num_hidden_layers", c->num_hidden_layers, 1, 1024));
  TRY(check_range(file, "num_attention_heads", c->num_attention_heads, 1, 1024));
  TRY(check_range(file, "max_position_embeddings", c->max_position_embeddings, 1, 1 << 27));

  c->num_key_value_heads = f->kv ? f->kv : c->num_attention_heads;
  TRY(get_int(&s, "num_key_value_heads", &c->num_key_value_heads));
  TRY(check_range(file, "num_key_value_heads", c->num_key_value_heads, 1, c->num_attention_heads));
  if (c->num_attention_heads % c->num_key_value_heads)
    return sm_err(SMELT_ERR_FORMAT, "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", file,
                  c->num_attention_heads, c->num_key_value_heads);

  c->head_dim = f->head_dim;
  TRY(get_int(&s, "head_dim", &c->head_dim));
  if (c->head_dim == 0) {
    if (c->hidden_size % c->num_attention_heads)
      return sm_err(SMELT_ERR_FORMAT,
                    "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d) and no head_dim is given", file,
                    c->hidden_size, c->num_attention_heads);
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  TRY(check_range(file, "head_dim", c->head_dim, 1, 1024));
  if ((long long)c->head_dim * c->num_attention_heads > (1 << 17))
    return sm_err(SMELT_ERR_FORMAT, "%s: head_dim * num_attention_heads = %lld is too large", file,
                  (long long)c->head_dim * c->num_attention_heads);

  c->rms_norm_eps = f->eps;
  if (get(&s, "rms_norm_eps")) TRY(get_float(&s, "rms_norm_eps", &c->rms_norm_eps));
  else if (get(&s, "layer_norm_eps")) TRY(get_float(&s, "layer_norm_eps", &c->rms_norm_eps));
  else if (get(&s, "norm_eps")) TRY(get_float(&s, "norm_eps", &c->rms_norm_eps)); /* LFM2 */
  else TRY(get_float(&s, "layer_norm_epsilon", &c->rms_norm_eps));
  if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
    return sm_err(SMELT_ERR_FORMAT, "%s: rms_norm_eps %g out of range (0, 1)", file, c->rms_norm_eps);

  /* rope */
  c->rope_theta = f->theta;
  c->rope_local_theta = f->local_theta;
  TRY(get_float(&s, "rope_theta", &c->rope_theta));
  TRY(get_float(&s, "rope_local_base_freq", &c->rope_local_theta));
  const cJSON *rs = get(&s, "rope_scaling");
  const cJSON *rp = get(&s, "rope_parameters"); /* transformers >= 5 */
  TRY(parse_rope(c, rs, file));
  if (!rs && cJSON_IsObject(rp)) {
    const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
    if (cJSON_IsObject(full)) {
      TRY(parse_rope(c, full, file));
      const cJSON *slide = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
      if (cJSON_IsObject(slide)) {
        src ss = {slide, NULL, file};
        TRY(get_float(&ss, "rope_theta", &c->rope_local_theta));
        char st[32] = "default";
        const cJSON *tv = get(&ss, "rope_type");
        if (!tv) tv = get(&ss, "type");
        if (tv && cJSON_IsString(tv)) snprintf(st, sizeof st, "%s", tv->valuestring);
        if (strcmp(st, "default"))
          return sm_err(SMELT_ERR_UNSUPPORTED,
                        "%s: rope_parameters.sliding_attention type '%s' is not supported "
                        "(only default)",
                        file, st);
      }
    } else {
      TRY(parse_rope(c, rp, file));
    }
  }
  if (!(c->rope_theta > 0)) return sm_err(SMELT_ERR_FORMAT, "%s: rope_theta must be > 0", file);
  if (c->rope_local_theta < 0) return sm_err(SMELT_ERR_FORMAT, "%s: rope_local_base_freq must be > 0", file);
  /* original_max_position_embeddings: as transformers' standardize_rope_params, a top-level value (Phi-3's
   * config attribute, class default 4096) takes priority over the rope dict's; else max_position_embeddings */
  if (c->rope_type == SM_ROPE_LONGROPE || c->rope_type == SM_ROPE_YARN || c->rope_type == SM_ROPE_LLAMA3) {
    int top = f->orig_max_pos;
    TRY(get_int(&s, "original_max_position_embeddings", &top));
    if (top > 0) c->rope_original_max_pos = top;
    if (c->rope_original_max_pos == 0) c->rope_original_max_pos = c->max_position_embeddings;
  }
  if (c->rope_llama4_beta > 0 && c->rope_original_max_pos <= 0)
    return sm_err(SMELT_ERR_FORMAT, "%s: llama_4_scaling_beta needs original_max_position_embeddings", file);
  if (c->rope_original_max_pos)
    TRY(check_range(file, "original_max_position_embeddings", c->rope_original_max_pos, 1, 1 << 27));

  float prf = f->partial_rotary > 0 ? f->partial_rotary : 1.0f;
  TRY(get_float(&s, "partial_rotary_factor", &prf));
  if (c->rope_partial_factor > 0) prf = c->rope_partial_factor;
  if (!(prf > 0 && prf <= 1))
    return sm_err(SMELT_ERR_FORMAT, "%s: partial_rotary_factor %g out of range (0, 1]", file, prf);
  c->partial_rotary_dim = (int)(c->head_dim * prf);
  if (c->rope_type == SM_ROPE_PROPORTIONAL) { /* the whole head rotates, the proportion zeroes frequencies */
    c->rope_partial_factor = prf;
    c->partial_rotary_dim = c->head_dim;
  }
  if (c->partial_rotary_dim < 2 || c->partial_rotary_dim % 2)
    return sm_err(SMELT_ERR_FORMAT,
                  "%s: rotary dimension %d (head_dim %d * partial_rotary_factor %g) must be even and >= 2", file,
                  c->partial_rotary_dim, c->head_dim, prf);

  c->tie_word_embeddings = f->tie;
  c->attention_bias = f->attn_bias;
  TRY(get_bool(&s, "tie_word_embeddings", &c->tie_word_embeddings));
  TRY(get_bool(&s, "attention_bias", &c->attention_bias));
  TRY(get_bool(&s, "mlp_bias", &c->mlp_bias));

  /* sliding window */
  c->use_sliding_window = f->sw_mode == 1;
  c->sliding_window = 0;
  if (f->sw_mode) {
    int sw = f->sliding;
    const cJSON *v = get(&s, "sliding_window");
    if (v) TRY(to_int(v, file, "sliding_window", &sw));
    else if (cJSON_GetObjectItemCaseSensitive(c->text, "sliding_window")) sw = 0; /* explicit null */
    bool use = f->sw_mode == 1;
    TRY(get_bool(&s, "use_sliding_window", &use));
    c->use_sliding_window = use;
    c->sliding_window = use ? sw : 0;
    if (c->sliding_window < 0) return sm_err(SMELT_ERR_FORMAT, "%s: sliding_window must be >= 0", file);
  }
  c->max_window_layers = f->max_window_layers;
  TRY(get_int(&s, "max_window_layers", &c->max_window_layers));
  TRY(check_range(file, "max_window_layers", c->max_window_layers, 0, 1 << 20));
  c->sliding_window_pattern = f->sw_pattern;
  const cJSON *swp = get(&s, "sliding_window_pattern");
  if (cJSON_IsString(swp)) { /* EXAONE 4: "LLLG", repeated over the layers (L: sliding, G: full) */
    size_t n = strlen(swp->valuestring);
    if (n == 0 || strspn(swp->valuestring, "LG") != n)
      return sm_err(SMELT_ERR_FORMAT, "%s: sliding_window_pattern '%.40s' must be a string of L and G", file,
                    swp->valuestring);
    c->has_layer_types = true;
    for (int l = 0; l < c->num_hidden_layers; l++) c->layer_sliding[l] = swp->valuestring[l % n] == 'L';
    c->sliding_window_pattern = 0;
  } else {
    TRY(get_int(&s, "sliding_window_pattern", &c->sliding_window_pattern));
  }
  TRY(check_range(file, "sliding_window_pattern", c->sliding_window_pattern, 0, 1024));
  TRY(parse_layer_lists(c, &s, f));

  snprintf(c->hidden_act, sizeof c->hidden_act, "%s", f->act);
  /* Gemma modules use hidden_activation (falling back to gelu_pytorch_tanh), never hidden_act */
  if (f->gemma_act) TRY(get_str(&s, "hidden_activation", c->hidden_act, sizeof c->hidden_act));
  else TRY(get_str(&s, "hidden_act", c->hidden_act, sizeof c->hidden_act));

  c->final_logit_softcapping = f->final_softcap;
  c->attn_logit_softcapping = f->attn_softcap;
  c->query_pre_attn_scalar = f->qpas;
  /* explicit null disables the family default */
  const char *capk[] = {"final_logit_softcapping", "attn_logit_softcapping"};
  float *capv[] = {&c->final_logit_softcapping, &c->attn_logit_softcapping};
  for (int i = 0; i < 2; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->text, capk[i]);
    if (cJSON_IsNull(v)) *capv[i] = 0;
    TRY(get_float(&s, capk[i], capv[i]));
    if (*capv[i] < 0) return sm_err(SMELT_ERR_FORMAT, "%s: %s must be >= 0", file, capk[i]);
  }
  TRY(get_float(&s, "query_pre_attn_scalar", &c->query_pre_attn_scalar));
  if (c->query_pre_attn_scalar < 0) return sm_err(SMELT_ERR_FORMAT, "%s: query_pre_attn_scalar must be >= 0", file);

  /* multipliers (Granite) and logit_scale (Cohere) */
  c->embedding_multiplier = c->attention_multiplier = c->residual_multiplier = c->logits_scaling = 1.0f;
  c->logit_scale = f->logit_scale > 0 ? f->logit_scale : 1.0f;
  const char *mk[] = {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling",
                      "logit_scale"};
  float *mv[] = {&c->embedding_multiplier, &c->attention_multiplier, &c->residual_multiplier, &c->logits_scaling,
                 &c->logit_scale};
  for (size_t i = 0; i < SM_ARRAY_LEN(mk); i++) {
    TRY(get_float(&s, mk[i], mv[i]));
    if (!(*mv[i] > 0)) return sm_err(SMELT_ERR_FORMAT, "%s: %s must be > 0", file, mk[i]);
  }

  if (f->rec) TRY(parse_rec(c, &s, f));

  /* special tokens */
  c->bos_id = -1;
  const cJSON *bos = get(&s, "bos_token_id");
  if (cJSON_IsArray(bos)) bos = bos->child;
  if (bos) {
    int b;
    if (to_int(bos, file, "bos_token_id", &b) != SMELT_OK || b < 0)
      return sm_err(SMELT_ERR_FORMAT, "%s: \"bos_token_id\" must be a token id", file);
    c->bos_id = b;
  }
  TRY(add_token_ids(c, get(&s, "eos_token_id"), file, "eos_token_id"));
  TRY(sm_config_parse_moe(c, f->moe, file));
  TRY(sm_config_parse_mla(c, f->mla, file));
  if (f->per_layer_shapes) TRY(sm_config_parse_shapes(c, f, file));

  return parse_quant(c, file);
}

static smelt_status parse_gen(sm_config *c, const cJSON *g, const family *f, bool cfg_has_eos, bool cfg_has_bos) {
  const char *file = "generation_config.json";
  if (g) {
    if (!cJSON_IsObject(g)) return sm_err(SMELT_ERR_FORMAT, "%s: not a JSON object", file);
    src s = {g, NULL, file};
    TRY(get_float(&s, "temperature", &c->gen_temperature));
    TRY(get_float(&s, "top_p", &c->gen_top_p));
    TRY(get_int(&s, "top_k", &c->gen_top_k));
    TRY(get_float(&s, "repetition_penalty", &c->gen_repetition_penalty));
    bool ds = false;
    if (get(&s, "do_sample")) {
      TRY(get_bool(&s, "do_sample", &ds));
      c->gen_do_sample = ds;
    }
    if (c->gen_temperature < 0 || c->gen_top_p < 0 || c->gen_top_p > 1 || c->gen_top_k < 0 ||
        c->gen_repetition_penalty < 0)
      return sm_err(SMELT_ERR_FORMAT, "%s: sampling parameter out of range", file);
    TRY(add_token_ids(c, get(&s, "eos_token_id"), file, "eos_token_id"));
    if (!cfg_has_bos) {
      const cJSON *bos = get(&s, "bos_token_id");
      if (cJSON_IsArray(bos)) bos = bos->child;
      int b;
      if (bos && (to_int(bos, file, "bos_token_id", &b) != SMELT_OK || b < 0))
        return sm_err(SMELT_ERR_FORMAT, "%s: \"bos_token_id\" must be a token id", file);
      if (bos) {
        c->bos_id = b;
        cfg_has_bos = true;
      }
    }
  }
  (void)cfg_has_eos;
  if (c->n_eos == 0 && f->eos >= 0) c->eos_ids[c->n_eos++] = f->eos;
  if (!cfg_has_bos && c->bos_id < 0) c->bos_id = f->bos;
  return SMELT_OK;
}

/* Python's json module writes the floats JSON has no literal for as Infinity, -Infinity and NaN, and
 * transformers configs carry them (Nemotron-H's time_step_limit). A copy with those tokens outside
 * strings replaced by 1e999 (which parses as infinity), -1e999 and null; NULL when there are none. */
static char *python_literals(const char *js, size_t len, size_t *out_len) {
  static const struct {
    const char *tok, *rep;
  } k[] = {{"-Infinity", "-1e999"}, {"Infinity", "1e999"}, {"NaN", "null"}};
  sm_buf b = SM_BUF_INIT;
  bool in_str = false, any = false;
  size_t from = 0;
  for (size_t i = 0; i < len; i++) {
    const char ch = js[i];
    if (in_str) {
      if (ch == '\\') i++;
      else if (ch == '"') in_str = false;
      continue;
    }
    if (ch == '"') {
      in_str = true;
      continue;
    }
    for (size_t j = 0; j < SM_ARRAY_LEN(k); j++) {
      const size_t n = strlen(k[j].tok);
      if (i + n <= len && !memcmp(js + i, k[j].tok, n)) {
        sm_buf_put(&b, js + from, i - from);
        sm_buf_puts(&b, k[j].rep);
        i += n - 1;
        from = i + 1;
        any = true;
        break;
      }
    }
  }
  if (!any) {
    sm_buf_free(&b);
    return NULL;
  }
  sm_buf_put(&b, js + from, len - from);
  *out_len = b.n;
  return sm_buf_take(&b);
}

smelt_status sm_config_parse(const char *config_json, size_t len, const char *gen_json, size_t gen_len,
                             sm_config_defaults_fn lookup, sm_config *out) {
  if (!out) return sm_err(SMELT_ERR_INVALID, "sm_config_parse: out is NULL");
  memset(out, 0, sizeof *out);
  out->bos_id = -1;
  out->rope_truncate = true;
  out->gen_do_sample = -1;
  if (!config_json) return sm_err(SMELT_ERR_INVALID, "sm_config_parse: no config text");
  char *fixed = python_literals(config_json, len, &len);
  out->json = cJSON_ParseWithLength(fixed ? fixed : config_json, len);
  free(fixed);
  if (!out->json) return sm_err(SMELT_ERR_FORMAT, "config.json: not valid JSON");
  smelt_status rc = parse_config(out, "config.json", lookup);
  cJSON *g = NULL;
  if (rc == SMELT_OK && gen_json) {
    g = cJSON_ParseWithLength(gen_json, gen_len);
    if (!g) rc = sm_err(SMELT_ERR_FORMAT, "generation_config.json: not valid JSON");
  }
  if (rc == SMELT_OK) {
    src s = {out->text, out->json, "config.json"};
    rc = parse_gen(out, g, find_family(lookup, out->model_type), get(&s, "eos_token_id") != NULL, out->bos_id >= 0);
  }
  cJSON_Delete(g);
  if (rc != SMELT_OK) sm_config_free(out);
  return rc;
}

smelt_status sm_config_load(const char *model_dir, sm_config_defaults_fn lookup, sm_config *out) {
  if (!out) return sm_err(SMELT_ERR_INVALID, "sm_config_load: out is NULL");
  memset(out, 0, sizeof *out);
  if (!model_dir) return sm_err(SMELT_ERR_INVALID, "sm_config_load: model_dir is NULL");
  char *p = sm_path_join(model_dir, "config.json");
  char *txt = NULL, *gtxt = NULL;
  size_t len = 0, glen = 0;
  smelt_status rc = sm_read_file_max(p, SM_FILE_MAX_JSON, &txt, &len);
  free(p);
  if (rc != SMELT_OK) return rc;
  p = sm_path_join(model_dir, "generation_config.json");
  struct stat gst;
  if (stat(p, &gst) == 0) rc = sm_read_file_max(p, SM_FILE_MAX_JSON, &gtxt, &glen);
  free(p);
  if (rc == SMELT_OK) {
    rc = sm_config_parse(txt, len, gtxt, glen, lookup, out);
    if (rc != SMELT_OK) {
      /* prefix the directory so the message says which model */
      char msg[768];
      snprintf(msg, sizeof msg, "%s", sm_errmsg());
      sm_err(rc, "%s/%s", model_dir, msg);
    }
  }
  free(txt);
  free(gtxt);
  return rc;
}

void sm_config_free(sm_config *c) {
  if (!c) return;
  cJSON_Delete(c->json);
  c->json = c->quant = c->text = NULL;
}
