/* The shipped default model: held-out perplexity within the bound stated in
 * docs/default-model.md, 4-bit within 10% of full precision, and smelt's perplexities
 * equal to the ones transformers measured at training time (models/smelt-tiny/eval.json). */
#include <cjson/cJSON.h>
#include <string.h>
#include "engine/engine.h"
#include "../test_util.h"

#define PPL_BOUND 45.0 /* stated in docs/default-model.md */

static const char *root;

static double ppl_of(const char *model, const char *text, int window, int max_tokens) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/models/%s", root, model);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    fprintf(stderr, "%s: %s\n", model, smelt_last_error());
    return -1;
  }
  int32_t *ids = NULL;
  size_t n = 0;
  double ppl = -1;
  int scored = 0;
  if (!smelt_tokenize(smelt_model_tokenizer(m), text, strlen(text), true, &ids, &n)) {
    if (max_tokens > 0 && (int)n > max_tokens) n = (size_t)max_tokens;
    if (sm_perplexity(m, ids, (int)n, window, &ppl, &scored)) ppl = -1;
  }
  printf("%-18s window %3d tokens %5zu: ppl %.4f\n", model, window, n, ppl);
  free(ids);
  smelt_model_free(m);
  return ppl;
}

static double ref(const cJSON *ev, const char *model_key, const char *win) {
  const cJSON *r = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(ev, "results"), model_key), win);
  const cJSON *p = cJSON_GetObjectItem(r, "ppl");
  return cJSON_IsNumber(p) ? p->valuedouble : -1;
}

int main(int argc, char **argv) {
  root = argc > 1 ? argv[1] : ".";
  char p[1024], *text = NULL, *evs = NULL;
  snprintf(p, sizeof p, "%s/tests/golden/heldout.txt", root);
  if (sm_read_file(p, &text, NULL)) {
    fprintf(stderr, "%s\n", smelt_last_error());
    return 1;
  }
  snprintf(p, sizeof p, "%s/models/smelt-tiny/eval.json", root);
  if (sm_read_file(p, &evs, NULL)) {
    fprintf(stderr, "%s\n", smelt_last_error());
    return 1;
  }
  cJSON *ev = cJSON_Parse(evs);

  double q512 = ppl_of("smelt-tiny", text, 512, 0), f512 = ppl_of("smelt-tiny-bf16", text, 512, 0);
  CHECK(q512 > 1 && q512 <= PPL_BOUND, "4-bit held-out perplexity %.3f not within (1, %.0f]", q512, PPL_BOUND);
  CHECK(f512 > 1 && f512 <= PPL_BOUND, "bf16 held-out perplexity %.3f not within (1, %.0f]", f512, PPL_BOUND);
  CHECK(q512 <= 1.10 * f512, "4-bit perplexity %.3f is more than 10%% above full precision %.3f", q512, f512);
  /* same numbers as transformers (float32) on the same weights */
  double rq = ref(ev, "smelt-tiny (4-bit g64)", "window512_all"), rf = ref(ev, "smelt-tiny-bf16", "window512_all");
  CHECK(fabs(q512 - rq) < 1e-3 * rq, "4-bit ppl %.4f vs transformers %.4f", q512, rq);
  CHECK(fabs(f512 - rf) < 1e-3 * rf, "bf16 ppl %.4f vs transformers %.4f", f512, rf);
  double d128 = ppl_of("smelt-tiny-draft", text, 128, 1024);
  double rd = ref(ev, "smelt-tiny-draft (4-bit g64)", "window128_first1024");
  CHECK(fabs(d128 - rd) < 1e-3 * rd, "draft ppl %.4f vs transformers %.4f", d128, rd);
  cJSON_Delete(ev);
  free(text);
  free(evs);
  TEST_END();
}
