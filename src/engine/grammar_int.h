/* Compiled form of a grammar (private to src/engine/grammar*.c).
 * Each rule is a run of elements in g->el: alternative, GE_ALT, alternative, ..., GE_END.
 * Repetitions and groups were turned into extra rules by the compiler. */
#ifndef SM_GRAMMAR_INT_H
#define SM_GRAMMAR_INT_H
#include <stdatomic.h>
#include "engine/grammar.h"

enum { GE_END = 0, GE_ALT, GE_REF, GE_CLS, GE_TOK };

typedef struct {
  uint8_t type;
  int32_t v; /* GE_REF: rule; GE_CLS: class; GE_TOK: token id */
} sm_gelem;

typedef struct {
  bool neg;
  int n;       /* ranges */
  uint32_t *r; /* lo0, hi0, lo1, hi1, ... (inclusive) */
} sm_gcls;

struct sm_grammar {
  sm_gelem *el;
  int n_el;
  int n_rules;
  int *alt_off;  /* alternatives of rule r: alts[alt_off[r] .. alt_off[r+1]) */
  int32_t *alts; /* element index where an alternative starts */
  char **names;
  sm_gcls *cls;
  int n_cls;
  int root;
  uint64_t id;     /* unique in the process: a key of the shared mask cache */
  atomic_int refs; /* sm_grammar_ref / sm_grammar_free */
};

/* a fresh id for a grammar or a vocabulary (never reused, so a freed one's masks cannot be
 * taken for a new one's) */
uint64_t sm_grammar_new_id(void);
/* grammar.c, for grammar_many.c: the state's canonical key (the bytes stay in the state until its next
 * call; *h its hash, *bytes its length), its vocabulary and shared cache, and its mask walked without
 * asking the shared cache first (the caller just did) */
const void *sm_gstate_key(sm_grammar_state *s, uint64_t *h, size_t *bytes);
const sm_grammar_vocab *sm_gstate_vocab(const sm_grammar_state *s);
sm_gmask_cache *sm_gstate_cache(const sm_grammar_state *s);
int sm_gstate_mask_walk(sm_grammar_state *s, uint32_t *mask);

static inline bool sm_gcls_match(const sm_gcls *c, uint32_t cp) {
  bool in = false;
  for (int i = 0; i < c->n && !in; i++) in = cp >= c->r[2 * i] && cp <= c->r[2 * i + 1];
  return in != c->neg;
}

/* Whether some code point in [lo, hi] matches c. */
static inline bool sm_gcls_match_range(const sm_gcls *c, uint32_t lo, uint32_t hi) {
  if (!c->neg) {
    for (int i = 0; i < c->n; i++)
      if (c->r[2 * i] <= hi && c->r[2 * i + 1] >= lo) return true;
    return false;
  }
  /* negated: true unless [lo, hi] is covered by the excluded ranges (checked one range at a
   * time, enough for the classes grammars use) */
  for (int i = 0; i < c->n; i++)
    if (c->r[2 * i] <= lo && c->r[2 * i + 1] >= hi) return false;
  return true;
}

#endif
