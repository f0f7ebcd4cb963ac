/* Paged KV cache, prefix cache and continuous-batch stepping; for hybrid models also the sequences'
 * recurrent state slots (state.h): taken at a sequence's first step, copied by fork, rewound by
 * truncation to a snapshot (or recomputed from the start). Prefix caching is off for such models:
 * reusing KV blocks needs the recurrent state at the block boundary, which is not kept. The pipelined
 * steps (a step queued before the previous one's token is read back) are in engine_pipe.c. */
#include "engine/engine_int.h"
#include "engine/mm.h"
#include "engine/sampler.h"
#include "engine/state.h"
#include <stdlib.h>
#include <string.h>
#include "backend/kv_quant.h"

void sm_engine_params_default(sm_engine_params *p) {
  memset(p, 0, sizeof *p);
  p->block_size = 16;
  p->max_seqs = 1;
  p->max_batch_tokens = 512;
  p->prefix_cache = true;
  p->pipeline = true;
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
static uint64_t chain_hash(uint64_t parent, const int32_t *t, int n) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int i = 0; i < n; i++) h = mix64(h ^ (uint32_t)t[i]) + (uint64_t)i;
  return h ? h : 1;
}

/* ---- prefix map ---- */
static int map_find(const sm_engine *e, uint64_t h) {
  int mask = e->map_cap - 1;
  for (int i = (int)(h & (uint64_t)mask), k = 0; k < e->map_cap; i = (i + 1) & mask, k++) {
    int b = e->map[i];
    if (b == -1) return -1;
    if (b >= 0 && e->hash[b] == h) return b;
  }
  return -1;
}
static void map_insert(sm_engine *e, int blk, uint64_t h) {
  int mask = e->map_cap - 1;
  for (int i = (int)(h & (uint64_t)mask);; i = (i + 1) & mask)
    if (e->map[i] < 0) {
      e->map[i] = blk;
      e->hash[blk] = h;
      return;
    }
}
static void map_remove(sm_engine *e, int blk) {
  int mask = e->map_cap - 1;
  uint64_t h = e->hash[blk];
  for (int i = (int)(h & (uint64_t)mask), k = 0; k < e->map_cap; i = (i + 1) & mask, k++) {
    if (e->map[i] == -1) break;
    if (e->map[i] == blk) {
      e->map[i] = -2;
      break;
    }
  }
  e->hash[blk] = 0;
}

/* ---- LRU of cached free blocks ---- */
static void lru_push(sm_engine *e, int b) {
  e->lru_prev[b] = e->lru_tail;
  e->lru_next[b] = -1;
  if (e->lru_tail >= 0) e->lru_next[e->lru_tail] = b;
  else e->lru_head = b;
  e->lru_tail = b;
  e->n_cached++;
}
static void lru_unlink(sm_engine *e, int b) {
  if (e->lru_prev[b] >= 0) e->lru_next[e->lru_prev[b]] = e->lru_next[b];
  else e->lru_head = e->lru_next[b];
  if (e->lru_next[b] >= 0) e->lru_prev[e->lru_next[b]] = e->lru_prev[b];
  else e->lru_tail = e->lru_prev[b];
  e->n_cached--;
}

int sm_eng_block_alloc(sm_engine *e) {
  int b;
  if (e->n_free > 0) b = e->free_stack[--e->n_free];
  else if (e->lru_head >= 0) {
    b = e->lru_head;
    lru_unlink(e, b);
    if (e->tier.spill) e->tier.spill(e->tier.ud, e, b, e->hash[b], e->parent[b], e->btok + (size_t)b * e->p.block_size);
    map_remove(e, b);
  } else return -1;
  e->ref[b] = 1;
  return b;
}
static void block_release(sm_engine *e, int b) {
  if (--e->ref[b] > 0) return;
  if (e->hash[b]) lru_push(e, b);
  else e->free_stack[e->n_free++] = b;
}
static void block_retain(sm_engine *e, int b) {
  if (e->ref[b]++ == 0 && e->hash[b]) lru_unlink(e, b);
}

