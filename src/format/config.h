/* Model config: config.json (+ generation_config.json) of a Hugging Face / MLX model directory. */
#ifndef SM_CONFIG_H
#define SM_CONFIG_H
#include "base/base.h"
#include "format/mxq.h"
#include <cjson/cJSON.h>

typedef enum {
  SM_ROPE_NONE = 0,     /* "default" / absent / "mrope" (text positions: all three sections get the same position) */
  SM_ROPE_LINEAR,       /* positions / factor */
  SM_ROPE_LLAMA3,       /* factor, low/high_freq_factor, original_max_position_embeddings */
  SM_ROPE_DYNAMIC,      /* dynamic NTK: factor (+ max_position_embeddings) */
  SM_ROPE_YARN,         /* factor, original_max_pos, beta_fast/slow, attention_factor, mscale(_all_dim), truncate */
  SM_ROPE_LONGROPE,     /* phi3 "longrope"/"su": short/long factor lists stay in json (rope_params) */
  SM_ROPE_PROPORTIONAL, /* Gemma 4: 1 / theta^(2i / head_dim) for the first partial_rotary_factor of the head's
                         * frequencies, 0 (no rotation) for the rest, / factor; the whole head is the rotary dim */
} sm_rope_type;

#define SM_MAX_LAYERS 1024 /* num_hidden_layers range */

/* Mixture-of-experts fields of config.json (config_moe.c), under the names the families use: experts
 * (num_experts, num_local_experts or n_routed_experts), num_experts_per_tok, moe_intermediate_size (else
 * intermediate_size), shared experts (shared_expert_intermediate_size, or n_shared_experts times
 * moe_intermediate_size), norm_topk_prob, routed_scaling_factor, n_group / topk_group, and which layers
 * are dense (first_k_dense_replace or num_dense_layers, moe_layer_freq, decoder_sparse_step, mlp_only_layers). */
typedef struct {
  int n_experts;      /* 0: not a mixture-of-experts model */
  int top_k;          /* num_experts_per_tok */
  int expert_inter;   /* an expert's intermediate size */
  int shared_inter;   /* the shared expert(s)' intermediate size; 0: none */
  bool norm_topk;     /* norm_topk_prob */
  float routed_scale; /* routed_scaling_factor */
  int n_group, topk_group;
  float swiglu_limit, swiglu_alpha; /* gpt-oss clamped SwiGLU */
  int use_qk_norm;                  /* GLM-4 MoE use_qk_norm: -1 absent, 0/1 */
  bool no_correction;               /* use_expert_bias false (LFM2-MoE): no choice-score correction vector */
  uint8_t moe_layer[SM_MAX_LAYERS]; /* 1: layer l's MLP is the mixture */
} sm_moe_config;

/* The mixture-of-experts class defaults of a family (transformers' config class) */
typedef struct {
  int n_experts, top_k, expert_inter, shared_inter, n_shared;
  bool norm_topk;
  float routed_scale;
  int n_group, topk_group;
  int first_dense; /* first_k_dense_replace */
  int layer_freq;  /* moe_layer_freq: MoE layers are those l >= first_dense with l % layer_freq == 0 (0: 1) */
  int sparse_step; /* decoder_sparse_step: MoE layers are those with (l + 1) % sparse_step == 0 (0: 1) */
  float swiglu_limit, swiglu_alpha;
  bool optional; /* "num_experts": 0 makes every layer dense (Qwen3-Next's HF class: num_experts > 0 chooses) */
} sm_moe_defaults;

/* Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash; config_mla.c): kv_lora_rank, q_lora_rank
 * (0: a plain q_proj), qk_rope_head_dim, qk_nope_head_dim, v_head_dim. For such a model the config's KV
 * geometry is the latent cache's: num_key_value_heads 1, head_dim kv_rank + rope_dim (one cached row a position:
 * the normalized latent, then the rotated key part), partial_rotary_dim rope_dim. */
typedef struct {
  int kv_rank; /* 0: not an MLA model */
  int q_rank;
  int rope_dim, nope_dim, v_dim;
} sm_mla_config;

