/* Speculative decoding with the shipped draft model gives exactly the target model's
 * output (greedy and seeded sampling), and the draft does contribute tokens. */
#include <string.h>
#include "engine/engine.h"
#include "../test_util.h"

typedef struct {
  char buf[8192];
  size_t len;
} text;
static bool collect(const char *p, size_t l, void *u) {
  text *t = u;
  if (t->len + l < sizeof t->buf) {
    memcpy(t->buf + t->len, p, l);
    t->len += l;
    t->buf[t->len] = 0;
  }
  return true;
}

static smelt_model *load(const char *root, const char *name) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/models/%s", root, name);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    fprintf(stderr, "%s: %s\n", name, smelt_last_error());
    exit(1);
  }
  return m;
}

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : ".";
  smelt_model *m = load(root, "smelt-tiny"), *d = load(root, "smelt-tiny-draft");
  const char *prompts[] = {"In the beginning God created",
                           "The module defines the following functions:", "And it came to pass"};
  int total_acc = 0;
  for (int pi = 0; pi < 3; pi++) {
    int32_t *ids = NULL;
    size_t n = 0;
    smelt_tokenize(smelt_model_tokenizer(m), prompts[pi], strlen(prompts[pi]), true, &ids, &n);
    for (int mode = 0; mode < 2; mode++) {
      smelt_sampling sp;
      smelt_sampling_default(&sp);
      if (mode) {
        sp.temperature = 0.8f;
        sp.top_p = 0.95f;
        sp.seed = 100 + pi;
      }
      for (int k = 1; k <= 6; k += 5) {
        text a = {.len = 0}, b = {.len = 0};
        smelt_stats sa, sb;
        int acc = 0;
        CHECK(sm_generate_ids(m, NULL, ids, (int)n, 48, &sp, collect, &a, &sa) == SMELT_OK, "plain generation");
        CHECK(sm_generate_speculative(m, d, NULL, k, ids, (int)n, 48, &sp, collect, &b, &sb, &acc) == SMELT_OK,
              "speculative: %s", smelt_last_error());
        CHECK(a.len > 0 && !strcmp(a.buf, b.buf), "prompt %d mode %d k %d: outputs differ\n  plain: %s\n  spec:  %s",
              pi, mode, k, a.buf, b.buf);
        CHECK(sa.n_generated == sb.n_generated, "token counts differ: %d vs %d", sa.n_generated, sb.n_generated);
        total_acc += acc;
      }
    }
    free(ids);
  }
  printf("draft tokens accepted in total: %d\n", total_acc);
  CHECK(total_acc > 20, "the draft model contributed only %d tokens", total_acc);
  /* an invalid draft length is refused */
  int32_t one = 1;
  CHECK(sm_generate_speculative(m, d, NULL, 0, &one, 1, 4, NULL, NULL, NULL, NULL, NULL) == SMELT_ERR_INVALID,
        "k=0 refused");
  smelt_model_free(m);
  smelt_model_free(d);
  TEST_END();
}
