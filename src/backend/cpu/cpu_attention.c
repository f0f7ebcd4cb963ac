/* CPU backend: the paged KV cache (store) and attention (online softmax over chunks of the cache,
 * query rows that share a KV head processed together). */
#include "backend/cpu/cpu_be.h"
#include "backend/kv_quant.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* slot of token position pos in sequence s, or -1 if the block table doesn't map it */
static int64_t kv_slot(const cpu_be *c, const sm_kv_cache *kv, int s, int32_t pos) {
  if (kv->block_size <= 0) return -1;
  int64_t bi = pos / kv->block_size;
  if (bi >= c->b.max_blocks) return -1;
  int32_t blk = c->b.block_table[(size_t)s * (size_t)c->b.max_blocks + (size_t)bi];
  if (blk < 0 || blk >= kv->n_blocks) return -1;
  return (int64_t)blk * kv->block_size + pos % kv->block_size;
}

/* a position's n_kv_heads head rows of hd floats into the cache row at dst, hb bytes a head (f16 /
 * bf16: round to nearest even; q8_0 / q4_0: each head row quantized on its own) */
static void kv_put(const sm_cpu_kern *k, char *dst, sm_dtype dt, const float *x, int nkv, int hd, size_t hb) {
  const size_t n = (size_t)nkv * (size_t)hd;
  if (sm_kv_quantized(dt)) {
    for (int h = 0; h < nkv; h++) sm_kv_quantize_row(dst + (size_t)h * hb, dt, x + (size_t)h * hd, hd);
    return;
  }
  sm_cpu_kv_narrow(k, dst, dt, x, n);
}

void sm_cpu_kv_store(sm_backend *be, const sm_kv_cache *kv, int layer, const float *k, const float *v) {
  cpu_be *c = CB(be);
  if (!kv || layer < 0 || layer >= kv->n_layers) return;
  const int nkv = kv->n_kv_heads, hd = kv->head_dim;
  const size_t row = (size_t)nkv * (size_t)hd, hb = sm_kv_head_bytes(kv->dtype, hd), rb = (size_t)nkv * hb;
  char *K = kv->k[layer], *Vc = kv->v[layer];
  for (int t = 0; t < c->b.n_tokens; t++) {
    int64_t s = kv_slot(c, kv, c->b.seq[t], c->b.pos[t]);
    if (s < 0) continue;
    kv_put(c->k, K + (size_t)s * rb, kv->dtype, k + (size_t)t * row, nkv, hd, hb);
    kv_put(c->k, Vc + (size_t)s * rb, kv->dtype, v + (size_t)t * row, nkv, hd, hb);
  }
}

/* slots of positions [p0, p0+np) of sequence s (-1 where unmapped): one division per block */
static void kv_slots(const cpu_be *c, const sm_kv_cache *kv, int s, int32_t p0, int np, int64_t *out) {
  const int bs = kv->block_size;
  for (int j = 0; j < np;) {
    int32_t p = p0 + j;
    int64_t bi = bs > 0 ? p / bs : 0;
    int off = bs > 0 ? (int)(p % bs) : 0, run = bs - off < np - j ? bs - off : np - j;
    int32_t blk = -1;
    if (bs > 0 && bi < c->b.max_blocks) blk = c->b.block_table[(size_t)s * (size_t)c->b.max_blocks + (size_t)bi];
    if (bs <= 0) run = np - j;
    for (int u = 0; u < run; u++) out[j + u] = blk >= 0 && blk < kv->n_blocks ? (int64_t)blk * bs + off + u : -1;
    j += run;
  }
}

/* ---------------- attention ---------------- */
/* Work item = (tile of consecutive tokens of one sequence, KV head, sub-group of <= ATT_ROWS/...
 * query heads): its query rows (tokens x heads that share the KV head) are processed together,
 * so each K/V row is loaded once per item instead of once per query head and token.
 *
 * A row's key range is cut into segments of ATT_SEG positions at fixed absolute boundaries; each
 * segment's online softmax starts empty and the segments' (max, sum, accumulator) are merged in
 * order (att_merge). When the items are fewer than the threads (decode of a few sequences at depth)
 * every (item, segment) becomes its own work item and the merge runs afterwards; otherwise an item
 * runs its segments one after the other. Both compute the same operations in the same order, so a
 * row's result does not depend on the batch it is in or on the thread count (batch invariance,
 * docs/cpu.md). */
