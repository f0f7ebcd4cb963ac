/* One-token decode kernels at Llama-3.1-8B shapes, against the default kernels (no CPU model):
 *  - k_gu_q4 (gate/up + silu(gate)*up quantized in one kernel, SMELT_CUDA_GUQ 1/2/4): gate and
 *    up against k_mvq4 (summation order only), the int8 h against silu(gate)*up of those; with the
 *    add + rmsnorm folded in, bitwise against k_norm_q followed by the same kernel; the same checks
 *    for k_mvr<GLU> (gate/up with the weights in registers, SMELT_CUDA_MVR);
 *  - k_mvt (bulk-copy matvec, SMELT_CUDA_MVT, static and counter-claimed groups) against k_mvq4
 *    for the q/k/v, o and down shapes (several groups a warp: the stage refills run);
 *  - k_mvr (weights held in registers, SMELT_CUDA_MVR) against k_mvq4 for the q/k/v, o and down
 *    shapes of both models, every tiling, partial blocks;
 *  - k_mlp1 (gate/up + silu quantization + down in one persistent kernel, SMELT_CUDA_MLP) against
 *    the separate kernels at both models' shapes, three launches in a row, with its grid barriers
 *    split around the weight prefetch (the default) and as one blocks_sync (SMELT_CUDA_MLP_BAR=0).
 * Exits 77 (ctest SKIP) without a usable sm_90 GPU. */
#include "backend/cuda/cuda_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern int g_cu_guq, g_cu_guq_norm, g_cu_mvt, g_cu_mvt_dyn, g_cu_mvt_kb, g_cu_mvr, g_cu_mvr_nw, g_cu_mvr_rt, g_cu_mvr_count;
static int fails, checks, g_major;
#define CHECK(c, ...) do { checks++; if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)(rng >> 16); }
static float frnd() { return (float)(rnd() & 0xffffff) / 16777216.f; }
static uint16_t bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }

static uint16_t f16(float f) { const __half h = __float2half_rn(f); uint16_t u; memcpy(&u, &h, 2); return u; }
/* random 4-bit weight; gs = group size, half = f16 scales/biases (else bf16) */
static cu_weight make_w(int64_t rows, int64_t cols, int gs = 64, bool half = false) {
  cu_weight w;
  memset(&w, 0, sizeof w);
  w.kind = CW_Q4; w.rows = rows; w.cols = cols; w.bits = 4; w.gs = gs;
  w.dtype = half ? SM_DT_F16 : SM_DT_BF16; w.sbk = half ? SBK_F16 : SBK_BF16;
  std::vector<uint32_t> q((size_t)(rows * cols / 8)), sb((size_t)(rows * cols / gs));
  for (auto &v : q) v = rnd() ^ (rnd() << 16);
  for (auto &v : sb) {
    const float sc = 0.004f + 0.016f * frnd(), bi = -0.12f * frnd();
    v = half ? (uint32_t)f16(sc) | ((uint32_t)f16(bi) << 16) : (uint32_t)bf16(sc) | ((uint32_t)bf16(bi) << 16);
  }
  CK(cudaMalloc(&w.q, q.size() * 4));
  CK(cudaMalloc(&w.sb, sb.size() * 4));
  CK(cudaMemcpy(w.q, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w.sb, sb.data(), sb.size() * 4, cudaMemcpyHostToDevice));
  return w;
}
static std::vector<float> get(const float *d, size_t n) {
  std::vector<float> h(n);
  CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
  return h;
}
/* max |a-b| / max |b| */
static double rel_max(const std::vector<float> &a, const std::vector<float> &b) {
  double m = 0, e = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (!isfinite(a[i])) return INFINITY; /* an output left unwritten (the 0xff fill is NaN) */
    m = fmax(m, fabs(b[i]));
    e = fmax(e, fabs((double)a[i] - b[i]));
  }
  return m > 0 ? e / m : e;
}
/* x (K floats) quantized into the CW_Q4 int8 layout (by a matvec call that quantizes it) */
static void quantize_x(const cu_weight *w, const float *dx, void *xq, float *dy, cudaStream_t s) {
  cu_q4_matvec_cfg(&w, &dy, 1, dx, NULL, 1, xq, s, 132, 0, 0);
}

