/* Chat-template interpreter: runtime values, evaluation, filters, tests, methods.
 * Mirrors @huggingface/jinja's runtime.ts; see jinja_int.h for the design. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>
#include "tokenizer/chat.h"
#include "tokenizer/jinja_int.h"

typedef struct {
  jj_arena arena;
  jmp_buf jb;
  char err[512];
  int line, depth, ctl; /* ctl: 1 break, 2 continue */
  long iters;
  jv *undef, *none, *vtrue, *vfalse;
} R;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

__attribute__((format(printf, 2, 3), noreturn)) static void fail(R *r, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(r->err, sizeof r->err, "line %d: %s", r->line, msg);
  longjmp(r->jb, 1);
}

static const char *tname(const jv *v) {
  static const char *n[] = {"UndefinedValue", "NullValue", "BooleanValue", "IntegerValue", "FloatValue",
                            "StringValue", "ArrayValue", "ObjectValue", "NamespaceValue", "FunctionValue"};
  if (v->t == V_LIST && v->tuple) return "TupleValue";
  if (v->t == V_DICT && v->kwargs) return "KeywordArgumentsValue";
  return n[v->t];
}

/* ---------------- value constructors ---------------- */
static jv *nv(R *r, jj_vtype t) {
  jv *v = jj_calloc(&r->arena, sizeof *v);
  v->t = (uint8_t)t;
  return v;
}
static jv *v_int(R *r, int64_t i) {
  jv *v = nv(r, V_INT);
  v->u.i = i;
  return v;
}
static jv *v_float(R *r, double f) {
  jv *v = nv(r, V_FLOAT);
  v->u.f = f;
  return v;
}
static jv *v_bool(R *r, bool b) { return b ? r->vtrue : r->vfalse; }
static jv *v_strn(R *r, const char *s, size_t n) {
  jv *v = nv(r, V_STR);
  char *p = jj_alloc(&r->arena, n + 1);
  if (n) memcpy(p, s, n);
  p[n] = 0;
  v->u.s.s = p;
  v->u.s.n = n;
  return v;
}
static jv *v_jstr(R *r, jstr s) { /* no copy: s must live as long as the render */
  jv *v = nv(r, V_STR);
  v->u.s = s;
  return v;
}
static jv *v_cstr(R *r, const char *s) { return v_strn(r, s, strlen(s)); }
static jv *v_list(R *r) {
  jv *v = nv(r, V_LIST);
  v->u.l = jj_calloc(&r->arena, sizeof(jj_list));
  return v;
}
static void list_push(R *r, jv *l, jv *x) {
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
static jv *v_dict(R *r, jj_vtype t) {
  jv *v = nv(r, t);
  v->u.d = jj_calloc(&r->arena, sizeof(jj_dict));
  return v;
}
static bool jeq(jstr a, const char *s, size_t n) { return a.n == n && !memcmp(a.s, s, n); }
static bool jeqs(jstr a, const char *s) { return jeq(a, s, strlen(s)); }
static jv **dict_slot(jj_dict *d, const char *k, size_t n) {
  for (size_t i = 0; i < d->n; i++)
    if (jeq(d->k[i], k, n)) return &d->v[i];
  return NULL;
}
static jv *dict_get(jj_dict *d, const char *k, size_t n) {
  jv **s = dict_slot(d, k, n);
  return s ? *s : NULL;
}
static void dict_setj(R *r, jj_dict *d, jstr k, jv *x) {
  jv **s = dict_slot(d, k.s, k.n);
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
static void dict_set(R *r, jj_dict *d, const char *k, jv *x) {
  size_t n = strlen(k);
  jstr s = {jj_alloc(&r->arena, n + 1), n};
  memcpy((char *)s.s, k, n + 1);
  dict_setj(r, d, s, x);
}
static jv *v_func(R *r, jj_funckind k, jv *self) {
  jv *v = nv(r, V_FUNC);
  v->u.fn = jj_calloc(&r->arena, sizeof(jj_func));
  v->u.fn->kind = k;
  v->u.fn->self = self;
  return v;
}

/* ---------------- environments ---------------- */
static jj_env *env_new(R *r, jj_env *parent) {
  jj_env *e = jj_calloc(&r->arena, sizeof *e);
  e->parent = parent;
  return e;
}
static void env_set(R *r, jj_env *e, jstr name, jv *v) { dict_setj(r, &e->vars, name, v); }
static jv *env_get(jj_env *e, jstr name) {
  for (; e; e = e->parent) {
    jv *v = dict_get(&e->vars, name.s, name.n);
    if (v) return v;
  }
  return NULL;
}

/* ---------------- JSON input ---------------- */
static jv *from_json(R *r, const cJSON *j, int depth) {
  if (depth > 200) fail(r, "context nested too deeply");
  if (!j || cJSON_IsNull(j)) return r->none;
  if (cJSON_IsBool(j)) return v_bool(r, cJSON_IsTrue(j));
  if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (isfinite(d) && d == trunc(d) && fabs(d) < 9.2e18) return v_int(r, (int64_t)d);
    return v_float(r, d);
  }
  if (cJSON_IsString(j)) return v_cstr(r, j->valuestring ? j->valuestring : "");
  if (cJSON_IsArray(j)) {
    jv *l = v_list(r);
    for (const cJSON *c = j->child; c; c = c->next) list_push(r, l, from_json(r, c, depth + 1));
    return l;
  }
  if (cJSON_IsObject(j)) {
    jv *d = v_dict(r, V_DICT);
    for (const cJSON *c = j->child; c; c = c->next) dict_set(r, d->u.d, c->string ? c->string : "", from_json(r, c, depth + 1));
    return d;
  }
  return r->none;
}

/* ---------------- number formatting (JavaScript Number#toString) ---------------- */
static void js_num(double d, char *out, size_t outn) {
  if (isnan(d)) {
    snprintf(out, outn, "NaN");
    return;
  }
  if (isinf(d)) {
    snprintf(out, outn, d < 0 ? "-Infinity" : "Infinity");
    return;
  }
  if (d == 0) {
    snprintf(out, outn, "0");
    return;
  }
  char tmp[64];
  int p;
  for (p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, d);
    if (strtod(tmp, NULL) == d) break;
  }
  if (p > 17) p = 17, snprintf(tmp, sizeof tmp, "%.*e", 16, d);
  char digits[32];
  int k = 0;
  const char *q = tmp;
  bool neg = false;
  if (*q == '-') neg = true, q++;
  for (; *q && *q != 'e'; q++)
    if (*q >= '0' && *q <= '9') digits[k++] = *q;
  digits[k] = 0;
  int e = atoi(q + 1);
  while (k > 1 && digits[k - 1] == '0') digits[--k] = 0;
  int n = e + 1;
  char buf[64];
  int o = 0;
  if (neg) buf[o++] = '-';
  if (k <= n && n <= 21) {
    for (int i = 0; i < k; i++) buf[o++] = digits[i];
    for (int i = 0; i < n - k; i++) buf[o++] = '0';
  } else if (0 < n && n <= 21) {
    for (int i = 0; i < n; i++) buf[o++] = digits[i];
    buf[o++] = '.';
    for (int i = n; i < k; i++) buf[o++] = digits[i];
  } else if (-6 < n && n <= 0) {
    buf[o++] = '0';
    buf[o++] = '.';
    for (int i = 0; i < -n; i++) buf[o++] = '0';
    for (int i = 0; i < k; i++) buf[o++] = digits[i];
  } else {
    buf[o++] = digits[0];
    if (k > 1) {
      buf[o++] = '.';
      for (int i = 1; i < k; i++) buf[o++] = digits[i];
    }
    o += snprintf(buf + o, sizeof buf - (size_t)o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
  }
  buf[o] = 0;
  snprintf(out, outn, "%s", buf);
}

static void float_str(double d, char *out, size_t outn) {
  if (d == 0 && signbit(d)) snprintf(out, outn, "-0.0");
  else if (isfinite(d) && d == trunc(d) && fabs(d) < 1e21) snprintf(out, outn, "%.1f", d);
  else js_num(d, out, outn);
}

/* ---------------- string conversions ---------------- */
typedef struct {
  int indent; /* 0 = none */
  bool ensure_ascii, sort_keys, undef_null;
  const char *item_sep, *key_sep;
} json_opts;

static void json_str(jj_sb *b, const char *s, size_t n, bool ascii) {
  jj_sb_addc(b, '"');
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    char esc[16];
    if (c == '"') jj_sb_adds(b, "\\\""), i++;
    else if (c == '\\') jj_sb_adds(b, "\\\\"), i++;
    else if (c == '\n') jj_sb_adds(b, "\\n"), i++;
    else if (c == '\r') jj_sb_adds(b, "\\r"), i++;
    else if (c == '\t') jj_sb_adds(b, "\\t"), i++;
    else if (c == '\b') jj_sb_adds(b, "\\b"), i++;
    else if (c == '\f') jj_sb_adds(b, "\\f"), i++;
    else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      jj_sb_adds(b, esc);
      i++;
    } else if (ascii && c >= 0x7f) {
      int32_t cp;
      size_t l = jj_utf8_next(s, n, i, &cp);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else
        snprintf(esc, sizeof esc, "\\u%04x", cp);
      jj_sb_adds(b, esc);
      i += l;
    } else
      jj_sb_addc(b, (char)c), i++;
  }
  jj_sb_addc(b, '"');
}

static void to_json(R *r, jj_sb *b, const jv *v, const json_opts *o, int depth) {
  if (depth > 500) fail(r, "tojson: value nested too deeply");
  char num[64];
  switch (v->t) {
    case V_NONE: jj_sb_adds(b, "null"); return;
    case V_UNDEF: jj_sb_adds(b, o->undef_null ? "null" : "undefined"); return;
    case V_BOOL: jj_sb_adds(b, v->u.b ? "true" : "false"); return;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->u.i); jj_sb_adds(b, num); return;
    case V_FLOAT:
      if (!isfinite(v->u.f)) jj_sb_adds(b, "null");
      else js_num(v->u.f, num, sizeof num), jj_sb_adds(b, num);
      return;
    case V_STR: json_str(b, v->u.s.s, v->u.s.n, o->ensure_ascii); return;
    case V_LIST:
    case V_DICT:
    case V_NS: {
      const char *item_sep = o->item_sep ? o->item_sep : o->indent ? "," : ", ";
      const char *key_sep = o->key_sep ? o->key_sep : ": ";
      size_t cnt = v->t == V_LIST ? v->u.l->n : v->u.d->n;
      bool ind = o->indent > 0 && cnt > 0;
      jj_sb_addc(b, v->t == V_LIST ? '[' : '{');
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
              } else
                break;
            }
            order[j] = x;
          }
        }
      }
      for (size_t i = 0; i < cnt; i++) {
        if (i) jj_sb_adds(b, item_sep);
        if (ind) {
          jj_sb_addc(b, '\n');
          for (int k = 0; k < (depth + 1) * o->indent; k++) jj_sb_addc(b, ' ');
        }
        if (v->t == V_LIST) to_json(r, b, v->u.l->v[i], o, depth + 1);
        else {
          jstr k = v->u.d->k[order[i]];
          json_str(b, k.s, k.n, o->ensure_ascii);
          jj_sb_adds(b, key_sep);
          to_json(r, b, v->u.d->v[order[i]], o, depth + 1);
        }
      }
      if (ind) {
        jj_sb_addc(b, '\n');
        for (int k = 0; k < depth * o->indent; k++) jj_sb_addc(b, ' ');
      }
      jj_sb_addc(b, v->t == V_LIST ? ']' : '}');
      return;
    }
    case V_FUNC: fail(r, "Cannot convert to JSON: FunctionValue");
  }
}

