/* The grammar masks of the scheduler's constrained choices (see sched_masks.h). */
#include "server/sched_masks.h"
#include <stdlib.h>
#include <string.h>

struct sm_step_masks {
  sm_sched *s;
  sm_choice **ch;
  sm_grammar_state **gs;
  uint32_t **mask;
  int *count;
  sm_choice *const *set_ch; /* sm_step_masks_set */
  int set_n;
};

/* A constrained choice's mask for its next token, from what the grammar allows (count tokens).
 * When nothing may follow, only the end-of-sequence tokens are allowed; a model without one gets
 * a mask that allows every token (a mask that allows none is an error of the sample op): the
 * grammar refuses the token, which ends the choice without its text. */
static void mask_done(sm_sched *s, sm_choice *c, int count) {
  if (count == 0) {
    for (int i = 0; i < s->n_eos; i++) sm_mask_set(c->mask, s->eos[i]);
    if (!s->n_eos) memset(c->mask, 0xff, sizeof(uint32_t) * (size_t)((s->vocab + 31) / 32));
  }
  c->mask_ok = true;
}

void sm_choice_ensure_mask(sm_sched *s, sm_choice *c) {
  if (!c->gs || c->mask_ok) return;
  mask_done(s, c, sm_grammar_mask(c->gs, c->mask));
}

sm_step_masks *sm_step_masks_new(sm_sched *s, int cap) {
  sm_step_masks *m = sm_xcalloc(1, sizeof *m);
  m->s = s;
  m->ch = sm_xmalloc(sizeof(sm_choice *) * (size_t)cap);
  m->gs = sm_xmalloc(sizeof(sm_grammar_state *) * (size_t)cap);
  m->mask = sm_xmalloc(sizeof(uint32_t *) * (size_t)cap);
  m->count = sm_xmalloc(sizeof(int) * (size_t)cap);
  return m;
}

void sm_step_masks_free(sm_step_masks *m) {
  if (!m) return;
  free(m->ch);
  free(m->gs);
  free(m->mask);
  free(m->count);
  free(m);
}

void sm_step_masks_build(sm_step_masks *m, sm_choice *const *ch, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (ch[i]->gs && !ch[i]->mask_ok) {
      m->ch[k] = ch[i];
      m->gs[k] = ch[i]->gs;
      m->mask[k] = ch[i]->mask;
      k++;
    }
  sm_grammar_mask_many(m->gs, m->mask, m->count, k, m->s->mpool);
  for (int i = 0; i < k; i++) mask_done(m->s, m->ch[i], m->count[i]);
}

void sm_step_masks_set(sm_step_masks *m, sm_choice *const *ch, int n) {
  m->set_ch = ch;
  m->set_n = n;
}

void sm_step_masks_run(void *arg) {
  sm_step_masks *m = arg;
  sm_step_masks_build(m, m->set_ch, m->set_n);
}
