/* LFM2 / LFM2.5 (Liquid AI): gated short-convolution layers (conv(B * x) * C) with a few attention
 * layers (per-head q/k RMSNorm), SwiGLU feed-forward, an embedding-sized final norm ("embedding_norm")
 * and a tied head. */
#include "model/family.h"

static const sm_tensor_names lfm2_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "embedding_norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      [SM_T_ATTN_NORM] = "operator_norm",
      [SM_T_Q] = "self_attn.q_proj",
      [SM_T_K] = "self_attn.k_proj",
      [SM_T_V] = "self_attn.v_proj",
      [SM_T_O] = "self_attn.out_proj",
      [SM_T_Q_NORM] = "self_attn.q_layernorm",
      [SM_T_K_NORM] = "self_attn.k_layernorm",
      [SM_T_FFN_NORM] = "ffn_norm",
      [SM_T_GATE] = "feed_forward.w1",
      [SM_T_UP] = "feed_forward.w3",
      [SM_T_DOWN] = "feed_forward.w2",
      [SM_T_REC_IN_FUSED] = "conv.in_proj",
      [SM_T_REC_CONV] = "conv.conv",
      [SM_T_REC_OUT] = "conv.out_proj",
    },
};

/* Lfm2Config: without layer_types or full_attn_idxs every layer is attention */
static const sm_rec_config lfm2_rec = {.kind = SM_REC_SHORTCONV, .attn_interval = 1, .conv_kernel = 3};
static const sm_config_defaults lfm2_defaults = {
  .type = "lfm2",
  .vocab = 65536,
  .hidden = 2560,
  .inter = 12288,
  .layers = 32,
  .heads = 32,
  .kv = 8,
  .max_pos = 128000,
  .eps = 1e-5f,
  .theta = 1000000.f,
  .act = "silu",
  .tie = true,
  .bos = 1,
  .eos = 2,
  .rec = &lfm2_rec,
};
static const sm_recipe lfm2_recipe = {.qk_norm = SM_QK_NORM_HEAD, .window = SM_WIN_NONE};

const sm_family sm_family_lfm2 = {
  .model_type = "lfm2",
  .description = "LFM2 / LFM2.5 (gated short convolutions + attention)",
  .example = "mlx-community/LFM2-1.2B-4bit",
  .defaults = &lfm2_defaults,
  .names = &lfm2_names,
  .recipe = &lfm2_recipe,
  .notes = "recurrent layers: no prefix cache, prompt cache files or speculative decoding",
  .synth =
    "{\"layer_types\": [\"conv\", \"full_attention\"], \"conv_L_cache\": 3, \"block_auto_adjust_ff_dim\": false}",
};
