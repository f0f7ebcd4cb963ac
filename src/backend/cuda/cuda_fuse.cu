/* The executor of recorded ops and its fusion table.
 *
 * A recorded step is a list of typed ops (cuda_be.cuh) in the order the model issues them
 * (src/model/transformer.c; tests/model test_op_sequence pins it per family). The executor walks
 * the list; at each op it tries the entries of the fusion table whose pattern (op types, and for
 * matmuls their roles) starts there, in table order: an entry's match checks the dataflow (which
 * buffers feed which, that intermediates are dead afterwards: dead_after, the one liveness rule) and
 * shapes, its run launches the fused kernel and says how many ops it consumed (0: it declined). An
 * op that no entry takes runs alone (cu_exec_op), and the counters say so (unfused_last): a family
 * whose recipe adds an op the fused paths lack still runs correctly, and its launch count shows what
 * it costs (tests/cuda test_fusions). Tuning fuse = 0 turns every entry off.
 *
 * Some entries leave state for the next op: the int8 x of a buffer written by the kernel before
 * (preq, with the rms still to apply when k_mlp1 deferred it), or the residual x + a that k_mlp1 left
 * in another buffer (redir). */
#include <stdio.h>
#include <string.h>
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_be.cuh"
#include "backend/cuda/cuda_ew.cuh"
#include "backend/cuda/cuda_mlp.cuh"
#include "backend/cuda/cuda_mla.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_mv.cuh"
#include "backend/cuda/cuda_q4.cuh"
#include "backend/cuda/cuda_qmma.cuh"
#include "backend/cuda/cuda_sample.cuh"
#include "backend/cuda/cuda_ssm.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "backend/kv_quant.h"

/* the executor's walk over one recorded list */
typedef struct {
  const void *preq; /* c->xq holds the int8 x of this buffer (preq_n columns), for the next op */
  int preq_n;
  bool predn;       /* ... without its rms, which its reader applies (dn_dim, dn_eps) */
  int dn_dim;
  float dn_eps;
  const void *x16; /* c->x16 holds this buffer (x16_n rows) in the wgmma kernel's x layout */
  int x16_n;
  const void *xh; /* c->x16 holds this buffer (xh_n rows) as plain half rows, bf16 if xh_bf (cu_gemm_prep's) */
  int xh_n;
  bool xh_bf;
} fx_pass;
typedef struct {
  cuda_be *c;
  const cu_ctx *cx;
  const cu_op *ops;
  int n;
  fx_pass in, out;        /* what the op before left / what this one leaves */
  const void *redir_x;    /* k_mlp1 with the norm left x + a of the residual redir_x in redir_src */
  const float *redir_src;
} fx;

/* Is buffer p dead after op i: the first later op that names it writes it without reading it?
 * Conservative: false when no later op names it (the caller may still download it). */
static bool dead_after(const fx *f, int i, const void *p) {
  for (int j = i + 1; j < f->n; j++) {
    const void *rd[4], *wr[2];
    int nr, nw;
    cu_op_io(&f->ops[j], rd, &nr, wr, &nw);
    for (int k = 0; k < nr; k++)
      if (rd[k] == p) return false;
    for (int k = 0; k < nw; k++)
      if (wr[k] == p) return true;
  }
  return false;
}

static const cu_op *op(const fx *f, int i) { return i < f->n ? &f->ops[i] : NULL; }
static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* The op after the rmsnorm at i is a CW_Q4 matvec of its output with the same rows: then the norm
 * kernel also writes the int8 x (c->xq) for it. */
static bool norm_feeds_q4(const fx *f, int i) {
  const cu_op *r = op(f, i), *m = op(f, i + 1);
  if (!m || m->type != OP_MATMUL || m->mm.x != r->norm.out || m->mm.n != r->norm.n) return false;
  const cu_weight *w = m->mm.cw;
  return w->kind == CW_Q4 && cu_use_matvec(w, m->mm.n) && w->cols == r->norm.dim && f->c->xq &&
         f->c->xq_cap >= cu_q4_scratch_bytes(m->mm.n, w->cols);
}

/* The matvecs the executor runs as one launch from op i: consecutive matmuls of the same x, n and
 * role class (q/k/v, gate/up) with compatible weights, up to 3; their weights in ws, outputs in ys */
static int mm_group(const fx *f, int i, const cu_weight **ws, float **ys) {
  const cu_op *o = &f->ops[i];
  ws[0] = o->mm.cw;
  ys[0] = o->mm.y;
  const int rc = cu_q4_role((sm_mm_role)o->mm.role);
  int nw = 1;
  while (nw < 3 && i + nw < f->n) {
    const cu_op *p = &f->ops[i + nw];
    if (p->type != OP_MATMUL || p->mm.x != o->mm.x || p->mm.n != o->mm.n || p->mm.y == o->mm.x ||
        cu_q4_role((sm_mm_role)p->mm.role) != rc || rc < 0 || !cu_matvec_compatible(ws[0], p->mm.cw))
      break;
    bool alias = false;
    for (int k = 0; k < nw; k++) alias |= ys[k] == p->mm.y;
    if (alias) break;
    ws[nw] = p->mm.cw;
    ys[nw] = p->mm.y;
    nw++;
  }
  return nw;
}

/* The op after the rmsnorm at i starts a group of 4-bit matmuls of its output (mm_group) that the wgmma
 * kernel takes (the gemm group entry): then the norm also writes their f16 x (c->x16), and the group
 * skips its conversion launch. The norm's float output is still written (other readers, other paths). */
static bool norm_feeds_x16(const fx *f, int i) {
  const cu_op *r = op(f, i), *m = op(f, i + 1);
  if (!m || m->type != OP_MATMUL || m->mm.x != r->norm.out || m->mm.n != r->norm.n || f->c->base.batch_invariant)
    return false;
  const cu_weight *w = m->mm.cw;
  if (!f->cx->t->pre_x16 || w->kind != CW_Q4 || cu_use_matvec(w, m->mm.n) || w->cols != r->norm.dim || !cu_qwg_ok(f->cx) ||
      !cu_norm_x16_ok(r->norm.dim) || !f->c->x16 || f->c->x16_cap < cu_qmma_x16_bytes(m->mm.n, w->cols))
    return false;
  const cu_weight *ws[3];
  float *ys[3];
  return cu_qmma_group_ok(f->cx, ws, mm_group(f, i + 1, ws, ys), m->mm.n);
}
static bool x16_ready(const fx *f, const cu_op *m) { return f->in.x16 == m->mm.x && f->in.x16_n == m->mm.n; }

static int hgemm_group(const fx *f, int i, bool *bf16);
/* The op after the rmsnorm at i starts matmuls of its output that cuBLAS runs with a half x (hgemm_group):
 * then the norm also writes that x (*bn: CU_X16_F16 or CU_X16_BF16) and the group skips its conversion */
static bool norm_feeds_half(const fx *f, int i, int *bn) {
  const cu_op *r = op(f, i), *m = op(f, i + 1);
  bool bf;
  if (!m || m->type != OP_MATMUL || m->mm.x != r->norm.out || m->mm.n != r->norm.n || m->mm.cw->cols != r->norm.dim ||
      !r->norm.out || hgemm_group(f, i + 1, &bf) < 1)
    return false;
  *bn = bf ? CU_X16_BF16 : CU_X16_F16;
  return true;
}
static void set_xh(fx *f, const void *x, int n, int bn) {
  f->out.xh = x;
  f->out.xh_n = n;
  f->out.xh_bf = bn == CU_X16_BF16;
}

/* The norm at op i writes the int8 x of the CW_Q4 matvecs right after it (norm_feeds_q4): is its
 * float output read by nothing else, so that the norm need not write it? The matvecs reading it
 * must all be in the one launch that reads the int8 x (mm_group). */
static bool norm_out_dead(const fx *f, int i, const void *out) {
  int j = i + 1;
  const cu_weight *w0 = NULL;
  while (j < f->n && f->ops[j].type == OP_MATMUL && f->ops[j].mm.x == out) {
    const cu_weight *w = f->ops[j].mm.cw;
    if (j - i > 3 || w->kind != CW_Q4 || f->ops[j].mm.y == out || (w0 && !cu_matvec_compatible(w0, w))) return false;
    for (int k = i + 1; k < j; k++)
      if (f->ops[k].mm.y == f->ops[j].mm.y) return false;
    w0 = w0 ? w0 : w;
    j++;
  }
  return w0 && dead_after(f, j - 1, out);
}

