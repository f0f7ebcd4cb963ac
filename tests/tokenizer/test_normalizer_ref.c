/* Compares smelt's normalizers (unicode_norm.c) with HF tokenizers' on every code point and on the
 * ordering/composition sequences of gen_norm_reference.mjs, and its punctuation test with the one of
 * HF's Punctuation pre-tokenizer.
 * usage: test_normalizer_ref <norm.json>   exit 0 only if everything is identical. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/base.h"
#include "tokenizer/unicode_norm.h"

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
static void unhex(const char *h, sm_buf *o) {
  sm_buf_clear(o);
  for (size_t i = 0; h[i] && h[i + 1]; i += 2) sm_buf_putc(o, (char)(hexval(h[i]) << 4 | hexval(h[i + 1])));
}
static void run(const char *form, const char *s, size_t n, sm_buf *out) {
  sm_buf_clear(out);
  if (!strcmp(form, "NFC")) sm_unorm(SM_NFC, s, n, out);
  else if (!strcmp(form, "NFD")) sm_unorm(SM_NFD, s, n, out);
  else if (!strcmp(form, "NFKC")) sm_unorm(SM_NFKC, s, n, out);
  else if (!strcmp(form, "NFKD")) sm_unorm(SM_NFKD, s, n, out);
  else if (!strcmp(form, "Lowercase")) sm_unorm_lowercase(s, n, out);
  else sm_unorm_strip_accents(s, n, out);
}
static void show(const char *what, const char *form, const sm_buf *in, const sm_buf *want, const sm_buf *got) {
  printf("%s %s: in", form, what);
  for (size_t i = 0; i < in->n && i < 40; i++) printf(" %02x", (unsigned char)in->p[i]);
  printf("\n  want");
  for (size_t i = 0; i < want->n && i < 40; i++) printf(" %02x", (unsigned char)want->p[i]);
  printf("\n  got ");
  for (size_t i = 0; i < got->n && i < 40; i++) printf(" %02x", (unsigned char)got->p[i]);
  printf("\n");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s norm.json\n", argv[0]);
    return 2;
  }
  char *buf;
  size_t len;
  if (sm_read_file(argv[1], &buf, &len)) {
    fprintf(stderr, "%s\n", sm_errmsg());
    return 1;
  }
  cJSON *root = cJSON_ParseWithLength(buf, len);
  free(buf);
  if (!root) {
    fprintf(stderr, "bad json %s\n", argv[1]);
    return 1;
  }
  int fails = 0, forms = 0;
  sm_buf in = {0}, want = {0}, got = {0};
  unsigned char *changed = malloc(0x110000);
  const cJSON *fj = cJSON_GetObjectItem(root, "forms");
  for (const cJSON *f = fj ? fj->child : NULL; f; f = f->next) {
    const char *form = f->string;
    forms++;
    memset(changed, 0, 0x110000);
    int bad = 0, nseq = 0, ncp = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(f, "cps")) {
      uint32_t cp = (uint32_t)cJSON_GetArrayItem(e, 0)->valuedouble;
      changed[cp] = 1;
      sm_buf_clear(&in);
      sm_buf_put_cp(&in, cp);
      unhex(cJSON_GetArrayItem(e, 1)->valuestring, &want);
      run(form, in.p, in.n, &got);
      if (got.n != want.n || memcmp(got.p, want.p, got.n)) {
        if (bad++ < 8) show("code point", form, &in, &want, &got);
      }
    }
    for (uint32_t cp = 0; cp < 0x110000; cp++) { /* every other code point maps to itself */
      if ((cp >= 0xD800 && cp < 0xE000) || changed[cp]) continue;
      ncp++;
      sm_buf_clear(&in);
      sm_buf_put_cp(&in, cp);
      run(form, in.p, in.n, &got);
      if (got.n != in.n || memcmp(got.p, in.p, in.n)) {
        if (bad++ < 8) show("code point (identity)", form, &in, &in, &got);
      }
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(f, "seqs")) {
      unhex(cJSON_GetArrayItem(e, 0)->valuestring, &in);
      unhex(cJSON_GetArrayItem(e, 1)->valuestring, &want);
      run(form, in.p, in.n, &got);
      nseq++;
      if (got.n != want.n || memcmp(got.p, want.p, got.n)) {
        if (bad++ < 8) show("sequence", form, &in, &want, &got);
      }
    }
    printf("%-13s %s (%d code points changed, %d unchanged, %d sequences)\n", form, bad ? "DIFFERS" : "identical",
           cJSON_GetArraySize(cJSON_GetObjectItem(f, "cps")), ncp, nseq);
    fails += bad;
  }
  memset(changed, 0, 0x110000);
  const cJSON *e;
  int npunct = 0, pbad = 0;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "punctuation")) changed[(uint32_t)e->valuedouble] = 1, npunct++;
  for (uint32_t cp = 0; cp < 0x110000; cp++) {
    if ((cp >= 0xD800 && cp < 0xE000) || cp == 'x') continue;
    if (sm_hf_is_punctuation(cp) != (changed[cp] != 0) && pbad++ < 8)
      printf("Punctuation: U+%04X is%s punctuation for HF\n", cp, changed[cp] ? "" : " not");
  }
  printf("%-13s %s (%d punctuation code points)\n", "Punctuation", pbad ? "DIFFERS" : "identical", npunct);
  if (npunct < 500) printf("Punctuation: too few code points in the reference\n"), pbad++;
  fails += pbad;
  free(changed);
  sm_buf_free(&in), sm_buf_free(&want), sm_buf_free(&got);
  cJSON_Delete(root);
  if (forms != 6) {
    printf("expected 6 normalizers, got %d\n", forms);
    return 1;
  }
  printf("%s: %d mismatches\n", fails ? "FAIL" : "ok", fails);
  return fails ? 1 : 0;
}
