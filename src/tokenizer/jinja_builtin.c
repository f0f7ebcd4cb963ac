/* Chat-template builtins: string helpers, tests (`is ...`), filters (`|...`), global functions
 * (range, namespace, raise_exception, strftime_now) and the methods of strings and dicts.
 * Semantics follow @huggingface/jinja's runtime.ts, with Python-Jinja extensions (see jinja_int.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>
#include "tokenizer/jinja_rt.h"

/* ---------------- unicode helpers ---------------- */
size_t jj_cp_count(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n;) i += jj_utf8_next(s, n, i, NULL), c++;
  return c;
}
jv *jj_case_map(jj_rt *r, const jv *v, int mode /* 0 lower, 1 upper */) {
  sm_buf *b = jj_buf(r);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n;
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t l = jj_utf8_next(s, n, i, &cp);
    int32_t m = mode ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
    if (m == cp || cp < 0) sm_buf_put(b, s + i, l);
    else {
      utf8proc_uint8_t o[4];
      utf8proc_ssize_t ol = utf8proc_encode_char(m, o);
      sm_buf_put(b, (const char *)o, (size_t)ol);
    }
    i += l;
  }
  return jj_buf_value(r, b);
}
static bool cp_in_set(int32_t cp, const char *set, size_t n) {
  for (size_t i = 0; i < n;) {
    int32_t c;
    i += jj_utf8_next(set, n, i, &c);
    if (c == cp) return true;
  }
  return false;
}
/* strip: which bit0 = left, bit1 = right; chars NULL = JS whitespace */
static jv *jj_strip(jj_rt *r, const jv *v, int which, const jv *chars) {
  const char *s = v->u.s.s;
  size_t n = v->u.s.n, st = 0, en = n;
  for (;;) {
    if (!(which & 1) || st >= en) break;
    int32_t cp;
    size_t l = jj_utf8_next(s, n, st, &cp);
    bool sp = chars ? cp_in_set(cp, chars->u.s.s, chars->u.s.n) : jj_is_space_at(s, n, st, NULL);
    if (!sp) break;
    st += l;
  }
  while ((which & 2) && en > st) {
    size_t p = en - 1;
    while (p > st && ((unsigned char)s[p] & 0xc0) == 0x80) p--;
    int32_t cp;
    size_t l = jj_utf8_next(s, n, p, &cp);
    if (p + l != en) break;
    bool sp = chars ? cp_in_set(cp, chars->u.s.s, chars->u.s.n) : jj_is_space_at(s, n, p, NULL);
    if (!sp) break;
    en = p;
  }
  jstr o = {s + st, en - st};
  return jj_jstr(r, o);
}
static bool ascii_word(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static jv *title_case(jj_rt *r, const jv *v) { /* JS: value.replace(/\b\w/g, c => c.toUpperCase()) */
  jv *o = jj_strn(r, v->u.s.s, v->u.s.n);
  char *p = (char *)o->u.s.s;
  for (size_t i = 0; i < o->u.s.n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (ascii_word(c) && (i == 0 || !ascii_word((unsigned char)v->u.s.s[i - 1])) && c >= 'a' && c <= 'z')
      p[i] = (char)(c - 32);
  }
  return o;
}
static jv *capitalize(jj_rt *r, const jv *v) {
  if (!v->u.s.n) return (jv *)v;
  int32_t cp;
  size_t l = jj_utf8_next(v->u.s.s, v->u.s.n, 0, &cp);
  jv first = {.t = V_STR};
  first.u.s.s = v->u.s.s;
  first.u.s.n = l;
  jv *u = jj_case_map(r, &first, 1);
  sm_buf *b = jj_buf(r);
  sm_buf_put(b, u->u.s.s, u->u.s.n);
  sm_buf_put(b, v->u.s.s + l, v->u.s.n - l);
  return jj_buf_value(r, b);
}
const char *jj_memmem(const char *h, size_t hn, const char *n, size_t nn) {
  if (!nn) return h;
  if (nn > hn) return NULL;
  for (size_t i = 0; i + nn <= hn; i++)
    if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
  return NULL;
}
static jv *str_replace(jj_rt *r, const jv *v, const jv *old, const jv *new_, int64_t count) {
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

jv *jj_builtin_member(jj_rt *r, jv *obj, jstr name) {
  if (obj->t == V_STR) {
    static const struct {
      const char *n;
      jj_funckind k;
    } M[] = {{"upper", M_STR_UPPER},         {"lower", M_STR_LOWER},       {"strip", M_STR_STRIP},
             {"lstrip", M_STR_LSTRIP},       {"rstrip", M_STR_RSTRIP},     {"title", M_STR_TITLE},
             {"capitalize", M_STR_CAPITALIZE}, {"startswith", M_STR_STARTSWITH}, {"endswith", M_STR_ENDSWITH},
             {"split", M_STR_SPLIT},         {"replace", M_STR_REPLACE},   {"find", M_STR_FIND},
             {"count", M_STR_COUNT},         {"join", M_STR_JOIN},         {"isdigit", M_STR_ISDIGIT},
             {"isalpha", M_STR_ISALPHA},     {"isspace", M_STR_ISSPACE}};
    if (jj_eqs(name, "length")) return jj_int(r, (int64_t)jj_cp_count(obj->u.s.s, obj->u.s.n));
    for (size_t i = 0; i < sizeof M / sizeof M[0]; i++)
      if (jj_eqs(name, M[i].n)) return jj_func_new(r, M[i].k, obj);
    return NULL;
  }
  if (obj->t == V_LIST) {
    if (jj_eqs(name, "length")) return jj_int(r, (int64_t)obj->u.l->n);
    return NULL;
  }
  if (obj->t == V_DICT) {
    if (jj_eqs(name, "get")) return jj_func_new(r, M_DICT_GET, obj);
    if (jj_eqs(name, "items")) return jj_func_new(r, M_DICT_ITEMS, obj);
    if (jj_eqs(name, "keys")) return jj_func_new(r, M_DICT_KEYS, obj);
    if (jj_eqs(name, "values")) return jj_func_new(r, M_DICT_VALUES, obj);
    if (jj_eqs(name, "dictsort")) return jj_func_new(r, M_DICT_DICTSORT, obj);
  }
  return NULL;
}

/* ---------------- tests ---------------- */
bool jj_test(jj_rt *r, jstr name, jv *v, jv *args, int na) {
  jv *a0 = na > 0 ? args->u.l->v[0] : NULL;
#define T(s) jj_eqs(name, s)
  if (T("boolean")) return v->t == V_BOOL;
  if (T("callable")) return v->t == V_FUNC;
  if (T("odd") || T("even")) {
    if (v->t != V_INT) jj_fail(r, "cannot %.*s on %s", (int)name.n, name.s, jj_tname(v));
    return T("odd") ? (v->u.i % 2 != 0) : (v->u.i % 2 == 0);
  }
  if (T("false")) return v->t == V_BOOL && !v->u.b;
  if (T("true")) return v->t == V_BOOL && v->u.b;
  if (T("none")) return v->t == V_NONE;
  if (T("string")) return v->t == V_STR;
  if (T("number")) return jj_is_num(v);
  if (T("integer")) return v->t == V_INT;
  if (T("float")) return v->t == V_FLOAT;
  if (T("iterable")) return v->t == V_LIST || v->t == V_STR;
  if (T("mapping")) return v->t == V_DICT;
  if (T("sequence")) return v->t == V_LIST || v->t == V_DICT || v->t == V_STR;
  if (T("lower")) return v->t == V_STR && jj_strict_eq(v, jj_case_map(r, v, 0));
  if (T("upper")) return v->t == V_STR && jj_strict_eq(v, jj_case_map(r, v, 1));
  if (T("defined")) return v->t != V_UNDEF;
  if (T("undefined")) return v->t == V_UNDEF;
  if (T("equalto") || T("eq") || T("==") || T("sameas")) return a0 ? jj_strict_eq(v, a0) : v->t == V_UNDEF;
  if (T("ne") || T("!=")) return a0 ? !jj_strict_eq(v, a0) : v->t != V_UNDEF;
  if (T("in")) {
    if (!a0) jj_fail(r, "test 'in' requires an argument");
    if (a0->t == V_LIST) {
      for (size_t i = 0; i < a0->u.l->n; i++)
        if (jj_strict_eq(a0->u.l->v[i], v)) return true;
      return false;
    }
    if (a0->t == V_STR && v->t == V_STR) return jj_memmem(a0->u.s.s, a0->u.s.n, v->u.s.s, v->u.s.n) != NULL;
    if (a0->t == V_DICT && v->t == V_STR) return jj_dict_get(a0->u.d, v->u.s.s, v->u.s.n) != NULL;
    jj_fail(r, "test 'in': unsupported operand types %s and %s", jj_tname(v), jj_tname(a0));
  }
  if (T("divisibleby")) {
    if (!a0 || v->t != V_INT || a0->t != V_INT || a0->u.i == 0) jj_fail(r, "divisibleby requires integers");
    return v->u.i % a0->u.i == 0;
  }
  if (T("gt") || T(">") || T("greaterthan") || T("lt") || T("<") || T("lessthan") || T("ge") || T(">=") || T("le") || T("<=")) {
    if (!a0) jj_fail(r, "comparison test requires an argument");
    int c = jj_compare(r, v, a0, true);
    if (T("gt") || T(">") || T("greaterthan")) return c > 0;
    if (T("lt") || T("<") || T("lessthan")) return c < 0;
    if (T("ge") || T(">=")) return c >= 0;
    return c <= 0;
  }
#undef T
  jj_fail(r, "Unknown test: %.*s", (int)name.n, name.s);
}

/* ---------------- filters ---------------- */
static jv *int_from_str(jj_rt *r, jv *s, jv *dflt) { /* JS parseInt(s, 10) */
  const char *p = s->u.s.s;
  size_t n = s->u.s.n, i = 0, l;
  while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
  bool neg = false;
  if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i] == '-', i++;
  if (i >= n || p[i] < '0' || p[i] > '9') return dflt;
  double v = 0;
  while (i < n && p[i] >= '0' && p[i] <= '9') v = v * 10 + (p[i++] - '0');
  if (v > 9.2e18) return jj_float(r, neg ? -v : v);
  return jj_int(r, neg ? -(int64_t)v : (int64_t)v);
}
static jv *float_from_str(jj_rt *r, jv *s, jv *dflt) { /* JS parseFloat */
  const char *p = s->u.s.s;
  size_t n = s->u.s.n, i = 0, l;
  while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
  size_t st = i;
  if (i < n && (p[i] == '+' || p[i] == '-')) i++;
  if (n - i >= 8 && !memcmp(p + i, "Infinity", 8)) return jj_float(r, p[st] == '-' ? -INFINITY : INFINITY);
  size_t dg = 0;
  while (i < n && p[i] >= '0' && p[i] <= '9') i++, dg++;
  if (i < n && p[i] == '.') {
    i++;
    while (i < n && p[i] >= '0' && p[i] <= '9') i++, dg++;
  }
  if (!dg) return dflt;
  if (i < n && (p[i] == 'e' || p[i] == 'E')) {
    size_t j = i + 1;
    if (j < n && (p[j] == '+' || p[j] == '-')) j++;
    if (j < n && p[j] >= '0' && p[j] <= '9') {
      while (j < n && p[j] >= '0' && p[j] <= '9') j++;
      i = j;
    }
  }
  char buf[128];
  size_t m = i - st < 127 ? i - st : 127;
  memcpy(buf, p + st, m);
  buf[m] = 0;
  return jj_float(r, strtod(buf, NULL));
}

static jv *indent_str(jj_rt *r, jv *s, jv *width, bool first, bool blank) {
  sm_buf *ind = jj_buf(r);
  if (width->t == V_STR) sm_buf_put(ind, width->u.s.s, width->u.s.n);
  else if (width->t == V_INT) {
    if (width->u.i > 1000) jj_fail(r, "indent width too large");
    for (int64_t i = 0; i < width->u.i; i++) sm_buf_putc(ind, ' ');
  } else
    jj_fail(r, "width must be a number");
  sm_buf *b = jj_buf(r);
  const char *p = s->u.s.s;
  size_t n = s->u.s.n, st = 0;
  int line = 0;
  for (;;) {
    const char *nl = memchr(p + st, '\n', n - st);
    size_t en = nl ? (size_t)(nl - p) : n;
    if (line) sm_buf_putc(b, '\n');
    bool skip = (!first && line == 0) || (!blank && en == st);
    if (!skip) sm_buf_put(b, ind->p ? ind->p : "", ind->n);
    sm_buf_put(b, p + st, en - st);
    if (!nl) break;
    st = en + 1;
    line++;
  }
  return jj_buf_value(r, b);
}

static jv *html_escape(jj_rt *r, jv *v) {
  jv *s = jj_str_of(r, v, false);
  sm_buf *b = jj_buf(r);
  for (size_t i = 0; i < s->u.s.n; i++) {
    char c = s->u.s.s[i];
    switch (c) {
      case '&': sm_buf_puts(b, "&amp;"); break;
      case '<': sm_buf_puts(b, "&lt;"); break;
      case '>': sm_buf_puts(b, "&gt;"); break;
      case '"': sm_buf_puts(b, "&#34;"); break;
      case '\'': sm_buf_puts(b, "&#39;"); break;
      default: sm_buf_putc(b, c);
    }
  }
  return jj_buf_value(r, b);
}

static jv *bool_arg(jj_rt *r, jv *v, const char *what) {
  if (v && v->t != V_BOOL) jj_fail(r, "%s must be a boolean", what);
  return v;
}

static jv *do_tojson(jj_rt *r, jv *v, jv *kwargs) {
  json_opts o = {0};
  o.undef_null = true;
  jv *ind = kwargs ? jj_dict_get(kwargs->u.d, "indent", 6) : NULL;
  if (ind && ind->t != V_INT && ind->t != V_NONE) jj_fail(r, "If set, indent must be a number");
  if (ind && ind->t == V_INT) {
    if (ind->u.i > 64) jj_fail(r, "indent too large");
    o.indent = ind->u.i > 0 ? (int)ind->u.i : 0;
  }
  jv *ea = bool_arg(r, kwargs ? jj_dict_get(kwargs->u.d, "ensure_ascii", 12) : NULL, "If set, ensure_ascii");
  jv *sk = bool_arg(r, kwargs ? jj_dict_get(kwargs->u.d, "sort_keys", 9) : NULL, "If set, sort_keys");
  o.ensure_ascii = ea && ea->u.b;
  o.sort_keys = sk && sk->u.b;
  jv *sep = kwargs ? jj_dict_get(kwargs->u.d, "separators", 10) : NULL;
  if (sep && sep->t == V_LIST) {
    if (sep->u.l->n != 2 || sep->u.l->v[0]->t != V_STR || sep->u.l->v[1]->t != V_STR)
      jj_fail(r, "separators must be a tuple of two strings");
    o.item_sep = sep->u.l->v[0]->u.s.s;
    o.key_sep = sep->u.l->v[1]->u.s.s;
  } else if (sep && sep->t != V_NONE)
    jj_fail(r, "If set, separators must be a tuple of two strings");
  sm_buf *b = jj_buf(r);
  jj_to_json(r, b, v, &o, 0);
  return jj_buf_value(r, b);
}

jv *jj_filter(jj_rt *r, jv *v, jstr name, jv *args, jv *kwargs, jj_env *env) {
#define F(s) jj_eqs(name, s)
  size_t na = jj_nargs(args);
  if (F("safe")) return v;
  if (F("tojson")) return do_tojson(r, v, kwargs);
  if (F("default") || F("d")) {
    jv *dv = jj_arg(args, kwargs, 0, "default_value");
    if (!dv) dv = jj_strn(r, "", 0);
    jv *bo = bool_arg(r, jj_arg(args, kwargs, 1, "boolean"), "`default` filter flag");
    if (v->t == V_UNDEF || (bo && bo->u.b && !jj_truthy(v))) return dv;
    return v;
  }
  if (F("join")) {
    jv *l;
    if (v->t == V_STR) l = jj_chars_of(r, v);
    else if (v->t == V_LIST) l = v;
    else jj_fail(r, "Cannot apply filter \"join\" to type: %s", jj_tname(v));
    jv *sep = jj_arg(args, kwargs, 0, "d");
    if (!sep && kwargs) sep = jj_dict_get(kwargs->u.d, "separator", 9);
    if (sep && sep->t != V_STR) jj_fail(r, "separator must be a string");
    jv *attr = kwargs ? jj_dict_get(kwargs->u.d, "attribute", 9) : NULL;
    sm_buf *b = jj_buf(r);
    for (size_t i = 0; i < l->u.l->n; i++) {
      if (i && sep) sm_buf_put(b, sep->u.s.s, sep->u.s.n);
      jv *x = l->u.l->v[i];
      if (attr && attr->t == V_STR) x = jj_attr_path(r, x, attr->u.s.s, attr->u.s.n);
      jj_raw_str(r, b, x);
    }
    return jj_buf_value(r, b);
  }
  if (F("int") || F("float")) {
    bool isint = F("int");
    jv *dflt = jj_arg(args, kwargs, 0, "default");
    if (!dflt) dflt = isint ? jj_int(r, 0) : jj_float(r, 0);
    if (v->t == V_STR) return isint ? int_from_str(r, v, dflt) : float_from_str(r, v, dflt);
    if (v->t == V_INT) return isint ? v : jj_float(r, (double)v->u.i);
    if (v->t == V_FLOAT) {
      if (!isint) return v;
      double f = floor(v->u.f);
      if (!isfinite(f) || fabs(f) > 9.2e18) return dflt;
      return jj_int(r, (int64_t)f);
    }
    if (v->t == V_BOOL) return isint ? jj_int(r, v->u.b) : jj_float(r, v->u.b);
    jj_fail(r, "Cannot apply filter \"%.*s\" to type: %s", (int)name.n, name.s, jj_tname(v));
  }
  if (F("string")) {
    if (v->t == V_NONE) return jj_cstr(r, "None");
    return jj_str_of(r, v, false);
  }
  if (F("e") || F("escape")) return html_escape(r, v);
  if (F("length") || F("count")) {
    if (v->t == V_LIST) return jj_int(r, (int64_t)v->u.l->n);
    if (v->t == V_STR) return jj_int(r, (int64_t)jj_cp_count(v->u.s.s, v->u.s.n));
    if (v->t == V_DICT) return jj_int(r, (int64_t)v->u.d->n);
    jj_fail(r, "Cannot apply filter \"%.*s\" to type: %s", (int)name.n, name.s, jj_tname(v));
  }
  if (v->t == V_STR) {
    if (F("upper")) return jj_case_map(r, v, 1);
    if (F("lower")) return jj_case_map(r, v, 0);
    if (F("title")) return title_case(r, v);
    if (F("capitalize")) return capitalize(r, v);
    if (F("trim")) {
      jv *chars = jj_arg(args, kwargs, 0, "chars");
      if (chars && chars->t != V_STR) chars = NULL;
      return jj_strip(r, v, 3, chars);
    }
    if (F("indent")) {
      jv *w = jj_arg(args, kwargs, 0, "width");
      jv *first = jj_arg(args, kwargs, 1, "first"), *blank = jj_arg(args, kwargs, 2, "blank");
      return indent_str(r, v, w ? w : jj_int(r, 4), first && jj_truthy(first), blank && jj_truthy(blank));
    }
    if (F("replace")) {
      jv *o = jj_arg(args, kwargs, 0, "old"), *nw = jj_arg(args, kwargs, 1, "new"), *c = jj_arg(args, kwargs, 2, "count");
      if (!o || !nw) jj_fail(r, "replace() requires at least two arguments");
      if (o->t != V_STR || nw->t != V_STR) jj_fail(r, "replace() arguments must be strings");
      if (c && c->t != V_INT && c->t != V_NONE) jj_fail(r, "replace() count argument must be a number or null");
      return str_replace(r, v, o, nw, c && c->t == V_INT ? c->u.i : -1);
    }
    if (F("list")) return jj_chars_of(r, v);
    if (F("first") || F("last") || F("reverse") || F("wordcount")) {
      jv *l = jj_chars_of(r, v);
      if (F("first")) return l->u.l->n ? l->u.l->v[0] : r->undef;
      if (F("last")) return l->u.l->n ? l->u.l->v[l->u.l->n - 1] : r->undef;
      if (F("wordcount")) {
        int64_t c = 0;
        bool inw = false;
        for (size_t i = 0; i < v->u.s.n; i++) {
          bool w = ascii_word((unsigned char)v->u.s.s[i]) || ((unsigned char)v->u.s.s[i] & 0x80);
          if (w && !inw) c++;
          inw = w;
        }
        return jj_int(r, c);
      }
      sm_buf *b = jj_buf(r);
      for (size_t i = l->u.l->n; i-- > 0;) sm_buf_put(b, l->u.l->v[i]->u.s.s, l->u.l->v[i]->u.s.n);
      return jj_buf_value(r, b);
    }
    if (F("striptags")) return jj_strip(r, v, 3, NULL);
  }
  if (v->t == V_LIST) {
    jj_list *L = v->u.l;
    if (F("list")) return v;
    if (F("first")) return L->n ? L->v[0] : r->undef;
    if (F("last")) return L->n ? L->v[L->n - 1] : r->undef;
    if (F("reverse")) {
      jv *o = jj_list_new(r);
      for (size_t i = L->n; i-- > 0;) jj_list_push(r, o, L->v[i]);
      return o;
    }
    if (F("sort")) {
      jv *rev = bool_arg(r, jj_arg(args, kwargs, 0, "reverse"), "reverse");
      jv *cs = bool_arg(r, jj_arg(args, kwargs, 1, "case_sensitive"), "case_sensitive");
      jv *attr = jj_arg(args, kwargs, 2, "attribute");
      if (attr && attr->t == V_INT) attr = jj_str_of(r, attr, false);
      if (attr && attr->t != V_STR && attr->t != V_NONE) jj_fail(r, "attribute must be a string, integer, or null");
      return jj_sorted(r, v, rev && rev->u.b, cs && cs->u.b, attr && attr->t == V_STR ? attr : NULL);
    }
    if (F("unique")) {
      jv *o = jj_list_new(r);
      for (size_t i = 0; i < L->n; i++) {
        bool seen = false;
        for (size_t j = 0; j < o->u.l->n && !seen; j++) seen = jj_strict_eq(o->u.l->v[j], L->v[i]);
        if (!seen) jj_list_push(r, o, L->v[i]);
      }
      return o;
    }
    if (F("min") || F("max")) {
      if (!L->n) return r->undef;
      jv *best = L->v[0];
      for (size_t i = 1; i < L->n; i++) {
        int c = jj_compare(r, L->v[i], best, false);
        if (F("min") ? c < 0 : c > 0) best = L->v[i];
      }
      return best;
    }
    if (F("sum")) {
      jv *attr = jj_arg(args, kwargs, 0, "attribute");
      jv *acc = jj_arg(args, kwargs, 1, "start");
      if (!acc) acc = jj_int(r, 0);
      for (size_t i = 0; i < L->n; i++) {
        jv *x = attr && attr->t == V_STR ? jj_attr_path(r, L->v[i], attr->u.s.s, attr->u.s.n) : L->v[i];
        if (!jj_is_num(x) || !jj_is_num(acc)) jj_fail(r, "sum: values must be numbers");
        if (acc->t == V_INT && x->t == V_INT) acc = jj_arith_int(r, OP_ADD, acc->u.i, x->u.i);
        else acc = jj_float(r, jj_num_of(acc) + jj_num_of(x));
      }
      return acc;
    }
    if (F("batch")) {
      jv *sz = jj_arg(args, kwargs, 0, "linecount"), *fill = jj_arg(args, kwargs, 1, "fill_with");
      if (!sz || sz->t != V_INT || sz->u.i <= 0) jj_fail(r, "batch requires a positive integer size");
      jv *o = jj_list_new(r), *cur = NULL;
      for (size_t i = 0; i < L->n; i++) {
        if (!cur || (int64_t)cur->u.l->n == sz->u.i) {
          cur = jj_list_new(r);
          jj_list_push(r, o, cur);
        }
        jj_list_push(r, cur, L->v[i]);
      }
      if (cur && fill && fill->t != V_NONE)
        while ((int64_t)cur->u.l->n < sz->u.i) jj_list_push(r, cur, fill);
      return o;
    }
    if (F("selectattr") || F("rejectattr")) {
      bool sel = F("selectattr");
      for (size_t i = 0; i < L->n; i++)
        if (L->v[i]->t != V_DICT && L->v[i]->t != V_NS)
          jj_fail(r, "`%.*s` can only be applied to array of objects", (int)name.n, name.s);
      if (na < 1 || args->u.l->v[0]->t != V_STR) jj_fail(r, "arguments of `%.*s` must be strings", (int)name.n, name.s);
      jv *attr = args->u.l->v[0];
      jv *test = na > 1 ? args->u.l->v[1] : NULL;
      if (test && test->t != V_STR) jj_fail(r, "arguments of `%.*s` must be strings", (int)name.n, name.s);
      jv *targs = jj_list_new(r);
      for (size_t k = 2; k < na; k++) jj_list_push(r, targs, args->u.l->v[k]);
      jv *o = jj_list_new(r);
      for (size_t i = 0; i < L->n; i++) {
        jv *a = jj_dict_get(L->v[i]->u.d, attr->u.s.s, attr->u.s.n);
        bool res = a ? (test ? jj_test(r, test->u.s, a, targs, (int)targs->u.l->n) : jj_truthy(a)) : false;
        if (res == sel) jj_list_push(r, o, L->v[i]);
      }
      return o;
    }
    if (F("select") || F("reject")) {
      bool sel = F("select");
      jv *test = na > 0 ? args->u.l->v[0] : NULL;
      if (test && test->t != V_STR) jj_fail(r, "test name must be a string");
      jv *targs = jj_list_new(r);
      for (size_t k = 1; k < na; k++) jj_list_push(r, targs, args->u.l->v[k]);
      jv *o = jj_list_new(r);
      for (size_t i = 0; i < L->n; i++) {
        bool res = test ? jj_test(r, test->u.s, L->v[i], targs, (int)targs->u.l->n) : jj_truthy(L->v[i]);
        if (res == sel) jj_list_push(r, o, L->v[i]);
      }
      return o;
    }
    if (F("map")) {
      jv *attr = kwargs ? jj_dict_get(kwargs->u.d, "attribute", 9) : NULL;
      jv *o = jj_list_new(r);
      if (attr) {
        if (attr->t == V_INT) attr = jj_str_of(r, attr, false);
        if (attr->t != V_STR) jj_fail(r, "attribute must be a string");
        jv *dflt = jj_dict_get(kwargs->u.d, "default", 7);
        for (size_t i = 0; i < L->n; i++) {
          if (L->v[i]->t != V_DICT && L->v[i]->t != V_NS) jj_fail(r, "items in map must be an object");
          jv *x = jj_attr_path(r, L->v[i], attr->u.s.s, attr->u.s.n);
          jj_list_push(r, o, x->t == V_UNDEF && dflt ? dflt : x);
        }
        return o;
      }
      if (na < 1 || args->u.l->v[0]->t != V_STR) jj_fail(r, "map requires a filter name or attribute=");
      jv *fargs = jj_list_new(r);
      for (size_t k = 1; k < na; k++) jj_list_push(r, fargs, args->u.l->v[k]);
      for (size_t i = 0; i < L->n; i++)
        jj_list_push(r, o, jj_filter(r, L->v[i], args->u.l->v[0]->u.s, fargs, NULL, env));
      return o;
    }
  }
  if (jj_is_num(v)) {
    if (F("abs")) return v->t == V_INT ? jj_int(r, v->u.i < 0 ? -v->u.i : v->u.i) : jj_float(r, fabs(v->u.f));
    if (F("round")) {
      jv *prec = jj_arg(args, kwargs, 0, "precision"), *method = jj_arg(args, kwargs, 1, "method");
      int64_t p = prec && prec->t == V_INT ? prec->u.i : 0;
      if (p > 15 || p < -15) jj_fail(r, "round: precision out of range");
      bool common = !(method && method->t == V_STR && (jj_eqs(method->u.s, "floor") || jj_eqs(method->u.s, "ceil")));
      if (v->t == V_INT && common) { /* Python round(int, n) stays an int */
        if (p >= 0) return v;
        double m = pow(10, (double)-p);
        return jj_int(r, (int64_t)(nearbyint((double)v->u.i / m) * m));
      }
      double m = pow(10, (double)p), x = jj_num_of(v) * m, res;
      if (!common && jj_eqs(method->u.s, "floor")) res = floor(x);
      else if (!common) res = ceil(x);
      else res = nearbyint(x); /* half to even, like Python's round() */
      return jj_float(r, res / m);
    }
  }
  if (v->t == V_DICT) {
    if (F("items")) return jj_dict_items(r, v);
    if (F("keys") || F("list")) return jj_dict_keys(r, v);
    if (F("values")) return jj_dict_values(r, v);
    if (F("dictsort")) return jj_call_builtin(r, jj_func_new(r, M_DICT_DICTSORT, v), args, kwargs);
  }
  if (v->t == V_BOOL && F("bool")) return v;
  jj_fail(r, "Cannot apply filter \"%.*s\" to type: %s", (int)name.n, name.s, jj_tname(v));
#undef F
}

static jv *split_str(jj_rt *r, jv *s, jv *sep, int64_t maxsplit) {
  jv *o = jj_list_new(r);
  const char *p = s->u.s.s;
  size_t n = s->u.s.n;
  if (!sep || sep->t == V_NONE) {
    size_t i = 0, l;
    while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
    while (i < n) {
      size_t st = i;
      while (i < n && !jj_is_space_at(p, n, i, &l)) i += jj_utf8_next(p, n, i, NULL);
      if (maxsplit != -1 && (int64_t)o->u.l->n >= maxsplit) {
        jstr rest = {p + st, n - st};
        jj_list_push(r, o, jj_jstr(r, rest));
        return o;
      }
      jstr w = {p + st, i - st};
      jj_list_push(r, o, jj_jstr(r, w));
      while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
    }
    return o;
  }
  if (sep->t != V_STR) jj_fail(r, "sep argument must be a string or null");
  if (!sep->u.s.n) jj_fail(r, "empty separator");
  size_t i = 0;
  for (;;) {
    const char *f = (maxsplit == -1 || (int64_t)o->u.l->n < maxsplit) ? jj_memmem(p + i, n - i, sep->u.s.s, sep->u.s.n) : NULL;
    if (!f) {
      jstr w = {p + i, n - i};
      jj_list_push(r, o, jj_jstr(r, w));
      return o;
    }
    jstr w = {p + i, (size_t)(f - (p + i))};
    jj_list_push(r, o, jj_jstr(r, w));
    i = (size_t)(f - p) + sep->u.s.n;
  }
}

jv *jj_call_builtin(jj_rt *r, jv *fnv, jv *args, jv *kwargs) {
  jj_func *fn = fnv->u.fn;
  jv *self = fn->self;
  size_t na = jj_nargs(args);
  jv *a0 = jj_arg(args, NULL, 0, NULL), *a1 = jj_arg(args, NULL, 1, NULL);
  switch (fn->kind) {
    case F_MACRO:
    case F_CALLER: break; /* jj_call */
    case F_RANGE: {
      for (size_t i = 0; i < na; i++)
        if (args->u.l->v[i]->t != V_INT) jj_fail(r, "range() arguments must be integers");
      if (na < 1 || na > 3) jj_fail(r, "range() expects 1 to 3 arguments");
      int64_t start = 0, stop, step = 1;
      if (na == 1) stop = a0->u.i;
      else start = a0->u.i, stop = a1->u.i;
      if (na == 3) step = args->u.l->v[2]->u.i;
      if (step == 0) jj_fail(r, "range() step must not be zero");
      jv *o = jj_list_new(r);
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if ((long)o->u.l->n >= JJ_MAX_RANGE) jj_fail(r, "range() too large");
        jj_list_push(r, o, jj_int(r, i));
      }
      return o;
    }
    case F_RAISE: {
      jv *m = a0 ? jj_str_of(r, a0, true) : jj_cstr(r, "");
      jj_fail(r, "%.*s", (int)(m->u.s.n > 300 ? 300 : m->u.s.n), m->u.s.s);
    }
    case F_STRFTIME: {
      if (!a0 || a0->t != V_STR) jj_fail(r, "strftime_now() expects a format string");
      if (a0->u.s.n > 200) jj_fail(r, "strftime_now(): format too long");
      time_t t = time(NULL);
      struct tm tm;
      localtime_r(&t, &tm);
      char buf[1024];
      size_t k = strftime(buf, sizeof buf, a0->u.s.s, &tm);
      return jj_strn(r, buf, k);
    }
    case F_NAMESPACE: {
      if (na > 1) jj_fail(r, "namespace expected at most 1 argument, got %zu", na);
      jv *ns = jj_dict_new(r, V_NS);
      if (na == 1) {
        if (a0->t == V_DICT)
          for (size_t i = 0; i < a0->u.d->n; i++) jj_dict_setj(r, ns->u.d, a0->u.d->k[i], a0->u.d->v[i]);
        else if (a0->t == V_LIST) {
          for (size_t i = 0; i < a0->u.l->n; i++) {
            jv *p = a0->u.l->v[i];
            if (p->t != V_LIST || p->u.l->n != 2) jj_fail(r, "namespace expected an object or an iterable of [key, value] pairs");
            if (p->u.l->v[0]->t != V_STR) jj_fail(r, "namespace keys must be strings");
            jj_dict_setj(r, ns->u.d, p->u.l->v[0]->u.s, p->u.l->v[1]);
          }
        } else
          jj_fail(r, "'%s' object is not iterable", jj_tname(a0));
      }
      if (kwargs)
        for (size_t i = 0; i < kwargs->u.d->n; i++) jj_dict_setj(r, ns->u.d, kwargs->u.d->k[i], kwargs->u.d->v[i]);
      return ns;
    }
    case M_STR_UPPER: return jj_case_map(r, self, 1);
    case M_STR_LOWER: return jj_case_map(r, self, 0);
    case M_STR_STRIP:
    case M_STR_LSTRIP:
    case M_STR_RSTRIP: {
      jv *chars = a0 && a0->t == V_STR ? a0 : NULL;
      if (a0 && a0->t != V_STR && a0->t != V_NONE) jj_fail(r, "strip arg must be None or str");
      return jj_strip(r, self, fn->kind == M_STR_STRIP ? 3 : fn->kind == M_STR_LSTRIP ? 1 : 2, chars);
    }
    case M_STR_TITLE: return title_case(r, self);
    case M_STR_CAPITALIZE: return capitalize(r, self);
    case M_STR_STARTSWITH:
    case M_STR_ENDSWITH: {
      bool sw = fn->kind == M_STR_STARTSWITH;
      const char *nm = sw ? "startswith" : "endswith";
      if (!a0) jj_fail(r, "%s() requires at least one argument", nm);
      jv one = {.t = V_LIST};
      jj_list ol = {&a0, 1, 1};
      one.u.l = &ol;
      jv *pats = a0->t == V_STR ? &one : a0;
      if (pats->t != V_LIST) jj_fail(r, "%s() argument must be a string or tuple of strings", nm);
      for (size_t i = 0; i < pats->u.l->n; i++) {
        jv *p = pats->u.l->v[i];
        if (p->t != V_STR) jj_fail(r, "%s() tuple elements must be strings", nm);
        if (p->u.s.n <= self->u.s.n &&
            !memcmp(self->u.s.s + (sw ? 0 : self->u.s.n - p->u.s.n), p->u.s.s, p->u.s.n))
          return r->vtrue;
      }
      return r->vfalse;
    }
    case M_STR_SPLIT: {
      jv *sep = jj_arg(args, kwargs, 0, "sep"), *ms = jj_arg(args, kwargs, 1, "maxsplit");
      if (ms && ms->t != V_INT) jj_fail(r, "maxsplit argument must be a number");
      return split_str(r, self, sep, ms ? ms->u.i : -1);
    }
    case M_STR_REPLACE: {
      if (na < 2) jj_fail(r, "replace() requires at least two arguments");
      if (a0->t != V_STR || a1->t != V_STR) jj_fail(r, "replace() arguments must be strings");
      jv *c = jj_arg(args, kwargs, 2, "count");
      if (c && c->t != V_INT && c->t != V_NONE) jj_fail(r, "replace() count argument must be a number or null");
      return str_replace(r, self, a0, a1, c && c->t == V_INT ? c->u.i : -1);
    }
    case M_STR_FIND:
    case M_STR_COUNT: {
      if (!a0 || a0->t != V_STR) jj_fail(r, "argument must be a string");
      if (fn->kind == M_STR_FIND) {
        const char *f = jj_memmem(self->u.s.s, self->u.s.n, a0->u.s.s, a0->u.s.n);
        return jj_int(r, f ? (int64_t)jj_cp_count(self->u.s.s, (size_t)(f - self->u.s.s)) : -1);
      }
      if (!a0->u.s.n) return jj_int(r, (int64_t)jj_cp_count(self->u.s.s, self->u.s.n) + 1);
      int64_t c = 0;
      size_t i = 0;
      const char *f;
      while ((f = jj_memmem(self->u.s.s + i, self->u.s.n - i, a0->u.s.s, a0->u.s.n))) {
        c++;
        i = (size_t)(f - self->u.s.s) + a0->u.s.n;
      }
      return jj_int(r, c);
    }
    case M_STR_JOIN: {
      if (!a0 || a0->t != V_LIST) jj_fail(r, "join() argument must be a list");
      sm_buf *b = jj_buf(r);
      for (size_t i = 0; i < a0->u.l->n; i++) {
        if (i) sm_buf_put(b, self->u.s.s, self->u.s.n);
        jj_raw_str(r, b, a0->u.l->v[i]);
      }
      return jj_buf_value(r, b);
    }
    case M_STR_ISDIGIT:
    case M_STR_ISALPHA:
    case M_STR_ISSPACE: {
      if (!self->u.s.n) return r->vfalse;
      for (size_t i = 0; i < self->u.s.n;) {
        int32_t cp;
        size_t l = jj_utf8_next(self->u.s.s, self->u.s.n, i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        bool ok = fn->kind == M_STR_ISDIGIT ? c == UTF8PROC_CATEGORY_ND
                  : fn->kind == M_STR_ISALPHA ? (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO)
                                              : jj_is_space_at(self->u.s.s, self->u.s.n, i, NULL);
        if (!ok) return r->vfalse;
        i += l;
      }
      return r->vtrue;
    }
    case M_STR_FORMAT: return self;
    case M_DICT_GET: {
      if (!a0 || a0->t != V_STR) jj_fail(r, "Object key must be a string: got %s", a0 ? jj_tname(a0) : "nothing");
      jv *x = jj_dict_get(self->u.d, a0->u.s.s, a0->u.s.n);
      return x ? x : a1 ? a1 : r->none;
    }
    case M_DICT_ITEMS: return jj_dict_items(r, self);
    case M_DICT_KEYS: return jj_dict_keys(r, self);
    case M_DICT_VALUES: return jj_dict_values(r, self);
    case M_DICT_DICTSORT: {
      jv *cs = bool_arg(r, jj_arg(args, kwargs, 0, "case_sensitive"), "case_sensitive");
      jv *by = jj_arg(args, kwargs, 1, "by");
      jv *rev = bool_arg(r, jj_arg(args, kwargs, 2, "reverse"), "reverse");
      if (by && (by->t != V_STR || !(jj_eqs(by->u.s, "key") || jj_eqs(by->u.s, "value"))))
        jj_fail(r, "by must be either 'key' or 'value'");
      jv *items = jj_dict_items(r, self);
      jv *attr = jj_cstr(r, by && jj_eqs(by->u.s, "value") ? "1" : "0");
      return jj_sorted(r, items, rev && rev->u.b, cs && cs->u.b, attr);
    }
  }
  jj_fail(r, "Cannot call something that is not a function");
}

