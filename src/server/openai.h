/* OpenAI API glue of `smelt serve` (private to src/server): a validated request (api.h) becomes a
 * job (chat template rendered, prompt tokenized, context checked); a job's state becomes the
 * OpenAI JSON objects: full responses, streaming chunks, Responses-API objects, usage. */
#ifndef SM_SERVER_OPENAI_H
#define SM_SERVER_OPENAI_H
#include <cjson/cJSON.h>
#include "server/sched.h"
#include "server/image_input.h"
#include "server/output.h"

/* What the API layer knows about the served model. */
typedef struct {
  const char *model_id; /* --alias or the model directory name */
  const char *arch;
  const smelt_tokenizer *tok;
  int vocab, ctx, parallel;
  /* generation_config.json defaults for requests that do not set them (0 = none) */
  float gen_temperature, gen_top_p;
  int gen_top_k;
  const sm_toolfmt *tfmt;         /* tool-call format of the chat template (or --tool-format) */
  bool reasoning;                 /* split <think> text into reasoning_content (--reasoning-format) */
  long created;                   /* when the model was loaded (unix seconds) */
  const char *model_path;         /* the model directory */
  int pooling;                    /* embeddings: sm_pooling (--pooling) */
  const struct sm_vision *vision; /* the model's vision tower, NULL: image parts are refused */
  const char *vision_note;        /* why a model takes no images (its note), may be NULL */
  sm_image_policy images;         /* data: and http(s) image URLs */
  struct sm_gpool *gpool;         /* compiled grammars by text (gpool.h); NULL: compiled per request */
  sm_sched *sched;                /* its grammar vocabulary: a grammar's positions are computed before
                                     the job is queued (NULL: by the masks that need them) */
} sm_oai;

/* Parse a request body of the given endpoint and build its job (not yet queued). On failure
 * fills err (4xx) and returns NULL. */
sm_job *sm_oai_make_job(const sm_oai *o, sm_ep_kind kind, const char *body, size_t len, sm_api_error *err);

/* The rest: under the scheduler's mutex (they read the job's published state). */
cJSON *sm_oai_full_response(const sm_oai *o, sm_job *j);
/* /v1/responses object; status "in_progress" gives the skeleton without output */
cJSON *sm_oai_response_object(const sm_oai *o, sm_job *j, const char *status);
cJSON *sm_oai_usage(const sm_job *j, bool responses);

/* Final content / tool calls / finish reason of a finished choice (content malloc'd or NULL). */
typedef struct {
  char *content;   /* NULL: none */
  char *reasoning; /* NULL: none */
  cJSON *tool_calls;
  const char *finish;
} sm_oai_final;
void sm_oai_finalize(sm_job *j, int i, sm_oai_final *f);

/* Streaming chunk of choice i: text[0..tlen) (NULL: no content field in chat), logprobs of
 * tokens [tfrom, tto), finish reason (NULL: null), tool calls (taken over), role in the delta. */
cJSON *sm_oai_chunk(const sm_oai *o, sm_job *j, int i, const char *text, size_t tlen, int tfrom, int tto,
                    const char *finish, cJSON *tool_calls, bool role);
/* A chat chunk whose delta carries reasoning_content. */
cJSON *sm_oai_reasoning_chunk(const sm_oai *o, sm_job *j, int i, const char *text, size_t tlen);
/* The tool-call id of call k of choice i. */
void sm_oai_call_id(const sm_job *j, int i, int k, char *out, size_t n);
/* The final streaming chunk of stream_options.include_usage: no choices, usage. */
cJSON *sm_oai_usage_chunk(const sm_oai *o, sm_job *j);
/* Number of tokens of choice c whose text lies within [0, upto), counting from token `from`. */
int sm_oai_toks_upto(const sm_choice *c, size_t upto, int from);

/* GET /v1/models */
cJSON *sm_oai_models(const sm_oai *o);

/* Append JSON text to out with every invalid UTF-8 sequence replaced by U+FFFD (generated text
 * is bytes: a model can produce any). sm_oai_print serializes j that way. */
void sm_oai_put_utf8(sm_buf *out, const char *s, size_t n);
void sm_oai_print(const cJSON *j, sm_buf *out);

#endif
