/* The one growable byte buffer of smelt. Every module that builds text or bytes uses it.
 * Contents are length-counted (b.n bytes, which may include NUL bytes); after any put the
 * buffer is also NUL-terminated (b.p[b.n] == 0) so that it can be handed to C string APIs. */
#ifndef SM_STRBUF_H
#define SM_STRBUF_H
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char *p;    /* NULL until the first put */
  size_t n;   /* bytes used */
  size_t cap; /* bytes allocated (> n when p != NULL) */
} sm_buf;

#define SM_BUF_INIT \
  { NULL, 0, 0 }

void sm_buf_reserve(sm_buf *b, size_t extra); /* room for extra more bytes (+ NUL) */
void sm_buf_put(sm_buf *b, const void *s, size_t n);
void sm_buf_puts(sm_buf *b, const char *s); /* strlen(s) bytes */
void sm_buf_putc(sm_buf *b, char c);
void sm_buf_put_cp(sm_buf *b, uint32_t cp); /* UTF-8 encoding of a code point */
void sm_buf_printf(sm_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sm_buf_vprintf(sm_buf *b, const char *fmt, va_list ap);
const char *sm_buf_str(sm_buf *b); /* never NULL: "" when empty */
char *sm_buf_take(sm_buf *b);      /* malloc'd, NUL-terminated; b is reset */
void sm_buf_clear(sm_buf *b);      /* n = 0, memory kept */
void sm_buf_free(sm_buf *b);

#ifdef __cplusplus
}
#endif
#endif
