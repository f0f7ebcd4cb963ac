/* `smelt serve`: jobs, the engine thread (continuous batching) and the HTTP layer. */
#include "server/server.h"
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <arpa/inet.h>
#include "engine/engine.h"
#include "engine/sampler.h"
#include "server/api.h"
#include "server/metrics.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

enum { FIN_NONE = 0, FIN_STOP, FIN_LENGTH };

typedef struct {
  int32_t id;
  float lp;
  size_t end; /* text offset after this token */
  int ntop;
  int32_t *top_ids;
  float *top_lps;
} tokrec;

typedef struct {
  sm_seq *seq;
  sm_sampler sampler;
  bool sampler_ok;
  sm_detok *detok;
  int32_t *gen;
  int n_gen, cap_gen;
  char *text; /* NUL-terminated */
  size_t len, cap, safe;
  tokrec *toks;
  int n_toks, cap_toks;
  int finish;
  sm_json_track jt;
  double t_last;
  /* HTTP side (stream) */
  size_t sent;
  int toks_sent;
  bool end_sent;
} choice;

typedef struct sm_server sm_server;
typedef struct job job;
struct job {
  int refs;
  sm_server *srv;
  sm_api_request req;
  const char *endpoint;
  int32_t *prompt;
  int n_prompt, max_tokens, n_cached;
  choice *ch;
  int n;
  bool tool_mode, fork_pending;
  bool queued, active, cancelled, done, failed, started;
  int fail_status;
  char errmsg[256];
  pthread_cond_t cv;
  double t_arrival;
  bool first_token;
  uint64_t seq_no;
  char id[64];
  long created;
  job *next;
};

struct sm_server {
  sm_server_params p;
  smelt_model *model;
  const smelt_tokenizer *tok;
  sm_engine *eng;
  int vocab, ctx;
  int32_t eos[48];
  int n_eos;
  sm_metrics *metrics;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  job *qhead, *qtail;
  int n_queued;
  job **active;
  int n_active, active_seqs;
  bool stopping;
  bool admit_blocked; /* after a preemption: admit nothing until some sequence finishes */
  pthread_t thread;
  struct MHD_Daemon *d;
  sm_engine_stats stats;
  uint64_t next_id;
  char *origins;
  char alias[256];
};

/* ------------------------------------------------------------------ utilities */

typedef struct { char *s; size_t len, cap; } sbuf;
static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->s = sm_xrealloc(b->s, b->cap);
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void text_put(choice *c, const char *s, size_t n) {
  if (c->len + n + 1 > c->cap) {
    c->cap = (c->len + n + 1) * 2;
    c->text = sm_xrealloc(c->text, c->cap);
  }
  memcpy(c->text + c->len, s, n);
  c->len += n;
  c->text[c->len] = 0;
}

static void job_free(job *j) {
  for (int i = 0; i < j->n; i++) {
    choice *c = &j->ch[i];
    if (c->sampler_ok) sm_sampler_free(&c->sampler);
    if (c->detok) sm_detok_free(c->detok);
    free(c->gen);
    free(c->text);
    for (int k = 0; k < c->n_toks; k++) { free(c->toks[k].top_ids); free(c->toks[k].top_lps); }
    free(c->toks);
  }
  free(j->ch);
  free(j->prompt);
  sm_api_request_free(&j->req);
  pthread_cond_destroy(&j->cv);
  free(j);
}

/* under s->mu */
static void job_unref(job *j) {
  if (--j->refs == 0) job_free(j);
}

static uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static bool is_eos(const sm_server *s, int32_t t) {
  for (int i = 0; i < s->n_eos; i++)
    if (s->eos[i] == t) return true;
  return false;
}

/* ------------------------------------------------------------------ engine thread */

static void job_fail(sm_server *s, job *j, int status, const char *msg);

static void release_seqs(sm_server *s, job *j) {
  for (int i = 0; i < j->n; i++)
    if (j->ch[i].seq) {
      sm_seq_free(s->eng, j->ch[i].seq);
      j->ch[i].seq = NULL;
      s->active_seqs--;
    }
}

static void remove_active(sm_server *s, job *j) {
  for (int i = 0; i < s->n_active; i++)
    if (s->active[i] == j) {
      memmove(s->active + i, s->active + i + 1, sizeof(job *) * (size_t)(s->n_active - i - 1));
      s->n_active--;
      break;
    }
  j->active = false;
}

/* under mu: the job is complete (all choices finished) or failed; leaves the engine */
static void job_finish(sm_server *s, job *j) {
  release_seqs(s, j);
  if (j->active) remove_active(s, j);
  j->done = true;
  uint64_t gen = 0;
  for (int i = 0; i < j->n; i++) gen += (uint64_t)j->ch[i].n_gen;
  if (j->cancelled) sm_metrics_cancel(s->metrics);
  if (!j->failed && !j->cancelled) sm_metrics_tokens(s->metrics, (uint64_t)j->n_prompt, gen, (uint64_t)j->n_cached);
  pthread_cond_broadcast(&j->cv);
  job_unref(j); /* the engine's reference */
}

static void job_fail(sm_server *s, job *j, int status, const char *msg) {
  j->failed = true;
  j->fail_status = status;
  snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
  job_finish(s, j);
}

static void update_safe(sm_server *s, job *j, choice *c) {
  if (c->finish) { c->safe = c->len; return; }
  size_t safe = c->len - sm_stop_holdback(c->text, c->len, j->req.stop, j->req.n_stop);
  if (j->tool_mode) {
    if (sm_toolcall_may_start(c->text, c->len)) safe = 0;
    else {
      char *p = strstr(c->text, "<tool_call>");
      if (p) safe = SM_MIN(safe, (size_t)(p - c->text));
      char *mk[1] = {"<tool_call>"};
      safe = SM_MIN(safe, c->len - sm_stop_holdback(c->text, c->len, mk, 1));
    }
  }
  if (safe > c->safe) c->safe = safe;
}

/* under mu: start (or restart after preemption) a job's sequences */
static bool admit(sm_server *s, job *j) {
  sm_engine *e = s->eng;
  if (!j->started) {
    for (int i = 0; i < j->n; i++) {
      choice *c = &j->ch[i];
      smelt_sampling sp = j->req.sampling;
      sp.seed = j->req.has_seed ? (mix64(j->req.seed + (uint64_t)i) | 1) : 0;
      sm_sampler_init(&c->sampler, &sp, s->vocab);
      c->sampler_ok = true;
      c->detok = sm_detok_new(s->tok, true);
    }
    sm_seq *q = sm_seq_new(e);
    if (!q) return false;
    if (sm_seq_append(e, q, j->prompt, j->n_prompt) != SMELT_OK) { sm_seq_free(e, q); return false; }
    j->n_cached = sm_seq_use_prefix_cache(e, q);
    j->ch[0].seq = q;
    s->active_seqs++;
    j->fork_pending = j->n > 1;
    if (j->fork_pending) s->active_seqs += j->n - 1; /* reserved for the forks */
    j->started = true;
  } else {
    for (int i = 0; i < j->n; i++) {
      choice *c = &j->ch[i];
      if (c->finish || c->seq) continue;
      sm_seq *q = sm_seq_new(e);
      if (!q) return false;
      if (sm_seq_append(e, q, j->prompt, j->n_prompt) != SMELT_OK ||
          (c->n_gen && sm_seq_append(e, q, c->gen, c->n_gen) != SMELT_OK)) {
        sm_seq_free(e, q);
        return false;
      }
      sm_seq_use_prefix_cache(e, q);
      c->seq = q;
      s->active_seqs++;
    }
  }
  j->active = true;
  s->active = sm_xrealloc(s->active, sizeof(job *) * (size_t)(s->n_active + 1));
  s->active[s->n_active++] = j;
  return true;
}