#define ATT_CHUNK 64
#define ATT_ROWS 64 /* query rows per item: K/V chunks are widened and transposed once for all */
#define ATT_SEG 64  /* positions a segment (a multiple of ATT_CHUNK) */
typedef struct {
  cpu_be *c;
  float *out;
  const float *q;
  const sm_kv_cache *kv;
  int layer, n_heads, window;
  float scale, softcap;
  const float *sinks;   /* per-head sink logits (attention_sinks) or NULL */
  const int32_t *tile0; /* [n_tiles+1] first token of each tile */
  int n_tiles, hsub, n_hsub;
  int nseg;    /* > 0: work items are (item, segment) pairs, nseg segments an item; 0: whole items */
  int rmax;    /* rows of the largest item (the partials' stride) */
  float *part; /* with nseg: [item][segment][rmax][hd + 2] (max, sum, accumulator) */
} att_ctx;

static void gen_scores(const sm_cpu_kern *k, const float *q, int ldq, int nq, const float *const *kr, int np, int hd,
                       float *s, int lds) {
  for (int i = 0; i < nq; i++)
    for (int j = 0; j < np; j++) s[(size_t)i * lds + j] = k->dot(q + (size_t)i * ldq, kr[j], hd);
}
static void gen_pv(const sm_cpu_kern *k, const float *p, int ldp, int nq, const float *const *vr, int np, int hd,
                   float *acc) {
  for (int i = 0; i < nq; i++)
    for (int j = 0; j < np; j++)
      if (p[(size_t)i * ldp + j] != 0.f) k->axpy(acc + (size_t)i * hd, p[(size_t)i * ldp + j], vr[j], hd);
}

/* an item's rows: token t0 + i / nh, head h0 + i % nh for i < R; their key ranges [lo, hi] and the
 * union [plo, phi] (plo rounded down to a chunk) */
typedef struct {
  int t0, h0, nh, R, kvh, sq;
  int32_t plo, phi, lo[ATT_ROWS], hi[ATT_ROWS];
} att_rows;

static void rows_of(const att_ctx *a, size_t item, att_rows *r) {
  const cpu_be *c = a->c;
  const int nkv = a->kv->n_kv_heads, grp = a->n_heads / nkv;
  const int hs = (int)(item % (size_t)a->n_hsub);
  r->kvh = (int)(item / (size_t)a->n_hsub % (size_t)nkv);
  const int tile = (int)(item / ((size_t)a->n_hsub * (size_t)nkv));
  r->t0 = a->tile0[tile];
  const int ntt = a->tile0[tile + 1] - r->t0;
  r->h0 = r->kvh * grp + hs * a->hsub;
  r->nh = grp - hs * a->hsub < a->hsub ? grp - hs * a->hsub : a->hsub;
  r->R = ntt * r->nh;
  r->sq = c->b.seq[r->t0];
  r->plo = INT32_MAX;
  r->phi = -1;
  for (int i = 0; i < r->R; i++) {
    const int t = r->t0 + i / r->nh;
    const int32_t pos = c->b.pos[t];
    r->hi[i] = pos;
    r->lo[i] = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    if (c->b.attn_span) { /* widened (bidirectional image tokens) */
      r->lo[i] = SM_MIN(r->lo[i], c->b.attn_span[2 * t]);
      r->hi[i] = SM_MAX(r->hi[i], c->b.attn_span[2 * t + 1]);
    }
    if (r->lo[i] < r->plo) r->plo = r->lo[i];
    if (r->hi[i] > r->phi) r->phi = r->hi[i];
  }
  /* chunks start at multiples of ATT_CHUNK whatever the item's rows: every row sees the same
   * chunks (those before its window or after its position masked), so its result does not
   * depend on the tokens it shares an item with (batch invariance) */
  if (r->plo <= r->phi) r->plo -= r->plo % ATT_CHUNK;
}

/* per-call scratch of the segment kernel */
typedef struct {
  float *Q, *acc, *tot, *kw, *vw;
  float m[ATT_ROWS], l[ATT_ROWS], tm[ATT_ROWS], tl[ATT_ROWS];
} att_buf;

