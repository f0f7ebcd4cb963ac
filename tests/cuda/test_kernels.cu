/* One-token decode kernels at Llama shapes, against the default kernels (no CPU model):
 *  - k_gu_q4 (gate/up + silu(gate)*up quantized in one kernel): gate and up against k_mvq4
 *    (summation order only), the int8 h against silu(gate)*up of those, and where the dispatch
 *    takes it (large gate weights k_mvr cannot take);
 *  - k_mvr (weights held in registers, tuning mvr) against k_mvq4 for the q/k/v, o and down shapes of
 *    both models, partial blocks, and the roles it takes by default;
 *  - k_mlp1 (gate/up + silu quantization + down in one persistent kernel) against the separate
 *    kernels at both models' shapes, three launches in a row, a captured graph replayed, with the add
 *    + rmsnorm before it (bitwise against k_norm_q + k_mlp1) and the deferred add + rmsnorm after it;
 *  - mxq_fp4_i8x8 (byte-permute decoding of mxfp4 codes to int8) against mxq_fp4 for every code in every
 *    place of a word, and the fused expert kernels on mxfp4 weights of gpt-oss's width (int16 x) against
 *    the row kernel (float x);
 *  - the norm launches that do two norms' work (cu_norm_pre_q: a sandwich's output norm, the residual
 *    add and the next norm with its int8 x; cu_norm_pair: the q and k head norms) bitwise against
 *    cu_norm_q run twice, and cu_norm_q against a double-precision reference.
 * Exits 77 (ctest SKIP) without a usable GPU. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mlp.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_mxq.cuh"
#include "backend/cuda/cuda_q4.cuh"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static int fails, checks;
/* the launch context of the kernels under test: the default tuning of this device, and counters */
static cu_tune g_tune;
static cu_counters g_cnt;
static cu_ctx g_cx;
static const cu_ctx *ctx_mvr(int mask) { /* the context with the k_mvr role mask (-1: automatic) */
  static cu_tune t;
  static cu_ctx c;
  t = g_tune;
  t.mvr = mask;
  c = g_cx;
  c.t = &t;
  return &c;
}
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
  cu_q4_matvec(&g_cx, &w, &dy, 1, dx, NULL, 1, xq, -1);
}

static void test_guq(int64_t M, int64_t K, cudaStream_t s, bool want_default) {
  cu_weight g = make_w(M, K), u = make_w(M, K);
  std::vector<float> x((size_t)K);
  for (auto &v : x) v = 2.f * frnd() - 1.f;
  float *dx, *gy, *uy, *ry[2];
  void *xq, *hq;
  CK(cudaMalloc(&dx, K * 4));
  CK(cudaMalloc(&gy, M * 4)); CK(cudaMalloc(&uy, M * 4));
  CK(cudaMalloc(&ry[0], M * 4)); CK(cudaMalloc(&ry[1], M * 4));
  CK(cudaMalloc(&xq, cu_q4_scratch_bytes(1, K)));
  CK(cudaMalloc(&hq, cu_q4_scratch_bytes(1, M)));
  CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
  quantize_x(&g, dx, xq, ry[0], s);
  const cu_weight *ws[2] = { &g, &u };
  /* reference: k_mvq4, gate and up */
  cu_q4_matvec_preq(ctx_mvr(0), ws, ry, 2, 1, xq, CU_Q4_GU);
  CK(cudaStreamSynchronize(s));
  std::vector<float> rg = get(ry[0], M), ru = get(ry[1], M);
  /* where the dispatch takes it by default: large gate weights that k_mvr cannot take */
  CHECK(cu_q4_guq_ok(&g_cx, &g, &u, 1) == want_default, "guq_ok %lldx%lld: %d", (long long)M, (long long)K,
        (int)!want_default);
  CK(cudaMemset(hq, 0xff, cu_q4_scratch_bytes(1, M)));
  CK(cudaMemset(gy, 0xff, M * 4));
  CK(cudaMemset(uy, 0xff, M * 4));
  const long c0 = g_cnt.launch[CU_K_GUQ4];
  cu_q4_guq(&g_cx, &g, &u, gy, uy, xq, hq);
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  CHECK(g_cnt.launch[CU_K_GUQ4] == c0 + 1, "k_gu_q4 launches %ld", g_cnt.launch[CU_K_GUQ4] - c0);
  std::vector<float> yg = get(gy, M), yu = get(uy, M);
  const double eg = rel_max(yg, rg), eu = rel_max(yu, ru);
  CHECK(eg < 1e-5 && eu < 1e-5, "gu %lldx%lld gate/up vs k_mvq4: %g %g", (long long)M, (long long)K, eg, eu);
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
    CHECK(fabs(d - am / 127.0) <= 1e-4 * am / 127.0 + 1e-30, "gu chunk %lld scale %g vs %g", (long long)b, d, am / 127.0);
    for (int i = 0; i < 32; i++) { /* value i of the chunk: word 2(i/8) + (i&1), byte (i%8)/2 */
      const int e = i & 7, jj = i >> 3;
      const int qv = hqi[b * 32 + (2 * jj + (e & 1)) * 4 + (e >> 1)];
      worst = fmax(worst, fabs(qv * (double)d - h[i]) / (d + 1e-30));
    }
  }
  /* |q d - h| <= d/2 plus the difference of gate/up (summation order) */
  CHECK(worst <= 0.51, "gu %lldx%lld: int8 h off by %g steps", (long long)M, (long long)K, worst);
  CHECK(worst_sum < 1e-4, "gu chunk sums off by %g", worst_sum);
  cudaFree(dx); cudaFree(gy); cudaFree(uy); cudaFree(ry[0]); cudaFree(ry[1]); cudaFree(xq); cudaFree(hq);
  cudaFree(g.q); cudaFree(g.sb); cudaFree(u.q); cudaFree(u.sb);
}

