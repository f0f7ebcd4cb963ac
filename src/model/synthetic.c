/* Synthetic random-weight MLX-format checkpoints of known shapes (benchmarks, tests), in the tensor
 * layout of any runnable registered family (llama by default): every slot the family names, with the
 * registry's shapes. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "backend/backend.h"
#include "format/st_write.h"
#include "model/model.h"

static const sm_synth_shape g_shapes[] = {
  {"test", 64, 2, 4, 2, 256, 512, false, NULL, 0, NULL},
  {"tiny", 256, 4, 8, 4, 768, 4096, true, NULL, 0, NULL},
  {"test1b", 2048, 2, 32, 8, 8192, 1024, true, NULL, 0, NULL},   /* two Llama-3.2-1B layers, small vocab (tests) */
  {"test8b", 4096, 2, 32, 8, 14336, 1024, true, NULL, 0, NULL},  /* two Llama-3.1-8B layers, small vocab (tests) */
  {"1b", 2048, 16, 32, 8, 8192, 128256, true, NULL, 0, NULL},    /* Llama-3.2-1B */
  {"3b", 3072, 28, 24, 8, 8192, 128256, true, NULL, 0, NULL},    /* Llama-3.2-3B */
  {"8b", 4096, 32, 32, 8, 14336, 128256, false, NULL, 0, NULL},  /* Llama-3.1-8B */
  {"70b", 8192, 80, 64, 8, 28672, 128256, false, NULL, 0, NULL}, /* Llama-3.3-70B (several GPUs at 4 bits and up) */
  /* other families' shapes (and the config members that change what a layer computes) */
  {"gemma3-1b", 1152, 26, 4, 1, 6912, 262144, true, "gemma3_text", 256,
   "{\"sliding_window\": 512, \"max_position_embeddings\": 32768, \"rope_theta\": 1000000}"},
  {"gemma3-4b", 2560, 34, 8, 4, 10240, 262208, true, "gemma3_text", 256,
   "{\"sliding_window\": 1024, \"rope_theta\": 1000000, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}}"},
  /* Gemma 4 E2B: 35 layers (4 sliding, 1 full), full layers of head size 512, the last 20 reading earlier layers'
   * K/V with a double-wide MLP, per-layer inputs of 256 */
  {"gemma4-e2b", 1536, 35, 8, 1, 6144, 262144, true, "gemma4_text", 256,
   "{\"global_head_dim\": 512, \"num_kv_shared_layers\": 20, \"hidden_size_per_layer_input\": 256,"
   " \"vocab_size_per_layer_input\": 262144, \"use_double_wide_mlp\": true, \"sliding_window\": 512,"
   " \"sliding_window_pattern\": 5, \"final_logit_softcapping\": 30.0}"},
  {"gemma4-test", 64, 6, 4, 2, 128, 512, true, "gemma4_text", 16, /* the same features, small (tests) */
   "{\"global_head_dim\": 32, \"num_kv_shared_layers\": 2, \"hidden_size_per_layer_input\": 32,"
   " \"vocab_size_per_layer_input\": 512, \"use_double_wide_mlp\": true, \"sliding_window\": 5,"
   " \"sliding_window_pattern\": 3, \"final_logit_softcapping\": 30.0}"},
  {"phi4-mini", 3072, 32, 24, 8, 8192, 200064, true, "phi3", 128,
   "{\"partial_rotary_factor\": 0.75, \"original_max_position_embeddings\": 4096, \"rope_theta\": 10000,"
   " \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": \"48x1.0\", \"long_factor\": \"48x1.5\"}}"},
  {"mistral-small-24b", 5120, 40, 32, 8, 32768, 131072, false, "mistral", 128,
   "{\"rope_theta\": 1000000000, \"sliding_window\": null}"},
  {"qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, false, "qwen2", 128, /* Qwen2.5-7B: 7 query heads a KV head */
   "{\"rope_theta\": 1000000}"},
  {"qwen3-8b", 4096, 36, 32, 8, 12288, 151936, false, "qwen3", 128, /* Qwen3-8B: per-head q/k norms */
   "{\"rope_theta\": 1000000, \"max_position_embeddings\": 40960}"},
  /* mixtures of experts: ffn is the dense intermediate size, the experts' sizes are in the extra config */
  {"qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936, false, "qwen3_moe", 128,
   "{\"num_experts\": 128, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
   " \"rope_theta\": 1000000, \"max_position_embeddings\": 40960}"},
  {"qwen3-235b-a22b", 4096, 94, 64, 4, 12288, 151936, false, "qwen3_moe", 128, /* four GPUs at 4 bits */
   "{\"num_experts\": 128, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 1536, \"norm_topk_prob\": true,"
   " \"rope_theta\": 1000000, \"max_position_embeddings\": 40960}"},
  /* gpt-oss-20b as mlx-community's MXFP4-Q8: experts mxfp4, the rest affine (--bits, default 8 bits) */
  {"gpt-oss-20b", 2880, 24, 64, 8, 2880, 201088, false, "gpt_oss", 64,
   "{\"num_local_experts\": 32, \"num_experts_per_tok\": 4, \"sliding_window\": 128, \"swiglu_limit\": 7.0,"
   " \"attention_bias\": true,"
   " \"rope_theta\": 150000, \"smelt_expert_mode\": \"mxfp4\", \"rope_scaling\": {\"rope_type\": \"yarn\","
   " \"factor\": 32.0, \"beta_fast\": 32.0, \"beta_slow\": 1.0, \"truncate\": false,"
   " \"original_max_position_embeddings\": 4096}}"},
  /* hybrid models (recurrent layers; "layer_types": null drops the family's two-layer test pattern) */
  {"qwen3.5-9b", 4096, 32, 16, 4, 12288, 248320, false, "qwen3_5_text", 256, /* Qwen3.5-9B's text model */
   "{\"layer_types\": null, \"full_attention_interval\": 4, \"linear_num_key_heads\": 16,"
   " \"linear_num_value_heads\": 32, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
   " \"linear_conv_kernel_dim\": 4, \"partial_rotary_factor\": 0.25, \"rope_theta\": 10000000}"},
  {"qwen3.5-35b-a3b", 2048, 40, 16, 2, 512, 248320, false, "qwen3_5_moe_text", 256, /* Qwen3.5-35B-A3B's text model */
   "{\"layer_types\": null, \"full_attention_interval\": 4, \"linear_num_key_heads\": 16,"
   " \"linear_num_value_heads\": 32, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
   " \"num_experts\": 256, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 512,"
   " \"shared_expert_intermediate_size\": 512, \"partial_rotary_factor\": 0.25, \"rope_theta\": 10000000}"},
  {"qwen3-next-80b-a3b", 2048, 48, 16, 2, 5120, 151936, false, "qwen3_next", 256, /* Qwen3-Next-80B-A3B */
   "{\"layer_types\": null, \"mlp_only_layers\": null, \"full_attention_interval\": 4, \"linear_num_key_heads\": 16,"
   " \"linear_num_value_heads\": 32, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
   " \"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 512,"
   " \"shared_expert_intermediate_size\": 512, \"partial_rotary_factor\": 0.25, \"rope_theta\": 10000000}"},
  {"lfm2-8b-a1b", 2048, 24, 32, 8, 7168, 65536, true, "lfm2_moe", 64, /* LFM2-8B-A1B's sizes, 6 attention layers */
   "{\"layer_types\": null, \"full_attn_idxs\": [2, 6, 10, 14, 18, 21], \"num_experts\": 32,"
   " \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 1792, \"num_dense_layers\": 2, \"rope_theta\": 1000000}"},
  {"lfm2-1.2b", 2048, 16, 32, 8, 8192, 65536, true, "lfm2", 64, /* LFM2-1.2B */
   "{\"layer_types\": null, \"full_attn_idxs\": [2, 5, 8, 10, 12, 14], \"rope_theta\": 1000000}"},
};
static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

