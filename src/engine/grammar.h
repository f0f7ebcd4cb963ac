/* Constrained decoding: context-free grammars (llama.cpp's GBNF notation) that restrict which
 * tokens a sequence may sample next.
 *
 * - sm_grammar: a compiled grammar (immutable, shareable between sequences and threads).
 * - sm_grammar_vocab: the tokenizer's vocabulary as a byte trie of the bytes each token adds
 *   to a text (immutable, built once per tokenizer).
 * - sm_grammar_state: one sequence's parser state (a set of pushdown stacks plus an unfinished
 *   UTF-8 character, so a byte-level token may end in the middle of a character).
 *
 * Each step, sm_grammar_mask fills a bitset over the vocabulary (bit t set: token t keeps the
 * text a prefix of some sentence of the grammar); the sampler sets the logits of the other
 * tokens to -inf (step 0 of sm_sample_row, backend.h; on the GPU for the CUDA backend) and
 * sm_grammar_accept advances the state by the sampled token. End-of-sequence tokens are allowed
 * exactly when the text so far is a complete sentence. Special tokens are never allowed, except where the grammar names one
 * with <[id]>.
 *
 * GBNF as in llama.cpp: `name ::= alternatives`, "literals" with \n \t \r \\ \" \xHH \uHHHH
 * \UHHHHHHHH escapes, [character classes] and [^negated], `.` (any character), ( groups ),
 * `|`, postfix `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}`, `#` comments, and <[id]> for one token
 * by id. Rules continue over lines only inside parentheses or after `|`. Left recursion is an
 * error (the grammar could never advance). */
#ifndef SM_GRAMMAR_H
#define SM_GRAMMAR_H
#include "base/base.h"
#include "base/pool.h"
#include "tokenizer/tokenizer.h"

typedef struct sm_grammar sm_grammar;
typedef struct sm_grammar_vocab sm_grammar_vocab;
typedef struct sm_grammar_state sm_grammar_state;
typedef struct sm_gmask_cache sm_gmask_cache; /* grammar_cache.h */

/* Compile GBNF text; the start rule is `root`. SMELT_ERR_FORMAT with "line L col C: ..." on a
 * syntax error, an undefined rule, left recursion or a grammar too large. */
smelt_status sm_grammar_compile(const char *gbnf, sm_grammar **out);
/* sm_grammar_free drops a reference; the last one frees. sm_grammar_ref adds one (returns g). */
void sm_grammar_free(sm_grammar *g);
sm_grammar *sm_grammar_ref(sm_grammar *g);
int sm_grammar_n_rules(const sm_grammar *g);

/* The vocabulary of tokenizer t (vocab ids [0, vocab)); eos: the end-of-sequence ids. */
sm_grammar_vocab *sm_grammar_vocab_new(const smelt_tokenizer *t, int vocab, const int32_t *eos, int n_eos);
void sm_grammar_vocab_free(sm_grammar_vocab *v);
int sm_grammar_vocab_size(const sm_grammar_vocab *v);

/* A fresh state at the start of g. Both g and v must outlive it. */
sm_grammar_state *sm_grammar_state_new(const sm_grammar *g, const sm_grammar_vocab *v);
void sm_grammar_state_free(sm_grammar_state *s);
/* Look masks up in (and add new ones to) c, shared with other sequences and threads; NULL: none
 * (each state still keeps its own few most recent masks). c must outlive s. */
void sm_grammar_state_set_cache(sm_grammar_state *s, sm_gmask_cache *c);
/* Compute what each position of g decides on its own with vocabulary v (grammar_int.h), so that
 * masks walk only the tokens left uncertain instead of the vocabulary. What is not computed here
 * is computed by the first mask that needs it. Thread-safe; the results live as long as g. Costs
 * about a mask walk per position of g: a server does it when a request's grammar is compiled. */
void sm_grammar_precompute(const sm_grammar *g, const sm_grammar_vocab *v);
/* The entries of positions shared between grammars of one vocabulary (grammar_share.c): how many
 * a grammar took from another since the process started, and how many are held now. */
void sm_grammar_shared_counts(uint64_t *hits, uint64_t *entries);
/* Whether s builds masks from what its stacks' tops decide, shared by all states of the grammar
 * (default: XGrammar's adaptive token mask cache; grammar_int.h), or walks the vocabulary with the
 * whole state every time (for tests and benchmarks comparing the two). */
void sm_grammar_state_use_positions(sm_grammar_state *s, bool on);
/* mask: (vocab + 31) / 32 words, bit t of word t/32 set when token t is allowed next.
 * Returns the number of allowed tokens (0: nothing can follow; the caller ends the sequence). */
int sm_grammar_mask(sm_grammar_state *s, uint32_t *mask);
/* The masks of n distinct states (the constrained sequences of one step) at once, spread over the
 * threads of pool (NULL: this thread alone): masks[i] and counts[i] as sm_grammar_mask(s[i]). The
 * states of one call must be different objects (they may share a grammar, vocabulary and cache). */
void sm_grammar_mask_many(sm_grammar_state *const *s, uint32_t *const *masks, int *counts, int n, sm_pool *pool);
/* Advance by a token. SMELT_ERR_INVALID (state unchanged) when the token is not allowed. */
smelt_status sm_grammar_accept(sm_grammar_state *s, int32_t tok);
/* Advance by text bytes (as if generated). SMELT_ERR_INVALID (state unchanged) if not allowed. */
smelt_status sm_grammar_accept_bytes(sm_grammar_state *s, const char *bytes, size_t n);
/* The text so far is a complete sentence (an end-of-sequence token is allowed). */
bool sm_grammar_complete(const sm_grammar_state *s);
/* Nothing but the end can follow (the sequence may stop without sampling EOS). */
bool sm_grammar_finished(const sm_grammar_state *s);
/* An end-of-sequence token was accepted. */
bool sm_grammar_ended(const sm_grammar_state *s);

static inline bool sm_mask_test(const uint32_t *m, int32_t t) { return (m[t >> 5] >> (t & 31)) & 1u; }
static inline void sm_mask_set(uint32_t *m, int32_t t) { m[t >> 5] |= 1u << (t & 31); }

#endif
