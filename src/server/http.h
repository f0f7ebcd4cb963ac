/* HTTP front end of `smelt serve` (private to src/server): the libmicrohttpd daemon, routing,
 * API key and CORS checks, request bodies, JSON and SSE responses. */
#ifndef SM_SERVER_HTTP_H
#define SM_SERVER_HTTP_H
#include "server/openai.h"
#include "server/server.h"

typedef struct sm_http sm_http;

typedef struct {
  const sm_server_params *p;
  sm_sched *sched;
  sm_metrics *metrics;
  const sm_oai *oai;
} sm_http_cfg;

/* Bind and start serving (errors are printed); NULL on failure. */
sm_http *sm_http_start(const sm_http_cfg *cfg);
int sm_http_port(const sm_http *h); /* the bound port */
void sm_http_stop(sm_http *h);

#endif
