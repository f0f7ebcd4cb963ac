/* A 4,096-token prompt gives the same logits whichever way it is computed: in one forward step
 * (prefill attention over all 4,096 rows: on CUDA the tensor-core flash-attention kernel with its
 * causal tile skipping), in chunks of 256 tokens (each chunk attending to the cached prefix), and with
 * its last 8 tokens decoded one at a time (the decode kernel, split over a long context). Random
 * weights of a small Llama shape with head dim 64 (a head dim the flash kernel takes), 4-bit, the
 * default f16 KV cache. On the CPU it runs with SMELT_CPU_EXACT=1 (float decode kernels, no int8
 * activations), so all three are the same f32 arithmetic up to summation order. SMELT_LONG_DEVICE=cuda
 * runs it on the CUDA backend (exit 77 without one), whose decode matvecs take int8 activations and
 * whose flash kernel f16 operands. */
#include <string.h>
#include "engine/engine.h"
#include "model/model.h"
#include "../test_util.h"

enum { N = 4096, CHUNK = 256, TAIL = 8 };
static bool g_cuda;

/* the logits after ids[0..n): steps of at most batch tokens, then the tail one token a step */
static bool run(smelt_model *m, const int32_t *ids, int n, int batch, int tail, float *out) {
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = N + 16;
  ep.max_batch_tokens = batch;
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  if (sm_engine_create(m, &ep, &e)) {
    fprintf(stderr, "engine: %s\n", smelt_last_error());
    return false;
  }
  sm_seq *q = sm_seq_new(e);
  bool ok = sm_seq_append(e, q, ids, n - tail) == SMELT_OK;
  uint8_t done = 0;
  while (ok && !done) ok = sm_engine_step(e, &q, 1, out, &done) == SMELT_OK;
  for (int i = n - tail; ok && i < n; i++) {
    ok = sm_seq_append(e, q, ids + i, 1) == SMELT_OK;
    done = 0;
    while (ok && !done) ok = sm_engine_step(e, &q, 1, out, &done) == SMELT_OK;
  }
  if (!ok) fprintf(stderr, "step: %s\n", smelt_last_error());
  sm_seq_free(e, q);
  sm_engine_free(e);
  return ok;
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

int main(int argc, char **argv) {
  const char *tmp = argc > 1 ? argv[1] : "/tmp/smelt-long-prompt";
  const char *dev = getenv("SMELT_LONG_DEVICE");
  g_cuda = dev && !strcmp(dev, "cuda");
  /* 4 query heads of 64 over 2 KV heads, 2 layers */
  static const sm_synth_shape sh = {"longtest", 256, 2, 4, 2, 512, 1024, true, NULL, 64, NULL};
  CHECK(sm_make_synthetic(&sh, 4, 64, tmp, false) == SMELT_OK, "synthetic model: %s", smelt_last_error());
  smelt_model_params p;
  smelt_model_params_default(&p);
  p.device = g_cuda ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  p.max_context = N + 16;
  smelt_model *m = NULL;
  if (smelt_model_load(tmp, &p, &m)) {
    if (g_cuda) {
      printf("no usable CUDA backend: skipping (%s)\n", smelt_last_error());
      return 77;
    }
    CHECK(0, "load: %s", smelt_last_error());
    TEST_END();
  }
  const int V = smelt_model_vocab_size(m);
  int32_t *ids = malloc(sizeof(int32_t) * N);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < N; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    ids[i] = (int32_t)(s % (uint64_t)V);
  }
  float *whole = malloc(sizeof(float) * V), *chunked = malloc(sizeof(float) * V), *dec = malloc(sizeof(float) * V);
  CHECK(run(m, ids, N, N, 0, whole), "one step of %d tokens", N);
  CHECK(run(m, ids, N, CHUNK, 0, chunked), "chunks of %d", CHUNK);
  CHECK(run(m, ids, N, N, TAIL, dec), "the last %d tokens decoded", TAIL);
  const double ec = t_max_rel(chunked, whole, (size_t)V, 1e-3), ed = t_max_rel(dec, whole, (size_t)V, 1e-3);
  printf("%s, %d tokens: chunks of %d vs one step %.2e, last %d decoded vs one step %.2e (max |d| / max |logit|)\n",
         g_cuda ? "cuda" : "cpu", N, CHUNK, ec, TAIL, ed);
  /* measured: CPU 0 / 7.9e-8; CUDA (H100) 1.8e-5 / 2.6e-5 */
  const double bound = g_cuda ? 3e-4 : 1e-6;
  CHECK(ec < bound, "chunked prefill differs by %.2e (bound %.0e)", ec, bound);
  CHECK(ed < bound, "decoded tail differs by %.2e (bound %.0e)", ed, bound);
  CHECK(argmax(chunked, V) == argmax(whole, V) && argmax(dec, V) == argmax(whole, V), "the same greedy token");
  smelt_model_free(m);
  free(ids);
  free(whole);
  free(chunked);
  free(dec);
  TEST_END();
}
