/* CUDA backend: implements the sm_backend op table (backend.h) on one NVIDIA GPU.
 *
 * - Weights are uploaded once in prepare_weight (2/4/8-bit repacked for 16-byte lane loads,
 *   scales+biases interleaved; see cuda_internal.h).
 * - Decode matmuls (n <= 8; n <= 16 for large 4-bit weights, which run int8-activation dp4a
 *   kernels) use the matvec kernels in cuda_mv.cu; larger n dequantizes tiles of the weight
 *   to bf16 and runs a cuBLAS GEMM.
 * - Every op is issued on one stream. For small batches (decode steps) the ops of a
 *   forward are recorded between set_batch and the next download/sync and replayed as a
 *   CUDA graph once the same op sequence has been seen twice; the batch metadata lives
 *   in fixed device buffers that set_batch refreshes with one async copy from pinned
 *   memory, so a replay reads the new tokens/positions. No model-code hooks are needed. */
#include "backend/cuda/cuda_internal.h"
#include "backend/sample_math.h"
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATT_TQ 16           /* batch tokens per attention tile */
#define GRAPH_MAX_TOKENS 64 /* batches up to this size are recorded for graph replay */
#define N_GRAPHS 8
#define N_SEEN 16
#define DEQ_BYTES ((size_t)128 << 20)

enum {
  OP_EMBED, OP_MATMUL, OP_RMSNORM, OP_ROPE, OP_KVSTORE, OP_ATTN, OP_SILU, OP_GELU, OP_ADD, OP_ADDROWS,
  OP_SCALE, OP_SOFTCAP, OP_GATHER, OP_ARGMAX, OP_META
};

/* OP_META: the batch metadata of a fed one-token step as kernel parameters (no upload): cnt[k]
 * values to dst + off[k], taken in order from v */
#define META_MAXV 960
typedef struct {
  int32_t off[5], cnt[5];
  int32_t v[META_MAXV];
} cu_meta_blob;

typedef struct {
  int type, n;
  int i0, i1, i2, i3, i4;
  float f0, f1, f2;
  const void *p0, *p1, *p2, *p3, *p4;
  size_t sz;
} cu_op;

typedef struct {
  uint64_t hash;
  int n_ops;
  cu_op *ops;
  cudaGraphExec_t exec;
  uint64_t last_use;
  cudaGraph_t graph;          /* kept while meta_node refers to it */
  cudaGraphNode_t meta_node;  /* its OP_META kernel, whose parameters each replay sets */
} cu_graph;

typedef struct {
  sm_backend base;
  int dev, n_sm;
  size_t smem_optin;
  cudaStream_t s;
  cublasHandle_t blas;
  void *blas_ws;
  /* host copy of the current batch */
  int n_tokens, n_seqs, max_blocks, n_out, n_tiles;
  int32_t *h_meta; /* pinned: tokens, pos, seq, out_rows, tiles, table */
  int32_t *d_meta;
  size_t meta_cap; /* int32 elements */
  int32_t *d_tokens, *d_pos, *d_seq, *d_out, *d_tiles, *d_table;
  int32_t *h_pos, *h_tiles; /* views into h_meta */
  cudaEvent_t meta_ev;
  bool meta_ev_live;
  /* pipelined decode (be_sample_async): the sampled token is written straight into the token
   * slot of the batch metadata (d_feed = d_meta when it was issued); its two host copies
   * (pinned) and their events */
  int32_t *d_feed, *h_feed;
  cudaEvent_t feed_ev[2];
  bool feed_live[2];
  int feed_next;
  /* scratch */
  float *part; size_t part_cap;       /* attention partials (floats) */
  int *att_cnt; size_t att_cnt_cap;   /* decode attention split counters (zero between launches) */
  void *x16; size_t x16_cap;          /* activations as bf16/f16 (bytes) */
  void *deq; size_t deq_cap;          /* dequantized weight tile (bytes) */
  void *xq; size_t xq_cap;            /* int8-quantized activations for CW_Q4 matvecs (bytes) */
  void *xq2; size_t xq2_cap;          /* second one: silu(gate)*up written by the gate/up kernel */
  int *glu_cnt; size_t glu_cnt_cap;   /* gate/up chunk counters (zero between launches) */
  float *ssp; size_t ssp_cap;         /* deferred rmsnorm: partial sums of squares (cu_mlp_dnorm) */
  /* greedy sample_async inside the decode graph (OP_ARGMAX, SMELT_CUDA_GSAMPLE): cu_argmax1's scratch */
  float *am_pv; int *am_pi; unsigned *am_cnt;
  /* recording / graphs */
  bool rec;
  cu_op *ops; int n_ops, cap_ops;
  cu_graph graphs[N_GRAPHS];
  uint64_t seen[N_SEEN]; int n_seen_next;
  uint64_t tick;
  bool graphs_on;
  bool failed;
  /* SMELT_CUDA_PROFILE=1: graphs off, every op timed with events, table printed at destroy */
  int prof;
  int att_dec; /* one-token-per-sequence batches: 1 (default) k_attn_dec2 (cuda_attn.cu), 2 the older
                  k_attn_dec, 0 the tiled k_attn (SMELT_CUDA_ATTN_DEC=0/2) */
  int q4_fuse; /* norm kernels write the int8 x of a following CW_Q4 matvec (SMELT_CUDA_NORMQ=0: off) */
  int q4; /* CW_Q4 for 4-bit weights: 0 never, 1 large ones (default), 2 all (SMELT_CUDA_Q4=0/1) */
  int carve; /* g_cu_carve while this backend's ops launch: SMELT_CUDA_CARVE, else 72 once a CW_Q4 weight is
              * uploaded (the one-token int8 kernels), else -1 (bf16 models: the per-kernel defaults measured faster) */
  bool carve_env;
  cudaEvent_t pe0, pe1;
  struct { char label[64]; double ms; long count; } pt[96];
  int n_pt;
  long st_graph_launch, st_capture, st_eager_fwd;
  /* SMELT_CUDA_STATS=1: GPU time of graph replays and of the download after them, host time in flush */
  int stats;
  cudaEvent_t se0, se1, se2;
  int st_pending; /* 1: se0/se1 around a graph launch, 2: also se2 after the download */
  double st_graph_ms, st_dl_ms, st_flush_us;
  double t_ret, t_setb, st_outside_us, st_rec_us, st_wait_us; /* host: after a sync, at set_batch */
  long st_steps;
  /* SMELT_CUDA_TL=1 (diagnostic): GPU timeline of pipelined decode steps, events per feed slot:
   * 0 before the batch upload, 1 after it, 2 / 3 around the graph, 4 after sampling, 5 after the
   * token download; tl_sum: upload, gap to the graph, graph, sampling, download, step period (ms) */
  int gsample; /* SMELT_CUDA_GSAMPLE=0: greedy sample_async as its own launch and a download */
  int gmeta;   /* SMELT_CUDA_GMETA=0: fed steps upload their metadata instead of OP_META */
  cu_meta_blob meta_blob; /* the current fed step's (OP_META) */
  int tl;
  cudaEvent_t tle[2][6];
  bool tl_rec[2][6];
  double tl_sum[6];
  long tl_n;
  long st_timed;
} cuda_be;

static cuda_be *CB(sm_backend *be) { return (cuda_be *)be; }
int g_cu_pdl = 1;
/* SMELT_CUDA_SKIP (diagnostic, wrong results): bit mask of decode kernels not launched, to measure
 * what each costs inside the graph: 1 norms, 2 attention, 4 q/k/v, 8 o, 16 gate/up, 32 down, 64 lm_head,
 * 128 the silu(gate)*up epilogue of gate/up */
static int g_cu_skip = 0;
/* SMELT_CUDA_SKIP2 (diagnostic, wrong results; fusions stay on): 1 the add + rmsnorm after k_mlp1,
 * 2 the q/k/v matvec, 4 decode attention (rope-fused), 8 the o matvec */
static int g_sk2 = 0;
/* SMELT_CUDA_PF (MB): decode attention prefetches that much of the next gate weight (at most half of
 * it) into L2 after reading K/V, while the memory is otherwise idle (8B 4-bit: 2.42 vs 2.45 ms a step
 * with 8 MB on the H100; 0 = off) */
static size_t g_cu_pf_bytes = (size_t)8 << 20;
static size_t g_cu_pf_min = (size_t)32 << 20; /* SMELT_CUDA_PF_MIN (MB): smallest gate weight it is used for */
extern int g_cu_q4role_rb[CU_Q4_ROLES], g_cu_q4role_tl[CU_Q4_ROLES], g_cu_q4role_pf[CU_Q4_ROLES];
/* SMELT_CUDA_ATTN_LONG: from this many positions on (longest sequence of the batch), decode
 * attention combines its splits through global memory instead of a cluster (measured faster from
 * ~2,000 on the H100, docs/benchmarks.md; 0: never) */
static int g_cu_attn_long = 2048;
/* SMELT_CUDA_GLU=1: the gate/up kernel also writes silu(gate)*up quantized (per-chunk counter
 * epilogue); default: a separate quantization kernel before the down projection (measured faster
 * on the H100, docs/benchmarks.md) */
static int g_cu_glu = 0;
extern int g_cu_mvr, g_cu_mvr_nw, g_cu_mvr_rt, g_cu_mvr_glu, g_cu_mlp, g_cu_mlp_bar, g_cu_dnorm;
extern int g_cu_guq, g_cu_guq_norm, g_cu_mvt_dyn, g_cu_mvt, g_cu_mvt_kb, g_cu_mvt_bps, g_cu_mvt_nw, g_cu_mvt_r, g_cu_mvt_stage;
extern int g_cu_attn_rsc;
extern int g_cu_wef, g_cu_attn_kvef;
extern int g_cu_attn_oldm, g_cu_attn_rs, g_cu_attn_nw, g_cu_q4hint, g_cu_attn_trig, g_cu_attn_hoist, g_cu_attn_stg, g_cu_attn_cw, g_cu_attn_unr, g_cu_q4minb, g_cu_attn_cl, g_cu_attn_hw, g_cu_attn_b, g_cu_q4cfg, g_cu_mv2_rb, g_cu_mv2_tl, g_cu_attn_s, g_cu_q4long, g_cu_q4warps;

static void prof_begin(cuda_be *c) { if (c->prof) cudaEventRecord(c->pe0, c->s); }
static void prof_end(cuda_be *c, const char *label) {
  if (!c->prof) return;
  cudaEventRecord(c->pe1, c->s);
  cudaEventSynchronize(c->pe1);
  float ms = 0;
  cudaEventElapsedTime(&ms, c->pe0, c->pe1);
  int i;
  for (i = 0; i < c->n_pt; i++) if (!strcmp(c->pt[i].label, label)) break;
  if (i == c->n_pt) {
    if (c->n_pt == 96) return;
    snprintf(c->pt[c->n_pt++].label, sizeof c->pt[0].label, "%s", label);
  }
  c->pt[i].ms += ms;
  c->pt[i].count++;
}
static void prof_print(cuda_be *c) {
  if (c->prof) {
    double tot = 0;
    for (int i = 0; i < c->n_pt; i++) tot += c->pt[i].ms;
    fprintf(stderr, "cuda profile (ms total, calls, us/call):\n");
    for (int i = 0; i < c->n_pt; i++) {
      int b = i;
      for (int j = i + 1; j < c->n_pt; j++) if (c->pt[j].ms > c->pt[b].ms) b = j;
      if (b != i) { auto t = c->pt[i]; c->pt[i] = c->pt[b]; c->pt[b] = t; }
      fprintf(stderr, "  %-44s %9.2f %7ld %9.1f  %4.1f%%\n", c->pt[i].label, c->pt[i].ms, c->pt[i].count,
              1000.0 * c->pt[i].ms / (double)c->pt[i].count, 100.0 * c->pt[i].ms / (tot > 0 ? tot : 1));
    }
  }
  if (c->prof || getenv("SMELT_CUDA_STATS"))
    fprintf(stderr, "cuda stats: graph replays timed %ld: GPU %.3f ms/replay, download after it %.3f ms, host flush %.1f us\n",
            c->st_timed, c->st_timed ? c->st_graph_ms / c->st_timed : 0.0, c->st_timed ? c->st_dl_ms / c->st_timed : 0.0,
            c->st_graph_launch ? c->st_flush_us / c->st_graph_launch : 0.0);
  if (c->stats && c->st_steps)
    fprintf(stderr, "cuda stats: %ld steps, host us/step: outside the backend %.1f, set_batch..flush %.1f, "
            "set_batch..sync return %.1f\n", c->st_steps, c->st_outside_us / c->st_steps, c->st_rec_us / c->st_steps,
            c->st_wait_us / c->st_steps);
  if (c->tl && c->tl_n)
    fprintf(stderr, "cuda timeline: %ld pipelined steps, GPU us/step: upload %.1f, to graph start %.1f, graph %.1f, "
            "sampling %.1f, token download %.1f; step period %.1f\n", c->tl_n, 1e3 * c->tl_sum[0] / c->tl_n,
            1e3 * c->tl_sum[1] / c->tl_n, 1e3 * c->tl_sum[2] / c->tl_n, 1e3 * c->tl_sum[3] / c->tl_n,
            1e3 * c->tl_sum[4] / c->tl_n, 1e3 * c->tl_sum[5] / c->tl_n);
  if (c->prof || getenv("SMELT_CUDA_STATS"))
    fprintf(stderr, "cuda stats: graph launches %ld, captures %ld, eager recorded forwards %ld\n", c->st_graph_launch,
            c->st_capture, c->st_eager_fwd);
}

static bool ck(cuda_be *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  if (!c->failed) fprintf(stderr, "smelt cuda: %s: %s\n", what, cudaGetErrorString(e));
  c->failed = true;
  sm_err(SMELT_ERR_BACKEND, "cuda: %s: %s", what, cudaGetErrorString(e));
  return false;
}

/* ================= kernels ================= */
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* no early trigger: kernels of the step read batch metadata before their own wait, so the next
 * kernel starts only once this one has completed */
__global__ void k_meta_set(int32_t *__restrict__ dst, const cu_meta_blob b) {
  int base = 0;
#pragma unroll
  for (int k = 0; k < 5; k++) {
    for (int i = threadIdx.x; i < b.cnt[k]; i += blockDim.x) dst[b.off[k] + i] = b.v[base + i];
    base += b.cnt[k];
  }
}

__global__ void k_rmsnorm(float *out, const float *x, const float *w, int dim, float eps, float off) {
  const float *xr = x + (int64_t)blockIdx.x * dim;
  float *o = out + (int64_t)blockIdx.x * dim;
  float ss = 0.f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) ss = fmaf(xr[j], xr[j], ss);
  __shared__ float red[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(red[0] / (float)dim + eps);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * inv * (w[j] + off);
}

/* x += a (residual add), then out = rmsnorm(x): one block per row */
__global__ void k_add_rmsnorm(float *out, float *x, const float *a, const float *w, int dim, float eps, float off) {
  float *xr = x + (int64_t)blockIdx.x * dim;
  const float *ar = a + (int64_t)blockIdx.x * dim;
  float *o = out + (int64_t)blockIdx.x * dim;
  float ss = 0.f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = xr[j] + ar[j];
    xr[j] = v;
    ss = fmaf(v, v, ss);
  }
  __shared__ float red[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(red[0] / (float)dim + eps);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * inv * (w[j] + off);
}

__global__ void k_rope(float *x, const int32_t *pos, const float *inv, int n_tokens, int nh, int hd, int half) {
  int64_t total = (int64_t)n_tokens * nh * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    int i = (int)(idx % half);
    int64_t th = idx / half;
    int t = (int)(th / nh);
    float a = (float)pos[t] * inv[i], sn, cs;
    sincosf(a, &sn, &cs);
    float *v = x + th * hd;
    float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * cs - x1 * sn;
    v[i + half] = x0 * sn + x1 * cs;
  }
}

static __device__ __forceinline__ int64_t kv_slot(const int32_t *table, int max_blocks, int bs, int nblocks, int s,
                                                  int p) {
  if (p < 0) return -1;
  int bi = p / bs;
  if (bi >= max_blocks) return -1;
  int blk = table[(int64_t)s * max_blocks + bi];
  if (blk < 0 || blk >= nblocks) return -1;
  return (int64_t)blk * bs + p % bs;
}

__global__ void k_kv_store(float *K, float *V, const float *k, const float *v, const int32_t *pos, const int32_t *seq,
                           const int32_t *table, int n_tokens, int row, int max_blocks, int bs, int nblocks) {
  int64_t total = (int64_t)n_tokens * row;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    int t = (int)(idx / row), e = (int)(idx % row);
    int64_t sl = kv_slot(table, max_blocks, bs, nblocks, seq[t], pos[t]);
    if (sl < 0) continue;
    K[sl * row + e] = k[idx];
    V[sl * row + e] = v[idx];
  }
}


/* rope(q) + rope(k) + kv_store(k, v) of one decode/prefill step in one launch (same math
 * as k_rope and k_kv_store). Index space: q rotation pairs, then every k/v element. */
