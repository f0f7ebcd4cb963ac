/* Matrix-vector products of 4-bit CW_Q4 weights with int8 activations (cuda_q4.cu). The int8
 * layout of x (cu_q4_scratch_bytes(n, K) bytes): per 32 values, the int8s in the order the weight
 * nibbles unpack to, then per 32 values (scale, exact sum) as float2. */
#ifndef SM_CUDA_Q4_CUH
#define SM_CUDA_Q4_CUH
#include "backend/cuda/cuda_common.cuh"

/* x was quantized without dividing by its rms (k_mlp1's deferred norm): ssp[0 .. nss) hold partial
 * sums of x^2 and every output is scaled by 1 / sqrt(sum / dim + eps) */
struct cu_q4_dnorm {
  const float *ssp;
  int nss;
  float eps;
  int dim;
};

/* ys[i] = ws[i] . x for n <= CU_Q4_MAX_N columns: x (or silu(x) * xu when xu != NULL, gelu_tanh(x) * xu
 * with gelu) is quantized
 * into xq first (k_quant_x), then k_mvq4 runs with the tiling rb (rows a thread + 10 * vectors a
 * round) and tl (log2 threads a row), 0 = automatic. role: CU_Q4_* or -1. bias: as cu_matvec_multi's */
void cu_q4_matvec(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, const float *x,
                  const float *xu, int n, void *xq, int role, int rb = 0, int tl = 0, bool gelu = false,
                  const float *const *bias = NULL);
/* the same with x already quantized in xq by the kernel before; dn (may be NULL, n = 1, k_mvq4 or k_mvr:
 * cu_q4_dnorm_ok) applies a deferred rmsnorm */
void cu_q4_matvec_preq(const cu_ctx *cx, const cu_weight *const *ws, float *const *ys, int nw, int n, const void *xq,
                       int role, const cu_q4_dnorm *dn = NULL, const float *const *bias = NULL);
bool cu_q4_dnorm_ok(const cu_ctx *cx, const cu_weight *const *ws, int nw, int role);
/* whether cu_q4_matvec_preq takes k_mvr (one token) for these weights and role */
bool cu_q4_mvr_ok(const cu_ctx *cx, const cu_weight *const *ws, int nw, int role);
/* gate and up of one token with h = silu(gate) * up quantized into hq (cu_q4_scratch_bytes(1, rows)) for
 * the down projection, in one kernel (k_gu_q4): where cu_q4_guq_ok (large gate weights that k_mvr does
 * not take) */
bool cu_q4_guq_ok(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, int n);
void cu_q4_guq(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, float *gy, float *uy, const void *xq, void *hq);
/* out[r] = rmsnorm(x[r] (+= a[r] when a)) * (w + off) for n rows of dim, one block a row; with xq also
 * the int8 layout of out; out may be NULL (only xq written); xsrc (may be NULL): x is set to xsrc (+ a)
 * instead of x (+ a). false (nothing launched) when the shape or alignment is not supported. With x16
 * and bn > 0 (cu_norm_x16_ok(dim)): out also as the f16 x of the wgmma kernel for tiles of bn tokens
 * (cu_qwg_bn), which cu_qmma_multi then takes as made (x_ready); with bn CU_X16_F16 / CU_X16_BF16: out
 * also as plain [n][dim] f16 / bf16 rows, the x that cu_gemm_prep would make of it (the same bits) */
#define CU_X16_F16 (-1)
#define CU_X16_BF16 (-2)
bool cu_norm_q(const cu_ctx *cx, float *out, float *x, const float *a, const float *w, int n, int dim, float eps,
               float off, void *xq, const float *xsrc = NULL, void *x16 = NULL, int bn = 0);
bool cu_norm_x16_ok(int dim);
/* the same with a first normalized itself, a * rms(a)^-1 * (pw + poff) with its own eps, before the add
 * (a sandwich norm's output norm and the residual add in one launch; a, pw not NULL) */
bool cu_norm_pre_q(const cu_ctx *cx, float *out, float *x, const float *a, const float *pw, float poff, float peps,
                   const float *w, int n, int dim, float eps, float off, void *xq, const float *xsrc,
                   void *x16 = NULL, int bn = 0);
/* two rmsnorms of the same dim, eps and offset in one launch (out_i = rmsnorm(x_i) * (w_i + off), n_i rows;
 * the q and k head norms) */
bool cu_norm_pair(const cu_ctx *cx, float *out1, float *x1, const float *w1, int n1, float *out2, float *x2,
                  const float *w2, int n2, int dim, float eps, float off);

#endif
