/* Recurrent state slots (state.h): a free list of slot ids and the device copies that fork and rewind
 * sequences of hybrid models. */
#include "engine/state.h"
#include <stdlib.h>
#include "backend/kv_quant.h"

void sm_state_slots_init(sm_state_slots *p, int n) {
  p->n = n > 0 ? n : 0;
  p->free_stack = sm_xmalloc(sizeof(int) * (size_t)(p->n ? p->n : 1));
  for (int i = 0; i < p->n; i++) p->free_stack[i] = p->n - 1 - i; /* slot 0 first */
  p->n_free = p->n;
}

void sm_state_slots_free(sm_state_slots *p) {
  free(p->free_stack);
  p->free_stack = NULL;
  p->n = p->n_free = 0;
}

int sm_state_slot_get(sm_state_slots *p) { return p->n_free > 0 ? p->free_stack[--p->n_free] : -1; }

void sm_state_slot_put(sm_state_slots *p, int slot) {
  if (slot >= 0 && slot < p->n && p->n_free < p->n) p->free_stack[p->n_free++] = slot;
}

void sm_state_copy(smelt_model *m, const sm_kv_cache *kv, int dst, int src) {
  sm_backend *be = m->be;
  if (dst == src || dst < 0 || src < 0 || dst >= kv->n_slots || src >= kv->n_slots) return;
  for (int l = 0; l < kv->n_layers; l++) {
    if (kv->conv && kv->conv[l])
      be->copy(be, kv->conv[l] + (size_t)dst * kv->conv_floats, kv->conv[l] + (size_t)src * kv->conv_floats,
               sizeof(float) * kv->conv_floats);
    if (kv->ssm && kv->ssm[l])
      be->copy(be, kv->ssm[l] + (size_t)dst * kv->ssm_floats, kv->ssm[l] + (size_t)src * kv->ssm_floats,
               sizeof(float) * kv->ssm_floats);
  }
}

void sm_state_copy_block(smelt_model *m, const sm_kv_cache *kv, int dst, int src) {
  sm_backend *be = m->be;
  const size_t bytes = (size_t)kv->block_size * kv->n_kv_heads * sm_kv_head_bytes(kv->dtype, kv->head_dim);
  for (int l = 0; l < kv->n_layers; l++) {
    if (!kv->k[l]) continue;
    be->copy(be, (char *)kv->k[l] + (size_t)dst * bytes, (const char *)kv->k[l] + (size_t)src * bytes, bytes);
    if (kv->v[l] != kv->k[l]) /* multi-head latent attention: V is K's buffer */
      be->copy(be, (char *)kv->v[l] + (size_t)dst * bytes, (const char *)kv->v[l] + (size_t)src * bytes, bytes);
  }
}
