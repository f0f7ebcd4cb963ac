/* Tensor parallelism (src/model/tp.c, tp_shard.c): a model split over 2 and 4 ranks gives the logits of the
 * whole model: a prefill's every row (the gathered vocabulary split, put back in row order) and decode steps
 * of two sequences together through the engine. Shapes cover a quantized Llama, a bf16 Qwen2 with q/k/v
 * biases, tied embeddings, one KV head for two ranks (replicated K/V) and a vocabulary 4 ranks do not split
 * (the LM head whole on rank 0), and mixtures of experts (each expert's columns split): Qwen3-MoE 4-bit,
 * Qwen2-MoE with its gated shared expert, gpt-oss with sinks and expert biases, DeepSeek-V3 with its latent
 * attention; hybrid Qwen3.5 and Qwen3-Next (Gated DeltaNet, gated attention), Nemotron-H (Mamba-2) and LFM2
 * (short convolution), whose state slots a rewind copies on every rank. Unsplittable models fail with
 * an error that says why.
 * `test_tp SOURCE_DIR` runs the ranks on the CPU (the shared-memory collectives); `test_tp cuda SOURCE_DIR` on
 * GPUs 0..3 through NCCL, skipped where there are fewer than two GPUs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "engine/engine.h"
#include "model/model.h"
#include "model/tp.h"
#include "../test_util.h"

#define NT 24
#define NDEC 8
#define NROWS (NT + 2 * NDEC + 2) /* prefill rows, decode steps of two sequences, a step again after a rewind */

static smelt_device dev = SMELT_DEVICE_CPU;
static bool g_pp;             /* split by layers (pipeline parallelism) instead of by heads and columns */
static const float *g_shares; /* (g_pp) the stages' shares of the layers */

static smelt_model *load(const char *dir, int tp) {
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = dev;
  mp.n_threads = 1;
  mp.max_context = 64;
  mp.max_seqs = 2;
  mp.kv_type = SMELT_KV_F32;
  if (g_pp && tp > 1) mp.pipeline_parallel = tp;
  else mp.tensor_parallel = tp;
  mp.pp_shares = g_shares;
  smelt_model *m = NULL;
  CHECK(smelt_model_load(dir, &mp, &m) == SMELT_OK, "%s: load with %d ranks: %s", dir, tp, smelt_last_error());
  return m;
}

/* prefill logits of every row, then NDEC decode steps of two sequences together (tokens fixed, the
 * same for every split): out = [NT rows][vocab] then [NDEC][2][vocab] */
static float *run(smelt_model *m, const int32_t *tok, int vocab) {
  float *out = calloc((size_t)NROWS * vocab, sizeof(float)), *lg = NULL;
  CHECK(smelt_eval_logits(m, tok, NT, &lg) == SMELT_OK, "eval: %s", smelt_last_error());
  if (lg) memcpy(out, lg, sizeof(float) * NT * vocab);
  free(lg);
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = 64;
  ep.max_seqs = 2;
  ep.block_size = 8;
  sm_engine *en = NULL;
  CHECK(sm_engine_create(m, &ep, &en) == SMELT_OK, "engine: %s", smelt_last_error());
  if (!en) return out;
  sm_seq *s[2] = {sm_seq_new(en), sm_seq_new(en)};
  sm_seq_append(en, s[0], tok, NT / 2);
  sm_seq_append(en, s[1], tok + 3, NT / 3);
  float *step = malloc(sizeof(float) * 2 * vocab);
  for (int k = 0; k < NDEC; k++) {
    uint8_t done[2] = {0, 0};
    while (!done[0] || !done[1])
      CHECK(sm_engine_step(en, s, 2, step, done) == SMELT_OK, "step: %s", smelt_last_error());
    memcpy(out + (size_t)(NT + 2 * k) * vocab, step, sizeof(float) * 2 * vocab);
    const int32_t next[2] = {(int32_t)((k * 31 + 5) % vocab), (int32_t)((k * 17 + 2) % vocab)};
    sm_seq_append(en, s[0], &next[0], 1);
    sm_seq_append(en, s[1], &next[1], 1);
  }
  /* a checkpoint, a step, then back to it and another step (hybrid models: their state slot copied back) */
  sm_seq_checkpoint(en, s[0]);
  const int len = sm_seq_len(s[0]);
  for (int k = 0; k < 2; k++) {
    if (k) CHECK(sm_seq_truncate(en, s[0], len) == SMELT_OK, "truncate: %s", smelt_last_error());
    const int32_t t = (int32_t)(k * 7 + 3);
    sm_seq_append(en, s[0], &t, 1);
    uint8_t done = 0;
    while (!done) CHECK(sm_engine_step(en, s, 1, step, &done) == SMELT_OK, "step: %s", smelt_last_error());
    memcpy(out + (size_t)(NT + 2 * NDEC + k) * vocab, step, sizeof(float) * vocab);
  }
  free(step);
  sm_seq_free(en, s[0]);
  sm_seq_free(en, s[1]);
  sm_engine_free(en);
  return out;
}

