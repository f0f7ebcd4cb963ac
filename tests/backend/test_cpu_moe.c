/* The CPU backend's mixture-of-experts ops and microscaling weights, against references written here,
 * for every ISA this machine has and 1 or 2 threads:
 *   - matmul of mxfp4 / mxfp8 / nvfp4 weights (matvec and GEMM paths) vs a double product with the
 *     weights dequantized here from the definition (E8M0 2^(c-127), E4M3, the FP4 table);
 *   - moe_route on hand-built logits: softmax / top-k-softmax / sigmoid routing, ties to the lower index,
 *     the sigmoid correction choosing, group-limited choice, norm and scale;
 *   - matmul_experts (decode and grouped prefill, x shared or per slot, expert biases) vs per-slot double
 *     products, on a packed expert stack vs the canonical int8 product (bit for bit), and on 4-bit
 *     microscaling experts a token in a batch vs alone (bit for bit, where the ISA has mv_fp4); moe_combine,
 *     swiglu_clamp, sigmoid_gate_rows; attention_sinks vs a double softmax with the
 *     sink in its denominator (sinks above and below the scores).
 * Error bounds: matmuls |y - ref| <= 1e-5 * sum|x w| (mxfp4 rows of a multiple of 64 columns: plus what
 * rounding x to int16 per group may add, q16_err); elementwise and attention 1e-5 relative. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "../test_util.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double urand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

/* the definitions, written out independently of format/mxq.c */
static double e8m0(int c) { return c == 255 ? INFINITY : ldexp(1.0, c - 127); }
static double e4m3(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp((double)m, -9);
  return c & 128 ? -v : v;
}
static double fp4(int c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return c & 8 ? -mag[c & 7] : mag[c & 7];
}

typedef struct {
  sm_weight w;
  uint8_t *q, *s;
  double *deq;
} mxw;

static void make_mx(mxw *t, int mode, int64_t rows, int64_t cols) {
  const int bits = mode == SM_QMODE_MXFP8 ? 8 : 4, gs = mode == SM_QMODE_NVFP4 ? 16 : 32;
  const int64_t rb = cols * bits / 8, ng = cols / gs;
  t->q = malloc((size_t)(rows * rb));
  t->s = malloc((size_t)(rows * ng));
  t->deq = malloc(sizeof(double) * (size_t)(rows * cols));
  for (int64_t i = 0; i < rows * rb; i++) {
    int v = (int)(urand() * 256);
    if (bits == 8 && (v & 0x7F) > 0x60) v &= 0xBF; /* keep most E4M3 values moderate, some large */
    t->q[i] = (uint8_t)v;
  }
  for (int64_t i = 0; i < rows * ng; i++)
    t->s[i] = (uint8_t)(mode == SM_QMODE_NVFP4 ? 0x20 + (int)(urand() * 24) : 118 + (int)(urand() * 6));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) {
      const int sc = t->s[r * ng + j / gs];
      const double s = mode == SM_QMODE_NVFP4 ? e4m3(sc) : e8m0(sc);
      const int code = bits == 8 ? t->q[r * rb + j] : (t->q[r * rb + j / 2] >> (4 * (j & 1))) & 15;
      t->deq[r * cols + j] = s * (bits == 8 ? e4m3(code) : fp4(code));
    }
  t->w = (sm_weight){.rows = rows,
                     .cols = cols,
                     .bits = bits,
                     .group_size = gs,
                     .qmode = mode,
                     .dtype = SM_DT_U8,
                     .data = t->q,
                     .scales = t->s};
}
static void free_mx(mxw *t) {
  free(t->q);
  free(t->s);
  free(t->deq);
}

/* What rounding x to int16 per group of 32 may add to x . w (mxfp4 rows of a multiple of 64 columns, which the
 * AVX-512 VNNI kernel multiplies so): sum_k |w_k| * (the largest |x| of k's group) / 65534; 0 for the rest. */
static int g_fp4_runs; /* invariance checks of 4-bit microscaling experts that ran */
static double q16_err(const float *x, const double *w, int64_t K, int mode) {
  if (mode != SM_QMODE_MXFP4 || K % 64) return 0;
  double e = 0;
  for (int64_t g = 0; g < K / 32; g++) {
    double a = 0, sw = 0;
    for (int j = 0; j < 32; j++) {
      a = fmax(a, fabs(x[32 * g + j]));
      sw += fabs(w[32 * g + j]);
    }
    e += sw * a / 65534;
  }
  return e;
}

