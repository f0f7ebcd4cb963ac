/* Tiled attention for prefill and mixed batches: a block takes a tile of up to CU_ATT_TQ consecutive
 * tokens of one sequence for one kv head (all query heads of the group), over one split of the key
 * range; keys and values of 32 positions at a time are staged in shared memory and shared by all
 * rows of the tile (online softmax per row). With S > 1 splits a second kernel combines the
 * partials. Where the tensor-core kernel (cuda_attn_flash.cu) takes the shape, this one is the
 * SMELT_CUDA_ATTN_FA=0 path and the fallback (head dims it has no instance for, pre-sm_80 devices);
 * it is also batch-invariant mode's kernel where the decode kernel does not take the shape (one split,
 * key steps at multiples of 32). Every cache type, q8_0 / q4_0 head rows included (cuda_kv.cuh). */
#include <math.h>
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_kv.cuh"

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
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

/* Tiled attention: block = (tile of <= CU_ATT_TQ consecutive same-sequence tokens, kv head,
 * split z of the key range). Keys/values of 32 positions at a time are staged in shared
 * memory and shared by all rows (token x query head of the group) of the tile. */
template <typename KT, int NDIM, int RMAX, bool QG>
__global__ void k_attn(float *__restrict__ out, float *__restrict__ part, const float *__restrict__ q,
                       const KT *__restrict__ Kc, const KT *__restrict__ Vc, const int32_t *__restrict__ pos,
                       const int32_t *__restrict__ seq, const int32_t *__restrict__ table,
                       const int32_t *__restrict__ tiles, int max_blocks, int bs, int nblocks, int n_heads, int nkv,
                       int hd, float scale, int window, float softcap, int S, const int32_t *__restrict__ span,
                       const float *__restrict__ sinks) {
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  const int tile = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
  const int t0 = tiles[tile], t1 = tiles[tile + 1];
  const int G = n_heads / nkv, rows = (t1 - t0) * G, rows_max = CU_ATT_TQ * G;
  const int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hdp = hd + 4;
  /* QG (head sizes past 256): the queries stay in global memory, not staged */
  float *Ks = sm, *Vs = Ks + 32 * hdp, *Qs = Vs + 32 * hd, *Ps = Qs + (QG ? 0 : rows_max * hd);
  int *slots = (int *)(Ps + nw * 32);
  const int sq = seq[t0];
  int lo = 0x7fffffff, hi = -1;
  for (int t = t0; t < t1; t++) {
    int p = pos[t], l = window > 0 ? max(0, p - window + 1) : 0;
    lo = min(lo, span ? min(l, span[2 * t]) : l);
    hi = max(hi, span ? max(p, span[2 * t + 1]) : p);
  }
  lo &= ~31; /* key steps at multiples of 32: a row sees the same steps in any tile (batch invariance) */
  const int nblk = (hi - lo + 32) / 32, per = (nblk + S - 1) / S;
  const int kb0 = z * per, kb1 = min(nblk, kb0 + per);
  for (int idx = threadIdx.x; !QG && idx < rows * hd; idx += blockDim.x) {
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
      const int t = t0 + r / G, p = pos[t];
      rhi[k] = p;
      rlo[k] = window > 0 ? max(0, p - window + 1) : 0;
      if (span) {
        rlo[k] = min(rlo[k], span[2 * t]);
        rhi[k] = max(rhi[k], span[2 * t + 1]);
      }
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
        kv = kv_hget4(kv_head(Kc, sl, nkv, kvh, hd), hd, 4 * d4);
        vv = kv_hget4(kv_head(Vc, sl, nkv, kvh, hd), hd, 4 * d4);
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
        const float4 *qr = QG ? (const float4 *)(q + ((int64_t)(t0 + r / G) * n_heads + kvh * G + r % G) * hd)
                              : (const float4 *)(Qs + r * hd);
        const float4 *kr = (const float4 *)(Ks + lane * hdp);
        float s = 0.f;
        for (int d4 = 0; d4 < hd4; d4++) {
          float4 a = qr[d4], b = kr[d4];
          s = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, s))));
        }
        if (QG) s *= scale;
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
        const float L = sinks && m[k] != -INFINITY ? l[k] + expf(sinks[h] - m[k]) : l[k]; /* attention sinks */
        const float inv = L > 0.f ? 1.f / L : 0.f;
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

