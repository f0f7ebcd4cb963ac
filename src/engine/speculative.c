/* Speculative decoding: a draft model proposes tokens greedily, the target verifies them in one
 * batched step; every emitted token is the target's own sample, so the output follows the target
 * exactly. The decode loop (sm_spec_decode) works on sequences the caller owns (a session keeps
 * them between turns); sm_generate_speculative is the one-shot wrapper. */
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

static int32_t argmax(const float *l, int n) {
  int32_t b = 0;
  for (int i = 1; i < n; i++)
    if (l[i] > l[b]) b = i;
  return b;
}

smelt_status sm_spec_decode(sm_engine *e, sm_seq *s, sm_engine *de, sm_seq *d, int n_draft, int max_new,
                            sm_sampler *smp, float *lg, bool (*emit)(void *ud, int32_t tok), void *ud, int *accepted) {
  smelt_model *m = sm_engine_model(e), *dm = sm_engine_model(de);
  if (sm_engine_recurrent(e) || sm_engine_recurrent(de)) /* rejected draft tokens cannot be taken back */
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "speculative decoding is not supported with a model that has recurrent "
                  "layers (%s)",
                  sm_engine_recurrent(e) ? m->cfg.model_type : dm->cfg.model_type);
  const int V = m->cfg.vocab_size, DV = dm->cfg.vocab_size, ctx = sm_engine_max_context(e);
  float *dl = sm_xmalloc(sizeof(float) * (size_t)DV);
  int32_t *prop = sm_xmalloc(sizeof(int32_t) * (size_t)(n_draft + 1));
  smelt_status st = SMELT_OK;
  int nrows = 1; /* rows of lg holding valid logits, starting at row 0 */
  int n_prop = 0, n_gen = 0;
  bool stop = max_new <= 0;
  while (!st && !stop) {
    /* sample along the verified rows: row j follows prop[0..j-1] */
    int j = 0;
    int32_t tok = -1;
    for (; j < nrows; j++) {
      tok = sm_sampler_sample(smp, lg + (size_t)j * V, sm_seq_tokens(s), sm_seq_len(s) - (nrows - 1) + j);
      if (j < n_prop && tok == prop[j]) continue; /* draft token confirmed */
      break;
    }
    if (tok < 0) { /* the sampler's grammar mask allows no token */
      st = sm_err(SMELT_ERR_INVALID, "speculative decoding: the grammar mask allows no token");
      break;
    }
    int kept = SM_MIN(j, n_prop); /* draft tokens accepted this round */
    if (accepted) *accepted += kept;
    int base = sm_seq_len(s) - n_prop; /* length before the proposals */
    /* emit the accepted draft tokens and the target's own token; on a stop the sequences keep
     * every emitted token but the last (as sm_engine_decode leaves them) */
    for (int k = 0; k <= kept; k++) {
      int32_t t = k < kept ? prop[k] : tok;
      n_gen++;
      if (!emit(ud, t) || n_gen >= max_new) {
        stop = true;
        st = sm_seq_truncate(e, s, base + k);
        if (!st) st = sm_seq_truncate(de, d, SM_MIN(sm_seq_len(d), base + k));
        break;
      }
    }
    if (stop) break;
    /* roll both sequences back to the accepted prefix and append the target's token */
    if ((st = sm_seq_truncate(e, s, base + kept)) || (st = sm_seq_append(e, s, &tok, 1))) break;
    if ((st = sm_seq_truncate(de, d, base + kept)) || (st = sm_seq_append(de, d, &tok, 1))) break;
    /* draft proposes n_draft tokens greedily */
    n_prop = SM_MAX(0, SM_MIN(n_draft, max_new - n_gen - 1));
    if (sm_seq_len(s) + n_prop + 1 >= ctx) n_prop = SM_MAX(0, ctx - sm_seq_len(s) - 2);
    for (int k = 0; k < n_prop && !st; k++) {
      uint8_t done = 0;
      while (!st && !done) st = sm_engine_step(de, &d, 1, dl, &done);
      if (st) break;
      prop[k] = argmax(dl, DV);
      st = sm_seq_append(de, d, &prop[k], 1);
    }
    if (st) break;
    /* target verifies [tok, prop...] in one step */
    if ((st = sm_seq_append(e, s, prop, n_prop))) break;
    if ((st = sm_engine_step_all(e, s, lg, &nrows))) break;
  }
  free(dl);
  free(prop);
  return st;
}

static bool is_eos(const smelt_model *m, int32_t t) {
  for (int i = 0; i < m->cfg.n_eos; i++)
    if (m->cfg.eos_ids[i] == t) return true;
  return false;
}

