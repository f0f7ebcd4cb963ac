/* Llama 1/2/3.x (and Llama-style decoders: SmolLM, TinyLlama, ...), and Mistral (Llama with an
 * optional sliding window). The llama tensor names are shared by most decoder families. */
#include "model/family.h"

const sm_tensor_names sm_names_llama = {
  .root = "model.", .embed = "embed_tokens", .final_norm = "norm", .lm_head = "lm_head", .layers = "layers",
  .t = {
    [SM_T_ATTN_NORM] = "input_layernorm",
    [SM_T_Q] = "self_attn.q_proj", [SM_T_K] = "self_attn.k_proj", [SM_T_V] = "self_attn.v_proj",
    [SM_T_O] = "self_attn.o_proj",
    [SM_T_FFN_NORM] = "post_attention_layernorm",
    [SM_T_GATE] = "mlp.gate_proj", [SM_T_UP] = "mlp.up_proj", [SM_T_DOWN] = "mlp.down_proj",
  },
};

static const sm_config_defaults llama_defaults = {
  .type = "llama", .vocab = 32000, .hidden = 4096, .inter = 11008, .layers = 32, .heads = 32, .max_pos = 2048,
  .eps = 1e-6f, .theta = 10000.f, .act = "silu", .bos = 1, .eos = 2,
};
static const sm_recipe llama_recipe = { .o_bias_from_config = true, .act = SM_ACT_SILU, .window = SM_WIN_NONE };

const sm_family sm_family_llama = {
  .model_type = "llama",
  .description = "Llama 2/3.x, SmolLM, TinyLlama and other Llama-style decoders",
  .example = "mlx-community/Llama-3.2-1B-Instruct-4bit",
  .defaults = &llama_defaults, .names = &sm_names_llama, .recipe = &llama_recipe,
};

static const sm_config_defaults mistral_defaults = {
  .type = "mistral", .vocab = 32000, .hidden = 4096, .inter = 14336, .layers = 32, .heads = 32, .kv = 8,
  .max_pos = 131072, .eps = 1e-6f, .theta = 10000.f, .act = "silu", .sw_mode = 1, .sliding = 4096, .bos = 1, .eos = 2,
};
static const sm_recipe mistral_recipe = { .o_bias_from_config = true, .act = SM_ACT_SILU, .window = SM_WIN_ALL };

const sm_family sm_family_mistral = {
  .model_type = "mistral",
  .description = "Mistral 7B and Mistral-style decoders (sliding window)",
  .example = "mlx-community/Mistral-7B-Instruct-v0.3-4bit",
  .defaults = &mistral_defaults, .names = &sm_names_llama, .recipe = &mistral_recipe,
};
