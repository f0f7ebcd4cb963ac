/* Grammar masks on the GPU: the CUDA backend's sample op on a batch of rows that each carry a
 * different grammar mask (dense, sparse, one token, the top tokens left out, whole words) and
 * some logit biases and penalties returns exactly the CPU backend's tokens, for greedy requests
 * and for seeded samplers with top-k / top-p / min-p drawing several tokens in a row; the GPU
 * leaves the logits unchanged, and a mask that allows no token is refused by both. Vocabularies of
 * Llama 3 (128256, the vectorized mask kernel) and an odd size (the scalar one).
 * Exits 77 (ctest SKIP) when the build has no CUDA or no GPU is present. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "engine/sampler.h"
#include "../test_util.h"

#ifndef SMELT_HAVE_CUDA
int main(void) {
  printf("built without CUDA: skipped\n");
  return 77;
}
#else
static uint64_t rs = 0x2545f4914f6cdd1dULL;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}
static float frand(void) { return (float)((double)(rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }
static bool bit(const uint32_t *m, int t) { return (m[t >> 5] >> (t & 31)) & 1u; }

enum { NR = 8 }; /* rows (and requests) a call */

static void make_mask(uint32_t *m, int V, int kind, const float *row) {
  const int W = (V + 31) / 32;
  memset(m, 0, sizeof(uint32_t) * (size_t)W);
  switch (kind % 5) {
    case 0: /* dense */
      for (int w = 0; w < W; w++) m[w] = (uint32_t)rnd();
      break;
    case 1: /* sparse: ~1 in 200 */
      for (int t = 0; t < V; t++)
        if (rnd() % 200 == 0) m[t >> 5] |= 1u << (t & 31);
      break;
    case 2: /* one token */ break;
    case 3: /* all but the 3 largest logits */
      memset(m, 0xff, sizeof(uint32_t) * (size_t)W);
      for (int k = 0; k < 3; k++) {
        int best = -1;
        for (int t = 0; t < V; t++)
          if (bit(m, t) && (best < 0 || row[t] > row[best])) best = t;
        m[best >> 5] &= ~(1u << (best & 31));
      }
      return;
    case 4: /* whole words */
      for (int w = 0; w < W; w++) m[w] = rnd() % 3 ? 0 : 0xFFFFFFFFu;
      break;
  }
  int one = (int)(rnd() % (uint64_t)V);
  m[one >> 5] |= 1u << (one & 31);
}

/* both backends sample the same requests over the same rows */
static int compare(sm_backend *G, sm_backend *C, const float *rows, int V, const sm_sample_req *req, int n,
                   int *n_cmp) {
  size_t bytes = sizeof(float) * (size_t)NR * V;
  float *dg = G->alloc(G, bytes), *dc = C->alloc(C, bytes);
  G->upload(G, dg, rows, bytes);
  C->upload(C, dc, rows, bytes);
  int32_t tg[NR], tc[NR];
  smelt_status sg = G->sample(G, dg, NR, V, req, n, tg);
  smelt_status sc = C->sample(C, dc, NR, V, req, n, tc);
  CHECK(sg == SMELT_OK && sc == SMELT_OK, "masked sample op: cuda %d, cpu %d (%s)", sg, sc, smelt_last_error());
  float *back = malloc(bytes);
  G->download(G, back, dg, bytes);
  CHECK(memcmp(back, rows, bytes) == 0, "the GPU left the logits unchanged");
  free(back);
  G->free(G, dg);
  C->free(C, dc);
  int bad = 0;
  for (int i = 0; !sg && !sc && i < n; i++) {
    (*n_cmp)++;
    if (tg[i] != tc[i]) {
      if (bad < 6)
        fprintf(stderr, "V %d req %d (T %g k %d p %g min_p %g, %d biases, %d penalties): cuda %d, cpu %d\n", V, i,
                req[i].temperature, req[i].top_k, req[i].top_p, req[i].min_p, req[i].n_bias, req[i].n_pen, tg[i],
                tc[i]);
      bad++;
    }
    /* a masked token where the CPU found an allowed one (both fall back to token 0 when the walk keeps no
     * candidate; test_sample_mask checks the CPU's rule) */
    if (req[i].mask && (tg[i] < 0 || tg[i] >= V || !bit(req[i].mask, tg[i])) && tc[i] >= 0 && tc[i] < V &&
        bit(req[i].mask, tc[i])) {
      fprintf(stderr, "V %d req %d: cuda token %d is masked\n", V, i, tg[i]);
      bad++;
    }
  }
  return bad;
}

