/* The family registry as the loader applies it: every runnable family loads a synthetic checkpoint of
 * its layout and gives finite logits that change with the input; vision-language packagings run their
 * text model, skip the vision tensors deliberately and say so, while any other tensor a recipe does
 * not read still fails the load by name; a known but non-runnable family says why; a model whose
 * RoPE has rows per position refuses positions past its table. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include "engine/engine.h"
#include "format/st_write.h"
#include "model/model.h"
#include "../test_util.h"

static char g_root[64];

static smelt_model *load(const char *dir, int max_context, smelt_status *st) {
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  mp.n_threads = 1;
  mp.max_context = max_context;
  smelt_model *m = NULL;
  *st = smelt_model_load(dir, &mp, &m);
  return m;
}

static void write_text(const char *dir, const char *name, const char *text) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  if (!f) {
    perror(p);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

/* every runnable family: a synthetic checkpoint loads and runs */
static void test_all_families(void) {
  size_t n;
  const sm_family *const *all = sm_family_all(&n);
  int ran = 0;
  for (size_t i = 0; i < n; i++) {
    const sm_family *f = all[i];
    if (!f->recipe) {
      CHECK(f->notes != NULL, "%s: a known family that does not run must say why (notes)", f->model_type);
      continue;
    }
    CHECK(f->names && f->example && f->description, "%s: registry entry incomplete", f->model_type);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", g_root, f->model_type);
    sm_synth_shape sh = {"fam", 64, 2, 4, 2, 128, 200, false, f->model_type, 16, NULL};
    CHECK(sm_make_synthetic(&sh, 4, 32, dir, false) == SMELT_OK, "%s: synthetic: %s", f->model_type,
          smelt_last_error());
    smelt_status st;
    smelt_model *m = load(dir, 64, &st);
    CHECK(st == SMELT_OK && m, "%s: load: %s", f->model_type, smelt_last_error());
    if (!m) continue;
    int32_t a[6] = {1, 5, 9, 13, 17, 21}, b[6] = {1, 5, 9, 13, 17, 22};
    float *la = NULL, *lb = NULL;
    CHECK(smelt_eval_logits(m, a, 6, &la) == SMELT_OK && smelt_eval_logits(m, b, 6, &lb) == SMELT_OK, "%s: eval: %s",
          f->model_type, smelt_last_error());
    if (la && lb) {
      bool finite = true;
      double diff = 0;
      for (int j = 0; j < 6 * 200; j++) finite &= isfinite(la[j]) && isfinite(lb[j]);
      for (int j = 5 * 200; j < 6 * 200; j++) diff += fabs(la[j] - lb[j]);
      CHECK(finite, "%s: logits not finite", f->model_type);
      CHECK(diff > 0, "%s: the last token does not change the logits", f->model_type);
      for (int j = 0; j < 5 * 200; j++) finite &= la[j] == lb[j]; /* causal: earlier rows unchanged */
      CHECK(finite, "%s: a later token changed earlier logits", f->model_type);
    }
    smelt_model_info info;
    smelt_model_get_info(m, &info);
    CHECK(info.note && !info.note[0], "%s: a text checkpoint has no note (%s)", f->model_type, info.note);
    free(la);
    free(lb);
    smelt_model_free(m);
    ran++;
  }
  CHECK(ran >= 15, "runnable families: %d", ran);
}

/* a copy of src's tensors under prefix, plus extra (name, 1-D length) tensors */
static void repackage(const char *src, const char *dst, const char *prefix, const char *const *extra) {
  char p[600];
  snprintf(p, sizeof p, "%s/model.safetensors", src);
  sm_st *st = NULL;
  CHECK(sm_st_open(p, &st) == SMELT_OK, "open %s: %s", p, smelt_last_error());
  if (!st) return;
  mkdir(dst, 0755);
  sm_st_writer *w = sm_stw_new();
  for (size_t i = 0; i < sm_st_count(st); i++) {
    const sm_tensor *t = sm_st_at(st, i);
    char n[300];
    snprintf(n, sizeof n, "%s%s", prefix, t->name);
    sm_stw_add(w, n, t->dtype, t->ndim, t->shape, t->data, NULL, NULL);
  }
  static const uint16_t ones[8] = {0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80};
  for (const char *const *e = extra; e && *e; e++) {
    int64_t shape[1] = {8};
    sm_stw_add(w, *e, SM_DT_BF16, 1, shape, ones, NULL, NULL);
  }
  snprintf(p, sizeof p, "%s/model.safetensors", dst);
  CHECK(sm_stw_write(w, p) == SMELT_OK, "write %s", p);
  sm_stw_free(w);
  sm_st_close(st);
}

