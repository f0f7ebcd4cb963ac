/* The CUDA backend's ops with explicit shapes that read no batch state (backend.h attention_seg,
 * rope_axes, gelu, gather_rows, copy): their recording entry points, and their kernels. The
 * segmented attention of vision encoders runs on tensor cores (cuda_attn_seg.cu) where the head dim
 * allows; otherwise, and with SMELT_CUDA_ATTN_FA=0, on a tiled online-softmax kernel in f32 here (32
 * queries of one head a block, 4 threads a query, K/V tiles in shared memory). It runs when issued. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_be.cuh"
#include "backend/cuda/cuda_ew.cuh"

#define AS_BQ 32 /* queries a block */
#define AS_TPQ 4 /* threads a query */
#define AS_BK 32 /* keys a tile */
#define AS_MAX_HD 128

template <int DQ>
__global__ void k_attention_seg(float *__restrict__ out, const float *__restrict__ q, const float *__restrict__ k,
                                const float *__restrict__ v, const int32_t *__restrict__ lohi, int n, int nh, int nkv,
                                int hd, float scale) {
  extern __shared__ float sm[]; /* K tile [AS_BK][hd], V tile [AS_BK][hd] */
  float *Ks = sm, *Vs = sm + AS_BK * hd;
  __shared__ int kmin, kmax;
  const int h = blockIdx.y, g = h / (nh / nkv);
  const int qi = threadIdx.x / AS_TPQ, part = threadIdx.x % AS_TPQ;
  const int t = blockIdx.x * AS_BQ + qi;
  const int dq = hd / AS_TPQ, d0 = part * dq;
  const bool valid = t < n;
  const int lo = valid ? lohi[2 * t] : 0, hi = valid ? lohi[2 * t + 1] : 0;
  if (threadIdx.x == 0) { kmin = n; kmax = 0; }
  __syncthreads();
  if (valid && part == 0) { atomicMin(&kmin, lo); atomicMax(&kmax, hi); }
  __syncthreads();
  float qr[DQ], acc[DQ];
  const int64_t qs = (int64_t)nh * hd, ks = (int64_t)nkv * hd;
#pragma unroll
  for (int d = 0; d < DQ; d++) {
    qr[d] = valid && d < dq ? q[(int64_t)t * qs + (int64_t)h * hd + d0 + d] : 0.f;
    acc[d] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j0 = kmin; j0 < kmax; j0 += AS_BK) {
    const int nk = min(AS_BK, kmax - j0);
    for (int i = threadIdx.x; i < AS_BK * hd; i += blockDim.x) {
      const int j = i / hd, d = i % hd;
      const bool in = j < nk;
      Ks[i] = in ? k[(int64_t)(j0 + j) * ks + (int64_t)g * hd + d] : 0.f;
      Vs[i] = in ? v[(int64_t)(j0 + j) * ks + (int64_t)g * hd + d] : 0.f;
    }
    __syncthreads();
    float s[AS_BK];
    float mt = -INFINITY;
#pragma unroll 4
    for (int j = 0; j < AS_BK; j++) {
      float p = 0.f;
#pragma unroll
      for (int d = 0; d < DQ; d++)
        if (d < dq) p = fmaf(qr[d], Ks[j * hd + d0 + d], p);
      p += __shfl_xor_sync(0xffffffffu, p, 1);
      p += __shfl_xor_sync(0xffffffffu, p, 2);
      const int key = j0 + j;
      s[j] = j < nk && key >= lo && key < hi ? p * scale : -INFINITY;
      mt = fmaxf(mt, s[j]);
    }
    if (mt > m) {
      const float corr = m == -INFINITY ? 0.f : expf(m - mt);
      l *= corr;
#pragma unroll
      for (int d = 0; d < DQ; d++) acc[d] *= corr;
      m = mt;
    }
    if (m != -INFINITY)
      for (int j = 0; j < AS_BK; j++) {
        if (s[j] == -INFINITY) continue;
        const float p = expf(s[j] - m);
        l += p;
#pragma unroll
        for (int d = 0; d < DQ; d++)
          if (d < dq) acc[d] = fmaf(p, Vs[j * hd + d0 + d], acc[d]);
      }
    __syncthreads();
  }
  if (!valid) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float *o = out + (int64_t)t * qs + (int64_t)h * hd + d0;
#pragma unroll
  for (int d = 0; d < DQ; d++)
    if (d < dq) o[d] = acc[d] * inv;
}

