/* Fuzzes the tokenizer.json / tokenizer_config.json loader: thousands of mutations of small
 * tokenizers of the kinds checkpoints ship (byte-level BPE with a split regex and a template
 * post-processor, SentencePiece-style BPE with byte fallback and a decoder sequence, Metaspace with
 * Unicode normalizers), with JSON-aware edits (type names, regexes, ids, merges, nesting). A load
 * must either fail with a message and no tokenizer, or give a tokenizer whose encodings of a few
 * texts (invalid UTF-8 among them) hold ids of its vocabulary and decode again; nothing may crash
 * or leak (CI runs it under ASan/UBSan). usage: test_tokenizer_fuzz [iterations] (SMELT_FUZZ_SEED) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../test_util.h"
#include "smelt.h"
#include "tokenizer/tokenizer.h"

static const char *const k_seeds[] = {
  /* byte-level BPE: split regex then ByteLevel, template with a BOS, merges in both notations */
  "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":10,\"content\":\"<|eot|>\",\"single_word\":false,\"lstrip\":false,"
  "\"rstrip\":false,\"normalized\":false,\"special\":true},{\"id\":11,\"content\":\"<bos>\",\"special\":true},"
  "{\"id\":12,\"content\":\" word\",\"special\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":true}],"
  "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
  "{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+|\\\\s+\"},"
  "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":"
  "true,\"use_regex\":false}]},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
  "{\"id\":\"<bos>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[{\"Sequence\":{\"id\":\"A\","
  "\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],\"special_tokens\":{\"<bos>\":{\"id\":\"<bos>\","
  "\"ids\":[11],\"tokens\":[\"<bos>\"]}}},\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
  "\"trim_offsets\":true,\"use_regex\":true},\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
  "\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,"
  "\"\\u0120\":5,\"\\u0120a\":6,\"1\":7,\"2\":8,\"12\":9},\"merges\":[\"a b\",\"ab c\",[\"\\u0120\",\"a\"],[\"1\",\"2\"]]}}",
  /* SentencePiece-style BPE: Prepend / Replace normalizers, byte fallback, a decoder sequence */
  "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":"
  "\"<s>\",\"special\":true},{\"id\":2,\"content\":\"</s>\",\"special\":true}],\"normalizer\":{\"type\":\"Sequence\","
  "\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
  "\"content\":\"\\u2581\"}]},\"pre_tokenizer\":null,\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":"
  "[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],"
  "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},\"decoder\":{\"type\":\"Sequence\","
  "\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":"
  "\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
  "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,"
  "\"<s>\":1,\"</s>\":2,\"<0x41>\":3,\"<0xC3>\":4,\"<0xA9>\":5,\"\\u2581\":6,\"h\":7,\"i\":8,\"\\u2581h\":9,"
  "\"\\u2581hi\":10},\"merges\":[\"\\u2581 h\",\"\\u2581h i\"]}}",
  /* Metaspace with NFC and Lowercase, digits split, a Metaspace decoder */
  "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},"
  "{\"type\":\"Lowercase\"}]},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
  "\"individual_digits\":true},{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\","
  "\"split\":true}]},\"post_processor\":null,\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
  "\"prepend_scheme\":\"first\",\"split\":true},\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{"
  "\"<unk>\":0,\"\\u2581\":1,\"x\":2,\"y\":3,\"\\u2581x\":4,\"\\u00e9\":5,\"1\":6},\"merges\":[\"\\u2581 x\"]}}",
};
static const char *k_config = "{\"bos_token\":\"<bos>\",\"eos_token\":{\"content\":\"<|eot|>\"},\"add_bos_token\":true,"
                              "\"chat_template\":\"{% for m in messages %}{{ m.content }}{% endfor %}\"}";

/* replacements: the loader's type names and fields, regexes (some invalid), ids and odd values (all
 * JSON values, so that most mutants parse and reach the loader), and a few that break the syntax */
