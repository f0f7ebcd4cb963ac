/* Compute backend interface. The model code (src/model) is written only against this
 * table of operations, so CPU and CUDA (and later Metal) are interchangeable.
 *
 * Conventions:
 *  - Activation buffers are float32, allocated with be->alloc (device memory on GPU
 *    backends), row-major [n_tokens][dim].
 *  - Ops are issued in order; device backends may run them asynchronously.
 *    be->download() and be->sync() wait for all previous ops.
 *  - Weights are sm_weight views of the mmap'd checkpoint; prepare_weight() lets a
 *    backend upload/repack them once (storing its handle in w->dev). */
#ifndef SM_BACKEND_H
#define SM_BACKEND_H
#include "base/base.h"
#include "format/mxq.h"
#include "format/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 2-D weight [rows = out_features][cols = in_features] (embeddings: [vocab][hidden]).
 * Dense: data holds rows*cols elements of dtype (F32/F16/BF16).
 * MLX affine quantized (bits 2,3,4,5,6,8): row r is a little-endian bit stream of
 * cols*bits bits starting at (uint8_t*)data + r*cols*bits/8; element j is bits
 * [j*bits, (j+1)*bits). Dequantized value = scale[r][j/gs] * q + bias[r][j/gs], where
 * scales/biases are [rows][cols/gs] of dtype (F16/BF16/F32). A row-range view of a
 * fused weight is made by offsetting data/scales/biases (see sm_weight_rows).
 * MLX microscaling modes (qmode mxfp4 / mxfp8 / nvfp4, format/mxq.h): rows of cols*bits/8 bytes of FP4/FP8
 * codes, scales [rows][cols/gs] uint8 codes (dtype SM_DT_U8), no biases; value = scale * element.
 * Stacked expert weights (MoE) are one weight of n_experts * rows_per_expert rows: expert e is the row
 * range [e * rows_per_expert, (e + 1) * rows_per_expert). */
typedef struct sm_weight {
  int64_t rows, cols;
  int bits;       /* 0 = dense */
  int group_size; /* quantized only */
  int qmode;      /* sm_qmode (quantized only; 0 = affine) */
  sm_dtype dtype; /* dense elements, or affine scales/biases, or SM_DT_U8 (microscaling scale codes) */
  const void *data, *scales, *biases;
  void *dev;    /* backend-private handle; NULL until prepare_weight */
  bool stacked; /* an expert stack: matmul_experts reads it through per-expert row views */
} sm_weight;

/* Sub-view of rows [r0, r0+n) of w (no copy). */
sm_weight sm_weight_rows(const sm_weight *w, int64_t r0, int64_t n);
/* Dequantize/convert row r into out[cols] (reference path; also used for embeddings). */
void sm_weight_row_f32(const sm_weight *w, int64_t r, float *out);

/* Paged KV cache: per layer a pool of n_blocks*block_size slots of n_kv_heads head rows of head_dim
 * values of dtype (SM_DT_F32, SM_DT_F16 or SM_DT_BF16, kv_store rounds to nearest even; SM_DT_Q8_0 or
 * SM_DT_Q4_0, quantized head rows of sm_kv_head_bytes, src/backend/kv_quant.h) for K and for V. */
typedef struct {
  int n_layers, n_kv_heads, head_dim, block_size, n_blocks;
  sm_dtype dtype; /* 0 (a zeroed struct): SM_DT_F32 */
  void **k, **v;  /* [n_layers] backend buffers; NULL for the recurrent layers of a hybrid model */
  /* Hybrid models: the recurrent layers' state, a fixed size per sequence. Per recurrent layer, n_slots
   * slots of conv_floats (the last kernel-1 inputs of its convolution, [kernel-1][channels]) and of
   * ssm_floats (the SSM / delta-rule state) floats; a batch's state_slot says which slot a sequence
   * uses. NULL (n_slots 0) without recurrent layers. */
  int n_slots;
  size_t conv_floats, ssm_floats;
  float **conv, **ssm; /* [n_layers] backend buffers; NULL for attention layers */
  int tp_id;           /* tensor parallelism: the other ranks' copy of this cache (src/model/tp.c) */
  /* Layers of their own shape (Gemma 4): per layer its KV heads and head size ([n_layers], else NULL: all
   * n_kv_heads x head_dim). The model passes backends a copy with the layer's shape in n_kv_heads / head_dim;
   * k[l] / v[l] are NULL for a layer that attends over another layer's K/V. */
  int *layer_kv_heads, *layer_head_dim;
} sm_kv_cache;
/* bytes of one position of layer l's K (or V) */
size_t sm_kv_row_bytes(const sm_kv_cache *kv, int layer);

/* Rows of a batch whose input embedding is given instead of looked up (images in a prompt): batch rows
 * [row, row + n) take the rows of src (a backend buffer, n x hidden floats); deep[l] (l < n_deep):
 * rows added to the hidden state after decoder layer l (Qwen3-VL's deepstack). Read by the model. */
