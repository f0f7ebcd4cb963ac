/* Internal structures of the HF tokenizer.json implementation (not part of the API). */
#ifndef SM_TOK_INTERNAL_H
#define SM_TOK_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include "base/strbuf.h"
#include "tokenizer/tokenizer.h"

/* ---- UTF-8 ---- */
/* Decode one code point of *valid* UTF-8 at s (n bytes left); returns its length. */
int sm_utf8_dec(const char *s, size_t n, uint32_t *cp);
/* Append s to out, replacing invalid sequences by U+FFFD like Rust's String::from_utf8_lossy. */
void sm_utf8_lossy(sm_buf *out, const char *s, size_t n);
bool sm_utf8_valid(const char *s, size_t n);
bool sm_uc_is_whitespace(uint32_t c); /* Rust char::is_whitespace */
bool sm_uc_is_numeric(uint32_t c);    /* Rust char::is_numeric (unicode_props.h) */
bool sm_uc_is_alnum(uint32_t c);      /* Rust char::is_alphanumeric */

/* ---- string -> int32 hash map (keys are not copied; they must outlive the map) ---- */
typedef struct {
  const char *k;
  uint32_t klen;
  int32_t v;
} sm_smap_ent;
typedef struct {
  sm_smap_ent *e;
  size_t cap, n;
} sm_smap;
uint64_t sm_hash_bytes(const void *p, size_t n);
void sm_smap_put(sm_smap *m, const char *k, size_t klen, int32_t v);
int32_t sm_smap_get(const sm_smap *m, const char *k, size_t klen); /* -1 if absent */
void sm_smap_free(sm_smap *m);