/* RuntimeValue#toString (what {{ }} prints) */
static void to_str(R *r, jj_sb *b, const jv *v) {
  char num[64];
  switch (v->t) {
    case V_UNDEF: jj_sb_adds(b, "undefined"); return;
    case V_NONE: jj_sb_adds(b, "null"); return;
    case V_BOOL: jj_sb_adds(b, v->u.b ? "true" : "false"); return;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->u.i); jj_sb_adds(b, num); return;
    case V_FLOAT: float_str(v->u.f, num, sizeof num); jj_sb_adds(b, num); return;
    case V_STR: jj_sb_add(b, v->u.s.s, v->u.s.n); return;
    case V_LIST:
    case V_DICT:
    case V_NS: {
      json_opts o = {0};
      to_json(r, b, v, &o, 0);
      return;
    }
    case V_FUNC: jj_sb_adds(b, "[function]"); return;
  }
}

/* JavaScript `value.toString()` of the raw value (used by ~, + and join) */
static void raw_str(R *r, jj_sb *b, const jv *v) {
  char num[64];
  switch (v->t) {
    case V_UNDEF:
    case V_NONE: return; /* Array#join renders null/undefined as "" */
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->u.i); jj_sb_adds(b, num); return;
    case V_FLOAT: js_num(v->u.f, num, sizeof num); jj_sb_adds(b, num); return;
    case V_LIST:
      for (size_t i = 0; i < v->u.l->n; i++) {
        if (i) jj_sb_addc(b, ',');
        to_str(r, b, v->u.l->v[i]);
      }
      return;
    case V_DICT:
    case V_NS: jj_sb_adds(b, "[object Map]"); return;
    default: to_str(r, b, v);
  }
}

static jv *str_of(R *r, const jv *v, bool raw) {
  if (v->t == V_STR) return (jv *)v;
  jj_sb b;
  jj_sb_init(&b, &r->arena);
  if (raw) raw_str(r, &b, v);
  else to_str(r, &b, v);
  return v_jstr(r, jj_sb_str(&b));
}

static bool truthy(const jv *v) {
  switch (v->t) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0 && !isnan(v->u.f);
    case V_STR: return v->u.s.n > 0;
    case V_LIST: return v->u.l->n > 0;
    case V_DICT: return v->u.d->n > 0;
    default: return true;
  }
}

static bool is_num(const jv *v) { return v->t == V_INT || v->t == V_FLOAT; }
static double num_of(const jv *v) {
  return v->t == V_INT ? (double)v->u.i : v->t == V_FLOAT ? v->u.f : v->t == V_BOOL ? (double)v->u.b : NAN;
}

/* JS `===` on the raw values */
static bool strict_eq(const jv *a, const jv *b) {
  if (is_num(a) && is_num(b)) {
    if (a->t == V_INT && b->t == V_INT) return a->u.i == b->u.i;
    return num_of(a) == num_of(b);
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

/* JS Number(string) */
static double js_to_number(const char *s, size_t n) {
  size_t i = 0, l;
  while (i < n && jj_is_space_at(s, n, i, &l)) i += l;
  size_t e = n;
  while (e > i) {
    size_t st = e - 1;
    while (st > i && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
    if (jj_is_space_at(s, n, st, &l) && st + l == e) e = st;
    else break;
  }
  if (i == e) return 0;
  char buf[128];
  size_t m = e - i;
  if (m >= sizeof buf) return NAN;
  memcpy(buf, s + i, m);
  buf[m] = 0;
  if (!strcmp(buf, "Infinity") || !strcmp(buf, "+Infinity")) return INFINITY;
  if (!strcmp(buf, "-Infinity")) return -INFINITY;
  for (size_t k = 0; k < m; k++)
    if (!strchr("0123456789+-.eE", buf[k]) && !(k == 1 && (buf[k] == 'x' || buf[k] == 'X'))) return NAN;
  char *end;
  double d = strtod(buf, &end);
  if (*end) return NAN;
  return d;
}

/* JS loose `==` on the raw values */
static bool loose_eq(R *r, const jv *a, const jv *b) {
  bool an = a->t == V_NONE || a->t == V_UNDEF, bn = b->t == V_NONE || b->t == V_UNDEF;
  if (an || bn) return an && bn;
  if (a->t == b->t || (is_num(a) && is_num(b))) return strict_eq(a, b);
  if (a->t == V_BOOL) {
    jv t = {.t = V_INT};
    t.u.i = a->u.b;
    return loose_eq(r, &t, b);
  }
  if (b->t == V_BOOL) {
    jv t = {.t = V_INT};
    t.u.i = b->u.b;
    return loose_eq(r, a, &t);
  }
  if (is_num(a) && b->t == V_STR) return num_of(a) == js_to_number(b->u.s.s, b->u.s.n);
  if (is_num(b) && a->t == V_STR) return num_of(b) == js_to_number(a->u.s.s, a->u.s.n);
  bool ac = a->t == V_LIST || a->t == V_DICT || a->t == V_NS || a->t == V_FUNC;
  bool bc = b->t == V_LIST || b->t == V_DICT || b->t == V_NS || b->t == V_FUNC;
  if (ac && bc) return false; /* different container types */
  if (ac) return loose_eq(r, str_of(r, a, true), b);
  if (bc) return loose_eq(r, a, str_of(r, b, true));
  return false;
}

/* ---------------- unicode helpers ---------------- */
static size_t cp_count(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n;) i += jj_utf8_next(s, n, i, NULL), c++;
  return c;
}
static jv *case_map(R *r, const jv *v, int mode /* 0 lower, 1 upper */) {
  jj_sb b;
  jj_sb_init(&b, &r->arena);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n;
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t l = jj_utf8_next(s, n, i, &cp);
    int32_t m = mode ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
    if (m == cp || cp < 0) jj_sb_add(&b, s + i, l);
    else {
      utf8proc_uint8_t o[4];
      utf8proc_ssize_t ol = utf8proc_encode_char(m, o);
      jj_sb_add(&b, (const char *)o, (size_t)ol);
    }
    i += l;
  }
  return v_jstr(r, jj_sb_str(&b));
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
static jv *strip(R *r, const jv *v, int which, const jv *chars) {
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
  return v_jstr(r, o);
}
static bool ascii_word(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static jv *title_case(R *r, const jv *v) { /* JS: value.replace(/\b\w/g, c => c.toUpperCase()) */
  jv *o = v_strn(r, v->u.s.s, v->u.s.n);
  char *p = (char *)o->u.s.s;
  for (size_t i = 0; i < o->u.s.n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (ascii_word(c) && (i == 0 || !ascii_word((unsigned char)v->u.s.s[i - 1])) && c >= 'a' && c <= 'z')
      p[i] = (char)(c - 32);
  }
  return o;
}
static jv *capitalize(R *r, const jv *v) {
  if (!v->u.s.n) return (jv *)v;
  int32_t cp;
  size_t l = jj_utf8_next(v->u.s.s, v->u.s.n, 0, &cp);
  jv first = {.t = V_STR};
  first.u.s.s = v->u.s.s;
  first.u.s.n = l;
  jv *u = case_map(r, &first, 1);
  jj_sb b;
  jj_sb_init(&b, &r->arena);
  jj_sb_add(&b, u->u.s.s, u->u.s.n);
  jj_sb_add(&b, v->u.s.s + l, v->u.s.n - l);
  return v_jstr(r, jj_sb_str(&b));
}
static const char *memmem_(const char *h, size_t hn, const char *n, size_t nn) {
  if (!nn) return h;
  if (nn > hn) return NULL;
  for (size_t i = 0; i + nn <= hn; i++)
    if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
  return NULL;
}
static jv *str_replace(R *r, const jv *v, const jv *old, const jv *new_, int64_t count) {
  if (count == 0) return (jv *)v;
  int64_t remaining = count < 0 ? INT64_MAX : count;
  jj_sb b;
  jj_sb_init(&b, &r->arena);
  const char *s = v->u.s.s;
  size_t n = v->u.s.n;
  if (old->u.s.n == 0) {
    for (size_t i = 0;;) {
      if (remaining > 0) jj_sb_add(&b, new_->u.s.s, new_->u.s.n), remaining--;
      if (i >= n) break;
      size_t l = jj_utf8_next(s, n, i, NULL);
      jj_sb_add(&b, s + i, l);
      i += l;
    }
    return v_jstr(r, jj_sb_str(&b));
  }
  size_t i = 0;
  while (i < n) {
    const char *f = remaining > 0 ? memmem_(s + i, n - i, old->u.s.s, old->u.s.n) : NULL;
    if (!f) break;
    jj_sb_add(&b, s + i, (size_t)(f - (s + i)));
    jj_sb_add(&b, new_->u.s.s, new_->u.s.n);
    i = (size_t)(f - s) + old->u.s.n;
    remaining--;
  }
  jj_sb_add(&b, s + i, n - i);
  return v_jstr(r, jj_sb_str(&b));
}

/* ---------------- forward decls ---------------- */
static jv *eval(R *r, const jj_node *n, jj_env *env);
static void exec_block(R *r, const jj_nodes *body, jj_env *env, jj_sb *out);
static jv *call_func(R *r, jv *fn, jv *args, jv *kwargs, jj_env *env);
static bool run_test(R *r, jstr name, jv *v, jv *args, int nargs);
static jv *apply_filter(R *r, jv *v, jstr name, jv *args, jv *kwargs, jj_env *env);

static void check_iter(R *r) {
  if (++r->iters > JJ_MAX_ITERATIONS) fail(r, "iteration limit exceeded");
}

/* ---------------- arguments ---------------- */
static void eval_args(R *r, const jj_nodes *an, jj_env *env, jv **args, jv **kwargs) {
  jv *a = v_list(r), *k = v_dict(r, V_DICT);
  k->kwargs = 1;
  for (int i = 0; i < an->n; i++) {
    const jj_node *x = an->v[i];
    if (x->kind == N_SPREAD) {
      jv *v = eval(r, x->a, env);
      if (v->t != V_LIST) fail(r, "Cannot unpack non-iterable type: %s", tname(v));
      for (size_t j = 0; j < v->u.l->n; j++) list_push(r, a, v->u.l->v[j]);
    } else if (x->kind != N_KWARG && x->kind != N_KWSPREAD)
      list_push(r, a, eval(r, x, env));
  }
  for (int i = 0; i < an->n; i++) {
    const jj_node *x = an->v[i];
    if (x->kind == N_KWARG) {
      if (dict_get(k->u.d, x->s.s, x->s.n))
        fail(r, "Got multiple values for keyword argument '%.*s'", (int)x->s.n, x->s.s);
      dict_setj(r, k->u.d, x->s, eval(r, x->a, env));
    } else if (x->kind == N_KWSPREAD) {
      jv *v = eval(r, x->a, env);
      if (v->t != V_DICT) fail(r, "Argument after ** must be a mapping, not %s", tname(v));
      for (size_t j = 0; j < v->u.d->n; j++) {
        if (dict_get(k->u.d, v->u.d->k[j].s, v->u.d->k[j].n))
          fail(r, "Got multiple values for keyword argument '%.*s'", (int)v->u.d->k[j].n, v->u.d->k[j].s);
        dict_setj(r, k->u.d, v->u.d->k[j], v->u.d->v[j]);
      }
    }
  }
  *args = a;
  *kwargs = k;
}
/* positional i, else keyword name, else NULL */
static jv *arg(jv *args, jv *kwargs, size_t i, const char *name) {
  if (args && i < args->u.l->n) return args->u.l->v[i];
  if (kwargs && name) return dict_get(kwargs->u.d, name, strlen(name));
  return NULL;
}
static size_t nargs(jv *args) { return args ? args->u.l->n : 0; }

/* ---------------- member access / slicing ---------------- */
static jv *builtin_member(R *r, jv *obj, jstr name) {
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
    if (jeqs(name, "length")) return v_int(r, (int64_t)cp_count(obj->u.s.s, obj->u.s.n));
    for (size_t i = 0; i < sizeof M / sizeof M[0]; i++)
      if (jeqs(name, M[i].n)) return v_func(r, M[i].k, obj);
    return NULL;
  }
  if (obj->t == V_LIST) {
    if (jeqs(name, "length")) return v_int(r, (int64_t)obj->u.l->n);
    return NULL;
  }
  if (obj->t == V_DICT) {
    if (jeqs(name, "get")) return v_func(r, M_DICT_GET, obj);
    if (jeqs(name, "items")) return v_func(r, M_DICT_ITEMS, obj);
    if (jeqs(name, "keys")) return v_func(r, M_DICT_KEYS, obj);
    if (jeqs(name, "values")) return v_func(r, M_DICT_VALUES, obj);
    if (jeqs(name, "dictsort")) return v_func(r, M_DICT_DICTSORT, obj);
  }
  return NULL;
}

static jv *get_member(R *r, jv *obj, jv *prop) {
  jv *v = NULL;
  if (obj->t == V_DICT || obj->t == V_NS) {
    if (prop->t != V_STR) fail(r, "Cannot access property with non-string: got %s", tname(prop));
    v = dict_get(obj->u.d, prop->u.s.s, prop->u.s.n);
    if (!v && obj->t == V_DICT) v = builtin_member(r, obj, prop->u.s);
  } else if (obj->t == V_LIST || obj->t == V_STR) {
    if (prop->t == V_INT) {
      int64_t i = prop->u.i;
      if (obj->t == V_LIST) {
        int64_t n = (int64_t)obj->u.l->n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) v = obj->u.l->v[i];
      } else {
        int64_t n = (int64_t)cp_count(obj->u.s.s, obj->u.s.n);
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          size_t p = 0;
          for (int64_t k = 0; k < i; k++) p += jj_utf8_next(obj->u.s.s, obj->u.s.n, p, NULL);
          size_t l = jj_utf8_next(obj->u.s.s, obj->u.s.n, p, NULL);
          jstr s = {obj->u.s.s + p, l};
          v = v_jstr(r, s);
        }
      }
    } else if (prop->t == V_STR)
      v = builtin_member(r, obj, prop->u.s);
    else
      fail(r, "Cannot access property with non-string/non-number: got %s", tname(prop));
  } else {
    if (prop->t != V_STR) fail(r, "Cannot access property with non-string: got %s", tname(prop));
  }
  return v ? v : r->undef;
}

