/* Multi-head latent attention (src/model/mla.c) against a straightforward reference: synthetic one-layer
 * DeepSeek-V3 checkpoints (bf16 and 4-bit; embed_q / unembed_out and the older kv_b_proj; q_lora_rank and a
 * plain q_proj) run through smelt on the CPU and through the non-absorbed attention of the Hugging Face model
 * written here in double precision from the checkpoint's tensors: keys k_nope = W_UK c and values W_UV c per
 * head, interleaved RoPE on the rope dims, softmax over q_nope . k_nope + q_pe . k_pe. The reference with the
 * RoPE taken out must disagree (the test sees the positions). Then the engine: decoding token by token over
 * small KV blocks, a prefix-cache hit and a prompt cache file give the logits of the whole-sequence forward; `smelt inspect`'s
 * estimate counts the latent once a position. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include "engine/engine.h"
#include "engine/prompt_cache.h"
#include "model/model.h"
#include "store/store.h"
#include "../test_util.h"

enum { HID = 64, NH = 4, DC = 64, QR = 64, DR = 16, DN = 32, DV = 32, FF = 128, VOC = 300, NT = 12 };

static sm_weight wt(const sm_st *st, const char *prefix, int64_t n_stack, int64_t rows, int64_t cols) {
  char n[256];
  sm_weight w;
  memset(&w, 0, sizeof w);
  w.rows = (n_stack ? n_stack : 1) * rows;
  w.cols = cols;
  snprintf(n, sizeof n, "%s.weight", prefix);
  const sm_tensor *t = sm_st_find(st, n);
  if (!t) {
    fprintf(stderr, "reference: no %s\n", n);
    exit(1);
  }
  w.data = t->data;
  snprintf(n, sizeof n, "%s.scales", prefix);
  const sm_tensor *s = sm_st_find(st, n);
  if (!s) {
    w.dtype = t->dtype;
    return w;
  }
  snprintf(n, sizeof n, "%s.biases", prefix);
  const sm_tensor *b = sm_st_find(st, n);
  w.bits = (int)(t->shape[t->ndim - 1] * 32 / cols);
  w.group_size = (int)(cols / s->shape[s->ndim - 1]);
  w.dtype = s->dtype;
  w.scales = s->data;
  w.biases = b->data;
  return w;
}

/* y[rows] = W x (double) */
static void mv(const sm_weight *w, int64_t r0, int64_t rows, const double *x, double *y) {
  float *row = malloc(sizeof(float) * (size_t)w->cols);
  for (int64_t r = 0; r < rows; r++) {
    sm_weight_row_f32(w, r0 + r, row);
    double a = 0;
    for (int64_t j = 0; j < w->cols; j++) a += (double)row[j] * x[j];
    y[r] = a;
  }
  free(row);
}
static void vec(const sm_st *st, const char *name, int n, double *out) {
  sm_weight w = {.rows = 1, .cols = n};
  const sm_tensor *t = sm_st_find(st, name);
  w.data = t->data;
  w.dtype = t->dtype;
  float f[512];
  sm_weight_row_f32(&w, 0, f);
  for (int i = 0; i < n; i++) out[i] = f[i];
}
static void rmsnorm(double *x, const double *w, int n, double eps) {
  double s = 0;
  for (int i = 0; i < n; i++) s += x[i] * x[i];
  const double r = 1.0 / sqrt(s / n + eps);
  for (int i = 0; i < n; i++) x[i] = x[i] * r * w[i];
}
/* interleaved RoPE (pairs 2i, 2i + 1), theta 500000 (the synthetic config's) */
static void rope(double *x, int pos) {
  for (int i = 0; i < DR / 2; i++) {
    const double f = pos * pow(500000.0, -(double)(2 * i) / DR), c = cos(f), s = sin(f);
    const double a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

/* logits [NT][VOC] of tokens by the reference; positions: false gives every token position 0 */
static void reference(const char *dir, const int32_t *tok, bool q_lora, bool kv_b, bool positions, float *logits) {
  sm_st *st = NULL;
  if (sm_st_open(dir, &st)) {
    fprintf(stderr, "reference: %s\n", smelt_last_error());
    exit(1);
  }
  const char *p = "model.layers.0";
  char n[256];
  sm_weight emb = wt(st, "model.embed_tokens", 0, VOC, HID), head = wt(st, "lm_head", 0, VOC, HID);
  snprintf(n, sizeof n, "%s.self_attn.%s", p, q_lora ? "q_b_proj" : "q_proj");
  sm_weight qb = wt(st, n, 0, NH * (DN + DR), q_lora ? QR : HID), qa = {0};
  if (q_lora) {
    snprintf(n, sizeof n, "%s.self_attn.q_a_proj", p);
    qa = wt(st, n, 0, QR, HID);
  }
  snprintf(n, sizeof n, "%s.self_attn.kv_a_proj_with_mqa", p);
  sm_weight kva = wt(st, n, 0, DC + DR, HID), uk = {0}, uv = {0}, kvb = {0};
  if (kv_b) {
    snprintf(n, sizeof n, "%s.self_attn.kv_b_proj", p);
    kvb = wt(st, n, 0, NH * (DN + DV), DC);
  } else {
    snprintf(n, sizeof n, "%s.self_attn.embed_q", p);
    uk = wt(st, n, NH, DC, DN);
    snprintf(n, sizeof n, "%s.self_attn.unembed_out", p);
    uv = wt(st, n, NH, DV, DC);
  }
  snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
  sm_weight wo = wt(st, n, 0, HID, NH * DV);
  snprintf(n, sizeof n, "%s.mlp.gate_proj", p);
  sm_weight wg = wt(st, n, 0, FF, HID);
  snprintf(n, sizeof n, "%s.mlp.up_proj", p);
  sm_weight wu = wt(st, n, 0, FF, HID);
  snprintf(n, sizeof n, "%s.mlp.down_proj", p);
  sm_weight wd = wt(st, n, 0, HID, FF);
  double n1w[HID], n2w[HID], fnw[HID], qaw[QR], kvw[DC];
  snprintf(n, sizeof n, "%s.input_layernorm.weight", p);
  vec(st, n, HID, n1w);
  snprintf(n, sizeof n, "%s.post_attention_layernorm.weight", p);
  vec(st, n, HID, n2w);
  vec(st, "model.norm.weight", HID, fnw);
  if (q_lora) {
    snprintf(n, sizeof n, "%s.self_attn.q_a_layernorm.weight", p);
    vec(st, n, QR, qaw);
  }
  snprintf(n, sizeof n, "%s.self_attn.kv_a_layernorm.weight", p);
  vec(st, n, DC, kvw);
  static double x[NT][HID], q[NT][NH][DN + DR], kn[NT][NH][DN], kp[NT][DR], v[NT][NH][DV];
  for (int t = 0; t < NT; t++) {
    float e[HID];
    sm_weight_row_f32(&emb, tok[t], e);
    double h[HID], qin[QR > HID ? QR : HID], kv[DC + DR];
    for (int i = 0; i < HID; i++) h[i] = x[t][i] = e[i];
    rmsnorm(h, n1w, HID, 1e-5);
    if (q_lora) {
      mv(&qa, 0, QR, h, qin);
      rmsnorm(qin, qaw, QR, 1e-6);
    } else {
      memcpy(qin, h, sizeof h);
    }
    mv(&qb, 0, NH * (DN + DR), qin, &q[t][0][0]);
    mv(&kva, 0, DC + DR, h, kv);
    rmsnorm(kv, kvw, DC, 1e-6);
    memcpy(kp[t], kv + DC, sizeof kp[t]);
    const int pos = positions ? t : 0;
    rope(kp[t], pos);
    for (int hh = 0; hh < NH; hh++) {
      rope(q[t][hh] + DN, pos);
      for (int j = 0; j < DN; j++) { /* k_nope: row j of the head's key rows . c */
        double a = 0;
        float row[DC > DN ? DC : DN];
        if (kv_b) {
          sm_weight_row_f32(&kvb, (int64_t)hh * (DN + DV) + j, row);
          for (int r = 0; r < DC; r++) a += (double)row[r] * kv[r];
        } else {
          for (int r = 0; r < DC; r++) {
            sm_weight_row_f32(&uk, (int64_t)hh * DC + r, row);
            a += (double)row[j] * kv[r];
          }
        }
        kn[t][hh][j] = a;
      }
      if (kv_b) mv(&kvb, (int64_t)hh * (DN + DV) + DN, DV, kv, v[t][hh]);
      else mv(&uv, (int64_t)hh * DV, DV, kv, v[t][hh]);
    }
  }
  const double scale = 1.0 / sqrt((double)(DN + DR));
  for (int t = 0; t < NT; t++) {
    double o[NH * DV] = {0}, a[HID], h[HID], g[FF], u[FF], d[HID];
    for (int hh = 0; hh < NH; hh++) {
      double s[NT], mx = -1e300, z = 0;
      for (int j = 0; j <= t; j++) {
        double dot = 0;
        for (int i = 0; i < DN; i++) dot += q[t][hh][i] * kn[j][hh][i];
        for (int i = 0; i < DR; i++) dot += q[t][hh][DN + i] * kp[j][i];
        s[j] = dot * scale;
        if (s[j] > mx) mx = s[j];
      }
      for (int j = 0; j <= t; j++) z += s[j] = exp(s[j] - mx);
      for (int j = 0; j <= t; j++)
        for (int e = 0; e < DV; e++) o[hh * DV + e] += s[j] / z * v[j][hh][e];
    }
    mv(&wo, 0, HID, o, a);
    for (int i = 0; i < HID; i++) h[i] = x[t][i] += a[i];
    rmsnorm(h, n2w, HID, 1e-5);
    mv(&wg, 0, FF, h, g);
    mv(&wu, 0, FF, h, u);
    for (int i = 0; i < FF; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    mv(&wd, 0, HID, g, d);
    for (int i = 0; i < HID; i++) h[i] = x[t][i] + d[i];
    rmsnorm(h, fnw, HID, 1e-5);
    double lg[VOC];
    mv(&head, 0, VOC, h, lg);
    for (int i = 0; i < VOC; i++) logits[(size_t)t * VOC + i] = (float)lg[i];
  }
  sm_st_close(st);
}

static void run(const char *root, int bits, const char *extra, bool q_lora, bool kv_b) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/ds-%d-%d-%d", root, bits, q_lora, kv_b);
  sm_synth_shape sh = {"mla", HID, 1, NH, NH, FF, VOC, false, "deepseek_v3", 16, extra};
  CHECK(sm_make_synthetic(&sh, bits, 32, dir, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  int32_t tok[NT];
  for (int i = 0; i < NT; i++) tok[i] = (int32_t)((i * 53 + 7) % VOC);
  float *ref = malloc(sizeof(float) * NT * VOC), *ref0 = malloc(sizeof(float) * NT * VOC);
  reference(dir, tok, q_lora, kv_b, true, ref);
  reference(dir, tok, q_lora, kv_b, false, ref0);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  mp.n_threads = 2;
  mp.max_context = 64;
  mp.kv_type = SMELT_KV_F32;
  smelt_model *m = NULL;
  CHECK(smelt_model_load(dir, &mp, &m) == SMELT_OK, "%s: load: %s", dir, smelt_last_error());
  if (!m) goto out;
  float *lg = NULL;
  CHECK(smelt_eval_logits(m, tok, NT, &lg) == SMELT_OK, "eval: %s", smelt_last_error());
  if (lg) {
    const double e = t_max_rel(lg, ref, NT * VOC, 1e-3), e0 = t_max_rel(lg, ref0, NT * VOC, 1e-3);
    printf("%s: max rel error %.2e (reference without positions: %.2e)\n", dir, e, e0);
    CHECK(e < 1e-5, "%s: logits differ from the reference by %.3g", dir, e);
    CHECK(e0 > 1e-4, "%s: the reference without RoPE agrees too (%.3g): the test is blind", dir, e0);
  }
  /* the engine: token-by-token decode over 4-token blocks, then the same prompt again from the prefix cache */
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = 64;
  ep.block_size = 4;
  ep.prefix_cache = true;
  sm_engine *en = NULL;
  CHECK(sm_engine_create(m, &ep, &en) == SMELT_OK, "engine: %s", smelt_last_error());
  float *step = malloc(sizeof(float) * VOC);
  for (int pass = 0; en && lg && pass < 2; pass++) {
    sm_seq *s = sm_seq_new(en);
    double worst = 0;
    if (pass == 0) {
      for (int t = 0; t < NT; t++) {
        sm_seq_append(en, s, tok + t, 1);
        uint8_t done = 0;
        while (!done) CHECK(sm_engine_step(en, &s, 1, step, &done) == SMELT_OK, "step: %s", smelt_last_error());
        const double e = t_max_rel(step, lg + (size_t)t * VOC, VOC, 1e-3);
        if (e > worst) worst = e;
      }
    } else {
      sm_seq_append(en, s, tok, NT);
      const int hit = sm_seq_use_prefix_cache(en, s);
      CHECK(hit >= 8, "prefix cache: %d tokens reused of %d", hit, NT);
      uint8_t done = 0;
      while (!done) CHECK(sm_engine_step(en, &s, 1, step, &done) == SMELT_OK, "step: %s", smelt_last_error());
      worst = t_max_rel(step, lg + (size_t)(NT - 1) * VOC, VOC, 1e-3);
    }
    CHECK(worst < 1e-4, "%s: %s logits differ from the whole-sequence forward by %.3g", dir,
          pass ? "prefix-cache" : "decode", worst);
    if (pass == 1) { /* a prompt cache file of the first NT - 1 tokens, restored into a new sequence */
      char path[600];
      snprintf(path, sizeof path, "%s/prompt.cache", dir);
      CHECK(sm_prompt_cache_save(en, s, NT - 1, path) == SMELT_OK, "prompt cache save: %s", smelt_last_error());
      sm_prompt_cache *pc = NULL;
      CHECK(sm_prompt_cache_open(path, m, &pc) == SMELT_OK, "prompt cache open: %s", smelt_last_error());
      sm_seq *r = sm_seq_new(en);
      if (pc) CHECK(sm_prompt_cache_restore(pc, en, r, NT - 1) == SMELT_OK, "restore: %s", smelt_last_error());
      sm_seq_append(en, r, tok + NT - 1, 1);
      uint8_t done = 0;
      while (!done) CHECK(sm_engine_step(en, &r, 1, step, &done) == SMELT_OK, "step: %s", smelt_last_error());
      const double e = t_max_rel(step, lg + (size_t)(NT - 1) * VOC, VOC, 1e-3);
      CHECK(e < 1e-4, "%s: logits after a prompt cache file differ by %.3g", dir, e);
      sm_prompt_cache_close(pc);
      sm_seq_free(en, r);
    }
    sm_seq_free(en, s);
  }
  free(step);
  sm_engine_free(en);
  free(lg);
  smelt_model_free(m);
  /* an f16 latent cache: close to the reference */
  mp.kv_type = SMELT_KV_F16;
  m = NULL;
  CHECK(smelt_model_load(dir, &mp, &m) == SMELT_OK, "load f16: %s", smelt_last_error());
  lg = NULL;
  if (m) CHECK(smelt_eval_logits(m, tok, NT, &lg) == SMELT_OK, "eval f16: %s", smelt_last_error());
  if (lg) CHECK(t_max_rel(lg, ref, NT * VOC, 1e-3) < 5e-3, "%s: f16 cache logits off", dir);
  free(lg);
  smelt_model_free(m);
  /* quantized caches are refused with a clear error */
  mp.kv_type = SMELT_KV_Q8_0;
  m = NULL;
  CHECK(smelt_model_load(dir, &mp, &m) != SMELT_OK && strstr(smelt_last_error(), "latent"), "q8_0 KV cache for MLA: %s",
        m ? "loaded" : smelt_last_error());
  smelt_model_free(m);
  /* the memory estimate: one latent row (K only) a position a layer */
  sm_mem_estimate est;
  CHECK(sm_store_estimate(dir, 100, SMELT_KV_F16, false, &est) == SMELT_OK, "estimate: %s", smelt_last_error());
  CHECK(est.kv_bytes_per_token == (uint64_t)(DC + DR) * 2, "estimate: %llu KV bytes a token, want %d",
        (unsigned long long)est.kv_bytes_per_token, (DC + DR) * 2);
out:
  free(ref);
  free(ref0);
}

int main(void) {
  char root[] = "/tmp/smelt-mla-XXXXXX";
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  /* one layer, dense (first_k_dense_replace 1), the default RoPE: what the reference computes */
  const char *base = "{\"rope_scaling\": null}";
  run(root, 0, base, true, false);
  run(root, 4, base, true, false);
  run(root, 0, "{\"rope_scaling\": null, \"smelt_mla_kv_b\": true}", true, true);
  run(root, 4, "{\"rope_scaling\": null, \"smelt_mla_kv_b\": true}", true, true);
  run(root, 4, "{\"rope_scaling\": null, \"q_lora_rank\": null}", false, false);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd)) fprintf(stderr, "warning: could not remove %s\n", root);
  TEST_END();
}
