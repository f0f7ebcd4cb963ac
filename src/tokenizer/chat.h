/* Chat templates: a Jinja2 subset interpreter in C and the glue that renders a model's
 * chat template the way transformers' apply_chat_template does. */
#ifndef SM_CHAT_H
#define SM_CHAT_H
#include <cjson/cJSON.h>
#include "base/base.h"
#include "tokenizer/tokenizer.h"

typedef struct sm_jinja sm_jinja;
/* Compile a template. On error returns SMELT_ERR_FORMAT with "line N: ..." in the message. */
smelt_status sm_jinja_compile(const char *src, sm_jinja **out);
/* Render with a JSON object as the global context (not modified). *out malloc'd. */
smelt_status sm_jinja_render(const sm_jinja *tpl, const cJSON *context, char **out);
void sm_jinja_free(sm_jinja *tpl);

/* Render the tokenizer's chat template for messages (a JSON array of {role, content, ...}),
 * optional tools (JSON array or NULL), add_generation_prompt; bos_token/eos_token and
 * other special-token strings from tokenizer_config are provided to the template.
 * extra: optional JSON object merged into the context (e.g. enable_thinking). */
smelt_status sm_chat_apply(const smelt_tokenizer *t, const cJSON *messages, const cJSON *tools,
                           bool add_generation_prompt, const cJSON *extra, char **out);

#endif
