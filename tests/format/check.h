/* minimal test helpers for tests/format and tests/fuzz */
#ifndef SM_TEST_CHECK_H
#define SM_TEST_CHECK_H
#include <stdio.h>
#include <string.h>
#include <math.h>
static int g_fail, g_checks;
#define CHECK(c) \
  do { \
    g_checks++; \
    if (!(c)) { \
      g_fail++; \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
    } \
  } while (0)
#define CHECK_EQ_I(a, b) \
  do { \
    long long a_ = (long long)(a), b_ = (long long)(b); \
    g_checks++; \
    if (a_ != b_) { \
      g_fail++; \
      fprintf(stderr, "%s:%d: %s == %lld, expected %lld\n", __FILE__, __LINE__, #a, a_, b_); \
    } \
  } while (0)
#define CHECK_EQ_F(a, b) \
  do { \
    double a_ = (a), b_ = (b); \
    g_checks++; \
    if (fabs(a_ - b_) > 1e-6 * fabs(b_) + 1e-12) { \
      g_fail++; \
      fprintf(stderr, "%s:%d: %s == %g, expected %g\n", __FILE__, __LINE__, #a, a_, b_); \
    } \
  } while (0)
#define CHECK_STR(a, b) \
  do { \
    const char *a_ = (a), *b_ = (b); \
    g_checks++; \
    if (!a_ || strcmp(a_, b_)) { \
      g_fail++; \
      fprintf(stderr, "%s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #a, a_ ? a_ : "(null)", b_); \
    } \
  } while (0)
#define TEST_DONE() (fprintf(stderr, "%d checks, %d failed\n", g_checks, g_fail), g_fail ? 1 : 0)
#endif
