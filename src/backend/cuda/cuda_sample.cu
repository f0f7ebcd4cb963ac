/* Sampling on the GPU: the CUDA backend's sample op (backend.h). For each request only the
 * token id comes back (4 bytes instead of a vocab-sized logits row), and it is exactly the
 * token of the host reference sm_sample_row (src/backend/sample.c): both use the arithmetic
 * of sample_math.h (one rounding per operation, our own exp, 128-bit fixed-point weights whose
 * sums do not depend on the order), so the parallel reductions/scans here reproduce the
 * sequential host loops bit for bit.
 *
 * Per call, on the backend's stream:
 *  - the requests, penalty pairs, logit biases and grammar masks ((vocab + 31) / 32 words a masked
 *    request) are staged in one pinned host buffer and uploaded in one async copy;
 *  - requests with a mask, biases or penalties: k_prep_rows copies their row with masked logits set
 *    to -inf (one launch for all of them), k_bias adds the biases of allowed tokens (in order, one
 *    thread a request) and k_penalize penalizes the (token, count) pairs; so a masked row is sampled
 *    like any other and its logits never leave the device;
 *  - greedy requests: k_argmax, a grid of blocks per row (key = sm_sample_key(logit), first
 *    max index); the last block of a row (atomic counter) reduces the partial results;
 *  - sorted requests (top_k, or top_p < 1): keys + ids -> cub::DeviceRadixSort (descending,
 *    stable, so equal keys keep index order: the host's "key desc, index asc"), the rows of
 *    several such requests in one cub::DeviceSegmentedRadixSort (a segment a row, also stable),
 *    each row holding only its candidates (the select path, cuda_sample_sel.cu);
 *  - non-greedy requests: k_walk_max and k_walk_exp, several blocks a request: the max, then
 *    e = exp((key - max) / T) and the weights' sums a tile of consecutive candidates at a time;
 *    k_walk_draw, one block a request: block scans of the tile sums for the total, the top_p
 *    cut, the min_p filter and the draw, and one warp walking the tile where a bound is crossed;
 *  - the token ids are copied to pinned memory and the stream is synchronized.
 * Scratch lives in one context per device (grown on demand, kept until exit). */
#include "backend/cuda/cuda_sample.cuh"
#include "backend/cuda/cuda_sample_dev.cuh"
#include <cub/cub.cuh>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ARG_T 256          /* threads of an argmax block */
#define ARG_CHUNK 1024     /* logits per argmax block (before clamping the split count) */
#define ARG_MAX_SPLIT 128  /* argmax blocks per row at most */
#define WALK_T 512         /* threads of a walk block */

typedef struct { int32_t req, token, count; } dpen;
typedef struct { int32_t token; float val; } dbias;

static __device__ __forceinline__ bool allowed(const uint32_t *m, int i) { return (m[i >> 5] >> (i & 31)) & 1u; }

/* ---------------- kernels ---------------- */
/* grid (blocks, n_req): the working copy of each request that has one = its logits row with the
 * tokens its mask leaves out at -inf (host: sm_sample_apply_mask after the biases, which only
 * reach allowed tokens here, see k_bias) */
static __global__ void k_prep_rows(const dreq *rq, int V) {
  const dreq *r = &rq[blockIdx.y];
  if (!r->copy) return;
  const float *x = r->orig;
  float *y = (float *)r->src;
  const uint32_t *m = r->mask;
  const int stride = gridDim.x * blockDim.x;
  if ((V & 3) == 0 && (((uintptr_t)x | (uintptr_t)y) & 15) == 0) {
    const float4 *x4 = (const float4 *)x;
    float4 *y4 = (float4 *)y;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < (V >> 2); j += stride) {
      float4 v = x4[j];
      if (m) {
        const uint32_t w = m[j >> 3] >> ((j & 7) << 2);
        if (!(w & 1u)) v.x = -INFINITY;
        if (!(w & 2u)) v.y = -INFINITY;
        if (!(w & 4u)) v.z = -INFINITY;
        if (!(w & 8u)) v.w = -INFINITY;
      }
      y4[j] = v;
    }
  } else {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += stride)
      y[i] = m && !allowed(m, i) ? -INFINITY : x[i];
  }
}

/* one thread per request: its logit biases in order (the host's sequential +=), allowed tokens only */
static __global__ void k_bias(const dreq *rq, int n_req, const dbias *b) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n_req) return;
  const dreq q = rq[r];
  float *x = (float *)q.src;
  for (int k = 0; k < q.n_bias; k++) {
    const dbias a = b[q.bias_off + k];
    if (!q.mask || allowed(q.mask, a.token)) x[a.token] = SM_FADD(x[a.token], a.val);
  }
}

/* a thread a pair; the first pair of a token in its request's list applies every pair of that token
 * in list order (the host's sequential loop), so a list that names a token twice gives the host's
 * logit rather than a race between two writers */
static __global__ void k_penalize(const dpen *p, int n, const dreq *rq) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const dpen a = p[i];
  const dreq *r = &rq[a.req];
  const int p0 = r->pen_off, p1 = p0 + r->n_pen;
  for (int j = p0; j < i; j++)
    if (p[j].token == a.token) return;
  float *x = (float *)r->src;
  float v = x[a.token];
  for (int j = i; j < p1; j++)
    if (p[j].token == a.token) v = sm_sample_penalize(v, p[j].count, r->rep, r->freq, r->pres);
  x[a.token] = v;
}

