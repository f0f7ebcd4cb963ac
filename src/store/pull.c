/* Hugging Face hub downloads: list the repo through the API, fetch the files a model
 * needs into <store>/.tmp/<owner>--<name>/ (resumable .part files, size and sha256
 * checks), then rename the folder into place. */
#include "store/store.h"
#include "store/store_internal.h"
#include "base/strbuf.h"
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  char *path;
  uint64_t size;
  bool has_size;
  char sha256[65]; /* "" when the hub gave none (non-LFS files) */
} hub_file;

/* a file the listing gives no size for is not allowed to be larger than this */
#define SM_PULL_MAX_UNLISTED ((uint64_t)64 << 20)

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *endpoint(void) {
  const char *e = sm_store_settings_get()->hf_endpoint;
  char *s = sm_xstrdup(e ? e : "https://huggingface.co");
  size_t l = strlen(s);
  while (l && s[l - 1] == '/') s[--l] = 0;
  return s;
}

/* the hf_token setting (HF_TOKEN), else the token file `huggingface-cli login` writes. */
static char *hf_token(void) {
  const sm_store_settings *set = sm_store_settings_get();
  if (set->hf_token) return sm_xstrdup(set->hf_token);
  char *p;
  if (set->hf_home) p = sm_path_join(set->hf_home, "token");
  else if (set->home) p = sm_path_join(set->home, ".cache/huggingface/token");
  else return NULL;
  char *txt = NULL;
  if (sm_read_file(p, &txt, NULL) != SMELT_OK) {
    free(p);
    sm_err_clear();
    return NULL;
  }
  free(p);
  size_t l = strlen(txt);
  while (l && (txt[l - 1] == '\n' || txt[l - 1] == '\r' || txt[l - 1] == ' ')) txt[--l] = 0;
  if (!l) {
    free(txt);
    return NULL;
  }
  return txt;
}

static struct curl_slist *auth_headers(const char *token) {
  struct curl_slist *h = NULL;
  if (token) {
    size_t l = strlen(token) + 32;
    char *a = sm_xmalloc(l);
    snprintf(a, l, "Authorization: Bearer %s", token);
    h = curl_slist_append(h, a);
    free(a);
  }
  return h;
}

static void curl_common(CURL *c, struct curl_slist *hdr, char *errbuf) {
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  /* the hub sends file downloads to its CDN: follow that, but only to https (a redirect to
   * plain http, file:, ... fails the transfer) */
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "https");
  curl_easy_setopt(c, CURLOPT_USERAGENT, "smelt/" SMELT_VERSION);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L); /* abort a stalled transfer ... */
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L); /* ... after 60 s without data */
  errbuf[0] = 0;
}

/* ---- API listing ---- */
static size_t mem_write(char *d, size_t sz, size_t nm, void *u) {
  sm_buf *m = u;
  size_t n = sz * nm;
  if (m->n + n > (64u << 20)) return 0; /* a listing is never this large */
  sm_buf_put(m, d, n);
  return n;
}

