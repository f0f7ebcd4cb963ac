/* Gemma, Gemma 2 and Gemma 3 (text model): RMSNorm scaled by (1 + w), embeddings times
 * sqrt(hidden_size), GELU (tanh) gating, tied head. Gemma 2 adds post-attention/post-MLP norms,
 * logit softcapping and alternating sliding-window layers; Gemma 3 q/k norms and a local RoPE base
 * for its sliding layers. Gemma 4 (below) sizes its full layers apart and shares K/V between layers. */
#include "backend/backend.h"
#include "model/family.h"

extern const sm_tensor_names sm_names_llama;

static const sm_config_defaults gemma_defaults = {
  .type = "gemma",
  .vocab = 256000,
  .hidden = 3072,
  .inter = 24576,
  .layers = 28,
  .heads = 16,
  .kv = 16,
  .head_dim = 256,
  .max_pos = 8192,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "gelu_pytorch_tanh",
  .tie = true,
  .bos = 2,
  .eos = 1,
  .gemma_act = true,
};
static const sm_recipe gemma_recipe = {.norm_offset = 1.0f, .attn_bias = SM_BIAS_QKVO, .embed_scale_sqrt = true};

const sm_family sm_family_gemma = {
  .model_type = "gemma",
  .description = "Gemma",
  .example = "mlx-community/gemma-2b-it-4bit",
  .defaults = &gemma_defaults,
  .names = &sm_names_llama,
  .recipe = &gemma_recipe,
};

static const sm_tensor_names gemma2_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      [SM_T_ATTN_NORM] = "input_layernorm",
      [SM_T_Q] = "self_attn.q_proj",
      [SM_T_K] = "self_attn.k_proj",
      [SM_T_V] = "self_attn.v_proj",
      [SM_T_O] = "self_attn.o_proj",
      [SM_T_ATTN_OUT_NORM] = "post_attention_layernorm",
      [SM_T_FFN_NORM] = "pre_feedforward_layernorm",
      [SM_T_GATE] = "mlp.gate_proj",
      [SM_T_UP] = "mlp.up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
      [SM_T_FFN_OUT_NORM] = "post_feedforward_layernorm",
    },
};
static const sm_config_defaults gemma2_defaults = {
  .type = "gemma2",
  .vocab = 256000,
  .hidden = 2304,
  .inter = 9216,
  .layers = 26,
  .heads = 8,
  .kv = 4,
  .head_dim = 256,
  .max_pos = 8192,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "gelu_pytorch_tanh",
  .tie = true,
  .sw_mode = 1,
  .sliding = 4096,
  .bos = 2,
  .eos = 1,
  .final_softcap = 30.f,
  .attn_softcap = 50.f,
  .qpas = 256.f,
  .sw_pattern = 2,
  .gemma_act = true,
};
static const sm_recipe gemma2_recipe = {
  .norm_offset = 1.0f,
  .attn_bias = SM_BIAS_QKVO,
  .embed_scale_sqrt = true,
  .softcaps = true,
  .attn_scale = SM_ATTN_SCALE_QPAS,
  .window = SM_WIN_PATTERN,
};

const sm_family sm_family_gemma2 = {
  .model_type = "gemma2",
  .description = "Gemma 2 (softcapping, alternating sliding window)",
  .example = "mlx-community/gemma-2-2b-it-4bit",
  .defaults = &gemma2_defaults,
  .names = &gemma2_names,
  .recipe = &gemma2_recipe,
};

static const sm_tensor_names gemma3_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      [SM_T_ATTN_NORM] = "input_layernorm",
      [SM_T_Q] = "self_attn.q_proj",
      [SM_T_K] = "self_attn.k_proj",
      [SM_T_V] = "self_attn.v_proj",
      [SM_T_O] = "self_attn.o_proj",
      [SM_T_Q_NORM] = "self_attn.q_norm",
      [SM_T_K_NORM] = "self_attn.k_norm",
      [SM_T_ATTN_OUT_NORM] = "post_attention_layernorm",
      [SM_T_FFN_NORM] = "pre_feedforward_layernorm",
      [SM_T_GATE] = "mlp.gate_proj",
      [SM_T_UP] = "mlp.up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
      [SM_T_FFN_OUT_NORM] = "post_feedforward_layernorm",
    },
};
static const sm_config_defaults gemma3_text_defaults = {
  .type = "gemma3_text",
  .vocab = 262208,
  .hidden = 2304,
  .inter = 9216,
  .layers = 26,
  .heads = 8,
  .kv = 4,
  .head_dim = 256,
  .max_pos = 131072,
  .eps = 1e-6f,
  .theta = 1000000.f,
  .act = "gelu_pytorch_tanh",
  .tie = true,
  .sw_mode = 1,
  .sliding = 4096,
  .bos = 2,
  .eos = 1,
  .qpas = 256.f,
  .sw_pattern = 6,
  .local_theta = 10000.f,
  .gemma_act = true,
};
static const sm_recipe gemma3_recipe = {
  .norm_offset = 1.0f,
  .attn_bias = SM_BIAS_QKVO,
  .qk_norm = SM_QK_NORM_HEAD,
  .embed_scale_sqrt = true,
  .softcaps = true,
  .attn_scale = SM_ATTN_SCALE_QPAS,
  .window = SM_WIN_PATTERN,
  .local_rope = SM_LOCAL_ROPE_THETA,
};

