/* Fuzzes the request parser: thousands of mutated bodies (bit flips, byte insert/delete,
 * truncation, splices, type swaps) thrown at sm_api_parse for every endpoint. Each call must
 * either succeed or return a 4xx OpenAI error with a message; nothing may crash or leak
 * (run under -DSMELT_SANITIZE=ON for ASan/UBSan). The same mutated texts also go through the
 * JSON Schema -> grammar converter, the GBNF compiler (each must compile what the converter
 * makes, or fail with a message) and the tool-call scanners of every format, finished and
 * unfinished. usage: test_server_fuzz [iterations] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/grammar.h"
#include "engine/grammar_schema.h"
#include "server/api.h"
#include "server/toolcall.h"

static const char *seeds[] = {
  /* images: chat image_url parts, a Responses input_image, Anthropic image blocks (base64, url) */
  "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":"
  "\"data:image/png;base64,iVBORw0KGgo=\"}},{\"type\":\"text\",\"text\":\"what?\"}]}],\"max_tokens\":3}",
  "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"http://h/x.jpg\"},"
  "{\"type\":\"input_text\",\"text\":\"q\"}]}]}",
  "{\"model\":\"c\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
  "{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":\"image/jpeg\",\"data\":\"/9j/4AAQ\"}},"
  "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":\"https://h/y.png\"}},{\"type\":\"text\",\"text\":\"b\"},"
  "{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":\"r\"}]}]}",
  "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"hi\"}],"
  "\"temperature\":0.7,\"top_p\":0.9,\"n\":2,\"stop\":[\"a\",\"b\"],\"stream\":true,"
  "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":2,\"seed\":1}",
  "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]},{\"role\":\"assistant\","
  "\"content\":null,\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
  "\"arguments\":\"{\\\"a\\\":[1,2]}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"1\",\"content\":\"r\"}],"
  "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
  "\"tool_choice\":\"auto\",\"response_format\":{\"type\":\"json_object\"},\"max_completion_tokens\":5}",
  "{\"prompt\":\"once upon\",\"max_tokens\":7,\"logprobs\":3,\"echo\":false,\"stop\":\"\\n\"}",
  "{\"prompt\":[1,2,3,4],\"max_tokens\":1}",
  "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"q\"}]}],\"instructions\":\"i\","
  "\"max_output_tokens\":3,\"text\":{\"format\":{\"type\":\"text\"}},\"tools\":[{\"type\":\"function\",\"name\":\"g\"}]}",
  "{\"input\":\"hello \\u00e9\\ud83d\\ude00\",\"stream\":true}",
  "{\"model\":\"c\",\"max_tokens\":9,\"system\":[{\"type\":\"text\",\"text\":\"s\"}],\"messages\":[{\"role\":\"user\","
  "\"content\":\"q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\"},{\"type\":\"tool_use\","
  "\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"a\":1}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
  "\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"r\"}]}]}],\"tools\":[{\"name\":\"f\","
  "\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},\"stop_sequences\":[\"x\"],"
  "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":10}}",
  "{\"input\":[\"a\",[1,2]],\"encoding_format\":\"base64\"}",
  "{\"prompt\":[\"a\",\"b\"],\"grammar\":\"root ::= [a-z]{1,3} (\\\"x\\\" | r)*\\nr ::= \\\"q\\\"\",\"logit_bias\":{\"5\":-100,\"7\":3.5},"
  "\"n_probs\":2}",
  "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
  "{\"name\":\"n\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3},"
  "\"b\":{\"anyOf\":[{\"type\":\"integer\"},{\"$ref\":\"#/$defs/d\"}]}},\"required\":[\"a\"],\"$defs\":{\"d\":{\"enum\":[1,\"x\"]}}}}},"
  "\"tool_choice\":\"required\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"reasoning_effort\":\"low\"}",
  "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, \"}\"]}}\n</tool_call><tool_call>\n<function=g>\n<parameter=p>\n1\n"
  "</parameter>\n</function>\n</tool_call>[TOOL_CALLS][{\"name\":\"h\",\"arguments\":{}}]<|channel|>commentary "
  "to=functions.k <|constrain|>json<|message|>{}<|call|>```tool_code\nf(a=[1,'x'], b={'k': None})\n```"
  "<tool_call>g\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>",
};
/* grammars to mutate */
static const char *gseeds[] = {
  "root ::= obj\nobj ::= \"{\" ws (pair (\",\" ws pair)*)? \"}\"\npair ::= str \":\" ws [0-9]+\n"
  "str ::= \"\\\"\" [^\"\\\\]{0,5} \"\\\"\"\nws ::= [ \\t\\n]?  # c\n",
  "root ::= (\"a\" | [\\x41-\\x5A\\u00e9] | .){2,4} <[3]> x?\nx ::= \"\\U0001F600\"+",
};
static const char *tokens[] = {"null",    "true",        "false", "0",
                               "-1",      "1e309",       "\"\"",  "[]",
                               "{}",      "\"x\"",       "[[[[",  "}}}}",
                               "\\u0000", "\"\\ud800\"", "1.5",   "9999999999999999999999",
                               ",",       ":",           "\""};

static uint64_t rs = 0x1234567;
static uint32_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return (uint32_t)rs;
}

