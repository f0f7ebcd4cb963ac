/* Qwen2 / Qwen2.5 (biases on q/k/v) and Qwen3 dense (per-head q/k RMSNorm, no biases). */
#include "model/family.h"

extern const sm_tensor_names sm_names_llama;

static const sm_config_defaults qwen2_defaults = {
  .type = "qwen2", .vocab = 151936, .hidden = 4096, .inter = 22016, .layers = 32, .heads = 32, .kv = 32,
  .max_pos = 32768, .eps = 1e-6f, .theta = 10000.f, .act = "silu", .attn_bias = true, .sw_mode = 2, .sliding = 4096,
  .bos = -1, .eos = -1,
};
static const sm_recipe qwen2_recipe = { .qkv_bias = true, .act = SM_ACT_SILU, .window = SM_WIN_NONE };

const sm_family sm_family_qwen2 = {
  .model_type = "qwen2",
  .description = "Qwen2 / Qwen2.5 (q/k/v biases)",
  .example = "mlx-community/Qwen2.5-0.5B-Instruct-4bit",
  .defaults = &qwen2_defaults, .names = &sm_names_llama, .recipe = &qwen2_recipe,
};

static const sm_tensor_names qwen3_names = {
  .root = "model.", .embed = "embed_tokens", .final_norm = "norm", .lm_head = "lm_head", .layers = "layers",
  .t = {
    [SM_T_ATTN_NORM] = "input_layernorm",
    [SM_T_Q] = "self_attn.q_proj", [SM_T_K] = "self_attn.k_proj", [SM_T_V] = "self_attn.v_proj",
    [SM_T_O] = "self_attn.o_proj",
    [SM_T_Q_NORM] = "self_attn.q_norm", [SM_T_K_NORM] = "self_attn.k_norm",
    [SM_T_FFN_NORM] = "post_attention_layernorm",
    [SM_T_GATE] = "mlp.gate_proj", [SM_T_UP] = "mlp.up_proj", [SM_T_DOWN] = "mlp.down_proj",
  },
};
static const sm_config_defaults qwen3_defaults = {
  .type = "qwen3", .vocab = 151936, .hidden = 4096, .inter = 22016, .layers = 32, .heads = 32, .kv = 32,
  .head_dim = 128, .max_pos = 32768, .eps = 1e-6f, .theta = 10000.f, .act = "silu", .sw_mode = 2, .sliding = 4096,
  .bos = -1, .eos = -1,
};
static const sm_recipe qwen3_recipe = { .qk_norm = true, .act = SM_ACT_SILU, .window = SM_WIN_NONE };

const sm_family sm_family_qwen3 = {
  .model_type = "qwen3",
  .description = "Qwen3 dense (q/k RMSNorm)",
  .example = "mlx-community/Qwen3-0.6B-4bit",
  .defaults = &qwen3_defaults, .names = &qwen3_names, .recipe = &qwen3_recipe,
};
