/* safetensors reader (see safetensors.h).
 *
 * File layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *   "__metadata__": {...}}), then the data block; offsets are relative to the
 * start of the data block (byte 8 + N). */
#include "format/safetensors.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SM_ST_MAX_HEADER ((uint64_t)100 * 1024 * 1024)

struct sm_st {
  sm_mmap *maps; /* one per shard (empty when parsed from a caller's buffer) */
  bool copy;     /* read the shards into memory instead of mapping them */
  char **files;  /* shard paths, for messages */
  int n_files;
  sm_tensor *t;
  size_t n, cap;
  size_t *ht; /* open addressing: index+1 into t, 0 = empty */
  size_t ht_cap;
  size_t total;
};

static const struct {
  const char *name;
  size_t size;
} k_dtypes[SM_DT_COUNT] = {
  [SM_DT_F32] = {"F32", 4},   [SM_DT_F16] = {"F16", 2}, [SM_DT_BF16] = {"BF16", 2}, [SM_DT_F64] = {"F64", 8},
  [SM_DT_U8] = {"U8", 1},     [SM_DT_I8] = {"I8", 1},   [SM_DT_U16] = {"U16", 2},   [SM_DT_I16] = {"I16", 2},
  [SM_DT_U32] = {"U32", 4},   [SM_DT_I32] = {"I32", 4}, [SM_DT_U64] = {"U64", 8},   [SM_DT_I64] = {"I64", 8},
  [SM_DT_BOOL] = {"BOOL", 1},
};

size_t sm_dtype_size(sm_dtype t) { return (unsigned)t < SM_DT_COUNT ? k_dtypes[t].size : 0; }
const char *sm_dtype_name(sm_dtype t) { return (unsigned)t < SM_DT_COUNT ? k_dtypes[t].name : "?"; }

static int dtype_from_name(const char *s) {
  for (int i = 0; i < SM_DT_COUNT; i++)
    if (strcmp(s, k_dtypes[i].name) == 0) return i;
  return -1;
}

/* ---------------------------------------------------------------- hash map */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void ht_rebuild(sm_st *st, size_t want) {
  size_t cap = 16;
  while (cap < want * 2) cap *= 2;
  free(st->ht);
  st->ht = sm_xcalloc(cap, sizeof *st->ht);
  st->ht_cap = cap;
  for (size_t i = 0; i < st->n; i++) {
    size_t j = hash_str(st->t[i].name) & (cap - 1);
    while (st->ht[j]) j = (j + 1) & (cap - 1);
    st->ht[j] = i + 1;
  }
}

/* slot of `name`, or of the empty slot where it would go */
static size_t ht_slot(const sm_st *st, const char *name) {
  size_t j = hash_str(name) & (st->ht_cap - 1);
  while (st->ht[j] && strcmp(st->t[st->ht[j] - 1].name, name) != 0) j = (j + 1) & (st->ht_cap - 1);
  return j;
}

const sm_tensor *sm_st_find(const sm_st *st, const char *name) {
  if (!st || !name || !st->ht_cap) return NULL;
  size_t j = ht_slot(st, name);
  return st->ht[j] ? &st->t[st->ht[j] - 1] : NULL;
}

/* -------------------------------------------------------------- accessors */

size_t sm_st_count(const sm_st *st) { return st ? st->n : 0; }
const sm_tensor *sm_st_at(const sm_st *st, size_t i) { return st && i < st->n ? &st->t[i] : NULL; }
size_t sm_st_total_bytes(const sm_st *st) { return st ? st->total : 0; }

void sm_st_close(sm_st *st) {
  if (!st) return;
  for (size_t i = 0; i < st->n; i++) free(st->t[i].name);
  free(st->t);
  free(st->ht);
  for (int i = 0; i < st->n_files; i++) {
    if (st->maps) sm_mmap_close(&st->maps[i]);
    free(st->files[i]);
  }
  free(st->maps);
  free(st->files);
  free(st);
}

/* --------------------------------------------------------------- parsing */

/* A JSON number that is an exact non-negative integer <= 2^53. */
static bool json_uint(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return false;
  double d = v->valuedouble;
  if (!(d >= 0) || d > 9007199254740992.0 || floor(d) != d) return false;
  *out = (uint64_t)d;
  return true;
}

typedef struct {
  size_t idx;
  uint64_t begin, end;
} range;

