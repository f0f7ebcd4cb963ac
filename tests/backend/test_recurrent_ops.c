/* The CPU backend's ops of recurrent (hybrid) models against plain double-precision references
 * written from the definitions in backend.h: causal depthwise convolution, Mamba-2 selective scan,
 * gated delta rule, gated RMSNorm and the small element-wise ops.
 *
 * The state ops run two sequences through three batches of mixed lengths (prefill chunks and one-token
 * steps, in varying order within the batch, in state slots 2 and 0 of three), after the state buffers
 * were filled with garbage: a sequence starting at position 0 must start from a zero state, one that
 * continues must carry its state over, and the outputs must equal the references computed over each
 * whole sequence at once. With 1 and 3 threads. Bound: |y - ref| <= 2e-5 * (1 + |ref|) (float
 * accumulation over at most a few hundred terms per output). */
#include "backend/backend.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static double urand(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }
static void fill(float *p, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
}
static double dsilu(double x) { return x / (1 + exp(-x)); }
static double dsoftplus(double x) { return x > 20 ? x : log1p(exp(x)); }

static double g_worst;
static void cmp(const char *what, const float *got, const double *ref, size_t n) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs(got[i] - ref[i]) / (1 + fabs(ref[i]));
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  if (worst > g_worst) g_worst = worst;
  CHECK(worst <= 2e-5, "%s: element %zu: got %.7g want %.7g (rel err %.3g)", what, at, got[at], ref[at], worst);
}

/* ---- the batches: sequences A (7 tokens, slot 2) and B (5 tokens, slot 0) in three steps ---- */
enum { LA = 7, LB = 5, NSTEP = 3 };
static const int k_take[NSTEP][2] = {{4, 1}, {1, 4}, {2, 0}}; /* tokens of A, B per step */
static const bool k_b_first[NSTEP] = {false, true, false};    /* B's run before A's */
static const int32_t k_slot[2] = {2, 0};

typedef struct {
  int n, seq_len[2], done[2];
  int32_t tok[LA + LB], pos[LA + LB], seq[LA + LB];
  int src[LA + LB]; /* token t of the batch is token src[t] of sequence seq[t] */
  sm_batch b;
} step_t;

static void make_step(step_t *s, int k, const int done[2]) {
  memset(s, 0, sizeof *s);
  for (int j = 0; j < 2; j++) {
    const int q = k_b_first[k] ? 1 - j : j;
    for (int i = 0; i < k_take[k][q]; i++) {
      s->seq[s->n] = q;
      s->pos[s->n] = done[q] + i;
      s->src[s->n] = done[q] + i;
      s->tok[s->n] = 0;
      s->n++;
    }
  }
  s->b =
    (sm_batch){.n_tokens = s->n, .tokens = s->tok, .pos = s->pos, .seq = s->seq, .n_seqs = 2, .state_slot = k_slot};
}

/* a cache of one recurrent layer with three slots of garbage */
static sm_kv_cache make_cache(sm_backend *be, size_t conv_floats, size_t ssm_floats) {
  sm_kv_cache kv;
  memset(&kv, 0, sizeof kv);
  kv.n_layers = 1;
  kv.n_slots = 3;
  kv.conv_floats = conv_floats;
  kv.ssm_floats = ssm_floats;
  kv.conv = calloc(1, sizeof(float *));
  kv.ssm = calloc(1, sizeof(float *));
  kv.conv[0] = be->alloc(be, sizeof(float) * (conv_floats ? conv_floats : 1) * 3);
  kv.ssm[0] = be->alloc(be, sizeof(float) * (ssm_floats ? ssm_floats : 1) * 3);
  float *g = malloc(sizeof(float) * 3 * (conv_floats + ssm_floats + 1));
  fill(g, 3 * (conv_floats + ssm_floats + 1), 50.f, 90.f);
  be->upload(be, kv.conv[0], g, sizeof(float) * conv_floats * 3);
  be->upload(be, kv.ssm[0], g, sizeof(float) * ssm_floats * 3);
  free(g);
  return kv;
}
static void free_cache(sm_backend *be, sm_kv_cache *kv) {
  be->free(be, kv->conv[0]);
  be->free(be, kv->ssm[0]);
  free(kv->conv);
  free(kv->ssm);
}

