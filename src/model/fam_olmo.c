/* OLMo 2 / OLMo 3 and EXAONE 4: post-norm blocks (attention and MLP read the residual stream, their
 * outputs are normed before the add), q/k RMSNorm (OLMo: over the whole projection; EXAONE: per head).
 * OLMo 3 and EXAONE 4 add sliding-window layers; EXAONE 4's full layers are NoPE. */
#include "model/family.h"

static const sm_tensor_names olmo2_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      [SM_T_Q] = "self_attn.q_proj",
      [SM_T_K] = "self_attn.k_proj",
      [SM_T_V] = "self_attn.v_proj",
      [SM_T_O] = "self_attn.o_proj",
      [SM_T_Q_NORM] = "self_attn.q_norm",
      [SM_T_K_NORM] = "self_attn.k_norm",
      [SM_T_ATTN_OUT_NORM] = "post_attention_layernorm",
      [SM_T_GATE] = "mlp.gate_proj",
      [SM_T_UP] = "mlp.up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
      [SM_T_FFN_OUT_NORM] = "post_feedforward_layernorm",
    },
};

static const sm_config_defaults olmo2_defaults = {
  .type = "olmo2",
  .vocab = 50304,
  .hidden = 4096,
  .inter = 11008,
  .layers = 32,
  .heads = 32,
  .max_pos = 2048,
  .eps = 1e-5f,
  .theta = 10000.f,
  .act = "silu",
  .bos = -1,
  .eos = 50279,
};
static const sm_recipe olmo2_recipe = {.attn_bias = SM_BIAS_QKVO, .qk_norm = SM_QK_NORM_FULL};

const sm_family sm_family_olmo2 = {
  .model_type = "olmo2",
  .description = "OLMo 2 (post-norm block, q/k RMSNorm over the whole projection)",
  .example = "mlx-community/OLMo-2-0425-1B-Instruct-4bit",
  .defaults = &olmo2_defaults,
  .names = &olmo2_names,
  .recipe = &olmo2_recipe,
};

/* Olmo3Config: 3 of 4 layers slide; rope_scaling applies to the full layers only (as mlx-lm and the
 * original OLMo 3 implementation) */
static const sm_config_defaults olmo3_defaults = {
  .type = "olmo3",
  .vocab = 50304,
  .hidden = 4096,
  .inter = 11008,
  .layers = 32,
  .heads = 32,
  .max_pos = 2048,
  .eps = 1e-5f,
  .theta = 10000.f,
  .act = "silu",
  .sw_mode = 1,
  .sliding = 4096,
  .sw_pattern = 4,
  .bos = -1,
  .eos = 50279,
};
static const sm_recipe olmo3_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .qk_norm = SM_QK_NORM_FULL,
  .window = SM_WIN_PATTERN,
  .local_rope = SM_LOCAL_ROPE_UNSCALED,
};

const sm_family sm_family_olmo3 = {
  .model_type = "olmo3",
  .description = "OLMo 3 (OLMo 2 block, 3 of 4 layers sliding-window)",
  .example = "mlx-community/Olmo-3-7B-Instruct-4bit",
  .defaults = &olmo3_defaults,
  .names = &olmo2_names,
  .recipe = &olmo3_recipe,
};

static const sm_config_defaults exaone4_defaults = {
  .type = "exaone4",
  .vocab = 102400,
  .hidden = 4096,
  .inter = 16384,
  .layers = 32,
  .heads = 32,
  .max_pos = 2048,
  .eps = 1e-5f,
  .theta = 10000.f,
  .act = "silu",
  .sw_mode = 1,
  .sliding = 4096,
  .sw_pattern = 4,
  .bos = 0,
  .eos = 2,
};
static const sm_recipe exaone4_recipe = {
  .qk_norm = SM_QK_NORM_HEAD,
  .window = SM_WIN_PATTERN,
  .rope = SM_ROPE_GLOBAL_NOPE,
};

const sm_family sm_family_exaone4 = {
  .model_type = "exaone4",
  .description = "EXAONE 4.0 (post-norm block, q/k RMSNorm, NoPE full layers)",
  .example = "mlx-community/EXAONE-4.0-1.2B-4bit",
  .defaults = &exaone4_defaults,
  .names = &olmo2_names, /* the same names as OLMo 2 */
  .recipe = &exaone4_recipe,
};
