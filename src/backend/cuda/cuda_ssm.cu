/* Kernels of recurrent (hybrid) models (see cuda_ssm.cuh and backend.h for what each computes).
 *
 * The scans run in their recurrent form, token by token, for prefill and decode alike: a warp owns one
 * row of a head's state (Mamba-2: S[h][p][:], gated delta: S[h][i][:]) in registers, its 32 lanes
 * striding over the row, and walks the sequence's tokens; a block holds 8 such rows. This keeps the
 * per-token work exact and simple; long prefills are bound by the sequential walk (a chunked form would
 * use the tensor cores). The convolution gives each thread one channel of one sequence, its window of
 * the last K-1 inputs in registers. Launches use programmatic dependent launch (cu_launch): each kernel
 * lets the next one launch at once and waits for the one before before it reads anything. */
#include <math.h>
#include "backend/cuda/cuda_ssm.cuh"
#include "backend/cuda/cuda_q4dev.cuh"
static __device__ __forceinline__ float softplusf(float x) { return x > 20.f ? x : log1pf(expf(x)); }

/* ---------------- element-wise ---------------- */
__global__ void k_rec_ew(int kind, float *y, const float *a, const float *b, size_t n) {
  pdl_trigger(); /* programmatic dependent launch: nothing is read before the wait */
  pdl_wait();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    if (kind == CU_REW_MUL) y[i] = a[i] * b[i];
    else if (kind == CU_REW_SIGMUL) y[i] *= 1.f / (1.f + expf(-a[i]));
    else { const float r = fmaxf(y[i], 0.f); y[i] = r * r; }
  }
}
void cu_rec_ew(const cu_ctx *cx, int kind, float *y, const float *a, const float *b, size_t n) {
  if (n) cu_launch(cx, k_rec_ew, dim3(cu_ew_blocks(n)), dim3(256), 0, kind, y, a, b, n);
}

/* ---------------- causal depthwise convolution: thread = (sequence, channel) ---------------- */
__global__ void k_conv1d(cu_rec_batch rb, float *out, const float *x, const float *w, const float *bias, float *st,
                         size_t sf, int C, int K, int act) {
  pdl_trigger(); /* programmatic dependent launch: nothing is read before the wait */
  pdl_wait();
  const int ch = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
  const int n = rb.count[s];
  if (ch >= C || n <= 0) return;
  const int t0 = rb.first[s], K1 = K - 1;
  float *S = st + (size_t)rb.slot[s] * sf;
  const bool fresh = rb.pos[t0] == 0;
  float hist[CU_CONV_MAX_K - 1], wr[CU_CONV_MAX_K];
#pragma unroll
  for (int j = 0; j < CU_CONV_MAX_K; j++) wr[j] = j < K ? w[(size_t)ch * K + j] : 0.f;
#pragma unroll
  for (int j = 0; j < CU_CONV_MAX_K - 1; j++) hist[j] = j < K1 && !fresh ? S[(size_t)j * C + ch] : 0.f;
  const float b = bias ? bias[ch] : 0.f;
  for (int t = t0; t < t0 + n; t++) {
    const float xv = x[(size_t)t * C + ch];
    float acc = b;
#pragma unroll
    for (int j = 0; j < CU_CONV_MAX_K - 1; j++)
      if (j < K1) acc = fmaf(wr[j], hist[j], acc);
    acc = fmaf(wr[K1], xv, acc);
#pragma unroll
    for (int j = 0; j < CU_CONV_MAX_K - 2; j++)
      if (j + 1 < K1) hist[j] = hist[j + 1];
    if (K1 > 0) {
#pragma unroll
      for (int j = 0; j < CU_CONV_MAX_K - 1; j++)
        if (j == K1 - 1) hist[j] = xv;
    }
    out[(size_t)t * C + ch] = act ? cu_silu(acc) : acc;
  }
#pragma unroll
  for (int j = 0; j < CU_CONV_MAX_K - 1; j++)
    if (j < K1) S[(size_t)j * C + ch] = hist[j];
}
void cu_conv1d(const cu_ctx *cx, const cu_rec_batch *rb, float *out, const float *x, const float *w, const float *bias,
               float *st, size_t sf, int C, int K, int act, int nseq) {
  if (C <= 0 || nseq <= 0) return;
  cu_launch(cx, k_conv1d, dim3((C + 255) / 256, nseq), dim3(256), 0, *rb, out, x, w, bias, st, sf, C, K, act);
}

