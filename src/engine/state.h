/* Recurrent state slots of an engine (hybrid models, engine-private): the fixed-size per-sequence state
 * of the recurrent layers lives in slots of the cache (backend.h sm_kv_cache conv / ssm). A running
 * sequence holds one slot, taken at its first step and given back when it is freed; a sequence may
 * also hold a snapshot slot (its state at an earlier position, sm_seq_checkpoint) that truncation
 * rewinds to. */
#ifndef SM_ENGINE_STATE_H
#define SM_ENGINE_STATE_H
#include "model/model.h"

typedef struct {
  int n;           /* slots in the cache */
  int *free_stack; /* free slot ids */
  int n_free;
} sm_state_slots;

void sm_state_slots_init(sm_state_slots *p, int n);
void sm_state_slots_free(sm_state_slots *p);
int sm_state_slot_get(sm_state_slots *p);            /* -1 when none is free */
void sm_state_slot_put(sm_state_slots *p, int slot); /* slot < 0: nothing */

#endif
