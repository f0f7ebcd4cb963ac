/* Fuzzes loading checkpoints: a tiny random model of every runnable family (sm_make_synthetic), then
 * thousands of mutations of its config.json (numbers changed to edge values, members dropped or
 * added from the keys the families read, strings and booleans swapped, nested blocks such as
 * quantization, rope_scaling and text_config included) and of its safetensors header (a tensor's
 * dims swapped, its dtype changed for one of the same size, its name changed). A load must fail with
 * a message and no model, or give a model that evaluates a few tokens (or fails to, with a message);
 * nothing may crash, hang or leak (CI runs it under ASan/UBSan).
 * usage: test_model_fuzz [iterations per family] (SMELT_FUZZ_SEED) */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../test_util.h"
#include "model/family.h"
#include "model/model.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { return t_xorshift(&g_rng); }
static size_t rn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static const double k_nums[] = {0,   -1,  1,   2,   3,   4,   5,   7,   8,   16,           17,  32,   63,   64,   65,
                                100, 128, 256, 299, 300, 301, 512, 1e6, 1e9, 4294967296.0, 0.5, 1e-6, 1e30, -1e30};
static const char *const k_strs[] = {"llama",
                                     "gemma3_text",
                                     "qwen3",
                                     "qwen3_moe",
                                     "gpt_oss",
                                     "lfm2",
                                     "phi3",
                                     "gelu",
                                     "gelu_pytorch_tanh",
                                     "silu",
                                     "relu2",
                                     "yarn",
                                     "linear",
                                     "dynamic",
                                     "llama3",
                                     "longrope",
                                     "mxfp4",
                                     "affine",
                                     "sliding_attention",
                                     "full_attention",
                                     "linear_attention",
                                     "conv",
                                     "attention",
                                     "mamba",
                                     "",
                                     "x"};
/* members the families read (added with a random value) */
static const char *const k_keys[] = {"hidden_size",
                                     "num_hidden_layers",
                                     "num_attention_heads",
                                     "num_key_value_heads",
                                     "intermediate_size",
                                     "vocab_size",
                                     "head_dim",
                                     "tie_word_embeddings",
                                     "rms_norm_eps",
                                     "rope_theta",
                                     "sliding_window",
                                     "sliding_window_pattern",
                                     "layer_types",
                                     "partial_rotary_factor",
                                     "num_experts",
                                     "num_local_experts",
                                     "num_experts_per_tok",
                                     "moe_intermediate_size",
                                     "shared_expert_intermediate_size",
                                     "norm_topk_prob",
                                     "first_k_dense_replace",
                                     "n_routed_experts",
                                     "n_shared_experts",
                                     "kv_lora_rank",
                                     "q_lora_rank",
                                     "qk_rope_head_dim",
                                     "qk_nope_head_dim",
                                     "v_head_dim",
                                     "attn_logit_softcapping",
                                     "final_logit_softcapping",
                                     "query_pre_attn_scalar",
                                     "rope_scaling",
                                     "quantization",
                                     "text_config",
                                     "max_position_embeddings",
                                     "linear_num_key_heads",
                                     "linear_num_value_heads",
                                     "linear_key_head_dim",
                                     "linear_value_head_dim",
                                     "linear_conv_kernel_dim",
                                     "full_attention_interval",
                                     "conv_L_cache",
                                     "block_ff_dim",
                                     "layer_types",
                                     "hidden_size_per_layer_input",
                                     "num_kv_shared_layers",
                                     "global_head_dim",
                                     "attention_k_eq_v",
                                     "embedding_multiplier",
                                     "residual_multiplier",
                                     "logits_scaling",
                                     "swiglu_limit",
                                     "attention_bias"};

static cJSON *rand_value(void) {
  switch (rn(8)) {
    case 0: return cJSON_CreateBool(rn(2));
    case 1: return cJSON_CreateString(k_strs[rn(sizeof k_strs / sizeof k_strs[0])]);
    case 2: { /* an array of numbers or of layer kinds */
      cJSON *a = cJSON_CreateArray();
      const int n = (int)rn(5);
      const bool s = rn(2);
      for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, s ? cJSON_CreateString(k_strs[rn(sizeof k_strs / sizeof k_strs[0])])
                                  : cJSON_CreateNumber(k_nums[rn(sizeof k_nums / sizeof k_nums[0])]));
      return a;
    }
    case 3: {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, rn(2) ? "bits" : "factor", k_nums[rn(sizeof k_nums / sizeof k_nums[0])]);
      if (rn(2)) cJSON_AddNumberToObject(o, "group_size", rn(2) ? 32 : 7);
      if (rn(2)) cJSON_AddStringToObject(o, rn(2) ? "rope_type" : "mode", k_strs[rn(sizeof k_strs / sizeof k_strs[0])]);
      return o;
    }
    case 4: return cJSON_CreateNull();
    default: return cJSON_CreateNumber(k_nums[rn(sizeof k_nums / sizeof k_nums[0])]);
  }
}

