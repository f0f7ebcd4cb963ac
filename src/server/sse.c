/* SSE streaming of `smelt serve` (see sse.h). Text is streamed as it becomes settled: no stop
 * string can still cut it (c->safe) and, for requests with tools or reasoning, sm_view has
 * decided whether it is reasoning, content or a tool call. Tool calls stream in the OpenAI
 * shape: a first delta with the call's index, id, type and name, then argument deltas. */
#include "server/sse.h"
#include "server/anthropic.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sm_sse_init(sm_sse *st, const sm_oai *o, sm_job *j) {
  memset(st, 0, sizeof *st);
  st->o = o;
  st->j = j;
  st->msg_index = st->rs_index = -1;
}

static void sse_data(sm_buf *b, cJSON *j) {
  sm_buf_puts(b, "data: ");
  sm_oai_print(j, b);
  cJSON_Delete(j);
  sm_buf_puts(b, "\n\n");
}

static void sse_event(sm_sse *st, const char *type, cJSON *j) {
  cJSON_AddStringToObject(j, "type", type);
  cJSON_AddNumberToObject(j, "sequence_number", st->seqnum++);
  sm_buf_puts(&st->out, "event: ");
  sm_buf_puts(&st->out, type);
  sm_buf_puts(&st->out, "\ndata: ");
  sm_oai_print(j, &st->out);
  cJSON_Delete(j);
  sm_buf_puts(&st->out, "\n\n");
}

static void stream_err(sm_sse *st) {
  sm_api_error e;
  sm_api_error_set(&e, st->j->fail_status ? st->j->fail_status : 500, "server_error", NULL, NULL, "%s", st->j->errmsg);
  char *b = sm_api_error_json(&e);
  sm_buf_puts(&st->out, "data: ");
  sm_oai_put_utf8(&st->out, b, strlen(b));
  sm_buf_puts(&st->out, "\n\n");
  free(b);
}

static void chunk_choice(sm_sse *st, int i, const char *text, size_t tlen, int tfrom, int tto, const char *finish,
                         cJSON *tool_calls, bool role) {
  sse_data(&st->out, sm_oai_chunk(st->o, st->j, i, text, tlen, tfrom, tto, finish, tool_calls, role));
}

static char *dupn(const char *s, size_t n) {
  char *t = sm_xmalloc(n + 1);
  memcpy(t, s, n);
  t[n] = 0;
  return t;
}

/* ------------------------------------------------------------------ responses */

static void item_added(sm_sse *st, int index, cJSON *item) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddNumberToObject(e, "output_index", index);
  cJSON_AddItemToObject(e, "item", item);
  sse_event(st, "response.output_item.added", e);
}

static void text_event(sm_sse *st, const char *type, const char *id_prefix, int index, const char *key,
                       const char *text, size_t n) {
  char id[80];
  snprintf(id, sizeof id, "%s_%s", id_prefix, st->j->id + 5);
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "item_id", id);
  cJSON_AddNumberToObject(e, "output_index", index);
  cJSON_AddNumberToObject(e, "content_index", 0);
  char *t = dupn(text, n);
  cJSON_AddStringToObject(e, key, t);
  free(t);
  sse_event(st, type, e);
}

static void add_message_item(sm_sse *st) {
  char mid[80];
  snprintf(mid, sizeof mid, "msg_%s", st->j->id + 5);
  st->msg_index = st->next_index++;
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "type", "message");
  cJSON_AddStringToObject(it, "id", mid);
  cJSON_AddStringToObject(it, "status", "in_progress");
  cJSON_AddStringToObject(it, "role", "assistant");
  cJSON_AddArrayToObject(it, "content");
  item_added(st, st->msg_index, it);
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "item_id", mid);
  cJSON_AddNumberToObject(e, "output_index", st->msg_index);
  cJSON_AddNumberToObject(e, "content_index", 0);
  cJSON *part = cJSON_AddObjectToObject(e, "part");
  cJSON_AddStringToObject(part, "type", "output_text");
  cJSON_AddStringToObject(part, "text", "");
  cJSON_AddArrayToObject(part, "annotations");
  sse_event(st, "response.content_part.added", e);
}

