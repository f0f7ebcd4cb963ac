/* The shared grammar mask cache (see grammar_cache.h): a chained hash table of entries on a
 * doubly linked least-recently-used list, under one mutex. */
#include "engine/grammar_cache.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct gentry {
  struct gentry *chain;       /* next in the bucket */
  struct gentry *prev, *next; /* LRU list: head = most recent */
  uint64_t h;
  size_t klen, words, size;
  int count;
  uint32_t *bits; /* words of mask, then the key's bytes */
} gentry;

struct sm_gmask_cache {
  pthread_mutex_t mu;
  gentry **b;
  size_t nb;
  gentry *head, *tail;
  sm_gmask_cache_stats st;
};

sm_gmask_cache *sm_gmask_cache_new(size_t max_bytes) {
  sm_gmask_cache *c = sm_xcalloc(1, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  c->nb = 256;
  c->b = sm_xcalloc(c->nb, sizeof *c->b);
  c->st.max_bytes = max_bytes;
  return c;
}

static void drop_all(sm_gmask_cache *c) {
  for (gentry *e = c->head, *n; e; e = n) {
    n = e->next;
    free(e);
  }
  memset(c->b, 0, sizeof *c->b * c->nb);
  c->head = c->tail = NULL;
  c->st.entries = 0;
  c->st.bytes = 0;
}

void sm_gmask_cache_free(sm_gmask_cache *c) {
  if (!c) return;
  drop_all(c);
  free(c->b);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void sm_gmask_cache_clear(sm_gmask_cache *c) {
  pthread_mutex_lock(&c->mu);
  drop_all(c);
  pthread_mutex_unlock(&c->mu);
}

void sm_gmask_cache_stats_get(sm_gmask_cache *c, sm_gmask_cache_stats *out) {
  pthread_mutex_lock(&c->mu);
  *out = c->st;
  pthread_mutex_unlock(&c->mu);
}

static void lru_unlink(sm_gmask_cache *c, gentry *e) {
  if (e->prev) e->prev->next = e->next;
  else c->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else c->tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_front(sm_gmask_cache *c, gentry *e) {
  e->prev = NULL;
  e->next = c->head;
  if (c->head) c->head->prev = e;
  c->head = e;
  if (!c->tail) c->tail = e;
}

static gentry **find(sm_gmask_cache *c, uint64_t h, const void *key, size_t klen, size_t words) {
  gentry **link = &c->b[h & (c->nb - 1)];
  for (; *link; link = &(*link)->chain) {
    gentry *e = *link;
    if (e->h == h && e->klen == klen && e->words == words && !memcmp(e->bits + e->words, key, klen)) break;
  }
  return link;
}

bool sm_gmask_cache_get(sm_gmask_cache *c, uint64_t h, const void *key, size_t klen, uint32_t *mask, size_t words,
                        int *count) {
  pthread_mutex_lock(&c->mu);
  gentry *e = *find(c, h, key, klen, words);
  if (e) {
    memcpy(mask, e->bits, sizeof(uint32_t) * words);
    *count = e->count;
    lru_unlink(c, e);
    lru_front(c, e);
    c->st.hits++;
  } else {
    c->st.misses++;
  }
  pthread_mutex_unlock(&c->mu);
  return e != NULL;
}

void sm_gmask_cache_note_hit(sm_gmask_cache *c) {
  pthread_mutex_lock(&c->mu);
  c->st.hits++;
  pthread_mutex_unlock(&c->mu);
}

static void evict_tail(sm_gmask_cache *c) {
  gentry *e = c->tail;
  gentry **link = &c->b[e->h & (c->nb - 1)];
  while (*link != e) link = &(*link)->chain;
  *link = e->chain;
  lru_unlink(c, e);
  c->st.bytes -= e->size;
  c->st.entries--;
  c->st.evictions++;
  free(e);
}

static void grow(sm_gmask_cache *c) {
  size_t nb = c->nb * 2;
  gentry **b = sm_xcalloc(nb, sizeof *b);
  for (gentry *e = c->head; e; e = e->next) {
    e->chain = b[e->h & (nb - 1)];
    b[e->h & (nb - 1)] = e;
  }
  free(c->b);
  c->b = b;
  c->nb = nb;
}

void sm_gmask_cache_put(sm_gmask_cache *c, uint64_t h, const void *key, size_t klen, const uint32_t *mask, size_t words,
                        int count) {
  size_t size = sizeof(gentry) + sizeof(uint32_t) * words + klen;
  pthread_mutex_lock(&c->mu);
  if (size > c->st.max_bytes || *find(c, h, key, klen, words)) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  while (c->st.bytes + size > c->st.max_bytes) evict_tail(c);
  gentry *e = sm_xmalloc(size);
  e->h = h;
  e->klen = klen;
  e->words = words;
  e->size = size;
  e->count = count;
  e->bits = (uint32_t *)(e + 1);
  memcpy(e->bits, mask, sizeof(uint32_t) * words);
  memcpy(e->bits + words, key, klen);
  if (c->st.entries + 1 > c->nb) grow(c);
  e->chain = c->b[h & (c->nb - 1)];
  c->b[h & (c->nb - 1)] = e;
  lru_front(c, e);
  c->st.entries++;
  c->st.bytes += size;
  pthread_mutex_unlock(&c->mu);
}
