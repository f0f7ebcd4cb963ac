/* OpenAI request parsing and validation (see api.h). */
#include "server/api.h"
#include "base/strbuf.h"
#include "server/anthropic.h"
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sm_api_error_set(sm_api_error *e, int http_status, const char *type, const char *param, const char *code,
                      const char *fmt, ...) {
  e->http_status = http_status;
  e->type = type ? type : "invalid_request_error";
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  e->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
}

char *sm_api_error_json(const sm_api_error *e) {
  cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
  cJSON_AddStringToObject(o, "message", e->message);
  cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
  if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
  else cJSON_AddNullToObject(o, "param");
  if (e->code) cJSON_AddStringToObject(o, "code", e->code);
  else cJSON_AddNullToObject(o, "code");
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

void sm_api_request_free(sm_api_request *r) {
  if (!r) return;
  free(r->model);
  cJSON_Delete(r->messages);
  cJSON_Delete(r->tools);
  cJSON_Delete(r->chat_template_kwargs);
  cJSON_Delete(r->json_schema);
  free(r->grammar);
  free(r->tool_name);
  free(r->prompt);
  free(r->prompt_ids);
  for (int i = 0; i < r->n_prompts; i++) {
    free(r->prompts[i]);
    free(r->prompt_lists[i]);
  }
  free(r->prompts);
  for (int i = 0; i < r->n_images; i++) free(r->image_urls[i]);
  free(r->image_urls);
  free(r->prompt_lists);
  free(r->prompt_lens);
  for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
  free(r->user);
  free(r->reasoning_effort);
  free(r->bias_ids);
  free(r->bias_vals);
  memset(r, 0, sizeof *r);
}

#define FAIL(param, ...) \
  do { \
    sm_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__); \
    return false; \
  } while (0)

static const char *type_name(const cJSON *v) {
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "boolean";
  if (cJSON_IsNumber(v)) return "number";
  if (cJSON_IsString(v)) return "string";
  if (cJSON_IsArray(v)) return "array";
  if (cJSON_IsObject(v)) return "object";
  return "invalid";
}

/* optional number in [lo, hi]; absent or null -> untouched */
static bool get_num(const cJSON *root, const char *key, double lo, double hi, bool integer, double *out, bool *given,
                    sm_api_error *err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (given) *given = false;
  if (!v || cJSON_IsNull(v)) return true;
  if (!cJSON_IsNumber(v)) FAIL(key, "'%s' must be a number, got %s", key, type_name(v));
  double d = v->valuedouble;
  if (!isfinite(d)) FAIL(key, "'%s' must be finite", key);
  if (integer && d != floor(d)) FAIL(key, "'%s' must be an integer", key);
  if (d < lo || d > hi) FAIL(key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
  *out = d;
  if (given) *given = true;
  return true;
}

static bool get_bool(const cJSON *root, const char *key, bool *out, sm_api_error *err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v || cJSON_IsNull(v)) return true;
  if (!cJSON_IsBool(v)) FAIL(key, "'%s' must be a boolean, got %s", key, type_name(v));
  *out = cJSON_IsTrue(v);
  return true;
}

static bool get_str(const cJSON *root, const char *key, char **out, sm_api_error *err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v || cJSON_IsNull(v)) return true;
  if (!cJSON_IsString(v)) FAIL(key, "'%s' must be a string, got %s", key, type_name(v));
  *out = sm_xstrdup(v->valuestring);
  return true;
}

/* Content as string: a string, null, or an array of text parts ({type:"text"|"input_text"|
 * "output_text", text}). *out malloc'd or NULL for null. */
static bool content_to_string(const cJSON *c, const char *param, char **out, sm_api_error *err) {
  *out = NULL;
  if (!c || cJSON_IsNull(c)) return true;
  if (cJSON_IsString(c)) {
    *out = sm_xstrdup(c->valuestring);
    return true;
  }
  if (!cJSON_IsArray(c)) FAIL(param, "'content' must be a string or an array of content parts, got %s", type_name(c));
  sm_buf s = SM_BUF_INIT;
  const cJSON *part;
  cJSON_ArrayForEach(part, c) {
    const char *txt = NULL;
    if (cJSON_IsString(part)) txt = part->valuestring;
    else if (cJSON_IsObject(part)) {
      const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
      if (!cJSON_IsString(ty)) {
        sm_buf_free(&s);
        FAIL(param, "content part without a string 'type'");
      }
      const char *t = ty->valuestring;
      if (strcmp(t, "text") && strcmp(t, "input_text") && strcmp(t, "output_text")) {
        sm_buf_free(&s);
        FAIL(param, "content part type '%.40s' is not supported (text only)", t);
      }
      const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
      if (!cJSON_IsString(tx)) {
        sm_buf_free(&s);
        FAIL(param, "text content part needs a string 'text'");
      }
      txt = tx->valuestring;
    } else {
      sm_buf_free(&s);
      FAIL(param, "content part must be an object, got %s", type_name(part));
    }
    sm_buf_puts(&s, txt);
  }
  *out = sm_buf_take(&s);
  return true;
}

