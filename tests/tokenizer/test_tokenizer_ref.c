/* Compares smelt's tokenizer with reference outputs of HF tokenizers (written by gen_reference.mjs).
 * usage: test_tokenizer_ref <ref.json>...   exit 0 only if everything is identical. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "base/base.h"
#include "tokenizer/tokenizer.h"

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
static char *unhex(const char *h, size_t *n) {
  size_t l = strlen(h) / 2;
  char *o = malloc(l + 1);
  for (size_t i = 0; i < l; i++) o[i] = (char)(hexval(h[2 * i]) << 4 | hexval(h[2 * i + 1]));
  o[l] = 0;
  *n = l;
  return o;
}
static int32_t *ids_of(const cJSON *a, size_t *n) {
  *n = (size_t)cJSON_GetArraySize(a);
  int32_t *v = malloc((*n + 1) * sizeof(int32_t));
  size_t i = 0;
  const cJSON *x;
  cJSON_ArrayForEach(x, a) v[i++] = (int32_t)x->valuedouble;
  return v;
}
static void print_esc(const char *s, size_t n) {
  for (size_t i = 0; i < n && i < 200; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
    else putchar(c);
  }
}
static void print_ids(const int32_t *v, size_t n) {
  for (size_t i = 0; i < n && i < 40; i++) printf("%d ", v[i]);
  if (n > 40) printf("...(%zu)", n);
}
static int shown;

/* streaming detok over ids must concatenate to `full` and be valid UTF-8 at each step */
static bool check_stream(const smelt_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *full,
                         size_t flen) {
  sm_detok *d = sm_detok_new(t, skip);
  char *acc = malloc(1);
  size_t al = 0;
  bool ok = true;
  for (size_t i = 0; i <= n; i++) {
    char *piece = NULL;
    size_t pl = i < n ? sm_detok_push(d, ids[i], &piece) : sm_detok_flush(d, &piece);
    /* each piece must be valid UTF-8 on its own */
    for (size_t k = 0; k < pl;) {
      unsigned char c = (unsigned char)piece[k];
      size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      if (c >= 0x80 && c < 0xC0) {
        ok = false;
        break;
      }
      if (k + l > pl) {
        ok = false;
        break;
      }
      for (size_t j = 1; j < l; j++)
        if (((unsigned char)piece[k + j] & 0xC0) != 0x80) ok = false;
      k += l;
    }
    acc = realloc(acc, al + pl + 1);
    memcpy(acc + al, piece, pl);
    al += pl;
    free(piece);
  }
  sm_detok_free(d);
  if (al != flen || memcmp(acc, full, al)) ok = false;
  if (!ok && shown++ < 12) {
    printf("STREAM MISMATCH skip=%d ids=", skip);
    print_ids(ids, n);
    printf("\n  full: \"");
    print_esc(full, flen);
    printf("\"\n  strm: \"");
    print_esc(acc, al);
    printf("\"\n");
  }
  free(acc);
  return ok;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s ref.json...\n", argv[0]);
    return 2;
  }
  int total_fail = 0;
  for (int f = 1; f < argc; f++) {
    char *buf;
    size_t len;
    if (sm_read_file(argv[f], &buf, &len)) {
      fprintf(stderr, "%s\n", sm_errmsg());
      return 1;
    }
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!root) {
      fprintf(stderr, "bad json %s\n", argv[f]);
      return 1;
    }
    const char *name = cJSON_GetObjectItem(root, "name")->valuestring;
    const char *dir = cJSON_GetObjectItem(root, "model_dir")->valuestring;
    smelt_tokenizer *t;
    double t0 = sm_now();
    if (smelt_tokenizer_load(dir, &t)) {
      fprintf(stderr, "%s: load failed: %s\n", name, smelt_last_error());
      return 1;
    }
    double tl = sm_now() - t0;
    int n = 0, enc_ok = 0, encns_ok = 0, dec_ok = 0, decs_ok = 0, str_ok = 0, nd = 0, dd_ok = 0, dstr_ok = 0;
    shown = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
      size_t tl2, nr, nrns, n1, n0;
      char *text = unhex(cJSON_GetObjectItem(c, "t")->valuestring, &tl2);
      int32_t *ref = ids_of(cJSON_GetObjectItem(c, "ids"), &nr);
      int32_t *refns = ids_of(cJSON_GetObjectItem(c, "ids_ns"), &nrns);
      int32_t *got1 = NULL, *got0 = NULL;
      n++;
      if (smelt_tokenize(t, text, tl2, true, &got1, &n1) == SMELT_OK && n1 == nr && !memcmp(got1, ref, nr * 4))
        enc_ok++;
      else if (shown++ < 8) {
        printf("[%s] ENCODE MISMATCH text=\"", name);
        print_esc(text, tl2);
        printf("\"\n  ref: ");
        print_ids(ref, nr);
        printf("\n  got: ");
        if (got1) print_ids(got1, n1);
        printf("\n");
        if (got1) { /* first difference, decoded */
          size_t k = 0;
          while (k < nr && k < n1 && ref[k] == got1[k]) k++;
          size_t k0 = k > 2 ? k - 2 : 0;
          char *a = NULL, *b = NULL;
          size_t al = 0, bl = 0;
          sm_tok_decode(t, ref + k0, (nr - k0) < 8 ? nr - k0 : 8, false, &a, &al);
          sm_tok_decode(t, got1 + k0, (n1 - k0) < 8 ? n1 - k0 : 8, false, &b, &bl);
          printf("  at %zu: ref \"", k);
          print_esc(a, al);
          printf("\"  got \"");
          print_esc(b, bl);
          printf("\"\n");
          free(a);
          free(b);
        }
      }
      if (smelt_tokenize(t, text, tl2, false, &got0, &n0) == SMELT_OK && n0 == nrns && !memcmp(got0, refns, nrns * 4))
        encns_ok++;
      for (int skip = 0; skip < 2; skip++) {
        size_t dl;
        char *dref = unhex(cJSON_GetObjectItem(c, skip ? "dec_skip" : "dec")->valuestring, &dl);
        char *got = NULL;
        size_t gl = 0;
        sm_tok_decode(t, ref, nr, skip, &got, &gl);
        bool ok = got && gl == dl && !memcmp(got, dref, dl);
        if (ok) {
          if (skip) decs_ok++;
          else dec_ok++;
        } else if (shown++ < 8) {
          printf("[%s] DECODE(skip=%d) MISMATCH ids=", name, skip);
          print_ids(ref, nr);
          printf("\n  ref: \"");
          print_esc(dref, dl);
          printf("\"\n  got: \"");
          if (got) print_esc(got, gl);
          printf("\"\n");
        }
        if (!skip && check_stream(t, ref, nr, false, dref, dl)) str_ok++;
        free(dref);
        free(got);
      }
      free(text);
      free(ref);
      free(refns);
      free(got1);
      free(got0);
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "dec_cases")) {
      size_t nr;
      int32_t *ids = ids_of(cJSON_GetObjectItem(c, "ids"), &nr);
      bool all = true;
      nd++;
      for (int skip = 0; skip < 2; skip++) {
        size_t dl;
        char *dref = unhex(cJSON_GetObjectItem(c, skip ? "dec_skip" : "dec")->valuestring, &dl);
        char *got = NULL;
        size_t gl = 0;
        sm_tok_decode(t, ids, nr, skip, &got, &gl);
        if (!(got && gl == dl && !memcmp(got, dref, dl))) {
          all = false;
          if (shown++ < 12) {
            printf("[%s] RANDOM DECODE(skip=%d) MISMATCH ids=", name, skip);
            print_ids(ids, nr);
            printf("\n  ref: \"");
            print_esc(dref, dl);
            printf("\"\n  got: \"");
            if (got) print_esc(got, gl);
            printf("\"\n");
          }
        }
        if (check_stream(t, ids, nr, skip, dref, dl)) dstr_ok++;
        free(dref);
        free(got);
      }
      if (all) dd_ok++;
      free(ids);
    }
    int fails = (n - enc_ok) + (n - encns_ok) + (n - dec_ok) + (n - decs_ok) + (n - str_ok) + (nd - dd_ok) +
                (2 * nd - dstr_ok);
    printf("%-7s load %.2fs | encode(special) %d/%d  encode(no special) %d/%d  decode %d/%d  decode(skip) %d/%d  "
           "stream %d/%d | random-id decode %d/%d  stream %d/%d\n",
           name, tl, enc_ok, n, encns_ok, n, dec_ok, n, decs_ok, n, str_ok, n, dd_ok, nd, dstr_ok, 2 * nd);
    total_fail += fails;
    smelt_tokenizer_free(t);
    cJSON_Delete(root);
  }
  printf(total_fail ? "FAIL (%d mismatches)\n" : "ALL IDENTICAL\n", total_fail);
  return total_fail ? 1 : 0;
}
