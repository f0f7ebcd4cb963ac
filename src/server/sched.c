/* The scheduler of `smelt serve`: job lifecycle, admission, preemption and the engine thread
 * (see sched.h). */
#include "server/sched_int.h"
#include "server/pcache.h"
#include "server/sched_masks.h"
#include "server/spec.h"
#include "vision/vision.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

static atomic_uint_fast64_t g_next_id;

static void job_free(sm_job *j) {
  for (int i = 0; i < j->n; i++) {
    sm_choice *c = &j->ch[i];
    if (c->sampler_ok) sm_sampler_free(&c->sampler);
    if (c->detok) sm_detok_free(c->detok);
    sm_grammar_state_free(c->gs);
    free(c->mask);
    free(c->gen);
    sm_buf_free(&c->text);
    for (int k = 0; k < c->n_toks; k++) {
      free(c->toks[k].top_ids);
      free(c->toks[k].top_lps);
    }
    free(c->toks);
    free(c->args_sent);
  }
  free(j->ch);
  free(j->emb);
  free(j->slot_file);
  sm_grammar_free(j->grammar);
  free(j->prompt);
  for (int i = 0; i < j->n_spans; i++) sm_vimage_unref(j->spans[i].img);
  free(j->spans);
  sm_api_request_free(&j->req);
  pthread_cond_destroy(&j->cv);
  free(j);
}

void sm_job_unref(sm_sched *s, sm_job *j) {
  (void)s;
  if (--j->refs == 0) job_free(j);
}

/* under mu: the job's text or state changed */
static void job_signal(sm_job *j) {
  pthread_cond_broadcast(&j->cv);
  if (j->notify) j->notify(j->notify_arg);
}

static bool is_eos(const sm_sched *s, int32_t t) {
  for (int i = 0; i < s->n_eos; i++)
    if (s->eos[i] == t) return true;
  return false;
}


/* under mu: the lowest free slot for choice c (GET /slots, POST /slots/{id}) */
static void take_slot(sm_sched *s, sm_choice *c) {
  c->slot = -1;
  for (int i = 0; i < s->parallel; i++)
    if (!s->slot_busy[i]) {
      s->slot_busy[i] = true;
      c->slot = i;
      return;
    }
}

/* under mu: choice c's sequence ends; with record, its slot keeps the sequence's tokens (what a
 * slot save writes) */
static void drop_seq(sm_sched *s, sm_choice *c, bool record) {
  sm_spec_drop(s, c);
  if (c->seq) {
    if (record && c->slot >= 0) {
      int n = sm_seq_len(c->seq);
      s->slot_tok[c->slot] = sm_xrealloc(s->slot_tok[c->slot], sizeof(int32_t) * (size_t)(n ? n : 1));
      if (n) memcpy(s->slot_tok[c->slot], sm_seq_tokens(c->seq), sizeof(int32_t) * (size_t)n);
      s->slot_n[c->slot] = n;
    }
    sm_seq_free(s->eng, c->seq);
    c->seq = NULL;
    s->active_seqs--;
  }
  if (c->slot >= 0) s->slot_busy[c->slot] = false;
  c->slot = -1;
}

static void release_seqs(sm_sched *s, sm_job *j, bool record) {
  for (int i = 0; i < j->n; i++) drop_seq(s, &j->ch[i], record);
}

static void remove_active(sm_sched *s, sm_job *j) {
  for (int i = 0; i < s->n_active; i++)
    if (s->active[i] == j) {
      memmove(s->active + i, s->active + i + 1, sizeof(sm_job *) * (size_t)(s->n_active - i - 1));
      s->n_active--;
      break;
    }
  j->active = false;
}

/* under mu: the job is complete (all choices finished) or failed; leaves the engine */
void sm_sched_job_finish(sm_sched *s, sm_job *j) {
  release_seqs(s, j, true);
  if (j->active) remove_active(s, j);
  j->done = true;
  uint64_t gen = 0;
  for (int i = 0; i < j->n; i++) gen += (uint64_t)j->ch[i].n_gen;
  if (j->cancelled) sm_metrics_cancel(s->metrics);
  if (!j->failed && !j->cancelled) sm_metrics_tokens(s->metrics, (uint64_t)j->n_prompt, gen, (uint64_t)j->n_cached);
  job_signal(j);
  sm_job_unref(s, j); /* the engine's reference */
}

void sm_sched_job_fail(sm_sched *s, sm_job *j, int status, const char *msg) {
  j->failed = true;
  j->fail_status = status;
  snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
  sm_sched_job_finish(s, j);
}

static void update_safe(sm_sched *s, sm_job *j, sm_choice *c) {
  (void)s;
  if (c->finish) {
    c->safe = c->text.n;
    return;
  }
  size_t safe = c->text.n - sm_stop_holdback(c->text.p, c->text.n, j->req.stop, j->req.n_stop);
  if (safe > c->safe) c->safe = safe;
}

/* a request reused n tokens of ids from the prefix cache */
static void note_hot(sm_sched *s, const int32_t *ids, int n) {
  if (n <= s->n_hot) return;
  s->hot = sm_xrealloc(s->hot, sizeof(int32_t) * (size_t)n);
  memcpy(s->hot, ids, sizeof(int32_t) * (size_t)n);
  s->n_hot = n;
}