typedef struct {
  int row, n;
  const float *src;
  int n_deep;
  const float *const *deep;
} sm_batch_embd;

/* One forward step over a batch of tokens from one or more sequences.
 * Token t belongs to sequence seq[t] at position pos[t]. Its K/V go to slot
 *   block_table[seq[t]*max_blocks + pos[t]/block_size]*block_size + pos[t]%block_size
 * and it attends (causally) to positions [max(0,pos[t]-window+1), pos[t]] of its sequence (attn_span may
 * widen that).
 * out_rows lists the n_out token indices whose logits are wanted. All host memory. */
typedef struct {
  int n_tokens;
  const int32_t *tokens; /* [n_tokens] */
  const int32_t *pos;    /* [n_tokens] */
  const int32_t *seq;    /* [n_tokens] */
  int n_seqs;
  int max_blocks;             /* columns of block_table */
  const int32_t *block_table; /* [n_seqs][max_blocks] */
  int n_out;
  const int32_t *out_rows;  /* [n_out] */
  int feed_token;           /* 1: tokens[0] is replaced, on the device, by the token of the last
                               * sample_async (pipelined decode; backends with sample_async) */
  const int32_t *feed_rows; /* NULL, or [n_tokens]: token t with feed_rows[t] >= 0 is replaced, on the
                             * device, by token feed_rows[t] of the last sample_batch_async (its tokens[t]
                             * is a placeholder); pipelined batch steps, backends with sample_batch_async */
  /* Hybrid models (NULL otherwise): the recurrent state slot of each sequence, [n_seqs]. The tokens of a
   * sequence must then be consecutive in the batch with consecutive positions; a sequence whose first
   * token here is at position 0 starts from a zero state. */
  const int32_t *state_slot;
  const int32_t *attn_span; /* NULL, or [n_tokens][2]: token t attends to positions
                               * [min(w, attn_span[2t]), max(pos[t], attn_span[2t+1])] of its sequence, w the
                               * first of its window (the image tokens of Gemma 3 see each other); those
                               * positions are in this batch or the cache */
  /* read by the model, not the backends: */
  int n_embd;                /* runs of rows with given embeddings */
  const sm_batch_embd *embd; /* [n_embd] */
  const int32_t *rope_pos;   /* [3][n_tokens] M-RoPE positions (Qwen-VL), NULL: pos on every axis */
} sm_batch;

/* One token to sample from a row of logits (see sm_sample_row for the exact rule). The host
 * prepares it (sm_sampler_prepare: penalty counts over the history window, the uniform draw
 * from the request's seeded generator), so a backend only needs the logits it already holds. */
typedef struct {
  int32_t token, count;
} sm_tok_count;
typedef struct {
  int row;                  /* logits row to sample from */
  float temperature;        /* <= 0 (or NaN): greedy */
  int top_k;                /* <= 0 or >= vocab: off */
  float top_p;              /* < 1: candidates sorted; cut only when 0 < top_p < 1 */
  float min_p;              /* <= 0: off */
  float repetition_penalty; /* applied to pen[] tokens when > 0 and != 1 */
  float frequency_penalty, presence_penalty;
  int n_pen;               /* distinct token ids in [0, vocab) with their counts */
  const sm_tok_count *pen; /* host memory */
  double u;                /* uniform in [0, 1) drawn by the host (unused when greedy) */
  /* Constrained decoding (step 0 of sm_sample_row), host memory read during the call. Device
   * backends apply both on the device (the CUDA backend uploads all masks of a call in one copy
   * from pinned memory), so a masked row is sampled like any other and its logits never come back. */
  int n_bias;              /* OpenAI logit_bias: logit[bias_ids[i]] += bias_vals[i], i in order */
  const int32_t *bias_ids; /* [n_bias] in [0, vocab) */
  const float *bias_vals;  /* [n_bias] */
  /* NULL, or a grammar mask of (vocab + 31) / 32 words: token t is allowed when bit t % 32 of word
   * t / 32 is set; the others' logits become -inf. A mask that allows no token of [0, vocab) is
   * refused (sm_sample_check). */
  const uint32_t *mask;
} sm_sample_req;

/* Reference sampler, shared by the host sampler and the CPU backend; every backend's
 * sample op returns exactly this token for the same logits and request:
 *  0. the logit biases in order, then the mask (masked logits -inf);
 *  1. penalties on pen[] tokens; every logit l becomes its key (NaN -> -inf, +inf -> FLT_MAX,
 *     -0 -> +0);
 *  2. greedy: the first index of the maximum key;
 *  3. otherwise candidates: the top_k keys (top_k on) or all, in the order "key desc, index
 *     asc" when sorted (top_k on, or top_p < 1), else in natural order; mx = their max (all
 *     -inf: the first candidate is returned); e_i = sm_sample_exp((key_i - mx) / T) and
 *     weights q_i = floor(e_i * 2^100) summed exactly (sample_math.h);
 *  4. top_p (0 < top_p < 1): keep the shortest prefix whose cumulative weight C satisfies
 *     double(C) >= top_p * double(total);
 *  5. min_p (> 0): drop candidates with e_i < min(min_p, 1) (e of the max is 1);
 *  6. r = u * double(kept total); the first kept candidate with r < double(cumulative kept
 *     weight) (fallback: the last kept one of non-zero weight).
 * row (vocab floats) is overwritten; e (vocab floats) and idx (vocab ints) are scratch. */
