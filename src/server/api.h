/* OpenAI-compatible API layer of `smelt serve`: request parsing/validation, error bodies,
 * stop strings, tool-call parsing. Pure functions (no model/engine), unit-tested and fuzzed
 * in tests/server. */
#ifndef SM_SERVER_API_H
#define SM_SERVER_API_H
#include <cjson/cJSON.h>
#include "base/base.h"

typedef enum { SM_EP_CHAT = 0, SM_EP_COMPLETIONS, SM_EP_RESPONSES, SM_EP_MESSAGES, SM_EP_EMBEDDINGS } sm_ep_kind;
enum { SM_TOOLS_AUTO = 0, SM_TOOLS_NONE, SM_TOOLS_REQUIRED, SM_TOOLS_NAMED };

#define SM_API_MAX_STOP 16
#define SM_API_MAX_N 16
#define SM_API_MAX_TOP_LOGPROBS 20
#define SM_API_MAX_LOGIT_BIAS 1024
#define SM_API_MAX_IMAGES 16

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
  char *model;                 /* requested model (informational), may be NULL */
  cJSON *messages;             /* chat/responses: normalized [{role, content(string|null), tool_calls?, ...}] */
  cJSON *tools;                /* tools array for the template, NULL if none (or tool_choice "none") */
  cJSON *chat_template_kwargs; /* extra template context, NULL if none */
  char *prompt;                /* completions: prompt text, NULL if prompt_ids used */
  char **prompts;              /* completions with an array of >= 2 prompts: each a string ... */
  int32_t **prompt_lists;
  int *prompt_lens; /* ... or a token-id list (prompts[i] NULL) */
  int n_prompts;
  int32_t *prompt_ids;
  int n_prompt_ids;        /* completions: token-id prompt */
  smelt_sampling sampling; /* seed: 0 if not given (has_seed false) */
  bool has_seed;
  uint64_t seed;
  bool has_temperature, has_top_p, has_top_k;
  int n;          /* choices */
  int max_tokens; /* -1 = not given */
  char *stop[SM_API_MAX_STOP];
  int n_stop;
  bool stream, include_usage;
  bool ignore_eos; /* vLLM / llama-server: keep generating after end-of-sequence tokens */
  /* llama-server's speculative.n_max (draft tokens per step, 0: no speculation), speculative.n_min and
   * speculative.p_min; not given: the server's --draft-max, --draft-min, --draft-p-min */
  bool has_spec_n_max, has_spec_n_min, has_spec_p_min;
  int spec_n_max, spec_n_min;
  float spec_p_min;
  bool logprobs;
  int top_logprobs;         /* completions: logprobs=k -> logprobs=true, top_logprobs=k */
  bool json_mode;           /* response_format json_object / json_schema, or a json_schema field */
  cJSON *json_schema;       /* the schema to enforce ({"type":"object"} for json_object), NULL if none */
  bool schema_strict;       /* json_schema.strict: unsupported schema keywords are an error */
  char *grammar;            /* llama-server's `grammar` (GBNF), NULL if none */
  int tool_choice;          /* SM_TOOLS_* */
  char *tool_name;          /* SM_TOOLS_NAMED: the function */
  bool parallel_tool_calls; /* default true */
  bool echo;                /* completions echo (prompt text is prepended) */
  char *user;               /* ignored, kept for completeness */
  char *reasoning_effort;   /* handed to the chat template, NULL if not given */
  int32_t *bias_ids;
  float *bias_vals;
  int n_bias;      /* logit_bias */
  bool emb_base64; /* embeddings: encoding_format base64 */
  char **image_urls;
  int n_images; /* image content parts in order (data:, http(s):); the messages hold
                                    * {type: "image"} parts at their places */
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

#endif
