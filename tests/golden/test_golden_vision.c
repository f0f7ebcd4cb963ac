/* Golden tests of image input (fixtures made by tools/golden_vision.py, tests/golden/vision): for each
 * vision-language family, the image's embeddings, the logits of every prompt position with the image
 * spliced in, and 40 greedy tokens, against the reference; the prompt's expansion and tokenization;
 * the image cache and the prefix cache on a second sequence with the same image; and an image
 * sequence batched with a text one. SMELT_GOLDEN_DEVICE=cuda runs it on the CUDA backend (exit 77
 * without a GPU). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "../test_util.h"
#include "engine/engine.h"
#include "model/model.h"
#include "vision/vision.h"
#include "vision/vit.h"

static bool g_cuda;

static double num(const cJSON *o, const char *k, double def) {
  const cJSON *v = cJSON_GetObjectItem(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static float *read_f32(const char *dir, const char *file, size_t *n) {
  char p[2200], *d = NULL;
  size_t len = 0;
  snprintf(p, sizeof p, "%.1000s/%.1000s", dir, file);
  if (sm_read_file(p, &d, &len)) return NULL;
  *n = len / sizeof(float);
  return (float *)d;
}

static void compare(const char *name, const char *what, const float *got, const float *ref, size_t n, double abs_tol,
                    double rel_tol) {
  double mx = 0, d2 = 0, r2 = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - ref[i]);
    if (d > mx || d != d) mx = d != d ? INFINITY : d;
    d2 += d * d;
    r2 += (double)ref[i] * ref[i];
  }
  const double rel = sqrt(d2 / (r2 > 0 ? r2 : 1));
  printf("%-20s %-12s max_abs %.2e (tol %.0e)  rel_l2 %.2e (tol %.0e)\n", name, what, mx, abs_tol, rel, rel_tol);
  CHECK(mx <= abs_tol && rel <= rel_tol, "%s: %s differ from the reference", name, what);
}

/* logits of every pending token of a new sequence holding ids with the images of spans (after the
 * prefix cache's reuse: *n_rows rows, the last one the prompt's last position) */
/* the fixtures' model parameters: the test's device, an f32 KV cache, 2 threads */
static smelt_model_params model_params(int max_context) {
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = g_cuda ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  mp.kv_type = SMELT_KV_F32;
  mp.max_context = max_context;
  mp.n_threads = 2;
  return mp;
}

/* an engine of two sequences */
static sm_engine_params engine_params(int max_context, int max_batch_tokens) {
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = max_context;
  ep.max_seqs = 2;
  ep.max_batch_tokens = max_batch_tokens;
  return ep;
}

static float *prompt_logits(sm_engine *e, const int32_t *ids, int n, const sm_mm_span *spans, int n_spans,
                            sm_seq **keep, int *n_rows) {
  smelt_model *m = sm_engine_model(e);
  sm_seq *s = sm_seq_new(e);
  float *lg = malloc(sizeof(float) * (size_t)n * m->cfg.vocab_size);
  int rows = 0;
  smelt_status st = sm_seq_append(e, s, ids, n);
  if (!st) st = sm_seq_set_media(e, s, spans, n_spans);
  if (!st) sm_seq_use_prefix_cache(e, s);
  if (!st) st = sm_engine_step_all(e, s, lg, &rows);
  if (st) {
    CHECK(0, "prompt: %s", smelt_last_error());
    free(lg);
    sm_seq_free(e, s);
    return NULL;
  }
  if (keep) *keep = s;
  else sm_seq_free(e, s);
  if (n_rows) *n_rows = rows;
  return lg;
}

