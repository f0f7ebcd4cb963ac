/* The shared grammar mask cache (grammar_cache.h): masks served from a cache that many sequences
 * fill are identical to masks built without it, over random walks of a JSON-schema grammar, a
 * GBNF grammar of non-ASCII characters (tokens that end inside a UTF-8 character), json_object
 * and bounded repetitions; with a budget so small that masks are evicted all the time; from two
 * threads at once; and the cache's own LRU bookkeeping. sm_grammar_mask_many (a step's masks at
 * once, on a pool of threads) equals sm_grammar_mask state by state. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"
#include "engine/grammar.h"
#include "engine/grammar_cache.h"
#include "engine/grammar_schema.h"
#include "tokenizer/tokenizer.h"

static smelt_tokenizer *g_tok;
static sm_grammar_vocab *g_voc;
static int g_V;
static int32_t g_byte_tok[256]; /* single-byte tokens >= 0x80 (UTF-8 pieces) */
static int g_n_byte;

static uint64_t xs(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

/* an allowed token of mask (count c): half of the time a single-byte UTF-8 piece if one is allowed */
static int32_t pick(const uint32_t *mask, int c, uint64_t *x) {
  uint64_t r = xs(x);
  if (r & 1) {
    int n1 = 0;
    for (int i = 0; i < g_n_byte; i++) n1 += sm_mask_test(mask, g_byte_tok[i]);
    if (n1) {
      int k = (int)((r >> 8) % (uint64_t)n1);
      for (int i = 0; i < g_n_byte; i++)
        if (sm_mask_test(mask, g_byte_tok[i]) && k-- == 0) return g_byte_tok[i];
    }
  }
  int k = (int)((r >> 1) % (uint64_t)c);
  for (int32_t i = 0; i < g_V; i++)
    if (sm_mask_test(mask, i) && k-- == 0) return i;
  return -1;
}

typedef struct {
  const sm_grammar *g;
  sm_gmask_cache *cache;
  int walks, seqs, steps;
  uint64_t seed;
  int mismatches, count_diff, checked, fresh_checked;
} walk_job;

/* `seqs` sequences walk at once (their masks fill the same cache); every mask of a cached state
 * is compared with the mask of an uncached state fed the same tokens, and every 7th step also
 * with the mask of a brand-new uncached state replaying the whole prefix */
static void *walk(void *arg) {
  walk_job *j = arg;
  const size_t W = (size_t)(g_V + 31) / 32;
  uint32_t *m = malloc(4 * W), *r = malloc(4 * W), *f = malloc(4 * W);
  int32_t *hist = malloc(sizeof(int32_t) * (size_t)j->seqs * (size_t)j->steps);
  sm_grammar_state **cs = calloc((size_t)j->seqs, sizeof *cs), **rs = calloc((size_t)j->seqs, sizeof *rs);
  int *len = calloc((size_t)j->seqs, sizeof *len);
  bool *live = calloc((size_t)j->seqs, 1);
  uint64_t x = j->seed;
  for (int w = 0; w < j->walks; w++) {
    for (int q = 0; q < j->seqs; q++) {
      cs[q] = sm_grammar_state_new(j->g, g_voc);
      sm_grammar_state_set_cache(cs[q], j->cache);
      rs[q] = sm_grammar_state_new(j->g, g_voc);
      len[q] = 0;
      live[q] = true;
    }
    for (int k = 0; k < j->steps; k++)
      for (int q = 0; q < j->seqs; q++) {
        if (!live[q]) continue;
        int c = sm_grammar_mask(cs[q], m), cr = sm_grammar_mask(rs[q], r);
        j->checked++;
        j->mismatches += memcmp(m, r, 4 * W) != 0;
        j->count_diff += c != cr;
        if ((k + q) % 7 == 3) {
          sm_grammar_state *fs = sm_grammar_state_new(j->g, g_voc);
          for (int i = 0; i < len[q]; i++) sm_grammar_accept(fs, hist[q * j->steps + i]);
          sm_grammar_mask(fs, f);
          j->mismatches += memcmp(m, f, 4 * W) != 0;
          j->fresh_checked++;
          sm_grammar_state_free(fs);
        }
        int32_t t = c ? pick(m, c, &x) : -1;
        if (t < 0 || sm_grammar_accept(cs[q], t) != SMELT_OK || sm_grammar_accept(rs[q], t) != SMELT_OK ||
            sm_grammar_ended(cs[q])) {
          live[q] = false;
          continue;
        }
        hist[q * j->steps + len[q]++] = t;
      }
    for (int q = 0; q < j->seqs; q++) {
      sm_grammar_state_free(cs[q]);
      sm_grammar_state_free(rs[q]);
    }
  }
  free(m);
  free(r);
  free(f);
  free(hist);
  free(cs);
  free(rs);
  free(len);
  free(live);
  return NULL;
}

static sm_grammar *compile(const char *gbnf) {
  sm_grammar *g = NULL;
  CHECK(sm_grammar_compile(gbnf, &g) == SMELT_OK, "compile: %s", sm_errmsg());
  return g;
}

static sm_grammar *compile_schema(const char *schema) {
  cJSON *sc = cJSON_Parse(schema);
  char *gb = NULL;
  CHECK(sc && sm_schema_to_gbnf(sc, false, &gb) == SMELT_OK, "schema: %s", sm_errmsg());
  sm_grammar *g = gb ? compile(gb) : NULL;
  free(gb);
  cJSON_Delete(sc);
  return g;
}

static void check_walks(const char *name, const sm_grammar *g, size_t budget, int walks, int seqs, int steps,
                        int threads) {
  if (!g) return;
  sm_gmask_cache *c = sm_gmask_cache_new(budget);
  walk_job j[2];
  pthread_t th[2];
  for (int i = 0; i < threads; i++) {
    j[i] = (walk_job){.g = g,
                      .cache = c,
                      .walks = walks,
                      .seqs = seqs,
                      .steps = steps,
                      .seed = 0x9E3779B97F4A7C15ull + (uint64_t)i * 7919};
    pthread_create(&th[i], NULL, walk, &j[i]);
  }
  int mism = 0, cnt = 0, checked = 0, fresh = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    mism += j[i].mismatches;
    cnt += j[i].count_diff;
    checked += j[i].checked;
    fresh += j[i].fresh_checked;
  }
  sm_gmask_cache_stats st;
  sm_gmask_cache_stats_get(c, &st);
  printf("%-28s %5d masks (%d also against a new state): cache %llu hits, %llu misses, %llu evictions, %zu kept\n",
         name, checked, fresh, (unsigned long long)st.hits, (unsigned long long)st.misses,
         (unsigned long long)st.evictions, st.entries);
  CHECK(mism == 0 && cnt == 0, "%s: %d of %d cached masks differ from masks built without the cache (%d counts)", name,
        mism, checked, cnt);
  CHECK(st.hits + st.misses == (uint64_t)checked, "%s: every mask looked up (%llu of %d)", name,
        (unsigned long long)(st.hits + st.misses), checked);
  /* the walks repeat states (string interiors): the cache must be serving them */
  CHECK(st.hits > 0 && st.bytes <= st.max_bytes, "%s: hits %llu, %zu of %zu bytes", name, (unsigned long long)st.hits,
        st.bytes, st.max_bytes);
  sm_gmask_cache_free(c);
}

