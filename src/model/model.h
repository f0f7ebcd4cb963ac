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
 * in vec[], projection biases in bias[]; unused slots are empty (data / pointer NULL). A fused
 * weight (QKV, GATE_UP) stays in its slot, unprepared; the forward uses the row views the loader
 * puts in Q/K/V and GATE/UP. */
typedef struct {
  sm_weight w[SM_T_LAYER_COUNT];
  float *vec[SM_T_LAYER_COUNT];  /* backend buffers */
  float *bias[SM_T_LAYER_COUNT]; /* backend buffers */
  sm_layer_spec spec;
  struct sm_moe_layer *moe; /* the layer's mixture of experts (moe.c; NULL: the dense MLP of w[]) */
  float *sinks;             /* attention sink logits per head (recipe attn_sinks), backend buffer */
  struct sm_mla_layer *mla; /* multi-head latent attention (recipe mla; mla.c), else NULL */
  float scalar;             /* recipe layer_scalar: the layer's output times this (1: none) */
} sm_layer;

/* The recurrent mixer's activation buffers (recurrent.c): projections into the convolution, its output,
 * the output gate, two per-head inputs (beta / a / dt; LFM2's B), the mixer's output */
enum { SM_REC_S_IN, SM_REC_S_CONV, SM_REC_S_Z, SM_REC_S_B, SM_REC_S_A, SM_REC_S_Y, SM_REC_SCRATCH };

/* A RoPE table (rope.c): the model's, or sliding layers' local one */
typedef struct {
  float *inv; /* backend buffer: n_rows x rot/2 */
  int rot, n_rows, pos0;
  float mscale;   /* on the rotated dims (rope_ext) */
  float attn_mul; /* the attention factor folded into the attention scale */
  bool ext;       /* needs rope_ext (position rows or mscale) */
  int pos_limit;  /* positions >= this have no row (dynamic NTK: past max_context); 0 = none */
} sm_rope_tab;

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
  sm_rope_tab ropes[2]; /* [0] the model's RoPE, [1] the local RoPE of sliding layers (layer spec.rope) */
  float q_beta;         /* Llama-4 query scaling (rope_ext beta), 0 = off */
  int q_beta_pos;
  sm_act act;
  sm_qk_norm qk_norm;             /* the recipe's q/k norms as this config has them */
  struct sm_moe_scratch *moe_scr; /* mixture-of-experts activations (moe.c) */
  struct sm_mla_scratch *mla_scr; /* multi-head latent attention activations (mla.c) */
  size_t moe_expert_bytes;        /* bytes of the routed experts' weights, of which a token reads top_k / n_experts */
  float attn_scale;               /* before the RoPE attention factor */
  float embed_scale;              /* 1: none */
  const sm_vlm_packaging *vlm;    /* vision-language checkpoint: its packaging, else NULL */
  struct sm_vision *vision;       /* its vision tower when loaded (src/vision), else NULL */
  int32_t *mrope_axis;            /* M-RoPE (Qwen-VL): backend int32 [rot/2], the position axis of each frequency */
  int32_t *rope_pos_dev;          /* backend copy of a batch's rope_pos */
  int rope_pos_cap;
  const char *prefix; /* of every tensor name: "" or the packaging's lm_prefix */
  const char *root;   /* after prefix: the family's root ("model.") or the packaging's lm_root */
  char note[224];     /* what a user should know about this model ("" if nothing) */
  int max_context;
  sm_dtype kv_dtype; /* KV cache element type: SM_DT_F16, SM_DT_BF16, SM_DT_F32, SM_DT_Q8_0 or SM_DT_Q4_0 */
  size_t weight_bytes;
  /* scratch activations, sized for scratch_tokens rows */
  int scratch_tokens, scratch_out;
  float *x, *xb, *xb2, *q, *k, *v, *att, *gate, *up, *xo, *logits;
  float *agate; /* gated attention: the gate rows (recipe attn_out_gate) */
  /* per-layer inputs (recipe per_layer_input, config ple_dim > 0): the table and the embeddings' projection
   * (sm_tensor_names ple_*), its norm; the batch's inputs [n][layers * ple_dim], one layer's part [n][ple_dim] and
   * the gate [n][ple_dim]; ple_idx[l][t] = t * layers + l, the row of token t's layer-l part (ple_idx_cap tokens) */
  sm_weight ple_embed, ple_proj;
  float *ple_norm;
  float *ple, *ple_part, *ple_gate;
  int32_t *ple_idx;
  int ple_idx_cap;
  int max_q, max_kv, max_ffn; /* the widest layer's q and k/v rows (heads * head size) and MLP */
  float *ones;                /* recipe v_norm: max head size ones (the norm's weight), backend buffer */
  float *rec[SM_REC_SCRATCH]; /* hybrid models: the recurrent mixer's activations (recurrent.c) */
  /* backend buffers made for weights (converted norms/biases, rope table), freed with the model */
  void **owned;
  int n_owned;
  /* tensor parallelism (tp.h): this rank's group, NULL on one device; the gathered logits
   * [ranks][n_out][vocab / ranks] (rank 0, n_out > 1), this rank's part of them, and the row order that
   * puts them together (tp_idx, for tp_idx_n rows) */
  struct sm_tp *tp;
  float *tp_lg, *tp_part;
  int32_t *tp_idx;
  int tp_idx_n;
  float *pp_zero; /* pipeline parallelism: zeros the size of x (a rank's share of a stage's hand-over) */
  /* host copies of weights the loader rearranged (permuted q/k rows), freed with the model */
  void **host_owned;
  int n_host_owned;
};

