/* Image decoding, Pillow-exact resampling and the image processors, against the references of
 * tools/vision_ref.py (Pillow and the transformers processors' arithmetic) in tests/vision/data; and
 * the errors for corrupt, truncated and oversized images. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"
#include "vision/image.h"
#include "vision/preprocess.h"

static const char *g_dir;

static char *path_of(const char *sub, const char *name) {
  static char buf[4][1024];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s/%s", g_dir, sub, name);
  return buf[k];
}

static void *slurp(const char *path, size_t *len) {
  char *d = NULL;
  if (sm_read_file(path, &d, len)) {
    fprintf(stderr, "cannot read %s: %s\n", path, sm_errmsg());
    exit(1);
  }
  return d;
}

static void test_decode(const cJSON *list) {
  for (const cJSON *e = list->child; e; e = e->next) {
    const char *n = cJSON_GetObjectItem(e, "image")->valuestring;
    const int w = cJSON_GetObjectItem(e, "w")->valueint, h = cJSON_GetObjectItem(e, "h")->valueint;
    sm_image im;
    smelt_status st = sm_image_load(path_of("images", n), 0, NULL, &im);
    CHECK(st == SMELT_OK, "decode %s: %s", n, sm_errmsg());
    if (st) continue;
    char rn[256];
    snprintf(rn, sizeof rn, "%s.rgb", n);
    size_t len;
    uint8_t *ref = slurp(path_of("ref", rn), &len);
    CHECK(im.w == w && im.h == h && len == (size_t)w * h * 3, "%s: %dx%d, expected %dx%d", n, im.w, im.h, w, h);
    if (im.w == w && im.h == h && len == (size_t)w * h * 3) {
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < len; i++)
        if (im.rgb[i] != ref[i] && !bad++) first = i;
      CHECK(bad == 0, "%s: %zu bytes differ from Pillow (first at %zu: %d vs %d)", n, bad, first, im.rgb[first],
            ref[first]);
    }
    free(ref);
    sm_image_free(&im);
  }
}

static void test_resize(const cJSON *list) {
  for (const cJSON *e = list->child; e; e = e->next) {
    const char *n = cJSON_GetObjectItem(e, "image")->valuestring;
    const int w = cJSON_GetObjectItem(e, "w")->valueint, h = cJSON_GetObjectItem(e, "h")->valueint;
    const int f = cJSON_GetObjectItem(e, "filter")->valueint;
    sm_image im, out;
    if (sm_image_load(path_of("images", n), 0, NULL, &im)) {
      CHECK(0, "load %s", n);
      continue;
    }
    smelt_status st = sm_image_resize(&im, w, h, (sm_resample)f, &out);
    CHECK(st == SMELT_OK, "resize %s to %dx%d filter %d: %s", n, w, h, f, sm_errmsg());
    size_t len;
    uint8_t *ref = slurp(path_of("ref", cJSON_GetObjectItem(e, "file")->valuestring), &len);
    if (!st && len == (size_t)w * h * 3) {
      size_t bad = 0;
      int maxd = 0;
      for (size_t i = 0; i < len; i++) {
        const int d = abs((int)out.rgb[i] - ref[i]);
        bad += d != 0;
        if (d > maxd) maxd = d;
      }
      CHECK(bad == 0, "resize %s -> %dx%d filter %d: %zu bytes differ from Pillow (max %d)", n, w, h, f, bad, maxd);
    }
    free(ref);
    sm_image_free(&out);
    sm_image_free(&im);
  }
}

static void test_proc(const cJSON *list) {
  for (const cJSON *e = list->child; e; e = e->next) {
    const char *kind = cJSON_GetObjectItem(e, "kind")->valuestring, *n = cJSON_GetObjectItem(e, "image")->valuestring;
    sm_imgproc p;
    sm_imgproc_defaults(!strcmp(kind, "qwen")       ? SM_IMGPROC_QWEN
                        : !strcmp(kind, "fixed")    ? SM_IMGPROC_FIXED
                        : !strcmp(kind, "idefics3") ? SM_IMGPROC_IDEFICS3
                                                    : SM_IMGPROC_PIXTRAL,
                        &p);
    /* the case's settings, given the way a preprocessor_config.json gives them */
    cJSON *cfg = cJSON_CreateObject();
    if (!strcmp(kind, "qwen")) {
      cJSON_AddNumberToObject(cfg, "patch_size", cJSON_GetObjectItem(e, "patch")->valuedouble);
      cJSON_AddNumberToObject(cfg, "merge_size", cJSON_GetObjectItem(e, "merge")->valuedouble);
      cJSON_AddNumberToObject(cfg, "temporal_patch_size", cJSON_GetObjectItem(e, "temporal")->valuedouble);
      cJSON_AddNumberToObject(cfg, "min_pixels", cJSON_GetObjectItem(e, "min_pixels")->valuedouble);
      cJSON_AddNumberToObject(cfg, "max_pixels", cJSON_GetObjectItem(e, "max_pixels")->valuedouble);
      cJSON_AddItemToObject(cfg, "image_mean", cJSON_Duplicate(cJSON_GetObjectItem(e, "mean"), 1));
      cJSON_AddItemToObject(cfg, "image_std", cJSON_Duplicate(cJSON_GetObjectItem(e, "std"), 1));
    } else if (!strcmp(kind, "fixed")) {
      cJSON *sz = cJSON_AddObjectToObject(cfg, "size");
      cJSON_AddNumberToObject(sz, "height", cJSON_GetObjectItem(e, "height")->valuedouble);
      cJSON_AddNumberToObject(sz, "width", cJSON_GetObjectItem(e, "width")->valuedouble);
      if (cJSON_IsTrue(cJSON_GetObjectItem(e, "pan_and_scan"))) {
        cJSON_AddTrueToObject(cfg, "do_pan_and_scan");
        cJSON_AddNumberToObject(cfg, "pan_and_scan_min_crop_size", cJSON_GetObjectItem(e, "pas_min_crop")->valuedouble);
        cJSON_AddNumberToObject(cfg, "pan_and_scan_max_num_crops",
                                cJSON_GetObjectItem(e, "pas_max_crops")->valuedouble);
        cJSON_AddNumberToObject(cfg, "pan_and_scan_min_ratio_to_activate",
                                cJSON_GetObjectItem(e, "pas_min_ratio")->valuedouble);
      }
    } else if (!strcmp(kind, "idefics3")) {
      cJSON *sz = cJSON_AddObjectToObject(cfg, "size");
      cJSON_AddNumberToObject(sz, "longest_edge", cJSON_GetObjectItem(e, "longest_edge")->valuedouble);
      sz = cJSON_AddObjectToObject(cfg, "max_image_size");
      cJSON_AddNumberToObject(sz, "longest_edge", cJSON_GetObjectItem(e, "max_size")->valuedouble);
      cJSON_AddBoolToObject(cfg, "do_image_splitting", cJSON_IsTrue(cJSON_GetObjectItem(e, "splitting")));
      cJSON_AddItemToObject(cfg, "image_mean", cJSON_Duplicate(cJSON_GetObjectItem(e, "mean"), 1));
      cJSON_AddItemToObject(cfg, "image_std", cJSON_Duplicate(cJSON_GetObjectItem(e, "std"), 1));
    } else {
      cJSON *sz = cJSON_AddObjectToObject(cfg, "size");
      cJSON_AddNumberToObject(sz, "longest_edge", cJSON_GetObjectItem(e, "longest_edge")->valuedouble);
      cJSON *ps = cJSON_AddObjectToObject(cfg, "patch_size");
      cJSON_AddNumberToObject(ps, "height", cJSON_GetObjectItem(e, "patch")->valuedouble);
      cJSON_AddNumberToObject(ps, "width", cJSON_GetObjectItem(e, "patch")->valuedouble);
    }
    smelt_status st = sm_imgproc_parse(cfg, NULL, &p);
    cJSON_Delete(cfg);
    CHECK(st == SMELT_OK, "parse %s config: %s", kind, sm_errmsg());
    sm_image im;
    sm_pixels px;
    if (sm_image_load(path_of("images", n), 0, NULL, &im)) {
      CHECK(0, "load %s", n);
      continue;
    }
    /* pan and scan: the whole image's pixel values, then each crop's, one after another */
    sm_image *crops = NULL;
    int n_crops = 0;
    st = sm_imgproc_crops(&p, &im, &crops, &n_crops);
    CHECK(st == SMELT_OK, "%s crops of %s: %s", kind, n, sm_errmsg());
    const cJSON *want_crops = cJSON_GetObjectItem(e, "n_crops");
    CHECK(n_crops == (want_crops ? want_crops->valueint : 0), "%s on %s: %d crops, expected %d", kind, n, n_crops,
          want_crops ? want_crops->valueint : 0);
    st = sm_imgproc_run(&p, &im, &px);
    CHECK(st == SMELT_OK, "%s processor on %s: %s", kind, n, sm_errmsg());
    sm_image_free(&im);
    for (int c = 0; !st && c < n_crops; c++) {
      sm_pixels cp;
      st = sm_imgproc_run(&p, &crops[c], &cp);
      CHECK(st == SMELT_OK, "crop %d of %s: %s", c, n, sm_errmsg());
      if (st) break;
      const size_t one = (size_t)3 * px.h * px.w;
      px.px = realloc(px.px, sizeof(float) * one * (size_t)(c + 2));
      memcpy(px.px + one * (size_t)(c + 1), cp.px, sizeof(float) * one);
      sm_pixels_free(&cp);
    }
    for (int c = 0; c < n_crops; c++) sm_image_free(&crops[c]);
    free(crops);
    if (st) continue;
    const int oh = cJSON_GetObjectItem(e, "out_h")->valueint, ow = cJSON_GetObjectItem(e, "out_w")->valueint;
    CHECK(px.h == oh && px.w == ow, "%s on %s: %dx%d, expected %dx%d", kind, n, px.w, px.h, ow, oh);
    /* Idefics3: the frames (tiles, then the whole image) and the tile grid */
    const cJSON *nf = cJSON_GetObjectItem(e, "n_frames");
    const int frames = nf ? nf->valueint : 1;
    CHECK(px.frames == frames, "%s on %s: %d frames, expected %d", kind, n, px.frames, frames);
    if (nf)
      CHECK(px.rows == cJSON_GetObjectItem(e, "rows")->valueint && px.cols == cJSON_GetObjectItem(e, "cols")->valueint,
            "%s on %s: %dx%d tiles, expected %dx%d", kind, n, px.rows, px.cols,
            cJSON_GetObjectItem(e, "rows")->valueint, cJSON_GetObjectItem(e, "cols")->valueint);
    size_t len;
    float *ref = slurp(path_of("ref", cJSON_GetObjectItem(e, "file")->valuestring), &len);
    float *got = px.px;
    if (!strcmp(kind, "qwen")) got = sm_qwen_patchify(&px, p.patch, p.merge, p.temporal);
    const size_t n_el = (size_t)3 * px.h * px.w * (strcmp(kind, "qwen") ? 1 : p.temporal) * (size_t)(1 + n_crops) *
                        (size_t)SM_MAX(px.frames, 1);
    CHECK(len == n_el * 4, "%s on %s: %zu reference floats, %zu computed", kind, n, len / 4, n_el);
    if (len == n_el * 4) {
      double md = 0;
      for (size_t i = 0; i < n_el; i++) md = fmax(md, fabs((double)got[i] - ref[i]));
      CHECK(md <= 1e-6, "%s processor on %s: max |diff| %g from the reference", kind, n, md);
    }
    if (got != px.px) free(got);
    free(ref);
    sm_pixels_free(&px);
  }
}

