/* Anthropic Messages API of `smelt serve` (see anthropic.h): POST /v1/messages (content blocks,
 * system, tools and tool_choice, thinking, image blocks, streaming events) and
 * /v1/messages/count_tokens.
 * A request becomes the same normalized chat request as /v1/chat/completions, so templates,
 * tool-call formats, grammars and reasoning are shared. */
#include "server/anthropic.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/image_input.h"
#include "tokenizer/chat.h"
#include "vision/vision.h"

#define FAIL(param, ...) \
  do { \
    sm_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__); \
    return false; \
  } while (0)

char *sm_anth_error_json(const sm_api_error *e) {
  cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
  cJSON_AddStringToObject(root, "type", "error");
  const char *t = e->http_status == 401 ? "authentication_error"
                : e->http_status == 404 ? "not_found_error"
                : e->http_status == 413 ? "request_too_large"
                : e->http_status == 429 ? "rate_limit_error"
                : e->http_status == 503 ? "overloaded_error"
                : e->http_status >= 500 ? "api_error"
                                        : "invalid_request_error";
  cJSON_AddStringToObject(o, "type", t);
  if (e->param[0]) {
    char m[700];
    snprintf(m, sizeof m, "%s: %s", e->param, e->message);
    cJSON_AddStringToObject(o, "message", m);
  } else {
    cJSON_AddStringToObject(o, "message", e->message);
  }
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

/* text of a string or of an array of text blocks; NULL (and err) on other blocks */
static bool text_of(const cJSON *c, const char *param, sm_buf *out, sm_api_error *err) {
  if (cJSON_IsString(c)) {
    sm_buf_puts(out, c->valuestring);
    return true;
  }
  if (!cJSON_IsArray(c)) FAIL(param, "content must be a string or an array of content blocks");
  const cJSON *b;
  cJSON_ArrayForEach(b, c) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(b, "type"), *tx = cJSON_GetObjectItemCaseSensitive(b, "text");
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx))
      FAIL(param, "only text blocks are supported here");
    sm_buf_puts(out, tx->valuestring);
  }
  return true;
}

static void add_msg(cJSON *arr, const char *role, const char *content) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "role", role);
  cJSON_AddStringToObject(m, "content", content);
  cJSON_AddItemToArray(arr, m);
}

/* An image block's source as the URL the image loader takes: {type: "base64", media_type, data} as a
 * data: URL, {type: "url", url} as it is (fetched only where the server allows it); NULL and err
 * otherwise */
static char *image_source(const cJSON *b, const char *param, sm_api_error *err) {
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(b, "source");
  const cJSON *ty = cJSON_IsObject(src) ? cJSON_GetObjectItemCaseSensitive(src, "type") : NULL;
  if (!cJSON_IsString(ty)) {
    sm_api_error_set(err, 400, "invalid_request_error", param, NULL,
                     "%s: an image block needs a 'source' with a 'type'", param);
    return NULL;
  }
  if (!strcmp(ty->valuestring, "base64")) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(src, "media_type"),
                *d = cJSON_GetObjectItemCaseSensitive(src, "data");
    if (!cJSON_IsString(mt) || !cJSON_IsString(d)) {
      sm_api_error_set(err, 400, "invalid_request_error", param, NULL,
                       "%s: a base64 image source needs 'media_type' and 'data'", param);
      return NULL;
    }
    sm_buf u = SM_BUF_INIT;
    sm_buf_printf(&u, "data:%.100s;base64,", mt->valuestring);
    sm_buf_puts(&u, d->valuestring);
    return sm_buf_take(&u);
  }
  if (!strcmp(ty->valuestring, "url")) {
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(src, "url");
    if (cJSON_IsString(u)) return sm_xstrdup(u->valuestring);
    sm_api_error_set(err, 400, "invalid_request_error", param, NULL, "%s: a url image source needs 'url'", param);
    return NULL;
  }
  sm_api_error_set(err, 400, "invalid_request_error", param, NULL,
                   "%s: image source type '%.40s' is not supported (base64, url)", param, ty->valuestring);
  return NULL;
}