/* under mu: start (or restart after preemption) a job's sequences */
static bool admit(sm_sched *s, sm_job *j) {
  sm_engine *e = s->eng;
  if (!j->started) {
    for (int i = 0; i < j->n; i++) {
      sm_choice *c = &j->ch[i];
      smelt_sampling sp = j->req.sampling;
      sp.seed = j->req.has_seed ? (sm_mix64(j->req.seed + (uint64_t)i) | 1) : 0;
      sm_sampler_init(&c->sampler, &sp, s->vocab);
      c->sampler.bias_ids = j->req.bias_ids;
      c->sampler.bias_vals = j->req.bias_vals;
      c->sampler.n_bias = j->req.n_bias;
      c->sampler_ok = true;
      take_slot(s, c); /* forked choices too: their sequences are reserved */
      c->detok = sm_detok_new(s->tok, !j->keep_special);
      if (j->grammar) {
        c->gs = sm_grammar_state_new(j->grammar, sm_sched_grammar_vocab(s));
        sm_grammar_state_set_cache(c->gs, s->gcache);
        c->mask = sm_xmalloc(sizeof(uint32_t) * (size_t)((s->vocab + 31) / 32));
        c->sampler.mask = c->mask;
      }
    }
    if (j->per_prompt) { /* several prompts: a sequence of its own for each choice */
      j->n_cached = 0;
      for (int i = 0; i < j->n; i++) {
        sm_choice *c = &j->ch[i];
        sm_seq *q = sm_seq_new(e);
        if (!q) return false;
        if (sm_seq_append(e, q, j->prompt + c->p_off, c->p_len) != SMELT_OK) {
          sm_seq_free(e, q);
          return false;
        }
        int reused = sm_seq_use_prefix_cache(e, q);
        note_hot(s, j->prompt + c->p_off, reused);
        j->n_cached += reused;
        c->seq = q;
        s->active_seqs++;
      }
      j->started = true;
      goto admitted;
    }
    sm_seq *q = sm_seq_new(e);
    if (!q) return false;
    if (sm_seq_append(e, q, j->prompt, j->n_prompt) != SMELT_OK ||
        sm_seq_set_media(e, q, j->spans, j->n_spans) != SMELT_OK) {
      sm_seq_free(e, q);
      return false;
    }
    j->n_cached = sm_seq_use_prefix_cache(e, q);
    note_hot(s, j->prompt, j->n_cached);
    j->ch[0].seq = q;
    s->active_seqs++;
    j->fork_pending = j->n > 1;
    if (j->fork_pending) s->active_seqs += j->n - 1; /* reserved for the forks */
    j->started = true;
  } else {
    for (int i = 0; i < j->n; i++) {
      sm_choice *c = &j->ch[i];
      if (c->finish || c->seq) continue;
      sm_seq *q = sm_seq_new(e);
      if (!q) return false;
      take_slot(s, c);
      const int32_t *pp = j->per_prompt ? j->prompt + c->p_off : j->prompt;
      int pn = j->per_prompt ? c->p_len : j->n_prompt;
      if (sm_seq_append(e, q, pp, pn) != SMELT_OK || (c->n_gen && sm_seq_append(e, q, c->gen, c->n_gen) != SMELT_OK) ||
          (!j->per_prompt && sm_seq_set_media(e, q, j->spans, j->n_spans) != SMELT_OK)) {
        sm_seq_free(e, q);
        return false;
      }
      sm_seq_use_prefix_cache(e, q);
      c->seq = q;
      s->active_seqs++;
    }
  }
admitted:
  j->active = true;
  s->active = sm_xrealloc(s->active, sizeof(sm_job *) * (size_t)(s->n_active + 1));
  s->active[s->n_active++] = j;
  return true;
}

/* under mu (released while computing): an embeddings job runs at once, input by input */
static void run_embeddings(sm_sched *s, sm_job *j) {
  smelt_model *m = sm_engine_model(s->eng);
  int D = m->cfg.hidden_size;
  float *emb = sm_xmalloc(sizeof(float) * (size_t)D * (size_t)j->n);
  pthread_mutex_unlock(&s->mu);
  smelt_status st = SMELT_OK;
  char msg[256] = "";
  for (int i = 0; i < j->n && !st; i++)
    st = sm_engine_embed(s->eng, j->prompt + j->ch[i].p_off, j->ch[i].p_len, (sm_pooling)j->pooling,
                         emb + (size_t)i * D);
  if (st) snprintf(msg, sizeof msg, "embeddings failed: %s", sm_errmsg());
  pthread_mutex_lock(&s->mu);
  if (st) {
    free(emb);
    sm_sched_job_fail(s, j, st == SMELT_ERR_OOM ? 503 : 500, msg);
    return;
  }
  j->emb = emb;
  j->emb_dim = D;
  for (int i = 0; i < j->n; i++) j->ch[i].finish = SM_FIN_STOP;
  sm_sched_job_finish(s, j);
}

