/* Images in prompts: the family processors' expansion of each image marker into its placeholder
 * tokens (as transformers' Qwen2_5_VLProcessor, Gemma3Processor, PixtralProcessor and
 * Idefics3Processor / SmolVLMProcessor expand them in the text before tokenizing it), the location of each image's tokens, and Qwen-VL's 3-axis rope
 * positions (get_rope_index). */
#include <stdlib.h>
#include <string.h>
#include "base/strbuf.h"
#include "tokenizer/tokenizer.h"
#include "vision/vit.h"

static const char *tok_str(const smelt_tokenizer *t, int32_t id) { return t ? sm_tok_id_to_token(t, id) : NULL; }

/* the text of the family's image token in a rendered prompt (what HF's processor looks for) */
static const char *image_text(const sm_vision *v, const smelt_tokenizer *t) {
  switch (v->kind) {
    case SM_VIT_QWEN25:
    case SM_VIT_QWEN3:
    case SM_VIT_QWEN2:
    case SM_VIT_PIXTRAL:
    case SM_VIT_IDEFICS3: return tok_str(t, v->image_token);
    case SM_VIT_SIGLIP: return tok_str(t, v->boi);
  }
  return NULL;
}

const char *sm_vision_marker(const sm_vision *v) {
  switch (v->kind) {
    case SM_VIT_QWEN25:
    case SM_VIT_QWEN3:
    case SM_VIT_QWEN2: return "<|vision_start|><|image_pad|><|vision_end|>";
    case SM_VIT_SIGLIP: return "<start_of_image>";
    case SM_VIT_PIXTRAL: return "[IMG]";
    case SM_VIT_IDEFICS3: return "<image>";
  }
  return "";
}

bool sm_vision_is_image_token(const sm_vision *v, int32_t id) { return id == v->image_token; }
bool sm_vision_bidirectional(const sm_vision *v) { return v->kind == SM_VIT_SIGLIP; }

static smelt_status expand(const sm_vision *v, const smelt_tokenizer *t, const sm_vimage *im, sm_buf *b) {
  const char *img = tok_str(t, v->image_token);
  if (!img) return sm_err(SMELT_ERR_FORMAT, "the tokenizer has no image token (id %d)", v->image_token);
  switch (v->kind) {
    case SM_VIT_QWEN25:
    case SM_VIT_QWEN3:
    case SM_VIT_QWEN2:
      for (int i = 0; i < im->n_embd; i++) sm_buf_puts(b, img);
      return SMELT_OK;
    case SM_VIT_SIGLIP: {
      const char *boi = tok_str(t, v->boi), *eoi = tok_str(t, v->eoi);
      if (!boi || !eoi) return sm_err(SMELT_ERR_FORMAT, "the tokenizer lacks Gemma 3's image start/end tokens");
      /* with pan-and-scan crops, Gemma3Processor's text around the whole image and its crops */
      if (im->n_crops) sm_buf_puts(b, "Here is the original image ");
      for (int k = 0; k <= im->n_crops; k++) {
        const sm_vimage *one = k ? im->crops[k - 1] : im;
        if (k == 1) sm_buf_puts(b, " and here are some crops to help you see better ");
        else if (k > 1) sm_buf_puts(b, " ");
        sm_buf_puts(b, "\n\n");
        sm_buf_puts(b, boi);
        for (int i = 0; i < one->n_embd; i++) sm_buf_puts(b, img);
        sm_buf_puts(b, eoi);
        sm_buf_puts(b, "\n\n");
      }
      return SMELT_OK;
    }
    case SM_VIT_PIXTRAL: {
      const char *br = tok_str(t, v->img_break), *end = tok_str(t, v->img_end);
      if (!br || !end) return sm_err(SMELT_ERR_FORMAT, "the tokenizer lacks [IMG_BREAK] / [IMG_END]");
      for (int r = 0; r < im->rows; r++) {
        for (int c = 0; c < im->cols; c++) sm_buf_puts(b, img);
        sm_buf_puts(b, r + 1 < im->rows ? br : end);
      }
      return SMELT_OK;
    }
    case SM_VIT_IDEFICS3: {
      /* Idefics3Processor's text: each tile "<fake_token_around_image><row_r_col_c>" and its tokens, a
       * newline after each row, then "\n<fake_token_around_image><global-img>", the whole image's
       * tokens, "<fake_token_around_image>" (the tokenizer's added tokens, by their text) */
      static const char fake[] = "<fake_token_around_image>";
      const int seq = im->n_embd / im->frames;
      for (int r = 0; r < im->rows; r++) {
        for (int c = 0; c < im->cols; c++) {
          sm_buf_printf(b, "%s<row_%d_col_%d>", fake, r + 1, c + 1);
          for (int i = 0; i < seq; i++) sm_buf_puts(b, img);
        }
        sm_buf_puts(b, "\n");
      }
      if (im->rows) sm_buf_puts(b, "\n");
      sm_buf_puts(b, fake);
      sm_buf_puts(b, "<global-img>");
      for (int i = 0; i < seq; i++) sm_buf_puts(b, img);
      sm_buf_puts(b, fake);
      return SMELT_OK;
    }
  }
  return SMELT_OK;
}