static void add_reasoning_item(sm_sse *st) {
  char rid[80];
  snprintf(rid, sizeof rid, "rs_%s", st->j->id + 5);
  st->rs_index = st->next_index++;
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "type", "reasoning");
  cJSON_AddStringToObject(it, "id", rid);
  cJSON_AddArrayToObject(it, "summary");
  cJSON_AddArrayToObject(it, "content");
  cJSON_AddStringToObject(it, "status", "in_progress");
  item_added(st, st->rs_index, it);
}

static void produce_responses(sm_sse *st) {
  const sm_oai *o = st->o;
  sm_job *j = st->j;
  sm_choice *c = &j->ch[0];
  if (!st->head_sent) {
    st->head_sent = true;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "response", sm_oai_response_object(o, j, "in_progress"));
    sse_event(st, "response.created", e);
    e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "response", sm_oai_response_object(o, j, "in_progress"));
    sse_event(st, "response.in_progress", e);
  }
  if (j->failed) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "code", "server_error");
    cJSON_AddStringToObject(e, "message", j->errmsg);
    sse_event(st, "error", e);
    st->finished = true;
    return;
  }
  /* settled reasoning and content (tool calls are sent whole at the end) */
  sm_view v = {0};
  sm_view_build(j, c, &v);
  if (v.reasoning_safe > st->rs_sent) {
    if (st->rs_index < 0) add_reasoning_item(st);
    text_event(st, "response.reasoning_text.delta", "rs", st->rs_index, "delta", v.reasoning.p + st->rs_sent,
               v.reasoning_safe - st->rs_sent);
    st->rs_sent = v.reasoning_safe;
  }
  /* content streams as it settles; with tools it is sent whole at the end */
  if (!j->tool_mode && v.tc.content.n > st->resp_sent && !j->done) {
    if (st->msg_index < 0) add_message_item(st);
    text_event(st, "response.output_text.delta", "msg", st->msg_index, "delta", v.tc.content.p + st->resp_sent,
               v.tc.content.n - st->resp_sent);
    st->resp_sent = v.tc.content.n;
  }
  sm_view_free(&v);
  if (!j->done) return;
  /* the end: the final object decides the items; announce the ones not yet added */
  cJSON *full = sm_oai_response_object(o, j, "completed");
  cJSON *out = cJSON_GetObjectItemCaseSensitive(full, "output"), *it;
  cJSON_ArrayForEach(it, out) {
    const char *ty = cJSON_GetObjectItemCaseSensitive(it, "type")->valuestring;
    int idx;
    if (!strcmp(ty, "message")) {
      const char *text =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(it, "content"), 0), "text")
          ->valuestring;
      if (st->msg_index < 0) add_message_item(st);
      idx = st->msg_index;
      size_t tl = strlen(text);
      if (tl > st->resp_sent)
        text_event(st, "response.output_text.delta", "msg", idx, "delta", text + SM_MIN(st->resp_sent, tl),
                   tl - SM_MIN(st->resp_sent, tl));
      text_event(st, "response.output_text.done", "msg", idx, "text", text, tl);
      cJSON *e = cJSON_CreateObject();
      char mid[80];
      snprintf(mid, sizeof mid, "msg_%s", j->id + 5);
      cJSON_AddStringToObject(e, "item_id", mid);
      cJSON_AddNumberToObject(e, "output_index", idx);
      cJSON_AddNumberToObject(e, "content_index", 0);
      cJSON_AddItemToObject(e, "part",
                            cJSON_Duplicate(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(it, "content"), 0), 1));
      sse_event(st, "response.content_part.done", e);
    } else if (!strcmp(ty, "reasoning")) {
      const char *text =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(it, "content"), 0), "text")
          ->valuestring;
      if (st->rs_index < 0) add_reasoning_item(st);
      idx = st->rs_index;
      text_event(st, "response.reasoning_text.done", "rs", idx, "text", text, strlen(text));
    } else { /* function_call */
      idx = st->next_index++;
      cJSON *added = cJSON_Duplicate(it, 1);
      cJSON_ReplaceItemInObjectCaseSensitive(added, "arguments", cJSON_CreateString(""));
      cJSON_ReplaceItemInObjectCaseSensitive(added, "status", cJSON_CreateString("in_progress"));
      item_added(st, idx, added);
      const char *args = cJSON_GetObjectItemCaseSensitive(it, "arguments")->valuestring;
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "item_id", cJSON_GetObjectItemCaseSensitive(it, "id")->valuestring);
      cJSON_AddNumberToObject(e, "output_index", idx);
      cJSON_AddStringToObject(e, "delta", args);
      sse_event(st, "response.function_call_arguments.delta", e);
      e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "item_id", cJSON_GetObjectItemCaseSensitive(it, "id")->valuestring);
      cJSON_AddNumberToObject(e, "output_index", idx);
      cJSON_AddStringToObject(e, "arguments", args);
      sse_event(st, "response.function_call_arguments.done", e);
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "output_index", idx);
    cJSON_AddItemToObject(e, "item", cJSON_Duplicate(it, 1));
    sse_event(st, "response.output_item.done", e);
  }
  const char *status = cJSON_GetObjectItemCaseSensitive(full, "status")->valuestring;
  cJSON *e = cJSON_CreateObject();
  cJSON_AddItemToObject(e, "response", full);
  sse_event(st, !strcmp(status, "incomplete") ? "response.incomplete" : "response.completed", e);
  st->finished = true;
}

