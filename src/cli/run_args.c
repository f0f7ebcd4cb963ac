/* Options of smelt run / generate (llama.cpp's spellings where they mean the same), loading the
 * model and the draft model, and where the prompt comes from. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/strbuf.h"
#include "cli/args.h"
#include "cli/run.h"
#include "model/family.h"
#include "store/store.h"

#define MAX_THREADS 256 /* the CPU backend's thread pool limit */
#define MAX_CTX (1 << 24)

static bool parse_seed(const char *v, void *dst, char *err, size_t n) {
  if (!strcmp(v, "-1")) {
    *(uint64_t *)dst = 0;
    return true;
  } /* llama.cpp: -1 = random */
  char *end;
  errno = 0;
  unsigned long long s = strtoull(v, &end, 10);
  if (!*v || *end || v[0] == '-' || errno == ERANGE) {
    snprintf(err, n, "'%s' is not a seed (0 to 18446744073709551615, or -1 for a random one)", v);
    return false;
  }
  *(uint64_t *)dst = s;
  return true;
}

static bool parse_device(const char *v, void *dst, char *err, size_t n) {
  smelt_device *d = dst;
  if (!strcmp(v, "auto")) *d = SMELT_DEVICE_AUTO;
  else if (!strcmp(v, "cpu")) *d = SMELT_DEVICE_CPU;
  else if (!strcmp(v, "cuda") || !strcmp(v, "gpu")) *d = SMELT_DEVICE_CUDA;
  else {
    snprintf(err, n, "'%s' is not a device (auto, cpu, cuda)", v);
    return false;
  }
  return true;
}

static bool parse_overflow(const char *v, void *dst, char *err, size_t n) {
  if (!strcmp(v, "drop")) *(int *)dst = SM_OVERFLOW_DROP;
  else if (!strcmp(v, "error")) *(int *)dst = SM_OVERFLOW_ERROR;
  else {
    snprintf(err, n, "'%s' is not a policy (drop, error)", v);
    return false;
  }
  return true;
}

static bool parse_kv(const char *v, void *dst, char *err, size_t n) {
  if (smelt_kv_type_parse(v, dst) == SMELT_OK) return true;
  snprintf(err, n, "'%s' is not a KV cache type (f16, bf16, f32, q8_0, q4_0)", v);
  return false;
}

static bool parse_numa(const char *v, void *dst, char *err, size_t n) {
  smelt_numa m;
  if (smelt_numa_parse(v, &m) == SMELT_OK) {
    *(int *)dst = (int)m;
    return true;
  }
  snprintf(err, n, "'%s' is not a NUMA mode (none, distribute, isolate)", v);
  return false;
}

/* -ngl N | all | auto | max: smelt runs every layer on one device */
static bool parse_ngl(const char *v, void *dst, char *err, size_t n) {
  if (!strcmp(v, "all") || !strcmp(v, "auto") || !strcmp(v, "max")) {
    *(int *)dst = -1;
    return true;
  }
  char *end;
  long x = strtol(v, &end, 10);
  if (!*v || *end || x < -1 || x > 100000) {
    snprintf(err, n, "'%s' is not a layer count (0 to 100000, -1 or all)", v);
    return false;
  }
  *(int *)dst = (int)x;
  return true;
}

static bool parse_image(const char *v, void *dst, char *err, size_t n) {
  run_opts *o = dst;
  if (o->n_images == SM_RUN_MAX_IMAGES) {
    snprintf(err, n, "at most %d images", SM_RUN_MAX_IMAGES);
    return false;
  }
  if (!*v) {
    snprintf(err, n, "needs an image file");
    return false;
  }
  o->images[o->n_images++] = v;
  return true;
}

static const char k_usage_run[] =
  "[MODEL] [PROMPT] [options]\n"
  "Chat with a model: a REPL on a terminal; one reply to PROMPT, -p, -f FILE or piped stdin otherwise.\n"
  "MODEL: a built-in name (smelt-tiny, smelt-tiny-draft), a directory, owner/name or a bare hub name;\n"
  "default: the built-in smelt-tiny. See docs/cli.md.";
