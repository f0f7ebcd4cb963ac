/* Internal tokenizer API (the public part is in smelt.h).
 * A smelt_tokenizer is immutable after load and safe to share between threads. */
#ifndef SM_TOKENIZER_H
#define SM_TOKENIZER_H
#include "base/base.h"
#include "base/strbuf.h"

/* Load from explicit file paths (tokenizer_config may be NULL). */
smelt_status sm_tok_load_files(const char *tokenizer_json, const char *tokenizer_config_json, smelt_tokenizer **out);
/* Vocab lookups: id of an exact token string (added tokens included), -1 if absent. */
int32_t sm_tok_token_id(const smelt_tokenizer *t, const char *token);
/* Raw vocab string of id (as in tokenizer.json), NULL if out of range. Borrowed. */
const char *sm_tok_id_to_token(const smelt_tokenizer *t, int32_t id);
/* the token's bytes and their count (a token may contain NUL bytes); NULL for an unknown id */
const char *sm_tok_id_token(const smelt_tokenizer *t, int32_t id, size_t *len);
bool sm_tok_is_special(const smelt_tokenizer *t, int32_t id);
/* From tokenizer_config.json (NULL if not given). Borrowed. */
const char *sm_tok_bos_token(const smelt_tokenizer *t);
const char *sm_tok_eos_token(const smelt_tokenizer *t);
/* Chat template: name NULL = "default" (string form, or the entry named "default" in the
 * list form, or a chat_template.jinja file next to tokenizer_config.json). NULL if none. */
const char *sm_tok_chat_template(const smelt_tokenizer *t, const char *name);
/* Whether the post-processor adds a BOS (for chat prompts that already contain it). */
bool sm_tok_adds_bos(const smelt_tokenizer *t);

/* The bytes token id adds to a text in its middle (decoder applied to it alone; a byte-level
 * token may be part of a UTF-8 character). Replaces out's contents; false for an unknown id.
 * (tok_bytes.c) */
bool sm_tok_piece_bytes(const smelt_tokenizer *t, int32_t id, sm_buf *out);

/* Like smelt_detokenize, also giving the length (the text may contain NUL bytes). */
smelt_status sm_tok_decode(const smelt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text,
                           size_t *len);

/* Streaming detokenizer: push ids one at a time, get back only complete UTF-8 text
 * (partial byte sequences are held until completed; output equals
 * smelt_detokenize of all ids so far). */
typedef struct sm_detok sm_detok;
sm_detok *sm_detok_new(const smelt_tokenizer *t, bool skip_special);
/* Appends the newly completed text to *out (malloc'd, NUL-terminated, caller frees;
 * may be ""), returns its length. */
size_t sm_detok_push(sm_detok *d, int32_t id, char **out);
/* Flush whatever is held at the end (invalid bytes become U+FFFD as in HF). */
size_t sm_detok_flush(sm_detok *d, char **out);
void sm_detok_free(sm_detok *d);

#endif