static smelt_status find_spans(const sm_vision *v, const int32_t *ids, int n, sm_vimage *const *imgs, int n_img,
                               sm_mm_span *spans) {
  int k = 0;
  for (int t = 0; t < n;) {
    if (ids[t] != v->image_token) {
      t++;
      continue;
    }
    if (k == n_img)
      return sm_err(SMELT_ERR_INVALID, "the prompt has more image tokens than the %d image%s given", n_img,
                    n_img == 1 ? "" : "s");
    const int t0 = t;
    int cnt = 0;
    if (v->kind == SM_VIT_PIXTRAL) { /* [IMG] rows separated by [IMG_BREAK], closed by [IMG_END] */
      while (t < n && (ids[t] == v->image_token || ids[t] == v->img_break)) cnt += ids[t++] == v->image_token;
      if (t < n && ids[t] == v->img_end) t++;
      else return sm_err(SMELT_ERR_INVALID, "image %d: its [IMG] tokens are not closed by [IMG_END]", k + 1);
    } else if (v->kind == SM_VIT_IDEFICS3) { /* runs of <image> between the tiles' tags */
      while (t < n && cnt < imgs[k]->n_embd) cnt += ids[t++] == v->image_token;
    } else {
      while (t < n && ids[t] == v->image_token) {
        cnt++;
        t++;
      }
    }
    if (cnt != imgs[k]->n_embd)
      return sm_err(SMELT_ERR_INVALID, "image %d: %d image tokens in the prompt, its embedding has %d rows", k + 1, cnt,
                    imgs[k]->n_embd);
    spans[k] = (sm_mm_span){t0, t, imgs[k]};
    k++;
  }
  if (k != n_img)
    return sm_err(SMELT_ERR_INVALID, "%d image%s given but the prompt has tokens for %d", n_img, n_img == 1 ? "" : "s",
                  k);
  return SMELT_OK;
}

smelt_status sm_vision_spans(const sm_vision *v, const int32_t *ids, int n, sm_vimage *const *imgs, int n_img,
                             sm_mm_span **out) {
  *out = NULL;
  /* each image, then its pan-and-scan crops: a span each */
  const int nf = sm_vision_span_count(imgs, n_img);
  sm_vimage **flat = sm_xcalloc((size_t)(nf ? nf : 1), sizeof *flat);
  for (int i = 0, k = 0; i < n_img; i++) {
    flat[k++] = imgs[i];
    for (int c = 0; c < imgs[i]->n_crops; c++) flat[k++] = imgs[i]->crops[c];
  }
  sm_mm_span *s = sm_xcalloc((size_t)(nf ? nf : 1), sizeof *s);
  smelt_status st = find_spans(v, ids, n, flat, nf, s);
  free(flat);
  if (st) {
    free(s);
    return st;
  }
  for (int i = 0; i < nf; i++) sm_vimage_ref(s[i].img);
  *out = s;
  return SMELT_OK;
}

smelt_status sm_vision_tokenize(const sm_vision *v, const smelt_tokenizer *tok, const char *prompt, bool add_special,
                                sm_vimage *const *imgs, int n_img, int32_t **ids, int *n_ids, sm_mm_span **spans) {
  *ids = NULL;
  *n_ids = 0;
  *spans = NULL;
  const char *mk = image_text(v, tok);
  if (!mk || !*mk) return sm_err(SMELT_ERR_FORMAT, "the model's tokenizer has no image token");
  const size_t ml = strlen(mk);
  sm_buf b = SM_BUF_INIT;
  int k = 0;
  const char *p = prompt;
  for (const char *q; (q = strstr(p, mk)); p = q + ml, k++) {
    sm_buf_put(&b, p, (size_t)(q - p));
    if (k >= n_img) continue; /* counted below */
    /* Gemma 3 expands <start_of_image> itself (its replacement holds it); the others their image token */
    smelt_status st = expand(v, tok, imgs[k], &b);
    if (st) {
      sm_buf_free(&b);
      return st;
    }
  }
  sm_buf_puts(&b, p);
  if (k != n_img) {
    sm_buf_free(&b);
    return sm_err(SMELT_ERR_INVALID, "the prompt has %d image placeholder%s (%s) for %d image%s", k, k == 1 ? "" : "s",
                  mk, n_img, n_img == 1 ? "" : "s");
  }
  int32_t *t = NULL;
  size_t nt = 0;
  smelt_status st = smelt_tokenize(tok, sm_buf_str(&b), b.n, add_special, &t, &nt);
  sm_buf_free(&b);
  if (st) return st;
  if ((st = sm_vision_spans(v, t, (int)nt, imgs, n_img, spans))) {
    free(t);
    return st;
  }
  *ids = t;
  *n_ids = (int)nt;
  return SMELT_OK;
}

bool sm_vision_mrope(const sm_vision *v, const int32_t *ids, int n, const sm_mm_span *spans, int n_spans, int32_t *rpos,
                     int32_t *next) {
  (void)ids;
  if (v->kind != SM_VIT_QWEN25 && v->kind != SM_VIT_QWEN3 && v->kind != SM_VIT_QWEN2) return false;
  int st = 0, p = 0;
  for (int s = 0; s <= n_spans; s++) {
    const int t0 = s < n_spans ? SM_MIN(spans[s].t0, n) : n;
    for (int t = st; t < t0; t++, p++) rpos[t] = rpos[n + t] = rpos[2 * n + t] = p;
    if (s == n_spans) break;
    const sm_vimage *im = spans[s].img;
    const int cols = im->cols, t1 = SM_MIN(spans[s].t1, n);
    for (int t = t0; t < t1; t++) {
      const int k = t - spans[s].t0;
      rpos[t] = p;
      rpos[n + t] = p + k / cols;
      rpos[2 * n + t] = p + k % cols;
    }
    p += SM_MAX(im->rows, im->cols);
    st = t1;
  }
  *next = p;
  return true;
}
