/* Pipelined steps of the scheduler's engine thread (sched_int.h). With a backend that queues its work (sm_engine_batch_pipeline), a step whose choices all sample on the
 * device without host state (no logprobs, grammar, penalties, logit biases, images or forks) is launched
 * and its tokens are collected only after the next step is launched: the next step takes each continuing
 * sequence's token from the device (sm_seq_append_fed), and the host detokenizes and publishes a step's
 * tokens while the device computes the next. A choice that a token ends while the next step computes
 * after it gets that step's token dropped and its placeholder truncated (pipe_drop), so its sequence
 * and outputs are those of the step-by-step loop. */
#include "server/sched_int.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void pstep_init(sm_pstep *p, int cap) {
  memset(p, 0, sizeof *p);
  p->seqs = sm_xmalloc(sizeof(sm_seq *) * (size_t)cap);
  p->job = sm_xmalloc(sizeof(sm_job *) * (size_t)cap);
  p->ch = sm_xmalloc(sizeof(sm_choice *) * (size_t)cap);
  p->done = sm_xmalloc((size_t)cap);
  p->tok = sm_xmalloc(sizeof(int32_t) * (size_t)cap);
}
static void pstep_free(sm_pstep *p) {
  free(p->seqs);
  free(p->job);
  free(p->ch);
  free(p->done);
  free(p->tok);
}

/* a choice whose next token can be fed on the device (nothing on the host needs it first) */
static bool choice_feedable(const sm_job *j, int i) {
  const sm_choice *c = &j->ch[i];
  return !j->req.logprobs && !(i == 0 && j->fork_pending) && !c->gs && sm_sampler_history_free(&c->sampler) &&
         !j->n_spans;
}

bool sm_job_inflight(const sm_job *j) {
  for (int i = 0; i < j->n; i++)
    if (j->ch[i].inflight) return true;
  return false;
}

/* mu NOT held: wait for launch p's tokens and publish them (all under one lock), as the step-by-step
 * loop's processing does; publish false: drop them (the step's results are not used). Returns 0, or
 * PS_FAILED when the tokens could not be collected, PS_UNTRUSTED when after_step refused the step (msg
 * says why; nothing is published). */
enum { PS_FAILED = 1, PS_UNTRUSTED = 2 };
static int pstep_collect(sm_sched *s, sm_pstep *p, bool publish, sm_tokpub *pub, int *pubk, char *msg, size_t nmsg) {
  p->live = false;
  smelt_status st = sm_engine_step_collect(s->eng, p->ticket, p->tok);
  int rc = 0;
  if (st) {
    snprintf(msg, nmsg, "engine step failed: %s", sm_errmsg());
    rc = PS_FAILED;
  } else if (publish && s->after_step && s->after_step(s->after_step_arg, msg, nmsg)) {
    rc = PS_UNTRUSTED;
  }
  const bool ok = rc == 0;
  int npub = 0;
  for (int k = 0; k < p->n; k++) {
    sm_choice *c = p->ch[k];
    c->inflight--;
    if (!p->done[k]) continue;
    if (c->pipe_drop || !ok || !publish) { /* the choice ended before this token: drop it and its input */
      if (sm_seq_fed(c->seq) || c->pipe_drop) sm_seq_truncate(s->eng, c->seq, sm_seq_len(c->seq) - 1);
      c->pipe_drop = false;
      continue;
    }
    sm_job *j = p->job[k];
    const int ci = (int)(c - j->ch);
    sm_sched_tok_prepare(s, j, ci, NULL, p->tok[k], NULL, NULL, -1, &pub[npub]);
    pubk[npub++] = k;
  }
  if (npub) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < npub; i++) {
      const int k = pubk[i];
      sm_choice *c = p->ch[k];
      if (p->job[k]->cancelled) c->finish = c->finish ? c->finish : SM_FIN_LENGTH; /* nothing more is sent */
      else sm_sched_tok_publish(s, p->job[k], c, &pub[i]);
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < npub; i++) {
      const int k = pubk[i];
      sm_choice *c = p->ch[k];
      const bool fed = sm_seq_fed(c->seq);
      if (fed) sm_seq_set_fed(s->eng, c->seq, pub[i].rec.id);
      sm_sched_tok_done(s, p->job[k], c, &pub[i], !fed);
      if (fed && c->finish) c->pipe_drop = true; /* the launch after this one computes past its end */
    }
  }
  return rc;
}

/* mu held, nothing in flight: the jobs after a pstep_collect that returned rc (as the step-by-step loop
 * does after a failed or untrusted step) */
static void pstep_fail(sm_sched *s, int rc, const char *msg) {
  if (rc == PS_UNTRUSTED) {
    s->fatal = true;
    snprintf(s->fatal_msg, sizeof s->fatal_msg, "%s", msg);
    sm_sched_fail_all_now(s, 500, msg);
    return;
  }
  fprintf(stderr, "smelt serve: %s\n", msg);
  while (s->n_active) sm_sched_job_fail(s, s->active[0], 500, msg);
}


