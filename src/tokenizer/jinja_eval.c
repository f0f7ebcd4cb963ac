/* Chat-template evaluator: expressions, operators, member access and slicing, macro calls,
 * statements, and the public compile / render API (chat.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/chat.h"
#include "tokenizer/jinja_rt.h"

static jv *eval(jj_rt *r, const jj_node *n, jj_env *env);
static void exec_block(jj_rt *r, const jj_nodes *body, jj_env *env, sm_buf *out);
static jv *loop_call(jj_rt *r, jv *fnv, jv *args);

static void check_iter(jj_rt *r) {
  if (++r->iters > JJ_MAX_ITERATIONS) jj_fail(r, "iteration limit exceeded");
}

/* ---------------- arguments ---------------- */
static void eval_args(jj_rt *r, const jj_nodes *an, jj_env *env, jv **args, jv **kwargs) {
  jv *a = jj_list_new(r), *k = jj_dict_new(r, V_DICT);
  k->kwargs = 1;
  for (int i = 0; i < an->n; i++) {
    const jj_node *x = an->v[i];
    if (x->kind == N_SPREAD) {
      jv *v = eval(r, x->a, env);
      if (v->t != V_LIST) jj_fail(r, "Cannot unpack non-iterable type: %s", jj_tname(v));
      for (size_t j = 0; j < v->u.l->n; j++) jj_list_push(r, a, v->u.l->v[j]);
    } else if (x->kind != N_KWARG && x->kind != N_KWSPREAD) jj_list_push(r, a, eval(r, x, env));
  }
  for (int i = 0; i < an->n; i++) {
    const jj_node *x = an->v[i];
    if (x->kind == N_KWARG) {
      if (jj_dict_get(k->u.d, x->s.s, x->s.n))
        jj_fail(r, "Got multiple values for keyword argument '%.*s'", (int)x->s.n, x->s.s);
      jj_dict_setj(r, k->u.d, x->s, eval(r, x->a, env));
    } else if (x->kind == N_KWSPREAD) {
      jv *v = eval(r, x->a, env);
      if (v->t != V_DICT) jj_fail(r, "Argument after ** must be a mapping, not %s", jj_tname(v));
      for (size_t j = 0; j < v->u.d->n; j++) {
        if (jj_dict_get(k->u.d, v->u.d->k[j].s, v->u.d->k[j].n))
          jj_fail(r, "Got multiple values for keyword argument '%.*s'", (int)v->u.d->k[j].n, v->u.d->k[j].s);
        jj_dict_setj(r, k->u.d, v->u.d->k[j], v->u.d->v[j]);
      }
    }
  }
  *args = a;
  *kwargs = k;
}

/* ---------------- attribute and item access (Jinja2's SandboxedEnvironment getattr/getitem) ---- */
/* Python attributes of the value types: methods (jj_builtin_member) and namespace entries */
static jv *py_attr(jj_rt *r, jv *obj, jstr name) {
  if (obj->t == V_NS) return jj_dict_get(obj->u.d, name.s, name.n);
  if (obj->t == V_LOOP) return jj_loop_attr(r, obj, name);
  if (obj->t == V_STR || obj->t == V_DICT || (obj->t == V_LIST && obj->lk == LK_LIST))
    return jj_builtin_member(r, obj, name);
  return NULL;
}

/* obj[key] as Python does it; NULL where Python raises TypeError / LookupError */
static jv *py_item(jj_rt *r, jv *obj, jv *key) {
  if (obj->t == V_DICT) {
    if (key->t != V_STR) return NULL; /* JSON objects have string keys only */
    return jj_dict_get(obj->u.d, key->u.s.s, key->u.s.n);
  }
  if ((obj->t == V_LIST && (obj->lk == LK_LIST || obj->lk == LK_RANGE)) || obj->t == V_STR) {
    if (key->t != V_INT && key->t != V_BOOL) return NULL;
    int64_t i = key->t == V_BOOL ? key->u.b : key->u.i;
    if (obj->t == V_LIST) {
      int64_t n = (int64_t)obj->u.l->n;
      if (i < 0) i += n;
      return i >= 0 && i < n ? obj->u.l->v[i] : NULL;
    }
    int64_t n = (int64_t)jj_cp_count(obj->u.s.s, obj->u.s.n);
    if (i < 0) i += n;
    if (i < 0 || i >= n) return NULL;
    size_t p = 0;
    for (int64_t k = 0; k < i; k++) p += jj_utf8_next(obj->u.s.s, obj->u.s.n, p, NULL);
    jstr s = {obj->u.s.s + p, jj_utf8_next(obj->u.s.s, obj->u.s.n, p, NULL)};
    return jj_jstr(r, s);
  }
  return NULL;
}

