/* Mixture-of-experts families (family.h sm_moe_spec, moe.c): Qwen3-MoE and Qwen2-MoE (softmax routing;
 * Qwen2-MoE's shared expert with its sigmoid gate), Mixtral (softmax over the top k), gpt-oss (router
 * and expert biases, clamped SwiGLU, attention sinks, alternating sliding window, YaRN), GLM-4.5/4.6/4.7
 * MoE (sigmoid routing with a correction bias, group-limited, shared expert, dense first layers, partial
 * RoPE), and DeepSeek-V3 / Kimi-K2 and GLM-4.7-Flash, whose multi-head latent attention is mla.c's.
 * Qwen3-VL-MoE's text model is Qwen3-MoE's with M-RoPE. Tensor names are mlx-lm's after sanitize(): the
 * experts stacked with a leading expert axis. */
#include "model/family.h"
#include "backend/backend.h"

extern const sm_tensor_names sm_names_llama, sm_names_qwen3;

/* ---- Qwen3-MoE (Qwen3MoeConfig) */
static const sm_moe_defaults qwen3_moe_moe = {
  .n_experts = 128,
  .top_k = 8,
  .expert_inter = 768,
  .norm_topk = false,
  .sparse_step = 1,
};
static const sm_config_defaults qwen3_moe_defaults = {
  .type = "qwen3_moe",
  .vocab = 151936,
  .hidden = 2048,
  .inter = 6144,
  .layers = 24,
  .heads = 32,
  .kv = 4,
  .max_pos = 32768,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .sw_mode = 2,
  .sliding = 4096,
  .bos = -1,
  .eos = -1,
  .max_window_layers = 28,
  .moe = &qwen3_moe_moe,
};
static const sm_recipe qwen3_moe_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .qk_norm = SM_QK_NORM_HEAD,
  .window = SM_WIN_FROM_LAYER,
};
static const sm_moe_spec qwen_moe = {
  .route = SM_ROUTE_SOFTMAX,
  .router = "mlp.gate",
  .experts = "mlp.switch_mlp",
};
const sm_family sm_family_qwen3_moe = {
  .model_type = "qwen3_moe",
  .description = "Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, 235B-A22B)",
  .example = "mlx-community/Qwen3-30B-A3B-4bit",
  .defaults = &qwen3_moe_defaults,
  .names = &sm_names_qwen3,
  .recipe = &qwen3_moe_recipe,
  .moe = &qwen_moe,
};

/* ---- Qwen3-VL-MoE's text model (Qwen3VLMoeTextConfig): Qwen3-MoE blocks without a sliding window,
 * interleaved mrope on text positions (the vision-language packaging qwen3_vl_moe) */
static const sm_moe_defaults qwen3_vl_moe_moe = {
  .n_experts = 60,
  .top_k = 4,
  .expert_inter = 1408,
  .norm_topk = true,
  .sparse_step = 1,
};
static const sm_config_defaults qwen3_vl_moe_text_defaults = {
  .type = "qwen3_vl_moe_text",
  .vocab = 151936,
  .hidden = 2048,
  .inter = 5632,
  .layers = 24,
  .heads = 16,
  .kv = 16,
  .head_dim = 128,
  .max_pos = 128000,
  .eps = 1e-6f,
  .theta = 5000000.f,
  .act = "silu",
  .bos = -1,
  .eos = -1,
  .moe = &qwen3_vl_moe_moe,
};
static const sm_recipe qwen3_vl_moe_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .qk_norm = SM_QK_NORM_HEAD,
};
const sm_family sm_family_qwen3_vl_moe_text = {
  .model_type = "qwen3_vl_moe_text",
  .description = "Qwen3-VL-MoE text model (Qwen3-MoE block, interleaved mrope on text positions)",
  .example = "mlx-community/Qwen3-VL-30B-A3B-Instruct-4bit",
  .defaults = &qwen3_vl_moe_text_defaults,
  .names = &sm_names_qwen3,
  .recipe = &qwen3_vl_moe_recipe,
  .moe = &qwen_moe,
  .notes =
    "images through the vision-language checkpoint's tower (smelt arch: vision-language); video input is not supported",
};

