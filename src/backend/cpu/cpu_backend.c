/* CPU backend: implements the sm_backend op table on host memory with a persistent
 * thread pool and run-time selected SIMD kernels (see cpu_internal.h). */
#include "backend/cpu/cpu_be.h"
#include "backend/sample_math.h"
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------- tuning (read once per backend instance, see tuning.h) ---------------- */
static const char *const isa_names[] = {"auto", "scalar", "avx2", "avx512", NULL};
static const sm_tune_entry cpu_tune[] = {
  {"SMELT_CPU_ISA",
   offsetof(cpu_tuning, isa),
   ISA_AUTO,
   ISA_AUTO,
   ISA_AVX512,
   0,
   "CPU kernel set: auto (the best this CPU supports), scalar, avx2 or avx512",
   {{0, 0}},
   isa_names},
  {"SMELT_CPU_EXACT",
   offsetof(cpu_tuning, exact),
   0,
   0,
   1,
   SM_TUNE_USER,
   "1: float activations in one-token matmuls too (batch-invariant results; slower decode)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_NO_GFNI",
   offsetof(cpu_tuning, no_gfni),
   0,
   0,
   1,
   0,
   "1: 4-bit int8 matvec of unpacked weights without the GFNI nibble unpack (A/B measurements; same results)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_PACK",
   offsetof(cpu_tuning, pack),
   1,
   0,
   1,
   0,
   "0: no repacking of quantized weights at load (the int8 path then runs only one-token matmuls, with the "
   "unpacked-weight kernels)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_AMX",
   offsetof(cpu_tuning, amx),
   1,
   0,
   1,
   0,
   "0: batched int8 matmuls on AVX-512 VNNI even where the CPU has AMX (same results)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_AMX_MIN_N",
   offsetof(cpu_tuning, amx_min_n),
   8,
   2,
   1 << 20,
   0,
   "tokens from which a batched int8 matmul uses AMX tiles instead of VNNI (same results)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_PREFETCH",
   offsetof(cpu_tuning, pf),
   0,
   0,
   1 << 20,
   0,
   "software prefetch distance (bytes) of the packed one-token matvec; 0: none (same results)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_MV_CHUNKS",
   offsetof(cpu_tuning, mv_chunks),
   4,
   0,
   64,
   0,
   "work chunks per thread in a one-token matmul and a batch of expert matvecs, taken dynamically; 0: one static "
   "share per thread (a batch: one chunk each) (same results)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_MVN_MAX",
   offsetof(cpu_tuning, mvn_max),
   12,
   0,
   64,
   0,
   "most tokens of a packed int8 matmul that stream its row blocks once every 4 tokens (the one-token kernel's "
   "arithmetic) instead of the GEMM on unpacked blocks (AMX from SMELT_CPU_AMX_MIN_N tokens still); 0: the "
   "GEMM from 2 tokens (same results)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_STATS",
   offsetof(cpu_tuning, stats),
   0,
   0,
   1,
   0,
   "1: time the thread pool's runs (ops and their parts) and print at exit how the wall time splits into "
   "the threads' work, their waiting for the slowest and the time between runs",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_HUGEPAGES",
   offsetof(cpu_tuning, huge),
   0,
   0,
   1,
   0,
   "1: packed weights (and the bandwidth probe's buffer) on transparent huge pages (same results; loading may "
   "take longer where the kernel compacts memory for them)",
   {{0, 0}},
   NULL},
  {"SMELT_CPU_BATCH_INVARIANT",
   offsetof(cpu_tuning, invariant),
   0,
   0,
   1,
   SM_TUNE_USER,
   "1: float-path matmuls (dense or unpacked weights, SMELT_CPU_EXACT) run the GEMM at every batch size (one "
   "multiply-add chain per output), so that every token's result is independent of its batch (slower decode)",
   {{0, 0}},
   NULL},
};

/* ---------------- memory ---------------- */
static void *be_alloc(sm_backend *be, size_t bytes) {
  (void)be;
  return sm_aligned_alloc(bytes);
}
static void be_free(sm_backend *be, void *p) {
  (void)be;
  free(p);
}
static void be_upload(sm_backend *be, void *dst, const void *src, size_t n) {
  (void)be;
  if (n && dst != src) memcpy(dst, src, n);
}
static void be_download(sm_backend *be, void *dst, const void *src, size_t n) {
  (void)be;
  if (n && dst != src) memcpy(dst, src, n);
}
static void be_sync(sm_backend *be) { (void)be; }

bool sm_cpu_weight_ok(const sm_weight *w) {
  if (!w || !w->data || w->rows < 0 || w->cols <= 0) return false;
  if (w->bits == 0) return w->dtype == SM_DT_F32 || w->dtype == SM_DT_F16 || w->dtype == SM_DT_BF16;
  if (w->qmode != SM_QMODE_AFFINE) /* microscaling (cpu_mxq.c) */
    return w->qmode > 0 && w->qmode < SM_QMODE_COUNT && w->bits == sm_qmode_bits((sm_qmode)w->qmode) &&
           w->group_size == sm_qmode_group((sm_qmode)w->qmode) && w->cols % w->group_size == 0 && w->scales &&
           w->dtype == SM_DT_U8;
  if (!(w->bits == 2 || w->bits == 3 || w->bits == 4 || w->bits == 5 || w->bits == 6 || w->bits == 8)) return false;
  if (!(w->group_size == 32 || w->group_size == 64 || w->group_size == 128)) return false;
  if (w->cols % w->group_size) return false;
  if (!w->scales) return false;
  return w->dtype == SM_DT_F32 || w->dtype == SM_DT_F16 || w->dtype == SM_DT_BF16;
}

