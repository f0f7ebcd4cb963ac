/* Reference token sampler on one row of logits (see backend.h, sm_sample_row), with its
 * constrained-decoding step (logit biases and the grammar mask). The host sampler and the CPU
 * backend call it; the CUDA kernels (cuda_sample.cu) reproduce it bit for
 * bit with the arithmetic of sample_math.h. */
/* fp-contract off: one rounding per operation; no-trapping-math and the dynamic cost model: GCC
 * vectorizes exp_row at -O2 (its selects computed on every lane, which changes no value) */
#pragma GCC optimize("fp-contract=off", "no-trapping-math", "vect-cost-model=dynamic")
#include "backend/backend.h"
#include "backend/sample_math.h"
#include "base/pool.h"
#include <stdlib.h>
#include <string.h>

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
#define TOPK_INSERT_MAX 256 /* top_k up to which one insertion pass beats select_cut's passes */

/* sm_sample_exp((key - mx) / T) of n keys (ix: their ids, NULL: 0 .. n-1) into e: the same operations
 * as sm_sample_exp where x >= -86 (so the same values) and no branches, so that the compiler runs
 * several at a time */
static void exp_row(const float *l, const int32_t *ix, int n, float mx, float T, float *e) {
  if (ix)
    for (int i = 0; i < n; i++) e[i] = SM_FDIV(SM_FSUB(l[ix[i]], mx), T);
  else
    for (int i = 0; i < n; i++) e[i] = SM_FDIV(SM_FSUB(l[i], mx), T);
  for (int i = 0; i < n; i++) { /* sm_sample_exp, its branches as selects */
    const float x0 = e[i];
    const int ok = x0 >= -86.0f; /* 0 for NaN */
    float x = x0 > 0.0f ? 0.0f : x0;
    x = ok ? x : 0.0f;
    const float v = sm_sample_exp_core(x);
    e[i] = ok ? v : 0.0f;
  }
}

/* A key as an unsigned integer of the same order. */
static inline uint32_t key_ord(float k) {
  const uint32_t b = sm_sf_bits(k);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}

/* The candidates a sorted request's walk can reach are a prefix of the order "key desc, index asc":
 * the top_k, or the tokens up to where the cumulative weight first meets top_p of the total. Rather
 * than sorting the row, the cut is found with two histograms of the keys (their top 11 bits, then
 * the next 11 inside the bin that holds it) by count (top_k: n < V) or by exact weight sums tested as
 * the walk tests them (top_p alone: e holds every token's e in natural order, and *total gets the sum
 * of their weights). Returns the lowest ordered key of the candidates (0: every token); the CUDA
 * sample op finds the same cut. */
/* idx[0..c) (ids in increasing order) into the order "key desc, index asc": a stable LSD radix sort
 * of the ordered keys' complements, a byte a pass (passes where every key has the same byte are
 * skipped); qsort with cmp_key_desc when the scratch is not there */
static void sort_desc(const float *l, int32_t *idx, int c) {
  uint32_t *ka = malloc(sizeof(uint32_t) * 2 * (size_t)c);
  int32_t *ib = malloc(sizeof(int32_t) * (size_t)c);
  if (!ka || !ib) {
    free(ka);
    free(ib);
    qsort_r(idx, (size_t)c, sizeof(int32_t), cmp_key_desc, (void *)l);
    return;
  }
  uint32_t *kb = ka + c;
  for (int i = 0; i < c; i++) ka[i] = ~key_ord(l[idx[i]]);
  for (int sh = 0; sh < 32; sh += 8) {
    size_t cnt[256] = {0};
    for (int i = 0; i < c; i++) cnt[(ka[i] >> sh) & 255]++;
    if (c && cnt[(ka[0] >> sh) & 255] == (size_t)c) continue;
    size_t off = 0;
    for (int d = 0; d < 256; d++) {
      const size_t t = cnt[d];
      cnt[d] = off;
      off += t;
    }
    for (int i = 0; i < c; i++) {
      const size_t o = cnt[(ka[i] >> sh) & 255]++;
      kb[o] = ka[i];
      ib[o] = idx[i];
    }
    memcpy(ka, kb, sizeof(uint32_t) * (size_t)c);
    memcpy(idx, ib, sizeof(int32_t) * (size_t)c);
  }
  free(ka);
  free(ib);
}

