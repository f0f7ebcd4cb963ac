/* Images in sequences (mm.h): spans, prefix-cache keys, M-RoPE positions and the batch rows of a
 * step. An image token's prefix-cache key is a negative pseudo-id from the image's content hash and
 * the token's place in its span, so that cached KV is reused only for the same image at the same
 * place (token ids alone are the same placeholder for every image). */
#include <stdlib.h>
#include <string.h>
#include "engine/mm.h"
#include "model/model.h"

static int32_t image_key(const sm_vimage *im, int k) {
  uint64_t h;
  memcpy(&h, im->hash, sizeof h);
  h += (uint64_t)(k + 1) * 0x9e3779b97f4a7c15ULL;
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  return -1 - (int32_t)(h >> 34); /* < 0: never a token id */
}

void sm_seq_mm_free(sm_seq_mm *mm) {
  if (!mm) return;
  for (int i = 0; i < mm->n_spans; i++) sm_vimage_unref(mm->spans[i].img);
  free(mm->spans);
  free(mm->keys);
  free(mm->rpos);
  free(mm);
}

static void grow(sm_seq_mm *mm, int need) {
  if (need <= mm->cap) return;
  const int cap = SM_MAX(need, 2 * mm->cap + 16);
  mm->keys = sm_xrealloc(mm->keys, sizeof(int32_t) * (size_t)cap);
  if (mm->rpos) {
    int32_t *r = sm_xmalloc(sizeof(int32_t) * 3 * (size_t)cap);
    for (int a = 0; a < 3; a++)
      memcpy(r + (size_t)a * cap, mm->rpos + (size_t)a * mm->cap, sizeof(int32_t) * (size_t)mm->cap);
    free(mm->rpos);
    mm->rpos = r;
  }
  mm->cap = cap;
}

sm_seq_mm *sm_seq_mm_dup(const sm_seq_mm *mm) {
  if (!mm) return NULL;
  sm_seq_mm *c = sm_xcalloc(1, sizeof *c);
  *c = *mm;
  c->spans = sm_xmalloc(sizeof(sm_mm_span) * (size_t)(mm->n_spans ? mm->n_spans : 1));
  memcpy(c->spans, mm->spans, sizeof(sm_mm_span) * (size_t)mm->n_spans);
  for (int i = 0; i < c->n_spans; i++) sm_vimage_ref(c->spans[i].img);
  c->keys = sm_xmalloc(sizeof(int32_t) * (size_t)(mm->cap ? mm->cap : 1));
  memcpy(c->keys, mm->keys, sizeof(int32_t) * (size_t)mm->cap);
  if (mm->rpos) {
    c->rpos = sm_xmalloc(sizeof(int32_t) * 3 * (size_t)mm->cap);
    memcpy(c->rpos, mm->rpos, sizeof(int32_t) * 3 * (size_t)mm->cap);
  }
  return c;
}

void sm_seq_mm_appended(sm_seq_mm *mm, const int32_t *tok, int old_n, int n) {
  grow(mm, n);
  for (int t = old_n; t < n; t++) {
    mm->keys[t] = tok[t];
    if (mm->rpos)
      for (int a = 0; a < 3; a++) mm->rpos[(size_t)a * mm->cap + t] = t + mm->delta;
  }
}

/* keys and positions of tokens [0, n) from the spans */
static void layout(sm_seq_mm *mm, const smelt_model *m, const int32_t *tok, int n) {
  for (int t = 0; t < n; t++) mm->keys[t] = tok[t];
  for (int s = 0; s < mm->n_spans; s++)
    for (int t = mm->spans[s].t0; t < mm->spans[s].t1 && t < n; t++)
      mm->keys[t] = image_key(mm->spans[s].img, t - mm->spans[s].t0);
  mm->delta = 0;
  if (!mm->rpos) return;
  int32_t *r = sm_xmalloc(sizeof(int32_t) * 3 * (size_t)(n ? n : 1)), next = 0;
  sm_vision_mrope(m->vision, tok, n, mm->spans, mm->n_spans, r, &next);
  for (int a = 0; a < 3; a++) memcpy(mm->rpos + (size_t)a * mm->cap, r + (size_t)a * n, sizeof(int32_t) * (size_t)n);
  free(r);
  mm->delta = next - n;
}

