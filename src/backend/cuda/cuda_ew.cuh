/* Elementwise and row ops (cuda_ew.cu). */
#ifndef SM_CUDA_EW_CUH
#define SM_CUDA_EW_CUH
#include "backend/cuda/cuda_common.cuh"

/* where a step's new K/V rows go: layer buffers of the paged cache and the batch metadata */
struct cu_kv_dst {
  void *K, *V;    /* elements of dt */
  sm_dtype dt;
  const int32_t *pos, *seq, *table;
  int row; /* n_kv_heads * head_dim */
  int hd;  /* head_dim (the quantized caches' head rows) */
  int max_blocks, bs, nblocks;
};

void cu_rmsnorm(const cu_ctx *cx, float *out, const float *x, const float *w, int n, int dim, float eps, float off);
/* x += a, then out = rmsnorm(x) */
void cu_add_rmsnorm(const cu_ctx *cx, float *out, float *x, const float *a, const float *w, int n, int dim, float eps,
                    float off);
/* rotate-half RoPE in place of the first rot dims of each head */
void cu_rope(const cu_ctx *cx, float *x, const int32_t *pos, const float *inv, int n_tokens, int nh, int hd, int rot);
/* RoPE with position-dependent frequency rows and scaling (backend.h sm_rope_ext) */
struct cu_rope_ext_args {
  const float *inv;
  int rot, n_rows, pos0;
  float mscale, beta;
  int beta_pos;
};
void cu_rope_ext(const cu_ctx *cx, float *x, const int32_t *pos, const cu_rope_ext_args *a, int n_tokens, int nh, int hd);
/* LayerNorm over rows of dim (weight w, optional bias b) */
void cu_layernorm(const cu_ctx *cx, float *out, const float *x, const float *w, const float *b, int n, int dim, float eps);
/* k, v [n_tokens][row] into the cache; a q8_0 / q4_0 cache quantizes each head row exactly as the CPU
 * reference sm_kv_quantize_row (the same codes and scales) */
void cu_kv_store(const cu_ctx *cx, const cu_kv_dst *d, const float *k, const float *v, int n_tokens);
/* rope(q) + rope(k) + kv_store(k, v) in one launch. rows (NULL: one row, no scaling) makes it two
 * rope_ext of the same rows (sm_rope_ext without beta): invq / invk hold n_rows rows, token t at
 * position p uses row p < pos0 ? 0 : min(p - pos0 + 1, n_rows - 1), and the rotated dims of q and k
 * are multiplied by mq and mk */
struct cu_rope_rows {
  int n_rows, pos0;
  float mq, mk;
};
void cu_rope_qk_store(const cu_ctx *cx, const cu_kv_dst *d, float *q, float *k, const float *v, const float *invq,
                      const float *invk, int n_tokens, int nh, int nkv, int hd, int rotq, int rotk,
                      const cu_rope_rows *rows = NULL);
enum { CU_EW_SILU, CU_EW_GELU, CU_EW_ADD, CU_EW_ADD_ROWS, CU_EW_SCALE, CU_EW_SOFTCAP };
/* SILU/GELU: y = act(a) * b; ADD: y += a; ADD_ROWS: y[i] += a[i % dim]; SCALE: y *= s; SOFTCAP: y = s tanh(y / s) */
void cu_ew(const cu_ctx *cx, int kind, float *y, const float *a, const float *b, float s, size_t n, int dim);
/* dst[i][:] = src[rows[i]][:] */
void cu_gather(const cu_ctx *cx, float *dst, const float *src, const int32_t *rows, int n_out, int dim);

#endif
