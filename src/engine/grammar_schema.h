/* JSON Schema -> GBNF (grammar.h): the rules that let exactly the JSON texts a schema accepts
 * (within the supported keywords) be generated, for response_format json_schema / json_object,
 * llama-server's json_schema field and tool-call arguments.
 *
 * Supported: type (one or a list), properties (generated in schema order), required,
 * additionalProperties (false, or true/a schema for objects without properties), enum, const,
 * anyOf, oneOf (as anyOf), allOf (of object schemas), $ref to "#", "#/$defs/..." and
 * "#/definitions/...", items, prefixItems, minItems, maxItems, minLength, maxLength, format
 * date / time / date-time / uuid, and the annotations (title, description, default, examples,
 * $schema, $id, $comment, strict, deprecated, readOnly, writeOnly). Other keywords (pattern,
 * minimum, maximum, multipleOf, not, if/then/else, uniqueItems, ...) are an error in strict mode
 * and otherwise ignored, so the output can then break them. Numbers have at most 16 integer and
 * 16 fraction digits; whitespace between tokens is at most one space or a newline and 20
 * blanks (as llama.cpp's converter). */
#ifndef SM_GRAMMAR_SCHEMA_H
#define SM_GRAMMAR_SCHEMA_H
#include <cjson/cJSON.h>
#include "base/strbuf.h"
#include "base/base.h"

typedef struct sm_gbnf sm_gbnf;

sm_gbnf *sm_gbnf_new(void);
void sm_gbnf_free(sm_gbnf *b);
/* Add the rules for schema (its own document for $ref). *rule receives the name of the rule
 * to reference (owned by b). strict: unsupported keywords are an error. SMELT_ERR_INVALID with
 * a message naming the keyword and its JSON pointer. */
smelt_status sm_gbnf_add_schema(sm_gbnf *b, const cJSON *schema, bool strict, const char **rule);
/* A rule of the caller's: `name ::= body` (name must be unique; body in GBNF). */
void sm_gbnf_add_rule(sm_gbnf *b, const char *name, const char *body);
/* Append s as a GBNF string literal ("...", escaped) to out. */
void sm_gbnf_literal(sm_buf *out, const char *s, size_t n);
/* The whole grammar text (rules added so far and the shared ones they use); b stays valid. */
const char *sm_gbnf_text(sm_gbnf *b);

/* One call: the grammar of a whole document matching schema (root ::= schema). */
smelt_status sm_schema_to_gbnf(const cJSON *schema, bool strict, char **gbnf);

#endif
