/* Model store: name resolution, Hugging Face hub downloads, listing, memory estimates.
 * See docs/store.md. */
#ifndef SM_STORE_H
#define SM_STORE_H
#include "base/base.h"

/* ---- settings: the store reads no environment; the edge (cli, server) fills this from the
 * variables named here at startup (docs/store.md) and calls sm_store_configure ---- */
typedef struct {
  const char *home;             /* HOME: base of the default caches (default /tmp) */
  const char *cache_dir;        /* SMELT_CACHE_DIR: the store is <cache_dir>/models (default ~/.cache/smelt) */
  const char *hf_home;          /* HF_HOME (default ~/.cache/huggingface) */
  const char *hf_hub_cache;     /* HF_HUB_CACHE (default <hf_home>/hub) */
  const char *default_org;      /* SMELT_DEFAULT_ORG: owner of bare names (default mlx-community) */
  const char *default_model;    /* SMELT_DEFAULT_MODEL: the model used when none is given */
  const char *hf_endpoint;      /* HF_ENDPOINT (default https://huggingface.co) */
  const char *hf_token;         /* HF_TOKEN or HUGGING_FACE_HUB_TOKEN (default: <hf_home>/token) */
  const char *available_memory; /* SMELT_AVAILABLE_MEMORY: bytes[K|M|G|T], overrides the available memory */
  int pull_retries;             /* SMELT_PULL_RETRIES: transfer retries per file (< 0: default 5) */
} sm_store_settings;
/* NULL or "" strings and negative numbers take the defaults. */
void sm_store_settings_default(sm_store_settings *s);
/* Copy s into the store's settings (NULL: back to the defaults). Call before the other store
 * functions, not concurrently with them (once at startup). */
void sm_store_configure(const sm_store_settings *s);

/* <cache_dir>/models, default ~/.cache/smelt/models (malloc'd) */
char *sm_store_root(void);
/* Resolve a model reference to a local directory (malloc'd in *dir):
 *   an existing path -> itself; a built-in model's name -> its directory; "owner/name" or bare "name" (-> <default_org>/name)
 *   -> the store, then the HF cache (sm_store_hf_cache(),
 *   models--owner--name/snapshots/<rev>); if missing and allow_download, pull it.
 * NULL/empty ref -> the embedded default model (sm_store_default_model()). */
smelt_status sm_store_resolve(const char *ref, bool allow_download, char **dir);
/* The folder of the models that come with smelt (the installed share/smelt/models next to the
 * binary or in the configured prefix, else the source tree's models/); NULL if none. malloc'd. */
char *sm_store_builtin_dir(void);
/* Directory of a built-in model by name ("smelt-tiny", "smelt-tiny-draft"; "models/NAME" too);
 * NULL when there is none of that name. malloc'd. sm_store_resolve tries these names before the
 * store, the HF cache and the hub. */
char *sm_store_builtin(const char *name);
/* Path of the default model shipped with smelt (the default_model setting, else the
 * installed/source models/smelt-tiny). malloc'd; NULL if not found. */
char *sm_store_default_model(void);
/* Download owner/name from the hub (hf_endpoint, hf_token settings) into the store atomically.
 * progress: draw a progress bar on stderr when it is a TTY. *dir (may be NULL) gets the
 * final directory. */
smelt_status sm_store_pull(const char *ref, bool progress, char **dir);

/* Split a hub reference into owner and name (malloc'd). "name" -> default org.
 * Rejects anything that is not [A-Za-z0-9._-]+ (optionally "owner/"), "." / ".." parts. */
smelt_status sm_store_parse_ref(const char *ref, char **owner, char **name);
/* The HF hub cache folder (hf_hub_cache, <hf_home>/hub, ~/.cache/huggingface/hub); malloc'd. */
char *sm_store_hf_cache(void);
/* Snapshot directory for owner/name in the HF cache (refs/main first, else the newest
 * snapshot with a config.json); NULL if absent. malloc'd. */
char *sm_store_hf_snapshot(const char *owner, const char *name);

/* ---- listing ---- */
typedef struct {
  char *name;          /* owner/name */
  char *path;          /* directory */
  const char *source;  /* "store" or "hf" */
  uint64_t size_bytes; /* sum of the files (symlinks followed) */
  char *arch;          /* config model_type, "" if unknown */
  int bits;            /* quantization bits, 0 = not quantized */
  int group_size;
  bool supported; /* the family registry runs this arch (src/model/family.h) */
} sm_store_entry;
/* Models in the store and the HF cache, sorted by name (store first on ties). */
smelt_status sm_store_list(sm_store_entry **out, size_t *n);
void sm_store_list_free(sm_store_entry *e, size_t n);
/* The built-in models (source "built-in"), sorted by name. */
smelt_status sm_store_list_builtin(sm_store_entry **out, size_t *n);
/* Size of all files under a directory (following symlinks of files). */
uint64_t sm_store_dir_size(const char *dir);

/* Find the store directory a reference names, for removal: "owner/name", a bare name,
 * or a path that is a model directory inside the store root. Anything else (HF cache,
 * paths outside the store) -> SMELT_ERR_INVALID / SMELT_ERR_NOT_FOUND. */
smelt_status sm_store_locate_removable(const char *ref, char **dir);
/* Remove a model directory returned by sm_store_locate_removable (re-checked). */
smelt_status sm_store_remove(const char *dir);

