/* Memory estimate of a model directory: weights (safetensors headers), KV cache,
 * runtime headroom, and a fits / does-not-fit verdict against available memory. */
#include "store/store.h"
#include "backend/kv_quant.h"
#include "model/family.h"
#include "model/tp.h"
#include "store/store_internal.h"
#include "format/config.h"
#include "format/safetensors.h"
#include "vision/vision.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sm_device_mem_fn g_dev_mem;
void sm_store_set_device_mem_query(sm_device_mem_fn fn) { g_dev_mem = fn; }

bool sm_store_host_mem_available(uint64_t *bytes) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return false;
  char line[256];
  bool ok = false;
  while (fgets(line, sizeof line, f)) {
    unsigned long long kb;
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
      *bytes = (uint64_t)kb * 1024;
      ok = true;
      break;
    }
  }
  fclose(f);
  return ok;
}

/* "123", "16G", "512M", "2.5GiB" -> bytes */
bool sm_store_parse_size(const char *s, uint64_t *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0) || v > 1e18) return false; /* also nan and inf */
  double m = 1;
  switch (*end) {
    case 0: break;
    case 'k':
    case 'K':
      m = 1024.0;
      end++;
      break;
    case 'm':
    case 'M':
      m = 1048576.0;
      end++;
      break;
    case 'g':
    case 'G':
      m = 1073741824.0;
      end++;
      break;
    case 't':
    case 'T':
      m = 1099511627776.0;
      end++;
      break;
    default: return false;
  }
  if (*end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return false;
  if (v * m > 1.8e19) return false;
  *out = (uint64_t)(v * m);
  return true;
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* name with its last ".suffix" replaced by suf (buf of n bytes); false if it does not fit */
static bool swap_suffix(const char *name, const char *old, const char *suf, char *buf, size_t n) {
  size_t l = strlen(name), o = strlen(old);
  if (l < o || l - o + strlen(suf) + 1 > n) return false;
  memcpy(buf, name, l - o);
  strcpy(buf + l - o, suf);
  return true;
}

static int count_rec_layers(const sm_config *c) {
  int n = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) n += c->layer_kind[l] == SM_LK_REC;
  return n;
}

