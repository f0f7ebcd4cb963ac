/* OpenAI API glue of `smelt serve`: request -> job, job -> response JSON (see openai.h). */
#include "server/openai.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "server/anthropic.h"
#include "server/constrain.h"
#include "server/embeddings.h"
#include "tokenizer/chat.h"
#include "vision/vision.h"

#define REJECT(status, param, code, ...) \
  do { \
    sm_api_error_set(err, status, "invalid_request_error", param, code, __VA_ARGS__); \
    goto fail; \
  } while (0)

/* DeepSeek's templates concatenate tool-call arguments as strings: give them the JSON text */
static void args_as_strings(cJSON *messages) {
  cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
      cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
      cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
      if (!a || cJSON_IsString(a)) continue;
      char *t = cJSON_PrintUnformatted(a);
      cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", cJSON_CreateString(t));
      free(t);
    }
  }
}

/* /v1/completions with several prompts: one job whose choices are prompt-major (prompt p,
 * choice c -> index p * n + c), each with a sequence of its own. Takes over req. */
/* what each position of the request's grammar decides, computed here on the HTTP thread (a
 * grammar used before has it already; the first constrained request builds the grammar
 * vocabulary too), not on the engine thread between steps (grammar.h, sm_grammar_precompute) */
static void precompute(const sm_oai *o, const sm_grammar *g) {
  if (g && o->sched) sm_grammar_precompute(g, sm_sched_grammar_vocab(o->sched));
}

static sm_job *multi_prompt_job(const sm_oai *o, sm_api_request *req, sm_api_error *err) {
  int np = req->n_prompts, per = req->n, total = np * per, max_tokens = req->max_tokens;
  sm_grammar *grammar = NULL;
  sm_buf all = SM_BUF_INIT; /* the prompts' ids, one after the other */
  int *off = sm_xmalloc(sizeof(int) * (size_t)np), *len = sm_xmalloc(sizeof(int) * (size_t)np);
  int min_room = o->ctx;
  if (total > o->parallel)
    REJECT(400, "prompt", NULL, "%d prompts x n=%d choices exceed the server's --parallel (%d)", np, per, o->parallel);
  if (req->stream) REJECT(400, "stream", NULL, "streaming is not supported with several prompts");
  for (int p = 0; p < np; p++) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (req->prompts[p]) {
      if (smelt_tokenize(o->tok, req->prompts[p], strlen(req->prompts[p]), true, &ids, &n) != SMELT_OK)
        REJECT(400, "prompt", NULL, "could not tokenize prompt %d: %s", p, sm_errmsg());
    } else {
      n = (size_t)req->prompt_lens[p];
      ids = sm_xmalloc(sizeof(int32_t) * n);
      memcpy(ids, req->prompt_lists[p], sizeof(int32_t) * n);
      for (size_t i = 0; i < n; i++)
        if (ids[i] >= o->vocab) {
          free(ids);
          REJECT(400, "prompt", NULL, "prompt %d: token id out of the vocabulary", p);
        }
    }
    if (n == 0 || (int)n >= o->ctx || (max_tokens > 0 && (long)n + max_tokens > o->ctx)) {
      free(ids);
      REJECT(400, "prompt", n ? "context_length_exceeded" : NULL,
             "prompt %d: %zu tokens do not fit the context of %d%s", p, n, o->ctx,
             max_tokens > 0 ? " with max_tokens" : "");
    }
    off[p] = (int)(all.n / sizeof(int32_t));
    len[p] = (int)n;
    sm_buf_put(&all, ids, n * sizeof(int32_t));
    free(ids);
    min_room = SM_MIN(min_room, o->ctx - (int)n);
  }
  if (!sm_constrain_build(o->tok, o->tfmt, o->gpool, req, &grammar, err)) goto fail;
  precompute(o, grammar);
  int n_all = (int)(all.n / sizeof(int32_t));
  int32_t *prompt = sm_xmalloc(all.n);
  memcpy(prompt, all.p, all.n);
  sm_buf_free(&all);
  req->n = total;
  sm_job *j = sm_job_new(req, prompt, n_all, max_tokens > 0 ? max_tokens : min_room, false);
  j->grammar = grammar;
  j->per_prompt = per;
  for (int i = 0; i < total; i++) {
    j->ch[i].p_off = off[i / per];
    j->ch[i].p_len = len[i / per];
  }
  free(off);
  free(len);
  return j;
