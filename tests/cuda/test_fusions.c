/* What the CUDA executor fuses in a decode step, per family, and how many kernels a decode layer
 * launches (and, for prefill steps that cuBLAS runs with a half-precision x, that x is converted once
 * for q/k/v and for gate/up and the MLP's activation is computed into the down projection's x, with the
 * same logits as one conversion a matmul, SMELT_CUDA_PRE_X16=0): random 4-bit models of the Llama-3.2-1B layer shape (and the 8B one for llama) with two
 * and three layers; after a few decode steps (the graph captured) the stats of the backend tell the
 * fusion table entries that fired and the kernel nodes of the captured graph. The difference of the
 * three- and two-layer counts is what one more layer costs. An edit that breaks a fusion (a changed
 * op order in the forward, a role, a recipe) changes these numbers and fails here; the op order
 * itself is pinned on the CPU by tests/model test_op_sequence.
 * Exits 77 (ctest SKIP) without CUDA or a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "../test_util.h"
#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"

#ifndef SMELT_HAVE_CUDA
int main(void) {
  printf("SKIP: built without CUDA\n");
  return 77;
}
#else
#include "backend/cuda/cuda_api.h"

typedef struct {
  int nodes; /* kernel launches of the captured decode graph */
  long fused[SM_CUDA_STATS_MAX];
  long unfused[SM_CUDA_STATS_MAX];
  sm_cuda_stats st;
} step_info;

/* A synthetic model of shape sh (bits 0: bf16 weights) written to dir, loaded on CUDA, and an engine of
 * ctx tokens a sequence (batch: most tokens a step, 0 the default); false after a failed check */
static bool open_model(const sm_synth_shape *sh, int bits, const char *dir, int ctx, int batch, smelt_model **m,
                       sm_engine **e) {
  *m = NULL;
  *e = NULL;
  bool ok = sm_make_synthetic(sh, bits, 64, dir, false) == SMELT_OK;
  CHECK(ok, "%s: synthetic: %s", sh->family, smelt_last_error());
  smelt_model_params p;
  smelt_model_params_default(&p);
  p.device = SMELT_DEVICE_CUDA;
  p.max_context = ctx;
  ok = ok && smelt_model_load(dir, &p, m) == SMELT_OK;
  CHECK(ok, "%s: load: %s", sh->family, smelt_last_error());
  if (!ok) return false;
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = ctx;
  if (batch) ep.max_batch_tokens = batch;
  ep.prefix_cache = false;
  ok = sm_engine_create(*m, &ep, e) == SMELT_OK;
  CHECK(ok, "%s: engine: %s", sh->family, smelt_last_error());
  return ok;
}
static void close_model(smelt_model *m, sm_engine *e, const char *dir) {
  if (e) sm_engine_free(e);
  smelt_model_free(m);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) {}
}

static bool decode(const char *family, int layers, int hidden, int ffn, const char *extra, step_info *out) {
  char dir[256];
  snprintf(dir, sizeof dir, "/tmp/smelt-fusions-%s-%d-%d-%d", family, hidden, layers, (int)getpid());
  const sm_synth_shape sh = {"fusions", hidden, layers, 32, 8, ffn, 1024, true, family, 0, extra};
  smelt_model *m;
  sm_engine *e;
  bool ok = open_model(&sh, 4, dir, 128, 0, &m, &e);
  if (ok) {
    float *lg = malloc(sizeof(float) * 1024);
    sm_seq *q = sm_seq_new(e);
    int32_t ids[8] = {3, 141, 59, 265, 358, 979, 323, 84};
    sm_seq_append(e, q, ids, 8);
    for (int step = 0; step < 6 && ok; step++) {
      uint8_t d = 0;
      ok = sm_engine_step(e, &q, 1, lg, &d) == SMELT_OK && d;
      CHECK(ok, "%s: step %d: %s", family, step, smelt_last_error());
      int32_t t = (int32_t)((step * 97 + 11) % 1024);
      sm_seq_append(e, q, &t, 1);
    }
    sm_cuda_get_stats(m->be, &out->st);
    out->nodes = out->st.graph_nodes_last;
    for (int i = 0; i < out->st.n_fusions; i++) out->fused[i] = out->st.fused_last[i];
    for (int i = 0; i < out->st.n_op_types; i++) out->unfused[i] = out->st.unfused_last[i];
    CHECK(out->st.captures > 0 && out->st.graph_launches > 0, "%s: no decode graph (captures %ld, replays %ld)", family,
          out->st.captures, out->st.graph_launches);
    free(lg);
    sm_seq_free(e, q);
  }
  close_model(m, e, dir);
  return ok;
}

