/* Speculative decoding in `smelt serve` (see spec.h): draft tokens for the running choices of a
 * step, from a draft model (one batched draft step per proposed position over every choice) or
 * from an n-gram lookup in the choice's own prompt and output (prompt lookup decoding). The
 * target verifies them in the scheduler's step (sched.c). */
#include "server/spec.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void sm_spec_drop(sm_sched *s, sm_choice *c) {
  if (c->dseq) sm_seq_free(s->spec.deng, c->dseq);
  c->dseq = NULL;
}

/* prompt lookup: the latest earlier occurrence of the last n tokens of t (n from ngram_n down to
 * 1); the tokens that followed it, at most k */
static int ngram_propose(const int32_t *t, int len, int ngram_n, int k, int32_t *out) {
  for (int n = SM_MIN(ngram_n, len - 1); n >= 1; n--) {
    const int32_t *pat = t + len - n;
    for (int i = len - n - 1; i >= 0; i--) {
      if (memcmp(t + i, pat, sizeof(int32_t) * (size_t)n)) continue;
      int from = i + n, m = SM_MIN(k, len - from);
      memcpy(out, t + from, sizeof(int32_t) * (size_t)m);
      return m;
    }
  }
  return 0;
}

/* the draft sequence of c holds exactly the target sequence's tokens (created, or rolled back to
 * their common prefix and extended) */
static smelt_status sync_draft(sm_sched *s, sm_choice *c) {
  sm_engine *de = s->spec.deng;
  const int32_t *t = sm_seq_tokens(c->seq);
  const int len = sm_seq_len(c->seq);
  for (int i = 0; i < len; i++) /* a token the draft model does not have: this choice is not drafted */
    if (t[i] < 0 || t[i] >= s->spec.dvocab)
      return sm_err(SMELT_ERR_INVALID, "token %d not in the draft vocabulary", t[i]);
  if (!c->dseq) {
    if (!(c->dseq = sm_seq_new(de))) return sm_err(SMELT_ERR_OOM, "no draft sequence");
    smelt_status st = sm_seq_append(de, c->dseq, t, len);
    if (st) return st;
    sm_seq_use_prefix_cache(de, c->dseq);
    return SMELT_OK;
  }
  const int32_t *d = sm_seq_tokens(c->dseq);
  int dl = sm_seq_len(c->dseq), k = 0;
  while (k < dl && k < len && d[k] == t[k]) k++;
  /* the draft needs its logits after the last token: at least that token is computed again */
  k = SM_MIN(k, len - 1);
  smelt_status st = k < dl ? sm_seq_truncate(de, c->dseq, k) : SMELT_OK;
  if (!st) st = sm_seq_append(de, c->dseq, t + k, len - k);
  return st;
}

/* the draft's greedy token of row l and its probability */
static int32_t draft_pick(const float *l, int n, float *prob) {
  int32_t b = 0;
  for (int i = 1; i < n; i++)
    if (l[i] > l[b]) b = i;
  double z = 0;
  for (int i = 0; i < n; i++) z += exp((double)l[i] - (double)l[b]);
  *prob = (float)(1.0 / z);
  return b;
}

void sm_spec_propose(sm_sched *s, sm_choice **cs, const int *kmax, const float *pmin, int n, int32_t *prop, int cap,
                     int *nprop) {
  for (int i = 0; i < n; i++) nprop[i] = 0;
  if (!s->spec.deng) {
    for (int i = 0; i < n; i++)
      if (kmax[i] > 0)
        nprop[i] = ngram_propose(sm_seq_tokens(cs[i]->seq), sm_seq_len(cs[i]->seq), s->spec.ngram_n, kmax[i],
                                 prop + (size_t)i * cap);
    return;
  }
  sm_engine *de = s->spec.deng;
  const int DV = s->spec.dvocab;
  sm_seq **ds = sm_xmalloc(sizeof(sm_seq *) * (size_t)n);
  int *who = sm_xmalloc(sizeof(int) * (size_t)n);
  uint8_t *done = sm_xmalloc((size_t)n);
  bool *live = sm_xcalloc((size_t)n, sizeof(bool));
  if ((size_t)n * DV > s->spec.dl_cap) {
    free(s->spec.dl);
    s->spec.dl_cap = (size_t)n * DV;
    s->spec.dl = sm_xmalloc(sizeof(float) * s->spec.dl_cap);
  }
  smelt_status st = SMELT_OK;
  int maxk = 0;
  for (int i = 0; i < n; i++) {
    if (kmax[i] <= 0) continue;
    if (sync_draft(s, cs[i]) != SMELT_OK) { /* this choice only: no drafts this step */
      sm_spec_drop(s, cs[i]);
      continue;
    }
    live[i] = true;
    maxk = SM_MAX(maxk, kmax[i]);
  }
  /* position r of every live draft: step until each has computed its pending tokens (the first
   * round catches up on the prompt and the tokens accepted since), then take its greedy token */
  for (int r = 0; r < maxk && !st; r++) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if (live[i]) {
        ds[m] = cs[i]->dseq;
        who[m++] = i;
      }
    if (!m) break;
    memset(done, 0, (size_t)m);
    for (;;) {
      int left = 0;
      for (int q = 0; q < m; q++) left += !done[q];
      if (!left) break;
      /* only the sequences not yet done take part (a done one has nothing pending) */
      sm_seq **sub = sm_xmalloc(sizeof(sm_seq *) * (size_t)left);
      int *map = sm_xmalloc(sizeof(int) * (size_t)left);
      uint8_t *sd = sm_xcalloc((size_t)left, 1);
      int u = 0;
      for (int q = 0; q < m; q++)
        if (!done[q] && sm_seq_pending(ds[q]) == 0) { /* cannot happen (sync_draft); never loop on it */
          done[q] = 1;
          live[who[q]] = false;
        } else if (!done[q]) {
          sub[u] = ds[q];
          map[u++] = q;
        }
      st = sm_engine_step(de, sub, u, s->spec.dl, sd);
      for (int v = 0; !st && v < u; v++)
        if (sd[v]) {
          const int q = map[v], i = who[q];
          done[q] = 1;
          float p;
          int32_t tok = draft_pick(s->spec.dl + (size_t)v * DV, DV, &p);
          if (p < pmin[i]) {
            live[i] = false;
            continue;
          }
          prop[(size_t)i * cap + nprop[i]++] = tok;
          if (nprop[i] >= kmax[i] || sm_seq_append(de, cs[i]->dseq, &tok, 1)) live[i] = false;
        }
      free(sub);
      free(map);
      free(sd);
      if (st) break;
    }
  }
  if (st) { /* the draft could not run (its KV cache is full): no speculation this step */
    for (int i = 0; i < n; i++) {
      nprop[i] = 0;
      if (kmax[i] > 0) sm_spec_drop(s, cs[i]);
    }
  }
  free(ds);
  free(who);
  free(done);
  free(live);
}
