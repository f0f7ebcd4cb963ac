/* Images for vision-language models: decoding (PNG, JPEG, WebP through libpng, libjpeg-turbo and
 * libwebp) into 8-bit RGB, resampling exactly as Pillow does (resize.c), and each family's Hugging
 * Face image processor (preprocess.c). */
#ifndef SM_VISION_IMAGE_H
#define SM_VISION_IMAGE_H
#include "base/base.h"

/* An 8-bit RGB image, rows top to bottom, pixels interleaved r, g, b. */
typedef struct {
  int w, h;
  uint8_t *rgb; /* w * h * 3 bytes, malloc'd */
} sm_image;

/* Decoding limits: an image whose width or height exceeds max_side, or whose pixel count exceeds
 * max_pixels, is refused before its pixels are decoded. */
typedef struct {
  int max_side;
  long max_pixels;
} sm_image_limits;
#define SM_IMAGE_MAX_SIDE 16384
#define SM_IMAGE_MAX_PIXELS (64L << 20)

/* Decode a PNG, JPEG or WebP file held in memory (the format is told by its signature) into RGB as
 * Pillow's Image.open(...).convert("RGB") gives it: 16-bit samples keep their high byte, grey and
 * palette images are expanded, an alpha channel is dropped (not composited), CMYK JPEGs are
 * converted with Pillow's formula. lim NULL: the SM_IMAGE_MAX_* defaults. Errors
 * (SMELT_ERR_FORMAT for corrupt or unknown data, SMELT_ERR_LIMIT for oversized images) say what
 * is wrong. */
smelt_status sm_image_decode(const void *data, size_t len, const sm_image_limits *lim, sm_image *out);
/* Turn a decoded image upright by the EXIF orientation tag of its encoded data (exif.c), as Pillow's
 * ImageOps.exif_transpose does; sm_image_decode calls it. fmt: sm_image_format's name. */
smelt_status sm_image_orient(const void *data, size_t len, const char *fmt, sm_image *im);
/* The same from a file (at most max_bytes bytes; 0: 64 MiB). */
smelt_status sm_image_load(const char *path, size_t max_bytes, const sm_image_limits *lim, sm_image *out);
void sm_image_free(sm_image *im);
/* "png", "jpeg", "webp" or NULL, from the first bytes */
const char *sm_image_format(const void *data, size_t len);

/* Pillow's resampling filters (Image.Resampling values, as preprocessor_config.json's "resample") */
typedef enum {
  SM_RESAMPLE_NEAREST = 0,
  SM_RESAMPLE_LANCZOS = 1,
  SM_RESAMPLE_BILINEAR = 2,
  SM_RESAMPLE_BICUBIC = 3,
  SM_RESAMPLE_BOX = 4,
  SM_RESAMPLE_HAMMING = 5,
} sm_resample;
/* dst = src resized to w x h with Image.resize((w, h), resample=filter), byte for byte as Pillow
 * computes it for an RGB image (two separable passes in fixed point). */
smelt_status sm_image_resize(const sm_image *src, int w, int h, sm_resample filter, sm_image *dst);

#endif
