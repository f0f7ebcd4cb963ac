/* The vision encoders' forward passes on the model's backend (one image at a time, as transformers
 * computes each image of a batch independently; an Idefics3 image's frames in one pass), the image preparation (processor, layout, content
 * hash) and the cache of encoded images. Host work is what transformers computes from the grid alone:
 * the patch rows of the conv (a matmul with the conv weight), the 2-D position ids, Qwen2.5-VL's
 * window order, Qwen3-VL's interpolated position embeddings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "store/store.h"
#include "vision/vit.h"

/* ---------------- images ---------------- */
void sm_vimage_ref(sm_vimage *im) { atomic_fetch_add(&im->refs, 1); }
void sm_vimage_unref(sm_vimage *im) {
  if (!im || atomic_fetch_sub(&im->refs, 1) != 1) return;
  if (im->enc) atomic_fetch_sub(&im->enc->pins, 1);
  for (int i = 0; i < im->n_crops; i++) sm_vimage_unref(im->crops[i]);
  free(im->crops);
  free(im->px);
  free(im);
}

static smelt_status vimage_one(const sm_vision *v, const sm_image *img, sm_vimage **out) {
  *out = NULL;
  sm_pixels px;
  smelt_status st = sm_imgproc_run(&v->proc, img, &px);
  if (st) return st;
  sm_vimage *im = sm_xcalloc(1, sizeof *im);
  atomic_init(&im->refs, 1);
  im->h = px.h;
  im->w = px.w;
  im->px = px.px;
  im->frames = px.frames;
  im->gh = px.h / v->patch;
  im->gw = px.w / v->patch;
  switch (v->kind) {
    case SM_VIT_QWEN25:
    case SM_VIT_QWEN3:
    case SM_VIT_QWEN2:
    case SM_VIT_PIXTRAL:
      im->rows = im->gh / v->merge;
      im->cols = im->gw / v->merge;
      break;
    case SM_VIT_SIGLIP: im->rows = im->cols = v->mm_side; break;
    case SM_VIT_IDEFICS3:
      im->rows = px.rows;
      im->cols = px.cols;
      break;
  }
  im->n_embd = v->kind == SM_VIT_IDEFICS3 ? im->frames * v->mm_side * v->mm_side : im->rows * im->cols;
  const bool merged = v->kind != SM_VIT_SIGLIP && v->kind != SM_VIT_IDEFICS3;
  if (im->n_embd <= 0 || (merged && (im->gh % v->merge || im->gw % v->merge))) {
    sm_vimage_unref(im);
    return sm_err(SMELT_ERR_INVALID, "image of %dx%d pixels gives no whole patch grid", img->w, img->h);
  }
  /* the pixel values are a function of the source image and the processor: hash those (a quarter of
   * the bytes of the float pixels) */
  const sm_imgproc *pp = &v->proc;
  sm_sha256 s;
  sm_sha256_init(&s);
  const int lay[7] = {(int)v->kind, im->h, im->w, v->patch, img->w, img->h, im->frames};
  const int prc[8] = {(int)pp->kind,    (int)pp->resample, pp->do_resize, pp->do_rescale,
                      pp->do_normalize, pp->longest_edge,  pp->tile,      pp->splitting};
  sm_sha256_update(&s, lay, sizeof lay);
  sm_sha256_update(&s, prc, sizeof prc);
  sm_sha256_update(&s, &pp->rescale_factor, sizeof pp->rescale_factor);
  sm_sha256_update(&s, pp->mean, sizeof pp->mean);
  sm_sha256_update(&s, pp->std, sizeof pp->std);
  sm_sha256_update(&s, img->rgb, 3 * (size_t)img->w * img->h);
  sm_sha256_final(&s, im->hash);
  *out = im;
  return SMELT_OK;
}

