/* Image decoding into 8-bit RGB with libpng, libjpeg-turbo and libwebp, giving the pixels Pillow's
 * Image.open(...).convert("RGB") gives (the reference of every Hugging Face image processor): the
 * conversions to RGB below follow Pillow's unpackers and Convert.c, and are written out here because
 * the libraries' own ones differ (libpng composites alpha, libjpeg has no CMYK to RGB). Sizes are
 * checked against the limits before any pixel is decoded. */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <webp/decode.h>
#include "vision/image.h"

const char *sm_image_format(const void *data, size_t len) {
  const uint8_t *b = data;
  if (len >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8)) return "png";
  if (len >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return "jpeg";
  if (len >= 12 && !memcmp(b, "RIFF", 4) && !memcmp(b + 8, "WEBP", 4)) return "webp";
  return NULL;
}

void sm_image_free(sm_image *im) {
  if (!im) return;
  free(im->rgb);
  im->rgb = NULL;
  im->w = im->h = 0;
}

static smelt_status check_size(const char *fmt, long w, long h, const sm_image_limits *lim) {
  if (w <= 0 || h <= 0) return sm_err(SMELT_ERR_FORMAT, "%s image has no pixels (%ldx%ld)", fmt, w, h);
  if (w > lim->max_side || h > lim->max_side)
    return sm_err(SMELT_ERR_LIMIT, "%s image of %ldx%ld pixels: a side exceeds the limit of %d", fmt, w, h,
                  lim->max_side);
  if (w * h > lim->max_pixels)
    return sm_err(SMELT_ERR_LIMIT, "%s image of %ldx%ld pixels exceeds the limit of %ld pixels", fmt, w, h,
                  lim->max_pixels);
  return SMELT_OK;
}

/* ---------------- PNG ---------------- */
typedef struct {
  jmp_buf jb;
  char msg[160];
  const uint8_t *p;
  size_t n, off;
} png_src;

static void png_fail(png_structp png, png_const_charp msg) {
  png_src *s = png_get_error_ptr(png);
  snprintf(s->msg, sizeof s->msg, "%s", msg);
  longjmp(s->jb, 1);
}
static void png_quiet(png_structp png, png_const_charp msg) {
  (void)png;
  (void)msg;
}
static void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  png_src *s = png_get_io_ptr(png);
  if (n > s->n - s->off) png_error(png, "truncated file");
  memcpy(out, s->p + s->off, n);
  s->off += n;
}

/* One row of 8- or 16-bit samples (nch channels) into RGB, as Pillow converts the PNG's mode:
 * 16-bit grey ("I") is clipped to 255, other 16-bit samples keep their high byte, alpha is dropped. */
static void png_row_rgb(const uint8_t *in, int w, int nch, int depth, bool grey16_clip, uint8_t *out) {
  for (int x = 0; x < w; x++) {
    uint8_t v[4];
    for (int c = 0; c < nch && c < 4; c++) {
      if (depth == 16) {
        const unsigned s = ((unsigned)in[(x * nch + c) * 2] << 8) | in[(x * nch + c) * 2 + 1];
        v[c] = grey16_clip ? (uint8_t)(s > 255 ? 255 : s) : (uint8_t)(s >> 8);
      } else {
        v[c] = in[x * nch + c];
      }
    }
    if (nch <= 2) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = v[0];
    else memcpy(out + 3 * x, v, 3);
  }
}

