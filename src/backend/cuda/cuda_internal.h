/* CUDA backend internals shared by the .cu files (C++ side only). */
#ifndef SM_CUDA_INTERNAL_H
#define SM_CUDA_INTERNAL_H
extern "C" {
#include "backend/backend.h"
}
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

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
static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* SMELT_CUDA_TRACE builds (diagnostic, -DSMELT_CUDA_TRACE): kernels stamp %globaltimer into a
 * device buffer (layout in cuda_backend.cu trace_dump); each .cu keeps its own pointer to it */
#ifdef SMELT_CUDA_TRACE
static __device__ __forceinline__ unsigned long long tr_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif
void cu_attn_set_trace(unsigned long long *buf);
void cu_mv_set_trace(unsigned long long *buf);
void cu_mv_init(int dev); /* per-device state of the matvec kernels (backend creation, on dev) */
extern int g_cu_pdl; /* launch with the programmatic-serialization attribute (SMELT_CUDA_PDL=0: off) */
/* The preferred shared-memory carveout of every kernel launched through cu_launch or decode
 * attention's launcher (g_cu_carve, percent of the largest; -1: the driver's choice per kernel),
 * set when a kernel is first launched under a new value. The backend sets 72 for models with
 * CW_Q4 weights (SMELT_CUDA_CARVE overrides): one value for all measured faster there than the
 * per-kernel defaults, a carveout on some kernels only slower (docs/benchmarks.md), presumably
 * because an SM changes its L1 / shared-memory split only when idle, so neighbouring kernels with
 * different splits do not overlap. bf16 models keep the defaults (faster for them). */
extern int g_cu_carve;
void cu_carve(const void *kern);
template <typename... KArgs, typename... Args>
static inline void cu_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                             Args... args) {
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg;
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = g_cu_pdl ? 1 : 0;
  cu_carve((const void *)kern);
  cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
}

/* Device copy of one weight (w->dev points at this). */
/* CW_Q4: 4-bit, natural MLX word order (16-byte vector v of a row = elements 32v..32v+31),
 * used by the int8-activation dp4a kernels (k_mvq4) for 1 <= n <= CU_Q4_MAX_N. */
