/* Image-encoding benchmark: the time a model's vision tower takes to encode one image (preprocessing
 * on the CPU, then the tower and projector on the model's backend), over distinct encodes (the cache
 * of encoded images is cleared before each).
 * usage: bench_vision MODEL_DIR [WIDTH HEIGHT [N [cpu|cuda]]]   (default 1024 768, 16 images, auto device)
 * The image is random pixels of the given size; bench/vision/make_synth.py makes random-weight
 * checkpoints of real tower shapes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/model.h"
#include "vision/vision.h"
#include "vision/vit.h"

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_vision MODEL_DIR [WIDTH HEIGHT [N [cpu|cuda]]]\n");
    return 2;
  }
  const int W = argc > 3 ? atoi(argv[2]) : 1024, H = argc > 3 ? atoi(argv[3]) : 768;
  const int N = argc > 4 ? atoi(argv[4]) : 16;
  if (W < 1 || H < 1 || W > 8192 || H > 8192 || N < 1 || N > 1000) {
    fprintf(stderr, "bench_vision: bad size %dx%d or count %d\n", W, H, N);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  if (argc > 5) {
    if (!strcmp(argv[5], "cuda")) mp.device = SMELT_DEVICE_CUDA;
    else if (!strcmp(argv[5], "cpu")) mp.device = SMELT_DEVICE_CPU;
    else {
      fprintf(stderr, "bench_vision: unknown device '%s' (cpu, cuda)\n", argv[5]);
      return 2;
    }
  }
  smelt_model *m = NULL;
  double t0 = sm_now();
  if (smelt_model_load(argv[1], &mp, &m)) {
    fprintf(stderr, "bench_vision: %s\n", smelt_last_error());
    return 1;
  }
  if (!m->vision) {
    fprintf(stderr, "bench_vision: %s has no vision tower (%s)\n", argv[1], m->note);
    smelt_model_free(m);
    return 1;
  }
  printf("%s, %.0f MB of tower weights, loaded in %.1f s on %s\n", sm_vision_describe(m->vision),
         sm_vision_weight_bytes(m->vision) / 1e6, sm_now() - t0, m->be->name);
  sm_image im = {.w = W, .h = H, .rgb = malloc((size_t)W * H * 3)};
  uint32_t x = 12345;
  for (size_t i = 0; i < (size_t)W * H * 3; i++) {
    x = x * 1664525u + 1013904223u;
    im.rgb[i] = (uint8_t)(x >> 24);
  }
  double *pre = malloc(sizeof(double) * (size_t)(N + 1)), *enc = malloc(sizeof(double) * (size_t)(N + 1));
  int rc = 0, n_embd = 0, gh = 0, gw = 0;
  for (int i = 0; i <= N; i++) { /* i == 0: warm-up */
    sm_vimage *vi = NULL;
    double a = sm_now();
    if (sm_vimage_new(m->vision, &im, &vi)) {
      fprintf(stderr, "bench_vision: preprocess: %s\n", smelt_last_error());
      rc = 1;
      break;
    }
    double b = sm_now();
    sm_vit_cache_clear(m->vision);
    if (sm_vision_encode(m->vision, vi)) {
      fprintf(stderr, "bench_vision: encode: %s\n", smelt_last_error());
      sm_vimage_unref(vi);
      rc = 1;
      break;
    }
    double c = sm_now();
    pre[i] = b - a;
    enc[i] = c - b;
    n_embd = vi->n_embd, gh = vi->gh, gw = vi->gw;
    sm_vimage_unref(vi);
  }
  if (!rc) {
    double tot = 0;
    for (int i = 1; i <= N; i++) tot += enc[i];
    qsort(pre + 1, (size_t)N, sizeof(double), cmp_d);
    qsort(enc + 1, (size_t)N, sizeof(double), cmp_d);
    printf("image %dx%d -> %d x %d patches, %d tokens: preprocess %.1f ms, encode median %.1f ms (min %.1f, "
           "max %.1f), first %.1f ms; %d images one after another: %.2f images/s\n",
           W, H, gh, gw, n_embd, pre[1 + N / 2] * 1e3, enc[1 + N / 2] * 1e3, enc[1] * 1e3, enc[N] * 1e3, enc[0] * 1e3,
           N, N / tot);
  }
  free(pre);
  free(enc);
  sm_image_free(&im);
  smelt_model_free(m);
  return rc;
}
