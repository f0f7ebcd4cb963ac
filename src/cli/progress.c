/* A one-line progress bar on stderr (long prefills, perplexity), drawn only on a terminal and
 * erased when done. */
#include <stdio.h>
#include <unistd.h>
#include "cli/run.h"

void sm_progress_start(sm_progress *p, const char *label, bool enable) {
  p->on = enable && isatty(2);
  p->drawn = false;
  p->t0 = p->last = sm_now();
  p->label = label;
}

void sm_progress_update(sm_progress *p, long done, long total) {
  if (!p->on || total <= 0) return;
  double now = sm_now();
  if (done < total && now - p->last < 0.1 && p->drawn) return; /* at most 10 redraws a second */
  /* a bar only once the work takes a moment: short prefills stay quiet */
  if (!p->drawn && now - p->t0 < 0.3 && done < total) return;
  if (!p->drawn && done >= total) return;
  p->last = now;
  p->drawn = true;
  const int width = 30;
  int fill = (int)((double)done / (double)total * width);
  if (fill > width) fill = width;
  char bar[64];
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
  bar[width] = 0;
  double el = now - p->t0, rate = el > 0 ? done / el : 0, eta = rate > 0 ? (total - done) / rate : 0;
  fprintf(stderr, "\r\033[K%s [%s] %ld/%ld %.0f/s, %.0f s left", p->label, bar, done, total, rate, eta);
  fflush(stderr);
}

void sm_progress_end(sm_progress *p) {
  if (p->on && p->drawn) {
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
  }
  p->drawn = false;
}

void sm_progress_cb(void *p, long done, long total) { sm_progress_update(p, done, total); }
