/* Image resampling exactly as Pillow's Image.resize does it for an 8-bit RGB image
 * (libImaging/Resample.c): per output pixel a filter window over the input, its weights computed in
 * double precision, normalised, and rounded to 22-bit fixed point; a horizontal pass, then a
 * vertical pass over the horizontally resampled rows, each rounding and clipping to 8 bits. The
 * Hugging Face image processors resize with Pillow, so this is written out (no library computes the
 * same bytes) to make the pixel values equal theirs. */
/* integer sums: vectorizing them changes no result, and GCC's -O2 cost model would not */
#pragma GCC optimize("vect-cost-model=dynamic")
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "vision/image.h"

#define PRECISION_BITS (32 - 8 - 2)

static double box_filter(double x) { return x > -0.5 && x <= 0.5 ? 1.0 : 0.0; }
static double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}
static double hamming_filter(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x = x * M_PI;
  return sin(x) / x * (0.54f + 0.46f * cos(x));
}
static double bicubic_filter(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}
static double sinc_filter(double x) {
  if (x == 0.0) return 1.0;
  x = x * M_PI;
  return sin(x) / x;
}
static double lanczos_filter(double x) { return -3.0 <= x && x < 3.0 ? sinc_filter(x) * sinc_filter(x / 3) : 0.0; }

typedef struct {
  double (*f)(double);
  double support;
} filter;

/* Pillow's precompute_coeffs (box [0, in_size)) followed by normalize_coeffs_8bpc: for output i,
 * bounds[2i] is the first input index and bounds[2i+1] the count; kk[i*ksize + j] its weights */
