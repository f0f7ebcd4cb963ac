/* Persistent worker pool. Dispatch bumps a generation counter; workers spin on it
 * for a while (decode issues many small ops back to back), then sleep on a condvar. */
#include "backend/cpu/cpu_internal.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sched.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SM_PAUSE() _mm_pause()
#else
#define SM_PAUSE() ((void)0)
#endif

#define SPIN_NS 2000000ull /* spin up to 2 ms before sleeping */

struct sm_pool {
  int n;
  pthread_t *th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  _Atomic uint64_t gen;
  _Atomic int n_sleeping;
  _Atomic int n_done;
  _Atomic int quit;
  sm_pool_fn fn;
  void *ctx;
};

typedef struct { sm_pool *p; int tid; } worker_arg;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void *worker(void *arg) {
  worker_arg wa = *(worker_arg *)arg;
  free(arg);
  sm_pool *p = wa.p;
  uint64_t seen = 0; /* gen starts at 0 and only the dispatcher bumps it */
  for (;;) {
    uint64_t g;
    uint64_t t0 = 0;
    unsigned spins = 0;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
      SM_PAUSE();
      if (++spins == 1024) {
        spins = 0;
        sched_yield();
        uint64_t t = now_ns();
        if (!t0) t0 = t;
        else if (t - t0 > SPIN_NS) {
          pthread_mutex_lock(&p->mu);
          atomic_fetch_add(&p->n_sleeping, 1);
          while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv, &p->mu);
          atomic_fetch_sub(&p->n_sleeping, 1);
          pthread_mutex_unlock(&p->mu);
          t0 = 0;
        }
      }
    }
    seen = g;
    if (atomic_load(&p->quit)) break;
    p->fn(p->ctx, wa.tid, p->n);
    atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
  }
  return NULL;
}

sm_pool *sm_pool_create(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  sm_pool *p = sm_xcalloc(1, sizeof *p);
  p->n = n_threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->th = sm_xcalloc((size_t)n_threads, sizeof(pthread_t));
  for (int i = 1; i < n_threads; i++) {
    worker_arg *wa = sm_xmalloc(sizeof *wa);
    wa->p = p;
    wa->tid = i;
    if (pthread_create(&p->th[i], NULL, worker, wa) != 0) {
      free(wa);
      p->n = i; /* run with the threads we got */
      break;
    }
  }
  return p;
}

static void wake(sm_pool *p) {
  if (atomic_load(&p->n_sleeping) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
}

void sm_pool_destroy(sm_pool *p) {
  if (!p) return;
  atomic_store(&p->quit, 1);
  atomic_fetch_add(&p->gen, 1);
  pthread_mutex_lock(&p->mu);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->th);
  free(p);
}

int sm_pool_size(const sm_pool *p) { return p->n; }

void sm_pool_run(sm_pool *p, sm_pool_fn fn, void *ctx) {
  if (p->n == 1) { fn(ctx, 0, 1); return; }
  p->fn = fn;
  p->ctx = ctx;
  atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
  atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn/ctx, ordered before n_sleeping read */
  wake(p);
  fn(ctx, 0, p->n);
  /* spin; yield now and then so an oversubscribed machine can run the late worker */
  for (unsigned spins = 0; atomic_load_explicit(&p->n_done, memory_order_acquire) != p->n - 1;) {
    SM_PAUSE();
    if (++spins % 4096 == 0) sched_yield();
  }
}
