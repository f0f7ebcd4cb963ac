/* config.json parsing tests. The configs are (abridged) copies of the published
 * Hugging Face configs of the named models; expected values come from those files
 * and the transformers *Config class defaults. */
#include "format/config.h"
#include "model/family.h"
#include "check.h"
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_tmp[256];

static void write_file(const char *dir, const char *name, const char *text) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  if (!f) {
    perror(p);
    exit(2);
  }
  fputs(text, f);
  fclose(f);
}

/* write a model dir with config (+ optional generation config) and load it */
static smelt_status load(const char *name, const char *cfg, const char *gen, sm_config *c) {
  char d[512];
  snprintf(d, sizeof d, "%s/%s", g_tmp, name);
  mkdir(d, 0755);
  write_file(d, "config.json", cfg);
  if (gen) write_file(d, "generation_config.json", gen);
  smelt_status rc = sm_family_config_load(d, c);
  if (rc != SMELT_OK) fprintf(stderr, "[%s] %s\n", name, sm_errmsg());
  return rc;
}

static bool has_eos(const sm_config *c, int id) {
  for (int i = 0; i < c->n_eos; i++)
    if (c->eos_ids[i] == id) return true;
  return false;
}

static void test_llama3(void) {
  /* mlx-community/Llama-3.2-1B-Instruct-4bit */
  const char *cfg =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 64,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0,"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.45.0.dev0\","
    " \"use_cache\": true, \"vocab_size\": 128256,"
    " \"quantization\": {\"group_size\": 64, \"bits\": 4}, \"quantization_config\": {\"group_size\": 64, \"bits\": 4}}";
  const char *gen = "{\"bos_token_id\": 128000, \"do_sample\": true, \"eos_token_id\": [128001, 128008, 128009],"
                    " \"temperature\": 0.6, \"top_p\": 0.9, \"transformers_version\": \"4.45.0.dev0\"}";
  sm_config c;
  CHECK_EQ_I(load("llama3", cfg, gen, &c), SMELT_OK);
  CHECK_STR(c.model_type, "llama");
  CHECK_EQ_I(c.vocab_size, 128256);
  CHECK_EQ_I(c.hidden_size, 2048);
  CHECK_EQ_I(c.intermediate_size, 8192);
  CHECK_EQ_I(c.num_hidden_layers, 16);
  CHECK_EQ_I(c.num_attention_heads, 32);
  CHECK_EQ_I(c.num_key_value_heads, 8);
  CHECK_EQ_I(c.head_dim, 64);
  CHECK_EQ_I(c.partial_rotary_dim, 64);
  CHECK_EQ_I(c.max_position_embeddings, 131072);
  CHECK_EQ_F(c.rms_norm_eps, 1e-5);
  CHECK_EQ_F(c.rope_theta, 500000.0);
  CHECK_EQ_I(c.rope_type, SM_ROPE_LLAMA3);
  CHECK_EQ_F(c.rope_factor, 32.0);
  CHECK_EQ_F(c.rope_low_freq_factor, 1.0);
  CHECK_EQ_F(c.rope_high_freq_factor, 4.0);
  CHECK_EQ_I(c.rope_original_max_pos, 8192);
  CHECK(c.tie_word_embeddings && !c.attention_bias && !c.mlp_bias);
  CHECK_EQ_I(c.sliding_window, 0);
  CHECK_STR(c.hidden_act, "silu");
  CHECK_EQ_I(c.n_eos, 3);
  CHECK(has_eos(&c, 128001) && has_eos(&c, 128008) && has_eos(&c, 128009));
  CHECK_EQ_I(c.bos_id, 128000);
  CHECK_EQ_I(c.q_bits, 4);
  CHECK_EQ_I(c.q_group_size, 64);
  CHECK(c.quant != NULL && c.json != NULL);
  int b, g;
  sm_config_quant_for(&c, "model.layers.3.self_attn.q_proj", &b, &g);
  CHECK(b == 4 && g == 64);
  CHECK_EQ_F(c.gen_temperature, 0.6);
  CHECK_EQ_F(c.gen_top_p, 0.9);
  CHECK_EQ_I(c.gen_top_k, 0);
  CHECK_EQ_I(c.gen_do_sample, 1);
  CHECK_EQ_F(c.final_logit_softcapping, 0);
  sm_config_free(&c);
  CHECK(c.json == NULL);
}

static void test_qwen2(void) {
  /* Qwen/Qwen2.5-0.5B-Instruct */
  const char *cfg =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,"
    " \"eos_token_id\": 151645, \"hidden_act\": \"silu\", \"hidden_size\": 896, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 4864, \"max_position_embeddings\": 32768, \"max_window_layers\": 21,"
    " \"model_type\": \"qwen2\", \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.1\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";
  const char *gen = "{\"bos_token_id\": 151643, \"pad_token_id\": 151643, \"do_sample\": true,"
                    " \"eos_token_id\": [151645, 151643], \"repetition_penalty\": 1.1, \"temperature\": 0.7,"
                    " \"top_p\": 0.8, \"top_k\": 20, \"transformers_version\": \"4.37.0\"}";
  sm_config c;
  CHECK_EQ_I(load("qwen2", cfg, gen, &c), SMELT_OK);
  CHECK_STR(c.model_type, "qwen2");
  CHECK_EQ_I(c.head_dim, 64); /* 896 / 14 */
  CHECK_EQ_I(c.num_key_value_heads, 2);
  CHECK_EQ_I(c.sliding_window, 0); /* use_sliding_window false */
  CHECK(c.attention_bias);         /* Qwen2 q/k/v projections carry biases */
  CHECK(c.tie_word_embeddings);
  CHECK_EQ_F(c.rope_theta, 1e6);
  CHECK_EQ_I(c.rope_type, SM_ROPE_NONE);
  CHECK_EQ_I(c.n_eos, 2);
  CHECK(has_eos(&c, 151645) && has_eos(&c, 151643));
  CHECK_EQ_I(c.bos_id, 151643);
  CHECK_EQ_I(c.gen_top_k, 20);
  CHECK_EQ_F(c.gen_repetition_penalty, 1.1);
  CHECK_EQ_F(c.gen_top_p, 0.8);
  CHECK_EQ_I(c.q_bits, 0);
  int b = -1, g = -1;
  sm_config_quant_for(&c, "model.layers.0.mlp.up_proj", &b, &g);
  CHECK(b == 0 && g == 0);
  sm_config_free(&c);
}

