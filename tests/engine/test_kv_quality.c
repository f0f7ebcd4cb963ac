/* The quality cost of each KV cache type, and of the one-token decode path, on the built-in model
 * (models/smelt-tiny) over held-out text (tests/golden/heldout.txt, the first 1,024 tokens, windows
 * of 256):
 *  - perplexity through prefill with an f16 and a bf16 cache against an f32 cache (bounds about ten
 *    times the CPU's measured differences: f16 +3e-6, bf16 -1e-4 relative), and with a q8_0 and a q4_0
 *    cache (bounds 1.5e-3 and 5e-2: measured on the CPU -1.3e-4 and +2.4e-2). On the CPU this runs with
 *    float matmuls (SMELT_CPU_EXACT=1): the default int8-activation matmuls round each activation to
 *    one of 255 steps of its group, so any change upstream (the cache's rounding included) flips some
 *    of those roundings and moves perplexity by about 1e-3 whatever its size (f16 and bf16 caches
 *    alike), which would hide the cache's own cost;
 *  - on the CPU's default path: int8 activations against float matmuls, and the f16 cache against the
 *    f32 one, each within 0.5% (measured about 1e-3 and 2e-3);
 *  - perplexity computed token by token through the decode path (one token a step, the default f16
 *    cache and a q8_0 one, the default matmuls) equals the prefill figure within 0.5% (the
 *    throughput issue's bound).
 * SMELT_KVQ_DEVICE=cuda runs it on the CUDA backend (exit 77 without one), the quantized caches with
 * its default kernels against its f32 cache. */
#include <string.h>
#include "engine/engine.h"
#include "engine/sampler.h"
#include "../test_util.h"

enum { N_TOK = 1024, WIN = 256 };
static bool g_cuda;

static smelt_model *load(const char *dir, smelt_kv_type kv) {
  smelt_model_params p;
  smelt_model_params_default(&p);
  p.device = g_cuda ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  p.kv_type = kv;
  p.max_context = WIN;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &p, &m)) {
    fprintf(stderr, "load (%s): %s\n", smelt_kv_type_name(kv), smelt_last_error());
    return NULL;
  }
  return m;
}

/* perplexity over the same windows, one token a step through an engine */
static double ppl_decode(smelt_model *m, const int32_t *ids, int n) {
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = WIN;
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  if (sm_engine_create(m, &ep, &e)) return -1;
  const int V = smelt_model_vocab_size(m);
  float *lg = malloc(sizeof(float) * V), *ls = malloc(sizeof(float) * V);
  double nll = 0;
  long cnt = 0;
  bool ok = true;
  for (int s = 0; ok && s + 1 < n; s += WIN) {
    const int len = n - s < WIN ? n - s : WIN;
    sm_seq *q = sm_seq_new(e);
    for (int i = 0; ok && i + 1 < len; i++) {
      sm_seq_append(e, q, ids + s + i, 1);
      uint8_t done = 0;
      while (ok && !done) ok = sm_engine_step(e, &q, 1, lg, &done) == SMELT_OK;
      sm_log_softmax(lg, V, ls);
      nll -= ls[ids[s + i + 1]];
      cnt++;
    }
    sm_seq_free(e, q);
  }
  free(lg);
  free(ls);
  sm_engine_free(e);
  return ok && cnt ? exp(nll / (double)cnt) : -1;
}

