/* Chat-template interpreter: arena, preprocessing and lexer.
 * Structured after @huggingface/jinja's lexer.ts (with line tracking), with the syntax of Python
 * Jinja2 where they differ (number literals). Hand-written: no Debian C library interprets Jinja
 * templates. jj_lex turns a template into tokens for the parser (jinja_parse.c). */
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
static bool is_word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_'; }

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
  {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR}, {"(", T_LPAREN},
  {")", T_RPAREN},     {"{", T_LBRACE},      {"}", T_RBRACE},     {"[", T_LBRACKET},    {"]", T_RBRACKET},
  {",", T_COMMA},      {".", T_DOT},         {":", T_COLON},      {"|", T_PIPE},        {"<=", T_CMP},
  {">=", T_CMP},       {"==", T_CMP},        {"!=", T_CMP},       {"<", T_CMP},         {">", T_CMP},
  {"+", T_ADD},        {"-", T_ADD},         {"~", T_ADD},        {"**", T_POW},        {"*", T_MUL},
  {"//", T_MUL},       {"/", T_MUL},         {"%", T_MUL},        {"=", T_EQUALS},
};

static void tokenize(lexer *L) {
  const char *s = L->src;
  int curly = 0;
  while (L->pos < L->len) {
    jj_toktype lt = last_type(L);
    if (lt == T_EOF || lt == T_CLOSE_STMT || lt == T_CLOSE_EXPR || lt == T_COMMENT) {
      size_t st = L->pos;
      while (L->pos < L->len &&
             !(s[L->pos] == '{' && (s[L->pos + 1] == '%' || s[L->pos + 1] == '{' || s[L->pos + 1] == '#')))
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
    if ((unsigned char)ch >= 0x20 && (unsigned char)ch < 0x7f) lex_fail(L, line, "Unexpected character: %c", ch);
    lex_fail(L, line, "Unexpected character (byte 0x%02x)", (unsigned char)ch);
  }
  push_tok(L, T_EOF, "", 0, L->len ? L->ln[L->len - 1] : 1);
}

int jj_lex(const char *src, jj_arena *arena, jj_token **toks, int *n, char *err, size_t errn) {
  jmp_buf jb;
  pbuf pp = {0};
  preprocess(src, &pp);
  sm_buf *scratch = sm_xcalloc(1, sizeof *scratch); /* heap: still valid after a longjmp */
  lexer L = {0};
  L.arena = arena;
  char *copy = jj_alloc(arena, pp.s.n + 4);
  memcpy(copy, pp.s.p, pp.s.n + 4);
  L.src = copy;
  L.ln = pp.ln;
  L.len = pp.s.n;
  L.jmp = &jb;
  L.err = err;
  L.errn = errn;
  L.scratch = scratch;
  int rc = 0;
  if (setjmp(jb)) rc = -1;
  else tokenize(&L);
  pb_free(&pp);
  sm_buf_free(scratch);
  free(scratch);
  *toks = L.t;
  *n = L.n;
  return rc;
}
