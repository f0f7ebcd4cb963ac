#include "engine/sampler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void smelt_sampling_default(smelt_sampling *s) {
  memset(s, 0, sizeof *s);
  s->temperature = 0.0f;
  s->top_p = 1.0f;
  s->repetition_penalty = 1.0f;
}

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t next_u64(uint64_t *s) {
  uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
  return r;
}
static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

void sm_sampler_init(sm_sampler *s, const smelt_sampling *p, int vocab) {
  memset(s, 0, sizeof *s);
  if (p) s->p = *p; else smelt_sampling_default(&s->p);
  s->vocab = vocab;
  uint64_t seed = s->p.seed;
  if (!seed) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)s;
  }
  for (int i = 0; i < 4; i++) s->rng[i] = splitmix(&seed);
  s->probs = sm_xmalloc(sizeof(float) * (size_t)vocab);
  s->idx = sm_xmalloc(sizeof(int32_t) * (size_t)vocab);
}

void sm_sampler_free(sm_sampler *s) { free(s->probs); free(s->idx); s->probs = NULL; s->idx = NULL; }

void sm_log_softmax(const float *x, int n, float *out) {
  float mx = -INFINITY;
  for (int i = 0; i < n; i++) if (x[i] > mx) mx = x[i];
  double sum = 0;
  for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
  float lse = mx + (float)log(sum);
  for (int i = 0; i < n; i++) out[i] = x[i] - lse;
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
  const float *v = ctx;
  float x = v[*(const int32_t *)a], y = v[*(const int32_t *)b];
  if (x > y) return -1;
  if (x < y) return 1;
  return *(const int32_t *)a - *(const int32_t *)b;
}

/* partial selection: top k of v into out_idx sorted desc (k small) */
void sm_top_n(const float *v, int n, int k, int32_t *out_idx) {
  if (k > n) k = n;
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (m < k) m++;
    else if (!(v[i] > v[out_idx[m - 1]])) continue;
    int j = m - 1;
    while (j > 0 && v[i] > v[out_idx[j - 1]]) { out_idx[j] = out_idx[j - 1]; j--; }
    out_idx[j] = i;
  }
}

static void apply_penalties(const smelt_sampling *p, float *logits, int V, const int32_t *hist, int nh) {
  bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
  bool fp = p->frequency_penalty != 0 || p->presence_penalty != 0;
  if (!(rep || fp) || nh <= 0) return;
  int start = (p->penalty_last_n > 0 && nh > p->penalty_last_n) ? nh - p->penalty_last_n : 0;
  /* count occurrences with a small open-addressing table */
  int cap = 64;
  while (cap < 2 * (nh - start)) cap <<= 1;
  int32_t *keys = sm_xmalloc(sizeof(int32_t) * (size_t)cap);
  int *cnt = sm_xcalloc((size_t)cap, sizeof(int));
  for (int i = 0; i < cap; i++) keys[i] = -1;
  for (int i = start; i < nh; i++) {
    int32_t t = hist[i];
    if (t < 0 || t >= V) continue;
    unsigned h = ((uint32_t)t * 2654435761u) & (unsigned)(cap - 1);
    while (keys[h] != -1 && keys[h] != t) h = (h + 1) & (unsigned)(cap - 1);
    keys[h] = t;
    cnt[h]++;
  }
  for (int i = 0; i < cap; i++) {
    if (keys[i] < 0) continue;
    float *l = &logits[keys[i]];
    if (rep) *l = *l > 0 ? *l / p->repetition_penalty : *l * p->repetition_penalty;
    *l -= p->frequency_penalty * (float)cnt[i] + p->presence_penalty;
  }
  free(keys);
  free(cnt);
}

int32_t sm_sampler_sample(sm_sampler *s, float *logits, const int32_t *hist, int nh) {
  const smelt_sampling *p = &s->p;
  int V = s->vocab;
  apply_penalties(p, logits, V, hist, nh);
  if (p->temperature <= 0) {
    int32_t best = 0;
    for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
    return best;
  }
  /* candidate set: top_k (or all) sorted by logit */
  int n;
  if (p->top_k > 0 && p->top_k < V) {
    n = p->top_k;
    sm_top_n(logits, V, n, s->idx);
  } else {
    n = V;
    for (int i = 0; i < V; i++) s->idx[i] = i;
    bool need_sort = p->top_p < 1.0f;
    if (need_sort) qsort_r(s->idx, (size_t)V, sizeof(int32_t), cmp_desc, logits);
  }
  float mx = -INFINITY;
  for (int i = 0; i < n; i++) if (logits[s->idx[i]] > mx) mx = logits[s->idx[i]];
  double sum = 0;
  for (int i = 0; i < n; i++) {
    float e = expf((logits[s->idx[i]] - mx) / p->temperature);
    s->probs[i] = e;
    sum += e;
  }
  for (int i = 0; i < n; i++) s->probs[i] = (float)(s->probs[i] / sum);
  if (p->top_p > 0 && p->top_p < 1.0f) { /* idx sorted descending here */
    double c = 0;
    int keep = n;
    for (int i = 0; i < n; i++) { c += s->probs[i]; if (c >= p->top_p) { keep = i + 1; break; } }
    n = keep;
  }
  if (p->min_p > 0) {
    float pmax = 0;
    for (int i = 0; i < n; i++) if (s->probs[i] > pmax) pmax = s->probs[i];
    int k = 0;
    for (int i = 0; i < n; i++)
      if (s->probs[i] >= p->min_p * pmax) { s->probs[k] = s->probs[i]; s->idx[k] = s->idx[i]; k++; }
    n = k;
  }
  double tot = 0;
  for (int i = 0; i < n; i++) tot += s->probs[i];
  double r = next_unit(s->rng) * tot, c = 0;
  for (int i = 0; i < n; i++) { c += s->probs[i]; if (r < c) return s->idx[i]; }
  return s->idx[n - 1];
}