static int cmp_range(const void *a, const void *b) {
  const range *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* Parse one safetensors image and append its tensors to st (file index `fi`). */
static smelt_status parse_image(sm_st *st, const uint8_t *data, size_t size, int fi, const char *fname) {
  if (size < 8)
    return sm_err(SMELT_ERR_FORMAT, "%s: truncated safetensors file (%zu bytes, need at least 8)", fname, size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
  if (hlen > SM_ST_MAX_HEADER)
    return sm_err(SMELT_ERR_FORMAT, "%s: safetensors header length %llu exceeds the 100 MB limit", fname,
                  (unsigned long long)hlen);
  if (hlen > size - 8)
    return sm_err(SMELT_ERR_FORMAT, "%s: safetensors header length %llu larger than the file (%zu bytes): truncated?",
                  fname, (unsigned long long)hlen, size);
  if (hlen < 2)
    return sm_err(SMELT_ERR_FORMAT, "%s: safetensors header too short (%llu bytes)", fname, (unsigned long long)hlen);
  const char *hdr = (const char *)data + 8;
  if (hdr[0] != '{') return sm_err(SMELT_ERR_FORMAT, "%s: safetensors header does not start with '{'", fname);
  if (memchr(hdr, 0, hlen)) return sm_err(SMELT_ERR_FORMAT, "%s: safetensors header contains a NUL byte", fname);
  const uint8_t *base = data + 8 + hlen;
  uint64_t dsize = size - 8 - hlen;

  /* parse a NUL-terminated copy so cJSON never reads past the header */
  char *copy = sm_xmalloc(hlen + 1);
  memcpy(copy, hdr, hlen);
  copy[hlen] = 0;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(copy, hlen + 1, &end, 0);
  if (!root) {
    size_t at = end ? (size_t)(end - copy) : 0;
    const char *ep = cJSON_GetErrorPtr();
    if (ep >= copy && ep <= copy + hlen) at = (size_t)(ep - copy);
    free(copy);
    return sm_err(SMELT_ERR_FORMAT, "%s: safetensors header is not valid JSON (near byte %zu)", fname, at);
  }
  for (const char *p = end; p && p < copy + hlen; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      cJSON_Delete(root);
      free(copy);
      return sm_err(SMELT_ERR_FORMAT, "%s: trailing garbage after the safetensors JSON header", fname);
    }
  free(copy);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return sm_err(SMELT_ERR_FORMAT, "%s: safetensors header is not a JSON object", fname);
  }

  smelt_status rc = SMELT_OK;
  size_t first = st->n;
  size_t nent = 0;
  for (cJSON *e = root->child; e; e = e->next) nent++;
  range *rg = sm_xmalloc((nent ? nent : 1) * sizeof *rg);
  size_t nr = 0;
  if (st->n + nent > st->cap) {
    st->cap = st->n + nent;
    st->t = sm_xrealloc(st->t, st->cap * sizeof *st->t);
  }

  for (cJSON *e = root->child; e; e = e->next) {
    const char *name = e->string;
    if (!name) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: header entry without a name", fname);
      goto done;
    }
    if (strcmp(name, "__metadata__") == 0) continue;
    if (!cJSON_IsObject(e)) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': entry is not an object", fname, name);
      goto done;
    }
    if (!name[0]) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor with an empty name", fname);
      goto done;
    }
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"", fname, name);
      goto done;
    }
    if (!cJSON_IsArray(sh)) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", fname, name);
      goto done;
    }
    if (!cJSON_IsArray(of)) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"data_offsets\"", fname, name);
      goto done;
    }
    int dtype = dtype_from_name(dt->valuestring);
    if (dtype < 0) {
      rc = sm_err(SMELT_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported dtype \"%.32s\"", fname, name, dt->valuestring);
      goto done;
    }
    sm_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = (sm_dtype)dtype;
    t.file = fi;
    int nd = cJSON_GetArraySize(sh);
    if (nd > SM_ST_MAX_DIMS) {
      rc = sm_err(SMELT_ERR_UNSUPPORTED, "%s: tensor '%s': %d dimensions (max %d)", fname, name, nd, SM_ST_MAX_DIMS);
      goto done;
    }
    uint64_t numel = 1;
    bool overflow = false;
    int k = 0;
    for (cJSON *d = sh->child; d; d = d->next, k++) {
      uint64_t v;
      if (cJSON_IsNumber(d) && d->valuedouble < 0) {
        rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': negative dimension %d in shape", fname, name, k);
        goto done;
      }
      if (!json_uint(d, &v) || v > (uint64_t)INT64_MAX) {
        rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", fname, name, k);
        goto done;
      }
      t.shape[k] = (int64_t)v;
      if (__builtin_mul_overflow(numel, v, &numel)) overflow = true;
    }
    t.ndim = nd;
    uint64_t nbytes = 0;
    if (overflow || __builtin_mul_overflow(numel, (uint64_t)k_dtypes[dtype].size, &nbytes)) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': shape size overflows", fname, name);
      goto done;
    }
    uint64_t b, en;
    if (cJSON_GetArraySize(of) != 2 || !json_uint(of->child, &b) || !json_uint(of->child->next, &en)) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers", fname, name);
      goto done;
    }
    if (b > en) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu", fname, name,
                  (unsigned long long)b, (unsigned long long)en);
      goto done;
    }
    if (en > dsize) {
      rc = sm_err(SMELT_ERR_FORMAT,
                  "%s: tensor '%s': data_offsets [%llu, %llu] outside the data block (%llu bytes): truncated file?",
                  fname, name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)dsize);
      goto done;
    }
    if (en - b != nbytes) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s': shape/dtype need %llu bytes but data_offsets span %llu", fname,
                  name, (unsigned long long)nbytes, (unsigned long long)(en - b));
      goto done;
    }
    t.data = base + b;
    t.nbytes = (size_t)nbytes;
    rg[nr].idx = st->n;
    rg[nr].begin = b;
    rg[nr].end = en;
    nr++;
    t.name = sm_xstrdup(name);
    st->t[st->n++] = t;
  }

  /* overlaps: sort by begin; each range must start at or after the previous end */
  if (nr) qsort(rg, nr, sizeof *rg, cmp_range);
  for (size_t i = 1; i < nr; i++)
    if (rg[i].begin < rg[i - 1].end) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: tensors '%s' and '%s' have overlapping data ranges", fname,
                  st->t[rg[i - 1].idx].name, st->t[rg[i].idx].name);
      goto done;
    }

  /* names: add to the map, rejecting duplicates (within this file or across shards) */
  ht_rebuild(st, st->n);
  for (size_t i = first; i < st->n; i++) {
    size_t j = ht_slot(st, st->t[i].name);
    size_t other = st->ht[j] - 1;
    if (other != i) {
      const sm_tensor *o = &st->t[other];
      if (o->file == fi) rc = sm_err(SMELT_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", fname, o->name);
      else
        rc = sm_err(SMELT_ERR_FORMAT, "tensor '%s' appears in two shards: %s and %s", o->name,
                    st->files ? st->files[o->file] : "?", fname);
      goto done;
    }
  }
  for (size_t i = first; i < st->n; i++) st->total += st->t[i].nbytes;

done:
  if (rc != SMELT_OK) {
    for (size_t i = first; i < st->n; i++) free(st->t[i].name);
    st->n = first;
  }
  free(rg);
  cJSON_Delete(root);
  return rc;
}

