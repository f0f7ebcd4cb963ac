/* The two result slots of a backend's sample_batch_async (backend.h): the bookkeeping the CPU and CUDA
 * backends share, each keeping the tokens themselves where its memory is. */
#include "backend/backend.h"

void sm_batch_slots_init(sm_batch_slots *s) {
  s->n[0] = s->n[1] = 0;
  s->live[0] = s->live[1] = false;
  s->next = 0;
  s->last = -1;
}

smelt_status sm_batch_slots_take(const sm_batch_slots *s, int n_req, int *slot) {
  if (s->live[s->next]) return sm_err(SMELT_ERR_INVALID, "two sample_batch_async results not waited for");
  if (n_req < 0) return sm_err(SMELT_ERR_INVALID, "sample_batch_async of %d requests", n_req);
  *slot = s->next;
  return SMELT_OK;
}

void sm_batch_slots_fill(sm_batch_slots *s, int slot, int n_req) {
  s->n[slot] = n_req;
  s->live[slot] = true;
  s->last = slot;
  s->next = 1 - slot;
}

smelt_status sm_batch_slots_wait(sm_batch_slots *s, int slot) {
  if (slot < 0 || slot > 1 || !s->live[slot]) return sm_err(SMELT_ERR_INVALID, "no batch sample in slot %d", slot);
  s->live[slot] = false;
  return SMELT_OK;
}

smelt_status sm_batch_slots_feed(const sm_batch_slots *s, int t, int row) {
  if (s->last < 0 || row >= s->n[s->last])
    return sm_err(SMELT_ERR_INVALID, "token %d fed from row %d of no sample_batch_async", t, row);
  return SMELT_OK;
}
