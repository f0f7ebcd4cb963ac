/* Tool calls in generated text, per model family (private to src/server).
 *
 * A format knows how its family writes calls (chosen from the chat template, or by
 * `--tool-format`), how to find them in generated text — also in unfinished text while
 * streaming, so that names and argument text can be sent as they appear — and the grammar
 * that forces a call when tool_choice is "required" or names a function:
 *
 *   hermes        <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Qwen 2.5/3, Hermes)
 *   qwen3_coder   <tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>
 *   llama3        {"name": ..., "parameters": {...}}, optionally after <|python_tag|>, ';'-separated
 *   mistral       [TOOL_CALLS][{"name": ..., "arguments": {...}}] or [TOOL_CALLS]NAME[ARGS]{...}
 *   harmony       <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
 *                 (gpt-oss; also its analysis (reasoning) and final channels)
 *   deepseek      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
 *                 (V3.1) or ...function<｜tool▁sep｜>NAME\n```json\n{...}\n```... (V3, R1)
 *   glm45         <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>
 *   gemma         ```tool_code\nNAME(k=v, ...)\n```  (Python call syntax; also [NAME(...), ...])
 *   generic       hermes blocks, or llama3 JSON at the start of the text (the default when the
 *                 template names no known format)
 */
#ifndef SM_SERVER_TOOLCALL_H
#define SM_SERVER_TOOLCALL_H
#include <cjson/cJSON.h>
#include "base/base.h"
#include "base/strbuf.h"
#include "tokenizer/tokenizer.h"

typedef enum {
  SM_TF_GENERIC = 0,
  SM_TF_HERMES,
  SM_TF_QWEN3_CODER,
  SM_TF_LLAMA3,
  SM_TF_MISTRAL,
  SM_TF_HARMONY,
  SM_TF_DEEPSEEK,
  SM_TF_GLM45,
  SM_TF_GEMMA,
  SM_TF_COUNT
} sm_toolfmt_kind;

typedef struct {
  sm_toolfmt_kind kind;
  const char *name;
  bool keep_special; /* its markers are special tokens: detokenize without skipping them */
} sm_toolfmt;

/* The format a chat template writes tool calls in (generic when none is recognised). */
const sm_toolfmt *sm_toolfmt_detect(const char *chat_template);
/* By name (--tool-format); NULL if unknown. */
const sm_toolfmt *sm_toolfmt_by_name(const char *name);
const char *sm_toolfmt_names(void); /* "hermes, qwen3_coder, ..." */

/* One call found in (possibly unfinished) text. */
typedef struct {
  char *name;  /* NULL until the whole name is known */
  sm_buf args; /* JSON text of the arguments so far (only grows while streaming) */
  bool done;   /* the call (and its arguments) is complete */
} sm_tc_call;

typedef struct {
  sm_buf content;   /* text outside calls */
  size_t safe;      /* bytes of content that cannot turn out to belong to a call */
  sm_buf reasoning; /* harmony: the analysis channel */
  sm_tc_call *calls;
  int n, cap;
} sm_tc_scan;

/* Scan text[0..len). final: the text is complete (an unfinished or malformed call then makes
 * the whole text content, with no calls). tools (may be NULL): the request's tools, whose
 * parameter types decide how XML-style argument values are read. */
void sm_toolfmt_scan(const sm_toolfmt *f, const char *text, size_t len, bool final, const cJSON *tools,
                     sm_tc_scan *out);
void sm_tc_scan_free(sm_tc_scan *s);

/* OpenAI tool_calls array of a finished scan (ids "call_<seed hex><i>"), NULL if no calls. */
cJSON *sm_tc_calls_json(const sm_tc_scan *s, uint64_t id_seed);
void sm_tc_call_id(uint64_t id_seed, int i, char *out, size_t n);

/* GBNF that forces one call (parallel: one or more) of the named tool (NULL: any of tools) in
 * the format, arguments following each tool's parameters schema. */
smelt_status sm_toolfmt_grammar(const sm_toolfmt *f, const smelt_tokenizer *tok, const cJSON *tools, const char *name,
                                bool parallel, char **gbnf);

/* Compatibility helpers (generic format): parse finished text; 0 when it holds no call. */
int sm_toolcall_parse(const char *text, uint64_t id_seed, cJSON **calls, char **content);

#endif
