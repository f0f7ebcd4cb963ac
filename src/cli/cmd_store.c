/* smelt inspect | list | rm | arch | pull — see docs/store.md. */
#include "cli/cli.h"
#include "model/family.h"
#include "store/store.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse_int(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 0 || v > 100000000) return -1;
  *out = (int)v;
  return 0;
}

static const char *need_arg(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    fprintf(stderr, "smelt %s: %s needs a value\n", argv[0], argv[*i]);
    return NULL;
  }
  return argv[++*i];
}

static void print_json(cJSON *j) {
  char *t = cJSON_Print(j);
  puts(t);
  free(t);
  cJSON_Delete(j);
}

/* ---- inspect ---- */
static void inspect_usage(FILE *f) {
  fprintf(f, "usage: smelt inspect -m MODEL [--max-tokens N] [-ctk f16|bf16|f32|q8_0|q4_0] [--device cpu|cuda]\n"
             "                     [-tp N | -pp N] [--json]\n"
             "Memory estimate: weights, KV cache for N tokens (in the cache type of -ctk / --cache-type-k,\n"
             "also --kv-dtype; default f16, as run and serve use), the recurrent state of hybrid models,\n"
             "runtime headroom, available memory. -tp N (--tensor-parallel): whether the model splits over N\n"
             "devices and what the largest rank needs, against one device's memory; -pp N (--pipeline-parallel):\n"
             "the same for its layers in N stages.\n"
             "Exit status: 0 FITS (or available memory unknown), 1 DOES NOT FIT or DOES NOT SPLIT, 2 error.\n");
}

