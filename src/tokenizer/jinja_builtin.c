/* Chat-template builtins: tests (`is ...`), filters (`|...`), global functions (range, namespace,
 * raise_exception, strftime_now) and the methods of strings and dicts, with the semantics of
 * Python Jinja2 3.1 (jinja2/tests.py, jinja2/filters.py) and transformers' tojson. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>
#include "tokenizer/jinja_rt.h"

jv *jj_builtin_member(jj_rt *r, jv *obj, jstr name) {
  if (obj->t == V_STR) {
    static const struct {
      const char *n;
      jj_funckind k;
    } M[] = {{"upper", M_STR_UPPER},           {"lower", M_STR_LOWER},
             {"strip", M_STR_STRIP},           {"lstrip", M_STR_LSTRIP},
             {"rstrip", M_STR_RSTRIP},         {"title", M_STR_TITLE},
             {"capitalize", M_STR_CAPITALIZE}, {"startswith", M_STR_STARTSWITH},
             {"endswith", M_STR_ENDSWITH},     {"split", M_STR_SPLIT},
             {"replace", M_STR_REPLACE},       {"find", M_STR_FIND},
             {"count", M_STR_COUNT},           {"join", M_STR_JOIN},
             {"isdigit", M_STR_ISDIGIT},       {"isalpha", M_STR_ISALPHA},
             {"isspace", M_STR_ISSPACE},       {"format", M_STR_FORMAT}};
    for (size_t i = 0; i < sizeof M / sizeof M[0]; i++)
      if (jj_eqs(name, M[i].n)) return jj_func_new(r, M[i].k, obj);
    return NULL;
  }
  if (obj->t == V_DICT) {
    if (jj_eqs(name, "get")) return jj_func_new(r, M_DICT_GET, obj);
    if (jj_eqs(name, "items")) return jj_func_new(r, M_DICT_ITEMS, obj);
    if (jj_eqs(name, "keys")) return jj_func_new(r, M_DICT_KEYS, obj);
    if (jj_eqs(name, "values")) return jj_func_new(r, M_DICT_VALUES, obj);
  }
  return NULL;
}

/* ---------------- tests ---------------- */
/* Python's `value % d == want` for the odd / even / divisibleby tests */
static bool py_mod_is(jj_rt *r, jv *v, jv *d, int64_t want) {
  if (v->t == V_UNDEF) jj_undef_fail(r, v);
  if (d->t == V_UNDEF) jj_undef_fail(r, d);
  bool vi = v->t == V_INT || v->t == V_BOOL, di = d->t == V_INT || d->t == V_BOOL;
  if ((!vi && v->t != V_FLOAT) || (!di && d->t != V_FLOAT))
    jj_fail(r, "TypeError: unsupported operand type(s) for %%: '%s' and '%s'", jj_tname(v), jj_tname(d));
  if (vi && di) {
    int64_t a = v->t == V_BOOL ? v->u.b : v->u.i, b = d->t == V_BOOL ? d->u.b : d->u.i;
    if (b == 0) jj_fail(r, "ZeroDivisionError: integer modulo by zero");
    jv *m = jj_arith_int(r, OP_MOD, a, b);
    return m->u.i == want;
  }
  double a = jj_num_of(v), b = jj_num_of(d);
  if (b == 0) jj_fail(r, "ZeroDivisionError: float modulo");
  double m = fmod(a, b);
  if (m != 0 && (m < 0) != (b < 0)) m += b;
  return m == (double)want;
}