/* under mu (released for the file): a slot action, at once */
static void run_slot_op(sm_sched *s, sm_job *j) {
  const int id = j->slot_id;
  if (id < 0 || id >= s->parallel) { /* checked by the HTTP side */
    sm_sched_job_fail(s, j, 400, "no such slot");
    return;
  }
  if (j->slot_op != SM_SLOT_SAVE && s->slot_busy[id]) {
    char msg[64];
    snprintf(msg, sizeof msg, "slot %d is busy", id);
    sm_sched_job_fail(s, j, 503, msg);
    return;
  }
  if (j->slot_op == SM_SLOT_ERASE) {
    j->slot_tokens = s->slot_n[id];
    s->slot_n[id] = 0;
    sm_sched_job_finish(s, j);
    return;
  }
  const double t0 = sm_now();
  smelt_status st;
  char msg[sizeof j->errmsg];
  int32_t *tok = NULL;
  int n = 0;
  if (j->slot_op == SM_SLOT_SAVE) {
    n = s->slot_n[id];
    tok = sm_xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (n) memcpy(tok, s->slot_tok[id], sizeof(int32_t) * (size_t)n);
    pthread_mutex_unlock(&s->mu);
    st = sm_pcache_slot_save(s->eng, tok, n, j->slot_file, &j->slot_tokens, &j->slot_bytes, msg, sizeof msg);
    free(tok);
    pthread_mutex_lock(&s->mu);
  } else {
    pthread_mutex_unlock(&s->mu);
    st = sm_pcache_slot_restore(s->eng, j->slot_file, &tok, &n, &j->slot_bytes, msg, sizeof msg);
    pthread_mutex_lock(&s->mu);
    if (!st) {
      free(s->slot_tok[id]);
      s->slot_tok[id] = tok;
      s->slot_n[id] = n;
      j->slot_tokens = n;
    }
  }
  j->slot_ms = (sm_now() - t0) * 1000;
  if (st) sm_sched_job_fail(s, j, st == SMELT_ERR_OOM ? 503 : st == SMELT_ERR_IO ? 500 : 400, msg);
  else sm_sched_job_finish(s, j);
}

/* under mu: requeue the newest active job (KV exhausted) */
void sm_sched_preempt_newest(sm_sched *s) {
  sm_job *nj = NULL;
  for (int i = 0; i < s->n_active; i++)
    if (!nj || s->active[i]->seq_no > nj->seq_no) nj = s->active[i];
  if (!nj) return;
  if (s->n_active == 1) {
    /* alone and still out of memory: the cache cannot hold this request */
    bool any_gen = false;
    for (int i = 0; i < nj->n; i++) any_gen |= nj->ch[i].n_gen > 0;
    if (!any_gen) {
      sm_sched_job_fail(s, nj, 400, "the prompt does not fit in the KV cache");
      return;
    }
    for (int i = 0; i < nj->n; i++) {
      sm_choice *c = &nj->ch[i];
      if (!c->finish) {
        c->finish = SM_FIN_LENGTH;
        update_safe(s, nj, c);
      }
    }
    sm_sched_job_finish(s, nj);
    return;
  }
  /* the reserved fork slots are given back with the sequences */
  if (nj->fork_pending) {
    s->active_seqs -= nj->n - 1;
    nj->fork_pending = false;
  }
  release_seqs(s, nj, false);
  remove_active(s, nj);
  nj->queued = true;
  nj->next = s->qhead;
  s->qhead = nj;
  if (!s->qtail) s->qtail = nj;
  s->n_queued++;
  s->admit_blocked = true;
  sm_metrics_preempt(s->metrics);
}

/* mu NOT held: the choice cannot go on (its sequence is full) */
static void end_choice(sm_sched *s, sm_job *j, sm_choice *c) {
  pthread_mutex_lock(&s->mu);
  if (!c->finish) c->finish = SM_FIN_LENGTH;
  update_safe(s, j, c);
  job_signal(j);
  pthread_mutex_unlock(&s->mu);
}

/* a token in three parts (sched_int.h) */
int32_t sm_sched_tok_prepare(sm_sched *s, sm_job *j, int ci, float *row, int32_t tok, float *lpbuf, int32_t *topbuf,
                             int hist, sm_tokpub *p) {
  sm_choice *c = &j->ch[ci];
  memset(p, 0, sizeof *p);
  if (row && j->req.logprobs) sm_log_softmax(row, s->vocab, lpbuf);
  if (row) {
    sm_choice_ensure_mask(s, c);
    tok = sm_sampler_sample(&c->sampler, row, sm_seq_tokens(c->seq), hist < 0 ? sm_seq_len(c->seq) : hist);
  }
  if (tok < 0 || tok >= s->vocab) tok = s->n_eos ? s->eos[0] : 0;
  bool refused = false;
  if (c->gs) {
    c->mask_ok = false;
    /* a token outside the grammar (only when nothing may follow, see sm_choice_ensure_mask) ends the choice */
    if (sm_grammar_accept(c->gs, tok) != SMELT_OK) p->grammar_end = refused = true;
    else p->grammar_end = sm_grammar_finished(c->gs);
  }
  p->rec.id = tok;
  if (row && j->req.logprobs) {
    p->rec.lp = lpbuf[tok];
    int k = j->req.top_logprobs;
    if (k > 0) {
      sm_top_n(lpbuf, s->vocab, k, topbuf);
      p->rec.ntop = k;
      p->rec.top_ids = sm_xmalloc(sizeof(int32_t) * (size_t)k);
      p->rec.top_lps = sm_xmalloc(sizeof(float) * (size_t)k);
      for (int i = 0; i < k; i++) {
        p->rec.top_ids[i] = topbuf[i];
        p->rec.top_lps[i] = lpbuf[topbuf[i]];
      }
    }
  }
  p->eos = !j->req.ignore_eos && is_eos(s, tok);
  if (!p->eos && !refused) p->plen = sm_detok_push(c->detok, tok, &p->piece);
  if (c->n_gen == c->cap_gen) {
    c->cap_gen = c->cap_gen ? c->cap_gen * 2 : 64;
    c->gen = sm_xrealloc(c->gen, sizeof(int32_t) * (size_t)c->cap_gen);
  }
  c->gen[c->n_gen++] = tok;
  p->at_len = c->n_gen >= j->max_tokens;
  if (p->eos || p->at_len || p->grammar_end) p->tlen = sm_detok_flush(c->detok, &p->tail);
  p->now = sm_now();
  return tok;
}

