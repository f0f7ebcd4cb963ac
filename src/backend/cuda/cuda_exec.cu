/* One recorded op run alone (an op no fusion-table entry takes, or every op with tuning fuse = 0), timed
 * per op under tuning profile, and the kernel arguments an attention or KV-store op gives both this path
 * and the fused entries of cuda_fuse.cu. */
#include <stdio.h>
#include <string.h>
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_be.cuh"
#include "backend/cuda/cuda_ew.cuh"
#include "backend/cuda/cuda_mla.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_mv.cuh"
#include "backend/cuda/cuda_q4.cuh"
#include "backend/cuda/cuda_sample.cuh"
#include "backend/cuda/cuda_ssm.cuh"
#include "backend/cuda/cuda_weights.cuh"

void cu_attn_args_of(const cuda_be *c, const cu_op *at, cu_attn_args *a) {
  memset(a, 0, sizeof *a);
  a->out = at->at.out;
  a->part = c->part;
  a->cnt = c->att_cnt;
  a->q = at->at.q;
  a->K = at->at.K;
  a->V = at->at.V;
  a->dt = (sm_dtype)at->at.dt;
  a->pos = c->d_pos; a->seq = c->d_seq; a->table = c->d_table;
  a->max_blocks = c->max_blocks; a->bs = at->at.bs; a->nblocks = at->at.nblocks;
  a->n_tokens = c->n_tokens; a->n_heads = at->at.nh; a->nkv = at->at.nkv; a->hd = at->at.hd;
  a->scale = at->at.scale; a->window = at->at.window; a->softcap = at->at.softcap;
  a->S = at->at.splits;
  a->global_combine = at->at.glong != 0;
  a->sinks = at->at.sinks;
}
cu_kv_dst cu_kv_dst_of(const cuda_be *c, const cu_op *kv) {
  return cu_kv_dst{ kv->kv.K, kv->kv.V, (sm_dtype)kv->kv.dt, c->d_pos, c->d_seq, c->d_table, kv->kv.row, kv->kv.hd,
                    c->max_blocks, kv->kv.bs, kv->kv.nblocks };
}

static void x_matmul(cuda_be *c, const cu_op *o) {
  const cu_weight *cw = o->mm.cw;
  if (c->base.batch_invariant) { /* every token through the one-token kernel: the same order for any n */
    const int role = cu_q4_role((sm_mm_role)o->mm.role);
    for (int t = 0; t < o->mm.n; t++) {
      float *y = o->mm.y + (size_t)t * cw->rows;
      cu_matvec_multi(&c->cx, &cw, &y, 1, o->mm.x + (size_t)t * cw->cols, 1, c->xq, role);
    }
    return;
  }
  if (cu_use_matvec(cw, o->mm.n)) {
    float *y = o->mm.y;
    cu_matvec_multi(&c->cx, &cw, &y, 1, o->mm.x, o->mm.n, c->xq, cu_q4_role((sm_mm_role)o->mm.role));
    return;
  }
  cu_gemm(&c->cx, c->blas, cw, o->mm.x, o->mm.n, o->mm.y, c->x16, c->deq, c->deq_cap, false);
}

static void x_attention(cuda_be *c, const cu_op *o) {
  if (o->at.splits) { /* decode kernel */
    cu_attn_args a;
    cu_attn_args_of(c, o, &a);
    cu_attn_decode(&c->cx, &a);
    return;
  }
  cu_attn_tiled t = { o->at.out, c->part, o->at.q, o->at.K, o->at.V, (sm_dtype)o->at.dt, c->d_pos, c->d_seq, c->d_table, c->d_tiles,
                      c->n_tiles, c->n_tokens, c->max_blocks, o->at.bs, o->at.nblocks, o->at.nh, o->at.nkv, o->at.hd,
                      o->at.scale, o->at.window, o->at.softcap, o->at.span, o->at.inv != 0, o->at.sinks };
  if (o->at.dq) cu_attn_decq_run(&c->cx, &t, o->at.dq);
  else cu_attn_tiled_run(&c->cx, &t, c->smem_optin);
}

