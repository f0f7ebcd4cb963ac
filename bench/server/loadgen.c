/* Load generator for smelt serve (C, libcurl): for each concurrency level keeps N
 * non-streaming /v1/completions requests in flight and reports generated tokens/s and
 * request latency. Same role as bench.mjs, for machines without node.
 *   bench_server_load [--url http://127.0.0.1:8080] [--concurrency 1,4,16,64]
 *                     [--requests-per-level R] [--max-tokens 64] [--prompt-words 64] [--schemas 1|2]
 * --schemas 1: every request carries a JSON schema of its own (llama-server's `json_schema`
 * field: an object of ten required properties, strings and integers, named by request and
 * property), so each constrained sequence walks grammar states of its own and none finishes its
 * answer in fewer than about 60 tokens: with --max-tokens 48 or less, constrained and plain
 * requests keep the same batch, and their tokens/s give what constrained decoding costs a step.
 * --schemas 2: the same with strings of at most 6 characters (maxLength).
 * --stream: streamed requests (with usage in the last chunk); also prints the time to the first token and
 * the gaps between a request's chunks (inter-token latency), p50 and p99 over the level, in ms.
 * --roofline W,KV,BW: also each level's step roofline and the ratio to it. A decode step of c sequences
 * reads the weights (W bytes, smelt bench --json's weight_bytes_per_token) and each sequence's K/V (KV
 * bytes a position, kv_bytes_per_position, times its context: on average the prompt plus half the answer,
 * from the responses' usage) at BW bytes/s (bandwidth_gb_s * 1e9): c * BW / (W + c * context * KV)
 * tokens/s.
 * The first five failed requests are described on stderr (curl's error, HTTP status, body). */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "prompt.h"
#include "sse_scan.h"

static const char *g_url = "http://127.0.0.1:8080";
static int g_max_tokens = 64, g_prompt_words = 64, g_schemas = 0;
static int g_err_shown; /* failed requests described on stderr (the first 5) */
static int g_stream;
static double g_roof_w, g_roof_kv, g_roof_bw; /* --roofline */

static double now(void);

/* doubles that grow (the inter-token gaps of a worker's requests) */
typedef struct {
  double *v;
  size_t n, cap;
} dvec;
static void dvec_push(dvec *d, double x) {
  if (d->n == d->cap) {
    d->cap = d->cap ? 2 * d->cap : 256;
    d->v = realloc(d->v, d->cap * sizeof(double));
  }
  d->v[d->n++] = x;
}