bool jj_test(jj_rt *r, jstr name, jv *v, jv *args, int na) {
  jv *a0 = na > 0 ? args->u.l->v[0] : NULL;
#define T(s) jj_eqs(name, s)
  if (T("defined")) return v->t != V_UNDEF;
  if (T("undefined")) return v->t == V_UNDEF;
  if (T("none")) return v->t == V_NONE;
  if (T("boolean")) return v->t == V_BOOL;
  if (T("false")) return v->t == V_BOOL && !v->u.b;
  if (T("true")) return v->t == V_BOOL && v->u.b;
  if (T("integer")) return v->t == V_INT;
  if (T("float")) return v->t == V_FLOAT;
  if (T("number")) return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL;
  if (T("string")) return v->t == V_STR;
  if (T("mapping")) return v->t == V_DICT;
  /* len() and __getitem__ */
  if (T("sequence"))
    return v->t == V_STR || v->t == V_DICT || v->t == V_UNDEF ||
           (v->t == V_LIST && (v->lk == LK_LIST || v->lk == LK_RANGE));
  if (T("iterable")) return v->t == V_STR || v->t == V_DICT || v->t == V_UNDEF || v->t == V_LIST || v->t == V_LOOP;
  if (T("callable")) return v->t == V_FUNC || v->t == V_UNDEF || v->t == V_LOOP;
  if (T("escaped")) return false;
  if (T("odd") || T("even")) {
    jv two = {.t = V_INT, .u.i = 2};
    return py_mod_is(r, v, &two, T("odd") ? 1 : 0);
  }
  if (T("divisibleby")) {
    if (!a0) jj_fail(r, "TypeError: test_divisibleby() missing 1 required positional argument: 'num'");
    return py_mod_is(r, v, a0, 0);
  }
  if (T("lower") || T("upper")) {
    jv *s = jj_str_of(r, v, false);
    return jj_py_iscase(s, T("upper"));
  }
  if (T("equalto") || T("eq") || T("==") || T("ne") || T("!=") || T("sameas") || T("in") || T("gt") || T(">") ||
      T("greaterthan") || T("lt") || T("<") || T("lessthan") || T("ge") || T(">=") || T("le") || T("<=")) {
    if (!a0) jj_fail(r, "TypeError: test '%.*s' missing 1 required positional argument", (int)name.n, name.s);
    if (T("equalto") || T("eq") || T("==")) return jj_loose_eq(r, v, a0);
    if (T("ne") || T("!=")) return !jj_loose_eq(r, v, a0);
    if (T("sameas")) { /* Python `is`: singletons, small ints, and the same container */
      if (v->t != a0->t) return false;
      if (v->t == V_INT) return v->u.i == a0->u.i && v->u.i >= -5 && v->u.i <= 256;
      if (v->t == V_STR) return v == a0 || jj_strict_eq(v, a0);
      if (v->t == V_UNDEF || v->t == V_FLOAT) return v == a0;
      return jj_strict_eq(v, a0);
    }
    if (T("in")) return jj_py_in(r, v, a0);
    int c = jj_compare(r, v, a0, true);
    if (T("gt") || T(">") || T("greaterthan")) return c > 0;
    if (T("lt") || T("<") || T("lessthan")) return c < 0;
    if (T("ge") || T(">=")) return c >= 0;
    return c <= 0;
  }
#undef T
  jj_fail(r, "TemplateAssertionError: No test named '%.*s'.", (int)name.n, name.s);
}

/* ---------------- filters ---------------- */
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

/* transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
static jv *do_tojson(jj_rt *r, jv *v, jv *args, jv *kwargs) {
  json_opts o = {0};
  jv *ea = jj_arg(args, kwargs, 0, "ensure_ascii"), *ind = jj_arg(args, kwargs, 1, "indent");
  jv *sep = jj_arg(args, kwargs, 2, "separators"), *sk = jj_arg(args, kwargs, 3, "sort_keys");
  if (ind && ind->t != V_NONE) {
    if (ind->t == V_INT || ind->t == V_BOOL) {
      int64_t k = ind->t == V_BOOL ? ind->u.b : ind->u.i;
      if (k > 64) jj_fail(r, "tojson: indent too large");
      o.indent = k > 0 ? (int)k : 0;
      o.pretty = true;
    } else if (ind->t == V_STR) {
      if (ind->u.s.n > 64) jj_fail(r, "tojson: indent too large");
      o.indent_str = ind->u.s.s;
      o.indent_len = ind->u.s.n;
      o.pretty = true;
    } else jj_fail(r, "TypeError: can't multiply sequence by non-int of type '%s'", jj_tname(ind));
  }
  o.ensure_ascii = ea && jj_truthy(ea);
  o.sort_keys = sk && jj_truthy(sk);
  if (sep && sep->t == V_LIST && sep->lk == LK_LIST) {
    if (sep->u.l->n != 2 || sep->u.l->v[0]->t != V_STR || sep->u.l->v[1]->t != V_STR)
      jj_fail(r, "tojson: separators must be a pair of strings");
    o.item_sep = sep->u.l->v[0]->u.s.s;
    o.key_sep = sep->u.l->v[1]->u.s.s;
  } else if (sep && sep->t != V_NONE) jj_fail(r, "tojson: separators must be a pair of strings");
  sm_buf *b = jj_buf(r);
  jj_to_json(r, b, v, &o, 0);
  return jj_buf_value(r, b);
}

/* Jinja2's do_int / do_float */
static jv *do_int(jj_rt *r, jv *v, jv *dflt, jv *base) {
  if (!dflt) dflt = jj_int(r, 0);
  int b = 10;
  if (base) {
    if (base->t != V_INT || base->u.i < 0 || base->u.i == 1 || base->u.i > 36)
      jj_fail(r, "ValueError: int() base must be >= 2 and <= 36, or 0");
    b = (int)base->u.i;
  }
  double f;
  switch (v->t) {
    case V_UNDEF: jj_undef_fail(r, v);
    case V_BOOL: return jj_int(r, v->u.b);
    case V_INT: return v;
    case V_STR: {
      int64_t i;
      bool ovf;
      if (jj_py_int_of_str(v, b, &i, &ovf)) {
        if (ovf) jj_fail(r, "int(): integer too large");
        return jj_int(r, i);
      }
      if (!jj_py_float_of_str(v, &f) || !isfinite(f)) return dflt; /* int(float(s)): ValueError / OverflowError */
      break;
    }
    case V_FLOAT: f = v->u.f; break;
    default: return dflt;
  }
  if (isnan(f)) return dflt;
  if (isinf(f)) jj_fail(r, "OverflowError: cannot convert float infinity to integer");
  f = trunc(f);
  if (fabs(f) > 9.2e18) jj_fail(r, "int(): integer too large");
  return jj_int(r, (int64_t)f);
}
static jv *do_float(jj_rt *r, jv *v, jv *dflt) {
  if (!dflt) dflt = jj_float(r, 0);
  double f;
  switch (v->t) {
    case V_UNDEF: jj_undef_fail(r, v);
    case V_BOOL: return jj_float(r, v->u.b);
    case V_INT: return jj_float(r, (double)v->u.i);
    case V_FLOAT: return v;
    case V_STR: return jj_py_float_of_str(v, &f) ? jj_float(r, f) : dflt;
    default: return dflt;
  }
}

/* Python sum()/+ for two numbers */
static jv *num_add(jj_rt *r, jv *a, jv *b) {
  if (a->t == V_UNDEF) jj_undef_fail(r, a);
  if (b->t == V_UNDEF) jj_undef_fail(r, b);
  bool an = a->t == V_INT || a->t == V_BOOL || a->t == V_FLOAT, bn = b->t == V_INT || b->t == V_BOOL || b->t == V_FLOAT;
  if (!an || !bn) jj_fail(r, "TypeError: unsupported operand type(s) for +: '%s' and '%s'", jj_tname(a), jj_tname(b));
  if (a->t != V_FLOAT && b->t != V_FLOAT)
    return jj_arith_int(r, OP_ADD, a->t == V_BOOL ? a->u.b : a->u.i, b->t == V_BOOL ? b->u.b : b->u.i);
  return jj_float(r, jj_num_of(a) + jj_num_of(b));
}

/* the key of unique/min/max: lowercased strings unless case_sensitive */
static jv *ci_key(jj_rt *r, jv *x, bool cs, jv *attr) {
  if (attr && attr->t != V_NONE) {
    jv *as = jj_str_of(r, attr, false);
    x = jj_attr_path(r, x, as->u.s.s, as->u.s.n);
  }
  return !cs && x->t == V_STR ? jj_case_map(r, x, 0) : x;
}

/* select / reject / selectattr / rejectattr */
static jv *select_reject(jj_rt *r, jv *v, jv *args, bool attr_mode, bool sel, jj_env *env) {
  (void)env;
  size_t na = jj_nargs(args), k = 0;
  jv *attr = NULL;
  if (attr_mode) {
    if (!na) jj_fail(r, "TypeError: Missing parameter for attribute name");
    attr = jj_str_of(r, args->u.l->v[0], false);
    k = 1;
  }
  jv *test = k < na ? args->u.l->v[k] : NULL;
  if (test && test->t != V_STR) jj_fail(r, "TemplateRuntimeError: No test named %s.", jj_tname(test));
  jv *targs = jj_list_new(r);
  for (size_t i = k + 1; i < na; i++) jj_list_push(r, targs, args->u.l->v[i]);
  jv *items = jj_iterate(r, v), *o = jj_seq_new(r, LK_GEN);
  for (size_t i = 0; i < items->u.l->n; i++) {
    jv *x = items->u.l->v[i], *y = attr ? jj_attr_path(r, x, attr->u.s.s, attr->u.s.n) : x;
    bool res = test ? jj_test(r, test->u.s, y, targs, (int)targs->u.l->n) : jj_truthy(y);
    if (res == sel) jj_list_push(r, o, x);
  }
  return o;
}