/* one prefill step of n tokens of a 2-layer llama-shaped model (bits 0: bf16 weights); its last logits
 * and fusion counts */
static bool prefill(int bits, int n, float *lg, sm_cuda_stats *st) {
  char dir[256];
  snprintf(dir, sizeof dir, "/tmp/smelt-fusions-prefill-%d-%d", bits, (int)getpid());
  const sm_synth_shape sh = {"fusions", 512, 2, 8, 2, 1024, 1024, true, "llama", 0, NULL};
  smelt_model *m;
  sm_engine *e;
  bool ok = open_model(&sh, bits, dir, 1024, 1024, &m, &e);
  if (ok) {
    sm_seq *q = sm_seq_new(e);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 131 + 7) % 1024);
    sm_seq_append(e, q, ids, n);
    uint8_t d = 0;
    ok = sm_engine_step(e, &q, 1, lg, &d) == SMELT_OK && d;
    CHECK(ok, "prefill of %d tokens: %s", n, smelt_last_error());
    sm_cuda_get_stats(m->be, st);
    free(ids);
    sm_seq_free(e, q);
  }
  close_model(m, e, dir);
  return ok;
}

static int fusion_index(const sm_cuda_stats *st, const char *name);

/* bf16 weights (cuBLAS with bf16 x) and 4-bit ones past the tensor-core kernel's steps (dequantized
 * tiles, f16 x): the shared conversion and the activation written as half x fire, and
 * the logits are those of the tree with a conversion a matmul (SMELT_CUDA_PRE_X16=0), to the bit */
