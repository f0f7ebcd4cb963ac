/* Image processors (preprocess.h): target sizes and pixel values as the Hugging Face image
 * processors compute them (Python's round() is round-half-even: nearbyint in the default rounding
 * mode). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "vision/preprocess.h"

static const float clip_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
static const float clip_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};

void sm_imgproc_defaults(sm_imgproc_kind kind, sm_imgproc *p) {
  memset(p, 0, sizeof *p);
  p->kind = kind;
  p->do_resize = p->do_rescale = p->do_normalize = true;
  p->rescale_factor = 1.0 / 255.0;
  for (int c = 0; c < 3; c++) {
    p->mean[c] = kind == SM_IMGPROC_FIXED ? 0.5f : clip_mean[c];
    p->std[c] = kind == SM_IMGPROC_FIXED ? 0.5f : clip_std[c];
  }
  switch (kind) {
    case SM_IMGPROC_QWEN:
      p->resample = SM_RESAMPLE_BICUBIC;
      p->patch = 14;
      p->merge = 2;
      p->temporal = 2;
      p->min_pixels = 56 * 56;
      p->max_pixels = 28 * 28 * 1280;
      break;
    case SM_IMGPROC_FIXED:
      p->resample = SM_RESAMPLE_BILINEAR;
      p->height = p->width = 896;
      /* Gemma3Processor's defaults for the pan-and-scan options (off unless the config turns it on) */
      p->pas_min_crop = 256;
      p->pas_max_crops = 4;
      p->pas_min_ratio = 1.2;
      break;
    case SM_IMGPROC_PIXTRAL:
      p->resample = SM_RESAMPLE_BICUBIC;
      p->patch = 16;
      p->longest_edge = 1024;
      break;
    case SM_IMGPROC_IDEFICS3: /* IDEFICS_STANDARD mean and std: 0.5 */
      for (int c = 0; c < 3; c++) p->mean[c] = p->std[c] = 0.5f;
      p->resample = SM_RESAMPLE_LANCZOS;
      p->longest_edge = 4 * 364;
      p->tile = 364;
      p->splitting = true;
      break;
  }
}

static smelt_status num(const cJSON *o, const char *key, double lo, double hi, double *out, bool *found) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  *found = false;
  if (!v || cJSON_IsNull(v)) return SMELT_OK;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
    return sm_err(SMELT_ERR_FORMAT, "image processor config: \"%s\" must be a number in [%g, %g]", key, lo, hi);
  *out = v->valuedouble;
  *found = true;
  return SMELT_OK;
}

static smelt_status flag(const cJSON *o, const char *key, bool *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v || cJSON_IsNull(v)) return SMELT_OK;
  if (!cJSON_IsBool(v)) return sm_err(SMELT_ERR_FORMAT, "image processor config: \"%s\" must be true or false", key);
  *out = cJSON_IsTrue(v);
  return SMELT_OK;
}

static smelt_status triple(const cJSON *o, const char *key, float lo, float out[3]) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v || cJSON_IsNull(v)) return SMELT_OK;
  if (cJSON_IsNumber(v)) { /* one value for all channels */
    if (!(v->valuedouble > lo) || !isfinite(v->valuedouble)) goto bad;
    out[0] = out[1] = out[2] = (float)v->valuedouble;
    return SMELT_OK;
  }
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 3) goto bad;
  for (int c = 0; c < 3; c++) {
    const cJSON *e = cJSON_GetArrayItem(v, c);
    if (!cJSON_IsNumber(e) || !(e->valuedouble > lo) || !isfinite(e->valuedouble)) goto bad;
    out[c] = (float)e->valuedouble;
  }
  return SMELT_OK;
bad:
  return sm_err(SMELT_ERR_FORMAT, "image processor config: \"%s\" must be a list of 3 numbers%s", key,
                lo > -1e30f ? " above 0" : "");
}