smelt_status sm_engine_create(smelt_model *m, const sm_engine_params *pp, sm_engine **out) {
  sm_engine_params p;
  if (pp) p = *pp;
  else sm_engine_params_default(&p);
  if (p.block_size <= 0) p.block_size = 16;
  if (p.max_seqs <= 0) p.max_seqs = 1;
  if (p.max_context <= 0) p.max_context = m->max_context;
  if (p.max_batch_tokens <= 0) p.max_batch_tokens = 512;
  if (p.max_batch_tokens < p.max_seqs) p.max_batch_tokens = p.max_seqs;
  int max_blocks = (p.max_context + p.block_size - 1) / p.block_size;
  if (p.n_blocks <= 0) p.n_blocks = max_blocks * p.max_seqs;
  if (p.n_blocks < max_blocks) p.n_blocks = max_blocks;
  sm_engine *e = sm_xcalloc(1, sizeof *e);
  e->pl_last = -1;
  e->rec = m->cfg.rec.kind != SM_REC_NONE;
  if (e->rec) p.prefix_cache = false; /* see the file comment */
  e->m = m;
  e->p = p;
  e->max_blocks = max_blocks;
  /* hybrid models: a state slot per running sequence, one for a sequence of its own (embeddings) and
   * one for a snapshot (sm_seq_checkpoint) */
  const int n_slots = e->rec ? p.max_seqs + 2 : 0;
  smelt_status st = sm_kv_alloc(m, p.n_blocks, p.block_size, n_slots, &e->kv);
  if (st) {
    free(e);
    return st;
  }
  sm_state_slots_init(&e->slots, n_slots);
  int nb = p.n_blocks;
  e->ref = sm_xcalloc((size_t)nb, sizeof(int));
  e->hash = sm_xcalloc((size_t)nb, sizeof(uint64_t));
  e->parent = sm_xcalloc((size_t)nb, sizeof(uint64_t));
  e->btok = sm_xcalloc((size_t)nb * p.block_size, sizeof(int32_t));
  e->free_stack = sm_xmalloc(sizeof(int) * (size_t)nb);
  e->lru_prev = sm_xmalloc(sizeof(int) * (size_t)nb);
  e->lru_next = sm_xmalloc(sizeof(int) * (size_t)nb);
  for (int i = 0; i < nb; i++) e->free_stack[i] = nb - 1 - i;
  e->n_free = nb;
  e->lru_head = e->lru_tail = -1;
  e->map_cap = 16;
  while (e->map_cap < 2 * nb) e->map_cap <<= 1;
  e->map = sm_xmalloc(sizeof(int) * (size_t)e->map_cap);
  for (int i = 0; i < e->map_cap; i++) e->map[i] = -1;
  if ((st = sm_model_reserve(m, p.max_batch_tokens, p.max_seqs))) {
    sm_engine_free(e);
    return st;
  }
  *out = e;
  return SMELT_OK;
}

void sm_engine_free(sm_engine *e) {
  if (!e) return;
  sm_kv_free(e->m, &e->kv);
  free(e->ref);
  free(e->hash);
  free(e->parent);
  free(e->btok);
  free(e->free_stack);
  free(e->lru_prev);
  free(e->lru_next);
  free(e->map);
  free(e->b_tok);
  free(e->b_pos);
  free(e->b_seq);
  free(e->b_out);
  free(e->b_table);
  free(e->lg_tmp);
  free(e->b_slot);
  free(e->b_feed);
  for (int k = 0; k < 2; k++) {
    free(e->pl_req[k]);
    free(e->pl_tok[k]);
  }
  sm_state_slots_free(&e->slots);
  sm_mm_scratch_free(e->mms);
  free(e);
}

smelt_model *sm_engine_model(sm_engine *e) { return e->m; }

sm_seq *sm_seq_new(sm_engine *e) {
  sm_seq *s = sm_xcalloc(1, sizeof *s);
  s->blk = sm_xmalloc(sizeof(int32_t) * (size_t)e->max_blocks);
  s->bhash = sm_xcalloc((size_t)e->max_blocks, sizeof(uint64_t));
  s->slot = s->snap_slot = -1;
  s->fed_pos = -1;
  return s;
}

/* the snapshot is dropped */
static void drop_snapshot(sm_engine *e, sm_seq *s) {
  sm_state_slot_put(&e->slots, s->snap_slot);
  s->snap_slot = -1;
}

void sm_seq_free(sm_engine *e, sm_seq *s) {
  if (!s) return;
  sm_state_slot_put(&e->slots, s->slot);
  drop_snapshot(e, s);
  for (int i = 0; i < s->n_blk; i++) block_release(e, s->blk[i]);
  sm_seq_mm_free(s->mm);
  free(s->tok);
  free(s->blk);
  free(s->bhash);
  free(s);
}

smelt_status sm_seq_append(sm_engine *e, sm_seq *s, const int32_t *ids, int n) {
  if (n < 0) return sm_err(SMELT_ERR_INVALID, "negative token count");
  if (s->n_tok + n > e->p.max_context)
    return sm_err(SMELT_ERR_LIMIT, "sequence of %d tokens exceeds the context size %d", s->n_tok + n, e->p.max_context);
  int32_t V = e->m->cfg.vocab_size;
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V) return sm_err(SMELT_ERR_INVALID, "token id %d out of range (vocab %d)", ids[i], V);
  if (s->n_tok + n > s->cap_tok) {
    s->cap_tok = SM_MAX(s->n_tok + n, s->cap_tok * 2 + 16);
    s->tok = sm_xrealloc(s->tok, sizeof(int32_t) * (size_t)s->cap_tok);
  }
  memcpy(s->tok + s->n_tok, ids, sizeof(int32_t) * (size_t)n);
  s->n_tok += n;
  if (s->mm) sm_seq_mm_appended(s->mm, s->tok, s->n_tok - n, s->n_tok);
  return SMELT_OK;
}

smelt_status sm_seq_set_media(sm_engine *e, sm_seq *s, const sm_mm_span *spans, int n_spans) {
  return sm_seq_set_media_impl(&s->mm, e->m, s->tok, s->n_tok, s->n_done, spans, n_spans);
}

