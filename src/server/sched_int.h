/* What the scheduler's engine thread (sched.c) shares with its pipelined steps (sched_pipe.c); not
 * for other users of the scheduler (sched.h). Engine thread only unless a function says otherwise. */
#ifndef SM_SCHED_INT_H
#define SM_SCHED_INT_H
#include "server/sched.h"

/* A token of a choice in three parts, so that a step's tokens are published under one lock of the
 * scheduler mutex (the HTTP threads that stream them take it too): sm_sched_tok_prepare (mu NOT held)
 * samples it when a logits row is given and makes its text; sm_sched_tok_publish (mu held) adds it to
 * the choice's published state, ends the choice where it should and wakes the request;
 * sm_sched_tok_done (mu NOT held) frees the text and, with append, appends the token to the sequence. */
typedef struct {
  sm_tokrec rec;
  char *piece, *tail;
  size_t plen, tlen;
  bool eos, at_len, grammar_end;
  double now;
} sm_tokpub;
/* ... from logits row (modified), or, when row is NULL, tok, already sampled on the backend; the
 * sampler sees the first hist tokens of the sequence (-1: all). Returns the token. */
int32_t sm_sched_tok_prepare(sm_sched *s, sm_job *j, int ci, float *row, int32_t tok, float *lpbuf, int32_t *topbuf,
                             int hist, sm_tokpub *p);
void sm_sched_tok_publish(sm_sched *s, sm_job *j, sm_choice *c, sm_tokpub *p);
void sm_sched_tok_done(sm_sched *s, sm_job *j, sm_choice *c, sm_tokpub *p, bool append);
/* mu held: */
void sm_sched_job_finish(sm_sched *s, sm_job *j);                            /* complete or failed: leaves */
void sm_sched_job_fail(sm_sched *s, sm_job *j, int status, const char *msg); /* ... with an error */
void sm_sched_fail_all_now(sm_sched *s, int status, const char *msg);        /* every job, queued or running */
void sm_sched_preempt_newest(sm_sched *s); /* the newest job's sequences freed, the job requeued */

/* ---- pipelined steps (sched_pipe.c) ---- */
/* a launched step: its choices in batch order, their done flags and (once collected) tokens */
typedef struct {
  bool live;
  int n, ticket;
  uint64_t serial;
  sm_seq **seqs;
  sm_job **job;
  sm_choice **ch;
  uint8_t *done;
  int32_t *tok;
} sm_pstep;
/* the engine thread's pipeline: the launch in flight ps[pc] and the one being built */
typedef struct {
  bool on; /* sm_engine_batch_pipeline, no speculative decoding */
  sm_pstep ps[2];
  int pc;
  uint64_t serial;
  sm_tokpub *pub;
  int *pubk;
} sm_pipe;
void sm_pipe_init(sm_pipe *p, sm_sched *s, int cap);
void sm_pipe_free(sm_pipe *p);
static inline bool sm_pipe_live(const sm_pipe *p) { return p->ps[p->pc].live; }
bool sm_job_inflight(const sm_job *j); /* a launch not collected holds one of its sequences */
/* mu held, released and taken again: collect the launch in flight and publish its tokens (or fail every
 * job when that is not possible) */
void sm_pipe_drain(sm_sched *s, sm_pipe *p);
/* mu NOT held: one iteration's step over the batch of n choices (seqs, their jobs, choice indices,
 * choices and samplers). SM_PIPE_SYNC: not taken (mu still not held), the step-by-step path runs;
 * SM_PIPE_LOCKED: done, mu held; SM_PIPE_RETRY: mu held, the iteration starts again (after a
 * preemption or a failure) */
enum { SM_PIPE_SYNC, SM_PIPE_LOCKED, SM_PIPE_RETRY };
int sm_pipe_step(sm_sched *s, sm_pipe *p, int n, sm_seq **seqs, sm_job **bjob, const int *bci, sm_choice **bch,
                 sm_sampler **bsmp);

#endif
