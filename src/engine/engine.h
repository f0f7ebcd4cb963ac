/* Engine: paged KV cache with a block allocator and prefix caching, sequences, and a
 * batched step that runs the model on the pending tokens of many sequences at once
 * (continuous batching). Not thread-safe: one engine thread drives it. */
#ifndef SM_ENGINE_H
#define SM_ENGINE_H
#include "base/base.h"
#include "model/model.h"
#include "engine/sampler.h"

typedef struct sm_engine sm_engine;
typedef struct sm_seq sm_seq;

typedef struct {
  int block_size;       /* tokens per KV block (default 16) */
  int n_blocks;         /* total KV blocks; 0 = enough for max_seqs * max_context */
  int max_seqs;         /* sequences that may be active at once (default 1) */
  int max_context;      /* tokens per sequence (default: model max, capped at 8192) */
  int max_batch_tokens; /* tokens per forward step (prefill chunk), default 512 */
  bool prefix_cache;    /* reuse full blocks of identical prefixes (default true) */
  bool host_sample;     /* sample on the host even where the backend has a sample op (default false;
                         * the cli and server set it from SMELT_HOST_SAMPLE=1) */
  bool pipeline;        /* sm_engine_decode and the server may queue step k+1 before token k is read
                         * back (default true; SMELT_PIPELINE=0 at the edge turns it off) */
  bool pipeline_always; /* pipelined batch steps also on a backend that runs every op to its end (the
                         * CPU), where they gain nothing: for tests (SMELT_PIPELINE=always) */
} sm_engine_params;

void sm_engine_params_default(sm_engine_params *p);
/* The engine borrows the model (which must outlive it) and allocates the KV cache. */
smelt_status sm_engine_create(smelt_model *m, const sm_engine_params *p, sm_engine **out);
void sm_engine_free(sm_engine *e);
smelt_model *sm_engine_model(sm_engine *e);

/* A sequence owns its token list and its KV blocks. */
sm_seq *sm_seq_new(sm_engine *e);
/* Releases the sequence's blocks (full blocks stay in the prefix cache until evicted). */
void sm_seq_free(sm_engine *e, sm_seq *s);
/* Append tokens (prompt or sampled); they are computed by the next steps.
 * SMELT_ERR_LIMIT when the sequence would exceed max_context. */
smelt_status sm_seq_append(sm_engine *e, sm_seq *s, const int32_t *ids, int n);
/* Before the first step of a new sequence: reuse cached KV for the longest prefix of
 * full blocks already computed (never the whole prompt: the last token is always
 * recomputed so logits exist). Returns the number of tokens reused. */
int sm_seq_use_prefix_cache(sm_engine *e, sm_seq *s);
/* Images in a sequence's tokens (spans from sm_vision_tokenize, over tokens not computed yet and after
 * the spans attached before; before sm_seq_use_prefix_cache): their tokens take image embeddings,
 * computed by the step that first needs them; the sequence keeps references to the images.
 * SMELT_ERR_UNSUPPORTED when the model has no vision tower. */
struct sm_mm_span;
smelt_status sm_seq_set_media(sm_engine *e, sm_seq *s, const struct sm_mm_span *spans, int n_spans);
/* The computed tokens of s that equal ids (with the images of spans) from the start: what a session
 * keeps of s for a new prompt. */
int sm_seq_common_prefix(const sm_seq *s, const int32_t *ids, int n, const struct sm_mm_span *spans, int n_spans);
int sm_seq_len(const sm_seq *s);     /* tokens appended so far */
int sm_seq_pending(const sm_seq *s); /* appended but not yet computed */
const int32_t *sm_seq_tokens(const sm_seq *s);
/* Fork: new sequence sharing all full blocks of s (copy-on-write for the partial one). */
sm_seq *sm_seq_fork(sm_engine *e, sm_seq *s);

/* Run one forward step over the pending tokens of seqs[0..n) (at most max_batch_tokens
 * in total; a long prompt is split over several steps). For every sequence whose last
 * pending token was computed in this step, done[i] = 1 and logits[i*vocab..] holds the
 * logits after its last token; otherwise done[i] = 0. logits must hold n*vocab floats.
 * SMELT_ERR_OOM when no KV block is free (free or preempt a sequence and retry). */