smelt_status sm_vimage_new(const sm_vision *v, const sm_image *img, sm_vimage **out) {
  sm_image *crops = NULL;
  int n = 0;
  smelt_status st = sm_imgproc_crops(&v->proc, img, &crops, &n);
  if (st) return st;
  if ((st = vimage_one(v, img, out)) == SMELT_OK && n) {
    /* Gemma 3's pan and scan: the crops, each an image of its own after the whole one */
    sm_vimage *im = *out;
    im->crops = sm_xcalloc((size_t)n, sizeof *im->crops);
    for (int i = 0; i < n && !st; i++)
      if ((st = vimage_one(v, &crops[i], &im->crops[i])) == SMELT_OK) im->n_crops++;
    if (st) {
      sm_vimage_unref(im);
      *out = NULL;
    }
  }
  for (int i = 0; i < n; i++) sm_image_free(&crops[i]);
  free(crops);
  return st;
}

int sm_vision_span_count(sm_vimage *const *imgs, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) k += 1 + imgs[i]->n_crops;
  return k;
}

/* ---------------- scratch ---------------- */
enum { B_X, B_XB, B_Q, B_K, B_V, B_ATT, B_F1, B_F2, B_P, B_T };
static float *buf(sm_vision *v, int i, size_t floats) {
  if (floats > v->buf_cap[i]) {
    if (v->buf[i]) v->be->free(v->be, v->buf[i]);
    v->buf[i] = v->be->alloc(v->be, floats * sizeof(float));
    v->buf_cap[i] = v->buf[i] ? floats : 0;
  }
  return v->buf[i];
}
static int32_t *ibuf(sm_vision *v, int i, const int32_t *host, size_t n) {
  if (n > v->ibuf_cap[i]) {
    if (v->ibuf[i]) v->be->free(v->be, v->ibuf[i]);
    v->ibuf[i] = v->be->alloc(v->be, n * sizeof(int32_t));
    v->ibuf_cap[i] = v->ibuf[i] ? n : 0;
  }
  if (v->ibuf[i]) v->be->upload(v->be, v->ibuf[i], host, n * sizeof(int32_t));
  return v->ibuf[i];
}

/* ---------------- the encoder ---------------- */
typedef struct {
  int n;              /* patches */
  const int32_t *pos; /* backend [2][n] (rows, columns) or NULL */
  const int32_t *seg; /* full attention segments (host) */
  int n_seg;
  const int32_t *wseg; /* window segments (Qwen2.5-VL) */
  int n_wseg;
} enc_args;

static void norm(sm_vision *v, float *out, const float *x, const float *w, const float *b, int n, int dim) {
  if (v->layernorm) v->be->layernorm(v->be, out, x, w, b, n, dim, v->eps);
  else v->be->rmsnorm(v->be, out, x, w, n, dim, v->eps, 0.f);
}

static void linear(sm_backend *be, const sm_weight *w, const float *bias, const float *x, int n, float *y) {
  be->matmul(be, SM_MM_OTHER, w, x, n, y);
  if (bias) be->add_rows(be, y, bias, n, (int)w->rows);
}

