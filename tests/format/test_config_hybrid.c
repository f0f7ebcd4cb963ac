/* config.json parsing of hybrid models (recurrent layers next to attention): the layer kinds in each
 * spelling (layer_types, hybrid_override_pattern, layers_block_type, full_attn_idxs,
 * full_attention_interval), the recurrent sizes and state sizes, the family quirks (LFM2's block_*
 * MLP size, Nemotron-H's Infinity and attention_head_dim, Granite's shared_intermediate_size and
 * position_embedding_type), MoE detection, and the errors. The configs follow the layout of the named
 * models' published configs (abridged); expected values from those and the transformers config classes. */
#include "format/config.h"
#include "model/family.h"
#include "check.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static smelt_status parse(const char *js, sm_config *c) {
  smelt_status st = sm_config_parse(js, strlen(js), NULL, 0, sm_family_defaults, c);
  if (st) fprintf(stderr, "  (%s)\n", sm_errmsg());
  return st;
}

static int count_kind(const sm_config *c, int kind) {
  int n = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) n += c->layer_kind[l] == kind;
  return n;
}

static void test_qwen3_5(void) {
  /* Qwen/Qwen3.5-9B: the text model under text_config next to a vision_config */
  const char *js =
    "{\"model_type\": \"qwen3_5\", \"architectures\": [\"Qwen3_5ForConditionalGeneration\"],"
    " \"text_config\": {\"model_type\": \"qwen3_5_text\", \"attention_bias\": false, \"attn_output_gate\": true,"
    " \"eos_token_id\": 248044, \"full_attention_interval\": 4, \"head_dim\": 256, \"hidden_size\": 4096,"
    " \"intermediate_size\": 12288, \"layer_types\": [\"linear_attention\", \"linear_attention\", \"linear_attention\","
    " \"full_attention\", \"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\"],"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_num_key_heads\": 16,"
    " \"linear_num_value_heads\": 32, \"linear_value_head_dim\": 128, \"num_attention_heads\": 16,"
    " \"num_key_value_heads\": 4, \"num_hidden_layers\": 8, \"rms_norm_eps\": 1e-06, \"vocab_size\": 248320,"
    " \"max_position_embeddings\": 262144, \"mtp_num_hidden_layers\": 1,"
    " \"rope_parameters\": {\"mrope_interleaved\": true, \"mrope_section\": [11, 11, 10], \"rope_type\": \"default\","
    " \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25}, \"tie_word_embeddings\": false},"
    " \"vision_config\": {\"depth\": 27, \"hidden_size\": 1152}, \"tie_word_embeddings\": false,"
    " \"quantization\": {\"group_size\": 64, \"bits\": 4}}";
  sm_config c;
  CHECK_EQ_I(parse(js, &c), SMELT_OK);
  CHECK_STR(c.model_type, "qwen3_5_text");
  CHECK_STR(c.vlm_type, "qwen3_5");
  CHECK_EQ_I(c.rec.kind, SM_REC_GDN);
  CHECK_EQ_I(c.head_dim, 256);
  CHECK_EQ_I(c.partial_rotary_dim, 64);
  CHECK_EQ_F(c.rope_theta, 1e7);
  CHECK_EQ_I(c.rec.conv_kernel, 4);
  CHECK(c.rec.gdn_k_heads == 16 && c.rec.gdn_v_heads == 32 && c.rec.gdn_k_dim == 128 && c.rec.gdn_v_dim == 128);
  CHECK_EQ_I(c.rec.n_experts, 0);
  CHECK(c.layer_kind[0] == SM_LK_REC && c.layer_kind[2] == SM_LK_REC && c.layer_kind[3] == SM_LK_ATTN &&
        c.layer_kind[7] == SM_LK_ATTN);
  CHECK_EQ_I(sm_config_attn_layers(&c), 2);
  size_t cf, sf;
  sm_config_rec_state(&c, &cf, &sf);
  CHECK_EQ_I((int)cf, 3 * (2 * 16 * 128 + 32 * 128)); /* kernel - 1 rows of q|k|v */
  CHECK_EQ_I((int)sf, 32 * 128 * 128);
  CHECK_EQ_I(sm_config_rec_conv_dim(&c), 8192);
  const sm_family *f = sm_family_runnable(c.model_type);
  CHECK(f != NULL && sm_family_type_runnable("qwen3_5"));
  if (f) {
    sm_layer_spec sp;
    sm_family_layer_spec(f, &c, 0, &sp);
    CHECK(sp.kind == SM_LK_REC && sp.ffn && sp.rope == -1);
    sm_family_layer_spec(f, &c, 3, &sp);
    CHECK(sp.kind == SM_LK_ATTN && sp.ffn && sp.rope == 0);
    CHECK(sm_family_slot_used(f, &c, 0, SM_T_REC_CONV) && !sm_family_slot_used(f, &c, 0, SM_T_Q));
    CHECK(sm_family_slot_used(f, &c, 3, SM_T_ATTN_GATE) && !sm_family_slot_used(f, &c, 3, SM_T_REC_OUT));
    int64_t rows, cols;
    sm_family_slot_shape(f, &c, 3, SM_T_Q, &rows, &cols);
    CHECK(rows == 2 * 16 * 256 && cols == 4096); /* q and its gate, per head */
    sm_family_slot_shape(f, &c, 3, SM_T_REC_IN, &rows, &cols);
    CHECK(rows == 8192 && cols == 4096);
    sm_family_slot_shape(f, &c, 3, SM_T_REC_CONV, &rows, &cols);
    CHECK(rows == 8192 && cols == 4);
    sm_family_slot_shape(f, &c, 3, SM_T_REC_NORM, &rows, &cols);
    CHECK(rows == 128 && cols == 0);
  }
  sm_config_free(&c);
  /* without layer_types: every full_attention_interval-th layer (default 4) is attention */
  const char *js2 =
    "{\"model_type\": \"qwen3_5_text\", \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 8, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100}";
  CHECK_EQ_I(parse(js2, &c), SMELT_OK);
  CHECK(c.layer_kind[2] == SM_LK_REC && c.layer_kind[3] == SM_LK_ATTN && count_kind(&c, SM_LK_ATTN) == 2);
  CHECK_EQ_I(c.head_dim, 256); /* Qwen3_5TextConfig defaults */
  CHECK_EQ_I(c.partial_rotary_dim, 64);
  sm_config_free(&c);
}

