/* Recurrent state slots (state.h): a free list of slot ids (the copies that fork and rewind sequences of
 * hybrid models are model.c's sm_kv_copy_state / sm_kv_copy_block). */
#include "engine/state.h"
#include <stdlib.h>

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