/* under mu: requeue the newest active job (KV exhausted) */
static void preempt_newest(sm_server *s) {
  job *nj = NULL;
  for (int i = 0; i < s->n_active; i++)
    if (!nj || s->active[i]->seq_no > nj->seq_no) nj = s->active[i];
  if (!nj) return;
  if (s->n_active == 1) {
    /* alone and still out of memory: the cache cannot hold this request */
    bool any_gen = false;
    for (int i = 0; i < nj->n; i++) any_gen |= nj->ch[i].n_gen > 0;
    if (!any_gen) {
      job_fail(s, nj, 400, "the prompt does not fit in the KV cache");
      return;
    }
    for (int i = 0; i < nj->n; i++) {
      choice *c = &nj->ch[i];
      if (!c->finish) { c->finish = FIN_LENGTH; update_safe(s, nj, c); }
    }
    job_finish(s, nj);
    return;
  }
  /* the reserved fork slots are given back with the sequences */
  if (nj->fork_pending) { s->active_seqs -= nj->n - 1; nj->fork_pending = false; }
  release_seqs(s, nj);
  remove_active(s, nj);
  nj->queued = true;
  nj->next = s->qhead;
  s->qhead = nj;
  if (!s->qtail) s->qtail = nj;
  s->n_queued++;
  s->admit_blocked = true;
  sm_metrics_preempt(s->metrics);
}

/* Sample one token for choice ci of job j from logits row (modified), or, when row is NULL, take
 * tok, already sampled on the backend (sm_engine_step_sample). Engine thread, mu NOT held. */
static void process_token(sm_server *s, job *j, int ci, float *row, int32_t tok, float *lpbuf, int32_t *topbuf) {
  choice *c = &j->ch[ci];
  tokrec rec = {0};
  if (row && j->req.logprobs) sm_log_softmax(row, s->vocab, lpbuf);
  if (row) tok = sm_sampler_sample(&c->sampler, row, sm_seq_tokens(c->seq), sm_seq_len(c->seq));
  if (tok < 0 || tok >= s->vocab) tok = s->n_eos ? s->eos[0] : 0;
  rec.id = tok;
  if (row && j->req.logprobs) {
    rec.lp = lpbuf[tok];
    int k = j->req.top_logprobs;
    if (k > 0) {
      sm_top_n(lpbuf, s->vocab, k, topbuf);
      rec.ntop = k;
      rec.top_ids = sm_xmalloc(sizeof(int32_t) * (size_t)k);
      rec.top_lps = sm_xmalloc(sizeof(float) * (size_t)k);
      for (int i = 0; i < k; i++) { rec.top_ids[i] = topbuf[i]; rec.top_lps[i] = lpbuf[topbuf[i]]; }
    }
  }
  bool eos = is_eos(s, tok);
  char *piece = NULL, *tail = NULL;
  size_t plen = 0, tlen = 0;
  if (!eos) plen = sm_detok_push(c->detok, tok, &piece);
  if (c->n_gen == c->cap_gen) {
    c->cap_gen = c->cap_gen ? c->cap_gen * 2 : 64;
    c->gen = sm_xrealloc(c->gen, sizeof(int32_t) * (size_t)c->cap_gen);
  }
  c->gen[c->n_gen++] = tok;
  bool at_len = c->n_gen >= j->max_tokens;
  if (eos || at_len) tlen = sm_detok_flush(c->detok, &tail);
  double now = sm_now();

  pthread_mutex_lock(&s->mu);
  if (!j->first_token) {
    j->first_token = true;
    sm_metrics_ttft(s->metrics, now - j->t_arrival);
  } else if (c->t_last > 0) {
    sm_metrics_itl(s->metrics, now - c->t_last);
  }
  c->t_last = now;
  size_t old_len = c->len;
  for (int part = 0; part < 2; part++) {
    const char *p = part ? tail : piece;
    size_t n = part ? tlen : plen;
    if (!p || !n || c->finish) continue;
    if (j->req.json_mode) {
      if (c->jt.complete) continue;
      if (!c->jt.started) {
        const char *b = memchr(p, '{', n);
        if (!b) continue;
        n -= (size_t)(b - p);
        p = b;
      }
      n = sm_json_track_feed(&c->jt, p, n);
    }
    text_put(c, p, n);
  }
  if (c->n_toks == c->cap_toks) {
    c->cap_toks = c->cap_toks ? c->cap_toks * 2 : 64;
    c->toks = sm_xrealloc(c->toks, sizeof(tokrec) * (size_t)c->cap_toks);
  }
  rec.end = c->len;
  c->toks[c->n_toks++] = rec;
  if (j->req.n_stop) {
    size_t maxs = 0;
    for (int i = 0; i < j->req.n_stop; i++) maxs = SM_MAX(maxs, strlen(j->req.stop[i]));
    size_t from = old_len + 1 > maxs ? old_len + 1 - maxs : 0;
    long pos = sm_stop_find(c->text, c->len, from, j->req.stop, j->req.n_stop);
    if (pos >= 0) {
      c->len = (size_t)pos;
      c->text[c->len] = 0;
      for (int k = 0; k < c->n_toks; k++)
        if (c->toks[k].end > c->len) c->toks[k].end = c->len;
      c->finish = FIN_STOP;
    }
  }
  if (!c->finish) {
    if (eos || (j->req.json_mode && c->jt.complete)) c->finish = FIN_STOP;
    else if (at_len) c->finish = FIN_LENGTH;
  }
  update_safe(s, j, c);
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&s->mu);
  free(piece);
  free(tail);
  if (!c->finish) {
    smelt_status st = sm_seq_append(s->eng, c->seq, &tok, 1);
    if (st != SMELT_OK) {
      pthread_mutex_lock(&s->mu);
      c->finish = FIN_LENGTH;
      update_safe(s, j, c);
      pthread_cond_broadcast(&j->cv);
      pthread_mutex_unlock(&s->mu);
    }
  }
}

