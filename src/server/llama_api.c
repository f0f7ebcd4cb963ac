/* llama-server's utility endpoints of `smelt serve` (see llama_api.h): answered on the HTTP
 * thread from the tokenizer, the chat template and the scheduler's counters; no generation. */
#include "server/llama_api.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/chat.h"

#define FAIL(param, ...) \
  do { \
    sm_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__); \
    goto fail; \
  } while (0)

static cJSON *parse_body(const char *body, size_t len, sm_api_error *err) {
  cJSON *root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    sm_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json", "the body must be a JSON object");
    return NULL;
  }
  return root;
}

cJSON *sm_llama_tokenize(const sm_oai *o, const char *body, size_t len, sm_api_error *err) {
  cJSON *root = parse_body(body, len, err), *out = NULL;
  if (!root) return NULL;
  const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
  const cJSON *add = cJSON_GetObjectItemCaseSensitive(root, "add_special");
  const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(root, "with_pieces");
  if (!cJSON_IsString(content)) FAIL("content", "'content' must be a string");
  if (add && !cJSON_IsBool(add)) FAIL("add_special", "'add_special' must be a boolean");
  if (pieces && !cJSON_IsBool(pieces)) FAIL("with_pieces", "'with_pieces' must be a boolean");
  int32_t *ids = NULL;
  size_t n = 0;
  if (smelt_tokenize(o->tok, content->valuestring, strlen(content->valuestring), cJSON_IsTrue(add), &ids, &n))
    FAIL("content", "could not tokenize: %s", sm_errmsg());
  out = cJSON_CreateObject();
  cJSON *arr = cJSON_AddArrayToObject(out, "tokens");
  sm_buf pb = SM_BUF_INIT;
  for (size_t i = 0; i < n; i++) {
    if (!cJSON_IsTrue(pieces)) {
      cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
      continue;
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "id", ids[i]);
    sm_tok_piece_bytes(o->tok, ids[i], &pb);
    sm_buf s = SM_BUF_INIT;
    sm_oai_put_utf8(&s, pb.p ? pb.p : "", pb.n);
    if (s.n == pb.n) cJSON_AddStringToObject(e, "piece", sm_buf_str(&s));
    else { /* not valid UTF-8 on its own (a byte-level piece): its bytes */
      cJSON *b = cJSON_AddArrayToObject(e, "piece");
      for (size_t k = 0; k < pb.n; k++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)pb.p[k]));
    }
    sm_buf_free(&s);
    cJSON_AddItemToArray(arr, e);
  }
  sm_buf_free(&pb);
  free(ids);
fail:
  cJSON_Delete(root);
  return out;
}

cJSON *sm_llama_detokenize(const sm_oai *o, const char *body, size_t len, sm_api_error *err) {
  cJSON *root = parse_body(body, len, err), *out = NULL;
  int32_t *ids = NULL;
  if (!root) return NULL;
  const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
  if (!cJSON_IsArray(toks)) FAIL("tokens", "'tokens' must be an array of token ids");
  int n = cJSON_GetArraySize(toks), i = 0;
  ids = sm_xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  const cJSON *t;
  cJSON_ArrayForEach(t, toks) {
    if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int32_t)t->valuedouble || t->valuedouble < 0 ||
        t->valuedouble >= o->vocab)
      FAIL("tokens", "'tokens[%d]' is not a token id of this model (0..%d)", i, o->vocab - 1);
    ids[i++] = (int32_t)t->valuedouble;
  }
  char *text = NULL;
  size_t tl = 0;
  if (sm_tok_decode(o->tok, ids, (size_t)n, false, &text, &tl)) FAIL("tokens", "could not detokenize: %s", sm_errmsg());
  out = cJSON_CreateObject();
  cJSON_AddStringToObject(out, "content", text ? text : "");
  free(text);
fail:
  free(ids);
  cJSON_Delete(root);
  return out;
}

cJSON *sm_llama_apply_template(const sm_oai *o, const char *body, size_t len, sm_api_error *err) {
  /* the chat-completions request rules: same messages, tools and chat_template_kwargs handling */
  sm_api_request req;
  if (!sm_api_parse(SM_EP_CHAT, body, len, &req, err)) return NULL;
  char *text = NULL;
  cJSON *out = NULL;
  if (sm_chat_apply(o->tok, req.messages, req.tools, true, req.chat_template_kwargs, &text) != SMELT_OK) {
    sm_api_error_set(err, 400, "invalid_request_error", "messages", NULL, "could not apply the chat template: %s",
                     sm_errmsg());
  } else {
    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", text);
  }
  free(text);
  sm_api_request_free(&req);
  return out;
}

cJSON *sm_llama_props(const sm_oai *o) {
  cJSON *r = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(r, "default_generation_settings");
  cJSON_AddNumberToObject(d, "n_ctx", o->ctx);
  cJSON *p = cJSON_AddObjectToObject(d, "params");
  cJSON_AddNumberToObject(p, "temperature", o->gen_temperature > 0 ? o->gen_temperature : 1.0);
  cJSON_AddNumberToObject(p, "top_p", o->gen_top_p > 0 ? o->gen_top_p : 1.0);
  cJSON_AddNumberToObject(p, "top_k", o->gen_top_k);
  cJSON_AddNumberToObject(r, "total_slots", o->parallel);
  cJSON_AddStringToObject(r, "model_alias", o->model_id);
  cJSON_AddStringToObject(r, "model_path", o->model_path ? o->model_path : "");
  const char *t = sm_tok_chat_template(o->tok, NULL);
  cJSON_AddStringToObject(r, "chat_template", t ? t : "");
  cJSON_AddStringToObject(r, "tool_call_format", o->tfmt ? o->tfmt->name : "generic");
  cJSON *m = cJSON_AddObjectToObject(r, "modalities");
  cJSON_AddFalseToObject(m, "vision");
  cJSON_AddFalseToObject(m, "audio");
  cJSON_AddStringToObject(r, "build_info", "smelt-" SMELT_VERSION);
  return r;
}

cJSON *sm_llama_slots(const sm_oai *o, sm_sched *s) {
  cJSON *arr = cJSON_CreateArray();
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < o->parallel; i++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "id", i);
    cJSON_AddNumberToObject(e, "n_ctx", o->ctx);
    cJSON_AddBoolToObject(e, "is_processing", s->slot_busy[i]);
    cJSON_AddItemToArray(arr, e);
  }
  pthread_mutex_unlock(&s->mu);
  return arr;
}