smelt_status sm_seq_set_media_impl(sm_seq_mm **out, const smelt_model *m, const int32_t *tok, int n_tok, int n_done,
                                   const sm_mm_span *spans, int n_spans) {
  if (n_spans <= 0) return SMELT_OK;
  if (!m->vision) return sm_err(SMELT_ERR_UNSUPPORTED, "the model has no vision tower: images cannot be attached");
  sm_seq_mm *mm = *out;
  const int prev_end = mm && mm->n_spans ? mm->spans[mm->n_spans - 1].t1 : 0;
  for (int i = 0; i < n_spans; i++) {
    const sm_mm_span *s = &spans[i];
    if (!s->img || !s->img->n_embd || s->t0 < SM_MAX(n_done, prev_end) || s->t1 <= s->t0 || s->t1 > n_tok ||
        (i && s->t0 < spans[i - 1].t1))
      return sm_err(SMELT_ERR_INVALID, "image span %d ([%d, %d) of %d tokens, %d computed) is invalid", i, s->t0, s->t1,
                    n_tok, n_done);
    int cnt = 0;
    for (int t = s->t0; t < s->t1; t++) cnt += sm_vision_is_image_token(m->vision, tok[t]);
    if (cnt != s->img->n_embd)
      return sm_err(SMELT_ERR_INVALID, "image span %d holds %d image tokens for %d embedding rows", i, cnt,
                    s->img->n_embd);
  }
  if (!mm) {
    mm = sm_xcalloc(1, sizeof *mm);
    mm->cap = SM_MAX(n_tok, 16);
    mm->keys = sm_xmalloc(sizeof(int32_t) * (size_t)mm->cap);
    int32_t dummy[3];
    if (m->mrope_axis && sm_vision_mrope(m->vision, tok, 0, NULL, 0, dummy, dummy))
      mm->rpos = sm_xmalloc(sizeof(int32_t) * 3 * (size_t)mm->cap);
    *out = mm;
  }
  grow(mm, n_tok);
  mm->spans = sm_xrealloc(mm->spans, sizeof(sm_mm_span) * (size_t)(mm->n_spans + n_spans));
  for (int i = 0; i < n_spans; i++) {
    mm->spans[mm->n_spans++] = spans[i];
    sm_vimage_ref(spans[i].img);
  }
  layout(mm, m, tok, n_tok);
  return SMELT_OK;
}

int sm_mm_common_prefix(const sm_seq_mm *mm, const int32_t *tok, int n_have, const int32_t *ids, int n,
                        const sm_mm_span *spans, int n_spans) {
  int i = 0, s = 0;
  for (; i < n_have && i < n; i++) {
    while (s < n_spans && spans[s].t1 <= i) s++;
    const bool in = s < n_spans && spans[s].t0 <= i;
    const int32_t want = in ? image_key(spans[s].img, i - spans[s].t0) : ids[i];
    if ((mm ? mm->keys[i] : tok[i]) != want) break;
  }
  /* never inside an image span of the new prompt */
  for (int k = 0; k < n_spans; k++)
    if (spans[k].t0 < i && i < spans[k].t1) i = spans[k].t0;
  return i;
}

void sm_seq_mm_truncated(sm_seq_mm *mm, const smelt_model *m, const int32_t *tok, int len) {
  while (mm->n_spans && mm->spans[mm->n_spans - 1].t0 >= len) sm_vimage_unref(mm->spans[--mm->n_spans].img);
  if (mm->n_spans && mm->spans[mm->n_spans - 1].t1 > len) mm->spans[mm->n_spans - 1].t1 = len;
  layout(mm, m, tok, len);
}

int sm_seq_mm_take(const sm_seq_mm *mm, const smelt_model *m, int done, int want, int budget) {
  if (!mm || !sm_vision_bidirectional(m->vision)) return want;
  int end = done + want;
  for (int s = 0; s < mm->n_spans; s++) {
    const sm_mm_span *sp = &mm->spans[s];
    if (sp->t1 <= done || sp->t0 >= end || sp->t1 <= end) continue;
    /* the step would end inside span s */
    if (sp->t0 > done) return sp->t0 - done; /* stop before it */
    if (sp->t1 - done > budget) return -1;   /* it never fits a step */
    return 0;                                /* the whole remainder next step */
  }
  return want;
}

