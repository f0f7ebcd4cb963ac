/* Anthropic Messages API (private to src/server): request fields -> the normalized chat
 * request, a finished job -> a Message object, and the streaming events (message_start,
 * content_block_start/delta/stop for thinking, text and tool_use blocks, message_delta,
 * message_stop). Errors use Anthropic's shape {"type":"error","error":{type,message}}. */
#ifndef SM_SERVER_ANTHROPIC_H
#define SM_SERVER_ANTHROPIC_H
#include <cjson/cJSON.h>
#include "server/api.h"
#include "server/sse.h"

/* The /v1/messages fields of root (after the common sampling fields) into r. */
bool sm_anth_parse_fields(const cJSON *root, sm_api_request *r, sm_api_error *err);
cJSON *sm_anth_response(const sm_oai *o, sm_job *j);
void sm_anth_sse_produce(sm_sse *st);
/* POST /v1/messages/count_tokens: {input_tokens} of the rendered prompt */
cJSON *sm_anth_count_tokens(const sm_oai *o, const char *body, size_t len, sm_api_error *err);
char *sm_anth_error_json(const sm_api_error *e);

#endif