/* Quantized weights wide enough for the int8 path are repacked for its kernels (cpu_internal.h,
 * "packed weights"); w->dev is then the packed copy. The original stays in place for embedding
 * lookups and views. Expert stacks are packed whole: matmul_experts runs an expert's row blocks of
 * the packed copy (cpu_moe.c). */
static smelt_status be_prepare_weight(sm_backend *be, sm_weight *w) {
  cpu_be *c = CB(be);
  if (!w) return sm_err(SMELT_ERR_INVALID, "cpu: NULL weight");
  if (!sm_cpu_weight_ok(w))
    return sm_err(SMELT_ERR_UNSUPPORTED, "cpu: unsupported weight (rows %lld cols %lld bits %d group %d dtype %d)",
                  (long long)w->rows, (long long)w->cols, w->bits, w->group_size, (int)w->dtype);
  if (c->pack && !w->dev && w->bits && w->cols >= I8_MIN_COLS && sm_cpu_packable(w)) {
    sm_cpu_packed *p = sm_cpu_pack(w, c->pool, c->tune.huge);
    if (!p)
      return sm_err(SMELT_ERR_OOM, "cpu: no memory for the packed copy of a %lldx%lld weight", (long long)w->rows,
                    (long long)w->cols);
    w->dev = p;
  }
  return SMELT_OK;
}
static void be_release_weight(sm_backend *be, sm_weight *w) {
  (void)be;
  if (!w || !w->dev) return;
  sm_cpu_packed_free(w->dev);
  w->dev = NULL;
}

/* ---------------- batch ---------------- */
static void *grow(void *p, size_t *cap, size_t need, size_t es) {
  if (need <= *cap) return p;
  size_t c = need < 16 ? 16 : need;
  p = sm_xrealloc(p, c * es);
  *cap = c;
  return p;
}

static smelt_status be_set_batch(sm_backend *be, const sm_batch *b) {
  cpu_be *c = CB(be);
  if (!b || b->n_tokens < 0 || b->n_seqs < 0 || b->max_blocks < 0 || b->n_out < 0)
    return sm_err(SMELT_ERR_INVALID, "cpu: bad batch");
  if (b->feed_token) return sm_err(SMELT_ERR_UNSUPPORTED, "cpu: no device-fed tokens (no sample_async)");
  int n = b->n_tokens;
  if (n > 0 && (!b->tokens || !b->pos || !b->seq)) return sm_err(SMELT_ERR_INVALID, "cpu: batch arrays missing");
  for (int t = 0; t < n; t++) {
    if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs)
      return sm_err(SMELT_ERR_INVALID, "cpu: token %d has bad seq %d", t, b->seq[t]);
    if (b->pos[t] < 0) return sm_err(SMELT_ERR_INVALID, "cpu: token %d has negative position", t);
  }
  size_t nt = (size_t)b->n_seqs * (size_t)b->max_blocks;
  if (nt && !b->block_table) return sm_err(SMELT_ERR_INVALID, "cpu: block table missing");
  if (b->n_out > 0 && !b->out_rows) return sm_err(SMELT_ERR_INVALID, "cpu: out_rows missing");
  for (int i = 0; i < b->n_out; i++)
    if (b->out_rows[i] < 0 || b->out_rows[i] >= n)
      return sm_err(SMELT_ERR_INVALID, "cpu: out_rows[%d] out of range", i);
  size_t ct = c->cap_tok;
  c->tokens = grow(c->tokens, &ct, (size_t)n, 4);
  ct = c->cap_tok;
  c->pos = grow(c->pos, &ct, (size_t)n, 4);
  ct = c->cap_tok;
  c->seq = grow(c->seq, &ct, (size_t)n, 4);
  c->cap_tok = ct;
  c->table = grow(c->table, &c->cap_table, nt, 4);
  c->out_rows = grow(c->out_rows, &c->cap_out, (size_t)b->n_out, 4);
  if (n) {
    memcpy(c->tokens, b->tokens, (size_t)n * 4);
    memcpy(c->pos, b->pos, (size_t)n * 4);
    memcpy(c->seq, b->seq, (size_t)n * 4);
  }
  if (b->feed_rows) /* tokens sampled by the last sample_batch_async */
    for (int t = 0; t < n; t++) {
      const int r = b->feed_rows[t];
      if (r < 0) continue;
      smelt_status st = sm_batch_slots_feed(&c->bs, t, r);
      if (st) return st;
      c->tokens[t] = c->bs_tok[c->bs.last][r];
    }
  if (nt) memcpy(c->table, b->block_table, nt * 4);
  if (b->n_out) memcpy(c->out_rows, b->out_rows, (size_t)b->n_out * 4);
  if (b->state_slot) {
    if (!sm_cpu_batch_rec_ok(b))
      return sm_err(SMELT_ERR_INVALID, "cpu: recurrent state needs each sequence's tokens in one run of consecutive "
                                       "positions");
    c->slots = grow(c->slots, &c->cap_slots, (size_t)b->n_seqs, 4);
    if (b->n_seqs) memcpy(c->slots, b->state_slot, (size_t)b->n_seqs * 4);
  }
  if (b->attn_span && n) {
    c->span = grow(c->span, &c->cap_span, 2 * (size_t)n, 4);
    memcpy(c->span, b->attn_span, 2 * (size_t)n * 4);
  }
  c->b = *b;
  c->b.attn_span = b->attn_span && n ? c->span : NULL;
  c->b.tokens = c->tokens;
  c->b.pos = c->pos;
  c->b.seq = c->seq;
  c->b.block_table = c->table;
  c->b.out_rows = c->out_rows;
  c->b.state_slot = b->state_slot ? c->slots : NULL;
  return SMELT_OK;
}

