/* Chat-template interpreter: arena, preprocessing, lexer and parser.
 * Structured after @huggingface/jinja's lexer.ts / parser.ts (with line tracking), with the syntax of
 * Python Jinja2 where they differ (number and tuple literals, {% with %}, {% generation %}). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/jinja_int.h"
#include "base/base.h"
#include "base/strbuf.h"

/* ---------------- arena ---------------- */
struct jj_chunk {
  jj_chunk *next;
  size_t used, cap;
  _Alignas(16) char data[];
};

void *jj_alloc(jj_arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!a->head || a->head->cap - a->head->used < n) {
    size_t cap = n > 65536 ? n : 65536;
    if (a->limit && a->total + cap > a->limit) {
      if (a->oom_jmp) {
        if (a->errbuf) snprintf(a->errbuf, 256, "template memory limit exceeded");
        longjmp(*a->oom_jmp, 1);
      }
    }
    jj_chunk *c = malloc(sizeof(jj_chunk) + cap);
    if (!c) {
      if (a->oom_jmp) {
        if (a->errbuf) snprintf(a->errbuf, 256, "out of memory");
        longjmp(*a->oom_jmp, 1);
      }
      c = sm_xmalloc(sizeof(jj_chunk) + cap);
    }
    c->cap = cap;
    c->used = 0;
    c->next = a->head;
    a->head = c;
    a->total += cap;
  }
  void *p = a->head->data + a->head->used;
  a->head->used += n;
  return p;
}

void *jj_calloc(jj_arena *a, size_t n) {
  void *p = jj_alloc(a, n);
  memset(p, 0, n);
  return p;
}

void jj_arena_free(jj_arena *a) {
  jj_chunk *c = a->head;
  while (c) {
    jj_chunk *nx = c->next;
    free(c);
    c = nx;
  }
  a->head = NULL;
  a->total = 0;
}

/* ---------------- text helpers ---------------- */
size_t jj_utf8_next(const char *s, size_t n, size_t i, int32_t *cp) {
  const unsigned char *u = (const unsigned char *)s;
  unsigned c = u[i];
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + (size_t)len > n) len = 1;
  int32_t v;
  if (len == 1) v = c;
  else if (len == 2) v = ((c & 0x1f) << 6) | (u[i + 1] & 0x3f);
  else if (len == 3) v = ((c & 0x0f) << 12) | ((u[i + 1] & 0x3f) << 6) | (u[i + 2] & 0x3f);
  else v = ((c & 0x07) << 18) | ((u[i + 1] & 0x3f) << 12) | ((u[i + 2] & 0x3f) << 6) | (u[i + 3] & 0x3f);
  if (cp) *cp = v;
  return (size_t)len;
}

