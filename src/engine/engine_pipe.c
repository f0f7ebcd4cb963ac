/* The engine's pipelined steps (engine.h): a step queued on the device before the previous step's token
 * is read back, its input token fed there from that step's sample. sm_engine_decode pipelines one
 * sequence (the backend's sample_async / feed_token); the batch API (sm_engine_step_launch,
 * sm_engine_step_collect, the placeholders of sm_seq_append_fed) pipelines the server's steps. */
#include "engine/engine_int.h"
#include <stdlib.h>
#include <string.h>

smelt_status sm_eng_sample_launch(sm_engine *e, sm_seq **seqs, int n, const int *out_of, int n_out, sm_sampler **smp,
                                  int *ticket) {
  smelt_model *m = e->m;
  sm_backend *be = m->be;
  sm_sample_req *req = sm_xmalloc(sizeof(sm_sample_req) * (size_t)(n ? n : 1));
  int *map = sm_xmalloc(sizeof(int) * (size_t)(n ? n : 1));
  int nreq = 0;
  smelt_status st = SMELT_OK;
  for (int i = 0; i < n && !st; i++) {
    map[i] = -1;
    if (out_of[i] < 0) continue;
    if (!smp[i]) {
      st = sm_err(SMELT_ERR_INVALID, "step_launch: sequence %d has no sampler", i);
      break;
    }
    sm_sampler_prepare(smp[i], sm_seq_tokens(seqs[i]), sm_seq_len(seqs[i]), &req[nreq]);
    req[nreq].row = out_of[i];
    map[i] = nreq++;
  }
  int slot = -1;
  if (!st) st = be->sample_batch_async(be, m->logits, n_out, m->cfg.vocab_size, req, nreq, &slot);
  if (!st) {
    if (n > e->pl_cap[slot]) {
      e->pl_cap[slot] = SM_MAX(n, 2 * e->pl_cap[slot]);
      e->pl_req[slot] = sm_xrealloc(e->pl_req[slot], sizeof(int) * (size_t)e->pl_cap[slot]);
      e->pl_tok[slot] = sm_xrealloc(e->pl_tok[slot], sizeof(int32_t) * (size_t)e->pl_cap[slot]);
    }
    if (n) memcpy(e->pl_req[slot], map, sizeof(int) * (size_t)n);
    e->pl_n[slot] = n;
    e->pl_last = slot;
    *ticket = slot;
  }
  free(req);
  free(map);
  return st;
}

bool sm_engine_batch_pipeline(const sm_engine *e) {
  const sm_backend *be = e->m->be;
  /* hybrid models: a dropped step would have advanced the recurrent state; split models: the other
   * ranks do not see the fed tokens */
  return be->sample_batch_async && be->sample_batch_wait && e->p.pipeline && (be->async || e->p.pipeline_always) &&
         !e->p.host_sample && !e->rec && !e->m->tp;
}

smelt_status sm_engine_step_launch(sm_engine *e, sm_seq **seqs, int n, sm_sampler **smp, uint8_t *done, int *ticket) {
  if (!ticket || (n > 0 && (!smp || !done))) return sm_err(SMELT_ERR_INVALID, "step_launch: arguments missing");
  if (!sm_engine_batch_pipeline(e)) return sm_err(SMELT_ERR_UNSUPPORTED, "step_launch: no pipelined batch steps here");
  *ticket = -1;
  return sm_eng_step(e, seqs, n, NULL, done, NULL, smp, NULL, ticket);
}

smelt_status sm_engine_step_collect(sm_engine *e, int ticket, int32_t *tokens) {
  if (ticket < 0 || ticket > 1) return sm_err(SMELT_ERR_INVALID, "step_collect: ticket %d", ticket);
  sm_backend *be = e->m->be;
  smelt_status st = be->sample_batch_wait(be, ticket, e->pl_tok[ticket]);
  if (st) return st;
  const int *map = e->pl_req[ticket];
  for (int i = 0; i < e->pl_n[ticket]; i++)
    if (map[i] >= 0) tokens[i] = e->pl_tok[ticket][map[i]];
  return SMELT_OK;
}

smelt_status sm_seq_append_fed(sm_engine *e, sm_seq *s, int row) {
  if (s->fed_pos >= 0 || s->n_done != s->n_tok || s->mm || row < 0)
    return sm_err(SMELT_ERR_INVALID, "a fed token needs a computed sequence of text without one");
  const int32_t ph = 0;
  smelt_status st = sm_seq_append(e, s, &ph, 1);
  if (st) return st;
  s->fed_pos = s->n_tok - 1;
  s->fed_row = row;
  return SMELT_OK;
}

bool sm_seq_fed(const sm_seq *s) { return s->fed_pos >= 0; }

void sm_seq_set_fed(sm_engine *e, sm_seq *s, int32_t tok) {
  if (s->fed_pos < 0) return;
  s->tok[s->fed_pos] = tok;
  s->fed_pos = -1;
  sm_eng_register_full(e, s);
}

/* ---- pipelined single-sequence decode ---- */

/* One decode step of s (exactly one pending token) with the token sampled by the backend's
 * sample_async: when feed, the pending token is a placeholder the backend replaces on the
 * device by the previous sample_async result. *slot: where sample_wait finds this one. */