typedef struct {
  int bits;
  uint64_t seed;
  bool conv;
  float qk_norm; /* the q/k norms' weights (0: 1) */
} fill_ctx;

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
    /* attention scale 1 (Gemma 4): q/k norm weights of head_dim^-1/4 carry the 1/sqrt(head_dim) a trained model's
     * do (at 1 every softmax would be far sharper than a real model's) */
    const bool qk = c->qk_norm > 0 && (strstr(name, "q_norm") || strstr(name, "k_norm"));
    uint16_t *h = dst;
    for (size_t i = 0; i < n / 2; i++) h[i] = sm_f32_to_bf16(qk ? c->qk_norm : 1.0f);
  } else if (c->bits == 0) { /* dense bf16 weights ~ N(0, 0.02)-ish */
    uint16_t *h = dst;
    for (size_t i = 0; i < n / 2; i++) h[i] = sm_f32_to_bf16(((float)(rng_next(&s) % 2001) - 1000.0f) * 2e-5f);
  } else {
    uint64_t *q = dst;
    for (size_t i = 0; i < n / 8; i++) q[i] = rng_next(&s);
    for (size_t i = n / 8 * 8; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)rng_next(&s);
  }
}

/* a bf16 tensor of a quantized model (attention sinks, a one-row gate MLX leaves unquantized): values, not
 * the random words of a packed weight */