int32_t sm_sample_row(const sm_sample_req *r, float *row, int vocab, float *e, int32_t *idx);
/* The same token, with the row's passes over the vocabulary split over the pool's threads where it
 * is large (natural order, top_p, top_k over 256); pool NULL: sm_sample_row. */
typedef struct sm_pool sm_pool;
int32_t sm_sample_row_pool(const sm_sample_req *r, float *row, int vocab, float *e, int32_t *idx, sm_pool *pool);
/* (-1 when r->mask allows no token: sm_sample_check refuses such a request first.) */
/* Argument checks for a sample op (rows, penalty and bias tokens, a mask that allows no token);
 * SMELT_ERR_INVALID with a message. */
smelt_status sm_sample_check(const sm_sample_req *req, int n_req, int n_rows, int vocab);

/* The two slots of a backend's sample_batch_async results (batch_slots.c): the slot the next call takes,
 * which ones wait to be collected, the row count of each and the slot of the latest (what a batch's
 * feed_rows name; -1: none). Zeroed, then sm_batch_slots_init. */
typedef struct {
  int n[2];
  bool live[2];
  int next, last;
} sm_batch_slots;
void sm_batch_slots_init(sm_batch_slots *s);
/* the slot a call of n_req requests takes (an error while its last result is not collected) */
smelt_status sm_batch_slots_take(const sm_batch_slots *s, int n_req, int *slot);
void sm_batch_slots_fill(sm_batch_slots *s, int slot, int n_req); /* its result is there: the latest */
smelt_status sm_batch_slots_wait(sm_batch_slots *s, int slot);    /* collected (an error when nothing is) */
/* token t of a batch fed from row `row` of the latest result: an error when there is no such row */
smelt_status sm_batch_slots_feed(const sm_batch_slots *s, int t, int row);
/* Set the logits of the tokens whose bit in mask is clear to -inf (step 0 of sm_sample_row);
 * returns the number of allowed tokens in [0, vocab). */
int sm_sample_apply_mask(float *logits, int vocab, const uint32_t *mask);

/* What a matmul computes in the model. The model states it with every matmul; backends use it to
 * pick kernels and fusions and never infer it from shapes. */
typedef enum {
  SM_MM_OTHER = 0,
  SM_MM_Q,
  SM_MM_K,
  SM_MM_V,
  SM_MM_O, /* attention projections */
  SM_MM_GATE,
  SM_MM_UP,
  SM_MM_DOWN,    /* MLP */
  SM_MM_LM_HEAD, /* vocabulary logits */
  SM_MM_ROUTER,  /* mixture of experts: router logits (one per expert) */
  SM_MM_EXPERT_GATE,
  SM_MM_EXPERT_UP,
  SM_MM_EXPERT_DOWN, /* the routed experts (matmul_experts) */
  SM_MM_SHARED_GATE, /* the sigmoid gate of a shared expert (one row) */
  SM_MM_ATTN_GATE,   /* gated attention: the gate of the attention output */
  SM_MM_REC_IN,
  SM_MM_REC_OUT, /* recurrent mixers (hybrid models): into and out of the mixer */
  SM_MM_MLA_UK,  /* multi-head latent attention: a head's query into the latent space (matmul_experts) */
  SM_MM_MLA_UV,  /* ... and the attended latent out to the head's values (matmul_experts) */
  SM_MM_PLE,     /* per-layer inputs (Gemma 4): the embeddings' projection, a layer's gate and output */
  SM_MM_ROLES
} sm_mm_role;
const char *sm_mm_role_name(sm_mm_role r);

/* RoPE whose frequencies depend on the position, and whose rotated dims are scaled: the long-context
 * variants (longrope's short/long factors, dynamic NTK past the trained length, the YaRN/longrope
 * attention factor with partial rotary, the Llama-4 query scaling of Ministral 3). Token t at position
 * p = pos[t] (current batch) uses row
 *   r = p < pos0 ? 0 : min(p - pos0 + 1, n_rows - 1)
 * of inv_freq; dims [0, rot_dim) of each head are rotated (rotate-half) by the angles p * inv_freq[r][i]
 * and then multiplied by mscale; when beta > 0, the whole head is then multiplied by
 * 1 + beta * log(1 + floor(p / beta_pos)). */
typedef struct {
  const float *inv_freq; /* backend buffer: n_rows rows of rot_dim/2 floats */
  int rot_dim;           /* even, <= head_dim */
  int n_rows, pos0;      /* n_rows >= 1 */
  float mscale;
  float beta;   /* 0: off */
  int beta_pos; /* > 0 when beta > 0 */
} sm_rope_ext;

