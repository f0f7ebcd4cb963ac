/* The public model API (smelt.h): load, free, information. Weight loading is in loader.c. */
#include "model/model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/kv_quant.h"
#include "model/tp.h"
#include "tokenizer/tokenizer.h"
#include "vision/vision.h"

void smelt_model_params_default(smelt_model_params *p) {
  memset(p, 0, sizeof *p);
  p->device = SMELT_DEVICE_AUTO;
  p->kv_type = SMELT_KV_F16;
  p->cpu_poll = 50;
}

static const char *const k_numa_names[] = {"none", "distribute", "isolate"};
smelt_status smelt_numa_parse(const char *s, smelt_numa *out) {
  for (unsigned i = 0; s && i < sizeof k_numa_names / sizeof k_numa_names[0]; i++)
    if (!strcmp(s, k_numa_names[i])) {
      *out = (smelt_numa)i;
      return SMELT_OK;
    }
  return sm_err(SMELT_ERR_INVALID, "--numa %s: expected none, distribute or isolate", s ? s : "(null)");
}

static const char *const k_kv_names[] = {"f16", "bf16", "f32", "q8_0", "q4_0"};
const char *smelt_kv_type_name(smelt_kv_type t) {
  return (unsigned)t < sizeof k_kv_names / sizeof k_kv_names[0] ? k_kv_names[t] : "?";
}
smelt_status smelt_kv_type_parse(const char *s, smelt_kv_type *out) {
  for (unsigned i = 0; s && i < sizeof k_kv_names / sizeof k_kv_names[0]; i++)
    if (!strcmp(s, k_kv_names[i])) {
      *out = (smelt_kv_type)i;
      return SMELT_OK;
    }
  return sm_err(SMELT_ERR_INVALID, "KV cache type '%s': expected f16, bf16, f32, q8_0 or q4_0", s ? s : "(null)");
}

/* the recipe's scalars: embedding scale, attention scale */
static void setup_scales(smelt_model *m) {
  const sm_config *c = &m->cfg;
  const sm_recipe *r = m->fam->recipe;
  m->embed_scale = 1.0f;
  /* Gemma: sqrt(hidden_size), a float32 scalar in a float32 model (transformers' normalizer) */
  if (r->embed_scale_sqrt) m->embed_scale = sqrtf((float)c->hidden_size);
  if (r->multipliers) m->embed_scale = c->embedding_multiplier;
  switch (r->attn_scale) {
    case SM_ATTN_SCALE_HEAD_DIM: m->attn_scale = 1.0f / sqrtf((float)c->head_dim); break;
    case SM_ATTN_SCALE_QPAS:
      m->attn_scale = 1.0f / sqrtf(c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : (float)c->head_dim);
      break;
    case SM_ATTN_SCALE_MULTIPLIER: m->attn_scale = c->attention_multiplier; break;
    case SM_ATTN_SCALE_ONE: m->attn_scale = 1.0f; break;
  }
}

smelt_status sm_model_load_on(const char *dir, const smelt_model_params *params, sm_backend *be, smelt_model **out) {
  return sm_model_load_rank(dir, params, be, NULL, out);
}