/* a user turn's text and images as content parts ({type: "image"}, {type: "text", text}), as the
 * vision-language templates render them; text alone stays a string */
static void add_user(cJSON *arr, sm_buf *text, cJSON **parts) {
  if (*parts) {
    if (text->n) {
      cJSON *t = cJSON_CreateObject();
      cJSON_AddStringToObject(t, "type", "text");
      cJSON_AddStringToObject(t, "text", sm_buf_str(text));
      cJSON_AddItemToArray(*parts, t);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddItemToObject(m, "content", *parts);
    cJSON_AddItemToArray(arr, m);
    *parts = NULL;
  } else if (text->n) {
    add_msg(arr, "user", sm_buf_str(text));
  }
  sm_buf_clear(text);
}

static bool convert_message(const cJSON *m, int idx, cJSON *out, sm_api_request *r, sm_api_error *err) {
  char param[48];
  snprintf(param, sizeof param, "messages[%d]", idx);
  if (!cJSON_IsObject(m)) FAIL(param, "%s must be an object", param);
  const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"),
              *content = cJSON_GetObjectItemCaseSensitive(m, "content");
  if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
    FAIL(param, "%s.role must be 'user' or 'assistant'", param);
  bool user = role->valuestring[0] == 'u';
  if (cJSON_IsString(content)) {
    add_msg(out, role->valuestring, content->valuestring);
    return true;
  }
  if (!cJSON_IsArray(content)) FAIL(param, "%s.content must be a string or an array of content blocks", param);
  sm_buf text = SM_BUF_INIT, thinking = SM_BUF_INIT;
  cJSON *calls = NULL, *parts = NULL; /* parts: a user turn with images */
  const cJSON *b;
  cJSON_ArrayForEach(b, content) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(b, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
    if (!strcmp(t, "image") && user) {
      char *url = r->n_images < SM_API_MAX_IMAGES ? image_source(b, param, err) : NULL;
      if (!url) {
        if (r->n_images >= SM_API_MAX_IMAGES)
          sm_api_error_set(err, 400, "invalid_request_error", param, NULL, "%s: at most %d images a request", param,
                           SM_API_MAX_IMAGES);
        sm_buf_free(&text);
        sm_buf_free(&thinking);
        cJSON_Delete(parts);
        return false;
      }
      r->image_urls = sm_xrealloc(r->image_urls, sizeof(char *) * (size_t)(r->n_images + 1));
      r->image_urls[r->n_images++] = url;
      if (!parts) parts = cJSON_CreateArray();
      if (text.n) { /* the text before the image, in order */
        cJSON *tp = cJSON_CreateObject();
        cJSON_AddStringToObject(tp, "type", "text");
        cJSON_AddStringToObject(tp, "text", sm_buf_str(&text));
        cJSON_AddItemToArray(parts, tp);
        sm_buf_clear(&text);
      }
      cJSON *ip = cJSON_CreateObject();
      cJSON_AddStringToObject(ip, "type", "image");
      cJSON_AddItemToArray(parts, ip);
    } else if (!strcmp(t, "text")) {
      const cJSON *tx = cJSON_GetObjectItemCaseSensitive(b, "text");
      if (!cJSON_IsString(tx)) {
        sm_buf_free(&text);
        sm_buf_free(&thinking);
        cJSON_Delete(calls);
        cJSON_Delete(parts);
        FAIL(param, "a text block needs 'text'");
      }
      sm_buf_puts(&text, tx->valuestring);
    } else if (!strcmp(t, "thinking") && !user) {
      const cJSON *tx = cJSON_GetObjectItemCaseSensitive(b, "thinking");
      if (cJSON_IsString(tx)) sm_buf_puts(&thinking, tx->valuestring);
    } else if (!strcmp(t, "redacted_thinking") && !user) {
      /* nothing to show the model */
    } else if (!strcmp(t, "tool_use") && !user) {
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id"), *nm = cJSON_GetObjectItemCaseSensitive(b, "name");
      const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "input");
      if (!cJSON_IsString(nm)) {
        sm_buf_free(&text);
        sm_buf_free(&thinking);
        cJSON_Delete(calls);
        FAIL(param, "a tool_use block needs 'name'");
      }
      if (!calls) calls = cJSON_CreateArray();
      cJSON *c = cJSON_CreateObject(), *fn;
      if (cJSON_IsString(id)) cJSON_AddStringToObject(c, "id", id->valuestring);
      cJSON_AddStringToObject(c, "type", "function");
      fn = cJSON_AddObjectToObject(c, "function");
      cJSON_AddStringToObject(fn, "name", nm->valuestring);
      cJSON_AddItemToObject(fn, "arguments", cJSON_IsObject(in) ? cJSON_Duplicate(in, 1) : cJSON_CreateObject());
      cJSON_AddItemToArray(calls, c);
    } else if (!strcmp(t, "tool_result") && user) {
      /* text (and images) so far are a user turn; the result is a tool message */
      add_user(out, &text, &parts);
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id"),
                  *rc = cJSON_GetObjectItemCaseSensitive(b, "content");
      sm_buf res = SM_BUF_INIT;
      if (rc && !cJSON_IsNull(rc) && !text_of(rc, param, &res, err)) {
        sm_buf_free(&res);
        sm_buf_free(&text);
        sm_buf_free(&thinking);
        return false;
      }
      cJSON *tm = cJSON_CreateObject();
      cJSON_AddStringToObject(tm, "role", "tool");
      cJSON_AddStringToObject(tm, "content", sm_buf_str(&res));
      if (cJSON_IsString(id)) cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
      cJSON_AddItemToArray(out, tm);
      sm_buf_free(&res);
    } else {
      sm_buf_free(&text);
      sm_buf_free(&thinking);
      cJSON_Delete(calls);
      cJSON_Delete(parts);
      FAIL(param, "content block type '%.40s' is not supported in a%s %s message", t, user ? "" : "n",
           role->valuestring);
    }
  }
  if (user) {
    add_user(out, &text, &parts);
  } else {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    cJSON_AddStringToObject(a, "content", sm_buf_str(&text));
    if (thinking.n) cJSON_AddStringToObject(a, "reasoning_content", sm_buf_str(&thinking));
    if (calls) cJSON_AddItemToObject(a, "tool_calls", calls);
    cJSON_AddItemToArray(out, a);
  }
  sm_buf_free(&text);
  sm_buf_free(&thinking);
  return true;
}