static void *engine_main(void *arg) {
  sm_server *s = arg;
  int cap = s->p.parallel;
  float *logits = sm_xmalloc(sizeof(float) * (size_t)s->vocab * (size_t)cap);
  float *tmp = sm_xmalloc(sizeof(float) * (size_t)s->vocab);
  float *lpbuf = sm_xmalloc(sizeof(float) * (size_t)s->vocab);
  int32_t *topbuf = sm_xmalloc(sizeof(int32_t) * SM_API_MAX_TOP_LOGPROBS);
  sm_seq **seqs = sm_xmalloc(sizeof(sm_seq *) * (size_t)cap);
  job **bjob = sm_xmalloc(sizeof(job *) * (size_t)cap);
  int *bci = sm_xmalloc(sizeof(int) * (size_t)cap);
  uint8_t *done = sm_xmalloc((size_t)cap);
  sm_sampler **bsmp = sm_xmalloc(sizeof(sm_sampler *) * (size_t)cap); /* NULL: full logits row needed */
  int32_t *btok = sm_xmalloc(sizeof(int32_t) * (size_t)cap);

  pthread_mutex_lock(&s->mu);
  while (!s->stopping) {
    /* drop cancelled jobs */
    for (int i = 0; i < s->n_active;) {
      job *j = s->active[i];
      if (j->cancelled) {
        if (j->fork_pending) { s->active_seqs -= j->n - 1; j->fork_pending = false; }
        job_finish(s, j);
      } else i++;
    }
    for (job **pp = &s->qhead, *prev = NULL; *pp;) {
      job *j = *pp;
      if (j->cancelled) {
        *pp = j->next;
        if (s->qtail == j) s->qtail = prev;
        s->n_queued--;
        j->queued = false;
        j->done = true;
        sm_metrics_cancel(s->metrics);
        pthread_cond_broadcast(&j->cv);
        job_unref(j);
      } else { prev = j; pp = &j->next; }
    }
    /* admit waiting jobs while sequence slots are free */
    if (s->n_active == 0) s->admit_blocked = false;
    while (s->qhead && !s->admit_blocked) {
      job *j = s->qhead;
      int need = 0;
      for (int i = 0; i < j->n; i++) need += !j->ch[i].finish;
      if (s->n_active > 0 && s->active_seqs + need > s->p.parallel) break;
      s->qhead = j->next;
      if (!s->qhead) s->qtail = NULL;
      s->n_queued--;
      j->queued = false;
      j->next = NULL;
      if (!admit(s, j)) {
        release_seqs(s, j);
        job_fail(s, j, 503, "could not allocate a sequence for the request");
      }
    }
    sm_engine_get_stats(s->eng, &s->stats);
    if (s->n_active == 0) {
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    /* one batch: every running choice of every active job */
    int n = 0;
    for (int a = 0; a < s->n_active; a++) {
      job *j = s->active[a];
      for (int i = 0; i < j->n && n < cap; i++)
        if (j->ch[i].seq && !j->ch[i].finish) {
          seqs[n] = j->ch[i].seq; bjob[n] = j; bci[n] = i;
          /* sampled on the backend unless the host needs the whole row: logprobs, or the
           * prompt row that the other choices of an n > 1 request are forked from */
          bsmp[n] = j->req.logprobs || (i == 0 && j->fork_pending) ? NULL : &j->ch[i].sampler;
          n++;
        }
    }
    /* jobs without running sequences (all finished) leave */
    for (int a = 0; a < s->n_active;) {
      job *j = s->active[a];
      bool any = false;
      for (int i = 0; i < j->n; i++) any |= !j->ch[i].finish;
      if (!any) job_finish(s, j);
      else a++;
    }
    if (n == 0) continue;
    pthread_mutex_unlock(&s->mu);
    memset(done, 0, (size_t)n);
    smelt_status st = sm_engine_step_sample(s->eng, seqs, n, bsmp, btok, logits, done);
    if (st == SMELT_ERR_OOM) {
      pthread_mutex_lock(&s->mu);
      preempt_newest(s);
      continue;
    }
    if (st != SMELT_OK) {
      char msg[256];
      snprintf(msg, sizeof msg, "engine step failed: %s", sm_errmsg());
      fprintf(stderr, "smelt serve: %s\n", msg);
      pthread_mutex_lock(&s->mu);
      while (s->n_active) job_fail(s, s->active[0], 500, msg);
      continue;
    }
    for (int k = 0; k < n; k++) {
      if (!done[k]) continue;
      job *j = bjob[k];
      if (bsmp[k]) { process_token(s, j, bci[k], NULL, btok[k], lpbuf, topbuf); continue; }
      float *row = logits + (size_t)k * (size_t)s->vocab;
      if (bci[k] == 0 && j->fork_pending) {
        /* n > 1: the prompt was computed once; fork it for the other choices */
        j->fork_pending = false;
        for (int i = 1; i < j->n; i++) {
          choice *c = &j->ch[i];
          c->seq = sm_seq_fork(s->eng, j->ch[0].seq);
          if (c->seq) {
            memcpy(tmp, row, sizeof(float) * (size_t)s->vocab);
            process_token(s, j, i, tmp, -1, lpbuf, topbuf);
          } else {
            c->seq = sm_seq_new(s->eng); /* fallback: recompute (prefix cache helps) */
            if (c->seq) {
              sm_seq_append(s->eng, c->seq, j->prompt, j->n_prompt);
              sm_seq_use_prefix_cache(s->eng, c->seq);
            } else {
              pthread_mutex_lock(&s->mu);
              c->finish = FIN_LENGTH;
              s->active_seqs--;
              pthread_mutex_unlock(&s->mu);
            }
          }
        }
      }
      process_token(s, j, bci[k], row, -1, lpbuf, topbuf);
    }
    pthread_mutex_lock(&s->mu);
    /* free the KV of finished choices right away */
    for (int k = 0; k < n; k++) {
      job *j = bjob[k];
      for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        if (c->finish && c->seq) {
          sm_seq_free(s->eng, c->seq);
          c->seq = NULL;
          s->active_seqs--;
          s->admit_blocked = false;
        }
      }
    }
  }
  /* shutdown: fail everything still around */
  while (s->n_active) job_fail(s, s->active[0], 503, "server is shutting down");
  while (s->qhead) {
    job *j = s->qhead;
    s->qhead = j->next;
    s->n_queued--;
    j->queued = false;
    j->failed = true;
    j->fail_status = 503;
    snprintf(j->errmsg, sizeof j->errmsg, "server is shutting down");
    j->done = true;
    pthread_cond_broadcast(&j->cv);
    job_unref(j);
  }
  pthread_mutex_unlock(&s->mu);
  free(logits); free(tmp); free(lpbuf); free(topbuf); free(seqs); free(bjob); free(bci); free(done);
  free(bsmp); free(btok);
  return NULL;
}

/* ------------------------------------------------------------------ HTTP helpers */

typedef struct {
  int ep;
  const char *ep_name;
  char *body;
  size_t len, cap;
  bool too_large;
} conn;

enum { EP_NONE = 0, EP_CHAT, EP_COMPL, EP_RESP, EP_MODELS, EP_HEALTH, EP_METRICS };

static void add_cors(sm_server *s, struct MHD_Connection *c, struct MHD_Response *r) {
  if (!s->origins) return;
  const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  if (!strcmp(s->origins, "*")) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
  } else if (origin) {
    /* exact match against the comma-separated list */
    const char *p = s->origins;
    size_t ol = strlen(origin);
    while (*p) {
      while (*p == ' ' || *p == ',') p++;
      const char *e = p;
      while (*e && *e != ',') e++;
      const char *te = e;
      while (te > p && te[-1] == ' ') te--;
      if ((size_t)(te - p) == ol && !memcmp(p, origin, ol)) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
        break;
      }
      p = e;
    }
  }
}

static enum MHD_Result send_body(sm_server *s, struct MHD_Connection *c, conn *cc, int status, const char *ctype,
                                 const char *body) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", ctype);
  add_cors(s, c, r);
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  sm_metrics_request(s->metrics, cc && cc->ep_name ? cc->ep_name : "other", status);
  return ret;
}

static enum MHD_Result send_json(sm_server *s, struct MHD_Connection *c, conn *cc, int status, cJSON *j) {
  char *body = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  enum MHD_Result r = send_body(s, c, cc, status, "application/json", body);
  free(body);
  return r;
}

static enum MHD_Result send_error(sm_server *s, struct MHD_Connection *c, conn *cc, const sm_api_error *e) {
  char *body = sm_api_error_json(e);
  enum MHD_Result r = send_body(s, c, cc, e->http_status, "application/json", body);
  free(body);
  return r;
}

static enum MHD_Result send_err(sm_server *s, struct MHD_Connection *c, conn *cc, int status, const char *type,
                                const char *param, const char *code, const char *msg) {
  sm_api_error e;
  sm_api_error_set(&e, status, type, param, code, "%s", msg);
  return send_error(s, c, cc, &e);
}

static bool conn_closed(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return false;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return true;
  return false;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)ms * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(cv, mu, &ts);
}

/* ------------------------------------------------------------------ response building */

static char *tok_str(sm_server *s, int32_t id) {
  char *t = NULL;
  if (smelt_detokenize(s->tok, &id, 1, false, &t) != SMELT_OK || !t) t = sm_xstrdup("");
  return t;
}

static cJSON *bytes_arr(const char *t) {
  cJSON *b = cJSON_CreateArray();
  for (const unsigned char *p = (const unsigned char *)t; *p; p++) cJSON_AddItemToArray(b, cJSON_CreateNumber(*p));
  return b;
}

