/* Deterministic (batch-invariant) mode on the built-in model (models/smelt-tiny):
 *  - N_REQ requests (prompts of 6 to 45 tokens cut from tests/golden/heldout.txt; even ones greedy,
 *    odd ones seeded at temperature 0.8) generate GEN tokens each, once all together through one
 *    engine (continuous batching: they arrive four a step, so steps mix prefill chunks and decode
 *    tokens of many sequences) and once each alone. With smelt_model_params.deterministic every
 *    request's tokens must be the same both ways; in the default mode the fraction of requests whose
 *    tokens differ is printed (no bound: the default kernels may round differently by batch size);
 *  - perplexity token by token through the one-token decode path against one prefill a window: within
 *    0.5% in the default mode, equal in deterministic mode.
 *  - the same together / alone check in deterministic mode on a small random mixture of experts (4-bit
 *    qwen3_moe, random prompt tokens): steps of many tokens group their (token, expert) slots by expert
 *    where the default mode does, which must not change a token's result.
 * SMELT_DET_DEVICE=cuda runs it on the CUDA backend (exit 77 without one); SMELT_DET_KV names the KV
 * cache type (f16 by default; q8_0 and q4_0 take the kernels that read quantized rows). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "../test_util.h"

enum { N_REQ = 48, GEN = 16, CTX = 128, PPL_TOK = 512, PPL_WIN = 256 };
static bool g_cuda;
static smelt_kv_type g_kv = SMELT_KV_F16;

static smelt_model *load(const char *dir, bool det) {
  smelt_model_params p;
  smelt_model_params_default(&p);
  p.device = g_cuda ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  p.max_context = PPL_WIN > CTX ? PPL_WIN : CTX;
  p.deterministic = det;
  p.kv_type = g_kv;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &p, &m)) {
    fprintf(stderr, "load (%s): %s\n", det ? "deterministic" : "default", smelt_last_error());
    return NULL;
  }
  return m;
}

typedef struct {
  const int32_t *prompt;
  int n_prompt;
  smelt_sampling sp;
} req;

/* the GEN tokens of each of reqs[first .. first + n) into out[i][GEN], run together (n > 1: request
 * i joins at step i / 4) */
static bool generate(smelt_model *m, const req *reqs, int first, int n, int32_t (*out)[GEN]) {
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = n;
  ep.max_context = CTX;
  ep.prefix_cache = false; /* every request computes its own prompt */
  sm_engine *e = NULL;
  if (sm_engine_create(m, &ep, &e)) {
    fprintf(stderr, "engine: %s\n", smelt_last_error());
    return false;
  }
  const int V = smelt_model_vocab_size(m);
  sm_seq **seqs = calloc((size_t)n, sizeof *seqs), **act = calloc((size_t)n, sizeof *act);
  sm_sampler *smp = calloc((size_t)n, sizeof *smp), **asmp = calloc((size_t)n, sizeof *asmp);
  int *got = calloc((size_t)n, sizeof *got), *aidx = calloc((size_t)n, sizeof *aidx);
  int32_t *tok = calloc((size_t)n, sizeof *tok);
  uint8_t *done = calloc((size_t)n, 1);
  bool ok = true;
  int finished = 0;
  for (int step = 0; ok && finished < n; step++) {
    int na = 0;
    for (int i = 0; i < n; i++) {
      if (!seqs[i] && i / 4 <= step) { /* arrives */
        seqs[i] = sm_seq_new(e);
        sm_sampler_init(&smp[i], &reqs[first + i].sp, V);
        ok &= seqs[i] && sm_seq_append(e, seqs[i], reqs[first + i].prompt, reqs[first + i].n_prompt) == SMELT_OK;
      }
      if (seqs[i] && got[i] < GEN) {
        act[na] = seqs[i];
        asmp[na] = &smp[i];
        aidx[na++] = i;
      }
    }
    if (!ok || !na) continue;
    if (sm_engine_step_sample(e, act, na, asmp, tok, NULL, done)) {
      fprintf(stderr, "step: %s\n", smelt_last_error());
      ok = false;
      break;
    }
    for (int k = 0; k < na; k++) {
      if (!done[k]) continue;
      const int i = aidx[k];
      out[first + i][got[i]++] = tok[k];
      if (got[i] == GEN) finished++;
      else ok &= sm_seq_append(e, act[k], &tok[k], 1) == SMELT_OK;
    }
  }
  for (int i = 0; i < n; i++) {
    if (seqs[i]) {
      sm_seq_free(e, seqs[i]);
      sm_sampler_free(&smp[i]);
    }
  }
  free(seqs);
  free(act);
  free(smp);
  free(asmp);
  free(got);
  free(aidx);
  free(tok);
  free(done);
  sm_engine_free(e);
  return ok;
}

