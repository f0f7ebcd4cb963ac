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
    } else if (x->kind != N_KWARG && x->kind != N_KWSPREAD)
      jj_list_push(r, a, eval(r, x, env));
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
/* positional i, else keyword name, else NULL */

static jv *get_member(jj_rt *r, jv *obj, jv *prop) {
  jv *v = NULL;
  if (obj->t == V_DICT || obj->t == V_NS) {
    if (prop->t != V_STR) jj_fail(r, "Cannot access property with non-string: got %s", jj_tname(prop));
    v = jj_dict_get(obj->u.d, prop->u.s.s, prop->u.s.n);
    if (!v && obj->t == V_DICT) v = jj_builtin_member(r, obj, prop->u.s);
  } else if (obj->t == V_LIST || obj->t == V_STR) {
    if (prop->t == V_INT) {
      int64_t i = prop->u.i;
      if (obj->t == V_LIST) {
        int64_t n = (int64_t)obj->u.l->n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) v = obj->u.l->v[i];
      } else {
        int64_t n = (int64_t)jj_cp_count(obj->u.s.s, obj->u.s.n);
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          size_t p = 0;
          for (int64_t k = 0; k < i; k++) p += jj_utf8_next(obj->u.s.s, obj->u.s.n, p, NULL);
          size_t l = jj_utf8_next(obj->u.s.s, obj->u.s.n, p, NULL);
          jstr s = {obj->u.s.s + p, l};
          v = jj_jstr(r, s);
        }
      }
    } else if (prop->t == V_STR)
      v = jj_builtin_member(r, obj, prop->u.s);
    else
      jj_fail(r, "Cannot access property with non-string/non-number: got %s", jj_tname(prop));
  } else {
    if (prop->t != V_STR) jj_fail(r, "Cannot access property with non-string: got %s", jj_tname(prop));
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

static jv *do_slice(jj_rt *r, jv *obj, const jj_node *sl, jj_env *env) {
  if (obj->t != V_LIST && obj->t != V_STR) jj_fail(r, "Slice object must be an array or string");
  jv *a = sl->a ? eval(r, sl->a, env) : r->undef;
  jv *b = sl->b ? eval(r, sl->b, env) : r->undef;
  jv *c = sl->c ? eval(r, sl->c, env) : r->undef;
  if ((a->t != V_INT && a->t != V_UNDEF) || (b->t != V_INT && b->t != V_UNDEF) || (c->t != V_INT && c->t != V_UNDEF))
    jj_fail(r, "Slice indices must be integers or undefined");
  int64_t step = c->t == V_INT ? c->u.i : 1;
  int dir = step > 0 ? 1 : step < 0 ? -1 : 0;
  if (obj->t == V_LIST) {
    int64_t st, en, len = (int64_t)obj->u.l->n;
    slice_idx(len, a->t == V_INT, a->u.i, b->t == V_INT, b->u.i, step, &st, &en);
    jv *o = jj_list_new(r);
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

static jv *binop(jj_rt *r, const jj_node *n, jj_env *env) {
  jv *l = eval(r, n->a, env);
  if (n->op == OP_AND) return jj_truthy(l) ? eval(r, n->b, env) : l;
  if (n->op == OP_OR) return jj_truthy(l) ? l : eval(r, n->b, env);
  jv *rt = eval(r, n->b, env);
  r->line = n->line;
  int op = n->op;
  if (op == OP_EQ) return jj_bool(r, jj_loose_eq(r, l, rt));
  if (op == OP_NE) return jj_bool(r, !jj_loose_eq(r, l, rt));
  if (l->t == V_UNDEF || rt->t == V_UNDEF) {
    if (rt->t == V_UNDEF && (op == OP_IN || op == OP_NOTIN)) return jj_bool(r, op == OP_NOTIN);
    jj_fail(r, "Cannot perform operation on undefined values");
  }
  if (op == OP_TILDE) {
    sm_buf *b = jj_buf(r);
    jj_raw_str(r, b, l);
    jj_raw_str(r, b, rt);
    return jj_buf_value(r, b);
  }
  if (l->t == V_NONE || rt->t == V_NONE) jj_fail(r, "Cannot perform operation on null values");
  bool ln = jj_is_num(l) || l->t == V_BOOL, rn = jj_is_num(rt) || rt->t == V_BOOL;
  if (op == OP_POW && ln && rn) {
    double a = jj_num_of(l), b = jj_num_of(rt);
    if (a == 0 && b < 0) jj_fail(r, "0.0 cannot be raised to a negative power");
    bool isf = l->t == V_FLOAT || rt->t == V_FLOAT || b < 0;
    if (!isf) {
      int64_t base = l->t == V_BOOL ? l->u.b : l->u.i, e = rt->t == V_BOOL ? rt->u.b : rt->u.i, res = 1;
      for (int64_t k = 0; k < e; k++) {
        if (__builtin_mul_overflow(res, base, &res)) jj_fail(r, "integer overflow");
        if (res == 0 || res == 1) break;
        if (res == -1) { res = (e - k - 1) % 2 ? -res : res; break; }
      }
      return jj_int(r, res);
    }
    double res = pow(a, b);
    if (!isfinite(res)) jj_fail(r, "Exponentiation result is not a finite real number");
    return jj_float(r, res);
  }
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
        if (b == 0) jj_fail(r, "division by zero");
        return jj_float(r, a / b);
      case OP_FLOORDIV:
        if (!isf) return jj_arith_int(r, op, l->u.i, rt->u.i);
        if (b == 0) jj_fail(r, "division by zero");
        return jj_float(r, floor(a / b));
      case OP_MOD:
        if (!isf) return jj_arith_int(r, op, l->u.i, rt->u.i);
        if (b == 0) jj_fail(r, "modulo by zero");
        return jj_float(r, fmod(a, b));
      case OP_LT: return jj_bool(r, a < b);
      case OP_GT: return jj_bool(r, a > b);
      case OP_LE: return jj_bool(r, a <= b);
      case OP_GE: return jj_bool(r, a >= b);
    }
  }
  if (l->t == V_LIST && rt->t == V_LIST && op == OP_ADD) {
    jv *o = jj_list_new(r);
    for (size_t i = 0; i < l->u.l->n; i++) jj_list_push(r, o, l->u.l->v[i]);
    for (size_t i = 0; i < rt->u.l->n; i++) jj_list_push(r, o, rt->u.l->v[i]);
    return o;
  }
  if (rt->t == V_LIST && (op == OP_IN || op == OP_NOTIN)) {
    bool m = false;
    for (size_t i = 0; i < rt->u.l->n && !m; i++) m = jj_strict_eq(rt->u.l->v[i], l);
    return jj_bool(r, op == OP_IN ? m : !m);
  }
  if ((l->t == V_STR) != (rt->t == V_STR) && op == OP_ADD) /* Python: no implicit str() */
    jj_fail(r, "unsupported operand type(s) for +: %s and %s", jj_tname(l), jj_tname(rt));
  if ((l->t == V_STR || rt->t == V_STR) && op == OP_ADD) {
    sm_buf *b = jj_buf(r);
    jj_raw_str(r, b, l);
    jj_raw_str(r, b, rt);
    return jj_buf_value(r, b);
  }
  if (l->t == V_STR && rt->t == V_STR) {
    if (op == OP_IN || op == OP_NOTIN) {
      bool m = jj_memmem(rt->u.s.s, rt->u.s.n, l->u.s.s, l->u.s.n) != NULL;
      return jj_bool(r, op == OP_IN ? m : !m);
    }
    /* extension (Python): string ordering */
    int c = jj_cmp_str(r, l, rt, true);
    switch (op) {
      case OP_LT: return jj_bool(r, c < 0);
      case OP_GT: return jj_bool(r, c > 0);
      case OP_LE: return jj_bool(r, c <= 0);
      case OP_GE: return jj_bool(r, c >= 0);
    }
  }
  if (l->t == V_STR && rt->t == V_DICT && (op == OP_IN || op == OP_NOTIN)) {
    bool m = jj_dict_get(rt->u.d, l->u.s.s, l->u.s.n) != NULL;
    return jj_bool(r, op == OP_IN ? m : !m);
  }
  /* extension (Python): sequence repetition */
  if (op == OP_MUL && ((l->t == V_STR && rt->t == V_INT) || (l->t == V_INT && rt->t == V_STR))) {
    jv *s = l->t == V_STR ? l : rt;
    int64_t k = l->t == V_INT ? l->u.i : rt->u.i;
    if (k > 0 && (double)k * (double)s->u.s.n > 64e6) jj_fail(r, "string repetition too large");
    sm_buf *b = jj_buf(r);
    for (int64_t i = 0; i < k; i++) sm_buf_put(b, s->u.s.s, s->u.s.n);
    return jj_buf_value(r, b);
  }
  static const char *opn[] = {"+", "-", "~", "*", "/", "//", "%", "**", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"};
  jj_fail(r, "Unknown operator \"%s\" between %s and %s", opn[op], jj_tname(l), jj_tname(rt));
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
  } else if (na > np)
    jj_fail(r, "macro %s takes not more than %zu argument(s)", disp, np);
  for (size_t i = 0; i < np; i++)
    if (pending[i]) jj_env_set(r, scope, params->v[i]->s, eval(r, params->v[i]->a, scope));
}

/* ---------------- calls ---------------- */
jv *jj_call(jj_rt *r, jv *fnv, jv *args, jv *kwargs, jj_env *env) {
  jj_func *fn = fnv->u.fn;
  if (fn->kind != F_MACRO && fn->kind != F_CALLER) return jj_call_builtin(r, fnv, args, kwargs);
  if (++r->depth > JJ_MAX_EVAL_DEPTH) jj_fail(r, "maximum recursion depth exceeded");
  const jj_node *def = fn->node;
  jj_env *scope = jj_env_new(r, fn->kind == F_MACRO ? env : fn->env);
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
      if (!res) res = r->undef;
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
      jv *prop;
      if (n->op) prop = eval(r, n->b, env);
      else if (n->b->kind == N_INT) prop = jj_int(r, n->b->i);
      else prop = jj_jstr(r, n->b->s);
      r->line = n->line;
      res = get_member(r, obj, prop);
      break;
    }
    case N_CALL: {
      jv *args, *kwargs;
      eval_args(r, &n->l1, env, &args, &kwargs);
      jv *fn = eval(r, n->a, env);
      r->line = n->line;
      if (fn->t != V_FUNC) jj_fail(r, "Cannot call something that is not a function: got %s", jj_tname(fn));
      res = jj_call(r, fn, args, kwargs, env);
      break;
    }
    case N_BINOP: res = binop(r, n, env); break;
    case N_UNARY: {
      jv *a = eval(r, n->a, env);
      r->line = n->line;
      if (n->op == OP_NOT) res = jj_bool(r, !jj_truthy(a));
      else if (a->t == V_INT || a->t == V_BOOL) {
        int64_t x = a->t == V_BOOL ? a->u.b : a->u.i;
        if (n->op == OP_NEG && x == INT64_MIN) jj_fail(r, "integer overflow");
        res = jj_int(r, n->op == OP_NEG ? -x : x);
      } else if (a->t == V_FLOAT)
        res = jj_float(r, n->op == OP_NEG ? -a->u.f : a->u.f);
      else
        jj_fail(r, "Unknown operator \"%s\" for %s", n->op == OP_NEG ? "-" : "+", jj_tname(a));
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
    case N_SELECT: res = jj_truthy(eval(r, n->b, env)) ? eval(r, n->a, env) : r->undef; break;
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
  if (val->t != V_LIST) jj_fail(r, "Cannot unpack non-iterable type: %s", jj_tname(val));
  if ((size_t)target->l1.n != val->u.l->n)
    jj_fail(r, "Too %s items to unpack", (size_t)target->l1.n > val->u.l->n ? "few" : "many");
  for (int j = 0; j < target->l1.n; j++) {
    if (target->l1.v[j]->kind != N_IDENT) jj_fail(r, "Cannot unpack to non-identifier");
    jj_env_set(r, env, target->l1.v[j]->s, val->u.l->v[j]);
  }
}

static void exec_for(jj_rt *r, const jj_node *n, jj_env *env, sm_buf *out) {
  jj_env *scope = jj_env_new(r, env);
  const jj_node *test = NULL;
  jv *it;
  if (n->b->kind == N_SELECT) {
    it = eval(r, n->b->a, scope);
    test = n->b->b;
  } else
    it = eval(r, n->b, scope);
  r->line = n->line;
  if (it->t == V_DICT) it = jj_dict_keys(r, it);
  else if (it->t == V_STR) it = jj_chars_of(r, it);
  else if (it->t != V_LIST) jj_fail(r, "Expected iterable or object type in for loop: got %s", jj_tname(it));
  jv *items = jj_list_new(r);
  for (size_t i = 0; i < it->u.l->n; i++) {
    jv *cur = it->u.l->v[i];
    if (test) {
      check_iter(r);
      jj_env *ls = jj_env_new(r, scope);
      bind_target(r, n->a, cur, ls);
      if (!jj_truthy(eval(r, test, ls))) continue;
    }
    jj_list_push(r, items, cur);
  }
  size_t cnt = items->u.l->n;
  bool iterated = false;
  jstr loopn = {"loop", 4};
  for (size_t i = 0; i < cnt; i++) {
    check_iter(r);
    jv *loop = jj_dict_new(r, V_DICT);
    jj_dict *d = loop->u.d;
    jj_dict_set(r, d, "index", jj_int(r, (int64_t)i + 1));
    jj_dict_set(r, d, "index0", jj_int(r, (int64_t)i));
    jj_dict_set(r, d, "revindex", jj_int(r, (int64_t)(cnt - i)));
    jj_dict_set(r, d, "revindex0", jj_int(r, (int64_t)(cnt - i - 1)));
    jj_dict_set(r, d, "first", jj_bool(r, i == 0));
    jj_dict_set(r, d, "last", jj_bool(r, i == cnt - 1));
    jj_dict_set(r, d, "length", jj_int(r, (int64_t)cnt));
    jj_dict_set(r, d, "previtem", i > 0 ? items->u.l->v[i - 1] : r->undef);
    jj_dict_set(r, d, "nextitem", i + 1 < cnt ? items->u.l->v[i + 1] : r->undef);
    jj_env_set(r, scope, loopn, loop);
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
        exec_block(r, &n->l1, env, b);
        rhs = jj_buf_value(r, b);
      }
      r->line = n->line;
      const jj_node *a = n->a;
      if (a->kind == N_IDENT || a->kind == N_TUPLE) {
        if (a->kind == N_TUPLE && rhs->t != V_LIST) jj_fail(r, "Cannot unpack non-iterable type in set: %s", jj_tname(rhs));
        bind_target(r, a, rhs, env);
      } else if (a->kind == N_MEMBER) {
        jv *obj = eval(r, a->a, env);
        r->line = n->line;
        if (obj->t != V_NS) jj_fail(r, "cannot assign attribute on non-namespace object");
        if (a->op || a->b->kind != N_IDENT) jj_fail(r, "Cannot assign to member with non-identifier property");
        jj_dict_setj(r, obj->u.d, a->b->s, rhs);
      } else
        jj_fail(r, "Invalid LHS inside assignment expression");
      return;
    }
    case N_MACRO: {
      jv *f = jj_func_new(r, F_MACRO, NULL);
      f->u.fn->node = n;
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
      if (fn->t != V_FUNC) jj_fail(r, "Cannot call something that is not a function: got %s", jj_tname(fn));
      jj_env *ne = jj_env_new(r, env);
      jstr cn = {"caller", 6};
      jj_env_set(r, ne, cn, caller);
      jv *res = jj_call(r, fn, args, kwargs, ne);
      if (res->t != V_UNDEF) jj_to_str(r, out, res);
      return;
    }
    case N_FILTERBLOCK: {
      sm_buf *b = jj_buf(r);
      exec_block(r, &n->l1, env, b);
      jv *args = NULL, *kwargs = NULL;
      if (n->has_args) eval_args(r, &n->l2, env, &args, &kwargs);
      r->line = n->line;
      jv *res = jj_filter(r, jj_buf_value(r, b), n->s, args, kwargs, env);
      if (res->t != V_UNDEF) jj_to_str(r, out, res);
      return;
    }
    case N_BREAK: r->ctl = CTL_BREAK; return;
    case N_CONTINUE: r->ctl = CTL_CONTINUE; return;
    case N_COMMENT: return;
    default: {
      jv *v = eval(r, n, env);
      if (v->t != V_UNDEF) jj_to_str(r, out, v); /* Python prints None */
    }
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