static void test_qwen3_next(void) {
  /* Qwen/Qwen3-Coder-Next: MoE (num_experts 512): parsed, refused at load */
  const char *js =
    "{\"model_type\": \"qwen3_next\", \"hidden_size\": 2048, \"num_hidden_layers\": 48, \"vocab_size\": 151936,"
    " \"head_dim\": 256, \"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"intermediate_size\": 5120,"
    " \"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 512,"
    " \"shared_expert_intermediate_size\": 512, \"linear_num_key_heads\": 16, \"linear_key_head_dim\": 128,"
    " \"linear_num_value_heads\": 32, \"linear_value_head_dim\": 128, \"linear_conv_kernel_dim\": 4,"
    " \"full_attention_interval\": 4, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"partial_rotary_factor\": 0.25,"
    " \"rope_theta\": 5000000, \"tie_word_embeddings\": false, \"max_position_embeddings\": 262144}";
  sm_config c;
  CHECK_EQ_I(parse(js, &c), SMELT_OK);
  CHECK_EQ_I(c.rec.n_experts, 512);
  CHECK_EQ_I(count_kind(&c, SM_LK_ATTN), 12);
  sm_config_free(&c);
  /* a dense configuration */
  const char *js2 =
    "{\"model_type\": \"qwen3_next\", \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100, \"num_experts\": 0}";
  CHECK_EQ_I(parse(js2, &c), SMELT_OK);
  CHECK_EQ_I(c.rec.n_experts, 0);
  sm_config_free(&c);
}

