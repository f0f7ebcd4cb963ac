/* CPU implementations of the backend ops with explicit shapes that read no batch state (backend.h:
 * attention_seg, rope_axes, gelu, gather_rows; copy is cpu_backend.c's), used by the vision encoders and by the
 * language model's image positions. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_internal.h"

#define ENC_PAR_MIN (1 << 15) /* work (elements) below which an op runs on the calling thread */

typedef void (*enc_range_fn)(void *ctx, size_t i0, size_t i1);
typedef struct {
  enc_range_fn fn;
  void *ctx;
  size_t n, chunk;
  _Atomic size_t next;
} enc_pfor;

static void enc_job(void *vctx, int tid, int nth) {
  (void)tid;
  (void)nth;
  enc_pfor *p = vctx;
  for (;;) {
    const size_t i0 = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
    if (i0 >= p->n) break;
    p->fn(p->ctx, i0, i0 + p->chunk < p->n ? i0 + p->chunk : p->n);
  }
}

static void run(sm_backend *be, size_t n, size_t cost, enc_range_fn fn, void *ctx) {
  sm_pool *pool = sm_cpu_backend_pool(be);
  const int nth = sm_pool_size(pool);
  if (!n) return;
  if (nth == 1 || n == 1 || n * cost < ENC_PAR_MIN) {
    fn(ctx, 0, n);
    return;
  }
  enc_pfor p = {.fn = fn, .ctx = ctx, .n = n};
  const size_t chunk = n / ((size_t)nth * 4);
  p.chunk = chunk ? chunk : 1;
  atomic_init(&p.next, 0);
  sm_pool_run(pool, enc_job, &p);
}

/* ---------------- attention within segments ---------------- */
#define SEG_ROWS 16  /* query rows (tokens of one head) per work item */
#define SEG_CHUNK 64 /* keys per step */
typedef struct {
  const sm_cpu_kern *k;
  float *out;
  const float *q, *kk, *v;
  int nh, nkv, hd;
  float scale;
  const int32_t *item_t0, *item_seg; /* per query tile: first token, its segment */
  const int32_t *seg;
  int n_tiles;
} seg_ctx;

static void seg_range(void *vctx, size_t i0, size_t i1) {
  seg_ctx *a = vctx;
  const sm_cpu_kern *k = a->k;
  const int hd = a->hd, grp = a->nh / a->nkv;
  const size_t qs = (size_t)a->nh * hd, ks = (size_t)a->nkv * hd;
  float *acc = sm_xmalloc(sizeof(float) * SEG_ROWS * (size_t)hd);
  float S[SEG_ROWS * SEG_CHUNK], m[SEG_ROWS], l[SEG_ROWS];
  const float *kr[SEG_CHUNK], *vr[SEG_CHUNK];
  for (size_t it = i0; it < i1; it++) {
    const int tile = (int)(it / (size_t)a->nh), h = (int)(it % (size_t)a->nh), g = h / grp;
    const int s = a->item_seg[tile], t0 = a->item_t0[tile];
    const int lo = a->seg[s], hi = a->seg[s + 1];
    const int R = SM_MIN(SEG_ROWS, hi - t0);
    memset(acc, 0, sizeof(float) * (size_t)R * hd);
    for (int i = 0; i < R; i++) {
      m[i] = -INFINITY;
      l[i] = 0.f;
    }
    const float *Q = a->q + (size_t)t0 * qs + (size_t)h * hd;
    for (int j0 = lo; j0 < hi; j0 += SEG_CHUNK) {
      const int np = SM_MIN(SEG_CHUNK, hi - j0);
      for (int j = 0; j < np; j++) {
        kr[j] = a->kk + (size_t)(j0 + j) * ks + (size_t)g * hd;
        vr[j] = a->v + (size_t)(j0 + j) * ks + (size_t)g * hd;
      }
      if (k->att_scores) k->att_scores(Q, (int)qs, R, kr, np, hd, S, SEG_CHUNK);
      else
        for (int i = 0; i < R; i++)
          for (int j = 0; j < np; j++) S[i * SEG_CHUNK + j] = k->dot(Q + (size_t)i * qs, kr[j], hd);
      for (int i = 0; i < R; i++) {
        float *sr = S + i * SEG_CHUNK, cm = -INFINITY;
        for (int j = 0; j < np; j++) {
          sr[j] *= a->scale;
          if (sr[j] > cm) cm = sr[j];
        }
        if (cm > m[i]) {
          const float f = m[i] == -INFINITY ? 0.f : expf(m[i] - cm);
          if (f != 1.f) k->scal(acc + (size_t)i * hd, f, hd);
          l[i] *= f;
          m[i] = cm;
        }
        for (int j = 0; j < np; j++) {
          sr[j] = expf(sr[j] - m[i]);
          l[i] += sr[j];
        }
      }
      if (k->att_pv) k->att_pv(S, SEG_CHUNK, R, vr, np, hd, acc);
      else
        for (int i = 0; i < R; i++)
          for (int j = 0; j < np; j++) k->axpy(acc + (size_t)i * hd, S[i * SEG_CHUNK + j], vr[j], hd);
    }
    for (int i = 0; i < R; i++) {
      float *o = a->out + (size_t)(t0 + i) * qs + (size_t)h * hd;
      const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
      for (int d = 0; d < hd; d++) o[d] = acc[(size_t)i * hd + d] * inv;
    }
  }
  free(acc);
}

