/* Constrained decoding for `smelt serve` requests (private to src/server). */
#ifndef SM_SERVER_CONSTRAIN_H
#define SM_SERVER_CONSTRAIN_H
#include "engine/grammar.h"
#include "server/api.h"
#include "server/gpool.h"
#include "server/toolcall.h"

/* The compiled grammar request r asks for, or *out = NULL when it asks for none. fmt: the
 * model's tool-call format (NULL: none known). pool: where grammars of the same text are shared
 * (NULL: compiled for this request). false with a 400 in err when the grammar, schema or tools
 * cannot be turned into a grammar. */
bool sm_constrain_build(const smelt_tokenizer *tok, const sm_toolfmt *fmt, sm_gpool *pool, const sm_api_request *r,
                        sm_grammar **out, sm_api_error *err);

#endif
