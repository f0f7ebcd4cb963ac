#include "format/st_write.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *name;
  sm_dtype dt;
  int ndim;
  int64_t shape[SM_ST_MAX_DIMS];
  void *data;
  size_t nbytes;
  void (*fill)(void *, void *, size_t, const char *);
  void *user;
} stw_entry;

struct sm_st_writer {
  stw_entry *e;
  int n, cap;
};

sm_st_writer *sm_stw_new(void) { return sm_xcalloc(1, sizeof(sm_st_writer)); }

void sm_stw_add(sm_st_writer *w, const char *name, sm_dtype dt, int ndim, const int64_t *shape, const void *data,
                void (*fill)(void *, void *, size_t, const char *), void *user) {
  if (w->n == w->cap) {
    w->cap = w->cap * 2 + 16;
    w->e = sm_xrealloc(w->e, sizeof(stw_entry) * (size_t)w->cap);
  }
  stw_entry *t = &w->e[w->n++];
  memset(t, 0, sizeof *t);
  t->name = sm_xstrdup(name);
  t->dt = dt;
  t->ndim = ndim;
  size_t n = sm_dtype_size(dt);
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    n *= (size_t)shape[i];
  }
  t->nbytes = n;
  if (fill) {
    t->fill = fill;
    t->user = user;
  } else {
    t->data = sm_xmalloc(n);
    memcpy(t->data, data, n);
  }
}

smelt_status sm_stw_write(sm_st_writer *w, const char *path) {
  cJSON *h = cJSON_CreateObject();
  size_t off = 0;
  for (int i = 0; i < w->n; i++) {
    stw_entry *t = &w->e[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "dtype", sm_dtype_name(t->dt));
    cJSON *sh = cJSON_AddArrayToObject(o, "shape");
    for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
    cJSON *of = cJSON_AddArrayToObject(o, "data_offsets");
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + t->nbytes)));
    off += t->nbytes;
    cJSON_AddItemToObject(h, t->name, o);
  }
  char *js = cJSON_PrintUnformatted(h);
  cJSON_Delete(h);
  size_t hl = strlen(js), pad = (8 - hl % 8) % 8;
  char *tmp = sm_xmalloc(strlen(path) + 8);
  sprintf(tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    free(js);
    free(tmp);
    return sm_err(SMELT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  }
  uint64_t hlen = hl + pad;
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hlen >> (8 * i));
  bool ok = fwrite(le, 1, 8, f) == 8 && fwrite(js, 1, hl, f) == hl && fwrite("        ", 1, pad, f) == pad;
  free(js);
  for (int i = 0; ok && i < w->n; i++) {
    stw_entry *t = &w->e[i];
    if (t->data) ok = fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
    else {
      size_t chunk = 64u << 20;
      void *buf = sm_xmalloc(SM_MIN(chunk, t->nbytes ? t->nbytes : 1));
      for (size_t o = 0; ok && o < t->nbytes; o += chunk) {
        size_t c = SM_MIN(chunk, t->nbytes - o);
        t->fill(t->user, buf, c, t->name);
        ok = fwrite(buf, 1, c, f) == c;
      }
      free(buf);
    }
  }
  if (fclose(f) != 0) ok = false;
  if (!ok || rename(tmp, path) != 0) {
    remove(tmp);
    free(tmp);
    return sm_err(SMELT_ERR_IO, "error writing %s", path);
  }
  free(tmp);
  return SMELT_OK;
}

void sm_stw_free(sm_st_writer *w) {
  if (!w) return;
  for (int i = 0; i < w->n; i++) {
    free(w->e[i].name);
    free(w->e[i].data);
  }
  free(w->e);
  free(w);
}
