/* Device sampling: the backend's sample op must return exactly the host sampler's token.
 *
 *   test_sample_op cpu|cuda SOURCE_DIR
 *
 * 1. Random logit rows (ties, -inf, NaN, +inf, +-0, huge/tiny temperatures, every parameter
 *    combination, penalties over histories with repeated tokens), many draws each: the op on
 *    a request from sm_sampler_prepare == sm_sampler_sample of an identically seeded sampler
 *    (so the generators advance alike), also for batches of mixed requests in one call; and
 *    requests with explicit u (0, 1 - 2^-53, ...) == sm_sample_row on the host.
 * 2. Independent checks of the rule: sm_sample_row (which sorts only the candidates its walk can
 *    reach) == the rule with every key sorted; greedy == first max (naive loop), top_k = 1 ==
 *    greedy, logits left unchanged by the op.
 * 3. End to end on models/smelt-tiny: sm_engine_step_sample (tokens only) == sm_engine_step +
 *    sm_sampler_sample (full logits) for greedy and seeded temperature/top_p/penalty configs,
 *    for one sequence and for a batch of sequences mixing sampled and full-logits rows; and
 *    sm_generate_ids gives the same text with the backend op and with host sampling.
 * With "cuda", exits 77 (ctest SKIP) when the build has no CUDA or no GPU is present. */
#pragma GCC optimize("fp-contract=off") /* the rule's arithmetic rounds once per operation */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/sample_math.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "../test_util.h"
#include "sample_backend.h"

static sm_backend *B;
static uint64_t rs = 0x243f6a8885a308d3ULL;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}
static double unif(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }
static float gauss(void) {
  double a = unif() + 1e-12, b = unif();
  return (float)(sqrt(-2 * log(a)) * cos(6.283185307179586 * b));
}

/* row kinds */
enum { R_GAUSS, R_TIES, R_NEGINF, R_WEIRD, R_HUGE, R_ALLNEG, R_FLAT, R_NKIND };
static void make_row(float *l, int V, int kind) {
  for (int i = 0; i < V; i++) {
    switch (kind) {
      case R_GAUSS: l[i] = 3 * gauss(); break;
      case R_TIES: l[i] = (float)(rnd() % 4); break;
      case R_NEGINF: l[i] = rnd() % 3 ? -INFINITY : 2 * gauss(); break;
      case R_WEIRD: {
        unsigned k = (unsigned)(rnd() % 16);
        l[i] = k == 0 ? NAN : k == 1 ? INFINITY : k == 2 ? -0.0f : k == 3 ? 0.0f : k == 4 ? -INFINITY : gauss();
        break;
      }
      case R_HUGE: l[i] = (float)(1e30 * gauss()); break;
      case R_ALLNEG: l[i] = -INFINITY; break;
      case R_FLAT: l[i] = 1.0f + (float)(rnd() % 3) * 1e-7f; break;
    }
  }
}

static void random_params(smelt_sampling *p, int V) {
  static const float Ts[] = {0, 1e-30f, 0.01f, 0.7f, 1, 1.5f, 1e30f, -1};
  static const float tps[] = {1, 0.9f, 0.5f, 0.01f, 0, -1, 1.5f, 0.999f};
  static const float mps[] = {0, 0.05f, 0.5f, 1, 2, 0};
  static const float reps[] = {1, 1.3f, 0.8f, 1};
  smelt_sampling_default(p);
  p->temperature = Ts[rnd() % SM_ARRAY_LEN(Ts)];
  int ks[] = {0, 1, 5, 50, V - 1, V, V + 5, -1};
  p->top_k = ks[rnd() % SM_ARRAY_LEN(ks)];
  p->top_p = tps[rnd() % SM_ARRAY_LEN(tps)];
  p->min_p = mps[rnd() % SM_ARRAY_LEN(mps)];
  p->repetition_penalty = reps[rnd() % SM_ARRAY_LEN(reps)];
  p->frequency_penalty = rnd() % 2 ? 0.5f : 0;
  p->presence_penalty = rnd() % 3 ? 0 : -0.7f;
  p->penalty_last_n = rnd() % 2 ? 0 : 8;
  p->seed = rnd() | 1;
}

