/* Session: a single sequence whose KV cache lives across generate calls; each call keeps the
 * KV of the longest common prefix of the new prompt and the tokens held, and prefills the rest. */
#include "engine/session.h"
#include <stdlib.h>
#include <string.h>
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"
#include "vision/vision.h"

struct sm_session {
  smelt_model *m, *dm;
  sm_engine *e, *de;
  sm_seq *s, *d;
  int n_draft, ctx;
  float *lg; /* speculative: (n_draft + 1) rows of target logits */
};

const char *sm_stop_name(sm_stop s) {
  switch (s) {
    case SM_STOP_LENGTH: return "length";
    case SM_STOP_EOS: return "eos";
    case SM_STOP_CONTEXT: return "context";
    case SM_STOP_CANCELLED: return "cancelled";
    default: return "none";
  }
}

smelt_status sm_session_create(smelt_model *m, smelt_model *draft, int n_draft, int max_context, int max_batch,
                               sm_session **out) {
  *out = NULL;
  int ctx = max_context > 0 ? SM_MIN(max_context, m->max_context) : m->max_context;
  if (draft) {
    if (draft->cfg.vocab_size > m->cfg.vocab_size)
      return sm_err(SMELT_ERR_INVALID, "draft vocabulary (%d) is larger than the model's (%d)", draft->cfg.vocab_size,
                    m->cfg.vocab_size);
    if (n_draft < 1 || n_draft > 32) return sm_err(SMELT_ERR_INVALID, "draft length must be 1..32");
    ctx = SM_MIN(ctx, draft->max_context);
  }
  if (ctx < 2) return sm_err(SMELT_ERR_INVALID, "context of %d tokens is too small", ctx);
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = ctx;
  ep.prefix_cache = false; /* one sequence: reuse is the common prefix, and the pipelined decode needs it off */
  if (max_batch > 0) ep.max_batch_tokens = max_batch;
  if (draft) ep.max_batch_tokens = SM_MAX(ep.max_batch_tokens, n_draft + 2);
  sm_session *s = sm_xcalloc(1, sizeof *s);
  s->m = m;
  s->dm = draft;
  s->n_draft = n_draft;
  s->ctx = ctx;
  smelt_status st = sm_engine_create(m, &ep, &s->e);
  if (!st && draft) st = sm_engine_create(draft, &ep, &s->de);
  if (!st && draft && (sm_engine_recurrent(s->e) || sm_engine_recurrent(s->de)))
    st = sm_err(SMELT_ERR_UNSUPPORTED,
                "speculative decoding is not supported with a model that has recurrent layers "
                "(%s)",
                sm_engine_recurrent(s->e) ? m->cfg.model_type : draft->cfg.model_type);
  if (st) {
    sm_session_free(s);
    return st;
  }
  s->s = sm_seq_new(s->e);
  if (draft) {
    s->d = sm_seq_new(s->de);
    s->lg = sm_xmalloc(sizeof(float) * (size_t)m->cfg.vocab_size * (size_t)(n_draft + 1));
  }
  *out = s;
  return SMELT_OK;
}

void sm_session_free(sm_session *s) {
  if (!s) return;
  if (s->s) sm_seq_free(s->e, s->s);
  if (s->d) sm_seq_free(s->de, s->d);
  sm_engine_free(s->e);
  sm_engine_free(s->de);
  free(s->lg);
  free(s);
}

int sm_session_context(const sm_session *s) { return s->ctx; }
int sm_session_len(const sm_session *s) { return sm_seq_len(s->s) - sm_seq_pending(s->s); }
const int32_t *sm_session_tokens(const sm_session *s) { return sm_seq_tokens(s->s); }
sm_engine *sm_session_engine(sm_session *s) { return s->e; }
sm_seq *sm_session_seq(sm_session *s) { return s->s; }

void sm_session_reset(sm_session *s) {
  sm_seq_truncate(s->e, s->s, 0);
  if (s->d) sm_seq_truncate(s->de, s->d, 0);
}

/* Keep the common prefix (at most keep_max tokens; images compared by content) and append the rest of
 * ids with the images of spans after it; *kept: tokens kept. */
static smelt_status sync_tokens(sm_engine *e, sm_seq *q, const int32_t *ids, int n, int keep_max,
                                const sm_mm_span *spans, int n_spans, int *kept) {
  int keep = SM_MIN(sm_seq_common_prefix(q, ids, n, spans, n_spans), keep_max);
  int first = 0; /* the spans not kept */
  while (first < n_spans && spans[first].t1 <= keep) first++;
  if (first < n_spans && spans[first].t0 < keep) keep = spans[first].t0;
  smelt_status st = sm_seq_truncate(e, q, keep);
  if (!st) st = sm_seq_append(e, q, ids + keep, n - keep);
  if (!st && first < n_spans) st = sm_seq_set_media(e, q, spans + first, n_spans - first);
  if (kept) *kept = keep;
  return st;
}