static bool wanted_file(const char *f) {
  if (!*f || strchr(f, '/') || strchr(f, '\\') || f[0] == '.') return false;
  for (const char *p = f; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
          *p == '.'))
      return false;
  const char *dot = strrchr(f, '.');
  const char *ext = dot ? dot : "";
  static const char *bad[] = {".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".onnx", ".ot", ".npz"};
  for (size_t i = 0; i < SM_ARRAY_LEN(bad); i++)
    if (strcmp(ext, bad[i]) == 0) return false;
  static const char *good[] = {".safetensors", ".json", ".jinja", ".txt", ".tiktoken", ".model"};
  for (size_t i = 0; i < SM_ARRAY_LEN(good); i++)
    if (strcmp(ext, good[i]) == 0) return true;
  return strncmp(f, "tokenizer", 9) == 0;
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static bool is_hex64(const char *s) {
  if (strlen(s) != 64) return false;
  for (int i = 0; i < 64; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

/* A revision that may go into a URL path: a commit id (hex) or a branch / tag name made of
 * [A-Za-z0-9._-] segments separated by '/' (refs/pr/1), no empty, '.' or '..' segment. */
static bool safe_revision(const char *r) {
  size_t n = strlen(r);
  if (n == 0 || n > 128) return false;
  const char *seg = r;
  for (const char *p = r;; p++) {
    if (*p == '/' || !*p) {
      size_t l = (size_t)(p - seg);
      if (l == 0 || (l == 1 && seg[0] == '.') || (l == 2 && seg[0] == '.' && seg[1] == '.')) return false;
      if (!*p) return true;
      seg = p + 1;
      continue;
    }
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' ||
          *p == '-'))
      return false;
  }
}

/* Accepts /api/models/{repo}/revision/{rev}?blobs=true ({"sha", "siblings": [{"rfilename",
 * "size", "lfs": {"sha256", "size"}}]}) and /api/models/{repo}/tree/{rev} ([{"type", "path",
 * "size", "lfs": {"oid", "size"}}]). */
static smelt_status parse_listing(const char *txt, const char *repo, hub_file **out, size_t *n, char **rev) {
  cJSON *j = cJSON_Parse(txt);
  if (!j) return sm_err(SMELT_ERR_FORMAT, "hub answered with invalid JSON for %s", repo);
  cJSON *arr = cJSON_IsArray(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "siblings");
  if (!cJSON_IsArray(arr)) {
    cJSON_Delete(j);
    return sm_err(SMELT_ERR_FORMAT, "hub listing of %s has no files", repo);
  }
  cJSON *sha = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "sha") : NULL;
  if (cJSON_IsString(sha) && sha->valuestring[0] && !safe_revision(sha->valuestring)) {
    char shown[80];
    snprintf(shown, sizeof shown, "%s", sha->valuestring);
    for (char *p = shown; *p; p++)
      if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
    cJSON_Delete(j);
    return sm_err(SMELT_ERR_FORMAT,
                  "the hub listed an invalid revision '%s' for %s (expected a commit id or a "
                  "branch name)",
                  shown, repo);
  }
  *rev = sm_xstrdup(cJSON_IsString(sha) ? sha->valuestring : "");
  hub_file *v = NULL;
  size_t k = 0, cap = 0;
  cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "rfilename");
    if (!cJSON_IsString(nm)) nm = cJSON_GetObjectItemCaseSensitive(e, "path");
    cJSON *ty = cJSON_GetObjectItemCaseSensitive(e, "type");
    if (!cJSON_IsString(nm) || (cJSON_IsString(ty) && strcmp(ty->valuestring, "file") != 0)) continue;
    if (!wanted_file(nm->valuestring)) continue;
    if (k == cap) {
      cap = cap ? cap * 2 : 16;
      v = sm_xrealloc(v, cap * sizeof *v);
    }
    hub_file *f = &v[k++];
    memset(f, 0, sizeof *f);
    f->path = sm_xstrdup(nm->valuestring);
    cJSON *lfs = cJSON_GetObjectItemCaseSensitive(e, "lfs");
    cJSON *sz = cJSON_GetObjectItemCaseSensitive(e, "size");
    if (cJSON_IsObject(lfs)) {
      cJSON *ls = cJSON_GetObjectItemCaseSensitive(lfs, "size");
      if (cJSON_IsNumber(ls)) sz = ls;
      cJSON *h = cJSON_GetObjectItemCaseSensitive(lfs, "sha256");
      if (!cJSON_IsString(h)) h = cJSON_GetObjectItemCaseSensitive(lfs, "oid");
      if (cJSON_IsString(h)) {
        const char *hs = h->valuestring;
        if (strncmp(hs, "sha256:", 7) == 0) hs += 7;
        if (is_hex64(hs)) memcpy(f->sha256, hs, 65);
      }
    }
    if (cJSON_IsNumber(sz) && sz->valuedouble >= 0) {
      f->size = (uint64_t)sz->valuedouble;
      f->has_size = true;
    }
  }
  cJSON_Delete(j);
  bool cfg = false, st = false;
  for (size_t i = 0; i < k; i++) {
    if (strcmp(v[i].path, "config.json") == 0) cfg = true;
    if (ends_with(v[i].path, ".safetensors")) st = true;
  }
  if (!cfg || !st) {
    for (size_t i = 0; i < k; i++) free(v[i].path);
    free(v);
    free(*rev);
    *rev = NULL;
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s has no %s: smelt needs an MLX/safetensors checkpoint "
                  "(try an mlx-community/... repo)",
                  repo, cfg ? "*.safetensors weights" : "config.json");
  }
  *out = v;
  *n = k;
  return SMELT_OK;
}

