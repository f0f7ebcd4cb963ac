/* Tensor-parallel collectives of the CUDA backend through NCCL: one communicator a rank (one process a
 * GPU, src/model/tp.c), made from the unique id rank 0 draws. The collectives are recorded ops like the
 * others, run on the backend's stream, so a decode step's all-reduces are captured in its CUDA graph.
 * Built without NCCL (SMELT_HAVE_NCCL unset), the backend has no collectives and tensor parallelism
 * says so when asked for. */
#include <stdio.h>
#include <string.h>
#include "backend/cuda/cuda_be.cuh"
#ifdef SMELT_HAVE_NCCL
#include <nccl.h>

static_assert(sizeof(ncclUniqueId) <= SM_COMM_ID_BYTES, "NCCL's unique id fits the group id");

static smelt_status nccl_err(ncclResult_t r, const char *what) {
  return sm_err(SMELT_ERR_BACKEND, "cuda: %s: %s", what, ncclGetErrorString(r));
}

static smelt_status be_comm_make_id(sm_backend *be, uint8_t id[SM_COMM_ID_BYTES]) {
  (void)be;
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return nccl_err(r, "ncclGetUniqueId");
  memset(id, 0, SM_COMM_ID_BYTES);
  memcpy(id, &u, sizeof u);
  return SMELT_OK;
}

/* ---- one-shot all-reduce of small vectors (a decode step's activations) ----
 * NCCL's all-reduce of a few KB takes ~10+ us, most of it latency; a decode step of a split 8B model has 64
 * of them. Here each rank copies its vector into a buffer its peers map (CUDA IPC, over NVLink), the ranks'
 * blocks meet at flags written into each other's memory, and every rank sums all ranks' copies in rank
 * order (the same bits on every rank). Block b of every rank handles the same elements (AR_CH float4 from
 * b * AR_CH, whatever the vector's size), so a block waits only for the peers' block b. Flags are counters kept on the device, so the kernel replays in a CUDA graph;
 * the two buffer halves alternate between calls so a rank can run one call ahead of a slow peer. */
#define AR_MAX_RANKS 8
#define AR_CH 256 /* float4 a block (4 KB): block b always handles the same elements, whatever the size */
#define AR_MAX_BYTES ((size_t)512 << 10) /* per half; larger vectors go through NCCL */
#define AR_BLOCKS ((int)(AR_MAX_BYTES / 16 / AR_CH))
typedef struct {
  uint32_t flag[AR_BLOCKS][AR_MAX_RANKS]; /* written by the peers: their epoch of block b */
  uint32_t epoch[AR_BLOCKS];              /* this rank's own */
} ar_sig;
/* each rank's buffer holds two regions, one per kernel (their blocks split a vector differently): signals,
 * then two halves of AR_MAX_BYTES */
typedef struct {
  float *data[AR_MAX_RANKS];
  ar_sig *sig[AR_MAX_RANKS];
} ar_peers;
#define AR_REGION (sizeof(ar_sig) + 2 * AR_MAX_BYTES)
typedef struct {
  void *mine; /* this rank's IPC buffer: the two regions */
  void *opened[AR_MAX_RANKS];
  ar_peers p, pn; /* the plain all-reduce's region, the one fused with the residual add and norm */
  int n, rank;
  int norm_dim; /* the fused kernel's row length (a block a row), fixed at its first use */
} ar_state;

static __device__ __forceinline__ void st_release(uint32_t *a, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}
static __device__ __forceinline__ uint32_t ld_acquire(const uint32_t *a) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}

/* after block b copied its share in: let the next kernel launch (it may read its weights while this one
 * waits), then meet the peers' block b. The release by the flag writer covers the block's writes before the
 * __syncthreads (cumulativity). */
template <int R> static __device__ __forceinline__ void ar_meet(const ar_peers &p, int b, int rank, uint32_t ep) {
  __syncthreads();
  pdl_trigger();
  if (threadIdx.x < R) {
    st_release(&p.sig[threadIdx.x]->flag[b][rank], ep);
    while ((int)(ld_acquire(&p.sig[rank]->flag[b][threadIdx.x]) - ep) < 0) {}
  }
  __syncthreads();
}
/* float4 i of every rank's copy, summed in rank order */
template <int R> static __device__ __forceinline__ float4 ar_sum(const ar_peers &p, size_t i) {
  float4 s = __ldcg((const float4 *)p.data[0] + i);
#pragma unroll
  for (int r = 1; r < R; r++) {
    const float4 v = __ldcg((const float4 *)p.data[r] + i);
    s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
  }
  return s;
}

