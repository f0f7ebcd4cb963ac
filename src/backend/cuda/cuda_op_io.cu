/* The recorded ops' names (statistics, errors) and the buffers each one reads and writes: the
 * liveness facts the executor's fusion table checks its dataflow with (dead_after, cuda_fuse.cu). */
#include "backend/cuda/cuda_be.cuh"

const char *cu_op_name(int type) {
  static const char *const names[OP_COUNT] = { "embed", "matmul", "rmsnorm", "rope", "kv_store", "attention", "silu_mul",
                                               "gelu_mul", "add", "add_rows", "scale", "softcap", "gather_out",
                                               "argmax", "metadata", "layernorm", "rope_ext", "moe_route",
                                               "matmul_experts", "moe_combine", "swiglu_clamp", "sigmoid_gate_rows",
                                               "attention_sinks", "mul", "sigmoid_mul", "relu2", "conv1d", "ssm_scan",
                                               "gated_delta", "gated_rmsnorm", "attention_seg", "rope_axes", "gelu",
                                               "gather_rows", "copy", "attention_mla", "all_reduce",
                                               "broadcast", "all_gather" };
  return type >= 0 && type < OP_COUNT ? names[type] : "?";
}

void cu_op_io(const cu_op *o, const void *rd[4], int *nr, const void *wr[2], int *nw) {
  *nr = *nw = 0;
#define R(p) (rd[(*nr)++] = (p))
#define W(p) (wr[(*nw)++] = (p))
  switch (o->type) {
  case OP_EMBED: W(o->emb.out); break;
  case OP_MATMUL: R(o->mm.x); W(o->mm.y); break;
  case OP_RMSNORM: R(o->norm.x); R(o->norm.w); W(o->norm.out); break;
  case OP_ROPE: R(o->rope.x); W(o->rope.x); break;
  case OP_KVSTORE: R(o->kv.k); R(o->kv.v); W(o->kv.K); W(o->kv.V); break;
  case OP_ATTN: R(o->at.q); R(o->at.K); R(o->at.V); W(o->at.out); break;
  case OP_SILU: case OP_GELU: R(o->ew.a); R(o->ew.b); W(o->ew.y); break;
  case OP_ADD: case OP_ADDROWS: R(o->ew.y); R(o->ew.a); W(o->ew.y); break;
  case OP_SCALE: case OP_SOFTCAP: R(o->ew.y); W(o->ew.y); break;
  case OP_GATHER: R(o->gat.src); W(o->gat.dst); break;
  case OP_ARGMAX: R(o->am.logits); break;
  case OP_META: W(o->meta.dst); break;
  case OP_LAYERNORM: R(o->ln.x); R(o->ln.w); if (o->ln.b) R(o->ln.b); W(o->ln.out); break;
  case OP_ROPEX: R(o->rx.x); W(o->rx.x); break;
  case OP_MOE_ROUTE: R(o->rt.logits); W(o->rt.ids); W(o->rt.wts); break;
  case OP_MM_EXPERTS: R(o->mx.x); R(o->mx.ids); W(o->mx.y); break;
  case OP_MOE_COMBINE: R(o->cb.y); R(o->cb.w); W(o->cb.out); break;
  case OP_SWIGLU_CLAMP: R(o->sw.g); R(o->sw.u); W(o->sw.out); break;
  case OP_SIGMOID_GATE: R(o->sg.y); R(o->sg.g); W(o->sg.y); break;
  case OP_ATTN_SINKS: R(o->as.q); R(o->as.K); R(o->as.V); W(o->as.out); break;
  case OP_MUL: R(o->ew.a); R(o->ew.b); W(o->ew.y); break;
  case OP_SIGMUL: R(o->ew.y); R(o->ew.a); W(o->ew.y); break;
  case OP_RELU2: R(o->ew.y); W(o->ew.y); break;
  case OP_CONV1D: R(o->cv.x); R(o->cv.w); W(o->cv.out); W(o->cv.st); break;
  case OP_SSM: R(o->ss.x); R(o->ss.dt); W(o->ss.y); W(o->ss.st); break;
  case OP_GDN: R(o->gd.q); R(o->gd.a); R(o->gd.b); W(o->gd.y); break;
  case OP_GNORM: R(o->gn.x); R(o->gn.z); R(o->gn.w); W(o->gn.out); break;
  case OP_ATTSEG: R(o->asg.q); R(o->asg.k); R(o->asg.v); W(o->asg.out); break;
  case OP_ROPEAX: R(o->rax.x); W(o->rax.x); break;
  case OP_GELU1: R(o->gl.x); W(o->gl.y); break;
  case OP_GATHERROWS: R(o->gr.src); W(o->gr.dst); break;
  case OP_COPY: R(o->cp.src); W(o->cp.dst); break;
  case OP_ATTN_MLA: R(o->mla.ql); R(o->mla.qpe); R(o->mla.c); R(o->mla.kpe); W(o->mla.K); W(o->mla.out); break;
  case OP_ALLREDUCE: case OP_BCAST: case OP_ALLGATHER: R(o->cm.src); W(o->cm.dst); break;
  }
#undef R
#undef W
}
