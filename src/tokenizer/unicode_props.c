/* Lookups in the generated Unicode tables (unicode_tables.c) and class membership; see
 * unicode_props.h. Hand-written because the tokenizer must follow the exact Unicode versions of
 * Hugging Face `tokenizers` (16.0 for its regexes, 17.0 for Rust's char methods), which neither
 * utf8proc nor PCRE2 as packaged by Debian provide. */
#include "tokenizer/unicode_props.h"
#include "base/base.h"

static const sm_uc_range *find_range(uint32_t cp) {
  size_t lo = 0, hi = sm_uc_nranges;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (sm_uc_ranges[mid].hi < cp) lo = mid + 1;
    else hi = mid;
  }
  return lo < sm_uc_nranges && sm_uc_ranges[lo].lo <= cp ? &sm_uc_ranges[lo] : NULL;
}
int sm_uc_gc(uint32_t cp) {
  const sm_uc_range *r = find_range(cp);
  return r ? r->gc : SM_GC_Cn;
}
unsigned sm_uc_flags(uint32_t cp) {
  const sm_uc_range *r = find_range(cp);
  return r ? r->flags : 0;
}
static bool in_pairs(const sm_uc_pair *p, size_t n, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p[mid].hi < cp) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && p[lo].lo <= cp;
}
bool sm_uc_rust_is_numeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_pairs(sm_uc_rust_numeric, sm_uc_rust_numeric_n, cp);
}
bool sm_uc_rust_is_alphanumeric(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  return in_pairs(sm_uc_rust_alphabetic, sm_uc_rust_alphabetic_n, cp) ||
         in_pairs(sm_uc_rust_numeric, sm_uc_rust_numeric_n, cp);
}

/* membership from a code point's category and flags (the same for every code point of a range) */
static bool member(int cls, int gc, unsigned fl, uint32_t cp) {
  switch (cls) {
    case SM_CLS_L: return gc >= SM_GC_Lu && gc <= SM_GC_Lo;
    case SM_CLS_LC: return gc >= SM_GC_Lu && gc <= SM_GC_Lt;
    case SM_CLS_Lu: return gc == SM_GC_Lu;
    case SM_CLS_Ll: return gc == SM_GC_Ll;
    case SM_CLS_Lt: return gc == SM_GC_Lt;
    case SM_CLS_Lm: return gc == SM_GC_Lm;
    case SM_CLS_Lo: return gc == SM_GC_Lo;
    case SM_CLS_M: return gc >= SM_GC_Mn && gc <= SM_GC_Me;
    case SM_CLS_Mn: return gc == SM_GC_Mn;
    case SM_CLS_Mc: return gc == SM_GC_Mc;
    case SM_CLS_Me: return gc == SM_GC_Me;
    case SM_CLS_N: return gc >= SM_GC_Nd && gc <= SM_GC_No;
    case SM_CLS_Nd: return gc == SM_GC_Nd;
    case SM_CLS_Nl: return gc == SM_GC_Nl;
    case SM_CLS_No: return gc == SM_GC_No;
    case SM_CLS_P: return gc >= SM_GC_Pc && gc <= SM_GC_Po;
    case SM_CLS_Pc: return gc == SM_GC_Pc;
    case SM_CLS_Pd: return gc == SM_GC_Pd;
    case SM_CLS_Ps: return gc == SM_GC_Ps;
    case SM_CLS_Pe: return gc == SM_GC_Pe;
    case SM_CLS_Pi: return gc == SM_GC_Pi;
    case SM_CLS_Pf: return gc == SM_GC_Pf;
    case SM_CLS_Po: return gc == SM_GC_Po;
    case SM_CLS_S: return gc >= SM_GC_Sm && gc <= SM_GC_So;
    case SM_CLS_Sm: return gc == SM_GC_Sm;
    case SM_CLS_Sc: return gc == SM_GC_Sc;
    case SM_CLS_Sk: return gc == SM_GC_Sk;
    case SM_CLS_So: return gc == SM_GC_So;
    case SM_CLS_Z: return gc >= SM_GC_Zs && gc <= SM_GC_Zp;
    case SM_CLS_Zs: return gc == SM_GC_Zs;
    case SM_CLS_Zl: return gc == SM_GC_Zl;
    case SM_CLS_Zp: return gc == SM_GC_Zp;
    case SM_CLS_C: return gc == SM_GC_Cn || gc >= SM_GC_Cc;
    case SM_CLS_Cc: return gc == SM_GC_Cc;
    case SM_CLS_Cf: return gc == SM_GC_Cf;
    case SM_CLS_Co: return gc == SM_GC_Co;
    case SM_CLS_Cn: return gc == SM_GC_Cn;
    case SM_CLS_SPACE: return (fl & SM_UC_WHITE_SPACE) != 0;
    case SM_CLS_WORD:
      return (fl & SM_UC_ALPHABETIC) || (gc >= SM_GC_Mn && gc <= SM_GC_Me) || gc == SM_GC_Nd || gc == SM_GC_Pc ||
             cp == 0x200C || cp == 0x200D;
    case SM_CLS_HEX: return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'f');
  }
  return false;
}
bool sm_uc_in_class(int cls, uint32_t cp) {
  const sm_uc_range *r = find_range(cp);
  return r ? member(cls, r->gc, r->flags, cp) : member(cls, SM_GC_Cn, 0, cp);
}

static void push_pair(sm_uc_pair **v, size_t *n, size_t *cap, uint32_t lo, uint32_t hi) {
  if (*n && (*v)[*n - 1].hi + 1 == lo) {
    (*v)[*n - 1].hi = hi;
    return;
  }
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 256;
    *v = sm_xrealloc(*v, *cap * sizeof **v);
  }
  (*v)[(*n)++] = (sm_uc_pair){lo, hi};
}
/* the members of a uniform stretch [lo, hi] (one category, one set of flags) */
static void add_stretch(int cls, bool neg, int gc, unsigned fl, uint32_t lo, uint32_t hi, sm_uc_pair **v, size_t *n,
                        size_t *cap) {
  bool per_cp = (cls == SM_CLS_WORD || cls == SM_CLS_HEX) && (lo < 0x80 || (lo <= 0x200D && hi >= 0x200C));
  if (!per_cp) {
    if (member(cls, gc, fl, lo) != neg) push_pair(v, n, cap, lo, hi);
    return;
  }
  for (uint32_t c = lo;; c++) {
    if (member(cls, gc, fl, c) != neg) push_pair(v, n, cap, c, c);
    if (c == hi) break;
  }
}
size_t sm_uc_class_ranges(int cls, bool negate, sm_uc_pair **out) {
  sm_uc_pair *v = NULL;
  size_t n = 0, cap = 0;
  uint32_t next = 0;
  for (size_t i = 0; i < sm_uc_nranges; i++) {
    const sm_uc_range *r = &sm_uc_ranges[i];
    if (r->lo > next) add_stretch(cls, negate, SM_GC_Cn, 0, next, r->lo - 1, &v, &n, &cap);
    add_stretch(cls, negate, r->gc, r->flags, r->lo, r->hi, &v, &n, &cap);
    next = r->hi + 1;
  }
  if (next <= 0x10FFFF) add_stretch(cls, negate, SM_GC_Cn, 0, next, 0x10FFFF, &v, &n, &cap);
  *out = v;
  return n;
}