__global__ void k_rope_qk_store(float *q, float *k, const float *v, float *Kc, float *Vc, const int32_t *pos,
                                const int32_t *seq, const int32_t *table, const float *invq, const float *invk,
                                int n_tokens, int nh, int nkv, int hd, int halfq, int halfk, int max_blocks, int bs,
                                int nblocks) {
  const int64_t nq = (int64_t)n_tokens * nh * halfq, row = (int64_t)nkv * hd;
  const int64_t total = nq + (int64_t)n_tokens * row;
  pdl_trigger();
  pdl_wait();
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    if (idx < nq) {
      int i = (int)(idx % halfq);
      int64_t th = idx / halfq;
      int t = (int)(th / nh);
      float a = (float)pos[t] * invq[i], sn, cs;
      sincosf(a, &sn, &cs);
      float *x = q + th * hd;
      float x0 = x[i], x1 = x[i + halfq];
      x[i] = x0 * cs - x1 * sn;
      x[i + halfq] = x0 * sn + x1 * cs;
      continue;
    }
    const int64_t j = idx - nq;
    const int t = (int)(j / row), e = (int)(j % row), d = e % hd;
    const int64_t sl = kv_slot(table, max_blocks, bs, nblocks, seq[t], pos[t]);
    if (sl >= 0) Vc[sl * row + e] = v[j];
    if (d < halfk) {
      float a = (float)pos[t] * invk[d], sn, cs;
      sincosf(a, &sn, &cs);
      float x0 = k[j], x1 = k[j + halfk];
      float r0 = x0 * cs - x1 * sn, r1 = x0 * sn + x1 * cs;
      k[j] = r0;
      k[j + halfk] = r1;
      if (sl >= 0) { Kc[sl * row + e] = r0; Kc[sl * row + e + halfk] = r1; }
    } else if (d >= 2 * halfk) {
      if (sl >= 0) Kc[sl * row + e] = k[j];
    }
  }
}

/* Tiled attention: block = (tile of <= ATT_TQ consecutive same-sequence tokens, kv head,
 * split z of the key range). Keys/values of 32 positions at a time are staged in shared
 * memory and shared by all rows (token x query head of the group) of the tile. */
template <int NDIM, int RMAX>
__global__ void k_attn(float *__restrict__ out, float *__restrict__ part, const float *__restrict__ q,
                       const float *__restrict__ Kc, const float *__restrict__ Vc, const int32_t *__restrict__ pos,
                       const int32_t *__restrict__ seq, const int32_t *__restrict__ table,
                       const int32_t *__restrict__ tiles, int max_blocks, int bs, int nblocks, int n_heads, int nkv,
                       int hd, float scale, int window, float softcap, int S) {
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  const int tile = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
  const int t0 = tiles[tile], t1 = tiles[tile + 1];
  const int G = n_heads / nkv, rows = (t1 - t0) * G, rows_max = ATT_TQ * G;
  const int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hdp = hd + 4, row_stride = nkv * hd;
  float *Ks = sm, *Vs = Ks + 32 * hdp, *Qs = Vs + 32 * hd, *Ps = Qs + rows_max * hd;
  int *slots = (int *)(Ps + nw * 32);
  const int sq = seq[t0];
  int lo = 0x7fffffff, hi = -1;
  for (int t = t0; t < t1; t++) {
    int p = pos[t], l = window > 0 ? max(0, p - window + 1) : 0;
    lo = min(lo, l);
    hi = max(hi, p);
  }
  const int nblk = (hi - lo + 32) / 32, per = (nblk + S - 1) / S;
  const int kb0 = z * per, kb1 = min(nblk, kb0 + per);
  for (int idx = threadIdx.x; idx < rows * hd; idx += blockDim.x) {
    int r = idx / hd, d = idx % hd;
    int t = t0 + r / G, h = kvh * G + r % G;
    Qs[idx] = q[((int64_t)t * n_heads + h) * hd + d] * scale;
  }
  const int per_pass = nw * RMAX;
  __syncthreads();
  for (int rbase = 0; rbase < rows; rbase += per_pass) {
  float acc[RMAX][NDIM], m[RMAX], l[RMAX];
  int rlo[RMAX], rhi[RMAX];
#pragma unroll
  for (int k = 0; k < RMAX; k++) {
    m[k] = -INFINITY;
    l[k] = 0.f;
#pragma unroll
    for (int i = 0; i < NDIM; i++) acc[k][i] = 0.f;
    int r = rbase + warp + k * nw;
    rlo[k] = 0;
    rhi[k] = -1;
    if (r < rows) {
      int p = pos[t0 + r / G];
      rhi[k] = p;
      rlo[k] = window > 0 ? max(0, p - window + 1) : 0;
    }
  }
  const int hd4 = hd >> 2;
  for (int kb = kb0; kb < kb1; kb++) {
    const int p0 = lo + kb * 32;
    __syncthreads();
    if (threadIdx.x < 32) {
      int p = p0 + threadIdx.x;
      slots[threadIdx.x] = p <= hi ? (int)kv_slot(table, max_blocks, bs, nblocks, sq, p) : -1;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < 32 * hd4; idx += blockDim.x) {
      int j = idx / hd4, d4 = idx % hd4;
      int sl = slots[j];
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
      if (sl >= 0) {
        int64_t o = (int64_t)sl * row_stride + (int64_t)kvh * hd + 4 * d4;
        kv = __ldg((const float4 *)(Kc + o));
        vv = __ldg((const float4 *)(Vc + o));
      }
      *(float4 *)(Ks + j * hdp + 4 * d4) = kv;
      *(float4 *)(Vs + j * hd + 4 * d4) = vv;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < RMAX; k++) {
      const int r = rbase + warp + k * nw;
      if (r < rows && p0 <= rhi[k] && p0 + 31 >= rlo[k]) {
        const int p = p0 + lane;
        const bool valid = slots[lane] >= 0 && p >= rlo[k] && p <= rhi[k];
        const float4 *qr = (const float4 *)(Qs + r * hd), *kr = (const float4 *)(Ks + lane * hdp);
        float s = 0.f;
        for (int d4 = 0; d4 < hd4; d4++) {
          float4 a = qr[d4], b = kr[d4];
          s = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, s))));
        }
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        s = valid ? s : -INFINITY;
        const float mx = warp_max(s);
        if (mx != -INFINITY) {
          const float mn = fmaxf(m[k], mx);
          const float corr = m[k] == -INFINITY ? 0.f : expf(m[k] - mn);
          const float pe = valid ? expf(s - mn) : 0.f;
          l[k] = l[k] * corr + warp_sum(pe);
          m[k] = mn;
          Ps[warp * 32 + lane] = pe;
          __syncwarp();
          float a[NDIM];
#pragma unroll
          for (int i = 0; i < NDIM; i++) a[i] = acc[k][i] * corr;
          for (int j = 0; j < 32; j++) {
            const float pj = Ps[warp * 32 + j];
            const float *vr = Vs + j * hd;
#pragma unroll
            for (int i = 0; i < NDIM; i++) {
              const int d = lane + 32 * i;
              if (d < hd) a[i] = fmaf(pj, vr[d], a[i]);
            }
          }
#pragma unroll
          for (int i = 0; i < NDIM; i++) acc[k][i] = a[i];
          __syncwarp();
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < RMAX; k++) {
    const int r = rbase + warp + k * nw;
    if (r < rows) {
      const int t = t0 + r / G, h = kvh * G + r % G;
      if (S == 1) {
        const float inv = l[k] > 0.f ? 1.f / l[k] : 0.f;
        float *o = out + ((int64_t)t * n_heads + h) * hd;
#pragma unroll
        for (int i = 0; i < NDIM; i++) {
          int d = lane + 32 * i;
          if (d < hd) o[d] = acc[k][i] * inv;
        }
      } else {
        float *pp = part + (((int64_t)t * n_heads + h) * S + z) * (hd + 2);
        if (lane == 0) { pp[0] = m[k]; pp[1] = l[k]; }
#pragma unroll
        for (int i = 0; i < NDIM; i++) {
          int d = lane + 32 * i;
          if (d < hd) pp[2 + d] = acc[k][i];
        }
      }
    }
  }
  }
}

/* Decode attention: every token is alone in its tile (n_tiles == n_tokens: one token per
 * sequence). Block = (token, kv head, split z of the key range); 128 threads handle all G
 * query heads of the group, so each K/V row is read once (16-byte loads). Per tile of
 * AD_TP positions: scores by 8-thread groups (one position each, G dots), online softmax by
 * one warp per head, then P.V with one float4 of d per thread. With S > 1 splits the last
 * block of a (token, kv head) (atomic counter, reset by it) combines the partials, so the
 * op is one kernel. Limits: G <= AD_GMAX, hd % 4 == 0, hd <= 256. */
#define AD_TP 32
#define AD_GMAX 8
/* KC: float4 chunks of a K row per score thread (hd/4 <= 8*KC); VJ: positions per thread in
 * the P.V phase (AD_TP / (128 / (8*KC))) */
template <int KC, int VJ>
__global__ void __launch_bounds__(128) k_attn_dec(float *__restrict__ out, float *__restrict__ part, int *__restrict__ cnt,
                                                  const float *__restrict__ q, const float *__restrict__ Kc,
                                                  const float *__restrict__ Vc, const int32_t *__restrict__ pos,
                                                  const int32_t *__restrict__ seq, const int32_t *__restrict__ table,
                                                  int max_blocks, int bs, int nblocks, int n_heads, int nkv, int hd,
                                                  float scale, int window, float softcap, int S) {
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
  const int G = n_heads / nkv, hd4 = hd >> 2, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int PG = 128 / hd4; /* position groups of the P.V phase */
  float *Qs = sm;                    /* [G][hd] */
  float *Ps = Qs + G * hd;           /* [G][AD_TP] */
  float *Ms = Ps + G * AD_TP;        /* [AD_GMAX] running max, sum, correction */
  float *Ls = Ms + AD_GMAX, *Cs = Ls + AD_GMAX;
  float *Red = Cs + AD_GMAX;         /* [PG][G][hd] */
  __shared__ int last;
  const int64_t row = (int64_t)nkv * hd;
  const int p = pos[t], sq = seq[t];
  const int lo = window > 0 ? max(0, p - window + 1) : 0;
  const int len = p - lo + 1, per = (len + S - 1) / S;
  const int a0 = lo + z * per, a1 = min(p + 1, a0 + per);
  const float *qg = q + ((int64_t)t * n_heads + (int64_t)kvh * G) * hd;
  for (int i = tid; i < G * hd; i += 128) Qs[i] = qg[i] * scale;
  if (tid < AD_GMAX) { Ms[tid] = -INFINITY; Ls[tid] = 0.f; }
  float4 acc[AD_GMAX];
#pragma unroll
  for (int g = 0; g < AD_GMAX; g++) acc[g] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int sub = tid & 7, pr = tid >> 3;          /* score phase: 16 positions per pass */
  const int d4 = tid % hd4, pg = tid / hd4;        /* P.V phase */
  const int64_t koff = (int64_t)kvh * hd;
  for (int b0 = a0; b0 < a1; b0 += AD_TP) {
    __syncthreads(); /* Qs ready / previous tile's Ps consumed */
    /* issue K and V loads of this tile */
    float4 kr[2][KC];
    int kval[2];
#pragma unroll
    for (int ps = 0; ps < 2; ps++) {
      const int pp = b0 + ps * 16 + pr;
      const int64_t sl = pp < a1 ? kv_slot(table, max_blocks, bs, nblocks, sq, pp) : -1;
      kval[ps] = sl >= 0;
      const float4 *kp = (const float4 *)(Kc + (sl >= 0 ? sl : 0) * row + koff);
#pragma unroll
      for (int c = 0; c < KC; c++) {
        const int ch = sub + 8 * c;
        kr[ps][c] = (sl >= 0 && ch < hd4) ? __ldg(kp + ch) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    float4 vr[VJ];
    bool vv[VJ];
#pragma unroll
    for (int k = 0; k < VJ; k++) {
      const int j = pg + k * PG, pp = b0 + j;
      int64_t sl = -1;
      if (pg < PG && j < AD_TP && pp < a1) sl = kv_slot(table, max_blocks, bs, nblocks, sq, pp);
      vv[k] = sl >= 0;
      vr[k] = sl >= 0 ? __ldg((const float4 *)(Vc + sl * row + koff) + d4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    /* scores */
#pragma unroll
    for (int ps = 0; ps < 2; ps++) {
      const int j = ps * 16 + pr;
#pragma unroll
      for (int g = 0; g < AD_GMAX; g++) {
        if (g < G) {
          const float4 *qr = (const float4 *)(Qs + g * hd);
          float s = 0.f;
#pragma unroll
          for (int c = 0; c < KC; c++) {
            const int ch = sub + 8 * c;
            if (ch < hd4) {
              const float4 a = qr[ch], b = kr[ps][c];
              s = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, s))));
            }
          }
          s += __shfl_xor_sync(0xffffffffu, s, 4);
          s += __shfl_xor_sync(0xffffffffu, s, 2);
          s += __shfl_xor_sync(0xffffffffu, s, 1);
          if (softcap > 0.f) s = softcap * tanhf(s / softcap);
          if (sub == 0) Ps[g * AD_TP + j] = kval[ps] ? s : -INFINITY;
        }
      }
    }
    __syncthreads();
    /* online softmax, one warp per head */
    for (int g = warp; g < G; g += 4) {
      const float s = Ps[g * AD_TP + lane];
      const float mx = warp_max(s), mo = Ms[g];
      const float mn = fmaxf(mo, mx);
      float corr = 1.f, pe = 0.f;
      if (mn != -INFINITY) {
        corr = mo == -INFINITY ? 0.f : expf(mo - mn);
        pe = s == -INFINITY ? 0.f : expf(s - mn);
      }
      const float ps = warp_sum(pe);
      Ps[g * AD_TP + lane] = pe;
      if (lane == 0) { Ms[g] = mn; Ls[g] = Ls[g] * corr + ps; Cs[g] = corr; }
    }
    __syncthreads();
    if (pg < PG) {
#pragma unroll
      for (int g = 0; g < AD_GMAX; g++) {
        if (g < G) {
          const float cr = Cs[g];
          float4 a = acc[g];
          a.x *= cr; a.y *= cr; a.z *= cr; a.w *= cr;
#pragma unroll
          for (int k = 0; k < VJ; k++) {
            const int j = pg + k * PG;
            if (vv[k]) {
              const float pj = Ps[g * AD_TP + j];
              a.x = fmaf(pj, vr[k].x, a.x); a.y = fmaf(pj, vr[k].y, a.y);
              a.z = fmaf(pj, vr[k].z, a.z); a.w = fmaf(pj, vr[k].w, a.w);
            }
          }
          acc[g] = a;
        }
      }
    }
  }
  /* reduce the position groups */
  __syncthreads();
  if (pg < PG) {
#pragma unroll
    for (int g = 0; g < AD_GMAX; g++)
      if (g < G) *(float4 *)(Red + ((int64_t)pg * G + g) * hd + 4 * d4) = acc[g];
  }
  __syncthreads();
  for (int i = tid; i < G * hd; i += 128) {
    const int g = i / hd, d = i % hd;
    float o = 0.f;
    for (int k = 0; k < PG; k++) o += Red[((int64_t)k * G + g) * hd + d];
    const int h = kvh * G + g;
    if (S == 1) {
      const float L = Ls[g];
      out[((int64_t)t * n_heads + h) * hd + d] = L > 0.f ? o / L : 0.f;
    } else {
      float *pp = part + (((int64_t)t * n_heads + h) * S + z) * (hd + 2);
      if (d == 0) { pp[0] = Ms[g]; pp[1] = Ls[g]; }
      pp[2 + d] = o;
    }
  }
  if (S == 1) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(cnt + (int64_t)t * nkv + kvh, 1) == S - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = tid; i < G * hd; i += 128) {
    const int g = i / hd, d = i % hd, h = kvh * G + g;
    const float *pp = part + ((int64_t)t * n_heads + h) * S * (hd + 2);
    float M = -INFINITY;
    for (int zz = 0; zz < S; zz++) M = fmaxf(M, __ldcg(pp + zz * (hd + 2)));
    float L = 0.f, o = 0.f;
    if (M != -INFINITY) {
      for (int zz = 0; zz < S; zz++) {
        const float mz = __ldcg(pp + zz * (hd + 2));
        if (mz == -INFINITY) continue;
        const float wz = expf(mz - M);
        L += __ldcg(pp + zz * (hd + 2) + 1) * wz;
        o += __ldcg(pp + zz * (hd + 2) + 2 + d) * wz;
      }
    }
    out[((int64_t)t * n_heads + h) * hd + d] = L > 0.f ? o / L : 0.f;
  }
  if (tid == 0) cnt[(int64_t)t * nkv + kvh] = 0;
}
static size_t att_dec_smem(int hd, int G) {
  const int PG = 128 / (hd / 4);
  return sizeof(float) * ((size_t)G * hd + (size_t)G * AD_TP + 3 * AD_GMAX + (size_t)PG * G * hd);
}

