/* Chat-template runtime values: construction, containers and scopes, JSON input, conversion to
 * text (printing, JSON), truth, equality and ordering, and the render's scratch buffers.
 * Semantics follow Python Jinja2 (see jinja_int.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base.h"
#include "tokenizer/jinja_rt.h"
#include "tokenizer/unicode_props.h"

void jj_fail(jj_rt *r, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(r->err, sizeof r->err, "line %d: %s", r->line, msg);
  longjmp(r->jb, 1);
}

/* ---------------- scratch buffers ---------------- */
sm_buf *jj_buf(jj_rt *r) {
  if (r->nspare) return r->spare[--r->nspare];
  if (r->nbufs == r->capbufs) {
    r->capbufs = r->capbufs ? r->capbufs * 2 : 16;
    r->bufs = sm_xrealloc(r->bufs, r->capbufs * sizeof *r->bufs);
    r->spare = sm_xrealloc(r->spare, r->capbufs * sizeof *r->spare);
  }
  sm_buf *b = sm_xcalloc(1, sizeof *b);
  r->bufs[r->nbufs++] = b;
  return b;
}

jstr jj_buf_take(jj_rt *r, sm_buf *b) {
  jstr s = {"", 0};
  if (b->n) {
    char *p = jj_alloc(&r->arena, b->n + 1);
    memcpy(p, b->p, b->n + 1);
    s.s = p;
    s.n = b->n;
  }
  sm_buf_clear(b);
  r->spare[r->nspare++] = b;
  return s;
}

jv *jj_buf_value(jj_rt *r, sm_buf *b) { return jj_jstr(r, jj_buf_take(r, b)); }

void jj_bufs_free(jj_rt *r) {
  for (size_t i = 0; i < r->nbufs; i++) {
    sm_buf_free(r->bufs[i]);
    free(r->bufs[i]);
  }
  free(r->bufs);
  free(r->spare);
  r->bufs = r->spare = NULL;
  r->nbufs = r->nspare = r->capbufs = 0;
}

const char *jj_tname(const jv *v) {
  static const char *n[] = {"Undefined", "NoneType", "bool",      "int",      "float",      "str",
                            "list",      "dict",     "Namespace", "function", "LoopContext"};
  static const char *lk[] = {"list",        "generator", "list_reverseiterator", "dict_items", "dict_keys",
                             "dict_values", "range"};
  if (v->t == V_LIST) return v->tuple ? "tuple" : lk[v->lk];
  return n[v->t];
}

/* ---------------- undefined values ---------------- */
jv *jj_undef(jj_rt *r, const char *fmt, ...) {
  char msg[300];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  jv *u = jj_strn(r, msg, k < 0 ? 0 : (size_t)k < sizeof msg ? (size_t)k : sizeof msg - 1);
  u->t = V_UNDEF;
  return u;
}
/* Jinja2's object_type_repr */
static const char *type_repr(const jv *v) { return v->t == V_NONE ? "None" : NULL; }
jv *jj_undef_attr(jj_rt *r, const jv *obj, const jv *name) {
  const char *tr = type_repr(obj);
  char t[64];
  if (!tr) snprintf(t, sizeof t, "%s object", jj_tname(obj)), tr = t;
  if (name->t == V_STR) {
    sm_buf *b = jj_buf(r);
    jj_to_str(r, b, name);
    jv *nm = jj_buf_value(r, b);
    b = jj_buf(r);
    sm_buf_printf(b, "'%s' has no attribute ", tr);
    jj_repr(r, b, nm);
    jv *u = jj_buf_value(r, b);
    u->t = V_UNDEF;
    return u;
  }
  sm_buf *b = jj_buf(r);
  sm_buf_printf(b, "%s has no element ", tr);
  jj_repr(r, b, name);
  jv *u = jj_buf_value(r, b);
  u->t = V_UNDEF;
  return u;
}
void jj_undef_fail(jj_rt *r, const jv *u) {
  if (u->t == V_UNDEF && u->u.s.n) jj_fail(r, "UndefinedError: %.*s", (int)(u->u.s.n > 300 ? 300 : u->u.s.n), u->u.s.s);
  jj_fail(r, "UndefinedError: an undefined value was used");
}