/* k_mvr: nw weights of rows[i] x K sharing x against k_mvq4; the roles it takes by default */
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
  cu_q4_matvec_preq(ctx_mvr(0), ws, r, nw, 1, xq, role);
  CK(cudaStreamSynchronize(s));
  {
    for (int i = 0; i < nw; i++) CK(cudaMemset(y[i], 0xff, rows[i] * 4));
    const long c0 = g_cnt.launch[CU_K_MVR];
    cu_q4_matvec_preq(ctx_mvr(1 << role), ws, y, nw, 1, xq, role);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    CHECK(g_cnt.launch[CU_K_MVR] == c0 + 1, "mvr K %lld: not launched", (long long)K);
    for (int i = 0; i < nw; i++) {
      const double e = rel_max(get(y[i], rows[i]), get(r[i], rows[i]));
      CHECK(e < 1e-5, "mvr weight %d %lldx%lld: %g vs k_mvq4", i, (long long)rows[i], (long long)K, e);
    }
  }
  /* roles outside the mask, and the automatic default (lm_head; q/k/v and o of K <= mvr_kmax) */
  long c0 = g_cnt.launch[CU_K_MVR];
  cu_q4_matvec_preq(&g_cx, ws, y, nw, 1, xq, CU_Q4_DN);
  CHECK(g_cnt.launch[CU_K_MVR] == c0, "mvr used for the down role by default");
  c0 = g_cnt.launch[CU_K_MVR];
  cu_q4_matvec_preq(&g_cx, ws, y, nw, 1, xq, role);
  const bool want = (role == CU_Q4_QKV || role == CU_Q4_O) && K <= g_tune.mvr_kmax;
  CHECK(g_cnt.launch[CU_K_MVR] - c0 == (want ? 1 : 0), "mvr %s by default for role %d, K = %lld",
        want ? "not used" : "used", role, (long long)K);
  for (int i = 0; i < nw; i++) CK(cudaMemset(y[i], 0xff, rows[i] * 4));
  c0 = g_cnt.launch[CU_K_MVR];
  cu_q4_matvec_preq(&g_cx, ws, y, nw, 1, xq, CU_Q4_LM); /* lm_head: k_mvr by default */
  CK(cudaStreamSynchronize(s));
  CHECK(g_cnt.launch[CU_K_MVR] == c0 + 1, "mvr not used by default for lm_head");
  for (int i = 0; i < nw; i++) {
    const double e = rel_max(get(y[i], rows[i]), get(r[i], rows[i]));
    CHECK(e < 1e-5, "mvr as lm_head weight %d %lldx%lld: %g vs k_mvq4", i, (long long)rows[i], (long long)K, e);
  }
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < nw; i++) { cudaFree(w[i].q); cudaFree(w[i].sb); cudaFree(y[i]); cudaFree(r[i]); }
  cudaFree(dx); cudaFree(xq);
}

/* k_mlp1: gate/up + quantized silu(gate)*up + down in one persistent kernel, against k_mvq4 gate/up,
 * k_quant_x (silu) and k_mvq4 down; several launches with different x, then one launch captured in a
 * graph and replayed (its grid barrier's counters are reused) */