/* ---- (a,b) pair -> (rank, new_id) ---- */
typedef struct {
  uint64_t k;
  int32_t rank, id;
} sm_pmap_ent;
typedef struct {
  sm_pmap_ent *e;
  size_t cap, n;
} sm_pmap;
void sm_pmap_put(sm_pmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const sm_pmap_ent *sm_pmap_get(const sm_pmap *m, int32_t a, int32_t b);
void sm_pmap_free(sm_pmap *m);

/* ---- pipeline components ---- */
typedef enum { PAT_STRING, PAT_REGEX } sm_pat_kind;
typedef struct {
  sm_pat_kind kind;
  char *lit;
  size_t litlen;  /* PAT_STRING */
  pcre2_code *re; /* PAT_REGEX */
} sm_pattern;

enum {
  NORM_NFC = 1,
  NORM_NFD,
  NORM_NFKC,
  NORM_NFKD,
  NORM_LOWER,
  NORM_STRIP,
  NORM_REPLACE,
  NORM_PREPEND,
  NORM_SEQ,
  NORM_STRIP_ACCENTS
};
typedef struct sm_norm {
  int type;
  sm_pattern pat;
  char *str;
  size_t slen;      /* Replace content / Prepend string */
  bool left, right; /* Strip */
  struct sm_norm *kids;
  int nkids;
} sm_norm;

enum { SPLIT_REMOVED = 1, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum {
  PT_SPLIT = 1,
  PT_BYTELEVEL,
  PT_METASPACE,
  PT_DIGITS,
  PT_WHITESPACE,
  PT_WHITESPACE_SPLIT,
  PT_PUNCT,
  PT_CHAR_DELIM,
  PT_SEQ
};
enum { PREPEND_ALWAYS = 0, PREPEND_FIRST, PREPEND_NEVER };
typedef struct sm_pretok {
  int type;
  sm_pattern pat;
  int behavior;
  bool invert;                      /* Split, Punctuation(behavior) */
  bool add_prefix_space, use_regex; /* ByteLevel */
  uint32_t repl;
  char repl_s[8];
  int repl_len;
  int prepend_scheme;
  bool split;      /* Metaspace, CharDelimiterSplit */
  bool individual; /* Digits */
  struct sm_pretok *kids;
  int nkids;
} sm_pretok;

enum { DEC_BYTELEVEL = 1, DEC_METASPACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_REPLACE, DEC_SEQ };
typedef struct sm_decoder {
  int type;
  sm_pattern pat;
  char *str;
  size_t slen; /* Replace */
  uint32_t ch;
  int start, stop; /* Strip */
  uint32_t repl;
  int prepend_scheme; /* Metaspace */
  struct sm_decoder *kids;
  int nkids;
} sm_decoder;

enum { POST_TEMPLATE = 1, POST_BYTELEVEL, POST_SEQ, POST_BERT };
typedef struct sm_post {
  int type;
  int32_t *pre, *post;
  int npre, npost; /* TemplateProcessing single: ids before/after $A; Bert/Roberta cls/sep */
  struct sm_post *kids;
  int nkids;
} sm_post;

typedef struct {
  char *content;
  size_t len;
  int32_t id;
  bool special, single_word, lstrip, rstrip, normalized;
} sm_added;

/* byte trie for leftmost-longest matching of added tokens */
typedef struct {
  int32_t child, sibling, tok;
  uint8_t c;
} sm_trie_node;
typedef struct {
  sm_trie_node *nodes;
  size_t n, cap;
  int32_t root[256];
  bool any;
} sm_trie;

#define SM_CACHE_SLOTS 16384
typedef struct {
  uint64_t h;
  char *word;
  uint32_t wlen;
  int32_t *ids;
  uint32_t nids;
} sm_cache_ent;

struct smelt_tokenizer {
  /* vocab: model vocab + added tokens; id_tok[id] is what decode uses */
  int32_t n_ids;
  char **id_tok;
  uint32_t *id_len; /* borrowed: point into vkeys or added[].content */
  char **vkeys;
  size_t n_vkeys;     /* owned model vocab strings */
  uint32_t *vkey_len; /* their lengths (they may contain NUL bytes) */
  uint32_t nul_cp;    /* stand-in for NUL while parsing tokenizer.json (0: none) */
  uint8_t *id_special;
  sm_smap vocab;     /* model vocab */
  sm_smap added_map; /* added token content -> id */
  sm_pmap merges;
  /* BPE options */
  bool byte_fallback, fuse_unk, ignore_merges;
  int32_t unk_id;
  char *cont_prefix, *eow_suffix;
  size_t cont_prefix_len, eow_suffix_len;
  int32_t byte_ids[256]; /* "<0xXX>" ids for byte_fallback, -1 if absent */
  /* added tokens */
  sm_added *added;
  int n_added;
  sm_trie trie_raw, trie_norm; /* non-normalized / normalized added tokens */
  /* pipeline */
  sm_norm *normalizer;
  sm_pretok *pretok;
  sm_post *post;
  sm_decoder *decoder;
  bool uses_bytelevel;
  bool dec_bytefallback;
  /* Exact chunking of long SentencePiece-style words: a boundary "c▁" can be split when no vocab
   * token contains "c▁" (then no merge can cross it). ms_prev: those c, sorted. */
  bool ms_chunk;
  uint32_t *ms_prev;
  int n_ms_prev; /* the decoder has a ByteFallback step */ /* a ByteLevel pre-tokenizer is present */
  /* tokenizer_config */
  char *bos_token, *eos_token;
  char *chat_template; /* default */
  char **tmpl_names, **tmpl_bodies;
  int n_tmpl;
  /* word cache */
  pthread_mutex_t cache_mu;
  sm_cache_ent *cache;
};

/* byte-level alphabet */
extern char sm_bl_enc[256][3]; /* byte -> UTF-8 of its mapped char (NUL-terminated) */
extern uint8_t sm_bl_enc_len[256];
int sm_bl_dec(uint32_t cp); /* mapped char -> byte, -1 if none */
void sm_bl_init(void);

/* encode pipeline (tok_encode.c) */
smelt_status sm_tok_encode(const smelt_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                           size_t *n_ids);
/* regex helper: find next match at or after start; returns false if none */
bool sm_re_find(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, size_t start, size_t *ms, size_t *me);
void sm_pattern_free(sm_pattern *p);
/* normalize s into out (appends) */
void sm_normalize(const sm_norm *nm, const char *s, size_t n, sm_buf *out);

#endif