/* chat logprobs content entries for toks [from, to) */
static cJSON *chat_logprobs(sm_server *s, job *j, choice *c, int from, int to) {
  cJSON *lp = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(lp, "content");
  for (int k = from; k < to; k++) {
    tokrec *r = &c->toks[k];
    cJSON *e = cJSON_CreateObject();
    char *t = tok_str(s, r->id);
    cJSON_AddStringToObject(e, "token", t);
    cJSON_AddNumberToObject(e, "logprob", r->lp);
    cJSON_AddItemToObject(e, "bytes", bytes_arr(t));
    free(t);
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < r->ntop; i++) {
      cJSON *te = cJSON_CreateObject();
      char *tt = tok_str(s, r->top_ids[i]);
      cJSON_AddStringToObject(te, "token", tt);
      cJSON_AddNumberToObject(te, "logprob", r->top_lps[i]);
      cJSON_AddItemToObject(te, "bytes", bytes_arr(tt));
      free(tt);
      cJSON_AddItemToArray(top, te);
    }
    cJSON_AddItemToArray(arr, e);
  }
  cJSON_AddNullToObject(lp, "refusal");
  return lp;
}

/* completions logprobs for toks [from, to); text offsets relative to base */
static cJSON *compl_logprobs(sm_server *s, job *j, choice *c, int from, int to, size_t base) {
  cJSON *lp = cJSON_CreateObject();
  cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
  cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs"), *off = cJSON_AddArrayToObject(lp, "text_offset");
  for (int k = from; k < to; k++) {
    tokrec *r = &c->toks[k];
    char *t = tok_str(s, r->id);
    cJSON_AddItemToArray(toks, cJSON_CreateString(t));
    free(t);
    cJSON_AddItemToArray(tlp, cJSON_CreateNumber(r->lp));
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < r->ntop; i++) {
      char *tt = tok_str(s, r->top_ids[i]);
      if (!cJSON_GetObjectItemCaseSensitive(o, tt)) cJSON_AddNumberToObject(o, tt, r->top_lps[i]);
      free(tt);
    }
    cJSON_AddItemToArray(top, o);
    size_t start = k ? c->toks[k - 1].end : 0;
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(base + start)));
  }
  return lp;
}

/* number of tokens whose text lies within [0, upto) */
static int toks_upto(choice *c, size_t upto, int from) {
  int k = from;
  while (k < c->n_toks && c->toks[k].end <= upto) k++;
  return k;
}

static cJSON *usage_json(job *j, bool responses) {
  int gen = 0;
  for (int i = 0; i < j->n; i++) gen += j->ch[i].n_gen;
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, responses ? "input_tokens" : "prompt_tokens", j->n_prompt);
  cJSON_AddNumberToObject(u, responses ? "output_tokens" : "completion_tokens", gen);
  cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + gen);
  cJSON *d = cJSON_AddObjectToObject(u, responses ? "input_tokens_details" : "prompt_tokens_details");
  cJSON_AddNumberToObject(d, "cached_tokens", j->n_cached);
  if (responses) {
    cJSON *od = cJSON_AddObjectToObject(u, "output_tokens_details");
    cJSON_AddNumberToObject(od, "reasoning_tokens", 0);
  }
  return u;
}

/* Final content / tool calls / finish reason of a finished choice */
typedef struct { char *content; cJSON *tool_calls; const char *finish; } final_choice;
static void finalize_choice(job *j, int i, final_choice *f) {
  choice *c = &j->ch[i];
  f->tool_calls = NULL;
  f->content = NULL;
  f->finish = c->finish == FIN_LENGTH ? "length" : "stop";
  if (j->tool_mode && sm_toolcall_parse(c->text, mix64(j->seq_no * 131 + (uint64_t)i), &f->tool_calls, &f->content) > 0) {
    f->finish = "tool_calls";
    return;
  }
  f->content = sm_xstrdup(c->text ? c->text : "");
}

static cJSON *response_object(sm_server *s, job *j, const char *status) {
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "object", "response");
  cJSON_AddNumberToObject(r, "created_at", (double)j->created);
  cJSON_AddStringToObject(r, "status", status);
  cJSON_AddStringToObject(r, "model", s->alias);
  cJSON *out = cJSON_AddArrayToObject(r, "output");
  if (!strcmp(status, "in_progress")) {
    cJSON_AddNullToObject(r, "usage");
    return r;
  }
  final_choice f;
  finalize_choice(j, 0, &f);
  if (f.finish[0] == 'l') {
    cJSON_SetValuestring(cJSON_GetObjectItemCaseSensitive(r, "status"), "incomplete");
    cJSON *d = cJSON_AddObjectToObject(r, "incomplete_details");
    cJSON_AddStringToObject(d, "reason", "max_output_tokens");
  }
  if (f.content || !f.tool_calls) {
    cJSON *m = cJSON_CreateObject();
    char mid[80];
    snprintf(mid, sizeof mid, "msg_%s", j->id + 5);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "id", mid);
    cJSON_AddStringToObject(m, "status", "completed");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    cJSON *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", "output_text");
    cJSON_AddStringToObject(part, "text", f.content ? f.content : "");
    cJSON_AddArrayToObject(part, "annotations");
    cJSON_AddItemToArray(content, part);
    cJSON_AddItemToArray(out, m);
  }
  if (f.tool_calls) {
    cJSON *tc;
    cJSON_ArrayForEach(tc, f.tool_calls) {
      cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
      cJSON *it = cJSON_CreateObject();
      const char *cid = cJSON_GetObjectItemCaseSensitive(tc, "id")->valuestring;
      char fid[80];
      snprintf(fid, sizeof fid, "fc_%s", cid + 5);
      cJSON_AddStringToObject(it, "type", "function_call");
      cJSON_AddStringToObject(it, "id", fid);
      cJSON_AddStringToObject(it, "call_id", cid);
      cJSON_AddStringToObject(it, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
      cJSON_AddStringToObject(it, "arguments", cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring);
      cJSON_AddStringToObject(it, "status", "completed");
      cJSON_AddItemToArray(out, it);
    }
  }
  cJSON_AddItemToObject(r, "usage", usage_json(j, true));
  free(f.content);
  cJSON_Delete(f.tool_calls);
  return r;
}

static cJSON *full_response(sm_server *s, job *j) {
  if (j->req.kind == SM_EP_RESPONSES) return response_object(s, j, "completed");
  cJSON *r = cJSON_CreateObject();
  bool chat = j->req.kind == SM_EP_CHAT;
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "object", chat ? "chat.completion" : "text_completion");
  cJSON_AddNumberToObject(r, "created", (double)j->created);
  cJSON_AddStringToObject(r, "model", s->alias);
  cJSON_AddStringToObject(r, "system_fingerprint", "smelt-" SMELT_VERSION);
  cJSON *choices = cJSON_AddArrayToObject(r, "choices");
  for (int i = 0; i < j->n; i++) {
    choice *c = &j->ch[i];
    final_choice f;
    finalize_choice(j, i, &f);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", i);
    int nt = toks_upto(c, c->len, 0);
    if (chat) {
      cJSON *m = cJSON_AddObjectToObject(o, "message");
      cJSON_AddStringToObject(m, "role", "assistant");
      if (f.content) cJSON_AddStringToObject(m, "content", f.content);
      else cJSON_AddNullToObject(m, "content");
      cJSON_AddNullToObject(m, "refusal");
      if (f.tool_calls) { cJSON_AddItemToObject(m, "tool_calls", f.tool_calls); f.tool_calls = NULL; }
      if (j->req.logprobs) cJSON_AddItemToObject(o, "logprobs", chat_logprobs(s, j, c, 0, nt));
      else cJSON_AddNullToObject(o, "logprobs");
    } else {
      sbuf t = {0};
      sb_str(&t, "");
      if (j->req.echo && j->req.prompt) sb_str(&t, j->req.prompt);
      sb_str(&t, f.content ? f.content : "");
      cJSON_AddStringToObject(o, "text", t.s);
      size_t base = j->req.echo && j->req.prompt ? strlen(j->req.prompt) : 0;
      free(t.s);
      if (j->req.logprobs) cJSON_AddItemToObject(o, "logprobs", compl_logprobs(s, j, c, 0, nt, base));
      else cJSON_AddNullToObject(o, "logprobs");
    }
    cJSON_AddStringToObject(o, "finish_reason", f.finish);
    cJSON_AddItemToArray(choices, o);
    free(f.content);
    cJSON_Delete(f.tool_calls);
  }
  cJSON_AddItemToObject(r, "usage", usage_json(j, false));
  return r;
}