/* ------------------------------------------------------------------ chat with tools / reasoning */

static void produce_parsed_choice(sm_sse *st, int i) {
  sm_job *j = st->j;
  sm_choice *c = &j->ch[i];
  bool final = c->finish != SM_FIN_NONE;
  sm_view v = {0};
  sm_view_build(j, c, &v);
  if (v.reasoning_safe > c->rsent) {
    sse_data(&st->out, sm_oai_reasoning_chunk(st->o, j, i, v.reasoning.p + c->rsent, v.reasoning_safe - c->rsent));
    c->rsent = v.reasoning_safe;
  }
  /* content: in tool mode without leading blanks, and trailing blanks wait (a call may follow) */
  const char *ct = sm_buf_str(&v.tc.content);
  size_t cs = final ? v.tc.content.n : v.tc.safe, start = 0;
  if (j->tool_mode) {
    while (start < cs && isspace((unsigned char)ct[start])) start++;
    if (!final || v.tc.n)
      while (cs > start && isspace((unsigned char)ct[cs - 1])) cs--;
  }
  if (c->sent < start) c->sent = cs > start ? start : c->sent;
  int tto = sm_oai_toks_upto(c, final ? c->text.n : c->safe, c->toks_sent);
  if (cs > c->sent) {
    chunk_choice(st, i, ct + c->sent, cs - c->sent, c->toks_sent, tto, NULL, NULL, false);
    c->sent = cs;
    c->toks_sent = tto;
  }
  /* calls: announce each once its name is known, then stream its arguments */
  for (int k = 0; k < v.tc.n; k++) {
    sm_tc_call *tc = &v.tc.calls[k];
    if (k >= c->calls_sent) {
      if (!tc->name || k != c->calls_sent) break;
      if (c->args_cap <= k) {
        c->args_cap = k + 8;
        c->args_sent = sm_xrealloc(c->args_sent, sizeof(size_t) * (size_t)c->args_cap);
      }
      c->args_sent[k] = 0;
      cJSON *arr = cJSON_CreateArray(), *o = cJSON_CreateObject();
      char id[64];
      sm_oai_call_id(j, i, k, id, sizeof id);
      cJSON_AddNumberToObject(o, "index", k);
      cJSON_AddStringToObject(o, "id", id);
      cJSON_AddStringToObject(o, "type", "function");
      cJSON *fn = cJSON_AddObjectToObject(o, "function");
      cJSON_AddStringToObject(fn, "name", tc->name);
      cJSON_AddStringToObject(fn, "arguments", "");
      cJSON_AddItemToArray(arr, o);
      chunk_choice(st, i, NULL, 0, 0, 0, NULL, arr, false);
      c->calls_sent++;
    }
    const char *args = tc->args.n ? tc->args.p : (tc->done ? "{}" : "");
    size_t an = strlen(args);
    if (an > c->args_sent[k]) {
      cJSON *arr = cJSON_CreateArray(), *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, "index", k);
      cJSON *fn = cJSON_AddObjectToObject(o, "function");
      char *d = dupn(args + c->args_sent[k], an - c->args_sent[k]);
      cJSON_AddStringToObject(fn, "arguments", d);
      free(d);
      cJSON_AddItemToArray(arr, o);
      chunk_choice(st, i, NULL, 0, 0, 0, NULL, arr, false);
      c->args_sent[k] = an;
    }
  }
  if (final) {
    const char *fin = c->finish == SM_FIN_LENGTH ? "length" : v.tc.n ? "tool_calls" : "stop";
    int rest = sm_oai_toks_upto(c, c->text.n, c->toks_sent);
    chunk_choice(st, i, NULL, 0, c->toks_sent, rest, fin, NULL, false);
    c->toks_sent = rest;
    c->end_sent = true;
  }
  sm_view_free(&v);
}