/* ---------------- the entries ---------------- */

/* rmsnorm, and the int8 x of a CW_Q4 matvec after it (k_norm_q) */
static bool m_norm(const fx *f, int i) { return true; }
static int r_norm(fx *f, int i) {
  const cu_op *o = &f->ops[i];
  int hb = 0;
  const bool q = norm_feeds_q4(f, i), h = !q && norm_feeds_x16(f, i), hh = !q && !h && norm_feeds_half(f, i, &hb);
  float *out = q && norm_out_dead(f, i, o->norm.out) ? NULL : o->norm.out;
  if (!cu_norm_q(f->cx, out, (float *)o->norm.x, NULL, o->norm.w, o->norm.n, o->norm.dim, o->norm.eps, o->norm.off,
                 q ? f->c->xq : NULL, NULL, h || hh ? f->c->x16 : NULL, hh ? hb : cu_qwg_bn(o->norm.n)))
    return 0;
  if (q) { f->out.preq = o->norm.out; f->out.preq_n = o->norm.n; }
  if (h) { f->out.x16 = o->norm.out; f->out.x16_n = o->norm.n; }
  if (hh) set_xh(f, o->norm.out, o->norm.n, hb);
  return 1;
}

/* rmsnorm(a) into t, x += t, rmsnorm(x): a sandwich norm's output norm (Gemma's post-attention and
 * post-feedforward norms), the residual add and the next norm in one k_norm_q (t is not written: its
 * only reader is the add) */
static bool m_norm_add_norm(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *ad = &f->ops[i + 1], *p = &f->ops[i + 2];
  const void *t = o->norm.out;
  return ad->ew.a == t && ad->ew.y != t && ad->ew.y != o->norm.x && (size_t)o->norm.n * (size_t)o->norm.dim == ad->ew.n &&
         p->norm.x == ad->ew.y && p->norm.n == o->norm.n && p->norm.dim == o->norm.dim && p->norm.out != ad->ew.y &&
         p->norm.out != o->norm.x && dead_after(f, i + 1, t);
}
static int r_norm_add_norm(fx *f, int i) {
  const cu_op *o = &f->ops[i], *ad = &f->ops[i + 1], *p = &f->ops[i + 2];
  const bool q = norm_feeds_q4(f, i + 2), h = !q && norm_feeds_x16(f, i + 2);
  const float *src = f->redir_x == ad->ew.y ? f->redir_src : NULL;
  float *out = q && norm_out_dead(f, i + 2, p->norm.out) ? NULL : p->norm.out;
  if (!cu_norm_pre_q(f->cx, out, ad->ew.y, o->norm.x, o->norm.w, o->norm.off, o->norm.eps, p->norm.w, p->norm.n,
                     p->norm.dim, p->norm.eps, p->norm.off, q ? f->c->xq : NULL, src, h ? f->c->x16 : NULL,
                     cu_qwg_bn(p->norm.n)))
    return 0;
  f->redir_x = NULL;
  if (q) { f->out.preq = p->norm.out; f->out.preq_n = p->norm.n; }
  if (h) { f->out.x16 = p->norm.out; f->out.x16_n = p->norm.n; }
  return 3;
}

/* a gated rmsnorm (Gated DeltaNet, Mamba-2) whose output a one-token-path 4-bit matvec reads (the mixer's
 * output projection): the norm also writes its int8 x */
static bool m_gnorm_q(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *m = &f->ops[i + 1];
  const cu_weight *w = m->mm.cw;
  return m->mm.x == o->gn.out && m->mm.n == o->gn.n && w->kind == CW_Q4 && cu_use_matvec(w, m->mm.n) &&
         w->cols == o->gn.dim && o->gn.group % 32 == 0 && f->c->xq &&
         f->c->xq_cap >= cu_q4_scratch_bytes(m->mm.n, w->cols);
}
static int r_gnorm_q(fx *f, int i) {
  const cu_op *o = &f->ops[i];
  cu_gated_rmsnorm(f->cx, o->gn.out, o->gn.x, o->gn.z, o->gn.w, o->gn.n, o->gn.dim, o->gn.group, o->gn.wdim, o->gn.eps,
                   o->gn.nf, f->c->xq);
  f->out.preq = o->gn.out;
  f->out.preq_n = o->gn.n;
  return 1;
}

/* two rmsnorms of the same shape, the second neither reading nor overwriting what the first reads or
 * writes (the per-head q and k norms), neither feeding a 4-bit matvec: one launch */
static bool m_norm_pair(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *p = &f->ops[i + 1];
  return p->norm.dim == o->norm.dim && p->norm.eps == o->norm.eps && p->norm.off == o->norm.off &&
         p->norm.x != o->norm.out && p->norm.out != o->norm.x && p->norm.out != o->norm.out &&
         !norm_feeds_q4(f, i) && !norm_feeds_q4(f, i + 1);
}
static int r_norm_pair(fx *f, int i) {
  const cu_op *o = &f->ops[i], *p = &f->ops[i + 1];
  return cu_norm_pair(f->cx, o->norm.out, (float *)o->norm.x, o->norm.w, o->norm.n, p->norm.out, (float *)p->norm.x,
                      p->norm.w, p->norm.n, o->norm.dim, o->norm.eps, o->norm.off)
             ? 2
             : 0;
}

/* silu(gate) * up whose only reader is the next one-token matmul: computed in that matmul's x load
 * (or quantized for it, CW_Q4) */
static bool m_silu_mv(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *m = &f->ops[i + 1];
  return m->mm.n == 1 && m->mm.x == o->ew.y && m->mm.y != o->ew.a && m->mm.y != o->ew.b && m->mm.y != o->ew.y &&
         o->ew.n == (size_t)m->mm.cw->cols && dead_after(f, i + 1, o->ew.y);
}
static int r_silu_mv(fx *f, int i) {
  const cu_op *o = &f->ops[i], *m = &f->ops[i + 1];
  return cu_matvec_silu(f->cx, m->mm.cw, o->ew.a, o->ew.b, 1, m->mm.y, f->c->xq, o->type == OP_GELU) ? 2 : 0;
}

/* decode attention writes the int8 x of the CW_Q4 matvec after it (the o projection) */
static bool attn_feeds_q4(const fx *f, const cu_op *at, const cu_op *m) {
  const cu_weight *w = m && m->type == OP_MATMUL ? m->mm.cw : NULL;
  return w && at->at.hd % 32 == 0 && m->mm.x == at->at.out && m->mm.n == f->c->n_tokens && w->kind == CW_Q4 &&
         cu_use_matvec(w, m->mm.n) && w->cols == (int64_t)at->at.nh * at->at.hd && f->c->xq &&
         f->c->xq_cap >= cu_q4_scratch_bytes(m->mm.n, w->cols);
}
/* the same for a 4-bit matmul of more tokens on the wgmma kernel: decode attention also writes its f16 x
 * (as norm_feeds_x16 has the norms do) */
static bool attn_feeds_x16(const fx *f, const cu_op *at, const cu_op *m) {
  const cu_weight *w = m && m->type == OP_MATMUL ? m->mm.cw : NULL;
  return w && f->cx->t->pre_x16 && !f->c->base.batch_invariant && m->mm.x == at->at.out &&
         m->mm.n == f->c->n_tokens && w->kind == CW_Q4 && !cu_use_matvec(w, m->mm.n) &&
         w->cols == (int64_t)at->at.nh * at->at.hd && w->cols % QM_BK == 0 && cu_qwg_ok(f->cx) &&
         cu_qmma_group_ok(f->cx, &w, 1, m->mm.n) && aligned16(m->mm.x) && f->c->x16 &&
         f->c->x16_cap >= cu_qmma_x16_bytes(m->mm.n, w->cols);
}
static bool m_attn_q(const fx *f, int i) {
  return f->ops[i].at.splits > 0 && attn_feeds_q4(f, &f->ops[i], op(f, i + 1));
}
static int r_attn_q(fx *f, int i) {
  cu_attn_args a;
  cu_attn_args_of(f->c, &f->ops[i], &a);
  a.xq = f->c->xq;
  cu_attn_decode(f->cx, &a);
  f->out.preq = f->ops[i].at.out;
  f->out.preq_n = f->ops[i + 1].mm.n;
  return 1;
}

