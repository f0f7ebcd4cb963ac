/* Unit tests of the server's API layer: request validation against the OpenAI API rules,
 * error bodies, stop strings, tool-call parsing and streaming, duplicate keys, reserved
 * template variables, UTF-8 repair of output JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/api.h"
#include "server/image_input.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/toolcall.h"

static int fails = 0;
#define CHECK(c) \
  do { \
    if (!(c)) { \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
      fails++; \
    } \
  } while (0)

/* expect a 400-type error with the given param ("" = null) */
static void expect_err(sm_ep_kind k, const char *body, int status, const char *param) {
  sm_api_request r;
  sm_api_error e;
  bool ok = sm_api_parse(k, body, strlen(body), &r, &e);
  if (ok) {
    fprintf(stderr, "expected error for: %s\n", body);
    fails++;
    sm_api_request_free(&r);
    return;
  }
  if (e.http_status != status || strcmp(e.param, param)) {
    fprintf(stderr, "body %s: got status %d param '%s' (%s), want %d '%s'\n", body, e.http_status, e.param, e.message,
            status, param);
    fails++;
  }
  /* the error body is OpenAI-shaped */
  char *js = sm_api_error_json(&e);
  cJSON *j = cJSON_Parse(js), *o = cJSON_GetObjectItem(j, "error");
  CHECK(cJSON_IsString(cJSON_GetObjectItem(o, "message")) && cJSON_GetObjectItem(o, "message")->valuestring[0]);
  CHECK(cJSON_IsString(cJSON_GetObjectItem(o, "type")));
  CHECK(cJSON_GetObjectItem(o, "param") && cJSON_GetObjectItem(o, "code"));
  if (param[0])
    CHECK(cJSON_IsString(cJSON_GetObjectItem(o, "param")) &&
          !strcmp(cJSON_GetObjectItem(o, "param")->valuestring, param));
  else CHECK(cJSON_IsNull(cJSON_GetObjectItem(o, "param")));
  cJSON_Delete(j);
  free(js);
}

static bool parse_ok(sm_ep_kind k, const char *body, sm_api_request *r) {
  sm_api_error e;
  if (!sm_api_parse(k, body, strlen(body), r, &e)) {
    fprintf(stderr, "unexpected error for %s: %s\n", body, e.message);
    fails++;
    return false;
  }
  return true;
}

