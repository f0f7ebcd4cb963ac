/* smelt run (chat: a REPL on a terminal, else one reply) and smelt generate (raw completion). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/cli.h"
#include "cli/run.h"
#include "model/model.h"
#include "vision/vision.h"

/* the model(s) and a session for them; false on error (printed) */
static bool setup(const char *cmd, run_opts *o, sm_chat *c, char **label, float fallback_temp, int fallback_n) {
  memset(c, 0, sizeof *c);
  c->o = o;
  if (!sm_run_load(cmd, o, &c->m, &c->draft, label)) return false;
  sm_run_gen_defaults(c->m, o, fallback_temp, fallback_n);
  if (sm_session_create(c->m, c->draft, o->draft_n, o->ctx, o->batch, &c->sess)) {
    fprintf(stderr, "smelt %s: %s\n", cmd, smelt_last_error());
    smelt_model_free(c->m);
    smelt_model_free(c->draft);
    free(*label);
    *label = NULL;
    return false;
  }
  return true;
}

static void teardown(sm_chat *c, char *label) {
  if (c->conv.msgs) sm_conv_free(&c->conv);
  sm_session_free(c->sess);
  smelt_model_free(c->m);
  smelt_model_free(c->draft);
  free(label);
}

/* --image files decoded and prepared for the model's vision tower: imgs[0, o->n_images) (references) */
static bool load_images(const char *cmd, const run_opts *o, const smelt_model *m, const char *label, sm_vimage **imgs) {
  if (!m->vision) {
    const char *note = m->note;
    fprintf(stderr, "smelt %s: %s cannot read images: %s\n", cmd, label,
            note && *note ? note : "it is not a vision-language model smelt runs with images");
    return false;
  }
  for (int i = 0; i < o->n_images; i++) {
    sm_image im;
    sm_vimage *v = NULL;
    smelt_status st = sm_image_load(o->images[i], 0, NULL, &im);
    if (!st) {
      st = sm_vimage_new(m->vision, &im, &v);
      if (st) st = sm_err(st, "%s: %s", o->images[i], smelt_last_error());
    }
    sm_image_free(&im);
    if (st) {
      fprintf(stderr, "smelt %s: --image %s\n", cmd, smelt_last_error());
      for (int k = 0; k < i; k++) sm_vimage_unref(imgs[k]);
      return false;
    }
    imgs[i] = v;
  }
  return true;
}

/* run: the images go with the first message */
static bool add_images(const run_opts *o, sm_chat *c, const char *label) {
  sm_vimage *imgs[SM_RUN_MAX_IMAGES];
  if (!load_images("run", o, c->m, label, imgs)) return false;
  for (int i = 0; i < o->n_images; i++) {
    sm_conv_add_image(&c->conv, c->m->vision, imgs[i]);
    sm_vimage_unref(imgs[i]);
  }
  return true;
}

int sm_cmd_generate(int argc, char **argv) {
  run_opts o;
  int r = sm_run_parse("generate", argc, argv, &o);
  if (r) return r == 1 ? 0 : r;
  char *prompt = NULL;
  if (!sm_run_prompt("generate", &o, true, &prompt)) return 1;
  if (!prompt || !*prompt) {
    fprintf(stderr, "smelt generate: no prompt: give PROMPT, -p TEXT, -f FILE or pipe it to stdin\n");
    free(prompt);
    return 2;
  }
  sm_chat c;
  char *label = NULL;
  if (!setup("generate", &o, &c, &label, 0.0f, 256)) {
    free(prompt);
    return 1;
  }
  sm_vimage *imgs[SM_RUN_MAX_IMAGES];
  if (o.n_images && !load_images("generate", &o, c.m, label, imgs)) {
    free(prompt);
    teardown(&c, label);
    return 1;
  }
  int rc = sm_generate_text(&c, prompt, imgs, o.n_images);
  for (int i = 0; i < o.n_images; i++) sm_vimage_unref(imgs[i]);
  free(prompt);
  teardown(&c, label);
  return rc;
}

int sm_cmd_run(int argc, char **argv) {
  run_opts o;
  int r = sm_run_parse("run", argc, argv, &o);
  if (r) return r == 1 ? 0 : r;
  char *prompt = NULL;
  if (!sm_run_prompt("run", &o, true, &prompt)) return 1;
  const bool repl = !prompt && isatty(0);
  if (!repl && (!prompt || !*prompt)) {
    if (prompt) fprintf(stderr, "smelt run: the prompt is empty\n");
    else
      fprintf(stderr,
              "smelt run: no prompt: stdin is empty (give PROMPT, -p TEXT or -f FILE, or run it on a terminal)\n");
    free(prompt);
    return 2;
  }
  sm_chat c;
  char *label = NULL;
  if (!setup("run", &o, &c, &label, 0.7f, -1)) {
    free(prompt);
    return 1;
  }
  if (!sm_conv_init(&c.conv, c.m->tok, o.chat_template, o.raw, "run")) {
    free(prompt);
    teardown(&c, label);
    return 2;
  }
  sm_conv_set_system(&c.conv, o.system);
  if (o.n_images && !add_images(&o, &c, label)) {
    free(prompt);
    teardown(&c, label);
    return 1;
  }
  int rc;
  if (repl) {
    c.interactive = true;
    rc = sm_repl(&c, label);
  } else {
    sm_conv_add(&c.conv, "user", prompt);
    rc = sm_chat_turn(&c);
  }
  free(prompt);
  teardown(&c, label);
  return rc;
}
