/* Cohere Command R7B / Command A (cohere2): LayerNorm (no bias), one norm feeding attention and MLP in
 * parallel, interleaved RoPE on the sliding-window layers only (full layers are NoPE), logits times
 * logit_scale, tied head. */
#include "model/family.h"

static const sm_tensor_names cohere2_names = {
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
      [SM_T_GATE] = "mlp.gate_proj",
      [SM_T_UP] = "mlp.up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
    },
};
static const sm_config_defaults cohere2_defaults = {
  .type = "cohere2",
  .vocab = 256000,
  .hidden = 8192,
  .inter = 22528,
  .layers = 40,
  .heads = 64,
  .max_pos = 8192,
  .eps = 1e-5f,
  .theta = 10000.f,
  .act = "silu",
  .tie = true,
  .sw_mode = 1,
  .sliding = 4096,
  .sw_pattern = 4,
  .bos = 5,
  .eos = 255001,
  .logit_scale = 0.0625f,
};
static const sm_recipe cohere2_recipe = {
  .norm = SM_NORM_LAYER,
  .attn_bias = SM_BIAS_QKVO,
  .parallel_residual = true,
  .logit_scale = true,
  .rope_interleaved = true,
  .window = SM_WIN_PATTERN,
  .rope = SM_ROPE_SLIDING_ONLY,
};

const sm_family sm_family_cohere2 = {
  .model_type = "cohere2",
  .description = "Command R7B / Command A (LayerNorm, parallel block, NoPE full layers)",
  .example = "mlx-community/c4ai-command-r7b-12-2024-4bit",
  .defaults = &cohere2_defaults,
  .names = &cohere2_names,
  .recipe = &cohere2_recipe,
};