static void fill_dense(void *user, void *dst, size_t n, const char *name) {
  fill_ctx *c = user;
  const int bits = c->bits;
  c->bits = 0;
  fill_random(user, dst, n, name);
  c->bits = bits;
}

/* scale codes of a microscaling mode (fill_ctx.bits: the mode): values near 2^-7, times elements up to 6 */
static void fill_scale_codes(void *user, void *dst, size_t n, const char *name) {
  fill_ctx *c = user;
  (void)name;
  uint64_t s = c->seed += 0x9e3779b97f4a7c15ULL;
  uint8_t *h = dst;
  for (size_t i = 0; i < n; i++) {
    const unsigned r = (unsigned)(rng_next(&s) % 3);
    if (c->bits == SM_QMODE_NVFP4) h[i] = (uint8_t)(0x08 + r);     /* E4M3 2^-6 .. 1.25 * 2^-6 */
    else if (c->bits == SM_QMODE_MXFP8) h[i] = (uint8_t)(113 + r); /* elements up to 448 */
    else h[i] = (uint8_t)(119 + r);
  }
}

/* a weight of n_stack (0: one) [rows][cols] matrices: bf16 (bits 0), affine or a microscaling mode (mode) */
static void add_weight(sm_st_writer *w, fill_ctx *fc, fill_ctx *scm, const char *prefix, int64_t n_stack, int64_t rows,
                       int64_t cols, int bits, int gs, int mode) {
  char n[512];
  const int nd = n_stack ? 3 : 2;
  int64_t sh[3] = {n_stack, rows, cols}, *d = n_stack ? sh : sh + 1;
  snprintf(n, sizeof n, "%s.weight", prefix);
  if (bits == 0) {
    sm_stw_add(w, n, SM_DT_BF16, nd, d, NULL, fill_dense, fc);
    return;
  }
  if (mode) {
    bits = sm_qmode_bits((sm_qmode)mode);
    gs = sm_qmode_group((sm_qmode)mode);
  }
  sh[2] = cols * bits / 32;
  sm_stw_add(w, n, SM_DT_U32, nd, d, NULL, fill_random, fc);
  sh[2] = cols / gs;
  snprintf(n, sizeof n, "%s.scales", prefix);
  if (mode) { /* scm[mode]: the scale codes' fill context (its bits field is the mode) */
    sm_stw_add(w, n, SM_DT_U8, nd, d, NULL, fill_scale_codes, &scm[mode]);
    return;
  }
  sm_stw_add(w, n, SM_DT_BF16, nd, d, NULL, fill_random, fc);
  snprintf(n, sizeof n, "%s.biases", prefix);
  sm_stw_add(w, n, SM_DT_BF16, nd, d, NULL, fill_random, fc);
}
static void add_linear(sm_st_writer *w, fill_ctx *fc, const char *prefix, int64_t rows, int64_t cols, int bits,
                       int gs) {
  /* as MLX's quantize: a module whose rows do not split into groups stays dense */
  add_weight(w, fc, NULL, prefix, 0, rows, cols, bits && cols % gs == 0 ? bits : 0, gs, 0);
}