__global__ void k_attn_combine(float *out, const float *part, int S, int hd) {
  const float *pp = part + (int64_t)blockIdx.x * S * (hd + 2);
  float M = -INFINITY;
  for (int z = 0; z < S; z++) M = fmaxf(M, pp[z * (hd + 2)]);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float L = 0.f, o = 0.f;
    for (int z = 0; z < S; z++) {
      float mz = pp[z * (hd + 2)];
      if (mz == -INFINITY) continue;
      float wz = expf(mz - M);
      L += pp[z * (hd + 2) + 1] * wz;
      o += pp[z * (hd + 2) + 2 + d] * wz;
    }
    out[(int64_t)blockIdx.x * hd + d] = L > 0.f ? o / L : 0.f;
  }
}

#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
__global__ void k_silu_mul(float *o, const float *g, const float *u, size_t n) {
  GRID_STRIDE(i, n) { float a = g[i]; o[i] = a / (1.f + expf(-a)) * u[i]; }
}
__global__ void k_gelu_mul(float *o, const float *g, const float *u, size_t n) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  GRID_STRIDE(i, n) { float a = g[i]; o[i] = 0.5f * a * (1.f + tanhf(k0 * (a + k1 * a * a * a))) * u[i]; }
}
__global__ void k_add(float *y, const float *x, size_t n) { GRID_STRIDE(i, n) y[i] += x[i]; }
__global__ void k_add_rows(float *y, const float *b, size_t n, int dim) { GRID_STRIDE(i, n) y[i] += b[i % dim]; }
__global__ void k_scale(float *y, float s, size_t n) { GRID_STRIDE(i, n) y[i] *= s; }
__global__ void k_softcap(float *y, float cap, size_t n) {
  float inv = 1.f / cap;
  GRID_STRIDE(i, n) y[i] = cap * tanhf(y[i] * inv);
}
__global__ void k_gather(float *dst, const float *src, const int32_t *rows, int n_out, int dim) {
  size_t n = (size_t)n_out * dim;
  GRID_STRIDE(i, n) {
    size_t r = i / dim, j = i % dim;
    dst[i] = src[(size_t)rows[r] * dim + j];
  }
}
__global__ void k_to_bf16(__nv_bfloat16 *o, const float *x, size_t n) { GRID_STRIDE(i, n) o[i] = __float2bfloat16(x[i]); }
__global__ void k_to_f16(__half *o, const float *x, size_t n) {
  GRID_STRIDE(i, n) o[i] = __float2half(fminf(fmaxf(x[i], -65504.f), 65504.f));
}
/* upload helpers: natural -> fast word order, and (scale, bias) interleave */
__global__ void k_permute_words(uint32_t *dst, const uint32_t *src, int64_t rows, int64_t W) {
  int64_t total = rows * W;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / W, u = i % W;
    dst[r * W + cu_qfast_store_index(u, W)] = src[i];
  }
}
__global__ void k_pair16(uint32_t *dst, const uint16_t *s, const uint16_t *b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = (uint32_t)s[i] | ((uint32_t)(b ? b[i] : 0) << 16);
}
__global__ void k_pair32(float2 *dst, const float *s, const float *b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = make_float2(s[i], b ? b[i] : 0.f);
}

static unsigned ew_blocks(size_t n) {
  size_t b = (n + 255) / 256;
  if (b > 8192) b = 8192;
  return b ? (unsigned)b : 1;
}

/* ================= scratch / graphs ================= */
static void graphs_clear(cuda_be *c) {
  bool any = false;
  for (int i = 0; i < N_GRAPHS; i++) any |= c->graphs[i].exec != NULL;
  if (!any) return;
  cudaStreamSynchronize(c->s);
  for (int i = 0; i < N_GRAPHS; i++) {
    if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    if (c->graphs[i].graph) cudaGraphDestroy(c->graphs[i].graph);
    free(c->graphs[i].ops);
    memset(&c->graphs[i], 0, sizeof c->graphs[i]);
  }
}

static bool ensure_buf(cuda_be *c, void **p, size_t *cap, size_t need) {
  if (need <= *cap) return true;
  graphs_clear(c);
  if (*p) cudaFree(*p);
  *p = NULL;
  *cap = 0;
  size_t n = need + need / 4;
  if (!ck(c, cudaMalloc(p, n), "scratch alloc")) { *p = NULL; return false; }
  *cap = n;
  return true;
}

