/* Soak test for smelt serve (C, libcurl): N clients keep streaming /v1/completions requests for a
 * given time, and a fraction of the requests hang up mid-stream (after a pseudo-random number of
 * chunks), as impatient users and crashed clients do. Every report period it prints the requests
 * finished, those hung up on purpose, those that failed (HTTP 5xx, other statuses, transport errors
 * or a stream cut short by the server), the chunks (about one token each) a second, and the server's
 * own account from /metrics: KV blocks held by live sequences, running requests and resident memory.
 * When the time is up the clients stop, the server is given a few seconds to go idle, and the run
 * fails (exit 1) when any request got a 5xx or was cut short by the server, when requests are still
 * running or KV blocks still held by sequences, or when nothing was generated.
 *   bench_server_soak [--url http://127.0.0.1:8080] [--concurrency 64] [--seconds 1800]
 *                     [--disconnect 0.1] [--max-tokens 128] [--prompt-words 64] [--report 60]
 * Give the server a slot a client (-np >= concurrency) and no per-address connection limit
 * (--max-conns-per-ip 0), or the queue and the limit answer instead of the engine. */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "prompt.h"
#include "sse_scan.h"

static const char *g_url = "http://127.0.0.1:8080";
static int g_max_tokens = 128, g_prompt_words = 64;
static double g_disconnect = 0.1, g_deadline;
static int g_shown; /* failures described on stderr (the first 10) */

/* totals, updated by the clients (atomics) */
static long g_ok, g_hung_up, g_e5xx, g_eother, g_etransport, g_cut, g_chunks, g_next;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static uint64_t mix(uint64_t x) { /* splitmix64: the request's own pseudo-random numbers */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

typedef struct {
  int chunks, stop_after; /* stop_after > 0: hang up once that many chunks came */
  bool done;              /* "data: [DONE]" seen */
  sse_scan sse;
  char first[200]; /* the start of the body (a failure's description) */
  size_t nfirst;
} stream_t;

/* counts the server-sent events "data: {...}" (chunks) and "data: [DONE]" */
static size_t on_data(char *p, size_t sz, size_t n, void *u) {
  stream_t *s = u;
  const size_t len = sz * n;
  if (s->nfirst < sizeof s->first - 1) {
    const size_t k = len < sizeof s->first - 1 - s->nfirst ? len : sizeof s->first - 1 - s->nfirst;
    memcpy(s->first + s->nfirst, p, k);
    s->nfirst += k;
    s->first[s->nfirst] = 0;
  }
  for (size_t i = 0; i < len; i++) {
    const char e = sse_byte(&s->sse, p[i]);
    if (e == '{') s->chunks++;
    else if (e == '[') s->done = true;
  }
  if (s->stop_after > 0 && s->chunks >= s->stop_after) return 0; /* hang up */
  return len;
}

static void describe(long i, const char *what, CURLcode rc, long status, const stream_t *s) {
  if (__atomic_fetch_add(&g_shown, 1, __ATOMIC_RELAXED) < 10)
    fprintf(stderr, "request %ld: %s (%s, HTTP %ld): %.200s\n", i, what, curl_easy_strerror(rc), status, s->first);
}

static void *client(void *arg) {
  (void)arg;
  CURL *c = curl_easy_init();
  char url[512];
  snprintf(url, sizeof url, "%s/v1/completions", g_url);
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  while (now() < g_deadline) {
    const long i = __atomic_fetch_add(&g_next, 1, __ATOMIC_RELAXED);
    const uint64_t r = mix((uint64_t)i);
    char prompt[8192];
    bench_prompt(prompt, sizeof prompt, i, g_prompt_words, (unsigned)(r % 5));
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "prompt", prompt);
    cJSON_AddNumberToObject(b, "max_tokens", g_max_tokens);
    cJSON_AddNumberToObject(b, "temperature", 0.7);
    cJSON_AddNumberToObject(b, "seed", (double)(i + 1));
    cJSON_AddBoolToObject(b, "stream", 1);
    char *body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    stream_t s;
    memset(&s, 0, sizeof s);
    const bool hang = (double)(r >> 11) * (1.0 / 9007199254740992.0) < g_disconnect;
    if (hang) s.stop_after = 1 + (int)((r >> 3) % (uint64_t)(g_max_tokens > 2 ? g_max_tokens / 2 : 1));
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
    const CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    __atomic_fetch_add(&g_chunks, (long)s.chunks, __ATOMIC_RELAXED);
    if (hang && rc == CURLE_WRITE_ERROR && status == 200) {
      __atomic_fetch_add(&g_hung_up, 1, __ATOMIC_RELAXED);
    } else if (status >= 500) {
      __atomic_fetch_add(&g_e5xx, 1, __ATOMIC_RELAXED);
      describe(i, "server error", rc, status, &s);
    } else if (status != 200 && status != 0) {
      __atomic_fetch_add(&g_eother, 1, __ATOMIC_RELAXED);
      describe(i, "refused", rc, status, &s);
    } else if (rc != CURLE_OK) {
      __atomic_fetch_add(&g_etransport, 1, __ATOMIC_RELAXED);
      describe(i, "transport error", rc, status, &s);
    } else if (!s.done) {
      __atomic_fetch_add(&g_cut, 1, __ATOMIC_RELAXED);
      describe(i, "stream ended without [DONE]", rc, status, &s);
    } else {
      __atomic_fetch_add(&g_ok, 1, __ATOMIC_RELAXED);
    }
    free(body);
  }
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  return NULL;
}

