/* OpenAI-compatible API layer of `smelt serve`: request parsing/validation, error bodies,
 * stop strings, tool-call parsing. Pure functions (no model/engine), unit-tested and fuzzed
 * in tests/server. */
#ifndef SM_SERVER_API_H
#define SM_SERVER_API_H
#include <cjson/cJSON.h>
#include "base/base.h"

typedef enum { SM_EP_CHAT = 0, SM_EP_COMPLETIONS, SM_EP_RESPONSES } sm_ep_kind;

#define SM_API_MAX_STOP 16
#define SM_API_MAX_N 16
#define SM_API_MAX_TOP_LOGPROBS 20

/* An OpenAI-style error: {"error":{"message","type","param","code"}} with an HTTP status. */
typedef struct {
  int http_status;
  char message[512];
  const char *type; /* "invalid_request_error", "authentication_error", "server_error", ... */
  char param[64];   /* "" -> null */
  const char *code; /* NULL -> null */
} sm_api_error;

void sm_api_error_set(sm_api_error *e, int http_status, const char *type, const char *param, const char *code,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* malloc'd JSON body */
char *sm_api_error_json(const sm_api_error *e);

typedef struct {
  sm_ep_kind kind;
  char *model;      /* requested model (informational), may be NULL */
  cJSON *messages;  /* chat/responses: normalized [{role, content(string|null), tool_calls?, ...}] */
  cJSON *tools;     /* tools array for the template, NULL if none (or tool_choice "none") */
  cJSON *chat_template_kwargs; /* extra template context, NULL if none */
  char *prompt;     /* completions: prompt text, NULL if prompt_ids used */
  int32_t *prompt_ids; int n_prompt_ids; /* completions: token-id prompt */
  smelt_sampling sampling; /* seed: 0 if not given (has_seed false) */
  bool has_seed; uint64_t seed;
  bool has_temperature, has_top_p, has_top_k;
  int n;            /* choices */
  int max_tokens;   /* -1 = not given */
  char *stop[SM_API_MAX_STOP]; int n_stop;
  bool stream, include_usage;
  bool logprobs; int top_logprobs; /* completions: logprobs=k -> logprobs=true, top_logprobs=k */
  bool json_mode;   /* response_format json_object / json_schema */
  bool echo;        /* completions echo (prompt text is prepended) */
  char *user;       /* ignored, kept for completeness */
} sm_api_request;

/* Parse and validate a request body of the given endpoint. On failure fills err (4xx) and
 * returns false; req is then empty (nothing to free, but freeing is harmless). */
bool sm_api_parse(sm_ep_kind kind, const char *body, size_t len, sm_api_request *req, sm_api_error *err);
void sm_api_request_free(sm_api_request *r);

/* ---- stop strings ---- */
/* Earliest byte offset >= from where any stop string occurs in text[0..len), or -1. */
long sm_stop_find(const char *text, size_t len, size_t from, char *const *stops, int n_stops);
/* Length of the longest suffix of text[0..len) that is a proper prefix of some stop string
 * (bytes that must be held back while streaming). */
size_t sm_stop_holdback(const char *text, size_t len, char *const *stops, int n_stops);

/* ---- tool calls ---- */
/* Parse tool calls out of generated text: Hermes/Qwen "<tool_call>{json}</tool_call>" blocks
 * (any number), or Llama 3 style bare JSON {"name":..,"parameters"|"arguments":..} (optionally
 * after "<|python_tag|>", several separated by ';'). Returns the number of calls found; on > 0
 * *calls is an OpenAI tool_calls array (ids "call_<id_seed>_<i>", arguments as a JSON string) and
 * *content the remaining text (malloc'd, trimmed; NULL if empty). Returns 0 and leaves outputs
 * NULL when the text holds no well-formed call. */
int sm_toolcall_parse(const char *text, uint64_t id_seed, cJSON **calls, char **content);
/* Whether streamed text should be held back entirely because it might turn into a tool call
 * (starts, after whitespace, with '{', "<tool_call>" or "<|python_tag|>" or a prefix of those). */
bool sm_toolcall_may_start(const char *text, size_t len);

/* ---- JSON mode ---- */
/* Incremental tracker of one top-level JSON object: feed bytes; reports when it is complete. */
typedef struct { int depth; bool in_str, esc, started, complete; } sm_json_track;
/* Feed text; returns the number of bytes consumed up to and including the closing '}' if the
 * object completes inside it, else len. Bytes before the first '{' are counted but ignored. */
size_t sm_json_track_feed(sm_json_track *t, const char *s, size_t len);

#endif
