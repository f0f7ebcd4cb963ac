/* One turn of smelt run (and the text completion of smelt generate) on a session that keeps its
 * KV cache: the context policy (drop the oldest turns, or an error), the prompt cache file, the
 * reply streamed to stdout, and the notices and the stats line on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/strbuf.h"
#include "cli/run.h"
#include "vision/vision.h"

bool sm_chat_cache_before(sm_chat *c, const int32_t *ids, int n, const char *cmd) {
  const char *path = c->o->prompt_cache;
  c->cache_tried = true;
  c->cache_save = false;
  if (!path) return true;
  if (!sm_file_exists(path) && sm_regular_or_absent(path) == SMELT_OK) {
    if (c->o->prompt_cache_ro)
      fprintf(stderr, "smelt %s: note: prompt cache %s does not exist (read-only: not created)\n", cmd, path);
    else c->cache_save = true;
    return true;
  }
  sm_prompt_cache *pc = NULL;
  if (sm_prompt_cache_open(path, c->m, &pc)) {
    fprintf(stderr, "smelt %s: %s\n", cmd, smelt_last_error());
    return false;
  }
  const int match = sm_prompt_cache_match(pc, ids, n), use = SM_MIN(match, n - 1);
  if (use > 0) {
    sm_session_reset(c->sess);
    if (sm_prompt_cache_restore(pc, sm_session_engine(c->sess), sm_session_seq(c->sess), use)) {
      fprintf(stderr, "smelt %s: %s\n", cmd, smelt_last_error());
      sm_prompt_cache_close(pc);
      return false;
    }
  }
  if (!c->o->no_stats)
    fprintf(stderr, "[prompt cache %s: %d of the prompt's %d tokens loaded (the file holds %d)]\n", path, use, n,
            sm_prompt_cache_len(pc));
  c->cache_save = !c->o->prompt_cache_ro && match < n;
  sm_prompt_cache_close(pc);
  return true;
}

void sm_chat_cache_after(sm_chat *c, int n, const char *cmd) {
  if (!c->cache_save) return;
  c->cache_save = false;
  if (sm_session_len(c->sess) < n) return; /* the prefill was interrupted */
  if (sm_prompt_cache_save(sm_session_engine(c->sess), sm_session_seq(c->sess), n, c->o->prompt_cache))
    fprintf(stderr, "smelt %s: %s\n", cmd, smelt_last_error());
  else if (!c->o->no_stats) fprintf(stderr, "[prompt cache %s: saved the prompt's %d tokens]\n", c->o->prompt_cache, n);
}

typedef struct {
  sm_buf text;
  bool started;
} reply_out;

static bool on_piece(const char *p, size_t l, void *u) {
  reply_out *r = u;
  sm_buf_put(&r->text, p, l);
  fwrite(p, 1, l, stdout);
  fflush(stdout);
  r->started = true;
  return true;
}

static void on_prefill(void *ud, int done, int total) { sm_progress_update(ud, done, total); }

static void print_stats(const sm_chat *c, const sm_session_stats *s) {
  const smelt_stats *t = &s->st;
  if (c->o->no_stats) return;
  if (c->draft && t->n_generated)
    fprintf(stderr, "[speculative: %d of %d generated tokens came from the draft model]\n", s->n_accepted,
            t->n_generated);
  fprintf(
    stderr,
    "[prompt %d tokens: %d cached, %d prefilled at %.1f tok/s | generated %d tokens, decode %.1f tok/s, stop: %s | "
    "peak memory %.1f MiB]\n",
    t->n_prompt, s->n_reused, s->n_prefilled, t->prefill_s > 0 ? s->n_prefilled / t->prefill_s : 0.0, t->n_generated,
    t->decode_s > 0 && t->n_generated > 1 ? (t->n_generated - 1) / t->decode_s : 0.0, sm_stop_name(s->stop),
    t->peak_rss / (1024.0 * 1024.0));
}

static void mm_free(sm_mm_span *spans, int n) {
  for (int i = 0; i < n; i++) sm_vimage_unref(spans[i].img);
  free(spans);
}

