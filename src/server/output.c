/* Reasoning / content / tool-call view of generated text (see output.h). */
#include "server/output.h"
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static size_t partial_suffix(const char *s, size_t n, const char *m) {
  size_t ml = strlen(m);
  for (size_t l = SM_MIN(ml - 1, n); l > 0; l--)
    if (!memcmp(s + n - l, m, l)) return l;
  return 0;
}

void sm_view_build(const sm_job *j, const sm_choice *c, sm_view *v) {
  bool final = c->finish != SM_FIN_NONE;
  const char *text = c->text.p ? c->text.p : "";
  size_t len = final ? c->text.n : c->safe;
  sm_buf_clear(&v->reasoning);
  v->reasoning_safe = 0;
  v->reasoning_end = 0;
  const cJSON *tools = j->req.tools;
  if (j->tfmt && j->tfmt->kind == SM_TF_HARMONY) {
    sm_toolfmt_scan(j->tfmt, text, len, final, tools, &v->tc);
    if (!j->tool_mode && v->tc.n) { /* calls without tools in the request: leave them out */
      for (int i = 0; i < v->tc.n; i++) {
        free(v->tc.calls[i].name);
        sm_buf_free(&v->tc.calls[i].args);
      }
      v->tc.n = 0;
    }
    if (j->reasoning) {
      sm_buf_put(&v->reasoning, v->tc.reasoning.p, v->tc.reasoning.n);
      v->reasoning_safe = v->reasoning.n;
      const char *a = memmem(text, len, "<|channel|>analysis", 19);
      const char *e = a ? memmem(a, len - (size_t)(a - text), "<|end|>", 7) : NULL;
      v->reasoning_end = e ? (size_t)(e - text) + 7 : a ? len : 0;
    }
    return;
  }
  size_t off = 0;
  if (j->reasoning) {
    bool open = j->think_open;
    size_t i = 0;
    if (!open) {
      size_t w = 0;
      while (w < len && isspace((unsigned char)text[w])) w++;
      if (len - w >= 7 && !memcmp(text + w, "<think>", 7)) {
        open = true;
        i = w + 7;
      } else if (!final && !memcmp(text + w, "<think>", len - w)) {
        /* could still become <think>: nothing is settled */
        sm_buf_clear(&v->tc.content);
        v->tc.safe = 0;
        v->tc.n = 0;
        return;
      }
    }
    if (open) {
      const char *e = memmem(text + i, len - i, "</think>", 8);
      size_t re = e ? (size_t)(e - text) : len;
      sm_buf_put(&v->reasoning, text + i, re - i);
      v->reasoning_safe = e || final ? v->reasoning.n : v->reasoning.n - partial_suffix(text + i, re - i, "</think>");
      off = e ? re + 8 : len;
      v->reasoning_end = off;
      while (off < len && isspace((unsigned char)text[off])) off++;
      if (!e && !final) off = len;
    }
  }
  if (j->tool_mode) {
    sm_toolfmt_scan(j->tfmt, text + off, len - off, final, tools, &v->tc);
  } else {
    v->tc.n = 0;
    sm_buf_clear(&v->tc.content);
    sm_buf_put(&v->tc.content, text + off, len - off);
    v->tc.safe = v->tc.content.n;
  }
}

void sm_view_free(sm_view *v) {
  sm_buf_free(&v->reasoning);
  sm_tc_scan_free(&v->tc);
}

int sm_view_reasoning_tokens(const sm_job *j, const sm_choice *c) {
  if (!j->reasoning) return 0;
  sm_view v = {0};
  sm_view_build(j, c, &v);
  size_t end = v.reasoning_end;
  sm_view_free(&v);
  int k = 0;
  while (k < c->n_toks && c->toks[k].end <= end) k++;
  return end ? k : 0;
}
