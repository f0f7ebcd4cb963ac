#include "engine/sampler.h"
#include "backend/sample_math.h"
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
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return r;
}
static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

void sm_sampler_init(sm_sampler *s, const smelt_sampling *p, int vocab) {
  memset(s, 0, sizeof *s);
  if (p) s->p = *p;
  else smelt_sampling_default(&s->p);
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

void sm_sampler_free(sm_sampler *s) {
  free(s->probs);
  free(s->idx);
  free(s->pen);
  free(s->hkey);
  free(s->hcnt);
  s->probs = NULL;
  s->idx = NULL;
  s->pen = NULL;
  s->hkey = NULL;
  s->hcnt = NULL;
  s->pen_cap = s->hcap = 0;
}

void sm_log_softmax(const float *x, int n, float *out) {
  float mx = -INFINITY;
  for (int i = 0; i < n; i++)
    if (x[i] > mx) mx = x[i];
  double sum = 0;
  for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
  float lse = mx + (float)log(sum);
  for (int i = 0; i < n; i++) out[i] = x[i] - lse;
}

/* partial selection: top k of v into out_idx sorted desc (k small) */
void sm_top_n(const float *v, int n, int k, int32_t *out_idx) {
  if (k > n) k = n;
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (m < k) m++;
    else if (!(v[i] > v[out_idx[m - 1]])) continue;
    int j = m - 1;
    while (j > 0 && v[i] > v[out_idx[j - 1]]) {
      out_idx[j] = out_idx[j - 1];
      j--;
    }
    out_idx[j] = i;
  }
}

/* (token, count) over the penalty window of hist, when a penalty is on */
bool sm_sampler_penalizes(const sm_sampler *s) {
  const smelt_sampling *p = &s->p;
  return (p->repetition_penalty > 0 && p->repetition_penalty != 1.0f) || p->frequency_penalty != 0 ||
         p->presence_penalty != 0;
}

bool sm_sampler_history_free(const sm_sampler *s) { return !sm_sampler_penalizes(s) && !s->n_bias && !s->mask; }

static int count_penalties(sm_sampler *s, const int32_t *hist, int nh) {
  const smelt_sampling *p = &s->p;
  if (!sm_sampler_penalizes(s) || nh <= 0 || !hist) return 0;
  int start = (p->penalty_last_n > 0 && nh > p->penalty_last_n) ? nh - p->penalty_last_n : 0;
  /* count occurrences with a small open-addressing table */
  int cap = 64;
  while (cap < 2 * (nh - start)) cap <<= 1;
  if (cap > s->hcap) {
    s->hcap = cap;
    s->hkey = sm_xrealloc(s->hkey, sizeof(int32_t) * (size_t)cap);
    s->hcnt = sm_xrealloc(s->hcnt, sizeof(int) * (size_t)cap);
  }
  int32_t *keys = s->hkey;
  int *cnt = s->hcnt;
  for (int i = 0; i < cap; i++) {
    keys[i] = -1;
    cnt[i] = 0;
  }
  int n = 0;
  for (int i = start; i < nh; i++) {
    int32_t t = hist[i];
    if (t < 0 || t >= s->vocab) continue;
    unsigned h = ((uint32_t)t * 2654435761u) & (unsigned)(cap - 1);
    while (keys[h] != -1 && keys[h] != t) h = (h + 1) & (unsigned)(cap - 1);
    if (keys[h] == -1) n++;
    keys[h] = t;
    cnt[h]++;
  }
  if (n > s->pen_cap) {
    s->pen_cap = n;
    s->pen = sm_xrealloc(s->pen, sizeof(sm_tok_count) * (size_t)n);
  }
  int k = 0;
  for (int i = 0; i < cap; i++)
    if (keys[i] >= 0) {
      s->pen[k].token = keys[i];
      s->pen[k].count = cnt[i];
      k++;
    }
  return k;
}

void sm_sampler_prepare(sm_sampler *s, const int32_t *hist, int nh, sm_sample_req *r) {
  const smelt_sampling *p = &s->p;
  memset(r, 0, sizeof *r);
  r->temperature = p->temperature;
  r->top_k = p->top_k;
  r->top_p = p->top_p;
  r->min_p = p->min_p;
  r->repetition_penalty = p->repetition_penalty;
  r->frequency_penalty = p->frequency_penalty;
  r->presence_penalty = p->presence_penalty;
  r->n_pen = count_penalties(s, hist, nh);
  r->pen = r->n_pen ? s->pen : NULL;
  r->n_bias = s->n_bias;
  r->bias_ids = s->bias_ids;
  r->bias_vals = s->bias_vals;
  r->mask = s->mask;
  int n;
  r->u = sm_sample_plan(p->temperature, p->top_k, p->top_p, s->vocab, &n) == SM_SAMPLE_GREEDY ? 0.0 : next_unit(s->rng);
}

int32_t sm_sampler_sample(sm_sampler *s, float *logits, const int32_t *hist, int nh) {
  sm_sample_req r;
  sm_sampler_prepare(s, hist, nh, &r);
  return sm_sample_row(&r, logits, s->vocab, s->probs, s->idx);
}
