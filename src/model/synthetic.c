/* Synthetic random-weight MLX-format checkpoints of known shapes (benchmarks, tests), in the tensor
 * layout of a registered family (llama by default). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "format/st_write.h"
#include "model/model.h"

static const sm_synth_shape g_shapes[] = {
  { "test", 64, 2, 4, 2, 256, 512, false, NULL },
  { "tiny", 256, 4, 8, 4, 768, 4096, true, NULL },
  { "test1b", 2048, 2, 32, 8, 8192, 1024, true, NULL },   /* two Llama-3.2-1B layers, small vocab (tests) */
  { "test8b", 4096, 2, 32, 8, 14336, 1024, true, NULL },  /* two Llama-3.1-8B layers, small vocab (tests) */
  { "1b", 2048, 16, 32, 8, 8192, 128256, true, NULL },   /* Llama-3.2-1B */
  { "3b", 3072, 28, 24, 8, 8192, 128256, true, NULL },   /* Llama-3.2-3B */
  { "8b", 4096, 32, 32, 8, 14336, 128256, false, NULL }, /* Llama-3.1-8B */
};

static uint64_t rng_next(uint64_t *s) { uint64_t x = *s; x ^= x << 13; x ^= x >> 7; x ^= x << 17; return *s = x; }

typedef struct { int bits; uint64_t seed; } fill_ctx;

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
  } else if (dot && !strcmp(dot, ".bias")) {
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

/* Write a random-weight MLX-format llama checkpoint into dir (skipped if it exists). */
smelt_status sm_make_synthetic(const sm_synth_shape *sh, int bits, int gs, const char *dir, bool verbose) {
  const char *ftype = sh->family ? sh->family : "llama";
  const sm_family *fam = sm_family_runnable(ftype);
  if (!fam) return sm_err(SMELT_ERR_INVALID, "synthetic models: unknown family '%s'", ftype);
  const bool llama3_rope = !strcmp(fam->model_type, "llama");
  char *cfgp = sm_path_join(dir, "config.json"), *stp = sm_path_join(dir, "model.safetensors");
  smelt_status st = SMELT_OK;
  if (bits && (sh->hidden % gs || sh->ffn % gs)) {
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
  cJSON_AddNumberToObject(c, "head_dim", sh->hidden / sh->heads);
  cJSON_AddBoolToObject(c, "attention_bias", fam->recipe->qkv_bias);
  if (llama3_rope) {
    cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", "llama3");
    cJSON_AddNumberToObject(rs, "factor", 32.0);
    cJSON_AddNumberToObject(rs, "low_freq_factor", 1.0);
    cJSON_AddNumberToObject(rs, "high_freq_factor", 4.0);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 8192);
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
  sm_st_writer *w = sm_stw_new();
  fill_ctx fc = { bits, 12345 };
  const sm_tensor_names *nm = fam->names;
  const int64_t H = sh->hidden, hd = sh->hidden / sh->heads, F = sh->ffn;
  const int64_t nq = sh->heads * hd, nkv = sh->kv_heads * hd;
  char n[256];
  snprintf(n, sizeof n, "%s%s", nm->root, nm->embed);
  add_linear(w, &fc, n, sh->vocab, H, bits, gs);
  if (!sh->tied) add_linear(w, &fc, nm->lm_head, sh->vocab, H, bits, gs);
  int64_t vs[1] = { H }, hs[1] = { hd };
  snprintf(n, sizeof n, "%s%s.weight", nm->root, nm->final_norm);
  sm_stw_add(w, n, SM_DT_BF16, 1, vs, NULL, fill_random, &fc);
  for (int l = 0; l < sh->layers; l++) {
    const struct { sm_layer_tensor t; int64_t rows, cols; } mats[] = {
      { SM_T_Q, nq, H }, { SM_T_K, nkv, H }, { SM_T_V, nkv, H }, { SM_T_O, H, nq },
      { SM_T_GATE, F, H }, { SM_T_UP, F, H }, { SM_T_DOWN, H, F },
    };
    for (size_t i = 0; i < SM_ARRAY_LEN(mats); i++) {
      snprintf(n, sizeof n, "%s%s.%d.%s", nm->root, nm->layers, l, nm->t[mats[i].t]);
      add_linear(w, &fc, n, mats[i].rows, mats[i].cols, bits, gs);
      if (fam->recipe->qkv_bias && mats[i].t <= SM_T_V) {
        int64_t bs[1] = { mats[i].rows };
        snprintf(n, sizeof n, "%s%s.%d.%s.bias", nm->root, nm->layers, l, nm->t[mats[i].t]);
        sm_stw_add(w, n, SM_DT_BF16, 1, bs, NULL, fill_random, &fc);
      }
    }
    const sm_layer_tensor norms[] = { SM_T_ATTN_NORM, SM_T_FFN_NORM, SM_T_Q_NORM, SM_T_K_NORM };
    for (size_t i = 0; i < SM_ARRAY_LEN(norms); i++) {
      const bool per_head = norms[i] == SM_T_Q_NORM || norms[i] == SM_T_K_NORM;
      if (per_head && !fam->recipe->qk_norm) continue;
      snprintf(n, sizeof n, "%s%s.%d.%s.weight", nm->root, nm->layers, l, nm->t[norms[i]]);
      sm_stw_add(w, n, SM_DT_BF16, 1, per_head ? hs : vs, NULL, fill_random, &fc);
    }
  }
  st = sm_stw_write(w, stp);
  sm_stw_free(w);
out:
  free(cfgp);
  free(stp);
  return st;
}


const sm_synth_shape *sm_synth_find(const char *name) {
  for (size_t i = 0; i < SM_ARRAY_LEN(g_shapes); i++) if (!strcmp(g_shapes[i].name, name)) return &g_shapes[i];
  return NULL;
}