static __device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}
static __device__ __forceinline__ void warp_best(float &bv, int &bi) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
  }
}

/* grid (nsplit, n_req): block b of row r covers [b*chunk, (b+1)*chunk) (chunk % 4 == 0) */
/* direct != NULL: one greedy row without penalties, given by pointer (no request upload) */
/* out2 != NULL: the token is also stored there (mapped pinned host memory; one row) */
static __global__ void __launch_bounds__(ARG_T) k_argmax(const dreq *rq, const float *direct, int V, int nsplit,
                                                         int chunk, float *pv, int *pi, unsigned *cnt, int32_t *out,
                                                         int32_t *out2) {
  pdl_wait(); /* launched with cu_launch (cu_argmax1): the logits come from the previous kernel */
  const int r = blockIdx.y;
  if (!direct && rq[r].mode != SM_SAMPLE_GREEDY) return;
  const float *x = direct ? direct : rq[r].src;
  const int lo = blockIdx.x * chunk, hi = min(V, lo + chunk);
  float bv = -INFINITY;
  int bi = INT_MAX;
  if ((V & 3) == 0 && ((uintptr_t)x & 15) == 0) {
    const float4 *x4 = (const float4 *)x;
    for (int j = (lo >> 2) + threadIdx.x; j < (hi >> 2); j += blockDim.x) {
      float4 v = x4[j];
      int i = j << 2;
      float a;
      a = sm_sample_key(v.x); if (better(a, i, bv, bi)) { bv = a; bi = i; }
      a = sm_sample_key(v.y); if (better(a, i + 1, bv, bi)) { bv = a; bi = i + 1; }
      a = sm_sample_key(v.z); if (better(a, i + 2, bv, bi)) { bv = a; bi = i + 2; }
      a = sm_sample_key(v.w); if (better(a, i + 3, bv, bi)) { bv = a; bi = i + 3; }
    }
  } else {
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      float a = sm_sample_key(x[i]);
      if (better(a, i, bv, bi)) { bv = a; bi = i; }
    }
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ bool last;
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  warp_best(bv, bi);
  if (l == 0) { sv[w] = bv; si[w] = bi; }
  __syncthreads();
  if (w == 0) {
    bv = l < nw ? sv[l] : -INFINITY;
    bi = l < nw ? si[l] : INT_MAX;
    warp_best(bv, bi);
    if (l == 0) {
      pv[r * nsplit + blockIdx.x] = bv;
      pi[r * nsplit + blockIdx.x] = bi;
      __threadfence();
      last = atomicAdd(&cnt[r], 1u) == (unsigned)nsplit - 1;
    }
  }
  __syncthreads();
  if (!last || w != 0) return;
  __threadfence();
  bv = -INFINITY;
  bi = INT_MAX;
  for (int k = l; k < nsplit; k += 32) {
    float v = __ldcg(&pv[r * nsplit + k]);
    int i = __ldcg(&pi[r * nsplit + k]);
    if (better(v, i, bv, bi)) { bv = v; bi = i; }
  }
  warp_best(bv, bi);
  if (l == 0) {
    out[r] = bi == INT_MAX ? 0 : bi;
    if (out2) out2[r] = bi == INT_MAX ? 0 : bi;
    cnt[r] = 0; /* ready for the next call */
  }
}

static __global__ void k_sort_prep(const float *src, int V, float *keys, int32_t *ids) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
    keys[i] = sm_sample_key(src[i]);
    ids[i] = i;
  }
}

/* the offsets of n rows of V for a segmented sort: off[i] = i * V, i <= n */
static __global__ void k_seg_offsets(int *off, int n, int V) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) off[i] = i * V;
}

/* exclusive block scan of v (WALK_T threads); *total = the sum over the block */
static __device__ sm_u128 scan_excl(sm_u128 v, sm_u128 *sh, sm_u128 *total) {
  const int t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (int off = 1; off < WALK_T; off <<= 1) {
    sm_u128 a = t >= off ? sh[t - off] : (sm_u128)0;
    __syncthreads();
    sh[t] += a;
    __syncthreads();
  }
  sm_u128 incl = sh[t];
  *total = sh[WALK_T - 1];
  __syncthreads();
  return incl - v;
}

static __device__ __forceinline__ sm_u128 shfl_u128(sm_u128 v, int src, bool up) {
  uint64_t lo = (uint64_t)v, hi = (uint64_t)(v >> 64);
  lo = up ? __shfl_up_sync(0xffffffffu, lo, src) : __shfl_xor_sync(0xffffffffu, lo, src);
  hi = up ? __shfl_up_sync(0xffffffffu, hi, src) : __shfl_xor_sync(0xffffffffu, hi, src);
  return ((sm_u128)hi << 64) | lo;
}
static __device__ __forceinline__ sm_u128 bcast_u128(sm_u128 v, int lane) {
  const uint64_t lo = __shfl_sync(0xffffffffu, (uint64_t)v, lane), hi = __shfl_sync(0xffffffffu, (uint64_t)(v >> 64), lane);
  return ((sm_u128)hi << 64) | lo;
}
static __device__ __forceinline__ sm_u128 warp_sum(sm_u128 v) {
  for (int o = 16; o > 0; o >>= 1) v += shfl_u128(v, o, false);
  return v;
}
static __device__ __forceinline__ sm_u128 warp_incl(sm_u128 v) {
  const int l = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    sm_u128 a = shfl_u128(v, o, true);
    if (l >= o) v += a;
  }
  return v;
}

