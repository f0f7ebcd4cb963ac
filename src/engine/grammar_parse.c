/* GBNF compiler: grammar text -> rules of elements (grammar_int.h). Hand-written: no Debian
 * library parses llama.cpp's grammar notation or builds token masks from it (the notation and
 * the rewriting of repetitions into rules follow llama.cpp's llama-grammar.cpp). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_int.h"

#define MAX_ELEMS (2 << 20) /* elements in all: bounds {m,n} expansions */
#define MAX_DEPTH 200       /* nested groups */

typedef struct {
  sm_gelem *e;
  int n, cap;
  bool defined;
  bool gen; /* made here for a group or a repetition */
} rbuf;

typedef struct {
  const char *src, *p;
  rbuf *rules;
  char **names;
  int n_rules, cap_rules;
  sm_gcls *cls;
  int n_cls, cap_cls;
  int32_t ascii_cls[128]; /* class id of the one-character class, -1 if not made yet */
  long total;
  int depth;
  char err[200];
} pstate;

static void perr(pstate *ps, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void perr(pstate *ps, const char *at, const char *fmt, ...) {
  if (ps->err[0]) return;
  int line = 1, col = 1;
  for (const char *q = ps->src; q < at && *q; q++) {
    if (*q == '\n') {
      line++;
      col = 1;
    } else col++;
  }
  char msg[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(ps->err, sizeof ps->err, "grammar line %d col %d: %s", line, col, msg);
}

static void push(pstate *ps, int rule, uint8_t type, int32_t v) {
  rbuf *r = &ps->rules[rule];
  if (r->n == r->cap) {
    r->cap = r->cap ? r->cap * 2 : 16;
    r->e = sm_xrealloc(r->e, sizeof(sm_gelem) * (size_t)r->cap);
  }
  r->e[r->n].type = type;
  r->e[r->n].v = v;
  r->n++;
  ps->total++;
}

static int rule_id(pstate *ps, const char *name, size_t len) {
  for (int i = 0; i < ps->n_rules; i++)
    if (strlen(ps->names[i]) == len && !memcmp(ps->names[i], name, len)) return i;
  if (ps->n_rules == ps->cap_rules) {
    ps->cap_rules = ps->cap_rules ? ps->cap_rules * 2 : 32;
    ps->rules = sm_xrealloc(ps->rules, sizeof(rbuf) * (size_t)ps->cap_rules);
    ps->names = sm_xrealloc(ps->names, sizeof(char *) * (size_t)ps->cap_rules);
  }
  memset(&ps->rules[ps->n_rules], 0, sizeof(rbuf));
  char *nm = sm_xmalloc(len + 1);
  memcpy(nm, name, len);
  nm[len] = 0;
  ps->names[ps->n_rules] = nm;
  return ps->n_rules++;
}

static int new_rule(pstate *ps, int parent) {
  char nm[96];
  snprintf(nm, sizeof nm, "%.60s-%d", ps->names[parent], ps->n_rules);
  int r = rule_id(ps, nm, strlen(nm));
  ps->rules[r].defined = true;
  ps->rules[r].gen = true;
  return r;
}

static int32_t add_cls(pstate *ps, bool neg, const uint32_t *r, int n) {
  if (!neg && n == 1 && r[0] == r[1] && r[0] < 128 && ps->ascii_cls[r[0]] >= 0) return ps->ascii_cls[r[0]];
  if (ps->n_cls == ps->cap_cls) {
    ps->cap_cls = ps->cap_cls ? ps->cap_cls * 2 : 64;
    ps->cls = sm_xrealloc(ps->cls, sizeof(sm_gcls) * (size_t)ps->cap_cls);
  }
  sm_gcls *c = &ps->cls[ps->n_cls];
  c->neg = neg;
  c->n = n;
  c->r = sm_xmalloc(sizeof(uint32_t) * 2 * (size_t)(n ? n : 1));
  if (n) memcpy(c->r, r, sizeof(uint32_t) * 2 * (size_t)n);
  if (!neg && n == 1 && r[0] == r[1] && r[0] < 128) ps->ascii_cls[r[0]] = ps->n_cls;
  return ps->n_cls++;
}

static bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static const char *skip_space(const char *p, bool newlines) {
  for (;;) {
    if (*p == '#') {
      while (*p && *p != '\n' && *p != '\r') p++;
    } else if (*p == ' ' || *p == '\t' || ((*p == '\n' || *p == '\r') && newlines)) {
      p++;
    } else {
      return p;
    }
  }
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
  return -1;
}

/* one code point of a literal or class at *pp (UTF-8 or escape); -1 on error */
static int64_t parse_char(pstate *ps, const char **pp) {
  const char *p = *pp;
  if (*p == '\\') {
    char c = p[1];
    int nhex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (nhex) {
      uint32_t v = 0;
      for (int i = 0; i < nhex; i++) {
        int h = hexval(p[2 + i]);
        if (h < 0) {
          perr(ps, p, "bad \\%c escape", c);
          return -1;
        }
        v = v * 16 + (uint32_t)h;
      }
      if (v > 0x10FFFF) {
        perr(ps, p, "code point out of range");
        return -1;
      }
      *pp = p + 2 + nhex;
      return v;
    }
    int64_t v;
    switch (c) {
      case 'n': v = '\n'; break;
      case 'r': v = '\r'; break;
      case 't': v = '\t'; break;
      case '0': v = 0; break;
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '/':
      case '^':
      case '\'': v = c; break;
      default: perr(ps, p, "unknown escape '\\%c'", c ? c : '0'); return -1;
    }
    *pp = p + 2;
    return v;
  }
  unsigned char b = (unsigned char)*p;
  if (!b) {
    perr(ps, p, "unexpected end of grammar");
    return -1;
  }
  int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (!len) {
    perr(ps, p, "invalid UTF-8");
    return -1;
  }
  uint32_t v = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (int i = 1; i < len; i++) {
    unsigned char cb = (unsigned char)p[i];
    if ((cb & 0xC0) != 0x80) {
      perr(ps, p, "invalid UTF-8");
      return -1;
    }
    v = (v << 6) | (cb & 0x3F);
  }
  *pp = p + len;
  return v;
}

static const char *parse_alternates(pstate *ps, const char *p, int rule, bool nested);

/* Copy elements [from, to) of rule src to the end of rule dst. */
static void copy_elems(pstate *ps, int dst, int src, int from, int to) {
  for (int i = from; i < to; i++) push(ps, dst, ps->rules[src].e[i].type, ps->rules[src].e[i].v);
}

/* The last symbol of rule's current sequence, elements [start, n), is repeated min..max times
 * (max < 0: unbounded); rewritten into new rules as llama.cpp does. */
static void repeat(pstate *ps, int rule, int start, int min, int max, const char *at) {
  rbuf *r = &ps->rules[rule];
  int len = r->n - start;
  if (len <= 0) {
    perr(ps, at, "repetition without a preceding symbol");
    return;
  }
  long extra = (long)len * (max < 0 ? min + 2 : max + 2);
  if (ps->total + extra > MAX_ELEMS) {
    perr(ps, at, "repetition makes the grammar too large");
    return;
  }
  /* keep the symbol in a rule of its own */
  int sym = new_rule(ps, rule);
  r = &ps->rules[rule];
  copy_elems(ps, sym, rule, start, r->n);
  push(ps, sym, GE_END, 0);
  ps->rules[rule].n = start;
  for (int i = 0; i < min; i++) push(ps, rule, GE_REF, sym);
  if (max < 0) {
    /* star ::= sym star | (empty) */
    int star = new_rule(ps, rule);
    push(ps, star, GE_REF, sym);
    push(ps, star, GE_REF, star);
    push(ps, star, GE_ALT, 0);
    push(ps, star, GE_END, 0);
    push(ps, rule, GE_REF, star);
  } else if (max > min) {
    /* opt_1 ::= sym | ; opt_k ::= sym opt_{k-1} | */
    int prev = -1;
    for (int k = 1; k <= max - min; k++) {
      int o = new_rule(ps, rule);
      push(ps, o, GE_REF, sym);
      if (prev >= 0) push(ps, o, GE_REF, prev);
      push(ps, o, GE_ALT, 0);
      push(ps, o, GE_END, 0);
      prev = o;
    }
    push(ps, rule, GE_REF, prev);
  }
}

static int parse_int(const char **pp) {
  const char *p = *pp;
  if (*p < '0' || *p > '9') return -1;
  long v = 0;
  while (*p >= '0' && *p <= '9') {
    v = v * 10 + (*p - '0');
    if (v > 100000000) v = 100000000;
    p++;
  }
  *pp = p;
  return (int)v;
}

static const char *parse_sequence(pstate *ps, const char *p, int rule, bool nested) {
  int last = -1; /* start of the last symbol */
  while (*p && !ps->err[0]) {
    int here = ps->rules[rule].n;
    if (*p == '"') {
      p++;
      last = here;
      while (*p != '"') {
        if (!*p) {
          perr(ps, p, "unterminated literal");
          return p;
        }
        int64_t c = parse_char(ps, &p);
        if (c < 0) return p;
        uint32_t rg[2] = {(uint32_t)c, (uint32_t)c};
        push(ps, rule, GE_CLS, add_cls(ps, false, rg, 1));
      }
      p = skip_space(p + 1, nested);
    } else if (*p == '[') {
      p++;
      bool neg = *p == '^';
      if (neg) p++;
      uint32_t *rg = NULL;
      int n = 0, cap = 0;
      while (*p != ']') {
        if (!*p) {
          free(rg);
          perr(ps, p, "unterminated character class");
          return p;
        }
        int64_t lo = parse_char(ps, &p), hi = lo;
        if (lo < 0) {
          free(rg);
          return p;
        }
        if (*p == '-' && p[1] != ']') {
          p++;
          hi = parse_char(ps, &p);
          if (hi < 0) {
            free(rg);
            return p;
          }
          if (hi < lo) {
            free(rg);
            perr(ps, p, "character range is reversed");
            return p;
          }
        }
        if (n == cap) {
          cap = cap ? cap * 2 : 8;
          rg = sm_xrealloc(rg, sizeof(uint32_t) * 2 * (size_t)cap);
        }
        rg[2 * n] = (uint32_t)lo;
        rg[2 * n + 1] = (uint32_t)hi;
        n++;
      }
      last = here;
      push(ps, rule, GE_CLS, add_cls(ps, neg, rg, n));
      free(rg);
      p = skip_space(p + 1, nested);
    } else if (*p == '.') {
      uint32_t rg[2] = {0, 0x10FFFF};
      last = here;
      push(ps, rule, GE_CLS, add_cls(ps, false, rg, 1));
      p = skip_space(p + 1, nested);
    } else if (*p == '<' && p[1] == '[') {
      const char *q = p + 2;
      int id = parse_int(&q);
      if (id < 0 || q[0] != ']' || q[1] != '>') {
        perr(ps, p, "token reference must be <[id]>");
        return p;
      }
      last = here;
      push(ps, rule, GE_TOK, id);
      p = skip_space(q + 2, nested);
    } else if (is_word(*p)) {
      const char *s = p;
      while (is_word(*p)) p++;
      const char *after = skip_space(p, true);
      if (after[0] == ':' && after[1] == ':' && after[2] == '=') return s; /* next rule */
      last = here;
      push(ps, rule, GE_REF, rule_id(ps, s, (size_t)(p - s)));
      p = skip_space(p, nested);
    } else if (*p == '(') {
      if (++ps->depth > MAX_DEPTH) {
        perr(ps, p, "groups nested too deeply");
        return p;
      }
      int sub = new_rule(ps, rule);
      p = parse_alternates(ps, skip_space(p + 1, true), sub, true);
      ps->depth--;
      if (ps->err[0]) return p;
      if (*p != ')') {
        perr(ps, p, "expected ')'");
        return p;
      }
      last = here;
      push(ps, rule, GE_REF, sub);
      p = skip_space(p + 1, nested);
    } else if (*p == '*' || *p == '+' || *p == '?') {
      if (last < 0) {
        perr(ps, p, "'%c' without a preceding symbol", *p);
        return p;
      }
      repeat(ps, rule, last, *p == '+' ? 1 : 0, *p == '?' ? 1 : -1, p);
      last = -1;
      p = skip_space(p + 1, nested);
    } else if (*p == '{') {
      if (last < 0) {
        perr(ps, p, "'{' without a preceding symbol");
        return p;
      }
      const char *q = skip_space(p + 1, true);
      int mn = parse_int(&q), mx;
      if (mn < 0) mn = 0;
      q = skip_space(q, true);
      if (*q == ',') {
        q = skip_space(q + 1, true);
        mx = parse_int(&q);
        q = skip_space(q, true);
      } else {
        mx = mn;
      }
      if (*q != '}') {
        perr(ps, p, "bad repetition count (expected {m}, {m,}, {m,n} or {,n})");
        return p;
      }
      if (mx >= 0 && mx < mn) {
        perr(ps, p, "repetition maximum is below the minimum");
        return p;
      }
      repeat(ps, rule, last, mn, mx, p);
      last = -1;
      p = skip_space(q + 1, nested);
    } else {
      break;
    }
  }
  return p;
}

static const char *parse_alternates(pstate *ps, const char *p, int rule, bool nested) {
  p = parse_sequence(ps, p, rule, nested);
  while (*p == '|' && !ps->err[0]) {
    push(ps, rule, GE_ALT, 0);
    p = parse_sequence(ps, skip_space(p + 1, true), rule, nested);
  }
  push(ps, rule, GE_END, 0);
  return p;
}

/* ---- checks: undefined rules, left recursion ---- */

static bool alt_end(uint8_t t) { return t == GE_END || t == GE_ALT; }

static void free_pstate(pstate *ps) {
  for (int i = 0; i < ps->n_rules; i++) {
    free(ps->rules[i].e);
    free(ps->names[i]);
  }
  free(ps->rules);
  free(ps->names);
  for (int i = 0; i < ps->n_cls; i++) free(ps->cls[i].r);
  free(ps->cls);
}

/* rule r can derive the empty string */
static void compute_nullable(const sm_grammar *g, bool *nul) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (int r = 0; r < g->n_rules; r++) {
      if (nul[r]) continue;
      for (int a = g->alt_off[r]; a < g->alt_off[r + 1] && !nul[r]; a++) {
        int i = g->alts[a];
        while (g->el[i].type == GE_REF && nul[g->el[i].v]) i++;
        if (alt_end(g->el[i].type)) {
          nul[r] = true;
          changed = true;
        }
      }
    }
  }
}