static void block(sm_vision *v, int l, const enc_args *a, float *x) {
  sm_backend *be = v->be;
  const sm_vit_layer *L = &v->L[l];
  const int n = a->n, H = v->hidden, I = v->inter;
  float *xb = v->buf[B_XB], *q = v->buf[B_Q], *k = v->buf[B_K], *vv = v->buf[B_V], *att = v->buf[B_ATT];
  float *f1 = v->buf[B_F1], *f2 = v->buf[B_F2];
  norm(v, xb, x, L->n1w, L->n1b, n, H);
  be->matmul(be, SM_MM_Q, &L->q, xb, n, q);
  be->matmul(be, SM_MM_K, &L->k, xb, n, k);
  be->matmul(be, SM_MM_V, &L->v, xb, n, vv);
  if (L->qb) be->add_rows(be, q, L->qb, n, H);
  if (L->kb) be->add_rows(be, k, L->kb, n, H);
  if (L->vb) be->add_rows(be, vv, L->vb, n, H);
  if (a->pos) {
    be->rope_axes(be, q, n, v->heads, v->head_dim, v->head_dim, v->rope_inv, v->rope_axis, a->pos);
    be->rope_axes(be, k, n, v->heads, v->head_dim, v->head_dim, v->rope_inv, v->rope_axis, a->pos);
  }
  const bool win = v->full_layer && !v->full_layer[l];
  be->attention_seg(be, att, q, k, vv, n, v->heads, v->heads, v->head_dim, 1.0f / sqrtf((float)v->head_dim),
                    win ? a->wseg : a->seg, win ? a->n_wseg : a->n_seg);
  be->matmul(be, SM_MM_O, &L->o, att, n, xb);
  if (L->ob) be->add_rows(be, xb, L->ob, n, H);
  be->add(be, x, xb, (size_t)n * H);
  norm(v, xb, x, L->n2w, L->n2b, n, H);
  if (v->gated) {
    be->matmul(be, SM_MM_GATE, &L->gate, xb, n, f1);
    be->matmul(be, SM_MM_UP, &L->up, xb, n, f2);
    if (L->gateb) be->add_rows(be, f1, L->gateb, n, I);
    if (L->upb) be->add_rows(be, f2, L->upb, n, I);
    be->silu_mul(be, f1, f1, f2, (size_t)n * I);
    be->matmul(be, SM_MM_DOWN, &L->down, f1, n, xb);
    if (L->downb) be->add_rows(be, xb, L->downb, n, H);
  } else {
    be->matmul(be, SM_MM_UP, &L->fc1, xb, n, f1);
    if (L->fc1b) be->add_rows(be, f1, L->fc1b, n, I);
    be->gelu(be, f1, f1, (size_t)n * I, v->kind == SM_VIT_QWEN2 ? SM_GELU_QUICK : SM_GELU_TANH);
    be->matmul(be, SM_MM_DOWN, &L->fc2, f1, n, xb);
    if (L->fc2b) be->add_rows(be, xb, L->fc2b, n, H);
  }
  be->add(be, x, xb, (size_t)n * H);
}

/* Qwen's patch merger of x [n][H] into out [n/4][out_dim] */
static void merger(sm_vision *v, const sm_vit_merger *mg, const float *x, int n, float *out) {
  sm_backend *be = v->be;
  const int H = v->hidden, M = H * v->merge * v->merge, nm = n / (v->merge * v->merge);
  float *xb = v->buf[B_XB], *f1 = v->buf[B_F1];
  if (mg->rms) be->rmsnorm(be, xb, x, mg->nw, n, H, 1e-6f, 0.f);
  else if (mg->post_norm) be->layernorm(be, xb, x, mg->nw, mg->nb, nm, M, 1e-6f);
  else be->layernorm(be, xb, x, mg->nw, mg->nb, n, H, 1e-6f);
  linear(be, &mg->fc1, mg->fc1b, xb, nm, f1);
  be->gelu(be, f1, f1, (size_t)nm * M, SM_GELU_ERF);
  linear(be, &mg->fc2, mg->fc2b, f1, nm, out);
}

/* The conv's input rows: patch (py, px) of frame f of the image as (t, y, x, c) values, rows in the
 * order of order[], into P */
static void frame_rows(const sm_vision *v, const sm_vimage *im, int f, const int32_t *order, int n, float *P) {
  const int p = v->patch, T = v->temporal, K = v->patch_k;
  const size_t plane = (size_t)im->h * im->w;
  const float *src = im->px + (size_t)f * 3 * plane;
  for (int r = 0; r < n; r++) {
    const int py = order[2 * r], px = order[2 * r + 1];
    float *o = P + (size_t)r * K;
    for (int t = 0; t < T; t++)
      for (int y = 0; y < p; y++)
        for (int x = 0; x < p; x++)
          for (int c = 0; c < 3; c++) *o++ = src[(size_t)c * plane + (size_t)(py * p + y) * im->w + px * p + x];
  }
}
static float *patch_rows(const sm_vision *v, const sm_vimage *im, const int32_t *order, int n) {
  float *P = sm_xmalloc(sizeof(float) * (size_t)n * v->patch_k);
  frame_rows(v, im, 0, order, n, P);
  return P;
}