/* How a mixture-of-experts router turns a token's logits l[0..E) into its k experts and their weights.
 * The experts chosen are the k largest choice scores, ties broken towards the lower expert index:
 *   SOFTMAX       p = softmax(l); choice p; weight p_e (Qwen MoE)
 *   TOPK_SOFTMAX  choice l; weights softmax of the k chosen logits (gpt-oss, Mixtral)
 *   SIGMOID       s = sigmoid(l); choice s + correction (the n_group groups with the largest sums of their two
 *                 largest choice scores, topk_group of them, are kept; the others' experts score 0); weight s_e
 *                 (GLM-4 MoE, DeepSeek-V3)
 * then, with norm, the k weights are divided by their sum (+ norm_eps for SIGMOID: 1e-20 as transformers' DeepSeek-V3 /
 * GLM-4 MoE when 0, LFM2-MoE 1e-6), and all are
 * multiplied by scale. Softmax and sigmoid in float32. */
enum { SM_ROUTE_SOFTMAX, SM_ROUTE_TOPK_SOFTMAX, SM_ROUTE_SIGMOID };
typedef struct {
  int kind;             /* SM_ROUTE_* */
  int n_experts, top_k; /* top_k <= 64 */
  bool norm;
  float scale;
  float norm_eps;            /* SIGMOID with norm: added to the weights' sum (0: 1e-20) */
  const float *correction;   /* backend buffer [n_experts] (SIGMOID; NULL: none) */
  int n_group, topk_group;   /* SIGMOID group-limited choice; n_group <= 1: off */
  const float *expert_scale; /* backend buffer [n_experts]: weight j then times expert_scale[id j] (Gemma 4); NULL */
} sm_moe_route;

/* The routing of one token (the reference every backend's moe_route computes; moe_route.c): ids[0..k) and
 * wts[0..k) from logits[0..n_experts) (host memory; correction, expert_scale: host copies of r's or NULL);
 * scratch: 2 * n_experts floats. */
void sm_moe_route_row(const sm_moe_route *r, const float *logits, const float *correction, const float *expert_scale,
                      int32_t *ids, float *wts, float *scratch);

/* Joining a tensor-parallel group (comm_init): the group's id from rank 0's comm_make_id, and a block of
 * memory that every rank maps at the same address (made before the ranks were forked; the CPU backend's
 * collectives run through it) */
#define SM_COMM_ID_BYTES 128
typedef struct {
  int n_ranks, rank;
  uint8_t id[SM_COMM_ID_BYTES];
  void *shared;
  size_t shared_bytes;
  /* ranks on several hosts (shared NULL): stream sockets, rank 0's to every rank (fds[r], r >= 1), another
   * rank's to rank 0 (fds[0]); the CPU backend's collectives then pass through rank 0 */
  const int *fds;
} sm_comm_init;

typedef struct sm_backend sm_backend;
/* the forms of GELU (the gelu op) */
typedef enum {
  SM_GELU_ERF = 0,   /* 0.5 x (1 + erf(x / sqrt 2)) */
  SM_GELU_TANH = 1,  /* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
  SM_GELU_QUICK = 2, /* x sigmoid(1.702 x) (CLIP's quick_gelu) */
} sm_gelu;

struct sm_backend {
  const char *name; /* "cpu", "cuda" */
  bool kv_quant;    /* kv_store and attention take quantized caches (SM_DT_Q8_0, SM_DT_Q4_0) */
  int n_threads;    /* host threads the backend computes with (CPU: its pool; 0 where not applicable) */
  /* Batch-invariant mode (set at creation, sm_backend_opts): every op computes a token's result with the
   * same arithmetic in the same order whatever else is in the batch (its size, the token's row, other
   * sequences, prefill or decode): matmuls reduce each output of each token in one order that does not
   * depend on n, and attention splits a token's positions at boundaries that depend only on its own
   * position. Not covered on CUDA: matmul_experts (the routed experts, multi-head latent attention's per-head
   * projections), attention with sinks or attn_span, and attention shapes its decode kernel does not take (more
   * than 8 query heads a KV head). */
  bool batch_invariant;
  void (*destroy)(sm_backend *be);

  /* memory */
  void *(*alloc)(sm_backend *be, size_t bytes); /* NULL on OOM; contents undefined */
  void (*free)(sm_backend *be, void *p);
  void (*upload)(sm_backend *be, void *dst, const void *src, size_t bytes);
  void (*download)(sm_backend *be, void *dst, const void *src, size_t bytes); /* waits */
  void (*sync)(sm_backend *be);
  /* optional: start the ops issued so far without waiting for them (a device backend that
   * records ops launches them), so the host can work while they run; NULL: ops run as issued */
  void (*submit)(sm_backend *be);
  smelt_status (*prepare_weight)(sm_backend *be, sm_weight *w);
  void (*release_weight)(sm_backend *be, sm_weight *w);