/* a random member of o or of an object below it (depth first, each equally likely among the first 256) */
static void collect(cJSON *o, cJSON **out, int *n) {
  for (cJSON *c = o->child; c && *n < 256; c = c->next) {
    out[(*n)++] = c;
    if (cJSON_IsObject(c) || cJSON_IsArray(c)) collect(c, out, n);
  }
}

static void mutate_config(cJSON *root) {
  const int k = 1 + (int)rn(3);
  for (int m = 0; m < k; m++) {
    cJSON *items[256];
    int n = 0;
    collect(root, items, &n);
    const int r = (int)rn(10);
    if (r < 2 || !n) { /* add a known member (or replace it) */
      const char *key = k_keys[rn(sizeof k_keys / sizeof k_keys[0])];
      cJSON_DeleteItemFromObjectCaseSensitive(root, key);
      cJSON_AddItemToObject(root, key, rand_value());
      continue;
    }
    cJSON *it = items[rn((size_t)n)];
    if (r < 6 && cJSON_IsNumber(it)) {
      const double v = it->valuedouble,
                   opts[] = {v * 2, v / 2, v + 1, v - 1, -v, k_nums[rn(sizeof k_nums / sizeof k_nums[0])]};
      cJSON_SetNumberValue(it, opts[rn(6)]);
    } else if (r < 6 && cJSON_IsBool(it)) {
      it->type = cJSON_IsTrue(it) ? cJSON_False : cJSON_True;
    } else if (r < 8 && it->string) { /* replace the member's value */
      cJSON *parent = NULL;
      for (int i = 0; i < n && !parent; i++)
        for (cJSON *c = items[i]->child; c; c = c->next)
          if (c == it) parent = items[i];
      if (!parent) parent = root;
      cJSON_ReplaceItemViaPointer(parent, it, rand_value());
    } else { /* drop it */
      cJSON *parent = root;
      for (int i = 0; i < n; i++)
        for (cJSON *c = items[i]->child; c; c = c->next)
          if (c == it) parent = items[i];
      cJSON_Delete(cJSON_DetachItemViaPointer(parent, it));
    }
  }
}

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) abort();
  b[n] = 0;
  fclose(f);
  *len = (size_t)n;
  return b;
}
static void write_all(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n) abort();
  fclose(f);
}

/* the safetensors file with one tensor of its header changed: dims swapped, a dtype of the same size, or
 * another name (the header is rewritten at the same length, padded with spaces, so the data stay put) */
static bool mutate_safetensors(const char *src, size_t n, char **out) {
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = (hl << 8) | (uint8_t)src[i];
  if (hl > n - 8) return false;
  cJSON *h = cJSON_ParseWithLength(src + 8, (size_t)hl);
  if (!h) return false;
  cJSON *ts[512];
  int nt = 0;
  for (cJSON *c = h->child; c && nt < 512; c = c->next)
    if (strcmp(c->string, "__metadata__")) ts[nt++] = c;
  bool done = false;
  if (nt) {
    cJSON *t = ts[rn((size_t)nt)];
    cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape"), *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const int r = (int)rn(3);
    if (r == 0 && cJSON_GetArraySize(shape) >= 2) {
      const int a = (int)rn((size_t)cJSON_GetArraySize(shape)), b = (int)rn((size_t)cJSON_GetArraySize(shape));
      const double va = cJSON_GetArrayItem(shape, a)->valuedouble, vb = cJSON_GetArrayItem(shape, b)->valuedouble;
      cJSON_SetNumberValue(cJSON_GetArrayItem(shape, a), vb);
      cJSON_SetNumberValue(cJSON_GetArrayItem(shape, b), va);
      done = true;
    } else if (r == 1 && cJSON_IsString(dt)) {
      static const char *const s2[] = {"F16", "BF16", "U16", "I16"}, *const s4[] = {"F32", "U32", "I32"};
      const bool two = !strcmp(dt->valuestring, "F16") || !strcmp(dt->valuestring, "BF16") ||
                       !strcmp(dt->valuestring, "U16") || !strcmp(dt->valuestring, "I16");
      cJSON_SetValuestring(dt, two ? s2[rn(4)] : s4[rn(3)]);
      done = true;
    } else if (r == 2) {
      static const char *const sfx[] = {".x", "s", ".scales", ".biases", ".weight"};
      char name[512];
      snprintf(name, sizeof name, "%.400s%s", t->string, sfx[rn(5)]);
      cJSON *d = cJSON_DetachItemViaPointer(h, t);
      cJSON_AddItemToObject(h, name, d);
      done = true;
    }
  }
  char *txt = done ? cJSON_PrintUnformatted(h) : NULL;
  cJSON_Delete(h);
  if (!txt || strlen(txt) > hl) {
    free(txt);
    return false;
  }
  char *o = malloc(n);
  if (!o) abort();
  memcpy(o, src, n);
  memset(o + 8, ' ', (size_t)hl);
  memcpy(o + 8, txt, strlen(txt));
  free(txt);
  *out = o;
  return true;
}