int sm_cmd_inspect(int argc, char **argv) {
  const char *model = NULL, *ctk = NULL, *ctv = NULL, *device = "cpu";
  int max_tokens = 0, tp = 1, pp = 1;
  bool json = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      inspect_usage(stdout);
      return 0;
    } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
      if (!(model = need_arg(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--max-tokens") || !strcmp(a, "-n") || !strcmp(a, "--ctx")) {
      if (!(v = need_arg(argc, argv, &i))) return 2;
      if (parse_int(v, &max_tokens) || max_tokens <= 0) {
        fprintf(stderr, "smelt inspect: bad --max-tokens '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--kv-dtype") || !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k")) {
      if (!(ctk = need_arg(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) {
      if (!(ctv = need_arg(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "--device")) {
      if (!(device = need_arg(argc, argv, &i))) return 2;
    } else if (!strcmp(a, "-tp") || !strcmp(a, "--tensor-parallel")) {
      if (!(v = need_arg(argc, argv, &i))) return 2;
      if (parse_int(v, &tp) || tp < 1 || tp > 16) {
        fprintf(stderr, "smelt inspect: --tensor-parallel '%s': expected 1 to 16\n", v);
        return 2;
      }
    } else if (!strcmp(a, "-pp") || !strcmp(a, "--pipeline-parallel")) {
      if (!(v = need_arg(argc, argv, &i))) return 2;
      if (parse_int(v, &pp) || pp < 1 || pp > 16) {
        fprintf(stderr, "smelt inspect: --pipeline-parallel '%s': expected 1 to 16\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--json")) json = true;
    else if (a[0] != '-' && !model) model = a;
    else {
      fprintf(stderr, "smelt inspect: unknown option '%s'\n", a);
      inspect_usage(stderr);
      return 2;
    }
  }
  smelt_kv_type kvt = SMELT_KV_F16;
  if (sm_cli_kv_type("inspect", ctk, ctv, &kvt)) return 2;
  const char *kvd = smelt_kv_type_name(kvt);
  bool cuda;
  if (!strcmp(device, "cpu")) cuda = false;
  else if (!strcmp(device, "cuda") || !strcmp(device, "gpu")) cuda = true;
  else {
    fprintf(stderr, "smelt inspect: --device must be cpu or cuda (got '%s')\n", device);
    return 2;
  }

  char *dir = NULL;
  smelt_status s = sm_store_resolve(model, false, &dir);
  if (s) {
    fprintf(stderr, "smelt inspect: %s\n", sm_errmsg());
    return 2;
  }
  sm_mem_estimate e;
  s = sm_store_estimate(dir, max_tokens, kvt, cuda, &e);
  if (tp > 1 && pp > 1) {
    fprintf(stderr, "smelt inspect: -tp and -pp: one or the other\n");
    free(dir);
    return 2;
  }
  if (!s && tp > 1) s = sm_store_estimate_split(dir, tp, &e);
  if (!s && pp > 1) s = sm_store_estimate_stages(dir, pp, &e);
  const int ranks = tp > 1 ? tp : pp;
  if (s) {
    fprintf(stderr, "smelt inspect: %s\n", sm_errmsg());
    free(dir);
    return 2;
  }
  const char *verdict = e.split_error[0]   ? "DOES NOT SPLIT"
                      : !e.available_known ? "UNKNOWN"
                                           : (e.fits ? "FITS" : "DOES NOT FIT");
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", dir);
    cJSON_AddStringToObject(j, "arch", e.arch);
    cJSON_AddBoolToObject(j, "arch_supported", (sm_family_runnable(e.arch) != NULL));
    cJSON_AddNumberToObject(j, "n_layers", e.n_layers);
    cJSON_AddNumberToObject(j, "n_heads", e.n_heads);
    cJSON_AddNumberToObject(j, "n_kv_heads", e.n_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", e.head_dim);
    cJSON_AddNumberToObject(j, "hidden_size", e.hidden);
    cJSON_AddNumberToObject(j, "intermediate_size", e.intermediate);
    cJSON_AddNumberToObject(j, "vocab_size", e.vocab);
    cJSON_AddNumberToObject(j, "quant_bits", e.quant_bits);
    cJSON_AddNumberToObject(j, "quant_group_size", e.quant_group);
    cJSON_AddStringToObject(j, "quant_mode", e.quant_bits ? sm_qmode_name((sm_qmode)e.quant_mode) : "none");
    cJSON_AddNumberToObject(j, "n_tensors", (double)e.n_tensors);
    cJSON_AddNumberToObject(j, "n_params", (double)e.n_params);
    cJSON_AddNumberToObject(j, "n_active_params", (double)e.n_active_params);
    cJSON_AddNumberToObject(j, "n_experts", e.n_experts);
    cJSON_AddNumberToObject(j, "experts_per_token", e.top_k);
    cJSON_AddNumberToObject(j, "active_weight_bytes", (double)e.active_bytes);
    cJSON_AddNumberToObject(j, "weights_bytes", (double)e.weights_bytes);
    cJSON_AddNumberToObject(j, "vision_tensors", (double)e.n_vision_tensors);
    cJSON_AddNumberToObject(j, "vision_bytes", (double)e.vision_bytes);
    cJSON_AddNumberToObject(j, "vision_params", (double)e.vision_params);
    cJSON_AddStringToObject(j, "kv_dtype", kvd);
    cJSON_AddNumberToObject(j, "max_tokens", e.max_tokens);
    cJSON_AddNumberToObject(j, "kv_bytes_per_token", (double)e.kv_bytes_per_token);
    cJSON_AddNumberToObject(j, "kv_bytes", (double)e.kv_bytes);
    cJSON_AddNumberToObject(j, "attn_layers", e.attn_layers);
    cJSON_AddNumberToObject(j, "state_bytes_per_sequence", (double)e.state_bytes);
    cJSON_AddNumberToObject(j, "activation_bytes", (double)e.activation_bytes);
    cJSON_AddNumberToObject(j, "runtime_bytes", (double)e.runtime_bytes);
    cJSON_AddNumberToObject(j, "total_bytes", (double)e.total_bytes);
    cJSON_AddStringToObject(j, "device", cuda ? "cuda" : "cpu");
    cJSON_AddNumberToObject(j, "tensor_parallel", tp);
    cJSON_AddNumberToObject(j, "pipeline_parallel", pp);
    if (ranks > 1) {
      cJSON_AddNumberToObject(j, "rank_weights_bytes", (double)e.rank_weights_bytes);
      cJSON_AddNumberToObject(j, "rank_kv_bytes", (double)e.rank_kv_bytes);
      cJSON_AddNumberToObject(j, "rank_total_bytes", (double)e.rank_total_bytes);
      if (e.split_error[0]) cJSON_AddStringToObject(j, "split_error", e.split_error);
      else cJSON_AddNullToObject(j, "split_error");
    }
    if (e.available_known) cJSON_AddNumberToObject(j, "available_bytes", (double)e.available_bytes);
    else cJSON_AddNullToObject(j, "available_bytes");
    cJSON_AddBoolToObject(j, "fits", e.fits);
    cJSON_AddStringToObject(j, "verdict", verdict);
    print_json(j);
  } else {
    char b1[32], b2[32], b3[32];
    printf("model        %s\n", dir);
    printf("arch         %s%s\n", e.arch[0] ? e.arch : "?",
           (sm_family_runnable(e.arch) != NULL) ? "" : " (not supported)");
    printf("shape        %d layers, %d heads, %d kv heads, head dim %d, hidden %d, ffn %d, vocab %d\n", e.n_layers,
           e.n_heads, e.n_kv_heads, e.head_dim, e.hidden, e.intermediate, e.vocab);
    if (e.quant_bits && e.quant_mode)
      printf("quantization %s (%d-bit, group size %d)\n", sm_qmode_name((sm_qmode)e.quant_mode), e.quant_bits,
             e.quant_group);
    else if (e.quant_bits) printf("quantization %d-bit, group size %d\n", e.quant_bits, e.quant_group);
    else printf("quantization none\n");
    if (e.n_params >= 1000000000ull)
      printf("parameters   %.2f B (%llu)\n", (double)e.n_params / 1e9, (unsigned long long)e.n_params);
    else printf("parameters   %.2f M (%llu)\n", (double)e.n_params / 1e6, (unsigned long long)e.n_params);
    if (e.n_experts > 0) {
      const bool bn = e.n_active_params >= 1000000000ull;
      printf("experts      %d, %d per token: %.2f %s parameters active (%llu)\n", e.n_experts, e.top_k,
             (double)e.n_active_params / (bn ? 1e9 : 1e6), bn ? "B" : "M", (unsigned long long)e.n_active_params);
      printf("weights      %s (%zu tensors); %s read per token\n", sm_store_fmt_bytes(e.weights_bytes, b1, 32),
             e.n_tensors, sm_store_fmt_bytes(e.active_bytes, b2, 32));
    } else {
      printf("weights      %s (%zu tensors)\n", sm_store_fmt_bytes(e.weights_bytes, b1, 32), e.n_tensors);
    }
    if (e.n_vision_tensors)
      printf("vision       %s, %.2f M parameters (%zu tensors, in the weights above)\n",
             sm_store_fmt_bytes(e.vision_bytes, b1, 32), (double)e.vision_params / 1e6, e.n_vision_tensors);
    printf("KV cache     %s: %llu B/token x %d tokens = %s", kvd, (unsigned long long)e.kv_bytes_per_token,
           e.max_tokens, sm_store_fmt_bytes(e.kv_bytes, b2, 32));
    if (e.attn_layers != e.n_layers) printf(" (attention layers: %d of %d)", e.attn_layers, e.n_layers);
    printf("\n");
    if (e.state_bytes)
      printf("state        %s a sequence (recurrent layers, float32) x %d slots\n",
             sm_store_fmt_bytes(e.state_bytes, b3, 32), e.state_slots);
    printf("runtime      %s (activations %s + 10%%)\n", sm_store_fmt_bytes(e.runtime_bytes, b1, 32),
           sm_store_fmt_bytes(e.activation_bytes, b3, 32));
    printf("total        %s\n", sm_store_fmt_bytes(e.total_bytes, b1, 32));
    const char *unit = tp > 1 ? "ranks" : "stages";
    if (ranks > 1 && e.split_error[0]) printf("split        over %d %s: %s\n", ranks, unit, e.split_error);
    else if (ranks > 1)
      printf("split        over %d %s: %s weights + %s KV cache + runtime = %s for the largest rank\n", ranks, unit,
             sm_store_fmt_bytes(e.rank_weights_bytes, b1, 32), sm_store_fmt_bytes(e.rank_kv_bytes, b2, 32),
             sm_store_fmt_bytes(e.rank_total_bytes, b3, 32));
    if (e.available_known)
      printf("available    %s (%s)\n", sm_store_fmt_bytes(e.available_bytes, b2, 32),
             getenv("SMELT_AVAILABLE_MEMORY") && *getenv("SMELT_AVAILABLE_MEMORY")
               ? "SMELT_AVAILABLE_MEMORY"
               : (cuda ? "free device memory" : "MemAvailable"));
    else printf("available    unknown (%s)\n", cuda ? "no CUDA memory query in this build" : "no /proc/meminfo");
    printf("verdict      %s\n", verdict);
  }
  free(dir);
  return e.fits && !e.split_error[0] ? 0 : 1;
}

/* ---- list ---- */
int sm_cmd_list(int argc, char **argv) {
  bool json = false, quiet = false, verbose = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--json")) json = true;
    else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = true;
    else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) verbose = true;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("usage: smelt list [--json | -q | -v]\nThe built-in models, and the models in the store (%s) and the "
             "Hugging Face cache.\n",
             "$SMELT_CACHE_DIR/models");
      return 0;
    } else {
      fprintf(stderr, "smelt list: unknown option '%s'\n", a);
      return 2;
    }
  }
  sm_store_entry *e, *b;
  size_t n, nb;
  if (sm_store_list(&e, &n) || sm_store_list_builtin(&b, &nb)) {
    fprintf(stderr, "smelt list: %s\n", sm_errmsg());
    return 1;
  }
  /* built-in models first */
  e = sm_xrealloc(e, sizeof *e * (n + nb + 1));
  memmove(e + nb, e, sizeof *e * n);
  memcpy(e, b, sizeof *e * nb);
  free(b);
  const size_t n_store = n;
  n += nb;
  if (json) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "name", e[i].name);
      cJSON_AddStringToObject(o, "path", e[i].path);
      cJSON_AddStringToObject(o, "source", e[i].source);
      cJSON_AddNumberToObject(o, "size_bytes", (double)e[i].size_bytes);
      cJSON_AddStringToObject(o, "arch", e[i].arch);
      cJSON_AddNumberToObject(o, "bits", e[i].bits);
      cJSON_AddNumberToObject(o, "group_size", e[i].group_size);
      cJSON_AddBoolToObject(o, "supported", e[i].supported);
      cJSON_AddItemToArray(arr, o);
    }
    print_json(arr);
  } else if (quiet) {
    for (size_t i = 0; i < n; i++) puts(e[i].name);
  } else {
    printf("%-48s %10s  %-10s %-6s %s\n", "NAME", "SIZE", "ARCH", "QUANT", "SOURCE");
    for (size_t i = 0; i < n; i++) {
      char b[32], q[16];
      if (e[i].bits) snprintf(q, sizeof q, "%d-bit", e[i].bits);
      else snprintf(q, sizeof q, "-");
      printf("%-48s %10s  %-10s %-6s %s%s\n", e[i].name, sm_store_fmt_bytes(e[i].size_bytes, b, 32),
             e[i].arch[0] ? e[i].arch : "?", q, e[i].source, e[i].supported ? "" : " (unsupported arch)");
      if (verbose) printf("    %s\n", e[i].path);
    }
    if (n_store == 0) {
      char *root = sm_store_root(), *hf = sm_store_hf_cache();
      fprintf(stderr, "no models in %s or %s; try `smelt pull Qwen3-0.6B-4bit`\n", root, hf);
      free(root);
      free(hf);
    }
  }
  sm_store_list_free(e, n);
  return 0;
}

/* ---- rm ---- */
int sm_cmd_rm(int argc, char **argv) {
  bool yes = false;
  int n_names = 0, rc = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-y") || !strcmp(argv[i], "--yes")) yes = true;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: smelt rm [--yes] NAME...\nRemove models from the store (never the Hugging Face cache).\n"
             "Asks for confirmation on a terminal unless --yes.\n");
      return 0;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "smelt rm: unknown option '%s'\n", argv[i]);
      return 2;
    } else n_names++;
  }
  if (!n_names) {
    fprintf(stderr, "usage: smelt rm [--yes] NAME...\n");
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    if (argv[i][0] == '-' && argv[i][1]) continue;
    char *dir = NULL;
    if (sm_store_locate_removable(argv[i], &dir)) {
      fprintf(stderr, "smelt rm: %s\n", sm_errmsg());
      rc = 1;
      continue;
    }
    if (!yes && isatty(0)) {
      char b[32], line[64];
      fprintf(stderr, "remove %s (%s)? [y/N] ", dir, sm_store_fmt_bytes(sm_store_dir_size(dir), b, 32));
      fflush(stderr);
      if (!fgets(line, sizeof line, stdin) || (line[0] != 'y' && line[0] != 'Y')) {
        fprintf(stderr, "kept %s\n", dir);
        free(dir);
        continue;
      }
    }
    if (sm_store_remove(dir)) {
      fprintf(stderr, "smelt rm: %s\n", sm_errmsg());
      rc = 1;
    } else fprintf(stderr, "removed %s\n", dir);
    free(dir);
  }
  return rc;
}

