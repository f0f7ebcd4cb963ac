/* The CUDA backend's state and the parts of it that its files share (cuda_backend.cu: the op table
 * entry points; cuda_graph.cu: recording and graph replay; cuda_fuse.cu: the fusion table and the
 * executor; cuda_prof.cu: profile, statistics, timeline). */
#ifndef SM_CUDA_BE_CUH
#define SM_CUDA_BE_CUH
#include <cublas_v2.h>
#include "backend/cuda/cuda_common.cuh"

/* recorded steps up to this size are captured as graphs; larger ones run eagerly (capturing steps of
 * 256 tokens measured no faster on the H200: 1B at 256 clients 3.74 ms a step either way, docs/cuda.md) */
#define GRAPH_MAX_TOKENS 64
#define N_GRAPHS 8
#define N_SEEN 16
#define DEQ_BYTES ((size_t)128 << 20)

/* Recorded ops: one typed struct per op of the op table (backend.h), zeroed before it is filled so
 * that whole ops can be hashed and compared (the graph cache's key). */
enum {
  OP_EMBED, OP_MATMUL, OP_RMSNORM, OP_ROPE, OP_KVSTORE, OP_ATTN, OP_SILU, OP_GELU, OP_ADD, OP_ADDROWS,
  OP_SCALE, OP_SOFTCAP, OP_GATHER, OP_ARGMAX, OP_META, OP_LAYERNORM, OP_ROPEX,
  /* mixtures of experts and attention sinks (cuda_moe.cu) */
  OP_MOE_ROUTE, OP_MM_EXPERTS, OP_MOE_COMBINE, OP_SWIGLU_CLAMP, OP_SIGMOID_GATE, OP_ATTN_SINKS,
  /* recurrent (hybrid) models: cuda_ssm.cu */
  OP_MUL, OP_SIGMUL, OP_RELU2, OP_CONV1D, OP_SSM, OP_GDN, OP_GNORM,
  /* ops with explicit shapes (cuda_encoder.cu) */
  OP_ATTSEG, OP_ROPEAX, OP_GELU1, OP_GATHERROWS, OP_COPY,
  /* multi-head latent attention (cuda_mla.cu) */
  OP_ATTN_MLA,
  /* tensor-parallel collectives (cuda_comm.cu) */
  OP_ALLREDUCE, OP_BCAST, OP_ALLGATHER, OP_COUNT
};
typedef struct {
  int type;
  union {
    struct { const sm_weight *w; const cu_weight *cw; const float *x; float *y; int n, role; } mm; /* role: sm_mm_role */
    struct { float *out; const float *x, *w; int n, dim; float eps, off; } norm;
    struct { float *x; const float *inv; int nh, hd, rot; } rope;
    struct { float *out; const float *x, *w, *b; int n, dim; float eps; } ln;
    struct { float *x; const float *inv; int nh, hd, rot, n_rows, pos0, beta_pos; float mscale, beta; } rx;
    struct { void *K, *V; const float *k, *v; int row, hd, bs, nblocks, dt; } kv; /* dt: the cache's sm_dtype */
    /* splits > 0: the decode kernel with that many splits (glong: combined in global memory); 0: tiled
     * (inv: batch-invariant, one split on the CUDA-core kernel; dq > 0: a quantized cache's decode kernel
     * with dq splits) */
    struct { float *out; const float *q; void *K, *V; int nh, nkv, hd, bs, nblocks, window, splits, glong, dt, inv, dq; float scale, softcap; const int32_t *span; const float *sinks; } at;
    struct { float *y; const float *a, *b; size_t n; int dim; float s; } ew; /* SILU GELU ADD ADDROWS SCALE SOFTCAP
                                                                               * MUL SIGMUL RELU2 */
    /* recurrent ops: st is the layer's state buffer (slots of sf floats), nseq the batch's sequences */
    struct { float *out; const float *x, *w, *b; float *st; size_t sf; int C, K, act, nseq; } cv;
    struct { float *y; const float *x, *B, *C, *dt, *dtb, *al, *D; float *st; size_t sf; int ld, nh, P, G, N, nseq;
             float lo, hi; } ss;
    struct { float *y; const float *q, *k, *v, *a, *b, *al, *dtb; float *st; size_t sf; int ld, hk, hv, dk, dv, nseq; } gd;
    struct { float *out; const float *x, *z, *w; int n, dim, group, wdim, nf; float eps; } gn;
    struct { const cu_weight *cw; float *out; } emb;
    struct { float *dst; const float *src; int dim; } gat;
    struct { const float *logits; int32_t *dtok, *htok; int vocab; } am; /* greedy token of one row */
    struct { int32_t *dst; } meta;
    struct { const float *logits, *corr, *es; int32_t *ids; float *wts; int n, kind, ne, k, norm, ng, tkg; float scale, eps; } rt;
    /* grouped: run eagerly as one GEMM per chosen expert (cuda_moe.cu) */
    struct { const cu_weight *cw; const float *x, *bias; const int32_t *ids; float *y; int64_t rows; int n, k, per_slot, role, grouped; } mx;
    struct { float *out; const float *y, *w; int n, k, dim; } cb;
    struct { float *out; const float *g, *u; size_t n; float alpha, limit; } sw;
    struct { float *y; const float *g; int n, dim; } sg;
    struct { float *out; const float *q, *sinks; void *K, *V; int nh, nkv, hd, bs, nblocks, window, dt; float scale, softcap; } as;
    /* OP_ATTSEG: lohi holds each token's key range [lo, hi) (device, c->seg_lohi) */
    struct { float *out; const float *q, *k, *v; const int32_t *lohi; int n, nh, nkv, hd, fa; float scale; } asg;
    struct { float *x; const float *inv; const int32_t *axis, *pos; int n, nh, hd, rot; } rax;
    struct { float *y; const float *x; size_t n; int kind; } gl;                /* OP_GELU1 */
    struct { float *dst; const float *src; const int32_t *idx; int n, dim; } gr;      /* OP_GATHERROWS */
    struct { void *dst; const void *src; size_t bytes; } cp;                          /* OP_COPY */
    struct { float *out; const float *ql, *qpe, *c, *kpe; void *K; int nh, dc, dr, bs, nblocks, dt; float scale; } mla;
    struct { float *dst; const float *src; size_t n; } cm; /* OP_ALLREDUCE / OP_BCAST (src == dst), OP_ALLGATHER */
  };
} cu_op;
const char *cu_op_name(int type);
/* the buffers an op reads and writes (liveness) */
void cu_op_io(const cu_op *o, const void *rd[4], int *nr, const void *wr[2], int *nw);

