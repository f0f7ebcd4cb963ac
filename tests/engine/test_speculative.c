/* Speculative decoding with the shipped draft model gives exactly the target model's
 * output (greedy and seeded sampling), and the draft does contribute tokens. The batched
 * verification step of the server (sm_engine_step_rows) gives a verifying sequence the rows of
 * one-token steps and its neighbours the rows they get alone, also after rollbacks. */
#include <math.h>
#include <string.h>
#include "engine/engine.h"
#include "../test_util.h"

typedef struct {
  char buf[8192];
  size_t len;
} text;
static bool collect(const char *p, size_t l, void *u) {
  text *t = u;
  if (t->len + l < sizeof t->buf) {
    memcpy(t->buf + t->len, p, l);
    t->len += l;
    t->buf[t->len] = 0;
  }
  return true;
}

static smelt_model *load(const char *root, const char *name) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/models/%s", root, name);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    fprintf(stderr, "%s: %s\n", name, smelt_last_error());
    exit(1);
  }
  return m;
}

static double max_diff(const float *a, const float *b, int n) {
  double d = 0;
  for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
  return d;
}

static int32_t argmax(const float *l, int n) {
  int32_t b = 0;
  for (int i = 1; i < n; i++)
    if (l[i] > l[b]) b = i;
  return b;
}

/* sequence B decodes greedily alone (reference rows); then again in one engine next to A, which
 * verifies 1 + 4 tokens every step (its draft: B's next tokens shifted, so that some match) and is
 * rolled back to a varying accepted length; A's rows are checked against one-token steps of its
 * own tokens in a third engine */