smelt_status sm_engine_step(sm_engine *e, sm_seq **seqs, int n, float *logits, uint8_t *done);

/* Like sm_engine_step, with the sampling done where the logits are (the backend's sample op,
 * see backend.h): for every sequence whose logits were computed (done[i] = 1), tokens[i] =
 * the token its sampler smp[i] draws (history: the sequence's tokens), exactly the token
 * sm_sampler_sample would give, consuming the sampler's generator the same way; only for
 * smp[i] == NULL (logprobs, ...) the full row is downloaded into logits[i*vocab..] (logits
 * may be NULL when every smp[i] is set). The samplers must be distinct. Nothing is appended:
 * the caller appends the tokens it keeps. Backends without a sample op (or engines with
 * host_sample) download the logits and sample on the host, with the same result. */
smelt_status sm_engine_step_sample(sm_engine *e, sm_seq **seqs, int n, sm_sampler **smp, int32_t *tokens, float *logits,
                                   uint8_t *done);
/* Pipelined batch steps (the server's engine thread; sm_engine_batch_pipeline says whether the
 * engine takes them: a backend with sample_batch_async that queues its work, params.pipeline, no
 * host_sample, no recurrent layers, one rank). sm_engine_step_launch computes the pending tokens of
 * seqs like sm_engine_step_sample, every sequence with a sampler (none with penalties, a grammar mask
 * or logit biases), and queues their sampling without waiting; *ticket names the launch and
 * sm_engine_step_collect(ticket) waits and writes tokens[i] for each done[i] of it. Nothing is
 * appended. Before collecting a launch the caller may launch the next step, in which a sequence that
 * was done in the first continues with sm_seq_append_fed(row: its index in the first launch): a
 * placeholder token that the device replaces by the token sampled for it, so that the step needs no
 * round trip to the host. Once the token is collected, sm_seq_set_fed gives the sequence its value
 * (the prefix cache registers the block then). At most two launches are outstanding; a step of any
 * other kind in between ends the chain (a placeholder must refer to the launch right before its own).
 * A sequence with a placeholder can be truncated before it (a token that ended its request). */
bool sm_engine_batch_pipeline(const sm_engine *e);
smelt_status sm_engine_step_launch(sm_engine *e, sm_seq **seqs, int n, sm_sampler **smp, uint8_t *done, int *ticket);
smelt_status sm_engine_step_collect(sm_engine *e, int ticket, int32_t *tokens);
/* s has no pending tokens and no images; row: s's index in the launch before the next */
smelt_status sm_seq_append_fed(sm_engine *e, sm_seq *s, int row);
bool sm_seq_fed(const sm_seq *s); /* a placeholder waits for its value */
void sm_seq_set_fed(sm_engine *e, sm_seq *s, int32_t tok);
/* fn(arg) runs in every sm_engine_step_sample that samples, after the step's forward pass is
 * issued (and started on a device backend: backend.h submit) and before the samplers are read:
 * host work that the samplers need, such as grammar masks, overlaps the device's. NULL: none. */
void sm_engine_set_before_sample(sm_engine *e, void (*fn)(void *arg), void *arg);

/* Decode after s: s has no pending tokens and `first` is the token sampled after it (not yet
 * appended). Appends first, then produces up to max_new tokens with smp, calling emit for each
 * in order until it returns false; every produced token except the last is appended (the state
 * the stepwise loop "step, emit, append" leaves). *n_new (may be NULL): tokens produced. With a
 * backend that has sample_async, a sampler without penalties, no prefix cache and params.pipeline,
 * step k+1 runs on the device (its input fed from step k's sample there) while token k is read
 * back (otherwise one step at a time); the tokens are the same either way. */
smelt_status sm_engine_decode(sm_engine *e, sm_seq *s, sm_sampler *smp, int32_t first, int max_new,
                              bool (*emit)(void *ud, int32_t tok), void *ud, int *n_new);

/* Generate from token ids (one sequence); smelt_generate = tokenize + this. ep (may be NULL: the
 * defaults) supplies the engine options host_sample and pipeline; the rest is sized here. */