static void test_parse(void) {
  sm_api_request r;
  /* valid chat with every option */
  const char *full =
    "{\"model\":\"x\",\"messages\":[{\"role\":\"developer\",\"content\":\"sys\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
    "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"frequency_penalty\":0.1,"
    "\"presence_penalty\":-0.2,\"repetition_penalty\":1.1,\"seed\":7,\"n\":3,\"max_completion_tokens\":9,"
    "\"stop\":[\"END\",\"\\n\\n\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
    "\"logprobs\":true,\"top_logprobs\":5,\"response_format\":{\"type\":\"json_object\"},"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]}";
  if (parse_ok(SM_EP_CHAT, full, &r)) {
    CHECK(r.n == 3 && r.max_tokens == 9 && r.n_stop == 2 && !strcmp(r.stop[1], "\n\n"));
    CHECK(r.stream && r.include_usage && r.logprobs && r.top_logprobs == 5 && r.json_mode);
    CHECK(r.has_seed && r.seed == 7 && r.sampling.top_k == 40 && r.sampling.temperature == 0.5f);
    CHECK(r.sampling.min_p > 0.049f && r.sampling.presence_penalty < -0.19f);
    CHECK(cJSON_GetArraySize(r.messages) == 4);
    cJSON *m0 = cJSON_GetArrayItem(r.messages, 0), *m1 = cJSON_GetArrayItem(r.messages, 1);
    CHECK(!strcmp(cJSON_GetObjectItem(m0, "role")->valuestring, "system"));
    CHECK(!strcmp(cJSON_GetObjectItem(m1, "content")->valuestring, "ab"));
    cJSON *m2 = cJSON_GetArrayItem(r.messages, 2);
    cJSON *args =
      cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m2, "tool_calls"), 0), "function"),
                          "arguments");
    CHECK(cJSON_IsObject(args) && cJSON_GetObjectItem(args, "x")->valueint == 1); /* object for the template */
    CHECK(cJSON_GetArraySize(r.tools) == 1);
    sm_api_request_free(&r);
  }
  /* defaults */
  if (parse_ok(SM_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r)) {
    CHECK(r.n == 1 && r.max_tokens == -1 && !r.stream && !r.has_seed && r.sampling.temperature == 1.0f);
    CHECK(r.tools == NULL && r.n_stop == 0);
    sm_api_request_free(&r);
  }
  /* tool_choice none drops tools; stop as string; max_tokens */
  if (parse_ok(SM_EP_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"none\",\"stop\":\"x\","
               "\"max_tokens\":3,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
               &r)) {
    CHECK(r.tools == NULL && r.n_stop == 1 && r.max_tokens == 3);
    sm_api_request_free(&r);
  }
  /* completions: string, one-element list, token ids, logprobs int */
  if (parse_ok(SM_EP_COMPLETIONS, "{\"prompt\":\"abc\",\"logprobs\":2,\"echo\":true}", &r)) {
    CHECK(r.prompt && !strcmp(r.prompt, "abc") && r.logprobs && r.top_logprobs == 2 && r.echo);
    sm_api_request_free(&r);
  }
  if (parse_ok(SM_EP_COMPLETIONS, "{\"prompt\":[\"abc\"]}", &r)) {
    CHECK(!strcmp(r.prompt, "abc"));
    sm_api_request_free(&r);
  }
  if (parse_ok(SM_EP_COMPLETIONS, "{\"prompt\":[1,2,3]}", &r)) {
    CHECK(r.n_prompt_ids == 3 && r.prompt_ids[2] == 3);
    sm_api_request_free(&r);
  }
  /* responses: string input + instructions; message list; text.format */
  if (parse_ok(SM_EP_RESPONSES, "{\"input\":\"q\",\"instructions\":\"be brief\",\"max_output_tokens\":5}", &r)) {
    CHECK(cJSON_GetArraySize(r.messages) == 2 && r.max_tokens == 5);
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 0), "role")->valuestring, "system"));
    sm_api_request_free(&r);
  }
  if (parse_ok(SM_EP_RESPONSES,
               "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"hi\"}]}],"
               "\"text\":{\"format\":{\"type\":\"json_object\"}}}",
               &r)) {
    CHECK(r.json_mode && cJSON_GetArraySize(r.messages) == 1);
    sm_api_request_free(&r);
  }

  /* errors (OpenAI: 400 invalid_request_error with the offending param) */
  expect_err(SM_EP_CHAT, "", 400, "");
  expect_err(SM_EP_CHAT, "{", 400, "");
  expect_err(SM_EP_CHAT, "[1,2]", 400, "");
  expect_err(SM_EP_CHAT, "{}", 400, "messages");
  expect_err(SM_EP_CHAT, "{\"messages\":\"hi\"}", 400, "messages");
  expect_err(SM_EP_CHAT, "{\"messages\":[]}", 400, "messages");
  expect_err(SM_EP_CHAT, "{\"messages\":[1]}", 400, "messages[0]");
  expect_err(SM_EP_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0]");
  expect_err(SM_EP_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0]");
  expect_err(SM_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0]");
  expect_err(SM_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
             "messages[0]");
  /* images: user messages only, with a URL; text and images keep their order as template parts */
  expect_err(SM_EP_CHAT,
             "{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
             "{\"url\":\"data:,\"}}]}]}",
             400, "messages[0]");
  expect_err(SM_EP_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
             "{\"url\":\"data:,\"}},{\"type\":\"audio\"}]}]}",
             400, "messages[0]");
  {
    sm_api_request r;
    if (parse_ok(SM_EP_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                 "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AA==\",\"detail\":\"low\"}},"
                 "{\"type\":\"image_url\",\"image_url\":\"http://h/i.png\"}]}]}",
                 &r)) {
      const cJSON *parts = cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 0), "content");
      CHECK(r.n_images == 2 && !strcmp(r.image_urls[0], "data:image/png;base64,AA==") &&
            !strcmp(r.image_urls[1], "http://h/i.png"));
      CHECK(cJSON_GetArraySize(parts) == 3 &&
            !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(parts, 0), "text")->valuestring, "a") &&
            !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(parts, 1), "type")->valuestring, "image") &&
            !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(parts, 2), "type")->valuestring, "image"));
      sm_api_request_free(&r);
    }
    if (parse_ok(SM_EP_RESPONSES,
                 "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
                 "\"image_url\":\"data:x\"},{\"type\":\"input_text\",\"text\":\"b\"}]}]}",
                 &r)) {
      CHECK(r.n_images == 1 && !strcmp(r.image_urls[0], "data:x"));
      sm_api_request_free(&r);
    }
    /* text-only content parts stay a string */
    if (parse_ok(SM_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}]}",
                 &r)) {
      CHECK(r.n_images == 0 && cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 0), "content")));
      sm_api_request_free(&r);
    }
  }
  const char *M = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
  char b[512];
