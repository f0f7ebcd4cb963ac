/* smelt internal base utilities: errors, half floats, timing, files. */
#ifndef SM_BASE_H
#define SM_BASE_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "smelt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Error reporting: functions return smelt_status; the message is kept per thread. */
smelt_status sm_err(smelt_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *sm_errmsg(void); /* last message of this thread ("" if none) */
void sm_err_clear(void);

/* Checked allocation: abort with a message on OOM (small, internal allocations). */
void *sm_xmalloc(size_t n);
void *sm_xcalloc(size_t n, size_t sz);
void *sm_xrealloc(void *p, size_t n);
char *sm_xstrdup(const char *s);
/* 64-byte aligned allocation; free with free(). NULL on failure. */
void *sm_aligned_alloc(size_t n);

/* half <-> float */
static inline float sm_bf16_to_f32(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = (uint32_t)h << 16;
  return v.f;
}
static inline uint16_t sm_f32_to_bf16(float f) {
  union {
    uint32_t u;
    float f;
  } v;
  v.f = f;
  if ((v.u & 0x7fffffff) > 0x7f800000) return (uint16_t)((v.u >> 16) | 0x40); /* NaN */
  uint32_t r = v.u + 0x7fff + ((v.u >> 16) & 1);                              /* RNE */
  return (uint16_t)(r >> 16);
}
float sm_f16_to_f32(uint16_t h);
uint16_t sm_f32_to_f16(float f);

/* monotonic seconds */
double sm_now(void);
/* peak resident set size in bytes (from getrusage) */
size_t sm_peak_rss(void);

/* Read a whole regular file into a NUL-terminated malloc'd buffer. Anything else (a FIFO, a
 * device, a directory; also through a symlink) is an error at once, as is a file larger than
 * max_bytes (sm_read_file: SM_FILE_MAX). */
#define SM_FILE_MAX ((size_t)256 << 20)     /* default cap: tokenizer.json and the like */
#define SM_FILE_MAX_JSON ((size_t)16 << 20) /* config.json, generation_config.json */
smelt_status sm_read_file(const char *path, char **out, size_t *len);
smelt_status sm_read_file_max(const char *path, size_t max_bytes, char **out, size_t *len);
bool sm_file_exists(const char *path);
/* SMELT_OK when path does not exist or is a regular file (also through a symlink); otherwise an
 * error naming it: an optional input that is a FIFO or a device is refused, not skipped. */
smelt_status sm_regular_or_absent(const char *path);
bool sm_dir_exists(const char *path);
/* path join into a malloc'd string */
char *sm_path_join(const char *a, const char *b);

/* Read-only memory map of a whole regular file. Mappings are registered with the map guard
 * (base/mapguard.h), which can catch faults when the file shrinks under the map. */
typedef struct {
  void *data;
  size_t size;
  int fd;
  bool copied;
} sm_mmap;
smelt_status sm_mmap_open(const char *path, sm_mmap *m);
/* The same, but the file is copied into (64-byte aligned) memory and closed: later changes
 * to the file cannot reach the data. */
smelt_status sm_mmap_read(const char *path, sm_mmap *m);
void sm_mmap_close(sm_mmap *m);

#define SM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define SM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#ifdef __cplusplus
}
#endif
#endif