static smelt_status launch_async(sm_engine *e, sm_seq *s, sm_sampler *smp, bool feed, int *slot) {
  int bs = e->p.block_size;
  int p = s->n_done;
  int nb = (p + 1 + bs - 1) / bs;
  if (nb > s->n_blk) {
    if (e->n_free + e->n_cached < nb - s->n_blk) return sm_err(SMELT_ERR_OOM, "KV cache full");
    while (s->n_blk < nb) s->blk[s->n_blk++] = sm_eng_block_alloc(e);
  }
  if (e->b_cap < 1) {
    e->b_cap = 1;
    e->b_tok = sm_xrealloc(e->b_tok, sizeof(int32_t));
    e->b_pos = sm_xrealloc(e->b_pos, sizeof(int32_t));
    e->b_seq = sm_xrealloc(e->b_seq, sizeof(int32_t));
    e->b_out = sm_xrealloc(e->b_out, sizeof(int32_t));
    e->b_feed = sm_xrealloc(e->b_feed, sizeof(int32_t));
  }
  if (e->max_blocks > e->b_table_cap) {
    e->b_table_cap = e->max_blocks;
    e->b_table = sm_xrealloc(e->b_table, sizeof(int32_t) * (size_t)e->b_table_cap);
  }
  memcpy(e->b_table, s->blk, sizeof(int32_t) * (size_t)s->n_blk);
  e->b_tok[0] = s->tok[p];
  e->b_pos[0] = p;
  e->b_seq[0] = 0;
  e->b_out[0] = 0;
  sm_batch b = {.n_tokens = 1,
                .tokens = e->b_tok,
                .pos = e->b_pos,
                .seq = e->b_seq,
                .n_seqs = 1,
                .max_blocks = e->max_blocks,
                .block_table = e->b_table,
                .n_out = 1,
                .out_rows = e->b_out,
                .feed_token = feed};
  smelt_status st = sm_model_forward(e->m, &e->kv, &b, NULL);
  if (st) return st;
  s->n_done++;
  sm_sample_req req;
  /* the history's last token may be the placeholder: only samplers without penalties get here */
  sm_sampler_prepare(smp, s->tok, s->n_tok, &req);
  sm_backend *be = e->m->be;
  if ((st = be->sample_async(be, e->m->logits, 1, e->m->cfg.vocab_size, &req, slot))) s->n_done--;
  return st;
}

static bool pipeline_ok(const sm_engine *e, const sm_sampler *smp) {
  const sm_backend *be = e->m->be;
  if (!e->p.pipeline) return false;
  /* hybrid models: the dropped last step would have advanced the recurrent state */
  return be->sample_async && be->sample_wait && !e->p.prefix_cache && !e->p.host_sample &&
         sm_sampler_history_free(smp) && !e->rec;
}

smelt_status sm_engine_decode(sm_engine *e, sm_seq *s, sm_sampler *smp, int32_t first, int max_new,
                              bool (*emit)(void *ud, int32_t tok), void *ud, int *n_new) {
  int n = 0;
  if (n_new) *n_new = 0;
  if (sm_seq_pending(s) != 0) return sm_err(SMELT_ERR_INVALID, "decode: the sequence has pending tokens");
  if (max_new <= 0) return SMELT_OK;
  smelt_status st = sm_seq_append(e, s, &first, 1);
  if (st) return st;
  if (!pipeline_ok(e, smp) || s->mm) { /* one step at a time */
    while (n < max_new) {
      uint8_t done = 0;
      int32_t t = -1;
      while (!done)
        if ((st = sm_engine_step_sample(e, &s, 1, &smp, &t, NULL, &done))) return st;
      n++;
      if (n_new) *n_new = n;
      if (!emit(ud, t) || n == max_new) break;
      if ((st = sm_seq_append(e, s, &t, 1))) return st;
    }
    return SMELT_OK;
  }
  /* step k+1 is launched (its input token fed from step k's sample on the device) before
   * token k is read back; when token k ends the run, step k+1 is dropped (truncate) */
  sm_backend *be = e->m->be;
  int sa = -1, sb = -1;
  st = launch_async(e, s, smp, false, &sa);
  while (!st) {
    const int32_t ph = 0;
    bool spec = n + 1 < max_new && s->n_tok < e->p.max_context;
    uint64_t rng[4]; /* the generator before the speculative step's draw (restored if it is dropped) */
    memcpy(rng, smp->rng, sizeof rng);
    if (spec && (st = sm_seq_append(e, s, &ph, 1))) break;
    if (spec && (st = launch_async(e, s, smp, true, &sb))) {
      s->n_tok--; /* placeholder never computed */
      break;
    }
    int32_t t = -1;
    st = be->sample_wait(be, sa, &t);
    sa = -1;
    if (st) break;
    if (spec) s->tok[s->n_tok - 1] = t;
    n++;
    if (n_new) *n_new = n;
    const bool go = emit(ud, t) && n < max_new;
    if (!go || !spec) {
      if (spec) {
        int32_t dummy;
        st = be->sample_wait(be, sb, &dummy);
        sb = -1;
        memcpy(smp->rng, rng, sizeof rng);
        smelt_status st2 = sm_seq_truncate(e, s, s->n_tok - 1);
        if (!st) st = st2;
      } else if (go) { /* context full: the stepwise loop's append fails the same way */
        st = sm_seq_append(e, s, &t, 1);
      }
      break;
    }
    sa = sb;
    sb = -1;
  }
  int32_t dummy;
  if (sa >= 0) be->sample_wait(be, sa, &dummy);
  if (sb >= 0) be->sample_wait(be, sb, &dummy);
  return st;
}
