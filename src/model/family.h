/* The model family registry: everything that differs between model families lives in one
 * sm_family entry — the model_type names, the Hugging Face config defaults, the tensor names the
 * MLX converters write, and the layer recipe the shared forward (transformer.c) follows.
 * `smelt arch`, the store and the loader all read this registry; docs/adding-a-model.md walks
 * through adding an entry. */
#ifndef SM_FAMILY_H
#define SM_FAMILY_H
#include "format/config.h"

/* The per-layer tensors, by slot. A family names each slot it has (sm_tensor_names.t); the
 * loader reads exactly those, and fails on any tensor of the checkpoint it did not read. */
typedef enum {
  SM_T_ATTN_NORM, /* norm before attention (absent in post-norm families: attention reads x) */
  SM_T_Q,
  SM_T_K,
  SM_T_V,
  SM_T_O,
  SM_T_QKV, /* fused q|k|v rows (Phi-3): the loader makes Q, K, V row views of it */
  SM_T_Q_NORM,
  SM_T_K_NORM,        /* RMSNorm of q and k (recipe qk_norm: per head or over the whole projection) */
  SM_T_ATTN_OUT_NORM, /* norm of the attention output before the residual add (Gemma 2/3, OLMo 2, GLM-4) */
  SM_T_FFN_NORM,      /* norm before the MLP */
  SM_T_GATE,
  SM_T_UP,
  SM_T_GATE_UP, /* fused gate|up rows (Phi-3, GLM-4): the loader makes GATE, UP row views of it */
  SM_T_DOWN,
  SM_T_FFN_OUT_NORM, /* norm of the MLP output before the residual add */
  /* the recurrent mixer of hybrid families (config.h sm_rec_kind), on their recurrent layers only */
  SM_T_REC_IN_FUSED, /* fused input projection, split by the loader into the row views below: Mamba-2
                        * in_proj (z | xBC | dt), LFM2 in_proj (B | C | x), Qwen3-Next in_proj_qkvz (per key
                        * head q | k | v | z, rearranged into q | k | v | z) */
  SM_T_REC_BA_FUSED, /* Qwen3-Next in_proj_ba (per key head b | a): views REC_B, REC_A */
  SM_T_REC_IN,       /* the projection into the convolution (Qwen3.5 in_proj_qkv; Mamba-2 xBC; LFM2 x) */
  SM_T_REC_Z,        /* the output gate (Qwen3.5 in_proj_z; Mamba-2 z; LFM2 C) */
  SM_T_REC_B,        /* Gated DeltaNet beta (in_proj_b); LFM2 B (gates the convolution's input) */
  SM_T_REC_A,        /* Gated DeltaNet decay input (in_proj_a); Mamba-2 dt */
  SM_T_REC_CONV,     /* depthwise convolution [channels][kernel] ("<name>.weight" [channels, kernel, 1]) */
  SM_T_REC_DT_BIAS,
  SM_T_REC_A_LOG,
  SM_T_REC_D,     /* per-head parameters, named without ".weight" */
  SM_T_REC_NORM,  /* the gated RMSNorm of the mixer output */
  SM_T_REC_OUT,   /* output projection */
  SM_T_ATTN_GATE, /* gated attention (recipe attn_out_gate): the q_proj rows of the gate (a row view) */
  /* per-layer inputs (recipe per_layer_input, config ple_dim > 0; Gemma 4): after the MLP,
   *   x += ple_norm(ple_proj(gelu_tanh(ple_gate(x)) * the layer's input)) */
  SM_T_PLE_GATE,
  SM_T_PLE_PROJ,
  SM_T_PLE_NORM,
  SM_T_LAYER_SCALAR, /* recipe layer_scalar: the layer's output times this one number ("<name>", no ".weight") */
  /* experts beside the dense MLP (sm_moe_spec beside_mlp, Gemma 4): the MLP's own output norm, the experts'
   * input and output norms, on the layers with experts */
  SM_T_MLP_OUT_NORM,
  SM_T_MOE_NORM,
  SM_T_MOE_OUT_NORM,
  SM_T_LAYER_COUNT
} sm_layer_tensor;

typedef struct {
  const char *root;                /* prefix of the decoder's tensors, e.g. "model." */
  const char *embed;               /* under root: "embed_tokens" (".weight" and, quantized, ".scales"/".biases") */
  const char *final_norm;          /* under root: "norm" */
  const char *lm_head;             /* at the top level: "lm_head"; absent in the checkpoint = tied to embed */
  const char *layers;              /* under root: layer l's tensors are <root><layers>.<l>.<t[slot]> */
  const char *t[SM_T_LAYER_COUNT]; /* NULL: the family has no such tensor */
  /* per-layer inputs (recipe per_layer_input), under root: the table [ple_vocab][layers * ple_dim], the projection
   * of the embeddings [layers * ple_dim][hidden] and its RMSNorm [ple_dim] */
  const char *ple_embed, *ple_proj, *ple_norm;
} sm_tensor_names;

