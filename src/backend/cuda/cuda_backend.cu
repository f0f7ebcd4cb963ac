/* CUDA backend: implements the sm_backend op table (backend.h) on one NVIDIA GPU.
 *
 * - Weights are uploaded once in prepare_weight and repacked for their kernels (cuda_weights.cu).
 * - Ops are recorded as typed ops (cuda_be.cuh) between set_batch and the next download, sync or
 *   sample, then run through the fusion table (cuda_fuse.cu) and, for small steps, replayed as CUDA
 *   graphs (cuda_graph.cu). Every op is issued on one stream.
 * - Decode matmuls run matvec kernels (cuda_mv.cu, cuda_q4.cu, cuda_mlp.cu); larger batches cuBLAS
 *   (cuda_gemm.cu); attention in cuda_attn.cu / cuda_attn_prefill.cu; sampling in cuda_sample.cu.
 * - Tuning values: one cu_tune per instance, read at creation (cuda_tune.cu). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_be.cuh"
#include "backend/kv_quant.h"
#include "backend/cuda/cuda_mlp.cuh"
#include "backend/cuda/cuda_mla.cuh"
#include "backend/cuda/cuda_qmma.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "backend/cuda/cuda_sample.cuh"
#include "backend/cuda/cuda_ssm.cuh"
#include "backend/sample_math.h"

bool cu_ck(cuda_be *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  if (!c->failed) fprintf(stderr, "smelt cuda: %s: %s\n", what, cudaGetErrorString(e));
  c->failed = true;
  sm_err(SMELT_ERR_BACKEND, "cuda: %s: %s", what, cudaGetErrorString(e));
  return false;
}

bool cu_ensure_buf(cuda_be *c, void **p, size_t *cap, size_t need) {
  if (need <= *cap) return true;
  c->st_grow++;
  cu_graphs_clear(c);
  if (*p) cudaFree(*p);
  *p = NULL;
  *cap = 0;
  size_t n = need + need / 4;
  if (!cu_ck(c, cudaMalloc(p, n), "scratch alloc")) { *p = NULL; return false; }
  if (c->t.poison) cudaMemset(*p, 0xff, n);
  *cap = n;
  return true;
}

/* ================= memory ================= */
static void *be_alloc(sm_backend *be, size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) { cudaGetLastError(); return NULL; }
  if (CB(be)->t.poison) cudaMemset(p, 0xff, bytes ? bytes : 16);
  return p;
}
static void be_free(sm_backend *be, void *p) {
  cuda_be *c = CB(be);
  if (!p) return;
  cu_flush(c);
  cu_graphs_clear(c);
  cudaFree(p);
}
static void be_upload(sm_backend *be, void *dst, const void *src, size_t n) {
  cuda_be *c = CB(be);
  if (!n) return;
  cu_flush(c);
  cu_ck(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->s), "upload");
}
static void be_download(sm_backend *be, void *dst, const void *src, size_t n) {
  cuda_be *c = CB(be);
  cu_flush(c);
  if (n) cu_ck(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->s), "download");
  if (c->st_pending) { cudaEventRecord(c->se2, c->s); c->st_pending = 2; }
  cu_ck(c, cudaStreamSynchronize(c->s), "sync");
  cu_stats_collect(c);
}
static void be_submit(sm_backend *be) { cu_flush(CB(be)); }
static void be_sync(sm_backend *be) {
  cuda_be *c = CB(be);
  cu_flush(c);
  cu_ck(c, cudaStreamSynchronize(c->s), "sync");
  cu_stats_collect(c);
}

/* ===== sample op (device sampling; kernels in cuda_sample.cu) ===== */
/* Runs the recorded forward (flush), then samples on the stream from the logits it left on the
 * device; only the token ids are copied back. */
static smelt_status be_sample(sm_backend *be, const float *logits, int n_rows, int vocab, const sm_sample_req *req,
                              int n_req, int32_t *out_tokens) {
  cuda_be *c = CB(be);
  cu_flush(c);
  smelt_status st = cu_sample(logits, n_rows, vocab, req, n_req, out_tokens, c->s, c->dev, NULL, c->t.walk_bps);
  if (c->t.stats && c->st_pending == 1) { /* the sampling after a timed graph replay */
    cudaEventRecord(c->se2, c->s);
    cudaEventSynchronize(c->se2);
    c->st_pending = 2;
  }
  cu_stats_collect(c); /* the step ends here, as at a download */
  return st;
}
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
  if (c->rec && n_rows >= 1 && req->row >= 0 && req->row < n_rows && req->n_pen == 0 &&
      req->n_bias == 0 && !req->mask &&
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
    o.am.logits = logits + (size_t)req->row * (size_t)vocab;
    o.am.dtok = c->d_feed;
    o.am.htok = c->h_feed + k;
    o.am.vocab = vocab;
    cu_submit(c, &o);
    cu_flush(c);
    c->st_gsample++;
    cu_tl_mark(c, 4);
    if (!cu_ck(c, cudaEventRecord(c->feed_ev[k], c->s), "event")) return SMELT_ERR_BACKEND;
    cu_tl_mark(c, 5);
    c->feed_live[k] = true;
    c->feed_next = 1 - k;
    *slot = k;
    return SMELT_OK;
  }
  cu_flush(c);
  smelt_status st = cu_sample(logits, n_rows, vocab, req, 1, NULL, c->s, c->dev, c->d_feed, c->t.walk_bps);
  if (st) return st;
  cu_tl_mark(c, 4);
  if (!cu_ck(c, cudaMemcpyAsync(c->h_feed + k, c->d_feed, 4, cudaMemcpyDeviceToHost, c->s), "token download") ||
      !cu_ck(c, cudaEventRecord(c->feed_ev[k], c->s), "event"))
    return SMELT_ERR_BACKEND;
  cu_tl_mark(c, 5);
  c->feed_live[k] = true;
  c->feed_next = 1 - k;
  *slot = k;
  return SMELT_OK;
}
static smelt_status be_sample_wait(sm_backend *be, int slot, int32_t *token) {
  cuda_be *c = CB(be);
  if (slot < 0 || slot > 1 || !c->feed_live[slot]) return sm_err(SMELT_ERR_INVALID, "cuda: no sample in slot %d", slot);
  c->feed_live[slot] = false;
  if (!cu_ck(c, cudaEventSynchronize(c->feed_ev[slot]), "sample wait")) return SMELT_ERR_BACKEND;
  *token = c->h_feed[slot];
  cu_tl_collect(c, slot);
  return SMELT_OK;
}

