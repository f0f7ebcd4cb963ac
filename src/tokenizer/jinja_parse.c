/* Chat-template interpreter: parser of jj_lex's tokens into the syntax tree jinja_eval.c runs.
 * Structured after @huggingface/jinja's parser.ts, with the syntax of Python Jinja2 where they differ
 * (tuple literals, {% with %}, {% generation %}). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/jinja_int.h"
#include "base/base.h"
#include "base/strbuf.h"

/* ---------------- parser ---------------- */
typedef struct {
  jj_token *t;
  int n, cur, depth;
  jj_arena *arena;
  jmp_buf *jmp;
  char *err;
  size_t errn;
  sm_buf *scratch; /* adjacent string literals being joined */
} parser;

__attribute__((format(printf, 3, 4))) static void pfail(parser *P, int line, const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(P->err, P->errn, "line %d: syntax error: %s", line, msg);
  longjmp(*P->jmp, 1);
}

static const char *tokname(jj_toktype t) {
  static const char *names[] = {"Text",
                                "NumericLiteral",
                                "StringLiteral",
                                "Identifier",
                                "Equals",
                                "OpenParen",
                                "CloseParen",
                                "OpenStatement",
                                "CloseStatement",
                                "OpenExpression",
                                "CloseExpression",
                                "OpenSquareBracket",
                                "CloseSquareBracket",
                                "OpenCurlyBracket",
                                "CloseCurlyBracket",
                                "Comma",
                                "Dot",
                                "Colon",
                                "Pipe",
                                "AdditiveBinaryOperator",
                                "MultiplicativeBinaryOperator",
                                "ExponentiationBinaryOperator",
                                "ComparisonBinaryOperator",
                                "UnaryOperator",
                                "Comment",
                                "end of template"};
  return names[t];
}

static jj_token *tk(parser *P) { return &P->t[P->cur]; }
static int tline(parser *P) { return P->t[P->cur].line; }

static jj_node *mk(parser *P, jj_nodekind k, int line) {
  jj_node *n = jj_calloc(P->arena, sizeof *n);
  n->kind = k;
  n->line = line;
  return n;
}

typedef struct {
  jj_node **v;
  int n, cap;
} nvec;
static void nv_push(parser *P, nvec *v, jj_node *x) {
  if (v->n == v->cap) {
    v->cap = v->cap ? v->cap * 2 : 8;
    jj_node **nn = jj_alloc(P->arena, sizeof(jj_node *) * (size_t)v->cap);
    if (v->n) memcpy(nn, v->v, sizeof(jj_node *) * (size_t)v->n);
    v->v = nn;
  }
  v->v[v->n++] = x;
}
static jj_nodes nv_done(nvec *v) {
  jj_nodes r = {v->v, v->n};
  return r;
}

static jj_token *expect(parser *P, jj_toktype type, const char *msg) {
  jj_token *t = tk(P);
  if (t->type != type) pfail(P, t->line, "%s, got %s", msg, tokname(t->type));
  if (t->type != T_EOF) P->cur++;
  return t;
}

static bool tok_is_ident(jj_token *t, const char *name) {
  return t->type == T_IDENT && t->v.n == strlen(name) && !memcmp(t->v.s, name, t->v.n);
}
static bool is_ident(parser *P, const char *name) { return tok_is_ident(tk(P), name); }
static bool is_ident2(parser *P, const char *a, const char *b) {
  return P->cur + 1 < P->n && tok_is_ident(&P->t[P->cur], a) && tok_is_ident(&P->t[P->cur + 1], b);
}
static bool is_stmt(parser *P, const char *name) {
  return P->cur + 1 < P->n && P->t[P->cur].type == T_OPEN_STMT && tok_is_ident(&P->t[P->cur + 1], name);
}
static void expect_ident(parser *P, const char *name) {
  if (!is_ident(P, name)) pfail(P, tline(P), "Expected %s", name);
  P->cur++;
}

static jj_node *parse_any(parser *P);
static jj_node *parse_expression(parser *P);
static jj_node *parse_primary(parser *P);
static jj_nodes parse_args(parser *P, bool params);

