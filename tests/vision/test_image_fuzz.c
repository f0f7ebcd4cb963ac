/* Mutated images through the decoders (PNG, JPEG, WebP): flipped bytes, truncations, spliced
 * headers and zeroed runs of the test images must give an image within the limits or an error with a
 * message, never a crash (ctest runs this under ASan/UBSan in CI: scripts/test.sh).
 * Usage: test_image_fuzz DATA_DIR [iterations] */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"
#include "vision/image.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dULL;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

static void one(const uint8_t *d, size_t n, const sm_image_limits *lim) {
  sm_image im;
  smelt_status st = sm_image_decode(d, n, lim, &im);
  if (st == SMELT_OK) {
    CHECK(im.rgb && im.w > 0 && im.h > 0 && im.w <= lim->max_side && im.h <= lim->max_side &&
            (long)im.w * im.h <= lim->max_pixels,
          "accepted image %dx%d outside the limits", im.w, im.h);
    volatile unsigned s = im.rgb[0] + im.rgb[(size_t)im.w * im.h * 3 - 1]; /* ASan checks the ends */
    (void)s;
    sm_image_free(&im);
  } else {
    CHECK(sm_errmsg()[0] != 0 && im.rgb == NULL, "an error without a message (status %d)", st);
  }
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "tests/vision/data";
  const int iters = argc > 2 ? atoi(argv[2]) : 3000;
  char p[1200];
  snprintf(p, sizeof p, "%.1000s/images", dir);
  DIR *dd = opendir(p);
  if (!dd) {
    fprintf(stderr, "no images at %s\n", p);
    return 1;
  }
  uint8_t *files[64];
  size_t lens[64];
  int nf = 0;
  struct dirent *de;
  while ((de = readdir(dd)) && nf < 64) {
    if (de->d_name[0] == '.') continue;
    char f[2400];
    snprintf(f, sizeof f, "%.1100s/%.1000s", p, de->d_name);
    char *d = NULL;
    if (sm_read_file(f, &d, &lens[nf]) == SMELT_OK) files[nf++] = (uint8_t *)d;
  }
  closedir(dd);
  CHECK(nf >= 10, "%d test images", nf);
  const sm_image_limits lim = {512, 100000};
  for (int i = 0; i < nf; i++) one(files[i], lens[i], &lim); /* the originals */
  for (int it = 0; it < iters; it++) {
    const int k = (int)(rnd() % (uint64_t)nf);
    size_t n = lens[k];
    uint8_t *m = malloc(n + 64);
    memcpy(m, files[k], n);
    switch (rnd() % 5) {
      case 0: /* a few flipped bytes */
        for (int j = 0, c = 1 + (int)(rnd() % 8); j < c; j++) m[rnd() % n] ^= (uint8_t)(1 + rnd() % 255);
        break;
      case 1: /* truncated */ n = 1 + rnd() % n; break;
      case 2: /* a run of zeros or 0xff */
      {
        const size_t at = rnd() % n, len = SM_MIN(n - at, 1 + rnd() % 64);
        memset(m + at, rnd() & 1 ? 0xff : 0, len);
        break;
      }
      case 3: /* header bytes (sizes, depths, chunk lengths) */
        for (int j = 0; j < 4; j++) m[8 + rnd() % SM_MIN(n - 8, 48)] = (uint8_t)rnd();
        break;
      default: /* the tail of another image spliced in */
      {
        const int o = (int)(rnd() % (uint64_t)nf);
        const size_t cut = rnd() % n, take = SM_MIN(lens[o], 64 + cut) - SM_MIN(lens[o], cut);
        n = cut + take;
        m = realloc(m, n + 64);
        memcpy(m + cut, files[o] + SM_MIN(lens[o], cut), take);
        break;
      }
    }
    one(m, n, &lim);
    free(m);
  }
  for (int i = 0; i < nf; i++) free(files[i]);
  TEST_END();
}