/* sm_grammar_mask_many, on a pool of 3 threads and on the caller alone, against sm_grammar_mask on
 * states of their own fed the same tokens: sequences in pairs that take the same tokens (one key:
 * one walk, one copy), walking until they end, with and without a shared cache */
static void test_many(const sm_grammar *g) {
  enum { N = 16, STEPS = 48 };
  if (!g) return;
  const size_t W = (size_t)(g_V + 31) / 32;
  sm_pool *pool = sm_pool_create(3, NULL, 0);
  CHECK(pool != NULL, "pool");
  for (int use_cache = 0; use_cache < 2 && pool; use_cache++) {
    sm_gmask_cache *c = use_cache ? sm_gmask_cache_new(64u << 20) : NULL;
    sm_grammar_state *ms[N], *rs[N];
    uint32_t *mm[N], *r = malloc(4 * W);
    int cnt[N], mism = 0, checked = 0, ended = 0;
    for (int q = 0; q < N; q++) {
      ms[q] = sm_grammar_state_new(g, g_voc);
      sm_grammar_state_set_cache(ms[q], c);
      rs[q] = sm_grammar_state_new(g, g_voc);
      mm[q] = malloc(4 * W);
    }
    uint64_t x = 0x2545F4914F6CDD1Dull + (uint64_t)use_cache;
    for (int k = 0; k < STEPS; k++) {
      sm_grammar_mask_many(ms, mm, cnt, N, k % 2 ? pool : NULL);
      for (int q = 0; q < N; q++) {
        const int cr = sm_grammar_mask(rs[q], r);
        checked++;
        mism += memcmp(mm[q], r, 4 * W) != 0 || cnt[q] != cr;
      }
      for (int q = 0; q < N; q += 2) {
        const int32_t t = cnt[q] ? pick(mm[q], cnt[q], &x) : -1;
        for (int u = q; u < q + 2 && t >= 0; u++) {
          sm_grammar_accept(ms[u], t); /* refused once ended: the state stays */
          sm_grammar_accept(rs[u], t);
        }
      }
    }
    for (int q = 0; q < N; q++) {
      ended += sm_grammar_ended(ms[q]);
      sm_grammar_state_free(ms[q]);
      sm_grammar_state_free(rs[q]);
      free(mm[q]);
    }
    free(r);
    sm_gmask_cache_free(c);
    printf("mask_many %s: %d masks, %d of %d sequences ended\n", use_cache ? "shared cache" : "no cache", checked,
           ended, N);
    CHECK(mism == 0, "mask_many (%s): %d of %d masks differ from sm_grammar_mask's", use_cache ? "cache" : "no cache",
          mism, checked);
  }
  if (pool) sm_pool_destroy(pool);
}