static smelt_status http_error(long code, const char *what, const char *repo, const char *ep, bool had_token) {
  if (code == 401 || code == 403)
    return sm_err(SMELT_ERR_IO, "access to %s denied by %s (HTTP %ld): %s", repo, ep, code,
                  had_token ? "the token in HF_TOKEN has no access to this repo (gated model? accept its license "
                              "on the hub)"
                            : "the repo is private or gated, or does not exist; set HF_TOKEN to a hub access token");
  if (code == 404) return sm_err(SMELT_ERR_NOT_FOUND, "%s not found on %s (HTTP 404)", what, ep);
  return sm_err(SMELT_ERR_IO, "%s: HTTP %ld from %s", what, code, ep);
}

static smelt_status fetch_listing(const char *ep, const char *repo, const char *token, hub_file **files, size_t *n,
                                  char **rev) {
  CURL *c = curl_easy_init();
  if (!c) return sm_err(SMELT_ERR_IO, "curl init failed");
  size_t l = strlen(ep) + strlen(repo) + 64;
  char *url = sm_xmalloc(l);
  snprintf(url, l, "%s/api/models/%s/revision/main?blobs=true", ep, repo);
  struct curl_slist *hdr = auth_headers(token);
  char errbuf[CURL_ERROR_SIZE];
  sm_buf mb = SM_BUF_INIT;
  smelt_status s = SMELT_OK;
  for (int attempt = 0; attempt < 3; attempt++) {
    if (attempt) {
      struct timespec ts = {0, 300000000L};
      nanosleep(&ts, NULL);
    }
    sm_buf_clear(&mb);
    curl_easy_reset(c);
    curl_common(c, hdr, errbuf);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, mem_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &mb);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    if (rc != CURLE_OK) {
      s = sm_err(SMELT_ERR_IO, "cannot reach %s: %s", ep, errbuf[0] ? errbuf : curl_easy_strerror(rc));
      continue;
    }
    if (code >= 500) {
      s = http_error(code, repo, repo, ep, token != NULL);
      continue;
    }
    if (code != 200) {
      char what[300];
      snprintf(what, sizeof what, "model repo %s", repo);
      s = http_error(code, what, repo, ep, token != NULL);
      break;
    }
    s = parse_listing(sm_buf_str(&mb), repo, files, n, rev);
    break;
  }
  sm_buf_free(&mb);
  curl_slist_free_all(hdr);
  curl_easy_cleanup(c);
  free(url);
  return s;
}

/* ---- progress ---- */
typedef struct {
  bool on;
  bool verbose;         /* progress requested (messages even without a TTY) */
  uint64_t total, done; /* done: bytes of finished files */
  uint64_t session;     /* bytes received in this run (for the rate) */
  double t0, last;
  const char *file;
} progress;