#define E(extra, param) \
  do { \
    snprintf(b, sizeof b, "{%s,%s}", M, extra); \
    expect_err(SM_EP_CHAT, b, 400, param); \
  } while (0)
  E("\"temperature\":\"hot\"", "temperature");
  E("\"temperature\":3", "temperature");
  E("\"temperature\":-0.1", "temperature");
  E("\"top_p\":1.5", "top_p");
  E("\"top_k\":1.5", "top_k");
  E("\"n\":0", "n");
  E("\"n\":1000", "n");
  E("\"max_tokens\":0", "max_tokens");
  E("\"max_tokens\":\"5\"", "max_tokens");
  E("\"max_completion_tokens\":-3", "max_completion_tokens");
  E("\"stop\":5", "stop");
  E("\"stop\":[\"a\",1]", "stop");
  E("\"stream\":\"yes\"", "stream");
  E("\"stream_options\":3", "stream_options");
  E("\"logprobs\":1", "logprobs");
  E("\"top_logprobs\":3", "top_logprobs"); /* needs logprobs */
  E("\"logprobs\":true,\"top_logprobs\":21", "top_logprobs");
  E("\"frequency_penalty\":2.5", "frequency_penalty");
  E("\"presence_penalty\":\"x\"", "presence_penalty");
  E("\"seed\":1.5", "seed");
  E("\"response_format\":{\"type\":\"xml\"}", "response_format");
  E("\"response_format\":\"json\"", "response_format");
  E("\"tools\":{}", "tools");
  E("\"tools\":[{\"type\":\"function\",\"function\":{}}]", "tools[0]");
  E("\"tool_choice\":\"sometimes\"", "tool_choice");
  E("\"model\":5", "model");