__global__ void k_rope_axes(float *x, const float *inv, const int32_t *axis, const int32_t *pos, int n, int nh, int hd,
                            int half) {
  const int64_t total = (int64_t)n * nh * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    const int i = (int)(idx % half);
    const int64_t th = idx / half; /* t * nh + h */
    const int t = (int)(th / nh);
    const float ang = (float)pos[(int64_t)axis[i] * n + t] * inv[i];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    float *p = x + th * hd;
    const float a = p[i], b = p[i + half];
    p[i] = a * cs - b * sn;
    p[i + half] = a * sn + b * cs;
  }
}

__global__ void k_gelu1(float *y, const float *x, size_t n, int kind) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float a = x[i];
    y[i] = kind == SM_GELU_QUICK ? a / (1.f + expf(-1.702f * a))
         : kind == SM_GELU_TANH  ? cu_gelu_tanh(a)
                                 : 0.5f * a * (1.f + erff(a * 0.70710678118654752f));
  }
}

static void x_attention_seg(cuda_be *c, const cu_op *o) {
  if (o->asg.fa) {
    cu_attseg_fa_run(&c->cx, c->seg_h, o->asg.out, o->asg.q, o->asg.k, o->asg.v, o->asg.lohi, o->asg.n, o->asg.nh,
                     o->asg.nkv, o->asg.hd, o->asg.scale);
    return;
  }
  const int hd = o->asg.hd, dq = hd / AS_TPQ;
  const dim3 grid((unsigned)((o->asg.n + AS_BQ - 1) / AS_BQ), (unsigned)o->asg.nh);
  const size_t smem = sizeof(float) * 2 * AS_BK * hd;
#define AS_LAUNCH(DQ) k_attention_seg<DQ><<<grid, AS_BQ * AS_TPQ, smem, c->s>>>(o->asg.out, o->asg.q, o->asg.k, o->asg.v, \
                                                                                 o->asg.lohi, o->asg.n, o->asg.nh,       \
                                                                                 o->asg.nkv, hd, o->asg.scale)
  if (dq <= 8) AS_LAUNCH(8);
  else if (dq <= 16) AS_LAUNCH(16);
  else AS_LAUNCH(32);
#undef AS_LAUNCH
}

void cu_exec_encoder_op(cuda_be *c, const cu_op *o) {
  const cu_ctx *cx = &c->cx;
  switch (o->type) {
  case OP_ATTSEG: x_attention_seg(c, o); break;
  case OP_ROPEAX: {
    const int half = o->rax.rot / 2;
    const size_t total = (size_t)o->rax.n * o->rax.nh * half;
    if (total) k_rope_axes<<<cu_ew_blocks(total), 256, 0, c->s>>>(o->rax.x, o->rax.inv, o->rax.axis, o->rax.pos,
                                                                    o->rax.n, o->rax.nh, o->rax.hd, half);
    break;
  }
  case OP_GELU1:
    if (o->gl.n) k_gelu1<<<cu_ew_blocks(o->gl.n), 256, 0, c->s>>>(o->gl.y, o->gl.x, o->gl.n, o->gl.kind);
    break;
  case OP_GATHERROWS: cu_gather(cx, o->gr.dst, o->gr.src, o->gr.idx, o->gr.n, o->gr.dim); break;
  case OP_COPY:
    cu_ck(c, cudaMemcpyAsync(o->cp.dst, o->cp.src, o->cp.bytes, cudaMemcpyDeviceToDevice, c->s), "copy");
    break;
  }
}

