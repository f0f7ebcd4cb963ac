/* Images of API requests (image_input.h): data: URLs, downloads with libcurl (http and https only,
 * limited in bytes and time), local files under one directory (the path resolved with realpath and
 * checked to lie inside it; file:// URLs percent-decoded by libcurl), decoding (src/vision) and
 * preparation for the vision tower. The base64
 * decoder is written out here: none of the libraries smelt links exposes one (embeddings.c writes
 * the encoder the same way). */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "server/image_input.h"

void sm_image_policy_default(sm_image_policy *p) {
  memset(p, 0, sizeof *p);
  p->max_bytes = (size_t)20 << 20;
  p->timeout_s = 20;
  p->lim.max_side = SM_IMAGE_MAX_SIDE;
  p->lim.max_pixels = 40L << 20;
}

static int b64_val(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool sm_base64_decode(const char *s, size_t len, unsigned char **out, size_t *out_len) {
  size_t pad = 0; /* padding: at most two, only at the end, completing a group of four */
  while (len && s[len - 1] == '=') len--, pad++;
  if (pad > 2 || (pad && (len + pad) % 4)) return false;
  unsigned char *o = malloc(len / 4 * 3 + 3);
  if (!o) return false;
  size_t n = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < len; i++) {
    const int v = b64_val((unsigned char)s[i]);
    if (v < 0) {
      free(o);
      return false;
    }
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      o[n++] = (unsigned char)(acc >> bits);
    }
  }
  if (bits >= 6) {
    free(o);
    return false;
  } /* a lone trailing character */
  *out = o;
  *out_len = n;
  return true;
}

/* ---------------- downloads ---------------- */
typedef struct {
  unsigned char *p;
  size_t n, cap, max;
  bool too_big;
} dl_buf;

static size_t dl_write(char *ptr, size_t sz, size_t nm, void *ud) {
  dl_buf *b = ud;
  const size_t k = sz * nm;
  if (b->n + k > b->max) {
    b->too_big = true;
    return 0;
  }
  if (b->n + k + 1 > b->cap) { /* doubling: a chunk at a time would copy the image over and over */
    size_t c = b->cap ? b->cap * 2 : 65536;
    while (c < b->n + k + 1) c *= 2;
    unsigned char *q = realloc(b->p, c);
    if (!q) return 0;
    b->p = q;
    b->cap = c;
  }
  memcpy(b->p + b->n, ptr, k);
  b->n += k;
  return k;
}

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static bool fetch(const char *url, const sm_image_policy *pol, unsigned char **out, size_t *len, char *why, size_t wn) {
  pthread_once(&g_curl_once, curl_init);
  CURL *h = curl_easy_init();
  if (!h) {
    snprintf(why, wn, "cannot start a download");
    return false;
  }
  dl_buf b = {NULL, 0, 0, pol->max_bytes, false};
  char cerr[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, 3L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, pol->timeout_s);
  curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)pol->max_bytes);
  curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, dl_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  const CURLcode rc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK) {
    if (b.too_big || rc == CURLE_FILESIZE_EXCEEDED)
      snprintf(why, wn, "the image is larger than %zu bytes", pol->max_bytes);
    else snprintf(why, wn, "download failed: %s", cerr[0] ? cerr : curl_easy_strerror(rc));
    free(b.p);
    return false;
  }
  *out = b.p;
  *len = b.n;
  return true;
}

