/* smelt — LLM inference runtime for MLX-format checkpoints.
 *
 * Public C API. All functions return a smelt_status (SMELT_OK = 0) unless noted;
 * on failure smelt_last_error() gives a message (per thread, valid until the next call).
 * Ownership: objects returned through `**out` belong to the caller and are released
 * with the matching *_free function; strings passed in are copied unless noted. */
#ifndef SMELT_H
#define SMELT_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SMELT_VERSION "0.1.0"

typedef enum {
  SMELT_OK = 0,
  SMELT_ERR_IO,          /* file missing/unreadable */
  SMELT_ERR_FORMAT,      /* corrupt or inconsistent file */
  SMELT_ERR_UNSUPPORTED, /* valid but not supported (model family, dtype, ...) */
  SMELT_ERR_OOM,
  SMELT_ERR_INVALID, /* bad argument */
  SMELT_ERR_BACKEND, /* device/backend failure */
  SMELT_ERR_NOT_FOUND,
  SMELT_ERR_LIMIT, /* context or size limit exceeded */
  SMELT_ERR_CANCELLED,
} smelt_status;

const char *smelt_last_error(void);
const char *smelt_status_str(smelt_status s);

/* ---- tokenizer ---- */
typedef struct smelt_tokenizer smelt_tokenizer;

/* Load tokenizer.json (+ tokenizer_config.json if present) from a model directory. */
smelt_status smelt_tokenizer_load(const char *model_dir, smelt_tokenizer **out);
void smelt_tokenizer_free(smelt_tokenizer *t);
/* Encode UTF-8 text. add_special: apply the post-processor (e.g. BOS).
 * *ids is malloc'd (caller frees), *n_ids its length. */
smelt_status smelt_tokenize(const smelt_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                            size_t *n_ids);
/* Decode ids to a malloc'd NUL-terminated UTF-8 string. skip_special drops special tokens. */
smelt_status smelt_detokenize(const smelt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text);
int32_t smelt_tokenizer_vocab_size(const smelt_tokenizer *t);

/* ---- model ---- */
typedef struct smelt_model smelt_model;

typedef enum { SMELT_DEVICE_AUTO = 0, SMELT_DEVICE_CPU, SMELT_DEVICE_CUDA } smelt_device;
/* Element type of the KV cache (llama-server's --cache-type-k / --cache-type-v). f16 halves the
 * memory and the bytes attention reads against f32; q8_0 and q4_0 (groups of 32 values with an f16
 * scale, CPU backend only) take 34 and 18 bytes per 32 values; docs/kv-cache.md states each type's
 * error. */
typedef enum { SMELT_KV_F16 = 0, SMELT_KV_BF16, SMELT_KV_F32, SMELT_KV_Q8_0, SMELT_KV_Q4_0 } smelt_kv_type;
const char *smelt_kv_type_name(smelt_kv_type t);                     /* "f16", "bf16", "f32", "q8_0", "q4_0" */
smelt_status smelt_kv_type_parse(const char *s, smelt_kv_type *out); /* SMELT_ERR_INVALID naming s */

/* Where the CPU backend's threads run (llama.cpp's --numa): NONE leaves it to the OS (or to
 * cpu_mask); DISTRIBUTE spreads the threads over the NUMA nodes, ISOLATE keeps them on the node
 * the loading thread runs on. */
typedef enum { SMELT_NUMA_NONE = 0, SMELT_NUMA_DISTRIBUTE, SMELT_NUMA_ISOLATE } smelt_numa;
smelt_status smelt_numa_parse(const char *s, smelt_numa *out); /* "none", "distribute", "isolate" */

typedef struct {
  smelt_device device;     /* AUTO: CUDA when built and a GPU is present, else CPU */
  int n_threads;           /* CPU threads; 0 = all cores */
  const char *cpu_mask;    /* CPU threads' placement, one CPU each: hex mask "0xff" or list "0-7,16-23";
                           NULL = not pinned (llama.cpp's --cpu-mask / --cpu-range) */
  smelt_numa numa;         /* CPU threads over NUMA nodes (llama.cpp's --numa) */
  int cpu_poll;            /* 0..100: how long idle CPU threads busy-wait for work before sleeping
                          (llama.cpp's --poll; default 50 = 2 ms; 0 = sleep at once) */
  int max_context;         /* 0 = model's max_position_embeddings (capped at 8192) */
  int max_seqs;            /* concurrent sequences the KV cache is sized for; 0 = 1 */
  bool no_mmap;            /* read the weights into memory instead of mapping the files */
  smelt_kv_type kv_type;   /* KV cache element type (default f16) */
  bool deterministic;      /* batch-invariant kernels: a token's logits do not depend on what else is in its
                          * forward step (batch size, its row, prefill or decode), so greedy and seeded
                          * outputs are the same under any load; slower (docs/server.md) */
  int tensor_parallel;     /* 0 or 1: one device; N > 1: the model split over N ranks, one process each, started
                          * by smelt_model_load (CUDA: GPUs 0..N-1, through NCCL; CPU: shared memory;
                          * docs/parallel.md) */
  int pipeline_parallel;   /* 0 or 1: one device; N > 1: the layers split in N consecutive stages over N ranks,
                          * one process each, started as for tensor_parallel (not both) */
  const float *pp_shares;  /* with pipeline_parallel: each stage's share of the layers (N values > 0, llama.cpp's
                          * --tensor-split); NULL: as equal as the layers allow */
  int nnodes, node_rank;   /* the ranks on nnodes hosts (0/1: one), tensor_parallel / nnodes each; this host's
                          * index. On node_rank > 0 smelt_model_load runs that host's ranks until rank 0
                          * ends them, then exits the process with their status: it does not return */
  const char *master_addr; /* "host:port" where rank 0 (node 0) listens for the other hosts' ranks */
} smelt_model_params;

