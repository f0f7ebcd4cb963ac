/* The mixture-of-experts routing of one token (backend.h sm_moe_route, sm_moe_route_row): what every
 * backend's moe_route op computes, written once as the reference. */
#include <math.h>
#include "backend/backend.h"

/* the k largest of v[0..n) (k <= 64) in descending order, ties towards the lower index */
static void top_k(const float *v, int n, int k, int32_t *ids) {
  for (int j = 0; j < k; j++) ids[j] = -1;
  for (int e = 0; e < n; e++) {
    /* position of e among the current best: after every one that is >= v[e] (earlier index wins ties) */
    int p = k;
    while (p > 0 && (ids[p - 1] < 0 || v[e] > v[ids[p - 1]])) p--;
    if (p >= k) continue;
    for (int j = k - 1; j > p; j--) ids[j] = ids[j - 1];
    ids[p] = e;
  }
}

void sm_moe_route_row(const sm_moe_route *r, const float *logits, const float *correction, const float *expert_scale,
                      int32_t *ids, float *wts, float *scratch) {
  const int E = r->n_experts, k = r->top_k;
  float *p = scratch, *choice = scratch + E;
  float sum = 0.f;
  switch (r->kind) {
    case SM_ROUTE_SOFTMAX: {
      float mx = -INFINITY;
      for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
      float z = 0.f;
      for (int e = 0; e < E; e++) z += p[e] = expf(logits[e] - mx);
      for (int e = 0; e < E; e++) p[e] /= z;
      top_k(p, E, k, ids);
      for (int j = 0; j < k; j++) sum += wts[j] = p[ids[j]];
      break;
    }
    case SM_ROUTE_TOPK_SOFTMAX: {
      top_k(logits, E, k, ids);
      const float mx = logits[ids[0]];
      float z = 0.f;
      for (int j = 0; j < k; j++) z += wts[j] = expf(logits[ids[j]] - mx);
      for (int j = 0; j < k; j++) sum += wts[j] /= z;
      break;
    }
    default: { /* SM_ROUTE_SIGMOID */
      for (int e = 0; e < E; e++) {
        p[e] = 1.f / (1.f + expf(-logits[e]));
        choice[e] = p[e] + (correction ? correction[e] : 0.f);
      }
      if (r->n_group > 1) {
        /* a group's score: the sum of its two largest choice scores; experts of the groups not among the
       * topk_group best score 0 */
        const int G = r->n_group, per = E / G;
        float gs[64];
        int32_t best[2], keep[64];
        for (int g = 0; g < G && g < 64; g++) {
          top_k(choice + g * per, per, 2, best);
          gs[g] = choice[g * per + best[0]] + choice[g * per + best[1]];
        }
        top_k(gs, G, r->topk_group < 64 ? r->topk_group : 64, keep);
        for (int g = 0; g < G; g++) {
          bool kept = false;
          for (int j = 0; j < r->topk_group && j < 64; j++) kept |= keep[j] == g;
          if (!kept)
            for (int e = g * per; e < (g + 1) * per; e++) choice[e] = 0.f;
        }
      }
      top_k(choice, E, k, ids);
      for (int j = 0; j < k; j++) sum += wts[j] = p[ids[j]];
      if (r->norm) sum += r->norm_eps > 0 ? r->norm_eps : 1e-20f;
      break;
    }
  }
  for (int j = 0; j < k; j++) {
    if (r->norm && r->kind != SM_ROUTE_TOPK_SOFTMAX) wts[j] /= sum;
    wts[j] *= r->scale;
    if (expert_scale) wts[j] *= expert_scale[ids[j]];
  }
}