/* the op on backend copies of rows[n_rows][V] */
static smelt_status op(const float *rows, int n_rows, int V, const sm_sample_req *req, int n_req, int32_t *out,
                       bool check_unchanged) {
  size_t bytes = sizeof(float) * (size_t)n_rows * V;
  float *d = B->alloc(B, bytes);
  if (!d) return sm_err(SMELT_ERR_OOM, "test: backend alloc");
  B->upload(B, d, rows, bytes);
  smelt_status st = B->sample(B, d, n_rows, V, req, n_req, out);
  if (check_unchanged && !st) {
    float *back = malloc(bytes);
    B->download(B, back, d, bytes);
    CHECK(memcmp(back, rows, bytes) == 0, "the sample op left the logits unchanged");
    free(back);
  }
  B->free(B, d);
  return st;
}

static void test_random_rows(bool big) {
  int Vs[] = {1, 2, 7, 64, 1000, 8192, 50000};
  int nv = big ? 7 : 6;
  int n_cases = 0, bad = 0;
  for (int vi = 0; vi < nv; vi++) {
    int V = Vs[vi];
    float *row = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V);
    int n_cfg = V >= 50000 ? 12 : V >= 8192 ? 40 : 150;
    for (int c = 0; c < n_cfg; c++) {
      make_row(row, V, (int)(rnd() % R_NKIND));
      smelt_sampling p;
      random_params(&p, V);
      int nh = (int)(rnd() % 40);
      int32_t hist[40];
      int span = 6 + (int)(rnd() % 3) * V; /* often a few distinct tokens: repeats */
      if (span > V) span = V;
      for (int i = 0; i < nh; i++) hist[i] = (int32_t)(rnd() % (uint64_t)span);
      sm_sampler a, h;
      sm_sampler_init(&a, &p, V);
      sm_sampler_init(&h, &p, V);
      int draws = V >= 8192 ? 3 : 8;
      for (int d = 0; d < draws; d++) {
        sm_sample_req r;
        sm_sampler_prepare(&a, hist, nh, &r);
        r.row = 0;
        int32_t got = -1;
        smelt_status st = op(row, 1, V, &r, 1, &got, d == 0);
        memcpy(tmp, row, sizeof(float) * V);
        int32_t want = sm_sampler_sample(&h, tmp, hist, nh);
        n_cases++;
        if (st || got != want) {
          if (bad++ < 10)
            fprintf(stderr, "V=%d T=%g k=%d p=%g minp=%g rep=%g freq=%g pres=%g u=%.17g: op %d (%s), host %d\n", V,
                    p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.frequency_penalty,
                    p.presence_penalty, r.u, got, st ? smelt_last_error() : "ok", want);
        }
      }
      sm_sampler_free(&a);
      sm_sampler_free(&h);
    }
    free(row);
    free(tmp);
  }
  CHECK(bad == 0, "op == host sampler on %d random rows/draws (%d differ)", n_cases, bad);
  printf("random rows: %d cases, %d mismatches\n", n_cases, bad);
}

/* The rule of backend.h written the plain way: every key sorted ("key desc, index asc"), the walk
 * over the first n. sm_sample_row sorts only the candidates its walk can reach (select_cut); the
 * tokens must be the same. */
static const float *naive_keys;
static int naive_cmp(const void *a, const void *b) {
  const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  const float x = naive_keys[i], y = naive_keys[j];
  return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}