extern int g_cu_mvr, g_cu_mvr_rt, g_cu_mvr_count, g_cu_mvr_glu;
static void test_guq(int64_t M, int64_t K, cudaStream_t s) {
  cu_weight g = make_w(M, K), u = make_w(M, K);
  std::vector<float> x((size_t)K);
  for (auto &v : x) v = 2.f * frnd() - 1.f;
  float *dx, *gy, *uy, *ry[2];
  void *xq, *hq;
  int *cnt;
  CK(cudaMalloc(&dx, K * 4));
  CK(cudaMalloc(&gy, M * 4)); CK(cudaMalloc(&uy, M * 4));
  CK(cudaMalloc(&ry[0], M * 4)); CK(cudaMalloc(&ry[1], M * 4));
  CK(cudaMalloc(&xq, cu_q4_scratch_bytes(1, K)));
  CK(cudaMalloc(&hq, cu_q4_scratch_bytes(1, M)));
  CK(cudaMalloc(&cnt, (M / 32 + 1) * sizeof(int)));
  CK(cudaMemset(cnt, 0, (M / 32 + 1) * sizeof(int)));
  CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
  quantize_x(&g, dx, xq, ry[0], s);
  const cu_weight *ws[2] = { &g, &u };
  g_cu_guq = 0; /* reference: k_mvq4, gate and up */
  g_cu_mvr = 0;
  cu_q4_matvec_preq(ws, ry, 2, 1, xq, s, NULL, NULL, CU_Q4_GU);
  CK(cudaStreamSynchronize(s));
  std::vector<float> rg = get(ry[0], M), ru = get(ry[1], M);
  /* k_gu_q4 (UNR 1, 2, 4), then k_mvr<GLU> (one block: both tilings; a cluster pair) where the
   * shape has one */
  const bool mvr_shape = K == 4096 || K == 2048;
  for (int cfg : { 1, 2, 4, 10, 11, 12 }) {
    if ((cfg >= 10 && !mvr_shape) || (cfg == 12 && g_major < 9)) continue;
    const int unr = cfg < 10 ? cfg : 1;
    g_cu_guq = cfg < 10 ? unr : 0;
    g_cu_mvr = cfg < 10 ? 0 : 1 << CU_Q4_GU;
    g_cu_mvr_glu = cfg == 12 ? 2 : cfg >= 10; /* 12: the cluster pair (sm_90; the test needs it) */
    g_cu_mvr_rt = cfg == 11 ? (K == 4096 ? 2 : 4) : 0;
    CHECK(cu_q4_guq_ok(&g, &u, 1), "guq_ok %lldx%lld", (long long)M, (long long)K);
    float *ys[2] = { gy, uy };
    CK(cudaMemset(hq, 0xff, cu_q4_scratch_bytes(1, M)));
    CK(cudaMemset(gy, 0xff, M * 4));
    CK(cudaMemset(uy, 0xff, M * 4));
    const int c0 = g_cu_mvr_count;
    cu_q4_matvec_preq(ws, ys, 2, 1, xq, s, cnt, hq, CU_Q4_GU);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    CHECK(g_cu_mvr_count == c0 + (cfg >= 10), "cfg %d: k_mvr<GLU> launches %d", cfg, g_cu_mvr_count - c0);
    std::vector<float> yg = get(gy, M), yu = get(uy, M);
    const double eg = rel_max(yg, rg), eu = rel_max(yu, ru);
    CHECK(eg < 1e-5 && eu < 1e-5, "gu cfg %d %lldx%lld gate/up vs k_mvq4: %g %g", cfg, (long long)M, (long long)K, eg, eu);
    /* h: int8 q per 32 values (layout of k_quant_x) with (d, exact sum) */
    std::vector<int8_t> hqi((size_t)M);
    std::vector<float> hs((size_t)(M / 32) * 2);
    CK(cudaMemcpy(hqi.data(), hq, M, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hs.data(), (char *)hq + M, hs.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0, worst_sum = 0;
    for (int64_t b = 0; b < M / 32; b++) {
      double am = 0, sum = 0;
      float h[32];
      for (int i = 0; i < 32; i++) {
        const float gg = rg[b * 32 + i], uu = ru[b * 32 + i];
        h[i] = gg / (1.f + expf(-gg)) * uu;
        am = fmax(am, fabs(h[i]));
        sum += h[i];
      }
      const float d = hs[2 * b];
      worst_sum = fmax(worst_sum, fabs(hs[2 * b + 1] - sum) / (am * 32 + 1e-30));
      CHECK(fabs(d - am / 127.0) <= 1e-4 * am / 127.0 + 1e-30, "gu cfg %d chunk %lld scale %g vs %g", cfg, (long long)b, d, am / 127.0);
      for (int i = 0; i < 32; i++) { /* value i of the chunk: word 2(i/8) + (i&1), byte (i%8)/2 */
        const int e = i & 7, jj = i >> 3;
        const int qv = hqi[b * 32 + (2 * jj + (e & 1)) * 4 + (e >> 1)];
        worst = fmax(worst, fabs(qv * (double)d - h[i]) / (d + 1e-30));
      }
    }
    /* |q d - h| <= d/2 plus the difference of gate/up (summation order) */
    CHECK(worst <= 0.51, "gu cfg %d %lldx%lld: int8 h off by %g steps", cfg, (long long)M, (long long)K, worst);
    CHECK(worst_sum < 1e-4, "gu cfg %d chunk sums off by %g", cfg, worst_sum);
  }
  g_cu_mvr = 0; g_cu_mvr_rt = 0; g_cu_mvr_glu = 0;
  /* the automatic choice: k_mvr without the epilogue for gate weights of >= 32 Mi elements, k_mvq4
   * below that; neither is the fused gate/up kernel (silu(gate)*up is quantized separately) */
  {
    g_cu_mvr = -1;
    g_cu_guq = -1;
    const bool big = M * K >= ((int64_t)32 << 20);
    CHECK(!cu_q4_guq_ok(&g, &u, 1), "default gate/up choice %lldx%lld: fused", (long long)M, (long long)K);
    float *ys[2] = { gy, uy };
    CK(cudaMemset(gy, 0xff, M * 4)); CK(cudaMemset(uy, 0xff, M * 4));
    const int c0 = g_cu_mvr_count;
    cu_q4_matvec_preq(ws, ys, 2, 1, xq, s, NULL, NULL, CU_Q4_GU);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    CHECK(g_cu_mvr_count == c0 + (big && (K == 4096 || K == 2048 || K == 1024)), "default gate/up k_mvr launches %d",
          g_cu_mvr_count - c0);
    const double eg = rel_max(get(gy, M), rg), eu = rel_max(get(uy, M), ru);
    CHECK(eg < 1e-5 && eu < 1e-5, "default gate/up %lldx%lld vs k_mvq4: %g %g", (long long)M, (long long)K, eg, eu);
    g_cu_mvr = 0;
  }
  /* the add + rmsnorm inside it (cu_gu_norm) against k_norm_q + the same kernel: bitwise equal */
  if (K <= 4096) {
    std::vector<float> xr((size_t)K), ad((size_t)K), nw((size_t)K);
    for (int64_t i = 0; i < K; i++) { xr[i] = 2.f * frnd() - 1.f; ad[i] = frnd() - 0.5f; nw[i] = 0.5f + frnd(); }
    float *rx, *ra, *rw, *hout, *rx2;
    CK(cudaMalloc(&rx, K * 4)); CK(cudaMalloc(&ra, K * 4)); CK(cudaMalloc(&rw, K * 4));
    CK(cudaMalloc(&hout, K * 4)); CK(cudaMalloc(&rx2, K * 4));
    CK(cudaMemcpy(rx, xr.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(rx2, xr.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ra, ad.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(rw, nw.data(), K * 4, cudaMemcpyHostToDevice));
    g_cu_guq_norm = 1;
    for (int unr : { 1, 2, 4 }) {
      g_cu_guq = unr;
      CHECK(cu_q4_guq_norm_ok(&g, &u, 1), "guq_norm_ok %lldx%lld", (long long)M, (long long)K);
      /* reference: k_norm_q (x += a in a copy of x) then the plain kernel */
      CK(cudaMemcpy(rx2, xr.data(), K * 4, cudaMemcpyHostToDevice));
      CHECK(cu_norm_q(NULL, rx2, ra, rw, 1, (int)K, 1e-5f, 0.f, xq, s), "cu_norm_q");
      float *ys[2] = { ry[0], ry[1] };
      cu_q4_matvec_preq(ws, ys, 2, 1, xq, s, cnt, hq, CU_Q4_GU);
      CK(cudaStreamSynchronize(s));
      std::vector<float> g0 = get(ry[0], M), u0 = get(ry[1], M), h0 = get(rx2, K);
      std::vector<uint8_t> q0(cu_q4_scratch_bytes(1, M));
      CK(cudaMemcpy(q0.data(), hq, q0.size(), cudaMemcpyDeviceToHost));
      cu_gu_norm nm = { rx, ra, rw, 0.f, 1e-5f, hout };
      float *ys2[2] = { gy, uy };
      CK(cudaMemset(hq, 0xff, cu_q4_scratch_bytes(1, M)));
      cu_q4_matvec_preq(ws, ys2, 2, 1, xq, s, cnt, hq, CU_Q4_GU, &nm);
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      std::vector<float> g1 = get(gy, M), u1 = get(uy, M), h1 = get(hout, K), x1 = get(rx, K);
      std::vector<uint8_t> q1(q0.size());
      CK(cudaMemcpy(q1.data(), hq, q1.size(), cudaMemcpyDeviceToHost));
      CHECK(memcmp(g0.data(), g1.data(), M * 4) == 0 && memcmp(u0.data(), u1.data(), M * 4) == 0,
            "gu_q4<%d> with the norm %lldx%lld: gate/up differ from k_norm_q + gu_q4 (%g)", unr, (long long)M,
            (long long)K, rel_max(g1, g0));
      CHECK(memcmp(q0.data(), q1.data(), q0.size()) == 0, "gu_q4<%d> with the norm: quantized h differs", unr);
      CHECK(memcmp(h0.data(), h1.data(), K * 4) == 0, "gu_q4<%d> with the norm: x + a differs", unr);
      CHECK(memcmp(x1.data(), xr.data(), K * 4) == 0, "gu_q4<%d> with the norm wrote x", unr);
    }
    g_cu_guq_norm = 0;
    cudaFree(rx); cudaFree(ra); cudaFree(rw); cudaFree(hout); cudaFree(rx2);
  }
  g_cu_guq = -1;
  g_cu_mvr = -1;
  cudaFree(dx); cudaFree(gy); cudaFree(uy); cudaFree(ry[0]); cudaFree(ry[1]); cudaFree(xq); cudaFree(hq); cudaFree(cnt);
  cudaFree(g.q); cudaFree(g.sb); cudaFree(u.q); cudaFree(u.sb);
}

/* nw weights of rows[i] x K sharing x */
static void test_mvt(const int64_t *rows, int nw, int64_t K, int role, cudaStream_t s) {
  cu_weight w[3];
  const cu_weight *ws[3];
  float *y[3], *r[3];
  for (int i = 0; i < nw; i++) {
    w[i] = make_w(rows[i], K);
    ws[i] = &w[i];
    CK(cudaMalloc(&y[i], rows[i] * 4));
    CK(cudaMalloc(&r[i], rows[i] * 4));
  }
  std::vector<float> x((size_t)K);
  for (auto &v : x) v = 2.f * frnd() - 1.f;
  float *dx;
  void *xq;
  CK(cudaMalloc(&dx, K * 4));
  CK(cudaMalloc(&xq, cu_q4_scratch_bytes(1, K)));
  CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
  quantize_x(&w[0], dx, xq, r[0], s);
  g_cu_mvt = 0;
  g_cu_mvr = 0;
  cu_q4_matvec_preq(ws, r, nw, 1, xq, s, NULL, NULL, role);
  CK(cudaStreamSynchronize(s));
  for (int mode = 0; mode < 3; mode++) { /* static, static with a small budget, claimed */
    g_cu_mvt = 63;
    g_cu_mvt_dyn = mode == 2;
    g_cu_mvt_kb = mode == 1 ? 24 : 96;
    for (int rep = 0; rep < 2; rep++) { /* the claimed mode again: its counters were reset */
      for (int i = 0; i < nw; i++) CK(cudaMemset(y[i], 0xff, rows[i] * 4));
      cu_q4_matvec_preq(ws, y, nw, 1, xq, s, NULL, NULL, role);
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      for (int i = 0; i < nw; i++) {
        const double e = rel_max(get(y[i], rows[i]), get(r[i], rows[i]));
        CHECK(e < 1e-5, "mvt mode %d weight %d %lldx%lld: %g vs k_mvq4", mode, i, (long long)rows[i], (long long)K, e);
      }
    }
  }
  g_cu_mvt = 0; g_cu_mvt_dyn = 0; g_cu_mvt_kb = 96; g_cu_mvr = -1;
  for (int i = 0; i < nw; i++) { cudaFree(w[i].q); cudaFree(w[i].sb); cudaFree(y[i]); cudaFree(r[i]); }
  cudaFree(dx); cudaFree(xq);
}

/* k_mvr: nw weights of rows[i] x K sharing x, every tiling, against k_mvq4 */
static void test_mvr(const int64_t *rows, int nw, int64_t K, int role, cudaStream_t s, int gs = 64, bool half = false) {
  cu_weight w[3];
  const cu_weight *ws[3];
  float *y[3], *r[3];
  for (int i = 0; i < nw; i++) {
    w[i] = make_w(rows[i], K, gs, half);
    ws[i] = &w[i];
    CK(cudaMalloc(&y[i], rows[i] * 4));
    CK(cudaMalloc(&r[i], rows[i] * 4));
  }
  std::vector<float> x((size_t)K);
  for (auto &v : x) v = 2.f * frnd() - 1.f;
  float *dx;
  void *xq;
  CK(cudaMalloc(&dx, K * 4));
  CK(cudaMalloc(&xq, cu_q4_scratch_bytes(1, K)));
  CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
  quantize_x(&w[0], dx, xq, r[0], s);
  g_cu_mvr = 0;
  cu_q4_matvec_preq(ws, r, nw, 1, xq, s, NULL, NULL, role);
  CK(cudaStreamSynchronize(s));
  for (int nwp : { 8, 4 })
    for (int rt : { 0, 1, 2, 4, 8 }) {
      g_cu_mvr = 1 << role;
      g_cu_mvr_nw = nwp;
      g_cu_mvr_rt = rt;
      for (int i = 0; i < nw; i++) CK(cudaMemset(y[i], 0xff, rows[i] * 4));
      const int c0 = g_cu_mvr_count;
      cu_q4_matvec_preq(ws, y, nw, 1, xq, s, NULL, NULL, role);
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      CHECK(g_cu_mvr_count == c0 + 1, "mvr nw %d rt %d K %lld: not launched", nwp, rt, (long long)K);
      for (int i = 0; i < nw; i++) {
        const double e = rel_max(get(y[i], rows[i]), get(r[i], rows[i]));
        CHECK(e < 1e-5, "mvr nw %d rt %d weight %d %lldx%lld: %g vs k_mvq4", nwp, rt, i, (long long)rows[i], (long long)K, e);
      }
    }
  /* roles outside the mask, and the automatic default (lm_head only at these shapes) */
  g_cu_mvr = -1; g_cu_mvr_nw = 8; g_cu_mvr_rt = 0;
  int c0 = g_cu_mvr_count;
  cu_q4_matvec_preq(ws, y, nw, 1, xq, s, NULL, NULL, CU_Q4_DN);
  CHECK(g_cu_mvr_count == c0, "mvr used for the down role by default");
  c0 = g_cu_mvr_count;
  cu_q4_matvec_preq(ws, y, nw, 1, xq, s, NULL, NULL, role);
  CHECK(g_cu_mvr_count == c0, "mvr used by default for role %d", role);
  for (int i = 0; i < nw; i++) CK(cudaMemset(y[i], 0xff, rows[i] * 4));
  c0 = g_cu_mvr_count;
  cu_q4_matvec_preq(ws, y, nw, 1, xq, s, NULL, NULL, CU_Q4_LM); /* lm_head: k_mvr by default */
  CK(cudaStreamSynchronize(s));
  CHECK(g_cu_mvr_count == c0 + 1, "mvr not used by default for lm_head");
  for (int i = 0; i < nw; i++) {
    const double e = rel_max(get(y[i], rows[i]), get(r[i], rows[i]));
    CHECK(e < 1e-5, "mvr as lm_head weight %d %lldx%lld: %g vs k_mvq4", i, (long long)rows[i], (long long)K, e);
  }
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < nw; i++) { cudaFree(w[i].q); cudaFree(w[i].sb); cudaFree(y[i]); cudaFree(r[i]); }
  cudaFree(dx); cudaFree(xq);
}

/* k_mlp1 (SMELT_CUDA_MLP): gate/up + quantized silu(gate)*up + down in one persistent kernel, against
 * k_mvq4 gate/up, k_quant_x (silu) and k_mvq4 down; several launches with different x, then one
 * launch captured in a graph and replayed (its grid barrier's counters are reused) */
extern int g_cu_mlp, g_cu_mlp_bar;
/* bar: k_mlp1's grid barriers split around the weight prefetch (SMELT_CUDA_MLP_BAR) */
static void test_mlp(int64_t F, int64_t K, cudaStream_t s, int bar) {
  cu_weight g = make_w(F, K), u = make_w(F, K), d = make_w(K, F);
  float *dx, *gy, *uy, *y, *rg, *ru, *ry;
  void *xq, *hq, *hq2;
  CK(cudaMalloc(&dx, K * 4));
  CK(cudaMalloc(&gy, F * 4)); CK(cudaMalloc(&uy, F * 4)); CK(cudaMalloc(&y, K * 4));
  CK(cudaMalloc(&rg, F * 4)); CK(cudaMalloc(&ru, F * 4)); CK(cudaMalloc(&ry, K * 4));
  CK(cudaMalloc(&xq, cu_q4_scratch_bytes(1, K)));
  CK(cudaMalloc(&hq, cu_q4_scratch_bytes(1, F)));
  CK(cudaMalloc(&hq2, cu_q4_scratch_bytes(1, F)));
  const cu_weight *ws[2] = { &g, &u };
  g_cu_mlp = 0;
  CHECK(!cu_q4_mlp_ok(&g, &u, &d, 1), "mlp_ok while off");
  g_cu_mlp = 1;
  g_cu_mlp_bar = bar;
  CHECK(cu_q4_mlp_ok(&g, &u, &d, 1), "mlp_ok %lldx%lld", (long long)F, (long long)K);
  CHECK(!cu_q4_mlp_ok(&g, &u, &d, 2) && !cu_q4_mlp_ok(&g, &u, &g, 1), "mlp_ok for n = 2 / a wrong down shape");
  for (int rep = 0; rep < 3; rep++) {
    std::vector<float> x((size_t)K);
    for (auto &v : x) v = (2.f * frnd() - 1.f) * (rep + 1);
    CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
    quantize_x(&g, dx, xq, rg, s);
    /* reference: k_mvq4 gate/up, then down of silu(gate)*up quantized by k_quant_x */
    g_cu_mvr = 0;
    float *rys[2] = { rg, ru };
    cu_q4_matvec_preq(ws, rys, 2, 1, xq, s, NULL, NULL, CU_Q4_GU);
    const cu_weight *dp = &d;
    cu_q4_matvec_cfg(&dp, &ry, 1, rg, ru, 1, hq2, s, 132, 0, 0, CU_Q4_DN);
    g_cu_mvr = -1;
    CK(cudaMemset(y, 0xff, K * 4)); CK(cudaMemset(gy, 0xff, F * 4)); CK(cudaMemset(hq, 0xff, cu_q4_scratch_bytes(1, F)));
    CHECK(cu_q4_mlp(&g, &u, &d, gy, uy, y, xq, hq, s), "cu_q4_mlp launch");
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    const std::vector<float> rgh = get(rg, F), ruh = get(ru, F), ryh = get(ry, K);
    const double eg = rel_max(get(gy, F), rgh), eu = rel_max(get(uy, F), ruh), ey = rel_max(get(y, K), ryh);
    CHECK(eg < 1e-5 && eu < 1e-5, "mlp %lldx%lld rep %d gate/up vs k_mvq4: %g %g", (long long)F, (long long)K, rep, eg, eu);
    /* h: the same quantization of (nearly) the same values; an int8 step may flip where gate/up
     * differ in the last bits, so y is compared with a bound of a few steps of h */
    std::vector<uint8_t> q0(cu_q4_scratch_bytes(1, F)), q1(q0.size());
    CK(cudaMemcpy(q0.data(), hq2, q0.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(q1.data(), hq, q1.size(), cudaMemcpyDeviceToHost));
    int flips = 0, far = 0;
    for (int64_t i = 0; i < F; i++) {
      const int a = (int8_t)q0[i], b = (int8_t)q1[i];
      flips += a != b;
      far += abs(a - b) > 1;
    }
    CHECK(far == 0 && flips <= F / 100, "mlp rep %d: int8 h differs in %d values (%d by more than one step)", rep, flips, far);
    CHECK(ey < 2e-3, "mlp %lldx%lld rep %d down vs reference: %g (%d int8 flips in h)", (long long)F, (long long)K, rep, ey, flips);
  }
  /* one launch captured in a graph and replayed with different x: the same barrier counters every
   * replay (the last block out must reset them for the next replay to wait) */
  {
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const bool cap = cu_q4_mlp(&g, &u, &d, gy, uy, y, xq, hq, s);
    CK(cudaStreamEndCapture(s, &gr));
    CHECK(cap, "cu_q4_mlp (captured)");
    CK(cudaGraphInstantiate(&ge, gr, 0));
    for (int rep = 0; rep < 4; rep++) {
      std::vector<float> x((size_t)K);
      for (auto &v : x) v = (2.f * frnd() - 1.f) * (rep % 2 ? 3.f : 0.5f);
      CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
      quantize_x(&g, dx, xq, rg, s);
      g_cu_mvr = 0;
      float *rys[2] = { rg, ru };
      cu_q4_matvec_preq(ws, rys, 2, 1, xq, s, NULL, NULL, CU_Q4_GU);
      const cu_weight *dp = &d;
      cu_q4_matvec_cfg(&dp, &ry, 1, rg, ru, 1, hq2, s, 132, 0, 0, CU_Q4_DN);
      g_cu_mvr = -1;
      CK(cudaMemset(y, 0xff, K * 4));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      const double ey = rel_max(get(y, K), get(ry, K));
      CHECK(ey < 2e-3, "mlp graph replay %d %lldx%lld: down vs reference %g", rep, (long long)F, (long long)K, ey);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
  }
  /* the residual add + rmsnorm inside it: bitwise the same as cu_norm_q followed by it */
  {
    std::vector<float> xr((size_t)K), ad((size_t)K), nw((size_t)K);
    for (int64_t i = 0; i < K; i++) { xr[i] = 2.f * frnd() - 1.f; ad[i] = frnd() - 0.5f; nw[i] = 0.5f + frnd(); }
    float *rx, *ra, *rw, *hout, *rx2;
    CK(cudaMalloc(&rx, K * 4)); CK(cudaMalloc(&ra, K * 4)); CK(cudaMalloc(&rw, K * 4));
    CK(cudaMalloc(&hout, K * 4)); CK(cudaMalloc(&rx2, K * 4));
    CK(cudaMemcpy(rx, xr.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(rx2, xr.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ra, ad.data(), K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(rw, nw.data(), K * 4, cudaMemcpyHostToDevice));
    CHECK(cu_norm_q(NULL, rx2, ra, rw, 1, (int)K, 1e-5f, 0.f, xq, s), "cu_norm_q");
    CHECK(cu_q4_mlp(&g, &u, &d, rg, ru, ry, xq, hq2, s), "cu_q4_mlp (reference)");
    cu_gu_norm nm = { rx, ra, rw, 0.f, 1e-5f, hout };
    CK(cudaMemset(hq, 0xff, cu_q4_scratch_bytes(1, F)));
    CHECK(cu_q4_mlp(&g, &u, &d, gy, uy, y, NULL, hq, s, &nm), "cu_q4_mlp with the norm");
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    std::vector<uint8_t> q0(cu_q4_scratch_bytes(1, F)), q1(q0.size());
    CK(cudaMemcpy(q0.data(), hq2, q0.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(q1.data(), hq, q1.size(), cudaMemcpyDeviceToHost));
    const std::vector<float> g0 = get(rg, F), g1 = get(gy, F), u0 = get(ru, F), u1 = get(uy, F), y0 = get(ry, K),
                             y1 = get(y, K), h0 = get(rx2, K), h1 = get(hout, K), x1 = get(rx, K);
    CHECK(!memcmp(g0.data(), g1.data(), F * 4) && !memcmp(u0.data(), u1.data(), F * 4),
          "mlp with the norm %lldx%lld: gate/up differ from cu_norm_q + mlp (%g)", (long long)F, (long long)K, rel_max(g1, g0));
    CHECK(!memcmp(q0.data(), q1.data(), q0.size()), "mlp with the norm: quantized h differs");
    CHECK(!memcmp(y0.data(), y1.data(), K * 4), "mlp with the norm: down differs (%g)", rel_max(y1, y0));
    CHECK(!memcmp(h0.data(), h1.data(), K * 4), "mlp with the norm: x + a differs");
    CHECK(!memcmp(x1.data(), xr.data(), K * 4), "mlp with the norm wrote x");
    /* and with the second add + rmsnorm and the next layer's q/k/v (cu_mlp_qkv): against
     * cu_norm_q(x + a, down) + k_mvq4 q/k/v */
    {
      const int64_t qr[3] = { 2 * K, K, K }; /* more 64-row items than blocks: the pipelined loads run */
      cu_weight qw[3];
      const cu_weight *qws[3];
      float *qy[3], *qref[3];
      for (int i = 0; i < 3; i++) {
        qw[i] = make_w(qr[i], K);
        qws[i] = &qw[i];
        CK(cudaMalloc(&qy[i], qr[i] * 4));
        CK(cudaMalloc(&qref[i], qr[i] * 4));
      }
      std::vector<float> n1((size_t)K);
      for (auto &v : n1) v = 0.5f + frnd();
      float *rn1, *xn;
      CK(cudaMalloc(&rn1, K * 4)); CK(cudaMalloc(&xn, K * 4));
      CK(cudaMemcpy(rn1, n1.data(), K * 4, cudaMemcpyHostToDevice));
      CHECK(cu_q4_mlp_qkv_ok(&g, qws), "mlp_qkv_ok");
      /* reference: x + a (h1) plus down (y1) normed by cu_norm_q, then q/k/v */
      CK(cudaMemcpy(xn, h1.data(), K * 4, cudaMemcpyHostToDevice));
      CHECK(cu_norm_q(NULL, xn, y, rn1, 1, (int)K, 1e-6f, 0.25f, xq, s), "cu_norm_q 2");
      g_cu_mvr = 0;
      cu_q4_matvec_preq(qws, qref, 3, 1, xq, s, NULL, NULL, CU_Q4_QKV);
      g_cu_mvr = -1;
      CK(cudaStreamSynchronize(s));
      const std::vector<float> xref = get(xn, K);
      cu_mlp_qkv qk;
      for (int i = 0; i < 3; i++) { qk.w[i] = qws[i]; qk.y[i] = qy[i]; }
      qk.xres = rx; qk.nw = rn1; qk.off = 0.25f; qk.eps = 1e-6f;
      CK(cudaMemset(y, 0xff, K * 4));
      for (int i = 0; i < 3; i++) CK(cudaMemset(qy[i], 0xff, qr[i] * 4));
      CHECK(cu_q4_mlp(&g, &u, &d, gy, uy, y, NULL, hq, s, &nm, &qk), "cu_q4_mlp with q/k/v");
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      CHECK(!memcmp(get(y, K).data(), y1.data(), K * 4), "mlp with q/k/v: down differs from the norm-only kernel");
      CHECK(!memcmp(get(rx, K).data(), xref.data(), K * 4), "mlp with q/k/v: x + a + down differs from cu_norm_q's");
      for (int i = 0; i < 3; i++) {
        const double e = rel_max(get(qy[i], qr[i]), get(qref[i], qr[i]));
        CHECK(e < 1e-5, "mlp with q/k/v %lldx%lld: weight %d vs k_mvq4 %g", (long long)F, (long long)K, i, e);
      }
      /* the second add + rmsnorm deferred (cu_mlp_dnorm: x written, its int8 x not divided by the
       * rms, partial sums of squares), the rms applied by the q/k/v k_mvq4 (cu_q4_set_dnorm):
       * against cu_norm_q + k_mvq4 (only rounding differs: x * w vs x / rms * w quantized) */
      const bool dn_ok = cu_q4_mlp_dnorm_ok(&g, &u, &d);
      CHECK(dn_ok == (K == 4096), "mlp_dnorm_ok %lldx%lld: %d (the down items pair up in as many rounds for the 8B shape)",
            (long long)F, (long long)K, (int)dn_ok);
      if (dn_ok) {
        float *ssp;
        void *xq2;
        CK(cudaMalloc(&ssp, K / 32 * 4));
        CK(cudaMalloc(&xq2, cu_q4_scratch_bytes(1, K)));
        CK(cudaMemcpy(rx, xr.data(), K * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(y, 0xff, K * 4));
        CK(cudaMemset(ssp, 0xff, K / 32 * 4));
        for (int i = 0; i < 3; i++) CK(cudaMemset(qy[i], 0xff, qr[i] * 4));
        cu_mlp_dnorm dz = { rx, rn1, 0.25f, xq2, ssp };
        CHECK(cu_q4_mlp(&g, &u, &d, gy, uy, y, NULL, hq, s, &nm, NULL, &dz), "cu_q4_mlp with the deferred norm");
        const cu_weight *q3[3] = { qws[0], qws[1], qws[2] };
        g_cu_mvr = 0;
        CHECK(cu_q4_dnorm_ok(q3, 3, CU_Q4_QKV), "dnorm_ok for k_mvq4 q/k/v");
        cu_q4_set_dnorm(ssp, (int)(K / 32), 1e-6f, (int)K);
        cu_q4_matvec_preq(q3, qy, 3, 1, xq2, s, NULL, NULL, CU_Q4_QKV);
        g_cu_mvr = -1;
        CK(cudaStreamSynchronize(s));
        CK(cudaGetLastError());
        CHECK(!memcmp(get(y, K).data(), y1.data(), K * 4), "mlp with the deferred norm: down differs");
        const std::vector<float> xd = get(rx, K), sp = get(ssp, K / 32);
        CHECK(!memcmp(xd.data(), xref.data(), K * 4), "mlp with the deferred norm: x + a + down differs from cu_norm_q's");
        double ss = 0, sg = 0;
        for (int64_t i = 0; i < K; i++) ss += (double)xref[i] * xref[i];
        for (int64_t i = 0; i < K / 32; i++) sg += sp[i];
        CHECK(fabs(sg - ss) <= 1e-5 * ss, "mlp with the deferred norm: sum of squares %g vs %g", sg, ss);
        for (int i = 0; i < 3; i++) {
          const double e = rel_max(get(qy[i], qr[i]), get(qref[i], qr[i]));
          printf("deferred norm %lldx%lld: q/k/v weight %d vs cu_norm_q + k_mvq4: %.3g\n", (long long)F, (long long)K, i, e);
          CHECK(e < 2e-3, "mlp with the deferred norm %lldx%lld: weight %d vs cu_norm_q + k_mvq4 %g", (long long)F,
                (long long)K, i, e);
        }
        /* the next k_mvq4 launch without cu_q4_set_dnorm does not scale */
        g_cu_mvr = 0;
        cu_q4_matvec_preq(q3, qy, 3, 1, xq, s, NULL, NULL, CU_Q4_QKV);
        g_cu_mvr = -1;
        CK(cudaStreamSynchronize(s));
        CHECK(rel_max(get(qy[0], qr[0]), get(qref[0], qr[0])) < 1e-6, "k_mvq4 after a deferred-norm launch");
        cudaFree(ssp); cudaFree(xq2);
      }
      for (int i = 0; i < 3; i++) {
        cudaFree(qy[i]); cudaFree(qref[i]); cudaFree(qw[i].q); cudaFree(qw[i].sb);
      }
      cudaFree(rn1); cudaFree(xn);
    }
    cudaFree(rx); cudaFree(ra); cudaFree(rw); cudaFree(hout); cudaFree(rx2);
  }
  g_cu_mlp = 2;
  g_cu_mlp_bar = 1;
  cudaFree(dx); cudaFree(gy); cudaFree(uy); cudaFree(y); cudaFree(rg); cudaFree(ru); cudaFree(ry);
  cudaFree(xq); cudaFree(hq); cudaFree(hq2);
  cudaFree(g.q); cudaFree(g.sb); cudaFree(u.q); cudaFree(u.sb); cudaFree(d.q); cudaFree(d.sb);
}

int main() {
  int n = 0, major = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) { printf("SKIP: no CUDA device\n"); return 77; }
  CK(cudaSetDevice(0));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  g_major = major;
  cu_mv_init(0);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  test_guq(14336, 4096, s); /* Llama-3.1-8B */
  test_guq(8192, 2048, s);  /* Llama-3.2-1B */
  test_guq(96, 512, s);
  if (major >= 9) { /* k_mvt needs sm_90 (elsewhere k_mvq4 runs and the comparison is trivial) */
    const int64_t qkv[3] = { 4096, 1024, 1024 }, o[1] = { 4096 }, dn[1] = { 4096 }, odd[2] = { 300, 37 };
    test_mvt(qkv, 3, 4096, CU_Q4_QKV, s);
    test_mvt(o, 1, 4096, CU_Q4_O, s);
    test_mvt(dn, 1, 14336, CU_Q4_DN, s);
    test_mvt(odd, 2, 1024, -1, s); /* partial groups, rows not a multiple of 4 */
  }
  {
    const int64_t qkv8[3] = { 4096, 1024, 1024 }, o8[1] = { 4096 }, qkv1[3] = { 2048, 512, 512 }, o1[1] = { 2048 };
    const int64_t odd[3] = { 300, 37, 64 }, q3[1] = { 3072 };
    test_mvr(qkv8, 3, 4096, CU_Q4_QKV, s); /* Llama-3.1-8B */
    test_mvr(o8, 1, 4096, CU_Q4_O, s);
    test_mvr(qkv1, 3, 2048, CU_Q4_QKV, s); /* Llama-3.2-1B */
    test_mvr(o1, 1, 2048, CU_Q4_O, s);
    test_mvr(odd, 3, 1024, CU_Q4_QKV, s); /* partial blocks and warps */
    test_mvr(q3, 1, 3072, CU_Q4_O, s);    /* three vectors a lane */
    test_mvr(o8, 1, 14336, CU_Q4_DN, s);  /* down projections (opt-in role) */
    test_mvr(o1, 1, 8192, CU_Q4_DN, s);
    test_mvr(qkv1, 3, 2048, CU_Q4_QKV, s, 32, true); /* group size 32, f16 scales */
    test_mvr(o8, 1, 4096, CU_Q4_O, s, 128, false);   /* group size 128 */
  }
  if (major >= 9) { /* k_mlp1: sm_90 */
    test_mlp(14336, 4096, s, 1); /* Llama-3.1-8B */
    test_mlp(8192, 2048, s, 1);  /* Llama-3.2-1B */
    test_mlp(14336, 4096, s, 0); /* one blocks_sync a barrier (SMELT_CUDA_MLP_BAR=0) */
    test_mlp(8192, 2048, s, 0);
  }
  printf("%d checks, %d failed\n", checks, fails);
  return fails ? 1 : 0;
}
