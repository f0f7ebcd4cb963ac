/* The smelt run REPL: a banner, line editing and history (libedit), multi-line input, slash
 * commands, and Ctrl+C that stops a reply and returns to the prompt. */
#include <editline/readline.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base/strbuf.h"
#include "cli/run.h"

static const char k_help[] =
  "Commands:\n"
  "  /help              this list\n"
  "  /clear             forget the conversation (the system prompt stays)\n"
  "  /system [TEXT]     show the system prompt, or set it to TEXT (/system - removes it)\n"
  "  /save FILE         write the conversation to FILE (JSON: {\"messages\": [...]})\n"
  "  /load FILE         read a conversation written by /save (or an array of messages)\n"
  "  /regenerate        answer the last message again\n"
  "  /exit              quit (also /quit, /bye, Ctrl+D)\n"
  "Input: \"\"\" starts and ends a multi-line message; a line ending in \\ continues on the next;\n"
  "  //text sends /text. Ctrl+C stops a reply (or clears the line); Up/Down browse the history.\n";

static char *history_path(const run_opts *o) {
  if (o->history) return o->history[0] ? sm_xstrdup(o->history) : NULL;
  const char *c = getenv("SMELT_CACHE_DIR"), *home = getenv("HOME");
  sm_buf b = SM_BUF_INIT;
  if (c && *c) sm_buf_puts(&b, c);
  else if (home && *home) sm_buf_printf(&b, "%s/.cache/smelt", home);
  else return NULL;
  /* the folders may not exist yet (mkdir -p); a failure shows when the history is written */
  for (char *p = b.p + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(b.p, 0755);
      *p = '/';
    }
  mkdir(b.p, 0755);
  sm_buf_puts(&b, "/history");
  return sm_buf_take(&b);
}

static void banner(sm_chat *c, const char *label) {
  smelt_model_info info;
  smelt_model_get_info(c->m, &info);
  double tps = 0;
  sm_session_measure_decode(c->sess, 4, &tps);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  char dev[64];
  if (!strcmp(info.backend, "cpu"))
    snprintf(dev, sizeof dev, "cpu, %d threads", c->o->threads ? c->o->threads : (int)cores);
  else snprintf(dev, sizeof dev, "%s", info.backend);
  fprintf(stderr, "smelt %s | %s: %s, %d layers, %.1f MiB | %s | context %d tokens (%s KV) | decode ~%.0f tok/s\n",
          SMELT_VERSION, label, info.arch, info.n_layers, info.weight_bytes / 1048576.0, dev,
          sm_session_context(c->sess), smelt_kv_type_name(info.kv_type), tps);
  if (c->draft) fprintf(stderr, "draft model: %d tokens proposed per step\n", c->o->draft_n);
  if (c->conv.raw) fprintf(stderr, "no chat template: messages are plain text the model continues\n");
  fprintf(stderr, "/help lists the commands; \"\"\" starts multi-line input; Ctrl+C stops a reply, Ctrl+D quits.\n");
}