typedef struct {
  char *buf;
  size_t len;
} membuf;
static size_t on_body(char *p, size_t sz, size_t n, void *u) {
  membuf *m = u;
  char *nb = realloc(m->buf, m->len + sz * n + 1);
  if (!nb) return 0;
  m->buf = nb;
  memcpy(m->buf + m->len, p, sz * n);
  m->len += sz * n;
  m->buf[m->len] = 0;
  return sz * n;
}

/* the server's gauges: the sums over models of each name's samples; false when /metrics failed */
typedef struct {
  double kv_used, running, queued, rss, cancelled;
} gauges;
static double metric(const char *text, const char *name) {
  double sum = 0;
  const size_t nl = strlen(name);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (strncmp(p, name, nl) || (p[nl] != ' ' && p[nl] != '{')) continue;
    const char *v = p[nl] == '{' ? strchr(p, '}') : p + nl;
    if (v) sum += strtod(v + (*v == '}'), NULL);
  }
  return sum;
}
static bool read_gauges(gauges *g) {
  CURL *c = curl_easy_init();
  char url[512];
  snprintf(url, sizeof url, "%s/metrics", g_url);
  membuf m = {0};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &m);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
  const CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  const bool ok = rc == CURLE_OK && status == 200 && m.buf;
  if (ok) {
    g->kv_used = metric(m.buf, "smelt_kv_cache_blocks_used");
    g->running = metric(m.buf, "smelt_requests_running");
    g->queued = metric(m.buf, "smelt_requests_queued");
    g->rss = metric(m.buf, "process_resident_memory_bytes");
    g->cancelled = metric(m.buf, "smelt_requests_cancelled_total");
  }
  free(m.buf);
  return ok;
}

static void report(double t, double dt, long chunks_before) {
  gauges g = {0};
  const bool ok = read_gauges(&g);
  printf("%8.0f %8ld %8ld %6ld %6ld %6ld %6ld %9.1f", t, __atomic_load_n(&g_ok, __ATOMIC_RELAXED),
         __atomic_load_n(&g_hung_up, __ATOMIC_RELAXED), __atomic_load_n(&g_e5xx, __ATOMIC_RELAXED),
         __atomic_load_n(&g_eother, __ATOMIC_RELAXED), __atomic_load_n(&g_etransport, __ATOMIC_RELAXED),
         __atomic_load_n(&g_cut, __ATOMIC_RELAXED),
         (double)(__atomic_load_n(&g_chunks, __ATOMIC_RELAXED) - chunks_before) / dt);
  if (ok) printf(" %9.0f %7.0f %7.1f\n", g.kv_used, g.running, g.rss / 1048576.0);
  else printf("   (/metrics failed)\n");
  fflush(stdout);
}

