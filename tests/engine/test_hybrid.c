/* The engine with hybrid models (recurrent layers next to attention), on a synthetic checkpoint of
 * every hybrid family:
 *  - a prompt in one prefill equals the same prompt fed in chunks and token by token (the logits after
 *    every token, against one full forward);
 *  - a batch of 16 sequences of mixed lengths, prefill chunks interleaved with decode steps, equals each
 *    sequence alone;
 *  - a fork continues exactly as its parent; truncation rewinds to the snapshot (or the start) and the
 *    recomputed sequence gives the same logits; state slots are freed with their sequences, and a step
 *    needing more than there are fails with SMELT_ERR_OOM;
 *  - what is refused for such models is refused: prefix reuse (0 tokens reported), KV export/import,
 *    speculative decoding;
 *  - mixture-of-experts hybrids (Qwen3-Next, Qwen3.5 MoE, LFM2-MoE): a checkpoint with an expert or router
 *    tensor missing or misnamed fails to load with an error naming the tensor. */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/engine.h"
#include "engine/session.h"
#include "format/st_write.h"
#include "model/model.h"
#include "../test_util.h"

static smelt_model *M;
static int V;
static const char *g_fam;
static const double TOL = 2e-3;

static void fill(int32_t *t, int n, uint64_t seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    t[i] = (int32_t)((seed >> 33) % (uint64_t)V);
  }
}

static sm_engine *engine(int max_seqs, int max_batch, bool prefix) {
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_context = 96;
  ep.max_seqs = max_seqs;
  ep.max_batch_tokens = max_batch;
  ep.prefix_cache = prefix;
  sm_engine *e = NULL;
  CHECK(sm_engine_create(M, &ep, &e) == SMELT_OK, "%s: engine: %s", g_fam, smelt_last_error());
  return e;
}

/* feed ids in chunks of `chunk` tokens, checking the logits after every chunk's last token */
static void chunks_case(const int32_t *ids, int n, int chunk, const float *ref) {
  sm_engine *e = engine(1, 64, false);
  if (!e) return;
  sm_seq *q = sm_seq_new(e);
  float *lg = malloc(sizeof(float) * (size_t)V);
  for (int i = 0; i < n; i += chunk) {
    const int c = SM_MIN(chunk, n - i);
    sm_seq_append(e, q, ids + i, c);
    uint8_t done = 0;
    for (int k = 0; !done && k < 100; k++)
      CHECK(sm_engine_step(e, &q, 1, lg, &done) == SMELT_OK, "%s: step: %s", g_fam, smelt_last_error());
    CHECK(t_max_rel(lg, ref + (size_t)(i + c - 1) * V, (size_t)V, 1e-3) < TOL,
          "%s: chunk %d: logits after token %d "
          "differ from one full forward",
          g_fam, chunk, i + c - 1);
  }
  free(lg);
  sm_seq_free(e, q);
  sm_engine_free(e);
}

/* 16 sequences of different lengths in one engine: prompts prefilled in chunks of a small step budget
 * while others decode; each one's logits equal its own full forward */
static void batch_case(void) {
  enum { NS = 16, GEN = 4 };
  const int lens[NS] = {3, 17, 9, 30, 1, 12, 5, 22, 2, 14, 7, 26, 11, 4, 19, 8};
  int32_t ids[NS][40];
  float *ref[NS];
  for (int s = 0; s < NS; s++) {
    fill(ids[s], lens[s] + GEN, 100 + s);
    CHECK(smelt_eval_logits(M, ids[s], lens[s] + GEN, &ref[s]) == SMELT_OK, "eval");
  }
  sm_engine *e = engine(NS, 16, false);
  if (!e) return;
  sm_seq *q[NS];
  int fed[NS];
  for (int s = 0; s < NS; s++) {
    q[s] = sm_seq_new(e);
    sm_seq_append(e, q[s], ids[s], lens[s]);
    fed[s] = lens[s];
  }
  float *lg = malloc(sizeof(float) * (size_t)V * NS);
  uint8_t done[NS];
  int finished = 0, steps = 0;
  while (finished < NS && steps++ < 200) {
    CHECK(sm_engine_step(e, q, NS, lg, done) == SMELT_OK, "%s: batch step: %s", g_fam, smelt_last_error());
    for (int s = 0; s < NS; s++) {
      if (!done[s]) continue;
      CHECK(t_max_rel(lg + (size_t)s * V, ref[s] + (size_t)(fed[s] - 1) * V, (size_t)V, 1e-3) < TOL,
            "%s: batched sequence %d (length %d): logits after token %d differ", g_fam, s, lens[s], fed[s] - 1);
      if (fed[s] < lens[s] + GEN) {
        sm_seq_append(e, q[s], ids[s] + fed[s], 1);
        fed[s]++;
      } else if (fed[s] == lens[s] + GEN) {
        fed[s]++; /* finished */
        finished++;
      }
    }
  }
  CHECK(finished == NS, "%s: batch did not finish", g_fam);
  sm_engine_stats st;
  sm_engine_get_stats(e, &st);
  CHECK(st.state_slots_used == NS && st.state_slots >= NS && st.state_bytes > 0, "%s: state slots %d/%d, %zu bytes",
        g_fam, st.state_slots_used, st.state_slots, st.state_bytes);
  for (int s = 0; s < NS; s++) sm_seq_free(e, q[s]);
  sm_engine_get_stats(e, &st);
  CHECK(st.state_slots_used == 0, "%s: slots not freed with their sequences", g_fam);
  free(lg);
  for (int s = 0; s < NS; s++) free(ref[s]);
  sm_engine_free(e);
}

