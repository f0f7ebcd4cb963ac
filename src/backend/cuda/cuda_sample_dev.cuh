/* What the sample op's two files share (cuda_sample.cu: the op, its staging and the walk;
 * cuda_sample_sel.cu: the select path that finds each sorted row's candidates): the request as the
 * kernels see it, the row maximum of the walk's partial maxima, and the select path's entry. */
#ifndef SM_CUDA_SAMPLE_DEV_CUH
#define SM_CUDA_SAMPLE_DEV_CUH
#include "backend/cuda/cuda_common.cuh"
#include "backend/sample_math.h"

#define WALK_MAX_S 256 /* blocks a request at most (k_walk_max's partial maxima a request) */

/* one request as the kernels see it */
typedef struct {
  double u;
  const float *src;   /* logits row (or its masked / biased / penalized copy) */
  const float *orig;  /* the logits row (copy) */
  const uint32_t *mask; /* grammar mask (device copy; NULL: none) */
  int copy;           /* src is a copy of orig made by k_prep_rows */
  int bias_off, n_bias; /* its logit biases in the staged dbias list */
  int pen_off, n_pen;   /* its (token, count) pairs in the staged dpen list */
  const float *keys;  /* sorted keys (NULL: src in natural order) */
  const int32_t *idx; /* token ids of the sorted keys */
  float *e;           /* scratch: e of each candidate */
  float T, top_p, min_p, rep, freq, pres;
  int mode, n;
  /* sorted requests of a call with several (the select path): sel 1 = top_k (k candidates), 2 =
   * top_p alone, 3 = every token; srow, its row of the sort buffers; total (has_total), the weight
   * of every token for the top_p bound when only the candidates are sorted */
  int sel, k, srow, has_total;
  sm_u128 total;
} dreq;

/* the maximum of a block's m (every thread gets it) */
static __device__ __forceinline__ float block_max(float m, float *sh) {
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l == 0) sh[w] = m;
  __syncthreads();
  if (w == 0) {
    m = l < (int)(blockDim.x >> 5) ? sh[l] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (l == 0) sh[0] = m;
  }
  __syncthreads();
  m = sh[0];
  __syncthreads();
  return m;
}

/* a request's row maximum from the S partial maxima of k_walk_max (grid y = request) */
static __device__ __forceinline__ float walk_row_max(const float *pmax, int S) {
  __shared__ float fsh[32];
  float m = -INFINITY;
  for (int k = threadIdx.x; k < S; k += blockDim.x) m = fmaxf(m, pmax[blockIdx.y * S + k]);
  return block_max(m, fsh);
}

/* The select path (cuda_sample_sel.cu), for the sorted requests (dreq.sel > 0) of a call with several:
 * after k_walk_max's pre-mode pass left each top_p row's maximum in pmax (S partial maxima a request),
 * each sorted row's candidates go, in index order, into its row srow of kin / iin (V a row) and its
 * sort segment ends at endoff[srow]; dw->n becomes the candidate count (top_p alone, every token) and
 * dw->total the row's weight (top_p alone). scratch: cu_sample_sel_scratch(n_req) bytes, cleared here. */
size_t cu_sample_sel_scratch(int n_req);
cudaError_t cu_sample_sel(dreq *dw, int n_req, int V, int S, const float *pmax, void *scratch, float *kin,
                          int32_t *iin, int *endoff, cudaStream_t s);

#endif