bool sm_anth_parse_fields(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
  if (!cJSON_IsNumber(mt) || mt->valuedouble < 1 || mt->valuedouble > 1e9 || mt->valuedouble != (int)mt->valuedouble)
    FAIL("max_tokens", "'max_tokens' is required and must be a positive integer");
  r->max_tokens = (int)mt->valuedouble;
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  if (!cJSON_IsArray(msgs) || !msgs->child) FAIL("messages", "'messages' must be a non-empty array");
  r->messages = cJSON_CreateArray();
  const cJSON *sys = cJSON_GetObjectItemCaseSensitive(root, "system");
  if (sys && !cJSON_IsNull(sys)) {
    sm_buf s = SM_BUF_INIT;
    if (!text_of(sys, "system", &s, err)) {
      sm_buf_free(&s);
      return false;
    }
    add_msg(r->messages, "system", sm_buf_str(&s));
    sm_buf_free(&s);
  }
  int i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) if (!convert_message(m, i++, r->messages, r, err)) return false;
  /* stop_sequences */
  const cJSON *ss = cJSON_GetObjectItemCaseSensitive(root, "stop_sequences");
  if (ss && !cJSON_IsNull(ss)) {
    if (!cJSON_IsArray(ss)) FAIL("stop_sequences", "'stop_sequences' must be an array of strings");
    const cJSON *x;
    cJSON_ArrayForEach(x, ss) {
      if (!cJSON_IsString(x)) FAIL("stop_sequences", "'stop_sequences' entries must be strings");
      if (r->n_stop >= SM_API_MAX_STOP) FAIL("stop_sequences", "at most %d stop sequences", SM_API_MAX_STOP);
      if (x->valuestring[0]) r->stop[r->n_stop++] = sm_xstrdup(x->valuestring);
    }
  }
  /* tools: {name, description, input_schema} */
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
  const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
  r->parallel_tool_calls = true;
  if (tc && !cJSON_IsNull(tc)) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(ty))
      FAIL("tool_choice", "'tool_choice' must be an object with a 'type'");
    const char *t = ty->valuestring;
    if (!strcmp(t, "auto")) r->tool_choice = SM_TOOLS_AUTO;
    else if (!strcmp(t, "any")) r->tool_choice = SM_TOOLS_REQUIRED;
    else if (!strcmp(t, "none")) r->tool_choice = SM_TOOLS_NONE;
    else if (!strcmp(t, "tool")) {
      const cJSON *nm = cJSON_GetObjectItemCaseSensitive(tc, "name");
      if (!cJSON_IsString(nm)) FAIL("tool_choice", "tool_choice 'tool' needs 'name'");
      r->tool_choice = SM_TOOLS_NAMED;
      r->tool_name = sm_xstrdup(nm->valuestring);
    } else FAIL("tool_choice", "tool_choice type must be auto, any, tool or none");
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(tc, "disable_parallel_tool_use");
    if (cJSON_IsTrue(dp)) r->parallel_tool_calls = false;
  }
  if (tools && !cJSON_IsNull(tools)) {
    if (!cJSON_IsArray(tools)) FAIL("tools", "'tools' must be an array");
    cJSON *arr = cJSON_CreateArray();
    bool found = r->tool_choice != SM_TOOLS_NAMED;
    int k = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
      const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name"),
                  *sc = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
      const cJSON *ds = cJSON_GetObjectItemCaseSensitive(t, "description");
      if (!cJSON_IsString(nm)) {
        cJSON_Delete(arr);
        FAIL("tools", "tools[%d].name must be a string", k);
      }
      if (sc && !cJSON_IsObject(sc)) {
        cJSON_Delete(arr);
        FAIL("tools", "tools[%d].input_schema must be an object", k);
      }
      found |= r->tool_name && !strcmp(r->tool_name, nm->valuestring);
      cJSON *o = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(o, "function");
      cJSON_AddStringToObject(o, "type", "function");
      cJSON_AddStringToObject(fn, "name", nm->valuestring);
      if (cJSON_IsString(ds)) cJSON_AddStringToObject(fn, "description", ds->valuestring);
      cJSON_AddItemToObject(fn, "parameters", sc ? cJSON_Duplicate(sc, 1) : cJSON_Parse("{\"type\":\"object\"}"));
      cJSON_AddItemToArray(arr, o);
      k++;
    }
    if (!found) {
      cJSON_Delete(arr);
      FAIL("tool_choice", "tool_choice names '%.60s', which is not in 'tools'", r->tool_name);
    }
    if (k && r->tool_choice != SM_TOOLS_NONE) r->tools = arr;
    else cJSON_Delete(arr);
  }
  if ((r->tool_choice == SM_TOOLS_REQUIRED || r->tool_choice == SM_TOOLS_NAMED) && !r->tools)
    FAIL("tool_choice", "tool_choice '%s' requires tools", r->tool_choice == SM_TOOLS_NAMED ? "tool" : "any");
  /* thinking: {type: enabled|disabled} -> enable_thinking for the template */
  const cJSON *th = cJSON_GetObjectItemCaseSensitive(root, "thinking");
  const cJSON *thty = cJSON_IsObject(th) ? cJSON_GetObjectItemCaseSensitive(th, "type") : NULL;
  if (cJSON_IsString(thty)) {
    if (!r->chat_template_kwargs) r->chat_template_kwargs = cJSON_CreateObject();
    if (!cJSON_GetObjectItemCaseSensitive(r->chat_template_kwargs, "enable_thinking"))
      cJSON_AddBoolToObject(r->chat_template_kwargs, "enable_thinking", !strcmp(thty->valuestring, "enabled"));
  }
  return true;
}

