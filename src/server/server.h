/* `smelt serve`: OpenAI-compatible HTTP server over one engine thread that steps a continuous
 * batch (requests join between decode steps, finished ones leave), with prefix caching. */
#ifndef SM_SERVER_H
#define SM_SERVER_H
#include "base/base.h"

typedef struct {
  const char *host;            /* default 127.0.0.1 */
  int port;                    /* default 8080; 0 = any free port (printed at start) */
  const char *model_dir;       /* resolved model directory */
  const char *alias;           /* model id reported by the API (default: directory name) */
  int ctx_size;                /* tokens per sequence; 0 = model default */
  int parallel;                /* concurrent sequences (default 4) */
  int threads;                 /* CPU threads (0 = all) */
  int max_queue;               /* waiting requests before 429 (default 64) */
  size_t max_body;             /* request body cap in bytes (default 1 MiB) */
  const char *api_key;         /* NULL = no auth */
  const char *allowed_origins; /* CORS: comma-separated origins or "*"; NULL = no CORS headers */
  int kv_blocks;               /* KV blocks (0 = engine default: parallel * ctx) */
  int block_size;              /* KV block tokens (0 = engine default) */
  int max_batch_tokens;        /* prefill chunk (0 = engine default) */
  bool no_prefix_cache;
  int device;                  /* smelt_device */
  bool verbose;                /* log each request to stderr */
} sm_server_params;

void sm_server_params_default(sm_server_params *p);
/* Load the model, start the engine thread and the HTTP daemon; serve until SIGINT/SIGTERM.
 * Returns a process exit code. */
int sm_server_run(const sm_server_params *p);

#endif
