/* Hugging Face tokenizers' decoders (ByteLevel, Fuse, ByteFallback, Metaspace, Strip, Replace, Sequence),
 * smelt_detokenize and the streaming detokenizer (sm_detok). Loading: tokenizer.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_props.h"

/* ---------------- decoding ---------------- */
typedef struct {
  sm_buf *v;
  size_t n;
} slist;
static void sl_free(slist *l) {
  for (size_t i = 0; i < l->n; i++) sm_buf_free(&l->v[i]);
  free(l->v);
  l->v = NULL;
  l->n = 0;
}

static void dec_apply(const sm_decoder *d, slist *l) {
  switch (d->type) {
    case DEC_BYTELEVEL: {
      sm_buf raw = {0};
      for (size_t i = 0; i < l->n; i++) {
        const char *s = l->v[i].p ? l->v[i].p : "";
        size_t n = l->v[i].n;
        size_t mark = raw.n;
        bool ok = true;
        for (size_t k = 0; k < n;) {
          uint32_t cp;
          int cl = sm_utf8_dec(s + k, n - k, &cp);
          int b = sm_bl_dec(cp);
          if (b < 0) {
            ok = false;
            break;
          }
          sm_buf_putc(&raw, (char)b);
          k += (size_t)cl;
        }
        if (!ok) {
          raw.n = mark;
          sm_buf_put(&raw, s, n);
        }
      }
      sl_free(l);
      l->v = sm_xcalloc(1, sizeof(sm_buf));
      l->n = 1;
      sm_utf8_lossy(&l->v[0], raw.p ? raw.p : "", raw.n);
      sm_buf_free(&raw);
      return;
    }
    case DEC_FUSE: {
      sm_buf all = {0};
      for (size_t i = 0; i < l->n; i++) sm_buf_put(&all, l->v[i].p ? l->v[i].p : "", l->v[i].n);
      sl_free(l);
      l->v = sm_xcalloc(1, sizeof(sm_buf));
      l->n = 1;
      l->v[0] = all;
      return;
    }
    case DEC_BYTEFALLBACK: {
      sm_buf *nv = sm_xcalloc(l->n + 1, sizeof(sm_buf));
      size_t nn = 0;
      sm_buf bytes = {0};
      size_t nbytes = 0;
      for (size_t i = 0; i <= l->n; i++) {
        int byte = -1;
        if (i < l->n) {
          const char *s = l->v[i].p;
          if (l->v[i].n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
            char h[3] = {s[3], s[4], 0};
            char *e;
            long v = strtol(h, &e, 16);
            bool hex = ((h[0] >= '0' && h[0] <= '9') || ((h[0] | 0x20) >= 'a' && (h[0] | 0x20) <= 'f')) &&
                       ((h[1] >= '0' && h[1] <= '9') || ((h[1] | 0x20) >= 'a' && (h[1] | 0x20) <= 'f'));
            if (hex && *e == 0) byte = (int)v;
          }
        }
        if (byte >= 0) {
          sm_buf_putc(&bytes, (char)byte);
          nbytes++;
          continue;
        }
        if (nbytes) {
          if (sm_utf8_valid(bytes.p, bytes.n)) {
            nv[nn] = (sm_buf){0};
            sm_buf_put(&nv[nn], bytes.p, bytes.n);
            nn++;
          } else {
            nv = sm_xrealloc(nv, (l->n + 1 + nbytes) * sizeof(sm_buf));
            for (size_t k = 0; k < nbytes; k++) {
              nv[nn] = (sm_buf){0};
              sm_buf_put(&nv[nn], "\xEF\xBF\xBD", 3);
              nn++;
            }
          }
          sm_buf_clear(&bytes);
          nbytes = 0;
        }
        if (i < l->n) {
          nv[nn++] = l->v[i];
          l->v[i] = (sm_buf){0};
        }
      }
      sm_buf_free(&bytes);
      sl_free(l);
      l->v = nv;
      l->n = nn;
      return;
    }
    case DEC_METASPACE:
    case DEC_STRIP:
    case DEC_REPLACE: {
      for (size_t i = 0; i < l->n; i++) {
        const char *s = l->v[i].p ? l->v[i].p : "";
        size_t n = l->v[i].n;
        sm_buf o = {0};
        if (d->type == DEC_REPLACE) {
          sm_buf in = l->v[i];
          pcre2_match_data *md = d->pat.kind == PAT_REGEX ? pcre2_match_data_create(4, NULL) : NULL;
          size_t k = 0, last = 0;
          if (d->pat.kind == PAT_STRING) {
            while (d->pat.litlen && k + d->pat.litlen <= n) {
              const char *f = memmem(s + k, n - k, d->pat.lit, d->pat.litlen);
              if (!f) break;
              size_t st = (size_t)(f - s);
              sm_buf_put(&o, s + last, st - last);
              sm_buf_put(&o, d->str, d->slen);
              k = last = st + d->pat.litlen;
            }
          } else {
            size_t ms, me;
            while (k <= n && sm_re_find(d->pat.re, md, s, n, k, &ms, &me)) {
              if (me == ms) {
                if (ms >= n) break;
                k = ms + 1;
                while (k < n && ((uint8_t)s[k] & 0xC0) == 0x80) k++;
                continue;
              }
              sm_buf_put(&o, s + last, ms - last);
              sm_buf_put(&o, d->str, d->slen);
              k = last = me;
            }
          }
          sm_buf_put(&o, s + last, n - last);
          if (md) pcre2_match_data_free(md);
          sm_buf_free(&in);
        } else if (d->type == DEC_METASPACE) {
          for (size_t k = 0; k < n;) {
            uint32_t cp;
            int cl = sm_utf8_dec(s + k, n - k, &cp);
            if (cp == d->repl) {
              if (!(i == 0 && d->prepend_scheme != PREPEND_NEVER)) sm_buf_putc(&o, ' ');
            } else sm_buf_put(&o, s + k, (size_t)cl);
            k += (size_t)cl;
          }
          sm_buf_free(&l->v[i]);
        } else { /* Strip */
          size_t a = 0, b = n;
          for (int c = 0; c < d->start && a < b; c++) {
            uint32_t cp;
            int cl = sm_utf8_dec(s + a, b - a, &cp);
            if (cp != d->ch) break;
            a += (size_t)cl;
          }
          for (int c = 0; c < d->stop && b > a; c++) {
            size_t k = b - 1;
            while (k > a && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
            uint32_t cp;
            sm_utf8_dec(s + k, b - k, &cp);
            if (cp != d->ch) break;
            b = k;
          }
          sm_buf_put(&o, s + a, b - a);
          sm_buf_free(&l->v[i]);
        }
        l->v[i] = o;
      }
      return;
    }
    case DEC_SEQ:
      for (int k = 0; k < d->nkids; k++) dec_apply(&d->kids[k], l);
      return;
  }
}

static char *decode_ids(const smelt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, size_t *out_len) {
  slist l = {0};
  l.v = sm_xcalloc(n + 1, sizeof(sm_buf));
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->n_ids || !t->id_tok[id]) continue;
    if (skip_special && t->id_special[id]) continue;
    sm_buf b = {0};
    sm_buf_put(&b, t->id_tok[id], t->id_len[id]);
    l.v[l.n++] = b;
  }
  sm_buf res = {0};
  if (t->decoder) {
    dec_apply(t->decoder, &l);
    for (size_t i = 0; i < l.n; i++) sm_buf_put(&res, l.v[i].p ? l.v[i].p : "", l.v[i].n);
  } else {
    for (size_t i = 0; i < l.n; i++) {
      if (i) sm_buf_putc(&res, ' ');
      sm_buf_put(&res, l.v[i].p ? l.v[i].p : "", l.v[i].n);
    }
  }
  sl_free(&l);
  if (out_len) *out_len = res.n;
  return sm_buf_take(&res);
}