__global__ void k_attn_combine(float *out, const float *part, int S, int hd, const float *sinks, int n_heads) {
  const float *pp = part + (int64_t)blockIdx.x * S * (hd + 2);
  float M = -INFINITY;
  for (int z = 0; z < S; z++) M = fmaxf(M, pp[z * (hd + 2)]);
  const float L0 = sinks && M != -INFINITY ? expf(sinks[blockIdx.x % n_heads] - M) : 0.f; /* attention sinks */
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float L = L0, o = 0.f;
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

void cu_attn_combine(const cu_ctx *cx, float *out, const float *part, int rows, int S, int hd, const float *sinks,
                     int n_heads) {
  k_attn_combine<<<rows, hd < 128 ? 128 : (hd > 256 ? 256 : hd), 0, cx->s>>>(out, part, S, hd, sinks, n_heads);
}

int cu_attn_tiled_splits(int n_tiles, int nkv, int n_sm) {
  const int units = n_tiles * nkv;
  if (units <= 0) return 1;
  int want = 2 * n_sm / units, S = 1;
  while (S * 2 <= want && S < 64) S *= 2;
  return S;
}

/* per cache type (sm_dtype F32, F16, BF16, Q8_0, Q4_0: att_dti) and NDIM variant (the same on every device) */
static int g_att_maxthr[5][5] = { { 1024, 1024, 1024, 1024, 1024 }, { 1024, 1024, 1024, 1024, 1024 },
                                  { 1024, 1024, 1024, 1024, 1024 }, { 1024, 1024, 1024, 1024, 1024 },
                                  { 1024, 1024, 1024, 1024, 1024 } };
static int att_dti(sm_dtype dt) {
  return dt == SM_DT_F16 ? 1 : dt == SM_DT_BF16 ? 2 : dt == SM_DT_Q8_0 ? 3 : dt == SM_DT_Q4_0 ? 4 : 0;
}
template <typename KT, int NDIM, int RMAX, bool QG> static void set_attn_smem(size_t bytes, sm_dtype dt, int slot) {
  cudaFuncSetAttribute(k_attn<KT, NDIM, RMAX, QG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  cudaFuncAttributes a;
  if (cudaFuncGetAttributes(&a, k_attn<KT, NDIM, RMAX, QG>) == cudaSuccess && a.maxThreadsPerBlock >= 32)
    g_att_maxthr[att_dti(dt)][slot] = a.maxThreadsPerBlock & ~31;
}
template <typename KT> static void tiled_init(size_t smem_optin, sm_dtype dt) {
  set_attn_smem<KT, 1, 16, false>(smem_optin, dt, 0);
  set_attn_smem<KT, 2, 16, false>(smem_optin, dt, 1);
  set_attn_smem<KT, 4, 16, false>(smem_optin, dt, 2);
  set_attn_smem<KT, 8, 8, false>(smem_optin, dt, 3);
  set_attn_smem<KT, 16, 4, true>(smem_optin, dt, 4);
}
void cu_attn_tiled_init(size_t smem_optin) {
  tiled_init<float>(smem_optin, SM_DT_F32);
  tiled_init<__half>(smem_optin, SM_DT_F16);
  tiled_init<__nv_bfloat16>(smem_optin, SM_DT_BF16);
  tiled_init<kv_q8>(smem_optin, SM_DT_Q8_0);
  tiled_init<kv_q4>(smem_optin, SM_DT_Q4_0);
  cudaGetLastError();
  cu_attn_flash_init(smem_optin);
  cu_attseg_fa_init(smem_optin);
}

static int att_ndim(int hd) { return hd <= 32 ? 1 : hd <= 64 ? 2 : hd <= 128 ? 4 : hd <= 256 ? 8 : 16; }
static size_t att_smem(int hd, int G, int nw) {
  const size_t qs = att_ndim(hd) == 16 ? 0 : (size_t)CU_ATT_TQ * G * hd; /* QG: queries not staged */
  return ((size_t)32 * (hd + 4) + (size_t)32 * hd + qs + (size_t)nw * 32 + 32) * sizeof(float);
}
static int att_warps(int hd, int G, sm_dtype dt) {
  int nd = att_ndim(hd), rmax = nd == 16 ? 4 : nd == 8 ? 8 : 16, rows = CU_ATT_TQ * G;
  int nw = (rows + rmax - 1) / rmax, slot = nd == 1 ? 0 : nd == 2 ? 1 : nd == 4 ? 2 : nd == 8 ? 3 : 4;
  int cap = g_att_maxthr[att_dti(dt)][slot] / 32; /* rows beyond nw*RMAX: further passes */
  if (nw > cap) nw = cap;
  return nw < 4 ? 4 : nw;
}
bool cu_attn_tiled_ok(int hd, int G, sm_dtype dt, size_t smem_optin) {
  if (dt != SM_DT_F32 && dt != SM_DT_F16 && dt != SM_DT_BF16 && dt != SM_DT_Q8_0 && dt != SM_DT_Q4_0) return false;
  if (hd > 512 || hd % 4) return false;
  const int nw = att_warps(hd, G, dt);
  return nw <= 32 && att_smem(hd, G, nw) <= smem_optin;
}

void cu_attn_tiled_run(const cu_ctx *cx, const cu_attn_tiled *a, size_t smem_optin) {
  const int G = a->n_heads / a->nkv, S = a->inv ? 1 : cu_attn_tiled_splits(a->n_tiles, a->nkv, cx->n_sm);
  const int nw = att_warps(a->hd, G, a->dt);
  if (!a->inv && cu_attn_flash_ok(cx, a->hd, a->dt, smem_optin)) {
    cu_attn_flash_run(cx, a, S);
    if (S > 1)
      cu_attn_combine(cx, a->out, a->part, a->n_tokens * a->n_heads, S, a->hd, a->sinks, a->n_heads);
    return;
  }
  const size_t smem = att_smem(a->hd, G, nw);
  dim3 grid((unsigned)a->n_tiles, (unsigned)a->nkv, (unsigned)S);
#define ATT_ARGS a->out, a->part, a->q, (const KT *)a->K, (const KT *)a->V, a->pos, a->seq, a->table, a->tiles, \
                 a->max_blocks, a->bs, a->nblocks, a->n_heads, a->nkv, a->hd, a->scale, a->window, a->softcap, S, a->span, \
                 a->sinks
  CU_KV_DISPATCH_Q(a->dt, switch (att_ndim(a->hd)) {
    case 1: k_attn<KT, 1, 16, false><<<grid, nw * 32, smem, cx->s>>>(ATT_ARGS); break;
    case 2: k_attn<KT, 2, 16, false><<<grid, nw * 32, smem, cx->s>>>(ATT_ARGS); break;
    case 4: k_attn<KT, 4, 16, false><<<grid, nw * 32, smem, cx->s>>>(ATT_ARGS); break;
    case 8: k_attn<KT, 8, 8, false><<<grid, nw * 32, smem, cx->s>>>(ATT_ARGS); break;
    default: k_attn<KT, 16, 4, true><<<grid, nw * 32, smem, cx->s>>>(ATT_ARGS); break;
  });
#undef ATT_ARGS
  if (S > 1)
    cu_attn_combine(cx, a->out, a->part, a->n_tokens * a->n_heads, S, a->hd, a->sinks, a->n_heads);
}