/* ---- Qwen2-MoE (Qwen2MoeConfig): q/k/v biases, a shared expert with a sigmoid gate */
static const sm_moe_defaults qwen2_moe_moe = {
  .n_experts = 60,
  .top_k = 4,
  .expert_inter = 1408,
  .shared_inter = 5632,
  .norm_topk = false,
  .sparse_step = 1,
};
static const sm_config_defaults qwen2_moe_defaults = {
  .type = "qwen2_moe",
  .vocab = 151936,
  .hidden = 2048,
  .inter = 5632,
  .layers = 24,
  .heads = 16,
  .kv = 16,
  .max_pos = 32768,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .sw_mode = 2,
  .sliding = 4096,
  .bos = -1,
  .eos = -1,
  .max_window_layers = 28,
  .moe = &qwen2_moe_moe,
};
static const sm_recipe qwen2_moe_recipe = {.qkv_bias = true, .window = SM_WIN_FROM_LAYER};
static const sm_moe_spec qwen2_moe_spec = {
  .route = SM_ROUTE_SOFTMAX,
  .router = "mlp.gate",
  .experts = "mlp.switch_mlp",
  .shared = "mlp.shared_expert",
  .shared_gate = "mlp.shared_expert_gate",
};
const sm_family sm_family_qwen2_moe = {
  .model_type = "qwen2_moe",
  .description = "Qwen1.5-MoE / Qwen2-MoE (shared expert with a sigmoid gate)",
  .example = "mlx-community/Qwen1.5-MoE-A2.7B-Chat-4bit",
  .defaults = &qwen2_moe_defaults,
  .names = &sm_names_llama,
  .recipe = &qwen2_moe_recipe,
  .moe = &qwen2_moe_spec,
};

/* ---- Mixtral (MixtralConfig): block_sparse_moe, softmax over the top k logits */
static const sm_moe_defaults mixtral_moe = {.n_experts = 8, .top_k = 2};
static const sm_config_defaults mixtral_defaults = {
  .type = "mixtral",
  .vocab = 32000,
  .hidden = 4096,
  .inter = 14336,
  .layers = 32,
  .heads = 32,
  .kv = 8,
  .max_pos = 131072,
  .eps = 1e-5f,
  .theta = 1000000.f,
  .act = "silu",
  .sw_mode = 1,
  .sliding = 0,
  .bos = 1,
  .eos = 2,
  .moe = &mixtral_moe,
};
static const sm_recipe mixtral_recipe = {.window = SM_WIN_ALL};
static const sm_moe_spec mixtral_spec = {
  .route = SM_ROUTE_TOPK_SOFTMAX,
  .router = "block_sparse_moe.gate",
  .experts = "block_sparse_moe.switch_mlp",
};
const sm_family sm_family_mixtral = {
  .model_type = "mixtral",
  .description = "Mixtral 8x7B / 8x22B (top-2 of 8 experts)",
  .example = "mlx-community/Mixtral-8x7B-Instruct-v0.1-4bit",
  .defaults = &mixtral_defaults,
  .names = &sm_names_llama,
  .recipe = &mixtral_recipe,
  .moe = &mixtral_spec,
};

/* ---- gpt-oss (GptOssConfig) */
static const sm_tensor_names gpt_oss_names = {
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
    },
};
static const sm_moe_defaults gpt_oss_moe = {
  .n_experts = 128,
  .top_k = 4,
  .swiglu_limit = 7.0f,
  .swiglu_alpha = 1.702f,
};
static const sm_config_defaults gpt_oss_defaults = {
  .type = "gpt_oss",
  .vocab = 201088,
  .hidden = 2880,
  .inter = 2880,
  .layers = 36,
  .heads = 64,
  .kv = 8,
  .head_dim = 64,
  .max_pos = 131072,
  .eps = 1e-5f,
  .theta = 150000.f,
  .act = "silu",
  .attn_bias = true,
  .sw_mode = 1,
  .sliding = 128,
  .sw_pattern = 2,
  .bos = -1,
  .eos = -1,
  .moe = &gpt_oss_moe,
};
static const sm_recipe gpt_oss_recipe = {
  .attn_bias = SM_BIAS_QKVO,
  .window = SM_WIN_PATTERN,
  .attn_sinks = true,
};
static const sm_moe_spec gpt_oss_spec = {
  .route = SM_ROUTE_TOPK_SOFTMAX,
  .router = "mlp.router",
  .experts = "mlp.experts",
  .router_bias = true,
  .expert_bias = true,
  .clamped_swiglu = true,
};
const sm_family sm_family_gpt_oss = {
  .model_type = "gpt_oss",
  .description = "gpt-oss 20b / 120b (attention sinks, sliding window, MoE)",
  .example = "mlx-community/gpt-oss-20b-MXFP4-Q8",
  .defaults = &gpt_oss_defaults,
  .names = &gpt_oss_names,
  .recipe = &gpt_oss_recipe,
  .moe = &gpt_oss_spec,
};

