/* A persistent pool of worker threads; the caller runs as thread 0 (pool.c). The CPU backend runs
 * its ops on one; the server builds a step's grammar masks on another. */
#ifndef SM_POOL_H
#define SM_POOL_H
#include <sched.h>
#include <stdbool.h>

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

#endif
