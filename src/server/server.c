/* `smelt serve` lifecycle: load the model, start the scheduler (sched.c) and the HTTP front end
 * (http.c), serve until a signal, drain, shut down. */
#include "server/server.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base/mapguard.h"
#include "server/http.h"
#include "server/openai.h"
#include "server/sched.h"

void sm_server_params_default(sm_server_params *p) {
  memset(p, 0, sizeof *p);
  p->host = "127.0.0.1";
  p->port = 8080;
  p->parallel = 4;
  p->max_queue = 64;
  p->max_body = 1u << 20;
  p->max_conns = 1024;
  p->max_conns_per_ip = 256;
  p->http_threads = 4;
  p->cpu_poll = 50;
  p->header_timeout = 20;
  p->body_timeout = 60;
  p->timeout = 600;
  p->max_buffered_body = (size_t)64 << 20;
  p->shutdown_timeout = 20;
}

/* the log: stderr, or --log-file (appended; reopened on SIGHUP for log rotation) */
static bool open_log(const char *path) {
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "smelt serve: cannot open the log file %s: %s\n", path, strerror(errno));
    return false;
  }
  fflush(stderr);
  bool ok = dup2(fd, 2) == 2;
  close(fd);
  return ok;
}

/* after every engine step: did a weights file fault or change under its mapping? */
static bool weights_changed(void *arg, char *msg, size_t n) {
  (void)arg;
  return sm_mapguard_check(msg, n);
}

/* the model id the API reports: --alias, else the model directory's name */
static void model_id(const sm_server_params *p, char *out, size_t n) {
  if (p->alias && p->alias[0]) {
    snprintf(out, n, "%s", p->alias);
    return;
  }
  const char *d = p->model_dir;
  size_t l = strlen(d);
  while (l > 1 && d[l - 1] == '/') l--;
  size_t b = l;
  while (b > 0 && d[b - 1] != '/') b--;
  snprintf(out, n, "%.*s", (int)(l - b), d + b);
}

/* Wait for signals; drain on SIGTERM/SIGINT or after a fatal error. Returns the exit code. */
static int serve(const sm_server_params *p, sm_sched *sched, sm_http *http) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  int rc = SM_SERVER_EXIT_OK;
  bool draining = false, failed_all = false;
  double deadline = 0, grace_end = 0;
  for (;;) {
    struct timespec ts = {0, 100 * 1000000L};
    int sig = sigtimedwait(&set, NULL, &ts);
    double now = sm_now();
    if (sig == SIGHUP) {
      if (p->log_file && open_log(p->log_file)) fprintf(stderr, "smelt serve: SIGHUP: log file reopened\n");
      else if (!p->log_file) fprintf(stderr, "smelt serve: SIGHUP ignored (no --log-file)\n");
    } else if (sig == SIGTERM || sig == SIGINT) {
      if (!draining) {
        fprintf(stderr, "smelt serve: %s: no new requests; in-flight ones get up to %g s\n",
                sig == SIGTERM ? "SIGTERM" : "SIGINT", p->shutdown_timeout);
        draining = true;
        deadline = now + p->shutdown_timeout;
        sm_http_drain(http);
      } else {
        fprintf(stderr, "smelt serve: second signal: ending in-flight requests now\n");
        deadline = now;
      }
    }
    pthread_mutex_lock(&sched->mu);
    bool fatal = sched->fatal, idle = sm_sched_idle(sched);
    char fmsg[sizeof sched->fatal_msg];
    snprintf(fmsg, sizeof fmsg, "%s", sched->fatal_msg);
    if (draining && !failed_all && !idle && now >= deadline) {
      sm_sched_fail_all(sched, 503, "the server is shutting down");
      failed_all = true;
    }
    pthread_mutex_unlock(&sched->mu);
    if (fatal && rc == SM_SERVER_EXIT_OK) {
      fprintf(stderr, "smelt serve: fatal: %s\n", fmsg);
      rc = SM_SERVER_EXIT_FATAL;
      if (!draining) {
        draining = true;
        sm_http_drain(http);
      }
      deadline = now;
    }
    if (!draining || !idle) continue;
    /* nothing runs: let the last answers reach their clients, briefly */
    if (grace_end == 0) grace_end = now + 2;
    if (sm_http_active(http) == 0 || now >= grace_end) break;
  }
  return rc;
}

