/* Token sampling: greedy, temperature, top-k, top-p, min-p, penalties, seeded RNG. */
#ifndef SM_SAMPLER_H
#define SM_SAMPLER_H
#include "base/base.h"

#include "backend/backend.h"

typedef struct {
  smelt_sampling p;
  uint64_t rng[4]; /* xoshiro256** state */
  int vocab;
  /* Optional allowed-token bitset over the vocabulary (bit t of word t/32; grammar.h fills it),
   * owned by the caller and read at every sample: tokens whose bit is clear are never drawn.
   * sm_sampler_prepare passes it on in the request (sm_sample_req.mask), so the backend's sample
   * op applies it where the logits are (on the GPU for the CUDA backend). */
  const uint32_t *mask;
  /* Optional logit biases (OpenAI logit_bias), owned by the caller: logit[bias_ids[i]] +=
   * bias_vals[i] before sampling (passed on in the request, like the mask). */
  const int32_t *bias_ids;
  const float *bias_vals;
  int n_bias;
  /* scratch */
  float *probs;
  int32_t *idx;
  sm_tok_count *pen;
  int pen_cap; /* penalty counts of the last prepare */
  int32_t *hkey;
  int *hcnt;
  int hcap;
} sm_sampler;

void sm_sampler_init(sm_sampler *s, const smelt_sampling *p, int vocab);
void sm_sampler_free(sm_sampler *s);
/* Sample from logits (modified in place). history: previous tokens for penalties.
 * = sm_sampler_prepare + sm_sample_row (backend.h) on the host: -1 when the mask allows no token. */
int32_t sm_sampler_sample(sm_sampler *s, float *logits, const int32_t *history, int n_history);
/* The host's part of sampling one token, for a backend's sample op: req gets the parameters,
 * the (token, count) pairs of the penalty window of history (req->pen points into s, valid
 * until the next prepare), s's logit biases and mask (pointers) and, unless greedy, one uniform
 * draw from s's generator, so the seeded stream advances exactly as in sm_sampler_sample.
 * req->row is set to 0. */
void sm_sampler_prepare(sm_sampler *s, const int32_t *history, int n_history, sm_sample_req *req);
/* s applies a repetition, frequency or presence penalty (its draws depend on the history) */
bool sm_sampler_penalizes(const sm_sampler *s);
/* s draws from the logits alone: no penalties, logit biases or mask (a token can be sampled for a
 * sequence whose history the host has not seen yet: pipelined steps) */
bool sm_sampler_history_free(const sm_sampler *s);
/* log-softmax of logits into out (vocab floats). */
void sm_log_softmax(const float *logits, int n, float *out);
/* top-n (by value) indices of v, sorted descending. */
void sm_top_n(const float *v, int n, int k, int32_t *out_idx);

#endif
