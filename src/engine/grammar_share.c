/* Entries of what grammar positions decide, shared between grammars (grammar_int.h). Requests
 * with JSON schemas of their own compile grammars of their own, yet their strings, numbers and
 * whitespace are the same rules: a position whose walk depends only on those (sm_gpre_text) takes
 * the entry another grammar computed instead of walking the vocabulary again, which is most of
 * what compiling a schema's positions costs (a string's inside accepts nearly every token).
 * Process-wide, keyed by vocabulary and text, bounded by SHARE_BYTES: the least recently used
 * entries leave first (grammars holding them keep them alive by reference). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_int.h"

#define SHARE_BYTES ((size_t)64 << 20)

typedef struct {
  uint64_t vocab, h, used;
  int32_t *w; /* NULL: empty slot */
  size_t n, bytes;
  sm_gpre_entry *e;
} sent;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static sent *g_map;
static size_t g_cap, g_count, g_bytes;
static uint64_t g_tick, g_hits;

/* under g_mu: the slot of (vocab, x): its entry, or the empty slot where it goes */
static sent *slot(uint64_t vocab, const sm_gtext *x) {
  for (size_t i = (x->h ^ vocab * 0x9E3779B97F4A7C15ull) & (g_cap - 1);; i = (i + 1) & (g_cap - 1)) {
    sent *s = &g_map[i];
    if (!s->w || (s->vocab == vocab && s->h == x->h && s->n == x->n && !memcmp(s->w, x->w, sizeof(int32_t) * x->n)))
      return s;
  }
}

/* under g_mu: the table again without slot k (open addressing: the entries after it move up) */
static void remove_at(size_t k) {
  g_bytes -= g_map[k].bytes;
  g_count--;
  free(g_map[k].w);
  sm_gpre_entry_unref(g_map[k].e);
  g_map[k] = (sent){0};
  for (size_t i = (k + 1) & (g_cap - 1); g_map[i].w; i = (i + 1) & (g_cap - 1)) {
    sent s = g_map[i];
    g_map[i] = (sent){0};
    sm_gtext x = {.w = s.w, .n = s.n, .h = s.h};
    *slot(s.vocab, &x) = s;
  }
}

sm_gpre_entry *sm_gshare_get(uint64_t vocab_id, const sm_gtext *x) {
  pthread_mutex_lock(&g_mu);
  sm_gpre_entry *e = NULL;
  if (g_cap) {
    sent *s = slot(vocab_id, x);
    if (s->w) {
      s->used = ++g_tick;
      e = s->e;
      atomic_fetch_add(&e->refs, 1);
      g_hits++;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return e;
}

sm_gpre_entry *sm_gshare_put(uint64_t vocab_id, const sm_gtext *x, sm_gpre_entry *e) {
  const size_t bytes = e->bytes + sizeof(int32_t) * x->n; /* the entry and its key */
  if (bytes > SHARE_BYTES / 16) return e;                 /* not worth a sixteenth of the budget */
  pthread_mutex_lock(&g_mu);
  if ((g_count + 1) * 2 > g_cap) {
    sent *old = g_map;
    const size_t oc = g_cap;
    g_cap = oc ? oc * 2 : 256;
    g_map = sm_xcalloc(g_cap, sizeof *g_map);
    for (size_t i = 0; i < oc; i++)
      if (old[i].w) {
        sm_gtext y = {.w = old[i].w, .n = old[i].n, .h = old[i].h};
        *slot(old[i].vocab, &y) = old[i];
      }
    free(old);
  }
  sent *s = slot(vocab_id, x);
  if (s->w) { /* another grammar was first */
    s->used = ++g_tick;
    sm_gpre_entry *kept = s->e;
    atomic_fetch_add(&kept->refs, 1);
    pthread_mutex_unlock(&g_mu);
    sm_gpre_entry_unref(e);
    return kept;
  }
  *s = (sent){.vocab = vocab_id, .h = x->h, .used = ++g_tick, .n = x->n, .bytes = bytes, .e = e};
  s->w = sm_xmalloc(sizeof(int32_t) * x->n);
  memcpy(s->w, x->w, sizeof(int32_t) * x->n);
  atomic_fetch_add(&e->refs, 1); /* the table's */
  g_count++;
  g_bytes += bytes;
  while (g_bytes > SHARE_BYTES && g_count > 1) { /* the least recently used leave */
    size_t lru = 0;
    uint64_t best = UINT64_MAX;
    for (size_t i = 0; i < g_cap; i++)
      if (g_map[i].w && g_map[i].e != e && g_map[i].used < best) {
        best = g_map[i].used;
        lru = i;
      }
    if (best == UINT64_MAX) break;
    remove_at(lru);
  }
  pthread_mutex_unlock(&g_mu);
  return e;
}

void sm_grammar_shared_counts(uint64_t *hits, uint64_t *entries) {
  pthread_mutex_lock(&g_mu);
  *hits = g_hits;
  *entries = g_count;
  pthread_mutex_unlock(&g_mu);
}