static void test_qwen3(void) {
  /* Qwen/Qwen3-0.6B: head_dim 128 although hidden/heads = 64 */
  const char *cfg =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\","
    " \"hidden_size\": 1024, \"initializer_range\": 0.02, \"intermediate_size\": 3072,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\","
    " \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936,"
    " \"quantization_config\": {\"group_size\": 128, \"bits\": 8}}";
  const char *gen = "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643],"
                    " \"pad_token_id\": 151643, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95}";
  sm_config c;
  CHECK_EQ_I(load("qwen3", cfg, gen, &c), SMELT_OK);
  CHECK_STR(c.model_type, "qwen3");
  CHECK_EQ_I(c.head_dim, 128);
  CHECK_EQ_I(c.partial_rotary_dim, 128);
  CHECK_EQ_I(c.num_attention_heads, 16);
  CHECK_EQ_I(c.num_key_value_heads, 8);
  CHECK_EQ_I(c.max_position_embeddings, 40960);
  CHECK(!c.attention_bias);
  CHECK_EQ_I(c.sliding_window, 0);
  CHECK_EQ_I(c.rope_type, SM_ROPE_NONE);
  CHECK_EQ_F(c.rope_theta, 1e6);
  CHECK_EQ_I(c.n_eos, 2);
  /* quantization_config spelling */
  CHECK_EQ_I(c.q_bits, 8);
  CHECK_EQ_I(c.q_group_size, 128);
  int b, g;
  sm_config_quant_for(&c, "lm_head", &b, &g);
  CHECK(b == 8 && g == 128);
  sm_config_free(&c);
}

static void test_mistral(void) {
  /* mistralai/Mistral-7B-Instruct-v0.3 */
  const char *cfg =
    "{\"architectures\": [\"MistralForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 1,"
    " \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768, \"model_type\": \"mistral\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 1000000.0, \"sliding_window\": null, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.42.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 32768}";
  sm_config c;
  CHECK_EQ_I(load("mistral", cfg, NULL, &c), SMELT_OK);
  CHECK_STR(c.model_type, "mistral");
  CHECK_EQ_I(c.head_dim, 128);
  CHECK_EQ_I(c.sliding_window, 0); /* null */
  CHECK(!c.tie_word_embeddings);
  CHECK_EQ_I(c.n_eos, 1);
  CHECK_EQ_I(c.eos_ids[0], 2);
  CHECK_EQ_I(c.bos_id, 1);
  CHECK_EQ_I(c.gen_do_sample, -1);
  sm_config_free(&c);

  /* Mistral-7B-v0.1 style: sliding_window 4096, and a minimal config relying on class defaults */
  const char *v01 = "{\"model_type\": \"mistral\", \"hidden_size\": 4096, \"num_attention_heads\": 32,"
                    " \"num_hidden_layers\": 32, \"sliding_window\": 4096, \"vocab_size\": 32000}";
  CHECK_EQ_I(load("mistral01", v01, NULL, &c), SMELT_OK);
  CHECK_EQ_I(c.sliding_window, 4096);
  CHECK_EQ_I(c.num_key_value_heads, 8);   /* MistralConfig default */
  CHECK_EQ_I(c.intermediate_size, 14336); /* MistralConfig default */
  CHECK_EQ_F(c.rope_theta, 10000.0);
  CHECK_EQ_F(c.rms_norm_eps, 1e-6);
  CHECK_EQ_I(c.eos_ids[0], 2);
  CHECK_EQ_I(c.n_eos, 1);
  sm_config_free(&c);
}

static void test_gemma3(void) {
  /* google/gemma-3-4b-it (multimodal: LM under text_config, most fields left to Gemma3TextConfig defaults),
   * as converted by mlx-vlm with mixed quantization */
  const char *cfg =
    "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"boi_token_index\": 255999,"
    " \"eoi_token_index\": 256000, \"eos_token_id\": [1, 106], \"image_token_index\": 262144,"
    " \"initializer_range\": 0.02, \"mm_tokens_per_image\": 256, \"model_type\": \"gemma3\","
    " \"text_config\": {\"hidden_size\": 2560, \"intermediate_size\": 10240, \"model_type\": \"gemma3_text\","
    " \"num_hidden_layers\": 34, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"},"
    " \"sliding_window\": 1024}, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.50.0.dev0\","
    " \"vision_config\": {\"hidden_size\": 1152, \"image_size\": 896, \"intermediate_size\": 4304,"
    " \"model_type\": \"siglip_vision_model\", \"num_attention_heads\": 16, \"num_hidden_layers\": 27,"
    " \"patch_size\": 14, \"vision_use_head\": false},"
    " \"quantization\": {\"group_size\": 64, \"bits\": 4,"
    "   \"language_model.model.embed_tokens\": {\"group_size\": 32, \"bits\": 6},"
    "   \"language_model.model.layers.0.mlp.down_proj\": {\"group_size\": 64, \"bits\": 8},"
    "   \"vision_tower.vision_model.embeddings.patch_embedding\": false}}";
  const char *gen = "{\"cache_implementation\": \"hybrid\", \"do_sample\": true, \"top_k\": 64, \"top_p\": 0.95,"
                    " \"bos_token_id\": 2, \"eos_token_id\": [1, 106], \"pad_token_id\": 0}";
  sm_config c;
  CHECK_EQ_I(load("gemma3", cfg, gen, &c), SMELT_OK);
  CHECK_STR(c.model_type, "gemma3_text");
  CHECK_EQ_I(c.hidden_size, 2560);
  CHECK_EQ_I(c.intermediate_size, 10240);
  CHECK_EQ_I(c.num_hidden_layers, 34);
  /* Gemma3TextConfig defaults */
  CHECK_EQ_I(c.vocab_size, 262208);
  CHECK_EQ_I(c.num_attention_heads, 8);
  CHECK_EQ_I(c.num_key_value_heads, 4);
  CHECK_EQ_I(c.head_dim, 256);
  CHECK_EQ_I(c.max_position_embeddings, 131072);
  CHECK_EQ_F(c.rope_theta, 1e6);
  CHECK_EQ_F(c.rope_local_theta, 10000.0);
  CHECK_EQ_F(c.query_pre_attn_scalar, 256);
  CHECK_EQ_F(c.rms_norm_eps, 1e-6);
  CHECK_EQ_I(c.sliding_window_pattern, 6);
  CHECK_STR(c.hidden_act, "gelu_pytorch_tanh");
  CHECK(c.tie_word_embeddings);
  /* from the file */
  CHECK_EQ_I(c.sliding_window, 1024);
  CHECK_EQ_I(c.rope_type, SM_ROPE_LINEAR);
  CHECK_EQ_F(c.rope_factor, 8.0);
  CHECK_EQ_I(c.n_eos, 2);
  CHECK(has_eos(&c, 1) && has_eos(&c, 106));
  CHECK_EQ_I(c.bos_id, 2);
  CHECK_EQ_I(c.gen_top_k, 64);
  /* quantization: defaults + per-module overrides, with or without the language_model. prefix */
  CHECK_EQ_I(c.q_bits, 4);
  int b, g;
  sm_config_quant_for(&c, "language_model.model.embed_tokens", &b, &g);
  CHECK(b == 6 && g == 32);
  sm_config_quant_for(&c, "model.embed_tokens", &b, &g);
  CHECK(b == 6 && g == 32);
  sm_config_quant_for(&c, "model.layers.0.mlp.down_proj.weight", &b, &g);
  CHECK(b == 8 && g == 64);
  sm_config_quant_for(&c, "model.layers.1.mlp.down_proj", &b, &g);
  CHECK(b == 4 && g == 64);
  sm_config_quant_for(&c, "vision_tower.vision_model.embeddings.patch_embedding", &b, &g);
  CHECK(b == 0 && g == 0);
  sm_config_free(&c);

  /* google/gemma-3-1b-it (text only, explicit nulls for the softcaps) */
  const char *t1 =
    "{\"architectures\": [\"Gemma3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"attn_logit_softcapping\": null, \"bos_token_id\": 2, \"cache_implementation\": \"hybrid\","
    " \"eos_token_id\": [1, 106], \"final_logit_softcapping\": null, \"head_dim\": 256,"
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 1152, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 6912, \"max_position_embeddings\": 32768, \"model_type\": \"gemma3_text\","
    " \"num_attention_heads\": 4, \"num_hidden_layers\": 26, \"num_key_value_heads\": 1, \"pad_token_id\": 0,"
    " \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06, \"rope_local_base_freq\": 10000,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": 512, \"sliding_window_pattern\": 6,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.50.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 262144}";
  CHECK_EQ_I(load("gemma3_1b", t1, NULL, &c), SMELT_OK);
  CHECK_STR(c.model_type, "gemma3_text");
  CHECK_EQ_I(c.head_dim, 256);
  CHECK_EQ_I(c.num_key_value_heads, 1);
  CHECK_EQ_I(c.sliding_window, 512);
  CHECK_EQ_I(c.vocab_size, 262144);
  CHECK_EQ_F(c.final_logit_softcapping, 0);
  CHECK_EQ_F(c.attn_logit_softcapping, 0);
  CHECK_EQ_I(c.rope_type, SM_ROPE_NONE);
  sm_config_free(&c);
}

