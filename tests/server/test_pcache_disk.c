/* The prefix cache's disk tier (server/pcache_disk.h) on an engine of the built-in model: blocks
 * evicted from a memory cache too small to keep a prompt are read back from disk for the same
 * prompt, with the logits of a memory-cache hit; damaged files are refused and deleted; the files
 * stay within the size limit; blocks written at shutdown serve a new engine. The KV goes through
 * the backend's upload / download, so SMELT_KVDISK_DEVICE=cuda runs the same on the CUDA backend
 * (exit 77 without one); on the CPU also with a q8_0 cache. Arguments: the source directory; a scratch
 * directory. */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/engine.h"
#include "server/pcache_disk.h"
#include "../test_util.h"

enum { CTX = 256, BS = 16, N1 = 200, N2 = 240 };
static bool g_cuda;

static smelt_model *load(const char *src, smelt_kv_type kv) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/models/smelt-tiny", src);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = g_cuda ? SMELT_DEVICE_CUDA : SMELT_DEVICE_CPU;
  mp.max_context = CTX;
  mp.kv_type = kv;
  smelt_model *m = NULL;
  if (smelt_model_load(dir, &mp, &m)) {
    fprintf(stderr, "load %s: %s\n", dir, smelt_last_error());
    return NULL;
  }
  return m;
}

static sm_engine *engine(smelt_model *m, int n_blocks) {
  sm_engine_params p;
  sm_engine_params_default(&p);
  p.block_size = BS;
  p.max_context = CTX;
  p.n_blocks = n_blocks;
  sm_engine *e = NULL;
  if (sm_engine_create(m, &p, &e)) {
    fprintf(stderr, "engine: %s\n", smelt_last_error());
    exit(1);
  }
  return e;
}

/* run ids through a new sequence (the prefix cache first): the logits after the last token; the
 * tokens reused from the prefix cache */
static int run(sm_engine *e, const int32_t *ids, int n, float *lg) {
  sm_seq *q = sm_seq_new(e);
  if (sm_seq_append(e, q, ids, n)) exit(1);
  const int reused = sm_seq_use_prefix_cache(e, q);
  uint8_t done = 0;
  while (!done)
    if (sm_engine_step(e, &q, 1, lg, &done)) {
      fprintf(stderr, "step: %s\n", smelt_last_error());
      exit(1);
    }
  sm_seq_free(e, q);
  return reused;
}

/* the block files of one model directory under dir */
static int list(const char *dir, char names[][1024], int max) {
  int n = 0;
  DIR *d = opendir(dir);
  struct dirent *de;
  char sub[1024] = "";
  while (d && (de = readdir(d)))
    if (de->d_name[0] != '.') snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
  if (d) closedir(d);
  if (!sub[0] || !(d = opendir(sub))) return 0;
  while ((de = readdir(d)))
    if (strstr(de->d_name, ".kvb") && n < max) snprintf(names[n++], 1024, "%s/%s", sub, de->d_name);
  closedir(d);
  return n;
}

static uint64_t dir_bytes(const char *dir) {
  static char names[256][1024];
  const int n = list(dir, names, 256);
  uint64_t b = 0;
  struct stat sb;
  for (int i = 0; i < n; i++)
    if (stat(names[i], &sb) == 0) b += (uint64_t)sb.st_size;
  return b;
}

static void rmtree(const char *dir) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) exit(1);
}

/* the logits of two runs of the same prompt with the same KV: equal bits on the CPU; the CUDA
 * kernels are not promised to be bitwise repeatable */
static bool same(const float *a, const float *b, int V) {
  return g_cuda ? t_max_rel(a, b, (size_t)V, 1.0) < 1e-5 : !memcmp(a, b, sizeof(float) * (size_t)V);
}