/* Load a model onto a given backend (the model takes ownership of be, also on failure). */
smelt_status sm_model_load_on(const char *dir, const smelt_model_params *p, sm_backend *be, smelt_model **out);
/* ... as rank tp->rank of a tensor-parallel group (tp.h; the model keeps tp), or alone when tp is NULL */
smelt_status sm_model_load_rank(const char *dir, const smelt_model_params *p, sm_backend *be, struct sm_tp *tp,
                                smelt_model **out);

/* Run the model over batch b (see backend.h), writing logits of b->out_rows into
 * host logits[n_out][vocab]. The caller (engine) owns the KV cache. */
smelt_status sm_model_forward(smelt_model *m, const sm_kv_cache *kv, const sm_batch *b, float *logits);
/* Ensure scratch buffers fit n_tokens rows / n_out logits rows. */
smelt_status sm_model_reserve(smelt_model *m, int n_tokens, int n_out);
/* KV cache allocation on the model's backend, elements of m->kv_dtype (attention layers only); for a
 * hybrid model also n_slots recurrent state slots (n_slots > 0 required then, ignored otherwise). */
smelt_status sm_kv_alloc(smelt_model *m, int n_blocks, int block_size, int n_slots, sm_kv_cache *kv);
void sm_kv_free(smelt_model *m, sm_kv_cache *kv);
/* Copy every recurrent layer's state of slot src into slot dst; the K/V of cache block src into block dst,
 * every attention layer (backend copies, in stream order; a split model's other ranks do the same) */
void sm_kv_copy_state(smelt_model *m, const sm_kv_cache *kv, int dst, int src);
void sm_kv_copy_block(smelt_model *m, const sm_kv_cache *kv, int dst, int src);
/* Bytes of one sequence's recurrent state (all recurrent layers); 0 without recurrent layers. */
size_t sm_model_state_bytes(const smelt_model *m);

/* recurrent.c: the recurrent mixer of layer l (a recurrent layer of a hybrid model) on ain [n][hidden]
 * into out [n][hidden]; the per-token floats of each scratch buffer (SM_REC_S_*) */
void sm_rec_mixer(smelt_model *m, const sm_kv_cache *kv, int l, const float *ain, int n, float *out);
void sm_rec_scratch(const sm_config *c, size_t per_token[SM_REC_SCRATCH]);

/* the tensors the loader has taken (pointers into the safetensors index): what is left over fails the load;
 * the vision tower's loader (src/vision) reads through it too */
typedef struct sm_load_ctx {
  const sm_tensor **p;
  size_t n, cap;
} sm_load_ctx;
/* loader.c: "<prefix>.weight" (+ .scales, and .biases for affine quantization) as a weight of rows x cols, or,
 * n_stack > 0, of n_stack stacked [rows][cols] matrices (an [n_stack][rows][...] tensor: a weight of
 * n_stack * rows rows); the quantization mode comes from config.json, checked against the shapes */
smelt_status sm_load_linear(smelt_model *m, sm_load_ctx *ts, const char *prefix, int64_t n_stack, int64_t rows,
                            int64_t cols, sm_weight *w, bool optional);
/* a [n] (n_stack 0) or [n_stack][n] tensor as a float32 backend buffer the model owns (element i = perm[i],
 * perm may be NULL) */
smelt_status sm_load_vec(smelt_model *m, sm_load_ctx *ts, const char *name, int64_t n_stack, int64_t n, float **out,
                         bool optional, const int64_t *perm);
