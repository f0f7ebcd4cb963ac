/* The grammar masks of many sequences at once (grammar.h sm_grammar_mask_many): one step's constrained
 * sequences, equal parser states merged, the shared cache asked once per state, the walks spread over a
 * thread pool. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_cache.h"
#include "engine/grammar_int.h"

typedef struct {
  sm_grammar_state *const *s;
  uint32_t *const *masks;
  int *counts;
  const int *todo; /* the states to walk */
  int n;
  _Atomic int next;
} many_ctx;

static size_t mask_words(const sm_grammar_state *s) {
  return (size_t)((sm_grammar_vocab_size(sm_gstate_vocab(s)) + 31) / 32);
}

static void many_run(void *vctx, int tid, int nth) {
  (void)tid;
  (void)nth;
  many_ctx *m = vctx;
  for (int j; (j = atomic_fetch_add(&m->next, 1)) < m->n;) {
    const int i = m->todo[j];
    m->counts[i] = sm_gstate_mask_walk(m->s[i], m->masks[i]);
  }
}

/* Ended states are done here. Of the states with the same key (sequences of one schema at the same
 * point) the first is looked up in the shared cache or walked, and the others copy its mask (a
 * shared cache counts them as hits). The walks run on the pool when there are two or more (waking
 * its threads costs more than a lookup). */
void sm_grammar_mask_many(sm_grammar_state *const *s, uint32_t *const *masks, int *counts, int n, sm_pool *pool) {
  const size_t nn = (size_t)(n > 0 ? n : 1);
  int *todo = sm_xmalloc(sizeof(int) * nn), *dup = sm_xmalloc(sizeof(int) * nn), *uq = sm_xmalloc(sizeof(int) * nn);
  int nt = 0, nu = 0;
  uint64_t *kh = sm_xmalloc(sizeof(uint64_t) * nn);
  size_t *kl = sm_xmalloc(sizeof(size_t) * nn);
  const void **key = sm_xmalloc(sizeof(void *) * nn);
  for (int i = 0; i < n; i++) {
    dup[i] = -1;
    const size_t words = mask_words(s[i]);
    if (sm_grammar_ended(s[i])) {
      memset(masks[i], 0, sizeof(uint32_t) * words);
      counts[i] = 0;
      continue;
    }
    key[i] = sm_gstate_key(s[i], &kh[i], &kl[i]);
    for (int j = 0; j < nu && dup[i] < 0; j++) {
      const int u = uq[j];
      if (kh[u] == kh[i] && kl[u] == kl[i] && sm_gstate_vocab(s[u]) == sm_gstate_vocab(s[i]) &&
          sm_gstate_cache(s[u]) == sm_gstate_cache(s[i]) && !memcmp(key[u], key[i], kl[i]))
        dup[i] = u;
    }
    if (dup[i] >= 0) continue;
    uq[nu++] = i;
    sm_gmask_cache *c = sm_gstate_cache(s[i]);
    if (!(c && sm_gmask_cache_get(c, kh[i], key[i], kl[i], masks[i], words, &counts[i]))) todo[nt++] = i;
  }
  many_ctx m = {.s = s, .masks = masks, .counts = counts, .todo = todo, .n = nt};
  atomic_init(&m.next, 0);
  if (pool && nt > 1) sm_pool_run(pool, many_run, &m);
  else many_run(&m, 0, 1);
  for (int i = 0; i < n; i++)
    if (dup[i] >= 0) {
      memcpy(masks[i], masks[dup[i]], sizeof(uint32_t) * mask_words(s[i]));
      counts[i] = counts[dup[i]];
      if (sm_gstate_cache(s[i])) sm_gmask_cache_note_hit(sm_gstate_cache(s[i]));
    }
  free(todo);
  free(dup);
  free(uq);
  free(kh);
  free(kl);
  free(key);
}
