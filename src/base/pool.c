/* Persistent worker pool. Dispatch bumps a generation counter; idle workers spin on it for a
 * while (decode issues a hundred or more small ops a token back to back), then sleep on a condvar:
 * how long they spin is the poll level (llama.cpp's --poll, 0..100). The counters that the
 * dispatcher writes, the one the workers write and the sleep count live on separate cache lines,
 * so finishing workers do not disturb the ones still spinning. Threads may be pinned to CPU sets
 * (backend/cpu/cpu_place.c makes them); the caller runs as thread 0 and is pinned to thread 0's set the first time it
 * dispatches. */
#include "base/pool.h"
#include "base/base.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SM_PAUSE() _mm_pause()
#else
#define SM_PAUSE() ((void)0)
#endif

#define POLL_NS_PER_LEVEL 40000ull /* level 50: spin 2 ms before sleeping */
#define CL 64

struct sm_pool {
  /* written by the dispatcher, read by the workers */
  _Alignas(CL) _Atomic uint64_t gen;
  sm_pool_fn fn;
  void *ctx;
  _Atomic int quit;
  int n;
  uint64_t spin_ns;
  /* written by the workers */
  _Alignas(CL) _Atomic int n_done;
  _Alignas(CL) _Atomic int n_sleeping;
  _Alignas(CL) pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t *th;
  cpu_set_t *sets;  /* [n] or NULL: no pinning */
  pthread_t caller; /* the thread last pinned as thread 0 */
  bool caller_pinned;
  /* statistics (sm_pool_stats_on): each thread's time in fn in the last run, a cache line each */
  bool st_on;
  uint64_t *busy;
  uint64_t last_end;
  sm_pool_stats st;
};

typedef struct {
  sm_pool *p;
  int tid;
} worker_arg;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void *worker(void *arg) {
  worker_arg wa = *(worker_arg *)arg;
  free(arg);
  sm_pool *p = wa.p;
  if (p->sets) pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &p->sets[wa.tid]);
  uint64_t seen = 0; /* gen starts at 0 and only the dispatcher bumps it */
  for (;;) {
    uint64_t g;
    uint64_t t0 = 0;
    unsigned spins = 0;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
      SM_PAUSE();
      if (p->spin_ns == 0 || ++spins == 1024) {
        spins = 0;
        uint64_t t = now_ns();
        if (!t0) t0 = t;
        if (t - t0 >= p->spin_ns) {
          pthread_mutex_lock(&p->mu);
          atomic_fetch_add(&p->n_sleeping, 1);
          while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv, &p->mu);
          atomic_fetch_sub(&p->n_sleeping, 1);
          pthread_mutex_unlock(&p->mu);
          t0 = 0;
        } else {
          sched_yield(); /* an oversubscribed machine can run the dispatcher */
        }
      }
    }
    seen = g;
    if (atomic_load(&p->quit)) break;
    if (p->st_on) {
      const uint64_t t1 = now_ns();
      p->fn(p->ctx, wa.tid, p->n);
      p->busy[wa.tid * (CL / 8)] = now_ns() - t1;
    } else {
      p->fn(p->ctx, wa.tid, p->n);
    }
    atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
  }
  return NULL;
}

sm_pool *sm_pool_create(int n_threads, const cpu_set_t *sets, int poll) {
  if (n_threads < 1) n_threads = 1;
  sm_pool *p = sm_aligned_alloc(sizeof *p);
  if (!p) return NULL;
  memset(p, 0, sizeof *p);
  p->n = n_threads;
  p->spin_ns = (uint64_t)(poll < 0 ? 0 : poll > 100 ? 100 : poll) * POLL_NS_PER_LEVEL;
  if (sets) {
    p->sets = sm_xmalloc(sizeof(cpu_set_t) * (size_t)n_threads);
    memcpy(p->sets, sets, sizeof(cpu_set_t) * (size_t)n_threads);
  }
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
  free(p->sets);
  free(p->busy);
  free(p);
}

void sm_pool_stats_on(sm_pool *p) {
  if (p->st_on) return;
  p->busy = sm_xcalloc((size_t)p->n * (CL / 8), sizeof(uint64_t));
  p->st.threads = p->n;
  p->st_on = true; /* the workers see it with the next run's generation */
}

void sm_pool_stats_get(const sm_pool *p, sm_pool_stats *st) {
  *st = p->st;
  st->threads = p->n;
}

/* the caller's part of a run with statistics */
static void run_timed(sm_pool *p, sm_pool_fn fn, void *ctx, uint64_t t0) {
  fn(ctx, 0, p->n);
  p->busy[0] = now_ns() - t0;
}

int sm_pool_size(const sm_pool *p) { return p->n; }
bool sm_pool_pinned(const sm_pool *p) { return p->sets != NULL; }

void sm_pool_run(sm_pool *p, sm_pool_fn fn, void *ctx) {
  if (p->sets && (!p->caller_pinned || !pthread_equal(p->caller, pthread_self()))) {
    pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &p->sets[0]);
    p->caller = pthread_self();
    p->caller_pinned = true;
  }
  const uint64_t t0 = p->st_on ? now_ns() : 0;
  if (p->st_on && p->last_end) p->st.gap_ns += t0 - p->last_end;
  if (p->n == 1) {
    if (p->st_on) run_timed(p, fn, ctx, t0);
    else fn(ctx, 0, 1);
  } else {
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn/ctx, ordered before n_sleeping read */
    wake(p);
    if (p->st_on) run_timed(p, fn, ctx, t0);
    else fn(ctx, 0, p->n);
    /* spin; yield now and then so an oversubscribed machine can run the late worker */
    for (unsigned spins = 0; atomic_load_explicit(&p->n_done, memory_order_acquire) != p->n - 1;) {
      SM_PAUSE();
      if (++spins % 4096 == 0) sched_yield();
    }
  }
  if (!p->st_on) return;
  const uint64_t t1 = now_ns();
  uint64_t mx = 0;
  for (int i = 0; i < p->n; i++) {
    const uint64_t b = p->busy[i * (CL / 8)];
    p->st.busy_ns += b;
    if (b > mx) mx = b;
  }
  p->st.busy_max_ns += mx;
  p->st.wall_ns += t1 - t0;
  p->st.runs++;
  p->last_end = t1;
}
