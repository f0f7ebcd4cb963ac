/* The tables of what grammar positions decide (grammar_int.h, sm_gpre_entry): per (grammar,
 * vocabulary) the entry of each position, computed by grammar.c's walk and shared by every
 * sequence and thread that uses the grammar, and what the grammar says about its rules.
 *
 * Fixed frames: a stack's frames are continuation positions (the element after a non-tail
 * reference). Under a frame running rule R lies one of below(R) = the continuations of R's
 * non-tail references, plus below(R') of each rule R' that references R at its end (a tail call
 * pushes nothing), plus the grammar's end for the root. When below(R) has one member, the frame
 * under any position of R is that member, so a walk from the position can go on past R's end
 * without knowing the stack; a position's key stops at the first rule used from several places.
 *
 * What may follow a rule: follow(R) = the first bytes of what comes after each non-tail
 * reference to R (and follow() of the referencing rule when that can be empty), follow(R') of
 * the rules that reference R at their end. A byte after a key's frames end must be in follow()
 * of the last frame's rule, or no stack takes it. Classes count by their UTF-8 first bytes (the
 * sets are wide enough, never too narrow). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_int.h"

#define UNSET (-3)       /* below(): no member seen yet */
#define MAX_ENTRIES 1024 /* deeper keys per table; past it masks walk whole states */

typedef struct {
  uint64_t h;
  int32_t *key; /* NULL: empty slot */
  int n;
  sm_gpre_entry *e;
} kent;

struct sm_gpre {
  uint64_t vocab_id;
  int32_t *below;             /* per rule: its one frame below (>= 0), -1 the end, SM_GPRE_CTX several */
  int32_t *rule_of;           /* per element: its rule (-1: an alternative's end) */
  uint64_t (*follow)[4];      /* per rule: the bytes that may come right after it */
  sm_gpre_entry *_Atomic *pe; /* per element: the entry of its static key (sm_gpre_chain) */
  int n_el;
  atomic_bool complete;
  pthread_mutex_t mu; /* guards the deeper keys' entries */
  kent *map;          /* open addressing by key */
  int cap, count;
  struct sm_gpre *next;
};

static int32_t join(int32_t a, int32_t b) {
  if (a == UNSET) return b;
  if (b == UNSET || a == b) return a;
  return SM_GPRE_CTX;
}

static void bits_or(uint64_t *a, const uint64_t *b, bool *changed) {
  for (int w = 0; w < 4; w++) {
    const uint64_t x = a[w] | b[w];
    if (x != a[w]) {
      a[w] = x;
      *changed = true;
    }
  }
}