/* ------------------------------------------------------------------ streaming */

typedef struct {
  sm_server *s;
  job *j;
  struct MHD_Connection *c;
  sbuf out;
  size_t off;
  bool head_sent, finished;
  int seqnum;
  size_t resp_sent; /* responses: text bytes sent */
} stream;

static void sse_data(sbuf *b, cJSON *j) {
  char *t = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  sb_str(b, "data: ");
  sb_str(b, t);
  sb_str(b, "\n\n");
  free(t);
}

static void sse_event(stream *st, const char *type, cJSON *j) {
  cJSON_AddStringToObject(j, "type", type);
  cJSON_AddNumberToObject(j, "sequence_number", st->seqnum++);
  char *t = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  sb_str(&st->out, "event: ");
  sb_str(&st->out, type);
  sb_str(&st->out, "\ndata: ");
  sb_str(&st->out, t);
  sb_str(&st->out, "\n\n");
  free(t);
}

static cJSON *chunk_base(sm_server *s, job *j) {
  cJSON *r = cJSON_CreateObject();
  bool chat = j->req.kind == SM_EP_CHAT;
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "object", chat ? "chat.completion.chunk" : "text_completion");
  cJSON_AddNumberToObject(r, "created", (double)j->created);
  cJSON_AddStringToObject(r, "model", s->alias);
  cJSON_AddStringToObject(r, "system_fingerprint", "smelt-" SMELT_VERSION);
  return r;
}

static void chunk_choice(stream *st, int i, const char *text, size_t tlen, int tfrom, int tto, const char *finish,
                         cJSON *tool_calls, bool role) {
  sm_server *s = st->s;
  job *j = st->j;
  bool chat = j->req.kind == SM_EP_CHAT;
  cJSON *r = chunk_base(s, j), *arr = cJSON_AddArrayToObject(r, "choices"), *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "index", i);
  char *t = sm_xmalloc(tlen + 1);
  memcpy(t, text ? text : "", tlen);
  t[tlen] = 0;
  if (chat) {
    cJSON *d = cJSON_AddObjectToObject(o, "delta");
    if (role) cJSON_AddStringToObject(d, "role", "assistant");
    if (text) cJSON_AddStringToObject(d, "content", t);
    if (tool_calls) {
      cJSON *tc;
      int k = 0;
      cJSON_ArrayForEach(tc, tool_calls) cJSON_AddNumberToObject(tc, "index", k++);
      cJSON_AddItemToObject(d, "tool_calls", tool_calls);
    }
    if (j->req.logprobs && tto > tfrom) cJSON_AddItemToObject(o, "logprobs", chat_logprobs(s, j, &j->ch[i], tfrom, tto));
    else cJSON_AddNullToObject(o, "logprobs");
  } else {
    cJSON_AddStringToObject(o, "text", t);
    if (j->req.logprobs && tto > tfrom)
      cJSON_AddItemToObject(o, "logprobs", compl_logprobs(s, j, &j->ch[i], tfrom, tto, 0));
    else cJSON_AddNullToObject(o, "logprobs");
  }
  free(t);
  if (finish) cJSON_AddStringToObject(o, "finish_reason", finish);
  else cJSON_AddNullToObject(o, "finish_reason");
  cJSON_AddItemToArray(arr, o);
  if (j->req.include_usage) cJSON_AddNullToObject(r, "usage");
  sse_data(&st->out, r);
}

static void stream_err(stream *st) {
  sm_api_error e;
  sm_api_error_set(&e, st->j->fail_status ? st->j->fail_status : 500, "server_error", NULL, NULL, "%s",
                   st->j->errmsg);
  char *b = sm_api_error_json(&e);
  sb_str(&st->out, "data: ");
  sb_str(&st->out, b);
  sb_str(&st->out, "\n\n");
  free(b);
}