/* Layer kinds of hybrid models (config "layer_types", "layers_block_type", "hybrid_override_pattern",
 * "full_attn_idxs" or "full_attention_interval"): attention, the family's recurrent mixer, an MLP-only
 * block (Nemotron-H "-"), or a mixture-of-experts block (Nemotron-H "E"; not runnable). */
typedef enum { SM_LK_ATTN = 0, SM_LK_REC, SM_LK_MLP, SM_LK_MOE } sm_layer_kind;
/* What a hybrid family's recurrent layers compute */
typedef enum {
  SM_REC_NONE = 0,
  SM_REC_GDN,       /* Gated DeltaNet with its short convolution (Qwen3-Next, Qwen3.5) */
  SM_REC_SHORTCONV, /* gated short convolution (LFM2) */
  SM_REC_MAMBA2,    /* Mamba-2 mixer (Nemotron-H, Granite-4.0-H) */
} sm_rec_kind;

/* Recurrent-layer geometry of a hybrid model; in sm_config_defaults.rec, the family's HF class
 * defaults (kind != NONE marks a hybrid family). */
typedef struct {
  sm_rec_kind kind;
  int attn_interval; /* no layer list: every attn_interval-th layer (1-based) is attention; 0: none is */
  int conv_kernel;   /* width of the causal depthwise convolution */
  bool conv_bias;    /* the convolution has a bias (LFM2: its in/out projections too) */
  int sc_channels;   /* short convolution: its channels (0: hidden_size; a rank's share of a split model) */
  int gdn_k_heads, gdn_v_heads, gdn_k_dim, gdn_v_dim;   /* Gated DeltaNet */
  int m_heads, m_head_dim, m_state, m_groups, m_expand; /* Mamba-2 (m_head_dim 0: expand*hidden/heads) */
  bool m_proj_bias;                                     /* Mamba-2 in_proj / out_proj biases */
  bool m_norm_grouped;  /* the gated norm normalizes each of the m_groups groups (Nemotron-H), not the whole */
  float dt_min, dt_max; /* Mamba-2 time_step_limit (0, inf: none) */
  bool no_rope;         /* attention layers have no RoPE (Nemotron-H; Granite unless position_embedding_type
                         * is "rope") */
  int n_experts;        /* > 0: mixture-of-experts feed-forward layers (run only by families with an sm_moe_spec) */
} sm_rec_config;