static int32_t naive_row(const sm_sample_req *r, const float *row, int V) {
  float *l = malloc(sizeof(float) * V), *e = malloc(sizeof(float) * V);
  int32_t *ix = malloc(sizeof(int32_t) * V), tok;
  for (int i = 0; i < V; i++) l[i] = sm_sample_key(row[i]);
  int n;
  const int mode = sm_sample_plan(r->temperature, r->top_k, r->top_p, V, &n);
  for (int i = 0; i < V; i++) ix[i] = i;
  if (mode == SM_SAMPLE_GREEDY) n = V;
  if (mode != SM_SAMPLE_NATURAL) {
    naive_keys = l;
    qsort(ix, (size_t)V, sizeof(int32_t), naive_cmp);
  }
  float mx = -INFINITY;
  for (int i = 0; i < n; i++) mx = l[ix[i]] > mx ? l[ix[i]] : mx;
  if (mode == SM_SAMPLE_GREEDY || mx == -INFINITY) {
    tok = ix[0];
    goto out;
  }
  sm_u128 total = 0, kept = 0, c = 0;
  for (int i = 0; i < n; i++) {
    e[i] = sm_sample_exp(SM_FDIV(SM_FSUB(l[ix[i]], mx), r->temperature));
    total += sm_sample_weight(e[i]);
  }
  int keep = n;
  if (r->top_p > 0 && r->top_p < 1.0f) {
    const double thr = SM_DMUL((double)r->top_p, sm_sample_u128_to_double(total));
    for (int i = 0; i < n; i++) {
      c += sm_sample_weight(e[i]);
      if (sm_sample_u128_to_double(c) >= thr) {
        keep = i + 1;
        break;
      }
    }
  }
  const float mp = r->min_p > 1.0f ? 1.0f : r->min_p;
  for (int i = 0; i < keep; i++)
    if (!(r->min_p > 0) || e[i] >= mp) kept += sm_sample_weight(e[i]);
  const double x = SM_DMUL(r->u, sm_sample_u128_to_double(kept));
  int last = 0;
  c = 0;
  tok = -1;
  for (int i = 0; i < keep && tok < 0; i++) {
    if ((r->min_p > 0 && !(e[i] >= mp)) || !sm_sample_weight(e[i])) continue;
    c += sm_sample_weight(e[i]);
    last = i;
    if (x < sm_sample_u128_to_double(c)) tok = ix[i];
  }
  if (tok < 0) tok = ix[last];
out:
  free(l);
  free(e);
  free(ix);
  return tok;
}

static void test_rule_vs_naive(void) {
  const int Vs[] = {1, 2, 7, 33, 1000, 4099, 32000};
  int bad = 0, n = 0;
  for (int it = 0; it < 700; it++) {
    const int V = Vs[it % SM_ARRAY_LEN(Vs)];
    float *row = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V), *e = malloc(sizeof(float) * V);
    int32_t *idx = malloc(sizeof(int32_t) * V);
    make_row(row, V, (int)(rnd() % R_NKIND));
    const float sc = (float[]){0.3f, 1, 3, 10}[rnd() % 4];
    for (int i = 0; i < V; i++) row[i] *= sc;
    smelt_sampling p;
    random_params(&p, V);
    const int ks[] = {0, 1, 20, 40, 1000, V - 1, V};
    const float tps[] = {1, 0.9f, 0.95f, 0.5f, 0.01f, 0, 0.999f};
    p.top_k = ks[rnd() % SM_ARRAY_LEN(ks)];
    p.top_p = tps[rnd() % SM_ARRAY_LEN(tps)];
    for (int d = 0; d < 4; d++) {
      sm_sample_req r = {.row = 0,
                         .temperature = p.temperature,
                         .top_k = p.top_k,
                         .top_p = p.top_p,
                         .min_p = p.min_p,
                         .repetition_penalty = 1,
                         .u = d == 0 ? 0.0
                            : d == 1 ? 1.0 - 1.0 / 9007199254740992.0
                                     : unif()};
      memcpy(tmp, row, sizeof(float) * V);
      const int32_t got = sm_sample_row(&r, tmp, V, e, idx), want = naive_row(&r, row, V);
      n++;
      if (got != want && bad++ < 10)
        fprintf(stderr, "rule V=%d T=%g k=%d p=%g min_p=%g u=%.17g: sm_sample_row %d, naive %d\n", V, r.temperature,
                r.top_k, r.top_p, r.min_p, r.u, got, want);
    }
    free(row);
    free(tmp);
    free(e);
    free(idx);
  }
  CHECK(bad == 0, "sm_sample_row == the rule with every key sorted (%d of %d differ)", bad, n);
  printf("rule vs naive: %d rows/draws, %d mismatches\n", n, bad);
}