/* ================= ops (execution) ================= */
static void x_matmul(cuda_be *c, const sm_weight *w, const float *x, int n, float *y) {
  const cu_weight *cw = (const cu_weight *)w->dev;
  if (cu_use_matvec(cw, n)) { cu_matvec(cw, x, n, y, c->xq, c->s, c->n_sm); return; }
  const int64_t M = cw->rows, K = cw->cols;
  const float one = 1.f, zero = 0.f;
  if (cw->kind == CW_DENSE && cw->dtype == SM_DT_F32) {
    cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, n, (int)K, &one, cw->q, CUDA_R_32F, (int)K, x, CUDA_R_32F,
                 (int)K, &zero, y, CUDA_R_32F, (int)M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return;
  }
  const bool f16 = cw->kind == CW_DENSE && cw->dtype == SM_DT_F16;
  const cudaDataType dt = f16 ? CUDA_R_16F : CUDA_R_16BF;
  size_t nx = (size_t)n * K;
  if (f16) k_to_f16<<<ew_blocks(nx), 256, 0, c->s>>>((__half *)c->x16, x, nx);
  else k_to_bf16<<<ew_blocks(nx), 256, 0, c->s>>>((__nv_bfloat16 *)c->x16, x, nx);
  if (cw->kind == CW_DENSE) {
    cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, n, (int)K, &one, cw->q, dt, (int)K, c->x16, dt, (int)K,
                 &zero, y, CUDA_R_32F, (int)M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return;
  }
  int64_t chunk = (int64_t)(c->deq_cap / ((size_t)K * 2));
  if (chunk > M) chunk = M;
  if (chunk >= 128) chunk &= ~(int64_t)127;
  for (int64_t r0 = 0; r0 < M; r0 += chunk) {
    int64_t nr = M - r0 < chunk ? M - r0 : chunk;
    cu_dequant_rows(cw, r0, nr, c->deq, false, c->s);
    cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, (int)K, &one, c->deq, CUDA_R_16BF, (int)K, c->x16,
                 CUDA_R_16BF, (int)K, &zero, y + r0, CUDA_R_32F, (int)M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
}

static int att_splits(const cuda_be *c, int nkv) {
  int units = c->n_tiles * nkv;
  if (units <= 0) return 1;
  int want = 2 * c->n_sm / units, S = 1;
  while (S * 2 <= want && S < 64) S *= 2;
  return S;
}

static int g_att_maxthr[4] = { 1024, 1024, 1024, 1024 };
template <int NDIM, int RMAX> static void set_attn_smem(size_t bytes, int slot) {
  cudaFuncSetAttribute(k_attn<NDIM, RMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  cudaFuncAttributes a;
  if (cudaFuncGetAttributes(&a, k_attn<NDIM, RMAX>) == cudaSuccess && a.maxThreadsPerBlock >= 32)
    g_att_maxthr[slot] = a.maxThreadsPerBlock & ~31;
}

static size_t att_smem(int hd, int G, int nw) {
  return ((size_t)32 * (hd + 4) + (size_t)32 * hd + (size_t)ATT_TQ * G * hd + (size_t)nw * 32 + 32) * sizeof(float);
}
static int att_ndim(int hd) { return hd <= 32 ? 1 : hd <= 64 ? 2 : hd <= 128 ? 4 : 8; }
static int att_warps(int hd, int G) {
  int nd = att_ndim(hd), rmax = nd >= 8 ? 8 : 16, rows = ATT_TQ * G;
  int nw = (rows + rmax - 1) / rmax, slot = nd == 1 ? 0 : nd == 2 ? 1 : nd == 4 ? 2 : 3;
  int cap = g_att_maxthr[slot] / 32; /* rows beyond nw*RMAX are done in further passes */
  if (nw > cap) nw = cap;
  return nw < 4 ? 4 : nw;
}

static void x_attention(cuda_be *c, const cu_op *o) {
  float *out = (float *)o->p0;
  const float *q = (const float *)o->p1, *K = (const float *)o->p2, *V = (const float *)o->p3;
  const int n_heads = o->i0, nkv = o->i1, hd = o->i2, bs = o->i3, nblocks = o->i4, window = o->n;
  const float scale = o->f0, softcap = o->f1;
  if (o->sz) { /* decode kernel, o->sz splits */
    if (c->att_dec == 2) {
      const int S = (int)o->sz, G = n_heads / nkv, hd4 = hd / 4;
      dim3 grid((unsigned)c->n_tokens, (unsigned)nkv, (unsigned)S);
      const size_t smem = att_dec_smem(hd, G);
#define ATD_ARGS out, c->part, c->att_cnt, q, K, V, c->d_pos, c->d_seq, c->d_table, c->max_blocks, bs, nblocks, n_heads, \
                 nkv, hd, scale, window, softcap, S
      if (hd4 <= 8) k_attn_dec<1, 2><<<grid, 128, smem, c->s>>>(ATD_ARGS);
      else if (hd4 <= 16) k_attn_dec<2, 4><<<grid, 128, smem, c->s>>>(ATD_ARGS);
      else if (hd4 <= 32) k_attn_dec<4, 8><<<grid, 128, smem, c->s>>>(ATD_ARGS);
      else k_attn_dec<8, 16><<<grid, 128, smem, c->s>>>(ATD_ARGS);
#undef ATD_ARGS
      return;
    }
    cu_attn_decode(out, NULL, c->part, c->att_cnt, q, NULL, NULL, NULL, NULL, 0, 0, (float *)K, (float *)V, c->d_pos, c->d_seq, c->d_table, c->max_blocks, bs, nblocks,
                   c->n_tokens, n_heads, nkv, hd, scale, window, softcap, (int)o->sz, c->s);
    return;
  }
  const int G = n_heads / nkv, S = att_splits(c, nkv), nw = att_warps(hd, G);
  const size_t smem = att_smem(hd, G, nw);
  dim3 grid((unsigned)c->n_tiles, (unsigned)nkv, (unsigned)S);
#define ATT_ARGS out, c->part, q, K, V, c->d_pos, c->d_seq, c->d_table, c->d_tiles, c->max_blocks, bs, nblocks, n_heads, \
                 nkv, hd, scale, window, softcap, S
  switch (att_ndim(hd)) {
  case 1: k_attn<1, 16><<<grid, nw * 32, smem, c->s>>>(ATT_ARGS); break;
  case 2: k_attn<2, 16><<<grid, nw * 32, smem, c->s>>>(ATT_ARGS); break;
  case 4: k_attn<4, 16><<<grid, nw * 32, smem, c->s>>>(ATT_ARGS); break;
  default: k_attn<8, 8><<<grid, nw * 32, smem, c->s>>>(ATT_ARGS); break;
  }
#undef ATT_ARGS
  if (S > 1) k_attn_combine<<<c->n_tokens * n_heads, hd < 128 ? 128 : (hd > 256 ? 256 : hd), 0, c->s>>>(out, c->part, S, hd);
}

static void exec_op_(cuda_be *c, const cu_op *o);
static const char *op_names[] = { "embed", "matmul", "rmsnorm", "rope", "kv_store", "attention", "silu_mul",
                                  "gelu_mul", "add", "add_rows", "scale", "softcap", "gather_out" };
static void exec_op(cuda_be *c, const cu_op *o) {
  if (!c->prof) { exec_op_(c, o); return; }
  char lab[64];
  if (o->type == OP_MATMUL) {
    const cu_weight *w = (const cu_weight *)o->p3;
    snprintf(lab, sizeof lab, "matmul %s%d %lldx%lld n%s", w->bits ? "q" : "dense", w->bits ? w->bits : (int)w->dtype,
             (long long)w->rows, (long long)w->cols, o->n == 1 ? "=1" : o->n <= CU_MAX_N ? "<=8" : ">8");
  } else if (o->type == OP_ATTN) snprintf(lab, sizeof lab, "attention n%s", c->n_tokens == 1 ? "=1" : ">1");
  else snprintf(lab, sizeof lab, "%s", op_names[o->type]);
  prof_begin(c);
  exec_op_(c, o);
  prof_end(c, lab);
}
static void exec_op_(cuda_be *c, const cu_op *o) {
  const int nt = c->n_tokens;
  switch (o->type) {
  case OP_EMBED: cu_embed((const cu_weight *)((const sm_weight *)o->p0)->dev, c->d_tokens, nt, (float *)o->p1, c->s); break;
  case OP_MATMUL: x_matmul(c, (const sm_weight *)o->p0, (const float *)o->p1, o->n, (float *)o->p2); break;
  case OP_RMSNORM: {
    int dim = o->i0, th = dim >= 1024 ? 512 : dim >= 256 ? 256 : dim >= 64 ? 64 : 32;
    k_rmsnorm<<<o->n, th, 0, c->s>>>((float *)o->p0, (const float *)o->p1, (const float *)o->p2, dim, o->f0, o->f1);
    break;
  }
  case OP_ROPE: {
    int64_t total = (int64_t)nt * o->i0 * (o->i2 / 2);
    k_rope<<<ew_blocks((size_t)total), 256, 0, c->s>>>((float *)o->p0, c->d_pos, (const float *)o->p1, nt, o->i0,
                                                       o->i1, o->i2 / 2);
    break;
  }
  case OP_KVSTORE: {
    size_t total = (size_t)nt * o->i0;
    k_kv_store<<<ew_blocks(total), 256, 0, c->s>>>((float *)o->p0, (float *)o->p1, (const float *)o->p2,
                                                   (const float *)o->p3, c->d_pos, c->d_seq, c->d_table, nt, o->i0,
                                                   c->max_blocks, o->i1, o->i2);
    break;
  }
  case OP_ATTN: x_attention(c, o); break;
  case OP_SILU: k_silu_mul<<<ew_blocks(o->sz), 256, 0, c->s>>>((float *)o->p0, (const float *)o->p1, (const float *)o->p2, o->sz); break;
  case OP_GELU: k_gelu_mul<<<ew_blocks(o->sz), 256, 0, c->s>>>((float *)o->p0, (const float *)o->p1, (const float *)o->p2, o->sz); break;
  case OP_ADD: k_add<<<ew_blocks(o->sz), 256, 0, c->s>>>((float *)o->p0, (const float *)o->p1, o->sz); break;
  case OP_ADDROWS: k_add_rows<<<ew_blocks(o->sz), 256, 0, c->s>>>((float *)o->p0, (const float *)o->p1, o->sz, o->i0); break;
  case OP_SCALE: k_scale<<<ew_blocks(o->sz), 256, 0, c->s>>>((float *)o->p0, o->f0, o->sz); break;
  case OP_SOFTCAP: k_softcap<<<ew_blocks(o->sz), 256, 0, c->s>>>((float *)o->p0, o->f0, o->sz); break;
  case OP_META: /* p0 device metadata; the values are c->meta_blob (set per step, also in replays) */
    cu_carve((const void *)k_meta_set);
    k_meta_set<<<1, 256, 0, c->s>>>((int32_t *)o->p0, c->meta_blob);
    break;
  case OP_ARGMAX: /* p0 logits row, p1 device token, p2 mapped host token, i0 vocab */
    cu_argmax1((const float *)o->p0, o->i0, c->am_pv, c->am_pi, c->am_cnt, (int32_t *)o->p1, (int32_t *)o->p2, c->s);
    break;
  case OP_GATHER: {
    size_t n = (size_t)c->n_out * o->i0;
    if (n) k_gather<<<ew_blocks(n), 256, 0, c->s>>>((float *)o->p0, (const float *)o->p1, c->d_out, c->n_out, o->i0);
    break;
  }
  }
}

/* Is buffer p dead after op i: the next op that names it overwrites it (a matmul output
 * that does not also read it)? Conservative: false when no later op names it (the caller may
 * still download it). */
static bool dead_after(const cuda_be *c, int i, const void *p) {
  for (int j = i + 1; j < c->n_ops; j++) {
    const cu_op *o = &c->ops[j];
    if (o->type == OP_MATMUL) {
      if (o->p1 == p) return false;
      if (o->p2 == p) return true;
      continue;
    }
    if (o->type == OP_RMSNORM && o->p0 == p && o->p1 != p && o->p2 != p) return true;
    if (o->p0 == p || o->p1 == p || o->p2 == p || o->p3 == p || o->p4 == p) return false;
  }
  return false;
}

/* The norm at op i writes the int8 x of the CW_Q4 matvecs right after it (norm_feeds_q4): is its
 * float output out read by nothing else, so that the norm need not write it? The matvecs reading
 * out must all be in the one launch that reads the int8 x (as exec_ops groups them). */
static int g_cu_normout = 0; /* SMELT_CUDA_NORMOUT=1: always write it */
static bool norm_out_dead(const cuda_be *c, int i, const void *out) {
  if (g_cu_normout) return false;
  int j = i + 1;
  const cu_weight *w0 = NULL;
  while (j < c->n_ops && c->ops[j].type == OP_MATMUL && c->ops[j].p1 == out) {
    const cu_weight *w = (const cu_weight *)c->ops[j].p3;
    if (j - i > 3 || w->kind != CW_Q4 || c->ops[j].p2 == out || (w0 && !cu_matvec_compatible(w0, w))) return false;
    for (int k = i + 1; k < j; k++) if (c->ops[k].p2 == c->ops[j].p2) return false;
    w0 = w0 ? w0 : w;
    j++;
  }
  return w0 && dead_after(c, j - 1, out);
}

/* Run the recorded ops, fusing runs of matvecs that read the same x (q/k/v, gate/up). */
/* The op after the rmsnorm at index i is a CW_Q4 matvec of its output with the same rows:
 * then the norm kernel also writes the int8 x (c->xq) for it. */
static bool norm_feeds_q4(const cuda_be *c, int i) {
  if (c->q4_fuse == 0 || i + 1 >= c->n_ops) return false;
  const cu_op *r = &c->ops[i], *m = &c->ops[i + 1];
  if (m->type != OP_MATMUL || m->p1 != r->p0 || m->n != r->n) return false;
  const cu_weight *w = (const cu_weight *)m->p3;
  return w->kind == CW_Q4 && cu_use_matvec(w, m->n) && w->cols == r->i0 && c->xq &&
         c->xq_cap >= cu_q4_scratch_bytes(m->n, w->cols);
}

/* ops i.. are: x += a; out = rmsnorm(x) feeding gate/up; silu*mul; down (-> b); x += b; rmsnorm(x),
 * for one token: then the first add + rmsnorm can run inside the gate/up kernel (k_gu_q4), which
 * leaves x + a in out (dead otherwise) for the second add to read */
/* mlp: the same for k_mlp1 (gate/up, silu quantization and down in one kernel, cu_q4_mlp) */
static bool gu_norm_fusable(const cuda_be *c, int i, bool mlp = false) {
  if (g_cu_skip || i + 7 >= c->n_ops || !c->xq || !c->xq2 || !c->glu_cnt) return false;
  const cu_op *ad = &c->ops[i], *nr = &c->ops[i + 1], *g = &c->ops[i + 2], *u = &c->ops[i + 3], *sl = &c->ops[i + 4],
              *dn = &c->ops[i + 5], *ad2 = &c->ops[i + 6], *nr2 = &c->ops[i + 7];
  if (ad->type != OP_ADD || nr->type != OP_RMSNORM || g->type != OP_MATMUL || u->type != OP_MATMUL ||
      sl->type != OP_SILU || dn->type != OP_MATMUL || ad2->type != OP_ADD || nr2->type != OP_RMSNORM)
    return false;
  const void *x = ad->p0, *a = ad->p1, *out = nr->p0, *b = dn->p2;
  const int dim = nr->i0;
  if (nr->n != 1 || nr->p1 != x || (size_t)dim != ad->sz || out == x || out == a || out == b || g->p1 != out ||
      u->p1 != out || g->n != 1 || u->n != 1 || dn->n != 1 || g->p2 == u->p2 || g->p2 == out || u->p2 == out ||
      g->p2 == x || g->p2 == a || u->p2 == x || u->p2 == a)
    return false;
  const cu_weight *gw = (const cu_weight *)g->p3, *uw = (const cu_weight *)u->p3, *dw = (const cu_weight *)dn->p3;
  const bool order = sl->p1 == g->p2 && sl->p2 == u->p2, swapped = sl->p1 == u->p2 && sl->p2 == g->p2;
  if (!(order || swapped) ||
      !(mlp ? cu_q4_mlp_ok(gw, uw, (const cu_weight *)dn->p3, 1) : cu_q4_guq_norm_ok(order ? gw : uw, order ? uw : gw, 1)) ||
      gw->cols != dim ||
      sl->sz != (size_t)gw->rows || dn->p1 != sl->p0 || dw->kind != CW_Q4 || !cu_use_matvec(dw, 1) ||
      dw->cols != gw->rows || b == sl->p0 || b == x || b == out || !dead_after(c, i + 5, sl->p0) ||
      c->xq2_cap < cu_q4_scratch_bytes(1, dw->cols) || c->glu_cnt_cap < sizeof(int) * (size_t)(gw->rows / 32))
    return false;
  /* out holds x + a until the second add: nothing else reads or writes it before */
  if (!norm_out_dead(c, i + 1, out)) return false;
  if (ad2->p0 != x || ad2->p1 != b || ad2->sz != (size_t)dim || nr2->p1 != x || nr2->n != 1 || nr2->i0 != dim ||
      nr2->p0 == x || nr2->p0 == b)
    return false;
  return ((uintptr_t)x | (uintptr_t)a | (uintptr_t)out | (uintptr_t)b | (uintptr_t)nr->p2 | (uintptr_t)nr2->p2 |
          (uintptr_t)nr2->p0) % 16 == 0 && dim % 32 == 0;
}

/* ops i.. as gu_norm_fusable (k_mlp1), then the next layer's q/k/v matvecs of the second norm's
 * output: all of it in one k_mlp1 launch (SMELT_CUDA_MLP=3) */
static bool mlp_qkv_fusable(const cuda_be *c, int i) {
  if (!gu_norm_fusable(c, i, true) || i + 10 >= c->n_ops) return false;
  const cu_op *ad = &c->ops[i], *g = &c->ops[i + 2], *u = &c->ops[i + 3], *dn = &c->ops[i + 5], *nr = &c->ops[i + 1],
              *nr2 = &c->ops[i + 7];
  const void *avoid[] = { ad->p0, ad->p1, nr->p0, dn->p2, nr2->p0, g->p2, u->p2 };
  const cu_weight *ws[3];
  for (int k = 0; k < 3; k++) {
    const cu_op *m = &c->ops[i + 8 + k];
    if (m->type != OP_MATMUL || m->p1 != nr2->p0 || m->n != 1) return false;
    for (size_t a = 0; a < SM_ARRAY_LEN(avoid); a++)
      if (m->p2 == avoid[a]) return false;
    for (int j = 0; j < k; j++)
      if (c->ops[i + 8 + j].p2 == m->p2) return false;
    ws[k] = (const cu_weight *)m->p3;
  }
  return cu_q4_mlp_qkv_ok((const cu_weight *)g->p3, ws) && norm_out_dead(c, i + 7, nr2->p0) &&
         (i + 11 >= c->n_ops || c->ops[i + 11].type != OP_MATMUL || c->ops[i + 11].p1 != nr2->p0);
}

/* the matvecs exec_ops runs as one launch from op i: consecutive matmuls of the same x and n with
 * compatible weights (q/k/v, gate/up), up to 3; their weights in ws, outputs in ys */
static int mm_group(const cuda_be *c, int i, const cu_weight **ws, float **ys) {
  const cu_op *o = &c->ops[i];
  ws[0] = (const cu_weight *)o->p3;
  ys[0] = (float *)o->p2;
  int nw = 1;
  while (nw < 3 && i + nw < c->n_ops) {
    const cu_op *p = &c->ops[i + nw];
    if (p->type != OP_MATMUL || p->p1 != o->p1 || p->n != o->n || p->p2 == o->p1) break;
    const cu_weight *pw = (const cu_weight *)p->p3;
    if (!cu_matvec_compatible(ws[0], pw)) break;
    bool alias = false;
    for (int k = 0; k < nw; k++) alias |= ys[k] == (float *)p->p2;
    if (alias) break;
    ws[nw] = pw;
    ys[nw] = (float *)p->p2;
    nw++;
  }
  return nw;
}
static int mm_role(const cu_weight *const *ws, int nw) {
  return nw == 3 ? CU_Q4_QKV : nw == 2 ? CU_Q4_GU : nw == 1 && ws[0]->rows >= 32768 ? CU_Q4_LM : nw == 1 ? CU_Q4_O : -1;
}
/* ops i.. as gu_norm_fusable (k_mlp1), and the second rmsnorm (i + 7) only feeds one k_mvq4 launch of
 * 3 matvecs (q/k/v): k_mlp1 can do the add before it and leave its int8 x un-normalized
 * (cu_mlp_dnorm), that launch applying the rms */
static bool mlp_dnorm_fusable(const cuda_be *c, int i) {
  if (g_sk2 || g_cu_skip || i + 8 >= c->n_ops || !c->ssp) return false;
  const cu_op *g = &c->ops[i + 2], *u = &c->ops[i + 3], *dn = &c->ops[i + 5], *nr2 = &c->ops[i + 7];
  if (!cu_q4_mlp_dnorm_ok((const cu_weight *)g->p3, (const cu_weight *)u->p3, (const cu_weight *)dn->p3) ||
      !norm_feeds_q4(c, i + 7) || !norm_out_dead(c, i + 7, nr2->p0) ||
      c->ssp_cap < sizeof(float) * (size_t)(nr2->i0 / 32) || nr2->i0 % 32 || ((uintptr_t)nr2->p2 & 15))
    return false;
  const cu_weight *ws[3];
  float *ys[3];
  const int nw = mm_group(c, i + 8, ws, ys);
  return nw == 3 && c->ops[i + 8].n == 1 && cu_q4_dnorm_ok(ws, nw, mm_role(ws, nw));
}

static void exec_ops(cuda_be *c) {
  const void *preq = NULL; /* buffer whose int8 quantization the previous kernel left in c->xq */
  int preq_n = 0;
  const void *redir_x = NULL; /* gu_norm_fusable: x + a of the residual redir_x is in redir_src */
  const float *redir_src = NULL;
  bool predn = false; /* c->xq is un-normalized (cu_mlp_dnorm): the rms of dn_dim, dn_eps is applied by its reader */
  int dn_dim = 0;
  float dn_eps = 0.f;
  g_cu_carve = c->carve;
  for (int i = 0; i < c->n_ops;) {
    const cu_op *o = &c->ops[i];
    const void *pre = preq;
    const int pre_n = preq_n;
    const bool pre_dn = predn;
    preq = NULL;
    predn = false;
    if (o->type == OP_RMSNORM) {
      const bool q = norm_feeds_q4(c, i);
      prof_begin(c);
      if ((g_cu_skip & 1) || cu_norm_q(q && norm_out_dead(c, i, o->p0) ? NULL : (float *)o->p0, (float *)o->p1, NULL, (const float *)o->p2, o->n, o->i0, o->f0, o->f1,
                    q ? c->xq : NULL, c->s)) {
        prof_end(c, q ? "rmsnorm+quant" : "rmsnorm");
        if (q) { preq = o->p0; preq_n = o->n; }
        i++;
        continue;
      }
    }
    /* silu_mul whose output only feeds the next (decode) matmul: fuse into its x load */
    if (o->type == OP_SILU && i + 1 < c->n_ops && c->ops[i + 1].type == OP_MATMUL && c->ops[i + 1].n == 1 &&
        c->ops[i + 1].p1 == o->p0 && c->ops[i + 1].p2 != o->p1 && c->ops[i + 1].p2 != o->p2 &&
        c->ops[i + 1].p2 != o->p0) {
      const cu_op *m = &c->ops[i + 1];
      const cu_weight *cw = (const cu_weight *)m->p3;
      if (o->sz == (size_t)cw->cols && dead_after(c, i + 1, o->p0)) {
        prof_begin(c);
        bool done = cu_matvec_silu(cw, (const float *)o->p1, (const float *)o->p2, 1, (float *)m->p2, c->xq, c->s, c->n_sm);
        if (done) {
          if (c->prof) {
            char lab[64];
            snprintf(lab, sizeof lab, "silu+matvec %lldx%lld", (long long)cw->rows, (long long)cw->cols);
            prof_end(c, lab);
          }
          i += 2;
          continue;
        }
      }
    }
    /* decode attention whose output feeds a CW_Q4 matvec (o projection): it also writes the int8 x */
    if (o->type == OP_ATTN && o->sz && c->att_dec == 1 && o->i2 % 32 == 0 && i + 1 < c->n_ops) {
      const cu_op *m = &c->ops[i + 1];
      const cu_weight *w = m->type == OP_MATMUL ? (const cu_weight *)m->p3 : NULL;
      if (w && c->q4_fuse && m->p1 == o->p0 && m->n == c->n_tokens && w->kind == CW_Q4 && cu_use_matvec(w, m->n) &&
          w->cols == (int64_t)o->i0 * o->i2 && c->xq && c->xq_cap >= cu_q4_scratch_bytes(m->n, w->cols)) {
        prof_begin(c);
        if (!(g_cu_skip & 2)) cu_attn_decode((float *)o->p0, c->xq, c->part, c->att_cnt, (const float *)o->p1, NULL, NULL, NULL, NULL, 0,
                       0, (float *)o->p2, (float *)o->p3, c->d_pos, c->d_seq, c->d_table, c->max_blocks, o->i3, o->i4, c->n_tokens,
                       o->i0, o->i1, o->i2, o->f0, o->n, o->f1, (int)o->sz, c->s);
        prof_end(c, "attention n=1 +quant");
        preq = o->p0;
        preq_n = m->n;
        i++;
        continue;
      }
    }
    /* rope(q), rope(k), kv_store(k, v), decode attention (and the int8 x of a following CW_Q4
     * o projection): one kernel, when the rotated q and k are not read afterwards */
    if (o->type == OP_ROPE && c->att_dec == 1 && i + 3 < c->n_ops && c->ops[i + 1].type == OP_ROPE &&
        c->ops[i + 2].type == OP_KVSTORE && c->ops[i + 3].type == OP_ATTN && c->ops[i + 3].sz) {
      const cu_op *rk = &c->ops[i + 1], *kv = &c->ops[i + 2], *at = &c->ops[i + 3];
      const int hd = at->i2;
      if (kv->p2 == rk->p0 && at->p1 == o->p0 && at->p2 == kv->p0 && at->p3 == kv->p1 && o->i1 == hd &&
          kv->i1 == at->i3 && kv->i2 == at->i4 &&
          rk->i1 == hd && o->i0 == at->i0 && rk->i0 == at->i1 && rk->i0 * rk->i1 == kv->i0 && o->p0 != rk->p0 &&
          o->p0 != kv->p3 && rk->p0 != kv->p3 && at->p0 != o->p0 && at->p0 != rk->p0 && at->p0 != kv->p3 &&
          dead_after(c, i + 3, o->p0) && dead_after(c, i + 3, rk->p0)) {
        const cu_op *m = i + 4 < c->n_ops && c->ops[i + 4].type == OP_MATMUL ? &c->ops[i + 4] : NULL;
        const cu_weight *w = m ? (const cu_weight *)m->p3 : NULL;
        const bool xq = w && hd % 32 == 0 && c->q4_fuse && m->p1 == at->p0 && m->n == c->n_tokens &&
                        w->kind == CW_Q4 && cu_use_matvec(w, m->n) && w->cols == (int64_t)at->i0 * hd && c->xq &&
                        c->xq_cap >= cu_q4_scratch_bytes(m->n, w->cols);
        prof_begin(c);
        if (g_cu_pf_bytes) { /* L2 prefetch of the first bytes of the gate weight (after the o projection) */
          int nm = 0;
          for (int j = i + 4; j < c->n_ops && j < i + 12; j++) {
            const cu_op *p = &c->ops[j];
            if (p->type != OP_MATMUL) continue;
            if (++nm < 2) continue;
            const cu_weight *gw = (const cu_weight *)p->p3;
            if (gw->kind != CW_Q4 && gw->kind != CW_DENSE) break;
            const bool dn = gw->kind == CW_DENSE;
            const size_t qb = (size_t)gw->rows * (size_t)gw->cols * (dn ? sm_dtype_size(gw->dtype) : 1) / (dn ? 1 : 2);
            const size_t sbb = dn ? 0 : (size_t)gw->rows * (size_t)(gw->cols / gw->gs) * 4;
            const size_t want = g_cu_pf_bytes < qb / 2 ? g_cu_pf_bytes : qb / 2;
            if (qb >= g_cu_pf_min) /* measured to pay on the 8B shape, not on the 1B one */
              cu_attn_set_prefetch(gw->q, want, gw->sb, (size_t)((double)sbb * want / qb));
            break;
          }
        }
        if (!(g_cu_skip & 2) && !(g_sk2 & 4)) cu_attn_decode((float *)at->p0, xq ? c->xq : NULL, c->part, c->att_cnt, (const float *)o->p0,
                       (const float *)rk->p0, (const float *)kv->p3, (const float *)o->p1, (const float *)rk->p1,
                       o->i2 / 2, rk->i2 / 2, (float *)kv->p0, (float *)kv->p1, c->d_pos, c->d_seq, c->d_table,
                       c->max_blocks, at->i3, at->i4, c->n_tokens, at->i0, at->i1, hd, at->f0, at->n, at->f1,
                       (int)at->sz, c->s);
        prof_end(c, xq ? "rope+kv_store+attention n=1 +quant" : "rope+kv_store+attention n=1");
        if (xq) { preq = at->p0; preq_n = m->n; }
        i += 4;
        continue;
      }
    }
    /* rope(q), rope(k), kv_store(k, v): one kernel */
    if (o->type == OP_ROPE && i + 2 < c->n_ops && c->ops[i + 1].type == OP_ROPE && c->ops[i + 2].type == OP_KVSTORE) {
      const cu_op *rk = &c->ops[i + 1], *kv = &c->ops[i + 2];
      if (kv->p2 == rk->p0 && o->i1 == rk->i1 && rk->i0 * rk->i1 == kv->i0 && o->p0 != rk->p0 && o->p0 != kv->p3 &&
          rk->p0 != kv->p3) {
        const int nt = c->n_tokens;
        const size_t total = (size_t)nt * o->i0 * (o->i2 / 2) + (size_t)nt * kv->i0;
        prof_begin(c);
        cu_launch(k_rope_qk_store, dim3(ew_blocks(total)), dim3(256), 0, c->s,
            (float *)o->p0, (float *)rk->p0, (const float *)kv->p3, (float *)kv->p0, (float *)kv->p1, c->d_pos,
            c->d_seq, c->d_table, (const float *)o->p1, (const float *)rk->p1, nt, o->i0, rk->i0, o->i1, o->i2 / 2,
            rk->i2 / 2, c->max_blocks, kv->i1, kv->i2);
        prof_end(c, "rope q+k+kv_store");
        i += 3;
        continue;
      }
    }
    if (o->type == OP_MATMUL && cu_use_matvec((const cu_weight *)o->p3, o->n)) {
      const bool pq = pre == o->p1 && pre_n == o->n && ((const cu_weight *)o->p3)->kind == CW_Q4;
      const cu_weight *ws[3];
      float *ys[3];
      const int nw = mm_group(c, i, ws, ys);
      /* gate/up pair whose silu(gate)*up only feeds the next (CW_Q4) matvec: the gate/up kernel
       * writes it quantized (c->xq2) and the down projection reads that */
      const bool mlp = pq && nw == 2 && !g_cu_skip && i + 3 < c->n_ops && c->ops[i + 3].type == OP_MATMUL &&
                       cu_q4_mlp_ok(ws[0], ws[1], (const cu_weight *)c->ops[i + 3].p3, o->n) && cu_mlp_claim(c->s);
      if (pq && nw == 2 && (g_cu_glu || mlp || cu_q4_guq_ok(ws[0], ws[1], o->n)) && i + 3 < c->n_ops && c->ops[i + 2].type == OP_SILU && c->ops[i + 3].type == OP_MATMUL) {
        const cu_op *sl = &c->ops[i + 2], *dn = &c->ops[i + 3];
        const cu_weight *dw = (const cu_weight *)dn->p3;
        const bool order = sl->p1 == ys[0] && sl->p2 == ys[1], swapped = sl->p1 == ys[1] && sl->p2 == ys[0];
        if ((order || swapped) && sl->sz == (size_t)o->n * (size_t)ws[0]->rows && dn->p1 == sl->p0 && dn->n == o->n &&
            dw->kind == CW_Q4 && cu_use_matvec(dw, dn->n) && dw->cols == ws[0]->rows && dn->p2 != sl->p0 &&
            dead_after(c, i + 3, sl->p0) && (mlp || cu_q4_glu_ok(ws[0], ws[1], o->n)) && c->xq2 &&
            c->xq2_cap >= cu_q4_scratch_bytes(o->n, dw->cols) && c->glu_cnt &&
            c->glu_cnt_cap >= sizeof(int) * (size_t)(ws[0]->rows / 32)) {
          const cu_weight *gu[2] = { order ? ws[0] : ws[1], order ? ws[1] : ws[0] };
          float *gy[2] = { order ? ys[0] : ys[1], order ? ys[1] : ys[0] };
          if (mlp) { /* gate/up, the quantization of h and down in one persistent kernel */
            prof_begin(c);
            const bool ran = cu_q4_mlp(gu[0], gu[1], dw, gy[0], gy[1], (float *)dn->p2, c->xq, c->xq2, c->s);
            prof_end(c, "fused mlp (gate/up + silu quant + down)");
            if (ran) {
              i += 4;
              continue;
            }
          }
          prof_begin(c);
          if (!(g_cu_skip & 16))
            cu_q4_matvec_preq(gu, gy, 2, o->n, c->xq, c->s, (g_cu_skip & 128) ? NULL : c->glu_cnt, c->xq2, CU_Q4_GU);
          prof_end(c, "gate/up + silu quant");
          prof_begin(c);
          if (!(g_cu_skip & 32)) cu_q4_matvec_preq(&dw, (float *const *)&dn->p2, 1, dn->n, c->xq2, c->s, NULL, NULL, CU_Q4_DN);
          prof_end(c, "down (preq)");
          i += 4;
          continue;
        }
      }
      if (nw > 1 || pq) {
        prof_begin(c);
        const int role = mm_role(ws, nw);
        const int sk = role == CU_Q4_QKV ? 4 : role == CU_Q4_O ? 8 : role == CU_Q4_GU ? 16 : role == CU_Q4_LM ? 64 : 0;
        if (pq && ((g_cu_skip & sk) || ((g_sk2 & 2) && role == CU_Q4_QKV) || ((g_sk2 & 8) && role == CU_Q4_O))) { /* diagnostic: not launched */ }
        else if (pq) {
          if (pre_dn) cu_q4_set_dnorm(c->ssp, dn_dim / 32, dn_eps, dn_dim); /* mlp_dnorm_fusable: k_mvq4 */
          cu_q4_matvec_preq(ws, ys, nw, o->n, c->xq, c->s, NULL, NULL, role);
        }
        else cu_matvec_multi(ws, ys, nw, (const float *)o->p1, o->n, c->xq, c->s, c->n_sm);
        if (c->prof) {
          char lab[64];
          snprintf(lab, sizeof lab, "%s matvec x%d %lldx%lld n%d", pq ? "preq" : "fused", nw, (long long)ws[0]->rows,
                   (long long)ws[0]->cols, o->n);
          prof_end(c, lab);
        }
        i += nw;
        continue;
      }
    }
    if (g_cu_mlp == 3 && redir_x != o->p0 && mlp_qkv_fusable(c, i) && cu_mlp_claim(c->s)) { /* add + rmsnorm + MLP + add + rmsnorm + q/k/v: one kernel */
      const cu_op *nr = &c->ops[i + 1], *g = &c->ops[i + 2], *u = &c->ops[i + 3], *sl = &c->ops[i + 4],
                  *dn = &c->ops[i + 5], *nr2 = &c->ops[i + 7];
      const bool order = sl->p1 == g->p2;
      const cu_op *go = order ? g : u, *uo = order ? u : g;
      cu_gu_norm nm = { (const float *)o->p0, (const float *)o->p1, (const float *)nr->p2, nr->f1, nr->f0, (float *)nr->p0 };
      cu_mlp_qkv qk;
      for (int k = 0; k < 3; k++) {
        qk.w[k] = (const cu_weight *)c->ops[i + 8 + k].p3;
        qk.y[k] = (float *)c->ops[i + 8 + k].p2;
      }
      qk.xres = (float *)o->p0;
      qk.nw = (const float *)nr2->p2;
      qk.off = nr2->f1;
      qk.eps = nr2->f0;
      prof_begin(c);
      const bool ran = cu_q4_mlp((const cu_weight *)go->p3, (const cu_weight *)uo->p3, (const cu_weight *)dn->p3,
                                 (float *)go->p2, (float *)uo->p2, (float *)dn->p2, NULL, c->xq2, c->s, &nm, &qk);
      prof_end(c, "fused add+rmsnorm+mlp+add+rmsnorm+qkv");
      if (ran) {
        i += 11;
        continue;
      }
    }
    if (g_cu_mlp >= 2 && redir_x != o->p0 && gu_norm_fusable(c, i, true) && cu_mlp_claim(c->s)) { /* add + rmsnorm + the whole MLP: one kernel */
      const cu_op *nr = &c->ops[i + 1], *g = &c->ops[i + 2], *u = &c->ops[i + 3], *sl = &c->ops[i + 4],
                  *dn = &c->ops[i + 5];
      const bool order = sl->p1 == g->p2;
      const cu_op *go = order ? g : u, *uo = order ? u : g;
      cu_gu_norm nm = { (const float *)o->p0, (const float *)o->p1, (const float *)nr->p2, nr->f1, nr->f0, (float *)nr->p0 };
      if (mlp_dnorm_fusable(c, i)) { /* and the add + rmsnorm after it, the rms applied by q/k/v */
        const cu_op *nr2 = &c->ops[i + 7];
        cu_mlp_dnorm dz = { (float *)o->p0, (const float *)nr2->p2, nr2->f1, c->xq, c->ssp };
        prof_begin(c);
        const bool ran = cu_q4_mlp((const cu_weight *)go->p3, (const cu_weight *)uo->p3, (const cu_weight *)dn->p3,
                                   (float *)go->p2, (float *)uo->p2, (float *)dn->p2, NULL, c->xq2, c->s, &nm, NULL, &dz);
        prof_end(c, "fused add+rmsnorm+mlp+add+quant");
        if (ran) {
          preq = nr2->p0;
          preq_n = 1;
          predn = true;
          dn_dim = nr2->i0;
          dn_eps = nr2->f0;
          i += 8;
          continue;
        }
      }
      prof_begin(c);
      const bool ran = cu_q4_mlp((const cu_weight *)go->p3, (const cu_weight *)uo->p3, (const cu_weight *)dn->p3,
                                 (float *)go->p2, (float *)uo->p2, (float *)dn->p2, NULL, c->xq2, c->s, &nm);
      prof_end(c, "fused add+rmsnorm+mlp");
      if (ran) {
        redir_x = o->p0;
        redir_src = (const float *)nr->p0;
        i += 6;
        continue;
      }
    }
    if (g_cu_guq_norm && gu_norm_fusable(c, i)) {
      const cu_op *nr = &c->ops[i + 1], *g = &c->ops[i + 2], *u = &c->ops[i + 3], *sl = &c->ops[i + 4],
                  *dn = &c->ops[i + 5];
      const bool order = sl->p1 == g->p2;
      const cu_weight *gu[2] = { (const cu_weight *)(order ? g : u)->p3, (const cu_weight *)(order ? u : g)->p3 };
      float *gy[2] = { (float *)(order ? g : u)->p2, (float *)(order ? u : g)->p2 };
      const cu_weight *dw = (const cu_weight *)dn->p3;
      cu_gu_norm nm = { (const float *)o->p0, (const float *)o->p1, (const float *)nr->p2, nr->f1, nr->f0, (float *)nr->p0 };
      prof_begin(c);
      cu_q4_matvec_preq(gu, gy, 2, 1, c->xq, c->s, c->glu_cnt, c->xq2, CU_Q4_GU, &nm);
      prof_end(c, "add+rmsnorm+gate/up+silu quant");
      prof_begin(c);
      cu_q4_matvec_preq(&dw, (float *const *)&dn->p2, 1, 1, c->xq2, c->s, NULL, NULL, CU_Q4_DN);
      prof_end(c, "down (preq)");
      redir_x = o->p0;
      redir_src = (const float *)nr->p0;
      i += 6;
      continue;
    }
    if (o->type == OP_ADD && i + 1 < c->n_ops) {
      const cu_op *p = &c->ops[i + 1];
      if (p->type == OP_RMSNORM && p->p1 == o->p0 && (size_t)p->n * (size_t)p->i0 == o->sz && p->p0 != o->p0 &&
          p->p0 != o->p1) {
        int dim = p->i0, th = dim >= 1024 ? 512 : dim >= 256 ? 256 : dim >= 64 ? 64 : 32;
        const bool q = norm_feeds_q4(c, i + 1);
        prof_begin(c);
        const float *src = redir_x == o->p0 ? redir_src : NULL; /* set: this cu_norm_q was checked to run */
        redir_x = NULL;
        if ((g_cu_skip & 1) || ((g_sk2 & 1) && src) || cu_norm_q(q && norm_out_dead(c, i + 1, p->p0) ? NULL : (float *)p->p0, (float *)o->p0, (const float *)o->p1, (const float *)p->p2, p->n, dim, p->f0,
                      p->f1, q ? c->xq : NULL, c->s, src)) {
          if (q) { preq = p->p0; preq_n = p->n; }
        } else {
          k_add_rmsnorm<<<p->n, th, 0, c->s>>>((float *)p->p0, (float *)o->p0, (const float *)o->p1,
                                               (const float *)p->p2, dim, p->f0, p->f1);
        }
        prof_end(c, q ? "add+rmsnorm+quant" : "add+rmsnorm");
        i += 2;
        continue;
      }
    }
    exec_op(c, o);
    i++;
  }
}

/* hash of the recorded ops (a key for the graph cache; matches are confirmed with memcmp):
 * 8 bytes at a time */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = (const uint8_t *)p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
    h ^= h >> 29;
  }
  for (; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ULL; }
  return h;
}

