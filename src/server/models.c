/* Served models of `smelt serve`: loading a model into an engine and scheduler, the registry,
 * the loader thread and the LRU pool (see models.h). */
#include "server/models.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include "base/mapguard.h"
#include "server/gpool.h"
#include "store/store.h"

enum { ST_UNLOADED = 0, ST_WANT, ST_LOADING, ST_LOADED, ST_UNLOADING, ST_FAILED };
static const char *const k_state[] = {"unloaded", "loading", "loading", "loaded", "unloading", "failed"};

typedef struct {
  char id[256];
  char *dir;
  int state;
  sm_served *sv;       /* ST_LOADED */
  sm_metrics *metrics; /* this model's counters (kept across loads) */
  int users;           /* requests holding it */
  double last_used;
  uint64_t want_seq; /* load order */
  bool reload;       /* asked for while unloading */
  int attempts;      /* loads started */
  char err[640];     /* why the last load failed */
  bool bytes_known;
  uint64_t bytes;    /* estimated memory (with --models-memory) */
  sm_sock **waiters; /* parked requests */
  int n_waiters, cap_waiters;
  /* requests resumed by a successful load, each counted in users until it takes the model (so
   * that the next load cannot unload it before they do) or goes away */
  sm_sock **granted;
  int n_granted, cap_granted;
  long created; /* loaded at (unix s) */
  uint64_t loads, unloads;
} entry;

struct sm_models {
  const sm_server_params *p;
  bool multi;
  entry *e;
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* wakes the loader */
  pthread_t loader;
  bool loader_started, stopping;
  const char *refuse; /* set: models not loaded are refused with this (draining) */
  uint64_t want_counter;
  int n_loaded;
  uint64_t mem_loaded;
  sm_gpool *gpool; /* compiled grammars and grammar masks, shared by the models */
};

/* ------------------------------------------------------------------ one loaded model */

/* after every engine step: did a weights file fault or change under its mapping? */
static bool weights_changed(void *arg, char *msg, size_t n) {
  (void)arg;
  return sm_mapguard_check(msg, n);
}

static void served_free(sm_served *sv) {
  if (!sv) return;
  if (sv->sched_init) sm_sched_destroy(&sv->sched);
  sm_pcache_free(&sv->pc);
  sm_pdisk_close(sv->disk, sv->eng);
  if (sv->eng) sm_engine_free(sv->eng);
  if (sv->deng) sm_engine_free(sv->deng);
  if (sv->model) smelt_model_free(sv->model);
  if (sv->draft) smelt_model_free(sv->draft);
  free(sv->dir);
  free(sv);
}

