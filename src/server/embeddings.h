/* POST /v1/embeddings (private to src/server). Pooling (--pooling): the last token's final
 * hidden state (default) or the mean over the input's tokens; vectors are L2-normalized. */
#ifndef SM_SERVER_EMBEDDINGS_H
#define SM_SERVER_EMBEDDINGS_H
#include "server/openai.h"

/* A job for the parsed request (taken over); NULL and a 400 in err on bad input. */
sm_job *sm_emb_make_job(const sm_oai *o, sm_api_request *req, sm_api_error *err);
/* The response of a finished embeddings job. */
cJSON *sm_emb_response(const sm_oai *o, sm_job *j);

#endif
