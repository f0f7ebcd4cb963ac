/* Minimal test helpers: CHECK records failures; TEST_END prints "N passed, N failed". */
#ifndef SM_TEST_UTIL_H
#define SM_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int t_pass __attribute__((unused)), t_fail __attribute__((unused));
#define CHECK(cond, ...) \
  do { \
    if (cond) t_pass++; \
    else { \
      t_fail++; \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__); \
      fprintf(stderr, "\n"); \
    } \
  } while (0)
#define TEST_END() \
  do { \
    printf("%d passed, %d failed\n", t_pass, t_fail); \
    return t_fail ? 1 : 0; \
  } while (0)

/* xorshift64 pseudo-random numbers for tests that make their own inputs (*s: the state, never 0) */
static inline uint64_t t_xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* max |a-b| / max(max|b|, floor) */
static inline double t_max_rel(const float *a, const float *b, size_t n, double floor_) {
  double md = 0, mb = floor_;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > md || d != d) md = d != d ? INFINITY : d;
    if (fabs(b[i]) > mb) mb = fabs(b[i]);
  }
  return md / mb;
}
#endif
