/* The op sequence each family's forward issues, pinned per family.
 *
 * Backends fuse runs of ops (the CUDA fusion table matches the order of calls in
 * src/model/transformer.c and the matmul roles). An edit to the forward or to a family's recipe
 * that changes what a decode step issues must fail here, so that whoever makes it also checks
 * the fused paths (tests/cuda test_fusions counts what fires on a GPU). A recording backend wraps
 * the CPU backend: it logs every op (matmuls with their role) and then runs it, so the logits are
 * also compared with the plain CPU backend's. */
#include <string.h>
#include <sys/stat.h>
#include "backend/backend.h"
#include "base/strbuf.h"
#include "engine/engine.h"
#include "model/model.h"
#include "../test_util.h"

typedef struct {
  sm_backend base;
  sm_backend *in;
  sm_buf log;
} rec_be;
static rec_be *R(sm_backend *b) { return (rec_be *)b; }
static void note(sm_backend *b, const char *op) {
  rec_be *r = R(b);
  if (r->log.n) sm_buf_putc(&r->log, ' ');
  sm_buf_puts(&r->log, op);
}

static void r_destroy(sm_backend *b) {
  rec_be *r = R(b);
  r->in->destroy(r->in);
  sm_buf_free(&r->log);
  free(r);
}
static void *r_alloc(sm_backend *b, size_t n) { return R(b)->in->alloc(R(b)->in, n); }
static void r_free(sm_backend *b, void *p) { R(b)->in->free(R(b)->in, p); }
static void r_upload(sm_backend *b, void *d, const void *s, size_t n) { R(b)->in->upload(R(b)->in, d, s, n); }
static void r_download(sm_backend *b, void *d, const void *s, size_t n) { R(b)->in->download(R(b)->in, d, s, n); }
static void r_sync(sm_backend *b) { R(b)->in->sync(R(b)->in); }
static smelt_status r_prepare(sm_backend *b, sm_weight *w) { return R(b)->in->prepare_weight(R(b)->in, w); }
static void r_release(sm_backend *b, sm_weight *w) { R(b)->in->release_weight(R(b)->in, w); }
static smelt_status r_set_batch(sm_backend *b, const sm_batch *bt) {
  sm_buf_clear(&R(b)->log); /* the log holds the current step */
  return R(b)->in->set_batch(R(b)->in, bt);
}
static void r_embed(sm_backend *b, const sm_weight *e, float *o) {
  note(b, "embed");
  R(b)->in->embed(R(b)->in, e, o);
}
static void r_matmul(sm_backend *b, sm_mm_role role, const sm_weight *w, const float *x, int n, float *y) {
  char t[32];
  snprintf(t, sizeof t, "mm:%s", sm_mm_role_name(role));
  note(b, t);
  R(b)->in->matmul(R(b)->in, role, w, x, n, y);
}
static void r_rmsnorm(sm_backend *b, float *o, const float *x, const float *w, int n, int d, float e, float off) {
  note(b, "rmsnorm");
  R(b)->in->rmsnorm(R(b)->in, o, x, w, n, d, e, off);
}
static void r_layernorm(sm_backend *b, float *o, const float *x, const float *w, const float *bi, int n, int d,
                        float e) {
  note(b, "layernorm");
  R(b)->in->layernorm(R(b)->in, o, x, w, bi, n, d, e);
}
static void r_rope(sm_backend *b, float *x, int nh, int hd, int rd, const float *f) {
  note(b, "rope");
  R(b)->in->rope(R(b)->in, x, nh, hd, rd, f);
}
static void r_rope_ext(sm_backend *b, float *x, int nh, int hd, const sm_rope_ext *e) {
  note(b, "rope_ext");
  R(b)->in->rope_ext(R(b)->in, x, nh, hd, e);
}
static void r_kv_store(sm_backend *b, const sm_kv_cache *kv, int l, const float *k, const float *v) {
  note(b, "kv_store");
  R(b)->in->kv_store(R(b)->in, kv, l, k, v);
}
static void r_attention(sm_backend *b, float *o, const float *q, const sm_kv_cache *kv, int l, int nh, float sc,
                        int win, float cap) {
  note(b, win > 0 ? "attention:window" : "attention");
  R(b)->in->attention(R(b)->in, o, q, kv, l, nh, sc, win, cap);
}
static void r_silu_mul(sm_backend *b, float *o, const float *g, const float *u, size_t n) {
  note(b, "silu_mul");
  R(b)->in->silu_mul(R(b)->in, o, g, u, n);
}
static void r_gelu_mul(sm_backend *b, float *o, const float *g, const float *u, size_t n) {
  note(b, "gelu_mul");
  R(b)->in->gelu_mul(R(b)->in, o, g, u, n);
}
static void r_add(sm_backend *b, float *y, const float *x, size_t n) {
  note(b, "add");
  R(b)->in->add(R(b)->in, y, x, n);
}
static void r_add_rows(sm_backend *b, float *y, const float *x, int n, int d) {
  note(b, "add_rows");
  R(b)->in->add_rows(R(b)->in, y, x, n, d);
}
static void r_scale(sm_backend *b, float *y, float s, size_t n) {
  note(b, "scale");
  R(b)->in->scale(R(b)->in, y, s, n);
}
static void r_softcap(sm_backend *b, float *y, float c, size_t n) {
  note(b, "softcap");
  R(b)->in->softcap(R(b)->in, y, c, n);
}
static void r_gather(sm_backend *b, float *d, const float *s, int dim) {
  note(b, "gather_out");
  R(b)->in->gather_out(R(b)->in, d, s, dim);
}

