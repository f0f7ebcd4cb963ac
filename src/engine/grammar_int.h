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
  uint8_t *gen;  /* per rule: made by the compiler for a group or a repetition */
  int32_t *alts; /* element index where an alternative starts */
  char **names;
  sm_gcls *cls;
  int n_cls;
  int root;
  uint64_t id;                 /* unique in the process: a key of the shared mask cache */
  atomic_int refs;             /* sm_grammar_ref / sm_grammar_free */
  struct sm_gpre *_Atomic pre; /* per vocabulary: what stack tops decide (grammar_pre.c) */
};

/* The vocabulary trie (grammar_vocab.c). */
/* the trie in depth-first order, which the mask walks front to back (sequential memory: the
 * linked form's pointer chasing was most of a walk's time on a 128k vocabulary) */
typedef struct {
  int32_t tok;   /* as tnode.tok */
  int32_t end;   /* the index after this node's subtree (where a rejected byte resumes) */
  int32_t depth; /* bytes from the root (1: a first byte) */
  uint8_t byte;
  uint8_t more; /* other tokens have the same bytes (next_tok) */
} pnode;

struct sm_grammar_vocab {
  uint64_t id; /* sm_grammar_new_id: a key of the shared mask cache */
  int vocab;
  struct sm_gtnode *n; /* while building */
  int n_nodes, cap;
  pnode *pn;         /* n_nodes - 1 nodes, the root left out */
  int32_t *next_tok; /* tokens with the same bytes */
  uint8_t *special;  /* special tokens are only reachable through <[id]> */
  uint8_t *is_eos;
  int32_t *eos;
  int n_eos;
  char *bytes;  /* the bytes of every token (for accept) */
  int64_t *off; /* token t: bytes[off[t] .. off[t+1]) */
  int max_len;
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

/* What a stack's top position decides on its own (grammar_pre.c; XGrammar's adaptive token mask
 * cache). A position's key is the position and the frames the grammar fixes under it (a rule
 * used from one place returns there), then its bottom: -1 (the grammar's end) or SM_GPRE_CTX
 * (frames below, unknown). A walk of the trie from the key decides most tokens whatever lies
 * below: those accepted without going past the key's frames, and those refused before it. The
 * others, the uncertain ones, go past them and are walked with the whole stack each time. */
typedef struct {
  atomic_int refs;    /* a grammar's table and the shared entries (grammar_share.c) hold them */
  bool usable;        /* false: a walk ran out of expansion steps; walk the whole state */
  int32_t n_acc;      /* accepted tokens */
  uint32_t *acc_bits; /* as a bitset over the vocabulary ((vocab + 31) / 32 words) when many, else */
  int32_t *acc_list;  /* as a list */
  int32_t n_unc;      /* uncertain tokens */
  /* the part of the trie that leads to them, in depth-first order: node (index into the
   * vocabulary's pn) and where its subtree ends in this list, so a walk of it skips the
   * subtree of a refused byte */
  int32_t n_sub;
  int32_t (*sub)[2];
  size_t bytes; /* all the entry holds */
} sm_gpre_entry;

typedef struct sm_gpre sm_gpre;
#define SM_GPRE_CTX (-2) /* below a key's frames: the context, unknown */
/* g's table for vocabulary v, made on first use (thread-safe; lives as long as g) */
sm_gpre *sm_gpre_table(const sm_grammar *g, const sm_grammar_vocab *v);
/* the entry of position pos, NULL: not computed yet */
const sm_gpre_entry *sm_gpre_get(sm_gpre *t, int32_t pos);
/* publish e for pos (the caller's reference passes to the table); returns the entry kept (e, or
 * one another thread published first: e's reference dropped) */
const sm_gpre_entry *sm_gpre_put(sm_gpre *t, int32_t pos, sm_gpre_entry *e);
/* position pos's key into key (cap >= 2 words); returns its length */
int sm_gpre_chain(const sm_gpre *t, int32_t pos, int32_t *key, int cap);
/* the rule of position pos (-1: an alternative's end) */
int32_t sm_gpre_rule(const sm_gpre *t, int32_t pos);
/* whether the frame under one at position pos can be one of several */
bool sm_gpre_many(const sm_gpre *t, int32_t pos);
/* Entries of keys deeper than a position's (a stack's own, grammar.c): the entry of key (n words,
 * hash h), NULL when not computed yet; add e for key (the caller's reference passes to the
 * table): returns the entry kept (e, or one added first: e's reference dropped), NULL when the
 * table is full (e's reference dropped). Thread-safe. */
const sm_gpre_entry *sm_gpre_find(sm_gpre *t, const int32_t *key, int n, uint64_t h);
const sm_gpre_entry *sm_gpre_add(sm_gpre *t, const int32_t *key, int n, uint64_t h, sm_gpre_entry *e);
/* the bytes that may come after the rule of position pos (256 bits; NULL: any) */
const uint64_t *sm_gpre_follow(const sm_gpre *t, int32_t pos);
/* whether every position has its entry (sm_grammar_precompute ran) */
bool sm_gpre_complete(sm_gpre *t);
void sm_gpre_set_complete(sm_gpre *t);
/* drop a reference (the last frees) */
void sm_gpre_entry_unref(sm_gpre_entry *e);
/* What a walk from key depends on, as text (grammar_pre.c): the remainders of the key's frames and
 * every rule they reach (numbered by first visit, so grammars that differ elsewhere, such as two
 * JSON schemas' property names, give the same text for their strings), the bottom, and the bytes
 * that may follow. false: too long to be worth sharing. */
typedef struct {
  int32_t *w;
  size_t n, cap;
  uint64_t h;
} sm_gtext;
bool sm_gpre_text(const sm_gpre *t, const sm_grammar *g, const int32_t *key, int n, sm_gtext *x);
/* Entries shared between grammars by text (grammar_share.c; thread-safe, least recently used
 * dropped past a budget). get: a new reference, NULL when absent. put: e's text is x; returns
 * the entry to use with one reference for the caller (e, or one put first: e's dropped). */
sm_gpre_entry *sm_gshare_get(uint64_t vocab_id, const sm_gtext *x);
sm_gpre_entry *sm_gshare_put(uint64_t vocab_id, const sm_gtext *x, sm_gpre_entry *e);

/* the tables of g (sm_grammar_free) */
void sm_gpre_free_all(sm_grammar *g);

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
