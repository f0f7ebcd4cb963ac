/* Base utilities: errors, allocation, half floats, time, files (see base.h). */
#include "base/base.h"
#include "base/mapguard.h"
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
void *sm_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) oom(n);
  return p;
}
void *sm_xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz ? sz : 1);
  if (!p) oom(n * sz);
  return p;
}
void *sm_xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (!p) oom(n);
  return p;
}
char *sm_xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = sm_xmalloc(n);
  memcpy(d, s, n);
  return d;
}
void *sm_aligned_alloc(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64)) return NULL;
  return p;
}

float sm_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else { /* subnormal */ exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) u = sign | 0x7f800000 | (man << 13);
  else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  union {
    uint32_t u;
    float f;
  } v;
  v.u = u;
  return v.f;
}

uint16_t sm_f32_to_f16(float f) {
  union {
    uint32_t u;
    float f;
  } v;
  v.f = f;
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

/* open for reading without blocking on FIFOs; only regular files pass */
static int open_regular(const char *path, struct stat *st) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    sm_err(SMELT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  if (fstat(fd, st) != 0) {
    sm_err(SMELT_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    sm_err(SMELT_ERR_IO, "%s is not a regular file (%s)", path,
           S_ISFIFO(st->st_mode)   ? "a FIFO"
           : S_ISCHR(st->st_mode)  ? "a character device"
           : S_ISDIR(st->st_mode)  ? "a directory"
           : S_ISBLK(st->st_mode)  ? "a block device"
           : S_ISSOCK(st->st_mode) ? "a socket"
                                   : "not a file");
    close(fd);
    return -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

/* read exactly n bytes at offset 0; fails on a short file */
static smelt_status read_all(int fd, const char *path, char *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return sm_err(SMELT_ERR_IO, "error reading %s: %s", path, strerror(errno));
    if (r == 0) return sm_err(SMELT_ERR_IO, "%s shrank while being read", path);
    got += (size_t)r;
  }
  return SMELT_OK;
}

smelt_status sm_read_file_max(const char *path, size_t max_bytes, char **out, size_t *len) {
  struct stat st;
  int fd = open_regular(path, &st);
  if (fd < 0) return SMELT_ERR_IO;
  size_t n = (size_t)st.st_size;
  if (st.st_size < 0 || n > max_bytes) {
    close(fd);
    return sm_err(SMELT_ERR_LIMIT, "%s is too large (%lld bytes; the limit for this file is %zu)", path,
                  (long long)st.st_size, max_bytes);
  }
  char *buf = malloc(n + 1);
  if (!buf) {
    close(fd);
    return sm_err(SMELT_ERR_OOM, "out of memory reading %s (%zu bytes)", path, n);
  }
  smelt_status rc = read_all(fd, path, buf, n);
  close(fd);
  if (rc != SMELT_OK) {
    free(buf);
    return rc;
  }
  buf[n] = 0;
  *out = buf;
  if (len) *len = n;
  return SMELT_OK;
}

smelt_status sm_read_file(const char *path, char **out, size_t *len) {
  return sm_read_file_max(path, SM_FILE_MAX, out, len);
}

smelt_status sm_regular_or_absent(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return SMELT_OK;
  if (stat(path, &st) != 0) return sm_err(SMELT_ERR_IO, "%s is a broken symlink", path);
  if (!S_ISREG(st.st_mode)) {
    int fd = open_regular(path, &st); /* sets the error message */
    if (fd >= 0) close(fd);
    return SMELT_ERR_IO;
  }
  return SMELT_OK;
}

bool sm_file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
bool sm_dir_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

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
  struct stat st;
  int fd = open_regular(path, &st);
  if (fd < 0) return SMELT_ERR_IO;
  m->size = (size_t)st.st_size;
  if (m->size) {
    m->data = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->data == MAP_FAILED) {
      close(fd);
      m->data = NULL;
      return sm_err(SMELT_ERR_IO, "cannot mmap %s: %s", path, strerror(errno));
    }
    sm_mapguard_add(m->data, m->size, fd, path);
  }
  m->fd = fd;
  return SMELT_OK;
}

smelt_status sm_mmap_read(const char *path, sm_mmap *m) {
  memset(m, 0, sizeof *m);
  m->fd = -1;
  struct stat st;
  int fd = open_regular(path, &st);
  if (fd < 0) return SMELT_ERR_IO;
  m->size = (size_t)st.st_size;
  m->copied = true;
  m->data = sm_aligned_alloc(m->size);
  if (!m->data) {
    close(fd);
    return sm_err(SMELT_ERR_OOM, "out of memory reading %s into memory (%zu bytes)", path, m->size);
  }
  smelt_status rc = read_all(fd, path, m->data, m->size);
  close(fd);
  if (rc != SMELT_OK) {
    free(m->data);
    m->data = NULL;
  }
  return rc;
}

void sm_mmap_close(sm_mmap *m) {
  if (m->copied) free(m->data);
  else if (m->data) {
    sm_mapguard_remove(m->data);
    munmap(m->data, m->size);
  }
  if (m->fd >= 0) close(m->fd);
  memset(m, 0, sizeof *m);
  m->fd = -1;
}