static void test_vlm(void) {
  char text[256], vlm[256], bad[256], plain[256];
  snprintf(text, sizeof text, "%s/gemma3_text", g_root); /* made by test_all_families */
  snprintf(vlm, sizeof vlm, "%s/vlm", g_root);
  snprintf(bad, sizeof bad, "%s/vlm_bad", g_root);
  snprintf(plain, sizeof plain, "%s/plain_vision", g_root);
  /* the text config (synthetic) nested under text_config of a gemma3 checkpoint */
  char p[600], *cfg = NULL;
  snprintf(p, sizeof p, "%s/config.json", text);
  CHECK(sm_read_file(p, &cfg, NULL) == SMELT_OK, "read %s", p);
  if (!cfg) return;
  size_t len = strlen(cfg) + 256;
  char *vcfg = malloc(len);
  snprintf(vcfg, len, "{\"model_type\": \"gemma3\", \"vision_config\": {\"hidden_size\": 8}, \"text_config\": %s}",
           cfg);
  static const char *const vision[] = {"vision_tower.vision_model.post_layernorm.weight",
                                       "multi_modal_projector.mm_soft_emb_norm.weight", NULL};
  repackage(text, vlm, "language_model.", vision);
  write_text(vlm, "config.json", vcfg);
  smelt_status st;
  smelt_model *m = load(vlm, 64, &st);
  CHECK(st == SMELT_OK && m, "vision-language checkpoint loads: %s", smelt_last_error());
  if (m) {
    smelt_model_info info;
    smelt_model_get_info(m, &info);
    CHECK(!strcmp(info.arch, "gemma3_text"), "arch %s", info.arch);
    /* an incomplete vision tower: the text model runs, the note says why images are refused */
    CHECK(strstr(info.note, "image input is not available") && strstr(info.note, "vision_config"), "note: %s",
          info.note);
    /* the same logits as the text checkpoint */
    smelt_model *t = load(text, 64, &st);
    int32_t ids[4] = {3, 1, 4, 1};
    float *a = NULL, *b = NULL;
    if (t && smelt_eval_logits(m, ids, 4, &a) == SMELT_OK && smelt_eval_logits(t, ids, 4, &b) == SMELT_OK)
      CHECK(!memcmp(a, b, sizeof(float) * 4 * 200), "packaged and text logits differ");
    else CHECK(0, "eval: %s", smelt_last_error());
    free(a);
    free(b);
    smelt_model_free(t);
    smelt_model_free(m);
  }
  /* any other tensor is still an error that names it */
  static const char *const odd[] = {"vision_tower.x.weight", "audio_tower.conv.weight", NULL};
  repackage(text, bad, "language_model.", odd);
  write_text(bad, "config.json", vcfg);
  m = load(bad, 64, &st);
  CHECK(st == SMELT_ERR_UNSUPPORTED && strstr(smelt_last_error(), "audio_tower.conv.weight"), "unknown tensor: %s",
        smelt_last_error());
  smelt_model_free(m);
  /* a text checkpoint does not skip vision tensors */
  static const char *const vt[] = {"vision_tower.x.weight", NULL};
  repackage(text, plain, "", vt);
  write_text(plain, "config.json", cfg);
  m = load(plain, 64, &st);
  CHECK(st == SMELT_ERR_UNSUPPORTED && strstr(smelt_last_error(), "vision_tower.x.weight"), "text + vision: %s",
        smelt_last_error());
  smelt_model_free(m);
  /* an unknown packaging */
  snprintf(vcfg, len, "{\"model_type\": \"llava\", \"vision_config\": {}, \"text_config\": %s}", cfg);
  write_text(vlm, "config.json", vcfg);
  m = load(vlm, 64, &st);
  CHECK(st == SMELT_ERR_UNSUPPORTED && strstr(smelt_last_error(), "llava"), "unknown packaging: %s",
        smelt_last_error());
  smelt_model_free(m);
  free(vcfg);
  free(cfg);
}

