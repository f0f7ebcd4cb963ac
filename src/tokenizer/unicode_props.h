/* Unicode character properties for the tokenizer, at the versions Hugging Face `tokenizers` uses
 * (tables generated into unicode_tables.c by tools/gen_unicode_tables.mjs), and the translation of
 * tokenizer.json regexes (Oniguruma syntax) into PCRE2 patterns whose character classes follow
 * those tables rather than PCRE2's built-in (older) Unicode data. */
#ifndef SM_UNICODE_PROPS_H
#define SM_UNICODE_PROPS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/strbuf.h"

/* General_Category; the order is the generator's */
enum sm_uc_gc {
  SM_GC_Cn,
  SM_GC_Lu,
  SM_GC_Ll,
  SM_GC_Lt,
  SM_GC_Lm,
  SM_GC_Lo,
  SM_GC_Mn,
  SM_GC_Mc,
  SM_GC_Me,
  SM_GC_Nd,
  SM_GC_Nl,
  SM_GC_No,
  SM_GC_Pc,
  SM_GC_Pd,
  SM_GC_Ps,
  SM_GC_Pe,
  SM_GC_Pi,
  SM_GC_Pf,
  SM_GC_Po,
  SM_GC_Sm,
  SM_GC_Sc,
  SM_GC_Sk,
  SM_GC_So,
  SM_GC_Zs,
  SM_GC_Zl,
  SM_GC_Zp,
  SM_GC_Cc,
  SM_GC_Cf,
  SM_GC_Cs,
  SM_GC_Co,
  SM_GC_COUNT
};
#define SM_UC_WHITE_SPACE 1
#define SM_UC_ALPHABETIC 2

typedef struct {
  uint32_t lo, hi;
  uint8_t gc, flags;
} sm_uc_range;
typedef struct {
  uint32_t lo, hi;
} sm_uc_pair;
extern const char sm_uc_version[], sm_uc_rust_version[];
extern const sm_uc_range sm_uc_ranges[];
extern const size_t sm_uc_nranges;
extern const sm_uc_pair sm_uc_rust_numeric[], sm_uc_rust_alphabetic[];
extern const size_t sm_uc_rust_numeric_n, sm_uc_rust_alphabetic_n;

/* regex / UCD view (Unicode sm_uc_version) */
int sm_uc_gc(uint32_t cp);         /* enum sm_uc_gc */
unsigned sm_uc_flags(uint32_t cp); /* SM_UC_WHITE_SPACE | SM_UC_ALPHABETIC */
/* Rust std view (Unicode sm_uc_rust_version) */
bool sm_uc_rust_is_numeric(uint32_t cp);
bool sm_uc_rust_is_alphanumeric(uint32_t cp);

/* Character classes the translator rewrites. Membership follows Oniguruma (and Rust's regex
 * crate, which agrees for these): \s = White_Space, \d = Nd, \w = Alphabetic | M | Nd | Pc |
 * Join_Control, \h = [0-9A-Fa-f]. */
enum {
  SM_CLS_L,
  SM_CLS_LC,
  SM_CLS_Lu,
  SM_CLS_Ll,
  SM_CLS_Lt,
  SM_CLS_Lm,
  SM_CLS_Lo,
  SM_CLS_M,
  SM_CLS_Mn,
  SM_CLS_Mc,
  SM_CLS_Me,
  SM_CLS_N,
  SM_CLS_Nd,
  SM_CLS_Nl,
  SM_CLS_No,
  SM_CLS_P,
  SM_CLS_Pc,
  SM_CLS_Pd,
  SM_CLS_Ps,
  SM_CLS_Pe,
  SM_CLS_Pi,
  SM_CLS_Pf,
  SM_CLS_Po,
  SM_CLS_S,
  SM_CLS_Sm,
  SM_CLS_Sc,
  SM_CLS_Sk,
  SM_CLS_So,
  SM_CLS_Z,
  SM_CLS_Zs,
  SM_CLS_Zl,
  SM_CLS_Zp,
  SM_CLS_C,
  SM_CLS_Cc,
  SM_CLS_Cf,
  SM_CLS_Co,
  SM_CLS_Cn,
  SM_CLS_SPACE,
  SM_CLS_WORD,
  SM_CLS_HEX,
  SM_CLS_COUNT
};
bool sm_uc_in_class(int cls, uint32_t cp);
/* the class (or its complement) as sorted, merged ranges; *out is malloc'd */
size_t sm_uc_class_ranges(int cls, bool negate, sm_uc_pair **out);

/* Translate an Oniguruma pattern for PCRE2 (compiled with PCRE2_UTF | PCRE2_UCP): each \p{..},
 * \P{..}, \s, \S, \d, \D, \w, \W, \h, \H is replaced by a class with exactly the table's members
 * (PCRE2's own property where it agrees, plus the code points it lacks; all ranges spelled out
 * where PCRE2 would match too much). Other syntax is passed through. Appends to out. */
void sm_uc_translate_regex(const char *pat, sm_buf *out);
#endif