/* The walk works on tiles of 32 * K consecutive candidates (K grows with the candidate count so
 * that a request has at most WALK_TILES tiles), a warp a tile at a time with its lanes on
 * consecutive candidates. k_walk_max and k_walk_exp spread a request's tiles over S blocks (the
 * arithmetic of e and of the weights is most of the work); k_walk_draw, a block a request, scans
 * the tile sums to find the tile where a cumulative weight crosses a bound, and one warp finds the
 * candidate in it. The sums are exact integers and the bound tests are those of the sequential loop
 * (sm_sample_row), so the token is the same. */
#define WALK_TILES 1024 /* tiles a request at most (= 2 * WALK_T: two a thread in the scan) */
#define WALK_ST 256     /* threads of the k_walk_max / k_walk_exp blocks */

static __device__ __forceinline__ void walk_geom(int n, int *K, int *nt) {
  *K = (n + 32 * WALK_TILES - 1) / (32 * WALK_TILES);
  *nt = (n + 32 * *K - 1) / (32 * *K);
}

/* grid (S, requests): the largest key of each block's share of a request's tiles; with pre_V > 0,
 * of the logits row (pre_V of them, natural order) of each top_p request of the select path */
static __global__ void __launch_bounds__(WALK_ST) k_walk_max(const dreq *rq, int S, float *pmax, int pre_V) {
  const dreq q = rq[blockIdx.y];
  if (q.mode == SM_SAMPLE_GREEDY || (pre_V && q.sel != 2)) return;
  __shared__ float fsh[32];
  int K, nt;
  const int n = pre_V ? pre_V : q.n;
  walk_geom(n, &K, &nt);
  const int tpb = (nt + S - 1) / S, i0 = blockIdx.x * tpb * K * 32, i1 = min(n, i0 + tpb * K * 32);
  const float *keys = q.keys && !pre_V ? q.keys : q.src;
  float m = -INFINITY;
#pragma unroll 4
  for (int i = i0 + threadIdx.x; i < i1; i += WALK_ST) m = fmaxf(m, sm_sample_key(keys[i]));
  m = block_max(m, fsh);
  if (threadIdx.x == 0) pmax[blockIdx.y * S + blockIdx.x] = m;
}

/* grid (S, requests): e of each candidate of the block's tiles, and per tile the sum of the weights
 * (ts) and of those min_p keeps (ks); sums: 2 * WALK_TILES a request */
static __global__ void __launch_bounds__(WALK_ST) k_walk_exp(const dreq *rq, int S, const float *pmax, sm_u128 *sums) {
  const dreq q = rq[blockIdx.y];
  if (q.mode == SM_SAMPLE_GREEDY) return;
  const float m = walk_row_max(pmax, S);
  if (m == -INFINITY) return;
  int K, nt;
  walk_geom(q.n, &K, &nt);
  const int tpb = (nt + S - 1) / S, t0 = blockIdx.x * tpb, t1 = min(nt, t0 + tpb), n = q.n;
  const int wp = threadIdx.x >> 5, l = threadIdx.x & 31;
  const float *keys = q.keys ? q.keys : q.src;
  const bool use_mp = q.min_p > 0;
  const float mp = q.min_p > 1.0f ? 1.0f : q.min_p;
  sm_u128 *ts = sums + (size_t)blockIdx.y * 2 * WALK_TILES, *ks = ts + WALK_TILES;
  for (int tile = t0 + wp; tile < t1; tile += WALK_ST / 32) {
    sm_u128 a = 0, b = 0;
    for (int k = 0; k < K; k++) {
      const int i = tile * K * 32 + k * 32 + l;
      if (i >= n) break;
      const float v = sm_sample_exp(SM_FDIV(SM_FSUB(sm_sample_key(keys[i]), m), q.T));
      q.e[i] = v;
      const sm_u128 w = sm_sample_weight(v);
      a += w;
      if (!use_mp || v >= mp) b += w;
    }
    a = warp_sum(a);
    b = warp_sum(b);
    if (l == 0) {
      ts[tile] = a;
      ks[tile] = b;
    }
  }
}

typedef struct {
  sm_u128 sum[WALK_TILES], pre[WALK_TILES], scan[WALK_T];
  int s_tile, s_last;
} walk_sh;

/* sh->pre = the exclusive scan of sh->sum[0..nt); returns the total */
static __device__ sm_u128 walk_scan(walk_sh *sh, int nt) {
  const int t = threadIdx.x, a = 2 * t, b = 2 * t + 1;
  const sm_u128 va = a < nt ? sh->sum[a] : 0, vb = b < nt ? sh->sum[b] : 0;
  sm_u128 total;
  const sm_u128 ex = scan_excl(va + vb, sh->scan, &total);
  if (a < nt) sh->pre[a] = ex;
  if (b < nt) sh->pre[b] = ex + va;
  __syncthreads();
  return total;
}