/* ---------------- value constructors ---------------- */
jv *jj_new(jj_rt *r, jj_vtype t) {
  jv *v = jj_calloc(&r->arena, sizeof *v);
  v->t = (uint8_t)t;
  return v;
}
jv *jj_int(jj_rt *r, int64_t i) {
  jv *v = jj_new(r, V_INT);
  v->u.i = i;
  return v;
}
jv *jj_float(jj_rt *r, double f) {
  jv *v = jj_new(r, V_FLOAT);
  v->u.f = f;
  return v;
}
jv *jj_strn(jj_rt *r, const char *s, size_t n) {
  jv *v = jj_new(r, V_STR);
  char *p = jj_alloc(&r->arena, n + 1);
  if (n) memcpy(p, s, n);
  p[n] = 0;
  v->u.s.s = p;
  v->u.s.n = n;
  return v;
}
jv *jj_jstr(jj_rt *r, jstr s) { /* no copy: s must live as long as the render */
  jv *v = jj_new(r, V_STR);
  v->u.s = s;
  return v;
}
jv *jj_cstr(jj_rt *r, const char *s) { return jj_strn(r, s, strlen(s)); }
jv *jj_list_new(jj_rt *r) {
  jv *v = jj_new(r, V_LIST);
  v->u.l = jj_calloc(&r->arena, sizeof(jj_list));
  return v;
}
jv *jj_seq_new(jj_rt *r, int lk) {
  jv *v = jj_list_new(r);
  v->lk = (uint8_t)lk;
  return v;
}
void jj_list_push(jj_rt *r, jv *l, jv *x) {
  jj_list *L = l->u.l;
  if (L->n == L->cap) {
    size_t cap = L->cap ? L->cap * 2 : 4;
    jv **nv_ = jj_alloc(&r->arena, cap * sizeof(jv *));
    if (L->n) memcpy(nv_, L->v, L->n * sizeof(jv *));
    L->v = nv_;
    L->cap = cap;
  }
  L->v[L->n++] = x;
}
jv *jj_dict_new(jj_rt *r, jj_vtype t) {
  jv *v = jj_new(r, t);
  v->u.d = jj_calloc(&r->arena, sizeof(jj_dict));
  return v;
}
jv **jj_dict_slot(jj_dict *d, const char *k, size_t n) {
  for (size_t i = 0; i < d->n; i++)
    if (jj_eq(d->k[i], k, n)) return &d->v[i];
  return NULL;
}
jv *jj_dict_get(jj_dict *d, const char *k, size_t n) {
  jv **s = jj_dict_slot(d, k, n);
  return s ? *s : NULL;
}
void jj_dict_setj(jj_rt *r, jj_dict *d, jstr k, jv *x) {
  jv **s = jj_dict_slot(d, k.s, k.n);
  if (s) {
    *s = x;
    return;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4;
    jstr *nk = jj_alloc(&r->arena, cap * sizeof(jstr));
    jv **nvv = jj_alloc(&r->arena, cap * sizeof(jv *));
    if (d->n) {
      memcpy(nk, d->k, d->n * sizeof(jstr));
      memcpy(nvv, d->v, d->n * sizeof(jv *));
    }
    d->k = nk;
    d->v = nvv;
    d->cap = cap;
  }
  d->k[d->n] = k;
  d->v[d->n] = x;
  d->n++;
}
void jj_dict_set(jj_rt *r, jj_dict *d, const char *k, jv *x) {
  size_t n = strlen(k);
  jstr s = {jj_alloc(&r->arena, n + 1), n};
  memcpy((char *)s.s, k, n + 1);
  jj_dict_setj(r, d, s, x);
}
jv *jj_func_new(jj_rt *r, jj_funckind k, jv *self) {
  jv *v = jj_new(r, V_FUNC);
  v->u.fn = jj_calloc(&r->arena, sizeof(jj_func));
  v->u.fn->kind = k;
  v->u.fn->self = self;
  return v;
}

/* ---------------- environments ---------------- */
jj_env *jj_env_new(jj_rt *r, jj_env *parent) {
  jj_env *e = jj_calloc(&r->arena, sizeof *e);
  e->parent = parent;
  return e;
}
void jj_env_set(jj_rt *r, jj_env *e, jstr name, jv *v) { jj_dict_setj(r, &e->vars, name, v); }
jv *jj_env_get(jj_env *e, jstr name) {
  for (; e; e = e->parent) {
    jv *v = jj_dict_get(&e->vars, name.s, name.n);
    if (v) return v;
  }
  return NULL;
}