/* The URL of an image content part: chat's {type: "image_url", image_url: {url} | url} or the
 * Responses API's {type: "input_image", image_url: url}; NULL when the part is not an image. */
static const cJSON *image_part_url(const cJSON *part, bool *is_image) {
  const cJSON *ty = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
  *is_image = cJSON_IsString(ty) && (!strcmp(ty->valuestring, "image_url") || !strcmp(ty->valuestring, "input_image"));
  if (!*is_image) return NULL;
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(part, "image_url");
  if (cJSON_IsObject(u)) u = cJSON_GetObjectItemCaseSensitive(u, "url");
  return cJSON_IsString(u) ? u : NULL;
}

/* Content with images: the parts in order as {type: "image"} and {type: "text", text} (what the
 * vision-language chat templates render), the images' URLs appended to r. */
static cJSON *image_content(const cJSON *c, const char *param, sm_api_request *r, sm_api_error *err) {
  cJSON *parts = cJSON_CreateArray();
  const cJSON *part;
  int k = 0;
  cJSON_ArrayForEach(part, c) {
    char pp[96];
    snprintf(pp, sizeof pp, "%s.content[%d]", param, k++);
    bool is_image;
    const cJSON *url = image_part_url(part, &is_image);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToArray(parts, o);
    if (is_image) {
      if (!url) {
        cJSON_Delete(parts);
        sm_api_error_set(err, 400, "invalid_request_error", param, NULL, "%s: an image part needs image_url.url", pp);
        return NULL;
      }
      if (r->n_images == SM_API_MAX_IMAGES) {
        cJSON_Delete(parts);
        sm_api_error_set(err, 400, "invalid_request_error", param, NULL, "%s: at most %d images a request", pp,
                         SM_API_MAX_IMAGES);
        return NULL;
      }
      cJSON_AddStringToObject(o, "type", "image");
      r->image_urls = sm_xrealloc(r->image_urls, sizeof(char *) * (size_t)(r->n_images + 1));
      r->image_urls[r->n_images++] = sm_xstrdup(url->valuestring);
      continue;
    }
    const cJSON *ty = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
    const cJSON *tx = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
    const char *t = cJSON_IsString(part) ? part->valuestring : NULL;
    if (!t && cJSON_IsString(ty) && cJSON_IsString(tx) &&
        (!strcmp(ty->valuestring, "text") || !strcmp(ty->valuestring, "input_text")))
      t = tx->valuestring;
    if (!t) {
      cJSON_Delete(parts);
      sm_api_error_set(err, 400, "invalid_request_error", param, NULL,
                       "%s: content parts are text, image_url or input_image", pp);
      return NULL;
    }
    cJSON_AddStringToObject(o, "type", "text");
    cJSON_AddStringToObject(o, "text", t);
  }
  return parts;
}

static bool has_image(const cJSON *c) {
  const cJSON *part;
  bool is_image = false;
  if (cJSON_IsArray(c)) cJSON_ArrayForEach(part, c) {
      image_part_url(part, &is_image);
      if (is_image) return true;
    }
  return false;
}

