/* Model store: reference resolution, HF cache lookup, listing, removal. */
#include "store/store.h"
#include "model/family.h"
#include "store/store_internal.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- settings ---- */
static sm_store_settings g_set = {.pull_retries = -1}; /* strings owned (malloc'd) */

void sm_store_settings_default(sm_store_settings *s) {
  memset(s, 0, sizeof *s);
  s->pull_retries = -1;
}

static const char *own(const char *s) { return s && *s ? sm_xstrdup(s) : NULL; }

void sm_store_configure(const sm_store_settings *s) {
  sm_store_settings d;
  if (!s) {
    sm_store_settings_default(&d);
    s = &d;
  }
  const char **old[] = {&g_set.home,         &g_set.cache_dir,   &g_set.hf_home,
                        &g_set.hf_hub_cache, &g_set.default_org, &g_set.default_model,
                        &g_set.hf_endpoint,  &g_set.hf_token,    &g_set.available_memory};
  for (size_t i = 0; i < SM_ARRAY_LEN(old); i++) free((char *)*old[i]);
  g_set.home = own(s->home);
  g_set.cache_dir = own(s->cache_dir);
  g_set.hf_home = own(s->hf_home);
  g_set.hf_hub_cache = own(s->hf_hub_cache);
  g_set.default_org = own(s->default_org);
  g_set.default_model = own(s->default_model);
  g_set.hf_endpoint = own(s->hf_endpoint);
  g_set.hf_token = own(s->hf_token);
  g_set.available_memory = own(s->available_memory);
  g_set.pull_retries = s->pull_retries;
}

const sm_store_settings *sm_store_settings_get(void) { return &g_set; }

/* ---- paths ---- */
char *sm_store_home_join(const char *rel) { return sm_path_join(g_set.home ? g_set.home : "/tmp", rel); }

char *sm_store_root(void) {
  if (g_set.cache_dir) return sm_path_join(g_set.cache_dir, "models");
  return sm_store_home_join(".cache/smelt/models");
}

char *sm_store_hf_cache(void) {
  if (g_set.hf_hub_cache) return sm_xstrdup(g_set.hf_hub_cache);
  if (g_set.hf_home) return sm_path_join(g_set.hf_home, "hub");
  return sm_store_home_join(".cache/huggingface/hub");
}

static bool valid_part(const char *s, size_t n) {
  if (n == 0 || n > 200) return false;
  if (s[0] == '.') return false; /* ".", "..", hidden */
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
          c == '.'))
      return false;
  }
  return true;
}

smelt_status sm_store_parse_ref(const char *ref, char **owner, char **name) {
  if (!ref || !*ref) return sm_err(SMELT_ERR_INVALID, "empty model name");
  const char *slash = strchr(ref, '/');
  const char *o, *n;
  size_t on, nn;
  char *deforg = NULL;
  if (!slash) {
    deforg = sm_xstrdup(g_set.default_org ? g_set.default_org : "mlx-community");
    o = deforg;
    on = strlen(o);
    n = ref;
    nn = strlen(ref);
  } else {
    o = ref;
    on = (size_t)(slash - ref);
    n = slash + 1;
    nn = strlen(n);
    if (strchr(n, '/')) return sm_err(SMELT_ERR_INVALID, "bad model name '%s': expected owner/name", ref);
  }
  if (!valid_part(o, on) || !valid_part(n, nn)) {
    free(deforg);
    return sm_err(SMELT_ERR_INVALID, "bad model name '%s': expected [owner/]name of letters, digits, '-', '_', '.'",
                  ref);
  }
  *owner = sm_xmalloc(on + 1);
  memcpy(*owner, o, on);
  (*owner)[on] = 0;
  *name = sm_xmalloc(nn + 1);
  memcpy(*name, n, nn);
  (*name)[nn] = 0;
  free(deforg);
  return SMELT_OK;
}


static bool has_config(const char *dir) {
  char *c = sm_path_join(dir, "config.json");
  bool ok = sm_file_exists(c);
  free(c);
  return ok;
}

