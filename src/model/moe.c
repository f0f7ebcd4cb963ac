/* Mixture-of-experts layers (family.h sm_moe_spec) and gpt-oss's attention sinks: their tensors (loaded
 * next to a layer's slots by loader.c), their backend weights, and the MoE forward of one layer:
 *
 *   logits = router(x) (+ bias)                          matmul SM_MM_ROUTER (+ add_rows)
 *   ids, w = route(logits)                               moe_route (backend.h sm_moe_route)
 *   h_tj   = act(gate_e(x_t), up_e(x_t)), e = ids[t][j]  matmul_experts EXPERT_GATE / EXPERT_UP, silu_mul
 *                                                        (gelu_mul, or swiglu_clamp for gpt-oss)
 *   y_tj   = down_e(h_tj)                                matmul_experts EXPERT_DOWN
 *   out_t  = sum_j w_tj y_tj                             moe_combine
 *          + [sigmoid(shared_gate . x_t)] shared(x_t)   matmul GATE / UP / DOWN [+ SHARED_GATE, sigmoid_gate_rows], add
 *
 * The backends read only the chosen experts' rows of the stacked expert weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/model.h"
#include "model/tp.h"

typedef struct sm_moe_layer {
  sm_moe_route route;
  sm_weight router;
  float *router_bias, *correction;
  sm_weight gate, up, down; /* stacked: n_experts * rows */
  float *gate_bias, *up_bias, *down_bias;
  sm_weight sh_gate, sh_up, sh_down; /* the shared expert (data NULL: none) */
  sm_weight sh_route;                /* its sigmoid gate, one row (data NULL: none) */
  float *router_norm;                /* beside_mlp: the router input's RMSNorm weight (router_scale / sqrt(hidden)) */
  float *expert_scale;               /* beside_mlp: per expert, times its weight (the route's expert_scale) */
} sm_moe_layer;

typedef struct sm_moe_scratch {
  int tokens;
  float *logits, *wts, *g, *u, *y, *sg, *su, *sh, *s;
  float *rx, *mo; /* beside_mlp: the router's input and the experts' output [n][hidden] */
  int32_t *ids;
} sm_moe_scratch;

smelt_status sm_moe_check(smelt_model *m) {
  const sm_backend *be = m->be;
  const sm_moe_spec *sp = m->fam->moe;
  if (m->fam->recipe->attn_sinks && !be->attention_sinks)
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: the %s backend has no attention with sinks (needed by %s)", m->dir,
                  be->name, m->fam->model_type);
  const sm_moe_config *mc = &m->cfg.moe;
  const sm_moe_defaults *md = m->fam->defaults ? m->fam->defaults->moe : NULL;
  if (!sp || (mc->n_experts == 0 && md && md->optional)) return SMELT_OK; /* a dense model of the family */
  if (mc->n_experts <= 0 || mc->top_k <= 0 || mc->expert_inter <= 0)
    return sm_err(SMELT_ERR_FORMAT, "%s: config.json of a %s model has no experts", m->dir, m->fam->model_type);
  if (!be->moe_route || !be->matmul_experts || !be->moe_combine || !be->sigmoid_gate_rows ||
      (sp->clamped_swiglu && !be->swiglu_clamp))
    return sm_err(SMELT_ERR_UNSUPPORTED, "%s: the %s backend has no mixture-of-experts ops", m->dir, be->name);
  /* gpt-oss: transformers' class default RoPE (YaRN) is not one smelt fills in; its configs give it */
  if (sp->clamped_swiglu && !m->cfg.rope_params)
    return sm_err(SMELT_ERR_UNSUPPORTED,
                  "%s: config.json of this %s model gives no rope_scaling (the class default, "
                  "YaRN with factor 32, is not applied by smelt: add it to config.json)",
                  m->dir, m->fam->model_type);
  if (sp->clamped_swiglu && !(mc->swiglu_limit > 0 && mc->swiglu_alpha > 0))
    return sm_err(SMELT_ERR_FORMAT, "%s: %s needs swiglu_limit and swiglu_alpha > 0", m->dir, m->fam->model_type);
  if (sp->route == SM_ROUTE_SIGMOID && mc->n_group > 1 && !sp->correction)
    return sm_err(SMELT_ERR_FORMAT, "family %s: group-limited routing without a correction", m->fam->model_type);
  return SMELT_OK;
}