/* torch.linspace(0, end, steps) in float32 */
static float linspace_at(float end, int steps, int i) {
  if (steps == 1) return 0.f;
  const float step = end / (float)(steps - 1);
  return i < steps / 2 ? step * (float)i : end - step * (float)(steps - 1 - i);
}

/* Qwen3-VL's bilinear interpolation of the learned position grid to gh x gw, rows in patch order */
static float *qwen3_pos(const sm_vision *v, const sm_vimage *im, const int32_t *order, int n) {
  const int S = v->pos_side, H = v->hidden;
  float *out = sm_xmalloc(sizeof(float) * (size_t)n * H);
  for (int r = 0; r < n; r++) {
    const int y = order[2 * r], x = order[2 * r + 1];
    const float hy = linspace_at((float)(S - 1), im->gh, y), wx = linspace_at((float)(S - 1), im->gw, x);
    const int y0 = (int)hy, x0 = (int)wx, y1 = SM_MIN(y0 + 1, S - 1), x1 = SM_MIN(x0 + 1, S - 1);
    const float dh = hy - (float)y0, dw = wx - (float)x0;
    const float w4[4] = {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw};
    const float *e[4] = {v->pos_host + ((size_t)y0 * S + x0) * H, v->pos_host + ((size_t)y0 * S + x1) * H,
                         v->pos_host + ((size_t)y1 * S + x0) * H, v->pos_host + ((size_t)y1 * S + x1) * H};
    float *o = out + (size_t)r * H;
    for (int d = 0; d < H; d++) o[d] = e[0][d] * w4[0] + e[1][d] * w4[1] + e[2][d] * w4[2] + e[3][d] * w4[3];
  }
  return out;
}

static smelt_status alloc_work(sm_vision *v, int n, size_t patch_floats) {
  const size_t H = (size_t)v->hidden, I = (size_t)SM_MAX(SM_MAX(v->inter, v->hidden * v->merge * v->merge), v->out_dim);
  const size_t wide = SM_MAX(H, (size_t)v->out_dim);
  if (!buf(v, B_X, n * wide) || !buf(v, B_XB, n * SM_MAX(wide, 4 * H)) || !buf(v, B_Q, n * H) || !buf(v, B_K, n * H) ||
      !buf(v, B_V, n * H) || !buf(v, B_ATT, n * H) || !buf(v, B_F1, n * I) || !buf(v, B_F2, n * I) ||
      !buf(v, B_P, SM_MAX(patch_floats, n * wide)) || !buf(v, B_T, n * wide))
    return sm_err(SMELT_ERR_OOM, "out of backend memory for the vision encoder (%d patches)", n);
  return SMELT_OK;
}

