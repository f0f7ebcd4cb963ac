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
/* the same for up to 3 weights of one x (same cols, group size and scale type: cu_qmma_group_ok) in
 * one launch: one conversion of x, one kernel, one sum of the split-k slices. With xu (16-byte
 * aligned, like x): x is act(x) * xu (act 1 silu, 2 gelu_tanh), computed in the conversion */
bool cu_qmma_group_ok(const cu_ctx *cx, const cu_weight *const *ws, int nw, int n);
void cu_qmma_multi(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n,
                   void *x16, void *wsb, size_t ws_bytes, const float *xu = NULL, int act = 0);

#endif