char *sm_store_hf_snapshot(const char *owner, const char *name) {
  char *cache = sm_store_hf_cache();
  size_t len = strlen(owner) + strlen(name) + 16;
  char *rel = sm_xmalloc(len);
  snprintf(rel, len, "models--%s--%s", owner, name);
  char *repo = sm_path_join(cache, rel);
  free(rel);
  free(cache);
  char *snaps = sm_path_join(repo, "snapshots");
  char *result = NULL;
  /* refs/main names the snapshot to use */
  char *refp = sm_path_join(repo, "refs/main");
  char *rev = NULL;
  if (sm_read_file(refp, &rev, NULL) == SMELT_OK) {
    size_t l = strlen(rev);
    while (l && (rev[l - 1] == '\n' || rev[l - 1] == '\r' || rev[l - 1] == ' ')) rev[--l] = 0;
    if (valid_part(rev, l)) {
      char *d = sm_path_join(snaps, rev);
      if (has_config(d)) result = d;
      else free(d);
    }
    free(rev);
  }
  sm_err_clear();
  free(refp);
  if (!result) { /* otherwise the newest snapshot that looks like a model */
    DIR *dd = opendir(snaps);
    time_t best = 0;
    if (dd) {
      struct dirent *e;
      while ((e = readdir(dd))) {
        if (e->d_name[0] == '.') continue;
        char *d = sm_path_join(snaps, e->d_name);
        struct stat st;
        if (has_config(d) && stat(d, &st) == 0 && (!result || st.st_mtime > best)) {
          free(result);
          result = d;
          best = st.st_mtime;
        } else free(d);
      }
      closedir(dd);
    }
  }
  free(snaps);
  free(repo);
  return result;
}

/* ---- default model ---- */
/* the folder of the built-in models: next to the binary (share/smelt/models of its prefix), the
 * configured install prefix, then the source tree */
char *sm_store_builtin_dir(void) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *sl = strrchr(exe, '/');
    if (sl) {
      *sl = 0;
      char *d = sm_path_join(exe, "../share/smelt/models"), *t = sm_path_join(d, "smelt-tiny");
      bool ok = has_config(t);
      free(t);
      char real[PATH_MAX];
      if (ok && realpath(d, real)) {
        free(d);
        return sm_xstrdup(real);
      }
      free(d);
    }
  }
  static const char *const dirs[] = {
#ifdef SMELT_INSTALL_MODELS_DIR
    SMELT_INSTALL_MODELS_DIR,
#endif
#ifdef SMELT_SOURCE_MODELS_DIR
    SMELT_SOURCE_MODELS_DIR,
#endif
    NULL};
  for (int i = 0; dirs[i]; i++) {
    char *t = sm_path_join(dirs[i], "smelt-tiny");
    bool ok = has_config(t);
    free(t);
    if (ok) return sm_xstrdup(dirs[i]);
  }
  return NULL;
}

char *sm_store_builtin(const char *name) {
  if (!name) return NULL;
  if (!strncmp(name, "models/", 7)) name += 7;
  if (!valid_part(name, strlen(name))) return NULL;
  char *root = sm_store_builtin_dir();
  if (!root) return NULL;
  char *d = sm_path_join(root, name);
  free(root);
  if (sm_dir_exists(d) && has_config(d)) return d;
  free(d);
  return NULL;
}

char *sm_store_default_model(void) {
  const char *e = g_set.default_model;
  if (e) return sm_dir_exists(e) ? sm_xstrdup(e) : NULL;
  return sm_store_builtin("smelt-tiny");
}

/* ---- resolution ---- */
static bool looks_like_path(const char *ref) {
  if (ref[0] == '/' || ref[0] == '.' || ref[0] == '~') return true;
  const char *s = strchr(ref, '/');
  return s && strchr(s + 1, '/'); /* a/b/c */
}