static void check_prefill_half(int bits, int n) {
  float *a = calloc(1024, sizeof(float)), *b = calloc(1024, sizeof(float));
  sm_cuda_stats sa, sb;
  memset(&sa, 0, sizeof sa);
  memset(&sb, 0, sizeof sb);
  const bool ok = prefill(bits, n, a, &sa);
  setenv("SMELT_CUDA_PRE_X16", "0", 1);
  const bool ok0 = prefill(bits, n, b, &sb);
  unsetenv("SMELT_CUDA_PRE_X16");
  if (ok && ok0) {
    const int ig = fusion_index(&sa, "half gemm group"), is = fusion_index(&sa, "silu+half gemm");
    CHECK(ig >= 0 && is >= 0, "no half gemm fusions in the table");
    if (ig >= 0 && is >= 0) {
      printf("prefill of %d tokens, %s weights: half gemm group %ld, silu+half gemm %ld (%ld and %ld with "
             "SMELT_CUDA_PRE_X16=0)\n",
             n, bits ? "4-bit" : "bf16", sa.fused_last[ig], sa.fused_last[is], sb.fused_last[ig], sb.fused_last[is]);
      /* the activation of the last layer is not fused: nothing later in the step names its buffer, so the
       * executor cannot tell that it is dead (dead_after) */
      CHECK(sa.fused_last[ig] == 4 && sa.fused_last[is] == 1,
            "%d-bit prefill: half gemm group %ld (expected 4: "
            "q/k/v and gate/up of 2 layers), silu+half gemm %ld (expected 1: the first layer)",
            bits, sa.fused_last[ig], sa.fused_last[is]);
      CHECK(sb.fused_last[ig] == 0 && sb.fused_last[is] == 0, "SMELT_CUDA_PRE_X16=0 still fuses");
    }
    int diff = 0;
    for (int i = 0; i < 1024; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    CHECK(diff == 0,
          "%d-bit prefill of %d tokens: %d of 1024 logits differ from one conversion a matmul (first "
          "%g vs %g)",
          bits, n, diff, a[0], b[0]);
    float mx = 0;
    for (int i = 0; i < 1024; i++) mx = fabsf(a[i]) > mx ? fabsf(a[i]) : mx;
    CHECK(mx > 0 && mx < 1e4f, "%d-bit prefill: logits out of range (max abs %g)", bits, mx);
  }
  free(a);
  free(b);
}

static int fusion_index(const sm_cuda_stats *st, const char *name) {
  for (int i = 0; i < st->n_fusions; i++)
    if (!strcmp(st->fusion[i], name)) return i;
  return -1;
}
static int op_index(const sm_cuda_stats *st, const char *name) {
  for (int i = 0; i < st->n_op_types; i++)
    if (!strcmp(st->op[i], name)) return i;
  return -1;
}

/* one layer's expected launches and fusions (the difference of three and two layers) */
typedef struct {
  const char *family;
  int hidden, ffn;
  int launches;           /* kernels a decode layer launches */
  const char *fused[6];   /* fusion entries firing once a layer */
  const char *unfused_op; /* an op run alone in every layer (the recipe's op the fused paths lack) */
  int unfused_n;
  const char *extra; /* more config (mixtures of experts), or NULL */
} layer_case;

static void check_case(const layer_case *c) {
  step_info a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  if (!decode(c->family, 2, c->hidden, c->ffn, c->extra, &a) || !decode(c->family, 3, c->hidden, c->ffn, c->extra, &b))
    return;
  const int per_layer = b.nodes - a.nodes;
  printf("%s (hidden %d): %d kernel launches a decode step with 2 layers, %d with 3: %d a layer\n", c->family,
         c->hidden, a.nodes, b.nodes, per_layer);
  for (int i = 0; i < b.st.n_fusions; i++)
    if (b.fused[i] || a.fused[i])
      printf("  %-28s %ld with 2 layers, %ld with 3\n", b.st.fusion[i], a.fused[i], b.fused[i]);
  for (int i = 0; i < b.st.n_op_types; i++)
    if (b.unfused[i] || a.unfused[i])
      printf("  unfused %-20s %ld with 2 layers, %ld with 3\n", b.st.op[i], a.unfused[i], b.unfused[i]);
  CHECK(per_layer == c->launches, "%s (hidden %d): %d launches a decode layer, expected %d", c->family, c->hidden,
        per_layer, c->launches);
  for (int k = 0; k < 6 && c->fused[k]; k++) {
    const int i = fusion_index(&b.st, c->fused[k]);
    CHECK(i >= 0, "no fusion named %s", c->fused[k]);
    if (i >= 0)
      CHECK(b.fused[i] - a.fused[i] >= 1, "%s (hidden %d): %s does not fire in every layer (%ld / %ld)", c->family,
            c->hidden, c->fused[k], a.fused[i], b.fused[i]);
  }
  if (c->unfused_op) {
    const int i = op_index(&b.st, c->unfused_op);
    CHECK(i >= 0 && b.unfused[i] - a.unfused[i] == c->unfused_n, "%s: %s run alone %ld times a layer, expected %d",
          c->family, c->unfused_op, i >= 0 ? b.unfused[i] - a.unfused[i] : -1, c->unfused_n);
  }
}

int main(void) {
  sm_backend *g = sm_cuda_backend_create(0);
  if (!g) {
    printf("SKIP: no usable CUDA device (%s)\n", smelt_last_error());
    return 77;
  }
  char name[128];
  sm_cuda_device_name(g, name, sizeof name);
  g->destroy(g);
  printf("device: %s\n", name);
  /* the 1B shape: q/k/v, attention with rope and the KV store, o, and the MLP (k_mlp1 with the add +
   * rmsnorm before it); the add + rmsnorm after it runs alone (its int8 x for the next q/k/v) */
  const layer_case cases[] = {
    {"llama",
     2048,
     8192,
     5,
     {"matvec group", "rope+kv_store+attention", "add+rmsnorm+mlp", "add+rmsnorm"},
     NULL,
     0,
     NULL},
    {"mistral",
     2048,
     8192,
     5,
     {"matvec group", "rope+kv_store+attention", "add+rmsnorm+mlp", "add+rmsnorm"},
     NULL,
     0,
     NULL},
    /* qwen2: the q/k/v biases are added by the q/k/v launch (no add_rows runs alone) */
    {"qwen2", 2048, 8192, 5, {"matvec group", "rope+kv_store+attention", "add+rmsnorm+mlp"}, "add_rows", 0, NULL},
    /* qwen3: the per-head q/k norms are one kernel of their own */
    {"qwen3",
     2048,
     8192,
     6,
     {"matvec group", "rmsnorm pair", "rope+kv_store+attention", "add+rmsnorm+mlp"},
     NULL,
     0,
     NULL},
    /* the 8B shape: k_mlp1 also does the add + rmsnorm after it, deferred to the q/k/v launch */
    {"llama", 4096, 14336, 4, {"matvec group", "rope+kv_store+attention", "add+rmsnorm+mlp+add+quant"}, NULL, 0, NULL},
    /* Qwen3-8B's shape: the same, and the q/k head norms' launch */
    {"qwen3",
     4096,
     12288,
     5,
     {"matvec group", "rmsnorm pair", "rope+kv_store+attention", "add+rmsnorm+mlp+add+quant"},
     NULL,
     0,
     NULL},
    /* gemma3_text (Gemma-3-4B's layer shape): the MLP with gelu(gate) * up in k_mlp1, which also computes
     * the post-attention norm, the residual add and the pre-feedforward norm; the q/k head norms in one
     * launch; the post-feedforward norm with the residual add and the next norm */
    {"gemma3_text",
     2560,
     10240,
     7,
     {"matvec group", "rmsnorm+add+rmsnorm+mlp (gelu)", "rmsnorm pair", "rmsnorm+add+rmsnorm",
      "rope+kv_store+attention"},
     NULL,
     0,
     "{\"sliding_window\": 1024}"},
    /* phi3 (Phi-4-mini's longrope and partial rotary): both rope_ext and the KV store in the attention launch;
     * its gate_up_proj's halves in k_mlp1 with the norms before and after it (the q/k/v launch, k_mvr at
     * K = 3072, applies the deferred rms) */
    {"phi3",
     3072,
     8192,
     4,
     {"matvec group", "rope_ext+kv_store+attention", "add+rmsnorm+mlp+add+quant"},
     NULL,
     0,
     "{\"partial_rotary_factor\": 0.75, \"original_max_position_embeddings\": 4096, \"rope_scaling\": "
     "{\"type\": \"longrope\", \"short_factor\": \"36x1.0\", \"long_factor\": \"36x1.5\"}}"},
    /* qwen3_moe (16 experts of the Qwen3-30B-A3B shape, 4 a token): the router's matvec runs alone; the
     * routing, the experts' gate, up and silu are one kernel, their down projection and the weighted sum
     * another (moe_route never runs alone) */
    {"qwen3_moe",
     2048,
     6144,
     9,
     {"matvec group", "rmsnorm pair", "rope+kv_store+attention", "route+experts gate/up+silu", "experts down+combine"},
     "moe_route",
     0,
     "{\"num_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 768, \"norm_topk_prob\": true}"},
    /* gpt_oss (mxfp4 experts): the q/k/v, o and router biases are added by their matvecs' launches; attention
     * with sinks on the decode kernel, rope and the KV store in its launch */
    {"gpt_oss",
     2048,
     1024,
     8,
     {"matvec group", "rope+kv_store+attention", "route+experts gate/up+swiglu", "experts down+combine"},
     "add_rows",
     0,
     "{\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"sliding_window\": 8, \"attention_bias\": true, "
     "\"swiglu_limit\": 7.0, \"smelt_expert_mode\": \"mxfp4\"}"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
  check_prefill_half(0, 40);
  check_prefill_half(4, 600);
  TEST_END();
}
#endif