int sm_seq_common_prefix(const sm_seq *s, const int32_t *ids, int n, const sm_mm_span *spans, int n_spans) {
  return sm_mm_common_prefix(s->mm, s->tok, s->n_done, ids, n, spans, n_spans);
}

/* the prefix cache's view of a sequence's tokens (images: keys of their content) */
static const int32_t *seq_keys(const sm_seq *s) { return s->mm ? s->mm->keys : s->tok; }

int sm_seq_len(const sm_seq *s) { return s->n_tok; }
int sm_seq_pending(const sm_seq *s) { return s->n_tok - s->n_done; }
const int32_t *sm_seq_tokens(const sm_seq *s) { return s->tok; }

int sm_seq_use_prefix_cache(sm_engine *e, sm_seq *s) {
  if (!e->p.prefix_cache || e->rec || s->n_done > 0 || s->n_blk > 0 || s->n_tok < 2) return 0;
  int bs = e->p.block_size, full = (s->n_tok - 1) / bs;
  uint64_t parent = 0;
  int i;
  for (i = 0; i < full; i++) {
    const int32_t *t = seq_keys(s) + (size_t)i * bs;
    uint64_t h = chain_hash(parent, t, bs);
    int b = map_find(e, h);
    if (b < 0 && e->tier.fetch && e->n_free + e->n_cached > 0) { /* the tier may hold it */
      b = sm_eng_block_alloc(e);
      if (!e->tier.fetch(e->tier.ud, e, b, h, parent, t)) {
        block_release(e, b);
        break;
      }
      memcpy(e->btok + (size_t)b * bs, t, sizeof(int32_t) * (size_t)bs);
      e->parent[b] = parent;
      map_insert(e, b, h);
      e->tier_hits += (uint64_t)bs;
      s->blk[s->n_blk++] = b;
      s->bhash[i] = h;
      parent = h;
      continue;
    }
    if (b < 0 || e->parent[b] != parent || memcmp(e->btok + (size_t)b * bs, t, sizeof(int32_t) * (size_t)bs)) break;
    block_retain(e, b);
    s->blk[s->n_blk++] = b;
    s->bhash[i] = h;
    parent = h;
  }
  s->n_hashed = i;
  s->n_done = i * bs;
  e->prefix_hits += (uint64_t)s->n_done;
  return s->n_done;
}

/* fork of a hybrid model's sequence: its state and every computed token, the partial last block copied */
static sm_seq *fork_rec(sm_engine *e, sm_seq *s) {
  const int bs = e->p.block_size;
  const int partial = s->n_done % bs ? 1 : 0, full = s->n_done / bs;
  if (s->n_done > 0 && (s->slot < 0 || e->slots.n_free < 1 || e->n_free + e->n_cached < partial)) return NULL;
  sm_seq *c = sm_seq_new(e);
  sm_seq_append(e, c, s->tok, s->n_tok);
  if (s->n_done == 0) return c;
  for (int i = 0; i < full; i++) {
    block_retain(e, s->blk[i]);
    c->blk[c->n_blk++] = s->blk[i];
  }
  if (partial) {
    const int b = sm_eng_block_alloc(e);
    sm_kv_copy_block(e->m, &e->kv, b, s->blk[full]);
    c->blk[c->n_blk++] = b;
  }
  c->slot = sm_state_slot_get(&e->slots);
  sm_kv_copy_state(e->m, &e->kv, c->slot, s->slot);
  c->n_done = s->n_done;
  return c;
}

sm_seq *sm_seq_fork(sm_engine *e, sm_seq *s) {
  if (e->rec) return fork_rec(e, s);
  sm_seq *c = sm_seq_new(e);
  sm_seq_append(e, c, s->tok, s->n_tok);
  c->mm = sm_seq_mm_dup(s->mm);
  int bs = e->p.block_size, full = s->n_done / bs;
  if (full * bs == s->n_tok && full > 0) full--; /* keep the last token to recompute for logits */
  for (int i = 0; i < full; i++) {
    block_retain(e, s->blk[i]);
    c->blk[c->n_blk++] = s->blk[i];
    c->bhash[i] = s->bhash[i];
  }
  c->n_hashed = SM_MIN(full, s->n_hashed);
  c->n_done = full * bs;
  return c;
}

/* After computing, hash & register newly full blocks of s. */
void sm_eng_register_full(sm_engine *e, sm_seq *s) {
  int bs = e->p.block_size, full = s->n_done / bs;
  if (s->fed_pos >= 0) full = SM_MIN(full, s->fed_pos / bs); /* a placeholder is not its token */
  while (s->n_hashed < full) {
    int i = s->n_hashed;
    uint64_t parent = i ? s->bhash[i - 1] : 0;
    const int32_t *t = seq_keys(s) + (size_t)i * bs;
    uint64_t h = chain_hash(parent, t, bs);
    s->bhash[i] = h;
    int b = s->blk[i];
    if (e->p.prefix_cache && !e->hash[b] && map_find(e, h) < 0) {
      memcpy(e->btok + (size_t)b * bs, t, sizeof(int32_t) * (size_t)bs);
      e->parent[b] = parent;
      map_insert(e, b, h);
    }
    s->n_hashed++;
  }
}

