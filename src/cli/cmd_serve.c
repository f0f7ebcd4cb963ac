/* smelt serve / smelt-server: OpenAI-compatible HTTP server (llama-server compatible flags). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli/args.h"
#include "backend/backend.h"
#include "cli/cli.h"
#include "server/server.h"
#include "model/family.h"
#include "store/store.h"

static void usage(FILE *f) {
  fprintf(
    f, "usage: smelt serve [MODEL] [options]\n"
       "  -m, --model REF          model directory or hub name (default: the built-in model); given\n"
       "                           more than once: several models, the request's `model` picks one\n"
       "      --models-dir DIR     serve every model under DIR (DIR/NAME or DIR/OWNER/NAME), loaded on\n"
       "                           first use\n"
       "      --models-max N       several models: at most N loaded at once (default 4; LRU unloads)\n"
       "      --models-memory BYTES  several models: their estimated sizes add up to at most BYTES\n"
       "                           (K/M/G/T suffixes; default: no limit)\n"
       "      --models-load-timeout S  seconds a request waits for its model to load (default 300)\n"
       "      --prompt-cache FILE  seed the prefix cache from FILE at start; write the longest prompt\n"
       "                           prefix that requests shared to it at shutdown (one model)\n"
       "      --prompt-cache-ro    use --prompt-cache FILE but never write it\n"
       "      --slot-save-path DIR POST /slots/{id}?action=save|restore write and read files in DIR\n"
       "      --kv-cache-dir DIR   disk tier of the prefix cache: blocks evicted from memory go to files in\n"
       "                           DIR and are read back when a prompt starts with them; what is still in\n"
       "                           memory is written at shutdown, so a restarted server reuses it\n"
       "      --kv-cache-disk-size BYTES  size limit of each model's files in --kv-cache-dir, the least\n"
       "                           recently used deleted first (K/M/G/T suffixes; default 10G)\n"
       "      --host HOST          address to listen on (default 127.0.0.1)\n"
       "      --port N             port (default 8080; 0 = any free port)\n"
       "  -c, --ctx-size N         context tokens per sequence (default: model's, capped at 8192)\n"
       "      --force-context      allow -c beyond the model's trained context (warns)\n"
       "  -np, --parallel N        concurrent sequences (default 4)\n"
       "      --max-queue N        requests waiting for a slot before 429 (default 64)\n"
       "      --max-body BYTES     request body limit (default 1048576, 33554432 for a model that takes\n"
       "                           images; larger -> 413)\n"
       "      --api-key KEY        require 'Authorization: Bearer KEY'\n"
       "      --allowed-origins L  CORS: comma-separated origins or '*' (default: none)\n"
       "  -a, --alias NAME         model id reported by the API (also --served-model-name)\n"
       "  -t, --threads N          CPU threads (default: all cores)\n"
       "  -C, --cpu-mask M         pin the CPU threads, one CPU each in order: hex mask (0xff) or list (0-7)\n"
       "      --numa M             CPU threads over NUMA nodes: distribute, isolate or none (default)\n"
       "      --poll N             0..100: how long idle CPU threads busy-wait for work (default 50)\n"
       "      --device D           auto|cpu|cuda\n"
       "      --estimate-memory    check that weights + KV cache fit in memory before loading (--force: go on anyway)\n"
       "      --kv-blocks N        KV cache blocks (default: parallel * ctx / block size); a block's bytes\n"
       "                           depend on -ctk (f32 doubles them, q8_0 about halves them)\n"
       "      --block-size N       tokens per KV block (default 16)\n"
       "  -b, --batch-size N       tokens per forward step (prefill chunk, default 512)\n"
       "      --no-prefix-cache    disable prefix caching\n"
       "      --deterministic      batch-invariant kernels: a request's greedy or seeded output does not\n"
       "                           depend on the other requests running with it (slower; docs/server.md)\n"
       "      --no-mmap            read the weights into memory instead of mapping the files\n"
       "  -tp, --tensor-parallel N split the model over N GPUs, one process each (docs/parallel.md)\n"
       "  -pp, --pipeline-parallel N  split the model's layers in N stages over N GPUs, one process each\n"
       "      --nnodes N --node-rank R --master-addr HOST:PORT\n"
       "                           the -tp or -pp ranks on N hosts, each started with the same command and its own R;\n"
       "                           node 0 serves, the others run ranks only\n" SM_CLI_KV_HELP
       "      --offline            never download the model\n"
       "      --tool-format F      tool-call format: generic, hermes, qwen3_coder, llama3, mistral, harmony,\n"
       "                           deepseek, glm45, gemma (default: from the chat template)\n"
       "      --reasoning-format F auto|deepseek: <think> text -> reasoning_content (default); none: kept in content\n"
       "      --grammar-cache BYTES  token masks of constrained requests (JSON schema, grammar, tools) kept\n"
       "                           for other sequences in the same parser state, least recently used\n"
       "                           dropped (K/M/G suffixes; default 128M; 0: none)\n"
       "      --grammar-threads N  threads that build a step's grammar masks (1 to 64; default: the CPUs\n"
       "                           less one, at most 8)\n"
       "      --pooling P          /v1/embeddings: last (the last token's hidden state, default) or mean\n"
       "      --allow-image-urls   fetch http(s) image URLs of requests (default: only data: URLs; images\n"
       "                           in a request body count against --max-body)\n"
       "      --allow-image-files DIR  read image files under DIR named by requests (file:// URLs or absolute\n"
       "                           paths; default: none)\n"
       "Speculative decoding (one model; output equals decoding without it, docs/server.md):\n"
       "  -md, --model-draft REF   draft model (same tokenizer) proposing tokens that the model verifies\n"
       "                           in its batched step (also --draft-model)\n"
       "      --spec-type T        none (default, or draft with -md) or ngram-simple: draft tokens from\n"
       "                           the request's own prompt and output (prompt lookup)\n"
       "      --draft-max N        draft tokens per step, 1..32 (default 16; also --draft, --draft-n)\n"
       "      --draft-min N        verify drafts of at least N tokens only (default 0)\n"
       "      --draft-p-min P      draft model: stop a draft at a token below probability P (default 0.75)\n"
       "      --spec-ngram-size-n N  ngram-simple: look up the last N tokens (then fewer), 1..16 (default 3)\n"
       "  -sm, --split-mode none|layer|row  row: the model split over every GPU (as -tp N); layer: its layers\n"
       "                           (as -pp N)\n"
       "  -ts, --tensor-split L    shares (1,1) a GPU: with -sm row equal ones, with -sm layer or -pp N the\n"
       "                           stages' shares of the layers (3,1: three quarters on GPU 0)\n"
       "  llama-server flags without meaning here are accepted with a notice: -ngl/--n-gpu-layers N,\n"
       "  -fa/--flash-attn [on|off|auto], --jinja, --no-jinja, -cb/--cont-batching, --mlock, --metrics,\n"
       "  --slots, --no-webui, -mg/--main-gpu N, --numa M, --log-colors, --log-disable\n"
       "Connections:\n"
       "      --max-conns N        open connections in all (default 1024)\n"
       "      --max-conns-per-ip N open connections per client address (default 256; 0 = no limit)\n"
       "      --http-threads N     HTTP worker threads (default 4)\n"
       "      --header-timeout S   seconds for a request's line and headers to arrive, counted from the\n"
       "                           connection's start or its previous response (default 20; then 408)\n"
       "      --body-timeout S     seconds for a request body to arrive after its headers (default 60)\n"
       "  -to, --timeout S         seconds without progress reading or writing a connection (default 600)\n"
       "      --max-buffered-body BYTES  request bodies held in memory, all connections together\n"
       "                           (default 67108864; beyond -> 503 with Retry-After)\n"
       "      --shutdown-timeout S seconds in-flight requests get after SIGTERM/SIGINT (default 20)\n"
       "      --log-file PATH      log there instead of stderr (appended; reopened on SIGHUP)\n"
       "  -v, --verbose            log requests and connection-level messages\n"
       "Signals: SIGTERM/SIGINT drain (a second one ends in-flight requests at once); SIGHUP reopens\n"
       "  the log file. Exit status: 0 stopped by a signal, 1 could not start, 2 bad usage,\n"
       "  3 stopped by a fatal error (a weights file changed while mapped).\n"
       "Environment (overridden by flags): LLAMA_ARG_HOST, LLAMA_ARG_PORT, LLAMA_ARG_MODEL,\n"
       "  LLAMA_ARG_CTX_SIZE, LLAMA_ARG_N_PARALLEL, LLAMA_ARG_API_KEY, LLAMA_ARG_THREADS, LLAMA_ARG_ALIAS;\n"
       "  SMELT_PIPELINE=0: run each step after the last one's tokens are read back (on a GPU the next step\n"
       "  is launched first; the outputs are the same); SMELT_HOST_SAMPLE=1: sample on the host\n");
}

static bool parse_secs(const char *s, double lo, double hi, double *out) {
  if (!s || !*s) return false;
  char *e;
  double v = strtod(s, &e);
  if (*e || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

static bool parse_int(const char *s, long lo, long hi, long *out) {
  if (!s || !*s) return false;
  char *e;
  long v = strtol(s, &e, 10);
  if (*e || v < lo || v > hi) return false;
  *out = v;
  return true;
}

int sm_cmd_serve(int argc, char **argv) {
  sm_server_params p;
  sm_server_params_default(&p);
  const char *model = NULL, *ctk = NULL, *ctv = NULL, *draft = NULL;
  bool spec_none = false, spec_draft = false;
  enum { MAX_MODELS = 64 };
  const char *refs[MAX_MODELS]; /* -m given more than once */
  int n_refs = 0;
  bool offline = false, estimate = false, force = false, force_ctx = false, disk_size_given = false;
  long v;
  /* environment first, flags override */
  const char *e;
  if ((e = getenv("LLAMA_ARG_HOST")) && *e) p.host = e;
  if ((e = getenv("LLAMA_ARG_MODEL")) && *e) model = e;
  if ((e = getenv("LLAMA_ARG_API_KEY")) && *e) p.api_key = e;
  if ((e = getenv("LLAMA_ARG_ALIAS")) && *e) p.alias = e;
  struct {
    const char *name;
    long lo, hi;
    int *dst;
  } envi[] = {
    {"LLAMA_ARG_PORT", 0, 65535, &p.port},
    {"LLAMA_ARG_CTX_SIZE", 0, 1 << 24, &p.ctx_size},
    {"LLAMA_ARG_N_PARALLEL", 1, 1024, &p.parallel},
    {"LLAMA_ARG_THREADS", -1, 256, &p.threads},
  };
  for (size_t i = 0; i < sizeof envi / sizeof envi[0]; i++) {
    if (!(e = getenv(envi[i].name)) || !*e) continue;
    if (!parse_int(e, envi[i].lo, envi[i].hi, &v)) {
      fprintf(stderr, "smelt serve: invalid %s='%s'\n", envi[i].name, e);
      return 2;
    }
    *envi[i].dst = (int)v;
  }
  const char *split_mode = NULL; /* llama-server's -sm */
  int ts_ranks = 0;              /* the GPUs -ts gives a share */
  static float ts_share[16];     /* their shares, in order */
  bool ts_unequal = false;
  for (int i = 1; i < argc; i++) {
    char *a = argv[i], *val = NULL;
    char name[64];
    snprintf(name, sizeof name, "%s", a);
    char *eq = a[0] == '-' && a[1] == '-' ? strchr(name, '=') : NULL;
    if (eq) {
      *eq = 0;
      val = a + (eq - name) + 1;
    }
#define IS(x) (!strcmp(name, x))
#define NEEDVAL() \
  do { \
    if (!val) { \
      if (i + 1 >= argc) { \
        fprintf(stderr, "smelt serve: %s needs a value\n", name); \
        return 2; \
      } \
      val = argv[++i]; \
    } \
  } while (0)
#define INTVAL(lo, hi, dst) \
  do { \
    NEEDVAL(); \
    if (!parse_int(val, lo, hi, &v)) { \
      fprintf(stderr, "smelt serve: %s: '%s' is not a whole number in %ld to %ld\n", name, val, (long)(lo), \
              (long)(hi)); \
      return 2; \
    } \
    dst = (int)v; \
  } while (0)
#define SECVAL(lo, hi, dst) \
  do { \
    NEEDVAL(); \
    if (!parse_secs(val, lo, hi, &dst)) { \
      fprintf(stderr, "smelt serve: %s: '%s' is not a number of seconds in %g to %g\n", name, val, (double)(lo), \
              (double)(hi)); \
      return 2; \
    } \
  } while (0)
    if (IS("-h") || IS("--help")) {
      usage(stdout);
      return 0;
    } else if (IS("-m") || IS("--model")) {
      NEEDVAL();
      if (n_refs == MAX_MODELS) {
        fprintf(stderr, "smelt serve: more than %d -m models\n", MAX_MODELS);
        return 2;
      }
      if (!n_refs) model = val; /* over LLAMA_ARG_MODEL */
      refs[n_refs++] = val;
    } else if (IS("--models-dir")) {
      NEEDVAL();
      p.models_dir = val;
    } else if (IS("--models-max")) INTVAL(1, 1024, p.models_max);
    else if (IS("--models-memory")) {
      NEEDVAL();
      if (!sm_store_parse_size(val, &p.models_memory) || !p.models_memory) {
        fprintf(stderr, "smelt serve: --models-memory: '%s' is not a byte count (e.g. 24G)\n", val);
        return 2;
      }
    } else if (IS("--models-load-timeout")) SECVAL(1, 86400, p.models_load_timeout);
    else if (IS("--prompt-cache")) {
      NEEDVAL();
      if (!val[0]) {
        fprintf(stderr, "smelt serve: --prompt-cache needs a file name\n");
        return 2;
      }
      p.prompt_cache = val;
    } else if (IS("--prompt-cache-ro")) p.prompt_cache_ro = true;
    else if (IS("--slot-save-path")) {
      NEEDVAL();
      struct stat sst;
      if (stat(val, &sst) != 0 || !S_ISDIR(sst.st_mode)) {
        fprintf(stderr, "smelt serve: --slot-save-path %s is not a directory\n", val);
        return 2;
      }
      p.slot_save_path = val;
    } else if (IS("--kv-cache-dir")) {
      NEEDVAL();
      if (!val[0]) {
        fprintf(stderr, "smelt serve: --kv-cache-dir needs a directory\n");
        return 2;
      }
      p.kv_cache_dir = val;
    } else if (IS("--kv-cache-disk-size")) {
      NEEDVAL();
      if (!sm_store_parse_size(val, &p.kv_cache_disk_size) || !p.kv_cache_disk_size) {
        fprintf(stderr, "smelt serve: --kv-cache-disk-size: '%s' is not a byte count above 0 (e.g. 20G)\n", val);
        return 2;
      }
      disk_size_given = true;
    } else if (IS("--host")) {
      NEEDVAL();
      p.host = val;
    } else if (IS("--port")) INTVAL(0, 65535, p.port);
    else if (IS("-c") || IS("--ctx-size")) INTVAL(0, 1 << 24, p.ctx_size);
    else if (IS("-np") || IS("--parallel")) INTVAL(1, 1024, p.parallel);
    else if (IS("--max-queue")) INTVAL(0, 1 << 20, p.max_queue);
    else if (IS("--grammar-threads")) INTVAL(1, 64, p.grammar_threads);
    else if (IS("--grammar-cache")) {
      NEEDVAL();
      if (!sm_store_parse_size(val, &p.grammar_cache)) {
        fprintf(stderr, "smelt serve: --grammar-cache: '%s' is not a byte count (e.g. 256M; 0: no cache)\n", val);
        return 2;
      }
    } else if (IS("--max-body")) {
      long mb;
      NEEDVAL();
      if (!parse_int(val, 1, 1L << 40, &mb)) {
        fprintf(stderr, "smelt serve: --max-body: '%s' is not a byte count in 1 to %ld\n", val, 1L << 40);
        return 2;
      }
      p.max_body = (size_t)mb;
    } else if (IS("--api-key")) {
      NEEDVAL();
      p.api_key = val;
    } else if (IS("--allowed-origins") || IS("--cors")) {
      NEEDVAL();
      p.allowed_origins = val;
    } else if (IS("-a") || IS("--alias") || IS("--served-model-name")) {
      NEEDVAL();
      p.alias = val;
    } else if (IS("-t") || IS("--threads")) INTVAL(-1, 256, p.threads); /* the CPU backend's thread limit */
    else if (IS("-C") || IS("--cpu-mask") || IS("-Cr") || IS("--cpu-range")) {
      NEEDVAL();
      p.cpu_mask = val;
    } else if (IS("--poll")) INTVAL(0, 100, p.cpu_poll);
    else if (IS("--numa")) {
      NEEDVAL();
      smelt_numa nm;
      if (smelt_numa_parse(val, &nm)) {
        fprintf(stderr, "smelt serve: %s\n", smelt_last_error());
        return 2;
      }
      p.numa = (int)nm;
    } else if (IS("--kv-blocks")) INTVAL(1, 1 << 24, p.kv_blocks);
    else if (IS("--block-size")) INTVAL(1, 4096, p.block_size);
    else if (IS("-b") || IS("--batch-size") || IS("-ub") || IS("--ubatch-size")) INTVAL(1, 1 << 20, p.max_batch_tokens);
    else if (IS("--no-prefix-cache")) p.no_prefix_cache = true;
    else if (IS("--no-mmap")) p.no_mmap = true;
    else if (IS("--deterministic")) p.deterministic = true;
    else if (IS("-tp") || IS("--tensor-parallel")) INTVAL(1, 16, p.tensor_parallel);
    else if (IS("-pp") || IS("--pipeline-parallel")) INTVAL(1, 16, p.pipeline_parallel);
    else if (IS("--nnodes")) INTVAL(1, 16, p.nnodes);
    else if (IS("--node-rank")) INTVAL(0, 15, p.node_rank);
    else if (IS("--master-addr")) {
      NEEDVAL();
      p.master_addr = val;
    } else if (IS("--allow-image-urls")) p.allow_image_urls = true;
    else if (IS("--allow-image-files")) {
      static char img_dir[PATH_MAX];
      struct stat sst;
      NEEDVAL();
      if (!realpath(val, img_dir) || stat(img_dir, &sst) != 0 || !S_ISDIR(sst.st_mode)) {
        fprintf(stderr, "smelt serve: --allow-image-files %s is not a directory\n", val);
        return 2;
      }
      p.image_files_dir = img_dir;
    } else if (IS("-ctk") || IS("--cache-type-k")) {
      NEEDVAL();
      ctk = val;
    } else if (IS("-ctv") || IS("--cache-type-v")) {
      NEEDVAL();
      ctv = val;
    } else if (IS("--max-conns")) INTVAL(1, 1 << 20, p.max_conns);
    else if (IS("--max-conns-per-ip")) INTVAL(0, 1 << 20, p.max_conns_per_ip);
    else if (IS("--http-threads")) INTVAL(1, 256, p.http_threads);
    else if (IS("--header-timeout")) SECVAL(0.1, 86400, p.header_timeout);
    else if (IS("--body-timeout")) SECVAL(0.1, 86400, p.body_timeout);
    else if (IS("-to") || IS("--timeout")) INTVAL(1, 86400, p.timeout);
    else if (IS("--max-buffered-body")) {
      long mb;
      NEEDVAL();
      if (!parse_int(val, 1, 1L << 40, &mb)) {
        fprintf(stderr, "smelt serve: --max-buffered-body: '%s' is not a byte count in 1 to %ld\n", val, 1L << 40);
        return 2;
      }
      p.max_buffered_body = (size_t)mb;
    } else if (IS("--shutdown-timeout")) SECVAL(0, 86400, p.shutdown_timeout);
    else if (IS("--log-file")) {
      NEEDVAL();
      p.log_file = val;
    } else if (IS("--offline")) offline = true;
    else if (IS("--estimate-memory")) estimate = true;
    else if (IS("--force")) force = true;
    else if (IS("--force-context")) force_ctx = true;
    else if (IS("-v") || IS("--verbose")) p.verbose = true;
    else if (IS("--device")) {
      NEEDVAL();
      if (!strcmp(val, "auto")) p.device = SMELT_DEVICE_AUTO;
      else if (!strcmp(val, "cpu")) p.device = SMELT_DEVICE_CPU;
      else if (!strcmp(val, "cuda") || !strcmp(val, "gpu")) p.device = SMELT_DEVICE_CUDA;
      else {
        fprintf(stderr, "smelt serve: --device must be auto, cpu or cuda\n");
        return 2;
      }
    } else if (IS("--tool-format")) {
      NEEDVAL();
      p.tool_format = val;
    } else if (IS("--pooling")) {
      NEEDVAL();
      if (strcmp(val, "last") && strcmp(val, "mean")) {
        fprintf(stderr, "smelt serve: --pooling must be last or mean\n");
        return 2;
      }
      p.pooling = !strcmp(val, "mean");
    } else if (IS("--reasoning-format")) {
      NEEDVAL();
      if (strcmp(val, "auto") && strcmp(val, "deepseek") && strcmp(val, "none") && strcmp(val, "deepseek-legacy")) {
        fprintf(stderr, "smelt serve: --reasoning-format must be auto, deepseek or none\n");
        return 2;
      }
      p.reasoning_format = val;
    }
    /* llama-server flags that mean nothing here: accepted with a notice */
    else if (IS("-md") || IS("--model-draft") || IS("--draft-model")) {
      NEEDVAL();
      draft = val;
    } else if (IS("--spec-type")) {
      NEEDVAL();
      if (!strcmp(val, "ngram-simple") || !strcmp(val, "ngram")) p.spec_ngram = true;
      else if (!strcmp(val, "none")) spec_none = true;
      else if (!strcmp(val, "draft")) spec_draft = true;
      else {
        fprintf(stderr, "smelt serve: --spec-type: '%s' is not one of none, draft, ngram-simple\n", val);
        return 2;
      }
    } else if (IS("--draft-max") || IS("--draft") || IS("--draft-n")) INTVAL(1, 32, p.draft_max);
    else if (IS("--draft-min") || IS("--draft-n-min")) INTVAL(0, 32, p.draft_min);
    else if (IS("--draft-p-min")) {
      NEEDVAL();
      char *end;
      double d = strtod(val, &end);
      if (!*val || *end || !(d >= 0 && d <= 1)) {
        fprintf(stderr, "smelt serve: --draft-p-min: '%s' is not a probability in 0 to 1\n", val);
        return 2;
      }
      p.draft_p_min = (float)d;
    } else if (IS("--spec-ngram-size-n") || IS("--spec-ngram-simple-size-n")) INTVAL(1, 16, p.spec_ngram_n);
    else if (IS("-sm") || IS("--split-mode")) { /* llama-server's: row maps to -tp, layer to -pp over every GPU */
      NEEDVAL();
      if (!strcmp(val, "none") || !strcmp(val, "row") || !strcmp(val, "layer")) split_mode = val;
      else {
        fprintf(stderr, "smelt serve: --split-mode %s: expected none, layer or row\n", val);
        return 2;
      }
    } else if (IS("-ts") || IS("--tensor-split")) { /* equal shares map to -tp; zero shares leave a GPU out */
      NEEDVAL();
      char *end = (char *)val;
      double first = 0;
      ts_ranks = 0;
      ts_unequal = false;
      for (;;) {
        const double v = strtod(end, &end);
        if (!(v >= 0 && v < 1e9) || (*end && *end != ',') || (v > 0 && ts_ranks == 16)) {
          fprintf(stderr, "smelt serve: --tensor-split %s: expected shares like 1,1 (one a GPU, at most 16)\n", val);
          return 2;
        }
        if (v > 0 && first > 0 && v != first) ts_unequal = true;
        if (v > 0) first = v, ts_share[ts_ranks++] = (float)v;
        if (!*end++) break;
      }
    } else if (IS("-ngl") || IS("--n-gpu-layers") || IS("--gpu-layers") || IS("-mg") || IS("--main-gpu")) {
      NEEDVAL();
      fprintf(stderr, "smelt serve: note: %s %s has no effect here (ignored)\n", name, val);
    } else if (IS("-fa") || IS("--flash-attn")) {
      if (!val && i + 1 < argc &&
          (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "off") || !strcmp(argv[i + 1], "auto") ||
           !strcmp(argv[i + 1], "1") || !strcmp(argv[i + 1], "0")))
        val = argv[++i];
      fprintf(stderr, "smelt serve: note: %s has no effect here (attention kernels are chosen by the backend)\n", name);
    } else if (IS("--jinja") || IS("--no-jinja") || IS("-cb") || IS("--cont-batching") || IS("--mlock") ||
               IS("--metrics") || IS("--slots") || IS("--no-webui") || IS("--log-colors") || IS("--log-disable")) {
      fprintf(stderr, "smelt serve: note: %s has no effect here (ignored)\n", name);
    } else if (a[0] != '-' && !model) {
      model = a;
      if (n_refs == MAX_MODELS) {
        fprintf(stderr, "smelt serve: more than %d -m models\n", MAX_MODELS);
        return 2;
      }
      refs[n_refs++] = a;
    } else {
      /* "did you mean": the spellings above, as a table for sm_args_suggest */
      static const sm_arg names[] = {
        {.names = "--help|--model|--host|--port|--ctx-size|--parallel|--max-queue|--max-body|--api-key"},
        {.names = "--allowed-origins|--cors|--alias|--served-model-name|--threads|--kv-blocks|--block-size"},
        {.names = "--batch-size|--ubatch-size|--no-prefix-cache|--no-mmap|--max-conns|--max-conns-per-ip"},
        {.names = "--http-threads|--header-timeout|--body-timeout|--timeout|--max-buffered-body"},
        {.names = "--shutdown-timeout|--log-file|--offline|--estimate-memory|--force|--verbose|--device"},
        {.names = "--force-context|--models-dir|--models-max|--models-memory|--models-load-timeout"},
        {.names = "--allow-image-urls|--allow-image-files|--deterministic|--tensor-parallel|--pipeline-parallel"},
        {.names = "--nnodes|--node-rank|--master-addr"},
        {.names = "--prompt-cache|--prompt-cache-ro|--tool-format|--reasoning-format|--pooling|--slot-save-path"},
        {.names = "--cpu-mask|--cpu-range|--numa|--poll|--kv-cache-dir|--kv-cache-disk-size"},
        {.names = "--model-draft|--draft-model|--spec-type|--draft-max|--draft-min|--draft-p-min"},
        {.names = "--spec-ngram-size-n|--grammar-cache|--grammar-threads"},
        {.names = "-h|-m|-c|-np|-a|-t|-b|-ub|-to|-v|-md|-tp|-pp"},
      };
      char sug[160];
      sm_args_suggest(names, (int)(sizeof names / sizeof names[0]), name, sug, sizeof sug);
      if (sug[0]) fprintf(stderr, "smelt serve: unknown option '%s'; did you mean %s?\n", name, sug);
      else fprintf(stderr, "smelt serve: unknown option '%s' (smelt serve --help lists the options)\n", name);
      return 2;
    }