/* under mu: append newly available events to st->out */
static void stream_produce(stream *st) {
  sm_server *s = st->s;
  job *j = st->j;
  if (j->req.kind == SM_EP_RESPONSES) {
    choice *c = &j->ch[0];
    char mid[80];
    snprintf(mid, sizeof mid, "msg_%s", j->id + 5);
    if (!st->head_sent) {
      st->head_sent = true;
      cJSON *e = cJSON_CreateObject();
      cJSON_AddItemToObject(e, "response", response_object(s, j, "in_progress"));
      sse_event(st, "response.created", e);
      e = cJSON_CreateObject();
      cJSON_AddItemToObject(e, "response", response_object(s, j, "in_progress"));
      sse_event(st, "response.in_progress", e);
      e = cJSON_CreateObject();
      cJSON_AddNumberToObject(e, "output_index", 0);
      cJSON *it = cJSON_AddObjectToObject(e, "item");
      cJSON_AddStringToObject(it, "type", "message");
      cJSON_AddStringToObject(it, "id", mid);
      cJSON_AddStringToObject(it, "status", "in_progress");
      cJSON_AddStringToObject(it, "role", "assistant");
      cJSON_AddArrayToObject(it, "content");
      sse_event(st, "response.output_item.added", e);
      e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "item_id", mid);
      cJSON_AddNumberToObject(e, "output_index", 0);
      cJSON_AddNumberToObject(e, "content_index", 0);
      cJSON *part = cJSON_AddObjectToObject(e, "part");
      cJSON_AddStringToObject(part, "type", "output_text");
      cJSON_AddStringToObject(part, "text", "");
      cJSON_AddArrayToObject(part, "annotations");
      sse_event(st, "response.content_part.added", e);
    }
    if (j->failed) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "code", "server_error");
      cJSON_AddStringToObject(e, "message", j->errmsg);
      sse_event(st, "error", e);
      st->finished = true;
      return;
    }
    if (c->safe > st->resp_sent && !j->tool_mode) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "item_id", mid);
      cJSON_AddNumberToObject(e, "output_index", 0);
      cJSON_AddNumberToObject(e, "content_index", 0);
      char *t = sm_xmalloc(c->safe - st->resp_sent + 1);
      memcpy(t, c->text + st->resp_sent, c->safe - st->resp_sent);
      t[c->safe - st->resp_sent] = 0;
      cJSON_AddStringToObject(e, "delta", t);
      free(t);
      sse_event(st, "response.output_text.delta", e);
      st->resp_sent = c->safe;
    }
    if (j->done) {
      final_choice f;
      finalize_choice(j, 0, &f);
      if (j->tool_mode && f.content && !f.tool_calls) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "item_id", mid);
        cJSON_AddNumberToObject(e, "output_index", 0);
        cJSON_AddNumberToObject(e, "content_index", 0);
        cJSON_AddStringToObject(e, "delta", f.content);
        sse_event(st, "response.output_text.delta", e);
      }
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "item_id", mid);
      cJSON_AddNumberToObject(e, "output_index", 0);
      cJSON_AddNumberToObject(e, "content_index", 0);
      cJSON_AddStringToObject(e, "text", f.content ? f.content : "");
      sse_event(st, "response.output_text.done", e);
      free(f.content);
      cJSON_Delete(f.tool_calls);
      cJSON *full = response_object(s, j, "completed");
      cJSON *out = cJSON_GetObjectItemCaseSensitive(full, "output"), *it;
      int oi = 0;
      cJSON_ArrayForEach(it, out) {
        e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "output_index", oi++);
        cJSON_AddItemToObject(e, "item", cJSON_Duplicate(it, 1));
        sse_event(st, "response.output_item.done", e);
      }
      e = cJSON_CreateObject();
      cJSON_AddItemToObject(e, "response", full);
      sse_event(st, "response.completed", e);
      st->finished = true;
    }
    return;
  }
  bool chat = j->req.kind == SM_EP_CHAT;
  if (!st->head_sent) {
    st->head_sent = true;
    if (chat)
      for (int i = 0; i < j->n; i++) chunk_choice(st, i, "", 0, 0, 0, NULL, NULL, true);
    else if (j->req.echo && j->req.prompt)
      for (int i = 0; i < j->n; i++) chunk_choice(st, i, j->req.prompt, strlen(j->req.prompt), 0, 0, NULL, NULL, false);
  }
  if (j->failed) {
    stream_err(st);
    sb_str(&st->out, "data: [DONE]\n\n");
    st->finished = true;
    return;
  }
  for (int i = 0; i < j->n; i++) {
    choice *c = &j->ch[i];
    if (c->end_sent) continue;
    if (c->finish && j->tool_mode) {
      final_choice f;
      finalize_choice(j, i, &f);
      if (f.tool_calls) {
        /* content before the call that was not streamed yet */
        if (f.content && strlen(f.content) > c->sent)
          chunk_choice(st, i, f.content + c->sent, strlen(f.content) - c->sent, c->toks_sent, c->n_toks, NULL, NULL,
                       false);
        chunk_choice(st, i, NULL, 0, 0, 0, NULL, f.tool_calls, false);
        f.tool_calls = NULL;
      } else if (c->len > c->sent) {
        chunk_choice(st, i, c->text + c->sent, c->len - c->sent, c->toks_sent, toks_upto(c, c->len, c->toks_sent),
                     NULL, NULL, false);
      }
      c->sent = c->len;
      c->toks_sent = c->n_toks;
      chunk_choice(st, i, NULL, 0, 0, 0, f.finish, NULL, false);
      c->end_sent = true;
      free(f.content);
      cJSON_Delete(f.tool_calls);
      continue;
    }
    if (c->safe > c->sent) {
      int tto = toks_upto(c, c->safe, c->toks_sent);
      chunk_choice(st, i, c->text + c->sent, c->safe - c->sent, c->toks_sent, tto, NULL, NULL, false);
      c->sent = c->safe;
      c->toks_sent = tto;
    }
    if (c->finish && c->sent == c->len) {
      chunk_choice(st, i, chat ? NULL : "", 0, 0, 0, c->finish == FIN_LENGTH ? "length" : "stop", NULL, false);
      c->end_sent = true;
    }
  }
  if (j->done) {
    bool all = true;
    for (int i = 0; i < j->n; i++) all &= j->ch[i].end_sent;
    if (all) {
      if (j->req.include_usage) {
        cJSON *r = chunk_base(s, j);
        cJSON_AddArrayToObject(r, "choices");
        cJSON_AddItemToObject(r, "usage", usage_json(j, false));
        sse_data(&st->out, r);
      }
      sb_str(&st->out, "data: [DONE]\n\n");
      st->finished = true;
    }
  }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  stream *st = cls;
  if (st->off >= st->out.len) {
    st->off = 0;
    st->out.len = 0;
    if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_lock(&st->s->mu);
    for (;;) {
      stream_produce(st);
      if (st->out.len > 0 || st->finished) break;
      timed_wait(&st->j->cv, &st->s->mu, 100);
      if (conn_closed(st->c)) {
        st->j->cancelled = true;
        pthread_cond_signal(&st->s->cv);
        pthread_mutex_unlock(&st->s->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
    }
    pthread_mutex_unlock(&st->s->mu);
    if (st->out.len == 0) return MHD_CONTENT_READER_END_OF_STREAM;
  }
  size_t n = SM_MIN(max, st->out.len - st->off);
  memcpy(buf, st->out.s + st->off, n);
  st->off += n;
  return (ssize_t)n;
}

static void stream_free(void *cls) {
  stream *st = cls;
  pthread_mutex_lock(&st->s->mu);
  if (!st->j->done) {
    st->j->cancelled = true;
    pthread_cond_signal(&st->s->cv);
  }
  job_unref(st->j);
  pthread_mutex_unlock(&st->s->mu);
  free(st->out.s);
  free(st);
}

/* ------------------------------------------------------------------ endpoints */

static enum MHD_Result handle_generate(sm_server *s, struct MHD_Connection *c, conn *cc, sm_ep_kind kind) {
  sm_api_request req;
  sm_api_error err;
  if (!sm_api_parse(kind, cc->body, cc->len, &req, &err)) return send_error(s, c, cc, &err);
  if (req.n > s->p.parallel) {
    sm_api_request_free(&req);
    char m[128];
    snprintf(m, sizeof m, "'n' must not exceed the server's --parallel (%d)", s->p.parallel);
    return send_err(s, c, cc, 400, "invalid_request_error", "n", NULL, m);
  }
  /* default sampling from generation_config when the request gives none */
  const sm_config *cfg = &s->model->cfg;
  if (!req.has_temperature && cfg->gen_temperature > 0) req.sampling.temperature = cfg->gen_temperature;
  if (!req.has_top_p && cfg->gen_top_p > 0) req.sampling.top_p = cfg->gen_top_p;
  if (!req.has_top_k && cfg->gen_top_k > 0) req.sampling.top_k = cfg->gen_top_k;
  /* prompt */
  int32_t *ids = NULL;
  size_t n_ids = 0;
  const char *pparam = kind == SM_EP_COMPLETIONS ? "prompt" : kind == SM_EP_CHAT ? "messages" : "input";
  if (kind == SM_EP_COMPLETIONS && req.prompt_ids) {
    for (int i = 0; i < req.n_prompt_ids; i++)
      if (req.prompt_ids[i] >= s->vocab) {
        sm_api_request_free(&req);
        return send_err(s, c, cc, 400, "invalid_request_error", "prompt", NULL, "token id out of the vocabulary");
      }
    n_ids = (size_t)req.n_prompt_ids;
    ids = sm_xmalloc(sizeof(int32_t) * (n_ids ? n_ids : 1));
    memcpy(ids, req.prompt_ids, sizeof(int32_t) * n_ids);
  } else {
    char *text = NULL;
    bool add_special = true;
    if (kind == SM_EP_COMPLETIONS) {
      text = sm_xstrdup(req.prompt);
    } else {
      if (sm_chat_apply(s->tok, req.messages, req.tools, true, req.chat_template_kwargs, &text) != SMELT_OK) {
        char m[400];
        snprintf(m, sizeof m, "could not apply the chat template: %s", sm_errmsg());
        sm_api_request_free(&req);
        return send_err(s, c, cc, 400, "invalid_request_error", pparam, NULL, m);
      }
      const char *bos = sm_tok_bos_token(s->tok);
      if (bos && bos[0] && !strncmp(text, bos, strlen(bos))) add_special = false;
    }
    smelt_status st = smelt_tokenize(s->tok, text, strlen(text), add_special, &ids, &n_ids);
    free(text);
    if (st != SMELT_OK) {
      char m[400];
      snprintf(m, sizeof m, "could not tokenize the prompt: %s", sm_errmsg());
      sm_api_request_free(&req);
      return send_err(s, c, cc, 400, "invalid_request_error", pparam, NULL, m);
    }
  }
  if (n_ids == 0) {
    free(ids);
    sm_api_request_free(&req);
    return send_err(s, c, cc, 400, "invalid_request_error", pparam, NULL, "the prompt is empty");
  }
  int max_tokens = req.max_tokens;
  if ((int)n_ids >= s->ctx || (max_tokens > 0 && (long)n_ids + max_tokens > s->ctx)) {
    char m[256];
    snprintf(m, sizeof m,
             "This model's maximum context length is %d tokens. However, you requested %ld tokens (%zu in the "
             "prompt, %d for the completion). Please reduce the prompt or the completion length.",
             s->ctx, (long)n_ids + (max_tokens > 0 ? max_tokens : 0), n_ids, max_tokens > 0 ? max_tokens : 0);
    free(ids);
    sm_api_request_free(&req);
    return send_err(s, c, cc, 400, "invalid_request_error", pparam, "context_length_exceeded", m);
  }
  if (max_tokens <= 0) max_tokens = s->ctx - (int)n_ids;

  job *j = sm_xcalloc(1, sizeof *j);
  j->srv = s;
  j->req = req;
  j->endpoint = cc->ep_name;
  j->prompt = ids;
  j->n_prompt = (int)n_ids;
  j->max_tokens = max_tokens;
  j->n = req.n;
  j->ch = sm_xcalloc((size_t)j->n, sizeof(choice));
  for (int i = 0; i < j->n; i++) { j->ch[i].text = sm_xmalloc(64); j->ch[i].text[0] = 0; j->ch[i].cap = 64; }
  j->tool_mode = req.tools != NULL && kind != SM_EP_COMPLETIONS;
  pthread_cond_init(&j->cv, NULL);
  j->t_arrival = sm_now();
  j->created = (long)time(NULL);
  j->refs = 2; /* this handler + the engine */

  pthread_mutex_lock(&s->mu);
  if (s->stopping) {
    pthread_mutex_unlock(&s->mu);
    job_free(j);
    return send_err(s, c, cc, 503, "server_error", NULL, NULL, "server is shutting down");
  }
  /* waiting requests beyond the free sequence slots are bounded by --max-queue */
  if (s->n_queued + 1 - SM_MAX(0, s->p.parallel - s->active_seqs) > s->p.max_queue) {
    pthread_mutex_unlock(&s->mu);
    job_free(j);
    return send_err(s, c, cc, 429, "rate_limit_error", NULL, "queue_full",
                    "the server is busy (request queue is full); retry later");
  }
  j->seq_no = ++s->next_id;
  snprintf(j->id, sizeof j->id, "%s-%016llx%04llx",
           kind == SM_EP_CHAT ? "chatcmpl" : kind == SM_EP_COMPLETIONS ? "cmpl" : "resp_",
           (unsigned long long)mix64((uint64_t)j->created ^ (j->seq_no << 20)), (unsigned long long)(j->seq_no & 0xffff));
  if (kind == SM_EP_RESPONSES) { /* resp_<hex> */
    memmove(j->id + 5, j->id + 6, strlen(j->id + 6) + 1);
  }
  j->queued = true;
  if (s->qtail) s->qtail->next = j;
  else s->qhead = j;
  s->qtail = j;
  s->n_queued++;
  pthread_cond_signal(&s->cv);

  if (req.stream) {
    stream *st = sm_xcalloc(1, sizeof *st);
    st->s = s;
    st->j = j; /* takes the handler's reference */
    st->c = c;
    pthread_mutex_unlock(&s->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_cors(s, c, r);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    sm_metrics_request(s->metrics, cc->ep_name, 200);
    return ret;
  }
  while (!j->done) {
    timed_wait(&j->cv, &s->mu, 100);
    if (!j->done && conn_closed(c)) {
      j->cancelled = true;
      pthread_cond_signal(&s->cv);
      while (!j->done) timed_wait(&j->cv, &s->mu, 100);
      job_unref(j);
      pthread_mutex_unlock(&s->mu);
      sm_metrics_request(s->metrics, cc->ep_name, 499);
      return MHD_NO;
    }
  }
  pthread_mutex_unlock(&s->mu);
  enum MHD_Result ret;
  if (j->failed) {
    ret = send_err(s, c, cc, j->fail_status ? j->fail_status : 500,
                   j->fail_status == 400 ? "invalid_request_error" : "server_error", NULL, NULL, j->errmsg);
  } else {
    ret = send_json(s, c, cc, 200, full_response(s, j));
  }
  pthread_mutex_lock(&s->mu);
  job_unref(j);
  pthread_mutex_unlock(&s->mu);
  return ret;
}

static enum MHD_Result handle_models(sm_server *s, struct MHD_Connection *c, conn *cc) {
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "object", "list");
  cJSON *d = cJSON_AddArrayToObject(r, "data"), *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", s->alias);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", 0);
  cJSON_AddStringToObject(m, "owned_by", "smelt");
  cJSON *meta = cJSON_AddObjectToObject(m, "meta");
  cJSON_AddStringToObject(meta, "arch", smelt_model_arch(s->model));
  cJSON_AddNumberToObject(meta, "n_ctx", s->ctx);
  cJSON_AddNumberToObject(meta, "n_vocab", s->vocab);
  cJSON_AddItemToArray(d, m);
  return send_json(s, c, cc, 200, r);
}

