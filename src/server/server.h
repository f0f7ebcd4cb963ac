/* `smelt serve`: OpenAI-compatible HTTP server over one engine thread that steps a continuous
 * batch (requests join between decode steps, finished ones leave), with prefix caching. */
#ifndef SM_SERVER_H
#define SM_SERVER_H
#include "base/base.h"

typedef struct {
  const char *host;      /* default 127.0.0.1 */
  int port;              /* default 8080; 0 = any free port (printed at start) */
  const char *model_dir; /* one model: its resolved directory */
  const char *alias;     /* one model: the id reported by the API (default: directory name) */
  /* several models (models.h): -m given more than once, and/or a directory of models */
  const char *const *model_dirs; /* resolved directories of the -m models */
  const char *const *model_ids;  /* their names */
  int n_models;
  const char *models_dir;      /* every model directory under it (one or two levels) */
  int models_max;              /* loaded at once (default 4) */
  uint64_t models_memory;      /* estimated bytes of the loaded models together (0: no limit) */
  double models_load_timeout;  /* s a request waits for its model to load (default 300) */
  const char *prompt_cache;    /* --prompt-cache FILE (one model) */
  bool prompt_cache_ro;        /* never write it */
  const char *slot_save_path;  /* POST /slots/{id}?action=save|restore: files in this directory */
  const char *kv_cache_dir;    /* --kv-cache-dir: the prefix cache's disk tier (pcache_disk.h); NULL: none */
  uint64_t kv_cache_disk_size; /* its byte limit (for each model) */
  int ctx_size;                /* tokens per sequence; 0 = model default */
  int parallel;                /* concurrent sequences (default 4) */
  int threads;                 /* CPU threads (0 = all) */
  const char *cpu_mask;        /* CPU thread pinning (smelt_model_params.cpu_mask); NULL: none */
  int numa;                    /* smelt_numa */
  int cpu_poll;                /* 0..100 (default 50) */
  int max_queue;               /* waiting requests before 429 (default 64) */
  size_t max_body;             /* request body cap in bytes (0: 1 MiB, SM_SERVER_IMAGE_BODY for one model
                                * that takes images) */
  const char *api_key;         /* NULL = no auth */
  const char *allowed_origins; /* CORS: comma-separated origins or "*"; NULL = no CORS headers */
  int kv_blocks;               /* KV blocks (0 = engine default: parallel * ctx) */
  int block_size;              /* KV block tokens (0 = engine default) */
  int max_batch_tokens;        /* prefill chunk (0 = engine default) */
  bool no_prefix_cache;
  int device;              /* smelt_device */
  bool verbose;            /* log each request, and the HTTP library's messages, to the log */
  bool no_mmap;            /* read the weights into memory instead of mapping them */
  bool deterministic;      /* batch-invariant kernels (smelt_model_params.deterministic) */
  int tensor_parallel;     /* ranks the model is split over (smelt_model_params.tensor_parallel; 0/1: one) */
  int pipeline_parallel;   /* stages its layers are split in (smelt_model_params.pipeline_parallel; 0/1: one) */
  const float *pp_shares;  /* their shares of the layers (smelt_model_params.pp_shares; NULL: equal) */
  int nnodes, node_rank;   /* ... on several hosts (smelt_model_params) */
  const char *master_addr; /* HOST:PORT of node 0 */
  int kv_type;             /* smelt_kv_type of the KV cache (0: f16) */
  bool host_sample;        /* sample on the host, not the device (SMELT_HOST_SAMPLE) */
  bool no_pipeline;        /* no pipelined steps (SMELT_PIPELINE=0) */
  bool pipeline_always;    /* pipelined steps on the CPU too (SMELT_PIPELINE=always: tests) */
  /* connections */
  int max_conns;                /* open connections in all (default 1024) */
  int max_conns_per_ip;         /* per client address (default 256; 0 = no limit) */
  int http_threads;             /* HTTP worker threads (default 4) */
  double header_timeout;        /* s to receive a request's line and headers (default 20) */
  double body_timeout;          /* s to receive a request's body after its headers (default 60) */
  int timeout;                  /* s of inactivity while reading or writing (default 600) */
  size_t max_buffered_body;     /* request bodies in memory, all connections together (default 64 MiB) */
  double shutdown_timeout;      /* s that in-flight requests get after SIGTERM/SIGINT (default 20) */
  const char *log_file;         /* log to this file (reopened on SIGHUP) instead of stderr */
  const char *tool_format;      /* tool-call format (toolcall.h names); NULL = from the chat template */
  const char *reasoning_format; /* "auto"/"deepseek" (split <think> text, default), "none" (keep it in content) */
  int pooling;                  /* embeddings: 0 last token (default), 1 mean */
  bool allow_image_urls;        /* fetch http(s) image URLs of requests (default: data: URLs only) */
  const char *image_files_dir;  /* read local image files under this directory (a real path); NULL: none */
  uint64_t grammar_cache;       /* bytes of grammar masks shared between requests (default 128 MiB; 0: none) */
  int grammar_threads;          /* threads that build a step's grammar masks (0: automatic, 1: the engine's) */
  /* speculative decoding (one model): a draft model (-md, its resolved directory) or n-gram lookup */
  const char *draft_dir; /* NULL: no draft model */
  bool spec_ngram;       /* --spec-type ngram-simple */
  int draft_max;         /* draft tokens per step (default 16) */
  int draft_min;         /* fewer drafted tokens are not verified (default 0) */
  float draft_p_min;     /* a draft model's proposal stops below this probability (default 0.75) */
  int spec_ngram_n;      /* n-gram mode: longest n-gram looked up (default 3) */
} sm_server_params;

/* Exit codes of sm_server_run */
enum {
  SM_SERVER_EXIT_OK = 0,    /* stopped by SIGTERM/SIGINT */
  SM_SERVER_EXIT_START = 1, /* could not start: model, tokenizer, engine, address, log file */
  SM_SERVER_EXIT_FATAL = 3, /* stopped by a fatal error while serving (the weights file changed) */
};

void sm_server_params_default(sm_server_params *p);
/* Load the model, start the engine thread and the HTTP daemon; serve until SIGINT/SIGTERM
 * (graceful: stop accepting, let in-flight requests finish for up to shutdown_timeout, then end
 * them with an error). SIGHUP reopens the log file. Returns an exit code (SM_SERVER_EXIT_*). */
int sm_server_run(const sm_server_params *p);

/* the default request body cap of a server of one model that takes images (base64 images in JSON) */
#define SM_SERVER_IMAGE_BODY ((size_t)32 << 20)

#endif
