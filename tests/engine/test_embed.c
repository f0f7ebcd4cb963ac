/* Embeddings (sm_engine_embed) against independent paths, on the built-in model's bf16 copy
 * (tied embeddings, so its LM head is the embedding matrix read straight from the safetensors):
 * - last-token pooling h: E·h equals the model's logits at the last position (smelt_eval_logits);
 * - mean pooling over ids equals the mean of the last-token vectors of every prefix (causal
 *   attention: position i sees exactly ids[0..i]), each run as a sequence of its own;
 * - a prompt chunked over several steps (max_batch_tokens 7) gives the same vectors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"
#include "engine/engine.h"
#include "format/safetensors.h"

int main(int argc, char **argv) {
  char dir[1024], path[1100];
  snprintf(dir, sizeof dir, "%s/models/smelt-tiny-bf16", argc > 1 ? argv[1] : ".");
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  mp.max_seqs = 4;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    printf("cannot load %s: %s\n", dir, smelt_last_error());
    return 1;
  }
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = 4;
  sm_engine *e = NULL;
  CHECK(sm_engine_create(m, &ep, &e) == SMELT_OK, "engine: %s", smelt_last_error());
  const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
  int32_t *ids = NULL;
  size_t n = 0;
  const char *text = "In the beginning God created the heavens and the earth.";
  smelt_tokenize(smelt_model_tokenizer(m), text, strlen(text), true, &ids, &n);
  float *h = malloc(sizeof(float) * H), *mean = malloc(sizeof(float) * H), *acc = calloc((size_t)H, sizeof(float));
  CHECK(sm_engine_embed(e, ids, (int)n, SM_POOL_LAST, h) == SMELT_OK, "embed: %s", sm_errmsg());
  /* E·h against the logits */
  sm_st *st = NULL;
  CHECK(sm_st_open(path, &st) == SMELT_OK, "open %s", path);
  const sm_tensor *E = st ? sm_st_find(st, "model.embed_tokens.weight") : NULL;
  CHECK(E && E->dtype == SM_DT_BF16 && E->shape[0] == V && E->shape[1] == H, "embedding matrix");
  float *logits = NULL;
  CHECK(smelt_eval_logits(m, ids, (int)n, &logits) == SMELT_OK, "eval: %s", smelt_last_error());
  if (E && logits) {
    const uint16_t *w = E->data;
    const float *ref = logits + (size_t)(n - 1) * V;
    double maxd = 0, maxr = 0;
    for (int t = 0; t < V; t++) {
      double d = 0;
      for (int k = 0; k < H; k++) d += (double)sm_bf16_to_f32(w[(size_t)t * H + k]) * h[k];
      maxd = fmax(maxd, fabs(d - ref[t]));
      maxr = fmax(maxr, fabs(ref[t]));
    }
    CHECK(maxd <= 1e-3 * fmax(1.0, maxr), "E.h vs logits: max diff %g (logits up to %g)", maxd, maxr);
  }
  /* mean pooling = mean of the prefixes' last-token vectors */
  CHECK(sm_engine_embed(e, ids, (int)n, SM_POOL_MEAN, mean) == SMELT_OK, "mean: %s", sm_errmsg());
  float *tmp = malloc(sizeof(float) * H);
  for (size_t i = 1; i <= n; i++) {
    sm_engine_embed(e, ids, (int)i, SM_POOL_LAST, tmp);
    for (int k = 0; k < H; k++) acc[k] += tmp[k] / (float)n;
  }
  CHECK(t_max_rel(mean, acc, (size_t)H, 1.0) < 1e-4, "mean pooling vs prefixes: %g",
        t_max_rel(mean, acc, (size_t)H, 1.0));
  /* chunked prefill gives the same vectors */
  sm_engine *e2 = NULL;
  ep.max_batch_tokens = 7;
  CHECK(sm_engine_create(m, &ep, &e2) == SMELT_OK, "engine 2");
  if (e2) {
    sm_engine_embed(e2, ids, (int)n, SM_POOL_MEAN, tmp);
    CHECK(t_max_rel(tmp, mean, (size_t)H, 1.0) < 1e-4, "chunked mean: %g", t_max_rel(tmp, mean, (size_t)H, 1.0));
    sm_engine_embed(e2, ids, (int)n, SM_POOL_LAST, tmp);
    CHECK(t_max_rel(tmp, h, (size_t)H, 1.0) < 1e-4, "chunked last: %g", t_max_rel(tmp, h, (size_t)H, 1.0));
    sm_engine_free(e2);
  }
  CHECK(sm_engine_embed(e, ids, 0, SM_POOL_LAST, tmp) != SMELT_OK, "empty input is an error");
  free(tmp);
  free(h);
  free(mean);
  free(acc);
  free(logits);
  free(ids);
  sm_st_close(st);
  sm_engine_free(e);
  smelt_model_free(m);
  TEST_END();
}
