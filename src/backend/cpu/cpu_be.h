/* The CPU backend instance, shared by its files (cpu_backend.c: the op table and elementwise ops;
 * cpu_matmul.c: matmuls; cpu_attention.c: KV cache and attention). */
#ifndef SM_CPU_BE_H
#define SM_CPU_BE_H
#include "backend/cpu/cpu_internal.h"
#include "backend/tuning.h"
#include <stdatomic.h>

enum { ISA_AUTO, ISA_SCALAR, ISA_AVX2, ISA_AVX512 };

/* tuning table values (cpu_backend.c: cpu_tune) */
typedef struct {
  int isa;       /* ISA_*: kernel set */
  int exact;     /* 1: no int8 activations */
  int no_gfni;   /* 1: 4-bit int8 matvec (unpacked weights) without GFNI */
  int pack;      /* 1: repack quantized weights for the int8 kernels at load */
  int amx;       /* 1: AMX tiles for batched int8 matmuls where the CPU has them */
  int amx_min_n; /* tokens from which a batched matmul takes the AMX kernel */
  int pf;        /* software prefetch distance of the packed decode matvec (bytes; 0 off) */
  int invariant; /* 1: float-path matmuls run the GEMM at every batch size (batch-invariant) */
  int mv_chunks; /* work chunks per thread of the packed decode matvec; 0: one static share each */
  int mvn_max;   /* most tokens of a packed matmul on the streaming matvec (4 at a time) rather than the GEMM */
  int huge;      /* 1: packed weights and the probe buffer on transparent huge pages */
  int stats;     /* 1: the pool's time statistics, printed when the backend is destroyed */
} cpu_tuning;

#define PAR_MIN_ELEMS (1 << 15)
/* The int8 path only for rows of at least this many columns: its rounding error averages
 * out over long dot products (real models: hidden >= 896, MLP rows >= 2048, the down projections
 * of Qwen3-30B-A3B's experts 768), while tiny models amplify it: the golden-test models (hidden
 * 64-128, random weights) to logit errors of ~0.4, the shipped draft model (512-column down_proj)
 * to a 0.5% higher prefill perplexity. 768 rather than 1024 took the 30B-A3B shape's decode on two
 * threads from 16.5-17.1 to 19.0-26.1 tok/s and its prefill of 16 tokens from 22.8 to 36.5-46.3
 * (docs/cpu.md). */
#define I8_MIN_COLS 768

typedef struct {
  sm_backend base;
  sm_pool *pool;
  const sm_cpu_kern *k;
  int nth;
  /* current batch (owned copies) */
  sm_batch b;
  int32_t *tokens, *pos, *seq, *table, *out_rows, *slots, *span;
  size_t cap_tok, cap_table, cap_out, cap_slots, cap_span;
  /* matvec scratch (unpacked weights) */
  float *xp, *xsum, *xs;
  int8_t *xq;
  size_t cap_x;
  cpu_tuning tune;
  bool exact;           /* SMELT_CPU_EXACT=1: no int8 activations */
  bool gfni;            /* the 4-bit int8 matvec uses GFNI */
  bool pack;            /* prepare_weight packs quantized weights for the int8 kernels */
  const sm_i8_kern *ik; /* the int8 kernels of packed weights (with pack) */
  bool amx;             /* batched int8 matmuls may use AMX */
  bool numa;            /* threads placed over NUMA nodes: static row split (pages first touched by their reader) */
  /* per-thread float gemm scratch */
  float **gscratch;
  /* packed int8 path: quantized activations (shared) and per-thread unpacked row blocks */
  int8_t *pxq;
  float *pxs, *pxsum; /* pxsum points into pxs's allocation */
  size_t cap_pxq, cap_pxs;
  uint8_t **pu; /* [nth] 4 row blocks of 16 x cols codes */
  float **psc;  /* [nth] SC then BI of 4 row blocks */
  size_t cap_pu, cap_psc;
  void **amxw;      /* [nth] SM_AMX_SCRATCH bytes */
  double bandwidth; /* measured read bandwidth (bytes/s), 0 until measured */
  /* the sample op's scratch: a row, its candidates (cap_s of each; n_s threads' worth), and the greedy
   * split's per-thread bests */
  float *srow;
  int32_t *sidx;
  size_t cap_s;
  int n_s;
  float *sbv;
  int32_t *sbi;
  /* sample_batch_async: the tokens of the last two calls (slot 0 / 1, run to the end at once) and their
   * bookkeeping; a batch's feed_rows read the latest */
  int32_t *bs_tok[2];
  int bs_cap[2];
  sm_batch_slots bs;
  /* tensor parallelism (cpu_comm.c): the group's shared block, this process's rank */
  void *comm;
  size_t comm_bytes;
  int comm_ranks, comm_rank;
  int *comm_fds;   /* ranks on several hosts: sockets (sm_comm_init.fds), NULL with the shared block */
  float *comm_buf; /* ... rank 0's sum or gather */
  size_t comm_cap;
} cpu_be;

static inline cpu_be *CB(sm_backend *be) { return (cpu_be *)be; }

/* run fn over [0, n) in chunks on the pool; single-threaded when n * cost_per_item is small */
typedef void (*range_fn)(void *ctx, size_t i0, size_t i1);
void sm_cpu_pfor(cpu_be *c, size_t n, size_t cost_per_item, range_fn fn, void *ctx);
/* the same with a given chunk size, always on the pool */
void sm_cpu_pfor_chunk(cpu_be *c, size_t n, size_t chunk, range_fn fn, void *ctx);
bool sm_cpu_weight_ok(const sm_weight *w);

void sm_cpu_matmul(sm_backend *be, sm_mm_role role, const sm_weight *w, const float *x, int n, float *y);
void sm_cpu_matmul_group(sm_backend *be, const sm_mm_role *roles, const sm_weight *const *ws, const float *x, int n,
                         float *const *ys, int nw);
void sm_cpu_matmul_free(cpu_be *c);
size_t sm_cpu_gemm_scratch_bytes(void); /* per-thread scratch of the float GEMM */
void sm_cpu_kv_store(sm_backend *be, const sm_kv_cache *kv, int layer, const float *k, const float *v);
void sm_cpu_attention(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                      float scale, int window, float softcap);
/* the same with a sink logit per head (backend.h attention_sinks) */
void sm_cpu_attention_sinks(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                            float scale, int window, float softcap, const float *sinks);
/* multi-head latent attention (backend.h attention_mla; cpu_mla.c) */
void sm_cpu_attention_mla(sm_backend *be, float *out, const float *q_lat, const float *q_pe, const float *c,
                          const float *kpe, const sm_kv_cache *kv, int layer, int n_heads, int dr, float scale);
#endif