/* patch_size as a number or {"height": h, "width": w} (square only) */
static smelt_status patch_size(const cJSON *o, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "patch_size");
  if (!v || cJSON_IsNull(v)) return SMELT_OK;
  if (cJSON_IsObject(v)) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(v, "height"), *pw = cJSON_GetObjectItemCaseSensitive(v, "width");
    if (!cJSON_IsNumber(ph) || !cJSON_IsNumber(pw) || ph->valueint != pw->valueint)
      return sm_err(SMELT_ERR_FORMAT, "image processor config: \"patch_size\" must be square");
    v = ph;
  }
  if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1024 || v->valuedouble != (int)v->valuedouble)
    return sm_err(SMELT_ERR_FORMAT, "image processor config: \"patch_size\" must be an integer in [1, 1024]");
  *out = v->valueint;
  return SMELT_OK;
}

static smelt_status parse_one(const cJSON *o, sm_imgproc *p) {
  smelt_status st;
  bool f;
  double d;
  if ((st = flag(o, "do_resize", &p->do_resize)) || (st = flag(o, "do_rescale", &p->do_rescale)) ||
      (st = flag(o, "do_normalize", &p->do_normalize)))
    return st;
  if ((st = num(o, "rescale_factor", 1e-9, 1e9, &p->rescale_factor, &f))) return st;
  if ((st = triple(o, "image_mean", -1e30f, p->mean)) || (st = triple(o, "image_std", 0.0f, p->std))) return st;
  if ((st = num(o, "resample", 0, 5, &d, &f))) return st;
  if (f) p->resample = (sm_resample)(int)d;
  const cJSON *size = cJSON_GetObjectItemCaseSensitive(o, "size");
  if (size && !cJSON_IsNull(size) && !cJSON_IsObject(size))
    return sm_err(SMELT_ERR_FORMAT, "image processor config: \"size\" must be an object");
  switch (p->kind) {
    case SM_IMGPROC_QWEN: {
      if ((st = patch_size(o, &p->patch))) return st;
      if ((st = num(o, "merge_size", 1, 64, &d, &f))) return st;
      if (f) p->merge = (int)d;
      if ((st = num(o, "temporal_patch_size", 1, 64, &d, &f))) return st;
      if (f) p->temporal = (int)d;
      /* size {shortest_edge, longest_edge} are pixel counts here; min_pixels / max_pixels win */
      if (size && (st = num(size, "shortest_edge", 1, 1e12, &d, &f))) return st;
      if (size && f) p->min_pixels = (long)d;
      if (size && (st = num(size, "longest_edge", 1, 1e12, &d, &f))) return st;
      if (size && f) p->max_pixels = (long)d;
      if ((st = num(o, "min_pixels", 1, 1e12, &d, &f))) return st;
      if (f) p->min_pixels = (long)d;
      if ((st = num(o, "max_pixels", 1, 1e12, &d, &f))) return st;
      if (f) p->max_pixels = (long)d;
      if (p->min_pixels > p->max_pixels)
        return sm_err(SMELT_ERR_FORMAT, "image processor config: min_pixels %ld > max_pixels %ld", p->min_pixels,
                      p->max_pixels);
      break;
    }
    case SM_IMGPROC_FIXED: {
      /* Gemma 3's crops of wide or tall images: off (null) in the released processors' configs */
      if ((st = flag(o, "do_pan_and_scan", &p->pan_and_scan))) return st;
      if ((st = num(o, "pan_and_scan_min_crop_size", 1, 16384, &d, &f))) return st;
      if (f) p->pas_min_crop = (int)d;
      if ((st = num(o, "pan_and_scan_max_num_crops", 1, 64, &d, &f))) return st;
      if (f) p->pas_max_crops = (int)d;
      if ((st = num(o, "pan_and_scan_min_ratio_to_activate", 0, 1e6, &d, &f))) return st;
      if (f) p->pas_min_ratio = d;
      if (size && (st = num(size, "height", 1, 16384, &d, &f))) return st;
      if (size && f) p->height = (int)d;
      if (size && (st = num(size, "width", 1, 16384, &d, &f))) return st;
      if (size && f) p->width = (int)d;
      break;
    }
    case SM_IMGPROC_PIXTRAL:
      if ((st = patch_size(o, &p->patch))) return st;
      if (size && (st = num(size, "longest_edge", 1, 16384, &d, &f))) return st;
      if (size && f) p->longest_edge = (int)d;
      break;
    case SM_IMGPROC_IDEFICS3: {
      if (size && (st = num(size, "longest_edge", 1, 4096, &d, &f))) return st;
      if (size && f) p->longest_edge = (int)d;
      if (size && !f && cJSON_GetObjectItemCaseSensitive(size, "height"))
        return sm_err(SMELT_ERR_UNSUPPORTED, "image processor config: \"size\" must give \"longest_edge\"");
      const cJSON *mx = cJSON_GetObjectItemCaseSensitive(o, "max_image_size");
      if (mx && !cJSON_IsNull(mx) && !cJSON_IsObject(mx))
        return sm_err(SMELT_ERR_FORMAT, "image processor config: \"max_image_size\" must be an object");
      if (mx && (st = num(mx, "longest_edge", 1, 4096, &d, &f))) return st;
      if (mx && f) p->tile = (int)d;
      if ((st = flag(o, "do_image_splitting", &p->splitting))) return st;
      break;
    }
  }
  return SMELT_OK;
}