/* pan and scan's crop grids against the processor's arithmetic (tools/vision_ref.py) */
static void test_pan_scan_sizes(const cJSON *list) {
  int k = 0;
  for (const cJSON *e = list->child; e; e = e->next, k++) {
    double v[9];
    for (int i = 0; i < 9; i++) v[i] = cJSON_GetArrayItem(e, i)->valuedouble;
    sm_imgproc p;
    sm_imgproc_defaults(SM_IMGPROC_FIXED, &p);
    p.pan_and_scan = true;
    p.pas_min_crop = (int)v[2];
    p.pas_max_crops = (int)v[3];
    p.pas_min_ratio = v[4];
    int cw = 0, ch = 0, nw = 0, nh = 0;
    const int n = sm_imgproc_pan_scan(&p, (int)v[0], (int)v[1], &cw, &ch, &nw, &nh);
    CHECK(n == (int)(v[7] * v[8]) && (!n || (cw == (int)v[5] && ch == (int)v[6] && nw == (int)v[7] && nh == (int)v[8])),
          "pan and scan of %gx%g (min %g, max %g, ratio %g): %d crops of %dx%d (%dx%d), expected %gx%g of %gx%g", v[1],
          v[0], v[2], v[3], v[4], n, cw, ch, nw, nh, v[7], v[8], v[5], v[6]);
    p.pan_and_scan = false;
    CHECK(sm_imgproc_pan_scan(&p, (int)v[0], (int)v[1], &cw, &ch, &nw, &nh) == 0, "pan and scan off: no crops");
  }
  CHECK(k >= 10, "pan-and-scan cases: %d", k);
}

