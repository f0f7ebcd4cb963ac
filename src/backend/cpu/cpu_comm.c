/* Tensor-parallel collectives of the CPU backend. On one host the ranks (processes, src/model/tp.c) map one
 * shared block: a barrier and one slot a rank, through which a collective moves its data in chunks that fit
 * the slots. On several hosts they pass through rank 0 over the ranks' sockets: rank 0 sums (or gathers)
 * and sends the result back. Sums run in rank order, so every rank gets the same bits. Written here because
 * the ranks need nothing more than shared memory or a socket (MPI or NCCL's CPU transport would bring a
 * launcher and a network stack for that). */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "backend/cpu/cpu_be.h"
#include "backend/cpu/cpu_internal.h"

typedef struct {
  _Atomic int arrived;
  _Atomic int generation;
  char pad[56];
} comm_head;

static float *slot(cpu_be *c, int r, size_t *chunk) {
  const size_t per = (c->comm_bytes - sizeof(comm_head)) / (size_t)c->comm_ranks / 64 * 64;
  *chunk = per / sizeof(float);
  return (float *)((char *)c->comm + sizeof(comm_head) + (size_t)r * per);
}

/* sense by generation: the last rank to arrive opens the next generation */
static void barrier(cpu_be *c) {
  comm_head *h = c->comm;
  const int g = atomic_load_explicit(&h->generation, memory_order_acquire);
  if (atomic_fetch_add_explicit(&h->arrived, 1, memory_order_acq_rel) == c->comm_ranks - 1) {
    atomic_store_explicit(&h->arrived, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->generation, 1, memory_order_release);
    return;
  }
  for (unsigned spin = 0; atomic_load_explicit(&h->generation, memory_order_acquire) == g; spin++)
    if (spin > 1024) sched_yield();
}

/* ---- ranks on several hosts: through rank 0's sockets ---- */

static void xfer(cpu_be *c, int fd, void *p, size_t bytes, bool out) {
  char *b = p;
  while (bytes) {
    const ssize_t k = out ? send(fd, b, bytes, MSG_NOSIGNAL) : read(fd, b, bytes);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) { /* a rank is gone: rank 0's watchdog ends the group; the others end with it */
      sm_err(SMELT_ERR_BACKEND, "cpu: a tensor-parallel rank's socket closed during a collective");
      _exit(1);
    }
    b += k;
    bytes -= (size_t)k;
  }
  (void)c;
}

static float *hub_buf(cpu_be *c, size_t n) {
  if (n > c->comm_cap) {
    free(c->comm_buf);
    c->comm_buf = sm_xmalloc(n * sizeof(float));
    c->comm_cap = n;
  }
  return c->comm_buf;
}

/* kind 0: sum into x; 1: rank 0's x; 2: dst = every rank's src, in rank order */
static void hub(cpu_be *c, int kind, float *dst, const float *src, size_t n) {
  const int R = c->comm_ranks;
  const size_t b = n * sizeof(float);
  if (c->comm_rank != 0) {
    const int fd = c->comm_fds[0];
    if (kind != 1) xfer(c, fd, (void *)src, b, true);
    xfer(c, fd, dst, kind == 2 ? b * (size_t)R : b, false);
    return;
  }
  if (kind == 0) {
    float *t = hub_buf(c, n);
    for (int r = 1; r < R; r++) {
      xfer(c, c->comm_fds[r], t, b, false);
      for (size_t i = 0; i < n; i++) dst[i] += t[i];
    }
  } else if (kind == 2) {
    if (dst != src) memmove(dst, src, b);
    for (int r = 1; r < R; r++) xfer(c, c->comm_fds[r], dst + (size_t)r * n, b, false);
  }
  for (int r = 1; r < R; r++) xfer(c, c->comm_fds[r], dst, kind == 2 ? b * (size_t)R : b, true);
}

static smelt_status comm_init(sm_backend *be, const sm_comm_init *ci) {
  cpu_be *c = CB(be);
  if (!ci->shared && ci->fds && ci->n_ranks >= 2 && ci->rank >= 0 && ci->rank < ci->n_ranks) {
    c->comm_ranks = ci->n_ranks;
    c->comm_rank = ci->rank;
    c->comm_fds = sm_xmalloc(sizeof(int) * (size_t)ci->n_ranks);
    memcpy(c->comm_fds, ci->fds, sizeof(int) * (size_t)(ci->rank ? 1 : ci->n_ranks));
    return SMELT_OK;
  }
  if (!ci->shared || ci->n_ranks < 2 || ci->rank < 0 || ci->rank >= ci->n_ranks ||
      ci->shared_bytes < sizeof(comm_head) + (size_t)ci->n_ranks * 64 * 16)
    return sm_err(SMELT_ERR_INVALID, "cpu: tensor-parallel group of %d ranks without its shared block", ci->n_ranks);
  c->comm = ci->shared;
  c->comm_bytes = ci->shared_bytes;
  c->comm_ranks = ci->n_ranks;
  c->comm_rank = ci->rank;
  barrier(c); /* all have joined */
  return SMELT_OK;
}

static void all_reduce(sm_backend *be, float *x, size_t n) {
  cpu_be *c = CB(be);
  if (c->comm_fds) {
    hub(c, 0, x, x, n);
    return;
  }
  size_t chunk;
  float *mine = slot(c, c->comm_rank, &chunk);
  for (size_t o = 0; o < n; o += chunk) {
    const size_t k = n - o < chunk ? n - o : chunk;
    memcpy(mine, x + o, k * sizeof(float));
    barrier(c);
    size_t ch;
    const float *s0 = slot(c, 0, &ch);
    for (size_t i = 0; i < k; i++) x[o + i] = s0[i];
    for (int r = 1; r < c->comm_ranks; r++) {
      const float *s = slot(c, r, &ch);
      for (size_t i = 0; i < k; i++) x[o + i] += s[i];
    }
    barrier(c); /* the slots are free again */
  }
}

static void broadcast(sm_backend *be, float *x, size_t n) {
  cpu_be *c = CB(be);
  if (c->comm_fds) {
    hub(c, 1, x, x, n);
    return;
  }
  size_t chunk;
  float *s0 = slot(c, 0, &chunk);
  for (size_t o = 0; o < n; o += chunk) {
    const size_t k = n - o < chunk ? n - o : chunk;
    if (c->comm_rank == 0) memcpy(s0, x + o, k * sizeof(float));
    barrier(c);
    if (c->comm_rank != 0) memcpy(x + o, s0, k * sizeof(float));
    barrier(c);
  }
}

static void all_gather(sm_backend *be, float *dst, const float *src, size_t n) {
  cpu_be *c = CB(be);
  if (c->comm_fds) {
    hub(c, 2, dst, src, n);
    return;
  }
  size_t chunk;
  float *mine = slot(c, c->comm_rank, &chunk);
  for (size_t o = 0; o < n; o += chunk) {
    const size_t k = n - o < chunk ? n - o : chunk;
    memcpy(mine, src + o, k * sizeof(float));
    barrier(c);
    for (int r = 0; r < c->comm_ranks; r++) {
      size_t ch;
      memcpy(dst + (size_t)r * n + o, slot(c, r, &ch), k * sizeof(float));
    }
    barrier(c);
  }
}

void sm_cpu_comm_install(sm_backend *be) {
  be->comm_make_id = NULL; /* the shared block is the group */
  be->comm_init = comm_init;
  be->all_reduce = all_reduce;
  be->broadcast = broadcast;
  be->all_gather = all_gather;
}
