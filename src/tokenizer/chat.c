/* apply_chat_template: renders a tokenizer's chat template the way transformers does
 * (context = messages, tools, documents, add_generation_prompt, special tokens, extra kwargs). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/chat.h"

/* Compiled templates are cached by source text (templates are few and small); entries
 * live until process exit so concurrent renders never see one freed. */
#define CHAT_CACHE_N 8
static struct {
  char *src;
  sm_jinja *tpl;
} g_cache[CHAT_CACHE_N];
static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;

static smelt_status get_compiled(const char *src, sm_jinja **out, bool *owned) {
  *owned = false;
  pthread_mutex_lock(&g_cache_mu);
  for (int i = 0; i < CHAT_CACHE_N && g_cache[i].src; i++)
    if (!strcmp(g_cache[i].src, src)) {
      *out = g_cache[i].tpl;
      pthread_mutex_unlock(&g_cache_mu);
      return SMELT_OK;
    }
  pthread_mutex_unlock(&g_cache_mu);
  sm_jinja *t;
  smelt_status st = sm_jinja_compile(src, &t);
  if (st != SMELT_OK) return st;
  pthread_mutex_lock(&g_cache_mu);
  int i = 0;
  while (i < CHAT_CACHE_N && g_cache[i].src && strcmp(g_cache[i].src, src)) i++;
  if (i < CHAT_CACHE_N && g_cache[i].src) { /* another thread added it meanwhile */
    sm_jinja_free(t);
    t = g_cache[i].tpl;
  } else if (i < CHAT_CACHE_N) {
    g_cache[i].src = sm_xstrdup(src);
    g_cache[i].tpl = t;
  } else *owned = true;
  pthread_mutex_unlock(&g_cache_mu);
  *out = t;
  return SMELT_OK;
}

/* Templates that take a message's content only as a list of parts (Idefics3's and SmolVLM's iterate
 * over message['content'] and never test "is string") would render string content as nothing: for
 * them each string content becomes [{"type": "text", "text": ...}], as vLLM's content-format
 * detection and mlx-vlm's message formats give it. */
static bool wants_parts(const char *src) {
  if (strstr(src, "is string")) return false;
  static const char *const loops[] = {"in message['content']", "in message[\"content\"]", "in message.content"};
  for (size_t i = 0; i < SM_ARRAY_LEN(loops); i++)
    if (strstr(src, loops[i])) return true;
  return false;
}

static cJSON *as_parts(const cJSON *messages) {
  cJSON *out = cJSON_Duplicate(messages, true);
  cJSON *m;
  cJSON_ArrayForEach(m, out) {
    const cJSON *c = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "content") : NULL;
    if (!cJSON_IsString(c)) continue;
    cJSON *parts = cJSON_CreateArray(), *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "text");
    cJSON_AddStringToObject(p, "text", c->valuestring);
    cJSON_AddItemToArray(parts, p);
    cJSON_ReplaceItemInObjectCaseSensitive(m, "content", parts);
  }
  return out;
}

smelt_status sm_chat_apply(const smelt_tokenizer *t, const cJSON *messages, const cJSON *tools,
                           bool add_generation_prompt, const cJSON *extra, char **out) {
  if (!out) return sm_err(SMELT_ERR_INVALID, "sm_chat_apply: NULL out");
  *out = NULL;
  if (!t) return sm_err(SMELT_ERR_INVALID, "sm_chat_apply: NULL tokenizer");
  if (!cJSON_IsArray(messages)) return sm_err(SMELT_ERR_INVALID, "chat messages must be a JSON array");
  if (tools && !cJSON_IsArray(tools) && !cJSON_IsNull(tools))
    return sm_err(SMELT_ERR_INVALID, "chat tools must be a JSON array");
  if (extra && !cJSON_IsObject(extra) && !cJSON_IsNull(extra))
    return sm_err(SMELT_ERR_INVALID, "chat template kwargs must be a JSON object");
  bool have_tools = tools && cJSON_IsArray(tools);
  /* like transformers: a template named "tool_use" is preferred when tools are given */
  const char *src = have_tools ? sm_tok_chat_template(t, "tool_use") : NULL;
  if (!src) src = sm_tok_chat_template(t, NULL);
  if (!src) return sm_err(SMELT_ERR_UNSUPPORTED, "the tokenizer has no chat template");

  sm_jinja *tpl;
  bool owned;
  smelt_status st = get_compiled(src, &tpl, &owned);
  if (st != SMELT_OK) return st;

  cJSON *ctx = cJSON_CreateObject();
  if (!ctx) return sm_err(SMELT_ERR_OOM, "out of memory");
  cJSON *parts = wants_parts(src) ? as_parts(messages) : NULL;
  if (parts) messages = parts;
  /* the context references the caller's JSON; it is detached again before deletion */
  cJSON *msg_ref = cJSON_CreateArrayReference(messages->child);
  cJSON_AddItemToObject(ctx, "messages", msg_ref);
  cJSON *tools_ref = have_tools ? cJSON_CreateArrayReference(tools->child) : cJSON_CreateNull();
  cJSON_AddItemToObject(ctx, "tools", tools_ref);
  cJSON_AddItemToObject(ctx, "documents", cJSON_CreateNull());
  cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt);
  const char *bos = sm_tok_bos_token(t), *eos = sm_tok_eos_token(t);
  if (bos) cJSON_AddStringToObject(ctx, "bos_token", bos);
  if (eos) cJSON_AddStringToObject(ctx, "eos_token", eos);
  if (extra && cJSON_IsObject(extra))
    for (const cJSON *c = extra->child; c; c = c->next) {
      if (!c->string) continue;
      cJSON *dup = cJSON_Duplicate(c, true);
      if (!dup) continue;
      if (cJSON_GetObjectItemCaseSensitive(ctx, c->string)) cJSON_ReplaceItemInObjectCaseSensitive(ctx, c->string, dup);
      else cJSON_AddItemToObject(ctx, c->string, dup);
    }
  st = sm_jinja_render(tpl, ctx, out);
  cJSON_Delete(ctx); /* references are not freed by cJSON_Delete */
  cJSON_Delete(parts);
  if (owned) sm_jinja_free(tpl);
  return st;
}
