/* CPU thread placement and the thread pool: mask parsing (hex as llama.cpp's --cpu-mask, lists as
 * its --cpu-range), the placement plan (thread count from the mask, one CPU per thread, errors that
 * name the option), workers really running on the CPUs they were given, NUMA mode names, and a
 * pool that sleeps at once (--poll 0) or spins still doing every dispatch, and its time statistics
 * (SMELT_CPU_STATS). */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_fail = 0;
#define CHECK(c, ...) \
  do { \
    if (!(c)) { \
      g_fail++; \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__); \
      printf("\n"); \
    } \
  } while (0)

static int cpus_of(const cpu_set_t *s, int *out, int max) {
  int n = 0;
  for (int i = 0; i < CPU_SETSIZE && n < max; i++)
    if (CPU_ISSET(i, s)) out[n++] = i;
  return n;
}

static void test_parse(void) {
  static const struct {
    const char *s;
    int n, cpus[6];
  } good[] = {
    {"0x1", 1, {0}},          {"0x3", 2, {0, 1}},      {"f0", 4, {4, 5, 6, 7}},
    {"0X10", 1, {4}},         {"3", 2, {0, 1}},        {"0-3", 4, {0, 1, 2, 3}},
    {"2-2", 1, {2}},          {"1,5-6", 3, {1, 5, 6}}, {"0-1,8-9", 4, {0, 1, 8, 9}},
    {"0x100000000", 1, {32}},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    cpu_set_t s;
    int got[8], n = 0;
    bool ok = sm_cpu_parse_mask(good[i].s, &s);
    if (ok) n = cpus_of(&s, got, 8);
    CHECK(ok && n == good[i].n && !memcmp(got, good[i].cpus, sizeof(int) * (size_t)n), "mask '%s': ok=%d n=%d",
          good[i].s, ok, n);
  }
  static const char *bad[] = {"", "0x", "0", "0x0", "zz", "3-1", "1,,2", "0-", "-3", "1;2", "0x1g"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cpu_set_t s;
    CHECK(!sm_cpu_parse_mask(bad[i], &s), "mask '%s' accepted", bad[i]);
  }
  smelt_numa m;
  CHECK(smelt_numa_parse("distribute", &m) == SMELT_OK && m == SMELT_NUMA_DISTRIBUTE, "numa distribute");
  CHECK(smelt_numa_parse("isolate", &m) == SMELT_OK && m == SMELT_NUMA_ISOLATE, "numa isolate");
  CHECK(smelt_numa_parse("none", &m) == SMELT_OK && m == SMELT_NUMA_NONE, "numa none");
  CHECK(smelt_numa_parse("numactl", &m) != SMELT_OK && strstr(smelt_last_error(), "numactl"), "numa numactl accepted");
}

/* the last CPU this process may run on */
static int last_cpu(void) {
  cpu_set_t a;
  if (sched_getaffinity(0, sizeof a, &a)) return 0;
  int last = 0;
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &a)) last = i;
  return last;
}

typedef struct {
  _Atomic int cpu[8];
  _Atomic long sum;
} rec_ctx;
static void rec_job(void *v, int tid, int nth) {
  (void)nth;
  rec_ctx *r = v;
  atomic_store(&r->cpu[tid], sched_getcpu());
  atomic_fetch_add(&r->sum, tid + 1);
}

