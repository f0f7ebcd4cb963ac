/* The conversation of smelt run: messages, the chat template that renders them (the tokenizer's,
 * or --chat-template), dropping the oldest turns, and /save and /load as JSON. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/strbuf.h"
#include "cli/run.h"
#include "vision/vision.h"

static const char k_chatml[] =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

bool sm_conv_init(sm_conv *c, const smelt_tokenizer *tok, const char *template_arg, bool raw, const char *cmd) {
  memset(c, 0, sizeof *c);
  c->msgs = cJSON_CreateArray();
  c->tok = tok;
  c->raw = raw;
  if (raw || !template_arg) {
    if (!raw && !sm_tok_chat_template(tok, NULL)) c->raw = true; /* the banner / caller says so */
    return true;
  }
  char *src = NULL;
  size_t len = 0;
  if (!strcmp(template_arg, "raw")) {
    c->raw = true;
    return true;
  }
  if (sm_file_exists(template_arg)) {
    if (sm_read_file_max(template_arg, SM_FILE_MAX_JSON, &src, &len)) {
      fprintf(stderr, "smelt %s: --chat-template: %s\n", cmd, smelt_last_error());
      sm_conv_free(c);
      return false;
    }
  } else if (sm_tok_chat_template(tok, template_arg)) {
    src = sm_xstrdup(sm_tok_chat_template(tok, template_arg));
  } else if (!strcmp(template_arg, "chatml")) {
    src = sm_xstrdup(k_chatml);
  } else {
    fprintf(stderr,
            "smelt %s: --chat-template: '%s' is neither a file nor a template name (the tokenizer's named "
            "templates, chatml, raw)\n",
            cmd, template_arg);
    sm_conv_free(c);
    return false;
  }
  smelt_status st = sm_jinja_compile(src, &c->tpl);
  free(src);
  if (st) {
    fprintf(stderr, "smelt %s: --chat-template %s: %s\n", cmd, template_arg, smelt_last_error());
    sm_conv_free(c);
    return false;
  }
  return true;
}

void sm_conv_free(sm_conv *c) {
  cJSON_Delete(c->msgs);
  if (c->tpl) sm_jinja_free(c->tpl);
  for (int i = 0; i < c->n_imgs; i++) sm_vimage_unref(c->imgs[i]);
  free(c->imgs);
  memset(c, 0, sizeof *c);
}

static const char *role_of(const cJSON *m) { return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role")); }
/* the text of a message (of a message with images: its text part) */
static const char *content_of(const cJSON *m) {
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
  if (cJSON_IsArray(c)) {
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
      const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "type"));
      if (t && !strcmp(t, "text")) return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "text"));
    }
    return "";
  }
  return cJSON_GetStringValue(c);
}
static bool has_system(const sm_conv *c) {
  const char *r = role_of(cJSON_GetArrayItem(c->msgs, 0));
  return r && !strcmp(r, "system");
}

static cJSON *message(const char *role, const char *content) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "role", role);
  cJSON_AddStringToObject(m, "content", content);
  return m;
}

void sm_conv_set_system(sm_conv *c, const char *text) {
  if (has_system(c)) cJSON_DeleteItemFromArray(c->msgs, 0);
  if (text && *text) cJSON_InsertItemInArray(c->msgs, 0, message("system", text));
}

const char *sm_conv_system(const sm_conv *c) {
  return has_system(c) ? content_of(cJSON_GetArrayItem(c->msgs, 0)) : NULL;
}

void sm_conv_add(sm_conv *c, const char *role, const char *content) {
  if (!c->n_pending || strcmp(role, "user")) {
    cJSON_AddItemToArray(c->msgs, message(role, content));
    return;
  }
  /* the pending images first, then the text, as content parts (what the templates render) */
  cJSON *m = cJSON_CreateObject(), *parts = cJSON_CreateArray();
  cJSON_AddStringToObject(m, "role", role);
  for (int k = c->n_imgs - c->n_pending; k < c->n_imgs; k++) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "image");
    cJSON_AddNumberToObject(p, "smelt_image", k);
    cJSON_AddItemToArray(parts, p);
  }
  cJSON *t = cJSON_CreateObject();
  cJSON_AddStringToObject(t, "type", "text");
  cJSON_AddStringToObject(t, "text", content);
  cJSON_AddItemToArray(parts, t);
  cJSON_AddItemToObject(m, "content", parts);
  cJSON_AddItemToArray(c->msgs, m);
  c->n_pending = 0;
}

