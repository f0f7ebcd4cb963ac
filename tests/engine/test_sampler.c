/* Sampler: greedy, seeded reproducibility, and that sampled frequencies follow the
 * filtered, renormalized softmax (temperature, top-k, top-p, min-p, penalties). */
#include <string.h>
#include "engine/sampler.h"
#include "../test_util.h"

enum { V = 8 };
static const float base[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};

/* empirical distribution over n draws */
static void draw(const smelt_sampling *p, int n, double *freq, const int32_t *hist, int nh) {
  sm_sampler s;
  sm_sampler_init(&s, p, V);
  memset(freq, 0, sizeof(double) * V);
  float l[V];
  for (int i = 0; i < n; i++) {
    memcpy(l, base, sizeof l);
    freq[sm_sampler_sample(&s, l, hist, nh)] += 1.0 / n;
  }
  sm_sampler_free(&s);
}

/* expected distribution: softmax(base'/T) restricted to mask, renormalized */
static void expect(const float *lg, float T, const int *mask, double *out) {
  double z = 0;
  for (int i = 0; i < V; i++) {
    out[i] = mask[i] ? exp(lg[i] / T) : 0;
    z += out[i];
  }
  for (int i = 0; i < V; i++) out[i] /= z;
}

static double maxdiff(const double *a, const double *b) {
  double m = 0;
  for (int i = 0; i < V; i++) m = fmax(m, fabs(a[i] - b[i]));
  return m;
}

int main(void) {
  smelt_sampling p;
  double f[V], e[V];
  const int N = 200000;
  const double tol = 0.01;
  int all[V] = {1, 1, 1, 1, 1, 1, 1, 1};

  smelt_sampling_default(&p);
  draw(&p, 100, f, NULL, 0);
  CHECK(fabs(f[0] - 1.0) < 1e-9, "greedy picks the argmax");

  p.temperature = 1.0f;
  p.seed = 7;
  draw(&p, N, f, NULL, 0);
  expect(base, 1.0f, all, e);
  CHECK(maxdiff(f, e) < tol, "T=1 matches softmax (diff %.4f)", maxdiff(f, e));

  p.temperature = 0.5f;
  draw(&p, N, f, NULL, 0);
  expect(base, 0.5f, all, e);
  CHECK(maxdiff(f, e) < tol, "T=0.5 matches softmax(l/T) (diff %.4f)", maxdiff(f, e));

  p.temperature = 1.0f;
  p.top_k = 3;
  draw(&p, N, f, NULL, 0);
  int k3[V] = {1, 1, 1, 0, 0, 0, 0, 0};
  expect(base, 1.0f, k3, e);
  CHECK(maxdiff(f, e) < tol, "top_k=3 (diff %.4f)", maxdiff(f, e));

  /* top_p: softmax probs ~ .39 .24 .14 .09 ...; p=0.7 keeps the first 3 (cumulative .77) */
  p.top_k = 0;
  p.top_p = 0.7f;
  draw(&p, N, f, NULL, 0);
  expect(base, 1.0f, k3, e);
  CHECK(maxdiff(f, e) < tol, "top_p=0.7 keeps 3 (diff %.4f)", maxdiff(f, e));

  /* min_p 0.3: keep tokens with p >= 0.3 * pmax: exp(l - 2) >= 0.3 -> l >= 0.796: first 3 */
  p.top_p = 1.0f;
  p.min_p = 0.3f;
  draw(&p, N, f, NULL, 0);
  CHECK(maxdiff(f, e) < tol, "min_p=0.3 keeps 3 (diff %.4f)", maxdiff(f, e));

  /* presence + frequency penalties (OpenAI): l -= count*freq + presence */
  p.min_p = 0;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  int32_t hist[3] = {0, 0, 2};
  draw(&p, N, f, hist, 3);
  float pl[V];
  memcpy(pl, base, sizeof pl);
  pl[0] -= 2 * 0.25f + 0.5f;
  pl[2] -= 0.25f + 0.5f;
  expect(pl, 1.0f, all, e);
  CHECK(maxdiff(f, e) < tol, "frequency/presence penalties (diff %.4f)", maxdiff(f, e));

  /* repetition penalty (HF): positive logits divided, negative multiplied */
  p.presence_penalty = p.frequency_penalty = 0;
  p.repetition_penalty = 2.0f;
  int32_t h2[2] = {0, 6};
  draw(&p, N, f, h2, 2);
  memcpy(pl, base, sizeof pl);
  pl[0] /= 2.0f;
  pl[6] *= 2.0f;
  expect(pl, 1.0f, all, e);
  CHECK(maxdiff(f, e) < tol, "repetition penalty (diff %.4f)", maxdiff(f, e));

  /* same seed -> same sequence; different seed -> different */
  smelt_sampling_default(&p);
  p.temperature = 1.0f;
  p.seed = 1234;
  sm_sampler s1, s2, s3;
  sm_sampler_init(&s1, &p, V);
  sm_sampler_init(&s2, &p, V);
  p.seed = 999;
  sm_sampler_init(&s3, &p, V);
  int same = 1, diff = 0;
  for (int i = 0; i < 200; i++) {
    float a[V], b[V], c[V];
    memcpy(a, base, sizeof a);
    memcpy(b, base, sizeof b);
    memcpy(c, base, sizeof c);
    int32_t x = sm_sampler_sample(&s1, a, NULL, 0), y = sm_sampler_sample(&s2, b, NULL, 0),
            z = sm_sampler_sample(&s3, c, NULL, 0);
    same &= x == y;
    diff |= x != z;
  }
  CHECK(same, "same seed reproduces");
  CHECK(diff, "different seeds differ");
  sm_sampler_free(&s1);
  sm_sampler_free(&s2);
  sm_sampler_free(&s3);

  float ls[V], lo[V];
  memcpy(ls, base, sizeof ls);
  sm_log_softmax(ls, V, lo);
  double z = 0;
  for (int i = 0; i < V; i++) z += exp(lo[i]);
  CHECK(fabs(z - 1) < 1e-5, "log_softmax normalizes");
  int32_t top[3];
  float sh[V] = {0.1f, 5, -2, 3, 4, 0, 1, 2};
  sm_top_n(sh, V, 3, top);
  CHECK(top[0] == 1 && top[1] == 4 && top[2] == 3, "top_n order");
  TEST_END();
}