/* under mu: append newly available events to st->out */
void sm_sse_produce(sm_sse *st) {
  sm_job *j = st->j;
  if (j->req.kind == SM_EP_RESPONSES) {
    produce_responses(st);
    return;
  }
  if (j->req.kind == SM_EP_MESSAGES) {
    sm_anth_sse_produce(st);
    return;
  }
  bool chat = j->req.kind == SM_EP_CHAT;
  if (!st->head_sent) {
    st->head_sent = true;
    if (chat)
      for (int i = 0; i < j->n; i++) chunk_choice(st, i, "", 0, 0, 0, NULL, NULL, true);
    else if (j->req.echo && j->req.prompt)
      for (int i = 0; i < j->n; i++) chunk_choice(st, i, j->req.prompt, strlen(j->req.prompt), 0, 0, NULL, NULL, false);
  }
  if (j->failed) {
    stream_err(st);
    sm_buf_puts(&st->out, "data: [DONE]\n\n");
    st->finished = true;
    return;
  }
  for (int i = 0; i < j->n; i++) {
    sm_choice *c = &j->ch[i];
    if (c->end_sent) continue;
    if (j->parsed) {
      produce_parsed_choice(st, i);
      continue;
    }
    if (c->safe > c->sent) {
      int tto = sm_oai_toks_upto(c, c->safe, c->toks_sent);
      chunk_choice(st, i, c->text.p + c->sent, c->safe - c->sent, c->toks_sent, tto, NULL, NULL, false);
      c->sent = c->safe;
      c->toks_sent = tto;
    }
    if (c->finish && c->sent == c->text.n) {
      chunk_choice(st, i, chat ? NULL : "", 0, 0, 0, c->finish == SM_FIN_LENGTH ? "length" : "stop", NULL, false);
      c->end_sent = true;
    }
  }
  if (j->done) {
    bool all = true;
    for (int i = 0; i < j->n; i++) all &= j->ch[i].end_sent;
    if (all) {
      if (j->req.include_usage) sse_data(&st->out, sm_oai_usage_chunk(st->o, j));
      sm_buf_puts(&st->out, "data: [DONE]\n\n");
      st->finished = true;
    }
  }
}
