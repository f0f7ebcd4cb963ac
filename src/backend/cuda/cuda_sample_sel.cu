/* The sample op's select path (cuda_sample_dev.cuh): the candidates of each sorted request of a
 * call with several, so that the segmented sort of cuda_sample.cu sorts those rather than whole
 * rows. Hand-written with the rest of the sample op: it must draw exactly the host rule's token. */
#include "backend/cuda/cuda_sample_dev.cuh"

/* The select path, for the sorted requests of a call with several. Sorting every token of each
 * such row (a segment of one cub::DeviceSegmentedRadixSort each, one block a segment) cost 1.2 ms
 * for 64 rows of 128,256; the walk only ever reads a prefix of the sorted order: the top_k
 * candidates, or the tokens up to where the cumulative weight reaches top_p of the total. So:
 *  - k_sel_hist / k_sel_step, twice: a histogram of each row's keys by their top 11 bits, then by
 *    the next 11 inside the bin that holds the cut, counting tokens (top_k) or summing their
 *    weights (top_p alone: exact 128-bit sums, so the bin is the one where the sequential loop's
 *    test first holds); the cut is the low edge of that 22-bit bin;
 *  - k_sel_count / k_sel_write: the tokens at or above the cut, in index order, into the row of
 *    the sort input (so that the stable sort keeps "key desc, index asc");
 *  - the segmented sort of those rows only, and the walk on them: top_k requests walk their k
 *    first candidates as before; top_p requests walk the candidates with the total weight of the
 *    whole row (has_total), which is what the top_p bound is computed from.
 * The candidates are a prefix of the full sorted order that contains every token the walk can
 * reach, so the token is the same. A row whose nucleus is most of the vocabulary (a flat
 * distribution) still sorts most of its row. */
#define SEL_T 256    /* threads of the select kernels */
#define SEL_BINS 2048 /* 11 bits a level */
#define SEL_PER (SEL_BINS / SEL_T)

typedef struct {
  sm_u128 m_above; /* weight of the tokens above the level-0 bin */
  double thr;      /* top_p * total */
  uint32_t c_above; /* tokens above the level-0 bin */
  int b0;          /* the level-0 bin of the cut (-1: keep every token) */
  uint32_t cut;    /* candidates: ordered keys >= cut */
} dsel;