/* y = x . W^T against the double product of deq; returns the worst error relative to sum|x w| (plus 1e5 times
 * q16_err, so that the int16 kernel's rounding of x passes the 1e-5 bound and nothing more does) */
static double check_mm(sm_backend *be, const sm_weight *w, const double *deq, int n) {
  const int64_t M = w->rows, K = w->cols;
  float *x = malloc(sizeof(float) * (size_t)(n * K)), *y = malloc(sizeof(float) * (size_t)(n * M));
  for (int64_t i = 0; i < n * K; i++) x[i] = frand(-1.f, 1.f);
  be->matmul(be, SM_MM_OTHER, w, x, n, y);
  double worst = 0;
  for (int t = 0; t < n; t++)
    for (int64_t r = 0; r < M; r++) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; k++) {
        ref += (double)x[t * K + k] * deq[r * K + k];
        mag += fabs((double)x[t * K + k] * deq[r * K + k]);
      }
      const double e = fabs(y[t * M + r] - ref) / (mag + 1e5 * q16_err(x + t * K, deq + r * K, K, w->qmode) + 1e-30);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
  free(x);
  free(y);
  return worst;
}

static void test_mx_matmul(sm_backend *be, const char *tag) {
  static const int modes[] = {SM_QMODE_MXFP4, SM_QMODE_MXFP8, SM_QMODE_NVFP4};
  static const int64_t shapes[][2] = {{5, 64}, {37, 96}, {70, 640}, {33, 288}};
  static const int ns[] = {1, 2, 5, 9};
  for (int mi = 0; mi < 3; mi++)
    for (int si = 0; si < 4; si++) {
      mxw t;
      make_mx(&t, modes[mi], shapes[si][0], shapes[si][1]);
      CHECK(be->prepare_weight(be, &t.w) == SMELT_OK, "%s: prepare %s: %s", tag, sm_qmode_name((sm_qmode)modes[mi]),
            sm_errmsg());
      for (int k = 0; k < 4; k++) {
        const double e = check_mm(be, &t.w, t.deq, ns[k]);
        CHECK(e <= 1e-5, "%s: %s %lldx%lld n=%d rel err %.3g", tag, sm_qmode_name((sm_qmode)modes[mi]),
              (long long)shapes[si][0], (long long)shapes[si][1], ns[k], e);
      }
      /* a row view (stacked experts) reads its own rows and scales */
      const sm_weight v = sm_weight_rows(&t.w, 2, 3);
      const double e = check_mm(be, &v, t.deq + 2 * shapes[si][1], 1);
      CHECK(e <= 1e-5, "%s: %s row view rel err %.3g", tag, sm_qmode_name((sm_qmode)modes[mi]), e);
      free_mx(&t);
    }
  /* bad microscaling weights are refused */
  mxw t;
  make_mx(&t, SM_QMODE_MXFP4, 4, 64);
  t.w.group_size = 16;
  CHECK(be->prepare_weight(be, &t.w) != SMELT_OK, "%s: mxfp4 with group 16 accepted", tag);
  free_mx(&t);
}

static void route(sm_backend *be, const sm_moe_route *r, const float *logits, int32_t *ids, float *w) {
  be->moe_route(be, logits, 1, r, ids, w);
}

