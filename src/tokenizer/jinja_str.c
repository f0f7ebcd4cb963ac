/* Chat-template strings with Python's str semantics: case mapping (lower/upper with the final sigma
 * and the multi-character mappings templates meet, title, capitalize, Jinja2's title filter),
 * strip/split on Python whitespace, replace, splitlines, indent, int()/float() of a string, and
 * printf-style `%` and str.format() formatting.
 * Hand-written because the reference is Python's str (Jinja2 calls it), which no C library mirrors;
 * single-character case mappings and categories come from utf8proc. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "tokenizer/jinja_rt.h"

size_t jj_cp_count(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n;) i += jj_utf8_next(s, n, i, NULL), c++;
  return c;
}

const char *jj_memmem(const char *h, size_t hn, const char *n, size_t nn) {
  if (!nn) return h;
  if (nn > hn) return NULL;
  for (size_t i = 0; i + nn <= hn; i++)
    if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
  return NULL;
}

/* ---------------- case ---------------- */
static bool is_cased(int32_t c) {
  utf8proc_category_t k = utf8proc_category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         utf8proc_tolower(c) != c || utf8proc_toupper(c) != c;
}
static bool is_case_ignorable(int32_t c) {
  utf8proc_category_t k = utf8proc_category(c);
  return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_CF ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_SK || c == '\'' || c == '.' || c == ':' || c == 0x2019 ||
         c == 0xb7 || c == 0xad;
}
/* Final_Sigma: a cased letter before (skipping case-ignorables) and none after */
static bool final_sigma(const char *s, size_t n, size_t at, size_t len) {
  bool before = false;
  for (size_t j = at; j > 0;) {
    size_t k = j - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
    int32_t c;
    jj_utf8_next(s, n, k, &c);
    if (!is_case_ignorable(c)) {
      before = is_cased(c);
      break;
    }
    j = k;
  }
  if (!before) return false;
  for (size_t j = at + len; j < n;) {
    int32_t c;
    size_t l = jj_utf8_next(s, n, j, &c);
    if (!is_case_ignorable(c)) return !is_cased(c);
    j += l;
  }
  return true;
}
/* one code point in Python's full mapping; mode 0 lower, 1 upper, 2 title */
static void put_case(sm_buf *b, const char *s, size_t n, size_t at, size_t len, int32_t c, int mode) {
  if (c < 0) {
    sm_buf_put(b, s + at, len);
    return;
  }
  if (mode == 0) {
    if (c == 0x130) {
      sm_buf_puts(b, "i\xcc\x87");
      return;
    }
    if (c == 0x3a3) {
      sm_buf_puts(b, final_sigma(s, n, at, len) ? "\xcf\x82" : "\xcf\x83");
      return;
    }
  } else if (c == 0xdf) {
    sm_buf_puts(b, mode == 1 ? "SS" : "Ss");
    return;
  }
  int32_t m = mode == 0 ? utf8proc_tolower(c) : mode == 1 ? utf8proc_toupper(c) : utf8proc_totitle(c);
  if (m == c) sm_buf_put(b, s + at, len);
  else sm_buf_put_cp(b, (uint32_t)m);
}
jv *jj_case_map(jj_rt *r, const jv *v, int mode /* 0 lower, 1 upper */) {
  sm_buf *b = jj_buf(r);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n;
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t l = jj_utf8_next(s, n, i, &cp);
    put_case(b, s, n, i, l, cp, mode);
    i += l;
  }
  return jj_buf_value(r, b);
}
/* str.title(): titlecase after an uncased character, lowercase after a cased one */
jv *jj_py_title(jj_rt *r, const jv *v) {
  sm_buf *b = jj_buf(r);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n;
  bool prev_cased = false;
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t l = jj_utf8_next(s, n, i, &cp);
    put_case(b, s, n, i, l, cp, prev_cased ? 0 : 2);
    prev_cased = cp >= 0 && is_cased(cp);
    i += l;
  }
  return jj_buf_value(r, b);
}
/* str.capitalize(): the first character titlecased, the rest lowercased */
jv *jj_py_capitalize(jj_rt *r, const jv *v) {
  sm_buf *b = jj_buf(r);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n;
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t l = jj_utf8_next(s, n, i, &cp);
    put_case(b, s, n, i, l, cp, i == 0 ? 2 : 0);
    i += l;
  }
  return jj_buf_value(r, b);
}
/* Jinja2's |title: split at runs of [-\s({\[<], then word[0].upper() + word[1:].lower() */
jv *jj_title_filter(jj_rt *r, const jv *v) {
  sm_buf *b = jj_buf(r);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n;
  bool start = true;
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t l = jj_utf8_next(s, n, i, &cp);
    bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || (cp >= 0 && jj_py_space_cp(cp));
    if (sep) sm_buf_put(b, s + i, l);
    else put_case(b, s, n, i, l, cp, start ? 1 : 0);
    start = sep;
    i += l;
  }
  return jj_buf_value(r, b);
}
/* str.islower() / isupper(): some cased character and none of the other case */
bool jj_py_iscase(const jv *v, bool upper) {
  bool any = false;
  for (size_t i = 0; i < v->u.s.n;) {
    int32_t c;
    i += jj_utf8_next(v->u.s.s, v->u.s.n, i, &c);
    if (c < 0 || !is_cased(c)) continue;
    utf8proc_category_t k = utf8proc_category(c);
    bool lo = k == UTF8PROC_CATEGORY_LL ||
              (k != UTF8PROC_CATEGORY_LU && k != UTF8PROC_CATEGORY_LT && utf8proc_toupper(c) != c);
    bool up = k == UTF8PROC_CATEGORY_LU || (k != UTF8PROC_CATEGORY_LL && utf8proc_tolower(c) != c);
    if (k == UTF8PROC_CATEGORY_LT || (upper ? !up : !lo)) return false;
    any = true;
  }
  return any;
}

