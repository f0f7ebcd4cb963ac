/* LFM2 / LFM2.5 (Liquid AI): gated short-convolution layers (conv(B * x) * C) with a few attention
 * layers (per-head q/k RMSNorm), SwiGLU feed-forward, an embedding-sized final norm ("embedding_norm")
 * and a tied head. LFM2-MoE (LFM2-8B-A1B): the same mixer, the first num_dense_layers MLPs dense, the
 * others a mixture of experts with sigmoid routing (expert_bias, with use_expert_bias, only steers the
 * choice; the chosen sigmoid scores renormalized with + 1e-6, times routed_scaling_factor), under the
 * names of mlx-lm's sanitize (feed_forward.w1/w3/w2 become gate_proj/up_proj/down_proj, the experts are
 * stacked into feed_forward.switch_mlp). */
#include "model/family.h"
#include "backend/backend.h"

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

/* ---- LFM2-MoE (Lfm2MoeConfig) */
static const sm_tensor_names lfm2_moe_names = {
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
      [SM_T_GATE] = "feed_forward.gate_proj",
      [SM_T_UP] = "feed_forward.up_proj",
      [SM_T_DOWN] = "feed_forward.down_proj",
      [SM_T_REC_IN_FUSED] = "conv.in_proj",
      [SM_T_REC_CONV] = "conv.conv",
      [SM_T_REC_OUT] = "conv.out_proj",
    },
};
static const sm_moe_defaults lfm2_moe_moe = {
  .n_experts = 32,
  .top_k = 4,
  .expert_inter = 1792,
  .norm_topk = true,
  .routed_scale = 1.0f,
  .first_dense = 2,
};
static const sm_config_defaults lfm2_moe_defaults = {
  .type = "lfm2_moe",
  .vocab = 65536,
  .hidden = 2048,
  .inter = 7168,
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
  .moe = &lfm2_moe_moe,
  .rec = &lfm2_rec,
};
static const sm_moe_spec lfm2_moe_spec = {
  .route = SM_ROUTE_SIGMOID,
  .router = "feed_forward.gate",
  .correction = "feed_forward.expert_bias",
  .experts = "feed_forward.switch_mlp",
  .norm_eps = 1e-6f,
};
const sm_family sm_family_lfm2_moe = {
  .model_type = "lfm2_moe",
  .description = "LFM2-MoE (LFM2-8B-A1B: gated short convolutions + attention, sigmoid-routed experts)",
  .example = "mlx-community/LFM2-8B-A1B-4bit",
  .defaults = &lfm2_moe_defaults,
  .names = &lfm2_moe_names,
  .recipe = &lfm2_recipe,
  .moe = &lfm2_moe_spec,
  .notes = "recurrent layers: no prefix cache, prompt cache files or speculative decoding",
  /* layer 0 (convolution) dense, layer 1 (attention) a mixture */
  .synth = "{\"layer_types\": [\"conv\", \"full_attention\"], \"conv_L_cache\": 3, \"num_dense_layers\": 1}",
};