static void enter(parser *P) {
  if (++P->depth > JJ_MAX_PARSE_DEPTH) pfail(P, tline(P), "template nested too deeply");
}
static void leave(parser *P) { P->depth--; }

static jj_node *parse_seq(parser *P, bool primary) {
  int line = tline(P);
  jj_node *first = primary ? parse_primary(P) : parse_expression(P);
  if (tk(P)->type != T_COMMA) return first;
  nvec v = {0};
  nv_push(P, &v, first);
  while (tk(P)->type == T_COMMA) {
    P->cur++;
    jj_toktype nt = tk(P)->type; /* a trailing comma: (1,) */
    if (nt == T_RPAREN || nt == T_CLOSE_STMT || nt == T_CLOSE_EXPR || nt == T_EQUALS || is_ident(P, "in")) break;
    nv_push(P, &v, primary ? parse_primary(P) : parse_expression(P));
    if (tk(P)->type != T_COMMA) break;
  }
  jj_node *t = mk(P, N_TUPLE, line);
  t->l1 = nv_done(&v);
  return t;
}

static void parse_until(parser *P, nvec *body, const char *a, const char *b, const char *c) {
  for (;;) {
    if (tk(P)->type == T_EOF) pfail(P, tline(P), "unexpected end of template, expected {%% %s %%}", a);
    if (is_stmt(P, a) || (b && is_stmt(P, b)) || (c && is_stmt(P, c))) return;
    nv_push(P, body, parse_any(P));
  }
}

static jj_node *parse_if(parser *P, int line) {
  jj_node *n = mk(P, N_IF, line);
  n->a = parse_expression(P);
  expect(P, T_CLOSE_STMT, "Expected closing statement token");
  nvec body = {0}, alt = {0};
  parse_until(P, &body, "endif", "elif", "else");
  if (is_stmt(P, "elif")) {
    int l2 = tline(P);
    P->cur += 2;
    enter(P);
    nv_push(P, &alt, parse_if(P, l2));
    leave(P);
  } else if (is_stmt(P, "else")) {
    P->cur += 2;
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    parse_until(P, &alt, "endif", NULL, NULL);
  }
  n->l1 = nv_done(&body);
  n->l2 = nv_done(&alt);
  return n;
}

static void parse_end(parser *P, const char *name) {
  expect(P, T_OPEN_STMT, "Expected {% token");
  expect_ident(P, name);
  expect(P, T_CLOSE_STMT, "Expected %} token");
}

