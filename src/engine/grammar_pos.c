/* Masks from what grammar positions decide (XGrammar's adaptive token mask cache; grammar_int.h):
 * the entry of each stack's top position (its accepted tokens, and the part of the vocabulary
 * trie leading to the uncertain ones) is computed once per grammar, or taken from another
 * grammar of the same text (grammar_share.c), and a mask is the union of its stacks' accepted
 * tokens plus the uncertain ones walked with the whole stack. A JSON string's inside accepts
 * nearly all of a 128k vocabulary: walked once per grammar instead of once per state. */
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_state.h"

static bool set_has_ctx(const sm_grammar_state *s, int32_t sid) {
  return s->slen[sid] > 0 && s->spool[s->soff[sid]] == CTX; /* sets are sorted: CTX first */
}

static void list_put(int32_t **v, int32_t *n, int32_t *cap, int32_t x) {
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 64;
    *v = sm_xrealloc(*v, sizeof(int32_t) * (size_t)*cap);
  }
  (*v)[(*n)++] = x;
}

/* The entry of key (grammar_int.h): the trie walked, on scratch state s, from one stack of the
 * key's positions over its bottom (the grammar's end, or CTX: unknown frames). A token is
 * accepted when its bytes leave a stack (or end exactly where the key's frames end: whatever lies
 * below takes over), uncertain when a byte is refused after the key's frames could have ended
 * (the frames below might take it), rejected otherwise. */
static sm_gpre_entry *pos_walk(sm_grammar_state *s, const sm_gpre *t, const int32_t *key, int n) {
  const sm_grammar_vocab *v = s->voc;
  int32_t up = key[n - 1]; /* -1 or CTX */
  const uint64_t *fol = up == CTX ? sm_gpre_follow(t, key[n - 2]) : NULL;
  for (int i = n - 2; i >= 0; i--) up = sm_gs_intern(s, key[i], up);
  if (s->n_sets > 200000 || s->t_n > (1 << 21)) sm_gs_clear_caches(s);
  s->tmp_in.n = 0;
  sm_gs_iset_add(&s->tmp_in, up);
  const int32_t sid0 = sm_gs_set_intern(s, &s->tmp_in);
  if (!s->lvl_ctx) s->lvl_ctx = sm_xcalloc((size_t)s->n_lvl, 1);
  /* lvl_ctx[d]: bit 0, CTX is in level d's set (the fixed frames may end after d bytes); bit 1,
   * they may have ended at an earlier level and the frames below taken the next byte */
  const int words = (v->vocab + 31) / 32;
  uint32_t *acc = sm_xcalloc((size_t)words, sizeof(uint32_t));
  int32_t n_acc = 0, n_unc = 0, n_sub = 0, cap_sub = 0, *sub = NULL;
  /* path[l]: the node at depth l + 1 of the current path; its first `emitted` levels are in sub */
  int32_t *path = sm_xmalloc(sizeof(int32_t) * (size_t)s->n_lvl);
  int emitted = 0;
  s->n_fail = 0;
  s->lvl_sid[0] = sid0;
  s->lvl_pval[0] = 0;
  s->lvl_prem[0] = 0;
  s->lvl_ctx[0] = 0;
  const int32_t n_pn = v->n_nodes - 1;
  for (int32_t i = 0; i < n_pn;) {
    const pnode *p = &v->pn[i];
    const int d = p->depth - 1;
    int32_t sid;
    uint32_t pval;
    int prem;
    sm_gs_transition(s, s->lvl_sid[d], s->lvl_pval[d], s->lvl_prem[d], p->byte, &sid, &pval, &prem);
    const bool below = (s->lvl_ctx[d] & 2) ||
                       ((s->lvl_ctx[d] & 1) && (!fol || ((fol[p->byte >> 6] >> (p->byte & 63)) & 1)));
    if (emitted > d) emitted = d; /* this node replaces depth d + 1 of the path */
    if (sid < 0) {
      if (below) { /* the frames below might take this byte: the subtree is uncertain */
        for (; emitted < d; emitted++) list_put(&sub, &n_sub, &cap_sub, path[emitted]);
        for (int32_t j = i; j < p->end; j++) {
          list_put(&sub, &n_sub, &cap_sub, j);
          for (int32_t tk = v->pn[j].tok; tk >= 0; tk = v->pn[j].more ? v->next_tok[tk] : -1) n_unc++;
        }
      }
      i = p->end;
      continue;
    }
    for (int32_t tk = p->tok; tk >= 0; tk = p->more ? v->next_tok[tk] : -1) {
      acc[tk >> 5] |= 1u << (tk & 31);
      n_acc++;
    }
    if (p->end > i + 1) {
      s->lvl_sid[d + 1] = sid;
      s->lvl_pval[d + 1] = pval;
      s->lvl_prem[d + 1] = prem;
      s->lvl_ctx[d + 1] = (uint8_t)((below ? 2 : 0) | set_has_ctx(s, sid));
      path[d] = i;
    }
    i++;
  }
  sm_gpre_entry *e = sm_xcalloc(1, sizeof *e);
  atomic_init(&e->refs, 1);
  e->usable = s->n_fail == 0;
  e->n_acc = n_acc;
  if (n_acc >= words) { /* a bitset is smaller */
    e->acc_bits = acc;
  } else {
    e->acc_list = sm_xmalloc(sizeof(int32_t) * (size_t)(n_acc ? n_acc : 1));
    int32_t m = 0;
    for (int w = 0; w < words; w++)
      for (uint32_t x = acc[w]; x; x &= x - 1) e->acc_list[m++] = w * 32 + __builtin_ctz(x);
    free(acc);
  }
  /* each node of sub with the end of its subtree there: the next node no deeper than it */
  e->n_unc = n_unc;
  e->n_sub = n_sub;
  e->sub = sm_xmalloc(sizeof *e->sub * (size_t)(n_sub ? n_sub : 1));
  int top = 0; /* open nodes, deepest last (path reused as the stack) */
  for (int32_t j = 0; j < n_sub; j++) {
    const int dep = v->pn[sub[j]].depth;
    while (top > 0 && v->pn[e->sub[path[top - 1]][0]].depth >= dep) e->sub[path[--top]][1] = j;
    e->sub[j][0] = sub[j];
    path[top++] = j;
  }
  while (top > 0) e->sub[path[--top]][1] = n_sub;
  e->bytes = sizeof *e + sizeof *e->sub * (size_t)n_sub +
             (e->acc_bits ? sizeof(uint32_t) * (size_t)words : sizeof(int32_t) * (size_t)n_acc);
  free(sub);
  free(path);
  return e;
}

