/* Fuzzes the request parser: thousands of mutated bodies (bit flips, byte insert/delete,
 * truncation, splices, type swaps) thrown at sm_api_parse for every endpoint. Each call must
 * either succeed or return a 4xx OpenAI error with a message; nothing may crash or leak
 * (run under -DSMELT_SANITIZE=ON for ASan/UBSan). usage: test_server_fuzz [iterations] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/api.h"

static const char *seeds[] = {
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
};
static const char *tokens[] = {"null", "true", "false", "0", "-1", "1e309", "\"\"", "[]", "{}", "\"x\"", "[[[[",
                               "}}}}", "\\u0000", "\"\\ud800\"", "1.5", "9999999999999999999999", ",", ":", "\""};

static uint64_t rs = 0x1234567;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }

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
      case 0: if (len) buf[pos] ^= (char)(1u << (rnd() % 8)); break;               /* bit flip */
      case 1: if (len) buf[pos] = (char)(rnd() & 0xff); break;                      /* random byte */
      case 2: if (len) { memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; } break; /* delete */
      case 3: if (len < 60000) { memmove(buf + pos + 1, buf + pos, len - pos); buf[pos] = "{}[]\",:\\0a"[rnd() % 10]; len++; } break;
      case 4: len = pos; break;                                                     /* truncate */
      case 5: { /* insert a JSON token */
        const char *t = tokens[rnd() % (sizeof tokens / sizeof tokens[0])];
        size_t tl = strlen(t);
        if (len + tl < 60000) { memmove(buf + pos + tl, buf + pos, len - pos); memcpy(buf + pos, t, tl); len += tl; }
        break;
      }
      case 6: { /* splice a chunk of another seed */
        const char *o = seeds[rnd() % n_seeds];
        size_t ol = strlen(o), a = rnd() % ol, l = rnd() % (ol - a + 1);
        if (len + l < 60000) { memmove(buf + pos + l, buf + pos, len - pos); memcpy(buf + pos, o + a, l); len += l; }
        break;
      }
      }
    }
    for (int k = 0; k < 3; k++) {
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
        if (!j || !cJSON_GetObjectItem(j, "error")) { fprintf(stderr, "error body is not JSON: %s\n", js); return 1; }
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