static void test_step_rows(smelt_model *m) {
  const int V = m->cfg.vocab_size, N = 12;
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = 2;
  ep.max_context = 256;
  ep.max_batch_tokens = 64;
  sm_engine *e1 = NULL, *e2 = NULL, *e3 = NULL;
  CHECK(!sm_engine_create(m, &ep, &e1) && !sm_engine_create(m, &ep, &e2) && !sm_engine_create(m, &ep, &e3), "engines");
  int32_t pa[37], pb[29];
  for (int i = 0; i < 37; i++) pa[i] = 100 + i * 7;
  for (int i = 0; i < 29; i++) pb[i] = 300 + i * 3;
  float *ref = sm_xmalloc(sizeof(float) * (size_t)V * N), *rows = sm_xmalloc(sizeof(float) * (size_t)V * 8),
        *one = sm_xmalloc(sizeof(float) * (size_t)V);
  int32_t gb[12];
  sm_seq *b1 = sm_seq_new(e1);
  sm_seq_append(e1, b1, pb, 29);
  for (int t = 0; t < N; t++) {
    uint8_t d = 0;
    while (!d) CHECK(!sm_engine_step(e1, &b1, 1, ref + (size_t)t * V, &d), "reference step");
    gb[t] = argmax(ref + (size_t)t * V, V);
    sm_seq_append(e1, b1, &gb[t], 1);
  }
  sm_seq *a = sm_seq_new(e2), *b = sm_seq_new(e2), *ss[2] = {a, b};
  sm_seq_append(e2, a, pa, 37);
  sm_seq_append(e2, b, pb, 29);
  uint8_t done[2] = {0, 0}, got[2] = {0, 0};
  while (!got[0] || !got[1]) {
    CHECK(sm_engine_step(e2, ss, 2, rows, done) == SMELT_OK, "prompt step");
    if (done[1]) memcpy(one, rows + V, sizeof(float) * (size_t)V);
    got[0] |= done[0];
    got[1] |= done[1];
  }
  CHECK(max_diff(one, ref, V) == 0, "B's first row differs next to A's prompt");
  int n_checked = 0;
  for (int t = 1; t < N; t++) {
    sm_seq_append(e2, b, &gb[t - 1], 1);
    const int base = sm_seq_len(a);
    /* A's last sampled token, then its draft */
    int32_t v[5] = {(int32_t)(200 + t), gb[t], gb[(t + 1) % N], (int32_t)(7 + t), gb[(t + 3) % N]};
    sm_seq_append(e2, a, v, 5);
    uint8_t all[2] = {1, 0};
    int row0[2], nrows[2];
    CHECK(sm_engine_step_rows(e2, ss, 2, all, rows, row0, nrows, done) == SMELT_OK, "step_rows: %s",
          smelt_last_error());
    CHECK(done[0] && done[1] && nrows[0] == 5 && nrows[1] == 1, "rows %d %d, done %d %d", nrows[0], nrows[1], done[0],
          done[1]);
    CHECK(max_diff(rows + (size_t)row0[1] * V, ref + (size_t)t * V, V) == 0,
          "step %d: B's row differs next to A's verification (max |diff| %g)", t,
          max_diff(rows + (size_t)row0[1] * V, ref + (size_t)t * V, V));
    /* A's rows against one-token steps over the same tokens */
    sm_seq *a3 = sm_seq_new(e3);
    sm_seq_append(e3, a3, sm_seq_tokens(a), base + 1);
    for (int r = 0; r < 5; r++) {
      uint8_t d = 0;
      while (!d) sm_engine_step(e3, &a3, 1, one, &d);
      CHECK(max_diff(rows + (size_t)(row0[0] + r) * V, one, V) == 0,
            "step %d: A's row %d differs from one-token decode", t, r);
      n_checked++;
      if (r < 4) sm_seq_append(e3, a3, &v[r + 1], 1);
    }
    sm_seq_free(e3, a3);
    CHECK(sm_seq_truncate(e2, a, base + 1 + t % 4) == SMELT_OK, "rollback");
  }
  printf("step_rows: %d verified rows equal one-token rows\n", n_checked);
  /* a verification longer than the step budget is refused, not split */
  int32_t many[80];
  for (int i = 0; i < 80; i++) many[i] = 50 + i;
  sm_seq_append(e2, a, many, 80);
  uint8_t all[2] = {1, 0};
  int row0[2], nrows[2];
  float *big = sm_xmalloc(sizeof(float) * (size_t)V * 82);
  CHECK(sm_engine_step_rows(e2, ss, 2, all, big, row0, nrows, done) == SMELT_ERR_LIMIT, "over-budget verification");
  free(big);
  free(ref);
  free(rows);
  free(one);
  sm_seq_free(e1, b1);
  sm_seq_free(e2, a);
  sm_seq_free(e2, b);
  sm_engine_free(e1);
  sm_engine_free(e2);
  sm_engine_free(e3);
}

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : ".";
  smelt_model *m = load(root, "smelt-tiny"), *d = load(root, "smelt-tiny-draft");
  test_step_rows(m);
  const char *prompts[] = {"In the beginning God created",
                           "The module defines the following functions:", "And it came to pass"};
  int total_acc = 0;
  for (int pi = 0; pi < 3; pi++) {
    int32_t *ids = NULL;
    size_t n = 0;
    smelt_tokenize(smelt_model_tokenizer(m), prompts[pi], strlen(prompts[pi]), true, &ids, &n);
    for (int mode = 0; mode < 2; mode++) {
      smelt_sampling sp;
      smelt_sampling_default(&sp);
      if (mode) {
        sp.temperature = 0.8f;
        sp.top_p = 0.95f;
        sp.seed = 100 + pi;
      }
      for (int k = 1; k <= 6; k += 5) {
        text a = {.len = 0}, b = {.len = 0};
        smelt_stats sa, sb;
        int acc = 0;
        CHECK(sm_generate_ids(m, NULL, ids, (int)n, 48, &sp, collect, &a, &sa) == SMELT_OK, "plain generation");
        CHECK(sm_generate_speculative(m, d, NULL, k, ids, (int)n, 48, &sp, collect, &b, &sb, &acc) == SMELT_OK,
              "speculative: %s", smelt_last_error());
        CHECK(a.len > 0 && !strcmp(a.buf, b.buf), "prompt %d mode %d k %d: outputs differ\n  plain: %s\n  spec:  %s",
              pi, mode, k, a.buf, b.buf);
        CHECK(sa.n_generated == sb.n_generated, "token counts differ: %d vs %d", sa.n_generated, sb.n_generated);
        total_acc += acc;
      }
    }
    free(ids);
  }
  printf("draft tokens accepted in total: %d\n", total_acc);
  CHECK(total_acc > 20, "the draft model contributed only %d tokens", total_acc);
  /* an invalid draft length is refused */
  int32_t one = 1;
  CHECK(sm_generate_speculative(m, d, NULL, 0, &one, 1, 4, NULL, NULL, NULL, NULL, NULL) == SMELT_ERR_INVALID,
        "k=0 refused");
  smelt_model_free(m);
  smelt_model_free(d);
  TEST_END();
}