void sm_sched_tok_publish(sm_sched *s, sm_job *j, sm_choice *c, sm_tokpub *p) {
  if (!j->first_token) {
    j->first_token = true;
    sm_metrics_ttft(s->metrics, p->now - j->t_arrival);
  } else if (c->t_last > 0) {
    sm_metrics_itl(s->metrics, p->now - c->t_last);
  }
  c->t_last = p->now;
  size_t old_len = c->text.n;
  for (int part = 0; part < 2; part++) {
    const char *t = part ? p->tail : p->piece;
    size_t n = part ? p->tlen : p->plen;
    if (!t || !n || c->finish) continue;
    sm_buf_put(&c->text, t, n);
  }
  if (c->n_toks == c->cap_toks) {
    c->cap_toks = c->cap_toks ? c->cap_toks * 2 : 64;
    c->toks = sm_xrealloc(c->toks, sizeof(sm_tokrec) * (size_t)c->cap_toks);
  }
  p->rec.end = c->text.n;
  c->toks[c->n_toks++] = p->rec;
  if (j->req.n_stop) {
    size_t maxs = 0;
    for (int i = 0; i < j->req.n_stop; i++) maxs = SM_MAX(maxs, strlen(j->req.stop[i]));
    size_t from = old_len + 1 > maxs ? old_len + 1 - maxs : 0;
    long pos = sm_stop_find(c->text.p, c->text.n, from, j->req.stop, j->req.n_stop);
    if (pos >= 0) {
      for (int i = 0; i < j->req.n_stop && c->stop_hit < 0; i++)
        if (!strncmp(c->text.p + pos, j->req.stop[i], strlen(j->req.stop[i]))) c->stop_hit = i;
      c->text.n = (size_t)pos;
      c->text.p[c->text.n] = 0;
      for (int k = 0; k < c->n_toks; k++)
        if (c->toks[k].end > c->text.n) c->toks[k].end = c->text.n;
      c->finish = SM_FIN_STOP;
    }
  }
  if (!c->finish) {
    if (p->eos || p->grammar_end) c->finish = SM_FIN_STOP;
    else if (p->at_len) c->finish = SM_FIN_LENGTH;
  }
  update_safe(s, j, c);
  job_signal(j);
}

void sm_sched_tok_done(sm_sched *s, sm_job *j, sm_choice *c, sm_tokpub *p, bool append) {
  free(p->piece);
  free(p->tail);
  if (!c->finish && append) {
    smelt_status st = sm_seq_append(s->eng, c->seq, &p->rec.id, 1);
    if (st != SMELT_OK) end_choice(s, j, c);
  }
}

/* One token, all three parts; the choice goes on with it when append. Engine thread, mu NOT held. */
static int32_t process_token_at(sm_sched *s, sm_job *j, int ci, float *row, int32_t tok, float *lpbuf, int32_t *topbuf,
                                int hist, bool append) {
  sm_tokpub p;
  tok = sm_sched_tok_prepare(s, j, ci, row, tok, lpbuf, topbuf, hist, &p);
  pthread_mutex_lock(&s->mu);
  sm_sched_tok_publish(s, j, &j->ch[ci], &p);
  pthread_mutex_unlock(&s->mu);
  sm_sched_tok_done(s, j, &j->ch[ci], &p, append);
  return tok;
}

static void process_token(sm_sched *s, sm_job *j, int ci, float *row, int32_t tok, float *lpbuf, int32_t *topbuf) {
  process_token_at(s, j, ci, row, tok, lpbuf, topbuf, -1, true);
}

/* Speculative decoding: how many draft tokens choice c of j may have verified in this step (0:
 * none), at most budget; pmin: its draft probability floor */
static int spec_room(sm_sched *s, sm_job *j, sm_choice *c, int budget, float *pmin) {
  const int nmax = j->req.has_spec_n_max ? j->req.spec_n_max : s->spec.n_max;
  *pmin = j->req.has_spec_p_min ? j->req.spec_p_min : s->spec.p_min;
  /* constrained choices (the grammar state cannot be rolled back) and forked choices (their
   * sequences share KV blocks) are decoded one token a step */
  if (nmax <= 0 || c->gs || j->fork_pending || (j->n > 1 && !j->per_prompt) || c->n_gen == 0 ||
      sm_seq_pending(c->seq) != 1)
    return 0;
  int k = SM_MIN(nmax, j->max_tokens - c->n_gen - 1); /* the verified step emits up to k + 1 tokens */
  k = SM_MIN(k, sm_engine_max_context(s->eng) - sm_seq_len(c->seq));
  return SM_MAX(0, SM_MIN(k, budget));
}

/* Speculative decoding: sample choice ci of j along its verified rows (row r follows the draft
 * tokens prop[0..r)), keeping draft tokens while they equal the samples; then the sequence keeps
 * the accepted tokens and gets the last sample appended (what one-token steps would have left).
 * Returns the draft tokens accepted. */