/* ------------------------------------------------------------------ responses */

static const char *stop_reason(const sm_job *j, const sm_choice *c, const sm_oai_final *f) {
  if (c->finish == SM_FIN_LENGTH) return "max_tokens";
  if (f->tool_calls) return "tool_use";
  if (c->stop_hit >= 0) return "stop_sequence";
  return "end_turn";
}

static cJSON *usage(const sm_job *j) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "input_tokens", j->n_prompt - j->n_cached);
  cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
  cJSON_AddNumberToObject(u, "cache_read_input_tokens", j->n_cached);
  cJSON_AddNumberToObject(u, "output_tokens", j->ch[0].n_gen);
  return u;
}

static cJSON *skeleton(const sm_oai *o, const sm_job *j) {
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "type", "message");
  cJSON_AddStringToObject(r, "role", "assistant");
  cJSON_AddStringToObject(r, "model", o->model_id);
  cJSON_AddArrayToObject(r, "content");
  return r;
}

cJSON *sm_anth_response(const sm_oai *o, sm_job *j) {
  cJSON *r = skeleton(o, j), *content = cJSON_GetObjectItemCaseSensitive(r, "content");
  sm_choice *c = &j->ch[0];
  sm_oai_final f;
  sm_oai_finalize(j, 0, &f);
  if (f.reasoning) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "thinking");
    cJSON_AddStringToObject(b, "thinking", f.reasoning);
    cJSON_AddStringToObject(b, "signature", "");
    cJSON_AddItemToArray(content, b);
  }
  if (f.content && (f.content[0] || !f.tool_calls)) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "text");
    cJSON_AddStringToObject(b, "text", f.content);
    cJSON_AddItemToArray(content, b);
  }
  const cJSON *tc;
  cJSON_ArrayForEach(tc, f.tool_calls) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    cJSON *b = cJSON_CreateObject();
    char id[80];
    snprintf(id, sizeof id, "toolu_%s", cJSON_GetObjectItemCaseSensitive(tc, "id")->valuestring + 5);
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", id);
    cJSON_AddStringToObject(b, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
    cJSON *in = cJSON_Parse(cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring);
    cJSON_AddItemToObject(b, "input", cJSON_IsObject(in) ? in : (cJSON_Delete(in), cJSON_CreateObject()));
    cJSON_AddItemToArray(content, b);
  }
  cJSON_AddStringToObject(r, "stop_reason", stop_reason(j, c, &f));
  if (c->stop_hit >= 0 && c->finish != SM_FIN_LENGTH && !f.tool_calls)
    cJSON_AddStringToObject(r, "stop_sequence", j->req.stop[c->stop_hit]);
  else cJSON_AddNullToObject(r, "stop_sequence");
  cJSON_AddItemToObject(r, "usage", usage(j));
  free(f.content);
  free(f.reasoning);
  cJSON_Delete(f.tool_calls);
  return r;
}

