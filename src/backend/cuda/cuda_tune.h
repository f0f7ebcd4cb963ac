/* The CUDA backend's tuning values: one struct per backend instance, read once when the backend is
 * created from the table in cuda_tune.cu (tuning.h). The defaults are the measured winners on the
 * H100 (docs/cuda.md); some depend on the device's compute capability. */
#ifndef SM_CUDA_TUNE_H
#define SM_CUDA_TUNE_H
#include "backend/tuning.h"

typedef struct {
  /* user-facing (docs/cuda.md) */
  int graphs;  /* SMELT_CUDA_GRAPHS: replay small steps as CUDA graphs */
  int fuse;    /* SMELT_CUDA_FUSE: 0 runs every op as its own kernel */
  int profile; /* SMELT_CUDA_PROFILE: time every op (graphs off), table at exit */
  int stats;   /* SMELT_CUDA_STATS: 1 step times, graph and fusion counts at exit; 2 also the decode timeline */
  /* tuning */
  int pdl;       /* programmatic dependent launch */
  int q4;        /* 4-bit weights on the int8 kernels: 0 never, 1 >= 1 Mi elements, 2 all */
  int carve;     /* shared-memory carveout of all kernels of models with CW_Q4 weights (-1: driver's) */
  int wef;       /* weight streams read L2 evict-first: 1/2 k_mlp1 weights/scales, 4/8 k_mvq4's, 16/32 k_mvr's */
  int attn_kvef; /* decode attention reads K/V rows L2 evict-first */
  int pf_kb;     /* decode attention prefetches this many KB of the gate weight into L2 */
  int pf_min_kb; /* ... for gate weights of at least this many KB */
  int attn_s;    /* decode attention splits (0: automatic) */
  int attn_long; /* from this many positions on, decode attention combines its splits in global memory */
  int attn_cl;   /* largest thread-block cluster for the split combine (0: global memory) */
  int attn_stg;  /* K/V batches a warp stages in shared memory before its wait (0-2) */
  int attn_trig; /* where decode attention lets the next kernel launch: 0 start, 1 first K/V loads, 2 after the loop */
  int attn_b;    /* one-split decode attention (many sequences) on k_attn_decb where it applies */
  int attn_dq;   /* decode over a quantized KV cache on k_attn_decq; 0: the tiled kernel */
  int attn_fa;   /* prefill attention on tensor cores (f16 operands, cuda_attn_flash.cu); 0: the f32 CUDA-core kernel */
  int mvr;       /* roles (bit mask of CU_Q4_*) that use k_mvr for one token; -1: automatic */
  int mvr_kmax;  /* ... automatic: q/k/v, o and gate/up projections of at most this many inputs */
  int q4cfg;     /* k_mvq4 tiling for one token (rows a thread + 10 * vectors a round; 0: automatic) */
  int q4long;    /* ... the automatic tiling for K > 8192 */
  int q4warps;   /* ... fewest warps for the one-vector-a-round tiling */
  int q4hint;    /* k_mvq4 weight load L2 hint */
  int qmma;      /* most tokens of a step whose 4-bit matmuls run on the tensor-core kernel (cuda_qmma.cu) */
  int qwg;       /* the tensor-core kernel on sm_90a: wgmma (1, cuda_qwg.cu) or mma.sync (0) */
  int pre_x16;   /* batched matmuls' half x written once where it is made (cuda_fuse.cu) */
  int walk_bps;  /* blocks an SM of the sampling walk's row passes (cuda_sample.cu) */
  int qmma_bm;   /* weight rows a block of the tensor-core kernel (128, 256; 0 automatic) */
  int moe_qmma;  /* the sorted experts of an eager matmul_experts (4-bit) in one tensor-core launch */
  int moe_grp;   /* (token, expert) slots above which an eager matmul_experts sorts them by expert (grouped GEMMs) */
  int comm_ar;   /* tensor parallelism: small all-reduces through the peers' memory (cuda_comm.cu); 0: NCCL only */
  /* developer builds only (change results) */
  int qmma_split;  /* k slices of the tensor-core kernel (1-8; 0 automatic) */
  int attn_diag;   /* decode attention parts left out (bit mask) */
  int trace_l;     /* SMELT_CUDA_TRACE builds: the layer launch traced */
  int poison;      /* 1: new device buffers filled with 0xff bytes (NaN) */
  int attn_hsplit; /* 1: decode attention with 5 to 8 query heads a KV head as two blocks */
  int attn_w256;   /* decode attention warps a block for head dims of 129 to 256 (4 or 8) */
} cu_tune;

/* the table (for docs tests and `describe`), and reading it for a device of compute capability arch
 * (major * 10 + minor) */
const sm_tune_entry *cu_tune_table(size_t *n);
smelt_status cu_tune_read(int arch, cu_tune *out);
/* the defaults without the environment (tests) */
void cu_tune_defaults(int arch, cu_tune *out);

#endif
