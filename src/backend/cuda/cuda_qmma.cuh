/* Batched products of 4-bit weights on tensor cores (cuda_qmma.cu). */
#ifndef SM_CUDA_QMMA_CUH
#define SM_CUDA_QMMA_CUH
#include "backend/cuda/cuda_common.cuh"

/* whether cu_qmma takes n tokens of w (CW_Q4, cols a multiple of 128, n <= tuning qmma, sm_80+) */
bool cu_qmma_ok(const cu_ctx *cx, const cu_weight *w, int n);
/* y[n][rows] = x[n][cols] . W^T; x16: n * cols halves of scratch; x 16-byte aligned; ws: workspace
 * of split-k partial sums (ws_bytes limits the split) */
void cu_qmma(const cu_ctx *cx, const cu_weight *w, const float *x, int n, float *y, void *x16, void *ws,
             size_t ws_bytes);

#endif
