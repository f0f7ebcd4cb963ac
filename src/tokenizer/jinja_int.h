/* Internal definitions of the chat-template (Jinja2 subset) interpreter.
 *
 * Semantics follow Python Jinja2 as transformers' apply_chat_template configures it
 * (ImmutableSandboxedEnvironment, default Undefined): Python's str()/repr() of values, its
 * scoping (a loop body is a scope of its own; macros close over where they were defined), its
 * undefined values (printable, iterable and false, an error for anything else) and its lazy
 * iterators (select/map/... give generators: one pass, no len()).
 *
 * Memory: the compiled template (tokens + AST) lives in one arena owned by sm_jinja; a
 * render allocates every runtime value in a per-render arena released at the end. Errors
 * (syntax or runtime) longjmp back to the entry point with a "line N: ..." message. */
#ifndef SM_JINJA_INT_H
#define SM_JINJA_INT_H
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cjson/cJSON.h>

/* ---- limits (guard against runaway templates) ---- */
#define JJ_MAX_PARSE_DEPTH 200
#define JJ_MAX_EVAL_DEPTH 400
#define JJ_MAX_ITERATIONS 5000000L /* total loop iterations per render */
#define JJ_MAX_ARENA (512u << 20)  /* bytes of runtime values per render */
#define JJ_MAX_RANGE 1000000L

/* ---- arena ---- */
typedef struct jj_chunk jj_chunk;
typedef struct {
  jj_chunk *head;
  size_t total, limit;
  jmp_buf *oom_jmp; /* where to jump when the limit is hit (NULL: abort via sm_xmalloc rules) */
  char *errbuf;     /* set on limit error */
} jj_arena;
void *jj_alloc(jj_arena *a, size_t n);
void *jj_calloc(jj_arena *a, size_t n);
void jj_arena_free(jj_arena *a);

typedef struct {
  const char *s;
  size_t n;
} jstr;

/* ---- tokens ---- */
typedef enum {
  T_TEXT,
  T_NUM,
  T_STR,
  T_IDENT,
  T_EQUALS,
  T_LPAREN,
  T_RPAREN,
  T_OPEN_STMT,
  T_CLOSE_STMT,
  T_OPEN_EXPR,
  T_CLOSE_EXPR,
  T_LBRACKET,
  T_RBRACKET,
  T_LBRACE,
  T_RBRACE,
  T_COMMA,
  T_DOT,
  T_COLON,
  T_PIPE,
  T_ADD,
  T_MUL,
  T_POW,
  T_CMP,
  T_UNARY,
  T_COMMENT,
  T_EOF
} jj_toktype;

typedef struct {
  jj_toktype type;
  int line;
  jstr v;
} jj_token;

/* ---- AST ---- */
typedef enum {
  N_STR,
  N_INT,
  N_FLOAT,
  N_IDENT,
  N_LIST,
  N_TUPLE,
  N_DICT,
  N_MEMBER,
  N_SLICE,
  N_CALL,
  N_KWARG,
  N_SPREAD,
  N_KWSPREAD,
  N_BINOP,
  N_UNARY,
  N_FILTER,
  N_TEST,
  N_SELECT,
  N_TERNARY,
  /* statements */
  N_IF,
  N_FOR,
  N_SET,
  N_MACRO,
  N_CALLBLOCK,
  N_FILTERBLOCK,
  N_BREAK,
  N_CONTINUE,
  N_COMMENT,
  N_WITH /* l2: N_KWARG assignments (s = name, a = value), l1: body */
} jj_nodekind;

typedef enum {
  OP_ADD,
  OP_SUB,
  OP_TILDE,
  OP_MUL,
  OP_DIV,
  OP_FLOORDIV,
  OP_MOD,
  OP_POW,
  OP_EQ,
  OP_NE,
  OP_LT,
  OP_GT,
  OP_LE,
  OP_GE,
  OP_AND,
  OP_OR,
  OP_IN,
  OP_NOTIN,
  OP_NOT,
  OP_NEG,
  OP_POS
} jj_op;

typedef struct jj_node jj_node;
typedef struct {
  jj_node **v;
  int n;
} jj_nodes;