/* rows of a step's tokens gathered from the whole sequences' inputs (row floats each) */
static float *gather(const step_t *s, const float *xa, const float *xb, int row) {
  float *o = malloc(sizeof(float) * (size_t)(s->n ? s->n : 1) * row);
  for (int t = 0; t < s->n; t++)
    memcpy(o + (size_t)t * row, (s->seq[t] ? xb : xa) + (size_t)s->src[t] * row, sizeof(float) * row);
  return o;
}
static void scatter(const step_t *s, const float *y, float *ya, float *yb, int row) {
  for (int t = 0; t < s->n; t++)
    memcpy((s->seq[t] ? yb : ya) + (size_t)s->src[t] * row, y + (size_t)t * row, sizeof(float) * row);
}

/* ---------------- conv1d ---------------- */
static void ref_conv(const float *x, int L, const float *w, const float *bias, int C, int K, bool act, double *out) {
  for (int t = 0; t < L; t++)
    for (int c = 0; c < C; c++) {
      double acc = bias ? bias[c] : 0;
      for (int j = 0; j < K; j++) {
        const int src = t + j - (K - 1);
        if (src >= 0) acc += (double)w[c * K + j] * x[(size_t)src * C + c];
      }
      out[(size_t)t * C + c] = act ? dsilu(acc) : acc;
    }
}

static void test_conv1d(sm_backend *be, bool act, bool with_bias) {
  const int C = 37, K = 4;
  float *w = malloc(sizeof(float) * C * K), bias[37], *xa = malloc(sizeof(float) * LA * C),
        *xb = malloc(sizeof(float) * LB * C);
  fill(w, C * K, -1, 1);
  fill(bias, C, -0.5f, 0.5f);
  fill(xa, LA * C, -2, 2);
  fill(xb, LB * C, -2, 2);
  sm_kv_cache kv = make_cache(be, (size_t)(K - 1) * C, 0);
  float *ya = calloc(LA * C, sizeof(float)), *yb = calloc(LB * C, sizeof(float));
  int done[2] = {0, 0};
  for (int k = 0; k < NSTEP; k++) {
    step_t s;
    make_step(&s, k, done);
    CHECK(be->set_batch(be, &s.b) == SMELT_OK, "set_batch: %s", smelt_last_error());
    float *x = gather(&s, xa, xb, C), *y = malloc(sizeof(float) * (size_t)(s.n ? s.n : 1) * C);
    be->conv1d(be, y, x, w, with_bias ? bias : NULL, C, K, act, &kv, 0);
    be->sync(be);
    scatter(&s, y, ya, yb, C);
    free(x);
    free(y);
    done[0] += k_take[k][0];
    done[1] += k_take[k][1];
  }
  double *ra = malloc(sizeof(double) * LA * C), *rb = malloc(sizeof(double) * LB * C);
  ref_conv(xa, LA, w, with_bias ? bias : NULL, C, K, act, ra);
  ref_conv(xb, LB, w, with_bias ? bias : NULL, C, K, act, rb);
  cmp("conv1d A", ya, ra, LA * C);
  cmp("conv1d B", yb, rb, LB * C);
  /* the state: each sequence's last K-1 inputs, [K-1][C] */
  float st[3 * 3 * 37];
  be->download(be, st, kv.conv[0], sizeof(float) * 3 * (K - 1) * C);
  double want[3 * 37];
  for (int j = 0; j < K - 1; j++)
    for (int c = 0; c < C; c++) want[j * C + c] = xa[(size_t)(LA - (K - 1) + j) * C + c];
  cmp("conv1d state A", st + 2 * (K - 1) * C, want, (size_t)(K - 1) * C);
  free(w);
  free(xa);
  free(xb);
  free(ya);
  free(yb);
  free(ra);
  free(rb);
  free_cache(be, &kv);
}