static smelt_status decode_png(const uint8_t *data, size_t len, const sm_image_limits *lim, sm_image *out) {
  png_src s = {.p = data, .n = len};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_fail, png_quiet);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!png || !info) {
    png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
    return sm_err(SMELT_ERR_OOM, "PNG decoder");
  }
  uint8_t *volatile buf = NULL;
  uint8_t *volatile rgb = NULL;
  png_bytep *volatile rows = NULL;
  if (setjmp(s.jb)) {
    png_destroy_read_struct(&png, &info, NULL);
    free(buf);
    free(rgb);
    free(rows);
    return sm_err(SMELT_ERR_FORMAT, "corrupt PNG image: %s", s.msg);
  }
  png_set_read_fn(png, &s, png_read_mem);
  png_set_chunk_malloc_max(png, (png_alloc_size_t)8 << 20);
  png_read_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  smelt_status st = check_size("PNG", (long)w, (long)h, lim);
  if (st) {
    png_destroy_read_struct(&png, &info, NULL);
    return st;
  }
  const int ctype = png_get_color_type(png, info), depth0 = png_get_bit_depth(png, info);
  /* Pillow opens 16-bit grey without alpha as mode "I", whose conversion to RGB clips at 255 */
  const bool grey16_clip = ctype == PNG_COLOR_TYPE_GRAY && depth0 == 16;
  if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (ctype == PNG_COLOR_TYPE_GRAY && depth0 < 8) png_set_expand_gray_1_2_4_to_8(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int nch = png_get_channels(png, info), depth = png_get_bit_depth(png, info);
  const size_t rb = png_get_rowbytes(png, info);
  if (nch < 1 || nch > 4 || (depth != 8 && depth != 16) || rb < (size_t)w * nch * (depth / 8))
    png_error(png, "unexpected sample layout");
  buf = malloc(rb * h);
  rows = malloc(sizeof(png_bytep) * h);
  rgb = malloc((size_t)w * h * 3);
  if (!buf || !rows || !rgb) {
    png_destroy_read_struct(&png, &info, NULL);
    free(buf);
    free(rows);
    free(rgb);
    return sm_err(SMELT_ERR_OOM, "PNG image of %ux%u pixels", (unsigned)w, (unsigned)h);
  }
  for (png_uint_32 y = 0; y < h; y++) rows[y] = buf + rb * y;
  png_read_image(png, rows);
  for (png_uint_32 y = 0; y < h; y++) png_row_rgb(rows[y], (int)w, nch, depth, grey16_clip, rgb + (size_t)y * w * 3);
  png_destroy_read_struct(&png, &info, NULL);
  free(buf);
  free(rows);
  out->w = (int)w;
  out->h = (int)h;
  out->rgb = rgb;
  return SMELT_OK;
}

/* ---------------- JPEG ---------------- */
typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_fail(j_common_ptr cinfo) {
  jpeg_err *e = (jpeg_err *)cinfo->err;
  e->pub.format_message(cinfo, e->msg);
  longjmp(e->jb, 1);
}
static void jpeg_quiet(j_common_ptr cinfo, int level) {
  (void)cinfo;
  (void)level;
}

