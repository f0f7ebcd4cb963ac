/* HTTP front end of `smelt serve` (private to src/server): the libmicrohttpd daemon, routing,
 * API key and CORS checks, request bodies, JSON and SSE responses. */
#ifndef SM_SERVER_HTTP_H
#define SM_SERVER_HTTP_H
#include "server/models.h"
#include "server/server.h"

typedef struct sm_http sm_http;

typedef struct {
  const sm_server_params *p;
  sm_models *models;
  sm_metrics *metrics; /* HTTP requests */
} sm_http_cfg;

/* Bind and start serving (errors are printed); NULL on failure. */
sm_http *sm_http_start(const sm_http_cfg *cfg);
int sm_http_port(const sm_http *h); /* the bound port */
/* Stop accepting: new connections are refused, new requests on open ones get 503. */
void sm_http_drain(sm_http *h);
int sm_http_active(sm_http *h); /* connections with a request in progress */
/* Resume what waits, close every connection, stop the threads. */
void sm_http_stop(sm_http *h);

#endif