/* Python's str.isspace() (what Jinja2's lexer, str.strip() and str.split() take as whitespace) */
bool jj_py_space_cp(int32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool jj_is_space_at(const char *s, size_t n, size_t i, size_t *len) {
  if (i >= n) return false;
  unsigned char c = (unsigned char)s[i];
  if (c < 0x80) {
    if (len) *len = 1;
    return jj_py_space_cp(c);
  }
  int32_t cp;
  size_t l = jj_utf8_next(s, n, i, &cp);
  if (len) *len = l;
  return jj_py_space_cp(cp);
}

/* ---------------- preprocessing (with a line number per byte) ---------------- */
typedef struct {
  sm_buf s; /* the text */
  int *ln;  /* line of each byte (+ 4 padding entries after pb_finish) */
  size_t lcap;
} pbuf;

static void pb_put(pbuf *b, char c, int ln) {
  if (b->s.n + 5 > b->lcap) {
    b->lcap = b->lcap ? b->lcap * 2 : 256;
    b->ln = sm_xrealloc(b->ln, b->lcap * sizeof(int));
  }
  sm_buf_putc(&b->s, c);
  b->ln[b->s.n - 1] = ln;
}
/* four NUL bytes (and line numbers) after the end, so that the lexer may look ahead */
static void pb_finish(pbuf *b) {
  size_t n = b->s.n;
  if (!b->ln) b->ln = sm_xcalloc(b->lcap = 8, sizeof(int));
  sm_buf_reserve(&b->s, 4);
  for (int k = 0; k < 4; k++) b->s.p[n + k] = 0, b->ln[n + k] = n ? b->ln[n - 1] : 1;
}
static void pb_free(pbuf *b) {
  sm_buf_free(&b->s);
  free(b->ln);
  memset(b, 0, sizeof *b);
}

static void preprocess(const char *src, pbuf *out) {
  size_t n = strlen(src);
  pbuf a = {0};
  int line = 1;
  for (size_t i = 0; i < n; i++) {
    pb_put(&a, src[i], line);
    if (src[i] == '\n') line++;
  }
  if (a.s.n && a.s.p[a.s.n - 1] == '\n') a.s.n--;
  pb_finish(&a);
  /* lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1" */
  pbuf b = {0};
  for (size_t i = 0; i < a.s.n;) {
    bool bol = i == 0 || a.s.p[i - 1] == '\n' || a.s.p[i - 1] == '\r';
    if (bol) {
      size_t j = i;
      while (j < a.s.n && (a.s.p[j] == ' ' || a.s.p[j] == '\t')) j++;
      if (j + 1 < a.s.n && a.s.p[j] == '{' && (a.s.p[j + 1] == '#' || a.s.p[j + 1] == '%' || a.s.p[j + 1] == '-')) {
        pb_put(&b, a.s.p[j], a.ln[j]);
        pb_put(&b, a.s.p[j + 1], a.ln[j + 1]);
        i = j + 2;
        continue;
      }
    }
    pb_put(&b, a.s.p[i], a.ln[i]);
    i++;
  }
  pb_finish(&b);
  pb_free(&a);
  /* trim_blocks: /([#%-]})\n/g -> "$1" */
  pbuf c = {0};
  for (size_t i = 0; i < b.s.n;) {
    if (i + 2 < b.s.n && (b.s.p[i] == '#' || b.s.p[i] == '%' || b.s.p[i] == '-') && b.s.p[i + 1] == '}' &&
        b.s.p[i + 2] == '\n') {
      pb_put(&c, b.s.p[i], b.ln[i]);
      pb_put(&c, b.s.p[i + 1], b.ln[i + 1]);
      i += 3;
      continue;
    }
    pb_put(&c, b.s.p[i], b.ln[i]);
    i++;
  }
  pb_finish(&c);
  pb_free(&b);
  /* {% generation %} / {% endgeneration %} (transformers' AssistantTracker, a call block: a scope of
   * its own around its body) become {% with %} / {% endwith %} */
  pbuf d = {0};
  for (size_t i = 0; i < c.s.n;) {
    if (c.s.p[i] == '{' && c.s.p[i + 1] == '%') {
      size_t j = i + 2, l;
      bool lstrip = false, rstrip = false, end = false;
      if (c.s.p[j] == '-') lstrip = true, j++;
      while (jj_is_space_at(c.s.p, c.s.n, j, &l)) j += l;
      if (!strncmp(c.s.p + j, "end", 3) && !strncmp(c.s.p + j + 3, "generation", 10)) j += 3, end = true;
      if (!strncmp(c.s.p + j, "generation", 10)) {
        j += 10;
        while (jj_is_space_at(c.s.p, c.s.n, j, &l)) j += l;
        if (c.s.p[j] == '-') rstrip = true, j++;
        if (c.s.p[j] == '%' && c.s.p[j + 1] == '}') {
          int ln = c.ln[i];
          const char *tag = end ? " endwith " : " with ";
          pb_put(&d, '{', ln);
          pb_put(&d, '%', ln);
          if (lstrip) pb_put(&d, '-', ln);
          for (const char *q = tag; *q; q++) pb_put(&d, *q, ln);
          if (rstrip) pb_put(&d, '-', ln);
          pb_put(&d, '%', ln);
          pb_put(&d, '}', ln);
          i = j + 2;
          continue;
        }
      }
    }
    pb_put(&d, c.s.p[i], c.ln[i]);
    i++;
  }
  pb_finish(&d);
  pb_free(&c);
  *out = d;
}

/* ---------------- lexer ---------------- */
typedef struct {
  jj_token *t;
  int n, cap;
  jj_arena *arena;
  const char *src; /* preprocessed, arena copy */
  const int *ln;
  size_t len, pos;
  jmp_buf *jmp;
  char *err;
  size_t errn;
  sm_buf *scratch; /* string literal being decoded */
} lexer;

__attribute__((format(printf, 3, 4))) static void lex_fail(lexer *L, int line, const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(L->err, L->errn, "line %d: %s", line, msg);
  longjmp(*L->jmp, 1);
}

static int cur_line(lexer *L) { return L->ln[L->pos < L->len ? L->pos : (L->len ? L->len - 1 : 0)]; }

static void push_tok(lexer *L, jj_toktype type, const char *s, size_t n, int line) {
  if (L->n == L->cap) {
    L->cap = L->cap ? L->cap * 2 : 256;
    jj_token *nt = jj_alloc(L->arena, sizeof(jj_token) * (size_t)L->cap);
    if (L->n) memcpy(nt, L->t, sizeof(jj_token) * (size_t)L->n);
    L->t = nt;
  }
  L->t[L->n].type = type;
  L->t[L->n].line = line;
  L->t[L->n].v.s = s;
  L->t[L->n].v.n = n;
  L->n++;
}

static jj_toktype last_type(lexer *L) { return L->n ? L->t[L->n - 1].type : T_EOF; }

static void strip_trailing_ws(lexer *L) {
  if (!L->n || L->t[L->n - 1].type != T_TEXT) return;
  jstr *v = &L->t[L->n - 1].v;
  size_t end = 0, i = 0, l;
  while (i < v->n) {
    if (jj_is_space_at(v->s, v->n, i, &l)) i += l;
    else {
      i += jj_utf8_next(v->s, v->n, i, NULL);
      end = i;
    }
  }
  v->n = end;
  if (!end) L->n--;
}

static void skip_leading_ws(lexer *L) {
  size_t l;
  while (L->pos < L->len && jj_is_space_at(L->src, L->len, L->pos, &l)) L->pos += l;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static void lex_string(lexer *L, char q, int line) {
  sm_buf *b = L->scratch;
  sm_buf_clear(b);
  L->pos++; /* opening quote */
  uint32_t pending_hi = 0;
  while (L->pos < L->len && L->src[L->pos] != q) {
    char c = L->src[L->pos];
    if (c == '\\') {
      L->pos++;
      if (L->pos >= L->len) lex_fail(L, line, "Unexpected end of input");
      char e = L->src[L->pos++];
      if (e == 'x' || e == 'u') {
        int len = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < len; k++) {
          int h = L->pos + (size_t)k < L->len ? hexval(L->src[L->pos + (size_t)k]) : -1;
          if (h < 0) lex_fail(L, line, "Invalid hexadecimal escape sequence");
          v = v * 16 + (uint32_t)h;
        }
        L->pos += (size_t)len;
        if (v >= 0xd800 && v < 0xdc00) {
          if (pending_hi) sm_buf_put_cp(b, 0xfffd);
          pending_hi = v;
        } else if (v >= 0xdc00 && v < 0xe000 && pending_hi) {
          sm_buf_put_cp(b, 0x10000 + ((pending_hi - 0xd800) << 10) + (v - 0xdc00));
          pending_hi = 0;
        } else {
          if (pending_hi) sm_buf_put_cp(b, 0xfffd), pending_hi = 0;
          sm_buf_put_cp(b, (v >= 0xd800 && v < 0xe000) ? 0xfffd : v);
        }
        if (L->pos >= L->len) lex_fail(L, line, "Unexpected end of input");
        continue;
      }
      if (pending_hi) sm_buf_put_cp(b, 0xfffd), pending_hi = 0;
      char u;
      switch (e) {
        case 'n': u = '\n'; break;
        case 't': u = '\t'; break;
        case 'r': u = '\r'; break;
        case 'b': u = '\b'; break;
        case 'f': u = '\f'; break;
        case 'v': u = '\v'; break;
        case '\'': u = '\''; break;
        case '"': u = '"'; break;
        case '\\': u = '\\'; break;
        default: lex_fail(L, line, "Unexpected escaped character: %c", e); u = 0;
      }
      sm_buf_putc(b, u);
      if (L->pos >= L->len) lex_fail(L, line, "Unexpected end of input");
      continue;
    }
    if (pending_hi) sm_buf_put_cp(b, 0xfffd), pending_hi = 0;
    sm_buf_putc(b, c);
    L->pos++;
    if (L->pos >= L->len) lex_fail(L, line, "Unexpected end of input");
  }
  if (pending_hi) sm_buf_put_cp(b, 0xfffd);
  if (L->pos >= L->len) lex_fail(L, line, "Unexpected end of input");
  L->pos++; /* closing quote */
  char *s = jj_alloc(L->arena, b->n + 1);
  memcpy(s, sm_buf_str(b), b->n + 1);
  push_tok(L, T_STR, s, b->n, line);
}

static void lex_digits(lexer *L) {
  while (L->pos < L->len && is_digit(L->src[L->pos])) {
    L->pos++;
    if (L->pos >= L->len) lex_fail(L, cur_line(L), "Unexpected end of input");
  }
}
/* digits with single underscores between them (Python 1_000) */
static void lex_udigits(lexer *L) {
  lex_digits(L);
  while (L->src[L->pos] == '_' && is_digit(L->src[L->pos + 1])) {
    L->pos++;
    lex_digits(L);
  }
}
/* a number literal as Jinja2's lexer reads it: 0b / 0o / 0x integers, decimal integers, and floats
 * with a fraction and/or an exponent (1.5, 1e-07, 2.5E+3); the source is NUL-padded, so peeking
 * one or two bytes ahead is safe */
static void lex_number(lexer *L, bool after_dot) {
  const char *s = L->src;
  char p = s[L->pos + 1] | 0x20;
  if (s[L->pos] == '0' && (p == 'x' || p == 'o' || p == 'b')) {
    int lim = p == 'x' ? 16 : p == 'o' ? 8 : 2;
    size_t j = L->pos + 2, st = j;
    for (;;) { /* (_?digit)+ */
      size_t d = s[j] == '_' ? j + 1 : j;
      int v = hexval(s[d]);
      if (v < 0 || v >= lim) break;
      j = d + 1;
    }
    if (j > st) {
      L->pos = j;
      return;
    }
  }
  lex_udigits(L);
  if (after_dot) return;
  if (s[L->pos] == '.' && is_digit(s[L->pos + 1])) {
    L->pos++;
    lex_udigits(L);
  }
  if ((s[L->pos] | 0x20) == 'e') {
    size_t j = L->pos + 1;
    if (s[j] == '+' || s[j] == '-') j++;
    if (is_digit(s[j])) {
      L->pos = j;
      lex_udigits(L);
    }
  }
}

static const struct {
  const char *seq;
  jj_toktype type;
} MAPPING[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_LPAREN},     {")", T_RPAREN},      {"{", T_LBRACE},     {"}", T_RBRACE},
    {"[", T_LBRACKET},   {"]", T_RBRACKET},    {",", T_COMMA},      {".", T_DOT},
    {":", T_COLON},      {"|", T_PIPE},        {"<=", T_CMP},       {">=", T_CMP},
    {"==", T_CMP},       {"!=", T_CMP},        {"<", T_CMP},        {">", T_CMP},
    {"+", T_ADD},        {"-", T_ADD},         {"~", T_ADD},        {"**", T_POW},
    {"*", T_MUL},        {"//", T_MUL},        {"/", T_MUL},        {"%", T_MUL},
    {"=", T_EQUALS},
};