/* the logits after the last token of q (computing whatever is pending) */
static void run(sm_engine *e, sm_seq *q, float *lg) {
  uint8_t done = 0;
  for (int k = 0; !done && k < 100; k++)
    CHECK(sm_engine_step(e, &q, 1, lg, &done) == SMELT_OK, "%s: step: %s", g_fam, smelt_last_error());
  CHECK(done, "%s: no logits after 100 steps", g_fam);
}

static void fork_truncate_case(void) {
  int32_t ids[40];
  fill(ids, 40, 7);
  float *ref = NULL;
  CHECK(smelt_eval_logits(M, ids, 40, &ref) == SMELT_OK, "eval");
  sm_engine *e = engine(2, 64, true);
  if (!e) {
    free(ref);
    return;
  }
  float *lg = malloc(sizeof(float) * (size_t)V);
  sm_seq *q = sm_seq_new(e);
  sm_seq_append(e, q, ids, 21); /* a partial last block (block size 16) */
  run(e, q, lg);
  /* fork: the child continues as the parent does */
  sm_seq *c = sm_seq_fork(e, q);
  CHECK(c && sm_seq_pending(c) == 0, "%s: fork of a computed sequence: nothing pending", g_fam);
  if (c) {
    sm_seq_append(e, c, ids + 21, 5);
    run(e, c, lg);
    CHECK(t_max_rel(lg, ref + 25 * (size_t)V, (size_t)V, 1e-3) < TOL, "%s: fork continues differently", g_fam);
  }
  sm_seq_append(e, q, ids + 21, 3); /* the parent is unaffected by its child */
  run(e, q, lg);
  CHECK(t_max_rel(lg, ref + 23 * (size_t)V, (size_t)V, 1e-3) < TOL, "%s: parent after fork differs", g_fam);
  /* truncation without a snapshot: back to the start, everything recomputed */
  CHECK(sm_seq_truncate(e, q, 10) == SMELT_OK, "truncate");
  CHECK(sm_seq_len(q) == 10 && sm_seq_pending(q) == 10, "%s: rewound to the start (pending %d)", g_fam,
        sm_seq_pending(q));
  run(e, q, lg);
  CHECK(t_max_rel(lg, ref + 9 * (size_t)V, (size_t)V, 1e-3) < TOL, "%s: recomputed after truncation", g_fam);
  /* with a snapshot at 10: truncating to 12 after going on to 30 rewinds to 10 */
  sm_seq_checkpoint(e, q);
  sm_seq_append(e, q, ids + 10, 20);
  run(e, q, lg);
  CHECK(sm_seq_truncate(e, q, 12) == SMELT_OK && sm_seq_pending(q) == 2, "%s: rewound to the snapshot (pending %d)",
        g_fam, sm_seq_pending(q));
  run(e, q, lg);
  CHECK(t_max_rel(lg, ref + 11 * (size_t)V, (size_t)V, 1e-3) < TOL, "%s: after rewinding to the snapshot", g_fam);
  sm_seq_append(e, q, ids + 12, 28);
  run(e, q, lg);
  CHECK(t_max_rel(lg, ref + 39 * (size_t)V, (size_t)V, 1e-3) < TOL, "%s: continued after the rewind", g_fam);
  /* no prefix reuse (even with the prefix cache asked for), no KV export */
  sm_seq *p = sm_seq_new(e);
  sm_seq_append(e, p, ids, 40);
  CHECK(sm_seq_use_prefix_cache(e, p) == 0 && sm_seq_pending(p) == 40, "%s: a prefix was reused", g_fam);
  float kbuf[4096], vbuf[4096];
  CHECK(sm_seq_kv_read(e, q, 0, 0, 1, kbuf, vbuf) == SMELT_ERR_UNSUPPORTED, "%s: KV export not refused", g_fam);
  CHECK(sm_seq_kv_reserve(e, p, 4) == SMELT_ERR_UNSUPPORTED, "%s: KV import not refused", g_fam);
  CHECK(sm_engine_recurrent(e), "%s: engine not recurrent", g_fam);
  /* state slots: max_seqs (2) + 2; a fifth sequence's first step finds none */
  sm_seq *x = sm_seq_new(e);
  sm_seq_append(e, x, ids, 4);
  sm_seq *all[2] = {p, x};
  uint8_t done[2];
  float *lg2 = malloc(sizeof(float) * 2 * (size_t)V);
  smelt_status st = sm_engine_step(e, all, 2, lg2, done);
  CHECK(st == SMELT_ERR_OOM, "%s: a step without a free state slot gives %d", g_fam, (int)st);
  sm_seq_free(e, c);
  st = sm_engine_step(e, all, 2, lg2, done);
  CHECK(st == SMELT_OK, "%s: a freed slot is reused: %s", g_fam, smelt_last_error());
  free(lg2);
  sm_seq_free(e, x);
  sm_seq_free(e, p);
  sm_seq_free(e, q);
  free(lg);
  free(ref);
  sm_engine_free(e);
}

