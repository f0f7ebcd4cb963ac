/* What every CUDA source of the backend shares (C++ side only): the launch context (stream,
 * tuning values, counters), launches with programmatic dependent launch, the device copy of a
 * weight and its layouts. Kernels and launchers of one concern each live in their own file with a
 * private header (cuda_ew.cuh, cuda_mv.cuh, cuda_q4.cuh, cuda_mlp.cuh, cuda_attn.cuh, ...). */
#ifndef SM_CUDA_COMMON_CUH
#define SM_CUDA_COMMON_CUH
extern "C" {
#include "backend/backend.h"
}
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "backend/cuda/cuda_tune.h"

/* Programmatic dependent launch (Hopper): kernels launched with cu_launch() may start while the
 * previous kernel of the stream is still running. Such a kernel may only read constant data
 * (weights) before pdl_wait(), which returns once the previous kernel has completed and its
 * writes are visible; every read of activations and every write comes after it. pdl_trigger()
 * lets the next kernel launch early (once every block of this one has called it or exited).
 * Both are no-ops when the kernel was launched without the attribute (or below sm_90).
 * Such kernels must not read data that other kernels write through the read-only path
 * (__ldg, or a const __restrict__ pointer the compiler turns into ld.global.nc): that data may
 * change while the kernel is already running; use __ldca / __ldcg. */
static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* the sum of v over the warp's 32 lanes, in every lane */
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/* the sum of v over the block (blockDim.x a multiple of 32, at most 1024): each warp's sum into red[warp],
 * warp 0 adds them into red[0]; every thread returns it. red: 32 floats of shared memory, free again once
 * every thread has read the result */
static __device__ __forceinline__ float block_sum(float v, float *red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    t = warp_sum(t);
    if (threadIdx.x == 0) red[0] = t;
  }
  __syncthreads();
  return red[0];
}
/* the activations of the gated MLPs, one definition for every kernel that applies them: silu,
 * gelu with the tanh approximation, and gpt-oss's clamped SwiGLU (backend.h swiglu_clamp) */