const sm_family sm_family_gemma3_text = {
  .model_type = "gemma3_text",
  .description = "Gemma 3 (text model; sliding/global layers with their own RoPE base)",
  .example = "mlx-community/gemma-3-1b-it-4bit",
  .defaults = &gemma3_text_defaults,
  .names = &gemma3_names,
  .recipe = &gemma3_recipe,
};

/* Gemma 4 (E2B, E4B, 31B; 26B-A4B with experts beside each MLP): plain-w RMSNorm, q/k norms and weightless v norms with attention scale 1,
 * full layers with their own head size (global_head_dim), proportional RoPE and, with attention_k_eq_v, keys
 * as values; the last num_kv_shared_layers layers read the K/V of the last earlier layer of their kind; per-layer
 * input embeddings (hidden_size_per_layer_input); a scalar per layer; final logit softcapping. Class defaults of
 * transformers' Gemma4TextConfig. */
static const sm_tensor_names gemma4_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      [SM_T_ATTN_NORM] = "input_layernorm",
      [SM_T_Q] = "self_attn.q_proj",
      [SM_T_K] = "self_attn.k_proj",
      [SM_T_V] = "self_attn.v_proj",
      [SM_T_O] = "self_attn.o_proj",
      [SM_T_Q_NORM] = "self_attn.q_norm",
      [SM_T_K_NORM] = "self_attn.k_norm",
      [SM_T_ATTN_OUT_NORM] = "post_attention_layernorm",
      [SM_T_FFN_NORM] = "pre_feedforward_layernorm",
      [SM_T_GATE] = "mlp.gate_proj",
      [SM_T_UP] = "mlp.up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
      [SM_T_FFN_OUT_NORM] = "post_feedforward_layernorm",
      [SM_T_PLE_GATE] = "per_layer_input_gate",
      [SM_T_PLE_PROJ] = "per_layer_projection",
      [SM_T_PLE_NORM] = "post_per_layer_input_norm",
      [SM_T_LAYER_SCALAR] = "layer_scalar",
      [SM_T_MLP_OUT_NORM] = "post_feedforward_layernorm_1",
      [SM_T_MOE_NORM] = "pre_feedforward_layernorm_2",
      [SM_T_MOE_OUT_NORM] = "post_feedforward_layernorm_2",
    },
  .ple_embed = "embed_tokens_per_layer",
  .ple_proj = "per_layer_model_projection",
  .ple_norm = "per_layer_projection_norm",
};
/* the 26B-A4B's experts (enable_moe_block): on every layer, beside the dense MLP; mlx-lm's sanitize splits
 * experts.gate_up_proj into experts.switch_glu.gate_proj / up_proj */
static const sm_moe_defaults gemma4_moe_defaults = {.norm_topk = true, .optional = true};
static const sm_moe_spec gemma4_moe_spec = {
  .route = SM_ROUTE_SOFTMAX,
  .router = "router.proj",
  .experts = "experts.switch_glu",
  .beside_mlp = true,
  .router_scale = "router.scale",
  .expert_scale = "router.per_expert_scale",
};
static const sm_config_defaults gemma4_text_defaults = {
  .type = "gemma4_text",
  .vocab = 262144,
  .hidden = 2304,
  .inter = 9216,
  .layers = 30,
  .heads = 8,
  .kv = 4,
  .head_dim = 256,
  .max_pos = 131072,
  .eps = 1e-6f,
  .theta = 1000000.f,
  .act = "gelu_pytorch_tanh",
  .tie = true,
  .sw_mode = 1,
  .sliding = 512,
  .bos = 2,
  .eos = 1,
  .sw_pattern = 6,
  .local_theta = 10000.f,
  .gemma_act = true,
  .per_layer_shapes = true,
  .global_head_dim = 512,
  .ple_dim = 256,
  .ple_vocab = 262144,
  .moe = &gemma4_moe_defaults,
};
static const sm_recipe gemma4_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .qk_norm = SM_QK_NORM_HEAD,
  .embed_scale_sqrt = true,
  .softcaps = true,
  .attn_scale = SM_ATTN_SCALE_ONE,
  .window = SM_WIN_PATTERN,
  .local_rope = SM_LOCAL_ROPE_THETA,
  .v_norm = true,
  .layer_scalar = true,
  .per_layer_input = true,
};
const sm_family sm_family_gemma4_text = {
  .model_type = "gemma4_text",
  .description = "Gemma 4 (per-layer head sizes, KV sharing, per-layer inputs; 26B-A4B experts)",
  .example = "mlx-community/gemma-4-e2b-it-4bit",
  .defaults = &gemma4_text_defaults,
  .names = &gemma4_names,
  .recipe = &gemma4_recipe,
  .moe = &gemma4_moe_spec,
  .notes = "text input only",
};