/* Load the model of dir as `id` and start its engine thread. NULL with err filled on failure. */
static sm_served *served_load(const sm_server_params *p, const char *dir, const char *id, sm_metrics *metrics,
                              sm_gpool *gpool, bool with_pcache, char *err, size_t n_err) {
  sm_served *sv = sm_xcalloc(1, sizeof *sv);
  snprintf(sv->id, sizeof sv->id, "%s", id);
  sv->dir = sm_xstrdup(dir);
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = (smelt_device)p->device;
  mp.n_threads = p->threads;
  mp.cpu_mask = p->cpu_mask;
  mp.numa = (smelt_numa)p->numa;
  mp.cpu_poll = p->cpu_poll;
  mp.max_context = p->ctx_size;
  mp.max_seqs = p->parallel;
  mp.no_mmap = p->no_mmap;
  mp.kv_type = (smelt_kv_type)p->kv_type;
  mp.deterministic = p->deterministic;
  mp.tensor_parallel = p->tensor_parallel;
  mp.pipeline_parallel = p->pipeline_parallel;
  mp.pp_shares = p->pp_shares;
  mp.nnodes = p->nnodes;
  mp.node_rank = p->node_rank;
  mp.master_addr = p->master_addr;
  fprintf(stderr, "smelt serve: loading %s%s\n", dir, p->no_mmap ? " (into memory: --no-mmap)" : "");
  char fmsg[512];
  if (smelt_model_load(dir, &mp, &sv->model) != SMELT_OK) {
    snprintf(err, n_err, "could not load the model: %s", smelt_last_error());
    goto fail;
  }
  if (sm_mapguard_check(fmsg, sizeof fmsg)) {
    snprintf(err, n_err, "could not load the model: %.240s", fmsg);
    goto fail;
  }
  const smelt_tokenizer *tok = smelt_model_tokenizer(sv->model);
  if (!tok) {
    snprintf(err, n_err, "the model directory has no tokenizer");
    goto fail;
  }
  smelt_model_info info;
  smelt_model_get_info(sv->model, &info);
  if (info.note && info.note[0]) fprintf(stderr, "smelt serve: note: %s\n", info.note);
  sm_engine_params ep;
  sm_engine_params_default(&ep);
  ep.max_seqs = p->parallel;
  if (p->ctx_size > 0) ep.max_context = p->ctx_size;
  else if (info.max_context > 0) ep.max_context = info.max_context;
  if (p->kv_blocks > 0) ep.n_blocks = p->kv_blocks;
  if (p->block_size > 0) ep.block_size = p->block_size;
  if (p->max_batch_tokens > 0) ep.max_batch_tokens = p->max_batch_tokens;
  ep.prefix_cache = !p->no_prefix_cache;
  ep.host_sample = p->host_sample;
  ep.pipeline = !p->no_pipeline;
  ep.pipeline_always = p->pipeline_always;
  if (sm_engine_create(sv->model, &ep, &sv->eng) != SMELT_OK) {
    snprintf(err, n_err, "could not create the engine: %s", smelt_last_error());
    goto fail;
  }
  if (with_pcache && p->prompt_cache && sm_engine_recurrent(sv->eng)) {
    snprintf(err, n_err, "--prompt-cache: models with recurrent layers (%s) do not use the prefix cache",
             smelt_model_arch(sv->model));
    goto fail;
  }
  /* the disk tier of the prefix cache: before the prompt cache file (which may evict blocks) */
  if (p->kv_cache_dir && sm_engine_recurrent(sv->eng)) {
    fprintf(stderr,
            "smelt serve: note: --kv-cache-dir: models with recurrent layers (%s) do not use the prefix "
            "cache; model '%s' has no disk cache\n",
            smelt_model_arch(sv->model), sv->id);
  } else if (p->kv_cache_dir && !(sv->disk = sm_pdisk_open(sv->eng, p->kv_cache_dir, p->kv_cache_disk_size))) {
    snprintf(err, n_err, "the KV disk cache (--kv-cache-dir %s) could not be opened", p->kv_cache_dir);
    goto fail;
  }
  /* the prompt cache file goes into the prefix cache before any request */
  if (with_pcache && !sm_pcache_open(&sv->pc, sv->eng, p->prompt_cache, p->prompt_cache_ro)) {
    snprintf(err, n_err, "the prompt cache file was refused");
    goto fail;
  }
  int vocab = smelt_model_vocab_size(sv->model);
  if ((p->draft_dir || p->spec_ngram) && sm_engine_recurrent(sv->eng)) {
    snprintf(err, n_err, "speculative decoding: models with recurrent layers (%s) cannot take back rejected tokens",
             smelt_model_arch(sv->model));
    goto fail;
  }
  if (p->draft_dir) {
    fprintf(stderr, "smelt serve: loading the draft model %s\n", p->draft_dir);
    mp.tensor_parallel = mp.pipeline_parallel = mp.nnodes = 0; /* the draft runs whole on rank 0's device */
    if (smelt_model_load(p->draft_dir, &mp, &sv->draft) != SMELT_OK) {
      snprintf(err, n_err, "could not load the draft model: %s", smelt_last_error());
      goto fail;
    }
    const int dv = smelt_model_vocab_size(sv->draft);
    if (dv > vocab) {
      snprintf(err, n_err, "the draft model's vocabulary (%d) is larger than the model's (%d)", dv, vocab);
      goto fail;
    }
    if (sv->draft->cfg.rec.kind != SM_REC_NONE) {
      snprintf(err, n_err, "speculative decoding: the draft model has recurrent layers (%s)",
               smelt_model_arch(sv->draft));
      goto fail;
    }
    sm_engine_params dep = ep;
    dep.n_blocks = 0; /* enough for every sequence at full context */
    dep.prefix_cache = true;
    if (sm_engine_create(sv->draft, &dep, &sv->deng) != SMELT_OK) {
      snprintf(err, n_err, "could not create the draft model's engine: %s", smelt_last_error());
      goto fail;
    }
  }
  sm_sched *sc = &sv->sched;
  sm_sched_init(sc, sv->eng, tok, metrics, vocab, p->parallel, p->max_queue);
  sc->gcache = sm_gpool_masks(gpool);
  sc->mask_threads = p->grammar_threads;
  if (p->draft_dir || p->spec_ngram) {
    sc->spec.on = true;
    sc->spec.n_max = p->draft_max;
    sc->spec.n_min = p->draft_min;
    sc->spec.p_min = p->draft_p_min;
    sc->spec.ngram_n = p->spec_ngram_n;
    sc->spec.deng = sv->deng;
    sc->spec.dvocab = sv->draft ? smelt_model_vocab_size(sv->draft) : 0;
    sc->spec.budget = SM_MAX(ep.max_batch_tokens, p->parallel); /* as the engine sizes it */
  }
  sv->sched_init = true;
  sc->after_step = weights_changed;
  for (int i = 0; i < info.n_eos; i++) sm_sched_add_eos(sc, info.eos_ids[i]);
  const char *eos_tok = sm_tok_eos_token(tok);
  if (eos_tok) sm_sched_add_eos(sc, sm_tok_token_id(tok, eos_tok));
  static const char *const ends[] = {"<|im_end|>",    "<|eot_id|>",    "<|eom_id|>", "<|end_of_text|>",
                                     "<end_of_turn>", "<|endoftext|>", "<|end|>",    "</s>"};
  for (size_t i = 0; i < SM_ARRAY_LEN(ends); i++) {
    int32_t tid = sm_tok_token_id(tok, ends[i]);
    if (tid >= 0 && sm_tok_is_special(tok, tid)) sm_sched_add_eos(sc, tid);
  }
  sm_oai *o = &sv->oai;
  *o = (sm_oai){.model_id = sv->id,
                .arch = smelt_model_arch(sv->model),
                .tok = tok,
                .vocab = vocab,
                .ctx = ep.max_context,
                .parallel = p->parallel,
                .gen_temperature = info.gen_temperature,
                .gen_top_p = info.gen_top_p,
                .gen_top_k = info.gen_top_k,
                .created = (long)time(NULL),
                .model_path = sv->dir,
                .pooling = p->pooling,
                .vision = sv->model->vision,
                .vision_note = sv->model->note,
                .gpool = gpool,
                .sched = sc};
  sm_image_policy_default(&o->images);
  o->images.allow_urls = p->allow_image_urls;
  o->images.files_dir = p->image_files_dir;
  const char *tmpl = sm_tok_chat_template(tok, NULL);
  o->tfmt = p->tool_format ? sm_toolfmt_by_name(p->tool_format) : sm_toolfmt_detect(tmpl);
  if (!o->tfmt) o->tfmt = sm_toolfmt_by_name("generic"); /* --tool-format was checked at start */
  /* a template that writes <think> blocks: split them off unless --reasoning-format none */
  o->reasoning = !(p->reasoning_format && !strcmp(p->reasoning_format, "none")) &&
                 ((tmpl && strstr(tmpl, "</think>")) || o->tfmt->kind == SM_TF_HARMONY);
  if (!sm_sched_start(sc)) {
    snprintf(err, n_err, "could not start the engine thread");
    goto fail;
  }
  fprintf(stderr, "smelt serve: model '%s' (%s), ctx %d, parallel %d, %d KV blocks of %d\n", sv->id, o->arch, o->ctx,
          p->parallel, sc->stats.n_blocks, sc->stats.block_size);
  if (sc->spec.on)
    fprintf(stderr, "smelt serve: speculative decoding: %s, up to %d draft tokens a step (at least %d)\n",
            sv->draft ? "draft model" : "n-gram prompt lookup", sc->spec.n_max, sc->spec.n_min);
  fprintf(stderr, "smelt serve: tool-call format %s, reasoning %s\n", o->tfmt->name,
          o->reasoning ? "split into reasoning_content" : "not split");
  return sv;
fail:
  served_free(sv);
  return NULL;
}