/* Normalize one chat message into a fresh object for the chat template. */
static bool norm_message(const cJSON *m, int idx, cJSON *out_arr, sm_api_request *req, sm_api_error *err) {
  char param[64];
  snprintf(param, sizeof param, "messages[%d]", idx);
  if (!cJSON_IsObject(m)) FAIL(param, "%s must be an object, got %s", param, type_name(m));
  const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
  if (!cJSON_IsString(role)) FAIL(param, "%s.role must be a string", param);
  const char *r = role->valuestring;
  if (!strcmp(r, "developer")) r = "system";
  if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
    FAIL(param, "%s.role '%.40s' is invalid (system, developer, user, assistant, tool)", param, role->valuestring);
  const cJSON *cont = cJSON_GetObjectItemCaseSensitive(m, "content");
  if (has_image(cont)) {
    if (strcmp(r, "user")) FAIL(param, "%s: images are accepted in user messages only", param);
    cJSON *parts = image_content(cont, param, req, err);
    if (!parts) return false;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "role", r);
    cJSON_AddItemToObject(o, "content", parts);
    cJSON_AddItemToArray(out_arr, o);
    return true;
  }
  char *content = NULL;
  if (!content_to_string(cont, param, &content, err)) return false;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "role", r);
  const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
  if (!content && strcmp(r, "assistant") && strcmp(r, "tool")) {
    cJSON_Delete(o);
    FAIL(param, "%s.content is required for role '%s'", param, r);
  }
  if (content) cJSON_AddStringToObject(o, "content", content);
  else cJSON_AddStringToObject(o, "content", "");
  free(content);
  if (tc && !cJSON_IsNull(tc)) {
    if (!cJSON_IsArray(tc)) {
      cJSON_Delete(o);
      FAIL(param, "%s.tool_calls must be an array", param);
    }
    cJSON *arr = cJSON_AddArrayToObject(o, "tool_calls");
    const cJSON *c;
    cJSON_ArrayForEach(c, tc) {
      const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
      const cJSON *name = fn ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
      if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(name)) {
        cJSON_Delete(o);
        FAIL(param, "%s.tool_calls entries need function.name", param);
      }
      cJSON *nc = cJSON_CreateObject();
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
      if (cJSON_IsString(id)) cJSON_AddStringToObject(nc, "id", id->valuestring);
      cJSON_AddStringToObject(nc, "type", "function");
      cJSON *nf = cJSON_AddObjectToObject(nc, "function");
      cJSON_AddStringToObject(nf, "name", name->valuestring);
      /* templates expect arguments as an object: parse the OpenAI JSON string */
      const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
      cJSON *a = NULL;
      if (cJSON_IsString(args)) a = cJSON_Parse(args->valuestring);
      else if (cJSON_IsObject(args)) a = cJSON_Duplicate(args, 1);
      if (!a) a = cJSON_IsString(args) ? cJSON_CreateString(args->valuestring) : cJSON_CreateObject();
      cJSON_AddItemToObject(nf, "arguments", a);
      cJSON_AddItemToArray(arr, nc);
    }
  }
  const cJSON *tcid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
  if (cJSON_IsString(tcid)) cJSON_AddStringToObject(o, "tool_call_id", tcid->valuestring);
  const cJSON *nm = cJSON_GetObjectItemCaseSensitive(m, "name");
  if (cJSON_IsString(nm)) cJSON_AddStringToObject(o, "name", nm->valuestring);
  cJSON_AddItemToArray(out_arr, o);
  return true;
}

static bool parse_stop(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop");
  if (!v || cJSON_IsNull(v)) return true;
  if (cJSON_IsString(v)) {
    if (v->valuestring[0]) r->stop[r->n_stop++] = sm_xstrdup(v->valuestring);
    return true;
  }
  if (!cJSON_IsArray(v)) FAIL("stop", "'stop' must be a string or an array of strings, got %s", type_name(v));
  if (cJSON_GetArraySize(v) > SM_API_MAX_STOP) FAIL("stop", "at most %d stop strings are allowed", SM_API_MAX_STOP);
  const cJSON *s;
  cJSON_ArrayForEach(s, v) {
    if (!cJSON_IsString(s)) FAIL("stop", "'stop' entries must be strings, got %s", type_name(s));
    if (s->valuestring[0]) r->stop[r->n_stop++] = sm_xstrdup(s->valuestring);
  }
  return true;
}

