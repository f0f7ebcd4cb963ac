/* sm_buf: see strbuf.h. */
#include "base/strbuf.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base.h"

void sm_buf_reserve(sm_buf *b, size_t extra) {
  if (b->p && b->n + extra + 1 <= b->cap) return;
  size_t nc = b->cap ? b->cap * 2 : 64;
  while (nc < b->n + extra + 1) nc *= 2;
  b->p = sm_xrealloc(b->p, nc);
  b->cap = nc;
  b->p[b->n] = 0;
}

void sm_buf_put(sm_buf *b, const void *s, size_t n) {
  sm_buf_reserve(b, n);
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void sm_buf_puts(sm_buf *b, const char *s) { sm_buf_put(b, s, strlen(s)); }

void sm_buf_putc(sm_buf *b, char c) {
  sm_buf_reserve(b, 1);
  b->p[b->n++] = c;
  b->p[b->n] = 0;
}

void sm_buf_put_cp(sm_buf *b, uint32_t c) {
  char t[4];
  size_t n;
  if (c < 0x80) {
    t[0] = (char)c;
    n = 1;
  } else if (c < 0x800) {
    t[0] = (char)(0xC0 | (c >> 6));
    t[1] = (char)(0x80 | (c & 0x3F));
    n = 2;
  } else if (c < 0x10000) {
    t[0] = (char)(0xE0 | (c >> 12));
    t[1] = (char)(0x80 | ((c >> 6) & 0x3F));
    t[2] = (char)(0x80 | (c & 0x3F));
    n = 3;
  } else {
    t[0] = (char)(0xF0 | (c >> 18));
    t[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    t[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    t[3] = (char)(0x80 | (c & 0x3F));
    n = 4;
  }
  sm_buf_put(b, t, n);
}

void sm_buf_vprintf(sm_buf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  char small[256];
  int k = vsnprintf(small, sizeof small, fmt, ap);
  if (k < 0) {
    va_end(ap2);
    return;
  }
  if ((size_t)k < sizeof small) sm_buf_put(b, small, (size_t)k);
  else {
    sm_buf_reserve(b, (size_t)k);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap2);
    b->n += (size_t)k;
  }
  va_end(ap2);
}

void sm_buf_printf(sm_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sm_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

const char *sm_buf_str(sm_buf *b) { return b->p ? b->p : ""; }

char *sm_buf_take(sm_buf *b) {
  char *s = b->p ? b->p : sm_xstrdup("");
  b->p = NULL;
  b->n = b->cap = 0;
  return s;
}

void sm_buf_clear(sm_buf *b) {
  b->n = 0;
  if (b->p) b->p[0] = 0;
}

void sm_buf_free(sm_buf *b) {
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
}
