/* The CPU backend's ops with explicit shapes (attention_seg, rope_axes, gelu, gather_rows, copy)
 * against direct float64 formulas. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"
#include "backend/backend.h"

static uint64_t rng = 88172645463325252ULL;
static float frand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}
static void fill(float *x, size_t n, float s) {
  for (size_t i = 0; i < n; i++) x[i] = frand() * s;
}

static double max_abs(const float *a, const double *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
  return m;
}

static void test_attention_seg(sm_backend *be, int n, int nh, int nkv, int hd, const int32_t *seg, int n_seg) {
  const size_t nq = (size_t)n * nh * hd, nk = (size_t)n * nkv * hd;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *out = malloc(nq * 4);
  double *ref = calloc(nq, sizeof(double)), *p = malloc(sizeof(double) * (size_t)n);
  fill(q, nq, 2.f);
  fill(k, nk, 2.f);
  fill(v, nk, 1.f);
  const float scale = 1.f / sqrtf((float)hd);
  be->attention_seg(be, out, q, k, v, n, nh, nkv, hd, scale, seg, n_seg);
  for (int s = 0; s < n_seg; s++)
    for (int t = seg[s]; t < seg[s + 1]; t++)
      for (int h = 0; h < nh; h++) {
        const int g = h / (nh / nkv);
        double mx = -INFINITY, sum = 0;
        for (int j = seg[s]; j < seg[s + 1]; j++) {
          double d = 0;
          for (int e = 0; e < hd; e++)
            d += (double)q[((size_t)t * nh + h) * hd + e] * k[((size_t)j * nkv + g) * hd + e];
          p[j] = d * scale;
          mx = fmax(mx, p[j]);
        }
        for (int j = seg[s]; j < seg[s + 1]; j++) sum += (p[j] = exp(p[j] - mx));
        for (int j = seg[s]; j < seg[s + 1]; j++)
          for (int e = 0; e < hd; e++)
            ref[((size_t)t * nh + h) * hd + e] += p[j] / sum * v[((size_t)j * nkv + g) * hd + e];
      }
  const double err = max_abs(out, ref, nq);
  CHECK(err < 2e-5, "attention_seg n %d heads %d/%d hd %d, %d segments: max err %g", n, nh, nkv, hd, n_seg, err);
  free(q);
  free(k);
  free(v);
  free(out);
  free(ref);
  free(p);
}

static void test_rope_axes(sm_backend *be) {
  const int n = 7, nh = 3, hd = 20, rot = 16, half = rot / 2, na = 3;
  float *x = malloc(sizeof(float) * n * nh * hd), *x0 = malloc(sizeof(float) * n * nh * hd), inv[8];
  int32_t axis[8], pos[3 * 7];
  fill(x0, (size_t)n * nh * hd, 1.f);
  memcpy(x, x0, sizeof(float) * n * nh * hd);
  for (int i = 0; i < half; i++) {
    inv[i] = powf(100.f, -(float)i / half);
    axis[i] = i % na;
  }
  for (int i = 0; i < na * n; i++) pos[i] = (int32_t)(i * 37 % 23);
  float *dinv = be->alloc(be, sizeof inv);
  int32_t *dax = be->alloc(be, sizeof axis), *dpos = be->alloc(be, sizeof pos);
  float *dx = be->alloc(be, sizeof(float) * n * nh * hd);
  be->upload(be, dinv, inv, sizeof inv);
  be->upload(be, dax, axis, sizeof axis);
  be->upload(be, dpos, pos, sizeof pos);
  be->upload(be, dx, x, sizeof(float) * n * nh * hd);
  be->rope_axes(be, dx, n, nh, hd, rot, dinv, dax, dpos);
  be->download(be, x, dx, sizeof(float) * n * nh * hd);
  double *ref = malloc(sizeof(double) * n * nh * hd);
  for (int t = 0; t < n; t++)
    for (int h = 0; h < nh; h++) {
      const float *a = x0 + ((size_t)t * nh + h) * hd;
      double *r = ref + ((size_t)t * nh + h) * hd;
      for (int d = 0; d < hd; d++) r[d] = a[d];
      for (int i = 0; i < half; i++) {
        const double ang = (double)pos[axis[i] * n + t] * inv[i];
        r[i] = a[i] * cos(ang) - a[i + half] * sin(ang);
        r[i + half] = a[i] * sin(ang) + a[i + half] * cos(ang);
      }
    }
  CHECK(max_abs(x, ref, (size_t)n * nh * hd) < 1e-5, "rope_axes: max err %g", max_abs(x, ref, (size_t)n * nh * hd));
  be->free(be, dinv);
  be->free(be, dax);
  be->free(be, dpos);
  be->free(be, dx);
  free(x);
  free(x0);
  free(ref);
}

static void test_small_ops(sm_backend *be) {
  const size_t n = 1000;
  float *x = malloc(n * 4), *y = malloc(n * 4);
  double *ref = malloc(n * sizeof(double));
  fill(x, n, 6.f);
  be->gelu(be, y, x, n, SM_GELU_ERF);
  for (size_t i = 0; i < n; i++) ref[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0)));
  CHECK(max_abs(y, ref, n) < 1e-5, "gelu (erf): max err %g", max_abs(y, ref, n));
  be->gelu(be, y, x, n, SM_GELU_TANH);
  for (size_t i = 0; i < n; i++) ref[i] = 0.5 * x[i] * (1 + tanh(sqrt(2 / M_PI) * (x[i] + 0.044715 * pow(x[i], 3))));
  CHECK(max_abs(y, ref, n) < 1e-5, "gelu (tanh): max err %g", max_abs(y, ref, n));
  be->gelu(be, y, x, n, SM_GELU_QUICK);
  for (size_t i = 0; i < n; i++) ref[i] = x[i] / (1 + exp(-1.702 * x[i]));
  CHECK(max_abs(y, ref, n) < 1e-5, "gelu (quick): max err %g", max_abs(y, ref, n));
  /* the three forms differ by more than the tolerance somewhere: the kind is honoured */
  float *y2 = malloc(n * 4), *y3 = malloc(n * 4);
  be->gelu(be, y, x, n, SM_GELU_ERF);
  be->gelu(be, y2, x, n, SM_GELU_TANH);
  be->gelu(be, y3, x, n, SM_GELU_QUICK);
  double dmax = 0, dq = 0;
  for (size_t i = 0; i < n; i++) {
    dmax = fmax(dmax, fabs(y[i] - y2[i]));
    dq = fmax(dq, fabs(y[i] - y3[i]));
  }
  CHECK(dmax > 1e-4 && dq > 1e-2, "gelu forms differ (tanh %g, quick %g)", dmax, dq);
  free(y3);
  /* gather rows, copy */
  const int rows = 10, dim = 13, nout = 6;
  float *src = malloc(sizeof(float) * rows * dim), *dst = malloc(sizeof(float) * nout * dim);
  fill(src, (size_t)rows * dim, 1.f);
  int32_t idx[6] = {9, 0, 3, 3, 7, 1};
  int32_t *didx = be->alloc(be, sizeof idx);
  be->upload(be, didx, idx, sizeof idx);
  be->gather_rows(be, dst, src, didx, nout, dim);
  int bad = 0;
  for (int i = 0; i < nout; i++) bad += memcmp(dst + i * dim, src + idx[i] * dim, sizeof(float) * dim) != 0;
  CHECK(bad == 0, "gather_rows: %d rows wrong", bad);
  be->copy(be, dst, src + 5, 40 * sizeof(float));
  CHECK(!memcmp(dst, src + 5, 160), "copy");
  be->free(be, didx);
  free(src);
  free(dst);
  free(x);
  free(y);
  free(y2);
  free(ref);
}

int main(void) {
  for (int th = 1; th <= 4; th += 3) {
    sm_backend *be = sm_cpu_backend_create(th);
    const int32_t one[] = {0, 37}, win[] = {0, 16, 32, 45, 61, 64, 100}, unit[] = {0, 1, 2, 3};
    test_attention_seg(be, 37, 4, 4, 16, one, 1);
    test_attention_seg(be, 100, 6, 2, 20, win, 6); /* uneven windows, GQA */
    test_attention_seg(be, 3, 2, 1, 72, unit, 3);  /* one-token segments: out = v */
    const int32_t big[] = {0, 300, 301, 700};
    test_attention_seg(be, 700, 2, 2, 40, big, 3); /* segments longer than a key chunk */
    test_rope_axes(be);
    test_small_ops(be);
    be->destroy(be);
  }
  TEST_END();
}
