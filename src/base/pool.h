/* A persistent pool of worker threads; the caller runs as thread 0 (pool.c). The CPU backend runs
 * its ops on one; the server builds a step's grammar masks on another. */
#ifndef SM_POOL_H
#define SM_POOL_H
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct sm_pool sm_pool;
typedef void (*sm_pool_fn)(void *ctx, int tid, int nth);
/* sets: [n_threads] CPU sets thread i is pinned to (NULL: no pinning); poll: 0..100, how long
 * idle workers spin before they sleep (llama.cpp's --poll; 50: 2 ms) */
sm_pool *sm_pool_create(int n_threads, const cpu_set_t *sets, int poll);
bool sm_pool_pinned(const sm_pool *p);
void sm_pool_destroy(sm_pool *p);
int sm_pool_size(const sm_pool *p);
/* Runs fn(ctx, tid, nth) on every thread (tid 0 = caller) and waits for all. */
void sm_pool_run(sm_pool *p, sm_pool_fn fn, void *ctx);
/* Time statistics of the runs, kept once sm_pool_stats_on was called (before any run, from the
 * thread that runs the pool): how many runs; their wall time from dispatch until the last thread
 * is done; the threads' time inside fn, summed, and summed over runs for the busiest thread of each
 * run; the caller's time between runs. */
typedef struct {
  uint64_t runs, wall_ns, busy_ns, busy_max_ns, gap_ns;
  int threads;
} sm_pool_stats;
void sm_pool_stats_on(sm_pool *p);
void sm_pool_stats_get(const sm_pool *p, sm_pool_stats *st);

#endif