static enum MHD_Result handle_metrics(sm_server *s, struct MHD_Connection *c, conn *cc) {
  sm_metrics_gauges g = {0};
  pthread_mutex_lock(&s->mu);
  g.queued = s->n_queued;
  g.running_requests = s->n_active;
  g.running_seqs = s->active_seqs;
  g.kv_blocks_used = s->stats.blocks_used;
  g.kv_blocks_total = s->stats.n_blocks;
  g.kv_blocks_cached = s->stats.blocks_cached;
  g.kv_block_size = s->stats.block_size;
  g.prefix_hit_tokens = s->stats.prefix_hits_tokens;
  pthread_mutex_unlock(&s->mu);
  char *t = sm_metrics_render(s->metrics, &g);
  enum MHD_Result r = send_body(s, c, cc, 200, "text/plain; version=0.0.4; charset=utf-8", t);
  free(t);
  return r;
}

static bool auth_ok(sm_server *s, struct MHD_Connection *c) {
  if (!s->p.api_key || !s->p.api_key[0]) return true;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  const char *key = NULL;
  if (h && !strncasecmp(h, "Bearer ", 7)) key = h + 7;
  if (!key) key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
  if (!key) return false;
  size_t a = strlen(key), b = strlen(s->p.api_key);
  unsigned diff = (unsigned)(a != b);
  for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(key[i] ^ s->p.api_key[i]);
  return diff == 0;
}

