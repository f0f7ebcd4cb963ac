/* The CUDA backend's mixture-of-experts ops (backend.h: moe_route, matmul_experts, moe_combine,
 * swiglu_clamp, sigmoid_gate_rows, attention_sinks) and the row kernel of gathered matvecs (cuda_moe.cu). */
#ifndef SM_CUDA_MOE_CUH
#define SM_CUDA_MOE_CUH
#include "backend/cuda/cuda_be.cuh"

/* sets the ops of b (a cuda_be) */
void cu_moe_install(sm_backend *b);
/* runs one recorded op of the types OP_MOE_ROUTE .. OP_ATTN_SINKS */
void cu_moe_exec(cuda_be *c, const cu_op *o);
/* y[s][0..rows) = W_e . x_s for slots s < n_slots with e = ids[s] (ids NULL: e = 0), x_s = x[per_slot ? s : s / k]
 * (+ bias[e][..]): one warp a row, any weight layout. With ids NULL, per_slot 1 and k 1 it is a plain matvec
 * of n_slots columns (CW_MXQ weights of decode batches). */
void cu_rows_matvec(const cu_ctx *cx, const cu_weight *w, int64_t rows, const int32_t *ids, int k, const float *x,
                    bool per_slot, const float *bias, float *y, int n_slots);

#endif