static bool parse_tools(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
  const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
  r->parallel_tool_calls = true;
  if (!get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, err)) return false;
  if (choice && !cJSON_IsNull(choice) && !cJSON_IsString(choice) && !cJSON_IsObject(choice))
    FAIL("tool_choice", "'tool_choice' must be a string or an object");
  if (cJSON_IsString(choice)) {
    const char *c = choice->valuestring;
    if (!strcmp(c, "none")) r->tool_choice = SM_TOOLS_NONE;
    else if (!strcmp(c, "auto")) r->tool_choice = SM_TOOLS_AUTO;
    else if (!strcmp(c, "required") || !strcmp(c, "any")) r->tool_choice = SM_TOOLS_REQUIRED;
    else FAIL("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or an object");
  } else if (cJSON_IsObject(choice)) {
    /* {type:"function", function:{name}} (chat) or {type:"function", name} (responses) */
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(fn) ? fn : choice, "name");
    if (!cJSON_IsString(nm)) FAIL("tool_choice", "'tool_choice' object needs function.name");
    r->tool_choice = SM_TOOLS_NAMED;
    r->tool_name = sm_xstrdup(nm->valuestring);
  }
  if (!tools || cJSON_IsNull(tools)) {
    if (r->tool_choice == SM_TOOLS_REQUIRED || r->tool_choice == SM_TOOLS_NAMED)
      FAIL("tool_choice", "'tool_choice' requires 'tools'");
    return true;
  }
  if (!cJSON_IsArray(tools)) FAIL("tools", "'tools' must be an array, got %s", type_name(tools));
  int i = 0;
  const cJSON *t;
  cJSON_ArrayForEach(t, tools) {
    char param[32];
    snprintf(param, sizeof param, "tools[%d]", i++);
    if (!cJSON_IsObject(t)) FAIL(param, "%s must be an object", param);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name"); /* responses API: flat */
    if (cJSON_IsObject(fn)) name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function")))
      FAIL(param, "%s.type must be 'function'", param);
    if (!cJSON_IsString(name)) FAIL(param, "%s.function.name must be a string", param);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(fn) ? fn : t, "parameters");
    if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
      FAIL(param, "%s.function.parameters must be an object", param);
  }
  if (r->tool_choice == SM_TOOLS_NAMED) {
    bool found = false;
    cJSON_ArrayForEach(t, tools) {
      const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
      const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(fn) ? fn : t, "name");
      found |= cJSON_IsString(name) && !strcmp(name->valuestring, r->tool_name);
    }
    if (!found) FAIL("tool_choice", "'tool_choice' names '%.60s', which is not in 'tools'", r->tool_name);
  }
  if (cJSON_GetArraySize(tools) == 0) {
    if (r->tool_choice == SM_TOOLS_REQUIRED) FAIL("tool_choice", "'tool_choice' 'required' needs at least one tool");
    return true;
  }
  if (r->tool_choice == SM_TOOLS_NONE) return true;
  /* normalize to the chat-completions shape {type:"function", function:{...}} */
  r->tools = cJSON_CreateArray();
  cJSON_ArrayForEach(t, tools) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (cJSON_IsObject(fn)) {
      cJSON_AddItemToArray(r->tools, cJSON_Duplicate(t, 1));
    } else {
      cJSON *nt = cJSON_CreateObject(), *f = cJSON_Duplicate(t, 1);
      cJSON_DeleteItemFromObjectCaseSensitive(f, "type");
      cJSON_AddStringToObject(nt, "type", "function");
      cJSON_AddItemToObject(nt, "function", f);
      cJSON_AddItemToArray(r->tools, nt);
    }
  }
  return true;
}

/* response_format (chat, completions) or text.format (responses: the json_schema fields are
 * flat, {type, name, schema, strict}) */
static bool parse_response_format(const cJSON *rf, const char *param, sm_api_request *r, sm_api_error *err) {
  if (!rf || cJSON_IsNull(rf)) return true;
  if (!cJSON_IsObject(rf)) FAIL(param, "'%s' must be an object", param);
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
  if (!cJSON_IsString(ty)) FAIL(param, "'%s.type' must be a string", param);
  if (!strcmp(ty->valuestring, "text")) return true;
  if (r->grammar || r->json_schema) FAIL(param, "'%s' cannot be combined with 'grammar' or 'json_schema'", param);
  if (!strcmp(ty->valuestring, "json_object")) {
    r->json_mode = true;
    r->json_schema = cJSON_CreateObject();
    cJSON_AddStringToObject(r->json_schema, "type", "object");
    return true;
  }
  if (strcmp(ty->valuestring, "json_schema"))
    FAIL(param, "'%s.type' must be 'text', 'json_object' or 'json_schema'", param);
  const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
  if (js && !cJSON_IsObject(js)) FAIL(param, "'%s.json_schema' must be an object", param);
  const cJSON *holder = js ? js : rf;
  const cJSON *schema = cJSON_GetObjectItemCaseSensitive(holder, "schema");
  const cJSON *strict = cJSON_GetObjectItemCaseSensitive(holder, "strict");
  if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict)) FAIL(param, "'%s' strict must be a boolean", param);
  if (schema && !cJSON_IsObject(schema) && !cJSON_IsBool(schema)) FAIL(param, "'%s' schema must be an object", param);
  r->json_mode = true;
  r->schema_strict = cJSON_IsTrue(strict);
  if (schema && !cJSON_IsTrue(schema)) r->json_schema = cJSON_Duplicate(schema, 1);
  else { /* no schema: any JSON object */ r->json_schema = cJSON_CreateObject();
    cJSON_AddStringToObject(r->json_schema, "type", "object");
  }
  return true;
}

