/* Grammar runtime: pushdown parser state per sequence and the per-step token mask (see
 * grammar.h). Hand-written: no Debian library builds token masks from a grammar. The parser is
 * llama.cpp's (llama-grammar.cpp): a set of stacks of positions in the rules, advanced one code
 * point at a time, with an unfinished UTF-8 character carried between tokens. Unlike llama.cpp,
 * which checks every token against every stack, the mask walks a byte trie of the vocabulary
 * (the prefix-tree idea of outlines/xgrammar), so tokens sharing a prefix share its work, and
 * stacks are hash-consed nodes (position, parent), so copying or comparing a stack is one id.
 * Masks can be shared between sequences through a cache keyed by the state in canonical form
 * (grammar_cache.h, state_key below). A state without an unfinished character builds its mask
 * from what its stacks' top positions decide (grammar_pos.c) and walks the whole trie only when
 * that gives up. The vocabulary trie is grammar_vocab.c. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_cache.h"
#include "engine/grammar_state.h"

static atomic_uint_fast64_t g_next_id = 1;

uint64_t sm_grammar_new_id(void) { return atomic_fetch_add(&g_next_id, 1); }

/* ---------------------------------------------------------------- stacks */


void sm_gs_iset_add(iset *s, int32_t x) {
  for (int i = 0; i < s->n; i++)
    if (s->v[i] == x) return;
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 8;
    s->v = sm_xrealloc(s->v, sizeof(int32_t) * (size_t)s->cap);
  }
  s->v[s->n++] = x;
}


static uint32_t nhash(int32_t pos, int32_t up) {
  uint64_t h = (uint64_t)(uint32_t)pos * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)(up + 1) * 0xC2B2AE3D27D4EB4Full;
  return (uint32_t)(h >> 32);
}

static void rehash(sm_grammar_state *s, int cap) {
  free(s->hmap);
  s->hcap = cap;
  s->hmap = sm_xmalloc(sizeof(int32_t) * (size_t)cap);
  memset(s->hmap, 0xff, sizeof(int32_t) * (size_t)cap);
  for (int k = 0; k < s->n_nodes; k++) {
    uint32_t h = nhash(s->pos[k], s->up[k]) & (uint32_t)(cap - 1);
    while (s->hmap[h] >= 0) h = (h + 1) & (uint32_t)(cap - 1);
    s->hmap[h] = k;
  }
}

int32_t sm_gs_intern(sm_grammar_state *s, int32_t pos, int32_t up) {
  uint32_t h = nhash(pos, up) & (uint32_t)(s->hcap - 1);
  while (s->hmap[h] >= 0) {
    int32_t k = s->hmap[h];
    if (s->pos[k] == pos && s->up[k] == up) return k;
    h = (h + 1) & (uint32_t)(s->hcap - 1);
  }
  if (s->n_nodes == s->cap_nodes) {
    s->cap_nodes *= 2;
    s->pos = sm_xrealloc(s->pos, sizeof(int32_t) * (size_t)s->cap_nodes);
    s->up = sm_xrealloc(s->up, sizeof(int32_t) * (size_t)s->cap_nodes);
  }
  int32_t k = s->n_nodes++;
  s->pos[k] = pos;
  s->up[k] = up;
  s->hmap[h] = k;
  if (s->n_nodes * 2 > s->hcap) rehash(s, s->hcap * 2);
  return k;
}

/* all stacks reachable from position pos (with continuation `up`) whose top is a terminal */
static void expand(sm_grammar_state *s, int32_t pos, int32_t up, iset *out) {
  const sm_grammar *g = s->g;
  for (;;) {
    if (--s->expand_budget < 0) {
      s->failed = true;
      return;
    }
    const sm_gelem *e = &g->el[pos];
    if (e->type == GE_END || e->type == GE_ALT) {
      if (up < 0) { /* -1: the grammar's end; CTX: the unknown frames under a position's walk */
        sm_gs_iset_add(out, up == CTX ? CTX : ACCEPT);
        return;
      }
      pos = s->pos[up];
      up = s->up[up];
      continue;
    }
    if (e->type == GE_CLS || e->type == GE_TOK) {
      sm_gs_iset_add(out, sm_gs_intern(s, pos, up));
      return;
    }
    /* GE_REF: a continuation frame unless the reference ends the alternative (tail call) */
    const sm_gelem *nx = &g->el[pos + 1];
    int32_t cont = (nx->type == GE_END || nx->type == GE_ALT) ? up : sm_gs_intern(s, pos + 1, up);
    int r = e->v;
    for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) expand(s, g->alts[a], cont, out);
    return;
  }
}

