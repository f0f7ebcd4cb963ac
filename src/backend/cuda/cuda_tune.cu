/* The CUDA backend's tuning table (cuda_tune.h). */
#include <stddef.h>
#include <string.h>
#include "backend/cuda/cuda_tune.h"

#define F(field) offsetof(cu_tune, field)
static const sm_tune_entry k_table[] = {
  { "SMELT_CUDA_GRAPHS", F(graphs), 1, 0, 1, SM_TUNE_USER, "0: run every step eagerly, without CUDA graphs", {}, NULL },
  { "SMELT_CUDA_FUSE", F(fuse), 1, 0, 1, SM_TUNE_USER, "0: run every op as its own kernel (no fused kernels)", {}, NULL },
  { "SMELT_CUDA_PROFILE", F(profile), 0, 0, 1, SM_TUNE_USER,
    "1: time every op on the GPU (graphs off) and print a table on stderr at exit", {}, NULL },
  { "SMELT_CUDA_STATS", F(stats), 0, 0, 2, SM_TUNE_USER,
    "1: GPU and host time per step, graph and fusion counts on stderr at exit; 2: also the timeline of "
    "pipelined decode steps", {}, NULL },
  { "SMELT_CUDA_PDL", F(pdl), 1, 0, 1, 0, "programmatic dependent launch of decode kernels", {}, NULL },
  { "SMELT_CUDA_Q4", F(q4), 1, 0, 2, 0, "4-bit weights on the int8 kernels: 0 never, 1 >= 1 Mi elements, 2 all", {}, NULL },
  { "SMELT_CUDA_CARVE", F(carve), -1, -1, 100, 0,
    "shared-memory carveout (percent) of every kernel of models with int8-kernel weights; -1 the driver's",
    { { 90, 72 } }, NULL },
  { "SMELT_CUDA_WEF", F(wef), 63, 0, 63, 0,
    "weight streams read L2 evict-first (bits: 1/2 k_mlp1 weights/scales, 4/8 k_mvq4's, 16/32 k_mvr's)", {}, NULL },
  { "SMELT_CUDA_ATTN_KVEF", F(attn_kvef), 1, 0, 1, 0, "decode attention reads K/V rows L2 evict-first", {}, NULL },
  { "SMELT_CUDA_PF", F(pf_kb), 8192, 0, 1 << 20, 0,
    "KB of the next gate weight decode attention prefetches into L2 (at most half of it)", {}, NULL },
  { "SMELT_CUDA_PF_MIN", F(pf_min_kb), 32768, 0, 1 << 24, 0, "smallest gate weight (KB) that prefetch is used for", {}, NULL },
  { "SMELT_CUDA_ATTN_S", F(attn_s), 0, 0, 64, 0, "decode attention splits a (token, kv head); 0 automatic", {}, NULL },
  { "SMELT_CUDA_ATTN_LONG", F(attn_long), 2048, 0, 1 << 30, 0,
    "from this many positions on decode attention combines its splits through global memory (0: never)", {}, NULL },
  { "SMELT_CUDA_ATTN_CL", F(attn_cl), 0, 0, 16, 0,
    "largest thread-block cluster for the decode split combine (0, 2, 4, 8, 16; 0: global memory)", { { 90, 16 } }, NULL },
  { "SMELT_CUDA_ATTN_STG", F(attn_stg), 1, 0, 2, 0, "K/V batches a decode attention warp stages before its wait", {}, NULL },
  { "SMELT_CUDA_ATTN_TRIG", F(attn_trig), 2, 0, 2, 0,
    "where decode attention lets the next kernel launch: 0 start, 1 first K/V loads, 2 after its loop", {}, NULL },
  { "SMELT_CUDA_ATTN_HSPLIT", F(attn_hsplit), 1, 0, 1, 0,
    "decode attention with 5 to 8 query heads a KV head: two blocks of at most 4 (1) or one block (0)", {}, NULL },
  { "SMELT_CUDA_ATTN_W256", F(attn_w256), 8, 4, 8, 0,
    "decode attention warps a block for head dims of 129 to 256 (Gemma, Qwen3.5, Qwen3-Next): 4 or 8", {}, NULL },
  { "SMELT_CUDA_ATTN_FA", F(attn_fa), 1, 0, 1, 0,
    "prefill attention on tensor cores with f16 operands (sm_80+); 0: the f32 CUDA-core kernel", {}, NULL },
  { "SMELT_CUDA_ATTN_B", F(attn_b), 1, 0, 1, 0,
    "decode attention without splits (many sequences) on k_attn_decb (cuda_attn_decb.cu: a 16-bit cache, "
    "head dim 32 or 64, at most 8 query heads a KV head); 0: k_attn_dec2", {}, NULL },
  { "SMELT_CUDA_ATTN_DQ", F(attn_dq), 1, 0, 1, 0,
    "decode over a q8_0 / q4_0 KV cache on its own kernel (cuda_attn_decq.cu); 0: the tiled kernel", {}, NULL },
  { "SMELT_CUDA_MVR", F(mvr), -1, -1, 31, 0,
    "roles using k_mvr for one token (bits: 1 q/k/v, 2 o, 4 gate/up, 8 down, 16 lm_head); -1 automatic", {}, NULL },
  { "SMELT_CUDA_MVR_KMAX", F(mvr_kmax), 3072, 0, 16384, 0,
    "automatic k_mvr roles: q/k/v, o and gate/up projections of at most this many inputs take it", {}, NULL },
  { "SMELT_CUDA_Q4CFG", F(q4cfg), 0, 0, 44, 0,
    "k_mvq4 tiling for one token: rows a thread (1/2/4/8) + 10 * vectors a round (1/2/4); 0 automatic", {}, NULL },
  { "SMELT_CUDA_Q4LONG", F(q4long), 12, 11, 44, 0, "the automatic k_mvq4 tiling for K > 8192 (as SMELT_CUDA_Q4CFG)", {}, NULL },
  { "SMELT_CUDA_Q4WARPS", F(q4warps), 4000, 1, 1 << 20, 0, "fewest warps of the one-vector-a-round k_mvq4 tiling", {}, NULL },
  { "SMELT_CUDA_Q4HINT", F(q4hint), 1, 0, 4, 0,
    "k_mvq4 weight loads: 0 plain, 1 L2 128-byte, 2 256-byte prefetch, 3 evict-first, 4 both", {}, NULL },
  { "SMELT_CUDA_QMMA", F(qmma), 128, 0, 1 << 20, 0,
    "most tokens a step whose 4-bit matmuls use the tensor-core kernel (more: dequantize + cuBLAS; 0 never); "
    "512 on sm_90, where it is the wgmma one", { { 100, 128 }, { 90, 512 } }, NULL },
  { "SMELT_CUDA_QWG", F(qwg), 1, 0, 1, 0,
    "4-bit matmuls of 17-128 tokens on Hopper's wgmma kernel (cuda_qwg.cu, sm_90a builds); 0: the mma.sync one", {}, NULL },
  { "SMELT_CUDA_PRE_X16", F(pre_x16), 1, 0, 1, 0,
    "the half-precision x of batched matmuls is written once where it is made: the kernel before a 4-bit matmul "
    "on the wgmma kernel writes its f16 x (the rmsnorm before q/k/v, gate/up or the head, decode attention "
    "before o); matmuls that cuBLAS runs with a half x (bf16 weights, 4-bit past SMELT_CUDA_QMMA) share one "
    "conversion of it (q/k/v, gate/up) and the MLP's activation is computed into the down projection's x (the "
    "same bits); 0: each matmul converts its own x", {}, NULL },
  { "SMELT_CUDA_WALK_BPS", F(walk_bps), 16, 1, 32, 0,
    "blocks an SM that the sample op's passes over sampled rows (max, weights) take, spread over the rows", {}, NULL },
  { "SMELT_CUDA_QMMA_BM", F(qmma_bm), 0, 0, 256, 0,
    "weight rows a block of the tensor-core 4-bit kernel: 128, 256, or 0 (256 from 4096 rows or 128 tokens)", {}, NULL },
  { "SMELT_CUDA_MOE_QMMA", F(moe_qmma), 1, 0, 1, 0,
    "an eager expert matmul of 4-bit experts runs all its experts in one tensor-core launch (0: a GEMM each)", {}, NULL },
  { "SMELT_CUDA_MOE_GROUPED", F(moe_grp), 64, 0, 1 << 30, 0,
    "(token, expert) slots above which an eager expert matmul sorts them by expert into grouped GEMMs", {}, NULL },
  { "SMELT_CUDA_COMM_AR", F(comm_ar), 1, 0, 1, 0,
    "tensor parallelism: all-reduces of up to 512 KB as one kernel reading the peers' memory (1); 0: NCCL only", {}, NULL },
  { "SMELT_CUDA_QMMA_SPLIT", F(qmma_split), 0, 0, 8, SM_TUNE_DEV,
    "k slices of the tensor-core 4-bit kernel (1-8; 0: the fewest rounds of blocks an SM)", {}, NULL },
  { "SMELT_CUDA_ATTN_DIAG", F(attn_diag), 0, 0, 31, SM_TUNE_DEV,
    "decode attention parts left out (1 position loop, 2 partial exchange, 4 q load, 8 half K/V, 16 K/V)", {}, NULL },
  { "SMELT_CUDA_TRACE_L", F(trace_l), 325, 0, 1 << 30, SM_TUNE_DEV,
    "SMELT_CUDA_TRACE builds: the attention / MLP launch whose timeline is recorded", {}, NULL },
  { "SMELT_CUDA_POISON", F(poison), 0, 0, 1, 0,
    "1: new activation, scratch and cache buffers are filled with 0xff bytes (NaN), so a read of memory no "
    "kernel wrote shows", {}, NULL },
};
#undef F

