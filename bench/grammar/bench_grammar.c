/* Grammar cost per decode step: the time to build the allowed-token mask (and to advance the
 * parser by the sampled token) for a JSON-schema grammar, replaying a valid JSON text token by
 * token, next to the time of one decode step of the same model. Default: the built-in model.
 *   bench_grammar [MODEL_DIR] [--reps N]
 * The mask is built on the host for one sequence; a batch of B constrained sequences costs
 * about B masks per step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/grammar_schema.h"

static const char *SCHEMA =
  "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
  "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"address\":{\"type\":\"object\",\"properties\":"
  "{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\"}},\"required\":[\"city\"]},\"score\":{\"type\":\"number\"},"
  "\"active\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";
static const char *TEXT =
  "{\"name\": \"Ruth of Moab\", \"age\": 42, \"tags\": [\"gleaner\", \"widow\", \"faithful\"], "
  "\"address\": {\"city\": \"Bethlehem\", \"zip\": \"J-1021\"}, \"score\": 97.25, \"active\": true}";

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static bool count_cb(const char *p, size_t n, void *u) {
  (void)p;
  (void)n;
  (void)u;
  return true;
}

int main(int argc, char **argv) {
  const char *dir = SMELT_SRC "/models/smelt-tiny";
  int reps = 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else dir = argv[i];
  }
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    fprintf(stderr, "load %s: %s\n", dir, smelt_last_error());
    return 1;
  }
  const smelt_tokenizer *tok = smelt_model_tokenizer(m);
  int V = smelt_model_vocab_size(m);
  smelt_model_info info;
  smelt_model_get_info(m, &info);
  double t0 = sm_now();
  sm_grammar_vocab *voc = sm_grammar_vocab_new(tok, V, info.eos_ids, info.n_eos);
  double t_vocab = sm_now() - t0;
  cJSON *sc = cJSON_Parse(SCHEMA);
  char *gb = NULL;
  sm_grammar *g = NULL;
  if (sm_schema_to_gbnf(sc, true, &gb) || sm_grammar_compile(gb, &g)) {
    fprintf(stderr, "%s\n", sm_errmsg());
    return 1;
  }
  int32_t *ids = NULL;
  size_t n = 0;
  smelt_tokenize(tok, TEXT, strlen(TEXT), false, &ids, &n);
  uint32_t *mask = malloc(sizeof(uint32_t) * (size_t)((V + 31) / 32));
  double *tm = malloc(sizeof(double) * (n + 1) * (size_t)reps), t_acc = 0;
  int nt = 0;
  long allowed = 0;
  for (int r = 0; r < reps; r++) {
    sm_grammar_state *s = sm_grammar_state_new(g, voc);
    for (size_t i = 0; i <= n; i++) {
      double a = sm_now();
      allowed += sm_grammar_mask(s, mask);
      tm[nt++] = sm_now() - a;
      if (i == n) break;
      if (!sm_mask_test(mask, ids[i])) {
        fprintf(stderr, "token %zu masked\n", i);
        return 1;
      }
      a = sm_now();
      sm_grammar_accept(s, ids[i]);
      t_acc += sm_now() - a;
    }
    sm_grammar_state_free(s);
  }
  qsort(tm, (size_t)nt, sizeof(double), cmp_d);
  double sum = 0;
  for (int i = 0; i < nt; i++) sum += tm[i];
  /* one decode step of the model, for scale */
  smelt_sampling sp;
  smelt_sampling_default(&sp);
  smelt_stats st;
  smelt_generate(m, "In the beginning", 64, &sp, count_cb, NULL, &st);
  double step = st.n_generated > 1 ? st.decode_s / (st.n_generated - 1) : 0;
  double mean = sum / nt;
  printf("model %s, vocab %d, backend %s\n", dir, V, info.backend);
  printf("vocabulary trie: %.1f ms (once per tokenizer)\n", t_vocab * 1e3);
  printf("grammar: %d rules; text %zu tokens x %d reps; %.0f tokens allowed per step on average\n",
         sm_grammar_n_rules(g), n, reps, (double)allowed / nt);
  printf("mask per step: mean %.1f us, p50 %.1f us, p90 %.1f us, max %.1f us\n", mean * 1e6, tm[nt / 2] * 1e6,
         tm[nt * 9 / 10] * 1e6, tm[nt - 1] * 1e6);
  printf("accept per token: mean %.2f us\n", t_acc / ((double)n * reps) * 1e6);
  if (step > 0)
    printf("decode step (1 sequence): %.2f ms -> one mask is %.1f%% of a step\n", step * 1e3, 100 * mean / step);
  free(mask);
  free(tm);
  free(ids);
  free(gb);
  cJSON_Delete(sc);
  sm_grammar_free(g);
  sm_grammar_vocab_free(voc);
  smelt_model_free(m);
  return 0;
}