static void tokenize(lexer *L) {
  const char *s = L->src;
  int curly = 0;
  while (L->pos < L->len) {
    jj_toktype lt = last_type(L);
    if (lt == T_EOF || lt == T_CLOSE_STMT || lt == T_CLOSE_EXPR || lt == T_COMMENT) {
      size_t st = L->pos;
      while (L->pos < L->len && !(s[L->pos] == '{' && (s[L->pos + 1] == '%' || s[L->pos + 1] == '{' ||
                                                        s[L->pos + 1] == '#')))
        L->pos++;
      if (L->pos > st) {
        push_tok(L, T_TEXT, s + st, L->pos - st, L->ln[st]);
        continue;
      }
    }
    int line = cur_line(L);
    if (s[L->pos] == '{' && s[L->pos + 1] == '#') {
      L->pos += 2;
      bool strip_before = s[L->pos] == '-';
      if (strip_before) L->pos++;
      size_t cst = L->pos;
      while (s[L->pos] != '#' || s[L->pos + 1] != '}') {
        if (L->pos + 2 >= L->len) lex_fail(L, line, "Missing end of comment tag");
        L->pos++;
      }
      size_t cn = L->pos - cst;
      bool strip_after = cn > 0 && s[L->pos - 1] == '-';
      if (strip_after) cn--;
      if (strip_before) strip_trailing_ws(L);
      push_tok(L, T_COMMENT, s + cst, cn, line);
      L->pos += 2;
      if (strip_after) skip_leading_ws(L);
      continue;
    }
    if (!strncmp(s + L->pos, "{%-", 3)) {
      strip_trailing_ws(L);
      push_tok(L, T_OPEN_STMT, "{%", 2, line);
      L->pos += 3;
      continue;
    }
    if (!strncmp(s + L->pos, "{{-", 3)) {
      strip_trailing_ws(L);
      push_tok(L, T_OPEN_EXPR, "{{", 2, line);
      curly = 0;
      L->pos += 3;
      continue;
    }
    {
      size_t l;
      while (L->pos < L->len && jj_is_space_at(s, L->len, L->pos, &l)) {
        L->pos += l;
        if (L->pos >= L->len) lex_fail(L, line, "Unexpected end of input");
      }
    }
    line = cur_line(L);
    if (!strncmp(s + L->pos, "-%}", 3)) {
      push_tok(L, T_CLOSE_STMT, "%}", 2, line);
      L->pos += 3;
      skip_leading_ws(L);
      continue;
    }
    if (!strncmp(s + L->pos, "-}}", 3)) {
      push_tok(L, T_CLOSE_EXPR, "}}", 2, line);
      L->pos += 3;
      skip_leading_ws(L);
      continue;
    }
    char ch = s[L->pos];
    if (ch == '-' || ch == '+') {
      jj_toktype t = last_type(L);
      if (t == T_TEXT || t == T_EOF) lex_fail(L, line, "Unexpected character: %c", ch);
      if (!(t == T_IDENT || t == T_NUM || t == T_STR || t == T_RPAREN || t == T_RBRACKET)) {
        size_t st = L->pos;
        L->pos++;
        size_t dst = L->pos;
        if (is_digit(s[L->pos])) lex_number(L, false);
        if (L->pos > dst) push_tok(L, T_NUM, s + st, L->pos - st, line);
        else push_tok(L, T_UNARY, s + st, 1, line);
        continue;
      }
    }
    bool matched = false;
    for (size_t k = 0; k < SM_ARRAY_LEN(MAPPING); k++) {
      if (MAPPING[k].type == T_CLOSE_EXPR && curly > 0) continue;
      size_t ml = strlen(MAPPING[k].seq);
      if (!strncmp(s + L->pos, MAPPING[k].seq, ml)) {
        push_tok(L, MAPPING[k].type, s + L->pos, ml, line);
        if (MAPPING[k].type == T_OPEN_EXPR) curly = 0;
        else if (MAPPING[k].type == T_LBRACE) curly++;
        else if (MAPPING[k].type == T_RBRACE) curly--;
        L->pos += ml;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (ch == '\'' || ch == '"') {
      lex_string(L, ch, line);
      continue;
    }
    if (is_digit(ch)) {
      size_t st = L->pos;
      lex_number(L, last_type(L) == T_DOT);
      push_tok(L, T_NUM, s + st, L->pos - st, line);
      continue;
    }
    if (is_word(ch)) {
      size_t st = L->pos;
      while (L->pos < L->len && is_word(s[L->pos])) {
        L->pos++;
        if (L->pos >= L->len) lex_fail(L, line, "Unexpected end of input");
      }
      push_tok(L, T_IDENT, s + st, L->pos - st, line);
      continue;
    }
    if ((unsigned char)ch >= 0x20 && (unsigned char)ch < 0x7f)
      lex_fail(L, line, "Unexpected character: %c", ch);
    lex_fail(L, line, "Unexpected character (byte 0x%02x)", (unsigned char)ch);
  }
  push_tok(L, T_EOF, "", 0, L->len ? L->ln[L->len - 1] : 1);
}

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
  static const char *names[] = {"Text", "NumericLiteral", "StringLiteral", "Identifier", "Equals",
                                "OpenParen", "CloseParen", "OpenStatement", "CloseStatement",
                                "OpenExpression", "CloseExpression", "OpenSquareBracket",
                                "CloseSquareBracket", "OpenCurlyBracket", "CloseCurlyBracket", "Comma",
                                "Dot", "Colon", "Pipe", "AdditiveBinaryOperator",
                                "MultiplicativeBinaryOperator", "ExponentiationBinaryOperator",
                                "ComparisonBinaryOperator", "UnaryOperator", "Comment", "end of template"};
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
    if (tk(P)->type == T_EOF)
      pfail(P, tline(P), "unexpected end of template, expected {%% %s %%}", a);
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
      op = v.s[0] == '=' ? OP_EQ : v.s[0] == '!' ? OP_NE : v.s[0] == '<' ? (v.n == 2 ? OP_LE : OP_LT)
                                                                           : (v.n == 2 ? OP_GE : OP_GT);
      P->cur++;
    } else
      break;
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
    return !(is_ident(P, "else") || is_ident(P, "or") || is_ident(P, "and") || is_ident(P, "if") ||
             is_ident(P, "is") || is_ident(P, "in") || is_ident(P, "not"));
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
          pfail(P, line, params ? "Expected identifier for parameter declaration"
                                : "Expected identifier for keyword argument");
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
        pfail(P, line, params ? "Non-default argument follows default argument"
                              : "Positional arguments must come before keyword arguments");
      else if (saw_spread)
        pfail(P, line, "Positional arguments must not follow `*` argument unpacking");
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
  jmp_buf jb;
  pbuf pp = {0};
  preprocess(src, &pp);
  sm_buf *scratch = sm_xcalloc(1, sizeof *scratch); /* heap: still valid after a longjmp */
  lexer L = {0};
  L.arena = &tpl->arena;
  char *copy = jj_alloc(&tpl->arena, pp.s.n + 4);
  memcpy(copy, pp.s.p, pp.s.n + 4);
  L.src = copy;
  L.ln = pp.ln;
  L.len = pp.s.n;
  L.jmp = &jb;
  L.err = err;
  L.errn = errn;
  L.scratch = scratch;
  if (setjmp(jb)) {
    pb_free(&pp);
    sm_buf_free(scratch);
    free(scratch);
    return -1;
  }
  tokenize(&L);
  parser P = {0};
  P.t = L.t;
  P.n = L.n;
  P.arena = &tpl->arena;
  P.jmp = &jb;
  P.err = err;
  P.errn = errn;
  P.scratch = scratch;
  nvec body = {0};
  while (P.t[P.cur].type != T_EOF) nv_push(&P, &body, parse_any(&P));
  tpl->body = nv_done(&body);
  pb_free(&pp);
  sm_buf_free(scratch);
  free(scratch);
  return 0;
}