/* the engine thread stops (what is queued or running fails); the prompt cache is written */
static void served_stop(sm_served *sv) {
  if (!sv || !sv->sched_init) return;
  sm_sched_stop(&sv->sched);
  sm_pcache_save(&sv->pc, sv->eng, &sv->sched);
  sm_pdisk_persist(sv->disk, sv->eng);
}

/* ------------------------------------------------------------------ the registry */

static entry *add_entry(sm_models *r, const char *id, const char *dir) {
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->e[i].id, id)) {
      fprintf(stderr, "smelt serve: two models are named '%s' (%s and %s)\n", id, r->e[i].dir, dir);
      return NULL;
    }
  r->e = sm_xrealloc(r->e, sizeof(entry) * (size_t)(r->n + 1));
  entry *e = &r->e[r->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->id, sizeof e->id, "%s", id);
  e->dir = sm_xstrdup(dir);
  e->metrics = sm_metrics_new();
  return e;
}

static bool is_model_dir(const char *dir) {
  char *c = sm_path_join(dir, "config.json");
  struct stat st;
  bool ok = stat(c, &st) == 0 && S_ISREG(st.st_mode);
  free(c);
  return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* the sub-directories of dir, sorted (hidden ones left out) */
static char **list_dirs(const char *dir, int *n) {
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return NULL;
  char **v = NULL;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char *full = sm_path_join(dir, de->d_name);
    struct stat st;
    if (stat(full, &st) == 0 && S_ISDIR(st.st_mode)) {
      v = sm_xrealloc(v, sizeof(char *) * (size_t)(*n + 1));
      v[(*n)++] = sm_xstrdup(de->d_name);
    }
    free(full);
  }
  closedir(d);
  if (*n) qsort(v, (size_t)*n, sizeof(char *), cmp_str);
  return v;
}