static void draw(progress *p, uint64_t now_bytes, bool final) {
  if (!p->on) return;
  double t = sm_now();
  if (!final && t - p->last < 0.1) return;
  p->last = t;
  uint64_t cur = p->done + now_bytes;
  double frac = p->total ? (double)cur / (double)p->total : 0;
  if (frac > 1) frac = 1;
  int w = 30, fill = (int)(frac * w);
  char bar[64];
  for (int i = 0; i < w; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
  bar[w] = 0;
  char a[32], b[32];
  double rate = (t - p->t0) > 0 ? (double)p->session / (t - p->t0) : 0;
  fprintf(stderr, "\r[%s] %3d%% %s / %s %6.1f MiB/s %-28.28s", bar, (int)(frac * 100), sm_store_fmt_bytes(cur, a, 32),
          sm_store_fmt_bytes(p->total, b, 32), rate / 1048576.0, p->file ? p->file : "");
  if (final) fputc('\n', stderr);
  fflush(stderr);
}

/* ---- one file ---- */
typedef struct {
  FILE *fp;
  CURL *c;
  sm_sha256 sha;
  uint64_t have;     /* bytes in the file */
  uint64_t limit;    /* never more than this: the listed size */
  uint64_t junk;     /* bytes of an error body */
  bool started, bad; /* bad: HTTP error body, not written */
  bool restart;      /* server ignored Range: file truncated */
  bool over;         /* the server sent more than the listed size: stopped */
  progress *pg;
  uint64_t attempt_base;
} dl_ctx;

static size_t file_write(char *d, size_t sz, size_t nm, void *u) {
  dl_ctx *x = u;
  size_t n = sz * nm;
  if (!x->started) {
    x->started = true;
    long code = 0;
    curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 400) x->bad = true;
    else if (code == 200 && x->have > 0) { /* full body: start over */
      if (fflush(x->fp) != 0 || ftruncate(fileno(x->fp), 0) != 0) return 0;
      rewind(x->fp);
      x->have = 0;
      sm_sha256_init(&x->sha);
      x->restart = true;
    }
  }
  if (x->bad) { /* an error body: ignored, and not an endless one */
    x->junk += n;
    return x->junk <= (1u << 20) ? n : 0;
  }
  if (x->have + n > x->limit) { /* more than the hub listed: stop before writing it */
    x->over = true;
    return 0;
  }
  if (fwrite(d, 1, n, x->fp) != n) return 0;
  sm_sha256_update(&x->sha, d, n);
  x->have += n;
  x->pg->session += n;
  return n;
}

static int xferinfo(void *u, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal;
  (void)ultotal;
  (void)ulnow;
  (void)dlnow;
  dl_ctx *x = u;
  if (x->pg->on) draw(x->pg, x->have, false);
  return 0;
}

/* Hash the bytes already in fp (a resumed .part). */
static bool hash_prefix(FILE *fp, sm_sha256 *sha, uint64_t *have) {
  rewind(fp);
  sm_sha256_init(sha);
  char *buf = sm_xmalloc(1 << 20);
  uint64_t n = 0;
  size_t r;
  while ((r = fread(buf, 1, 1 << 20, fp)) > 0) {
    sm_sha256_update(sha, buf, r);
    n += r;
  }
  bool ok = !ferror(fp);
  free(buf);
  *have = n;
  fseek(fp, 0, SEEK_END);
  return ok;
}

/* Download url into `part` (resuming), verify, rename to `final`. *fatal set for errors
 * that must discard the partial download (checksum/size mismatch). */