static void r_moe_route(sm_backend *b, const float *l, int n, const sm_moe_route *r, int32_t *ids, float *w) {
  note(b, "moe_route");
  R(b)->in->moe_route(R(b)->in, l, n, r, ids, w);
}
static void r_matmul_experts(sm_backend *b, sm_mm_role role, const sm_weight *w, int64_t rows, const float *bias,
                             const float *x, bool per_slot, int n, int k, const int32_t *ids, float *y) {
  char t[40];
  snprintf(t, sizeof t, "mmx:%s", sm_mm_role_name(role));
  note(b, t);
  R(b)->in->matmul_experts(R(b)->in, role, w, rows, bias, x, per_slot, n, k, ids, y);
}
static void r_moe_combine(sm_backend *b, float *o, const float *y, const float *w, int n, int k, int dim) {
  note(b, "moe_combine");
  R(b)->in->moe_combine(R(b)->in, o, y, w, n, k, dim);
}
static void r_swiglu_clamp(sm_backend *b, float *o, const float *g, const float *u, size_t n, float a, float lim) {
  note(b, "swiglu_clamp");
  R(b)->in->swiglu_clamp(R(b)->in, o, g, u, n, a, lim);
}
static void r_sigmoid_gate_rows(sm_backend *b, float *y, const float *g, int n, int dim) {
  note(b, "sigmoid_gate_rows");
  R(b)->in->sigmoid_gate_rows(R(b)->in, y, g, n, dim);
}
static void r_attention_sinks(sm_backend *b, float *o, const float *q, const sm_kv_cache *kv, int l, int nh, float sc,
                              int win, float cap, const float *sinks) {
  note(b, win > 0 ? "attention_sinks:window" : "attention_sinks");
  R(b)->in->attention_sinks(R(b)->in, o, q, kv, l, nh, sc, win, cap, sinks);
}
static void r_attention_mla(sm_backend *b, float *o, const float *ql, const float *qp, const float *c, const float *kp,
                            const sm_kv_cache *kv, int l, int nh, int dr, float sc) {
  note(b, "attention_mla");
  R(b)->in->attention_mla(R(b)->in, o, ql, qp, c, kp, kv, l, nh, dr, sc);
}