static jj_node *parse_statement(parser *P) {
  int line = tline(P);
  expect(P, T_OPEN_STMT, "Expected opening statement token");
  jj_token *t = tk(P);
  if (t->type != T_IDENT) pfail(P, t->line, "Unknown statement, got %s", tokname(t->type));
  jj_node *r;
  if (is_ident(P, "set")) {
    P->cur++;
    r = mk(P, N_SET, line);
    r->a = parse_seq(P, false);
    if (tk(P)->type == T_EQUALS) {
      P->cur++;
      r->b = parse_seq(P, false);
    } else {
      expect(P, T_CLOSE_STMT, "Expected %} token");
      nvec body = {0};
      parse_until(P, &body, "endset", NULL, NULL);
      r->l1 = nv_done(&body);
      expect(P, T_OPEN_STMT, "Expected {% token");
      expect_ident(P, "endset");
    }
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
  } else if (is_ident(P, "if")) {
    P->cur++;
    r = parse_if(P, line);
    parse_end(P, "endif");
  } else if (is_ident(P, "macro")) {
    P->cur++;
    r = mk(P, N_MACRO, line);
    jj_node *name = parse_primary(P);
    if (name->kind != N_IDENT) pfail(P, line, "Expected identifier following macro statement");
    r->s = name->s;
    r->l2 = parse_args(P, true);
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    nvec body = {0};
    parse_until(P, &body, "endmacro", NULL, NULL);
    r->l1 = nv_done(&body);
    parse_end(P, "endmacro");
  } else if (is_ident(P, "for")) {
    P->cur++;
    r = mk(P, N_FOR, line);
    r->a = parse_seq(P, true);
    if (r->a->kind != N_IDENT && r->a->kind != N_TUPLE)
      pfail(P, line, "Expected identifier/tuple for the loop variable");
    if (!is_ident(P, "in")) pfail(P, tline(P), "Expected `in` keyword following loop variable");
    P->cur++;
    r->b = parse_expression(P);
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    nvec body = {0}, alt = {0};
    parse_until(P, &body, "endfor", "else", NULL);
    if (is_stmt(P, "else")) {
      P->cur += 2;
      expect(P, T_CLOSE_STMT, "Expected closing statement token");
      parse_until(P, &alt, "endfor", NULL, NULL);
    }
    r->l1 = nv_done(&body);
    r->l2 = nv_done(&alt);
    parse_end(P, "endfor");
  } else if (is_ident(P, "call")) {
    P->cur++;
    r = mk(P, N_CALLBLOCK, line);
    if (tk(P)->type == T_LPAREN) {
      r->l2 = parse_args(P, true);
      r->has_args = true;
    }
    jj_node *callee = parse_primary(P);
    if (callee->kind != N_IDENT) pfail(P, line, "Expected identifier following call statement");
    jj_node *call = mk(P, N_CALL, line);
    call->a = callee;
    call->l1 = parse_args(P, false);
    r->a = call;
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    nvec body = {0};
    parse_until(P, &body, "endcall", NULL, NULL);
    r->l1 = nv_done(&body);
    parse_end(P, "endcall");
  } else if (is_ident(P, "break") || is_ident(P, "continue")) {
    r = mk(P, is_ident(P, "break") ? N_BREAK : N_CONTINUE, line);
    P->cur++;
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
  } else if (is_ident(P, "filter")) {
    P->cur++;
    r = mk(P, N_FILTERBLOCK, line);
    jj_node *f = parse_primary(P);
    if (f->kind != N_IDENT) pfail(P, line, "Expected identifier for the filter");
    r->s = f->s;
    if (tk(P)->type == T_LPAREN) {
      r->l2 = parse_args(P, false);
      r->has_args = true;
    }
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    nvec body = {0};
    parse_until(P, &body, "endfilter", NULL, NULL);
    r->l1 = nv_done(&body);
    parse_end(P, "endfilter");
  } else if (is_ident(P, "with")) {
    P->cur++;
    r = mk(P, N_WITH, line);
    nvec as = {0};
    while (tk(P)->type != T_CLOSE_STMT) {
      if (as.n) expect(P, T_COMMA, "Expected comma between with assignments");
      jj_token *nt = tk(P);
      if (nt->type != T_IDENT) pfail(P, nt->line, "Expected a name to assign in with");
      P->cur++;
      expect(P, T_EQUALS, "Expected = in with");
      jj_node *kw = mk(P, N_KWARG, nt->line);
      kw->s = nt->v;
      kw->a = parse_expression(P);
      nv_push(P, &as, kw);
    }
    r->l2 = nv_done(&as);
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    nvec body = {0};
    parse_until(P, &body, "endwith", NULL, NULL);
    r->l1 = nv_done(&body);
    parse_end(P, "endwith");
  } else {
    pfail(P, t->line, "Unknown statement type: %.*s", (int)(t->v.n > 40 ? 40 : t->v.n), t->v.s);
    r = NULL;
  }
  return r;
}

static jj_node *parse_any(parser *P) {
  enter(P);
  jj_token *t = tk(P);
  jj_node *r;
  switch (t->type) {
    case T_COMMENT:
      r = mk(P, N_COMMENT, t->line);
      P->cur++;
      break;
    case T_TEXT:
      r = mk(P, N_STR, t->line);
      r->s = t->v;
      P->cur++;
      break;
    case T_OPEN_STMT: r = parse_statement(P); break;
    case T_OPEN_EXPR:
      P->cur++;
      r = parse_expression(P);
      expect(P, T_CLOSE_EXPR, "Expected closing expression token");
      break;
    default: pfail(P, t->line, "Unexpected token type: %s", tokname(t->type)); r = NULL;
  }
  leave(P);
  return r;
}

static jj_node *parse_or(parser *P);