static void slice_idx(int64_t len, bool hs, int64_t start, bool he, int64_t stop, int64_t step,
                      int64_t *o_start, int64_t *o_stop) {
  if (step >= 0) {
    start = !hs ? 0 : start < 0 ? SM_MAX(len + start, 0) : SM_MIN(start, len);
    stop = !he ? len : stop < 0 ? SM_MAX(len + stop, 0) : SM_MIN(stop, len);
  } else {
    start = !hs ? len - 1 : start < 0 ? SM_MAX(len + start, -1) : SM_MIN(start, len - 1);
    stop = !he ? -1 : stop < -1 ? SM_MAX(len + stop, -1) : SM_MIN(stop, len - 1);
  }
  *o_start = start;
  *o_stop = stop;
}

static jv *do_slice(R *r, jv *obj, const jj_node *sl, jj_env *env) {
  if (obj->t != V_LIST && obj->t != V_STR) fail(r, "Slice object must be an array or string");
  jv *a = sl->a ? eval(r, sl->a, env) : r->undef;
  jv *b = sl->b ? eval(r, sl->b, env) : r->undef;
  jv *c = sl->c ? eval(r, sl->c, env) : r->undef;
  if ((a->t != V_INT && a->t != V_UNDEF) || (b->t != V_INT && b->t != V_UNDEF) || (c->t != V_INT && c->t != V_UNDEF))
    fail(r, "Slice indices must be integers or undefined");
  int64_t step = c->t == V_INT ? c->u.i : 1;
  int dir = step > 0 ? 1 : step < 0 ? -1 : 0;
  if (obj->t == V_LIST) {
    int64_t st, en, len = (int64_t)obj->u.l->n;
    slice_idx(len, a->t == V_INT, a->u.i, b->t == V_INT, b->u.i, step, &st, &en);
    jv *o = v_list(r);
    if (dir)
      for (int64_t i = st; dir * i < dir * en; i += step) list_push(r, o, obj->u.l->v[i]);
    return o;
  }
  /* string: by code points */
  size_t n = obj->u.s.n, cnt = cp_count(obj->u.s.s, n);
  size_t *off = jj_alloc(&r->arena, (cnt + 1) * sizeof(size_t));
  for (size_t i = 0, k = 0; i < n; k++) off[k] = i, i += jj_utf8_next(obj->u.s.s, n, i, NULL);
  off[cnt] = n;
  int64_t st, en;
  slice_idx((int64_t)cnt, a->t == V_INT, a->u.i, b->t == V_INT, b->u.i, step, &st, &en);
  jj_sb sb;
  jj_sb_init(&sb, &r->arena);
  if (dir)
    for (int64_t i = st; dir * i < dir * en; i += step) jj_sb_add(&sb, obj->u.s.s + off[i], off[i + 1] - off[i]);
  return v_jstr(r, jj_sb_str(&sb));
}

