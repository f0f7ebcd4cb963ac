/* Prometheus metrics of `smelt serve` (see metrics.h). */
#include "server/metrics.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/strbuf.h"

#define MAX_SERIES 64
typedef struct { char endpoint[48]; int status; uint64_t n; } req_series;

struct sm_metrics {
  pthread_mutex_t mu;
  req_series req[MAX_SERIES];
  int n_req;
  uint64_t prompt_tokens, gen_tokens, cached_tokens, preemptions, cancelled;
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
void sm_metrics_preempt(sm_metrics *m) {
  pthread_mutex_lock(&m->mu);
  m->preemptions++;
  pthread_mutex_unlock(&m->mu);
}

static void render_hist(sm_buf *b, const char *name, const char *help, const sm_hist *h) {
  sm_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (int i = 0; i < h->n; i++) {
    cum += h->count[i];
    sm_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
  }
  cum += h->count[h->n];
  sm_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum,
            name, (unsigned long long)h->total);
}

char *sm_metrics_render(sm_metrics *m, const sm_metrics_gauges *g) {
  sm_buf b = SM_BUF_INIT;
  sm_buf_reserve(&b, 4096);
  pthread_mutex_lock(&m->mu);
  sm_buf_printf(&b, "# HELP smelt_requests_total HTTP requests by endpoint and status code.\n"
                "# TYPE smelt_requests_total counter\n");
  for (int i = 0; i < m->n_req; i++)
    sm_buf_printf(&b, "smelt_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", m->req[i].endpoint, m->req[i].status,
              (unsigned long long)m->req[i].n);
  sm_buf_printf(&b,
            "# HELP smelt_prompt_tokens_total Prompt tokens processed (including cached ones).\n"
            "# TYPE smelt_prompt_tokens_total counter\nsmelt_prompt_tokens_total %llu\n"
            "# HELP smelt_generation_tokens_total Tokens generated.\n"
            "# TYPE smelt_generation_tokens_total counter\nsmelt_generation_tokens_total %llu\n"
            "# HELP smelt_prompt_cached_tokens_total Prompt tokens reported as cached to clients.\n"
            "# TYPE smelt_prompt_cached_tokens_total counter\nsmelt_prompt_cached_tokens_total %llu\n"
            "# HELP smelt_preemptions_total Sequences preempted (requeued) on KV cache exhaustion.\n"
            "# TYPE smelt_preemptions_total counter\nsmelt_preemptions_total %llu\n"
            "# HELP smelt_requests_cancelled_total Requests cancelled by client disconnect.\n"
            "# TYPE smelt_requests_cancelled_total counter\nsmelt_requests_cancelled_total %llu\n",
            (unsigned long long)m->prompt_tokens, (unsigned long long)m->gen_tokens,
            (unsigned long long)m->cached_tokens, (unsigned long long)m->preemptions,
            (unsigned long long)m->cancelled);
  render_hist(&b, "smelt_time_to_first_token_seconds", "Time from request arrival to the first generated token.",
              &m->ttft);
  render_hist(&b, "smelt_inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence.",
              &m->itl);
  pthread_mutex_unlock(&m->mu);
  sm_buf_printf(&b,
            "# HELP smelt_requests_queued Requests waiting for a free sequence slot.\n"
            "# TYPE smelt_requests_queued gauge\nsmelt_requests_queued %d\n"
            "# HELP smelt_requests_running Requests being generated.\n"
            "# TYPE smelt_requests_running gauge\nsmelt_requests_running %d\n"
            "# HELP smelt_sequences_running Sequences (choices) being generated.\n"
            "# TYPE smelt_sequences_running gauge\nsmelt_sequences_running %d\n"
            "# HELP smelt_kv_cache_blocks_used KV cache blocks held by live sequences.\n"
            "# TYPE smelt_kv_cache_blocks_used gauge\nsmelt_kv_cache_blocks_used %d\n"
            "# HELP smelt_kv_cache_blocks_total KV cache blocks in total.\n"
            "# TYPE smelt_kv_cache_blocks_total gauge\nsmelt_kv_cache_blocks_total %d\n"
            "# HELP smelt_kv_cache_blocks_cached Free KV blocks still holding a reusable prefix.\n"
            "# TYPE smelt_kv_cache_blocks_cached gauge\nsmelt_kv_cache_blocks_cached %d\n"
            "# HELP smelt_kv_cache_block_size Tokens per KV block.\n"
            "# TYPE smelt_kv_cache_block_size gauge\nsmelt_kv_cache_block_size %d\n"
            "# HELP smelt_prefix_cache_hit_tokens_total Prompt tokens served from the prefix cache.\n"
            "# TYPE smelt_prefix_cache_hit_tokens_total counter\nsmelt_prefix_cache_hit_tokens_total %llu\n",
            g->queued, g->running_requests, g->running_seqs, g->kv_blocks_used, g->kv_blocks_total,
            g->kv_blocks_cached, g->kv_block_size, (unsigned long long)g->prefix_hit_tokens);
  return sm_buf_take(&b);
}