struct jj_node {
  jj_nodekind kind;
  int line;
  int op;        /* jj_op for BINOP/UNARY; computed flag for MEMBER; negate for TEST */
  bool has_args; /* FILTER/TEST: called with an argument list */
  jstr s;        /* STR value, IDENT/FILTER/TEST/MACRO name, KWARG key */
  int64_t i;
  double f;
  jj_node *a, *b, *c; /* children (see parser for each kind) */
  jj_nodes l1, l2;    /* lists: bodies, args, items ... */
};

/* ---- runtime values ---- */
typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC, V_LOOP } jj_vtype;

/* what a V_LIST stands for in Python: a list (or a tuple, see jv.tuple), a one-pass iterator
 * (generator, reversed()), a dict view (d.items(), d.keys(), d.values()) or a range() */
enum { LK_LIST, LK_GEN, LK_REVITER, LK_ITEMS, LK_KEYS, LK_VALUES, LK_RANGE };

typedef struct jv jv;
typedef struct {
  jv **v;
  size_t n, cap;
  size_t pos;       /* LK_GEN / LK_REVITER: items already consumed */
  int64_t range[3]; /* LK_RANGE: start, stop, step */
} jj_list;
typedef struct {
  jstr *k;
  jv **v;
  size_t n, cap;
} jj_dict;

typedef enum {
  F_MACRO,
  F_CALLER,
  F_RANGE,
  F_RAISE,
  F_STRFTIME,
  F_NAMESPACE,
  F_LOOP_CYCLE,
  F_LOOP_CHANGED,
  /* bound methods; self = receiver */
  M_STR_UPPER,
  M_STR_LOWER,
  M_STR_STRIP,
  M_STR_LSTRIP,
  M_STR_RSTRIP,
  M_STR_TITLE,
  M_STR_CAPITALIZE,
  M_STR_STARTSWITH,
  M_STR_ENDSWITH,
  M_STR_SPLIT,
  M_STR_REPLACE,
  M_STR_FIND,
  M_STR_COUNT,
  M_STR_JOIN,
  M_STR_FORMAT,
  M_STR_ISDIGIT,
  M_STR_ISALPHA,
  M_STR_ISSPACE,
  M_DICT_GET,
  M_DICT_ITEMS,
  M_DICT_KEYS,
  M_DICT_VALUES,
  M_DICT_DICTSORT
} jj_funckind;

typedef struct jj_env jj_env;
typedef struct {
  jj_funckind kind;
  jv *self;
  const jj_node *node; /* MACRO / CALLER definition */
  jj_env *env;         /* MACRO / CALLER: the scope it was defined in */
} jj_func;

typedef struct jj_loop jj_loop; /* the `loop` object of a for loop (jinja_eval.c) */

struct jv {
  uint8_t t;      /* jj_vtype */
  uint8_t tuple;  /* LIST: a Python tuple */
  uint8_t lk;     /* LIST: LK_* */
  uint8_t kwargs; /* DICT holding keyword arguments of a call */
  union {
    bool b;
    int64_t i;
    double f;
    jstr s; /* STR; UNDEF: the message an operation on it raises (empty: none known) */
    jj_list *l;
    jj_dict *d;
    jj_func *fn;
    jj_loop *lp;
  } u;
};

struct jj_env {
  jj_env *parent;
  jj_dict vars;
};

/* compiled template */
struct sm_jinja {
  jj_arena arena;
  jj_nodes body;
};

/* parse: returns 0 on success; on error writes message to err (size errn) */
int jj_parse(const char *src, struct sm_jinja *tpl, char *err, size_t errn);

/* text helpers shared by lexer and runtime */
/* jinja_lex.c: the tokens of template src (allocated in arena, T_EOF last); -1 and err on a lexical error */
int jj_lex(const char *src, jj_arena *arena, jj_token **toks, int *n, char *err, size_t errn);
bool jj_is_space_at(const char *s, size_t n, size_t i, size_t *len); /* Python str.isspace() at byte i */
bool jj_py_space_cp(int32_t c);
size_t jj_utf8_next(const char *s, size_t n, size_t i, int32_t *cp);
#endif
