/* Qwen3-Next and Qwen3.5 / 3.6: three Gated DeltaNet layers to one gated attention layer (q_proj also
 * gives a sigmoid gate of the attention output; per-head q/k RMSNorm; partial RoPE), SwiGLU MLPs or, in
 * the MoE variants (Qwen3-Next-80B-A3B, qwen3_5_moe_text), a mixture of experts (softmax routing, top k
 * renormalized with norm_topk_prob) plus a shared expert times a sigmoid gate (moe.c), under mlx-lm's
 * names: mlp.gate, mlp.switch_mlp.{gate,up,down}_proj, mlp.shared_expert.*, mlp.shared_expert_gate. MLX
 * checkpoints carry the RMSNorm weights with Qwen's (1 + w) already added (mlx-lm's sanitize), so the
 * recipe has no norm offset. Qwen3-Next's projections are fused per key head (in_proj_qkvz, in_proj_ba;
 * the loader rearranges them), Qwen3.5's separate. Qwen3-Next's MoE layers are those of decoder_sparse_step
 * not in mlp_only_layers ("num_experts": 0: all dense); every layer of qwen3_5_moe_text is MoE. */
#include "model/family.h"
#include "backend/backend.h"

#define QWEN_NEXT_ATTN \
  [SM_T_ATTN_NORM] = "input_layernorm", [SM_T_Q] = "self_attn.q_proj", [SM_T_K] = "self_attn.k_proj", \
  [SM_T_V] = "self_attn.v_proj", [SM_T_O] = "self_attn.o_proj", [SM_T_Q_NORM] = "self_attn.q_norm", \
  [SM_T_K_NORM] = "self_attn.k_norm", [SM_T_FFN_NORM] = "post_attention_layernorm", [SM_T_GATE] = "mlp.gate_proj", \
  [SM_T_UP] = "mlp.up_proj", [SM_T_DOWN] = "mlp.down_proj", [SM_T_REC_CONV] = "linear_attn.conv1d", \
  [SM_T_REC_DT_BIAS] = "linear_attn.dt_bias", [SM_T_REC_A_LOG] = "linear_attn.A_log", \
  [SM_T_REC_NORM] = "linear_attn.norm", [SM_T_REC_OUT] = "linear_attn.out_proj"

static const sm_tensor_names qwen3_5_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      QWEN_NEXT_ATTN,
      [SM_T_REC_IN] = "linear_attn.in_proj_qkv",
      [SM_T_REC_Z] = "linear_attn.in_proj_z",
      [SM_T_REC_B] = "linear_attn.in_proj_b",
      [SM_T_REC_A] = "linear_attn.in_proj_a",
    },
};
static const sm_tensor_names qwen3_next_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      QWEN_NEXT_ATTN,
      [SM_T_REC_IN_FUSED] = "linear_attn.in_proj_qkvz",
      [SM_T_REC_BA_FUSED] = "linear_attn.in_proj_ba",
    },
};
static const sm_moe_spec qwen_next_moe = {
  .route = SM_ROUTE_SOFTMAX,
  .router = "mlp.gate",
  .experts = "mlp.switch_mlp",
  .shared = "mlp.shared_expert",
  .shared_gate = "mlp.shared_expert_gate",
};
static const sm_recipe qwen_next_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .qk_norm = SM_QK_NORM_HEAD,
  .window = SM_WIN_NONE,
  .attn_out_gate = true,
};

/* the Gated DeltaNet defaults of Qwen3_5TextConfig, Qwen3_5MoeTextConfig and Qwen3NextConfig (the same) */
static const sm_rec_config qwen_gdn_rec = {
  .kind = SM_REC_GDN,
  .attn_interval = 4,
  .conv_kernel = 4,
  .gdn_k_heads = 16,
  .gdn_v_heads = 32,
  .gdn_k_dim = 128,
  .gdn_v_dim = 128,
};

