/* The Mamba-2 hybrids: Nemotron-H (NVIDIA; each layer one block: a Mamba-2 mixer, attention without
 * RoPE, or a squared-ReLU MLP, after its RMSNorm) and GraniteMoeHybrid (IBM Granite 4.0-H: Mamba-2 or
 * attention, then a SwiGLU MLP, with Granite's multipliers). Their mixture-of-experts variants (Nemotron
 * 3, Granite 4.0-H Tiny/Small) are refused at load: smelt has no MoE layers yet. */
#include "model/family.h"

static const sm_tensor_names nemotron_h_names = {
  .root = "backbone.",
  .embed = "embeddings",
  .final_norm = "norm_f",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      [SM_T_ATTN_NORM] = "norm",
      [SM_T_Q] = "mixer.q_proj",
      [SM_T_K] = "mixer.k_proj",
      [SM_T_V] = "mixer.v_proj",
      [SM_T_O] = "mixer.o_proj",
      [SM_T_FFN_NORM] = "norm", /* the MLP layers' one norm */
      [SM_T_UP] = "mixer.up_proj",
      [SM_T_DOWN] = "mixer.down_proj",
      [SM_T_REC_IN_FUSED] = "mixer.in_proj",
      [SM_T_REC_CONV] = "mixer.conv1d",
      [SM_T_REC_DT_BIAS] = "mixer.dt_bias",
      [SM_T_REC_A_LOG] = "mixer.A_log",
      [SM_T_REC_D] = "mixer.D",
      [SM_T_REC_NORM] = "mixer.norm",
      [SM_T_REC_OUT] = "mixer.out_proj",
    },
};
/* NemotronHConfig */
static const sm_rec_config nemotron_h_rec = {
  .kind = SM_REC_MAMBA2,
  .conv_kernel = 4,
  .conv_bias = true,
  .m_heads = 128,
  .m_head_dim = 64,
  .m_state = 128,
  .m_groups = 8,
  .m_expand = 2,
  .m_norm_grouped = true,
  .dt_min = 0.f,
  .dt_max = __builtin_inff(),
  .no_rope = true,
};
static const sm_config_defaults nemotron_h_defaults = {
  .type = "nemotron_h",
  .vocab = 131072,
  .hidden = 4096,
  .inter = 21504,
  .layers = 52,
  .heads = 32,
  .kv = 8,
  .head_dim = 128,
  .max_pos = 4096,
  .eps = 1e-5f,
  .theta = 10000.f,
  .act = "relu2",
  .bos = 1,
  .eos = 2,
  .rec = &nemotron_h_rec,
};
static const sm_recipe nemotron_h_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .window = SM_WIN_NONE,
  .ffn = SM_FFN_PLAIN,
  .single_block = true,
};

const sm_family sm_family_nemotron_h = {
  .model_type = "nemotron_h",
  .description = "Nemotron-H, Nemotron Nano 2 (Mamba-2 + attention + squared-ReLU MLP blocks)",
  .example = "mlx-community/NVIDIA-Nemotron-Nano-9B-v2-4bit",
  .defaults = &nemotron_h_defaults,
  .names = &nemotron_h_names,
  .recipe = &nemotron_h_recipe,
  .notes = "dense variants only (MoE layers: not yet); recurrent layers: no prefix cache, prompt cache files or "
           "speculative decoding",
  .synth =
    "{\"hybrid_override_pattern\": \"M*-\", \"mamba_num_heads\": 4, \"mamba_head_dim\": 16, \"ssm_state_size\": 16, "
    "\"n_groups\": 2, \"conv_kernel\": 4}",
};

static const sm_tensor_names granitemoehybrid_names = {
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
      [SM_T_REC_IN_FUSED] = "mamba.in_proj",
      [SM_T_REC_CONV] = "mamba.conv1d",
      [SM_T_REC_DT_BIAS] = "mamba.dt_bias",
      [SM_T_REC_A_LOG] = "mamba.A_log",
      [SM_T_REC_D] = "mamba.D",
      [SM_T_REC_NORM] = "mamba.norm",
      [SM_T_REC_OUT] = "mamba.out_proj",
    },
};
/* GraniteMoeHybridConfig: without layer_types every layer is Mamba-2; RoPE only with
 * position_embedding_type "rope"; num_local_experts 8 unless the config says 0 */
static const sm_rec_config granitemoehybrid_rec = {
  .kind = SM_REC_MAMBA2,
  .conv_kernel = 4,
  .conv_bias = true,
  .m_heads = 128,
  .m_state = 256,
  .m_groups = 1,
  .m_expand = 2,
  .dt_min = 0.f,
  .dt_max = __builtin_inff(),
  .no_rope = true,
  .n_experts = 8,
};
static const sm_config_defaults granitemoehybrid_defaults = {
  .type = "granitemoehybrid",
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
  .rec = &granitemoehybrid_rec,
};
static const sm_recipe granitemoehybrid_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .window = SM_WIN_NONE,
  .multipliers = true,
  .attn_scale = SM_ATTN_SCALE_MULTIPLIER,
};

const sm_family sm_family_granitemoehybrid = {
  .model_type = "granitemoehybrid",
  .description = "Granite 4.0-H dense (Mamba-2 + attention, Granite multipliers)",
  .example = "mlx-community/granite-4.0-h-1b-4bit",
  .defaults = &granitemoehybrid_defaults,
  .names = &granitemoehybrid_names,
  .recipe = &granitemoehybrid_recipe,
  .notes = "dense variants only (MoE layers: not yet); recurrent layers: no prefix cache, prompt cache files or "
           "speculative decoding",
  .synth =
    "{\"layer_types\": [\"mamba\", \"attention\"], \"mamba_n_heads\": 4, \"mamba_d_head\": 16, \"mamba_d_state\": 16, "
    "\"mamba_n_groups\": 1, \"num_local_experts\": 0, \"position_embedding_type\": \"rope\", \"embedding_multiplier\": 2.0, "
    "\"attention_multiplier\": 0.25, \"residual_multiplier\": 0.5, \"logits_scaling\": 2.0}",
};