/* ---------------- generic parallel-for ---------------- */
typedef struct {
  range_fn fn;
  void *ctx;
  size_t n, chunk;
  _Atomic size_t next __attribute__((aligned(64))); /* its own cache line */
} pfor_ctx;
static void pfor_job(void *vctx, int tid, int nth) {
  (void)tid;
  (void)nth;
  pfor_ctx *p = vctx;
  for (;;) {
    size_t i0 = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
    if (i0 >= p->n) break;
    size_t i1 = i0 + p->chunk < p->n ? i0 + p->chunk : p->n;
    p->fn(p->ctx, i0, i1);
  }
}
/* run fn over [0,n) in chunks; single-threaded when work (n*cost) is small */
void sm_cpu_pfor(cpu_be *c, size_t n, size_t cost_per_item, range_fn fn, void *ctx) {
  if (n == 0) return;
  if (c->nth == 1 || n == 1 || n * cost_per_item < PAR_MIN_ELEMS) {
    fn(ctx, 0, n);
    return;
  }
  size_t chunk = n / ((size_t)c->nth * 8);
  sm_cpu_pfor_chunk(c, n, chunk ? chunk : 1, fn, ctx);
}
void sm_cpu_pfor_chunk(cpu_be *c, size_t n, size_t chunk, range_fn fn, void *ctx) {
  pfor_ctx p = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk ? chunk : 1};
  atomic_init(&p.next, 0);
  sm_pool_run(c->pool, pfor_job, &p);
}


/* ---------------- embed ---------------- */
typedef struct {
  cpu_be *c;
  const sm_weight *w;
  float *out;
} emb_ctx;
static void emb_range(void *vctx, size_t t0, size_t t1) {
  emb_ctx *e = vctx;
  const int64_t D = e->w->cols;
  for (size_t t = t0; t < t1; t++) {
    int32_t tok = e->c->b.tokens[t];
    float *o = e->out + t * (size_t)D;
    if (tok < 0 || tok >= e->w->rows) memset(o, 0, (size_t)D * sizeof(float));
    else if (e->w->bits == 0 && e->w->dtype == SM_DT_F32)
      memcpy(o, (const float *)e->w->data + (size_t)tok * (size_t)D, (size_t)D * 4);
    else sm_weight_row_f32(e->w, tok, o);
  }
}
static void be_embed(sm_backend *be, const sm_weight *emb, float *out) {
  cpu_be *c = CB(be);
  if (!sm_cpu_weight_ok(emb)) {
    if (emb && emb->cols > 0) memset(out, 0, (size_t)c->b.n_tokens * (size_t)emb->cols * sizeof(float));
    return;
  }
  emb_ctx e = {c, emb, out};
  sm_cpu_pfor(c, (size_t)c->b.n_tokens, (size_t)emb->cols * 4, emb_range, &e);
}

/* ---------------- rmsnorm ---------------- */
typedef struct {
  const sm_cpu_kern *k;
  float *out;
  const float *x, *w;
  int dim;
  float eps, off;
} rms_ctx;
/* Elementwise loops of the one-token ops that run on the caller alone: blocks of 8 values loaded into a
 * temporary before any is stored (so y may be x), which GCC's -O2 vectorizes (its cheap cost model
 * leaves a plain loop of unknown length scalar, and reached through the op's context it reloaded every
 * pointer a value); each value is computed as the plain loop computes it, so the same bits. */
#define EW8(n, expr, y) \
  do { \
    size_t j_ = 0; \
    for (; j_ + 8 <= (size_t)(n); j_ += 8) { \
      float t_[8]; \
      for (int k_ = 0; k_ < 8; k_++) { \
        const size_t j = j_ + (size_t)k_; \
        t_[k_] = (expr); \
      } \
      for (int k_ = 0; k_ < 8; k_++) (y)[j_ + (size_t)k_] = t_[k_]; \
    } \
    for (size_t j = j_; j < (size_t)(n); j++) (y)[j] = (expr); \
  } while (0)

static void rms_range(void *vctx, size_t i0, size_t i1) {
  const rms_ctx *r = vctx;
  const int dim = r->dim;
  const float *w = r->w, off = r->off;
  for (size_t i = i0; i < i1; i++) {
    const float *x = r->x + i * (size_t)dim;
    float *o = r->out + i * (size_t)dim; /* may be x */
    const float ss = r->k->dot(x, x, dim);
    const float inv = 1.0f / sqrtf(ss / (float)dim + r->eps);
    if (off == 0.f) EW8(dim, x[j] * inv * w[j], o);
    else EW8(dim, x[j] * inv * (w[j] + off), o);
  }
}
static void be_rmsnorm(sm_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps,
                       float off) {
  cpu_be *c = CB(be);
  if (n <= 0 || dim <= 0) return;
  rms_ctx r = {c->k, out, x, w, dim, eps, off};
  sm_cpu_pfor(c, (size_t)n, (size_t)dim, rms_range, &r);
}

