/* smelt run (chat) and smelt generate (raw completion). */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/strbuf.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "store/store.h"
#include "tokenizer/chat.h"

typedef struct {
  const char *model, *prompt, *system, *device, *draft;
  int n_predict, threads, ctx, draft_n;
  bool verbose, no_stats, raw, estimate, force;
  smelt_sampling s;
  smelt_kv_type kv; /* --cache-type-k / -v */
} run_opts;

static void run_usage(const char *cmd, FILE *f) {
  fprintf(f,
          "usage: smelt %s %s[options]\n\n"
          "  -m, --model MODEL       model directory, owner/name or name (default: built-in smelt-tiny)\n"
          "  -p, --prompt TEXT       prompt (run: one-shot user message; generate: raw text)\n"
          "  -s, --system TEXT       system message (run)\n"
          "  -n, --n-predict N       max tokens to generate (default 256)\n"
          "      --temp T            temperature (0 = greedy; default: generation_config or 0.7 for run, 0 for generate)\n"
          "      --top-k K  --top-p P  --min-p P\n"
          "      --repeat-penalty R  --frequency-penalty F  --presence-penalty P  --repeat-last-n N\n"
          "      --seed S            RNG seed (default random)\n"
          "  -t, --threads N         CPU threads (default: all cores)\n"
          "  -c, --ctx-size N        context size (default: model max, capped at 8192)\n"
          "      --device cpu|cuda   backend (default: cuda if available)\n"
          "      --no-stats          do not print speed/memory to stderr\n"
          "      --raw               run: no chat template\n"
          "  -md, --model-draft M    draft model for speculative decoding (same tokenizer), e.g. smelt-tiny-draft\n"
          "      --draft-max N       tokens proposed by the draft per step (default 4)\n"
          "      --estimate-memory   check that weights + KV cache fit before loading (--force: go on anyway)\n"
          SM_CLI_KV_HELP,
          cmd, !strcmp(cmd, "run") ? "[MODEL] " : "");
}

enum { O_TEMP = 1000, O_TOPK, O_TOPP, O_MINP, O_REP, O_FREQ, O_PRES, O_LASTN, O_SEED, O_DEV, O_NOSTATS, O_RAW, O_EST, O_FORCE, O_DRAFT, O_DRAFTN, O_CTK, O_CTV };