/* "48x1.0" in a synthetic shape's extra config: a list of 48 numbers 1.0 (longrope factors) */
static void expand_lists(cJSON *o) {
  for (cJSON *e = o ? o->child : NULL, *next; e; e = next) {
    next = e->next;
    if (cJSON_IsObject(e)) {
      expand_lists(e);
      continue;
    }
    int n;
    double v;
    if (!cJSON_IsString(e) || sscanf(e->valuestring, "%dx%lf", &n, &v) != 2 || n <= 0 || n > 4096) continue;
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v));
    cJSON_ReplaceItemInObjectCaseSensitive(o, e->string, a);
  }
}

/* Write a random-weight MLX-format checkpoint of a family into dir (skipped if it exists). */
/* the mixture-of-experts members a family's synthetic config.json gets when the shape's extra does not give
 * them: 4 experts, 2 a token, experts (and a shared expert) of the shape's ffn */
static void moe_config(cJSON *c, const sm_family *fam, const sm_synth_shape *sh) {
  const sm_moe_spec *sp = fam->moe;
  const char *ek = sp->route == SM_ROUTE_SIGMOID      ? "n_routed_experts"
                 : sp->route == SM_ROUTE_TOPK_SOFTMAX ? "num_local_experts"
                                                      : "num_experts";
  const char *keys[] = {"num_experts", "num_local_experts", "n_routed_experts"};
  bool has = false;
  for (size_t i = 0; i < SM_ARRAY_LEN(keys); i++) has |= cJSON_GetObjectItemCaseSensitive(c, keys[i]) != NULL;
  if (!has) cJSON_AddNumberToObject(c, ek, 4);
  if (!cJSON_GetObjectItemCaseSensitive(c, "num_experts_per_tok")) cJSON_AddNumberToObject(c, "num_experts_per_tok", 2);
  if (sp->route != SM_ROUTE_TOPK_SOFTMAX && !cJSON_GetObjectItemCaseSensitive(c, "moe_intermediate_size"))
    cJSON_AddNumberToObject(c, "moe_intermediate_size", sh->ffn);
  if (sp->shared_gate && !cJSON_GetObjectItemCaseSensitive(c, "shared_expert_intermediate_size"))
    cJSON_AddNumberToObject(c, "shared_expert_intermediate_size", sh->ffn);
  else if (sp->shared && !sp->shared_gate && !cJSON_GetObjectItemCaseSensitive(c, "n_shared_experts"))
    cJSON_AddNumberToObject(c, "n_shared_experts", 1);
  if (sp->clamped_swiglu && !cJSON_GetObjectItemCaseSensitive(c, "rope_scaling")) {
    cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", "yarn");
    cJSON_AddNumberToObject(rs, "factor", 32.0);
    cJSON_AddNumberToObject(rs, "beta_fast", 32.0);
    cJSON_AddNumberToObject(rs, "beta_slow", 1.0);
    cJSON_AddBoolToObject(rs, "truncate", false);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 4096);
  }
}