/* ---------------- JSON input ---------------- */
jv *jj_from_json(jj_rt *r, const cJSON *j, int depth) {
  if (depth > 200) jj_fail(r, "context nested too deeply");
  if (!j || cJSON_IsNull(j)) return r->none;
  if (cJSON_IsBool(j)) return jj_bool(r, cJSON_IsTrue(j));
  if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (isfinite(d) && d == trunc(d) && fabs(d) < 9.2e18) return jj_int(r, (int64_t)d);
    return jj_float(r, d);
  }
  if (cJSON_IsString(j)) return jj_cstr(r, j->valuestring ? j->valuestring : "");
  if (cJSON_IsArray(j)) {
    jv *l = jj_list_new(r);
    for (const cJSON *c = j->child; c; c = c->next) jj_list_push(r, l, jj_from_json(r, c, depth + 1));
    return l;
  }
  if (cJSON_IsObject(j)) {
    jv *d = jj_dict_new(r, V_DICT);
    for (const cJSON *c = j->child; c; c = c->next)
      jj_dict_set(r, d->u.d, c->string ? c->string : "", jj_from_json(r, c, depth + 1));
    return d;
  }
  return r->none;
}

/* ---------------- printability ---------------- */
/* Python's str.isprintable() for one non-ASCII code point */
bool jj_py_printable(uint32_t cp) {
  int gc = sm_uc_gc(cp);
  return !(gc == SM_GC_Cc || gc == SM_GC_Cf || gc == SM_GC_Cs || gc == SM_GC_Co || gc == SM_GC_Cn || gc == SM_GC_Zl ||
           gc == SM_GC_Zp || gc == SM_GC_Zs);
}

/* ---------------- string conversions ---------------- */

static void jj_json_str(sm_buf *b, const char *s, size_t n, bool ascii) {
  sm_buf_putc(b, '"');
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    char esc[16];
    if (c == '"') sm_buf_puts(b, "\\\""), i++;
    else if (c == '\\') sm_buf_puts(b, "\\\\"), i++;
    else if (c == '\n') sm_buf_puts(b, "\\n"), i++;
    else if (c == '\r') sm_buf_puts(b, "\\r"), i++;
    else if (c == '\t') sm_buf_puts(b, "\\t"), i++;
    else if (c == '\b') sm_buf_puts(b, "\\b"), i++;
    else if (c == '\f') sm_buf_puts(b, "\\f"), i++;
    else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      sm_buf_puts(b, esc);
      i++;
    } else if (ascii && c >= 0x7f) {
      int32_t cp;
      size_t l = jj_utf8_next(s, n, i, &cp);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else snprintf(esc, sizeof esc, "\\u%04x", cp);
      sm_buf_puts(b, esc);
      i += l;
    } else sm_buf_putc(b, (char)c), i++;
  }
  sm_buf_putc(b, '"');
}

static void json_newline(sm_buf *b, const json_opts *o, int depth) {
  sm_buf_putc(b, '\n');
  for (int k = 0; k < depth; k++)
    if (o->indent_str) sm_buf_put(b, o->indent_str, o->indent_len);
    else
      for (int j = 0; j < o->indent; j++) sm_buf_putc(b, ' ');
}