/* the first candidate i < n whose cumulative w (inclusive) c has hit(c), or -1; sh->sum / pre are
 * the tile sums of w and their scan; hit must be monotone in c */
template <class W, class H> static __device__ int walk_find(walk_sh *sh, int n, int K, int nt, W w, H hit) {
  if (threadIdx.x == 0) sh->s_tile = INT_MAX;
  __syncthreads();
  for (int tile = threadIdx.x; tile < nt; tile += WALK_T)
    if (hit(sh->pre[tile] + sh->sum[tile])) atomicMin(&sh->s_tile, tile);
  __syncthreads();
  const int tile = sh->s_tile;
  __syncthreads();
  if (tile == INT_MAX) return -1;
  if (threadIdx.x < 32) {
    const int l = threadIdx.x;
    sm_u128 base = sh->pre[tile];
    int found = -1;
    for (int k = 0; k < K && found < 0; k++) {
      const int i = tile * K * 32 + k * 32 + l;
      const sm_u128 c = base + warp_incl(i < n ? w(i) : (sm_u128)0);
      const unsigned m = __ballot_sync(0xffffffffu, i < n && hit(c));
      if (m) found = tile * K * 32 + k * 32 + __ffs(m) - 1;
      base = bcast_u128(c, 31);
    }
    if (l == 0) sh->s_tile = found;
  }
  __syncthreads();
  const int r = sh->s_tile;
  __syncthreads();
  return r;
}

/* grid (requests): the draw, from the tile sums of k_walk_exp */
static __global__ void __launch_bounds__(WALK_T) k_walk_draw(const dreq *rq, int S, const float *pmax,
                                                             const sm_u128 *sums, int32_t *out) {
  const dreq q = rq[blockIdx.y];
  if (q.mode == SM_SAMPLE_GREEDY) return;
  __shared__ walk_sh sh;
  const int t = threadIdx.x, n = q.n, wp = t >> 5, l = t & 31;
  const float m = walk_row_max(pmax, S);
  if (m == -INFINITY) {
    if (t == 0) out[blockIdx.y] = q.idx ? q.idx[0] : 0;
    return;
  }
  int K, nt;
  walk_geom(n, &K, &nt);
  const sm_u128 *ts = sums + (size_t)blockIdx.y * 2 * WALK_TILES, *ks = ts + WALK_TILES;
  const float *e = q.e;
  for (int tile = t; tile < nt; tile += WALK_T) sh.sum[tile] = ts[tile];
  __syncthreads();
  const sm_u128 scanned = walk_scan(&sh, nt), total = q.has_total ? q.total : scanned;
  int keep = n;
  if (q.top_p > 0 && q.top_p < 1.0f) {
    const double thr = SM_DMUL((double)q.top_p, sm_sample_u128_to_double(total));
    const int f = walk_find(
        &sh, n, K, nt, [&](int i) { return sm_sample_weight(e[i]); },
        [&](sm_u128 c) { return sm_sample_u128_to_double(c) >= thr; });
    if (f >= 0) keep = f + 1;
  }
  const bool use_mp = q.min_p > 0;
  const float mp = q.min_p > 1.0f ? 1.0f : q.min_p;
  auto wk = [&](int i) {
    const float v = e[i];
    return i < keep && (!use_mp || v >= mp) ? sm_sample_weight(v) : (sm_u128)0;
  };
  /* the kept weights' tile sums: k_walk_exp's before the tile of the last kept candidate, that
   * tile's own (warp 0), none after */
  const int kt = (keep - 1) / (K * 32);
  for (int tile = t; tile < nt; tile += WALK_T) sh.sum[tile] = tile < kt ? ks[tile] : 0;
  __syncthreads();
  if (wp == 0) {
    sm_u128 v = 0;
    for (int k = 0; k < K; k++) {
      const int i = kt * K * 32 + k * 32 + l;
      if (i < n) v += wk(i);
    }
    v = warp_sum(v);
    if (l == 0) sh.sum[kt] = v;
  }
  if (t == 0) sh.s_last = -1;
  __syncthreads();
  const sm_u128 kept = walk_scan(&sh, nt);
  for (int tile = t; tile < nt; tile += WALK_T)
    if (sh.sum[tile]) atomicMax(&sh.s_last, tile);
  const double x = SM_DMUL(q.u, sm_sample_u128_to_double(kept));
  int pick = walk_find(&sh, n, K, nt, wk, [&](sm_u128 c) { return x < sm_sample_u128_to_double(c); });
  if (pick < 0 && sh.s_last >= 0) { /* no crossing (rounding): the last kept candidate */
    if (wp == 0) {
      int last = -1;
      for (int k = 0; k < K; k++) {
        const int i = sh.s_last * K * 32 + k * 32 + l;
        const unsigned b = __ballot_sync(0xffffffffu, i < n && wk(i) != 0);
        if (b) last = sh.s_last * K * 32 + k * 32 + 31 - __clz(b);
      }
      if (l == 0) sh.s_tile = last;
    }
    __syncthreads();
    pick = sh.s_tile;
  }
  if (t == 0) {
    pick = pick >= 0 ? pick : 0;
    out[blockIdx.y] = q.idx ? q.idx[pick] : pick;
  }
}