/* one op call with many mixed requests (greedy, natural, sorted, penalties) over shared rows */
static void test_batches(void) {
  int bad = 0, total = 0;
  for (int it = 0; it < 30; it++) {
    int V = it % 3 == 0 ? 4096 : it % 3 == 1 ? 333 : 1024;
    int n_rows = 1 + (int)(rnd() % 5), n_req = 1 + (int)(rnd() % 9);
    float *rows = malloc(sizeof(float) * (size_t)n_rows * V), *tmp = malloc(sizeof(float) * V);
    for (int r = 0; r < n_rows; r++) make_row(rows + (size_t)r * V, V, (int)(rnd() % R_NKIND));
    sm_sampler *sa = calloc((size_t)n_req, sizeof(sm_sampler)), *sh = calloc((size_t)n_req, sizeof(sm_sampler));
    sm_sample_req *req = calloc((size_t)n_req, sizeof(sm_sample_req));
    int32_t *got = malloc(sizeof(int32_t) * n_req), *want = malloc(sizeof(int32_t) * n_req);
    int32_t hist[24];
    for (int i = 0; i < 24; i++) hist[i] = (int32_t)(rnd() % 9);
    for (int i = 0; i < n_req; i++) {
      smelt_sampling p;
      random_params(&p, V);
      sm_sampler_init(&sa[i], &p, V);
      sm_sampler_init(&sh[i], &p, V);
      sm_sampler_prepare(&sa[i], hist, 24, &req[i]);
      req[i].row = (int)(rnd() % (uint64_t)n_rows);
      memcpy(tmp, rows + (size_t)req[i].row * V, sizeof(float) * V);
      want[i] = sm_sampler_sample(&sh[i], tmp, hist, 24);
    }
    smelt_status st = op(rows, n_rows, V, req, n_req, got, true);
    CHECK(st == SMELT_OK, "batched op: %s", smelt_last_error());
    for (int i = 0; i < n_req; i++) {
      total++;
      bad += got[i] != want[i];
    }
    for (int i = 0; i < n_req; i++) {
      sm_sampler_free(&sa[i]);
      sm_sampler_free(&sh[i]);
    }
    free(sa);
    free(sh);
    free(req);
    free(got);
    free(want);
    free(rows);
    free(tmp);
  }
  CHECK(bad == 0, "batched op == host sampler (%d of %d differ)", bad, total);
  printf("batches: %d requests, %d mismatches\n", total, bad);
}

/* one op call of a decode step's size: 64 requests, each on its own row of a real vocabulary's
 * size, with the sampling settings of shipped generation configs (top_k and/or top_p) and rows
 * from flat to peaked; on the GPU these take the select path (only each row's candidates sorted) */
static void test_wide_batches(void) {
  static const float Ts[] = {0.6f, 0.8f, 1.0f, 1.5f}, tps[] = {0.9f, 0.95f, 0.5f, 1.0f, 0.0f, 0.999f},
                     mps[] = {0, 0, 0.05f}, scale[] = {0.3f, 1.0f, 3.0f, 10.0f};
  const int ks[] = {0, 0, 20, 64, 1000};
  enum { R = 64 };
  int bad = 0, total = 0;
  for (int it = 0; it < 6; it++) {
    const int V = it % 2 ? 32000 : 50257;
    float *rows = malloc(sizeof(float) * (size_t)R * V), *tmp = malloc(sizeof(float) * V);
    for (int r = 0; r < R; r++) {
      float *l = rows + (size_t)r * V;
      const int kind = rnd() % 8 ? R_GAUSS : (int)(rnd() % R_NKIND);
      make_row(l, V, kind);
      if (kind == R_GAUSS) {
        const float sc = scale[rnd() % SM_ARRAY_LEN(scale)];
        for (int i = 0; i < V; i++) l[i] *= sc;
      }
    }
    sm_sample_req req[R];
    int32_t got[R], want[R];
    for (int i = 0; i < R; i++) {
      smelt_sampling p;
      smelt_sampling_default(&p);
      p.temperature = Ts[rnd() % SM_ARRAY_LEN(Ts)];
      p.top_k = ks[rnd() % SM_ARRAY_LEN(ks)];
      p.top_p = tps[rnd() % SM_ARRAY_LEN(tps)];
      p.min_p = mps[rnd() % SM_ARRAY_LEN(mps)];
      p.seed = rnd() | 1;
      sm_sampler a, h;
      sm_sampler_init(&a, &p, V);
      sm_sampler_init(&h, &p, V);
      sm_sampler_prepare(&a, NULL, 0, &req[i]);
      req[i].row = i;
      memcpy(tmp, rows + (size_t)i * V, sizeof(float) * V);
      want[i] = sm_sampler_sample(&h, tmp, NULL, 0);
      sm_sampler_free(&a);
      sm_sampler_free(&h);
    }
    smelt_status st = op(rows, R, V, req, R, got, it == 0);
    CHECK(st == SMELT_OK, "wide batch: %s", smelt_last_error());
    for (int i = 0; i < R; i++) {
      total++;
      if (got[i] != want[i] && bad++ < 10)
        fprintf(stderr, "wide batch V=%d request %d (T=%g k=%d p=%g min_p=%g u=%.17g): op %d, host %d\n", V, i,
                req[i].temperature, req[i].top_k, req[i].top_p, req[i].min_p, req[i].u, got[i], want[i]);
    }
    free(rows);
    free(tmp);
  }
  CHECK(bad == 0, "64-request batches == host sampler (%d of %d differ)", bad, total);
  printf("wide batches: %d requests, %d mismatches\n", total, bad);
}