void sm_conv_add_image(sm_conv *c, const sm_vision *vision, sm_vimage *img) {
  c->vision = vision;
  c->imgs = sm_xrealloc(c->imgs, sizeof(sm_vimage *) * (size_t)(c->n_imgs + 1));
  sm_vimage_ref(img);
  c->imgs[c->n_imgs++] = img;
  c->n_pending++;
}

bool sm_conv_pop(sm_conv *c, const char *role) {
  int n = cJSON_GetArraySize(c->msgs);
  if (n == 0 || (n == 1 && has_system(c))) return false;
  const char *r = role_of(cJSON_GetArrayItem(c->msgs, n - 1));
  if (!r || strcmp(r, role)) return false;
  cJSON_DeleteItemFromArray(c->msgs, n - 1);
  return true;
}

const char *sm_conv_last(const sm_conv *c, const char *role) {
  int n = cJSON_GetArraySize(c->msgs);
  if (n == 0) return NULL;
  const cJSON *m = cJSON_GetArrayItem(c->msgs, n - 1);
  const char *r = role_of(m);
  return r && !strcmp(r, role) ? content_of(m) : NULL;
}

void sm_conv_clear(sm_conv *c) {
  int keep = has_system(c) ? 1 : 0;
  while (cJSON_GetArraySize(c->msgs) > keep) cJSON_DeleteItemFromArray(c->msgs, keep);
}

int sm_conv_count(const sm_conv *c) { return cJSON_GetArraySize(c->msgs) - (has_system(c) ? 1 : 0); }

bool sm_conv_drop_oldest(sm_conv *c) {
  int first = has_system(c) ? 1 : 0, n = cJSON_GetArraySize(c->msgs);
  /* the turn: the first message and everything up to the next user message */
  int end = first + 1;
  while (end < n) {
    const char *r = role_of(cJSON_GetArrayItem(c->msgs, end));
    if (r && !strcmp(r, "user")) break;
    end++;
  }
  if (end >= n) return false; /* that would drop the message being answered */
  for (int i = first; i < end; i++) cJSON_DeleteItemFromArray(c->msgs, first);
  return true;
}

static smelt_status render(const sm_conv *c, char **out) {
  if (!c->tpl) return sm_chat_apply(c->tok, c->msgs, NULL, true, NULL, out);
  cJSON *ctx = cJSON_CreateObject();
  cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(c->msgs, true));
  cJSON_AddItemToObject(ctx, "tools", cJSON_CreateNull());
  cJSON_AddItemToObject(ctx, "documents", cJSON_CreateNull());
  cJSON_AddBoolToObject(ctx, "add_generation_prompt", true);
  const char *bos = sm_tok_bos_token(c->tok), *eos = sm_tok_eos_token(c->tok);
  if (bos) cJSON_AddStringToObject(ctx, "bos_token", bos);
  if (eos) cJSON_AddStringToObject(ctx, "eos_token", eos);
  smelt_status st = sm_jinja_render(c->tpl, ctx, out);
  cJSON_Delete(ctx);
  return st;
}

smelt_status sm_conv_tokens(const sm_conv *c, int32_t **ids, int *n) {
  sm_mm_span *spans = NULL;
  int ns = 0;
  smelt_status st = sm_conv_tokens_mm(c, ids, n, &spans, &ns);
  for (int i = 0; i < ns; i++) sm_vimage_unref(spans[i].img);
  free(spans);
  if (!st && ns) {
    free(*ids);
    *ids = NULL;
    return sm_err(SMELT_ERR_INVALID, "the conversation has images");
  }
  return st;
}