/* ---------------- Mamba-2 selective scan: warp = (sequence, head, row p) ---------------- */
__global__ void k_ssm_scan(cu_rec_batch rb, float *y, const float *x, const float *B, const float *Cm, int ld,
                           const float *dt_in, const float *dt_bias, const float *A_log, const float *D, float *st,
                           size_t sf, int nh, int P, int G, int N, float dt_min, float dt_max) {
  pdl_trigger(); /* programmatic dependent launch: nothing is read before the wait */
  pdl_wait();
  const int lane = threadIdx.x, p = blockIdx.x * blockDim.y + threadIdx.y, h = blockIdx.y, s = blockIdx.z;
  const int n = rb.count[s];
  if (p >= P || n <= 0) return; /* whole warps */
  const int t0 = rb.first[s], g = h / (nh / G);
  float *S = st + (size_t)rb.slot[s] * sf + ((size_t)h * P + p) * N;
  const bool fresh = rb.pos[t0] == 0;
  float r[CU_SSM_MAX_PER_LANE];
#pragma unroll
  for (int j = 0; j < CU_SSM_MAX_PER_LANE; j++) {
    const int k = lane + 32 * j;
    r[j] = k < N && !fresh ? S[k] : 0.f;
  }
  const float A = -expf(A_log[h]), Dh = D[h], db = dt_bias[h];
  for (int t = t0; t < t0 + n; t++) {
    float dt = softplusf(dt_in[(size_t)t * nh + h] + db);
    dt = fminf(fmaxf(dt, dt_min), dt_max);
    const float dA = expf(A * dt), xv = x[(size_t)t * ld + (size_t)h * P + p], dx = dt * xv;
    const float *Bt = B + (size_t)t * ld + (size_t)g * N, *Ct = Cm + (size_t)t * ld + (size_t)g * N;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < CU_SSM_MAX_PER_LANE; j++) {
      const int k = lane + 32 * j;
      if (k < N) {
        r[j] = fmaf(dA, r[j], dx * Bt[k]);
        acc = fmaf(r[j], Ct[k], acc);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)t * nh * P + (size_t)h * P + p] = fmaf(Dh, xv, acc);
  }
#pragma unroll
  for (int j = 0; j < CU_SSM_MAX_PER_LANE; j++) {
    const int k = lane + 32 * j;
    if (k < N) S[k] = r[j];
  }
}
void cu_ssm_scan(const cu_ctx *cx, const cu_rec_batch *rb, float *y, const float *x, const float *B, const float *Cm, int ld,
                 const float *dt, const float *dt_bias, const float *A_log, const float *D, float *st, size_t sf, int nh,
                 int P, int G, int N, float dt_min, float dt_max, int nseq) {
  if (nseq <= 0) return;
  cu_launch(cx, k_ssm_scan, dim3((P + 7) / 8, nh, nseq), dim3(32, 8), 0, *rb, y, x, B, Cm, ld, dt, dt_bias, A_log, D, st,
            sf, nh, P, G, N, dt_min, dt_max);
}

/* ---------------- gated delta rule: warp = (sequence, value head, row i) ---------------- */
__global__ void k_gated_delta(cu_rec_batch rb, float *y, const float *q, const float *k, const float *v, int ld,
                              const float *a, const float *b, const float *A_log, const float *dt_bias, float *st,
                              size_t sf, int Hk, int Hv, int Dk, int Dv) {
  pdl_trigger(); /* programmatic dependent launch: nothing is read before the wait */
  pdl_wait();
  const int lane = threadIdx.x, i = blockIdx.x * blockDim.y + threadIdx.y, h = blockIdx.y, s = blockIdx.z;
  const int n = rb.count[s];
  if (i >= Dv || n <= 0) return; /* whole warps */
  const int t0 = rb.first[s], hk = h / (Hv / Hk);
  float *S = st + (size_t)rb.slot[s] * sf + ((size_t)h * Dv + i) * Dk;
  const bool fresh = rb.pos[t0] == 0;
  float r[CU_SSM_MAX_PER_LANE];
#pragma unroll
  for (int m = 0; m < CU_SSM_MAX_PER_LANE; m++) {
    const int j = lane + 32 * m;
    r[m] = j < Dk && !fresh ? S[j] : 0.f;
  }
  const float A = -expf(A_log[h]), db = dt_bias[h], qs = rsqrtf((float)Dk);
  for (int t = t0; t < t0 + n; t++) {
    const float *qt = q + (size_t)t * ld + (size_t)hk * Dk, *kt = k + (size_t)t * ld + (size_t)hk * Dk;
    float qv[CU_SSM_MAX_PER_LANE], kv[CU_SSM_MAX_PER_LANE], sq = 0.f, sk = 0.f;
#pragma unroll
    for (int m = 0; m < CU_SSM_MAX_PER_LANE; m++) {
      const int j = lane + 32 * m;
      qv[m] = j < Dk ? qt[j] : 0.f;
      kv[m] = j < Dk ? kt[j] : 0.f;
      sq = fmaf(qv[m], qv[m], sq);
      sk = fmaf(kv[m], kv[m], sk);
    }
    const float iq = rsqrtf(warp_sum(sq) + 1e-6f) * qs, ik = rsqrtf(warp_sum(sk) + 1e-6f);
    const float g = expf(A * softplusf(a[(size_t)t * Hv + h] + db));
    const float beta = 1.f / (1.f + expf(-b[(size_t)t * Hv + h]));
    float mem = 0.f;
#pragma unroll
    for (int m = 0; m < CU_SSM_MAX_PER_LANE; m++) {
      r[m] *= g;
      mem = fmaf(r[m], kv[m] * ik, mem);
    }
    const float d = beta * (v[(size_t)t * ld + (size_t)h * Dv + i] - warp_sum(mem));
    float o = 0.f;
#pragma unroll
    for (int m = 0; m < CU_SSM_MAX_PER_LANE; m++) {
      r[m] = fmaf(d, kv[m] * ik, r[m]);
      o = fmaf(r[m], qv[m] * iq, o);
    }
    o = warp_sum(o);
    if (lane == 0) y[(size_t)t * Hv * Dv + (size_t)h * Dv + i] = o;
  }
#pragma unroll
  for (int m = 0; m < CU_SSM_MAX_PER_LANE; m++) {
    const int j = lane + 32 * m;
    if (j < Dk) S[j] = r[m];
  }
}
void cu_gated_delta(const cu_ctx *cx, const cu_rec_batch *rb, float *y, const float *q, const float *k, const float *v,
                    int ld, const float *a, const float *b, const float *A_log, const float *dt_bias, float *st, size_t sf,
                    int Hk, int Hv, int Dk, int Dv, int nseq) {
  if (nseq <= 0) return;
  cu_launch(cx, k_gated_delta, dim3((Dv + 7) / 8, Hv, nseq), dim3(32, 8), 0, *rb, y, q, k, v, ld, a, b, A_log, dt_bias,
            st, sf, Hk, Hv, Dk, Dv);
}