fail:
  sm_grammar_free(grammar);
  sm_buf_free(&all);
  free(off);
  free(len);
  sm_api_request_free(req);
  return NULL;
}

sm_job *sm_oai_make_job(const sm_oai *o, sm_ep_kind kind, const char *body, size_t len, sm_api_error *err) {
  sm_api_request req;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  sm_grammar *grammar = NULL;
  bool think_open = false;
  sm_mm_span *spans = NULL;
  int n_spans = 0;
  if (!sm_api_parse(kind, body, len, &req, err)) return NULL;
  if (kind == SM_EP_EMBEDDINGS) {
    req.stream = false;
    return sm_emb_make_job(o, &req, err);
  }
  if (req.n > o->parallel) REJECT(400, "n", NULL, "'n' must not exceed the server's --parallel (%d)", o->parallel);
  for (int i = 0; i < req.n_bias; i++)
    if (req.bias_ids[i] >= o->vocab)
      REJECT(400, "logit_bias", NULL, "'logit_bias' token %d is not in the vocabulary (%d)", req.bias_ids[i], o->vocab);
  /* default sampling from generation_config when the request gives none */
  if (!req.has_temperature && o->gen_temperature > 0) req.sampling.temperature = o->gen_temperature;
  if (!req.has_top_p && o->gen_top_p > 0) req.sampling.top_p = o->gen_top_p;
  if (!req.has_top_k && o->gen_top_k > 0) req.sampling.top_k = o->gen_top_k;
  /* images: refused early for a model without a vision tower (its template may not render them) */
  if (req.n_images && !o->vision) {
    sm_request_images(NULL, o->model_id, o->vision_note, &o->images, &req, NULL, err);
    goto fail;
  }
  /* prompt */
  const char *pparam = kind == SM_EP_COMPLETIONS ? "prompt" : kind == SM_EP_RESPONSES ? "input" : "messages";
  if (req.n_prompts > 1) return multi_prompt_job(o, &req, err);
  if (kind == SM_EP_COMPLETIONS && req.prompt_ids) {
    for (int i = 0; i < req.n_prompt_ids; i++)
      if (req.prompt_ids[i] >= o->vocab) REJECT(400, "prompt", NULL, "token id out of the vocabulary");
    n_ids = (size_t)req.n_prompt_ids;
    ids = sm_xmalloc(sizeof(int32_t) * (n_ids ? n_ids : 1));
    memcpy(ids, req.prompt_ids, sizeof(int32_t) * n_ids);
  } else {
    char *text = NULL;
    /* raw completions text gets the post-processor's special tokens (BOS); a rendered chat
     * template already holds the ones the model wants and is encoded as it is, as transformers,
     * vLLM and `smelt run` do */
    bool add_special = kind == SM_EP_COMPLETIONS;
    if (kind == SM_EP_COMPLETIONS) {
      text = sm_xstrdup(req.prompt);
    } else {
      if (req.reasoning_effort) { /* handed to the template (gpt-oss reads it) */
        if (!req.chat_template_kwargs) req.chat_template_kwargs = cJSON_CreateObject();
        if (!cJSON_GetObjectItemCaseSensitive(req.chat_template_kwargs, "reasoning_effort"))
          cJSON_AddStringToObject(req.chat_template_kwargs, "reasoning_effort", req.reasoning_effort);
      }
      if (o->tfmt && o->tfmt->kind == SM_TF_DEEPSEEK) args_as_strings(req.messages);
      if (sm_chat_apply(o->tok, req.messages, req.tools, true, req.chat_template_kwargs, &text) != SMELT_OK)
        REJECT(400, pparam, NULL, "could not apply the chat template: %s", sm_errmsg());
      /* a prompt that ends inside <think> (Qwen3, DeepSeek-R1): the output starts with reasoning */
      size_t tl = strlen(text);
      while (tl && (text[tl - 1] == '\n' || text[tl - 1] == ' ')) tl--;
      think_open = tl >= 7 && !memcmp(text + tl - 7, "<think>", 7);
    }
    smelt_status st;
    if (req.n_images) { /* images: decoded, prepared, and their placeholders expanded in the prompt */
      sm_vimage **imgs = NULL;
      if (!sm_request_images(o->vision, o->model_id, o->vision_note, &o->images, &req, &imgs, err)) {
        free(text);
        goto fail;
      }
      int ni = 0;
      st = sm_vision_tokenize(o->vision, o->tok, text, add_special, imgs, req.n_images, &ids, &ni, &spans);
      if (!st) n_spans = sm_vision_span_count(imgs, req.n_images);
      for (int i = 0; i < req.n_images; i++) sm_vimage_unref(imgs[i]);
      free(imgs);
      n_ids = (size_t)(ni > 0 ? ni : 0);
    } else {
      st = smelt_tokenize(o->tok, text, strlen(text), add_special, &ids, &n_ids);
    }
    free(text);
    if (st != SMELT_OK) REJECT(400, pparam, NULL, "could not tokenize the prompt: %s", sm_errmsg());
  }
  if (n_ids == 0) REJECT(400, pparam, NULL, "the prompt is empty");
  int max_tokens = req.max_tokens;
  if ((int)n_ids >= o->ctx || (max_tokens > 0 && (long)n_ids + max_tokens > o->ctx))
    REJECT(400, pparam, "context_length_exceeded",
           "This model's maximum context length is %d tokens. However, you requested %ld tokens (%zu in the "
           "prompt, %d for the completion). Please reduce the prompt or the completion length.",
           o->ctx, (long)n_ids + (max_tokens > 0 ? max_tokens : 0), n_ids, max_tokens > 0 ? max_tokens : 0);
  if (max_tokens <= 0) max_tokens = o->ctx - (int)n_ids;
  if (!sm_constrain_build(o->tok, o->tfmt, o->gpool, &req, &grammar, err)) goto fail;
  precompute(o, grammar);
  bool tool_mode = req.tools != NULL && kind != SM_EP_COMPLETIONS;
  bool harmony = kind != SM_EP_COMPLETIONS && o->tfmt && o->tfmt->kind == SM_TF_HARMONY;
  sm_job *j = sm_job_new(&req, ids, (int)n_ids, max_tokens, tool_mode);
  j->spans = spans;
  j->n_spans = n_spans;
  j->grammar = grammar;
  j->tfmt = o->tfmt;
  j->reasoning = kind != SM_EP_COMPLETIONS && o->reasoning && !grammar;
  j->think_open = j->reasoning && think_open;
  j->keep_special = (tool_mode || harmony) && o->tfmt && o->tfmt->keep_special;
  j->parsed = tool_mode || harmony || j->reasoning;
  return j;
fail:
  sm_grammar_free(grammar);
  free(ids);
  for (int i = 0; i < n_spans; i++) sm_vimage_unref(spans[i].img);
  free(spans);
  sm_api_request_free(&req);
  return NULL;
}