static void r_gather_rows(sm_backend *b, float *d, const float *s, const int32_t *idx, int n, int dim) {
  note(b, "gather_rows");
  R(b)->in->gather_rows(R(b)->in, d, s, idx, n, dim);
}
static void r_copy(sm_backend *b, void *d, const void *s, size_t n) {
  note(b, "copy");
  R(b)->in->copy(R(b)->in, d, s, n);
}
static void r_mul(sm_backend *b, float *y, const float *a, const float *x, size_t n) {
  note(b, "mul");
  R(b)->in->mul(R(b)->in, y, a, x, n);
}
static void r_sigmoid_mul(sm_backend *b, float *y, const float *g, size_t n) {
  note(b, "sigmoid_mul");
  R(b)->in->sigmoid_mul(R(b)->in, y, g, n);
}
static void r_relu2(sm_backend *b, float *y, size_t n) {
  note(b, "relu2");
  R(b)->in->relu2(R(b)->in, y, n);
}
static void r_conv1d(sm_backend *b, float *o, const float *x, const float *w, const float *bi, int C, int K, bool act,
                     const sm_kv_cache *kv, int l) {
  note(b, "conv1d");
  R(b)->in->conv1d(R(b)->in, o, x, w, bi, C, K, act, kv, l);
}
static void r_ssm_scan(sm_backend *b, float *y, const float *x, const float *B, const float *C, int ld, const float *dt,
                       const float *dtb, const float *al, const float *D, int nh, int P, int G, int N, float lo,
                       float hi, const sm_kv_cache *kv, int l) {
  note(b, "ssm_scan");
  R(b)->in->ssm_scan(R(b)->in, y, x, B, C, ld, dt, dtb, al, D, nh, P, G, N, lo, hi, kv, l);
}
static void r_gated_delta(sm_backend *b, float *y, const float *q, const float *k, const float *v, int ld,
                          const float *a, const float *bb, const float *al, const float *dtb, int hk, int hv, int dk,
                          int dv, const sm_kv_cache *kv, int l) {
  note(b, "gated_delta");
  R(b)->in->gated_delta(R(b)->in, y, q, k, v, ld, a, bb, al, dtb, hk, hv, dk, dv, kv, l);
}
static void r_gated_rmsnorm(sm_backend *b, float *o, const float *x, const float *z, const float *w, int n, int dim,
                            int group, int wdim, float eps, bool nf) {
  note(b, "gated_rmsnorm");
  R(b)->in->gated_rmsnorm(R(b)->in, o, x, z, w, n, dim, group, wdim, eps, nf);
}

static sm_backend *rec_create(void) {
  rec_be *r = calloc(1, sizeof *r);
  r->in = sm_cpu_backend_create(1);
  sm_backend *b = &r->base;
  b->name = "rec";
  b->destroy = r_destroy;
  b->alloc = r_alloc;
  b->free = r_free;
  b->upload = r_upload;
  b->download = r_download;
  b->sync = r_sync;
  b->prepare_weight = r_prepare;
  b->release_weight = r_release;
  b->set_batch = r_set_batch;
  b->embed = r_embed;
  b->matmul = r_matmul;
  b->rmsnorm = r_rmsnorm;
  b->layernorm = r_layernorm;
  b->rope = r_rope;
  b->rope_ext = r_rope_ext;
  b->kv_store = r_kv_store;
  b->attention = r_attention;
  b->silu_mul = r_silu_mul;
  b->gelu_mul = r_gelu_mul;
  b->add = r_add;
  b->add_rows = r_add_rows;
  b->scale = r_scale;
  b->softcap = r_softcap;
  b->gather_out = r_gather;
  b->moe_route = r_moe_route;
  b->matmul_experts = r_matmul_experts;
  b->moe_combine = r_moe_combine;
  b->swiglu_clamp = r_swiglu_clamp;
  b->sigmoid_gate_rows = r_sigmoid_gate_rows;
  b->attention_sinks = r_attention_sinks;
  b->attention_mla = r_attention_mla;
  b->copy = r_copy;
  b->gather_rows = r_gather_rows;
  b->mul = r_mul;
  b->sigmoid_mul = r_sigmoid_mul;
  b->relu2 = r_relu2;
  b->conv1d = r_conv1d;
  b->ssm_scan = r_ssm_scan;
  b->gated_delta = r_gated_delta;
  b->gated_rmsnorm = r_gated_rmsnorm;
  return b; /* no sample ops: the engine samples on the host */
}

/* expected decode-step sequences: the ops after embed, each layer's, and the head's. The synthetic
 * models have 2 layers (hybrid families: their registry's synthetic layer mix, Nemotron-H 3); "extra" is
 * config.json members that give a family its per-layer kinds (a sliding window of 8, shorter than the
 * prompt, so that it matters). */
#define QKV "mm:q mm:k mm:v"
#define ROPE "rope rope kv_store"
#define ROPEX "rope_ext rope_ext kv_store"
#define ATTN_OUT "attention mm:o add"
#define MLP "rmsnorm mm:gate mm:up silu_mul mm:down add"
#define GELU_MLP "rmsnorm mm:gate mm:up gelu_mul mm:down add"
#define HEAD "gather_out rmsnorm mm:lm_head"
#define LLAMA_LAYER "rmsnorm " QKV " " ROPE " " ATTN_OUT " " MLP
#define POST_MLP "mm:gate mm:up silu_mul mm:down rmsnorm add" /* OLMo 2 / EXAONE 4: the MLP reads x */
#define SANDWICH_MLP "rmsnorm mm:gate mm:up gelu_mul mm:down rmsnorm add"
#define PLE_ADD "gather_rows mm:ple gelu_mul mm:ple rmsnorm add" /* Gemma 4: the layer's per-layer input */
/* Gemma 4's MLP with the experts beside it: the MLP, its norm, the experts' input and router norms, the experts,
 * their norm, the sum, the feed-forward output norm, the residual add */