/* DFS over "rule a can start with rule b"; colour 1 = on the path */
static int left_rec(const sm_grammar *g, const bool *nul, int r, uint8_t *col) {
  if (col[r] == 1) return r;
  if (col[r] == 2) return -1;
  col[r] = 1;
  for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
    for (int i = g->alts[a]; g->el[i].type == GE_REF; i++) {
      int f = left_rec(g, nul, g->el[i].v, col);
      if (f >= 0) return f;
      if (!nul[g->el[i].v]) break;
    }
  }
  col[r] = 2;
  return -1;
}

smelt_status sm_grammar_compile(const char *src, sm_grammar **out) {
  *out = NULL;
  if (!src) return sm_err(SMELT_ERR_INVALID, "grammar: no text");
  pstate ps;
  memset(&ps, 0, sizeof ps);
  ps.src = src;
  for (int i = 0; i < 128; i++) ps.ascii_cls[i] = -1;
  const char *p = skip_space(src, true);
  while (*p && !ps.err[0]) {
    const char *s = p;
    while (is_word(*p)) p++;
    if (p == s) {
      perr(&ps, p, "expected a rule name");
      break;
    }
    int r = rule_id(&ps, s, (size_t)(p - s));
    if (ps.rules[r].defined) {
      perr(&ps, s, "rule '%s' is defined twice", ps.names[r]);
      break;
    }
    ps.rules[r].defined = true;
    p = skip_space(p, false);
    if (strncmp(p, "::=", 3)) {
      perr(&ps, p, "expected '::='");
      break;
    }
    p = parse_alternates(&ps, skip_space(p + 3, true), r, false);
    if (ps.err[0]) break;
    if (*p && *p != '\n' && *p != '\r') {
      perr(&ps, p, "unexpected '%c'", *p);
      break;
    }
    p = skip_space(p, true);
  }
  int root = -1;
  if (!ps.err[0]) {
    for (int i = 0; i < ps.n_rules; i++)
      if (!strcmp(ps.names[i], "root")) root = i;
    if (root < 0) snprintf(ps.err, sizeof ps.err, "grammar has no 'root' rule");
  }
  if (!ps.err[0])
    for (int i = 0; i < ps.n_rules; i++)
      if (!ps.rules[i].defined) {
        snprintf(ps.err, sizeof ps.err, "grammar: rule '%.60s' is used but not defined", ps.names[i]);
        break;
      }
  if (ps.err[0]) {
    smelt_status st = sm_err(SMELT_ERR_FORMAT, "%s", ps.err);
    free_pstate(&ps);
    return st;
  }
  /* flatten */
  sm_grammar *g = sm_xcalloc(1, sizeof *g);
  g->id = sm_grammar_new_id();
  atomic_init(&g->refs, 1);
  g->n_rules = ps.n_rules;
  g->root = root;
  long n_el = 0, n_alts = 0;
  for (int i = 0; i < ps.n_rules; i++) {
    n_el += ps.rules[i].n;
    for (int k = 0; k < ps.rules[i].n; k++) n_alts += alt_end(ps.rules[i].e[k].type);
  }
  g->el = sm_xmalloc(sizeof(sm_gelem) * (size_t)(n_el + 1));
  g->alts = sm_xmalloc(sizeof(int32_t) * (size_t)(n_alts + 1));
  g->alt_off = sm_xmalloc(sizeof(int) * (size_t)(ps.n_rules + 1));
  g->gen = sm_xcalloc((size_t)ps.n_rules + 1, 1);
  for (int i = 0; i < ps.n_rules; i++) g->gen[i] = ps.rules[i].gen;
  int e = 0, a = 0;
  for (int i = 0; i < ps.n_rules; i++) {
    g->alt_off[i] = a;
    g->alts[a++] = e;
    for (int k = 0; k < ps.rules[i].n; k++) {
      g->el[e++] = ps.rules[i].e[k];
      if (ps.rules[i].e[k].type == GE_ALT) g->alts[a++] = e;
    }
    free(ps.rules[i].e);
  }
  g->alt_off[ps.n_rules] = a;
  g->n_el = e;
  g->names = ps.names;
  g->cls = ps.cls;
  g->n_cls = ps.n_cls;
  free(ps.rules);
  /* left recursion would make the parser expand forever */
  bool *nul = sm_xcalloc((size_t)g->n_rules, 1);
  uint8_t *col = sm_xcalloc((size_t)g->n_rules, 1);
  compute_nullable(g, nul);
  int bad = -1;
  for (int r = 0; r < g->n_rules && bad < 0; r++) bad = left_rec(g, nul, r, col);
  free(nul);
  free(col);
  if (bad >= 0) {
    smelt_status st = sm_err(SMELT_ERR_FORMAT, "grammar: rule '%.60s' is left-recursive", g->names[bad]);
    sm_grammar_free(g);
    return st;
  }
  *out = g;
  return SMELT_OK;
}

sm_grammar *sm_grammar_ref(sm_grammar *g) {
  if (g) atomic_fetch_add(&g->refs, 1);
  return g;
}

void sm_grammar_free(sm_grammar *g) {
  if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
  sm_gpre_free_all(g);
  for (int i = 0; i < g->n_rules; i++) free(g->names[i]);
  free(g->names);
  for (int i = 0; i < g->n_cls; i++) free(g->cls[i].r);
  free(g->cls);
  free(g->el);
  free(g->alts);
  free(g->alt_off);
  free(g->gen);
  free(g);
}

int sm_grammar_n_rules(const sm_grammar *g) { return g ? g->n_rules : 0; }