cJSON *sm_oai_models(const sm_oai *o) {
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "object", "list");
  cJSON *d = cJSON_AddArrayToObject(r, "data"), *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", o->model_id);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)o->created);
  cJSON_AddStringToObject(m, "owned_by", "smelt");
  cJSON *meta = cJSON_AddObjectToObject(m, "meta");
  cJSON_AddStringToObject(meta, "arch", o->arch);
  cJSON_AddNumberToObject(meta, "n_ctx", o->ctx);
  cJSON_AddNumberToObject(meta, "n_vocab", o->vocab);
  cJSON_AddItemToArray(d, m);
  return r;
}

/* ------------------------------------------------------------------ responses */

static char *tok_str(const sm_oai *o, int32_t id) {
  char *t = NULL;
  if (smelt_detokenize(o->tok, &id, 1, false, &t) != SMELT_OK || !t) t = sm_xstrdup("");
  return t;
}

static cJSON *bytes_arr(const char *t) {
  cJSON *b = cJSON_CreateArray();
  for (const unsigned char *p = (const unsigned char *)t; *p; p++) cJSON_AddItemToArray(b, cJSON_CreateNumber(*p));
  return b;
}

/* chat logprobs content entries for toks [from, to) */
static cJSON *chat_logprobs(const sm_oai *o, sm_job *j, sm_choice *c, int from, int to) {
  cJSON *lp = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(lp, "content");
  for (int k = from; k < to; k++) {
    sm_tokrec *r = &c->toks[k];
    cJSON *e = cJSON_CreateObject();
    char *t = tok_str(o, r->id);
    cJSON_AddStringToObject(e, "token", t);
    cJSON_AddNumberToObject(e, "logprob", r->lp);
    cJSON_AddItemToObject(e, "bytes", bytes_arr(t));
    free(t);
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < r->ntop; i++) {
      cJSON *te = cJSON_CreateObject();
      char *tt = tok_str(o, r->top_ids[i]);
      cJSON_AddStringToObject(te, "token", tt);
      cJSON_AddNumberToObject(te, "logprob", r->top_lps[i]);
      cJSON_AddItemToObject(te, "bytes", bytes_arr(tt));
      free(tt);
      cJSON_AddItemToArray(top, te);
    }
    cJSON_AddItemToArray(arr, e);
  }
  cJSON_AddNullToObject(lp, "refusal");
  return lp;
}