static smelt_status download_file(CURL *c, const char *url, struct curl_slist *hdr, const hub_file *f, const char *part,
                                  const char *final, progress *pg, const char *ep, bool token, bool *fatal) {
  *fatal = false;
  const int retries = sm_store_settings_get()->pull_retries >= 0 ? sm_store_settings_get()->pull_retries : 5;
  smelt_status s = SMELT_OK;
  char errbuf[CURL_ERROR_SIZE];
  pg->file = f->path;
  for (int attempt = 0; attempt <= retries; attempt++) {
    if (attempt > 0) {
      struct timespec ts = {0, (long)SM_MIN(attempt, 10) * 200000000L};
      while (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      nanosleep(&ts, NULL);
    }
    FILE *fp = fopen(part, "a+b");
    if (!fp) return sm_err(SMELT_ERR_IO, "cannot write %s: %s", part, strerror(errno));
    dl_ctx x = {.fp = fp, .c = c, .pg = pg, .limit = f->has_size ? f->size : SM_PULL_MAX_UNLISTED};
    if (!hash_prefix(fp, &x.sha, &x.have)) {
      fclose(fp);
      return sm_err(SMELT_ERR_IO, "cannot read %s", part);
    }
    if (f->has_size && x.have > f->size) { /* garbage: start over */
      if (ftruncate(fileno(fp), 0) != 0) {
        fclose(fp);
        return sm_err(SMELT_ERR_IO, "cannot truncate %s", part);
      }
      rewind(fp);
      sm_sha256_init(&x.sha);
      x.have = 0;
    }
    long code = 200;
    CURLcode rc = CURLE_OK;
    if (!(f->has_size && x.have == f->size)) {
      curl_easy_reset(c);
      curl_common(c, hdr, errbuf);
      curl_easy_setopt(c, CURLOPT_URL, url);
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, file_write);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
      curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, xferinfo);
      curl_easy_setopt(c, CURLOPT_XFERINFODATA, &x);
      char range[48];
      if (x.have > 0) {
        snprintf(range, sizeof range, "%llu-", (unsigned long long)x.have);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
      }
      rc = curl_easy_perform(c);
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    }
    bool wr_ok = fflush(fp) == 0;
    fclose(fp);
    if (!wr_ok) return sm_err(SMELT_ERR_IO, "cannot write %s: %s", part, strerror(errno));
    if (code == 416) { /* range past the end: the part is stale; start over */
      unlink(part);
      s = sm_err(SMELT_ERR_IO, "%s: server refused to resume (HTTP 416)", f->path);
      continue;
    }
    if (code == 401 || code == 403 || code == 404) {
      char what[600];
      snprintf(what, sizeof what, "file %s", url);
      return http_error(code, what, f->path, ep, token);
    }
    if (x.over) {
      *fatal = true;
      if (f->has_size)
        return sm_err(SMELT_ERR_FORMAT, "%s: the hub sent more than the %llu bytes it lists; download stopped", f->path,
                      (unsigned long long)f->size);
      return sm_err(SMELT_ERR_LIMIT, "%s: no size listed and more than %llu bytes sent; download stopped", f->path,
                    (unsigned long long)SM_PULL_MAX_UNLISTED);
    }
    if (rc == CURLE_TOO_MANY_REDIRECTS || rc == CURLE_UNSUPPORTED_PROTOCOL) {
      *fatal = true;
      return sm_err(SMELT_ERR_IO, "download of %s refused: %s (redirects are followed only to https)", f->path,
                    errbuf[0] ? errbuf : curl_easy_strerror(rc));
    }
    if (rc == CURLE_WRITE_ERROR) return sm_err(SMELT_ERR_IO, "cannot write %s: disk full?", part);
    if (rc != CURLE_OK || code >= 400) {
      if (rc != CURLE_OK)
        s = sm_err(SMELT_ERR_IO, "download of %s interrupted after %llu bytes: %s", f->path, (unsigned long long)x.have,
                   errbuf[0] ? errbuf : curl_easy_strerror(rc));
      else s = sm_err(SMELT_ERR_IO, "download of %s failed: HTTP %ld", f->path, code);
      if (pg->verbose && attempt < retries) {
        if (pg->on) fputc('\n', stderr);
        fprintf(stderr, "%s; retrying (%d/%d)\n", sm_errmsg(), attempt + 1, retries);
      }
      continue; /* retry, resuming from what we have */
    }
    if (f->has_size && x.have != f->size) {
      if (x.have < f->size) { /* short body without a transport error: resume */
        s = sm_err(SMELT_ERR_IO, "download of %s stopped at %llu of %llu bytes", f->path, (unsigned long long)x.have,
                   (unsigned long long)f->size);
        continue;
      }
      *fatal = true;
      return sm_err(SMELT_ERR_FORMAT, "size mismatch for %s: got %llu bytes, the hub lists %llu", f->path,
                    (unsigned long long)x.have, (unsigned long long)f->size);
    }
    uint8_t dg[32];
    char hex[65];
    sm_sha256_final(&x.sha, dg);
    sm_sha256_hex(dg, hex);
    if (f->sha256[0] && strcmp(hex, f->sha256) != 0) {
      *fatal = true;
      return sm_err(SMELT_ERR_FORMAT,
                    "sha256 mismatch for %s: expected %s, got %s (corrupt download; nothing was "
                    "stored)",
                    f->path, f->sha256, hex);
    }
    if (rename(part, final) != 0) return sm_err(SMELT_ERR_IO, "cannot rename %s: %s", part, strerror(errno));
    pg->done += x.have;
    return SMELT_OK;
  }
  return s;
}

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st;
  (void)f;
  return (flag == FTW_DP ? rmdir(p) : unlink(p)) ? -1 : 0;
}
static void rm_rf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static bool mkdir_p(const char *path) {
  char *p = sm_xstrdup(path);
  for (char *s = p + 1; *s; s++) {
    if (*s == '/') {
      *s = 0;
      if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        free(p);
        return false;
      }
      *s = '/';
    }
  }
  bool ok = mkdir(p, 0755) == 0 || errno == EEXIST;
  free(p);
  return ok && sm_dir_exists(path);
}