static void test_route(sm_backend *be, const char *tag) {
  int32_t ids[8];
  float w[8];
  /* softmax: the tie of experts 1 and 2 goes to the lower index first */
  const float l1[6] = {1, 3, 3, 0, 2, -1};
  double z = 0;
  for (int e = 0; e < 6; e++) z += exp(l1[e]);
  sm_moe_route r = {.kind = SM_ROUTE_SOFTMAX, .n_experts = 6, .top_k = 3, .scale = 1.f};
  route(be, &r, l1, ids, w);
  CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4, "%s: softmax ids %d %d %d", tag, ids[0], ids[1], ids[2]);
  CHECK(fabs(w[0] - exp(3) / z) < 1e-6 && fabs(w[2] - exp(2) / z) < 1e-6, "%s: softmax weights %g %g", tag, w[0], w[2]);
  r.norm = true;
  r.scale = 2.f;
  route(be, &r, l1, ids, w);
  const double s3 = 2 * exp(3) + exp(2);
  CHECK(fabs(w[0] - 2 * exp(3) / s3) < 1e-6 && fabs(w[2] - 2 * exp(2) / s3) < 1e-6, "%s: softmax norm/scale %g %g", tag,
        w[0], w[2]);
  /* Gemma 4: each chosen expert's weight times its own scale, after the renormalization */
  const float es[6] = {1, 0.5f, 3, 1, -2, 1};
  float *des = be->alloc(be, sizeof es);
  be->upload(be, des, es, sizeof es);
  r.expert_scale = des;
  r.scale = 1.f;
  route(be, &r, l1, ids, w);
  CHECK(ids[0] == 1 && fabs(w[0] - 0.5 * exp(3) / s3) < 1e-6 && fabs(w[1] - 3 * exp(3) / s3) < 1e-6 &&
          fabs(w[2] + 2 * exp(2) / s3) < 1e-6,
        "%s: expert scales %g %g %g", tag, w[0], w[1], w[2]);
  r.expert_scale = NULL;
  be->free(be, des);
  /* the top k of the logits, softmax over them */
  r = (sm_moe_route){.kind = SM_ROUTE_TOPK_SOFTMAX, .n_experts = 6, .top_k = 2, .scale = 1.f};
  const float l2[6] = {0.5f, -1, 4, 4, 1, 3.5f};
  route(be, &r, l2, ids, w);
  CHECK(ids[0] == 2 && ids[1] == 3 && fabs(w[0] - 0.5) < 1e-6 && fabs(w[1] - 0.5) < 1e-6, "%s: top-k softmax %d %d %g",
        tag, ids[0], ids[1], w[0]);
  r.top_k = 3;
  route(be, &r, l2, ids, w);
  const double z3 = 2 * exp(4) + exp(3.5);
  CHECK(ids[2] == 5 && fabs(w[2] - exp(3.5) / z3) < 1e-6, "%s: top-3 softmax %d %g", tag, ids[2], w[2]);
  /* sigmoid: the choice is sigmoid + correction, the weights sigmoid; 4 groups of 2, the 2 best groups
   * (by the sum of their two best choice scores) kept: groups 1 (0.8 + 0.7) and 3 (0.6 + 0.65), so expert 0
   * (0.9) is not chosen */
  const double target[8] = {0.9, 0.1, 0.8, 0.7, 0.85, 0.0, 0.6, 0.65};
  float l3[8], corr[8];
  for (int e = 0; e < 8; e++) {
    l3[e] = (float)(e - 3) * 0.7f;
    corr[e] = (float)(target[e] - 1 / (1 + exp(-(double)l3[e])));
  }
  float *dcorr = be->alloc(be, sizeof corr);
  be->upload(be, dcorr, corr, sizeof corr);
  r = (sm_moe_route){.kind = SM_ROUTE_SIGMOID,
                     .n_experts = 8,
                     .top_k = 3,
                     .norm = true,
                     .scale = 2.5f,
                     .correction = dcorr,
                     .n_group = 4,
                     .topk_group = 2};
  route(be, &r, l3, ids, w);
  CHECK(ids[0] == 2 && ids[1] == 3 && ids[2] == 7, "%s: group-limited sigmoid ids %d %d %d", tag, ids[0], ids[1],
        ids[2]);
  double sg[3], ssum = 0;
  for (int j = 0; j < 3; j++) ssum += sg[j] = 1 / (1 + exp(-(double)l3[ids[j] < 8 ? ids[j] : 0]));
  for (int j = 0; j < 3; j++)
    CHECK(fabs(w[j] - 2.5 * sg[j] / ssum) < 1e-6, "%s: sigmoid weight %d: %g want %g", tag, j, w[j],
          2.5 * sg[j] / ssum);
  /* without groups: expert 0 (0.9) first */
  r.n_group = r.topk_group = 1;
  route(be, &r, l3, ids, w);
  CHECK(ids[0] == 0 && ids[1] == 4 && ids[2] == 2, "%s: sigmoid ids %d %d %d", tag, ids[0], ids[1], ids[2]);
  be->free(be, dcorr);
}