static void tl_mark(cuda_be *c, int e) {
  if (!c->tl) return;
  const int k = c->feed_next;
  if (e == 0)
    for (int i = 0; i < 6; i++) c->tl_rec[k][i] = false;
  cudaEventRecord(c->tle[k][e], c->s);
  c->tl_rec[k][e] = true;
}
/* after the token of slot k is in: add its step's segments; the period runs to the next step's
 * upload (recorded before this wait) */
static void tl_collect(cuda_be *c, int k) {
  if (!c->tl) return;
  for (int i = 0; i < 6; i++)
    if (!c->tl_rec[k][i]) return;
  if (!c->tl_rec[1 - k][0]) return;
  float t[6];
  for (int i = 0; i < 5; i++)
    if (cudaEventElapsedTime(&t[i], c->tle[k][i], c->tle[k][i + 1]) != cudaSuccess) { cudaGetLastError(); return; }
  cudaEventSynchronize(c->tle[1 - k][0]);
  if (cudaEventElapsedTime(&t[5], c->tle[k][0], c->tle[1 - k][0]) != cudaSuccess || t[5] <= 0) { cudaGetLastError(); return; }
  for (int i = 0; i < 6; i++) c->tl_sum[i] += t[i];
  c->tl_n++;
}

static void flush(cuda_be *c) {
  if (!c->rec) return;
  c->rec = false;
  if (c->n_ops == 0) return;
  const double t_flush = c->stats ? sm_now() : 0;
  if (c->stats && c->t_setb > 0) c->st_rec_us += (t_flush - c->t_setb) * 1e6;
  int dims[5] = { c->n_tokens, c->n_seqs, c->max_blocks, c->n_out, c->n_tiles };
  uint64_t h = fnv(0xcbf29ce484222325ULL, dims, sizeof dims);
  h = fnv(h, c->h_tiles, sizeof(int32_t) * (size_t)(c->n_tiles + 1));
  h = fnv(h, c->ops, sizeof(cu_op) * (size_t)c->n_ops);
  c->tick++;
  for (int i = 0; i < N_GRAPHS; i++) {
    cu_graph *g = &c->graphs[i];
    if (g->exec && g->hash == h && g->n_ops == c->n_ops && !memcmp(g->ops, c->ops, sizeof(cu_op) * (size_t)c->n_ops)) {
      g->last_use = c->tick;
      c->st_graph_launch++;
      if (g->meta_node) { /* this step's metadata into the graph's OP_META kernel */
        int32_t *dm = (int32_t *)c->ops[0].p0;
        void *args[2] = { &dm, &c->meta_blob };
        cudaKernelNodeParams kp = {};
        kp.func = (void *)k_meta_set;
        kp.gridDim = dim3(1);
        kp.blockDim = dim3(256);
        kp.kernelParams = args;
        ck(c, cudaGraphExecKernelNodeSetParams(g->exec, g->meta_node, &kp), "metadata node");
      }
      if (c->stats) cudaEventRecord(c->se0, c->s);
      tl_mark(c, 2);
      ck(c, cudaGraphLaunch(g->exec, c->s), "graph launch");
      tl_mark(c, 3);
      if (c->stats) {
        cudaEventRecord(c->se1, c->s);
        c->st_pending = 1;
        c->st_flush_us += (sm_now() - t_flush) * 1e6;
      }
      return;
    }
  }
  bool seen = false;
  for (int i = 0; i < N_SEEN; i++) seen |= c->seen[i] == h;
  if (!seen || !c->graphs_on) {
    if (!seen) { c->seen[c->n_seen_next] = h; c->n_seen_next = (c->n_seen_next + 1) % N_SEEN; }
    c->st_eager_fwd++;
    exec_ops(c);
    return;
  }
  /* second sighting: capture */
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t e = cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    exec_ops(c);
    e = cudaStreamEndCapture(c->s, &graph);
  }
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphNode_t meta_node = NULL;
  if (e == cudaSuccess && c->ops[0].type == OP_META) { /* find its kernel node (the graph is kept) */
    size_t nn = 0;
    cudaGraphGetNodes(graph, NULL, &nn);
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(nn ? nn : 1, sizeof *nodes);
    if (nodes && cudaGraphGetNodes(graph, nodes, &nn) == cudaSuccess)
      for (size_t i = 0; i < nn && !meta_node; i++) {
        cudaGraphNodeType t;
        cudaKernelNodeParams kp;
        if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel &&
            cudaGraphKernelNodeGetParams(nodes[i], &kp) == cudaSuccess && kp.func == (void *)k_meta_set)
          meta_node = nodes[i];
      }
    free(nodes);
    cudaGetLastError();
    if (!meta_node && exec) { cudaGraphExecDestroy(exec); exec = NULL; e = cudaErrorUnknown; }
  }
  if (graph && !meta_node) { cudaGraphDestroy(graph); graph = NULL; }
  if (e != cudaSuccess) {
    cudaGetLastError();
    c->graphs_on = false; /* capture unsupported here: run eagerly from now on */
    exec_ops(c);
    return;
  }
  int slot = 0;
  for (int i = 0; i < N_GRAPHS; i++) {
    if (!c->graphs[i].exec) { slot = i; break; }
    if (c->graphs[i].last_use < c->graphs[slot].last_use) slot = i;
  }
  cu_graph *g = &c->graphs[slot];
  if (g->exec) { cudaStreamSynchronize(c->s); cudaGraphExecDestroy(g->exec); }
  if (g->graph) cudaGraphDestroy(g->graph);
  free(g->ops);
  g->graph = graph;
  g->meta_node = meta_node;
  g->exec = exec;
  g->hash = h;
  g->n_ops = c->n_ops;
  g->ops = (cu_op *)malloc(sizeof(cu_op) * (size_t)c->n_ops);
  memcpy(g->ops, c->ops, sizeof(cu_op) * (size_t)c->n_ops);
  g->last_use = c->tick;
  c->st_capture++;
  ck(c, cudaGraphLaunch(exec, c->s), "graph launch");
}