smelt_status sm_imgproc_parse(const cJSON *pre, const cJSON *proc, sm_imgproc *p) {
  smelt_status st;
  if (pre && (st = parse_one(pre, p))) return st;
  const cJSON *ip = proc ? cJSON_GetObjectItemCaseSensitive(proc, "image_processor") : NULL;
  if (cJSON_IsObject(ip) && (st = parse_one(ip, p))) return st;
  if (p->resample == SM_RESAMPLE_NEAREST)
    return sm_err(SMELT_ERR_UNSUPPORTED, "image processor config: \"resample\": 0 (nearest) is not supported");
  return SMELT_OK;
}

/* transformers' qwen2_vl smart_resize */
static smelt_status smart_resize(int h, int w, int factor, long min_px, long max_px, int *oh, int *ow) {
  const double ratio = (double)SM_MAX(h, w) / SM_MIN(h, w);
  if (ratio > 200)
    return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels: the aspect ratio must be at most 200 (is %.1f)", w, h,
                  ratio);
  double hb = nearbyint((double)h / factor) * factor, wb = nearbyint((double)w / factor) * factor;
  if (hb * wb > (double)max_px) {
    const double beta = sqrt((double)h * w / (double)max_px);
    hb = SM_MAX((double)factor, floor(h / beta / factor) * factor);
    wb = SM_MAX((double)factor, floor(w / beta / factor) * factor);
  } else if (hb * wb < (double)min_px) {
    const double beta = sqrt((double)min_px / ((double)h * w));
    hb = ceil(h * beta / factor) * factor;
    wb = ceil(w * beta / factor) * factor;
  }
  if (hb < factor || wb < factor || hb > 4 * SM_IMAGE_MAX_SIDE || wb > 4 * SM_IMAGE_MAX_SIDE)
    return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels resizes to %.0fx%.0f, outside the model's range", w, h, wb,
                  hb);
  *oh = (int)hb;
  *ow = (int)wb;
  return SMELT_OK;
}

/* transformers' smolvlm / idefics3 _resize_output_size_rescale_to_max_len, then
 * _resize_output_size_scale_below_upper_bound (MAX_IMAGE_SIZE 4096): Python's float division and
 * int() truncation */
static void idefics3_longest(int h, int w, int max_len, int *oh, int *ow) {
  const double ar = (double)w / h;
  if (w >= h) {
    w = max_len;
    h = (int)(w / ar);
    if (h % 2) h++;
  } else {
    h = max_len;
    w = (int)(h * ar);
    if (w % 2) w++;
  }
  h = SM_MAX(h, 1);
  w = SM_MAX(w, 1);
  const double ar2 = (double)w / h;
  if (w >= h && w > 4096) {
    w = 4096;
    h = (int)(w / ar2);
  } else if (h > w && h > 4096) {
    h = 4096;
    w = (int)(h * ar2);
  }
  *oh = SM_MAX(h, 1);
  *ow = SM_MAX(w, 1);
}