cJSON *sm_anth_count_tokens(const sm_oai *o, const char *body, size_t len, sm_api_error *err) {
  /* max_tokens is not part of a count_tokens request */
  cJSON *root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    sm_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json", "the body must be a JSON object");
    return NULL;
  }
  if (!cJSON_GetObjectItemCaseSensitive(root, "max_tokens")) cJSON_AddNumberToObject(root, "max_tokens", 1);
  char *b = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  sm_api_request req;
  bool ok = sm_api_parse(SM_EP_MESSAGES, b, strlen(b), &req, err);
  free(b);
  if (!ok) return NULL;
  char *text = NULL;
  cJSON *out = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  /* images count as the tokens their placeholders expand to */
  sm_vimage **imgs = NULL;
  sm_mm_span *spans = NULL;
  if (req.n_images && !sm_request_images(o->vision, o->model_id, o->vision_note, &o->images, &req, &imgs, err)) {
    sm_api_request_free(&req);
    return NULL;
  }
  smelt_status st = sm_chat_apply(o->tok, req.messages, req.tools, true, req.chat_template_kwargs, &text);
  if (!st && req.n_images) {
    int ni = 0;
    st = sm_vision_tokenize(o->vision, o->tok, text, false, imgs, req.n_images, &ids, &ni, &spans);
    n = (size_t)(ni > 0 ? ni : 0);
    if (!st)
      for (int i = 0, ns = sm_vision_span_count(imgs, req.n_images); i < ns; i++) sm_vimage_unref(spans[i].img);
  } else if (!st) {
    st = smelt_tokenize(o->tok, text, strlen(text), false, &ids, &n);
  }
  if (st) {
    sm_api_error_set(err, 400, "invalid_request_error", "messages", NULL, "could not render the prompt: %s",
                     sm_errmsg());
  } else {
    out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "input_tokens", (double)n);
  }
  for (int i = 0; imgs && i < req.n_images; i++) sm_vimage_unref(imgs[i]);
  free(imgs);
  free(spans);
  free(text);
  free(ids);
  sm_api_request_free(&req);
  return out;
}

