/* The disk tier of the server's prefix cache (see pcache_disk.h): the file index (an open-addressing
 * map from chain hash to an LRU list of files), block files written on eviction and at shutdown,
 * and read back, checked, on a prefix miss.
 * The engine thread owns the index and copies an evicted block to host memory; a writer thread of
 * the tier computes the checksum and writes the file, so that the engine's steps do not wait for
 * the disk. A block still queued is read back from its host copy. Dropping an entry whose write
 * is under way cancels it (the writer skips it, or deletes the file it just wrote). */
#include "server/pcache_disk.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "base/strbuf.h"
#include "engine/prompt_cache.h" /* sm_model_fingerprint */

#define HDR_BYTES 128
static const char k_magic[8] = {'S', 'M', 'E', 'L', 'T', 'K', 'V', 'B'};

/* a block file to write (writer thread); the fields under the mutex are marked */
typedef struct job {
  struct job *next; /* the queue, then the done list (mutex) */
  uint64_t hash;
  uint8_t *buf;    /* the file; the writer fills in its checksum */
  int ent;         /* the index entry, -1 once dropped (mutex) */
  bool cancelled;  /* dropped before the file was written (mutex) */
  bool done, fail; /* the writer is through with it; the file could not be written (mutex) */
} job;

typedef struct {
  uint64_t hash;
  int prev, next; /* LRU list (head: the least recently used); next: free list when unused */
  job *pending;   /* its write, until the engine thread has seen it done (NULL: on disk) */
} ent;

struct sm_pdisk {
  char *dir; /* DIR/<model>-<type>-b<bs> */
  uint64_t limit;
  uint8_t fp[32];
  uint32_t dt, layers, heads, hdim, bs;
  size_t data_bytes, file_bytes;
  uint8_t *buf; /* one file */
  ent *e;
  int n_e, cap_e, free_e; /* entries made; free list head (-1: none) */
  int *map;               /* entry index, -1 empty, -2 tombstone */
  int map_cap, map_fill;
  int head, tail;
  bool warned_write, warned_big;
  /* the writer */
  pthread_t writer;
  bool writer_started, stop; /* stop: mutex */
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* work for the writer, room in the queue, a job done */
  job *q_head, *q_tail, *fin; /* queued; done, not yet seen by the engine thread */
  size_t q_bytes, q_cap;      /* bytes queued or being written; the most before spill waits */
  int write_err;              /* errno of the first failed write (mutex) */
  char write_path[512];
  _Atomic uint64_t hits, hit_tokens, writes, evictions, rejected, bytes_written, bytes_read, files, bytes;
};

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }
/* the codes of prompt cache files (engine/prompt_cache.c) */
static uint32_t kv_code(sm_dtype t) {
  return t == SM_DT_F32 ? 1 : t == SM_DT_F16 ? 2 : t == SM_DT_BF16 ? 3 : t == SM_DT_Q8_0 ? 4 : t == SM_DT_Q4_0 ? 5 : 0;
}
static const char *kv_name(uint32_t c) {
  static const char *const n[] = {"unknown", "f32", "f16", "bf16", "q8_0", "q4_0"};
  return c < sizeof n / sizeof n[0] ? n[c] : "unknown";
}
static uint32_t crc(const uint8_t *p, size_t n) { return (uint32_t)crc32_z(crc32_z(0, NULL, 0), p, n); }

/* ---- the index ---- */

static uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}

static int find(const sm_pdisk *d, uint64_t h) {
  const int mask = d->map_cap - 1;
  for (int i = (int)(mix(h) & (uint64_t)mask), k = 0; k < d->map_cap; i = (i + 1) & mask, k++) {
    const int x = d->map[i];
    if (x == -1) return -1;
    if (x >= 0 && d->e[x].hash == h) return x;
  }
  return -1;
}

static void map_put(sm_pdisk *d, int x) {
  const int mask = d->map_cap - 1;
  for (int i = (int)(mix(d->e[x].hash) & (uint64_t)mask);; i = (i + 1) & mask)
    if (d->map[i] < 0) {
      d->map_fill += d->map[i] == -1;
      d->map[i] = x;
      return;
    }
}