template <int R>
__global__ void __launch_bounds__(AR_CH) k_allreduce(float *__restrict__ x, int n4, int rank, ar_peers p) {
  __shared__ uint32_t ep;
  const int b = blockIdx.x, i = b * AR_CH + threadIdx.x;
  pdl_wait(); /* x is the previous kernel's output */
  if (threadIdx.x == 0) ep = ++p.sig[rank]->epoch[b];
  __syncthreads();
  const size_t half = AR_MAX_BYTES / sizeof(float4) * (ep & 1);
  if (i < n4) ((float4 *)p.data[rank])[half + i] = __ldcg((const float4 *)x + i);
  ar_meet<R>(p, b, rank, ep);
  if (i < n4) ((float4 *)x)[i] = ar_sum<R>(p, half + i);
}

/* The all-reduce of y fused with the residual add and the norm after it (one block a row of dim):
 * y = sum over the ranks of y; x += y; out = x / rms(x) * (w + off) */
template <int R>
__global__ void __launch_bounds__(1024) k_allreduce_add_norm(float *y, float *x, float *out, const float *w, int dim,
                                                             float eps, float off, int rank, ar_peers p) {
  __shared__ uint32_t ep;
  __shared__ float red[32];
  const int b = blockIdx.x, d4 = dim / 4;
  pdl_wait();
  if (threadIdx.x == 0) ep = ++p.sig[rank]->epoch[b];
  __syncthreads();
  const size_t half = AR_MAX_BYTES / sizeof(float4) * (ep & 1) + (size_t)b * d4;
  float4 *y4 = (float4 *)y + (size_t)b * d4, *x4 = (float4 *)x + (size_t)b * d4, *o4 = (float4 *)out + (size_t)b * d4;
  for (int j = threadIdx.x; j < d4; j += blockDim.x) ((float4 *)p.data[rank])[half + j] = __ldcg(y4 + j);
  ar_meet<R>(p, b, rank, ep);
  float ss = 0.f;
  for (int j = threadIdx.x; j < d4; j += blockDim.x) {
    const float4 s = ar_sum<R>(p, half + j);
    y4[j] = s;
    float4 v = __ldcg(x4 + j);
    v.x += s.x, v.y += s.y, v.z += s.z, v.w += s.w;
    x4[j] = v;
    ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)dim + eps);
  for (int j = threadIdx.x; j < d4; j += blockDim.x) {
    const float4 v = x4[j], g = ((const float4 *)w)[j];
    o4[j] = make_float4(v.x * inv * (g.x + off), v.y * inv * (g.y + off), v.z * inv * (g.z + off),
                        v.w * inv * (g.w + off));
  }
}

bool cu_comm_ar_norm_ok(cuda_be *c, const float *y, const float *x, const float *out, const float *w, int n, int dim) {
  ar_state *a = (ar_state *)c->car;
  if (!a || n <= 0 || n > AR_BLOCKS || dim % 4 || (size_t)n * dim * sizeof(float) > AR_MAX_BYTES ||
      (((uintptr_t)y | (uintptr_t)x | (uintptr_t)out | (uintptr_t)w) & 15))
    return false;
  if (!a->norm_dim) a->norm_dim = dim; /* block b's elements must be the same in every call */
  return a->norm_dim == dim;
}

void cu_comm_ar_norm(cuda_be *c, float *y, float *x, float *out, const float *w, int n, int dim, float eps, float off) {
  const ar_state *a = (const ar_state *)c->car;
  const int th = dim / 4 >= 1024 ? 1024 : (dim / 4 + 31) / 32 * 32;
  switch (a->n) {
    case 2:
      cu_launch(&c->cx, k_allreduce_add_norm<2>, dim3(n), dim3(th), 0, y, x, out, w, dim, eps, off, a->rank, a->pn);
      break;
    case 4:
      cu_launch(&c->cx, k_allreduce_add_norm<4>, dim3(n), dim3(th), 0, y, x, out, w, dim, eps, off, a->rank, a->pn);
      break;
    case 8:
      cu_launch(&c->cx, k_allreduce_add_norm<8>, dim3(n), dim3(th), 0, y, x, out, w, dim, eps, off, a->rank, a->pn);
      break;
  }
}