/* requests whose tokens differ between running together and alone; -1 on an error */
static int together_vs_alone(smelt_model *m, const req *reqs) {
  static int32_t tog[N_REQ][GEN], alone[N_REQ][GEN];
  memset(tog, 0xff, sizeof tog);
  memset(alone, 0xfe, sizeof alone);
  if (!generate(m, reqs, 0, N_REQ, tog)) return -1;
  for (int i = 0; i < N_REQ; i++)
    if (!generate(m, reqs, i, 1, alone)) return -1;
  int diff = 0;
  for (int i = 0; i < N_REQ; i++) diff += memcmp(tog[i], alone[i], sizeof tog[i]) != 0;
  return diff;
}

/* N_REQ requests over ids: prompts of 6 to 45 tokens 37 apart, even ones greedy, odd ones at temperature
 * 0.8 with seeds from seed0 */
static void make_reqs(req *reqs, const int32_t *ids, uint64_t seed0) {
  for (int i = 0; i < N_REQ; i++) {
    reqs[i].prompt = ids + 37 * i;
    reqs[i].n_prompt = 6 + (i * 13) % 40;
    smelt_sampling_default(&reqs[i].sp);
    reqs[i].sp.temperature = i % 2 ? 0.8f : 0.f;
    reqs[i].sp.seed = seed0 + (uint64_t)i;
  }
}

/* deterministic mode on a random 4-bit qwen3_moe (8 experts, 2 a token): requests together and alone */
static void moe_check(const char *name) {
  char root[] = "/tmp/smelt-det-XXXXXX";
  if (!mkdtemp(root)) return;
  char dir[600];
  snprintf(dir, sizeof dir, "%s/moe", root);
  const sm_synth_shape sh = {"det-moe",
                             256,
                             2,
                             8,
                             4,
                             512,
                             2048,
                             false,
                             "qwen3_moe",
                             32,
                             "{\"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 256, "
                             "\"norm_topk_prob\": true}"};
  CHECK(sm_make_synthetic(&sh, 4, 64, dir, false) == SMELT_OK, "synthetic moe: %s", smelt_last_error());
  smelt_model *m = load(dir, true);
  CHECK(m != NULL, "load the moe model in deterministic mode");
  if (m) {
    static int32_t ids[N_REQ * 37 + 64];
    uint64_t r = 7;
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
      ids[i] = (int32_t)(((r = r * 6364136223846793005ULL + 1) >> 53) % 2048);
    req reqs[N_REQ];
    make_reqs(reqs, ids, 2000);
    const int di = together_vs_alone(m, reqs);
    printf("%s deterministic mode, mixture of experts: %d of %d requests differ together vs alone\n", name, di, N_REQ);
    CHECK(di == 0, "deterministic mode, mixture of experts: %d of %d requests differ", di, N_REQ);
    smelt_model_free(m);
  }
  char f[700];
  snprintf(f, sizeof f, "%s/config.json", dir);
  unlink(f);
  snprintf(f, sizeof f, "%s/model.safetensors", dir);
  unlink(f);
  rmdir(dir);
  rmdir(root);
}