  /* Make b current: later ops that need tokens/positions/tables read it.
   * The backend copies what it needs; b may be freed after this returns. */
  smelt_status (*set_batch)(sm_backend *be, const sm_batch *b);

  /* out[t][:] = row tokens[t] of emb (dequantized), t < n_tokens of the current batch */
  void (*embed)(sm_backend *be, const sm_weight *emb, float *out);
  /* y[n][w->rows] = x[n][w->cols] . W^T; role: what it is in the model */
  void (*matmul)(sm_backend *be, sm_mm_role role, const sm_weight *w, const float *x, int n, float *y);
  /* Optional (NULL: the model calls matmul for each): ys[i] = x . ws[i]^T for nw weights of one x (a
   * layer's q/k/v, or gate/up), with the same results as nw matmul calls in order; a backend may run
   * them in one dispatch (CPU decode: one pass of its threads over all the rows) */
  void (*matmul_group)(sm_backend *be, const sm_mm_role *roles, const sm_weight *const *ws, const float *x, int n,
                       float *const *ys, int nw);
  /* out[i][:] = x[i][:] / rms(x[i]) * (w + w_offset), i < n rows of dim; out may == x */
  void (*rmsnorm)(sm_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps,
                  float w_offset);
  /* out[i][:] = (x[i][:] - mean(x[i])) / sqrt(var(x[i]) + eps) * w (+ b when b != NULL), i < n rows
   * of dim (LayerNorm; variance over dim, not dim-1); out may == x */
  void (*layernorm)(sm_backend *be, float *out, const float *x, const float *w, const float *b, int n, int dim,
                    float eps);
  /* Rotate-half (NeoX/HF) RoPE in place on x[n_tokens][n_heads][head_dim], first rot_dim
   * dims of each head, angle = pos[t] * inv_freq[i] (inv_freq: rot_dim/2 floats, backend
   * buffer); positions from the current batch. */
  void (*rope)(sm_backend *be, float *x, int n_heads, int head_dim, int rot_dim, const float *inv_freq);
  /* The same on x[n_tokens][n_heads][head_dim] with position-dependent frequencies and scaling (see
   * sm_rope_ext; r is read during the call). */
  void (*rope_ext)(sm_backend *be, float *x, int n_heads, int head_dim, const sm_rope_ext *r);
  /* Write k,v [n_tokens][n_kv_heads*head_dim] of the current batch into layer's slots. */
  void (*kv_store)(sm_backend *be, const sm_kv_cache *kv, int layer, const float *k, const float *v);
  /* out[t][h*head_dim+d] = softmax(scale * q_t.K^T [+softcap]) V over the allowed positions
   * (see sm_batch); GQA: head h reads kv head h/(n_heads/n_kv_heads).
   * window <= 0 means unlimited; softcap <= 0 means off. */
  void (*attention)(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                    float scale, int window, float softcap);
  /* out[i] = silu(gate[i]) * up[i]  (n elements; out may alias gate) */
  void (*silu_mul)(sm_backend *be, float *out, const float *gate, const float *up, size_t n);
  /* out[i] = gelu_tanh(gate[i]) * up[i] */
  void (*gelu_mul)(sm_backend *be, float *out, const float *gate, const float *up, size_t n);
  /* y[i] += x[i] */
  void (*add)(sm_backend *be, float *y, const float *x, size_t n);
  /* y[r][:] += b[:], r < n rows of dim */
  void (*add_rows)(sm_backend *be, float *y, const float *b, int n, int dim);
  /* y[i] *= s */
  void (*scale)(sm_backend *be, float *y, float s, size_t n);
  /* y[i] = cap * tanh(y[i] / cap) */
  void (*softcap)(sm_backend *be, float *y, float cap, size_t n);
  /* dst[i][:] = src[out_rows[i]][:] for the current batch's out_rows (dim floats a row) */
  void (*gather_out)(sm_backend *be, float *dst, const float *src, int dim);