smelt_status sm_engine_step(sm_engine *e, sm_seq **seqs, int n, float *logits, uint8_t *done) {
  return sm_eng_step(e, seqs, n, logits, done, NULL, NULL, NULL, NULL);
}

smelt_status sm_engine_step_sample(sm_engine *e, sm_seq **seqs, int n, sm_sampler **smp, int32_t *tokens, float *logits,
                                   uint8_t *done) {
  if (n > 0 && (!smp || !tokens)) return sm_err(SMELT_ERR_INVALID, "step_sample: samplers and tokens required");
  for (int i = 0; i < n; i++)
    if (!smp[i] && !logits) return sm_err(SMELT_ERR_INVALID, "step_sample: sequence %d needs a logits buffer", i);
  return sm_eng_step(e, seqs, n, logits, done, NULL, smp, tokens, NULL);
}

smelt_status sm_engine_step_all(sm_engine *e, sm_seq *s, float *logits, int *n_rows) {
  int pend = sm_seq_pending(s);
  *n_rows = 0;
  if (pend <= 0) return SMELT_OK;
  if (pend > e->p.max_batch_tokens)
    return sm_err(SMELT_ERR_LIMIT, "%d pending tokens exceed the step budget %d", pend, e->p.max_batch_tokens);
  uint8_t done = 0;
  sm_step_rows r = {.logits = logits};
  smelt_status st = sm_eng_step(e, &s, 1, NULL, &done, &r, NULL, NULL, NULL);
  if (!st) *n_rows = pend;
  return st;
}

smelt_status sm_engine_step_rows(sm_engine *e, sm_seq **seqs, int n, const uint8_t *all, float *logits, int *row0,
                                 int *nrows, uint8_t *done) {
  if (!all || !logits || !row0 || !nrows) return sm_err(SMELT_ERR_INVALID, "step_rows: all arguments are required");
  sm_step_rows r = {.logits = logits, .all = all, .row0 = row0, .nrows = nrows};
  return sm_eng_step(e, seqs, n, NULL, done, &r, NULL, NULL, NULL);
}

void sm_seq_checkpoint(sm_engine *e, sm_seq *s) {
  if (!e->rec || s->slot < 0 || s->n_done == 0) return;
  if (s->snap_slot < 0) s->snap_slot = sm_state_slot_get(&e->slots);
  if (s->snap_slot < 0) return; /* no slot free: truncation recomputes from the start */
  sm_kv_copy_state(e->m, &e->kv, s->snap_slot, s->slot);
  s->snap_pos = s->n_done;
}

smelt_status sm_seq_truncate(sm_engine *e, sm_seq *s, int len) {
  if (len < 0 || len > s->n_tok) return sm_err(SMELT_ERR_INVALID, "cannot truncate %d tokens to %d", s->n_tok, len);
  int bs = e->p.block_size;
  s->n_tok = len;
  if (s->fed_pos >= len) s->fed_pos = -1;
  if (e->rec && s->n_done > len) {
    /* the recurrent state cannot be unwound: back to the snapshot (or the start), recomputing the rest */
    if (s->snap_slot >= 0 && s->snap_pos <= len) {
      sm_kv_copy_state(e->m, &e->kv, s->slot, s->snap_slot);
      s->n_done = s->snap_pos;
    } else {
      s->n_done = 0;
    }
  }
  if (s->snap_slot >= 0 && s->snap_pos > len) drop_snapshot(e, s);
  if (s->mm) sm_seq_mm_truncated(s->mm, e->m, s->tok, len);
  if (s->n_done > len) s->n_done = len;
  /* a rewound hybrid sequence keeps only the blocks of its computed tokens: the rest get fresh ones */
  const int end = e->rec ? s->n_done : len;
  int keep = (end + bs - 1) / bs;
  while (s->n_blk > keep) block_release(e, s->blk[--s->n_blk]);
  int full = s->n_done / bs;
  if (s->n_hashed > full) s->n_hashed = full;
  /* the partial last block will be written again: it must not stay a shared prefix entry */
  if (end % bs && s->n_blk > 0) {
    int b = s->blk[s->n_blk - 1];
    if (e->ref[b] > 1) return sm_err(SMELT_ERR_UNSUPPORTED, "truncating into a shared KV block");
    if (e->hash[b]) map_remove(e, b);
  }
  return SMELT_OK;
}

/* Sampling mode (tokens != NULL): the rows of sequences with a sampler are sampled by the
 * backend's sample op, grammar masks and logit biases included (or on the host from downloaded
 * logits when it has none, or with params.host_sample); only the other rows are downloaded,
 * into logits. */
