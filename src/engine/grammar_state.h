/* A sequence's parser state and its caches (private to grammar.c, the parser, and grammar_pos.c,
 * masks from what positions decide). */
#ifndef SM_GRAMMAR_STATE_H
#define SM_GRAMMAR_STATE_H
#include "engine/grammar_cache.h"
#include "engine/grammar_int.h"

#define ACCEPT (-1)       /* in a stack set: the text can end here */
#define CTX SM_GPRE_CTX   /* in a stack set of a position's walk: the fixed frames ended here */
#define MAX_EXPAND 100000 /* expansion steps for one advance (a safety net) */
#define COMPACT_NODES (1 << 20)

typedef struct {
  int32_t *v;
  int n, cap;
} iset;

struct sm_grammar_state {
  const sm_grammar *g;
  const sm_grammar_vocab *voc;
  /* hash-consed nodes: a stack is its top node; node k = (pos[k], up[k]), up -1 = bottom */
  int32_t *pos, *up;
  int n_nodes, cap_nodes;
  int32_t *hmap; /* open addressing, -1 empty */
  int hcap;
  /* current state */
  iset cur;
  uint32_t pval; /* unfinished UTF-8 character: value so far, bytes still to come */
  int prem;
  bool ended;
  bool failed; /* an expansion ran past MAX_EXPAND */
  int expand_budget;
  int n_fail; /* transitions given up for lack of expansion steps (a position's walk checks it) */
  /* what stack tops decide (grammar_pre.c): the grammar's table for this vocabulary, whether to
   * use it, and a scratch state for the walks of entries computed here */
  sm_gpre *pre;
  bool no_pre;
  sm_grammar_state *pre_scratch;
  const sm_gpre_entry **ent; /* the entries of the current stacks */
  int ent_cap;
  uint8_t *lvl_ctx;
  /* mask scratch: the walk's state per trie depth (an interned set, the unfinished character) */
  int32_t *lvl_sid;
  int n_lvl;
  uint32_t *lvl_pval;
  int *lvl_prem;
  iset tmp_in, tmp_out;
  /* caches, valid while node ids are (until compact): interned stack sets, byte transitions
   * between them, and whole masks of recent states (a JSON string's state recurs every step) */
  int32_t *spool;
  size_t spool_n, spool_cap;
  size_t *soff;
  int32_t *slen;
  int n_sets, cap_sets;
  int32_t *smap;
  int smap_cap;
  struct tent { /* key and value side by side: one cache line a probe */
    struct tkey {
      int32_t sid;
      uint32_t pval;
      int32_t prem_byte;
    } k;
    struct tval {
      int32_t sid;
      uint32_t pval;
      int32_t prem;
    } v;
  } * te;
  int t_n, t_cap;
  /* completed characters: the set after code point cp depends only on which of the set's stacks
   * accept cp (a bit each), so (set, those bits) -> set serves every character alike (all the
   * letters inside a JSON string, the ~60k multi-byte characters of a large vocabulary) */
  struct cent {
    int32_t sid, osid; /* sid -1: empty */
    uint64_t bits;
  } * ce;
  int c_n, c_cap;
  struct mcache {
    int32_t sid;
    uint32_t pval;
    int prem;
    int count;
    uint32_t *bits;
  } mc[8];
  int mc_next;
  /* the shared cache (NULL: none) and the scratch of its keys */
  sm_gmask_cache *cache;
  int32_t *key, *kbody, *koff, *kord;
  size_t key_cap, body_cap, kidx_cap;
};

void sm_gs_iset_add(iset *s, int32_t x);
/* a state of g with no stacks yet */
sm_grammar_state *sm_gs_alloc(const sm_grammar *g, const sm_grammar_vocab *v);
/* the node of stack (pos, up), up -1: the bottom (CTX: a position walk's unknown frames) */
int32_t sm_gs_intern(sm_grammar_state *s, int32_t pos, int32_t up);
/* the id of the sorted set x */
int32_t sm_gs_set_intern(sm_grammar_state *s, const iset *x);
/* (set sid, unfinished character) after byte b; *osid = -1 when b is refused */
void sm_gs_transition(sm_grammar_state *s, int32_t sid, uint32_t pval, int prem, uint8_t b, int32_t *osid,
                      uint32_t *opval, int *oprem);
void sm_gs_clear_caches(sm_grammar_state *s);
/* grammar_pos.c: the mask of s (prem 0) from what its stacks' tops decide, the tokens named by id
 * and the end-of-sequence tokens already in mask; the count of allowed tokens, -1 when a walk
 * gave up (walk the whole state) */
int sm_gs_pos_mask(sm_grammar_state *s, uint32_t *mask);

#endif
