/* Prompt cache files: the KV cache of a token prefix saved to disk and loaded again (llama.cpp's
 * --prompt-cache, mlx-lm's cache_prompt). A file is tied to the model it was made with (a
 * fingerprint of its config and weights) and to the KV format (layers, KV heads, head size, element
 * type); it carries a SHA-256 of its contents. A file that is corrupt, truncated, of another
 * version, model or KV format is refused with an error saying which, and never used.
 * Format: docs/cli.md ("Prompt cache files"). */
#ifndef SM_PROMPT_CACHE_H
#define SM_PROMPT_CACHE_H
#include "engine/engine.h"

#define SM_PCACHE_VERSION 1

/* SHA-256 over config.json and, for every tensor, its name, type, shape, size and sampled data
 * (all of a small tensor; 16 spread windows of a large one): changes with any fine-tune or
 * re-quantization, costs a few page reads. */
smelt_status sm_model_fingerprint(const smelt_model *m, uint8_t out[32]);

/* Write the KV of the first n computed tokens of s (engine e) to path (atomically: a temporary
 * file renamed over it). */
smelt_status sm_prompt_cache_save(sm_engine *e, const sm_seq *s, int n, const char *path);

typedef struct sm_prompt_cache sm_prompt_cache;
/* Open and check a file against model m: header, version, fingerprint, KV format, size, token ids
 * and the SHA-256 of the whole file (read once). The file stays open until close. */
smelt_status sm_prompt_cache_open(const char *path, const smelt_model *m, sm_prompt_cache **out);
void sm_prompt_cache_close(sm_prompt_cache *pc);
int sm_prompt_cache_len(const sm_prompt_cache *pc);
const int32_t *sm_prompt_cache_tokens(const sm_prompt_cache *pc);
/* Tokens of ids[0..n) that the file's tokens start with (its usable prefix for that prompt). */
int sm_prompt_cache_match(const sm_prompt_cache *pc, const int32_t *ids, int n);
/* Into an empty sequence s of engine e (whose model the file was opened for): append the file's
 * first n tokens and load their KV, so that s continues from there without computing them. */
smelt_status sm_prompt_cache_restore(const sm_prompt_cache *pc, sm_engine *e, sm_seq *s, int n);
/* For a server with a prefix cache: load the file's full KV blocks into e's prefix cache (a
 * temporary sequence, freed again), so that any later sequence whose prompt starts with the
 * file's tokens reuses them through sm_seq_use_prefix_cache. *n_tokens (may be NULL): tokens
 * now held there (the file's length rounded down to whole blocks). */
smelt_status sm_prompt_cache_seed(const sm_prompt_cache *pc, sm_engine *e, int *n_tokens);

#endif