static const char *const k_vals[] = {
  "\"BPE\"",
  "\"Unigram\"",
  "\"WordPiece\"",
  "\"ByteLevel\"",
  "\"Split\"",
  "\"Sequence\"",
  "\"Replace\"",
  "\"Prepend\"",
  "\"NFC\"",
  "\"NFKC\"",
  "\"NFD\"",
  "\"NFKD\"",
  "\"Lowercase\"",
  "\"Strip\"",
  "\"StripAccents\"",
  "\"ByteFallback\"",
  "\"Fuse\"",
  "\"Metaspace\"",
  "\"Digits\"",
  "\"Punctuation\"",
  "\"Whitespace\"",
  "\"WhitespaceSplit\"",
  "\"TemplateProcessing\"",
  "\"RobertaProcessing\"",
  "\"BertProcessing\"",
  "\"Isolated\"",
  "\"Removed\"",
  "\"MergedWithPrevious\"",
  "\"MergedWithNext\"",
  "\"Contiguous\"",
  "\"first\"",
  "\"always\"",
  "\"never\"",
  "{\"Regex\":\"(\"}",
  "{\"Regex\":\"[a-\"}",
  "{\"Regex\":\"(?<x\"}",
  "{\"Regex\":\"\\\\\"}",
  "{\"Regex\":\"\\\\p{Zzz}\"}",
  "{\"Regex\":\"(a|b\"}",
  "{\"Regex\":\"\"}",
  "{\"Regex\":\".*\"}",
  "{\"Regex\":\"a*?\"}",
  "{\"Regex\":\"(?=x)\"}",
  "{\"Regex\":\"\\\\s+(?!\\\\S)\"}",
  "{\"String\":\"\"}",
  "{\"String\":\"\\u2581\"}",
  "\"type\"",
  "\"vocab\"",
  "\"merges\"",
  "\"model\"",
  "\"pattern\"",
  "\"content\"",
  "\"id\"",
  "\"ids\"",
  "\"tokens\"",
  "\"special_tokens\"",
  "\"single\"",
  "\"pair\"",
  "\"normalizers\"",
  "\"pretokenizers\"",
  "\"decoders\"",
  "\"added_tokens\"",
  "\"unk_token\"",
  "\"byte_fallback\"",
  "\"prepend\"",
  "\"replacement\"",
  "\"<0xFF>\"",
  "\"<0x\"",
  "\"<0xGG>\"",
  "\"a b c\"",
  "\"a\"",
  "[\"a\"]",
  "[\"a\",\"b\",\"c\"]",
  "[1,2]",
  "\"\"",
  "\" \"",
  "\"\\u0000\"",
  "\"\\ud800\"",
  "\"\\u0120\"",
  "\"\\u2581\"",
  "\"\xff\xfe\"",
  "\"\xc3\"",
  "-1",
  "0",
  "1",
  "12",
  "255",
  "65535",
  "99999999",
  "100000001",
  "2147483648",
  "1e308",
  "-0",
  "0.5",
  "NaN",
  "null",
  "true",
  "false",
  "[]",
  "{}",
  "[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]",
  "{\"type\":\"Sequence\",\"normalizers\":[]}",
  "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Sequence\",\"pretokenizers\":[]}]}",
  "{\"SpecialToken\":{\"id\":\"<nope>\",\"type_id\":0}}",
  "{\"Sequence\":{\"id\":\"C\",\"type_id\":0}}",
  "{\"id\":3,\"content\":\"ab\",\"special\":false}",
  "{\"id\":99999999,\"content\":\"z\",\"special\":true}",
};
static const char *const k_junk[] = {"[[[[", "]]", "{{", "}}", ",", ":", "\"", "\\", "\xff"};

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) { return t_xorshift(&g_rng); }
static size_t rn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

