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
 * The first five failed requests are described on stderr (curl's error, HTTP status, body). */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *g_url = "http://127.0.0.1:8080";
static int g_max_tokens = 64, g_prompt_words = 64, g_schemas = 0;
static int g_err_shown; /* failed requests described on stderr (the first 5) */

typedef struct {
  char *buf;
  size_t len;
} membuf;
static size_t on_data(char *p, size_t sz, size_t n, void *u) {
  membuf *m = u;
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
  double *lat;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  static const char *words[] = {"time", "person", "year", "way",   "day",   "thing", "man",  "world", "life", "hand",
                                "part", "child",  "eye",  "woman", "place", "work",  "week", "case",  "point"};
  CURL *c = curl_easy_init();
  char url[512];
  snprintf(url, sizeof url, "%s/v1/completions", g_url);
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  for (int k = 0; k < w->count; k++) {
    int i = w->first + k;
    char prompt[8192];
    int o = snprintf(prompt, sizeof prompt, "Request %d:", i);
    for (int j = 0; j < g_prompt_words && o < (int)sizeof prompt - 32; j++)
      o += snprintf(prompt + o, sizeof prompt - (size_t)o, " %s", words[(i * 7 + j * 13) % 19]);
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "prompt", prompt);
    cJSON_AddNumberToObject(b, "max_tokens", g_max_tokens);
    cJSON_AddNumberToObject(b, "temperature", 0.7);
    cJSON_AddNumberToObject(b, "seed", i + 1);
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
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &m);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
    double t0 = now();
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    w->lat[k] = now() - t0;
    cJSON *r = rc == CURLE_OK && status == 200 ? cJSON_Parse(m.buf) : NULL;
    cJSON *ct = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "completion_tokens");
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
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--url")) g_url = argv[i + 1];
    else if (!strcmp(argv[i], "--concurrency")) levels = argv[i + 1];
    else if (!strcmp(argv[i], "--requests-per-level")) per_level = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--max-tokens")) g_max_tokens = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--prompt-words")) g_prompt_words = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--schemas")) g_schemas = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  printf("%-11s %9s %12s %12s %12s %7s %10s\n", "concurrency", "requests", "tokens/s", "lat p50 s", "lat p90 s",
         "errors", "tok/req");
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
      pthread_create(&th[i], NULL, worker, &w[i]);
    }
    int tokens = 0, errors = 0;
    double *lat = calloc((size_t)reqs, sizeof(double));
    for (int i = 0; i < n; i++) {
      pthread_join(th[i], NULL);
      tokens += w[i].tokens;
      errors += w[i].errors;
      memcpy(lat + i * per, w[i].lat, sizeof(double) * (size_t)per);
      free(w[i].lat);
    }
    double el = now() - t0;
    qsort(lat, (size_t)reqs, sizeof(double), cmp_d);
    printf("%-11d %9d %12.1f %12.3f %12.3f %7d %10.1f\n", n, reqs, tokens / el, lat[reqs / 2], lat[(int)(reqs * 0.9)],
           errors, reqs > errors ? (double)tokens / (reqs - errors) : 0.0);
    fflush(stdout);
    free(lat);
    free(w);
    free(th);
  }
  free(lv);
  curl_global_cleanup();
  return 0;
}