static void compare(const char *dir, int tp, double tol) {
  smelt_model *m = load(dir, 1);
  if (!m) return;
  const int vocab = smelt_model_vocab_size(m);
  int32_t tok[NT];
  for (int i = 0; i < NT; i++) tok[i] = (int32_t)((i * 53 + 7) % vocab);
  float *ref = run(m, tok, vocab);
  smelt_model_free(m);
  m = load(dir, tp);
  if (m) {
    smelt_model_info info;
    smelt_model_get_info(m, &info);
    CHECK(info.tensor_parallel == (g_pp ? 1 : tp) && info.pipeline_parallel == (g_pp ? tp : 1),
          "info: %d ranks of heads, %d stages", info.tensor_parallel, info.pipeline_parallel);
    float *got = run(m, tok, vocab);
    const size_t np = (size_t)NT * vocab, nd = (size_t)(NROWS - NT) * vocab;
    const double ep = t_max_rel(got, ref, np, 1e-3), ed = t_max_rel(got + np, ref + np, nd, 1e-3);
    printf("%s, %d %s: prefill logits off by %.2e, decode %.2e (relative)\n", dir, tp, g_pp ? "stages" : "ranks", ep,
           ed);
    CHECK(ep <= tol, "%s, %d ranks: prefill logits differ by %.3g", dir, tp, ep);
    CHECK(ed <= tol, "%s, %d ranks: decode logits differ by %.3g", dir, tp, ed);
    free(got);
    smelt_model_free(m);
  }
  free(ref);
}

/* the stages' first layers for layers, n stages and shares, against want (n + 1 values) */
static void plan(int layers, int n, const float *shares, const int *want) {
  int first[SM_TP_MAX + 1] = {0};
  CHECK(sm_pp_plan(layers, n, shares, first) == SMELT_OK, "plan of %d layers in %d: %s", layers, n, smelt_last_error());
  for (int s = 0; s <= n; s++)
    CHECK(first[s] == want[s], "plan of %d layers in %d stages: stage %d starts at %d, not %d", layers, n, s, first[s],
          want[s]);
}

static void refused(const char *dir, int tp, const char *want) {
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = dev;
  mp.n_threads = 1;
  if (g_pp) mp.pipeline_parallel = tp;
  else mp.tensor_parallel = tp;
  mp.pp_shares = g_shares;
  smelt_model *m = NULL;
  smelt_status st = smelt_model_load(dir, &mp, &m);
  CHECK(st != SMELT_OK && strstr(smelt_last_error(), want), "%s over %d ranks: %s (wanted an error with '%s')", dir, tp,
        st ? smelt_last_error() : "loaded", want);
  smelt_model_free(m);
  int ws;
  CHECK(waitpid(-1, &ws, WNOHANG) < 0, "a rank's process is left over after a refused load");
}

