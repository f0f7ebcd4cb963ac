/* Private header of the chat-template runtime (jinja_value.c, jinja_builtin.c, jinja_eval.c):
 * the per-render state, value helpers, scratch buffers and the entry points each file offers the
 * others. The compiled template and the value types themselves are in jinja_int.h. */
#ifndef SM_JINJA_RT_H
#define SM_JINJA_RT_H
#include <setjmp.h>
#include <string.h>
#include "base/strbuf.h"
#include "tokenizer/jinja_int.h"

/* One render. Runtime values live in `arena`; text is built in scratch sm_bufs taken from a pool
 * (jj_buf) and copied into the arena when done (jj_buf_value / jj_buf_take), so an error that
 * longjmps out of a render leaks nothing: render_impl frees the pool and the arena. */
typedef struct {
  jj_arena arena;
  jmp_buf jb;
  char err[512];
  int line, depth, ctl; /* ctl: 1 break, 2 continue */
  long iters;
  jv *undef, *none, *vtrue, *vfalse;
  sm_buf **bufs, **spare; /* every scratch buffer made; those free for reuse */
  size_t nbufs, nspare, capbufs;
} jj_rt;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

__attribute__((format(printf, 2, 3), noreturn)) void jj_fail(jj_rt *r, const char *fmt, ...);
const char *jj_tname(const jv *v); /* Python's type name: 'str', 'list', 'generator' ... */

/* ---- undefined values (jinja_value.c): Jinja2's default Undefined ---- */
__attribute__((format(printf, 2, 3))) jv *jj_undef(jj_rt *r, const char *fmt, ...); /* with the message it raises */
jv *jj_undef_attr(jj_rt *r, const jv *obj, const jv *name);          /* "'dict object' has no attribute 'x'" */
__attribute__((noreturn)) void jj_undef_fail(jj_rt *r, const jv *u); /* raise UndefinedError for u */

/* ---- scratch buffers (jinja_value.c) ---- */
sm_buf *jj_buf(jj_rt *r);              /* an empty buffer for building text */
jstr jj_buf_take(jj_rt *r, sm_buf *b); /* copy the text into the arena; b goes back to the pool */
jv *jj_buf_value(jj_rt *r, sm_buf *b); /* the same, as a string value */
void jj_bufs_free(jj_rt *r);

/* ---- values (jinja_value.c) ---- */
jv *jj_new(jj_rt *r, jj_vtype t);
jv *jj_int(jj_rt *r, int64_t i);
jv *jj_float(jj_rt *r, double f);
static inline jv *jj_bool(jj_rt *r, bool b) { return b ? r->vtrue : r->vfalse; }
jv *jj_strn(jj_rt *r, const char *s, size_t n);
jv *jj_jstr(jj_rt *r, jstr s); /* no copy: s must live as long as the render */
jv *jj_cstr(jj_rt *r, const char *s);
jv *jj_list_new(jj_rt *r);
jv *jj_seq_new(jj_rt *r, int lk); /* a V_LIST of kind LK_* */
void jj_list_push(jj_rt *r, jv *l, jv *x);
jv *jj_dict_new(jj_rt *r, jj_vtype t);
static inline bool jj_eq(jstr a, const char *s, size_t n) { return a.n == n && !memcmp(a.s, s, n); }
static inline bool jj_eqs(jstr a, const char *s) { return jj_eq(a, s, strlen(s)); }
jv **jj_dict_slot(jj_dict *d, const char *k, size_t n);
jv *jj_dict_get(jj_dict *d, const char *k, size_t n);
void jj_dict_setj(jj_rt *r, jj_dict *d, jstr k, jv *x);
void jj_dict_set(jj_rt *r, jj_dict *d, const char *k, jv *x);
jv *jj_func_new(jj_rt *r, jj_funckind k, jv *self);
jv *jj_dict_items(jj_rt *r, jv *d);
jv *jj_dict_keys(jj_rt *r, jv *d);
jv *jj_dict_values(jj_rt *r, jv *d);
jv *jj_chars_of(jj_rt *r, jv *s);
/* Python iter(v) run to the end: a plain list of the items (dict: keys, str: characters, undefined:
 * none); consumes a generator; fails for what is not iterable */
jv *jj_iterate(jj_rt *r, jv *v);
bool jj_is_iter(const jv *v);          /* a one-pass iterator (LK_GEN / LK_REVITER) */
int64_t jj_len(jj_rt *r, const jv *v); /* Python len(); fails where Python has none */
jj_env *jj_env_new(jj_rt *r, jj_env *parent);
void jj_env_set(jj_rt *r, jj_env *e, jstr name, jv *v);
jv *jj_env_get(jj_env *e, jstr name);
jv *jj_from_json(jj_rt *r, const cJSON *j, int depth);

