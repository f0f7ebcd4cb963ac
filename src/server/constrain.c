/* Which grammar a request's output must follow (see constrain.h): llama-server's `grammar`,
 * a JSON schema (response_format, text.format, `json_schema`), or the model's tool-call format
 * when tool_choice is "required" or names a function. */
#include "server/constrain.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_schema.h"

#define REJECT(param, ...) \
  do { \
    sm_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__); \
    goto fail; \
  } while (0)

bool sm_constrain_build(const smelt_tokenizer *tok, const sm_toolfmt *fmt, sm_gpool *pool, const sm_api_request *r,
                        sm_grammar **out, sm_api_error *err) {
  *out = NULL;
  char *gbnf = NULL;
  const char *param = r->grammar ? "grammar" : r->kind == SM_EP_RESPONSES ? "text.format" : "response_format";
  bool tools = r->tools && (r->tool_choice == SM_TOOLS_REQUIRED || r->tool_choice == SM_TOOLS_NAMED);
  if (r->grammar) {
    gbnf = sm_xstrdup(r->grammar);
  } else if (r->json_schema) {
    if (sm_schema_to_gbnf(r->json_schema, r->schema_strict, &gbnf) != SMELT_OK) REJECT(param, "%s", sm_errmsg());
  } else if (tools) {
    param = "tool_choice";
    if (!fmt) REJECT(param, "this model's chat template has no known tool-call format to enforce 'tool_choice'");
    if (sm_toolfmt_grammar(fmt, tok, r->tools, r->tool_choice == SM_TOOLS_NAMED ? r->tool_name : NULL,
                           r->parallel_tool_calls, &gbnf) != SMELT_OK)
      REJECT("tools", "%s", sm_errmsg());
  } else {
    return true;
  }
  if ((pool ? sm_gpool_get(pool, gbnf, out) : sm_grammar_compile(gbnf, out)) != SMELT_OK)
    REJECT(param, "%s", sm_errmsg());
  free(gbnf);
  return true;
fail:
  free(gbnf);
  return false;
}