/* set bits of a mask (POPCNT where the CPU has it: the baseline build calls libgcc per word) */
#if defined(__x86_64__)
__attribute__((target("popcnt"))) static int popcount_hw(const uint32_t *m, int words) {
  int c = 0;
  for (int w = 0; w < words; w++) c += __builtin_popcount(m[w]);
  return c;
}
#endif
static int mask_popcount(const uint32_t *m, int words) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("popcnt")) return popcount_hw(m, words);
#endif
  int c = 0;
  for (int w = 0; w < words; w++) c += __builtin_popcount(m[w]);
  return c;
}

#define KEY_MAX 64
#define UNC_OWN 16384 /* trie nodes of uncertain tokens past which a stack takes a key of its own */

/* the scratch state in *slot for walks of g with v, made anew once it holds too many nodes */
static sm_grammar_state *scratch(sm_grammar_state **slot, const sm_grammar *g, const sm_grammar_vocab *v) {
  if (*slot && (*slot)->n_nodes > COMPACT_NODES) {
    sm_grammar_state_free(*slot);
    *slot = NULL;
  }
  if (!*slot) *slot = sm_gs_alloc(g, v);
  return *slot;
}

/* The entry of key (n words): another grammar's of the same text (sm_gpre_text) when there is
 * one, else walked on scratch state scr. Returns a reference for the caller. */
static sm_gpre_entry *key_entry(sm_gpre *t, const sm_grammar *g, const sm_grammar_vocab *v, sm_grammar_state *scr,
                                const int32_t *key, int n) {
  sm_gtext x = {0};
  const bool share = sm_gpre_text(t, g, key, n, &x);
  sm_gpre_entry *e = share ? sm_gshare_get(v->id, &x) : NULL;
  if (!e) {
    e = pos_walk(scr, t, key, n);
    if (share) e = sm_gshare_put(v->id, &x, e);
  }
  free(x.w);
  return e;
}

/* the entry of position pos's key, published in g's table t */
static const sm_gpre_entry *compute_entry(sm_gpre *t, const sm_grammar *g, const sm_grammar_vocab *v,
                                          sm_grammar_state *scr, int32_t pos) {
  int32_t key[KEY_MAX];
  const int n = sm_gpre_chain(t, pos, key, KEY_MAX);
  return sm_gpre_put(t, pos, key_entry(t, g, v, scr, key, n));
}

/* the entry of position pos, computed here when no thread has yet */
static const sm_gpre_entry *pos_entry(sm_grammar_state *s, int32_t pos) {
  const sm_gpre_entry *e = sm_gpre_get(s->pre, pos);
  return e ? e : compute_entry(s->pre, s->g, s->voc, scratch(&s->pre_scratch, s->g, s->voc), pos);
}

/* The entry of stack k's own key (NULL: the table is full), for a stack whose position's key
 * leaves many tokens uncertain because it ends at a rule used from several places (a bounded
 * string's character, used once per repetition): the frames the grammar fixes, the actual frame
 * under that rule, and the frames under it as long as they belong to rules the compiler made (a
 * repetition's counting rules), then CTX. Such a key says how many characters are left and stays
 * the same text for every grammar with the same repetition, so it is shared between them. */
