/* Shared by smelt run / generate: their options (run_args.c), loading the models (run_args.c),
 * the conversation (conv.c), one chat turn with its context policy and prompt cache (chat.c),
 * the REPL (repl.c), Ctrl+C (interrupt.c) and terminal progress bars (progress.c). */
#ifndef SM_CLI_RUN_H
#define SM_CLI_RUN_H
#include <cjson/cJSON.h>
#include <signal.h>
#include "engine/prompt_cache.h"
#include "engine/session.h"
#include "tokenizer/chat.h"

/* ---- options (run_args.c) ---- */
#define SM_RUN_MAX_IMAGES 16
enum { SM_OVERFLOW_DROP = 0, SM_OVERFLOW_ERROR = 1 };
typedef struct {
  const char *model, *prompt, *file, *system, *draft, *chat_template, *prompt_cache, *history;
  const char *cpu_mask; /* --cpu-mask */
  int n_predict, threads, ctx, draft_n, batch, ngl, overflow, numa, poll, tp, pp, nnodes, node_rank;
  const char *master_addr; /* --master-addr */
  smelt_device device;
  smelt_kv_type kv_k, kv_v; /* -ctk / -ctv (--kv-type sets both): one type in smelt */
  bool device_set, ngl_set, no_stats, raw, estimate, force, ignore_eos, no_mmap, force_ctx, prompt_cache_ro,
    deterministic;
  bool temp_set, top_p_set, top_k_set, n_predict_set, rep_set, kv_k_set, kv_v_set, poll_set;
  smelt_sampling s;
  const char *images[SM_RUN_MAX_IMAGES]; /* --image FILE (run: with the first message) */
  int n_images;
} run_opts;

/* Options of `smelt cmd` (run or generate) into o. Returns 0, 1 (help printed) or 2 (error printed). */
int sm_run_parse(const char *cmd, int argc, char **argv, run_opts *o);
/* Resolve (built-in names, directories, the store, the hub) and load the model and the draft
 * model; checks -c against the model's trained context and applies -ngl. Messages on stderr;
 * false on failure. *label: how to name the model to the user (malloc'd). */
bool sm_run_load(const char *cmd, const run_opts *o, smelt_model **m, smelt_model **draft, char **label);
/* Defaults from generation_config.json where the user gave none: sampling, and -n from its
 * max_new_tokens (else fallback_n). */
void sm_run_gen_defaults(const smelt_model *m, run_opts *o, float fallback_temp, int fallback_n);
/* The prompt from -p, a positional argument, -f FILE (- = stdin) or, when stdin is not a terminal,
 * all of stdin; NULL when none (run: the REPL). malloc'd. false on error (printed). */
bool sm_run_prompt(const char *cmd, const run_opts *o, bool read_stdin, char **out);

/* ---- the conversation (conv.c) ---- */
struct sm_vision;
struct sm_vimage;
struct sm_mm_span;
typedef struct {
  cJSON *msgs; /* [{role, content}], a system message first when there is one */
  const smelt_tokenizer *tok;
  sm_jinja *tpl; /* --chat-template; NULL: the tokenizer's own */
  bool raw;      /* no template: the messages' text one after another */
  /* images: content parts {"type": "image", "smelt_image": k} of user messages refer to imgs[k] */
  const struct sm_vision *vision;
  struct sm_vimage **imgs;
  int n_imgs, n_pending; /* the last n_pending images go with the next user message */
} sm_conv;
/* template_arg: NULL, a file, a template name of the tokenizer ("tool_use"), "chatml" or "raw". */
bool sm_conv_init(sm_conv *c, const smelt_tokenizer *tok, const char *template_arg, bool raw, const char *cmd);
void sm_conv_free(sm_conv *c);
void sm_conv_set_system(sm_conv *c, const char *text); /* NULL or "": none */
const char *sm_conv_system(const sm_conv *c);          /* NULL when none */
void sm_conv_add(sm_conv *c, const char *role, const char *content);
bool sm_conv_pop(sm_conv *c, const char *role);               /* remove the last message if it has this role */
const char *sm_conv_last(const sm_conv *c, const char *role); /* content of the last message, if of role */
void sm_conv_clear(sm_conv *c);                               /* all but the system message */
int sm_conv_count(const sm_conv *c);                          /* messages, the system one not counted */
bool sm_conv_drop_oldest(sm_conv *c);                         /* the oldest turn (never the last user message) */
smelt_status sm_conv_tokens(const sm_conv *c, int32_t **ids, int *n); /* rendered with the reply prompt */
/* Images for the next user message (the conversation takes a reference; vision: the model's tower). */
void sm_conv_add_image(sm_conv *c, const struct sm_vision *vision, struct sm_vimage *img);
/* sm_conv_tokens with the images of the messages: *spans (malloc'd, references) locate them. */
smelt_status sm_conv_tokens_mm(const sm_conv *c, int32_t **ids, int *n, struct sm_mm_span **spans, int *n_spans);
smelt_status sm_conv_save(const sm_conv *c, const char *path);
smelt_status sm_conv_load(sm_conv *c, const char *path);

/* ---- a chat turn (chat.c) ---- */
typedef struct {
  smelt_model *m, *draft;
  sm_session *sess;
  sm_conv conv;
  run_opts *o;
  bool interactive; /* REPL: notices as one-liners, Ctrl+C stops a reply */
  bool cache_tried; /* the prompt cache was considered (first turn only) */
  bool cache_save;  /* write the prompt cache after this turn */
} sm_chat;
/* Generate the reply to the conversation (its last message is the user's) and append it; the
 * reply streams to stdout, notices and stats to stderr. Fits the context first (drops the oldest
 * turns, or fails with --context-overflow error). 0 ok, 1 error (printed; the user message
 * removed again in interactive mode). */
int sm_chat_turn(sm_chat *c);
/* generate: raw text completion of prompt with the same session machinery; n_img images (references
 * kept by the caller) where the prompt holds the vision tower's marker, or before the text. */
int sm_generate_text(sm_chat *c, const char *prompt, struct sm_vimage *const *imgs, int n_img);
/* Open --prompt-cache for ids and restore its matching prefix into the session; save the
 * prompt's KV after the call when the file did not hold it. Used by chat.c. */
bool sm_chat_cache_before(sm_chat *c, const int32_t *ids, int n, const char *cmd);
void sm_chat_cache_after(sm_chat *c, int n, const char *cmd);

/* ---- the REPL (repl.c) ---- */
int sm_repl(sm_chat *c, const char *label);

/* ---- Ctrl+C (interrupt.c) ---- */
void sm_interrupt_install(void); /* SIGINT sets a flag instead of ending the process */
void sm_interrupt_restore(void);
bool sm_interrupted(void);
void sm_interrupt_clear(void);
bool sm_interrupt_cb(void *ud); /* for sm_session_opts.cancelled */

/* ---- progress bars on a terminal (progress.c) ---- */
typedef struct {
  bool on, drawn;
  double t0, last;
  const char *label;
} sm_progress;
/* Shown only when stderr is a terminal and enable is set. */
void sm_progress_start(sm_progress *p, const char *label, bool enable);
void sm_progress_update(sm_progress *p, long done, long total);
void sm_progress_end(sm_progress *p);                /* erases the bar */
void sm_progress_cb(void *p, long done, long total); /* sm_progress_update for callbacks */

#endif