static void buf_init(att_buf *b, const att_ctx *a) {
  const int hd = a->kv->head_dim;
  b->Q = sm_xmalloc((size_t)ATT_ROWS * (size_t)hd * sizeof(float) * 3);
  b->acc = b->Q + (size_t)ATT_ROWS * hd;
  b->tot = b->acc + (size_t)ATT_ROWS * hd;
  /* a half-precision or quantized cache: a chunk's K/V rows are widened into kw / vw first (once for all rows) */
  b->kw = a->kv->dtype != SM_DT_F32 ? sm_xmalloc((size_t)ATT_CHUNK * 2 * (size_t)hd * sizeof(float)) : NULL;
  b->vw = b->kw ? b->kw + (size_t)ATT_CHUNK * hd : NULL;
}
static void buf_free(att_buf *b) {
  free(b->Q);
  free(b->kw);
}

/* the rows' online softmax over positions [p0, p1] (p0 a multiple of ATT_CHUNK), from empty:
 * b->m, b->l, b->acc */
static void att_span(const att_ctx *a, const att_rows *r, att_buf *b, int32_t p0, int32_t p1) {
  const cpu_be *c = a->c;
  const sm_cpu_kern *k = c->k;
  const sm_kv_cache *kv = a->kv;
  const int hd = kv->head_dim, nkv = kv->n_kv_heads, R = r->R, kvh = r->kvh;
  const size_t hb = sm_kv_head_bytes(kv->dtype, hd), krow = (size_t)nkv * hb; /* bytes */
  const char *Kc = kv->k[a->layer], *Vc = kv->v[a->layer];
  /* an f16 cache read in place by kernels that widen in registers, else rows widened into kw / vw first */
  const bool direct = kv->dtype == SM_DT_F16 && k->att_scores_f16 && k->att_pv_f16 && hd % 16 == 0 && hd <= 256;
  const bool wide = b->kw != NULL && !direct;
  float S[ATT_ROWS * ATT_CHUNK], *m = b->m, *l = b->l, *acc = b->acc;
  const float *kr[ATT_CHUNK], *vr[ATT_CHUNK];
  const void *kh[ATT_CHUNK], *vh[ATT_CHUNK]; /* direct: the rows in the cache */
  int32_t pp[ATT_CHUNK];
  for (int i = 0; i < R; i++) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }
  memset(acc, 0, (size_t)R * (size_t)hd * sizeof(float));
  int64_t slb[2][ATT_CHUNK], *sl = slb[0], *sln = slb[1];
  if (p0 <= p1) kv_slots(c, kv, r->sq, p0, p1 - p0 + 1 < ATT_CHUNK ? p1 - p0 + 1 : ATT_CHUNK, sl);
  for (int32_t c0 = p0; c0 <= p1; c0 += ATT_CHUNK) {
    int np = p1 - c0 + 1 < ATT_CHUNK ? p1 - c0 + 1 : ATT_CHUNK, nv = 0;
    for (int j = 0; j < np; j++) {
      int64_t s = sl[j];
      if (s < 0) continue;
      const char *ks = Kc + (size_t)s * krow + (size_t)kvh * hb, *vs = Vc + (size_t)s * krow + (size_t)kvh * hb;
      kh[nv] = ks;
      vh[nv] = vs;
      if (wide) {
        k->widen(b->kw + (size_t)nv * hd, ks, kv->dtype, (size_t)hd);
        k->widen(b->vw + (size_t)nv * hd, vs, kv->dtype, (size_t)hd);
        kr[nv] = b->kw + (size_t)nv * hd;
        vr[nv] = b->vw + (size_t)nv * hd;
      } else {
        kr[nv] = (const float *)ks;
        vr[nv] = (const float *)vs;
      }
      pp[nv++] = c0 + j;
    }
    /* K/V rows of one head are short pieces (hd floats) spread over the cache blocks with a
     * stride of n_kv_heads*hd: prefetch the next chunk's rows while this one is computed, also past
     * this span (a segment is one chunk) within the rows' key range */
    const int32_t c1 = c0 + ATT_CHUNK;
    if (c1 <= r->phi) {
      const int np1 = r->phi - c1 + 1 < ATT_CHUNK ? r->phi - c1 + 1 : ATT_CHUNK;
      kv_slots(c, kv, r->sq, c1, np1, sln);
      for (int j = 0; j < np1; j++) {
        if (sln[j] < 0) continue;
        const char *kp = Kc + (size_t)sln[j] * krow + (size_t)kvh * hb;
        const char *vp = Vc + (size_t)sln[j] * krow + (size_t)kvh * hb;
        for (size_t o = 0; o < hb; o += 64) {
          __builtin_prefetch(kp + o, 0, 2);
          __builtin_prefetch(vp + o, 0, 2);
        }
      }
    }
    {
      int64_t *t = sl;
      sl = sln;
      sln = t;
    }
    if (!nv) continue;
    if (direct) k->att_scores_f16(b->Q, hd, R, kh, nv, hd, S, ATT_CHUNK);
    else if (k->att_scores) k->att_scores(b->Q, hd, R, kr, nv, hd, S, ATT_CHUNK);
    else gen_scores(k, b->Q, hd, R, kr, nv, hd, S, ATT_CHUNK);
    for (int i = 0; i < R; i++) {
      float *sr = S + (size_t)i * ATT_CHUNK, cm = -INFINITY;
      if (k->att_mask_max) cm = k->att_mask_max(sr, pp, nv, r->lo[i], r->hi[i], a->scale, a->softcap);
      else
        for (int j = 0; j < nv; j++) {
          if (pp[j] < r->lo[i] || pp[j] > r->hi[i]) {
            sr[j] = -INFINITY;
            continue;
          }
          float sc = sr[j] * a->scale;
          if (a->softcap > 0.f) sc = a->softcap * tanhf(sc / a->softcap);
          sr[j] = sc;
          if (sc > cm) cm = sc;
        }
      if (cm == -INFINITY) {
        memset(sr, 0, (size_t)nv * sizeof(float));
        continue;
      }
      if (cm > m[i]) {
        float f = m[i] == -INFINITY ? 0.f : expf(m[i] - cm);
        if (f != 1.f) k->scal(acc + (size_t)i * hd, f, hd);
        l[i] *= f;
        m[i] = cm;
      }
      if (k->att_exp_sum) l[i] += k->att_exp_sum(sr, nv, m[i]);
      else
        for (int j = 0; j < nv; j++) {
          float e = sr[j] == -INFINITY ? 0.f : expf(sr[j] - m[i]);
          sr[j] = e;
          l[i] += e;
        }
    }
    if (direct) k->att_pv_f16(S, ATT_CHUNK, R, vh, nv, hd, acc);
    else if (k->att_pv) k->att_pv(S, ATT_CHUNK, R, vr, nv, hd, acc);
    else gen_pv(k, S, ATT_CHUNK, R, vr, nv, hd, acc);
  }
}