typedef enum { SM_NORM_RMS, SM_NORM_LAYER } sm_norm_kind; /* LayerNorm: mean-centred, weight only (Cohere) */
typedef enum { SM_QK_NORM_NONE, SM_QK_NORM_HEAD, SM_QK_NORM_FULL } sm_qk_norm;
typedef enum { SM_ACT_SILU, SM_ACT_GELU_TANH, SM_ACT_RELU2 } sm_act; /* from config hidden_act / hidden_activation */
/* the feed-forward block: gate/up/down with act(gate) * up (GLU), or up/down with act(up) (Nemotron-H) */
typedef enum { SM_FFN_GLU, SM_FFN_PLAIN } sm_ffn_kind;
/* the projections that have biases when config.json says attention_bias */
typedef enum { SM_BIAS_NONE, SM_BIAS_QKV, SM_BIAS_QKVO } sm_bias_rule;

/* which layers attend over a sliding window of config.sliding_window positions */
typedef enum {
  SM_WIN_NONE,       /* none: every layer attends to the whole context (sliding_window is ignored) */
  SM_WIN_ALL,        /* every layer, when config.json gives a sliding_window (Mistral, Phi-3) */
  SM_WIN_PATTERN,    /* config layer_types (or EXAONE's "LLLG"); else every sliding_window_pattern-th layer
                   * (1-based) is full and the others slide (Gemma 2/3, Cohere 2, OLMo 3, EXAONE 4) */
  SM_WIN_NOPE,       /* config layer_types; else, with use_sliding_window, the NoPE layers slide (SmolLM3) */
  SM_WIN_FROM_LAYER, /* config layer_types; else, with use_sliding_window, layers >= max_window_layers (Qwen2/3) */
} sm_window_rule;

/* which layers rotate q and k (the others are NoPE: no position encoding) */
typedef enum {
  SM_ROPE_ALL,          /* every layer */
  SM_ROPE_SLIDING_ONLY, /* only sliding-window layers (Cohere 2: none when config has no sliding_window) */
  SM_ROPE_GLOBAL_NOPE,  /* full layers are NoPE when config has a sliding_window, else all rotate (EXAONE 4) */
  SM_ROPE_LIST,         /* config no_rope_layers (1 = rotate), else every no_rope_layer_interval-th is NoPE (SmolLM3) */
} sm_rope_rule;

/* the RoPE of sliding-window layers */
typedef enum {
  SM_LOCAL_ROPE_SAME,     /* the model's RoPE (rope_theta, rope_scaling) */
  SM_LOCAL_ROPE_THETA,    /* default RoPE with rope_local_base_freq (Gemma 3) */
  SM_LOCAL_ROPE_UNSCALED, /* default RoPE with rope_theta: rope_scaling only on full layers (OLMo 3) */
} sm_local_rope;

typedef enum {
  SM_ATTN_SCALE_HEAD_DIM,   /* 1/sqrt(head_dim) */
  SM_ATTN_SCALE_QPAS,       /* 1/sqrt(query_pre_attn_scalar) (Gemma 2/3) */
  SM_ATTN_SCALE_MULTIPLIER, /* config attention_multiplier (Granite) */
  SM_ATTN_SCALE_ONE,        /* 1: the q/k norms set the scale (Gemma 4) */
} sm_attn_scale;

/* The layer recipe: how the shared forward computes one decoder layer of this family. With every
 * slot present it is
 *   a   = attn_out_norm(o(attn(rope(qk_norm(q(n1), k(n1))), v(n1))))   n1 = attn_norm(x)
 *   h   = x + residual_multiplier * a
 *   out = h + residual_multiplier * ffn_out_norm(down(act(gate(n2)) * up(n2)))   n2 = ffn_norm(h)
 * with absent norms skipped (their input passes through), or, with parallel_residual,
 *   out = x + a + mlp(n1)
 * A norm is RMSNorm (or LayerNorm) with scale (w + norm_offset). */
