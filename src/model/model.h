/* Transformer models: loading MLX-format checkpoints into backend weights and the
 * batched forward pass. One file per family (llama.c, mistral.c, qwen2.c, qwen3.c)
 * describes its quirks; transformer.c holds the shared decoder-only forward. */
#ifndef SM_MODEL_H
#define SM_MODEL_H
#include "backend/backend.h"
#include "format/config.h"
#include "format/safetensors.h"

/* What differs between families. */
typedef struct sm_family {
  const char *model_type;  /* config.json model_type */
  bool qkv_bias;           /* q/k/v projections have biases (qwen2) */
  bool qk_norm;            /* RMSNorm on q and k per head (qwen3) */
  float norm_w_offset;     /* RMSNorm weight offset: 0, or 1 for gemma's (1+w) */
} sm_family;

const sm_family *sm_family_find(const char *model_type); /* NULL if unsupported */
/* NULL-terminated list of supported model_type names */
const char *const *sm_family_names(void);

typedef struct {
  float *attn_norm, *ffn_norm; /* backend buffers [hidden] */
  float *q_norm, *k_norm;      /* [head_dim] (qk_norm) */
  float *bq, *bk, *bv;         /* biases (qkv_bias) */
  sm_weight wq, wk, wv, wo, w_gate, w_up, w_down;
} sm_layer;

struct smelt_model {
  sm_config cfg;
  const sm_family *fam;
  sm_st *st;
  smelt_tokenizer *tok;
  sm_backend *be;
  char *dir;
  sm_weight embed, lm_head;
  float *final_norm;
  sm_layer *layers;
  float *inv_freq; /* backend buffer, rot_dim/2 */
  int rot_dim;
  int max_context;
  size_t weight_bytes;
  /* scratch activations, sized for scratch_tokens rows */
  int scratch_tokens, scratch_out;
  float *x, *xb, *xb2, *q, *k, *v, *att, *gate, *up, *xo, *logits;
  /* small host buffers made for weights (converted norms/biases), freed with the model */
  void **owned; int n_owned;
};

/* Run the model over batch b (see backend.h), writing logits of b->out_rows into
 * host logits[n_out][vocab]. The caller (engine) owns the KV cache. */
smelt_status sm_model_forward(smelt_model *m, const sm_kv_cache *kv, const sm_batch *b, float *logits);
/* Ensure scratch buffers fit n_tokens rows / n_out logits rows. */
smelt_status sm_model_reserve(smelt_model *m, int n_tokens, int n_out);
/* KV cache allocation on the model's backend. */
smelt_status sm_kv_alloc(smelt_model *m, int n_blocks, int block_size, sm_kv_cache *kv);
void sm_kv_free(smelt_model *m, sm_kv_cache *kv);

/* Synthetic checkpoints: random weights with the shape of a known model. */
typedef struct { const char *name; int hidden, layers, heads, kv_heads, ffn, vocab; bool tied; } sm_synth_shape;
const sm_synth_shape *sm_synth_find(const char *name); /* "test", "tiny", "test1b", "test8b", "1b", "3b", "8b"; NULL if unknown */
/* Write config.json + model.safetensors (bits 0 = bf16) into dir unless both exist. */
smelt_status sm_make_synthetic(const sm_synth_shape *sh, int bits, int gs, const char *dir, bool verbose);

#endif
