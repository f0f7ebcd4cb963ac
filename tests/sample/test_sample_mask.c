/* Grammar masks and logit biases in the backend's sample op (sm_sample_req.mask / bias_ids):
 *
 *   test_sample_mask cpu|cuda SOURCE_DIR
 *
 * 1. Random rows, masks (dense, sparse, one token, the top tokens left out, whole words, bits past
 *    the vocabulary, only -inf logits allowed) and biases (repeated ids, ids on masked tokens), with
 *    greedy and seeded top-k / top-p / min-p / penalty requests: the op returns exactly the token of
 *    the host path as it was before masks reached the backends (biases added, masked logits set to
 *    -inf in a plain loop, then sm_sample_row without mask), alone and in batches of requests with
 *    different masks over shared rows; a seeded sampler carrying mask and biases gives the same
 *    stream through sm_sampler_prepare + the op as through sm_sampler_sample; the token is allowed.
 * 2. A mask that allows no token (all zero, or bits only past the vocabulary) and bias ids out of
 *    range are refused (SMELT_ERR_INVALID), as on the host path (the engine's host_sample).
 * 3. End to end on models/smelt-tiny: a batch of sequences whose samplers carry masks (new each
 *    step) and biases gives the same tokens through sm_engine_step_sample with the backend's op as
 *    with host sampling, every token allowed.
 * With "cuda", exits 77 (ctest SKIP) when the build has no CUDA or no GPU is present. */
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "../test_util.h"
#include "sample_backend.h"