static void be_attention_seg(sm_backend *be, float *out, const float *q, const float *k, const float *v, int n,
                             int n_heads, int n_kv_heads, int head_dim, float scale, const int32_t *seg, int n_seg) {
  if (n <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads || n_seg <= 0 || !seg ||
      seg[0] != 0 || seg[n_seg] != n) {
    sm_err(SMELT_ERR_INVALID, "attention_seg: bad shape or segments");
    if (n > 0 && n_heads > 0 && head_dim > 0) memset(out, 0, sizeof(float) * (size_t)n * n_heads * head_dim);
    return;
  }
  int n_tiles = 0;
  for (int s = 0; s < n_seg; s++) {
    if (seg[s + 1] < seg[s]) {
      sm_err(SMELT_ERR_INVALID, "attention_seg: segments not ascending");
      return;
    }
    n_tiles += (seg[s + 1] - seg[s] + SEG_ROWS - 1) / SEG_ROWS;
  }
  int32_t *t0 = sm_xmalloc(sizeof(int32_t) * (size_t)(n_tiles ? n_tiles : 1) * 2), *ts = t0 + n_tiles;
  int i = 0;
  size_t cost = 0;
  for (int s = 0; s < n_seg; s++) {
    for (int t = seg[s]; t < seg[s + 1]; t += SEG_ROWS, i++) {
      t0[i] = t;
      ts[i] = s;
    }
    cost = SM_MAX(cost, (size_t)(seg[s + 1] - seg[s]));
  }
  seg_ctx a = {sm_cpu_backend_kern(be), out, q, k, v, n_heads, n_kv_heads, head_dim, scale, t0, ts, seg, n_tiles};
  run(be, (size_t)n_tiles * n_heads, cost * SEG_ROWS * (size_t)head_dim * 2, seg_range, &a);
  free(t0);
}

/* ---------------- multi-axis RoPE ---------------- */
typedef struct {
  float *x;
  int n, nh, hd, rot;
  const float *inv;
  const int32_t *axis, *pos;
} rax_ctx;

static void rax_range(void *vctx, size_t t0, size_t t1) {
  rax_ctx *r = vctx;
  const int half = r->rot / 2;
  float cs[512], sn[512];
  for (size_t t = t0; t < t1; t++)
    for (int i0 = 0; i0 < half; i0 += 512) {
      const int i1 = SM_MIN(half, i0 + 512);
      for (int i = i0; i < i1; i++) {
        const float ang = (float)r->pos[(size_t)r->axis[i] * r->n + t] * r->inv[i];
        cs[i - i0] = cosf(ang);
        sn[i - i0] = sinf(ang);
      }
      for (int h = 0; h < r->nh; h++) {
        float *v = r->x + (t * (size_t)r->nh + (size_t)h) * (size_t)r->hd;
        for (int i = i0; i < i1; i++) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cs[i - i0] - b * sn[i - i0];
          v[i + half] = a * sn[i - i0] + b * cs[i - i0];
        }
      }
    }
}

static void be_rope_axes(sm_backend *be, float *x, int n, int n_heads, int head_dim, int rot_dim, const float *inv,
                         const int32_t *axis, const int32_t *pos) {
  if (n <= 0 || n_heads <= 0 || rot_dim < 2 || rot_dim % 2 || rot_dim > head_dim) return;
  rax_ctx r = {x, n, n_heads, head_dim, rot_dim, inv, axis, pos};
  run(be, (size_t)n, (size_t)n_heads * (size_t)rot_dim * 4, rax_range, &r);
}

/* ---------------- gelu, gather, copy ---------------- */
typedef struct {
  float *y;
  const float *x;
  int kind;
} gelu_ctx;
static void gelu_range(void *vctx, size_t i0, size_t i1) {
  gelu_ctx *g = vctx;
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  if (g->kind == SM_GELU_QUICK)
    for (size_t i = i0; i < i1; i++) g->y[i] = g->x[i] / (1.f + expf(-1.702f * g->x[i]));
  else if (g->kind == SM_GELU_TANH)
    for (size_t i = i0; i < i1; i++) {
      const float v = g->x[i];
      g->y[i] = 0.5f * v * (1.f + tanhf(k0 * (v + k1 * v * v * v)));
    }
  else
    for (size_t i = i0; i < i1; i++) g->y[i] = 0.5f * g->x[i] * (1.f + erff(g->x[i] * 0.70710678118654752f));
}
static void be_gelu(sm_backend *be, float *y, const float *x, size_t n, int kind) {
  gelu_ctx g = {y, x, kind};
  run(be, n, 8, gelu_range, &g);
}

typedef struct {
  float *dst;
  const float *src;
  const int32_t *idx;
  int dim;
} gat_ctx;
static void gat_range(void *vctx, size_t i0, size_t i1) {
  gat_ctx *g = vctx;
  for (size_t i = i0; i < i1; i++)
    memcpy(g->dst + i * (size_t)g->dim, g->src + (size_t)g->idx[i] * (size_t)g->dim, sizeof(float) * (size_t)g->dim);
}
static void be_gather_rows(sm_backend *be, float *dst, const float *src, const int32_t *idx, int n, int dim) {
  if (n <= 0 || dim <= 0) return;
  gat_ctx g = {dst, src, idx, dim};
  run(be, (size_t)n, (size_t)dim, gat_range, &g);
}

void sm_cpu_encoder_ops(sm_backend *b) {
  b->attention_seg = be_attention_seg;
  b->rope_axes = be_rope_axes;
  b->gelu = be_gelu;
  b->gather_rows = be_gather_rows;
}
