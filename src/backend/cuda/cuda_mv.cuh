/* Matrix-vector products with float activations (cuda_mv.cu): decode batches of n <= CU_MAX_N
 * columns (n <= CU_Q4_MAX_N for CW_Q4 weights, which go to cuda_q4.cu). */
#ifndef SM_CUDA_MV_CUH
#define SM_CUDA_MV_CUH
#include "backend/cuda/cuda_ldst.cuh"

/* the argument block for up to 3 weights sharing x, rpb rows a block; *blocks: the grid */
mv_args cu_mv_args(const cu_weight *const *ws, float *const *ys, int nw, int rpb, unsigned *blocks,
                   const float *const *bias = NULL);
/* ys[i][n][rows] = x[n][cols] . ws[i]^T, one launch for nw <= 3 compatible weights (same kind, cols,
 * bits, group size, scale type). xq: scratch of cu_q4_scratch_bytes(n, cols) for CW_Q4 weights.
 * role: CU_Q4_* (tuning of the one-token 4-bit kernels) or -1. bias (may be NULL, else nw pointers, each NULL
 * or rows floats): added to every column's outputs */
void cu_matvec_multi(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n,
                     void *xq, int role, const float *const *bias = NULL);
bool cu_matvec_compatible(const cu_weight *a, const cu_weight *b);
/* y[n][rows] = (silu(g) * u)[n][cols] . W^T (gelu: gelu_tanh(g) * u, CW_Q4 only) without materializing
 * the product; false when no kernel applies (the caller then runs silu_mul / gelu_mul and a matvec) */
bool cu_matvec_silu(const cu_ctx *cx, const cu_weight *w, const float *g, const float *u, int n, float *y, void *xq,
                    bool gelu = false);

#endif
