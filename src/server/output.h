/* What a choice's generated text means (private to src/server): reasoning (<think>...</think>,
 * or gpt-oss's analysis channel), content, and tool calls, both for the finished text and for
 * the part of an unfinished text that is settled enough to stream. */
#ifndef SM_SERVER_OUTPUT_H
#define SM_SERVER_OUTPUT_H
#include "server/sched.h"

typedef struct {
  sm_buf reasoning;      /* thinking text */
  size_t reasoning_safe; /* bytes of reasoning that can be streamed */
  size_t reasoning_end;  /* offset in the generated text where the reasoning ends (token counting) */
  sm_tc_scan tc;         /* content (tc.content, tc.safe) and tool calls */
} sm_view;

/* Under the scheduler's mutex: the view of choice c (finished: c->finish set, else the first
 * c->safe bytes, which no stop string can still cut). */
void sm_view_build(const sm_job *j, const sm_choice *c, sm_view *v);
void sm_view_free(sm_view *v);
/* Tokens of c that belong to the reasoning. */
int sm_view_reasoning_tokens(const sm_job *j, const sm_choice *c);

#endif
