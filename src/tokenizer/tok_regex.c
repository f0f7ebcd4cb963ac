/* Translation of tokenizer.json regexes (Oniguruma syntax, as Hugging Face `tokenizers` runs them)
 * into PCRE2 patterns whose Unicode classes follow unicode_tables.c instead of PCRE2's built-in
 * tables (Unicode 14 in PCRE2 10.42). See unicode_props.h.
 *
 * For each class the first use in a process measures, with PCRE2 itself, how its own class A
 * differs from the table's class B: the code points of B that A lacks (scanning all of B with
 * the negated class) and whether A has any the table excludes (scanning every assigned code point
 * outside B). When A is a subset of B, the class is written as PCRE2's own escape plus the
 * missing code points, which keeps matching as fast as before; otherwise all of B's ranges are
 * written out. Either way the class has exactly B's members, whatever PCRE2 version is linked. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base.h"
#include "tokenizer/unicode_props.h"

typedef struct {
  bool done, explicit_; /* explicit_: spell out all of B */
  sm_uc_pair *add;      /* B minus A (when !explicit_) */
  size_t nadd;
  sm_uc_pair *all, *neg; /* B and its complement (built on demand) */
  size_t nall, nneg;
} cls_info;

static cls_info infos[SM_CLS_COUNT];
static pthread_mutex_t info_mu = PTHREAD_MUTEX_INITIALIZER;

/* PCRE2's spelling of each class (NULL: none, always spelled out) */
static const char *pcre_name(int cls) {
  static const char *n[SM_CLS_COUNT] = {
    [SM_CLS_L] = "\\p{L}",   [SM_CLS_LC] = "\\p{L&}", [SM_CLS_Lu] = "\\p{Lu}", [SM_CLS_Ll] = "\\p{Ll}",
    [SM_CLS_Lt] = "\\p{Lt}", [SM_CLS_Lm] = "\\p{Lm}", [SM_CLS_Lo] = "\\p{Lo}", [SM_CLS_M] = "\\p{M}",
    [SM_CLS_Mn] = "\\p{Mn}", [SM_CLS_Mc] = "\\p{Mc}", [SM_CLS_Me] = "\\p{Me}", [SM_CLS_N] = "\\p{N}",
    [SM_CLS_Nd] = "\\p{Nd}", [SM_CLS_Nl] = "\\p{Nl}", [SM_CLS_No] = "\\p{No}", [SM_CLS_P] = "\\p{P}",
    [SM_CLS_Pc] = "\\p{Pc}", [SM_CLS_Pd] = "\\p{Pd}", [SM_CLS_Ps] = "\\p{Ps}", [SM_CLS_Pe] = "\\p{Pe}",
    [SM_CLS_Pi] = "\\p{Pi}", [SM_CLS_Pf] = "\\p{Pf}", [SM_CLS_Po] = "\\p{Po}", [SM_CLS_S] = "\\p{S}",
    [SM_CLS_Sm] = "\\p{Sm}", [SM_CLS_Sc] = "\\p{Sc}", [SM_CLS_Sk] = "\\p{Sk}", [SM_CLS_So] = "\\p{So}",
    [SM_CLS_Z] = "\\p{Z}",   [SM_CLS_Zs] = "\\p{Zs}", [SM_CLS_Zl] = "\\p{Zl}", [SM_CLS_Zp] = "\\p{Zp}",
    [SM_CLS_Cc] = "\\p{Cc}", [SM_CLS_Cf] = "\\p{Cf}", [SM_CLS_Co] = "\\p{Co}", [SM_CLS_SPACE] = "\\s",
    [SM_CLS_WORD] = "\\w",
  };
  return n[cls];
}
/* the negation of pcre_name(cls), as a standalone class */
static void pcre_negated(int cls, char *buf, size_t n) {
  const char *p = pcre_name(cls);
  if (p[1] == 'p') snprintf(buf, n, "\\P%s", p + 2);
  else snprintf(buf, n, "\\%c", p[1] == 's' ? 'S' : 'W');
}

/* code points of [lo, hi] ranges (surrogates skipped) as UTF-8 */
static void text_of(const sm_uc_pair *v, size_t n, sm_buf *b) {
  for (size_t i = 0; i < n; i++)
    for (uint32_t c = v[i].lo;; c++) {
      if (c < 0xD800 || c > 0xDFFF) sm_buf_put_cp(b, c);
      if (c == v[i].hi) break;
    }
}