static void test_gemma2_phi(void) {
  /* google/gemma-2-2b-it */
  const char *g2 =
    "{\"architectures\": [\"Gemma2ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"attn_logit_softcapping\": 50.0, \"bos_token_id\": 2, \"cache_implementation\": \"hybrid\","
    " \"eos_token_id\": [1, 107], \"final_logit_softcapping\": 30.0, \"head_dim\": 256,"
    " \"hidden_act\": \"gelu_pytorch_tanh\", \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 2304,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 9216, \"max_position_embeddings\": 8192,"
    " \"model_type\": \"gemma2\", \"num_attention_heads\": 8, \"num_hidden_layers\": 26,"
    " \"num_key_value_heads\": 4, \"pad_token_id\": 0, \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06,"
    " \"rope_theta\": 10000.0, \"sliding_window\": 4096, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.42.4\", \"use_cache\": true, \"vocab_size\": 256000}";
  sm_config c;
  CHECK_EQ_I(load("gemma2", g2, NULL, &c), SMELT_OK);
  CHECK_EQ_F(c.final_logit_softcapping, 30.0);
  CHECK_EQ_F(c.attn_logit_softcapping, 50.0);
  CHECK_EQ_F(c.query_pre_attn_scalar, 256);
  CHECK_EQ_I(c.sliding_window, 4096);
  CHECK_EQ_I(c.n_eos, 2);
  CHECK(has_eos(&c, 107));
  sm_config_free(&c);

  /* google/gemma-2b: hidden_act "gelu" is ignored by GemmaMLP (uses hidden_activation, default gelu_pytorch_tanh) */
  const char *g1 =
    "{\"architectures\": [\"GemmaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 2, \"eos_token_id\": 1, \"head_dim\": 256, \"hidden_act\": \"gelu\","
    " \"hidden_activation\": null, \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 16384,"
    " \"max_position_embeddings\": 8192, \"model_type\": \"gemma\", \"num_attention_heads\": 8,"
    " \"num_hidden_layers\": 18, \"num_key_value_heads\": 1, \"pad_token_id\": 0, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": null, \"rope_theta\": 10000.0, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.38.0.dev0\", \"use_cache\": true, \"vocab_size\": 256000}";
  CHECK_EQ_I(load("gemma1", g1, NULL, &c), SMELT_OK);
  CHECK_STR(c.hidden_act, "gelu_pytorch_tanh");
  CHECK_EQ_I(c.head_dim, 256);
  CHECK_EQ_I(c.num_key_value_heads, 1);
  CHECK(c.tie_word_embeddings);
  CHECK_EQ_I(c.sliding_window, 0);
  CHECK_EQ_F(c.final_logit_softcapping, 0);
  CHECK_EQ_I(c.bos_id, 2);
  CHECK_EQ_I(c.eos_ids[0], 1);
  sm_config_free(&c);

  /* microsoft/Phi-4-mini-instruct style: partial rotary + longrope */
  char p4[4096];
  char sf[1024] = "", lf[1024] = "";
  for (int i = 0; i < 48; i++) {
    snprintf(sf + strlen(sf), sizeof sf - strlen(sf), "%s1.0", i ? "," : "");
    snprintf(lf + strlen(lf), sizeof lf - strlen(lf), "%s2.5", i ? "," : "");
  }
  snprintf(p4, sizeof p4,
           "{\"architectures\": [\"Phi3ForCausalLM\"], \"bos_token_id\": 199999, \"eos_token_id\": 199999,"
           " \"hidden_act\": \"silu\", \"hidden_size\": 3072, \"intermediate_size\": 8192,"
           " \"max_position_embeddings\": 131072, \"model_type\": \"phi3\", \"num_attention_heads\": 24,"
           " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"original_max_position_embeddings\": 4096,"
           " \"partial_rotary_factor\": 0.75, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"long_factor\": [%s],"
           " \"short_factor\": [%s], \"type\": \"longrope\"}, \"rope_theta\": 10000.0, \"sliding_window\": 262144,"
           " \"tie_word_embeddings\": true, \"vocab_size\": 200064}",
           lf, sf);
  CHECK_EQ_I(load("phi4mini", p4, "{\"eos_token_id\": [200020, 199999]}", &c), SMELT_OK);
  CHECK_EQ_I(c.head_dim, 128);
  CHECK_EQ_I(c.partial_rotary_dim, 96);
  CHECK_EQ_I(c.rope_type, SM_ROPE_LONGROPE);
  CHECK_EQ_I(c.rope_original_max_pos, 4096);
  CHECK_EQ_I(c.n_eos, 2);
  CHECK(has_eos(&c, 200020) && has_eos(&c, 199999));
  CHECK_EQ_F(c.rms_norm_eps, 1e-5);
  sm_config_free(&c);

  /* yarn (Qwen2.5 long-context recipe) */
  const char *yarn =
    "{\"model_type\": \"qwen2\", \"hidden_size\": 896, \"intermediate_size\": 4864,"
    " \"num_attention_heads\": 14, \"num_key_value_heads\": 2, \"num_hidden_layers\": 24,"
    " \"vocab_size\": 151936, \"max_position_embeddings\": 32768,"
    " \"rope_scaling\": {\"factor\": 4.0, \"original_max_position_embeddings\": 32768, \"type\": \"yarn\"}}";
  CHECK_EQ_I(load("yarn", yarn, NULL, &c), SMELT_OK);
  CHECK_EQ_I(c.rope_type, SM_ROPE_YARN);
  CHECK_EQ_F(c.rope_factor, 4.0);
  CHECK_EQ_F(c.rope_beta_fast, 32.0);
  CHECK_EQ_F(c.rope_beta_slow, 1.0);
  CHECK_EQ_I(c.rope_original_max_pos, 32768);
  CHECK_EQ_I(c.n_eos, 0); /* Qwen2Config has no default eos */
  CHECK_EQ_I(c.bos_id, -1);
  sm_config_free(&c);
}