/* completions logprobs for toks [from, to); text offsets relative to base */
static cJSON *compl_logprobs(const sm_oai *o, sm_job *j, sm_choice *c, int from, int to, size_t base) {
  cJSON *lp = cJSON_CreateObject();
  cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
  cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs"), *off = cJSON_AddArrayToObject(lp, "text_offset");
  for (int k = from; k < to; k++) {
    sm_tokrec *r = &c->toks[k];
    char *t = tok_str(o, r->id);
    cJSON_AddItemToArray(toks, cJSON_CreateString(t));
    free(t);
    cJSON_AddItemToArray(tlp, cJSON_CreateNumber(r->lp));
    cJSON *tops = cJSON_CreateObject();
    for (int i = 0; i < r->ntop; i++) {
      char *tt = tok_str(o, r->top_ids[i]);
      if (!cJSON_GetObjectItemCaseSensitive(tops, tt)) cJSON_AddNumberToObject(tops, tt, r->top_lps[i]);
      free(tt);
    }
    cJSON_AddItemToArray(top, tops);
    size_t start = k ? c->toks[k - 1].end : 0;
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(base + start)));
  }
  return lp;
}

int sm_oai_toks_upto(const sm_choice *c, size_t upto, int from) {
  int k = from;
  while (k < c->n_toks && c->toks[k].end <= upto) k++;
  return k;
}

cJSON *sm_oai_usage(const sm_job *j, bool responses) {
  int gen = 0;
  for (int i = 0; i < j->n; i++) gen += j->ch[i].n_gen;
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, responses ? "input_tokens" : "prompt_tokens", j->n_prompt);
  cJSON_AddNumberToObject(u, responses ? "output_tokens" : "completion_tokens", gen);
  cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + gen);
  cJSON *d = cJSON_AddObjectToObject(u, responses ? "input_tokens_details" : "prompt_tokens_details");
  cJSON_AddNumberToObject(d, "cached_tokens", j->n_cached);
  int rt = 0;
  for (int i = 0; i < j->n; i++) rt += sm_view_reasoning_tokens(j, &j->ch[i]);
  if (responses || j->req.kind == SM_EP_CHAT) {
    cJSON *od = cJSON_AddObjectToObject(u, responses ? "output_tokens_details" : "completion_tokens_details");
    cJSON_AddNumberToObject(od, "reasoning_tokens", rt);
  }
  return u;
}

void sm_oai_call_id(const sm_job *j, int i, int k, char *out, size_t n) {
  sm_tc_call_id(sm_mix64(j->seq_no * 131 + (uint64_t)i), k, out, n);
}