static int parse_opts(const char *cmd, int argc, char **argv, run_opts *o, bool *temp_set) {
  static const struct option lo[] = {
    { "model", 1, 0, 'm' }, { "prompt", 1, 0, 'p' }, { "system", 1, 0, 's' }, { "n-predict", 1, 0, 'n' },
    { "max-tokens", 1, 0, 'n' }, { "threads", 1, 0, 't' }, { "ctx-size", 1, 0, 'c' }, { "temp", 1, 0, O_TEMP },
    { "temperature", 1, 0, O_TEMP }, { "top-k", 1, 0, O_TOPK }, { "top-p", 1, 0, O_TOPP }, { "min-p", 1, 0, O_MINP },
    { "repeat-penalty", 1, 0, O_REP }, { "frequency-penalty", 1, 0, O_FREQ }, { "presence-penalty", 1, 0, O_PRES },
    { "repeat-last-n", 1, 0, O_LASTN }, { "seed", 1, 0, O_SEED }, { "device", 1, 0, O_DEV },
    { "no-stats", 0, 0, O_NOSTATS }, { "raw", 0, 0, O_RAW }, { "estimate-memory", 0, 0, O_EST }, { "force", 0, 0, O_FORCE },
    { "model-draft", 1, 0, O_DRAFT }, { "draft", 1, 0, O_DRAFT }, { "draft-max", 1, 0, O_DRAFTN }, { "draft-n", 1, 0, O_DRAFTN },
    { "cache-type-k", 1, 0, O_CTK }, { "cache-type-v", 1, 0, O_CTV }, { "help", 0, 0, 'h' }, { 0, 0, 0, 0 } };
  const char *ctk = NULL, *ctv = NULL;
  memset(o, 0, sizeof *o);
  o->n_predict = 256;
  o->draft_n = 4;
  smelt_sampling_default(&o->s);
  *temp_set = false;
  for (int i = 1; i < argc; i++) if (!strcmp(argv[i], "-md")) argv[i] = "--model-draft"; /* llama.cpp spelling */
  sm_cli_kv_alias(argc, argv);
  optind = 1;
  int c;
  char *end;
#define NUM(dst, conv) do { dst = conv; if (end == optarg || *end) { fprintf(stderr, "smelt %s: bad number '%s'\n", cmd, optarg); return 2; } } while (0)
  while ((c = getopt_long(argc, argv, "m:p:s:n:t:c:h", lo, NULL)) != -1) {
    switch (c) {
    case 'm': o->model = optarg; break;
    case 'p': o->prompt = optarg; break;
    case 's': o->system = optarg; break;
    case 'n': NUM(o->n_predict, (int)strtol(optarg, &end, 10)); break;
    case 't': NUM(o->threads, (int)strtol(optarg, &end, 10)); break;
    case 'c': NUM(o->ctx, (int)strtol(optarg, &end, 10)); break;
    case O_TEMP: NUM(o->s.temperature, strtof(optarg, &end)); *temp_set = true; break;
    case O_TOPK: NUM(o->s.top_k, (int)strtol(optarg, &end, 10)); break;
    case O_TOPP: NUM(o->s.top_p, strtof(optarg, &end)); break;
    case O_MINP: NUM(o->s.min_p, strtof(optarg, &end)); break;
    case O_REP: NUM(o->s.repetition_penalty, strtof(optarg, &end)); break;
    case O_FREQ: NUM(o->s.frequency_penalty, strtof(optarg, &end)); break;
    case O_PRES: NUM(o->s.presence_penalty, strtof(optarg, &end)); break;
    case O_LASTN: NUM(o->s.penalty_last_n, (int)strtol(optarg, &end, 10)); break;
    case O_SEED: NUM(o->s.seed, strtoull(optarg, &end, 10)); break;
    case O_DEV: o->device = optarg; break;
    case O_NOSTATS: o->no_stats = true; break;
    case O_RAW: o->raw = true; break;
    case O_EST: o->estimate = true; break;
    case O_FORCE: o->force = true; break;
    case O_DRAFT: o->draft = optarg; break;
    case O_DRAFTN: NUM(o->draft_n, (int)strtol(optarg, &end, 10)); break;
    case O_CTK: ctk = optarg; break;
    case O_CTV: ctv = optarg; break;
    case 'h': run_usage(cmd, stdout); return 1;
    default: run_usage(cmd, stderr); return 2;
    }
  }
#undef NUM
  if (optind < argc && !o->model) o->model = argv[optind++];
  if (optind < argc) { fprintf(stderr, "smelt %s: unexpected argument '%s'\n", cmd, argv[optind]); return 2; }
  o->kv = SMELT_KV_F16;
  if (sm_cli_kv_type(cmd, ctk, ctv, &o->kv)) return 2;
  if (o->draft_n < 1 || o->draft_n > 32) { fprintf(stderr, "smelt %s: --draft-max must be 1..32\n", cmd); return 2; }
  if (o->n_predict < 0 || o->threads < 0 || o->ctx < 0 || o->s.temperature < 0 || o->s.top_p <= 0 || o->s.top_p > 1) {
    fprintf(stderr, "smelt %s: option out of range\n", cmd);
    return 2;
  }
  return 0;
}

static smelt_status load_ref(const run_opts *o, const char *ref, smelt_model **m) {
  char *dir = NULL;
  smelt_status st = sm_store_resolve(ref, true, &dir);
  if (st) return st;
  if (o->estimate) {
    bool cuda = o->device && !strcmp(o->device, "cuda");
    if ((st = sm_store_check_fits(dir, o->ctx, sm_store_kv_dtype_bytes(smelt_kv_type_name(o->kv)), cuda, o->force, true))) {
      free(dir);
      return st;
    }
  }
  smelt_model_params p;
  smelt_model_params_default(&p);
  p.n_threads = o->threads;
  p.max_context = o->ctx;
  p.kv_type = o->kv;
  if (o->device) {
    if (!strcmp(o->device, "cpu")) p.device = SMELT_DEVICE_CPU;
    else if (!strcmp(o->device, "cuda")) p.device = SMELT_DEVICE_CUDA;
    else { free(dir); return sm_err(SMELT_ERR_INVALID, "unknown device '%s' (cpu, cuda)", o->device); }
  }
  st = smelt_model_load(dir, &p, m);
  free(dir);
  if (!st) {
    smelt_model_info info;
    smelt_model_get_info(*m, &info);
    if (info.note && info.note[0]) fprintf(stderr, "smelt: note: %s\n", info.note);
  }
  return st;
}

