/* HTTP front end of `smelt serve` (see http.h).
 *
 * libmicrohttpd runs a small pool of event-driven worker threads (epoll); no thread is tied
 * to a connection. A request is checked as soon as its headers are in — framing, path, method,
 * API key, declared size, body memory — and refused at once, before any body byte is read.
 * A request that waits for the engine is parked (conns.h): its connection is suspended and
 * resumed by its job's notify hook. Connection counts (in all and per client address),
 * header and body deadlines and the cap on buffered bodies bound what slow or hostile
 * clients can hold. */
#include "server/http.h"
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include "server/conns.h"
#include "server/sse.h"
#include "server/llama_api.h"
#include "server/anthropic.h"

struct sm_http {
  const sm_server_params *p;
  sm_models *models;
  sm_metrics *metrics;
  char *origins;
  struct MHD_Daemon *d;
  int port;
  int quiesced_fd;
  sm_conns *g;
  atomic_bool draining;
};

enum {
  EP_NONE = 0,
  EP_CHAT,
  EP_COMPL,
  EP_RESP,
  EP_MODELS,
  EP_HEALTH,
  EP_METRICS,
  EP_MODEL,
  EP_TOKENIZE,
  EP_DETOKENIZE,
  EP_APPLY_TEMPLATE,
  EP_PROPS,
  EP_SLOTS,
  EP_MESSAGES,
  EP_COUNT_TOKENS,
  EP_EMBEDDINGS,
  EP_SLOT_ACTION
};

/* one request (MHD's per-request context, created when its request line arrives) */
typedef struct {
  sm_sock *k;
  int ep;
  const char *ep_name;
  bool checked;    /* the checks on the headers are done */
  bool final_seen; /* the whole request has arrived */
  sm_buf body;
  size_t reserved; /* body bytes reserved in the guard's budget */
  bool too_large, over_budget;
  sm_job *job;   /* a non-streaming request waiting for its job */
  sm_served *sv; /* its model, held until the request ends */
  bool waiting;  /* parked until its model is loaded */
  int ticket;    /* sm_models_acquire's */
} req;

/* a streaming response */
typedef struct {
  sm_http *h;
  sm_sock *k;
  sm_served *sv; /* held until the stream ends */
  sm_sse sse;
} stream;

/* ------------------------------------------------------------------ responses */

/* exact match of the Origin against the comma-separated --allowed-origins list */
static bool origin_allowed(sm_http *h, const char *origin) {
  if (!h->origins) return false;
  if (!strcmp(h->origins, "*")) return true;
  if (!origin) return false;
  const char *p = h->origins;
  size_t ol = strlen(origin);
  while (*p) {
    while (*p == ' ' || *p == ',') p++;
    const char *e = p;
    while (*e && *e != ',') e++;
    const char *te = e;
    while (te > p && te[-1] == ' ') te--;
    if ((size_t)(te - p) == ol && !memcmp(p, origin, ol)) return true;
    p = e;
  }
  return false;
}

static bool add_cors(sm_http *h, struct MHD_Connection *c, struct MHD_Response *r) {
  const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  if (!origin_allowed(h, origin)) return false;
  if (!strcmp(h->origins, "*")) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
  } else {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(r, "Vary", "Origin");
  }
  return true;
}

enum { R_CLOSE = 1, R_RETRY = 2 }; /* response flags: close the connection, Retry-After */

static enum MHD_Result send_body(sm_http *h, struct MHD_Connection *c, req *rq, int status, const char *ctype,
                                 const char *body, size_t len, int flags) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", ctype);
  if (flags & R_RETRY) MHD_add_response_header(r, "Retry-After", "1");
  if (flags & R_CLOSE) MHD_add_response_header(r, "Connection", "close");
  add_cors(h, c, r);
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  sm_metrics_request(h->metrics, rq && rq->ep_name ? rq->ep_name : "other", status);
  return ret;
}

static enum MHD_Result send_json(sm_http *h, struct MHD_Connection *c, req *rq, int status, cJSON *j, int flags) {
  sm_buf b = SM_BUF_INIT;
  sm_oai_print(j, &b);
  cJSON_Delete(j);
  enum MHD_Result r = send_body(h, c, rq, status, "application/json", sm_buf_str(&b), b.n, flags);
  sm_buf_free(&b);
  return r;
}

