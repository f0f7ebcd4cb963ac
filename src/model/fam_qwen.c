/* Qwen2 / Qwen2.5 (biases on q/k/v) and Qwen3 dense (per-head q/k RMSNorm, no biases), and the
 * text models of Qwen2.5-VL and Qwen3-VL (the same blocks; their mrope gives every section the same
 * position for text, which is the 1-D RoPE). */
#include "model/family.h"

extern const sm_tensor_names sm_names_llama;

static const sm_config_defaults qwen2_defaults = {
  .type = "qwen2",
  .vocab = 151936,
  .hidden = 4096,
  .inter = 22016,
  .layers = 32,
  .heads = 32,
  .kv = 32,
  .max_pos = 32768,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .attn_bias = true,
  .sw_mode = 2,
  .sliding = 4096,
  .bos = -1,
  .eos = -1,
  .max_window_layers = 28,
};
static const sm_recipe qwen2_recipe = {.qkv_bias = true, .window = SM_WIN_FROM_LAYER};

const sm_family sm_family_qwen2 = {
  .model_type = "qwen2",
  .description = "Qwen2 / Qwen2.5 (q/k/v biases)",
  .example = "mlx-community/Qwen2.5-0.5B-Instruct-4bit",
  .defaults = &qwen2_defaults,
  .names = &sm_names_llama,
  .recipe = &qwen2_recipe,
};

const sm_tensor_names sm_names_qwen3 = {
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
      [SM_T_FFN_NORM] = "post_attention_layernorm",
      [SM_T_GATE] = "mlp.gate_proj",
      [SM_T_UP] = "mlp.up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
    },
};
static const sm_config_defaults qwen3_defaults = {
  .type = "qwen3",
  .vocab = 151936,
  .hidden = 4096,
  .inter = 22016,
  .layers = 32,
  .heads = 32,
  .kv = 32,
  .head_dim = 128,
  .max_pos = 32768,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .sw_mode = 2,
  .sliding = 4096,
  .bos = -1,
  .eos = -1,
  .max_window_layers = 28,
};
static const sm_recipe qwen3_recipe = {.attn_bias = SM_BIAS_QKVO,
                                       .qk_norm = SM_QK_NORM_HEAD,
                                       .window = SM_WIN_FROM_LAYER};

const sm_family sm_family_qwen3 = {
  .model_type = "qwen3",
  .description = "Qwen3 dense (q/k RMSNorm)",
  .example = "mlx-community/Qwen3-0.6B-4bit",
  .defaults = &qwen3_defaults,
  .names = &sm_names_qwen3,
  .recipe = &qwen3_recipe,
};

/* Qwen2_5_VLTextConfig */
static const sm_config_defaults qwen2_5_vl_text_defaults = {
  .type = "qwen2_5_vl_text",
  .vocab = 152064,
  .hidden = 8192,
  .inter = 29568,
  .layers = 80,
  .heads = 64,
  .kv = 8,
  .max_pos = 128000,
  .eps = 1e-5f,
  .theta = 1000000.f,
  .act = "silu",
  .attn_bias = true,
  .sw_mode = 2,
  .sliding = 4096,
  .bos = -1,
  .eos = -1,
  .max_window_layers = 80,
};
const sm_family sm_family_qwen2_5_vl_text = {
  .model_type = "qwen2_5_vl_text",
  .description = "Qwen2.5-VL text model (Qwen2 block, mrope on text positions)",
  .example = "mlx-community/Qwen2.5-VL-3B-Instruct-4bit",
  .defaults = &qwen2_5_vl_text_defaults,
  .names = &sm_names_llama,
  .recipe = &qwen2_recipe,
  .notes =
    "images through the vision-language checkpoint's tower (smelt arch: vision-language); video input is not supported",
};

/* Qwen2VLTextConfig (Qwen2-VL: the Qwen2.5-VL text model's blocks and mrope) */
static const sm_config_defaults qwen2_vl_text_defaults = {
  .type = "qwen2_vl_text",
  .vocab = 152064,
  .hidden = 8192,
  .inter = 29568,
  .layers = 80,
  .heads = 64,
  .kv = 8,
  .max_pos = 32768,
  .eps = 1e-5f,
  .theta = 1000000.f,
  .act = "silu",
  .attn_bias = true,
  .sw_mode = 2,
  .sliding = 4096,
  .bos = -1,
  .eos = -1,
  .max_window_layers = 80,
};
const sm_family sm_family_qwen2_vl_text = {
  .model_type = "qwen2_vl_text",
  .description = "Qwen2-VL text model (Qwen2 block, mrope on text positions)",
  .example = "mlx-community/Qwen2-VL-2B-Instruct-4bit",
  .defaults = &qwen2_vl_text_defaults,
  .names = &sm_names_llama,
  .recipe = &qwen2_recipe,
  .notes =
    "images through the vision-language checkpoint's tower (smelt arch: vision-language); video input is not supported",
};

/* Qwen3VLTextConfig */
static const sm_config_defaults qwen3_vl_text_defaults = {
  .type = "qwen3_vl_text",
  .vocab = 151936,
  .hidden = 4096,
  .inter = 22016,
  .layers = 32,
  .heads = 32,
  .kv = 32,
  .head_dim = 128,
  .max_pos = 128000,
  .eps = 1e-6f,
  .theta = 5000000.f,
  .act = "silu",
  .bos = -1,
  .eos = -1,
};
const sm_family sm_family_qwen3_vl_text = {
  .model_type = "qwen3_vl_text",
  .description = "Qwen3-VL text model (Qwen3 block, interleaved mrope on text positions)",
  .example = "mlx-community/Qwen3-VL-4B-Instruct-4bit",
  .defaults = &qwen3_vl_text_defaults,
  .names = &sm_names_qwen3,
  .recipe = &qwen3_recipe,
  .notes =
    "images through the vision-language checkpoint's tower (smelt arch: vision-language); video input is not supported",
};