static smelt_status sample_rows(sm_engine *e, sm_seq **seqs, int n, const int *out_of, int n_out, sm_sampler **smp,
                                int32_t *tokens, float *logits) {
  smelt_model *m = e->m;
  sm_backend *be = m->be;
  const int V = m->cfg.vocab_size;
  sm_sample_req *req = sm_xmalloc(sizeof(sm_sample_req) * (size_t)(n ? n : 1));
  int32_t *tok = sm_xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  int *req_of = sm_xmalloc(sizeof(int) * (size_t)(n ? n : 1));
  int nreq = 0;
  for (int i = 0; i < n; i++) {
    if (out_of[i] < 0 || !smp[i]) continue;
    sm_sampler_prepare(smp[i], sm_seq_tokens(seqs[i]), sm_seq_len(seqs[i]), &req[nreq]);
    req[nreq].row = out_of[i];
    req_of[nreq++] = i;
  }
  smelt_status st = SMELT_OK;
  float *host = NULL; /* all rows on the host (fallback) */
  if (nreq && be->sample && !e->p.host_sample) {
    st = be->sample(be, m->logits, n_out, V, req, nreq, tok);
  } else if (n_out) {
    /* the same checks as a backend's sample op (a mask that allows nothing is an error) */
    st = sm_sample_check(req, nreq, n_out, V);
    host = st ? NULL : malloc(sizeof(float) * (size_t)n_out * V);
    if (!st && !host) st = sm_err(SMELT_ERR_OOM, "logits of %d rows", n_out);
    else if (!st) be->download(be, host, m->logits, sizeof(float) * (size_t)n_out * V);
    for (int k = 0; !st && k < nreq; k++) {
      sm_sampler *s = smp[req_of[k]];
      tok[k] = sm_sample_row(&req[k], host + (size_t)req[k].row * V, V, s->probs, s->idx);
    }
  }
  for (int k = 0; !st && k < nreq; k++) tokens[req_of[k]] = tok[k];
  for (int i = 0; !st && i < n; i++) {
    if (out_of[i] < 0 || smp[i]) continue;
    float *dst = logits + (size_t)i * V;
    if (host) memcpy(dst, host + (size_t)out_of[i] * V, sizeof(float) * (size_t)V);
    else be->download(be, dst, m->logits + (size_t)out_of[i] * V, sizeof(float) * (size_t)V);
  }
  free(host);
  free(req);
  free(tok);
  free(req_of);
  return st;
}