smelt_status sm_model_load_rank(const char *dir, const smelt_model_params *params, sm_backend *be, struct sm_tp *tp,
                                smelt_model **out) {
  smelt_model_params defp;
  if (!params) {
    smelt_model_params_default(&defp);
    params = &defp;
  }
  *out = NULL;
  smelt_model *m = sm_xcalloc(1, sizeof *m);
  m->be = be;
  m->tp = tp;
  m->dir = sm_xstrdup(dir ? dir : "(null)");
  smelt_status st;
  if (!dir || !sm_dir_exists(dir)) {
    st = sm_err(SMELT_ERR_IO, "model directory not found: %s", m->dir);
    goto fail;
  }
  if ((st = sm_family_config_load(dir, &m->cfg))) goto fail;
  m->fam = sm_family_runnable(m->cfg.model_type);
  if (!m->fam) {
    const sm_family *known = sm_family_find(m->cfg.model_type);
    if (known && known->notes)
      st = sm_err(SMELT_ERR_UNSUPPORTED, "%s: model family '%s' is %s", dir, m->cfg.model_type, known->notes);
    else
      st = sm_err(SMELT_ERR_UNSUPPORTED, "%s: unsupported model family '%s' (supported: %s)", dir, m->cfg.model_type,
                  sm_family_runnable_list());
    goto fail;
  }
  if (!be) {
    st = sm_err(SMELT_ERR_BACKEND, "no backend");
    goto fail;
  }
  if (sm_kv_dtype_of(params->kv_type) == SM_DT_COUNT) {
    st = sm_err(SMELT_ERR_INVALID, "KV cache type %d: expected f16, bf16, f32, q8_0 or q4_0", (int)params->kv_type);
    goto fail;
  }
  m->kv_dtype = sm_kv_dtype_of(params->kv_type);
  if (sm_kv_quantized(m->kv_dtype) && !be->kv_quant) {
    st = sm_err(SMELT_ERR_UNSUPPORTED, "KV type %s is not supported on %s yet (f16, bf16 and f32 are; or --device cpu)",
                smelt_kv_type_name(params->kv_type), be->name);
    goto fail;
  }
  if ((st = sm_st_open_opts(dir, params->no_mmap, &m->st))) goto fail;
  if ((st = sm_model_load_weights(m))) goto fail;
  m->max_context = params->max_context > 0 ? params->max_context : SM_MIN(m->cfg.max_position_embeddings, 8192);
  if (m->max_context <= 0) m->max_context = 2048;
  if ((st = sm_model_setup_rope(m))) goto fail;
  setup_scales(m);
  if (m->fam->recipe->v_norm) { /* the weight of the values' norm: ones */
    int hd = m->cfg.head_dim;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) hd = SM_MAX(hd, m->layers[l].spec.head_dim);
    float *h = sm_xmalloc(sizeof(float) * (size_t)hd);
    for (int i = 0; i < hd; i++) h[i] = 1.0f;
    m->ones = be->alloc(be, sizeof(float) * (size_t)hd);
    if (m->ones) {
      be->upload(be, m->ones, h, sizeof(float) * (size_t)hd);
      sm_model_own(m, m->ones);
    }
    free(h);
    if (!m->ones) {
      st = sm_err(SMELT_ERR_OOM, "out of backend memory");
      goto fail;
    }
  }
  char *tj = sm_path_join(dir, "tokenizer.json");
  if (sm_file_exists(tj) || sm_regular_or_absent(tj)) { /* a FIFO or device is an error, not "no tokenizer" */
    st = smelt_tokenizer_load(dir, &m->tok);
    if (st) {
      free(tj);
      goto fail;
    }
  }
  free(tj);
  if (m->vision) sm_vision_set_tokenizer(m->vision, m->tok);
  *out = m;
  return SMELT_OK;
fail : {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", sm_errmsg());
  m->tp = NULL; /* the caller's (tp.c) */
  smelt_model_free(m);
  return sm_err(st, "%s", msg);
}
}

smelt_status smelt_model_load(const char *dir, const smelt_model_params *params, smelt_model **out) {
  smelt_model_params defp;
  if (!params) {
    smelt_model_params_default(&defp);
    params = &defp;
  }
  *out = NULL;
  if (!dir || !sm_dir_exists(dir)) return sm_err(SMELT_ERR_IO, "model directory not found: %s", dir ? dir : "(null)");
  if (params->cpu_poll < 0 || params->cpu_poll > 100)
    return sm_err(SMELT_ERR_INVALID, "CPU poll level %d: expected 0..100", params->cpu_poll);
  if (params->tensor_parallel < 0 || params->tensor_parallel > SM_TP_MAX)
    return sm_err(SMELT_ERR_INVALID, "--tensor-parallel %d: expected 1..%d", params->tensor_parallel, SM_TP_MAX);
  if (params->pipeline_parallel < 0 || params->pipeline_parallel > SM_TP_MAX)
    return sm_err(SMELT_ERR_INVALID, "--pipeline-parallel %d: expected 1..%d", params->pipeline_parallel, SM_TP_MAX);
  if (params->tensor_parallel > 1 && params->pipeline_parallel > 1)
    return sm_err(SMELT_ERR_UNSUPPORTED, "--tensor-parallel %d with --pipeline-parallel %d: one or the other",
                  params->tensor_parallel, params->pipeline_parallel);
  if (params->tensor_parallel > 1 || params->pipeline_parallel > 1) return sm_tp_load(dir, params, out);
  sm_cpu_opts cpu = {.n_threads = params->n_threads,
                     .cpu_mask = params->cpu_mask,
                     .numa = params->numa,
                     .poll = params->cpu_poll};
  const sm_backend_opts bo = {.batch_invariant = params->deterministic};
  sm_backend *be = sm_backend_create_opts(params->device, 0, &cpu, &bo);
  if (!be) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", sm_errmsg());
    return sm_err(SMELT_ERR_BACKEND, "%s backend unavailable: %s",
                  params->device == SMELT_DEVICE_CUDA ? "CUDA" : "compute", msg);
  }
  return sm_model_load_on(dir, params, be, out);
}

