/* Tensor-parallel collectives of the CPU backend: the ranks are processes forked from one parent
 * (src/model/tp.c), which mapped a shared block before the fork, so it sits at the same address in
 * each. The block holds a barrier and one slot a rank; a collective moves its data through the slots
 * in chunks that fit them. Sums run in rank order, so every rank gets the same bits. Written here
 * because the ranks need nothing more than shared memory and a barrier (MPI or NCCL's CPU transport
 * would bring a launcher and a network stack for that). */
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
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

static smelt_status comm_init(sm_backend *be, const sm_comm_init *ci) {
  cpu_be *c = CB(be);
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