#undef IS
#undef NEEDVAL
#undef INTVAL
#undef SECVAL
  }
  if (p.threads < 0) p.threads = 0;
  const bool sm_row = split_mode && !strcmp(split_mode, "row"), sm_layer = split_mode && !strcmp(split_mode, "layer");
  /* unequal shares: the layers of a pipeline (-sm layer, -pp N); heads and columns split only equally */
  if (ts_unequal && (sm_row || p.tensor_parallel > 1 || (!sm_layer && p.pipeline_parallel <= 1))) {
    fprintf(stderr, "smelt serve: --tensor-split: unequal shares split layers (-sm layer or -pp N); -sm row and -tp N "
                    "split a model into equal shares\n");
    return 2;
  }
  if (ts_ranks > 0 && p.pipeline_parallel > 1 && ts_ranks != p.pipeline_parallel) {
    fprintf(stderr, "smelt serve: --tensor-split gives %d shares for -pp %d\n", ts_ranks, p.pipeline_parallel);
    return 2;
  }
  if (!p.tensor_parallel && !p.pipeline_parallel && (sm_row || sm_layer)) { /* every GPU, or the -ts shares' */
    const int n = ts_ranks > 0 ? ts_ranks : sm_backend_gpu_count(), k = n > 16 ? 16 : n;
    if (k >= 2 && sm_row) p.tensor_parallel = k;
    else if (k >= 2) p.pipeline_parallel = k;
    fprintf(stderr, "smelt serve: -sm %s: %s\n", split_mode,
            n < 2    ? "one GPU or none: nothing to split"
            : sm_row ? "the model split over the GPUs (as -tp N)"
                     : "the model's layers split over the GPUs (as -pp N)");
    if (n > 16) fprintf(stderr, "smelt serve: note: -sm %s: %d GPUs; smelt splits over at most 16\n", split_mode, n);
  } else if (ts_ranks > 0 && !p.tensor_parallel && !p.pipeline_parallel) {
    fprintf(stderr, "smelt serve: note: --tensor-split takes effect with -sm row or layer (or -tp N, -pp N)\n");
  }
  if (ts_ranks > 0 && p.pipeline_parallel > 1) p.pp_shares = ts_share; /* the stages' shares of the layers */
  smelt_kv_type kvt = SMELT_KV_F16;
  if (sm_cli_kv_type("serve", ctk, ctv, &kvt)) return 2;
  p.kv_type = (int)kvt;
  {
    sm_engine_params ev;
    sm_engine_params_default(&ev);
    sm_cli_engine_env(&ev);
    p.host_sample = ev.host_sample;
    p.no_pipeline = !ev.pipeline;
    p.pipeline_always = ev.pipeline_always;
  }
  const bool multi = n_refs > 1 || p.models_dir;
  if (multi && p.alias) {
    fprintf(stderr, "smelt serve: --alias names the one model; with several, a model is named by its -m text or "
                    "its directory under --models-dir\n");
    return 2;
  }
  if (multi && p.prompt_cache) {
    fprintf(stderr, "smelt serve: --prompt-cache works with one model\n");
    return 2;
  }
  if (p.no_prefix_cache && (p.prompt_cache || p.slot_save_path)) {
    fprintf(stderr, "smelt serve: %s fills the prefix cache, which --no-prefix-cache turns off\n",
            p.prompt_cache ? "--prompt-cache" : "--slot-save-path");
    return 2;
  }
  if ((p.tensor_parallel > 1 || p.pipeline_parallel > 1) && (p.prompt_cache || p.slot_save_path || p.kv_cache_dir)) {
    fprintf(stderr,
            "smelt serve: %s: not with a model split over ranks (-tp, -pp, -sm): rank 0 holds only its share "
            "of the KV cache\n",
            p.prompt_cache     ? "--prompt-cache"
            : p.slot_save_path ? "--slot-save-path"
                               : "--kv-cache-dir");
    return 2;
  }
  if (p.no_prefix_cache && p.kv_cache_dir) {
    fprintf(stderr, "smelt serve: --kv-cache-dir is a tier of the prefix cache, which --no-prefix-cache turns off\n");
    return 2;
  }
  if (disk_size_given && !p.kv_cache_dir) {
    fprintf(stderr, "smelt serve: --kv-cache-disk-size needs --kv-cache-dir DIR\n");
    return 2;
  }
  if (!p.kv_cache_disk_size) p.kv_cache_disk_size = 10ull << 30;
  if (p.prompt_cache_ro && !p.prompt_cache) {
    fprintf(stderr, "smelt serve: --prompt-cache-ro needs --prompt-cache FILE\n");
    return 2;
  }
  if (spec_none && (draft || p.spec_ngram)) {
    fprintf(stderr, "smelt serve: --spec-type none with %s\n", draft ? "-md" : "--spec-type ngram-simple");
    return 2;
  }
  if (spec_draft && !draft) {
    fprintf(stderr, "smelt serve: --spec-type draft needs a draft model (-md)\n");
    return 2;
  }
  if (draft && p.spec_ngram) {
    fprintf(stderr, "smelt serve: use either a draft model (-md) or --spec-type ngram-simple, not both\n");
    return 2;
  }
  if ((draft || p.spec_ngram) && multi) {
    fprintf(stderr, "smelt serve: speculative decoding (%s) works with one model\n",
            draft ? "-md" : "--spec-type ngram-simple");
    return 2;
  }
  if (p.draft_min > p.draft_max) {
    fprintf(stderr, "smelt serve: --draft-min %d is larger than --draft-max %d\n", p.draft_min, p.draft_max);
    return 2;
  }
  char *draft_dir = NULL;
  if (draft && (sm_store_resolve(draft, !offline, &draft_dir) != SMELT_OK || !draft_dir)) {
    fprintf(stderr, "smelt serve: cannot find the draft model '%s': %s\n", draft, smelt_last_error());
    free(draft_dir);
    return 1;
  }
  p.draft_dir = draft_dir;
  if (!n_refs && !p.models_dir) refs[n_refs++] = model; /* LLAMA_ARG_MODEL, or NULL: the default model */
  char *dirs[MAX_MODELS];
  char ids[MAX_MODELS][256];
  const char *idp[MAX_MODELS];
  int n_dirs = 0, rc = 0;
  for (int i = 0; i < n_refs && !rc; i++) {
    char *dir = NULL;
    if (sm_store_resolve(refs[i], !offline, &dir) != SMELT_OK || !dir) {
      fprintf(stderr, "smelt serve: cannot find model '%s': %s\n", refs[i] ? refs[i] : "(default)", smelt_last_error());
      free(dir);
      rc = 1;
      break;
    }
    dirs[n_dirs] = dir;
    /* a model's name: what -m said, or the directory's name when -m gave a path */
    struct stat st;
    const char *id = refs[i] ? refs[i] : dir;
    if (!refs[i] || (stat(refs[i], &st) == 0 && S_ISDIR(st.st_mode))) {
      size_t l = strlen(dir);
      while (l > 1 && dir[l - 1] == '/') l--;
      size_t b0 = l;
      while (b0 > 0 && dir[b0 - 1] != '/') b0--;
      snprintf(ids[n_dirs], sizeof ids[n_dirs], "%.*s", (int)(l - b0), dir + b0);
    } else {
      snprintf(ids[n_dirs], sizeof ids[n_dirs], "%s", id);
    }
    idp[n_dirs] = ids[n_dirs];
    n_dirs++;
    sm_config cfg;
    if (p.ctx_size > 0 && sm_family_config_load(dir, &cfg) == SMELT_OK) {
      const int trained = cfg.max_position_embeddings;
      sm_config_free(&cfg);
      if (trained > 0 && p.ctx_size > trained) {
        if (!force_ctx) {
          fprintf(stderr,
                  "smelt serve: -c/--ctx-size %d is larger than the context of %s (%d tokens, "
                  "max_position_embeddings); --force-context uses it anyway\n",
                  p.ctx_size, ids[n_dirs - 1], trained);
          rc = 2;
          break;
        }
        fprintf(stderr, "smelt serve: warning: context %d is beyond the %d tokens %s was trained for\n", p.ctx_size,
                trained, ids[n_dirs - 1]);
      }
    }
    if (estimate) {
      int ctx_total = p.ctx_size > 0 ? p.ctx_size * (p.parallel > 0 ? p.parallel : 1) : 0;
      if (sm_store_check_fits(dir, ctx_total, kvt, p.device == SMELT_DEVICE_CUDA, force, true) != SMELT_OK) {
        fprintf(stderr, "smelt serve: %s\n", smelt_last_error());
        rc = 1;
      }
    }
  }
  if (!rc) {
    p.model_dir = n_dirs ? dirs[0] : NULL;
    p.model_dirs = (const char *const *)dirs;
    p.model_ids = idp;
    p.n_models = n_dirs;
    rc = sm_server_run(&p);
  }
  for (int i = 0; i < n_dirs; i++) free(dirs[i]);
  free(draft_dir);
  return rc;
}