/* ---------------- host side ---------------- */
typedef struct { void *p; size_t cap; } dbuf;
typedef struct {
  pthread_mutex_t mu;
  dbuf h_stage;       /* pinned: dreq[n_req], then dpen[] */
  dbuf d_stage;
  dbuf rows;          /* penalized row copies */
  dbuf e;             /* e scratch of the walk */
  dbuf ws;            /* the walk's tile sums (2 * WALK_TILES a request), then its block maxima */
  int n_sm;           /* the device's SMs (0: not read yet) */
  dbuf kin, iin;      /* sort input, one row per sorted request */
  dbuf soff;          /* segment offsets of the sort of several rows: begins, then ends */
  dbuf hist;          /* the select path's histograms (zero between calls), then its states and block counts */
  dbuf kout, iout;    /* sorted keys / ids, one row per sorted request */
  dbuf tmp;           /* CUB temporary storage */
  dbuf pv, pi;        /* argmax partials */
  dbuf cnt;           /* argmax block counters (zero between calls) */
  dbuf d_out, h_out;  /* token ids (h_out pinned) */
  cudaEvent_t stage_ev; /* after the upload of h_stage (rewritten only once it is done) */
  bool stage_ev_ok, stage_live;
} samp_ctx;

#define MAX_DEV 64
static samp_ctx g_ctx[MAX_DEV];
static bool g_init[MAX_DEV];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static bool dgrow(dbuf *b, size_t need) {
  if (need <= b->cap) return true;
  if (b->p) cudaFree(b->p);
  b->p = NULL;
  b->cap = 0;
  size_t n = need + need / 4;
  if (cudaMalloc(&b->p, n) != cudaSuccess) { cudaGetLastError(); b->p = NULL; return false; }
  b->cap = n;
  return true;
}
static bool hgrow(dbuf *b, size_t need) {
  if (need <= b->cap) return true;
  if (b->p) cudaFreeHost(b->p);
  b->p = NULL;
  b->cap = 0;
  size_t n = need + need / 4;
  if (cudaMallocHost(&b->p, n) != cudaSuccess) { cudaGetLastError(); b->p = NULL; return false; }
  b->cap = n;
  return true;
}

static smelt_status cuerr(cudaError_t e, const char *what) {
  cudaGetLastError();
  return sm_err(SMELT_ERR_BACKEND, "cuda sample: %s: %s", what, cudaGetErrorString(e));
}

/* out: host tokens (waits), or with dev_dst the tokens are copied there on the device and the call
 * returns without waiting */