/* the first bytes of the UTF-8 forms of code points lo..hi */
static void lead_bytes(uint64_t *b, uint32_t lo, uint32_t hi) {
  static const uint32_t end[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  uint32_t start = 0;
  for (int len = 1; len <= 4; start = end[len - 1] + 1, len++) {
    const uint32_t a = lo > start ? lo : start, z = hi < end[len - 1] ? hi : end[len - 1];
    if (a > z) continue;
    const int sh = 6 * (len - 1);
    const uint32_t pre = len == 1 ? 0 : len == 2 ? 0xC0 : len == 3 ? 0xE0 : 0xF0;
    for (uint32_t x = pre | (a >> sh); x <= (pre | (z >> sh)); x++) b[x >> 6] |= 1ull << (x & 63);
  }
}

static void class_bytes(const sm_gcls *c, uint64_t *b) {
  if (c->neg) { /* every byte that starts a character outside the excluded ranges */
    for (uint32_t x = 0; x < 0x80; x++)
      if (sm_gcls_match(c, x)) b[x >> 6] |= 1ull << (x & 63);
    for (uint32_t x = 0xC2; x <= 0xF4; x++) b[x >> 6] |= 1ull << (x & 63);
    return;
  }
  for (int i = 0; i < c->n; i++) lead_bytes(b, c->r[2 * i], c->r[2 * i + 1]);
}

/* the first bytes of what elements i.. of one alternative derive into b; whether all of them
 * can derive the empty text */
static bool seq_first(const sm_grammar *g, const bool *nul, uint64_t (*first)[4], int32_t i, uint64_t *b,
                      bool *changed) {
  for (;; i++) {
    const sm_gelem *e = &g->el[i];
    if (e->type == GE_END || e->type == GE_ALT) return true;
    if (e->type == GE_TOK) return false; /* a token by id: no bytes */
    if (e->type == GE_CLS) {
      uint64_t c[4] = {0};
      class_bytes(&g->cls[e->v], c);
      bits_or(b, c, changed);
      return false;
    }
    bits_or(b, first[e->v], changed);
    if (!nul[e->v]) return false;
  }
}

static void follow_sets(const sm_grammar *g, sm_gpre *t) {
  const int R = g->n_rules;
  bool *nul = sm_xcalloc((size_t)R, sizeof(bool));
  uint64_t(*first)[4] = sm_xcalloc((size_t)R, sizeof *first);
  t->follow = sm_xcalloc((size_t)R, sizeof *t->follow);
  for (bool changed = true; changed;) { /* nullable rules, then first bytes */
    changed = false;
    for (int r = 0; r < R; r++) {
      if (nul[r]) continue;
      for (int a = g->alt_off[r]; a < g->alt_off[r + 1] && !nul[r]; a++) {
        bool all = true;
        for (int i = g->alts[a]; all && g->el[i].type != GE_END && g->el[i].type != GE_ALT; i++)
          all = g->el[i].type == GE_REF && nul[g->el[i].v];
        if (all) nul[r] = changed = true;
      }
    }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < R; r++)
      for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) seq_first(g, nul, first, g->alts[a], first[r], &changed);
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < g->n_el; i++) {
      if (g->el[i].type != GE_REF || t->rule_of[i] < 0) continue;
      uint64_t *f = t->follow[g->el[i].v];
      if (seq_first(g, nul, first, i + 1, f, &changed)) bits_or(f, t->follow[t->rule_of[i]], &changed);
    }
  }
  free(nul);
  free(first);
}

static sm_gpre *table_new(const sm_grammar *g, uint64_t vocab_id) {
  sm_gpre *t = sm_xcalloc(1, sizeof *t);
  t->vocab_id = vocab_id;
  t->rule_of = sm_xmalloc(sizeof(int32_t) * (size_t)(g->n_el + 1));
  t->pe = sm_xcalloc((size_t)g->n_el + 1, sizeof *t->pe);
  pthread_mutex_init(&t->mu, NULL);
  t->n_el = g->n_el;
  t->below = sm_xmalloc(sizeof(int32_t) * (size_t)(g->n_rules + 1));
  for (int i = 0; i <= g->n_el; i++) t->rule_of[i] = -1;
  for (int r = 0; r < g->n_rules; r++)
    for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++)
      for (int i = g->alts[a]; i < g->n_el && g->el[i].type != GE_END && g->el[i].type != GE_ALT; i++)
        t->rule_of[i] = r;
  /* direct members, then the tail calls' until nothing changes (each below() only moves up
   * UNSET -> one frame -> several, so this ends) */
  for (int r = 0; r < g->n_rules; r++) t->below[r] = UNSET;
  t->below[g->root] = -1;
  for (int i = 0; i < g->n_el; i++)
    if (g->el[i].type == GE_REF && t->rule_of[i] >= 0) {
      const uint8_t nx = g->el[i + 1].type;
      if (nx != GE_END && nx != GE_ALT) t->below[g->el[i].v] = join(t->below[g->el[i].v], i + 1);
    }
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < g->n_el; i++) {
      if (g->el[i].type != GE_REF || t->rule_of[i] < 0) continue;
      const uint8_t nx = g->el[i + 1].type;
      if (nx != GE_END && nx != GE_ALT) continue;
      const int r = g->el[i].v;
      const int32_t v = join(t->below[r], t->below[t->rule_of[i]]);
      if (v != t->below[r]) {
        t->below[r] = v;
        changed = true;
      }
    }
  }
  for (int r = 0; r < g->n_rules; r++)
    if (t->below[r] == UNSET) t->below[r] = SM_GPRE_CTX; /* not reachable */
  follow_sets(g, t);
  return t;
}