/* stacks of in that accept code point cp, advanced past it, into out */
static void advance_cp(sm_grammar_state *s, const iset *in, uint32_t cp, iset *out) {
  out->n = 0;
  s->expand_budget = MAX_EXPAND;
  for (int i = 0; i < in->n; i++) {
    int32_t k = in->v[i];
    if (k < 0) continue;
    const sm_gelem *e = &s->g->el[s->pos[k]];
    if (e->type == GE_CLS && sm_gcls_match(&s->g->cls[e->v], cp)) expand(s, s->pos[k] + 1, s->up[k], out);
  }
}

/* An unfinished UTF-8 character is kept as pval = value bits so far | (total length << 24), and
 * prem = continuation bytes still to come. */
#define PV_VAL(p) ((p)&0xFFFFFFu)
#define PV_LEN(p) ((p) >> 24)

/* stacks of in whose next character may begin with the unfinished UTF-8 (pval, prem) */
static void filter_partial(sm_grammar_state *s, const iset *in, uint32_t pval, int prem, iset *out) {
  out->n = 0;
  static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}; /* no overlong forms */
  uint32_t lo = PV_VAL(pval) << (6 * prem), hi = lo | ((1u << (6 * prem)) - 1);
  if (lo < min_cp[PV_LEN(pval)]) lo = min_cp[PV_LEN(pval)];
  if (hi > 0x10FFFF) hi = 0x10FFFF;
  if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000; /* no surrogates */
  if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
  if (lo > hi) return;
  for (int i = 0; i < in->n; i++) {
    int32_t k = in->v[i];
    if (k < 0) continue;
    const sm_gelem *e = &s->g->el[s->pos[k]];
    if (e->type == GE_CLS && sm_gcls_match_range(&s->g->cls[e->v], lo, hi)) sm_gs_iset_add(out, k);
  }
}

/* one byte: (in, pval, prem) -> (out, *pval, *prem). out empty: rejected. */
static void step_byte(sm_grammar_state *s, const iset *in, uint32_t *pval, int *prem, uint8_t b, iset *out) {
  if (*prem == 0) {
    if (b < 0x80) {
      advance_cp(s, in, b, out);
      return;
    }
    int need = (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
    if (need < 0 || b == 0xC0 || b == 0xC1 || b > 0xF4) {
      out->n = 0;
      return;
    }
    *pval = (need == 1 ? (b & 0x1Fu) : need == 2 ? (b & 0x0Fu) : (b & 0x07u)) | ((uint32_t)(need + 1) << 24);
    *prem = need;
    filter_partial(s, in, *pval, *prem, out);
    return;
  }
  if ((b & 0xC0) != 0x80) {
    out->n = 0;
    return;
  }
  *pval = ((PV_VAL(*pval) << 6) | (b & 0x3Fu)) | (PV_LEN(*pval) << 24);
  if (--*prem == 0) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t cp = PV_VAL(*pval);
    if (cp < min_cp[PV_LEN(*pval)] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      out->n = 0;
      return;
    }
    *pval = 0; /* no unfinished character: one state whatever the last character was */
    advance_cp(s, in, cp, out);
  } else {
    filter_partial(s, in, *pval, *prem, out);
  }
}

/* a state of g with no stacks yet */
sm_grammar_state *sm_gs_alloc(const sm_grammar *g, const sm_grammar_vocab *v) {
  sm_grammar_state *s = sm_xcalloc(1, sizeof *s);
  s->g = g;
  s->voc = v;
  s->cap_nodes = 256;
  s->pos = sm_xmalloc(sizeof(int32_t) * (size_t)s->cap_nodes);
  s->up = sm_xmalloc(sizeof(int32_t) * (size_t)s->cap_nodes);
  rehash(s, 1024);
  s->expand_budget = MAX_EXPAND;
  s->n_lvl = (v ? v->max_len : 0) + 2;
  s->lvl_sid = sm_xcalloc((size_t)s->n_lvl, sizeof(int32_t));
  s->lvl_pval = sm_xcalloc((size_t)s->n_lvl, sizeof(uint32_t));
  s->lvl_prem = sm_xcalloc((size_t)s->n_lvl, sizeof(int));
  for (int i = 0; i < 8; i++) s->mc[i].sid = -1;
  return s;
}

