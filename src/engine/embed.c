/* Embeddings from a decoder model (see engine.h, sm_engine_embed): the input runs through the
 * model as a sequence of its own (no prefix cache: every position's hidden state is needed),
 * and after each step the residual stream of its rows (model.h: m->x) is read back, given the
 * model's final RMSNorm on the host and pooled. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"

smelt_status sm_engine_embed(sm_engine *e, const int32_t *ids, int n, sm_pooling pooling, float *out) {
  smelt_model *m = sm_engine_model(e);
  const sm_config *c = &m->cfg;
  const int H = c->hidden_size, V = c->vocab_size;
  if (n <= 0) return sm_err(SMELT_ERR_INVALID, "embeddings: empty input");
  sm_seq *s = sm_seq_new(e);
  if (!s) return sm_err(SMELT_ERR_OOM, "embeddings: no free sequence");
  smelt_status st = sm_seq_append(e, s, ids, n);
  float *w = malloc(sizeof(float) * (size_t)H), *rows = NULL, *logits = malloc(sizeof(float) * (size_t)V);
  double *acc = calloc((size_t)H, sizeof(double));
  int rows_cap = 0, seen = 0;
  if (!w || !logits || !acc) st = sm_err(SMELT_ERR_OOM, "embeddings: %d floats", H);
  if (!st) m->be->download(m->be, w, m->final_norm, sizeof(float) * (size_t)H);
  const float wofs = m->fam->recipe->norm_offset, eps = c->rms_norm_eps;
  while (!st && sm_seq_pending(s) > 0) {
    int before = sm_seq_pending(s);
    uint8_t done = 0;
    if ((st = sm_engine_step(e, &s, 1, logits, &done))) break;
    int k = before - sm_seq_pending(s); /* rows of this step: the sequence's next k tokens */
    if (k <= 0) {
      st = sm_err(SMELT_ERR_INVALID, "embeddings: the step made no progress");
      break;
    }
    if (k > rows_cap) {
      float *r = realloc(rows, sizeof(float) * (size_t)k * H);
      if (!r) {
        st = sm_err(SMELT_ERR_OOM, "embeddings: %d rows", k);
        break;
      }
      rows = r;
      rows_cap = k;
    }
    m->be->download(m->be, rows, m->x, sizeof(float) * (size_t)k * H);
    for (int i = 0; i < k; i++) {
      const float *x = rows + (size_t)i * H;
      if (pooling == SM_POOL_LAST && seen + i != n - 1) continue;
      double ss = 0;
      for (int d = 0; d < H; d++) ss += (double)x[d] * x[d];
      double inv = 1.0 / sqrt(ss / H + eps);
      for (int d = 0; d < H; d++) acc[d] += x[d] * inv * (w[d] + wofs);
    }
    seen += k;
  }
  if (!st) {
    double div = pooling == SM_POOL_MEAN ? (double)n : 1.0;
    for (int d = 0; d < H; d++) out[d] = (float)(acc[d] / div);
  }
  sm_seq_free(e, s);
  free(w);
  free(rows);
  free(logits);
  free(acc);
  return st;
}
