/* Synthetic random-weight MLX-format checkpoints of known shapes (benchmarks, tests), in the tensor
 * layout of any runnable registered family (llama by default): every slot the family names, with the
 * registry's shapes. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "format/st_write.h"
#include "model/model.h"

static const sm_synth_shape g_shapes[] = {
  { "test", 64, 2, 4, 2, 256, 512, false, NULL, 0, NULL },
  { "tiny", 256, 4, 8, 4, 768, 4096, true, NULL, 0, NULL },
  { "test1b", 2048, 2, 32, 8, 8192, 1024, true, NULL, 0, NULL },   /* two Llama-3.2-1B layers, small vocab (tests) */
  { "test8b", 4096, 2, 32, 8, 14336, 1024, true, NULL, 0, NULL },  /* two Llama-3.1-8B layers, small vocab (tests) */
  { "1b", 2048, 16, 32, 8, 8192, 128256, true, NULL, 0, NULL },   /* Llama-3.2-1B */
  { "3b", 3072, 28, 24, 8, 8192, 128256, true, NULL, 0, NULL },   /* Llama-3.2-3B */
  { "8b", 4096, 32, 32, 8, 14336, 128256, false, NULL, 0, NULL }, /* Llama-3.1-8B */
  /* other families' shapes (and the config members that change what a layer computes) */
  { "gemma3-1b", 1152, 26, 4, 1, 6912, 262144, true, "gemma3_text", 256,
    "{\"sliding_window\": 512, \"max_position_embeddings\": 32768, \"rope_theta\": 1000000}" },
  { "gemma3-4b", 2560, 34, 8, 4, 10240, 262208, true, "gemma3_text", 256,
    "{\"sliding_window\": 1024, \"rope_theta\": 1000000, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}}" },
  { "phi4-mini", 3072, 32, 24, 8, 8192, 200064, true, "phi3", 128,
    "{\"partial_rotary_factor\": 0.75, \"original_max_position_embeddings\": 4096, \"rope_theta\": 10000,"
    " \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": \"48x1.0\", \"long_factor\": \"48x1.5\"}}" },
  { "mistral-small-24b", 5120, 40, 32, 8, 32768, 131072, false, "mistral", 128,
    "{\"rope_theta\": 1000000000, \"sliding_window\": null}" },
  /* hybrid models (recurrent layers; "layer_types": null drops the family's two-layer test pattern) */
  { "qwen3.5-9b", 4096, 32, 16, 4, 12288, 248320, false, "qwen3_5_text", 256, /* Qwen3.5-9B's text model */
    "{\"layer_types\": null, \"full_attention_interval\": 4, \"linear_num_key_heads\": 16,"
    " \"linear_num_value_heads\": 32, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
    " \"linear_conv_kernel_dim\": 4, \"partial_rotary_factor\": 0.25, \"rope_theta\": 10000000}" },
  { "lfm2-1.2b", 2048, 16, 32, 8, 8192, 65536, true, "lfm2", 64, /* LFM2-1.2B */
    "{\"layer_types\": null, \"full_attn_idxs\": [2, 5, 8, 10, 12, 14], \"rope_theta\": 1000000}" },
};
static uint64_t rng_next(uint64_t *s) { uint64_t x = *s; x ^= x << 13; x ^= x >> 7; x ^= x << 17; return *s = x; }

typedef struct { int bits; uint64_t seed; bool conv; } fill_ctx;

static bool has_suffix(const char *s, const char *suf) {
  const size_t n = strlen(s), k = strlen(suf);
  return n >= k && !strcmp(s + n - k, suf);
}

