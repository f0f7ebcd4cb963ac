/* k_attn_dec2's dynamic shared memory (cuda_attn.cu): the base layout (q, the warps' accumulators or the
 * split weights, their max / sum, the new position's k / v, the merge weights), then RSC's receive
 * buffers, then the staged K/V batches; offsets for the kernel, sizes for the launcher. */
#ifndef SM_CUDA_ATTN_DEC2_SMEM_CUH
#define SM_CUDA_ATTN_DEC2_SMEM_CUH
#include "backend/cuda/cuda_common.cuh"

/* byte offset of RSC's receive buffers in the dynamic shared memory (after the base layout) */
static __host__ __device__ __forceinline__ size_t at_rsc_off(int hd, int G, int S, int nw) {
  const size_t acc = (size_t)nw * G * hd, wz = (size_t)G * S;
  const size_t f = (size_t)G * hd + (acc > wz ? acc : wz) + (size_t)2 * nw * G + 2 * (size_t)hd + (size_t)nw * G + 2 * (size_t)G;
  return (f * sizeof(float) + 15) & ~(size_t)15;
}
/* RSC's receive buffers: bytes */
static __host__ __device__ __forceinline__ size_t at_rsc_bytes(int S, int nw) {
  return (16 + (size_t)S * nw * 35 * sizeof(float) + 15) & ~(size_t)15;
}
/* staged K/V (SMELT_CUDA_ATTN_STG): after the RSC buffers (when used); [NW][nstg * B][2][hd] floats */
static __host__ __device__ __forceinline__ size_t at_stg_off(int hd, int G, int S, int nw, bool rsc) {
  return at_rsc_off(hd, G, S, nw) + (rsc ? at_rsc_bytes(S, nw) : 0);
}
static __host__ __device__ __forceinline__ size_t at_stg_bytes(int hd, int nw, int nstg, int B) {
  return (size_t)nw * nstg * B * 2 * hd * sizeof(float);
}

static size_t at_base_smem(int hd, int G, int S, int nw) {
  size_t acc = (size_t)nw * G * hd, wz = (size_t)G * S;
  return sizeof(float) * ((size_t)G * hd + (acc > wz ? acc : wz) + (size_t)2 * nw * G + 2 * (size_t)hd +
                          (size_t)nw * G + 2 * (size_t)G);
}
/* RSC applies: 8 warps, the cluster combine of S (clamped) splits, every 32-output chunk owned by a block */
static bool at_rsc(int hd, int G, int S, int nw, bool cl) {
  return cl && S > 1 && S <= 16 && nw == 8 && hd % 32 == 0 && hd <= 128 && G <= 4 && G * (hd / 32) <= S;
}
/* the staging applies to the 8-warp kernel with whole-warp positions (64 < hd <= 128) */
static int at_nstg(const cu_tune *t, int hd, int nw) { return nw == 8 && hd > 64 && hd <= 128 ? t->attn_stg : 0; }
static size_t at_smem(const cu_tune *t, int hd, int G, int S, int nw, bool rsc) {
  const int ns = at_nstg(t, hd, nw);
  return ns ? at_stg_off(hd, G, S, nw, rsc) + at_stg_bytes(hd, nw, ns, 4)
            : at_base_smem(hd, G, S, nw) + (rsc ? at_rsc_bytes(S, nw) : 0);
}

#endif