static char *trim_dup(const char *s, size_t len) {
  while (len && isspace((unsigned char)*s)) s++, len--;
  while (len && isspace((unsigned char)s[len - 1])) len--;
  if (!len) return NULL;
  char *o = sm_xmalloc(len + 1);
  memcpy(o, s, len);
  o[len] = 0;
  return o;
}

void sm_oai_finalize(sm_job *j, int i, sm_oai_final *f) {
  sm_choice *c = &j->ch[i];
  memset(f, 0, sizeof *f);
  f->finish = c->finish == SM_FIN_LENGTH ? "length" : "stop";
  if (!j->parsed) {
    f->content = sm_xstrdup(sm_buf_str(&c->text));
    return;
  }
  sm_view v = {0};
  sm_view_build(j, c, &v);
  if (v.reasoning.n) f->reasoning = trim_dup(v.reasoning.p, v.reasoning.n);
  if (v.tc.n) {
    f->tool_calls = sm_tc_calls_json(&v.tc, sm_mix64(j->seq_no * 131 + (uint64_t)i));
    f->content = trim_dup(sm_buf_str(&v.tc.content), v.tc.content.n);
    if (c->finish != SM_FIN_LENGTH) f->finish = "tool_calls";
  } else if (j->tool_mode) { /* blanks before a call that did not come are not content */
    const char *t = sm_buf_str(&v.tc.content);
    while (isspace((unsigned char)*t)) t++;
    f->content = sm_xstrdup(t);
  } else {
    f->content = sm_xstrdup(sm_buf_str(&v.tc.content));
  }
  sm_view_free(&v);
}

cJSON *sm_oai_response_object(const sm_oai *o, sm_job *j, const char *status) {
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "object", "response");
  cJSON_AddNumberToObject(r, "created_at", (double)j->created);
  cJSON_AddStringToObject(r, "status", status);
  cJSON_AddStringToObject(r, "model", o->model_id);
  cJSON *out = cJSON_AddArrayToObject(r, "output");
  if (!strcmp(status, "in_progress")) {
    cJSON_AddNullToObject(r, "usage");
    return r;
  }
  sm_oai_final f;
  sm_oai_finalize(j, 0, &f);
  bool truncated = f.finish[0] == 'l';
  if (truncated) { /* the response and its last item are incomplete */
    cJSON_SetValuestring(cJSON_GetObjectItemCaseSensitive(r, "status"), "incomplete");
    cJSON *d = cJSON_AddObjectToObject(r, "incomplete_details");
    cJSON_AddStringToObject(d, "reason", "max_output_tokens");
  }
  const char *item_status = truncated ? "incomplete" : "completed";
  if (f.reasoning) {
    cJSON *it = cJSON_CreateObject();
    char rid[80];
    snprintf(rid, sizeof rid, "rs_%s", j->id + 5);
    cJSON_AddStringToObject(it, "type", "reasoning");
    cJSON_AddStringToObject(it, "id", rid);
    cJSON_AddArrayToObject(it, "summary");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    cJSON *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", "reasoning_text");
    cJSON_AddStringToObject(part, "text", f.reasoning);
    cJSON_AddItemToArray(content, part);
    cJSON_AddStringToObject(it, "status", f.content || f.tool_calls ? "completed" : item_status);
    cJSON_AddItemToArray(out, it);
  }
  if (f.content || !f.tool_calls) {
    cJSON *m = cJSON_CreateObject();
    char mid[80];
    snprintf(mid, sizeof mid, "msg_%s", j->id + 5);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "id", mid);
    cJSON_AddStringToObject(m, "status", f.tool_calls ? "completed" : item_status);
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    cJSON *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", "output_text");
    cJSON_AddStringToObject(part, "text", f.content ? f.content : "");
    cJSON_AddArrayToObject(part, "annotations");
    cJSON_AddItemToArray(content, part);
    cJSON_AddItemToArray(out, m);
  }
  if (f.tool_calls) {
    cJSON *tc;
    cJSON_ArrayForEach(tc, f.tool_calls) {
      cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
      cJSON *it = cJSON_CreateObject();
      const char *cid = cJSON_GetObjectItemCaseSensitive(tc, "id")->valuestring;
      char fid[80];
      snprintf(fid, sizeof fid, "fc_%s", cid + 5);
      cJSON_AddStringToObject(it, "type", "function_call");
      cJSON_AddStringToObject(it, "id", fid);
      cJSON_AddStringToObject(it, "call_id", cid);
      cJSON_AddStringToObject(it, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
      cJSON_AddStringToObject(it, "arguments", cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring);
      cJSON_AddStringToObject(it, "status", item_status);
      cJSON_AddItemToArray(out, it);
    }
  }
  cJSON_AddItemToObject(r, "usage", sm_oai_usage(j, true));
  free(f.content);
  free(f.reasoning);
  cJSON_Delete(f.tool_calls);
  return r;
}