/* the stacked experts (and router, shared expert) of MoE layer l, as mlx-lm's sanitize() names them */
static void add_moe_layer(sm_st_writer *w, fill_ctx *fc, fill_ctx *scm, const sm_family *fam, const sm_config *c,
                          const char *p, int bits, int gs, int emode) {
  const sm_moe_spec *sp = fam->moe;
  const sm_moe_config *mc = &c->moe;
  const int64_t H = c->hidden_size, E = mc->n_experts, Fe = mc->expert_inter;
  char n[400];
  snprintf(n, sizeof n, "%s.%s", p, sp->router);
  add_weight(w, fc, scm, n, 0, E, H, bits, gs, 0);
  if (sp->router_bias) {
    snprintf(n, sizeof n, "%s.%s.bias", p, sp->router);
    sm_stw_add(w, n, SM_DT_BF16, 1, &E, NULL, fill_random, fc);
  }
  if (sp->correction && !mc->no_correction) {
    snprintf(n, sizeof n, "%s.%s", p, sp->correction);
    sm_stw_add(w, n, SM_DT_F32, 1, &E, NULL, fill_random, fc); /* zero-ish: f32 bits of small integers */
  }
  const char *pn[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int i = 0; i < 3; i++) {
    const int64_t rows = i == 2 ? H : Fe, cols = i == 2 ? Fe : H;
    snprintf(n, sizeof n, "%s.%s.%s", p, sp->experts, pn[i]);
    add_weight(w, fc, scm, n, E, rows, cols, bits, gs, emode);
    if (sp->expert_bias) {
      int64_t bs[2] = {E, rows};
      snprintf(n, sizeof n, "%s.%s.%s.bias", p, sp->experts, pn[i]);
      sm_stw_add(w, n, SM_DT_BF16, 2, bs, NULL, fill_random, fc);
    }
    if (sp->shared && mc->shared_inter > 0) {
      const int64_t sr = i == 2 ? H : mc->shared_inter, scl = i == 2 ? mc->shared_inter : H;
      snprintf(n, sizeof n, "%s.%s.%s", p, sp->shared, pn[i]);
      add_weight(w, fc, scm, n, 0, sr, scl, bits, gs, 0);
    }
  }
  if (sp->router_scale) { /* Gemma 4's router norm and per-expert weights */
    snprintf(n, sizeof n, "%s.%s", p, sp->router_scale);
    sm_stw_add(w, n, SM_DT_BF16, 1, &H, NULL, fill_dense, fc);
  }
  if (sp->expert_scale) {
    snprintf(n, sizeof n, "%s.%s", p, sp->expert_scale);
    sm_stw_add(w, n, SM_DT_BF16, 1, &E, NULL, fill_dense, fc);
  }
  if (sp->shared && sp->shared_gate && mc->shared_inter > 0) {
    snprintf(n, sizeof n, "%s.%s", p, sp->shared_gate);
    add_weight(w, fc, scm, n, 0, 1, H, 0, gs, 0); /* one row: left unquantized, as MLX does for such shapes */
  }
}

/* the multi-head latent attention of layer l (mla.c), as mlx-lm writes it: embed_q / unembed_out per head, or
 * with the config member smelt_mla_kv_b (removed from the config written) the older kv_b_proj; a projection
 * whose input size the group size does not divide stays unquantized, as mlx-lm's quantize predicate leaves it */