static void test_sizes(const cJSON *qs, const cJSON *ps) {
  for (const cJSON *e = qs->child; e; e = e->next) {
    int v[7];
    for (int i = 0; i < 7; i++) v[i] = cJSON_GetArrayItem(e, i)->valueint;
    sm_imgproc p;
    sm_imgproc_defaults(SM_IMGPROC_QWEN, &p);
    p.patch = v[2] / 2;
    p.merge = 2;
    p.min_pixels = v[3];
    p.max_pixels = v[4];
    int oh, ow;
    smelt_status st = sm_imgproc_target(&p, v[0], v[1], &oh, &ow);
    CHECK(!st && oh == v[5] && ow == v[6], "qwen smart_resize %dx%d (factor %d, %d..%d): %dx%d, expected %dx%d (%s)",
          v[0], v[1], v[2], v[3], v[4], oh, ow, v[5], v[6], st ? sm_errmsg() : "ok");
  }
  for (const cJSON *e = ps->child; e; e = e->next) {
    int v[6];
    for (int i = 0; i < 6; i++) v[i] = cJSON_GetArrayItem(e, i)->valueint;
    sm_imgproc p;
    sm_imgproc_defaults(SM_IMGPROC_PIXTRAL, &p);
    p.longest_edge = v[2];
    p.patch = v[3];
    int oh, ow;
    smelt_status st = sm_imgproc_target(&p, v[0], v[1], &oh, &ow);
    if (v[4] == 0 || v[5] == 0) { /* transformers would make an empty image: refused */
      CHECK(st == SMELT_ERR_INVALID, "pixtral size %dx%d: refused (%s)", v[0], v[1], sm_errmsg());
      continue;
    }
    CHECK(!st && oh == v[4] && ow == v[5], "pixtral size %dx%d (edge %d, patch %d): %dx%d, expected %dx%d", v[0], v[1],
          v[2], v[3], oh, ow, v[4], v[5]);
  }
  /* Qwen refuses an aspect ratio above 200, as transformers does */
  sm_imgproc p;
  sm_imgproc_defaults(SM_IMGPROC_QWEN, &p);
  int oh, ow;
  CHECK(sm_imgproc_target(&p, 1, 201, &oh, &ow) == SMELT_ERR_INVALID && strstr(sm_errmsg(), "aspect ratio"),
        "aspect ratio 201 refused: %s", sm_errmsg());
}