/* ---------------- strip, split, replace, splitlines ---------------- */
static bool cp_in_set(int32_t cp, const char *set, size_t n) {
  for (size_t i = 0; i < n;) {
    int32_t c;
    i += jj_utf8_next(set, n, i, &c);
    if (c == cp) return true;
  }
  return false;
}
/* which: bit 0 left, bit 1 right; chars NULL: Python whitespace */
jv *jj_strip(jj_rt *r, const jv *v, int which, const jv *chars) {
  const char *s = v->u.s.s;
  size_t n = v->u.s.n, st = 0, en = n;
  while ((which & 1) && st < en) {
    int32_t cp;
    size_t l = jj_utf8_next(s, n, st, &cp);
    if (!(chars ? cp_in_set(cp, chars->u.s.s, chars->u.s.n) : jj_is_space_at(s, n, st, NULL))) break;
    st += l;
  }
  while ((which & 2) && en > st) {
    size_t p = en - 1;
    while (p > st && ((unsigned char)s[p] & 0xc0) == 0x80) p--;
    int32_t cp;
    size_t l = jj_utf8_next(s, n, p, &cp);
    if (p + l != en) break;
    if (!(chars ? cp_in_set(cp, chars->u.s.s, chars->u.s.n) : jj_is_space_at(s, n, p, NULL))) break;
    en = p;
  }
  jstr o = {s + st, en - st};
  return jj_jstr(r, o);
}

jv *jj_str_replace(jj_rt *r, const jv *v, const jv *old, const jv *new_, int64_t count) {
  if (count == 0) return (jv *)v;
  int64_t remaining = count < 0 ? INT64_MAX : count;
  sm_buf *b = jj_buf(r);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n;
  if (old->u.s.n == 0) {
    for (size_t i = 0;;) {
      if (remaining > 0) sm_buf_put(b, new_->u.s.s, new_->u.s.n), remaining--;
      if (i >= n) break;
      size_t l = jj_utf8_next(s, n, i, NULL);
      sm_buf_put(b, s + i, l);
      i += l;
    }
    return jj_buf_value(r, b);
  }
  size_t i = 0;
  while (i < n) {
    const char *f = remaining > 0 ? jj_memmem(s + i, n - i, old->u.s.s, old->u.s.n) : NULL;
    if (!f) break;
    sm_buf_put(b, s + i, (size_t)(f - (s + i)));
    sm_buf_put(b, new_->u.s.s, new_->u.s.n);
    i = (size_t)(f - s) + old->u.s.n;
    remaining--;
  }
  sm_buf_put(b, s + i, n - i);
  return jj_buf_value(r, b);
}