/* W_e . x for slots, x shared or per slot, expert biases; n = 1 (decode) and 6 (grouped, padded GEMMs) */
static void test_experts(sm_backend *be, const char *tag) {
  enum { E = 5, R = 7, K = 64, KMAX = 3 };
  mxw t;
  make_mx(&t, SM_QMODE_MXFP4, E * R, K);
  float bias[E * R];
  for (int i = 0; i < E * R; i++) bias[i] = frand(-1, 1);
  float *db = be->alloc(be, sizeof bias);
  be->upload(be, db, bias, sizeof bias);
  CHECK(be->prepare_weight(be, &t.w) == SMELT_OK, "%s: prepare experts", tag);
  for (int ni = 0; ni < 2; ni++)
    for (int per_slot = 0; per_slot <= 1; per_slot++) {
      const int n = ni ? 6 : 1, k = 3, ns = n * k;
      int32_t ids[6 * KMAX];
      for (int s = 0; s < ns; s++) ids[s] = (int32_t)((s * 3 + s / 4) % E);
      float *x = malloc(sizeof(float) * (size_t)ns * K), *y = malloc(sizeof(float) * (size_t)ns * R);
      for (int i = 0; i < ns * K; i++) x[i] = frand(-1, 1);
      be->matmul_experts(be, SM_MM_EXPERT_GATE, &t.w, R, per_slot ? db : NULL, x, per_slot, n, k, ids, y);
      double worst = 0;
      for (int s = 0; s < ns; s++)
        for (int r = 0; r < R; r++) {
          const float *xs = x + (size_t)(per_slot ? s : s / k) * K;
          const double *wr = t.deq + (size_t)(ids[s] * R + r) * K;
          double ref = per_slot ? bias[ids[s] * R + r] : 0, mag = fabs(ref);
          for (int j = 0; j < K; j++) {
            ref += xs[j] * wr[j];
            mag += fabs(xs[j] * wr[j]);
          }
          const double e = fabs(y[s * R + r] - ref) / (mag + 1e5 * q16_err(xs, wr, K, t.w.qmode) + 1e-30);
          if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        }
      CHECK(worst <= 1e-5, "%s: matmul_experts n=%d per_slot=%d rel err %.3g", tag, n, per_slot, worst);
      free(x);
      free(y);
    }
  be->free(be, db);
  free_mx(&t);
  /* 4-bit microscaling experts that the kernel table's mv_fp4 takes (the others run matvecs below 4 tokens
   * and GEMMs above): a token's slots give the same floats in a batch of 9 tokens (each expert's rows read
   * once for all its tokens) as alone; mxfp4 over 21 groups (one odd: AVX-512's float kernel) and 22 (the
   * int16 kernels), nvfp4 (groups of 16) */
  const sm_cpu_kern *kern = sm_cpu_backend_kern(be);
  for (int mi = 0; kern->mv_fp4 && mi < 3; mi++) {
    enum { NB = 9, KS = 2, RR = 19 };
    const int64_t KK = mi == 1 ? 704 : 672;
    make_mx(&t, mi == 2 ? SM_QMODE_NVFP4 : SM_QMODE_MXFP4, E * RR, KK);
    if (!kern->fp4_ok(&t.w, sm_cpu_backend_exact(be))) {
      free_mx(&t);
      continue;
    }
    CHECK(be->prepare_weight(be, &t.w) == SMELT_OK, "%s: prepare experts", tag);
    int32_t ids[NB * KS];
    for (int s = 0; s < NB * KS; s++) ids[s] = (int32_t)((s * 7 + s / 3) % E);
    float *x = malloc(sizeof(float) * NB * (size_t)KK), *y = malloc(sizeof(float) * NB * KS * RR), y1[KS * RR];
    for (int i = 0; i < NB * KK; i++) x[i] = frand(-1, 1);
    be->matmul_experts(be, SM_MM_EXPERT_GATE, &t.w, RR, NULL, x, false, NB, KS, ids, y);
    bool same = true;
    for (int tk = 0; tk < NB; tk++) {
      be->matmul_experts(be, SM_MM_EXPERT_GATE, &t.w, RR, NULL, x + (size_t)tk * KK, false, 1, KS, ids + tk * KS, y1);
      same &= !memcmp(y1, y + (size_t)tk * KS * RR, sizeof y1);
    }
    CHECK(same, "%s: %s experts of %lld columns: a token's result in a batch of %d differs from its own", tag,
          mi == 2 ? "nvfp4" : "mxfp4", (long long)KK, NB);
    g_fp4_runs++;
    free(x);
    free(y);
    free_mx(&t);
  }
}