static smelt_status load_mlp(smelt_model *m, sm_load_ctx *ts, const char *pre, int64_t n_stack, int64_t inter,
                             sm_weight *g, sm_weight *u, sm_weight *d, float **bias, bool with_bias) {
  const int64_t H = m->cfg.hidden_size;
  const char *nm[3] = {"gate_proj", "up_proj", "down_proj"};
  sm_weight *w[3] = {g, u, d};
  char n[320];
  smelt_status st;
  for (int i = 0; i < 3; i++) {
    const int64_t rows = i == 2 ? H : inter, cols = i == 2 ? inter : H;
    snprintf(n, sizeof n, "%s.%s", pre, nm[i]);
    if ((st = sm_load_linear(m, ts, n, n_stack, rows, cols, w[i], false))) return st;
    if (with_bias) {
      snprintf(n, sizeof n, "%s.%s.bias", pre, nm[i]);
      if ((st = sm_load_vec(m, ts, n, n_stack, rows, &bias[i], false, NULL))) return st;
    }
  }
  return SMELT_OK;
}

smelt_status sm_moe_load_layer(smelt_model *m, sm_load_ctx *ts, int l, const char *p) {
  const sm_config *c = &m->cfg;
  sm_layer *L = &m->layers[l];
  char n[320];
  smelt_status st;
  if (m->fam->recipe->attn_sinks) {
    snprintf(n, sizeof n, "%s.self_attn.sinks", p);
    if ((st = sm_load_vec(m, ts, n, 0, c->num_attention_heads, &L->sinks, false, NULL))) return st;
  }
  const sm_moe_spec *sp = m->fam->moe;
  if (!sp || !c->moe.moe_layer[l]) return SMELT_OK;
  const sm_moe_config *mc = &c->moe;
  const int64_t H = c->hidden_size, E = mc->n_experts;
  sm_moe_layer *M = sm_xcalloc(1, sizeof *M);
  L->moe = M;
  snprintf(n, sizeof n, "%s.%s", p, sp->router);
  if ((st = sm_load_linear(m, ts, n, 0, E, H, &M->router, false))) return st;
  if (sp->router_bias) {
    snprintf(n, sizeof n, "%s.%s.bias", p, sp->router);
    if ((st = sm_load_vec(m, ts, n, 0, E, &M->router_bias, false, NULL))) return st;
  }
  if (sp->correction && !mc->no_correction) {
    snprintf(n, sizeof n, "%s.%s", p, sp->correction);
    if ((st = sm_load_vec(m, ts, n, 0, E, &M->correction, false, NULL))) return st;
  }
  float *eb[3] = {NULL, NULL, NULL};
  snprintf(n, sizeof n, "%s.%s", p, sp->experts);
  if ((st = load_mlp(m, ts, n, E, mc->expert_inter, &M->gate, &M->up, &M->down, eb, sp->expert_bias))) return st;
  M->gate.stacked = M->up.stacked = M->down.stacked = true;
  const sm_weight *ew[3] = {&M->gate, &M->up, &M->down};
  for (int i = 0; i < 3; i++) {
    const sm_weight *w = ew[i];
    const size_t n = (size_t)w->rows * (size_t)w->cols;
    m->moe_expert_bytes += !w->bits ? n * sm_dtype_size(w->dtype)
                                    : n * (size_t)w->bits / 8 + (size_t)w->rows * (size_t)(w->cols / w->group_size) *
                                                                  (w->qmode ? 1 : 2 * sm_dtype_size(w->dtype));
  }
  M->gate_bias = eb[0];
  M->up_bias = eb[1];
  M->down_bias = eb[2];
  if (sp->shared && mc->shared_inter > 0) {
    snprintf(n, sizeof n, "%s.%s", p, sp->shared);
    if ((st = load_mlp(m, ts, n, 0, mc->shared_inter, &M->sh_gate, &M->sh_up, &M->sh_down, eb, false))) return st;
    if (sp->shared_gate) {
      snprintf(n, sizeof n, "%s.%s", p, sp->shared_gate);
      if ((st = sm_load_linear(m, ts, n, 0, 1, H, &M->sh_route, false))) return st;
    }
  }
  if (sp->router_scale) {
    snprintf(n, sizeof n, "%s.%s", p, sp->router_scale);
    if ((st = sm_load_vec_times(m, ts, n, H, 1.0f / sqrtf((float)H), &M->router_norm))) return st;
  }
  if (sp->expert_scale) {
    snprintf(n, sizeof n, "%s.%s", p, sp->expert_scale);
    if ((st = sm_load_vec(m, ts, n, 0, E, &M->expert_scale, false, NULL))) return st;
  }
  M->route = (sm_moe_route){.kind = sp->route,
                            .n_experts = (int)E,
                            .top_k = mc->top_k,
                            .norm = mc->norm_topk,
                            .scale = mc->routed_scale,
                            .norm_eps = sp->norm_eps,
                            .correction = M->correction,
                            .n_group = mc->n_group,
                            .topk_group = mc->topk_group,
                            .expert_scale = M->expert_scale};
  return SMELT_OK;
}

