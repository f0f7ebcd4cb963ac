/* The CPU backend's ops of recurrent (hybrid) models: the causal depthwise convolution, the Mamba-2
 * selective scan, the gated delta rule and the gated RMSNorm (backend.h). Each sequence's state lives
 * in its slot of the layer's kv->conv / kv->ssm buffers. The scans run token by token (the recurrent
 * form) for prefill and decode alike: per token they cost a few multiply-adds per state element, far
 * below the matmuls around them on a CPU; the work is split over the pool by (sequence, head) or
 * (sequence, channel range). */
#include "backend/cpu/cpu_internal.h"
#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* the run of batch tokens of each sequence: first[s], count[s] (0 when it has none) */
static void seq_runs(const sm_batch *b, int32_t *first, int32_t *count) {
  for (int s = 0; s < b->n_seqs; s++) {
    first[s] = 0;
    count[s] = 0;
  }
  for (int t = 0; t < b->n_tokens; t++) {
    const int s = b->seq[t];
    if (!count[s]) first[s] = t;
    count[s]++;
  }
}

bool sm_cpu_batch_rec_ok(const sm_batch *b) {
  if (!b->state_slot) return true;
  for (int t = 1; t < b->n_tokens; t++)
    if (b->seq[t] == b->seq[t - 1] && b->pos[t] != b->pos[t - 1] + 1) return false;
  /* each sequence's tokens form one run */
  for (int t = 1; t < b->n_tokens; t++)
    if (b->seq[t] != b->seq[t - 1])
      for (int u = 0; u < t - 1; u++)
        if (b->seq[u] == b->seq[t]) return false;
  return true;
}

static float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
static float silu(float x) { return x / (1.f + expf(-x)); }

/* the state slot of sequence s for a layer's buffer, or NULL when the batch or cache does not give one */
static float *slot_ptr(const sm_batch *b, float *const *buf, const sm_kv_cache *kv, int layer, int s, size_t floats) {
  if (!kv || !buf || layer < 0 || layer >= kv->n_layers || !buf[layer] || !b->state_slot) return NULL;
  const int32_t slot = b->state_slot[s];
  if (slot < 0 || slot >= kv->n_slots) return NULL;
  return buf[layer] + (size_t)slot * floats;
}

/* a parallel loop over n work items (sequence x part) */
typedef struct {
  void (*fn)(void *ctx, int item);
  void *ctx;
  int n;
  _Atomic int next;
} items_ctx;
static void items_job(void *v, int tid, int nth) {
  (void)tid;
  (void)nth;
  items_ctx *p = v;
  for (int i; (i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed)) < p->n;) p->fn(p->ctx, i);
}
static void run_items(sm_pool *pool, int n, void (*fn)(void *, int), void *ctx) {
  if (n <= 0) return;
  if (!pool || sm_pool_size(pool) == 1 || n == 1) {
    for (int i = 0; i < n; i++) fn(ctx, i);
    return;
  }
  items_ctx p = {.fn = fn, .ctx = ctx, .n = n};
  atomic_init(&p.next, 0);
  sm_pool_run(pool, items_job, &p);
}

/* ---------------- causal depthwise convolution ---------------- */
#define CONV_CHUNK 256 /* channels per work item */
typedef struct {
  const sm_batch *b;
  const int32_t *first, *count;
  float *out;
  const float *x, *w, *bias;
  int C, K, n_chunks;
  bool act;
  const sm_kv_cache *kv;
  int layer;
} conv_ctx;

static void conv_item(void *v, int item) {
  conv_ctx *c = v;
  const int s = item / c->n_chunks, c0 = (item % c->n_chunks) * CONV_CHUNK;
  const int c1 = c0 + CONV_CHUNK < c->C ? c0 + CONV_CHUNK : c->C;
  const int n = c->count[s], t0 = c->first[s], K1 = c->K - 1, C = c->C;
  if (!n) return;
  float *st = slot_ptr(c->b, c->kv->conv, c->kv, c->layer, s, c->kv->conv_floats);
  const bool fresh = c->b->pos[t0] == 0;
  float hist[64];
  for (int ch = c0; ch < c1; ch++) {
    const float *w = c->w + (size_t)ch * c->K;
    for (int j = 0; j < K1; j++) hist[j] = fresh || !st ? 0.f : st[(size_t)j * C + ch];
    for (int t = t0; t < t0 + n; t++) {
      const float xv = c->x[(size_t)t * C + ch];
      float acc = c->bias ? c->bias[ch] : 0.f;
      for (int j = 0; j < K1; j++) acc += w[j] * hist[j];
      acc += w[K1] * xv;
      for (int j = 0; j + 1 < K1; j++) hist[j] = hist[j + 1];
      if (K1 > 0) hist[K1 - 1] = xv;
      c->out[(size_t)t * C + ch] = c->act ? silu(acc) : acc;
    }
    if (st)
      for (int j = 0; j < K1; j++) st[(size_t)j * C + ch] = hist[j];
  }
}