/* rope(q), rope(k), kv_store(k, v) and decode attention (and the int8 x of the o projection) in one
 * kernel, when the rotated q and k are not read afterwards: the dataflow of ops i .. i + 3, given the
 * rotations' buffers (qx, kx) and heads (plain rope or rope_ext) */
static bool rope_attn_flow(const fx *f, int i, const float *qx, int qnh, int qhd, const float *kx, int knh, int khd) {
  const cu_op *kv = &f->ops[i + 2], *at = &f->ops[i + 3];
  const int hd = at->at.hd;
  return at->at.splits > 0 && kv->kv.k == kx && at->at.q == qx && at->at.K == kv->kv.K && at->at.V == kv->kv.V &&
         qhd == hd && kv->kv.bs == at->at.bs && kv->kv.nblocks == at->at.nblocks && khd == hd && qnh == at->at.nh &&
         knh == at->at.nkv && knh * khd == kv->kv.row && qx != kx && qx != kv->kv.v && kx != kv->kv.v &&
         at->at.out != qx && at->at.out != kx && at->at.out != kv->kv.v && dead_after(f, i + 3, qx) &&
         dead_after(f, i + 3, kx);
}
static bool m_rope_attn(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *rk = &f->ops[i + 1];
  return rope_attn_flow(f, i, o->rope.x, o->rope.nh, o->rope.hd, rk->rope.x, rk->rope.nh, rk->rope.hd);
}
/* the fused attention launch of rope(+ext)+kv_store+attention at ops i .. i + 3 (a: the rope fields set) */
static int rope_attn_go(fx *f, int i, cu_attn_args *a) {
  const cu_tune *t = f->cx->t;
  const cu_op *at = &f->ops[i + 3];
  const bool xq = attn_feeds_q4(f, at, op(f, i + 4)), h = !xq && attn_feeds_x16(f, at, op(f, i + 4));
  a->xq = xq ? f->c->xq : NULL;
  a->x16 = h ? f->c->x16 : NULL;
  a->x16_bn = cu_qwg_bn(f->c->n_tokens);
  /* L2 prefetch of the first bytes of the gate weight (after the o projection) while the memory is
   * otherwise idle: measured to pay on the 8B shape (2.42 vs 2.45 ms a step), not on the 1B one */
  for (int j = i + 4; t->pf_kb && j < f->n && j < i + 12; j++) {
    const cu_op *p = &f->ops[j];
    if (p->type != OP_MATMUL || p->mm.role != SM_MM_GATE) continue;
    const cu_weight *gw = p->mm.cw;
    if (gw->kind != CW_Q4 && gw->kind != CW_DENSE) break;
    const bool dn = gw->kind == CW_DENSE;
    const size_t qb = (size_t)gw->rows * (size_t)gw->cols * (dn ? sm_dtype_size(gw->dtype) : 1) / (dn ? 1 : 2);
    const size_t sbb = dn ? 0 : (size_t)gw->rows * (size_t)(gw->cols / gw->gs) * 4;
    const size_t pfb = (size_t)t->pf_kb << 10, want = pfb < qb / 2 ? pfb : qb / 2;
    if (qb >= (size_t)t->pf_min_kb << 10) {
      a->pf[0] = gw->q;
      a->pfn[0] = want;
      a->pf[1] = gw->sb;
      a->pfn[1] = (size_t)((double)sbb * want / qb);
    }
    break;
  }
  cu_attn_decode(f->cx, a);
  if (xq) { f->out.preq = at->at.out; f->out.preq_n = f->ops[i + 4].mm.n; }
  if (h) { f->out.x16 = at->at.out; f->out.x16_n = f->ops[i + 4].mm.n; }
  return 4;
}
/* the attention arguments of ops i .. i + 3 with the rotations' k, frequencies and rotated dims */
static void rope_attn_args(const fx *f, int i, const float *kx, const float *invq, int rotq, const float *invk,
                           int rotk, cu_attn_args *a) {
  cu_attn_args_of(f->c, &f->ops[i + 3], a);
  a->kraw = kx;
  a->vraw = f->ops[i + 2].kv.v;
  a->invq = invq;
  a->invk = invk;
  a->halfq = rotq / 2;
  a->halfk = rotk / 2;
}
static int r_rope_attn(fx *f, int i) {
  const cu_op *o = &f->ops[i], *rk = &f->ops[i + 1];
  cu_attn_args a;
  rope_attn_args(f, i, rk->rope.x, o->rope.inv, o->rope.rot, rk->rope.inv, rk->rope.rot, &a);
  return rope_attn_go(f, i, &a);
}

/* the same for two rope_ext of the same position rows, without the Llama-4 query scaling (Phi-3/4's
 * longrope and partial rotary) */
static bool m_ropex_attn(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *rk = &f->ops[i + 1];
  return o->rx.beta <= 0.f && rk->rx.beta <= 0.f && o->rx.n_rows == rk->rx.n_rows && o->rx.pos0 == rk->rx.pos0 &&
         o->rx.n_rows >= 1 && rope_attn_flow(f, i, o->rx.x, o->rx.nh, o->rx.hd, rk->rx.x, rk->rx.nh, rk->rx.hd);
}
static int r_ropex_attn(fx *f, int i) {
  const cu_op *o = &f->ops[i], *rk = &f->ops[i + 1];
  cu_attn_args a;
  rope_attn_args(f, i, rk->rx.x, o->rx.inv, o->rx.rot, rk->rx.inv, rk->rx.rot, &a);
  a.rope_rows = o->rx.n_rows;
  a.rope_pos0 = o->rx.pos0;
  a.msq = o->rx.mscale;
  a.msk = rk->rx.mscale;
  return rope_attn_go(f, i, &a);
}

/* rope(q), rope(k), kv_store(k, v) in one kernel */
/* where the KV store op kv writes in the current batch */
static bool m_rope_kv(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *rk = &f->ops[i + 1], *kv = &f->ops[i + 2];
  return kv->kv.k == rk->rope.x && o->rope.hd == rk->rope.hd && rk->rope.nh * rk->rope.hd == kv->kv.row &&
         !sm_kv_quantized((sm_dtype)kv->kv.dt) && o->rope.x != rk->rope.x && o->rope.x != kv->kv.v && rk->rope.x != kv->kv.v;
}
static int r_rope_kv(fx *f, int i) {
  const cu_op *o = &f->ops[i], *rk = &f->ops[i + 1], *kv = &f->ops[i + 2];
  const cuda_be *c = f->c;
  const cu_kv_dst d = cu_kv_dst_of(c, kv);
  cu_rope_qk_store(f->cx, &d, o->rope.x, rk->rope.x, kv->kv.v, o->rope.inv, rk->rope.inv, c->n_tokens, o->rope.nh,
                   rk->rope.nh, o->rope.hd, o->rope.rot, rk->rope.rot);
  return 3;
}

/* the same for two rope_ext (longrope, YaRN's attention factor, partial rotary: Phi-3/4) of the same
 * position rows and without the Llama-4 query scaling */
static bool m_ropex_kv(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *rk = &f->ops[i + 1], *kv = &f->ops[i + 2];
  return kv->kv.k == rk->rx.x && o->rx.hd == rk->rx.hd && rk->rx.nh * rk->rx.hd == kv->kv.row &&
         !sm_kv_quantized((sm_dtype)kv->kv.dt) && o->rx.x != rk->rx.x &&
         o->rx.x != kv->kv.v && rk->rx.x != kv->kv.v && o->rx.beta <= 0.f && rk->rx.beta <= 0.f &&
         o->rx.n_rows == rk->rx.n_rows && o->rx.pos0 == rk->rx.pos0 && o->rx.n_rows >= 1;
}
static int r_ropex_kv(fx *f, int i) {
  const cu_op *o = &f->ops[i], *rk = &f->ops[i + 1], *kv = &f->ops[i + 2];
  const cuda_be *c = f->c;
  const cu_kv_dst d = cu_kv_dst_of(c, kv);
  const cu_rope_rows rr = {o->rx.n_rows, o->rx.pos0, o->rx.mscale, rk->rx.mscale};
  cu_rope_qk_store(f->cx, &d, o->rx.x, rk->rx.x, kv->kv.v, o->rx.inv, rk->rx.inv, c->n_tokens, o->rx.nh, rk->rx.nh,
                   o->rx.hd, o->rx.rot, rk->rx.rot, &rr);
  return 3;
}