/* a bias of stacked experts [E][rows] as rank r of n keeps it: columns [r * rows / n, ...) of each expert's
 * (a new backend buffer the model owns) */
static smelt_status split_bias(smelt_model *m, float **b, int64_t E, int64_t rows, int r, int n) {
  if (!*b) return SMELT_OK;
  const int64_t rl = rows / n;
  float *d = m->be->alloc(m->be, sizeof(float) * (size_t)(E * rl));
  if (!d) return sm_err(SMELT_ERR_OOM, "out of backend memory for the experts' biases");
  sm_model_own(m, d);
  for (int64_t e = 0; e < E; e++) m->be->copy(m->be, d + e * rl, *b + e * rows + r * rl, sizeof(float) * (size_t)rl);
  *b = d;
  return SMELT_OK;
}

/* rows [r * rows / n, ...) of each of the E stacked experts of w (a host copy) */
static void split_rows(smelt_model *m, sm_weight *w, int64_t E, int64_t rows, int r, int n) {
  const int64_t rl = rows / n;
  int64_t *perm = sm_xmalloc(sizeof(int64_t) * (size_t)(E * rl));
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = 0; i < rl; i++) perm[e * rl + i] = e * rows + r * rl + i;
  sm_load_gather_rows(m, w, perm, E * rl);
  free(perm);
}

/* Rank r of n keeps columns [r * F / n, (r + 1) * F / n) of every expert's MLP (rows of gate and up, columns of
 * down; F the expert's intermediate size) and of the shared expert's. The router and the shared expert's gate
 * stay whole (every rank routes alike), the routed experts' down biases on rank 0 only (added once to the sum
 * the all-reduce after the layer makes). */
smelt_status sm_moe_split(smelt_model *m, int l, int r, int n) {
  sm_moe_layer *M = m->layers[l].moe;
  const sm_moe_config *mc = &m->cfg.moe;
  const int64_t E = mc->n_experts, Fe = mc->expert_inter, Fl = Fe / n;
  smelt_status st;
  split_rows(m, &M->gate, E, Fe, r, n);
  split_rows(m, &M->up, E, Fe, r, n);
  M->gate.stacked = M->up.stacked = true;
  if ((st = sm_tp_cols(m, &M->down, r * Fl, Fl, "experts' down_proj", l))) return st;
  M->down.stacked = true;
  if ((st = split_bias(m, &M->gate_bias, E, Fe, r, n)) || (st = split_bias(m, &M->up_bias, E, Fe, r, n))) return st;
  if (r != 0) M->down_bias = NULL;
  if (M->sh_gate.data) {
    const int64_t Fs = mc->shared_inter, Sl = Fs / n;
    M->sh_gate = sm_weight_rows(&M->sh_gate, r * Sl, Sl);
    M->sh_up = sm_weight_rows(&M->sh_up, r * Sl, Sl);
    if ((st = sm_tp_cols(m, &M->sh_down, r * Sl, Sl, "shared expert's down_proj", l))) return st;
  }
  return SMELT_OK;
}

