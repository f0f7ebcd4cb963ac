/* The server's compiled grammars by GBNF text (see gpool.h): a small array searched by hash,
 * least recently used dropped first; compiling happens outside the lock. */
#include "server/gpool.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *text;
  uint64_t h, used;
  sm_grammar *g;
} gp_entry;

struct sm_gpool {
  pthread_mutex_t mu;
  gp_entry e[SM_GPOOL_MAX];
  int n;
  uint64_t clock, compiled, reused;
  sm_gmask_cache *masks;
};

sm_gpool *sm_gpool_new(size_t mask_bytes) {
  sm_gpool *p = sm_xcalloc(1, sizeof *p);
  pthread_mutex_init(&p->mu, NULL);
  p->masks = mask_bytes ? sm_gmask_cache_new(mask_bytes) : NULL;
  return p;
}

void sm_gpool_free(sm_gpool *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) {
    free(p->e[i].text);
    sm_grammar_free(p->e[i].g);
  }
  sm_gmask_cache_free(p->masks);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

sm_gmask_cache *sm_gpool_masks(sm_gpool *p) { return p ? p->masks : NULL; }

void sm_gpool_counts(sm_gpool *p, uint64_t *compiled, uint64_t *reused) {
  pthread_mutex_lock(&p->mu);
  *compiled = p->compiled;
  *reused = p->reused;
  pthread_mutex_unlock(&p->mu);
}

static uint64_t text_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

/* under mu: the entry of text, or NULL */
static gp_entry *find(sm_gpool *p, const char *text, uint64_t h) {
  for (int i = 0; i < p->n; i++)
    if (p->e[i].h == h && !strcmp(p->e[i].text, text)) return &p->e[i];
  return NULL;
}

smelt_status sm_gpool_get(sm_gpool *p, const char *gbnf, sm_grammar **out) {
  uint64_t h = text_hash(gbnf);
  pthread_mutex_lock(&p->mu);
  gp_entry *e = find(p, gbnf, h);
  if (e) {
    e->used = ++p->clock;
    p->reused++;
    *out = sm_grammar_ref(e->g);
    pthread_mutex_unlock(&p->mu);
    return SMELT_OK;
  }
  pthread_mutex_unlock(&p->mu);
  sm_grammar *g = NULL;
  smelt_status st = sm_grammar_compile(gbnf, &g);
  if (st != SMELT_OK) return st;
  pthread_mutex_lock(&p->mu);
  e = find(p, gbnf, h);
  if (e) { /* another request compiled it meanwhile: use that one */
    sm_grammar_free(g);
    p->reused++;
  } else {
    p->compiled++;
    if (p->n == SM_GPOOL_MAX) { /* drop the least recently used (running requests keep theirs) */
      int lru = 0;
      for (int i = 1; i < p->n; i++)
        if (p->e[i].used < p->e[lru].used) lru = i;
      free(p->e[lru].text);
      sm_grammar_free(p->e[lru].g);
      p->e[lru] = p->e[--p->n];
    }
    e = &p->e[p->n++];
    *e = (gp_entry){.text = sm_xstrdup(gbnf), .h = h, .g = g};
  }
  e->used = ++p->clock;
  *out = sm_grammar_ref(e->g);
  pthread_mutex_unlock(&p->mu);
  return SMELT_OK;
}