/* the per-layer lists, multipliers and vision-language packagings of the families added with the
 * generic recipe (values from the published configs of the named models, abridged) */
static void test_layer_kinds(void) {
  sm_config c;
  /* transformers-5 layout (google/gemma-3-270m style): rope_parameters per layer type, layer_types */
  const char *g3 =
    "{\"model_type\": \"gemma3_text\", \"hidden_size\": 640, \"intermediate_size\": 2048, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 256, \"vocab_size\": 262144,"
    " \"max_position_embeddings\": 32768, \"sliding_window\": 512,"
    " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\"],"
    " \"rope_parameters\": {\"full_attention\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"},"
    " \"sliding_attention\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}}";
  CHECK_EQ_I(load("g3v5", g3, NULL, &c), SMELT_OK);
  CHECK(c.has_layer_types && c.layer_sliding[0] && c.layer_sliding[1] && !c.layer_sliding[2] && c.layer_sliding[3]);
  CHECK_EQ_F(c.rope_theta, 1e6);
  CHECK_EQ_F(c.rope_local_theta, 1e4);
  CHECK(c.vlm_type[0] == 0);
  const sm_family *f = sm_family_runnable(c.model_type);
  CHECK(f != NULL);
  sm_layer_spec sp;
  if (f) {
    sm_family_layer_spec(f, &c, 0, &sp);
    CHECK(sp.sliding && sp.window == 512 && sp.rope == 1); /* the local RoPE */
    sm_family_layer_spec(f, &c, 2, &sp);
    CHECK(!sp.sliding && sp.window == 0 && sp.rope == 0);
  }
  sm_config_free(&c);

  /* LGAI-EXAONE/EXAONE-4.0-32B style: a string pattern; the full layers are NoPE */
  const char *ex =
    "{\"model_type\": \"exaone4\", \"hidden_size\": 5120, \"intermediate_size\": 27392,"
    " \"num_hidden_layers\": 8, \"num_attention_heads\": 40, \"num_key_value_heads\": 8, \"head_dim\": 128,"
    " \"vocab_size\": 102400, \"max_position_embeddings\": 131072, \"sliding_window\": 4096,"
    " \"sliding_window_pattern\": \"LLLG\", \"rope_theta\": 1000000.0}";
  CHECK_EQ_I(load("exaone4", ex, NULL, &c), SMELT_OK);
  CHECK(c.has_layer_types && c.layer_sliding[2] && !c.layer_sliding[3] && c.layer_sliding[4] && !c.layer_sliding[7]);
  f = sm_family_runnable("exaone4");
  sm_family_layer_spec(f, &c, 1, &sp);
  CHECK(sp.window == 4096 && sp.rope == 0);
  sm_family_layer_spec(f, &c, 3, &sp);
  CHECK(sp.window == 0 && sp.rope == -1);
  CHECK_EQ_I(c.bos_id, 0); /* Exaone4Config defaults */
  sm_config_free(&c);
  /* EXAONE 4 without a sliding window: every layer rotates */
  const char *ex2 = "{\"model_type\": \"exaone4\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                    " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                    " \"sliding_window\": null, \"layer_types\": [\"full_attention\", \"full_attention\","
                    " \"full_attention\", \"full_attention\"]}";
  CHECK_EQ_I(load("exaone4b", ex2, NULL, &c), SMELT_OK);
  sm_family_layer_spec(f, &c, 3, &sp);
  CHECK(sp.window == 0 && sp.rope == 0);
  sm_config_free(&c);

  /* HuggingFaceTB/SmolLM3-3B: no_rope_layers (1 = RoPE) */
  const char *sm3 = "{\"model_type\": \"smollm3\", \"hidden_size\": 2048, \"intermediate_size\": 11008,"
                    " \"num_hidden_layers\": 4, \"num_attention_heads\": 16, \"num_key_value_heads\": 4,"
                    " \"vocab_size\": 128256, \"max_position_embeddings\": 65536, \"rope_theta\": 5000000.0,"
                    " \"no_rope_layers\": [1, 1, 1, 0], \"use_sliding_window\": false, \"sliding_window\": null}";
  CHECK_EQ_I(load("smollm3", sm3, NULL, &c), SMELT_OK);
  f = sm_family_runnable("smollm3");
  CHECK(c.has_no_rope_layers && c.layer_rope[0] == 1 && c.layer_rope[3] == 0);
  sm_family_layer_spec(f, &c, 3, &sp);
  CHECK(sp.rope == -1 && sp.window == 0);
  sm_family_layer_spec(f, &c, 2, &sp);
  CHECK(sp.rope == 0);
  sm_config_free(&c);
  /* without the list: every 4th layer is NoPE (SmolLM3Config no_rope_layer_interval) */
  const char *sm3b = "{\"model_type\": \"smollm3\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                     " \"num_hidden_layers\": 8, \"num_attention_heads\": 4, \"vocab_size\": 100}";
  CHECK_EQ_I(load("smollm3b", sm3b, NULL, &c), SMELT_OK);
  sm_family_layer_spec(f, &c, 7, &sp);
  CHECK(sp.rope == -1);
  sm_family_layer_spec(f, &c, 6, &sp);
  CHECK(sp.rope == 0);
  sm_config_free(&c);

  /* ibm-granite/granite-3.3-2b-instruct: multipliers */
  const char *gr = "{\"model_type\": \"granite\", \"hidden_size\": 2048, \"intermediate_size\": 8192,"
                   " \"num_hidden_layers\": 40, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
                   " \"vocab_size\": 49159, \"attention_multiplier\": 0.015625, \"embedding_multiplier\": 12.0,"
                   " \"residual_multiplier\": 0.22, \"logits_scaling\": 8.0, \"tie_word_embeddings\": true}";
  CHECK_EQ_I(load("granite", gr, NULL, &c), SMELT_OK);
  CHECK_EQ_F(c.attention_multiplier, 0.015625);
  CHECK_EQ_F(c.embedding_multiplier, 12.0);
  CHECK_EQ_F(c.residual_multiplier, 0.22);
  CHECK_EQ_F(c.logits_scaling, 8.0);
  CHECK_EQ_F(c.logit_scale, 1.0);
  sm_config_free(&c);

  /* CohereLabs/c4ai-command-r7b-12-2024: layer_norm_eps, logit_scale, pattern 4 */
  const char *co = "{\"model_type\": \"cohere2\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
                   " \"num_hidden_layers\": 8, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
                   " \"vocab_size\": 256000, \"layer_norm_eps\": 1e-05, \"logit_scale\": 0.25,"
                   " \"sliding_window\": 4096, \"sliding_window_pattern\": 4, \"rope_theta\": 50000.0}";
  CHECK_EQ_I(load("cohere2", co, NULL, &c), SMELT_OK);
  CHECK_EQ_F(c.logit_scale, 0.25);
  CHECK_EQ_F(c.rms_norm_eps, 1e-5);
  CHECK(c.tie_word_embeddings);
  f = sm_family_runnable("cohere2");
  sm_family_layer_spec(f, &c, 2, &sp);
  CHECK(sp.window == 4096 && sp.rope == 0);
  sm_family_layer_spec(f, &c, 3, &sp);
  CHECK(sp.window == 0 && sp.rope == -1); /* global layers: NoPE */
  sm_config_free(&c);
  const char *co2 = "{\"model_type\": \"cohere2\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}";
  CHECK_EQ_I(load("cohere2b", co2, NULL, &c), SMELT_OK);
  CHECK_EQ_F(c.logit_scale, 0.0625); /* Cohere2Config default */
  sm_config_free(&c);

  /* Qwen2 with use_sliding_window: the layers from max_window_layers on slide (Qwen2Config.layer_types) */
  const char *qsw =
    "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 100, \"use_sliding_window\": true, \"sliding_window\": 32, \"max_window_layers\": 2}";
  CHECK_EQ_I(load("qwen2sw", qsw, NULL, &c), SMELT_OK);
  f = sm_family_runnable("qwen2");
  sm_family_layer_spec(f, &c, 1, &sp);
  CHECK(sp.window == 0);
  sm_family_layer_spec(f, &c, 2, &sp);
  CHECK(sp.window == 32 && sp.rope == 0);
  sm_config_free(&c);

  /* THUDM/GLM-4-9B-0414: partial_rotary_factor 0.5 by default, q/k/v biases */
  const char *glm = "{\"model_type\": \"glm4\", \"hidden_size\": 4096, \"intermediate_size\": 13696,"
                    " \"num_hidden_layers\": 40, \"num_attention_heads\": 32, \"num_key_value_heads\": 2,"
                    " \"head_dim\": 128, \"vocab_size\": 151552, \"attention_bias\": true, \"rms_norm_eps\": 1e-05}";
  CHECK_EQ_I(load("glm4", glm, NULL, &c), SMELT_OK);
  CHECK_EQ_I(c.partial_rotary_dim, 64);
  CHECK(c.attention_bias);
  sm_config_free(&c);
}