/* ---------------- comparisons & sorting ---------------- */
static int cmp_str_ci(R *r, const jv *a, const jv *b, bool cs) {
  const jv *x = cs ? a : case_map(r, a, 0), *y = cs ? b : case_map(r, b, 0);
  size_t m = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
  int c = memcmp(x->u.s.s, y->u.s.s, m);
  if (c) return c < 0 ? -1 : 1;
  return x->u.s.n < y->u.s.n ? -1 : x->u.s.n > y->u.s.n ? 1 : 0;
}
static int compare_values(R *r, const jv *a, const jv *b, bool cs) {
  if (a->t == V_NONE && b->t == V_NONE) return 0;
  if (a->t == V_NONE || b->t == V_NONE) fail(r, "Cannot compare %s with %s", tname(a), tname(b));
  if (a->t == V_UNDEF && b->t == V_UNDEF) return 0;
  if (a->t == V_UNDEF || b->t == V_UNDEF) fail(r, "Cannot compare %s with %s", tname(a), tname(b));
  bool an = is_num(a) || a->t == V_BOOL, bn = is_num(b) || b->t == V_BOOL;
  if (an && bn) {
    double x = num_of(a), y = num_of(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a->t != b->t) fail(r, "Cannot compare different types: %s and %s", tname(a), tname(b));
  if (a->t == V_STR) return cmp_str_ci(r, a, b, cs);
  fail(r, "Cannot compare type: %s", tname(a));
}

typedef struct {
  R *r;
  bool cs, rev;
  jv *attr; /* NULL, or string path */
} sort_ctx;

static jv *attr_path(R *r, jv *item, const char *path, size_t n) {
  jv *v = item;
  size_t i = 0;
  while (i <= n) {
    size_t j = i;
    while (j < n && path[j] != '.') j++;
    if (v->t == V_DICT || v->t == V_NS) {
      v = dict_get(v->u.d, path + i, j - i);
      if (!v) return r->undef;
    } else if (v->t == V_LIST) {
      char buf[32];
      size_t l = j - i < 31 ? j - i : 31;
      memcpy(buf, path + i, l);
      buf[l] = 0;
      char *end;
      long idx = strtol(buf, &end, 10);
      if (end == buf || idx < 0 || (size_t)idx >= v->u.l->n) return r->undef;
      v = v->u.l->v[idx];
    } else
      return r->undef;
    i = j + 1;
  }
  return v;
}

static int sort_cmp(sort_ctx *c, jv *a, jv *b) {
  if (c->attr) {
    a = attr_path(c->r, a, c->attr->u.s.s, c->attr->u.s.n);
    b = attr_path(c->r, b, c->attr->u.s.s, c->attr->u.s.n);
  }
  int x = compare_values(c->r, a, b, c->cs);
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
static jv *sorted(R *r, jv *l, bool rev, bool cs, jv *attr) {
  jv *o = v_list(r);
  for (size_t i = 0; i < l->u.l->n; i++) list_push(r, o, l->u.l->v[i]);
  sort_ctx c = {r, cs, rev, attr};
  jv **tmp = jj_alloc(&r->arena, (o->u.l->n + 1) * sizeof(jv *));
  merge_sort(&c, o->u.l->v, tmp, o->u.l->n);
  return o;
}

/* ---------------- binary / unary operators ---------------- */
static jv *arith_int(R *r, int op, int64_t a, int64_t b) {
  int64_t res;
  switch (op) {
    case OP_ADD: if (__builtin_add_overflow(a, b, &res)) fail(r, "integer overflow"); return v_int(r, res);
    case OP_SUB: if (__builtin_sub_overflow(a, b, &res)) fail(r, "integer overflow"); return v_int(r, res);
    case OP_MUL: if (__builtin_mul_overflow(a, b, &res)) fail(r, "integer overflow"); return v_int(r, res);
    case OP_FLOORDIV: {
      if (b == 0) fail(r, "division by zero");
      if (a == INT64_MIN && b == -1) fail(r, "integer overflow");
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
      return v_int(r, q);
    }
    case OP_MOD:
      if (b == 0) fail(r, "modulo by zero");
      if (b == -1) return v_int(r, 0);
      return v_int(r, a % b);
  }
  return NULL;
}

static jv *binop(R *r, const jj_node *n, jj_env *env) {
  jv *l = eval(r, n->a, env);
  if (n->op == OP_AND) return truthy(l) ? eval(r, n->b, env) : l;
  if (n->op == OP_OR) return truthy(l) ? l : eval(r, n->b, env);
  jv *rt = eval(r, n->b, env);
  r->line = n->line;
  int op = n->op;
  if (op == OP_EQ) return v_bool(r, loose_eq(r, l, rt));
  if (op == OP_NE) return v_bool(r, !loose_eq(r, l, rt));
  if (l->t == V_UNDEF || rt->t == V_UNDEF) {
    if (rt->t == V_UNDEF && (op == OP_IN || op == OP_NOTIN)) return v_bool(r, op == OP_NOTIN);
    fail(r, "Cannot perform operation on undefined values");
  }
  if (l->t == V_NONE || rt->t == V_NONE) fail(r, "Cannot perform operation on null values");
  if (op == OP_TILDE) {
    jj_sb b;
    jj_sb_init(&b, &r->arena);
    raw_str(r, &b, l);
    raw_str(r, &b, rt);
    return v_jstr(r, jj_sb_str(&b));
  }
  bool ln = is_num(l) || l->t == V_BOOL, rn = is_num(rt) || rt->t == V_BOOL;
  if (op == OP_POW && ln && rn) {
    double a = num_of(l), b = num_of(rt);
    if (a == 0 && b < 0) fail(r, "0.0 cannot be raised to a negative power");
    bool isf = l->t == V_FLOAT || rt->t == V_FLOAT || b < 0;
    if (!isf) {
      int64_t base = l->t == V_BOOL ? l->u.b : l->u.i, e = rt->t == V_BOOL ? rt->u.b : rt->u.i, res = 1;
      for (int64_t k = 0; k < e; k++) {
        if (__builtin_mul_overflow(res, base, &res)) fail(r, "integer overflow");
        if (res == 0 || res == 1) break;
        if (res == -1) { res = (e - k - 1) % 2 ? -res : res; break; }
      }
      return v_int(r, res);
    }
    double res = pow(a, b);
    if (!isfinite(res)) fail(r, "Exponentiation result is not a finite real number");
    return v_float(r, res);
  }
  if (is_num(l) && is_num(rt)) {
    bool isf = l->t == V_FLOAT || rt->t == V_FLOAT;
    double a = num_of(l), b = num_of(rt);
    switch (op) {
      case OP_ADD:
      case OP_SUB:
      case OP_MUL:
        if (!isf) return arith_int(r, op, l->u.i, rt->u.i);
        return v_float(r, op == OP_ADD ? a + b : op == OP_SUB ? a - b : a * b);
      case OP_DIV:
        if (b == 0) fail(r, "division by zero");
        return v_float(r, a / b);
      case OP_FLOORDIV:
        if (!isf) return arith_int(r, op, l->u.i, rt->u.i);
        if (b == 0) fail(r, "division by zero");
        return v_float(r, floor(a / b));
      case OP_MOD:
        if (!isf) return arith_int(r, op, l->u.i, rt->u.i);
        if (b == 0) fail(r, "modulo by zero");
        return v_float(r, fmod(a, b));
      case OP_LT: return v_bool(r, a < b);
      case OP_GT: return v_bool(r, a > b);
      case OP_LE: return v_bool(r, a <= b);
      case OP_GE: return v_bool(r, a >= b);
    }
  }
  if (l->t == V_LIST && rt->t == V_LIST && op == OP_ADD) {
    jv *o = v_list(r);
    for (size_t i = 0; i < l->u.l->n; i++) list_push(r, o, l->u.l->v[i]);
    for (size_t i = 0; i < rt->u.l->n; i++) list_push(r, o, rt->u.l->v[i]);
    return o;
  }
  if (rt->t == V_LIST && (op == OP_IN || op == OP_NOTIN)) {
    bool m = false;
    for (size_t i = 0; i < rt->u.l->n && !m; i++) m = strict_eq(rt->u.l->v[i], l);
    return v_bool(r, op == OP_IN ? m : !m);
  }
  if ((l->t == V_STR || rt->t == V_STR) && op == OP_ADD) {
    jj_sb b;
    jj_sb_init(&b, &r->arena);
    raw_str(r, &b, l);
    raw_str(r, &b, rt);
    return v_jstr(r, jj_sb_str(&b));
  }
  if (l->t == V_STR && rt->t == V_STR) {
    if (op == OP_IN || op == OP_NOTIN) {
      bool m = memmem_(rt->u.s.s, rt->u.s.n, l->u.s.s, l->u.s.n) != NULL;
      return v_bool(r, op == OP_IN ? m : !m);
    }
    /* extension (Python): string ordering */
    int c = cmp_str_ci(r, l, rt, true);
    switch (op) {
      case OP_LT: return v_bool(r, c < 0);
      case OP_GT: return v_bool(r, c > 0);
      case OP_LE: return v_bool(r, c <= 0);
      case OP_GE: return v_bool(r, c >= 0);
    }
  }
  if (l->t == V_STR && rt->t == V_DICT && (op == OP_IN || op == OP_NOTIN)) {
    bool m = dict_get(rt->u.d, l->u.s.s, l->u.s.n) != NULL;
    return v_bool(r, op == OP_IN ? m : !m);
  }
  /* extension (Python): sequence repetition */
  if (op == OP_MUL && ((l->t == V_STR && rt->t == V_INT) || (l->t == V_INT && rt->t == V_STR))) {
    jv *s = l->t == V_STR ? l : rt;
    int64_t k = l->t == V_INT ? l->u.i : rt->u.i;
    if (k > 0 && (double)k * (double)s->u.s.n > 64e6) fail(r, "string repetition too large");
    jj_sb b;
    jj_sb_init(&b, &r->arena);
    for (int64_t i = 0; i < k; i++) jj_sb_add(&b, s->u.s.s, s->u.s.n);
    return v_jstr(r, jj_sb_str(&b));
  }
  static const char *opn[] = {"+", "-", "~", "*", "/", "//", "%", "**", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"};
  fail(r, "Unknown operator \"%s\" between %s and %s", opn[op], tname(l), tname(rt));
}

/* ---------------- tests ---------------- */
static bool run_test(R *r, jstr name, jv *v, jv *args, int na) {
  jv *a0 = na > 0 ? args->u.l->v[0] : NULL;
#define T(s) jeqs(name, s)
  if (T("boolean")) return v->t == V_BOOL;
  if (T("callable")) return v->t == V_FUNC;
  if (T("odd") || T("even")) {
    if (v->t != V_INT) fail(r, "cannot %.*s on %s", (int)name.n, name.s, tname(v));
    return T("odd") ? (v->u.i % 2 != 0) : (v->u.i % 2 == 0);
  }
  if (T("false")) return v->t == V_BOOL && !v->u.b;
  if (T("true")) return v->t == V_BOOL && v->u.b;
  if (T("none")) return v->t == V_NONE;
  if (T("string")) return v->t == V_STR;
  if (T("number")) return is_num(v);
  if (T("integer")) return v->t == V_INT;
  if (T("float")) return v->t == V_FLOAT;
  if (T("iterable")) return v->t == V_LIST || v->t == V_STR;
  if (T("mapping")) return v->t == V_DICT;
  if (T("sequence")) return v->t == V_LIST || v->t == V_DICT || v->t == V_STR;
  if (T("lower")) return v->t == V_STR && strict_eq(v, case_map(r, v, 0));
  if (T("upper")) return v->t == V_STR && strict_eq(v, case_map(r, v, 1));
  if (T("defined")) return v->t != V_UNDEF;
  if (T("undefined")) return v->t == V_UNDEF;
  if (T("equalto") || T("eq") || T("==") || T("sameas")) return a0 ? strict_eq(v, a0) : v->t == V_UNDEF;
  if (T("ne") || T("!=")) return a0 ? !strict_eq(v, a0) : v->t != V_UNDEF;
  if (T("in")) {
    if (!a0) fail(r, "test 'in' requires an argument");
    if (a0->t == V_LIST) {
      for (size_t i = 0; i < a0->u.l->n; i++)
        if (strict_eq(a0->u.l->v[i], v)) return true;
      return false;
    }
    if (a0->t == V_STR && v->t == V_STR) return memmem_(a0->u.s.s, a0->u.s.n, v->u.s.s, v->u.s.n) != NULL;
    if (a0->t == V_DICT && v->t == V_STR) return dict_get(a0->u.d, v->u.s.s, v->u.s.n) != NULL;
    fail(r, "test 'in': unsupported operand types %s and %s", tname(v), tname(a0));
  }
  if (T("divisibleby")) {
    if (!a0 || v->t != V_INT || a0->t != V_INT || a0->u.i == 0) fail(r, "divisibleby requires integers");
    return v->u.i % a0->u.i == 0;
  }
  if (T("gt") || T(">") || T("greaterthan") || T("lt") || T("<") || T("lessthan") || T("ge") || T(">=") || T("le") || T("<=")) {
    if (!a0) fail(r, "comparison test requires an argument");
    int c = compare_values(r, v, a0, true);
    if (T("gt") || T(">") || T("greaterthan")) return c > 0;
    if (T("lt") || T("<") || T("lessthan")) return c < 0;
    if (T("ge") || T(">=")) return c >= 0;
    return c <= 0;
  }
#undef T
  fail(r, "Unknown test: %.*s", (int)name.n, name.s);
}

/* ---------------- filters ---------------- */
static jv *int_from_str(R *r, jv *s, jv *dflt) { /* JS parseInt(s, 10) */
  const char *p = s->u.s.s;
  size_t n = s->u.s.n, i = 0, l;
  while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
  bool neg = false;
  if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i] == '-', i++;
  if (i >= n || p[i] < '0' || p[i] > '9') return dflt;
  double v = 0;
  while (i < n && p[i] >= '0' && p[i] <= '9') v = v * 10 + (p[i++] - '0');
  if (v > 9.2e18) return v_float(r, neg ? -v : v);
  return v_int(r, neg ? -(int64_t)v : (int64_t)v);
}
static jv *float_from_str(R *r, jv *s, jv *dflt) { /* JS parseFloat */
  const char *p = s->u.s.s;
  size_t n = s->u.s.n, i = 0, l;
  while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
  size_t st = i;
  if (i < n && (p[i] == '+' || p[i] == '-')) i++;
  if (n - i >= 8 && !memcmp(p + i, "Infinity", 8)) return v_float(r, p[st] == '-' ? -INFINITY : INFINITY);
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
  return v_float(r, strtod(buf, NULL));
}

static jv *indent_str(R *r, jv *s, jv *width, bool first, bool blank) {
  jj_sb ind;
  jj_sb_init(&ind, &r->arena);
  if (width->t == V_STR) jj_sb_add(&ind, width->u.s.s, width->u.s.n);
  else if (width->t == V_INT) {
    if (width->u.i > 1000) fail(r, "indent width too large");
    for (int64_t i = 0; i < width->u.i; i++) jj_sb_addc(&ind, ' ');
  } else
    fail(r, "width must be a number");
  jj_sb b;
  jj_sb_init(&b, &r->arena);
  const char *p = s->u.s.s;
  size_t n = s->u.s.n, st = 0;
  int line = 0;
  for (;;) {
    const char *nl = memchr(p + st, '\n', n - st);
    size_t en = nl ? (size_t)(nl - p) : n;
    if (line) jj_sb_addc(&b, '\n');
    bool skip = (!first && line == 0) || (!blank && en == st);
    if (!skip) jj_sb_add(&b, ind.p ? ind.p : "", ind.n);
    jj_sb_add(&b, p + st, en - st);
    if (!nl) break;
    st = en + 1;
    line++;
  }
  return v_jstr(r, jj_sb_str(&b));
}

static jv *html_escape(R *r, jv *v) {
  jv *s = str_of(r, v, false);
  jj_sb b;
  jj_sb_init(&b, &r->arena);
  for (size_t i = 0; i < s->u.s.n; i++) {
    char c = s->u.s.s[i];
    switch (c) {
      case '&': jj_sb_adds(&b, "&amp;"); break;
      case '<': jj_sb_adds(&b, "&lt;"); break;
      case '>': jj_sb_adds(&b, "&gt;"); break;
      case '"': jj_sb_adds(&b, "&#34;"); break;
      case '\'': jj_sb_adds(&b, "&#39;"); break;
      default: jj_sb_addc(&b, c);
    }
  }
  return v_jstr(r, jj_sb_str(&b));
}

static jv *chars_of(R *r, jv *s) {
  jv *l = v_list(r);
  for (size_t i = 0; i < s->u.s.n;) {
    size_t k = jj_utf8_next(s->u.s.s, s->u.s.n, i, NULL);
    jstr c = {s->u.s.s + i, k};
    list_push(r, l, v_jstr(r, c));
    i += k;
  }
  return l;
}

static jv *dict_items(R *r, jv *d) {
  jv *l = v_list(r);
  for (size_t i = 0; i < d->u.d->n; i++) {
    jv *p = v_list(r);
    list_push(r, p, v_jstr(r, d->u.d->k[i]));
    list_push(r, p, d->u.d->v[i]);
    list_push(r, l, p);
  }
  return l;
}
static jv *dict_keys(R *r, jv *d) {
  jv *l = v_list(r);
  for (size_t i = 0; i < d->u.d->n; i++) list_push(r, l, v_jstr(r, d->u.d->k[i]));
  return l;
}
static jv *dict_values(R *r, jv *d) {
  jv *l = v_list(r);
  for (size_t i = 0; i < d->u.d->n; i++) list_push(r, l, d->u.d->v[i]);
  return l;
}

static jv *bool_arg(R *r, jv *v, const char *what) {
  if (v && v->t != V_BOOL) fail(r, "%s must be a boolean", what);
  return v;
}

static jv *do_tojson(R *r, jv *v, jv *kwargs) {
  json_opts o = {0};
  o.undef_null = true;
  jv *ind = kwargs ? dict_get(kwargs->u.d, "indent", 6) : NULL;
  if (ind && ind->t != V_INT && ind->t != V_NONE) fail(r, "If set, indent must be a number");
  if (ind && ind->t == V_INT) {
    if (ind->u.i > 64) fail(r, "indent too large");
    o.indent = ind->u.i > 0 ? (int)ind->u.i : 0;
  }
  jv *ea = bool_arg(r, kwargs ? dict_get(kwargs->u.d, "ensure_ascii", 12) : NULL, "If set, ensure_ascii");
  jv *sk = bool_arg(r, kwargs ? dict_get(kwargs->u.d, "sort_keys", 9) : NULL, "If set, sort_keys");
  o.ensure_ascii = ea && ea->u.b;
  o.sort_keys = sk && sk->u.b;
  jv *sep = kwargs ? dict_get(kwargs->u.d, "separators", 10) : NULL;
  if (sep && sep->t == V_LIST) {
    if (sep->u.l->n != 2 || sep->u.l->v[0]->t != V_STR || sep->u.l->v[1]->t != V_STR)
      fail(r, "separators must be a tuple of two strings");
    o.item_sep = sep->u.l->v[0]->u.s.s;
    o.key_sep = sep->u.l->v[1]->u.s.s;
  } else if (sep && sep->t != V_NONE)
    fail(r, "If set, separators must be a tuple of two strings");
  jj_sb b;
  jj_sb_init(&b, &r->arena);
  to_json(r, &b, v, &o, 0);
  return v_jstr(r, jj_sb_str(&b));
}

static jv *apply_filter(R *r, jv *v, jstr name, jv *args, jv *kwargs, jj_env *env) {
#define F(s) jeqs(name, s)
  size_t na = nargs(args);
  if (F("safe")) return v;
  if (F("tojson")) return do_tojson(r, v, kwargs);
  if (F("default") || F("d")) {
    jv *dv = arg(args, kwargs, 0, "default_value");
    if (!dv) dv = v_strn(r, "", 0);
    jv *bo = bool_arg(r, arg(args, kwargs, 1, "boolean"), "`default` filter flag");
    if (v->t == V_UNDEF || (bo && bo->u.b && !truthy(v))) return dv;
    return v;
  }
  if (F("join")) {
    jv *l;
    if (v->t == V_STR) l = chars_of(r, v);
    else if (v->t == V_LIST) l = v;
    else fail(r, "Cannot apply filter \"join\" to type: %s", tname(v));
    jv *sep = arg(args, kwargs, 0, "d");
    if (!sep && kwargs) sep = dict_get(kwargs->u.d, "separator", 9);
    if (sep && sep->t != V_STR) fail(r, "separator must be a string");
    jv *attr = kwargs ? dict_get(kwargs->u.d, "attribute", 9) : NULL;
    jj_sb b;
    jj_sb_init(&b, &r->arena);
    for (size_t i = 0; i < l->u.l->n; i++) {
      if (i && sep) jj_sb_add(&b, sep->u.s.s, sep->u.s.n);
      jv *x = l->u.l->v[i];
      if (attr && attr->t == V_STR) x = attr_path(r, x, attr->u.s.s, attr->u.s.n);
      raw_str(r, &b, x);
    }
    return v_jstr(r, jj_sb_str(&b));
  }
  if (F("int") || F("float")) {
    bool isint = F("int");
    jv *dflt = arg(args, kwargs, 0, "default");
    if (!dflt) dflt = isint ? v_int(r, 0) : v_float(r, 0);
    if (v->t == V_STR) return isint ? int_from_str(r, v, dflt) : float_from_str(r, v, dflt);
    if (v->t == V_INT) return isint ? v : v_float(r, (double)v->u.i);
    if (v->t == V_FLOAT) {
      if (!isint) return v;
      double f = floor(v->u.f);
      if (!isfinite(f) || fabs(f) > 9.2e18) return dflt;
      return v_int(r, (int64_t)f);
    }
    if (v->t == V_BOOL) return isint ? v_int(r, v->u.b) : v_float(r, v->u.b);
    fail(r, "Cannot apply filter \"%.*s\" to type: %s", (int)name.n, name.s, tname(v));
  }
  if (F("string")) {
    if (v->t == V_NONE) return v_cstr(r, "None");
    return str_of(r, v, false);
  }
  if (F("e") || F("escape")) return html_escape(r, v);
  if (F("length") || F("count")) {
    if (v->t == V_LIST) return v_int(r, (int64_t)v->u.l->n);
    if (v->t == V_STR) return v_int(r, (int64_t)cp_count(v->u.s.s, v->u.s.n));
    if (v->t == V_DICT) return v_int(r, (int64_t)v->u.d->n);
    fail(r, "Cannot apply filter \"%.*s\" to type: %s", (int)name.n, name.s, tname(v));
  }
  if (v->t == V_STR) {
    if (F("upper")) return case_map(r, v, 1);
    if (F("lower")) return case_map(r, v, 0);
    if (F("title")) return title_case(r, v);
    if (F("capitalize")) return capitalize(r, v);
    if (F("trim")) {
      jv *chars = arg(args, kwargs, 0, "chars");
      if (chars && chars->t != V_STR) chars = NULL;
      return strip(r, v, 3, chars);
    }
    if (F("indent")) {
      jv *w = arg(args, kwargs, 0, "width");
      jv *first = arg(args, kwargs, 1, "first"), *blank = arg(args, kwargs, 2, "blank");
      return indent_str(r, v, w ? w : v_int(r, 4), first && truthy(first), blank && truthy(blank));
    }
    if (F("replace")) {
      jv *o = arg(args, kwargs, 0, "old"), *nw = arg(args, kwargs, 1, "new"), *c = arg(args, kwargs, 2, "count");
      if (!o || !nw) fail(r, "replace() requires at least two arguments");
      if (o->t != V_STR || nw->t != V_STR) fail(r, "replace() arguments must be strings");
      if (c && c->t != V_INT && c->t != V_NONE) fail(r, "replace() count argument must be a number or null");
      return str_replace(r, v, o, nw, c && c->t == V_INT ? c->u.i : -1);
    }
    if (F("list")) return chars_of(r, v);
    if (F("first") || F("last") || F("reverse") || F("wordcount")) {
      jv *l = chars_of(r, v);
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
        return v_int(r, c);
      }
      jj_sb b;
      jj_sb_init(&b, &r->arena);
      for (size_t i = l->u.l->n; i-- > 0;) jj_sb_add(&b, l->u.l->v[i]->u.s.s, l->u.l->v[i]->u.s.n);
      return v_jstr(r, jj_sb_str(&b));
    }
    if (F("striptags")) return strip(r, v, 3, NULL);
  }
  if (v->t == V_LIST) {
    jj_list *L = v->u.l;
    if (F("list")) return v;
    if (F("first")) return L->n ? L->v[0] : r->undef;
    if (F("last")) return L->n ? L->v[L->n - 1] : r->undef;
    if (F("reverse")) {
      jv *o = v_list(r);
      for (size_t i = L->n; i-- > 0;) list_push(r, o, L->v[i]);
      return o;
    }
    if (F("sort")) {
      jv *rev = bool_arg(r, arg(args, kwargs, 0, "reverse"), "reverse");
      jv *cs = bool_arg(r, arg(args, kwargs, 1, "case_sensitive"), "case_sensitive");
      jv *attr = arg(args, kwargs, 2, "attribute");
      if (attr && attr->t == V_INT) attr = str_of(r, attr, false);
      if (attr && attr->t != V_STR && attr->t != V_NONE) fail(r, "attribute must be a string, integer, or null");
      return sorted(r, v, rev && rev->u.b, cs && cs->u.b, attr && attr->t == V_STR ? attr : NULL);
    }
    if (F("unique")) {
      jv *o = v_list(r);
      for (size_t i = 0; i < L->n; i++) {
        bool seen = false;
        for (size_t j = 0; j < o->u.l->n && !seen; j++) seen = strict_eq(o->u.l->v[j], L->v[i]);
        if (!seen) list_push(r, o, L->v[i]);
      }
      return o;
    }
    if (F("min") || F("max")) {
      if (!L->n) return r->undef;
      jv *best = L->v[0];
      for (size_t i = 1; i < L->n; i++) {
        int c = compare_values(r, L->v[i], best, false);
        if (F("min") ? c < 0 : c > 0) best = L->v[i];
      }
      return best;
    }
    if (F("sum")) {
      jv *attr = arg(args, kwargs, 0, "attribute");
      jv *acc = arg(args, kwargs, 1, "start");
      if (!acc) acc = v_int(r, 0);
      for (size_t i = 0; i < L->n; i++) {
        jv *x = attr && attr->t == V_STR ? attr_path(r, L->v[i], attr->u.s.s, attr->u.s.n) : L->v[i];
        if (!is_num(x) || !is_num(acc)) fail(r, "sum: values must be numbers");
        if (acc->t == V_INT && x->t == V_INT) acc = arith_int(r, OP_ADD, acc->u.i, x->u.i);
        else acc = v_float(r, num_of(acc) + num_of(x));
      }
      return acc;
    }
    if (F("batch")) {
      jv *sz = arg(args, kwargs, 0, "linecount"), *fill = arg(args, kwargs, 1, "fill_with");
      if (!sz || sz->t != V_INT || sz->u.i <= 0) fail(r, "batch requires a positive integer size");
      jv *o = v_list(r), *cur = NULL;
      for (size_t i = 0; i < L->n; i++) {
        if (!cur || (int64_t)cur->u.l->n == sz->u.i) {
          cur = v_list(r);
          list_push(r, o, cur);
        }
        list_push(r, cur, L->v[i]);
      }
      if (cur && fill && fill->t != V_NONE)
        while ((int64_t)cur->u.l->n < sz->u.i) list_push(r, cur, fill);
      return o;
    }
    if (F("selectattr") || F("rejectattr")) {
      bool sel = F("selectattr");
      for (size_t i = 0; i < L->n; i++)
        if (L->v[i]->t != V_DICT && L->v[i]->t != V_NS)
          fail(r, "`%.*s` can only be applied to array of objects", (int)name.n, name.s);
      if (na < 1 || args->u.l->v[0]->t != V_STR) fail(r, "arguments of `%.*s` must be strings", (int)name.n, name.s);
      jv *attr = args->u.l->v[0];
      jv *test = na > 1 ? args->u.l->v[1] : NULL;
      if (test && test->t != V_STR) fail(r, "arguments of `%.*s` must be strings", (int)name.n, name.s);
      jv *targs = v_list(r);
      for (size_t k = 2; k < na; k++) list_push(r, targs, args->u.l->v[k]);
      jv *o = v_list(r);
      for (size_t i = 0; i < L->n; i++) {
        jv *a = dict_get(L->v[i]->u.d, attr->u.s.s, attr->u.s.n);
        bool res = a ? (test ? run_test(r, test->u.s, a, targs, (int)targs->u.l->n) : truthy(a)) : false;
        if (res == sel) list_push(r, o, L->v[i]);
      }
      return o;
    }
    if (F("select") || F("reject")) {
      bool sel = F("select");
      jv *test = na > 0 ? args->u.l->v[0] : NULL;
      if (test && test->t != V_STR) fail(r, "test name must be a string");
      jv *targs = v_list(r);
      for (size_t k = 1; k < na; k++) list_push(r, targs, args->u.l->v[k]);
      jv *o = v_list(r);
      for (size_t i = 0; i < L->n; i++) {
        bool res = test ? run_test(r, test->u.s, L->v[i], targs, (int)targs->u.l->n) : truthy(L->v[i]);
        if (res == sel) list_push(r, o, L->v[i]);
      }
      return o;
    }
    if (F("map")) {
      jv *attr = kwargs ? dict_get(kwargs->u.d, "attribute", 9) : NULL;
      jv *o = v_list(r);
      if (attr) {
        if (attr->t == V_INT) attr = str_of(r, attr, false);
        if (attr->t != V_STR) fail(r, "attribute must be a string");
        jv *dflt = dict_get(kwargs->u.d, "default", 7);
        for (size_t i = 0; i < L->n; i++) {
          if (L->v[i]->t != V_DICT && L->v[i]->t != V_NS) fail(r, "items in map must be an object");
          jv *x = attr_path(r, L->v[i], attr->u.s.s, attr->u.s.n);
          list_push(r, o, x->t == V_UNDEF && dflt ? dflt : x);
        }
        return o;
      }
      if (na < 1 || args->u.l->v[0]->t != V_STR) fail(r, "map requires a filter name or attribute=");
      jv *fargs = v_list(r);
      for (size_t k = 1; k < na; k++) list_push(r, fargs, args->u.l->v[k]);
      for (size_t i = 0; i < L->n; i++)
        list_push(r, o, apply_filter(r, L->v[i], args->u.l->v[0]->u.s, fargs, NULL, env));
      return o;
    }
  }
  if (is_num(v)) {
    if (F("abs")) return v->t == V_INT ? v_int(r, v->u.i < 0 ? -v->u.i : v->u.i) : v_float(r, fabs(v->u.f));
    if (F("round")) {
      jv *prec = arg(args, kwargs, 0, "precision"), *method = arg(args, kwargs, 1, "method");
      int64_t p = prec && prec->t == V_INT ? prec->u.i : 0;
      if (p > 15 || p < -15) fail(r, "round: precision out of range");
      bool common = !(method && method->t == V_STR && (jeqs(method->u.s, "floor") || jeqs(method->u.s, "ceil")));
      if (v->t == V_INT && common) { /* Python round(int, n) stays an int */
        if (p >= 0) return v;
        double m = pow(10, (double)-p);
        return v_int(r, (int64_t)(nearbyint((double)v->u.i / m) * m));
      }
      double m = pow(10, (double)p), x = num_of(v) * m, res;
      if (!common && jeqs(method->u.s, "floor")) res = floor(x);
      else if (!common) res = ceil(x);
      else res = nearbyint(x); /* half to even, like Python's round() */
      return v_float(r, res / m);
    }
  }
  if (v->t == V_DICT) {
    if (F("items")) return dict_items(r, v);
    if (F("keys") || F("list")) return dict_keys(r, v);
    if (F("values")) return dict_values(r, v);
    if (F("dictsort")) return call_func(r, v_func(r, M_DICT_DICTSORT, v), args, kwargs, env);
  }
  if (v->t == V_BOOL && F("bool")) return v;
  fail(r, "Cannot apply filter \"%.*s\" to type: %s", (int)name.n, name.s, tname(v));
#undef F
}

/* ---------------- functions & methods ---------------- */
static void bind_params(R *r, const jj_node *def, const jj_nodes *params, jv *args, jv *kwargs, jj_env *scope,
                        const char *disp) {
  jj_dict *kw = jj_calloc(&r->arena, sizeof(jj_dict));
  if (kwargs)
    for (size_t i = 0; i < kwargs->u.d->n; i++) dict_setj(r, kw, kwargs->u.d->k[i], kwargs->u.d->v[i]);
  size_t np = (size_t)params->n, na = nargs(args);
  bool *pending = jj_calloc(&r->arena, np + 1);
  for (size_t i = 0; i < np; i++) {
    const jj_node *p = params->v[i];
    jv *val = i < na ? args->u.l->v[i] : NULL;
    if (!val) {
      jv **slot = dict_slot(kw, p->s.s, p->s.n);
      if (slot && *slot) {
        val = *slot;
        *slot = NULL; /* consumed */
      }
    }
    if (!val && p->kind == N_KWARG) pending[i] = true;
    env_set(r, scope, p->s, val ? val : r->undef);
  }
  jv *rest = v_dict(r, V_DICT);
  for (size_t i = 0; i < kw->n; i++)
    if (kw->v[i]) dict_setj(r, rest->u.d, kw->k[i], kw->v[i]);
  jstr kwn = {"kwargs", 6}, van = {"varargs", 7};
  if (def->i & 1) env_set(r, scope, kwn, rest);
  else if (rest->u.d->n)
    fail(r, "macro %s takes no keyword argument '%.*s'", disp, (int)rest->u.d->k[0].n, rest->u.d->k[0].s);
  if (def->i & 2) {
    jv *va = v_list(r);
    for (size_t i = np; i < na; i++) list_push(r, va, args->u.l->v[i]);
    env_set(r, scope, van, va);
  } else if (na > np)
    fail(r, "macro %s takes not more than %zu argument(s)", disp, np);
  for (size_t i = 0; i < np; i++)
    if (pending[i]) env_set(r, scope, params->v[i]->s, eval(r, params->v[i]->a, scope));
}

static jv *split_str(R *r, jv *s, jv *sep, int64_t maxsplit) {
  jv *o = v_list(r);
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
        list_push(r, o, v_jstr(r, rest));
        return o;
      }
      jstr w = {p + st, i - st};
      list_push(r, o, v_jstr(r, w));
      while (i < n && jj_is_space_at(p, n, i, &l)) i += l;
    }
    return o;
  }
  if (sep->t != V_STR) fail(r, "sep argument must be a string or null");
  if (!sep->u.s.n) fail(r, "empty separator");
  size_t i = 0;
  for (;;) {
    const char *f = (maxsplit == -1 || (int64_t)o->u.l->n < maxsplit) ? memmem_(p + i, n - i, sep->u.s.s, sep->u.s.n) : NULL;
    if (!f) {
      jstr w = {p + i, n - i};
      list_push(r, o, v_jstr(r, w));
      return o;
    }
    jstr w = {p + i, (size_t)(f - (p + i))};
    list_push(r, o, v_jstr(r, w));
    i = (size_t)(f - p) + sep->u.s.n;
  }
}