static void refusals_case(void) {
  sm_session *s = NULL;
  smelt_status st = sm_session_create(M, M, 4, 64, 0, &s);
  CHECK(st == SMELT_ERR_UNSUPPORTED && !s, "%s: a session with a draft model is refused (%d)", g_fam, (int)st);
  sm_session_free(s);
  int32_t ids[8];
  fill(ids, 8, 3);
  int acc = 0;
  smelt_sampling sp;
  smelt_sampling_default(&sp);
  smelt_stats stats;
  memset(&stats, 0, sizeof stats);
  st = sm_generate_speculative(M, M, NULL, 2, ids, 8, 4, &sp, NULL, NULL, &stats, &acc);
  CHECK(st == SMELT_ERR_UNSUPPORTED, "%s: speculative decoding is refused (%d)", g_fam, (int)st);
}

/* a copy of the checkpoint in src with tensor `name` dropped (to NULL) or renamed (to `to`): loading it
 * fails, and the error names the tensor the family expects */
static void bad_expert_case(const char *src, const char *dst, const char *name, const char *to) {
  char p[900];
  snprintf(p, sizeof p, "%s/model.safetensors", src);
  sm_st *st = NULL;
  CHECK(sm_st_open(p, &st) == SMELT_OK, "%s: open %s: %s", g_fam, p, smelt_last_error());
  if (!st) return;
  mkdir(dst, 0755);
  sm_st_writer *w = sm_stw_new();
  bool found = false;
  for (size_t i = 0; i < sm_st_count(st); i++) {
    const sm_tensor *t = sm_st_at(st, i);
    const bool hit = !strcmp(t->name, name);
    found |= hit;
    if (hit && !to) continue;
    sm_stw_add(w, hit ? to : t->name, t->dtype, t->ndim, t->shape, t->data, NULL, NULL);
  }
  CHECK(found, "%s: the synthetic checkpoint has no %s", g_fam, name);
  snprintf(p, sizeof p, "%s/model.safetensors", dst);
  CHECK(sm_stw_write(w, p) == SMELT_OK, "write %s", p);
  sm_stw_free(w);
  sm_st_close(st);
  char *cfg = NULL;
  snprintf(p, sizeof p, "%s/config.json", src);
  CHECK(sm_read_file(p, &cfg, NULL) == SMELT_OK, "read %s", p);
  snprintf(p, sizeof p, "%s/config.json", dst);
  FILE *f = fopen(p, "w");
  CHECK(f && cfg && fputs(cfg, f) >= 0, "write %s", p);
  if (f) fclose(f);
  free(cfg);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  mp.n_threads = 1;
  mp.max_context = 32;
  smelt_model *m = NULL;
  const smelt_status rc = smelt_model_load(dst, &mp, &m);
  /* the expected tensor is missing; the renamed one would be reported as unread if it got that far */
  CHECK(rc != SMELT_OK && !m && strstr(smelt_last_error(), name), "%s: %s %s: load gave %d (%s)", g_fam,
        to ? "misnamed" : "missing", name, (int)rc, smelt_last_error());
  smelt_model_free(m);
}