#define G4_MOE \
  "rmsnorm mm:gate mm:up gelu_mul mm:down rmsnorm rmsnorm rmsnorm mm:router moe_route mmx:expert_gate " \
  "mmx:expert_up gelu_mul mmx:expert_down moe_combine rmsnorm add rmsnorm add"
/* mixtures of experts (src/model/moe.c): router, routing, the chosen experts, their weighted sum */
#define EXPERTS "moe_route mmx:expert_gate mmx:expert_up silu_mul mmx:expert_down moe_combine"
#define MOE "rmsnorm mm:router " EXPERTS " add"
#define SHARED "mm:gate mm:up silu_mul mm:down"
#define GDN "mm:rec_in mm:rec_in mm:rec_in mm:rec_in conv1d gated_delta gated_rmsnorm mm:rec_out"
#define MAMBA2 "mm:rec_in mm:rec_in mm:rec_in conv1d ssm_scan gated_rmsnorm mm:rec_out"
#define GATED_ATTN_BLOCK "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " attention mm:attn_gate sigmoid_mul mm:o add"
#define GATED_ATTN GATED_ATTN_BLOCK " " MLP
/* multi-head latent attention (src/model/mla.c): q_a, its norm, q_b's nope and rope rows, kv_a's latent and
 * rotated key rows, the latent's norm, RoPE, the per-head up-projections around attention over the latent */