void sm_imgproc_idefics3_sizes(const sm_imgproc *p, int h, int w, int *h1, int *w1, int *h2, int *w2, int *rows,
                               int *cols) {
  const int S = p->tile;
  if (p->do_resize) idefics3_longest(h, w, p->longest_edge, &h, &w);
  *h1 = h;
  *w1 = w;
  *rows = *cols = 0;
  if (!p->splitting) { /* squared to the tile */
    *h2 = *w2 = S;
    return;
  }
  /* resize_for_vision_encoder: both sides up to multiples of the tile */
  const double ar = (double)w / h;
  if (w >= h) {
    w = (int)ceil((double)w / S) * S;
    h = (int)(w / ar);
    h = (int)ceil((double)h / S) * S;
  } else {
    h = (int)ceil((double)h / S) * S;
    w = (int)(h * ar);
    w = (int)ceil((double)w / S) * S;
  }
  *h2 = h;
  *w2 = w;
  if (h > S || w > S) {
    *rows = (h + S - 1) / S;
    *cols = (w + S - 1) / S;
  }
}

smelt_status sm_imgproc_target(const sm_imgproc *p, int h, int w, int *oh, int *ow) {
  if (h <= 0 || w <= 0) return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels", w, h);
  *oh = h;
  *ow = w;
  switch (p->kind) {
    case SM_IMGPROC_QWEN:
      /* without do_resize the image must already be a multiple of the patch grid */
      if (!p->do_resize) {
        const int f = p->patch * p->merge;
        if (h % f || w % f)
          return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels is not a multiple of %d (do_resize is off)", w, h, f);
        return SMELT_OK;
      }
      return smart_resize(h, w, p->patch * p->merge, p->min_pixels, p->max_pixels, oh, ow);
    case SM_IMGPROC_FIXED:
      if (p->do_resize) {
        *oh = p->height;
        *ow = p->width;
      } else if (h != p->height || w != p->width)
        return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels must be %dx%d (do_resize is off)", w, h, p->width,
                      p->height);
      return SMELT_OK;
    case SM_IMGPROC_PIXTRAL: {
      double hh = h, ww = w;
      if (p->do_resize) {
        const double ratio = SM_MAX((double)h / p->longest_edge, (double)w / p->longest_edge);
        if (ratio > 1) { /* floor, so that the image stays within longest_edge */
          hh = floor(h / ratio);
          ww = floor(w / ratio);
        }
      }
      if (hh < 1 || ww < 1) return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels is too thin", w, h);
      *oh = (((int)hh - 1) / p->patch + 1) * p->patch;
      *ow = (((int)ww - 1) / p->patch + 1) * p->patch;
      if (!p->do_resize && (*oh != h || *ow != w))
        return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels is not a multiple of %d (do_resize is off)", w, h,
                      p->patch);
      return SMELT_OK;
    }
    case SM_IMGPROC_IDEFICS3: {
      int h1, w1, rows, cols;
      sm_imgproc_idefics3_sizes(p, h, w, &h1, &w1, oh, ow, &rows, &cols);
      if (*oh < 1 || *ow < 1 || *oh > 4 * SM_IMAGE_MAX_SIDE || *ow > 4 * SM_IMAGE_MAX_SIDE)
        return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels resizes to %dx%d, outside the model's range", w, h, *ow,
                      *oh);
      return SMELT_OK;
    }
  }
  return sm_err(SMELT_ERR_INVALID, "unknown image processor");
}

int sm_imgproc_pan_scan(const sm_imgproc *p, int h, int w, int *cw, int *ch, int *ncw, int *nch) {
  if (p->kind != SM_IMGPROC_FIXED || !p->pan_and_scan || h <= 0 || w <= 0) return 0;
  int nw = 1, nh = 1;
  if (w >= h) { /* Python's float division, floor(x + 0.5) rounding half up, as the processor */
    if ((double)w / h < p->pas_min_ratio) return 0;
    nw = (int)floor((double)w / h + 0.5);
    nw = SM_MIN((int)floor((double)w / p->pas_min_crop), nw);
    nw = SM_MIN(p->pas_max_crops, SM_MAX(2, nw));
  } else {
    if ((double)h / w < p->pas_min_ratio) return 0;
    nh = (int)floor((double)h / w + 0.5);
    nh = SM_MIN((int)floor((double)h / p->pas_min_crop), nh);
    nh = SM_MIN(p->pas_max_crops, SM_MAX(2, nh));
  }
  const int sw = (int)ceil((double)w / nw), sh = (int)ceil((double)h / nh);
  if (SM_MIN(sw, sh) < p->pas_min_crop) return 0;
  *cw = sw;
  *ch = sh;
  *ncw = nw;
  *nch = nh;
  return nw * nh;
}