/* OP_META: the batch metadata of a fed one-token step as kernel parameters (no upload): cnt[k]
 * values to dst + off[k], taken in order from v */
#define META_MAXV 960
typedef struct {
  int32_t off[5], cnt[5];
  int32_t v[META_MAXV];
} cu_meta_blob;

typedef struct {
  uint64_t hash;
  int n_ops;
  cu_op *ops;
  cudaGraphExec_t exec;
  uint64_t last_use;
  cudaGraph_t graph;         /* kept while meta_node refers to it */
  cudaGraphNode_t meta_node; /* its OP_META kernel, whose parameters each replay sets */
  int nodes;                 /* kernel nodes (launches) of the graph */
} cu_graph;

#define CU_MAX_FUSIONS 40
typedef struct {
  sm_backend base;
  int dev, n_sm, arch;
  size_t smem_optin;
  cu_tune t;
  cu_ctx cx;          /* stream, &t, carve, device, &cnt */
  cu_counters cnt;
  cudaStream_t s;
  cublasHandle_t blas;
  void *blas_ws;
  bool has_q4;        /* some weight has the CW_Q4 layout: the carveout of its kernels applies */
  /* host copy of the current batch */
  int n_tokens, n_seqs, max_blocks, n_out, n_tiles;
  int32_t *h_meta; /* pinned: tokens, pos, seq, out_rows, tiles, table */
  int32_t *d_meta;
  size_t meta_cap; /* int32 elements */
  int32_t *d_tokens, *d_pos, *d_seq, *d_out, *d_tiles, *d_table;
  int32_t *d_rslot, *d_rfirst, *d_rcount; /* recurrent models: per sequence its state slot, first token, tokens */
  int32_t *h_pos, *h_tiles; /* views into h_meta */
  cudaEvent_t meta_ev;
  bool meta_ev_live;
  cu_meta_blob meta_blob; /* the current fed step's (OP_META) */
  /* pipelined decode (sample_async): the sampled token is written straight into the token slot of
   * the batch metadata (d_feed = d_meta when it was issued); its two host copies (pinned) and events */
  int32_t *d_feed, *h_feed;
  cudaEvent_t feed_ev[2];
  bool feed_live[2];
  int feed_next;
  /* pipelined batch steps (sample_batch_async): per slot the sampled tokens on the device (the next
   * batch's feed_rows read the latest's) and their pinned host copy, the event after the copy, and the
   * slots' bookkeeping */
  int32_t *bs_d[2], *bs_h[2];
  int bs_cap[2];
  cudaEvent_t bs_ev[2];
  sm_batch_slots bs;
  /* scratch */
  float *part; size_t part_cap;     /* attention partials (floats) */
  int *att_cnt; size_t att_cnt_cap; /* decode attention split counters (zero between launches) */
  void *x16; size_t x16_cap;        /* activations as bf16/f16 (bytes) */
  void *deq; size_t deq_cap;        /* dequantized weight tile (bytes) */
  void *xq; size_t xq_cap;          /* int8-quantized activations for CW_Q4 matvecs (bytes) */
  void *xq2; size_t xq2_cap;        /* second one: silu(gate)*up written by the gate/up or MLP kernel */
  float *ssp; size_t ssp_cap;       /* deferred rmsnorm: partial sums of squares (cu_mlp_dnorm) */
  int32_t *seg_lohi; size_t seg_cap; /* attention_seg: per-token key ranges (bytes) */
  void *seg_h; size_t seg_hcap;       /* attention_seg on tensor cores: q, k, v in f16 (bytes) */
  int32_t *d_span; size_t span_cap;  /* the batch's attn_span (bytes) */
  bool has_span;                     /* the current batch has one */
  float *am_pv; int *am_pi; unsigned *am_cnt; /* greedy sampling inside the decode graph (cu_argmax1) */
  void *moe; size_t moe_cap;        /* grouped expert GEMMs: gathered rows, their outputs, slot order (cuda_moe.cu) */
  int32_t *h_moe; size_t h_moe_cap; /* host: their expert ids and slot order */
  /* recording / graphs */
  bool rec;
  cu_op *ops; int n_ops, cap_ops;
  cu_graph graphs[N_GRAPHS];
  uint64_t seen[N_SEEN]; int n_seen_next;
  uint64_t tick;
  bool graphs_on;
  bool failed;
  void *nccl; /* tensor parallelism: the group's ncclComm_t (cuda_comm.cu), NULL outside a group */
  void *car;  /* ... and its one-shot all-reduce through the peers' memory, NULL where it is not set up */
  /* what the executor did: per fusion table entry and per unfused op type, in the last forward and in all */
  long fused_last[CU_MAX_FUSIONS], fused_all[CU_MAX_FUSIONS];
  long unfused_last[OP_COUNT], unfused_all[OP_COUNT];
  int graph_nodes_last; /* kernel launches of the last captured graph */
  long st_graph_launch, st_capture, st_eager_fwd;
  long st_gsample, st_gmeta; /* greedy samples inside the decode graph; fed steps with OP_META */
  /* profile (tuning profile): every op timed with events */
  cudaEvent_t pe0, pe1;
  struct { char label[64]; double ms, flop; long count; } pt[96]; /* flop: attention's (prefill) */
  int n_pt;
  /* stats (tuning stats): GPU time of graph replays and of the download after them, host time */
  cudaEvent_t se0, se1, se2;
  int st_pending; /* 1: se0/se1 around a graph launch, 2: also se2 after the download */
  double st_graph_ms, st_dl_ms, st_flush_us;
  double t_ret, t_setb, st_outside_us, st_rec_us, st_wait_us;
  long st_steps, st_timed;
  int st_n;           /* tokens of the step being timed */
  long st_grow;       /* scratch buffers regrown (cu_ensure_buf: frees, allocates, drops the graphs) */
  long st_mark[3];    /* captures, eager forwards and regrowths when the step began (slow steps are listed) */
  /* steps and set_batch..sync us by step size (cu_stats_collect's buckets of tokens) */
  long st_bk_n[7];
  double st_bk_us[7];
  /* timeline (stats 2) of pipelined decode steps, events per feed slot: 0 before the batch upload, 1
   * after it, 2 / 3 around the graph, 4 after sampling, 5 after the token download; tl_sum: upload,
   * gap to the graph, graph, sampling, download, step period (ms) */
  cudaEvent_t tle[2][6];
  bool tl_rec[2][6];
  double tl_sum[6];
  long tl_n;
} cuda_be;