/* --models-dir: DIR/NAME/config.json is model NAME, DIR/OWNER/NAME/config.json (the store's and
 * the hub's layout) model OWNER/NAME */
static bool scan_models_dir(sm_models *r, const char *root) {
  struct stat st;
  if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "smelt serve: --models-dir %s is not a directory\n", root);
    return false;
  }
  int n = 0, before = r->n;
  char **top = list_dirs(root, &n);
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    char *d = sm_path_join(root, top[i]);
    if (is_model_dir(d)) {
      ok = add_entry(r, top[i], d) != NULL;
    } else {
      int m = 0;
      char **sub = list_dirs(d, &m);
      for (int k = 0; k < m; k++) {
        char *sd = sm_path_join(d, sub[k]);
        if (ok && is_model_dir(sd)) {
          char id[512];
          snprintf(id, sizeof id, "%s/%s", top[i], sub[k]);
          ok = add_entry(r, id, sd) != NULL;
        }
        free(sd);
        free(sub[k]);
      }
      free(sub);
    }
    free(d);
    free(top[i]);
  }
  free(top);
  if (ok && r->n == before) {
    fprintf(stderr,
            "smelt serve: --models-dir %s holds no model (no DIR/NAME/config.json or DIR/OWNER/NAME/config.json)\n",
            root);
    return false;
  }
  return ok;
}

/* the id of the single model: --alias, else the model directory's name */
static void single_id(const sm_server_params *p, char *out, size_t n) {
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

sm_models *sm_models_new(const sm_server_params *p) {
  sm_models *r = sm_xcalloc(1, sizeof *r);
  r->p = p;
  r->gpool = sm_gpool_new(p->grammar_cache);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->multi = p->models_dir || p->n_models > 1;
  bool ok = true;
  if (!r->multi) {
    char id[256];
    single_id(p, id, sizeof id);
    add_entry(r, id, p->model_dir);
  } else {
    for (int i = 0; i < p->n_models && ok; i++) ok = add_entry(r, p->model_ids[i], p->model_dirs[i]) != NULL;
    if (ok && p->models_dir) ok = scan_models_dir(r, p->models_dir);
  }
  if (!ok) {
    sm_models_free(r);
    return NULL;
  }
  return r;
}

bool sm_models_multi(const sm_models *r) { return r->multi; }
sm_served *sm_models_single(sm_models *r) { return r->multi ? NULL : r->e[0].sv; }

/* ------------------------------------------------------------------ the loader */

static void push(sm_sock ***v, int *n, int *cap, sm_sock *k) {
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 8;
    *v = sm_xrealloc(*v, sizeof(sm_sock *) * (size_t)*cap);
  }
  (*v)[(*n)++] = k;
}

static bool take(sm_sock **v, int *n, sm_sock *k) {
  for (int i = 0; i < *n; i++)
    if (v[i] == k) {
      v[i] = v[--*n];
      return true;
    }
  return false;
}

/* under mu: resume the requests waiting for e; after a successful load they hold it already */
static void wake_waiters(entry *e) {
  const bool loaded = e->state == ST_LOADED;
  for (int i = 0; i < e->n_waiters; i++) {
    if (loaded) {
      push(&e->granted, &e->n_granted, &e->cap_granted, e->waiters[i]);
      e->users++;
    }
    sm_conns_unpark(e->waiters[i]->g, e->waiters[i]);
  }
  e->n_waiters = 0;
}

/* under mu: k waits no more; false when it was not granted a model (else it still holds e) */
static bool unwait_locked(sm_models *r, sm_sock *k, entry **held) {
  *held = NULL;
  for (int i = 0; i < r->n; i++) {
    entry *e = &r->e[i];
    take(e->waiters, &e->n_waiters, k);
    if (take(e->granted, &e->n_granted, k)) *held = e;
  }
  return *held != NULL;
}

static bool fits(const sm_models *r, const entry *w) {
  if (r->n_loaded + 1 > r->p->models_max) return false;
  return !r->p->models_memory || r->mem_loaded + w->bytes <= r->p->models_memory;
}

/* under mu (released meanwhile): unload e, which no request holds */
static void unload(sm_models *r, entry *e) {
  sm_served *sv = e->sv;
  e->state = ST_UNLOADING;
  e->sv = NULL;
  r->n_loaded--;
  r->mem_loaded -= e->bytes;
  pthread_mutex_unlock(&r->mu);
  fprintf(stderr, "smelt serve: unloading model '%s' (least recently used)\n", e->id);
  served_stop(sv);
  served_free(sv);
  pthread_mutex_lock(&r->mu);
  e->unloads++;
  if (e->reload) {
    e->reload = false;
    e->state = ST_WANT;
    e->want_seq = ++r->want_counter;
  } else {
    e->state = ST_UNLOADED;
  }
}