smelt_status sm_store_resolve(const char *ref, bool allow_download, char **dir) {
  *dir = NULL;
  if (!ref || !*ref) {
    char *d = sm_store_default_model();
    if (!d)
      return sm_err(SMELT_ERR_NOT_FOUND, "no model given and the default model (smelt-tiny) is not installed; "
                                         "pass -m MODEL or set SMELT_DEFAULT_MODEL");
    *dir = d;
    return SMELT_OK;
  }
  if (sm_dir_exists(ref)) {
    *dir = sm_xstrdup(ref);
    return SMELT_OK;
  }
  if (ref[0] == '~' && ref[1] == '/') {
    char *p = sm_store_home_join(ref + 2);
    if (sm_dir_exists(p)) {
      *dir = p;
      return SMELT_OK;
    }
    free(p);
  }
  /* a built-in model's name never goes to the hub */
  char *bi = looks_like_path(ref) ? NULL : sm_store_builtin(ref);
  if (bi) {
    *dir = bi;
    return SMELT_OK;
  }
  if (looks_like_path(ref) || sm_file_exists(ref))
    return sm_err(SMELT_ERR_NOT_FOUND, "model directory '%s' does not exist", ref);
  char *owner, *name;
  smelt_status s = sm_store_parse_ref(ref, &owner, &name);
  if (s) return s;
  char *root = sm_store_root();
  char *od = sm_path_join(root, owner);
  char *d = sm_path_join(od, name);
  free(od);
  free(root);
  if (has_config(d)) {
    *dir = d;
    free(owner);
    free(name);
    return SMELT_OK;
  }
  free(d);
  d = sm_store_hf_snapshot(owner, name);
  if (d) {
    *dir = d;
    free(owner);
    free(name);
    return SMELT_OK;
  }
  if (allow_download) {
    size_t l = strlen(owner) + strlen(name) + 2;
    char *full = sm_xmalloc(l);
    snprintf(full, l, "%s/%s", owner, name);
    s = sm_store_pull(full, true, dir);
    free(full);
  } else {
    s = sm_err(SMELT_ERR_NOT_FOUND,
               "model %s/%s not found in the store or the Hugging Face cache; "
               "run `smelt pull %s/%s`",
               owner, name, owner, name);
  }
  free(owner);
  free(name);
  return s;
}

/* ---- sizes and listing ---- */
static _Thread_local uint64_t g_du;
static _Thread_local const char *g_du_root; /* resolved; symlinks count only when they stay inside */

static bool inside(const char *path, const char *root) {
  size_t n = strlen(root);
  return !strncmp(path, root, n) && (path[n] == '/' || path[n] == 0);
}

static int du_cb(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)f;
  if (flag == FTW_F) g_du += (uint64_t)st->st_size;
  else if (flag == FTW_SL) { /* the HF cache's snapshot files link into the repo's blobs/ */ char real[PATH_MAX];
    struct stat ts;
    if (realpath(p, real) && inside(real, g_du_root) && stat(real, &ts) == 0 && S_ISREG(ts.st_mode))
      g_du += (uint64_t)ts.st_size;
  }
  return 0;
}

uint64_t sm_store_dir_size(const char *dir) {
  /* the walk stays on this tree (FTW_PHYS: symlinked directories are not entered); a symlinked
   * file counts when it resolves inside the model's own tree: the directory itself, or for a
   * HF cache snapshot (.../models--o--n/snapshots/rev) the repo folder with its blobs/ */
  char root[PATH_MAX];
  if (!realpath(dir, root)) return 0;
  char *snap = strstr(root, "/snapshots/");
  if (snap) *snap = 0;
  g_du = 0;
  g_du_root = root;
  nftw(dir, du_cb, 16, FTW_PHYS);
  g_du_root = NULL;
  return g_du;
}