void jj_to_json(jj_rt *r, sm_buf *b, const jv *v, const json_opts *o, int depth) {
  if (depth > 500) jj_fail(r, "tojson: value nested too deeply");
  char num[64];
  if (v->t == V_UNDEF || v->t == V_FUNC || v->t == V_LOOP || v->t == V_NS || (v->t == V_LIST && v->lk != LK_LIST))
    jj_fail(r, "TypeError: Object of type %s is not JSON serializable", jj_tname(v));
  switch (v->t) {
    case V_NONE: sm_buf_puts(b, "null"); return;
    case V_BOOL: sm_buf_puts(b, v->u.b ? "true" : "false"); return;
    case V_INT:
      snprintf(num, sizeof num, "%lld", (long long)v->u.i);
      sm_buf_puts(b, num);
      return;
    case V_FLOAT:
      if (isnan(v->u.f)) sm_buf_puts(b, "NaN");
      else if (isinf(v->u.f)) sm_buf_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
      else jj_py_float(v->u.f, num, sizeof num), sm_buf_puts(b, num);
      return;
    case V_STR: jj_json_str(b, v->u.s.s, v->u.s.n, o->ensure_ascii); return;
    case V_LIST:
    case V_DICT: {
      const char *item_sep = o->item_sep ? o->item_sep : o->pretty ? "," : ", ";
      const char *key_sep = o->key_sep ? o->key_sep : ": ";
      size_t cnt = v->t == V_LIST ? v->u.l->n : v->u.d->n;
      bool ind = o->pretty && cnt > 0;
      sm_buf_putc(b, v->t == V_LIST ? '[' : '{');
      size_t *order = NULL;
      if (v->t != V_LIST) {
        order = jj_alloc(&r->arena, (cnt + 1) * sizeof(size_t));
        for (size_t i = 0; i < cnt; i++) order[i] = i;
        if (o->sort_keys && cnt > 1) {
          /* insertion sort by key (byte order) */
          for (size_t i = 1; i < cnt; i++) {
            size_t x = order[i], j = i;
            while (j > 0) {
              jstr ka = v->u.d->k[order[j - 1]], kb = v->u.d->k[x];
              size_t m = ka.n < kb.n ? ka.n : kb.n;
              int c = memcmp(ka.s, kb.s, m);
              if (c > 0 || (c == 0 && ka.n > kb.n)) {
                order[j] = order[j - 1];
                j--;
              } else break;
            }
            order[j] = x;
          }
        }
      }
      for (size_t i = 0; i < cnt; i++) {
        if (i) sm_buf_puts(b, item_sep);
        if (ind) json_newline(b, o, depth + 1);
        if (v->t == V_LIST) jj_to_json(r, b, v->u.l->v[i], o, depth + 1);
        else {
          jstr k = v->u.d->k[order[i]];
          jj_json_str(b, k.s, k.n, o->ensure_ascii);
          sm_buf_puts(b, key_sep);
          jj_to_json(r, b, v->u.d->v[order[i]], o, depth + 1);
        }
      }
      if (ind) json_newline(b, o, depth);
      sm_buf_putc(b, v->t == V_LIST ? ']' : '}');
      return;
    }
    default: return;
  }
}

/* Python's repr() of a float (shortest round-trip digits; exponent form below 1e-4 and from 1e16) */
void jj_py_float(double d, char *out, size_t outn) {
  if (isnan(d)) {
    snprintf(out, outn, "nan");
    return;
  }
  if (isinf(d)) {
    snprintf(out, outn, d < 0 ? "-inf" : "inf");
    return;
  }
  if (d == 0) {
    snprintf(out, outn, signbit(d) ? "-0.0" : "0.0");
    return;
  }
  char tmp[64];
  int p;
  for (p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, d);
    if (strtod(tmp, NULL) == d) break;
  }
  if (p > 17) snprintf(tmp, sizeof tmp, "%.16e", d);
  char digits[32];
  int k = 0;
  const char *q = tmp;
  bool neg = *q == '-';
  if (neg) q++;
  for (; *q && *q != 'e'; q++)
    if (*q >= '0' && *q <= '9') digits[k++] = *q;
  digits[k] = 0;
  int e = atoi(q + 1); /* value = 0.d1d2... * 10^(e+1) */
  while (k > 1 && digits[k - 1] == '0') digits[--k] = 0;
  char buf[64];
  int o = 0;
  if (neg) buf[o++] = '-';
  if (e >= -4 && e < 16) {
    if (e < 0) {
      buf[o++] = '0', buf[o++] = '.';
      for (int i = 0; i < -e - 1; i++) buf[o++] = '0';
      for (int i = 0; i < k; i++) buf[o++] = digits[i];
    } else {
      for (int i = 0; i <= e; i++) buf[o++] = i < k ? digits[i] : '0';
      buf[o++] = '.';
      if (k > e + 1)
        for (int i = e + 1; i < k; i++) buf[o++] = digits[i];
      else buf[o++] = '0';
    }
  } else {
    buf[o++] = digits[0];
    if (k > 1) {
      buf[o++] = '.';
      for (int i = 1; i < k; i++) buf[o++] = digits[i];
    }
    o += snprintf(buf + o, sizeof buf - (size_t)o, "e%c%02d", e < 0 ? '-' : '+', abs(e));
  }
  buf[o] = 0;
  snprintf(out, outn, "%s", buf);
}