/* ---------------- rope ---------------- */
typedef struct {
  cpu_be *c;
  float *x;
  int nh, hd, rot;
  const float *inv;
} rope_ctx;
static void rope_range(void *vctx, size_t t0, size_t t1) {
  rope_ctx *r = vctx;
  int half = r->rot / 2;
  float cs[512], sn[512];
  for (size_t t = t0; t < t1; t++) {
    float p = (float)r->c->b.pos[t];
    for (int i0 = 0; i0 < half; i0 += 512) {
      int i1 = half - i0 < 512 ? half : i0 + 512;
      for (int i = i0; i < i1; i++) {
        float a = p * r->inv[i];
        cs[i - i0] = cosf(a);
        sn[i - i0] = sinf(a);
      }
      for (int h = 0; h < r->nh; h++) {
        float *v = r->x + (t * (size_t)r->nh + (size_t)h) * (size_t)r->hd;
        for (int i = i0; i < i1; i++) {
          float a = v[i], b = v[i + half];
          v[i] = a * cs[i - i0] - b * sn[i - i0];
          v[i + half] = a * sn[i - i0] + b * cs[i - i0];
        }
      }
    }
  }
}
static void be_rope(sm_backend *be, float *x, int n_heads, int head_dim, int rot_dim, const float *inv_freq) {
  cpu_be *c = CB(be);
  if (rot_dim > head_dim) rot_dim = head_dim;
  if (rot_dim < 2 || n_heads <= 0) return;
  rope_ctx r = {c, x, n_heads, head_dim, rot_dim & ~1, inv_freq};
  sm_cpu_pfor(c, (size_t)c->b.n_tokens, (size_t)n_heads * (size_t)rot_dim * 4, rope_range, &r);
}

/* ---------------- rope_ext (position-dependent frequencies, scaled rotated dims) ---------------- */
typedef struct {
  cpu_be *c;
  float *x;
  int nh, hd;
  const sm_rope_ext *r;
} ropex_ctx;
static void ropex_range(void *vctx, size_t t0, size_t t1) {
  ropex_ctx *r = vctx;
  const sm_rope_ext *e = r->r;
  const int half = e->rot_dim / 2;
  for (size_t t = t0; t < t1; t++) {
    const int32_t p = r->c->b.pos[t];
    const int row = p < e->pos0 ? 0 : (int)SM_MIN((int64_t)p - e->pos0 + 1, (int64_t)e->n_rows - 1);
    const float *inv = e->inv_freq + (size_t)row * (size_t)half;
    const float fp = (float)p;
    const float all = e->beta > 0.f ? (float)(1.0 + e->beta * log(1.0 + floor((double)p / e->beta_pos))) : 1.f;
    for (int h = 0; h < r->nh; h++) {
      float *v = r->x + (t * (size_t)r->nh + (size_t)h) * (size_t)r->hd;
      for (int i = 0; i < half; i++) {
        float a = fp * inv[i], cs = cosf(a), sn = sinf(a);
        float x0 = v[i], x1 = v[i + half];
        v[i] = (x0 * cs - x1 * sn) * e->mscale;
        v[i + half] = (x0 * sn + x1 * cs) * e->mscale;
      }
      if (all != 1.f)
        for (int d = 0; d < r->hd; d++) v[d] *= all;
    }
  }
}
static void be_rope_ext(sm_backend *be, float *x, int n_heads, int head_dim, const sm_rope_ext *e) {
  cpu_be *c = CB(be);
  if (!e || e->rot_dim < 2 || e->rot_dim > head_dim || e->rot_dim % 2 || e->n_rows < 1 || n_heads <= 0) return;
  if (e->beta > 0.f && e->beta_pos <= 0) return;
  ropex_ctx r = {c, x, n_heads, head_dim, e};
  sm_cpu_pfor(c, (size_t)c->b.n_tokens, (size_t)n_heads * (size_t)head_dim * 4, ropex_range, &r);
}

/* ---------------- layernorm ---------------- */
typedef struct {
  float *out;
  const float *x, *w, *b;
  int dim;
  float eps;
} ln_ctx;
static void ln_range(void *vctx, size_t i0, size_t i1) {
  ln_ctx *l = vctx;
  for (size_t i = i0; i < i1; i++) {
    const float *x = l->x + i * (size_t)l->dim;
    float *o = l->out + i * (size_t)l->dim;
    double s = 0, ss = 0;
    for (int j = 0; j < l->dim; j++) s += x[j];
    const double mean = s / l->dim;
    for (int j = 0; j < l->dim; j++) ss += (x[j] - mean) * (x[j] - mean);
    const float mf = (float)mean, inv = (float)(1.0 / sqrt(ss / l->dim + l->eps));
    for (int j = 0; j < l->dim; j++) o[j] = (x[j] - mf) * inv * l->w[j] + (l->b ? l->b[j] : 0.f);
  }
}
static void be_layernorm(sm_backend *be, float *out, const float *x, const float *w, const float *b, int n, int dim,
                         float eps) {
  cpu_be *c = CB(be);
  if (n <= 0 || dim <= 0) return;
  ln_ctx l = {out, x, w, b, dim, eps};
  sm_cpu_pfor(c, (size_t)n, (size_t)dim * 2, ln_range, &l);
}

