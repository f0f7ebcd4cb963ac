/* The backend a sample-op test runs on (shared by test_sample_op.c and test_sample_mask.c): argv[1]
 * "cpu" (default, two threads) or "cuda"; without CUDA in the build or without a usable GPU the
 * process exits 77, which ctest reports as skipped. */
#ifndef SM_TEST_SAMPLE_BACKEND_H
#define SM_TEST_SAMPLE_BACKEND_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"

static sm_backend *sample_backend(int argc, char **argv, bool *cuda) {
  *cuda = argc > 1 && !strcmp(argv[1], "cuda");
  if (!*cuda) return sm_cpu_backend_create(2);
#ifndef SMELT_HAVE_CUDA
  printf("built without CUDA: skipped\n");
  exit(77);
#else
  sm_backend *b = sm_cuda_backend_create(0);
  if (!b) {
    printf("skipped: %s\n", smelt_last_error());
    exit(77);
  }
  return b;
#endif
}
#endif