typedef struct {
  int loads, evals;
} counts;

/* load dir on the CPU and, where it loads, evaluate a few tokens */
static void check_load(const char *dir, counts *c) {
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  mp.n_threads = 1;
  mp.max_context = 32;
  smelt_model *m = (smelt_model *)1;
  if (smelt_model_load(dir, &mp, &m) != SMELT_OK) {
    CHECK(m == NULL, "a failed load left a model");
    CHECK(smelt_last_error()[0] != 0, "a failed load without a message");
    return;
  }
  c->loads++;
  const int32_t V = smelt_model_vocab_size(m);
  CHECK(V > 0, "a loaded model with a vocabulary of %d", V);
  int32_t ids[3] = {0, V > 1 ? V - 1 : 0, V / 2};
  float *lg = NULL;
  if (smelt_eval_logits(m, ids, 3, &lg) == SMELT_OK) {
    c->evals++;
    volatile float sink = 0;
    for (int64_t i = 0; i < 3 * (int64_t)V; i++) sink += lg[i]; /* ASan checks the whole array */
    (void)sink;
  } else {
    CHECK(lg == NULL && smelt_last_error()[0] != 0, "a failed evaluation left logits or no message");
  }
  free(lg);
  smelt_model_free(m);
}

int main(int argc, char **argv) {
  const int iters = argc > 1 ? atoi(argv[1]) : 60;
  const char *seed = getenv("SMELT_FUZZ_SEED");
  if (seed) g_rng = strtoull(seed, NULL, 0) | 1;
  char root[] = "/tmp/smelt-modelfuzz-XXXXXX";
  if (!mkdtemp(root)) return 2;
  size_t nf;
  const sm_family *const *all = sm_family_all(&nf);
  int made = 0;
  counts tot = {0, 0};
  int tried = 0;
  for (size_t fi = 0; fi < nf; fi++) {
    if (!all[fi]->recipe) continue;
    const char *fam = all[fi]->model_type;
    char good[700], bad[700], p[800], q[800];
    snprintf(good, sizeof good, "%s/%s", root, fam);
    sm_synth_shape sh = {"fuzz", 64, 2, 4, 2, 128, 300, false, fam, 16, NULL};
    if (sm_make_synthetic(&sh, 4, 32, good, false) != SMELT_OK) continue; /* not every family takes this shape */
    made++;
    counts c0 = {0, 0};
    check_load(good, &c0);
    CHECK(c0.loads == 1 && c0.evals == 1, "%s: the unmutated model does not run: %s", fam, smelt_last_error());
    snprintf(bad, sizeof bad, "%s/%s-bad", root, fam);
    snprintf(p, sizeof p, "mkdir -p '%s'", bad);
    if (system(p)) return 2;
    size_t clen, slen;
    snprintf(p, sizeof p, "%s/config.json", good);
    char *cfg = read_all(p, &clen);
    snprintf(p, sizeof p, "%s/model.safetensors", good);
    char *st = read_all(p, &slen);
    if (!cfg || !st) return 2;
    snprintf(q, sizeof q, "%s/model.safetensors", bad);
    for (int it = 0; it < iters; it++) {
      const int what = (int)rn(4); /* 0, 1: config; 2: tensors; 3: both */
      cJSON *root_cfg = cJSON_Parse(cfg);
      if (what != 2) mutate_config(root_cfg);
      char *txt = cJSON_PrintUnformatted(root_cfg);
      cJSON_Delete(root_cfg);
      snprintf(p, sizeof p, "%s/config.json", bad);
      write_all(p, txt, strlen(txt));
      free(txt);
      char *mst = NULL;
      if (what >= 2 && mutate_safetensors(st, slen, &mst)) {
        write_all(q, mst, slen);
        free(mst);
      } else {
        write_all(q, st, slen);
      }
      check_load(bad, &tot);
      tried++;
    }
    free(cfg);
    free(st);
  }
  printf("%d families, %d mutants: %d loaded, %d evaluated\n", made, tried, tot.loads, tot.evals);
  CHECK(made >= 20, "only %d families made a tiny model", made);
  CHECK(tot.loads > 0 && tot.loads < tried, "no variety: %d of %d loaded", tot.loads, tried);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
  TEST_END();
}