/* ---------------- elementwise ---------------- */
typedef struct {
  const sm_cpu_kern *k;
  float *out;
  const float *a, *b;
  float s;
} ew_ctx;
static void silu_range(void *v, size_t i0, size_t i1) {
  ew_ctx *e = v;
  e->k->silu_mul(e->out + i0, e->a + i0, e->b + i0, i1 - i0);
}
static void gelu_range(void *v, size_t i0, size_t i1) {
  ew_ctx *e = v;
  e->k->gelu_mul(e->out + i0, e->a + i0, e->b + i0, i1 - i0);
}
static void add_range(void *v, size_t i0, size_t i1) {
  const ew_ctx *e = v;
  float *y = e->out + i0;
  const float *a = e->a + i0;
  EW8(i1 - i0, y[j] + a[j], y);
}
static void scale_range(void *v, size_t i0, size_t i1) {
  const ew_ctx *e = v;
  float *y = e->out + i0;
  const float s = e->s;
  EW8(i1 - i0, y[j] * s, y);
}
static void softcap_range(void *v, size_t i0, size_t i1) {
  ew_ctx *e = v;
  e->k->softcap(e->out + i0, e->s, i1 - i0);
}
static void be_silu_mul(sm_backend *be, float *out, const float *g, const float *u, size_t n) {
  ew_ctx e = {CB(be)->k, out, g, u, 0};
  sm_cpu_pfor(CB(be), n, 2, silu_range, &e);
}
static void be_gelu_mul(sm_backend *be, float *out, const float *g, const float *u, size_t n) {
  ew_ctx e = {CB(be)->k, out, g, u, 0};
  sm_cpu_pfor(CB(be), n, 2, gelu_range, &e);
}
static void be_add(sm_backend *be, float *y, const float *x, size_t n) {
  ew_ctx e = {NULL, y, x, NULL, 0};
  sm_cpu_pfor(CB(be), n, 1, add_range, &e);
}
typedef struct {
  float *y;
  const float *b;
  int dim;
} addrows_ctx;
static void addrows_range(void *v, size_t r0, size_t r1) {
  const addrows_ctx *a = v;
  const int dim = a->dim;
  const float *b = a->b;
  for (size_t r = r0; r < r1; r++) {
    float *y = a->y + r * (size_t)dim;
    EW8(dim, y[j] + b[j], y);
  }
}
static void be_add_rows(sm_backend *be, float *y, const float *b, int n, int dim) {
  if (n <= 0 || dim <= 0) return;
  addrows_ctx a = {y, b, dim};
  sm_cpu_pfor(CB(be), (size_t)n, (size_t)dim, addrows_range, &a);
}
static void be_scale(sm_backend *be, float *y, float s, size_t n) {
  ew_ctx e = {NULL, y, NULL, NULL, s};
  sm_cpu_pfor(CB(be), n, 1, scale_range, &e);
}
static void be_softcap(sm_backend *be, float *y, float cap, size_t n) {
  if (!(cap > 0.f)) return;
  ew_ctx e = {CB(be)->k, y, NULL, NULL, cap};
  sm_cpu_pfor(CB(be), n, 2, softcap_range, &e);
}
static void be_gather_out(sm_backend *be, float *dst, const float *src, int dim) {
  cpu_be *c = CB(be);
  for (int i = 0; i < c->b.n_out; i++)
    memmove(dst + (size_t)i * (size_t)dim, src + (size_t)c->b.out_rows[i] * (size_t)dim, (size_t)dim * sizeof(float));
}

/* ---------------- recurrent models (kernels in ssm.c) ---------------- */
static void be_copy(sm_backend *be, void *dst, const void *src, size_t n) {
  (void)be;
  if (n && dst != src) memmove(dst, src, n);
}
typedef struct {
  float *y;
  const float *a, *b;
  int op;
} ew3_ctx; /* op 0: y = a*b, 1: y *= sigmoid(a), 2: relu2 */
static void ew3_range(void *v, size_t i0, size_t i1) {
  const ew3_ctx *e = v;
  float *y = e->y; /* may alias a or b (be_mul) */
  const float *a = e->a, *b = e->b;
  if (e->op == 0) {
    float *yy = y + i0;
    const float *aa = a + i0, *bb = b + i0;
    EW8(i1 - i0, aa[j] * bb[j], yy);
  } else if (e->op == 1)
    for (size_t i = i0; i < i1; i++) y[i] *= 1.f / (1.f + expf(-a[i]));
  else
    for (size_t i = i0; i < i1; i++) {
      const float r = y[i] > 0.f ? y[i] : 0.f;
      y[i] = r * r;
    }
}
static void be_mul(sm_backend *be, float *y, const float *a, const float *b, size_t n) {
  ew3_ctx e = {y, a, b, 0};
  sm_cpu_pfor(CB(be), n, 1, ew3_range, &e);
}
static void be_sigmoid_mul(sm_backend *be, float *y, const float *g, size_t n) {
  ew3_ctx e = {y, g, NULL, 1};
  sm_cpu_pfor(CB(be), n, 4, ew3_range, &e);
}
static void be_relu2(sm_backend *be, float *y, size_t n) {
  ew3_ctx e = {y, NULL, NULL, 2};
  sm_cpu_pfor(CB(be), n, 1, ew3_range, &e);
}
static void be_conv1d(sm_backend *be, float *out, const float *x, const float *w, const float *bias, int C, int K,
                      bool act, const sm_kv_cache *kv, int layer) {
  cpu_be *c = CB(be);
  sm_cpu_conv1d(c->pool, &c->b, out, x, w, bias, C, K, act, kv, layer);
}
static void be_ssm_scan(sm_backend *be, float *y, const float *x, const float *B, const float *Cm, int ld,
                        const float *dt_in, const float *dt_bias, const float *A_log, const float *D, int nh, int P,
                        int G, int N, float dt_min, float dt_max, const sm_kv_cache *kv, int layer) {
  cpu_be *c = CB(be);
  sm_cpu_ssm_scan(c->pool, &c->b, y, x, B, Cm, ld, dt_in, dt_bias, A_log, D, nh, P, G, N, dt_min, dt_max, kv, layer);
}
static void be_gated_delta(sm_backend *be, float *y, const float *q, const float *k, const float *v, int ld,
                           const float *a, const float *b, const float *A_log, const float *dt_bias, int Hk, int Hv,
                           int Dk, int Dv, const sm_kv_cache *kv, int layer) {
  cpu_be *c = CB(be);
  sm_cpu_gated_delta(c->pool, &c->b, y, q, k, v, ld, a, b, A_log, dt_bias, Hk, Hv, Dk, Dv, kv, layer);
}
static void be_gated_rmsnorm(sm_backend *be, float *out, const float *x, const float *z, const float *w, int n, int dim,
                             int group, int wdim, float eps, bool norm_first) {
  sm_cpu_gated_rmsnorm(CB(be)->pool, out, x, z, w, n, dim, group, wdim, eps, norm_first);
}