/* explicit u at the edges, against sm_sample_row; and independent checks of the rule */
static void test_edges(void) {
  const int V = 9000; /* above NAT_PAR_MIN: the CPU op splits natural-order rows over its threads */
  float *row = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V), *e = malloc(sizeof(float) * V);
  int32_t *idx = malloc(sizeof(int32_t) * V);
  const double us[] = {0.0, 1.0 - 1.0 / 9007199254740992.0, 0.5, 1e-300, 0.25};
  int bad = 0, n = 0;
  for (int it = 0; it < 60; it++) {
    make_row(row, V, it % R_NKIND);
    smelt_sampling p;
    random_params(&p, V);
    for (size_t k = 0; k < SM_ARRAY_LEN(us); k++) {
      sm_sample_req r = {.row = 0,
                         .temperature = p.temperature ? p.temperature : 1,
                         .top_k = p.top_k,
                         .top_p = p.top_p,
                         .min_p = p.min_p,
                         .repetition_penalty = 1,
                         .u = us[k]};
      int32_t got = -1;
      smelt_status st = op(row, 1, V, &r, 1, &got, false);
      memcpy(tmp, row, sizeof(float) * V);
      int32_t want = sm_sample_row(&r, tmp, V, e, idx);
      n++;
      if (st || got != want) bad++;
    }
  }
  CHECK(bad == 0, "explicit-u requests == sm_sample_row (%d of %d differ)", bad, n);
  /* greedy and top_k = 1 against a naive first-max (NaN ignored) */
  int gbad = 0;
  for (int it = 0; it < 40; it++) {
    make_row(row, V, it % 2 ? R_TIES : R_GAUSS);
    if (it % 5 == 0) row[rnd() % V] = NAN;
    int32_t best = -1;
    for (int i = 0; i < V; i++)
      if (row[i] == row[i] && (best < 0 || row[i] > row[best])) best = i;
    sm_sample_req g = {.row = 0, .temperature = 0, .top_p = 1, .repetition_penalty = 1};
    sm_sample_req k1 = {.row = 0, .temperature = 1, .top_k = 1, .top_p = 1, .repetition_penalty = 1, .u = unif()};
    int32_t got[2] = {-1, -1};
    sm_sample_req two[2] = {g, k1};
    smelt_status st = op(row, 1, V, two, 2, got, false);
    if (st || got[0] != best || got[1] != best) gbad++;
  }
  CHECK(gbad == 0, "greedy and top_k=1 give the first maximum (%d wrong)", gbad);
  /* bad requests are refused, not crashed on */
  sm_sample_req r = {.row = 3, .temperature = 0};
  int32_t t;
  CHECK(op(row, 1, V, &r, 1, &t, false) == SMELT_ERR_INVALID, "row out of range refused");
  sm_tok_count pc = {V + 5, 1};
  sm_sample_req r2 = {.row = 0, .temperature = 1, .repetition_penalty = 1.5f, .n_pen = 1, .pen = &pc};
  CHECK(op(row, 1, V, &r2, 1, &t, false) == SMELT_ERR_INVALID, "penalty token out of range refused");
  printf("edges: %d explicit-u requests, %d mismatches\n", n, bad);
  free(row);
  free(tmp);
  free(e);
  free(idx);
}

