/* SSE streaming of `smelt serve` (see sse.h). */
#include "server/sse.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  sm_api_error_set(&e, st->j->fail_status ? st->j->fail_status : 500, "server_error", NULL, NULL, "%s",
                   st->j->errmsg);
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

/* under mu: append newly available events to st->out */
void sm_sse_produce(sm_sse *st) {
  const sm_oai *o = st->o;
  sm_job *j = st->j;
  if (j->req.kind == SM_EP_RESPONSES) {
    sm_choice *c = &j->ch[0];
    char mid[80];
    snprintf(mid, sizeof mid, "msg_%s", j->id + 5);
    if (!st->head_sent) {
      st->head_sent = true;
      cJSON *e = cJSON_CreateObject();
      cJSON_AddItemToObject(e, "response", sm_oai_response_object(o, j, "in_progress"));
      sse_event(st, "response.created", e);
      e = cJSON_CreateObject();
      cJSON_AddItemToObject(e, "response", sm_oai_response_object(o, j, "in_progress"));
      sse_event(st, "response.in_progress", e);
      e = cJSON_CreateObject();
      cJSON_AddNumberToObject(e, "output_index", 0);
      cJSON *it = cJSON_AddObjectToObject(e, "item");
      cJSON_AddStringToObject(it, "type", "message");
      cJSON_AddStringToObject(it, "id", mid);
      cJSON_AddStringToObject(it, "status", "in_progress");
      cJSON_AddStringToObject(it, "role", "assistant");
      cJSON_AddArrayToObject(it, "content");
      sse_event(st, "response.output_item.added", e);
      e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "item_id", mid);
      cJSON_AddNumberToObject(e, "output_index", 0);
      cJSON_AddNumberToObject(e, "content_index", 0);
      cJSON *part = cJSON_AddObjectToObject(e, "part");
      cJSON_AddStringToObject(part, "type", "output_text");
      cJSON_AddStringToObject(part, "text", "");
      cJSON_AddArrayToObject(part, "annotations");
      sse_event(st, "response.content_part.added", e);
    }
    if (j->failed) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "code", "server_error");
      cJSON_AddStringToObject(e, "message", j->errmsg);
      sse_event(st, "error", e);
      st->finished = true;
      return;
    }
    if (c->safe > st->resp_sent && !j->tool_mode) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "item_id", mid);
      cJSON_AddNumberToObject(e, "output_index", 0);
      cJSON_AddNumberToObject(e, "content_index", 0);
      char *t = sm_xmalloc(c->safe - st->resp_sent + 1);
      memcpy(t, c->text.p + st->resp_sent, c->safe - st->resp_sent);
      t[c->safe - st->resp_sent] = 0;
      cJSON_AddStringToObject(e, "delta", t);
      free(t);
      sse_event(st, "response.output_text.delta", e);
      st->resp_sent = c->safe;
    }
    if (j->done) {
      sm_oai_final f;
      sm_oai_finalize(j, 0, &f);
      if (j->tool_mode && f.content && !f.tool_calls) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "item_id", mid);
        cJSON_AddNumberToObject(e, "output_index", 0);
        cJSON_AddNumberToObject(e, "content_index", 0);
        cJSON_AddStringToObject(e, "delta", f.content);
        sse_event(st, "response.output_text.delta", e);
      }
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "item_id", mid);
      cJSON_AddNumberToObject(e, "output_index", 0);
      cJSON_AddNumberToObject(e, "content_index", 0);
      cJSON_AddStringToObject(e, "text", f.content ? f.content : "");
      sse_event(st, "response.output_text.done", e);
      free(f.content);
      cJSON_Delete(f.tool_calls);
      cJSON *full = sm_oai_response_object(o, j, "completed");
      cJSON *out = cJSON_GetObjectItemCaseSensitive(full, "output"), *it;
      int oi = 0;
      cJSON_ArrayForEach(it, out) {
        e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "output_index", oi++);
        cJSON_AddItemToObject(e, "item", cJSON_Duplicate(it, 1));
        sse_event(st, "response.output_item.done", e);
      }
      e = cJSON_CreateObject();
      cJSON_AddItemToObject(e, "response", full);
      sse_event(st, "response.completed", e);
      st->finished = true;
    }
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
    if (c->finish && j->tool_mode) {
      sm_oai_final f;
      sm_oai_finalize(j, i, &f);
      if (f.tool_calls) {
        /* content before the call that was not streamed yet */
        if (f.content && strlen(f.content) > c->sent)
          chunk_choice(st, i, f.content + c->sent, strlen(f.content) - c->sent, c->toks_sent, c->n_toks, NULL, NULL,
                       false);
        chunk_choice(st, i, NULL, 0, 0, 0, NULL, f.tool_calls, false);
        f.tool_calls = NULL;
      } else if (c->text.n > c->sent) {
        chunk_choice(st, i, c->text.p + c->sent, c->text.n - c->sent, c->toks_sent, sm_oai_toks_upto(c, c->text.n, c->toks_sent),
                     NULL, NULL, false);
      }
      c->sent = c->text.n;
      c->toks_sent = c->n_toks;
      chunk_choice(st, i, NULL, 0, 0, 0, f.finish, NULL, false);
      c->end_sent = true;
      free(f.content);
      cJSON_Delete(f.tool_calls);
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
      if (j->req.include_usage) {
        sse_data(&st->out, sm_oai_usage_chunk(o, j));
      }
      sm_buf_puts(&st->out, "data: [DONE]\n\n");
      st->finished = true;
    }
  }
}