/* ---------------- sampling ---------------- */
/* The reference sampler (sample.c) on a copy of each row: logits stay unchanged. */
/* A greedy row without biases, mask or penalties: sm_sample_row's rule (the first index of the
 * largest key) with each thread taking a contiguous share of the row and the shares' bests combined
 * in order, so the token is the same as one thread's. */
typedef struct {
  const float *l;
  int V;
  float *bv;
  int32_t *bi;
} greedy_ctx;
static void greedy_job(void *v, int tid, int nth) {
  greedy_ctx *g = v;
  const int lo = (int)((int64_t)g->V * tid / nth), hi = (int)((int64_t)g->V * (tid + 1) / nth);
  float best = -INFINITY;
  int32_t bi = -1;
  for (int i = lo; i < hi; i++) {
    const float k = sm_sample_key(g->l[i]);
    if (bi < 0 || k > best) {
      best = k;
      bi = i;
    }
  }
  g->bv[tid] = best;
  g->bi[tid] = bi;
}
#define GREEDY_PAR_MIN 8192 /* vocabulary from which a greedy row is split over the threads */

/* several requests: one row a thread at a time, each thread with its own scratch (the rows are
 * independent, so the tokens are those of one thread) */
typedef struct {
  const cpu_be *c;
  const float *logits;
  int V, n_req;
  const sm_sample_req *req;
  int32_t *out;
  atomic_int next;
} rows_ctx;
static void rows_job(void *v, int tid, int nth) {
  (void)nth;
  rows_ctx *g = v;
  const size_t V = (size_t)g->V;
  float *row = g->c->srow + (size_t)tid * 2 * g->c->cap_s;
  int32_t *idx = g->c->sidx + (size_t)tid * g->c->cap_s;
  for (int i; (i = atomic_fetch_add(&g->next, 1)) < g->n_req;) {
    memcpy(row, g->logits + (size_t)g->req[i].row * V, sizeof(float) * V);
    g->out[i] = sm_sample_row(&g->req[i], row, g->V, row + V, idx);
  }
}

/* scratch for n threads' rows of vocab */
static smelt_status sample_scratch(cpu_be *c, int vocab, int n) {
  if ((size_t)vocab <= c->cap_s && n <= c->n_s) return SMELT_OK;
  const size_t cap = SM_MAX((size_t)vocab, c->cap_s);
  const int ns = SM_MAX(n, c->n_s);
  float *row = malloc(sizeof(float) * 2 * cap * (size_t)ns);
  int32_t *idx = malloc(sizeof(int32_t) * cap * (size_t)ns);
  if (!row || !idx) {
    free(row);
    free(idx);
    return sm_err(SMELT_ERR_OOM, "sample: scratch of %d rows of %d floats", ns, vocab);
  }
  free(c->srow);
  free(c->sidx);
  c->srow = row;
  c->sidx = idx;
  c->cap_s = cap;
  c->n_s = ns;
  return SMELT_OK;
}

static smelt_status be_sample(sm_backend *be, const float *logits, int n_rows, int vocab, const sm_sample_req *req,
                              int n_req, int32_t *out) {
  cpu_be *c = CB(be);
  smelt_status st = sm_sample_check(req, n_req, n_rows, vocab);
  if (st) return st;
  if (n_req == 0) return SMELT_OK;
  if (!logits || !out) return sm_err(SMELT_ERR_INVALID, "sample: missing buffers");
  /* kept between calls: a large vocabulary's rows are megabytes */
  const bool par = n_req > 1 && c->nth > 1;
  if ((st = sample_scratch(c, vocab, par ? c->nth : 1))) return st;
  if (par) {
    rows_ctx g = {c, logits, vocab, n_req, req, out, 0};
    sm_pool_run(c->pool, rows_job, &g);
    return SMELT_OK;
  }
  if (!c->sbv) {
    c->sbv = sm_xmalloc(sizeof(float) * (size_t)c->nth);
    c->sbi = sm_xmalloc(sizeof(int32_t) * (size_t)c->nth);
  }
  for (int i = 0; i < n_req; i++) { /* one request, or one thread */
    const sm_sample_req *r = &req[i];
    const float *l = logits + (size_t)r->row * (size_t)vocab;
    int n_plan;
    if (c->nth > 1 && vocab >= GREEDY_PAR_MIN && !r->n_bias && !r->mask && !r->n_pen &&
        sm_sample_plan(r->temperature, r->top_k, r->top_p, vocab, &n_plan) == SM_SAMPLE_GREEDY) {
      greedy_ctx g = {l, vocab, c->sbv, c->sbi};
      sm_pool_run(c->pool, greedy_job, &g);
      float best = -INFINITY;
      int32_t bi = -1;
      for (int k = 0; k < c->nth; k++)
        if (c->sbi[k] >= 0 && (bi < 0 || c->sbv[k] > best)) {
          best = c->sbv[k];
          bi = c->sbi[k];
        }
      out[i] = bi < 0 ? 0 : bi;
      continue;
    }
    memcpy(c->srow, l, sizeof(float) * (size_t)vocab);
    out[i] = sm_sample_row_pool(r, c->srow, vocab, c->srow + c->cap_s, c->sidx, c->nth > 1 ? c->pool : NULL);
  }
  return SMELT_OK;
}