static void mlp_reference(const cu_weight *g, const cu_weight *u, const cu_weight *d, void *xq, void *hq2, float *rg,
                          float *ru, float *ry, bool gelu) {
  const cu_weight *ws[2] = { g, u };
  float *rys[2] = { rg, ru };
  cu_q4_matvec_preq(ctx_mvr(0), ws, rys, 2, 1, xq, CU_Q4_GU);
  cu_q4_matvec(ctx_mvr(0), &d, &ry, 1, rg, ru, 1, hq2, CU_Q4_DN, 0, 0, gelu);
}
/* gelu: h = gelu_tanh(gate) * up (Gemma) */
static void test_mlp(int64_t F, int64_t K, cudaStream_t s, bool gelu = false) {
  cu_weight g = make_w(F, K), u = make_w(F, K), d = make_w(K, F);
  float *dx, *gy, *uy, *y, *rg, *ru, *ry;
  void *xq, *hq, *hq2;
  CK(cudaMalloc(&dx, K * 4));
  CK(cudaMalloc(&gy, F * 4)); CK(cudaMalloc(&uy, F * 4)); CK(cudaMalloc(&y, K * 4));
  CK(cudaMalloc(&rg, F * 4)); CK(cudaMalloc(&ru, F * 4)); CK(cudaMalloc(&ry, K * 4));
  CK(cudaMalloc(&xq, cu_q4_scratch_bytes(1, K)));
  CK(cudaMalloc(&hq, cu_q4_scratch_bytes(1, F)));
  CK(cudaMalloc(&hq2, cu_q4_scratch_bytes(1, F)));
  CHECK(cu_mlp_ok(&g_cx, &g, &u, &d, 1), "mlp_ok %lldx%lld", (long long)F, (long long)K);
  CHECK(!cu_mlp_ok(&g_cx, &g, &u, &d, 2) && !cu_mlp_ok(&g_cx, &g, &u, &g, 1), "mlp_ok for n = 2 / a wrong down shape");
  for (int rep = 0; rep < 3; rep++) {
    std::vector<float> x((size_t)K);
    for (auto &v : x) v = (2.f * frnd() - 1.f) * (rep + 1);
    CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
    quantize_x(&g, dx, xq, rg, s);
    mlp_reference(&g, &u, &d, xq, hq2, rg, ru, ry, gelu);
    CK(cudaMemset(y, 0xff, K * 4)); CK(cudaMemset(gy, 0xff, F * 4)); CK(cudaMemset(hq, 0xff, cu_q4_scratch_bytes(1, F)));
    CHECK(cu_mlp(&g_cx, &g, &u, &d, gy, uy, y, xq, hq, NULL, NULL, gelu), "cu_mlp launch");
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
    const bool cap = cu_mlp(&g_cx, &g, &u, &d, gy, uy, y, xq, hq, NULL, NULL, gelu);
    CK(cudaStreamEndCapture(s, &gr));
    CHECK(cap, "cu_mlp (captured)");
    CK(cudaGraphInstantiate(&ge, gr, 0));
    for (int rep = 0; rep < 4; rep++) {
      std::vector<float> x((size_t)K);
      for (auto &v : x) v = (2.f * frnd() - 1.f) * (rep % 2 ? 3.f : 0.5f);
      CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
      quantize_x(&g, dx, xq, rg, s);
      mlp_reference(&g, &u, &d, xq, hq2, rg, ru, ry, gelu);
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
    CHECK(cu_norm_q(&g_cx, NULL, rx2, ra, rw, 1, (int)K, 1e-5f, 0.f, xq), "cu_norm_q");
    CHECK(cu_mlp(&g_cx, &g, &u, &d, rg, ru, ry, xq, hq2, NULL, NULL, gelu), "cu_mlp (reference)");
    const cu_mlp_norm nm = { rx, ra, rw, 0.f, 1e-5f, hout, NULL, 0.f, 0.f };
    CK(cudaMemset(hq, 0xff, cu_q4_scratch_bytes(1, F)));
    CHECK(cu_mlp(&g_cx, &g, &u, &d, gy, uy, y, NULL, hq, &nm, NULL, gelu), "cu_mlp with the norm");
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
    /* with a sandwich norm's output norm of a first (Gemma; K <= 3072): bitwise cu_norm_pre_q followed by it */
    const bool pre_ok = cu_mlp_pre_ok(&g_cx, &g, &u, &d);
    CHECK(pre_ok == (K <= 3072), "mlp_pre_ok %lldx%lld: %d", (long long)F, (long long)K, (int)pre_ok);
    if (pre_ok) {
      std::vector<float> pw((size_t)K);
      for (auto &v : pw) v = frnd() - 0.5f;
      float *rpw, *rx3;
      CK(cudaMalloc(&rpw, K * 4)); CK(cudaMalloc(&rx3, K * 4));
      CK(cudaMemcpy(rpw, pw.data(), K * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(rx3, xr.data(), K * 4, cudaMemcpyHostToDevice));
      /* outputs of their own: the deferred-norm check below reads y and hout of the plain norm's run */
      float *sg, *su, *sy, *sg2, *su2, *sy2, *sh;
      uint8_t *sq, *sq2;
      CK(cudaMalloc(&sg, F * 4)); CK(cudaMalloc(&su, F * 4)); CK(cudaMalloc(&sy, K * 4));
      CK(cudaMalloc(&sg2, F * 4)); CK(cudaMalloc(&su2, F * 4)); CK(cudaMalloc(&sy2, K * 4));
      CK(cudaMalloc(&sh, K * 4));
      CK(cudaMalloc(&sq, cu_q4_scratch_bytes(1, F))); CK(cudaMalloc(&sq2, cu_q4_scratch_bytes(1, F)));
      CHECK(cu_norm_pre_q(&g_cx, NULL, rx3, ra, rpw, 1.f, 1e-6f, rw, 1, (int)K, 1e-5f, 0.f, xq, NULL), "cu_norm_pre_q");
      CHECK(cu_mlp(&g_cx, &g, &u, &d, sg2, su2, sy2, xq, sq2, NULL, NULL, gelu), "cu_mlp (reference, sandwich)");
      const cu_mlp_norm np = { rx, ra, rw, 0.f, 1e-5f, sh, rpw, 1.f, 1e-6f };
      CK(cudaMemset(sq, 0xff, cu_q4_scratch_bytes(1, F)));
      CK(cudaMemset(sh, 0xff, K * 4));
      CHECK(cu_mlp(&g_cx, &g, &u, &d, sg, su, sy, NULL, sq, &np, NULL, gelu), "cu_mlp with the sandwich norm");
      CK(cudaStreamSynchronize(s));
      CK(cudaGetLastError());
      std::vector<uint8_t> s0(cu_q4_scratch_bytes(1, F)), s1(s0.size());
      CK(cudaMemcpy(s0.data(), sq2, s0.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(s1.data(), sq, s1.size(), cudaMemcpyDeviceToHost));
      CHECK(!memcmp(get(sg2, F).data(), get(sg, F).data(), F * 4) && !memcmp(get(su2, F).data(), get(su, F).data(), F * 4),
            "mlp with the sandwich norm %lldx%lld: gate/up differ from cu_norm_pre_q + mlp", (long long)F, (long long)K);
      CHECK(!memcmp(s0.data(), s1.data(), s0.size()), "mlp with the sandwich norm: quantized h differs");
      CHECK(!memcmp(get(sy2, K).data(), get(sy, K).data(), K * 4), "mlp with the sandwich norm: down differs");
      CHECK(!memcmp(get(rx3, K).data(), get(sh, K).data(), K * 4), "mlp with the sandwich norm: x + norm(a) differs");
      CHECK(!memcmp(get(rx, K).data(), xr.data(), K * 4), "mlp with the sandwich norm wrote x");
      CK(cudaFree(rpw)); CK(cudaFree(rx3)); CK(cudaFree(sg)); CK(cudaFree(su)); CK(cudaFree(sy));
      CK(cudaFree(sg2)); CK(cudaFree(su2)); CK(cudaFree(sy2)); CK(cudaFree(sh)); CK(cudaFree(sq)); CK(cudaFree(sq2));
    }
    /* the second add + rmsnorm deferred (cu_mlp_dnorm: x written, its int8 x not divided by the rms,
     * partial sums of squares), the rms applied by the next k_mvq4 (q/k/v, cu_q4_dnorm): against
     * cu_norm_q + k_mvq4 (only rounding differs: x * w vs x / rms * w quantized) */
    const bool dn_ok = cu_mlp_dnorm_ok(&g_cx, &g, &u, &d);
    CHECK(dn_ok == (K > 2048), "mlp_dnorm_ok %lldx%lld: %d (the down items pair up in as many rounds above K = 2048)",
          (long long)F, (long long)K, (int)dn_ok);
    if (dn_ok) {
      const int64_t qr[3] = { 2 * K, K, K };
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
      float *rn1, *xn, *ssp;
      void *xq2;
      CK(cudaMalloc(&rn1, K * 4)); CK(cudaMalloc(&xn, K * 4));
      CK(cudaMalloc(&ssp, K / 32 * 4));
      CK(cudaMalloc(&xq2, cu_q4_scratch_bytes(1, K)));
      CK(cudaMemcpy(rn1, n1.data(), K * 4, cudaMemcpyHostToDevice));
      /* reference: x + a (h1) plus down (y1) normed by cu_norm_q, then q/k/v */
      CK(cudaMemcpy(xn, h1.data(), K * 4, cudaMemcpyHostToDevice));
      CHECK(cu_norm_q(&g_cx, NULL, xn, y, rn1, 1, (int)K, 1e-6f, 0.25f, xq), "cu_norm_q 2");
      cu_q4_matvec_preq(ctx_mvr(0), qws, qref, 3, 1, xq, CU_Q4_QKV);
      CK(cudaStreamSynchronize(s));
      const std::vector<float> xref = get(xn, K);
      CK(cudaMemcpy(rx, xr.data(), K * 4, cudaMemcpyHostToDevice));
      CK(cudaMemset(y, 0xff, K * 4));
      CK(cudaMemset(ssp, 0xff, K / 32 * 4));
      for (int i = 0; i < 3; i++) CK(cudaMemset(qy[i], 0xff, qr[i] * 4));
      const cu_mlp_dnorm dz = { rx, rn1, 0.25f, xq2, ssp };
      const long c0 = g_cnt.launch[CU_K_MLP1_DNORM];
      CHECK(cu_mlp(&g_cx, &g, &u, &d, gy, uy, y, NULL, hq, &nm, &dz, gelu), "cu_mlp with the deferred norm");
      CHECK(g_cnt.launch[CU_K_MLP1_DNORM] == c0 + 1, "deferred-norm launches counted");
      CHECK(cu_q4_dnorm_ok(ctx_mvr(0), qws, 3, CU_Q4_QKV), "dnorm_ok for k_mvq4 q/k/v");
      const cu_q4_dnorm dn = { ssp, (int)(K / 32), 1e-6f, (int)K };
      cu_q4_matvec_preq(ctx_mvr(0), qws, qy, 3, 1, xq2, CU_Q4_QKV, &dn);
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
      /* k_mvr applies the deferred norm too */
      for (int i = 0; i < 3; i++) CK(cudaMemset(qy[i], 0xff, qr[i] * 4));
      const long m0 = g_cnt.launch[CU_K_MVR];
      cu_q4_matvec_preq(ctx_mvr(1), qws, qy, 3, 1, xq2, CU_Q4_QKV, &dn);
      CK(cudaStreamSynchronize(s));
      CHECK(g_cnt.launch[CU_K_MVR] == m0 + 1, "k_mvr with the deferred norm %lldx%lld: not launched", (long long)F,
            (long long)K);
      for (int i = 0; i < 3; i++) {
        const double e = rel_max(get(qy[i], qr[i]), get(qref[i], qr[i]));
        CHECK(e < 2e-3, "k_mvr with the deferred norm %lldx%lld: weight %d vs cu_norm_q + k_mvq4 %g", (long long)F,
              (long long)K, i, e);
      }
      /* the next k_mvq4 launch without a deferred norm does not scale */
      cu_q4_matvec_preq(ctx_mvr(0), qws, qy, 3, 1, xq, CU_Q4_QKV);
      CK(cudaStreamSynchronize(s));
      CHECK(rel_max(get(qy[0], qr[0]), get(qref[0], qr[0])) < 1e-6, "k_mvq4 after a deferred-norm launch");
      for (int i = 0; i < 3; i++) { cudaFree(qy[i]); cudaFree(qref[i]); cudaFree(qw[i].q); cudaFree(qw[i].sb); }
      cudaFree(rn1); cudaFree(xn); cudaFree(ssp); cudaFree(xq2);
    }
    cudaFree(rx); cudaFree(ra); cudaFree(rw); cudaFree(hout); cudaFree(rx2);
  }
  cudaFree(dx); cudaFree(gy); cudaFree(uy); cudaFree(y); cudaFree(rg); cudaFree(ru); cudaFree(ry);
  cudaFree(xq); cudaFree(hq); cudaFree(hq2);
  cudaFree(g.q); cudaFree(g.sb); cudaFree(u.q); cudaFree(u.sb); cudaFree(d.q); cudaFree(d.sb);
}

/* cu_norm_pre_q and cu_norm_pair against cu_norm_q run twice (bitwise), cu_norm_q against doubles */
static void test_norms(int rows, int dim, float off, cudaStream_t s) {
  const size_t n = (size_t)rows * dim;
  std::vector<float> hx(n), ha(n), hw(dim), hw2(dim);
  for (auto &v : hx) v = 4.f * frnd() - 2.f;
  for (auto &v : ha) v = 8.f * frnd() - 4.f;
  for (auto &v : hw) v = frnd() - 0.5f;
  for (auto &v : hw2) v = frnd() + 0.25f;
  float *x, *x2, *a, *w, *w2, *t, *o1, *o2, *o3, *o4;
  float *bufs[10];
  for (int i = 0; i < 10; i++) CK(cudaMalloc(&bufs[i], n * 4 > (size_t)dim * 4 ? n * 4 : (size_t)dim * 4));
  x = bufs[0]; x2 = bufs[1]; a = bufs[2]; w = bufs[3]; w2 = bufs[4]; t = bufs[5]; o1 = bufs[6]; o2 = bufs[7];
  o3 = bufs[8]; o4 = bufs[9];
  void *xq1, *xq2;
  CK(cudaMalloc(&xq1, n * 2));
  CK(cudaMalloc(&xq2, n * 2));
  CK(cudaMemcpy(x, hx.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(x2, hx.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(a, ha.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w, hw.data(), (size_t)dim * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w2, hw2.data(), (size_t)dim * 4, cudaMemcpyHostToDevice));
  /* two launches: t = rmsnorm(a) * (w2 + off); x += t; o1 = rmsnorm(x) * (w + off) with its int8 x */
  CHECK(cu_norm_q(&g_cx, t, a, NULL, w2, rows, dim, 1e-6f, off, NULL), "cu_norm_q (a)");
  CHECK(cu_norm_q(&g_cx, o1, x, t, w, rows, dim, 1e-5f, off, dim % 32 ? NULL : xq1), "cu_norm_q (x + t)");
  /* one */
  CHECK(cu_norm_pre_q(&g_cx, o2, x2, a, w2, off, 1e-6f, w, rows, dim, 1e-5f, off, dim % 32 ? NULL : xq2, NULL),
        "cu_norm_pre_q %dx%d", rows, dim);
  CK(cudaStreamSynchronize(s));
  CHECK(get(x, n) == get(x2, n), "cu_norm_pre_q %dx%d: the residual x + rmsnorm(a) differs", rows, dim);
  CHECK(get(o1, n) == get(o2, n), "cu_norm_pre_q %dx%d: the norm differs", rows, dim);
  if (dim % 32 == 0) {
    std::vector<uint8_t> q1(n + (size_t)rows * (dim / 32) * 8), q2(q1.size());
    CK(cudaMemcpy(q1.data(), xq1, q1.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(q2.data(), xq2, q2.size(), cudaMemcpyDeviceToHost));
    CHECK(q1 == q2, "cu_norm_pre_q %dx%d: the int8 x differs", rows, dim);
  }
  /* cu_norm_q (t above) against doubles */
  const std::vector<float> ht = get(t, n);
  double e = 0;
  for (int r = 0; r < rows; r++) {
    double ss = 0;
    for (int d = 0; d < dim; d++) ss += (double)ha[(size_t)r * dim + d] * ha[(size_t)r * dim + d];
    const double inv = 1.0 / sqrt(ss / dim + 1e-6);
    for (int d = 0; d < dim; d++) {
      const double want = ha[(size_t)r * dim + d] * inv * ((double)hw2[d] + off);
      e = fmax(e, fabs(want - ht[(size_t)r * dim + d]) / (fabs(want) + 1e-3));
    }
  }
  CHECK(e < 1e-5, "cu_norm_q %dx%d against doubles: relative error %g", rows, dim, e);
  /* the pair (in place, as the head norms run), rows and rows / 2 + 1, against two cu_norm_q */
  const int r2 = rows / 2 + 1;
  CK(cudaMemcpy(o3, ha.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(o4, hx.data(), (size_t)r2 * dim * 4, cudaMemcpyHostToDevice));
  CHECK(cu_norm_pair(&g_cx, o3, o3, w, rows, o4, o4, w2, r2, dim, 1e-6f, off), "cu_norm_pair %dx%d", rows, dim);
  CK(cudaMemcpy(o1, ha.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(o2, hx.data(), (size_t)r2 * dim * 4, cudaMemcpyHostToDevice));
  CHECK(cu_norm_q(&g_cx, o1, o1, NULL, w, rows, dim, 1e-6f, off, NULL), "cu_norm_q (pair 1)");
  CHECK(cu_norm_q(&g_cx, o2, o2, NULL, w2, r2, dim, 1e-6f, off, NULL), "cu_norm_q (pair 2)");
  CK(cudaStreamSynchronize(s));
  CHECK(get(o3, n) == get(o1, n), "cu_norm_pair %dx%d: the first norm differs", rows, dim);
  CHECK(get(o4, (size_t)r2 * dim) == get(o2, (size_t)r2 * dim), "cu_norm_pair %dx%d: the second norm differs", rows, dim);
  for (int i = 0; i < 10; i++) CK(cudaFree(bufs[i]));
  CK(cudaFree(xq1));
  CK(cudaFree(xq2));
}

/* every code in every place: word i | (i ^ 0x5a5a) << 16 for i < 65536; out[i] = the values of
 * mxq_fp4_i8x8 that differ from twice mxq_fp4's */
__global__ void k_fp4_i8_probe(int *out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, w = i | ((i ^ 0x5a5au) << 16);
  int bad = 0, lo, hi;
  mxq_fp4_i8x8(w, lo, hi);
  for (int e = 0; e < 8; e++)
    bad += (int)(int8_t)((e < 4 ? lo : hi) >> (8 * (e & 3))) != (int)(2.f * mxq_fp4((w >> (4 * e)) & 15));
  out[i] = bad;
}
/* random mxfp4 weight: codes of every value, E8M0 scales 2^-9 .. 2^-3 */
static cu_weight make_mx4(int64_t rows, int64_t cols) {
  cu_weight w;
  memset(&w, 0, sizeof w);
  w.kind = CW_MXQ; w.rows = rows; w.cols = cols; w.bits = 4; w.gs = 32; w.qmode = SM_QMODE_MXFP4; w.dtype = SM_DT_U8;
  std::vector<uint32_t> q((size_t)(rows * cols / 8));
  std::vector<uint8_t> sc((size_t)(rows * cols / 32));
  for (auto &v : q) v = rnd() ^ (rnd() << 16);
  for (auto &v : sc) v = (uint8_t)(118 + rnd() % 7);
  CK(cudaMalloc(&w.q, q.size() * 4));
  CK(cudaMalloc(&w.sb, sc.size()));
  CK(cudaMemcpy(w.q, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w.sb, sc.data(), sc.size(), cudaMemcpyHostToDevice));
  return w;
}
static void test_mx4(cudaStream_t s) {
  int *dbad;
  CK(cudaMalloc(&dbad, 65536 * sizeof(int)));
  k_fp4_i8_probe<<<256, 256, 0, s>>>(dbad);
  std::vector<int> bad(65536);
  CK(cudaMemcpy(bad.data(), dbad, bad.size() * sizeof(int), cudaMemcpyDeviceToHost));
  long nb = 0;
  for (int v : bad) nb += v;
  CHECK(nb == 0, "mxq_fp4_i8x8: %ld of 524288 decoded values differ from twice mxq_fp4", nb);
  CK(cudaFree(dbad));
  /* gpt-oss-20b's experts: 2,880 wide (scale rows of 90 bytes), 4 slots a token, 2 tokens */
  enum { E = 3, KS = 4, NT = 2, NS = KS * NT };
  const int64_t F = 2880, D = 2880;
  cu_weight wg = make_mx4(E * F, D), wu = make_mx4(E * F, D), wd = make_mx4(E * D, F);
  CHECK(cu_experts_gu_ok(&wg, &wu, F) && cu_experts_dc_ok(&wd, D), "mxfp4 experts: no fused kernels");
  std::vector<float> x((size_t)NT * D), wts(NS);
  std::vector<int32_t> ids(NS);
  for (auto &v : x) v = 2.f * frnd() - 1.f;
  for (int i = 0; i < NS; i++) { ids[i] = (int32_t)(rnd() % E); wts[i] = frnd(); }
  ids[5] = ids[4]; /* a token with one expert twice */
  float *dx, *dh, *dg, *du, *dw, *dout, *dyd;
  int32_t *did;
  CK(cudaMalloc(&dx, x.size() * 4)); CK(cudaMalloc(&dw, NS * 4)); CK(cudaMalloc(&did, NS * 4));
  CK(cudaMalloc(&dh, NS * F * 4)); CK(cudaMalloc(&dg, NS * F * 4)); CK(cudaMalloc(&du, NS * F * 4));
  CK(cudaMalloc(&dout, NT * D * 4)); CK(cudaMalloc(&dyd, NS * D * 4));
  CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, wts.data(), NS * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(did, ids.data(), NS * 4, cudaMemcpyHostToDevice));
  cu_experts_gu(&g_cx, &wg, &wu, F, did, NT, KS, dx, dh);
  cu_rows_matvec(&g_cx, &wg, F, did, KS, dx, false, NULL, dg, NS);
  cu_rows_matvec(&g_cx, &wu, F, did, KS, dx, false, NULL, du, NS);
  CK(cudaStreamSynchronize(s));
  std::vector<float> h = get(dh, (size_t)NS * F), g = get(dg, (size_t)NS * F), u = get(du, (size_t)NS * F), hr(h.size());
  for (size_t i = 0; i < h.size(); i++) hr[i] = g[i] / (1.f + expf(-g[i])) * u[i];
  double e = rel_max(h, hr);
  /* the fused kernels quantize x to int16 per 32 values (the row kernel keeps it float) */
  CHECK(e < 1e-4, "mxfp4 experts gate/up+silu against the row kernel: rel err %g", e);
  printf("mxfp4 experts gate/up+silu: rel err %g against the row kernel\n", e);
  cu_experts_dc(&g_cx, &wd, D, did, dw, NT, KS, dh, NULL, dout);
  cu_rows_matvec(&g_cx, &wd, D, did, KS, dh, true, NULL, dyd, NS);
  CK(cudaStreamSynchronize(s));
  std::vector<float> o = get(dout, (size_t)NT * D), yd = get(dyd, (size_t)NS * D), orf((size_t)NT * D, 0.f);
  for (int t = 0; t < NT; t++)
    for (int j = 0; j < KS; j++)
      for (int64_t r = 0; r < D; r++) orf[t * D + r] += wts[t * KS + j] * yd[(t * KS + j) * D + r];
  e = rel_max(o, orf);
  CHECK(e < 1e-4, "mxfp4 experts down+combine against the row kernel: rel err %g", e);
  printf("mxfp4 experts down+combine: rel err %g against the row kernel\n", e);
  for (void *p : {(void *)dx, (void *)dw, (void *)did, (void *)dh, (void *)dg, (void *)du, (void *)dout, (void *)dyd,
                  wg.q, wg.sb, wu.q, wu.sb, wd.q, wd.sb})
    CK(cudaFree(p));
}

int main() {
  int n = 0, major = 0, minor = 0, nsm = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) { printf("SKIP: no CUDA device\n"); return 77; }
  CK(cudaSetDevice(0));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  cu_mlp_init(0);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cu_tune_defaults(major * 10 + minor, &g_tune);
  g_cx.s = s;
  g_cx.t = &g_tune;
  g_cx.carve = -1;
  g_cx.dev = 0;
  g_cx.n_sm = nsm;
  g_cx.arch = major * 10 + minor;
  g_cx.cnt = &g_cnt;
  test_mx4(s);
  test_norms(3, 2560, 1.f, s);  /* Gemma-3-4B's hidden size, (1 + w) */
  test_norms(2, 8192, 0.f, s);  /* two float4 a thread */
  test_norms(12, 256, 1.f, s);  /* head norms */
  test_norms(5, 100, 0.f, s);   /* dim not a multiple of 32: no int8 x */
  test_guq(14336, 4096, s, false); /* Llama-3.1-8B: k_mvr takes gate/up */
  test_guq(13824, 5120, s, true);  /* a 14B shape: k_mvr cannot (K = 5120) */
  test_guq(8192, 2048, s, false);  /* Llama-3.2-1B: gate weights below 32 Mi elements */
  test_guq(96, 512, s, false);
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
    test_mlp(14336, 4096, s); /* Llama-3.1-8B */
    test_mlp(8192, 2048, s);  /* Llama-3.2-1B */
    test_mlp(8192, 3072, s);  /* Llama-3.2-3B, Phi-4-mini */
    test_mlp(12288, 4096, s); /* Qwen3-8B */
    test_mlp(10240, 2560, s, true); /* Gemma-3-4B: gelu, K not a multiple of 1024 */
    test_mlp(15360, 3840, s, true); /* Gemma-3-12B */
  }
  printf("%d checks, %d failed\n", checks, fails);
  return fails ? 1 : 0;
}