static void submit(cuda_be *c, const cu_op *o) {
  if (!c->rec) { exec_op(c, o); return; }
  if (c->n_ops == c->cap_ops) {
    c->cap_ops = c->cap_ops ? 2 * c->cap_ops : 1024;
    c->ops = (cu_op *)sm_xrealloc(c->ops, sizeof(cu_op) * (size_t)c->cap_ops);
  }
  c->ops[c->n_ops++] = *o;
}

/* ================= sm_backend entry points ================= */
static void *be_alloc(sm_backend *be, size_t bytes) {
  cuda_be *c = CB(be);
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) { cudaGetLastError(); return NULL; }
  (void)c;
  return p;
}
static void be_free(sm_backend *be, void *p) {
  cuda_be *c = CB(be);
  if (!p) return;
  flush(c);
  graphs_clear(c);
  cudaFree(p);
}
static void be_upload(sm_backend *be, void *dst, const void *src, size_t n) {
  cuda_be *c = CB(be);
  if (!n) return;
  flush(c);
  ck(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->s), "upload");
}
/* after a sync: add the timed graph replay (and download) to the stats */
static void stats_collect(cuda_be *c) {
  if (c->stats) {
    const double now = sm_now();
    if (c->t_setb > 0) { c->st_wait_us += (now - c->t_setb) * 1e6; c->st_steps++; c->t_setb = 0; }
    c->t_ret = now;
  }
  if (!c->st_pending) return;
  float a = 0, b = 0;
  if (cudaEventElapsedTime(&a, c->se0, c->se1) == cudaSuccess) {
    c->st_graph_ms += a;
    c->st_timed++;
    if (c->st_pending == 2 && cudaEventElapsedTime(&b, c->se1, c->se2) == cudaSuccess) c->st_dl_ms += b;
  }
  cudaGetLastError();
  c->st_pending = 0;
}
static void be_download(sm_backend *be, void *dst, const void *src, size_t n) {
  cuda_be *c = CB(be);
  flush(c);
  if (n) ck(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->s), "download");
  if (c->st_pending) { cudaEventRecord(c->se2, c->s); c->st_pending = 2; }
  ck(c, cudaStreamSynchronize(c->s), "sync");
  stats_collect(c);
}
static void be_sync(sm_backend *be) {
  cuda_be *c = CB(be);
  flush(c);
  ck(c, cudaStreamSynchronize(c->s), "sync");
  stats_collect(c);
}

/* ===== sample op (device sampling; kernels in cuda_sample.cu) ===== */
/* Runs the recorded forward (flush), then samples on the stream from the logits it left on the
 * device; only the token ids are copied back. */
static smelt_status be_sample(sm_backend *be, const float *logits, int n_rows, int vocab, const sm_sample_req *req,
                              int n_req, int32_t *out_tokens) {
  cuda_be *c = CB(be);
  flush(c);
  smelt_status st = cu_sample(logits, n_rows, vocab, req, n_req, out_tokens, c->s, c->dev);
  stats_collect(c); /* the step ends here, as at a download */
  return st;
}
int g_cu_gsample_count = 0; /* greedy sample_async calls that took the in-graph argmax (tests) */
static smelt_status be_sample_async(sm_backend *be, const float *logits, int n_rows, int vocab,
                                    const sm_sample_req *req, int *slot) {
  cuda_be *c = CB(be);
  if (!c->h_feed) {
    if (cudaMallocHost(&c->h_feed, 16) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->feed_ev[0], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->feed_ev[1], cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      if (c->h_feed) cudaFreeHost(c->h_feed);
      c->h_feed = NULL;
      return sm_err(SMELT_ERR_BACKEND, "cuda: pipelined sampling buffers");
    }
  }
  const int k = c->feed_next;
  if (c->feed_live[k]) return sm_err(SMELT_ERR_INVALID, "cuda: two sample_async results not waited for");
  if (!c->d_meta) return sm_err(SMELT_ERR_INVALID, "cuda: sample_async before any batch");
  /* the token slot of the batch metadata (section 0, see be_set_batch): the next step's input */
  c->d_feed = c->d_meta;
  int ncand = 0;
  if (c->gsample && c->rec && n_rows >= 1 && req->row >= 0 && req->row < n_rows && req->n_pen == 0 &&
      sm_sample_plan(req->temperature, req->top_k, req->top_p, vocab, &ncand) == SM_SAMPLE_GREEDY) {
    /* greedy: the argmax joins the recorded forward (one graph with it), the token is written to
     * the next step's input and to the mapped pinned slot: no separate launch, no download */
    if (!c->am_cnt) {
      if (cudaMalloc(&c->am_pv, sizeof(float) * CU_ARGMAX_SCRATCH) != cudaSuccess ||
          cudaMalloc(&c->am_pi, sizeof(int) * CU_ARGMAX_SCRATCH) != cudaSuccess ||
          cudaMalloc(&c->am_cnt, sizeof(unsigned)) != cudaSuccess || cudaMemset(c->am_cnt, 0, sizeof(unsigned)) != cudaSuccess) {
        cudaGetLastError();
        return sm_err(SMELT_ERR_OOM, "cuda: argmax scratch");
      }
    }
    cu_op o;
    memset(&o, 0, sizeof o);
    o.type = OP_ARGMAX;
    o.p0 = logits + (size_t)req->row * (size_t)vocab;
    o.p1 = c->d_feed;
    o.p2 = c->h_feed + k;
    o.i0 = vocab;
    submit(c, &o);
    flush(c);
    g_cu_gsample_count++;
    tl_mark(c, 4);
    if (!ck(c, cudaEventRecord(c->feed_ev[k], c->s), "event")) return SMELT_ERR_BACKEND;
    tl_mark(c, 5);
    c->feed_live[k] = true;
    c->feed_next = 1 - k;
    *slot = k;
    return SMELT_OK;
  }
  flush(c);
  smelt_status st = cu_sample(logits, n_rows, vocab, req, 1, NULL, c->s, c->dev, c->d_feed);
  if (st) return st;
  tl_mark(c, 4);
  if (!ck(c, cudaMemcpyAsync(c->h_feed + k, c->d_feed, 4, cudaMemcpyDeviceToHost, c->s), "token download") ||
      !ck(c, cudaEventRecord(c->feed_ev[k], c->s), "event"))
    return SMELT_ERR_BACKEND;
  tl_mark(c, 5);
  c->feed_live[k] = true;
  c->feed_next = 1 - k;
  *slot = k;
  return SMELT_OK;
}
static smelt_status be_sample_wait(sm_backend *be, int slot, int32_t *token) {
  cuda_be *c = CB(be);
  if (slot < 0 || slot > 1 || !c->feed_live[slot]) return sm_err(SMELT_ERR_INVALID, "cuda: no sample in slot %d", slot);
  c->feed_live[slot] = false;
  if (!ck(c, cudaEventSynchronize(c->feed_ev[slot]), "sample wait")) return SMELT_ERR_BACKEND;
  *token = c->h_feed[slot];
  tl_collect(c, slot);
  return SMELT_OK;
}
/* ===== end of the sample op ===== */

static bool weight_ok(const sm_weight *w) {
  if (!w || !w->data || w->rows <= 0 || w->cols <= 0 || w->rows > INT32_MAX || w->cols > INT32_MAX) return false;
  if (w->bits == 0) return w->dtype == SM_DT_F32 || w->dtype == SM_DT_F16 || w->dtype == SM_DT_BF16;
  if (!(w->bits == 2 || w->bits == 3 || w->bits == 4 || w->bits == 5 || w->bits == 6 || w->bits == 8)) return false;
  if (!(w->group_size == 32 || w->group_size == 64 || w->group_size == 128)) return false;
  if (w->cols % w->group_size || !w->scales) return false;
  return w->dtype == SM_DT_F32 || w->dtype == SM_DT_F16 || w->dtype == SM_DT_BF16;
}

static void release_cw(cu_weight *cw) {
  if (!cw) return;
  if (cw->q) cudaFree(cw->q);
  if (cw->sb) cudaFree(cw->sb);
  free(cw);
}

static smelt_status be_prepare_weight(sm_backend *be, sm_weight *w) {
  cuda_be *c = CB(be);
  if (!w) return sm_err(SMELT_ERR_INVALID, "cuda: NULL weight");
  if (!weight_ok(w))
    return sm_err(SMELT_ERR_UNSUPPORTED, "cuda: unsupported weight (rows %lld cols %lld bits %d group %d dtype %d)",
                  (long long)w->rows, (long long)w->cols, w->bits, w->group_size, (int)w->dtype);
  flush(c);
  cu_weight *cw = (cu_weight *)sm_xcalloc(1, sizeof *cw);
  cw->rows = w->rows; cw->cols = w->cols; cw->bits = w->bits; cw->gs = w->group_size; cw->dtype = w->dtype;
  cw->sbk = w->dtype == SM_DT_F32 ? SBK_F32 : w->dtype == SM_DT_F16 ? SBK_F16 : SBK_BF16;
  const size_t es = sm_dtype_size(w->dtype);
  /* All uploads go through c->s: a plain cudaMemcpy from pageable memory may return before
   * its DMA lands, and c->s (non-blocking) does not wait for the legacy stream. */
  void *tmp = NULL, *ts = NULL, *tb = NULL;
  smelt_status st = SMELT_OK;
  if (w->bits == 0) {
    size_t bytes = (size_t)w->rows * (size_t)w->cols * es;
    cw->kind = CW_DENSE;
    if (cudaMalloc(&cw->q, bytes) != cudaSuccess) goto oom;
    if (!ck(c, cudaMemcpyAsync(cw->q, w->data, bytes, cudaMemcpyHostToDevice, c->s), "weight upload")) goto fail;
    if (!ck(c, cudaStreamSynchronize(c->s), "weight upload")) goto fail;
  } else {
    const size_t bytes = (size_t)w->rows * (size_t)w->cols * (size_t)w->bits / 8;
    const int64_t G = w->cols / w->group_size, nsb = w->rows * G;
    cw->kind = (w->bits == 2 || w->bits == 4 || w->bits == 8) ? CW_QFAST : CW_QGEN;
    /* 4-bit: natural word order for the int8-activation dp4a kernels (cuda_mv.cu k_mvq4) when
     * the weight is large (>= 32Mi elements: gate/up/down/lm_head of an 8B model); smaller ones
     * keep the permuted fp32 kernel, faster at n = 1 there (bench/cuda/mvbench.cu, benchmarks.md).
     * SMELT_CUDA_Q4=0: never, =1: every 4-bit weight. */
    if (w->bits == 4 && (c->q4 == 2 || (c->q4 == 1 && w->rows * w->cols >= ((int64_t)1 << 20)))) cw->kind = CW_Q4;
    if (cw->kind == CW_Q4 && !c->carve_env) c->carve = 72;
    if (cudaMalloc(&cw->q, bytes) != cudaSuccess) goto oom;
    if (cw->kind == CW_QFAST) {
      if (cudaMalloc(&tmp, bytes) != cudaSuccess) goto oom;
      if (!ck(c, cudaMemcpyAsync(tmp, w->data, bytes, cudaMemcpyHostToDevice, c->s), "weight upload")) goto fail;
      const int64_t W = w->cols * w->bits / 32;
      k_permute_words<<<ew_blocks(bytes / 4), 256, 0, c->s>>>((uint32_t *)cw->q, (const uint32_t *)tmp, w->rows, W);
    } else if (!ck(c, cudaMemcpyAsync(cw->q, w->data, bytes, cudaMemcpyHostToDevice, c->s), "weight upload")) goto fail;
    const size_t sbytes = (size_t)nsb * es;
    if (cudaMalloc(&cw->sb, (size_t)nsb * (cw->sbk == SBK_F32 ? 8 : 4)) != cudaSuccess) goto oom;
    if (cudaMalloc(&ts, sbytes) != cudaSuccess) goto oom;
    if (w->biases && cudaMalloc(&tb, sbytes) != cudaSuccess) goto oom;
    if (!ck(c, cudaMemcpyAsync(ts, w->scales, sbytes, cudaMemcpyHostToDevice, c->s), "scales upload")) goto fail;
    if (tb && !ck(c, cudaMemcpyAsync(tb, w->biases, sbytes, cudaMemcpyHostToDevice, c->s), "biases upload")) goto fail;
    if (cw->sbk == SBK_F32)
      k_pair32<<<ew_blocks((size_t)nsb), 256, 0, c->s>>>((float2 *)cw->sb, (const float *)ts, (const float *)tb, nsb);
    else
      k_pair16<<<ew_blocks((size_t)nsb), 256, 0, c->s>>>((uint32_t *)cw->sb, (const uint16_t *)ts, (const uint16_t *)tb, nsb);
    if (!ck(c, cudaStreamSynchronize(c->s), "weight repack")) goto fail;
  }
  if (tmp) cudaFree(tmp);
  if (ts) cudaFree(ts);
  if (tb) cudaFree(tb);
  w->dev = cw;
  return SMELT_OK;
oom:
  cudaGetLastError();
  st = sm_err(SMELT_ERR_OOM, "cuda: out of device memory for a %lldx%lld weight", (long long)w->rows, (long long)w->cols);
  goto cleanup;
fail:
  st = SMELT_ERR_BACKEND;
cleanup:
  if (tmp) cudaFree(tmp);
  if (ts) cudaFree(ts);
  if (tb) cudaFree(tb);
  release_cw(cw);
  return st;
}

static void be_release_weight(sm_backend *be, sm_weight *w) {
  cuda_be *c = CB(be);
  if (!w || !w->dev) return;
  flush(c);
  graphs_clear(c);
  cudaStreamSynchronize(c->s);
  release_cw((cu_weight *)w->dev);
  w->dev = NULL;
}