/* Pipelined batch steps on the CPU: the sampling runs to its end here (the backend is synchronous, so
 * nothing overlaps; the engine pipelines only when asked to, for tests), and the tokens wait in a slot
 * for set_batch's feed_rows and sample_batch_wait. */
static smelt_status be_sample_batch_async(sm_backend *be, const float *logits, int n_rows, int vocab,
                                          const sm_sample_req *req, int n_req, int *slot) {
  cpu_be *c = CB(be);
  int k;
  smelt_status st = sm_batch_slots_take(&c->bs, n_req, &k);
  if (st) return st;
  if (n_req > c->bs_cap[k]) {
    c->bs_cap[k] = SM_MAX(n_req, 2 * c->bs_cap[k]);
    c->bs_tok[k] = sm_xrealloc(c->bs_tok[k], sizeof(int32_t) * (size_t)c->bs_cap[k]);
  }
  if (n_req && (st = be_sample(be, logits, n_rows, vocab, req, n_req, c->bs_tok[k]))) return st;
  sm_batch_slots_fill(&c->bs, k, n_req);
  *slot = k;
  return SMELT_OK;
}
static smelt_status be_sample_batch_wait(sm_backend *be, int slot, int32_t *tokens) {
  cpu_be *c = CB(be);
  smelt_status st = sm_batch_slots_wait(&c->bs, slot);
  if (!st && c->bs.n[slot]) memcpy(tokens, c->bs_tok[slot], sizeof(int32_t) * (size_t)c->bs.n[slot]);
  return st;
}

/* ---------------- roofline ---------------- */
static double be_measure_bandwidth(sm_backend *be) {
  cpu_be *c = CB(be);
  if (c->bandwidth <= 0) c->bandwidth = sm_cpu_read_bandwidth(c->pool, c->k, c->tune.huge);
  return c->bandwidth;
}

/* ---------------- lifetime ---------------- */
static void be_destroy(sm_backend *be) {
  cpu_be *c = CB(be);
  if (!c) return;
  if (c->tune.stats && c->pool) {
    sm_pool_stats s;
    sm_pool_stats_get(c->pool, &s);
    const double wall = (double)s.wall_ns, gap = (double)s.gap_ns, all = wall + gap > 0 ? wall + gap : 1;
    fprintf(stderr,
            "cpu stats: %llu pool runs, %.1f us a run; of the %.1f ms in and between runs: runs %.1f%% (threads "
            "busy %.1f%% of the runs' thread time, the busiest thread of each run %.1f%% of their wall), between "
            "runs %.1f%%\n",
            (unsigned long long)s.runs, s.runs ? wall / (double)s.runs / 1e3 : 0.0, all / 1e6, 100.0 * wall / all,
            wall > 0 ? 100.0 * (double)s.busy_ns / (wall * s.threads) : 0.0,
            wall > 0 ? 100.0 * (double)s.busy_max_ns / wall : 0.0, 100.0 * gap / all);
  }
  sm_pool_destroy(c->pool);
  free(c->comm_fds);
  free(c->comm_buf);
  free(c->srow);
  free(c->sidx);
  free(c->sbv);
  free(c->sbi);
  free(c->bs_tok[0]);
  free(c->bs_tok[1]);
  for (int i = 0; i < c->nth; i++) free(c->gscratch[i]);
  free(c->gscratch);
  free(c->tokens);
  free(c->pos);
  free(c->seq);
  free(c->table);
  free(c->out_rows);
  free(c->slots);
  free(c->span);
  free(c->xp);
  free(c->xsum);
  free(c->xs);
  free(c->xq);
  sm_cpu_matmul_free(c);
  free(c);
}

sm_backend *sm_cpu_backend_create(int n_threads) {
  sm_cpu_opts o = {.n_threads = n_threads, .poll = 50};
  return sm_cpu_backend_create_opts(&o);
}