/* code points of text matched by pattern (each match is one character) */
static size_t scan(const char *pat, const sm_buf *text, sm_uc_pair **out) {
  int err;
  PCRE2_SIZE eo;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &eo, NULL);
  *out = NULL;
  if (!re) return SIZE_MAX; /* cannot happen for the escapes used here; the caller spells classes out */
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  sm_uc_pair *v = NULL;
  size_t n = 0, cap = 0, pos = 0;
  while (pos < text->n && pcre2_match(re, (PCRE2_SPTR)text->p, text->n, pos, PCRE2_NO_UTF_CHECK, md, NULL) > 0) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    const unsigned char *s = (const unsigned char *)text->p + ov[0];
    uint32_t c = s[0] < 0x80 ? s[0]
               : s[0] < 0xE0 ? ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F)
               : s[0] < 0xF0 ? ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F)
                             : ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                                 ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    if (n && v[n - 1].hi + 1 == c) v[n - 1].hi = c;
    else {
      if (n == cap) cap = cap ? cap * 2 : 64, v = sm_xrealloc(v, cap * sizeof *v);
      v[n++] = (sm_uc_pair){c, c};
    }
    pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
  }
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  *out = v;
  return n;
}

static cls_info *info(int cls) {
  pthread_mutex_lock(&info_mu);
  cls_info *ci = &infos[cls];
  if (!ci->done) {
    ci->nall = sm_uc_class_ranges(cls, false, &ci->all);
    ci->nneg = sm_uc_class_ranges(cls, true, &ci->neg);
    const char *pn = pcre_name(cls);
    ci->explicit_ = true;
    if (pn) {
      /* does PCRE2 match any assigned code point outside B? (ASCII counts as assigned) */
      sm_uc_pair *assigned_out = NULL;
      size_t na = 0, cap = 0, j = 0;
      for (size_t i = 0; i < ci->nneg; i++) {
        const sm_uc_pair g = ci->neg[i];
        while (j < sm_uc_nranges && sm_uc_ranges[j].hi < g.lo) j++;
        for (size_t k = j; k < sm_uc_nranges && sm_uc_ranges[k].lo <= g.hi; k++) {
          uint32_t lo = SM_MAX(g.lo, sm_uc_ranges[k].lo), hi = SM_MIN(g.hi, sm_uc_ranges[k].hi);
          if (na == cap)
            cap = cap ? cap * 2 : 256, assigned_out = sm_xrealloc(assigned_out, cap * sizeof *assigned_out);
          assigned_out[na++] = (sm_uc_pair){lo, hi};
        }
      }
      sm_buf t = SM_BUF_INIT;
      text_of(assigned_out, na, &t);
      free(assigned_out);
      sm_uc_pair *extra = NULL;
      size_t nextra = scan(pn, &t, &extra);
      free(extra);
      sm_buf_clear(&t);
      if (!nextra) {
        char negp[16];
        pcre_negated(cls, negp, sizeof negp);
        text_of(ci->all, ci->nall, &t);
        ci->nadd = scan(negp, &t, &ci->add);
        ci->explicit_ = ci->nadd == SIZE_MAX;
        if (ci->explicit_) ci->nadd = 0;
      }
      sm_buf_free(&t);
    }
    ci->done = true;
  }
  pthread_mutex_unlock(&info_mu);
  return ci;
}

static void put_range(sm_buf *b, uint32_t lo, uint32_t hi) {
  if (lo == hi) sm_buf_printf(b, "\\x{%X}", lo);
  else sm_buf_printf(b, "\\x{%X}-\\x{%X}", lo, hi);
}
/* surrogates cannot occur in UTF-8 text, and PCRE2 rejects them in a UTF pattern */
static void put_ranges(sm_buf *b, const sm_uc_pair *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (v[i].lo < 0xD800 || v[i].lo > 0xDFFF)
      put_range(b, v[i].lo, v[i].hi < 0xD800 || v[i].lo > 0xDFFF ? v[i].hi : 0xD7FF);
    if (v[i].hi > 0xDFFF && v[i].lo <= 0xDFFF) put_range(b, 0xE000, v[i].hi);
  }
}

static void emit_class(sm_buf *b, int cls, bool neg, bool in_class) {
  cls_info *ci = info(cls);
  if (in_class) {
    if (neg) put_ranges(b, ci->neg, ci->nneg);
    else if (ci->explicit_) put_ranges(b, ci->all, ci->nall);
    else sm_buf_puts(b, pcre_name(cls)), put_ranges(b, ci->add, ci->nadd);
    return;
  }
  sm_buf_puts(b, neg ? "[^" : "[");
  if (ci->explicit_) put_ranges(b, ci->all, ci->nall);
  else sm_buf_puts(b, pcre_name(cls)), put_ranges(b, ci->add, ci->nadd);
  sm_buf_putc(b, ']');
}