static void run_vocab(sm_backend *G, sm_backend *C, int V) {
  const int W = (V + 31) / 32;
  float *rows = malloc(sizeof(float) * (size_t)NR * V);
  uint32_t *masks = malloc(sizeof(uint32_t) * (size_t)W * NR);
  int32_t bias_ids[NR][4];
  float bias_vals[NR][4];
  int bad = 0, n_cmp = 0;
  for (int round = 0; round < 6; round++) {
    for (size_t i = 0; i < (size_t)NR * V; i++) rows[i] = rnd() % 40 ? 4 * frand() : -INFINITY;
    for (int r = 0; r < NR; r++) make_mask(masks + (size_t)r * W, V, r + round, rows + (size_t)r * V);
    /* greedy: one request per row, its own mask; half with biases */
    sm_sample_req req[NR];
    for (int r = 0; r < NR; r++) {
      memset(&req[r], 0, sizeof req[r]);
      req[r].row = r;
      req[r].top_p = 1;
      req[r].repetition_penalty = 1;
      req[r].mask = round == 5 && r == 3 ? NULL : masks + (size_t)r * W; /* a row without a mask too */
      if (r % 2) {
        req[r].n_bias = 4;
        for (int k = 0; k < 4; k++) {
          bias_ids[r][k] = k == 3 ? bias_ids[r][0] : (int32_t)(rnd() % (uint64_t)V);
          bias_vals[r][k] = k == 1 ? 30.0f : 3 * frand();
        }
        req[r].bias_ids = bias_ids[r];
        req[r].bias_vals = bias_vals[r];
      }
    }
    bad += compare(G, C, rows, V, req, NR, &n_cmp);
    /* seeded samplers: the same stream of draws on both backends (penalties over a history) */
    sm_sampler sg[NR], sc[NR];
    for (int r = 0; r < NR; r++) {
      smelt_sampling p;
      smelt_sampling_default(&p);
      p.temperature = 0.6f + 0.1f * (float)r;
      p.top_k = r % 3 == 0 ? 50 : 0;
      p.top_p = r % 3 == 1 ? 0.9f : 1;
      p.min_p = r % 4 == 2 ? 0.05f : 0;
      p.repetition_penalty = r % 2 ? 1.2f : 1;
      p.presence_penalty = r % 4 == 3 ? 0.5f : 0;
      p.seed = 100 + (uint64_t)(round * NR + r);
      sm_sampler_init(&sg[r], &p, V);
      sm_sampler_init(&sc[r], &p, V);
      sg[r].mask = sc[r].mask = masks + (size_t)r * W;
      if (r % 2 == 0) {
        sg[r].bias_ids = sc[r].bias_ids = bias_ids[(r + 1) % NR];
        sg[r].bias_vals = sc[r].bias_vals = bias_vals[(r + 1) % NR];
        sg[r].n_bias = sc[r].n_bias = 4;
      }
    }
    int32_t hist[32];
    for (int i = 0; i < 32; i++) hist[i] = (int32_t)(rnd() % 64);
    for (int d = 0; d < 4; d++) {
      sm_sample_req rg[NR], rc[NR];
      for (int r = 0; r < NR; r++) {
        sm_sampler_prepare(&sg[r], hist, 32, &rg[r]);
        sm_sampler_prepare(&sc[r], hist, 32, &rc[r]);
        rg[r].row = rc[r].row = (r + d) % NR; /* requests read other rows than their index */
      }
      CHECK(memcmp(&rg[0].u, &rc[0].u, sizeof(double)) == 0, "identically seeded samplers draw alike");
      bad += compare(G, C, rows, V, rg, NR, &n_cmp);
    }
    for (int r = 0; r < NR; r++) {
      sm_sampler_free(&sg[r]);
      sm_sampler_free(&sc[r]);
    }
  }
  CHECK(bad == 0, "vocab %d: batched masked sampling on the GPU == CPU (%d of %d differ or masked)", V, bad, n_cmp);
  printf("vocab %d: %d masked requests compared, %d bad\n", V, n_cmp, bad);
  /* nothing allowed: refused by both */
  memset(masks, 0, sizeof(uint32_t) * (size_t)W);
  sm_sample_req z = {.row = 0, .temperature = 0.7f, .top_p = 1, .repetition_penalty = 1, .u = 0.5, .mask = masks};
  float *dg = G->alloc(G, sizeof(float) * (size_t)V);
  G->upload(G, dg, rows, sizeof(float) * (size_t)V);
  int32_t t = 5;
  CHECK(G->sample(G, dg, 1, V, &z, 1, &t) == SMELT_ERR_INVALID, "cuda refuses an all-zero mask");
  CHECK(C->sample(C, rows, 1, V, &z, 1, &t) == SMELT_ERR_INVALID, "cpu refuses an all-zero mask");
  G->free(G, dg);
  free(rows);
  free(masks);
}

int main(void) {
  sm_backend *G = sm_cuda_backend_create(0);
  if (!G) {
    printf("skipped: %s\n", smelt_last_error());
    return 77;
  }
  sm_backend *C = sm_cpu_backend_create(2);
  run_vocab(G, C, 128256);
  run_vocab(G, C, 50001);
  G->destroy(G);
  C->destroy(C);
  TEST_END();
}
#endif
