/* GLM-4 dense (Glm4ForCausalLM): Llama's block with norms on the attention and MLP outputs too, fused
 * gate_up_proj, q/k/v biases from attention_bias, and interleaved partial RoPE (half the head). */
#include "model/family.h"

static const sm_tensor_names glm4_names = {
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
      [SM_T_ATTN_OUT_NORM] = "post_self_attn_layernorm",
      [SM_T_FFN_NORM] = "post_attention_layernorm",
      [SM_T_GATE_UP] = "mlp.gate_up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
      [SM_T_FFN_OUT_NORM] = "post_mlp_layernorm",
    },
};
static const sm_config_defaults glm4_defaults = {
  .type = "glm4",
  .vocab = 151552,
  .hidden = 4096,
  .inter = 13696,
  .layers = 40,
  .heads = 32,
  .kv = 2,
  .head_dim = 128,
  .max_pos = 131072,
  .eps = 1.5625e-7f,
  .theta = 10000.f,
  .act = "silu",
  .attn_bias = true,
  .bos = -1,
  .eos = 151329,
  .partial_rotary = 0.5f,
};
static const sm_recipe glm4_recipe = {.attn_bias = SM_BIAS_QKV, .rope_interleaved = true};

const sm_family sm_family_glm4 = {
  .model_type = "glm4",
  .description = "GLM-4 dense (0414: post-sublayer norms, interleaved partial RoPE)",
  .example = "mlx-community/GLM-4-9B-0414-4bit",
  .defaults = &glm4_defaults,
  .names = &glm4_names,
  .recipe = &glm4_recipe,
};
