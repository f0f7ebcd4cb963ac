/* Prompt cache files of `smelt serve` (private to src/server), in the format of
 * engine/prompt_cache.h.
 * --prompt-cache FILE seeds the engine's prefix cache at start with the KV the file holds, so
 * that every request whose prompt starts with the file's tokens reuses it; at shutdown the
 * longest prompt prefix that requests reused from the prefix cache is written back (unless
 * --prompt-cache-ro, or the file already starts with it).
 * Slot files (llama-server's POST /slots/{id}?action=save|restore, --slot-save-path): a save
 * writes the part of a slot's last sequence that is still in the prefix cache; a restore loads a
 * file into the prefix cache. */
#ifndef SM_SERVER_PCACHE_H
#define SM_SERVER_PCACHE_H
#include "server/sched.h"

typedef struct {
  char *path;        /* NULL: no file */
  bool ro;           /* never written */
  int32_t *file_tok; /* the file's tokens at start */
  int n_file;
  int n_seeded; /* tokens put into the prefix cache (whole blocks) */
} sm_pcache;

/* After the engine is created, before it serves: open and check path against the engine's
 * model and seed the prefix cache. A file that does not exist is created at shutdown (an error
 * with ro). False after printing why (corrupt, another model or KV format, too long). */
bool sm_pcache_open(sm_pcache *pc, sm_engine *e, const char *path, bool ro);
/* After the engine thread stopped: write s's longest reused prefix to the file (see above). */
void sm_pcache_save(sm_pcache *pc, sm_engine *e, const sm_sched *s);
void sm_pcache_free(sm_pcache *pc);

/* Engine thread. Save: the KV of the longest prefix of tok[0..n) in e's prefix cache to path;
 * *n_saved tokens, *bytes written. Restore: check path against e's model, put its whole blocks
 * into the prefix cache; *tok (malloc'd) and *n: the file's tokens, *bytes its size. Errors: a
 * status and msg (SMELT_ERR_IO: the file system; SMELT_ERR_OOM: no free KV blocks; other: the
 * file or the slot). */
smelt_status sm_pcache_slot_save(sm_engine *e, const int32_t *tok, int n, const char *path, int *n_saved,
                                 uint64_t *bytes, char *msg, size_t msg_n);
smelt_status sm_pcache_slot_restore(sm_engine *e, const char *path, int32_t **tok, int *n, uint64_t *bytes, char *msg,
                                    size_t msg_n);

#endif