smelt_status sm_st_parse_buffer(const void *data, size_t size, sm_st **out) {
  if (!out) return sm_err(SMELT_ERR_INVALID, "sm_st_parse_buffer: out is NULL");
  *out = NULL;
  if (!data && size) return sm_err(SMELT_ERR_INVALID, "sm_st_parse_buffer: NULL data");
  sm_st *st = sm_xcalloc(1, sizeof *st);
  st->files = sm_xcalloc(1, sizeof *st->files);
  st->files[0] = sm_xstrdup("<buffer>");
  st->n_files = 1;
  smelt_status rc = parse_image(st, data, size, 0, "<buffer>");
  if (rc != SMELT_OK) {
    sm_st_close(st);
    return rc;
  }
  if (!st->ht_cap) ht_rebuild(st, 0);
  *out = st;
  return SMELT_OK;
}

/* map one shard file and parse it */
static smelt_status add_file(sm_st *st, const char *path) {
  st->maps = sm_xrealloc(st->maps, (st->n_files + 1) * sizeof *st->maps);
  st->files = sm_xrealloc(st->files, (st->n_files + 1) * sizeof *st->files);
  int fi = st->n_files;
  smelt_status rc = st->copy ? sm_mmap_read(path, &st->maps[fi]) : sm_mmap_open(path, &st->maps[fi]);
  if (rc != SMELT_OK) return rc;
  st->files[fi] = sm_xstrdup(path);
  st->n_files++;
  return parse_image(st, st->maps[fi].data, st->maps[fi].size, fi, path);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && memcmp(s + a - b, suf, b) == 0;
}