enum { CW_DENSE = 0, CW_QFAST = 1, CW_QGEN = 2, CW_Q4 = 3 };
enum { SBK_BF16 = 0, SBK_F16 = 1, SBK_F32 = 2 };
typedef struct {
  int kind;            /* CW_* */
  int64_t rows, cols;
  int bits, gs;
  sm_dtype dtype;      /* dense element type, or scale/bias type */
  int sbk;             /* SBK_* */
  void *q;             /* dense data, or packed quantized words */
  void *sb;            /* [rows][cols/gs] (scale,bias) pairs: uint32 (2x16-bit) or float2 */
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

/* matvec launchers (cuda_mv.cu): y[n][rows] = x[n][cols] . W^T for cu_use_matvec(w, n);
 * xq: device scratch of cu_q4_scratch_bytes(n, cols) (used by CW_Q4 weights only) */
void cu_matvec(const cu_weight *w, const float *x, int n, float *y, void *xq, cudaStream_t s, int n_sm);
/* several weights with the same x (one launch); compatible: same kind/cols/bits/gs/dtype */
void cu_matvec_multi(const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n, void *xq,
                     cudaStream_t s, int n_sm);
/* y[n][rows] = (silu(g) * u)[n][cols] . W^T without materializing silu(g)*u; false when no
 * fused kernel applies (caller then runs silu_mul + matvec) */
bool cu_matvec_silu(const cu_weight *w, const float *g, const float *u, int n, float *y, void *xq, cudaStream_t s,
                    int n_sm);
/* matvec roles in a decode layer: select SMELT_CUDA_Q4ROLE overrides */
enum { CU_Q4_QKV, CU_Q4_O, CU_Q4_GU, CU_Q4_DN, CU_Q4_LM, CU_Q4_ROLES };
/* CW_Q4 launcher with explicit tiling (microbenchmark): for n = 1 rb = rows per thread (2/4/8) +
 * 10 * vectors per row per load round (1/2/4), e.g. 14; tl = log2 threads per row (5..7); 0 = automatic;
 * role: CU_Q4_* or -1 */
void cu_q4_matvec_cfg(const cu_weight *const *ws, float *const *ys, int nw, const float *x, const float *xu, int n,
                      void *xq, cudaStream_t s, int n_sm, int rb, int tl, int role = -1);
bool cu_matvec_compatible(const cu_weight *a, const cu_weight *b);
/* out[r] = rmsnorm(x[r] (+= a[r] when a)) * (w + off) for n rows of dim, one block a row; with xq
 * also the CW_Q4 int8 x (cu_q4_scratch_bytes(n, dim)) of out. false (nothing launched) when the
 * shape/alignment is not supported */
/* xsrc (may be NULL): x is set to xsrc (+ a) instead of x (+ a) */
bool cu_norm_q(float *out, float *x, const float *a, const float *w, int n, int dim, float eps, float off, void *xq,
               cudaStream_t s, const float *xsrc = NULL);
/* CW_Q4 matvec with x already quantized into xq (by cu_norm_q). With glu_cnt (ws = {gate, up},
 * cu_q4_glu_ok): also writes silu(gate)*up quantized into hq (cu_q4_scratch_bytes(n, rows));
 * glu_cnt: rows/32 ints, zero (left zero) */
/* role: CU_Q4_* (selects a SMELT_CUDA_Q4ROLE override), -1 none */
/* norm (one token, cu_q4_guq_norm_ok): the gate/up input is rmsnorm(x + a) * (w + off), computed
 * by the gate/up kernel itself (xq unused); hout (may be NULL) receives x + a (x is not written) */
struct cu_gu_norm {
  const float *x, *a, *w;
  float off, eps;
  float *hout;
};
void cu_q4_matvec_preq(const cu_weight *const *ws, float *const *ys, int nw, int n, const void *xq, cudaStream_t s,
                       int *glu_cnt = NULL, void *hq = NULL, int role = -1, const cu_gu_norm *norm = NULL);
bool cu_q4_glu_ok(const cu_weight *gate, const cu_weight *up, int n);
/* true when that is one kernel for one token (k_gu_q4, SMELT_CUDA_GUQ; the default for large
 * gate weights) rather than k_mvq4 with chunk counters (SMELT_CUDA_GLU=1) */
bool cu_q4_guq_ok(const cu_weight *gate, const cu_weight *up, int n);
bool cu_q4_guq_norm_ok(const cu_weight *gate, const cu_weight *up, int n); /* and with a cu_gu_norm */
/* one-token MLP in one persistent kernel (k_mlp1, SMELT_CUDA_MLP=1): gate/up of x (quantized in
 * xq), h = silu(gate) * up quantized into hq (cu_q4_scratch_bytes(1, gate rows)), y = down(h);
 * gy/uy receive gate and up. With norm (SMELT_CUDA_MLP=2 in the decode graph) x is rmsnorm(x + a)
 * computed by the kernel itself as cu_norm_q would (xq unused; hout receives x + a).
 * false (nothing launched) when off or no variant fits the shapes. Its grid barrier needs every
 * block resident at once and takes its counters from a per-device pool: one stream of such
 * launches per device at a time (cu_mlp_claim; two concurrent ones could wait for each other) */
/* qkv (with norm; SMELT_CUDA_MLP=3 in the decode graph): also the residual add + rmsnorm after
 * down and the next layer's q/k/v: xres receives x = (x + a) + y, y3[i] = w[i] . quant(rmsnorm(x) *
 * (nw + off)); the weights like gate's (kind, scales, group size, cols), rows % 64 == 0 */
struct cu_mlp_qkv {
  const cu_weight *w[3];
  float *y[3];
  float *xres;
  const float *nw;
  float off, eps;
};
/* dnorm (with norm, without qkv; SMELT_CUDA_DNORM, default on where cu_q4_mlp_dnorm_ok): the residual
 * add and the next rmsnorm after down, deferred: xres receives x = (x + a) + y, xq (cu_q4_scratch_bytes(1,
 * K)) the int8 x of x * (w + off) NOT divided by its rms, ssp[0 .. K / 32) partial sums of x^2; a
 * k_mvq4 launch of that xq after cu_q4_set_dnorm(ssp, K / 32, eps, K) applies 1 / rms to its outputs
 * (cu_q4_dnorm_ok: the matvecs run on k_mvq4) */
struct cu_mlp_dnorm {
  float *xres;
  const float *w;
  float off;
  void *xq;
  float *ssp;
};
bool cu_q4_mlp_dnorm_ok(const cu_weight *g, const cu_weight *u, const cu_weight *d);
void cu_q4_set_dnorm(const float *ssp, int nss, float eps, int dim); /* for the next k_mvq4 launch (n = 1) */
bool cu_q4_dnorm_ok(const cu_weight *const *ws, int nw, int role);
/* Buffers: x, a, hout, y, gy, uy, xres and the y3 are distinct (xres may be x), 16-byte aligned.
 * cu_mlp_claim: whether stream s may launch k_mlp1 on the current device (the first stream that
 * asks, until cu_mlp_release(s)) */
bool cu_mlp_claim(cudaStream_t s);
void cu_mlp_release(cudaStream_t s);
bool cu_q4_mlp_ok(const cu_weight *gate, const cu_weight *up, const cu_weight *down, int n);
bool cu_q4_mlp_qkv_ok(const cu_weight *gate, const cu_weight *const *qkv);
bool cu_q4_mlp(const cu_weight *gate, const cu_weight *up, const cu_weight *down, float *gy, float *uy, float *y,
               const void *xq, void *hq, cudaStream_t s, const cu_gu_norm *norm = NULL, const cu_mlp_qkv *qkv = NULL,
               const cu_mlp_dnorm *dn = NULL);
/* dequantize/convert rows [r0, r0+nr) of w to bf16 [nr][cols] (or to f16 when to_f16) */
void cu_dequant_rows(const cu_weight *w, int64_t r0, int64_t nr, void *out, bool to_f16, cudaStream_t s);
/* one row (token) of an embedding, dequantized to float */
void cu_embed(const cu_weight *w, const int32_t *tokens, int n_tokens, float *out, cudaStream_t s);

/* decode attention (cuda_attn.cu): every token alone in its sequence; grid (token, kv head, S).
 * part: nt*n_heads*S*(hd+2) floats when S > 1; cnt: nt*nkv ints, zero (left zero) */
bool cu_attn_dec_ok(int hd, int G);
int cu_attn_dec_splits(int n_tokens, int nkv, int n_sm);
size_t cu_attn_dec_smem(int hd, int G, int S, int nw); /* nw: warps a block (cu_attn_dec_warps) */
int cu_attn_dec_warps(int hd, int G);
/* or'ed into cu_attn_decode's S: combine the splits through global memory, not a cluster
 * (chosen for long contexts, where it measured faster) */
#define CU_ATTN_GLOBAL_COMBINE (1 << 16)
/* xq (may be NULL; hd % 32 == 0): also write the CW_Q4 int8 layout of out (cu_q4_scratch_bytes).
 * kraw != NULL: rope + kv_store fused in: q, kraw, vraw are the projections before rotation
 * (rotated with invq/halfq, invk/halfk as k_rope_qk_store does) and the new k, v are written to
 * K, V here */
/* regions (device pointers, 16-byte aligned) the next cu_attn_decode launch prefetches into L2
 * after its blocks have read K and V */
void cu_attn_set_prefetch(const void *a, size_t an, const void *b, size_t bn);
extern int g_cu_attn_diag, g_cu_attn_sta;
void cu_attn_decode(float *out, void *xq, float *part, int *cnt, const float *q, const float *kraw, const float *vraw,
                    const float *invq, const float *invk, int halfq, int halfk, float *K, float *V,
                    const int32_t *pos, const int32_t *seq, const int32_t *table, int max_blocks, int bs, int nblocks,
                    int n_tokens, int n_heads, int nkv, int hd, float scale, int window, float softcap, int S,
                    cudaStream_t s);

/* sample op (cuda_sample.cu): out_tokens[i] = sm_sample_row(req[i], row req[i].row of the device
 * logits [n_rows][vocab]) (backend.h), bit-exact with the host; issued on s after the work
 * already queued there, then waits for s. With dev_dst (device memory, n_req ints) the tokens
 * are written there instead and it returns without waiting. Scratch is kept per device (dev). */
smelt_status cu_sample(const float *logits, int n_rows, int vocab, const sm_sample_req *req, int n_req,
                       int32_t *out_tokens, cudaStream_t s, int dev, int32_t *dev_dst = NULL);
/* The greedy token of one logits row (as cu_sample for a greedy request without penalties) in one
 * launch, so that a decode graph can hold it: written to dev_dst[0] and, when not NULL, host_dst[0]
 * (mapped pinned memory). Scratch owned by the caller, fixed while a graph refers to it: pv / pi of
 * CU_ARGMAX_SCRATCH floats / ints, cnt one unsigned zeroed once (left zero). */
#define CU_ARGMAX_SCRATCH 128
void cu_argmax1(const float *logits, int V, float *pv, int *pi, unsigned *cnt, int32_t *dev_dst, int32_t *host_dst,
                cudaStream_t s);

#endif