typedef struct {
  sm_norm_kind norm;
  float norm_offset;      /* norm scale is (w + norm_offset): Gemma 1.0 */
  bool qkv_bias;          /* q/k/v projections always have biases (Qwen2) */
  sm_bias_rule attn_bias; /* which projections config.json's attention_bias gives biases */
  sm_qk_norm qk_norm;
  bool parallel_residual; /* attention and MLP both read the attention norm's output (Cohere 2) */
  bool embed_scale_sqrt;  /* embeddings times sqrt(hidden_size) (Gemma) */
  bool multipliers;       /* embedding/residual multipliers and logits / logits_scaling (Granite) */
  bool logit_scale;       /* logits times config logit_scale (Cohere) */
  bool softcaps;          /* config attn_logit_softcapping / final_logit_softcapping apply (Gemma 2/3) */
  bool rope_interleaved;  /* RoPE rotates pairs (2i, 2i+1) (GLM-4, Cohere 2): the loader permutes q/k rows */
  bool llama4_scaling;    /* q times 1 + beta*log(1 + floor(pos / original_max_pos)) (Ministral 3) */
  bool qk_norm_if_config; /* the q/k norms only when config.json's use_qk_norm is true (GLM-4 MoE) */
  bool attn_sinks;        /* a sink logit per head in every attention softmax: <layer>.self_attn.sinks (gpt-oss) */
  sm_attn_scale attn_scale;
  sm_window_rule window;
  sm_rope_rule rope;
  sm_local_rope local_rope;
  /* hybrid families (config.h sm_rec_config: which layers are recurrent and what they compute) */
  bool attn_out_gate; /* q_proj rows per head are q | gate: attention output times sigmoid(gate) (Qwen3-Next,
                           * Qwen3.5) */
  sm_ffn_kind ffn;
  bool single_block; /* each layer is one block, a mixer or an MLP (Nemotron-H); else mixer then MLP */
  /* multi-head latent attention (mla.c; config.h sm_mla_config) instead of q/k/v projections: DeepSeek-V3 */
  bool mla;
  float mla_norm_eps; /* eps of q_a_layernorm / kv_a_layernorm (0: config rms_norm_eps) */
  /* Gemma 4: values RMS-normalized per head without a weight; each layer's output times its layer_scalar;
   * per-layer inputs (config ple_dim > 0: the tensors of sm_tensor_names ple_*, slots SM_T_PLE_*). The layers'
   * own head sizes, KV heads and KV sharing come from the config (sm_layer_spec). */
  bool v_norm;
  bool layer_scalar;
  bool per_layer_input;
} sm_recipe;

/* A mixture-of-experts MLP (moe.c), in the layers config.json makes sparse (sm_moe_config.moe_layer; the
 * others keep the dense MLP slots). Its tensors, under the layer's prefix, as mlx-lm's sanitize() writes them:
 *   <router>.weight            [n_experts][hidden] (a Linear; quantized or not), + .bias with router_bias
 *   <correction>               [n_experts] the choice-score correction (route SIGMOID), when named
 *   <experts>.gate_proj/.up_proj  [n_experts][expert_inter][hidden] stacked (3-D .weight/.scales/.biases),
 *   <experts>.down_proj        [n_experts][hidden][expert_inter]; + .bias [n_experts][rows] with expert_bias
 *   <shared>.gate_proj/...     the shared expert(s), a dense MLP of shared_inter, when named
 *   <shared_gate>.weight       [1][hidden]: the shared expert's output times sigmoid(shared_gate . x) */
typedef struct {
  int route; /* backend.h SM_ROUTE_*: how router logits become experts and weights */
  const char *router, *correction, *experts, *shared, *shared_gate;
  bool router_bias;    /* the router Linear has a bias (gpt-oss) */
  bool expert_bias;    /* the experts' projections have biases (gpt-oss) */
  bool clamped_swiglu; /* gpt-oss's activation: config swiglu_limit / swiglu_alpha (backend swiglu_clamp) */
  float norm_eps;      /* SIGMOID routing with norm_topk_prob: added to the weights' sum (0: 1e-20; LFM2-MoE 1e-6) */
  /* Gemma 4: the experts run beside the dense MLP, both on the residual after attention:
   *   mlp_out_norm(mlp(ffn_norm(x))) + moe_out_norm(experts(moe_norm(x)))   (then ffn_out_norm, the residual add)
   * routed on x RMS-normalized with the weight <router_scale> / sqrt(hidden), each chosen expert's weight times
   * <expert_scale>[e] ([hidden] and [n_experts] tensors, no ".weight") */
  bool beside_mlp;
  const char *router_scale, *expert_scale;
} sm_moe_spec;

typedef struct sm_family {
  const char *model_type;     /* config.json model_type */
  const char *const *aliases; /* NULL-terminated other model_type names for the same entry, or NULL */
  const char *description;    /* for `smelt arch` */
  const char *example;        /* an example hub repository */
  const sm_config_defaults *defaults;
  /* NULL for families whose config smelt understands (inspect, memory estimates) but which it
   * cannot run yet */
  const sm_tensor_names *names;
  const sm_recipe *recipe;
  const char *notes;      /* limits a user should know, for `smelt arch` (NULL: none) */
  const sm_moe_spec *moe; /* mixture-of-experts families (NULL: every layer has the dense MLP) */
  /* hybrid families: config.json members (a JSON object's text) that give synthetic checkpoints
   * (sm_make_synthetic) small recurrent layers and a mix of layer kinds; NULL: none */
  const char *synth;
} sm_family;