const sm_tune_entry *cu_tune_table(size_t *n) {
  *n = sizeof k_table / sizeof k_table[0];
  return k_table;
}

static bool valid_tiling(int v) {
  return v == 0 || v == 11 || v == 21 || v == 41 || v == 12 || v == 22 || v == 42 || v == 14 || v == 24 ||
         v == 44 || v == 18 || v == 28;
}

smelt_status cu_tune_read(int arch, cu_tune *out) {
  memset(out, 0, sizeof *out);
  smelt_status st = sm_tune_read(k_table, sizeof k_table / sizeof k_table[0], arch, out);
  if (st) return st;
  if (out->attn_cl & (out->attn_cl - 1) || out->attn_cl == 1)
    return sm_err(SMELT_ERR_INVALID, "SMELT_CUDA_ATTN_CL=%d: expected 0, 2, 4, 8 or 16", out->attn_cl);
  if (!valid_tiling(out->q4cfg) || !valid_tiling(out->q4long) || !out->q4long)
    return sm_err(SMELT_ERR_INVALID, "SMELT_CUDA_Q4CFG / Q4LONG: expected 11, 21, 41, 12, 22, 42, 14, 24, 44, 18 or 28");
  if (out->attn_w256 != 4 && out->attn_w256 != 8)
    return sm_err(SMELT_ERR_INVALID, "SMELT_CUDA_ATTN_W256=%d: expected 4 or 8", out->attn_w256);
  if (arch < 90) out->attn_cl = 0; /* clusters: sm_90 */
  if (out->qmma_bm && out->qmma_bm != 128 && out->qmma_bm != 256)
    return sm_err(SMELT_ERR_INVALID, "SMELT_CUDA_QMMA_BM=%d: expected 0, 128 or 256", out->qmma_bm);
  return SMELT_OK;
}

void cu_tune_defaults(int arch, cu_tune *out) {
  memset(out, 0, sizeof *out);
  for (size_t i = 0; i < sizeof k_table / sizeof k_table[0]; i++) {
    const int v = sm_tune_default(&k_table[i], arch);
    memcpy((char *)out + k_table[i].offset, &v, sizeof v);
  }
}
