/* Llama and the families that keep its block: Llama 1/2/3.x (SmolLM, TinyLlama, ...), Mistral
 * (optional sliding window), Ministral 3 (Mistral with the Llama-4 query scaling), SmolLM3 (NoPE
 * layers) and Granite (multipliers). The llama tensor names are shared by most decoder families. */
#include "model/family.h"

const sm_tensor_names sm_names_llama = {
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
      [SM_T_FFN_NORM] = "post_attention_layernorm",
      [SM_T_GATE] = "mlp.gate_proj",
      [SM_T_UP] = "mlp.up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
    },
};

static const sm_config_defaults llama_defaults = {
  .type = "llama",
  .vocab = 32000,
  .hidden = 4096,
  .inter = 11008,
  .layers = 32,
  .heads = 32,
  .max_pos = 2048,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .bos = 1,
  .eos = 2,
};
static const sm_recipe llama_recipe = {.attn_bias = SM_BIAS_QKVO, .window = SM_WIN_NONE};

const sm_family sm_family_llama = {
  .model_type = "llama",
  .description = "Llama 2/3.x, SmolLM, TinyLlama and other Llama-style decoders",
  .example = "mlx-community/Llama-3.2-1B-Instruct-4bit",
  .defaults = &llama_defaults,
  .names = &sm_names_llama,
  .recipe = &llama_recipe,
};

static const sm_config_defaults mistral_defaults = {
  .type = "mistral",
  .vocab = 32000,
  .hidden = 4096,
  .inter = 14336,
  .layers = 32,
  .heads = 32,
  .kv = 8,
  .max_pos = 131072,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .sw_mode = 1,
  .sliding = 4096,
  .bos = 1,
  .eos = 2,
};
static const sm_recipe mistral_recipe = {.window = SM_WIN_ALL};

const sm_family sm_family_mistral = {
  .model_type = "mistral",
  .description = "Mistral 7B and Mistral-style decoders (sliding window)",
  .example = "mlx-community/Mistral-7B-Instruct-v0.3-4bit",
  .defaults = &mistral_defaults,
  .names = &sm_names_llama,
  .recipe = &mistral_recipe,
};

/* Ministral3Config: Mistral's block; queries scaled past original_max_position_embeddings */
static const sm_config_defaults ministral3_defaults = {
  .type = "ministral3",
  .vocab = 131072,
  .hidden = 4096,
  .inter = 14336,
  .layers = 34,
  .heads = 32,
  .kv = 8,
  .head_dim = 128,
  .max_pos = 262144,
  .eps = 1e-5f,
  .theta = 1000000.f,
  .act = "silu",
  .sw_mode = 1,
  .bos = 1,
  .eos = 2,
};
static const sm_recipe ministral3_recipe = {.window = SM_WIN_ALL, .llama4_scaling = true};

const sm_family sm_family_ministral3 = {
  .model_type = "ministral3",
  .description = "Ministral 3 (Llama-4 query scaling past the trained context)",
  .example = "mlx-community/Ministral-3-3B-Instruct-2512-4bit",
  .defaults = &ministral3_defaults,
  .names = &sm_names_llama,
  .recipe = &ministral3_recipe,
};

/* SmolLM3Config: every no_rope_layer_interval-th layer (1-based) is NoPE unless no_rope_layers says */
static const sm_config_defaults smollm3_defaults = {
  .type = "smollm3",
  .vocab = 128256,
  .hidden = 2048,
  .inter = 11008,
  .layers = 36,
  .heads = 16,
  .kv = 4,
  .max_pos = 32768,
  .eps = 1e-6f,
  .theta = 2000000.f,
  .act = "silu",
  .tie = true,
  .sw_mode = 2,
  .bos = 128000,
  .eos = 128001,
  .no_rope_interval = 4,
};
static const sm_recipe smollm3_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .window = SM_WIN_NOPE,
  .rope = SM_ROPE_LIST,
};

const sm_family sm_family_smollm3 = {
  .model_type = "smollm3",
  .description = "SmolLM3 (Llama block, NoPE layers)",
  .example = "mlx-community/SmolLM3-3B-4bit",
  .defaults = &smollm3_defaults,
  .names = &sm_names_llama,
  .recipe = &smollm3_recipe,
};

/* GraniteConfig: multipliers default to 1 */
static const sm_config_defaults granite_defaults = {
  .type = "granite",
  .vocab = 32000,
  .hidden = 4096,
  .inter = 11008,
  .layers = 32,
  .heads = 32,
  .max_pos = 2048,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .bos = 1,
  .eos = 2,
};
static const sm_recipe granite_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .window = SM_WIN_NONE,
  .multipliers = true,
  .attn_scale = SM_ATTN_SCALE_MULTIPLIER,
};

const sm_family sm_family_granite = {
  .model_type = "granite",
  .description = "Granite 3.x (Llama block with multipliers)",
  .example = "mlx-community/granite-3.3-2b-instruct-4bit",
  .defaults = &granite_defaults,
  .names = &sm_names_llama,
  .recipe = &granite_recipe,
};
