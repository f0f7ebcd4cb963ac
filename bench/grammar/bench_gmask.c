/* The GPU's share of constrained decoding: what grammar masks add to a batched decode step when
 * the backend applies them (sm_sample_req.mask: one pinned upload of all masks of the step, a
 * kernel that sets masked logits to -inf, then the usual device sampler), against the decode step
 * itself, on the random-weight Llama-3.2-1B shape at 4 bits (vocabulary 128,256).
 *   bench_gmask [--dir DIR] [--batch B] [--rounds R] [--device cuda|cpu] [--write-only]
 * DIR holds the synthetic checkpoint (written once; default /tmp/smelt-gmask-1b-q4-g64; --write-only:
 * just write it). Measured:
 *  - the sample op on B rows of logits without and with masks (and with masks and logit biases),
 *    median of many calls: the difference is the masks' upload + application;
 *  - decode steps of B sequences (sm_engine_step_sample, greedy, sampled on the device) without
 *    and with masks, alternating blocks of steps, median step time of each;
 * and prints "mask cost: X% of a batch-B decode step" (the op-level difference over the plain
 * step). Building the masks is host work measured by bench_grammar --batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"

static uint64_t rs = 0x853c49e6748fea9bULL;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_d);
  return v[n / 2];
}

/* masks like a JSON grammar's: some rows allow most tokens (inside a string), some a few hundred
 * (a number, a key), some a handful (punctuation) */
static void make_masks(uint32_t *m, int V, int B) {
  const int W = (V + 31) / 32;
  memset(m, 0, sizeof(uint32_t) * (size_t)W * B);
  for (int r = 0; r < B; r++) {
    uint32_t *x = m + (size_t)r * W;
    switch (r % 3) {
      case 0:
        for (int w = 0; w < W; w++) x[w] = ~(uint32_t)(rnd() & rnd() & rnd());
        break;
      case 1:
        for (int k = 0; k < 300; k++) {
          int t = (int)(rnd() % (uint64_t)V);
          x[t >> 5] |= 1u << (t & 31);
        }
        break;
      default:
        for (int k = 0; k < 5; k++) {
          int t = (int)(rnd() % (uint64_t)V);
          x[t >> 5] |= 1u << (t & 31);
        }
    }
  }
}

/* median time of the sample op over `reps` calls */
static double time_op(sm_backend *be, const float *logits, int B, int V, const sm_sample_req *req, int reps) {
  double *t = malloc(sizeof(double) * (size_t)reps);
  int32_t *out = malloc(sizeof(int32_t) * (size_t)B);
  be->sample(be, logits, B, V, req, B, out); /* warm-up (scratch grown) */
  for (int i = 0; i < reps; i++) {
    double a = sm_now();
    if (be->sample(be, logits, B, V, req, B, out)) {
      fprintf(stderr, "bench_gmask: sample op: %s\n", smelt_last_error());
      exit(1);
    }
    t[i] = sm_now() - a;
  }
  double m = median(t, reps);
  free(t);
  free(out);
  return m;
}

