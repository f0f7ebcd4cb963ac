/* smelt bench: prefill / decode throughput and the memory-bandwidth roofline, on a real
 * model or a synthetic random-weight model of a known shape. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "backend/kv_quant.h"
#include "cli/cli.h"
#include "cli/run.h"
#include "engine/engine.h"
#include "store/store.h"

static bool bench_emit(void *ud, int32_t tok) {
  (void)ud;
  (void)tok;
  return true;
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* an integer option in [lo, hi], or a message naming it */
static bool opt_int(const char *name, const char *s, long lo, long hi, int *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "smelt bench: %s %s: expected an integer in [%ld, %ld]\n", name, s, lo, hi);
    return false;
  }
  *out = (int)v;
  return true;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
/* min, median, max of v[0..n) (sorts v) */
typedef struct {
  double min, med, max;
} stat3;
static stat3 stats_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  stat3 s = {v[0], n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[n - 1]};
  return s;
}

/* B sequences of the prompt (each its own rotation of it, so that no two are alike) run together: all
 * their prompts (*t_pre seconds), then n steps of one token each (*t_dec), greedy on the backend */
static smelt_status batch_run(sm_engine *e, const int32_t *prompt, int P, int B, int n, int V, double *t_pre,
                              double *t_dec) {
  sm_seq **sq = sm_xcalloc((size_t)B, sizeof *sq), **act = sm_xcalloc((size_t)B, sizeof *act);
  sm_sampler *smp = sm_xcalloc((size_t)B, sizeof *smp), **asmp = sm_xcalloc((size_t)B, sizeof *asmp);
  int32_t *tok = sm_xcalloc((size_t)B, sizeof *tok), *rot = sm_xmalloc(sizeof(int32_t) * (size_t)P);
  int *ai = sm_xcalloc((size_t)B, sizeof *ai);
  uint8_t *done = sm_xcalloc((size_t)B, 1), *fin = sm_xcalloc((size_t)B, 1);
  smelt_status st = SMELT_OK;
  for (int b = 0; b < B && !st; b++) {
    for (int i = 0; i < P; i++) rot[i] = prompt[(i + 7 * b) % P];
    sm_sampler_init(&smp[b], NULL, V);
    sq[b] = sm_seq_new(e);
    st = sq[b] ? sm_seq_append(e, sq[b], rot, P) : SMELT_ERR_OOM;
  }
  double t0 = sm_now();
  for (int left = B; !st && left > 0;) { /* the prompts, in steps of up to max_batch_tokens */
    int na = 0;
    for (int b = 0; b < B; b++)
      if (!fin[b]) {
        act[na] = sq[b];
        asmp[na] = &smp[b];
        ai[na++] = b;
      }
    st = sm_engine_step_sample(e, act, na, asmp, tok, NULL, done);
    for (int k = 0; k < na && !st; k++)
      if (done[k]) {
        fin[ai[k]] = 1;
        left--;
        st = sm_seq_append(e, sq[ai[k]], &tok[k], 1);
      }
  }
  double t1 = sm_now();
  for (int b = 0; b < B; b++) {
    act[b] = sq[b];
    asmp[b] = &smp[b];
  }
  for (int s = 0; s < n && !st; s++) {
    st = sm_engine_step_sample(e, act, B, asmp, tok, NULL, done);
    for (int b = 0; b < B && !st; b++) {
      if (!done[b]) st = sm_err(SMELT_ERR_BACKEND, "bench: a batch decode step left sequence %d unfinished", b);
      else st = sm_seq_append(e, act[b], &tok[b], 1);
    }
  }
  *t_pre = t1 - t0;
  *t_dec = sm_now() - t1;
  for (int b = 0; b < B; b++) {
    if (sq[b]) sm_seq_free(e, sq[b]);
    sm_sampler_free(&smp[b]);
  }
  free(sq);
  free(act);
  free(smp);
  free(asmp);
  free(tok);
  free(rot);
  free(ai);
  free(done);
  free(fin);
  return st;
}

static void print_shapes(FILE *f) {
  size_t n;
  const sm_synth_shape *sh = sm_synth_all(&n);
  for (size_t i = 0; i < n; i++) fprintf(f, "%s%s", i ? ", " : "", sh[i].name);
}

