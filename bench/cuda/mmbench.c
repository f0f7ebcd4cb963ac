/* Batched 4-bit matmul microbenchmark on the CUDA backend: microseconds a call for the 1B / 8B layer
 * shapes at several token counts, with the tuning of the environment (SMELT_CUDA_QMMA=0: the
 * dequantize + cuBLAS path). usage: cuda_mmbench [N,N,...] [MxK,MxK,...] (the second list: only those
 * shapes; not a test; bench/cuda/device_run.sh mm) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/backend.h"
#include "base/base.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int ns[16] = {17, 32, 64, 128, 256, 512}, nn = 6;
  if (argc > 1) {
    nn = 0;
    for (char *p = strtok(argv[1], ","); p && nn < 16; p = strtok(NULL, ",")) ns[nn++] = atoi(p);
  }
  sm_backend *G = sm_cuda_backend_create(0);
  if (!G) {
    printf("SKIP: no usable CUDA device (%s)\n", smelt_last_error());
    return 77;
  }
  long shapes[16][2] = {{2048, 2048},  {8192, 2048},  {2048, 8192},  {4096, 4096},
                        {14336, 4096}, {4096, 14336}, {128256, 2048}};
  size_t nsh = 7;
  if (argc > 2) {
    nsh = 0;
    for (char *p = strtok(argv[2], ","); p && nsh < 16; p = strtok(NULL, ","))
      if (sscanf(p, "%ldx%ld", &shapes[nsh][0], &shapes[nsh][1]) == 2 && shapes[nsh][0] > 0 && shapes[nsh][1] > 0)
        nsh++;
      else {
        printf("bad shape '%s' (expected MxK)\n", p);
        return 2;
      }
  }
  srand(1);
  printf("%-14s", "M x K");
  for (int i = 0; i < nn; i++) printf(" %9d", ns[i]);
  printf("   (us a call; TFLOP/s at the largest n)\n");
  for (size_t si = 0; si < nsh; si++) {
    const long M = shapes[si][0], K = shapes[si][1], gs = 64;
    sm_weight w;
    memset(&w, 0, sizeof w);
    w.rows = M;
    w.cols = K;
    w.bits = 4;
    w.group_size = (int)gs;
    w.dtype = SM_DT_BF16;
    const size_t nb = (size_t)M * K / 2, ng = (size_t)M * (K / gs);
    uint8_t *d = malloc(nb);
    uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
    for (size_t i = 0; i < nb; i++) d[i] = (uint8_t)rand();
    for (size_t i = 0; i < ng; i++) {
      s[i] = 0x3c00 - 0x0a00;
      b[i] = 0xbc00 - 0x0800;
    } /* ~0.0078, ~-0.5 bf16-ish */
    w.data = d;
    w.scales = s;
    w.biases = b;
    if (G->prepare_weight(G, &w) != SMELT_OK) {
      printf("prepare: %s\n", smelt_last_error());
      return 1;
    }
    const int nmax = ns[nn - 1];
    float *x = G->alloc(G, (size_t)nmax * K * 4), *y = G->alloc(G, (size_t)nmax * M * 4);
    float *hx = malloc((size_t)nmax * K * 4);
    for (size_t i = 0; i < (size_t)nmax * K; i++) hx[i] = (float)rand() / RAND_MAX - 0.5f;
    G->upload(G, x, hx, (size_t)nmax * K * 4);
    printf("%6ld x %-6ld", M, K);
    double last = 0;
    for (int i = 0; i < nn; i++) {
      for (int r = 0; r < 3; r++) G->matmul(G, SM_MM_OTHER, &w, x, ns[i], y);
      G->sync(G);
      const int reps = 20;
      const double t0 = now();
      for (int r = 0; r < reps; r++) G->matmul(G, SM_MM_OTHER, &w, x, ns[i], y);
      G->sync(G);
      last = (now() - t0) / reps;
      printf(" %9.1f", last * 1e6);
    }
    printf("   %.1f\n", 2.0 * M * K * ns[nn - 1] / last / 1e12);
    G->free(G, x);
    G->free(G, y);
    G->release_weight(G, &w);
    free(d);
    free(s);
    free(b);
    free(hx);
  }
  G->destroy(G);
  return 0;
}