/* LRU bookkeeping on synthetic keys: budget, eviction order, byte-exact keys */
static void test_lru(void) {
  const size_t words = 64;
  uint32_t a[64], b[64];
  int cnt;
  for (size_t i = 0; i < words; i++) a[i] = (uint32_t)i * 2654435761u;
  /* room for three entries of 4-byte keys (entry overhead is below 128 bytes) */
  sm_gmask_cache *c = sm_gmask_cache_new(3 * (words * 4 + 128));
  uint32_t k[5] = {10, 11, 12, 13, 14};
  for (int i = 0; i < 3; i++) {
    a[0] = k[i];
    sm_gmask_cache_put(c, 7 /* one bucket: keys decide */, &k[i], 4, a, words, i + 100);
  }
  CHECK(sm_gmask_cache_get(c, 7, &k[0], 4, b, words, &cnt) && cnt == 100 && b[0] == 10, "entry 0 there");
  a[0] = k[3];
  sm_gmask_cache_put(c, 7, &k[3], 4, a, words, 103); /* evicts the least recent: entry 1 */
  CHECK(!sm_gmask_cache_get(c, 7, &k[1], 4, b, words, &cnt), "least recently used entry evicted");
  CHECK(sm_gmask_cache_get(c, 7, &k[0], 4, b, words, &cnt) && cnt == 100, "recently used entry kept");
  CHECK(sm_gmask_cache_get(c, 7, &k[3], 4, b, words, &cnt) && cnt == 103 && b[0] == 13 && b[5] == a[5], "new entry");
  CHECK(!sm_gmask_cache_get(c, 7, &k[4], 4, b, words, &cnt), "same hash, other key: a miss");
  CHECK(!sm_gmask_cache_get(c, 7, &k[0], 4, b, words - 1, &cnt), "same key, other vocabulary size: a miss");
  sm_gmask_cache_stats st;
  sm_gmask_cache_stats_get(c, &st);
  CHECK(st.entries == 3 && st.evictions == 1 && st.bytes <= st.max_bytes, "stats: %zu entries, %llu evictions",
        st.entries, (unsigned long long)st.evictions);
  sm_gmask_cache_clear(c);
  CHECK(!sm_gmask_cache_get(c, 7, &k[0], 4, b, words, &cnt), "cleared");
  sm_gmask_cache_free(c);
  sm_gmask_cache *z = sm_gmask_cache_new(0);
  sm_gmask_cache_put(z, 1, &k[0], 4, a, words, 1);
  CHECK(!sm_gmask_cache_get(z, 1, &k[0], 4, b, words, &cnt), "budget 0 keeps nothing");
  sm_gmask_cache_free(z);
}