static void fill_random(void *user, void *dst, size_t n, const char *name) {
  fill_ctx *c = user;
  const char *dot = strrchr(name, '.');
  uint64_t s = c->seed += 0x9e3779b97f4a7c15ULL;
  if (dot && (!strcmp(dot, ".scales") || !strcmp(dot, ".biases"))) {
    uint16_t *h = dst;
    int levels = (1 << c->bits) - 1;
    for (size_t i = 0; i < n / 2; i++) {
      float sc = 0.02f / levels * (1.0f + (float)(rng_next(&s) % 100) / 200.0f);
      h[i] = sm_f32_to_bf16(!strcmp(dot, ".scales") ? sc : -sc * levels / 2);
    }
  } else if (has_suffix(name, "A_log")) { /* Mamba-2 / Gated DeltaNet decay rates: A = -exp(A_log) */
    uint16_t *h = dst;
    for (size_t i = 0; i < n / 2; i++) h[i] = sm_f32_to_bf16((float)(rng_next(&s) % 1000) * 2.5e-3f);
  } else if (has_suffix(name, "dt_bias")) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n / 2; i++) h[i] = sm_f32_to_bf16(-3.0f + (float)(rng_next(&s) % 1000) * 3e-3f);
  } else if (has_suffix(name, ".D")) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n / 2; i++) h[i] = sm_f32_to_bf16(1.0f);
  } else if (c->conv || (dot && !strcmp(dot, ".bias"))) { /* convolution weights (never quantized), biases */
    uint16_t *h = dst;
    for (size_t i = 0; i < n / 2; i++) h[i] = sm_f32_to_bf16(((float)(rng_next(&s) % 2001) - 1000.0f) * 1e-4f);
  } else if (strstr(name, "norm")) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n / 2; i++) h[i] = sm_f32_to_bf16(1.0f);
  } else if (c->bits == 0) { /* dense bf16 weights ~ N(0, 0.02)-ish */
    uint16_t *h = dst;
    for (size_t i = 0; i < n / 2; i++) h[i] = sm_f32_to_bf16(((float)(rng_next(&s) % 2001) - 1000.0f) * 2e-5f);
  } else {
    uint64_t *q = dst;
    for (size_t i = 0; i < n / 8; i++) q[i] = rng_next(&s);
    for (size_t i = n / 8 * 8; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)rng_next(&s);
  }
}

static void add_linear(sm_st_writer *w, fill_ctx *fc, const char *prefix, int64_t rows, int64_t cols, int bits, int gs) {
  char n[256];
  if (bits == 0) {
    int64_t sh[2] = { rows, cols };
    snprintf(n, sizeof n, "%s.weight", prefix);
    sm_stw_add(w, n, SM_DT_BF16, 2, sh, NULL, fill_random, fc);
    return;
  }
  int64_t sw[2] = { rows, cols * bits / 32 }, ss[2] = { rows, cols / gs };
  snprintf(n, sizeof n, "%s.weight", prefix);
  sm_stw_add(w, n, SM_DT_U32, 2, sw, NULL, fill_random, fc);
  snprintf(n, sizeof n, "%s.scales", prefix);
  sm_stw_add(w, n, SM_DT_BF16, 2, ss, NULL, fill_random, fc);
  snprintf(n, sizeof n, "%s.biases", prefix);
  sm_stw_add(w, n, SM_DT_BF16, 2, ss, NULL, fill_random, fc);
}

/* "48x1.0" in a synthetic shape's extra config: a list of 48 numbers 1.0 (longrope factors) */
static void expand_lists(cJSON *o) {
  for (cJSON *e = o ? o->child : NULL, *next; e; e = next) {
    next = e->next;
    if (cJSON_IsObject(e)) { expand_lists(e); continue; }
    int n;
    double v;
    if (!cJSON_IsString(e) || sscanf(e->valuestring, "%dx%lf", &n, &v) != 2 || n <= 0 || n > 4096) continue;
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v));
    cJSON_ReplaceItemInObjectCaseSensitive(o, e->string, a);
  }
}