/* Qwen3.5 MoE as mlx-lm writes the vision-packaged checkpoint (qwen3_5_moe: the text model under
 * language_model., its config under text_config): the same logits as the text model */
static void test_vlm_qwen3_5_moe(void) {
  char text[256], vlm[256], p[600], *cfg = NULL;
  snprintf(text, sizeof text, "%s/qwen3_5_moe_text", g_root); /* made by test_all_families */
  snprintf(vlm, sizeof vlm, "%s/qwen3_5_moe_vlm", g_root);
  snprintf(p, sizeof p, "%s/config.json", text);
  CHECK(sm_read_file(p, &cfg, NULL) == SMELT_OK, "read %s", p);
  if (!cfg) return;
  const size_t len = strlen(cfg) + 128;
  char *vcfg = malloc(len);
  snprintf(vcfg, len, "{\"model_type\": \"qwen3_5_moe\", \"vision_config\": {}, \"text_config\": %s}", cfg);
  static const char *const vision[] = {"vision_tower.blocks.0.norm1.weight", NULL};
  repackage(text, vlm, "language_model.", vision);
  write_text(vlm, "config.json", vcfg);
  smelt_status st;
  smelt_model *m = load(vlm, 64, &st), *t = load(text, 64, &st);
  CHECK(m && t, "qwen3_5_moe checkpoint loads: %s", smelt_last_error());
  if (m && t) {
    smelt_model_info info;
    smelt_model_get_info(m, &info);
    CHECK(!strcmp(info.arch, "qwen3_5_moe_text"), "arch %s", info.arch);
    int32_t ids[5] = {3, 1, 4, 1, 5};
    float *a = NULL, *b = NULL;
    if (smelt_eval_logits(m, ids, 5, &a) == SMELT_OK && smelt_eval_logits(t, ids, 5, &b) == SMELT_OK)
      CHECK(!memcmp(a, b, sizeof(float) * 5 * 200), "qwen3_5_moe: packaged and text logits differ");
    else CHECK(0, "eval: %s", smelt_last_error());
    free(a);
    free(b);
  }
  smelt_model_free(t);
  smelt_model_free(m);
  free(vcfg);
  free(cfg);
}

static void test_not_runnable(void) {
  char d[256];
  snprintf(d, sizeof d, "%s/gemma4", g_root);
  mkdir(d, 0755);
  /* Gemma 4 experts switched on without saying how many */
  write_text(d, "config.json",
             "{\"model_type\": \"gemma4\", \"vision_config\": {}, \"text_config\": {\"model_type\":"
             " \"gemma4_text\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 4, \"vocab_size\": 100, \"enable_moe_block\": true}}");
  smelt_status st;
  smelt_model *m = load(d, 64, &st);
  CHECK(st == SMELT_ERR_FORMAT && strstr(smelt_last_error(), "enable_moe_block"), "gemma4 moe: %s", smelt_last_error());
  smelt_model_free(m);
  write_text(d, "config.json",
             "{\"model_type\": \"rwkv7\", \"hidden_size\": 64, \"intermediate_size\": 128,"
             " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}");
  m = load(d, 64, &st);
  CHECK(st == SMELT_ERR_UNSUPPORTED && strstr(smelt_last_error(), "'rwkv7'"), "unknown type: %s", smelt_last_error());
  smelt_model_free(m);
}

