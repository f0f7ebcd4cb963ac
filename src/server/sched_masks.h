/* The grammar masks of the scheduler's constrained choices (private to src/server, sched.c):
 * one choice's mask when its row is sampled on the host, and a step's masks built together on
 * the mask pool, also as the engine's before-sample hook, so they are built while the device
 * computes the step. */
#ifndef SM_SERVER_SCHED_MASKS_H
#define SM_SERVER_SCHED_MASKS_H
#include "server/sched.h"

/* the mask of choice c for its next token, built unless it is already (engine thread, mu not held) */
void sm_choice_ensure_mask(sm_sched *s, sm_choice *c);

/* scratch for the masks of up to cap choices a step */
typedef struct sm_step_masks sm_step_masks;
sm_step_masks *sm_step_masks_new(sm_sched *s, int cap);
void sm_step_masks_free(sm_step_masks *m);
/* the masks of the n choices ch of a step not yet built, at once */
void sm_step_masks_build(sm_step_masks *m, sm_choice *const *ch, int n);
/* the same as an engine hook (sm_engine_set_before_sample(e, sm_step_masks_run, m)) for the
 * choices set last */
void sm_step_masks_set(sm_step_masks *m, sm_choice *const *ch, int n);
void sm_step_masks_run(void *m);
#endif
