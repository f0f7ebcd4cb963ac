/* Phi-3 / Phi-3.5 / Phi-4 / Phi-4-mini: Llama's block with fused qkv_proj and gate_up_proj, partial
 * rotary (Phi-4-mini) and longrope; config.sliding_window applies to every layer (Phi-3-mini-4k). */
#include "model/family.h"

static const sm_tensor_names phi3_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      [SM_T_ATTN_NORM] = "input_layernorm",
      [SM_T_QKV] = "self_attn.qkv_proj",
      [SM_T_O] = "self_attn.o_proj",
      [SM_T_FFN_NORM] = "post_attention_layernorm",
      [SM_T_GATE_UP] = "mlp.gate_up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
    },
};
static const sm_config_defaults phi3_defaults = {
  .type = "phi3",
  .vocab = 32064,
  .hidden = 3072,
  .inter = 8192,
  .layers = 32,
  .heads = 32,
  .max_pos = 4096,
  .eps = 1e-5f,
  .theta = 10000.f,
  .act = "silu",
  .sw_mode = 1,
  .bos = 1,
  .eos = 32000,
  .orig_max_pos = 4096,
};
static const sm_recipe phi3_recipe = {.window = SM_WIN_ALL};

const sm_family sm_family_phi3 = {
  .model_type = "phi3",
  .description = "Phi-3 / 3.5 / 4 / 4-mini (fused qkv and gate_up, longrope)",
  .example = "mlx-community/Phi-4-mini-instruct-4bit",
  .defaults = &phi3_defaults,
  .names = &phi3_names,
  .recipe = &phi3_recipe,
  .notes = "longrope: short factors up to original_max_position_embeddings, long factors past it, per position",
};