typedef struct {
  const smelt_model *m;
  sm_detok *dt;
  smelt_piece_cb cb;
  void *user;
  smelt_stats *stats;
  bool cb_stop; /* the callback asked to stop */
} spec_emit;

static bool emit_piece(void *ud, int32_t t) {
  spec_emit *g = ud;
  g->stats->n_generated++;
  if (is_eos(g->m, t)) {
    g->stats->stop_reason = 1;
    return false;
  }
  char *piece = NULL;
  size_t len = sm_detok_push(g->dt, t, &piece);
  bool go = true;
  if (len && g->cb && !g->cb(piece, len, g->user)) {
    g->stats->stop_reason = 1;
    g->cb_stop = true;
    go = false;
  }
  free(piece);
  return go;
}

smelt_status sm_generate_speculative(smelt_model *m, smelt_model *dm, const sm_engine_params *base, int n_draft,
                                     const int32_t *ids, int n_ids, int max_tokens, const smelt_sampling *sp,
                                     smelt_piece_cb cb, void *user, smelt_stats *stats, int *accepted) {
  if (m->cfg.rec.kind != SM_REC_NONE || dm->cfg.rec.kind != SM_REC_NONE)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "speculative decoding is not supported with a model that has recurrent "
                  "layers (%s)",
                  m->cfg.rec.kind != SM_REC_NONE ? m->cfg.model_type : dm->cfg.model_type);
  if (!m->tok) return sm_err(SMELT_ERR_INVALID, "model has no tokenizer.json; cannot detokenize");
  if (dm->cfg.vocab_size > m->cfg.vocab_size)
    return sm_err(SMELT_ERR_INVALID, "draft vocabulary (%d) is larger than the model's (%d)", dm->cfg.vocab_size,
                  m->cfg.vocab_size);
  if (n_draft < 1 || n_draft > 32) return sm_err(SMELT_ERR_INVALID, "draft length must be 1..32");
  smelt_stats local;
  if (!stats) stats = &local;
  memset(stats, 0, sizeof *stats);
  if (accepted) *accepted = 0;
  if (n_ids <= 0) return sm_err(SMELT_ERR_INVALID, "empty prompt");
  int ctx = SM_MIN(m->max_context, dm->max_context);
  if (n_ids >= ctx) return sm_err(SMELT_ERR_LIMIT, "prompt of %d tokens does not fit the context size %d", n_ids, ctx);
  if (max_tokens < 0 || n_ids + max_tokens > ctx) max_tokens = ctx - n_ids;
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  if (base) {
    ep.host_sample = base->host_sample;
    ep.pipeline = base->pipeline;
  }
  ep.max_context = SM_MIN(ctx, n_ids + max_tokens + n_draft + 2);
  ep.prefix_cache = false;
  ep.max_batch_tokens = SM_MAX(512, n_draft + 2);
  sm_engine *e = NULL, *de = NULL;
  smelt_status st = sm_engine_create(m, &ep, &e);
  if (!st) st = sm_engine_create(dm, &ep, &de);
  if (st) {
    sm_engine_free(e);
    return st;
  }
  int V = m->cfg.vocab_size;
  sm_seq *s = sm_seq_new(e), *d = sm_seq_new(de);
  sm_sampler smp;
  sm_sampler_init(&smp, sp, V);
  sm_detok *dt = sm_detok_new(m->tok, true);
  float *lg = sm_xmalloc(sizeof(float) * (size_t)V * (size_t)(n_draft + 1));
  stats->n_prompt = n_ids;
  double t0 = sm_now();
  /* prefill the target; its last-position logits give the first token (the draft catches up
   * in its first proposal step) */
  if (!(st = sm_seq_append(e, s, ids, n_ids)) && !(st = sm_seq_append(de, d, ids, n_ids))) {
    uint8_t done = 0;
    while (!st && !done) st = sm_engine_step(e, &s, 1, lg, &done);
  }
  double t1 = sm_now();
  spec_emit g = {m, dt, cb, user, stats, false};
  if (!st) st = sm_spec_decode(e, s, de, d, n_draft, max_tokens, &smp, lg, emit_piece, &g, accepted);
  char *rest = NULL;
  size_t len = sm_detok_flush(dt, &rest);
  if (len && cb && !g.cb_stop) cb(rest, len, user);
  free(rest);
  double t2 = sm_now();
  stats->prefill_s = t1 - t0;
  stats->decode_s = t2 - t1;
  stats->peak_rss = sm_peak_rss();
  free(lg);
  sm_detok_free(dt);
  sm_sampler_free(&smp);
  sm_seq_free(e, s);
  sm_seq_free(de, d);
  sm_engine_free(e);
  sm_engine_free(de);
  return st;
}
