#include "base/base.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char g_err[1024];

smelt_status sm_err(smelt_status code, const char *fmt, ...) {
  /* formatted aside first: the arguments may point into g_err (sm_err(c, "...: %s", sm_errmsg())) */
  char msg[sizeof g_err];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(g_err, msg, sizeof g_err);
  return code;
}
const char *sm_errmsg(void) { return g_err; }
void sm_err_clear(void) { g_err[0] = 0; }

const char *smelt_last_error(void) { return g_err; }

const char *smelt_status_str(smelt_status s) {
  switch (s) {
  case SMELT_OK: return "ok";
  case SMELT_ERR_IO: return "I/O error";
  case SMELT_ERR_FORMAT: return "bad format";
  case SMELT_ERR_UNSUPPORTED: return "unsupported";
  case SMELT_ERR_OOM: return "out of memory";
  case SMELT_ERR_INVALID: return "invalid argument";
  case SMELT_ERR_BACKEND: return "backend error";
  case SMELT_ERR_NOT_FOUND: return "not found";
  case SMELT_ERR_LIMIT: return "limit exceeded";
  case SMELT_ERR_CANCELLED: return "cancelled";
  }
  return "unknown error";
}

static void oom(size_t n) {
  fprintf(stderr, "smelt: out of memory allocating %zu bytes\n", n);
  abort();
}
void *sm_xmalloc(size_t n) { void *p = malloc(n ? n : 1); if (!p) oom(n); return p; }
void *sm_xcalloc(size_t n, size_t sz) { void *p = calloc(n ? n : 1, sz ? sz : 1); if (!p) oom(n * sz); return p; }
void *sm_xrealloc(void *p, size_t n) { p = realloc(p, n ? n : 1); if (!p) oom(n); return p; }
char *sm_xstrdup(const char *s) { size_t n = strlen(s) + 1; char *d = sm_xmalloc(n); memcpy(d, s, n); return d; }
void *sm_aligned_alloc(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64)) return NULL;
  return p;
}

float sm_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else { /* subnormal */
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) u = sign | 0x7f800000 | (man << 13);
  else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  union { uint32_t u; float f; } v; v.u = u; return v.f;
}

uint16_t sm_f32_to_f16(float f) {
  union { uint32_t u; float f; } v; v.f = f;
  uint32_t x = v.u, sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

double sm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t sm_peak_rss(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (size_t)ru.ru_maxrss * 1024;
}

smelt_status sm_read_file(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return sm_err(SMELT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = sm_xmalloc(cap);
  for (;;) {
    if (n + 1 >= cap) { cap *= 2; buf = sm_xrealloc(buf, cap); }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) { free(buf); return sm_err(SMELT_ERR_IO, "error reading %s", path); }
  buf[n] = 0;
  *out = buf;
  if (len) *len = n;
  return SMELT_OK;
}

bool sm_file_exists(const char *path) { struct stat st; return stat(path, &st) == 0 && S_ISREG(st.st_mode); }
bool sm_dir_exists(const char *path) { struct stat st; return stat(path, &st) == 0 && S_ISDIR(st.st_mode); }

char *sm_path_join(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *p = sm_xmalloc(la + lb + 2);
  memcpy(p, a, la);
  size_t o = la;
  if (la && a[la - 1] != '/') p[o++] = '/';
  memcpy(p + o, b, lb + 1);
  return p;
}

smelt_status sm_mmap_open(const char *path, sm_mmap *m) {
  memset(m, 0, sizeof *m);
  m->fd = -1;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return sm_err(SMELT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) { close(fd); return sm_err(SMELT_ERR_IO, "cannot stat %s", path); }
  m->size = (size_t)st.st_size;
  if (m->size) {
    m->data = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->data == MAP_FAILED) { close(fd); m->data = NULL; return sm_err(SMELT_ERR_IO, "cannot mmap %s: %s", path, strerror(errno)); }
  }
  m->fd = fd;
  return SMELT_OK;
}

void sm_mmap_close(sm_mmap *m) {
  if (m->data) munmap(m->data, m->size);
  if (m->fd >= 0) close(m->fd);
  memset(m, 0, sizeof *m);
  m->fd = -1;
}
