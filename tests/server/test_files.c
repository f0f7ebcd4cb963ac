/* Unit tests of the file helpers the server relies on (issue 33): loaders open regular files
 * only, with size limits, without blocking on a FIFO; the map guard turns a SIGBUS on a
 * truncated mapped file into a recorded fault, and notices a file changed in place; --no-mmap
 * copies are immune. A forked child shows what happens without the guard. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/base.h"
#include "base/mapguard.h"

static int fails = 0;
#define CHECK(c) \
  do { \
    if (!(c)) { \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
      fails++; \
    } \
  } while (0)

static char g_dir[256];

static char *path_of(const char *name) { return sm_path_join(g_dir, name); }

static void write_bytes(const char *p, size_t n, int seed) {
  FILE *f = fopen(p, "wb");
  for (size_t i = 0; i < n; i++) fputc((int)((i * 7 + (size_t)seed) & 0xff) | 1, f); /* never 0 */
  fclose(f);
}

static void test_loaders(void) {
  char *fifo = path_of("fifo.json"), *big = path_of("big.json"), *ok = path_of("ok.json"), *link = path_of("link.json");
  char *devlink = path_of("zero.json");
  CHECK(mkfifo(fifo, 0600) == 0);
  write_bytes(ok, 100, 0);
  write_bytes(big, 4096, 0);
  CHECK(symlink(ok, link) == 0);
  CHECK(symlink("/dev/zero", devlink) == 0);
  char *buf = NULL;
  size_t len = 0;
  double t0 = sm_now();
  CHECK(sm_read_file(fifo, &buf, &len) == SMELT_ERR_IO && strstr(sm_errmsg(), "not a regular file"));
  CHECK(sm_read_file(devlink, &buf, &len) == SMELT_ERR_IO && strstr(sm_errmsg(), "character device"));
  CHECK(sm_read_file(g_dir, &buf, &len) == SMELT_ERR_IO && strstr(sm_errmsg(), "directory"));
  sm_mmap m;
  CHECK(sm_mmap_open(fifo, &m) == SMELT_ERR_IO);
  CHECK(sm_mmap_read(devlink, &m) == SMELT_ERR_IO);
  CHECK(sm_now() - t0 < 0.5); /* nothing blocked */
  CHECK(sm_read_file_max(big, 4095, &buf, &len) == SMELT_ERR_LIMIT && strstr(sm_errmsg(), "too large"));
  CHECK(sm_read_file_max(big, 4096, &buf, &len) == SMELT_OK && len == 4096 && buf[4096] == 0);
  free(buf);
  CHECK(sm_read_file(link, &buf, &len) == SMELT_OK && len == 100); /* a link to a regular file is fine */
  free(buf);
  unlink(fifo);
  unlink(big);
  unlink(ok);
  unlink(link);
  unlink(devlink);
  free(fifo);
  free(big);
  free(ok);
  free(link);
  free(devlink);
}

/* sum of the bytes of a mapping (volatile: every page is read) */
static unsigned long sum_bytes(const void *p, size_t n) {
  const volatile unsigned char *c = p;
  unsigned long s = 0;
  for (size_t i = 0; i < n; i++) s += c[i];
  return s;
}

static void test_mapguard(void) {
  const size_t n = 64 * 4096;
  char *wf = path_of("weights.bin");
  char msg[512];

  /* without the guard, reading past the new end of a truncated mapped file kills the process */
  write_bytes(wf, n, 1);
  pid_t pid = fork();
  if (pid == 0) {
    sm_mmap m;
    if (sm_mmap_open(wf, &m)) _exit(10);
    if (truncate(wf, (off_t)n / 4)) _exit(11);
    sum_bytes(m.data, m.size);
    _exit(0);
  }
  int ws = 0;
  waitpid(pid, &ws, 0);
  /* killed by SIGBUS (or, in a sanitizer build, by the sanitizer's report of it) */
  CHECK((WIFSIGNALED(ws) && WTERMSIG(ws) == SIGBUS) ||
        (WIFEXITED(ws) && WEXITSTATUS(ws) != 0 && WEXITSTATUS(ws) != 10 && WEXITSTATUS(ws) != 11));

  /* with the guard: the read completes (zeros past the end), the fault is recorded */
  write_bytes(wf, n, 1);
  sm_mapguard_install();
  sm_mmap m;
  CHECK(sm_mmap_open(wf, &m) == SMELT_OK);
  unsigned long before = sum_bytes(m.data, m.size);
  CHECK(!sm_mapguard_check(msg, sizeof msg));
  CHECK(truncate(wf, (off_t)n / 4) == 0);
  unsigned long after = sum_bytes(m.data, m.size);
  CHECK(after < before && after > 0);                             /* the first quarter still reads */
  CHECK(sum_bytes((const char *)m.data + n / 4, n - n / 4) == 0); /* the rest reads as zeros */
  CHECK(sm_mapguard_check(msg, sizeof msg));
  CHECK(strstr(msg, "weights.bin") && strstr(msg, "changed size") && strstr(msg, "read faults"));
  sm_mmap_close(&m);
  CHECK(!sm_mapguard_check(msg, sizeof msg)); /* closed: forgotten */

  /* a file overwritten in place (same size) is noticed by its modification time */
  write_bytes(wf, n, 1);
  CHECK(sm_mmap_open(wf, &m) == SMELT_OK);
  CHECK(!sm_mapguard_check(msg, sizeof msg));
  struct timespec ts[2] = {{0, UTIME_OMIT}, {1, 0}}; /* as if written (another mtime) */
  int fd = open(wf, O_WRONLY);
  CHECK(fd >= 0 && pwrite(fd, "xyz", 3, 100) == 3 && futimens(fd, ts) == 0);
  close(fd);
  CHECK(sm_mapguard_check(msg, sizeof msg) && strstr(msg, "modified in place"));
  sm_mmap_close(&m);

  /* --no-mmap: a copy; the file can change under it */
  write_bytes(wf, n, 2);
  CHECK(sm_mmap_read(wf, &m) == SMELT_OK && m.copied && m.size == n);
  before = sum_bytes(m.data, m.size);
  CHECK(truncate(wf, 0) == 0);
  CHECK(sum_bytes(m.data, m.size) == before);
  CHECK(!sm_mapguard_check(msg, sizeof msg));
  sm_mmap_close(&m);
  unlink(wf);
  free(wf);
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/smelt-test-files-XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_loaders();
  test_mapguard();
  rmdir(g_dir);
  if (fails) {
    fprintf(stderr, "%d checks failed\n", fails);
    return 1;
  }
  printf("server files: all checks passed\n");
  return 0;
}