/* timing of the op on a Llama-3-sized row (informational) */
static void timing(void) {
  const int V = 128256;
  float *row = malloc(sizeof(float) * V), *host = malloc(sizeof(float) * V);
  make_row(row, V, R_GAUSS);
  float *d = B->alloc(B, sizeof(float) * V);
  B->upload(B, d, row, sizeof(float) * V);
  struct {
    const char *name;
    sm_sample_req r;
  } cfg[] = {
    {"greedy", {.temperature = 0, .top_p = 1}},
    {"T=0.8 (natural order)", {.temperature = 0.8f, .top_p = 1, .u = 0.3}},
    {"T=0.8 top_k=40", {.temperature = 0.8f, .top_k = 40, .top_p = 1, .u = 0.3}},
    {"T=0.8 top_p=0.9", {.temperature = 0.8f, .top_p = 0.9f, .u = 0.3}},
  };
  for (size_t c = 0; c < SM_ARRAY_LEN(cfg); c++) {
    int32_t t;
    B->sample(B, d, 1, V, &cfg[c].r, 1, &t); /* warm-up */
    int n = 0;
    double t0 = sm_now(), t1;
    do {
      B->sample(B, d, 1, V, &cfg[c].r, 1, &t);
      n++;
      t1 = sm_now();
    } while (t1 - t0 < 0.2 && n < 2000);
    printf("timing %-5s vocab %d, %-22s %9.1f us/call\n", B->name, V, cfg[c].name, 1e6 * (t1 - t0) / n);
  }
  { /* a decode step of 64 sequences: 64 rows, one request each */
    enum { R = 64 };
    float *d64 = B->alloc(B, sizeof(float) * V * R);
    for (int r = 0; r < R; r++) B->upload(B, d64 + (size_t)r * V, row, sizeof(float) * V);
    sm_sample_req rq[R];
    int32_t tk[R];
    static const char *names[] = {"T=0.8, 64 rows", "T=0.8 top_p=0.9, 64 rows", "T=0.8 k=20 p=0.95, 64 rows"};
    for (int c = 0; c < 3; c++) {
      for (int r = 0; r < R; r++)
        rq[r] = (sm_sample_req){.row = r,
                                .temperature = 0.8f,
                                .top_k = c == 2 ? 20 : 0,
                                .top_p = c == 1 ? 0.9f
                                       : c == 2 ? 0.95f
                                                : 1,
                                .u = 0.3};
      B->sample(B, d64, R, V, rq, R, tk);
      int n = 0;
      double t0 = sm_now(), t1;
      do {
        B->sample(B, d64, R, V, rq, R, tk);
        n++;
        t1 = sm_now();
      } while (t1 - t0 < 0.2 && n < 2000);
      printf("timing %-5s vocab %d, %-22s %9.1f us/call\n", B->name, V, names[c], 1e6 * (t1 - t0) / n);
    }
    B->free(B, d64);
  }
  {
    int n = 0;
    double t0 = sm_now(), t1;
    do {
      B->download(B, host, d, sizeof(float) * V);
      int32_t b = 0;
      for (int i = 1; i < V; i++)
        if (host[i] > host[b]) b = i;
      n++;
      t1 = sm_now();
    } while (t1 - t0 < 0.2 && n < 2000);
    printf("timing %-5s vocab %d, %-22s %9.1f us/call\n", B->name, V, "download + host argmax", 1e6 * (t1 - t0) / n);
  }
  B->free(B, d);
  free(row);
  free(host);
}