static smelt_status run(samp_ctx *x, const float *logits, int V, const sm_sample_req *req, int n_req, int32_t *out,
                        cudaStream_t s, int32_t *dev_dst, int walk_bps) {
  int n_copy = 0, n_mask = 0, n_sorted = 0, n_walk = 0, n_greedy = 0;
  size_t total_pen = 0, total_bias = 0;
  for (int i = 0; i < n_req; i++) {
    int n;
    int mode = sm_sample_plan(req[i].temperature, req[i].top_k, req[i].top_p, V, &n);
    n_greedy += mode == SM_SAMPLE_GREEDY;
    n_walk += mode != SM_SAMPLE_GREEDY;
    n_sorted += mode == SM_SAMPLE_SORTED;
    total_pen += (size_t)SM_MAX(req[i].n_pen, 0);
    total_bias += (size_t)SM_MAX(req[i].n_bias, 0);
    n_mask += req[i].mask != NULL;
    n_copy += req[i].n_pen > 0 || req[i].n_bias > 0 || req[i].mask;
  }
  const size_t Vz = (size_t)V, W = (Vz + 31) / 32;
  const size_t pen_off = (sizeof(dreq) * (size_t)n_req + 15) & ~(size_t)15;
  const size_t bias_off = (pen_off + sizeof(dpen) * total_pen + 15) & ~(size_t)15;
  const size_t mask_off = (bias_off + sizeof(dbias) * total_bias + 15) & ~(size_t)15;
  const size_t stage = mask_off + sizeof(uint32_t) * W * (size_t)n_mask;
  size_t tmp_need = 0;
  cudaError_t ce;
  if (n_sorted == 1) {
    ce = cub::DeviceRadixSort::SortPairsDescending((void *)NULL, tmp_need, (const float *)NULL, (float *)NULL,
                                                   (const int32_t *)NULL, (int32_t *)NULL, V, 0, 32, s);
    if (ce != cudaSuccess) return cuerr(ce, "sort size");
  } else if (n_sorted > 1) {
    if ((size_t)n_sorted * Vz > (size_t)INT_MAX) return sm_err(SMELT_ERR_LIMIT, "cuda sample: %d sorted rows of %d", n_sorted, V);
    ce = cub::DeviceSegmentedRadixSort::SortPairsDescending((void *)NULL, tmp_need, (const float *)NULL, (float *)NULL,
                                                            (const int32_t *)NULL, (int32_t *)NULL, n_sorted * V,
                                                            n_sorted, (const int *)NULL, (const int *)NULL, 0, 32, s);
    if (ce != cudaSuccess) return cuerr(ce, "sort size");
  }
  /* several sorted requests: the select path (sorts only each row's candidates) */
  const bool sel = n_sorted > 1;
  const size_t hist_need = cu_sample_sel_scratch(n_req);
  const size_t cnt_before = x->cnt.cap;
  if (!hgrow(&x->h_stage, stage) || !dgrow(&x->d_stage, stage) ||
      !dgrow(&x->rows, sizeof(float) * Vz * (size_t)n_copy) || !dgrow(&x->e, sizeof(float) * Vz * (size_t)n_walk) ||
      !dgrow(&x->ws, (sizeof(sm_u128) * 2 * WALK_TILES + sizeof(float) * WALK_MAX_S) * (size_t)n_req) ||
      !dgrow(&x->kin, sizeof(float) * Vz * (size_t)n_sorted) || !dgrow(&x->iin, sizeof(int32_t) * Vz * (size_t)n_sorted) ||
      !dgrow(&x->soff, sizeof(int) * 2 * (size_t)(n_sorted + 1)) || !dgrow(&x->hist, sel ? hist_need : 0) ||
      !dgrow(&x->kout, sizeof(float) * Vz * (size_t)n_sorted) ||
      !dgrow(&x->iout, sizeof(int32_t) * Vz * (size_t)n_sorted) || !dgrow(&x->tmp, n_sorted ? SM_MAX(tmp_need, (size_t)256) : 0) || /* never NULL: CUB reads NULL as a size query */
      !dgrow(&x->pv, sizeof(float) * ARG_MAX_SPLIT * (size_t)n_req) ||
      !dgrow(&x->pi, sizeof(int) * ARG_MAX_SPLIT * (size_t)n_req) || !dgrow(&x->cnt, sizeof(unsigned) * (size_t)n_req) ||
      !dgrow(&x->d_out, sizeof(int32_t) * (size_t)n_req) || !hgrow(&x->h_out, sizeof(int32_t) * (size_t)n_req))
    return sm_err(SMELT_ERR_OOM, "cuda sample: out of memory for scratch (%d requests, vocab %d)", n_req, V);
  if (x->cnt.cap != cnt_before && (ce = cudaMemsetAsync(x->cnt.p, 0, x->cnt.cap, s)) != cudaSuccess)
    return cuerr(ce, "memset");
  if (n_req == 1 && n_greedy == 1 && n_copy == 0) { /* one greedy row as it is: no request upload */
    int nsplit = SM_MIN(ARG_MAX_SPLIT, SM_MAX(1, (V + ARG_CHUNK - 1) / ARG_CHUNK));
    int chunk = (((V + nsplit - 1) / nsplit) + 3) & ~3;
    nsplit = (V + chunk - 1) / chunk;
    k_argmax<<<dim3((unsigned)nsplit, 1u), ARG_T, 0, s>>>(NULL, logits + (size_t)req[0].row * Vz, V, nsplit, chunk,
                                                          (float *)x->pv.p, (int *)x->pi.p, (unsigned *)x->cnt.p,
                                                          dev_dst ? dev_dst : (int32_t *)x->d_out.p, (int32_t *)NULL);
    if ((ce = cudaGetLastError()) != cudaSuccess) return cuerr(ce, "launch");
    if (dev_dst) return SMELT_OK;
    if ((ce = cudaMemcpyAsync(x->h_out.p, x->d_out.p, sizeof(int32_t), cudaMemcpyDeviceToHost, s)) != cudaSuccess)
      return cuerr(ce, "download");
    if ((ce = cudaStreamSynchronize(s)) != cudaSuccess) return cuerr(ce, "sync");
    memcpy(out, x->h_out.p, sizeof(int32_t));
    return SMELT_OK;
  }
  /* requests as the kernels see them (the previous call's upload may still be queued) */
  if (x->stage_live) cudaEventSynchronize(x->stage_ev);
  x->stage_live = false;
  dreq *h = (dreq *)x->h_stage.p;
  dpen *hp = (dpen *)((char *)x->h_stage.p + pen_off);
  dbias *hb = (dbias *)((char *)x->h_stage.p + bias_off);
  uint32_t *hm = (uint32_t *)((char *)x->h_stage.p + mask_off);
  const uint32_t *dm = (const uint32_t *)((char *)x->d_stage.p + mask_off);
  float *rows = (float *)x->rows.p, *ebuf = (float *)x->e.p, *kout = (float *)x->kout.p;
  int32_t *iout = (int32_t *)x->iout.p;
  int i_copy = 0, i_mask = 0, i_walk = 0, i_sort = 0;
  size_t np = 0, nbias = 0;
  for (int i = 0; i < n_req; i++) {
    const sm_sample_req *r = &req[i];
    dreq *d = &h[i];
    memset(d, 0, sizeof *d);
    d->mode = sm_sample_plan(r->temperature, r->top_k, r->top_p, V, &d->n);
    d->u = r->u;
    d->T = r->temperature;
    d->top_p = r->top_p;
    d->min_p = r->min_p;
    d->rep = r->repetition_penalty;
    d->freq = r->frequency_penalty;
    d->pres = r->presence_penalty;
    d->src = logits + (size_t)r->row * Vz;
    if (r->n_pen > 0 || r->n_bias > 0 || r->mask) {
      d->orig = d->src;
      d->src = rows + (size_t)i_copy++ * Vz;
      d->copy = 1;
    }
    if (r->mask) {
      memcpy(hm + (size_t)i_mask * W, r->mask, sizeof(uint32_t) * W);
      d->mask = dm + (size_t)i_mask++ * W;
    }
    d->bias_off = (int)nbias;
    d->n_bias = SM_MAX(r->n_bias, 0);
    for (int k = 0; k < d->n_bias; k++, nbias++) {
      hb[nbias].token = r->bias_ids[k];
      hb[nbias].val = r->bias_vals[k];
    }
    d->pen_off = (int)np;
    d->n_pen = SM_MAX(r->n_pen, 0);
    if (r->n_pen > 0) {
      for (int k = 0; k < r->n_pen; k++, np++) {
        hp[np].req = i;
        hp[np].token = r->pen[k].token;
        hp[np].count = r->pen[k].count;
      }
    }
    if (d->mode != SM_SAMPLE_GREEDY) d->e = ebuf + (size_t)i_walk++ * Vz;
    if (d->mode == SM_SAMPLE_SORTED) {
      d->keys = kout + (size_t)i_sort * Vz;
      d->idx = iout + (size_t)i_sort * Vz;
      if (sel) {
        d->k = d->n;
        d->srow = i_sort;
        d->sel = d->n < V ? 1 : r->top_p > 0 && r->top_p < 1.0f ? 2 : 3;
      }
      i_sort++;
    }
  }
  if ((ce = cudaMemcpyAsync(x->d_stage.p, x->h_stage.p, stage, cudaMemcpyHostToDevice, s)) != cudaSuccess)
    return cuerr(ce, "upload");
  if (!x->stage_ev_ok) x->stage_ev_ok = cudaEventCreateWithFlags(&x->stage_ev, cudaEventDisableTiming) == cudaSuccess;
  if (x->stage_ev_ok && cudaEventRecord(x->stage_ev, s) == cudaSuccess) x->stage_live = true;
  else if ((ce = cudaStreamSynchronize(s)) != cudaSuccess) return cuerr(ce, "sync");
  const dreq *dq = (const dreq *)x->d_stage.p;
  if (n_copy) {
    unsigned nbx = (unsigned)SM_MIN((size_t)128, (Vz / 4 + 255) / 256 + 1);
    k_prep_rows<<<dim3(nbx, (unsigned)n_req), 256, 0, s>>>(dq, V);
  }
  if (total_bias)
    k_bias<<<(unsigned)((n_req + 63) / 64), 64, 0, s>>>(dq, n_req, (const dbias *)((char *)x->d_stage.p + bias_off));
  if (total_pen) {
    unsigned nb = (unsigned)((total_pen + 255) / 256);
    k_penalize<<<nb, 256, 0, s>>>((const dpen *)((char *)x->d_stage.p + pen_off), (int)total_pen, dq);
  }
  int32_t *d_out = dev_dst ? dev_dst : (int32_t *)x->d_out.p;
  if (n_greedy) {
    int nsplit = SM_MIN(ARG_MAX_SPLIT, SM_MAX(1, (V + ARG_CHUNK - 1) / ARG_CHUNK));
    int chunk = (((V + nsplit - 1) / nsplit) + 3) & ~3;
    nsplit = (V + chunk - 1) / chunk;
    k_argmax<<<dim3((unsigned)nsplit, (unsigned)n_req), ARG_T, 0, s>>>(dq, NULL, V, nsplit, chunk, (float *)x->pv.p,
                                                                        (int *)x->pi.p, (unsigned *)x->cnt.p, d_out, (int32_t *)NULL);
  }
  /* walk_bps blocks an SM over the walking requests' rows */
  int dv = 0;
  if (n_walk && !x->n_sm &&
      (cudaGetDevice(&dv) != cudaSuccess || cudaDeviceGetAttribute(&x->n_sm, cudaDevAttrMultiProcessorCount, dv) != cudaSuccess)) {
    cudaGetLastError();
    x->n_sm = 1;
  }
  const int S = n_walk ? SM_MAX(1, SM_MIN(WALK_MAX_S, (walk_bps * x->n_sm + n_walk - 1) / n_walk)) : 1;
  sm_u128 *sums = (sm_u128 *)x->ws.p;
  float *pmax = (float *)(sums + (size_t)2 * WALK_TILES * n_req);
  size_t tb = x->tmp.cap;
  if (n_sorted == 1) { /* one sorted request: its whole row, one device-wide sort */
    for (int i = 0; i < n_req; i++) {
      if (h[i].mode != SM_SAMPLE_SORTED) continue;
      unsigned nb = (unsigned)SM_MIN((size_t)1024, (Vz + 255) / 256);
      k_sort_prep<<<nb, 256, 0, s>>>(h[i].src, V, (float *)x->kin.p, (int32_t *)x->iin.p);
    }
    ce = cub::DeviceRadixSort::SortPairsDescending(x->tmp.p, tb, (const float *)x->kin.p, (float *)x->kout.p,
                                                   (const int32_t *)x->iin.p, (int32_t *)x->iout.p, V, 0, 32, s);
    if (ce != cudaSuccess) return cuerr(ce, "sort");
  } else if (n_sorted > 1) { /* the select path: each row's candidates, a segment a row */
    dreq *dw = (dreq *)x->d_stage.p;
    int *off = (int *)x->soff.p, *endoff = off + n_sorted + 1;
    k_walk_max<<<dim3((unsigned)S, (unsigned)n_req), WALK_ST, 0, s>>>(dq, S, pmax, V);
    if ((ce = cu_sample_sel(dw, n_req, V, S, pmax, x->hist.p, (float *)x->kin.p, (int32_t *)x->iin.p, endoff, s)) !=
        cudaSuccess)
      return cuerr(ce, "select");
    k_seg_offsets<<<(unsigned)((n_sorted + 256) / 256), 256, 0, s>>>(off, n_sorted, V);
    ce = cub::DeviceSegmentedRadixSort::SortPairsDescending(
        x->tmp.p, tb, (const float *)x->kin.p, (float *)x->kout.p, (const int32_t *)x->iin.p, (int32_t *)x->iout.p,
        n_sorted * V, n_sorted, off, endoff, 0, 32, s);
    if (ce != cudaSuccess) return cuerr(ce, "sort");
  }
  if (n_walk) {
    k_walk_max<<<dim3((unsigned)S, (unsigned)n_req), WALK_ST, 0, s>>>(dq, S, pmax, 0);
    k_walk_exp<<<dim3((unsigned)S, (unsigned)n_req), WALK_ST, 0, s>>>(dq, S, pmax, sums);
    k_walk_draw<<<dim3(1u, (unsigned)n_req), WALK_T, 0, s>>>(dq, S, pmax, sums, d_out);
  }
  if ((ce = cudaGetLastError()) != cudaSuccess) return cuerr(ce, "launch");
  if (dev_dst) return SMELT_OK;
  if ((ce = cudaMemcpyAsync(x->h_out.p, d_out, sizeof(int32_t) * (size_t)n_req, cudaMemcpyDeviceToHost, s)) !=
      cudaSuccess)
    return cuerr(ce, "download");
  if ((ce = cudaStreamSynchronize(s)) != cudaSuccess) return cuerr(ce, "sync");
  memcpy(out, x->h_out.p, sizeof(int32_t) * (size_t)n_req);
  return SMELT_OK;
}