/* gate, up (their x quantized by the kernel before), silu, down: the dataflow of the MLP */
static bool mlp_flow(const fx *f, int i) {
  const cu_op *g = &f->ops[i], *u = &f->ops[i + 1], *sl = &f->ops[i + 2], *dn = &f->ops[i + 3];
  const cu_weight *gw = g->mm.cw, *uw = u->mm.cw, *dw = dn->mm.cw;
  const int n = g->mm.n;
  return f->in.preq == g->mm.x && f->in.preq_n == n && !f->in.predn && gw->kind == CW_Q4 && u->mm.x == g->mm.x &&
         u->mm.n == n && g->mm.y != u->mm.y && g->mm.y != g->mm.x && u->mm.y != g->mm.x && cu_use_matvec(gw, n) &&
         cu_matvec_compatible(gw, uw) && uw->rows == gw->rows && sl->ew.a == g->mm.y && sl->ew.b == u->mm.y &&
         sl->ew.n == (size_t)n * (size_t)gw->rows && dn->mm.x == sl->ew.y && dn->mm.n == n && dw->kind == CW_Q4 &&
         cu_use_matvec(dw, n) && dw->cols == gw->rows && dn->mm.y != sl->ew.y && dead_after(f, i + 3, sl->ew.y) &&
         f->c->xq2 && f->c->xq2_cap >= cu_q4_scratch_bytes(n, dw->cols);
}
/* the MLP in one persistent kernel (k_mlp1) */
static bool m_mlp(const fx *f, int i) {
  return mlp_flow(f, i) && cu_mlp_ok(f->cx, f->ops[i].mm.cw, f->ops[i + 1].mm.cw, f->ops[i + 3].mm.cw, f->ops[i].mm.n);
}
static int r_mlp(fx *f, int i) {
  const cu_op *g = &f->ops[i], *u = &f->ops[i + 1], *dn = &f->ops[i + 3];
  if (!cu_mlp_claim(f->cx)) return 0;
  return cu_mlp(f->cx, g->mm.cw, u->mm.cw, dn->mm.cw, g->mm.y, u->mm.y, dn->mm.y, f->c->xq, f->c->xq2, NULL, NULL,
                f->ops[i + 2].type == OP_GELU)
             ? 4
             : 0;
}
/* gate/up with silu(gate) * up quantized in one kernel (k_gu_q4), then down */
static bool m_guq(const fx *f, int i) {
  return mlp_flow(f, i) && cu_q4_guq_ok(f->cx, f->ops[i].mm.cw, f->ops[i + 1].mm.cw, f->ops[i].mm.n);
}
static int r_guq(fx *f, int i) {
  const cu_op *g = &f->ops[i], *u = &f->ops[i + 1], *dn = &f->ops[i + 3];
  cu_q4_guq(f->cx, g->mm.cw, u->mm.cw, g->mm.y, u->mm.y, f->c->xq, f->c->xq2);
  const cu_weight *dw = dn->mm.cw;
  float *dy = dn->mm.y;
  cu_q4_matvec_preq(f->cx, &dw, &dy, 1, 1, f->c->xq2, CU_Q4_DN);
  return 4;
}

/* matmuls of the same x in one launch (q/k/v, gate/up), or one matvec whose x the kernel before
 * quantized (with the deferred rms of k_mlp1), with the bias adds after them (mm_bias) */
/* the add_rows ops right after the nw matmuls of a group at i that add a bias to one of their outputs
 * (q/k/v, o and router biases): their count, and each weight's bias in bias[] (NULL: none). The kernels
 * add it as they store (mv_args.bias), the same sum as the add after it. */
static int mm_bias(const fx *f, int i, int nw, const cu_weight *const *ws, float *const *ys, const float **bias) {
  const int n = f->ops[i].mm.n;
  int nb = 0;
  for (int k = 0; k < nw; k++) bias[k] = NULL;
  for (const cu_op *e; (e = op(f, i + nw + nb)) && e->type == OP_ADDROWS; nb++) {
    int k = 0;
    while (k < nw && ys[k] != e->ew.y) k++;
    if (k == nw || bias[k] || e->ew.dim != ws[k]->rows || e->ew.n != (size_t)n * (size_t)ws[k]->rows) break;
    bool alias = false;
    for (int j = 0; j < nw; j++) alias |= e->ew.a == ys[j];
    if (alias) break;
    bias[k] = e->ew.a;
  }
  return nb;
}
static bool m_mm_group(const fx *f, int i) {
  const cu_op *o = &f->ops[i];
  if (!cu_use_matvec(o->mm.cw, o->mm.n)) return false;
  const cu_weight *ws[3];
  float *ys[3];
  const float *bias[3];
  const bool pq = f->in.preq == o->mm.x && f->in.preq_n == o->mm.n && o->mm.cw->kind == CW_Q4;
  const int nw = mm_group(f, i, ws, ys);
  return nw > 1 || pq || mm_bias(f, i, nw, ws, ys, bias) > 0;
}
static int r_mm_group(fx *f, int i) {
  const cu_op *o = &f->ops[i];
  const cu_weight *ws[3];
  float *ys[3];
  const float *bias[3];
  const int nw = mm_group(f, i, ws, ys), role = cu_q4_role((sm_mm_role)o->mm.role);
  const int nb = mm_bias(f, i, nw, ws, ys, bias);
  const bool pq = f->in.preq == o->mm.x && f->in.preq_n == o->mm.n && o->mm.cw->kind == CW_Q4;
  if (pq) {
    const cu_q4_dnorm dn = { f->c->ssp, f->in.dn_dim / 32, f->in.dn_eps, f->in.dn_dim };
    cu_q4_matvec_preq(f->cx, ws, ys, nw, o->mm.n, f->c->xq, role, f->in.predn ? &dn : NULL, nb ? bias : NULL);
  } else {
    cu_matvec_multi(f->cx, ws, ys, nw, o->mm.x, o->mm.n, f->c->xq, role, nb ? bias : NULL);
  }
  return nw + nb;
}

/* 4-bit matmuls of one x and role class (q/k/v, gate/up) in a step of more tokens than the matvecs take:
 * one launch of the tensor-core kernel for all of them (cu_qmma_multi); also one such matmul alone
 * when the norm before made its f16 x (norm_feeds_x16: no conversion launch) */
static bool m_gemm_group(const fx *f, int i) {
  const cu_op *o = &f->ops[i];
  const cu_weight *ws[3];
  float *ys[3];
  if (f->c->base.batch_invariant || o->mm.cw->kind != CW_Q4 || cu_use_matvec(o->mm.cw, o->mm.n) ||
      !aligned16(o->mm.x))
    return false;
  const int nw = mm_group(f, i, ws, ys);
  return (nw > 1 || x16_ready(f, o)) && cu_qmma_group_ok(f->cx, ws, nw, o->mm.n);
}
static int r_gemm_group(fx *f, int i) {
  const cu_op *o = &f->ops[i];
  const cu_weight *ws[3];
  float *ys[3];
  const int nw = mm_group(f, i, ws, ys);
  cu_qmma_multi(f->cx, ws, ys, nw, o->mm.x, o->mm.n, f->c->x16, f->c->deq, f->c->deq_cap, NULL, 0, x16_ready(f, o));
  return nw;
}

/* silu(gate) * up (or gelu) read only by the 4-bit matmul after it, in a step the tensor-core kernel
 * takes: the activation is computed where x is converted to f16 for it (the product is not stored) */