/* generate after ids (images: spans) with the session; the reply goes to stdout (and into *reply) */
static smelt_status run_session(sm_chat *c, const int32_t *ids, int n, const sm_mm_span *spans, int n_spans,
                                reply_out *out, sm_session_stats *stats) {
  sm_progress prog;
  sm_progress_start(&prog, "prefill", true);
  sm_session_opts so = {.max_tokens = c->o->n_predict,
                        .sampling = &c->o->s,
                        .ignore_eos = c->o->ignore_eos,
                        .on_piece = on_piece,
                        .user = out,
                        .on_prefill = on_prefill,
                        .cancelled = c->interactive ? sm_interrupt_cb : NULL,
                        .ud = &prog};
  smelt_status st = sm_session_generate_mm(c->sess, ids, n, spans, n_spans, &so, stats);
  sm_progress_end(&prog);
  return st;
}

static void stop_notice(const sm_chat *c, const sm_session_stats *s) {
  if (s->stop == SM_STOP_CONTEXT)
    fprintf(stderr, "[reply stopped: the context (%d tokens) is full%s]\n", sm_session_context(c->sess),
            !c->interactive                      ? "; a larger -c/--ctx-size leaves more room"
            : c->o->overflow == SM_OVERFLOW_DROP ? "; the oldest turns are dropped on the next message"
                                                 : "; /clear starts over");
  else if (s->stop == SM_STOP_CANCELLED && c->interactive)
    fprintf(stderr, "[interrupted%s]\n", s->st.n_generated ? "" : " before the reply");
}

int sm_chat_turn(sm_chat *c) {
  run_opts *o = c->o;
  const int ctx = sm_session_context(c->sess);
  int reserve = o->n_predict < 0 ? ctx / 4 : SM_MIN(o->n_predict, ctx / 4);
  if (reserve < 1) reserve = 1;
  int32_t *ids = NULL;
  int n = 0, dropped = 0, n_spans = 0;
  sm_mm_span *spans = NULL;
  for (;;) {
    mm_free(spans, n_spans);
    spans = NULL;
    n_spans = 0;
    if (sm_conv_tokens_mm(&c->conv, &ids, &n, &spans, &n_spans)) {
      fprintf(stderr, "smelt run: chat template: %s\n", smelt_last_error());
      if (c->interactive) sm_conv_pop(&c->conv, "user");
      return 1;
    }
    if (n + reserve <= ctx) break;
    bool older = sm_conv_count(&c->conv) > 1;
    if (o->overflow == SM_OVERFLOW_ERROR && older) {
      fprintf(stderr,
              "smelt run: the conversation (%d tokens) and room for a reply (%d) exceed the context of %d "
              "tokens (--context-overflow error); /clear starts over, a larger -c/--ctx-size leaves more room\n",
              n, reserve, ctx);
      free(ids);
      mm_free(spans, n_spans);
      if (c->interactive) sm_conv_pop(&c->conv, "user");
      return 1;
    }
    if (!older || !sm_conv_drop_oldest(&c->conv)) break;
    dropped++;
    free(ids);
  }
  if (n >= ctx) {
    fprintf(stderr,
            "smelt run: the message does not fit: %d tokens with the chat template%s, the context holds %d "
            "(-c/--ctx-size)\n",
            n, sm_conv_system(&c->conv) ? " and the system prompt" : "", ctx);
    free(ids);
    mm_free(spans, n_spans);
    if (c->interactive) sm_conv_pop(&c->conv, "user");
    return 1;
  }
  if (dropped)
    fprintf(stderr, "[context full: dropped the oldest %d turn%s to fit the context of %d tokens]\n", dropped,
            dropped == 1 ? "" : "s", ctx);
  if (n_spans && o->prompt_cache) {
    fprintf(stderr, "smelt run: --prompt-cache does not hold images; leave it out with --image\n");
    free(ids);
    mm_free(spans, n_spans);
    return 1;
  }
  if (!c->cache_tried && !sm_chat_cache_before(c, ids, n, "run")) {
    free(ids);
    mm_free(spans, n_spans);
    return 1;
  }
  reply_out out = {SM_BUF_INIT, false};
  sm_session_stats stats;
  smelt_status st = run_session(c, ids, n, spans, n_spans, &out, &stats);
  mm_free(spans, n_spans);
  if (out.started) fputc('\n', stdout);
  fflush(stdout);
  if (st) {
    fprintf(stderr, "smelt run: %s\n", smelt_last_error());
    sm_buf_free(&out.text);
    free(ids);
    if (c->interactive) sm_conv_pop(&c->conv, "user");
    return 1;
  }
  sm_chat_cache_after(c, n, "run");
  free(ids);
  if (stats.stop == SM_STOP_CANCELLED && !stats.st.n_generated && c->interactive) {
    sm_conv_pop(&c->conv, "user"); /* stopped before any reply: as if never sent */
  } else {
    sm_conv_add(&c->conv, "assistant", sm_buf_str(&out.text));
  }
  sm_buf_free(&out.text);
  stop_notice(c, &stats);
  print_stats(c, &stats);
  return 0;
}