/* Qwen3_5TextConfig */
static const sm_config_defaults qwen3_5_defaults = {
  .type = "qwen3_5_text",
  .vocab = 248320,
  .hidden = 4096,
  .inter = 12288,
  .layers = 32,
  .heads = 16,
  .kv = 4,
  .head_dim = 256,
  .max_pos = 32768,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .bos = -1,
  .eos = -1,
  .partial_rotary = 0.25f,
  .rec = &qwen_gdn_rec,
};
const sm_family sm_family_qwen3_5_text = {
  .model_type = "qwen3_5_text",
  .description = "Qwen3.5 / 3.6 dense text model (Gated DeltaNet + gated attention)",
  .example = "mlx-community/Qwen3.5-9B-4bit",
  .defaults = &qwen3_5_defaults,
  .names = &qwen3_5_names,
  .recipe = &qwen_next_recipe,
  .notes = "recurrent layers: no prefix cache, prompt cache files or speculative decoding",
  .synth =
    "{\"layer_types\": [\"linear_attention\", \"full_attention\"], \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, "
    "\"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, \"partial_rotary_factor\": 0.5, \"num_experts\": 0}",
};

/* Qwen3_5MoeTextConfig */
static const sm_moe_defaults qwen3_5_moe_moe = {
  .n_experts = 256,
  .top_k = 8,
  .expert_inter = 512,
  .shared_inter = 512,
  .norm_topk = true,
  .sparse_step = 1,
};
static const sm_config_defaults qwen3_5_moe_defaults = {
  .type = "qwen3_5_moe_text",
  .vocab = 248320,
  .hidden = 2048,
  .inter = 512,
  .layers = 40,
  .heads = 16,
  .kv = 2,
  .head_dim = 256,
  .max_pos = 32768,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .bos = -1,
  .eos = -1,
  .partial_rotary = 0.25f,
  .moe = &qwen3_5_moe_moe,
  .rec = &qwen_gdn_rec,
};
const sm_family sm_family_qwen3_5_moe_text = {
  .model_type = "qwen3_5_moe_text",
  .description = "Qwen3.5 / 3.6 MoE text model (Gated DeltaNet + gated attention; routed + shared experts)",
  .example = "mlx-community/Qwen3.5-35B-A3B-4bit",
  .defaults = &qwen3_5_moe_defaults,
  .names = &qwen3_5_names,
  .recipe = &qwen_next_recipe,
  .moe = &qwen_next_moe,
  .notes = "recurrent layers: no prefix cache, prompt cache files or speculative decoding",
  .synth =
    "{\"layer_types\": [\"linear_attention\", \"full_attention\"], \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, "
    "\"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, \"partial_rotary_factor\": 0.5}",
};

/* Qwen3NextConfig */
static const sm_moe_defaults qwen3_next_moe = {
  .n_experts = 512,
  .top_k = 10,
  .expert_inter = 512,
  .shared_inter = 512,
  .norm_topk = true,
  .sparse_step = 1,
  .optional = true,
};
static const sm_config_defaults qwen3_next_defaults = {
  .type = "qwen3_next",
  .vocab = 151936,
  .hidden = 2048,
  .inter = 5632,
  .layers = 48,
  .heads = 16,
  .kv = 2,
  .head_dim = 256,
  .max_pos = 32768,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .bos = -1,
  .eos = -1,
  .partial_rotary = 0.25f,
  .moe = &qwen3_next_moe,
  .rec = &qwen_gdn_rec,
};
const sm_family sm_family_qwen3_next = {
  .model_type = "qwen3_next",
  .description = "Qwen3-Next (Gated DeltaNet + gated attention; fused projections; routed + shared experts)",
  .example = "mlx-community/Qwen3-Next-80B-A3B-Instruct-4bit",
  .defaults = &qwen3_next_defaults,
  .names = &qwen3_next_names,
  .recipe = &qwen_next_recipe,
  .moe = &qwen_next_moe,
  .notes = "recurrent layers: no prefix cache, prompt cache files or speculative decoding",
  /* layer 0 (Gated DeltaNet) has the mixture, layer 1 (attention) the dense MLP */
  .synth =
    "{\"layer_types\": [\"linear_attention\", \"full_attention\"], \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, "
    "\"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, \"partial_rotary_factor\": 0.5, \"mlp_only_layers\": [1]}",
};