static enum MHD_Result send_error(sm_http *h, struct MHD_Connection *c, req *rq, const sm_api_error *e, int flags) {
  /* the Anthropic endpoints answer in Anthropic's error shape */
  bool anth = rq && (rq->ep == EP_MESSAGES || rq->ep == EP_COUNT_TOKENS);
  char *body = anth ? sm_anth_error_json(e) : sm_api_error_json(e);
  sm_buf b = SM_BUF_INIT;
  sm_oai_put_utf8(&b, body, strlen(body)); /* messages may quote the request */
  free(body);
  if (e->http_status == 429 || e->http_status == 503) flags |= R_RETRY;
  enum MHD_Result r = send_body(h, c, rq, e->http_status, "application/json", sm_buf_str(&b), b.n, flags);
  sm_buf_free(&b);
  return r;
}

static enum MHD_Result send_err(sm_http *h, struct MHD_Connection *c, req *rq, int status, const char *type,
                                const char *code, int flags, const char *fmt, ...)
  __attribute__((format(printf, 8, 9)));
static enum MHD_Result send_err(sm_http *h, struct MHD_Connection *c, req *rq, int status, const char *type,
                                const char *code, int flags, const char *fmt, ...) {
  sm_api_error e;
  char msg[sizeof e.message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  sm_api_error_set(&e, status, type, NULL, code, "%s", msg);
  return send_error(h, c, rq, &e, flags);
}

static enum MHD_Result send_draining(sm_http *h, struct MHD_Connection *c, req *rq) {
  return send_err(h, c, rq, 503, "server_error", "shutting_down", R_CLOSE, "the server is shutting down");
}

/* ------------------------------------------------------------------ streaming */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  stream *st = cls;
  sm_sse *e = &st->sse;
  sm_sched *s = e->j->sched;
  if (e->off >= e->out.n) {
    e->off = 0;
    sm_buf_clear(&e->out);
    if (e->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_lock(&s->mu);
    if (st->k->hup) { /* the client went away */
      if (!e->j->done) sm_job_cancel(s, e->j);
      pthread_mutex_unlock(&s->mu);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    sm_sse_produce(e);
    if (e->out.n == 0 && !e->finished) { /* nothing new yet: wait without a thread */
      sm_conns_park(st->h->g, st->k, e->j, false);
      pthread_mutex_unlock(&s->mu);
      return 0;
    }
    pthread_mutex_unlock(&s->mu);
    if (e->out.n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
  }
  size_t n = SM_MIN(max, e->out.n - e->off);
  memcpy(buf, e->out.p + e->off, n);
  e->off += n;
  return (ssize_t)n;
}

static void stream_free(void *cls) {
  stream *st = cls;
  sm_sched *s = st->sse.j->sched;
  pthread_mutex_lock(&s->mu);
  st->sse.j->notify = NULL; /* the connection (and its sock) may go away now */
  if (!st->sse.j->done) sm_job_cancel(s, st->sse.j);
  sm_job_unref(s, st->sse.j);
  pthread_mutex_unlock(&s->mu);
  sm_models_release(st->h->models, st->sv);
  sm_buf_free(&st->sse.out);
  free(st);
}

/* under the job's scheduler mutex: the request lets go of its job */
static void drop_job(sm_job *j) {
  sm_sched *s = j->sched;
  j->notify = NULL;
  if (!j->done) sm_job_cancel(s, j);
  sm_job_unref(s, j);
}

/* ------------------------------------------------------------------ endpoints */

/* the answer of a slot action (llama-server's shapes) */
static cJSON *slot_response(const sm_job *j) {
  cJSON *r = cJSON_CreateObject();
  cJSON_AddNumberToObject(r, "id_slot", j->slot_id);
  if (j->slot_op == SM_SLOT_ERASE) {
    cJSON_AddNumberToObject(r, "n_erased", j->slot_tokens);
    return r;
  }
  const char *base = strrchr(j->slot_file, '/');
  cJSON_AddStringToObject(r, "filename", base ? base + 1 : j->slot_file);
  bool save = j->slot_op == SM_SLOT_SAVE;
  cJSON_AddNumberToObject(r, save ? "n_saved" : "n_restored", j->slot_tokens);
  cJSON_AddNumberToObject(r, save ? "n_written" : "n_read", (double)j->slot_bytes);
  cJSON *t = cJSON_AddObjectToObject(r, "timings");
  cJSON_AddNumberToObject(t, save ? "save_ms" : "restore_ms", j->slot_ms);
  return r;
}

static enum MHD_Result answer_job(sm_http *h, struct MHD_Connection *c, req *rq, sm_job *j) {
  enum MHD_Result ret;
  if (j->failed) {
    sm_api_error e;
    int st = j->fail_status ? j->fail_status : 500;
    sm_api_error_set(&e, st, st == 400 ? "invalid_request_error" : "server_error", NULL, NULL, "%s", j->errmsg);
    ret = send_error(h, c, rq, &e, 0);
  } else if (j->slot_op) {
    ret = send_json(h, c, rq, 200, slot_response(j), 0);
  } else {
    ret = send_json(h, c, rq, 200, sm_oai_full_response(&rq->sv->oai, j), 0);
  }
  sm_sched *s = j->sched;
  pthread_mutex_lock(&s->mu);
  sm_job_unref(s, j);
  pthread_mutex_unlock(&s->mu);
  return ret;
}

/* a submitted job that is answered when done: the connection waits without a thread */
static enum MHD_Result wait_job(sm_http *h, struct MHD_Connection *c, req *rq, sm_job *j) {
  sm_sched *s = j->sched;
  pthread_mutex_lock(&s->mu);
  if (!j->done) {
    rq->job = j;
    sm_conns_park(h->g, rq->k, j, true);
    pthread_mutex_unlock(&s->mu);
    return MHD_YES;
  }
  pthread_mutex_unlock(&s->mu);
  return answer_job(h, c, rq, j);
}

static enum MHD_Result handle_generate(sm_http *h, struct MHD_Connection *c, req *rq, sm_ep_kind kind) {
  sm_api_error err;
  if (!rq->k) return send_err(h, c, rq, 500, "server_error", NULL, R_CLOSE, "connection not tracked");
  sm_served *sv = rq->sv;
  sm_job *j = sm_oai_make_job(&sv->oai, kind, rq->body.p, rq->body.n, &err);
  if (!j) return send_error(h, c, rq, &err, 0);
  bool stream_it = j->req.stream;
  sm_sched *s = &sv->sched;
  int rc = sm_sched_submit(s, j);
  if (rc == 503) return send_draining(h, c, rq);
  if (rc == 429)
    return send_err(h, c, rq, 429, "rate_limit_error", "queue_full", 0,
                    "the server is busy (request queue is full); retry later");
  if (stream_it) {
    stream *st = sm_xcalloc(1, sizeof *st);
    st->h = h;
    st->k = rq->k;
    st->sv = sv; /* the stream holds the model now */
    rq->sv = NULL;
    sm_sse_init(&st->sse, &sv->oai, j); /* takes the handler's reference */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                                               stream_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_cors(h, c, r);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    sm_metrics_request(h->metrics, rq->ep_name, 200);
    return ret;
  }
  return wait_job(h, c, rq, j);
}

/* POST /slots/{id}?action=save|restore|erase (body {"filename"} for save and restore) */
static enum MHD_Result handle_slot_action(sm_http *h, struct MHD_Connection *c, req *rq, const char *url) {
  if (!rq->k) return send_err(h, c, rq, 500, "server_error", NULL, R_CLOSE, "connection not tracked");
  sm_served *sv = rq->sv;
  const char *ids = strrchr(url, '/') + 1, *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
  char *end;
  long id = strtol(ids, &end, 10);
  if (!*ids || *end || id < 0 || id >= sv->oai.parallel || ids[0] == '-' || ids[0] == '+')
    return send_err(h, c, rq, 400, "invalid_request_error", NULL, 0, "'%.40s' is not a slot id (0 to %d)", ids,
                    sv->oai.parallel - 1);
  int op = !action                    ? 0
         : !strcmp(action, "save")    ? SM_SLOT_SAVE
         : !strcmp(action, "restore") ? SM_SLOT_RESTORE
         : !strcmp(action, "erase")   ? SM_SLOT_ERASE
                                      : 0;
  if (!op)
    return send_err(h, c, rq, 400, "invalid_request_error", NULL, 0,
                    "the query's 'action' must be save, restore or erase");
  char *path = NULL;
  if (op != SM_SLOT_ERASE) {
    if (!h->p->slot_save_path)
      return send_err(h, c, rq, 501, "not_supported_error", NULL, 0,
                      "slot save and restore need the server to be started with --slot-save-path DIR");
    if (sm_engine_recurrent(sv->eng))
      return send_err(h, c, rq, 501, "not_supported_error", NULL, 0,
                      "slot save and restore go through the prefix cache, which models with recurrent layers (%s) "
                      "do not use",
                      sv->oai.arch);
    cJSON *root = rq->body.n ? cJSON_ParseWithLength(rq->body.p, rq->body.n) : NULL;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(root, "filename");
    const char *f = cJSON_IsString(fn) ? fn->valuestring : NULL;
    /* a plain file name inside --slot-save-path, nothing else */
    bool ok = f && f[0] && f[0] != '.' && strlen(f) <= 200;
    for (const char *p = f; ok && *p; p++) ok = *p != '/' && *p != '\\' && (unsigned char)*p >= 0x20;
    if (ok) path = sm_path_join(h->p->slot_save_path, f);
    cJSON_Delete(root);
    if (!ok)
      return send_err(h, c, rq, 400, "invalid_request_error", NULL, 0,
                      "the body must be {\"filename\": NAME}: a file name in --slot-save-path (no '/', not "
                      "starting with '.')");
  }
  sm_job *j = sm_job_slot_op(op, (int)id, path);
  free(path);
  int rc = sm_sched_submit(&sv->sched, j);
  if (rc == 503) return send_draining(h, c, rq);
  if (rc == 429)
    return send_err(h, c, rq, 429, "rate_limit_error", "queue_full", 0,
                    "the server is busy (request queue is full); retry later");
  return wait_job(h, c, rq, j);
}

/* a parked request was resumed: its job is done, or its client went away */
static enum MHD_Result resume_generate(sm_http *h, struct MHD_Connection *c, req *rq) {
  sm_job *j = rq->job;
  sm_sched *s = j->sched;
  pthread_mutex_lock(&s->mu);
  bool gone = rq->k->hup;
  if (!j->done && !gone) { /* not yet: wait again */
    sm_conns_park(h->g, rq->k, j, true);
    pthread_mutex_unlock(&s->mu);
    return MHD_YES;
  }
  rq->job = NULL;
  j->notify = NULL;
  if (gone) drop_job(j);
  pthread_mutex_unlock(&s->mu);
  if (gone) {
    sm_metrics_request(h->metrics, rq->ep_name, 499);
    return MHD_NO; /* nobody to answer: close */
  }
  return answer_job(h, c, rq, j);
}

static enum MHD_Result handle_metrics(sm_http *h, struct MHD_Connection *c, req *rq) {
  sm_buf t = SM_BUF_INIT;
  sm_metrics_render_requests(h->metrics, &t);
  sm_models_metrics(h->models, &t);
  enum MHD_Result r = send_body(h, c, rq, 200, "text/plain; version=0.0.4; charset=utf-8", sm_buf_str(&t), t.n, 0);
  sm_buf_free(&t);
  return r;
}

/* CORS preflight: only for an allowed origin, and only request headers from the allow-list */
static bool header_allowed(const char *name, size_t n) {
  static const char *const ok[] = {"authorization",  "content-type", "x-api-key", "openai-organization",
                                   "openai-project", "openai-beta",  "accept"};
  for (size_t i = 0; i < SM_ARRAY_LEN(ok); i++)
    if (strlen(ok[i]) == n && !strncasecmp(name, ok[i], n)) return true;
  return n > 12 && !strncasecmp(name, "x-stainless-", 12); /* the openai clients' telemetry headers */
}

static enum MHD_Result handle_preflight(sm_http *h, struct MHD_Connection *c, req *rq) {
  struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  if (add_cors(h, c, r)) {
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const char *rh = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    sm_buf allow = SM_BUF_INIT;
    sm_buf_puts(&allow, "Authorization, Content-Type");
    for (const char *p = rh; p && *p;) {
      while (*p == ' ' || *p == ',' || *p == '\t') p++;
      const char *e = p;
      while (*e && *e != ',') e++;
      const char *te = e;
      while (te > p && (te[-1] == ' ' || te[-1] == '\t')) te--;
      size_t n = (size_t)(te - p);
      if (n && header_allowed(p, n) && !(n == 13 && !strncasecmp(p, "authorization", 13)) &&
          !(n == 12 && !strncasecmp(p, "content-type", 12))) {
        sm_buf_puts(&allow, ", ");
        sm_buf_put(&allow, p, n);
      }
      p = e;
    }
    MHD_add_response_header(r, "Access-Control-Allow-Headers", sm_buf_str(&allow));
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    sm_buf_free(&allow);
  }
  enum MHD_Result ret = MHD_queue_response(c, 204, r);
  MHD_destroy_response(r);
  sm_metrics_request(h->metrics, rq->ep_name, 204);
  return ret;
}

static bool auth_ok(sm_http *h, struct MHD_Connection *c) {
  if (!h->p->api_key || !h->p->api_key[0]) return true;
  const char *hv = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  const char *key = NULL;
  if (hv && !strncasecmp(hv, "Bearer ", 7)) key = hv + 7;
  if (!key) key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
  if (!key) return false;
  size_t a = strlen(key), b = strlen(h->p->api_key);
  unsigned diff = (unsigned)(a != b);
  for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(key[i] ^ h->p->api_key[i]);
  return diff == 0;
}

static int route(const char *url, const char **name) {
  static const struct {
    const char *path;
    int ep;
    const char *name;
  } R[] = {
    {"/v1/chat/completions", EP_CHAT, "/v1/chat/completions"},
    {"/chat/completions", EP_CHAT, "/v1/chat/completions"},
    {"/v1/completions", EP_COMPL, "/v1/completions"},
    {"/completions", EP_COMPL, "/v1/completions"},
    {"/v1/responses", EP_RESP, "/v1/responses"},
    {"/responses", EP_RESP, "/v1/responses"},
    {"/v1/models", EP_MODELS, "/v1/models"},
    {"/models", EP_MODELS, "/v1/models"},
    {"/health", EP_HEALTH, "/health"},
    {"/v1/health", EP_HEALTH, "/health"},
    {"/metrics", EP_METRICS, "/metrics"},
    {"/tokenize", EP_TOKENIZE, "/tokenize"},
    {"/detokenize", EP_DETOKENIZE, "/detokenize"},
    {"/apply-template", EP_APPLY_TEMPLATE, "/apply-template"},
    {"/props", EP_PROPS, "/props"},
    {"/slots", EP_SLOTS, "/slots"},
    {"/v1/messages", EP_MESSAGES, "/v1/messages"},
    {"/messages", EP_MESSAGES, "/v1/messages"},
    {"/v1/messages/count_tokens", EP_COUNT_TOKENS, "/v1/messages/count_tokens"},
    {"/v1/embeddings", EP_EMBEDDINGS, "/v1/embeddings"},
    {"/embeddings", EP_EMBEDDINGS, "/v1/embeddings"},
  };
  for (size_t i = 0; i < SM_ARRAY_LEN(R); i++)
    if (!strcmp(url, R[i].path)) {
      *name = R[i].name;
      return R[i].ep;
    }
  if (!strncmp(url, "/slots/", 7) && url[7] && !strchr(url + 7, '/')) {
    *name = "/slots/{id}";
    return EP_SLOT_ACTION;
  }
  if ((!strncmp(url, "/v1/models/", 11) && url[11]) || (!strncmp(url, "/models/", 8) && url[8])) {
    *name = "/v1/models/{id}";
    return EP_MODEL;
  }
  *name = "other";
  return EP_NONE;
}

/* ------------------------------------------------------------------ request flow */

typedef struct {
  int n_cl, n_te;
  const char *cl, *te;
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  framing *f = cls;
  if (!strcasecmp(key, "Content-Length")) {
    f->n_cl++;
    f->cl = value;
  } else if (!strcasecmp(key, "Transfer-Encoding")) {
    f->n_te++;
    f->te = value;
  }
  return MHD_YES;
}

/* The headers are in, no body byte has been read. Anything refused here is answered at once
 * and the connection closes after the answer (the library reads no body). */
static enum MHD_Result on_headers(sm_http *h, struct MHD_Connection *c, req *rq, const char *method) {
  framing f = {0};
  MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
  /* a body's length must have exactly one meaning, or a proxy in front and this server may
   * split the stream into different requests */
  if (f.n_cl > 1)
    return send_err(h, c, rq, 400, "invalid_request_error", "bad_framing", R_CLOSE,
                    "the request has %d Content-Length headers", f.n_cl);
  if (f.n_te > 1 || (f.n_te && strcasecmp(f.te, "chunked")))
    return send_err(h, c, rq, 400, "invalid_request_error", "bad_framing", R_CLOSE,
                    "Transfer-Encoding must be exactly one 'chunked'");
  if (f.n_te && f.n_cl)
    return send_err(h, c, rq, 400, "invalid_request_error", "bad_framing", R_CLOSE,
                    "the request has both Content-Length and Transfer-Encoding");
  uint64_t cl = f.cl ? strtoull(f.cl, NULL, 10) : 0; /* digits only: the library checked */
  bool has_body = cl > 0 || f.n_te;
  if (strcmp(method, "OPTIONS")) {
    if (rq->ep == EP_NONE)
      return send_err(h, c, rq, 404, "invalid_request_error", "not_found", R_CLOSE, "unknown endpoint");
    if (rq->ep != EP_HEALTH && !auth_ok(h, c))
      return send_err(h, c, rq, 401, "authentication_error", "invalid_api_key", R_CLOSE, "Invalid or missing API key");
    bool post = rq->ep == EP_CHAT || rq->ep == EP_COMPL || rq->ep == EP_RESP || rq->ep == EP_TOKENIZE ||
                rq->ep == EP_DETOKENIZE || rq->ep == EP_APPLY_TEMPLATE || rq->ep == EP_MESSAGES ||
                rq->ep == EP_COUNT_TOKENS || rq->ep == EP_EMBEDDINGS || rq->ep == EP_SLOT_ACTION;
    if (strcmp(method, post ? "POST" : "GET"))
      return send_err(h, c, rq, 405, "invalid_request_error", "method_not_allowed", R_CLOSE, "%s",
                      post ? "this endpoint only accepts POST" : "this endpoint only accepts GET");
    if (cl > h->p->max_body)
      return send_err(h, c, rq, 413, "invalid_request_error", "request_too_large", R_CLOSE,
                      "request body exceeds the limit of %zu bytes", h->p->max_body);
  }
  if (atomic_load(&h->draining)) return send_draining(h, c, rq);
  if (cl > 0) {
    if (!sm_conns_reserve(h->g, (size_t)cl))
      return send_err(h, c, rq, 503, "server_error", "server_busy", R_CLOSE,
                      "the server holds too many request bodies right now; retry later");
    rq->reserved = (size_t)cl;
    rq->body.p = sm_xmalloc((size_t)cl + 1); /* exactly what was declared */
    rq->body.cap = (size_t)cl + 1;
    rq->body.p[0] = 0;
  }
  if (rq->k) sm_conns_phase(h->g, rq->k, has_body ? SM_PH_BODY : SM_PH_BUSY);
  return MHD_YES;
}

static void on_upload(sm_http *h, req *rq, const char *data, size_t n) {
  if (rq->too_large || rq->over_budget) return; /* being discarded */
  if (rq->body.n + n > h->p->max_body) {
    rq->too_large = true;
  } else if (rq->body.n + n > rq->reserved) { /* chunked: reserve as it comes */
    size_t more = rq->body.n + n - rq->reserved;
    if (sm_conns_reserve(h->g, more)) rq->reserved += more;
    else rq->over_budget = true;
  }
  if (rq->too_large || rq->over_budget) {
    sm_buf_free(&rq->body);
    sm_conns_release(h->g, rq->reserved);
    rq->reserved = 0;
    return;
  }
  sm_buf_put(&rq->body, data, n);
}

static bool needs_model(int ep) {
  return ep == EP_CHAT || ep == EP_COMPL || ep == EP_RESP || ep == EP_MESSAGES || ep == EP_EMBEDDINGS ||
         ep == EP_COUNT_TOKENS || ep == EP_TOKENIZE || ep == EP_DETOKENIZE || ep == EP_APPLY_TEMPLATE ||
         ep == EP_PROPS || ep == EP_SLOTS || ep == EP_SLOT_ACTION;
}

/* The request's model into rq->sv. False when the request waits for its model to load (parked)
 * or was answered (an error, or nothing for a client that went away): *ret is then the result. */
static bool get_model(sm_http *h, struct MHD_Connection *c, req *rq, enum MHD_Result *ret) {
  char *name = NULL;
  if (rq->waiting) { /* resumed: the load ended, the wait timed out, or the client left */
    rq->waiting = false;
    if (rq->k->hup) {
      sm_models_unwait(h->models, rq->k);
      sm_metrics_request(h->metrics, rq->ep_name, 499);
      *ret = MHD_NO;
      return false;
    }
  }
  if (sm_models_multi(h->models) && !rq->k) {
    *ret = send_err(h, c, rq, 500, "server_error", NULL, R_CLOSE, "connection not tracked");
    return false;
  }
  if (sm_models_multi(h->models)) { /* the body's (POST) or the query's (GET) `model` */
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "model");
    name = q ? sm_xstrdup(q) : sm_models_body_name(rq->body.p, rq->body.n);
  }
  sm_api_error err;
  sm_acq a = sm_models_acquire(h->models, name, h->g, rq->k, &rq->ticket, &rq->sv, &err);
  free(name);
  if (a == SM_ACQ_READY) return true;
  if (a == SM_ACQ_WAIT) {
    rq->waiting = true;
    *ret = MHD_YES;
  } else {
    *ret = send_error(h, c, rq, &err, 0);
  }
  return false;
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c);

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  sm_http *h = cls;
  req *rq = *con_cls;
  if (!rq) *con_cls = rq = on_uri(h, url, c); /* no request-line notification (should not happen) */
  if (!rq->checked) {
    rq->checked = true;
    rq->ep = route(url, &rq->ep_name);
    return on_headers(h, c, rq, method);
  }
  if (*upload_size) {
    on_upload(h, rq, upload, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  if (rq->job) return resume_generate(h, c, rq);
  if (!rq->final_seen) {
    rq->final_seen = true;
    if (rq->k) sm_conns_phase(h->g, rq->k, SM_PH_BUSY);
    if (h->p->verbose) fprintf(stderr, "smelt serve: %s %s\n", method, url);
  }
  if (!strcmp(method, "OPTIONS")) return handle_preflight(h, c, rq);
  if (rq->too_large)
    return send_err(h, c, rq, 413, "invalid_request_error", "request_too_large", 0,
                    "request body exceeds the limit of %zu bytes", h->p->max_body);
  if (rq->over_budget)
    return send_err(h, c, rq, 503, "server_error", "server_busy", 0,
                    "the server holds too many request bodies right now; retry later");
  if (atomic_load(&h->draining)) return send_draining(h, c, rq);
  if (needs_model(rq->ep) && !rq->sv) {
    enum MHD_Result r;
    if (!get_model(h, c, rq, &r)) return r;
  }
  sm_served *sv = rq->sv;
  const sm_oai *o = sv ? &sv->oai : NULL;
  switch (rq->ep) {
    case EP_CHAT: return handle_generate(h, c, rq, SM_EP_CHAT);
    case EP_COMPL: return handle_generate(h, c, rq, SM_EP_COMPLETIONS);
    case EP_RESP: return handle_generate(h, c, rq, SM_EP_RESPONSES);
    case EP_MODELS: return send_json(h, c, rq, 200, sm_models_list(h->models), 0);
    case EP_MODEL:
    case EP_TOKENIZE:
    case EP_DETOKENIZE:
    case EP_APPLY_TEMPLATE: {
      sm_api_error err;
      cJSON *r = rq->ep == EP_MODEL    ? sm_models_get(h->models, strchr(url + 1, '/') + (url[1] == 'v' ? 8 : 1), &err)
               : rq->ep == EP_TOKENIZE ? sm_llama_tokenize(o, rq->body.p, rq->body.n, &err)
               : rq->ep == EP_DETOKENIZE ? sm_llama_detokenize(o, rq->body.p, rq->body.n, &err)
                                         : sm_llama_apply_template(o, rq->body.p, rq->body.n, &err);
      return r ? send_json(h, c, rq, 200, r, 0) : send_error(h, c, rq, &err, 0);
    }
    case EP_PROPS: return send_json(h, c, rq, 200, sm_llama_props(o), 0);
    case EP_SLOTS: return send_json(h, c, rq, 200, sm_llama_slots(o, &sv->sched), 0);
    case EP_SLOT_ACTION: return handle_slot_action(h, c, rq, url);
    case EP_MESSAGES: return handle_generate(h, c, rq, SM_EP_MESSAGES);
    case EP_EMBEDDINGS: return handle_generate(h, c, rq, SM_EP_EMBEDDINGS);
    case EP_COUNT_TOKENS: {
      sm_api_error err;
      cJSON *r = sm_anth_count_tokens(o, rq->body.p, rq->body.n, &err);
      return r ? send_json(h, c, rq, 200, r, 0) : send_error(h, c, rq, &err, 0);
    }
    case EP_METRICS: return handle_metrics(h, c, rq);
    default: {
      static const char ok[] = "{\"status\":\"ok\"}";
      return send_body(h, c, rq, 200, "application/json", ok, sizeof ok - 1, 0);
    }
  }
}

/* the request line arrived: the request's context starts here (its headers deadline too) */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
  sm_http *h = cls;
  req *rq = sm_xcalloc(1, sizeof *rq);
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  rq->k = ci ? ci->socket_context : NULL;
  if (rq->k) sm_conns_phase(h->g, rq->k, SM_PH_HEADERS);
  return rq;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  sm_http *h = cls;
  req *rq = *con_cls;
  if (!rq) return;
  if (rq->job) { /* ended while waiting (the daemon stops) */
    sm_sched *s = rq->job->sched;
    pthread_mutex_lock(&s->mu);
    drop_job(rq->job);
    pthread_mutex_unlock(&s->mu);
  }
  if (rq->waiting && rq->k) sm_models_unwait(h->models, rq->k);
  sm_models_release(h->models, rq->sv);
  sm_conns_release(h->g, rq->reserved);
  sm_buf_free(&rq->body);
  if (rq->k) sm_conns_phase(h->g, rq->k, SM_PH_IDLE);
  free(rq);
  *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  sm_http *h = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    *socket_context = ci ? sm_conns_open(h->g, c, ci->connect_fd) : NULL;
  } else if (*socket_context) {
    sm_conns_close(h->g, *socket_context);
    *socket_context = NULL;
  }
}

/* the library's own messages (a client that reset its connection, ...): debug level */
static void on_log(void *cls, const char *fmt, va_list ap) {
  sm_http *h = cls;
  if (!h->p->verbose) return;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t l = strlen(msg);
  while (l && (msg[l - 1] == '\n' || msg[l - 1] == '\r')) msg[--l] = 0;
  fprintf(stderr, "smelt serve: http: %s\n", msg);
}

/* ------------------------------------------------------------------ daemon */

sm_http *sm_http_start(const sm_http_cfg *cfg) {
  sm_http *h = sm_xcalloc(1, sizeof *h);
  h->p = cfg->p;
  h->models = cfg->models;
  h->metrics = cfg->metrics;
  h->quiesced_fd = -1;
  if (h->p->allowed_origins && h->p->allowed_origins[0]) h->origins = sm_xstrdup(h->p->allowed_origins);
  h->g = sm_conns_new(h->p->header_timeout, h->p->body_timeout, h->p->max_buffered_body);
  if (!sm_conns_start(h->g)) {
    fprintf(stderr, "smelt serve: could not start the connection watchdog\n");
    sm_conns_free(h->g);
    free(h->origins);
    free(h);
    return NULL;
  }
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  char port[16];
  snprintf(port, sizeof port, "%d", h->p->port);
  int gr = getaddrinfo(h->p->host, port, &hints, &ai);
  if (gr != 0 || !ai) {
    fprintf(stderr, "smelt serve: cannot resolve host '%s': %s\n", h->p->host, gai_strerror(gr));
  } else {
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    unsigned threads = (unsigned)(h->p->http_threads > 0 ? h->p->http_threads : 1);
    h->d = MHD_start_daemon(flags, (uint16_t)h->p->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_URI_LOG_CALLBACK, on_uri, h,
                            MHD_OPTION_EXTERNAL_LOGGER, on_log, h, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)h->p->max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)h->p->max_conns_per_ip, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)h->p->timeout,
                            MHD_OPTION_END);
    if (!h->d) fprintf(stderr, "smelt serve: could not listen on %s:%d: %s\n", h->p->host, h->p->port, strerror(errno));
  }
  if (ai) freeaddrinfo(ai);
  if (!h->d) {
    sm_conns_free(h->g);
    free(h->origins);
    free(h);
    return NULL;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : h->p->port;
  return h;
}

int sm_http_port(const sm_http *h) { return h->port; }

void sm_http_drain(sm_http *h) {
  if (atomic_exchange(&h->draining, true)) return;
  h->quiesced_fd = MHD_quiesce_daemon(h->d);
  if (h->quiesced_fd >= 0) shutdown(h->quiesced_fd, SHUT_RDWR); /* new connections are refused */
}

int sm_http_active(sm_http *h) { return sm_conns_active(h->g); }

void sm_http_stop(sm_http *h) {
  if (!h) return;
  sm_conns_unpark_all(h->g); /* the library must not stop with suspended connections */
  MHD_stop_daemon(h->d);
  if (h->quiesced_fd >= 0) close(h->quiesced_fd);
  sm_conns_free(h->g);
  free(h->origins);
  free(h);
}
