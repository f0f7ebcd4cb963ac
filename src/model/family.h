/* The model family registry: everything that differs between model families lives in one
 * sm_family entry — the model_type names, the Hugging Face config defaults, the tensor names the
 * MLX converters write, and the layer recipe the shared forward (transformer.c) follows.
 * `smelt arch`, the store and the loader all read this registry; docs/adding-a-model.md walks
 * through adding an entry. */
#ifndef SM_FAMILY_H
#define SM_FAMILY_H
#include "format/config.h"

/* The per-layer tensors, by slot. A family names each slot it has (sm_tensor_names.t); the
 * loader reads exactly those, and fails on any tensor of the checkpoint it did not read. */
typedef enum {
  SM_T_ATTN_NORM, /* RMSNorm before attention */
  SM_T_Q, SM_T_K, SM_T_V, SM_T_O,
  SM_T_Q_NORM, SM_T_K_NORM, /* per-head RMSNorm of q and k (recipe qk_norm) */
  SM_T_FFN_NORM, /* RMSNorm before the MLP */
  SM_T_GATE, SM_T_UP, SM_T_DOWN,
  SM_T_LAYER_COUNT
} sm_layer_tensor;

typedef struct {
  const char *root;       /* prefix of the decoder's tensors, e.g. "model." */
  const char *embed;      /* under root: "embed_tokens" (".weight" and, quantized, ".scales"/".biases") */
  const char *final_norm; /* under root: "norm" */
  const char *lm_head;    /* at the top level: "lm_head"; absent in the checkpoint = tied to embed */
  const char *layers;     /* under root: layer l's tensors are <root><layers>.<l>.<t[slot]> */
  const char *t[SM_T_LAYER_COUNT]; /* NULL: the family has no such tensor */
} sm_tensor_names;

typedef enum { SM_ACT_SILU } sm_act;

/* which layers attend over a sliding window of config.sliding_window positions */
typedef enum {
  SM_WIN_NONE, /* none: every layer attends to the whole context (sliding_window is ignored) */
  SM_WIN_ALL,  /* every layer, when config.json gives a sliding_window (Mistral) */
} sm_window_rule;

/* The layer recipe: how the shared forward computes one decoder layer of this family.
 *   h   = x + o(attn(rope(qk_norm(q(n1), k(n1))), v(n1)))    n1 = rmsnorm(x) * (attn_norm + norm_offset)
 *   out = h + down(act(gate(n2)) * up(n2))                     n2 = rmsnorm(h) * (ffn_norm + norm_offset) */
typedef struct {
  bool qkv_bias;          /* q/k/v projections have biases (also when config.json says attention_bias) */
  bool o_bias_from_config;/* config.json's attention_bias also gives o_proj a bias (Llama) */
  bool qk_norm;           /* per-head RMSNorm on q and k before RoPE */
  float norm_offset;      /* RMSNorm scale is (w + norm_offset) */
  sm_act act;
  sm_window_rule window;
} sm_recipe;

typedef struct sm_family {
  const char *model_type;         /* config.json model_type */
  const char *const *aliases;     /* NULL-terminated other model_type names for the same entry, or NULL */
  const char *description;        /* for `smelt arch` */
  const char *example;            /* an example hub repository */
  const sm_config_defaults *defaults;
  /* NULL for families whose config smelt understands (inspect, memory estimates) but which it
   * cannot run yet */
  const sm_tensor_names *names;
  const sm_recipe *recipe;
} sm_family;

/* The entry for a model_type (or alias); NULL when unknown. */
const sm_family *sm_family_find(const char *model_type);
/* As sm_family_find, but only families smelt runs (names and recipe set). */
const sm_family *sm_family_runnable(const char *model_type);
/* All entries, in `smelt arch` order; *n receives the count. */
const sm_family *const *sm_family_all(size_t *n);
/* The config defaults of a model_type (sm_config_defaults_fn for the config parser). */
const sm_config_defaults *sm_family_defaults(const char *model_type);
/* config.json (+ generation_config.json) of a model directory, with the registry's defaults. */
smelt_status sm_family_config_load(const char *model_dir, sm_config *out);
/* "llama, mistral, ..." : the runnable families (for error messages); static storage */
const char *sm_family_runnable_list(void);

/* What the recipe gives layer l of a model with this config. */
typedef struct {
  int window; /* attention window in positions; 0 = whole context */
} sm_layer_spec;
void sm_family_layer_spec(const sm_family *f, const sm_config *c, int layer, sm_layer_spec *out);

#endif