#undef E
  expect_err(SM_EP_COMPLETIONS, "{}", 400, "prompt");
  expect_err(SM_EP_COMPLETIONS, "{\"prompt\":5}", 400, "prompt");
  expect_err(SM_EP_COMPLETIONS, "{\"prompt\":[]}", 400, "prompt");
  expect_err(SM_EP_COMPLETIONS, "{\"prompt\":[1,-2]}", 400, "prompt");
  expect_err(SM_EP_COMPLETIONS, "{\"prompt\":[\"a\",[]]}", 400, "prompt");
  expect_err(SM_EP_COMPLETIONS, "{\"prompt\":[\"a\",[1,-1]]}", 400, "prompt");
  if (parse_ok(SM_EP_COMPLETIONS, "{\"prompt\":[\"a\",[7,8]]}", &r)) { /* several prompts */
    CHECK(r.n_prompts == 2 && !strcmp(r.prompts[0], "a") && !r.prompts[1] && r.prompt_lens[1] == 2 &&
          r.prompt_lists[1][1] == 8);
    sm_api_request_free(&r);
  }
  expect_err(SM_EP_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":9}", 400, "logprobs");
  expect_err(SM_EP_COMPLETIONS, "{\"prompt\":\"a\",\"best_of\":3}", 400, "best_of");
  expect_err(SM_EP_RESPONSES, "{}", 400, "input");
  expect_err(SM_EP_RESPONSES, "{\"input\":3}", 400, "input");
  expect_err(SM_EP_RESPONSES, "{\"input\":\"x\",\"instructions\":1}", 400, "instructions");
  expect_err(SM_EP_RESPONSES, "{\"input\":[{\"role\":\"user\",\"content\":2}]}", 400, "input[0]");
  expect_err(SM_EP_RESPONSES, "{\"input\":\"x\",\"max_output_tokens\":0}", 400, "max_output_tokens");
}

static void test_stop(void) {
  char *stops[] = {"END", "\n\n", "abcd"};
  const char *t = "hello\n\nworld END";
  CHECK(sm_stop_find(t, strlen(t), 0, stops, 3) == 5);
  CHECK(sm_stop_find(t, strlen(t), 6, stops, 3) == 13);
  CHECK(sm_stop_find(t, strlen(t), 14, stops, 3) == -1);
  CHECK(sm_stop_find("EN", 2, 0, stops, 3) == -1);
  /* holdback: suffix that could start a stop string */
  CHECK(sm_stop_holdback("hello E", 7, stops, 3) == 1);
  CHECK(sm_stop_holdback("hello EN", 8, stops, 3) == 2);
  CHECK(sm_stop_holdback("hello abc", 9, stops, 3) == 3);
  CHECK(sm_stop_holdback("hello\n", 6, stops, 3) == 1);
  CHECK(sm_stop_holdback("hello", 5, stops, 3) == 0);
  CHECK(sm_stop_holdback("", 0, stops, 3) == 0);
}

static void test_toolcalls(void) {
  cJSON *calls;
  char *content;
  /* Hermes / Qwen */
  int n =
    sm_toolcall_parse("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                      "</tool_call>\n<tool_call>{\"name\":\"t2\",\"arguments\":{}}</tool_call>",
                      1, &calls, &content);
  CHECK(n == 2);
  if (n == 2) {
    cJSON *f = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
    CHECK(!strcmp(cJSON_GetObjectItem(f, "name")->valuestring, "get_weather"));
    cJSON *a = cJSON_Parse(cJSON_GetObjectItem(f, "arguments")->valuestring);
    CHECK(a && !strcmp(cJSON_GetObjectItem(a, "city")->valuestring, "Paris"));
    cJSON_Delete(a);
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "type")->valuestring, "function"));
    CHECK(strncmp(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "id")->valuestring, "call_", 5) == 0);
    CHECK(content && !strcmp(content, "Let me check."));
  }
  cJSON_Delete(calls);
  free(content);
  /* Llama 3 JSON */
  n = sm_toolcall_parse(" {\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}", 2, &calls, &content);
  CHECK(n == 1 && content == NULL);
  if (n == 1) {
    cJSON *f = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
    CHECK(!strcmp(cJSON_GetObjectItem(f, "arguments")->valuestring, "{\"q\": \"x\"}")); /* as written */
  }
  cJSON_Delete(calls);
  n = sm_toolcall_parse("<|python_tag|>{\"name\":\"a\",\"parameters\":{}}; {\"name\":\"b\",\"parameters\":{}}", 3,
                        &calls, &content);
  CHECK(n == 2);
  cJSON_Delete(calls);
  free(content);
  /* not tool calls */
  CHECK(sm_toolcall_parse("just text", 4, &calls, &content) == 0 && !calls && !content);
  CHECK(sm_toolcall_parse("{\"foo\": 1}", 4, &calls, &content) == 0 && !calls);
  CHECK(sm_toolcall_parse("{\"name\":\"a\"} trailing", 4, &calls, &content) == 0 && !calls);
  CHECK(sm_toolcall_parse("<tool_call>{broken</tool_call>", 4, &calls, &content) == 0 && !calls);
  /* streaming: what may be sent before the text is finished */
  const sm_toolfmt *g = sm_toolfmt_by_name("generic");
  sm_tc_scan sc = {0};
  sm_toolfmt_scan(g, "Hello <tool", 11, false, NULL, &sc);
  CHECK(sc.safe == 6 && sc.n == 0); /* "<tool" may start a call */
  sm_toolfmt_scan(g, "  ", 2, false, NULL, &sc);
  CHECK(sc.safe == 0); /* JSON may still start */
  sm_toolfmt_scan(g, " {\"name\": \"f\", \"arguments\": {\"a\": [1,", 37, false, NULL, &sc);
  CHECK(sc.content.n == 1 && sc.n == 1 && sc.calls[0].name && !strcmp(sc.calls[0].name, "f") && !sc.calls[0].done);
  CHECK(sc.n == 1 && sc.calls[0].args.n == 9 && !memcmp(sc.calls[0].args.p, "{\"a\": [1,", 9));
  sm_toolfmt_scan(g, "Hi <b>", 6, false, NULL, &sc);
  CHECK(sc.safe == 6);
  sm_tc_scan_free(&sc);
}