/* ------------------------------------------------------------------ streaming */

static void event(sm_sse *st, const char *type, cJSON *j) {
  /* "type" first, as the API writes it */
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "type", type);
  while (j->child) {
    cJSON *it = j->child;
    char *k = sm_xstrdup(it->string);
    cJSON_DetachItemViaPointer(j, it);
    cJSON_AddItemToObject(o, k, it);
    free(k);
  }
  cJSON_Delete(j);
  sm_buf_puts(&st->out, "event: ");
  sm_buf_puts(&st->out, type);
  sm_buf_puts(&st->out, "\ndata: ");
  sm_oai_print(o, &st->out);
  cJSON_Delete(o);
  sm_buf_puts(&st->out, "\n\n");
}

static void block_start(sm_sse *st, cJSON *block) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddNumberToObject(e, "index", st->next_index);
  cJSON_AddItemToObject(e, "content_block", block);
  event(st, "content_block_start", e);
}

static void block_delta(sm_sse *st, int index, const char *dtype, const char *key, const char *s, size_t n) {
  cJSON *e = cJSON_CreateObject(), *d;
  cJSON_AddNumberToObject(e, "index", index);
  d = cJSON_AddObjectToObject(e, "delta");
  cJSON_AddStringToObject(d, "type", dtype);
  char *t = sm_xmalloc(n + 1);
  memcpy(t, s, n);
  t[n] = 0;
  cJSON_AddStringToObject(d, key, t);
  free(t);
  event(st, "content_block_delta", e);
}

static void block_stop(sm_sse *st, int index) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddNumberToObject(e, "index", index);
  event(st, "content_block_stop", e);
}

/* st->rs_index: the open thinking block, st->msg_index: the open text block; tool blocks are
 * opened as their calls appear (c->calls_sent), and only one block is open at a time */
static void close_open(sm_sse *st) {
  if (st->rs_index >= 0) {
    block_stop(st, st->rs_index);
    st->rs_index = -2;
  }
  if (st->msg_index >= 0) {
    block_stop(st, st->msg_index);
    st->msg_index = -2;
  }
}