static void exec_op_(cuda_be *c, const cu_op *o) {
  const cu_ctx *cx = &c->cx;
  const int nt = c->n_tokens;
  switch (o->type) {
  case OP_EMBED: cu_embed(cx, o->emb.cw, c->d_tokens, nt, o->emb.out); break;
  case OP_MATMUL: x_matmul(c, o); break;
  case OP_RMSNORM: cu_rmsnorm(cx, o->norm.out, o->norm.x, o->norm.w, o->norm.n, o->norm.dim, o->norm.eps, o->norm.off); break;
  case OP_ROPE: cu_rope(cx, o->rope.x, c->d_pos, o->rope.inv, nt, o->rope.nh, o->rope.hd, o->rope.rot); break;
  case OP_KVSTORE: {
    const cu_kv_dst d = cu_kv_dst_of(c, o);
    cu_kv_store(cx, &d, o->kv.k, o->kv.v, nt);
    break;
  }
  case OP_ATTN: x_attention(c, o); break;
  case OP_SILU: cu_ew(cx, CU_EW_SILU, o->ew.y, o->ew.a, o->ew.b, 0.f, o->ew.n, 0); break;
  case OP_GELU: cu_ew(cx, CU_EW_GELU, o->ew.y, o->ew.a, o->ew.b, 0.f, o->ew.n, 0); break;
  case OP_ADD: cu_ew(cx, CU_EW_ADD, o->ew.y, o->ew.a, NULL, 0.f, o->ew.n, 0); break;
  case OP_ADDROWS: cu_ew(cx, CU_EW_ADD_ROWS, o->ew.y, o->ew.a, NULL, 0.f, o->ew.n, o->ew.dim); break;
  case OP_SCALE: cu_ew(cx, CU_EW_SCALE, o->ew.y, NULL, NULL, o->ew.s, o->ew.n, 0); break;
  case OP_SOFTCAP: cu_ew(cx, CU_EW_SOFTCAP, o->ew.y, NULL, NULL, o->ew.s, o->ew.n, 0); break;
  case OP_META: cu_meta_launch(c, o->meta.dst); break;
  case OP_ARGMAX:
    cu_argmax1(cx, o->am.logits, o->am.vocab, c->am_pv, c->am_pi, c->am_cnt, o->am.dtok, o->am.htok);
    cu_count(cx, CU_K_ARGMAX);
    break;
  case OP_GATHER: cu_gather(cx, o->gat.dst, o->gat.src, c->d_out, c->n_out, o->gat.dim); break;
  case OP_LAYERNORM: cu_layernorm(cx, o->ln.out, o->ln.x, o->ln.w, o->ln.b, o->ln.n, o->ln.dim, o->ln.eps); break;
  case OP_ROPEX: {
    cu_rope_ext_args a = { o->rx.inv, o->rx.rot, o->rx.n_rows, o->rx.pos0, o->rx.mscale, o->rx.beta, o->rx.beta_pos };
    cu_rope_ext(cx, o->rx.x, c->d_pos, &a, nt, o->rx.nh, o->rx.hd);
    break;
  }
  case OP_ATTSEG: case OP_ROPEAX: case OP_GELU1: case OP_GATHERROWS: case OP_COPY: cu_exec_encoder_op(c, o); break;
  case OP_MUL: cu_rec_ew(cx, CU_REW_MUL, o->ew.y, o->ew.a, o->ew.b, o->ew.n); break;
  case OP_SIGMUL: cu_rec_ew(cx, CU_REW_SIGMUL, o->ew.y, o->ew.a, NULL, o->ew.n); break;
  case OP_RELU2: cu_rec_ew(cx, CU_REW_RELU2, o->ew.y, NULL, NULL, o->ew.n); break;
  case OP_CONV1D: case OP_SSM: case OP_GDN: {
    const cu_rec_batch rb = { c->d_pos, c->d_rslot, c->d_rfirst, c->d_rcount };
    if (o->type == OP_CONV1D)
      cu_conv1d(cx, &rb, o->cv.out, o->cv.x, o->cv.w, o->cv.b, o->cv.st, o->cv.sf, o->cv.C, o->cv.K, o->cv.act, o->cv.nseq);
    else if (o->type == OP_SSM)
      cu_ssm_scan(cx, &rb, o->ss.y, o->ss.x, o->ss.B, o->ss.C, o->ss.ld, o->ss.dt, o->ss.dtb, o->ss.al, o->ss.D, o->ss.st,
                  o->ss.sf, o->ss.nh, o->ss.P, o->ss.G, o->ss.N, o->ss.lo, o->ss.hi, o->ss.nseq);
    else
      cu_gated_delta(cx, &rb, o->gd.y, o->gd.q, o->gd.k, o->gd.v, o->gd.ld, o->gd.a, o->gd.b, o->gd.al, o->gd.dtb,
                     o->gd.st, o->gd.sf, o->gd.hk, o->gd.hv, o->gd.dk, o->gd.dv, o->gd.nseq);
    break;
  }
  case OP_GNORM:
    cu_gated_rmsnorm(cx, o->gn.out, o->gn.x, o->gn.z, o->gn.w, o->gn.n, o->gn.dim, o->gn.group, o->gn.wdim, o->gn.eps,
                     o->gn.nf);
    break;
  case OP_ATTN_MLA: cu_mla_exec(c, o); break; /* multi-head latent attention (cuda_mla.cu) */
  case OP_ALLREDUCE: case OP_BCAST: case OP_ALLGATHER: cu_comm_exec(c, o); break; /* collectives (cuda_comm.cu) */
  default: cu_moe_exec(c, o); break; /* the mixture-of-experts ops and attention sinks (cuda_moe.cu) */
  }
}

void cu_exec_op(cuda_be *c, const cu_op *o) {
  if (!c->t.profile) { exec_op_(c, o); return; }
  char lab[64];
  if (o->type == OP_MATMUL) {
    const cu_weight *w = o->mm.cw;
    snprintf(lab, sizeof lab, "matmul %s %s%d %lldx%lld n%s", sm_mm_role_name((sm_mm_role)o->mm.role),
             w->bits ? "q" : "dense", w->bits ? w->bits : (int)w->dtype, (long long)w->rows, (long long)w->cols,
             o->mm.n == 1 ? "=1" : o->mm.n <= CU_MAX_N ? "<=8" : ">8");
  } else if (o->type == OP_ATTN) snprintf(lab, sizeof lab, "attention n%s", c->n_tokens == 1 ? "=1" : ">1");
  else snprintf(lab, sizeof lab, "%s", cu_op_name(o->type));
  double flop = 0; /* prefill attention: 4 hd flop (q.k and p.v) a head and attended position */
  if (o->type == OP_ATTN && c->n_tokens > 1)
    for (int t = 0; t < c->n_tokens; t++) {
      const int len = o->at.window > 0 && c->h_pos[t] + 1 > o->at.window ? o->at.window : c->h_pos[t] + 1;
      flop += 4.0 * o->at.hd * o->at.nh * len;
    }
  cu_prof_begin(c);
  exec_op_(c, o);
  cu_prof_end(c, lab, flop);
}
