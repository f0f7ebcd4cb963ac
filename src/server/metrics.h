/* Prometheus metrics of `smelt serve` (text exposition format 0.0.4). Thread-safe. A server has
 * one sm_metrics for its HTTP requests and one per model for what the model's scheduler counts
 * (tokens, latencies, preemptions, cancellations); with several models their series carry a
 * `model` label. */
#ifndef SM_SERVER_METRICS_H
#define SM_SERVER_METRICS_H
#include "base/base.h"
#include "base/strbuf.h"

#define SM_HIST_MAX_BUCKETS 16
typedef struct {
  int n;                                   /* finite buckets */
  double le[SM_HIST_MAX_BUCKETS];          /* upper bounds, ascending */
  uint64_t count[SM_HIST_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last = +Inf */
  double sum;
  uint64_t total;
} sm_hist;

typedef struct sm_metrics sm_metrics;
sm_metrics *sm_metrics_new(void);
void sm_metrics_free(sm_metrics *m);
void sm_metrics_request(sm_metrics *m, const char *endpoint, int status);
void sm_metrics_tokens(sm_metrics *m, uint64_t prompt, uint64_t generated, uint64_t cached);
void sm_metrics_ttft(sm_metrics *m, double seconds);
void sm_metrics_itl(sm_metrics *m, double seconds);
void sm_metrics_preempt(sm_metrics *m);
void sm_metrics_cancel(sm_metrics *m);
/* pipelined steps: tokens a step took from the step before it on the device */
void sm_metrics_fed(sm_metrics *m, uint64_t n);
/* speculative decoding: draft tokens proposed and accepted */
void sm_metrics_spec(sm_metrics *m, uint64_t drafted, uint64_t accepted);
typedef struct {
  bool loaded; /* false: the model's gauges are left out */
  int queued, running_seqs, running_requests;
  int kv_blocks_used, kv_blocks_total, kv_blocks_cached, kv_block_size;
  uint64_t prefix_hit_tokens;
  /* the prefix cache's disk tier (pcache_disk.h); its families are left out without one */
  bool disk;
  uint64_t disk_hits, disk_hit_tokens, disk_writes, disk_evictions, disk_rejected, disk_bytes_written, disk_bytes_read;
  uint64_t disk_files, disk_bytes, disk_limit;
} sm_metrics_gauges;
/* smelt_requests_total of m */
void sm_metrics_render_requests(sm_metrics *m, sm_buf *out);
/* The per-model families of ms[0..n) with their gauges gs[i]: each family once, one series per
 * model, labelled model="names[i]" (names NULL: no label, n must be 1). */
void sm_metrics_render_models(sm_metrics *const *ms, const sm_metrics_gauges *gs, const char *const *names, int n,
                              sm_buf *out);
/* One model whose counters are in m too: malloc'd Prometheus text */
char *sm_metrics_render(sm_metrics *m, const sm_metrics_gauges *g);
/* A label value with \, " and newlines escaped */
void sm_metrics_label(sm_buf *out, const char *v);

#endif