static int spec_verify(sm_sched *s, sm_job *j, int ci, float *rows, int nrows, const int32_t *prop, int np,
                       float *lpbuf, int32_t *topbuf) {
  sm_choice *c = &j->ch[ci];
  const int base = sm_seq_len(c->seq) - np; /* up to the last token emitted before this step */
  int r = 0, acc = 0;
  int32_t tok = -1;
  if (nrows <= 0) return 0;
  for (; r < nrows; r++) {
    tok = process_token_at(s, j, ci, rows + (size_t)r * (size_t)s->vocab, -1, lpbuf, topbuf, base + r, false);
    const bool match = r < np && tok == prop[r];
    acc += match;
    if (c->finish || !match) break;
  }
  if (r == nrows) r = nrows - 1;
  if (sm_seq_truncate(s->eng, c->seq, base + r) != SMELT_OK ||
      (!c->finish && sm_seq_append(s->eng, c->seq, &tok, 1) != SMELT_OK))
    end_choice(s, j, c);
  return acc;
}


static void *engine_main(void *arg) {
  sm_sched *s = arg;
  int cap = s->parallel;
  float *logits = sm_xmalloc(sizeof(float) * (size_t)s->vocab * (size_t)cap);
  float *tmp = sm_xmalloc(sizeof(float) * (size_t)s->vocab);
  float *lpbuf = sm_xmalloc(sizeof(float) * (size_t)s->vocab);
  int32_t *topbuf = sm_xmalloc(sizeof(int32_t) * SM_API_MAX_TOP_LOGPROBS);
  sm_seq **seqs = sm_xmalloc(sizeof(sm_seq *) * (size_t)cap);
  sm_job **bjob = sm_xmalloc(sizeof(sm_job *) * (size_t)cap);
  int *bci = sm_xmalloc(sizeof(int) * (size_t)cap);
  uint8_t *done = sm_xmalloc((size_t)cap);
  sm_sampler **bsmp = sm_xmalloc(sizeof(sm_sampler *) * (size_t)cap); /* NULL: full logits row needed */
  int32_t *btok = sm_xmalloc(sizeof(int32_t) * (size_t)cap);
  /* speculative decoding: per batch entry its draft tokens and verified rows */
  const int pcap = s->spec.on ? SM_MAX(1, s->spec.n_max) : 1;
  int32_t *prop = sm_xmalloc(sizeof(int32_t) * (size_t)cap * (size_t)pcap);
  int *kmax = sm_xmalloc(sizeof(int) * (size_t)cap), *nprop = sm_xmalloc(sizeof(int) * (size_t)cap);
  int *row0 = sm_xmalloc(sizeof(int) * (size_t)cap), *nrows = sm_xmalloc(sizeof(int) * (size_t)cap);
  float *pmin = sm_xmalloc(sizeof(float) * (size_t)cap);
  uint8_t *all = sm_xmalloc((size_t)cap);
  sm_choice **bch = sm_xmalloc(sizeof(sm_choice *) * (size_t)cap);
  sm_step_masks *smk = sm_step_masks_new(s, cap);
  sm_tokpub *pub = sm_xmalloc(sizeof(sm_tokpub) * (size_t)cap); /* the step's backend-sampled tokens */
  int *pubk = sm_xmalloc(sizeof(int) * (size_t)cap);
  float *rows = NULL;
  size_t rows_cap = 0;
  sm_pipe pipe; /* pipelined steps (sched_pipe.c) */
  sm_pipe_init(&pipe, s, cap);

  pthread_mutex_lock(&s->mu);
  while (!s->stopping || sm_pipe_live(&pipe)) {
    /* a launch in flight is collected before anything that needs the engine idle */
    if (sm_pipe_live(&pipe) && (s->stopping || s->fail_pending || s->fatal ||
                                (s->qhead && (s->qhead->slot_op || s->qhead->req.kind == SM_EP_EMBEDDINGS)))) {
      sm_pipe_drain(s, &pipe);
      goto free_finished;
    }
    /* drop cancelled jobs (once no launch in flight holds their sequences) */
    for (int i = 0; i < s->n_active;) {
      sm_job *j = s->active[i];
      if (j->cancelled && !sm_job_inflight(j)) {
        if (j->fork_pending) {
          s->active_seqs -= j->n - 1;
          j->fork_pending = false;
        }
        sm_sched_job_finish(s, j);
      } else i++;
    }
    for (sm_job **pp = &s->qhead, *prev = NULL; *pp;) {
      sm_job *j = *pp;
      if (j->cancelled) {
        *pp = j->next;
        if (s->qtail == j) s->qtail = prev;
        s->n_queued--;
        j->queued = false;
        j->done = true;
        sm_metrics_cancel(s->metrics);
        job_signal(j);
        sm_job_unref(s, j);
      } else {
        prev = j;
        pp = &j->next;
      }
    }
    /* admit waiting jobs while sequence slots are free */
    if (s->n_active == 0) s->admit_blocked = false;
    if (s->fail_pending) {
      s->fail_pending = false;
      sm_sched_fail_all_now(s, s->fail_status, s->fail_msg);
    }
    if (s->fatal) sm_sched_fail_all_now(s, 500, s->fatal_msg);
    while (s->qhead && !s->admit_blocked) {
      sm_job *j = s->qhead;
      if (sm_pipe_live(&pipe) && (j->slot_op || j->req.kind == SM_EP_EMBEDDINGS)) break; /* after the collection */
      int need = 0;
      for (int i = 0; i < j->n && !j->slot_op; i++) need += !j->ch[i].finish;
      if (s->n_active > 0 && s->active_seqs + need > s->parallel) break;
      s->qhead = j->next;
      if (!s->qhead) s->qtail = NULL;
      s->n_queued--;
      j->queued = false;
      j->next = NULL;
      if (j->slot_op) {
        run_slot_op(s, j);
        continue;
      }
      if (j->req.kind == SM_EP_EMBEDDINGS) {
        run_embeddings(s, j);
        continue;
      }
      if (!admit(s, j)) {
        release_seqs(s, j, false);
        sm_sched_job_fail(s, j, 503, "could not allocate a sequence for the request");
      }
    }
    sm_engine_get_stats(s->eng, &s->stats);
    if (s->n_active == 0) {
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    /* one batch: every running choice of every active sm_job */
    int n = 0;
    for (int a = 0; a < s->n_active; a++) {
      sm_job *j = s->active[a];
      if (j->cancelled) continue; /* finished once its sequences leave the launch in flight */
      for (int i = 0; i < j->n && n < cap; i++)
        if (j->ch[i].seq && !j->ch[i].finish) {
          seqs[n] = j->ch[i].seq;
          bjob[n] = j;
          bci[n] = i;
          /* sampled on the backend unless the host needs the whole row: logprobs, or the
           * prompt row that the other choices of an n > 1 request are forked from */
          bsmp[n] = j->req.logprobs || (i == 0 && j->fork_pending) ? NULL : &j->ch[i].sampler;
          n++;
        }
    }
    /* jobs without running sequences (all finished) leave */
    for (int a = 0; a < s->n_active;) {
      sm_job *j = s->active[a];
      bool any = false;
      for (int i = 0; i < j->n; i++) any |= !j->ch[i].finish || j->ch[i].inflight;
      if (!any) sm_sched_job_finish(s, j);
      else a++;
    }
    if (n <= 0 && !sm_pipe_live(&pipe)) continue;
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; k < n; k++) bch[k] = &bjob[k]->ch[bci[k]];
    const int pr = sm_pipe_step(s, &pipe, n, seqs, bjob, bci, bch, bsmp);
    if (pr == SM_PIPE_LOCKED) goto free_finished;
    if (pr == SM_PIPE_RETRY) continue;
    memset(done, 0, (size_t)n);
    /* speculative decoding: draft tokens for the choices that may have them, within the step's
     * token budget (every sequence computes at least one token) */
    int n_drafted = 0;
    if (s->spec.on) {
      int budget = s->spec.budget - n;
      for (int k = 0; k < n; k++) {
        bch[k] = &bjob[k]->ch[bci[k]];
        kmax[k] = SM_MIN(pcap, spec_room(s, bjob[k], bch[k], budget, &pmin[k]));
        budget -= kmax[k];
      }
      sm_spec_propose(s, bch, kmax, pmin, n, prop, pcap, nprop);
      for (int k = 0; k < n; k++) {
        const int nmin = bjob[k]->req.has_spec_n_min ? bjob[k]->req.spec_n_min : s->spec.n_min;
        if (nprop[k] < nmin || (nprop[k] && sm_seq_append(s->eng, seqs[k], prop + (size_t)k * pcap, nprop[k])))
          nprop[k] = 0;
        all[k] = nprop[k] > 0;
        n_drafted += nprop[k];
      }
    }
    smelt_status st = SMELT_OK;
    if (n_drafted) { /* every row comes to the host: the drafted sequences' rows are verified there */
      size_t need = (size_t)(n + n_drafted) * (size_t)s->vocab;
      if (need > rows_cap) {
        free(rows);
        rows = sm_xmalloc(sizeof(float) * need);
        rows_cap = need;
      }
      sm_step_masks_build(smk, bch, n);
      st = sm_engine_step_rows(s->eng, seqs, n, all, rows, row0, nrows, done);
      if (st) { /* the drafts are not computed: back to the state before them, and a plain step */
        for (int k = 0; k < n; k++)
          if (nprop[k]) sm_seq_truncate(s->eng, seqs[k], sm_seq_len(seqs[k]) - nprop[k]);
        n_drafted = 0;
        memset(done, 0, (size_t)n);
      }
    }
    if (!n_drafted) { /* the grammar masks are built while the device runs the step */
      sm_step_masks_set(smk, bch, n);
      sm_engine_set_before_sample(s->eng, sm_step_masks_run, smk);
      st = sm_engine_step_sample(s->eng, seqs, n, bsmp, btok, logits, done);
      sm_engine_set_before_sample(s->eng, NULL, NULL);
    }
    if (st == SMELT_ERR_OOM) {
      pthread_mutex_lock(&s->mu);
      sm_sched_preempt_newest(s);
      continue;
    }
    if (st != SMELT_OK) {
      char msg[256];
      snprintf(msg, sizeof msg, "engine step failed: %s", sm_errmsg());
      fprintf(stderr, "smelt serve: %s\n", msg);
      pthread_mutex_lock(&s->mu);
      while (s->n_active) sm_sched_job_fail(s, s->active[0], 500, msg);
      continue;
    }
    char fmsg[sizeof((sm_job *)0)->errmsg];
    if (s->after_step && s->after_step(s->after_step_arg, fmsg, sizeof fmsg)) {
      /* the step's results cannot be trusted (e.g. the weights file changed): publish nothing */
      pthread_mutex_lock(&s->mu);
      s->fatal = true;
      snprintf(s->fatal_msg, sizeof s->fatal_msg, "%s", fmsg);
      sm_sched_fail_all_now(s, 500, fmsg);
      continue;
    }
    uint64_t n_accepted = 0;
    int npub = 0;
    for (int k = 0; k < n; k++) {
      if (!done[k]) continue;
      sm_job *j = bjob[k];
      if (n_drafted && all[k]) {
        n_accepted += (uint64_t)spec_verify(s, j, bci[k], rows + (size_t)row0[k] * (size_t)s->vocab, nrows[k],
                                            prop + (size_t)k * pcap, nprop[k], lpbuf, topbuf);
        continue;
      }
      if (!n_drafted && bsmp[k]) { /* published below, all under one lock */
        sm_sched_tok_prepare(s, j, bci[k], NULL, btok[k], lpbuf, topbuf, -1, &pub[npub]);
        pubk[npub++] = k;
        continue;
      }
      float *row = n_drafted ? rows + (size_t)row0[k] * (size_t)s->vocab : logits + (size_t)k * (size_t)s->vocab;
      if (bci[k] == 0 && j->fork_pending) {
        /* n > 1: the prompt was computed once; fork it for the other choices */
        j->fork_pending = false;
        for (int i = 1; i < j->n; i++) {
          sm_choice *c = &j->ch[i];
          c->seq = sm_seq_fork(s->eng, j->ch[0].seq);
          if (c->seq) {
            memcpy(tmp, row, sizeof(float) * (size_t)s->vocab);
            process_token(s, j, i, tmp, -1, lpbuf, topbuf);
          } else {
            c->seq = sm_seq_new(s->eng); /* fallback: recompute (prefix cache helps) */
            if (c->seq) {
              sm_seq_append(s->eng, c->seq, j->prompt, j->n_prompt);
              sm_seq_set_media(s->eng, c->seq, j->spans, j->n_spans);
              sm_seq_use_prefix_cache(s->eng, c->seq);
            } else {
              pthread_mutex_lock(&s->mu);
              c->finish = SM_FIN_LENGTH;
              s->active_seqs--;
              pthread_mutex_unlock(&s->mu);
            }
          }
        }
      }
      process_token(s, j, bci[k], row, -1, lpbuf, topbuf);
    }
    if (npub) {
      pthread_mutex_lock(&s->mu);
      for (int i = 0; i < npub; i++) sm_sched_tok_publish(s, bjob[pubk[i]], bch[pubk[i]], &pub[i]);
      pthread_mutex_unlock(&s->mu);
      for (int i = 0; i < npub; i++) sm_sched_tok_done(s, bjob[pubk[i]], bch[pubk[i]], &pub[i], true);
    }
    if (n_drafted) sm_metrics_spec(s->metrics, (uint64_t)n_drafted, n_accepted);
    pthread_mutex_lock(&s->mu);
  free_finished:
    /* free the KV of finished choices right away (not while a launch in flight computes it) */
    for (int a = 0; a < s->n_active; a++) {
      sm_job *j = s->active[a];
      for (int i = 0; i < j->n; i++) {
        sm_choice *c = &j->ch[i];
        if (c->finish && c->seq && !c->inflight) {
          drop_seq(s, c, true);
          s->admit_blocked = false;
        }
      }
    }
  }
  /* shutdown: fail everything still around */
  sm_sched_fail_all_now(s, 503, "server is shutting down");
  pthread_mutex_unlock(&s->mu);
  free(logits);
  free(tmp);
  free(lpbuf);
  free(topbuf);
  free(seqs);
  free(bjob);
  free(bci);
  free(done);
  free(bsmp);
  free(btok);
  free(prop);
  free(kmax);
  free(nprop);
  free(row0);
  free(nrows);
  free(pmin);
  free(all);
  free(bch);
  sm_step_masks_free(smk);
  sm_pipe_free(&pipe);
  free(pub);
  free(pubk);
  free(rows);
  free(s->spec.dl);
  s->spec.dl = NULL;
  return NULL;
}