static void usage(void) {
  printf("usage: smelt bench [-m MODEL | --synthetic SHAPE [--bits 0|2|3|4|5|6|8]\n"
         "                   [--group-size 32|64|128]] [-p PROMPT_TOKENS=512] [-n GEN_TOKENS=128] [-r REPEAT=1]\n"
         "                   [-t THREADS] [--device cpu|cuda] [-ctk f16|bf16|f32|q8_0|q4_0] [--dir DIR] [--json]\n"
         "                   [--cpu-mask M] [--numa distribute|isolate|none] [--poll 0..100] [--deterministic]\n"
         "                   [-tp N (split the model over N GPUs, one process each)]\n"
         "                   [-pp N (split its layers in N stages over N GPUs, one process each)]\n"
         "                   [--batch B (also B sequences at once: their prefill, then decode steps of B tokens)]\n"
         "Synthetic models are random-weight MLX checkpoints written once to --dir (default $TMPDIR).\n"
         "SHAPE: ");
  print_shapes(stdout);
  printf(".\n"
         "Prints prefill and decode tok/s (with -r N: min / median / max of N timed runs) and decode's\n"
         "ratio to the bandwidth roofline: the backend's measured read bandwidth (CPU: all its threads,\n"
         "a buffer well past the caches) over the weight bytes read per token. Models that fit in the\n"
         "CPU caches can decode above the DRAM roofline. With --batch B it also prints the tok/s of B\n"
         "sequences of the same lengths run together (prefill in steps of up to max(P, B) tokens, then N\n"
         "steps of one token each), as llama-batched-bench does.\n");
}