smelt_status sm_eng_step(sm_engine *e, sm_seq **seqs, int n, float *logits, uint8_t *done, const sm_step_rows *rows,
                         sm_sampler **smp, int32_t *tokens, int *ticket) {
  int bs = e->p.block_size, budget = e->p.max_batch_tokens;
  if (n > e->p.max_seqs)
    return sm_err(SMELT_ERR_LIMIT, "%d sequences in one step, engine sized for %d", n, e->p.max_seqs);
  float *all_logits = rows ? rows->logits : NULL;
#define ALL_ROWS(i) (all_logits && (!rows->all || rows->all[i]))
  int *take = sm_xcalloc((size_t)(n ? n : 1), sizeof(int));
  /* sequences that want every row take all their pending tokens, then decode tokens (1 each),
   * then prefill chunks with what's left */
  int total = 0, need_blocks = 0;
  for (int i = 0; i < n; i++) {
    int pend = sm_seq_pending(seqs[i]);
    if (pend > 0) {
      take[i] = ALL_ROWS(i) ? pend : 1;
      total += take[i];
    }
  }
  if (total > budget) {
    free(take);
    return sm_err(SMELT_ERR_LIMIT, "batch budget too small");
  }
  for (int i = 0; i < n; i++) {
    int pend = sm_seq_pending(seqs[i]);
    int more = SM_MIN(pend - take[i], budget - total);
    if (more > 0) {
      take[i] += more;
      total += more;
    }
  }
  /* images (mm.h): a bidirectional span is computed in one step; what a step reaches is encoded first */
  bool any_mm = false;
  for (int i = 0; i < n; i++) {
    sm_seq *s = seqs[i];
    if (!s->mm || !take[i]) continue;
    const int t = sm_seq_mm_take(s->mm, e->m, s->n_done, take[i], budget);
    if (t < 0) {
      free(take);
      return sm_err(SMELT_ERR_LIMIT, "an image takes more tokens than a step computes (max_batch_tokens %d)", budget);
    }
    total -= take[i] - t;
    take[i] = t;
    smelt_status st = sm_seq_mm_encode(s->mm, e->m, s->n_done, s->n_done + t);
    if (st) {
      free(take);
      return st;
    }
    any_mm |= t > 0;
  }
  for (int i = 0; i < n; i++) {
    sm_seq *s = seqs[i];
    int last = s->n_done + take[i];
    int nb = (last + bs - 1) / bs;
    if (nb > s->n_blk) need_blocks += nb - s->n_blk;
  }
  if (need_blocks > e->n_free + e->n_cached) {
    free(take);
    return sm_err(SMELT_ERR_OOM, "KV cache full: need %d blocks, %d free", need_blocks, e->n_free + e->n_cached);
  }
  if (e->rec) { /* a state slot for each sequence computing its first tokens */
    int need = 0;
    for (int i = 0; i < n; i++) need += take[i] > 0 && seqs[i]->slot < 0;
    if (need > e->slots.n_free) {
      free(take);
      return sm_err(SMELT_ERR_OOM, "no free recurrent state slot: need %d, %d free", need, e->slots.n_free);
    }
    if (n > e->b_slot_cap) {
      e->b_slot_cap = n;
      e->b_slot = sm_xrealloc(e->b_slot, sizeof(int32_t) * (size_t)n);
    }
    for (int i = 0; i < n; i++) {
      if (take[i] > 0 && seqs[i]->slot < 0) seqs[i]->slot = sm_state_slot_get(&e->slots);
      e->b_slot[i] = seqs[i]->slot >= 0 ? seqs[i]->slot : 0;
    }
  }
  for (int i = 0; i < n; i++) {
    sm_seq *s = seqs[i];
    int nb = (s->n_done + take[i] + bs - 1) / bs;
    while (s->n_blk < nb) s->blk[s->n_blk++] = sm_eng_block_alloc(e);
  }
  if (total > e->b_cap) {
    e->b_cap = total;
    e->b_tok = sm_xrealloc(e->b_tok, sizeof(int32_t) * (size_t)total);
    e->b_pos = sm_xrealloc(e->b_pos, sizeof(int32_t) * (size_t)total);
    e->b_seq = sm_xrealloc(e->b_seq, sizeof(int32_t) * (size_t)total);
    e->b_out = sm_xrealloc(e->b_out, sizeof(int32_t) * (size_t)total);
    e->b_feed = sm_xrealloc(e->b_feed, sizeof(int32_t) * (size_t)total);
  }
  if (n * e->max_blocks > e->b_table_cap) {
    e->b_table_cap = n * e->max_blocks;
    e->b_table = sm_xrealloc(e->b_table, sizeof(int32_t) * (size_t)e->b_table_cap);
  }
  int t = 0, n_out = 0;
  bool any_feed = false;
  int *out_of = sm_xmalloc(sizeof(int) * (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++) {
    sm_seq *s = seqs[i];
    memcpy(e->b_table + (size_t)i * e->max_blocks, s->blk, sizeof(int32_t) * (size_t)s->n_blk);
    out_of[i] = -1;
    for (int j = 0; j < take[i]; j++, t++) {
      int p = s->n_done + j;
      e->b_tok[t] = s->tok[p];
      e->b_pos[t] = p;
      e->b_seq[t] = i;
      e->b_feed[t] = -1;
      if (p == s->fed_pos) { /* a placeholder: the token the launch before sampled for row fed_row */
        const int L = e->pl_last;
        const int r = L >= 0 && s->fed_row >= 0 && s->fed_row < e->pl_n[L] ? e->pl_req[L][s->fed_row] : -1;
        if (r < 0) {
          free(out_of);
          free(take);
          return sm_err(SMELT_ERR_INVALID, "a fed token without a sampled row %d in the launch before", s->fed_row);
        }
        e->b_feed[t] = r;
        any_feed = true;
      }
    }
    if (rows && rows->row0) {
      rows->row0[i] = n_out;
      rows->nrows[i] = 0;
    }
    if (ALL_ROWS(i)) {
      if (rows->nrows) rows->nrows[i] = take[i];
      for (int j = 0; j < take[i]; j++) e->b_out[n_out++] = t - take[i] + j;
    } else if (all_logits) {
      if (take[i] > 0 && s->n_done + take[i] == s->n_tok) {
        rows->nrows[i] = 1;
        e->b_out[n_out++] = t - 1;
      }
    } else if (take[i] > 0 && s->n_done + take[i] == s->n_tok) {
      out_of[i] = n_out;
      e->b_out[n_out++] = t - 1;
    }
  }
  sm_batch b = {.n_tokens = total,
                .tokens = e->b_tok,
                .pos = e->b_pos,
                .seq = e->b_seq,
                .n_seqs = n,
                .max_blocks = e->max_blocks,
                .block_table = e->b_table,
                .n_out = n_out,
                .out_rows = e->b_out,
                .feed_rows = any_feed ? e->b_feed : NULL,
                .state_slot = e->rec ? e->b_slot : NULL};
  if (!ticket) e->pl_last = -1;
  if (any_mm) { /* image rows and M-RoPE positions of the batch */
    sm_mm_scratch *sc = e->mms ? e->mms : (e->mms = sm_xcalloc(1, sizeof *e->mms));
    bool rp = false;
    for (int i = 0; i < n; i++) rp |= seqs[i]->mm && seqs[i]->mm->rpos && take[i];
    if (rp && 3 * total > sc->cap_rpos) {
      sc->cap_rpos = 3 * total;
      sc->rpos = sm_xrealloc(sc->rpos, sizeof(int32_t) * (size_t)sc->cap_rpos);
    }
    const bool bidir = sm_vision_bidirectional(e->m->vision);
    if (bidir && 2 * total > sc->cap_span) {
      sc->cap_span = 2 * total;
      sc->span = sm_xrealloc(sc->span, sizeof(int32_t) * (size_t)sc->cap_span);
    }
    sc->n_embd = 0;
    for (int i = 0, row = 0; i < n; row += take[i], i++)
      sm_mm_batch_rows(sc, seqs[i]->mm, e->m, seqs[i]->tok, seqs[i]->n_done, seqs[i]->n_done + take[i], row, total,
                       rp ? sc->rpos : NULL, bidir ? sc->span : NULL);
    sm_mm_batch_done(sc);
    b.n_embd = sc->n_embd;
    b.embd = sc->embd;
    b.rope_pos = rp ? sc->rpos : NULL;
    b.attn_span = bidir ? sc->span : NULL;
  }
  int V = e->m->cfg.vocab_size;
  bool sampling = tokens != NULL || ticket != NULL;
  float *tmp = all_logits;
  if (!tmp && n_out && !sampling) {
    const size_t need = (size_t)n_out * (size_t)V;
    if (need > e->lg_cap) {
      free(e->lg_tmp);
      e->lg_tmp = sm_xmalloc(sizeof(float) * need);
      e->lg_cap = need;
    }
    tmp = e->lg_tmp;
  }
  smelt_status st = total ? sm_model_forward(e->m, &e->kv, &b, tmp) : SMELT_OK;
  if (st == SMELT_OK) {
    for (int i = 0; i < n; i++) {
      seqs[i]->n_done += take[i];
      sm_eng_register_full(e, seqs[i]);
      done[i] = all_logits ? rows->nrows && rows->nrows[i] > 0 && seqs[i]->n_done == seqs[i]->n_tok : out_of[i] >= 0;
      if (done[i] && !all_logits && !sampling)
        memcpy(logits + (size_t)i * V, tmp + (size_t)out_of[i] * V, sizeof(float) * (size_t)V);
    }
    if (sampling && !ticket && total && e->before_sample) { /* host work while the device computes the step */
      if (e->m->be->submit) e->m->be->submit(e->m->be);
      e->before_sample(e->before_sample_arg);
    }
    if (ticket) st = sm_eng_sample_launch(e, seqs, n, out_of, n_out, smp, ticket);
    else if (sampling && total) st = sample_rows(e, seqs, n, out_of, n_out, smp, tokens, logits);
  }
  free(out_of);
  free(take);
  return st;
#undef ALL_ROWS
}

void sm_engine_set_before_sample(sm_engine *e, void (*fn)(void *arg), void *arg) {
  e->before_sample = fn;
  e->before_sample_arg = arg;
}

void sm_engine_get_stats(const sm_engine *e, sm_engine_stats *st) {
  st->n_blocks = e->p.n_blocks;
  st->block_size = e->p.block_size;
  st->blocks_used = e->p.n_blocks - e->n_free - e->n_cached;
  st->blocks_cached = e->n_cached;
  st->prefix_hits_tokens = e->prefix_hits;
  st->tier_hits_tokens = e->tier_hits;
  st->state_slots = e->slots.n;
  st->state_slots_used = e->slots.n - e->slots.n_free;
  st->state_bytes = sm_model_state_bytes(e->m);
}

bool sm_engine_recurrent(const sm_engine *e) { return e->rec; }

/* ---- KV export / import (prompt cache files, session restore) ---- */

/* Host copies of the K/V slots of tokens [t0, t0+n) of s in one layer, block run by block run
 * (elements of the cache's type, copied as they are). */
static smelt_status kv_copy(sm_engine *e, sm_seq *s, int layer, int t0, int n, void *k, void *v, bool to_host) {
  if (e->m->tp) /* rank 0 holds its own heads' (or layers') K/V only */
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "KV export and import (prompt caches, saved sessions) are not supported with a "
                  "model split over ranks (-tp, -pp)");
  if (e->rec)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "KV export and import (prompt caches, saved sessions) are not "
                  "supported for models with recurrent layers (%s)",
                  e->m->cfg.model_type);
  if (e->kv.layer_head_dim)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "KV export and import (prompt caches, saved sessions) are not supported for models whose layers "
                  "have their own K/V shapes or share K/V (%s)",
                  e->m->cfg.model_type);
  if (layer < 0 || layer >= e->kv.n_layers) return sm_err(SMELT_ERR_INVALID, "KV layer %d out of range", layer);
  if (t0 < 0 || n < 0 || t0 + n > s->n_blk * e->p.block_size)
    return sm_err(SMELT_ERR_INVALID, "KV tokens [%d, %d) outside the sequence's blocks", t0, t0 + n);
  sm_backend *be = e->m->be;
  const int bs = e->p.block_size;
  const size_t row = (size_t)e->kv.n_kv_heads * sm_kv_head_bytes(e->kv.dtype, e->kv.head_dim); /* bytes */
  char *K = e->kv.k[layer], *V = e->kv.v[layer];
  for (int t = t0; t < t0 + n;) {
    const int in_blk = t % bs, run = SM_MIN(bs - in_blk, t0 + n - t);
    const size_t slot = (size_t)s->blk[t / bs] * bs + in_blk, bytes = row * run;
    char *hk = (char *)k + (size_t)(t - t0) * row, *hv = (char *)v + (size_t)(t - t0) * row;
    if (to_host) {
      be->download(be, hk, K + slot * row, bytes);
      be->download(be, hv, V + slot * row, bytes);
    } else {
      be->upload(be, K + slot * row, hk, bytes);
      be->upload(be, V + slot * row, hv, bytes);
    }
    t += run;
  }
  if (!to_host && be->sync) be->sync(be); /* the caller may reuse k, v at once */
  return SMELT_OK;
}