/* grows (or clears tombstones) so that there is room for one more */
static void map_room(sm_pdisk *d) {
  if (2 * (d->map_fill + 1) <= d->map_cap) return;
  int live = 0;
  for (int i = 0; i < d->map_cap; i++) live += d->map[i] >= 0;
  int cap = d->map_cap;
  while (4 * (live + 1) > cap) cap *= 2;
  free(d->map);
  d->map_cap = cap;
  d->map = sm_xmalloc(sizeof(int) * (size_t)cap);
  for (int i = 0; i < cap; i++) d->map[i] = -1;
  d->map_fill = 0;
  for (int x = d->head; x >= 0; x = d->e[x].next) map_put(d, x);
}

static void lru_unlink(sm_pdisk *d, int x) {
  if (d->e[x].prev >= 0) d->e[d->e[x].prev].next = d->e[x].next;
  else d->head = d->e[x].next;
  if (d->e[x].next >= 0) d->e[d->e[x].next].prev = d->e[x].prev;
  else d->tail = d->e[x].prev;
}
static void lru_append(sm_pdisk *d, int x) {
  d->e[x].prev = d->tail;
  d->e[x].next = -1;
  if (d->tail >= 0) d->e[d->tail].next = x;
  else d->head = x;
  d->tail = x;
}

static void add(sm_pdisk *d, uint64_t h) {
  map_room(d);
  int x;
  if (d->free_e >= 0) {
    x = d->free_e;
    d->free_e = d->e[x].next;
  } else {
    if (d->n_e == d->cap_e) d->e = sm_xrealloc(d->e, sizeof(ent) * (size_t)(d->cap_e = d->cap_e ? 2 * d->cap_e : 64));
    x = d->n_e++;
  }
  d->e[x].hash = h;
  d->e[x].pending = NULL;
  lru_append(d, x);
  map_put(d, x);
  atomic_fetch_add(&d->files, 1);
  atomic_fetch_add(&d->bytes, d->file_bytes);
}

static void name_of(const sm_pdisk *d, uint64_t h, sm_buf *out) {
  sm_buf_clear(out);
  sm_buf_printf(out, "%s/%016llx.kvb", d->dir, (unsigned long long)h);
}

/* forget entry x and delete its file (or cancel its write) */
static void drop(sm_pdisk *d, int x) {
  bool written = true;
  job *j = d->e[x].pending;
  if (j) {
    pthread_mutex_lock(&d->mu);
    j->ent = -1;
    written = j->done;
    if (!j->done) j->cancelled = true;
    pthread_mutex_unlock(&d->mu);
  }
  if (written) {
    sm_buf p = SM_BUF_INIT;
    name_of(d, d->e[x].hash, &p);
    unlink(sm_buf_str(&p));
    sm_buf_free(&p);
  }
  const int mask = d->map_cap - 1;
  for (int i = (int)(mix(d->e[x].hash) & (uint64_t)mask), k = 0; k < d->map_cap; i = (i + 1) & mask, k++) {
    if (d->map[i] == -1) break;
    if (d->map[i] == x) {
      d->map[i] = -2;
      break;
    }
  }
  lru_unlink(d, x);
  d->e[x].next = d->free_e;
  d->free_e = x;
  atomic_fetch_sub(&d->files, 1);
  atomic_fetch_sub(&d->bytes, d->file_bytes);
}

/* ---- opening ---- */

static bool mkdir_one(const char *p) {
  if (mkdir(p, 0755) == 0 || errno == EEXIST) {
    struct stat sb;
    if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) return true;
    fprintf(stderr, "smelt serve: --kv-cache-dir: %s is not a directory\n", p);
    return false;
  }
  fprintf(stderr, "smelt serve: --kv-cache-dir: cannot create %s: %s\n", p, strerror(errno));
  return false;
}

typedef struct {
  uint64_t hash;
  struct timespec t;
} found;

static int cmp_found(const void *a, const void *b) {
  const found *x = a, *y = b;
  if (x->t.tv_sec != y->t.tv_sec) return x->t.tv_sec < y->t.tv_sec ? -1 : 1;
  if (x->t.tv_nsec != y->t.tv_nsec) return x->t.tv_nsec < y->t.tv_nsec ? -1 : 1;
  return x->hash < y->hash ? -1 : x->hash > y->hash;
}

/* the block files an earlier run left (a crash's temporary files and files of the wrong size are
 * deleted), the oldest first */