static sm_backend *B;
static uint64_t rs = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}
static float frand(void) { return (float)((double)(rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }

static bool bit(const uint32_t *m, int t) { return (m[t >> 5] >> (t & 31)) & 1u; }

/* the host path before masks reached the backends: biases, the mask as a loop, then the rule */
static int32_t reference(const sm_sample_req *r, const float *row, int V, float *tmp, float *e, int32_t *idx) {
  memcpy(tmp, row, sizeof(float) * (size_t)V);
  for (int i = 0; i < r->n_bias; i++) tmp[r->bias_ids[i]] += r->bias_vals[i];
  if (r->mask) {
    bool any = false;
    for (int t = 0; t < V; t++) {
      if (bit(r->mask, t)) any = true;
      else tmp[t] = -INFINITY;
    }
    if (!any) return -1;
  }
  sm_sample_req q = *r;
  q.mask = NULL;
  q.n_bias = 0;
  return sm_sample_row(&q, tmp, V, e, idx);
}

enum { M_DENSE, M_SPARSE, M_ONE, M_NOTOP, M_WORDS, M_TAIL, M_NEGINF, M_NKIND };
static void make_mask(uint32_t *m, int V, int kind, const float *row) {
  int W = (V + 31) / 32;
  memset(m, 0, sizeof(uint32_t) * (size_t)W);
  switch (kind) {
    case M_DENSE:
      for (int w = 0; w < W; w++) m[w] = (uint32_t)rnd();
      break;
    case M_SPARSE:
      for (int t = 0; t < V; t++)
        if (rnd() % 100 == 0) m[t >> 5] |= 1u << (t & 31);
      break;
    case M_ONE: break;
    case M_NOTOP: /* everything but the 5 largest logits */
      memset(m, 0xff, sizeof(uint32_t) * (size_t)W);
      for (int k = 0; k < 5 && k < V - 1; k++) {
        int best = -1;
        for (int t = 0; t < V; t++)
          if (bit(m, t) && (best < 0 || row[t] > row[best])) best = t;
        m[best >> 5] &= ~(1u << (best & 31));
      }
      return;
    case M_WORDS:
      for (int w = 0; w < W; w++) m[w] = rnd() % 2 ? 0xFFFFFFFFu : 0;
      break;
    case M_TAIL: /* bits past the vocabulary set: they must not count */
      if (V % 32) m[W - 1] = ~((1u << (V % 32)) - 1u);
      break;
    case M_NEGINF: /* only tokens whose logit is -inf (and one more) */
      for (int t = 0; t < V; t++)
        if (row[t] == -INFINITY) m[t >> 5] |= 1u << (t & 31);
      break;
  }
  int one = (int)(rnd() % (uint64_t)V);
  m[one >> 5] |= 1u << (one & 31); /* at least one token */
}

static void random_req(sm_sample_req *r, int V) {
  static const float Ts[] = {0, 0.7f, 1, 1.5f, 0.01f};
  static const float tps[] = {1, 0.9f, 0.5f, 0.01f};
  static const float mps[] = {0, 0.05f, 0.5f};
  memset(r, 0, sizeof *r);
  r->temperature = Ts[rnd() % SM_ARRAY_LEN(Ts)];
  int ks[] = {0, 1, 5, 40, V};
  r->top_k = ks[rnd() % SM_ARRAY_LEN(ks)];
  r->top_p = tps[rnd() % SM_ARRAY_LEN(tps)];
  r->min_p = mps[rnd() % SM_ARRAY_LEN(mps)];
  r->repetition_penalty = rnd() % 2 ? 1.0f : 1.3f;
  r->frequency_penalty = rnd() % 3 ? 0 : 0.4f;
  r->u = (double)(rnd() >> 11) * (1.0 / 9007199254740992.0);
}

/* the op on backend copies of rows[n_rows][V] */
static smelt_status op(const float *rows, int n_rows, int V, const sm_sample_req *req, int n_req, int32_t *out) {
  size_t bytes = sizeof(float) * (size_t)n_rows * V;
  float *d = B->alloc(B, bytes);
  if (!d) return sm_err(SMELT_ERR_OOM, "test: backend alloc");
  B->upload(B, d, rows, bytes);
  smelt_status st = B->sample(B, d, n_rows, V, req, n_req, out);
  float *back = malloc(bytes);
  B->download(B, back, d, bytes);
  CHECK(memcmp(back, rows, bytes) == 0, "the sample op left the logits unchanged");
  free(back);
  B->free(B, d);
  return st;
}

/* requests over shared rows, each with its own mask, biases and penalties, in one op call */
static void test_batches(void) {
  const int Vs[] = {7, 33, 1000, 4099, 32768, 50001};
  int bad = 0, total = 0, disallowed = 0, changed = 0, notop = 0;
  for (int it = 0; it < 48; it++) {
    const int V = Vs[it % SM_ARRAY_LEN(Vs)], W = (V + 31) / 32;
    const int n_rows = 1 + (int)(rnd() % 4), n_req = 1 + (int)(rnd() % 8);
    float *rows = malloc(sizeof(float) * (size_t)n_rows * V), *tmp = malloc(sizeof(float) * V),
          *e = malloc(sizeof(float) * V);
    int32_t *idx = malloc(sizeof(int32_t) * V);
    for (int i = 0; i < n_rows * V; i++) {
      uint64_t k = rnd() % 20;
      rows[i] = k == 0 ? -INFINITY : k == 1 ? (float)(rnd() % 3) : 3 * frand();
    }
    sm_sample_req *req = calloc((size_t)n_req, sizeof *req);
    uint32_t *masks = malloc(sizeof(uint32_t) * (size_t)W * n_req);
    int32_t bias_ids[8][6];
    float bias_vals[8][6];
    sm_tok_count pen[8][3];
    int kinds[8];
    for (int i = 0; i < n_req; i++) {
      random_req(&req[i], V);
      req[i].row = (int)(rnd() % (uint64_t)n_rows);
      kinds[i] = (int)(rnd() % M_NKIND);
      if (rnd() % 6) { /* some requests carry no mask */
        make_mask(masks + (size_t)i * W, V, kinds[i], rows + (size_t)req[i].row * V);
        req[i].mask = masks + (size_t)i * W;
      }
      req[i].n_bias = (int)(rnd() % 7);
      for (int k = 0; k < req[i].n_bias; k++) {
        bias_ids[i][k] = k && rnd() % 4 == 0 ? bias_ids[i][k - 1] : (int32_t)(rnd() % (uint64_t)V); /* repeats */
        bias_vals[i][k] = rnd() % 5 ? 5 * frand() : (rnd() % 2 ? 100.0f : -100.0f);
      }
      req[i].bias_ids = bias_ids[i];
      req[i].bias_vals = bias_vals[i];
      if (req[i].repetition_penalty != 1.0f || req[i].frequency_penalty != 0) {
        req[i].n_pen = V >= 3 ? 3 : 1;
        for (int k = 0; k < req[i].n_pen; k++) pen[i][k] = (sm_tok_count){(int32_t)((k * 7 + it) % V), 1 + k};
        req[i].pen = pen[i];
      }
      if (req[i].mask && kinds[i] == M_NOTOP && rnd() % 2) { /* plain greedy: the mask alone decides */
        req[i].temperature = 0;
        req[i].n_bias = req[i].n_pen = 0;
      }
    }
    int32_t got[8];
    smelt_status st = op(rows, n_rows, V, req, n_req, got);
    CHECK(st == SMELT_OK, "masked batch op (V %d): %s", V, smelt_last_error());
    for (int i = 0; !st && i < n_req; i++) {
      const float *row = rows + (size_t)req[i].row * V;
      int32_t want = reference(&req[i], row, V, tmp, e, idx);
      total++;
      if (got[i] != want && bad++ < 8)
        fprintf(stderr, "V %d req %d mask kind %d T %g k %d p %g: op %d, host path %d\n", V, i,
                req[i].mask ? kinds[i] : -1, req[i].temperature, req[i].top_k, req[i].top_p, got[i], want);
      if (!req[i].mask) continue;
      /* independent: a masked request returns an allowed token when an allowed one has a finite logit */
      bool finite = false;
      memcpy(tmp, row, sizeof(float) * V);
      for (int k = 0; k < req[i].n_bias; k++) tmp[req[i].bias_ids[k]] += req[i].bias_vals[k];
      for (int t = 0; t < V && !finite; t++) finite = bit(req[i].mask, t) && tmp[t] > -INFINITY;
      if (finite && (got[i] < 0 || got[i] >= V || !bit(req[i].mask, got[i]))) disallowed++;
      /* and the mask matters: a greedy request without the top tokens differs from the plain argmax */
      if (kinds[i] == M_NOTOP && req[i].temperature == 0 && req[i].n_bias == 0 && req[i].n_pen == 0 && V > 8) {
        sm_sample_req plain = req[i];
        plain.mask = NULL;
        notop++;
        changed += reference(&plain, row, V, tmp, e, idx) != got[i];
      }
    }
    free(rows);
    free(tmp);
    free(e);
    free(idx);
    free(req);
    free(masks);
  }
  CHECK(bad == 0, "masked op == host path (%d of %d differ)", bad, total);
  CHECK(disallowed == 0, "masked op returns allowed tokens (%d did not)", disallowed);
  CHECK(changed == notop, "a mask without the top tokens changes the greedy token (%d of %d)", changed, notop);
  printf("masked batches: %d requests, %d mismatches, %d greedy requests without their top tokens\n", total, bad,
         notop);
}

/* seeded samplers carrying mask and biases: prepare + op == sm_sampler_sample, draw after draw */
static void test_sampler_stream(void) {
  const int V = 3001, W = (V + 31) / 32;
  float *row = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V);
  uint32_t *mask = malloc(sizeof(uint32_t) * W);
  int32_t ids[3] = {5, 17, 5};
  float vals[3] = {4.0f, -2.5f, 1.0f};
  int bad = 0, n = 0;
  for (int c = 0; c < 12; c++) {
    for (int i = 0; i < V; i++) row[i] = 2 * frand();
    smelt_sampling p;
    smelt_sampling_default(&p);
    p.temperature = c % 4 == 0 ? 0 : 0.8f;
    p.top_k = c % 3 == 1 ? 30 : 0;
    p.top_p = c % 2 ? 0.9f : 1;
    p.min_p = c % 5 == 2 ? 0.05f : 0;
    p.repetition_penalty = c % 3 == 2 ? 1.2f : 1;
    p.seed = 1000 + (uint64_t)c;
    sm_sampler a, h;
    sm_sampler_init(&a, &p, V);
    sm_sampler_init(&h, &p, V);
    a.mask = h.mask = mask;
    a.bias_ids = h.bias_ids = ids;
    a.bias_vals = h.bias_vals = vals;
    a.n_bias = h.n_bias = 3;
    int32_t hist[16];
    for (int i = 0; i < 16; i++) hist[i] = (int32_t)(rnd() % 40);
    for (int d = 0; d < 6; d++) {
      make_mask(mask, V, (int)(rnd() % M_NKIND), row);
      sm_sample_req r;
      sm_sampler_prepare(&a, hist, 16, &r);
      CHECK(r.mask == mask && r.n_bias == 3 && r.bias_ids == ids, "prepare passes the mask and biases on");
      int32_t got = -1;
      smelt_status st = op(row, 1, V, &r, 1, &got);
      memcpy(tmp, row, sizeof(float) * V);
      int32_t want = sm_sampler_sample(&h, tmp, hist, 16);
      n++;
      bad += st || got != want;
    }
    sm_sampler_free(&a);
    sm_sampler_free(&h);
  }
  CHECK(bad == 0, "seeded masked samplers: op stream == sm_sampler_sample stream (%d of %d differ)", bad, n);
  free(row);
  free(tmp);
  free(mask);
}

/* requests that cannot be sampled are refused, not answered with some token */
static void test_refused(void) {
  const int V = 100, W = (V + 31) / 32;
  float row[100];
  for (int i = 0; i < V; i++) row[i] = frand();
  uint32_t mask[4] = {0, 0, 0, 0};
  sm_sample_req r = {.row = 0, .temperature = 0, .top_p = 1, .repetition_penalty = 1, .mask = mask};
  int32_t t = 123;
  CHECK(op(row, 1, V, &r, 1, &t) == SMELT_ERR_INVALID && strstr(smelt_last_error(), "allows no token"),
        "an all-zero mask is refused (%s)", smelt_last_error());
  mask[W - 1] = ~((1u << (V % 32)) - 1u); /* only bits past the vocabulary */
  CHECK(op(row, 1, V, &r, 1, &t) == SMELT_ERR_INVALID, "a mask with bits only past the vocabulary is refused");
  r.temperature = 0.8f;
  r.u = 0.5;
  CHECK(op(row, 1, V, &r, 1, &t) == SMELT_ERR_INVALID, "an all-zero mask is refused for a sampled request too");
  mask[1] = 1u << 3;
  sm_sample_req two[2] = {r, r};
  two[0].mask = NULL;
  two[1].mask = (uint32_t[4]){0, 0, 0, 0};
  int32_t tt[2];
  CHECK(op(row, 1, V, two, 2, tt) == SMELT_ERR_INVALID, "one empty mask in a batch fails the call");
  int32_t bid = V;
  float bval = 1;
  sm_sample_req rb = {.row = 0, .top_p = 1, .repetition_penalty = 1, .n_bias = 1, .bias_ids = &bid, .bias_vals = &bval};
  CHECK(op(row, 1, V, &rb, 1, &t) == SMELT_ERR_INVALID, "a logit bias out of the vocabulary is refused");
  CHECK(sm_sample_check(&r, 1, 1, V) == SMELT_OK, "a mask with one token passes the checks");
  /* the host sampler: -1, never a token */
  smelt_sampling p;
  smelt_sampling_default(&p);
  sm_sampler s;
  sm_sampler_init(&s, &p, V);
  uint32_t zero[4] = {0, 0, 0, 0};
  s.mask = zero;
  float tmp[100];
  memcpy(tmp, row, sizeof tmp);
  CHECK(sm_sampler_sample(&s, tmp, NULL, 0) == -1, "sm_sampler_sample with an all-zero mask returns -1");
  sm_sampler_free(&s);
}

/* ---------------- end to end ---------------- */
static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}
/* the mask of sequence i at its k-th sampled token (the same in both passes) */
static void step_mask(uint32_t *m, int V, int i, int k) {
  int W = (V + 31) / 32;
  uint64_t h = mix(((uint64_t)i << 32) ^ (uint64_t)k ^ 0x1234);
  for (int w = 0; w < W; w++) {
    h = mix(h + (uint64_t)w);
    /* sparse for some sequences (about 1 in 16 tokens), about half for the others */
    m[w] = i % 2 ? (uint32_t)(h & (h >> 17) & (h >> 34) & (h >> 45)) : (uint32_t)h;
  }
  m[0] |= 1u << (k % 32);
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
  enum { NS = 4, STEPS = 16 };
  const int V = m->cfg.vocab_size, W = (V + 31) / 32;
  smelt_sampling cfg[NS];
  for (int i = 0; i < NS; i++) smelt_sampling_default(&cfg[i]);
  cfg[1].temperature = 0.9f; /* seeded, top_p */
  cfg[1].top_p = 0.9f;
  cfg[1].seed = 77;
  cfg[2].temperature = 1.1f; /* seeded, top_k, min_p, penalties */
  cfg[2].top_k = 40;
  cfg[2].min_p = 0.02f;
  cfg[2].repetition_penalty = 1.2f;
  cfg[2].frequency_penalty = 0.2f;
  cfg[2].seed = 5;
  cfg[3].temperature = 0.7f; /* seeded, natural order */
  cfg[3].seed = 11;
  int32_t bias_ids[2] = {3, 200};
  float bias_vals[2] = {6.0f, -3.0f};
  int32_t toks[2][NS][STEPS];
  int disallowed = 0;
  for (int pass = 0; pass < 2; pass++) {
    sm_engine_params ep;
    sm_engine_params_default(&ep);
    ep.max_seqs = NS;
    ep.max_context = 128;
    ep.prefix_cache = false;
    ep.host_sample = pass == 0;
    sm_engine *e = NULL;
    CHECK(sm_engine_create(m, &ep, &e) == SMELT_OK, "engine: %s", smelt_last_error());
    if (!e) break;
    sm_seq *seqs[NS];
    sm_sampler smp[NS];
    sm_sampler *ps[NS];
    uint32_t *masks = malloc(sizeof(uint32_t) * (size_t)W * NS);
    int got[NS] = {0};
    for (int i = 0; i < NS; i++) {
      seqs[i] = sm_seq_new(e);
      int32_t pr[24];
      int np = 4 + 5 * i;
      for (int k = 0; k < np; k++) pr[k] = 5 + (k * 11 + i * 17) % (V - 5);
      sm_seq_append(e, seqs[i], pr, np);
      sm_sampler_init(&smp[i], &cfg[i], V);
      smp[i].mask = masks + (size_t)i * W;
      if (i != 0) {
        smp[i].bias_ids = bias_ids;
        smp[i].bias_vals = bias_vals;
        smp[i].n_bias = 2;
      }
      ps[i] = &smp[i];
    }
    int32_t tk[NS];
    uint8_t done[NS];
    smelt_status st = SMELT_OK;
    for (int it = 0; it < 200 && !st; it++) {
      bool all = true;
      for (int i = 0; i < NS; i++) all &= got[i] >= STEPS;
      if (all) break;
      for (int i = 0; i < NS; i++) step_mask(masks + (size_t)i * W, V, i, got[i]);
      st = sm_engine_step_sample(e, seqs, NS, ps, tk, NULL, done);
      for (int i = 0; !st && i < NS; i++) {
        if (!done[i]) continue;
        if (tk[i] < 0 || tk[i] >= V || !bit(masks + (size_t)i * W, tk[i])) disallowed++;
        if (got[i] < STEPS) toks[pass][i][got[i]++] = tk[i];
        st = sm_seq_append(e, seqs[i], &tk[i], 1);
      }
    }
    CHECK(st == SMELT_OK, "masked batch loop (%s): %s", pass ? "backend op" : "host", smelt_last_error());
    /* a mask that allows nothing fails the step, the same on both paths */
    memset(masks, 0, sizeof(uint32_t) * W);
    for (int i = 0; i < NS; i++) {
      int32_t t = 7;
      sm_seq_append(e, seqs[i], &t, 1);
    }
    st = sm_engine_step_sample(e, seqs, NS, ps, tk, NULL, done);
    CHECK(st == SMELT_ERR_INVALID, "an all-zero mask fails the step (%s): %d", pass ? "backend op" : "host", st);
    for (int i = 0; i < NS; i++) {
      sm_seq_free(e, seqs[i]);
      sm_sampler_free(&smp[i]);
    }
    free(masks);
    sm_engine_free(e);
  }
  CHECK(memcmp(toks[0], toks[1], sizeof toks[0]) == 0, "masked rows: the backend op's tokens == the host path's (%s)",
        m->be->name);
  CHECK(disallowed == 0, "every sampled token is allowed by its mask (%d not)", disallowed);
  smelt_model_free(m);
}

int main(int argc, char **argv) {
  const char *src = argc > 2 ? argv[2] : ".";
  bool cuda;
  B = sample_backend(argc, argv, &cuda);
  CHECK(B && B->sample, "%s backend has a sample op", cuda ? "cuda" : "cpu");
  if (!B || !B->sample) TEST_END();
  test_batches();
  test_sampler_stream();
  test_refused();
  B->destroy(B);
  test_e2e(src, cuda ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU);
  TEST_END();
}