static int coeffs(int in_size, int out_size, const filter *fl, int **bounds_out, int32_t **kk_out) {
  const double scale = (double)in_size / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = fl->support * filterscale;
  const int ksize = (int)ceil(support) * 2 + 1;
  double *kk = malloc(sizeof(double) * (size_t)out_size * ksize);
  int *bounds = malloc(sizeof(int) * (size_t)out_size * 2);
  int32_t *ik = malloc(sizeof(int32_t) * (size_t)out_size * ksize);
  if (!kk || !bounds || !ik) {
    free(kk);
    free(bounds);
    free(ik);
    return -1;
  }
  for (int xx = 0; xx < out_size; xx++) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    double ww = 0.0;
    int xmin = (int)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = (int)(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double *k = kk + (size_t)xx * ksize;
    int x;
    for (x = 0; x < xmax; x++) {
      const double w = fl->f((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (x = 0; x < xmax; x++)
      if (ww != 0.0) k[x] /= ww;
    for (; x < ksize; x++) k[x] = 0;
    bounds[xx * 2] = xmin;
    bounds[xx * 2 + 1] = xmax;
  }
  for (size_t i = 0; i < (size_t)out_size * ksize; i++)
    ik[i] = kk[i] < 0 ? (int32_t)(-0.5 + kk[i] * (1 << PRECISION_BITS))
                      : (int32_t)(0.5 + kk[i] * (1 << PRECISION_BITS));
  free(kk);
  *bounds_out = bounds;
  *kk_out = ik;
  return ksize;
}

static inline uint8_t clip8(int32_t v) {
  const int32_t s = v >> PRECISION_BITS; /* arithmetic: floor */
  return (uint8_t)(s < 0 ? 0 : s > 255 ? 255 : s);
}

/* the horizontal pass of an RGB image: each output pixel a run of consecutive input pixels */
static void pass_h(const uint8_t *in, int iw, int ih, uint8_t *out, int ow, int ksize, const int *bounds,
                   const int32_t *kk) {
  for (int y = 0; y < ih; y++) {
    const uint8_t *row = in + (size_t)y * iw * 3;
    uint8_t *o = out + (size_t)y * ow * 3;
    for (int x = 0; x < ow; x++) {
      const int lo = bounds[2 * x], n = bounds[2 * x + 1];
      const int32_t *k = kk + (size_t)x * ksize;
      const uint8_t *p = row + (size_t)lo * 3;
      int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
      for (int j = 0; j < n; j++) {
        s0 += p[3 * j] * k[j];
        s1 += p[3 * j + 1] * k[j];
        s2 += p[3 * j + 2] * k[j];
      }
      o[3 * x] = clip8(s0);
      o[3 * x + 1] = clip8(s1);
      o[3 * x + 2] = clip8(s2);
    }
  }
}

/* the vertical pass: each output row a weighted sum of whole input rows, accumulated a row at a time
 * (the same integer sums in the same order as Pillow's per-pixel loop, with contiguous reads) */
static bool pass_v(const uint8_t *in, int w, uint8_t *out, int oh, int ksize, const int *bounds, const int32_t *kk) {
  const size_t n3 = (size_t)w * 3;
  int32_t *acc = malloc(sizeof(int32_t) * n3);
  if (!acc) return false;
  for (int y = 0; y < oh; y++) {
    const int lo = bounds[2 * y], n = bounds[2 * y + 1];
    const int32_t *k = kk + (size_t)y * ksize;
    for (size_t i = 0; i < n3; i++) acc[i] = 1 << (PRECISION_BITS - 1);
    for (int j = 0; j < n; j++) {
      const uint8_t *r = in + (size_t)(lo + j) * n3;
      const int32_t kj = k[j];
      for (size_t i = 0; i < n3; i++) acc[i] += r[i] * kj;
    }
    uint8_t *o = out + (size_t)y * n3;
    for (size_t i = 0; i < n3; i++) o[i] = clip8(acc[i]);
  }
  free(acc);
  return true;
}

smelt_status sm_image_resize(const sm_image *src, int w, int h, sm_resample fk, sm_image *dst) {
  memset(dst, 0, sizeof *dst);
  if (w <= 0 || h <= 0 || w > SM_IMAGE_MAX_SIDE * 4 || h > SM_IMAGE_MAX_SIDE * 4)
    return sm_err(SMELT_ERR_INVALID, "resize to %dx%d pixels", w, h);
  filter fl;
  switch (fk) {
    case SM_RESAMPLE_BOX: fl = (filter){box_filter, 0.5}; break;
    case SM_RESAMPLE_BILINEAR: fl = (filter){bilinear_filter, 1.0}; break;
    case SM_RESAMPLE_HAMMING: fl = (filter){hamming_filter, 1.0}; break;
    case SM_RESAMPLE_BICUBIC: fl = (filter){bicubic_filter, 2.0}; break;
    case SM_RESAMPLE_LANCZOS: fl = (filter){lanczos_filter, 3.0}; break;
    default: return sm_err(SMELT_ERR_UNSUPPORTED, "image resampling filter %d is not supported", (int)fk);
  }
  const size_t bytes = (size_t)w * h * 3;
  uint8_t *out = malloc(bytes);
  if (!out) return sm_err(SMELT_ERR_OOM, "resized image of %dx%d pixels", w, h);
  if (w == src->w && h == src->h) { /* Image.resize returns a copy */
    memcpy(out, src->rgb, bytes);
    *dst = (sm_image){w, h, out};
    return SMELT_OK;
  }
  const uint8_t *cur = src->rgb;
  uint8_t *tmp = NULL;
  int cw = src->w;
  if (w != src->w) {
    int *bounds;
    int32_t *kk;
    const int ks = coeffs(src->w, w, &fl, &bounds, &kk);
    tmp = h != src->h ? malloc((size_t)w * src->h * 3) : out;
    if (ks < 0 || !tmp) {
      if (ks >= 0) {
        free(bounds);
        free(kk);
      }
      free(out);
      return sm_err(SMELT_ERR_OOM, "resize to %dx%d pixels", w, h);
    }
    pass_h(src->rgb, src->w, src->h, tmp, w, ks, bounds, kk);
    free(bounds);
    free(kk);
    cur = tmp;
    cw = w;
  }
  if (h != src->h) {
    int *bounds;
    int32_t *kk;
    const int ks = coeffs(src->h, h, &fl, &bounds, &kk);
    if (ks < 0) {
      if (tmp != out) free(tmp);
      free(out);
      return sm_err(SMELT_ERR_OOM, "resize to %dx%d pixels", w, h);
    }
    const bool ok = pass_v(cur, cw, out, h, ks, bounds, kk);
    free(bounds);
    free(kk);
    if (tmp && tmp != out) free(tmp);
    if (!ok) {
      free(out);
      return sm_err(SMELT_ERR_OOM, "resize to %dx%d pixels", w, h);
    }
  }
  *dst = (sm_image){w, h, out};
  return SMELT_OK;
}