void sm_anth_sse_produce(sm_sse *st) {
  const sm_oai *o = st->o;
  sm_job *j = st->j;
  sm_choice *c = &j->ch[0];
  if (!st->head_sent) {
    st->head_sent = true;
    cJSON *m = skeleton(o, j), *e = cJSON_CreateObject();
    cJSON_AddNullToObject(m, "stop_reason");
    cJSON_AddNullToObject(m, "stop_sequence");
    cJSON *u = cJSON_AddObjectToObject(m, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "output_tokens", 0);
    cJSON_AddItemToObject(e, "message", m);
    event(st, "message_start", e);
  }
  if (j->failed) {
    sm_api_error er;
    sm_api_error_set(&er, j->fail_status ? j->fail_status : 500, "server_error", NULL, NULL, "%s", j->errmsg);
    char *b = sm_anth_error_json(&er);
    sm_buf_puts(&st->out, "event: error\ndata: ");
    sm_oai_put_utf8(&st->out, b, strlen(b));
    sm_buf_puts(&st->out, "\n\n");
    free(b);
    st->finished = true;
    return;
  }
  bool final = c->finish != SM_FIN_NONE;
  sm_view v = {0};
  sm_view_build(j, c, &v);
  if (v.reasoning_safe > c->rsent && st->rs_index != -2) {
    if (st->rs_index < 0) {
      cJSON *b = cJSON_CreateObject();
      cJSON_AddStringToObject(b, "type", "thinking");
      cJSON_AddStringToObject(b, "thinking", "");
      st->rs_index = st->next_index;
      block_start(st, b);
      st->next_index++;
    }
    block_delta(st, st->rs_index, "thinking_delta", "thinking", v.reasoning.p + c->rsent, v.reasoning_safe - c->rsent);
    c->rsent = v.reasoning_safe;
  }
  /* text: as for chat, blanks around a possible tool call wait */
  const char *ct = sm_buf_str(&v.tc.content);
  size_t cs = final ? v.tc.content.n : v.tc.safe, start = 0;
  if (j->tool_mode) {
    while (start < cs && (ct[start] == ' ' || ct[start] == '\n' || ct[start] == '\t' || ct[start] == '\r')) start++;
    if (!final || v.tc.n)
      while (cs > start && (ct[cs - 1] == ' ' || ct[cs - 1] == '\n' || ct[cs - 1] == '\t' || ct[cs - 1] == '\r')) cs--;
  }
  if (c->sent < start && cs > start) c->sent = start;
  if (cs > c->sent && st->msg_index != -2) {
    if (st->msg_index < 0) {
      if (st->rs_index >= 0) {
        block_stop(st, st->rs_index);
        st->rs_index = -2;
      }
      cJSON *b = cJSON_CreateObject();
      cJSON_AddStringToObject(b, "type", "text");
      cJSON_AddStringToObject(b, "text", "");
      st->msg_index = st->next_index;
      block_start(st, b);
      st->next_index++;
    }
    block_delta(st, st->msg_index, "text_delta", "text", ct + c->sent, cs - c->sent);
    c->sent = cs;
  }
  for (int k = 0; k < v.tc.n; k++) {
    sm_tc_call *tc = &v.tc.calls[k];
    if (k >= c->calls_sent) {
      if (!tc->name || k != c->calls_sent) break;
      if (c->calls_sent > 0) block_stop(st, st->next_index - 1);
      else close_open(st);
      if (c->args_cap <= k) {
        c->args_cap = k + 8;
        c->args_sent = sm_xrealloc(c->args_sent, sizeof(size_t) * (size_t)c->args_cap);
      }
      c->args_sent[k] = 0;
      cJSON *b = cJSON_CreateObject();
      char cid[64], id[80];
      sm_oai_call_id(j, 0, k, cid, sizeof cid);
      snprintf(id, sizeof id, "toolu_%s", cid + 5);
      cJSON_AddStringToObject(b, "type", "tool_use");
      cJSON_AddStringToObject(b, "id", id);
      cJSON_AddStringToObject(b, "name", tc->name);
      cJSON_AddObjectToObject(b, "input");
      block_start(st, b);
      st->next_index++;
      c->calls_sent++;
    }
    if (k == c->calls_sent - 1 && tc->args.n > c->args_sent[k]) {
      block_delta(st, st->next_index - 1, "input_json_delta", "partial_json", tc->args.p + c->args_sent[k],
                  tc->args.n - c->args_sent[k]);
      c->args_sent[k] = tc->args.n;
    }
  }
  sm_view_free(&v);
  if (!j->done) return;
  if (c->calls_sent > 0) block_stop(st, st->next_index - 1);
  else close_open(st);
  sm_oai_final f;
  sm_oai_finalize(j, 0, &f);
  cJSON *e = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(e, "delta");
  cJSON_AddStringToObject(d, "stop_reason", stop_reason(j, c, &f));
  if (c->stop_hit >= 0 && c->finish != SM_FIN_LENGTH && !f.tool_calls)
    cJSON_AddStringToObject(d, "stop_sequence", j->req.stop[c->stop_hit]);
  else cJSON_AddNullToObject(d, "stop_sequence");
  cJSON *u = cJSON_AddObjectToObject(e, "usage");
  cJSON_AddNumberToObject(u, "output_tokens", c->n_gen);
  event(st, "message_delta", e);
  event(st, "message_stop", cJSON_CreateObject());
  free(f.content);
  free(f.reasoning);
  cJSON_Delete(f.tool_calls);
  st->finished = true;
}