  /* Mixture of experts and gpt-oss (src/model/moe.c). Buffers are backend buffers; ids holds int32.
   * moe_route: for t < n, ids[t*k + j] and wts[t*k + j] (j < k = r->top_k) are the experts of token t and their
   * weights from its router logits[t][0..n_experts) (sm_moe_route). */
  void (*moe_route)(sm_backend *be, const float *logits, int n, const sm_moe_route *r, int32_t *ids, float *wts);
  /* The routed experts' matmul: w stacks the experts (expert e = rows [e * rows, (e + 1) * rows) of w), and
   * for t < n, j < k, with e = ids[t*k + j] and s = t*k + j:
   *   y[s][0..rows) = W_e . x[x_per_slot ? s : t] (+ bias[e][0..rows) when bias != NULL)
   * x rows have w->cols floats. Decode reads only the chosen experts' rows. */
  void (*matmul_experts)(sm_backend *be, sm_mm_role role, const sm_weight *w, int64_t rows, const float *bias,
                         const float *x, bool x_per_slot, int n, int k, const int32_t *ids, float *y);
  /* out[t][:] = sum_j wts[t*k + j] * y[t*k + j][:] for t < n (dim floats a row; out is overwritten) */
  void (*moe_combine)(sm_backend *be, float *out, const float *y, const float *wts, int n, int k, int dim);
  /* gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
   * out[i] = g * sigmoid(alpha * g) * (u + 1) (n elements; out may alias gate) */
  void (*swiglu_clamp)(sm_backend *be, float *out, const float *gate, const float *up, size_t n, float alpha,
                       float limit);
  /* y[t][:] *= sigmoid(g[t]), t < n rows of dim (a shared expert's gate) */
  void (*sigmoid_gate_rows)(sm_backend *be, float *y, const float *g, int n, int dim);
  /* attention (as above) whose softmax also has one sink logit per head, sinks[h] (backend buffer), whose share
   * is dropped: out = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sinks[h] - m)) (gpt-oss) */
  void (*attention_sinks)(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                          float scale, int window, float softcap, const float *sinks);
  /* Multi-head latent attention (DeepSeek-V2/V3, src/model/mla.c) on a layer whose cache has one KV head of
   * head_dim = dc + dr: a position's row is its latent c (dc values) then its rotated key part kpe (dr); the
   * layer's V buffer is its K buffer (a position's value is the first dc values of its row) and only K is
   * written. First the batch's rows are stored, row of token t = [c[t][0..dc) | kpe[t][0..dr)] (in the cache's
   * element type); then for token t and head h < n_heads, over the positions j it attends to (sm_batch,
   * causal, no window):
   *   s_j = scale * (q_lat[t][h] . c_j + q_pe[t][h] . kpe_j),   out[t][h][0..dc) = sum_j softmax(s)_j c_j
   * q_lat and out [n][n_heads][dc], q_pe [n][n_heads][dr], c [n][dc], kpe [n][dr] (n: the batch's tokens).
   * Caches of SM_DT_F32, SM_DT_F16 and SM_DT_BF16. */
  void (*attention_mla)(sm_backend *be, float *out, const float *q_lat, const float *q_pe, const float *c,
                        const float *kpe, const sm_kv_cache *kv, int layer, int n_heads, int dr, float scale);

  /* ---- ops with explicit shapes that read no batch state (vision encoders; rope_axes, copy and add
   * also serve the language model's image positions) ---- */
  /* Attention without a causal mask within segments: segment s is tokens [seg[s], seg[s+1])
   * (seg[0] = 0, seg[n_seg] = n, ascending; host memory read during the call) and
   *   out[t][h*hd + d] = sum_j softmax_j(scale * q_t,h . k_j,g) v_j,g[d]   over j in t's segment,
   * g = h / (n_heads / n_kv_heads). q, out: [n][n_heads*hd]; k, v: [n][n_kv_heads*hd]. Device backends
   * run it when issued (it is not part of a recorded step). */
  void (*attention_seg)(sm_backend *be, float *out, const float *q, const float *k, const float *v, int n, int n_heads,
                        int n_kv_heads, int head_dim, float scale, const int32_t *seg, int n_seg);
  /* Multi-axis rotate-half RoPE in place on x[n][n_heads][head_dim]: frequency i < rot_dim/2 turns
   * dims (i, i + rot_dim/2) of each head by the angle pos[axis[i]*n + t] * inv_freq[i]. inv_freq
   * (rot_dim/2 floats), axis (rot_dim/2 int32) and pos (n_axes * n int32): backend buffers. (M-RoPE
   * of the Qwen-VL language models, the 2-D RoPE of vision encoders.) */
  void (*rope_axes)(sm_backend *be, float *x, int n, int n_heads, int head_dim, int rot_dim, const float *inv_freq,
                    const int32_t *axis, const int32_t *pos);
  /* y[i] = gelu(x[i]), i < n, of kind (sm_gelu): 0.5 x (1 + erf(x / sqrt 2)), the tanh form of
   * gelu_mul, or quick GELU x sigmoid(1.702 x); y may == x */
  void (*gelu)(sm_backend *be, float *y, const float *x, size_t n, int kind);
  /* dst[i][:] = src[idx[i]][:], i < n rows of dim floats; idx: backend buffer of n int32 in
   * [0, rows of src); dst and src do not overlap */
  void (*gather_rows)(sm_backend *be, float *dst, const float *src, const int32_t *idx, int n, int dim);
  /* (copy, a byte count, is declared with the ops of recurrent layers below) */