static void *loader_main(void *arg) {
  sm_models *r = arg;
  char bytes_a[32], bytes_b[32];
  pthread_mutex_lock(&r->mu);
  while (!r->stopping) {
    entry *w = NULL;
    for (int i = 0; i < r->n; i++)
      if (r->e[i].state == ST_WANT && (!w || r->e[i].want_seq < w->want_seq)) w = &r->e[i];
    if (!w) {
      pthread_cond_wait(&r->cv, &r->mu);
      continue;
    }
    if (r->p->models_memory && !w->bytes_known) {
      sm_mem_estimate est;
      const smelt_kv_type kvt = (smelt_kv_type)r->p->kv_type;
      char *dir = sm_xstrdup(w->dir);
      pthread_mutex_unlock(&r->mu);
      /* the KV cache the engine will allocate: --kv-blocks, else -np sequences of the context */
      smelt_status st = sm_store_estimate(dir, r->p->ctx_size > 0 ? r->p->ctx_size : 0, kvt,
                                          r->p->device == SMELT_DEVICE_CUDA, &est);
      if (st == SMELT_OK) {
        int tokens = r->p->kv_blocks > 0 ? r->p->kv_blocks * (r->p->block_size > 0 ? r->p->block_size : 16)
                                         : est.max_tokens * r->p->parallel;
        st = sm_store_estimate(dir, tokens, kvt, r->p->device == SMELT_DEVICE_CUDA, &est);
      }
      char msg[256];
      snprintf(msg, sizeof msg, "%s", st == SMELT_OK ? "" : smelt_last_error());
      free(dir);
      pthread_mutex_lock(&r->mu);
      if (st != SMELT_OK) {
        w->state = ST_FAILED;
        w->attempts++;
        snprintf(w->err, sizeof w->err, "could not estimate the memory of model '%s': %s", w->id, msg);
        wake_waiters(w);
        continue;
      }
      w->bytes = est.total_bytes;
      w->bytes_known = true;
    }
    if (r->p->models_memory && w->bytes > r->p->models_memory) {
      w->state = ST_FAILED;
      w->attempts++;
      snprintf(w->err, sizeof w->err, "model '%s' needs about %s, more than --models-memory (%s)", w->id,
               sm_store_fmt_bytes(w->bytes, bytes_a, sizeof bytes_a),
               sm_store_fmt_bytes(r->p->models_memory, bytes_b, sizeof bytes_b));
      wake_waiters(w);
      continue;
    }
    /* room: unload the least recently used models that no request holds */
    bool room = fits(r, w);
    while (!room) {
      entry *v = NULL;
      for (int i = 0; i < r->n; i++) {
        entry *c = &r->e[i];
        if (c->state == ST_LOADED && c->users == 0 && (!v || c->last_used < v->last_used)) v = c;
      }
      if (!v) break;
      unload(r, v);
      room = fits(r, w);
    }
    if (!room || w->state != ST_WANT) { /* every loaded model is in use: wait for a release */
      if (!room) pthread_cond_wait(&r->cv, &r->mu);
      continue;
    }
    w->state = ST_LOADING;
    w->attempts++;
    char *dir = sm_xstrdup(w->dir), id[256], err[320] = "";
    snprintf(id, sizeof id, "%s", w->id);
    sm_metrics *mt = w->metrics;
    pthread_mutex_unlock(&r->mu);
    sm_served *sv = served_load(r->p, dir, id, mt, r->gpool, false, err, sizeof err);
    free(dir);
    if (!sv) fprintf(stderr, "smelt serve: model '%s': %s\n", id, err);
    pthread_mutex_lock(&r->mu);
    if (sv) {
      sv->index = (int)(w - r->e);
      w->sv = sv;
      w->state = ST_LOADED;
      w->loads++;
      w->created = (long)time(NULL);
      w->last_used = sm_now();
      r->n_loaded++;
      r->mem_loaded += w->bytes;
    } else {
      w->state = ST_FAILED;
      snprintf(w->err, sizeof w->err, "could not load model '%s': %s", id, err);
    }
    wake_waiters(w);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

bool sm_models_start(sm_models *r) {
  if (!r->multi) {
    char err[320];
    entry *e = &r->e[0];
    e->sv = served_load(r->p, e->dir, e->id, e->metrics, r->gpool, true, err, sizeof err);
    if (!e->sv) {
      fprintf(stderr, "smelt serve: %s\n", err);
      return false;
    }
    e->state = ST_LOADED;
    e->created = e->sv->oai.created;
    e->loads = 1;
    r->n_loaded = 1;
    return true;
  }
  char mem[32] = "";
  if (r->p->models_memory) sm_store_fmt_bytes(r->p->models_memory, mem, sizeof mem);
  fprintf(stderr, "smelt serve: %d models, loaded on first use (at most %d at once%s%s)\n", r->n, r->p->models_max,
          mem[0] ? ", in at most " : "", mem);
  for (int i = 0; i < r->n; i++) fprintf(stderr, "smelt serve:   %s  %s\n", r->e[i].id, r->e[i].dir);
  r->loader_started = pthread_create(&r->loader, NULL, loader_main, r) == 0;
  if (!r->loader_started) fprintf(stderr, "smelt serve: could not start the model loader thread\n");
  return r->loader_started;
}

void sm_models_stop(sm_models *r) {
  pthread_mutex_lock(&r->mu);
  r->stopping = true;
  r->refuse = "the server is shutting down";
  pthread_cond_broadcast(&r->cv);
  for (int i = 0; i < r->n; i++) wake_waiters(&r->e[i]);
  pthread_mutex_unlock(&r->mu);
  if (r->loader_started) pthread_join(r->loader, NULL); /* ends after a load in progress */
  r->loader_started = false;
  for (int i = 0; i < r->n; i++) served_stop(r->e[i].sv);
}

void sm_models_free(sm_models *r) {
  if (!r) return;
  if (r->loader_started) sm_models_stop(r);
  for (int i = 0; i < r->n; i++) {
    entry *e = &r->e[i];
    served_free(e->sv);
    sm_metrics_free(e->metrics);
    free(e->dir);
    free(e->waiters);
    free(e->granted);
  }
  free(r->e);
  sm_gpool_free(r->gpool);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

/* ------------------------------------------------------------------ requests */

static entry *find(sm_models *r, const char *name) {
  if (!name || !name[0]) return &r->e[0];
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->e[i].id, name)) return &r->e[i];
  return NULL;
}

sm_acq sm_models_acquire(sm_models *r, const char *name, sm_conns *g, sm_sock *k, int *ticket, sm_served **out,
                         sm_api_error *err) {
  *out = NULL;
  if (!r->multi) {
    *out = r->e[0].sv;
    return SM_ACQ_READY;
  }
  pthread_mutex_lock(&r->mu);
  entry *e = find(r, name), *held = NULL;
  sm_acq a = SM_ACQ_ERROR;
  if (*ticket && unwait_locked(r, k, &held) && held != e) { /* cannot be: the same name */
    if (--held->users == 0) pthread_cond_broadcast(&r->cv);
    held = NULL;
  }
  if (!e) {
    sm_api_error_set(err, 404, "invalid_request_error", "model", "model_not_found",
                     "The model '%.200s' does not exist (GET /v1/models lists the models)", name);
    goto out;
  }
  if (e->state == ST_LOADED) {
    if (!held) e->users++; /* else: counted when the load ended */
    e->last_used = sm_now();
    *out = e->sv;
    a = SM_ACQ_READY;
    goto out;
  }
  if (r->refuse) {
    sm_api_error_set(err, 503, "server_error", NULL, "shutting_down", "%s", r->refuse);
    goto out;
  }
  if (e->state == ST_FAILED && *ticket && e->attempts >= *ticket) {
    sm_api_error_set(err, 500, "server_error", "model", "model_load_failed", "%s", e->err);
    goto out;
  }
  if (*ticket && k->timed_out) {
    sm_api_error_set(err, 503, "server_error", "model", "model_loading",
                     "the model '%s' is not loaded yet after %g s (%s); retry later", e->id, r->p->models_load_timeout,
                     e->state == ST_LOADING ? "loading" : "waiting until a loaded model is no longer in use");
    goto out;
  }
  if (e->n_waiters >= SM_MAX(1, r->p->max_queue)) {
    sm_api_error_set(err, 429, "rate_limit_error", NULL, "queue_full",
                     "too many requests wait for the model '%s' to load; retry later", e->id);
    goto out;
  }
  if (e->state == ST_UNLOADED || e->state == ST_FAILED) {
    e->state = ST_WANT;
    e->want_seq = ++r->want_counter;
    pthread_cond_broadcast(&r->cv);
  } else if (e->state == ST_UNLOADING) {
    e->reload = true;
  }
  /* the load that will end this wait: the one running, else the next */
  *ticket = e->attempts + (e->state == ST_LOADING ? 0 : 1);
  push(&e->waiters, &e->n_waiters, &e->cap_waiters, k);
  sm_conns_park_wait(g, k, sm_now() + r->p->models_load_timeout);
  a = SM_ACQ_WAIT;
out:
  pthread_mutex_unlock(&r->mu);
  return a;
}

void sm_models_unwait(sm_models *r, sm_sock *k) {
  if (!r->multi) return;
  pthread_mutex_lock(&r->mu);
  entry *held;
  if (unwait_locked(r, k, &held) && --held->users == 0) pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

void sm_models_release(sm_models *r, sm_served *sv) {
  if (!r->multi || !sv) return;
  pthread_mutex_lock(&r->mu);
  entry *e = &r->e[sv->index];
  e->last_used = sm_now();
  if (--e->users == 0) pthread_cond_broadcast(&r->cv); /* a load may wait for room */
  pthread_mutex_unlock(&r->mu);
}

char *sm_models_body_name(const char *body, size_t len) {
  cJSON *root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
  char *name = cJSON_IsString(m) ? sm_xstrdup(m->valuestring) : NULL;
  cJSON_Delete(root);
  return name;
}

/* ------------------------------------------------------------------ listing, metrics, state */

/* under mu */
static cJSON *entry_json(const sm_models *r, const entry *e) {
  cJSON *m;
  if (e->state == ST_LOADED) {
    cJSON *list = sm_oai_models(&e->sv->oai);
    m = cJSON_DetachItemFromArray(cJSON_GetObjectItemCaseSensitive(list, "data"), 0);
    cJSON_Delete(list);
  } else {
    m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", e->id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)e->created);
    cJSON_AddStringToObject(m, "owned_by", "smelt");
  }
  if (r->multi) {
    cJSON *st = cJSON_AddObjectToObject(m, "status");
    cJSON_AddStringToObject(st, "value", k_state[e->state]);
    if (e->state == ST_FAILED) cJSON_AddStringToObject(st, "error", e->err);
  }
  return m;
}

cJSON *sm_models_list(sm_models *r) {
  cJSON *out = cJSON_CreateObject();
  cJSON_AddStringToObject(out, "object", "list");
  cJSON *d = cJSON_AddArrayToObject(out, "data");
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n; i++) cJSON_AddItemToArray(d, entry_json(r, &r->e[i]));
  pthread_mutex_unlock(&r->mu);
  return out;
}

cJSON *sm_models_get(sm_models *r, const char *id, sm_api_error *err) {
  pthread_mutex_lock(&r->mu);
  entry *e = NULL;
  for (int i = 0; i < r->n && !e; i++)
    if (!strcmp(r->e[i].id, id)) e = &r->e[i];
  cJSON *m = e ? entry_json(r, e) : NULL;
  pthread_mutex_unlock(&r->mu);
  if (!m)
    sm_api_error_set(err, 404, "invalid_request_error", "model", "model_not_found", "The model '%.200s' does not exist",
                     id);
  return m;
}

void sm_models_metrics(sm_models *r, sm_buf *out) {
  pthread_mutex_lock(&r->mu);
  sm_metrics **ms = sm_xmalloc(sizeof(sm_metrics *) * (size_t)r->n);
  sm_metrics_gauges *gs = sm_xcalloc((size_t)r->n, sizeof *gs);
  const char **names = sm_xmalloc(sizeof(char *) * (size_t)r->n);
  for (int i = 0; i < r->n; i++) {
    entry *e = &r->e[i];
    ms[i] = e->metrics;
    names[i] = e->id;
    if (e->state == ST_LOADED) {
      pthread_mutex_lock(&e->sv->sched.mu);
      sm_sched_gauges(&e->sv->sched, &gs[i]);
      pthread_mutex_unlock(&e->sv->sched.mu);
      if (e->sv->disk) {
        sm_pdisk_stats ds;
        sm_pdisk_get_stats(e->sv->disk, &ds);
        gs[i].disk = true;
        gs[i].disk_hits = ds.hits;
        gs[i].disk_hit_tokens = ds.hit_tokens;
        gs[i].disk_writes = ds.writes;
        gs[i].disk_evictions = ds.evictions;
        gs[i].disk_rejected = ds.rejected;
        gs[i].disk_bytes_written = ds.bytes_written;
        gs[i].disk_bytes_read = ds.bytes_read;
        gs[i].disk_files = ds.files;
        gs[i].disk_bytes = ds.bytes;
        gs[i].disk_limit = ds.limit;
      }
      gs[i].loaded = true;
    }
  }
  sm_metrics_render_models(ms, gs, r->multi ? names : NULL, r->n, out);
  if (r->multi) {
    sm_buf_puts(out, "# HELP smelt_model_loaded Whether the model is loaded (1) or not (0).\n"
                     "# TYPE smelt_model_loaded gauge\n");
    for (int i = 0; i < r->n; i++) {
      sm_buf_puts(out, "smelt_model_loaded{model=\"");
      sm_metrics_label(out, names[i]);
      sm_buf_printf(out, "\"} %d\n", r->e[i].state == ST_LOADED);
    }
    sm_buf_puts(out, "# HELP smelt_model_loads_total Times the model was loaded.\n"
                     "# TYPE smelt_model_loads_total counter\n");
    for (int i = 0; i < r->n; i++) {
      sm_buf_puts(out, "smelt_model_loads_total{model=\"");
      sm_metrics_label(out, names[i]);
      sm_buf_printf(out, "\"} %llu\n", (unsigned long long)r->e[i].loads);
    }
    sm_buf_puts(out, "# HELP smelt_model_unloads_total Times the model was unloaded to make room.\n"
                     "# TYPE smelt_model_unloads_total counter\n");
    for (int i = 0; i < r->n; i++) {
      sm_buf_puts(out, "smelt_model_unloads_total{model=\"");
      sm_metrics_label(out, names[i]);
      sm_buf_printf(out, "\"} %llu\n", (unsigned long long)r->e[i].unloads);
    }
  }
  pthread_mutex_unlock(&r->mu);
  free(ms);
  free(gs);
  free(names);
  /* constrained decoding, shared by the models */
  uint64_t compiled, reused;
  sm_gpool_counts(r->gpool, &compiled, &reused);
  sm_gmask_cache_stats gc = {0};
  if (sm_gpool_masks(r->gpool)) sm_gmask_cache_stats_get(sm_gpool_masks(r->gpool), &gc);
  sm_buf_printf(
    out,
    "# HELP smelt_grammars_compiled_total Grammars compiled (JSON schemas, GBNF, tool calls).\n"
    "# TYPE smelt_grammars_compiled_total counter\n"
    "smelt_grammars_compiled_total %llu\n"
    "# HELP smelt_grammars_reused_total Constrained requests that reused a compiled grammar of the same text.\n"
    "# TYPE smelt_grammars_reused_total counter\n"
    "smelt_grammars_reused_total %llu\n"
    "# HELP smelt_grammar_mask_cache_hits_total Token masks taken from the shared grammar mask cache.\n"
    "# TYPE smelt_grammar_mask_cache_hits_total counter\n"
    "smelt_grammar_mask_cache_hits_total %llu\n"
    "# HELP smelt_grammar_mask_cache_misses_total Token masks built because the cache did not have them.\n"
    "# TYPE smelt_grammar_mask_cache_misses_total counter\n"
    "smelt_grammar_mask_cache_misses_total %llu\n"
    "# HELP smelt_grammar_mask_cache_evictions_total Masks dropped to stay within --grammar-cache.\n"
    "# TYPE smelt_grammar_mask_cache_evictions_total counter\n"
    "smelt_grammar_mask_cache_evictions_total %llu\n"
    "# HELP smelt_grammar_mask_cache_bytes Bytes of the masks kept.\n"
    "# TYPE smelt_grammar_mask_cache_bytes gauge\n"
    "smelt_grammar_mask_cache_bytes %zu\n",
    (unsigned long long)compiled, (unsigned long long)reused, (unsigned long long)gc.hits,
    (unsigned long long)gc.misses, (unsigned long long)gc.evictions, gc.bytes);
}

bool sm_models_idle(sm_models *r) {
  bool idle = true;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n && idle; i++) {
    entry *e = &r->e[i];
    if (e->n_waiters) idle = false;
    if (e->state == ST_LOADED) {
      pthread_mutex_lock(&e->sv->sched.mu);
      idle = idle && sm_sched_idle(&e->sv->sched);
      pthread_mutex_unlock(&e->sv->sched.mu);
    }
  }
  pthread_mutex_unlock(&r->mu);
  return idle;
}

bool sm_models_fatal(sm_models *r, char *msg, size_t n) {
  bool fatal = false;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n && !fatal; i++) {
    entry *e = &r->e[i];
    if (e->state != ST_LOADED) continue;
    pthread_mutex_lock(&e->sv->sched.mu);
    if (e->sv->sched.fatal) {
      fatal = true;
      snprintf(msg, n, "%s", e->sv->sched.fatal_msg);
    }
    pthread_mutex_unlock(&e->sv->sched.mu);
  }
  pthread_mutex_unlock(&r->mu);
  return fatal;
}

void sm_models_fail_all(sm_models *r, int status, const char *msg) {
  pthread_mutex_lock(&r->mu);
  r->refuse = "the server is shutting down";
  for (int i = 0; i < r->n; i++) {
    entry *e = &r->e[i];
    wake_waiters(e); /* they are refused now */
    if (e->state != ST_LOADED) continue;
    pthread_mutex_lock(&e->sv->sched.mu);
    sm_sched_fail_all(&e->sv->sched, status, msg);
    pthread_mutex_unlock(&e->sv->sched.mu);
  }
  pthread_mutex_unlock(&r->mu);
}