void smelt_model_params_default(smelt_model_params *p);
/* The other ranks of a model split over several devices (tensor_parallel) are forked by smelt_model_load; when
 * this process has already used CUDA (whose state does not survive a fork), they re-execute this program
 * instead, with arguments that it must hand here first thing in main: returns -1 when argv is not a rank's
 * (go on as usual), else the rank's exit status once rank 0 ends it. The smelt binary does so. */
int smelt_tp_rank_main(int argc, char **argv);
/* Load an MLX-format model directory (config.json, *.safetensors, tokenizer files). */
smelt_status smelt_model_load(const char *dir, const smelt_model_params *p, smelt_model **out);
void smelt_model_free(smelt_model *m);
/* Borrowed pointer, owned by the model; NULL if the directory had no tokenizer. */
const smelt_tokenizer *smelt_model_tokenizer(const smelt_model *m);
int32_t smelt_model_vocab_size(const smelt_model *m);
const char *smelt_model_arch(const smelt_model *m); /* config model_type, e.g. "llama" */

/* What a loaded model is and where it runs (pointers borrowed from the model). */
typedef struct {
  const char *arch;    /* config model_type */
  const char *backend; /* "cpu", "cuda" */
  int n_threads;       /* host threads the backend computes with (CPU); 0 for GPU backends */
  int n_layers, hidden, vocab, n_heads, n_kv_heads, head_dim;
  int max_context;       /* the context size it was loaded for */
  smelt_kv_type kv_type; /* its KV cache element type */
  size_t weight_bytes;   /* all weights */
  size_t decode_bytes;   /* weight bytes one decode step reads (an untied embedding table, and Gemma 4's per-layer
                            * input table, count as one row;
                            * mixtures of experts: top_k / n_experts of the routed experts) */
  int n_eos;             /* end-of-sequence ids from config.json and generation_config.json */
  const int32_t *eos_ids;
  int32_t bos_id; /* -1 when none */
  /* sampling defaults from generation_config.json: 0 when not given; do_sample -1 when not given */
  float gen_temperature, gen_top_p;
  int gen_top_k, gen_do_sample;
  const char *note;      /* what a user should know about this model, e.g. that a vision-language
                              checkpoint runs as a text model; "" when nothing */
  int tensor_parallel;   /* ranks its heads and MLP are split over (1: one device) */
  int pipeline_parallel; /* ranks its layers are split over (1: one device) */
} smelt_model_info;
void smelt_model_get_info(const smelt_model *m, smelt_model_info *info);
/* Measured streaming-read bandwidth of the memory the model's weights live in, bytes/s, with the
 * threads the backend computes with (the decode roofline is this over decode_bytes); 0 if unknown.
 * Split over N ranks: N times rank 0's. */
double smelt_model_bandwidth(smelt_model *m);

/* ---- sampling & generation ---- */
typedef struct {
  float temperature;        /* 0 = greedy */
  int top_k;                /* 0 = off */
  float top_p;              /* 1 = off */
  float min_p;              /* 0 = off */
  float repetition_penalty; /* 1 = off (HF/llama.cpp style, divides positive logits) */
  float frequency_penalty;  /* 0 = off (OpenAI style) */
  float presence_penalty;   /* 0 = off */
  int penalty_last_n;       /* window for penalties; 0 = whole context */
  uint64_t seed;            /* 0 = random */
} smelt_sampling;

void smelt_sampling_default(smelt_sampling *s);

typedef struct {
  int n_prompt, n_generated;
  double prefill_s, decode_s; /* wall seconds */
  size_t peak_rss;            /* bytes */
  int stop_reason;            /* 0 = length, 1 = eos/stop */
} smelt_stats;

/* Called with each newly decoded UTF-8 piece (never splits a character).
 * Return false to stop generation. */
typedef bool (*smelt_piece_cb)(const char *piece, size_t len, void *user);

/* Single-sequence generation from raw prompt text (no chat template applied). */
smelt_status smelt_generate(smelt_model *m, const char *prompt, int max_tokens, const smelt_sampling *s,
                            smelt_piece_cb cb, void *user, smelt_stats *stats);

/* Forward a token sequence from position 0 and return logits of every position
 * (n * vocab floats, malloc'd, caller frees). For tests and evaluation. */
smelt_status smelt_eval_logits(smelt_model *m, const int32_t *ids, int n, float **logits);

#ifdef __cplusplus
}
#endif
#endif