typedef struct {
  char model_type[32]; /* "llama","mistral","qwen2","qwen3","gemma","gemma2","gemma3_text","phi3",...
                                  (text_config's model_type when the LM is nested under text_config) */
  int vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads;
  int head_dim; /* config head_dim or hidden/heads */
  int max_position_embeddings;
  float rms_norm_eps, rope_theta;
  int partial_rotary_dim; /* rotary dims per head (== head_dim unless partial_rotary_factor) */
  /* rope_scaling */
  int rope_type; /* sm_rope_type */
  float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_original_max_pos;
  float rope_beta_fast, rope_beta_slow, rope_attn_factor; /* yarn, longrope (attn_factor 0 = not given) */
  float rope_mscale, rope_mscale_all_dim;                 /* yarn: 0 = not given */
  bool rope_truncate;        /* yarn: floor/ceil the correction range (transformers default true) */
  float rope_partial_factor; /* partial_rotary_factor given inside rope_parameters (v5), 0 = not given */
  float rope_llama4_beta;    /* llama_4_scaling_beta (Ministral 3): query scale past original_max_pos */
  const cJSON *rope_params;  /* the rope_scaling / rope_parameters object (borrowed from json), or NULL */
  bool tie_word_embeddings;
  bool attention_bias; /* qwen2: true (q/k/v have biases, o_proj has none) */
  bool mlp_bias;
  int sliding_window;         /* 0 = none (qwen2/3 with use_sliding_window=false -> 0) */
  int sliding_window_pattern; /* gemma2: 2, gemma3: 6 (every Nth layer is global); 0 = n/a */
  float rope_local_theta;     /* gemma3 rope_local_base_freq for sliding layers; 0 = n/a */
  /* per-layer kinds from config.json: "layer_types" (or EXAONE's string sliding_window_pattern, "LLLG"),
   * and SmolLM3's "no_rope_layers" (1 = the layer rotates) */
  bool has_layer_types, has_no_rope_layers;
  uint8_t layer_sliding[SM_MAX_LAYERS]; /* 1: "sliding_attention", 0: "full_attention" */
  uint8_t layer_rope[SM_MAX_LAYERS];    /* no_rope_layers[l] */
  uint8_t layer_kind[SM_MAX_LAYERS];    /* sm_layer_kind (all SM_LK_ATTN for non-hybrid families) */
  sm_rec_config rec;                    /* hybrid models: the recurrent layers (kind NONE otherwise) */
  int no_rope_layer_interval;           /* SmolLM3: every Nth layer is NoPE when no_rope_layers is absent; 0 = n/a */
  bool use_sliding_window;              /* the config's use_sliding_window (families with sw_mode 2) */
  int max_window_layers;                /* Qwen2/3: layers from this one on slide (with use_sliding_window) */
  /* Granite multipliers and Cohere's logit_scale (1 when absent) */
  float embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling, logit_scale;
  /* vision-language checkpoints: the outer model_type ("gemma3", "mistral3", "qwen2_5_vl", ...) when the LM
   * is packaged next to a vision tower (text_config and/or vision_config); "" for a text model */
  char vlm_type[32];
  char hidden_act[32]; /* gemma families: hidden_activation preferred */
  int n_eos;
  int32_t eos_ids[16];
  int32_t bos_id; /* -1 if none; eos from config AND generation_config (union) */
  float final_logit_softcapping, attn_logit_softcapping, query_pre_attn_scalar; /* 0 if absent */
  /* Gemma 4 (0 / false for other families): full-attention layers' own head size (global_head_dim) and, with
   * attention_k_eq_v, their KV heads (num_global_key_value_heads; their keys are also their values); the last
   * kv_shared_layers layers attend over the K/V of the last earlier layer of their kind, with an MLP twice as wide
   * under double_wide_mlp; per-layer inputs of ple_dim floats a layer (hidden_size_per_layer_input) from a table
   * of ple_vocab rows (vocab_size_per_layer_input). per_layer_config ({"<layer>": {"head_dim", "num_key_value_heads"}},
   * newer transformers) overrides a layer's shape: layer_head_dim / layer_kv_heads (0: the model's). */
  int global_head_dim, global_kv_heads, kv_shared_layers, ple_dim, ple_vocab;
  bool attn_k_eq_v, double_wide_mlp;
  uint16_t layer_head_dim[SM_MAX_LAYERS], layer_kv_heads[SM_MAX_LAYERS];
  /* quantization ("quantization" or "quantization_config" block): default bits/group_size (0 = unquantized)
   * and mode (sm_qmode: affine, mxfp4, mxfp8, nvfp4) */
  int q_bits, q_group_size, q_mode;
  cJSON *json;       /* whole config.json, owned */
  cJSON *quant;      /* the quantization block (borrowed from json), may be NULL */
  cJSON *text;       /* object the LM fields were read from (json or its text_config), borrowed */
  sm_moe_config moe; /* mixture-of-experts models (moe.n_experts > 0) */
  sm_mla_config mla; /* multi-head latent attention models (mla.kv_rank > 0) */
  /* generation_config defaults (0/absent if not given) */
  float gen_temperature, gen_top_p;
  int gen_top_k;
  float gen_repetition_penalty;
  int gen_do_sample; /* -1 absent, else 0/1 */
} sm_config;

/* Hugging Face class defaults of one model family (its *Config __init__ defaults), for the fields a
 * config.json leaves out. They belong to the family registry (src/model/family.h); the parser
 * asks for them through a lookup function. Sizes of 0 mean "required". */