/* llama-server's grammar (GBNF text) and json_schema fields */
static bool parse_grammar_fields(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  if (!get_str(root, "grammar", &r->grammar, err)) return false;
  if (r->grammar && !r->grammar[0]) {
    free(r->grammar);
    r->grammar = NULL;
  }
  const cJSON *js = cJSON_GetObjectItemCaseSensitive(root, "json_schema");
  if (js && !cJSON_IsNull(js)) {
    if (!cJSON_IsObject(js)) FAIL("json_schema", "'json_schema' must be an object");
    if (r->grammar) FAIL("json_schema", "use either 'grammar' or 'json_schema', not both");
    r->json_mode = true;
    r->json_schema = cJSON_Duplicate(js, 1);
  }
  return true;
}

static bool parse_common(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  double d;
  bool given;
  smelt_sampling *s = &r->sampling;
  if (!get_str(root, "model", &r->model, err)) return false;
  if (!get_num(root, "temperature", 0, 2, false, &d, &r->has_temperature, err)) return false;
  if (r->has_temperature) s->temperature = (float)d;
  if (!get_num(root, "top_p", 0, 1, false, &d, &r->has_top_p, err)) return false;
  if (r->has_top_p) s->top_p = d <= 0 ? 1e-6f : (float)d;
  if (!get_num(root, "top_k", -1, 1e9, true, &d, &r->has_top_k, err)) return false;
  if (r->has_top_k) s->top_k = d < 0 ? 0 : (int)d;
  if (!get_num(root, "min_p", 0, 1, false, &d, &given, err)) return false;
  if (given) s->min_p = (float)d;
  if (!get_num(root, "frequency_penalty", -2, 2, false, &d, &given, err)) return false;
  if (given) s->frequency_penalty = (float)d;
  if (!get_num(root, "presence_penalty", -2, 2, false, &d, &given, err)) return false;
  if (given) s->presence_penalty = (float)d;
  if (!get_num(root, "repetition_penalty", 0.01, 10, false, &d, &given, err)) return false;
  if (given) s->repetition_penalty = (float)d;
  if (!get_num(root, "seed", -9.3e18, 1.8e19, true, &d, &r->has_seed, err)) return false;
  if (r->has_seed) r->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
  if (!get_num(root, "n", 1, SM_API_MAX_N, true, &d, &given, err)) return false;
  r->n = given ? (int)d : 1;
  if (!get_bool(root, "stream", &r->stream, err)) return false;
  if (!get_bool(root, "ignore_eos", &r->ignore_eos, err)) return false;
  /* llama-server's per-request speculative decoding fields (flat, dotted keys) */
  if (!get_num(root, "speculative.n_max", 0, 32, true, &d, &r->has_spec_n_max, err)) return false;
  if (r->has_spec_n_max) r->spec_n_max = (int)d;
  if (!get_num(root, "speculative.n_min", 0, 32, true, &d, &r->has_spec_n_min, err)) return false;
  if (r->has_spec_n_min) r->spec_n_min = (int)d;
  if (!get_num(root, "speculative.p_min", 0, 1, false, &d, &r->has_spec_p_min, err)) return false;
  if (r->has_spec_p_min) r->spec_p_min = (float)d;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
  if (so && !cJSON_IsNull(so)) {
    if (!cJSON_IsObject(so)) FAIL("stream_options", "'stream_options' must be an object");
    if (!get_bool(so, "include_usage", &r->include_usage, err)) return false;
  }
  if (!parse_stop(root, r, err)) return false;
  if (!get_str(root, "user", &r->user, err)) return false;
  if (!parse_grammar_fields(root, r, err)) return false;
  if (!get_str(root, "reasoning_effort", &r->reasoning_effort, err)) return false;
  const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
  if (lb && !cJSON_IsNull(lb)) {
    /* {"token id": bias in [-100, 100]} (OpenAI); -100 bans the token */
    if (!cJSON_IsObject(lb)) FAIL("logit_bias", "'logit_bias' must be an object of token id -> bias");
    int n = cJSON_GetArraySize(lb);
    if (n > SM_API_MAX_LOGIT_BIAS) FAIL("logit_bias", "at most %d logit_bias entries", SM_API_MAX_LOGIT_BIAS);
    r->bias_ids = sm_xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    r->bias_vals = sm_xmalloc(sizeof(float) * (size_t)(n ? n : 1));
    for (const cJSON *e = lb->child; e; e = e->next) {
      char *end = NULL;
      long id = strtol(e->string, &end, 10);
      if (!e->string[0] || *end || id < 0 || id > 2147483647L)
        FAIL("logit_bias", "'logit_bias' keys must be token ids, got '%.40s'", e->string);
      if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 || e->valuedouble > 100)
        FAIL("logit_bias", "'logit_bias' values must be numbers between -100 and 100");
      r->bias_ids[r->n_bias] = (int32_t)id;
      r->bias_vals[r->n_bias++] = (float)e->valuedouble;
    }
  }
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "reasoning"); /* responses: {effort} */
  if (cJSON_IsObject(rs) && !r->reasoning_effort && !get_str(rs, "effort", &r->reasoning_effort, err)) return false;
  const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
  if (kw && !cJSON_IsNull(kw)) {
    if (!cJSON_IsObject(kw)) FAIL("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    /* extra template variables may not replace what the server puts in the context */
    static const char *const reserved[] = {"messages",        "tools",        "documents",  "add_generation_prompt",
                                           "bos_token",       "eos_token",    "unk_token",  "pad_token",
                                           "sep_token",       "cls_token",    "mask_token", "additional_special_tokens",
                                           "raise_exception", "strftime_now", "range",      "dict",
                                           "namespace",       "cycler",       "joiner",     "lipsum"};
    for (const cJSON *c = kw->child; c; c = c->next)
      for (size_t i = 0; i < SM_ARRAY_LEN(reserved); i++)
        if (c->string && !strcmp(c->string, reserved[i]))
          FAIL("chat_template_kwargs", "'chat_template_kwargs' may not set '%s' (set by the server)", reserved[i]);
    r->chat_template_kwargs = cJSON_Duplicate(kw, 1);
  }
  return true;
}