static void check_fixture(const char *dir) {
  char path[2200];
  snprintf(path, sizeof path, "%.1000s/manifest.json", dir);
  char *js = NULL;
  if (sm_read_file(path, &js, NULL)) {
    CHECK(0, "%s: %s", dir, smelt_last_error());
    return;
  }
  cJSON *man = cJSON_Parse(js);
  free(js);
  const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(man, "name"));
  const cJSON *pids = cJSON_GetObjectItem(man, "prompt_ids"), *gids = cJSON_GetObjectItem(man, "greedy_ids");
  const cJSON *margins = cJSON_GetObjectItem(man, "greedy_top2_margins"), *tol = cJSON_GetObjectItem(man, "tolerances");
  const cJSON *tt = cJSON_GetObjectItem(tol, g_cuda ? "reduced" : "f32");
  const double abs_tol = num(tt, "max_abs", 2e-3), rel_tol = num(tt, "rel_l2", 1e-4);
  const double emb_tol = num(tt, "embeddings_max_abs", 2e-3), margin_min = num(tol, "greedy_margin_min", 0.05);
  const int np = cJSON_GetArraySize(pids), ng = cJSON_GetArraySize(gids);
  int32_t *want = malloc(sizeof(int32_t) * (size_t)np);
  for (int i = 0; i < np; i++) want[i] = cJSON_GetArrayItem(pids, i)->valueint;

  const smelt_model_params mp = model_params(128);
  smelt_model *m = NULL;
  sm_vimage *img = NULL;
  sm_mm_span *spans = NULL;
  int32_t *ids = NULL;
  sm_engine *e = NULL;
  float *lg = NULL, *emb_ref = NULL, *lg_ref = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    CHECK(0, "%s: load: %s", name, smelt_last_error());
    goto out;
  }
  CHECK(m->vision != NULL, "%s: no vision tower (%s)", name, m->note);
  if (!m->vision) goto out;
  /* 1. the image and the prompt's tokens */
  snprintf(path, sizeof path, "%.1000s/%.1000s", dir, cJSON_GetStringValue(cJSON_GetObjectItem(man, "image")));
  sm_image im;
  if (sm_image_load(path, 0, NULL, &im)) {
    CHECK(0, "%s: %s", name, smelt_last_error());
    goto out;
  }
  smelt_status st = sm_vimage_new(m->vision, &im, &img);
  sm_image_free(&im);
  if (st) {
    CHECK(0, "%s: prepare: %s", name, smelt_last_error());
    goto out;
  }
  /* Idefics3 / SmolVLM: the tile grid and the frames; the others: the grid of embedding rows */
  const cJSON *split = cJSON_GetObjectItem(man, "split");
  const cJSON *grid = split ? split : cJSON_GetObjectItem(man, "embedding_grid");
  CHECK(img->rows == cJSON_GetArrayItem(grid, 0)->valueint && img->cols == cJSON_GetArrayItem(grid, 1)->valueint,
        "%s: %s %dx%d", name, split ? "tiles" : "embedding grid", img->rows, img->cols);
  CHECK(img->frames == (int)num(man, "n_frames", 1) && img->n_embd == (int)num(man, "embedding_rows", 0),
        "%s: %d frames, %d embedding rows", name, img->frames, img->n_embd);
  int n_ids = 0;
  st = sm_vision_tokenize(m->vision, m->tok, cJSON_GetStringValue(cJSON_GetObjectItem(man, "prompt")), false, &img, 1,
                          &ids, &n_ids, &spans);
  if (st) {
    CHECK(0, "%s: tokenize: %s", name, smelt_last_error());
    goto out;
  }
  CHECK(n_ids == np && !memcmp(ids, want, sizeof(int32_t) * (size_t)np), "%s: prompt ids differ (%d vs %d tokens)",
        name, n_ids, np);
  const cJSON *sp = cJSON_GetObjectItem(man, "span");
  CHECK(spans[0].t0 == cJSON_GetArrayItem(sp, 0)->valueint && spans[0].t1 == cJSON_GetArrayItem(sp, 1)->valueint,
        "%s: span [%d, %d)", name, spans[0].t0, spans[0].t1);
  if (n_ids != np) goto out;
  /* 2. the embeddings */
  if ((st = sm_vision_encode(m->vision, img))) {
    CHECK(0, "%s: encode: %s", name, smelt_last_error());
    goto out;
  }
  size_t ne = 0;
  emb_ref = read_f32(dir, "embeddings.f32", &ne);
  const sm_venc *enc = img->enc;
  const size_t rows = (size_t)enc->n_embd * enc->dim;
  CHECK(emb_ref && ne == rows * (size_t)(1 + enc->n_deep), "%s: embeddings file (%zu floats, %zu expected)", name, ne,
        rows * (size_t)(1 + enc->n_deep));
  if (emb_ref && ne == rows * (size_t)(1 + enc->n_deep)) {
    float *got = malloc(sizeof(float) * ne);
    m->be->download(m->be, got, enc->embd, sizeof(float) * rows);
    for (int l = 0; l < enc->n_deep; l++)
      m->be->download(m->be, got + rows * (1 + l), enc->deep[l], sizeof(float) * rows);
    compare(name, "embeddings", got, emb_ref, ne, emb_tol, rel_tol * 10);
    free(got);
  }
  /* 3. prompt logits */
  sm_engine_params ep = engine_params(128, 128);
  if ((st = sm_engine_create(m, &ep, &e))) {
    CHECK(0, "%s: engine: %s", name, smelt_last_error());
    goto out;
  }
  const int V = m->cfg.vocab_size;
  size_t nl = 0;
  lg_ref = read_f32(dir, "logits.f32", &nl);
  CHECK(lg_ref && nl == (size_t)np * V, "%s: logits file", name);
  sm_seq *s = NULL;
  int n_rows = 0;
  lg = prompt_logits(e, ids, np, spans, 1, &s, &n_rows);
  CHECK(!lg || n_rows == np, "%s: %d logits rows for %d tokens", name, n_rows, np);
  if (!lg || !lg_ref || nl != (size_t)np * V) goto out;
  compare(name, "logits", lg, lg_ref, nl, abs_tol, rel_tol);
  /* 4. greedy decoding after it (positions continue after the image) */
  int n_ok = 0;
  float *row = malloc(sizeof(float) * V);
  memcpy(row, lg + (size_t)(np - 1) * V, sizeof(float) * V);
  for (int k = 0; k < ng; k++) {
    int best = 0;
    for (int j = 1; j < V; j++)
      if (row[j] > row[best]) best = j;
    if (best != cJSON_GetArrayItem(gids, k)->valueint) {
      const double mg = cJSON_GetArrayItem(margins, k)->valuedouble;
      CHECK(mg < margin_min, "%s: greedy token %d is %d, expected %d (margin %.3f)", name, k, best,
            cJSON_GetArrayItem(gids, k)->valueint, mg);
      break;
    }
    n_ok++;
    uint8_t done = 0;
    int32_t t = best;
    if (sm_seq_append(e, s, &t, 1) || sm_engine_step(e, &s, 1, row, &done)) {
      CHECK(0, "%s: decode: %s", name, smelt_last_error());
      break;
    }
  }
  printf("%-20s greedy       %d/%d\n", name, n_ok, ng);
  free(row);
  sm_seq_free(e, s);
  /* 5. the same image again: not encoded again, KV of its prefix reused; and batched with a text-only
   * sequence, its logits unchanged */
  {
    sm_vimage *img2 = NULL;
    sm_image im2;
    snprintf(path, sizeof path, "%.1000s/%.1000s", dir, cJSON_GetStringValue(cJSON_GetObjectItem(man, "image")));
    if (!sm_image_load(path, 0, NULL, &im2) && !sm_vimage_new(m->vision, &im2, &img2)) {
      sm_mm_span sp2 = spans[0];
      sp2.img = img2;
      sm_engine_stats before, after;
      sm_engine_get_stats(e, &before);
      int r2 = 0;
      float *lg2 = prompt_logits(e, ids, np, &sp2, 1, NULL, &r2);
      sm_engine_get_stats(e, &after);
      /* the span either came from the prefix cache (not encoded) or from the image cache; models with
       * recurrent layers have no prefix cache: the image cache alone */
      bool rec = false;
      for (int l = 0; l < m->cfg.num_hidden_layers; l++) rec |= m->cfg.layer_kind[l] == SM_LK_REC;
      CHECK(rec ? img2->enc == img->enc : !img2->enc || img2->enc == img->enc, "%s: the same image was encoded again",
            name);
      if (rec)
        CHECK(after.prefix_hits_tokens == before.prefix_hits_tokens, "%s: a prefix-cache hit with recurrent layers",
              name);
      else
        CHECK(after.prefix_hits_tokens > before.prefix_hits_tokens, "%s: no prefix-cache hit for the same image", name);
      if (lg2 && r2 > 0)
        compare(name, "cached", lg2 + (size_t)(r2 - 1) * V, lg + (size_t)(np - 1) * V, (size_t)V, abs_tol, rel_tol);
      free(lg2);
      sm_vimage_unref(img2);
    }
    sm_image_free(&im2);
    /* a batch of the image prompt and a text prompt, no prefix cache */
    sm_engine_free(e);
    ep.prefix_cache = false;
    e = NULL;
    if (!sm_engine_create(m, &ep, &e)) {
      sm_seq *a = sm_seq_new(e), *b = sm_seq_new(e), *q[2] = {b, a};
      int32_t txt[5] = {72, 105, 33, 10, 65};
      float *two = malloc(sizeof(float) * 2 * V);
      uint8_t done[2] = {0, 0};
      st = sm_seq_append(e, a, ids, np);
      if (!st) st = sm_seq_set_media(e, a, spans, 1);
      if (!st) st = sm_seq_append(e, b, txt, 5);
      while (!st && !(done[0] && done[1])) st = sm_engine_step(e, q, 2, two, done);
      CHECK(!st, "%s: batch: %s", name, smelt_last_error());
      if (!st) compare(name, "batched", two + V, lg + (size_t)(np - 1) * V, (size_t)V, abs_tol, rel_tol);
      free(two);
      sm_seq_free(e, a);
      sm_seq_free(e, b);
    }
  }