#define SEL_BINS 2048
/* the histogram of the keys l[lo, hi) (and with mass their weights, from e) at a level: level 0 by
 * the top 11 bits, level 1 by the next 11 of the keys in bin b0 */
static void sel_hist(const float *l, const float *e, int lo, int hi, int level, int b0, bool mass, uint32_t *cnt,
                     sm_u128 *w) {
  memset(cnt, 0, sizeof(uint32_t) * SEL_BINS);
  memset(w, 0, sizeof(sm_u128) * SEL_BINS);
  for (int i = lo; i < hi; i++) {
    const uint32_t o = key_ord(l[i]);
    if (level == 1 && (int)(o >> 21) != b0) continue;
    const int d = level == 0 ? (int)(o >> 21) : (int)((o >> 10) & (SEL_BINS - 1));
    cnt[d]++;
    if (mass) w[d] += sm_sample_weight(e[i]);
  }
}
typedef struct {
  int n; /* top_k (count select), unless mass */
  float top_p;
  bool mass; /* top_p alone: weight sums */
  int b0;    /* the level-0 bin of the cut */
  uint32_t c_above, cut;
  sm_u128 m_above, total;
  double thr;
} sel_state;
/* the bin of the cut from a level's whole histogram; true when the cut is known (st->cut) */
static bool sel_step(sel_state *st, int level, const uint32_t *cnt, const sm_u128 *w) {
  if (level == 0 && st->mass) {
    sm_u128 t = 0;
    for (int d = 0; d < SEL_BINS; d++) t += w[d];
    st->total = t;
    st->thr = SM_DMUL((double)st->top_p, sm_sample_u128_to_double(t));
  }
  uint32_t C = level ? st->c_above : 0;
  sm_u128 M = level ? st->m_above : 0;
  int hit = -1;
  for (int d = SEL_BINS - 1; d >= 0 && hit < 0; d--) {
    const uint32_t C1 = C + cnt[d];
    const sm_u128 M1 = M + w[d];
    if (st->mass ? C1 >= 1 && sm_sample_u128_to_double(M1) >= st->thr : C1 >= (uint32_t)st->n) hit = d;
    else {
      C = C1;
      M = M1;
    }
  }
  if (hit < 0) { /* no bin meets the bound (rounding): every token */
    st->cut = 0;
    return true;
  }
  if (level == 1) {
    st->cut = ((uint32_t)st->b0 << 21) | ((uint32_t)hit << 10);
    return true;
  }
  st->b0 = hit;
  st->c_above = C;
  st->m_above = M;
  return false;
}
static uint32_t select_cut(const float *l, int V, int n, const float *e, float top_p, bool mass, sm_u128 *total) {
  uint32_t *cnt = malloc(sizeof(uint32_t) * SEL_BINS);
  sm_u128 *w = malloc(sizeof(sm_u128) * SEL_BINS);
  sel_state st = {.n = n, .top_p = top_p, .mass = mass};
  if (!cnt || !w) {
    free(cnt);
    free(w);
    for (int i = 0; mass && i < V; i++) st.total += sm_sample_weight(e[i]);
    *total = st.total;
    return 0;
  }
  for (int level = 0; level < 2; level++) {
    sel_hist(l, e, 0, V, level, st.b0, mass, cnt, w);
    if (sel_step(&st, level, cnt, w)) break;
  }
  free(cnt);
  free(w);
  *total = st.total;
  return st.cut;
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

/* steps 0 and 1 of the rule: biases, mask, penalties, keys; false when the mask allows no token */
static bool prep_row(const sm_sample_req *r, float *l, int V) {
  for (int i = 0; i < r->n_bias; i++)
    if (r->bias_ids[i] >= 0 && r->bias_ids[i] < V) l[r->bias_ids[i]] += r->bias_vals[i];
  if (r->mask && sm_sample_apply_mask(l, V, r->mask) == 0) return false;
  for (int i = 0; i < r->n_pen; i++) {
    int32_t t = r->pen[i].token;
    if (t < 0 || t >= V) continue;
    l[t] = sm_sample_penalize(l[t], r->pen[i].count, r->repetition_penalty, r->frequency_penalty, r->presence_penalty);
  }
  for (int i = 0; i < V; i++) l[i] = sm_sample_key(l[i]);
  return true;
}

/* steps 3-6 of the rule on the n candidates ix (NULL: natural order) of the keys l; with
 * whole_total, the top_p bound is taken from row_total (every token's weight) */
static int32_t walk_rest(const sm_sample_req *r, const float *l, const int32_t *ix, int n, float *e, bool whole_total,
                         sm_u128 row_total) {
#define TOK(i) (ix ? ix[i] : (int32_t)(i))
  float mx = -INFINITY;
  for (int i = 0; i < n; i++)
    if (l[TOK(i)] > mx) mx = l[TOK(i)];
  if (mx == -INFINITY) return TOK(0);
  const float T = r->temperature;
  sm_u128 total = 0;
  exp_row(l, ix, n, mx, T, e);
  for (int i = 0; i < n; i++) total += sm_sample_weight(e[i]);
  if (whole_total) total = row_total;
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
  if (!use_mp && keep == n && !whole_total) kept = total; /* the same sum */
  else
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

int32_t sm_sample_row(const sm_sample_req *r, float *l, int V, float *e, int32_t *idx) {
  if (V <= 0) return 0;
  if (!prep_row(r, l, V)) return -1;
  int n;
  int mode = sm_sample_plan(r->temperature, r->top_k, r->top_p, V, &n);
  if (mode == SM_SAMPLE_GREEDY) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
      if (l[i] > l[best]) best = i;
    return best;
  }
  const int32_t *ix = NULL; /* NULL: natural order */
  sm_u128 row_total = 0;    /* top_p alone: the weight of every token */
  const bool p_cut = r->top_p > 0 && r->top_p < 1.0f, whole_total = mode == SM_SAMPLE_SORTED && n == V && p_cut;
  if (mode == SM_SAMPLE_SORTED && n < V && n <= TOPK_INSERT_MAX) {
    top_k_sorted(l, V, n, idx);
    ix = idx;
  } else if (mode == SM_SAMPLE_SORTED) { /* the candidates (select_cut) in the order "key desc, index asc" */
    if (whole_total) {                   /* every token's e, in natural order, for the weight sums */
      float m0 = -INFINITY;
      for (int i = 0; i < V; i++) m0 = l[i] > m0 ? l[i] : m0;
      exp_row(l, NULL, V, m0, r->temperature, e);
    }
    const uint32_t cut = n < V || whole_total ? select_cut(l, V, n, e, r->top_p, whole_total, &row_total) : 0;
    int c = 0;
    for (int i = 0; i < V; i++)
      if (key_ord(l[i]) >= cut) idx[c++] = i;
    sort_desc(l, idx, c);
    if (n == V) n = c;
    ix = idx;
  }
  return walk_rest(r, l, ix, n, e, whole_total, row_total);
}

/* sm_sample_row on a row prep_row has prepared (biases, mask and penalties not applied again; the
 * keys are their own keys), on one thread: where the split cannot get its scratch */
static int32_t prepared_row(const sm_sample_req *r, float *l, int V, float *e, int32_t *idx) {
  sm_sample_req q = *r;
  q.n_bias = q.n_pen = 0;
  q.mask = NULL;
  return sm_sample_row(&q, l, V, e, idx);
}

/* One row over a pool's threads, each on a contiguous share of the vocabulary (the token is
 * sm_sample_row's):
 *  - natural order (no top_k, no top_p cut): the shares' max, then their e and exact weight sums;
 *    the draw scans the shares' sums for the share where the cumulative kept weight crosses
 *    u * kept and walks that share as the sequential loop would;
 *  - sorted (top_p, or top_k over TOPK_INSERT_MAX): the shares' e (top_p alone) and histograms,
 *    added up for select_cut's steps, then the candidates of each share written in index order;
 *    their sort and the walk stay on the caller. */
typedef struct {
  const float *l;
  float *e;
  int V, phase, level, b0;
  float T, mx, mp;
  bool use_mp, mass;
  uint32_t cut;
  float *pmax;
  sm_u128 *kept;
  uint32_t *cnt, *off; /* [nth][SEL_BINS] histograms; [nth] candidate counts, then offsets */
  sm_u128 *w;
  int32_t *idx;
} row_ctx;
enum { RP_MAX, RP_NATURAL, RP_HIST, RP_COUNT, RP_WRITE };
static void row_job(void *v, int tid, int nth) {
  row_ctx *g = v;
  const int lo = (int)((int64_t)g->V * tid / nth), hi = (int)((int64_t)g->V * (tid + 1) / nth);
  switch (g->phase) {
    case RP_MAX: {
      float m = -INFINITY;
      for (int i = lo; i < hi; i++) m = g->l[i] > m ? g->l[i] : m;
      g->pmax[tid] = m;
      break;
    }
    case RP_NATURAL: {
      exp_row(g->l + lo, NULL, hi - lo, g->mx, g->T, g->e + lo);
      sm_u128 k = 0;
      for (int i = lo; i < hi; i++)
        if (!g->use_mp || g->e[i] >= g->mp) k += sm_sample_weight(g->e[i]);
      g->kept[tid] = k;
      break;
    }
    case RP_HIST:
      if (g->mass && g->level == 0) exp_row(g->l + lo, NULL, hi - lo, g->mx, g->T, g->e + lo);
      sel_hist(g->l, g->e, lo, hi, g->level, g->b0, g->mass, g->cnt + (size_t)tid * SEL_BINS,
               g->w + (size_t)tid * SEL_BINS);
      break;
    case RP_COUNT: {
      uint32_t c = 0;
      for (int i = lo; i < hi; i++) c += key_ord(g->l[i]) >= g->cut;
      g->off[tid] = c;
      break;
    }
    case RP_WRITE: {
      uint32_t o = g->off[tid];
      for (int i = lo; i < hi; i++)
        if (key_ord(g->l[i]) >= g->cut) g->idx[o++] = i;
      break;
    }
  }
}
#define ROW_PAR_MIN 8192 /* vocabulary from which one row is split over the threads */

/* the sorted candidates and the walk of a sorted request, its row prepared */
static int32_t pool_sorted(const sm_sample_req *r, float *l, int V, int n, float *e, int32_t *idx, sm_pool *pool,
                           row_ctx *g, int nth) {
  const bool p_cut = r->top_p > 0 && r->top_p < 1.0f, whole_total = n == V && p_cut;
  sel_state st = {.n = n, .top_p = r->top_p, .mass = whole_total};
  if (n < V || whole_total) {
    g->cnt = malloc(sizeof(uint32_t) * SEL_BINS * (size_t)nth);
    g->w = malloc(sizeof(sm_u128) * SEL_BINS * (size_t)nth);
    if (!g->cnt || !g->w) {
      free(g->cnt);
      free(g->w);
      return prepared_row(r, l, V, e, idx);
    }
    g->mass = whole_total;
    if (whole_total) {
      g->phase = RP_MAX;
      sm_pool_run(pool, row_job, g);
      for (int t = 0; t < nth; t++) g->mx = g->pmax[t] > g->mx ? g->pmax[t] : g->mx;
    }
    for (int level = 0; level < 2; level++) {
      g->phase = RP_HIST;
      g->level = level;
      g->b0 = st.b0;
      sm_pool_run(pool, row_job, g);
      for (int t = 1; t < nth; t++)
        for (int d = 0; d < SEL_BINS; d++) {
          g->cnt[d] += g->cnt[(size_t)t * SEL_BINS + d];
          g->w[d] += g->w[(size_t)t * SEL_BINS + d];
        }
      if (sel_step(&st, level, g->cnt, g->w)) break;
    }
    free(g->cnt);
    free(g->w);
  }
  g->cut = st.cut;
  g->phase = RP_COUNT;
  sm_pool_run(pool, row_job, g);
  uint32_t c = 0;
  for (int t = 0; t < nth; t++) {
    const uint32_t k = g->off[t];
    g->off[t] = c;
    c += k;
  }
  g->phase = RP_WRITE;
  g->idx = idx;
  sm_pool_run(pool, row_job, g);
  sort_desc(l, idx, (int)c);
  return walk_rest(r, l, idx, n == V ? (int)c : n, e, whole_total, st.total);
}

int32_t sm_sample_row_pool(const sm_sample_req *r, float *l, int V, float *e, int32_t *idx, sm_pool *pool) {
  int n;
  const int nth = pool ? sm_pool_size(pool) : 1;
  const int mode = sm_sample_plan(r->temperature, r->top_k, r->top_p, V, &n);
  if (nth < 2 || V < ROW_PAR_MIN || mode == SM_SAMPLE_GREEDY ||
      (mode == SM_SAMPLE_SORTED && n < V && n <= TOPK_INSERT_MAX))
    return sm_sample_row(r, l, V, e, idx);
  if (!prep_row(r, l, V)) return -1;
  float *pmax = malloc(sizeof(float) * (size_t)nth);
  sm_u128 *kept = malloc(sizeof(sm_u128) * (size_t)nth);
  uint32_t *off = malloc(sizeof(uint32_t) * (size_t)nth);
  if (!pmax || !kept || !off) {
    free(pmax);
    free(kept);
    free(off);
    return prepared_row(r, l, V, e, idx);
  }
  row_ctx g = {.l = l,
               .e = e,
               .V = V,
               .T = r->temperature,
               .mx = -INFINITY,
               .mp = r->min_p > 1.0f ? 1.0f : r->min_p,
               .use_mp = r->min_p > 0,
               .pmax = pmax,
               .kept = kept,
               .off = off};
  int32_t tok = 0;
  if (mode == SM_SAMPLE_SORTED) {
    tok = pool_sorted(r, l, V, n, e, idx, pool, &g, nth);
    goto done;
  }
  g.phase = RP_MAX;
  sm_pool_run(pool, row_job, &g);
  for (int t = 0; t < nth; t++) g.mx = pmax[t] > g.mx ? pmax[t] : g.mx;
  if (g.mx > -INFINITY) {
    g.phase = RP_NATURAL;
    sm_pool_run(pool, row_job, &g);
    sm_u128 all = 0;
    for (int t = 0; t < nth; t++) all += kept[t];
    const double x = SM_DMUL(r->u, sm_sample_u128_to_double(all));
    sm_u128 c = 0;
    int share = -1, last_share = -1;
    for (int t = 0; t < nth && share < 0; t++) {
      if (kept[t]) last_share = t;
      if (x < sm_sample_u128_to_double(c + kept[t])) share = t;
      else c += kept[t];
    }
    tok = -1;
    if (share >= 0) { /* the sequential loop from the share's start */
      const int lo = (int)((int64_t)V * share / nth), hi = (int)((int64_t)V * (share + 1) / nth);
      for (int i = lo; i < hi && tok < 0; i++) {
        if (g.use_mp && !(e[i] >= g.mp)) continue;
        const sm_u128 w = sm_sample_weight(e[i]);
        if (!w) continue;
        c += w;
        if (x < sm_sample_u128_to_double(c)) tok = i;
      }
    }
    if (tok < 0 && last_share >= 0) { /* no crossing (rounding): the last kept token of non-zero weight */
      const int lo = (int)((int64_t)V * last_share / nth), hi = (int)((int64_t)V * (last_share + 1) / nth);
      for (int i = hi - 1; i >= lo && tok < 0; i--)
        if ((!g.use_mp || e[i] >= g.mp) && sm_sample_weight(e[i])) tok = i;
    }
    if (tok < 0) tok = 0;
  }
done:
  free(pmax);
  free(kept);
  free(off);
  return tok;
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
