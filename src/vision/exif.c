/* EXIF orientation: the decoded image turned upright as Pillow's ImageOps.exif_transpose turns it,
 * which transformers' and mlx-vlm's load_image apply to every image they load (a phone's JPEG is
 * often stored sideways with orientation 6). The tag is read with libexif, from a JPEG's APP1
 * segment, a PNG's eXIf chunk or a WebP's EXIF chunk (the two chunks found by walking the
 * container's chunk list here; libexif reads JPEG markers itself). */
#include <libexif/exif-data.h>
#include <stdlib.h>
#include <string.h>
#include "vision/image.h"

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* the EXIF payload of a PNG (eXIf chunk) or WebP (EXIF chunk); NULL when there is none */
static const uint8_t *exif_chunk(const uint8_t *b, size_t len, const char *fmt, size_t *n) {
  if (!strcmp(fmt, "png")) {
    for (size_t o = 8; o + 12 <= len;) {
      const uint32_t cl = be32(b + o);
      if (cl > len - o - 12) return NULL;
      if (!memcmp(b + o + 4, "eXIf", 4)) {
        *n = cl;
        return b + o + 8;
      }
      if (!memcmp(b + o + 4, "IDAT", 4) || !memcmp(b + o + 4, "IEND", 4)) return NULL;
      o += 12 + (size_t)cl;
    }
    return NULL;
  }
  for (size_t o = 12; o + 8 <= len;) { /* webp: RIFF chunks, padded to even sizes */
    const uint32_t cl = le32(b + o + 4);
    if (cl > len - o - 8) return NULL;
    if (!memcmp(b + o, "EXIF", 4)) {
      *n = cl;
      return b + o + 8;
    }
    o += 8 + (size_t)cl + (cl & 1);
  }
  return NULL;
}

/* the orientation tag (1-8), 1 where there is none or it is not one of those */
static int orientation(const uint8_t *b, size_t len, const char *fmt) {
  ExifData *ed = NULL;
  if (!strcmp(fmt, "jpeg")) ed = exif_data_new_from_data(b, (unsigned)(len > 0xffffffffu ? 0xffffffffu : len));
  else {
    size_t n = 0;
    const uint8_t *p = exif_chunk(b, len, fmt, &n);
    if (!p || n < 8 || n > (64u << 20)) return 1;
    /* libexif reads "Exif\0\0" + TIFF; the chunks may hold the TIFF data alone */
    const bool hdr = n >= 6 && !memcmp(p, "Exif\0\0", 6);
    uint8_t *buf = malloc(n + 6);
    if (!buf) return 1;
    memcpy(buf, "Exif\0\0", 6);
    memcpy(buf + 6, p, n);
    ed = exif_data_new_from_data(hdr ? buf + 6 : buf, (unsigned)(hdr ? n : n + 6));
    free(buf);
  }
  if (!ed) return 1;
  int o = 1;
  ExifEntry *e = exif_content_get_entry(ed->ifd[EXIF_IFD_0], EXIF_TAG_ORIENTATION);
  if (e && e->format == EXIF_FORMAT_SHORT && e->components >= 1 && e->data && e->size >= 2)
    o = exif_get_short(e->data, exif_data_get_byte_order(ed));
  exif_data_unref(ed);
  return o >= 1 && o <= 8 ? o : 1;
}

smelt_status sm_image_orient(const void *data, size_t len, const char *fmt, sm_image *im) {
  const int o = orientation(data, len, fmt);
  if (o == 1) return SMELT_OK;
  const int w = im->w, h = im->h, swap = o >= 5, ow = swap ? h : w, oh = swap ? w : h;
  uint8_t *out = malloc((size_t)w * h * 3);
  if (!out) return sm_err(SMELT_ERR_OOM, "turning a %dx%d image upright", w, h);
  for (int y = 0; y < oh; y++)
    for (int x = 0; x < ow; x++) {
      int sx, sy; /* the input pixel of output (x, y), as Image.transpose's methods map them */
      switch (o) {
        case 2: sx = w - 1 - x, sy = y; break;         /* FLIP_LEFT_RIGHT */
        case 3: sx = w - 1 - x, sy = h - 1 - y; break; /* ROTATE_180 */
        case 4: sx = x, sy = h - 1 - y; break;         /* FLIP_TOP_BOTTOM */
        case 5: sx = y, sy = x; break;                 /* TRANSPOSE */
        case 6: sx = y, sy = h - 1 - x; break;         /* ROTATE_270 */
        case 7: sx = w - 1 - y, sy = h - 1 - x; break; /* TRANSVERSE */
        default: sx = w - 1 - y, sy = x; break;        /* 8: ROTATE_90 */
      }
      memcpy(out + ((size_t)y * ow + x) * 3, im->rgb + ((size_t)sy * w + sx) * 3, 3);
    }
  free(im->rgb);
  im->rgb = out;
  im->w = ow;
  im->h = oh;
  return SMELT_OK;
}