smelt_status cu_sample(const float *logits, int n_rows, int vocab, const sm_sample_req *req, int n_req,
                       int32_t *out_tokens, cudaStream_t s, int dev, int32_t *dev_dst, int walk_bps) {
  smelt_status st = sm_sample_check(req, n_req, n_rows, vocab);
  if (st) return st;
  if (n_req == 0) return SMELT_OK;
  if (!logits || (!out_tokens && !dev_dst)) return sm_err(SMELT_ERR_INVALID, "cuda sample: missing buffers");
  if ((size_t)n_rows * (size_t)vocab > (size_t)INT_MAX * 4)
    return sm_err(SMELT_ERR_LIMIT, "cuda sample: %d rows of %d logits", n_rows, vocab);
  if (dev < 0 || dev >= MAX_DEV) return sm_err(SMELT_ERR_INVALID, "cuda sample: device %d", dev);
  pthread_mutex_lock(&g_mu);
  if (!g_init[dev]) {
    memset(&g_ctx[dev], 0, sizeof g_ctx[dev]);
    pthread_mutex_init(&g_ctx[dev].mu, NULL);
    g_init[dev] = true;
  }
  pthread_mutex_unlock(&g_mu);
  samp_ctx *x = &g_ctx[dev];
  pthread_mutex_lock(&x->mu);
  st = run(x, logits, vocab, req, n_req, out_tokens, s, dev_dst, walk_bps > 0 ? walk_bps : 16);
  pthread_mutex_unlock(&x->mu);
  return st;
}

/* one greedy row without penalties in one kernel, for a decode graph (cu_argmax1 in cuda_sample.cuh) */
static_assert(CU_ARGMAX_SCRATCH >= ARG_MAX_SPLIT, "argmax scratch");
int cu_argmax_split(int V, int *chunk) {
  int nsplit = SM_MIN(ARG_MAX_SPLIT, SM_MAX(1, (V + ARG_CHUNK - 1) / ARG_CHUNK));
  *chunk = (((V + nsplit - 1) / nsplit) + 3) & ~3;
  return (V + *chunk - 1) / *chunk;
}
void cu_argmax1(const cu_ctx *cx, const float *logits, int V, float *pv, int *pi, unsigned *cnt, int32_t *dev_dst,
                int32_t *host_dst) {
  int chunk = 0;
  const int nsplit = cu_argmax_split(V, &chunk);
  cu_launch(cx, k_argmax, dim3((unsigned)nsplit, 1u), dim3(ARG_T), 0, (const dreq *)NULL, logits, V, nsplit, chunk, pv,
            pi, cnt, dev_dst, host_dst);
}