int sm_cmd_bench(int argc, char **argv) {
  static const struct option lo[] = {{"model", 1, 0, 'm'},
                                     {"synthetic", 1, 0, 'S'},
                                     {"bits", 1, 0, 'b'},
                                     {"group-size", 1, 0, 'g'},
                                     {"prompt-tokens", 1, 0, 'p'},
                                     {"gen-tokens", 1, 0, 'n'},
                                     {"threads", 1, 0, 't'},
                                     {"device", 1, 0, 'd'},
                                     {"repeat", 1, 0, 'r'},
                                     {"dir", 1, 0, 'D'},
                                     {"json", 0, 0, 'j'},
                                     {"cache-type-k", 1, 0, 'K'},
                                     {"cache-type-v", 1, 0, 'V'},
                                     {"help", 0, 0, 'h'},
                                     {"cpu-mask", 1, 0, 'C'},
                                     {"numa", 1, 0, 'N'},
                                     {"poll", 1, 0, 'P'},
                                     {"deterministic", 0, 0, 'I'},
                                     {"tensor-parallel", 1, 0, 'T'},
                                     {"pipeline-parallel", 1, 0, 'L'},
                                     {"batch", 1, 0, 'B'},
                                     {0, 0, 0, 0}};
  const char *model = NULL, *synth = NULL, *device = NULL, *sdir = NULL, *ctk = NULL, *ctv = NULL, *cpu_mask = NULL;
  int bits = 4, gs = 64, P = 512, N = 128, threads = 0, reps = 1, poll = 50, tp = 1, pp = 1, B = 1, c;
  smelt_numa numa = SMELT_NUMA_NONE;
  bool json = false, ok = true, det = false;
  optind = 1;
  sm_cli_kv_alias(argc, argv);
  while ((c = getopt_long(argc, argv, "m:S:b:g:p:n:t:d:r:D:jhC:", lo, NULL)) != -1) {
    switch (c) {
      case 'C': cpu_mask = optarg; break;
      case 'P': ok = opt_int("--poll", optarg, 0, 100, &poll); break;
      case 'N':
        if (smelt_numa_parse(optarg, &numa)) {
          fprintf(stderr, "smelt bench: %s\n", smelt_last_error());
          return 2;
        }
        break;
      case 'm': model = optarg; break;
      case 'S': synth = optarg; break;
      case 'K': ctk = optarg; break;
      case 'V': ctv = optarg; break;
      case 'b': ok = opt_int("--bits", optarg, 0, 8, &bits); break;
      case 'g': ok = opt_int("--group-size", optarg, 32, 128, &gs); break;
      case 'p': ok = opt_int("-p", optarg, 1, 1 << 20, &P); break;
      case 'n': ok = opt_int("-n", optarg, 2, 1 << 20, &N); break;
      case 't': ok = opt_int("-t", optarg, 0, 256, &threads); break;
      case 'r': ok = opt_int("-r", optarg, 1, 1000, &reps); break;
      case 'd': device = optarg; break;
      case 'D': sdir = optarg; break;
      case 'j': json = true; break;
      case 'I': det = true; break;
      case 'T': ok = opt_int("--tensor-parallel", optarg, 1, 16, &tp); break;
      case 'L': ok = opt_int("--pipeline-parallel", optarg, 1, 16, &pp); break;
      case 'B': ok = opt_int("--batch", optarg, 1, 1024, &B); break;
      case 'h': usage(); return 0;
      default: return 2;
    }
    if (!ok) return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "smelt bench: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  smelt_kv_type kvt = SMELT_KV_F16;
  if (sm_cli_kv_type("bench", ctk, ctv, &kvt)) return 2;
  if (device && strcmp(device, "cpu") && strcmp(device, "cuda")) {
    fprintf(stderr, "smelt bench: --device %s: expected cpu or cuda\n", device);
    return 2;
  }
  char *dir = NULL;
  smelt_status st;
  if (synth) {
    const sm_synth_shape *sh = sm_synth_find(synth);
    if (!sh) {
      fprintf(stderr, "smelt bench: unknown synthetic shape '%s' (", synth);
      print_shapes(stderr);
      fprintf(stderr, ")\n");
      return 2;
    }
    if (bits != 0 && bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8) {
      fprintf(stderr, "smelt bench: --bits must be 0 (bf16), 2, 3, 4, 5, 6 or 8\n");
      return 2;
    }
    if (gs != 32 && gs != 64 && gs != 128) {
      fprintf(stderr, "smelt bench: --group-size must be 32, 64 or 128\n");
      return 2;
    }
    char buf[1024];
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/smelt-bench-%s-%s%d-g%d",
             sdir          ? sdir
             : tmp && *tmp ? tmp
                           : "/tmp",
             sh->name, bits ? "q" : "bf", bits ? bits : 16, gs);
    dir = sm_xstrdup(buf);
    if ((st = sm_make_synthetic(sh, bits, gs, dir, true))) {
      fprintf(stderr, "smelt bench: %s\n", smelt_last_error());
      free(dir);
      return 1;
    }
  } else if ((st = sm_store_resolve(model, true, &dir))) {
    fprintf(stderr, "smelt bench: %s\n", smelt_last_error());
    return 1;
  }
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.n_threads = threads;
  mp.cpu_mask = cpu_mask;
  mp.numa = numa;
  mp.cpu_poll = poll;
  mp.max_context = P + N + 16;
  mp.kv_type = kvt;
  mp.deterministic = det;
  mp.tensor_parallel = tp;
  mp.pipeline_parallel = pp;
  if (device) mp.device = !strcmp(device, "cuda") ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  smelt_model *m = NULL;
  double tl = sm_now();
  if ((st = smelt_model_load(dir, &mp, &m))) {
    fprintf(stderr, "smelt bench: %s\n", smelt_last_error());
    free(dir);
    return 1;
  }
  double load_s = sm_now() - tl;
  smelt_model_info info;
  smelt_model_get_info(m, &info);
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  sm_cli_engine_env(&ep);
  ep.max_context = P + N + 16;
  ep.max_batch_tokens = P > B ? P : B;
  ep.max_seqs = B;
  ep.prefix_cache = false;
  sm_engine *e = NULL;
  if ((st = sm_engine_create(m, &ep, &e))) {
    fprintf(stderr, "smelt bench: %s\n", smelt_last_error());
    smelt_model_free(m);
    free(dir);
    return 1;
  }
  const int V = info.vocab;
  int32_t *prompt = sm_xmalloc(sizeof(int32_t) * (size_t)P);
  uint64_t s = 42;
  for (int i = 0; i < P; i++) prompt[i] = (int32_t)(rng_next(&s) % (uint64_t)V);
  /* greedy decoding, sampled on the backend (sm_engine_step_sample): only token ids come back */
  sm_sampler greedy;
  sm_sampler_init(&greedy, NULL, V);
  sm_sampler *gsmp = &greedy;
  int32_t tok = 0;
  uint8_t done = 0;
  /* warm-up with the same shapes as the timed runs (weights paged in / uploaded, GPU
   * libraries' kernels loaded, decode graph captured) */
  sm_seq *w = sm_seq_new(e);
  st = sm_seq_append(e, w, prompt, P);
  while (!st && !done) st = sm_engine_step_sample(e, &w, 1, &gsmp, &tok, NULL, &done);
  if (!st) st = sm_engine_decode(e, w, gsmp, tok, 4, bench_emit, NULL, NULL);
  sm_seq_free(e, w);
  double *pre = sm_xmalloc(sizeof(double) * (size_t)reps), *dec = sm_xmalloc(sizeof(double) * (size_t)reps);
  for (int r = 0; r < reps && !st; r++) {
    sm_seq *q = sm_seq_new(e);
    st = sm_seq_append(e, q, prompt, P);
    done = 0;
    double t0 = sm_now();
    while (!st && !done) st = sm_engine_step_sample(e, &q, 1, &gsmp, &tok, NULL, &done);
    double t1 = sm_now();
    /* N decode steps (with a GPU backend step k+1 is queued before token k is read back) */
    if (!st) st = sm_engine_decode(e, q, gsmp, tok, N, bench_emit, NULL, NULL);
    double t2 = sm_now();
    sm_seq_free(e, q);
    pre[r] = P / (t1 - t0);
    dec[r] = N / (t2 - t1);
  }
  /* --batch: B sequences together, one warm-up round (the batch's shapes) then reps timed */
  double *bpre = sm_xmalloc(sizeof(double) * (size_t)reps), *bdec = sm_xmalloc(sizeof(double) * (size_t)reps);
  for (int r = -1; B > 1 && r < reps && !st; r++) {
    double tp0 = 0, tp1 = 0;
    st = batch_run(e, prompt, P, B, r < 0 ? 4 : N, V, &tp0, &tp1);
    if (r >= 0) {
      bpre[r] = (double)B * P / tp0;
      bdec[r] = (double)B * N / tp1;
    }
  }
  sm_sampler_free(&greedy);
  free(prompt);
  if (st) {
    fprintf(stderr, "smelt bench: %s\n", smelt_last_error());
    free(pre);
    free(dec);
    free(bpre);
    free(bdec);
    sm_engine_free(e);
    smelt_model_free(m);
    free(dir);
    return 1;
  }
  stat3 sp = stats_of(pre, reps), sd = stats_of(dec, reps), bp = {0, 0, 0}, bd = {0, 0, 0};
  if (B > 1) {
    bp = stats_of(bpre, reps);
    bd = stats_of(bdec, reps);
  }
  free(pre);
  free(dec);
  free(bpre);
  free(bdec);
  const size_t rss = sm_peak_rss(); /* before the bandwidth probe's buffer */
  /* the roofline: bytes one decode step reads over the backend's measured read bandwidth: the weights
   * and the K/V rows of every position before it (on average P + N / 2; full attention in every
   * attention layer), and a hybrid model's recurrent state (read and written once) */
  const size_t per_tok = info.decode_bytes;
  const double kv_pos = (m->cfg.mla.kv_rank > 0 ? 1.0 : 2.0) * sm_config_attn_layers(&m->cfg) * info.n_kv_heads *
                        (double)sm_kv_head_bytes(m->kv_dtype, info.head_dim);
  const double kv_tok = kv_pos * (P + N / 2.0), state_tok = 2.0 * (double)sm_model_state_bytes(m);
  const double bw = smelt_model_bandwidth(m), roof = bw > 0 ? bw / ((double)per_tok + kv_tok + state_tok) : 0;
  const double ratio = roof > 0 ? sd.med / roof : 0;
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", synth ? synth : dir);
    cJSON_AddStringToObject(j, "backend", info.backend);
    cJSON_AddNumberToObject(j, "threads", info.n_threads);
    cJSON_AddNumberToObject(j, "prompt_tokens", P);
    cJSON_AddNumberToObject(j, "gen_tokens", N);
    cJSON_AddNumberToObject(j, "repeat", reps);
    cJSON_AddNumberToObject(j, "load_s", load_s);
    cJSON_AddNumberToObject(j, "prefill_tok_s", sp.med);
    cJSON_AddNumberToObject(j, "prefill_tok_s_min", sp.min);
    cJSON_AddNumberToObject(j, "prefill_tok_s_max", sp.max);
    cJSON_AddNumberToObject(j, "decode_tok_s", sd.med);
    cJSON_AddNumberToObject(j, "decode_tok_s_min", sd.min);
    cJSON_AddNumberToObject(j, "decode_tok_s_max", sd.max);
    cJSON_AddNumberToObject(j, "weight_bytes_per_token", (double)per_tok);
    cJSON_AddStringToObject(j, "kv_type", smelt_kv_type_name(info.kv_type));
    cJSON_AddNumberToObject(j, "kv_bytes_per_token", kv_tok);
    cJSON_AddNumberToObject(j, "kv_bytes_per_position", kv_pos);
    cJSON_AddNumberToObject(j, "state_bytes_per_token", state_tok);
    cJSON_AddNumberToObject(j, "bandwidth_gb_s", bw / 1e9);
    cJSON_AddNumberToObject(j, "roofline_tok_s", roof);
    cJSON_AddNumberToObject(j, "roofline_ratio", ratio);
    cJSON_AddNumberToObject(j, "peak_rss", (double)rss);
    cJSON_AddNumberToObject(j, "tensor_parallel", info.tensor_parallel);
    cJSON_AddNumberToObject(j, "pipeline_parallel", info.pipeline_parallel);
    if (B > 1) {
      cJSON_AddNumberToObject(j, "batch", B);
      cJSON_AddNumberToObject(j, "batch_prefill_tok_s", bp.med);
      cJSON_AddNumberToObject(j, "batch_decode_tok_s", bd.med);
      cJSON_AddNumberToObject(j, "batch_decode_tok_s_min", bd.min);
      cJSON_AddNumberToObject(j, "batch_decode_tok_s_max", bd.max);
    }
    char *txt = cJSON_PrintUnformatted(j);
    printf("%s\n", txt);
    free(txt);
    cJSON_Delete(j);
  } else {
    printf("model      %s (%s, %d layers, hidden %d, vocab %d)\n", synth ? synth : dir, info.arch, info.n_layers,
           info.hidden, V);
    char split[48] = "";
    if (info.tensor_parallel > 1) snprintf(split, sizeof split, ", split over %d ranks", info.tensor_parallel);
    if (info.pipeline_parallel > 1) snprintf(split, sizeof split, ", %d pipeline stages", info.pipeline_parallel);
    if (info.n_threads > 0)
      printf("backend    %s, %d thread%s%s, load %.2f s\n", info.backend, info.n_threads, info.n_threads > 1 ? "s" : "",
             split, load_s);
    else printf("backend    %s%s, load %.2f s\n", info.backend, split, load_s);
    if (reps == 1) {
      printf("prefill    %d tokens: %.1f tok/s\n", P, sp.med);
      printf("decode     %d tokens: %.2f tok/s (%.2f ms/token)\n", N, sd.med, 1000.0 / sd.med);
    } else {
      printf("prefill    %d tokens: %.1f tok/s median of %d runs (min %.1f, max %.1f)\n", P, sp.med, reps, sp.min,
             sp.max);
      printf("decode     %d tokens: %.2f tok/s (%.2f ms/token) median of %d runs (min %.2f, max %.2f)\n", N, sd.med,
             1000.0 / sd.med, reps, sd.min, sd.max);
    }
    char stb[64] = "";
    if (state_tok > 0) snprintf(stb, sizeof stb, " + %.1f MB of recurrent state", state_tok / 1e6);
    if (bw > 0)
      printf("roofline   %.1f MB of weights + %.1f MB of %s KV%s per token, bandwidth %.1f GB/s -> %.1f tok/s; decode "
             "at %.1f%% of roofline\n",
             per_tok / 1e6, kv_tok / 1e6, smelt_kv_type_name(info.kv_type), stb, bw / 1e9, roof, 100.0 * ratio);
    else
      printf("roofline   %.1f MB of weights + %.1f MB of KV per token; bandwidth unknown\n", per_tok / 1e6,
             kv_tok / 1e6);
    if (B > 1)
      printf("batch      %d sequences: prefill %.1f tok/s, decode %.2f tok/s in all (%.2f ms a step of %d tokens)%s\n",
             B, bp.med, bd.med, 1000.0 * B / bd.med, B, reps > 1 ? ", medians" : "");
    printf("memory     peak RSS %.1f MiB\n", rss / 1048576.0);
  }
  sm_engine_free(e);
  smelt_model_free(m);
  free(dir);
  return 0;
}

