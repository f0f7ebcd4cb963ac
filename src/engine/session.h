/* Session: one sequence whose KV cache is kept between generate calls (a chat conversation, a
 * REPL). Each call is given the whole prompt; the KV of its longest common prefix with what the
 * session already holds is kept and only the rest is prefilled. */
#ifndef SM_SESSION_H
#define SM_SESSION_H
#include "engine/engine.h"

typedef struct sm_session sm_session;

/* Why a generate call ended. */
typedef enum {
  SM_STOP_NONE = 0,  /* nothing generated (max_tokens 0) */
  SM_STOP_LENGTH,    /* max_tokens reached */
  SM_STOP_EOS,       /* the model produced an end-of-sequence token */
  SM_STOP_CONTEXT,   /* the context is full */
  SM_STOP_CANCELLED, /* the cancelled callback said so, or the piece callback returned false */
} sm_stop;
const char *sm_stop_name(sm_stop s); /* "none", "length", "eos", "context", "cancelled" */

typedef struct {
  smelt_stats st;  /* n_prompt, n_generated, prefill_s, decode_s, peak_rss; stop_reason 1 = eos */
  int n_reused;    /* prompt tokens whose KV was already held (kept from before, or a prompt cache) */
  int n_prefilled; /* prompt tokens computed by this call (n_prompt - n_reused) */
  sm_stop stop;
  int n_accepted; /* with a draft model: generated tokens that came from it */
} sm_session_stats;

typedef struct {
  int max_tokens;                 /* < 0: until EOS or the context is full */
  const smelt_sampling *sampling; /* NULL: smelt_sampling_default */
  bool ignore_eos;                /* keep generating after end-of-sequence tokens */
  smelt_piece_cb on_piece;        /* streamed text; returning false stops (SM_STOP_CANCELLED) */
  void *user;                     /* for on_piece */
  /* optional, with ud: prefill progress (tokens of this call's prefill done, of total), called
   * after each forward step of the prefill; cancelled is polled before each prefill step and
   * after each generated token */
  void (*on_prefill)(void *ud, int done, int total);
  bool (*cancelled)(void *ud);
  void *ud;
} sm_session_opts;

/* max_context <= 0: the model's; max_batch <= 0: 512 tokens per prefill step. draft (may be NULL):
 * a draft model (same tokenizer) for speculative decoding, proposing n_draft tokens a step; its KV
 * is kept between calls too. */
smelt_status sm_session_create(smelt_model *m, smelt_model *draft, int n_draft, int max_context, int max_batch,
                               sm_session **out);
void sm_session_free(sm_session *s);
int sm_session_context(const sm_session *s);           /* tokens it can hold */
int sm_session_len(const sm_session *s);               /* tokens whose KV it holds */
const int32_t *sm_session_tokens(const sm_session *s); /* those tokens */
void sm_session_reset(sm_session *s);                  /* drop all KV */
sm_engine *sm_session_engine(sm_session *s);
sm_seq *sm_session_seq(sm_session *s); /* the target sequence */

/* Generate after the prompt ids[0..n): keeps the KV of the longest common prefix with the tokens
 * held (always recomputing at least the last prompt token), prefills the rest, then decodes.
 * SMELT_ERR_LIMIT when n does not leave room for one token in the context. On return (also after
 * a cancel) the session holds the prompt and the generated tokens that were appended. */
smelt_status sm_session_generate(sm_session *s, const int32_t *ids, int n, const sm_session_opts *o,
                                 sm_session_stats *stats);
/* The same with images (spans from sm_vision_tokenize): the held tokens are compared with the prompt
 * by image content, so that an image kept from an earlier turn is not computed again. */
struct sm_mm_span;
smelt_status sm_session_generate_mm(sm_session *s, const int32_t *ids, int n, const struct sm_mm_span *spans,
                                    int n_spans, const sm_session_opts *o, sm_session_stats *stats);
/* Compute the KV of ids[0..n) (prefix reuse as above) without generating: for prompt caches. */
smelt_status sm_session_prefill(sm_session *s, const int32_t *ids, int n, const sm_session_opts *o,
                                sm_session_stats *stats);

/* Decode speed: times `steps` one-token steps on a scratch sequence (the session's KV is reset).
 * For a banner; 0 tok/s when it cannot be measured. */
smelt_status sm_session_measure_decode(sm_session *s, int steps, double *tok_per_s);

#endif
