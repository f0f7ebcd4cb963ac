/* Hugging Face tokenizers' normalizers (NFD/NFKD/NFC/NFKC, StripAccents, Lowercase) with the Unicode
 * data that tokenizers 0.22 uses (see unicode_norm.h). Hand-written rather than utf8proc because
 * the results must match that data exactly: utf8proc has only its own, newer, Unicode version, and
 * for characters encoded after 9.0 (new decompositions, new combining marks) the forms differ.
 * The algorithm is UAX #15: full decomposition (Hangul algorithmically), canonical ordering of
 * non-starter runs, then canonical composition with blocking. */
#include <stdlib.h>
#include <string.h>
#include "base/base.h"
#include "tokenizer/unicode_norm.h"

enum {
  SBASE = 0xAC00,
  LBASE = 0x1100,
  VBASE = 0x1161,
  TBASE = 0x11A7,
  LCOUNT = 19,
  VCOUNT = 21,
  TCOUNT = 28,
  NCOUNT = VCOUNT * TCOUNT,
  SCOUNT = LCOUNT * NCOUNT
};

static uint8_t ccc_of(uint32_t c) {
  if (c < 0x300) return 0;
  size_t lo = 0, hi = sm_norm_nccc;
  while (lo < hi) {
    size_t m = (lo + hi) / 2;
    if (c < sm_norm_ccc[m].lo) hi = m;
    else if (c > sm_norm_ccc[m].hi) lo = m + 1;
    else return sm_norm_ccc[m].ccc;
  }
  return 0;
}
static const sm_norm_decomp *find_decomp(const sm_norm_decomp *t, size_t n, uint32_t c) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t m = (lo + hi) / 2;
    if (c < t[m].cp) hi = m;
    else if (c > t[m].cp) lo = m + 1;
    else return &t[m];
  }
  return NULL;
}
static uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
    return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
  if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
    return a + (b - TBASE);
  size_t lo = 0, hi = sm_norm_ncomps;
  while (lo < hi) {
    size_t m = (lo + hi) / 2;
    const sm_norm_comp *e = &sm_norm_comps[m];
    if (a < e->a || (a == e->a && b < e->b)) hi = m;
    else if (a > e->a || b > e->b) lo = m + 1;
    else return e->c;
  }
  return 0;
}
static bool in_ranges(const sm_norm_range *t, size_t n, uint32_t c) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t m = (lo + hi) / 2;
    if (c < t[m].lo) hi = m;
    else if (c > t[m].hi) lo = m + 1;
    else return true;
  }
  return false;
}

/* a growable code point buffer (one normalization; small inputs stay on the stack) */
typedef struct {
  uint32_t *v, stack[256];
  size_t n, cap;
} cpbuf;
static void cp_push(cpbuf *b, uint32_t c) {
  if (b->n == b->cap) {
    size_t cap = b->cap * 2;
    uint32_t *nv = sm_xmalloc(cap * sizeof *nv);
    memcpy(nv, b->v, b->n * sizeof *nv);
    if (b->v != b->stack) free(b->v);
    b->v = nv;
    b->cap = cap;
  }
  b->v[b->n++] = c;
}

/* decode one UTF-8 code point; -1 for an invalid byte (len 1) */
static int32_t dec(const char *s, size_t n, size_t i, size_t *len) {
  const unsigned char *p = (const unsigned char *)s + i;
  size_t left = n - i;
  uint32_t c = p[0];
  size_t l = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (!l || l > left) return *len = 1, -1;
  if (l > 1) {
    c &= 0x7F >> l;
    for (size_t k = 1; k < l; k++) {
      if ((p[k] & 0xC0) != 0x80) return *len = 1, -1;
      c = c << 6 | (p[k] & 0x3F);
    }
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[l] || c > 0x10FFFF || (c >= 0xD800 && c < 0xE000)) return *len = 1, -1;
  }
  *len = l;
  return (int32_t)c;
}

static void decompose_into(cpbuf *b, uint32_t c, bool compat) {
  if (c < 0x80) {
    cp_push(b, c);
    return;
  }
  if (c >= SBASE && c < SBASE + SCOUNT) {
    uint32_t s = c - SBASE;
    cp_push(b, LBASE + s / NCOUNT);
    cp_push(b, VBASE + (s % NCOUNT) / TCOUNT);
    if (s % TCOUNT) cp_push(b, TBASE + s % TCOUNT);
    return;
  }
  const sm_norm_decomp *d = compat ? find_decomp(sm_norm_compat, sm_norm_ncompat, c) : NULL;
  if (!d) d = find_decomp(sm_norm_canon, sm_norm_ncanon, c);
  if (!d) {
    cp_push(b, c);
    return;
  }
  for (uint32_t k = 0; k < d->len; k++) cp_push(b, sm_norm_pool[d->off + k]);
}