int sm_cmd_perplexity(int argc, char **argv) {
  static const struct option lo[] = {{"model", 1, 0, 'm'},
                                     {"file", 1, 0, 'f'},
                                     {"ctx", 1, 0, 'c'},
                                     {"threads", 1, 0, 't'},
                                     {"device", 1, 0, 'd'},
                                     {"help", 0, 0, 'h'},
                                     {"cache-type-k", 1, 0, 'K'},
                                     {"cache-type-v", 1, 0, 'V'},
                                     {"decode", 0, 0, 'D'},
                                     {"deterministic", 0, 0, 'I'},
                                     {"tensor-parallel", 1, 0, 'T'},
                                     {"pipeline-parallel", 1, 0, 'L'},
                                     {0, 0, 0, 0}};
  const char *model = NULL, *file = NULL, *device = NULL, *ctk = NULL, *ctv = NULL;
  int ctx = 256, threads = 0, tp = 1, pp = 1, c;
  bool decode = false, det = false;
  optind = 1;
  sm_cli_kv_alias(argc, argv);
  while ((c = getopt_long(argc, argv, "m:f:c:t:d:h", lo, NULL)) != -1) {
    switch (c) {
      case 'K': ctk = optarg; break;
      case 'V': ctv = optarg; break;
      case 'D': decode = true; break;
      case 'I': det = true; break;
      case 'T':
        if (!opt_int("--tensor-parallel", optarg, 1, 16, &tp)) return 2;
        break;
      case 'L':
        if (!opt_int("--pipeline-parallel", optarg, 1, 16, &pp)) return 2;
        break;
      case 'm': model = optarg; break;
      case 'f': file = optarg; break;
      case 'c': ctx = atoi(optarg); break;
      case 't': threads = atoi(optarg); break;
      case 'd': device = optarg; break;
      case 'h':
        printf("usage: smelt perplexity [-m MODEL] -f TEXTFILE [-c WINDOW=256] [-t THREADS] [--device cpu|cuda]\n"
               "                        [-ctk f16|bf16|f32|q8_0|q4_0] [--decode] [--deterministic]\n"
               "  --decode         score token by token through one-token forward steps (the decode kernels)\n"
               "                   instead of one prefill a window\n"
               "  --deterministic  batch-invariant kernels (as smelt serve --deterministic)\n"
               "  -tp N            split the model over N GPUs, one process each\n"
               "  -pp N            split the model's layers in N stages over N GPUs, one process each\n");
        return 0;
      default: return 2;
    }
  }
  if (!file || ctx < 2) {
    fprintf(stderr, "smelt perplexity: -f FILE required (and -c >= 2)\n");
    return 2;
  }
  smelt_kv_type kvt = SMELT_KV_F16;
  if (sm_cli_kv_type("perplexity", ctk, ctv, &kvt)) return 2;
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
  mp.kv_type = kvt;
  mp.deterministic = det;
  mp.tensor_parallel = tp;
  mp.pipeline_parallel = pp;
  if (device) mp.device = !strcmp(device, "cuda") ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  smelt_model *m = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  double ppl = 0;
  int scored = 0;
  smelt_status st = smelt_model_load(dir, &mp, &m);
  if (!st && !smelt_model_tokenizer(m)) st = sm_err(SMELT_ERR_INVALID, "model has no tokenizer");
  if (!st) st = smelt_tokenize(smelt_model_tokenizer(m), text, strlen(text), true, &ids, &n);
  if (!st && ctx > m->cfg.max_position_embeddings && m->cfg.max_position_embeddings > 0)
    st = sm_err(SMELT_ERR_INVALID, "-c %d is larger than the model's context (%d tokens)", ctx,
                m->cfg.max_position_embeddings);
  sm_progress prog; /* a bar on a terminal */
  sm_progress_start(&prog, "perplexity", true);
  if (!st) st = sm_perplexity_progress(m, ids, (int)n, ctx, decode, &ppl, &scored, sm_progress_cb, &prog);
  sm_progress_end(&prog);
  if (st) fprintf(stderr, "smelt perplexity: %s\n", smelt_last_error());
  else printf("perplexity %.4f over %d tokens (window %d%s)\n", ppl, scored, ctx, decode ? ", one token a step" : "");
  free(ids);
  free(text);
  free(dir);
  smelt_model_free(m);
  return st ? 1 : 0;
}
