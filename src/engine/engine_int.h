/* The engine's state (engine.c) as its pipelined steps (engine_pipe.c) see it; not for other users of
 * the engine (engine.h). */
#ifndef SM_ENGINE_INT_H
#define SM_ENGINE_INT_H
#include "engine/engine.h"
#include "engine/mm.h"
#include "engine/sampler.h"
#include "engine/state.h"

struct sm_seq {
  int32_t *tok;
  int n_tok, cap_tok;
  int n_done; /* tokens whose K/V are in the cache */
  int32_t *blk;
  int n_blk;               /* physical block ids (max_blocks capacity) */
  uint64_t *bhash;         /* chain hash of each full, registered-or-hashed block */
  int n_hashed;            /* full blocks whose hash has been computed */
  int slot;                /* hybrid models: recurrent state slot (-1 until the first step) */
  int snap_slot, snap_pos; /* a snapshot of the state after snap_pos tokens (-1: none) */
  sm_seq_mm *mm;           /* images (mm.h), NULL for text */
  int fed_pos, fed_row;    /* pipelined batch steps: the position of a placeholder token that the device
                            * takes from row fed_row of the launch before (-1: none) */
};

struct sm_engine {
  smelt_model *m;
  sm_engine_params p;
  sm_kv_cache kv;
  int max_blocks;   /* per sequence */
  int *ref;         /* [n_blocks] */
  uint64_t *hash;   /* [n_blocks] 0 = not in the prefix map */
  uint64_t *parent; /* [n_blocks] parent chain hash (for verification) */
  int32_t *btok;    /* [n_blocks * block_size] tokens of registered blocks */
  int *free_stack;
  int n_free; /* ref==0, not cached */
  int *lru_prev, *lru_next;
  int lru_head, lru_tail;
  int n_cached; /* ref==0, cached */
  int *map;
  int map_cap; /* open addressing: block id or -1 (tombstone -2) */
  uint64_t prefix_hits, tier_hits;
  sm_prefix_tier tier; /* a second tier of the prefix cache (spill / fetch NULL: none) */
  /* step scratch */
  int32_t *b_tok, *b_pos, *b_seq, *b_out, *b_table;
  int b_cap, b_table_cap;
  float *lg_tmp; /* logits rows of a step before they are copied out (kept between steps) */
  size_t lg_cap; /* floats */
  bool rec;      /* the model has recurrent layers: state slots, no prefix cache */
  sm_state_slots slots;
  int32_t *b_slot;
  int b_slot_cap;
  sm_mm_scratch *mms;               /* image rows of a step (mm.h) */
  void (*before_sample)(void *arg); /* sm_engine_set_before_sample */
  void *before_sample_arg;
  /* pipelined batch steps: per backend slot, the request each sequence of that launch was sampled as
   * (-1: none) and the tokens collected; pl_last: the slot of the latest launch, -1 after any other
   * step (placeholders refer to the launch right before theirs) */
  int *pl_req[2], pl_n[2], pl_cap[2];
  int32_t *pl_tok[2];
  int pl_last;
  int32_t *b_feed; /* step scratch: feed_rows */
};

/* all_logits: a logits row after every computed token of the sequences with all[i] (all == NULL:
 * every sequence), rows in order; those sequences compute all their pending tokens first (row0[i],
 * nrows[i]: where their rows are; may be NULL) */
typedef struct {
  float *logits;
  const uint8_t *all;
  int *row0, *nrows;
} sm_step_rows;

/* one step (engine.c): the other arguments as sm_engine_step_sample, sm_engine_step_rows (rows) and,
 * with ticket, sm_engine_step_launch */
smelt_status sm_eng_step(sm_engine *e, sm_seq **seqs, int n, float *logits, uint8_t *done, const sm_step_rows *rows,
                         sm_sampler **smp, int32_t *tokens, int *ticket);
void sm_eng_register_full(sm_engine *e, sm_seq *s); /* hash and register s's newly full blocks */
int sm_eng_block_alloc(sm_engine *e);               /* a free block (one must be free or cached) */
/* launch mode of sm_eng_step (engine_pipe.c): the sampling of every done sequence queued on the backend
 * (sample_batch_async) without waiting; *ticket: its slot */
smelt_status sm_eng_sample_launch(sm_engine *e, sm_seq **seqs, int n, const int *out_of, int n_out, sm_sampler **smp,
                                  int *ticket);

#endif