/* ---------------- gated RMSNorm: block = (row, group) ----------------
 * xq (may be NULL; group % 32 == 0): also the int8 x of a 4-bit matvec of out (quant_x32), each warp
 * quantizing its 32 values */
__global__ void k_gated_rmsnorm(float *out, const float *x, const float *z, const float *w, int dim, int group, int wdim,
                                float eps, int norm_first, uint8_t *xq, float2 *xs) {
  pdl_trigger(); /* programmatic dependent launch: nothing is read before the wait */
  pdl_wait();
  const int per_row = dim / group, r = blockIdx.x / per_row, g0 = (blockIdx.x % per_row) * group;
  const float *xr = x + (size_t)r * dim + g0, *zr = z + (size_t)r * dim + g0;
  float *o = out + (size_t)r * dim + g0;
  float ss = 0.f;
  for (int j = threadIdx.x; j < group; j += blockDim.x) {
    const float v = norm_first ? xr[j] : xr[j] * cu_silu(zr[j]);
    ss = fmaf(v, v, ss);
  }
  __shared__ float red[32];
  const float inv = rsqrtf(block_sum(ss, red) / (float)group + eps);
  if (xq) {
    const int lane = threadIdx.x & 31;
    for (int base = threadIdx.x & ~31; base < group; base += blockDim.x) { /* whole warps */
      const int j = base + lane;
      const float wv = w[(g0 + j) % wdim];
      const float v = norm_first ? xr[j] * inv * wv * cu_silu(zr[j]) : xr[j] * cu_silu(zr[j]) * inv * wv;
      o[j] = v;
      quant_x32(v, lane, ((int64_t)r * dim + g0 + base) >> 5, xq, xs);
    }
    return;
  }
  for (int j = threadIdx.x; j < group; j += blockDim.x) {
    const float wv = w[(g0 + j) % wdim];
    o[j] = norm_first ? xr[j] * inv * wv * cu_silu(zr[j]) : xr[j] * cu_silu(zr[j]) * inv * wv;
  }
}
void cu_gated_rmsnorm(const cu_ctx *cx, float *out, const float *x, const float *z, const float *w, int n, int dim,
                      int group, int wdim, float eps, int norm_first, void *xqv) {
  if (n <= 0) return;
  const int threads = group >= 256 ? 256 : group >= 128 ? 128 : 64;
  uint8_t *xq = group % 32 ? NULL : (uint8_t *)xqv;
  float2 *xs = xq ? (float2 *)(xq + (size_t)n * (size_t)dim) : NULL;
  cu_launch(cx, k_gated_rmsnorm, dim3(n * (dim / group)), dim3(threads), 0, out, x, z, w, dim, group, wdim, eps, norm_first,
            xq, xs);
}