/* a key as an unsigned integer of the same order */
static __device__ __forceinline__ uint32_t sel_ord(float k) {
  const uint32_t b = __float_as_uint(k);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
/* exact 128-bit add as two 64-bit atomics (the sum does not depend on their order) */
static __device__ __forceinline__ void add_u128(unsigned long long *lo, unsigned long long *hi, sm_u128 w) {
  const unsigned long long wl = (unsigned long long)w, wh = (unsigned long long)(w >> 64);
  const unsigned long long old = atomicAdd(lo, wl);
  const unsigned long long h = wh + (old + wl < old ? 1ull : 0ull);
  if (h) atomicAdd(hi, h);
}

/* grid (S, requests): each block's share of a row into the row's histogram (level 0: the key's
 * top 11 bits; level 1: the next 11, of the keys in the level-0 bin) */
static __global__ void __launch_bounds__(SEL_T) k_sel_hist(const dreq *rq, int V, int S, const float *pmax, int level,
                                                           uint32_t *gcnt, unsigned long long *glo,
                                                           unsigned long long *ghi, const dsel *ss) {
  const dreq *qp = &rq[blockIdx.y];
  const int sel = qp->sel;
  if (qp->mode != SM_SAMPLE_SORTED || sel == 0 || sel == 3) return;
  const int b0 = ss[blockIdx.y].b0;
  if (level == 1 && b0 < 0) return;
  __shared__ uint32_t cnt[SEL_BINS];
  __shared__ unsigned long long lo[SEL_BINS], hi[SEL_BINS];
  const bool mass = sel == 2;
  for (int d = threadIdx.x; d < SEL_BINS; d += SEL_T) {
    cnt[d] = 0;
    lo[d] = 0;
    hi[d] = 0;
  }
  __syncthreads();
  const float m = mass ? walk_row_max(pmax, S) : 0.0f;
  const float T = qp->T;
  const float *src = qp->src;
  const int chunk = (V + S - 1) / S, i0 = blockIdx.x * chunk, i1 = min(V, i0 + chunk);
  for (int i = i0 + threadIdx.x; i < i1; i += SEL_T) {
    const float key = sm_sample_key(src[i]);
    const uint32_t o = sel_ord(key);
    if (level == 1 && (int)(o >> 21) != b0) continue;
    const int d = level == 0 ? (int)(o >> 21) : (int)((o >> 10) & (SEL_BINS - 1));
    atomicAdd(&cnt[d], 1u);
    if (mass) {
      const sm_u128 w = sm_sample_weight(sm_sample_exp(SM_FDIV(SM_FSUB(key, m), T)));
      if (w) add_u128(&lo[d], &hi[d], w);
    }
  }
  __syncthreads();
  const size_t base = (size_t)blockIdx.y * SEL_BINS;
  for (int d = threadIdx.x; d < SEL_BINS; d += SEL_T) {
    if (!cnt[d]) continue;
    atomicAdd(&gcnt[base + d], cnt[d]);
    if (lo[d] | hi[d]) add_u128(&glo[base + d], &ghi[base + d], ((sm_u128)hi[d] << 64) | lo[d]);
  }
}

/* grid (requests): the bin of the cut from the row's histogram, which it zeroes for level 1.
 * Thread t holds bins SEL_BINS - 1 - (SEL_PER t + j), j = 0 .. SEL_PER - 1 (descending keys); the
 * cut is in the highest bin whose cumulative count (top_k) or weight (top_p) from the top meets
 * the bound, tested as the sequential loop tests it */
static __global__ void __launch_bounds__(SEL_T) k_sel_step(dreq *rq, int level, uint32_t *gcnt,
                                                           unsigned long long *glo, unsigned long long *ghi,
                                                           dsel *ss) {
  dreq *qp = &rq[blockIdx.x];
  const int sel = qp->sel, mode = qp->mode, k = qp->k;
  const float top_p = qp->top_p;
  dsel *sp = &ss[blockIdx.x];
  if (mode != SM_SAMPLE_SORTED || sel == 0) return;
  if (sel == 3) {
    if (threadIdx.x == 0) {
      sp->b0 = -1;
      sp->cut = 0;
    }
    return;
  }
  const int b0 = sp->b0;
  if (level == 1 && b0 < 0) return;
  const bool mass = sel == 2;
  const int t = threadIdx.x;
  const size_t base = (size_t)blockIdx.x * SEL_BINS;
  uint32_t c[SEL_PER], cs = 0;
  sm_u128 w[SEL_PER], ws = 0;
  for (int j = 0; j < SEL_PER; j++) {
    const size_t d = base + SEL_BINS - 1 - (SEL_PER * t + j);
    c[j] = gcnt[d];
    w[j] = mass ? ((sm_u128)ghi[d] << 64) | glo[d] : (sm_u128)0;
    gcnt[d] = 0;
    glo[d] = 0;
    ghi[d] = 0;
    cs += c[j];
    ws += w[j];
  }
  __shared__ sm_u128 shw[SEL_T];
  __shared__ uint32_t shc[SEL_T];
  __shared__ int s_d;
  shw[t] = ws;
  shc[t] = cs;
  if (t == 0) s_d = -1;
  __syncthreads();
  for (int off = 1; off < SEL_T; off <<= 1) { /* inclusive scan */
    const sm_u128 a = t >= off ? shw[t - off] : (sm_u128)0;
    const uint32_t b = t >= off ? shc[t - off] : 0u;
    __syncthreads();
    shw[t] += a;
    shc[t] += b;
    __syncthreads();
  }
  const sm_u128 total = shw[SEL_T - 1];
  uint32_t C = (level ? sp->c_above : 0u) + shc[t] - cs;
  sm_u128 M = (level ? sp->m_above : (sm_u128)0) + shw[t] - ws;
  const double thr = level ? sp->thr : mass ? SM_DMUL((double)top_p, sm_sample_u128_to_double(total)) : 0.0;
  int hit = -1;
  for (int j = 0; j < SEL_PER && hit < 0; j++) {
    const uint32_t C1 = C + c[j];
    const sm_u128 M1 = M + w[j];
    if (mass ? C1 >= 1u && sm_sample_u128_to_double(M1) >= thr : C1 >= (uint32_t)k) hit = j;
    else {
      C = C1;
      M = M1;
    }
  }
  if (hit >= 0) atomicMax(&s_d, SEL_BINS - 1 - (SEL_PER * t + hit));
  __syncthreads();
  const int d = s_d;
  if (d >= 0 && hit >= 0 && d == SEL_BINS - 1 - (SEL_PER * t + hit)) {
    if (level == 0) {
      sp->b0 = d;
      sp->c_above = C;
      sp->m_above = M;
      sp->thr = thr;
    } else {
      sp->cut = ((uint32_t)b0 << 21) | ((uint32_t)d << 10);
    }
  }
  if (t == 0) {
    if (d < 0) { /* no bin meets the bound (rounding): every token is a candidate */
      sp->b0 = -1;
      sp->cut = 0;
    }
    if (level == 0 && mass) {
      qp->total = total;
      qp->has_total = 1;
    }
  }
}

/* grid (S, requests): the candidates (ordered key >= cut) of each block's share of a row */
static __global__ void __launch_bounds__(SEL_T) k_sel_count(const dreq *rq, int V, int S, const dsel *ss, uint32_t *bc) {
  const dreq *qp = &rq[blockIdx.y];
  if (qp->mode != SM_SAMPLE_SORTED || qp->sel == 0) return;
  const uint32_t cut = ss[blockIdx.y].cut;
  const float *src = qp->src;
  const int chunk = (V + S - 1) / S, i0 = blockIdx.x * chunk, i1 = min(V, i0 + chunk);
  uint32_t n = 0;
  for (int i = i0 + threadIdx.x; i < i1; i += SEL_T) n += sel_ord(sm_sample_key(src[i])) >= cut;
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  __shared__ uint32_t sh[SEL_T / 32];
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = n;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0;
    for (int w = 0; w < SEL_T / 32; w++) a += sh[w];
    bc[blockIdx.y * S + blockIdx.x] = a;
  }
}

