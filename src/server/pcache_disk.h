/* The disk tier of the server's prefix cache (private to src/server; --kv-cache-dir DIR,
 * --kv-cache-disk-size SIZE): a block the in-memory prefix cache evicts (LRU) is written to a file
 * under DIR, and a prompt whose next full block is not in memory reads it back from there, block by
 * block along the chain of block hashes, into a fresh KV block (engine.h sm_prefix_tier). The
 * files have an LRU byte limit of their own (the oldest are deleted); at shutdown every block still
 * in the memory cache is written too, so that a server restarted with the same DIR reuses them.
 *
 * A model's files are in DIR/<model fingerprint>-<KV type>-b<block size>/, one per block, named by
 * its chain hash (<16 hex digits>.kvb). Layout, little-endian, version 1:
 *   0   "SMELTKVB"   8 u32 version   12 u32 header bytes (128)
 *   16  u8[32] model fingerprint (engine/prompt_cache.h sm_model_fingerprint)
 *   48  u32 KV type (1 f32, 2 f16, 3 bf16, 4 q8_0, 5 q4_0)   52 u32 layers   56 u32 KV heads
 *   60  u32 head size   64 u32 block size (tokens)   68 u32 0
 *   72  u64 chain hash of the block   80 u64 chain hash of its parent (0: the first block)
 *   88  zeros up to 128
 *   128 i32 tokens[block size] (prefix-cache keys)
 *   then per layer K [block size][KV heads] head rows of the KV type, V likewise
 *   last 4 bytes: CRC-32 (zlib) of everything before them.
 * A file that is truncated, corrupt, of another version, model, KV format or block size is logged
 * once, deleted and never used (the request computes those tokens).
 * An evicted block is copied to host memory on the engine thread and written by a writer thread of
 * the tier (at most 64 MiB queued; beyond that the engine thread waits); a block still queued is
 * read back from that copy. All calls come from the model's engine thread (or after it stopped);
 * the counters may be read from any thread. */
#ifndef SM_SERVER_PCACHE_DISK_H
#define SM_SERVER_PCACHE_DISK_H
#include "engine/engine.h"

#define SM_PDISK_VERSION 1

typedef struct sm_pdisk sm_pdisk;

/* Open (creating what is missing) e's directory under dir, index the files an earlier run left
 * there (the oldest first; files of the wrong size are deleted) and attach the tier to e.
 * limit: bytes the files may take in all (> 0). NULL after printing why. */
sm_pdisk *sm_pdisk_open(sm_engine *e, const char *dir, uint64_t limit);
/* Write every block of e's prefix cache that is not on disk yet, as many as the limit holds, the
 * most recently used (shutdown, engine thread stopped); returns when they are written. */
void sm_pdisk_persist(sm_pdisk *d, sm_engine *e);
/* Wait until the queued blocks are written. */
void sm_pdisk_flush(sm_pdisk *d);
/* Detach from e, write what is queued and free (the files stay). */
void sm_pdisk_close(sm_pdisk *d, sm_engine *e);

typedef struct {
  uint64_t hits, hit_tokens; /* blocks (and their tokens) read back for a prompt */
  uint64_t writes;           /* blocks spilled (written, or queued for the writer) */
  uint64_t evictions;        /* files deleted for the byte limit */
  uint64_t rejected;         /* files refused (corrupt, truncated, mismatched) and deleted */
  uint64_t bytes_written, bytes_read;
  uint64_t files, bytes; /* on disk now */
  uint64_t limit;
} sm_pdisk_stats;
void sm_pdisk_get_stats(const sm_pdisk *d, sm_pdisk_stats *st);

#endif