smelt_status sm_seq_kv_read(sm_engine *e, const sm_seq *s, int layer, int t0, int n, void *k, void *v) {
  if (t0 + n > s->n_done)
    return sm_err(SMELT_ERR_INVALID, "KV of tokens [%d, %d) not computed (%d are)", t0, t0 + n, s->n_done);
  return kv_copy(e, (sm_seq *)s, layer, t0, n, k, v, true);
}

smelt_status sm_seq_kv_reserve(sm_engine *e, sm_seq *s, int n) {
  if (e->rec) return kv_copy(e, s, 0, 0, 0, NULL, NULL, false); /* the error */
  if (s->n_done || s->n_blk) return sm_err(SMELT_ERR_INVALID, "KV import into a sequence that already has KV");
  if (n < 0 || n > s->n_tok)
    return sm_err(SMELT_ERR_INVALID, "KV import of %d tokens into a sequence of %d", n, s->n_tok);
  const int nb = (n + e->p.block_size - 1) / e->p.block_size;
  if (nb > e->n_free + e->n_cached)
    return sm_err(SMELT_ERR_OOM, "KV cache full: need %d blocks, %d free", nb, e->n_free + e->n_cached);
  while (s->n_blk < nb) s->blk[s->n_blk++] = sm_eng_block_alloc(e);
  return SMELT_OK;
}

