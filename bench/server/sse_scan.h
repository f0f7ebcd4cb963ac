/* The server-sent events of a streamed completion, scanned byte by byte as they arrive (bench_server_load,
 * bench_server_soak): a line that starts "data: " is an event, "data: {" a chunk and "data: [DONE]" the end. */
#ifndef SM_BENCH_SSE_SCAN_H
#define SM_BENCH_SSE_SCAN_H
#include <stdbool.h>

typedef struct {
  int m;    /* characters of "data: " matched at the start of a line */
  bool mid; /* inside a line (not at its start) */
} sse_scan;

/* the character after "data: " ('{' a chunk, '[' the end) when ch is it, else 0 */
static inline char sse_byte(sse_scan *s, char ch) {
  if (s->m == 6) {
    s->m = 0;
    s->mid = true;
    return ch == '{' || ch == '[' ? ch : 0;
  }
  if ((s->m > 0 || !s->mid) && ch == "data: "[s->m]) {
    s->m++;
    s->mid = true;
  } else {
    s->m = 0;
    s->mid = ch != '\n';
  }
  return 0;
}
#endif