int main(int argc, char **argv) {
  const int rank = smelt_tp_rank_main(argc, argv); /* the ranks after a CUDA model was loaded here */
  if (rank >= 0) return rank;
  int max_tp = 4;
  double tol = 1e-4, tol_q = 1e-4;
  const char *src = argc > 1 ? argv[argc - 1] : ".";
  if (argc > 2 && !strcmp(argv[1], "cuda")) {
#ifndef SMELT_HAVE_CUDA
    printf("SKIP: built without CUDA\n");
    return 0;
#endif
    dev = SMELT_DEVICE_CUDA;
    const int gpus = sm_backend_gpu_count(); /* asked in a child: this process must not start CUDA before it forks */
    if (gpus < 2) {
      printf("SKIP: fewer than two GPUs\n");
      return 0;
    }
    max_tp = gpus >= 4 ? 4 : 2;
    tol = 2e-3;   /* kernels of other shapes round differently */
    tol_q = 2e-2; /* and a decode step's 4-bit MLP quantizes its activations to int8 by rows, which now are halves */
  }
  char root[] = "/tmp/smelt-tp-XXXXXX";
  if (!mkdtemp(root)) return 1;
  char a[600], b[600], c[600], d[600], e[600], f[600], g[600], h[600], i2[600], j2[600];
  snprintf(a, sizeof a, "%s/llama-q4", root);
  snprintf(b, sizeof b, "%s/qwen2-bf16", root);
  snprintf(c, sizeof c, "%s/moe-q4", root);
  snprintf(d, sizeof d, "%s/qwen2moe-bf16", root);
  snprintf(e, sizeof e, "%s/gptoss-bf16", root);
  snprintf(f, sizeof f, "%s/dsv3-bf16", root);
  snprintf(g, sizeof g, "%s/qwen35-bf16", root);
  snprintf(h, sizeof h, "%s/qwen3next-q4", root);
  snprintf(i2, sizeof i2, "%s/nemotronh-bf16", root);
  snprintf(j2, sizeof j2, "%s/lfm2-bf16", root);
  /* (MLP rows of 512: under the CPU's int8 path, I8_MIN_COLS, unsplit as split) */
  const sm_synth_shape sa = {"tp-llama", 256, 2, 8, 4, 512, 4096, false, NULL, 32, NULL};
  const sm_synth_shape sb = {"tp-qwen2", 256, 2, 8, 1, 512, 4098, true, "qwen2", 32, NULL};
  /* mixtures of experts, each expert's columns split: 4-bit (256 / 4 ranks = a group of 64 a rank); a shared
   * expert with its sigmoid gate (bf16); gpt-oss with attention sinks, biases everywhere (the experts' too),
   * the clamped SwiGLU and sliding layers (bf16) */
  const char *moe_q4 = "{\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 256, "
                       "\"norm_topk_prob\": true}";
  const char *moe_sh = "{\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 128, "
                       "\"shared_expert_intermediate_size\": 256}";
  const char *oss = "{\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"sliding_window\": 8, "
                    "\"swiglu_limit\": 7.0, \"attention_bias\": true, \"rope_theta\": 150000, \"rope_scaling\": "
                    "{\"rope_type\": \"yarn\", \"factor\": 32.0, \"beta_fast\": 32.0, \"beta_slow\": 1.0, "
                    "\"truncate\": false, \"original_max_position_embeddings\": 4096}}";
  const sm_synth_shape sc = {"tp-moe", 256, 2, 8, 4, 768, 4096, false, "qwen3_moe", 32, moe_q4};
  const sm_synth_shape sd = {"tp-qwen2moe", 256, 2, 8, 4, 768, 4096, false, "qwen2_moe", 32, moe_sh};
  const sm_synth_shape se = {"tp-gptoss", 256, 2, 8, 4, 256, 4096, false, "gpt_oss", 32, oss};
  /* DeepSeek-V3 (the family's synthetic sizes): multi-head latent attention split by heads with the latent
   * cache whole on every rank, a dense first layer, sigmoid routing over two expert groups, a shared expert */
  const sm_synth_shape sf = {"tp-dsv3", 256, 2, 8, 8, 256, 4096, false, "deepseek_v3", 32, NULL};
  /* hybrid: Gated DeltaNet layers split by key heads (and their value heads) with gated attention every second
   * layer; Qwen3.5 dense bf16, Qwen3-Next with experts, 4-bit */
  const char *gdn = "{\"layer_types\": null, \"full_attention_interval\": 2, \"linear_num_key_heads\": 4, "
                    "\"linear_num_value_heads\": 8, \"linear_key_head_dim\": 32, \"linear_value_head_dim\": 32, "
                    "\"linear_conv_kernel_dim\": 4, \"partial_rotary_factor\": 0.25}";
  const char *gdn_moe = "{\"layer_types\": null, \"mlp_only_layers\": null, \"full_attention_interval\": 2, "
                        "\"linear_num_key_heads\": 4, \"linear_num_value_heads\": 8, \"linear_key_head_dim\": 64, "
                        "\"linear_value_head_dim\": 64, \"linear_conv_kernel_dim\": 4, \"num_experts\": 4, "
                        "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 256, "
                        "\"shared_expert_intermediate_size\": 256, \"partial_rotary_factor\": 0.25}";
  const sm_synth_shape sg = {"tp-qwen35", 256, 4, 8, 2, 512, 4096, false, "qwen3_5_text", 32, gdn};
  const sm_synth_shape sh = {"tp-qwen3next", 512, 4, 8, 2, 1024, 4096, false, "qwen3_next", 64, gdn_moe};
  /* Mamba-2 (Nemotron-H: heads and their groups, the grouped norm) and LFM2's short convolution (channels) */
  const char *mamba = "{\"hybrid_override_pattern\": \"M*-M\", \"mamba_num_heads\": 8, \"mamba_head_dim\": 16, "
                      "\"ssm_state_size\": 16, \"n_groups\": 4, \"conv_kernel\": 4}";
  const char *sconv = "{\"layer_types\": [\"conv\", \"full_attention\", \"conv\", \"full_attention\"], "
                      "\"conv_L_cache\": 3}";
  const sm_synth_shape si = {"tp-nemotronh", 256, 4, 8, 4, 512, 4096, false, "nemotron_h", 32, mamba};
  const sm_synth_shape sj = {"tp-lfm2", 256, 4, 8, 4, 512, 4096, true, "lfm2", 32, sconv};
  CHECK(sm_make_synthetic(&sa, 4, 64, a, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&sb, 0, 0, b, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&sc, 4, 64, c, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&sd, 0, 0, d, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&se, 0, 0, e, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&sf, 0, 0, f, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&sg, 0, 0, g, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&sh, 4, 64, h, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&si, 0, 0, i2, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  CHECK(sm_make_synthetic(&sj, 0, 0, j2, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  for (int tp = 2; tp <= max_tp; tp *= 2) {
    compare(a, tp, tol_q);
    compare(b, tp, tol);
    compare(c, tp, tol_q);
    compare(d, tp, tol);
    compare(e, tp, tol);
    compare(f, tp, tol);
    compare(g, tp, tol);
    compare(h, tp, tol_q);
    compare(i2, tp, tol);
    compare(j2, tp, tol);
  }
  /* golden fixtures that split (unquantized: the quantized ones' o_proj columns are half a group a rank):
   * Llama, Gemma 2 with its softcaps, sandwich norms and sliding layers, and the hybrids, whose random norm
   * weights (the synthetic models' are ones) show a rank reading another's */
  const char *fx[] = {"llama_bf16", "gemma2_bf16", "nemotron_h_bf16", "qwen3_5_bf16", "qwen3_5_moe_bf16"};
  for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
    char fd[700];
    snprintf(fd, sizeof fd, "%s/tests/golden/fixtures/%s", src, fx[i]);
    compare(fd, 2, tol);
  }
  char q[700];
  snprintf(q, sizeof q, "%s/tests/golden/fixtures/llama_q4_g64_bf16", src);
  refused(q, 2, "quantization group");
  refused(a, 3, "split evenly");
  refused(c, 8, "quantization group"); /* 32 columns of o_proj and of an expert a rank: half a group */
  /* pipeline parallelism: every model above, split by layers (a stage runs the whole model's kernels, so on
   * the CPU the logits are the same bits), also those the heads do not split evenly over 3 ranks, and the
   * quantized golden fixture whose groups a head split would cut */
  g_pp = true;
  const double tol_pp = dev == SMELT_DEVICE_CPU ? 0 : tol_q;
  const char *all[] = {a, b, c, d, e, f, g, h, i2, j2};
  for (int n = 2; n <= max_tp; n++)
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      if (n == 2 || i >= 6) compare(all[i], n, tol_pp); /* the first six have two layers: two stages at most */
  compare(q, 2, tol_pp);
  /* the plans: equal, in proportion, and a stage rounded to no layer keeping one */
  plan(6, 4, NULL, (const int[]){0, 2, 3, 5, 6});
  plan(4, 2, (const float[]){3, 1}, (const int[]){0, 3, 4});
  plan(4, 3, (const float[]){8, 1, 1}, (const int[]){0, 2, 3, 4});
  plan(4, 2, (const float[]){1, 1000}, (const int[]){0, 1, 4});
  plan(80, 4, (const float[]){24, 24, 16, 16}, (const int[]){0, 24, 48, 64, 80});
  /* unequal shares (llama.cpp's --tensor-split): 3 of 4 layers on stage 0, and shares that round a stage
   * to no layer (it keeps one) */
  const float s31[] = {3, 1}, s811[] = {8, 1, 1};
  g_shares = s31;
  compare(h, 2, tol_pp);
  compare(j2, 2, tol_pp);
  g_shares = s811;
  if (max_tp >= 3) compare(g, 3, tol_pp); /* three stages: three GPUs on CUDA */
  const float bad[] = {1, -1};
  g_shares = bad;
  refused(g, 2, "not a positive number");
  g_shares = NULL;
  refused(a, 3, "fewer than the stages");
  {
    smelt_model_params mp;
    smelt_model_params_default(&mp);
    mp.device = dev;
    mp.tensor_parallel = mp.pipeline_parallel = 2;
    smelt_model *m = NULL;
    CHECK(smelt_model_load(a, &mp, &m) != SMELT_OK && strstr(smelt_last_error(), "one or the other"),
          "-tp with -pp: %s", m ? "loaded" : smelt_last_error());
    smelt_model_free(m);
  }
  g_pp = false;
#ifdef SMELT_HAVE_CUDA
  if (dev == SMELT_DEVICE_CPU) { /* once this process has tried CUDA, the ranks start by exec (through main) */
    sm_backend *be = sm_backend_create(SMELT_DEVICE_CUDA, 0, 0);
    if (be) be->destroy(be);
    CHECK(sm_backend_cuda_touched(), "CUDA not marked as used");
    compare(a, 2, tol_q);
  }
#endif
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
  TEST_END();
}