static bool m_silu_gemm(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *m = &f->ops[i + 1];
  const cu_weight *cw = m->mm.cw;
  return !f->c->base.batch_invariant && cw->kind == CW_Q4 && !cu_use_matvec(cw, m->mm.n) &&
         cu_qmma_group_ok(f->cx, &cw, 1, m->mm.n) && m->mm.x == o->ew.y && m->mm.y != o->ew.a &&
         m->mm.y != o->ew.b && m->mm.y != o->ew.y && o->ew.n == (size_t)m->mm.n * (size_t)cw->cols &&
         aligned16(o->ew.a) && aligned16(o->ew.b) && dead_after(f, i + 1, o->ew.y);
}
static int r_silu_gemm(fx *f, int i) {
  const cu_op *o = &f->ops[i], *m = &f->ops[i + 1];
  float *y = m->mm.y;
  cu_qmma_multi(f->cx, &m->mm.cw, &y, 1, o->ew.a, m->mm.n, f->c->x16, f->c->deq, f->c->deq_cap, o->ew.b,
                o->type == OP_GELU ? 2 : 1);
  return 2;
}

/* Matmuls past the tensor-core 4-bit kernel's steps that cuBLAS runs with x in a half type (cu_gemm_half):
 * consecutive ones of the same x (q/k/v, gate/up) share one conversion of x, and a gated MLP's act(gate) *
 * up that only the down projection reads is computed straight into that projection's half x (not
 * stored as floats). The same bits as one conversion a matmul. */
static bool gemm_half(const fx *f, const cu_op *m, bool *bf16) {
  return f->cx->t->pre_x16 && !f->c->base.batch_invariant && !cu_use_matvec(m->mm.cw, m->mm.n) && f->c->x16 &&
         f->c->x16_cap >= (size_t)m->mm.n * (size_t)m->mm.cw->cols * 2 &&
         cu_gemm_half(f->cx, m->mm.cw, m->mm.n, m->mm.x, bf16);
}
/* how many matmuls from op i share one half x (0: op i takes no half x); *bf16: its type */
static int hgemm_group(const fx *f, int i, bool *bf16) {
  const cu_op *o = &f->ops[i];
  bool bf, bf2;
  if (!gemm_half(f, o, &bf)) return 0;
  *bf16 = bf;
  int nw = 1;
  while (i + nw < f->n) {
    const cu_op *p = &f->ops[i + nw];
    if (p->type != OP_MATMUL || p->mm.x != o->mm.x || p->mm.n != o->mm.n || p->mm.cw->cols != o->mm.cw->cols ||
        !gemm_half(f, p, &bf2) || bf2 != bf)
      break;
    nw++;
  }
  for (int k = 0; k < nw; k++) /* a matmul writing x would change it for the ones after it */
    if (f->ops[i + k].mm.y == o->mm.x) return k + 1;
  return nw;
}
/* the norm before made this group's x (norm_feeds_half) */
static bool xh_ready(const fx *f, const cu_op *m, bool bf) {
  return f->in.xh == m->mm.x && f->in.xh_n == m->mm.n && f->in.xh_bf == bf;
}
static bool m_hgemm_group(const fx *f, int i) {
  bool bf;
  const int nw = hgemm_group(f, i, &bf);
  return nw > 1 || (nw == 1 && xh_ready(f, &f->ops[i], bf));
}
static int r_hgemm_group(fx *f, int i) {
  const cu_op *o = &f->ops[i];
  bool bf;
  const int nw = hgemm_group(f, i, &bf);
  if (!xh_ready(f, o, bf)) cu_gemm_prep(f->cx, bf, o->mm.x, NULL, 0, o->mm.n, o->mm.cw->cols, f->c->x16);
  for (int k = 0; k < nw; k++) {
    const cu_op *p = &f->ops[i + k];
    cu_gemm(f->cx, f->c->blas, p->mm.cw, p->mm.x, p->mm.n, p->mm.y, f->c->x16, f->c->deq, f->c->deq_cap, true);
  }
  return nw;
}
static bool m_silu_hgemm(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *m = &f->ops[i + 1];
  bool bf;
  return gemm_half(f, m, &bf) && m->mm.x == o->ew.y && m->mm.y != o->ew.a && m->mm.y != o->ew.b &&
         m->mm.y != o->ew.y && o->ew.n == (size_t)m->mm.n * (size_t)m->mm.cw->cols &&
         cu_gemm_prep_ok(o->ew.a, o->ew.b, m->mm.n, m->mm.cw->cols) && dead_after(f, i + 1, o->ew.y);
}
static int r_silu_hgemm(fx *f, int i) {
  const cu_op *o = &f->ops[i], *m = &f->ops[i + 1];
  bool bf;
  gemm_half(f, m, &bf);
  cu_gemm_prep(f->cx, bf, o->ew.a, o->ew.b, o->type == OP_GELU ? 2 : 1, m->mm.n, m->mm.cw->cols, f->c->x16);
  cu_gemm(f->cx, f->c->blas, m->mm.cw, m->mm.x, m->mm.n, m->mm.y, f->c->x16, f->c->deq, f->c->deq_cap, true);
  return 2;
}

/* ops j..j + 4: out = rmsnorm(x) of one token feeding gate and up, their activation and down, as k_mlp1
 * runs them with the norm computed inside from the residual's inputs x and a; out, which it does not
 * write as the norm would, holds x + a until the next add (nothing else reads it before it is written
 * again). What mlp_norm_flow and sandwich_mlp_flow both ask. */
static bool mlp_normed(const fx *f, int j, const void *x, const void *a) {
  const cu_op *nr = &f->ops[j], *g = &f->ops[j + 1], *u = &f->ops[j + 2], *ac = &f->ops[j + 3], *dn = &f->ops[j + 4];
  const cuda_be *c = f->c;
  const void *out = nr->norm.out, *b = dn->mm.y;
  const int dim = nr->norm.dim;
  if (!c->xq2 || nr->norm.n != 1 || nr->norm.x != x || out == x || out == a || out == b || g->mm.x != out ||
      u->mm.x != out || g->mm.n != 1 || u->mm.n != 1 || dn->mm.n != 1 || g->mm.y == u->mm.y || g->mm.y == out ||
      u->mm.y == out || g->mm.y == x || g->mm.y == a || u->mm.y == x || u->mm.y == a)
    return false;
  const cu_weight *gw = g->mm.cw, *uw = u->mm.cw, *dw = dn->mm.cw;
  if (ac->ew.a != g->mm.y || ac->ew.b != u->mm.y || !cu_mlp_ok(f->cx, gw, uw, dw, 1) || gw->cols != dim ||
      ac->ew.n != (size_t)gw->rows || dn->mm.x != ac->ew.y || b == ac->ew.y || b == x || b == out ||
      !dead_after(f, j + 4, ac->ew.y) || c->xq2_cap < cu_q4_scratch_bytes(1, dw->cols))
    return false;
  return norm_out_dead(f, j, out) && aligned16(x) && aligned16(a) && aligned16(out) && aligned16(b) &&
         aligned16(nr->norm.w) && dim % 32 == 0;
}
/* ops i..: x += a; out = rmsnorm(x) feeding gate/up; silu * mul; down (-> b); x += b; rmsnorm(x), for
 * one token: the first add + rmsnorm and the whole MLP run in k_mlp1, which leaves x + a in out (dead
 * otherwise) for the second add to read */
static bool mlp_norm_flow(const fx *f, int i) {
  const cu_op *ad = &f->ops[i], *nr = &f->ops[i + 1], *dn = &f->ops[i + 5], *ad2 = &f->ops[i + 6],
              *nr2 = &f->ops[i + 7];
  const void *x = ad->ew.y, *b = dn->mm.y;
  const int dim = nr->norm.dim;
  if (f->redir_x == ad->ew.y || !f->c->xq || (size_t)dim != ad->ew.n || !mlp_normed(f, i + 1, x, ad->ew.a))
    return false;
  if (ad2->ew.y != x || ad2->ew.a != b || ad2->ew.n != (size_t)dim || nr2->norm.x != x || nr2->norm.n != 1 ||
      nr2->norm.dim != dim || nr2->norm.out == x || nr2->norm.out == b)
    return false;
  return aligned16(nr2->norm.w) && aligned16(nr2->norm.out);
}
static cu_mlp_norm mlp_norm_of(const fx *f, int i) {
  const cu_op *ad = &f->ops[i], *nr = &f->ops[i + 1];
  return cu_mlp_norm{ ad->ew.y, ad->ew.a, nr->norm.w, nr->norm.off, nr->norm.eps, nr->norm.out, NULL, 0.f, 0.f };
}
/* ops i..: t = rmsnorm(a) (a sandwich norm's output norm), x += t, out = rmsnorm(x) feeding gate/up,
 * gelu or silu * up, down (-> b); then the post-feedforward sandwich norm of b, x += it and the next
 * norm, fused (rmsnorm+add+rmsnorm at i + 7), for one token: k_mlp1 runs the first three ops and the
 * MLP (Gemma 2 / 3), leaving x + t in out, which that fused launch reads instead of x */
