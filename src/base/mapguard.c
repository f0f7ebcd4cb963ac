/* Map guard (see mapguard.h). Hand-written: the SIGBUS recovery of a memory-mapped file is
 * a few system calls that no Debian library offers.
 *
 * The registry is a fixed array of slots; a slot is filled, then published by setting its
 * `state` (atomic), so that the signal handler can read it without locks. The handler maps an
 * anonymous zero page over the faulting page (mmap with MAP_FIXED is a plain system call, as
 * the handler needs) and returns; the instruction is retried and reads zeros. */
#include "base/mapguard.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_MAPS 256

typedef struct {
  atomic_int state; /* 0 free, 1 being filled or emptied, 2 active */
  uintptr_t base;
  size_t size;
  int fd;
  off_t size0;
  struct timespec mtime0;
  atomic_int faults;
  char path[512];
} slot;

static slot g_slots[MAX_MAPS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* writers only */
static atomic_int g_installed;
static struct sigaction g_prev;
static long g_page;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  uintptr_t a = (uintptr_t)si->si_addr;
  for (int i = 0; i < MAX_MAPS; i++) {
    slot *s = &g_slots[i];
    if (atomic_load(&s->state) != 2 || a < s->base || a - s->base >= s->size) continue;
    void *page = (void *)(a & ~(uintptr_t)(g_page - 1));
    if (mmap(page, (size_t)g_page, PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
      atomic_fetch_add(&s->faults, 1);
      return; /* retried: reads zeros now */
    }
    break;
  }
  /* not ours (or no memory for the zero page): what would have happened without the guard */
  if (g_prev.sa_flags & SA_SIGINFO) {
    if (g_prev.sa_sigaction) {
      g_prev.sa_sigaction(sig, si, uc);
      return;
    }
  } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
    g_prev.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

void sm_mapguard_install(void) {
  pthread_mutex_lock(&g_mu);
  if (!atomic_load(&g_installed)) {
    g_page = sysconf(_SC_PAGESIZE);
    if (g_page <= 0) g_page = 4096;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_prev) == 0) atomic_store(&g_installed, 1);
  }
  pthread_mutex_unlock(&g_mu);
}

void sm_mapguard_add(const void *addr, size_t size, int fd, const char *path) {
  struct stat st;
  if (!addr || !size || fstat(fd, &st) != 0) return;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < MAX_MAPS; i++) {
    slot *s = &g_slots[i];
    if (atomic_load(&s->state) != 0) continue;
    atomic_store(&s->state, 1);
    s->base = (uintptr_t)addr;
    s->size = size;
    s->fd = fd;
    s->size0 = st.st_size;
    s->mtime0 = st.st_mtim;
    atomic_store(&s->faults, 0);
    snprintf(s->path, sizeof s->path, "%s", path);
    atomic_store(&s->state, 2);
    break;
  }
  pthread_mutex_unlock(&g_mu);
}

void sm_mapguard_remove(const void *addr) {
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < MAX_MAPS; i++)
    if (atomic_load(&g_slots[i].state) == 2 && g_slots[i].base == (uintptr_t)addr) {
      atomic_store(&g_slots[i].state, 0);
      break;
    }
  pthread_mutex_unlock(&g_mu);
}

bool sm_mapguard_check(char *msg, size_t msg_size) {
  bool bad = false;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < MAX_MAPS && !bad; i++) {
    slot *s = &g_slots[i];
    if (atomic_load(&s->state) != 2) continue;
    struct stat st;
    int faults = atomic_load(&s->faults);
    bool ok = fstat(s->fd, &st) == 0;
    bool changed = ok && (st.st_size != s->size0 || st.st_mtim.tv_sec != s->mtime0.tv_sec ||
                          st.st_mtim.tv_nsec != s->mtime0.tv_nsec);
    if (!faults && ok && !changed) continue;
    bad = true;
    char what[160];
    if (!ok) snprintf(what, sizeof what, "cannot be checked (%s)", strerror(errno));
    else if (st.st_size != s->size0)
      snprintf(what, sizeof what, "changed size from %lld to %lld bytes", (long long)s->size0, (long long)st.st_size);
    else if (changed) snprintf(what, sizeof what, "was modified in place (same size, new modification time)");
    else snprintf(what, sizeof what, "could not be read");
    snprintf(msg, msg_size, "weights file %s %s while the model was using it%s%s; restart to load it again", s->path,
             what, faults ? " (read faults on " : "", faults ? "its mapped pages)" : "");
  }
  pthread_mutex_unlock(&g_mu);
  return bad;
}