static bool parse_max_tokens(const cJSON *root, const char *key, sm_api_request *r, sm_api_error *err) {
  double d;
  bool given;
  if (!get_num(root, key, 1, 1e9, true, &d, &given, err)) return false;
  if (given) r->max_tokens = (int)d;
  return true;
}

static bool parse_chat(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  if (!msgs) FAIL("messages", "'messages' is required");
  if (!cJSON_IsArray(msgs)) FAIL("messages", "'messages' must be an array, got %s", type_name(msgs));
  if (cJSON_GetArraySize(msgs) == 0) FAIL("messages", "'messages' must not be empty");
  r->messages = cJSON_CreateArray();
  int i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) if (!norm_message(m, i++, r->messages, r, err)) return false;
  if (!parse_max_tokens(root, "max_tokens", r, err)) return false;
  if (!parse_max_tokens(root, "max_completion_tokens", r, err)) return false;
  if (!get_bool(root, "logprobs", &r->logprobs, err)) return false;
  double d;
  bool given;
  if (!get_num(root, "top_logprobs", 0, SM_API_MAX_TOP_LOGPROBS, true, &d, &given, err)) return false;
  if (given) {
    if (!r->logprobs) FAIL("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
    r->top_logprobs = (int)d;
  }
  if (!get_num(root, "n_probs", 0, SM_API_MAX_TOP_LOGPROBS, true, &d, &given, err)) return false;
  if (given && d > 0 && !r->logprobs) {
    r->logprobs = true;
    r->top_logprobs = (int)d;
  } /* llama-server */
  if (!parse_response_format(cJSON_GetObjectItemCaseSensitive(root, "response_format"), "response_format", r, err))
    return false;
  return parse_tools(root, r, err);
}

static bool parse_completions_prompt(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
  if (!p) FAIL("prompt", "'prompt' is required");
  if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
    p = p->child;
  if (cJSON_IsArray(p) && p->child && (cJSON_IsString(p->child) || cJSON_IsArray(p->child))) {
    /* several prompts: strings or token-id lists; the choices are prompt-major */
    int n = cJSON_GetArraySize(p), i = 0;
    r->prompts = sm_xcalloc((size_t)n, sizeof(char *));
    r->prompt_lists = sm_xcalloc((size_t)n, sizeof(int32_t *));
    r->prompt_lens = sm_xcalloc((size_t)n, sizeof(int));
    r->n_prompts = n;
    const cJSON *e;
    cJSON_ArrayForEach(e, p) {
      if (cJSON_IsString(e)) {
        r->prompts[i++] = sm_xstrdup(e->valuestring);
        continue;
      }
      if (!cJSON_IsArray(e) || !e->child)
        FAIL("prompt", "'prompt[%d]' must be a string or a non-empty array of token ids", i);
      r->prompt_lists[i] = sm_xmalloc(sizeof(int32_t) * (size_t)cJSON_GetArraySize(e));
      const cJSON *t;
      cJSON_ArrayForEach(t, e) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble > 2147483647.0)
          FAIL("prompt", "token ids in 'prompt[%d]' must be non-negative integers", i);
        r->prompt_lists[i][r->prompt_lens[i]++] = (int32_t)t->valuedouble;
      }
      i++;
    }
  } else if (cJSON_IsString(p)) {
    r->prompt = sm_xstrdup(p->valuestring);
  } else if (cJSON_IsArray(p)) {
    int n = cJSON_GetArraySize(p);
    if (n == 0) FAIL("prompt", "'prompt' must not be empty");
    if (!cJSON_IsNumber(p->child))
      FAIL("prompt", "'prompt' must be a string, an array of strings, an array of token ids or an array of those");
    r->prompt_ids = sm_xmalloc(sizeof(int32_t) * (size_t)n);
    const cJSON *t;
    cJSON_ArrayForEach(t, p) {
      if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
          t->valuedouble > 2147483647.0)
        FAIL("prompt", "token ids in 'prompt' must be non-negative integers");
      r->prompt_ids[r->n_prompt_ids++] = (int32_t)t->valuedouble;
    }
  } else {
    FAIL("prompt", "'prompt' must be a string or an array, got %s", type_name(p));
  }
  return true;
}