static inline cuda_be *CB(sm_backend *be) { return (cuda_be *)be; }
bool cu_ck(cuda_be *c, cudaError_t e, const char *what); /* false (and the backend failed) on an error */
bool cu_ensure_buf(cuda_be *c, void **p, size_t *cap, size_t need);
/* attention over kv (cuda_backend.cu): whether the attention kernels take the shape, and the op recorded on
 * the kernel the step takes (decode, decq or tiled; cu_attn_shape_ok first). sinks (may be NULL): gpt-oss's
 * attention sinks, never on the decq kernel; callers keep them out of batch-invariant mode */
bool cu_attn_shape_ok(const cuda_be *c, const sm_kv_cache *kv, int layer, int n_heads);
void cu_record_attention(cuda_be *c, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                         float scale, int window, float softcap, const float *sinks);

/* cuda_graph.cu */
void cu_submit(cuda_be *c, const cu_op *o); /* record (or run, when not recording) one op */
void cu_flush(cuda_be *c);                  /* run what was recorded: a graph replay, a capture or eagerly */
void cu_graphs_clear(cuda_be *c);
void cu_meta_launch(cuda_be *c, int32_t *dst); /* OP_META: c->meta_blob into dst */

/* cuda_comm.cu: the tensor-parallel collectives (NCCL), their ops' executor, the communicator's end */
void cu_comm_install(sm_backend *b);
void cu_comm_exec(cuda_be *c, const cu_op *o);
void cu_comm_destroy(cuda_be *c);
/* an all-reduce of y, x += y and out = rmsnorm(x) in one kernel (the fusion table's all_reduce+add+rmsnorm):
 * whether it can run for n rows of dim, and running it */
