/* What the CUDA backend reports about itself: the per-op profile (tuning profile: graphs off, every
 * op timed with events), step statistics and the timeline of pipelined decode steps (tuning stats),
 * fusion and launch counts, and the kernel timeline of SMELT_CUDA_TRACE developer builds. */
#include <stdio.h>
#include <string.h>
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_be.cuh"
#include "backend/cuda/cuda_mlp.cuh"
#include "backend/cuda/cuda_q4.cuh"

/* the step-size buckets of the stats: most tokens of each, and their names */
static const int k_bk_max[6] = {1, 16, 64, 128, 256, 512};
static const char *const k_bk_name[7] = {"1", "2-16", "17-64", "65-128", "129-256", "257-512", ">512"};

void cu_prof_begin(cuda_be *c) { if (c->t.profile) cudaEventRecord(c->pe0, c->s); }
void cu_prof_end(cuda_be *c, const char *label, double flop) {
  if (!c->t.profile) return;
  cudaEventRecord(c->pe1, c->s);
  cudaEventSynchronize(c->pe1);
  float ms = 0;
  cudaEventElapsedTime(&ms, c->pe0, c->pe1);
  int i;
  for (i = 0; i < c->n_pt; i++) if (!strcmp(c->pt[i].label, label)) break;
  if (i == c->n_pt) {
    if (c->n_pt == 96) return;
    snprintf(c->pt[c->n_pt++].label, sizeof c->pt[0].label, "%s", label);
  }
  c->pt[i].ms += ms;
  c->pt[i].flop += flop;
  c->pt[i].count++;
}
void cu_prof_report(cuda_be *c) {
  if (c->t.profile) {
    double tot = 0;
    for (int i = 0; i < c->n_pt; i++) tot += c->pt[i].ms;
    fprintf(stderr, "cuda profile (ms total, calls, us/call):\n");
    for (int i = 0; i < c->n_pt; i++) {
      int b = i;
      for (int j = i + 1; j < c->n_pt; j++) if (c->pt[j].ms > c->pt[b].ms) b = j;
      if (b != i) { auto t = c->pt[i]; c->pt[i] = c->pt[b]; c->pt[b] = t; }
      fprintf(stderr, "  %-44s %9.2f %7ld %9.1f  %4.1f%%\n", c->pt[i].label, c->pt[i].ms, c->pt[i].count,
              1000.0 * c->pt[i].ms / (double)c->pt[i].count, 100.0 * c->pt[i].ms / (tot > 0 ? tot : 1));
    }
    /* prefill attention against the dense f16 tensor-core peak: SMs x clock x f16 flop a clock an SM
     * (sm_80: 2,048, sm_90: 4,096 with wgmma; the mma.sync this backend issues reaches less) */
    for (int i = 0; i < c->n_pt; i++) {
      if (c->pt[i].flop <= 0 || c->pt[i].ms <= 0) continue;
      const double tf = c->pt[i].flop / (c->pt[i].ms * 1e-3) / 1e12;
      int khz = 0;
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, c->dev);
      const double per = c->arch >= 90 ? 4096 : c->arch == 80 ? 2048 : 0, peak = per * c->n_sm * khz * 1e3 / 1e12;
      fprintf(stderr, "cuda profile: %s %.1f%% of the GPU time, %.1f TFLOP/s", c->pt[i].label,
              100.0 * c->pt[i].ms / (tot > 0 ? tot : 1), tf);
      if (peak > 0) fprintf(stderr, " = %.1f%% of the f16 tensor-core peak (%.0f TFLOP/s at %.2f GHz)", 100.0 * tf / peak,
                            peak, khz / 1e6);
      fprintf(stderr, "\n");
    }
  }
  if (c->t.profile || c->t.stats)
    fprintf(stderr, "cuda stats: graph replays timed %ld: GPU %.3f ms/replay, download or sampling after it %.3f ms, host flush %.1f us\n",
            c->st_timed, c->st_timed ? c->st_graph_ms / c->st_timed : 0.0, c->st_timed ? c->st_dl_ms / c->st_timed : 0.0,
            c->st_graph_launch ? c->st_flush_us / c->st_graph_launch : 0.0);
  if (c->t.stats && c->st_steps)
    fprintf(stderr, "cuda stats: %ld steps, host us/step: outside the backend %.1f, set_batch..flush %.1f, "
            "set_batch..sync return %.1f\n", c->st_steps, c->st_outside_us / c->st_steps, c->st_rec_us / c->st_steps,
            c->st_wait_us / c->st_steps);
  if (c->t.stats && c->st_steps) {
    fprintf(stderr, "cuda stats: steps by tokens (count, us each, share of step time):");
    for (int k = 0; k < 7; k++)
      if (c->st_bk_n[k])
        fprintf(stderr, " %s: %ld, %.1f, %.1f%%;", k_bk_name[k], c->st_bk_n[k], c->st_bk_us[k] / c->st_bk_n[k],
                100.0 * c->st_bk_us[k] / (c->st_wait_us > 0 ? c->st_wait_us : 1));
    fprintf(stderr, "\n");
  }
  if (c->t.stats >= 2 && c->tl_n)
    fprintf(stderr, "cuda timeline: %ld pipelined steps, GPU us/step: upload %.1f, to graph start %.1f, graph %.1f, "
            "sampling %.1f, token download %.1f; step period %.1f\n", c->tl_n, 1e3 * c->tl_sum[0] / c->tl_n,
            1e3 * c->tl_sum[1] / c->tl_n, 1e3 * c->tl_sum[2] / c->tl_n, 1e3 * c->tl_sum[3] / c->tl_n,
            1e3 * c->tl_sum[4] / c->tl_n, 1e3 * c->tl_sum[5] / c->tl_n);
  if (c->t.profile || c->t.stats)
    fprintf(stderr, "cuda stats: graph launches %ld, captures %ld, eager recorded forwards %ld\n", c->st_graph_launch,
            c->st_capture, c->st_eager_fwd);
  if (c->t.profile || c->t.stats) {
    fprintf(stderr, "cuda stats: fused kernels run (all executed forwards):");
    for (int i = 0; i < cu_fusion_count(); i++)
      if (c->fused_all[i]) fprintf(stderr, " %s %ld;", cu_fusion_name(i), c->fused_all[i]);
    fprintf(stderr, "\ncuda stats: ops run unfused:");
    for (int i = 0; i < OP_COUNT; i++)
      if (c->unfused_all[i]) fprintf(stderr, " %s %ld;", cu_op_name(i), c->unfused_all[i]);
    fprintf(stderr, "\ncuda stats: kernel launches of the last captured graph: %d\n", c->graph_nodes_last);
  }
}