/* Qwen2.5-VL / Qwen3-VL: patch rows in the processor's order (2x2 merge groups) */
static smelt_status enc_qwen(sm_vision *v, sm_vimage *im, sm_venc *e) {
  sm_backend *be = v->be;
  const int gh = im->gh, gw = im->gw, ms = v->merge, mu = ms * ms, n = gh * gw, nm = n / mu;
  const int mh = gh / ms, mw = gw / ms;
  int32_t *order = sm_xmalloc(sizeof(int32_t) * 2 * (size_t)n); /* (row, col) of patch r */
  int r = 0;
  for (int bh = 0; bh < mh; bh++)
    for (int bw = 0; bw < mw; bw++)
      for (int a = 0; a < ms; a++)
        for (int b = 0; b < ms; b++, r++) {
          order[2 * r] = bh * ms + a;
          order[2 * r + 1] = bw * ms + b;
        }
  /* Qwen2.5-VL: merge groups in window order (windows of window/merge/patch merged tokens) */
  int32_t *widx = NULL, *wseg = NULL, n_wseg = 0;
  if (v->kind == SM_VIT_QWEN25) {
    const int vws = v->window / ms / v->patch, nwh = (mh + vws - 1) / vws, nww = (mw + vws - 1) / vws;
    widx = sm_xmalloc(sizeof(int32_t) * (size_t)nm);
    wseg = sm_xmalloc(sizeof(int32_t) * ((size_t)nwh * nww + 1));
    int k = 0;
    wseg[0] = 0;
    for (int wy = 0; wy < nwh; wy++)
      for (int wx = 0; wx < nww; wx++) {
        for (int iy = wy * vws; iy < SM_MIN(mh, (wy + 1) * vws); iy++)
          for (int ix = wx * vws; ix < SM_MIN(mw, (wx + 1) * vws); ix++) widx[k++] = iy * mw + ix;
        wseg[++n_wseg] = k * mu;
      }
    int32_t *o2 = sm_xmalloc(sizeof(int32_t) * 2 * (size_t)n);
    for (int i = 0; i < n; i++) {
      const int src = widx[i / mu] * mu + i % mu;
      o2[2 * i] = order[2 * src];
      o2[2 * i + 1] = order[2 * src + 1];
    }
    free(order);
    order = o2;
  }
  smelt_status st = alloc_work(v, n, (size_t)n * v->patch_k);
  float *P = st ? NULL : patch_rows(v, im, order, n);
  int32_t *pos = sm_xmalloc(sizeof(int32_t) * 2 * (size_t)n);
  for (int i = 0; i < n; i++) {
    pos[i] = order[2 * i];
    pos[n + i] = order[2 * i + 1];
  }
  const int32_t seg[2] = {0, n};
  enc_args a = {n, NULL, seg, 1, wseg, n_wseg};
  if (!st) {
    float *x = v->buf[B_X];
    be->upload(be, v->buf[B_P], P, sizeof(float) * (size_t)n * v->patch_k);
    be->matmul(be, SM_MM_OTHER, &v->patch_w, v->buf[B_P], n, x);
    if (v->patch_b) be->add_rows(be, x, v->patch_b, n, v->hidden);
    if (v->pos_host) {
      float *pe = qwen3_pos(v, im, order, n);
      be->upload(be, v->buf[B_T], pe, sizeof(float) * (size_t)n * v->hidden);
      be->add(be, x, v->buf[B_T], (size_t)n * v->hidden);
      free(pe);
    }
    a.pos = ibuf(v, 1, pos, 2 * (size_t)n);
    if (!a.pos) st = sm_err(SMELT_ERR_OOM, "vision positions");
    int dk = 0;
    for (int l = 0; !st && l < v->layers; l++) {
      block(v, l, &a, x);
      if (dk < v->n_deep && v->deep_layer[dk] == l) {
        merger(v, &v->deep[dk], x, n, e->deep[dk]);
        dk++;
      }
    }
    if (!st && widx) { /* merged rows back to the grid order */
      merger(v, &v->merger, x, n, v->buf[B_T]);
      int32_t *rev = sm_xmalloc(sizeof(int32_t) * (size_t)nm);
      for (int i = 0; i < nm; i++) rev[widx[i]] = i;
      const int32_t *dr = ibuf(v, 0, rev, (size_t)nm);
      free(rev);
      if (!dr) st = sm_err(SMELT_ERR_OOM, "vision indexes");
      else be->gather_rows(be, e->embd, v->buf[B_T], dr, nm, v->out_dim);
    } else if (!st) {
      merger(v, &v->merger, x, n, e->embd);
    }
  }
  free(P);
  free(pos);
  free(order);
  free(widx);
  free(wseg);
  return st;
}

/* Idefics3VisionEmbeddings' position ids of a frame of nb x nb patches in a table of side N: fractions
 * i / nb bucketized by the boundaries 1/N, 2/N, ... (torch.arange in float32, values computed in
 * double; bucketize with right=True), so that a frame of another size reuses the table's grid */
static void idefics3_pos_ids(int nb, int N, int32_t *out) {
  const double bs = 1.0 / N, fs = (double)(1.0f / (float)nb);
  const int nbd = (int)ceil((1.0 - bs) / bs);
  for (int i = 0; i < nb; i++) {
    const float f = (float)(i * fs);
    int k = 0;
    while (k < nbd && (float)(bs + k * bs) <= f) k++;
    out[i] = k;
  }
}

