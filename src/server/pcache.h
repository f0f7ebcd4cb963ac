/* Prompt cache file of `smelt serve` (private to src/server): --prompt-cache FILE seeds the
 * engine's prefix cache at start with the KV the file holds (engine/prompt_cache.h), so that
 * every request whose prompt starts with the file's tokens reuses it; at shutdown the longest
 * prompt prefix that requests reused from the prefix cache is written back (unless
 * --prompt-cache-ro, or the file already starts with it). */
#ifndef SM_SERVER_PCACHE_H
#define SM_SERVER_PCACHE_H
#include "server/sched.h"

typedef struct {
  char *path;        /* NULL: no file */
  bool ro;           /* never written */
  int32_t *file_tok; /* the file's tokens at start */
  int n_file;
  int n_seeded;      /* tokens put into the prefix cache (whole blocks) */
} sm_pcache;

/* After the engine is created, before it serves: open and check path against the engine's
 * model and seed the prefix cache. A file that does not exist is created at shutdown (an error
 * with ro). False after printing why (corrupt, another model or KV format, too long). */
bool sm_pcache_open(sm_pcache *pc, sm_engine *e, const char *path, bool ro);
/* After the engine thread stopped: write s's longest reused prefix to the file (see above). */
void sm_pcache_save(sm_pcache *pc, sm_engine *e, const sm_sched *s);
void sm_pcache_free(sm_pcache *pc);

#endif