/* ---------------- Mamba-2 selective scan ---------------- */
enum { MH = 4, MP = 8, MG = 2, MN = 16, MLD = MH * MP + 2 * MG * MN + 5 };
static void ref_scan(const float *xbc, const float *dt_in, int L, const float *dt_bias, const float *A_log,
                     const float *D, float dt_min, float dt_max, double *y) {
  const float *x0 = xbc, *B0 = xbc + MH * MP, *C0 = xbc + MH * MP + MG * MN;
  for (int h = 0; h < MH; h++) {
    double S[MP][MN];
    memset(S, 0, sizeof S);
    const int g = h / (MH / MG);
    for (int t = 0; t < L; t++) {
      double dt = dsoftplus((double)dt_in[t * MH + h] + dt_bias[h]);
      dt = fmin(fmax(dt, dt_min), dt_max);
      const double dA = exp(-exp((double)A_log[h]) * dt);
      for (int p = 0; p < MP; p++) {
        const double xv = x0[(size_t)t * MLD + h * MP + p];
        double acc = 0;
        for (int k = 0; k < MN; k++) {
          S[p][k] = dA * S[p][k] + dt * xv * B0[(size_t)t * MLD + g * MN + k];
          acc += S[p][k] * C0[(size_t)t * MLD + g * MN + k];
        }
        y[(size_t)t * MH * MP + h * MP + p] = acc + D[h] * xv;
      }
    }
  }
}

static void test_ssm_scan(sm_backend *be, float dt_min, float dt_max) {
  float xa[LA * MLD], xb[LB * MLD], da[LA * MH], db[LB * MH], dt_bias[MH], A_log[MH], D[MH];
  fill(xa, LA * MLD, -1.5f, 1.5f);
  fill(xb, LB * MLD, -1.5f, 1.5f);
  fill(da, LA * MH, -3, 3);
  fill(db, LB * MH, -3, 3);
  fill(dt_bias, MH, -2, 1);
  fill(A_log, MH, -1, 2);
  fill(D, MH, 0.5f, 1.5f);
  sm_kv_cache kv = make_cache(be, 1, (size_t)MH * MP * MN);
  float ya[LA * MH * MP], yb[LB * MH * MP];
  int done[2] = {0, 0};
  for (int k = 0; k < NSTEP; k++) {
    step_t s;
    make_step(&s, k, done);
    CHECK(be->set_batch(be, &s.b) == SMELT_OK, "set_batch: %s", smelt_last_error());
    float *x = gather(&s, xa, xb, MLD), *dt = gather(&s, da, db, MH);
    float *y = malloc(sizeof(float) * (size_t)(s.n ? s.n : 1) * MH * MP);
    be->ssm_scan(be, y, x, x + MH * MP, x + MH * MP + MG * MN, MLD, dt, dt_bias, A_log, D, MH, MP, MG, MN, dt_min,
                 dt_max, &kv, 0);
    be->sync(be);
    scatter(&s, y, ya, yb, MH * MP);
    free(x);
    free(dt);
    free(y);
    done[0] += k_take[k][0];
    done[1] += k_take[k][1];
  }
  double ra[LA * MH * MP], rb[LB * MH * MP];
  ref_scan(xa, da, LA, dt_bias, A_log, D, dt_min, dt_max, ra);
  ref_scan(xb, db, LB, dt_bias, A_log, D, dt_min, dt_max, rb);
  cmp("ssm_scan A", ya, ra, LA * MH * MP);
  cmp("ssm_scan B", yb, rb, LB * MH * MP);
  free_cache(be, &kv);
}