/* ------------------------------------------------------------------ public */

void sm_sched_init(sm_sched *s, sm_engine *eng, const smelt_tokenizer *tok, sm_metrics *metrics, int vocab,
                   int parallel, int max_queue) {
  memset(s, 0, sizeof *s);
  s->eng = eng;
  s->tok = tok;
  s->metrics = metrics;
  s->vocab = vocab;
  s->parallel = parallel;
  s->max_queue = max_queue;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->gv_mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  sm_engine_get_stats(eng, &s->stats);
  s->slot_busy = sm_xcalloc((size_t)parallel, sizeof(bool));
  s->slot_tok = sm_xcalloc((size_t)parallel, sizeof(int32_t *));
  s->slot_n = sm_xcalloc((size_t)parallel, sizeof(int));
}

void sm_sched_add_eos(sm_sched *s, int32_t id) {
  if (id < 0 || id >= s->vocab || s->n_eos >= (int)SM_ARRAY_LEN(s->eos) || is_eos(s, id)) return;
  s->eos[s->n_eos++] = id;
}

bool sm_sched_start(sm_sched *s) {
  int nt = s->mask_threads;
  if (nt <= 0) { /* automatic: the CPUs less the engine thread's, at most 8 */
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    nt = ncpu > 1 ? (int)SM_MIN(ncpu - 1, 8) : 1;
  }
  if (nt > 1 && !s->mpool) s->mpool = sm_pool_create(nt, NULL, 0); /* NULL (no threads): built serially */
  s->thread_started = pthread_create(&s->thread, NULL, engine_main, s) == 0;
  return s->thread_started;
}