/* a real directory (not a symlink to one: the store walk does not leave the store) */
static bool real_dir(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void read_config_meta(const char *dir, sm_store_entry *e) {
  e->arch = sm_xstrdup("");
  char *p = sm_path_join(dir, "config.json"), *txt = NULL;
  if (sm_read_file(p, &txt, NULL) == SMELT_OK) {
    cJSON *j = cJSON_Parse(txt);
    if (j) {
      cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
      if (cJSON_IsString(mt)) {
        free(e->arch);
        e->arch = sm_xstrdup(mt->valuestring);
      }
      cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quantization");
      if (!cJSON_IsObject(q)) q = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
      if (cJSON_IsObject(q)) {
        cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "bits"), *g = cJSON_GetObjectItemCaseSensitive(q, "group_size");
        if (cJSON_IsNumber(b)) e->bits = b->valueint;
        if (cJSON_IsNumber(g)) e->group_size = g->valueint;
      }
      cJSON_Delete(j);
    }
    free(txt);
  }
  sm_err_clear();
  free(p);
  e->supported = sm_family_type_runnable(e->arch);
}

typedef struct {
  sm_store_entry *v;
  size_t n, cap;
} entry_vec;

static void add_entry(entry_vec *ev, const char *name, char *path, const char *source) {
  if (ev->n == ev->cap) {
    ev->cap = ev->cap ? ev->cap * 2 : 16;
    ev->v = sm_xrealloc(ev->v, ev->cap * sizeof *ev->v);
  }
  sm_store_entry *e = &ev->v[ev->n++];
  memset(e, 0, sizeof *e);
  e->name = sm_xstrdup(name);
  e->path = path;
  e->source = source;
  e->size_bytes = sm_store_dir_size(path);
  read_config_meta(path, e);
}

static int entry_cmp(const void *a, const void *b) {
  const sm_store_entry *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return strcmp(x->source, y->source) > 0 ? -1 : 1; /* "store" before "hf" */
}

smelt_status sm_store_list(sm_store_entry **out, size_t *n) {
  entry_vec ev = {0};
  char *root = sm_store_root();
  DIR *d1 = opendir(root);
  if (d1) {
    struct dirent *o;
    while ((o = readdir(d1))) {
      if (o->d_name[0] == '.') continue; /* .tmp and friends */
      char *od = sm_path_join(root, o->d_name);
      DIR *d2 = real_dir(od) ? opendir(od) : NULL;
      if (d2) {
        struct dirent *m;
        while ((m = readdir(d2))) {
          if (m->d_name[0] == '.') continue;
          char *md = sm_path_join(od, m->d_name);
          if (real_dir(md) && has_config(md)) {
            char nm[512];
            snprintf(nm, sizeof nm, "%s/%s", o->d_name, m->d_name);
            add_entry(&ev, nm, md, "store");
          } else free(md);
        }
        closedir(d2);
      }
      free(od);
    }
    closedir(d1);
  }
  free(root);
  char *hf = sm_store_hf_cache();
  DIR *dh = opendir(hf);
  if (dh) {
    struct dirent *e;
    while ((e = readdir(dh))) {
      if (strncmp(e->d_name, "models--", 8) != 0) continue;
      const char *rest = e->d_name + 8, *sep = strstr(rest, "--");
      if (!sep) continue;
      char owner[256], name[256];
      size_t ol = (size_t)(sep - rest);
      if (ol == 0 || ol >= sizeof owner || strlen(sep + 2) >= sizeof name) continue;
      memcpy(owner, rest, ol);
      owner[ol] = 0;
      strcpy(name, sep + 2);
      char *snap = sm_store_hf_snapshot(owner, name);
      if (snap) {
        char nm[520];
        snprintf(nm, sizeof nm, "%s/%s", owner, name);
        add_entry(&ev, nm, snap, "hf");
      }
    }
    closedir(dh);
  }
  free(hf);
  if (ev.n > 1) qsort(ev.v, ev.n, sizeof *ev.v, entry_cmp);
  *out = ev.v;
  *n = ev.n;
  return SMELT_OK;
}