smelt_status sm_generate_ids(smelt_model *m, const sm_engine_params *ep, const int32_t *ids, int n_ids, int max_tokens,
                             const smelt_sampling *sp, smelt_piece_cb cb, void *user, smelt_stats *stats);

/* Perplexity of ids, scored in non-overlapping windows of ctx tokens (each window's
 * first token is context only). */
smelt_status sm_perplexity(smelt_model *m, const int32_t *ids, int n, int ctx, double *ppl, int *n_scored);
/* The same, calling progress (may be NULL) after each window with the tokens done of n; one_token: each
 * window's logits from one-token forward steps (the decode path) instead of one prefill. */
smelt_status sm_perplexity_progress(smelt_model *m, const int32_t *ids, int n, int ctx, bool one_token, double *ppl,
                                    int *n_scored, void (*progress)(void *ud, long done, long total), void *ud);

/* One sequence: compute all its pending tokens (at most max_batch_tokens) in one step and
 * return the logits after each of them: logits[j*vocab..] for j < *n_rows = pending. */
smelt_status sm_engine_step_all(sm_engine *e, sm_seq *s, float *logits, int *n_rows);
/* Speculative verification in a batch: like sm_engine_step, but a sequence with all[i] set computes
 * all its pending tokens in this step (they come first in the step budget: SMELT_ERR_LIMIT when
 * they exceed it) and gets a logits row after each of them; the others get the row after their
 * last token when it is computed. Rows are consecutive: sequence i's are logits[(row0[i] + j) *
 * vocab..] for j < nrows[i] (0: no row). logits holds, for each sequence, its pending tokens'
 * rows (all[i]) or one row. done[i] = 1 when all of the sequence's tokens are computed. */
smelt_status sm_engine_step_rows(sm_engine *e, sm_seq **seqs, int n, const uint8_t *all, float *logits, int *row0,
                                 int *nrows, uint8_t *done);
/* Drop tokens after the first len (speculative decoding rollback); frees their blocks. For a model with
 * recurrent layers, dropping computed tokens rewinds the sequence to its snapshot (sm_seq_checkpoint)
 * when that is at or before len, else to the start: the tokens after that point become pending again
 * and are recomputed by the next steps. */
smelt_status sm_seq_truncate(sm_engine *e, sm_seq *s, int len);
/* Hybrid models: keep a snapshot of s's recurrent state at its computed length, which later
 * truncations rewind to (nothing for other models, or when no state slot is free). */
void sm_seq_checkpoint(sm_engine *e, sm_seq *s);
/* The model has recurrent layers: no prefix cache, no KV export/import, no pipelined decode, no
 * speculative decoding. */
bool sm_engine_recurrent(const sm_engine *e);

/* Speculative decoding: like sm_generate_ids, with a draft model proposing n_draft tokens
 * per step that the target verifies in one batched step. Every emitted token is sampled
 * from the target's distribution (a draft token is kept only when it equals the target's
 * sample), so the output follows the target model exactly. *accepted (may be NULL)
 * receives the number of draft tokens accepted. */
smelt_status sm_generate_speculative(smelt_model *m, smelt_model *draft, const sm_engine_params *ep, int n_draft,
                                     const int32_t *ids, int n_ids, int max_tokens, const smelt_sampling *sp,
                                     smelt_piece_cb cb, void *user, smelt_stats *stats, int *accepted);

/* KV export / import, for prompt cache files (prompt_cache.h) and restoring a session.
 * sm_seq_kv_read: K and V of the computed tokens [t0, t0+n) of one layer into host memory, each
 * [n][n_kv_heads] head rows of the cache's type (sm_engine_kv_dtype, sm_kv_head_bytes), as stored. Import
 * into a sequence that has its tokens appended but no KV yet: sm_seq_kv_reserve(n) allocates
 * blocks for the first n tokens, sm_seq_kv_write fills them (any order of layers and token
 * ranges), sm_seq_kv_commit(n) marks them computed (and, with the prefix cache on, registers its
 * full blocks there, so that a later sequence with the same prefix reuses them even after this
 * one is freed). */