/* canonical ordering: a stable sort of each run of non-starters by combining class */
static void reorder(uint32_t *v, size_t n) {
  for (size_t i = 1; i < n; i++) {
    uint8_t ci = ccc_of(v[i]);
    if (!ci) continue;
    size_t j = i;
    uint32_t x = v[i];
    while (j > 0) {
      uint8_t cj = ccc_of(v[j - 1]);
      if (cj <= ci) break;
      v[j] = v[j - 1];
      j--;
    }
    v[j] = x;
  }
}

static size_t compose(uint32_t *v, size_t n) {
  size_t o = 0, si = SIZE_MAX; /* output length, index of the last starter */
  uint8_t prev = 0;            /* combining class of the last character kept after that starter */
  for (size_t i = 0; i < n; i++) {
    uint32_t c = v[i];
    uint8_t cc = ccc_of(c);
    if (si != SIZE_MAX && (o == si + 1 || prev < cc)) { /* not blocked */
      uint32_t k = compose_pair(v[si], c);
      if (k) {
        v[si] = k;
        continue;
      }
    }
    if (!cc) si = o, prev = 0;
    else prev = cc;
    v[o++] = c;
  }
  return o;
}

static void flush(cpbuf *b, sm_norm_form form, sm_buf *out) {
  reorder(b->v, b->n);
  size_t n = form == SM_NFC || form == SM_NFKC ? compose(b->v, b->n) : b->n;
  for (size_t i = 0; i < n; i++) sm_buf_put_cp(out, b->v[i]);
  b->n = 0;
}

void sm_unorm(sm_norm_form form, const char *s, size_t n, sm_buf *out) {
  size_t i = 0;
  while (i < n && (unsigned char)s[i] < 0x80) i++; /* ASCII is invariant */
  if (i == n) {
    sm_buf_put(out, s, n);
    return;
  }
  bool compat = form == SM_NFKD || form == SM_NFKC;
  cpbuf b = {.cap = SM_ARRAY_LEN(b.stack)};
  b.v = b.stack;
  for (i = 0; i < n;) {
    size_t l;
    int32_t c = dec(s, n, i, &l);
    if (c < 0) { /* not text: pass the byte through, as a boundary */
      flush(&b, form, out);
      sm_buf_put(out, s + i, 1);
    } else decompose_into(&b, (uint32_t)c, compat);
    i += l;
  }
  flush(&b, form, out);
  if (b.v != b.stack) free(b.v);
}

void sm_unorm_strip_accents(const char *s, size_t n, sm_buf *out) {
  for (size_t i = 0; i < n;) {
    size_t l;
    int32_t c = dec(s, n, i, &l);
    if (c < 0x300 || !in_ranges(sm_norm_marks, sm_norm_nmarks, (uint32_t)c)) sm_buf_put(out, s + i, l);
    i += l;
  }
}

bool sm_hf_is_punctuation(uint32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return in_ranges(sm_norm_puncts, sm_norm_npuncts, c);
}

void sm_unorm_lowercase(const char *s, size_t n, sm_buf *out) {
  for (size_t i = 0; i < n;) {
    size_t l;
    int32_t c = dec(s, n, i, &l);
    if (c < 0x80) {
      char ch = s[i];
      sm_buf_putc(out, ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch);
      i += l;
      continue;
    }
    size_t lo = 0, hi = sm_norm_nlowers;
    const sm_norm_lower *f = NULL;
    while (lo < hi && !f) {
      size_t m = (lo + hi) / 2;
      if ((uint32_t)c < sm_norm_lowers[m].cp) hi = m;
      else if ((uint32_t)c > sm_norm_lowers[m].cp) lo = m + 1;
      else f = &sm_norm_lowers[m];
    }
    if (!f) sm_buf_put(out, s + i, l);
    else {
      sm_buf_put_cp(out, f->l1);
      if (f->l2) sm_buf_put_cp(out, f->l2);
    }
    i += l;
  }
}