typedef struct {
  char *p;
  size_t n, cap;
} buf;
static void b_set(buf *b, const char *s, size_t n) {
  if (n + 1 > b->cap) {
    b->cap = 2 * (n + 1);
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p, s, n);
  b->n = n;
  b->p[n] = 0;
}
static void b_splice(buf *b, size_t at, size_t del, const char *s, size_t n) {
  if (at > b->n) at = b->n;
  if (del > b->n - at) del = b->n - at;
  const size_t len = b->n - del + n;
  char *q = malloc(len + 1);
  if (!q) abort();
  memcpy(q, b->p, at);
  memcpy(q + at, s, n);
  memcpy(q + at + n, b->p + at + del, b->n - at - del);
  q[len] = 0;
  free(b->p);
  b->p = q;
  b->n = len;
  b->cap = len + 1;
}

/* the scalar tokens of a JSON text (strings, numbers, literals) by a left-to-right scan: the start
 * and end of one picked at random, and whether it is an object key */
static bool pick_token(const buf *b, size_t *s, size_t *e, bool *key) {
  size_t st[4096], en[4096];
  int n = 0;
  for (size_t i = 0; i < b->n && n < 4096;) {
    const char c = b->p[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < b->n && b->p[j] != '"') j += b->p[j] == '\\' ? 2 : 1;
      j = j < b->n ? j + 1 : b->n;
      st[n] = i, en[n++] = j, i = j;
    } else if (strchr("-0123456789ntfN", c)) {
      size_t j = i;
      while (j < b->n && !strchr(",:]} \n\"[{", b->p[j])) j++;
      st[n] = i, en[n++] = j, i = j > i ? j : i + 1;
    } else {
      i++;
    }
  }
  if (!n) return false;
  const int k = (int)rn((size_t)n);
  *s = st[k], *e = en[k];
  size_t nx = *e;
  while (nx < b->n && b->p[nx] == ' ') nx++;
  *key = nx < b->n && b->p[nx] == ':';
  return true;
}

static const char *pick(const char *const *list, size_t n) { return list[rn(n)]; }
#define VAL() pick(k_vals, sizeof k_vals / sizeof k_vals[0])

/* mostly edits that keep the JSON valid: a value replaced by another (a key by a string), two values
 * swapped, an array element or member copied; sometimes bytes, junk or a truncation */
static void mutate(buf *b) {
  const int k = 1 + (int)rn(3);
  for (int m = 0; m < k && b->n; m++) {
    size_t s, e;
    bool key;
    if (!pick_token(b, &s, &e, &key)) return;
    const int r = (int)rn(20);
    if (r < 12) { /* replace */
      const char *t = VAL();
      while (key && t[0] != '"') t = VAL();
      b_splice(b, s, e - s, t, strlen(t));
    } else if (r < 15 && !key) { /* copy a value over another */
      char t[4096];
      const size_t tl = e - s < sizeof t ? e - s : sizeof t;
      memcpy(t, b->p + s, tl);
      size_t s2, e2;
      bool key2;
      if (pick_token(b, &s2, &e2, &key2) && !key2) b_splice(b, s2, e2 - s2, t, tl);
    } else if (r < 17 && !key && s > 0 && (b->p[s - 1] == '[' || b->p[s - 1] == ',')) {
      char t[4097]; /* an array element (or a value after a comma) twice */
      const size_t tl = e - s < sizeof t - 1 ? e - s : sizeof t - 1;
      memcpy(t, b->p + s, tl);
      t[tl] = ',';
      b_splice(b, s, 0, t, tl + 1);
    } else if (r == 17) {
      b->p[rn(b->n)] = (char)rn(256);
    } else if (r == 18) {
      b->n = rn(b->n), b->p[b->n] = 0;
    } else {
      const char *t = pick(k_junk, sizeof k_junk / sizeof k_junk[0]);
      b_splice(b, rn(b->n + 1), 0, t, strlen(t));
    }
  }
}

static char g_dir[256];
static void put(const char *name, const char *s, size_t n) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  FILE *f = fopen(p, "wb");
  if (!f || fwrite(s, 1, n, f) != n) abort();
  fclose(f);
}