static bool sandwich_mlp_flow(const fx *f, int i) {
  if (i + 9 >= f->n) return false;
  const cu_op *n0 = &f->ops[i], *ad = &f->ops[i + 1], *nr = &f->ops[i + 2], *g = &f->ops[i + 3], *u = &f->ops[i + 4],
              *dn = &f->ops[i + 6], *n2 = &f->ops[i + 7], *ad2 = &f->ops[i + 8], *n3 = &f->ops[i + 9];
  if (f->redir_x == ad->ew.y || !m_norm_add_norm(f, i)) return false;
  const void *x = ad->ew.y, *a = n0->norm.x, *b = dn->mm.y;
  const int dim = nr->norm.dim;
  if (n0->norm.n != 1 || n0->norm.dim != dim || a == x || !mlp_normed(f, i + 2, x, a) ||
      !cu_mlp_pre_ok(f->cx, g->mm.cw, u->mm.cw, dn->mm.cw))
    return false;
  /* the post-feedforward norm, the add and the next norm: the fused launch that reads x + t from out */
  if (n2->type != OP_RMSNORM || ad2->type != OP_ADD || n3->type != OP_RMSNORM || n2->norm.x != b ||
      n2->norm.n != 1 || n2->norm.dim != dim || ad2->ew.y != x || ad2->ew.a != n2->norm.out || !m_norm_add_norm(f, i + 7))
    return false;
  return aligned16(n0->norm.w) && aligned16(n2->norm.w) && aligned16(n3->norm.w) && aligned16(n3->norm.out);
}
static bool m_sandwich_mlp(const fx *f, int i) { return sandwich_mlp_flow(f, i); }
static int r_sandwich_mlp(fx *f, int i) {
  const cu_op *n0 = &f->ops[i], *ad = &f->ops[i + 1], *nr = &f->ops[i + 2], *g = &f->ops[i + 3], *u = &f->ops[i + 4],
              *ac = &f->ops[i + 5], *dn = &f->ops[i + 6];
  if (!cu_mlp_claim(f->cx)) return 0;
  const cu_mlp_norm nm = { ad->ew.y, n0->norm.x, nr->norm.w, nr->norm.off, nr->norm.eps, nr->norm.out,
                           n0->norm.w, n0->norm.off, n0->norm.eps };
  if (!cu_mlp(f->cx, g->mm.cw, u->mm.cw, dn->mm.cw, g->mm.y, u->mm.y, dn->mm.y, NULL, f->c->xq2, &nm, NULL,
              ac->type == OP_GELU))
    return 0;
  f->redir_x = ad->ew.y;
  f->redir_src = nm.hout;
  return 7;
}

/* ... and the add + rmsnorm after it deferred: the second norm only feeds one launch of the next
 * layer's q/k/v (k_mvq4), which applies the rms */
static bool m_mlp_norm_dn(const fx *f, int i) {
  if (!mlp_norm_flow(f, i)) return false;
  const cu_op *g = &f->ops[i + 2], *u = &f->ops[i + 3], *dn = &f->ops[i + 5], *nr2 = &f->ops[i + 7];
  const cuda_be *c = f->c;
  if (!c->ssp || !cu_mlp_dnorm_ok(f->cx, g->mm.cw, u->mm.cw, dn->mm.cw) || !norm_feeds_q4(f, i + 7) ||
      !norm_out_dead(f, i + 7, nr2->norm.out) || c->ssp_cap < sizeof(float) * (size_t)(nr2->norm.dim / 32) ||
      nr2->norm.dim % 32)
    return false;
  const cu_weight *ws[3];
  float *ys[3];
  const int nw = mm_group(f, i + 8, ws, ys);
  return nw == 3 && f->ops[i + 8].mm.n == 1 && cu_q4_dnorm_ok(f->cx, ws, nw, CU_Q4_QKV);
}
static int r_mlp_norm_dn(fx *f, int i) {
  const cu_op *ad = &f->ops[i], *g = &f->ops[i + 2], *u = &f->ops[i + 3], *dn = &f->ops[i + 5], *nr2 = &f->ops[i + 7];
  if (!cu_mlp_claim(f->cx)) return 0;
  const cu_mlp_norm nm = mlp_norm_of(f, i);
  const cu_mlp_dnorm dz = { ad->ew.y, nr2->norm.w, nr2->norm.off, f->c->xq, f->c->ssp };
  if (!cu_mlp(f->cx, g->mm.cw, u->mm.cw, dn->mm.cw, g->mm.y, u->mm.y, dn->mm.y, NULL, f->c->xq2, &nm, &dz)) return 0;
  f->out.preq = nr2->norm.out;
  f->out.preq_n = 1;
  f->out.predn = true;
  f->out.dn_dim = nr2->norm.dim;
  f->out.dn_eps = nr2->norm.eps;
  return 8;
}
static bool m_mlp_norm(const fx *f, int i) { return mlp_norm_flow(f, i); }
static int r_mlp_norm(fx *f, int i) {
  const cu_op *g = &f->ops[i + 2], *u = &f->ops[i + 3], *dn = &f->ops[i + 5];
  if (!cu_mlp_claim(f->cx)) return 0;
  const cu_mlp_norm nm = mlp_norm_of(f, i);
  if (!cu_mlp(f->cx, g->mm.cw, u->mm.cw, dn->mm.cw, g->mm.y, u->mm.y, dn->mm.y, NULL, f->c->xq2, &nm)) return 0;
  f->redir_x = f->ops[i].ew.y;
  f->redir_src = nm.hout;
  return 6;
}

/* x += a; out = rmsnorm(x) (+ the int8 x of a CW_Q4 matvec after it) */
static bool m_add_norm(const fx *f, int i) {
  const cu_op *o = &f->ops[i], *p = &f->ops[i + 1];
  return p->norm.x == o->ew.y && (size_t)p->norm.n * (size_t)p->norm.dim == o->ew.n && p->norm.out != o->ew.y &&
         p->norm.out != o->ew.a;
}
static int r_add_norm(fx *f, int i) {
  const cu_op *o = &f->ops[i], *p = &f->ops[i + 1];
  int hb = 0;
  const bool q = norm_feeds_q4(f, i + 1), h = !q && norm_feeds_x16(f, i + 1),
             hh = !q && !h && norm_feeds_half(f, i + 1, &hb);
  const float *src = f->redir_x == o->ew.y ? f->redir_src : NULL; /* set: this cu_norm_q was checked to run */
  f->redir_x = NULL;
  float *out = q && norm_out_dead(f, i + 1, p->norm.out) ? NULL : p->norm.out;
  if (cu_norm_q(f->cx, out, o->ew.y, o->ew.a, p->norm.w, p->norm.n, p->norm.dim, p->norm.eps, p->norm.off,
                q ? f->c->xq : NULL, src, h || hh ? f->c->x16 : NULL, hh ? hb : cu_qwg_bn(p->norm.n))) {
    if (q) { f->out.preq = p->norm.out; f->out.preq_n = p->norm.n; }
    if (h) { f->out.x16 = p->norm.out; f->out.x16_n = p->norm.n; }
    if (hh) set_xh(f, p->norm.out, p->norm.n, hb);
  } else {
    cu_add_rmsnorm(f->cx, p->norm.out, o->ew.y, o->ew.a, p->norm.w, p->norm.n, p->norm.dim, p->norm.eps, p->norm.off);
  }
  return 2;
}