static void test_vlm_and_rope(void) {
  sm_config c;
  /* Qwen2.5-VL: the LM's fields at the top level next to vision_config */
  const char *q25 = "{\"model_type\": \"qwen2_5_vl\", \"hidden_size\": 2048, \"intermediate_size\": 11008,"
                    " \"num_hidden_layers\": 36, \"num_attention_heads\": 16, \"num_key_value_heads\": 2,"
                    " \"vocab_size\": 151936, \"max_position_embeddings\": 128000, \"rope_theta\": 1000000.0,"
                    " \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [16, 24, 24]},"
                    " \"vision_config\": {\"depth\": 32, \"hidden_size\": 1280}, \"tie_word_embeddings\": true}";
  CHECK_EQ_I(load("q25vl", q25, NULL, &c), SMELT_OK);
  CHECK_STR(c.model_type, "qwen2_5_vl_text");
  CHECK_STR(c.vlm_type, "qwen2_5_vl");
  CHECK_EQ_I(c.rope_type, SM_ROPE_NONE);
  CHECK(c.attention_bias);
  sm_config_free(&c);
  /* Mistral-Small-3.1: text_config names the LM (mistral) */
  const char *m3 =
    "{\"model_type\": \"mistral3\", \"text_config\": {\"model_type\": \"mistral\","
    " \"hidden_size\": 5120, \"intermediate_size\": 32768, \"num_hidden_layers\": 40,"
    " \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"head_dim\": 128, \"vocab_size\": 131072,"
    " \"rope_theta\": 1000000000.0, \"sliding_window\": null}, \"vision_config\": {\"hidden_size\": 1024}}";
  CHECK_EQ_I(load("mistral3", m3, NULL, &c), SMELT_OK);
  CHECK_STR(c.model_type, "mistral");
  CHECK_STR(c.vlm_type, "mistral3");
  CHECK_EQ_I(c.sliding_window, 0);
  sm_config_free(&c);
  /* text_config without a model_type: the packaging's text type */
  const char *m3b = "{\"model_type\": \"mistral3\", \"text_config\": {\"hidden_size\": 64, \"intermediate_size\": 128,"
                    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                    " \"vocab_size\": 100}}";
  CHECK_EQ_I(load("mistral3b", m3b, NULL, &c), SMELT_OK);
  CHECK_STR(c.model_type, "mistral");
  CHECK_STR(c.vlm_type, "mistral3");
  sm_config_free(&c);
  /* mistralai/Ministral-3-3B-Instruct-2512: yarn with mscale, the Llama-4 query scaling */
  const char *mi = "{\"model_type\": \"ministral3\", \"hidden_size\": 3072, \"intermediate_size\": 9216,"
                   " \"num_hidden_layers\": 26, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
                   " \"head_dim\": 128, \"vocab_size\": 131072, \"max_position_embeddings\": 262144,"
                   " \"rope_parameters\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"factor\": 16.0,"
                   " \"llama_4_scaling_beta\": 0.1, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
                   " \"original_max_position_embeddings\": 16384, \"rope_theta\": 1000000.0, \"rope_type\": \"yarn\","
                   " \"truncate\": false}}";
  CHECK_EQ_I(load("ministral3", mi, NULL, &c), SMELT_OK);
  CHECK_EQ_I(c.rope_type, SM_ROPE_YARN);
  CHECK_EQ_F(c.rope_mscale, 1.0);
  CHECK_EQ_F(c.rope_mscale_all_dim, 1.0);
  CHECK(!c.rope_truncate);
  CHECK_EQ_F(c.rope_llama4_beta, 0.1);
  CHECK_EQ_I(c.rope_original_max_pos, 16384);
  CHECK_EQ_F(c.rope_theta, 1e6);
  sm_config_free(&c);
  /* Phi-3: the top-level original_max_position_embeddings (class default 4096) is the one used */
  const char *phi = "{\"model_type\": \"phi3\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                    " \"max_position_embeddings\": 131072, \"rope_scaling\": {\"type\": \"longrope\","
                    " \"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], \"long_factor\": [2, 2, 2, 2, 2, 2, 2, 2],"
                    " \"original_max_position_embeddings\": 8192}}";
  CHECK_EQ_I(load("phi3d", phi, NULL, &c), SMELT_OK);
  CHECK_EQ_I(c.rope_original_max_pos, 4096);
  sm_config_free(&c);
  /* a Gemma 4 checkpoint: its text model runs */
  const char *g4 =
    "{\"model_type\": \"gemma4\", \"text_config\": {\"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}, \"vision_config\": {}}";
  CHECK_EQ_I(load("gemma4", g4, NULL, &c), SMELT_OK);
  CHECK_STR(c.model_type, "gemma4_text");
  CHECK(sm_family_runnable("gemma4_text") != NULL && c.ple_dim == 256 && c.ple_vocab == 262144);
  sm_config_free(&c);
}