static void test_plan_and_pool(void) {
  const int cpu = last_cpu();
  char mask[32];
  snprintf(mask, sizeof mask, "%d-%d", cpu, cpu);
  sm_cpu_opts o = {.cpu_mask = mask, .poll = 50};
  int n = 0;
  cpu_set_t *sets = NULL;
  CHECK(sm_cpu_place_plan(&o, &n, &sets) == SMELT_OK && sets, "plan %s: %s", mask, smelt_last_error());
  CHECK(n == 1, "threads from a one-CPU mask: %d", n);
  free(sets);
  n = 3;
  CHECK(sm_cpu_place_plan(&o, &n, &sets) == SMELT_OK && sets && n == 3, "plan 3 threads");
  if (sets) {
    for (int i = 0; i < 3; i++)
      CHECK(CPU_COUNT(&sets[i]) == 1 && CPU_ISSET(cpu, &sets[i]), "thread %d not on CPU %d", i, cpu);
    /* the pool's threads (and the caller, as thread 0) run there */
    for (int poll = 0; poll <= 50; poll += 50) {
      sm_pool *p = sm_pool_create(3, sets, poll);
      CHECK(p && sm_pool_size(p) == 3 && sm_pool_pinned(p), "pool");
      rec_ctx r;
      memset(&r, 0, sizeof r);
      for (int it = 0; it < 300; it++) sm_pool_run(p, rec_job, &r);
      CHECK(atomic_load(&r.sum) == 300 * 6, "poll %d: %ld job calls' sum, expected %d", poll, atomic_load(&r.sum),
            300 * 6);
      for (int i = 0; i < 3; i++)
        CHECK(atomic_load(&r.cpu[i]) == cpu, "poll %d: thread %d ran on CPU %d, pinned to %d", poll, i,
              atomic_load(&r.cpu[i]), cpu);
      sm_pool_destroy(p);
    }
    free(sets);
  }
  /* restore the test thread's affinity (thread 0 was pinned) */
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int i = 0; i <= cpu; i++) CPU_SET(i, &all);
  sched_setaffinity(0, sizeof all, &all);
  /* errors name the option */
  o.cpu_mask = "1000-1000";
  n = 0;
  CHECK(sm_cpu_place_plan(&o, &n, &sets) != SMELT_OK && strstr(smelt_last_error(), "--cpu-mask") &&
          strstr(smelt_last_error(), "1000"),
        "unavailable CPU: '%s'", smelt_last_error());
  o.cpu_mask = "0-";
  CHECK(sm_cpu_place_plan(&o, &n, &sets) != SMELT_OK && strstr(smelt_last_error(), "--cpu-mask 0-"), "bad mask: '%s'",
        smelt_last_error());
  o.cpu_mask = NULL;
  o.poll = 101;
  CHECK(sm_cpu_backend_create_opts(&o) == NULL && strstr(sm_errmsg(), "poll"), "poll 101 accepted");
  /* NUMA modes plan on any machine (one node: every thread on its CPUs) */
  for (int m = SMELT_NUMA_DISTRIBUTE; m <= SMELT_NUMA_ISOLATE; m++) {
    sm_cpu_opts q = {.numa = (smelt_numa)m, .poll = 50, .n_threads = 2};
    n = 2;
    sets = NULL;
    smelt_status st = sm_cpu_place_plan(&q, &n, &sets);
    CHECK(st == SMELT_OK && n == 2, "numa %d: %s", m, smelt_last_error());
    if (sets)
      for (int i = 0; i < n; i++) CHECK(CPU_COUNT(&sets[i]) > 0, "numa %d: thread %d has no CPU", m, i);
    free(sets);
    sm_backend *be = sm_cpu_backend_create_opts(&q);
    CHECK(be && be->n_threads == 2, "backend with numa %d", m);
    if (be) be->destroy(be);
  }
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static void spin_ns(uint64_t ns) {
  const uint64_t t0 = mono_ns();
  while (mono_ns() - t0 < ns) {}
}
/* thread i works (i + 1) * 100 us a run */
static void stair_job(void *ctx, int tid, int nth) {
  (void)ctx;
  (void)nth;
  spin_ns(100000ull * (uint64_t)(tid + 1));
}

/* SMELT_CPU_STATS' numbers: runs counted, the threads' work and the busiest thread's at least what
 * they spent (the bounds are from below: a shared machine only adds time), the caller's time
 * between runs, nothing counted before the statistics are on */
static void test_pool_stats(void) {
  sm_pool *p = sm_pool_create(3, NULL, 50);
  sm_pool_run(p, stair_job, NULL);
  sm_pool_stats_on(p);
  const int runs = 40;
  for (int i = 0; i < runs; i++) {
    sm_pool_run(p, stair_job, NULL);
    spin_ns(150000);
  }
  sm_pool_stats s;
  sm_pool_stats_get(p, &s);
  CHECK(s.runs == (uint64_t)runs && s.threads == 3, "stats: %llu runs of %d threads", (unsigned long long)s.runs,
        s.threads);
  CHECK(s.busy_ns >= (uint64_t)runs * 600000ull, "stats: threads busy %llu ns, at least %llu expected",
        (unsigned long long)s.busy_ns, (unsigned long long)runs * 600000ull);
  CHECK(s.busy_max_ns >= (uint64_t)runs * 300000ull && s.wall_ns >= s.busy_max_ns,
        "stats: busiest thread %llu ns, wall %llu ns", (unsigned long long)s.busy_max_ns,
        (unsigned long long)s.wall_ns);
  CHECK(s.gap_ns >= (uint64_t)(runs - 1) * 150000ull, "stats: %llu ns between runs", (unsigned long long)s.gap_ns);
  sm_pool_destroy(p);
}

int main(void) {
  test_parse();
  test_plan_and_pool();
  test_pool_stats();
  printf(g_fail ? "%d FAILURES\n" : "all passed\n", g_fail);
  return g_fail != 0;
}
