/* Pipeline parallelism (tp.h): the ranks of a group hold consecutive layers instead of shards of every
 * layer. Stage s (rank s) holds layers [first(s), first(s + 1)), as many a stage as can be or in proportion
 * to given shares (llama.cpp's --tensor-split), at least one; rank 0 also
 * embeds the tokens and holds the final norm and the LM head (and the vision tower). A forward step
 * runs on every rank; a rank skips the other stages' layers and takes part in each hand-over: after
 * stage s's last layer its output x goes to every rank, and after the last stage to rank 0, which
 * computes the logits. The hand-over is the backend's all_reduce over x on the producing rank and
 * zeros on the others (exact: x + 0 = x), so it needs no collective of its own and each rank's device
 * runs one stage after another with the group's usual transport (NCCL, shared memory, TCP). Without
 * micro-batches the stages run one at a time: the split is for models larger than one device's
 * memory, and for hosts without fast links (one hand-over of n x hidden floats a stage and step,
 * against two all-reduces a layer for tensor parallelism). */
#include <stdlib.h>
#include <string.h>
#include "model/tp.h"
#include "vision/vision.h"

smelt_status sm_pp_plan(int layers, int n, const float *shares, int *first) {
  if (n < 1 || n > SM_TP_MAX) return sm_err(SMELT_ERR_INVALID, "--pipeline-parallel %d: expected 1..%d", n, SM_TP_MAX);
  if (layers < n)
    return sm_err(SMELT_ERR_UNSUPPORTED, "--pipeline-parallel %d: the model has %d layers, fewer than the stages", n,
                  layers);
  double total = 0, w[SM_TP_MAX];
  bool given = false;
  for (int s = 0; s < n; s++) given |= shares && shares[s] != 0;
  for (int s = 0; s < n; s++) {
    w[s] = given ? shares[s] : 1.0;
    if (!(w[s] > 0 && w[s] < 1e9))
      return sm_err(SMELT_ERR_INVALID, "--tensor-split: stage %d's share %g is not a positive number", s, w[s]);
    total += w[s];
  }
  /* the boundaries rounded from the cumulative shares, then moved so that every stage keeps a layer */
  double acc = 0;
  first[0] = 0;
  for (int s = 1; s <= n; s++) {
    acc += w[s - 1];
    int f = s == n ? layers : (int)(layers * acc / total + 0.5);
    if (f < first[s - 1] + 1) f = first[s - 1] + 1;
    if (f > layers - (n - s)) f = layers - (n - s);
    first[s] = f;
  }
  return SMELT_OK;
}

smelt_status sm_pp_shard(smelt_model *m) {
  sm_tp *tp = m->tp;
  const int L = m->cfg.num_hidden_layers, n = tp->n, r = tp->rank;
  smelt_status st = sm_pp_plan(L, n, tp->shares, tp->first);
  if (st) return st;
  tp->l0 = tp->first[r];
  tp->l1 = tp->first[r + 1];
  for (int l = 0; l < L; l++) {
    if (l >= tp->l0 && l < tp->l1) continue;
    sm_layer *Y = &m->layers[l];
    /* mapped views (or host copies the model frees with it): never uploaded, never read */
    memset(Y->w, 0, sizeof Y->w);
    free(Y->moe);
    Y->moe = NULL;
    free(Y->mla);
    Y->mla = NULL;
  }
  if (r != 0) { /* rank 0 embeds, normalizes and computes the logits */
    memset(&m->embed, 0, sizeof m->embed);
    memset(&m->lm_head, 0, sizeof m->lm_head);
    sm_vision_free(m->vision);
    m->vision = NULL;
  }
  tp->vocab_split = false;
  tp->full_heads = m->cfg.num_attention_heads;
  tp->full_kv_heads = m->cfg.num_key_value_heads;
  return SMELT_OK;
}

smelt_status sm_pp_pass(smelt_model *m, int src, size_t n) {
  sm_backend *be = m->be;
  if (m->tp->rank != src) be->copy(be, m->x, m->pp_zero, sizeof(float) * n);
  be->all_reduce(be, m->x, n);
  return SMELT_OK;
}