/* ---------------- gated delta rule ---------------- */
enum { GHK = 2, GHV = 4, GDK = 16, GDV = 8, GLD = 2 * GHK * GDK + GHV * GDV + 3 };
static void ref_gdn(const float *qkv, const float *a, const float *b, int L, const float *A_log, const float *dt_bias,
                    double *y) {
  for (int h = 0; h < GHV; h++) {
    double S[GDV][GDK];
    memset(S, 0, sizeof S);
    const int hk = h / (GHV / GHK);
    for (int t = 0; t < L; t++) {
      const float *q = qkv + (size_t)t * GLD + hk * GDK, *k = qkv + (size_t)t * GLD + GHK * GDK + hk * GDK;
      const float *v = qkv + (size_t)t * GLD + 2 * GHK * GDK + h * GDV;
      double qn[GDK], kn[GDK], sq = 0, sk = 0;
      for (int j = 0; j < GDK; j++) {
        sq += (double)q[j] * q[j];
        sk += (double)k[j] * k[j];
      }
      for (int j = 0; j < GDK; j++) {
        qn[j] = q[j] / sqrt(sq + 1e-6) / sqrt((double)GDK);
        kn[j] = k[j] / sqrt(sk + 1e-6);
      }
      const double g = exp(-exp((double)A_log[h]) * dsoftplus((double)a[t * GHV + h] + dt_bias[h]));
      const double beta = 1 / (1 + exp(-(double)b[t * GHV + h]));
      for (int i = 0; i < GDV; i++) {
        double kv = 0;
        for (int j = 0; j < GDK; j++) {
          S[i][j] *= g;
          kv += S[i][j] * kn[j];
        }
        const double d = beta * (v[i] - kv);
        double o = 0;
        for (int j = 0; j < GDK; j++) {
          S[i][j] += d * kn[j];
          o += S[i][j] * qn[j];
        }
        y[(size_t)t * GHV * GDV + h * GDV + i] = o;
      }
    }
  }
}

static void test_gated_delta(sm_backend *be) {
  float xa[LA * GLD], xb[LB * GLD], aa[LA * GHV], ab[LB * GHV], ba[LA * GHV], bb[LB * GHV], A_log[GHV], dt_bias[GHV];
  fill(xa, LA * GLD, -1, 1);
  fill(xb, LB * GLD, -1, 1);
  fill(aa, LA * GHV, -3, 3);
  fill(ab, LB * GHV, -3, 3);
  fill(ba, LA * GHV, -3, 3);
  fill(bb, LB * GHV, -3, 3);
  fill(A_log, GHV, -2, 1.5f);
  fill(dt_bias, GHV, -1, 1);
  sm_kv_cache kv = make_cache(be, 1, (size_t)GHV * GDV * GDK);
  float ya[LA * GHV * GDV], yb[LB * GHV * GDV];
  int done[2] = {0, 0};
  for (int k = 0; k < NSTEP; k++) {
    step_t s;
    make_step(&s, k, done);
    CHECK(be->set_batch(be, &s.b) == SMELT_OK, "set_batch: %s", smelt_last_error());
    float *x = gather(&s, xa, xb, GLD), *a = gather(&s, aa, ab, GHV), *b = gather(&s, ba, bb, GHV);
    float *y = malloc(sizeof(float) * (size_t)(s.n ? s.n : 1) * GHV * GDV);
    be->gated_delta(be, y, x, x + GHK * GDK, x + 2 * GHK * GDK, GLD, a, b, A_log, dt_bias, GHK, GHV, GDK, GDV, &kv, 0);
    be->sync(be);
    scatter(&s, y, ya, yb, GHV * GDV);
    free(x);
    free(a);
    free(b);
    free(y);
    done[0] += k_take[k][0];
    done[1] += k_take[k][1];
  }
  double ra[LA * GHV * GDV], rb[LB * GHV * GDV];
  ref_gdn(xa, aa, ba, LA, A_log, dt_bias, ra);
  ref_gdn(xb, ab, bb, LB, A_log, dt_bias, rb);
  cmp("gated_delta A", ya, ra, LA * GHV * GDV);
  cmp("gated_delta B", yb, rb, LB * GHV * GDV);
  free_cache(be, &kv);
}