smelt_status sm_seq_mm_encode(sm_seq_mm *mm, smelt_model *m, int p0, int p1) {
  for (int s = 0; s < mm->n_spans; s++) {
    const sm_mm_span *sp = &mm->spans[s];
    if (sp->t1 <= p0 || sp->t0 >= p1 || sp->img->enc) continue;
    smelt_status st = sm_vision_encode(m->vision, sp->img);
    if (st) return st;
  }
  return SMELT_OK;
}

void sm_mm_batch_rows(sm_mm_scratch *sc, const sm_seq_mm *mm, const smelt_model *m, const int32_t *tok, int p0, int p1,
                      int row, int n_total, int32_t *rpos, int32_t *span) {
  if (span) {
    for (int t = p0; t < p1; t++) span[2 * (row + t - p0)] = span[2 * (row + t - p0) + 1] = t;
    for (int s = 0; mm && s < mm->n_spans; s++) /* a span's image tokens see each other */
      for (int t = SM_MAX(p0, mm->spans[s].t0); t < SM_MIN(p1, mm->spans[s].t1); t++)
        if (sm_vision_is_image_token(m->vision, tok[t])) {
          span[2 * (row + t - p0)] = mm->spans[s].t0;
          span[2 * (row + t - p0) + 1] = mm->spans[s].t1 - 1;
        }
  }
  if (rpos)
    for (int t = p0; t < p1; t++)
      for (int a = 0; a < 3; a++)
        rpos[(size_t)a * n_total + row + (t - p0)] = mm && mm->rpos ? mm->rpos[(size_t)a * mm->cap + t] : t;
  for (int s = 0; mm && s < mm->n_spans; s++) {
    const sm_mm_span *sp = &mm->spans[s];
    if (sp->t1 <= p0 || sp->t0 >= p1) continue;
    const sm_venc *e = sp->img->enc;
    int off = 0; /* image tokens of the span before t */
    for (int t = sp->t0; t < p0; t++) off += sm_vision_is_image_token(m->vision, tok[t]);
    for (int t = SM_MAX(p0, sp->t0); t < SM_MIN(p1, sp->t1);) {
      if (!sm_vision_is_image_token(m->vision, tok[t])) {
        t++;
        continue;
      }
      int t1 = t;
      while (t1 < SM_MIN(p1, sp->t1) && sm_vision_is_image_token(m->vision, tok[t1])) t1++;
      if (sc->n_embd == sc->cap_embd) {
        sc->cap_embd = 2 * sc->cap_embd + 8;
        sc->embd = sm_xrealloc(sc->embd, sizeof(sm_batch_embd) * (size_t)sc->cap_embd);
      }
      sm_batch_embd *b = &sc->embd[sc->n_embd++];
      b->row = row + (t - p0);
      b->n = t1 - t;
      b->src = e->embd + (size_t)off * e->dim;
      b->n_deep = e->n_deep;
      b->deep = NULL;
      /* the deep rows' pointers: set by sm_mm_batch_done (the array may move); off kept in the run */
      if (e->n_deep) {
        const int need = sc->n_embd * e->n_deep;
        if (need > sc->cap_deep) {
          sc->cap_deep = SM_MAX(need, 2 * sc->cap_deep);
          sc->deep = sm_xrealloc(sc->deep, sizeof(float *) * (size_t)sc->cap_deep);
        }
        for (int l = 0; l < e->n_deep; l++)
          sc->deep[(size_t)(sc->n_embd - 1) * e->n_deep + l] = e->deep[l] + (size_t)off * e->dim;
      }
      off += b->n;
      t = t1;
    }
  }
}

void sm_mm_batch_done(sm_mm_scratch *sc) {
  for (int i = 0; i < sc->n_embd; i++)
    if (sc->embd[i].n_deep) sc->embd[i].deep = (const float *const *)sc->deep + (size_t)i * sc->embd[i].n_deep;
}

void sm_mm_scratch_free(sm_mm_scratch *sc) {
  if (!sc) return;
  free(sc->embd);
  free(sc->deep);
  free(sc->rpos);
  free(sc->span);
  free(sc);
}
