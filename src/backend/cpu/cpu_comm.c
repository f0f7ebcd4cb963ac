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

static void xfer(int fd, void *p, size_t bytes, bool out) {
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
}

static float *hub_buf(cpu_be *c, size_t n) {
  if (n > c->comm_cap) {
    free(c->comm_buf);
    c->comm_buf = sm_xmalloc(n * sizeof(float));
    c->comm_cap = n;
  }
  return c->comm_buf;
}

/* the three collectives: dst = the sum of the ranks' src (dst may be src); dst = rank 0's src; dst = every
 * rank's src in rank order */
enum { COMM_SUM, COMM_BCAST, COMM_GATHER };

/* kind through rank 0 over the ranks' sockets */
static void hub(cpu_be *c, int kind, float *dst, const float *src, size_t n) {
  const int R = c->comm_ranks;
  const size_t b = n * sizeof(float);
  if (c->comm_rank != 0) {
    const int fd = c->comm_fds[0];
    if (kind != COMM_BCAST) xfer(fd, (void *)src, b, true);
    xfer(fd, dst, kind == COMM_GATHER ? b * (size_t)R : b, false);
    return;
  }
  if (kind == COMM_SUM) {
    float *t = hub_buf(c, n);
    for (int r = 1; r < R; r++) {
      xfer(c->comm_fds[r], t, b, false);
      for (size_t i = 0; i < n; i++) dst[i] += t[i];
    }
  } else if (kind == COMM_GATHER) {
    if (dst != src) memmove(dst, src, b);
    for (int r = 1; r < R; r++) xfer(c->comm_fds[r], dst + (size_t)r * n, b, false);
  }
  for (int r = 1; r < R; r++) xfer(c->comm_fds[r], dst, kind == COMM_GATHER ? b * (size_t)R : b, true);
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

/* kind as hub's, through the shared block in chunks of a slot: each rank's chunk into its slot (rank 0's
 * alone for a broadcast), a barrier, every rank reads the slots it needs, a barrier frees them */
static void shm(cpu_be *c, int kind, float *dst, const float *src, size_t n) {
  size_t chunk, ch;
  float *mine = slot(c, kind == COMM_BCAST ? 0 : c->comm_rank, &chunk);
  for (size_t o = 0; o < n; o += chunk) {
    const size_t k = n - o < chunk ? n - o : chunk;
    if (kind != COMM_BCAST || c->comm_rank == 0) memcpy(mine, src + o, k * sizeof(float));
    barrier(c);
    for (int r = 0; r < c->comm_ranks; r++) {
      const float *s = slot(c, r, &ch);
      if (kind == COMM_SUM)
        for (size_t i = 0; i < k; i++) dst[o + i] = r ? dst[o + i] + s[i] : s[i];
      else if (kind == COMM_GATHER) memcpy(dst + (size_t)r * n + o, s, k * sizeof(float));
      else if (r == 0 && c->comm_rank != 0) memcpy(dst + o, s, k * sizeof(float));
    }
    barrier(c); /* the slots are free again */
  }
}

static void collective(sm_backend *be, int kind, float *dst, const float *src, size_t n) {
  cpu_be *c = CB(be);
  if (c->comm_fds) hub(c, kind, dst, src, n);
  else shm(c, kind, dst, src, n);
}
static void all_reduce(sm_backend *be, float *x, size_t n) { collective(be, COMM_SUM, x, x, n); }
static void broadcast(sm_backend *be, float *x, size_t n) { collective(be, COMM_BCAST, x, x, n); }
static void all_gather(sm_backend *be, float *dst, const float *src, size_t n) {
  collective(be, COMM_GATHER, dst, src, n);
}

void sm_cpu_comm_install(sm_backend *be) {
  be->comm_make_id = NULL; /* the shared block is the group */
  be->comm_init = comm_init;
  be->all_reduce = all_reduce;
  be->broadcast = broadcast;
  be->all_gather = all_gather;
}
