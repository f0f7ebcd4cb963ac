/* smelt bench: prefill / decode throughput and the memory-bandwidth roofline, on a real
 * model or a synthetic random-weight model of a known shape. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli/cli.h"
#include "cli/run.h"
#include "engine/engine.h"
#include "store/store.h"

static bool bench_emit(void *ud, int32_t tok) { (void)ud; (void)tok; return true; }

static uint64_t rng_next(uint64_t *s) { uint64_t x = *s; x ^= x << 13; x ^= x >> 7; x ^= x << 17; return *s = x; }

/* Host DRAM streaming-read bandwidth with n threads. */
typedef struct { const uint64_t *p; size_t n; uint64_t acc; } bw_arg;
static void *bw_worker(void *a) {
  bw_arg *b = a;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= b->n; i += 4) { s0 += b->p[i]; s1 += b->p[i + 1]; s2 += b->p[i + 2]; s3 += b->p[i + 3]; }
  b->acc = s0 ^ s1 ^ s2 ^ s3;
  return NULL;
}
static double host_read_bandwidth(int threads) {
  size_t bytes = (size_t)1 << 30, n = bytes / 8;
  uint64_t *buf = sm_aligned_alloc(bytes);
  if (!buf) return 0;
  for (size_t i = 0; i < n; i++) buf[i] = i * 2654435761u;
  if (threads <= 0) threads = 2;
  pthread_t th[256];
  bw_arg args[256];
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = sm_now();
    for (int t = 0; t < threads; t++) {
      args[t].p = buf + n / threads * t;
      args[t].n = n / threads;
      pthread_create(&th[t], NULL, bw_worker, &args[t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    double bw = bytes / (sm_now() - t0);
    if (bw > best) best = bw;
  }
  free(buf);
  return best;
}

int sm_cmd_bench(int argc, char **argv) {
  static const struct option lo[] = {
    { "model", 1, 0, 'm' }, { "synthetic", 1, 0, 'S' }, { "bits", 1, 0, 'b' }, { "group-size", 1, 0, 'g' },
    { "prompt-tokens", 1, 0, 'p' }, { "gen-tokens", 1, 0, 'n' }, { "threads", 1, 0, 't' }, { "device", 1, 0, 'd' },
    { "dir", 1, 0, 'D' }, { "json", 0, 0, 'j' }, { "help", 0, 0, 'h' }, { 0, 0, 0, 0 } };
  const char *model = NULL, *synth = NULL, *device = NULL, *sdir = NULL;
  int bits = 4, gs = 64, P = 512, N = 128, threads = 0, c;
  bool json = false;
  optind = 1;
  while ((c = getopt_long(argc, argv, "m:S:b:g:p:n:t:d:D:jh", lo, NULL)) != -1) {
    switch (c) {
    case 'm': model = optarg; break;
    case 'S': synth = optarg; break;
    case 'b': bits = atoi(optarg); break;
    case 'g': gs = atoi(optarg); break;
    case 'p': P = atoi(optarg); break;
    case 'n': N = atoi(optarg); break;
    case 't': threads = atoi(optarg); break;
    case 'd': device = optarg; break;
    case 'D': sdir = optarg; break;
    case 'j': json = true; break;
    case 'h':
      printf("usage: smelt bench [-m MODEL | --synthetic tiny|1b|3b|8b [--bits 0|2|3|4|5|6|8] [--group-size 32|64|128]]\n"
             "                   [-p PROMPT_TOKENS=512] [-n GEN_TOKENS=128] [-t THREADS] [--device cpu|cuda] [--dir DIR] [--json]\n"
             "Synthetic models are random-weight MLX checkpoints written once to --dir (default $TMPDIR).\n"
             "Prints prefill and decode tok/s and decode's ratio to the bandwidth roofline\n"
             "(measured bandwidth / weight bytes read per token).\n");
      return 0;
    default: return 2;
    }
  }
  if (P < 1 || N < 2) { fprintf(stderr, "smelt bench: -p >= 1 and -n >= 2 required\n"); return 2; }
  char *dir = NULL;
  smelt_status st;
  if (synth) {
    const sm_synth_shape *sh = sm_synth_find(synth);
    if (!sh) { fprintf(stderr, "smelt bench: unknown synthetic shape '%s' (tiny, 1b, 3b, 8b)\n", synth); return 2; }
    if (bits != 0 && bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8) {
      fprintf(stderr, "smelt bench: --bits must be 0 (bf16), 2, 3, 4, 5, 6 or 8\n");
      return 2;
    }
    char buf[1024];
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/smelt-bench-%s-%s%d-g%d", sdir ? sdir : tmp ? tmp : "/tmp", sh->name,
             bits ? "q" : "bf", bits ? bits : 16, gs);
    dir = sm_xstrdup(buf);
    if ((st = sm_make_synthetic(sh, bits, gs, dir, true))) { fprintf(stderr, "smelt bench: %s\n", smelt_last_error()); free(dir); return 1; }
  } else if ((st = sm_store_resolve(model, true, &dir))) {
    fprintf(stderr, "smelt bench: %s\n", smelt_last_error());
    return 1;
  }
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.n_threads = threads;
  mp.max_context = P + N + 16;
  if (device) mp.device = !strcmp(device, "cuda") ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  smelt_model *m = NULL;
  double tl = sm_now();
  if ((st = smelt_model_load(dir, &mp, &m))) { fprintf(stderr, "smelt bench: %s\n", smelt_last_error()); free(dir); return 1; }
  double load_s = sm_now() - tl;
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = P + N + 16;
  ep.max_batch_tokens = P;
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  if ((st = sm_engine_create(m, &ep, &e))) { fprintf(stderr, "smelt bench: %s\n", smelt_last_error()); smelt_model_free(m); free(dir); return 1; }
  int V = m->cfg.vocab_size;
  int32_t *prompt = sm_xmalloc(sizeof(int32_t) * (size_t)P);
  uint64_t s = 42;
  for (int i = 0; i < P; i++) prompt[i] = (int32_t)(rng_next(&s) % (uint64_t)V);
  /* greedy decoding, sampled on the backend (sm_engine_step_sample): only token ids come back */
  sm_sampler greedy;
  sm_sampler_init(&greedy, NULL, V);
  sm_sampler *gsmp = &greedy;
  int32_t tok = 0;
  uint8_t done = 0;
  /* warm-up with the same shapes as the timed run (weights paged in / uploaded, GPU
   * libraries' kernels loaded, decode graph captured) */
  sm_seq *w = sm_seq_new(e);
  sm_seq_append(e, w, prompt, P);
  while (!st && !done) st = sm_engine_step_sample(e, &w, 1, &gsmp, &tok, NULL, &done);
  if (!st) st = sm_engine_decode(e, w, gsmp, tok, 4, bench_emit, NULL, NULL);
  sm_seq_free(e, w);
  sm_seq *q = sm_seq_new(e);
  sm_seq_append(e, q, prompt, P);
  done = 0;
  double t0 = sm_now();
  while (!st && !done) st = sm_engine_step_sample(e, &q, 1, &gsmp, &tok, NULL, &done);
  double t1 = sm_now();
  /* N decode steps (with a GPU backend step k+1 is queued before token k is read back) */
  if (!st) st = sm_engine_decode(e, q, gsmp, tok, N, bench_emit, NULL, NULL);
  double t2 = sm_now();
  sm_sampler_free(&greedy);
  if (st) { fprintf(stderr, "smelt bench: %s\n", smelt_last_error()); return 1; }
  /* bytes read per decoded token: every weight except the embedding table (one row), unless tied */
  size_t emb = 0;
  {
    const sm_weight *E = &m->embed;
    if (E->data != m->lm_head.data) {
      emb = E->bits ? (size_t)E->rows * E->cols * E->bits / 8 + 2 * (size_t)E->rows * (E->cols / E->group_size) * sm_dtype_size(E->dtype)
                    : (size_t)E->rows * E->cols * sm_dtype_size(E->dtype);
    }
  }
  size_t per_tok = m->weight_bytes - emb;
  double bw = m->be->measure_bandwidth ? m->be->measure_bandwidth(m->be) : 0;
  if (bw <= 0 && !strcmp(m->be->name, "cpu")) bw = host_read_bandwidth(threads > 0 ? threads : 2);
  double prefill = P / (t1 - t0), decode = N / (t2 - t1), roof = bw > 0 ? bw / per_tok : 0;
  if (json) {
    printf("{\"model\":\"%s\",\"backend\":\"%s\",\"prompt_tokens\":%d,\"gen_tokens\":%d,\"load_s\":%.3f,"
           "\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f,\"weight_bytes_per_token\":%zu,\"bandwidth_gb_s\":%.2f,"
           "\"roofline_tok_s\":%.2f,\"roofline_ratio\":%.4f,\"peak_rss\":%zu}\n",
           synth ? synth : dir, m->be->name, P, N, load_s, prefill, decode, per_tok, bw / 1e9, roof,
           roof > 0 ? decode / roof : 0, sm_peak_rss());
  } else {
    printf("model      %s (%s, %d layers, hidden %d, vocab %d)\n", synth ? synth : dir, m->cfg.model_type,
           m->cfg.num_hidden_layers, m->cfg.hidden_size, V);
    printf("backend    %s, load %.2f s\n", m->be->name, load_s);
    printf("prefill    %d tokens: %.1f tok/s\n", P, prefill);
    printf("decode     %d tokens: %.2f tok/s (%.2f ms/token)\n", N, decode, 1000.0 / decode);
    printf("roofline   %.1f MB of weights per token, bandwidth %.1f GB/s -> %.1f tok/s; decode at %.1f%% of roofline\n",
           per_tok / 1e6, bw / 1e9, roof, roof > 0 ? 100.0 * decode / roof : 0);
    printf("memory     peak RSS %.1f MiB\n", sm_peak_rss() / 1048576.0);
  }
  free(prompt);
  sm_seq_free(e, q);
  sm_engine_free(e);
  smelt_model_free(m);
  free(dir);
  return 0;
}

int sm_cmd_perplexity(int argc, char **argv) {
  static const struct option lo[] = { { "model", 1, 0, 'm' }, { "file", 1, 0, 'f' }, { "ctx", 1, 0, 'c' },
                                      { "threads", 1, 0, 't' }, { "device", 1, 0, 'd' }, { "help", 0, 0, 'h' },
                                      { 0, 0, 0, 0 } };
  const char *model = NULL, *file = NULL, *device = NULL;
  int ctx = 256, threads = 0, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "m:f:c:t:d:h", lo, NULL)) != -1) {
    switch (c) {
    case 'm': model = optarg; break;
    case 'f': file = optarg; break;
    case 'c': ctx = atoi(optarg); break;
    case 't': threads = atoi(optarg); break;
    case 'd': device = optarg; break;
    case 'h': printf("usage: smelt perplexity [-m MODEL] -f TEXTFILE [-c WINDOW=256] [-t THREADS] [--device cpu|cuda]\n"); return 0;
    default: return 2;
    }
  }
  if (!file || ctx < 2) { fprintf(stderr, "smelt perplexity: -f FILE required (and -c >= 2)\n"); return 2; }
  char *text = NULL, *dir = NULL;
  if (sm_read_file(file, &text, NULL) || sm_store_resolve(model, true, &dir)) {
    fprintf(stderr, "smelt perplexity: %s\n", smelt_last_error());
    free(text);
    return 1;
  }
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.n_threads = threads;
  mp.max_context = ctx;
  if (device) mp.device = !strcmp(device, "cuda") ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  smelt_model *m = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  double ppl = 0;
  int scored = 0;
  smelt_status st = smelt_model_load(dir, &mp, &m);
  if (!st && !m->tok) st = sm_err(SMELT_ERR_INVALID, "model has no tokenizer");
  if (!st) st = smelt_tokenize(m->tok, text, strlen(text), true, &ids, &n);
  if (!st && ctx > m->cfg.max_position_embeddings && m->cfg.max_position_embeddings > 0)
    st = sm_err(SMELT_ERR_INVALID, "-c %d is larger than the model's context (%d tokens)", ctx,
                m->cfg.max_position_embeddings);
  sm_progress prog; /* a bar on a terminal */
  sm_progress_start(&prog, "perplexity", true);
  if (!st) st = sm_perplexity_progress(m, ids, (int)n, ctx, &ppl, &scored, sm_progress_cb, &prog);
  sm_progress_end(&prog);
  if (st) fprintf(stderr, "smelt perplexity: %s\n", smelt_last_error());
  else printf("perplexity %.4f over %d tokens (window %d)\n", ppl, scored, ctx);
  free(ids); free(text); free(dir);
  smelt_model_free(m);
  return st ? 1 : 0;
}