static void test_parse_buffer(void) {
  /* buffer API, not NUL-terminated */
  const char *cfg = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,\"num_hidden_layers\":2,"
                    "\"intermediate_size\":128,\"vocab_size\":100,\"eos_token_id\":7}XXXX";
  sm_config c;
  CHECK_EQ_I(sm_config_parse(cfg, strlen(cfg) - 4, NULL, 0, sm_family_defaults, &c), SMELT_OK);
  CHECK_EQ_I(c.head_dim, 16);
  CHECK_EQ_I(c.num_key_value_heads, 4);
  CHECK_EQ_I(c.eos_ids[0], 7);
  CHECK_EQ_I(c.bos_id, 1); /* LlamaConfig default */
  CHECK_EQ_I(c.max_position_embeddings, 2048);
  CHECK(!c.tie_word_embeddings);
  sm_config_free(&c);
  sm_config_free(&c); /* idempotent */
}

/* configs that must be rejected; message must mention `needle` */
static void expect_bad(const char *cfg, const char *gen, smelt_status want, const char *needle, int line) {
  sm_config c;
  smelt_status rc = sm_config_parse(cfg, strlen(cfg), gen, gen ? strlen(gen) : 0, sm_family_defaults, &c);
  g_checks++;
  if (rc == SMELT_OK || rc != want || (needle && !strstr(sm_errmsg(), needle)) || c.json != NULL) {
    g_fail++;
    fprintf(stderr, "line %d: expected error %d mentioning '%s', got %d: %s\n", line, want, needle ? needle : "", rc,
            sm_errmsg());
  }
  if (rc == SMELT_OK) sm_config_free(&c);
}
#define BAD(cfg, gen, want, needle) expect_bad(cfg, gen, want, needle, __LINE__)
#define BASE "\"model_type\":\"llama\",\"num_hidden_layers\":2,\"intermediate_size\":128,\"vocab_size\":100"

static void test_errors(void) {
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4", NULL, SMELT_ERR_FORMAT, "JSON");
  BAD("[1,2]", NULL, SMELT_ERR_FORMAT, "object");
  BAD("{\"hidden_size\":64}", NULL, SMELT_ERR_FORMAT, "model_type");
  BAD("{" BASE ",\"hidden_size\":0,\"num_attention_heads\":4}", NULL, SMELT_ERR_FORMAT, "hidden_size");
  BAD("{" BASE ",\"hidden_size\":-64,\"num_attention_heads\":4}", NULL, SMELT_ERR_FORMAT, "hidden_size");
  BAD("{" BASE ",\"hidden_size\":64.5,\"num_attention_heads\":4}", NULL, SMELT_ERR_FORMAT, "hidden_size");
  BAD("{" BASE ",\"hidden_size\":\"64\",\"num_attention_heads\":4}", NULL, SMELT_ERR_FORMAT, "hidden_size");
  BAD("{" BASE ",\"hidden_size\":1e12,\"num_attention_heads\":4}", NULL, SMELT_ERR_FORMAT, "hidden_size");
  BAD("{" BASE ",\"hidden_size\":10000000,\"num_attention_heads\":4}", NULL, SMELT_ERR_FORMAT, "hidden_size");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":6}", NULL, SMELT_ERR_FORMAT, "multiple");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":3}", NULL, SMELT_ERR_FORMAT,
      "num_key_value_heads");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":8}", NULL, SMELT_ERR_FORMAT,
      "num_key_value_heads");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":0}", NULL, SMELT_ERR_FORMAT, "num_attention_heads");
  BAD("{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"intermediate_size\":128,\"vocab_size\":1000000000,"
      "\"hidden_size\":64,\"num_attention_heads\":4}",
      NULL, SMELT_ERR_FORMAT, "vocab_size");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"head_dim\":100000}", NULL, SMELT_ERR_FORMAT,
      "head_dim");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"rms_norm_eps\":-1}", NULL, SMELT_ERR_FORMAT,
      "rms_norm_eps");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"rope_theta\":0}", NULL, SMELT_ERR_FORMAT, "rope_theta");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"partial_rotary_factor\":1.5}", NULL, SMELT_ERR_FORMAT,
      "partial_rotary_factor");
  BAD("{" BASE
      ",\"hidden_size\":64,\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}",
      NULL, SMELT_ERR_FORMAT, "low_freq_factor");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"linear\"}}", NULL,
      SMELT_ERR_FORMAT, "factor");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"weird\",\"factor\":2}}",
      NULL, SMELT_ERR_UNSUPPORTED, "weird");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"eos_token_id\":\"</s>\"}", NULL, SMELT_ERR_FORMAT,
      "eos_token_id");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"eos_token_id\":[1,-2]}", NULL, SMELT_ERR_FORMAT,
      "eos_token_id");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"quantization\":{\"bits\":7,\"group_size\":64}}", NULL,
      SMELT_ERR_UNSUPPORTED, "bits");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"quantization\":{\"bits\":4,\"group_size\":48}}", NULL,
      SMELT_ERR_UNSUPPORTED, "group_size");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"quantization\":{\"bits\":4,\"group_size\":64,"
      "\"model.layers.0.mlp.up_proj\":{\"bits\":9}}}",
      NULL, SMELT_ERR_UNSUPPORTED, "model.layers.0.mlp.up_proj");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"quantization_config\":{\"quant_method\":\"gptq\","
      "\"bits\":4,\"group_size\":128}}",
      NULL, SMELT_ERR_UNSUPPORTED, "gptq");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"quantization\":4}", NULL, SMELT_ERR_FORMAT,
      "quantization");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"tie_word_embeddings\":\"yes\"}", NULL, SMELT_ERR_FORMAT,
      "tie_word_embeddings");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"text_config\":7}", NULL, SMELT_ERR_FORMAT,
      "text_config");
  /* unknown family: sizes are required */
  BAD("{\"model_type\":\"newfamily\",\"hidden_size\":64,\"num_attention_heads\":4,\"num_hidden_layers\":2,"
      "\"vocab_size\":100}",
      NULL, SMELT_ERR_FORMAT, "intermediate_size");
  /* generation config */
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4}", "{\"temperature\":", SMELT_ERR_FORMAT,
      "generation_config");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4}", "{\"top_p\":7}", SMELT_ERR_FORMAT,
      "generation_config");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4}",
      "{\"eos_token_id\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", SMELT_ERR_LIMIT, "eos");

  /* per-layer lists, multipliers, RoPE parameters */
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"layer_types\":[\"full_attention\"]}", NULL,
      SMELT_ERR_FORMAT, "layer_types");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"layer_types\":[\"full_attention\","
      "\"chunked_attention\"]}",
      NULL, SMELT_ERR_UNSUPPORTED, "chunked_attention");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"sliding_window_pattern\":\"LXG\"}", NULL,
      SMELT_ERR_FORMAT, "sliding_window_pattern");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"no_rope_layers\":[1,2]}", NULL, SMELT_ERR_FORMAT,
      "no_rope_layers");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"no_rope_layers\":[1]}", NULL, SMELT_ERR_FORMAT,
      "no_rope_layers");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"use_bidirectional_attention\":true}", NULL,
      SMELT_ERR_UNSUPPORTED, "bidirectional");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"residual_multiplier\":0}", NULL, SMELT_ERR_FORMAT,
      "residual_multiplier");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"blockwise\","
      "\"factor\":1}}",
      NULL, SMELT_ERR_UNSUPPORTED, "blockwise");
  BAD("{" BASE ",\"hidden_size\":64,\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"yarn\","
      "\"factor\":4,\"beta_fast\":0}}",
      NULL, SMELT_ERR_FORMAT, "beta_fast");
  BAD("{\"model_type\":\"gemma3_text\",\"num_hidden_layers\":2,\"intermediate_size\":128,\"vocab_size\":100,"
      "\"hidden_size\":64,\"num_attention_heads\":4,\"rope_parameters\":{\"full_attention\":{\"rope_type\":"
      "\"default\"},\"sliding_attention\":{\"rope_type\":\"linear\",\"factor\":2}}}",
      NULL, SMELT_ERR_UNSUPPORTED, "sliding_attention");

  /* missing directory / file */
  sm_config c;
  CHECK(sm_family_config_load("/nonexistent/smelt/model", &c) == SMELT_ERR_IO);
  CHECK(strstr(sm_errmsg(), "config.json") != NULL);
  /* sm_config_load error names the directory */
  char d[512];
  snprintf(d, sizeof d, "%s/badcfg", g_tmp);
  mkdir(d, 0755);
  write_file(d, "config.json", "{\"model_type\":\"llama\",\"hidden_size\":-1}");
  CHECK(sm_family_config_load(d, &c) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "badcfg") &&
        strstr(sm_errmsg(), "hidden_size"));
}