const sm_grammar_vocab *sm_sched_grammar_vocab(sm_sched *s) {
  pthread_mutex_lock(&s->gv_mu);
  if (!s->gvocab) s->gvocab = sm_grammar_vocab_new(s->tok, s->vocab, s->eos, s->n_eos);
  pthread_mutex_unlock(&s->gv_mu);
  return s->gvocab;
}

void sm_sched_stop(sm_sched *s) {
  if (!s->thread_started) return;
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  s->thread_started = false;
}

void sm_sched_destroy(sm_sched *s) {
  for (int i = 0; s->slot_tok && i < s->parallel; i++) free(s->slot_tok[i]);
  free(s->slot_tok);
  free(s->slot_n);
  free(s->slot_busy);
  s->slot_tok = NULL;
  free(s->hot);
  s->hot = NULL;
  s->n_hot = 0;
  sm_grammar_vocab_free(s->gvocab);
  s->gvocab = NULL;
  pthread_mutex_destroy(&s->gv_mu);
  if (s->mpool) sm_pool_destroy(s->mpool);
  s->mpool = NULL;
  free(s->active);
  s->active = NULL;
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
}

sm_job *sm_job_slot_op(int op, int slot, const char *file) {
  sm_api_request req;
  memset(&req, 0, sizeof req);
  req.n = 1;
  sm_job *j = sm_job_new(&req, NULL, 0, 0, false);
  j->slot_op = op;
  j->slot_id = slot;
  j->slot_file = file ? sm_xstrdup(file) : NULL;
  return j;
}