static const char k_usage_gen[] =
  "[MODEL] [PROMPT] [options]\n"
  "Raw text completion of PROMPT (-p, -f FILE, or piped stdin): no chat template. See docs/cli.md.";

int sm_run_parse(const char *cmd, int argc, char **argv, run_opts *o) {
  memset(o, 0, sizeof *o);
  o->draft_n = 4;
  smelt_sampling_default(&o->s);
  bool run = !strcmp(cmd, "run");
  const sm_arg args[] = {
    {.names = "-m|--model",
     .kind = SM_ARG_STR,
     .dst = &o->model,
     .meta = "MODEL",
     .help = "model (also the first argument)"},
    {.names = "-p|--prompt",
     .kind = SM_ARG_STR,
     .dst = &o->prompt,
     .meta = "TEXT",
     .help = run ? "one message, one reply (also the second argument)" : "the text to continue"},
    {.names = "-f|--file",
     .kind = SM_ARG_STR,
     .dst = &o->file,
     .meta = "FILE",
     .help = "the prompt from a file (- = stdin)"},
    {.names = "-sys|--system-prompt|--system",
     .kind = SM_ARG_STR,
     .dst = &o->system,
     .meta = "TEXT",
     .help = "system message (run)"},
    {.names = "--chat-template",
     .kind = SM_ARG_STR,
     .dst = &o->chat_template,
     .meta = "FILE|NAME",
     .help = "a Jinja chat template file, or a name: one of the tokenizer's, chatml, raw"},
    {.names = "--raw|-no-cnv|--no-conversation",
     .kind = SM_ARG_FLAG,
     .dst = &o->raw,
     .help = "run: no chat template, the text as it is"},
    {.names = "-n|--n-predict|--predict|--max-tokens",
     .kind = SM_ARG_INT,
     .dst = &o->n_predict,
     .lo = -1,
     .hi = 1e9,
     .meta = "N",
     .help =
       "tokens to generate at most, -1: until EOS or the context is full (default: generation_config.json's max_new_tokens, else -1 for run, 256 for generate)",
     .seen = &o->n_predict_set},
    {.names = "--ignore-eos",
     .kind = SM_ARG_FLAG,
     .dst = &o->ignore_eos,
     .help = "keep generating after end-of-sequence tokens"},
    {.names = "--image",
     .kind = SM_ARG_FN,
     .dst = o,
     .meta = "FILE",
     .help =
       "an image (PNG, JPEG, WebP) for vision-language models, repeatable: run: with the first message; generate: at each image marker of the prompt, else before it",
     .fn = parse_image},
    {.kind = SM_ARG_SECTION, .help = "Sampling:"},
    {.names = "--temp|--temperature",
     .kind = SM_ARG_FLOAT,
     .dst = &o->s.temperature,
     .hi = 100,
     .meta = "T",
     .help = "temperature, 0 = greedy (default: generation_config.json, else 0.7 for run, 0 for generate)",
     .seen = &o->temp_set},
    {.names = "--top-k",
     .kind = SM_ARG_INT,
     .dst = &o->s.top_k,
     .hi = 1e9,
     .meta = "K",
     .help = "keep the K most likely tokens (0 = off)",
     .seen = &o->top_k_set},
    {.names = "--top-p",
     .kind = SM_ARG_FLOAT,
     .dst = &o->s.top_p,
     .lo = 1e-6,
     .hi = 1,
     .meta = "P",
     .help = "nucleus sampling (1 = off)",
     .seen = &o->top_p_set},
    {.names = "--min-p",
     .kind = SM_ARG_FLOAT,
     .dst = &o->s.min_p,
     .hi = 1,
     .meta = "P",
     .help = "drop tokens below P x the top probability (0 = off)"},
    {.names = "--repeat-penalty",
     .kind = SM_ARG_FLOAT,
     .dst = &o->s.repetition_penalty,
     .lo = 1e-3,
     .hi = 100,
     .meta = "R",
     .help = "divide logits of recent tokens by R (1 = off; default: generation_config.json)",
     .seen = &o->rep_set},
    {.names = "--repeat-last-n",
     .kind = SM_ARG_INT,
     .dst = &o->s.penalty_last_n,
     .hi = MAX_CTX,
     .meta = "N",
     .help = "tokens the penalties look back (0 = all)"},
    {.names = "--frequency-penalty",
     .kind = SM_ARG_FLOAT,
     .dst = &o->s.frequency_penalty,
     .lo = -2,
     .hi = 2,
     .meta = "F",
     .help = "OpenAI-style frequency penalty"},
    {.names = "--presence-penalty",
     .kind = SM_ARG_FLOAT,
     .dst = &o->s.presence_penalty,
     .lo = -2,
     .hi = 2,
     .meta = "P",
     .help = "OpenAI-style presence penalty"},
    {.names = "-s|--seed",
     .kind = SM_ARG_FN,
     .dst = &o->s.seed,
     .meta = "N",
     .help = "random seed (-1 or absent: random)",
     .fn = parse_seed},
    {.kind = SM_ARG_SECTION, .help = "Model and device:"},
    {.names = "-c|--ctx-size",
     .kind = SM_ARG_INT,
     .dst = &o->ctx,
     .hi = MAX_CTX,
     .meta = "N",
     .help = "context tokens (default: the model's, at most 8192; more than the model's needs --force-context)"},
    {.names = "--force-context",
     .kind = SM_ARG_FLAG,
     .dst = &o->force_ctx,
     .help = "allow -c beyond the model's trained context (warns: quality drops)"},
    {.names = "--context-overflow",
     .kind = SM_ARG_FN,
     .dst = &o->overflow,
     .meta = "drop|error",
     .help = "run: when the conversation fills the context, drop the oldest turns (default) or stop with an error",
     .fn = parse_overflow},
    {.names = "-t|--threads",
     .kind = SM_ARG_INT,
     .dst = &o->threads,
     .lo = 1,
     .hi = MAX_THREADS,
     .meta = "N",
     .help = "CPU threads (default: all cores)"},
    {.names = "-tp|--tensor-parallel",
     .kind = SM_ARG_INT,
     .dst = &o->tp,
     .lo = 1,
     .hi = 16,
     .meta = "N",
     .help = "split the model over N GPUs, one process each (docs/parallel.md)"},
    {.names = "-pp|--pipeline-parallel",
     .kind = SM_ARG_INT,
     .dst = &o->pp,
     .lo = 1,
     .hi = 16,
     .meta = "N",
     .help = "split the model's layers in N stages over N GPUs, one process each (docs/parallel.md)"},
    {.names = "--nnodes",
     .kind = SM_ARG_INT,
     .dst = &o->nnodes,
     .lo = 1,
     .hi = 16,
     .meta = "N",
     .help = "with -tp or -pp: the ranks on N hosts, each started with the same command and its --node-rank"},
    {.names = "--node-rank",
     .kind = SM_ARG_INT,
     .dst = &o->node_rank,
     .lo = 0,
     .hi = 15,
     .meta = "R",
     .help = "this host's index (0: the one that runs rank 0 and answers; the others run ranks only)"},
    {.names = "--master-addr",
     .kind = SM_ARG_STR,
     .dst = &o->master_addr,
     .meta = "HOST:PORT",
     .help = "where node 0 listens for the other hosts' ranks"},
    {.names = "--cpu-mask|-C|--cpu-range|-Cr",
     .kind = SM_ARG_STR,
     .dst = &o->cpu_mask,
     .meta = "M",
     .help = "pin the CPU threads, one CPU each in order: hex mask (0xff) or list (0-7,16-23)"},
    {.names = "--numa",
     .kind = SM_ARG_FN,
     .dst = &o->numa,
     .meta = "distribute|isolate|none",
     .help = "CPU threads over NUMA nodes: spread them (distribute) or keep them on this node (isolate)",
     .fn = parse_numa},
    {.names = "--poll",
     .kind = SM_ARG_INT,
     .dst = &o->poll,
     .hi = 100,
     .meta = "0..100",
     .help = "how long idle CPU threads busy-wait for work (default 50 = 2 ms; 0 = sleep at once)",
     .seen = &o->poll_set},
    {.names = "--device",
     .kind = SM_ARG_FN,
     .dst = &o->device,
     .meta = "auto|cpu|cuda",
     .help = "where to run (default auto: CUDA when there is a GPU)",
     .fn = parse_device,
     .seen = &o->device_set},
    {.names = "-ngl|--n-gpu-layers|--gpu-layers",
     .kind = SM_ARG_FN,
     .dst = &o->ngl,
     .meta = "N",
     .help =
       "0 = run on the CPU; any other value (e.g. 99, all) = the GPU when there is one (-tp N splits a model over GPUs)",
     .fn = parse_ngl,
     .seen = &o->ngl_set},
    {.names = "--kv-type|-ctk|--cache-type-k",
     .kind = SM_ARG_FN,
     .dst = &o->kv_k,
     .meta = "f16|bf16|f32|q8_0|q4_0",
     .help = "KV cache element type (default f16)",
     .fn = parse_kv,
     .seen = &o->kv_k_set},
    {.names = "-ctv|--cache-type-v",
     .kind = SM_ARG_FN,
     .dst = &o->kv_v,
     .meta = "f16|bf16|f32|q8_0|q4_0",
     .help = "the same (smelt has one type for K and V)",
     .fn = parse_kv,
     .seen = &o->kv_v_set},
    {.names = "-b|--batch-size",
     .kind = SM_ARG_INT,
     .dst = &o->batch,
     .lo = 1,
     .hi = 65536,
     .meta = "N",
     .help = "prompt tokens per forward step (default 512)"},
    {.names = "--no-mmap",
     .kind = SM_ARG_FLAG,
     .dst = &o->no_mmap,
     .help = "read the weights into memory instead of mapping the files"},
    {.names = "--deterministic",
     .kind = SM_ARG_FLAG,
     .dst = &o->deterministic,
     .help = "batch-invariant kernels (the same output as in a batch of any size; slower)"},
    {.names = "--estimate-memory",
     .kind = SM_ARG_FLAG,
     .dst = &o->estimate,
     .help = "check that weights + KV cache fit before loading"},
    {.names = "--force",
     .kind = SM_ARG_FLAG,
     .dst = &o->force,
     .help = "load even when --estimate-memory says it does not fit"},
    {.names = "-md|--model-draft|--draft-model",
     .kind = SM_ARG_STR,
     .dst = &o->draft,
     .meta = "MODEL",
     .help = "draft model for speculative decoding (same tokenizer), e.g. smelt-tiny-draft"},
    {.names = "--draft-max|--draft|--draft-n",
     .kind = SM_ARG_INT,
     .dst = &o->draft_n,
     .lo = 1,
     .hi = 32,
     .meta = "N",
     .help = "tokens the draft proposes per step (default 4)"},
    {.kind = SM_ARG_SECTION, .help = "Prompt cache:"},
    {.names = "--prompt-cache",
     .kind = SM_ARG_STR,
     .dst = &o->prompt_cache,
     .meta = "FILE",
     .help = "load the prompt's KV from FILE when it matches; save it there otherwise"},
    {.names = "--prompt-cache-ro",
     .kind = SM_ARG_FLAG,
     .dst = &o->prompt_cache_ro,
     .help = "use --prompt-cache but never write it"},
    {.kind = SM_ARG_SECTION, .help = "Output:"},
    {.names = "--no-stats", .kind = SM_ARG_FLAG, .dst = &o->no_stats, .help = "no speed/memory line on stderr"},
    {.names = "--history",
     .kind = SM_ARG_STR,
     .dst = &o->history,
     .meta = "FILE",
     .help = "run: REPL line history file (default ~/.cache/smelt/history; '' = none)"},
    {.kind = SM_ARG_SECTION, .help = "Accepted for llama.cpp compatibility, ignored (a notice says so):"},
    {.names = "-fa|--flash-attn",
     .kind = SM_ARG_IGNORED_OPTVALUE,
     .meta = "on|off|auto|1|0",
     .help = "attention is always fused in smelt"},
    {.names = "--jinja", .kind = SM_ARG_IGNORED, .help = "smelt always renders the model's Jinja chat template"},
    {.names = "--mlock", .kind = SM_ARG_IGNORED, .help = "smelt does not lock weights in memory"},
    {.names = "-cnv|--conversation|-i|--interactive",
     .kind = SM_ARG_IGNORED,
     .help = "smelt run is a conversation on a terminal"},
    {.names = "--color", .kind = SM_ARG_IGNORED, .help = "smelt does not color its output"},
    {.names = "--no-warmup", .kind = SM_ARG_IGNORED, .help = "smelt does not run a warm-up pass"},
    {.names = "-ub|--ubatch-size", .kind = SM_ARG_IGNORED_VALUE, .meta = "N", .help = "smelt has one batch size (-b)"},
  };
  const char *pos[2];
  int n_pos = 0;
  int r = sm_args_parse(cmd, args, (int)(sizeof args / sizeof args[0]), argc, argv, pos, 2, &n_pos,
                        run ? k_usage_run : k_usage_gen);
  if (r) return r;
  int k = 0;
  if (k < n_pos && !o->model) o->model = pos[k++];
  if (k < n_pos) {
    if (o->prompt || o->file) {
      fprintf(stderr, "smelt %s: a prompt is given twice (argument '%s' and %s)\n", cmd, pos[k],
              o->prompt ? "-p" : "-f");
      return 2;
    }
    o->prompt = pos[k++];
  }
  if (k < n_pos) {
    fprintf(stderr, "smelt %s: unexpected argument '%s'\n", cmd, pos[k]);
    return 2;
  }
  if (o->prompt && o->file) {
    fprintf(stderr, "smelt %s: -p and -f both give the prompt; use one\n", cmd);
    return 2;
  }
  if (o->kv_k_set && o->kv_v_set && o->kv_k != o->kv_v) {
    fprintf(stderr, "smelt %s: -ctk %s and -ctv %s differ; smelt has one KV cache type for K and V\n", cmd,
            smelt_kv_type_name(o->kv_k), smelt_kv_type_name(o->kv_v));
    return 2;
  }
  if (o->prompt_cache_ro && !o->prompt_cache) {
    fprintf(stderr, "smelt %s: --prompt-cache-ro needs --prompt-cache FILE\n", cmd);
    return 2;
  }
  if (o->prompt_cache && !o->prompt_cache[0]) {
    fprintf(stderr, "smelt %s: --prompt-cache needs a file name\n", cmd);
    return 2;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (o->threads > 0 && cores > 0 && o->threads > cores)
    fprintf(stderr, "smelt %s: note: -t %d is more than the %ld CPU cores; that is usually slower\n", cmd, o->threads,
            cores);
  return 0;
}

static bool load_one(const char *cmd, const run_opts *o, const char *ref, const char *what, smelt_model **m,
                     char **dir_out) {
  char *dir = NULL;
  if (sm_store_resolve(ref, true, &dir)) {
    fprintf(stderr, "smelt %s: %s%s\n", cmd, what, smelt_last_error());
    return false;
  }
  sm_config cfg;
  if (sm_family_config_load(dir, &cfg)) {
    fprintf(stderr, "smelt %s: %s%s\n", cmd, what, smelt_last_error());
    free(dir);
    return false;
  }
  const int trained = cfg.max_position_embeddings, layers = cfg.num_hidden_layers;
  sm_config_free(&cfg);
  if (o->ctx > 0 && trained > 0 && o->ctx > trained) {
    if (!o->force_ctx) {
      fprintf(stderr,
              "smelt %s: %s-c/--ctx-size %d is larger than the model's context (%d tokens, "
              "max_position_embeddings); --force-context uses it anyway\n",
              cmd, what, o->ctx, trained);
      free(dir);
      return false;
    }
    fprintf(stderr,
            "smelt %s: warning: %scontext %d is beyond the %d tokens the model was trained for; "
            "expect worse output past that\n",
            cmd, what, o->ctx, trained);
  }
  smelt_model_params p;
  smelt_model_params_default(&p);
  p.n_threads = o->threads;
  p.cpu_mask = o->cpu_mask;
  p.numa = (smelt_numa)o->numa;
  if (o->poll_set) p.cpu_poll = o->poll;
  p.max_context = o->ctx;
  p.no_mmap = o->no_mmap;
  p.deterministic = o->deterministic;
  p.tensor_parallel = *what ? 0 : o->tp; /* a draft model runs whole on rank 0's device */
  p.pipeline_parallel = *what ? 0 : o->pp;
  p.nnodes = *what ? 0 : o->nnodes;
  p.node_rank = o->node_rank;
  p.master_addr = o->master_addr;
  p.device = o->device;
  if (o->kv_k_set) p.kv_type = o->kv_k;
  else if (o->kv_v_set) p.kv_type = o->kv_v;
  if (o->ngl_set && !o->device_set) {
    p.device = o->ngl == 0 ? SMELT_DEVICE_CPU : SMELT_DEVICE_AUTO;
    if (o->ngl > 0 && o->ngl < layers)
      fprintf(stderr, "smelt %s: note: -ngl %d: smelt runs all %d layers on one device, the GPU when there is one\n",
              cmd, o->ngl, layers);
  }
  if (o->estimate && sm_store_check_fits(dir, o->ctx, p.kv_type, p.device == SMELT_DEVICE_CUDA, o->force, true)) {
    fprintf(stderr, "smelt %s: %s%s\n", cmd, what, smelt_last_error());
    free(dir);
    return false;
  }
  if (smelt_model_load(dir, &p, m)) {
    fprintf(stderr, "smelt %s: %s%s\n", cmd, what, smelt_last_error());
    free(dir);
    return false;
  }
  smelt_model_info info;
  smelt_model_get_info(*m, &info);
  if (info.note && info.note[0]) fprintf(stderr, "smelt %s: note: %s\n", cmd, info.note);
  if (dir_out) *dir_out = dir;
  else free(dir);
  return true;
}

bool sm_run_load(const char *cmd, const run_opts *o, smelt_model **m, smelt_model **draft, char **label) {
  *m = *draft = NULL;
  char *dir = NULL;
  if (!load_one(cmd, o, o->model, "", m, &dir)) return false;
  if (o->draft && !load_one(cmd, o, o->draft, "draft model: ", draft, NULL)) {
    smelt_model_free(*m);
    *m = NULL;
    free(dir);
    return false;
  }
  if (!(*m)->tok) {
    fprintf(stderr, "smelt %s: %s has no tokenizer.json\n", cmd, dir);
    smelt_model_free(*m);
    smelt_model_free(*draft);
    *m = *draft = NULL;
    free(dir);
    return false;
  }
  if (label) {
    sm_buf b = SM_BUF_INIT;
    const char *def = getenv("SMELT_DEFAULT_MODEL");
    if (o->model && *o->model) sm_buf_puts(&b, o->model);
    else if (def && *def) sm_buf_puts(&b, def);
    else sm_buf_printf(&b, "smelt-tiny (built-in)");
    *label = sm_buf_take(&b);
  }
  free(dir);
  return true;
}

void sm_run_gen_defaults(const smelt_model *m, run_opts *o, float fallback_temp, int fallback_n) {
  const sm_config *c = &m->cfg;
  if (!o->n_predict_set) {
    o->n_predict = fallback_n;
    /* transformers' default length: generation_config.json's max_new_tokens */
    char *p = sm_path_join(m->dir, "generation_config.json"), *text = NULL;
    size_t len = 0;
    if (sm_file_exists(p) && sm_read_file_max(p, SM_FILE_MAX_JSON, &text, &len) == SMELT_OK) {
      cJSON *j = cJSON_ParseWithLength(text, len);
      const cJSON *mnt = cJSON_GetObjectItemCaseSensitive(j, "max_new_tokens");
      if (cJSON_IsNumber(mnt) && mnt->valuedouble >= 1 && mnt->valuedouble <= 1e9) o->n_predict = (int)mnt->valuedouble;
      cJSON_Delete(j);
    }
    free(text);
    free(p);
  }
  if (!o->rep_set && c->gen_repetition_penalty > 0) o->s.repetition_penalty = c->gen_repetition_penalty;
  if (o->temp_set) return;
  if (c->gen_do_sample == 0) {
    o->s.temperature = 0;
    return;
  }
  o->s.temperature = c->gen_temperature > 0 ? c->gen_temperature : fallback_temp;
  if (!o->top_p_set && c->gen_top_p > 0) o->s.top_p = c->gen_top_p;
  if (!o->top_k_set && c->gen_top_k > 0) o->s.top_k = c->gen_top_k;
}

static bool read_stream(const char *cmd, FILE *f, const char *name, char **out) {
  sm_buf b = SM_BUF_INIT;
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
    sm_buf_put(&b, chunk, n);
    if (b.n > SM_FILE_MAX) {
      fprintf(stderr, "smelt %s: %s is larger than %zu MiB\n", cmd, name, SM_FILE_MAX >> 20);
      sm_buf_free(&b);
      return false;
    }
  }
  if (ferror(f)) {
    fprintf(stderr, "smelt %s: cannot read %s: %s\n", cmd, name, strerror(errno));
    sm_buf_free(&b);
    return false;
  }
  if (memchr(sm_buf_str(&b), 0, b.n)) {
    fprintf(stderr, "smelt %s: %s contains NUL bytes; a prompt is text\n", cmd, name);
    sm_buf_free(&b);
    return false;
  }
  /* one trailing newline ends the text, it is not part of it */
  if (b.n && b.p[b.n - 1] == '\n') b.p[--b.n] = 0;
  *out = sm_buf_take(&b);
  return true;
}

bool sm_run_prompt(const char *cmd, const run_opts *o, bool read_stdin, char **out) {
  *out = NULL;
  if (o->prompt) {
    *out = sm_xstrdup(o->prompt);
    return true;
  }
  if (o->file && strcmp(o->file, "-")) {
    char *text = NULL;
    size_t len = 0;
    if (sm_read_file(o->file, &text, &len)) {
      fprintf(stderr, "smelt %s: -f: %s\n", cmd, smelt_last_error());
      return false;
    }
    if (strlen(text) != len) {
      fprintf(stderr, "smelt %s: %s contains NUL bytes; a prompt is text\n", cmd, o->file);
      free(text);
      return false;
    }
    if (len && text[len - 1] == '\n') text[len - 1] = 0;
    *out = text;
    return true;
  }
  if (o->file || (read_stdin && !isatty(0))) {
    if (!read_stream(cmd, stdin, "stdin", out)) return false;
    if (!**out && !o->file) { /* nothing piped: like no prompt */
      free(*out);
      *out = NULL;
    }
  }
  return true;
}
