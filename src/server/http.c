/* HTTP front end of `smelt serve` (see http.h): libmicrohttpd with one thread per connection;
 * a handler waiting for its job polls the socket so that a closed client cancels the job. */
#include "server/http.h"
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include "server/sse.h"

struct sm_http {
  sm_http_cfg cfg;
  const sm_server_params *p;
  sm_sched *sched;
  sm_metrics *metrics;
  const sm_oai *oai;
  char *origins;
  struct MHD_Daemon *d;
  int port;
};

enum { EP_NONE = 0, EP_CHAT, EP_COMPL, EP_RESP, EP_MODELS, EP_HEALTH, EP_METRICS };

/* one request */
typedef struct {
  int ep;
  const char *ep_name;
  sm_buf body;
  bool too_large;
} conn;

/* a streaming response */
typedef struct {
  sm_http *h;
  struct MHD_Connection *c;
  sm_sse sse;
} stream;

static void add_cors(sm_http *h, struct MHD_Connection *c, struct MHD_Response *r) {
  if (!h->origins) return;
  const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  if (!strcmp(h->origins, "*")) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
  } else if (origin) {
    /* exact match against the comma-separated list */
    const char *p = h->origins;
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

static enum MHD_Result send_body(sm_http *h, struct MHD_Connection *c, conn *cc, int status, const char *ctype,
                                 const char *body) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", ctype);
  add_cors(h, c, r);
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  sm_metrics_request(h->metrics, cc && cc->ep_name ? cc->ep_name : "other", status);
  return ret;
}

static enum MHD_Result send_json(sm_http *h, struct MHD_Connection *c, conn *cc, int status, cJSON *j) {
  char *body = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  enum MHD_Result r = send_body(h, c, cc, status, "application/json", body);
  free(body);
  return r;
}

static enum MHD_Result send_error(sm_http *h, struct MHD_Connection *c, conn *cc, const sm_api_error *e) {
  char *body = sm_api_error_json(e);
  enum MHD_Result r = send_body(h, c, cc, e->http_status, "application/json", body);
  free(body);
  return r;
}

static enum MHD_Result send_err(sm_http *h, struct MHD_Connection *c, conn *cc, int status, const char *type,
                                const char *param, const char *code, const char *msg) {
  sm_api_error e;
  sm_api_error_set(&e, status, type, param, code, "%s", msg);
  return send_error(h, c, cc, &e);
}

static bool conn_closed(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return false;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return true;
  return false;
}