static bool is_eos(const smelt_model *m, int32_t t) {
  for (int i = 0; i < m->cfg.n_eos; i++)
    if (m->cfg.eos_ids[i] == t) return true;
  return false;
}

/* Compute the pending tokens of the target sequence: the last step samples the first token with
 * smp (*first), or, speculative, leaves the logits after the last token in s->lg row 0. */
static smelt_status prefill(sm_session *s, sm_sampler *smp, const sm_session_opts *o, int32_t *first, bool *cancelled) {
  const int total = sm_seq_pending(s->s);
  smelt_status st = SMELT_OK;
  uint8_t done = 0;
  *cancelled = false;
  while (!st && !done) {
    if (o && o->cancelled && o->cancelled(o->ud)) {
      *cancelled = true;
      /* keep what was computed; the rest of the prompt was never seen */
      return sm_seq_truncate(s->e, s->s, sm_seq_len(s->s) - sm_seq_pending(s->s));
    }
    if (s->lg) st = sm_engine_step(s->e, &s->s, 1, s->lg, &done);
    else st = sm_engine_step_sample(s->e, &s->s, 1, &smp, first, NULL, &done);
    if (!st && o && o->on_prefill) o->on_prefill(o->ud, total - sm_seq_pending(s->s), total);
  }
  return st;
}

typedef struct {
  const smelt_model *m;
  const sm_session_opts *o;
  sm_detok *dt;
  int n_gen, max_new;
  bool ctx_limited, cb_stop;
  sm_stop stop;
} sess_emit;

static bool emit_tok(void *ud, int32_t tok) {
  sess_emit *g = ud;
  const sm_session_opts *o = g->o;
  g->n_gen++;
  if (!o->ignore_eos && is_eos(g->m, tok)) {
    g->stop = SM_STOP_EOS;
    return false;
  }
  char *piece = NULL;
  size_t len = sm_detok_push(g->dt, tok, &piece);
  bool go = !(len && o->on_piece && !o->on_piece(piece, len, o->user));
  free(piece);
  if (!go) {
    g->stop = SM_STOP_CANCELLED;
    g->cb_stop = true;
    return false;
  }
  if (o->cancelled && o->cancelled(o->ud)) {
    g->stop = SM_STOP_CANCELLED;
    return false;
  }
  if (g->n_gen >= g->max_new) {
    g->stop = g->ctx_limited ? SM_STOP_CONTEXT : SM_STOP_LENGTH;
    return false;
  }
  return true;
}