#define MLA "rmsnorm mm:q rmsnorm mm:q mm:q mm:k mm:k rmsnorm rope rope mmx:mla_uk attention_mla mmx:mla_uv mm:o add"
/* Qwen3-Next / Qwen3.5 MoE: routed experts, then the shared expert times its sigmoid gate */
#define SHARED_MOE "rmsnorm mm:router " EXPERTS " " SHARED " mm:shared_gate sigmoid_gate_rows add add"
static const struct {
  const char *family, *extra, *pre, *layer[3], *head;
} k_cases[] = {
  {"llama", NULL, "", {LLAMA_LAYER, LLAMA_LAYER}, HEAD},
  {"mistral",
   "{\"sliding_window\": 8}",
   "",
   {"rmsnorm " QKV " " ROPE " attention:window mm:o add " MLP,
    "rmsnorm " QKV " " ROPE " attention:window mm:o add " MLP},
   HEAD},
  /* the Llama-4 query scaling past original_max_position_embeddings: rope_ext */
  {"ministral3",
   "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8.0, \"original_max_position_embeddings\": 32,"
   " \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"llama_4_scaling_beta\": 0.1}}",
   "",
   {"rmsnorm " QKV " " ROPEX " " ATTN_OUT " " MLP, "rmsnorm " QKV " " ROPEX " " ATTN_OUT " " MLP},
   HEAD},
  {"qwen2",
   NULL,
   "",
   {"rmsnorm " QKV " add_rows add_rows add_rows " ROPE " " ATTN_OUT " " MLP,
    "rmsnorm " QKV " add_rows add_rows add_rows " ROPE " " ATTN_OUT " " MLP},
   HEAD},
  {"qwen3",
   NULL,
   "",
   {"rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MLP,
    "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MLP},
   HEAD},
  {"qwen2_5_vl_text",
   NULL,
   "",
   {"rmsnorm " QKV " add_rows add_rows add_rows " ROPE " " ATTN_OUT " " MLP,
    "rmsnorm " QKV " add_rows add_rows add_rows " ROPE " " ATTN_OUT " " MLP},
   HEAD},
  {"qwen2_vl_text",
   NULL,
   "",
   {"rmsnorm " QKV " add_rows add_rows add_rows " ROPE " " ATTN_OUT " " MLP,
    "rmsnorm " QKV " add_rows add_rows add_rows " ROPE " " ATTN_OUT " " MLP},
   HEAD},
  {"qwen3_vl_text",
   NULL,
   "",
   {"rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MLP,
    "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MLP},
   HEAD},
  /* Gemma: embeddings scaled, GELU */
  {"gemma",
   NULL,
   " scale",
   {"rmsnorm " QKV " " ROPE " " ATTN_OUT " " GELU_MLP, "rmsnorm " QKV " " ROPE " " ATTN_OUT " " GELU_MLP},
   HEAD},
  /* Gemma 2: sliding layer 0, full layer 1, norms on the sublayer outputs, final softcap */
  {"gemma2",
   "{\"sliding_window\": 8}",
   " scale",
   {"rmsnorm " QKV " " ROPE " attention:window mm:o rmsnorm add " SANDWICH_MLP,
    "rmsnorm " QKV " " ROPE " attention mm:o rmsnorm add " SANDWICH_MLP},
   HEAD " softcap"},
  /* Gemma 3: q/k norms, the sliding layer with its local RoPE */
  {"gemma3_text",
   "{\"sliding_window\": 8, \"sliding_window_pattern\": 2}",
   " scale",
   {"rmsnorm " QKV " rmsnorm rmsnorm " ROPE " attention:window mm:o rmsnorm add " SANDWICH_MLP,
    "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " attention mm:o rmsnorm add " SANDWICH_MLP},
   HEAD},
  /* Gemma 4: per-layer inputs (the embeddings' projection, normed, plus the table's rows), v norms, a sliding
   * layer, a full layer whose keys are its values, a full layer reading layer 1's K/V (no k/v of its own); after
   * each MLP the layer's input gated in, then the layer scalar; final softcap */
  {"gemma4_text",
   "{\"num_hidden_layers\": 3, \"layer_types\": [\"sliding_attention\", \"full_attention\", \"full_attention\"],"
   " \"sliding_window\": 8, \"global_head_dim\": 32, \"num_kv_shared_layers\": 1, \"hidden_size_per_layer_input\": 16,"
   " \"vocab_size_per_layer_input\": 300, \"attention_k_eq_v\": true, \"num_global_key_value_heads\": 1,"
   " \"final_logit_softcapping\": 30.0}",
   " scale mm:ple scale rmsnorm embed scale add scale",
   {"rmsnorm mm:q mm:k mm:v rmsnorm rmsnorm rmsnorm " ROPE " attention:window mm:o rmsnorm add " SANDWICH_MLP
    " " PLE_ADD " scale",
    "rmsnorm mm:q mm:k copy rmsnorm rmsnorm rmsnorm " ROPE " attention mm:o rmsnorm add " SANDWICH_MLP " " PLE_ADD
    " scale",
    "rmsnorm mm:q rmsnorm rope attention mm:o rmsnorm add " SANDWICH_MLP " " PLE_ADD " scale"},
   HEAD " softcap"},
  /* Gemma 4 26B-A4B style: the experts beside every layer's dense MLP, each with its own norms, routed on the
   * residual (its weightless norm times router.scale) */
  {"gemma4_text",
   "{\"hidden_size_per_layer_input\": 0, \"sliding_window\": 8, \"sliding_window_pattern\": 2,"
   " \"global_head_dim\": 32, \"enable_moe_block\": true, \"num_experts\": 4, \"top_k_experts\": 2,"
   " \"moe_intermediate_size\": 64}",
   " scale",
   {"rmsnorm mm:q mm:k mm:v rmsnorm rmsnorm rmsnorm " ROPE " attention:window mm:o rmsnorm add " G4_MOE " scale",
    "rmsnorm mm:q mm:k mm:v rmsnorm rmsnorm rmsnorm " ROPE " attention mm:o rmsnorm add " G4_MOE " scale"},
   HEAD},
  /* Phi-4-mini style: fused qkv / gate_up as row views, partial rotary with longrope: rope_ext */
  {"phi3",
   "{\"partial_rotary_factor\": 0.75, \"original_max_position_embeddings\": 32, \"rope_scaling\":"
   " {\"type\": \"longrope\", \"short_factor\": \"6x1.0\", \"long_factor\": \"6x2.0\"}}",
   "",
   {"rmsnorm " QKV " " ROPEX " " ATTN_OUT " " MLP, "rmsnorm " QKV " " ROPEX " " ATTN_OUT " " MLP},
   HEAD},
  /* SmolLM3: layer 1 NoPE */
  {"smollm3", "{\"no_rope_layers\": [1, 0]}", "", {LLAMA_LAYER, "rmsnorm " QKV " kv_store " ATTN_OUT " " MLP}, HEAD},
  /* OLMo 2: no pre-norms, q/k norms over the whole projection, post-norms */
  {"olmo2",
   NULL,
   "",
   {QKV " rmsnorm rmsnorm " ROPE " attention mm:o rmsnorm add " POST_MLP,
    QKV " rmsnorm rmsnorm " ROPE " attention mm:o rmsnorm add " POST_MLP},
   HEAD},
  {"olmo3",
   "{\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", \"full_attention\"]}",
   "",
   {QKV " rmsnorm rmsnorm " ROPE " attention:window mm:o rmsnorm add " POST_MLP,
    QKV " rmsnorm rmsnorm " ROPE " attention mm:o rmsnorm add " POST_MLP},
   HEAD},
  /* Granite: embedding, residual and logit multipliers */
  {"granite",
   "{\"embedding_multiplier\": 12.0, \"attention_multiplier\": 0.015625, \"residual_multiplier\": 0.22,"
   " \"logits_scaling\": 8.0}",
   " scale",
   {"rmsnorm " QKV " " ROPE " attention mm:o scale add rmsnorm mm:gate mm:up silu_mul mm:down scale add",
    "rmsnorm " QKV " " ROPE " attention mm:o scale add rmsnorm mm:gate mm:up silu_mul mm:down scale add"},
   HEAD " scale"},
  /* GLM-4: interleaved partial RoPE (q/k rows permuted at load: the plain rope op), four norms */
  {"glm4",
   NULL,
   "",
   {"rmsnorm " QKV " " ROPE " attention mm:o rmsnorm add rmsnorm mm:gate mm:up silu_mul mm:down rmsnorm add",
    "rmsnorm " QKV " " ROPE " attention mm:o rmsnorm add rmsnorm mm:gate mm:up silu_mul mm:down rmsnorm add"},
   HEAD},
  /* EXAONE 4: q/k norms, post-norms, the full layer NoPE */
  {"exaone4",
   "{\"sliding_window\": 8, \"sliding_window_pattern\": 2}",
   "",
   {QKV " rmsnorm rmsnorm " ROPE " attention:window mm:o rmsnorm add " POST_MLP,
    QKV " rmsnorm rmsnorm kv_store attention mm:o rmsnorm add " POST_MLP},
   HEAD},
  /* Cohere 2: LayerNorm, attention and MLP in parallel, RoPE on the sliding layer only, logit_scale */
  {"cohere2",
   "{\"sliding_window\": 8, \"sliding_window_pattern\": 2}",
   "",
   {"layernorm " QKV " " ROPE " attention:window mm:o mm:gate mm:up silu_mul mm:down add add",
    "layernorm " QKV " kv_store attention mm:o mm:gate mm:up silu_mul mm:down add add"},
   "gather_out layernorm mm:lm_head scale"},
  /* Qwen3-MoE: Qwen3's attention, every layer a mixture */
  {"qwen3_moe",
   NULL,
   "",
   {"rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MOE,
    "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MOE},
   HEAD},
  {"qwen3_vl_moe_text",
   NULL,
   "",
   {"rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MOE,
    "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MOE},
   HEAD},
  /* Qwen2-MoE: the shared expert and its sigmoid gate */
  {"qwen2_moe",
   NULL,
   "",
   {"rmsnorm " QKV " add_rows add_rows add_rows " ROPE " " ATTN_OUT " rmsnorm mm:router " EXPERTS " " SHARED
    " mm:shared_gate sigmoid_gate_rows add add",
    "rmsnorm " QKV " add_rows add_rows add_rows " ROPE " " ATTN_OUT " rmsnorm mm:router " EXPERTS " " SHARED
    " mm:shared_gate sigmoid_gate_rows add add"},
   HEAD},
  {"mixtral",
   "{\"sliding_window\": 8}",
   "",
   {"rmsnorm " QKV " " ROPE " attention:window mm:o add " MOE,
    "rmsnorm " QKV " " ROPE " attention:window mm:o add " MOE},
   HEAD},
  /* gpt-oss: biases, attention sinks, sliding layer 0 and full layer 1, router bias, clamped SwiGLU */
  {"gpt_oss",
   "{\"sliding_window\": 8, \"attention_bias\": true}",
   "",
   {"rmsnorm " QKV " add_rows add_rows add_rows " ROPE " attention_sinks:window mm:o add_rows add rmsnorm mm:router "
    "add_rows moe_route mmx:expert_gate mmx:expert_up swiglu_clamp mmx:expert_down moe_combine add",
    "rmsnorm " QKV " add_rows add_rows add_rows " ROPE " attention_sinks mm:o add_rows add rmsnorm mm:router "
    "add_rows moe_route mmx:expert_gate mmx:expert_up swiglu_clamp mmx:expert_down moe_combine add"},
   HEAD},
  /* GLM-4 MoE: layer 0 dense (first_k_dense_replace 1), q/k norms with use_qk_norm, the shared expert */
  {"glm4_moe",
   "{\"use_qk_norm\": true, \"attention_bias\": true, \"n_group\": 2, \"topk_group\": 1}",
   "",
   {"rmsnorm " QKV " add_rows add_rows add_rows rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MLP,
    "rmsnorm " QKV " add_rows add_rows add_rows rmsnorm rmsnorm " ROPE " " ATTN_OUT " rmsnorm mm:router " EXPERTS
    " " SHARED " add add"},
   HEAD},
  /* DeepSeek-V3: multi-head latent attention, layer 0 dense, then group-limited routing and a shared expert */
  {"deepseek_v3", NULL, "", {MLA " " MLP, MLA " rmsnorm mm:router " EXPERTS " " SHARED " add add"}, HEAD},
  /* the older kv_b_proj checkpoints: the same ops */
  {"deepseek_v3",
   "{\"smelt_mla_kv_b\": true}",
   "",
   {MLA " " MLP, MLA " rmsnorm mm:router " EXPERTS " " SHARED " add add"},
   HEAD},
  /* a plain q_proj (q_lora_rank null, DeepSeek-V2-Lite style) */
  {"deepseek_v3",
   "{\"q_lora_rank\": null}",
   "",
   {"rmsnorm mm:q mm:q mm:k mm:k rmsnorm rope rope mmx:mla_uk attention_mla mmx:mla_uv mm:o add " MLP,
    "rmsnorm mm:q mm:q mm:k mm:k rmsnorm rope rope mmx:mla_uk attention_mla mmx:mla_uv mm:o add rmsnorm mm:router " EXPERTS
    " " SHARED " add add"},
   HEAD},
  {"glm4_moe_lite", NULL, "", {MLA " " MLP, MLA " rmsnorm mm:router " EXPERTS " " SHARED " add add"}, HEAD},
  /* hybrid families: a recurrent layer, then attention */
  /* Qwen3.5 / Qwen3-Next: Gated DeltaNet (in_proj qkv, z, b, a), gated attention */
  {"qwen3_5_text", NULL, "", {"rmsnorm " GDN " add " MLP, GATED_ATTN}, HEAD},
  /* Qwen3-Next: layer 0 a mixture (mlp_only_layers [1] in its synthetic config), layer 1 dense */
  {"qwen3_next", NULL, "", {"rmsnorm " GDN " add " SHARED_MOE, GATED_ATTN}, HEAD},
  {"qwen3_next", "{\"num_experts\": 0}", "", {"rmsnorm " GDN " add " MLP, GATED_ATTN}, HEAD},
  /* Qwen3.5 MoE: every layer a mixture */
  {"qwen3_5_moe_text", NULL, "", {"rmsnorm " GDN " add " SHARED_MOE, GATED_ATTN_BLOCK " " SHARED_MOE}, HEAD},
  /* LFM2: conv(B * x) * C, attention with q/k norms */
  {"lfm2",
   NULL,
   "",
   {"rmsnorm mm:rec_in mm:rec_in mm:rec_in mul conv1d mul mm:rec_out add " MLP,
    "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MLP},
   HEAD},
  /* LFM2-MoE: layer 0 dense (num_dense_layers 1 in its synthetic config), layer 1 a sigmoid-routed mixture */
  {"lfm2_moe",
   NULL,
   "",
   {"rmsnorm mm:rec_in mm:rec_in mm:rec_in mul conv1d mul mm:rec_out add " MLP,
    "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MOE},
   HEAD},
  /* without use_expert_bias: no choice correction (no expert_bias tensor) */
  {"lfm2_moe",
   "{\"use_expert_bias\": false}",
   "",
   {"rmsnorm mm:rec_in mm:rec_in mm:rec_in mul conv1d mul mm:rec_out add " MLP,
    "rmsnorm " QKV " rmsnorm rmsnorm " ROPE " " ATTN_OUT " " MOE},
   HEAD},
  /* Nemotron-H: Mamba-2, attention without RoPE, a squared-ReLU MLP, each a layer of its own */
  {"nemotron_h",
   NULL,
   "",
   {"rmsnorm " MAMBA2 " add", "rmsnorm " QKV " kv_store " ATTN_OUT, "rmsnorm mm:up relu2 mm:down add"},
   HEAD},
  /* Granite 4.0-H: Mamba-2, attention with RoPE (position_embedding_type rope), multipliers */
  {"granitemoehybrid",
   NULL,
   " scale",
   {"rmsnorm " MAMBA2 " scale add rmsnorm mm:gate mm:up silu_mul mm:down scale add",
    "rmsnorm " QKV " " ROPE " attention mm:o scale add rmsnorm mm:gate mm:up silu_mul mm:down scale add"},
   HEAD " scale"},
};

static void run_case(int ci, const char *root) {
  const char *fam = k_cases[ci].family;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s-%d", root, fam, ci); /* a family may have several cases */
  sm_synth_shape sh = {"opseq", 64, 2, 4, 2, 128, 300, false, fam, 16, k_cases[ci].extra};
  CHECK(sm_make_synthetic(&sh, 4, 32, dir, false) == SMELT_OK, "%s: synthetic: %s", fam, smelt_last_error());
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  mp.n_threads = 1;
  mp.max_context = 64;
  smelt_model *rm = NULL, *cm = NULL;
  CHECK(sm_model_load_on(dir, &mp, rec_create(), &rm) == SMELT_OK, "%s: load: %s", fam, smelt_last_error());
  CHECK(smelt_model_load(dir, &mp, &cm) == SMELT_OK, "%s: load cpu: %s", fam, smelt_last_error());
  if (!rm || !cm) {
    smelt_model_free(rm);
    smelt_model_free(cm);
    return;
  }
  rec_be *r = R(rm->be);
  int32_t ids[20];
  for (int i = 0; i < 20; i++) ids[i] = (int32_t)((i * 37 + 11) % 300);
  /* 19 tokens prefill then one decode step, through the engine */
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = 64;
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  CHECK(sm_engine_create(rm, &ep, &e) == SMELT_OK, "engine: %s", smelt_last_error());
  sm_seq *q = sm_seq_new(e);
  sm_seq_append(e, q, ids, 19);
  float *lg = malloc(sizeof(float) * 300);
  uint8_t done = 0;
  while (!done) CHECK(sm_engine_step(e, &q, 1, lg, &done) == SMELT_OK, "prefill: %s", smelt_last_error());
  sm_seq_append(e, q, ids + 19, 1);
  done = 0;
  CHECK(sm_engine_step(e, &q, 1, lg, &done) == SMELT_OK && done, "decode step: %s", smelt_last_error());
  /* the decode step's log: embed, layers, head */
  sm_buf want = SM_BUF_INIT;
  sm_buf_printf(&want, "embed%s", k_cases[ci].pre);
  for (int l = 0; l < 3 && k_cases[ci].layer[l]; l++) sm_buf_printf(&want, " %s", k_cases[ci].layer[l]);
  sm_buf_printf(&want, " %s", k_cases[ci].head);
  CHECK(!strcmp(sm_buf_str(&r->log), sm_buf_str(&want)), "%s decode step ops:\n  got  %s\n  want %s", fam,
        sm_buf_str(&r->log), sm_buf_str(&want));
  sm_buf_free(&want);
  /* the recorded model computes what the plain CPU backend computes */
  float *ref = NULL;
  CHECK(smelt_eval_logits(cm, ids, 20, &ref) == SMELT_OK, "eval: %s", smelt_last_error());
  if (ref) CHECK(t_max_rel(lg, ref + 19 * 300, 300, 1e-3) < 2e-3, "%s: logits differ from the CPU backend's", fam);
  free(ref);
  free(lg);
  sm_seq_free(e, q);
  sm_engine_free(e);
  smelt_model_free(rm);
  smelt_model_free(cm);
}

int main(void) {
  char root[] = "/tmp/smelt-opseq-XXXXXX";
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) run_case((int)i, root);
  /* every runnable family has its case */
  size_t n;
  const sm_family *const *all = sm_family_all(&n);
  for (size_t i = 0; i < n; i++) {
    if (!all[i]->recipe) continue;
    bool found = false;
    for (size_t j = 0; j < sizeof k_cases / sizeof k_cases[0]; j++)
      found |= !strcmp(k_cases[j].family, all[i]->model_type);
    CHECK(found, "family %s has no op-sequence case", all[i]->model_type);
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd)) fprintf(stderr, "warning: could not remove %s\n", root);
  TEST_END();
}