/* ---- GLM-4.5 / 4.6 / 4.7 MoE (Glm4MoeConfig) */
static const sm_moe_defaults glm4_moe_moe = {
  .n_experts = 128,
  .top_k = 8,
  .expert_inter = 1408,
  .n_shared = 1,
  .norm_topk = true,
  .routed_scale = 1.0f,
  .n_group = 1,
  .topk_group = 1,
  .first_dense = 1,
};
static const sm_config_defaults glm4_moe_defaults = {
  .type = "glm4_moe",
  .vocab = 151552,
  .hidden = 4096,
  .inter = 10944,
  .layers = 46,
  .heads = 96,
  .kv = 8,
  .head_dim = 128,
  .max_pos = 131072,
  .eps = 1e-5f,
  .theta = 10000.f,
  .act = "silu",
  .bos = -1,
  .eos = -1,
  .partial_rotary = 0.5f,
  .moe = &glm4_moe_moe,
};
static const sm_recipe glm4_moe_recipe = {
  .attn_bias = SM_BIAS_QKV,
  .qk_norm = SM_QK_NORM_HEAD,
  .qk_norm_if_config = true,
  .window = SM_WIN_NONE,
};
static const sm_moe_spec glm4_moe_spec = {
  .route = SM_ROUTE_SIGMOID,
  .router = "mlp.gate",
  .correction = "mlp.gate.e_score_correction_bias",
  .experts = "mlp.switch_mlp",
  .shared = "mlp.shared_experts",
};
const sm_family sm_family_glm4_moe = {
  .model_type = "glm4_moe",
  .description = "GLM-4.5 / 4.6 / 4.7 MoE (sigmoid routing, shared expert)",
  .example = "mlx-community/GLM-4.5-Air-4bit",
  .defaults = &glm4_moe_defaults,
  .names = &sm_names_qwen3,
  .recipe = &glm4_moe_recipe,
  .moe = &glm4_moe_spec,
};

/* ---- DeepSeek-V3 / R1 and Kimi-K2 (DeepseekV3Config), GLM-4.7-Flash (glm4_moe_lite): multi-head latent
 * attention (mla.c) with a sigmoid-routed, group-limited mixture and shared experts after first dense layers.
 * The attention's tensors are read by mla.c (mlx-lm's names, either kv_b_proj or its per-head split
 * embed_q / unembed_out); these names are the rest of a layer. */