/* a float tensor [n] times mul, as a float32 backend buffer the model owns */
smelt_status sm_load_vec_times(smelt_model *m, sm_load_ctx *ts, const char *name, int64_t n, float mul, float **out);
/* a tensor by name (NULL if absent), recorded as taken */
const sm_tensor *sm_load_take(smelt_model *m, sm_load_ctx *ctx, const char *name);

/* moe.c: mixture-of-experts layers and attention sinks (family.h sm_moe_spec, recipe attn_sinks) */
smelt_status sm_moe_check(smelt_model *m); /* the family's and config's MoE fields agree */
smelt_status sm_moe_load_layer(smelt_model *m, sm_load_ctx *ts, int l, const char *layer_prefix);
smelt_status sm_moe_prepare(smelt_model *m);               /* backend prepare_weight of the expert weights */
void sm_moe_release(smelt_model *m);                       /* ... and their release, and the scratch */
smelt_status sm_moe_reserve(smelt_model *m, int n_tokens); /* the MoE scratch for n tokens (sm_model_reserve) */
/* out[n][hidden] = the mixture of layer L on x[n][hidden] (routed experts and shared experts) */
smelt_status sm_moe_forward(smelt_model *m, const sm_layer *L, const float *x, int n, float *out);
/* experts beside the dense MLP (sm_moe_spec beside_mlp): mout[n][hidden] += the experts' normed output on the
 * residual m->x (m->xb is scratch) */
smelt_status sm_moe_beside(smelt_model *m, const sm_layer *L, int n, float *mout);
/* tensor parallelism (tp_shard.c): layer l's experts as rank r of n keeps them */
smelt_status sm_moe_split(smelt_model *m, int l, int r, int n);

/* mla.c: multi-head latent attention (recipe mla, config.h sm_mla_config) */
smelt_status sm_mla_check(smelt_model *m); /* the backend's ops and the config's shapes (OK for other families) */
smelt_status sm_mla_load_layer(smelt_model *m, sm_load_ctx *ts, int l, const char *layer_prefix);
smelt_status sm_mla_prepare(smelt_model *m);
void sm_mla_release(smelt_model *m);
smelt_status sm_mla_reserve(smelt_model *m, int n_tokens);
/* out[n][hidden] = the attention of layer l on ain[n][hidden] (o_proj included) */
void sm_mla_attention(smelt_model *m, const sm_kv_cache *kv, int l, const float *ain, int n, float *out);
/* tensor parallelism (tp_shard.c): layer l's heads as rank r of n keeps them */
smelt_status sm_mla_split(smelt_model *m, int l, int r, int n);
/* loader.c: w becomes n rows of itself, row i = row perm[i] (host copies the model owns) */
void sm_load_gather_rows(smelt_model *m, sm_weight *w, const int64_t *perm, int64_t n);
void *sm_model_host_own(smelt_model *m, void *host_buf); /* freed with the model */

/* loader.c: the checkpoint's tensors into m (family names, recipe), uploaded to m->be */
smelt_status sm_model_load_weights(smelt_model *m);
void sm_model_release_weights(smelt_model *m);
void *sm_model_own(smelt_model *m, void *backend_buf); /* freed with the model */
/* rope.c: the RoPE tables (after the weights: the layer specs say which tables are used) */
smelt_status sm_model_setup_rope(smelt_model *m);
/* the rope_ext parameters of table t (query: with the Llama-4 query scaling) */
void sm_rope_ext_params(const smelt_model *m, const sm_rope_tab *t, bool query, sm_rope_ext *out);

/* Synthetic checkpoints: random weights with the shape of a known model, in a family's layout. */
typedef struct {
  const char *name;
  int hidden, layers, heads, kv_heads, ffn, vocab;
  bool tied;
  const char *family; /* model_type; NULL = "llama" */
  int head_dim;       /* 0 = hidden / heads */
  const char *extra;  /* more config.json members (a JSON object's text), or NULL */
} sm_synth_shape;
/* "test", "tiny", "test1b", "test8b", "1b", "3b", "8b", "70b", and shapes of other families ("gemma3-4b",
 * "phi4-mini", "mistral-small-24b", the hybrid "qwen3.5-9b" and "lfm2-1.2b"); NULL if unknown */
const sm_synth_shape *sm_synth_find(const char *name);
const sm_synth_shape *sm_synth_all(size_t *n);
/* Write config.json + model.safetensors (bits 0 = bf16) into dir unless both exist. */
smelt_status sm_make_synthetic(const sm_synth_shape *sh, int bits, int gs, const char *dir, bool verbose);

#endif