jv *jj_split_str(jj_rt *r, jv *s, jv *sep, int64_t maxsplit) {
  jv *o = jj_list_new(r);
  const char *p = s->u.s.s;
  size_t n = s->u.s.n;
  if (!sep || sep->t == V_NONE) {
    size_t i = 0, l;
    while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
    while (i < n) {
      size_t st = i;
      if (maxsplit >= 0 && (int64_t)o->u.l->n >= maxsplit) { /* the rest, as it is */
        jstr rest = {p + st, n - st};
        jj_list_push(r, o, jj_jstr(r, rest));
        return o;
      }
      while (i < n && !jj_is_space_at(p, n, i, &l)) i += jj_utf8_next(p, n, i, NULL);
      jstr w = {p + st, i - st};
      jj_list_push(r, o, jj_jstr(r, w));
      while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
    }
    return o;
  }
  if (sep->t != V_STR) jj_fail(r, "TypeError: must be str or None, not %s", jj_tname(sep));
  if (!sep->u.s.n) jj_fail(r, "ValueError: empty separator");
  size_t i = 0;
  for (;;) {
    const char *f = (maxsplit < 0 || (int64_t)o->u.l->n < maxsplit) ? jj_memmem(p + i, n - i, sep->u.s.s, sep->u.s.n)
                                                                    : NULL;
    jstr w = {p + i, f ? (size_t)(f - (p + i)) : n - i};
    jj_list_push(r, o, jj_jstr(r, w));
    if (!f) return o;
    i = (size_t)(f - p) + sep->u.s.n;
  }
}

/* str.splitlines(): the line boundaries Python knows; \r\n counts as one */
jv *jj_splitlines(jj_rt *r, const jv *v) {
  jv *o = jj_list_new(r);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n, st = 0;
  for (size_t i = 0; i < n;) {
    int32_t c;
    size_t l = jj_utf8_next(s, n, i, &c);
    if ((c >= 10 && c <= 13) || (c >= 0x1c && c <= 0x1e) || c == 0x85 || c == 0x2028 || c == 0x2029) {
      jstr w = {s + st, i - st};
      jj_list_push(r, o, jj_jstr(r, w));
      if (c == 13 && i + 1 < n && s[i + 1] == '\n') l++;
      st = i + l;
    }
    i += l;
  }
  if (st < n) {
    jstr w = {s + st, n - st};
    jj_list_push(r, o, jj_jstr(r, w));
  }
  return o;
}

/* Jinja2's do_indent */
jv *jj_indent(jj_rt *r, jv *s, jv *width, bool first, bool blank) {
  sm_buf *ind = jj_buf(r);
  if (width->t == V_STR) sm_buf_put(ind, width->u.s.s, width->u.s.n);
  else if (width->t == V_INT || width->t == V_BOOL) {
    int64_t w = width->t == V_BOOL ? width->u.b : width->u.i;
    if (w > 1000) jj_fail(r, "indent width too large");
    for (int64_t i = 0; i < w; i++) sm_buf_putc(ind, ' ');
  } else jj_fail(r, "TypeError: can't multiply sequence by non-int of type '%s'", jj_tname(width));
  jv *indv = jj_buf_value(r, ind);
  sm_buf *t = jj_buf(r);
  sm_buf_put(t, s->u.s.s, s->u.s.n);
  sm_buf_putc(t, '\n');
  jv *lines = jj_splitlines(r, jj_buf_value(r, t));
  sm_buf *b = jj_buf(r);
  if (first) sm_buf_put(b, indv->u.s.s, indv->u.s.n);
  for (size_t i = 0; i < lines->u.l->n; i++) {
    jv *ln = lines->u.l->v[i];
    if (i) {
      sm_buf_putc(b, '\n');
      if (blank || ln->u.s.n) sm_buf_put(b, indv->u.s.s, indv->u.s.n);
    }
    sm_buf_put(b, ln->u.s.s, ln->u.s.n);
  }
  return jj_buf_value(r, b);
}