/* after a sync: add the timed graph replay (and download) to the stats */
void cu_stats_collect(cuda_be *c) {
  if (c->t.stats) {
    const double now = sm_now();
    if (c->t_setb > 0) {
      const double us = (now - c->t_setb) * 1e6;
      const int n = c->st_n;
      int k = 0;
      while (k < 6 && n > k_bk_max[k]) k++;
      c->st_wait_us += us;
      c->st_steps++;
      c->st_bk_n[k]++;
      c->st_bk_us[k] += us;
      if (us > 20000) /* a slow step: what it did besides running */
        fprintf(stderr, "cuda stats: step of %d tokens took %.1f ms (graph captures %ld, eager forwards %ld, scratch regrowths %ld)\n",
                n, us / 1e3, c->st_capture - c->st_mark[0], c->st_eager_fwd - c->st_mark[1], c->st_grow - c->st_mark[2]);
      c->t_setb = 0;
    }
    c->t_ret = now;
  }
  if (!c->st_pending) return;
  float a = 0, b = 0;
  if (cudaEventElapsedTime(&a, c->se0, c->se1) == cudaSuccess) {
    c->st_graph_ms += a;
    c->st_timed++;
    if (c->st_pending == 2 && cudaEventElapsedTime(&b, c->se1, c->se2) == cudaSuccess) c->st_dl_ms += b;
  }
  cudaGetLastError();
  c->st_pending = 0;
}
void cu_tl_mark(cuda_be *c, int e) {
  if (c->t.stats < 2) return;
  const int k = c->feed_next;
  if (e == 0)
    for (int i = 0; i < 6; i++) c->tl_rec[k][i] = false;
  cudaEventRecord(c->tle[k][e], c->s);
  c->tl_rec[k][e] = true;
}
/* after the token of slot k is in: add its step's segments; the period runs to the next step's
 * upload (recorded before this wait) */
void cu_tl_collect(cuda_be *c, int k) {
  if (c->t.stats < 2) return;
  for (int i = 0; i < 6; i++)
    if (!c->tl_rec[k][i]) return;
  if (!c->tl_rec[1 - k][0]) return;
  float t[6];
  for (int i = 0; i < 5; i++)
    if (cudaEventElapsedTime(&t[i], c->tle[k][i], c->tle[k][i + 1]) != cudaSuccess) { cudaGetLastError(); return; }
  cudaEventSynchronize(c->tle[1 - k][0]);
  if (cudaEventElapsedTime(&t[5], c->tle[k][0], c->tle[1 - k][0]) != cudaSuccess || t[5] <= 0) { cudaGetLastError(); return; }
  for (int i = 0; i < 6; i++) c->tl_sum[i] += t[i];
  c->tl_n++;
}