int main(int argc, char **argv) {
  int conc = 64;
  double seconds = 1800, every = 60;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--url")) g_url = argv[i + 1];
    else if (!strcmp(argv[i], "--concurrency")) conc = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--disconnect")) g_disconnect = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--max-tokens")) g_max_tokens = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--prompt-words")) g_prompt_words = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--report")) every = atof(argv[i + 1]);
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (argc % 2 == 0) {
    fprintf(stderr, "option %s needs a value\n", argv[argc - 1]);
    return 2;
  }
  if (conc < 1 || conc > 4096 || !(seconds > 0) || !(g_disconnect >= 0 && g_disconnect <= 1) || g_max_tokens < 1 ||
      g_prompt_words < 0 || g_prompt_words > 1000 || !(every > 0)) {
    fprintf(stderr, "bench_server_soak: --concurrency 1..4096, --seconds > 0, --disconnect 0..1, --max-tokens >= 1, "
                    "--prompt-words 0..1000, --report > 0\n");
    return 2;
  }
  curl_global_init(CURL_GLOBAL_ALL);
  gauges g0 = {0};
  if (!read_gauges(&g0)) {
    fprintf(stderr, "bench_server_soak: no /metrics at %s\n", g_url);
    return 1;
  }
  printf("%8s %8s %8s %6s %6s %6s %6s %9s %9s %7s %7s\n", "seconds", "finished", "hung_up", "5xx", "other", "transp",
         "cut", "chunks/s", "kv_used", "running", "rss_MiB");
  const double t0 = now();
  g_deadline = t0 + seconds;
  pthread_t *th = malloc(sizeof(pthread_t) * (size_t)conc);
  for (int i = 0; i < conc; i++) pthread_create(&th[i], NULL, client, NULL);
  long before = 0;
  double last = t0;
  while (now() < g_deadline) {
    const double left = g_deadline - now(), nap = left < every - (now() - last) ? left : every - (now() - last);
    if (nap > 0) usleep((useconds_t)(nap * 1e6));
    if (now() - last >= every - 1e-3 || now() >= g_deadline) {
      const double t = now();
      report(t - t0, t - last, before);
      before = __atomic_load_n(&g_chunks, __ATOMIC_RELAXED);
      last = t;
    }
  }
  for (int i = 0; i < conc; i++) pthread_join(th[i], NULL);
  free(th);
  /* idle: every sequence gone and its blocks released (cached prefix blocks are free) */
  gauges g = {0};
  bool idle = false;
  for (int k = 0; k < 100 && !idle; k++) {
    idle = read_gauges(&g) && g.running == 0 && g.queued == 0 && g.kv_used == 0;
    if (!idle) usleep(100000);
  }
  const long ok = g_ok, bad = g_e5xx + g_cut;
  printf("after the clients stopped: %s (kv blocks used %.0f, running %.0f, queued %.0f), rss %.1f MiB at the start, "
         "%.1f at the end; cancelled by the server's count %.0f, hung up %ld\n",
         idle ? "idle" : "NOT idle", g.kv_used, g.running, g.queued, g0.rss / 1048576.0, g.rss / 1048576.0,
         g.cancelled - g0.cancelled, g_hung_up);
  curl_global_cleanup();
  if (bad || !idle || ok == 0) {
    printf("FAIL: %ld 5xx, %ld streams cut short, %s, %ld finished\n", g_e5xx, g_cut, idle ? "idle" : "not idle", ok);
    return 1;
  }
  return 0;
}