/* ---------------- recording entry points ---------------- */
static void be_attention_seg(sm_backend *be, float *out, const float *q, const float *k, const float *v, int n,
                             int n_heads, int n_kv_heads, int head_dim, float scale, const int32_t *seg, int n_seg) {
  cuda_be *c = CB(be);
  bool ok = n > 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0 && n_heads % n_kv_heads == 0 &&
            head_dim % AS_TPQ == 0 && head_dim <= AS_MAX_HD && n_seg > 0 && seg && seg[0] == 0 && seg[n_seg] == n;
  for (int s = 0; ok && s < n_seg; s++) ok = seg[s + 1] >= seg[s];
  if (!ok) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: attention_seg shape not supported (head_dim %d: a multiple of %d up to %d)",
           head_dim, AS_TPQ, AS_MAX_HD);
    if (n > 0 && n_heads > 0 && head_dim > 0) cudaMemsetAsync(out, 0, (size_t)n * n_heads * head_dim * 4, c->s);
    return;
  }
  cu_flush(c); /* runs now: the key ranges go through one scratch buffer */
  int32_t *lohi = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)n);
  if (!lohi) { sm_err(SMELT_ERR_OOM, "attention_seg ranges"); return; }
  for (int s = 0; s < n_seg; s++)
    for (int t = seg[s]; t < seg[s + 1]; t++) {
      lohi[2 * t] = seg[s];
      lohi[2 * t + 1] = seg[s + 1];
    }
  const size_t bytes = sizeof(int32_t) * 2 * (size_t)n;
  if (!cu_ensure_buf(c, (void **)&c->seg_lohi, &c->seg_cap, bytes) ||
      !cu_ck(c, cudaMemcpyAsync(c->seg_lohi, lohi, bytes, cudaMemcpyHostToDevice, c->s), "attention_seg ranges")) {
    free(lohi);
    return;
  }
  free(lohi); /* a pageable copy is staged before cudaMemcpyAsync returns */
  const bool aligned = !(((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)out) & 15);
  bool fa = aligned && cu_attseg_fa_ok(&c->cx, head_dim, c->smem_optin);
  if (fa) {
    const size_t sb = cu_attseg_fa_scratch(n, n_heads, n_kv_heads, head_dim);
    if (!cu_ensure_buf(c, &c->seg_h, &c->seg_hcap, sb)) return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_ATTSEG;
  o.asg.out = out; o.asg.q = q; o.asg.k = k; o.asg.v = v; o.asg.lohi = c->seg_lohi;
  o.asg.n = n; o.asg.nh = n_heads; o.asg.nkv = n_kv_heads; o.asg.hd = head_dim; o.asg.scale = scale;
  o.asg.fa = fa;
  cu_submit(c, &o);
}

static void be_rope_axes(sm_backend *be, float *x, int n, int n_heads, int head_dim, int rot_dim, const float *inv,
                         const int32_t *axis, const int32_t *pos) {
  if (n <= 0 || n_heads <= 0 || rot_dim < 2 || rot_dim % 2 || rot_dim > head_dim) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_ROPEAX;
  o.rax.x = x; o.rax.inv = inv; o.rax.axis = axis; o.rax.pos = pos;
  o.rax.n = n; o.rax.nh = n_heads; o.rax.hd = head_dim; o.rax.rot = rot_dim;
  cu_submit(CB(be), &o);
}

static void be_gelu(sm_backend *be, float *y, const float *x, size_t n, int kind) {
  if (!n) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_GELU1;
  o.gl.y = y; o.gl.x = x; o.gl.n = n; o.gl.kind = kind;
  cu_submit(CB(be), &o);
}

static void be_gather_rows(sm_backend *be, float *dst, const float *src, const int32_t *idx, int n, int dim) {
  if (n <= 0 || dim <= 0) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_GATHERROWS;
  o.gr.dst = dst; o.gr.src = src; o.gr.idx = idx; o.gr.n = n; o.gr.dim = dim;
  cu_submit(CB(be), &o);
}

static void be_copy(sm_backend *be, void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_COPY;
  o.cp.dst = dst; o.cp.src = src; o.cp.bytes = bytes;
  cu_submit(CB(be), &o);
}

void cu_encoder_ops_init(sm_backend *b) {
  b->attention_seg = be_attention_seg;
  b->rope_axes = be_rope_axes;
  b->gelu = be_gelu;
  b->gather_rows = be_gather_rows;
  b->copy = be_copy;
}