out:
  if (spans) sm_vimage_unref(spans[0].img);
  free(spans);
  if (img) sm_vimage_unref(img);
  sm_engine_free(e);
  free(ids);
  free(want);
  free(lg);
  free(lg_ref);
  free(emb_ref);
  smelt_model_free(m);
  cJSON_Delete(man);
}

/* Gemma 3's pan and scan on the gemma3 fixture (its config with do_pan_and_scan on, crops of at least 8
 * pixels): the 45x30 image gives 2 crops; the prompt is Gemma3Processor's text around the whole image
 * and the crops, built here from its formula and tokenized; each crop has a span of its own; the model
 * runs the three images, and its logits differ from the one-image prompt's. */
static void check_pan_scan(const char *root) {
  char src[2200], dir[] = "/tmp/smelt-pas-XXXXXX", path[2200];
  snprintf(src, sizeof src, "%.1000s/gemma3_vision", root);
  if (!mkdtemp(dir)) {
    CHECK(0, "mkdtemp");
    return;
  }
  const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "image.jpg"};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char *data = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%.1000s/%s", src, files[i]);
    if (sm_read_file(path, &data, &len)) {
      CHECK(0, "pan and scan: %s", smelt_last_error());
      return;
    }
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, len, f) == len, "write %s", path);
    if (f) fclose(f);
    free(data);
  }
  snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs("{\"size\": {\"height\": 32, \"width\": 32}, \"resample\": 2, \"image_mean\": [0.5, 0.5, 0.5], "
          "\"image_std\": [0.5, 0.5, 0.5], \"do_pan_and_scan\": true, \"pan_and_scan_min_crop_size\": 8}",
          f);
    fclose(f);
  }
  const smelt_model_params mp = model_params(256);
  smelt_model *m = NULL;
  sm_vimage *img = NULL, *img1 = NULL;
  sm_mm_span *spans = NULL, *spans1 = NULL;
  int32_t *ids = NULL, *want = NULL, *ids1 = NULL;
  sm_engine *e = NULL;
  float *lg = NULL, *lg1 = NULL;
  int n_ids = 0, n1 = 0, ns = 0;
  if (smelt_model_load(dir, &mp, &m) || !m->vision) {
    CHECK(0, "pan and scan: load: %s", smelt_last_error());
    goto out;
  }
  snprintf(path, sizeof path, "%s/image.jpg", dir);
  sm_image im;
  if (sm_image_load(path, 0, NULL, &im)) {
    CHECK(0, "pan and scan: %s", smelt_last_error());
    goto out;
  }
  smelt_status st = sm_vimage_new(m->vision, &im, &img);
  sm_image_free(&im);
  CHECK(!st && img->n_crops == 2, "pan and scan: %s, %d crops (2 expected)", st ? smelt_last_error() : "ok",
        st ? -1 : img->n_crops);
  if (st || img->n_crops != 2) goto out;
  CHECK(sm_vision_span_count(&img, 1) == 3, "pan and scan: span count");
  st = sm_vision_tokenize(m->vision, m->tok, "Look<start_of_image>ok", false, &img, 1, &ids, &n_ids, &spans);
  if (st) {
    CHECK(0, "pan and scan: tokenize: %s", smelt_last_error());
    goto out;
  }
  /* Gemma3Processor: "Here is the original image {seq} and here are some crops to help you see better "
   * + " ".join([seq] * num_crops), seq = "\n\n<start_of_image>" + image tokens + "<end_of_image>\n\n" */
  char seq[512] = "\n\n<start_of_image>";
  for (int i = 0; i < img->n_embd; i++) strcat(seq, "<image_soft_token>");
  strcat(seq, "<end_of_image>\n\n");
  char text[2048];
  snprintf(text, sizeof text,
           "LookHere is the original image %s and here are some crops to help you see better %s %sok", seq, seq, seq);
  size_t nw = 0;
  st = smelt_tokenize(m->tok, text, strlen(text), false, &want, &nw);
  CHECK(!st && (size_t)n_ids == nw && !memcmp(ids, want, sizeof(int32_t) * nw),
        "pan and scan: the prompt's tokens (%d) differ from the processor's text (%zu)", n_ids, nw);
  ns = 3;
  for (int k = 0; k < ns; k++) {
    const sm_vimage *want_img = k ? img->crops[k - 1] : img;
    int soft = 0;
    for (int t = spans[k].t0; t < spans[k].t1; t++) soft += ids[t] == m->vision->image_token;
    CHECK(spans[k].img == want_img && soft == want_img->n_embd, "pan and scan: span %d [%d, %d)", k, spans[k].t0,
          spans[k].t1);
  }
  CHECK(memcmp(img->hash, img->crops[0]->hash, 32) && memcmp(img->crops[0]->hash, img->crops[1]->hash, 32),
        "pan and scan: the crops hash apart from the image and each other");
  const sm_engine_params ep = engine_params(256, 256);
  if ((st = sm_engine_create(m, &ep, &e))) {
    CHECK(0, "pan and scan: engine: %s", smelt_last_error());
    goto out;
  }
  int rows = 0;
  lg = prompt_logits(e, ids, n_ids, spans, ns, NULL, &rows);
  CHECK(lg && rows == n_ids, "pan and scan: %d logits rows for %d tokens", rows, n_ids);
  /* the same image without its crops: the last position's logits differ */
  m->vision->proc.pan_and_scan = false;
  snprintf(path, sizeof path, "%s/image.jpg", dir);
  if (lg && !sm_image_load(path, 0, NULL, &im)) {
    st = sm_vimage_new(m->vision, &im, &img1);
    sm_image_free(&im);
  }
  if (lg && img1 &&
      !sm_vision_tokenize(m->vision, m->tok, "Look<start_of_image>ok", false, &img1, 1, &ids1, &n1, &spans1)) {
    lg1 = prompt_logits(e, ids1, n1, spans1, 1, NULL, NULL);
    const int V = m->cfg.vocab_size;
    double d = 0;
    bool finite = true;
    for (int i = 0; lg1 && i < V; i++) {
      const float a = lg[(size_t)(n_ids - 1) * V + i], b = lg1[(size_t)(n1 - 1) * V + i];
      finite = finite && isfinite(a);
      d = fmax(d, fabs((double)a - b));
    }
    CHECK(lg1 && finite && d > 1e-4, "pan and scan: logits with the crops (finite %d) differ by %g", finite, d);
  }