/* row i's running (tm, tl, tot) += a segment's (ms, ls, accs); a segment without positions is skipped */
static void att_merge(int hd, float *tm, float *tl, float *tot, float ms, float ls, const float *accs) {
  if (ms == -INFINITY) return;
  if (*tm == -INFINITY) {
    *tm = ms;
    *tl = ls;
    memcpy(tot, accs, (size_t)hd * sizeof(float));
    return;
  }
  const float M = ms > *tm ? ms : *tm, ft = expf(*tm - M), fs = expf(ms - M);
  for (int d = 0; d < hd; d++) tot[d] = tot[d] * ft + accs[d] * fs;
  *tl = *tl * ft + ls * fs;
  *tm = M;
}

/* the rows' outputs from their merged (tm, tl, tot) */
static void att_final(const att_ctx *a, const att_rows *r, const float *tm, const float *tl, const float *tot) {
  const int hd = a->kv->head_dim;
  for (int i = 0; i < r->R; i++) {
    const int t = r->t0 + i / r->nh, h = r->h0 + i % r->nh;
    float *o = a->out + ((size_t)t * (size_t)a->n_heads + (size_t)h) * (size_t)hd;
    float inv = tl[i] > 0.f ? 1.f / tl[i] : 0.f;
    if (a->sinks && tl[i] > 0.f) { /* the sink's e^(sink - m) joins the denominator (scaled when sink > m) */
      const float sk = a->sinks[h];
      if (sk > tm[i]) {
        const float f = expf(tm[i] - sk);
        inv = f / (tl[i] * f + 1.f);
      } else {
        inv = 1.f / (tl[i] + expf(sk - tm[i]));
      }
    }
    for (int d = 0; d < hd; d++) o[d] = tot[(size_t)i * hd + d] * inv;
  }
}