  /* Optional (NULL: the engine downloads the logits and samples on the host): for each of
   * n_req requests, out_tokens[i] = sm_sample_row(req[i], row req[i].row of logits), where
   * logits is a backend buffer of n_rows x vocab floats (left unchanged). out_tokens is host
   * memory; waits for all previous ops. Requests with a grammar mask or logit biases are
   * sampled here like the others (the backend applies them; see sm_sample_req). */
  smelt_status (*sample)(sm_backend *be, const float *logits, int n_rows, int vocab, const sm_sample_req *req,
                         int n_req, int32_t *out_tokens);
  /* Optional (NULL: no pipelined decode): the sample op for one request without waiting. The
   * token stays on the device for the next set_batch with feed_token; sample_wait(slot) waits
   * for it and returns it. *slot is 0 or 1: at most two may be outstanding (the caller waits for
   * the older before issuing a third). */
  smelt_status (*sample_async)(sm_backend *be, const float *logits, int n_rows, int vocab, const sm_sample_req *req,
                               int *slot);
  smelt_status (*sample_wait)(sm_backend *be, int slot, int32_t *token);
  /* Optional (NULL: no pipelined batch steps): the sample op of n_req requests (n_req may be 0) without
   * waiting. Their tokens stay on the device for the next set_batch's feed_rows (row k: request k);
   * sample_batch_wait(slot) waits for them and copies the n_req tokens to the host. *slot is 0 or 1: at
   * most two may be outstanding. async: the backend queues work and returns before it is done (a GPU),
   * so that pipelining pays; false where every op runs to its end before returning (the CPU). */
  smelt_status (*sample_batch_async)(sm_backend *be, const float *logits, int n_rows, int vocab,
                                     const sm_sample_req *req, int n_req, int *slot);
  smelt_status (*sample_batch_wait)(sm_backend *be, int slot, int32_t *tokens);
  bool async;

  /* ---- tensor parallelism (src/model/tp.c; all optional, NULL where the backend has none) ----
   * The ranks of a group are processes with one backend each; they issue the same collectives in the
   * same order. comm_make_id (NULL when comm_init needs no id) fills the group's id on rank 0, which
   * sends it to the others; every rank then calls comm_init, which returns once all have joined. */
  smelt_status (*comm_make_id)(sm_backend *be, uint8_t id[SM_COMM_ID_BYTES]);
  smelt_status (*comm_init)(sm_backend *be, const sm_comm_init *ci);
  /* ordered with the other ops: x[0..n) = the sum over the ranks of their x (every rank gets the same
   * values); x[0..n) = rank 0's x; dst[r * n + i] = rank r's src[i] (dst holds n_ranks * n floats) */
  void (*all_reduce)(sm_backend *be, float *x, size_t n);
  void (*broadcast)(sm_backend *be, float *x, size_t n);
  void (*all_gather)(sm_backend *be, float *dst, const float *src, size_t n);

  /* Optional (may be NULL): measured streaming-read bandwidth of the memory the weights
   * live in, bytes/s (device-to-device copy on GPUs: bytes read + written), with the threads
   * the backend computes with. For rooflines. */
  double (*measure_bandwidth)(sm_backend *be);