/* tensor parallelism: the all-reduce of a projection's shares, the residual add of its sum and the norm
 * after it (cuda_comm.cu); the sum is also written back, as the all-reduce alone does. Not where the norm
 * feeds 4-bit matvecs: add+rmsnorm then also makes their int8 x, which this kernel does not (8B 4-bit on
 * four H100s decoded at 669.0 tok/s with it, 702.7 without) */
static bool m_ar_add_norm(const fx *f, int i) {
  const cu_op *r = &f->ops[i], *a = &f->ops[i + 1], *p = &f->ops[i + 2], *m = op(f, i + 3);
  /* from the ops alone, not from this rank's scratch sizes: every rank must choose the same kernel */
  if (m && m->type == OP_MATMUL && m->mm.x == p->norm.out && m->mm.cw->kind == CW_Q4 && cu_use_matvec(m->mm.cw, m->mm.n))
    return false;
  return r->cm.src == r->cm.dst && a->ew.a == r->cm.dst && a->ew.n == r->cm.n && a->ew.y != r->cm.dst &&
         p->norm.x == a->ew.y && (size_t)p->norm.n * (size_t)p->norm.dim == a->ew.n && p->norm.out != a->ew.y &&
         p->norm.out != r->cm.dst && p->norm.w != r->cm.dst &&
         cu_comm_ar_norm_ok(f->c, r->cm.dst, a->ew.y, p->norm.out, p->norm.w, p->norm.n, p->norm.dim);
}
static int r_ar_add_norm(fx *f, int i) {
  const cu_op *r = &f->ops[i], *a = &f->ops[i + 1], *p = &f->ops[i + 2];
  cu_comm_ar_norm(f->c, r->cm.dst, a->ew.y, p->norm.out, p->norm.w, p->norm.n, p->norm.dim, p->norm.eps, p->norm.off);
  return 3;
}

/* the routed experts' gate and up of the same x and ids, then silu(gate) * up (gelu_tanh for Gemma 4, or gpt-oss's
 * clamped SwiGLU, with the experts' biases) whose inputs die there: one kernel writes the activation's output (cu_experts_gu) */
static bool m_experts_gu(const fx *f, int i) {
  const cu_op *g = &f->ops[i], *u = &f->ops[i + 1], *ac = &f->ops[i + 2];
  if (g->mx.grouped || u->mx.grouped || g->mx.per_slot || u->mx.per_slot || g->mx.ids != u->mx.ids ||
      g->mx.x != u->mx.x || g->mx.n != u->mx.n || g->mx.k != u->mx.k || g->mx.rows != u->mx.rows ||
      g->mx.y == u->mx.y || !cu_experts_gu_ok(g->mx.cw, u->mx.cw, g->mx.rows) || !aligned16(g->mx.x))
    return false;
  const size_t ns = (size_t)g->mx.n * g->mx.k;
  /* the activation: silu_mul (no biases) or gpt-oss's swiglu_clamp, reading gate's and up's outputs */
  const bool sw = ac->type == OP_SWIGLU_CLAMP;
  const float *ag = sw ? ac->sw.g : ac->ew.a, *au = sw ? ac->sw.u : ac->ew.b;
  float *out = sw ? ac->sw.out : ac->ew.y;
  const size_t n = sw ? ac->sw.n : ac->ew.n;
  if ((!sw && (g->mx.bias || u->mx.bias)) || ag != g->mx.y || au != u->mx.y || n != ns * (size_t)g->mx.rows ||
      out == g->mx.x || (const void *)out == (const void *)g->mx.ids || out == g->mx.bias || out == u->mx.bias)
    return false;
  return (out == g->mx.y || dead_after(f, i + 2, g->mx.y)) && (out == u->mx.y || dead_after(f, i + 2, u->mx.y));
}
static int r_experts_gu(fx *f, int i) {
  const cu_op *g = &f->ops[i], *u = &f->ops[i + 1], *ac = &f->ops[i + 2];
  const bool sw = ac->type == OP_SWIGLU_CLAMP;
  cu_experts_gu(f->cx, g->mx.cw, u->mx.cw, g->mx.rows, g->mx.ids, g->mx.n, g->mx.k, g->mx.x, sw ? ac->sw.out : ac->ew.y,
                g->mx.bias, u->mx.bias, sw, sw ? ac->sw.alpha : 0.f, sw ? ac->sw.limit : 0.f, NULL, ac->type == OP_GELU);
  return 3;
}

/* moe_route whose ids only the gate/up pair after it reads first: the gate/up kernel routes for itself
 * (every block its slot's token; the token's first block writes ids and weights for down+combine) */
static bool m_route_gu(const fx *f, int i) {
  const cu_op *rt = &f->ops[i], *g = &f->ops[i + 1], *ac = &f->ops[i + 3];
  /* every block reads the logits while others write h: they must not overlap */
  const float *h = ac->type == OP_SWIGLU_CLAMP ? ac->sw.out : ac->ew.y;
  const size_t hn = ac->type == OP_SWIGLU_CLAMP ? ac->sw.n : ac->ew.n, ln = (size_t)rt->rt.n * (size_t)rt->rt.ne;
  if (h < rt->rt.logits + ln && rt->rt.logits < h + hn) return false;
  return m_experts_gu(f, i + 1) && rt->rt.ids == g->mx.ids && rt->rt.n == g->mx.n && rt->rt.k == g->mx.k &&
         rt->rt.k <= CU_ROUTE_MAX_K && rt->rt.ng <= CU_ROUTE_MAX_GROUPS &&
         (const void *)rt->rt.logits != (const void *)rt->rt.wts && (const void *)g->mx.x != (const void *)rt->rt.wts &&
         cu_experts_gu_route_ok(g->mx.cw, g->mx.rows, rt->rt.ne);
}
static int r_route_gu(fx *f, int i) {
  const cu_op *rt = &f->ops[i], *g = &f->ops[i + 1], *u = &f->ops[i + 2], *ac = &f->ops[i + 3];
  const bool sw = ac->type == OP_SWIGLU_CLAMP;
  const cu_route r = cu_route_of(rt);
  cu_experts_gu(f->cx, g->mx.cw, u->mx.cw, g->mx.rows, g->mx.ids, g->mx.n, g->mx.k, g->mx.x, sw ? ac->sw.out : ac->ew.y,
                g->mx.bias, u->mx.bias, sw, sw ? ac->sw.alpha : 0.f, sw ? ac->sw.limit : 0.f, &r, ac->type == OP_GELU);
  return 4;
}

/* the routed experts' down projection (one x a slot) and the weighted sum of its rows, whose only reader
 * it is: one kernel sums each token's slots as it goes (cu_experts_dc) */
static bool m_experts_dc(const fx *f, int i) {
  const cu_op *d = &f->ops[i], *cb = &f->ops[i + 1];
  return !d->mx.grouped && d->mx.per_slot && cb->cb.y == d->mx.y && cb->cb.n == d->mx.n && cb->cb.k == d->mx.k &&
         (int64_t)cb->cb.dim == d->mx.rows && cb->cb.out != d->mx.x && cb->cb.out != cb->cb.w &&
         (const void *)cb->cb.out != (const void *)d->mx.ids && cu_experts_dc_ok(d->mx.cw, d->mx.rows) &&
         aligned16(d->mx.x) && (cb->cb.out == d->mx.y || dead_after(f, i + 1, d->mx.y));
}
static int r_experts_dc(fx *f, int i) {
  const cu_op *d = &f->ops[i], *cb = &f->ops[i + 1];
  cu_experts_dc(f->cx, d->mx.cw, d->mx.rows, d->mx.ids, cb->cb.w, d->mx.n, d->mx.k, d->mx.x, d->mx.bias, cb->cb.out);
  return 2;
}