/* Idefics3 / SmolVLM: the longest-edge resize, the resize to multiples of the tile and the tile grid
 * (h, w, longest_edge, tile -> h1, w1, h2, w2, rows, cols), as transformers' arithmetic gives them */
static void test_idefics3_sizes(const cJSON *list) {
  int k = 0;
  for (const cJSON *e = list ? list->child : NULL; e; e = e->next, k++) {
    int v[10];
    for (int i = 0; i < 10; i++) v[i] = cJSON_GetArrayItem(e, i)->valueint;
    sm_imgproc p;
    sm_imgproc_defaults(SM_IMGPROC_IDEFICS3, &p);
    p.longest_edge = v[2];
    p.tile = v[3];
    int h1, w1, h2, w2, rows, cols;
    sm_imgproc_idefics3_sizes(&p, v[0], v[1], &h1, &w1, &h2, &w2, &rows, &cols);
    CHECK(h1 == v[4] && w1 == v[5] && h2 == v[6] && w2 == v[7] && rows == v[8] && cols == v[9],
          "idefics3 sizes of %dx%d (edge %d, tile %d): %dx%d, %dx%d, %dx%d tiles; expected %dx%d, %dx%d, %dx%d", v[0],
          v[1], v[2], v[3], h1, w1, h2, w2, rows, cols, v[4], v[5], v[6], v[7], v[8], v[9]);
  }
  CHECK(k >= 10, "idefics3 size cases: %d", k);
}