static jj_node *parse_expression(parser *P) {
  enter(P);
  int line = tline(P);
  jj_node *a = parse_or(P);
  if (is_ident(P, "if")) {
    P->cur++;
    jj_node *test = parse_or(P);
    if (is_ident(P, "else")) {
      P->cur++;
      jj_node *f = parse_expression(P);
      jj_node *n = mk(P, N_TERNARY, line);
      n->a = test;
      n->b = a;
      n->c = f;
      a = n;
    } else {
      jj_node *n = mk(P, N_SELECT, line);
      n->a = a;
      n->b = test;
      a = n;
    }
  }
  leave(P);
  return a;
}

static jj_node *binop(parser *P, int op, jj_node *l, jj_node *r, int line) {
  jj_node *n = mk(P, N_BINOP, line);
  n->op = op;
  n->a = l;
  n->b = r;
  return n;
}

static jj_node *parse_not(parser *P);
static jj_node *parse_and(parser *P) {
  jj_node *l = parse_not(P);
  while (is_ident(P, "and")) {
    int line = tline(P);
    P->cur++;
    l = binop(P, OP_AND, l, parse_not(P), line);
  }
  return l;
}
static jj_node *parse_or(parser *P) {
  jj_node *l = parse_and(P);
  while (is_ident(P, "or")) {
    int line = tline(P);
    P->cur++;
    l = binop(P, OP_OR, l, parse_and(P), line);
  }
  return l;
}

static jj_node *parse_cmp(parser *P);
static jj_node *parse_not(parser *P) {
  if (is_ident(P, "not")) {
    int line = tline(P);
    P->cur++;
    enter(P);
    jj_node *arg = parse_not(P);
    leave(P);
    jj_node *n = mk(P, N_UNARY, line);
    n->op = OP_NOT;
    n->a = arg;
    return n;
  }
  return parse_cmp(P);
}

static jj_node *parse_add(parser *P);
static jj_node *parse_cmp(parser *P) {
  jj_node *l = parse_add(P);
  for (;;) {
    int line = tline(P), op;
    if (is_ident2(P, "not", "in")) {
      op = OP_NOTIN;
      P->cur += 2;
    } else if (is_ident(P, "in")) {
      op = OP_IN;
      P->cur++;
    } else if (tk(P)->type == T_CMP) {
      jstr v = tk(P)->v;
      op = v.s[0] == '=' ? OP_EQ
         : v.s[0] == '!' ? OP_NE
         : v.s[0] == '<' ? (v.n == 2 ? OP_LE : OP_LT)
                         : (v.n == 2 ? OP_GE : OP_GT);
      P->cur++;
    } else break;
    l = binop(P, op, l, parse_add(P), line);
  }
  return l;
}

static jj_node *parse_mul(parser *P);
static jj_node *parse_add(parser *P) {
  jj_node *l = parse_mul(P);
  while (tk(P)->type == T_ADD) {
    int line = tline(P);
    char c = tk(P)->v.s[0];
    P->cur++;
    l = binop(P, c == '+' ? OP_ADD : c == '-' ? OP_SUB : OP_TILDE, l, parse_mul(P), line);
  }
  return l;
}

static jj_node *parse_pow(parser *P);
static jj_node *parse_mul(parser *P) {
  jj_node *l = parse_pow(P);
  while (tk(P)->type == T_MUL) {
    int line = tline(P);
    jstr v = tk(P)->v;
    int op = v.s[0] == '*' ? OP_MUL : v.s[0] == '%' ? OP_MOD : v.n == 2 ? OP_FLOORDIV : OP_DIV;
    P->cur++;
    l = binop(P, op, l, parse_pow(P), line);
  }
  return l;
}

static jj_node *parse_test(parser *P);
static jj_node *parse_pow(parser *P) {
  jj_node *l = parse_test(P);
  while (tk(P)->type == T_POW) {
    int line = tline(P);
    P->cur++;
    l = binop(P, OP_POW, l, parse_test(P), line);
  }
  return l;
}

