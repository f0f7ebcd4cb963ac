/* The CUDA backend's mixture-of-experts ops (backend.h: moe_route, matmul_experts, moe_combine,
 * swiglu_clamp, sigmoid_gate_rows, attention_sinks) and the row kernel of gathered matvecs (cuda_moe.cu). */
#ifndef SM_CUDA_MOE_CUH
#define SM_CUDA_MOE_CUH
#include "backend/cuda/cuda_be.cuh"
#include "backend/cuda/cuda_route.cuh"

/* sets the ops of b (a cuda_be) */
void cu_moe_install(sm_backend *b);
/* runs one recorded op of the types OP_MOE_ROUTE .. OP_ATTN_SINKS */
void cu_moe_exec(cuda_be *c, const cu_op *o);
/* y[s][0..rows) = W_e . x_s for slots s < n_slots with e = ids[s] (ids NULL: e = 0), x_s = x[per_slot ? s : s / k]
 * (+ bias[e][..]): one warp a row, any weight layout. With ids NULL, per_slot 1 and k 1 it is a plain matvec
 * of n_slots columns (CW_MXQ weights of decode batches). */
void cu_rows_matvec(const cu_ctx *cx, const cu_weight *w, int64_t rows, const int32_t *ids, int k, const float *x,
                    bool per_slot, const float *bias, float *y, int n_slots);
/* The fused expert kernels of decode (cuda_moe_mv.cu), for n tokens of k slots each, ids [n][k] the experts:
 * gate/up + activation: h[s][r] = act(g, u), g = (Wg_e . x_t)[r] (+ bg[e][r]), u = (Wu_e . x_t)[r] (+ bu[e][r]),
 * s = t*k + j, e = ids[s] (an e out of range gives 0); act silu(g) * u, or with clamp gpt-oss's clamped SwiGLU
 * (swiglu_clamp's alpha and limit). _ok says whether the pair of weights (expert stacks of `rows` rows) fits. */
bool cu_experts_gu_ok(const cu_weight *wg, const cu_weight *wu, int64_t rows);
/* rt (not NULL): the routing as well (a moe_route op writing ids): every block routes its slot's token
 * itself (cu_route_token) and the first block of a token writes its ids and weights. _route_ok says
 * whether the weights take the fused kernel with routing of E experts. */
bool cu_experts_gu_route_ok(const cu_weight *wg, int64_t rows, int E);
void cu_experts_gu(const cu_ctx *cx, const cu_weight *wg, const cu_weight *wu, int64_t rows, const int32_t *ids, int n,
                   int k, const float *x, float *h, const float *bg = NULL, const float *bu = NULL, bool clamp = false,
                   float alpha = 0.f, float limit = 0.f, const cu_route *rt = NULL, bool gelu = false);
/* the routing of a recorded moe_route op */
static inline cu_route cu_route_of(const cu_op *o) {
  cu_route r;
  r.logits = o->rt.logits; r.corr = o->rt.corr; r.es = o->rt.es; r.ids = o->rt.ids; r.wts = o->rt.wts;
  r.kind = o->rt.kind; r.E = o->rt.ne; r.k = o->rt.k; r.norm = o->rt.norm; r.ng = o->rt.ng; r.tkg = o->rt.tkg;
  r.scale = o->rt.scale; r.eps = o->rt.eps;
  return r;
}
/* down + combine: out[t][r] = sum_j wts[t*k + j] * ((W_e . h[t*k + j])[r] (+ bias[e][r])) */
bool cu_experts_dc_ok(const cu_weight *w, int64_t rows);
void cu_experts_dc(const cu_ctx *cx, const cu_weight *w, int64_t rows, const int32_t *ids, const float *wts, int n,
                   int k, const float *h, const float *bias, float *out);

#endif