  /* ---- hybrid (recurrent) models: per-sequence state in kv->conv / kv->ssm of a layer, slots from
   * the current batch's state_slot; within a sequence tokens are processed in batch order ---- */
  /* dst = src, bytes of backend memory (ordered with the ops before and after it) */
  void (*copy)(sm_backend *be, void *dst, const void *src, size_t bytes);
  /* y[i] = a[i] * b[i] (y may alias a or b) */
  void (*mul)(sm_backend *be, float *y, const float *a, const float *b, size_t n);
  /* y[i] *= sigmoid(g[i]) */
  void (*sigmoid_mul)(sm_backend *be, float *y, const float *g, size_t n);
  /* y[i] = max(y[i], 0)^2 */
  void (*relu2)(sm_backend *be, float *y, size_t n);
  /* Causal depthwise convolution of kernel K over the batch's tokens: with w [C][K] and xs the
   * sequence's earlier inputs (the state: its last K-1 rows of x, zero at position 0) followed by x,
   *   out[t][c] = bias[c] + sum_j w[c][j] * xs[t + j][c]      (bias may be NULL)
   * then silu(out) when act_silu. x and out are [n_tokens][C] (out may not alias x). Afterwards the
   * layer's conv state of each sequence holds its last K-1 inputs. */
  void (*conv1d)(sm_backend *be, float *out, const float *x, const float *w, const float *bias, int C, int K,
                 bool act_silu, const sm_kv_cache *kv, int layer);
  /* Mamba-2 selective scan. Token t of a sequence, head h (of nh, head dim P), group g = h / (nh/G),
   * state S[h] [P][N] (the layer's ssm state, zero at position 0):
   *   dt = clamp(softplus(dt_in[t][h] + dt_bias[h]), dt_min, dt_max), dA = exp(-exp(A_log[h]) * dt)
   *   S[h][p][n] = dA * S[h][p][n] + dt * x[t][h*P + p] * B[t][g*N + n]
   *   y[t][h*P + p] = sum_n S[h][p][n] * Cm[t][g*N + n] + D[h] * x[t][h*P + p]
   * x, B, Cm: rows of ld floats (columns of one buffer); dt_in rows of nh; y [n_tokens][nh*P]. */
  void (*ssm_scan)(sm_backend *be, float *y, const float *x, const float *B, const float *Cm, int ld,
                   const float *dt_in, const float *dt_bias, const float *A_log, const float *D, int nh, int P, int G,
                   int N, float dt_min, float dt_max, const sm_kv_cache *kv, int layer);
  /* Gated delta rule (Gated DeltaNet). Token t, value head h (of Hv; key head hk = h / (Hv/Hk)), state
   * S[h] [Dv][Dk] (the layer's ssm state, zero at position 0), q/k l2-normalized per head (eps 1e-6
   * inside the square root) and q scaled by 1/sqrt(Dk):
   *   g = exp(-exp(A_log[h]) * softplus(a[t][h] + dt_bias[h])), beta = sigmoid(b[t][h])
   *   S = g * S;  d[i] = beta * (v[i] - sum_j S[i][j] k[j]);  S[i][j] += d[i] k[j]
   *   y[t][h*Dv + i] = sum_j S[i][j] q[j]
   * q, k, v: rows of ld floats (columns of one buffer: q at head hk*Dk, k likewise, v at h*Dv);
   * a, b rows of Hv; y [n_tokens][Hv*Dv]. */
  void (*gated_delta)(sm_backend *be, float *y, const float *q, const float *k, const float *v, int ld, const float *a,
                      const float *b, const float *A_log, const float *dt_bias, int Hk, int Hv, int Dk, int Dv,
                      const sm_kv_cache *kv, int layer);
  /* Gated RMSNorm over groups of `group` values of rows of dim (n rows):
   *   norm_first: out = rmsnorm(x) * w * silu(z)        (Gated DeltaNet)
   *   else:       out = rmsnorm(x * silu(z)) * w        (Mamba-2)
   * with rmsnorm over each group (eps), w indexed by the position in the row modulo wdim (wdim = group:
   * one weight per group position; wdim = dim: one per element). out may alias x. */
  void (*gated_rmsnorm)(sm_backend *be, float *out, const float *x, const float *z, const float *w, int n, int dim,
                        int group, int wdim, float eps, bool norm_first);
};

/* The backend registry (registry.c): a backend for a device kind. AUTO takes the first available
 * of CUDA (when built and a GPU is present) and CPU. index: the device ordinal (GPUs); threads: CPU
 * threads (0 = all cores). NULL with sm_err set when it cannot be made. */
sm_backend *sm_backend_create(smelt_device dev, int index, int threads);
/* whether this process has tried to make a CUDA backend (CUDA is then initialized here, and a forked child
 * cannot use it: src/model/tp.c) */
bool sm_backend_cuda_touched(void);
/* GPUs there are, without initializing CUDA in this process (llama-server's --split-mode row) */
int sm_backend_gpu_count(void);
/* Options of every backend kind (smelt_model_params.deterministic) */
typedef struct {
  bool batch_invariant; /* sm_backend.batch_invariant */
} sm_backend_opts;
/* the same with the CPU backend's options (used when dev is CPU, or AUTO falls back to it) and the
 * options of every kind (NULL: defaults) */
typedef struct sm_cpu_opts sm_cpu_opts;
sm_backend *sm_backend_create_opts(smelt_device dev, int index, const sm_cpu_opts *cpu, const sm_backend_opts *opts);

sm_backend *sm_cpu_backend_create(int n_threads); /* n_threads 0 = all cores */
/* CPU backend options (smelt_model_params' cpu fields; docs/cpu.md) */
struct sm_cpu_opts {
  int n_threads;        /* 0: all CPUs the placement leaves */
  const char *cpu_mask; /* NULL or "": no pinning; else hex mask or CPU list, one CPU per thread */
  smelt_numa numa;      /* DISTRIBUTE: thread i on NUMA node i % nodes; ISOLATE: the caller's node */
  int poll;             /* 0..100: how long idle threads spin before they sleep */
  bool batch_invariant; /* sm_backend.batch_invariant */
};
sm_backend *sm_cpu_backend_create_opts(const sm_cpu_opts *o);
#ifdef SMELT_HAVE_CUDA
/* NULL (with sm_err set) when no usable GPU. */
sm_backend *sm_cuda_backend_create(int device);
sm_backend *sm_cuda_backend_create_opts(int device, const sm_backend_opts *opts); /* opts NULL: defaults */
#endif

/* nw matmuls of one x: the backend's matmul_group, or matmul for each */
static inline void sm_matmul_group(sm_backend *be, const sm_mm_role *roles, const sm_weight *const *ws, const float *x,
                                   int n, float *const *ys, int nw) {
  if (be->matmul_group && nw > 1) {
    be->matmul_group(be, roles, ws, x, n, ys, nw);
    return;
  }
  for (int i = 0; i < nw; i++) be->matmul(be, roles[i], ws[i], x, n, ys[i]);
}

#ifdef __cplusplus
}
#endif
#endif