void sm_cpu_conv1d(sm_pool *pool, const sm_batch *b, float *out, const float *x, const float *w, const float *bias,
                   int C, int K, bool act, const sm_kv_cache *kv, int layer) {
  if (b->n_tokens <= 0 || C <= 0 || K < 1 || K > 64 || !kv) return;
  int32_t first[b->n_seqs], count[b->n_seqs];
  seq_runs(b, first, count);
  conv_ctx c = {b, first, count, out, x, w, bias, C, K, (C + CONV_CHUNK - 1) / CONV_CHUNK, act, kv, layer};
  run_items(pool, b->n_seqs * c.n_chunks, conv_item, &c);
}

/* ---------------- Mamba-2 selective scan ---------------- */
typedef struct {
  const sm_batch *b;
  const int32_t *first, *count;
  float *y;
  const float *x, *B, *Cm, *dt_in, *dt_bias, *A_log, *D;
  int ld, nh, P, G, N;
  float dt_min, dt_max;
  const sm_kv_cache *kv;
  int layer;
} scan_ctx;

static void scan_item(void *v, int item) {
  scan_ctx *c = v;
  const int s = item / c->nh, h = item % c->nh;
  const int n = c->count[s], t0 = c->first[s], P = c->P, N = c->N, g = h / (c->nh / c->G);
  if (!n) return;
  float *st = slot_ptr(c->b, c->kv->ssm, c->kv, c->layer, s, c->kv->ssm_floats);
  if (!st) {
    for (int t = t0; t < t0 + n; t++)
      memset(c->y + (size_t)t * c->nh * P + (size_t)h * P, 0, sizeof(float) * (size_t)P);
    return;
  }
  float *S = st + (size_t)h * P * N;
  if (c->b->pos[t0] == 0) memset(S, 0, sizeof(float) * (size_t)P * N);
  const float A = -expf(c->A_log[h]);
  for (int t = t0; t < t0 + n; t++) {
    float dt = softplus(c->dt_in[(size_t)t * c->nh + h] + c->dt_bias[h]);
    dt = fminf(fmaxf(dt, c->dt_min), c->dt_max);
    const float dA = expf(A * dt);
    const float *x = c->x + (size_t)t * c->ld + (size_t)h * P;
    const float *Bt = c->B + (size_t)t * c->ld + (size_t)g * N, *Ct = c->Cm + (size_t)t * c->ld + (size_t)g * N;
    float *y = c->y + (size_t)t * c->nh * P + (size_t)h * P;
    for (int p = 0; p < P; p++) {
      float *Sp = S + (size_t)p * N;
      const float dx = dt * x[p];
      float acc = 0.f;
      for (int k = 0; k < N; k++) {
        Sp[k] = dA * Sp[k] + dx * Bt[k];
        acc += Sp[k] * Ct[k];
      }
      y[p] = acc + c->D[h] * x[p];
    }
  }
}

void sm_cpu_ssm_scan(sm_pool *pool, const sm_batch *b, float *y, const float *x, const float *B, const float *Cm,
                     int ld, const float *dt_in, const float *dt_bias, const float *A_log, const float *D, int nh,
                     int P, int G, int N, float dt_min, float dt_max, const sm_kv_cache *kv, int layer) {
  if (b->n_tokens <= 0 || nh <= 0 || P <= 0 || N <= 0 || G <= 0 || nh % G || !kv) return;
  int32_t first[b->n_seqs], count[b->n_seqs];
  seq_runs(b, first, count);
  scan_ctx c = {b, first, count, y, x, B, Cm, dt_in, dt_bias, A_log, D, ld, nh, P, G, N, dt_min, dt_max, kv, layer};
  run_items(pool, b->n_seqs * nh, scan_item, &c);
}

/* ---------------- gated delta rule ---------------- */
typedef struct {
  const sm_batch *b;
  const int32_t *first, *count;
  float *y;
  const float *q, *k, *v, *a, *bb, *A_log, *dt_bias;
  int ld, Hk, Hv, Dk, Dv;
  const sm_kv_cache *kv;
  int layer;
} gdn_ctx;