typedef struct {
  const char *type;
  int vocab, hidden, inter, layers, heads, kv /* 0 = heads */, head_dim /* 0 = hidden/heads */, max_pos;
  float eps, theta;
  const char *act;
  bool tie, attn_bias;
  int sw_mode; /* 0: no sliding window, 1: "sliding_window" (default below), 2: only if use_sliding_window */
  int sliding;
  int bos, eos; /* -1 = none */
  float final_softcap, attn_softcap, qpas;
  int sw_pattern;
  float local_theta;
  bool gemma_act;        /* prefer "hidden_activation" over "hidden_act" */
  int no_rope_interval;  /* SmolLM3 no_rope_layer_interval */
  int max_window_layers; /* Qwen2/3 max_window_layers default */
  float logit_scale;     /* Cohere: 0.0625; 0 = 1 */
  float partial_rotary;  /* partial_rotary_factor default (GLM-4: 0.5); 0 = 1 */
  int orig_max_pos;      /* original_max_position_embeddings class default (Phi-3: 4096); 0 = none */
  /* vision-language packagings: the model_type of the LM when text_config does not name it (or when the
   * LM's fields sit at the top level next to a vision_config) */
  const char *text_type;
  const sm_moe_defaults *moe; /* mixture-of-experts families: their MoE defaults (NULL: not MoE) */
  const sm_rec_config *rec;   /* hybrid families: the recurrent-layer defaults (NULL: attention only) */
  const sm_mla_config *mla;   /* multi-head latent attention families: their class defaults (NULL: none) */
  /* Gemma 4: read its per-layer shape fields (sm_config global_head_dim ...), with these class defaults */
  bool per_layer_shapes;
  int global_head_dim, ple_dim, ple_vocab;
} sm_config_defaults;
/* the defaults of a model_type, NULL when unknown (generic PretrainedConfig defaults then apply) */
typedef const sm_config_defaults *(*sm_config_defaults_fn)(const char *model_type);

/* config_moe.c: the mixture-of-experts fields (sm_moe_config) of a parsed config, with the family's
 * defaults (d may be NULL: not a mixture-of-experts family; then the fields are left zero). */
smelt_status sm_config_parse_moe(sm_config *c, const sm_moe_defaults *d, const char *file);
/* config_mla.c: the multi-head latent attention fields (sm_mla_config) with the family's defaults (d NULL: none),
 * and the latent cache's geometry in head_dim / num_key_value_heads / partial_rotary_dim. */
smelt_status sm_config_parse_mla(sm_config *c, const sm_mla_config *d, const char *file);

/* config_shapes.c: the fields of layers of their own shape (Gemma 4's global_head_dim ..., sm_config), for families
 * whose defaults set per_layer_shapes; after the MoE fields (enable_moe_block turns them off) */
smelt_status sm_config_parse_shapes(sm_config *c, const sm_config_defaults *d, const char *file);

/* Load <model_dir>/config.json and, if present, <model_dir>/generation_config.json. lookup (may be
 * NULL) gives the family defaults; the model layer's sm_family_config_load passes the registry's. */
smelt_status sm_config_load(const char *model_dir, sm_config_defaults_fn lookup, sm_config *out);
/* Same from memory (gen_json may be NULL). Buffers need not be NUL-terminated. */
smelt_status sm_config_parse(const char *config_json, size_t len, const char *gen_json, size_t gen_len,
                             sm_config_defaults_fn lookup, sm_config *out);
void sm_config_free(sm_config *c);
/* Hybrid models: floats of one recurrent layer's state per sequence (its convolution window and its
 * SSM / delta-rule state); both 0 for a model without recurrent layers. */
void sm_config_rec_state(const sm_config *c, size_t *conv_floats, size_t *ssm_floats);
/* Hybrid models: the channels of the recurrent layers' convolution (0 without recurrent layers). */
int sm_config_rec_conv_dim(const sm_config *c);
/* Layers whose kind is attention (all layers for a non-hybrid model). */
int sm_config_attn_layers(const sm_config *c);
/* Quantization of one module (e.g. "model.layers.0.self_attn.q_proj"; a trailing ".weight" is ignored):
 * per-module overrides in the quant block ({"model.layers.0.mlp.down_proj": {"bits": 8, "group_size": 64}},
 * or false = not quantized) fall back to the defaults. *bits = 0 means not quantized. */
void sm_config_quant_for(const sm_config *c, const char *module, int *bits, int *group_size);
/* The same with the module's mode (sm_qmode). A per-module entry is read as MLX's to_quantized(**entry): its
 * mode (absent: affine), and the bits and group size it gives, else that mode's defaults (affine 4 / 64). */
void sm_config_quant_mode_for(const sm_config *c, const char *module, int *bits, int *group_size, int *mode);

#endif