smelt_status sm_seq_kv_write(sm_engine *e, sm_seq *s, int layer, int t0, int n, const void *k, const void *v) {
  return kv_copy(e, s, layer, t0, n, (void *)k, (void *)v, false);
}

smelt_status sm_seq_kv_commit(sm_engine *e, sm_seq *s, int n) {
  if (e->rec) return kv_copy(e, s, 0, 0, 0, NULL, NULL, false); /* the error */
  if (n < 0 || n > s->n_tok || n > s->n_blk * e->p.block_size)
    return sm_err(SMELT_ERR_INVALID, "KV commit of %d tokens (sequence %d, reserved %d)", n, s->n_tok,
                  s->n_blk * e->p.block_size);
  s->n_done = n;
  sm_eng_register_full(e, s);
  return SMELT_OK;
}

int sm_engine_max_context(const sm_engine *e) { return e->p.max_context; }
sm_dtype sm_engine_kv_dtype(const sm_engine *e) { return e->kv.dtype; }

/* ---- a second tier of the prefix cache ---- */

bool sm_engine_set_prefix_tier(sm_engine *e, const sm_prefix_tier *t) {
  if (!e->p.prefix_cache || e->rec || e->m->tp) return false; /* (a split model: rank 0 has its share only) */
  if (t) e->tier = *t;
  else memset(&e->tier, 0, sizeof e->tier);
  return true;
}

/* bytes of one block of layer l, K or V */
static size_t block_layer_bytes(const sm_engine *e, int l) {
  return (size_t)e->p.block_size * sm_kv_row_bytes(&e->kv, l);
}

size_t sm_engine_block_bytes(const sm_engine *e) {
  size_t n = 0;
  for (int l = 0; l < e->kv.n_layers; l++) /* K, and V where it is not K's buffer (multi-head latent attention) */
    if (e->kv.k[l]) n += (e->kv.v[l] == e->kv.k[l] ? 1 : 2) * block_layer_bytes(e, l);
  return n;
}

void sm_engine_block_read(sm_engine *e, int blk, void *host) {
  sm_backend *be = e->m->be;
  char *h = host;
  for (int l = 0; l < e->kv.n_layers; l++) {
    if (!e->kv.k[l]) continue;
    const size_t lb = block_layer_bytes(e, l);
    be->download(be, h, (const char *)e->kv.k[l] + (size_t)blk * lb, lb);
    h += lb;
    if (e->kv.v[l] == e->kv.k[l]) continue;
    be->download(be, h, (const char *)e->kv.v[l] + (size_t)blk * lb, lb);
    h += lb;
  }
}

void sm_engine_block_write(sm_engine *e, int blk, const void *host) {
  sm_backend *be = e->m->be;
  const char *h = host;
  for (int l = 0; l < e->kv.n_layers; l++) {
    if (!e->kv.k[l]) continue;
    const size_t lb = block_layer_bytes(e, l);
    be->upload(be, (char *)e->kv.k[l] + (size_t)blk * lb, h, lb);
    h += lb;
    if (e->kv.v[l] == e->kv.k[l]) continue;
    be->upload(be, (char *)e->kv.v[l] + (size_t)blk * lb, h, lb);
    h += lb;
  }
  if (be->sync) be->sync(be); /* the caller may reuse host at once */
}

void sm_engine_each_prefix_block(sm_engine *e,
                                 void (*fn)(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent,
                                            const int32_t *tok),
                                 void *ud) {
  const int bs = e->p.block_size;
  for (int b = e->lru_head; b >= 0; b = e->lru_next[b])
    fn(ud, e, b, e->hash[b], e->parent[b], e->btok + (size_t)b * bs);
  for (int b = 0; b < e->p.n_blocks; b++)
    if (e->ref[b] > 0 && e->hash[b]) fn(ud, e, b, e->hash[b], e->parent[b], e->btok + (size_t)b * bs);
}