/* dynamic NTK: rows up to max_context; a position past them is an error, not a silent default */
static void test_dynamic_limit(void) {
  char d[256];
  snprintf(d, sizeof d, "%s/dyn", g_root);
  sm_synth_shape sh =
    {"dyn",
     64,
     2,
     4,
     2,
     128,
     200,
     false,
     "llama",
     16,
     "{\"max_position_embeddings\": 16, \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}}"};
  CHECK(sm_make_synthetic(&sh, 0, 0, d, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  int32_t ids[40];
  for (int i = 0; i < 40; i++) ids[i] = (i * 7) % 200;
  smelt_status st;
  smelt_model *m = load(d, 32, &st);
  CHECK(m != NULL, "load: %s", smelt_last_error());
  float *lg = NULL;
  if (m) {
    CHECK(smelt_eval_logits(m, ids, 30, &lg) == SMELT_OK, "30 positions: %s", smelt_last_error());
    free(lg);
    lg = NULL;
    /* an engine with a larger context than the model was loaded for */
    sm_engine_params ep;
    sm_engine_params_default(&ep);
    ep.max_context = 48;
    ep.prefix_cache = false;
    sm_engine *e = NULL;
    CHECK(sm_engine_create(m, &ep, &e) == SMELT_OK, "engine: %s", smelt_last_error());
    if (e) {
      sm_seq *q = sm_seq_new(e);
      sm_seq_append(e, q, ids, 40);
      float *l1 = malloc(sizeof(float) * 200);
      uint8_t done = 0;
      smelt_status rc = SMELT_OK;
      while (!done && rc == SMELT_OK) rc = sm_engine_step(e, &q, 1, l1, &done);
      CHECK(rc == SMELT_ERR_LIMIT && strstr(smelt_last_error(), "dynamic"), "40 positions: %s", smelt_last_error());
      free(l1);
      sm_seq_free(e, q);
      sm_engine_free(e);
    }
    smelt_model_free(m);
  }
}

/* longrope: a second row of frequencies (the long factors) used from original_max_position_embeddings on,
 * and the attention factor on the rotated dims of a partial rotary head */
static void test_longrope_rows(void) {
  char d[256];
  snprintf(d, sizeof d, "%s/longrope", g_root);
  sm_synth_shape sh =
    {"lr",
     64,
     2,
     4,
     2,
     128,
     200,
     false,
     "phi3",
     16,
     "{\"partial_rotary_factor\": 0.5, \"original_max_position_embeddings\": 16, \"max_position_embeddings\": 64,"
     " \"rope_theta\": 10000, \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": \"4x2.0\","
     " \"long_factor\": \"4x8.0\"}}"};
  CHECK(sm_make_synthetic(&sh, 0, 0, d, false) == SMELT_OK, "synthetic: %s", smelt_last_error());
  smelt_status st;
  for (int ctx = 16; ctx <= 32; ctx += 16) {
    smelt_model *m = load(d, ctx, &st);
    CHECK(m != NULL, "load: %s", smelt_last_error());
    if (!m) continue;
    const sm_rope_tab *t = &m->ropes[0];
    CHECK(t->rot == 8 && t->ext && t->n_rows == (ctx > 16 ? 2 : 1) && t->pos0 == 16, "table: rot %d rows %d pos0 %d",
          t->rot, t->n_rows, t->pos0);
    /* factor 64 / 16 = 4: sqrt(1 + ln 4 / ln 16) */
    CHECK(fabs(t->mscale - sqrt(1.0 + log(4.0) / log(16.0))) < 1e-6 && t->attn_mul == 1.0f, "mscale %g", t->mscale);
    float inv[8];
    m->be->download(m->be, inv, t->inv, sizeof(float) * 4 * (size_t)t->n_rows);
    for (int r = 0; r < t->n_rows; r++)
      for (int i = 0; i < 4; i++) {
        double want = 1.0 / ((r ? 8.0 : 2.0) * pow(10000.0, 2.0 * i / 8));
        CHECK(fabs(inv[r * 4 + i] - want) <= 1e-6 * want, "row %d [%d] %g vs %g", r, i, inv[r * 4 + i], want);
      }
    smelt_model_free(m);
  }
}

int main(void) {
  snprintf(g_root, sizeof g_root, "/tmp/smelt-families-XXXXXX");
  if (!mkdtemp(g_root)) {
    perror("mkdtemp");
    return 1;
  }
  test_all_families();
  test_vlm();
  test_vlm_qwen3_5_moe();
  test_not_runnable();
  test_dynamic_limit();
  test_longrope_rows();
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
  if (system(cmd)) fprintf(stderr, "warning: could not remove %s\n", g_root);
  TEST_END();
}