smelt_status sm_store_estimate(const char *model_dir, int max_tokens, smelt_kv_type kv_type, bool cuda,
                               sm_mem_estimate *out) {
  memset(out, 0, sizeof *out);
  if (!model_dir) return sm_err(SMELT_ERR_INVALID, "no model directory");
  const sm_dtype kv_dt = sm_kv_dtype_of(kv_type);
  if (kv_dt == SM_DT_COUNT) return sm_err(SMELT_ERR_INVALID, "bad KV cache type %d", (int)kv_type);
  sm_config cfg;
  smelt_status s = sm_family_config_load(model_dir, &cfg);
  if (s) return s;
  snprintf(out->arch, sizeof out->arch, "%s", cfg.model_type);
  out->n_layers = cfg.num_hidden_layers;
  out->n_heads = cfg.num_attention_heads;
  out->n_kv_heads = cfg.num_key_value_heads > 0 ? cfg.num_key_value_heads : cfg.num_attention_heads;
  out->head_dim = cfg.head_dim > 0 ? cfg.head_dim
                                   : (cfg.num_attention_heads > 0 ? cfg.hidden_size / cfg.num_attention_heads : 0);
  out->hidden = cfg.hidden_size;
  out->intermediate = cfg.intermediate_size;
  out->vocab = cfg.vocab_size;
  out->max_pos = cfg.max_position_embeddings;
  out->attn_layers = sm_config_attn_layers(&cfg);
  if (cfg.rec.kind != SM_REC_NONE) { /* the recurrent layers' state (engine.c: a sequence, its snapshot, one spare) */
    size_t cf, sf;
    sm_config_rec_state(&cfg, &cf, &sf);
    out->state_bytes = 4ull * (cf + sf) * (uint64_t)count_rec_layers(&cfg);
    out->state_slots = 3;
  }
  out->quant_bits = cfg.q_bits;
  out->quant_group = cfg.q_group_size;
  out->quant_mode = cfg.q_mode;
  if (out->n_layers <= 0 || out->n_heads <= 0 || out->head_dim <= 0 || out->n_layers > 100000 ||
      out->n_kv_heads > 100000 || out->head_dim > 100000) {
    sm_config_free(&cfg);
    return sm_err(SMELT_ERR_FORMAT,
                  "%s/config.json: missing or bad num_hidden_layers / num_attention_heads / "
                  "head_dim",
                  model_dir);
  }

  sm_st *st = NULL;
  s = sm_st_open(model_dir, &st);
  if (s) {
    sm_config_free(&cfg);
    return s;
  }
  out->n_tensors = sm_st_count(st);
  out->weights_bytes = sm_st_total_bytes(st);
  /* mixtures of experts: the stacked routed experts' tensors ("<layer>.<experts>.<proj>.*") */
  const sm_family *fam = sm_family_find(cfg.model_type);
  char ex[96] = "";
  if (fam && fam->moe && cfg.moe.n_experts > 0) {
    out->n_experts = cfg.moe.n_experts;
    out->top_k = cfg.moe.top_k;
    snprintf(ex, sizeof ex, ".%s.", fam->moe->experts);
  }
  char buf[1024], emb[160] = "", lmh[160] = "", ple[160] = "";
  if (fam && fam->names) {
    snprintf(emb, sizeof emb, "%s%s.", fam->names->root, fam->names->embed);
    snprintf(lmh, sizeof lmh, "%s.", fam->names->lm_head);
    if (fam->names->ple_embed) snprintf(ple, sizeof ple, "%s%s.", fam->names->root, fam->names->ple_embed);
  }
  uint64_t ple_bytes = 0; /* Gemma 4's per-layer table: a token reads one row of it */
  for (size_t i = 0; i < out->n_tensors; i++) {
    const sm_tensor *t = sm_st_at(st, i);
    const bool vision = sm_vision_tensor(t->name);
    if (emb[0] && !vision && strstr(t->name, emb)) out->embed_bytes += t->nbytes;
    if (lmh[0] && !vision && strstr(t->name, lmh)) out->lm_head_bytes += t->nbytes;
    if (ple[0] && !vision && strstr(t->name, ple)) ple_bytes += t->nbytes;
    if (vision) {
      out->vision_bytes += t->nbytes;
      out->n_vision_tensors++;
    }
    uint64_t numel = 1, params = 0;
    for (int d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
    const bool expert = ex[0] && strstr(t->name, ex);
    if (expert) out->expert_bytes += t->nbytes;
    /* quantization side tables: not parameters */
    if ((ends_with(t->name, ".scales") && swap_suffix(t->name, ".scales", ".weight", buf, sizeof buf)) ||
        (ends_with(t->name, ".biases") && swap_suffix(t->name, ".biases", ".weight", buf, sizeof buf))) {
      const sm_tensor *w = sm_st_find(st, buf);
      if (w && w->dtype == SM_DT_U32) continue;
    }
    params = numel;
    if (t->dtype == SM_DT_U32 && ends_with(t->name, ".weight") &&
        swap_suffix(t->name, ".weight", ".scales", buf, sizeof buf) && sm_st_find(st, buf)) {
      int bits = 0, gs = 0;
      sm_config_quant_for(&cfg, t->name, &bits, &gs);
      if (bits <= 0) bits = cfg.q_bits;
      if (bits > 0 && bits <= 32) params = numel * 32 / (uint64_t)bits;
    }
    out->n_params += params;
    if (expert) out->expert_params += params;
    if (vision) out->vision_params += params;
  }
  /* a token runs top_k of the n_experts experts of each MoE layer */
  out->n_active_params = out->n_params;
  out->active_bytes = out->weights_bytes > ple_bytes ? out->weights_bytes - ple_bytes : out->weights_bytes;
  if (out->n_experts > 0) {
    const double unused = 1.0 - (double)out->top_k / out->n_experts;
    out->n_active_params -= (uint64_t)((double)out->expert_params * unused);
    out->active_bytes -= (uint64_t)((double)out->expert_bytes * unused);
  }
  sm_st_close(st);

  int n = max_tokens;
  if (n <= 0) n = out->max_pos > 0 ? SM_MIN(out->max_pos, 8192) : 4096;
  out->max_tokens = n;
  out->kv_type = kv_type;
  /* what sm_kv_alloc allocates a position (multi-head latent attention: K only, its rows hold the values) */
  out->kv_bytes_per_token = (cfg.mla.kv_rank > 0 ? 1ull : 2ull) * (uint64_t)out->attn_layers *
                            (uint64_t)out->n_kv_heads * (uint64_t)sm_kv_head_bytes(kv_dt, out->head_dim);
  if (fam && fam->recipe && sm_family_varied_layers(fam, &cfg)) { /* layers of their own K/V shape, or none (Gemma 4) */
    out->kv_bytes_per_token = 0;
    for (int l = 0; l < cfg.num_hidden_layers; l++) {
      sm_layer_spec sp;
      sm_family_layer_spec(fam, &cfg, l, &sp);
      if (sp.kind == SM_LK_ATTN && sp.kv_src == l)
        out->kv_bytes_per_token += 2ull * (uint64_t)sp.kv_heads * (uint64_t)sm_kv_head_bytes(kv_dt, sp.head_dim);
    }
  }
  out->kv_bytes = out->kv_bytes_per_token * (uint64_t)n;
  /* scratch activations (float32) for a prefill chunk of T = min(N, 512) rows: x, xb, xb2, xo (hidden),
   * q (heads*hd), k, v (kv_heads*hd), gate, up (intermediate), attention scores (heads * N);
   * plus one row of logits (vocab). */
  uint64_t T = (uint64_t)SM_MIN(n, 512);
  uint64_t row = 4ull * (uint64_t)out->hidden + (uint64_t)out->n_heads * (uint64_t)out->head_dim +
                 2ull * (uint64_t)out->n_kv_heads * (uint64_t)out->head_dim + 2ull * (uint64_t)out->intermediate +
                 (uint64_t)out->n_heads * (uint64_t)n;
  /* a mixture layer's (src/model/moe.c): router logits, k ids and weights, k experts' gate, up and output
   * rows, the shared expert's gate, up and output; and twice the k experts' rows of x and outputs that the
   * CUDA backend's grouped GEMMs gather */
  if (out->n_experts > 0) {
    const uint64_t k = (uint64_t)out->top_k, Fe = (uint64_t)cfg.moe.expert_inter, Fs = (uint64_t)cfg.moe.shared_inter;
    const uint64_t H = (uint64_t)out->hidden;
    row += (uint64_t)out->n_experts + 2 * k + 2 * k * Fe + k * H + 2 * Fs + H + 1 + (cuda ? k * (H + Fe) + k : 0);
  }
  out->activation_bytes = 4ull * (T * row + (uint64_t)out->vocab);
  sm_config_free(&cfg);
  out->runtime_bytes = out->activation_bytes + (out->weights_bytes + out->kv_bytes) / 10;
  out->total_bytes = out->weights_bytes + out->kv_bytes + out->runtime_bytes +
                     out->state_bytes * (uint64_t)out->state_slots;

  out->cuda = cuda;
  const char *ov = sm_store_settings_get()->available_memory;
  uint64_t avail = 0;
  if (ov) {
    if (!sm_store_parse_size(ov, &avail)) return sm_err(SMELT_ERR_INVALID, "bad SMELT_AVAILABLE_MEMORY '%s'", ov);
    out->available_known = true;
  } else if (cuda) {
    uint64_t total = 0;
    if (g_dev_mem && g_dev_mem(&avail, &total) == SMELT_OK) out->available_known = true;
    sm_err_clear();
  } else {
    out->available_known = sm_store_host_mem_available(&avail);
  }
  out->available_bytes = out->available_known ? avail : 0;
  out->fits = !out->available_known || out->total_bytes <= out->available_bytes;
  return SMELT_OK;
}

smelt_status sm_store_check_fits(const char *model_dir, int max_tokens, smelt_kv_type kv_type, bool cuda, bool force,
                                 bool verbose) {
  sm_mem_estimate e;
  smelt_status s = sm_store_estimate(model_dir, max_tokens, kv_type, cuda, &e);
  if (s) return s;
  char t[32], a[32], w[32], k[32];
  sm_store_fmt_bytes(e.total_bytes, t, sizeof t);
  sm_store_fmt_bytes(e.available_bytes, a, sizeof a);
  sm_store_fmt_bytes(e.weights_bytes, w, sizeof w);
  sm_store_fmt_bytes(e.kv_bytes, k, sizeof k);
  if (verbose || !e.fits)
    fprintf(stderr, "memory estimate: %s (weights %s + KV %s for %d tokens + runtime) of %s %s: %s\n", t, w, k,
            e.max_tokens, e.available_known ? a : "unknown", cuda ? "free device memory" : "available",
            !e.available_known ? "UNKNOWN" : (e.fits ? "FITS" : "DOES NOT FIT"));
  if (!e.fits && !force)
    return sm_err(SMELT_ERR_LIMIT,
                  "model needs about %s but only %s is available (lower --max-tokens / use a "
                  "smaller KV dtype or a more quantized model, or pass --force)",
                  t, a);
  return SMELT_OK;
}

bool sm_store_has_device_mem_query(void) { return g_dev_mem != NULL; }

smelt_status sm_store_estimate_stages(const char *model_dir, int pp, sm_mem_estimate *e) {
  if (pp < 2 || pp > 16) return sm_err(SMELT_ERR_INVALID, "--pipeline-parallel %d: expected 2..16", pp);
  e->tp = pp;
  e->split_error[0] = 0;
  const int L = e->n_layers;
  int first[SM_TP_MAX + 1];
  if (sm_pp_plan(L, pp, NULL, first)) { /* (the model's layers, fewer than the stages) */
    snprintf(e->split_error, sizeof e->split_error, "%s", sm_errmsg());
    return SMELT_OK;
  }
  const bool tied = !e->lm_head_bytes;
  const uint64_t whole = e->embed_bytes + e->vision_bytes + (tied ? 0 : e->lm_head_bytes),
                 layers = e->weights_bytes - whole;
  e->rank_weights_bytes = e->rank_kv_bytes = e->rank_total_bytes = 0;
  for (int r = 0; r < pp; r++) { /* the largest stage (sm_pp_plan's split) */
    const uint64_t nl = (uint64_t)(first[r + 1] - first[r]);
    const uint64_t w = layers / (uint64_t)L * nl + (r == 0 ? whole : 0), kv = e->kv_bytes / (uint64_t)L * nl,
                   st = e->state_bytes * (uint64_t)e->state_slots / (uint64_t)L * nl;
    const uint64_t t = w + kv + e->activation_bytes + (w + kv) / 10 + st;
    if (t > e->rank_total_bytes) {
      e->rank_weights_bytes = w;
      e->rank_kv_bytes = kv;
      e->rank_total_bytes = t;
    }
  }
  e->fits = !e->available_known || e->rank_total_bytes <= e->available_bytes;
  return SMELT_OK;
}

smelt_status sm_store_estimate_split(const char *model_dir, int tp, sm_mem_estimate *e) {
  if (tp < 2 || tp > 16) return sm_err(SMELT_ERR_INVALID, "--tensor-parallel %d: expected 2..16", tp);
  sm_config cfg;
  smelt_status s = sm_family_config_load(model_dir, &cfg);
  if (s) return s;
  e->tp = tp;
  e->split_error[0] = 0;
  sm_tp_split_problem(&cfg, sm_family_find(cfg.model_type), tp, e->split_error, sizeof e->split_error);
  const bool tied = cfg.tie_word_embeddings || !e->lm_head_bytes, vocab_split = cfg.vocab_size % tp == 0;
  sm_config_free(&cfg);
  /* rank 0, the largest: the embedding and a vision tower whole, the layers' weights split; the LM head split by
   * vocabulary rows (a tied one: a copy of the rank's rows of the embedding), or whole on rank 0 */
  const uint64_t whole = e->embed_bytes + e->vision_bytes, lm = tied ? 0 : e->lm_head_bytes,
                 layers = e->weights_bytes - whole - lm;
  e->rank_weights_bytes = whole + layers / (uint64_t)tp;
  if (tied) e->rank_weights_bytes += vocab_split ? e->embed_bytes / (uint64_t)tp : 0;
  else e->rank_weights_bytes += vocab_split ? lm / (uint64_t)tp : lm;
  const int kv_rank = e->n_kv_heads >= tp ? e->n_kv_heads / tp : 1;
  e->rank_kv_bytes = e->kv_bytes / (uint64_t)e->n_kv_heads * (uint64_t)kv_rank;
  e->rank_total_bytes = e->rank_weights_bytes + e->rank_kv_bytes + e->activation_bytes +
                        (e->rank_weights_bytes + e->rank_kv_bytes) / 10 + e->state_bytes * (uint64_t)e->state_slots;
  e->fits = !e->available_known || e->rank_total_bytes <= e->available_bytes;
  return SMELT_OK;
}
