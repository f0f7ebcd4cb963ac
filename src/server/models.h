/* Served models of `smelt serve` (private to src/server): the registry of the models a server
 * offers and, for each loaded one, its engine, scheduler and API view (sm_served).
 *
 * One model (a single -m, no --models-dir): loaded at start, never unloaded; a request's `model`
 * field is not checked, and acquiring the model takes no lock.
 * Several (-m repeated, or --models-dir): a request's `model` names one (absent: the first). A
 * model is loaded on first use by the loader thread, into a pool of at most --models-max models
 * whose estimated sizes add up to at most --models-memory; to make room, the least recently used
 * model that no request holds is unloaded. A request for a model that is not ready parks its
 * connection until the load ends or its deadline (--models-load-timeout) passes.
 *
 * Lock order: the registry's mutex, then a scheduler's, then the connection guard's. */
#ifndef SM_SERVER_MODELS_H
#define SM_SERVER_MODELS_H
#include <cjson/cJSON.h>
#include "server/conns.h"
#include "server/openai.h"
#include "server/pcache.h"
#include "server/pcache_disk.h"
#include "server/server.h"

/* A loaded model. */
typedef struct {
  char id[256]; /* the name requests use */
  char *dir;    /* its directory */
  smelt_model *model;
  sm_engine *eng;
  smelt_model *draft; /* speculative decoding: the draft model (-md) and its engine, or NULL */
  sm_engine *deng;
  sm_sched sched;
  bool sched_init;
  sm_oai oai;
  sm_pcache pc;   /* --prompt-cache / slots (pcache.h) */
  sm_pdisk *disk; /* --kv-cache-dir (pcache_disk.h), NULL: none */
  int index;      /* in the registry */
} sm_served;

typedef struct sm_models sm_models;

/* The registry for p (one model: p->model_dir; several: p->model_dirs / p->models_dir). NULL
 * after printing why when the list is bad (no model in --models-dir, two models with one name). */
sm_models *sm_models_new(const sm_server_params *p);
/* One model: load it now (false after printing why). Several: start the loader thread. */
bool sm_models_start(sm_models *r);
/* Stop every engine thread (what is still queued or running fails with 503), write the prompt
 * cache files, free the models. */
void sm_models_stop(sm_models *r);
void sm_models_free(sm_models *r);

bool sm_models_multi(const sm_models *r);
/* The model that requests use with one model (NULL with several). */
sm_served *sm_models_single(sm_models *r);

typedef enum { SM_ACQ_READY = 0, SM_ACQ_WAIT, SM_ACQ_ERROR } sm_acq;
/* The model named `name` (NULL or "": the default) for a request on connection k:
 *  READY: *out is loaded and held until sm_models_release;
 *  WAIT: it is being loaded; the connection was parked (sm_conns_park_wait) and is resumed when
 *        the load ends, at its deadline (k->timed_out) or when the client goes away (k->hup);
 *        the handler then calls acquire again with the same *ticket, or sm_models_unwait when
 *        the client is gone or the request ends otherwise (a request resumed by a successful
 *        load holds the model until then, so that no other load can unload it first);
 *  ERROR: err says why (404 model_not_found, 429 too many waiting, 500 the load failed, 503 still
 *        loading at the deadline).
 * *ticket: 0 on the first call; kept between the calls of one request. */
sm_acq sm_models_acquire(sm_models *r, const char *name, sm_conns *g, sm_sock *k, int *ticket, sm_served **out,
                         sm_api_error *err);
void sm_models_unwait(sm_models *r, sm_sock *k); /* k waits no more and holds nothing */
void sm_models_release(sm_models *r, sm_served *sv);

/* The `model` member of a JSON request body: malloc'd, or NULL when absent or not a string (the
 * endpoint's parser reports a body that is not JSON). */
char *sm_models_body_name(const char *body, size_t len);

/* GET /v1/models: every model, loaded or not, with its status; GET /v1/models/{id}. */
cJSON *sm_models_list(sm_models *r);
cJSON *sm_models_get(sm_models *r, const char *id, sm_api_error *err);

/* Prometheus text of the loaded models' gauges and counters (one model: without labels). */
void sm_models_metrics(sm_models *r, sm_buf *out);

/* Serving state across the loaded models. */
bool sm_models_idle(sm_models *r);                       /* nothing queued, running or waiting for a load */
bool sm_models_fatal(sm_models *r, char *msg, size_t n); /* an engine stopped on a fatal error */
void sm_models_fail_all(sm_models *r, int status, const char *msg);

#endif
