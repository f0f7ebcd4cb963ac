/* `smelt serve` lifecycle: load the model, start the scheduler (sched.c) and the HTTP front end
 * (http.c), wait for a signal, shut down. */
#include "server/server.h"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int sm_server_run(const sm_server_params *pp) {
  sm_server_params p = *pp;
  if (p.parallel < 1) p.parallel = 1;
  if (p.max_queue < 0) p.max_queue = 0;
  sm_metrics *metrics = sm_metrics_new();
  smelt_model *model = NULL;
  sm_engine *eng = NULL;
  sm_sched sched;
  bool sched_init = false;
  sm_http *http = NULL;
  char alias[256];
  int rc = 1;

  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = (smelt_device)p.device;
  mp.n_threads = p.threads;
  mp.max_context = p.ctx_size;
  mp.max_seqs = p.parallel;
  fprintf(stderr, "smelt serve: loading %s\n", p.model_dir);
  if (smelt_model_load(p.model_dir, &mp, &model) != SMELT_OK) {
    fprintf(stderr, "smelt serve: could not load the model: %s\n", smelt_last_error());
    goto out;
  }
  const smelt_tokenizer *tok = smelt_model_tokenizer(model);
  if (!tok) {
    fprintf(stderr, "smelt serve: the model directory has no tokenizer\n");
    goto out;
  }
  smelt_model_info info;
  smelt_model_get_info(model, &info);
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = p.parallel;
  if (p.ctx_size > 0) ep.max_context = p.ctx_size;
  else if (info.max_context > 0) ep.max_context = info.max_context;
  if (p.kv_blocks > 0) ep.n_blocks = p.kv_blocks;
  if (p.block_size > 0) ep.block_size = p.block_size;
  if (p.max_batch_tokens > 0) ep.max_batch_tokens = p.max_batch_tokens;
  ep.prefix_cache = !p.no_prefix_cache;
  if (sm_engine_create(model, &ep, &eng) != SMELT_OK) {
    fprintf(stderr, "smelt serve: could not create the engine: %s\n", smelt_last_error());
    goto out;
  }
  int vocab = smelt_model_vocab_size(model);
  sm_sched_init(&sched, eng, tok, metrics, vocab, p.parallel, p.max_queue);
  sched_init = true;
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
                .gen_top_k = info.gen_top_k};

  /* signals: handled synchronously by this thread */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (!sm_sched_start(&sched)) {
    fprintf(stderr, "smelt serve: could not start the engine thread\n");
    goto out;
  }
  sm_http_cfg hc = {.p = &p, .sched = &sched, .metrics = metrics, .oai = &oai};
  http = sm_http_start(&hc);
  if (http) {
    fprintf(stderr, "smelt serve: model '%s' (%s), ctx %d, parallel %d, %d KV blocks of %d\n", alias, oai.arch,
            oai.ctx, p.parallel, sched.stats.n_blocks, sched.stats.block_size);
    fprintf(stderr, "smelt serve: listening on http://%s:%d\n", p.host, sm_http_port(http));
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "smelt serve: signal %d, shutting down\n", sig);
    rc = 0;
  }
  sm_sched_stop(&sched);
  sm_http_stop(http);
out:
  if (sched_init) sm_sched_destroy(&sched);
  if (eng) sm_engine_free(eng);
  if (model) smelt_model_free(model);
  sm_metrics_free(metrics);
  return rc;
}