/* a table and the entries it holds */
static void table_free(sm_gpre *t) {
  for (int i = 0; i < t->n_el; i++) sm_gpre_entry_unref(atomic_load(&t->pe[i]));
  for (int i = 0; i < t->cap; i++) {
    free(t->map[i].key);
    sm_gpre_entry_unref(t->map[i].e);
  }
  free(t->map);
  pthread_mutex_destroy(&t->mu);
  free(t->pe);
  free(t->rule_of);
  free(t->below);
  free(t->follow);
  free(t);
}

sm_gpre *sm_gpre_table(const sm_grammar *g, const sm_grammar_vocab *v) {
  sm_grammar *gm = (sm_grammar *)g; /* the tables are a cache: g stays the same grammar */
  sm_gpre *head = atomic_load(&gm->pre);
  for (sm_gpre *t = head; t; t = t->next)
    if (t->vocab_id == v->id) return t;
  sm_gpre *nt = table_new(g, v->id);
  for (;;) {
    nt->next = head;
    if (atomic_compare_exchange_weak(&gm->pre, &head, nt)) return nt;
    for (sm_gpre *t = head; t; t = t->next) /* another thread added tables meanwhile */
      if (t->vocab_id == v->id) {
        table_free(nt);
        return t;
      }
  }
}

const sm_gpre_entry *sm_gpre_get(sm_gpre *t, int32_t pos) {
  return pos >= 0 && pos < t->n_el ? atomic_load_explicit(&t->pe[pos], memory_order_acquire) : NULL;
}

const sm_gpre_entry *sm_gpre_put(sm_gpre *t, int32_t pos, sm_gpre_entry *e) {
  sm_gpre_entry *old = NULL;
  if (atomic_compare_exchange_strong(&t->pe[pos], &old, e)) return e;
  sm_gpre_entry_unref(e);
  return old;
}

int sm_gpre_chain(const sm_gpre *t, int32_t pos, int32_t *key, int cap) {
  int n = 0;
  key[n++] = pos;
  int32_t f = t->rule_of[pos] >= 0 ? t->below[t->rule_of[pos]] : SM_GPRE_CTX;
  while (f >= 0 && n < cap - 1) {
    key[n++] = f;
    f = t->rule_of[f] >= 0 ? t->below[t->rule_of[f]] : SM_GPRE_CTX;
  }
  key[n++] = f >= 0 ? SM_GPRE_CTX : f; /* a chain too long: the rest counts as unknown */
  return n;
}

bool sm_gpre_complete(sm_gpre *t) { return atomic_load(&t->complete); }
void sm_gpre_set_complete(sm_gpre *t) { atomic_store(&t->complete, true); }

#define MAX_TEXT 8192 /* words of a key's text past which its entry is not shared */

static void text_put(sm_gtext *x, int32_t w) {
  if (x->n == x->cap) {
    x->cap = x->cap ? x->cap * 2 : 256;
    x->w = sm_xrealloc(x->w, sizeof(int32_t) * x->cap);
  }
  x->w[x->n++] = w;
}

/* elements i.. of one alternative; references renumbered (id[r] by first visit, queued) */
static void text_seq(const sm_grammar *g, int32_t i, sm_gtext *x, int32_t *id, int32_t *queue, int *nq) {
  for (; g->el[i].type != GE_END && g->el[i].type != GE_ALT; i++) {
    const sm_gelem *e = &g->el[i];
    text_put(x, e->type);
    if (e->type == GE_REF) {
      if (id[e->v] < 0) {
        id[e->v] = *nq;
        queue[(*nq)++] = e->v;
      }
      text_put(x, id[e->v]);
    } else if (e->type == GE_CLS) {
      const sm_gcls *c = &g->cls[e->v];
      text_put(x, c->neg);
      text_put(x, c->n);
      for (int k = 0; k < 2 * c->n; k++) text_put(x, (int32_t)c->r[k]);
    } else {
      text_put(x, e->v);
    }
  }
}