/* a pattern element: an op type, and for matmuls the role (any when omitted) */
#define P(t) ((t) + 1)
#define PM(r) (((OP_MATMUL) + 1) | (((r) + 1) << 8))
#define PX(r) (((OP_MM_EXPERTS) + 1) | (((r) + 1) << 8))
#define MLP_PAT PM(SM_MM_GATE), PM(SM_MM_UP), P(OP_SILU), PM(SM_MM_DOWN)
typedef struct {
  const char *name;
  uint16_t pattern[12]; /* 0-terminated */
  bool (*match)(const fx *f, int i);
  int (*run)(fx *f, int i); /* ops consumed, 0: declined */
} cu_fusion;
static const cu_fusion k_fusions[] = {
  { "rmsnorm+add+rmsnorm+mlp (gelu)",
    { P(OP_RMSNORM), P(OP_ADD), P(OP_RMSNORM), PM(SM_MM_GATE), PM(SM_MM_UP), P(OP_GELU), PM(SM_MM_DOWN) },
    m_sandwich_mlp, r_sandwich_mlp },
  { "rmsnorm+add+rmsnorm+mlp", { P(OP_RMSNORM), P(OP_ADD), P(OP_RMSNORM), MLP_PAT }, m_sandwich_mlp, r_sandwich_mlp },
  { "rmsnorm+add+rmsnorm", { P(OP_RMSNORM), P(OP_ADD), P(OP_RMSNORM) }, m_norm_add_norm, r_norm_add_norm },
  { "rmsnorm pair", { P(OP_RMSNORM), P(OP_RMSNORM) }, m_norm_pair, r_norm_pair },
  { "rmsnorm+quant", { P(OP_RMSNORM) }, m_norm, r_norm },
  { "gated_rmsnorm+quant", { P(OP_GNORM), P(OP_MATMUL) }, m_gnorm_q, r_gnorm_q },
  { "silu+matvec", { P(OP_SILU), P(OP_MATMUL) }, m_silu_mv, r_silu_mv },
  { "gelu+matvec", { P(OP_GELU), P(OP_MATMUL) }, m_silu_mv, r_silu_mv },
  { "attention+quant", { P(OP_ATTN), P(OP_MATMUL) }, m_attn_q, r_attn_q },
  { "rope+kv_store+attention", { P(OP_ROPE), P(OP_ROPE), P(OP_KVSTORE), P(OP_ATTN) }, m_rope_attn, r_rope_attn },
  { "rope_ext+kv_store+attention", { P(OP_ROPEX), P(OP_ROPEX), P(OP_KVSTORE), P(OP_ATTN) }, m_ropex_attn,
    r_ropex_attn },
  { "rope+kv_store", { P(OP_ROPE), P(OP_ROPE), P(OP_KVSTORE) }, m_rope_kv, r_rope_kv },
  { "rope_ext+kv_store", { P(OP_ROPEX), P(OP_ROPEX), P(OP_KVSTORE) }, m_ropex_kv, r_ropex_kv },
  { "mlp", { MLP_PAT }, m_mlp, r_mlp },
  { "mlp (gelu)", { PM(SM_MM_GATE), PM(SM_MM_UP), P(OP_GELU), PM(SM_MM_DOWN) }, m_mlp, r_mlp },
  { "gate/up+silu quant", { MLP_PAT }, m_guq, r_guq },
  { "matvec group", { P(OP_MATMUL) }, m_mm_group, r_mm_group },
  { "gemm group", { P(OP_MATMUL) }, m_gemm_group, r_gemm_group },
  { "silu+gemm", { P(OP_SILU), P(OP_MATMUL) }, m_silu_gemm, r_silu_gemm },
  { "gelu+gemm", { P(OP_GELU), P(OP_MATMUL) }, m_silu_gemm, r_silu_gemm },
  { "half gemm group", { P(OP_MATMUL) }, m_hgemm_group, r_hgemm_group },
  { "silu+half gemm", { P(OP_SILU), P(OP_MATMUL) }, m_silu_hgemm, r_silu_hgemm },
  { "gelu+half gemm", { P(OP_GELU), P(OP_MATMUL) }, m_silu_hgemm, r_silu_hgemm },
  { "add+rmsnorm+mlp+add+quant",
    { P(OP_ADD), P(OP_RMSNORM), MLP_PAT, P(OP_ADD), P(OP_RMSNORM), PM(SM_MM_Q), PM(SM_MM_K), PM(SM_MM_V) },
    m_mlp_norm_dn, r_mlp_norm_dn },
  { "add+rmsnorm+mlp", { P(OP_ADD), P(OP_RMSNORM), MLP_PAT, P(OP_ADD), P(OP_RMSNORM) }, m_mlp_norm, r_mlp_norm },
  { "add+rmsnorm", { P(OP_ADD), P(OP_RMSNORM) }, m_add_norm, r_add_norm },
  { "route+experts gate/up+silu", { P(OP_MOE_ROUTE), PX(SM_MM_EXPERT_GATE), PX(SM_MM_EXPERT_UP), P(OP_SILU) },
    m_route_gu, r_route_gu },
  { "route+experts gate/up+swiglu",
    { P(OP_MOE_ROUTE), PX(SM_MM_EXPERT_GATE), PX(SM_MM_EXPERT_UP), P(OP_SWIGLU_CLAMP) }, m_route_gu, r_route_gu },
  { "route+experts gate/up+gelu", { P(OP_MOE_ROUTE), PX(SM_MM_EXPERT_GATE), PX(SM_MM_EXPERT_UP), P(OP_GELU) },
    m_route_gu, r_route_gu },
  { "experts gate/up+silu", { PX(SM_MM_EXPERT_GATE), PX(SM_MM_EXPERT_UP), P(OP_SILU) }, m_experts_gu, r_experts_gu },
  { "experts gate/up+gelu", { PX(SM_MM_EXPERT_GATE), PX(SM_MM_EXPERT_UP), P(OP_GELU) }, m_experts_gu, r_experts_gu },
  { "experts gate/up+swiglu", { PX(SM_MM_EXPERT_GATE), PX(SM_MM_EXPERT_UP), P(OP_SWIGLU_CLAMP) }, m_experts_gu,
    r_experts_gu },
  { "experts down+combine", { PX(SM_MM_EXPERT_DOWN), P(OP_MOE_COMBINE) }, m_experts_dc, r_experts_dc },
  { "all_reduce+add+rmsnorm", { P(OP_ALLREDUCE), P(OP_ADD), P(OP_RMSNORM) }, m_ar_add_norm, r_ar_add_norm },
};
#define N_FUSIONS ((int)(sizeof k_fusions / sizeof k_fusions[0]))
static_assert(N_FUSIONS <= CU_MAX_FUSIONS, "fusion counters");

int cu_fusion_count(void) { return N_FUSIONS; }
const char *cu_fusion_name(int i) { return i >= 0 && i < N_FUSIONS ? k_fusions[i].name : "?"; }

static bool pattern_at(const fx *f, const uint16_t *pat, int i) {
  for (int k = 0; k < 12 && pat[k]; k++) {
    if (i + k >= f->n) return false;
    const cu_op *o = &f->ops[i + k];
    if (o->type != (pat[k] & 0xff) - 1) return false;
    if ((pat[k] >> 8) && !(o->type == OP_MATMUL && o->mm.role == (pat[k] >> 8) - 1) &&
        !(o->type == OP_MM_EXPERTS && o->mx.role == (pat[k] >> 8) - 1))
      return false;
  }
  return true;
}

void cu_exec_ops(cuda_be *c) {
  fx f;
  memset(&f, 0, sizeof f);
  f.c = c;
  f.cx = &c->cx;
  f.ops = c->ops;
  f.n = c->n_ops;
  memset(c->fused_last, 0, sizeof c->fused_last);
  memset(c->unfused_last, 0, sizeof c->unfused_last);
  for (int i = 0; i < f.n;) {
    f.in = f.out;
    memset(&f.out, 0, sizeof f.out);
    int used = 0;
    for (int k = 0; c->t.fuse && k < N_FUSIONS && !used; k++) {
      const cu_fusion *e = &k_fusions[k];
      if (!pattern_at(&f, e->pattern, i) || !e->match(&f, i)) continue;
      cu_prof_begin(c);
      used = e->run(&f, i);
      if (!used) continue;
      cu_prof_end(c, e->name, 0);
      c->fused_last[k]++;
      c->fused_all[k]++;
    }
    if (!used) {
      memset(&f.out, 0, sizeof f.out);
      cu_exec_op(c, &f.ops[i]);
      c->unfused_last[f.ops[i].type]++;
      c->unfused_all[f.ops[i].type]++;
      used = 1;
    }
    i += used;
  }
}