/* the layer's weights, in the order prepare / release walk them */
static int layer_weights(sm_moe_layer *M, sm_weight **w) {
  sm_weight *all[] = {&M->router, &M->gate, &M->up, &M->down, &M->sh_gate, &M->sh_up, &M->sh_down, &M->sh_route};
  int n = 0;
  for (size_t i = 0; i < SM_ARRAY_LEN(all); i++)
    if (all[i]->data) w[n++] = all[i];
  return n;
}

smelt_status sm_moe_prepare(smelt_model *m) {
  for (int l = 0; m->layers && l < m->cfg.num_hidden_layers; l++) {
    if (!m->layers[l].moe) continue;
    sm_weight *w[8];
    const int n = layer_weights(m->layers[l].moe, w);
    for (int i = 0; i < n; i++) {
      smelt_status st = m->be->prepare_weight(m->be, w[i]);
      if (st) return st;
    }
  }
  return SMELT_OK;
}

static void free_scratch(smelt_model *m) {
  sm_moe_scratch *s = m->moe_scr;
  if (!s) return;
  float *bufs[] = {s->logits, s->wts, s->g, s->u, s->y, s->sg, s->su, s->sh, s->s, (float *)s->ids, s->rx, s->mo};
  for (size_t i = 0; i < SM_ARRAY_LEN(bufs); i++)
    if (bufs[i]) m->be->free(m->be, bufs[i]);
  free(s);
  m->moe_scr = NULL;
}

void sm_moe_release(smelt_model *m) {
  free_scratch(m);
  for (int l = 0; m->layers && l < m->cfg.num_hidden_layers; l++) {
    sm_moe_layer *M = m->layers[l].moe;
    if (!M) continue;
    sm_weight *w[8];
    const int n = layer_weights(M, w);
    for (int i = 0; i < n; i++)
      if (w[i]->dev) m->be->release_weight(m->be, w[i]);
    free(M);
    m->layers[l].moe = NULL;
  }
}

smelt_status sm_moe_reserve(smelt_model *m, int n) {
  if (!m->fam->moe || m->cfg.moe.n_experts <= 0 || (m->moe_scr && m->moe_scr->tokens >= n)) return SMELT_OK;
  free_scratch(m);
  const sm_moe_config *mc = &m->cfg.moe;
  const size_t N = (size_t)n, k = (size_t)mc->top_k, H = (size_t)m->cfg.hidden_size;
  const size_t Fe = (size_t)mc->expert_inter, Fs = (size_t)(mc->shared_inter > 0 ? mc->shared_inter : 1);
  sm_moe_scratch *s = sm_xcalloc(1, sizeof *s);
  m->moe_scr = s;
  struct {
    float **p;
    size_t floats;
  } want[] = {
    {&s->logits, N * (size_t)mc->n_experts},
    {&s->wts, N * k},
    {(float **)&s->ids, N * k},
    {&s->g, N * k * Fe},
    {&s->u, N * k * Fe},
    {&s->y, N * k * H},
    {&s->sg, N * Fs},
    {&s->su, N * Fs},
    {&s->sh, N * H},
    {&s->s, N},
    {&s->rx, m->fam->moe->beside_mlp ? N * H : 1},
    {&s->mo, m->fam->moe->beside_mlp ? N * H : 1},
  };
  for (size_t i = 0; i < SM_ARRAY_LEN(want); i++) {
    *want[i].p = m->be->alloc(m->be, want[i].floats * sizeof(float));
    if (!*want[i].p) {
      free_scratch(m);
      return sm_err(SMELT_ERR_OOM, "out of backend memory for the mixture-of-experts activations");
    }
  }
  s->tokens = n;
  return SMELT_OK;
}

