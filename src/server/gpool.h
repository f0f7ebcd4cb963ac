/* Compiled grammars of `smelt serve` shared between requests (private to src/server): requests
 * whose grammar has the same GBNF text (the same JSON schema, the same tools) get the same
 * compiled sm_grammar, so their sequences share masks in the server's mask cache
 * (engine/grammar_cache.h, --grammar-cache). Thread-safe: HTTP threads look grammars up, the
 * models' engine threads build masks. At most SM_GPOOL_MAX grammars are kept; the least recently
 * used one is dropped (requests running with it keep their reference). */
#ifndef SM_SERVER_GPOOL_H
#define SM_SERVER_GPOOL_H
#include "engine/grammar.h"
#include "engine/grammar_cache.h"

#define SM_GPOOL_MAX 256

typedef struct sm_gpool sm_gpool;

/* mask_bytes: the mask cache's budget (0: no mask cache). */
sm_gpool *sm_gpool_new(size_t mask_bytes);
void sm_gpool_free(sm_gpool *p);
/* The compiled grammar of gbnf, a reference of the caller's (sm_grammar_free): the pool's when
 * it compiled the same text before. Errors are sm_grammar_compile's. */
smelt_status sm_gpool_get(sm_gpool *p, const char *gbnf, sm_grammar **out);
/* The mask cache (NULL when the budget is 0). */
sm_gmask_cache *sm_gpool_masks(sm_gpool *p);
/* Grammars compiled, and requests that got one compiled before. */
void sm_gpool_counts(sm_gpool *p, uint64_t *compiled, uint64_t *reused);

#endif