static bool ar_fits(const cuda_be *c, const float *x, size_t n) {
  return c->car && n % 4 == 0 && n * sizeof(float) <= AR_MAX_BYTES && ((uintptr_t)x & 15) == 0;
}

static void ar_run(cuda_be *c, float *x, size_t n) {
  const ar_state *a = (const ar_state *)c->car;
  const int n4 = (int)(n / 4), nb = (n4 + AR_CH - 1) / AR_CH;
  switch (a->n) { /* with programmatic dependent launch (cuda_common.cuh) */
    case 2: cu_launch(&c->cx, k_allreduce<2>, dim3(nb), dim3(AR_CH), 0, x, n4, a->rank, a->p); break;
    case 4: cu_launch(&c->cx, k_allreduce<4>, dim3(nb), dim3(AR_CH), 0, x, n4, a->rank, a->p); break;
    case 8: cu_launch(&c->cx, k_allreduce<8>, dim3(nb), dim3(AR_CH), 0, x, n4, a->rank, a->p); break;
  }
}

/* the buffers of every rank mapped into this one (all ranks agree whether it worked: else NCCL alone) */
static void ar_setup(cuda_be *c, int n, int rank) {
  ncclComm_t comm = (ncclComm_t)c->nccl;
  ar_state *a = (ar_state *)calloc(1, sizeof *a);
  bool ok = a && (n == 2 || n == 4 || n == 8);
  for (int r = 0; ok && r < n; r++) {
    int can = 1;
    if (r != c->dev && cudaDeviceCanAccessPeer(&can, c->dev, r) != cudaSuccess) can = 0;
    ok = can != 0;
  }
  const size_t bytes = 2 * AR_REGION;
  if (ok) ok = cudaMalloc(&a->mine, bytes) == cudaSuccess && cudaMemset(a->mine, 0, bytes) == cudaSuccess;
  cudaIpcMemHandle_t h;
  memset(&h, 0, sizeof h);
  if (ok) ok = cudaIpcGetMemHandle(&h, a->mine) == cudaSuccess;
  /* everyone's handle, and whether everyone got this far */
  char *dh = NULL;
  int *dok = NULL;
  const size_t hs = sizeof h;
  if (cudaMalloc(&dh, hs * (size_t)n) != cudaSuccess || cudaMalloc(&dok, sizeof(int)) != cudaSuccess) ok = false;
  int okv = ok ? 1 : 0, all_ok = 0;
  cudaGetLastError();
  if (dh && dok) {
    cudaMemcpy(dh + hs * rank, &h, hs, cudaMemcpyHostToDevice);
    cudaMemcpy(dok, &okv, sizeof(int), cudaMemcpyHostToDevice);
    ncclAllGather(dh + hs * rank, dh, hs, ncclChar, comm, c->s);
    ncclAllReduce(dok, dok, 1, ncclInt32, ncclMin, comm, c->s);
    cudaStreamSynchronize(c->s);
    cudaMemcpy(&all_ok, dok, sizeof(int), cudaMemcpyDeviceToHost);
  }
  cudaIpcMemHandle_t *hh = (cudaIpcMemHandle_t *)malloc(hs * (size_t)n);
  if (all_ok && hh) cudaMemcpy(hh, dh, hs * (size_t)n, cudaMemcpyDeviceToHost);
  for (int r = 0; all_ok && okv && hh && r < n; r++) {
    void *p = a->mine;
    if (r != rank && cudaIpcOpenMemHandle(&p, hh[r], cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) okv = 0;
    else if (r != rank) a->opened[r] = p;
    a->p.sig[r] = (ar_sig *)p;
    a->p.data[r] = (float *)((char *)p + sizeof(ar_sig));
    a->pn.sig[r] = (ar_sig *)((char *)p + AR_REGION);
    a->pn.data[r] = (float *)((char *)p + AR_REGION + sizeof(ar_sig));
  }
  cudaGetLastError();
  /* a second vote: every peer mapped */
  if (dok && all_ok) {
    cudaMemcpy(dok, &okv, sizeof(int), cudaMemcpyHostToDevice);
    ncclAllReduce(dok, dok, 1, ncclInt32, ncclMin, comm, c->s);
    cudaStreamSynchronize(c->s);
    cudaMemcpy(&all_ok, dok, sizeof(int), cudaMemcpyDeviceToHost);
  }
  free(hh);
  if (dh) cudaFree(dh);
  if (dok) cudaFree(dok);
  cudaGetLastError();
  if (all_ok && a) {
    a->n = n;
    a->rank = rank;
    c->car = a;
    return;
  }
  if (a) {
    for (int r = 0; r < n && r < AR_MAX_RANKS; r++)
      if (a->opened[r]) cudaIpcCloseMemHandle(a->opened[r]);
    if (a->mine) cudaFree(a->mine);
    free(a);
  }
}

static void ar_free(cuda_be *c) {
  ar_state *a = (ar_state *)c->car;
  if (!a) return;
  for (int r = 0; r < a->n; r++)
    if (a->opened[r]) cudaIpcCloseMemHandle(a->opened[r]);
  cudaFree(a->mine);
  free(a);
  c->car = NULL;
}

static smelt_status be_comm_init(sm_backend *be, const sm_comm_init *ci) {
  cuda_be *c = CB(be);
  if (c->nccl) return sm_err(SMELT_ERR_INVALID, "cuda: this backend already belongs to a tensor-parallel group");
  ncclUniqueId u;
  memcpy(&u, ci->id, sizeof u);
  cudaSetDevice(c->dev);
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, ci->n_ranks, u, ci->rank);
  if (r != ncclSuccess) return nccl_err(r, "ncclCommInitRank");
  c->nccl = comm;
  if (c->t.comm_ar) ar_setup(c, ci->n_ranks, ci->rank);
  return SMELT_OK;
}

