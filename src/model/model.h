/* Transformer models: loading MLX-format checkpoints into backend weights (loader.c), the
 * batched forward pass (transformer.c) and the public model API (model.c). What differs between
 * families is data in the family registry (family.h), not code here. */
#ifndef SM_MODEL_H
#define SM_MODEL_H
#include "backend/backend.h"
#include "format/config.h"
#include "format/safetensors.h"
#include "model/family.h"

/* One decoder layer's tensors, by slot (family.h). Matrices in w[], 1-D tensors (norm weights)
 * in vec[], projection biases in bias[]; unused slots are empty (data / pointer NULL). */
typedef struct {
  sm_weight w[SM_T_LAYER_COUNT];
  float *vec[SM_T_LAYER_COUNT];  /* backend buffers */
  float *bias[SM_T_LAYER_COUNT]; /* backend buffers */
  sm_layer_spec spec;
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
  sm_dtype kv_dtype; /* KV cache element type: SM_DT_F16, SM_DT_BF16 or SM_DT_F32 */
  size_t weight_bytes;
  /* scratch activations, sized for scratch_tokens rows */
  int scratch_tokens, scratch_out;
  float *x, *xb, *xb2, *q, *k, *v, *att, *gate, *up, *xo, *logits;
  /* backend buffers made for weights (converted norms/biases, rope table), freed with the model */
  void **owned; int n_owned;
};

/* Load a model onto a given backend (the model takes ownership of be, also on failure). */
smelt_status sm_model_load_on(const char *dir, const smelt_model_params *p, sm_backend *be, smelt_model **out);

/* Run the model over batch b (see backend.h), writing logits of b->out_rows into
 * host logits[n_out][vocab]. The caller (engine) owns the KV cache. */
smelt_status sm_model_forward(smelt_model *m, const sm_kv_cache *kv, const sm_batch *b, float *logits);
/* Ensure scratch buffers fit n_tokens rows / n_out logits rows. */
smelt_status sm_model_reserve(smelt_model *m, int n_tokens, int n_out);
/* KV cache allocation on the model's backend, elements of m->kv_dtype. */
smelt_status sm_kv_alloc(smelt_model *m, int n_blocks, int block_size, sm_kv_cache *kv);
void sm_kv_free(smelt_model *m, sm_kv_cache *kv);

/* loader.c: the checkpoint's tensors into m (family names, recipe), uploaded to m->be; the rope table */
smelt_status sm_model_load_weights(smelt_model *m);
smelt_status sm_model_setup_rope(smelt_model *m);
void sm_model_release_weights(smelt_model *m);

/* Synthetic checkpoints: random weights with the shape of a known model, in a family's layout. */
typedef struct {
  const char *name;
  int hidden, layers, heads, kv_heads, ffn, vocab;
  bool tied;
  const char *family; /* model_type; NULL = "llama" */
} sm_synth_shape;
const sm_synth_shape *sm_synth_find(const char *name); /* "test", "tiny", "test1b", "test8b", "1b", "3b", "8b"; NULL if unknown */
/* Write config.json + model.safetensors (bits 0 = bf16) into dir unless both exist. */
smelt_status sm_make_synthetic(const sm_synth_shape *sh, int bits, int gs, const char *dir, bool verbose);

#endif
