/* Reading a backend's tuning table (tuning.h). This file and the edge (cli, server) are the only
 * places that read the environment. */
#include "backend/tuning.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool sm_tune_dev_build(void) {
#ifdef SMELT_DEV
  return true;
#else
  return false;
#endif
}

int sm_tune_default(const sm_tune_entry *e, int arch) {
  for (size_t i = 0; i < SM_ARRAY_LEN(e->arch) && e->arch[i].arch > 0; i++)
    if (arch >= e->arch[i].arch) return e->arch[i].value;
  return e->def;
}

/* a word of e->names (its index within [min, max]) */
static bool word_value(const sm_tune_entry *e, const char *s, int *v) {
  for (int i = 0; e->names[i]; i++)
    if (!strcmp(e->names[i], s) && i >= e->min && i <= e->max) {
      *v = i;
      return true;
    }
  return false;
}

smelt_status sm_tune_read(const sm_tune_entry *t, size_t n, int arch, void *out) {
  for (size_t i = 0; i < n; i++) {
    const sm_tune_entry *e = &t[i];
    int v = sm_tune_default(e, arch);
    const char *s = getenv(e->name);
    if (s && *s) {
      if ((e->flags & SM_TUNE_DEV) && !sm_tune_dev_build()) {
        fprintf(stderr, "smelt: %s is a developer diagnostic, ignored in this build (cmake -DSMELT_DEV=ON)\n", e->name);
      } else if (!(e->names && word_value(e, s, &v))) {
        char *end = NULL;
        errno = 0;
        long x = strtol(s, &end, 0);
        if (errno || end == s || *end || x < e->min || x > e->max) {
          if (e->names) {
            sm_buf w = SM_BUF_INIT;
            for (int j = 0; e->names[j]; j++) sm_buf_printf(&w, "%s%s", j ? ", " : "", e->names[j]);
            smelt_status st = sm_err(SMELT_ERR_INVALID, "%s=%s: expected one of %s (%s)", e->name, s, sm_buf_str(&w),
                                     e->doc);
            sm_buf_free(&w);
            return st;
          }
          return sm_err(SMELT_ERR_INVALID, "%s=%s: expected an integer in [%d, %d] (%s)", e->name, s, e->min, e->max,
                        e->doc);
        }
        v = (int)x;
      }
    }
    memcpy((char *)out + e->offset, &v, sizeof v);
  }
  return SMELT_OK;
}

static int count_names(const sm_tune_entry *e) {
  int n = 0;
  while (e->names[n]) n++;
  return n;
}

void sm_tune_describe(const sm_tune_entry *t, size_t n, int arch, const void *vals, sm_buf *out) {
  for (size_t i = 0; i < n; i++) {
    int v;
    memcpy(&v, (const char *)vals + t[i].offset, sizeof v);
    if (v == sm_tune_default(&t[i], arch)) continue;
    if (out->n) sm_buf_putc(out, ' ');
    if (t[i].names && v >= 0 && v < count_names(&t[i])) sm_buf_printf(out, "%s=%s", t[i].name, t[i].names[v]);
    else sm_buf_printf(out, "%s=%d", t[i].name, v);
  }
}