static void submit_cm(sm_backend *be, int type, float *dst, const float *src, size_t n) {
  if (!n) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = type;
  o.cm.dst = dst;
  o.cm.src = src;
  o.cm.n = n;
  cu_submit(CB(be), &o);
}
static void be_all_reduce(sm_backend *be, float *x, size_t n) { submit_cm(be, OP_ALLREDUCE, x, x, n); }
static void be_broadcast(sm_backend *be, float *x, size_t n) { submit_cm(be, OP_BCAST, x, x, n); }
static void be_all_gather(sm_backend *be, float *dst, const float *src, size_t n) {
  submit_cm(be, OP_ALLGATHER, dst, src, n);
}

void cu_comm_exec(cuda_be *c, const cu_op *o) {
  ncclComm_t comm = (ncclComm_t)c->nccl;
  if (!comm) {
    sm_err(SMELT_ERR_INVALID, "cuda: a collective outside a tensor-parallel group");
    c->failed = true;
    return;
  }
  ncclResult_t r = ncclSuccess;
  switch (o->type) {
    case OP_ALLREDUCE:
      if (ar_fits(c, o->cm.dst, o->cm.n)) ar_run(c, o->cm.dst, o->cm.n);
      else r = ncclAllReduce(o->cm.src, o->cm.dst, o->cm.n, ncclFloat32, ncclSum, comm, c->s);
      break;
    case OP_BCAST: r = ncclBroadcast(o->cm.src, o->cm.dst, o->cm.n, ncclFloat32, 0, comm, c->s); break;
    case OP_ALLGATHER: r = ncclAllGather(o->cm.src, o->cm.dst, o->cm.n, ncclFloat32, comm, c->s); break;
  }
  if (r != ncclSuccess) {
    nccl_err(r, cu_op_name(o->type));
    c->failed = true;
  }
}

void cu_comm_destroy(cuda_be *c) {
  ar_free(c);
  if (!c->nccl) return;
  ncclCommDestroy((ncclComm_t)c->nccl);
  c->nccl = NULL;
}

void cu_comm_install(sm_backend *b) {
  b->comm_make_id = be_comm_make_id;
  b->comm_init = be_comm_init;
  b->all_reduce = be_all_reduce;
  b->broadcast = be_broadcast;
  b->all_gather = be_all_gather;
}
#else
bool cu_comm_ar_norm_ok(cuda_be *, const float *, const float *, const float *, const float *, int, int) {
  return false;
}
void cu_comm_ar_norm(cuda_be *, float *, float *, float *, const float *, int, int, float, float) {}
void cu_comm_exec(cuda_be *c, const cu_op *o) {
  (void)o;
  c->failed = true;
}
void cu_comm_destroy(cuda_be *c) { (void)c; }
void cu_comm_install(sm_backend *b) { (void)b; }
#endif