smelt_status sm_conv_tokens_mm(const sm_conv *c, int32_t **ids, int *n, sm_mm_span **spans, int *n_spans) {
  *ids = NULL;
  *n = 0;
  *spans = NULL;
  *n_spans = 0;
  char *text = NULL;
  smelt_status st;
  /* the images the messages refer to, in order */
  sm_vimage **order = NULL;
  int n_order = 0;
  const cJSON *m, *p;
  cJSON_ArrayForEach(m, c->msgs) {
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsArray(parts)) continue;
    cJSON_ArrayForEach(p, parts) {
      const cJSON *k = cJSON_GetObjectItemCaseSensitive(p, "smelt_image");
      if (!cJSON_IsNumber(k) || k->valueint < 0 || k->valueint >= c->n_imgs) continue;
      order = sm_xrealloc(order, sizeof(sm_vimage *) * (size_t)(n_order + 1));
      order[n_order++] = c->imgs[k->valueint];
    }
  }
  if (n_order && c->raw) {
    free(order);
    return sm_err(SMELT_ERR_INVALID, "images need a chat template (not --raw)");
  }
  if (n_order) {
    if ((st = render(c, &text))) {
      free(order);
      return st;
    }
    st = sm_vision_tokenize(c->vision, c->tok, text, false, order, n_order, ids, n, spans);
    if (!st) *n_spans = sm_vision_span_count(order, n_order);
    free(text);
    free(order);
    return st;
  }
  if (c->raw) { /* the messages' text one after another: the model continues it */
    sm_buf b = SM_BUF_INIT;
    const cJSON *m;
    cJSON_ArrayForEach(m, c->msgs) sm_buf_puts(&b, content_of(m) ? content_of(m) : "");
    text = sm_buf_take(&b);
  } else if ((st = render(c, &text))) {
    return st;
  }
  size_t k = 0;
  /* a rendered template already holds BOS where the model wants it */
  st = smelt_tokenize(c->tok, text, strlen(text), c->raw, ids, &k);
  free(text);
  *n = (int)k;
  return st;
}

smelt_status sm_conv_save(const sm_conv *c, const char *path) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "messages", cJSON_Duplicate(c->msgs, true));
  char *s = cJSON_Print(o);
  cJSON_Delete(o);
  FILE *f = fopen(path, "w");
  if (!f) {
    free(s);
    return sm_err(SMELT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  }
  bool ok = fputs(s, f) >= 0 && fputc('\n', f) != EOF;
  ok = (fclose(f) == 0) && ok;
  free(s);
  return ok ? SMELT_OK : sm_err(SMELT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
}

smelt_status sm_conv_load(sm_conv *c, const char *path) {
  char *text = NULL;
  size_t len = 0;
  smelt_status st = sm_read_file_max(path, SM_FILE_MAX_JSON, &text, &len);
  if (st) return st;
  cJSON *j = cJSON_ParseWithLength(text, len);
  free(text);
  if (!j) return sm_err(SMELT_ERR_FORMAT, "%s: not JSON", path);
  cJSON *msgs = cJSON_IsArray(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "messages");
  st = cJSON_IsArray(msgs) ? SMELT_OK : sm_err(SMELT_ERR_FORMAT, "%s: no \"messages\" array", path);
  int i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) {
    if (st) break;
    const char *r = role_of(m);
    if (!r || !content_of(m) || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
      st = sm_err(SMELT_ERR_FORMAT, "%s: message %d needs a role (system, user, assistant) and a text content", path,
                  i);
    else if (!strcmp(r, "system") && i != 0)
      st = sm_err(SMELT_ERR_FORMAT, "%s: message %d: a system message can only come first", path, i);
    i++;
  }
  if (!st) {
    cJSON_Delete(c->msgs);
    c->msgs = cJSON_CreateArray();
    cJSON_ArrayForEach(m, msgs) sm_conv_add(c, role_of(m), content_of(m));
  }
  cJSON_Delete(j);
  return st;
}