typedef struct {
  char *buf;
  size_t len;
  /* --stream: a chunk's arrival ("data: {" at the start of a line) */
  sse_scan sse;
  double t0, first; /* the request's start, its first chunk's arrival (0: none yet) */
  double last;      /* the previous chunk's arrival */
  dvec *gaps;
} membuf;
static size_t on_data(char *p, size_t sz, size_t n, void *u) {
  membuf *m = u;
  for (size_t i = 0; g_stream && i < sz * n; i++)
    if (sse_byte(&m->sse, p[i]) == '{') { /* a chunk */
      const double t = now();
      if (m->first == 0) m->first = t;
      else dvec_push(m->gaps, t - m->last);
      m->last = t;
    }
  m->buf = realloc(m->buf, m->len + sz * n + 1);
  memcpy(m->buf + m->len, p, sz * n);
  m->len += sz * n;
  m->buf[m->len] = 0;
  return sz * n;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
  int first, count, tokens, errors;
  long prompt_tokens; /* of the requests that succeeded */
  double *lat, *ttft; /* a request's latency and (--stream) time to its first chunk (-1: none) */
  dvec gaps;          /* (--stream) the gaps between chunks of its requests */
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  CURL *c = curl_easy_init();
  char url[512];
  snprintf(url, sizeof url, "%s/v1/completions", g_url);
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  for (int k = 0; k < w->count; k++) {
    int i = w->first + k;
    char prompt[8192];
    bench_prompt(prompt, sizeof prompt, i, g_prompt_words, 0);
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "prompt", prompt);
    cJSON_AddNumberToObject(b, "max_tokens", g_max_tokens);
    cJSON_AddNumberToObject(b, "temperature", 0.7);
    cJSON_AddNumberToObject(b, "seed", i + 1);
    if (g_stream) {
      cJSON_AddBoolToObject(b, "stream", 1);
      cJSON *so = cJSON_AddObjectToObject(b, "stream_options");
      cJSON_AddBoolToObject(so, "include_usage", 1);
    }
    if (g_schemas) {
      char sch[2048];
      int so = snprintf(sch, sizeof sch, "{\"type\":\"object\",\"properties\":{");
      for (int k = 0; k < 10; k++)
        so += snprintf(sch + so, sizeof sch - (size_t)so, "%s\"p%d_%d\":{\"type\":\"%s\"%s}", k ? "," : "", i, k,
                       k % 2 ? "integer" : "string", k % 2 || g_schemas < 2 ? "" : ",\"maxLength\":6");
      so += snprintf(sch + so, sizeof sch - (size_t)so, "},\"required\":[");
      for (int k = 0; k < 10; k++)
        so += snprintf(sch + so, sizeof sch - (size_t)so, "%s\"p%d_%d\"", k ? "," : "", i, k);
      snprintf(sch + so, sizeof sch - (size_t)so, "],\"additionalProperties\":false}");
      cJSON_AddItemToObject(b, "json_schema", cJSON_Parse(sch));
    }
    char *body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    membuf m = {0};
    m.gaps = &w->gaps;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &m);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
    double t0 = now();
    m.t0 = t0;
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    w->lat[k] = now() - t0;
    w->ttft[k] = m.first > 0 ? m.first - t0 : -1;
    /* streamed: the usage rides in the last chunk with data (the one before "data: [DONE]") */
    const char *resp = m.buf;
    if (g_stream && m.buf) {
      const char *d = strstr(m.buf, "\"usage\":{");
      while (d && d > m.buf && strncmp(d, "data: ", 6)) d--;
      resp = d && !strncmp(d, "data: ", 6) ? d + 6 : NULL;
    }
    cJSON *r = rc == CURLE_OK && status == 200 && resp ? cJSON_Parse(resp) : NULL;
    cJSON *ct = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "completion_tokens");
    cJSON *pt = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "prompt_tokens");
    if (cJSON_IsNumber(ct) && cJSON_IsNumber(pt)) w->prompt_tokens += pt->valueint;
    if (cJSON_IsNumber(ct)) w->tokens += ct->valueint;
    else if (++w->errors, __atomic_fetch_add(&g_err_shown, 1, __ATOMIC_RELAXED) < 5) /* what went wrong */
      fprintf(stderr, "request %d: %s, HTTP %ld: %.200s\n", i, curl_easy_strerror(rc), status, m.buf ? m.buf : "");
    cJSON_Delete(r);
    free(m.buf);
    free(body);
  }
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  return NULL;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const char *levels = "1,4,16,64";
  int per_level = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--stream")) {
      g_stream = 1;
      continue;
    }
    if (i + 1 == argc) {
      fprintf(stderr, "option %s needs a value\n", argv[i]);
      return 2;
    }
    const char *o = argv[i], *v = argv[++i];
    if (!strcmp(o, "--url")) g_url = v;
    else if (!strcmp(o, "--concurrency")) levels = v;
    else if (!strcmp(o, "--requests-per-level")) per_level = atoi(v);
    else if (!strcmp(o, "--max-tokens")) g_max_tokens = atoi(v);
    else if (!strcmp(o, "--prompt-words")) g_prompt_words = atoi(v);
    else if (!strcmp(o, "--schemas")) g_schemas = atoi(v);
    else if (!strcmp(o, "--roofline")) {
      if (sscanf(v, "%lf,%lf,%lf", &g_roof_w, &g_roof_kv, &g_roof_bw) != 3 || !(g_roof_w > 0) || !(g_roof_kv >= 0) ||
          !(g_roof_bw > 0)) {
        fprintf(stderr, "--roofline %s: expected W,KV,BW (weight bytes a step, K/V bytes a position, bytes/s)\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "unknown option %s\n", o);
      return 2;
    }
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  printf("%-11s %9s %12s %12s %12s %7s %10s", "concurrency", "requests", "tokens/s", "lat p50 s", "lat p90 s", "errors",
         "tok/req");
  if (g_stream) printf(" %10s %10s %10s %10s", "ttft p50", "ttft p99", "itl p50", "itl p99");
  if (g_roof_bw > 0) printf(" %12s %7s", "roofline/s", "ratio");
  printf("\n");
  char *lv = strdup(levels);
  for (char *t = strtok(lv, ","); t; t = strtok(NULL, ",")) {
    int n = atoi(t);
    if (n < 1) continue;
    int reqs = per_level > 0 ? per_level : (n < 4 ? 4 : 2 * n);
    int per = (reqs + n - 1) / n;
    reqs = per * n;
    worker_t *w = calloc((size_t)n, sizeof *w);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    double t0 = now();
    for (int i = 0; i < n; i++) {
      w[i].first = i * per;
      w[i].count = per;
      w[i].lat = calloc((size_t)per, sizeof(double));
      w[i].ttft = calloc((size_t)per, sizeof(double));
      pthread_create(&th[i], NULL, worker, &w[i]);
    }
    int tokens = 0, errors = 0;
    long prompt = 0;
    double *lat = calloc((size_t)reqs, sizeof(double)), *ttft = calloc((size_t)reqs, sizeof(double));
    dvec gaps = {0};
    size_t nt = 0;
    for (int i = 0; i < n; i++) {
      pthread_join(th[i], NULL);
      tokens += w[i].tokens;
      errors += w[i].errors;
      prompt += w[i].prompt_tokens;
      memcpy(lat + i * per, w[i].lat, sizeof(double) * (size_t)per);
      for (int k = 0; k < per; k++)
        if (w[i].ttft[k] >= 0) ttft[nt++] = w[i].ttft[k];
      for (size_t k = 0; k < w[i].gaps.n; k++) dvec_push(&gaps, w[i].gaps.v[k]);
      free(w[i].lat);
      free(w[i].ttft);
      free(w[i].gaps.v);
    }
    double el = now() - t0;
    qsort(lat, (size_t)reqs, sizeof(double), cmp_d);
    printf("%-11d %9d %12.1f %12.3f %12.3f %7d %10.1f", n, reqs, tokens / el, lat[reqs / 2], lat[(int)(reqs * 0.9)],
           errors, reqs > errors ? (double)tokens / (reqs - errors) : 0.0);
    if (g_stream) {
      qsort(ttft, nt, sizeof(double), cmp_d);
      qsort(gaps.v, gaps.n, sizeof(double), cmp_d);
      const double q[4] = {nt ? ttft[nt / 2] : 0, nt ? ttft[(size_t)((double)nt * 0.99)] : 0,
                           gaps.n ? gaps.v[gaps.n / 2] : 0, gaps.n ? gaps.v[(size_t)((double)gaps.n * 0.99)] : 0};
      printf(" %10.1f %10.1f %10.2f %10.2f", 1e3 * q[0], 1e3 * q[1], 1e3 * q[2], 1e3 * q[3]);
    }
    if (g_roof_bw > 0 && reqs > errors) { /* the step roofline at this concurrency */
      const double ok = reqs - errors, ctx = (double)prompt / ok + (double)tokens / ok / 2.0;
      const double roof = n * g_roof_bw / (g_roof_w + n * ctx * g_roof_kv);
      printf(" %12.1f %6.1f%%", roof, 100.0 * (tokens / el) / roof);
    }
    printf("\n");
    free(ttft);
    free(gaps.v);
    fflush(stdout);
    free(lat);
    free(w);
    free(th);
  }
  free(lv);
  curl_global_cleanup();
  return 0;
}