/* decode (1 or 2 tokens) on affine weights long enough for the int8-activation kernels: every slot the same
 * floats as a matmul of its expert's rows on its own (one dispatch for all slots changes no result) */
static void test_experts_batch(sm_backend *be, const char *tag) {
  enum { E = 5, R = 37, K = 1024, G = 64 };
  uint8_t *q = malloc((size_t)E * R * K / 2);
  uint16_t *sc = malloc(sizeof(uint16_t) * E * R * (K / G)), *bi = malloc(sizeof(uint16_t) * E * R * (K / G));
  for (size_t i = 0; i < (size_t)E * R * K / 2; i++) q[i] = (uint8_t)(urand() * 256);
  for (size_t i = 0; i < (size_t)E * R * (K / G); i++) {
    sc[i] = sm_f32_to_bf16(frand(0.001f, 0.01f));
    bi[i] = sm_f32_to_bf16(frand(-0.05f, 0.0f));
  }
  const sm_weight w =
    {.rows = E * R, .cols = K, .bits = 4, .group_size = G, .dtype = SM_DT_BF16, .data = q, .scales = sc, .biases = bi};
  for (int n = 1; n <= 2; n++) {
    const int k = 3, ns = n * k;
    int32_t ids[6] = {4, 0, 2, 2, 1, 4};
    float x[2 * K], y[6 * R], yr[R];
    for (int i = 0; i < n * K; i++) x[i] = frand(-1, 1);
    be->matmul_experts(be, SM_MM_EXPERT_UP, &w, R, NULL, x, false, n, k, ids, y);
    bool same = true;
    for (int s = 0; s < ns; s++) {
      const sm_weight v = sm_weight_rows(&w, (int64_t)ids[s] * R, R);
      be->matmul(be, SM_MM_OTHER, &v, x + (size_t)(s / k) * K, 1, yr);
      same &= !memcmp(yr, y + (size_t)s * R, sizeof yr);
    }
    CHECK(same, "%s: decode matmul_experts (n=%d) differs from the experts' own matmuls", tag, n);
  }
  free(q);
  free(sc);
  free(bi);
}

static void test_elementwise(sm_backend *be, const char *tag) {
  enum { N = 3, KK = 4, D = 33 };
  float y[N * KK * D], wts[N * KK], out[N * D];
  for (int i = 0; i < N * KK * D; i++) y[i] = frand(-2, 2);
  for (int i = 0; i < N * KK; i++) wts[i] = frand(0, 1);
  be->moe_combine(be, out, y, wts, N, KK, D);
  double worst = 0;
  for (int t = 0; t < N; t++)
    for (int d = 0; d < D; d++) {
      double ref = 0;
      for (int j = 0; j < KK; j++) ref += (double)wts[t * KK + j] * y[(t * KK + j) * D + d];
      worst = fmax(worst, fabs(out[t * D + d] - ref) / fmax(1, fabs(ref)));
    }
  CHECK(worst < 1e-5, "%s: moe_combine err %g", tag, worst);
  /* clamped SwiGLU: values on both sides of the limits */
  enum { M = 64 };
  float g[M], u[M], o[M];
  for (int i = 0; i < M; i++) {
    g[i] = frand(-12, 12);
    u[i] = frand(-12, 12);
  }
  be->swiglu_clamp(be, o, g, u, M, 1.702f, 7.f);
  worst = 0;
  for (int i = 0; i < M; i++) {
    const double gc = fmin(g[i], 7.0), uc = fmax(fmin(u[i], 7.0), -7.0);
    const double ref = gc / (1 + exp(-1.702 * gc)) * (uc + 1);
    worst = fmax(worst, fabs(o[i] - ref) / fmax(1, fabs(ref)));
  }
  CHECK(worst < 1e-5, "%s: swiglu_clamp err %g", tag, worst);
  float yy[N * D], gg[N] = {-3, 0, 2.5f};
  memcpy(yy, out, sizeof yy);
  be->sigmoid_gate_rows(be, yy, gg, N, D);
  worst = 0;
  for (int t = 0; t < N; t++)
    for (int d = 0; d < D; d++) {
      const double ref = out[t * D + d] / (1 + exp(-(double)gg[t]));
      worst = fmax(worst, fabs(yy[t * D + d] - ref) / fmax(1, fabs(ref)));
    }
  CHECK(worst < 1e-5, "%s: sigmoid_gate_rows err %g", tag, worst);
}

