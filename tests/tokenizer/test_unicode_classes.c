/* Checks that every regex class the translator rewrites (unicode_props.h) matches, through PCRE2,
 * exactly the code points the generated Unicode tables give it: standalone and inside a bracket
 * class, positive and negated, over all code points. Also checks a few known properties of the
 * Unicode 16 / 17 tables against fixed facts of the standard. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include "base/strbuf.h"
#include "tokenizer/unicode_props.h"

static int fails;
#define CHECK(c, ...) \
  do { \
    if (!(c)) { \
      fails++; \
      printf("FAIL: " __VA_ARGS__); \
      printf("\n"); \
    } \
  } while (0)

static const char *names[SM_CLS_COUNT] = {"\\p{L}",  "\\p{LC}", "\\p{Lu}", "\\p{Ll}", "\\p{Lt}", "\\p{Lm}", "\\p{Lo}",
                                          "\\p{M}",  "\\p{Mn}", "\\p{Mc}", "\\p{Me}", "\\p{N}",  "\\p{Nd}", "\\p{Nl}",
                                          "\\p{No}", "\\p{P}",  "\\p{Pc}", "\\p{Pd}", "\\p{Ps}", "\\p{Pe}", "\\p{Pi}",
                                          "\\p{Pf}", "\\p{Po}", "\\p{S}",  "\\p{Sm}", "\\p{Sc}", "\\p{Sk}", "\\p{So}",
                                          "\\p{Z}",  "\\p{Zs}", "\\p{Zl}", "\\p{Zp}", "\\p{C}",  "\\p{Cc}", "\\p{Cf}",
                                          "\\p{Co}", "\\p{Cn}", "\\s",     "\\w",     "\\h"};

/* every code point but surrogates, as UTF-8, with the offset of each */
static sm_buf all;
static uint32_t *cp_at; /* byte offset -> code point start marker */

static uint8_t *member; /* membership of the class under test, from sm_uc_class_ranges */
static void load_member(int cls) {
  memset(member, 0, 0x110000);
  sm_uc_pair *v;
  size_t n = sm_uc_class_ranges(cls, false, &v);
  for (size_t i = 0; i < n; i++) memset(member + v[i].lo, 1, v[i].hi - v[i].lo + 1);
  free(v);
  /* the range walk and the per-code-point lookup must agree */
  for (uint32_t c = 0; c <= 0x10FFFF; c += 97) CHECK(member[c] == sm_uc_in_class(cls, c), "class %d at U+%04X", cls, c);
}
static void check_pattern(const char *onig, int cls, bool neg) {
  sm_buf tr = SM_BUF_INIT;
  sm_uc_translate_regex(onig, &tr);
  int err;
  PCRE2_SIZE eo;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)tr.p, tr.n, PCRE2_UTF | PCRE2_UCP, &err, &eo, NULL);
  CHECK(re, "%s does not compile", onig);
  if (!re) {
    sm_buf_free(&tr);
    return;
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  /* walk code points; each match must be the next expected member */
  size_t pos = 0, bad = 0;
  uint32_t expect = 0;
  for (;;) {
    while (expect <= 0x10FFFF && ((expect >= 0xD800 && expect <= 0xDFFF) || member[expect] == neg)) expect++;
    int rc = pcre2_match(re, (PCRE2_SPTR)all.p, all.n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc <= 0) break;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    uint32_t got = cp_at[ov[0]];
    if (got != expect) {
      if (bad++ < 3) printf("  %s: matched U+%04X, expected U+%04X next\n", onig, got, expect);
      if (got > expect) { expect = got; }
    }
    expect = got + 1;
    pos = ov[1];
  }
  while (expect <= 0x10FFFF && ((expect >= 0xD800 && expect <= 0xDFFF) || member[expect] == neg)) expect++;
  CHECK(!bad && expect > 0x10FFFF, "%s (translated to %zu bytes) differs from the table", onig, tr.n);
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  sm_buf_free(&tr);
}

int main(void) {
  cp_at = malloc(4 * 0x110000 * sizeof *cp_at);
  for (uint32_t c = 0; c <= 0x10FFFF; c++) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    size_t at = all.n;
    sm_buf_put_cp(&all, c);
    for (size_t k = at; k < all.n; k++) cp_at[k] = c;
  }
  /* fixed facts of Unicode 16 (regexes) and 17 (Rust std) */
  CHECK(!strcmp(sm_uc_version, "16.0.0") && !strcmp(sm_uc_rust_version, "17.0.0"), "table versions");
  CHECK(sm_uc_gc(0x1FAE9) == SM_GC_So, "U+1FAE9 FACE WITH BAGS UNDER EYES is So (16.0)");
  CHECK(sm_uc_gc(0x1FAEA) == SM_GC_Cn, "U+1FAEA is unassigned in 16.0");
  CHECK(sm_uc_gc(0x10D40) == SM_GC_Nd && sm_uc_gc(0x11F50) == SM_GC_Nd, "Garay and Kawi digits are Nd");
  CHECK(sm_uc_rust_is_numeric(0x11DE0) && !sm_uc_in_class(SM_CLS_N, 0x11DE0),
        "Tolong Siki digit: numeric in 17, not in 16");
  CHECK(sm_uc_in_class(SM_CLS_SPACE, 0x3000) && !sm_uc_in_class(SM_CLS_SPACE, 0x180E) &&
          !sm_uc_in_class(SM_CLS_SPACE, 0x200B),
        "White_Space");
  CHECK(sm_uc_in_class(SM_CLS_WORD, 0x200D) && sm_uc_in_class(SM_CLS_WORD, 0x5F) && !sm_uc_in_class(SM_CLS_WORD, 0x2D),
        "\\w has Join_Control and Pc");
  member = malloc(0x110000);
  for (int c = 0; c < SM_CLS_COUNT; c++) {
    char p[64];
    load_member(c);
    check_pattern(names[c], c, false);
    snprintf(p, sizeof p, "[%s]", names[c]);
    check_pattern(p, c, false);
    if (names[c][1] == 'p') snprintf(p, sizeof p, "\\P%s", names[c] + 2);
    else snprintf(p, sizeof p, "\\%c", names[c][1] - 32);
    check_pattern(p, c, true);
    char q[70];
    /* a negated class inside brackets is spelled out in full (slow to scan): a few suffice */
    if (c == SM_CLS_L || c == SM_CLS_N || c == SM_CLS_SPACE || c == SM_CLS_Cn) {
      snprintf(q, sizeof q, "[%s]", p);
      check_pattern(q, c, true);
    }
    snprintf(q, sizeof q, "[^%s]", names[c]);
    check_pattern(q, c, true);
  }
  sm_buf_free(&all);
  free(cp_at);
  free(member);
  printf("%s: %d classes in 4 or 5 forms\n", fails ? "FAIL" : "ok", SM_CLS_COUNT);
  return fails ? 1 : 0;
}