static void scan(sm_pdisk *d) {
  DIR *dh = opendir(d->dir);
  if (!dh) return;
  found *f = NULL;
  int n = 0, cap = 0, bad = 0;
  sm_buf p = SM_BUF_INIT;
  struct dirent *de;
  while ((de = readdir(dh))) {
    const char *nm = de->d_name;
    const size_t l = strlen(nm);
    sm_buf_clear(&p);
    sm_buf_printf(&p, "%s/%s", d->dir, nm);
    if (l > 4 && !strcmp(nm + l - 4, ".tmp")) {
      unlink(sm_buf_str(&p));
      continue;
    }
    unsigned long long h = 0;
    char tail[8];
    if (l != 20 || sscanf(nm, "%16llx%7s", &h, tail) != 2 || strcmp(tail, ".kvb") || !h) continue;
    struct stat sb;
    if (lstat(sm_buf_str(&p), &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if ((uint64_t)sb.st_size != d->file_bytes) {
      fprintf(stderr, "smelt serve: KV disk cache: %s: %llu bytes, %zu expected (truncated or damaged): deleted\n",
              sm_buf_str(&p), (unsigned long long)sb.st_size, d->file_bytes);
      unlink(sm_buf_str(&p));
      bad++;
      continue;
    }
    if (n == cap) f = sm_xrealloc(f, sizeof *f * (size_t)(cap = cap ? 2 * cap : 64));
    f[n++] = (found){.hash = h, .t = sb.st_mtim};
  }
  closedir(dh);
  sm_buf_free(&p);
  if (n) qsort(f, (size_t)n, sizeof *f, cmp_found);
  for (int i = 0; i < n; i++)
    if (find(d, f[i].hash) < 0) add(d, f[i].hash);
  free(f);
  atomic_fetch_add(&d->rejected, (uint64_t)bad);
}

static void spill(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent, const int32_t *tok);
static void *writer_main(void *arg);
static void reap(sm_pdisk *d);
static bool fetch(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent, const int32_t *tok);

sm_pdisk *sm_pdisk_open(sm_engine *e, const char *dir, uint64_t limit) {
  smelt_model *m = sm_engine_model(e);
  sm_engine_stats es;
  sm_engine_get_stats(e, &es);
  sm_pdisk *d = sm_xcalloc(1, sizeof *d);
  d->limit = limit;
  d->dt = kv_code(sm_engine_kv_dtype(e));
  d->layers = (uint32_t)m->cfg.num_hidden_layers;
  d->heads = (uint32_t)m->cfg.num_key_value_heads;
  d->hdim = (uint32_t)m->cfg.head_dim;
  d->bs = (uint32_t)es.block_size;
  d->data_bytes = sm_engine_block_bytes(e);
  d->file_bytes = HDR_BYTES + 4ull * d->bs + d->data_bytes + 4;
  d->head = d->tail = d->free_e = -1;
  d->map_cap = 64;
  d->map = sm_xmalloc(sizeof(int) * (size_t)d->map_cap);
  for (int i = 0; i < d->map_cap; i++) d->map[i] = -1;
  if (sm_model_fingerprint(m, d->fp) != SMELT_OK) {
    fprintf(stderr, "smelt serve: --kv-cache-dir: %s\n", smelt_last_error());
    goto fail;
  }
  if (!mkdir_one(dir)) goto fail;
  char sub[64];
  snprintf(sub, sizeof sub, "%02x%02x%02x%02x%02x%02x%02x%02x-%s-b%u", d->fp[0], d->fp[1], d->fp[2], d->fp[3], d->fp[4],
           d->fp[5], d->fp[6], d->fp[7], kv_name(d->dt), d->bs);
  d->dir = sm_path_join(dir, sub);
  if (!mkdir_one(d->dir)) goto fail;
  d->buf = sm_xmalloc(d->file_bytes);
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  d->q_cap = SM_MAX((size_t)64 << 20, 4 * d->file_bytes);
  scan(d);
  while (atomic_load(&d->bytes) > d->limit && d->head >= 0) { /* a smaller limit than last time */
    drop(d, d->head);
    atomic_fetch_add(&d->evictions, 1);
  }
  if (pthread_create(&d->writer, NULL, writer_main, d) != 0) {
    fprintf(stderr, "smelt serve: --kv-cache-dir: cannot start the writer thread\n");
    goto fail;
  }
  d->writer_started = true;
  sm_prefix_tier t = {.ud = d, .spill = spill, .fetch = fetch};
  if (!sm_engine_set_prefix_tier(e, &t)) {
    fprintf(stderr, "smelt serve: --kv-cache-dir: not for this model (no prefix cache, recurrent layers, or split "
                    "over several ranks)\n");
    sm_pdisk_close(d, NULL);
    return NULL;
  }
  fprintf(stderr,
          "smelt serve: KV disk cache %s: %llu blocks (%llu bytes) from earlier runs, limit %llu bytes, %zu a block\n",
          d->dir, (unsigned long long)atomic_load(&d->files), (unsigned long long)atomic_load(&d->bytes),
          (unsigned long long)limit, d->file_bytes);
  return d;
fail:
  sm_pdisk_close(d, NULL);
  return NULL;
}

void sm_pdisk_close(sm_pdisk *d, sm_engine *e) {
  if (!d) return;
  if (e) sm_engine_set_prefix_tier(e, NULL);
  if (d->writer_started) { /* the queued files are written first */
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->writer, NULL);
    reap(d);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
  }
  free(d->dir);
  free(d->map);
  free(d->e);
  free(d->buf);
  free(d);
}

/* ---- writing ---- */

/* writer thread: one file */
static bool write_file(const sm_pdisk *d, job *j, int *err) {
  sm_buf path = SM_BUF_INIT, tmp = SM_BUF_INIT;
  name_of(d, j->hash, &path);
  sm_buf_printf(&tmp, "%s.tmp", sm_buf_str(&path));
  put_u32(j->buf + d->file_bytes - 4, crc(j->buf, d->file_bytes - 4));
  int fd = open(sm_buf_str(&tmp), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  *err = errno;
  for (size_t off = 0; ok && off < d->file_bytes;) {
    ssize_t w = write(fd, j->buf + off, d->file_bytes - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ok = false;
      *err = w < 0 ? errno : ENOSPC;
    } else off += (size_t)w;
  }
  if (fd >= 0 && close(fd) != 0 && ok) {
    ok = false;
    *err = errno;
  }
  if (ok && rename(sm_buf_str(&tmp), sm_buf_str(&path)) != 0) {
    ok = false;
    *err = errno;
  }
  if (!ok) unlink(sm_buf_str(&tmp));
  sm_buf_free(&path);
  sm_buf_free(&tmp);
  return ok;
}

static void *writer_main(void *arg) {
  sm_pdisk *d = arg;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->q_head && !d->stop) pthread_cond_wait(&d->cv, &d->mu);
    if (!d->q_head) break;
    job *j = d->q_head;
    if (!(d->q_head = j->next)) d->q_tail = NULL;
    bool ok = true;
    int err = 0;
    if (!j->cancelled) {
      pthread_mutex_unlock(&d->mu);
      ok = write_file(d, j, &err);
      pthread_mutex_lock(&d->mu);
      if (ok && j->cancelled) { /* dropped while it was being written */
        sm_buf p = SM_BUF_INIT;
        name_of(d, j->hash, &p);
        unlink(sm_buf_str(&p));
        sm_buf_free(&p);
      }
    }
    if (!ok && !d->write_err) {
      d->write_err = err ? err : EIO;
      sm_buf p = SM_BUF_INIT;
      name_of(d, j->hash, &p);
      snprintf(d->write_path, sizeof d->write_path, "%s", sm_buf_str(&p));
      sm_buf_free(&p);
    }
    j->done = true;
    j->fail = !ok;
    j->next = d->fin;
    d->fin = j;
    d->q_bytes -= d->file_bytes;
    pthread_cond_broadcast(&d->cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

/* engine thread: the writes done since the last call are seen (their entries are on disk, or
 * dropped when the write failed) */
static void reap(sm_pdisk *d) {
  pthread_mutex_lock(&d->mu);
  job *j = d->fin;
  d->fin = NULL;
  const int err = d->write_err;
  pthread_mutex_unlock(&d->mu);
  while (j) {
    job *next = j->next;
    if (j->ent >= 0) {
      d->e[j->ent].pending = NULL;
      if (j->fail) drop(d, j->ent);
    }
    free(j->buf);
    free(j);
    j = next;
  }
  if (err && !d->warned_write) {
    fprintf(stderr, "smelt serve: KV disk cache: cannot write %s: %s (blocks that cannot be written are dropped)\n",
            d->write_path, strerror(err));
    d->warned_write = true;
  }
}

static void spill(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent, const int32_t *tok) {
  sm_pdisk *d = ud;
  reap(d);
  const int x = find(d, hash);
  if (x >= 0) { /* on disk already: it is recent again */
    lru_unlink(d, x);
    lru_append(d, x);
    return;
  }
  if (d->file_bytes > d->limit) {
    if (!d->warned_big)
      fprintf(stderr,
              "smelt serve: KV disk cache: a block takes %zu bytes, more than the limit %llu: nothing is "
              "written\n",
              d->file_bytes, (unsigned long long)d->limit);
    d->warned_big = true;
    return;
  }
  while (atomic_load(&d->bytes) + d->file_bytes > d->limit && d->head >= 0) {
    drop(d, d->head);
    atomic_fetch_add(&d->evictions, 1);
  }
  job *j = sm_xcalloc(1, sizeof *j);
  j->hash = hash;
  uint8_t *b = j->buf = sm_xmalloc(d->file_bytes);
  memset(b, 0, HDR_BYTES);
  memcpy(b, k_magic, 8);
  put_u32(b + 8, SM_PDISK_VERSION);
  put_u32(b + 12, HDR_BYTES);
  memcpy(b + 16, d->fp, 32);
  put_u32(b + 48, d->dt);
  put_u32(b + 52, d->layers);
  put_u32(b + 56, d->heads);
  put_u32(b + 60, d->hdim);
  put_u32(b + 64, d->bs);
  put_u64(b + 72, hash);
  put_u64(b + 80, parent);
  for (uint32_t i = 0; i < d->bs; i++) put_u32(b + HDR_BYTES + 4 * i, (uint32_t)tok[i]);
  sm_engine_block_read(e, blk, b + HDR_BYTES + 4 * d->bs);
  add(d, hash);
  const int nx = find(d, hash);
  d->e[nx].pending = j;
  j->ent = nx;
  atomic_fetch_add(&d->writes, 1);
  atomic_fetch_add(&d->bytes_written, d->file_bytes);
  pthread_mutex_lock(&d->mu);
  while (d->q_bytes && d->q_bytes + d->file_bytes > d->q_cap) pthread_cond_wait(&d->cv, &d->mu);
  if (d->q_tail) d->q_tail->next = j;
  else d->q_head = j;
  d->q_tail = j;
  d->q_bytes += d->file_bytes;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

void sm_pdisk_flush(sm_pdisk *d) {
  if (!d) return;
  pthread_mutex_lock(&d->mu);
  while (d->q_bytes) pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
  reap(d);
}

/* shutdown: the blocks not on disk yet are counted, then written but for the oldest ones that the
 * limit would delete again at once */
typedef struct {
  sm_pdisk *d;
  uint64_t n, skip;
  bool write;
} persist_ctx;

static void persist_one(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent, const int32_t *tok) {
  persist_ctx *c = ud;
  if (find(c->d, hash) >= 0) return;
  if (!c->write) c->n++;
  else if (c->skip) c->skip--;
  else spill(c->d, e, blk, hash, parent, tok);
}

void sm_pdisk_persist(sm_pdisk *d, sm_engine *e) {
  if (!d) return;
  const uint64_t w0 = atomic_load(&d->writes), fit = d->limit / d->file_bytes;
  persist_ctx c = {.d = d};
  sm_engine_each_prefix_block(e, persist_one, &c);
  c.write = true;
  c.skip = c.n > fit ? c.n - fit : 0;
  sm_engine_each_prefix_block(e, persist_one, &c);
  sm_pdisk_flush(d);
  fprintf(stderr, "smelt serve: KV disk cache %s: %llu blocks written at shutdown, %llu blocks (%llu bytes) kept\n",
          d->dir, (unsigned long long)(atomic_load(&d->writes) - w0), (unsigned long long)atomic_load(&d->files),
          (unsigned long long)atomic_load(&d->bytes));
}

/* ---- reading ---- */

/* file x is refused: said once, deleted */
static bool reject(sm_pdisk *d, int x, const char *path, const char *why) {
  fprintf(stderr, "smelt serve: KV disk cache: %s: %s: deleted, never used\n", path, why);
  drop(d, x);
  atomic_fetch_add(&d->rejected, 1);
  return false;
}

/* the block of a well-formed file image b (or a queued one) is the one asked for: parent and tokens
 * (a 64-bit hash of another chain is a miss) */
static bool same_block(const sm_pdisk *d, const uint8_t *b, uint64_t parent, const int32_t *tok) {
  if (get_u64(b + 80) != parent) return false;
  for (uint32_t i = 0; i < d->bs; i++)
    if ((int32_t)get_u32(b + HDR_BYTES + 4 * i) != tok[i]) return false;
  return true;
}

static void hit(sm_pdisk *d, sm_engine *e, int blk, int x, const uint8_t *b) {
  sm_engine_block_write(e, blk, b + HDR_BYTES + 4 * d->bs);
  lru_unlink(d, x);
  lru_append(d, x);
  atomic_fetch_add(&d->hits, 1);
  atomic_fetch_add(&d->hit_tokens, d->bs);
  atomic_fetch_add(&d->bytes_read, d->file_bytes);
}

static bool fetch(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent, const int32_t *tok) {
  sm_pdisk *d = ud;
  reap(d);
  const int x = find(d, hash);
  if (x < 0) return false;
  if (d->e[x].pending) { /* still queued or being written: its host copy (the writer only adds the checksum) */
    const uint8_t *b = d->e[x].pending->buf;
    if (!same_block(d, b, parent, tok)) return false;
    hit(d, e, blk, x, b);
    return true;
  }
  sm_buf path = SM_BUF_INIT;
  name_of(d, hash, &path);
  const char *p = sm_buf_str(&path);
  bool ok = false;
  char why[200];
  why[0] = 0;
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  struct stat sb = {0};
  size_t got = 0;
  if (fd < 0) { /* gone (deleted by hand): a miss */
    drop(d, x);
    goto out;
  }
  if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != d->file_bytes) {
    snprintf(why, sizeof why, "%llu bytes, %zu expected (truncated or damaged)", (unsigned long long)sb.st_size,
             d->file_bytes);
    goto out;
  }
  while (got < d->file_bytes) {
    ssize_t r = read(fd, d->buf + got, d->file_bytes - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  const uint8_t *b = d->buf;
  if (got != d->file_bytes) snprintf(why, sizeof why, "short read");
  else if (memcmp(b, k_magic, 8)) snprintf(why, sizeof why, "not a smelt KV block file");
  else if (get_u32(b + 8) != SM_PDISK_VERSION)
    snprintf(why, sizeof why, "format version %u, this smelt reads version %d", get_u32(b + 8), SM_PDISK_VERSION);
  else if (get_u32(b + 12) != HDR_BYTES) snprintf(why, sizeof why, "bad header size");
  else if (get_u32(b + d->file_bytes - 4) != crc(b, d->file_bytes - 4))
    snprintf(why, sizeof why, "checksum mismatch (the file is corrupt)");
  else if (memcmp(b + 16, d->fp, 32)) snprintf(why, sizeof why, "made with another model (config or weights differ)");
  else if (get_u32(b + 48) != d->dt || get_u32(b + 52) != d->layers || get_u32(b + 56) != d->heads ||
           get_u32(b + 60) != d->hdim || get_u32(b + 64) != d->bs)
    snprintf(why, sizeof why,
             "KV format %u layers x %u KV heads x %u %s, blocks of %u, differs from %u x %u x %u %s, %u",
             get_u32(b + 52), get_u32(b + 56), get_u32(b + 60), kv_name(get_u32(b + 48)), get_u32(b + 64), d->layers,
             d->heads, d->hdim, kv_name(d->dt), d->bs);
  else if (get_u64(b + 72) != hash) snprintf(why, sizeof why, "holds another block than its name says");
  if (why[0]) goto out;
  /* a well-formed file of another chain with the same 64-bit hash: a miss, the file stays */
  if (!same_block(d, b, parent, tok)) goto out;
  hit(d, e, blk, x, b);
  futimens(fd, NULL); /* recent again, for the order after a restart */
  ok = true;
out:
  if (fd >= 0) close(fd);
  if (why[0]) reject(d, x, p, why);
  sm_buf_free(&path);
  return ok;
}

void sm_pdisk_get_stats(const sm_pdisk *d, sm_pdisk_stats *st) {
  memset(st, 0, sizeof *st);
  if (!d) return;
  st->hits = atomic_load(&d->hits);
  st->hit_tokens = atomic_load(&d->hit_tokens);
  st->writes = atomic_load(&d->writes);
  st->evictions = atomic_load(&d->evictions);
  st->rejected = atomic_load(&d->rejected);
  st->bytes_written = atomic_load(&d->bytes_written);
  st->bytes_read = atomic_load(&d->bytes_read);
  st->files = atomic_load(&d->files);
  st->bytes = atomic_load(&d->bytes);
  st->limit = d->limit;
}
