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
static void kv_put(char *dst, sm_dtype dt, const float *x, int nkv, int hd, size_t hb) {
  const size_t n = (size_t)nkv * (size_t)hd;
  if (sm_kv_quantized(dt)) {
    for (int h = 0; h < nkv; h++) sm_kv_quantize_row(dst + (size_t)h * hb, dt, x + (size_t)h * hd, hd);
    return;
  }
  if (dt == SM_DT_F32) {
    memcpy(dst, x, n * sizeof(float));
    return;
  }
  uint16_t *d = (uint16_t *)dst;
  if (dt == SM_DT_F16)
    for (size_t i = 0; i < n; i++) d[i] = sm_f32_to_f16(x[i]);
  else
    for (size_t i = 0; i < n; i++) d[i] = sm_f32_to_bf16(x[i]);
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
    kv_put(K + (size_t)s * rb, kv->dtype, k + (size_t)t * row, nkv, hd, hb);
    kv_put(Vc + (size_t)s * rb, kv->dtype, v + (size_t)t * row, nkv, hd, hb);
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
 * so each K/V row is loaded once per item instead of once per query head and token. */
#define ATT_CHUNK 64
#define ATT_ROWS 64 /* query rows per item: K/V chunks are widened and transposed once for all */
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

static void att_range(void *vctx, size_t i0, size_t i1) {
  att_ctx *a = vctx;
  const cpu_be *c = a->c;
  const sm_cpu_kern *k = c->k;
  const sm_kv_cache *kv = a->kv;
  const int hd = kv->head_dim, nkv = kv->n_kv_heads, grp = a->n_heads / nkv;
  const size_t hb = sm_kv_head_bytes(kv->dtype, hd), krow = (size_t)nkv * hb; /* bytes */
  const char *Kc = kv->k[a->layer], *Vc = kv->v[a->layer];
  /* a half-precision or quantized cache: a chunk's K/V rows are widened into kw / vw first (once for all rows) */
  const bool wide = kv->dtype != SM_DT_F32;
  float *Q = sm_xmalloc((size_t)ATT_ROWS * (size_t)hd * sizeof(float) * 2), *acc = Q + (size_t)ATT_ROWS * hd;
  float *kw = wide ? sm_xmalloc((size_t)ATT_CHUNK * 2 * (size_t)hd * sizeof(float)) : NULL;
  float *vw = wide ? kw + (size_t)ATT_CHUNK * hd : NULL;
  float S[ATT_ROWS * ATT_CHUNK], m[ATT_ROWS], l[ATT_ROWS];
  int32_t lo[ATT_ROWS], hi[ATT_ROWS];
  const float *kr[ATT_CHUNK], *vr[ATT_CHUNK];
  int32_t pp[ATT_CHUNK];
  for (size_t it = i0; it < i1; it++) {
    const int hs = (int)(it % (size_t)a->n_hsub);
    const int kvh = (int)(it / (size_t)a->n_hsub % (size_t)nkv);
    const int tile = (int)(it / ((size_t)a->n_hsub * (size_t)nkv));
    const int t0 = a->tile0[tile], ntt = a->tile0[tile + 1] - t0;
    const int h0 = kvh * grp + hs * a->hsub, nh = grp - hs * a->hsub < a->hsub ? grp - hs * a->hsub : a->hsub;
    const int R = ntt * nh, sq = c->b.seq[t0];
    int32_t plo = INT32_MAX, phi = -1;
    for (int i = 0; i < R; i++) {
      int t = t0 + i / nh, h = h0 + i % nh;
      memcpy(Q + (size_t)i * hd, a->q + ((size_t)t * (size_t)a->n_heads + (size_t)h) * (size_t)hd,
             (size_t)hd * sizeof(float));
      int32_t pos = c->b.pos[t];
      hi[i] = pos;
      lo[i] = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
      if (c->b.attn_span) { /* widened (bidirectional image tokens) */
        lo[i] = SM_MIN(lo[i], c->b.attn_span[2 * t]);
        hi[i] = SM_MAX(hi[i], c->b.attn_span[2 * t + 1]);
      }
      if (lo[i] < plo) plo = lo[i];
      if (hi[i] > phi) phi = hi[i];
      m[i] = -INFINITY;
      l[i] = 0.f;
    }
    memset(acc, 0, (size_t)R * (size_t)hd * sizeof(float));
    /* chunks start at multiples of ATT_CHUNK whatever the item's rows: every row sees the same
     * chunks (those before its window or after its position masked), so its result does not
     * depend on the tokens it shares an item with (batch invariance) */
    plo -= plo % ATT_CHUNK;
    int64_t slb[2][ATT_CHUNK], *sl = slb[0], *sln = slb[1];
    if (plo <= phi) kv_slots(c, kv, sq, plo, phi - plo + 1 < ATT_CHUNK ? phi - plo + 1 : ATT_CHUNK, sl);
    for (int32_t p0 = plo; p0 <= phi; p0 += ATT_CHUNK) {
      int np = phi - p0 + 1 < ATT_CHUNK ? phi - p0 + 1 : ATT_CHUNK, nv = 0;
      for (int j = 0; j < np; j++) {
        int64_t s = sl[j];
        if (s < 0) continue;
        const char *ks = Kc + (size_t)s * krow + (size_t)kvh * hb, *vs = Vc + (size_t)s * krow + (size_t)kvh * hb;
        if (wide) {
          k->widen(kw + (size_t)nv * hd, ks, kv->dtype, (size_t)hd);
          k->widen(vw + (size_t)nv * hd, vs, kv->dtype, (size_t)hd);
          kr[nv] = kw + (size_t)nv * hd;
          vr[nv] = vw + (size_t)nv * hd;
        } else {
          kr[nv] = (const float *)ks;
          vr[nv] = (const float *)vs;
        }
        pp[nv++] = p0 + j;
      }
      /* K/V rows of one head are short pieces (hd floats) spread over the cache blocks with a
       * stride of n_kv_heads*hd: prefetch the next chunk's rows while this one is computed */
      const int32_t p1 = p0 + ATT_CHUNK;
      if (p1 <= phi) {
        const int np1 = phi - p1 + 1 < ATT_CHUNK ? phi - p1 + 1 : ATT_CHUNK;
        kv_slots(c, kv, sq, p1, np1, sln);
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
      if (k->att_scores) k->att_scores(Q, hd, R, kr, nv, hd, S, ATT_CHUNK);
      else gen_scores(k, Q, hd, R, kr, nv, hd, S, ATT_CHUNK);
      for (int i = 0; i < R; i++) {
        float *sr = S + (size_t)i * ATT_CHUNK, cm = -INFINITY;
        for (int j = 0; j < nv; j++) {
          if (pp[j] < lo[i] || pp[j] > hi[i]) {
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
        for (int j = 0; j < nv; j++) {
          float e = sr[j] == -INFINITY ? 0.f : expf(sr[j] - m[i]);
          sr[j] = e;
          l[i] += e;
        }
      }
      if (k->att_pv) k->att_pv(S, ATT_CHUNK, R, vr, nv, hd, acc);
      else gen_pv(k, S, ATT_CHUNK, R, vr, nv, hd, acc);
    }
    for (int i = 0; i < R; i++) {
      int t = t0 + i / nh, h = h0 + i % nh;
      float *o = a->out + ((size_t)t * (size_t)a->n_heads + (size_t)h) * (size_t)hd;
      float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
      if (a->sinks && l[i] > 0.f) { /* the sink's e^(sink - m) joins the denominator (scaled when sink > m) */
        const float sk = a->sinks[h];
        if (sk > m[i]) {
          const float f = expf(m[i] - sk);
          inv = f / (l[i] * f + 1.f);
        } else {
          inv = 1.f / (l[i] + expf(sk - m[i]));
        }
      }
      for (int d = 0; d < hd; d++) o[d] = acc[(size_t)i * hd + d] * inv;
    }
  }
  free(Q);
  free(kw);
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
  int n_tiles = 0;
  for (int t = 0; t < nt;) {
    int e = t + 1;
    while (e < nt && e - t < tt && c->b.seq[e] == c->b.seq[t] && c->b.pos[e] == c->b.pos[e - 1] + 1) e++;
    tile0[n_tiles++] = t;
    t = e;
  }
  tile0[n_tiles] = nt;
  a.tile0 = tile0;
  a.n_tiles = n_tiles;
  /* cost estimate per item: rows * attended length * head_dim */
  size_t cost = (size_t)kv->head_dim * 4 * (size_t)a.hsub * (size_t)(nt < tt ? nt : tt);
  cost *= (size_t)(c->b.pos[nt - 1] + 1);
  sm_cpu_pfor(c, (size_t)n_tiles * (size_t)kv->n_kv_heads * (size_t)a.n_hsub, cost, att_range, &a);
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