static void test_lfm2(void) {
  /* LiquidAI/LFM2-1.2B */
  const char *js =
    "{\"architectures\": [\"Lfm2ForCausalLM\"], \"block_auto_adjust_ff_dim\": true, \"block_dim\": 2048,"
    " \"block_ff_dim\": 12288, \"block_ffn_dim_multiplier\": 1.0, \"block_multiple_of\": 256, \"bos_token_id\": 1,"
    " \"conv_L_cache\": 3, \"conv_bias\": false, \"eos_token_id\": 7, \"intermediate_size\": 8192,"
    " \"full_attn_idxs\": [2, 5, 8, 10, 12, 14], \"hidden_size\": 2048, \"max_position_embeddings\": 128000,"
    " \"model_type\": \"lfm2\", \"norm_eps\": 1e-05, \"num_attention_heads\": 32, \"num_heads\": 32,"
    " \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"rope_theta\": 1000000.0, \"vocab_size\": 65536}";
  sm_config c;
  CHECK_EQ_I(parse(js, &c), SMELT_OK);
  CHECK_EQ_I(c.rec.kind, SM_REC_SHORTCONV);
  CHECK_EQ_I(c.intermediate_size, 8192); /* int(2 * 12288 / 3) */
  CHECK_EQ_F(c.rms_norm_eps, 1e-5);
  CHECK_EQ_I(c.rec.conv_kernel, 3);
  CHECK(c.tie_word_embeddings);
  CHECK_EQ_I(c.head_dim, 64);
  CHECK(c.layer_kind[2] == SM_LK_ATTN && c.layer_kind[14] == SM_LK_ATTN && c.layer_kind[0] == SM_LK_REC &&
        c.layer_kind[15] == SM_LK_REC && count_kind(&c, SM_LK_ATTN) == 6);
  size_t cf, sf;
  sm_config_rec_state(&c, &cf, &sf);
  CHECK(cf == 2 * 2048 && sf == 0);
  sm_config_free(&c);
  /* the block_* adjustment with a multiplier, transformers-5 rope_parameters, layer_types */
  const char *js2 =
    "{\"model_type\": \"lfm2\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 100, \"intermediate_size\": 300, \"block_ffn_dim_multiplier\": 1.5,"
    " \"block_multiple_of\": 64, \"layer_types\": [\"conv\", \"full_attention\"],"
    " \"rope_parameters\": {\"rope_theta\": 20000.0, \"rope_type\": \"default\"}}";
  CHECK_EQ_I(parse(js2, &c), SMELT_OK);
  CHECK_EQ_I(c.intermediate_size, 320); /* int(1.5 * int(2 * 300 / 3)) = 300 -> 320 */
  CHECK_EQ_F(c.rope_theta, 20000.0);
  CHECK(c.layer_kind[0] == SM_LK_REC && c.layer_kind[1] == SM_LK_ATTN);
  sm_config_free(&c);
  /* neither layer_types nor full_attn_idxs: every layer is attention (Lfm2Config) */
  const char *js3 =
    "{\"model_type\": \"lfm2\", \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 100, \"intermediate_size\": 96}";
  CHECK_EQ_I(parse(js3, &c), SMELT_OK);
  CHECK_EQ_I(count_kind(&c, SM_LK_ATTN), 3);
  sm_config_free(&c);
}