void smelt_model_free(smelt_model *m) {
  if (!m) return;
  if (m->tp) sm_tp_free(m); /* rank 0: the other ranks end first */
  if (m->be) {
    sm_backend *be = m->be;
    sm_model_release_weights(m);
    float **scr[] = {&m->x,   &m->xb,   &m->xb2, &m->q,  &m->k,      &m->v,
                     &m->att, &m->gate, &m->up,  &m->xo, &m->logits, &m->agate};
    for (size_t i = 0; i < SM_ARRAY_LEN(scr); i++)
      if (*scr[i]) be->free(be, *scr[i]);
    for (int i = 0; i < SM_REC_SCRATCH; i++)
      if (m->rec[i]) be->free(be, m->rec[i]);
    if (m->rope_pos_dev) be->free(be, m->rope_pos_dev);
    if (m->tp_lg) be->free(be, m->tp_lg);
    if (m->tp_part) be->free(be, m->tp_part);
    if (m->pp_zero) be->free(be, m->pp_zero);
    if (m->tp_idx) be->free(be, m->tp_idx);
    if (m->ple) be->free(be, m->ple);
    if (m->ple_part) be->free(be, m->ple_part);
    if (m->ple_gate) be->free(be, m->ple_gate);
    if (m->ple_idx) be->free(be, m->ple_idx);
    be->destroy(be);
  }
  free(m->owned);
  free(m->host_owned);
  free(m->layers);
  if (m->tok) smelt_tokenizer_free(m->tok);
  if (m->st) sm_st_close(m->st);
  sm_config_free(&m->cfg);
  free(m->dir);
  free(m);
}

const smelt_tokenizer *smelt_model_tokenizer(const smelt_model *m) { return m->tok; }
int32_t smelt_model_vocab_size(const smelt_model *m) { return m->cfg.vocab_size; }
const char *smelt_model_arch(const smelt_model *m) { return m->cfg.model_type; }

static size_t weight_nbytes(const sm_weight *w) {
  if (!w->data) return 0;
  if (!w->bits) return (size_t)w->rows * (size_t)w->cols * sm_dtype_size(w->dtype);
  return (size_t)w->rows * (size_t)w->cols * (size_t)w->bits / 8 +
         2 * (size_t)w->rows * (size_t)(w->cols / w->group_size) * sm_dtype_size(w->dtype);
}

void smelt_model_get_info(const smelt_model *m, smelt_model_info *info) {
  const sm_config *c = &m->cfg;
  memset(info, 0, sizeof *info);
  info->arch = c->model_type;
  info->backend = m->be ? m->be->name : "";
  info->n_threads = m->be ? m->be->n_threads : 0;
  info->n_layers = c->num_hidden_layers;
  info->hidden = c->hidden_size;
  info->vocab = c->vocab_size;
  info->n_heads = m->tp ? m->tp->full_heads : c->num_attention_heads;
  info->n_kv_heads = m->tp ? m->tp->full_kv_heads : c->num_key_value_heads;
  info->tensor_parallel = sm_tp_sums(m) ? m->tp->n : 1;
  info->pipeline_parallel = sm_pp_stages(m) ? sm_pp_stages(m) : 1;
  info->head_dim = c->head_dim;
  info->max_context = m->max_context;
  info->kv_type = sm_kv_type_of(m->kv_dtype);
  info->weight_bytes = m->weight_bytes;
  /* a lookup table reads one row a token: the embedding (unless it is also the head), Gemma 4's per-layer table */
  size_t emb = (m->embed.data != m->lm_head.data ? weight_nbytes(&m->embed) : 0) +
               (m->ple_embed.data ? weight_nbytes(&m->ple_embed) : 0);
  info->decode_bytes = m->weight_bytes > emb ? m->weight_bytes - emb : m->weight_bytes;
  if (m->moe_expert_bytes && c->moe.n_experts > 0) /* a token reads top_k of n_experts experts */
    info->decode_bytes -= (size_t)((double)m->moe_expert_bytes * (1.0 - (double)c->moe.top_k / c->moe.n_experts));
  info->n_eos = c->n_eos;
  info->eos_ids = c->eos_ids;
  info->bos_id = c->bos_id;
  info->gen_temperature = c->gen_temperature;
  info->gen_top_p = c->gen_top_p;
  info->gen_top_k = c->gen_top_k;
  info->gen_do_sample = c->gen_do_sample;
  info->note = m->note;
}