/* SigLIP (Gemma 3, Idefics3) over an image's frames of gh x gh patches at once, each attending only
 * within itself: the patch embedding, the learned positions (Gemma 3: the table in order; Idefics3:
 * the bucketized ids, the same in every frame), the blocks, post-LayerNorm into v->buf[B_XB] */
static smelt_status siglip_frames(sm_vision *v, sm_vimage *im, bool bucketed) {
  sm_backend *be = v->be;
  const int fs = im->gh, P = fs * fs, F = im->frames, n = F * P, H = v->hidden;
  smelt_status st = alloc_work(v, n, (size_t)n * v->patch_k);
  if (st) return st;
  int32_t *order = sm_xmalloc(sizeof(int32_t) * 2 * (size_t)P);
  for (int r = 0; r < P; r++) {
    order[2 * r] = r / fs;
    order[2 * r + 1] = r % fs;
  }
  float *Pm = sm_xmalloc(sizeof(float) * (size_t)n * v->patch_k), *x = v->buf[B_X];
  for (int f = 0; f < F; f++) frame_rows(v, im, f, order, P, Pm + (size_t)f * P * v->patch_k);
  free(order);
  be->upload(be, v->buf[B_P], Pm, sizeof(float) * (size_t)n * v->patch_k);
  free(Pm);
  be->matmul(be, SM_MM_OTHER, &v->patch_w, v->buf[B_P], n, x);
  if (v->patch_b) be->add_rows(be, x, v->patch_b, n, H);
  if (bucketed) {
    int32_t *b1 = sm_xmalloc(sizeof(int32_t) * (size_t)fs), *idx = sm_xmalloc(sizeof(int32_t) * (size_t)n);
    idefics3_pos_ids(fs, v->side, b1);
    for (int i = 0; i < n; i++) idx[i] = b1[(i % P) / fs] * v->side + b1[(i % P) % fs];
    free(b1);
    const int32_t *di = ibuf(v, 1, idx, (size_t)n);
    free(idx);
    if (!di) return sm_err(SMELT_ERR_OOM, "vision positions");
    be->gather_rows(be, v->buf[B_T], v->pos_embed, di, n, H);
    be->add(be, x, v->buf[B_T], (size_t)n * H);
  } else {
    for (int f = 0; f < F; f++) be->add(be, x + (size_t)f * P * H, v->pos_embed, (size_t)P * H);
  }
  int32_t *seg = sm_xmalloc(sizeof(int32_t) * (size_t)(F + 1));
  for (int f = 0; f <= F; f++) seg[f] = f * P;
  enc_args a = {n, NULL, seg, F, NULL, 0};
  for (int l = 0; l < v->layers; l++) block(v, l, &a, x);
  free(seg);
  be->layernorm(be, v->buf[B_XB], x, v->post_w, v->post_b, n, H, v->eps);
  return SMELT_OK;
}

static smelt_status enc_siglip(sm_vision *v, sm_vimage *im, sm_venc *e) {
  sm_backend *be = v->be;
  const int side = im->gh, H = v->hidden, ms = v->mm_side, k = side / ms, nt = ms * ms;
  smelt_status st = siglip_frames(v, im, false);
  if (st) return st;
  float *xb = v->buf[B_XB], *acc = v->buf[B_T], *tmp = v->buf[B_P];
  /* k x k average pool: k*k gathers of the pooled grid's cells, summed, scaled */
  int32_t *idx = sm_xmalloc(sizeof(int32_t) * (size_t)nt * k * k);
  for (int dy = 0; dy < k; dy++)
    for (int dx = 0; dx < k; dx++)
      for (int t = 0; t < nt; t++) idx[((size_t)dy * k + dx) * nt + t] = ((t / ms) * k + dy) * side + (t % ms) * k + dx;
  const int32_t *di = ibuf(v, 0, idx, (size_t)nt * k * k);
  free(idx);
  if (!di) return sm_err(SMELT_ERR_OOM, "vision indexes");
  be->gather_rows(be, acc, xb, di, nt, H);
  for (int j = 1; j < k * k; j++) {
    be->gather_rows(be, tmp, xb, di + (size_t)j * nt, nt, H);
    be->add(be, acc, tmp, (size_t)nt * H);
  }
  be->scale(be, acc, 1.0f / (float)(k * k), (size_t)nt * H);
  be->rmsnorm(be, acc, acc, v->mm_norm, nt, H, v->eps, 1.0f);
  be->matmul(be, SM_MM_OTHER, &v->mm_proj, acc, nt, e->embd);
  return SMELT_OK;
}