/* A vision-language packaging: a checkpoint whose config has the LM under text_config (or next to a
 * vision_config) and whose LM tensors are under lm_prefix, next to vision tensors. smelt runs the
 * LM; the vision tensors (prefixes in skip) are loaded by src/vision where it has the packaging's
 * tower (sm_vlm_images), else skipped deliberately (text only, the model's note says so). */
typedef struct {
  const char *model_type; /* the outer config model_type: "gemma3", "mistral3", ... */
  const char *description, *example;
  const sm_config_defaults *defaults; /* the outer type's defaults: text_type */
  const char *lm_prefix;              /* "language_model." */
  const char *lm_root;                /* the LM's root under lm_prefix when not its family's ("model."), or NULL */
  const char *const *skip;            /* NULL-terminated prefixes of the vision tensors */
} sm_vlm_packaging;

/* The entry for a model_type (or alias); NULL when unknown. */
const sm_family *sm_family_find(const char *model_type);
/* As sm_family_find, but only families smelt runs (names and recipe set). */
const sm_family *sm_family_runnable(const char *model_type);
/* All entries, in `smelt arch` order; *n receives the count. */
const sm_family *const *sm_family_all(size_t *n);
/* A config.json model_type smelt runs: a runnable family, or a vision-language packaging whose text
 * model is one (the store's "supported"). */
bool sm_family_type_runnable(const char *model_type);
/* The vision-language packagings; *n receives the count. */
const sm_vlm_packaging *const *sm_vlm_all(size_t *n);
const sm_vlm_packaging *sm_vlm_find(const char *model_type);
/* "gemma3, mistral3, ...": the packagings' model types (for error messages); static storage */
const char *sm_vlm_list(void);
/* whether smelt takes images for checkpoints of this packaging (src/vision has its tower) */
bool sm_vlm_images(const char *model_type);
/* The config defaults of a model_type (sm_config_defaults_fn for the config parser). */
const sm_config_defaults *sm_family_defaults(const char *model_type);
/* config.json (+ generation_config.json) of a model directory, with the registry's defaults. */
smelt_status sm_family_config_load(const char *model_dir, sm_config *out);
/* "llama, mistral, ..." : the runnable families (for error messages); static storage */
const char *sm_family_runnable_list(void);

/* What the recipe gives layer l of a model with this config. */
typedef struct {
  int window;         /* attention window in positions; 0 = whole context */
  bool sliding;       /* a sliding-window layer (its RoPE may be the local one) */
  int rope;           /* -1: NoPE; 0: the model's RoPE; 1: the local RoPE of sliding layers */
  sm_layer_kind kind; /* attention, recurrent, MLP-only (config.h) */
  bool ffn;           /* the layer has a feed-forward block */
  /* attention shape: head size and KV heads (config head_dim / num_key_value_heads, or Gemma 4's full layers'
   * own), whether the keys are also the values (no v_proj), and the layer whose K/V it attends over: itself, an
   * earlier layer of its kind for Gemma 4's KV-shared layers (they have no k/v projections), or -1 when the
   * config names none (the loader refuses it) */
  int head_dim, kv_heads;
  bool k_eq_v;
  int kv_src;
  int ffn_dim; /* the MLP's width (intermediate_size; twice that in Gemma 4's double-wide KV-shared layers) */
} sm_layer_spec;
void sm_family_layer_spec(const sm_family *f, const sm_config *c, int layer, sm_layer_spec *out);
/* Whether layer l of this family and config has a tensor in slot s (the slot named or not). */
bool sm_family_slot_used(const sm_family *f, const sm_config *c, int layer, sm_layer_tensor s);

/* [rows, cols] of slot s of layer l (cols 0: a vector of rows floats) for this family and config. */
void sm_family_slot_shape(const sm_family *f, const sm_config *c, int layer, sm_layer_tensor s, int64_t *rows,
                          int64_t *cols);
/* Whether some layer's attention shape differs from the config's head_dim / num_key_value_heads, or a layer reads
 * another's K/V (Gemma 4) */
bool sm_family_varied_layers(const sm_family *f, const sm_config *c);
/* The activation the config selects for this family; SMELT_ERR_UNSUPPORTED (message set) if none. */
smelt_status sm_family_act(const sm_family *f, const sm_config *c, sm_act *out);

#endif
