/* The one-token MLP of 4-bit models in one persistent kernel (cuda_mlp.cu). */
#ifndef SM_CUDA_MLP_CUH
#define SM_CUDA_MLP_CUH
#include "backend/cuda/cuda_common.cuh"

/* the MLP's input is rmsnorm(x + a) * (w + off), computed by the kernel itself as cu_norm_q would
 * (bitwise); hout receives x + a (x is not written). pw (not NULL): a is a sandwich norm's input,
 * normed first, a * (pw + poff) / rms(a) with peps, as cu_norm_pre_q would */
struct cu_mlp_norm {
  const float *x, *a, *w;
  float off, eps;
  float *hout;
  const float *pw;
  float poff, peps;
};
/* the residual add and the next rmsnorm after down, deferred (with a cu_mlp_norm): xres receives
 * x = hout + y, xq (cu_q4_scratch_bytes(1, K)) the int8 x of x * (w + off) NOT divided by its rms,
 * ssp[0 .. K / 32) partial sums of x^2; the next k_mvq4 launch applies 1 / rms (cu_q4_dnorm) */
struct cu_mlp_dnorm {
  float *xres;
  const float *w;
  float off;
  void *xq;
  float *ssp;
};

void cu_mlp_init(int dev); /* per-device state (backend creation, on dev) */
void cu_mlp_set_trace(unsigned long long *buf);
/* whether cu_mlp runs for these weights (n = 1, sm_90, the shapes of cuda_mlp.cu) */
bool cu_mlp_ok(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, const cu_weight *d, int n);
bool cu_mlp_dnorm_ok(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, const cu_weight *d);
/* whether a cu_mlp_norm with pw (the sandwich norm before) runs for these weights (K <= 3072) */
bool cu_mlp_pre_ok(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, const cu_weight *d);
/* gate/up of x (quantized in xq, or from norm), h = silu(gate) * up (gelu: gelu_tanh(gate) * up) quantized into hq
 * (cu_q4_scratch_bytes(1, gate rows)), y = down(h); gy / uy receive gate and up. false (nothing
 * launched) when no variant fits. Its grid barrier needs every block resident at once: one stream
 * of such launches per device (cu_mlp_claim; two concurrent ones could wait for each other).
 * Buffers x, a, hout, y, gy, uy, xres distinct (xres may be x), 16-byte aligned. */
bool cu_mlp(const cu_ctx *cx, const cu_weight *g, const cu_weight *u, const cu_weight *d, float *gy, float *uy,
            float *y, const void *xq, void *hq, const cu_mlp_norm *norm = NULL, const cu_mlp_dnorm *dn = NULL,
            bool gelu = false);
/* whether the stream of cx may launch k_mlp1 on its device (the first stream that asks, until
 * cu_mlp_release) */
bool cu_mlp_claim(const cu_ctx *cx);
void cu_mlp_release(cudaStream_t s);

#endif