static jj_node *parse_filter(parser *P);
/* can a bare test argument start here (Python Jinja: `x is divisibleby 3`)? */
static bool test_arg_start(parser *P) {
  jj_token *t = tk(P);
  if (t->type == T_NUM || t->type == T_STR || t->type == T_LBRACKET || t->type == T_LBRACE) return true;
  if (t->type == T_IDENT)
    return !(is_ident(P, "else") || is_ident(P, "or") || is_ident(P, "and") || is_ident(P, "if") || is_ident(P, "is") ||
             is_ident(P, "in") || is_ident(P, "not"));
  return false;
}
static jj_node *parse_test(parser *P) {
  jj_node *operand = parse_filter(P);
  while (is_ident(P, "is")) {
    int line = tline(P);
    P->cur++;
    bool neg = is_ident(P, "not");
    if (neg) P->cur++;
    jj_token *t = tk(P);
    if (t->type != T_IDENT) pfail(P, t->line, "Expected identifier for the test");
    P->cur++;
    jj_node *n = mk(P, N_TEST, line);
    n->a = operand;
    n->op = neg;
    n->s = t->v;
    if (tk(P)->type == T_LPAREN) {
      n->l1 = parse_args(P, false);
      n->has_args = true;
    } else if (test_arg_start(P)) {
      /* single bare argument */
      nvec v = {0};
      nv_push(P, &v, parse_primary(P));
      n->l1 = nv_done(&v);
      n->has_args = true;
    }
    operand = n;
  }
  return operand;
}

static jj_node *parse_unary_sign(parser *P);
static jj_node *parse_filter(parser *P) {
  jj_node *operand = parse_unary_sign(P);
  while (tk(P)->type == T_PIPE) {
    int line = tline(P);
    P->cur++;
    jj_token *t = tk(P);
    if (t->type != T_IDENT) pfail(P, t->line, "Expected identifier for the filter");
    P->cur++;
    jj_node *n = mk(P, N_FILTER, line);
    n->a = operand;
    n->s = t->v;
    if (tk(P)->type == T_LPAREN) {
      n->l1 = parse_args(P, false);
      n->has_args = true;
    }
    operand = n;
  }
  return operand;
}

static jj_node *parse_member(parser *P, jj_node *obj);
static jj_node *parse_call(parser *P, jj_node *callee) {
  for (;;) {
    jj_node *n = mk(P, N_CALL, callee->line);
    n->a = callee;
    n->l1 = parse_args(P, false);
    callee = parse_member(P, n);
    if (tk(P)->type != T_LPAREN) return callee;
  }
}

static jj_node *parse_unary_sign(parser *P) {
  jj_token *t = tk(P);
  if ((t->type == T_UNARY || t->type == T_ADD) && t->v.n == 1 && (t->v.s[0] == '-' || t->v.s[0] == '+')) {
    P->cur++;
    enter(P);
    jj_node *arg = parse_unary_sign(P);
    leave(P);
    jj_node *n = mk(P, N_UNARY, t->line);
    n->op = t->v.s[0] == '-' ? OP_NEG : OP_POS;
    n->a = arg;
    return n;
  }
  jj_node *m = parse_member(P, parse_primary(P));
  if (tk(P)->type == T_LPAREN) return parse_call(P, m);
  return m;
}