/* one load and, where it succeeds, encodes and decodes; returns whether it loaded */
static bool check_one(const buf *tj, const buf *cfg) {
  put("tokenizer.json", tj->p, tj->n);
  char tp[512], cp[512];
  snprintf(tp, sizeof tp, "%s/tokenizer.json", g_dir);
  snprintf(cp, sizeof cp, "%s/tokenizer_config.json", g_dir);
  if (cfg) put("tokenizer_config.json", cfg->p, cfg->n);
  smelt_tokenizer *t = (smelt_tokenizer *)1;
  const smelt_status st = sm_tok_load_files(tp, cfg ? cp : NULL, &t);
  if (st != SMELT_OK) {
    CHECK(t == NULL, "a failed load left a tokenizer");
    CHECK(smelt_last_error()[0] != 0, "a failed load without a message");
    return false;
  }
  const int32_t V = smelt_tokenizer_vocab_size(t);
  CHECK(V > 0, "a loaded tokenizer with %d ids", V);
  static const char *const texts[] = {"",
                                      "ab abc 12 a",
                                      "hi h\xc3\xa9 \xe2\x98\x83 \xf0\x9d\x84\x9e x1 X",
                                      "<bos>ab<|eot|> word ",
                                      "\xff\xfe\xc3 a\x80",
                                      "  \n\t 123456 's 't"};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (smelt_tokenize(t, texts[i], strlen(texts[i]), (i & 1) != 0, &ids, &n) != SMELT_OK) {
      CHECK(ids == NULL && smelt_last_error()[0], "a failed encode left ids or no message");
      continue;
    }
    bool in = true;
    for (size_t k = 0; k < n; k++) in = in && ids[k] >= 0 && ids[k] < V;
    CHECK(in, "an id outside the vocabulary of %d", V);
    if (!in) { /* what reproduces it */
      fprintf(stderr, "TEXT %zu: %s\nJSON %s\nIDS", i, texts[i], tj->p);
      for (size_t k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
      fprintf(stderr, "\n");
    }
    char *txt = NULL;
    if (in) {
      const smelt_status ds = smelt_detokenize(t, ids, n, (i & 2) != 0, &txt);
      CHECK(ds == SMELT_OK || smelt_last_error()[0], "a failed decode without a message");
    }
    free(txt);
    free(ids);
  }
  sm_buf pb = {0};
  for (int k = 0; k < 32; k++) sm_tok_piece_bytes(t, (int32_t)rn((size_t)V + 2) - 1, &pb);
  sm_buf_free(&pb);
  (void)sm_tok_chat_template(t, NULL);
  smelt_tokenizer_free(t);
  return true;
}

int main(int argc, char **argv) {
  const int iters = argc > 1 ? atoi(argv[1]) : 3000;
  const char *seed = getenv("SMELT_FUZZ_SEED");
  if (seed) g_rng = strtoull(seed, NULL, 0) | 1;
  snprintf(g_dir, sizeof g_dir, "/tmp/smelt-tokfuzz-%d", (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
  if (system(cmd) != 0) return 2;
  buf tj = {0}, cfg = {0};
  const size_t ns = sizeof k_seeds / sizeof k_seeds[0];
  /* the seeds themselves load */
  for (size_t i = 0; i < ns; i++) {
    b_set(&tj, k_seeds[i], strlen(k_seeds[i]));
    b_set(&cfg, k_config, strlen(k_config));
    CHECK(check_one(&tj, i == 0 ? &cfg : NULL), "seed %zu does not load: %s", i, smelt_last_error());
  }
  int loaded = 0;
  for (int it = 0; it < iters; it++) {
    const char *sd = k_seeds[rn(ns)];
    b_set(&tj, sd, strlen(sd));
    const bool with_cfg = rn(4) == 0;
    b_set(&cfg, k_config, strlen(k_config));
    if (with_cfg && rn(2)) mutate(&cfg);
    else mutate(&tj);
    if (rn(3) == 0) mutate(&tj);
    loaded += check_one(&tj, with_cfg ? &cfg : NULL);
  }
  printf("%d mutated tokenizers, %d still loaded\n", iters, loaded);
  CHECK(loaded > iters / 50 && loaded < iters, "no variety: %d of %d loaded", loaded, iters);
  free(tj.p);
  free(cfg.p);
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  TEST_END();
}