int g_cu_gmeta_count = 0; /* fed steps whose metadata went as OP_META parameters (tests) */
static smelt_status be_set_batch(sm_backend *be, const sm_batch *b) {
  cuda_be *c = CB(be);
  flush(c);
  if (c->stats) {
    c->t_setb = sm_now();
    if (c->t_ret > 0) c->st_outside_us += (c->t_setb - c->t_ret) * 1e6;
  }
  if (c->failed) return sm_err(SMELT_ERR_BACKEND, "cuda: an earlier device error occurred");
  if (!b || b->n_tokens < 0 || b->n_seqs < 0 || b->max_blocks < 0 || b->n_out < 0)
    return sm_err(SMELT_ERR_INVALID, "cuda: bad batch");
  const int n = b->n_tokens;
  if (n > 0 && (!b->tokens || !b->pos || !b->seq)) return sm_err(SMELT_ERR_INVALID, "cuda: batch arrays missing");
  for (int t = 0; t < n; t++) {
    if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs) return sm_err(SMELT_ERR_INVALID, "cuda: token %d has bad seq %d", t, b->seq[t]);
    if (b->pos[t] < 0) return sm_err(SMELT_ERR_INVALID, "cuda: token %d has negative position", t);
  }
  const size_t nt = (size_t)b->n_seqs * (size_t)b->max_blocks;
  if (nt && !b->block_table) return sm_err(SMELT_ERR_INVALID, "cuda: block table missing");
  if (b->n_out > 0 && !b->out_rows) return sm_err(SMELT_ERR_INVALID, "cuda: out_rows missing");
  for (int i = 0; i < b->n_out; i++)
    if (b->out_rows[i] < 0 || b->out_rows[i] >= n) return sm_err(SMELT_ERR_INVALID, "cuda: out_rows[%d] out of range", i);
  /* layout: 8 equal sections: tokens, pos, seq, out_rows, tiles, then table in the last 3;
   * offsets depend only on the capacity so device pointers stay fixed across steps */
  size_t sec_need = SM_MAX((size_t)n + 1, (size_t)b->n_out);
  sec_need = SM_MAX(sec_need, (nt + 2) / 3);
  if (c->meta_ev_live) cudaEventSynchronize(c->meta_ev); /* staging buffer free again */
  if (sec_need * 8 > c->meta_cap) {
    graphs_clear(c);
    cudaStreamSynchronize(c->s);
    if (c->d_meta) cudaFree(c->d_meta);
    if (c->h_meta) cudaFreeHost(c->h_meta);
    c->d_meta = NULL; c->h_meta = NULL; c->meta_cap = 0;
    size_t cap = SM_MAX(sec_need * 16, (size_t)4096);
    if (cudaMalloc(&c->d_meta, cap * 4) != cudaSuccess || cudaMallocHost(&c->h_meta, cap * 4) != cudaSuccess) {
      cudaGetLastError();
      return sm_err(SMELT_ERR_OOM, "cuda: batch metadata");
    }
    c->meta_cap = cap;
  }
  const size_t sec = c->meta_cap / 8;
  const size_t o_tok = 0, o_pos = sec, o_seq = 2 * sec, o_out = 3 * sec, o_tiles = 4 * sec, o_table = 5 * sec;
  int32_t *h = c->h_meta;
  if (n) {
    memcpy(h + o_tok, b->tokens, (size_t)n * 4);
    memcpy(h + o_pos, b->pos, (size_t)n * 4);
    memcpy(h + o_seq, b->seq, (size_t)n * 4);
  }
  if (b->n_out) memcpy(h + o_out, b->out_rows, (size_t)b->n_out * 4);
  if (nt) memcpy(h + o_table, b->block_table, nt * 4);
  int32_t *tiles = h + o_tiles;
  int n_tiles = 0;
  for (int t = 0; t < n;) {
    int t1 = t + 1;
    while (t1 < n && t1 - t < ATT_TQ && b->seq[t1] == b->seq[t]) t1++;
    tiles[n_tiles++] = t;
    t = t1;
  }
  tiles[n_tiles] = n;
  c->n_tokens = n; c->n_seqs = b->n_seqs; c->max_blocks = b->max_blocks; c->n_out = b->n_out; c->n_tiles = n_tiles;
  c->h_pos = h + o_pos;
  c->h_tiles = tiles;
  c->d_tokens = c->d_meta + o_tok; c->d_pos = c->d_meta + o_pos; c->d_seq = c->d_meta + o_seq;
  c->d_out = c->d_meta + o_out; c->d_tiles = c->d_meta + o_tiles; c->d_table = c->d_meta + o_table;
  /* one copy covering everything used */
  size_t used = nt ? o_table + nt : o_tiles + (size_t)n_tiles + 1;
  /* fed token: token 0 is already in place (written there by the last sample_async, queued
   * before), the upload skips the token section */
  const bool feed = b->feed_token && n > 0;
  if (feed && (c->d_feed != c->d_meta || n != 1))
    return sm_err(SMELT_ERR_INVALID, "cuda: feed_token needs a one-token batch after a sample_async");
  const size_t from = feed ? o_pos : 0;
  tl_mark(c, 0);
  c->n_ops = 0;
  c->rec = (c->graphs_on || c->prof) && n > 0 && n <= GRAPH_MAX_TOKENS; /* profile: record, run eagerly */
  if (feed && c->gmeta && c->graphs_on && !c->prof && c->rec && (size_t)b->n_out + (size_t)n_tiles + 3 + nt <= META_MAXV) {
    /* the values ride as kernel parameters of the step's first op (set again in each replay) */
    cu_meta_blob *mb = &c->meta_blob;
    const size_t offs[5] = { o_pos, o_seq, o_out, o_tiles, o_table };
    const size_t cnts[5] = { 1, 1, (size_t)b->n_out, (size_t)n_tiles + 1, nt };
    int k = 0;
    for (int j = 0; j < 5; j++) {
      mb->off[j] = (int32_t)offs[j];
      mb->cnt[j] = (int32_t)cnts[j];
      memcpy(mb->v + k, h + offs[j], cnts[j] * 4);
      k += (int)cnts[j];
    }
    cu_op o;
    memset(&o, 0, sizeof o);
    o.type = OP_META;
    o.p0 = c->d_meta;
    o.i0 = b->n_out; o.i1 = n_tiles; o.i2 = (int)nt;
    o.sz = sec;
    submit(c, &o);
    g_cu_gmeta_count++;
  } else {
    if (!ck(c, cudaMemcpyAsync(c->d_meta + from, h + from, (used - from) * 4, cudaMemcpyHostToDevice, c->s),
            "batch upload"))
      return SMELT_ERR_BACKEND;
    cudaEventRecord(c->meta_ev, c->s);
    c->meta_ev_live = true;
  }
  tl_mark(c, 1);
  return SMELT_OK;
}

static bool w_ready(cuda_be *c, const sm_weight *w) {
  if (w && w->dev) return true;
  sm_err(SMELT_ERR_INVALID, "cuda: weight used before prepare_weight");
  return false;
}

static void be_embed(sm_backend *be, const sm_weight *emb, float *out) {
  cuda_be *c = CB(be);
  if (!w_ready(c, emb)) {
    if (emb && emb->cols > 0) cudaMemsetAsync(out, 0, (size_t)c->n_tokens * emb->cols * 4, c->s);
    return;
  }
  cu_op o; memset(&o, 0, sizeof o);
  o.type = OP_EMBED; o.p0 = emb; o.p1 = out;
  submit(c, &o);
}

static void be_matmul(sm_backend *be, sm_mm_role role, const sm_weight *w, const float *x, int n, float *y) {
  cuda_be *c = CB(be);
  if (n <= 0 || !w || w->rows <= 0) return;
  if (!w_ready(c, w)) { cudaMemsetAsync(y, 0, (size_t)n * w->rows * 4, c->s); return; }
  const cu_weight *cw = (const cu_weight *)w->dev;
  if (cw->kind == CW_Q4 && cu_use_matvec(cw, n)) {
    const size_t old = c->glu_cnt_cap;
    if (!ensure_buf(c, &c->xq, &c->xq_cap, cu_q4_scratch_bytes(n, cw->cols)) ||
        !ensure_buf(c, &c->xq2, &c->xq2_cap, cu_q4_scratch_bytes(n, cw->cols)) ||
        !ensure_buf(c, (void **)&c->glu_cnt, &c->glu_cnt_cap, sizeof(int) * (size_t)(cw->rows / 32 + 1)) ||
        !ensure_buf(c, (void **)&c->ssp, &c->ssp_cap, sizeof(float) * (size_t)(cw->cols / 32 + 1)))
      return;
    if (c->glu_cnt_cap != old && !ck(c, cudaMemset(c->glu_cnt, 0, c->glu_cnt_cap), "gate/up counters")) return;
  }
  if (!cu_use_matvec(cw, n) && !(cw->kind == CW_DENSE && cw->dtype == SM_DT_F32)) {
    if (!ensure_buf(c, &c->x16, &c->x16_cap, (size_t)n * cw->cols * 2)) return;
    if (cw->kind != CW_DENSE) {
      size_t want = (size_t)cw->rows * cw->cols * 2;
      size_t minb = (size_t)cw->cols * 2 * 128;
      if (want > DEQ_BYTES) want = DEQ_BYTES > minb ? DEQ_BYTES : minb;
      if (!ensure_buf(c, &c->deq, &c->deq_cap, want)) return;
    }
  }
  cu_op o; memset(&o, 0, sizeof o);
  o.type = OP_MATMUL; o.p0 = w; o.p1 = x; o.p2 = y; o.n = n;
  o.p3 = cw; /* a re-prepared weight changes the op (graph key) */
  submit(c, &o);
}

static void be_rmsnorm(sm_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps, float off) {
  cuda_be *c = CB(be);
  if (n <= 0 || dim <= 0) return;
  cu_op o; memset(&o, 0, sizeof o);
  o.type = OP_RMSNORM; o.p0 = out; o.p1 = x; o.p2 = w; o.n = n; o.i0 = dim; o.f0 = eps; o.f1 = off;
  submit(c, &o);
}

static void be_rope(sm_backend *be, float *x, int n_heads, int head_dim, int rot_dim, const float *inv_freq) {
  cuda_be *c = CB(be);
  if (rot_dim > head_dim) rot_dim = head_dim;
  rot_dim &= ~1;
  if (rot_dim < 2 || n_heads <= 0 || c->n_tokens <= 0) return;
  cu_op o; memset(&o, 0, sizeof o);
  o.type = OP_ROPE; o.p0 = x; o.p1 = inv_freq; o.i0 = n_heads; o.i1 = head_dim; o.i2 = rot_dim;
  submit(c, &o);
}

static void be_kv_store(sm_backend *be, const sm_kv_cache *kv, int layer, const float *k, const float *v) {
  cuda_be *c = CB(be);
  if (!kv || layer < 0 || layer >= kv->n_layers || kv->block_size <= 0 || c->n_tokens <= 0) return;
  cu_op o; memset(&o, 0, sizeof o);
  o.type = OP_KVSTORE; o.p0 = kv->k[layer]; o.p1 = kv->v[layer]; o.p2 = k; o.p3 = v;
  o.i0 = kv->n_kv_heads * kv->head_dim; o.i1 = kv->block_size; o.i2 = kv->n_blocks;
  submit(c, &o);
}

static void be_attention(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                         float scale, int window, float softcap) {
  cuda_be *c = CB(be);
  const int nt = c->n_tokens;
  if (nt <= 0) return;
  bool ok = kv && layer >= 0 && layer < kv->n_layers && n_heads > 0 && kv->n_kv_heads > 0 && kv->head_dim > 0 &&
            n_heads % kv->n_kv_heads == 0 && kv->head_dim % 4 == 0 && kv->head_dim <= 256 && kv->block_size > 0;
  if (ok) {
    int G = n_heads / kv->n_kv_heads, hd = kv->head_dim, nw = att_warps(hd, G);
    ok = nw <= 32 && att_smem(hd, G, nw) <= c->smem_optin;
  }
  if (!ok) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: attention shape not supported");
    if (kv && kv->head_dim > 0 && n_heads > 0) cudaMemsetAsync(out, 0, (size_t)nt * n_heads * kv->head_dim * 4, c->s);
    return;
  }
  const int G = n_heads / kv->n_kv_heads;
  int Sd = 0; /* > 0: one-token-per-sequence decode kernel with Sd splits */
  bool glong = false;
  if (c->n_tiles == nt && c->att_dec == 1 && cu_attn_dec_ok(kv->head_dim, G)) {
    Sd = cu_attn_dec_splits(nt, kv->n_kv_heads, c->n_sm);
    if (cu_attn_dec_smem(kv->head_dim, G, Sd, cu_attn_dec_warps(kv->head_dim, G)) > c->smem_optin) Sd = 0;
    if (Sd > 1 && g_cu_attn_long > 0) { /* long contexts: the global-memory split combine (a new graph) */
      int maxlen = 1;
      for (int t = 0; t < nt; t++) {
        int len = c->h_pos[t] + 1;
        if (window > 0 && len > window) len = window;
        if (len > maxlen) maxlen = len;
      }
      if (maxlen >= g_cu_attn_long) glong = true;
    }
  } else if (c->n_tiles == nt && c->att_dec == 2 && G <= AD_GMAX && kv->head_dim <= 256 &&
             att_dec_smem(kv->head_dim, G) <= 48 * 1024) { /* the previous decode kernel (SMELT_CUDA_ATTN_DEC=2) */
    int maxlen = 1;
    for (int t = 0; t < nt; t++) {
      int len = c->h_pos[t] + 1;
      if (window > 0 && len > window) len = window;
      if (len > maxlen) maxlen = len;
    }
    const int units = nt * kv->n_kv_heads;
    Sd = 1;
    while (Sd < 64 && units * Sd * 2 <= c->n_sm && Sd * 2 * AD_TP <= maxlen) Sd *= 2;
  }
  if (Sd > 1) {
    size_t need = sizeof(int) * (size_t)nt * kv->n_kv_heads, old = c->att_cnt_cap;
    if (!ensure_buf(c, (void **)&c->att_cnt, &c->att_cnt_cap, need)) return;
    if (c->att_cnt_cap != old && !ck(c, cudaMemset(c->att_cnt, 0, c->att_cnt_cap), "attention counters")) return;
  }
  const int S = Sd ? Sd : att_splits(c, kv->n_kv_heads);
  if (S > 1 && !ensure_buf(c, (void **)&c->part, &c->part_cap, sizeof(float) * (size_t)nt * n_heads * S * (kv->head_dim + 2)))
    return;
  cu_op o; memset(&o, 0, sizeof o);
  o.type = OP_ATTN; o.p0 = out; o.p1 = q; o.p2 = kv->k[layer]; o.p3 = kv->v[layer];
  o.i0 = n_heads; o.i1 = kv->n_kv_heads; o.i2 = kv->head_dim; o.i3 = kv->block_size; o.i4 = kv->n_blocks;
  o.n = window > 0 ? window : 0; o.f0 = scale; o.f1 = softcap > 0.f ? softcap : 0.f;
  o.sz = (size_t)Sd | (glong ? CU_ATTN_GLOBAL_COMBINE : 0);
  submit(c, &o);
}

static void ew(cuda_be *c, int type, float *y, const float *a, const float *b, float s, size_t n, int dim) {
  if (!n) return;
  cu_op o; memset(&o, 0, sizeof o);
  o.type = type; o.p0 = y; o.p1 = a; o.p2 = b; o.f0 = s; o.sz = n; o.i0 = dim;
  submit(c, &o);
}
static void be_silu_mul(sm_backend *be, float *out, const float *g, const float *u, size_t n) { ew(CB(be), OP_SILU, out, g, u, 0, n, 0); }
static void be_gelu_mul(sm_backend *be, float *out, const float *g, const float *u, size_t n) { ew(CB(be), OP_GELU, out, g, u, 0, n, 0); }
static void be_add(sm_backend *be, float *y, const float *x, size_t n) { ew(CB(be), OP_ADD, y, x, NULL, 0, n, 0); }
static void be_add_rows(sm_backend *be, float *y, const float *b, int n, int dim) {
  if (n <= 0 || dim <= 0) return;
  ew(CB(be), OP_ADDROWS, y, b, NULL, 0, (size_t)n * dim, dim);
}
static void be_scale(sm_backend *be, float *y, float s, size_t n) { ew(CB(be), OP_SCALE, y, NULL, NULL, s, n, 0); }
static void be_softcap(sm_backend *be, float *y, float cap, size_t n) {
  if (!(cap > 0.f)) return;
  ew(CB(be), OP_SOFTCAP, y, NULL, NULL, cap, n, 0);
}
static void be_gather_out(sm_backend *be, float *dst, const float *src, int dim) {
  cuda_be *c = CB(be);
  if (dim <= 0 || c->n_out <= 0) return;
  ew(c, OP_GATHER, dst, src, NULL, 0, 1, dim);
}

static double be_measure_bandwidth(sm_backend *be) {
  cuda_be *c = CB(be);
  flush(c);
  cudaStreamSynchronize(c->s);
  size_t bytes = (size_t)512 << 20;
  void *a = NULL, *b = NULL;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaGetLastError();
    if (a) cudaFree(a);
    return 0;
  }
  cudaMemsetAsync(a, 1, bytes, c->s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    cudaEventRecord(e0, c->s);
    for (int i = 0; i < 4; i++) cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, c->s);
    cudaEventRecord(e1, c->s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    double bw = ms > 0 ? 2.0 * bytes * 4 / (ms * 1e-3) : 0;
    if (rep > 0 && bw > best) best = bw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return best;
}