int main(int argc, char **argv) {
  const char *src = argc > 1 ? argv[1] : ".";
  const char *dev = getenv("SMELT_KVQ_DEVICE");
  g_cuda = dev && !strcmp(dev, "cuda");
  char dir[1024], path[1024];
  snprintf(dir, sizeof dir, "%s/models/smelt-tiny", src);
  snprintf(path, sizeof path, "%s/tests/golden/heldout.txt", src);
  char *text = NULL;
  CHECK(sm_read_file(path, &text, NULL) == SMELT_OK, "read %s", path);
  smelt_model *m32 = load(dir, SMELT_KV_F32);
  if (!m32) {
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
  CHECK(text && smelt_tokenize(smelt_model_tokenizer(m32), text, strlen(text), true, &ids, &n) == SMELT_OK, "tokenize");
  if ((int)n > N_TOK) n = N_TOK;
  CHECK(n == N_TOK, "held-out text: %zu tokens", n);
  double p32 = 0, p16 = 0, pb16 = 0, pd32 = 0, pd16 = 0, pq8 = 0, pq4 = 0;
  CHECK(sm_perplexity(m32, ids, (int)n, WIN, &pd32, NULL) == SMELT_OK, "f32: %s", smelt_last_error());
  smelt_model_free(m32);
  smelt_model *m16 = load(dir, SMELT_KV_F16), *mb = NULL;
  CHECK(m16 != NULL, "load f16");
  if (m16) CHECK(sm_perplexity(m16, ids, (int)n, WIN, &pd16, NULL) == SMELT_OK, "f16: %s", smelt_last_error());
  if (g_cuda) {
    p32 = pd32, p16 = pd16;
  } else { /* the KV types' own cost, with float matmuls */
    setenv("SMELT_CPU_EXACT", "1", 1);
    smelt_model *x32 = load(dir, SMELT_KV_F32), *x16 = load(dir, SMELT_KV_F16);
    CHECK(x32 && x16, "load f32 / f16 with SMELT_CPU_EXACT=1");
    if (x32) CHECK(sm_perplexity(x32, ids, (int)n, WIN, &p32, NULL) == SMELT_OK, "f32: %s", smelt_last_error());
    if (x16) CHECK(sm_perplexity(x16, ids, (int)n, WIN, &p16, NULL) == SMELT_OK, "f16: %s", smelt_last_error());
    smelt_model_free(x32);
    smelt_model_free(x16);
    smelt_model *xq8 = load(dir, SMELT_KV_Q8_0), *xq4 = load(dir, SMELT_KV_Q4_0);
    CHECK(xq8 && xq4, "load q8_0 / q4_0 with SMELT_CPU_EXACT=1");
    if (xq8) CHECK(sm_perplexity(xq8, ids, (int)n, WIN, &pq8, NULL) == SMELT_OK, "q8_0: %s", smelt_last_error());
    if (xq4) CHECK(sm_perplexity(xq4, ids, (int)n, WIN, &pq4, NULL) == SMELT_OK, "q4_0: %s", smelt_last_error());
    smelt_model_free(xq8);
    smelt_model_free(xq4);
  }
  mb = load(dir, SMELT_KV_BF16);
  CHECK(mb != NULL, "load bf16");
  if (mb) CHECK(sm_perplexity(mb, ids, (int)n, WIN, &pb16, NULL) == SMELT_OK, "bf16: %s", smelt_last_error());
  if (!g_cuda) unsetenv("SMELT_CPU_EXACT");
  printf("%s perplexity over %zu tokens (window %d)%s: KV f32 %.5f, f16 %.5f (%+.2e), bf16 %.5f (%+.2e)\n",
         g_cuda ? "cuda" : "cpu", n, WIN, g_cuda ? "" : ", float matmuls", p32, p16, p16 / p32 - 1, pb16,
         pb16 / p32 - 1);
  CHECK(p32 > 1 && fabs(p16 / p32 - 1) < 2e-4, "f16 KV moves perplexity by %+.2e", p16 / p32 - 1);
  CHECK(p32 > 1 && fabs(pb16 / p32 - 1) < 1e-3, "bf16 KV moves perplexity by %+.2e", pb16 / p32 - 1);
  if (g_cuda) { /* the quantized caches on CUDA (its own kernels) against its f32 cache */
    smelt_model *mq8 = load(dir, SMELT_KV_Q8_0), *mq4 = load(dir, SMELT_KV_Q4_0);
    CHECK(mq8 && mq4, "cuda: load q8_0 / q4_0: %s", smelt_last_error());
    if (mq8) CHECK(sm_perplexity(mq8, ids, (int)n, WIN, &pq8, NULL) == SMELT_OK, "q8_0: %s", smelt_last_error());
    if (mq4) CHECK(sm_perplexity(mq4, ids, (int)n, WIN, &pq4, NULL) == SMELT_OK, "q4_0: %s", smelt_last_error());
    smelt_model_free(mq8);
    smelt_model_free(mq4);
  }
  printf("%s perplexity%s: KV q8_0 %.5f (%+.2e vs f32), q4_0 %.5f (%+.2e)\n", g_cuda ? "cuda" : "cpu",
         g_cuda ? "" : ", float matmuls", pq8, pq8 / p32 - 1, pq4, pq4 / p32 - 1);
  CHECK(p32 > 1 && pq8 > 1 && fabs(pq8 / p32 - 1) < 1.5e-3, "q8_0 KV moves perplexity by %+.2e", pq8 / p32 - 1);
  CHECK(p32 > 1 && pq4 > 1 && fabs(pq4 / p32 - 1) < 5e-2, "q4_0 KV moves perplexity by %+.2e", pq4 / p32 - 1);
  if (!g_cuda) {
    printf("cpu default matmuls (int8 activations): KV f32 %.5f (%+.2e vs float), f16 %.5f (%+.2e vs f32)\n", pd32,
           pd32 / p32 - 1, pd16, pd16 / pd32 - 1);
    CHECK(pd32 > 1 && fabs(pd32 / p32 - 1) < 5e-3, "int8 activations move perplexity by %+.2e", pd32 / p32 - 1);
    CHECK(pd32 > 1 && fabs(pd16 / pd32 - 1) < 5e-3, "f16 KV (int8 activations) moves perplexity by %+.2e",
          pd16 / pd32 - 1);
  }
  if (m16) {
    const double pd = ppl_decode(m16, ids, (int)n);
    printf("token by token through the decode path (f16 KV): %.5f (%+.2e vs prefill)\n", pd, pd / pd16 - 1);
    CHECK(pd > 1 && fabs(pd / pd16 - 1) < 5e-3, "decode-path perplexity %.5f vs prefill %.5f", pd, pd16);
  }
  { /* the q8_0 cache through the decode path too: rows written one at a time, read the same */
    smelt_model *mq = load(dir, SMELT_KV_Q8_0);
    double pp = 0, pd = 0;
    CHECK(mq && sm_perplexity(mq, ids, (int)n, WIN, &pp, NULL) == SMELT_OK, "q8_0: %s", smelt_last_error());
    if (mq) pd = ppl_decode(mq, ids, (int)n);
    printf("q8_0 KV, default matmuls: prefill %.5f, token by token %.5f (%+.2e)\n", pp, pd, pd / pp - 1);
    CHECK(pp > 1 && pd > 1 && fabs(pd / pp - 1) < 5e-3, "q8_0 decode-path perplexity %.5f vs prefill %.5f", pd, pp);
    smelt_model_free(mq);
  }
  smelt_model_free(m16);
  smelt_model_free(mb);
  free(ids);
  free(text);
  TEST_END();
}