/* ---------------- int() and float() of a string ---------------- */
/* digits of base `base` with single underscores between them; returns the end, or st if none */
static size_t scan_digits(const char *p, size_t st, size_t n, int base, bool allow_leading_us) {
  size_t i = st;
  for (;;) {
    size_t d = i;
    if (d < n && p[d] == '_' && (d > st || allow_leading_us)) d++;
    if (d >= n) break;
    int c = p[d], v = c >= '0' && c <= '9'                   ? c - '0'
                    : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10
                                                             : 99;
    if (v >= base) break;
    i = d + 1;
  }
  return i;
}
static void trim_span(const jv *s, size_t *a, size_t *b) {
  size_t l;
  *a = 0, *b = s->u.s.n;
  while (*a < *b && jj_is_space_at(s->u.s.s, s->u.s.n, *a, &l)) *a += l;
  while (*b > *a) {
    size_t p = *b - 1;
    while (p > *a && ((unsigned char)s->u.s.s[p] & 0xc0) == 0x80) p--;
    if (!jj_is_space_at(s->u.s.s, s->u.s.n, p, NULL)) break;
    *b = p;
  }
}
/* Python int(s, base); false where it raises ValueError */
bool jj_py_int_of_str(const jv *s, int base, int64_t *out, bool *overflow) {
  size_t a, b;
  trim_span(s, &a, &b);
  const char *p = s->u.s.s;
  bool neg = false;
  *overflow = false;
  if (a < b && (p[a] == '+' || p[a] == '-')) neg = p[a] == '-', a++;
  bool prefixed = false;
  if (b - a >= 2 && p[a] == '0') {
    char x = (char)(p[a + 1] | 0x20);
    int pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
    if (pb && (base == pb || base == 0)) base = pb, a += 2, prefixed = true;
  }
  if (base == 0) base = 10;
  size_t e = scan_digits(p, a, b, base, prefixed);
  if (e == a || e != b) return false;
  unsigned long long v = 0;
  for (size_t i = a; i < e; i++) {
    if (p[i] == '_') continue;
    int c = p[i], d = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
    if (v > (ULLONG_MAX - (unsigned)d) / (unsigned)base) {
      *overflow = true;
      return true;
    }
    v = v * (unsigned)base + (unsigned)d;
  }
  if (v > (unsigned long long)INT64_MAX + (neg ? 1u : 0u)) {
    *overflow = true;
    return true;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return true;
}
/* Python float(s); false where it raises ValueError */
bool jj_py_float_of_str(const jv *s, double *out) {
  size_t a, b;
  trim_span(s, &a, &b);
  const char *p = s->u.s.s;
  size_t st = a;
  if (a < b && (p[a] == '+' || p[a] == '-')) a++;
  char w[16];
  size_t wl = b - a < 15 ? b - a : 15;
  for (size_t i = 0; i < wl; i++) w[i] = (char)(p[a + i] | 0x20);
  w[wl] = 0;
  bool neg = st < a && p[st] == '-';
  if (b - a == wl && (!strcmp(w, "inf") || !strcmp(w, "infinity"))) return *out = neg ? -INFINITY : INFINITY, true;
  if (b - a == wl && !strcmp(w, "nan")) return *out = NAN, true;
  size_t i = scan_digits(p, a, b, 10, false), int_end = i;
  bool digits = i > a;
  if (i < b && p[i] == '.') {
    size_t j = scan_digits(p, i + 1, b, 10, false);
    digits = digits || j > i + 1;
    i = j;
  }
  if (!digits) return false;
  (void)int_end;
  if (i < b && (p[i] | 0x20) == 'e') {
    size_t j = i + 1;
    if (j < b && (p[j] == '+' || p[j] == '-')) j++;
    size_t k = scan_digits(p, j, b, 10, false);
    if (k == j) return false;
    i = k;
  }
  if (i != b) return false;
  char buf[400];
  size_t m = 0;
  for (size_t k = st; k < b && m < sizeof buf - 1; k++)
    if (p[k] != '_') buf[m++] = p[k];
  buf[m] = 0;
  *out = strtod(buf, NULL);
  return true;
}

/* ---------------- printf-style % and str.format ---------------- */
/* pad s to width code points; align '<', '>' or '^' */
static void put_padded(sm_buf *b, const char *s, size_t n, int64_t width, char align, const char *fill, size_t filln) {
  int64_t pad = width - (int64_t)jj_cp_count(s, n);
  int64_t left = pad <= 0 ? 0 : align == '>' ? pad : align == '^' ? pad / 2 : 0, right = pad <= 0 ? 0 : pad - left;
  for (int64_t i = 0; i < left; i++) sm_buf_put(b, fill, filln);
  sm_buf_put(b, s, n);
  for (int64_t i = 0; i < right; i++) sm_buf_put(b, fill, filln);
}
/* one conversion of a number with C printf (flags, width, precision, conversion) */
static void put_num(jj_rt *r, sm_buf *b, const char *flags, int64_t width, int64_t prec, char conv, jv *x) {
  if (x->t == V_UNDEF) jj_undef_fail(r, x);
  bool isnum = x->t == V_INT || x->t == V_BOOL || x->t == V_FLOAT;
  if (!isnum) jj_fail(r, "TypeError: %%%c format: a real number is required, not %s", conv, jj_tname(x));
  char f[48], out[512];
  if (width > 200 || prec > 100) jj_fail(r, "format width or precision too large");
  if (strchr("diouxX", conv)) {
    if (x->t == V_FLOAT && conv != 'd' && conv != 'i' && conv != 'u')
      jj_fail(r, "TypeError: %%%c format: an integer is required, not float", conv);
    double d = jj_num_of(x);
    int64_t i = x->t == V_FLOAT ? (int64_t)trunc(d) : x->t == V_BOOL ? x->u.b : x->u.i;
    char c = conv == 'u' || conv == 'i' ? 'd' : conv;
    if (prec < 0) {
      snprintf(f, sizeof f, "%%%s*ll%c", flags, c);
      snprintf(out, sizeof out, f, (int)width, (long long)i);
    } else {
      snprintf(f, sizeof f, "%%%s*.*ll%c", flags, c);
      snprintf(out, sizeof out, f, (int)width, (int)prec, (long long)i);
    }
  } else {
    double d = jj_num_of(x);
    snprintf(f, sizeof f, "%%%s*.*%c", flags, conv);
    snprintf(out, sizeof out, f, (int)width, (int)(prec < 0 ? 6 : prec), d);
  }
  sm_buf_puts(b, out);
}

jv *jj_py_percent(jj_rt *r, jv *fmt, jv *arg) {
  jv *items = arg->t == V_LIST && arg->tuple ? arg : NULL;
  size_t next = 0, n = fmt->u.s.n;
  const char *s = fmt->u.s.s;
  bool used_map = false;
  sm_buf *b = jj_buf(r);
  for (size_t i = 0; i < n;) {
    if (s[i] != '%') {
      sm_buf_putc(b, s[i++]);
      continue;
    }
    i++;
    jv *x = NULL;
    if (i < n && s[i] == '(') {
      size_t e = i + 1;
      while (e < n && s[e] != ')') e++;
      if (e >= n) jj_fail(r, "ValueError: incomplete format key");
      if (arg->t != V_DICT) jj_fail(r, "TypeError: format requires a mapping");
      x = jj_dict_get(arg->u.d, s + i + 1, e - i - 1);
      if (!x) jj_fail(r, "KeyError: '%.*s'", (int)(e - i - 1), s + i + 1);
      used_map = true;
      i = e + 1;
    }
    char flags[8];
    int nf = 0;
    while (i < n && strchr("-+ #0", s[i]) && nf < 7) flags[nf++] = s[i++];
    flags[nf] = 0;
    int64_t width = 0, prec = -1;
    while (i < n && s[i] >= '0' && s[i] <= '9') width = width * 10 + (s[i++] - '0');
    if (i < n && s[i] == '.') {
      prec = 0, i++;
      while (i < n && s[i] >= '0' && s[i] <= '9') prec = prec * 10 + (s[i++] - '0');
    }
    if (i >= n) jj_fail(r, "ValueError: incomplete format");
    char conv = s[i++];
    if (conv == '%') {
      sm_buf_putc(b, '%');
      continue;
    }
    if (!x) {
      if (items) {
        if (next >= items->u.l->n) jj_fail(r, "TypeError: not enough arguments for format string");
        x = items->u.l->v[next++];
      } else {
        if (next++) jj_fail(r, "TypeError: not enough arguments for format string");
        x = arg;
      }
    }
    if (conv == 's' || conv == 'r' || conv == 'a') {
      sm_buf *t = jj_buf(r);
      if (conv == 's') jj_to_str(r, t, x);
      else jj_repr(r, t, x);
      jv *tv = jj_buf_value(r, t);
      size_t len = tv->u.s.n;
      if (prec >= 0) { /* precision counts code points */
        size_t p = 0;
        for (int64_t k = 0; k < prec && p < len; k++) p += jj_utf8_next(tv->u.s.s, len, p, NULL);
        len = p;
      }
      put_padded(b, tv->u.s.s, len, width, strchr(flags, '-') ? '<' : '>', " ", 1);
    } else if (strchr("diouxXeEfFgG", conv)) put_num(r, b, flags, width, prec, conv, x);
    else if (conv == 'c' && x->t == V_STR && jj_cp_count(x->u.s.s, x->u.s.n) == 1) sm_buf_put(b, x->u.s.s, x->u.s.n);
    else if (conv == 'c' && x->t == V_INT && x->u.i >= 0 && x->u.i < 0x110000) sm_buf_put_cp(b, (uint32_t)x->u.i);
    else jj_fail(r, "ValueError: unsupported format character '%c'", conv);
  }
  if (!used_map && ((items && next < items->u.l->n) || (!items && !next && arg->t != V_DICT)))
    jj_fail(r, "TypeError: not all arguments converted during string formatting");
  return jj_buf_value(r, b);
}

/* str.format(): {} {0} {name}, !s / !r, and a format spec [[fill]align][sign][0][width][.precision][type] */
jv *jj_py_format(jj_rt *r, jv *fmt, jv *args, jv *kwargs) {
  const char *s = fmt->u.s.s;
  size_t n = fmt->u.s.n, autoi = 0;
  sm_buf *b = jj_buf(r);
  for (size_t i = 0; i < n;) {
    char c = s[i];
    if (c == '}') {
      if (i + 1 < n && s[i + 1] == '}') {
        sm_buf_putc(b, '}');
        i += 2;
        continue;
      }
      jj_fail(r, "ValueError: Single '}' encountered in format string");
    }
    if (c != '{') {
      sm_buf_putc(b, c);
      i++;
      continue;
    }
    if (i + 1 < n && s[i + 1] == '{') {
      sm_buf_putc(b, '{');
      i += 2;
      continue;
    }
    size_t e = i + 1;
    while (e < n && s[e] != '}' && s[e] != '!' && s[e] != ':') e++;
    jstr field = {s + i + 1, e - i - 1};
    char conv = 0;
    if (e < n && s[e] == '!') conv = e + 1 < n ? s[e + 1] : 0, e += 2;
    jstr spec = {"", 0};
    if (e < n && s[e] == ':') {
      size_t st = ++e;
      while (e < n && s[e] != '}') e++;
      spec.s = s + st, spec.n = e - st;
    }
    if (e >= n) jj_fail(r, "ValueError: expected '}' before end of string");
    i = e + 1;
    jv *x;
    bool digits = field.n > 0;
    for (size_t k = 0; k < field.n; k++) digits = digits && field.s[k] >= '0' && field.s[k] <= '9';
    if (!field.n || digits) {
      size_t k = field.n ? (size_t)strtoul(field.s, NULL, 10) : autoi++;
      if (k >= jj_nargs(args))
        jj_fail(r, "IndexError: Replacement index %zu out of range for positional args tuple", k);
      x = args->u.l->v[k];
    } else {
      x = kwargs ? jj_dict_get(kwargs->u.d, field.s, field.n) : NULL;
      if (!x) jj_fail(r, "KeyError: '%.*s'", (int)field.n, field.s);
    }
    if (conv == 'r' || conv == 's' || conv == 'a') {
      sm_buf *t = jj_buf(r);
      if (conv == 's') jj_to_str(r, t, x);
      else jj_repr(r, t, x);
      x = jj_buf_value(r, t);
    } else if (conv) jj_fail(r, "ValueError: Unknown conversion specifier %c", conv);
    /* the spec */
    const char *p = spec.s, *pe = spec.s + spec.n;
    char fill[5] = " ", align = 0, sign = 0, type = 0;
    size_t filln = 1;
    if (p < pe) {
      size_t l = jj_utf8_next(p, (size_t)(pe - p), 0, NULL);
      if (p + l < pe && strchr("<>^=", p[l])) memcpy(fill, p, l), filln = l, align = p[l], p += l + 1;
      else if (strchr("<>^=", *p)) align = *p++;
    }
    if (p < pe && strchr("+- ", *p)) sign = *p++;
    bool zero = p < pe && *p == '0';
    if (zero) p++;
    int64_t width = 0, prec = -1;
    while (p < pe && *p >= '0' && *p <= '9') width = width * 10 + (*p++ - '0');
    char group = p < pe && (*p == ',' || *p == '_') ? *p++ : 0;
    if (p < pe && *p == '.') {
      prec = 0, p++;
      while (p < pe && *p >= '0' && *p <= '9') prec = prec * 10 + (*p++ - '0');
    }
    if (p < pe) type = *p++;
    if (group && (x->t == V_FLOAT || x->t == V_STR || (type && type != 'd')))
      jj_fail(r, "ValueError: thousands separators are supported for integers only here");
    if (p != pe || width > 200 || prec > 100) jj_fail(r, "ValueError: Invalid format specifier");
    sm_buf *t = jj_buf(r);
    if (x->t == V_STR || (!type && x->t != V_INT && x->t != V_FLOAT) || type == 's') {
      if (type && type != 's')
        jj_fail(r, "ValueError: Unknown format code '%c' for object of type '%s'", type, jj_tname(x));
      if (x->t != V_STR && spec.n)
        jj_fail(r, "TypeError: unsupported format string passed to %s.__format__", jj_tname(x));
      jj_to_str(r, t, x);
      jv *tv = jj_buf_value(r, t);
      size_t len = tv->u.s.n;
      if (prec >= 0) {
        size_t q = 0;
        for (int64_t k = 0; k < prec && q < len; k++) q += jj_utf8_next(tv->u.s.s, len, q, NULL);
        len = q;
      }
      put_padded(b, tv->u.s.s, len, width, align ? align : '<', fill, filln);
      continue;
    }
    char flags[4] = {0};
    if (sign == '+' || sign == ' ') flags[0] = sign;
    if (!type) {
      if (x->t == V_FLOAT && prec < 0) jj_to_str(r, t, x);
      else put_num(r, t, flags, 0, prec, x->t == V_FLOAT ? 'g' : 'd', x);
    } else if (strchr("dxXobeEfFgG%", type)) {
      if (type == '%') {
        jv pc = {.t = V_FLOAT, .u.f = jj_num_of(x) * 100};
        put_num(r, t, flags, 0, prec, 'f', &pc);
        sm_buf_putc(t, '%');
      } else if (type == 'b') {
        int64_t v = x->t == V_BOOL ? x->u.b : x->u.i;
        if (x->t == V_FLOAT) jj_fail(r, "ValueError: Unknown format code 'b' for object of type 'float'");
        char bits[72];
        int k = 71;
        bits[k] = 0;
        uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
        do bits[--k] = (char)('0' + (u & 1)), u >>= 1;
        while (u);
        if (v < 0) sm_buf_putc(t, '-');
        sm_buf_puts(t, bits + k);
      } else put_num(r, t, flags, 0, prec, type, x);
    } else jj_fail(r, "ValueError: Unknown format code '%c' for object of type '%s'", type, jj_tname(x));
    jv *tv = jj_buf_value(r, t);
    if (group) { /* 1,234,567 */
      size_t sg = tv->u.s.n && tv->u.s.s[0] == '-' ? 1 : 0, nd = tv->u.s.n - sg;
      sm_buf *g = jj_buf(r);
      sm_buf_put(g, tv->u.s.s, sg);
      for (size_t k = 0; k < nd; k++) {
        if (k && (nd - k) % 3 == 0) sm_buf_putc(g, group);
        sm_buf_putc(g, tv->u.s.s[sg + k]);
      }
      tv = jj_buf_value(r, g);
    }
    if (zero && !align) { /* sign-aware zero padding */
      size_t sg = tv->u.s.n && strchr("+- ", tv->u.s.s[0]) ? 1 : 0;
      sm_buf_put(b, tv->u.s.s, sg);
      for (int64_t k = (int64_t)tv->u.s.n; k < width; k++) sm_buf_putc(b, '0');
      sm_buf_put(b, tv->u.s.s + sg, tv->u.s.n - sg);
    } else put_padded(b, tv->u.s.s, tv->u.s.n, width, align ? align : '>', fill, filln);
  }
  return jj_buf_value(r, b);
}