smelt_status sm_imgproc_crops(const sm_imgproc *p, const sm_image *img, sm_image **out, int *n) {
  *out = NULL;
  *n = 0;
  int cw, ch, ncw, nch;
  const int k = sm_imgproc_pan_scan(p, img->h, img->w, &cw, &ch, &ncw, &nch);
  if (!k) return SMELT_OK;
  if ((ncw - 1) * cw >= img->w || (nch - 1) * ch >= img->h)
    return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels: pan and scan would make an empty crop", img->w, img->h);
  sm_image *c = calloc((size_t)k, sizeof *c);
  if (!c) return sm_err(SMELT_ERR_OOM, "pan-and-scan crops");
  for (int y = 0, i = 0; y < nch; y++)
    for (int x = 0; x < ncw; x++, i++) { /* numpy's slices: the last ones end at the image's edge */
      const int x0 = x * cw, y0 = y * ch, w = SM_MIN(cw, img->w - x0), h = SM_MIN(ch, img->h - y0);
      c[i] = (sm_image){w, h, malloc((size_t)w * h * 3)};
      if (!c[i].rgb) {
        for (int j = 0; j < i; j++) free(c[j].rgb);
        free(c);
        return sm_err(SMELT_ERR_OOM, "pan-and-scan crops");
      }
      for (int r = 0; r < h; r++)
        memcpy(c[i].rgb + (size_t)r * w * 3, img->rgb + ((size_t)(y0 + r) * img->w + x0) * 3, (size_t)w * 3);
    }
  *out = c;
  *n = k;
  return SMELT_OK;
}

void sm_pixels_free(sm_pixels *px) {
  if (!px) return;
  free(px->px);
  px->px = NULL;
}

/* pixel values of an 8-bit image into px[c][y][x]: a value depends only on its byte and channel, so a
 * table of the 3 x 256 (float64 rescale rounded to float32, then the float32 normalize) */
static void normalize_into(const sm_imgproc *p, const sm_image *src, float *px) {
  float lut[3][256];
  for (int c = 0; c < 3; c++)
    for (int b = 0; b < 256; b++) {
      float v = (float)b;
      if (p->do_rescale) v = (float)((double)b * p->rescale_factor);
      if (p->do_normalize) v = (v - p->mean[c]) / p->std[c];
      lut[c][b] = v;
    }
  const size_t plane = (size_t)src->h * src->w;
  const uint8_t *rgb = src->rgb;
  float *p0 = px, *p1 = px + plane, *p2 = px + 2 * plane;
  for (size_t i = 0; i < plane; i++) {
    p0[i] = lut[0][rgb[3 * i]];
    p1[i] = lut[1][rgb[3 * i + 1]];
    p2[i] = lut[2][rgb[3 * i + 2]];
  }
}

/* src resized to w x h (a copy when it has that size already, as Pillow's resize) */
static smelt_status resized(const sm_imgproc *p, const sm_image *src, int w, int h, sm_image *dst) {
  if (src->w == w && src->h == h) {
    *dst = (sm_image){w, h, malloc((size_t)w * h * 3)};
    if (!dst->rgb) return sm_err(SMELT_ERR_OOM, "a %dx%d image", w, h);
    memcpy(dst->rgb, src->rgb, (size_t)w * h * 3);
    return SMELT_OK;
  }
  return sm_image_resize(src, w, h, p->resample, dst);
}

/* Idefics3ImageProcessor / SmolVLMImageProcessor: every resize on 8-bit images (Pillow), the tiles
 * cropped from the image resized to multiples of the tile, then the whole image at tile size */
