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
 * fused weight is made by offsetting data/scales/biases (see sm_weight_rows). */
typedef struct sm_weight {
  int64_t rows, cols;
  int bits;       /* 0 = dense */
  int group_size; /* quantized only */
  sm_dtype dtype;
  const void *data, *scales, *biases;
  void *dev;      /* backend-private handle; NULL until prepare_weight */
} sm_weight;

/* Sub-view of rows [r0, r0+n) of w (no copy). */
sm_weight sm_weight_rows(const sm_weight *w, int64_t r0, int64_t n);
/* Dequantize/convert row r into out[cols] (reference path; also used for embeddings). */
void sm_weight_row_f32(const sm_weight *w, int64_t r, float *out);

/* Paged KV cache: per layer a pool of n_blocks*block_size slots of
 * [n_kv_heads][head_dim] elements of dtype (SM_DT_F32, SM_DT_F16 or SM_DT_BF16; kv_store rounds
 * to nearest even) for K and for V. */
typedef struct {
  int n_layers, n_kv_heads, head_dim, block_size, n_blocks;
  sm_dtype dtype; /* 0 (a zeroed struct): SM_DT_F32 */
  void **k, **v;  /* [n_layers] backend buffers */
} sm_kv_cache;

/* One forward step over a batch of tokens from one or more sequences.
 * Token t belongs to sequence seq[t] at position pos[t]. Its K/V go to slot
 *   block_table[seq[t]*max_blocks + pos[t]/block_size]*block_size + pos[t]%block_size
 * and it attends (causally) to positions [max(0,pos[t]-window+1), pos[t]] of its sequence.
 * out_rows lists the n_out token indices whose logits are wanted. All host memory. */
typedef struct {
  int n_tokens;
  const int32_t *tokens;      /* [n_tokens] */
  const int32_t *pos;         /* [n_tokens] */
  const int32_t *seq;         /* [n_tokens] */
  int n_seqs;
  int max_blocks;             /* columns of block_table */
  const int32_t *block_table; /* [n_seqs][max_blocks] */
  int n_out;
  const int32_t *out_rows;    /* [n_out] */
  int feed_token;             /* 1: tokens[0] is replaced, on the device, by the token of the last
                               * sample_async (pipelined decode; backends with sample_async) */
} sm_batch;

/* One token to sample from a row of logits (see sm_sample_row for the exact rule). The host
 * prepares it (sm_sampler_prepare: penalty counts over the history window, the uniform draw
 * from the request's seeded generator), so a backend only needs the logits it already holds. */
typedef struct { int32_t token, count; } sm_tok_count;
typedef struct {
  int row;                  /* logits row to sample from */
  float temperature;        /* <= 0 (or NaN): greedy */
  int top_k;                /* <= 0 or >= vocab: off */
  float top_p;              /* < 1: candidates sorted; cut only when 0 < top_p < 1 */
  float min_p;              /* <= 0: off */
  float repetition_penalty; /* applied to pen[] tokens when > 0 and != 1 */
  float frequency_penalty, presence_penalty;
  int n_pen;                /* distinct token ids in [0, vocab) with their counts */
  const sm_tok_count *pen;  /* host memory */
  double u;                 /* uniform in [0, 1) drawn by the host (unused when greedy) */
} sm_sample_req;

/* Reference sampler, shared by the host sampler and the CPU backend; every backend's
 * sample op returns exactly this token for the same logits and request:
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
/* Argument checks for a sample op (rows, penalty tokens); SMELT_ERR_INVALID with a message. */
smelt_status sm_sample_check(const sm_sample_req *req, int n_req, int n_rows, int vocab);

/* What a matmul computes in the model. The model states it with every matmul; backends use it to
 * pick kernels and fusions and never infer it from shapes. */
typedef enum {
  SM_MM_OTHER = 0,
  SM_MM_Q, SM_MM_K, SM_MM_V, SM_MM_O,     /* attention projections */
  SM_MM_GATE, SM_MM_UP, SM_MM_DOWN,       /* MLP */
  SM_MM_LM_HEAD,                          /* vocabulary logits */
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
  float beta;            /* 0: off */
  int beta_pos;          /* > 0 when beta > 0 */
} sm_rope_ext;

typedef struct sm_backend sm_backend;
struct sm_backend {
  const char *name; /* "cpu", "cuda" */
  int n_threads;    /* host threads the backend computes with (CPU: its pool; 0 where not applicable) */
  void (*destroy)(sm_backend *be);

