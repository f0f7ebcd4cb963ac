/* Scheduler of `smelt serve` (private to src/server): requests become jobs that wait in a FIFO
 * queue; one engine thread admits them while sequence slots are free and steps every running
 * sequence of every admitted job together (continuous batching). Generated text is published
 * per choice under the scheduler's mutex; readers (the HTTP side) wait on the job's condition
 * variable or through its notify hook. */
#ifndef SM_SERVER_SCHED_H
#define SM_SERVER_SCHED_H
#include <pthread.h>
#include "base/strbuf.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/sampler.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/toolcall.h"
#include "tokenizer/tokenizer.h"

enum { SM_FIN_NONE = 0, SM_FIN_STOP, SM_FIN_LENGTH };
enum { SM_SLOT_SAVE = 1, SM_SLOT_RESTORE, SM_SLOT_ERASE };

/* one generated token: id, logprob, text offset after it, top alternatives */
typedef struct {
  int32_t id;
  float lp;
  size_t end;
  int ntop;
  int32_t *top_ids;
  float *top_lps;
} sm_tokrec;

typedef struct {
  sm_seq *seq;
  sm_seq *dseq; /* speculative decoding with a draft model: the draft engine's copy (spec.h) */
  sm_sampler sampler;
  bool sampler_ok;
  sm_detok *detok;
  int32_t *gen;
  int n_gen, cap_gen;
  sm_buf text; /* generated text (always allocated, NUL-terminated) */
  size_t safe; /* bytes of text that can be sent (no stop string / tool call can start before) */
  sm_tokrec *toks;
  int n_toks, cap_toks;
  int finish;           /* SM_FIN_* */
  int stop_hit;         /* the stop string that ended the text, -1: none */
  int p_off, p_len;     /* several prompts: this choice's prompt is job->prompt[p_off..+p_len) */
  int slot;             /* the slot (GET /slots) its sequence holds, -1: none */
  sm_grammar_state *gs; /* constrained decoding (job->grammar), engine thread only */
  uint32_t *mask;       /* allowed tokens for the next sample, valid when mask_ok */
  bool mask_ok;
  double t_last;
  /* pipelined steps (engine thread): launches not collected that hold the sequence, the serial and row of
   * the latest launch that held it; pipe_drop: the choice ended while a launch computed its next token,
   * which is dropped (and its placeholder truncated) when that launch is collected */
  int inflight;
  uint64_t pl_serial;
  int pl_row;
  bool pipe_drop;
  /* streaming progress, kept by the HTTP side */
  size_t sent;  /* content bytes sent */
  size_t rsent; /* reasoning bytes sent */
  int toks_sent;
  int calls_sent;    /* tool calls announced (id, name) */
  size_t *args_sent; /* argument bytes sent per call */
  int args_cap;
  bool end_sent;
} sm_choice;

typedef struct sm_job sm_job;
typedef struct sm_sched sm_sched;
struct sm_job {
  int refs;        /* under the scheduler's mutex */
  sm_sched *sched; /* the scheduler it was submitted to (its mutex guards the job) */
  sm_api_request req;
  int32_t *prompt;
  int n_prompt, max_tokens, n_cached;
  struct sm_mm_span *spans; /* images in the prompt (references), NULL when none */
  int n_spans;
  sm_grammar *grammar;  /* NULL: unconstrained */
  int per_prompt;       /* several prompts: choices per prompt (0: one prompt shared by all) */
  float *emb;           /* embeddings: n x emb_dim floats, filled by the engine thread */
  int emb_dim, pooling; /* sm_pooling */
  sm_choice *ch;
  int n;
  /* a slot action (POST /slots/{id}?action=...), run by the engine thread instead of generating */
  int slot_op; /* SM_SLOT_* (0: none) */
  int slot_id;
  char *slot_file;     /* the file's path */
  int slot_tokens;     /* tokens saved, restored or erased */
  uint64_t slot_bytes; /* bytes written or read */
  double slot_ms;
  bool tool_mode, fork_pending;
  const sm_toolfmt *tfmt; /* the model's tool-call format (also parses gpt-oss channels) */
  bool reasoning;         /* split thinking text from the content */
  bool think_open;        /* the prompt ends inside <think>: the output starts with reasoning */
  bool keep_special;      /* detokenize special tokens (tool-call markers are special tokens) */
  bool parsed;            /* reasoning or tool calls: the text goes through sm_view */
  bool queued, active, cancelled, done, failed, started;
  int fail_status;
  char errmsg[256];
  pthread_cond_t cv; /* broadcast whenever the job's text or state changes */
  /* optional hook called (under the mutex) at the same moments; must not block */
  void (*notify)(void *arg);
  void *notify_arg;
  double t_arrival;
  bool first_token;
  uint64_t seq_no;
  char id[64];
  long created;
  sm_job *next;
};

