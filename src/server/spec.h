/* Speculative decoding in `smelt serve` (private to src/server): where draft tokens come from.
 * A draft model (-md) runs in an engine of its own, with one sequence per running choice that
 * follows the choice's tokens; n-gram mode (--spec-type ngram-simple) looks the choice's last
 * tokens up in its prompt and output. The scheduler (sched.c) appends the proposals to the
 * choice's sequence, verifies them in its batched step and rolls back what the model rejects. */
#ifndef SM_SERVER_SPEC_H
#define SM_SERVER_SPEC_H
#include "server/sched.h"

/* Drafts for cs[i] (engine thread, mu not held): at most kmax[i] tokens (0: none), into
 * prop[i * cap ..], their count into nprop[i]. A draft model stops a choice's proposal at the
 * first token whose draft probability is below pmin[i]. When the draft model cannot run, no
 * choice gets drafts (and their draft sequences are dropped). */
void sm_spec_propose(sm_sched *s, sm_choice **cs, const int *kmax, const float *pmin, int n, int32_t *prop, int cap,
                     int *nprop);
/* Free c's draft sequence (with the choice's sequence). */
void sm_spec_drop(sm_sched *s, sm_choice *c);

#endif