/* attention_sinks: one sequence, a prefill of P positions with a window on some calls */
static void test_sinks(sm_backend *be, const char *tag) {
  enum { NH = 4, NKV = 2, HD = 32, BS = 16, NB = 4, P = 40 };
  const int KW = NKV * HD;
  sm_kv_cache kv =
    {.n_layers = 1, .n_kv_heads = NKV, .head_dim = HD, .block_size = BS, .n_blocks = NB, .dtype = SM_DT_F32};
  void *kk = be->alloc(be, sizeof(float) * NB * BS * KW), *vv = be->alloc(be, sizeof(float) * NB * BS * KW);
  kv.k = &kk;
  kv.v = &vv;
  int32_t tok[P] = {0}, pos[P], seq[P] = {0}, table[NB] = {2, 0, 3, 1};
  for (int p = 0; p < P; p++) pos[p] = p;
  sm_batch b =
    {.n_tokens = P, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 1, .max_blocks = NB, .block_table = table};
  CHECK(be->set_batch(be, &b) == SMELT_OK, "%s: set_batch", tag);
  float *K = malloc(sizeof(float) * P * KW), *V = malloc(sizeof(float) * P * KW),
        *q = malloc(sizeof(float) * P * NH * HD);
  float *out = malloc(sizeof(float) * P * NH * HD);
  for (int i = 0; i < P * KW; i++) {
    K[i] = frand(-1, 1);
    V[i] = frand(-1, 1);
  }
  for (int i = 0; i < P * NH * HD; i++) q[i] = frand(-1, 1);
  be->kv_store(be, &kv, 0, K, V);
  const float sinks[NH] = {-30.f, 0.f, 1.5f, 40.f}; /* negligible, moderate, above every score */
  float *ds = be->alloc(be, sizeof sinks);
  be->upload(be, ds, sinks, sizeof sinks);
  for (int c = 0; c < 2; c++) {
    const int window = c ? 7 : 0;
    const float scale = 0.4f;
    be->attention_sinks(be, out, q, &kv, 0, NH, scale, window, 0.f, ds);
    double worst = 0;
    for (int t = 0; t < P; t++)
      for (int h = 0; h < NH; h++) {
        const int kvh = h / (NH / NKV), lo = window && t - window + 1 > 0 ? t - window + 1 : 0;
        double s[P], m = sinks[h], l = 0, o[HD] = {0};
        for (int p = lo; p <= t; p++) {
          s[p] = 0;
          for (int d = 0; d < HD; d++) s[p] += (double)q[(t * NH + h) * HD + d] * K[p * KW + kvh * HD + d];
          s[p] *= scale;
          m = fmax(m, s[p]);
        }
        for (int p = lo; p <= t; p++) {
          const double e = exp(s[p] - m);
          l += e;
          for (int d = 0; d < HD; d++) o[d] += e * V[p * KW + kvh * HD + d];
        }
        l += exp(sinks[h] - m);
        for (int d = 0; d < HD; d++) worst = fmax(worst, fabs(out[(t * NH + h) * HD + d] - o[d] / l));
      }
    CHECK(worst < 1e-5, "%s: attention_sinks window %d err %g", tag, window, worst);
  }
  be->free(be, ds);
  be->free(be, kk);
  be->free(be, vv);
  free(K);
  free(V);
  free(q);
  free(out);
}

/* prepare_weight packs a wide quantized weight for the int8 path (backends with int8 kernels, not
 * SMELT_CPU_EXACT), expert stacks too, and matmul_experts then runs each chosen expert's row blocks of the
 * packed copy: every slot (decode: one dispatch; a batch: a GEMM an expert) gives the canonical int8 result
 * of its expert's rows (sm_cpu_i8_ref, bit for bit). g_packed: configurations that packed (must be > 0). */