static void gdn_item(void *vp, int item) {
  gdn_ctx *c = vp;
  const int s = item / c->Hv, h = item % c->Hv;
  const int n = c->count[s], t0 = c->first[s], Dk = c->Dk, Dv = c->Dv, hk = h / (c->Hv / c->Hk);
  if (!n) return;
  float *st = slot_ptr(c->b, c->kv->ssm, c->kv, c->layer, s, c->kv->ssm_floats);
  if (!st) {
    for (int t = t0; t < t0 + n; t++)
      memset(c->y + (size_t)t * c->Hv * Dv + (size_t)h * Dv, 0, sizeof(float) * (size_t)Dv);
    return;
  }
  float *S = st + (size_t)h * Dv * Dk;
  if (c->b->pos[t0] == 0) memset(S, 0, sizeof(float) * (size_t)Dv * Dk);
  const float A = -expf(c->A_log[h]);
  float qn[1024], kn[1024];
  for (int t = t0; t < t0 + n; t++) {
    const float *q = c->q + (size_t)t * c->ld + (size_t)hk * Dk, *k = c->k + (size_t)t * c->ld + (size_t)hk * Dk;
    const float *v = c->v + (size_t)t * c->ld + (size_t)h * Dv;
    float sq = 0.f, sk = 0.f;
    for (int j = 0; j < Dk; j++) {
      sq += q[j] * q[j];
      sk += k[j] * k[j];
    }
    const float iq = 1.f / sqrtf(sq + 1e-6f) / sqrtf((float)Dk), ik = 1.f / sqrtf(sk + 1e-6f);
    for (int j = 0; j < Dk; j++) {
      qn[j] = q[j] * iq;
      kn[j] = k[j] * ik;
    }
    const float g = expf(A * softplus(c->a[(size_t)t * c->Hv + h] + c->dt_bias[h]));
    const float beta = 1.f / (1.f + expf(-c->bb[(size_t)t * c->Hv + h]));
    float *y = c->y + (size_t)t * c->Hv * Dv + (size_t)h * Dv;
    for (int i = 0; i < Dv; i++) {
      float *Si = S + (size_t)i * Dk;
      float kv = 0.f;
      for (int j = 0; j < Dk; j++) {
        Si[j] *= g;
        kv += Si[j] * kn[j];
      }
      const float d = beta * (v[i] - kv);
      float o = 0.f;
      for (int j = 0; j < Dk; j++) {
        Si[j] += d * kn[j];
        o += Si[j] * qn[j];
      }
      y[i] = o;
    }
  }
}

void sm_cpu_gated_delta(sm_pool *pool, const sm_batch *b, float *y, const float *q, const float *k, const float *v,
                        int ld, const float *a, const float *bb, const float *A_log, const float *dt_bias, int Hk,
                        int Hv, int Dk, int Dv, const sm_kv_cache *kv, int layer) {
  if (b->n_tokens <= 0 || Hk <= 0 || Hv <= 0 || Hv % Hk || Dk <= 0 || Dk > 1024 || Dv <= 0 || !kv) return;
  int32_t first[b->n_seqs], count[b->n_seqs];
  seq_runs(b, first, count);
  gdn_ctx c = {b, first, count, y, q, k, v, a, bb, A_log, dt_bias, ld, Hk, Hv, Dk, Dv, kv, layer};
  run_items(pool, b->n_seqs * Hv, gdn_item, &c);
}

/* ---------------- gated RMSNorm ---------------- */
typedef struct {
  float *out;
  const float *x, *z, *w;
  int n, dim, group, wdim;
  float eps;
  bool norm_first;
} gnorm_ctx;

static void gnorm_item(void *v, int r) {
  gnorm_ctx *c = v;
  const float *x = c->x + (size_t)r * c->dim, *z = c->z + (size_t)r * c->dim;
  float *o = c->out + (size_t)r * c->dim;
  for (int g0 = 0; g0 < c->dim; g0 += c->group) {
    float ss = 0.f;
    if (c->norm_first) {
      for (int i = g0; i < g0 + c->group; i++) ss += x[i] * x[i];
      const float inv = 1.f / sqrtf(ss / (float)c->group + c->eps);
      for (int i = g0; i < g0 + c->group; i++) o[i] = x[i] * inv * c->w[i % c->wdim] * silu(z[i]);
    } else {
      for (int i = g0; i < g0 + c->group; i++) {
        const float gx = x[i] * silu(z[i]);
        o[i] = gx;
        ss += gx * gx;
      }
      const float inv = 1.f / sqrtf(ss / (float)c->group + c->eps);
      for (int i = g0; i < g0 + c->group; i++) o[i] *= inv * c->w[i % c->wdim];
    }
  }
}

void sm_cpu_gated_rmsnorm(sm_pool *pool, float *out, const float *x, const float *z, const float *w, int n, int dim,
                          int group, int wdim, float eps, bool norm_first) {
  if (n <= 0 || dim <= 0 || group <= 0 || dim % group || (wdim != group && wdim != dim)) return;
  gnorm_ctx c = {out, x, z, w, n, dim, group, wdim, eps, norm_first};
  if ((size_t)n * (size_t)dim < (1 << 15)) pool = NULL;
  run_items(pool, n, gnorm_item, &c);
}