int main(int argc, char **argv) {
  long iters = argc > 1 ? atol(argv[1]) : 20000;
  size_t n_seeds = sizeof seeds / sizeof seeds[0];
  char *buf = malloc(1 << 16);
  long ok = 0, err = 0;
  for (long it = 0; it < iters; it++) {
    const char *sd = seeds[rnd() % n_seeds];
    size_t len = strlen(sd);
    memcpy(buf, sd, len);
    int muts = 1 + (int)(rnd() % 6);
    for (int m = 0; m < muts; m++) {
      size_t pos = len ? rnd() % len : 0;
      switch (rnd() % 7) {
        case 0:
          if (len) buf[pos] ^= (char)(1u << (rnd() % 8));
          break; /* bit flip */
        case 1:
          if (len) buf[pos] = (char)(rnd() & 0xff);
          break; /* random byte */
        case 2:
          if (len) {
            memmove(buf + pos, buf + pos + 1, len - pos - 1);
            len--;
          }
          break; /* delete */
        case 3:
          if (len < 60000) {
            memmove(buf + pos + 1, buf + pos, len - pos);
            buf[pos] = "{}[]\",:\\0a"[rnd() % 10];
            len++;
          }
          break;
        case 4: len = pos; break; /* truncate */
        case 5: {                 /* insert a JSON token */
          const char *t = tokens[rnd() % (sizeof tokens / sizeof tokens[0])];
          size_t tl = strlen(t);
          if (len + tl < 60000) {
            memmove(buf + pos + tl, buf + pos, len - pos);
            memcpy(buf + pos, t, tl);
            len += tl;
          }
          break;
        }
        case 6: { /* splice a chunk of another seed */
          const char *o = seeds[rnd() % n_seeds];
          size_t ol = strlen(o), a = rnd() % ol, l = rnd() % (ol - a + 1);
          if (len + l < 60000) {
            memmove(buf + pos + l, buf + pos, len - pos);
            memcpy(buf + pos, o + a, l);
            len += l;
          }
          break;
        }
      }
    }
    /* the same bytes as a schema (when they parse), as GBNF, and as generated text */
    {
      char *copy = malloc(len + 1);
      memcpy(copy, buf, len);
      copy[len] = 0;
      cJSON *sc = cJSON_Parse(copy);
      const cJSON *schema =
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(sc, "response_format"), "json_schema"), "schema");
      if (!schema) schema = sc;
      char *gb = NULL;
      if (schema && sm_schema_to_gbnf(schema, (rnd() & 1) != 0, &gb) == SMELT_OK) {
        sm_grammar *g = NULL;
        if (sm_grammar_compile(gb, &g) != SMELT_OK && !strstr(sm_errmsg(), "too large")) {
          fprintf(stderr, "the converter made a grammar that does not compile: %s\n%s\n", sm_errmsg(), gb);
          return 1;
        }
        if (g) {
          sm_grammar_state *gs = sm_grammar_state_new(g, NULL);
          sm_grammar_accept_bytes(gs, copy, len);
          sm_grammar_state_free(gs);
          sm_grammar_free(g);
        }
      }
      free(gb);
      cJSON_Delete(sc);
      const char *gsrc = gseeds[rnd() % (sizeof gseeds / sizeof gseeds[0])];
      char *gm = malloc(strlen(gsrc) + 2);
      size_t gl = strlen(gsrc);
      memcpy(gm, gsrc, gl + 1);
      if (gl) gm[rnd() % gl] = copy[len ? rnd() % len : 0] ? copy[len ? rnd() % len : 0] : 'x';
      sm_grammar *g = NULL;
      if (sm_grammar_compile(gm, &g) == SMELT_OK) {
        sm_grammar_state *gs = sm_grammar_state_new(g, NULL);
        sm_grammar_accept_bytes(gs, copy, len);
        sm_grammar_complete(gs);
        sm_grammar_state_free(gs);
        sm_grammar_free(g);
      } else if (!sm_errmsg()[0]) {
        fprintf(stderr, "grammar error without a message\n");
        return 1;
      }
      free(gm);
      static const char *const fmts[] = {"generic", "hermes",   "qwen3_coder", "llama3", "mistral",
                                         "harmony", "deepseek", "glm45",       "gemma"};
      sm_tc_scan tc = {0};
      for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        sm_toolfmt_scan(sm_toolfmt_by_name(fmts[f]), copy, len, true, NULL, &tc);
        sm_toolfmt_scan(sm_toolfmt_by_name(fmts[f]), copy, len ? rnd() % len : 0, false, NULL, &tc);
        if (tc.safe > tc.content.n) {
          fprintf(stderr, "%s: safe beyond the content\n", fmts[f]);
          return 1;
        }
      }
      sm_tc_scan_free(&tc);
      free(copy);
    }
    for (int k = 0; k < 5; k++) {
      sm_api_request r;
      sm_api_error e;
      /* not NUL-terminated on purpose: the parser must respect len */
      char *copy = malloc(len ? len : 1);
      memcpy(copy, buf, len);
      if (sm_api_parse((sm_ep_kind)k, copy, len, &r, &e)) {
        ok++;
        if (r.n < 1 || r.n > SM_API_MAX_N || r.n_stop > SM_API_MAX_STOP || r.top_logprobs > SM_API_MAX_TOP_LOGPROBS) {
          fprintf(stderr, "accepted out-of-range request\n");
          return 1;
        }
        sm_api_request_free(&r);
      } else {
        err++;
        if (e.http_status < 400 || e.http_status > 499 || !e.message[0]) {
          fprintf(stderr, "bad error: status %d message '%s'\n", e.http_status, e.message);
          return 1;
        }
        char *js = sm_api_error_json(&e);
        cJSON *j = cJSON_Parse(js);
        if (!j || !cJSON_GetObjectItem(j, "error")) {
          fprintf(stderr, "error body is not JSON: %s\n", js);
          return 1;
        }
        cJSON_Delete(j);
        free(js);
      }
      free(copy);
    }
  }
  free(buf);
  printf("fuzz: %ld iterations, %ld accepted, %ld rejected\n", iters, ok, err);
  return ok > 0 && err > 0 ? 0 : 1;
}