void sm_pipe_init(sm_pipe *p, sm_sched *s, int cap) {
  memset(p, 0, sizeof *p);
  p->on = sm_engine_batch_pipeline(s->eng) && !s->spec.on;
  pstep_init(&p->ps[0], cap);
  pstep_init(&p->ps[1], cap);
  p->pub = sm_xmalloc(sizeof(sm_tokpub) * (size_t)cap);
  p->pubk = sm_xmalloc(sizeof(int) * (size_t)cap);
}

void sm_pipe_free(sm_pipe *p) {
  pstep_free(&p->ps[0]);
  pstep_free(&p->ps[1]);
  free(p->pub);
  free(p->pubk);
}

void sm_pipe_drain(sm_sched *s, sm_pipe *p) {
  char msg[256];
  pthread_mutex_unlock(&s->mu);
  const int rc = pstep_collect(s, &p->ps[p->pc], true, p->pub, p->pubk, msg, sizeof msg);
  pthread_mutex_lock(&s->mu);
  if (rc) pstep_fail(s, rc, msg);
}

int sm_pipe_step(sm_sched *s, sm_pipe *p, int n, sm_seq **seqs, sm_job **bjob, const int *bci, sm_choice **bch,
                 sm_sampler **bsmp) {
  if (!p->on) return SM_PIPE_SYNC;
  bool feedable = n > 0;
  for (int k = 0; k < n && feedable; k++) feedable = choice_feedable(bjob[k], bci[k]);
  sm_pstep *P = &p->ps[p->pc], *Q = &p->ps[1 - p->pc];
  char pmsg[256];
  if (!feedable) {
    if (!P->live) return SM_PIPE_SYNC;
    /* a step that needs the host first: the launch in flight is collected */
    pthread_mutex_lock(&s->mu);
    sm_pipe_drain(s, p);
    return SM_PIPE_LOCKED;
  }
  /* the next launch: a sequence whose token P computes takes it on the device; one whose P token is its
   * last by length gets none (its request ends with that token) */
  bool any = false;
  uint64_t n_fed = 0;
  for (int k = 0; k < n; k++) {
    sm_choice *c = bch[k];
    if (P->live && c->pl_serial == P->serial && P->done[c->pl_row] && sm_seq_pending(seqs[k]) == 0 &&
        c->n_gen + 1 < bjob[k]->max_tokens && sm_seq_append_fed(s->eng, seqs[k], c->pl_row) == SMELT_OK)
      n_fed++; /* (fails at the context limit: the token then comes from the host) */
    any |= sm_seq_pending(seqs[k]) > 0;
  }
  smelt_status st = SMELT_OK;
  if (any) {
    memset(Q->done, 0, (size_t)n);
    st = sm_engine_step_launch(s->eng, seqs, n, bsmp, Q->done, &Q->ticket);
    if (st)
      for (int k = 0; k < n; k++)
        if (sm_seq_fed(seqs[k])) sm_seq_truncate(s->eng, seqs[k], sm_seq_len(seqs[k]) - 1);
  }
  if (any && !st) {
    if (n_fed) sm_metrics_fed(s->metrics, n_fed);
    Q->live = true;
    Q->n = n;
    Q->serial = ++p->serial;
    for (int k = 0; k < n; k++) {
      Q->seqs[k] = seqs[k];
      Q->job[k] = bjob[k];
      Q->ch[k] = bch[k];
      bch[k]->inflight++;
      bch[k]->pl_serial = Q->serial;
      bch[k]->pl_row = k;
    }
  }
  const int rc = P->live ? pstep_collect(s, P, true, p->pub, p->pubk, pmsg, sizeof pmsg) : 0;
  if (any && !st) p->pc = 1 - p->pc;
  if (rc) { /* what is still in flight is dropped */
    char m2[256];
    if (p->ps[p->pc].live) pstep_collect(s, &p->ps[p->pc], false, p->pub, p->pubk, m2, sizeof m2);
    pthread_mutex_lock(&s->mu);
    pstep_fail(s, rc, pmsg);
    return SM_PIPE_LOCKED;
  }
  if (st == SMELT_ERR_OOM) {
    pthread_mutex_lock(&s->mu);
    sm_sched_preempt_newest(s);
    return SM_PIPE_RETRY;
  }
  if (st) {
    char msg[256];
    snprintf(msg, sizeof msg, "engine step failed: %s", sm_errmsg());
    fprintf(stderr, "smelt serve: %s\n", msg);
    pthread_mutex_lock(&s->mu);
    while (s->n_active) sm_sched_job_fail(s, s->active[0], 500, msg);
    return SM_PIPE_RETRY;
  }
  pthread_mutex_lock(&s->mu);
  return SM_PIPE_LOCKED;
}
