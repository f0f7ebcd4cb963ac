/* The bytes one token adds to generated text in the middle of a sequence: the decoder steps
 * applied to the token alone, without the parts that only act at the start of a text (Strip,
 * Metaspace's first-word rule) and without replacing incomplete UTF-8 (a byte-level token may be
 * part of a character). Constrained decoding (src/engine/grammar.c) matches these bytes. */
#include <string.h>
#include "tokenizer/tok_internal.h"

static void piece_apply(const sm_decoder *d, sm_buf *b) {
  switch (d->type) {
    case DEC_SEQ:
      for (int k = 0; k < d->nkids; k++) piece_apply(&d->kids[k], b);
      return;
    case DEC_BYTELEVEL: {
      sm_buf raw = SM_BUF_INIT;
      const char *s = b->p ? b->p : "";
      for (size_t k = 0; k < b->n;) {
        uint32_t cp;
        int cl = sm_utf8_dec(s + k, b->n - k, &cp);
        int byte = sm_bl_dec(cp);
        if (byte < 0) {
          sm_buf_free(&raw);
          return;
        } /* not byte-level text (an added token): kept */
        sm_buf_putc(&raw, (char)byte);
        k += (size_t)cl;
      }
      sm_buf_free(b);
      *b = raw;
      return;
    }
    case DEC_BYTEFALLBACK: {
      const char *s = b->p;
      if (b->n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
        int v = 0;
        for (int i = 3; i < 5; i++) {
          char c = s[i];
          int h = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
          if (h < 0) return;
          v = v * 16 + h;
        }
        sm_buf_clear(b);
        sm_buf_putc(b, (char)v);
      }
      return;
    }
    case DEC_METASPACE: {
      sm_buf o = SM_BUF_INIT;
      const char *s = b->p ? b->p : "";
      for (size_t k = 0; k < b->n;) {
        uint32_t cp;
        int cl = sm_utf8_dec(s + k, b->n - k, &cp);
        if (cp == d->repl) sm_buf_putc(&o, ' ');
        else sm_buf_put(&o, s + k, (size_t)cl);
        k += (size_t)cl;
      }
      sm_buf_free(b);
      *b = o;
      return;
    }
    case DEC_REPLACE: {
      if (d->pat.kind != PAT_STRING || !d->pat.litlen) return;
      sm_buf o = SM_BUF_INIT;
      const char *s = b->p ? b->p : "";
      size_t k = 0, last = 0;
      while (k + d->pat.litlen <= b->n) {
        const char *f = memmem(s + k, b->n - k, d->pat.lit, d->pat.litlen);
        if (!f) break;
        size_t st = (size_t)(f - s);
        sm_buf_put(&o, s + last, st - last);
        sm_buf_put(&o, d->str, d->slen);
        k = last = st + d->pat.litlen;
      }
      sm_buf_put(&o, s + last, b->n - last);
      sm_buf_free(b);
      *b = o;
      return;
    }
    default: /* Fuse, Strip: nothing inside a text */ return;
  }
}

bool sm_tok_piece_bytes(const smelt_tokenizer *t, int32_t id, sm_buf *out) {
  sm_buf_clear(out);
  if (!t || id < 0 || id >= t->n_ids || !t->id_tok[id]) return false;
  sm_buf_put(out, t->id_tok[id], t->id_len[id]);
  if (!t->decoder) return true;
  /* added tokens are not byte-level text */
  bool added = false;
  for (int i = 0; i < t->n_added && !added; i++) added = t->added[i].id == id;
  if (!added) piece_apply(t->decoder, out);
  return true;
}