static smelt_status run(sm_session *s, const int32_t *ids, int n, const sm_mm_span *spans, int n_spans,
                        const sm_session_opts *o, sm_session_stats *stats, bool generate) {
  sm_session_stats local;
  if (!stats) stats = &local;
  memset(stats, 0, sizeof *stats);
  sm_session_opts defo;
  if (!o) {
    memset(&defo, 0, sizeof defo);
    o = &defo;
  }
  if (n <= 0) return sm_err(SMELT_ERR_INVALID, "empty prompt");
  if (generate ? n >= s->ctx : n > s->ctx)
    return sm_err(SMELT_ERR_LIMIT, "prompt of %d tokens does not fit the context size %d%s", n, s->ctx,
                  generate ? " (with room for a reply)" : "");
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= s->m->cfg.vocab_size)
      return sm_err(SMELT_ERR_INVALID, "token id %d out of range (vocab %d)", ids[i], s->m->cfg.vocab_size);
  stats->st.n_prompt = n;
  double t0 = sm_now();
  /* at least the last prompt token is computed again: its logits give the first token */
  int keep = 0;
  if (n_spans && s->d) return sm_err(SMELT_ERR_UNSUPPORTED, "speculative decoding with images is not supported");
  smelt_status st = sync_tokens(s->e, s->s, ids, n, n - 1, spans, n_spans, &keep);
  if (!st && s->d) st = sync_tokens(s->de, s->d, ids, n, n - 1, NULL, 0, NULL);
  if (st) return st;
  /* what is really reused (a hybrid model may have rewound past the common prefix) */
  stats->n_reused = keep = sm_seq_len(s->s) - sm_seq_pending(s->s);
  smelt_sampling def;
  smelt_sampling_default(&def);
  if (!generate) def.temperature = 0;
  sm_sampler smp;
  sm_sampler_init(&smp, generate && o->sampling ? o->sampling : &def, s->m->cfg.vocab_size);
  int32_t first = -1;
  bool cancelled = false;
  st = prefill(s, &smp, o, &first, &cancelled);
  stats->n_prefilled = (sm_seq_len(s->s) - sm_seq_pending(s->s)) - keep;
  if (!st && !cancelled) sm_seq_checkpoint(s->e, s->s); /* hybrid models: the next turn may rewind to here */
  double t1 = sm_now();
  stats->st.prefill_s = t1 - t0;
  if (st || cancelled || !generate) {
    if (cancelled) stats->stop = SM_STOP_CANCELLED;
    sm_sampler_free(&smp);
    stats->st.peak_rss = sm_peak_rss();
    return st;
  }
  sess_emit g = {.m = s->m, .o = o, .dt = sm_detok_new(s->m->tok, true)};
  g.max_new = s->ctx - n;
  g.ctx_limited = true;
  if (o->max_tokens >= 0 && o->max_tokens <= g.max_new) {
    g.max_new = o->max_tokens;
    g.ctx_limited = false;
  }
  if (g.max_new <= 0) {
    /* nothing to generate: the sequence holds exactly the prompt */
  } else if (s->d) {
    st = sm_spec_decode(s->e, s->s, s->de, s->d, s->n_draft, g.max_new, &smp, s->lg, emit_tok, &g, &stats->n_accepted);
  } else if (emit_tok(&g, first)) {
    st = sm_engine_decode(s->e, s->s, &smp, first, g.max_new - 1, emit_tok, &g, NULL);
  }
  char *rest = NULL;
  size_t len = sm_detok_flush(g.dt, &rest);
  if (len && o->on_piece && !g.cb_stop) o->on_piece(rest, len, o->user);
  free(rest);
  sm_detok_free(g.dt);
  sm_sampler_free(&smp);
  stats->st.n_generated = g.n_gen;
  stats->stop = g.stop;
  stats->st.stop_reason = g.stop == SM_STOP_EOS || g.stop == SM_STOP_CANCELLED;
  stats->st.decode_s = sm_now() - t1;
  stats->st.peak_rss = sm_peak_rss();
  return st;
}

smelt_status sm_session_generate(sm_session *s, const int32_t *ids, int n, const sm_session_opts *o,
                                 sm_session_stats *stats) {
  return sm_session_generate_mm(s, ids, n, NULL, 0, o, stats);
}

smelt_status sm_session_generate_mm(sm_session *s, const int32_t *ids, int n, const sm_mm_span *spans, int n_spans,
                                    const sm_session_opts *o, sm_session_stats *stats) {
  if (!s->m->tok) return sm_err(SMELT_ERR_INVALID, "model has no tokenizer.json; cannot detokenize");
  return run(s, ids, n, spans, n_spans, o, stats, true);
}

smelt_status sm_session_prefill(sm_session *s, const int32_t *ids, int n, const sm_session_opts *o,
                                sm_session_stats *stats) {
  return run(s, ids, n, NULL, 0, o, stats, false);
}

smelt_status sm_session_measure_decode(sm_session *s, int steps, double *tok_per_s) {
  *tok_per_s = 0;
  sm_session_reset(s);
  if (steps < 1 || steps + 2 > s->ctx) return SMELT_OK;
  smelt_sampling sp;
  smelt_sampling_default(&sp);
  sp.temperature = 0;
  sm_sampler smp;
  sm_sampler_init(&smp, &sp, s->m->cfg.vocab_size);
  sm_sampler *p = &smp;
  int32_t tok = s->m->cfg.bos_id >= 0 && s->m->cfg.bos_id < s->m->cfg.vocab_size ? s->m->cfg.bos_id : 0;
  smelt_status st = SMELT_OK;
  double t0 = 0;
  for (int i = 0; !st && i <= steps; i++) {
    if (i == 1) t0 = sm_now(); /* the first step warms up */
    uint8_t done = 0;
    if (!(st = sm_seq_append(s->e, s->s, &tok, 1)))
      while (!st && !done) st = sm_engine_step_sample(s->e, &s->s, 1, &p, &tok, NULL, &done);
  }
  double dt = sm_now() - t0;
  if (!st && dt > 0) *tok_per_s = steps / dt;
  sm_sampler_free(&smp);
  sm_session_reset(s);
  return st;
}