/* ---------------- end to end ---------------- */
static int gen_ids(sm_engine *e, const int32_t *prompt, int np, const smelt_sampling *sp, bool device, int max_new,
                   int32_t *out) {
  sm_seq *s = sm_seq_new(e);
  sm_sampler smp;
  int V = sm_engine_model(e)->cfg.vocab_size;
  sm_sampler_init(&smp, sp, V);
  sm_sampler *ps = &smp;
  float *lg = malloc(sizeof(float) * V);
  smelt_status st = sm_seq_append(e, s, prompt, np);
  int n = 0;
  while (!st && n < max_new) {
    uint8_t done = 0;
    int32_t tok = -1;
    if (device) st = sm_engine_step_sample(e, &s, 1, &ps, &tok, NULL, &done);
    else {
      st = sm_engine_step(e, &s, 1, lg, &done);
      if (!st && done) tok = sm_sampler_sample(&smp, lg, sm_seq_tokens(s), sm_seq_len(s));
    }
    if (st || !done) continue;
    out[n++] = tok;
    st = sm_seq_append(e, s, &tok, 1);
  }
  CHECK(st == SMELT_OK, "generation loop: %s", smelt_last_error());
  free(lg);
  sm_sampler_free(&smp);
  sm_seq_free(e, s);
  return n;
}

/* several sequences in one step, some sampled on the backend and some with full logits */
static void batch_e2e(smelt_model *m, const smelt_sampling *cfgs, int ncfg) {
  enum { NS = 4, STEPS = 12 };
  int V = m->cfg.vocab_size;
  int32_t toks[2][NS][STEPS];
  for (int pass = 0; pass < 2; pass++) {
    sm_engine_params ep;
    sm_engine_params_default(&ep);
    ep.max_seqs = NS;
    ep.max_context = 128;
    ep.prefix_cache = false;
    ep.max_batch_tokens = 24; /* prompts take several steps: rows appear at different steps */
    sm_engine *e = NULL;
    CHECK(sm_engine_create(m, &ep, &e) == SMELT_OK, "batch engine: %s", smelt_last_error());
    if (!e) return;
    sm_seq *seqs[NS];
    sm_sampler smp[NS];
    sm_sampler *ps[NS];
    int got[NS] = {0};
    for (int i = 0; i < NS; i++) {
      seqs[i] = sm_seq_new(e);
      int32_t pr[40];
      int np = 5 + 9 * i;
      for (int k = 0; k < np; k++) pr[k] = 3 + (k * 7 + i * 13) % (V - 3);
      sm_seq_append(e, seqs[i], pr, np);
      sm_sampler_init(&smp[i], &cfgs[i % ncfg], V);
      /* pass 1: sequence 2 keeps the full-logits path (as a logprobs request would) */
      ps[i] = pass == 1 && i == 2 ? NULL : &smp[i];
    }
    float *lg = malloc(sizeof(float) * V * NS);
    int32_t tk[NS];
    uint8_t done[NS];
    smelt_status st = SMELT_OK;
    for (int it = 0; it < 100 && !st; it++) {
      bool all = true;
      for (int i = 0; i < NS; i++) all &= got[i] >= STEPS;
      if (all) break;
      if (pass == 0) st = sm_engine_step(e, seqs, NS, lg, done);
      else st = sm_engine_step_sample(e, seqs, NS, ps, tk, lg, done);
      for (int i = 0; !st && i < NS; i++) {
        if (!done[i]) continue;
        int32_t t = pass == 0 || !ps[i]
                    ? sm_sampler_sample(&smp[i], lg + (size_t)i * V, sm_seq_tokens(seqs[i]), sm_seq_len(seqs[i]))
                    : tk[i];
        if (got[i] < STEPS) toks[pass][i][got[i]++] = t;
        st = sm_seq_append(e, seqs[i], &t, 1);
      }
    }
    CHECK(st == SMELT_OK, "batch loop: %s", smelt_last_error());
    for (int i = 0; i < NS; i++) {
      sm_seq_free(e, seqs[i]);
      sm_sampler_free(&smp[i]);
    }
    free(lg);
    sm_engine_free(e);
  }
  CHECK(memcmp(toks[0], toks[1], sizeof toks[0]) == 0, "batched step_sample (mixed rows) == full-logits sampling");
}

static bool text_cb(const char *piece, size_t len, void *user) {
  char *buf = user;
  size_t have = strlen(buf);
  if (have + len < 8192) {
    memcpy(buf + have, piece, len);
    buf[have + len] = 0;
  }
  return true;
}