static int g_packed;
static void test_stack_packed(sm_backend *be, const char *tag) {
  /* R: 13 row blocks an expert, so that a decode dispatch's chunks take several (and a remainder) */
  enum { E = 4, R = 208, C = 1024, GS = 64, KS = 2 };
  uint8_t *q = calloc((size_t)E * R * C / 2, 1);
  uint16_t *s = malloc(sizeof(uint16_t) * E * R * (C / GS)), *b = malloc(sizeof(uint16_t) * E * R * (C / GS));
  for (size_t i = 0; i < (size_t)E * R * C / 2; i++) q[i] = (uint8_t)(urand() * 256);
  for (int i = 0; i < E * R * (C / GS); i++) {
    s[i] = sm_f32_to_f16(frand(0.002f, 0.01f));
    b[i] = sm_f32_to_f16(frand(-0.04f, 0.f));
  }
  for (int stacked = 1; stacked >= 0; stacked--) {
    sm_weight w = {.rows = E * R,
                   .cols = C,
                   .bits = 4,
                   .group_size = GS,
                   .dtype = SM_DT_F16,
                   .data = q,
                   .scales = s,
                   .biases = b,
                   .stacked = stacked};
    CHECK(be->prepare_weight(be, &w) == SMELT_OK, "%s: prepare", tag);
    g_packed += w.dev != NULL;
    if (stacked && w.dev) {
      for (int ni = 0; ni < 3; ni++) {
        const int n = ni == 0 ? 1 : ni == 1 ? 2 : 6, ns = n * KS; /* 6: a GEMM an expert */
        int32_t ids[12];
        for (int i = 0; i < ns; i++) ids[i] = (int32_t)((i * 3 + i / 3) % E);
        float *x = malloc(sizeof(float) * (size_t)ns * C), *y = malloc(sizeof(float) * (size_t)ns * R), yr[R];
        for (int i = 0; i < ns * C; i++) x[i] = frand(-1, 1);
        for (int per_slot = 0; per_slot <= 1; per_slot++) {
          be->matmul_experts(be, SM_MM_EXPERT_UP, &w, R, NULL, x, per_slot, n, KS, ids, y);
          bool same = true;
          for (int sl = 0; sl < ns; sl++) {
            const sm_weight v = sm_weight_rows(&w, (int64_t)ids[sl] * R, R);
            sm_cpu_i8_ref(&v, x + (size_t)(per_slot ? sl : sl / KS) * C, 1, yr);
            same &= !memcmp(yr, y + (size_t)sl * R, sizeof yr);
          }
          CHECK(same, "%s: packed experts n=%d per_slot=%d differ from the canonical int8 product", tag, n, per_slot);
        }
        free(x);
        free(y);
      }
    }
    be->release_weight(be, &w);
  }
  free(q);
  free(s);
  free(b);
}

int main(void) {
  static const char *isas[] = {"scalar", "avx2", "avx512"};
  int ran = 0;
  for (int i = 0; i < 3; i++) {
    if (!sm_cpu_kernels_by_name(isas[i])) continue;
    setenv("SMELT_CPU_ISA", isas[i], 1);
    for (int nth = 1; nth <= 4; nth++) { /* 3, 4: 1, 2 threads with int8 activations in decode matvecs */
      if (nth <= 2) setenv("SMELT_CPU_EXACT", "1", 1);
      else unsetenv("SMELT_CPU_EXACT");
      sm_backend *be = sm_cpu_backend_create(nth <= 2 ? nth : nth - 2);
      CHECK(be != NULL, "create %s", isas[i]);
      if (!be) continue;
      char tag[32];
      snprintf(tag, sizeof tag, "%s/%d%s", isas[i], nth <= 2 ? nth : nth - 2, nth <= 2 ? " exact" : "");
      test_mx_matmul(be, tag);
      test_route(be, tag);
      test_experts(be, tag);
      test_experts_batch(be, tag);
      test_elementwise(be, tag);
      test_sinks(be, tag);
      test_stack_packed(be, tag);
      be->destroy(be);
      ran++;
    }
  }
  unsetenv("SMELT_CPU_ISA");
  unsetenv("SMELT_CPU_EXACT");
  CHECK(ran > 0, "no ISA ran");
  CHECK(g_packed > 0, "no configuration packed a wide 4-bit weight (the packed-expert check proved nothing)");
  CHECK(!sm_cpu_kernels_by_name("avx2") || g_fp4_runs > 0, "no 4-bit microscaling invariance check ran");
  TEST_END();
}
