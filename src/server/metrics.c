/* Prometheus metrics of `smelt serve` (see metrics.h). */
#include "server/metrics.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/strbuf.h"

#define MAX_SERIES 64
typedef struct {
  char endpoint[48];
  int status;
  uint64_t n;
} req_series;

struct sm_metrics {
  pthread_mutex_t mu;
  req_series req[MAX_SERIES];
  int n_req;
  uint64_t prompt_tokens, gen_tokens, cached_tokens, preemptions, cancelled, spec_drafted, spec_accepted, fed;
  sm_hist ttft, itl;
};

static void hist_init(sm_hist *h, const double *le, int n) {
  memset(h, 0, sizeof *h);
  h->n = n;
  memcpy(h->le, le, sizeof(double) * (size_t)n);
}
static void hist_add(sm_hist *h, double v) {
  int i = 0;
  while (i < h->n && v > h->le[i]) i++;
  h->count[i]++;
  h->sum += v;
  h->total++;
}

sm_metrics *sm_metrics_new(void) {
  sm_metrics *m = sm_xcalloc(1, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
  static const double ttft[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  static const double itl[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  hist_init(&m->ttft, ttft, (int)SM_ARRAY_LEN(ttft));
  hist_init(&m->itl, itl, (int)SM_ARRAY_LEN(itl));
  return m;
}
void sm_metrics_free(sm_metrics *m) {
  if (!m) return;
  pthread_mutex_destroy(&m->mu);
  free(m);
}

void sm_metrics_request(sm_metrics *m, const char *endpoint, int status) {
  pthread_mutex_lock(&m->mu);
  int i;
  for (i = 0; i < m->n_req; i++)
    if (m->req[i].status == status && !strcmp(m->req[i].endpoint, endpoint)) break;
  if (i == m->n_req && m->n_req < MAX_SERIES) {
    snprintf(m->req[i].endpoint, sizeof m->req[i].endpoint, "%s", endpoint);
    m->req[i].status = status;
    m->req[i].n = 0;
    m->n_req++;
  }
  if (i < m->n_req) m->req[i].n++;
  pthread_mutex_unlock(&m->mu);
}
void sm_metrics_tokens(sm_metrics *m, uint64_t prompt, uint64_t generated, uint64_t cached) {
  pthread_mutex_lock(&m->mu);
  m->prompt_tokens += prompt;
  m->gen_tokens += generated;
  m->cached_tokens += cached;
  pthread_mutex_unlock(&m->mu);
}
void sm_metrics_ttft(sm_metrics *m, double s) {
  pthread_mutex_lock(&m->mu);
  hist_add(&m->ttft, s);
  pthread_mutex_unlock(&m->mu);
}
void sm_metrics_itl(sm_metrics *m, double s) {
  pthread_mutex_lock(&m->mu);
  hist_add(&m->itl, s);
  pthread_mutex_unlock(&m->mu);
}
void sm_metrics_cancel(sm_metrics *m) {
  pthread_mutex_lock(&m->mu);
  m->cancelled++;
  pthread_mutex_unlock(&m->mu);
}
void sm_metrics_fed(sm_metrics *m, uint64_t n) {
  pthread_mutex_lock(&m->mu);
  m->fed += n;
  pthread_mutex_unlock(&m->mu);
}
void sm_metrics_spec(sm_metrics *m, uint64_t drafted, uint64_t accepted) {
  pthread_mutex_lock(&m->mu);
  m->spec_drafted += drafted;
  m->spec_accepted += accepted;
  pthread_mutex_unlock(&m->mu);
}

void sm_metrics_preempt(sm_metrics *m) {
  pthread_mutex_lock(&m->mu);
  m->preemptions++;
  pthread_mutex_unlock(&m->mu);
}

void sm_metrics_label(sm_buf *out, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"') sm_buf_putc(out, '\\');
    if (*v == '\n') {
      sm_buf_puts(out, "\\n");
      continue;
    }
    sm_buf_putc(out, *v);
  }
}

/* the label set of series i: "" or {model="..."}; extra: more labels inside the braces */
static void labels(sm_buf *b, const char *const *names, int i, const char *extra) {
  if (!names && !extra) return;
  sm_buf_putc(b, '{');
  if (names) {
    sm_buf_puts(b, "model=\"");
    sm_metrics_label(b, names[i]);
    sm_buf_putc(b, '"');
  }
  if (extra) {
    if (names) sm_buf_putc(b, ',');
    sm_buf_puts(b, extra);
  }
  sm_buf_putc(b, '}');
}

static void head(sm_buf *b, const char *name, const char *type, const char *help) {
  sm_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void sm_metrics_render_requests(sm_metrics *m, sm_buf *b) {
  head(b, "smelt_requests_total", "counter", "HTTP requests by endpoint and status code.");
  pthread_mutex_lock(&m->mu);
  for (int i = 0; i < m->n_req; i++)
    sm_buf_printf(b, "smelt_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", m->req[i].endpoint, m->req[i].status,
                  (unsigned long long)m->req[i].n);
  pthread_mutex_unlock(&m->mu);
  /* the process's resident memory under Prometheus' standard name (leak checks under load) */
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long pages = 0, res = 0;
  if (f && fscanf(f, "%llu %llu", &pages, &res) == 2) {
    head(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    sm_buf_printf(b, "process_resident_memory_bytes %llu\n", res * (unsigned long long)sysconf(_SC_PAGESIZE));
  }
  if (f) fclose(f);
}

enum { C_PROMPT, C_GEN, C_CACHED, C_PREEMPT, C_CANCEL, C_DRAFTED, C_ACCEPTED, C_FED, N_COUNTERS };
static const struct {
  const char *name, *help;
} k_counters[N_COUNTERS] = {
  {"smelt_prompt_tokens_total", "Prompt tokens processed (including cached ones)."},
  {"smelt_generation_tokens_total", "Tokens generated."},
  {"smelt_prompt_cached_tokens_total", "Prompt tokens reported as cached to clients."},
  {"smelt_preemptions_total", "Sequences preempted (requeued) on KV cache exhaustion."},
  {"smelt_requests_cancelled_total", "Requests cancelled by client disconnect."},
  {"smelt_spec_draft_tokens_total", "Speculative decoding: draft tokens proposed for verification."},
  {"smelt_spec_accepted_tokens_total", "Speculative decoding: draft tokens the model accepted."},
  {"smelt_fed_tokens_total", "Tokens a step took from the step before it on the device (pipelined steps)."},
};

typedef struct {
  uint64_t c[N_COUNTERS];
  sm_hist ttft, itl;
} snapshot;

static void take_snapshot(sm_metrics *m, snapshot *s) {
  pthread_mutex_lock(&m->mu);
  s->c[C_PROMPT] = m->prompt_tokens;
  s->c[C_GEN] = m->gen_tokens;
  s->c[C_CACHED] = m->cached_tokens;
  s->c[C_PREEMPT] = m->preemptions;
  s->c[C_CANCEL] = m->cancelled;
  s->c[C_DRAFTED] = m->spec_drafted;
  s->c[C_ACCEPTED] = m->spec_accepted;
  s->c[C_FED] = m->fed;
  s->ttft = m->ttft;
  s->itl = m->itl;
  pthread_mutex_unlock(&m->mu);
}

static void render_hist(sm_buf *b, const char *name, const sm_hist *h, const char *const *names, int i) {
  uint64_t cum = 0;
  char le[48];
  for (int k = 0; k <= h->n; k++) {
    cum += h->count[k];
    if (k < h->n) snprintf(le, sizeof le, "le=\"%g\"", h->le[k]);
    else snprintf(le, sizeof le, "le=\"+Inf\"");
    sm_buf_printf(b, "%s_bucket", name);
    labels(b, names, i, le);
    sm_buf_printf(b, " %llu\n", (unsigned long long)cum);
  }
  sm_buf_printf(b, "%s_sum", name);
  labels(b, names, i, NULL);
  sm_buf_printf(b, " %.6f\n%s_count", h->sum, name);
  labels(b, names, i, NULL);
  sm_buf_printf(b, " %llu\n", (unsigned long long)h->total);
}

void sm_metrics_render_models(sm_metrics *const *ms, const sm_metrics_gauges *gs, const char *const *names, int n,
                              sm_buf *b) {
  /* a consistent copy of each model's counters */
  snapshot *snap = sm_xmalloc(sizeof *snap * (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++) take_snapshot(ms[i], &snap[i]);
  for (int c = 0; c < N_COUNTERS; c++) {
    head(b, k_counters[c].name, "counter", k_counters[c].help);
    for (int i = 0; i < n; i++) {
      sm_buf_puts(b, k_counters[c].name);
      labels(b, names, i, NULL);
      sm_buf_printf(b, " %llu\n", (unsigned long long)snap[i].c[c]);
    }
  }
  head(b, "smelt_spec_acceptance_rate", "gauge",
       "Speculative decoding: accepted / proposed draft tokens so far (0 before any draft).");
  for (int i = 0; i < n; i++) {
    sm_buf_puts(b, "smelt_spec_acceptance_rate");
    labels(b, names, i, NULL);
    const uint64_t d = snap[i].c[C_DRAFTED];
    sm_buf_printf(b, " %.6f\n", d ? (double)snap[i].c[C_ACCEPTED] / (double)d : 0.0);
  }
  head(b, "smelt_time_to_first_token_seconds", "histogram", "Time from request arrival to the first generated token.");
  for (int i = 0; i < n; i++) render_hist(b, "smelt_time_to_first_token_seconds", &snap[i].ttft, names, i);
  head(b, "smelt_inter_token_latency_seconds", "histogram", "Time between consecutive generated tokens of a sequence.");
  for (int i = 0; i < n; i++) render_hist(b, "smelt_inter_token_latency_seconds", &snap[i].itl, names, i);
  free(snap);
  static const struct {
    const char *name, *type, *help;
  } G[] = {
    {"smelt_requests_queued", "gauge", "Requests waiting for a free sequence slot."},
    {"smelt_requests_running", "gauge", "Requests being generated."},
    {"smelt_sequences_running", "gauge", "Sequences (choices) being generated."},
    {"smelt_kv_cache_blocks_used", "gauge", "KV cache blocks held by live sequences."},
    {"smelt_kv_cache_blocks_total", "gauge", "KV cache blocks in total."},
    {"smelt_kv_cache_blocks_cached", "gauge", "Free KV blocks still holding a reusable prefix."},
    {"smelt_kv_cache_block_size", "gauge", "Tokens per KV block."},
    {"smelt_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache."},
  };
  for (size_t k = 0; k < SM_ARRAY_LEN(G); k++) {
    head(b, G[k].name, G[k].type, G[k].help);
    for (int i = 0; i < n; i++) {
      const sm_metrics_gauges *g = &gs[i];
      if (!g->loaded) continue;
      const uint64_t v[] = {(uint64_t)g->queued,         (uint64_t)g->running_requests, (uint64_t)g->running_seqs,
                            (uint64_t)g->kv_blocks_used, (uint64_t)g->kv_blocks_total,  (uint64_t)g->kv_blocks_cached,
                            (uint64_t)g->kv_block_size,  g->prefix_hit_tokens};
      sm_buf_puts(b, G[k].name);
      labels(b, names, i, NULL);
      sm_buf_printf(b, " %llu\n", (unsigned long long)v[k]);
    }
  }
  static const struct {
    const char *name, *type, *help;
  } D[] = {
    {"smelt_kv_disk_hits_total", "counter", "KV blocks read back from the disk cache for a prompt."},
    {"smelt_kv_disk_hit_tokens_total", "counter", "Prompt tokens whose KV was read back from the disk cache."},
    {"smelt_kv_disk_writes_total", "counter", "KV blocks spilled to the disk cache (written or queued)."},
    {"smelt_kv_disk_evictions_total", "counter", "Disk cache files deleted to stay within the size limit."},
    {"smelt_kv_disk_rejected_total", "counter",
     "Disk cache files refused (corrupt, truncated, mismatched) and deleted."},
    {"smelt_kv_disk_written_bytes_total", "counter", "Bytes written to the disk cache."},
    {"smelt_kv_disk_read_bytes_total", "counter", "Bytes read back from the disk cache."},
    {"smelt_kv_disk_files", "gauge", "KV block files in the disk cache."},
    {"smelt_kv_disk_bytes", "gauge", "Bytes of the disk cache's files."},
    {"smelt_kv_disk_limit_bytes", "gauge", "The disk cache's size limit."},
  };
  bool any = false;
  for (int i = 0; i < n; i++) any |= gs[i].loaded && gs[i].disk;
  for (size_t k = 0; any && k < SM_ARRAY_LEN(D); k++) {
    head(b, D[k].name, D[k].type, D[k].help);
    for (int i = 0; i < n; i++) {
      const sm_metrics_gauges *g = &gs[i];
      if (!g->loaded || !g->disk) continue;
      const uint64_t v[] = {g->disk_hits,     g->disk_hit_tokens,    g->disk_writes,     g->disk_evictions,
                            g->disk_rejected, g->disk_bytes_written, g->disk_bytes_read, g->disk_files,
                            g->disk_bytes,    g->disk_limit};
      sm_buf_puts(b, D[k].name);
      labels(b, names, i, NULL);
      sm_buf_printf(b, " %llu\n", (unsigned long long)v[k]);
    }
  }
}

char *sm_metrics_render(sm_metrics *m, const sm_metrics_gauges *g) {
  sm_buf b = SM_BUF_INIT;
  sm_buf_reserve(&b, 4096);
  sm_metrics_render_requests(m, &b);
  sm_metrics_gauges one = *g;
  one.loaded = true;
  sm_metrics_render_models(&m, &one, NULL, 1, &b);
  return sm_buf_take(&b);
}
