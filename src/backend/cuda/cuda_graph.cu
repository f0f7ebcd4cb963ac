/* Recording and CUDA graph replay. The ops of a step are recorded between set_batch and the next
 * download, sync or sample, and run through the fusion table (cuda_fuse.cu) at that flush. For a small
 * step (<= GRAPH_MAX_TOKENS tokens) the list is hashed and, once the same list has been seen twice,
 * captured as a CUDA graph and replayed from then on; a larger step runs eagerly. An op that must run
 * eagerly (the grouped expert GEMMs of a large step) flushes what was recorded before it and ends the
 * recording for the rest of the step. The batch
 * metadata lives in fixed device buffers refreshed by one copy (or, for a fed one-token step, by the
 * graph's first kernel, whose parameters carry it: OP_META), so a replay reads the new tokens and
 * positions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_be.cuh"

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
void cu_meta_launch(cuda_be *c, int32_t *dst) {
  cu_carve((const void *)k_meta_set, c->cx.carve);
  k_meta_set<<<1, 256, 0, c->s>>>(dst, c->meta_blob);
}

void cu_graphs_clear(cuda_be *c) {
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

void cu_submit(cuda_be *c, const cu_op *o) {
  if (!c->rec) {
    cu_exec_op(c, o);
    return;
  }
  if (c->n_ops == c->cap_ops) {
    c->cap_ops = c->cap_ops ? 2 * c->cap_ops : 1024;
    c->ops = (cu_op *)sm_xrealloc(c->ops, sizeof(cu_op) * (size_t)c->cap_ops);
  }
  c->ops[c->n_ops++] = *o;
}

/* hash of the recorded ops (the graph cache's key; matches are confirmed with memcmp): 8 bytes at a time */
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

static int kernel_nodes(cudaGraph_t graph, cudaGraphNode_t *meta) {
  size_t nn = 0;
  int nk = 0;
  *meta = NULL;
  cudaGraphGetNodes(graph, NULL, &nn);
  cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(nn ? nn : 1, sizeof *nodes);
  if (nodes && cudaGraphGetNodes(graph, nodes, &nn) == cudaSuccess)
    for (size_t i = 0; i < nn; i++) {
      cudaGraphNodeType t;
      if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess || t != cudaGraphNodeTypeKernel) continue;
      nk++;
      cudaKernelNodeParams kp;
      if (!*meta && cudaGraphKernelNodeGetParams(nodes[i], &kp) == cudaSuccess && kp.func == (void *)k_meta_set)
        *meta = nodes[i];
    }
  free(nodes);
  cudaGetLastError();
  return nk;
}

void cu_flush(cuda_be *c) {
  if (!c->rec) return;
  c->rec = false;
  if (c->n_ops == 0) return;
  const double t_flush = c->t.stats ? sm_now() : 0;
  if (c->t.stats && c->t_setb > 0) c->st_rec_us += (t_flush - c->t_setb) * 1e6;
  if (c->n_tokens > GRAPH_MAX_TOKENS) { /* large steps: their launches hide behind their kernels */
    c->st_eager_fwd++;
    cu_exec_ops(c);
    return;
  }
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
        int32_t *dm = c->ops[0].meta.dst;
        void *args[2] = { &dm, &c->meta_blob };
        cudaKernelNodeParams kp = {};
        kp.func = (void *)k_meta_set;
        kp.gridDim = dim3(1);
        kp.blockDim = dim3(256);
        kp.kernelParams = args;
        cu_ck(c, cudaGraphExecKernelNodeSetParams(g->exec, g->meta_node, &kp), "metadata node");
      }
      if (c->t.stats) cudaEventRecord(c->se0, c->s);
      cu_tl_mark(c, 2);
      cu_ck(c, cudaGraphLaunch(g->exec, c->s), "graph launch");
      cu_tl_mark(c, 3);
      if (c->t.stats) {
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
    cu_exec_ops(c);
    return;
  }
  /* second sighting: capture */
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t e = cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    cu_exec_ops(c);
    e = cudaStreamEndCapture(c->s, &graph);
  }
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphNode_t meta_node = NULL;
  int nodes = 0;
  if (e == cudaSuccess) {
    nodes = kernel_nodes(graph, &meta_node);
    if (c->ops[0].type == OP_META && !meta_node) { /* its kernel node must be found (the graph is kept) */
      cudaGraphExecDestroy(exec);
      exec = NULL;
      e = cudaErrorUnknown;
    }
  }
  if (graph && !meta_node) { cudaGraphDestroy(graph); graph = NULL; }
  if (e != cudaSuccess) {
    cudaGetLastError();
    c->graphs_on = false; /* capture unsupported here: run eagerly from now on */
    cu_exec_ops(c);
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
  g->nodes = nodes;
  g->ops = (cu_op *)malloc(sizeof(cu_op) * (size_t)c->n_ops);
  memcpy(g->ops, c->ops, sizeof(cu_op) * (size_t)c->n_ops);
  g->last_use = c->tick;
  c->st_capture++;
  c->graph_nodes_last = nodes;
  cu_ck(c, cudaGraphLaunch(exec, c->s), "graph launch");
}