sm_grammar_state *sm_grammar_state_new(const sm_grammar *g, const sm_grammar_vocab *v) {
  sm_grammar_state *s = sm_gs_alloc(g, v);
  for (int a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++) expand(s, g->alts[a], -1, &s->cur);
  return s;
}

void sm_grammar_state_free(sm_grammar_state *s) {
  if (!s) return;
  sm_grammar_state_free(s->pre_scratch);
  free(s->ent);
  free(s->lvl_ctx);
  free(s->pos);
  free(s->up);
  free(s->hmap);
  free(s->cur.v);
  free(s->lvl_sid);
  free(s->lvl_pval);
  free(s->lvl_prem);
  free(s->tmp_in.v);
  free(s->tmp_out.v);
  free(s->spool);
  free(s->soff);
  free(s->slen);
  free(s->smap);
  free(s->te);
  free(s->ce);
  for (int i = 0; i < 8; i++) free(s->mc[i].bits);
  free(s->key);
  free(s->kbody);
  free(s->koff);
  free(s->kord);
  free(s);
}

void sm_grammar_state_set_cache(sm_grammar_state *s, sm_gmask_cache *c) { s->cache = c; }

void sm_gs_clear_caches(sm_grammar_state *s);

/* Keep only the nodes the current stacks use (the mask interns many that are never kept). */
static void compact(sm_grammar_state *s) {
  int32_t *map = sm_xmalloc(sizeof(int32_t) * (size_t)s->n_nodes);
  memset(map, 0xff, sizeof(int32_t) * (size_t)s->n_nodes);
  int32_t *npos = sm_xmalloc(sizeof(int32_t) * (size_t)s->cap_nodes),
          *nup = sm_xmalloc(sizeof(int32_t) * (size_t)s->cap_nodes);
  int n = 0;
  /* copy each stack bottom-up so parents get ids first */
  int32_t chain[4096];
  for (int i = 0; i < s->cur.n; i++) {
    int32_t k = s->cur.v[i];
    if (k < 0) continue;
    int depth = 0;
    for (int32_t x = k; x >= 0 && map[x] < 0 && depth < 4096; x = s->up[x]) chain[depth++] = x;
    if (depth == 4096) {
      free(map);
      free(npos);
      free(nup);
      return;
    } /* very deep: keep everything */
    while (depth--) {
      int32_t x = chain[depth];
      map[x] = n;
      npos[n] = s->pos[x];
      nup[n] = s->up[x] >= 0 ? map[s->up[x]] : -1;
      n++;
    }
  }
  for (int i = 0; i < s->cur.n; i++)
    if (s->cur.v[i] >= 0) s->cur.v[i] = map[s->cur.v[i]];
  free(map);
  free(s->pos);
  free(s->up);
  s->pos = npos;
  s->up = nup;
  s->n_nodes = n;
  rehash(s, s->hcap);
  sm_gs_clear_caches(s);
}

static bool has_accept(const iset *s) {
  for (int i = 0; i < s->n; i++)
    if (s->v[i] == ACCEPT) return true;
  return false;
}

bool sm_grammar_complete(const sm_grammar_state *s) { return !s->ended && s->prem == 0 && has_accept(&s->cur); }
bool sm_grammar_finished(const sm_grammar_state *s) {
  return s->ended || (s->prem == 0 && s->cur.n == 1 && s->cur.v[0] == ACCEPT);
}
bool sm_grammar_ended(const sm_grammar_state *s) { return s->ended; }

static void set_copy(iset *dst, const iset *src) {
  dst->n = 0;
  for (int i = 0; i < src->n; i++) sm_gs_iset_add(dst, src->v[i]);
}

/* stacks of in with <[tok]> on top, advanced past it */
static void advance_tok(sm_grammar_state *s, const iset *in, int32_t tok, iset *out) {
  out->n = 0;
  s->expand_budget = MAX_EXPAND;
  for (int i = 0; i < in->n; i++) {
    int32_t k = in->v[i];
    if (k < 0) continue;
    const sm_gelem *e = &s->g->el[s->pos[k]];
    if (e->type == GE_TOK && e->v == tok) expand(s, s->pos[k] + 1, s->up[k], out);
  }
}

