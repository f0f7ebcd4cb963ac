/* Single-sequence generation and full-sequence evaluation on top of the engine. */
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

static bool is_eos(const smelt_model *m, int32_t t) {
  for (int i = 0; i < m->cfg.n_eos; i++)
    if (m->cfg.eos_ids[i] == t) return true;
  return false;
}

smelt_status smelt_generate(smelt_model *m, const char *prompt, int max_tokens, const smelt_sampling *sp,
                            smelt_piece_cb cb, void *user, smelt_stats *stats) {
  if (!m->tok) return sm_err(SMELT_ERR_INVALID, "model has no tokenizer.json; cannot generate from text");
  int32_t *ids = NULL;
  size_t n_ids = 0;
  smelt_status st = smelt_tokenize(m->tok, prompt, strlen(prompt), true, &ids, &n_ids);
  if (st) return st;
  st = sm_generate_ids(m, NULL, ids, (int)n_ids, max_tokens, sp, cb, user, stats);
  free(ids);
  return st;
}

typedef struct {
  const smelt_model *m;
  sm_detok *dt;
  smelt_piece_cb cb;
  void *user;
  smelt_stats *stats;
  int max_tokens;
  bool stop; /* the callback asked to stop */
} gen_emit;

/* one generated token: counts it, stops at EOS / the callback's request, streams its text */
static bool emit_piece(void *ud, int32_t tok) {
  gen_emit *g = ud;
  g->stats->n_generated++;
  if (is_eos(g->m, tok)) {
    g->stats->stop_reason = 1;
    return false;
  }
  char *piece = NULL;
  size_t len = sm_detok_push(g->dt, tok, &piece);
  bool go = true;
  if (len && g->cb && !g->cb(piece, len, g->user)) {
    g->stats->stop_reason = 1;
    g->stop = true;
    go = false;
  }
  free(piece);
  return go && g->stats->n_generated < g->max_tokens;
}

/* engine params for one generation: the caller's options (or the defaults) */
static void gen_params(const sm_engine_params *base, sm_engine_params *ep) {
  sm_engine_params_default(ep);
  if (base) {
    ep->host_sample = base->host_sample;
    ep->pipeline = base->pipeline;
  }
}

smelt_status sm_generate_ids(smelt_model *m, const sm_engine_params *base, const int32_t *ids, int n_ids,
                             int max_tokens, const smelt_sampling *sp, smelt_piece_cb cb, void *user,
                             smelt_stats *stats) {
  if (!m->tok) return sm_err(SMELT_ERR_INVALID, "model has no tokenizer.json; cannot detokenize");
  smelt_stats local;
  if (!stats) stats = &local;
  memset(stats, 0, sizeof *stats);
  smelt_status st;
  if (n_ids == 0) return sm_err(SMELT_ERR_INVALID, "empty prompt");
  if (n_ids >= m->max_context)
    return sm_err(SMELT_ERR_LIMIT, "prompt of %d tokens does not fit the context size %d", n_ids, m->max_context);
  if (max_tokens < 0 || n_ids + max_tokens > m->max_context) max_tokens = m->max_context - n_ids;
  sm_engine_params ep;
  gen_params(base, &ep);
  ep.max_context = SM_MIN(m->max_context, n_ids + max_tokens + 1);
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  if ((st = sm_engine_create(m, &ep, &e))) return st;
  sm_seq *s = sm_seq_new(e);
  sm_sampler smp;
  sm_sampler_init(&smp, sp, m->cfg.vocab_size);
  sm_detok *dt = sm_detok_new(m->tok, true);
  sm_sampler *psmp = &smp;
  stats->n_prompt = n_ids;
  double t0 = sm_now(), t1 = t0;
  st = sm_seq_append(e, s, ids, n_ids);
  gen_emit ge = {m, dt, cb, user, stats, max_tokens, false};
  int32_t tok = -1;
  uint8_t done = 0;
  /* the prompt (sampled where the logits are: only the token id comes back) */
  while (!st && !done) st = sm_engine_step_sample(e, &s, 1, &psmp, &tok, NULL, &done);
  t1 = sm_now();
  /* then one token a step, the next step already queued on the device (sm_engine_decode) */
  if (!st && max_tokens > 0 && emit_piece(&ge, tok))
    st = sm_engine_decode(e, s, psmp, tok, max_tokens - 1, emit_piece, &ge, NULL);
  bool stop = ge.stop;
  char *rest = NULL;
  size_t len = sm_detok_flush(dt, &rest);
  if (len && cb && !stop) cb(rest, len, user);
  free(rest);
  double t2 = sm_now();
  stats->prefill_s = t1 - t0;
  stats->decode_s = t2 - t1;
  stats->peak_rss = sm_peak_rss();
  sm_detok_free(dt);
  sm_sampler_free(&smp);
  sm_seq_free(e, s);
  sm_engine_free(e);
  return st;
}

smelt_status smelt_eval_logits(smelt_model *m, const int32_t *ids, int n, float **out) {
  *out = NULL;
  if (n <= 0) return sm_err(SMELT_ERR_INVALID, "no tokens");
  if (n > m->max_context) return sm_err(SMELT_ERR_LIMIT, "%d tokens exceed the context size %d", n, m->max_context);
  int bs = 16, nb = (n + bs - 1) / bs;
  sm_kv_cache kv;
  smelt_status st = sm_kv_alloc(m, nb, bs, 1, &kv);
  if (st) return st;
  int32_t *pos = sm_xmalloc(sizeof(int32_t) * (size_t)n), *seq = sm_xcalloc((size_t)n, sizeof(int32_t));
  int32_t *rows = sm_xmalloc(sizeof(int32_t) * (size_t)n), *table = sm_xmalloc(sizeof(int32_t) * (size_t)nb);
  for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
  for (int i = 0; i < nb; i++) table[i] = i;
  float *logits = malloc(sizeof(float) * (size_t)n * m->cfg.vocab_size);
  if (!logits) st = sm_err(SMELT_ERR_OOM, "cannot allocate logits");
  /* chunk to bound activation memory */
  for (int s0 = 0; !st && s0 < n; s0 += 256) {
    int c = SM_MIN(256, n - s0);
    for (int i = 0; i < c; i++) rows[i] = i;
    const int32_t slot = 0; /* hybrid models: the one sequence's state */
    sm_batch b = {.n_tokens = c,
                  .tokens = ids + s0,
                  .pos = pos + s0,
                  .seq = seq,
                  .n_seqs = 1,
                  .max_blocks = nb,
                  .block_table = table,
                  .n_out = c,
                  .out_rows = rows,
                  .state_slot = kv.n_slots ? &slot : NULL};
    st = sm_model_forward(m, &kv, &b, logits + (size_t)s0 * m->cfg.vocab_size);
  }
  free(pos);
  free(seq);
  free(rows);
  free(table);
  sm_kv_free(m, &kv);
  if (st) {
    free(logits);
    return st;
  }
  *out = logits;
  return SMELT_OK;
}