static jj_nodes parse_args(parser *P, bool params) {
  expect(P, T_LPAREN, "Expected opening parenthesis for arguments list");
  nvec v = {0};
  bool saw_kw = false, saw_spread = false;
  while (tk(P)->type != T_RPAREN) {
    int line = tline(P);
    if (tk(P)->type == T_EOF) pfail(P, line, "Expected closing parenthesis for arguments list");
    bool kwspread = tk(P)->type == T_POW;
    bool spread = tk(P)->type == T_MUL && tk(P)->v.n == 1 && tk(P)->v.s[0] == '*';
    if (params && (kwspread || spread)) pfail(P, line, "Argument unpacking is not allowed in parameter declarations");
    if (kwspread) {
      P->cur++;
      jj_node *n = mk(P, N_KWSPREAD, line);
      n->a = parse_expression(P);
      nv_push(P, &v, n);
      if (tk(P)->type == T_COMMA) P->cur++;
      if (tk(P)->type != T_RPAREN) pfail(P, line, "`**` must be applied to the final argument");
      break;
    }
    jj_node *arg;
    if (spread) {
      if (saw_spread) pfail(P, line, "Only one `*` argument unpacking is allowed");
      saw_spread = true;
      P->cur++;
      arg = mk(P, N_SPREAD, line);
      arg->a = parse_expression(P);
    } else {
      arg = parse_expression(P);
      if (tk(P)->type == T_EQUALS) {
        P->cur++;
        if (arg->kind != N_IDENT)
          pfail(P, line,
                params ? "Expected identifier for parameter declaration" : "Expected identifier for keyword argument");
        jj_node *kw = mk(P, N_KWARG, line);
        kw->s = arg->s;
        kw->a = parse_expression(P);
        arg = kw;
      }
      if (params) {
        if (arg->kind != N_IDENT && arg->kind != N_KWARG)
          pfail(P, line, "Expected identifier for parameter declaration");
        for (int k = 0; k < v.n; k++)
          if (v.v[k]->s.n == arg->s.n && !memcmp(v.v[k]->s.s, arg->s.s, arg->s.n))
            pfail(P, line, "Duplicate parameter name: %.*s", (int)arg->s.n, arg->s.s);
      }
      if (arg->kind == N_KWARG) saw_kw = true;
      else if (saw_kw)
        pfail(P, line,
              params ? "Non-default argument follows default argument"
                     : "Positional arguments must come before keyword arguments");
      else if (saw_spread) pfail(P, line, "Positional arguments must not follow `*` argument unpacking");
    }
    nv_push(P, &v, arg);
    if (tk(P)->type == T_COMMA) P->cur++;
  }
  expect(P, T_RPAREN, "Expected closing parenthesis for arguments list");
  return nv_done(&v);
}

static jj_node *parse_subscript(parser *P, int line) {
  jj_node *sl[4] = {0};
  int n = 0;
  bool is_slice = false;
  while (tk(P)->type != T_RBRACKET) {
    if (tk(P)->type == T_EOF) pfail(P, line, "Expected closing square bracket");
    if (n >= 3 && is_slice) pfail(P, line, "Expected 0-3 arguments for slice expression");
    if (n >= 4) pfail(P, line, "Expected closing square bracket");
    if (tk(P)->type == T_COLON) {
      sl[n++] = NULL;
      P->cur++;
      is_slice = true;
    } else {
      sl[n++] = parse_expression(P);
      if (tk(P)->type == T_COLON) {
        P->cur++;
        is_slice = true;
      }
    }
  }
  if (n == 0) pfail(P, line, "Expected at least one argument for member/slice expression");
  if (is_slice) {
    jj_node *s = mk(P, N_SLICE, line);
    s->a = sl[0];
    s->b = sl[1];
    s->c = sl[2];
    return s;
  }
  if (n > 1) pfail(P, line, "Expected closing square bracket");
  return sl[0];
}

static jj_node *parse_member(parser *P, jj_node *obj) {
  while (tk(P)->type == T_DOT || tk(P)->type == T_LBRACKET) {
    int line = tline(P);
    bool computed = tk(P)->type == T_LBRACKET;
    P->cur++;
    jj_node *prop;
    if (computed) {
      prop = parse_subscript(P, line);
      expect(P, T_RBRACKET, "Expected closing square bracket");
    } else {
      prop = parse_primary(P);
      if (prop->kind != N_IDENT && prop->kind != N_INT)
        pfail(P, line, "Expected identifier or integer following dot operator");
    }
    jj_node *m = mk(P, N_MEMBER, line);
    m->a = obj;
    m->b = prop;
    m->op = computed;
    obj = m;
  }
  return obj;
}