/* ---------------------------------------------------------------- caches */

void sm_gs_clear_caches(sm_grammar_state *s) {
  s->spool_n = 0;
  s->n_sets = 0;
  if (s->smap) memset(s->smap, 0xff, sizeof(int32_t) * (size_t)s->smap_cap);
  s->t_n = 0;
  if (s->te) memset(s->te, 0xff, sizeof(struct tent) * (size_t)s->t_cap);
  s->c_n = 0;
  if (s->ce) memset(s->ce, 0xff, sizeof(struct cent) * (size_t)s->c_cap);
  for (int i = 0; i < 8; i++) s->mc[i].sid = -1;
}

static uint64_t set_hash(const int32_t *v, int n) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
  for (int i = 0; i < n; i++) h = (h ^ (uint32_t)v[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

static void set_sort(iset *x) {
  for (int i = 1; i < x->n; i++) {
    int32_t v = x->v[i];
    int j = i;
    while (j > 0 && x->v[j - 1] > v) {
      x->v[j] = x->v[j - 1];
      j--;
    }
    x->v[j] = v;
  }
}

static void smap_grow(sm_grammar_state *s) {
  int cap = s->smap_cap ? s->smap_cap * 2 : 256;
  free(s->smap);
  s->smap = sm_xmalloc(sizeof(int32_t) * (size_t)cap);
  memset(s->smap, 0xff, sizeof(int32_t) * (size_t)cap);
  s->smap_cap = cap;
  for (int k = 0; k < s->n_sets; k++) {
    uint32_t h = (uint32_t)set_hash(s->spool + s->soff[k], s->slen[k]) & (uint32_t)(cap - 1);
    while (s->smap[h] >= 0) h = (h + 1) & (uint32_t)(cap - 1);
    s->smap[h] = k;
  }
}

/* the id of the (sorted) set x */
int32_t sm_gs_set_intern(sm_grammar_state *s, const iset *x) {
  if ((s->n_sets + 1) * 2 > s->smap_cap) smap_grow(s);
  uint32_t h = (uint32_t)set_hash(x->v, x->n) & (uint32_t)(s->smap_cap - 1);
  while (s->smap[h] >= 0) {
    int32_t k = s->smap[h];
    if (s->slen[k] == x->n && !memcmp(s->spool + s->soff[k], x->v, sizeof(int32_t) * (size_t)x->n)) return k;
    h = (h + 1) & (uint32_t)(s->smap_cap - 1);
  }
  if (s->n_sets == s->cap_sets) {
    s->cap_sets = s->cap_sets ? s->cap_sets * 2 : 256;
    s->soff = sm_xrealloc(s->soff, sizeof(size_t) * (size_t)s->cap_sets);
    s->slen = sm_xrealloc(s->slen, sizeof(int32_t) * (size_t)s->cap_sets);
  }
  if (s->spool_n + (size_t)x->n > s->spool_cap) {
    s->spool_cap = (s->spool_cap + (size_t)x->n) * 2;
    s->spool = sm_xrealloc(s->spool, sizeof(int32_t) * s->spool_cap);
  }
  int32_t k = s->n_sets++;
  s->soff[k] = s->spool_n;
  s->slen[k] = x->n;
  memcpy(s->spool + s->spool_n, x->v, sizeof(int32_t) * (size_t)x->n);
  s->spool_n += (size_t)x->n;
  s->smap[h] = k;
  return k;
}

static uint32_t tk_hash(const struct tkey *k) {
  uint64_t h = (uint64_t)(uint32_t)k->sid * 0x9E3779B97F4A7C15ull ^ (uint64_t)k->pval * 0xC2B2AE3D27D4EB4Full ^
               (uint64_t)(uint32_t)k->prem_byte * 0x165667B19E3779F9ull;
  return (uint32_t)(h >> 32);
}

static void tmap_grow(sm_grammar_state *s) {
  int old = s->t_cap, cap = old ? old * 2 : 1024;
  struct tent *o = s->te;
  s->te = sm_xmalloc(sizeof(struct tent) * (size_t)cap);
  memset(s->te, 0xff, sizeof(struct tent) * (size_t)cap);
  s->t_cap = cap;
  for (int i = 0; i < old; i++) {
    if (o[i].k.sid < 0) continue;
    uint32_t h = tk_hash(&o[i].k) & (uint32_t)(cap - 1);
    while (s->te[h].k.sid >= 0) h = (h + 1) & (uint32_t)(cap - 1);
    s->te[h] = o[i];
  }
  free(o);
}

static uint32_t ce_hash(int32_t sid, uint64_t bits) {
  uint64_t h = (uint64_t)(uint32_t)sid * 0x9E3779B97F4A7C15ull ^ bits * 0xC2B2AE3D27D4EB4Full;
  return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

static void cmap_grow(sm_grammar_state *s) {
  int old = s->c_cap, cap = old ? old * 2 : 256;
  struct cent *o = s->ce;
  s->ce = sm_xmalloc(sizeof(struct cent) * (size_t)cap);
  memset(s->ce, 0xff, sizeof(struct cent) * (size_t)cap);
  s->c_cap = cap;
  for (int i = 0; i < old; i++) {
    if (o[i].sid < 0) continue;
    uint32_t h = ce_hash(o[i].sid, o[i].bits) & (uint32_t)(cap - 1);
    while (s->ce[h].sid >= 0) h = (h + 1) & (uint32_t)(cap - 1);
    s->ce[h] = o[i];
  }
  free(o);
}

/* Byte b when it completes a character (ASCII, or the last continuation byte) of set sid, its
 * stacks in s->tmp_in: *osid, and (*pval, *prem) as step_byte leaves them, through the cache of
 * (set, stacks that accept the character). false: not such a byte, or a set of more than 64
 * stacks (then step_byte does it). */
static bool complete_cp(sm_grammar_state *s, int32_t sid, uint32_t *pval, int *prem, uint8_t b, int32_t *osid) {
  uint32_t cp;
  if (*prem == 0 && b < 0x80) {
    cp = b;
  } else if (*prem == 1 && (b & 0xC0) == 0x80) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    cp = (PV_VAL(*pval) << 6) | (b & 0x3Fu);
    if (cp < min_cp[PV_LEN(*pval)] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false; /* step_byte rejects */
  } else {
    return false;
  }
  const iset *in = &s->tmp_in;
  if (in->n > 64) return false;
  uint64_t bits = 0;
  for (int i = 0; i < in->n; i++) {
    int32_t k = in->v[i];
    if (k < 0) continue;
    const sm_gelem *e = &s->g->el[s->pos[k]];
    if (e->type == GE_CLS && sm_gcls_match(&s->g->cls[e->v], cp)) bits |= 1ull << i;
  }
  if (!bits) {
    *osid = -1;
    goto done;
  }
  if (s->c_n * 2 >= s->c_cap) cmap_grow(s);
  uint32_t h = ce_hash(sid, bits) & (uint32_t)(s->c_cap - 1);
  while (s->ce[h].sid >= 0) {
    if (s->ce[h].sid == sid && s->ce[h].bits == bits) {
      *osid = s->ce[h].osid;
      goto done;
    }
    h = (h + 1) & (uint32_t)(s->c_cap - 1);
  }
  advance_cp(s, in, cp, &s->tmp_out);
  if (s->failed) { /* ran out of expansion steps: step_byte will say the same, uncached */
    s->failed = false;
    return false;
  }
  set_sort(&s->tmp_out);
  *osid = s->tmp_out.n ? sm_gs_set_intern(s, &s->tmp_out) : -1;
  s->ce[h] = (struct cent){sid, *osid, bits};
  s->c_n++;
done:
  if (*prem == 1) { /* as step_byte: no unfinished character */
    *pval = 0;
    *prem = 0;
  }
  return true;
}

/* (set sid, unfinished character) after byte b; *osid = -1 when b is rejected */
void sm_gs_transition(sm_grammar_state *s, int32_t sid, uint32_t pval, int prem, uint8_t b, int32_t *osid,
                      uint32_t *opval, int *oprem) {
  struct tkey key = {sid, pval, prem << 8 | b};
  if (s->t_n * 2 >= s->t_cap) tmap_grow(s);
  uint32_t h = tk_hash(&key) & (uint32_t)(s->t_cap - 1);
  while (s->te[h].k.sid >= 0) {
    const struct tent *e = &s->te[h];
    if (e->k.sid == sid && e->k.pval == pval && e->k.prem_byte == key.prem_byte) {
      *osid = e->v.sid;
      *opval = e->v.pval;
      *oprem = e->v.prem;
      return;
    }
    h = (h + 1) & (uint32_t)(s->t_cap - 1);
  }
  s->tmp_in.n = 0;
  for (int i = 0; i < s->slen[sid]; i++) sm_gs_iset_add(&s->tmp_in, s->spool[s->soff[sid] + (size_t)i]);
  if (complete_cp(s, sid, &pval, &prem, b, osid)) {
    *opval = pval;
    *oprem = prem;
    s->te[h] = (struct tent){key, {*osid, pval, prem}};
    s->t_n++;
    return;
  }
  step_byte(s, &s->tmp_in, &pval, &prem, b, &s->tmp_out);
  if (s->failed) { /* not cached */
    s->failed = false;
    s->n_fail++;
    *osid = -1;
    return;
  }
  set_sort(&s->tmp_out);
  *osid = s->tmp_out.n ? sm_gs_set_intern(s, &s->tmp_out) : -1;
  *opval = pval;
  *oprem = prem;
  s->te[h] = (struct tent){key, {*osid, pval, prem}};
  s->t_n++;
}


/* ---------------------------------------------------------------- shared cache keys */

static void kbody_put(sm_grammar_state *s, size_t *n, int32_t x) {
  if (*n == s->body_cap) {
    s->body_cap = s->body_cap ? s->body_cap * 2 : 256;
    s->kbody = sm_xrealloc(s->kbody, sizeof(int32_t) * s->body_cap);
  }
  s->kbody[(*n)++] = x;
}

/* stacks a, b of kbody (length, positions top to bottom): length first, then positions */
static int stack_cmp(const int32_t *a, const int32_t *b) {
  if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
  for (int32_t i = 1; i <= a[0]; i++)
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  return 0;
}

/* The state in canonical form, in s->key (returns its length in words; *h its hash): the
 * grammar's and vocabulary's ids, the unfinished UTF-8 character, then the set of stacks, each
 * its rule positions from the top down, sorted. Everything the mask depends on: node ids (which
 * differ between sequences) are left out, and two different stacks never serialize alike
 * (stacks are hash-consed: a node is its position and its parent). An accepting entry is the
 * empty stack. */
static size_t state_key(sm_grammar_state *s, uint64_t *h) {
  const int n = s->cur.n;
  if ((size_t)n + 1 > s->kidx_cap) {
    s->kidx_cap = (size_t)n + 16;
    s->koff = sm_xrealloc(s->koff, sizeof(int32_t) * s->kidx_cap);
    s->kord = sm_xrealloc(s->kord, sizeof(int32_t) * s->kidx_cap);
  }
  size_t bn = 0;
  for (int i = 0; i < n; i++) {
    s->koff[i] = (int32_t)bn;
    kbody_put(s, &bn, 0);
    int32_t len = 0;
    for (int32_t k = s->cur.v[i]; k >= 0; k = s->up[k]) {
      kbody_put(s, &bn, s->pos[k]);
      len++;
    }
    s->kbody[s->koff[i]] = len;
  }
  for (int i = 0; i < n; i++) { /* insertion sort: a state has a few stacks */
    int32_t x = s->koff[i];
    int j = i;
    while (j > 0 && stack_cmp(s->kbody + s->kord[j - 1], s->kbody + x) > 0) {
      s->kord[j] = s->kord[j - 1];
      j--;
    }
    s->kord[j] = x;
  }
  const size_t hdr = 7, len = hdr + bn;
  if (len > s->key_cap) {
    s->key_cap = len * 2;
    s->key = sm_xrealloc(s->key, sizeof(int32_t) * s->key_cap);
  }
  int32_t *k = s->key;
  k[0] = (int32_t)(uint32_t)s->g->id;
  k[1] = (int32_t)(uint32_t)(s->g->id >> 32);
  k[2] = (int32_t)(uint32_t)s->voc->id;
  k[3] = (int32_t)(uint32_t)(s->voc->id >> 32);
  k[4] = (int32_t)s->pval;
  k[5] = s->prem;
  k[6] = n;
  size_t o = hdr;
  for (int i = 0; i < n; i++) {
    const int32_t *st = s->kbody + s->kord[i];
    memcpy(k + o, st, sizeof(int32_t) * (size_t)(st[0] + 1));
    o += (size_t)st[0] + 1;
  }
  uint64_t x = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++) x = (x ^ (uint32_t)k[i]) * 0x100000001b3ull;
  *h = x ^ (x >> 31);
  return len;
}

/* lookup: ask the shared cache first (false: the caller just did, and missed) */
static int mask_build(sm_grammar_state *s, uint32_t *mask, bool lookup) {
  const sm_grammar_vocab *v = s->voc;
  int words = (v->vocab + 31) / 32, count = 0;
  memset(mask, 0, sizeof(uint32_t) * (size_t)words);
  if (s->ended) return 0;
  uint64_t kh = 0;
  size_t klen = 0;
  if (s->cache) {
    int cached;
    klen = state_key(s, &kh) * sizeof(int32_t);
    if (lookup && sm_gmask_cache_get(s->cache, kh, s->key, klen, mask, (size_t)words, &cached)) return cached;
  }
  if (s->n_sets > 200000 || s->t_n > (1 << 21)) sm_gs_clear_caches(s);
  s->tmp_in.n = 0;
  for (int i = 0; i < s->cur.n; i++) sm_gs_iset_add(&s->tmp_in, s->cur.v[i]);
  set_sort(&s->tmp_in);
  int32_t sid0 = sm_gs_set_intern(s, &s->tmp_in);
  for (int i = 0; i < 8 && !s->cache; i++) {
    struct mcache *m = &s->mc[i];
    if (m->sid == sid0 && m->pval == s->pval && m->prem == s->prem) {
      memcpy(mask, m->bits, sizeof(uint32_t) * (size_t)words);
      return m->count;
    }
  }
  /* tokens named by <[id]> */
  if (s->prem == 0)
    for (int i = 0; i < s->cur.n; i++) {
      int32_t k = s->cur.v[i];
      if (k < 0) continue;
      const sm_gelem *e = &s->g->el[s->pos[k]];
      if (e->type == GE_TOK && e->v >= 0 && e->v < v->vocab && !sm_mask_test(mask, e->v)) {
        sm_mask_set(mask, e->v);
        count++;
      }
    }
  if (sm_grammar_complete(s))
    for (int i = 0; i < v->n_eos; i++)
      if (!sm_mask_test(mask, v->eos[i])) {
        sm_mask_set(mask, v->eos[i]);
        count++;
      }
  if (s->prem == 0 && !s->no_pre) { /* what the positions decide, and their uncertain tokens */
    const int c = sm_gs_pos_mask(s, mask);
    if (c >= 0) {
      count = c;
      goto store;
    }
  }
  /* the trie in depth-first order; level d holds the state after d bytes of the current path */
  s->lvl_sid[0] = sid0;
  s->lvl_pval[0] = s->pval;
  s->lvl_prem[0] = s->prem;
  /* the start state's transitions by byte, in front of the hash table: where a state recurs
   * after each character (a string's inside) most nodes of the walk ask it */
  struct {
    int32_t sid;
    uint32_t pval;
    int32_t prem;
  } row[256];
  uint8_t known[256];
  memset(known, 0, sizeof known);
  const int32_t n_pn = v->n_nodes - 1;
  for (int32_t i = 0; i < n_pn;) {
    const pnode *p = &v->pn[i];
    const int d = p->depth - 1; /* the parent's level */
    int32_t sid;
    uint32_t pval = 0;
    int prem = 0;
    const bool root = s->lvl_sid[d] == sid0 && s->lvl_pval[d] == s->pval && s->lvl_prem[d] == s->prem;
    if (root && known[p->byte]) {
      sid = row[p->byte].sid;
      pval = row[p->byte].pval;
      prem = row[p->byte].prem;
    } else {
      sm_gs_transition(s, s->lvl_sid[d], s->lvl_pval[d], s->lvl_prem[d], p->byte, &sid, &pval, &prem);
      if (root) {
        known[p->byte] = 1;
        row[p->byte].sid = sid;
        row[p->byte].pval = pval;
        row[p->byte].prem = prem;
      }
    }
    if (sid < 0) { /* no token below this byte: skip the subtree */
      i = p->end;
      continue;
    }
    /* (special tokens are not in the trie) */
    for (int32_t t = p->tok; t >= 0; t = p->more ? v->next_tok[t] : -1)
      if (!sm_mask_test(mask, t)) {
        sm_mask_set(mask, t);
        count++;
      }
    if (p->end > i + 1) { /* children follow */
      s->lvl_sid[d + 1] = sid;
      s->lvl_pval[d + 1] = pval;
      s->lvl_prem[d + 1] = prem;
    }
    i++;
  }
store:
  if (s->cache) {
    sm_gmask_cache_put(s->cache, kh, s->key, klen, mask, (size_t)words, count);
    return count;
  }
  struct mcache *m = &s->mc[s->mc_next];
  s->mc_next = (s->mc_next + 1) % 8;
  if (!m->bits) m->bits = sm_xmalloc(sizeof(uint32_t) * (size_t)words);
  memcpy(m->bits, mask, sizeof(uint32_t) * (size_t)words);
  m->sid = sid0;
  m->pval = s->pval;
  m->prem = s->prem;
  m->count = count;
  return count;
}
int sm_grammar_mask(sm_grammar_state *s, uint32_t *mask) { return mask_build(s, mask, true); }
int sm_gstate_mask_walk(sm_grammar_state *s, uint32_t *mask) { return mask_build(s, mask, false); }
const void *sm_gstate_key(sm_grammar_state *s, uint64_t *h, size_t *bytes) {
  *bytes = state_key(s, h) * sizeof(int32_t);
  return s->key;
}
const sm_grammar_vocab *sm_gstate_vocab(const sm_grammar_state *s) { return s->voc; }
sm_gmask_cache *sm_gstate_cache(const sm_grammar_state *s) { return s->cache; }

static smelt_status accept_bytes(sm_grammar_state *s, const char *b, size_t n, iset *tmp_a, iset *tmp_b) {
  uint32_t pval = s->pval;
  int prem = s->prem;
  set_copy(tmp_a, &s->cur);
  for (size_t i = 0; i < n; i++) {
    step_byte(s, tmp_a, &pval, &prem, (uint8_t)b[i], tmp_b);
    if (tmp_b->n == 0 || s->failed) {
      s->failed = false;
      return sm_err(SMELT_ERR_INVALID, "grammar: byte %zu of the text is not allowed", i);
    }
    iset t = *tmp_a;
    *tmp_a = *tmp_b;
    *tmp_b = t;
  }
  set_copy(&s->cur, tmp_a);
  s->pval = pval;
  s->prem = prem;
  if (s->n_nodes > COMPACT_NODES) compact(s);
  return SMELT_OK;
}

smelt_status sm_grammar_accept_bytes(sm_grammar_state *s, const char *bytes, size_t n) {
  if (s->ended) return sm_err(SMELT_ERR_INVALID, "grammar: the text already ended");
  iset a = {0}, b = {0};
  smelt_status st = accept_bytes(s, bytes, n, &a, &b);
  free(a.v);
  free(b.v);
  return st;
}

smelt_status sm_grammar_accept(sm_grammar_state *s, int32_t tok) {
  const sm_grammar_vocab *v = s->voc;
  if (tok < 0 || tok >= v->vocab) return sm_err(SMELT_ERR_INVALID, "grammar: token %d out of range", tok);
  if (s->ended) return sm_err(SMELT_ERR_INVALID, "grammar: the text already ended");
  if (v->is_eos[tok] && sm_grammar_complete(s)) {
    s->ended = true;
    return SMELT_OK;
  }
  iset a = {0}, b = {0};
  smelt_status st = SMELT_ERR_INVALID;
  if (s->prem == 0) {
    advance_tok(s, &s->cur, tok, &a);
    if (a.n) {
      set_copy(&s->cur, &a);
      st = SMELT_OK;
    }
  }
  if (st != SMELT_OK && !v->special[tok])
    st = accept_bytes(s, v->bytes + v->off[tok], (size_t)(v->off[tok + 1] - v->off[tok]), &a, &b);
  else if (st != SMELT_OK) st = sm_err(SMELT_ERR_INVALID, "grammar: special token %d is not allowed here", tok);
  free(a.v);
  free(b.v);
  return st;
}