out:
  for (int k = 0; spans && k < ns; k++) sm_vimage_unref(spans[k].img);
  free(spans);
  if (spans1) sm_vimage_unref(spans1[0].img);
  free(spans1);
  if (img) sm_vimage_unref(img);
  if (img1) sm_vimage_unref(img1);
  sm_engine_free(e);
  free(ids);
  free(ids1);
  free(want);
  free(lg);
  free(lg1);
  smelt_model_free(m);
  for (size_t i = 0; i < 6; i++) {
    static const char *all[] = {"config.json",           "model.safetensors", "tokenizer.json",
                                "tokenizer_config.json", "image.jpg",         "preprocessor_config.json"};
    snprintf(path, sizeof path, "%s/%s", dir, all[i]);
    remove(path);
  }
  rmdir(dir);
}

/* SmolVLM configs the tower cannot serve: the text model still loads, images are refused and the
 * model's note says why (a processor whose image_seq_len is not what a tile gives; a scale_factor that
 * does not fit the connector; tiles that are not whole pixel-shuffle blocks of patches) */
static void check_smolvlm_errors(const char *root) {
  static const char *files[] = {"config.json",           "model.safetensors",        "tokenizer.json",
                                "tokenizer_config.json", "preprocessor_config.json", "processor_config.json"};
  static const struct {
    const char *file, *from, *to, *why;
  } cases[] = {
    {"processor_config.json", "\"image_seq_len\": 4", "\"image_seq_len\": 9", "image_seq_len"},
    {"config.json", "\"scale_factor\": 2", "\"scale_factor\": 3", "modality_projection"},
    {"preprocessor_config.json", "\"longest_edge\": 32", "\"longest_edge\": 24", "tiles of 24 pixels"},
  };
  for (size_t c = 0; c < SM_ARRAY_LEN(cases); c++) {
    char dir[] = "/tmp/smelt-smol-XXXXXX", path[2200];
    if (!mkdtemp(dir)) {
      CHECK(0, "mkdtemp");
      return;
    }
    bool edited = false;
    for (size_t i = 0; i < SM_ARRAY_LEN(files); i++) {
      char *data = NULL;
      size_t len = 0;
      snprintf(path, sizeof path, "%.1000s/smolvlm_vision/%s", root, files[i]);
      if (sm_read_file(path, &data, &len)) {
        CHECK(0, "smolvlm errors: %s", smelt_last_error());
        continue;
      }
      char *hit = strcmp(files[i], cases[c].file) ? NULL : strstr(data, cases[c].from);
      snprintf(path, sizeof path, "%s/%s", dir, files[i]);
      FILE *f = fopen(path, "wb");
      if (f && hit) {
        fwrite(data, 1, (size_t)(hit - data), f);
        fputs(cases[c].to, f);
        fputs(hit + strlen(cases[c].from), f);
        edited = true;
      } else if (f) fwrite(data, 1, len, f);
      if (f) fclose(f);
      free(data);
    }
    CHECK(edited, "smolvlm errors: %s holds no %s", cases[c].file, cases[c].from);
    const smelt_model_params mp = model_params(128);
    smelt_model *m = NULL;
    smelt_status st = smelt_model_load(dir, &mp, &m);
    CHECK(st == SMELT_OK && m && !m->vision && strstr(m->note, cases[c].why) && strstr(m->note, "image input"),
          "smolvlm with %s: load %d, vision %p, note '%s'", cases[c].to, st, m ? (void *)m->vision : NULL,
          m ? m->note : smelt_last_error());
    smelt_model_free(m);
    for (size_t i = 0; i < SM_ARRAY_LEN(files); i++) {
      snprintf(path, sizeof path, "%s/%s", dir, files[i]);
      remove(path);
    }
    rmdir(dir);
  }
}

int main(int argc, char **argv) {
  const char *dev = getenv("SMELT_GOLDEN_DEVICE");
  g_cuda = dev && !strcmp(dev, "cuda");
  if (g_cuda) {
    sm_backend *be = sm_backend_create(SMELT_DEVICE_CUDA, 0, 0);
    if (!be) {
      printf("SKIP: no CUDA backend (%s)\n", smelt_last_error());
      return 77;
    }
    be->destroy(be);
  }
  const char *root = argc > 1 ? argv[1] : "tests/golden/vision";
  DIR *d = opendir(root);
  if (!d) {
    fprintf(stderr, "no fixtures at %s\n", root);
    return 1;
  }
  struct dirent *de;
  char **names = NULL;
  int n = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    names = realloc(names, sizeof(char *) * (size_t)(n + 1));
    names[n++] = strdup(de->d_name);
  }
  closedir(d);
  for (int i = 0; i < n; i++) {
    char p[2200];
    snprintf(p, sizeof p, "%.1000s/%.1000s", root, names[i]);
    check_fixture(p);
    free(names[i]);
  }
  free(names);
  CHECK(n >= 4, "%d fixtures found", n);
  check_pan_scan(root);
  check_smolvlm_errors(root);
  TEST_END();
}