static void add_mla_layer(sm_st_writer *w, fill_ctx *fc, const sm_config *c, const char *p, int bits, int gs,
                          bool kv_b) {
  const sm_mla_config *a = &c->mla;
  const int64_t H = c->num_attention_heads, hid = c->hidden_size, dn = a->nope_dim, dr = a->rope_dim, dc = a->kv_rank,
                dv = a->v_dim;
  char n[400];
  const int64_t q_in = a->q_rank > 0 ? a->q_rank : hid;
#define QB(cols) (!bits || (cols) % gs ? 0 : bits) /* (bf16: gs is 0) */
  if (a->q_rank > 0) {
    snprintf(n, sizeof n, "%s.self_attn.q_a_proj", p);
    add_weight(w, fc, NULL, n, 0, a->q_rank, hid, QB(hid), gs, 0);
    int64_t r = a->q_rank;
    snprintf(n, sizeof n, "%s.self_attn.q_a_layernorm.weight", p);
    sm_stw_add(w, n, SM_DT_BF16, 1, &r, NULL, fill_dense, fc);
  }
  snprintf(n, sizeof n, "%s.self_attn.%s", p, a->q_rank > 0 ? "q_b_proj" : "q_proj");
  add_weight(w, fc, NULL, n, 0, H * (dn + dr), q_in, QB(q_in), gs, 0);
  snprintf(n, sizeof n, "%s.self_attn.kv_a_proj_with_mqa", p);
  add_weight(w, fc, NULL, n, 0, dc + dr, hid, QB(hid), gs, 0);
  snprintf(n, sizeof n, "%s.self_attn.kv_a_layernorm.weight", p);
  sm_stw_add(w, n, SM_DT_BF16, 1, &dc, NULL, fill_dense, fc);
  if (kv_b) {
    snprintf(n, sizeof n, "%s.self_attn.kv_b_proj", p);
    add_weight(w, fc, NULL, n, 0, H * (dn + dv), dc, QB(dc), gs, 0);
  } else {
    snprintf(n, sizeof n, "%s.self_attn.embed_q", p);
    add_weight(w, fc, NULL, n, H, dc, dn, QB(dn), gs, 0);
    snprintf(n, sizeof n, "%s.self_attn.unembed_out", p);
    add_weight(w, fc, NULL, n, H, dv, dc, QB(dc), gs, 0);
  }
  snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
  add_weight(w, fc, NULL, n, 0, hid, H * dv, QB(H * dv), gs, 0);
#undef QB
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
  sm_config cfg;
  memset(&cfg, 0, sizeof cfg);
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
  const char *extras[2] = {fam->synth, sh->extra};
  for (int xi = 0; xi < 2; xi++) {
    if (!extras[xi]) continue;
    cJSON *x = cJSON_Parse(extras[xi]);
    if (!x) {
      cJSON_Delete(c);
      st = sm_err(SMELT_ERR_INVALID, "synthetic %s: bad extra config", sh->name);
      goto out;
    }
    expand_lists(x);
    for (cJSON *e = x->child; e; e = e->next) {
      cJSON_DeleteItemFromObjectCaseSensitive(c, e->string);
      cJSON_AddItemToObject(c, e->string, cJSON_Duplicate(e, true));
    }
    cJSON_Delete(x);
  }
  /* smelt_expert_mode (a shape's extra): the experts in a microscaling mode, listed per module in the
   * quantization block as mlx-lm writes mixed modes */
  int emode = 0;
  const cJSON *em = cJSON_GetObjectItemCaseSensitive(c, "smelt_expert_mode");
  if (cJSON_IsString(em)) emode = sm_qmode_parse(em->valuestring);
  if (emode < 0) {
    cJSON_Delete(c);
    st = sm_err(SMELT_ERR_INVALID, "synthetic %s: bad smelt_expert_mode", sh->name);
    goto out;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(c, "smelt_expert_mode");
  const bool mla_kv_b = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "smelt_mla_kv_b"));
  cJSON_DeleteItemFromObjectCaseSensitive(c, "smelt_mla_kv_b");
  if (!bits) emode = 0;
  if (fam->moe) moe_config(c, fam, sh);
  if (bits) {
    cJSON *q = cJSON_AddObjectToObject(c, "quantization");
    cJSON_AddNumberToObject(q, "group_size", gs);
    cJSON_AddNumberToObject(q, "bits", bits);
    for (int l = 0; emode && fam->moe && l < sh->layers; l++) {
      const char *pn[3] = {"gate_proj", "up_proj", "down_proj"};
      for (int i = 0; i < 3; i++) {
        char n[256];
        snprintf(n, sizeof n, "%s%s.%d.%s.%s", fam->names->root, fam->names->layers, l, fam->moe->experts, pn[i]);
        cJSON *e = cJSON_AddObjectToObject(q, n);
        cJSON_AddNumberToObject(e, "group_size", sm_qmode_group((sm_qmode)emode));
        cJSON_AddNumberToObject(e, "bits", sm_qmode_bits((sm_qmode)emode));
        cJSON_AddStringToObject(e, "mode", sm_qmode_name((sm_qmode)emode));
      }
    }
  }
  char *js = cJSON_Print(c);
  cJSON_Delete(c);
  FILE *f = fopen(cfgp, "w");
  if (!f) {
    free(js);
    st = sm_err(SMELT_ERR_IO, "cannot write %s", cfgp);
    goto out;
  }
  fputs(js, f);
  fclose(f);
  free(js);
  /* the slots of each layer (and the mixture's layout): the config just written, as smelt parses it
   * (layer kinds, recurrent sizes) */
  if ((st = sm_family_config_load(dir, &cfg))) goto out;
  sm_st_writer *w = sm_stw_new();
  fill_ctx fc = {bits, 12345, false, 0.f}, fconv = {0, 777, true, 0.f}, scm[SM_QMODE_COUNT];
  if (r->attn_scale == SM_ATTN_SCALE_ONE) fc.qk_norm = powf((float)cfg.head_dim, -0.25f);
  for (int i = 0; i < SM_QMODE_COUNT; i++) scm[i] = (fill_ctx){i, 777 + (uint64_t)i, false, 0.f};
  const sm_tensor_names *nm = fam->names;
  const int64_t H = sh->hidden;
  const sm_rec_config *rc = &cfg.rec;
  char n[256];
  snprintf(n, sizeof n, "%s%s", nm->root, nm->embed);
  add_linear(w, &fc, n, sh->vocab, H, bits, gs);
  if (!cfg.tie_word_embeddings) add_linear(w, &fc, nm->lm_head, sh->vocab, H, bits, gs);
  int64_t vs[1] = {H};
  snprintf(n, sizeof n, "%s%s.weight", nm->root, nm->final_norm);
  sm_stw_add(w, n, SM_DT_BF16, 1, vs, NULL, fill_random, &fc);
  if (r->per_layer_input && cfg.ple_dim > 0) { /* per-layer inputs: the table, the projection, its norm */
    const int64_t LP = (int64_t)cfg.num_hidden_layers * cfg.ple_dim, P = cfg.ple_dim;
    snprintf(n, sizeof n, "%s%s", nm->root, nm->ple_embed);
    add_linear(w, &fc, n, cfg.ple_vocab, LP, bits, gs);
    snprintf(n, sizeof n, "%s%s", nm->root, nm->ple_proj);
    add_linear(w, &fc, n, LP, H, bits, gs);
    snprintf(n, sizeof n, "%s%s.weight", nm->root, nm->ple_norm);
    sm_stw_add(w, n, SM_DT_BF16, 1, &P, NULL, fill_dense, &fc);
  }
  const bool qk = r->qk_norm != SM_QK_NORM_NONE && (!r->qk_norm_if_config || cfg.moe.use_qk_norm == 1);
  for (int l = 0; l < cfg.num_hidden_layers; l++) {
    const bool moe = fam->moe && cfg.moe.moe_layer[l], dense_too = moe && fam->moe->beside_mlp;
    for (int s = 0; s < SM_T_LAYER_COUNT; s++) {
      if (!nm->t[s] || !sm_family_slot_used(fam, &cfg, l, (sm_layer_tensor)s)) continue;
      if ((s == SM_T_Q_NORM || s == SM_T_K_NORM) && !qk) continue;
      if (moe && !dense_too && (s == SM_T_GATE || s == SM_T_UP || s == SM_T_DOWN || s == SM_T_GATE_UP)) continue;
      int64_t rows, cols;
      sm_family_slot_shape(fam, &cfg, l, (sm_layer_tensor)s, &rows, &cols);
      snprintf(n, sizeof n, "%s%s.%d.%s", nm->root, nm->layers, l, nm->t[s]);
      if (s == SM_T_REC_CONV) { /* [channels, kernel, 1], as MLX stores a depthwise Conv1d */
        int64_t cs[3] = {rows, cols, 1};
        snprintf(n, sizeof n, "%s%s.%d.%s.weight", nm->root, nm->layers, l, nm->t[s]);
        sm_stw_add(w, n, SM_DT_BF16, 3, cs, NULL, fill_random, &fconv);
        if (rc->conv_bias) {
          snprintf(n, sizeof n, "%s%s.%d.%s.bias", nm->root, nm->layers, l, nm->t[s]);
          sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_random, &fc);
        }
        continue;
      }
      if (s == SM_T_LAYER_SCALAR) { /* one number, no ".weight" */
        sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_dense, &fc);
        continue;
      }
      if (s == SM_T_REC_DT_BIAS || s == SM_T_REC_A_LOG || s == SM_T_REC_D) { /* parameters: no ".weight" */
        sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_random, &fc);
        continue;
      }
      if (!cols) {
        snprintf(n, sizeof n, "%s%s.%d.%s.weight", nm->root, nm->layers, l, nm->t[s]);
        sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_dense, &fc);
        continue;
      }
      add_linear(w, &fc, n, rows, cols, bits, gs);
      const bool qkv = s == SM_T_Q || s == SM_T_K || s == SM_T_V || s == SM_T_QKV;
      const bool rec_bias = (s == SM_T_REC_IN_FUSED || s == SM_T_REC_OUT) &&
                            ((rc->kind == SM_REC_MAMBA2 && rc->m_proj_bias) ||
                             (rc->kind == SM_REC_SHORTCONV && rc->conv_bias));
      if (rec_bias || (qkv && (r->qkv_bias || (cfg.attention_bias && r->attn_bias != SM_BIAS_NONE))) ||
          (s == SM_T_O && cfg.attention_bias && r->attn_bias == SM_BIAS_QKVO)) {
        snprintf(n, sizeof n, "%s%s.%d.%s.bias", nm->root, nm->layers, l, nm->t[s]);
        sm_stw_add(w, n, SM_DT_BF16, 1, &rows, NULL, fill_random, &fc);
      }
    }
    snprintf(n, sizeof n, "%s%s.%d", nm->root, nm->layers, l);
    if (r->attn_sinks) {
      char sn[300];
      int64_t nh = sh->heads;
      snprintf(sn, sizeof sn, "%s.self_attn.sinks", n);
      sm_stw_add(w, sn, SM_DT_BF16, 1, &nh, NULL, fill_dense, &fc);
    }
    if (moe) add_moe_layer(w, &fc, scm, fam, &cfg, n, bits, gs, emode);
    if (r->mla) add_mla_layer(w, &fc, &cfg, n, bits, gs, mla_kv_b);
  }
  st = sm_stw_write(w, stp);
  sm_stw_free(w);
out:
  sm_config_free(&cfg);
  free(cfgp);
  free(stp);
  return st;
}

const sm_synth_shape *sm_synth_all(size_t *n) {
  *n = SM_ARRAY_LEN(g_shapes);
  return g_shapes;
}

const sm_synth_shape *sm_synth_find(const char *name) {
  for (size_t i = 0; i < SM_ARRAY_LEN(g_shapes); i++)
    if (!strcmp(g_shapes[i].name, name)) return &g_shapes[i];
  return NULL;
}