int main(int argc, char **argv) {
  const char *dir = "/tmp/smelt-gmask-1b-q4-g64", *device = "cuda";
  int B = 64, rounds = 6;
  bool write_only = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!strcmp(argv[i], "--write-only")) write_only = true;
    else {
      fprintf(stderr, "usage: bench_gmask [--dir DIR] [--batch B] [--rounds R] [--device cuda|cpu] [--write-only]\n");
      return 2;
    }
  }
  if (B < 1 || B > 256 || rounds < 1 || rounds > 100 || (strcmp(device, "cuda") && strcmp(device, "cpu"))) {
    fprintf(stderr, "bench_gmask: --batch 1..256, --rounds 1..100, --device cuda or cpu\n");
    return 2;
  }
  if (sm_make_synthetic(sm_synth_find("1b"), 4, 64, dir, false)) {
    fprintf(stderr, "bench_gmask: %s\n", smelt_last_error());
    return 1;
  }
  if (write_only) return 0;
  enum { PROMPT = 16, BLOCK = 8 };
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = strcmp(device, "cuda") ? SMELT_DEVICE_CPU : SMELT_DEVICE_CUDA;
  mp.max_context = PROMPT + 2 * rounds * BLOCK + 2 * BLOCK + 16;
  mp.max_seqs = B;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    fprintf(stderr, "bench_gmask: load %s: %s\n", dir, smelt_last_error());
    return 1;
  }
  sm_backend *be = m->be;
  const int V = m->cfg.vocab_size, W = (V + 31) / 32;
  if (!be->sample) {
    fprintf(stderr, "bench_gmask: the %s backend has no sample op\n", be->name);
    return 1;
  }
  uint32_t *masks = malloc(sizeof(uint32_t) * (size_t)W * B);
  make_masks(masks, V, B);
  int32_t bias_ids[4] = {11, 220, 4000, 90000 % V};
  float bias_vals[4] = {2.0f, -1.0f, 5.0f, -100.0f};

  /* ---- the sample op alone on B rows ---- */
  float *host = malloc(sizeof(float) * (size_t)B * V);
  for (size_t i = 0; i < (size_t)B * V; i++) host[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0) * 8 - 4;
  float *logits = be->alloc(be, sizeof(float) * (size_t)B * V);
  be->upload(be, logits, host, sizeof(float) * (size_t)B * V);
  sm_sample_req *plain = calloc((size_t)B, sizeof *plain), *masked = calloc((size_t)B, sizeof *masked),
                *biased = calloc((size_t)B, sizeof *biased);
  double op_plain[2], op_masked[2], op_biased[2];
  for (int mode = 0; mode < 2; mode++) { /* greedy; seeded temperature 0.8 (natural order) */
    for (int r = 0; r < B; r++) {
      plain[r] = (sm_sample_req){.row = r,
                                 .temperature = mode ? 0.8f : 0,
                                 .top_p = 1,
                                 .repetition_penalty = 1,
                                 .u = mode ? (double)(rnd() >> 11) / 9007199254740992.0 : 0};
      masked[r] = plain[r];
      masked[r].mask = masks + (size_t)r * W;
      biased[r] = masked[r];
      biased[r].n_bias = 4;
      biased[r].bias_ids = bias_ids;
      biased[r].bias_vals = bias_vals;
    }
    const int reps = 200;
    double a[3] = {0, 0, 0}, t[3][5];
    for (int k = 0; k < 5; k++) { /* interleaved, so drift hits all three alike */
      t[0][k] = time_op(be, logits, B, V, plain, reps / 5);
      t[1][k] = time_op(be, logits, B, V, masked, reps / 5);
      t[2][k] = time_op(be, logits, B, V, biased, reps / 5);
    }
    for (int j = 0; j < 3; j++) a[j] = median(t[j], 5);
    op_plain[mode] = a[0];
    op_masked[mode] = a[1];
    op_biased[mode] = a[2];
  }
  be->free(be, logits);
  free(host);

  /* ---- decode steps of B sequences ---- */
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = B;
  ep.max_context = mp.max_context;
  ep.max_batch_tokens = B * PROMPT;
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  if (sm_engine_create(m, &ep, &e)) {
    fprintf(stderr, "bench_gmask: engine: %s\n", smelt_last_error());
    return 1;
  }
  sm_seq **seqs = malloc(sizeof(sm_seq *) * (size_t)B);
  sm_sampler *smp = calloc((size_t)B, sizeof(sm_sampler));
  sm_sampler **ps = malloc(sizeof(sm_sampler *) * (size_t)B);
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)B);
  uint8_t *done = malloc((size_t)B);
  for (int i = 0; i < B; i++) {
    seqs[i] = sm_seq_new(e);
    int32_t pr[PROMPT];
    for (int k = 0; k < PROMPT; k++) pr[k] = (int32_t)(rnd() % (uint64_t)V);
    sm_seq_append(e, seqs[i], pr, PROMPT);
    sm_sampler_init(&smp[i], NULL, V); /* greedy */
    ps[i] = &smp[i];
  }
  smelt_status st = SMELT_OK;
  double *tp = malloc(sizeof(double) * (size_t)(rounds + 1)), *tm = malloc(sizeof(double) * (size_t)(rounds + 1));
  /* round 0 (prefill and warm-up) is not counted */
  for (int r = 0; r <= rounds && !st; r++) {
    for (int with = 0; with < 2 && !st; with++) {
      for (int i = 0; i < B; i++) smp[i].mask = with ? masks + (size_t)i * W : NULL;
      int n_steps = 0;
      double t0 = 0;
      while (n_steps < BLOCK && !st) {
        st = sm_engine_step_sample(e, seqs, B, ps, tok, NULL, done);
        int nd = 0;
        for (int i = 0; !st && i < B; i++)
          if (done[i]) {
            nd++;
            st = sm_seq_append(e, seqs[i], &tok[i], 1);
          }
        if (nd == B) {
          if (n_steps == 0) t0 = sm_now(); /* from the end of the first full decode step */
          n_steps++;
        }
      }
      double dt = (sm_now() - t0) / (BLOCK - 1);
      (with ? tm : tp)[r] = dt;
    }
  }
  if (st) {
    fprintf(stderr, "bench_gmask: decode: %s\n", smelt_last_error());
    return 1;
  }
  double step_plain = median(tp + 1, rounds), step_masked = median(tm + 1, rounds);
  const double cost = op_masked[0] - op_plain[0];
  printf("model 1b (synthetic, 4-bit, group 64), vocab %d, backend %s, batch %d\n", V, be->name, B);
  printf("masks: %d words a row, %.1f KiB a step\n", W, (double)W * 4 * B / 1024);
  for (int mode = 0; mode < 2; mode++)
    printf("sample op, %d rows, %-22s plain %8.1f us, masked %8.1f us (%+.1f), masked + 4 biases %8.1f us (%+.1f)\n", B,
           mode ? "seeded T 0.8:" : "greedy:", op_plain[mode] * 1e6, op_masked[mode] * 1e6,
           (op_masked[mode] - op_plain[mode]) * 1e6, op_biased[mode] * 1e6, (op_biased[mode] - op_plain[mode]) * 1e6);
  printf("decode step, batch %d, greedy sampled by the backend: %.3f ms plain, %.3f ms with masks (%+.3f ms, %+.1f%%; "
         "median of %d blocks of %d steps)\n",
         B, step_plain * 1e3, step_masked * 1e3, (step_masked - step_plain) * 1e3,
         100 * (step_masked - step_plain) / step_plain, rounds, BLOCK - 1);
  printf("mask upload + apply: %.1f us a step\n", cost * 1e6);
  printf("mask cost: %.2f%% of a batch-%d decode step\n", 100 * cost / step_plain, B);
  for (int i = 0; i < B; i++) {
    sm_seq_free(e, seqs[i]);
    sm_sampler_free(&smp[i]);
  }
  free(seqs);
  free(smp);
  free(ps);
  free(tok);
  free(done);
  free(tp);
  free(tm);
  free(plain);
  free(masked);
  free(biased);
  free(masks);
  sm_engine_free(e);
  smelt_model_free(m);
  return 0;
}