int main(int argc, char **argv) {
  test_lru();
  if (argc < 2) TEST_END();
  char path[1024], cfg[1024];
  snprintf(path, sizeof path, "%s/models/smelt-tiny/tokenizer.json", argv[1]);
  snprintf(cfg, sizeof cfg, "%s/models/smelt-tiny/tokenizer_config.json", argv[1]);
  if (sm_tok_load_files(path, cfg, &g_tok)) {
    CHECK(false, "tokenizer: %s", sm_errmsg());
    TEST_END();
  }
  g_V = smelt_tokenizer_vocab_size(g_tok);
  int32_t eos[1] = {1};
  g_voc = sm_grammar_vocab_new(g_tok, g_V, eos, 1);
  sm_buf pb = SM_BUF_INIT;
  for (int32_t t = 0; t < g_V && g_n_byte < 256; t++)
    if (sm_tok_piece_bytes(g_tok, t, &pb) && pb.n == 1 && (unsigned char)pb.p[0] >= 0x80 &&
        !sm_tok_is_special(g_tok, t))
      g_byte_tok[g_n_byte++] = t;
  sm_buf_free(&pb);
  CHECK(g_n_byte > 0, "the tokenizer has single-byte UTF-8 pieces");
  const size_t big = 64u << 20, tiny = 6u * ((size_t)(g_V + 31) / 32 * 4 + 256);
  sm_grammar *js = compile_schema(
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"n\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\"]}");
  sm_grammar *jo = compile_schema("{\"type\":\"object\"}"); /* response_format json_object */
  /* non-ASCII classes: 2-, 3- and 4-byte characters, and a bounded repetition */
  sm_grammar *u8 = compile(
    "root ::= (word \" \")+ \".\"\n"
    "word ::= [a-z\\u00E0-\\u00FF]{1,4} | [\\u4E00-\\u4E20]+ | \"\\u00E9t\\u00E9\" | [\\U0001F600-\\U0001F64F]");
  check_walks("json schema", js, big, 12, 8, 40, 1);
  check_walks("json_object", jo, big, 12, 8, 40, 1);
  check_walks("gbnf utf-8", u8, big, 12, 8, 40, 1);
  check_walks("json schema, tiny budget", js, tiny, 6, 8, 40, 1);
  check_walks("gbnf utf-8, tiny budget", u8, tiny, 6, 8, 40, 1);
  check_walks("json schema, 2 threads", js, big, 6, 8, 40, 2);
  test_many(js);
  test_many(u8);
  /* the cache is keyed by grammar: two grammars in one cache never see each other's masks */
  sm_gmask_cache *c = sm_gmask_cache_new(big);
  sm_grammar *ga = compile("root ::= \"a\" [a-z]*"), *gb = compile("root ::= \"a\" [0-9]*");
  if (ga && gb) {
    const size_t W = (size_t)(g_V + 31) / 32;
    uint32_t *ma = malloc(4 * W), *mb = malloc(4 * W);
    sm_grammar_state *sa = sm_grammar_state_new(ga, g_voc), *sb = sm_grammar_state_new(gb, g_voc);
    sm_grammar_state_set_cache(sa, c);
    sm_grammar_state_set_cache(sb, c);
    sm_grammar_accept_bytes(sa, "a", 1);
    sm_grammar_accept_bytes(sb, "a", 1);
    sm_grammar_mask(sa, ma);
    sm_grammar_mask(sb, mb);
    CHECK(memcmp(ma, mb, 4 * W) != 0, "grammars with the same rule positions keep their own masks");
    sm_grammar_state_free(sa);
    sm_grammar_state_free(sb);
    free(ma);
    free(mb);
  }
  sm_grammar_free(ga);
  sm_grammar_free(gb);
  sm_gmask_cache_free(c);
  sm_grammar_free(js);
  sm_grammar_free(jo);
  sm_grammar_free(u8);
  sm_grammar_vocab_free(g_voc);
  smelt_tokenizer_free(g_tok);
  TEST_END();
}