/* ---- arch ---- */
/* `smelt arch`: what the family registry runs (src/model/family.h), the vision-language packagings
 * whose text model it runs, and the known families it does not run, with the reason */
int sm_cmd_arch(int argc, char **argv) {
  bool json = argc > 1 && !strcmp(argv[1], "--json");
  size_t n, nv;
  const sm_family *const *fams = sm_family_all(&n);
  const sm_vlm_packaging *const *vlms = sm_vlm_all(&nv);
#ifdef SMELT_HAVE_CUDA
  const bool cuda = true;
#else
  const bool cuda = false;
#endif
  if (json) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
      const bool run = fams[i]->recipe != NULL;
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "model_type", fams[i]->model_type);
      cJSON_AddStringToObject(o, "kind", "text");
      cJSON_AddStringToObject(o, "description", fams[i]->description);
      cJSON_AddStringToObject(o, "example", fams[i]->example ? fams[i]->example : "");
      cJSON_AddBoolToObject(o, "runnable", run);
      cJSON_AddBoolToObject(o, "cpu", run);
      cJSON_AddBoolToObject(o, "cuda", run && cuda);
      cJSON *al = cJSON_AddArrayToObject(o, "aliases");
      for (const char *const *a = fams[i]->aliases; a && *a; a++) cJSON_AddItemToArray(al, cJSON_CreateString(*a));
      if (fams[i]->notes) cJSON_AddStringToObject(o, "notes", fams[i]->notes);
      if (run) {
        cJSON *q = cJSON_AddArrayToObject(o, "quantization");
        cJSON_AddItemToArray(q, cJSON_CreateString("dense f32/f16/bf16"));
        cJSON_AddItemToArray(q, cJSON_CreateString("affine 2/3/4/5/6/8-bit"));
      }
      cJSON_AddItemToArray(arr, o);
    }
    for (size_t i = 0; i < nv; i++) {
      const bool run = sm_family_type_runnable(vlms[i]->model_type);
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "model_type", vlms[i]->model_type);
      cJSON_AddStringToObject(o, "kind", "vision-language");
      cJSON_AddStringToObject(o, "description", vlms[i]->description);
      cJSON_AddStringToObject(o, "example", vlms[i]->example ? vlms[i]->example : "");
      cJSON_AddBoolToObject(o, "runnable", run);
      cJSON_AddBoolToObject(o, "cpu", run);
      cJSON_AddBoolToObject(o, "cuda", run && cuda);
      cJSON_AddStringToObject(o, "notes",
                              sm_vlm_images(vlms[i]->model_type)
                                ? "image input through the checkpoint's vision tower (src/vision)"
                                : "text model only: image input is not supported");
      cJSON_AddItemToArray(arr, o);
    }
    print_json(arr);
    return 0;
  }
  printf("%-16s %-70s %-4s %-5s %s\n", "ARCH", "MODELS", "CPU", "CUDA", "EXAMPLE");
  for (size_t i = 0; i < n; i++)
    if (fams[i]->recipe) {
      printf("%-16s %-70s %-4s %-5s %s\n", fams[i]->model_type, fams[i]->description, "yes", cuda ? "yes" : "no*",
             fams[i]->example ? fams[i]->example : "");
      if (fams[i]->notes) printf("%-16s   note: %s\n", "", fams[i]->notes);
    }
  printf("\nVision-language checkpoints (images through their vision tower where marked):\n");
  for (size_t i = 0; i < nv; i++)
    if (sm_family_type_runnable(vlms[i]->model_type)) {
      printf("%-16s %-70s %-4s %-5s %s\n", vlms[i]->model_type, vlms[i]->description, "yes", cuda ? "yes" : "no*",
             vlms[i]->example ? vlms[i]->example : "");
      printf("%-16s   images: %s\n", "", sm_vlm_images(vlms[i]->model_type) ? "yes" : "no (text model only)");
    }
  printf("\nKnown, not runnable:\n");
  for (size_t i = 0; i < n; i++)
    if (!fams[i]->recipe)
      printf("%-16s %s: %s\n", fams[i]->model_type, fams[i]->description, fams[i]->notes ? fams[i]->notes : "");
  printf("\nWeights: MLX safetensors, dense f32/f16/bf16, affine-quantized 2/3/4/5/6/8-bit (group 32/64/128) or\n"
         "mxfp4/mxfp8/nvfp4, per module.\n");
  if (!cuda) printf("* this smelt was built without CUDA.\n");
  return 0;
}

/* ---- pull ---- */
int sm_cmd_pull(int argc, char **argv) {
  bool quiet = false;
  const char *ref = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-q") || !strcmp(argv[i], "--quiet")) quiet = true;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: smelt pull [-q] [owner/]name\nDownload a model from the Hugging Face hub "
             "(HF_ENDPOINT, HF_TOKEN) into the store; bare names are mlx-community/<name>.\n"
             "Interrupted downloads resume on the next pull. Prints the model directory.\n");
      return 0;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "smelt pull: unknown option '%s'\n", argv[i]);
      return 2;
    } else if (!ref) ref = argv[i];
    else {
      fprintf(stderr, "smelt pull: one model at a time\n");
      return 2;
    }
  }
  if (!ref) {
    fprintf(stderr, "usage: smelt pull [-q] [owner/]name\n");
    return 2;
  }
  char *dir = NULL;
  if (sm_store_pull(ref, !quiet, &dir)) {
    fprintf(stderr, "smelt pull: %s\n", sm_errmsg());
    return 1;
  }
  puts(dir);
  free(dir);
  return 0;
}