static jv *call_func(R *r, jv *fnv, jv *args, jv *kwargs, jj_env *env) {
  jj_func *fn = fnv->u.fn;
  jv *self = fn->self;
  size_t na = nargs(args);
  jv *a0 = arg(args, NULL, 0, NULL), *a1 = arg(args, NULL, 1, NULL);
  switch (fn->kind) {
    case F_MACRO:
    case F_CALLER: {
      if (++r->depth > JJ_MAX_EVAL_DEPTH) fail(r, "maximum recursion depth exceeded");
      const jj_node *def = fn->node;
      jj_env *scope = env_new(r, fn->kind == F_MACRO ? env : fn->env);
      char disp[80];
      if (fn->kind == F_MACRO) snprintf(disp, sizeof disp, "'%.*s'", (int)(def->s.n > 60 ? 60 : def->s.n), def->s.s);
      else snprintf(disp, sizeof disp, "None");
      bind_params(r, def, &def->l2, args, kwargs, scope, disp);
      jj_sb out;
      jj_sb_init(&out, &r->arena);
      exec_block(r, &def->l1, scope, &out);
      r->depth--;
      return v_jstr(r, jj_sb_str(&out));
    }
    case F_RANGE: {
      for (size_t i = 0; i < na; i++)
        if (args->u.l->v[i]->t != V_INT) fail(r, "range() arguments must be integers");
      if (na < 1 || na > 3) fail(r, "range() expects 1 to 3 arguments");
      int64_t start = 0, stop, step = 1;
      if (na == 1) stop = a0->u.i;
      else start = a0->u.i, stop = a1->u.i;
      if (na == 3) step = args->u.l->v[2]->u.i;
      if (step == 0) fail(r, "range() step must not be zero");
      jv *o = v_list(r);
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if ((long)o->u.l->n >= JJ_MAX_RANGE) fail(r, "range() too large");
        list_push(r, o, v_int(r, i));
      }
      return o;
    }
    case F_RAISE: {
      jv *m = a0 ? str_of(r, a0, true) : v_cstr(r, "");
      fail(r, "%.*s", (int)(m->u.s.n > 300 ? 300 : m->u.s.n), m->u.s.s);
    }
    case F_STRFTIME: {
      if (!a0 || a0->t != V_STR) fail(r, "strftime_now() expects a format string");
      if (a0->u.s.n > 200) fail(r, "strftime_now(): format too long");
      time_t t = time(NULL);
      struct tm tm;
      localtime_r(&t, &tm);
      char buf[1024];
      size_t k = strftime(buf, sizeof buf, a0->u.s.s, &tm);
      return v_strn(r, buf, k);
    }
    case F_NAMESPACE: {
      if (na > 1) fail(r, "namespace expected at most 1 argument, got %zu", na);
      jv *ns = v_dict(r, V_NS);
      if (na == 1) {
        if (a0->t == V_DICT)
          for (size_t i = 0; i < a0->u.d->n; i++) dict_setj(r, ns->u.d, a0->u.d->k[i], a0->u.d->v[i]);
        else if (a0->t == V_LIST) {
          for (size_t i = 0; i < a0->u.l->n; i++) {
            jv *p = a0->u.l->v[i];
            if (p->t != V_LIST || p->u.l->n != 2) fail(r, "namespace expected an object or an iterable of [key, value] pairs");
            if (p->u.l->v[0]->t != V_STR) fail(r, "namespace keys must be strings");
            dict_setj(r, ns->u.d, p->u.l->v[0]->u.s, p->u.l->v[1]);
          }
        } else
          fail(r, "'%s' object is not iterable", tname(a0));
      }
      if (kwargs)
        for (size_t i = 0; i < kwargs->u.d->n; i++) dict_setj(r, ns->u.d, kwargs->u.d->k[i], kwargs->u.d->v[i]);
      return ns;
    }
    case M_STR_UPPER: return case_map(r, self, 1);
    case M_STR_LOWER: return case_map(r, self, 0);
    case M_STR_STRIP:
    case M_STR_LSTRIP:
    case M_STR_RSTRIP: {
      jv *chars = a0 && a0->t == V_STR ? a0 : NULL;
      if (a0 && a0->t != V_STR && a0->t != V_NONE) fail(r, "strip arg must be None or str");
      return strip(r, self, fn->kind == M_STR_STRIP ? 3 : fn->kind == M_STR_LSTRIP ? 1 : 2, chars);
    }
    case M_STR_TITLE: return title_case(r, self);
    case M_STR_CAPITALIZE: return capitalize(r, self);
    case M_STR_STARTSWITH:
    case M_STR_ENDSWITH: {
      bool sw = fn->kind == M_STR_STARTSWITH;
      const char *nm = sw ? "startswith" : "endswith";
      if (!a0) fail(r, "%s() requires at least one argument", nm);
      jv one = {.t = V_LIST};
      jj_list ol = {&a0, 1, 1};
      one.u.l = &ol;
      jv *pats = a0->t == V_STR ? &one : a0;
      if (pats->t != V_LIST) fail(r, "%s() argument must be a string or tuple of strings", nm);
      for (size_t i = 0; i < pats->u.l->n; i++) {
        jv *p = pats->u.l->v[i];
        if (p->t != V_STR) fail(r, "%s() tuple elements must be strings", nm);
        if (p->u.s.n <= self->u.s.n &&
            !memcmp(self->u.s.s + (sw ? 0 : self->u.s.n - p->u.s.n), p->u.s.s, p->u.s.n))
          return r->vtrue;
      }
      return r->vfalse;
    }
    case M_STR_SPLIT: {
      jv *sep = arg(args, kwargs, 0, "sep"), *ms = arg(args, kwargs, 1, "maxsplit");
      if (ms && ms->t != V_INT) fail(r, "maxsplit argument must be a number");
      return split_str(r, self, sep, ms ? ms->u.i : -1);
    }
    case M_STR_REPLACE: {
      if (na < 2) fail(r, "replace() requires at least two arguments");
      if (a0->t != V_STR || a1->t != V_STR) fail(r, "replace() arguments must be strings");
      jv *c = arg(args, kwargs, 2, "count");
      if (c && c->t != V_INT && c->t != V_NONE) fail(r, "replace() count argument must be a number or null");
      return str_replace(r, self, a0, a1, c && c->t == V_INT ? c->u.i : -1);
    }
    case M_STR_FIND:
    case M_STR_COUNT: {
      if (!a0 || a0->t != V_STR) fail(r, "argument must be a string");
      if (fn->kind == M_STR_FIND) {
        const char *f = memmem_(self->u.s.s, self->u.s.n, a0->u.s.s, a0->u.s.n);
        return v_int(r, f ? (int64_t)cp_count(self->u.s.s, (size_t)(f - self->u.s.s)) : -1);
      }
      if (!a0->u.s.n) return v_int(r, (int64_t)cp_count(self->u.s.s, self->u.s.n) + 1);
      int64_t c = 0;
      size_t i = 0;
      const char *f;
      while ((f = memmem_(self->u.s.s + i, self->u.s.n - i, a0->u.s.s, a0->u.s.n))) {
        c++;
        i = (size_t)(f - self->u.s.s) + a0->u.s.n;
      }
      return v_int(r, c);
    }
    case M_STR_JOIN: {
      if (!a0 || a0->t != V_LIST) fail(r, "join() argument must be a list");
      jj_sb b;
      jj_sb_init(&b, &r->arena);
      for (size_t i = 0; i < a0->u.l->n; i++) {
        if (i) jj_sb_add(&b, self->u.s.s, self->u.s.n);
        raw_str(r, &b, a0->u.l->v[i]);
      }
      return v_jstr(r, jj_sb_str(&b));
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
      if (!a0 || a0->t != V_STR) fail(r, "Object key must be a string: got %s", a0 ? tname(a0) : "nothing");
      jv *x = dict_get(self->u.d, a0->u.s.s, a0->u.s.n);
      return x ? x : a1 ? a1 : r->none;
    }
    case M_DICT_ITEMS: return dict_items(r, self);
    case M_DICT_KEYS: return dict_keys(r, self);
    case M_DICT_VALUES: return dict_values(r, self);
    case M_DICT_DICTSORT: {
      jv *cs = bool_arg(r, arg(args, kwargs, 0, "case_sensitive"), "case_sensitive");
      jv *by = arg(args, kwargs, 1, "by");
      jv *rev = bool_arg(r, arg(args, kwargs, 2, "reverse"), "reverse");
      if (by && (by->t != V_STR || !(jeqs(by->u.s, "key") || jeqs(by->u.s, "value"))))
        fail(r, "by must be either 'key' or 'value'");
      jv *items = dict_items(r, self);
      jv *attr = v_cstr(r, by && jeqs(by->u.s, "value") ? "1" : "0");
      return sorted(r, items, rev && rev->u.b, cs && cs->u.b, attr);
    }
  }
  fail(r, "Cannot call something that is not a function");
}

