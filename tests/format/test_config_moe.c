/* The mixture-of-experts fields of config.json (format/config_moe.c) as the registry's families read them:
 * published configs (abridged: Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B, Mixtral-8x7B, gpt-oss-20b, GLM-4.5-Air,
 * DeepSeek-V3) with the values they must parse to, the class defaults for fields a config leaves out, which
 * layers are mixtures, and the errors of bad fields. */
#include <string.h>
#include "model/family.h"
#include "../test_util.h"

static smelt_status parse(const char *js, sm_config *c) {
  return sm_config_parse(js, strlen(js), NULL, 0, sm_family_defaults, c);
}

static void test_published(void) {
  sm_config c;
  /* Qwen/Qwen3-30B-A3B */
  CHECK(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"decoder_sparse_step\": 1, \"head_dim\": 128,"
              " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"intermediate_size\": 6144,"
              " \"max_position_embeddings\": 40960, \"max_window_layers\": 48, \"mlp_only_layers\": [],"
              " \"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
              " \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8,"
              " \"num_hidden_layers\": 48, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06,"
              " \"rope_theta\": 1000000.0, \"tie_word_embeddings\": false, \"use_sliding_window\": false,"
              " \"vocab_size\": 151936, \"quantization\": {\"group_size\": 64, \"bits\": 4,"
              " \"model.layers.0.mlp.gate\": {\"group_size\": 64, \"bits\": 8}}}",
              &c) == SMELT_OK,
        "qwen3_moe: %s", sm_errmsg());
  CHECK(c.moe.n_experts == 128 && c.moe.top_k == 8 && c.moe.expert_inter == 768 && c.moe.norm_topk &&
          c.moe.shared_inter == 0 && c.moe.routed_scale == 1.f,
        "qwen3_moe: %d %d %d %d", c.moe.n_experts, c.moe.top_k, c.moe.expert_inter, c.moe.norm_topk);
  bool all = true;
  for (int l = 0; l < 48; l++) all &= c.moe.moe_layer[l] == 1;
  CHECK(all, "qwen3_moe: every layer a mixture");
  sm_config_free(&c);
  /* Qwen/Qwen1.5-MoE-A2.7B (norm_topk_prob: the class default, false) */
  CHECK(parse("{\"model_type\": \"qwen2_moe\", \"hidden_size\": 2048, \"intermediate_size\": 5632,"
              " \"moe_intermediate_size\": 1408, \"shared_expert_intermediate_size\": 5632, \"num_experts\": 60,"
              " \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24, \"num_attention_heads\": 16,"
              " \"num_key_value_heads\": 16, \"vocab_size\": 151936, \"decoder_sparse_step\": 1,"
              " \"max_position_embeddings\": 8192}",
              &c) == SMELT_OK,
        "qwen2_moe: %s", sm_errmsg());
  CHECK(c.moe.n_experts == 60 && c.moe.top_k == 4 && c.moe.shared_inter == 5632 && !c.moe.norm_topk, "qwen2_moe");
  sm_config_free(&c);
  /* mistralai/Mixtral-8x7B-v0.1: the experts are intermediate_size */
  CHECK(parse("{\"model_type\": \"mixtral\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
              " \"num_attention_heads\": 32, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 32,"
              " \"num_key_value_heads\": 8, \"num_local_experts\": 8, \"rope_theta\": 1000000.0,"
              " \"sliding_window\": null, \"vocab_size\": 32000}",
              &c) == SMELT_OK,
        "mixtral: %s", sm_errmsg());
  CHECK(c.moe.n_experts == 8 && c.moe.top_k == 2 && c.moe.expert_inter == 14336 && c.sliding_window == 0, "mixtral");
  sm_config_free(&c);
  /* openai/gpt-oss-20b (mlx-community MXFP4-Q8 quantization block) */
  CHECK(parse("{\"model_type\": \"gpt_oss\", \"hidden_size\": 2880, \"intermediate_size\": 2880, \"head_dim\": 64,"
              " \"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"num_hidden_layers\": 24,"
              " \"num_local_experts\": 32, \"num_experts_per_tok\": 4, \"experts_per_token\": 4,"
              " \"sliding_window\": 128, \"swiglu_limit\": 7.0, \"vocab_size\": 201088, \"rope_theta\": 150000,"
              " \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","
              " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","
              " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","
              " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","
              " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","
              " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"],"
              " \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"factor\": 32.0,"
              " \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false},"
              " \"quantization\": {\"group_size\": 64, \"bits\": 8, \"mode\": \"affine\","
              " \"model.layers.0.mlp.experts.gate_proj\": {\"group_size\": 32, \"bits\": 4, \"mode\": \"mxfp4\"}}}",
              &c) == SMELT_OK,
        "gpt_oss: %s", sm_errmsg());
  CHECK(c.moe.n_experts == 32 && c.moe.top_k == 4 && c.moe.expert_inter == 2880 && c.moe.swiglu_limit == 7.f &&
          c.moe.swiglu_alpha == 1.702f && c.attention_bias && c.sliding_window == 128 && c.layer_sliding[0] &&
          !c.layer_sliding[1] && c.rope_type == SM_ROPE_YARN && !c.rope_truncate,
        "gpt_oss fields");
  int b, g, md;
  sm_config_quant_mode_for(&c, "model.layers.0.mlp.experts.gate_proj", &b, &g, &md);
  CHECK(md == SM_QMODE_MXFP4 && b == 4 && g == 32, "gpt_oss experts mxfp4");
  sm_config_free(&c);
  /* zai-org/GLM-4.5-Air: first_k_dense_replace 1, shared expert, sigmoid routing */
  CHECK(
    parse("{\"model_type\": \"glm4_moe\", \"hidden_size\": 4096, \"intermediate_size\": 10944,"
          " \"moe_intermediate_size\": 1408, \"n_routed_experts\": 128, \"n_shared_experts\": 1,"
          " \"num_experts_per_tok\": 8, \"n_group\": 1, \"topk_group\": 1, \"routed_scaling_factor\": 1.0,"
          " \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"num_attention_heads\": 96,"
          " \"num_key_value_heads\": 8, \"head_dim\": 128, \"num_hidden_layers\": 46, \"partial_rotary_factor\": 0.5,"
          " \"use_qk_norm\": false, \"attention_bias\": true, \"vocab_size\": 151552,"
          " \"max_position_embeddings\": 131072, \"rope_theta\": 1000000}",
          &c) == SMELT_OK,
    "glm4_moe: %s", sm_errmsg());
  CHECK(c.moe.n_experts == 128 && c.moe.shared_inter == 1408 && c.moe.norm_topk && c.moe.use_qk_norm == 0 &&
          !c.moe.moe_layer[0] && c.moe.moe_layer[1] && c.moe.moe_layer[45] && c.partial_rotary_dim == 64,
        "glm4_moe");
  sm_config_free(&c);
  /* deepseek-ai/DeepSeek-V3: group-limited routing, multi-head latent attention (the class defaults) */
  CHECK(parse("{\"model_type\": \"deepseek_v3\", \"hidden_size\": 7168, \"intermediate_size\": 18432,"
              " \"moe_intermediate_size\": 2048, \"n_routed_experts\": 256, \"n_shared_experts\": 1,"
              " \"num_experts_per_tok\": 8, \"n_group\": 8, \"topk_group\": 4, \"routed_scaling_factor\": 2.5,"
              " \"first_k_dense_replace\": 3, \"moe_layer_freq\": 1, \"num_hidden_layers\": 61,"
              " \"num_attention_heads\": 128, \"num_key_value_heads\": 128, \"topk_method\": \"noaux_tc\","
              " \"scoring_func\": \"sigmoid\", \"vocab_size\": 129280}",
              &c) == SMELT_OK,
        "deepseek_v3: %s", sm_errmsg());
  CHECK(c.moe.n_group == 8 && c.moe.topk_group == 4 && c.moe.routed_scale == 2.5f && !c.moe.moe_layer[2] &&
          c.moe.moe_layer[3],
        "deepseek_v3");
  /* the latent cache's geometry: one KV head of kv_lora_rank + qk_rope_head_dim */
  CHECK(c.mla.kv_rank == 512 && c.mla.q_rank == 1536 && c.mla.rope_dim == 64 && c.mla.nope_dim == 128 &&
          c.mla.v_dim == 128 && c.head_dim == 576 && c.num_key_value_heads == 1 && c.partial_rotary_dim == 64,
        "deepseek_v3 latent attention: %d %d %d %d %d, head_dim %d, kv heads %d", c.mla.kv_rank, c.mla.q_rank,
        c.mla.rope_dim, c.mla.nope_dim, c.mla.v_dim, c.head_dim, c.num_key_value_heads);
  CHECK(sm_family_runnable("deepseek_v3") && sm_family_runnable("kimi_k2") == sm_family_runnable("deepseek_v3") &&
          sm_family_runnable("glm4_moe_lite"),
        "deepseek_v3 / kimi_k2 / glm4_moe_lite runnable");
  sm_config_free(&c);
  /* DeepSeek-V2-Lite style: q_lora_rank null (a plain q_proj); GLM-4.7-Flash's class defaults */
  CHECK(parse("{\"model_type\": \"deepseek_v3\", \"q_lora_rank\": null, \"kv_lora_rank\": 512,"
              " \"qk_rope_head_dim\": 64, \"qk_nope_head_dim\": 128, \"v_head_dim\": 128}",
              &c) == SMELT_OK &&
          c.mla.q_rank == 0 && c.head_dim == 576,
        "q_lora_rank null: %s", sm_errmsg());
  sm_config_free(&c);
  /* moonshotai/Kimi-K2: DeepSeek-V3's class (model_type kimi_k2), 384 experts in one group */
  CHECK(parse("{\"model_type\": \"kimi_k2\", \"n_routed_experts\": 384, \"num_attention_heads\": 64,"
              " \"n_group\": 1, \"topk_group\": 1, \"first_k_dense_replace\": 1}",
              &c) == SMELT_OK &&
          c.mla.kv_rank == 512 && c.head_dim == 576 && c.num_key_value_heads == 1 && c.moe.n_experts == 384 &&
          !c.moe.moe_layer[0] && c.moe.moe_layer[1],
        "kimi_k2: %s", sm_errmsg());
  sm_config_free(&c);
  CHECK(parse("{\"model_type\": \"glm4_moe_lite\"}", &c) == SMELT_OK && c.mla.q_rank == 768 && c.mla.nope_dim == 192 &&
          c.mla.v_dim == 256 && c.moe.n_experts == 64 && c.moe.top_k == 4 && !c.moe.moe_layer[0] && c.moe.moe_layer[1],
        "glm4_moe_lite defaults: %s", sm_errmsg());
  sm_config_free(&c);
  /* the class defaults and mlp_only_layers / decoder_sparse_step */
  CHECK(parse("{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 4, \"mlp_only_layers\": [0],"
              " \"decoder_sparse_step\": 2}",
              &c) == SMELT_OK,
        "qwen3_moe defaults: %s", sm_errmsg());
  CHECK(c.moe.n_experts == 128 && c.moe.top_k == 8 && c.moe.expert_inter == 768 && !c.moe.moe_layer[0] &&
          c.moe.moe_layer[1] && !c.moe.moe_layer[2] && c.moe.moe_layer[3],
        "qwen3_moe defaults: %d %d %d %d", c.moe.moe_layer[0], c.moe.moe_layer[1], c.moe.moe_layer[2],
        c.moe.moe_layer[3]);
  sm_config_free(&c);
}