static void load_q(const att_ctx *a, const att_rows *r, float *Q) {
  const int hd = a->kv->head_dim;
  for (int i = 0; i < r->R; i++) {
    const int t = r->t0 + i / r->nh, h = r->h0 + i % r->nh;
    memcpy(Q + (size_t)i * hd, a->q + ((size_t)t * (size_t)a->n_heads + (size_t)h) * (size_t)hd,
           (size_t)hd * sizeof(float));
  }
}

/* whole items: each runs its segments in order and writes its outputs */
static void att_items(void *vctx, size_t i0, size_t i1) {
  const att_ctx *a = vctx;
  const int hd = a->kv->head_dim;
  att_buf b;
  buf_init(&b, a);
  att_rows r;
  for (size_t it = i0; it < i1; it++) {
    rows_of(a, it, &r);
    load_q(a, &r, b.Q);
    for (int i = 0; i < r.R; i++) {
      b.tm[i] = -INFINITY;
      b.tl[i] = 0.f;
    }
    for (int32_t s0 = r.plo - r.plo % ATT_SEG; r.plo <= r.phi && s0 <= r.phi; s0 += ATT_SEG) {
      att_span(a, &r, &b, s0 > r.plo ? s0 : r.plo, s0 + ATT_SEG - 1 < r.phi ? s0 + ATT_SEG - 1 : r.phi);
      for (int i = 0; i < r.R; i++)
        att_merge(hd, &b.tm[i], &b.tl[i], b.tot + (size_t)i * hd, b.m[i], b.l[i], b.acc + (size_t)i * hd);
    }
    att_final(a, &r, b.tm, b.tl, b.tot);
  }
  buf_free(&b);
}

/* (item, segment) pairs: each writes its segment's partials */
static float *part_of(const att_ctx *a, size_t item, int seg) {
  return a->part + ((size_t)item * (size_t)a->nseg + (size_t)seg) * (size_t)a->rmax * (size_t)(a->kv->head_dim + 2);
}
static void att_segs(void *vctx, size_t i0, size_t i1) {
  const att_ctx *a = vctx;
  const int hd = a->kv->head_dim;
  att_buf b;
  buf_init(&b, a);
  att_rows r;
  size_t loaded = SIZE_MAX;
  for (size_t it = i0; it < i1; it++) {
    const size_t item = it / (size_t)a->nseg;
    const int seg = (int)(it % (size_t)a->nseg);
    if (item != loaded) {
      rows_of(a, item, &r);
      load_q(a, &r, b.Q);
      loaded = item;
    }
    const int32_t s0 = seg * ATT_SEG, s1 = s0 + ATT_SEG - 1;
    const int32_t p0 = s0 > r.plo ? s0 : r.plo, p1 = s1 < r.phi ? s1 : r.phi;
    float *pt = part_of(a, item, seg);
    if (p0 > p1) { /* no position of this segment: marked empty */
      for (int i = 0; i < r.R; i++) pt[(size_t)i * (hd + 2)] = -INFINITY;
      continue;
    }
    att_span(a, &r, &b, p0, p1);
    for (int i = 0; i < r.R; i++) {
      float *pr = pt + (size_t)i * (hd + 2);
      pr[0] = b.m[i];
      pr[1] = b.l[i];
      memcpy(pr + 2, b.acc + (size_t)i * hd, (size_t)hd * sizeof(float));
    }
  }
  buf_free(&b);
}
/* then per item: its segments merged in order */
static void att_join(void *vctx, size_t i0, size_t i1) {
  const att_ctx *a = vctx;
  const int hd = a->kv->head_dim;
  float *tot = sm_xmalloc((size_t)ATT_ROWS * (size_t)hd * sizeof(float)), tm[ATT_ROWS], tl[ATT_ROWS];
  att_rows r;
  for (size_t item = i0; item < i1; item++) {
    rows_of(a, item, &r);
    for (int i = 0; i < r.R; i++) {
      tm[i] = -INFINITY;
      tl[i] = 0.f;
    }
    for (int seg = 0; seg < a->nseg; seg++) {
      const float *pt = part_of(a, item, seg);
      for (int i = 0; i < r.R; i++) {
        const float *pr = pt + (size_t)i * (hd + 2);
        att_merge(hd, &tm[i], &tl[i], tot + (size_t)i * hd, pr[0], pr[1], pr + 2);
      }
    }
    att_final(a, &r, tm, tl, tot);
  }
  free(tot);
}