  /* memory */
  void *(*alloc)(sm_backend *be, size_t bytes); /* NULL on OOM; contents undefined */
  void (*free)(sm_backend *be, void *p);
  void (*upload)(sm_backend *be, void *dst, const void *src, size_t bytes);
  void (*download)(sm_backend *be, void *dst, const void *src, size_t bytes); /* waits */
  void (*sync)(sm_backend *be);
  smelt_status (*prepare_weight)(sm_backend *be, sm_weight *w);
  void (*release_weight)(sm_backend *be, sm_weight *w);

  /* Make b current: later ops that need tokens/positions/tables read it.
   * The backend copies what it needs; b may be freed after this returns. */
  smelt_status (*set_batch)(sm_backend *be, const sm_batch *b);

  /* out[t][:] = row tokens[t] of emb (dequantized), t < n_tokens of the current batch */
  void (*embed)(sm_backend *be, const sm_weight *emb, float *out);
  /* y[n][w->rows] = x[n][w->cols] . W^T; role: what it is in the model */
  void (*matmul)(sm_backend *be, sm_mm_role role, const sm_weight *w, const float *x, int n, float *y);
  /* out[i][:] = x[i][:] / rms(x[i]) * (w + w_offset), i < n rows of dim; out may == x */
  void (*rmsnorm)(sm_backend *be, float *out, const float *x, const float *w, int n, int dim,
                  float eps, float w_offset);
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
  void (*attention)(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer,
                    int n_heads, float scale, int window, float softcap);
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

  /* Optional (NULL: the engine downloads the logits and samples on the host): for each of
   * n_req requests, out_tokens[i] = sm_sample_row(req[i], row req[i].row of logits), where
   * logits is a backend buffer of n_rows x vocab floats (left unchanged). out_tokens is host
   * memory; waits for all previous ops. */
  smelt_status (*sample)(sm_backend *be, const float *logits, int n_rows, int vocab, const sm_sample_req *req,
                         int n_req, int32_t *out_tokens);
  /* Optional (NULL: no pipelined decode): the sample op for one request without waiting. The
   * token stays on the device for the next set_batch with feed_token; sample_wait(slot) waits
   * for it and returns it. *slot is 0 or 1: at most two may be outstanding (the caller waits for
   * the older before issuing a third). */
  smelt_status (*sample_async)(sm_backend *be, const float *logits, int n_rows, int vocab, const sm_sample_req *req,
                               int *slot);
  smelt_status (*sample_wait)(sm_backend *be, int slot, int32_t *token);

  /* Optional (may be NULL): measured streaming-read bandwidth of the memory the weights
   * live in, bytes/s (device-to-device copy on GPUs: bytes read + written), with the threads
   * the backend computes with. For rooflines. */
  double (*measure_bandwidth)(sm_backend *be);
};

/* The backend registry (registry.c): a backend for a device kind. AUTO takes the first available
 * of CUDA (when built and a GPU is present) and CPU. index: the device ordinal (GPUs); threads: CPU
 * threads (0 = all cores). NULL with sm_err set when it cannot be made. */
sm_backend *sm_backend_create(smelt_device dev, int index, int threads);
/* the same with the CPU backend's options (used when dev is CPU, or AUTO falls back to it) */
typedef struct sm_cpu_opts sm_cpu_opts;
sm_backend *sm_backend_create_opts(smelt_device dev, int index, const sm_cpu_opts *cpu);

sm_backend *sm_cpu_backend_create(int n_threads); /* n_threads 0 = all cores */
/* CPU backend options (smelt_model_params' cpu fields; docs/cpu.md) */
struct sm_cpu_opts {
  int n_threads;        /* 0: all CPUs the placement leaves */
  const char *cpu_mask; /* NULL or "": no pinning; else hex mask or CPU list, one CPU per thread */
  smelt_numa numa;      /* DISTRIBUTE: thread i on NUMA node i % nodes; ISOLATE: the caller's node */
  int poll;             /* 0..100: how long idle threads spin before they sleep */
};
sm_backend *sm_cpu_backend_create_opts(const sm_cpu_opts *o);
#ifdef SMELT_HAVE_CUDA
/* NULL (with sm_err set) when no usable GPU. */
sm_backend *sm_cuda_backend_create(int device);
#endif

#ifdef __cplusplus
}
#endif
#endif