double smelt_model_bandwidth(smelt_model *m) {
  const double bw = m->be && m->be->measure_bandwidth ? m->be->measure_bandwidth(m->be) : 0;
  /* tensor parallelism: each rank reads its shard from its own memory at once (the stages of a pipeline
   * read theirs one after another) */
  return sm_tp_sums(m) ? bw * m->tp->n : bw;
}

smelt_status sm_kv_alloc(smelt_model *m, int n_blocks, int block_size, int n_slots, sm_kv_cache *kv) {
  const sm_config *c = &m->cfg;
  memset(kv, 0, sizeof *kv);
  if (m->tp && m->tp->rank == 0) { /* the other ranks' copies first (they answer) */
    smelt_status st = sm_tp_kv_alloc(m, kv, n_blocks, block_size, n_slots);
    if (st) return st;
  }
  kv->n_layers = c->num_hidden_layers;
  kv->n_kv_heads = c->num_key_value_heads;
  kv->head_dim = c->head_dim;
  kv->block_size = block_size;
  kv->n_blocks = n_blocks;
  kv->dtype = m->kv_dtype;
  kv->k = sm_xcalloc((size_t)kv->n_layers, sizeof(void *));
  kv->v = sm_xcalloc((size_t)kv->n_layers, sizeof(void *));
  if (sm_family_varied_layers(m->fam, c)) { /* layers of their own shape (Gemma 4) */
    kv->layer_kv_heads = sm_xcalloc((size_t)kv->n_layers, sizeof(int));
    kv->layer_head_dim = sm_xcalloc((size_t)kv->n_layers, sizeof(int));
    for (int l = 0; l < kv->n_layers; l++) {
      kv->layer_kv_heads[l] = m->layers[l].spec.kv_heads;
      kv->layer_head_dim[l] = m->layers[l].spec.head_dim;
    }
  }
  size_t total = 0;
  for (int l = 0; l < kv->n_layers; l++) {
    if (c->layer_kind[l] != SM_LK_ATTN) continue; /* recurrent and MLP-only layers keep no KV */
    if (!sm_pp_holds(m, l)) continue;             /* a pipeline stage keeps the KV of its layers only */
    if (m->layers[l].spec.kv_src != l) continue;  /* it reads another layer's K/V */
    const size_t bytes = (size_t)n_blocks * block_size * sm_kv_row_bytes(kv, l);
    total += 2 * bytes;
    kv->k[l] = m->be->alloc(m->be, bytes);
    /* multi-head latent attention: a position's value is part of its key row (backend.h attention_mla) */
    kv->v[l] = m->fam->recipe->mla ? kv->k[l] : m->be->alloc(m->be, bytes);
    if (!kv->k[l] || !kv->v[l]) {
      sm_kv_free(m, kv);
      return sm_err(SMELT_ERR_OOM, "cannot allocate KV cache (more than %zu MiB)", total >> 20);
    }
  }
  if (c->rec.kind == SM_REC_NONE) return SMELT_OK;
  if (n_slots <= 0) {
    sm_kv_free(m, kv);
    return sm_err(SMELT_ERR_INVALID, "a hybrid model's cache needs state slots");
  }
  sm_config_rec_state(c, &kv->conv_floats, &kv->ssm_floats);
  kv->n_slots = n_slots;
  kv->conv = sm_xcalloc((size_t)kv->n_layers, sizeof(float *));
  kv->ssm = sm_xcalloc((size_t)kv->n_layers, sizeof(float *));
  for (int l = 0; l < kv->n_layers; l++) {
    if (c->layer_kind[l] != SM_LK_REC || !sm_pp_holds(m, l)) continue;
    kv->conv[l] = m->be->alloc(m->be, sizeof(float) * kv->conv_floats * (size_t)n_slots);
    if (kv->ssm_floats) kv->ssm[l] = m->be->alloc(m->be, sizeof(float) * kv->ssm_floats * (size_t)n_slots);
    if (!kv->conv[l] || (kv->ssm_floats && !kv->ssm[l])) {
      const size_t mib = sm_model_state_bytes(m) * (size_t)n_slots >> 20;
      sm_kv_free(m, kv);
      return sm_err(SMELT_ERR_OOM, "cannot allocate the recurrent state (%d sequences, %zu MiB)", n_slots, mib);
    }
  }
  return SMELT_OK;
}