jv *jj_getattr(jj_rt *r, jv *obj, jv *name) {
  if (obj->t == V_UNDEF) jj_undef_fail(r, obj);
  jv *v = name->t == V_STR ? py_attr(r, obj, name->u.s) : NULL;
  if (!v) v = py_item(r, obj, name);
  return v ? v : jj_undef_attr(r, obj, name);
}

jv *jj_getitem(jj_rt *r, jv *obj, jv *key) {
  if (obj->t == V_UNDEF) jj_undef_fail(r, obj);
  jv *v = py_item(r, obj, key);
  if (!v && key->t == V_STR) v = py_attr(r, obj, key->u.s);
  return v ? v : jj_undef_attr(r, obj, key);
}

static void slice_idx(int64_t len, bool hs, int64_t start, bool he, int64_t stop, int64_t step, int64_t *o_start,
                      int64_t *o_stop) {
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

static jv *do_slice(jj_rt *r, jv *obj, const jj_node *sl, jj_env *env) {
  if (obj->t == V_UNDEF) jj_undef_fail(r, obj);
  jv *a = sl->a ? eval(r, sl->a, env) : r->none;
  jv *b = sl->b ? eval(r, sl->b, env) : r->none;
  jv *c = sl->c ? eval(r, sl->c, env) : r->none;
  if (c->t == V_INT && c->u.i == 0) jj_fail(r, "ValueError: slice step cannot be zero");
  /* Python raises TypeError (which Jinja2 turns into an undefined value) for other objects and indices */
  if ((obj->t != V_LIST || obj->lk != LK_LIST) && obj->t != V_STR)
    return jj_undef(r, "%s object has no element slice", jj_tname(obj));
  if ((a->t != V_INT && a->t != V_NONE) || (b->t != V_INT && b->t != V_NONE) || (c->t != V_INT && c->t != V_NONE))
    return jj_undef(r, "%s object has no element slice", jj_tname(obj));
  int64_t step = c->t == V_INT ? c->u.i : 1;
  int dir = step > 0 ? 1 : step < 0 ? -1 : 0;
  if (obj->t == V_LIST) {
    int64_t st, en, len = (int64_t)obj->u.l->n;
    slice_idx(len, a->t == V_INT, a->u.i, b->t == V_INT, b->u.i, step, &st, &en);
    jv *o = jj_list_new(r);
    o->tuple = obj->tuple;
    if (dir)
      for (int64_t i = st; dir * i < dir * en; i += step) jj_list_push(r, o, obj->u.l->v[i]);
    return o;
  }
  /* string: by code points */
  size_t n = obj->u.s.n, cnt = jj_cp_count(obj->u.s.s, n);
  size_t *off = jj_alloc(&r->arena, (cnt + 1) * sizeof(size_t));
  for (size_t i = 0, k = 0; i < n; k++) off[k] = i, i += jj_utf8_next(obj->u.s.s, n, i, NULL);
  off[cnt] = n;
  int64_t st, en;
  slice_idx((int64_t)cnt, a->t == V_INT, a->u.i, b->t == V_INT, b->u.i, step, &st, &en);
  sm_buf *sb = jj_buf(r);
  if (dir)
    for (int64_t i = st; dir * i < dir * en; i += step) sm_buf_put(sb, obj->u.s.s + off[i], off[i + 1] - off[i]);
  return jj_buf_value(r, sb);
}

/* ---------------- binary / unary operators ---------------- */

/* Python's `x in c` */
bool jj_py_in(jj_rt *r, jv *x, jv *c) {
  switch (c->t) {
    case V_UNDEF: return false;
    case V_STR:
      if (x->t != V_STR) jj_fail(r, "TypeError: 'in <string>' requires string as left operand, not %s", jj_tname(x));
      return jj_memmem(c->u.s.s, c->u.s.n, x->u.s.s, x->u.s.n) != NULL;
    case V_DICT: return x->t == V_STR && jj_dict_get(c->u.d, x->u.s.s, x->u.s.n) != NULL;
    case V_LIST: {
      if (c->lk == LK_KEYS || c->lk == LK_ITEMS || c->lk == LK_VALUES || !jj_is_iter(c)) {
        for (size_t i = 0; i < c->u.l->n; i++)
          if (jj_loose_eq(r, c->u.l->v[i], x)) return true;
        return false;
      }
      while (c->u.l->pos < c->u.l->n) /* an iterator is consumed up to the match */
        if (jj_loose_eq(r, c->u.l->v[c->u.l->pos++], x)) return true;
      return false;
    }
    default: jj_fail(r, "TypeError: argument of type '%s' is not iterable", jj_tname(c));
  }
}

static jv *binop(jj_rt *r, const jj_node *n, jj_env *env) {
  jv *l = eval(r, n->a, env);
  if (n->op == OP_AND) return jj_truthy(l) ? eval(r, n->b, env) : l;
  if (n->op == OP_OR) return jj_truthy(l) ? l : eval(r, n->b, env);
  jv *rt = eval(r, n->b, env);
  r->line = n->line;
  int op = n->op;
  if (op == OP_EQ) return jj_bool(r, jj_loose_eq(r, l, rt));
  if (op == OP_NE) return jj_bool(r, !jj_loose_eq(r, l, rt));
  if (op == OP_IN || op == OP_NOTIN) {
    bool m = jj_py_in(r, l, rt);
    return jj_bool(r, op == OP_IN ? m : !m);
  }
  if (op == OP_TILDE) { /* str(a) + str(b) */
    sm_buf *b = jj_buf(r);
    jj_raw_str(r, b, l);
    jj_raw_str(r, b, rt);
    return jj_buf_value(r, b);
  }
  if (l->t == V_UNDEF) jj_undef_fail(r, l);
  if (rt->t == V_UNDEF) jj_undef_fail(r, rt);
  static const char *opn[] = {"+",  "-", "~", "*",  "/",  "//",  "%",  "**", "==",
                              "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"};
  /* bool is an int in Python */
  jv lb, rb;
  if (l->t == V_BOOL) lb = (jv){.t = V_INT, .u.i = l->u.b}, l = &lb;
  if (rt->t == V_BOOL) rb = (jv){.t = V_INT, .u.i = rt->u.b}, rt = &rb;
  if (jj_is_num(l) && jj_is_num(rt)) {
    bool isf = l->t == V_FLOAT || rt->t == V_FLOAT;
    double a = jj_num_of(l), b = jj_num_of(rt);
    switch (op) {
      case OP_ADD:
      case OP_SUB:
      case OP_MUL:
        if (!isf) return jj_arith_int(r, op, l->u.i, rt->u.i);
        return jj_float(r, op == OP_ADD ? a + b : op == OP_SUB ? a - b : a * b);
      case OP_DIV:
        if (b == 0) jj_fail(r, "ZeroDivisionError: division by zero");
        return jj_float(r, a / b);
      case OP_FLOORDIV:
        if (!isf) return jj_arith_int(r, op, l->u.i, rt->u.i);
        if (b == 0) jj_fail(r, "ZeroDivisionError: float floor division by zero");
        return jj_float(r, floor(a / b));
      case OP_MOD: {
        if (!isf) return jj_arith_int(r, op, l->u.i, rt->u.i);
        if (b == 0) jj_fail(r, "ZeroDivisionError: float modulo");
        double m = fmod(a, b);
        if (m != 0 && (m < 0) != (b < 0)) m += b;
        else if (m == 0) m = copysign(0.0, b);
        return jj_float(r, m);
      }
      case OP_POW: {
        if (a == 0 && b < 0) jj_fail(r, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
        if (!isf && rt->u.i >= 0) {
          int64_t base = l->u.i, e = rt->u.i, res = 1;
          for (int64_t k = 0; k < e; k++) {
            if (__builtin_mul_overflow(res, base, &res)) jj_fail(r, "integer overflow");
            if (res == 0 || res == 1) break;
            if (res == -1) {
              res = (e - k - 1) % 2 ? -res : res;
              break;
            }
          }
          return jj_int(r, res);
        }
        double res = pow(a, b);
        if (!isfinite(res)) jj_fail(r, "OverflowError: numerical result out of range");
        return jj_float(r, res);
      }
      case OP_LT: return jj_bool(r, a < b);
      case OP_GT: return jj_bool(r, a > b);
      case OP_LE: return jj_bool(r, a <= b);
      case OP_GE: return jj_bool(r, a >= b);
    }
  }
  if (l->t == V_STR && rt->t == V_STR) {
    if (op == OP_ADD) {
      sm_buf *b = jj_buf(r);
      sm_buf_put(b, l->u.s.s, l->u.s.n);
      sm_buf_put(b, rt->u.s.s, rt->u.s.n);
      return jj_buf_value(r, b);
    }
    int c = jj_cmp_str(r, l, rt, true);
    switch (op) {
      case OP_LT: return jj_bool(r, c < 0);
      case OP_GT: return jj_bool(r, c > 0);
      case OP_LE: return jj_bool(r, c <= 0);
      case OP_GE: return jj_bool(r, c >= 0);
    }
  }
  if (op == OP_MOD && l->t == V_STR) return jj_py_percent(r, l, rt);
  /* list + list, tuple + tuple */
  if (op == OP_ADD && l->t == V_LIST && rt->t == V_LIST && l->lk == LK_LIST && rt->lk == LK_LIST &&
      l->tuple == rt->tuple) {
    jv *o = jj_list_new(r);
    o->tuple = l->tuple;
    for (size_t i = 0; i < l->u.l->n; i++) jj_list_push(r, o, l->u.l->v[i]);
    for (size_t i = 0; i < rt->u.l->n; i++) jj_list_push(r, o, rt->u.l->v[i]);
    return o;
  }
  /* sequence repetition: str * int, list * int */
  if (op == OP_MUL && ((l->t == V_INT) != (rt->t == V_INT))) {
    jv *s = l->t == V_INT ? rt : l;
    int64_t k = l->t == V_INT ? l->u.i : rt->u.i;
    if (s->t == V_STR) {
      if (k > 0 && (double)k * (double)s->u.s.n > 64e6) jj_fail(r, "string repetition too large");
      sm_buf *b = jj_buf(r);
      for (int64_t i = 0; i < k; i++) sm_buf_put(b, s->u.s.s, s->u.s.n);
      return jj_buf_value(r, b);
    }
    if (s->t == V_LIST && s->lk == LK_LIST) {
      if (k > 0 && (double)k * (double)s->u.l->n > 1e6) jj_fail(r, "list repetition too large");
      jv *o = jj_list_new(r);
      o->tuple = s->tuple;
      for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < s->u.l->n; j++) jj_list_push(r, o, s->u.l->v[j]);
      return o;
    }
  }
  if (op >= OP_LT && op <= OP_GE)
    jj_fail(r, "TypeError: '%s' not supported between instances of '%s' and '%s'", opn[op], jj_tname(l), jj_tname(rt));
  jj_fail(r, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", opn[op], jj_tname(l), jj_tname(rt));
}

static void bind_params(jj_rt *r, const jj_node *def, const jj_nodes *params, jv *args, jv *kwargs, jj_env *scope,
                        const char *disp) {
  jj_dict *kw = jj_calloc(&r->arena, sizeof(jj_dict));
  if (kwargs)
    for (size_t i = 0; i < kwargs->u.d->n; i++) jj_dict_setj(r, kw, kwargs->u.d->k[i], kwargs->u.d->v[i]);
  size_t np = (size_t)params->n, na = jj_nargs(args);
  bool *pending = jj_calloc(&r->arena, np + 1);
  for (size_t i = 0; i < np; i++) {
    const jj_node *p = params->v[i];
    jv *val = i < na ? args->u.l->v[i] : NULL;
    if (!val) {
      jv **slot = jj_dict_slot(kw, p->s.s, p->s.n);
      if (slot && *slot) {
        val = *slot;
        *slot = NULL; /* consumed */
      }
    }
    if (!val && p->kind == N_KWARG) pending[i] = true;
    jj_env_set(r, scope, p->s, val ? val : r->undef);
  }
  jv *rest = jj_dict_new(r, V_DICT);
  for (size_t i = 0; i < kw->n; i++)
    if (kw->v[i]) jj_dict_setj(r, rest->u.d, kw->k[i], kw->v[i]);
  jstr kwn = {"kwargs", 6}, van = {"varargs", 7};
  if (def->i & 1) jj_env_set(r, scope, kwn, rest);
  else if (rest->u.d->n)
    jj_fail(r, "macro %s takes no keyword argument '%.*s'", disp, (int)rest->u.d->k[0].n, rest->u.d->k[0].s);
  if (def->i & 2) {
    jv *va = jj_list_new(r);
    va->tuple = 1;
    for (size_t i = np; i < na; i++) jj_list_push(r, va, args->u.l->v[i]);
    jj_env_set(r, scope, van, va);
  } else if (na > np) jj_fail(r, "macro %s takes not more than %zu argument(s)", disp, np);
  for (size_t i = 0; i < np; i++)
    if (pending[i]) jj_env_set(r, scope, params->v[i]->s, eval(r, params->v[i]->a, scope));
}

/* ---------------- calls ---------------- */
/* a macro runs in a scope of its own whose parent is the scope it was defined in (a Python closure) */
jv *jj_call(jj_rt *r, jv *fnv, jv *args, jv *kwargs, jv *caller) {
  jj_func *fn = fnv->u.fn;
  if (fn->kind == F_LOOP_CYCLE || fn->kind == F_LOOP_CHANGED) return loop_call(r, fnv, args);
  if (fn->kind != F_MACRO && fn->kind != F_CALLER) return jj_call_builtin(r, fnv, args, kwargs);
  if (++r->depth > JJ_MAX_EVAL_DEPTH) jj_fail(r, "maximum recursion depth exceeded");
  const jj_node *def = fn->node;
  jj_env *scope = jj_env_new(r, fn->env);
  if (caller) {
    jstr cn = {"caller", 6};
    jj_env_set(r, scope, cn, caller);
  }
  char disp[80];
  if (fn->kind == F_MACRO) snprintf(disp, sizeof disp, "'%.*s'", (int)(def->s.n > 60 ? 60 : def->s.n), def->s.s);
  else snprintf(disp, sizeof disp, "None");
  bind_params(r, def, &def->l2, args, kwargs, scope, disp);
  sm_buf *out = jj_buf(r);
  exec_block(r, &def->l1, scope, out);
  r->depth--;
  return jj_buf_value(r, out);
}

/* ---------------- expressions ---------------- */
static jv *eval(jj_rt *r, const jj_node *n, jj_env *env) {
  if (!n) return r->undef;
  if (++r->depth > JJ_MAX_EVAL_DEPTH) jj_fail(r, "maximum recursion depth exceeded");
  r->line = n->line;
  jv *res = NULL;
  switch (n->kind) {
    case N_STR: res = jj_jstr(r, n->s); break;
    case N_INT: res = jj_int(r, n->i); break;
    case N_FLOAT: res = jj_float(r, n->f); break;
    case N_IDENT: {
      res = jj_env_get(env, n->s);
      if (!res) res = jj_undef(r, "'%.*s' is undefined", (int)(n->s.n > 200 ? 200 : n->s.n), n->s.s);
      break;
    }
    case N_LIST:
    case N_TUPLE:
      res = jj_list_new(r);
      res->tuple = n->kind == N_TUPLE;
      for (int i = 0; i < n->l1.n; i++) jj_list_push(r, res, eval(r, n->l1.v[i], env));
      break;
    case N_DICT:
      res = jj_dict_new(r, V_DICT);
      for (int i = 0; i < n->l1.n; i++) {
        jv *k = eval(r, n->l1.v[i], env);
        if (k->t != V_STR) jj_fail(r, "Object keys must be strings: got %s", jj_tname(k));
        jj_dict_setj(r, res->u.d, k->u.s, eval(r, n->l2.v[i], env));
      }
      break;
    case N_MEMBER: {
      jv *obj = eval(r, n->a, env);
      r->line = n->line;
      if (n->op && n->b->kind == N_SLICE) {
        res = do_slice(r, obj, n->b, env);
        break;
      }
      /* a.b is getattr, a[b] and a.0 are getitem */
      if (n->op) res = jj_getitem(r, obj, eval(r, n->b, env));
      else if (n->b->kind == N_INT) res = jj_getitem(r, obj, jj_int(r, n->b->i));
      else res = jj_getattr(r, obj, jj_jstr(r, n->b->s));
      break;
    }
    case N_CALL: {
      jv *args, *kwargs;
      eval_args(r, &n->l1, env, &args, &kwargs);
      jv *fn = eval(r, n->a, env);
      r->line = n->line;
      if (fn->t == V_UNDEF) jj_undef_fail(r, fn);
      if (fn->t != V_FUNC) jj_fail(r, "TypeError: '%s' object is not callable", jj_tname(fn));
      res = jj_call(r, fn, args, kwargs, NULL);
      break;
    }
    case N_BINOP: res = binop(r, n, env); break;
    case N_UNARY: {
      jv *a = eval(r, n->a, env);
      r->line = n->line;
      if (n->op == OP_NOT) res = jj_bool(r, !jj_truthy(a));
      else if (a->t == V_UNDEF) jj_undef_fail(r, a);
      else if (a->t == V_INT || a->t == V_BOOL) {
        int64_t x = a->t == V_BOOL ? a->u.b : a->u.i;
        if (n->op == OP_NEG && x == INT64_MIN) jj_fail(r, "integer overflow");
        res = jj_int(r, n->op == OP_NEG ? -x : x);
      } else if (a->t == V_FLOAT) res = jj_float(r, n->op == OP_NEG ? -a->u.f : a->u.f);
      else jj_fail(r, "TypeError: bad operand type for unary %s: '%s'", n->op == OP_NEG ? "-" : "+", jj_tname(a));
      break;
    }
    case N_FILTER: {
      jv *v = eval(r, n->a, env);
      jv *args = NULL, *kwargs = NULL;
      if (n->has_args) eval_args(r, &n->l1, env, &args, &kwargs);
      r->line = n->line;
      res = jj_filter(r, v, n->s, args, kwargs, env);
      break;
    }
    case N_TEST: {
      jv *v = eval(r, n->a, env);
      jv *args = NULL, *kwargs = NULL;
      if (n->has_args) eval_args(r, &n->l1, env, &args, &kwargs);
      r->line = n->line;
      bool t = jj_test(r, n->s, v, args, (int)jj_nargs(args));
      res = jj_bool(r, n->op ? !t : t);
      break;
    }
    case N_SELECT:
      res = jj_truthy(eval(r, n->b, env))
            ? eval(r, n->a, env)
            : jj_undef(r, "the inline if-expression on line %d evaluated to false and no else section was defined.",
                       n->line);
      break;
    case N_TERNARY: res = jj_truthy(eval(r, n->a, env)) ? eval(r, n->b, env) : eval(r, n->c, env); break;
    case N_SLICE: jj_fail(r, "unexpected slice");
    case N_KWARG:
    case N_SPREAD:
    case N_KWSPREAD: jj_fail(r, "unexpected argument expression");
    default: jj_fail(r, "statement used as expression");
  }
  r->depth--;
  return res;
}

/* ---------------- statements ---------------- */
static void bind_target(jj_rt *r, const jj_node *target, jv *val, jj_env *env) {
  if (target->kind == N_IDENT) {
    jj_env_set(r, env, target->s, val);
    return;
  }
  val = jj_iterate(r, val);
  if ((size_t)target->l1.n > val->u.l->n)
    jj_fail(r, "ValueError: not enough values to unpack (expected %d, got %zu)", target->l1.n, val->u.l->n);
  if ((size_t)target->l1.n < val->u.l->n)
    jj_fail(r, "ValueError: too many values to unpack (expected %d)", target->l1.n);
  for (int j = 0; j < target->l1.n; j++) {
    if (target->l1.v[j]->kind != N_IDENT) jj_fail(r, "Cannot unpack to non-identifier");
    jj_env_set(r, env, target->l1.v[j]->s, val->u.l->v[j]);
  }
}

/* The `loop` object, lazy like Jinja2's LoopContext: items come from the source one at a time, the
 * loop's `if` test is evaluated as they are reached (it sees what the body did before), and only
 * loop.last / nextitem look one item ahead and loop.length / revindex read the rest. An iterator
 * (generator) being looped over is consumed as far as the loop read it. */
struct jj_loop {
  jv *src;                /* the items, a plain list */
  jv *iter;               /* the iterator looped over, or NULL */
  size_t iter_base, next; /* iter->pos at the start; next source index to read */
  const jj_node *target, *test;
  jj_env *env; /* where the test is evaluated */
  jv **ahead;  /* items read ahead (they passed the test) */
  size_t nahead, cap;
  int64_t index0;
  jv *prev, *changed; /* changed: args of the last loop.changed() call, NULL before it */
};

static bool loop_pull(jj_rt *r, jj_loop *L, jv **out) {
  while (L->next < L->src->u.l->n) {
    jv *cur = L->src->u.l->v[L->next++];
    if (L->iter) L->iter->u.l->pos = L->iter_base + L->next;
    if (L->test) {
      check_iter(r);
      jj_env *ls = jj_env_new(r, L->env);
      bind_target(r, L->target, cur, ls);
      if (!jj_truthy(eval(r, L->test, ls))) continue;
    }
    *out = cur;
    return true;
  }
  return false;
}
static void loop_push_ahead(jj_rt *r, jj_loop *L, jv *x) {
  if (L->nahead == L->cap) {
    L->cap = L->cap ? L->cap * 2 : 4;
    jv **n = jj_alloc(&r->arena, L->cap * sizeof(jv *));
    if (L->nahead) memcpy(n, L->ahead, L->nahead * sizeof(jv *));
    L->ahead = n;
  }
  L->ahead[L->nahead++] = x;
}
static bool loop_next(jj_rt *r, jj_loop *L, jv **out) {
  if (L->nahead) {
    *out = L->ahead[0];
    memmove(L->ahead, L->ahead + 1, --L->nahead * sizeof(jv *));
    return true;
  }
  return loop_pull(r, L, out);
}
static jv *loop_peek(jj_rt *r, jj_loop *L) {
  jv *x;
  if (!L->nahead) {
    if (!loop_pull(r, L, &x)) return NULL;
    loop_push_ahead(r, L, x);
  }
  return L->ahead[0];
}
static int64_t loop_length(jj_rt *r, jj_loop *L) {
  jv *x;
  while (loop_pull(r, L, &x)) loop_push_ahead(r, L, x);
  return L->index0 + 1 + (int64_t)L->nahead;
}

jv *jj_loop_attr(jj_rt *r, jv *lv, jstr name) {
  jj_loop *L = lv->u.lp;
#define A(s) jj_eqs(name, s)
  if (A("index0")) return jj_int(r, L->index0);
  if (A("index")) return jj_int(r, L->index0 + 1);
  if (A("first")) return jj_bool(r, L->index0 == 0);
  if (A("last")) return jj_bool(r, loop_peek(r, L) == NULL);
  if (A("length")) return jj_int(r, loop_length(r, L));
  if (A("revindex")) return jj_int(r, loop_length(r, L) - L->index0);
  if (A("revindex0")) return jj_int(r, loop_length(r, L) - L->index0 - 1);
  if (A("previtem")) return L->prev ? L->prev : jj_undef(r, "there is no previous item");
  if (A("nextitem")) {
    jv *x = loop_peek(r, L);
    return x ? x : jj_undef(r, "there is no next item");
  }
  if (A("depth")) return jj_int(r, 1);
  if (A("depth0")) return jj_int(r, 0);
  if (A("cycle")) return jj_func_new(r, F_LOOP_CYCLE, lv);
  if (A("changed")) return jj_func_new(r, F_LOOP_CHANGED, lv);
#undef A
  return NULL;
}

static jv *loop_call(jj_rt *r, jv *fnv, jv *args) {
  jj_loop *L = fnv->u.fn->self->u.lp;
  size_t na = jj_nargs(args);
  if (fnv->u.fn->kind == F_LOOP_CYCLE) {
    if (!na) jj_fail(r, "TypeError: no items for cycling given");
    return args->u.l->v[L->index0 % (int64_t)na];
  }
  args->tuple = 1;
  if (L->changed && jj_loose_eq(r, L->changed, args)) return r->vfalse;
  L->changed = args;
  return r->vtrue;
}

static void exec_for(jj_rt *r, const jj_node *n, jj_env *env, sm_buf *out) {
  const jj_node *test = NULL, *seq = n->b;
  if (seq->kind == N_SELECT) test = seq->b, seq = seq->a;
  jv *it = eval(r, seq, env);
  r->line = n->line;
  jj_loop *L = jj_calloc(&r->arena, sizeof *L);
  if (jj_is_iter(it)) { /* read as the loop goes */
    L->src = jj_list_new(r);
    for (size_t i = it->u.l->pos; i < it->u.l->n; i++) jj_list_push(r, L->src, it->u.l->v[i]);
    L->iter = it;
    L->iter_base = it->u.l->pos;
  } else L->src = jj_iterate(r, it);
  L->target = n->a;
  L->test = test;
  L->env = env;
  jv *loopv = jj_new(r, V_LOOP);
  loopv->u.lp = L;
  bool iterated = false;
  jstr loopn = {"loop", 4};
  jv *cur;
  for (L->index0 = 0; loop_next(r, L, &cur); L->index0++) {
    check_iter(r);
    jj_env *scope = jj_env_new(r, env); /* each pass has a scope of its own */
    jj_env_set(r, scope, loopn, loopv);
    r->line = n->line;
    bind_target(r, n->a, cur, scope);
    exec_block(r, &n->l1, scope, out);
    L->prev = cur;
    if (r->ctl == CTL_BREAK) {
      r->ctl = CTL_NONE;
      break;
    }
    if (r->ctl == CTL_NONE) iterated = true; /* like Jinja: a `continue`d pass does not count */
    r->ctl = CTL_NONE;
  }
  if (!iterated) exec_block(r, &n->l2, jj_env_new(r, env), out);
}

static void exec_stmt(jj_rt *r, const jj_node *n, jj_env *env, sm_buf *out) {
  r->line = n->line;
  switch (n->kind) {
    case N_IF: {
      if (++r->depth > JJ_MAX_EVAL_DEPTH) jj_fail(r, "maximum recursion depth exceeded");
      bool t = jj_truthy(eval(r, n->a, env));
      exec_block(r, t ? &n->l1 : &n->l2, env, out);
      r->depth--;
      return;
    }
    case N_FOR:
      if (++r->depth > JJ_MAX_EVAL_DEPTH) jj_fail(r, "maximum recursion depth exceeded");
      exec_for(r, n, env, out);
      r->depth--;
      return;
    case N_SET: {
      jv *rhs;
      if (n->b) rhs = eval(r, n->b, env);
      else {
        sm_buf *b = jj_buf(r);
        exec_block(r, &n->l1, jj_env_new(r, env), b);
        rhs = jj_buf_value(r, b);
      }
      r->line = n->line;
      const jj_node *a = n->a;
      if (a->kind == N_IDENT || a->kind == N_TUPLE) {
        bind_target(r, a, rhs, env);
      } else if (a->kind == N_MEMBER) {
        jv *obj = eval(r, a->a, env);
        r->line = n->line;
        if (obj->t != V_NS) jj_fail(r, "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        if (a->op || a->b->kind != N_IDENT) jj_fail(r, "Cannot assign to member with non-identifier property");
        jj_dict_setj(r, obj->u.d, a->b->s, rhs);
      } else jj_fail(r, "Invalid LHS inside assignment expression");
      return;
    }
    case N_MACRO: {
      jv *f = jj_func_new(r, F_MACRO, NULL);
      f->u.fn->node = n;
      f->u.fn->env = env;
      jj_env_set(r, env, n->s, f);
      return;
    }
    case N_CALLBLOCK: {
      jv *caller = jj_func_new(r, F_CALLER, NULL);
      caller->u.fn->node = n;
      caller->u.fn->env = env;
      jv *args, *kwargs;
      eval_args(r, &n->a->l1, env, &args, &kwargs);
      jv *fn = eval(r, n->a->a, env);
      r->line = n->line;
      if (fn->t == V_UNDEF) jj_undef_fail(r, fn);
      if (fn->t != V_FUNC) jj_fail(r, "TypeError: '%s' object is not callable", jj_tname(fn));
      jj_to_str(r, out, jj_call(r, fn, args, kwargs, caller));
      return;
    }
    case N_FILTERBLOCK: {
      sm_buf *b = jj_buf(r);
      exec_block(r, &n->l1, jj_env_new(r, env), b);
      jv *args = NULL, *kwargs = NULL;
      if (n->has_args) eval_args(r, &n->l2, env, &args, &kwargs);
      r->line = n->line;
      jj_to_str(r, out, jj_filter(r, jj_buf_value(r, b), n->s, args, kwargs, env));
      return;
    }
    case N_WITH: { /* the values are evaluated outside, then bound in a scope of the block's own */
      jj_env *scope = jj_env_new(r, env);
      jv **vals = jj_alloc(&r->arena, ((size_t)n->l2.n + 1) * sizeof(jv *));
      for (int i = 0; i < n->l2.n; i++) vals[i] = eval(r, n->l2.v[i]->a, env);
      for (int i = 0; i < n->l2.n; i++) jj_env_set(r, scope, n->l2.v[i]->s, vals[i]);
      exec_block(r, &n->l1, scope, out);
      return;
    }
    case N_BREAK: r->ctl = CTL_BREAK; return;
    case N_CONTINUE: r->ctl = CTL_CONTINUE; return;
    case N_COMMENT: return;
    default: jj_to_str(r, out, eval(r, n, env)); /* Python prints None; undefined prints nothing */
  }
}

static void exec_block(jj_rt *r, const jj_nodes *body, jj_env *env, sm_buf *out) {
  for (int i = 0; i < body->n && !r->ctl; i++) {
    exec_stmt(r, body->v[i], env, out);
    if (out->n > JJ_MAX_ARENA) jj_fail(r, "template output exceeds the memory limit");
  }
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
    if (jj_eqs(n->s, "kwargs")) def->i |= 1;
    if (jj_eqs(n->s, "varargs")) def->i |= 2;
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
  jj_rt *r = sm_xcalloc(1, sizeof *r);
  r->arena.limit = JJ_MAX_ARENA;
  r->arena.oom_jmp = &r->jb;
  r->arena.errbuf = r->err;
  if (setjmp(r->jb)) {
    smelt_status st = sm_err(SMELT_ERR_FORMAT, "chat template: %s", r->err);
    jj_bufs_free(r);
    jj_arena_free(&r->arena);
    free(r);
    return st;
  }
  r->undef = jj_new(r, V_UNDEF);
  r->none = jj_new(r, V_NONE);
  r->vtrue = jj_new(r, V_BOOL);
  r->vtrue->u.b = true;
  r->vfalse = jj_new(r, V_BOOL);
  jj_env *g = jj_env_new(r, NULL);
  static const struct {
    const char *n;
    jj_funckind k;
  } FN[] = {{"namespace", F_NAMESPACE}, {"raise_exception", F_RAISE}, {"range", F_RANGE}, {"strftime_now", F_STRFTIME}};
  for (size_t i = 0; i < SM_ARRAY_LEN(FN); i++) jj_dict_set(r, &g->vars, FN[i].n, jj_func_new(r, FN[i].k, NULL));
  jj_dict_set(r, &g->vars, "true", r->vtrue);
  jj_dict_set(r, &g->vars, "false", r->vfalse);
  jj_dict_set(r, &g->vars, "none", r->none);
  jj_dict_set(r, &g->vars, "True", r->vtrue);
  jj_dict_set(r, &g->vars, "False", r->vfalse);
  jj_dict_set(r, &g->vars, "None", r->none);
  if (context) {
    if (!cJSON_IsObject(context)) jj_fail(r, "render context must be a JSON object");
    for (const cJSON *c = context->child; c; c = c->next)
      if (c->string) jj_dict_set(r, &g->vars, c->string, jj_from_json(r, c, 0));
  }
  sm_buf *b = jj_buf(r);
  exec_block(r, &tpl->body, g, b);
  if (r->ctl) jj_fail(r, "break/continue outside of a loop");
  *out = sm_buf_take(b);
  jj_bufs_free(r);
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