struct sm_sched {
  sm_engine *eng;
  const smelt_tokenizer *tok;
  sm_metrics *metrics;
  int vocab;
  int parallel;  /* concurrent sequences */
  int max_queue; /* waiting requests beyond the free slots before 429 */
  int32_t eos[48];
  int n_eos;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* wakes the engine thread */
  sm_job *qhead, *qtail;
  int n_queued;
  sm_job **active;
  int n_active, active_seqs;
  bool stopping;
  bool admit_blocked; /* after a preemption: admit nothing until some sequence finishes */
  pthread_t thread;
  bool thread_started;
  sm_engine_stats stats;
  sm_grammar_vocab *gvocab; /* built on the first constrained request (sm_sched_grammar_vocab) */
  pthread_mutex_t gv_mu;    /* guards building it */
  sm_gmask_cache *gcache;   /* masks shared between constrained sequences (NULL: none); set before start */
  int mask_threads;         /* threads that build a step's masks (0: automatic); set before start */
  sm_pool *mpool;           /* their pool (engine thread; NULL: masks built on the engine thread) */
  /* called by the engine thread after every step (mu not held): true when the step's results
   * cannot be trusted; msg says why. Every job then fails and `fatal` is set. */
  bool (*after_step)(void *arg, char *msg, size_t msg_size);
  void *after_step_arg;
  bool fatal;
  char fatal_msg[256];
  /* the longest prompt prefix that a request reused from the prefix cache (engine thread; read
   * after it stopped): what a prompt cache file keeps at shutdown (pcache.h) */
  int32_t *hot;
  int n_hot;
  /* slots: one per sequence a request may hold (-np); a slot keeps the tokens of the last
   * sequence that held it (what POST /slots/{id}?action=save writes); under mu */
  bool *slot_busy;
  int32_t **slot_tok;
  int *slot_n;
  /* speculative decoding (spec.h), set before sm_sched_start; on: draft tokens are verified in
   * the batched step */
  struct {
    bool on;
    int n_max, n_min; /* draft tokens per step (--draft-max, --draft-min) */
    float p_min;      /* a draft model's proposal stops below this probability (--draft-p-min) */
    int ngram_n;      /* n-gram mode: the longest n-gram looked up (--spec-ngram-size-n) */
    int budget;       /* tokens per step of the engine (max_batch_tokens) */
    sm_engine *deng;  /* the draft model's engine (NULL: n-gram mode); owned by the caller */
    int dvocab;
    float *dl; /* draft logits (engine thread) */
    size_t dl_cap;
  } spec;
  bool fail_pending; /* sm_sched_fail_all asked; done by the engine thread */
  int fail_status;
  char fail_msg[256];
};

static inline uint64_t sm_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void sm_sched_init(sm_sched *s, sm_engine *eng, const smelt_tokenizer *tok, sm_metrics *metrics, int vocab,
                   int parallel, int max_queue);
void sm_sched_add_eos(sm_sched *s, int32_t id); /* ignored when out of range or already known */
bool sm_sched_start(sm_sched *s);               /* starts the engine thread */
/* The grammar vocabulary of the model's tokenizer, built by the first caller (any thread; the
 * HTTP threads build it and the positions of a request's grammar before queueing it). */
const sm_grammar_vocab *sm_sched_grammar_vocab(sm_sched *s);
/* Stops the engine thread; jobs still queued or running fail with 503. */
void sm_sched_stop(sm_sched *s);
void sm_sched_destroy(sm_sched *s);

/* A slot action for slot `slot` (file: the path for save and restore, else NULL). */
sm_job *sm_job_slot_op(int op, int slot, const char *file);
/* A new job for a parsed request (moved into the job) and its prompt ids (owned by the job). */
sm_job *sm_job_new(sm_api_request *req, int32_t *prompt, int n_prompt, int max_tokens, bool tool_mode);
/* Queue a job. Returns 0 (queued; the caller keeps one reference, the engine holds the other),
 * or 503 (shutting down) / 429 (queue full), in which case the job was freed. */
int sm_sched_submit(sm_sched *s, sm_job *j);
/* The rest: under s->mu. */
void sm_job_unref(sm_sched *s, sm_job *j);
void sm_job_cancel(sm_sched *s, sm_job *j);
/* Ask the engine thread to fail every queued and running job (a drain that timed out). */
void sm_sched_fail_all(sm_sched *s, int status, const char *msg);
bool sm_sched_idle(const sm_sched *s); /* nothing queued or running */
void sm_sched_gauges(sm_sched *s, sm_metrics_gauges *g);
void sm_timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms);

#endif