sm_job *sm_job_new(sm_api_request *req, int32_t *prompt, int n_prompt, int max_tokens, bool tool_mode) {
  sm_job *j = sm_xcalloc(1, sizeof *j);
  j->req = *req;
  memset(req, 0, sizeof *req);
  j->prompt = prompt;
  j->n_prompt = n_prompt;
  j->max_tokens = max_tokens;
  j->n = j->req.n;
  j->ch = sm_xcalloc((size_t)j->n, sizeof(sm_choice));
  for (int i = 0; i < j->n; i++) {
    sm_buf_reserve(&j->ch[i].text, 64);
    j->ch[i].stop_hit = -1;
    j->ch[i].slot = -1;
  }
  j->tool_mode = tool_mode;
  pthread_cond_init(&j->cv, NULL);
  j->t_arrival = sm_now();
  j->created = (long)time(NULL);
  j->refs = 2; /* the caller + the engine */
  return j;
}

int sm_sched_submit(sm_sched *s, sm_job *j) {
  pthread_mutex_lock(&s->mu);
  if (s->stopping) {
    pthread_mutex_unlock(&s->mu);
    job_free(j);
    return 503;
  }
  /* waiting requests beyond the free sequence slots are bounded by --max-queue */
  if (s->n_queued + 1 - SM_MAX(0, s->parallel - s->active_seqs) > s->max_queue) {
    pthread_mutex_unlock(&s->mu);
    job_free(j);
    return 429;
  }
  sm_ep_kind kind = j->req.kind;
  j->sched = s;
  j->seq_no = atomic_fetch_add(&g_next_id, 1) + 1; /* unique across the server's models: ids derive from it */
  snprintf(j->id, sizeof j->id, "%s-%016llx%04llx",
           kind == SM_EP_CHAT          ? "chatcmpl"
           : kind == SM_EP_COMPLETIONS ? "cmpl"
           : kind == SM_EP_MESSAGES    ? "msg"
                                       : "resp_",
           (unsigned long long)sm_mix64((uint64_t)j->created ^ (j->seq_no << 20)),
           (unsigned long long)(j->seq_no & 0xffff));
  if (kind == SM_EP_MESSAGES) j->id[3] = '_'; /* msg_<hex> */
  if (kind == SM_EP_RESPONSES) {              /* resp_<hex> */
    memmove(j->id + 5, j->id + 6, strlen(j->id + 6) + 1);
  }
  j->queued = true;
  if (s->qtail) s->qtail->next = j;
  else s->qhead = j;
  s->qtail = j;
  s->n_queued++;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

void sm_job_cancel(sm_sched *s, sm_job *j) {
  j->cancelled = true;
  pthread_cond_signal(&s->cv);
}

void sm_sched_gauges(sm_sched *s, sm_metrics_gauges *g) {
  memset(g, 0, sizeof *g);
  g->queued = s->n_queued;
  g->running_requests = s->n_active;
  g->running_seqs = s->active_seqs;
  g->kv_blocks_used = s->stats.blocks_used;
  g->kv_blocks_total = s->stats.n_blocks;
  g->kv_blocks_cached = s->stats.blocks_cached;
  g->kv_block_size = s->stats.block_size;
  g->prefix_hit_tokens = s->stats.prefix_hits_tokens;
}

void sm_timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)ms * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(cv, mu, &ts);
}

/* under mu, engine thread (or after it stopped): sequences are freed here */
void sm_sched_fail_all_now(sm_sched *s, int status, const char *msg) {
  while (s->n_active) {
    sm_job *j = s->active[0];
    if (j->fork_pending) {
      s->active_seqs -= j->n - 1;
      j->fork_pending = false;
    }
    sm_sched_job_fail(s, j, status, msg);
  }
  while (s->qhead) {
    sm_job *j = s->qhead;
    s->qhead = j->next;
    if (!s->qhead) s->qtail = NULL;
    s->n_queued--;
    j->queued = false;
    j->failed = true;
    j->fail_status = status;
    snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
    j->done = true;
    job_signal(j);
    sm_job_unref(s, j);
  }
}

void sm_sched_fail_all(sm_sched *s, int status, const char *msg) {
  s->fail_pending = true;
  s->fail_status = status;
  snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg);
  pthread_cond_signal(&s->cv);
}

bool sm_sched_idle(const sm_sched *s) { return s->n_active == 0 && s->n_queued == 0; }