/* a local file: path (absolute, decoded) must resolve to a regular file inside pol->files_dir */
static bool read_local(const char *path, const sm_image_policy *pol, unsigned char **out, size_t *len, char *why,
                       size_t wn) {
  char real[PATH_MAX];
  if (path[0] != '/') {
    snprintf(why, wn, "a local image path must be absolute");
    return false;
  }
  if (!realpath(path, real)) {
    snprintf(why, wn, "cannot open the image file: %s", strerror(errno));
    return false;
  }
  const size_t dl = strlen(pol->files_dir);
  if (strncmp(real, pol->files_dir, dl) || (real[dl] != '/' && !(dl == 1 && pol->files_dir[0] == '/'))) {
    snprintf(why, wn, "the image file is outside the directory the server reads images from (--allow-image-files)");
    return false;
  }
  const int fd = open(real, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    snprintf(why, wn, "cannot open the image file: %s", strerror(errno));
    if (fd >= 0) close(fd);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    snprintf(why, wn, "the image path is not a regular file");
    return false;
  }
  if ((uint64_t)st.st_size > pol->max_bytes) {
    close(fd);
    snprintf(why, wn, "the image is larger than %zu bytes", pol->max_bytes);
    return false;
  }
  unsigned char *b = malloc((size_t)st.st_size + 1);
  size_t n = 0;
  while (b && n < (size_t)st.st_size) {
    const ssize_t r = read(fd, b + n, (size_t)st.st_size - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (!b || n != (size_t)st.st_size) {
    free(b);
    snprintf(why, wn, "cannot read the image file");
    return false;
  }
  *out = b;
  *len = n;
  return true;
}

static bool local_file(const char *url, const sm_image_policy *pol, unsigned char **out, size_t *len, char *why,
                       size_t wn) {
  if (!pol->files_dir) {
    snprintf(why, wn,
             "the server does not read local image files (start it with --allow-image-files DIR, or send "
             "the image as a data: URL)");
    return false;
  }
  if (url[0] == '/') return read_local(url, pol, out, len, why, wn);
  const char *p = url + 7; /* file://[localhost]/path */
  if (!strncmp(p, "localhost/", 10)) p += 9;
  if (*p != '/') {
    snprintf(why, wn, "a file: URL names no local absolute path");
    return false;
  }
  int n = 0;
  char *dec = curl_easy_unescape(NULL, p, 0, &n);
  if (!dec) {
    snprintf(why, wn, "cannot decode the file: URL");
    return false;
  }
  bool ok = (size_t)n == strlen(dec) ? read_local(dec, pol, out, len, why, wn)
                                     : (snprintf(why, wn, "the file: URL holds a NUL byte"), false);
  curl_free(dec);
  return ok;
}

/* the encoded bytes of one image URL; false with why set */
static bool image_bytes(const char *url, const sm_image_policy *pol, unsigned char **out, size_t *len, char *why,
                        size_t wn) {
  if (!strncmp(url, "data:", 5)) {
    const char *comma = strchr(url, ',');
    if (!comma) {
      snprintf(why, wn, "a data: URL without ','");
      return false;
    }
    const size_t hl = (size_t)(comma - url);
    if (hl < 12 || memcmp(comma - 7, ";base64", 7)) {
      snprintf(why, wn, "data: URLs of images must be base64 (data:image/...;base64,...)");
      return false;
    }
    const size_t dl = strlen(comma + 1);
    if (dl / 4 * 3 > pol->max_bytes) {
      snprintf(why, wn, "the image is larger than %zu bytes", pol->max_bytes);
      return false;
    }
    if (!sm_base64_decode(comma + 1, dl, out, len)) {
      snprintf(why, wn, "the data: URL is not valid base64");
      return false;
    }
    return true;
  }
  if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8)) {
    if (!pol->allow_urls) {
      snprintf(why, wn,
               "the server does not fetch image URLs (start it with --allow-image-urls, or send the image "
               "as a data: URL)");
      return false;
    }
    return fetch(url, pol, out, len, why, wn);
  }
  if (!strncmp(url, "file://", 7) || url[0] == '/') return local_file(url, pol, out, len, why, wn);
  snprintf(why, wn, "unsupported image URL '%.24s...' (data: URLs%s%s)", url, pol->allow_urls ? ", http(s)" : "",
           pol->files_dir ? ", local files" : "");
  return false;
}

bool sm_request_images(const sm_vision *v, const char *model_id, const char *why_none, const sm_image_policy *pol,
                       const sm_api_request *req, sm_vimage ***out, sm_api_error *err) {
  if (out) *out = NULL;
  const char *param = req->kind == SM_EP_RESPONSES ? "input" : "messages";
  if (!v) {
    sm_api_error_set(err, 400, "invalid_request_error", param, "model_not_multimodal",
                     "model '%s' does not accept images%s%s", model_id, why_none && *why_none ? ": " : "",
                     why_none ? why_none : "");
    return false;
  }
  sm_vimage **imgs = sm_xcalloc((size_t)req->n_images, sizeof *imgs);
  for (int i = 0; i < req->n_images; i++) {
    unsigned char *data = NULL;
    size_t len = 0;
    char why[256];
    bool ok = image_bytes(req->image_urls[i], pol, &data, &len, why, sizeof why);
    sm_image im = {0};
    if (ok && sm_image_decode(data, len, &pol->lim, &im)) {
      snprintf(why, sizeof why, "%s", sm_errmsg());
      ok = false;
    }
    free(data);
    if (ok && sm_vimage_new(v, &im, &imgs[i])) {
      snprintf(why, sizeof why, "%s", sm_errmsg());
      ok = false;
    }
    sm_image_free(&im);
    if (!ok) {
      sm_api_error_set(err, 400, "invalid_request_error", param, "invalid_image", "image %d: %s", i + 1, why);
      for (int k = 0; k < i; k++) sm_vimage_unref(imgs[k]);
      free(imgs);
      return false;
    }
  }
  *out = imgs;
  return true;
}