static void test_metrics(void) {
  sm_metrics *m = sm_metrics_new();
  sm_metrics_request(m, "/v1/chat/completions", 200);
  sm_metrics_request(m, "/v1/chat/completions", 200);
  sm_metrics_request(m, "/v1/chat/completions", 400);
  sm_metrics_ttft(m, 0.03);
  sm_metrics_ttft(m, 100);
  sm_metrics_gauges g = {.kv_blocks_used = 3, .kv_blocks_total = 64};
  char *t = sm_metrics_render(m, &g);
  CHECK(strstr(t, "smelt_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"));
  CHECK(strstr(t, "smelt_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n"));
  CHECK(strstr(t, "smelt_time_to_first_token_seconds_bucket{le=\"0.025\"} 0\n"));
  CHECK(strstr(t, "smelt_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"));
  CHECK(strstr(t, "smelt_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
  CHECK(strstr(t, "smelt_time_to_first_token_seconds_count 2\n"));
  CHECK(strstr(t, "smelt_kv_cache_blocks_used 3\n") && strstr(t, "smelt_kv_cache_blocks_total 64\n"));
  free(t);
  sm_metrics_free(m);
}

/* issue 33: duplicate keys, reserved template variables, UTF-8 of output JSON */
static void test_hardening(void) {
  sm_api_request r;
  /* the same key twice in one object, at any depth, is refused (parsers disagree on which wins) */
  expect_err(SM_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":1,\"max_tokens\":9}",
             400, "");
  expect_err(SM_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"a\"}]}", 400, "");
  expect_err(SM_EP_COMPLETIONS, "{\"prompt\":\"a\",\"x\":{\"y\":[{\"k\":1,\"j\":2,\"k\":3}]}}", 400, "");
  /* equal keys in different objects are fine */
  if (parse_ok(SM_EP_COMPLETIONS, "{\"prompt\":\"a\",\"x\":{\"k\":1},\"y\":{\"k\":2}}", &r)) sm_api_request_free(&r);
  /* many distinct keys: refused only if one repeats (checked by sorting: fast) */
  char *big = malloc(200000);
  size_t o = (size_t)sprintf(big, "{\"prompt\":\"a\",\"x\":{");
  for (int i = 0; i < 10000; i++) o += (size_t)sprintf(big + o, "%s\"k%d\":1", i ? "," : "", i);
  strcpy(big + o, "}}");
  if (parse_ok(SM_EP_COMPLETIONS, big, &r)) sm_api_request_free(&r);
  strcpy(big + o, ",\"k1234\":2}}");
  expect_err(SM_EP_COMPLETIONS, big, 400, "");
  free(big);
  /* chat_template_kwargs may not replace what the server sets */
  expect_err(SM_EP_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"chat_template_kwargs\":{\"messages\":[]}}", 400,
             "chat_template_kwargs");
  expect_err(SM_EP_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"chat_template_kwargs\":"
             "{\"enable_thinking\":false,\"add_generation_prompt\":false}}",
             400, "chat_template_kwargs");
  if (parse_ok(
        SM_EP_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}",
        &r)) {
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(r.chat_template_kwargs, "enable_thinking")));
    sm_api_request_free(&r);
  }
  /* output JSON: invalid UTF-8 becomes U+FFFD, valid text is unchanged */
  static const struct {
    const char *in;
    size_t n;
    const char *out;
  } u[] = {
    {"abc", 3, "abc"},
    {"\xc3\xa9t\xc3\xa9", 5, "\xc3\xa9t\xc3\xa9"}, /* été */
    {"\xf0\x9f\xa9\xb7", 4, "\xf0\x9f\xa9\xb7"},   /* U+1FA77 */
    {"a\xff"
     "b",
     3,
     "a\xef\xbf\xbd"
     "b"},                                                         /* invalid byte */
    {"\xe2\x82", 2, "\xef\xbf\xbd\xef\xbf\xbd"},                   /* truncated sequence */
    {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},                   /* overlong '/' */
    {"\xed\xa0\x80x", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx"}, /* surrogate */
  };
  for (size_t i = 0; i < SM_ARRAY_LEN(u); i++) {
    sm_buf b = SM_BUF_INIT;
    sm_oai_put_utf8(&b, u[i].in, u[i].n);
    if (b.n != strlen(u[i].out) || memcmp(b.p, u[i].out, b.n)) {
      fprintf(stderr, "utf8 case %zu: got %zu bytes\n", i, b.n);
      fails++;
    }
    sm_buf_free(&b);
  }
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "text", "ok \xff\xfe end");
  sm_buf b = SM_BUF_INIT;
  sm_oai_print(j, &b);
  CHECK(!strcmp(sm_buf_str(&b), "{\"text\":\"ok \xef\xbf\xbd\xef\xbf\xbd end\"}"));
  sm_buf_free(&b);
  cJSON_Delete(j);
}

/* the base64 of image data: URLs (RFC 4648 vectors, optional padding, bad input refused) */
static void test_base64(void) {
  static const char *const enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy", "Zm9vYg"};
  static const char *const dec[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar", "foob"};
  for (size_t i = 0; i < sizeof enc / sizeof *enc; i++) {
    unsigned char *o = NULL;
    size_t n = 0;
    CHECK(sm_base64_decode(enc[i], strlen(enc[i]), &o, &n) && n == strlen(dec[i]) && !memcmp(o, dec[i], n));
    free(o);
  }
  static const char *const bad[] = {"Z",     "Zm9v!", "Zm 9v", "Zm9vY",    "-_-_",
                                    "Zg===", "Zg=",   "Zm8==", "Zm9v====", "Z==="};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    unsigned char *o = NULL;
    size_t n = 0;
    CHECK(!sm_base64_decode(bad[i], strlen(bad[i]), &o, &n));
  }
}

int main(void) {
  test_base64();
  test_hardening();
  test_parse();
  test_stop();
  test_toolcalls();
  test_metrics();
  if (fails) {
    fprintf(stderr, "%d checks failed\n", fails);
    return 1;
  }
  printf("server api: all checks passed\n");
  return 0;
}