/* pipelined batch steps: the sample op of n_req requests into slot k's device tokens, then their
 * copy to the slot's pinned host buffer, without waiting */
static smelt_status be_sample_batch_async(sm_backend *be, const float *logits, int n_rows, int vocab,
                                          const sm_sample_req *req, int n_req, int *slot) {
  cuda_be *c = CB(be);
  int k;
  smelt_status st = sm_batch_slots_take(&c->bs, n_req, &k);
  if (st) return st;
  if (!c->bs_ev[k] && cudaEventCreateWithFlags(&c->bs_ev[k], cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    c->bs_ev[k] = NULL;
    return sm_err(SMELT_ERR_BACKEND, "cuda: pipelined sampling event");
  }
  if (n_req > c->bs_cap[k]) { /* slot k is not the latest: nothing queued reads its buffers */
    cu_flush(c);
    cudaStreamSynchronize(c->s);
    if (c->bs_d[k]) cudaFree(c->bs_d[k]);
    if (c->bs_h[k]) cudaFreeHost(c->bs_h[k]);
    c->bs_d[k] = c->bs_h[k] = NULL;
    c->bs_cap[k] = 0;
    const int cap = SM_MAX(n_req, 64);
    if (cudaMalloc(&c->bs_d[k], sizeof(int32_t) * (size_t)cap) != cudaSuccess ||
        cudaMallocHost(&c->bs_h[k], sizeof(int32_t) * (size_t)cap) != cudaSuccess) {
      cudaGetLastError();
      return sm_err(SMELT_ERR_OOM, "cuda: pipelined sampling buffers");
    }
    c->bs_cap[k] = cap;
  }
  cu_flush(c);
  if (n_req) {
    if ((st = cu_sample(logits, n_rows, vocab, req, n_req, NULL, c->s, c->dev, c->bs_d[k], c->t.walk_bps))) return st;
    if (!cu_ck(c, cudaMemcpyAsync(c->bs_h[k], c->bs_d[k], sizeof(int32_t) * (size_t)n_req, cudaMemcpyDeviceToHost, c->s),
               "token download"))
      return SMELT_ERR_BACKEND;
  }
  if (!cu_ck(c, cudaEventRecord(c->bs_ev[k], c->s), "event")) return SMELT_ERR_BACKEND;
  sm_batch_slots_fill(&c->bs, k, n_req);
  *slot = k;
  return SMELT_OK;
}
static smelt_status be_sample_batch_wait(sm_backend *be, int slot, int32_t *tokens) {
  cuda_be *c = CB(be);
  smelt_status st = sm_batch_slots_wait(&c->bs, slot);
  if (st) return st;
  if (!cu_ck(c, cudaEventSynchronize(c->bs_ev[slot]), "sample wait")) return SMELT_ERR_BACKEND;
  if (c->bs.n[slot]) memcpy(tokens, c->bs_h[slot], sizeof(int32_t) * (size_t)c->bs.n[slot]);
  cu_stats_collect(c);
  return SMELT_OK;
}
/* fed tokens (feed_rows): the uploaded token -1 - r becomes row r of the latest batch sample */
__global__ void k_feed_tokens(int32_t *tok, int n, const int32_t *samp) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n && tok[t] < 0) tok[t] = samp[-1 - tok[t]];
}

/* ================= weights ================= */
static smelt_status be_prepare_weight(sm_backend *be, sm_weight *w) {
  cuda_be *c = CB(be);
  if (!w) return sm_err(SMELT_ERR_INVALID, "cuda: NULL weight");
  cu_flush(c);
  cu_weight *cw = NULL;
  smelt_status st = cu_weight_upload(&c->cx, w, c->t.q4, &cw);
  if (st) {
    if (st == SMELT_ERR_BACKEND) c->failed = true;
    return st;
  }
  if (cw->kind == CW_Q4 && !c->has_q4) { /* the one-token int8 kernels: one carveout for all kernels */
    c->has_q4 = true;
    c->cx.carve = c->t.carve;
  }
  w->dev = cw;
  return SMELT_OK;
}

static void be_release_weight(sm_backend *be, sm_weight *w) {
  cuda_be *c = CB(be);
  if (!w || !w->dev) return;
  cu_flush(c);
  cu_graphs_clear(c);
  cudaStreamSynchronize(c->s);
  cu_weight_free((cu_weight *)w->dev);
  w->dev = NULL;
}

