/* The prompts of the load generators (bench_server_load, bench_server_soak): "Request I:" and then
 * words of a small common vocabulary, so that every request differs and the tokens a prompt takes
 * are about the same for any tokenizer. */
#ifndef SM_BENCH_PROMPT_H
#define SM_BENCH_PROMPT_H
#include <stdio.h>

/* request i's prompt of n words into buf (cap bytes; fewer words where they would not fit); salt
 * shifts the word choice */
static inline void bench_prompt(char *buf, size_t cap, long i, int n, unsigned salt) {
  static const char *words[] = {"time", "person", "year", "way",   "day",   "thing", "man",  "world", "life", "hand",
                                "part", "child",  "eye",  "woman", "place", "work",  "week", "case",  "point"};
  int o = snprintf(buf, cap, "Request %ld:", i);
  for (int j = 0; j < n && o < (int)cap - 32; j++)
    o += snprintf(buf + o, cap - (size_t)o, " %s", words[(i * 7 + j * 13 + (long)salt) % 19]);
}

#endif