sm_backend *sm_cpu_backend_create_opts(const sm_cpu_opts *o) {
  if (o->poll < 0 || o->poll > 100) {
    sm_err(SMELT_ERR_INVALID, "CPU poll level %d: expected 0..100", o->poll);
    return NULL;
  }
  cpu_tuning tune;
  if (sm_tune_read(cpu_tune, SM_ARRAY_LEN(cpu_tune), 0, &tune)) return NULL;
  if (o->batch_invariant) tune.invariant = 1; /* smelt_model_params.deterministic: what the variable sets */
  const sm_cpu_kern *k = tune.isa == ISA_AUTO ? sm_cpu_best_kernels() : sm_cpu_kernels_by_name(isa_names[tune.isa]);
  if (!k) {
    sm_err(SMELT_ERR_UNSUPPORTED, "SMELT_CPU_ISA=%s: this CPU does not support it (best: %s)", isa_names[tune.isa],
           sm_cpu_best_kernels()->name);
    return NULL;
  }
  int n_threads = o->n_threads;
  cpu_set_t *sets = NULL;
  if (sm_cpu_place_plan(o, &n_threads, &sets)) return NULL;
  /* packed int8 kernels: AVX-512 VNNI (+ AMX), AVX-VNNI or AVX2; AMX is asked for before the
   * pool's threads start */
  const sm_i8_kern *ik = tune.pack && !tune.exact ? sm_i8_kernels_for(k) : NULL;
  const bool pack = ik != NULL;
  const bool amx = pack && !strcmp(ik->name, "avx512vnni") && tune.amx && sm_amx_ok();
  cpu_be *c = sm_xcalloc(1, sizeof *c);
  c->tune = tune;
  c->k = k;
  c->exact = tune.exact;
  c->gfni = sm_cpu_has_gfni() && !tune.no_gfni;
  c->pack = pack;
  c->ik = ik;
  c->amx = amx;
  c->numa = o->numa != SMELT_NUMA_NONE;
  c->pool = sm_pool_create(n_threads, sets, o->poll);
  free(sets);
  if (!c->pool) {
    free(c);
    sm_err(SMELT_ERR_OOM, "cpu: thread pool");
    return NULL;
  }
  if (tune.stats) sm_pool_stats_on(c->pool);
  c->nth = sm_pool_size(c->pool);
  sm_batch_slots_init(&c->bs);
  c->gscratch = sm_xcalloc((size_t)c->nth, sizeof(float *));
  c->pu = sm_xcalloc((size_t)c->nth, sizeof(uint8_t *));
  c->psc = sm_xcalloc((size_t)c->nth, sizeof(float *));
  c->amxw = sm_xcalloc((size_t)c->nth, sizeof(void *));
  for (int i = 0; i < c->nth; i++) {
    c->gscratch[i] = sm_aligned_alloc(sm_cpu_gemm_scratch_bytes());
    c->amxw[i] = sm_aligned_alloc(SM_AMX_SCRATCH);
    if (!c->gscratch[i] || !c->amxw[i]) {
      be_destroy(&c->base);
      sm_err(SMELT_ERR_OOM, "cpu: scratch");
      return NULL;
    }
  }
  sm_backend *b = &c->base;
  b->name = "cpu";
  b->kv_quant = true;
  b->n_threads = c->nth;
  b->batch_invariant = tune.invariant != 0;
  b->destroy = be_destroy;
  b->alloc = be_alloc;
  b->free = be_free;
  b->upload = be_upload;
  b->download = be_download;
  b->sync = be_sync;
  b->prepare_weight = be_prepare_weight;
  b->release_weight = be_release_weight;
  b->set_batch = be_set_batch;
  b->embed = be_embed;
  b->matmul = sm_cpu_matmul;
  b->matmul_group = sm_cpu_matmul_group;
  b->rmsnorm = be_rmsnorm;
  b->rope = be_rope;
  b->rope_ext = be_rope_ext;
  b->layernorm = be_layernorm;
  b->kv_store = sm_cpu_kv_store;
  b->attention = sm_cpu_attention;
  b->silu_mul = be_silu_mul;
  b->gelu_mul = be_gelu_mul;
  b->add = be_add;
  b->add_rows = be_add_rows;
  b->scale = be_scale;
  b->softcap = be_softcap;
  b->gather_out = be_gather_out;
  b->sample = be_sample;
  b->sample_batch_async = be_sample_batch_async;
  b->sample_batch_wait = be_sample_batch_wait;
  b->measure_bandwidth = be_measure_bandwidth;
  b->attention_sinks = sm_cpu_attention_sinks;
  b->attention_mla = sm_cpu_attention_mla;
  sm_cpu_moe_install(b);  /* mixture-of-experts ops (cpu_moe.c) */
  sm_cpu_comm_install(b); /* tensor-parallel collectives (cpu_comm.c) */
  b->copy = be_copy;
  b->mul = be_mul;
  b->sigmoid_mul = be_sigmoid_mul;
  b->relu2 = be_relu2;
  b->conv1d = be_conv1d;
  b->ssm_scan = be_ssm_scan;
  b->gated_delta = be_gated_delta;
  b->gated_rmsnorm = be_gated_rmsnorm;
  sm_cpu_encoder_ops(b);
  return b;
}

sm_pool *sm_cpu_backend_pool(sm_backend *be) { return CB(be)->pool; }
const sm_cpu_kern *sm_cpu_backend_kern(sm_backend *be) { return CB(be)->k; }

bool sm_cpu_backend_exact(const sm_backend *be) { return ((const cpu_be *)be)->exact; }

const char *sm_cpu_backend_i8_name(const sm_backend *be) {
  const cpu_be *c = (const cpu_be *)be;
  return c->ik ? c->ik->name : "none";
}

/* Name of the kernel set in use ("avx512", "avx2", "scalar"); for tests and logs. */
const char *sm_cpu_backend_isa(const sm_backend *be) { return ((const cpu_be *)be)->k->name; }

bool sm_cpu_backend_uses_i8(const sm_backend *be, const sm_weight *w, int n) {
  const cpu_be *c = (const cpu_be *)be;
  if (c->exact || !w || !w->bits || w->qmode != SM_QMODE_AFFINE) return false; /* microscaling: cpu_mxq.c */
  if (w->dev) return true;                                                     /* packed: every batch size */
  return (n < 4 || c->tune.invariant) && c->k->i8_ok && c->k->prep_xq && c->k->matvec_i8 && w->cols >= I8_MIN_COLS &&
         c->k->i8_ok(w);
}
bool sm_cpu_backend_uses_amx(const sm_backend *be, const sm_weight *w, int n) {
  const cpu_be *c = (const cpu_be *)be;
  return !c->exact && w && w->dev && c->amx && n > 1 && n >= c->tune.amx_min_n;
}
