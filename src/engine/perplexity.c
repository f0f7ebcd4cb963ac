/* Perplexity over a token sequence in non-overlapping windows: each window's logits from one
 * prefill (smelt_eval_logits), or token by token through one-token forward steps (the decode
 * path), to check that the decode kernels score a text as the prefill kernels do. */
#include <math.h>
#include <stdlib.h>
#include "engine/engine.h"
#include "engine/sampler.h"

smelt_status sm_perplexity(smelt_model *m, const int32_t *ids, int n, int ctx, double *ppl, int *n_scored) {
  return sm_perplexity_progress(m, ids, n, ctx, false, ppl, n_scored, NULL, NULL);
}

/* logits after each of ids[0..len) (len * vocab floats), each from a one-token step on one sequence */
static smelt_status eval_decode(smelt_model *m, const int32_t *ids, int len, float *logits) {
  if (len > m->max_context) return sm_err(SMELT_ERR_LIMIT, "%d tokens exceed the context size %d", len, m->max_context);
  const int bs = 16, nb = (len + bs - 1) / bs;
  sm_kv_cache kv;
  smelt_status st = sm_kv_alloc(m, nb, bs, 1, &kv);
  if (st) return st;
  int32_t *table = sm_xmalloc(sizeof(int32_t) * (size_t)nb);
  for (int i = 0; i < nb; i++) table[i] = i;
  const int32_t seq = 0, row = 0, slot = 0;
  for (int i = 0; !st && i < len; i++) {
    const int32_t pos = i;
    sm_batch b = {.n_tokens = 1,
                  .tokens = ids + i,
                  .pos = &pos,
                  .seq = &seq,
                  .n_seqs = 1,
                  .max_blocks = nb,
                  .block_table = table,
                  .n_out = 1,
                  .out_rows = &row,
                  .state_slot = kv.n_slots ? &slot : NULL};
    st = sm_model_forward(m, &kv, &b, logits + (size_t)i * m->cfg.vocab_size);
  }
  free(table);
  sm_kv_free(m, &kv);
  return st;
}

smelt_status sm_perplexity_progress(smelt_model *m, const int32_t *ids, int n, int ctx, bool one_token, double *ppl,
                                    int *n_scored, void (*progress)(void *ud, long done, long total), void *ud) {
  if (ctx < 2) return sm_err(SMELT_ERR_INVALID, "window must be >= 2 tokens");
  int V = m->cfg.vocab_size;
  double nll = 0;
  long cnt = 0;
  float *lsm = sm_xmalloc(sizeof(float) * (size_t)V);
  for (int s = 0; s + 1 < n; s += ctx) {
    int len = SM_MIN(ctx, n - s);
    if (len < 2) break;
    float *lg = NULL;
    smelt_status st;
    if (one_token) {
      lg = malloc(sizeof(float) * (size_t)len * (size_t)V);
      st = lg ? eval_decode(m, ids + s, len, lg) : sm_err(SMELT_ERR_OOM, "cannot allocate logits");
    } else {
      st = smelt_eval_logits(m, ids + s, len, &lg);
    }
    if (st) {
      free(lg);
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
