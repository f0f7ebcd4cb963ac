/* Compares smelt's chat-template rendering with the reference outputs of Python Jinja2 as
 * transformers configures it (gen_python.py, which also records where @huggingface/jinja agrees).
 * usage: test_chat_ref [--known known_differences.txt] <refs.json>...
 * Prints per-group counts; exits 1 on any mismatch not listed as known, or a listed one that matches. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/chat.h"

typedef struct {
  char name[64];
  int pass, fail;
} group;
static group groups[256];
static int ngroups;

static group *grp(const char *case_name) {
  char g[64];
  size_t n = strcspn(case_name, "/");
  if (n >= sizeof g) n = sizeof g - 1;
  memcpy(g, case_name, n);
  g[n] = 0;
  for (int i = 0; i < ngroups; i++)
    if (!strcmp(groups[i].name, g)) return &groups[i];
  if (ngroups == 256) return &groups[255];
  snprintf(groups[ngroups].name, sizeof groups[ngroups].name, "%s", g);
  return &groups[ngroups++];
}

static struct {
  char *dir;
  smelt_tokenizer *tok;
} toks[16];
static int ntoks;

static smelt_tokenizer *get_tok(const char *dir) {
  for (int i = 0; i < ntoks; i++)
    if (!strcmp(toks[i].dir, dir)) return toks[i].tok;
  char *tj = sm_path_join(dir, "tokenizer.json"), *tc = sm_path_join(dir, "tokenizer_config.json");
  smelt_tokenizer *t = NULL;
  if (sm_tok_load_files(tj, tc, &t) != SMELT_OK) {
    fprintf(stderr, "cannot load tokenizer %s: %s\n", dir, sm_errmsg());
    t = NULL;
  }
  free(tj);
  free(tc);
  if (ntoks < 16) {
    toks[ntoks].dir = strdup(dir);
    toks[ntoks].tok = t;
    ntoks++;
  }
  return t;
}

static void show_diff(const char *exp, const char *got) {
  size_t i = 0;
  while (exp[i] && exp[i] == got[i]) i++;
  size_t st = i > 40 ? i - 40 : 0;
  fprintf(stderr, "    first difference at byte %zu\n    expected: ...%.100s\n    got     : ...%.100s\n", i, exp + st,
          got + st);
}

static int run_case(const cJSON *c) {
  const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
  const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(c, "kind"));
  const cJSON *expected = cJSON_GetObjectItem(c, "expected");
  const cJSON *error = cJSON_GetObjectItem(c, "error");
  if (!name || !kind) return 0;
  char *out = NULL;
  smelt_status st;
  if (!strcmp(kind, "model")) {
    smelt_tokenizer *t = get_tok(cJSON_GetStringValue(cJSON_GetObjectItem(c, "model_dir")));
    if (!t) {
      fprintf(stderr, "FAIL %s: tokenizer not loaded\n", name);
      return -1;
    }
    const cJSON *tools = cJSON_GetObjectItem(c, "tools");
    const cJSON *extra = cJSON_GetObjectItem(c, "extra");
    st = sm_chat_apply(t, cJSON_GetObjectItem(c, "messages"), cJSON_IsArray(tools) ? tools : NULL,
                       cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                       cJSON_IsObject(extra) ? extra : NULL, &out);
  } else {
    sm_jinja *tpl = NULL;
    st = sm_jinja_compile(cJSON_GetStringValue(cJSON_GetObjectItem(c, "template")), &tpl);
    if (st == SMELT_OK) {
      st = sm_jinja_render(tpl, cJSON_GetObjectItem(c, "context"), &out);
      sm_jinja_free(tpl);
    }
  }
  int ok = 1;
  if (cJSON_IsString(expected)) {
    if (st != SMELT_OK) {
      fprintf(stderr, "FAIL %s: smelt error: %s\n", name, sm_errmsg());
      ok = 0;
    } else if (strcmp(out, expected->valuestring)) {
      fprintf(stderr, "FAIL %s: output differs\n", name);
      show_diff(expected->valuestring, out);
      ok = 0;
    }
  } else if (error) {
    const char *contains = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error_contains"));
    const cJSON *line = cJSON_GetObjectItem(c, "error_line");
    if (st == SMELT_OK) {
      fprintf(stderr, "FAIL %s: reference failed (%s) but smelt rendered: %.200s\n", name, cJSON_GetStringValue(error),
              out);
      ok = 0;
    } else if (st != SMELT_ERR_FORMAT && strcmp(kind, "model")) {
      fprintf(stderr, "FAIL %s: status %d is not SMELT_ERR_FORMAT\n", name, (int)st);
      ok = 0;
    } else {
      if (contains && !strstr(sm_errmsg(), contains)) {
        fprintf(stderr, "FAIL %s: message \"%s\" lacks \"%s\"\n", name, sm_errmsg(), contains);
        ok = 0;
      }
      if (cJSON_IsNumber(line)) {
        char want[32];
        snprintf(want, sizeof want, "line %d:", line->valueint);
        if (!strstr(sm_errmsg(), want)) {
          fprintf(stderr, "FAIL %s: message \"%s\" lacks \"%s\"\n", name, sm_errmsg(), want);
          ok = 0;
        }
      }
    }
  } else ok = -2;
  free(out);
  return ok;
}

static char *known_txt;
static bool is_known(const char *name) {
  if (!known_txt) return false;
  size_t n = strlen(name);
  for (const char *p = known_txt; (p = strstr(p, name)); p += n)
    if ((p == known_txt || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0)) return true;
  return false;
}

int main(int argc, char **argv) {
  int a0 = 1;
  if (argc > 2 && !strcmp(argv[1], "--known")) {
    size_t kl;
    if (sm_read_file(argv[2], &known_txt, &kl) != SMELT_OK) {
      fprintf(stderr, "cannot read %s\n", argv[2]);
      return 1;
    }
    a0 = 3;
  }
  if (argc <= a0) {
    fprintf(stderr, "usage: %s [--known file] refs.json...\n", argv[0]);
    return 2;
  }
  int total = 0, failed = 0, known = 0, known_pass = 0, hf_differs = 0;
  for (int a = a0; a < argc; a++) {
    char *txt = NULL;
    size_t len;
    if (sm_read_file(argv[a], &txt, &len) != SMELT_OK) {
      fprintf(stderr, "cannot read %s\n", argv[a]);
      return 1;
    }
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    if (!cJSON_IsArray(cases)) {
      fprintf(stderr, "%s: no cases\n", argv[a]);
      return 1;
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
      int r = run_case(c);
      if (r == -2) continue;
      const char *nm = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
      group *g = grp(nm);
      total++;
      if (cJSON_IsFalse(cJSON_GetObjectItem(c, "hf_agrees"))) hf_differs++;
      if (r == 1) g->pass++;
      else g->fail++;
      if (is_known(nm)) {
        if (r == 1) known_pass++, fprintf(stderr, "FAIL %s: listed as a known difference but matches: remove it\n", nm);
        else known++;
      } else if (r != 1) failed++;
    }
    cJSON_Delete(root);
  }
  for (int i = 0; i < ngroups; i++)
    printf("%-22s %4d/%-4d identical\n", groups[i].name, groups[i].pass, groups[i].pass + groups[i].fail);
  printf(
    "total: %d/%d cases match Python Jinja2 (%d known differences, listed); @huggingface/jinja differs from it on %d\n",
    total - failed - known - known_pass, total, known, hf_differs);
  for (int i = 0; i < ntoks; i++) smelt_tokenizer_free(toks[i].tok), free(toks[i].dir);
  free(known_txt);
  return failed || known_pass ? 1 : 0;
}