static const sm_tensor_names deepseek_v3_names = {
  .root = "model.",
  .embed = "embed_tokens",
  .final_norm = "norm",
  .lm_head = "lm_head",
  .layers = "layers",
  .t =
    {
      [SM_T_ATTN_NORM] = "input_layernorm",
      [SM_T_FFN_NORM] = "post_attention_layernorm",
      [SM_T_GATE] = "mlp.gate_proj",
      [SM_T_UP] = "mlp.up_proj",
      [SM_T_DOWN] = "mlp.down_proj",
    },
};
static const sm_moe_defaults deepseek_v3_moe = {
  .n_experts = 256,
  .top_k = 8,
  .expert_inter = 2048,
  .n_shared = 1,
  .norm_topk = true,
  .routed_scale = 2.5f,
  .n_group = 8,
  .topk_group = 4,
  .first_dense = 3,
  .layer_freq = 1,
};
static const sm_mla_config deepseek_v3_mla = {
  .kv_rank = 512,
  .q_rank = 1536,
  .rope_dim = 64,
  .nope_dim = 128,
  .v_dim = 128,
};
static const sm_config_defaults deepseek_v3_defaults = {
  .type = "deepseek_v3",
  .vocab = 129280,
  .hidden = 7168,
  .inter = 18432,
  .layers = 61,
  .heads = 128,
  .kv = 0, /* num_attention_heads; the latent cache's single head is set from the MLA sizes */
  .head_dim = 192,
  .max_pos = 4096,
  .eps = 1e-6f,
  .theta = 10000.f,
  .act = "silu",
  .bos = 0,
  .eos = 1,
  .moe = &deepseek_v3_moe,
  .mla = &deepseek_v3_mla,
};
static const char *const deepseek_aliases[] = {"kimi_k2", NULL};
/* mlx-lm's q_a_layernorm / kv_a_layernorm: eps 1e-6 */
static const sm_recipe deepseek_v3_recipe = {.window = SM_WIN_NONE, .mla = true, .mla_norm_eps = 1e-6f};
static const sm_moe_spec deepseek_v3_spec = {
  .route = SM_ROUTE_SIGMOID,
  .router = "mlp.gate",
  .correction = "mlp.gate.e_score_correction_bias",
  .experts = "mlp.switch_mlp",
  .shared = "mlp.shared_experts",
};
const sm_family sm_family_deepseek_v3 = {
  .model_type = "deepseek_v3",
  .aliases = deepseek_aliases,
  .description = "DeepSeek-V3 / R1, Kimi-K2 (multi-head latent attention, 256 experts)",
  .example = "mlx-community/DeepSeek-V3-0324-4bit",
  .defaults = &deepseek_v3_defaults,
  .names = &deepseek_v3_names,
  .recipe = &deepseek_v3_recipe,
  .moe = &deepseek_v3_spec,
  /* synthetic checkpoints: small latent sizes, layer 0 dense, two expert groups, DeepSeek-V3's YaRN */
  .synth = "{\"kv_lora_rank\": 64, \"q_lora_rank\": 64, \"qk_rope_head_dim\": 16, \"qk_nope_head_dim\": 32, "
           "\"v_head_dim\": 32, \"first_k_dense_replace\": 1, \"n_group\": 2, \"topk_group\": 1, "
           "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
           "\"beta_fast\": 32, \"beta_slow\": 1, \"original_max_position_embeddings\": 4096}}",
};

/* GLM-4.7-Flash (mlx-lm glm4_moe_lite.py): DeepSeek-V3's design, its latent norms with rms_norm_eps */
static const sm_moe_defaults glm4_moe_lite_moe = {
  .n_experts = 64,
  .top_k = 4,
  .expert_inter = 1536,
  .n_shared = 1,
  .norm_topk = true,
  .routed_scale = 1.8f,
  .n_group = 1,
  .topk_group = 1,
  .first_dense = 1,
  .layer_freq = 1,
};
static const sm_mla_config glm4_moe_lite_mla = {
  .kv_rank = 512,
  .q_rank = 768,
  .rope_dim = 64,
  .nope_dim = 192,
  .v_dim = 256,
};
static const sm_config_defaults glm4_moe_lite_defaults = {
  .type = "glm4_moe_lite",
  .vocab = 154880,
  .hidden = 2048,
  .inter = 10240,
  .layers = 47,
  .heads = 20,
  .kv = 0,
  .head_dim = 64, /* the config's (qk_rope_head_dim); the latent cache's is set from the MLA sizes */
  .max_pos = 202752,
  .eps = 1e-5f,
  .theta = 1000000.f,
  .act = "silu",
  .bos = -1,
  .eos = -1,
  .moe = &glm4_moe_lite_moe,
  .mla = &glm4_moe_lite_mla,
};
static const sm_recipe glm4_moe_lite_recipe = {.window = SM_WIN_NONE, .mla = true};
const sm_family sm_family_glm4_moe_lite = {
  .model_type = "glm4_moe_lite",
  .description = "GLM-4.7-Flash (multi-head latent attention, 64 experts)",
  .example = "mlx-community/GLM-4.7-Flash-4bit",
  .defaults = &glm4_moe_lite_defaults,
  .names = &deepseek_v3_names,
  .recipe = &glm4_moe_lite_recipe,
  .moe = &deepseek_v3_spec,
  .synth = "{\"kv_lora_rank\": 64, \"q_lora_rank\": 64, \"qk_rope_head_dim\": 16, \"qk_nope_head_dim\": 32, "
           "\"v_head_dim\": 32, \"first_k_dense_replace\": 1}",
};