static smelt_status enc_pixtral(sm_vision *v, sm_vimage *im, sm_venc *e) {
  sm_backend *be = v->be;
  const int gh = im->gh, gw = im->gw, n = gh * gw, H = v->hidden, nm = im->n_embd;
  smelt_status st = alloc_work(v, n, (size_t)n * v->patch_k);
  if (st) return st;
  int32_t *order = sm_xmalloc(sizeof(int32_t) * 2 * (size_t)n), *pos = sm_xmalloc(sizeof(int32_t) * 2 * (size_t)n);
  for (int r = 0; r < n; r++) {
    order[2 * r] = pos[r] = r / gw;
    order[2 * r + 1] = pos[n + r] = r % gw;
  }
  float *P = patch_rows(v, im, order, n), *x = v->buf[B_X], *xb = v->buf[B_XB];
  free(order);
  be->upload(be, v->buf[B_P], P, sizeof(float) * (size_t)n * v->patch_k);
  free(P);
  be->matmul(be, SM_MM_OTHER, &v->patch_w, v->buf[B_P], n, x);
  be->rmsnorm(be, x, x, v->ln_pre, n, H, v->eps, 0.f);
  const int32_t seg[2] = {0, n};
  enc_args a = {n, ibuf(v, 1, pos, 2 * (size_t)n), seg, 1, NULL, 0};
  free(pos);
  if (!a.pos) return sm_err(SMELT_ERR_OOM, "vision positions");
  for (int l = 0; l < v->feature_layer; l++) block(v, l, &a, x);
  /* projector: RMSNorm, 2x2 patch merger (4 gathered rows), linear_1, GELU, linear_2 */
  be->rmsnorm(be, xb, x, v->proj_norm, n, H, v->proj_eps, 0.f);
  int32_t *idx = sm_xmalloc(sizeof(int32_t) * 4 * (size_t)nm);
  const int mw = gw / 2;
  for (int i = 0; i < nm; i++)
    for (int k = 0; k < 4; k++) idx[4 * i + k] = (2 * (i / mw) + k / 2) * gw + 2 * (i % mw) + k % 2;
  const int32_t *di = ibuf(v, 0, idx, 4 * (size_t)nm);
  free(idx);
  if (!di) return sm_err(SMELT_ERR_OOM, "vision indexes");
  float *g = v->buf[B_P], *f1 = v->buf[B_F1], *t = v->buf[B_T];
  be->gather_rows(be, g, xb, di, 4 * nm, H);
  be->matmul(be, SM_MM_OTHER, &v->merge_w, g, nm, t);
  linear(be, &v->lin1, v->lin1b, t, nm, f1);
  be->gelu(be, f1, f1, (size_t)nm * v->out_dim, SM_GELU_ERF);
  linear(be, &v->lin2, v->lin2b, f1, nm, e->embd);
  return SMELT_OK;
}

/* Idefics3 / SmolVLM: the frames (tiles, then the whole image) through SigLIP at once, each attending
 * only within itself; post-layernorm; the connector's pixel shuffle (scale s: each output token the
 * s x s block of patch rows, row-major, concatenated) as a gather, then its projection */