/* Write a random-weight MLX-format checkpoint of a family into dir (skipped if it exists). */
smelt_status sm_make_synthetic(const sm_synth_shape *sh, int bits, int gs, const char *dir, bool verbose) {
  const char *ftype = sh->family ? sh->family : "llama";
  const sm_family *fam = sm_family_runnable(ftype);
  if (!fam) return sm_err(SMELT_ERR_INVALID, "synthetic models: unknown family '%s'", ftype);
  const sm_recipe *r = fam->recipe;
  const bool llama3_rope = !strcmp(fam->model_type, "llama");
  const int64_t hd = sh->head_dim > 0 ? sh->head_dim : sh->hidden / sh->heads;
  char *cfgp = sm_path_join(dir, "config.json"), *stp = sm_path_join(dir, "model.safetensors");
  smelt_status st = SMELT_OK;
  if (bits && (sh->hidden % gs || sh->ffn % gs || (sh->heads * hd) % gs)) {
    st = sm_err(SMELT_ERR_INVALID, "group size %d does not divide the %s shape", gs, sh->name);
    goto out;
  }
  if (sm_file_exists(cfgp) && sm_file_exists(stp)) goto out;
  mkdir(dir, 0755);
  if (verbose) fprintf(stderr, "smelt: writing synthetic %s model (%d-bit) to %s ...\n", sh->name, bits, dir);
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "model_type", fam->model_type);
  cJSON_AddNumberToObject(c, "hidden_size", sh->hidden);
  cJSON_AddNumberToObject(c, "num_hidden_layers", sh->layers);
  cJSON_AddNumberToObject(c, "num_attention_heads", sh->heads);
  cJSON_AddNumberToObject(c, "num_key_value_heads", sh->kv_heads);
  cJSON_AddNumberToObject(c, "intermediate_size", sh->ffn);
  cJSON_AddNumberToObject(c, "vocab_size", sh->vocab);
  cJSON_AddNumberToObject(c, "max_position_embeddings", 131072);
  cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-5);
  cJSON_AddNumberToObject(c, "rope_theta", 500000);
  cJSON_AddBoolToObject(c, "tie_word_embeddings", sh->tied);
  cJSON_AddNumberToObject(c, "head_dim", (double)hd);
  cJSON_AddBoolToObject(c, "attention_bias", r->qkv_bias);
  if (llama3_rope) {
    cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", "llama3");
    cJSON_AddNumberToObject(rs, "factor", 32.0);
    cJSON_AddNumberToObject(rs, "low_freq_factor", 1.0);
    cJSON_AddNumberToObject(rs, "high_freq_factor", 4.0);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 8192);
  }
  const char *extras[2] = { fam->synth, sh->extra };
  for (int xi = 0; xi < 2; xi++) {
    if (!extras[xi]) continue;
    cJSON *x = cJSON_Parse(extras[xi]);
    if (!x) { cJSON_Delete(c); st = sm_err(SMELT_ERR_INVALID, "synthetic %s: bad extra config", sh->name); goto out; }
    expand_lists(x);
    for (cJSON *e = x->child; e; e = e->next) {
      cJSON_DeleteItemFromObjectCaseSensitive(c, e->string);
      cJSON_AddItemToObject(c, e->string, cJSON_Duplicate(e, true));
    }
    cJSON_Delete(x);
  }
  if (bits) {
    cJSON *q = cJSON_AddObjectToObject(c, "quantization");
    cJSON_AddNumberToObject(q, "group_size", gs);
    cJSON_AddNumberToObject(q, "bits", bits);
  }
  char *js = cJSON_Print(c);
  cJSON_Delete(c);
  FILE *f = fopen(cfgp, "w");
  if (!f) { free(js); st = sm_err(SMELT_ERR_IO, "cannot write %s", cfgp); goto out; }
  fputs(js, f);
  fclose(f);
  free(js);
  /* the slots of each layer: the config just written, as smelt parses it (layer kinds, recurrent sizes) */
  sm_config *sc = sm_xcalloc(1, sizeof *sc);
  if ((st = sm_family_config_load(dir, sc))) { free(sc); goto out; }
  sm_st_writer *w = sm_stw_new();
  fill_ctx fc = { bits, 12345, false }, fconv = { 0, 777, true };
  const sm_tensor_names *nm = fam->names;
  const int64_t H = sh->hidden;
  const sm_rec_config *rc = &sc->rec;
  char n[256];
  snprintf(n, sizeof n, "%s%s", nm->root, nm->embed);
  add_linear(w, &fc, n, sh->vocab, H, bits, gs);
  if (!sc->tie_word_embeddings) add_linear(w, &fc, nm->lm_head, sh->vocab, H, bits, gs);
  int64_t vs[1] = { H };
  snprintf(n, sizeof n, "%s%s.weight", nm->root, nm->final_norm);
  sm_stw_add(w, n, SM_DT_BF16, 1, vs, NULL, fill_random, &fc);
  for (int l = 0; l < sc->num_hidden_layers; l++)
    for (int s = 0; s < SM_T_LAYER_COUNT; s++) {
      if (!nm->t[s] || !sm_family_slot_used(fam, sc, l, (sm_layer_tensor)s)) continue;
      if ((s == SM_T_Q_NORM || s == SM_T_K_NORM) && r->qk_norm == SM_QK_NORM_NONE) continue;
      int64_t rows, cols;
      sm_family_slot_shape(fam, sc, (sm_layer_tensor)s, &rows, &cols);
      snprintf(n, sizeof n, "%s%s.%d.%s", nm->root, nm->layers, l, nm->t[s]);
      if (s == SM_T_REC_CONV) { /* [channels, kernel, 1], as MLX stores a depthwise Conv1d */
        int64_t cs[3] = { rows, cols, 1 };
        snprintf(n, sizeof n, "%s%s.%d.%s.weight", nm->root, nm->layers, l, nm->t[s]);
        sm_stw_add(w, n, SM_DT_BF16, 3, cs, NULL, fill_random, &fconv);
        if (rc->conv_bias) {
          snprintf(n, sizeof n, "%s%s.%d.%s.bias", nm->root, nm->layers, l, nm->t[s]);
          sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_random, &fc);
        }
        continue;
      }
      if (s == SM_T_REC_DT_BIAS || s == SM_T_REC_A_LOG || s == SM_T_REC_D) { /* parameters: no ".weight" */
        sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_random, &fc);
        continue;
      }
      if (!cols) {
        snprintf(n, sizeof n, "%s%s.%d.%s.weight", nm->root, nm->layers, l, nm->t[s]);
        sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_random, &fc);
        continue;
      }
      add_linear(w, &fc, n, rows, cols, bits, gs);
      const bool rec_bias = (s == SM_T_REC_IN_FUSED || s == SM_T_REC_OUT) &&
                            ((rc->kind == SM_REC_MAMBA2 && rc->m_proj_bias) || (rc->kind == SM_REC_SHORTCONV && rc->conv_bias));
      if (rec_bias || (r->qkv_bias && (s == SM_T_Q || s == SM_T_K || s == SM_T_V || s == SM_T_QKV))) {
        snprintf(n, sizeof n, "%s%s.%d.%s.bias", nm->root, nm->layers, l, nm->t[s]);
        sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_random, &fc);
      }
    }
  sm_config_free(sc);
  free(sc);
  st = sm_stw_write(w, stp);
  sm_stw_free(w);
out:
  free(cfgp);
  free(stp);
  return st;
}

const sm_synth_shape *sm_synth_all(size_t *n) {
  *n = SM_ARRAY_LEN(g_shapes);
  return g_shapes;
}

const sm_synth_shape *sm_synth_find(const char *name) {
  for (size_t i = 0; i < SM_ARRAY_LEN(g_shapes); i++) if (!strcmp(g_shapes[i].name, name)) return &g_shapes[i];
  return NULL;
}