/* ------------------------------------------------------------------ streaming */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  stream *st = cls;
  sm_sse *e = &st->sse;
  sm_sched *s = st->h->sched;
  if (e->off >= e->out.n) {
    e->off = 0;
    sm_buf_clear(&e->out);
    if (e->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_lock(&s->mu);
    for (;;) {
      sm_sse_produce(e);
      if (e->out.n > 0 || e->finished) break;
      sm_timed_wait(&e->j->cv, &s->mu, 100);
      if (conn_closed(st->c)) {
        sm_job_cancel(s, e->j);
        pthread_mutex_unlock(&s->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
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
  sm_sched *s = st->h->sched;
  pthread_mutex_lock(&s->mu);
  if (!st->sse.j->done) sm_job_cancel(s, st->sse.j);
  sm_job_unref(s, st->sse.j);
  pthread_mutex_unlock(&s->mu);
  sm_buf_free(&st->sse.out);
  free(st);
}

/* ------------------------------------------------------------------ endpoints */

static enum MHD_Result handle_generate(sm_http *h, struct MHD_Connection *c, conn *cc, sm_ep_kind kind) {
  sm_api_error err;
  sm_job *j = sm_oai_make_job(h->oai, kind, cc->body.p, cc->body.n, &err);
  if (!j) return send_error(h, c, cc, &err);
  bool stream_it = j->req.stream;
  sm_sched *s = h->sched;
  int rc = sm_sched_submit(s, j);
  if (rc == 503) return send_err(h, c, cc, 503, "server_error", NULL, NULL, "server is shutting down");
  if (rc == 429)
    return send_err(h, c, cc, 429, "rate_limit_error", NULL, "queue_full",
                    "the server is busy (request queue is full); retry later");
  if (stream_it) {
    stream *st = sm_xcalloc(1, sizeof *st);
    st->h = h;
    st->c = c;
    st->sse.o = h->oai;
    st->sse.j = j; /* takes the handler's reference */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_cors(h, c, r);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    sm_metrics_request(h->metrics, cc->ep_name, 200);
    return ret;
  }
  pthread_mutex_lock(&s->mu);
  while (!j->done) {
    sm_timed_wait(&j->cv, &s->mu, 100);
    if (!j->done && conn_closed(c)) {
      sm_job_cancel(s, j);
      while (!j->done) sm_timed_wait(&j->cv, &s->mu, 100);
      sm_job_unref(s, j);
      pthread_mutex_unlock(&s->mu);
      sm_metrics_request(h->metrics, cc->ep_name, 499);
      return MHD_NO;
    }
  }
  pthread_mutex_unlock(&s->mu);
  enum MHD_Result ret;
  if (j->failed) {
    ret = send_err(h, c, cc, j->fail_status ? j->fail_status : 500,
                   j->fail_status == 400 ? "invalid_request_error" : "server_error", NULL, NULL, j->errmsg);
  } else {
    ret = send_json(h, c, cc, 200, sm_oai_full_response(h->oai, j));
  }
  pthread_mutex_lock(&s->mu);
  sm_job_unref(s, j);
  pthread_mutex_unlock(&s->mu);
  return ret;
}

static enum MHD_Result handle_metrics(sm_http *h, struct MHD_Connection *c, conn *cc) {
  sm_metrics_gauges g;
  pthread_mutex_lock(&h->sched->mu);
  sm_sched_gauges(h->sched, &g);
  pthread_mutex_unlock(&h->sched->mu);
  char *t = sm_metrics_render(h->metrics, &g);
  enum MHD_Result r = send_body(h, c, cc, 200, "text/plain; version=0.0.4; charset=utf-8", t);
  free(t);
  return r;
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
  sm_http *h = cls;
  conn *cc = *con_cls;
  if (!cc) {
    cc = sm_xcalloc(1, sizeof *cc);
    *con_cls = cc;
    cc->ep = route(url, &cc->ep_name);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > h->p->max_body) cc->too_large = true;
    return MHD_YES;
  }
  if (*upload_size) {
    if (!cc->too_large) {
      if (cc->body.n + *upload_size > h->p->max_body) {
        cc->too_large = true;
        sm_buf_free(&cc->body);
      } else {
        sm_buf_put(&cc->body, upload, *upload_size);
      }
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (h->p->verbose) fprintf(stderr, "smelt serve: %s %s\n", method, url);
  if (!strcmp(method, "OPTIONS")) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    add_cors(h, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const char *rh = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", rh ? rh : "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    sm_metrics_request(h->metrics, cc->ep_name, 204);
    return ret;
  }
  if (cc->ep == EP_NONE)
    return send_err(h, c, cc, 404, "invalid_request_error", NULL, "not_found", "unknown endpoint");
  if (cc->ep != EP_HEALTH && !auth_ok(h, c))
    return send_err(h, c, cc, 401, "authentication_error", NULL, "invalid_api_key", "Invalid or missing API key");
  bool post = cc->ep == EP_CHAT || cc->ep == EP_COMPL || cc->ep == EP_RESP;
  if (strcmp(method, post ? "POST" : "GET"))
    return send_err(h, c, cc, 405, "invalid_request_error", NULL, "method_not_allowed",
                    post ? "this endpoint only accepts POST" : "this endpoint only accepts GET");
  if (cc->too_large) {
    char m[128];
    snprintf(m, sizeof m, "request body exceeds the limit of %zu bytes", h->p->max_body);
    return send_err(h, c, cc, 413, "invalid_request_error", NULL, "request_too_large", m);
  }
  switch (cc->ep) {
  case EP_CHAT: return handle_generate(h, c, cc, SM_EP_CHAT);
  case EP_COMPL: return handle_generate(h, c, cc, SM_EP_COMPLETIONS);
  case EP_RESP: return handle_generate(h, c, cc, SM_EP_RESPONSES);
  case EP_MODELS: return send_json(h, c, cc, 200, sm_oai_models(h->oai));
  case EP_METRICS: return handle_metrics(h, c, cc);
  default: return send_body(h, c, cc, 200, "application/json", "{\"status\":\"ok\"}");
  }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  conn *cc = *con_cls;
  if (!cc) return;
  sm_buf_free(&cc->body);
  free(cc);
  *con_cls = NULL;
}

/* ------------------------------------------------------------------ daemon */

sm_http *sm_http_start(const sm_http_cfg *cfg) {
  sm_http *h = sm_xcalloc(1, sizeof *h);
  h->cfg = *cfg;
  h->p = cfg->p;
  h->sched = cfg->sched;
  h->metrics = cfg->metrics;
  h->oai = cfg->oai;
  if (h->p->allowed_origins && h->p->allowed_origins[0]) h->origins = sm_xstrdup(h->p->allowed_origins);
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
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)h->p->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)1024, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    if (!h->d) fprintf(stderr, "smelt serve: could not listen on %s:%d: %s\n", h->p->host, h->p->port, strerror(errno));
  }
  if (ai) freeaddrinfo(ai);
  if (!h->d) {
    free(h->origins);
    free(h);
    return NULL;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : h->p->port;
  return h;
}

int sm_http_port(const sm_http *h) { return h->port; }

void sm_http_stop(sm_http *h) {
  if (!h) return;
  MHD_stop_daemon(h->d);
  free(h->origins);
  free(h);
}