bool cu_comm_ar_norm_ok(cuda_be *c, const float *y, const float *x, const float *out, const float *w, int n, int dim);
void cu_comm_ar_norm(cuda_be *c, float *y, float *x, float *out, const float *w, int n, int dim, float eps, float off);

/* cuda_fuse.cu */
void cu_exec_ops(cuda_be *c); /* the recorded ops, through the fusion table */
int cu_fusion_count(void);
const char *cu_fusion_name(int i);
/* cuda_exec.cu: one op, unfused (timed per op with tuning profile), and the kernel arguments an attention
 * or KV-store op gives both the fused and the unfused paths */
void cu_exec_op(cuda_be *c, const cu_op *o);
struct cu_attn_args;
struct cu_kv_dst;
void cu_attn_args_of(const cuda_be *c, const cu_op *at, struct cu_attn_args *a);
struct cu_kv_dst cu_kv_dst_of(const cuda_be *c, const cu_op *kv);

/* cuda_encoder.cu: the ops with explicit shapes (backend.h attention_seg ... copy) */
void cu_encoder_ops_init(sm_backend *b);
void cu_exec_encoder_op(cuda_be *c, const cu_op *o);

/* cuda_prof.cu */
void cu_prof_begin(cuda_be *c);
void cu_prof_end(cuda_be *c, const char *label, double flop); /* flop: the op's, 0 if not counted */
void cu_prof_init(cuda_be *c);
void cu_prof_report(cuda_be *c); /* at destroy */
void cu_stats_collect(cuda_be *c); /* after a sync */
void cu_tl_mark(cuda_be *c, int e);
void cu_tl_collect(cuda_be *c, int k);
void cu_trace_init(const cu_tune *t);
void cu_trace_report(void);
void cu_prof_free(cuda_be *c);

#endif