/* ---- conversions, truth, equality, ordering (jinja_value.c) ---- */
typedef struct {
  bool pretty;            /* indent given: one item a line */
  int indent;             /* spaces a level, or ... */
  const char *indent_str; /* ... this string a level */
  size_t indent_len;
  bool ensure_ascii, sort_keys;
  const char *item_sep, *key_sep;
} json_opts;
void jj_to_json(jj_rt *r, sm_buf *b, const jv *v, const json_opts *o, int depth);
void jj_to_str(jj_rt *r, sm_buf *b, const jv *v);  /* what {{ }} prints */
void jj_raw_str(jj_rt *r, sm_buf *b, const jv *v); /* what ~, + and join concatenate */
void jj_repr(jj_rt *r, sm_buf *b, const jv *v);    /* Python repr() */
jv *jj_str_of(jj_rt *r, const jv *v, bool raw);
void jj_py_float(double d, char *out, size_t outn); /* Python repr of a float */
bool jj_py_printable(uint32_t cp);                  /* Python str.isprintable of a non-ASCII code point */
bool jj_truthy(const jv *v);
static inline bool jj_is_num(const jv *v) { return v->t == V_INT || v->t == V_FLOAT; }
static inline double jj_num_of(const jv *v) {
  return v->t == V_INT   ? (double)v->u.i
       : v->t == V_FLOAT ? v->u.f
       : v->t == V_BOOL  ? (double)v->u.b
                         : __builtin_nan("");
}
bool jj_strict_eq(const jv *a, const jv *b);
bool jj_loose_eq(jj_rt *r, const jv *a, const jv *b);
int jj_cmp_str(jj_rt *r, const jv *a, const jv *b, bool case_sensitive);
int jj_compare(jj_rt *r, const jv *a, const jv *b, bool case_sensitive);
jv *jj_attr_path(jj_rt *r, jv *item, const char *path, size_t n);
jv *jj_sorted(jj_rt *r, jv *l, bool rev, bool case_sensitive, jv *attr);
jv *jj_arith_int(jj_rt *r, int op, int64_t a, int64_t b);

/* ---- call arguments (jinja_value.c) ---- */
jv *jj_arg(jv *args, jv *kwargs, size_t i, const char *name); /* positional i, else keyword name, else NULL */
static inline size_t jj_nargs(jv *args) { return args ? args->u.l->n : 0; }

/* ---- Python str semantics (jinja_str.c) ---- */
size_t jj_cp_count(const char *s, size_t n);
const char *jj_memmem(const char *h, size_t hn, const char *n, size_t nn);
jv *jj_case_map(jj_rt *r, const jv *v, int mode /* 0 lower, 1 upper */);
jv *jj_py_title(jj_rt *r, const jv *v);      /* str.title() */
jv *jj_py_capitalize(jj_rt *r, const jv *v); /* str.capitalize() */
jv *jj_title_filter(jj_rt *r, const jv *v);  /* Jinja2's |title */
bool jj_py_iscase(const jv *v, bool upper);  /* str.isupper() / islower() */
jv *jj_strip(jj_rt *r, const jv *v, int which /* bit 0 left, bit 1 right */, const jv *chars /* NULL: whitespace */);
jv *jj_str_replace(jj_rt *r, const jv *v, const jv *old, const jv *new_, int64_t count);
jv *jj_split_str(jj_rt *r, jv *s, jv *sep, int64_t maxsplit);
jv *jj_splitlines(jj_rt *r, const jv *v);
jv *jj_indent(jj_rt *r, jv *s, jv *width, bool first, bool blank);
bool jj_py_int_of_str(const jv *s, int base, int64_t *out, bool *overflow); /* false: ValueError */
bool jj_py_float_of_str(const jv *s, double *out);
jv *jj_py_percent(jj_rt *r, jv *fmt, jv *arg);             /* fmt % arg */
jv *jj_py_format(jj_rt *r, jv *fmt, jv *args, jv *kwargs); /* fmt.format(...) */

/* ---- builtins (jinja_builtin.c) ---- */
jv *jj_builtin_member(jj_rt *r, jv *obj, jstr name); /* NULL if none */
bool jj_test(jj_rt *r, jstr name, jv *v, jv *args, int nargs);
jv *jj_filter(jj_rt *r, jv *v, jstr name, jv *args, jv *kwargs, jj_env *env);
jv *jj_call_builtin(jj_rt *r, jv *fn, jv *args, jv *kwargs); /* every function but macros and caller */

/* ---- evaluator (jinja_eval.c) ---- */
jv *jj_call(jj_rt *r, jv *fn, jv *args, jv *kwargs, jv *caller /* NULL: none */);
bool jj_py_in(jj_rt *r, jv *x, jv *container);   /* Python's `x in container` */
jv *jj_loop_attr(jj_rt *r, jv *loop, jstr name); /* NULL if none */
jv *jj_getattr(jj_rt *r, jv *obj, jv *name);     /* obj.name (Jinja2's sandboxed getattr) */
jv *jj_getitem(jj_rt *r, jv *obj, jv *key);      /* obj[key] (Jinja2's sandboxed getitem) */
#endif