/* ---- memory estimate (smelt inspect, --estimate-memory) ---- */
typedef struct {
  char arch[64];
  int n_layers, n_heads, n_kv_heads, head_dim, hidden, intermediate, vocab, max_pos;
  int quant_bits, quant_group; /* 0 = dense */
  int quant_mode;              /* sm_qmode of the default quantization (format/mxq.h) */
  size_t n_tensors;
  uint64_t weights_bytes; /* sum of tensor bytes in the safetensors headers */
  uint64_t n_params;      /* packed uint32 counted as 32/bits params each */
  /* mixtures of experts (n_experts > 0): the routed experts' share, and what one token uses of it */
  int n_experts, top_k;
  uint64_t expert_params, expert_bytes;
  uint64_t n_active_params; /* n_params less the unchosen experts' (= n_params without experts) */
  uint64_t active_bytes;    /* weight bytes a token reads: weights_bytes less the unchosen experts' */
  size_t n_vision_tensors;  /* of a vision tower and projector (counted in the above too) */
  uint64_t vision_bytes, vision_params;
  int max_tokens; /* tokens the KV cache is sized for */
  smelt_kv_type kv_type;
  int attn_layers;             /* layers with a KV cache (all but a hybrid model's recurrent / MLP ones) */
  uint64_t kv_bytes_per_token; /* 2 * attn_layers * n_kv_heads * bytes of a head row (sm_kv_head_bytes) */
  uint64_t kv_bytes;           /* kv_bytes_per_token * max_tokens */
  uint64_t state_bytes;        /* hybrid models: recurrent state of one sequence (float32), else 0 */
  int state_slots;             /* state slots a one-sequence engine keeps (in total_bytes) */
  uint64_t activation_bytes;   /* scratch activations (see docs/store.md) */
  uint64_t runtime_bytes;      /* activations + 10% of (weights + kv) */
  uint64_t total_bytes;        /* weights + kv + runtime */
  bool cuda;
  bool available_known;
  uint64_t available_bytes; /* MemAvailable, or free device memory */
  bool fits;                /* total <= available (true when unknown) */
  uint64_t embed_bytes;     /* the embedding table (kept whole by every rank of a split model) */
  uint64_t lm_head_bytes;   /* an untied LM head (0: tied to the embedding) */
  /* split over tp > 1 ranks (sm_store_estimate_split, or stages: sm_store_estimate_stages): the largest
   * rank's share, and why the model does not split ("" when it does); fits then compares the rank's total
   * with what one device has */
  int tp;
  uint64_t rank_weights_bytes, rank_kv_bytes, rank_total_bytes;
  char split_error[320];
} sm_mem_estimate;

/* Estimate the memory a model needs for max_tokens of context (<= 0: the model's
 * max_position_embeddings capped at 8192) with a KV cache of kv_type (the bytes the engine allocates
 * a position), and compare with what is available (host RAM, or device memory
 * when cuda and a query hook is set). The available_memory setting (bytes, K/M/G suffix)
 * overrides the available amount. */
smelt_status sm_store_estimate(const char *model_dir, int max_tokens, smelt_kv_type kv_type, bool cuda,
                               sm_mem_estimate *out);
/* The same estimate for one of tp ranks of a split model (docs/parallel.md: heads, KV heads, the MLP and
 * an untied LM head split; the embedding table, norms and a vision tower whole on every rank). */
smelt_status sm_store_estimate_split(const char *model_dir, int tp, sm_mem_estimate *e);
/* the same for the layers split in pp consecutive stages (pipeline parallelism): rank 0 holds its layers,
 * the embeddings, the LM head and a vision tower; the others their layers (layers taken as equal in size);
 * split_error when the model has fewer layers than stages */
smelt_status sm_store_estimate_stages(const char *model_dir, int pp, sm_mem_estimate *e);
/* For generate/serve --estimate-memory: estimate, print a one-line summary to stderr (always when
 * verbose, else only when it does not fit) and return SMELT_ERR_LIMIT when the model will not fit
 * and !force. */
smelt_status sm_store_check_fits(const char *model_dir, int max_tokens, smelt_kv_type kv_type, bool cuda, bool force,
                                 bool verbose);
bool sm_store_has_device_mem_query(void);
/* Device memory query hook for CUDA (e.g. a wrapper of cudaMemGetInfo); NULL clears. */
typedef smelt_status (*sm_device_mem_fn)(uint64_t *free_bytes, uint64_t *total_bytes);
void sm_store_set_device_mem_query(sm_device_mem_fn fn);
/* MemAvailable from /proc/meminfo (bytes); false if unreadable. */
bool sm_store_host_mem_available(uint64_t *bytes);
/* A byte count with an optional K/M/G/T suffix (powers of 1024; "KiB", "KB" too): false when not
 * one (negative, nan, trailing text). */
bool sm_store_parse_size(const char *s, uint64_t *out);
/* Human-readable size ("1.23 GiB") into buf. */
const char *sm_store_fmt_bytes(uint64_t b, char *buf, size_t n);

/* ---- SHA-256 (download verification) ---- */
typedef struct {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  size_t n;
} sm_sha256;
void sm_sha256_init(sm_sha256 *s);
void sm_sha256_update(sm_sha256 *s, const void *data, size_t len);
void sm_sha256_final(sm_sha256 *s, uint8_t out[32]);
void sm_sha256_hex(const uint8_t d[32], char out[65]);

#endif