cJSON *sm_oai_full_response(const sm_oai *o, sm_job *j) {
  if (j->req.kind == SM_EP_RESPONSES) return sm_oai_response_object(o, j, "completed");
  if (j->req.kind == SM_EP_MESSAGES) return sm_anth_response(o, j);
  if (j->req.kind == SM_EP_EMBEDDINGS) return sm_emb_response(o, j);
  cJSON *r = cJSON_CreateObject();
  bool chat = j->req.kind == SM_EP_CHAT;
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "object", chat ? "chat.completion" : "text_completion");
  cJSON_AddNumberToObject(r, "created", (double)j->created);
  cJSON_AddStringToObject(r, "model", o->model_id);
  cJSON_AddStringToObject(r, "system_fingerprint", "smelt-" SMELT_VERSION);
  cJSON *choices = cJSON_AddArrayToObject(r, "choices");
  for (int i = 0; i < j->n; i++) {
    sm_choice *c = &j->ch[i];
    sm_oai_final f;
    sm_oai_finalize(j, i, &f);
    cJSON *cj = cJSON_CreateObject();
    cJSON_AddNumberToObject(cj, "index", i);
    int nt = sm_oai_toks_upto(c, c->text.n, 0);
    if (chat) {
      cJSON *m = cJSON_AddObjectToObject(cj, "message");
      cJSON_AddStringToObject(m, "role", "assistant");
      if (f.content) cJSON_AddStringToObject(m, "content", f.content);
      else cJSON_AddNullToObject(m, "content");
      if (f.reasoning) cJSON_AddStringToObject(m, "reasoning_content", f.reasoning);
      cJSON_AddNullToObject(m, "refusal");
      if (f.tool_calls) {
        cJSON_AddItemToObject(m, "tool_calls", f.tool_calls);
        f.tool_calls = NULL;
      }
      if (j->req.logprobs) cJSON_AddItemToObject(cj, "logprobs", chat_logprobs(o, j, c, 0, nt));
      else cJSON_AddNullToObject(cj, "logprobs");
    } else {
      sm_buf t = SM_BUF_INIT;
      const char *ptext = j->per_prompt ? j->req.prompts[i / j->per_prompt] : j->req.prompt;
      if (j->req.echo && ptext) sm_buf_puts(&t, ptext);
      sm_buf_puts(&t, f.content ? f.content : "");
      cJSON_AddStringToObject(cj, "text", sm_buf_str(&t));
      size_t base = j->req.echo && ptext ? strlen(ptext) : 0;
      sm_buf_free(&t);
      if (j->req.logprobs) cJSON_AddItemToObject(cj, "logprobs", compl_logprobs(o, j, c, 0, nt, base));
      else cJSON_AddNullToObject(cj, "logprobs");
    }
    cJSON_AddStringToObject(cj, "finish_reason", f.finish);
    cJSON_AddItemToArray(choices, cj);
    free(f.content);
    free(f.reasoning);
    cJSON_Delete(f.tool_calls);
  }
  cJSON_AddItemToObject(r, "usage", sm_oai_usage(j, false));
  return r;
}

static cJSON *chunk_base(const sm_oai *o, sm_job *j) {
  cJSON *r = cJSON_CreateObject();
  bool chat = j->req.kind == SM_EP_CHAT;
  cJSON_AddStringToObject(r, "id", j->id);
  cJSON_AddStringToObject(r, "object", chat ? "chat.completion.chunk" : "text_completion");
  cJSON_AddNumberToObject(r, "created", (double)j->created);
  cJSON_AddStringToObject(r, "model", o->model_id);
  cJSON_AddStringToObject(r, "system_fingerprint", "smelt-" SMELT_VERSION);
  return r;
}