/* the mixture on x, routed on xr */
static smelt_status moe_core(smelt_model *m, const sm_layer *L, const float *xr, const float *x, int n, float *out) {
  const sm_moe_layer *M = L->moe;
  const sm_moe_spec *sp = m->fam->moe;
  const sm_moe_config *mc = &m->cfg.moe;
  sm_backend *be = m->be;
  smelt_status st = sm_moe_reserve(m, n); /* done by sm_model_reserve before the step */
  if (st) return st;
  sm_moe_scratch *s = m->moe_scr;
  const int E = mc->n_experts, k = mc->top_k, H = m->cfg.hidden_size, Fe = mc->expert_inter;
  const size_t nh = (size_t)n * (size_t)k * (size_t)Fe;
  be->matmul(be, SM_MM_ROUTER, &M->router, xr, n, s->logits);
  if (M->router_bias) be->add_rows(be, s->logits, M->router_bias, n, E);
  be->moe_route(be, s->logits, n, &M->route, s->ids, s->wts);
  be->matmul_experts(be, SM_MM_EXPERT_GATE, &M->gate, Fe, M->gate_bias, x, false, n, k, s->ids, s->g);
  be->matmul_experts(be, SM_MM_EXPERT_UP, &M->up, Fe, M->up_bias, x, false, n, k, s->ids, s->u);
  if (sp->clamped_swiglu) be->swiglu_clamp(be, s->g, s->g, s->u, nh, mc->swiglu_alpha, mc->swiglu_limit);
  else if (m->act == SM_ACT_GELU_TANH) be->gelu_mul(be, s->g, s->g, s->u, nh);
  else be->silu_mul(be, s->g, s->g, s->u, nh);
  be->matmul_experts(be, SM_MM_EXPERT_DOWN, &M->down, H, M->down_bias, s->g, true, n, k, s->ids, s->y);
  be->moe_combine(be, out, s->y, s->wts, n, k, H);
  if (M->sh_gate.data) {
    const size_t ns = (size_t)n * (size_t)mc->shared_inter;
    const sm_mm_role roles[2] = {SM_MM_GATE, SM_MM_UP}; /* the shared expert's gate and up of one x */
    const sm_weight *ws[2] = {&M->sh_gate, &M->sh_up};
    float *ys[2] = {s->sg, s->su};
    sm_matmul_group(be, roles, ws, x, n, ys, 2);
    if (m->act == SM_ACT_GELU_TANH) be->gelu_mul(be, s->sg, s->sg, s->su, ns);
    else be->silu_mul(be, s->sg, s->sg, s->su, ns);
    be->matmul(be, SM_MM_DOWN, &M->sh_down, s->sg, n, s->sh);
    if (M->sh_route.data) {
      be->matmul(be, SM_MM_SHARED_GATE, &M->sh_route, x, n, s->s);
      be->sigmoid_gate_rows(be, s->sh, s->s, n, H);
    }
    be->add(be, out, s->sh, (size_t)n * (size_t)H);
  }
  return SMELT_OK;
}

smelt_status sm_moe_forward(smelt_model *m, const sm_layer *L, const float *x, int n, float *out) {
  return moe_core(m, L, x, x, n, out);
}

smelt_status sm_moe_beside(smelt_model *m, const sm_layer *L, int n, float *mout) {
  const sm_moe_layer *M = L->moe;
  sm_backend *be = m->be;
  const int H = m->cfg.hidden_size;
  const float eps = m->cfg.rms_norm_eps, off = m->fam->recipe->norm_offset;
  smelt_status st = sm_moe_reserve(m, n);
  if (st) return st;
  sm_moe_scratch *s = m->moe_scr;
  be->rmsnorm(be, m->xb, m->x, L->vec[SM_T_MOE_NORM], n, H, eps, off);
  be->rmsnorm(be, s->rx, m->x, M->router_norm, n, H, eps, 0.0f);
  if ((st = moe_core(m, L, s->rx, m->xb, n, s->mo))) return st;
  be->rmsnorm(be, s->mo, s->mo, L->vec[SM_T_MOE_OUT_NORM], n, H, eps, off);
  be->add(be, mout, s->mo, (size_t)n * (size_t)H);
  return SMELT_OK;
}