#ifdef SMELT_CUDA_TRACE
static unsigned long long *g_trace_buf;
static void trace_dump(void) {
  if (!g_trace_buf) return;
  unsigned long long t[128];
  cudaMemcpy(t, g_trace_buf, sizeof t, cudaMemcpyDeviceToHost);
  const double a0 = (double)t[16];
  const char *nm[] = { "attn block0 entry", "attn K/V batch issued", "attn after pdl_wait", "attn q ready",
                       "attn loop done", "attn before cluster sync", "attn after cluster sync", "attn combine done",
                       "attn end" };
  fprintf(stderr, "trace (launch %llu of %llu attention launches), us from attention block 0 entry:\n", t[1], t[0]);
  for (int k = 0; k < 9; k++) fprintf(stderr, "  %-28s %8.2f\n", nm[k], ((double)t[16 + k] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "q/k/v last block exit", ((double)t[40] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "o block0 entry", ((double)t[32] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "o after pdl_wait", ((double)t[33] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "attn last block exit", ((double)t[34] - a0) / 1e3);
  fprintf(stderr, "  %-28s %8.2f\n", "o block0 exit", ((double)t[35] - a0) / 1e3);
  if (t[36]) fprintf(stderr, "  %-28s %8.2f\n", "o (k_mvr) last block entry", ((double)t[36] - a0) / 1e3);
  if (t[37]) fprintf(stderr, "  %-28s %8.2f\n", "o (k_mvr) last weights in", ((double)t[37] - a0) / 1e3);
  if (t[38]) fprintf(stderr, "  %-28s %8.2f\n", "o (k_mvr) last block exit", ((double)t[38] - a0) / 1e3);
  /* the MLP kernel (k_mlp1) launch [65]: first / last block of each event, us from its first entry */
  const char *mn[] = { "entry", "after pdl_wait", "x ready (norm)", "gate/up done", "grid barrier out", "down done" };
  if (t[66] != ~0ull) {
    const double m0 = (double)t[66];
    fprintf(stderr, "mlp launch %llu (%llu block arrivals), us from its first block's entry (first / last block):\n", t[65], t[64]);
    for (int k = 0; k < 6; k++)
      if (t[66 + 2 * k] != ~0ull)
        fprintf(stderr, "  mlp %-24s %8.2f %8.2f\n", mn[k], ((double)t[66 + 2 * k] - m0) / 1e3, ((double)t[67 + 2 * k] - m0) / 1e3);
  }
}
#endif

static void be_destroy(sm_backend *be) {
  cuda_be *c = CB(be);
  if (!c) return;
  flush(c);
  cudaStreamSynchronize(c->s);
  cu_mlp_release(c->s);
  prof_print(c);
#ifdef SMELT_CUDA_TRACE
  trace_dump();
#endif
  if (c->pe0) cudaEventDestroy(c->pe0);
  if (c->pe1) cudaEventDestroy(c->pe1);
  if (c->se0) { cudaEventDestroy(c->se0); cudaEventDestroy(c->se1); cudaEventDestroy(c->se2); }
  graphs_clear(c);
  for (int i = 0; i < N_GRAPHS; i++) free(c->graphs[i].ops);
  free(c->ops);
  if (c->part) cudaFree(c->part);
  if (c->att_cnt) cudaFree(c->att_cnt);
  if (c->x16) cudaFree(c->x16);
  if (c->xq) cudaFree(c->xq);
  if (c->xq2) cudaFree(c->xq2);
  if (c->glu_cnt) cudaFree(c->glu_cnt);
  if (c->ssp) cudaFree(c->ssp);
  if (c->deq) cudaFree(c->deq);
  if (c->d_meta) cudaFree(c->d_meta);
  if (c->h_meta) cudaFreeHost(c->h_meta);
  if (c->blas) cublasDestroy(c->blas);
  if (c->blas_ws) cudaFree(c->blas_ws);
  if (c->meta_ev) cudaEventDestroy(c->meta_ev);
  if (c->am_cnt) { cudaFree(c->am_pv); cudaFree(c->am_pi); cudaFree(c->am_cnt); }
  if (c->tl)
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 6; i++) cudaEventDestroy(c->tle[k][i]);
  if (c->h_feed) {
    cudaFreeHost(c->h_feed);
    cudaEventDestroy(c->feed_ev[0]);
    cudaEventDestroy(c->feed_ev[1]);
  }
  if (c->s) cudaStreamDestroy(c->s);
  free(c);
}

extern "C" sm_backend *sm_cuda_backend_create(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    cudaGetLastError();
    sm_err(SMELT_ERR_BACKEND, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return NULL;
  }
  if (device < 0 || device >= count) {
    sm_err(SMELT_ERR_INVALID, "CUDA device %d does not exist (%d found)", device, count);
    return NULL;
  }
  if ((e = cudaSetDevice(device)) != cudaSuccess) {
    sm_err(SMELT_ERR_BACKEND, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    return NULL;
  }
  cudaDeviceProp prop;
  if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
    sm_err(SMELT_ERR_BACKEND, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    return NULL;
  }
  cuda_be *c = (cuda_be *)sm_xcalloc(1, sizeof *c);
  c->dev = device;
  c->n_sm = prop.multiProcessorCount;
  c->smem_optin = prop.sharedMemPerBlockOptin;
  c->graphs_on = true;
  const char *g = getenv("SMELT_CUDA_GRAPHS");
  if (g && !strcmp(g, "0")) c->graphs_on = false;
  const char *q4e = getenv("SMELT_CUDA_Q4");
  c->q4 = q4e && q4e[0] == '0' ? 0 : q4e && q4e[0] == '1' ? 2 : 1;
  const char *carve = getenv("SMELT_CUDA_CARVE");
  c->carve_env = carve != NULL;
  c->carve = carve ? atoi(carve) : -1;
  const char *qc = getenv("SMELT_CUDA_Q4CFG");
  g_cu_q4cfg = qc ? atoi(qc) : 0;
  const char *qw = getenv("SMELT_CUDA_Q4WARPS");
  if (qw && atoi(qw) > 0) g_cu_q4warps = atoi(qw);
  const char *ql = getenv("SMELT_CUDA_Q4LONG");
  if (ql && atoi(ql) > 0) g_cu_q4long = atoi(ql);
  const char *as = getenv("SMELT_CUDA_ATTN_S");
  g_cu_attn_s = as ? atoi(as) : 0;
  const char *ab = getenv("SMELT_CUDA_ATTN_B");
  g_cu_attn_b = ab && (atoi(ab) == 2 || atoi(ab) == 4 || atoi(ab) == 6 || atoi(ab) == 8 || atoi(ab) == 16) ? atoi(ab) : 12;
  const char *alg = getenv("SMELT_CUDA_ATTN_LONG");
  g_cu_attn_long = alg ? atoi(alg) : 2048;
  const char *aom = getenv("SMELT_CUDA_ATTN_OLDM");
  g_cu_attn_oldm = aom && aom[0] == '1';
  const char *ars = getenv("SMELT_CUDA_ATTN_RS");
  g_cu_attn_rs = !(ars && ars[0] == '0');
  const char *anw = getenv("SMELT_CUDA_ATTN_NW");
  g_cu_attn_nw = anw && (atoi(anw) == 4 || atoi(anw) == 16) ? atoi(anw) : 8;
  const char *ahw = getenv("SMELT_CUDA_ATTN_HW");
  g_cu_attn_hw = !(ahw && ahw[0] == '0');
  const char *acl = getenv("SMELT_CUDA_ATTN_CL");
  g_cu_attn_cl = prop.major < 9 ? 0 : acl ? atoi(acl) : 16;
  const char *mb = getenv("SMELT_CUDA_Q4MINB");
  g_cu_q4minb = mb ? atoi(mb) : 0;

  if (g_cu_attn_cl != 0 && g_cu_attn_cl != 2 && g_cu_attn_cl != 4 && g_cu_attn_cl != 8 && g_cu_attn_cl != 16)
    g_cu_attn_cl = 16;
  const char *m2 = getenv("SMELT_CUDA_MV2");
  if (m2) sscanf(m2, "%d,%d", &g_cu_mv2_rb, &g_cu_mv2_tl);
  const char *nq = getenv("SMELT_CUDA_NORMQ");
  c->q4_fuse = !(nq && nq[0] == '0');
  const char *ad = getenv("SMELT_CUDA_ATTN_DEC");
  c->att_dec = ad && ad[0] == '0' ? 0 : ad && ad[0] == '2' ? 2 : 1;
  const char *pr = getenv("SMELT_CUDA_PROFILE");
  if (pr && strcmp(pr, "0")) {
    c->prof = 1;
    c->graphs_on = false;
    cudaEventCreate(&c->pe0);
    cudaEventCreate(&c->pe1);
  }
#ifdef SMELT_CUDA_TRACE
  if (!g_trace_buf && cudaMalloc(&g_trace_buf, 128 * sizeof(unsigned long long)) == cudaSuccess) {
    unsigned long long init[128] = { 0 };
    const char *tl = getenv("SMELT_CUDA_TRACE_L");
    init[1] = tl ? strtoull(tl, NULL, 10) : 325;
    init[65] = init[1]; /* the MLP launch traced ([64..]: see cuda_mv.cu) */
    for (int k = 66; k < 78; k += 2) init[k] = ~0ull;
    cudaMemcpy(g_trace_buf, init, sizeof init, cudaMemcpyHostToDevice);
    cu_attn_set_trace(g_trace_buf);
    cu_mv_set_trace(g_trace_buf);
  }
#endif
  const char *no = getenv("SMELT_CUDA_NORMOUT");
  g_cu_normout = no && no[0] == '1';
  const char *acw = getenv("SMELT_CUDA_ATTN_CW");
  g_cu_attn_cw = acw ? atoi(acw) : 8;
  const char *ast = getenv("SMELT_CUDA_ATTN_STG");
  if (ast) g_cu_attn_stg = atoi(ast) < 0 ? 0 : atoi(ast) > 2 ? 2 : atoi(ast);
  const char *kvef = getenv("SMELT_CUDA_ATTN_KVEF");
  g_cu_attn_kvef = kvef ? atoi(kvef) : 1;
  const char *wef = getenv("SMELT_CUDA_WEF");
  g_cu_wef = wef ? atoi(wef) : 63;
  const char *ah = getenv("SMELT_CUDA_ATTN_HOIST");
  g_cu_attn_hoist = !(ah && ah[0] == '0');
  const char *mvt = getenv("SMELT_CUDA_MVT"), *mvtkb = getenv("SMELT_CUDA_MVT_KB"), *mvtb = getenv("SMELT_CUDA_MVT_BPS");
  g_cu_mvt = mvt ? atoi(mvt) : 0;
  g_cu_mvt_kb = mvtkb ? atoi(mvtkb) : 96;
  g_cu_mvt_bps = mvtb ? atoi(mvtb) : 1;
  const char *mvr = getenv("SMELT_CUDA_MVR"), *mvrn = getenv("SMELT_CUDA_MVR_NW"), *mvrr = getenv("SMELT_CUDA_MVR_RT");
  g_cu_mvr = mvr ? atoi(mvr) : -1;
  g_cu_mvr_nw = mvrn ? atoi(mvrn) : 8;
  g_cu_mvr_rt = mvrr ? atoi(mvrr) : -1;
  const char *mvrg = getenv("SMELT_CUDA_MVR_GLU");
  g_cu_mvr_glu = mvrg ? atoi(mvrg) : 0;
  const char *mlpe = getenv("SMELT_CUDA_MLP");
  g_cu_mlp = mlpe ? atoi(mlpe) : 2;
  const char *mlpb = getenv("SMELT_CUDA_MLP_BAR");
  g_cu_mlp_bar = mlpb ? atoi(mlpb) : 1;
  const char *dnz = getenv("SMELT_CUDA_DNORM");
  g_cu_dnorm = !(dnz && dnz[0] == '0');
  const char *guq = getenv("SMELT_CUDA_GUQ"), *guqn = getenv("SMELT_CUDA_GUQ_NORM");
  g_cu_guq = guq ? atoi(guq) : -1;
  g_cu_guq_norm = guqn ? atoi(guqn) : 0;
  const char *mdyn = getenv("SMELT_CUDA_MVT_DYN");
  g_cu_mvt_dyn = mdyn ? atoi(mdyn) : 0;
  cu_mv_init(device);
  const char *mvtn = getenv("SMELT_CUDA_MVT_NW"), *mvtr = getenv("SMELT_CUDA_MVT_R"), *mvts = getenv("SMELT_CUDA_MVT_STAGE");
  g_cu_mvt_nw = mvtn ? atoi(mvtn) : 0;
  g_cu_mvt_r = mvtr ? atoi(mvtr) : 0;
  g_cu_mvt_stage = mvts ? atoi(mvts) : 10;
  const char *qh = getenv("SMELT_CUDA_Q4HINT");
  g_cu_q4hint = qh ? atoi(qh) & 3 : 1;
  const char *atr = getenv("SMELT_CUDA_ATTN_TRIG");
  g_cu_attn_trig = atr ? atoi(atr) & 3 : 2;
  const char *sk2 = getenv("SMELT_CUDA_SKIP2");
  g_sk2 = sk2 ? atoi(sk2) : 0;
  const char *arsc = getenv("SMELT_CUDA_ATTN_RSC");
  g_cu_attn_rsc = !(arsc && arsc[0] == '0');
  const char *au = getenv("SMELT_CUDA_ATTN_UNR");
  g_cu_attn_unr = !(au && au[0] == '0');
  const char *pfe = getenv("SMELT_CUDA_PF");
  g_cu_pf_bytes = pfe ? (size_t)(atof(pfe) * 1048576.0) : (size_t)8 << 20;
  const char *asta = getenv("SMELT_CUDA_ATTN_STA");
  g_cu_attn_sta = asta ? atoi(asta) != 0 : 1;
  const char *adg = getenv("SMELT_CUDA_ATTN_DIAG");
  g_cu_attn_diag = adg ? atoi(adg) & 31 : 0;
  const char *pfm = getenv("SMELT_CUDA_PF_MIN");
  g_cu_pf_min = pfm ? (size_t)(atof(pfm) * 1048576.0) : (size_t)32 << 20;
  const char *sk = getenv("SMELT_CUDA_SKIP");
  g_cu_skip = sk ? (int)strtol(sk, NULL, 0) : 0;
  const char *qr = getenv("SMELT_CUDA_Q4ROLE");
  memset(g_cu_q4role_rb, 0, sizeof g_cu_q4role_rb);
  memset(g_cu_q4role_tl, 0, sizeof g_cu_q4role_tl);
  memset(g_cu_q4role_pf, 0, sizeof g_cu_q4role_pf);
  const char *gl = getenv("SMELT_CUDA_GLU");
  g_cu_glu = gl && gl[0] == '1';
  if (qr) { /* "qkv=RB[:TL[:PF]],o=..,gu=..,dn=..,lm=.." (PF: KB, -1 all) */
    static const char *names[CU_Q4_ROLES] = { "qkv", "o", "gu", "dn", "lm" };
    for (const char *p = qr; *p;) {
      for (int r = 0; r < CU_Q4_ROLES; r++) {
        size_t l = strlen(names[r]);
        if (!strncmp(p, names[r], l) && p[l] == '=') {
          int rb = 0, tl = 0, pf = 0;
          sscanf(p + l + 1, "%d:%d:%d", &rb, &tl, &pf);
          g_cu_q4role_rb[r] = rb; g_cu_q4role_tl[r] = tl;
          g_cu_q4role_pf[r] = pf < 0 ? -1 : pf > (1 << 20) ? 1 << 30 : pf * 1024;
        }
      }
      const char *cm = strchr(p, ',');
      if (!cm) break;
      p = cm + 1;
    }
  }
  const char *pd = getenv("SMELT_CUDA_PDL");
  g_cu_pdl = !(pd && pd[0] == '0');
  const char *gm = getenv("SMELT_CUDA_GMETA");
  c->gmeta = !(gm && gm[0] == '0');
  const char *gs = getenv("SMELT_CUDA_GSAMPLE");
  c->gsample = !(gs && gs[0] == '0');
  const char *tle = getenv("SMELT_CUDA_TL");
  if (tle && tle[0] == '1') {
    c->tl = 1;
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 6; i++) cudaEventCreate(&c->tle[k][i]);
  }
  const char *se = getenv("SMELT_CUDA_STATS");
  if (se && strcmp(se, "0")) {
    c->stats = 1;
    cudaEventCreate(&c->se0);
    cudaEventCreate(&c->se1);
    cudaEventCreate(&c->se2);
  }
  if (cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&c->meta_ev, cudaEventDisableTiming) != cudaSuccess) {
    sm_err(SMELT_ERR_BACKEND, "cuda: stream creation failed");
    be_destroy(&c->base);
    return NULL;
  }
  if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
    sm_err(SMELT_ERR_BACKEND, "cuda: cublasCreate failed");
    c->blas = NULL;
    be_destroy(&c->base);
    return NULL;
  }
  cublasSetStream(c->blas, c->s);
  size_t ws = (size_t)32 << 20;
  if (cudaMalloc(&c->blas_ws, ws) == cudaSuccess) cublasSetWorkspace(c->blas, c->blas_ws, ws);
  else { cudaGetLastError(); c->blas_ws = NULL; }
  size_t optin = c->smem_optin;
  set_attn_smem<1, 16>(optin, 0);
  set_attn_smem<2, 16>(optin, 1);
  set_attn_smem<4, 16>(optin, 2);
  set_attn_smem<8, 8>(optin, 3);
  cudaGetLastError();
  sm_backend *b = &c->base;
  b->name = "cuda";
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
  b->matmul = be_matmul;
  b->rmsnorm = be_rmsnorm;
  b->rope = be_rope;
  b->kv_store = be_kv_store;
  b->attention = be_attention;
  b->silu_mul = be_silu_mul;
  b->gelu_mul = be_gelu_mul;
  b->add = be_add;
  b->add_rows = be_add_rows;
  b->scale = be_scale;
  b->softcap = be_softcap;
  b->gather_out = be_gather_out;
  b->measure_bandwidth = be_measure_bandwidth;
  b->sample = be_sample; /* device sampling (cuda_sample.cu) */
  b->sample_async = be_sample_async;
  b->sample_wait = be_sample_wait;
  return b;
}

/* Name of the device in use (for benchmarks and logs). */
extern "C" const char *sm_cuda_device_name(sm_backend *be, char *buf, size_t n) {
  cudaDeviceProp p;
  if (!be || cudaGetDeviceProperties(&p, CB(be)->dev) != cudaSuccess) { snprintf(buf, n, "?"); return buf; }
  snprintf(buf, n, "%s", p.name);
  return buf;
}
