/* Read-bandwidth probe of the CPU backend (sm_backend.measure_bandwidth): the ceiling of the
 * decode roofline. Every thread of the backend's own pool (so the same threads, count and
 * placement as the kernels) first touches, then reads, its contiguous slice of one buffer well
 * past the caches (4x the last-level caches of the machine, at least 1 GiB, at most half the
 * available memory; on huge pages when the packed weights are), with the widest loads of the backend's kernel set, without and with software
 * prefetch; the best of a few passes counts. Hand-written because it has to run on the backend's pool: a benchmark library
 * (STREAM and the like) would bring its own threads and placement. */
#include "backend/cpu/cpu_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define PASSES 6 /* alternately without and with software prefetch */
#define MIN_BYTES ((size_t)64 << 20)

/* Sum of the last-level cache sizes of all cache instances (sysfs), else sysconf's L3 size. */
static size_t llc_bytes(void) {
  long ncpu = sysconf(_SC_NPROCESSORS_CONF);
  size_t total = 0;
  char seen[64][128];
  int n_seen = 0;
  for (long cpu = 0; cpu < ncpu && cpu < 4096; cpu++) {
    /* the highest cache level of this cpu */
    int best_level = 0;
    size_t best_size = 0;
    char best_shared[128] = "";
    for (int idx = 0; idx < 8; idx++) {
      char path[128], buf[128];
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/level", cpu, idx);
      FILE *f = fopen(path, "r");
      if (!f) break;
      int level = 0;
      if (fscanf(f, "%d", &level) != 1) level = 0;
      fclose(f);
      if (level < best_level) continue;
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/size", cpu, idx);
      if (!(f = fopen(path, "r"))) continue;
      unsigned long kb = 0;
      char unit = 'K';
      if (fscanf(f, "%lu%c", &kb, &unit) < 1) kb = 0;
      fclose(f);
      size_t size = (size_t)kb * (unit == 'M' ? 1048576 : unit == 'G' ? 1073741824 : 1024);
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/shared_cpu_list", cpu, idx);
      buf[0] = 0;
      if ((f = fopen(path, "r"))) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
      }
      best_level = level;
      best_size = size;
      snprintf(best_shared, sizeof best_shared, "%s", buf);
    }
    if (!best_size) continue;
    bool dup = false;
    for (int i = 0; i < n_seen && !dup; i++) dup = !strcmp(seen[i], best_shared);
    if (dup) continue;
    if (n_seen < 64) snprintf(seen[n_seen++], sizeof seen[0], "%s", best_shared);
    total += best_size;
  }
  if (!total) {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    total = l3 > 0 ? (size_t)l3 : (size_t)64 << 20;
  }
  return total;
}

/* MemAvailable (bytes), else free pages; 0 if unknown */
static size_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  size_t kb = 0;
  if (f) {
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
  }
  if (kb) return kb * 1024;
  long pages = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
  return pages > 0 && ps > 0 ? (size_t)pages * (size_t)ps : 0;
}

/* ---- read loops: 256 bytes an iteration, four independent accumulators; with pf, a software
 * prefetch PF_DIST ahead into L2 as well (as the matvec kernels do: on some CPUs one thread
 * reads faster with it, on others without, and the probe keeps the better of both) ---- */
#define PF_DIST 4096
static uint64_t sum_u64(const uint8_t *p, size_t n, bool pf) {
  const uint64_t *q = (const uint64_t *)p;
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i < n / 8; i += 32) {
    if (pf)
      for (int j = 0; j < 256; j += 64) __builtin_prefetch((const char *)(q + i) + PF_DIST + j, 0, 2);
    for (int j = 0; j < 32; j += 4) {
      a += q[i + j];
      b += q[i + j + 1];
      c += q[i + j + 2];
      d += q[i + j + 3];
    }
  }
  return a ^ b ^ c ^ d;
}
#if defined(__x86_64__)
#define PF4(p) \
  do { \
    _mm_prefetch((const char *)(p) + PF_DIST, _MM_HINT_T1); \
    _mm_prefetch((const char *)(p) + PF_DIST + 64, _MM_HINT_T1); \
    _mm_prefetch((const char *)(p) + PF_DIST + 128, _MM_HINT_T1); \
    _mm_prefetch((const char *)(p) + PF_DIST + 192, _MM_HINT_T1); \
  } while (0)
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t n, bool pf) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 256) {
    if (pf) PF4(p + i);
    a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i + 128)));
    b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 160)));
    c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 192)));
    d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 224)));
  }
  a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  uint64_t t[4];
  _mm256_storeu_si256((__m256i *)t, a);
  return t[0] ^ t[1] ^ t[2] ^ t[3];
}
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint8_t *p, size_t n, bool pf) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 256) {
    if (pf) PF4(p + i);
    a = _mm512_add_epi64(a, _mm512_load_si512((const void *)(p + i)));
    b = _mm512_add_epi64(b, _mm512_load_si512((const void *)(p + i + 64)));
    c = _mm512_add_epi64(c, _mm512_load_si512((const void *)(p + i + 128)));
    d = _mm512_add_epi64(d, _mm512_load_si512((const void *)(p + i + 192)));
  }
  a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
  uint64_t t[8];
  _mm512_storeu_si512((void *)t, a);
  return t[0] ^ t[1] ^ t[2] ^ t[3] ^ t[4] ^ t[5] ^ t[6] ^ t[7];
}
#endif

typedef struct {
  uint8_t *buf;
  size_t slice; /* bytes per thread, a multiple of 4096 */
  bool touch;   /* first pass: write the slice (first touch places its pages near the thread) */
  bool pf;      /* read with software prefetch */
  uint64_t (*sum)(const uint8_t *p, size_t n, bool pf);
  volatile uint64_t sink[256];
} bw_ctx;

static void bw_job(void *v, int tid, int nth) {
  bw_ctx *c = v;
  uint8_t *p = c->buf + (size_t)tid * c->slice;
  if (c->touch) memset(p, tid + 1, c->slice);
  else c->sink[tid] = c->sum(p, c->slice, c->pf);
}

double sm_cpu_read_bandwidth(sm_pool *pool, const sm_cpu_kern *k, bool huge_pages) {
  const int nth = sm_pool_size(pool);
  size_t bytes = 4 * llc_bytes();
  if (bytes < ((size_t)1 << 30)) bytes = (size_t)1 << 30;
  const size_t avail = mem_available();
  if (avail && bytes > avail / 2) bytes = avail / 2;
  if (bytes < MIN_BYTES) bytes = MIN_BYTES;
  bw_ctx c = {.sum = sum_u64};
#if defined(__x86_64__)
  if (!strcmp(k->name, "avx512")) c.sum = sum_avx512;
  else if (!strcmp(k->name, "avx2")) c.sum = sum_avx2;
#endif
  c.slice = bytes / (size_t)nth / 4096 * 4096;
  /* + PF_DIST: the last thread's prefetches stay inside the buffer */
  /* on huge pages when the packed weights are (pack.c) */
  c.buf = sm_cpu_alloc_huge(c.slice * (size_t)nth + PF_DIST, huge_pages);
  if (!c.buf) return 0;
  c.touch = true;
  sm_pool_run(pool, bw_job, &c);
  c.touch = false;
  double best = 0;
  for (int pass = 0; pass < PASSES; pass++) {
    c.pf = pass % 2;
    double t0 = sm_now();
    sm_pool_run(pool, bw_job, &c);
    double dt = sm_now() - t0;
    if (dt > 0 && (double)(c.slice * (size_t)nth) / dt > best) best = (double)(c.slice * (size_t)nth) / dt;
  }
  free(c.buf);
  return best;
}