static jv *str_arg(jj_rt *r, jv *v) { return v ? jj_str_of(r, v, false) : NULL; }

jv *jj_filter(jj_rt *r, jv *v, jstr name, jv *args, jv *kwargs, jj_env *env) {
#define F(s) jj_eqs(name, s)
  size_t na = jj_nargs(args);
  if (F("default") || F("d")) {
    jv *dv = jj_arg(args, kwargs, 0, "default_value");
    if (!dv) dv = jj_strn(r, "", 0);
    jv *bo = jj_arg(args, kwargs, 1, "boolean");
    if (v->t == V_UNDEF || (bo && jj_truthy(bo) && !jj_truthy(v))) return dv;
    return v;
  }
  if (F("tojson")) return do_tojson(r, v, args, kwargs);
  if (F("safe") || F("string")) return jj_str_of(r, v, false);
  if (F("e") || F("escape")) return html_escape(r, v);
  if (F("length") || F("count")) return jj_int(r, jj_len(r, v));
  if (F("int")) return do_int(r, v, jj_arg(args, kwargs, 0, "default"), jj_arg(args, kwargs, 1, "base"));
  if (F("float")) return do_float(r, v, jj_arg(args, kwargs, 0, "default"));
  if (F("abs")) {
    if (v->t == V_INT || v->t == V_BOOL) {
      int64_t x = v->t == V_BOOL ? v->u.b : v->u.i;
      if (x == INT64_MIN) jj_fail(r, "integer overflow");
      return jj_int(r, x < 0 ? -x : x);
    }
    if (v->t == V_FLOAT) return jj_float(r, fabs(v->u.f));
    if (v->t == V_UNDEF) jj_undef_fail(r, v);
    jj_fail(r, "TypeError: bad operand type for abs(): '%s'", jj_tname(v));
  }
  if (F("round")) {
    jv *prec = jj_arg(args, kwargs, 0, "precision"), *method = jj_arg(args, kwargs, 1, "method");
    if (method && !(method->t == V_STR &&
                    (jj_eqs(method->u.s, "common") || jj_eqs(method->u.s, "floor") || jj_eqs(method->u.s, "ceil"))))
      jj_fail(r, "FilterArgumentError: method must be common, ceil or floor");
    if (v->t == V_UNDEF) jj_undef_fail(r, v);
    if (v->t != V_INT && v->t != V_FLOAT && v->t != V_BOOL)
      jj_fail(r, "TypeError: type %s doesn't define __round__ method", jj_tname(v));
    if (prec && prec->t != V_INT)
      jj_fail(r, "TypeError: '%s' object cannot be interpreted as an integer", jj_tname(prec));
    int64_t p = prec ? prec->u.i : 0;
    if (p > 15 || p < -15) jj_fail(r, "round: precision out of range");
    bool common = !method || jj_eqs(method->u.s, "common");
    if (v->t != V_FLOAT && common) { /* Python round(int, n) stays an int */
      int64_t x = v->t == V_BOOL ? v->u.b : v->u.i;
      if (p >= 0) return jj_int(r, x);
      double m = pow(10, (double)-p);
      return jj_int(r, (int64_t)(nearbyint((double)x / m) * m));
    }
    double m = pow(10, (double)p), x = jj_num_of(v) * m, res;
    if (!common && jj_eqs(method->u.s, "floor")) res = floor(x);
    else if (!common) res = ceil(x);
    else res = nearbyint(x); /* half to even, like Python's round() */
    return jj_float(r, res / m);
  }
  /* ---- string filters: they work on str(value) ---- */
  if (F("upper") || F("lower") || F("title") || F("capitalize") || F("trim") || F("replace") || F("wordcount")) {
    jv *s = jj_str_of(r, v, false);
    if (F("upper")) return jj_case_map(r, s, 1);
    if (F("lower")) return jj_case_map(r, s, 0);
    if (F("title")) return jj_title_filter(r, s);
    if (F("capitalize")) return jj_py_capitalize(r, s);
    if (F("trim")) {
      jv *chars = jj_arg(args, kwargs, 0, "chars");
      if (chars && chars->t != V_STR && chars->t != V_NONE) jj_fail(r, "TypeError: strip arg must be None or str");
      return jj_strip(r, s, 3, chars && chars->t == V_STR ? chars : NULL);
    }
    if (F("replace")) {
      jv *o = str_arg(r, jj_arg(args, kwargs, 0, "old")), *nw = str_arg(r, jj_arg(args, kwargs, 1, "new"));
      jv *c = jj_arg(args, kwargs, 2, "count");
      if (!o || !nw) jj_fail(r, "TypeError: do_replace() missing required arguments");
      if (c && c->t != V_INT && c->t != V_NONE)
        jj_fail(r, "TypeError: '%s' object cannot be interpreted as an integer", jj_tname(c));
      return jj_str_replace(r, s, o, nw, c && c->t == V_INT ? c->u.i : -1);
    }
    int64_t c = 0; /* wordcount: runs of \w */
    bool inw = false;
    for (size_t i = 0; i < s->u.s.n;) {
      int32_t cp;
      i += jj_utf8_next(s->u.s.s, s->u.s.n, i, &cp);
      utf8proc_category_t k = cp < 0 ? UTF8PROC_CATEGORY_CN : utf8proc_category(cp);
      bool w = cp == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
               (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
      if (w && !inw) c++;
      inw = w;
    }
    return jj_int(r, c);
  }
  if (F("indent")) {
    if (v->t == V_UNDEF) jj_undef_fail(r, v);
    if (v->t != V_STR) jj_fail(r, "TypeError: unsupported operand type(s) for +=: '%s' and 'str'", jj_tname(v));
    jv *w = jj_arg(args, kwargs, 0, "width");
    jv *first = jj_arg(args, kwargs, 1, "first"), *blank = jj_arg(args, kwargs, 2, "blank");
    return jj_indent(r, v, w ? w : jj_int(r, 4), first && jj_truthy(first), blank && jj_truthy(blank));
  }
  /* ---- filters over an iterable ---- */
  if (F("first")) {
    if (jj_is_iter(v))
      return v->u.l->pos < v->u.l->n ? v->u.l->v[v->u.l->pos++] : jj_undef(r, "No first item, sequence was empty.");
    jv *l = jj_iterate(r, v);
    return l->u.l->n ? l->u.l->v[0] : jj_undef(r, "No first item, sequence was empty.");
  }
  if (F("last")) {
    if (jj_is_iter(v)) jj_fail(r, "TypeError: '%s' object is not reversible", jj_tname(v));
    jv *l = jj_iterate(r, v);
    return l->u.l->n ? l->u.l->v[l->u.l->n - 1] : jj_undef(r, "No last item, sequence was empty.");
  }
  if (F("reverse")) {
    if (v->t == V_STR) {
      jv *l = jj_chars_of(r, v);
      sm_buf *b = jj_buf(r);
      for (size_t i = l->u.l->n; i-- > 0;) sm_buf_put(b, l->u.l->v[i]->u.s.s, l->u.l->v[i]->u.s.n);
      return jj_buf_value(r, b);
    }
    bool it = jj_is_iter(v); /* reversed() fails on an iterator: Jinja2 then reverses list(value) */
    jv *l = jj_iterate(r, v), *o = jj_seq_new(r, it ? LK_LIST : LK_REVITER);
    for (size_t i = l->u.l->n; i-- > 0;) jj_list_push(r, o, l->u.l->v[i]);
    return o;
  }
  if (F("list")) {
    jv *l = jj_iterate(r, v), *o = jj_list_new(r);
    for (size_t i = 0; i < l->u.l->n; i++) jj_list_push(r, o, l->u.l->v[i]);
    return o;
  }
  if (F("join")) {
    jv *sep = str_arg(r, jj_arg(args, kwargs, 0, "d"));
    jv *attr = jj_arg(args, kwargs, 1, "attribute");
    jv *l = jj_iterate(r, v);
    if (attr && attr->t != V_NONE) attr = jj_str_of(r, attr, false);
    sm_buf *b = jj_buf(r);
    for (size_t i = 0; i < l->u.l->n; i++) {
      if (i && sep) sm_buf_put(b, sep->u.s.s, sep->u.s.n);
      jv *x = l->u.l->v[i];
      if (attr && attr->t == V_STR) x = jj_attr_path(r, x, attr->u.s.s, attr->u.s.n);
      jj_raw_str(r, b, x);
    }
    return jj_buf_value(r, b);
  }
  if (F("sort")) {
    jv *rev = jj_arg(args, kwargs, 0, "reverse"), *cs = jj_arg(args, kwargs, 1, "case_sensitive");
    jv *attr = jj_arg(args, kwargs, 2, "attribute");
    if (attr && attr->t != V_NONE) attr = jj_str_of(r, attr, false);
    return jj_sorted(r, jj_iterate(r, v), rev && jj_truthy(rev), cs && jj_truthy(cs),
                     attr && attr->t == V_STR ? attr : NULL);
  }
  if (F("unique")) {
    jv *cs = jj_arg(args, kwargs, 0, "case_sensitive"), *attr = jj_arg(args, kwargs, 1, "attribute");
    jv *l = jj_iterate(r, v), *o = jj_seq_new(r, LK_GEN), *seen = jj_list_new(r);
    for (size_t i = 0; i < l->u.l->n; i++) {
      jv *key = ci_key(r, l->u.l->v[i], cs && jj_truthy(cs), attr);
      bool dup = false;
      for (size_t j = 0; j < seen->u.l->n && !dup; j++) dup = jj_loose_eq(r, seen->u.l->v[j], key);
      if (!dup) jj_list_push(r, seen, key), jj_list_push(r, o, l->u.l->v[i]);
    }
    return o;
  }
  if (F("min") || F("max")) {
    jv *cs = jj_arg(args, kwargs, 0, "case_sensitive"), *attr = jj_arg(args, kwargs, 1, "attribute");
    jv *l = jj_iterate(r, v);
    if (!l->u.l->n) return jj_undef(r, "No aggregated item, sequence was empty.");
    jv *best = l->u.l->v[0], *bk = ci_key(r, best, cs && jj_truthy(cs), attr);
    for (size_t i = 1; i < l->u.l->n; i++) {
      jv *k = ci_key(r, l->u.l->v[i], cs && jj_truthy(cs), attr);
      int c = jj_compare(r, k, bk, true);
      if (F("min") ? c < 0 : c > 0) best = l->u.l->v[i], bk = k;
    }
    return best;
  }
  if (F("sum")) {
    jv *attr = jj_arg(args, kwargs, 0, "attribute"), *acc = jj_arg(args, kwargs, 1, "start");
    if (attr && attr->t != V_NONE) attr = jj_str_of(r, attr, false);
    jv *l = jj_iterate(r, v);
    if (!acc) acc = jj_int(r, 0);
    for (size_t i = 0; i < l->u.l->n; i++)
      acc = num_add(r, acc,
                    attr && attr->t == V_STR ? jj_attr_path(r, l->u.l->v[i], attr->u.s.s, attr->u.s.n) : l->u.l->v[i]);
    return acc;
  }
  if (F("batch")) {
    jv *sz = jj_arg(args, kwargs, 0, "linecount"), *fill = jj_arg(args, kwargs, 1, "fill_with");
    if (!sz || sz->t != V_INT || sz->u.i <= 0) jj_fail(r, "batch requires a positive integer size");
    jv *l = jj_iterate(r, v), *o = jj_seq_new(r, LK_GEN), *cur = NULL;
    for (size_t i = 0; i < l->u.l->n; i++) {
      if (!cur || (int64_t)cur->u.l->n == sz->u.i) {
        cur = jj_list_new(r);
        jj_list_push(r, o, cur);
      }
      jj_list_push(r, cur, l->u.l->v[i]);
    }
    if (cur && fill && fill->t != V_NONE)
      while ((int64_t)cur->u.l->n < sz->u.i) jj_list_push(r, cur, fill);
    return o;
  }
  if (F("select") || F("reject")) return select_reject(r, v, args, false, F("select"), env);
  if (F("selectattr") || F("rejectattr")) return select_reject(r, v, args, true, F("selectattr"), env);
  if (F("map")) {
    jv *l = jj_iterate(r, v), *o = jj_seq_new(r, LK_GEN);
    jv *attr = !na && kwargs ? jj_dict_get(kwargs->u.d, "attribute", 9) : NULL;
    if (attr) {
      attr = jj_str_of(r, attr, false);
      jv *dflt = jj_dict_get(kwargs->u.d, "default", 7);
      for (size_t i = 0; i < l->u.l->n; i++) {
        jv *x = jj_attr_path(r, l->u.l->v[i], attr->u.s.s, attr->u.s.n);
        jj_list_push(r, o, x->t == V_UNDEF && dflt && dflt->t != V_NONE ? dflt : x);
      }
      return o;
    }
    if (na < 1 || args->u.l->v[0]->t != V_STR) jj_fail(r, "map requires a filter name or attribute=");
    jv *fargs = jj_list_new(r);
    for (size_t k = 1; k < na; k++) jj_list_push(r, fargs, args->u.l->v[k]);
    for (size_t i = 0; i < l->u.l->n; i++)
      jj_list_push(r, o, jj_filter(r, l->u.l->v[i], args->u.l->v[0]->u.s, fargs, kwargs, env));
    return o;
  }
  /* ---- mappings ---- */
  if (F("items")) {
    if (v->t == V_UNDEF) return jj_seq_new(r, LK_GEN);
    if (v->t != V_DICT) jj_fail(r, "TypeError: Can only get item pairs from a mapping.");
    jv *o = jj_dict_items(r, v);
    o->lk = LK_GEN;
    return o;
  }
  if (F("dictsort")) {
    if (v->t == V_UNDEF) jj_undef_fail(r, v);
    if (v->t != V_DICT) jj_fail(r, "AttributeError: '%s' object has no attribute 'items'", jj_tname(v));
    return jj_call_builtin(r, jj_func_new(r, M_DICT_DICTSORT, v), args, kwargs);
  }
  jj_fail(r, "TemplateAssertionError: No filter named '%.*s'.", (int)name.n, name.s);
#undef F
}

jv *jj_call_builtin(jj_rt *r, jv *fnv, jv *args, jv *kwargs) {
  jj_func *fn = fnv->u.fn;
  jv *self = fn->self;
  size_t na = jj_nargs(args);
  jv *a0 = jj_arg(args, NULL, 0, NULL), *a1 = jj_arg(args, NULL, 1, NULL);
  switch (fn->kind) {
    case F_MACRO:
    case F_CALLER:
    case F_LOOP_CYCLE:
    case F_LOOP_CHANGED: break; /* jj_call */
    case F_RANGE: {
      for (size_t i = 0; i < na; i++)
        if (args->u.l->v[i]->t != V_INT) jj_fail(r, "range() arguments must be integers");
      if (na < 1 || na > 3) jj_fail(r, "range() expects 1 to 3 arguments");
      int64_t start = 0, stop, step = 1;
      if (na == 1) stop = a0->u.i;
      else start = a0->u.i, stop = a1->u.i;
      if (na == 3) step = args->u.l->v[2]->u.i;
      if (step == 0) jj_fail(r, "ValueError: range() arg 3 must not be zero");
      jv *o = jj_seq_new(r, LK_RANGE);
      o->u.l->range[0] = start, o->u.l->range[1] = stop, o->u.l->range[2] = step;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if ((long)o->u.l->n >= JJ_MAX_RANGE) jj_fail(r, "range() too large");
        jj_list_push(r, o, jj_int(r, i));
      }
      return o;
    }
    case F_RAISE: {
      if (!a0) jj_fail(r, "TypeError: raise_exception() missing 1 required positional argument: 'message'");
      jv *m = jj_str_of(r, a0, true);
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
            if (p->t != V_LIST || p->u.l->n != 2)
              jj_fail(r, "namespace expected an object or an iterable of [key, value] pairs");
            if (p->u.l->v[0]->t != V_STR) jj_fail(r, "namespace keys must be strings");
            jj_dict_setj(r, ns->u.d, p->u.l->v[0]->u.s, p->u.l->v[1]);
          }
        } else jj_fail(r, "'%s' object is not iterable", jj_tname(a0));
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
    case M_STR_TITLE: return jj_py_title(r, self);
    case M_STR_CAPITALIZE: return jj_py_capitalize(r, self);
    case M_STR_STARTSWITH:
    case M_STR_ENDSWITH: {
      bool sw = fn->kind == M_STR_STARTSWITH;
      const char *nm = sw ? "startswith" : "endswith";
      if (!a0) jj_fail(r, "%s() requires at least one argument", nm);
      jv one = {.t = V_LIST};
      jj_list ol = {&a0, 1, 1, 0, {0, 0, 0}};
      one.u.l = &ol;
      jv *pats = a0->t == V_STR ? &one : a0;
      if (pats->t != V_LIST) jj_fail(r, "%s() argument must be a string or tuple of strings", nm);
      for (size_t i = 0; i < pats->u.l->n; i++) {
        jv *p = pats->u.l->v[i];
        if (p->t != V_STR) jj_fail(r, "%s() tuple elements must be strings", nm);
        if (p->u.s.n <= self->u.s.n && !memcmp(self->u.s.s + (sw ? 0 : self->u.s.n - p->u.s.n), p->u.s.s, p->u.s.n))
          return r->vtrue;
      }
      return r->vfalse;
    }
    case M_STR_SPLIT: {
      jv *sep = jj_arg(args, kwargs, 0, "sep"), *ms = jj_arg(args, kwargs, 1, "maxsplit");
      if (ms && ms->t != V_INT) jj_fail(r, "maxsplit argument must be a number");
      return jj_split_str(r, self, sep, ms ? ms->u.i : -1);
    }
    case M_STR_REPLACE: {
      if (na < 2) jj_fail(r, "replace() requires at least two arguments");
      if (a0->t != V_STR || a1->t != V_STR) jj_fail(r, "replace() arguments must be strings");
      jv *c = jj_arg(args, kwargs, 2, "count");
      if (c && c->t != V_INT && c->t != V_NONE) jj_fail(r, "replace() count argument must be a number or null");
      return jj_str_replace(r, self, a0, a1, c && c->t == V_INT ? c->u.i : -1);
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
      if (!a0) jj_fail(r, "TypeError: str.join() takes exactly one argument (0 given)");
      jv *items = jj_iterate(r, a0);
      sm_buf *b = jj_buf(r);
      for (size_t i = 0; i < items->u.l->n; i++) {
        jv *x = items->u.l->v[i];
        if (x->t != V_STR) jj_fail(r, "TypeError: sequence item %zu: expected str instance, %s found", i, jj_tname(x));
        if (i) sm_buf_put(b, self->u.s.s, self->u.s.n);
        sm_buf_put(b, x->u.s.s, x->u.s.n);
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
    case M_STR_FORMAT: return jj_py_format(r, self, args, kwargs);
    case M_DICT_GET: {
      if (!a0) jj_fail(r, "TypeError: get expected at least 1 argument, got 0");
      jv *x = a0->t == V_STR ? jj_dict_get(self->u.d, a0->u.s.s, a0->u.s.n) : NULL;
      return x ? x : a1 ? a1 : r->none;
    }
    case M_DICT_ITEMS: {
      jv *o = jj_dict_items(r, self);
      o->lk = LK_ITEMS;
      return o;
    }
    case M_DICT_KEYS: {
      jv *o = jj_dict_keys(r, self);
      o->lk = LK_KEYS;
      return o;
    }
    case M_DICT_VALUES: {
      jv *o = jj_dict_values(r, self);
      o->lk = LK_VALUES;
      return o;
    }
    case M_DICT_DICTSORT: {
      jv *cs = jj_arg(args, kwargs, 0, "case_sensitive");
      jv *by = jj_arg(args, kwargs, 1, "by");
      jv *rev = jj_arg(args, kwargs, 2, "reverse");
      if (by && (by->t != V_STR || !(jj_eqs(by->u.s, "key") || jj_eqs(by->u.s, "value"))))
        jj_fail(r, "FilterArgumentError: You can only sort by either \"key\" or \"value\"");
      jv *items = jj_dict_items(r, self);
      jv *attr = jj_cstr(r, by && jj_eqs(by->u.s, "value") ? "1" : "0");
      return jj_sorted(r, items, rev && jj_truthy(rev), cs && jj_truthy(cs), attr);
    }
  }
  jj_fail(r, "Cannot call something that is not a function");
}
