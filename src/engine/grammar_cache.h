/* A cache of grammar token masks shared between sequences (and requests, and models): the mask of
 * a parser state is a function of the compiled grammar, the vocabulary and the state alone, so
 * the sequences of a batch that follow the same JSON schema build each mask once. Thread-safe
 * (one mutex); bounded by a byte budget, least recently used masks go first.
 *
 * Keys are built by sm_grammar_mask (grammar.c): the grammar's and the vocabulary's ids and the
 * state in canonical form (the sorted set of stacks, each a list of rule positions, the
 * unfinished UTF-8 character), compared byte for byte, never by hash alone. */
#ifndef SM_GRAMMAR_CACHE_H
#define SM_GRAMMAR_CACHE_H
#include "base/base.h"

typedef struct sm_gmask_cache sm_gmask_cache;

typedef struct {
  uint64_t hits, misses, evictions;
  size_t entries, bytes, max_bytes;
} sm_gmask_cache_stats;

/* max_bytes: the budget for keys and masks together (0: nothing is kept). */
sm_gmask_cache *sm_gmask_cache_new(size_t max_bytes);
void sm_gmask_cache_free(sm_gmask_cache *c);
void sm_gmask_cache_stats_get(sm_gmask_cache *c, sm_gmask_cache_stats *out);
void sm_gmask_cache_clear(sm_gmask_cache *c);

/* Look up key[0..klen) (h: its hash): on a hit copies `words` words into mask, sets *count and
 * returns true (the entry becomes the most recently used). */
bool sm_gmask_cache_get(sm_gmask_cache *c, uint64_t h, const void *key, size_t klen, uint32_t *mask, size_t words,
                        int *count);
/* Count a hit that the caller served itself (a mask copied from another sequence of the same step
 * in the same state, grammar.h sm_grammar_mask_many) */
void sm_gmask_cache_note_hit(sm_gmask_cache *c);
/* Store a mask (evicting the least recently used ones to stay within the budget; a key already
 * there is left as it is). */
void sm_gmask_cache_put(sm_gmask_cache *c, uint64_t h, const void *key, size_t klen, const uint32_t *mask, size_t words,
                        int count);

#endif
