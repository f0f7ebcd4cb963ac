/* llama-server's utility endpoints (private to src/server): POST /tokenize, /detokenize,
 * /apply-template, GET /props, /slots (slot actions: http.c, pcache.c; GET /v1/models/{id}:
 * models.c). Each returns the JSON answer, or NULL with an error in err. */
#ifndef SM_SERVER_LLAMA_API_H
#define SM_SERVER_LLAMA_API_H
#include "server/openai.h"

cJSON *sm_llama_tokenize(const sm_oai *o, const char *body, size_t len, sm_api_error *err);
cJSON *sm_llama_detokenize(const sm_oai *o, const char *body, size_t len, sm_api_error *err);
cJSON *sm_llama_apply_template(const sm_oai *o, const char *body, size_t len, sm_api_error *err);
cJSON *sm_llama_props(const sm_oai *o);
cJSON *sm_llama_slots(const sm_oai *o, sm_sched *s);

#endif