/* Python's repr() of a string */
static void py_repr_str(sm_buf *b, const char *s, size_t n) {
  bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
  char qc = sq && !dq ? '"' : '\'';
  sm_buf_putc(b, qc);
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t l = jj_utf8_next(s, n, i, &cp);
    if (cp == qc || cp == '\\') sm_buf_putc(b, '\\'), sm_buf_putc(b, (char)cp);
    else if (cp == '\n') sm_buf_puts(b, "\\n");
    else if (cp == '\r') sm_buf_puts(b, "\\r");
    else if (cp == '\t') sm_buf_puts(b, "\\t");
    else if (cp < 0x20 || cp == 0x7f) sm_buf_printf(b, "\\x%02x", (unsigned)cp);
    else if (cp >= 0x80 && !jj_py_printable((uint32_t)cp)) {
      if (cp < 0x100) sm_buf_printf(b, "\\x%02x", (unsigned)cp);
      else if (cp < 0x10000) sm_buf_printf(b, "\\u%04x", (unsigned)cp);
      else sm_buf_printf(b, "\\U%08x", (unsigned)cp);
    } else sm_buf_put(b, s + i, l);
    i += l;
  }
  sm_buf_putc(b, qc);
}

/* Python's repr() (containers print their items this way) */
static void py_repr(jj_rt *r, sm_buf *b, const jv *v, int depth) {
  if (depth > 500) jj_fail(r, "value nested too deeply");
  switch (v->t) {
    case V_STR: py_repr_str(b, v->u.s.s, v->u.s.n); return;
    case V_UNDEF: sm_buf_puts(b, "Undefined"); return;
    case V_LIST:
      if (v->lk == LK_GEN || v->lk == LK_REVITER) { /* Python adds the object's address */
        sm_buf_printf(b, "<%s object>", jj_tname(v));
        return;
      }
      if (v->lk == LK_RANGE) {
        const int64_t *g = v->u.l->range;
        sm_buf_printf(b, g[2] == 1 ? "range(%lld, %lld)" : "range(%lld, %lld, %lld)", (long long)g[0], (long long)g[1],
                      (long long)g[2]);
        return;
      }
      if (v->lk != LK_LIST) sm_buf_printf(b, "%s(", jj_tname(v));
      sm_buf_putc(b, v->tuple ? '(' : '[');
      for (size_t i = 0; i < v->u.l->n; i++) {
        if (i) sm_buf_puts(b, ", ");
        py_repr(r, b, v->u.l->v[i], depth + 1);
      }
      if (v->tuple && v->u.l->n == 1) sm_buf_putc(b, ',');
      sm_buf_putc(b, v->tuple ? ')' : ']');
      if (v->lk != LK_LIST) sm_buf_putc(b, ')');
      return;
    case V_DICT:
    case V_NS:
      if (v->t == V_NS) sm_buf_puts(b, "<Namespace ");
      sm_buf_putc(b, '{');
      for (size_t i = 0; i < v->u.d->n; i++) {
        if (i) sm_buf_puts(b, ", ");
        py_repr_str(b, v->u.d->k[i].s, v->u.d->k[i].n);
        sm_buf_puts(b, ": ");
        py_repr(r, b, v->u.d->v[i], depth + 1);
      }
      sm_buf_putc(b, '}');
      if (v->t == V_NS) sm_buf_putc(b, '>');
      return;
    default: jj_to_str(r, b, v);
  }
}