static void test_e2e(const char *src, smelt_device dev) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/models/smelt-tiny", src);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = dev;
  mp.n_threads = 2;
  mp.max_context = 256;
  mp.max_seqs = 4;
  smelt_model *m = NULL;
  CHECK(smelt_model_load(dir, &mp, &m) == SMELT_OK, "load %s: %s", dir, smelt_last_error());
  if (!m) return;
  int32_t prompt[12];
  for (int i = 0; i < 12; i++) prompt[i] = 40 + 37 * i;
  smelt_sampling cfg[4];
  smelt_sampling_default(&cfg[0]); /* greedy */
  smelt_sampling_default(&cfg[1]);
  cfg[1].temperature = 0.9f;
  cfg[1].top_p = 0.9f;
  cfg[1].seed = 1234;
  smelt_sampling_default(&cfg[2]);
  cfg[2].temperature = 1.2f;
  cfg[2].top_k = 20;
  cfg[2].min_p = 0.02f;
  cfg[2].repetition_penalty = 1.3f;
  cfg[2].frequency_penalty = 0.3f;
  cfg[2].presence_penalty = 0.2f;
  cfg[2].penalty_last_n = 16;
  cfg[2].seed = 99;
  smelt_sampling_default(&cfg[3]);
  cfg[3].temperature = 0.7f;
  cfg[3].seed = 5;
  cfg[3].repetition_penalty = 1.1f;
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = 256;
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  CHECK(sm_engine_create(m, &ep, &e) == SMELT_OK, "engine: %s", smelt_last_error());
  enum { NEW = 48 };
  for (int c = 0; e && c < 4; c++) {
    int32_t a[NEW], b[NEW];
    int na = gen_ids(e, prompt, 12, &cfg[c], false, NEW, a);
    int nb = gen_ids(e, prompt, 12, &cfg[c], true, NEW, b);
    CHECK(na == NEW && nb == NEW && memcmp(a, b, sizeof a) == 0,
          "config %d: step_sample tokens == full-logits tokens (%s)", c, m->be->name);
    if (c == 1) { /* a seeded temperature run must not be degenerate */
      int distinct = 0;
      for (int i = 0; i < NEW; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= b[j] == b[i];
        distinct += !seen;
      }
      CHECK(distinct > 3, "sampled run has %d distinct tokens", distinct);
    }
  }
  sm_engine_free(e);
  batch_e2e(m, cfg, 4);
  /* sm_generate_ids: backend op vs host sampling (the engine option SMELT_HOST_SAMPLE=1 sets) */
  for (int c = 0; c < 4; c++) {
    char *t1 = calloc(8192, 1), *t2 = calloc(8192, 1);
    smelt_stats s1, s2;
    sm_engine_params hs;
    sm_engine_params_default(&hs);
    hs.host_sample = true;
    smelt_status a = sm_generate_ids(m, NULL, prompt, 12, 40, &cfg[c], text_cb, t1, &s1);
    smelt_status b = sm_generate_ids(m, &hs, prompt, 12, 40, &cfg[c], text_cb, t2, &s2);
    CHECK(a == SMELT_OK && b == SMELT_OK, "generate: %s", smelt_last_error());
    CHECK(s1.n_generated == s2.n_generated && !strcmp(t1, t2),
          "config %d: sm_generate_ids same text with the op "
          "and with host sampling (%d/%d tokens)",
          c, s1.n_generated, s2.n_generated);
    free(t1);
    free(t2);
  }
  smelt_model_free(m);
}

int main(int argc, char **argv) {
  const char *src = argc > 2 ? argv[2] : ".";
  bool cuda;
  B = sample_backend(argc, argv, &cuda);
  CHECK(B && B->sample, "%s backend has a sample op", cuda ? "cuda" : "cpu");
  if (!B || !B->sample) TEST_END();
  test_rule_vs_naive();
  test_random_rows(cuda);
  test_batches();
  test_wide_batches();
  test_edges();
  if (cuda || getenv("SMELT_SAMPLE_TIMING")) timing();
  B->destroy(B);
  if (!cuda) { /* the CPU op samples the rows of a call on its threads; with one thread, in a loop */
    B = sm_cpu_backend_create(1);
    CHECK(B != NULL, "one-thread cpu backend");
    if (B) {
      test_batches();
      test_wide_batches();
      B->destroy(B);
    }
  }
  test_e2e(src, cuda ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU);
  TEST_END();
}