cJSON *sm_oai_chunk(const sm_oai *o, sm_job *j, int i, const char *text, size_t tlen, int tfrom, int tto,
                    const char *finish, cJSON *tool_calls, bool role) {
  bool chat = j->req.kind == SM_EP_CHAT;
  cJSON *r = chunk_base(o, j), *arr = cJSON_AddArrayToObject(r, "choices"), *cj = cJSON_CreateObject();
  cJSON_AddNumberToObject(cj, "index", i);
  char *t = sm_xmalloc(tlen + 1);
  memcpy(t, text ? text : "", tlen);
  t[tlen] = 0;
  if (chat) {
    cJSON *d = cJSON_AddObjectToObject(cj, "delta");
    if (role) cJSON_AddStringToObject(d, "role", "assistant");
    if (text) cJSON_AddStringToObject(d, "content", t);
    if (tool_calls) cJSON_AddItemToObject(d, "tool_calls", tool_calls); /* entries carry their index */
    if (j->req.logprobs && tto > tfrom)
      cJSON_AddItemToObject(cj, "logprobs", chat_logprobs(o, j, &j->ch[i], tfrom, tto));
    else cJSON_AddNullToObject(cj, "logprobs");
  } else {
    cJSON_AddStringToObject(cj, "text", t);
    if (j->req.logprobs && tto > tfrom)
      cJSON_AddItemToObject(cj, "logprobs", compl_logprobs(o, j, &j->ch[i], tfrom, tto, 0));
    else cJSON_AddNullToObject(cj, "logprobs");
  }
  free(t);
  if (finish) cJSON_AddStringToObject(cj, "finish_reason", finish);
  else cJSON_AddNullToObject(cj, "finish_reason");
  cJSON_AddItemToArray(arr, cj);
  if (j->req.include_usage) cJSON_AddNullToObject(r, "usage");
  return r;
}


cJSON *sm_oai_reasoning_chunk(const sm_oai *o, sm_job *j, int i, const char *text, size_t tlen) {
  cJSON *r = chunk_base(o, j), *arr = cJSON_AddArrayToObject(r, "choices"), *cj = cJSON_CreateObject();
  cJSON_AddNumberToObject(cj, "index", i);
  cJSON *d = cJSON_AddObjectToObject(cj, "delta");
  char *t = sm_xmalloc(tlen + 1);
  memcpy(t, text, tlen);
  t[tlen] = 0;
  cJSON_AddStringToObject(d, "reasoning_content", t);
  free(t);
  cJSON_AddNullToObject(cj, "logprobs");
  cJSON_AddNullToObject(cj, "finish_reason");
  cJSON_AddItemToArray(arr, cj);
  if (j->req.include_usage) cJSON_AddNullToObject(r, "usage");
  return r;
}

cJSON *sm_oai_usage_chunk(const sm_oai *o, sm_job *j) {
  cJSON *r = chunk_base(o, j);
  cJSON_AddArrayToObject(r, "choices");
  cJSON_AddItemToObject(r, "usage", sm_oai_usage(j, false));
  return r;
}

void sm_oai_put_utf8(sm_buf *out, const char *s, size_t n) {
  size_t i = 0, run = 0; /* run: valid bytes not yet copied, ending at i */
  while (i < n) {
    if ((unsigned char)s[i] < 0x80) {
      i++;
      run++;
      continue;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
    if (k > 0) {
      i += (size_t)k;
      run += (size_t)k;
      continue;
    }
    sm_buf_put(out, s + i - run, run);
    run = 0;
    sm_buf_put(out, "\xEF\xBF\xBD", 3); /* U+FFFD for the offending byte */
    i++;
  }
  sm_buf_put(out, s + n - run, run);
}

void sm_oai_print(const cJSON *j, sm_buf *out) {
  char *t = cJSON_PrintUnformatted(j);
  sm_oai_put_utf8(out, t, strlen(t));
  free(t);
}
