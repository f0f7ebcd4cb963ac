/* POST /v1/embeddings of `smelt serve` (see embeddings.h): inputs -> a job whose inputs the
 * engine thread runs through sm_engine_embed; the pooled vectors -> OpenAI's list of
 * embeddings (L2-normalized; float arrays or base64 of little-endian float32). */
#include "server/embeddings.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REJECT(param, code, ...) \
  do { \
    sm_api_error_set(err, 400, "invalid_request_error", param, code, __VA_ARGS__); \
    goto fail; \
  } while (0)

sm_job *sm_emb_make_job(const sm_oai *o, sm_api_request *req, sm_api_error *err) {
  int np = req->n_prompts ? req->n_prompts : 1;
  sm_buf all = SM_BUF_INIT;
  int *off = sm_xmalloc(sizeof(int) * (size_t)np), *len = sm_xmalloc(sizeof(int) * (size_t)np);
  if (req->n > 1) REJECT("n", NULL, "'n' is not supported by /v1/embeddings");
  if (np > 2048) REJECT("input", NULL, "at most 2048 inputs");
  for (int p = 0; p < np; p++) {
    const char *text = req->n_prompts ? req->prompts[p] : req->prompt;
    const int32_t *list = req->n_prompts ? req->prompt_lists[p] : req->prompt_ids;
    int nl = req->n_prompts ? req->prompt_lens[p] : req->n_prompt_ids;
    int32_t *ids = NULL;
    size_t n = 0;
    if (text) {
      if (smelt_tokenize(o->tok, text, strlen(text), true, &ids, &n) != SMELT_OK)
        REJECT("input", NULL, "could not tokenize input %d: %s", p, sm_errmsg());
    } else {
      n = (size_t)nl;
      ids = sm_xmalloc(sizeof(int32_t) * (n ? n : 1));
      memcpy(ids, list, sizeof(int32_t) * n);
      for (size_t i = 0; i < n; i++)
        if (ids[i] >= o->vocab) {
          free(ids);
          REJECT("input", NULL, "input %d: token id out of the vocabulary", p);
        }
    }
    if (n == 0) {
      free(ids);
      REJECT("input", NULL, "input %d is empty", p);
    }
    if ((int)n > o->ctx) {
      free(ids);
      REJECT("input", "context_length_exceeded", "input %d has %zu tokens, more than the context (%d)", p, n, o->ctx);
    }
    off[p] = (int)(all.n / sizeof(int32_t));
    len[p] = (int)n;
    sm_buf_put(&all, ids, n * sizeof(int32_t));
    free(ids);
  }
  int32_t *prompt = sm_xmalloc(all.n);
  memcpy(prompt, all.p, all.n);
  int total = (int)(all.n / sizeof(int32_t));
  sm_buf_free(&all);
  req->n = np;
  sm_job *j = sm_job_new(req, prompt, total, 1, false);
  j->per_prompt = 1;
  j->pooling = o->pooling;
  for (int i = 0; i < np; i++) {
    j->ch[i].p_off = off[i];
    j->ch[i].p_len = len[i];
  }
  free(off);
  free(len);
  return j;
fail:
  sm_buf_free(&all);
  free(off);
  free(len);
  sm_api_request_free(req);
  return NULL;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *base64(const unsigned char *p, size_t n) {
  sm_buf b = SM_BUF_INIT;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    sm_buf_putc(&b, B64[v >> 18 & 63]);
    sm_buf_putc(&b, B64[v >> 12 & 63]);
    sm_buf_putc(&b, i + 1 < n ? B64[v >> 6 & 63] : '=');
    sm_buf_putc(&b, i + 2 < n ? B64[v & 63] : '=');
  }
  return sm_buf_take(&b);
}

cJSON *sm_emb_response(const sm_oai *o, sm_job *j) {
  cJSON *r = cJSON_CreateObject(), *data = NULL;
  cJSON_AddStringToObject(r, "object", "list");
  data = cJSON_AddArrayToObject(r, "data");
  int D = j->emb_dim;
  float *v = sm_xmalloc(sizeof(float) * (size_t)(D ? D : 1));
  for (int i = 0; i < j->n; i++) {
    double ss = 0;
    for (int d = 0; d < D; d++) ss += (double)j->emb[(size_t)i * D + d] * j->emb[(size_t)i * D + d];
    double inv = ss > 0 ? 1.0 / sqrt(ss) : 0;
    for (int d = 0; d < D; d++) v[d] = (float)(j->emb[(size_t)i * D + d] * inv);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "object", "embedding");
    cJSON_AddNumberToObject(e, "index", i);
    if (j->req.emb_base64) {
      unsigned char *bytes = sm_xmalloc(sizeof(float) * (size_t)(D ? D : 1));
      for (int d = 0; d < D; d++) { /* little-endian float32, as numpy's frombuffer reads it */
        uint32_t u;
        memcpy(&u, &v[d], 4);
        for (int k = 0; k < 4; k++) bytes[4 * d + k] = (unsigned char)(u >> (8 * k));
      }
      char *b = base64(bytes, sizeof(float) * (size_t)D);
      cJSON_AddStringToObject(e, "embedding", b);
      free(b);
      free(bytes);
    } else {
      cJSON_AddItemToObject(e, "embedding", cJSON_CreateFloatArray(v, D));
    }
    cJSON_AddItemToArray(data, e);
  }
  free(v);
  cJSON_AddStringToObject(r, "model", o->model_id);
  cJSON *u = cJSON_AddObjectToObject(r, "usage");
  cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
  cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt);
  return r;
}