static void expert_tensor_cases(const sm_family *f, const char *dir, const char *root) {
  int l = 0; /* the first layer with the mixture */
  while (l < M->cfg.num_hidden_layers && !M->cfg.moe.moe_layer[l]) l++;
  CHECK(l < M->cfg.num_hidden_layers, "%s: no mixture-of-experts layer in the synthetic model", g_fam);
  const char *pre = f->names->root, *ls = f->names->layers;
  char name[300], to[300], dst[900];
  snprintf(name, sizeof name, "%s%s.%d.%s.up_proj.weight", pre, ls, l, f->moe->experts);
  snprintf(to, sizeof to, "%s%s.%d.mlp.experts.up_proj.weight", pre, ls, l);
  snprintf(dst, sizeof dst, "%s/%s-misnamed", root, f->model_type);
  bad_expert_case(dir, dst, name, to);
  snprintf(dst, sizeof dst, "%s/%s-missing", root, f->model_type);
  snprintf(name, sizeof name, "%s%s.%d.%s.weight", pre, ls, l, f->moe->router);
  bad_expert_case(dir, dst, name, NULL);
  if (f->moe->shared) {
    snprintf(dst, sizeof dst, "%s/%s-missing-shared", root, f->model_type);
    snprintf(name, sizeof name, "%s%s.%d.%s.down_proj.weight", pre, ls, l, f->moe->shared);
    bad_expert_case(dir, dst, name, NULL);
  }
}

int main(int argc, char **argv) {
  char root[512];
  snprintf(root, sizeof root, "%s", argc > 1 ? argv[1] : "/tmp/smelt-hybrid-test");
  mkdir(root, 0755);
  size_t nf;
  const sm_family *const *all = sm_family_all(&nf);
  int ran = 0, ran_moe = 0;
  for (size_t i = 0; i < nf; i++) {
    const sm_family *f = all[i];
    if (!f->recipe || !f->defaults->rec) continue;
    g_fam = f->model_type;
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s", root, f->model_type);
    char old[800]; /* a checkpoint left by an earlier build may have another layout: written afresh */
    snprintf(old, sizeof old, "%s/config.json", dir);
    unlink(old);
    snprintf(old, sizeof old, "%s/model.safetensors", dir);
    unlink(old);
    sm_synth_shape sh = {"hybrid", 64, 2, 4, 2, 128, 211, false, f->model_type, 16, NULL};
    CHECK(sm_make_synthetic(&sh, 0, 32, dir, false) == SMELT_OK, "%s: synthetic: %s", g_fam, smelt_last_error());
    smelt_model_params mp;
    smelt_model_params_default(&mp);
    mp.device = SMELT_DEVICE_CPU;
    mp.n_threads = 2;
    mp.max_context = 96;
    M = NULL;
    CHECK(smelt_model_load(dir, &mp, &M) == SMELT_OK, "%s: load: %s", g_fam, smelt_last_error());
    if (!M) continue;
    V = smelt_model_vocab_size(M);
    int32_t ids[37];
    fill(ids, 37, 42);
    float *ref = NULL;
    CHECK(smelt_eval_logits(M, ids, 37, &ref) == SMELT_OK, "eval");
    if (ref) {
      chunks_case(ids, 37, 37, ref);
      chunks_case(ids, 37, 5, ref);
      chunks_case(ids, 37, 1, ref);
    }
    free(ref);
    batch_case();
    fork_truncate_case();
    refusals_case();
    if (f->moe) {
      expert_tensor_cases(f, dir, root);
      ran_moe++;
    }
    smelt_model_free(M);
    ran++;
  }
  CHECK(ran == 7, "hybrid families run: %d", ran);
  CHECK(ran_moe == 3, "mixture-of-experts hybrid families run: %d", ran_moe);
  TEST_END();
}