/* generate's prompt with images: each image where the prompt holds the family's marker, or all of
 * them before the text when it holds none */
static smelt_status generate_tokens_mm(const sm_chat *c, const char *prompt, sm_vimage *const *imgs, int n_img,
                                       int32_t **ids, int *n, sm_mm_span **spans) {
  const sm_vision *v = c->m->vision;
  const char *mk = sm_vision_marker(v);
  int found = 0;
  for (const char *p = strstr(prompt, mk); p; p = strstr(p + strlen(mk), mk)) found++;
  if (found && found != n_img)
    return sm_err(SMELT_ERR_INVALID,
                  "the prompt holds %d image marker%s (%s) for %d --image file%s: give one for each "
                  "image, or none to put the images before the text",
                  found, found == 1 ? "" : "s", mk, n_img, n_img == 1 ? "" : "s");
  sm_buf b = SM_BUF_INIT;
  for (int i = 0; !found && i < n_img; i++) sm_buf_puts(&b, mk);
  sm_buf_puts(&b, prompt);
  smelt_status st = sm_vision_tokenize(v, c->m->tok, sm_buf_str(&b), true, imgs, n_img, ids, n, spans);
  sm_buf_free(&b);
  return st;
}

int sm_generate_text(sm_chat *c, const char *prompt, sm_vimage *const *imgs, int n_img) {
  int32_t *ids = NULL;
  size_t k = 0;
  sm_mm_span *spans = NULL;
  if (n_img) {
    if (c->o->prompt_cache) {
      fprintf(stderr, "smelt generate: --prompt-cache does not hold images; leave it out with --image\n");
      return 1;
    }
    int ni = 0;
    if (generate_tokens_mm(c, prompt, imgs, n_img, &ids, &ni, &spans)) {
      fprintf(stderr, "smelt generate: %s\n", smelt_last_error());
      return 1;
    }
    k = (size_t)ni;
  } else if (smelt_tokenize(c->m->tok, prompt, strlen(prompt), true, &ids, &k)) {
    fprintf(stderr, "smelt generate: %s\n", smelt_last_error());
    return 1;
  }
  const int n = (int)k, ctx = sm_session_context(c->sess);
  if (n >= ctx) {
    fprintf(stderr, "smelt generate: the prompt does not fit: %d tokens, the context holds %d (-c/--ctx-size)\n", n,
            ctx);
    free(ids);
    mm_free(spans, spans ? sm_vision_span_count(imgs, n_img) : 0);
    return 1;
  }
  if (!n_img && !sm_chat_cache_before(c, ids, n, "generate")) {
    free(ids);
    return 1;
  }
  fputs(prompt, stdout);
  reply_out out = {SM_BUF_INIT, false};
  sm_session_stats stats;
  const int n_spans = spans ? sm_vision_span_count(imgs, n_img) : 0;
  smelt_status st = run_session(c, ids, n, spans, n_spans, &out, &stats);
  mm_free(spans, n_spans);
  fputc('\n', stdout);
  fflush(stdout);
  sm_buf_free(&out.text);
  if (st) {
    fprintf(stderr, "smelt generate: %s\n", smelt_last_error());
    free(ids);
    return 1;
  }
  sm_chat_cache_after(c, n, "generate");
  free(ids);
  stop_notice(c, &stats);
  print_stats(c, &stats);
  return 0;
}