static jj_node *parse_primary(parser *P) {
  enter(P);
  jj_token *t = tk(P);
  jj_node *r;
  if (t->type != T_EOF) P->cur++;
  switch (t->type) {
    case T_NUM: {
      char buf[64];
      size_t n = 0;
      for (size_t k = 0; k < t->v.n && n < 63; k++)
        if (t->v.s[k] != '_') buf[n++] = t->v.s[k];
      buf[n] = 0;
      const char *digits = buf;
      bool neg = *digits == '-';
      if (*digits == '-' || *digits == '+') digits++;
      char pfx = digits[0] == '0' ? (char)(digits[1] | 0x20) : 0;
      if (pfx == 'x' || pfx == 'o' || pfx == 'b') {
        errno = 0;
        unsigned long long u = strtoull(digits + 2, NULL, pfx == 'x' ? 16 : pfx == 'o' ? 8 : 2);
        if (errno || u > (unsigned long long)INT64_MAX) pfail(P, t->line, "integer literal too large: %s", buf);
        r = mk(P, N_INT, t->line);
        r->i = neg ? -(int64_t)u : (int64_t)u;
        break;
      }
      double d = strtod(buf, NULL);
      if (strpbrk(buf, ".eE") || d > 9.2e18 || d < -9.2e18) {
        r = mk(P, N_FLOAT, t->line);
        r->f = d;
      } else {
        r = mk(P, N_INT, t->line);
        r->i = strtoll(buf, NULL, 10);
      }
      break;
    }
    case T_STR: {
      r = mk(P, N_STR, t->line);
      r->s = t->v;
      if (tk(P)->type == T_STR) {
        sm_buf *b = P->scratch;
        sm_buf_clear(b);
        sm_buf_put(b, t->v.s, t->v.n);
        while (tk(P)->type == T_STR) {
          sm_buf_put(b, tk(P)->v.s, tk(P)->v.n);
          P->cur++;
        }
        char *cat = jj_alloc(P->arena, b->n + 1);
        memcpy(cat, b->p, b->n + 1);
        r->s.s = cat;
        r->s.n = b->n;
      }
      break;
    }
    case T_IDENT:
      r = mk(P, N_IDENT, t->line);
      r->s = t->v;
      break;
    case T_LPAREN:
      if (tk(P)->type == T_RPAREN) { /* () : the empty tuple */
        P->cur++;
        r = mk(P, N_TUPLE, t->line);
        break;
      }
      r = parse_seq(P, false);
      expect(P, T_RPAREN, "Expected closing parenthesis");
      break;
    case T_LBRACKET: {
      nvec v = {0};
      while (tk(P)->type != T_RBRACKET) {
        if (tk(P)->type == T_EOF) pfail(P, t->line, "Expected closing square bracket");
        nv_push(P, &v, parse_expression(P));
        if (tk(P)->type == T_COMMA) P->cur++;
      }
      P->cur++;
      r = mk(P, N_LIST, t->line);
      r->l1 = nv_done(&v);
      break;
    }
    case T_LBRACE: {
      nvec k = {0}, v = {0};
      while (tk(P)->type != T_RBRACE) {
        if (tk(P)->type == T_EOF) pfail(P, t->line, "Expected closing curly bracket");
        nv_push(P, &k, parse_expression(P));
        expect(P, T_COLON, "Expected colon between key and value in object literal");
        nv_push(P, &v, parse_expression(P));
        if (tk(P)->type == T_COMMA) P->cur++;
      }
      P->cur++;
      r = mk(P, N_DICT, t->line);
      r->l1 = nv_done(&k);
      r->l2 = nv_done(&v);
      break;
    }
    default: pfail(P, t->line, "Unexpected token: %s", tokname(t->type)); r = NULL;
  }
  leave(P);
  return r;
}

int jj_parse(const char *src, struct sm_jinja *tpl, char *err, size_t errn) {
  jj_token *toks = NULL;
  int ntok = 0;
  if (jj_lex(src, &tpl->arena, &toks, &ntok, err, errn)) return -1;
  jmp_buf jb;
  sm_buf *scratch = sm_xcalloc(1, sizeof *scratch); /* heap: still valid after a longjmp */
  if (setjmp(jb)) {
    sm_buf_free(scratch);
    free(scratch);
    return -1;
  }
  parser P = {0};
  P.t = toks;
  P.n = ntok;
  P.arena = &tpl->arena;
  P.jmp = &jb;
  P.err = err;
  P.errn = errn;
  P.scratch = scratch;
  nvec body = {0};
  while (P.t[P.cur].type != T_EOF) nv_push(&P, &body, parse_any(&P));
  tpl->body = nv_done(&body);
  sm_buf_free(scratch);
  free(scratch);
  return 0;
}
