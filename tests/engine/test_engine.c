/* Engine: batched/continuous steps, prefix cache and forks must give the same logits as
 * one full-sequence forward pass, with the KV cache type given as the second argument (default f16;
 * ctest runs q8_0 and q4_0 too: their rows are quantized alike whichever step writes them). */
#include <string.h>
#include <sys/stat.h>
#include "engine/engine.h"
#include "engine/sampler.h"
#include "backend/backend.h"
#include "../test_util.h"

static smelt_model *M;
static int V;
static const double TOL = 2e-3;

static float *ref_logits(const int32_t *ids, int n) {
  float *l = NULL;
  smelt_status st = smelt_eval_logits(M, ids, n, &l);
  if (st) {
    fprintf(stderr, "eval: %s\n", smelt_last_error());
    exit(1);
  }
  return l;
}

static void fill(int32_t *t, int n, uint64_t seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    t[i] = (int32_t)((seed >> 33) % (uint64_t)V);
  }
}

/* sm_engine_decode against the loop it replaces (step, emit, append), on a fresh engine each */
typedef struct {
  int32_t tok[64];
  int n, stop_at;
} rec_t;
static bool rec_emit(void *ud, int32_t t) {
  rec_t *r = ud;
  if (r->n < 64) r->tok[r->n] = t;
  r->n++;
  return r->n != r->stop_at;
}
static void decode_case(const int32_t *prompt, int np, float temp, int max_new, int stop_at, bool use_decode, rec_t *r,
                        int32_t *state, int *state_len) {
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = 128;
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  CHECK(sm_engine_create(M, &ep, &e) == SMELT_OK, "engine: %s", smelt_last_error());
  if (!e) return;
  smelt_sampling sp;
  smelt_sampling_default(&sp);
  sp.temperature = temp;
  sp.seed = 11;
  sm_sampler smp;
  sm_sampler_init(&smp, &sp, V);
  sm_sampler *ps = &smp;
  sm_seq *q = sm_seq_new(e);
  sm_seq_append(e, q, prompt, np);
  uint8_t done = 0;
  int32_t tok = -1;
  while (!done) CHECK(sm_engine_step_sample(e, &q, 1, &ps, &tok, NULL, &done) == SMELT_OK, "prompt step");
  r->n = 0;
  r->stop_at = stop_at;
  if (use_decode) {
    int nn = -1;
    CHECK(sm_engine_decode(e, q, ps, tok, max_new, rec_emit, r, &nn) == SMELT_OK, "decode: %s", smelt_last_error());
    CHECK(nn == r->n, "decode reports %d tokens, emitted %d", nn, r->n);
  } else {
    sm_seq_append(e, q, &tok, 1);
    for (int n = 0; n < max_new;) {
      done = 0;
      while (!done) CHECK(sm_engine_step_sample(e, &q, 1, &ps, &tok, NULL, &done) == SMELT_OK, "step");
      n++;
      if (!rec_emit(r, tok) || n == max_new) break;
      sm_seq_append(e, q, &tok, 1);
    }
  }
  *state_len = sm_seq_len(q);
  memcpy(state, sm_seq_tokens(q), sizeof(int32_t) * (size_t)(*state_len < 128 ? *state_len : 128));
  sm_seq_free(e, q);
  sm_sampler_free(&smp);
  sm_engine_free(e);
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "/tmp/smelt-test-engine";
  mkdir(dir, 0755);
  char mdir[512];
  /* argv[3]: another synthetic shape (gemma4-test: layers of their own K/V shape, shared K/V, per-layer inputs) */
  const char *shape = argc > 3 ? argv[3] : "test";
  snprintf(mdir, sizeof mdir, "%s/model-%s-q4", dir, shape);
  if (!sm_synth_find(shape) || sm_make_synthetic(sm_synth_find(shape), 4, 32, mdir, false)) {
    fprintf(stderr, "%s\n", smelt_last_error());
    return 1;
  }
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  mp.max_context = 256;
  if (argc > 2 && smelt_kv_type_parse(argv[2], &mp.kv_type)) {
    fprintf(stderr, "%s\n", smelt_last_error());
    return 1;
  }
  if (smelt_model_load(mdir, &mp, &M)) {
    fprintf(stderr, "load: %s\n", smelt_last_error());
    return 1;
  }
  V = smelt_model_vocab_size(M);
  enum { N = 60 };
  int32_t a[N], b[N], c[N];
  fill(a, N, 1);
  fill(b, N, 2);
  memcpy(c, a, sizeof(int32_t) * 40);
  fill(c + 40, N - 40, 3); /* c shares a 40-token prefix with a */
  float *ra = ref_logits(a, N), *rb = ref_logits(b, N), *rc = ref_logits(c, N);
  /* logits must not be degenerate (test could not fail otherwise) */
  double spread = 0;
  for (int i = 1; i < V; i++) spread = fmax(spread, fabs(ra[i] - ra[0]));
  CHECK(spread > 1e-3, "reference logits are constant");

  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = 4;
  ep.max_context = 128;
  ep.max_batch_tokens = 24;
  ep.block_size = 16;
  sm_engine *e = NULL;
  CHECK(sm_engine_create(M, &ep, &e) == SMELT_OK, "engine create: %s", smelt_last_error());
  float *lg = malloc(sizeof(float) * 4 * V);
  uint8_t done[4];

  /* 1. one sequence: 30-token prompt (chunked 24+6), then one token at a time */
  sm_seq *s = sm_seq_new(e);
  sm_seq_append(e, s, a, 30);
  int steps = 0;
  done[0] = 0;
  while (!done[0]) {
    CHECK(sm_engine_step(e, &s, 1, lg, done) == SMELT_OK, "step");
    steps++;
  }
  CHECK(steps == 2, "prompt of 30 with budget 24 takes 2 steps (took %d)", steps);
  CHECK(t_max_rel(lg, ra + 29 * V, V, 1.0) < TOL, "prefill logits differ: %g", t_max_rel(lg, ra + 29 * V, V, 1.0));
  double worst = 0;
  for (int p = 30; p < N; p++) {
    sm_seq_append(e, s, &a[p], 1);
    sm_engine_step(e, &s, 1, lg, done);
    worst = fmax(worst, t_max_rel(lg, ra + (size_t)p * V, V, 1.0));
  }
  CHECK(worst < TOL, "decode logits differ from full forward: %g", worst);
  sm_seq_free(e, s);

  /* 2. three sequences in one continuous batch, joining at different times */
  sm_seq *q[3] = {sm_seq_new(e), sm_seq_new(e), sm_seq_new(e)};
  const int32_t *src[3] = {a, b, c};
  const float *ref[3] = {ra, rb, rc};
  int next[3] = {20, 9, 33};
  sm_seq_append(e, q[0], a, 20);
  int active = 1;
  double wb = 0;
  for (int it = 0; it < 200; it++) {
    if (it == 3 && active == 1) {
      sm_seq_append(e, q[1], b, 9);
      active = 2;
    }
    if (it == 6 && active == 2) {
      sm_seq_append(e, q[2], c, 33);
      active = 3;
    }
    memset(done, 0, sizeof done);
    if (sm_engine_step(e, q, active, lg, done)) {
      CHECK(0, "batched step: %s", smelt_last_error());
      break;
    }
    bool all_end = true;
    for (int i = 0; i < active; i++) {
      if (done[i]) {
        int p = sm_seq_len(q[i]) - 1;
        wb = fmax(wb, t_max_rel(lg + (size_t)i * V, ref[i] + (size_t)p * V, V, 1.0));
        if (next[i] < N) {
          sm_seq_append(e, q[i], &src[i][next[i]], 1);
          next[i]++;
        }
      }
      if (next[i] < N || sm_seq_pending(q[i])) all_end = false;
    }
    if (active == 3 && all_end) break;
  }
  CHECK(next[0] == N && next[1] == N && next[2] == N, "batched sequences did not finish");
  CHECK(wb < TOL, "batched logits differ: %g", wb);
  for (int i = 0; i < 3; i++) sm_seq_free(e, q[i]);

  /* 3. prefix cache: a's blocks are cached; c shares 40 tokens -> 2 full blocks reused */
  sm_engine_stats st0;
  sm_engine_get_stats(e, &st0);
  CHECK(st0.blocks_used == 0, "blocks leaked after freeing all sequences: %d", st0.blocks_used);
  CHECK(st0.blocks_cached > 0, "no cached blocks");
  /* d shares only a's first 40 tokens (2 full blocks of 16) */
  int32_t dd[N];
  memcpy(dd, a, sizeof(int32_t) * 40);
  fill(dd + 40, N - 40, 4);
  sm_seq *pd = sm_seq_new(e);
  sm_seq_append(e, pd, dd, 50);
  int reused = sm_seq_use_prefix_cache(e, pd);
  CHECK(reused == 32, "prefix cache reused %d tokens of a shared 40-token prefix, expected 32", reused);
  done[0] = 0;
  while (!done[0]) sm_engine_step(e, &pd, 1, lg, done);
  float *rd = ref_logits(dd, 50);
  CHECK(t_max_rel(lg, rd + 49 * V, V, 1.0) < TOL, "logits after partial prefix reuse differ");
  free(rd);
  sm_seq_free(e, pd);
  /* c itself was fully computed before: 3 full blocks of its first 50 tokens are cached */
  sm_seq *pc = sm_seq_new(e);
  sm_seq_append(e, pc, c, 50);
  reused = sm_seq_use_prefix_cache(e, pc);
  CHECK(reused == 48, "prefix cache reused %d tokens, expected 48", reused);
  done[0] = 0;
  while (!done[0]) sm_engine_step(e, &pc, 1, lg, done);
  CHECK(t_max_rel(lg, rc + 49 * V, V, 1.0) < TOL, "logits after prefix reuse differ: %g",
        t_max_rel(lg, rc + 49 * V, V, 1.0));
  /* 4. fork: continue both with different tokens */
  sm_seq *fk = sm_seq_fork(e, pc);
  sm_seq *two[2] = {pc, fk};
  sm_seq_append(e, pc, &c[50], 1);
  sm_seq_append(e, fk, &a[50], 1); /* fk = c[0:50] + a[50] */
  float *lp = malloc(sizeof(float) * V), *lf = malloc(sizeof(float) * V);
  bool got[2] = {false, false};
  for (int it = 0; it < 10 && !(got[0] && got[1]); it++) {
    uint8_t d2[2] = {0, 0};
    if (sm_engine_step(e, two, 2, lg, d2)) break;
    if (d2[0]) {
      memcpy(lp, lg, sizeof(float) * V);
      got[0] = true;
    }
    if (d2[1]) {
      memcpy(lf, lg + V, sizeof(float) * V);
      got[1] = true;
    }
  }
  CHECK(got[0] && got[1], "fork step did not complete");
  CHECK(t_max_rel(lp, rc + 50 * V, V, 1.0) < TOL, "fork parent logits differ");
  int32_t cf[51];
  memcpy(cf, c, sizeof(int32_t) * 50);
  cf[50] = a[50];
  float *rf = ref_logits(cf, 51);
  CHECK(t_max_rel(lf, rf + 50 * V, V, 1.0) < TOL, "fork child logits differ: %g", t_max_rel(lf, rf + 50 * V, V, 1.0));
  free(rf);
  free(lp);
  free(lf);
  sm_seq_free(e, pc);
  sm_seq_free(e, fk);
  sm_engine_free(e);

  /* 5. KV exhaustion is an error, not a crash, and freeing recovers */
  ep.n_blocks = 6;
  ep.max_context = 64;
  ep.max_seqs = 2;
  CHECK(sm_engine_create(M, &ep, &e) == SMELT_OK, "small engine");
  sm_seq *x1 = sm_seq_new(e), *x2 = sm_seq_new(e);
  sm_seq_append(e, x1, a, 60);
  sm_seq_append(e, x2, b, 60);
  sm_seq *xs[2] = {x1, x2};
  smelt_status r = SMELT_OK;
  bool x1_done = false;
  for (int i = 0; i < 10 && !r; i++) {
    memset(done, 0, 2);
    r = sm_engine_step(e, xs, 2, lg, done);
    if (!r && done[0]) x1_done = true;
  }
  CHECK(r == SMELT_ERR_OOM, "expected KV OOM, got %d", r);
  sm_seq_free(e, x2);
  r = SMELT_OK;
  for (int i = 0; i < 10 && !r && !x1_done; i++) {
    done[0] = 0;
    r = sm_engine_step(e, &x1, 1, lg, done);
    x1_done = done[0];
  }
  CHECK(r == SMELT_OK && x1_done && sm_seq_pending(x1) == 0, "after freeing, the other sequence completes");
  CHECK(t_max_rel(lg, ra + 59 * V, V, 1.0) < TOL, "logits after OOM recovery differ");
  /* context limit */
  int32_t badtok = V + 5;
  CHECK(sm_seq_append(e, x1, &badtok, 1) == SMELT_ERR_INVALID, "out-of-vocab token rejected");
  CHECK(sm_seq_append(e, x1, a, 4) == SMELT_OK && sm_seq_append(e, x1, a, 1) == SMELT_ERR_LIMIT,
        "context limit enforced");
  sm_seq_free(e, x1);
  /* 6. sm_engine_decode (one step at a time on the CPU: no sample_async) == the stepwise loop,
   * greedy and seeded sampling, run to max_new or stopped by the callback */
  CHECK(M->be->sample_async == NULL, "the cpu backend has no sample_async (pipelined path is tested in tests/cuda)");
  {
    sm_seq *pq = sm_seq_new(e);
    sm_seq_append(e, pq, a, 3);
    CHECK(sm_engine_decode(e, pq, NULL, a[0], 4, rec_emit, NULL, NULL) == SMELT_ERR_INVALID,
          "decode refuses a sequence with pending tokens");
    sm_seq_free(e, pq);
  }
  const float temps[] = {0.f, 0.9f};
  const int stops[] = {0, 5, 1};
  for (int ti = 0; ti < 2; ti++)
    for (int si = 0; si < 3; si++) {
      rec_t r1, r2;
      int32_t s1[128], s2[128];
      int l1 = 0, l2 = 0;
      decode_case(b, 9, temps[ti], 12, stops[si], true, &r1, s1, &l1);
      decode_case(b, 9, temps[ti], 12, stops[si], false, &r2, s2, &l2);
      CHECK(r1.n == r2.n && r1.n == (stops[si] ? stops[si] : 12), "decode T %g stop %d: %d vs %d tokens", temps[ti],
            stops[si], r1.n, r2.n);
      CHECK(!memcmp(r1.tok, r2.tok, sizeof(int32_t) * (size_t)r1.n), "decode T %g stop %d: different tokens", temps[ti],
            stops[si]);
      CHECK(l1 == l2 && l1 == 9 + r1.n && !memcmp(s1, s2, sizeof(int32_t) * (size_t)l1),
            "decode T %g stop %d: sequence state %d vs %d tokens", temps[ti], stops[si], l1, l2);
    }
  /* a fed token is a device-side feature: the CPU backend rejects it */
  {
    int32_t t0 = 1, p0 = 0, s0 = 0, tb = 0, o0 = 0;
    sm_batch fb = {.n_tokens = 1,
                   .tokens = &t0,
                   .pos = &p0,
                   .seq = &s0,
                   .n_seqs = 1,
                   .max_blocks = 1,
                   .block_table = &tb,
                   .n_out = 1,
                   .out_rows = &o0,
                   .feed_token = 1};
    CHECK(M->be->set_batch(M->be, &fb) == SMELT_ERR_UNSUPPORTED, "cpu set_batch rejects feed_token");
    /* a fed row that no sample_batch_async produced is refused, not read */
    const int32_t fr = 5;
    fb.feed_token = 0;
    fb.feed_rows = &fr;
    CHECK(M->be->set_batch(M->be, &fb) == SMELT_ERR_INVALID, "cpu set_batch refuses a fed row beyond the last sample");
  }
  /* 7. pipelined batch steps (SMELT_PIPELINE=always on the CPU): a step launched before the previous one's
   * tokens are collected, its inputs fed from them, gives the tokens and sequences of the stepwise loop;
   * the prefix cache registers a block of fed tokens with their real values */
  {
    sm_engine_params pp;
    sm_engine_params_default(&pp);
    pp.max_seqs = 4;
    pp.max_context = 128;
    pp.max_batch_tokens = 64;
    sm_engine *pe = NULL;
    CHECK(!sm_engine_batch_pipeline(e), "no pipelined batch steps on the CPU unless asked");
    pp.pipeline_always = true;
    enum { NG = 10 };
    int32_t got[2][2][NG], fin[2][2][64];
    int flen[2][2];
    bool ran = true;
    for (int mode = 0; mode < 2 && ran; mode++) { /* an engine each: the second finds no block of the first */
      ran = sm_engine_create(M, &pp, &pe) == SMELT_OK && sm_engine_batch_pipeline(pe);
      CHECK(ran, "pipelined engine: %s", smelt_last_error());
      if (!ran) break;
      smelt_sampling sp;
      smelt_sampling_default(&sp);
      sp.temperature = 0.9f;
      sm_sampler sm2[2];
      sm_sampler *ps[2] = {&sm2[0], &sm2[1]};
      sm_seq *q[2] = {sm_seq_new(pe), sm_seq_new(pe)};
      for (int k = 0; k < 2; k++) {
        sp.seed = 21 + (uint64_t)k;
        sm_sampler_init(&sm2[k], &sp, V);
      }
      sm_seq_append(pe, q[0], a, 30);
      sm_seq_append(pe, q[1], b, 9);
      int n[2] = {0, 0};
      if (mode == 0) { /* step by step */
        while (n[0] < NG || n[1] < NG) {
          int32_t tk[2];
          uint8_t dn[2] = {0, 0};
          CHECK(sm_engine_step_sample(pe, q, 2, ps, tk, NULL, dn) == SMELT_OK, "step: %s", smelt_last_error());
          for (int k = 0; k < 2; k++)
            if (dn[k]) {
              got[0][k][n[k]++] = tk[k];
              if (n[k] < NG) sm_seq_append(pe, q[k], &tk[k], 1);
            }
        }
      } else { /* pipelined: launch i + 1 (fed from launch i), then collect launch i */
        uint8_t dn[2][2];
        int tick[2] = {-1, -1}, cur = 0;
        bool live = false;
        CHECK(sm_engine_step_launch(pe, q, 2, ps, dn[cur], &tick[cur]) == SMELT_OK, "launch: %s", smelt_last_error());
        live = true;
        while (live) {
          const int nx = 1 - cur;
          bool any = false;
          for (int k = 0; k < 2; k++)
            if (dn[cur][k] && n[k] + 1 < NG) any |= sm_seq_append_fed(pe, q[k], k) == SMELT_OK;
          if (any)
            CHECK(sm_engine_step_launch(pe, q, 2, ps, dn[nx], &tick[nx]) == SMELT_OK, "launch: %s", smelt_last_error());
          int32_t tk[2];
          CHECK(sm_engine_step_collect(pe, tick[cur], tk) == SMELT_OK, "collect: %s", smelt_last_error());
          for (int k = 0; k < 2; k++) {
            if (!dn[cur][k]) continue;
            got[1][k][n[k]++] = tk[k];
            if (sm_seq_fed(q[k])) sm_seq_set_fed(pe, q[k], tk[k]);
            else if (n[k] < NG) sm_seq_append(pe, q[k], &tk[k], 1);
          }
          live = any;
          cur = nx;
        }
      }
      for (int k = 0; k < 2; k++) {
        CHECK(n[k] == NG, "mode %d seq %d: %d tokens", mode, k, n[k]);
        flen[mode][k] = sm_seq_len(q[k]);
        memcpy(fin[mode][k], sm_seq_tokens(q[k]), sizeof(int32_t) * (size_t)flen[mode][k]);
      }
      if (mode == 1) { /* q[0]'s blocks of fed tokens were registered with their values */
        sm_seq_free(pe, q[0]);
        sm_seq *r = sm_seq_new(pe);
        sm_seq_append(pe, r, fin[1][0], flen[1][0]);
        const int reused = sm_seq_use_prefix_cache(pe, r);
        CHECK(reused == 32, "prefix cache after fed tokens: %d of %d reused (want 32)", reused, flen[1][0]);
        sm_seq_free(pe, r);
        sm_seq_free(pe, q[1]);
      } else {
        sm_seq_free(pe, q[0]);
        sm_seq_free(pe, q[1]);
      }
      sm_sampler_free(&sm2[0]);
      sm_sampler_free(&sm2[1]);
      sm_engine_free(pe);
    }
    for (int k = 0; k < 2 && ran; k++) {
      CHECK(!memcmp(got[0][k], got[1][k], sizeof(int32_t) * NG), "pipelined seq %d: other tokens", k);
      CHECK(flen[0][k] == flen[1][k] && flen[0][k] == (k ? 9 : 30) + NG - 1 &&
              !memcmp(fin[0][k], fin[1][k], sizeof(int32_t) * (size_t)flen[0][k]),
            "pipelined seq %d: sequence of %d tokens vs %d", k, flen[1][k], flen[0][k]);
    }
  }
  sm_engine_free(e);
  free(lg);
  free(ra);
  free(rb);
  free(rc);
  smelt_model_free(M);
  TEST_END();
}
