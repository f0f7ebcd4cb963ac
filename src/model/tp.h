/* Tensor parallelism: one model split over the ranks of a group, one process a rank (tp.c), each with
 * its own backend (a GPU each on CUDA). Rank 0 is the caller's process: it tokenizes, schedules and
 * samples; before each forward step it sends the step's batch to the other ranks, which run the same
 * step on their shards. The collectives are backend ops (backend.h all_reduce / broadcast / all_gather).
 *
 * The split (tp_shard.c, Megatron-style): attention heads and KV heads over the ranks (KV heads
 * replicated when there are fewer than ranks), the MLP's intermediate columns over the ranks, an
 * all-reduce after the attention output projection and after the MLP's down projection, the LM head's
 * vocabulary rows over the ranks with an all-gather of the logits. Embeddings and norms are replicated. */
#ifndef SM_MODEL_TP_H
#define SM_MODEL_TP_H
#include <pthread.h>
#include <sys/types.h>
#include "model/model.h"

#define SM_TP_MAX 16

typedef struct sm_tp {
  int n, rank;
  int local;                     /* this rank's device index on its host */
  bool pp;                       /* pipeline parallelism: the ranks hold consecutive layers (pp.c), not shards */
  float shares[SM_TP_MAX];       /* (pp) the stages' shares of the layers (all 0: equal) */
  int first[SM_TP_MAX + 1];      /* (pp) the first layer of each stage, then the model's layers */
  int l0, l1;                    /* (pp) this rank's layers [l0, l1) */
  bool vocab_split;              /* the LM head's rows are split (vocab % n == 0), else rank 0 holds it whole */
  int full_heads, full_kv_heads; /* the model's sizes before the split (smelt_model_get_info) */
  bool bcast_x;                  /* this step broadcasts rank 0's embeddings (a fed token, image rows) */
  bool broken;                   /* rank 0 failed a step the others ran: no more steps */
  /* the group (rank 0): a socket to each other rank, their processes, the watchdog */
  int fd[SM_TP_MAX];
  pid_t pid[SM_TP_MAX];
  int wake[2]; /* a pipe that ends the watchdog */
  bool watching;
  pthread_t watch;
  int next_kv; /* ids of the KV caches the other ranks mirror */
  void *buf;   /* message scratch */
  size_t cap, last_len;
  void *shared; /* a memfd's block shared by the group (the CPU backend's collectives) */
  size_t shared_bytes;
  int shm_fd; /* (rank 0) that memfd, for ranks started by exec */
  int lfd;    /* (rank 0) the socket the other hosts' ranks reached it on, -1 on one host */
} sm_tp;

/* smelt_model_load with tensor_parallel > 1: forks the other ranks, loads the model's shard on each and
 * joins them into a group */
smelt_status sm_tp_load(const char *dir, const smelt_model_params *p, smelt_model **out);
/* after the other ranks were told to stop (rank 0), the group's end */
void sm_tp_free(smelt_model *m);
/* before a forward step's set_batch: rank 0 sends the batch to the other ranks (kv: the cache they mirror)
 * and has the row order of its gathered logits on the device; refuses what the split does not run */
smelt_status sm_tp_step(smelt_model *m, const sm_kv_cache *kv, const sm_batch *b);
/* rank 0: the other ranks allocate / free their copy of a KV cache (kv->tp_id) */
smelt_status sm_tp_kv_alloc(smelt_model *m, sm_kv_cache *kv, int n_blocks, int block_size, int n_slots);
void sm_tp_kv_free(smelt_model *m, const sm_kv_cache *kv);
/* rank 0: the other ranks copy a recurrent state slot (block false) or a KV block of their copy of kv */
void sm_tp_kv_copy(smelt_model *m, const sm_kv_cache *kv, bool block, int dst, int src);

/* whether the ranks hold shards of every layer whose partial outputs are summed (tensor parallelism) */
static inline bool sm_tp_sums(const smelt_model *m) { return m->tp && !m->tp->pp; }
/* the stages of a model split by layers (pipeline parallelism), 0 otherwise */
static inline int sm_pp_stages(const smelt_model *m) { return m->tp && m->tp->pp ? m->tp->n : 0; }
/* whether this rank holds layer l (every layer but on a pipeline's other stages) */
static inline bool sm_pp_holds(const smelt_model *m, int l) {
  return !sm_pp_stages(m) || (l >= m->tp->l0 && l < m->tp->l1);
}
/* pp.c: first[s], the first layer of each of the n stages over `layers` layers, and first[n] = layers: in
 * proportion to shares (n values > 0; NULL or all 0: as equal as can be), each stage at least one layer;
 * an error says why not (fewer layers than stages, bad shares) */
smelt_status sm_pp_plan(int layers, int n, const float *shares, int *first);
/* pp.c: drops the weights of the layers other stages hold (and, off rank 0, the embeddings, the LM head and
 * the vision tower) before they are uploaded; sets tp->l0, tp->l1 */
smelt_status sm_pp_shard(smelt_model *m);
/* pp.c: in a forward step, after stage src's last layer: its output x (n floats) on every rank */
smelt_status sm_pp_pass(smelt_model *m, int src, size_t n);

/* tp_shard.c: replaces the loaded (whole) weights of m by this rank's shard and the config's head and
 * MLP sizes by the rank's; an error names what cannot be split */
smelt_status sm_tp_shard(smelt_model *m);
/* whether a model of this config and family does not split over n ranks, and why (into why); a quantized
 * config is checked with its default group size (`smelt inspect`; the loader checks every weight's) */
bool sm_tp_split_problem(const sm_config *c, const sm_family *fam, int n, char *why, size_t len);
/* w becomes its columns [c0, c0 + nc): a host copy the model owns; an error names what (of layer) when the
 * columns are not whole quantization groups */
smelt_status sm_tp_cols(smelt_model *m, sm_weight *w, int64_t c0, int64_t nc, const char *what, int layer);
#endif