static bool parse_completions(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  if (!parse_completions_prompt(root, r, err)) return false;
  if (!parse_max_tokens(root, "max_tokens", r, err)) return false;
  double d;
  bool given;
  if (!get_num(root, "logprobs", 0, 5, true, &d, &given, err)) return false;
  if (given) {
    r->logprobs = true;
    r->top_logprobs = (int)d;
  }
  if (!get_num(root, "n_probs", 0, SM_API_MAX_TOP_LOGPROBS, true, &d, &given, err)) return false;
  if (given && d > 0 && !r->logprobs) {
    r->logprobs = true;
    r->top_logprobs = (int)d;
  } /* llama-server */
  if (!get_bool(root, "echo", &r->echo, err)) return false;
  const cJSON *bo = cJSON_GetObjectItemCaseSensitive(root, "best_of");
  if (cJSON_IsNumber(bo) && bo->valuedouble > 1) FAIL("best_of", "'best_of' > 1 is not supported");
  const cJSON *suf = cJSON_GetObjectItemCaseSensitive(root, "suffix");
  if (suf && !cJSON_IsNull(suf) && !(cJSON_IsString(suf) && !suf->valuestring[0]))
    FAIL("suffix", "'suffix' is not supported");
  return parse_response_format(cJSON_GetObjectItemCaseSensitive(root, "response_format"), "response_format", r, err);
}

/* /v1/embeddings: input = string | [string] | [int] | [[int]] (the completions prompt forms) */
static bool parse_embeddings(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
  if (!in) FAIL("input", "'input' is required");
  cJSON *tmp = cJSON_CreateObject();
  cJSON_AddItemToObject(tmp, "prompt", cJSON_Duplicate(in, 1));
  /* a one-element array stays one input */
  bool ok = parse_completions_prompt(tmp, r, err);
  cJSON_Delete(tmp);
  if (!ok) {
    if (!strcmp(err->param, "prompt")) snprintf(err->param, sizeof err->param, "input");
    return false;
  }
  const cJSON *ef = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
  if (ef && !cJSON_IsNull(ef)) {
    if (!cJSON_IsString(ef) || (strcmp(ef->valuestring, "float") && strcmp(ef->valuestring, "base64")))
      FAIL("encoding_format", "'encoding_format' must be 'float' or 'base64'");
    r->emb_base64 = !strcmp(ef->valuestring, "base64");
  }
  return true;
}

static bool parse_responses(const cJSON *root, sm_api_request *r, sm_api_error *err) {
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
  const cJSON *ins = cJSON_GetObjectItemCaseSensitive(root, "instructions");
  if (!in) FAIL("input", "'input' is required");
  if (ins && !cJSON_IsNull(ins) && !cJSON_IsString(ins)) FAIL("instructions", "'instructions' must be a string");
  r->messages = cJSON_CreateArray();
  if (cJSON_IsString(ins)) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "system");
    cJSON_AddStringToObject(m, "content", ins->valuestring);
    cJSON_AddItemToArray(r->messages, m);
  }
  if (cJSON_IsString(in)) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", in->valuestring);
    cJSON_AddItemToArray(r->messages, m);
  } else if (cJSON_IsArray(in)) {
    if (cJSON_GetArraySize(in) == 0) FAIL("input", "'input' must not be empty");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, in) {
      const cJSON *ty = cJSON_IsObject(it) ? cJSON_GetObjectItemCaseSensitive(it, "type") : NULL;
      if (ty && cJSON_IsString(ty) && strcmp(ty->valuestring, "message")) {
        char param[32];
        snprintf(param, sizeof param, "input[%d]", i);
        FAIL(param, "input item type '%.40s' is not supported (messages only)", ty->valuestring);
      }
      if (!norm_message(it, i++, r->messages, r, err)) {
        /* report the Responses parameter name */
        if (!strncmp(err->param, "messages", 8)) {
          char p2[64];
          snprintf(p2, sizeof p2, "input%s", err->param + 8);
          snprintf(err->param, sizeof err->param, "%s", p2);
        }
        return false;
      }
    }
  } else {
    FAIL("input", "'input' must be a string or an array, got %s", type_name(in));
  }
  if (!parse_max_tokens(root, "max_output_tokens", r, err)) return false;
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
  if (cJSON_IsObject(text) &&
      !parse_response_format(cJSON_GetObjectItemCaseSensitive(text, "format"), "text.format", r, err))
    return false;
  return parse_tools(root, r, err);
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The first key that occurs twice in one object anywhere in v, or NULL. RFC 8259 leaves
 * duplicates undefined and parsers disagree (first or last wins), so they are refused. */
