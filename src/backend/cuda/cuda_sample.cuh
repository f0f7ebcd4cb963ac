/* Sampling on the GPU (cuda_sample.cu). */
#ifndef SM_CUDA_SAMPLE_CUH
#define SM_CUDA_SAMPLE_CUH
#include "backend/cuda/cuda_common.cuh"

/* sample op (cuda_sample.cu): out_tokens[i] = sm_sample_row(req[i], row req[i].row of the device
 * logits [n_rows][vocab]) (backend.h), bit-exact with the host; issued on s after the work
 * already queued there, then waits for s. With dev_dst (device memory, n_req ints) the tokens
 * are written there instead and it returns without waiting. Scratch is kept per device (dev).
 * walk_bps: blocks an SM of the passes over sampled rows (tuning, SMELT_CUDA_WALK_BPS). */
smelt_status cu_sample(const float *logits, int n_rows, int vocab, const sm_sample_req *req, int n_req,
                       int32_t *out_tokens, cudaStream_t s, int dev, int32_t *dev_dst = NULL, int walk_bps = 16);
/* The greedy token of one logits row (as cu_sample for a greedy request without penalties) in one
 * launch, so that a decode graph can hold it: written to dev_dst[0] and, when not NULL, host_dst[0]
 * (mapped pinned memory). Scratch owned by the caller, fixed while a graph refers to it: pv / pi of
 * CU_ARGMAX_SCRATCH floats / ints, cnt one unsigned zeroed once (left zero). */
#define CU_ARGMAX_SCRATCH 128
void cu_argmax1(const cu_ctx *cx, const float *logits, int V, float *pv, int *pi, unsigned *cnt, int32_t *dev_dst,
                int32_t *host_dst);

#endif