size_t sm_model_state_bytes(const smelt_model *m) {
  size_t cf, sf;
  sm_config_rec_state(&m->cfg, &cf, &sf);
  int n_rec = 0;
  for (int l = 0; l < m->cfg.num_hidden_layers; l++) n_rec += m->cfg.layer_kind[l] == SM_LK_REC;
  return sizeof(float) * (cf + sf) * (size_t)n_rec;
}

void sm_kv_copy_state(smelt_model *m, const sm_kv_cache *kv, int dst, int src) {
  sm_backend *be = m->be;
  if (dst == src || dst < 0 || src < 0 || dst >= kv->n_slots || src >= kv->n_slots) return;
  if (m->tp && m->tp->rank == 0) sm_tp_kv_copy(m, kv, false, dst, src);
  for (int l = 0; l < kv->n_layers; l++) {
    if (kv->conv && kv->conv[l])
      be->copy(be, kv->conv[l] + (size_t)dst * kv->conv_floats, kv->conv[l] + (size_t)src * kv->conv_floats,
               sizeof(float) * kv->conv_floats);
    if (kv->ssm && kv->ssm[l])
      be->copy(be, kv->ssm[l] + (size_t)dst * kv->ssm_floats, kv->ssm[l] + (size_t)src * kv->ssm_floats,
               sizeof(float) * kv->ssm_floats);
  }
}

void sm_kv_copy_block(smelt_model *m, const sm_kv_cache *kv, int dst, int src) {
  sm_backend *be = m->be;
  if (dst < 0 || src < 0 || dst >= kv->n_blocks || src >= kv->n_blocks) return;
  if (m->tp && m->tp->rank == 0) sm_tp_kv_copy(m, kv, true, dst, src);
  for (int l = 0; l < kv->n_layers; l++) {
    if (!kv->k[l]) continue;
    const size_t bytes = (size_t)kv->block_size * sm_kv_row_bytes(kv, l);
    be->copy(be, (char *)kv->k[l] + (size_t)dst * bytes, (const char *)kv->k[l] + (size_t)src * bytes, bytes);
    if (kv->v[l] != kv->k[l]) /* multi-head latent attention: V is K's buffer */
      be->copy(be, (char *)kv->v[l] + (size_t)dst * bytes, (const char *)kv->v[l] + (size_t)src * bytes, bytes);
  }
}

void sm_kv_free(smelt_model *m, sm_kv_cache *kv) {
  if (m->tp && m->tp->rank == 0 && kv->tp_id) sm_tp_kv_free(m, kv);
  for (int l = 0; l < kv->n_layers; l++) {
    if (kv->k && kv->k[l]) m->be->free(m->be, kv->k[l]);
    if (kv->v && kv->v[l] && (!kv->k || kv->v[l] != kv->k[l])) m->be->free(m->be, kv->v[l]);
    if (kv->conv && kv->conv[l]) m->be->free(m->be, kv->conv[l]);
    if (kv->ssm && kv->ssm[l]) m->be->free(m->be, kv->ssm[l]);
  }
  free(kv->k);
  free(kv->v);
  free(kv->conv);
  free(kv->ssm);
  free(kv->layer_kv_heads);
  free(kv->layer_head_dim);
  memset(kv, 0, sizeof *kv);
}