/* Gemma 4: a text_config shaped like the E2B model's as transformers 5 writes it (gemma4 packaging), the layer
 * shapes it gives, and the Gemma4TextConfig defaults when fields are left out */
static void test_gemma4(void) {
  sm_config c;
  const char *g4 =
    "{\"model_type\": \"gemma4\", \"vision_config\": {\"hidden_size\": 768}, \"text_config\": {"
    " \"model_type\": \"gemma4_text\", \"hidden_size\": 1536, \"intermediate_size\": 6144, \"num_hidden_layers\": 10,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 1, \"head_dim\": 256, \"global_head_dim\": 512,"
    " \"vocab_size\": 262144, \"vocab_size_per_layer_input\": 262144, \"hidden_size_per_layer_input\": 256,"
    " \"num_kv_shared_layers\": 4, \"use_double_wide_mlp\": true, \"attention_k_eq_v\": false,"
    " \"num_global_key_value_heads\": null, \"final_logit_softcapping\": 30.0, \"sliding_window\": 512,"
    " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
    " \"full_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
    " \"full_attention\"], \"rope_parameters\": {\"full_attention\": {\"partial_rotary_factor\": 0.25,"
    " \"rope_theta\": 1000000.0, \"rope_type\": \"proportional\"}, \"sliding_attention\": {\"rope_theta\": 10000.0,"
    " \"rope_type\": \"default\"}}, \"enable_moe_block\": false}}";
  CHECK_EQ_I(load("g4", g4, NULL, &c), SMELT_OK);
  CHECK(!strcmp(c.model_type, "gemma4_text") && !strcmp(c.vlm_type, "gemma4"));
  CHECK_EQ_I(c.rope_type, SM_ROPE_PROPORTIONAL);
  CHECK_EQ_F(c.rope_partial_factor, 0.25);
  CHECK_EQ_I(c.partial_rotary_dim, 256); /* the whole head; the proportion zeroes frequencies */
  CHECK_EQ_F(c.rope_theta, 1e6);
  CHECK_EQ_F(c.rope_local_theta, 1e4);
  CHECK_EQ_F(c.final_logit_softcapping, 30.0);
  CHECK(c.global_head_dim == 512 && c.ple_dim == 256 && c.ple_vocab == 262144 && c.kv_shared_layers == 4);
  const sm_family *f = sm_family_runnable(c.model_type);
  CHECK(f != NULL && sm_family_type_runnable("gemma4"));
  if (f) {
    CHECK(sm_family_varied_layers(f, &c));
    sm_layer_spec sp;
    sm_family_layer_spec(f, &c, 0, &sp);
    CHECK(sp.sliding && sp.window == 512 && sp.rope == 1 && sp.head_dim == 256 && sp.kv_heads == 1 && sp.kv_src == 0 &&
          sp.ffn_dim == 6144);
    sm_family_layer_spec(f, &c, 4, &sp);
    CHECK(!sp.sliding && sp.rope == 0 && sp.head_dim == 512 && sp.kv_src == 4 && !sp.k_eq_v);
    sm_family_layer_spec(f, &c, 6, &sp); /* shared: the last sliding layer before layer 6 */
    CHECK(sp.sliding && sp.kv_src == 5 && sp.ffn_dim == 12288);
    sm_family_layer_spec(f, &c, 9, &sp); /* shared: the full layer 4 */
    CHECK(sp.head_dim == 512 && sp.kv_src == 4 && sp.ffn_dim == 12288);
    CHECK(!sm_family_slot_used(f, &c, 9, SM_T_K) && !sm_family_slot_used(f, &c, 9, SM_T_V) &&
          sm_family_slot_used(f, &c, 9, SM_T_Q) && sm_family_slot_used(f, &c, 9, SM_T_PLE_GATE) &&
          sm_family_slot_used(f, &c, 5, SM_T_K) && sm_family_slot_used(f, &c, 0, SM_T_LAYER_SCALAR));
    int64_t rows, cols;
    sm_family_slot_shape(f, &c, 4, SM_T_Q, &rows, &cols);
    CHECK(rows == 8 * 512 && cols == 1536);
    sm_family_slot_shape(f, &c, 9, SM_T_GATE, &rows, &cols);
    CHECK(rows == 12288 && cols == 1536);
    sm_family_slot_shape(f, &c, 3, SM_T_PLE_PROJ, &rows, &cols);
    CHECK(rows == 1536 && cols == 256);
  }
  sm_config_free(&c);

  /* the 31B's kind: keys as values on full layers, with their own KV heads; per_layer_config (newer
   * transformers) overriding a layer */
  const char *kv =
    "{\"model_type\": \"gemma4_text\", \"hidden_size\": 512, \"intermediate_size\": 1024, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 64, \"global_head_dim\": 128,"
    " \"attention_k_eq_v\": true, \"num_global_key_value_heads\": 2, \"hidden_size_per_layer_input\": 0,"
    " \"vocab_size\": 1000, \"sliding_window_pattern\": 2,"
    " \"per_layer_config\": {\"3\": {\"head_dim\": 96, \"num_key_value_heads\": 1}}}";
  CHECK_EQ_I(load("g4kv", kv, NULL, &c), SMELT_OK);
  CHECK(c.ple_dim == 0 && c.kv_shared_layers == 0 && c.attn_k_eq_v && c.global_kv_heads == 2);
  CHECK_EQ_I(c.rope_type, SM_ROPE_PROPORTIONAL); /* Gemma4TextConfig's default rope_parameters */
  CHECK_EQ_F(c.rope_partial_factor, 0.25);
  CHECK(c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2] && !c.layer_sliding[3]);
  f = sm_family_runnable("gemma4_text");
  if (f) {
    sm_layer_spec sp;
    sm_family_layer_spec(f, &c, 1, &sp);
    CHECK(sp.head_dim == 128 && sp.kv_heads == 2 && sp.k_eq_v && !sm_family_slot_used(f, &c, 1, SM_T_V));
    sm_family_layer_spec(f, &c, 2, &sp);
    CHECK(sp.head_dim == 64 && sp.kv_heads == 4 && !sp.k_eq_v && sm_family_slot_used(f, &c, 2, SM_T_V));
    sm_family_layer_spec(f, &c, 3, &sp);
    CHECK(sp.head_dim == 96 && sp.kv_heads == 1 && sp.k_eq_v);
    CHECK(!sm_family_slot_used(f, &c, 0, SM_T_PLE_GATE));
  }
  sm_config_free(&c);

  /* Gemma4TextConfig defaults: 30 layers, every 6th full and the last one full whatever the pattern says */
  const char *d = "{\"model_type\": \"gemma4_text\", \"num_hidden_layers\": 7, \"sliding_window_pattern\": 3}";
  CHECK_EQ_I(load("g4def", d, NULL, &c), SMELT_OK);
  CHECK(c.hidden_size == 2304 && c.global_head_dim == 512 && c.ple_dim == 256 && c.num_key_value_heads == 4);
  CHECK(c.layer_sliding[0] && !c.layer_sliding[2] && c.layer_sliding[4] && !c.layer_sliding[5] && !c.layer_sliding[6]);
  CHECK_EQ_F(c.final_logit_softcapping, 0.0);
  sm_config_free(&c);

  /* the 26B-A4B's kind: experts on every layer, beside the MLP; only with enable_moe_block */
  const char *moe = "{\"model_type\": \"gemma4_text\", \"num_hidden_layers\": 4, \"enable_moe_block\": true,"
                    " \"num_experts\": 128, \"top_k_experts\": 8, \"moe_intermediate_size\": 704}";
  CHECK_EQ_I(load("g4moe", moe, NULL, &c), SMELT_OK);
  CHECK(c.moe.n_experts == 128 && c.moe.top_k == 8 && c.moe.expert_inter == 704 && c.moe.norm_topk);
  CHECK(c.moe.moe_layer[0] && c.moe.moe_layer[3]);
  f = sm_family_runnable("gemma4_text");
  CHECK(f && sm_family_slot_used(f, &c, 2, SM_T_MOE_NORM) && sm_family_slot_used(f, &c, 2, SM_T_GATE));
  sm_config_free(&c);
  const char *off = "{\"model_type\": \"gemma4_text\", \"num_hidden_layers\": 4, \"enable_moe_block\": false,"
                    " \"num_experts\": 128, \"top_k_experts\": 8}";
  CHECK_EQ_I(load("g4moeoff", off, NULL, &c), SMELT_OK);
  CHECK(c.moe.n_experts == 0 && !c.moe.moe_layer[0]);
  CHECK(f && !sm_family_slot_used(f, &c, 2, SM_T_MOE_NORM));
  sm_config_free(&c);

  /* what smelt refuses, by name */
  const char *bad[] = {
    "{\"model_type\": \"gemma4_text\", \"enable_moe_block\": true, \"num_experts\": 8}",
    "{\"model_type\": \"gemma4_text\", \"use_bidirectional_attention\": \"all\"}",
    "{\"model_type\": \"gemma4_text\", \"num_hidden_layers\": 4, \"num_kv_shared_layers\": 4}",
    "{\"model_type\": \"gemma4_text\", \"attention_k_eq_v\": true, \"num_global_key_value_heads\": 3}",
    "{\"model_type\": \"gemma4_text\", \"global_head_dim\": 511}",
    "{\"model_type\": \"gemma4_text\", \"per_layer_config\": {\"99\": {\"head_dim\": 64}}}",
    "{\"model_type\": \"gemma4_text\", \"hidden_size_per_layer_input\": 8, \"vocab_size_per_layer_input\": 0}",
  };
  for (size_t i = 0; i < SM_ARRAY_LEN(bad); i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "g4bad%zu", i);
    CHECK(load(nm, bad[i], NULL, &c) != SMELT_OK);
  }
}

int main(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/smelt_cfg_test_XXXXXX");
  if (!mkdtemp(g_tmp)) {
    perror("mkdtemp");
    return 2;
  }
  test_llama3();
  test_qwen2();
  test_qwen3();
  test_mistral();
  test_gemma3();
  test_gemma2_phi();
  test_layer_kinds();
  test_vlm_and_rope();
  test_gemma4();
  test_parse_buffer();
  test_errors();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
  return TEST_DONE();
}