static void test_nemotron_h(void) {
  /* nvidia/Nemotron-H-8B-Base-8K (abridged), Python's json writing time_step_limit's infinity */
  const char *js =
    "{\"architectures\": [\"NemotronHForCausalLM\"], \"model_type\": \"nemotron_h\", \"attention_bias\": false,"
    " \"attention_head_dim\": 128, \"chunk_size\": 256, \"conv_kernel\": 4, \"eos_token_id\": 2, \"expand\": 2,"
    " \"hidden_size\": 4096, \"hybrid_override_pattern\": \"M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-\","
    " \"intermediate_size\": 21504, \"layer_norm_epsilon\": 1e-05, \"mamba_head_dim\": 64, \"mamba_hidden_act\": \"silu\","
    " \"mamba_num_heads\": 128, \"mamba_proj_bias\": false, \"max_position_embeddings\": 8192, \"mlp_bias\": false,"
    " \"mlp_hidden_act\": \"relu2\", \"n_groups\": 8, \"num_attention_heads\": 32, \"num_hidden_layers\": 52,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"ssm_state_size\": 128, \"tie_word_embeddings\": false,"
    " \"time_step_limit\": [0.0, Infinity], \"time_step_max\": 0.1, \"time_step_min\": 0.001, \"use_bias\": false,"
    " \"use_conv_bias\": true, \"vocab_size\": 131072, \"rope_theta\": NaN}";
  sm_config c;
  CHECK_EQ_I(parse(js, &c), SMELT_OK);
  CHECK_EQ_I(c.rec.kind, SM_REC_MAMBA2);
  CHECK_EQ_I(c.num_hidden_layers, 52);
  CHECK(count_kind(&c, SM_LK_REC) == 24 && count_kind(&c, SM_LK_ATTN) == 4 && count_kind(&c, SM_LK_MLP) == 24);
  CHECK(c.layer_kind[0] == SM_LK_REC && c.layer_kind[1] == SM_LK_MLP && c.layer_kind[7] == SM_LK_ATTN);
  CHECK(c.rec.m_heads == 128 && c.rec.m_head_dim == 64 && c.rec.m_state == 128 && c.rec.m_groups == 8);
  CHECK(c.rec.conv_bias && !c.rec.m_proj_bias && c.rec.m_norm_grouped && c.rec.no_rope);
  CHECK(c.rec.dt_min == 0.f && isinf(c.rec.dt_max));
  CHECK_STR(c.hidden_act, "relu2");
  CHECK_EQ_I(c.head_dim, 128);
  CHECK_EQ_I(sm_config_rec_conv_dim(&c), 128 * 64 + 2 * 8 * 128);
  const sm_family *f = sm_family_runnable("nemotron_h");
  if (f) {
    sm_layer_spec sp;
    sm_family_layer_spec(f, &c, 1, &sp);
    CHECK(sp.kind == SM_LK_MLP && sp.ffn);
    sm_family_layer_spec(f, &c, 0, &sp);
    CHECK(sp.kind == SM_LK_REC && !sp.ffn);
    sm_family_layer_spec(f, &c, 7, &sp);
    CHECK(sp.kind == SM_LK_ATTN && !sp.ffn && sp.rope == -1);
    CHECK(!sm_family_slot_used(f, &c, 7, SM_T_FFN_NORM) && sm_family_slot_used(f, &c, 1, SM_T_FFN_NORM) &&
          !sm_family_slot_used(f, &c, 1, SM_T_ATTN_NORM));
  }
  sm_config_free(&c);
  /* transformers 5: layers_block_type sets the layer count; time_step_limit as other writers spell it;
   * MoE blocks */
  const char *js2 =
    "{\"model_type\": \"nemotron_h\", \"hidden_size\": 64, \"num_hidden_layers\": 9,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100, \"intermediate_size\": 96,"
    " \"layers_block_type\": [\"mamba\", \"moe\", \"attention\"], \"mamba_num_heads\": 4,"
    " \"mamba_head_dim\": 16, \"n_groups\": 2, \"ssm_state_size\": 16,"
    " \"time_step_limit\": [0.001, {\"__float__\": \"Infinity\"}]}";
  CHECK_EQ_I(parse(js2, &c), SMELT_OK);
  CHECK_EQ_I(c.num_hidden_layers, 3);
  CHECK(c.layer_kind[1] == SM_LK_MOE && c.rec.n_experts > 0);
  CHECK(fabsf(c.rec.dt_min - 0.001f) < 1e-9f && isinf(c.rec.dt_max));
  sm_config_free(&c);
}