/* Pillow's Convert.c cmyk2rgb, on the inverted samples of its "CMYK;I" raw mode (Adobe convention) */
static uint8_t cmyk_chan(int c, int nk) {
  const int t = c * nk + 128;
  const int v = nk - (((t >> 8) + t) >> 8);
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

static smelt_status decode_jpeg(const uint8_t *data, size_t len, const sm_image_limits *lim, sm_image *out) {
  struct jpeg_decompress_struct ci;
  jpeg_err err;
  uint8_t *volatile rgb = NULL;
  uint8_t *volatile row = NULL;
  ci.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_fail;
  err.pub.emit_message = jpeg_quiet;
  if (setjmp(err.jb)) {
    jpeg_destroy_decompress(&ci);
    free(rgb);
    free(row);
    return sm_err(SMELT_ERR_FORMAT, "corrupt JPEG image: %s", err.msg);
  }
  jpeg_create_decompress(&ci);
  jpeg_mem_src(&ci, data, (unsigned long)len);
  jpeg_read_header(&ci, TRUE);
  smelt_status st = check_size("JPEG", (long)ci.image_width, (long)ci.image_height, lim);
  if (st) {
    jpeg_destroy_decompress(&ci);
    return st;
  }
  const bool cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
  ci.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&ci);
  const int w = (int)ci.output_width, h = (int)ci.output_height, nc = ci.output_components;
  if ((cmyk && nc != 4) || (!cmyk && nc != 3)) {
    jpeg_destroy_decompress(&ci);
    return sm_err(SMELT_ERR_FORMAT, "JPEG image with %d output components is not supported", nc);
  }
  rgb = malloc((size_t)w * h * 3);
  row = malloc((size_t)w * nc);
  if (!rgb || !row) {
    jpeg_destroy_decompress(&ci);
    free(rgb);
    free(row);
    return sm_err(SMELT_ERR_OOM, "JPEG image of %dx%d pixels", w, h);
  }
  while ((int)ci.output_scanline < h) {
    const int y = (int)ci.output_scanline;
    JSAMPROW r = cmyk ? row : rgb + (size_t)y * w * 3;
    if (jpeg_read_scanlines(&ci, &r, 1) != 1) {
      snprintf(err.msg, sizeof err.msg, "no scanline %d", y);
      longjmp(err.jb, 1);
    }
    if (cmyk) /* raw samples p inverted ("CMYK;I"): c = 255 - p[c], nk = 255 - (255 - p[3]) */
      for (int x = 0; x < w; x++) {
        const uint8_t *p = row + 4 * x;
        for (int c = 0; c < 3; c++) rgb[((size_t)y * w + x) * 3 + c] = cmyk_chan(255 - p[c], p[3]);
      }
  }
  jpeg_finish_decompress(&ci);
  jpeg_destroy_decompress(&ci);
  free(row);
  out->w = w;
  out->h = h;
  out->rgb = rgb;
  return SMELT_OK;
}

/* ---------------- WebP ---------------- */
static smelt_status decode_webp(const uint8_t *data, size_t len, const sm_image_limits *lim, sm_image *out) {
  int w = 0, h = 0;
  if (!WebPGetInfo(data, len, &w, &h)) return sm_err(SMELT_ERR_FORMAT, "corrupt WebP image: bad header");
  smelt_status st = check_size("WebP", w, h, lim);
  if (st) return st;
  uint8_t *rgb = malloc((size_t)w * h * 3);
  if (!rgb) return sm_err(SMELT_ERR_OOM, "WebP image of %dx%d pixels", w, h);
  if (!WebPDecodeRGBInto(data, len, rgb, (size_t)w * h * 3, w * 3)) {
    free(rgb);
    return sm_err(SMELT_ERR_FORMAT, "corrupt WebP image: cannot decode it (animated WebP is not supported)");
  }
  out->w = w;
  out->h = h;
  out->rgb = rgb;
  return SMELT_OK;
}

smelt_status sm_image_decode(const void *data, size_t len, const sm_image_limits *lim, sm_image *out) {
  const sm_image_limits def = {SM_IMAGE_MAX_SIDE, SM_IMAGE_MAX_PIXELS};
  memset(out, 0, sizeof *out);
  if (!lim) lim = &def;
  if (!data || !len) return sm_err(SMELT_ERR_FORMAT, "empty image data");
  const char *f = sm_image_format(data, len);
  if (!f) return sm_err(SMELT_ERR_FORMAT, "unknown image format (PNG, JPEG and WebP are supported)");
  smelt_status st = !strcmp(f, "png")  ? decode_png(data, len, lim, out)
                  : !strcmp(f, "jpeg") ? decode_jpeg(data, len, lim, out)
                                       : decode_webp(data, len, lim, out);
  if (!st && (st = sm_image_orient(data, len, f, out))) sm_image_free(out);
  return st;
}

smelt_status sm_image_load(const char *path, size_t max_bytes, const sm_image_limits *lim, sm_image *out) {
  char *data = NULL;
  size_t len = 0;
  memset(out, 0, sizeof *out);
  smelt_status st = sm_read_file_max(path, max_bytes ? max_bytes : (size_t)64 << 20, &data, &len);
  if (st) return st;
  st = sm_image_decode(data, len, lim, out);
  free(data);
  if (st) return sm_err(st, "%s: %s", path, sm_errmsg());
  return SMELT_OK;
}