/* Target model, and the draft model when --model-draft is given. */
static smelt_status load(const run_opts *o, smelt_model **m, smelt_model **draft) {
  *draft = NULL;
  smelt_status st = load_ref(o, o->model, m);
  if (st || !o->draft) return st;
  if ((st = load_ref(o, o->draft, draft))) {
    char msg[1024];
    snprintf(msg, sizeof msg, "draft model: %s", smelt_last_error());
    smelt_model_free(*m);
    *m = NULL;
    return sm_err(st, "%s", msg);
  }
  return SMELT_OK;
}

static smelt_status gen(smelt_model *m, smelt_model *draft, const run_opts *o, const int32_t *ids, int n,
                        smelt_piece_cb cb, void *user, smelt_stats *stats) {
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  sm_cli_engine_env(&ep);
  if (!draft) return sm_generate_ids(m, &ep, ids, n, o->n_predict, &o->s, cb, user, stats);
  int acc = 0;
  smelt_status st =
    sm_generate_speculative(m, draft, &ep, o->draft_n, ids, n, o->n_predict, &o->s, cb, user, stats, &acc);
  if (!st && !o->no_stats)
    fprintf(stderr, "\n[speculative: %d of %d generated tokens came from the draft model]", acc, stats->n_generated);
  return st;
}

static bool print_piece(const char *piece, size_t len, void *user) {
  (void)user;
  fwrite(piece, 1, len, stdout);
  fflush(stdout);
  return true;
}

static void print_stats(const smelt_stats *st) {
  fprintf(stderr, "\n[prompt %d tokens, prefill %.1f tok/s | generated %d tokens, decode %.1f tok/s | peak memory %.1f MiB]\n",
          st->n_prompt, st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0.0, st->n_generated,
          st->decode_s > 0 && st->n_generated > 1 ? (st->n_generated - 1) / st->decode_s : 0.0,
          st->peak_rss / (1024.0 * 1024.0));
}

static void apply_gen_defaults(const smelt_model *m, run_opts *o, bool temp_set, float fallback_temp) {
  if (temp_set) return;
  const sm_config *c = &m->cfg;
  if (c->gen_do_sample == 0) { o->s.temperature = 0; return; }
  o->s.temperature = c->gen_temperature > 0 ? c->gen_temperature : fallback_temp;
  if (o->s.top_p >= 1.0f && c->gen_top_p > 0) o->s.top_p = c->gen_top_p;
  if (o->s.top_k == 0 && c->gen_top_k > 0) o->s.top_k = c->gen_top_k;
}

int sm_cmd_generate(int argc, char **argv) {
  run_opts o;
  bool temp_set;
  int r = parse_opts("generate", argc, argv, &o, &temp_set);
  if (r) return r == 1 ? 0 : r;
  if (!o.prompt) { fprintf(stderr, "smelt generate: -p PROMPT is required\n"); return 2; }
  smelt_model *m = NULL, *draft = NULL;
  smelt_status st = load(&o, &m, &draft);
  if (st) { fprintf(stderr, "smelt generate: %s\n", smelt_last_error()); return 1; }
  if (!m->tok) { fprintf(stderr, "smelt generate: model has no tokenizer.json\n"); smelt_model_free(m); smelt_model_free(draft); return 1; }
  smelt_stats stats;
  int32_t *ids = NULL;
  size_t n = 0;
  fputs(o.prompt, stdout);
  st = smelt_tokenize(m->tok, o.prompt, strlen(o.prompt), true, &ids, &n);
  if (!st) st = gen(m, draft, &o, ids, (int)n, print_piece, NULL, &stats);
  free(ids);
  printf("\n");
  if (!st && !o.no_stats) print_stats(&stats);
  if (st) fprintf(stderr, "smelt generate: %s\n", smelt_last_error());
  smelt_model_free(m);
  smelt_model_free(draft);
  return st ? 1 : 0;
}