/* grid (S, requests): the candidates' keys and ids into the row's sort input, in index order; block
 * 0 sets the row's end offset for the sort and (top_p, every token) its candidate count */
static __global__ void __launch_bounds__(SEL_T) k_sel_write(dreq *rq, int V, int S, const dsel *ss, const uint32_t *bc,
                                                            float *kin, int32_t *iin, int *endoff) {
  dreq *qp = &rq[blockIdx.y];
  const int sel = qp->sel, srow = qp->srow;
  if (qp->mode != SM_SAMPLE_SORTED || sel == 0) return;
  const uint32_t cut = ss[blockIdx.y].cut;
  const float *src = qp->src;
  uint32_t off = 0, all = 0;
  for (int b = 0; b < S; b++) {
    const uint32_t v = bc[blockIdx.y * S + b];
    off += b < (int)blockIdx.x ? v : 0u;
    all += v;
  }
  float *ko = kin + (size_t)srow * V;
  int32_t *io = iin + (size_t)srow * V;
  __shared__ uint32_t wc[SEL_T / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunk = (V + S - 1) / S, i0 = blockIdx.x * chunk, i1 = min(V, i0 + chunk);
  for (int b = i0; b < i1; b += SEL_T) {
    const int i = b + threadIdx.x;
    float key = 0.0f;
    bool f = false;
    if (i < i1) {
      key = sm_sample_key(src[i]);
      f = sel_ord(key) >= cut;
    }
    const unsigned bits = __ballot_sync(0xffffffffu, f);
    if (lane == 0) wc[warp] = (uint32_t)__popc(bits);
    __syncthreads();
    uint32_t wo = 0, tot = 0;
    for (int w = 0; w < SEL_T / 32; w++) {
      wo += w < warp ? wc[w] : 0u;
      tot += wc[w];
    }
    if (f) {
      const uint32_t pos = off + wo + (uint32_t)__popc(bits & ((1u << lane) - 1u));
      ko[pos] = key;
      io[pos] = i;
    }
    off += tot;
    __syncthreads();
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (sel != 1) qp->n = (int)all;
    endoff[srow] = srow * V + (int)all;
  }
}

size_t cu_sample_sel_scratch(int n_req) {
  return ((sizeof(uint32_t) + 2 * sizeof(unsigned long long)) * SEL_BINS + sizeof(dsel) +
          sizeof(uint32_t) * WALK_MAX_S) *
         (size_t)n_req;
}

cudaError_t cu_sample_sel(dreq *dw, int n_req, int V, int S, const float *pmax, void *scratch, float *kin,
                          int32_t *iin, int *endoff, cudaStream_t s) {
  uint32_t *gcnt = (uint32_t *)scratch;
  unsigned long long *glo = (unsigned long long *)(gcnt + (size_t)SEL_BINS * n_req), *ghi = glo + (size_t)SEL_BINS * n_req;
  dsel *ss = (dsel *)(ghi + (size_t)SEL_BINS * n_req);
  uint32_t *bc = (uint32_t *)(ss + n_req);
  const dreq *dq = dw;
  /* the histograms start at zero: where a call of fewer requests kept its dsel and block counts, a
   * call of more has histogram bins (the layout follows n_req) */
  cudaError_t ce = cudaMemsetAsync(scratch, 0, cu_sample_sel_scratch(n_req), s);
  if (ce != cudaSuccess) return ce;
  const dim3 g((unsigned)S, (unsigned)n_req);
  for (int level = 0; level < 2; level++) {
    k_sel_hist<<<g, SEL_T, 0, s>>>(dq, V, S, pmax, level, gcnt, glo, ghi, ss);
    k_sel_step<<<(unsigned)n_req, SEL_T, 0, s>>>(dw, level, gcnt, glo, ghi, ss);
  }
  k_sel_count<<<g, SEL_T, 0, s>>>(dq, V, S, ss, bc);
  k_sel_write<<<g, SEL_T, 0, s>>>(dw, V, S, ss, bc, kin, iin, endoff);
  return cudaGetLastError();
}