static smelt_status be_set_batch(sm_backend *be, const sm_batch *b) {
  cuda_be *c = CB(be);
  cu_flush(c);
  if (c->t.stats) {
    c->t_setb = sm_now();
    if (c->t_ret > 0) c->st_outside_us += (c->t_setb - c->t_ret) * 1e6;
    c->st_n = b ? b->n_tokens : 0;
    c->st_mark[0] = c->st_capture;
    c->st_mark[1] = c->st_eager_fwd;
    c->st_mark[2] = c->st_grow;
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
  /* recurrent models: each sequence's tokens one run of consecutive positions (backend.h) */
  if (b->state_slot) {
    if (b->feed_token) return sm_err(SMELT_ERR_INVALID, "cuda: fed tokens with recurrent state are not supported");
    for (int t = 1; t < n; t++)
      if (b->seq[t] == b->seq[t - 1] ? b->pos[t] != b->pos[t - 1] + 1 : false)
        return sm_err(SMELT_ERR_INVALID, "cuda: recurrent state needs consecutive positions within a sequence");
    for (int t = 1; t < n; t++)
      if (b->seq[t] != b->seq[t - 1])
        for (int u = 0; u < t - 1; u++)
          if (b->seq[u] == b->seq[t]) return sm_err(SMELT_ERR_INVALID, "cuda: a sequence's tokens must be one run");
  }
  /* layout: 9 equal sections: tokens, pos, seq, out_rows, tiles, recurrent (slot, first, count per sequence),
   * then table in the last 3; offsets depend only on the capacity so device pointers stay fixed */
  size_t sec_need = SM_MAX((size_t)n + 1, (size_t)b->n_out);
  sec_need = SM_MAX(sec_need, (nt + 2) / 3);
  if (b->state_slot) sec_need = SM_MAX(sec_need, 3 * (size_t)b->n_seqs);
  if (c->meta_ev_live) cudaEventSynchronize(c->meta_ev); /* staging buffer free again */
  if (sec_need * 9 > c->meta_cap) {
    cu_graphs_clear(c);
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
  const size_t sec = c->meta_cap / 9;
  const size_t o_tok = 0, o_pos = sec, o_seq = 2 * sec, o_out = 3 * sec, o_tiles = 4 * sec, o_rec = 5 * sec,
               o_table = 6 * sec;
  int32_t *h = c->h_meta;
  if (n) {
    memcpy(h + o_tok, b->tokens, (size_t)n * 4);
    memcpy(h + o_pos, b->pos, (size_t)n * 4);
    memcpy(h + o_seq, b->seq, (size_t)n * 4);
  }
  bool fed = false; /* feed_rows: the token section carries -1 - row, resolved on the device after the upload */
  if (b->feed_rows)
    for (int t = 0; t < n; t++) {
      const int r = b->feed_rows[t];
      if (r < 0) continue;
      smelt_status st = sm_batch_slots_feed(&c->bs, t, r);
      if (st) return st;
      h[o_tok + t] = -1 - r;
      fed = true;
    }
  if (b->n_out) memcpy(h + o_out, b->out_rows, (size_t)b->n_out * 4);
  if (nt) memcpy(h + o_table, b->block_table, nt * 4);
  int32_t *tiles = h + o_tiles;
  int n_tiles = 0;
  for (int t = 0; t < n;) {
    int t1 = t + 1;
    while (t1 < n && t1 - t < CU_ATT_TQ && b->seq[t1] == b->seq[t]) t1++;
    tiles[n_tiles++] = t;
    t = t1;
  }
  tiles[n_tiles] = n;
  size_t rec_end = 0;
  if (b->state_slot) {
    const int ns = b->n_seqs;
    int32_t *r = h + o_rec;
    for (int s = 0; s < ns; s++) { r[s] = b->state_slot[s]; r[ns + s] = 0; r[2 * ns + s] = 0; }
    for (int t = 0; t < n; t++) {
      const int s = b->seq[t];
      if (!r[2 * ns + s]) r[ns + s] = t;
      r[2 * ns + s]++;
    }
    rec_end = o_rec + 3 * (size_t)ns;
  }
  c->n_tokens = n; c->n_seqs = b->n_seqs; c->max_blocks = b->max_blocks; c->n_out = b->n_out; c->n_tiles = n_tiles;
  c->h_pos = h + o_pos;
  c->h_tiles = tiles;
  c->d_tokens = c->d_meta + o_tok; c->d_pos = c->d_meta + o_pos; c->d_seq = c->d_meta + o_seq;
  c->d_out = c->d_meta + o_out; c->d_tiles = c->d_meta + o_tiles; c->d_table = c->d_meta + o_table;
  c->d_rslot = c->d_meta + o_rec;
  c->d_rfirst = c->d_rslot + b->n_seqs;
  c->d_rcount = c->d_rfirst + b->n_seqs;
  /* one copy covering everything used */
  size_t used = nt ? o_table + nt : SM_MAX(o_tiles + (size_t)n_tiles + 1, rec_end);
  /* fed token: token 0 is already in place (written there by the last sample_async, queued
   * before), the upload skips the token section */
  const bool feed = b->feed_token && n > 0;
  if (feed && (c->d_feed != c->d_meta || n != 1))
    return sm_err(SMELT_ERR_INVALID, "cuda: feed_token needs a one-token batch after a sample_async");
  const size_t from = feed ? o_pos : 0;
  cu_tl_mark(c, 0);
  c->n_ops = 0;
  /* every step is recorded (the fusion table sees its ops); steps of up to GRAPH_MAX_TOKENS are captured
   * as graphs, larger ones (and all of them when profiling) run eagerly at the flush */
  c->rec = (c->graphs_on || c->t.profile) && n > 0;
  if (feed && c->graphs_on && !c->t.profile && c->rec && (size_t)b->n_out + (size_t)n_tiles + 3 + nt <= META_MAXV) {
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
    o.meta.dst = c->d_meta;
    cu_submit(c, &o);
    c->st_gmeta++;
  } else {
    if (!cu_ck(c, cudaMemcpyAsync(c->d_meta + from, h + from, (used - from) * 4, cudaMemcpyHostToDevice, c->s),
            "batch upload"))
      return SMELT_ERR_BACKEND;
    cudaEventRecord(c->meta_ev, c->s);
    c->meta_ev_live = true;
  }
  if (fed) {
    k_feed_tokens<<<(unsigned)((n + 255) / 256), 256, 0, c->s>>>(c->d_tokens, n, c->bs_d[c->bs.last]);
    if (!cu_ck(c, cudaGetLastError(), "fed tokens")) return SMELT_ERR_BACKEND;
  }
  cu_tl_mark(c, 1);
  /* widened attention (bidirectional image tokens): its own copy, read by the attention op */
  c->has_span = b->attn_span && n > 0;
  if (c->has_span &&
      (!cu_ensure_buf(c, (void **)&c->d_span, &c->span_cap, sizeof(int32_t) * 2 * (size_t)n) ||
       !cu_ck(c, cudaMemcpyAsync(c->d_span, b->attn_span, sizeof(int32_t) * 2 * (size_t)n, cudaMemcpyHostToDevice, c->s),
              "attention spans")))
    return SMELT_ERR_BACKEND;
  return SMELT_OK;
}


/* ================= ops (recorded) ================= */
static bool w_ready(const sm_weight *w) {
  if (w && w->dev) return true;
  sm_err(SMELT_ERR_INVALID, "cuda: weight used before prepare_weight");
  return false;
}

static void be_embed(sm_backend *be, const sm_weight *emb, float *out) {
  cuda_be *c = CB(be);
  if (!w_ready(emb)) {
    if (emb && emb->cols > 0) cudaMemsetAsync(out, 0, (size_t)c->n_tokens * emb->cols * 4, c->s);
    return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_EMBED;
  o.emb.cw = (const cu_weight *)emb->dev;
  o.emb.out = out;
  cu_submit(c, &o);
}

static void be_matmul(sm_backend *be, sm_mm_role role, const sm_weight *w, const float *x, int n, float *y) {
  cuda_be *c = CB(be);
  if (n <= 0 || !w || w->rows <= 0) return;
  if (!w_ready(w)) { cudaMemsetAsync(y, 0, (size_t)n * w->rows * 4, c->s); return; }
  const cu_weight *cw = (const cu_weight *)w->dev;
  const bool inv = c->base.batch_invariant; /* one-token matvecs for every token (x_matmul) */
  const int nq = inv ? 1 : n;               /* columns a matvec launch takes */
  if (cw->kind == CW_Q4 && (inv || cu_use_matvec(cw, n))) {
    if (!cu_ensure_buf(c, &c->xq, &c->xq_cap, cu_q4_scratch_bytes(nq, cw->cols)) ||
        !cu_ensure_buf(c, &c->xq2, &c->xq2_cap, cu_q4_scratch_bytes(nq, cw->cols)) ||
        !cu_ensure_buf(c, (void **)&c->ssp, &c->ssp_cap, sizeof(float) * (size_t)(cw->cols / 32 + 1)))
      return;
  }
  if (!inv && !cu_use_matvec(cw, n) && !(cw->kind == CW_DENSE && cw->dtype == SM_DT_F32)) {
    if (!cu_ensure_buf(c, &c->x16, &c->x16_cap, cu_qmma_x16_bytes(n, cw->cols))) return;
    if (cw->kind != CW_DENSE) {
      size_t want = (size_t)cw->rows * cw->cols * 2;
      size_t minb = (size_t)cw->cols * 2 * 128;
      if (want > DEQ_BYTES) want = DEQ_BYTES > minb ? DEQ_BYTES : minb;
      if (!cu_ensure_buf(c, &c->deq, &c->deq_cap, want)) return;
    }
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_MATMUL;
  o.mm.w = w;
  o.mm.cw = cw; /* a re-prepared weight changes the op (graph key) */
  o.mm.x = x;
  o.mm.y = y;
  o.mm.n = n;
  o.mm.role = (int)role;
  cu_submit(c, &o);
}

static void be_rmsnorm(sm_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps, float off) {
  cuda_be *c = CB(be);
  if (n <= 0 || dim <= 0) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_RMSNORM;
  o.norm.out = out; o.norm.x = x; o.norm.w = w; o.norm.n = n; o.norm.dim = dim; o.norm.eps = eps; o.norm.off = off;
  cu_submit(c, &o);
}

static void be_rope(sm_backend *be, float *x, int n_heads, int head_dim, int rot_dim, const float *inv_freq) {
  cuda_be *c = CB(be);
  if (rot_dim > head_dim) rot_dim = head_dim;
  rot_dim &= ~1;
  if (rot_dim < 2 || n_heads <= 0 || c->n_tokens <= 0) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_ROPE;
  o.rope.x = x; o.rope.inv = inv_freq; o.rope.nh = n_heads; o.rope.hd = head_dim; o.rope.rot = rot_dim;
  cu_submit(c, &o);
}

static void be_rope_ext(sm_backend *be, float *x, int n_heads, int head_dim, const sm_rope_ext *r) {
  cuda_be *c = CB(be);
  if (!r || r->rot_dim < 2 || r->rot_dim > head_dim || r->rot_dim % 2 || r->n_rows < 1 || n_heads <= 0 ||
      c->n_tokens <= 0 || (r->beta > 0.f && r->beta_pos <= 0))
    return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_ROPEX;
  o.rx.x = x; o.rx.inv = r->inv_freq; o.rx.nh = n_heads; o.rx.hd = head_dim; o.rx.rot = r->rot_dim;
  o.rx.n_rows = r->n_rows; o.rx.pos0 = r->pos0; o.rx.mscale = r->mscale; o.rx.beta = r->beta > 0.f ? r->beta : 0.f;
  o.rx.beta_pos = r->beta > 0.f ? r->beta_pos : 0;
  cu_submit(c, &o);
}

static void be_layernorm(sm_backend *be, float *out, const float *x, const float *w, const float *b, int n, int dim,
                         float eps) {
  cuda_be *c = CB(be);
  if (n <= 0 || dim <= 0) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_LAYERNORM;
  o.ln.out = out; o.ln.x = x; o.ln.w = w; o.ln.b = b; o.ln.n = n; o.ln.dim = dim; o.ln.eps = eps;
  cu_submit(c, &o);
}

static void be_kv_store(sm_backend *be, const sm_kv_cache *kv, int layer, const float *k, const float *v) {
  cuda_be *c = CB(be);
  if (!kv || layer < 0 || layer >= kv->n_layers || kv->block_size <= 0 || c->n_tokens <= 0) return;
  if (sm_kv_quantized(kv->dtype) && kv->head_dim % 4) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: a %s KV cache needs a head dim that is a multiple of 4 (%d)",
           sm_kv_dtype_name(kv->dtype), kv->head_dim);
    return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_KVSTORE;
  o.kv.K = kv->k[layer]; o.kv.V = kv->v[layer]; o.kv.k = k; o.kv.v = v; o.kv.dt = (int)kv->dtype;
  o.kv.row = kv->n_kv_heads * kv->head_dim; o.kv.hd = kv->head_dim; o.kv.bs = kv->block_size; o.kv.nblocks = kv->n_blocks;
  cu_submit(c, &o);
}

bool cu_attn_shape_ok(const cuda_be *c, const sm_kv_cache *kv, int layer, int n_heads) {
  return kv && layer >= 0 && layer < kv->n_layers && n_heads > 0 && kv->n_kv_heads > 0 && kv->head_dim > 0 &&
         n_heads % kv->n_kv_heads == 0 && kv->head_dim % 4 == 0 && kv->head_dim <= 512 && kv->block_size > 0 &&
         cu_attn_tiled_ok(kv->head_dim, n_heads / kv->n_kv_heads, kv->dtype, c->smem_optin);
}

void cu_record_attention(cuda_be *c, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                         float scale, int window, float softcap, const float *sinks) {
  const int nt = c->n_tokens;
  const int G = n_heads / kv->n_kv_heads, hs = cu_attn_dec_hsplit(&c->t, kv->head_dim, G);
  int Sd = 0; /* > 0: one-token-per-sequence decode kernel with Sd splits */
  bool glong = false;
  if (c->base.batch_invariant && !c->has_span && cu_attn_dec_ok(kv->head_dim, G, kv->dtype)) {
    /* batch-invariant mode: every token, prefill or decode, on the decode kernel (its sequence's
     * earlier tokens of this step are in the cache: kv_store ran before, and no PDL overlaps them)
     * with a split count that does not depend on the batch (so a token's splits start at positions that
     * depend only on its own position) and the cluster combine at every length */
    Sd = c->t.attn_s >= 1 ? c->t.attn_s : CU_ATTN_INV_SPLITS;
    if (cu_attn_dec_smem(&c->t, kv->head_dim, G, Sd, kv->dtype) > c->smem_optin) Sd = 0;
  } else if (c->n_tiles == nt && !c->has_span && cu_attn_dec_ok(kv->head_dim, G, kv->dtype)) {
    Sd = cu_attn_dec_splits(&c->t, nt, kv->n_kv_heads * hs, c->n_sm);
    if (cu_attn_dec_smem(&c->t, kv->head_dim, G, Sd, kv->dtype) > c->smem_optin) Sd = 0;
    if (Sd > 1 && c->t.attn_long > 0) { /* long contexts: the global-memory split combine (a new graph) */
      int maxlen = 1;
      for (int t = 0; t < nt; t++) {
        int len = c->h_pos[t] + 1;
        if (window > 0 && len > window) len = window;
        if (len > maxlen) maxlen = len;
      }
      if (maxlen >= c->t.attn_long) glong = true;
    }
  }
  if (Sd > 1) {
    size_t need = sizeof(int) * (size_t)nt * kv->n_kv_heads * hs, old = c->att_cnt_cap;
    if (!cu_ensure_buf(c, (void **)&c->att_cnt, &c->att_cnt_cap, need)) return;
    if (c->att_cnt_cap != old && !cu_ck(c, cudaMemset(c->att_cnt, 0, c->att_cnt_cap), "attention counters")) return;
  }
  /* batch-invariant mode without the decode kernel (head dims past 256, quantized caches): the tiled
   * kernel in one split for every batch; else one token per sequence over a quantized cache: its own
   * decode kernel, split as the float cache's */
  const bool inv = c->base.batch_invariant && !Sd;
  const int Sq = !Sd && !inv && !sinks && c->t.attn_dq && c->n_tiles == nt && !c->has_span && cu_attn_decq_ok(kv->head_dim, G, kv->dtype)
                   ? cu_attn_dec_splits(&c->t, nt, kv->n_kv_heads, c->n_sm)
                   : 0;
  const int S = Sd ? Sd : Sq ? Sq : inv ? 1 : cu_attn_tiled_splits(c->n_tiles, kv->n_kv_heads, c->n_sm);
  if (S > 1 && !cu_ensure_buf(c, (void **)&c->part, &c->part_cap,
                              sizeof(float) * (size_t)nt * n_heads * S * (kv->head_dim + 2)))
    return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_ATTN;
  o.at.out = out; o.at.q = q; o.at.K = kv->k[layer]; o.at.V = kv->v[layer]; o.at.dt = (int)kv->dtype;
  o.at.nh = n_heads; o.at.nkv = kv->n_kv_heads; o.at.hd = kv->head_dim; o.at.bs = kv->block_size;
  o.at.nblocks = kv->n_blocks; o.at.window = window > 0 ? window : 0; o.at.scale = scale;
  o.at.softcap = softcap > 0.f ? softcap : 0.f; o.at.splits = Sd; o.at.glong = glong; o.at.inv = inv; o.at.dq = Sq;
  o.at.span = c->has_span ? c->d_span : NULL;
  o.at.sinks = sinks;
  cu_submit(c, &o);
}

static void be_attention(sm_backend *be, float *out, const float *q, const sm_kv_cache *kv, int layer, int n_heads,
                         float scale, int window, float softcap) {
  cuda_be *c = CB(be);
  if (c->n_tokens <= 0) return;
  if (!cu_attn_shape_ok(c, kv, layer, n_heads)) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: attention shape not supported");
    if (kv && kv->head_dim > 0 && n_heads > 0)
      cudaMemsetAsync(out, 0, (size_t)c->n_tokens * n_heads * kv->head_dim * 4, c->s);
    return;
  }
  cu_record_attention(c, out, q, kv, layer, n_heads, scale, window, softcap, NULL);
}

static void ew(cuda_be *c, int type, float *y, const float *a, const float *b, float s, size_t n, int dim) {
  if (!n) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = type;
  o.ew.y = y; o.ew.a = a; o.ew.b = b; o.ew.s = s; o.ew.n = n; o.ew.dim = dim;
  cu_submit(c, &o);
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
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_GATHER;
  o.gat.dst = dst; o.gat.src = src; o.gat.dim = dim;
  cu_submit(c, &o);
}

/* ===== recurrent (hybrid) models: the state ops read the batch's per-sequence slots (kernels in cuda_ssm.cu);
 * their state copies are the copy op of cuda_encoder.cu ===== */
static void be_mul(sm_backend *be, float *y, const float *a, const float *b, size_t n) { ew(CB(be), OP_MUL, y, a, b, 0, n, 0); }
static void be_sigmoid_mul(sm_backend *be, float *y, const float *g, size_t n) { ew(CB(be), OP_SIGMUL, y, g, NULL, 0, n, 0); }
static void be_relu2(sm_backend *be, float *y, size_t n) { ew(CB(be), OP_RELU2, y, NULL, NULL, 0, n, 0); }

/* the layer's state buffer, or NULL (with the backend failed) when the op cannot run */
static float *rec_state(cuda_be *c, float *const *buf, const sm_kv_cache *kv, int layer, const char *op) {
  if (!kv || !buf || layer < 0 || layer >= kv->n_layers || !buf[layer] || kv->n_slots <= 0) {
    sm_err(SMELT_ERR_INVALID, "cuda: %s without recurrent state for layer %d", op, layer);
    c->failed = true;
    return NULL;
  }
  return buf[layer];
}

static void be_conv1d(sm_backend *be, float *out, const float *x, const float *w, const float *bias, int C, int K,
                      bool act, const sm_kv_cache *kv, int layer) {
  cuda_be *c = CB(be);
  if (c->n_tokens <= 0 || C <= 0) return;
  float *st = rec_state(c, kv ? kv->conv : NULL, kv, layer, "conv1d");
  if (!st) return;
  if (K < 1 || K > CU_CONV_MAX_K) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: convolution kernel %d (at most %d)", K, CU_CONV_MAX_K);
    c->failed = true;
    return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_CONV1D;
  o.cv.out = out; o.cv.x = x; o.cv.w = w; o.cv.b = bias; o.cv.st = st; o.cv.sf = kv->conv_floats;
  o.cv.C = C; o.cv.K = K; o.cv.act = act; o.cv.nseq = c->n_seqs;
  cu_submit(c, &o);
}

static void be_ssm_scan(sm_backend *be, float *y, const float *x, const float *B, const float *Cm, int ld,
                        const float *dt_in, const float *dt_bias, const float *A_log, const float *D, int nh, int P, int G,
                        int N, float dt_min, float dt_max, const sm_kv_cache *kv, int layer) {
  cuda_be *c = CB(be);
  if (c->n_tokens <= 0) return;
  float *st = rec_state(c, kv ? kv->ssm : NULL, kv, layer, "ssm_scan");
  if (!st) return;
  if (nh <= 0 || P <= 0 || G <= 0 || nh % G || N <= 0 || N > 32 * CU_SSM_MAX_PER_LANE) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: selective scan with state size %d (at most %d)", N, 32 * CU_SSM_MAX_PER_LANE);
    c->failed = true;
    return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_SSM;
  o.ss.y = y; o.ss.x = x; o.ss.B = B; o.ss.C = Cm; o.ss.dt = dt_in; o.ss.dtb = dt_bias; o.ss.al = A_log; o.ss.D = D;
  o.ss.st = st; o.ss.sf = kv->ssm_floats; o.ss.ld = ld; o.ss.nh = nh; o.ss.P = P; o.ss.G = G; o.ss.N = N;
  o.ss.nseq = c->n_seqs; o.ss.lo = dt_min; o.ss.hi = dt_max;
  cu_submit(c, &o);
}

static void be_gated_delta(sm_backend *be, float *y, const float *q, const float *k, const float *v, int ld,
                           const float *a, const float *b, const float *A_log, const float *dt_bias, int Hk, int Hv,
                           int Dk, int Dv, const sm_kv_cache *kv, int layer) {
  cuda_be *c = CB(be);
  if (c->n_tokens <= 0) return;
  float *st = rec_state(c, kv ? kv->ssm : NULL, kv, layer, "gated_delta");
  if (!st) return;
  if (Hk <= 0 || Hv <= 0 || Hv % Hk || Dv <= 0 || Dk <= 0 || Dk > 32 * CU_SSM_MAX_PER_LANE) {
    sm_err(SMELT_ERR_UNSUPPORTED, "cuda: gated delta rule with key head size %d (at most %d)", Dk,
           32 * CU_SSM_MAX_PER_LANE);
    c->failed = true;
    return;
  }
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_GDN;
  o.gd.y = y; o.gd.q = q; o.gd.k = k; o.gd.v = v; o.gd.a = a; o.gd.b = b; o.gd.al = A_log; o.gd.dtb = dt_bias;
  o.gd.st = st; o.gd.sf = kv->ssm_floats; o.gd.ld = ld; o.gd.hk = Hk; o.gd.hv = Hv; o.gd.dk = Dk; o.gd.dv = Dv;
  o.gd.nseq = c->n_seqs;
  cu_submit(c, &o);
}

static void be_gated_rmsnorm(sm_backend *be, float *out, const float *x, const float *z, const float *w, int n, int dim,
                             int group, int wdim, float eps, bool norm_first) {
  cuda_be *c = CB(be);
  if (n <= 0 || dim <= 0 || group <= 0 || dim % group || (wdim != group && wdim != dim)) return;
  cu_op o;
  memset(&o, 0, sizeof o);
  o.type = OP_GNORM;
  o.gn.out = out; o.gn.x = x; o.gn.z = z; o.gn.w = w; o.gn.n = n; o.gn.dim = dim; o.gn.group = group;
  o.gn.wdim = wdim; o.gn.nf = norm_first; o.gn.eps = eps;
  cu_submit(c, &o);
}

static double be_measure_bandwidth(sm_backend *be) {
  cuda_be *c = CB(be);
  cu_flush(c);
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


static void be_destroy(sm_backend *be) {
  cuda_be *c = CB(be);
  if (!c) return;
  cu_flush(c);
  if (c->s) cudaStreamSynchronize(c->s);
  cu_mlp_release(c->s);
  cu_prof_report(c);
  cu_trace_report();
  cu_prof_free(c);
  cu_graphs_clear(c);
  cu_comm_destroy(c);
  for (int i = 0; i < N_GRAPHS; i++) free(c->graphs[i].ops);
  free(c->ops);
  if (c->part) cudaFree(c->part);
  if (c->att_cnt) cudaFree(c->att_cnt);
  if (c->x16) cudaFree(c->x16);
  if (c->xq) cudaFree(c->xq);
  if (c->xq2) cudaFree(c->xq2);
  if (c->ssp) cudaFree(c->ssp);
  if (c->seg_lohi) cudaFree(c->seg_lohi);
  if (c->seg_h) cudaFree(c->seg_h);
  if (c->d_span) cudaFree(c->d_span);
  if (c->deq) cudaFree(c->deq);
  if (c->d_meta) cudaFree(c->d_meta);
  if (c->h_meta) cudaFreeHost(c->h_meta);
  if (c->blas) cublasDestroy(c->blas);
  if (c->blas_ws) cudaFree(c->blas_ws);
  if (c->meta_ev) cudaEventDestroy(c->meta_ev);
  if (c->am_cnt) { cudaFree(c->am_pv); cudaFree(c->am_pi); cudaFree(c->am_cnt); }
  if (c->moe) cudaFree(c->moe);
  free(c->h_moe);
  if (c->h_feed) {
    cudaFreeHost(c->h_feed);
    cudaEventDestroy(c->feed_ev[0]);
    cudaEventDestroy(c->feed_ev[1]);
  }
  for (int k = 0; k < 2; k++) {
    if (c->bs_d[k]) cudaFree(c->bs_d[k]);
    if (c->bs_h[k]) cudaFreeHost(c->bs_h[k]);
    if (c->bs_ev[k]) cudaEventDestroy(c->bs_ev[k]);
  }
  if (c->s) cudaStreamDestroy(c->s);
  free(c);
}

extern "C" sm_backend *sm_cuda_backend_create(int device) { return sm_cuda_backend_create_opts(device, NULL); }

extern "C" sm_backend *sm_cuda_backend_create_opts(int device, const sm_backend_opts *opts) {
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
  sm_batch_slots_init(&c->bs);
  c->n_sm = prop.multiProcessorCount;
  c->smem_optin = prop.sharedMemPerBlockOptin;
  c->arch = prop.major * 10 + prop.minor;
  if (cu_tune_read(c->arch, &c->t)) { free(c); return NULL; }
  if (opts && opts->batch_invariant) {
    /* batch-invariant mode (backend.h): no fusions (their kernels exist for some step shapes only and
     * round differently from the unfused ops), and no programmatic dependent launch (the decode
     * attention kernel that every token then runs reads older K/V rows before waiting for the previous
     * kernel, which in a prefill step is the kv_store that wrote them) */
    c->base.batch_invariant = true;
    c->t.fuse = 0;
    c->t.pdl = 0;
  }
  c->graphs_on = c->t.graphs != 0;
  c->cx.t = &c->t;
  c->cx.carve = -1; /* the driver's choice until a weight takes the int8 kernels */
  c->cx.dev = device;
  c->cx.n_sm = c->n_sm;
  c->cx.arch = c->arch;
  c->cx.cnt = &c->cnt;
  cu_prof_init(c);
  cu_trace_init(&c->t);
  cu_mlp_init(device);
  if (cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&c->meta_ev, cudaEventDisableTiming) != cudaSuccess) {
    sm_err(SMELT_ERR_BACKEND, "cuda: stream creation failed");
    be_destroy(&c->base);
    return NULL;
  }
  c->cx.s = c->s;
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
  cu_attn_tiled_init(c->smem_optin);
  sm_backend *b = &c->base;
  b->name = "cuda";
  b->destroy = be_destroy;
  b->alloc = be_alloc;
  b->free = be_free;
  b->upload = be_upload;
  b->download = be_download;
  b->sync = be_sync;
  b->submit = be_submit;
  b->prepare_weight = be_prepare_weight;
  b->release_weight = be_release_weight;
  b->set_batch = be_set_batch;
  b->embed = be_embed;
  b->matmul = be_matmul;
  b->rmsnorm = be_rmsnorm;
  b->rope = be_rope;
  b->rope_ext = be_rope_ext;
  b->layernorm = be_layernorm;
  b->kv_store = be_kv_store;
  b->kv_quant = true;
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
  b->sample_batch_async = be_sample_batch_async;
  b->sample_batch_wait = be_sample_batch_wait;
  b->async = true;
  cu_moe_install(b); /* mixture-of-experts ops, attention sinks (cuda_moe.cu) */
  cu_mla_install(b); /* multi-head latent attention (cuda_mla.cu) */
  cu_comm_install(b); /* tensor-parallel collectives (cuda_comm.cu) */
  b->mul = be_mul;
  b->sigmoid_mul = be_sigmoid_mul;
  b->relu2 = be_relu2;
  b->conv1d = be_conv1d;
  b->ssm_scan = be_ssm_scan;
  b->gated_delta = be_gated_delta;
  b->gated_rmsnorm = be_gated_rmsnorm;
  cu_encoder_ops_init(b); /* ops with explicit shapes, copy among them (cuda_encoder.cu) */
  return b;
}

/* ================= what the backend tells (cuda_api.h) ================= */
extern "C" int sm_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();
  return n;
}

extern "C" const char *sm_cuda_device_name(sm_backend *be, char *buf, size_t n) {
  cudaDeviceProp p;
  if (!be || cudaGetDeviceProperties(&p, CB(be)->dev) != cudaSuccess) { snprintf(buf, n, "?"); return buf; }
  snprintf(buf, n, "%s", p.name);
  return buf;
}

extern "C" void sm_cuda_get_stats(sm_backend *be, sm_cuda_stats *out) {
  cuda_be *c = CB(be);
  memset(out, 0, sizeof *out);
  out->n_fusions = cu_fusion_count() < SM_CUDA_STATS_MAX ? cu_fusion_count() : SM_CUDA_STATS_MAX;
  for (int i = 0; i < out->n_fusions; i++) {
    out->fusion[i] = cu_fusion_name(i);
    out->fused_last[i] = c->fused_last[i];
    out->fused_all[i] = c->fused_all[i];
  }
  out->n_op_types = OP_COUNT < SM_CUDA_STATS_MAX ? OP_COUNT : SM_CUDA_STATS_MAX;
  for (int i = 0; i < out->n_op_types; i++) {
    out->op[i] = cu_op_name(i);
    out->unfused_last[i] = c->unfused_last[i];
  }
  out->graph_nodes_last = c->graph_nodes_last;
  out->graph_launches = c->st_graph_launch;
  out->captures = c->st_capture;
  out->eager_forwards = c->st_eager_fwd;
  out->gsample_steps = c->st_gsample;
  out->gmeta_steps = c->st_gmeta;
  out->mvq4 = c->cnt.launch[CU_K_MVQ4];
  out->mvr = c->cnt.launch[CU_K_MVR];
  out->guq4 = c->cnt.launch[CU_K_GUQ4];
  out->mlp = c->cnt.launch[CU_K_MLP1];
  out->mlp_dnorm = c->cnt.launch[CU_K_MLP1_DNORM];
  out->attn_decode = c->cnt.launch[CU_K_ATTN_DEC] + c->cnt.launch[CU_K_ATTN_DECB];
  out->attn_decb = c->cnt.launch[CU_K_ATTN_DECB];
  out->qwg_prep = c->cnt.launch[CU_K_QWG_PREP];
}

extern "C" int sm_cuda_tune_value(sm_backend *be, const char *name) {
  size_t n;
  const sm_tune_entry *t = cu_tune_table(&n);
  for (size_t i = 0; i < n; i++)
    if (!strcmp(t[i].name, name)) {
      int v;
      memcpy(&v, (const char *)&CB(be)->t + t[i].offset, sizeof v);
      return v;
    }
  return INT32_MIN;
}