static void test_errors(void) {
  sm_image im;
  size_t len;
  uint8_t *png = slurp(path_of("images", "rgb_37x23.png"), &len);
  /* truncated in the pixel data: an error naming the format, no crash */
  CHECK(sm_image_decode(png, len / 2, NULL, &im) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "PNG"), "truncated PNG: %s",
        sm_errmsg());
  /* a flipped byte in the compressed data (CRC / zlib error) */
  uint8_t *bad = malloc(len);
  memcpy(bad, png, len);
  bad[len / 2] ^= 0x5a;
  CHECK(sm_image_decode(bad, len, NULL, &im) == SMELT_ERR_FORMAT, "corrupt PNG: %s", sm_errmsg());
  /* limits: refused before decoding */
  sm_image_limits lim = {20, 1L << 20};
  CHECK(sm_image_decode(png, len, &lim, &im) == SMELT_ERR_LIMIT && strstr(sm_errmsg(), "37x23"), "side limit: %s",
        sm_errmsg());
  lim = (sm_image_limits){1000, 800};
  CHECK(sm_image_decode(png, len, &lim, &im) == SMELT_ERR_LIMIT && strstr(sm_errmsg(), "800"), "pixel limit: %s",
        sm_errmsg());
  free(bad);
  free(png);
  uint8_t *jpg = slurp(path_of("images", "rgb_45x30.jpg"), &len);
  CHECK(sm_image_decode(jpg, 200, NULL, &im) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "JPEG"), "truncated JPEG: %s",
        sm_errmsg());
  free(jpg);
  uint8_t *wp = slurp(path_of("images", "rgb_27x19.webp"), &len);
  CHECK(sm_image_decode(wp, len - 40, NULL, &im) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "WebP"),
        "truncated WebP: %s", sm_errmsg());
  free(wp);
  CHECK(sm_image_decode("GIF89a......", 12, NULL, &im) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "unknown image"),
        "unknown format: %s", sm_errmsg());
  CHECK(sm_image_decode("", 0, NULL, &im) == SMELT_ERR_FORMAT, "empty data: %s", sm_errmsg());
  /* a PNG header claiming 100000 x 100000 pixels: refused from the header */
  static const uint8_t huge[] = {0x89, 'P',  'N',  'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I',  'H',  'D',  'R', 0,
                                 1,    0x86, 0xa0, 0,   1,    0x86, 0xa0, 8,    2, 0, 0, 0,  0x0c, 0x5b, 0x6b, 0x4e};
  smelt_status st = sm_image_decode(huge, sizeof huge, NULL, &im);
  CHECK(st == SMELT_ERR_LIMIT || st == SMELT_ERR_FORMAT, "huge PNG header: %d %s", st, sm_errmsg());
  /* config errors name the member */
  sm_imgproc p;
  sm_imgproc_defaults(SM_IMGPROC_QWEN, &p);
  cJSON *c = cJSON_Parse("{\"image_mean\": [0.5, 0.5]}");
  CHECK(sm_imgproc_parse(c, NULL, &p) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "image_mean"), "bad mean: %s",
        sm_errmsg());
  cJSON_Delete(c);
  c = cJSON_Parse("{\"min_pixels\": 5000, \"max_pixels\": 100}");
  CHECK(sm_imgproc_parse(c, NULL, &p) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "min_pixels"), "min > max: %s",
        sm_errmsg());
  cJSON_Delete(c);
  /* Gemma 3's pan-and-scan settings: bad values name their key */
  const char *bad_pas[] = {"{\"do_pan_and_scan\": 1}", "{\"pan_and_scan_min_crop_size\": -3}",
                           "{\"pan_and_scan_max_num_crops\": 0}", "{\"pan_and_scan_min_ratio_to_activate\": \"x\"}"};
  const char *keys[] = {"do_pan_and_scan", "pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops",
                        "pan_and_scan_min_ratio_to_activate"};
  for (int i = 0; i < 4; i++) {
    sm_imgproc_defaults(SM_IMGPROC_FIXED, &p);
    c = cJSON_Parse(bad_pas[i]);
    CHECK(sm_imgproc_parse(c, NULL, &p) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), keys[i]), "%s: %s", bad_pas[i],
          sm_errmsg());
    cJSON_Delete(c);
  }
  /* Idefics3 / SmolVLM settings: bad values name their key; a size without longest_edge is refused */
  const char *bad_idf[] = {"{\"max_image_size\": 512}", "{\"max_image_size\": {\"longest_edge\": 0}}",
                           "{\"size\": {\"longest_edge\": 9999}}", "{\"do_image_splitting\": \"yes\"}",
                           "{\"size\": {\"height\": 512, \"width\": 512}}"};
  const char *idf_keys[] = {"max_image_size", "longest_edge", "longest_edge", "do_image_splitting", "longest_edge"};
  for (int i = 0; i < 5; i++) {
    sm_imgproc_defaults(SM_IMGPROC_IDEFICS3, &p);
    c = cJSON_Parse(bad_idf[i]);
    st = sm_imgproc_parse(c, NULL, &p);
    CHECK((st == SMELT_ERR_FORMAT || st == SMELT_ERR_UNSUPPORTED) && strstr(sm_errmsg(), idf_keys[i]), "%s: %s",
          bad_idf[i], sm_errmsg());
    cJSON_Delete(c);
  }
  /* a 1 x 5000 image: the short side kept at 1 pixel, then a tile high; no division by zero */
  {
    sm_imgproc_defaults(SM_IMGPROC_IDEFICS3, &p);
    p.longest_edge = 64;
    p.tile = 32;
    uint8_t *line = calloc(5000 * 3, 1);
    sm_image wide = {5000, 1, line};
    sm_pixels px;
    st = sm_imgproc_run(&p, &wide, &px);
    CHECK(st == SMELT_OK && px.frames == 3 && px.rows == 1 && px.cols == 2 && px.h == 32, "1x5000 image: %d frames, %s",
          px.frames, st ? sm_errmsg() : "ok");
    if (!st) sm_pixels_free(&px);
    free(line);
  }
  /* a 1-pixel minimum crop on a 5x1 image: a crop would be empty, which is refused, not made */
  sm_imgproc_defaults(SM_IMGPROC_FIXED, &p);
  p.pan_and_scan = true;
  p.pas_min_crop = 1;
  uint8_t px5[15] = {0};
  sm_image thin = {5, 1, px5}, *crops = NULL;
  int nc = -1;
  CHECK(sm_imgproc_crops(&p, &thin, &crops, &nc) == SMELT_ERR_INVALID && strstr(sm_errmsg(), "empty crop") && !crops,
        "5x1 pan and scan: %s", sm_errmsg());
}

int main(int argc, char **argv) {
  g_dir = argc > 1 ? argv[1] : "tests/vision/data";
  size_t len;
  char *m = slurp(path_of(".", "manifest.json"), &len);
  cJSON *man = cJSON_ParseWithLength(m, len);
  free(m);
  if (!man) {
    fprintf(stderr, "bad manifest\n");
    return 1;
  }
  test_decode(cJSON_GetObjectItem(man, "decode"));
  test_resize(cJSON_GetObjectItem(man, "resize"));
  test_proc(cJSON_GetObjectItem(man, "proc"));
  test_pan_scan_sizes(cJSON_GetObjectItem(man, "pan_scan_sizes"));
  test_sizes(cJSON_GetObjectItem(man, "qwen_sizes"), cJSON_GetObjectItem(man, "pixtral_sizes"));
  test_idefics3_sizes(cJSON_GetObjectItem(man, "idefics3_sizes"));
  test_errors();
  cJSON_Delete(man);
  TEST_END();
}