smelt_status sm_store_list_builtin(sm_store_entry **out, size_t *n) {
  entry_vec ev = {0};
  char *root = sm_store_builtin_dir();
  DIR *d = root ? opendir(root) : NULL;
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char *md = sm_path_join(root, e->d_name);
      if (sm_dir_exists(md) && has_config(md)) add_entry(&ev, e->d_name, md, "built-in");
      else free(md);
    }
    closedir(d);
  }
  free(root);
  if (ev.n > 1) qsort(ev.v, ev.n, sizeof *ev.v, entry_cmp);
  *out = ev.v;
  *n = ev.n;
  return SMELT_OK;
}

void sm_store_list_free(sm_store_entry *e, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(e[i].name);
    free(e[i].path);
    free(e[i].arch);
  }
  free(e);
}

/* ---- removal ---- */
smelt_status sm_store_locate_removable(const char *ref, char **dir) {
  *dir = NULL;
  if (!ref || !*ref) return sm_err(SMELT_ERR_INVALID, "no model given");
  char *root = sm_store_root();
  char rroot[PATH_MAX], rtarget[PATH_MAX];
  if (!realpath(root, rroot)) {
    free(root);
    return sm_err(SMELT_ERR_NOT_FOUND, "model '%s' is not in the store (the store is empty)", ref);
  }
  char *candidate = NULL;
  bool is_path = looks_like_path(ref);
  if (is_path) {
    candidate = (ref[0] == '~' && ref[1] == '/') ? sm_store_home_join(ref + 2) : sm_xstrdup(ref);
  } else {
    char *owner, *name;
    smelt_status s = sm_store_parse_ref(ref, &owner, &name);
    if (s) {
      free(root);
      return s;
    }
    char *od = sm_path_join(root, owner);
    candidate = sm_path_join(od, name);
    free(od);
    free(owner);
    free(name);
  }
  free(root);
  if (!realpath(candidate, rtarget)) {
    smelt_status s = is_path ? sm_err(SMELT_ERR_NOT_FOUND, "'%s' does not exist", ref)
                             : sm_err(SMELT_ERR_NOT_FOUND, "model '%s' is not in the store", ref);
    free(candidate);
    return s;
  }
  free(candidate);
  /* must be exactly <root>/<owner>/<name> */
  size_t rl = strlen(rroot);
  if (strncmp(rtarget, rroot, rl) != 0 || rtarget[rl] != '/')
    return sm_err(SMELT_ERR_INVALID, "refusing to remove '%s': not inside the model store %s", ref, rroot);
  const char *rel = rtarget + rl + 1;
  const char *s1 = strchr(rel, '/');
  if (!s1 || strchr(s1 + 1, '/') || rel[0] == '.' || s1[1] == '.' || s1[1] == 0)
    return sm_err(SMELT_ERR_INVALID, "refusing to remove '%s': not a model directory of the store (%s/<owner>/<name>)",
                  ref, rroot);
  if (!sm_dir_exists(rtarget)) return sm_err(SMELT_ERR_INVALID, "'%s' is not a directory", ref);
  *dir = sm_xstrdup(rtarget);
  return SMELT_OK;
}

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st;
  (void)f;
  return (flag == FTW_DP ? rmdir(p) : unlink(p)) ? -1 : 0;
}

smelt_status sm_store_remove(const char *dir) {
  char *checked = NULL;
  smelt_status s = sm_store_locate_removable(dir, &checked);
  if (s) return s;
  if (nftw(checked, rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    s = sm_err(SMELT_ERR_IO, "could not remove %s: %s", checked, strerror(errno));
    free(checked);
    return s;
  }
  char *sl = strrchr(checked, '/');
  if (sl) {
    *sl = 0;
    rmdir(checked);
  } /* the owner folder, if now empty */
  free(checked);
  return SMELT_OK;
}

const char *sm_store_fmt_bytes(uint64_t b, char *buf, size_t n) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    i++;
  }
  if (i == 0) snprintf(buf, n, "%llu B", (unsigned long long)b);
  else snprintf(buf, n, "%.2f %s", v, u[i]);
  return buf;
}
