/* Perplexity over a token sequence in non-overlapping windows. */
#include <math.h>
#include <stdlib.h>
#include "engine/engine.h"
#include "engine/sampler.h"

smelt_status sm_perplexity(smelt_model *m, const int32_t *ids, int n, int ctx, double *ppl, int *n_scored) {
  return sm_perplexity_progress(m, ids, n, ctx, ppl, n_scored, NULL, NULL);
}

smelt_status sm_perplexity_progress(smelt_model *m, const int32_t *ids, int n, int ctx, double *ppl, int *n_scored,
                                    void (*progress)(void *ud, long done, long total), void *ud) {
  if (ctx < 2) return sm_err(SMELT_ERR_INVALID, "window must be >= 2 tokens");
  int V = m->cfg.vocab_size;
  double nll = 0;
  long cnt = 0;
  float *lsm = sm_xmalloc(sizeof(float) * (size_t)V);
  for (int s = 0; s + 1 < n; s += ctx) {
    int len = SM_MIN(ctx, n - s);
    if (len < 2) break;
    float *lg = NULL;
    smelt_status st = smelt_eval_logits(m, ids + s, len, &lg);
    if (st) {
      free(lsm);
      return st;
    }
    for (int i = 0; i + 1 < len; i++) {
      sm_log_softmax(lg + (size_t)i * V, V, lsm);
      nll -= lsm[ids[s + i + 1]];
      cnt++;
    }
    free(lg);
    if (progress) progress(ud, s + len, n);
  }
  free(lsm);
  if (!cnt) return sm_err(SMELT_ERR_INVALID, "text too short for perplexity");
  *ppl = exp(nll / (double)cnt);
  if (n_scored) *n_scored = (int)cnt;
  return SMELT_OK;
}