static int route(const char *url, const char **name) {
  static const struct { const char *path; int ep; const char *name; } R[] = {
      {"/v1/chat/completions", EP_CHAT, "/v1/chat/completions"}, {"/chat/completions", EP_CHAT, "/v1/chat/completions"},
      {"/v1/completions", EP_COMPL, "/v1/completions"},          {"/completions", EP_COMPL, "/v1/completions"},
      {"/v1/responses", EP_RESP, "/v1/responses"},               {"/responses", EP_RESP, "/v1/responses"},
      {"/v1/models", EP_MODELS, "/v1/models"},                   {"/models", EP_MODELS, "/v1/models"},
      {"/health", EP_HEALTH, "/health"},                         {"/v1/health", EP_HEALTH, "/health"},
      {"/metrics", EP_METRICS, "/metrics"},
  };
  for (size_t i = 0; i < SM_ARRAY_LEN(R); i++)
    if (!strcmp(url, R[i].path)) { *name = R[i].name; return R[i].ep; }
  *name = "other";
  return EP_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  sm_server *s = cls;
  conn *cc = *con_cls;
  if (!cc) {
    cc = sm_xcalloc(1, sizeof *cc);
    *con_cls = cc;
    cc->ep = route(url, &cc->ep_name);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > s->p.max_body) cc->too_large = true;
    return MHD_YES;
  }
  if (*upload_size) {
    if (!cc->too_large) {
      if (cc->len + *upload_size > s->p.max_body) {
        cc->too_large = true;
        free(cc->body);
        cc->body = NULL;
        cc->len = cc->cap = 0;
      } else {
        if (cc->len + *upload_size + 1 > cc->cap) {
          cc->cap = (cc->len + *upload_size + 1) * 2;
          cc->body = sm_xrealloc(cc->body, cc->cap);
        }
        memcpy(cc->body + cc->len, upload, *upload_size);
        cc->len += *upload_size;
        cc->body[cc->len] = 0;
      }
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (s->p.verbose) fprintf(stderr, "smelt serve: %s %s\n", method, url);
  if (!strcmp(method, "OPTIONS")) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    add_cors(s, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const char *rh = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", rh ? rh : "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    sm_metrics_request(s->metrics, cc->ep_name, 204);
    return ret;
  }
  if (cc->ep == EP_NONE)
    return send_err(s, c, cc, 404, "invalid_request_error", NULL, "not_found", "unknown endpoint");
  if (cc->ep != EP_HEALTH && !auth_ok(s, c))
    return send_err(s, c, cc, 401, "authentication_error", NULL, "invalid_api_key", "Invalid or missing API key");
  bool post = cc->ep == EP_CHAT || cc->ep == EP_COMPL || cc->ep == EP_RESP;
  if (strcmp(method, post ? "POST" : "GET"))
    return send_err(s, c, cc, 405, "invalid_request_error", NULL, "method_not_allowed",
                    post ? "this endpoint only accepts POST" : "this endpoint only accepts GET");
  if (cc->too_large) {
    char m[128];
    snprintf(m, sizeof m, "request body exceeds the limit of %zu bytes", s->p.max_body);
    return send_err(s, c, cc, 413, "invalid_request_error", NULL, "request_too_large", m);
  }
  switch (cc->ep) {
  case EP_CHAT: return handle_generate(s, c, cc, SM_EP_CHAT);
  case EP_COMPL: return handle_generate(s, c, cc, SM_EP_COMPLETIONS);
  case EP_RESP: return handle_generate(s, c, cc, SM_EP_RESPONSES);
  case EP_MODELS: return handle_models(s, c, cc);
  case EP_METRICS: return handle_metrics(s, c, cc);
  default: return send_body(s, c, cc, 200, "application/json", "{\"status\":\"ok\"}");
  }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  conn *cc = *con_cls;
  if (!cc) return;
  free(cc->body);
  free(cc);
  *con_cls = NULL;
}

/* ------------------------------------------------------------------ lifecycle */

void sm_server_params_default(sm_server_params *p) {
  memset(p, 0, sizeof *p);
  p->host = "127.0.0.1";
  p->port = 8080;
  p->parallel = 4;
  p->max_queue = 64;
  p->max_body = 1u << 20;
}

static void add_eos(sm_server *s, int32_t id) {
  if (id < 0 || id >= s->vocab || s->n_eos >= (int)SM_ARRAY_LEN(s->eos) || is_eos(s, id)) return;
  s->eos[s->n_eos++] = id;
}

int sm_server_run(const sm_server_params *pp) {
  sm_server *s = sm_xcalloc(1, sizeof *s);
  s->p = *pp;
  if (s->p.parallel < 1) s->p.parallel = 1;
  if (s->p.max_queue < 0) s->p.max_queue = 0;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->metrics = sm_metrics_new();
  int rc = 1;

  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = (smelt_device)s->p.device;
  mp.n_threads = s->p.threads;
  mp.max_context = s->p.ctx_size;
  mp.max_seqs = s->p.parallel;
  fprintf(stderr, "smelt serve: loading %s\n", s->p.model_dir);
  if (smelt_model_load(s->p.model_dir, &mp, &s->model) != SMELT_OK) {
    fprintf(stderr, "smelt serve: could not load the model: %s\n", smelt_last_error());
    goto out;
  }
  s->tok = smelt_model_tokenizer(s->model);
  if (!s->tok) {
    fprintf(stderr, "smelt serve: the model directory has no tokenizer\n");
    goto out;
  }
  s->vocab = smelt_model_vocab_size(s->model);
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = s->p.parallel;
  if (s->p.ctx_size > 0) ep.max_context = s->p.ctx_size;
  else if (s->model->max_context > 0) ep.max_context = s->model->max_context;
  if (s->p.kv_blocks > 0) ep.n_blocks = s->p.kv_blocks;
  if (s->p.block_size > 0) ep.block_size = s->p.block_size;
  if (s->p.max_batch_tokens > 0) ep.max_batch_tokens = s->p.max_batch_tokens;
  ep.prefix_cache = !s->p.no_prefix_cache;
  if (sm_engine_create(s->model, &ep, &s->eng) != SMELT_OK) {
    fprintf(stderr, "smelt serve: could not create the engine: %s\n", smelt_last_error());
    goto out;
  }
  s->ctx = ep.max_context;
  for (int i = 0; i < s->model->cfg.n_eos; i++) add_eos(s, s->model->cfg.eos_ids[i]);
  const char *eos_tok = sm_tok_eos_token(s->tok);
  if (eos_tok) add_eos(s, sm_tok_token_id(s->tok, eos_tok));
  static const char *const ends[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<end_of_turn>",
                                     "<|endoftext|>", "<|end|>", "</s>"};
  for (size_t i = 0; i < SM_ARRAY_LEN(ends); i++) {
    int32_t id = sm_tok_token_id(s->tok, ends[i]);
    if (id >= 0 && sm_tok_is_special(s->tok, id)) add_eos(s, id);
  }
  sm_engine_get_stats(s->eng, &s->stats);
  if (s->p.alias && s->p.alias[0]) snprintf(s->alias, sizeof s->alias, "%s", s->p.alias);
  else {
    const char *d = s->p.model_dir;
    size_t l = strlen(d);
    while (l > 1 && d[l - 1] == '/') l--;
    size_t b = l;
    while (b > 0 && d[b - 1] != '/') b--;
    snprintf(s->alias, sizeof s->alias, "%.*s", (int)(l - b), d + b);
  }
  if (s->p.allowed_origins && s->p.allowed_origins[0]) s->origins = sm_xstrdup(s->p.allowed_origins);

  /* signals: handled synchronously by this thread */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
    fprintf(stderr, "smelt serve: could not start the engine thread\n");
    goto out;
  }
  /* bind */
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  char port[16];
  snprintf(port, sizeof port, "%d", s->p.port);
  int gr = getaddrinfo(s->p.host, port, &hints, &ai);
  if (gr != 0 || !ai) {
    fprintf(stderr, "smelt serve: cannot resolve host '%s': %s\n", s->p.host, gai_strerror(gr));
  } else {
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)1024, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    if (!s->d) fprintf(stderr, "smelt serve: could not listen on %s:%d: %s\n", s->p.host, s->p.port, strerror(errno));
  }
  if (ai) freeaddrinfo(ai);
  if (s->d) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    int bport = di ? di->port : s->p.port;
    fprintf(stderr, "smelt serve: model '%s' (%s), ctx %d, parallel %d, %d KV blocks of %d\n", s->alias,
            smelt_model_arch(s->model), s->ctx, s->p.parallel, s->stats.n_blocks, s->stats.block_size);
    fprintf(stderr, "smelt serve: listening on http://%s:%d\n", s->p.host, bport);
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "smelt serve: signal %d, shutting down\n", sig);
    rc = 0;
  }
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  if (s->d) MHD_stop_daemon(s->d);
out:
  if (s->eng) sm_engine_free(s->eng);
  if (s->model) smelt_model_free(s->model);
  sm_metrics_free(s->metrics);
  free(s->origins);
  free(s->active);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  return rc;
}