/* Python's str(): what {{ }} prints, |string and ~ give (undefined prints nothing) */
void jj_to_str(jj_rt *r, sm_buf *b, const jv *v) {
  char num[64];
  switch (v->t) {
    case V_UNDEF: return;
    case V_NONE: sm_buf_puts(b, "None"); return;
    case V_BOOL: sm_buf_puts(b, v->u.b ? "True" : "False"); return;
    case V_INT:
      snprintf(num, sizeof num, "%lld", (long long)v->u.i);
      sm_buf_puts(b, num);
      return;
    case V_FLOAT:
      jj_py_float(v->u.f, num, sizeof num);
      sm_buf_puts(b, num);
      return;
    case V_STR: sm_buf_put(b, v->u.s.s, v->u.s.n); return;
    case V_LIST:
    case V_DICT:
    case V_NS: py_repr(r, b, v, 0); return;
    case V_FUNC:
      if (v->u.fn->kind == F_MACRO) sm_buf_printf(b, "<Macro '%.*s'>", (int)v->u.fn->node->s.n, v->u.fn->node->s.s);
      else if (v->u.fn->kind == F_CALLER) sm_buf_puts(b, "<Macro 'caller'>");
      else sm_buf_puts(b, "<function>");
      return;
    case V_LOOP: {
      jstr in = {"index", 5}, ln = {"length", 6};
      sm_buf_puts(b, "<LoopContext ");
      jj_to_str(r, b, jj_loop_attr(r, (jv *)v, in));
      sm_buf_putc(b, '/');
      jj_to_str(r, b, jj_loop_attr(r, (jv *)v, ln));
      sm_buf_putc(b, '>');
      return;
    }
  }
}

void jj_repr(jj_rt *r, sm_buf *b, const jv *v) { py_repr(r, b, v, 0); }

/* the same (kept as a separate entry point for the concatenating operators and join) */
void jj_raw_str(jj_rt *r, sm_buf *b, const jv *v) { jj_to_str(r, b, v); }

jv *jj_str_of(jj_rt *r, const jv *v, bool raw) {
  if (v->t == V_STR) return (jv *)v;
  sm_buf *b = jj_buf(r);
  if (raw) jj_raw_str(r, b, v);
  else jj_to_str(r, b, v);
  return jj_buf_value(r, b);
}

bool jj_truthy(const jv *v) {
  switch (v->t) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0 && !isnan(v->u.f);
    case V_STR: return v->u.s.n > 0;
    case V_LIST: return v->lk == LK_GEN || v->lk == LK_REVITER || v->u.l->n > 0;
    case V_DICT: return v->u.d->n > 0;
    default: return true;
  }
}


/* identity-like equality: same type and value, numbers by value, containers by identity */
bool jj_strict_eq(const jv *a, const jv *b) {
  if (jj_is_num(a) && jj_is_num(b)) {
    if (a->t == V_INT && b->t == V_INT) return a->u.i == b->u.i;
    return jj_num_of(a) == jj_num_of(b);
  }
  if (a->t != b->t) return false;
  switch (a->t) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_BOOL: return a->u.b == b->u.b;
    case V_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.s, b->u.s.s, a->u.s.n);
    case V_LIST: return a->u.l == b->u.l;
    case V_DICT:
    case V_NS: return a->u.d == b->u.d;
    case V_FUNC: return a->u.fn == b->u.fn;
    default: return false;
  }
}


/* Python's == (numbers and booleans compare by value, containers item by item, no coercion) */
bool jj_loose_eq(jj_rt *r, const jv *a, const jv *b) {
  bool an = jj_is_num(a) || a->t == V_BOOL, bn = jj_is_num(b) || b->t == V_BOOL;
  if (an && bn) {
    if (a->t != V_FLOAT && b->t != V_FLOAT)
      return (a->t == V_BOOL ? a->u.b : a->u.i) == (b->t == V_BOOL ? b->u.b : b->u.i);
    return jj_num_of(a) == jj_num_of(b);
  }
  if (a->t == V_LIST && b->t == V_LIST) {
    if (a->u.l->n != b->u.l->n || a->tuple != b->tuple) return false;
    for (size_t i = 0; i < a->u.l->n; i++)
      if (!jj_loose_eq(r, a->u.l->v[i], b->u.l->v[i])) return false;
    return true;
  }
  if ((a->t == V_DICT && b->t == V_DICT)) {
    if (a->u.d->n != b->u.d->n) return false;
    for (size_t i = 0; i < a->u.d->n; i++) {
      jv *o = jj_dict_get(b->u.d, a->u.d->k[i].s, a->u.d->k[i].n);
      if (!o || !jj_loose_eq(r, a->u.d->v[i], o)) return false;
    }
    return true;
  }
  return jj_strict_eq(a, b);
}