int main(int argc, char **argv) {
  const char *src = argc > 1 ? argv[1] : ".";
  const char *dev = getenv("SMELT_DET_DEVICE");
  g_cuda = dev && !strcmp(dev, "cuda");
  const char *kvs = getenv("SMELT_DET_KV");
  if (kvs && smelt_kv_type_parse(kvs, &g_kv)) {
    fprintf(stderr, "SMELT_DET_KV: %s\n", smelt_last_error());
    return 1;
  }
  char dir[1024], path[1024];
  snprintf(dir, sizeof dir, "%s/models/smelt-tiny", src);
  snprintf(path, sizeof path, "%s/tests/golden/heldout.txt", src);
  char *text = NULL;
  CHECK(sm_read_file(path, &text, NULL) == SMELT_OK, "read %s", path);
  smelt_model *md = load(dir, false);
  if (!md) {
    free(text);
    if (g_cuda) {
      printf("no usable CUDA backend: skipping\n");
      return 77;
    }
    CHECK(0, "load the built-in model");
    TEST_END();
  }
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(text && smelt_tokenize(smelt_model_tokenizer(md), text, strlen(text), true, &ids, &n) == SMELT_OK, "tokenize");
  CHECK(n >= 2000, "held-out text: %zu tokens", n);
  if (n < 2000) {
    smelt_model_free(md);
    free(text);
    free(ids);
    TEST_END();
  }
  req reqs[N_REQ];
  make_reqs(reqs, ids, 1000);
  char name[32];
  snprintf(name, sizeof name, "%s (KV %s)", g_cuda ? "cuda" : "cpu", smelt_kv_type_name(g_kv));

  /* default mode: report */
  const int dd = together_vs_alone(md, reqs);
  CHECK(dd >= 0, "default mode: generation failed");
  printf("%s default mode: %d of %d requests differ together vs alone (%.1f%%)\n", name, dd, N_REQ, 100.0 * dd / N_REQ);
  double pp = 0, pd = 0;
  CHECK(sm_perplexity_progress(md, ids, PPL_TOK, PPL_WIN, false, &pp, NULL, NULL, NULL) == SMELT_OK, "prefill: %s",
        smelt_last_error());
  CHECK(sm_perplexity_progress(md, ids, PPL_TOK, PPL_WIN, true, &pd, NULL, NULL, NULL) == SMELT_OK, "decode: %s",
        smelt_last_error());
  printf("%s default mode: perplexity over %d tokens (window %d): prefill %.5f, token by token %.5f (%+.2e)\n", name,
         PPL_TOK, PPL_WIN, pp, pd, pd / pp - 1);
  CHECK(pp > 1 && fabs(pd / pp - 1) < 5e-3, "default mode: decode-path perplexity %.5f vs prefill %.5f", pd, pp);
  smelt_model_free(md);

  /* deterministic mode: every request the same both ways, and the decode path's perplexity that of prefill */
  smelt_model *mi = load(dir, true);
  CHECK(mi != NULL, "load in deterministic mode");
  if (mi) {
    const int di = together_vs_alone(mi, reqs);
    printf("%s deterministic mode: %d of %d requests differ together vs alone\n", name, di, N_REQ);
    CHECK(di == 0, "deterministic mode: %d of %d requests differ", di, N_REQ);
    double qp = 0, qd = 0;
    CHECK(sm_perplexity_progress(mi, ids, PPL_TOK, PPL_WIN, false, &qp, NULL, NULL, NULL) == SMELT_OK, "prefill: %s",
          smelt_last_error());
    CHECK(sm_perplexity_progress(mi, ids, PPL_TOK, PPL_WIN, true, &qd, NULL, NULL, NULL) == SMELT_OK, "decode: %s",
          smelt_last_error());
    printf("%s deterministic mode: perplexity prefill %.5f, token by token %.5f (%+.2e vs default prefill)\n", name, qp,
           qd, qp / pp - 1);
    CHECK(qp > 1 && qp == qd, "deterministic mode: decode-path perplexity %.17g != prefill %.17g", qd, qp);
    CHECK(fabs(qp / pp - 1) < 5e-3, "deterministic mode moves perplexity by %+.2e", qp / pp - 1);
    smelt_model_free(mi);
  }
  moe_check(name);
  free(ids);
  free(text);
  TEST_END();
}