static const sm_gpre_entry *stack_entry(sm_grammar_state *s, int32_t k) {
  int32_t key[KEY_MAX + 1];
  int n = 0;
  int32_t x = k;
  key[n++] = s->pos[x];
  while (!sm_gpre_many(s->pre, s->pos[x]) && s->up[x] >= 0 && n < KEY_MAX - 1) {
    x = s->up[x];
    key[n++] = s->pos[x];
  }
  bool crossed = false;
  for (;;) {
    if (s->up[x] < 0) {
      key[n++] = -1;
      break;
    }
    const int32_t y = s->up[x], r = sm_gpre_rule(s->pre, s->pos[y]);
    if (n == KEY_MAX || (crossed && (r < 0 || !s->g->gen[r]))) {
      key[n++] = CTX;
      break;
    }
    crossed = true;
    x = y;
    key[n++] = s->pos[x];
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; i++) h = (h ^ (uint32_t)key[i]) * 0x100000001b3ull;
  h ^= h >> 29;
  const sm_gpre_entry *e = sm_gpre_find(s->pre, key, n, h);
  if (e) return e;
  return sm_gpre_add(s->pre, key, n, h,
                     key_entry(s->pre, s->g, s->voc, scratch(&s->pre_scratch, s->g, s->voc), key, n));
}

/* the uncertain tokens of e walked from stack k alone, over the part of the trie leading to them */
static void unc_walk(sm_grammar_state *s, int32_t k, const sm_gpre_entry *e, uint32_t *mask) {
  const sm_grammar_vocab *v = s->voc;
  s->tmp_in.n = 0;
  sm_gs_iset_add(&s->tmp_in, k);
  s->lvl_sid[0] = sm_gs_set_intern(s, &s->tmp_in);
  s->lvl_pval[0] = 0;
  s->lvl_prem[0] = 0;
  for (int32_t i = 0; i < e->n_sub;) {
    const pnode *p = &v->pn[e->sub[i][0]];
    const int d = p->depth - 1;
    int32_t sid;
    uint32_t pval;
    int prem;
    sm_gs_transition(s, s->lvl_sid[d], s->lvl_pval[d], s->lvl_prem[d], p->byte, &sid, &pval, &prem);
    if (sid < 0) {
      i = e->sub[i][1];
      continue;
    }
    for (int32_t tk = p->tok; tk >= 0; tk = p->more ? v->next_tok[tk] : -1) sm_mask_set(mask, tk);
    if (e->sub[i][1] > i + 1) {
      s->lvl_sid[d + 1] = sid;
      s->lvl_pval[d + 1] = pval;
      s->lvl_prem[d + 1] = prem;
    }
    i++;
  }
}

/* The mask from what the stacks' tops decide plus their uncertain tokens; -1 when an entry is
 * not usable (the caller walks the whole state). The tokens a grammar names by id and the
 * end-of-sequence tokens are already in mask. Returns the number of allowed tokens. */
int sm_gs_pos_mask(sm_grammar_state *s, uint32_t *mask) {
  if (!s->pre) s->pre = sm_gpre_table(s->g, s->voc);
  if (s->cur.n > s->ent_cap) {
    s->ent_cap = s->cur.n + 8;
    s->ent = sm_xrealloc(s->ent, sizeof *s->ent * (size_t)s->ent_cap);
  }
  for (int i = 0; i < s->cur.n; i++) {
    const int32_t k = s->cur.v[i];
    const sm_gpre_entry *e = k >= 0 ? pos_entry(s, s->pos[k]) : NULL;
    if (e && e->n_sub > UNC_OWN) e = stack_entry(s, k);
    if (k >= 0 && (!e || !e->usable)) return -1;
    s->ent[i] = e;
  }
  const int words = (s->voc->vocab + 31) / 32;
  for (int i = 0; i < s->cur.n; i++) {
    const sm_gpre_entry *e = s->ent[i];
    if (!e) continue;
    if (e->acc_bits)
      for (int w = 0; w < words; w++) mask[w] |= e->acc_bits[w];
    else
      for (int32_t a = 0; a < e->n_acc; a++) sm_mask_set(mask, e->acc_list[a]);
    if (e->n_sub) unc_walk(s, s->cur.v[i], e, mask);
  }
  return mask_popcount(mask, words);
}

void sm_grammar_precompute(const sm_grammar *g, const sm_grammar_vocab *v) {
  sm_gpre *t = sm_gpre_table(g, v);
  if (sm_gpre_complete(t)) return;
  sm_grammar_state *s = NULL;
  for (int32_t i = 0; i < g->n_el; i++) {
    if (g->el[i].type != GE_CLS || sm_gpre_get(t, i)) continue;
    compute_entry(t, g, v, scratch(&s, g, v), i);
  }
  sm_grammar_state_free(s);
  sm_gpre_set_complete(t);
}

void sm_grammar_state_use_positions(sm_grammar_state *s, bool on) { s->no_pre = !on; }