static smelt_status enc_idefics3(sm_vision *v, sm_vimage *im, sm_venc *e) {
  sm_backend *be = v->be;
  const int fs = im->gh, P = fs * fs, F = im->frames, n = F * P, H = v->hidden, s = v->merge, ms = v->mm_side;
  const int nt = ms * ms;
  smelt_status st = siglip_frames(v, im, true);
  if (st) return st;
  /* output token t of frame f: rows (ty * s + dy, tx * s + dx) of the frame, dy-major */
  int32_t *idx = sm_xmalloc(sizeof(int32_t) * (size_t)n);
  for (int f = 0, i = 0; f < F; f++)
    for (int t = 0; t < nt; t++)
      for (int k = 0; k < s * s; k++, i++) idx[i] = f * P + ((t / ms) * s + k / s) * fs + (t % ms) * s + k % s;
  const int32_t *dg = ibuf(v, 0, idx, (size_t)n);
  free(idx);
  if (!dg) return sm_err(SMELT_ERR_OOM, "vision indexes");
  be->gather_rows(be, v->buf[B_P], v->buf[B_XB], dg, n, H);
  be->matmul(be, SM_MM_OTHER, &v->mm_proj, v->buf[B_P], F * nt, e->embd);
  return SMELT_OK;
}

/* ---------------- cache ---------------- */
static void venc_free(sm_vision *v, sm_venc *e) {
  if (e->embd) v->be->free(v->be, e->embd);
  for (int i = 0; i < e->n_deep; i++)
    if (e->deep[i]) v->be->free(v->be, e->deep[i]);
  free(e->deep);
  free(e);
}

void sm_vit_cache_clear(sm_vision *v) {
  while (v->cache) {
    sm_venc *e = v->cache;
    v->cache = e->next;
    venc_free(v, e);
  }
  v->cache_bytes = 0;
}

/* drop least recently used entries nobody pins until the cache fits */
static void evict(sm_vision *v) {
  while (v->cache_bytes > v->cache_max) {
    sm_venc **victim = NULL;
    for (sm_venc **p = &v->cache; *p; p = &(*p)->next)
      if (atomic_load(&(*p)->pins) == 0 && (!victim || (*p)->last_use < (*victim)->last_use)) victim = p;
    if (!victim) return;
    sm_venc *e = *victim;
    *victim = e->next;
    v->cache_bytes -= e->bytes;
    venc_free(v, e);
  }
}

smelt_status sm_vision_encode(sm_vision *v, sm_vimage *im) {
  if (im->enc) return SMELT_OK;
  v->tick++;
  for (sm_venc *e = v->cache; e; e = e->next)
    if (!memcmp(e->hash, im->hash, sizeof im->hash)) {
      atomic_fetch_add(&e->pins, 1);
      e->last_use = v->tick;
      im->enc = e;
      free(im->px);
      im->px = NULL;
      return SMELT_OK;
    }
  if (!im->px) return sm_err(SMELT_ERR_INVALID, "image already released");
  sm_venc *e = sm_xcalloc(1, sizeof *e);
  memcpy(e->hash, im->hash, sizeof e->hash);
  e->n_embd = im->n_embd;
  e->dim = v->out_dim;
  e->n_deep = v->n_deep;
  const size_t bytes = sizeof(float) * (size_t)e->n_embd * e->dim;
  e->embd = v->be->alloc(v->be, bytes);
  e->deep = sm_xcalloc((size_t)(e->n_deep ? e->n_deep : 1), sizeof(float *));
  bool ok = e->embd != NULL;
  for (int i = 0; ok && i < e->n_deep; i++) ok = (e->deep[i] = v->be->alloc(v->be, bytes)) != NULL;
  if (!ok) {
    venc_free(v, e);
    return sm_err(SMELT_ERR_OOM, "out of backend memory for image embeddings");
  }
  e->bytes = bytes * (size_t)(1 + e->n_deep);
  smelt_status st = v->kind == SM_VIT_SIGLIP   ? enc_siglip(v, im, e)
                  : v->kind == SM_VIT_PIXTRAL  ? enc_pixtral(v, im, e)
                  : v->kind == SM_VIT_IDEFICS3 ? enc_idefics3(v, im, e)
                                               : enc_qwen(v, im, e);
  if (st) {
    venc_free(v, e);
    return st;
  }
  v->be->sync(v->be);
  atomic_init(&e->pins, 1);
  e->last_use = v->tick;
  e->next = v->cache;
  v->cache = e;
  v->cache_bytes += e->bytes;
  im->enc = e;
  free(im->px);
  im->px = NULL;
  evict(v);
  return SMELT_OK;
}