/* the checks for one KV type; false: the model could not be loaded */
static bool check(const char *src, const char *tmp_root, smelt_kv_type kv) {
  smelt_model *m = load(src, kv);
  if (!m) return false;
  char tmp[900];
  snprintf(tmp, sizeof tmp, "%s-%s", tmp_root, smelt_kv_type_name(kv));
  const int V = m->cfg.vocab_size;
  int32_t p1[N1], p2[N2];
  uint32_t r = 12345;
  for (int i = 0; i < N1; i++) p1[i] = (int32_t)((r = r * 1664525u + 1013904223u) >> 8) % V;
  for (int i = 0; i < N2; i++) p2[i] = (int32_t)((r = r * 1664525u + 1013904223u) >> 8) % V;
  const int reuse = (N1 - 1) / BS * BS; /* the last token is always computed */
  float *cold = sm_xmalloc(sizeof(float) * V), *mem = sm_xmalloc(sizeof(float) * V),
        *lg = sm_xmalloc(sizeof(float) * V);
  mkdir(tmp, 0755);
  char dir[1024];

  /* the reference: cold, then a memory-cache hit */
  sm_engine *big = engine(m, 64);
  CHECK(run(big, p1, N1, cold) == 0, "cold");
  CHECK(run(big, p1, N1, mem) == reuse, "memory hit");
  /* (a sanity check: computing 8 tokens after a cached prefix or all 200 rounds differently on a GPU) */
  CHECK(t_max_rel(mem, cold, (size_t)V, 1.0) < (g_cuda ? 1e-2 : 1e-3), "memory hit vs cold: %g",
        t_max_rel(mem, cold, (size_t)V, 1.0));
  sm_engine_free(big);

  /* 16 blocks: p2 evicts p1's blocks, which go to disk and come back */
  snprintf(dir, sizeof dir, "%s/evict", tmp);
  rmtree(dir);
  sm_engine *e = engine(m, CTX / BS);
  sm_pdisk *d = sm_pdisk_open(e, dir, 1ull << 30);
  CHECK(d != NULL, "open %s", dir);
  if (!d) return true;
  sm_pdisk_stats st;
  run(e, p1, N1, lg);
  CHECK(same(lg, cold, V), "a cold run with the tier attached");
  sm_pdisk_get_stats(d, &st);
  CHECK(st.writes == 0 && st.files == 0, "nothing evicted yet: %llu", (unsigned long long)st.writes);
  run(e, p2, N2, lg);
  sm_pdisk_flush(d);
  sm_pdisk_get_stats(d, &st);
  CHECK(st.writes >= 10, "p1's blocks written when p2 evicted them: %llu", (unsigned long long)st.writes);
  CHECK(dir_bytes(dir) == st.bytes && st.bytes == st.bytes_written, "bytes on disk %llu, counted %llu",
        (unsigned long long)dir_bytes(dir), (unsigned long long)st.bytes);
  const uint64_t file_bytes = st.bytes / st.files;
  CHECK(file_bytes == 128 + 4 * BS + sm_engine_block_bytes(e) + 4, "one file: %llu bytes",
        (unsigned long long)file_bytes);
  const uint64_t written = st.writes;
  CHECK(run(e, p1, N1, lg) == reuse, "p1 again: its prefix reused");
  sm_pdisk_get_stats(d, &st);
  CHECK(st.hits >= 10 && st.hit_tokens == BS * st.hits, "blocks read back: %llu", (unsigned long long)st.hits);
  CHECK(st.bytes_read == st.hits * file_bytes, "bytes read");
  sm_engine_stats es;
  sm_engine_get_stats(e, &es);
  CHECK(es.tier_hits_tokens == st.hit_tokens, "the engine counts the tier's tokens");
  CHECK(same(lg, mem, V), "the KV read back gives the logits of a memory hit (max rel %g)",
        t_max_rel(lg, mem, (size_t)V, 1.0));
  CHECK(st.writes >= written, "writes");
  sm_pdisk_persist(d, e);
  sm_pdisk_close(d, e);
  sm_engine_free(e);

  /* every file damaged (a flipped byte in the KV): the first one read is refused and deleted */
  static char names[256][1024];
  int nf = list(dir, names, 256);
  CHECK(nf >= 10, "%d files", nf);
  for (int i = 0; i < nf; i++) {
    FILE *f = fopen(names[i], "r+b");
    if (!f) continue;
    fseek(f, (long)(file_bytes / 2), SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)(file_bytes / 2), SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
  }
  e = engine(m, CTX / BS);
  d = sm_pdisk_open(e, dir, 1ull << 30);
  CHECK(run(e, p1, N1, lg) == 0, "nothing reused from a damaged file");
  CHECK(same(lg, cold, V), "the answer is the computed one");
  sm_pdisk_get_stats(d, &st);
  CHECK(st.rejected == 1 && st.hits == 0, "rejected %llu, hits %llu", (unsigned long long)st.rejected,
        (unsigned long long)st.hits);
  CHECK(list(dir, names, 256) == nf - 1 && st.files == (uint64_t)nf - 1, "the refused file is deleted");
  sm_pdisk_close(d, e);
  sm_engine_free(e);

  /* written at shutdown, read by the next engine */
  snprintf(dir, sizeof dir, "%s/persist", tmp);
  rmtree(dir);
  e = engine(m, 64);
  d = sm_pdisk_open(e, dir, 1ull << 30);
  run(e, p1, N1, lg);
  sm_pdisk_persist(d, e);
  sm_pdisk_get_stats(d, &st);
  CHECK(st.writes == N1 / BS, "every full block written at shutdown: %llu", (unsigned long long)st.writes);
  sm_pdisk_close(d, e);
  sm_engine_free(e);
  e = engine(m, 64);
  d = sm_pdisk_open(e, dir, 1ull << 30);
  sm_pdisk_get_stats(d, &st);
  CHECK(st.files == N1 / BS, "indexed at start: %llu", (unsigned long long)st.files);
  CHECK(run(e, p1, N1, lg) == reuse, "a new engine reuses them");
  sm_pdisk_get_stats(d, &st);
  CHECK(st.hits == (uint64_t)reuse / BS, "all from disk: %llu", (unsigned long long)st.hits);
  CHECK(same(lg, mem, V), "with the logits of a memory hit");
  sm_pdisk_close(d, e);
  sm_engine_free(e);

  /* the size limit: three files */
  snprintf(dir, sizeof dir, "%s/limit", tmp);
  rmtree(dir);
  e = engine(m, CTX / BS);
  const uint64_t limit = 3 * file_bytes + file_bytes / 2;
  d = sm_pdisk_open(e, dir, limit);
  for (int k = 0; k < 3; k++) {
    run(e, p1, N1, lg);
    sm_pdisk_flush(d);
    CHECK(dir_bytes(dir) <= limit, "%llu bytes", (unsigned long long)dir_bytes(dir));
    run(e, p2, N2, lg);
    sm_pdisk_flush(d);
    CHECK(dir_bytes(dir) <= limit, "%llu bytes", (unsigned long long)dir_bytes(dir));
  }
  sm_pdisk_get_stats(d, &st);
  CHECK(st.files == 3 && st.bytes == 3 * file_bytes && st.evictions > 0 && st.writes == st.evictions + 3,
        "files %llu, writes %llu, evictions %llu", (unsigned long long)st.files, (unsigned long long)st.writes,
        (unsigned long long)st.evictions);
  /* at shutdown no more than the limit holds is written (not all the memory cache's blocks) */
  sm_pdisk_stats st2;
  sm_pdisk_persist(d, e);
  sm_pdisk_get_stats(d, &st2);
  CHECK(st2.writes - st.writes >= 1 && st2.writes - st.writes <= 3 && st2.files == 3,
        "shutdown wrote %llu blocks, %llu files", (unsigned long long)(st2.writes - st.writes),
        (unsigned long long)st2.files);
  sm_pdisk_close(d, e);
  sm_engine_free(e);

  printf("kv disk cache (%s, %s): %llu-byte block files\n", g_cuda ? "cuda" : "cpu", smelt_kv_type_name(kv),
         (unsigned long long)file_bytes);
  free(cold);
  free(mem);
  free(lg);
  smelt_model_free(m);
  return true;
}

int main(int argc, char **argv) {
  const char *src = argc > 1 ? argv[1] : ".", *tmp = argc > 2 ? argv[2] : "/tmp/smelt-kvdisk";
  const char *dev = getenv("SMELT_KVDISK_DEVICE");
  g_cuda = dev && !strcmp(dev, "cuda");
  if (!check(src, tmp, SMELT_KV_F16)) {
    if (g_cuda) {
      printf("no usable CUDA backend: skipping\n");
      return 77;
    }
    CHECK(0, "load the built-in model");
  }
  /* a quantized KV type (CPU backend only): blocks of head rows with their scales */
  if (!g_cuda) CHECK(check(src, tmp, SMELT_KV_Q8_0), "load the built-in model with a q8_0 cache");
  TEST_END();
}