static smelt_status run_idefics3(const sm_imgproc *p, const sm_image *im, sm_pixels *out) {
  int h1, w1, h2, w2, rows, cols;
  sm_imgproc_idefics3_sizes(p, im->h, im->w, &h1, &w1, &h2, &w2, &rows, &cols);
  const int S = p->tile, frames = rows * cols + 1;
  sm_image a = {0}, b = {0}, g = {0}, t = {0};
  smelt_status st = resized(p, im, w1, h1, &a);
  if (!st) st = resized(p, &a, w2, h2, &b);
  sm_image_free(&a);
  const size_t fsz = 3 * (size_t)S * S;
  float *px = st ? NULL : malloc(sizeof(float) * fsz * frames);
  if (!st && !px) st = sm_err(SMELT_ERR_OOM, "pixel values of %d frames of %dx%d", frames, S, S);
  if (!st && rows) { /* tiles */
    t = (sm_image){S, S, malloc((size_t)S * S * 3)};
    if (!t.rgb) st = sm_err(SMELT_ERR_OOM, "a %dx%d tile", S, S);
    for (int r = 0; !st && r < rows; r++)
      for (int c = 0; c < cols; c++) {
        for (int y = 0; y < S; y++)
          memcpy(t.rgb + (size_t)y * S * 3, b.rgb + ((size_t)(r * S + y) * w2 + (size_t)c * S) * 3, (size_t)S * 3);
        normalize_into(p, &t, px + (size_t)(r * cols + c) * fsz);
      }
    if (!st) st = sm_image_resize(&b, S, S, p->resample, &g);
    if (!st) normalize_into(p, &g, px + (size_t)rows * cols * fsz);
  } else if (!st) {
    normalize_into(p, &b, px);
  }
  sm_image_free(&b);
  sm_image_free(&g);
  sm_image_free(&t);
  if (st) {
    free(px);
    return st;
  }
  *out = (sm_pixels){.h = S, .w = S, .frames = frames, .rows = rows, .cols = cols, .px = px};
  return SMELT_OK;
}

smelt_status sm_imgproc_run(const sm_imgproc *p, const sm_image *im, sm_pixels *out) {
  memset(out, 0, sizeof *out);
  int th, tw;
  smelt_status st = sm_imgproc_target(p, im->h, im->w, &th, &tw);
  if (st) return st;
  if (p->kind == SM_IMGPROC_IDEFICS3) return run_idefics3(p, im, out);
  sm_image rs = {0};
  const sm_image *src = im;
  if (th != im->h || tw != im->w) {
    if ((st = sm_image_resize(im, tw, th, p->resample, &rs))) return st;
    src = &rs;
  }
  float *px = malloc(sizeof(float) * (size_t)th * tw * 3);
  if (!px) {
    sm_image_free(&rs);
    return sm_err(SMELT_ERR_OOM, "pixel values of a %dx%d image", tw, th);
  }
  normalize_into(p, src, px);
  sm_image_free(&rs);
  out->h = th;
  out->w = tw;
  out->frames = 1;
  out->px = px;
  return SMELT_OK;
}

float *sm_qwen_patchify(const sm_pixels *px, int ps, int ms, int tps) {
  const int gh = px->h / ps, gw = px->w / ps, row = 3 * tps * ps * ps;
  float *out = sm_xmalloc(sizeof(float) * (size_t)gh * gw * row);
  const size_t plane = (size_t)px->h * px->w;
  size_t r = 0;
  for (int bh = 0; bh < gh / ms; bh++)
    for (int bw = 0; bw < gw / ms; bw++)
      for (int mh = 0; mh < ms; mh++)
        for (int mw = 0; mw < ms; mw++, r++) {
          const int y0 = (bh * ms + mh) * ps, x0 = (bw * ms + mw) * ps;
          float *o = out + r * row;
          for (int c = 0; c < 3; c++)
            for (int t = 0; t < tps; t++)
              for (int y = 0; y < ps; y++)
                for (int x = 0; x < ps; x++) *o++ = px->px[(size_t)c * plane + (size_t)(y0 + y) * px->w + x0 + x];
        }
  return out;
}
