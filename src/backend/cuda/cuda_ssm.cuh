/* Kernels of recurrent (hybrid) models (cuda_ssm.cu): the causal depthwise convolution, the Mamba-2
 * selective scan, the gated delta rule, the gated RMSNorm and their element-wise helpers (backend.h).
 * The state ops read each sequence's state slot, first token and token count from the batch metadata. */
#ifndef SM_CUDA_SSM_CUH
#define SM_CUDA_SSM_CUH
#include "backend/cuda/cuda_common.cuh"

#define CU_CONV_MAX_K 16       /* convolution kernel width */
#define CU_SSM_MAX_PER_LANE 8  /* state size N (Mamba-2) / key head size (gated delta) <= 32 * this */

/* per sequence of the batch (device metadata): its state slot, first token and number of tokens */
struct cu_rec_batch {
  const int32_t *pos, *slot, *first, *count;
};

enum { CU_REW_MUL, CU_REW_SIGMUL, CU_REW_RELU2 };
/* MUL: y = a * b; SIGMUL: y *= sigmoid(a); RELU2: y = max(y, 0)^2 */
void cu_rec_ew(const cu_ctx *cx, int kind, float *y, const float *a, const float *b, size_t n);
void cu_conv1d(const cu_ctx *cx, const cu_rec_batch *rb, float *out, const float *x, const float *w, const float *bias,
               float *st, size_t sf, int C, int K, int act, int nseq);
void cu_ssm_scan(const cu_ctx *cx, const cu_rec_batch *rb, float *y, const float *x, const float *B, const float *Cm, int ld,
                 const float *dt, const float *dt_bias, const float *A_log, const float *D, float *st, size_t sf, int nh,
                 int P, int G, int N, float dt_min, float dt_max, int nseq);
void cu_gated_delta(const cu_ctx *cx, const cu_rec_batch *rb, float *y, const float *q, const float *k, const float *v,
                    int ld, const float *a, const float *b, const float *A_log, const float *dt_bias, float *st, size_t sf,
                    int Hk, int Hv, int Dk, int Dv, int nseq);
/* xq (may be NULL; used where group % 32 == 0): also the int8 x of out for a 4-bit matvec
 * (cu_q4_scratch_bytes(n, dim) bytes) */
void cu_gated_rmsnorm(const cu_ctx *cx, float *out, const float *x, const float *z, const float *w, int n, int dim,
                      int group, int wdim, float eps, int norm_first, void *xq = NULL);

#endif