/* ---------------- expressions ---------------- */
static jv *eval(R *r, const jj_node *n, jj_env *env) {
  if (!n) return r->undef;
  if (++r->depth > JJ_MAX_EVAL_DEPTH) fail(r, "maximum recursion depth exceeded");
  r->line = n->line;
  jv *res = NULL;
  switch (n->kind) {
    case N_STR: res = v_jstr(r, n->s); break;
    case N_INT: res = v_int(r, n->i); break;
    case N_FLOAT: res = v_float(r, n->f); break;
    case N_IDENT: {
      res = env_get(env, n->s);
      if (!res) res = r->undef;
      break;
    }
    case N_LIST:
    case N_TUPLE:
      res = v_list(r);
      res->tuple = n->kind == N_TUPLE;
      for (int i = 0; i < n->l1.n; i++) list_push(r, res, eval(r, n->l1.v[i], env));
      break;
    case N_DICT:
      res = v_dict(r, V_DICT);
      for (int i = 0; i < n->l1.n; i++) {
        jv *k = eval(r, n->l1.v[i], env);
        if (k->t != V_STR) fail(r, "Object keys must be strings: got %s", tname(k));
        dict_setj(r, res->u.d, k->u.s, eval(r, n->l2.v[i], env));
      }
      break;
    case N_MEMBER: {
      jv *obj = eval(r, n->a, env);
      r->line = n->line;
      if (n->op && n->b->kind == N_SLICE) {
        res = do_slice(r, obj, n->b, env);
        break;
      }
      jv *prop;
      if (n->op) prop = eval(r, n->b, env);
      else if (n->b->kind == N_INT) prop = v_int(r, n->b->i);
      else prop = v_jstr(r, n->b->s);
      r->line = n->line;
      res = get_member(r, obj, prop);
      break;
    }
    case N_CALL: {
      jv *args, *kwargs;
      eval_args(r, &n->l1, env, &args, &kwargs);
      jv *fn = eval(r, n->a, env);
      r->line = n->line;
      if (fn->t != V_FUNC) fail(r, "Cannot call something that is not a function: got %s", tname(fn));
      res = call_func(r, fn, args, kwargs, env);
      break;
    }
    case N_BINOP: res = binop(r, n, env); break;
    case N_UNARY: {
      jv *a = eval(r, n->a, env);
      r->line = n->line;
      if (n->op == OP_NOT) res = v_bool(r, !truthy(a));
      else if (a->t == V_INT || a->t == V_BOOL) {
        int64_t x = a->t == V_BOOL ? a->u.b : a->u.i;
        if (n->op == OP_NEG && x == INT64_MIN) fail(r, "integer overflow");
        res = v_int(r, n->op == OP_NEG ? -x : x);
      } else if (a->t == V_FLOAT)
        res = v_float(r, n->op == OP_NEG ? -a->u.f : a->u.f);
      else
        fail(r, "Unknown operator \"%s\" for %s", n->op == OP_NEG ? "-" : "+", tname(a));
      break;
    }
    case N_FILTER: {
      jv *v = eval(r, n->a, env);
      jv *args = NULL, *kwargs = NULL;
      if (n->has_args) eval_args(r, &n->l1, env, &args, &kwargs);
      r->line = n->line;
      res = apply_filter(r, v, n->s, args, kwargs, env);
      break;
    }
    case N_TEST: {
      jv *v = eval(r, n->a, env);
      jv *args = NULL, *kwargs = NULL;
      if (n->has_args) eval_args(r, &n->l1, env, &args, &kwargs);
      r->line = n->line;
      bool t = run_test(r, n->s, v, args, (int)nargs(args));
      res = v_bool(r, n->op ? !t : t);
      break;
    }
    case N_SELECT: res = truthy(eval(r, n->b, env)) ? eval(r, n->a, env) : r->undef; break;
    case N_TERNARY: res = truthy(eval(r, n->a, env)) ? eval(r, n->b, env) : eval(r, n->c, env); break;
    case N_SLICE: fail(r, "unexpected slice");
    case N_KWARG:
    case N_SPREAD:
    case N_KWSPREAD: fail(r, "unexpected argument expression");
    default: fail(r, "statement used as expression");
  }
  r->depth--;
  return res;
}