int sm_server_run(const sm_server_params *pp) {
  sm_server_params p = *pp;
  if (p.parallel < 1) p.parallel = 1;
  if (p.max_queue < 0) p.max_queue = 0;
  if (p.max_buffered_body < p.max_body) p.max_buffered_body = p.max_body; /* one body always fits */
  /* signals are taken synchronously by the main thread (serve); threads inherit the mask */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (p.log_file && !open_log(p.log_file)) return SM_SERVER_EXIT_START;
  /* a weights file truncated under the map fails the requests instead of killing the process */
  if (!p.no_mmap) sm_mapguard_install();
  sm_metrics *metrics = sm_metrics_new();
  smelt_model *model = NULL;
  sm_engine *eng = NULL;
  sm_sched sched;
  bool sched_init = false;
  sm_http *http = NULL;
  char alias[256];
  int rc = SM_SERVER_EXIT_START;
  char fmsg[512];

  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = (smelt_device)p.device;
  mp.n_threads = p.threads;
  mp.cpu_mask = p.cpu_mask;
  mp.numa = (smelt_numa)p.numa;
  mp.cpu_poll = p.cpu_poll;
  mp.max_context = p.ctx_size;
  mp.max_seqs = p.parallel;
  mp.no_mmap = p.no_mmap;
  mp.kv_type = (smelt_kv_type)p.kv_type;
  fprintf(stderr, "smelt serve: loading %s%s\n", p.model_dir, p.no_mmap ? " (into memory: --no-mmap)" : "");
  if (smelt_model_load(p.model_dir, &mp, &model) != SMELT_OK) {
    fprintf(stderr, "smelt serve: could not load the model: %s\n", smelt_last_error());
    goto out;
  }
  if (sm_mapguard_check(fmsg, sizeof fmsg)) {
    fprintf(stderr, "smelt serve: could not load the model: %s\n", fmsg);
    goto out;
  }
  const smelt_tokenizer *tok = smelt_model_tokenizer(model);
  if (!tok) {
    fprintf(stderr, "smelt serve: the model directory has no tokenizer\n");
    goto out;
  }
  smelt_model_info info;
  smelt_model_get_info(model, &info);
  if (info.note && info.note[0]) fprintf(stderr, "smelt serve: note: %s\n", info.note);
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = p.parallel;
  if (p.ctx_size > 0) ep.max_context = p.ctx_size;
  else if (info.max_context > 0) ep.max_context = info.max_context;
  if (p.kv_blocks > 0) ep.n_blocks = p.kv_blocks;
  if (p.block_size > 0) ep.block_size = p.block_size;
  if (p.max_batch_tokens > 0) ep.max_batch_tokens = p.max_batch_tokens;
  ep.prefix_cache = !p.no_prefix_cache;
  ep.host_sample = p.host_sample;
  if (sm_engine_create(model, &ep, &eng) != SMELT_OK) {
    fprintf(stderr, "smelt serve: could not create the engine: %s\n", smelt_last_error());
    goto out;
  }
  int vocab = smelt_model_vocab_size(model);
  sm_sched_init(&sched, eng, tok, metrics, vocab, p.parallel, p.max_queue);
  sched_init = true;
  sched.after_step = weights_changed;
  for (int i = 0; i < info.n_eos; i++) sm_sched_add_eos(&sched, info.eos_ids[i]);
  const char *eos_tok = sm_tok_eos_token(tok);
  if (eos_tok) sm_sched_add_eos(&sched, sm_tok_token_id(tok, eos_tok));
  static const char *const ends[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<end_of_turn>",
                                     "<|endoftext|>", "<|end|>", "</s>"};
  for (size_t i = 0; i < SM_ARRAY_LEN(ends); i++) {
    int32_t id = sm_tok_token_id(tok, ends[i]);
    if (id >= 0 && sm_tok_is_special(tok, id)) sm_sched_add_eos(&sched, id);
  }
  model_id(&p, alias, sizeof alias);
  sm_oai oai = {.model_id = alias,
                .arch = smelt_model_arch(model),
                .tok = tok,
                .vocab = vocab,
                .ctx = ep.max_context,
                .parallel = p.parallel,
                .gen_temperature = info.gen_temperature,
                .gen_top_p = info.gen_top_p,
                .gen_top_k = info.gen_top_k,
                .created = (long)time(NULL),
                .model_path = p.model_dir,
                .pooling = p.pooling};
  const char *tmpl = sm_tok_chat_template(tok, NULL);
  oai.tfmt = p.tool_format ? sm_toolfmt_by_name(p.tool_format) : sm_toolfmt_detect(tmpl);
  if (!oai.tfmt) {
    fprintf(stderr, "smelt serve: unknown --tool-format '%s' (%s)\n", p.tool_format, sm_toolfmt_names());
    goto out;
  }
  /* a template that writes <think> blocks: split them off unless --reasoning-format none */
  oai.reasoning = !(p.reasoning_format && !strcmp(p.reasoning_format, "none")) &&
                  ((tmpl && strstr(tmpl, "</think>")) || oai.tfmt->kind == SM_TF_HARMONY);

  if (!sm_sched_start(&sched)) {
    fprintf(stderr, "smelt serve: could not start the engine thread\n");
    goto out;
  }
  sm_http_cfg hc = {.p = &p, .sched = &sched, .metrics = metrics, .oai = &oai};
  http = sm_http_start(&hc);
  if (!http) {
    sm_sched_stop(&sched);
    goto out;
  }
  fprintf(stderr, "smelt serve: model '%s' (%s), ctx %d, parallel %d, %d KV blocks of %d\n", alias, oai.arch,
          oai.ctx, p.parallel, sched.stats.n_blocks, sched.stats.block_size);
  fprintf(stderr, "smelt serve: tool-call format %s, reasoning %s\n", oai.tfmt->name,
          oai.reasoning ? "split into reasoning_content" : "not split");
  fprintf(stderr, "smelt serve: listening on http://%s:%d\n", p.host, sm_http_port(http));
  fflush(stderr);
  rc = serve(&p, &sched, http);
  sm_sched_stop(&sched);
  sm_http_stop(http);
  fprintf(stderr, "smelt serve: stopped\n");
out:
  if (sched_init) sm_sched_destroy(&sched);
  if (eng) sm_engine_free(eng);
  if (model) smelt_model_free(model);
  sm_metrics_free(metrics);
  return rc;
}