/* ---------------- gated RMSNorm, element-wise ops ---------------- */
static void test_gated_rmsnorm(sm_backend *be, bool norm_first, int group, bool per_element) {
  enum { N = 5, DIM = 48 };
  const int wdim = per_element ? DIM : group;
  float x[N * DIM], z[N * DIM], w[DIM], out[N * DIM];
  double ref[N * DIM];
  fill(x, N * DIM, -2, 2);
  fill(z, N * DIM, -3, 3);
  fill(w, DIM, 0.5f, 1.5f);
  for (int r = 0; r < N; r++)
    for (int g0 = 0; g0 < DIM; g0 += group) {
      double ss = 0, v[DIM];
      for (int i = g0; i < g0 + group; i++) {
        v[i] = norm_first ? x[r * DIM + i] : x[r * DIM + i] * dsilu(z[r * DIM + i]);
        ss += v[i] * v[i];
      }
      const double inv = 1 / sqrt(ss / group + 1e-5);
      for (int i = g0; i < g0 + group; i++)
        ref[r * DIM + i] = v[i] * inv * w[i % wdim] * (norm_first ? dsilu(z[r * DIM + i]) : 1);
    }
  memcpy(out, x, sizeof out);
  be->gated_rmsnorm(be, out, out, z, w, N, DIM, group, wdim, 1e-5f, norm_first); /* in place */
  be->sync(be);
  cmp(norm_first ? "gated_rmsnorm (norm, gate)" : "gated_rmsnorm (gate, norm)", out, ref, N * DIM);
}

static void test_elementwise(sm_backend *be) {
  enum { N = 1000 };
  float a[N], b[N], y[N];
  double ref[N];
  fill(a, N, -4, 4);
  fill(b, N, -4, 4);
  be->mul(be, y, a, b, N);
  be->sync(be);
  for (int i = 0; i < N; i++) ref[i] = (double)a[i] * b[i];
  cmp("mul", y, ref, N);
  memcpy(y, a, sizeof y);
  be->sigmoid_mul(be, y, b, N);
  be->sync(be);
  for (int i = 0; i < N; i++) ref[i] = a[i] / (1 + exp(-(double)b[i]));
  cmp("sigmoid_mul", y, ref, N);
  memcpy(y, a, sizeof y);
  be->relu2(be, y, N);
  be->sync(be);
  for (int i = 0; i < N; i++) ref[i] = a[i] > 0 ? (double)a[i] * a[i] : 0;
  cmp("relu2", y, ref, N);
  float *d = be->alloc(be, sizeof a), *e = be->alloc(be, sizeof a);
  be->upload(be, d, a, sizeof a);
  be->copy(be, e, d, sizeof a);
  be->download(be, y, e, sizeof y);
  CHECK(!memcmp(y, a, sizeof a), "copy");
  be->free(be, d);
  be->free(be, e);
}

int main(void) {
  for (int nth = 1; nth <= 3; nth += 2) {
    sm_backend *be = sm_cpu_backend_create(nth);
    CHECK(be != NULL, "cpu backend");
    if (!be) break;
    g_worst = 0;
    test_conv1d(be, true, true);
    test_conv1d(be, false, false);
    test_ssm_scan(be, 0.f, INFINITY);
    test_ssm_scan(be, 0.05f, 2.0f); /* the time-step limits clamp */
    test_gated_delta(be);
    test_gated_rmsnorm(be, true, 16, false);
    test_gated_rmsnorm(be, false, 12, true);
    test_gated_rmsnorm(be, false, 48, true);
    test_elementwise(be);
    /* the recurrent ops' batch rule: a sequence's tokens in one run of consecutive positions */
    int32_t tok[3] = {0, 0, 0}, pos[3] = {0, 0, 1}, seq[3] = {0, 1, 0}, slots[2] = {0, 1};
    sm_batch bad = {.n_tokens = 3, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 2, .state_slot = slots};
    CHECK(be->set_batch(be, &bad) != SMELT_OK, "a sequence split in two runs is refused");
    printf("threads %d: worst rel err %.3g\n", nth, g_worst);
    be->destroy(be);
  }
  TEST_END();
}