/* ---------------- statements ---------------- */
static void bind_target(R *r, const jj_node *target, jv *val, jj_env *env) {
  if (target->kind == N_IDENT) {
    env_set(r, env, target->s, val);
    return;
  }
  if (val->t != V_LIST) fail(r, "Cannot unpack non-iterable type: %s", tname(val));
  if ((size_t)target->l1.n != val->u.l->n)
    fail(r, "Too %s items to unpack", (size_t)target->l1.n > val->u.l->n ? "few" : "many");
  for (int j = 0; j < target->l1.n; j++) {
    if (target->l1.v[j]->kind != N_IDENT) fail(r, "Cannot unpack to non-identifier");
    env_set(r, env, target->l1.v[j]->s, val->u.l->v[j]);
  }
}

static void exec_for(R *r, const jj_node *n, jj_env *env, jj_sb *out) {
  jj_env *scope = env_new(r, env);
  const jj_node *test = NULL;
  jv *it;
  if (n->b->kind == N_SELECT) {
    it = eval(r, n->b->a, scope);
    test = n->b->b;
  } else
    it = eval(r, n->b, scope);
  r->line = n->line;
  if (it->t == V_DICT) it = dict_keys(r, it);
  else if (it->t == V_STR) it = chars_of(r, it);
  else if (it->t != V_LIST) fail(r, "Expected iterable or object type in for loop: got %s", tname(it));
  jv *items = v_list(r);
  for (size_t i = 0; i < it->u.l->n; i++) {
    jv *cur = it->u.l->v[i];
    if (test) {
      check_iter(r);
      jj_env *ls = env_new(r, scope);
      bind_target(r, n->a, cur, ls);
      if (!truthy(eval(r, test, ls))) continue;
    }
    list_push(r, items, cur);
  }
  size_t cnt = items->u.l->n;
  bool iterated = false;
  jstr loopn = {"loop", 4};
  for (size_t i = 0; i < cnt; i++) {
    check_iter(r);
    jv *loop = v_dict(r, V_DICT);
    jj_dict *d = loop->u.d;
    dict_set(r, d, "index", v_int(r, (int64_t)i + 1));
    dict_set(r, d, "index0", v_int(r, (int64_t)i));
    dict_set(r, d, "revindex", v_int(r, (int64_t)(cnt - i)));
    dict_set(r, d, "revindex0", v_int(r, (int64_t)(cnt - i - 1)));
    dict_set(r, d, "first", v_bool(r, i == 0));
    dict_set(r, d, "last", v_bool(r, i == cnt - 1));
    dict_set(r, d, "length", v_int(r, (int64_t)cnt));
    dict_set(r, d, "previtem", i > 0 ? items->u.l->v[i - 1] : r->undef);
    dict_set(r, d, "nextitem", i + 1 < cnt ? items->u.l->v[i + 1] : r->undef);
    env_set(r, scope, loopn, loop);
    r->line = n->line;
    bind_target(r, n->a, items->u.l->v[i], scope);
    exec_block(r, &n->l1, scope, out);
    if (r->ctl == CTL_BREAK) {
      r->ctl = CTL_NONE;
      break;
    }
    if (r->ctl == CTL_NONE) iterated = true; /* like Jinja: a `continue`d pass does not count */
    r->ctl = CTL_NONE;
  }
  if (!iterated) exec_block(r, &n->l2, scope, out);
}

