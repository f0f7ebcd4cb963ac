/* Batched products of 4-bit weights on tensor cores (cuda_qmma.cu). */
#ifndef SM_CUDA_QMMA_CUH
#define SM_CUDA_QMMA_CUH
#include "backend/cuda/cuda_common.cuh"

/* whether cu_qmma takes n tokens of w (CW_Q4, cols a multiple of 128, n <= tuning qmma, sm_80+) */
bool cu_qmma_ok(const cu_ctx *cx, const cu_weight *w, int n);
/* y[n][rows] = x[n][cols] . W^T; x16: cu_qmma_x16_bytes of scratch; x 16-byte aligned; ws: workspace
 * of split-k partial sums (ws_bytes limits the split) */
void cu_qmma(const cu_ctx *cx, const cu_weight *w, const float *x, int n, float *y, void *x16, void *ws,
             size_t ws_bytes);
/* the same for up to 3 weights of one x (same cols, group size and scale type: cu_qmma_group_ok) in
 * one launch: one conversion of x, one kernel, one sum of the split-k slices. With xu (16-byte
 * aligned, like x): x is act(x) * xu (act 1 silu, 2 gelu_tanh), computed in the conversion. With
 * x_ready, x16 already holds x in the wgmma kernel's layout for cu_qwg_bn(n) (made by the kernel
 * before: cu_norm_q's x16), and x is not read */
bool cu_qmma_group_ok(const cu_ctx *cx, const cu_weight *const *ws, int nw, int n);
void cu_qmma_multi(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x, int n,
                   void *x16, void *wsb, size_t ws_bytes, const float *xu = NULL, int act = 0, bool x_ready = false);
/* Mixture-of-experts GEMMs in one launch: whether cu_qmma_experts takes a stack of CW_Q4 experts */
bool cu_qmma_experts_ok(const cu_ctx *cx, const cu_weight *w);
/* yg[i][rows] = xg[i][cols] . W_e^T for the n_in rows of xg, sorted by expert: expert e's rows are off[e] ..
 * off[e + 1] - 1 (off: E + 1 host ints). tiles_h / tiles_d: host and device room for n_in + E tiles
 * (cu_qmma_experts_tiles); x16: cu_qmma_x16_bytes(n_in, cols) */
void cu_qmma_experts(const cu_ctx *cx, const cu_weight *w, int64_t rows, const float *xg, int n_in, const int *off,
                     int E, float *yg, void *x16, int4 *tiles_h, int4 *tiles_d);
static inline size_t cu_qmma_experts_tiles(int n_in, int64_t E) { return (size_t)n_in + (size_t)E; }
/* bytes of the x16 scratch cu_qmma / cu_qmma_multi need for n tokens of cols inputs (tokens padded to
 * the largest tile, 128) */
static inline size_t cu_qmma_x16_bytes(int n, int64_t cols) { return (size_t)((n + 127) / 128 * 128) * (size_t)cols * 2; }

/* the mma.sync kernel's instance for mxfp4 weights (CW_MXQ, grouped experts only; cu_weight.sbk values
 * are 0-2) */
#define SBK_MX 3
#define QM_MX_KMAX 4096 /* the longest rows of mxfp4 experts it takes (their scale codes in shared memory) */
/* Shared by the two kernels (cuda_qmma.cu: mma.sync, sm_80+; cuda_qwg.cu: wgmma, sm_90a) */
#define QM_BK 128 /* values of a row a stage */
/* one launch for up to QM_MAXW weights of the same x (q/k/v, gate/up): blocks b0[i] .. b0[i + 1] - 1
 * (along x) take weight i, whose split-k partial sums go to ws[i] */
#define QM_MAXW 3
struct qm_args {
  const uint32_t *wq[QM_MAXW];
  const void *sb[QM_MAXW];
  float *y[QM_MAXW], *ws[QM_MAXW];
  int M[QM_MAXW], b0[QM_MAXW], nw;
  int K, gs, n, per;
  const __half *xp;
  /* grouped experts (cu_qmma_experts): block row y takes tile tiles[y] = (expert, first row of x and y,
   * rows, -): the expert's weight of M rows in the stack at wq[0] / sb[0]; ntiles of them */
  const int4 *tiles;
  int ntiles;
};
/* the wgmma kernel (cuda_qwg.cu): whether it runs here (an sm_90 device, a build with sm_90a code, the
 * tuning value qwg); its x conversion (xu, act as cu_qmma_multi's) into x16; BM (128 or 256 weight rows
 * a block) and BN (32, 64 or 128 tokens) of a launch; with S 0, its blocks an SM, else its launch of S
 * k slices of a.per stages (the partial sums then go to a.ws for k_qmma_reduce) */
bool cu_qwg_ok(const cu_ctx *cx);
static inline int cu_qwg_bn(int n) { return n <= 32 ? 32 : n <= 64 ? 64 : 128; }
void cu_qwg_prep(const cu_ctx *cx, const float *x, const float *xu, int act, int n, int64_t K, int BN, void *x16);
int cu_qwg_launch(const cu_ctx *cx, int sbk, const qm_args &a, int blocks, int BN, int BM, int S);

#endif
