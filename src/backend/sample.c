/* Reference token sampler on one row of logits (see backend.h, sm_sample_row), with its
 * constrained-decoding step (logit biases and the grammar mask). The host sampler and the CPU
 * backend call it; the CUDA kernels (cuda_sample.cu) reproduce it bit for
 * bit with the arithmetic of sample_math.h. */
#pragma GCC optimize("fp-contract=off")
#include "backend/backend.h"
#include "backend/sample_math.h"
#include <stdlib.h>

/* key desc, index asc */
static int cmp_key_desc(const void *a, const void *b, void *ctx) {
  const float *v = ctx;
  int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  if (v[i] > v[j]) return -1;
  if (v[i] < v[j]) return 1;
  return i < j ? -1 : i > j;
}

/* first k of v in the order "value desc, index asc" (insertion; k small) */
static void top_k_sorted(const float *v, int n, int k, int32_t *out) {
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (m < k) m++;
    else if (!(v[i] > v[out[m - 1]])) continue;
    int j = m - 1;
    while (j > 0 && v[i] > v[out[j - 1]]) {
      out[j] = out[j - 1];
      j--;
    }
    out[j] = i;
  }
}

int sm_sample_apply_mask(float *logits, int vocab, const uint32_t *mask) {
  int allowed = 0;
  for (int w = 0; w * 32 < vocab; w++) {
    int end = SM_MIN(32, vocab - w * 32);
    uint32_t m = end == 32 ? mask[w] : mask[w] & ((1u << end) - 1u);
    allowed += __builtin_popcount(m);
    if (m == 0xFFFFFFFFu) continue;
    for (int b = 0; b < end; b++)
      if (!((m >> b) & 1u)) logits[w * 32 + b] = -INFINITY;
  }
  return allowed;
}

/* some token of [0, vocab) is allowed (stops at the first one) */
static bool mask_allows_any(const uint32_t *mask, int vocab) {
  const int full = vocab / 32;
  for (int w = 0; w < full; w++)
    if (mask[w]) return true;
  return vocab % 32 && (mask[full] & ((1u << (vocab % 32)) - 1u));
}

int32_t sm_sample_row(const sm_sample_req *r, float *l, int V, float *e, int32_t *idx) {
  if (V <= 0) return 0;
  for (int i = 0; i < r->n_bias; i++)
    if (r->bias_ids[i] >= 0 && r->bias_ids[i] < V) l[r->bias_ids[i]] += r->bias_vals[i];
  if (r->mask && sm_sample_apply_mask(l, V, r->mask) == 0) return -1;
  for (int i = 0; i < r->n_pen; i++) {
    int32_t t = r->pen[i].token;
    if (t < 0 || t >= V) continue;
    l[t] = sm_sample_penalize(l[t], r->pen[i].count, r->repetition_penalty, r->frequency_penalty, r->presence_penalty);
  }
  for (int i = 0; i < V; i++) l[i] = sm_sample_key(l[i]);
  int n;
  int mode = sm_sample_plan(r->temperature, r->top_k, r->top_p, V, &n);
  if (mode == SM_SAMPLE_GREEDY) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
      if (l[i] > l[best]) best = i;
    return best;
  }
  const int32_t *ix = NULL; /* NULL: natural order */
  if (mode == SM_SAMPLE_SORTED) {
    if (n < V) top_k_sorted(l, V, n, idx);
    else {
      for (int i = 0; i < V; i++) idx[i] = i;
      qsort_r(idx, (size_t)V, sizeof(int32_t), cmp_key_desc, l);
    }
    ix = idx;
  }
#define TOK(i) (ix ? ix[i] : (int32_t)(i))
  float mx = -INFINITY;
  for (int i = 0; i < n; i++)
    if (l[TOK(i)] > mx) mx = l[TOK(i)];
  if (mx == -INFINITY) return TOK(0);
  const float T = r->temperature;
  sm_u128 total = 0;
  for (int i = 0; i < n; i++) {
    e[i] = sm_sample_exp(SM_FDIV(SM_FSUB(l[TOK(i)], mx), T));
    total += sm_sample_weight(e[i]);
  }
  int keep = n;
  if (r->top_p > 0 && r->top_p < 1.0f) {
    double thr = SM_DMUL((double)r->top_p, sm_sample_u128_to_double(total));
    sm_u128 c = 0;
    for (int i = 0; i < n; i++) {
      c += sm_sample_weight(e[i]);
      if (sm_sample_u128_to_double(c) >= thr) {
        keep = i + 1;
        break;
      }
    }
  }
  bool use_mp = r->min_p > 0;
  float mp = r->min_p > 1.0f ? 1.0f : r->min_p;
  sm_u128 kept = 0;
  for (int i = 0; i < keep; i++)
    if (!use_mp || e[i] >= mp) kept += sm_sample_weight(e[i]);
  double x = SM_DMUL(r->u, sm_sample_u128_to_double(kept));
  sm_u128 c = 0;
  int last = 0;
  for (int i = 0; i < keep; i++) {
    if (use_mp && !(e[i] >= mp)) continue;
    sm_u128 w = sm_sample_weight(e[i]);
    if (!w) continue;
    c += w;
    last = i;
    if (x < sm_sample_u128_to_double(c)) return TOK(i);
  }
  return TOK(last);
#undef TOK
}

smelt_status sm_sample_check(const sm_sample_req *req, int n_req, int n_rows, int vocab) {
  if (n_req < 0 || n_rows < 0 || vocab <= 0) return sm_err(SMELT_ERR_INVALID, "sample: bad sizes");
  if (n_req > 0 && !req) return sm_err(SMELT_ERR_INVALID, "sample: requests missing");
  for (int i = 0; i < n_req; i++) {
    const sm_sample_req *r = &req[i];
    if (r->row < 0 || r->row >= n_rows)
      return sm_err(SMELT_ERR_INVALID, "sample: request %d reads row %d of %d", i, r->row, n_rows);
    if (r->n_pen < 0 || (r->n_pen > 0 && !r->pen))
      return sm_err(SMELT_ERR_INVALID, "sample: request %d has a bad penalty list", i);
    for (int k = 0; k < r->n_pen; k++)
      if (r->pen[k].token < 0 || r->pen[k].token >= vocab)
        return sm_err(SMELT_ERR_INVALID, "sample: penalty token %d out of range (vocab %d)", r->pen[k].token, vocab);
    if (r->n_bias < 0 || (r->n_bias > 0 && (!r->bias_ids || !r->bias_vals)))
      return sm_err(SMELT_ERR_INVALID, "sample: request %d has a bad logit bias list", i);
    for (int k = 0; k < r->n_bias; k++)
      if (r->bias_ids[k] < 0 || r->bias_ids[k] >= vocab)
        return sm_err(SMELT_ERR_INVALID, "sample: logit bias token %d out of range (vocab %d)", r->bias_ids[k], vocab);
    if (r->mask && !mask_allows_any(r->mask, vocab))
      return sm_err(SMELT_ERR_INVALID, "sample: request %d: its grammar mask allows no token", i);
  }
  return SMELT_OK;
}