static void exec_stmt(R *r, const jj_node *n, jj_env *env, jj_sb *out) {
  r->line = n->line;
  switch (n->kind) {
    case N_IF: {
      if (++r->depth > JJ_MAX_EVAL_DEPTH) fail(r, "maximum recursion depth exceeded");
      bool t = truthy(eval(r, n->a, env));
      exec_block(r, t ? &n->l1 : &n->l2, env, out);
      r->depth--;
      return;
    }
    case N_FOR:
      if (++r->depth > JJ_MAX_EVAL_DEPTH) fail(r, "maximum recursion depth exceeded");
      exec_for(r, n, env, out);
      r->depth--;
      return;
    case N_SET: {
      jv *rhs;
      if (n->b) rhs = eval(r, n->b, env);
      else {
        jj_sb b;
        jj_sb_init(&b, &r->arena);
        exec_block(r, &n->l1, env, &b);
        rhs = v_jstr(r, jj_sb_str(&b));
      }
      r->line = n->line;
      const jj_node *a = n->a;
      if (a->kind == N_IDENT || a->kind == N_TUPLE) {
        if (a->kind == N_TUPLE && rhs->t != V_LIST) fail(r, "Cannot unpack non-iterable type in set: %s", tname(rhs));
        bind_target(r, a, rhs, env);
      } else if (a->kind == N_MEMBER) {
        jv *obj = eval(r, a->a, env);
        r->line = n->line;
        if (obj->t != V_NS) fail(r, "cannot assign attribute on non-namespace object");
        if (a->op || a->b->kind != N_IDENT) fail(r, "Cannot assign to member with non-identifier property");
        dict_setj(r, obj->u.d, a->b->s, rhs);
      } else
        fail(r, "Invalid LHS inside assignment expression");
      return;
    }
    case N_MACRO: {
      jv *f = v_func(r, F_MACRO, NULL);
      f->u.fn->node = n;
      env_set(r, env, n->s, f);
      return;
    }
    case N_CALLBLOCK: {
      jv *caller = v_func(r, F_CALLER, NULL);
      caller->u.fn->node = n;
      caller->u.fn->env = env;
      jv *args, *kwargs;
      eval_args(r, &n->a->l1, env, &args, &kwargs);
      jv *fn = eval(r, n->a->a, env);
      r->line = n->line;
      if (fn->t != V_FUNC) fail(r, "Cannot call something that is not a function: got %s", tname(fn));
      jj_env *ne = env_new(r, env);
      jstr cn = {"caller", 6};
      env_set(r, ne, cn, caller);
      jv *res = call_func(r, fn, args, kwargs, ne);
      if (res->t != V_NONE && res->t != V_UNDEF) to_str(r, out, res);
      return;
    }
    case N_FILTERBLOCK: {
      jj_sb b;
      jj_sb_init(&b, &r->arena);
      exec_block(r, &n->l1, env, &b);
      jv *args = NULL, *kwargs = NULL;
      if (n->has_args) eval_args(r, &n->l2, env, &args, &kwargs);
      r->line = n->line;
      jv *res = apply_filter(r, v_jstr(r, jj_sb_str(&b)), n->s, args, kwargs, env);
      if (res->t != V_NONE && res->t != V_UNDEF) to_str(r, out, res);
      return;
    }
    case N_BREAK: r->ctl = CTL_BREAK; return;
    case N_CONTINUE: r->ctl = CTL_CONTINUE; return;
    case N_COMMENT: return;
    default: {
      jv *v = eval(r, n, env);
      if (v->t != V_NONE && v->t != V_UNDEF) to_str(r, out, v);
    }
  }
}

static void exec_block(R *r, const jj_nodes *body, jj_env *env, jj_sb *out) {
  for (int i = 0; i < body->n && !r->ctl; i++) exec_stmt(r, body->v[i], env, out);
}

/* ---------------- public API ---------------- */
static void mark_special(jj_node *n, jj_node *def);
static void mark_list(const jj_nodes *l, jj_node *def) {
  for (int i = 0; i < l->n; i++) mark_special(l->v[i], def);
}
/* flag macros/call blocks whose body reads `kwargs` / `varargs` (bit 0 / bit 1 of ->i) */
static void mark_special(jj_node *n, jj_node *def) {
  if (!n) return;
  if (n->kind == N_MACRO || n->kind == N_CALLBLOCK) {
    if (n->kind == N_CALLBLOCK) mark_special(n->a, def);
    for (int i = 0; i < n->l2.n; i++) mark_special(n->l2.v[i]->a, n);
    mark_list(&n->l1, n);
    return;
  }
  if (n->kind == N_IDENT && def) {
    if (jeqs(n->s, "kwargs")) def->i |= 1;
    if (jeqs(n->s, "varargs")) def->i |= 2;
  }
  if (n->kind == N_MEMBER && !n->op) {
    mark_special(n->a, def);
    return;
  }
  mark_special(n->a, def);
  mark_special(n->b, def);
  mark_special(n->c, def);
  mark_list(&n->l1, def);
  mark_list(&n->l2, def);
}

smelt_status sm_jinja_compile(const char *src, sm_jinja **out) {
  *out = NULL;
  if (!src) return sm_err(SMELT_ERR_INVALID, "chat template: NULL source");
  sm_jinja *t = sm_xcalloc(1, sizeof *t);
  char err[512];
  if (jj_parse(src, t, err, sizeof err) != 0) {
    jj_arena_free(&t->arena);
    free(t);
    return sm_err(SMELT_ERR_FORMAT, "chat template: %s", err);
  }
  mark_list(&t->body, NULL);
  *out = t;
  return SMELT_OK;
}

void sm_jinja_free(sm_jinja *t) {
  if (!t) return;
  jj_arena_free(&t->arena);
  free(t);
}

static smelt_status render_impl(const sm_jinja *tpl, const cJSON *context, char **out) {
  R *r = sm_xcalloc(1, sizeof *r);
  r->arena.limit = JJ_MAX_ARENA;
  r->arena.oom_jmp = &r->jb;
  r->arena.errbuf = r->err;
  if (setjmp(r->jb)) {
    smelt_status st = sm_err(SMELT_ERR_FORMAT, "chat template: %s", r->err);
    jj_arena_free(&r->arena);
    free(r);
    return st;
  }
  r->undef = nv(r, V_UNDEF);
  r->none = nv(r, V_NONE);
  r->vtrue = nv(r, V_BOOL);
  r->vtrue->u.b = true;
  r->vfalse = nv(r, V_BOOL);
  jj_env *g = env_new(r, NULL);
  static const struct {
    const char *n;
    jj_funckind k;
  } FN[] = {{"namespace", F_NAMESPACE}, {"raise_exception", F_RAISE}, {"range", F_RANGE}, {"strftime_now", F_STRFTIME}};
  for (size_t i = 0; i < SM_ARRAY_LEN(FN); i++) dict_set(r, &g->vars, FN[i].n, v_func(r, FN[i].k, NULL));
  dict_set(r, &g->vars, "true", r->vtrue);
  dict_set(r, &g->vars, "false", r->vfalse);
  dict_set(r, &g->vars, "none", r->none);
  dict_set(r, &g->vars, "True", r->vtrue);
  dict_set(r, &g->vars, "False", r->vfalse);
  dict_set(r, &g->vars, "None", r->none);
  if (context) {
    if (!cJSON_IsObject(context)) fail(r, "render context must be a JSON object");
    for (const cJSON *c = context->child; c; c = c->next)
      if (c->string) dict_set(r, &g->vars, c->string, from_json(r, c, 0));
  }
  jj_sb b;
  jj_sb_init(&b, &r->arena);
  exec_block(r, &tpl->body, g, &b);
  if (r->ctl) fail(r, "break/continue outside of a loop");
  char *o = malloc(b.n + 1);
  if (!o) fail(r, "out of memory");
  if (b.n) memcpy(o, b.p, b.n);
  o[b.n] = 0;
  *out = o;
  jj_arena_free(&r->arena);
  free(r);
  return SMELT_OK;
}

smelt_status sm_jinja_render(const sm_jinja *tpl, const cJSON *context, char **out) {
  if (!out) return sm_err(SMELT_ERR_INVALID, "sm_jinja_render: NULL out");
  *out = NULL;
  if (!tpl) return sm_err(SMELT_ERR_INVALID, "sm_jinja_render: NULL template");
  return render_impl(tpl, context, out);
}