static void test_errors(void) {
  static const struct {
    const char *js, *want;
  } bad[] = {
    {"{\"model_type\": \"qwen3_moe\", \"num_experts\": 8, \"num_experts_per_tok\": 9}", "num_experts_per_tok"},
    {"{\"model_type\": \"deepseek_v3\", \"qk_rope_head_dim\": 63}", "qk_rope_head_dim"},
    {"{\"model_type\": \"deepseek_v3\", \"kv_lora_rank\": 0}", "kv_lora_rank"},
    {"{\"model_type\": \"qwen3_moe\", \"num_experts\": 0}", "num_experts"},
    {"{\"model_type\": \"glm4_moe\", \"n_routed_experts\": 12, \"n_group\": 5}", "n_group"},
    {"{\"model_type\": \"glm4_moe\", \"n_routed_experts\": 16, \"n_group\": 4, \"topk_group\": 1,"
     " \"num_experts_per_tok\": 8}",
     "n_group"},
    {"{\"model_type\": \"deepseek_v3\", \"topk_method\": \"greedy\"}", "topk_method"},
    {"{\"model_type\": \"deepseek_v3\", \"scoring_func\": \"softmax\"}", "scoring_func"},
    {"{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 2, \"mlp_only_layers\": [2]}", "mlp_only_layers"},
    {"{\"model_type\": \"qwen3_moe\", \"norm_topk_prob\": 1}", "norm_topk_prob"},
    {"{\"model_type\": \"gpt_oss\", \"swiglu_limit\": -1}", "swiglu_limit"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    sm_config c;
    smelt_status st = parse(bad[i].js, &c);
    CHECK(st != SMELT_OK && strstr(sm_errmsg(), bad[i].want), "bad config %zu: status %d, message '%s'", i, st,
          sm_errmsg());
    if (st == SMELT_OK) sm_config_free(&c);
  }
}

int main(void) {
  test_published();
  test_errors();
  TEST_END();
}