void cu_prof_init(cuda_be *c) {
  if (c->t.profile) {
    c->graphs_on = false;
    cudaEventCreate(&c->pe0);
    cudaEventCreate(&c->pe1);
  }
  if (c->t.stats) {
    cudaEventCreate(&c->se0);
    cudaEventCreate(&c->se1);
    cudaEventCreate(&c->se2);
  }
  if (c->t.stats >= 2)
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 6; i++) cudaEventCreate(&c->tle[k][i]);
}

void cu_prof_free(cuda_be *c) {
  if (c->pe0) cudaEventDestroy(c->pe0);
  if (c->pe1) cudaEventDestroy(c->pe1);
  if (c->se0) { cudaEventDestroy(c->se0); cudaEventDestroy(c->se1); cudaEventDestroy(c->se2); }
  if (c->t.stats >= 2)
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 6; i++) cudaEventDestroy(c->tle[k][i]);
}

#ifdef SMELT_CUDA_TRACE
static unsigned long long *g_trace_buf; /* developer builds with -DSMELT_CUDA_TRACE only */
static void trace_dump(void) {
  if (!g_trace_buf) return;
  unsigned long long t[128];
  cudaMemcpy(t, g_trace_buf, sizeof t, cudaMemcpyDeviceToHost);
  const double a0 = (double)t[16];
  const char *nm[] = { "attn block0 entry", "attn K/V batch issued", "attn after pdl_wait", "attn q ready",
                       "attn loop done", "attn before cluster sync", "attn after cluster sync", "attn combine done",
                       "attn end" };
  fprintf(stderr, "trace (launch %llu of %llu attention launches), us from attention block 0 entry:\n", t[1], t[0]);
  for (int k = 0; k < 9; k++) fprintf(stderr, "  %-28s %8.2f\n", nm[k], ((double)t[16 + k] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "q/k/v last block exit", ((double)t[40] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "o block0 entry", ((double)t[32] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "o after pdl_wait", ((double)t[33] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "attn last block exit", ((double)t[34] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "o block0 exit", ((double)t[35] - a0) / 1e3);
  if (t[36]) fprintf(stderr, "  %-28s %8.2f\n", "o (k_mvr) last block entry", ((double)t[36] - a0) / 1e3);
  if (t[37]) fprintf(stderr, "  %-28s %8.2f\n", "o (k_mvr) last weights in", ((double)t[37] - a0) / 1e3);
  if (t[38]) fprintf(stderr, "  %-28s %8.2f\n", "o (k_mvr) last block exit", ((double)t[38] - a0) / 1e3);
  /* the MLP kernel (k_mlp1) launch [65]: first / last block of each event, us from its first entry */
  const char *mn[] = { "entry", "after pdl_wait", "x ready (norm)", "gate/up done", "grid barrier out", "down done" };
  if (t[66] != ~0ull) {
    const double m0 = (double)t[66];
    fprintf(stderr, "mlp launch %llu (%llu block arrivals), us from its first block's entry (first / last block):\n", t[65], t[64]);
    for (int k = 0; k < 6; k++)
      if (t[66 + 2 * k] != ~0ull)
        fprintf(stderr, "  mlp %-24s %8.2f %8.2f\n", mn[k], ((double)t[66 + 2 * k] - m0) / 1e3, ((double)t[67 + 2 * k] - m0) / 1e3);
  }
}
#endif


void cu_trace_init(const cu_tune *t) {
#ifdef SMELT_CUDA_TRACE
  if (!g_trace_buf && cudaMalloc(&g_trace_buf, 128 * sizeof(unsigned long long)) == cudaSuccess) {
    unsigned long long init[128] = { 0 };
    init[1] = (unsigned long long)t->trace_l;
    init[65] = init[1]; /* the MLP launch traced ([64..]: see cuda_mlp.cu) */
    for (int k = 66; k < 78; k += 2) init[k] = ~0ull;
    cudaMemcpy(g_trace_buf, init, sizeof init, cudaMemcpyHostToDevice);
    cu_attn_set_trace(g_trace_buf);
    cu_q4_set_trace(g_trace_buf);
    cu_mlp_set_trace(g_trace_buf);
  }
#else
  (void)t;
#endif
}

void cu_trace_report(void) {
#ifdef SMELT_CUDA_TRACE
  trace_dump();
#endif
}