/* ---------------- comparisons & sorting ---------------- */
int jj_cmp_str(jj_rt *r, const jv *a, const jv *b, bool cs) {
  const jv *x = cs ? a : jj_case_map(r, a, 0), *y = cs ? b : jj_case_map(r, b, 0);
  size_t m = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
  int c = memcmp(x->u.s.s, y->u.s.s, m);
  if (c) return c < 0 ? -1 : 1;
  return x->u.s.n < y->u.s.n ? -1 : x->u.s.n > y->u.s.n ? 1 : 0;
}
int jj_compare(jj_rt *r, const jv *a, const jv *b, bool cs) {
  if (a->t == V_NONE && b->t == V_NONE) return 0;
  if (a->t == V_NONE || b->t == V_NONE) jj_fail(r, "Cannot compare %s with %s", jj_tname(a), jj_tname(b));
  if (a->t == V_UNDEF && b->t == V_UNDEF) return 0;
  if (a->t == V_UNDEF || b->t == V_UNDEF) jj_fail(r, "Cannot compare %s with %s", jj_tname(a), jj_tname(b));
  bool an = jj_is_num(a) || a->t == V_BOOL, bn = jj_is_num(b) || b->t == V_BOOL;
  if (an && bn) {
    double x = jj_num_of(a), y = jj_num_of(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a->t != b->t) jj_fail(r, "Cannot compare different types: %s and %s", jj_tname(a), jj_tname(b));
  if (a->t == V_STR) return jj_cmp_str(r, a, b, cs);
  jj_fail(r, "Cannot compare type: %s", jj_tname(a));
}

typedef struct {
  jj_rt *r;
  bool cs, rev;
  jv *attr; /* NULL, or string path */
} sort_ctx;

/* Jinja2's make_attrgetter: getitem for each dot-separated part, digits as integers */
jv *jj_attr_path(jj_rt *r, jv *item, const char *path, size_t n) {
  jv *v = item;
  size_t i = 0;
  while (i <= n) {
    size_t j = i;
    bool digits = true;
    while (j < n && path[j] != '.') digits = digits && path[j] >= '0' && path[j] <= '9', j++;
    jv *key;
    if (digits && j > i && j - i < 18) {
      char buf[24];
      memcpy(buf, path + i, j - i);
      buf[j - i] = 0;
      key = jj_int(r, strtoll(buf, NULL, 10));
    } else key = jj_strn(r, path + i, j - i);
    v = jj_getitem(r, v, key);
    i = j + 1;
  }
  return v;
}

static int sort_cmp(sort_ctx *c, jv *a, jv *b) {
  if (c->attr) {
    a = jj_attr_path(c->r, a, c->attr->u.s.s, c->attr->u.s.n);
    b = jj_attr_path(c->r, b, c->attr->u.s.s, c->attr->u.s.n);
  }
  int x = jj_compare(c->r, a, b, c->cs);
  return c->rev ? -x : x;
}
static void merge_sort(sort_ctx *c, jv **v, jv **tmp, size_t n) {
  if (n < 2) return;
  size_t m = n / 2;
  merge_sort(c, v, tmp, m);
  merge_sort(c, v + m, tmp, n - m);
  size_t i = 0, j = m, k = 0;
  while (i < m && j < n) tmp[k++] = sort_cmp(c, v[j], v[i]) < 0 ? v[j++] : v[i++];
  while (i < m) tmp[k++] = v[i++];
  while (j < n) tmp[k++] = v[j++];
  memcpy(v, tmp, n * sizeof(jv *));
}
jv *jj_sorted(jj_rt *r, jv *l, bool rev, bool cs, jv *attr) {
  jv *o = jj_list_new(r);
  for (size_t i = 0; i < l->u.l->n; i++) jj_list_push(r, o, l->u.l->v[i]);
  sort_ctx c = {r, cs, rev, attr};
  jv **tmp = jj_alloc(&r->arena, (o->u.l->n + 1) * sizeof(jv *));
  merge_sort(&c, o->u.l->v, tmp, o->u.l->n);
  return o;
}

bool jj_is_iter(const jv *v) { return v->t == V_LIST && (v->lk == LK_GEN || v->lk == LK_REVITER); }

jv *jj_iterate(jj_rt *r, jv *v) {
  switch (v->t) {
    case V_UNDEF: return jj_list_new(r);
    case V_STR: return jj_chars_of(r, v);
    case V_DICT: return jj_dict_keys(r, v);
    case V_LIST: {
      if (!jj_is_iter(v) && !v->tuple && v->lk == LK_LIST) return v;
      jv *o = jj_list_new(r);
      for (size_t i = jj_is_iter(v) ? v->u.l->pos : 0; i < v->u.l->n; i++) jj_list_push(r, o, v->u.l->v[i]);
      if (jj_is_iter(v)) v->u.l->pos = v->u.l->n;
      return o;
    }
    default: jj_fail(r, "TypeError: '%s' object is not iterable", jj_tname(v));
  }
}

int64_t jj_len(jj_rt *r, const jv *v) {
  switch (v->t) {
    case V_UNDEF: return 0;
    case V_STR: return (int64_t)jj_cp_count(v->u.s.s, v->u.s.n);
    case V_DICT: return (int64_t)v->u.d->n;
    case V_LIST:
      if (!jj_is_iter(v)) return (int64_t)v->u.l->n;
      /* fall through */
    default: jj_fail(r, "TypeError: object of type '%s' has no len()", jj_tname(v));
  }
}

jv *jj_chars_of(jj_rt *r, jv *s) {
  jv *l = jj_list_new(r);
  for (size_t i = 0; i < s->u.s.n;) {
    size_t k = jj_utf8_next(s->u.s.s, s->u.s.n, i, NULL);
    jstr c = {s->u.s.s + i, k};
    jj_list_push(r, l, jj_jstr(r, c));
    i += k;
  }
  return l;
}

jv *jj_dict_items(jj_rt *r, jv *d) {
  jv *l = jj_list_new(r);
  for (size_t i = 0; i < d->u.d->n; i++) {
    jv *p = jj_list_new(r);
    p->tuple = 1;
    jj_list_push(r, p, jj_jstr(r, d->u.d->k[i]));
    jj_list_push(r, p, d->u.d->v[i]);
    jj_list_push(r, l, p);
  }
  return l;
}
jv *jj_dict_keys(jj_rt *r, jv *d) {
  jv *l = jj_list_new(r);
  for (size_t i = 0; i < d->u.d->n; i++) jj_list_push(r, l, jj_jstr(r, d->u.d->k[i]));
  return l;
}
jv *jj_dict_values(jj_rt *r, jv *d) {
  jv *l = jj_list_new(r);
  for (size_t i = 0; i < d->u.d->n; i++) jj_list_push(r, l, d->u.d->v[i]);
  return l;
}

/* ---------------- call arguments ---------------- */
jv *jj_arg(jv *args, jv *kwargs, size_t i, const char *name) {
  if (args && i < args->u.l->n) return args->u.l->v[i];
  if (kwargs && name) return jj_dict_get(kwargs->u.d, name, strlen(name));
  return NULL;
}

jv *jj_arith_int(jj_rt *r, int op, int64_t a, int64_t b) {
  int64_t res;
  switch (op) {
    case OP_ADD:
      if (__builtin_add_overflow(a, b, &res)) jj_fail(r, "integer overflow");
      return jj_int(r, res);
    case OP_SUB:
      if (__builtin_sub_overflow(a, b, &res)) jj_fail(r, "integer overflow");
      return jj_int(r, res);
    case OP_MUL:
      if (__builtin_mul_overflow(a, b, &res)) jj_fail(r, "integer overflow");
      return jj_int(r, res);
    case OP_FLOORDIV: {
      if (b == 0) jj_fail(r, "division by zero");
      if (a == INT64_MIN && b == -1) jj_fail(r, "integer overflow");
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
      return jj_int(r, q);
    }
    case OP_MOD: { /* Python: the result has the sign of the divisor */
      if (b == 0) jj_fail(r, "modulo by zero");
      if (b == -1) return jj_int(r, 0);
      int64_t m = a % b;
      if (m != 0 && (m < 0) != (b < 0)) m += b;
      return jj_int(r, m);
    }
  }
  return NULL;
}