static void attention(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                      float scale, int window, float softcap, const float *sinks) {
  cpu_be *c = CB(be);
  int nt = c->b.n_tokens;
  if (!kv || layer < 0 || layer >= kv->n_layers || n_heads <= 0 || kv->n_kv_heads <= 0 || kv->head_dim <= 0 ||
      n_heads % kv->n_kv_heads) {
    if (kv && kv->head_dim > 0 && n_heads > 0)
      memset(out, 0, (size_t)nt * (size_t)n_heads * (size_t)kv->head_dim * sizeof(float));
    return;
  }
  if (nt <= 0) return;
  const int grp = n_heads / kv->n_kv_heads;
  att_ctx a = {.c = c,
               .out = out,
               .q = q,
               .kv = kv,
               .layer = layer,
               .n_heads = n_heads,
               .window = window,
               .scale = scale,
               .softcap = softcap,
               .sinks = sinks};
  a.hsub = grp < ATT_ROWS ? grp : ATT_ROWS;
  a.n_hsub = (grp + a.hsub - 1) / a.hsub;
  /* tiles: runs of consecutive positions of one sequence, at most ATT_ROWS/hsub tokens */
  const int tt = ATT_ROWS / a.hsub;
  int32_t *tile0 = sm_xmalloc(((size_t)nt + 1) * sizeof(int32_t));
  int n_tiles = 0, maxt = 1;
  int32_t maxpos = 0;
  for (int t = 0; t < nt;) {
    int e = t + 1;
    while (e < nt && e - t < tt && c->b.seq[e] == c->b.seq[t] && c->b.pos[e] == c->b.pos[e - 1] + 1) e++;
    tile0[n_tiles++] = t;
    if (e - t > maxt) maxt = e - t;
    t = e;
  }
  tile0[n_tiles] = nt;
  for (int t = 0; t < nt; t++) {
    int32_t hi = c->b.pos[t];
    if (c->b.attn_span && c->b.attn_span[2 * t + 1] > hi) hi = c->b.attn_span[2 * t + 1];
    if (hi > maxpos) maxpos = hi;
  }
  a.tile0 = tile0;
  a.n_tiles = n_tiles;
  const size_t items = (size_t)n_tiles * (size_t)kv->n_kv_heads * (size_t)a.n_hsub;
  const int nseg = maxpos / ATT_SEG + 1;
  if (c->nth > 1 && items < (size_t)c->nth && nseg > 1) {
    /* fewer items than threads and more than one segment: (item, segment) pairs, then the merge */
    a.nseg = nseg;
    a.rmax = maxt * a.hsub;
    a.part = sm_xmalloc(items * (size_t)nseg * (size_t)a.rmax * (size_t)(kv->head_dim + 2) * sizeof(float));
    sm_cpu_pfor_chunk(c, items * (size_t)nseg, 1, att_segs, &a);
    sm_cpu_pfor_chunk(c, items, 1, att_join, &a);
    free(a.part);
  } else {
    /* cost estimate per item: rows * attended length * head_dim */
    size_t cost = (size_t)kv->head_dim * 4 * (size_t)a.hsub * (size_t)(nt < tt ? nt : tt);
    cost *= (size_t)(c->b.pos[nt - 1] + 1);
    sm_cpu_pfor(c, items, cost, att_items, &a);
  }
  free(tile0);
}
void sm_cpu_attention(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                      float scale, int window, float softcap) {
  attention(be, out, q, kv, layer, n_heads, scale, window, softcap, NULL);
}
void sm_cpu_attention_sinks(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                            float scale, int window, float softcap, const float *sinks) {
  attention(be, out, q, kv, layer, n_heads, scale, window, softcap, sinks);
}