smelt_status sm_store_pull(const char *ref, bool show_progress, char **dir) {
  if (dir) *dir = NULL;
  char *owner, *name;
  smelt_status s = sm_store_parse_ref(ref, &owner, &name);
  if (s) return s;
  pthread_once(&g_curl_once, curl_init_once);
  char repo[512];
  snprintf(repo, sizeof repo, "%s/%s", owner, name);
  char *ep = endpoint(), *token = hf_token();
  hub_file *files = NULL;
  size_t nf = 0;
  char *rev = NULL;
  char *root = sm_store_root(), *tmproot = sm_path_join(root, ".tmp");
  char tmpname[520];
  snprintf(tmpname, sizeof tmpname, "%s--%s", owner, name);
  char *tmp = sm_path_join(tmproot, tmpname);
  char lockname[540];
  snprintf(lockname, sizeof lockname, "%s.lock", tmpname);
  char *lockp = sm_path_join(tmproot, lockname);
  char *ownerdir = sm_path_join(root, owner), *dest = sm_path_join(ownerdir, name);
  int lockfd = -1;
  bool keep_tmp = false; /* keep partial downloads for a later resume */
  CURL *c = NULL;
  struct curl_slist *hdr = NULL;

  s = fetch_listing(ep, repo, token, &files, &nf, &rev);
  if (s) goto done;
  { /* already up to date? */
    char *mp = sm_path_join(dest, ".smelt-pull.json"), *txt = NULL;
    bool same = false;
    if (rev && *rev && sm_read_file(mp, &txt, NULL) == SMELT_OK) {
      cJSON *m = cJSON_Parse(txt);
      cJSON *r = m ? cJSON_GetObjectItemCaseSensitive(m, "revision") : NULL;
      same = cJSON_IsString(r) && strcmp(r->valuestring, rev) == 0;
      cJSON_Delete(m);
      free(txt);
    }
    sm_err_clear();
    free(mp);
    if (same) {
      if (show_progress) fprintf(stderr, "%s is up to date (%s)\n", repo, rev);
      if (dir) {
        *dir = dest;
        dest = NULL;
      }
      keep_tmp = true; /* leave the store untouched */
      goto done;
    }
  }
  if (!mkdir_p(tmproot)) {
    s = sm_err(SMELT_ERR_IO, "cannot create %s: %s", tmproot, strerror(errno));
    goto done;
  }
  lockfd = open(lockp, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lockfd < 0 || flock(lockfd, LOCK_EX | LOCK_NB) != 0) {
    s = sm_err(SMELT_ERR_IO, "another smelt is downloading %s (lock %s)", repo, lockp);
    if (lockfd >= 0) {
      close(lockfd);
      lockfd = -1;
    }
    keep_tmp = true;
    goto done;
  }
  if (!mkdir_p(tmp)) {
    s = sm_err(SMELT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    goto done;
  }
  progress pg = {.on = show_progress && isatty(2), .verbose = show_progress, .t0 = sm_now()};
  for (size_t i = 0; i < nf; i++) pg.total += files[i].size;
  if (show_progress) {
    char b[32];
    fprintf(stderr, "pulling %s from %s: %zu files, %s\n", repo, ep, nf, sm_store_fmt_bytes(pg.total, b, sizeof b));
  }
  c = curl_easy_init();
  hdr = auth_headers(token);
  if (!c) {
    s = sm_err(SMELT_ERR_IO, "curl init failed");
    goto done;
  }
  for (size_t i = 0; i < nf; i++) {
    const hub_file *f = &files[i];
    char *final = sm_path_join(tmp, f->path);
    sm_buf pb = SM_BUF_INIT;
    sm_buf_puts(&pb, final);
    sm_buf_puts(&pb, ".part");
    char *part = sm_buf_take(&pb);
    struct stat st;
    if (stat(final, &st) == 0 && (!f->has_size || (uint64_t)st.st_size == f->size) && !f->sha256[0]) {
      pg.done += (uint64_t)st.st_size; /* finished in an earlier run (sha-less files only: re-verify the rest) */
      free(final);
      free(part);
      continue;
    }
    if (stat(final, &st) == 0) rename(final, part); /* re-verify through the .part path */
    size_t ul = strlen(ep) + strlen(repo) + strlen(f->path) + (rev ? 3 * strlen(rev) : 0) + 32;
    char *url = sm_xmalloc(ul);
    char rev_enc[3 * 128 + 1] = "main"; /* a branch's '/' goes into the path as %2F */
    if (rev && *rev) {
      size_t o = 0;
      for (const char *q = rev; *q && o + 4 < sizeof rev_enc; q++) {
        if (*q == '/') {
          memcpy(rev_enc + o, "%2F", 3);
          o += 3;
        } else rev_enc[o++] = *q;
      }
      rev_enc[o] = 0;
    }
    snprintf(url, ul, "%s/%s/resolve/%s/%s", ep, repo, rev_enc, f->path);
    bool fatal = false;
    s = download_file(c, url, hdr, f, part, final, &pg, ep, token != NULL, &fatal);
    free(url);
    free(final);
    free(part);
    if (s) {
      if (pg.on) fputc('\n', stderr);
      keep_tmp = !fatal;
      goto done;
    }
  }
  draw(&pg, 0, true);
  /* provenance, then the atomic switch */
  {
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "repo", repo);
    cJSON_AddStringToObject(meta, "revision", rev ? rev : "");
    cJSON_AddStringToObject(meta, "endpoint", ep);
    cJSON_AddNumberToObject(meta, "pulled_at", (double)time(NULL));
    char *txt = cJSON_Print(meta);
    cJSON_Delete(meta);
    char *mp = sm_path_join(tmp, ".smelt-pull.json");
    FILE *mf = fopen(mp, "wb");
    if (mf) {
      fputs(txt, mf);
      fclose(mf);
    }
    free(mp);
    free(txt);
  }
  if (!mkdir_p(ownerdir)) {
    s = sm_err(SMELT_ERR_IO, "cannot create %s: %s", ownerdir, strerror(errno));
    keep_tmp = true;
    goto done;
  }
  if (sm_dir_exists(dest)) { /* replacing an older copy */
    size_t ol = strlen(tmp) + 8;
    char *old = sm_xmalloc(ol);
    snprintf(old, ol, "%s.old", tmp);
    rm_rf(old);
    if (rename(dest, old) != 0) {
      s = sm_err(SMELT_ERR_IO, "cannot replace %s: %s", dest, strerror(errno));
      free(old);
      keep_tmp = true;
      goto done;
    }
    if (rename(tmp, dest) != 0) {
      s = sm_err(SMELT_ERR_IO, "cannot move the download into %s: %s", dest, strerror(errno));
      rename(old, dest);
      free(old);
      keep_tmp = true;
      goto done;
    }
    rm_rf(old);
    free(old);
  } else if (rename(tmp, dest) != 0) {
    s = sm_err(SMELT_ERR_IO, "cannot move the download into %s: %s", dest, strerror(errno));
    keep_tmp = true;
    goto done;
  }
  if (show_progress) fprintf(stderr, "%s -> %s\n", repo, dest);
  if (dir) {
    *dir = dest;
    dest = NULL;
  }

done:
  if (!keep_tmp && sm_dir_exists(tmp)) rm_rf(tmp);
  if (lockfd >= 0) {
    if (!keep_tmp) unlink(lockp);
    close(lockfd);
  }
  if (!keep_tmp) {
    rmdir(tmproot);
    rmdir(root);
  } /* only if empty */
  if (hdr) curl_slist_free_all(hdr);
  if (c) curl_easy_cleanup(c);
  for (size_t i = 0; i < nf; i++) free(files[i].path);
  free(files);
  free(rev);
  free(ep);
  free(token);
  free(root);
  free(tmproot);
  free(tmp);
  free(lockp);
  free(ownerdir);
  free(dest);
  free(owner);
  free(name);
  return s;
}