smelt_status smelt_detokenize(const smelt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text) {
  if (!t || !text || (!ids && n)) return sm_err(SMELT_ERR_INVALID, "smelt_detokenize: NULL argument");
  *text = decode_ids(t, ids, n, skip_special, NULL);
  return SMELT_OK;
}

smelt_status sm_tok_decode(const smelt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text,
                           size_t *len) {
  if (!t || !text || !len || (!ids && n)) return sm_err(SMELT_ERR_INVALID, "sm_tok_decode: NULL argument");
  *text = decode_ids(t, ids, n, skip_special, len);
  return SMELT_OK;
}

/* ---------------- streaming detokenizer ----------------
 * Like HF DecodeStream: decode a window ids[prefix..] and emit the part beyond the text of
 * ids[prefix..read]; hold while the window's text ends in U+FFFD (incomplete bytes).
 * All ids and the emitted text are kept so that flush can reconcile with the full decode. */
struct sm_detok {
  const smelt_tokenizer *t;
  bool skip;
  int32_t *ids;
  size_t n, cap;
  size_t prefix, read;
  sm_buf emitted;
};
sm_detok *sm_detok_new(const smelt_tokenizer *t, bool skip_special) {
  if (!t) return NULL;
  sm_detok *d = sm_xcalloc(1, sizeof *d);
  d->t = t;
  d->skip = skip_special;
  return d;
}
static size_t emit(sm_detok *d, const char *s, size_t n, char **out) {
  char *o = sm_xmalloc(n + 1);
  memcpy(o, s, n);
  o[n] = 0;
  sm_buf_put(&d->emitted, s, n);
  *out = o;
  return n;
}
size_t sm_detok_push(sm_detok *d, int32_t id, char **out) {
  if (!d || !out) return 0;
  if (d->n == d->cap) {
    d->cap = d->cap ? d->cap * 2 : 64;
    d->ids = sm_xrealloc(d->ids, d->cap * sizeof(int32_t));
  }
  d->ids[d->n++] = id;
  /* ByteFallback turns a whole run of <0xXX> tokens into U+FFFDs when the run is invalid, so
   * text that ends in such a run may still change: hold it */
  if (d->t->dec_bytefallback) {
    const smelt_tokenizer *t = d->t;
    for (size_t i = d->n; i-- > d->prefix;) {
      int32_t x = d->ids[i];
      if (x < 0 || x >= t->n_ids || !t->id_tok[x] || (d->skip && t->id_special[x])) continue;
      const char *s = t->id_tok[x];
      if (t->id_len[x] == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
        *out = sm_xstrdup("");
        return 0;
      }
      break;
    }
  }
  size_t plen, nlen;
  char *prev = decode_ids(d->t, d->ids + d->prefix, d->read - d->prefix, d->skip, &plen);
  char *cur = decode_ids(d->t, d->ids + d->prefix, d->n - d->prefix, d->skip, &nlen);
  size_t r = 0;
  bool incomplete = nlen >= 3 && !memcmp(cur + nlen - 3, "\xEF\xBF\xBD", 3);
  if (nlen > plen && !incomplete && !memcmp(cur, prev, plen)) {
    r = emit(d, cur + plen, nlen - plen, out);
    d->prefix = d->read;
    d->read = d->n;
  } else *out = sm_xstrdup("");
  free(prev);
  free(cur);
  return r;
}
size_t sm_detok_flush(sm_detok *d, char **out) {
  if (!d || !out) return 0;
  size_t flen;
  char *full = decode_ids(d->t, d->ids, d->n, d->skip, &flen);
  size_t r = 0;
  if (flen >= d->emitted.n && !memcmp(full, d->emitted.p ? d->emitted.p : "", d->emitted.n))
    r = emit(d, full + d->emitted.n, flen - d->emitted.n, out);
  else *out = sm_xstrdup(""); /* cannot happen unless the decoder is non-monotonic */
  free(full);
  d->prefix = d->read = d->n;
  return r;
}
void sm_detok_free(sm_detok *d) {
  if (!d) return;
  free(d->ids);
  sm_buf_free(&d->emitted);
  free(d);
}