/* Streams a reply to stdout and keeps a copy for the conversation history. */
static bool collect_piece(const char *p, size_t l, void *u) {
  sm_buf_put(u, p, l);
  fwrite(p, 1, l, stdout);
  fflush(stdout);
  return true;
}

/* Render the conversation and generate the assistant's reply; appends it to msgs. */
static smelt_status chat_turn(smelt_model *m, smelt_model *draft, const run_opts *o, cJSON *msgs, smelt_stats *stats) {
  char *prompt = NULL;
  smelt_status st;
  bool templ = !o->raw && sm_tok_chat_template(m->tok, NULL);
  if (templ) {
    if ((st = sm_chat_apply(m->tok, msgs, NULL, true, NULL, &prompt))) return st;
  } else {
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    prompt = sm_xstrdup(cJSON_GetStringValue(cJSON_GetObjectItem(last, "content")));
  }
  int32_t *ids = NULL;
  size_t n = 0;
  /* a rendered chat template already contains BOS where the model wants it */
  st = smelt_tokenize(m->tok, prompt, strlen(prompt), !templ, &ids, &n);
  free(prompt);
  if (st) return st;
  sm_buf reply = SM_BUF_INIT;
  st = gen(m, draft, o, ids, (int)n, collect_piece, &reply, stats);
  free(ids);
  cJSON *a = cJSON_CreateObject();
  cJSON_AddStringToObject(a, "role", "assistant");
  cJSON_AddStringToObject(a, "content", sm_buf_str(&reply));
  cJSON_AddItemToArray(msgs, a);
  sm_buf_free(&reply);
  return st;
}

int sm_cmd_run(int argc, char **argv) {
  run_opts o;
  bool temp_set;
  int r = parse_opts("run", argc, argv, &o, &temp_set);
  if (r) return r == 1 ? 0 : r;
  smelt_model *m = NULL, *draft = NULL;
  smelt_status st = load(&o, &m, &draft);
  if (st) { fprintf(stderr, "smelt run: %s\n", smelt_last_error()); return 1; }
  if (!m->tok) { fprintf(stderr, "smelt run: model has no tokenizer.json\n"); smelt_model_free(m); return 1; }
  apply_gen_defaults(m, &o, temp_set, 0.7f);
  cJSON *msgs = cJSON_CreateArray();
  if (o.system) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "role", "system");
    cJSON_AddStringToObject(s, "content", o.system);
    cJSON_AddItemToArray(msgs, s);
  }
  int rc = 0;
  bool tty = isatty(0);
  char *line = NULL;
  size_t cap = 0;
  for (;;) {
    const char *text = o.prompt;
    if (!text) {
      if (tty) { fprintf(stderr, ">>> "); fflush(stderr); }
      ssize_t len = getline(&line, &cap, stdin);
      if (len < 0) break;
      while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
      if (!strcmp(line, "/bye") || !strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
      if (!strcmp(line, "/clear")) {
        while (cJSON_GetArraySize(msgs) > (o.system ? 1 : 0)) cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
        continue;
      }
      if (!len) continue;
      text = line;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", text);
    cJSON_AddItemToArray(msgs, u);
    smelt_stats stats;
    st = chat_turn(m, draft, &o, msgs, &stats);
    printf("\n");
    fflush(stdout);
    if (st) { fprintf(stderr, "smelt run: %s\n", smelt_last_error()); rc = 1; break; }
    if (!o.no_stats && (o.prompt || tty)) print_stats(&stats);
    if (o.prompt) break;
  }
  free(line);
  cJSON_Delete(msgs);
  smelt_model_free(m);
  smelt_model_free(draft);
  return rc;
}