static void test_granite_hybrid(void) {
  /* ibm-granite/granite-4.0-h style (dense: num_local_experts 0): Mamba-2 layers with one attention
   * layer, NoPE, the shared MLP's size */
  const char *js =
    "{\"model_type\": \"granitemoehybrid\", \"hidden_size\": 1536, \"intermediate_size\": 8192,"
    " \"shared_intermediate_size\": 4096, \"num_hidden_layers\": 4, \"num_attention_heads\": 12,"
    " \"num_key_value_heads\": 4, \"vocab_size\": 100352, \"max_position_embeddings\": 131072,"
    " \"layer_types\": [\"mamba\", \"mamba\", \"attention\", \"mamba\"], \"position_embedding_type\": \"nope\","
    " \"mamba_n_heads\": 48, \"mamba_d_head\": 64, \"mamba_d_state\": 128, \"mamba_d_conv\": 4, \"mamba_n_groups\": 1,"
    " \"mamba_expand\": 2, \"mamba_conv_bias\": true, \"mamba_proj_bias\": false, \"num_local_experts\": 0,"
    " \"embedding_multiplier\": 12.0, \"attention_multiplier\": 0.015625, \"residual_multiplier\": 0.22,"
    " \"logits_scaling\": 6.0, \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": true}";
  sm_config c;
  CHECK_EQ_I(parse(js, &c), SMELT_OK);
  CHECK_EQ_I(c.intermediate_size, 4096);
  CHECK(c.rec.no_rope && !c.rec.m_norm_grouped && c.rec.m_head_dim == 64 && c.rec.n_experts == 0);
  CHECK(c.rec.dt_min == 0.f && isinf(c.rec.dt_max)); /* transformers' default: no limit */
  CHECK_EQ_F(c.embedding_multiplier, 12.0);
  CHECK(c.layer_kind[2] == SM_LK_ATTN && count_kind(&c, SM_LK_REC) == 3);
  sm_config_free(&c);
  /* defaults: without layer_types every layer is Mamba-2; "auto" head size; num_local_experts 8 (MoE);
   * RoPE with position_embedding_type "rope" */
  const char *js2 =
    "{\"model_type\": \"granitemoehybrid\", \"hidden_size\": 64, \"intermediate_size\": 96,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100,"
    " \"mamba_n_heads\": 8, \"mamba_d_head\": \"auto\", \"position_embedding_type\": \"rope\"}";
  CHECK_EQ_I(parse(js2, &c), SMELT_OK);
  CHECK(count_kind(&c, SM_LK_REC) == 2 && c.rec.m_head_dim == 16 && c.rec.n_experts == 8 && !c.rec.no_rope);
  sm_config_free(&c);
}

static void test_errors(void) {
  sm_config c;
  /* a hybrid kind in a family without recurrent layers */
  CHECK_EQ_I(
    parse(
      "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
      " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100, \"layer_types\": [\"mamba\", \"full_attention\"]}",
      &c),
    SMELT_ERR_UNSUPPORTED);
  const char *base =
    "{\"model_type\": \"qwen3_5_text\", \"hidden_size\": 64, \"intermediate_size\": 96,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100, ";
  char js[600];
  snprintf(js, sizeof js, "%s\"linear_num_key_heads\": 3, \"linear_num_value_heads\": 4}", base);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT); /* value heads not a multiple of key heads */
  snprintf(js, sizeof js, "%s\"linear_conv_kernel_dim\": 1}", base);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT);
  snprintf(js, sizeof js, "%s\"layer_types\": [\"linear_attention\", \"bogus\"]}", base);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_UNSUPPORTED);
  const char *nh =
    "{\"model_type\": \"nemotron_h\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 100, \"intermediate_size\": 96, ";
  snprintf(js, sizeof js, "%s\"hybrid_override_pattern\": \"M*X\"}", nh);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT);
  snprintf(js, sizeof js, "%s\"mamba_num_heads\": 6, \"n_groups\": 4}", nh);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT); /* groups must divide heads */
  snprintf(js, sizeof js, "%s\"time_step_limit\": [1.0, 0.5]}", nh);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT);
  snprintf(js, sizeof js, "%s\"time_step_limit\": 3}", nh);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT);
  /* Infinity where a finite number belongs */
  snprintf(js, sizeof js, "%s\"rms_norm_eps\": Infinity}", nh);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT);
  /* a bare Infinity inside a string is a string */
  snprintf(js, sizeof js, "%s\"note\": \"Infinity NaN\", \"time_step_limit\": [0.0, \"Infinity\"]}", nh);
  CHECK_EQ_I(parse(js, &c), SMELT_OK);
  CHECK(isinf(c.rec.dt_max));
  sm_config_free(&c);
  const char *gr =
    "{\"model_type\": \"granitemoehybrid\", \"hidden_size\": 64, \"intermediate_size\": 96,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100, ";
  snprintf(js, sizeof js, "%s\"mamba_n_heads\": 7}", gr); /* 7 does not divide expand * hidden */
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT);
  const char *lf =
    "{\"model_type\": \"lfm2\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 100, \"intermediate_size\": 96, ";
  snprintf(js, sizeof js, "%s\"full_attn_idxs\": [0, 2]}", lf);
  CHECK_EQ_I(parse(js, &c), SMELT_ERR_FORMAT);
}

int main(void) {
  test_qwen3_5();
  test_qwen3_next();
  test_lfm2();
  test_nemotron_h();
  test_granite_hybrid();
  test_errors();
  return TEST_DONE();
}