static __device__ __forceinline__ float cu_silu(float x) { return x / (1.f + expf(-x)); }
static __device__ __forceinline__ float cu_gelu_tanh(float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  return 0.5f * x * (1.f + tanhf(k0 * (x + k1 * x * x * x)));
}
static __device__ __forceinline__ float cu_swiglu_clamp(float g, float u, float alpha, float limit) {
  const float gv = fminf(g, limit), uv = fminf(fmaxf(u, -limit), limit);
  return gv / (1.f + expf(-alpha * gv)) * (uv + 1.f);
}
static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* SMELT_CUDA_TRACE builds (a developer's compile-time diagnostic, -DSMELT_CUDA_TRACE): kernels stamp
 * %globaltimer into a device buffer (layout in cuda_prof.cu); each .cu keeps its own pointer to it */
#ifdef SMELT_CUDA_TRACE
static __device__ __forceinline__ unsigned long long tr_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif
void cu_attn_set_trace(unsigned long long *buf);
void cu_q4_set_trace(unsigned long long *buf);

/* kernels whose launches the backend counts (cu_counters.launch) */
enum {
  CU_K_MVQ4, CU_K_MVR, CU_K_GUQ4, CU_K_MLP1, CU_K_MLP1_DNORM, CU_K_ATTN_DEC, CU_K_ATTN_DECB, CU_K_ARGMAX, CU_K_QWG_PREP,
  CU_K_COUNT
};
typedef struct {
  long launch[CU_K_COUNT];
} cu_counters;

/* What a launcher needs besides its operands: the stream, this backend's tuning values, the
 * shared-memory carveout its kernels get (-1: the driver's choice), the device and counters. */
typedef struct {
  cudaStream_t s;
  const cu_tune *t;
  int carve;
  int dev, n_sm, arch; /* arch: compute capability, major * 10 + minor */
  cu_counters *cnt;      /* may be NULL */
} cu_ctx;
static inline void cu_count(const cu_ctx *x, int k) {
  if (x->cnt) x->cnt->launch[k]++;
}

/* The preferred shared-memory carveout of a kernel (percent of the largest; -1: the driver's choice
 * per kernel), set when the kernel is first launched under a new value. The backend uses one value
 * for all kernels of models with CW_Q4 weights (tuning SMELT_CUDA_CARVE): one value for all measured
 * faster there than the per-kernel defaults, a carveout on some kernels only slower (docs/cuda.md),
 * presumably because an SM changes its L1 / shared-memory split only when idle, so that neighbouring
 * kernels with different splits do not overlap. bf16 models keep the defaults (faster for them). */
void cu_carve(const void *kern, int val);
/* a launch with programmatic dependent launch (when on) and, with cluster_z > 1, thread-block clusters of
 * cluster_z blocks along z (decode attention's splits, sm_90) */
template <typename... KArgs, typename... Args>
static inline void cu_launch_cl(const cu_ctx *x, void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                int cluster_z, Args... args) {
  cudaLaunchAttribute at[2];
  int na = 0;
  if (cluster_z > 1) {
    at[na].id = cudaLaunchAttributeClusterDimension;
    at[na].val.clusterDim.x = 1;
    at[na].val.clusterDim.y = 1;
    at[na].val.clusterDim.z = (unsigned)cluster_z;
    na++;
  }
  if (x->t->pdl) {
    at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[na].val.programmaticStreamSerializationAllowed = 1;
    na++;
  }
  cudaLaunchConfig_t cfg;
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = x->s;
  cfg.attrs = at;
  cfg.numAttrs = na;
  cu_carve((const void *)kern, x->carve);
  cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
}
template <typename... KArgs, typename... Args>
static inline void cu_launch(const cu_ctx *x, void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             Args... args) {
  cu_launch_cl(x, kern, grid, block, smem, 0, args...);
}
/* elementwise grids: 256 threads a block, at most 8192 blocks (grid-stride loops) */
static inline unsigned cu_ew_blocks(size_t n) {
  size_t b = (n + 255) / 256;
  if (b > 8192) b = 8192;
  return b ? (unsigned)b : 1;
}

/* Device copy of one weight (w->dev points at this). */
/* CW_Q4: 4-bit, natural MLX word order (16-byte vector v of a row = elements 32v..32v+31),
 * used by the int8-activation dp4a kernels (k_mvq4) for 1 <= n <= CU_Q4_MAX_N. */
/* CW_MXQ: an MLX microscaling mode (qmode; cuda_mxq.cuh), the checkpoint's bytes as they are. */
enum { CW_DENSE = 0, CW_QFAST = 1, CW_QGEN = 2, CW_Q4 = 3, CW_MXQ = 4 };
enum { SBK_BF16 = 0, SBK_F16 = 1, SBK_F32 = 2 };
typedef struct {
  int kind;            /* CW_* */
  int64_t rows, cols;
  int bits, gs;
  sm_dtype dtype;      /* dense element type, or scale/bias type */
  int sbk;             /* SBK_* */
  int qmode;           /* CW_MXQ: the sm_qmode */
  void *q;             /* dense data, or packed quantized words */
  void *sb;            /* [rows][cols/gs] (scale,bias) pairs: uint32 (2x16-bit) or float2; CW_MXQ: uint8 codes */
  int mx_f16;          /* CW_MXQ mxfp4: every scale code is 89 to 128 (its scale times 2^14 an exact f16) */
} cu_weight;

/* Quantized "fast" layout (bits 2/4/8): each row is W = cols*bits/32 32-bit words (a word
 * holds E = 32/bits whole elements). Full chunks of 128 words are permuted so that lane l
 * of a warp loads one 16-byte vector holding natural words {l, l+32, l+64, l+96}:
 * natural word u = c*128 + j*32 + l is stored at c*128 + l*4 + j. The tail (W % 128 words)
 * keeps natural order. */
__host__ __device__ static inline int64_t cu_qfast_store_index(int64_t u, int64_t W) {
  int64_t C = W / 128;
  if (u >= C * 128) return u;
  int64_t c = u / 128, r = u % 128;
  return c * 128 + (r % 32) * 4 + r / 32;
}

#define CU_MAX_N 8
#define CU_Q4_MAX_N 16 /* above: dequant + cuBLAS measured faster (bench/cuda/mvbench.cu) */
/* true when matvec kernels (not dequant + cuBLAS) handle n columns of w */
static inline bool cu_use_matvec(const cu_weight *w, int n) {
  return n <= CU_MAX_N || (w->kind == CW_Q4 && n <= CU_Q4_MAX_N);
}
/* bytes of scratch (xq argument below) the CW_Q4 kernels need for n columns of K values:
 * x quantized to int8 per 32 values (K bytes a column) + (scale, exact sum) per 32 */
static inline size_t cu_q4_scratch_bytes(int n, int64_t K) { return (size_t)n * (size_t)K + (size_t)n * (size_t)(K / 32) * 8; }

/* The matvec role classes the one-token 4-bit kernels are tuned by (from sm_mm_role) */
enum { CU_Q4_QKV, CU_Q4_O, CU_Q4_GU, CU_Q4_DN, CU_Q4_LM, CU_Q4_ROLES };
static inline int cu_q4_role(sm_mm_role r) {
  switch (r) {
  case SM_MM_Q: case SM_MM_K: case SM_MM_V: return CU_Q4_QKV;
  case SM_MM_REC_IN: case SM_MM_ATTN_GATE: return CU_Q4_QKV; /* projections of the layer input, like q/k/v */
  case SM_MM_O: case SM_MM_REC_OUT: return CU_Q4_O;
  case SM_MM_GATE: case SM_MM_UP: return CU_Q4_GU;
  case SM_MM_DOWN: return CU_Q4_DN;
  case SM_MM_LM_HEAD: return CU_Q4_LM;
  default: return -1;
  }
}

#endif