smelt_status sm_seq_kv_read(sm_engine *e, const sm_seq *s, int layer, int t0, int n, void *k, void *v);
smelt_status sm_seq_kv_reserve(sm_engine *e, sm_seq *s, int n);
smelt_status sm_seq_kv_write(sm_engine *e, sm_seq *s, int layer, int t0, int n, const void *k, const void *v);
smelt_status sm_seq_kv_commit(sm_engine *e, sm_seq *s, int n);
sm_dtype sm_engine_kv_dtype(const sm_engine *e); /* SM_DT_F16, SM_DT_BF16, SM_DT_F32, SM_DT_Q8_0 or SM_DT_Q4_0 */
/* Tokens per sequence the engine was created for. */
int sm_engine_max_context(const sm_engine *e);

/* The decode loop of speculative decoding (speculative.c), on sequences the caller owns: s is
 * computed and lg row 0 holds the logits after its last token (lg: (n_draft+1) * vocab floats);
 * d holds the same tokens for the draft engine de (computed or pending). Produces up to max_new
 * tokens, calling emit for each until it returns false; on return both sequences hold every
 * produced token but the last (the state sm_engine_decode leaves). */
smelt_status sm_spec_decode(sm_engine *e, sm_seq *s, sm_engine *de, sm_seq *d, int n_draft, int max_new,
                            sm_sampler *smp, float *lg, bool (*emit)(void *ud, int32_t tok), void *ud, int *accepted);

/* Embeddings (embed.c): the final-normed hidden states of ids (run as a sequence of their own,
 * without the prefix cache), pooled: the last token's, or the mean over all tokens. out: hidden
 * size floats, not normalized. */
typedef enum { SM_POOL_LAST = 0, SM_POOL_MEAN } sm_pooling;
smelt_status sm_engine_embed(sm_engine *e, const int32_t *ids, int n, sm_pooling pooling, float *out);

/* A second tier of the prefix cache (the server's disk tier, server/pcache_disk.h), called on the
 * engine's thread. spill: a cached block (free, in the prefix map) is about to be reused for other
 * tokens; its chain hash, its parent's and its block_size tokens (prefix-cache keys: image tokens
 * are keys of the image) identify it, sm_engine_block_read copies its KV out. fetch: the next full
 * block of a prompt is not in memory: fill block blk (allocated for it) with sm_engine_block_write
 * and return true, or return false (blk is given back). */
typedef struct {
  void *ud;
  void (*spill)(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent, const int32_t *tok);
  bool (*fetch)(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent, const int32_t *tok);
} sm_prefix_tier;
/* The engine keeps a copy of *t (NULL: no tier). False (nothing set) when the engine has no prefix
 * cache (off, or a model with recurrent layers). */
bool sm_engine_set_prefix_tier(sm_engine *e, const sm_prefix_tier *t);
/* Bytes of one block's K and V, every attention layer: per layer K [block_size][kv_heads] head rows
 * of sm_engine_kv_dtype (sm_kv_head_bytes) then V likewise; the layout of the host copies below. */
size_t sm_engine_block_bytes(const sm_engine *e);
/* Host copy of block blk's KV (waits for the device), and the way back. */
void sm_engine_block_read(sm_engine *e, int blk, void *host);
void sm_engine_block_write(sm_engine *e, int blk, const void *host);
/* Every block of the prefix cache (held by sequences or cached), the least recently used first:
 * what a tier keeps at shutdown. */
void sm_engine_each_prefix_block(sm_engine *e,
                                 void (*fn)(void *ud, sm_engine *e, int blk, uint64_t hash, uint64_t parent,
                                            const int32_t *tok),
                                 void *ud);

/* Stats */
typedef struct {
  int n_blocks, block_size, blocks_used, blocks_cached; /* cached: free but holding a prefix */
  uint64_t prefix_hits_tokens;                          /* tokens served from the prefix cache */
  uint64_t tier_hits_tokens;                            /* of those, read back from the tier */
  int state_slots, state_slots_used;                    /* hybrid models: recurrent state slots */
  size_t state_bytes;                                   /* bytes of one slot (0: no recurrent layers) */
} sm_engine_stats;
void sm_engine_get_stats(const sm_engine *e, sm_engine_stats *st);

#endif