bool sm_gpre_text(const sm_gpre *t, const sm_grammar *g, const int32_t *key, int n, sm_gtext *x) {
  int32_t *id = sm_xmalloc(sizeof(int32_t) * (size_t)g->n_rules),
          *queue = sm_xmalloc(sizeof(int32_t) * (size_t)g->n_rules);
  memset(id, 0xff, sizeof(int32_t) * (size_t)g->n_rules);
  int nq = 0;
  x->n = 0;
  for (int i = 0; i + 1 < n; i++) { /* the frames: what is left of their alternatives */
    text_put(x, -10);
    text_seq(g, key[i], x, id, queue, &nq);
  }
  text_put(x, -11);
  text_put(x, key[n - 1]);
  for (int q = 0; q < nq && x->n <= MAX_TEXT; q++) { /* the rules they reach */
    const int r = queue[q];
    text_put(x, -12);
    for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
      text_seq(g, g->alts[a], x, id, queue, &nq);
      text_put(x, -13);
    }
  }
  if (key[n - 1] == SM_GPRE_CTX && n >= 2) {
    const uint64_t *f = sm_gpre_follow(t, key[n - 2]);
    for (int w = 0; f && w < 4; w++) {
      text_put(x, (int32_t)(uint32_t)f[w]);
      text_put(x, (int32_t)(uint32_t)(f[w] >> 32));
    }
  }
  free(id);
  free(queue);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < x->n; i++) h = (h ^ (uint32_t)x->w[i]) * 0x100000001b3ull;
  x->h = h ^ (h >> 31);
  return x->n <= MAX_TEXT;
}

int32_t sm_gpre_rule(const sm_gpre *t, int32_t pos) { return t->rule_of[pos]; }

bool sm_gpre_many(const sm_gpre *t, int32_t pos) {
  return t->rule_of[pos] < 0 || t->below[t->rule_of[pos]] == SM_GPRE_CTX;
}

/* under mu: the slot of key (its entry, or the empty slot where it goes) */
static kent *slot(const sm_gpre *t, const int32_t *key, int n, uint64_t h) {
  for (uint64_t i = h & (uint64_t)(t->cap - 1);; i = (i + 1) & (uint64_t)(t->cap - 1)) {
    kent *s = &t->map[i];
    if (!s->key || (s->h == h && s->n == n && !memcmp(s->key, key, sizeof(int32_t) * (size_t)n))) return s;
  }
}

const sm_gpre_entry *sm_gpre_find(sm_gpre *t, const int32_t *key, int n, uint64_t h) {
  pthread_mutex_lock(&t->mu);
  const sm_gpre_entry *e = t->cap ? slot(t, key, n, h)->e : NULL;
  pthread_mutex_unlock(&t->mu);
  return e;
}

const sm_gpre_entry *sm_gpre_add(sm_gpre *t, const int32_t *key, int n, uint64_t h, sm_gpre_entry *e) {
  pthread_mutex_lock(&t->mu);
  if ((t->count + 1) * 2 > t->cap) {
    if (t->count >= MAX_ENTRIES) {
      pthread_mutex_unlock(&t->mu);
      sm_gpre_entry_unref(e);
      return NULL;
    }
    kent *old = t->map;
    const int oc = t->cap;
    t->cap = oc ? oc * 2 : 64;
    t->map = sm_xcalloc((size_t)t->cap, sizeof *t->map);
    for (int i = 0; i < oc; i++)
      if (old[i].key) *slot(t, old[i].key, old[i].n, old[i].h) = old[i];
    free(old);
  }
  kent *s = slot(t, key, n, h);
  if (s->key) { /* another thread was first */
    pthread_mutex_unlock(&t->mu);
    sm_gpre_entry_unref(e);
    return s->e;
  }
  s->key = sm_xmalloc(sizeof(int32_t) * (size_t)n);
  memcpy(s->key, key, sizeof(int32_t) * (size_t)n);
  s->n = n;
  s->h = h;
  s->e = e;
  t->count++;
  pthread_mutex_unlock(&t->mu);
  return e;
}

const uint64_t *sm_gpre_follow(const sm_gpre *t, int32_t pos) {
  return t->rule_of[pos] >= 0 ? t->follow[t->rule_of[pos]] : NULL;
}

void sm_gpre_entry_unref(sm_gpre_entry *e) {
  if (!e || atomic_fetch_sub(&e->refs, 1) > 1) return;
  free(e->acc_bits);
  free(e->acc_list);
  free(e->sub);
  free(e);
}

void sm_gpre_free_all(sm_grammar *g) {
  sm_gpre *t = atomic_load(&g->pre);
  while (t) {
    sm_gpre *nx = t->next;
    table_free(t);
    t = nx;
  }
  atomic_store(&g->pre, NULL);
}