/* One line from libedit; NULL at end of input. *intr: Ctrl+C at the prompt. */
static char *get_line(const char *prompt, bool *intr) {
  *intr = false;
  sm_interrupt_clear();
  errno = 0;
  char *l = readline(prompt);
  if (sm_interrupted()) {
    sm_interrupt_clear();
    free(l);
    *intr = true;
    fputc('\n', stderr);
    return NULL;
  }
  return l;
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

/* A whole message: one line, or several (""" ... """ or lines ending in \). NULL at the end of
 * input; *intr when Ctrl+C abandoned it. */
static char *read_message(bool *intr) {
  char *l = get_line(">>> ", intr);
  if (!l) return NULL;
  sm_buf b = SM_BUF_INIT;
  if (!strncmp(l, "\"\"\"", 3)) {
    const char *rest = l + 3;
    if (*rest && ends_with(rest, "\"\"\"")) { /* """one line""" */
      sm_buf_put(&b, rest, strlen(rest) - 3);
      free(l);
      return sm_buf_take(&b);
    }
    sm_buf_puts(&b, rest);
    bool first = !*rest;
    free(l);
    for (;;) {
      if (!(l = get_line("... ", intr))) {
        sm_buf_free(&b);
        return NULL;
      }
      bool end = ends_with(l, "\"\"\"");
      if (end) l[strlen(l) - 3] = 0;
      if (!first || *l || !end) {
        if (!first) sm_buf_putc(&b, '\n');
        sm_buf_puts(&b, l);
        first = false;
      }
      free(l);
      if (end) return sm_buf_take(&b);
    }
  }
  while (ends_with(l, "\\")) {
    l[strlen(l) - 1] = 0;
    sm_buf_puts(&b, l);
    sm_buf_putc(&b, '\n');
    free(l);
    if (!(l = get_line("... ", intr))) {
      sm_buf_free(&b);
      return NULL;
    }
  }
  sm_buf_puts(&b, l);
  free(l);
  return sm_buf_take(&b);
}

/* 1: quit, 0: handled, 2: generate (regenerate) */
static int command(sm_chat *c, const char *line) {
  char name[32];
  size_t k = strcspn(line, " \t");
  snprintf(name, sizeof name, "%.*s", (int)(k < sizeof name - 1 ? k : sizeof name - 1), line);
  const char *arg = line + k;
  while (*arg == ' ' || *arg == '\t') arg++;
  if (!strcmp(name, "/exit") || !strcmp(name, "/quit") || !strcmp(name, "/bye")) return 1;
  if (!strcmp(name, "/help") || !strcmp(name, "/?")) {
    fputs(k_help, stderr);
    return 0;
  }
  if (!strcmp(name, "/clear")) {
    sm_conv_clear(&c->conv);
    fprintf(stderr, "[conversation cleared]\n");
    return 0;
  }
  if (!strcmp(name, "/system")) {
    if (!*arg) fprintf(stderr, "[system prompt: %s]\n", sm_conv_system(&c->conv) ? sm_conv_system(&c->conv) : "(none)");
    else if (!strcmp(arg, "-")) {
      sm_conv_set_system(&c->conv, NULL);
      fprintf(stderr, "[system prompt removed]\n");
    } else {
      sm_conv_set_system(&c->conv, arg);
      fprintf(stderr, "[system prompt set]\n");
    }
    return 0;
  }
  if (!strcmp(name, "/save") || !strcmp(name, "/load")) {
    if (!*arg) {
      fprintf(stderr, "%s needs a file name\n", name);
      return 0;
    }
    bool save = name[1] == 's';
    smelt_status st = save ? sm_conv_save(&c->conv, arg) : sm_conv_load(&c->conv, arg);
    if (st) fprintf(stderr, "%s: %s\n", name, smelt_last_error());
    else if (save) fprintf(stderr, "[saved %d messages to %s]\n", sm_conv_count(&c->conv), arg);
    else
      fprintf(stderr, "[loaded %d messages from %s%s]\n", sm_conv_count(&c->conv), arg,
              sm_conv_system(&c->conv) ? ", with a system prompt" : "");
    return 0;
  }
  if (!strcmp(name, "/regenerate") || !strcmp(name, "/regen")) {
    if (sm_conv_last(&c->conv, "assistant")) sm_conv_pop(&c->conv, "assistant");
    if (!sm_conv_last(&c->conv, "user")) {
      fprintf(stderr, "nothing to regenerate\n");
      return 0;
    }
    return 2;
  }
  fprintf(stderr, "unknown command %s; /help lists the commands (//text sends /text)\n", name);
  return 0;
}

int sm_repl(sm_chat *c, const char *label) {
  banner(c, label);
  char *hist = history_path(c->o);
  rl_readline_name = "smelt";
  rl_outstream = stderr; /* prompts and echo with the notices: stdout carries only the replies */
  using_history();
  stifle_history(1000);
  if (hist) read_history(hist);
  sm_interrupt_install();
  int rc = 0;
  for (;;) {
    bool intr = false;
    char *msg = read_message(&intr);
    if (!msg) {
      if (intr) continue;
      fputc('\n', stderr); /* Ctrl+D: end the prompt's line */
      break;
    }
    if (!msg[0]) {
      free(msg);
      continue;
    }
    add_history(msg);
    int what = 0;
    if (msg[0] == '/' && msg[1] != '/') {
      what = command(c, msg);
      if (what == 1) {
        free(msg);
        break;
      }
    } else {
      sm_conv_add(&c->conv, "user", msg[0] == '/' ? msg + 1 : msg);
      what = 2;
    }
    free(msg);
    if (what == 2) {
      sm_interrupt_clear();
      sm_chat_turn(c);
      sm_interrupt_clear();
    }
  }
  sm_interrupt_restore();
  if (hist && write_history(hist) != 0 && errno)
    fprintf(stderr, "smelt run: note: cannot write the history %s: %s\n", hist, strerror(errno));
  free(hist);
  return rc;
}