static const char *duplicate_key(const cJSON *v, const char **keys, size_t cap) {
  if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return NULL;
  size_t n = 0;
  for (const cJSON *c = v->child; c; c = c->next) {
    const char *d = duplicate_key(c, keys + n, cap - n); /* children use the space after ours */
    if (d) return d;
    if (cJSON_IsObject(v) && c->string) keys[n++] = c->string;
  }
  if (n < 2) return NULL;
  qsort(keys, n, sizeof *keys, cmp_key);
  for (size_t i = 1; i < n; i++)
    if (!strcmp(keys[i - 1], keys[i])) return keys[i];
  return NULL;
}

static size_t count_items(const cJSON *v) {
  size_t n = 1;
  for (const cJSON *c = v->child; c; c = c->next) n += count_items(c);
  return n;
}

bool sm_api_parse(sm_ep_kind kind, const char *body, size_t len, sm_api_request *r, sm_api_error *err) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->max_tokens = -1;
  r->n = 1;
  r->sampling.temperature = 1.0f;
  r->sampling.top_p = 1.0f;
  r->sampling.repetition_penalty = 1.0f;
  if (!body || len == 0) {
    sm_api_error_set(err, 400, "invalid_request_error", NULL, NULL, "request body is empty");
    return false;
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
  if (!root) {
    size_t off = end && end >= body ? (size_t)(end - body) : 0;
    sm_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                     "could not parse the JSON body (error near byte %zu)", off);
    return false;
  }
  bool ok;
  size_t n_items = count_items(root);
  const char **keys = sm_xmalloc(sizeof(char *) * n_items);
  const char *dup = duplicate_key(root, keys, n_items);
  if (dup) {
    sm_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                     "the JSON body has the key '%.64s' twice in one object", dup);
    ok = false;
  } else if (!cJSON_IsObject(root)) {
    sm_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json", "the JSON body must be an object");
    ok = false;
  } else {
    ok = parse_common(root, r, err);
    if (ok) {
      if (kind == SM_EP_CHAT) ok = parse_chat(root, r, err);
      else if (kind == SM_EP_MESSAGES) ok = sm_anth_parse_fields(root, r, err);
      else if (kind == SM_EP_EMBEDDINGS) ok = parse_embeddings(root, r, err);
      else if (kind == SM_EP_COMPLETIONS) ok = parse_completions(root, r, err);
      else ok = parse_responses(root, r, err);
    }
    if (ok && r->n > 1 && kind == SM_EP_RESPONSES) {
      sm_api_error_set(err, 400, "invalid_request_error", "n", NULL, "'n' is not supported by /v1/responses");
      ok = false;
    }
  }
  free(keys);
  cJSON_Delete(root);
  if (!ok) sm_api_request_free(r);
  return ok;
}

/* ---- stop strings ---- */
long sm_stop_find(const char *text, size_t len, size_t from, char *const *stops, int n_stops) {
  long best = -1;
  for (int i = 0; i < n_stops; i++) {
    size_t sl = strlen(stops[i]);
    if (!sl || sl > len) continue;
    for (size_t p = from; p + sl <= len; p++) {
      if (best >= 0 && (long)p >= best) break;
      if (text[p] == stops[i][0] && !memcmp(text + p, stops[i], sl)) {
        best = (long)p;
        break;
      }
    }
  }
  return best;
}

size_t sm_stop_holdback(const char *text, size_t len, char *const *stops, int n_stops) {
  size_t best = 0;
  for (int i = 0; i < n_stops; i++) {
    size_t sl = strlen(stops[i]);
    for (size_t k = SM_MIN(sl - 1, len); k > best; k--)
      if (!memcmp(text + len - k, stops[i], k)) {
        best = k;
        break;
      }
  }
  return best;
}