/* shard file names from an index must stay inside the model directory */
static bool safe_rel_path(const char *p) {
  if (!p[0] || p[0] == '/') return false;
  for (const char *s = p; *s;) {
    const char *e = strchr(s, '/');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if ((n == 2 && s[0] == '.' && s[1] == '.') || n == 0) return false;
    s += n + (e ? 1 : 0);
    if (!e) break;
  }
  return true;
}

static smelt_status open_index(sm_st *st, const char *dir, const char *index_path) {
  char *txt = NULL;
  size_t len = 0;
  smelt_status rc = sm_read_file(index_path, &txt, &len);
  if (rc != SMELT_OK) return rc;
  cJSON *root = cJSON_ParseWithLength(txt, len);
  free(txt);
  if (!root) return sm_err(SMELT_ERR_FORMAT, "%s: not valid JSON", index_path);
  cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(wm)) {
    cJSON_Delete(root);
    return sm_err(SMELT_ERR_FORMAT, "%s: missing \"weight_map\" object", index_path);
  }
  /* unique shard names in sorted order */
  size_t n = 0, cap = 0;
  char **names = NULL;
  for (cJSON *e = wm->child; e; e = e->next) {
    if (!cJSON_IsString(e) || !e->string) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name", index_path,
                  e->string ? e->string : "?");
      goto out;
    }
    if (!safe_rel_path(e->valuestring)) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s: weight_map entry '%s' names an unsafe path '%s'", index_path, e->string,
                  e->valuestring);
      goto out;
    }
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      names = sm_xrealloc(names, cap * sizeof *names);
    }
    names[n++] = e->valuestring;
  }
  if (n == 0) {
    rc = sm_err(SMELT_ERR_FORMAT, "%s: empty weight_map", index_path);
    goto out;
  }
  qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n && rc == SMELT_OK; i++) {
    if (i && strcmp(names[i], names[i - 1]) == 0) continue;
    char *p = sm_path_join(dir, names[i]);
    rc = add_file(st, p);
    free(p);
  }
  if (rc != SMELT_OK) goto out;
  /* every tensor the index lists must be in the shard it names */
  for (cJSON *e = wm->child; e; e = e->next) {
    const sm_tensor *t = sm_st_find(st, e->string);
    if (!t) {
      rc = sm_err(SMELT_ERR_FORMAT, "%s lists tensor '%s' in %s, but no shard contains it", index_path, e->string,
                  e->valuestring);
      goto out;
    }
  }
out:
  free(names);
  cJSON_Delete(root);
  return rc;
}

static smelt_status open_dir_glob(sm_st *st, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return sm_err(SMELT_ERR_IO, "cannot open directory %s", dir);
  size_t n = 0, cap = 0;
  char **names = NULL;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.' || !ends_with(de->d_name, ".safetensors")) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      names = sm_xrealloc(names, cap * sizeof *names);
    }
    names[n++] = sm_xstrdup(de->d_name);
  }
  closedir(d);
  smelt_status rc = SMELT_OK;
  if (n == 0) rc = sm_err(SMELT_ERR_NOT_FOUND, "%s: no *.safetensors files and no model.safetensors.index.json", dir);
  if (n) qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n && rc == SMELT_OK; i++) {
    char *p = sm_path_join(dir, names[i]);
    if (sm_file_exists(p)) rc = add_file(st, p);
    free(p);
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc;
}

smelt_status sm_st_open(const char *path, sm_st **out) { return sm_st_open_opts(path, false, out); }

smelt_status sm_st_open_opts(const char *path, bool copy, sm_st **out) {
  if (!out) return sm_err(SMELT_ERR_INVALID, "sm_st_open: out is NULL");
  *out = NULL;
  if (!path) return sm_err(SMELT_ERR_INVALID, "sm_st_open: path is NULL");
  sm_st *st = sm_xcalloc(1, sizeof *st);
  st->copy = copy;
  smelt_status rc;
  if (sm_dir_exists(path)) {
    char *idx = sm_path_join(path, "model.safetensors.index.json");
    if (sm_file_exists(idx)) rc = open_index(st, path, idx);
    else rc = open_dir_glob(st, path);
    free(idx);
  } else if (sm_file_exists(path)) {
    rc = add_file(st, path);
  } else {
    rc = sm_err(SMELT_ERR_IO, "%s: no such file or directory", path);
  }
  if (rc != SMELT_OK) {
    sm_st_close(st);
    return rc;
  }
  if (!st->ht_cap) ht_rebuild(st, 0);
  *out = st;
  return SMELT_OK;
}
