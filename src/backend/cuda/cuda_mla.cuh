/* The CUDA backend's multi-head latent attention (backend.h attention_mla; cuda_mla.cu). */
#ifndef SM_CUDA_MLA_CUH
#define SM_CUDA_MLA_CUH
#include "backend/cuda/cuda_be.cuh"

/* sets the op of b (a cuda_be) */
void cu_mla_install(sm_backend *b);
/* runs one recorded OP_ATTN_MLA */
void cu_mla_exec(cuda_be *c, const cu_op *o);

#endif