/* Oniguruma property name -> class, or -1 (loose matching: case, spaces, '_' and '-' ignored) */
static int class_of_name(const char *s, size_t n) {
  char k[40];
  size_t m = 0;
  for (size_t i = 0; i < n && m + 1 < sizeof k; i++) {
    char c = s[i];
    if (c == ' ' || c == '_' || c == '-') continue;
    k[m++] = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
  }
  k[m] = 0;
  static const struct {
    const char *a, *b;
    int cls;
  } T[] = {
    {"l", "letter", SM_CLS_L},
    {"lc", "casedletter", SM_CLS_LC},
    {"l&", "", SM_CLS_LC},
    {"lu", "uppercaseletter", SM_CLS_Lu},
    {"ll", "lowercaseletter", SM_CLS_Ll},
    {"lt", "titlecaseletter", SM_CLS_Lt},
    {"lm", "modifierletter", SM_CLS_Lm},
    {"lo", "otherletter", SM_CLS_Lo},
    {"m", "mark", SM_CLS_M},
    {"mn", "nonspacingmark", SM_CLS_Mn},
    {"mc", "spacingmark", SM_CLS_Mc},
    {"me", "enclosingmark", SM_CLS_Me},
    {"n", "number", SM_CLS_N},
    {"nd", "decimalnumber", SM_CLS_Nd},
    {"nl", "letternumber", SM_CLS_Nl},
    {"no", "othernumber", SM_CLS_No},
    {"p", "punctuation", SM_CLS_P},
    {"pc", "connectorpunctuation", SM_CLS_Pc},
    {"pd", "dashpunctuation", SM_CLS_Pd},
    {"ps", "openpunctuation", SM_CLS_Ps},
    {"pe", "closepunctuation", SM_CLS_Pe},
    {"pi", "initialpunctuation", SM_CLS_Pi},
    {"pf", "finalpunctuation", SM_CLS_Pf},
    {"po", "otherpunctuation", SM_CLS_Po},
    {"s", "symbol", SM_CLS_S},
    {"sm", "mathsymbol", SM_CLS_Sm},
    {"sc", "currencysymbol", SM_CLS_Sc},
    {"sk", "modifiersymbol", SM_CLS_Sk},
    {"so", "othersymbol", SM_CLS_So},
    {"z", "separator", SM_CLS_Z},
    {"zs", "spaceseparator", SM_CLS_Zs},
    {"zl", "lineseparator", SM_CLS_Zl},
    {"zp", "paragraphseparator", SM_CLS_Zp},
    {"c", "other", SM_CLS_C},
    {"cc", "control", SM_CLS_Cc},
    {"cf", "format", SM_CLS_Cf},
    {"co", "privateuse", SM_CLS_Co},
    {"cn", "unassigned", SM_CLS_Cn},
    {"whitespace", "space", SM_CLS_SPACE},
    {"word", "", SM_CLS_WORD},
  };
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
    if (!strcmp(k, T[i].a) || (T[i].b[0] && !strcmp(k, T[i].b))) return T[i].cls;
  return -1;
}

void sm_uc_translate_regex(const char *pat, sm_buf *out) {
  size_t n = strlen(pat);
  bool in_class = false;
  for (size_t i = 0; i < n;) {
    char c = pat[i];
    if (c == '\\' && i + 1 < n) {
      char e = pat[i + 1];
      int cls = -1;
      bool neg = false;
      size_t len = 2;
      if (e == 'p' || e == 'P') {
        neg = e == 'P';
        const char *nm = pat + i + 2;
        size_t nl = 0;
        if (i + 2 < n && pat[i + 2] == '{') {
          const char *close = memchr(pat + i + 3, '}', n - (i + 3));
          if (close) {
            nm = pat + i + 3;
            nl = (size_t)(close - nm);
            len = (size_t)(close - (pat + i)) + 1;
            if (nl && nm[0] == '^') neg = !neg, nm++, nl--;
          }
        } else if (i + 2 < n) {
          nl = 1;
          len = 3;
        }
        if (nl) cls = class_of_name(nm, nl);
      } else if (strchr("sSdDwWhH", e)) {
        cls = (e | 0x20) == 's' ? SM_CLS_SPACE
            : (e | 0x20) == 'd' ? SM_CLS_Nd
            : (e | 0x20) == 'w' ? SM_CLS_WORD
                                : SM_CLS_HEX;
        neg = e >= 'A' && e <= 'Z';
      }
      if (cls >= 0) {
        emit_class(out, cls, neg, in_class);
        i += len;
        continue;
      }
      /* any other escape: copy it with the (whole UTF-8) character it escapes */
      size_t l = 2;
      while (i + l < n && ((unsigned char)pat[i + l] & 0xC0) == 0x80) l++;
      sm_buf_put(out, pat + i, l);
      i += l;
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < n && pat[i + 1] == ':') { /* POSIX bracket [:name:] */
        const char *end = strstr(pat + i + 2, ":]");
        size_t l = end ? (size_t)(end - (pat + i)) + 2 : 1;
        sm_buf_put(out, pat + i, l);
        i += l;
        continue;
      }
      if (c == ']') in_class = false;
      sm_buf_putc(out, c);
      i++;
      continue;
    }
    if (c == '[') {
      in_class = true;
      sm_buf_putc(out, c);
      i++;
      if (i < n && pat[i] == '^') sm_buf_putc(out, '^'), i++;
      if (i < n && pat[i] == ']') sm_buf_putc(out, ']'), i++; /* a leading ']' is literal */
      continue;
    }
    sm_buf_putc(out, c);
    i++;
  }
}
