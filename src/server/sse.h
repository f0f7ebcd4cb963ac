/* Server-sent events of `smelt serve` (private to src/server): turns a job's published state
 * into the SSE byte stream of a streaming request — chat/completions chunks ending with
 * `data: [DONE]`, or the Responses API's typed events. Independent of the HTTP library. */
#ifndef SM_SERVER_SSE_H
#define SM_SERVER_SSE_H
#include "base/strbuf.h"
#include "server/openai.h"

typedef struct {
  const sm_oai *o;
  sm_job *j;
  sm_buf out; /* produced, not yet sent: out.p[off..out.n) */
  size_t off;
  bool head_sent;
  bool finished;           /* the last event is in out */
  int seqnum;              /* responses: sequence_number of the next event */
  size_t resp_sent;        /* responses: text bytes sent */
  size_t rs_sent;          /* responses: reasoning bytes sent */
  int msg_index, rs_index; /* responses: output_index of the message / reasoning item, -1: not added */
  int next_index;          /* responses: output_index of the next item added */
} sm_sse;

void sm_sse_init(sm_sse *st, const sm_oai *o, sm_job *j);
/* Under the scheduler's mutex: append every event that the job's state allows now. */
void sm_sse_produce(sm_sse *st);

#endif
