/* Prompt cache file of `smelt serve` (see pcache.h). */
#include "server/pcache.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "engine/prompt_cache.h"

bool sm_pcache_open(sm_pcache *pc, sm_engine *e, const char *path, bool ro) {
  memset(pc, 0, sizeof *pc);
  if (!path) return true;
  pc->path = sm_xstrdup(path);
  pc->ro = ro;
  if (sm_regular_or_absent(path) != SMELT_OK) {
    fprintf(stderr, "smelt serve: --prompt-cache %s: %s\n", path, smelt_last_error());
    return false;
  }
  if (!sm_file_exists(path)) {
    if (ro) {
      fprintf(stderr, "smelt serve: --prompt-cache %s does not exist (--prompt-cache-ro never creates it)\n", path);
      return false;
    }
    fprintf(stderr, "smelt serve: prompt cache %s does not exist yet: written at shutdown\n", path);
    return true;
  }
  sm_prompt_cache *f = NULL;
  if (sm_prompt_cache_open(path, sm_engine_model(e), &f) != SMELT_OK) {
    fprintf(stderr, "smelt serve: %s\n", smelt_last_error());
    return false;
  }
  const int n = sm_prompt_cache_len(f), ctx = sm_engine_max_context(e);
  bool ok = false;
  if (n > ctx) {
    fprintf(stderr, "smelt serve: prompt cache %s holds %d tokens, more than the context size %d (-c)\n", path, n, ctx);
  } else if (sm_prompt_cache_seed(f, e, &pc->n_seeded) != SMELT_OK) {
    fprintf(stderr, "smelt serve: prompt cache %s: %s\n", path, smelt_last_error());
  } else {
    pc->n_file = n;
    pc->file_tok = sm_xmalloc(sizeof(int32_t) * (size_t)n);
    memcpy(pc->file_tok, sm_prompt_cache_tokens(f), sizeof(int32_t) * (size_t)n);
    fprintf(stderr, "smelt serve: prompt cache %s: %d of its %d tokens in the prefix cache\n", path, pc->n_seeded, n);
    ok = true;
  }
  sm_prompt_cache_close(f);
  return ok;
}

void sm_pcache_save(sm_pcache *pc, sm_engine *e, const sm_sched *s) {
  if (!pc->path || pc->ro) return;
  const int n = s->n_hot;
  if (n == 0) {
    fprintf(stderr, "smelt serve: prompt cache %s: no request reused a prompt prefix; the file is %s\n", pc->path,
            pc->n_file ? "left as it was" : "not written");
    return;
  }
  if (n <= pc->n_file && !memcmp(s->hot, pc->file_tok, sizeof(int32_t) * (size_t)n)) {
    fprintf(stderr, "smelt serve: prompt cache %s already holds the longest reused prefix (%d tokens)\n", pc->path, n);
    return;
  }
  /* the prefix's KV is still in the prefix cache unless evicted since: take what is there (one
   * token more, so that all n can be reused: the last token of a prompt is always recomputed) */
  sm_seq *q = sm_seq_new(e);
  int got = 0;
  if (sm_seq_append(e, q, s->hot, n) == SMELT_OK && sm_seq_append(e, q, s->hot, 1) == SMELT_OK)
    got = sm_seq_use_prefix_cache(e, q);
  if (got == 0 || (got <= pc->n_file && !memcmp(s->hot, pc->file_tok, sizeof(int32_t) * (size_t)got))) {
    fprintf(stderr, "smelt serve: prompt cache %s: the reused prefix is no longer cached; the file is %s\n", pc->path,
            pc->n_file ? "left as it was" : "not written");
  } else if (sm_prompt_cache_save(e, q, got, pc->path) != SMELT_OK) {
    fprintf(stderr, "smelt serve: prompt cache %s: %s\n", pc->path, smelt_last_error());
  } else {
    fprintf(stderr, "smelt serve: prompt cache %s: saved %d tokens\n", pc->path, got);
  }
  sm_seq_free(e, q);
}

void sm_pcache_free(sm_pcache *pc) {
  free(pc->path);
  free(pc->file_tok);
  memset(pc, 0, sizeof *pc);
}

/* a sequence holding the cached part of tok[0..n): one token more when there is room, so that
 * all n can be reused (the last token of a sequence is always recomputed) */
static sm_seq *probe(sm_engine *e, const int32_t *tok, int n, int *got) {
  sm_seq *q = sm_seq_new(e);
  *got = 0;
  if (n > 0 && sm_seq_append(e, q, tok, n) == SMELT_OK) {
    if (n < sm_engine_max_context(e)) sm_seq_append(e, q, tok, 1);
    *got = sm_seq_use_prefix_cache(e, q);
  }
  return q;
}

smelt_status sm_pcache_slot_save(sm_engine *e, const int32_t *tok, int n, const char *path, int *n_saved,
                                 uint64_t *bytes, char *msg, size_t msg_n) {
  *n_saved = 0;
  *bytes = 0;
  if (n == 0) {
    snprintf(msg, msg_n, "the slot holds no tokens (no request has used it since the start, a restore or an erase)");
    return SMELT_ERR_INVALID;
  }
  int got = 0;
  sm_seq *q = probe(e, tok, n, &got);
  smelt_status st = SMELT_OK;
  if (got == 0) {
    snprintf(msg, msg_n, "none of the slot's %d tokens are in the prefix cache (evicted, or less than a block)", n);
    st = SMELT_ERR_INVALID;
  } else if ((st = sm_prompt_cache_save(e, q, got, path)) != SMELT_OK) {
    snprintf(msg, msg_n, "%s", smelt_last_error());
  } else {
    struct stat sb;
    *n_saved = got;
    if (stat(path, &sb) == 0) *bytes = (uint64_t)sb.st_size;
  }
  sm_seq_free(e, q);
  return st;
}

smelt_status sm_pcache_slot_restore(sm_engine *e, const char *path, int32_t **tok, int *n, uint64_t *bytes, char *msg,
                                    size_t msg_n) {
  *tok = NULL;
  *n = 0;
  *bytes = 0;
  struct stat sb;
  if (stat(path, &sb) != 0) {
    snprintf(msg, msg_n, "%s does not exist", path);
    return SMELT_ERR_INVALID;
  }
  sm_prompt_cache *f = NULL;
  smelt_status st = sm_prompt_cache_open(path, sm_engine_model(e), &f);
  if (st) {
    snprintf(msg, msg_n, "%s", smelt_last_error());
    return st == SMELT_ERR_IO ? SMELT_ERR_IO : SMELT_ERR_INVALID;
  }
  const int len = sm_prompt_cache_len(f);
  if (len > sm_engine_max_context(e)) {
    snprintf(msg, msg_n, "%s holds %d tokens, more than the context size %d", path, len, sm_engine_max_context(e));
    st = SMELT_ERR_INVALID;
  } else if ((st = sm_prompt_cache_seed(f, e, NULL)) != SMELT_OK) {
    snprintf(msg, msg_n, "%s", smelt_last_error());
  } else {
    *n = len;
    *tok = sm_xmalloc(sizeof(int32_t) * (size_t)len);
    memcpy(*tok, sm_prompt_cache_tokens(f), sizeof(int32_t) * (size_t)len);
    *bytes = (uint64_t)sb.st_size;
  }
  sm_prompt_cache_close(f);
  return st;
}
