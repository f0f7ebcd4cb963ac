/* Hugging Face tokenizer.json loader and the tokenizer's public API (decoding: tok_decode.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <cjson/cJSON.h>
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_props.h"

/* ---------------- loading ---------------- */
static const char *jstr(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}
static bool jbool(const cJSON *o, const char *key, bool def) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  return def;
}
static double jnum(const cJSON *o, const char *key, double def) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : def;
}
static uint32_t first_cp(const char *s) {
  if (!s || !*s) return 0;
  uint32_t cp;
  sm_utf8_dec(s, strlen(s), &cp);
  return cp;
}

static smelt_status parse_pattern(const cJSON *j, sm_pattern *p, const char *where) {
  const char *s;
  if (!cJSON_IsObject(j)) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: %s: missing pattern", where);
  if ((s = jstr(j, "String"))) {
    p->kind = PAT_STRING;
    p->lit = sm_xstrdup(s);
    p->litlen = strlen(s);
    return SMELT_OK;
  }
  if ((s = jstr(j, "Regex"))) {
    int err;
    PCRE2_SIZE eo;
    p->kind = PAT_REGEX;
    sm_buf tr = SM_BUF_INIT;
    sm_uc_translate_regex(s, &tr);
    p->re = pcre2_compile((PCRE2_SPTR)sm_buf_str(&tr), tr.n, PCRE2_UTF | PCRE2_UCP, &err, &eo, NULL);
    sm_buf_free(&tr);
    if (!p->re) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return sm_err(SMELT_ERR_UNSUPPORTED, "tokenizer.json: %s: regex \"%.120s\" not supported: %s", where, s,
                    (char *)msg);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);
    return SMELT_OK;
  }
  return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: %s: pattern must be String or Regex", where);
}
void sm_pattern_free(sm_pattern *p) {
  free(p->lit);
  if (p->re) pcre2_code_free(p->re);
  memset(p, 0, sizeof *p);
}

static int prepend_scheme(const cJSON *j) {
  const char *ps = jstr(j, "prepend_scheme");
  if (ps) return !strcmp(ps, "first") ? PREPEND_FIRST : !strcmp(ps, "never") ? PREPEND_NEVER : PREPEND_ALWAYS;
  return jbool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
}

static smelt_status parse_norm(const cJSON *j, sm_norm *n) {
  const char *ty = jstr(j, "type");
  if (!ty) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: normalizer without type");
  if (!strcmp(ty, "NFC")) n->type = NORM_NFC;
  else if (!strcmp(ty, "NFD")) n->type = NORM_NFD;
  else if (!strcmp(ty, "NFKC")) n->type = NORM_NFKC;
  else if (!strcmp(ty, "NFKD")) n->type = NORM_NFKD;
  else if (!strcmp(ty, "Lowercase")) n->type = NORM_LOWER;
  else if (!strcmp(ty, "StripAccents")) n->type = NORM_STRIP_ACCENTS;
  else if (!strcmp(ty, "Strip")) {
    n->type = NORM_STRIP;
    n->left = jbool(j, "strip_left", true);
    n->right = jbool(j, "strip_right", true);
  } else if (!strcmp(ty, "Prepend")) {
    const char *s = jstr(j, "prepend");
    n->type = NORM_PREPEND;
    n->str = sm_xstrdup(s ? s : "");
    n->slen = strlen(n->str);
  } else if (!strcmp(ty, "Replace")) {
    const char *s = jstr(j, "content");
    n->type = NORM_REPLACE;
    n->str = sm_xstrdup(s ? s : "");
    n->slen = strlen(n->str);
    return parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), &n->pat, "Replace normalizer");
  } else if (!strcmp(ty, "Sequence")) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
    n->type = NORM_SEQ;
    n->nkids = cJSON_GetArraySize(a);
    n->kids = sm_xcalloc((size_t)n->nkids + 1, sizeof(sm_norm));
    for (int i = 0; i < n->nkids; i++) {
      smelt_status st = parse_norm(cJSON_GetArrayItem(a, i), &n->kids[i]);
      if (st) return st;
    }
  } else return sm_err(SMELT_ERR_UNSUPPORTED, "tokenizer.json: unsupported normalizer type '%s'", ty);
  return SMELT_OK;
}
static void free_norm(sm_norm *n) {
  for (int i = 0; i < n->nkids; i++) free_norm(&n->kids[i]);
  free(n->kids);
  free(n->str);
  sm_pattern_free(&n->pat);
}

static int parse_behavior(const char *b) {
  if (!b) return SPLIT_ISOLATED;
  if (!strcmp(b, "Removed")) return SPLIT_REMOVED;
  if (!strcmp(b, "Isolated")) return SPLIT_ISOLATED;
  if (!strcmp(b, "MergedWithPrevious")) return SPLIT_MERGED_PREV;
  if (!strcmp(b, "MergedWithNext")) return SPLIT_MERGED_NEXT;
  if (!strcmp(b, "Contiguous")) return SPLIT_CONTIGUOUS;
  return 0;
}
static smelt_status parse_pretok(const cJSON *j, sm_pretok *p, bool *bytelevel) {
  const char *ty = jstr(j, "type");
  if (!ty) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: pre_tokenizer without type");
  if (!strcmp(ty, "Split")) {
    p->type = PT_SPLIT;
    p->behavior = parse_behavior(jstr(j, "behavior"));
    if (!p->behavior)
      return sm_err(SMELT_ERR_UNSUPPORTED, "tokenizer.json: unknown split behavior '%s'", jstr(j, "behavior"));
    p->invert = jbool(j, "invert", false);
    return parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), &p->pat, "Split pre-tokenizer");
  } else if (!strcmp(ty, "ByteLevel")) {
    p->type = PT_BYTELEVEL;
    p->add_prefix_space = jbool(j, "add_prefix_space", true);
    p->use_regex = jbool(j, "use_regex", true);
    *bytelevel = true;
  } else if (!strcmp(ty, "Metaspace")) {
    const char *r = jstr(j, "replacement");
    p->type = PT_METASPACE;
    p->repl = r ? first_cp(r) : 0x2581;
    sm_buf b = {0};
    sm_buf_put_cp(&b, p->repl);
    memcpy(p->repl_s, b.p, b.n);
    p->repl_len = (int)b.n;
    sm_buf_free(&b);
    p->prepend_scheme = prepend_scheme(j);
    p->split = jbool(j, "split", true);
  } else if (!strcmp(ty, "Digits")) {
    p->type = PT_DIGITS;
    p->individual = jbool(j, "individual_digits", false);
  } else if (!strcmp(ty, "Whitespace")) p->type = PT_WHITESPACE;
  else if (!strcmp(ty, "WhitespaceSplit")) p->type = PT_WHITESPACE_SPLIT;
  else if (!strcmp(ty, "Punctuation")) {
    p->type = PT_PUNCT;
    p->behavior = parse_behavior(jstr(j, "behavior"));
    if (!p->behavior) p->behavior = SPLIT_ISOLATED;
  } else if (!strcmp(ty, "CharDelimiterSplit")) {
    p->type = PT_CHAR_DELIM;
    p->repl = first_cp(jstr(j, "delimiter"));
  } else if (!strcmp(ty, "BertPreTokenizer")) {
    p->type = PT_SEQ;
    p->nkids = 2;
    p->kids = sm_xcalloc(2, sizeof(sm_pretok));
    p->kids[0].type = PT_WHITESPACE_SPLIT;
    p->kids[1].type = PT_PUNCT;
    p->kids[1].behavior = SPLIT_ISOLATED;
  } else if (!strcmp(ty, "Sequence")) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
    p->type = PT_SEQ;
    p->nkids = cJSON_GetArraySize(a);
    p->kids = sm_xcalloc((size_t)p->nkids + 1, sizeof(sm_pretok));
    for (int i = 0; i < p->nkids; i++) {
      smelt_status st = parse_pretok(cJSON_GetArrayItem(a, i), &p->kids[i], bytelevel);
      if (st) return st;
    }
  } else return sm_err(SMELT_ERR_UNSUPPORTED, "tokenizer.json: unsupported pre_tokenizer type '%s'", ty);
  return SMELT_OK;
}
static void free_pretok(sm_pretok *p) {
  for (int i = 0; i < p->nkids; i++) free_pretok(&p->kids[i]);
  free(p->kids);
  sm_pattern_free(&p->pat);
}

static smelt_status parse_decoder(const cJSON *j, sm_decoder *d) {
  const char *ty = jstr(j, "type");
  if (!ty) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: decoder without type");
  if (!strcmp(ty, "ByteLevel")) d->type = DEC_BYTELEVEL;
  else if (!strcmp(ty, "ByteFallback")) d->type = DEC_BYTEFALLBACK;
  else if (!strcmp(ty, "Fuse")) d->type = DEC_FUSE;
  else if (!strcmp(ty, "Metaspace")) {
    const char *r = jstr(j, "replacement");
    d->type = DEC_METASPACE;
    d->repl = r ? first_cp(r) : 0x2581;
    d->prepend_scheme = prepend_scheme(j);
  } else if (!strcmp(ty, "Strip")) {
    d->type = DEC_STRIP;
    d->ch = first_cp(jstr(j, "content"));
    d->start = (int)jnum(j, "start", 0);
    d->stop = (int)jnum(j, "stop", 0);
  } else if (!strcmp(ty, "Replace")) {
    const char *s = jstr(j, "content");
    d->type = DEC_REPLACE;
    d->str = sm_xstrdup(s ? s : "");
    d->slen = strlen(d->str);
    return parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), &d->pat, "Replace decoder");
  } else if (!strcmp(ty, "Sequence")) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "decoders");
    d->type = DEC_SEQ;
    d->nkids = cJSON_GetArraySize(a);
    d->kids = sm_xcalloc((size_t)d->nkids + 1, sizeof(sm_decoder));
    for (int i = 0; i < d->nkids; i++) {
      smelt_status st = parse_decoder(cJSON_GetArrayItem(a, i), &d->kids[i]);
      if (st) return st;
    }
  } else return sm_err(SMELT_ERR_UNSUPPORTED, "tokenizer.json: unsupported decoder type '%s'", ty);
  return SMELT_OK;
}
static bool has_bytefallback(const sm_decoder *d) {
  if (d->type == DEC_BYTEFALLBACK) return true;
  for (int i = 0; i < d->nkids; i++)
    if (has_bytefallback(&d->kids[i])) return true;
  return false;
}
static void free_decoder(sm_decoder *d) {
  for (int i = 0; i < d->nkids; i++) free_decoder(&d->kids[i]);
  free(d->kids);
  free(d->str);
  sm_pattern_free(&d->pat);
}

static void ids_push(int32_t **v, int *n, int32_t x) {
  *v = sm_xrealloc(*v, (size_t)(*n + 1) * sizeof(int32_t));
  (*v)[(*n)++] = x;
}
/* an id the post-processor adds: one of the vocabulary's (or of added_tokens), else every encoding
 * would carry an id the model has no row for */
static smelt_status post_id(const smelt_tokenizer *t, const cJSON *n, const char *name, int32_t *id) {
  if (!cJSON_IsNumber(n) || !(n->valuedouble >= 0) || n->valuedouble >= (double)t->n_ids ||
      n->valuedouble != (double)(int32_t)n->valuedouble || !t->id_tok[(int32_t)n->valuedouble])
    return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: post_processor token '%s' has an id outside the vocabulary",
                  name ? name : "?");
  *id = (int32_t)n->valuedouble;
  return SMELT_OK;
}
static smelt_status special_pair(const smelt_tokenizer *t, const cJSON *pair, int32_t *id) {
  /* ["<s>", 0] */
  const cJSON *n = cJSON_GetArrayItem(pair, 1);
  if (!cJSON_IsNumber(n)) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: bad cls/sep in post_processor");
  const cJSON *name = cJSON_GetArrayItem(pair, 0);
  return post_id(t, n, cJSON_IsString(name) ? name->valuestring : NULL, id);
}
static smelt_status parse_post(const smelt_tokenizer *t, const cJSON *j, sm_post *p) {
  const char *ty = jstr(j, "type");
  if (!ty) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: post_processor without type");
  if (!strcmp(ty, "ByteLevel")) p->type = POST_BYTELEVEL;
  else if (!strcmp(ty, "TemplateProcessing")) {
    p->type = POST_TEMPLATE;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    bool after = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
      const cJSON *st = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
      if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
        after = true;
        continue;
      }
      if (!st) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: bad TemplateProcessing item");
      const char *name = jstr(st, "id");
      const cJSON *tok = name ? cJSON_GetObjectItemCaseSensitive(sp, name) : NULL;
      const cJSON *ids = tok ? cJSON_GetObjectItemCaseSensitive(tok, "ids") : NULL;
      if (!cJSON_IsArray(ids))
        return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: TemplateProcessing special token '%s' undefined",
                      name ? name : "?");
      const cJSON *x;
      cJSON_ArrayForEach(x, ids) {
        int32_t id;
        smelt_status st2 = post_id(t, x, name, &id);
        if (st2) return st2;
        if (after) ids_push(&p->post, &p->npost, id);
        else ids_push(&p->pre, &p->npre, id);
      }
    }
  } else if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
    int32_t cls = 0, sep = 0;
    smelt_status st;
    p->type = POST_BERT;
    if ((st = special_pair(t, cJSON_GetObjectItemCaseSensitive(j, "cls"), &cls))) return st;
    if ((st = special_pair(t, cJSON_GetObjectItemCaseSensitive(j, "sep"), &sep))) return st;
    ids_push(&p->pre, &p->npre, cls);
    ids_push(&p->post, &p->npost, sep);
  } else if (!strcmp(ty, "Sequence")) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "processors");
    p->type = POST_SEQ;
    p->nkids = cJSON_GetArraySize(a);
    p->kids = sm_xcalloc((size_t)p->nkids + 1, sizeof(sm_post));
    for (int i = 0; i < p->nkids; i++) {
      smelt_status st = parse_post(t, cJSON_GetArrayItem(a, i), &p->kids[i]);
      if (st) return st;
    }
  } else return sm_err(SMELT_ERR_UNSUPPORTED, "tokenizer.json: unsupported post_processor type '%s'", ty);
  return SMELT_OK;
}
static void free_post(sm_post *p) {
  for (int i = 0; i < p->nkids; i++) free_post(&p->kids[i]);
  free(p->kids);
  free(p->pre);
  free(p->post);
}

static void trie_insert(sm_trie *tr, const char *s, size_t n, int32_t tok) {
  if (!n) return;
  tr->any = true;
  int32_t *slot = &tr->root[(uint8_t)s[0]];
  int32_t node = -1;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)s[i];
    if (i > 0) {
      slot = &tr->nodes[node].child;
      while (*slot >= 0 && tr->nodes[*slot].c != c) slot = &tr->nodes[*slot].sibling;
    }
    if (*slot < 0) {
      if (tr->n == tr->cap) {
        /* slot may point into nodes: remember it as an index */
        ptrdiff_t off = (slot >= (int32_t *)tr->nodes && slot < (int32_t *)(tr->nodes + tr->n))
                        ? (char *)slot - (char *)tr->nodes
                        : -1;
        tr->cap = tr->cap ? tr->cap * 2 : 256;
        tr->nodes = sm_xrealloc(tr->nodes, tr->cap * sizeof(sm_trie_node));
        if (off >= 0) slot = (int32_t *)((char *)tr->nodes + off);
      }
      int32_t nn = (int32_t)tr->n++;
      tr->nodes[nn] = (sm_trie_node){-1, -1, -1, c};
      *slot = nn;
    }
    node = *slot;
  }
  tr->nodes[node].tok = tok;
}

/* ---- NUL bytes in token strings ----
 * cJSON returns C strings, so a "\u0000" escape would cut a string short. Before parsing, each
 * such escape is replaced by one of a noncharacter (U+FDD0..U+FDEF) that the file does not
 * contain in any form; token strings taken from the tree turn it back into a NUL byte and are
 * length-counted from then on. */
static smelt_status nul_sentinel(char *buf, size_t len, uint32_t *cp) {
  *cp = 0;
  bool any = false;
  for (size_t i = 0; i + 5 < len; i++) {
    if (buf[i] != '\\') continue;
    if (buf[i + 1] == 'u' && !memcmp(buf + i + 2, "0000", 4)) {
      any = true;
      break;
    }
    i++; /* skip the escaped character */
  }
  if (!any) return SMELT_OK;
  for (uint32_t c = 0xFDD0; c <= 0xFDEF; c++) {
    char u8[3] = {(char)0xEF, (char)(0x80 | ((c >> 6) & 0x3F)), (char)(0x80 | (c & 0x3F))}, esc[8];
    snprintf(esc, sizeof esc, "%04x", c);
    bool used = false;
    for (size_t i = 0; i + 2 < len && !used; i++) {
      if (!memcmp(buf + i, u8, 3)) used = true;
      else if (buf[i] == '\\' && i + 5 < len && buf[i + 1] == 'u' && !strncasecmp(buf + i + 2, esc, 4)) used = true;
    }
    if (used) continue;
    for (size_t i = 0; i + 5 < len; i++) {
      if (buf[i] != '\\') continue;
      if (buf[i + 1] == 'u' && !memcmp(buf + i + 2, "0000", 4)) memcpy(buf + i + 2, esc, 4);
      i++;
    }
    *cp = c;
    return SMELT_OK;
  }
  return sm_err(SMELT_ERR_UNSUPPORTED, "tokenizer.json: NUL bytes in strings, and every U+FDD0..U+FDEF also used");
}
/* copy of a token string with the sentinel turned back into NUL bytes; *n = its length */
static char *tok_str(const smelt_tokenizer *t, const char *s, size_t *n) {
  size_t l = strlen(s);
  char *o = sm_xmalloc(l + 1);
  size_t k = 0;
  char u8[3] = {(char)0xEF, (char)(0x80 | ((t->nul_cp >> 6) & 0x3F)), (char)(0x80 | (t->nul_cp & 0x3F))};
  for (size_t i = 0; i < l;) {
    if (t->nul_cp && i + 3 <= l && !memcmp(s + i, u8, 3)) {
      o[k++] = 0;
      i += 3;
    } else o[k++] = s[i++];
  }
  o[k] = 0;
  *n = k;
  return o;
}

static char *dup_token_field(const cJSON *v) {
  if (cJSON_IsString(v)) return sm_xstrdup(v->valuestring);
  if (cJSON_IsObject(v)) {
    const char *c = jstr(v, "content");
    return c ? sm_xstrdup(c) : NULL;
  }
  return NULL;
}
static char *dir_of(const char *path) {
  const char *sl = strrchr(path, '/');
  if (!sl) return sm_xstrdup(".");
  char *d = sm_xmalloc((size_t)(sl - path) + 1);
  memcpy(d, path, (size_t)(sl - path));
  d[sl - path] = 0;
  return d;
}

static smelt_status load_config(smelt_tokenizer *t, const char *cfg_path, const char *dir) {
  if (cfg_path && sm_file_exists(cfg_path)) {
    char *buf;
    size_t len;
    smelt_status st = sm_read_file(cfg_path, &buf, &len);
    if (st) return st;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!j || !cJSON_IsObject(j)) {
      cJSON_Delete(j);
      return sm_err(SMELT_ERR_FORMAT, "%s: invalid JSON", cfg_path);
    }
    t->bos_token = dup_token_field(cJSON_GetObjectItemCaseSensitive(j, "bos_token"));
    t->eos_token = dup_token_field(cJSON_GetObjectItemCaseSensitive(j, "eos_token"));
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    if (cJSON_IsString(ct)) t->chat_template = sm_xstrdup(ct->valuestring);
    else if (cJSON_IsArray(ct)) {
      const cJSON *it;
      cJSON_ArrayForEach(it, ct) {
        const char *nm = jstr(it, "name"), *tp = jstr(it, "template");
        if (!nm || !tp) continue;
        t->tmpl_names = sm_xrealloc(t->tmpl_names, (size_t)(t->n_tmpl + 1) * sizeof(char *));
        t->tmpl_bodies = sm_xrealloc(t->tmpl_bodies, (size_t)(t->n_tmpl + 1) * sizeof(char *));
        t->tmpl_names[t->n_tmpl] = sm_xstrdup(nm);
        t->tmpl_bodies[t->n_tmpl] = sm_xstrdup(tp);
        t->n_tmpl++;
        if (!strcmp(nm, "default") && !t->chat_template) t->chat_template = sm_xstrdup(tp);
      }
    }
    cJSON_Delete(j);
  }
  /* a processor's template (chat_template.json, as vision-language checkpoints carry it) comes before
   * the tokenizer's, as in vLLM and mlx-vlm; chat_template.jinja before both */
  char *cj = sm_path_join(dir, "chat_template.json");
  if (sm_file_exists(cj)) {
    char *buf;
    size_t len;
    smelt_status st = sm_read_file_max(cj, SM_FILE_MAX_JSON, &buf, &len);
    if (st) {
      free(cj);
      return st;
    }
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *ct = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "chat_template") : NULL;
    if (!cJSON_IsObject(j) || (ct && !cJSON_IsString(ct))) {
      cJSON_Delete(j);
      st = sm_err(SMELT_ERR_FORMAT, "%s: not a JSON object with a \"chat_template\" string", cj);
      free(cj);
      return st;
    }
    if (ct) {
      free(t->chat_template);
      t->chat_template = sm_xstrdup(ct->valuestring);
    }
    cJSON_Delete(j);
  }
  free(cj);
  char *jp = sm_path_join(dir, "chat_template.jinja");
  if (sm_file_exists(jp)) {
    char *buf;
    size_t len;
    if (sm_read_file(jp, &buf, &len) == SMELT_OK) {
      free(t->chat_template);
      t->chat_template = buf;
    }
  }
  free(jp);
  return SMELT_OK;
}

static smelt_status load_json(smelt_tokenizer *t, cJSON *root) {
  smelt_status st;
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (!cJSON_IsObject(model)) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: missing \"model\"");
  const char *mty = jstr(model, "type");
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  if (mty ? strcmp(mty, "BPE") != 0 : !merges)
    return sm_err(SMELT_ERR_UNSUPPORTED, "tokenizer.json: unsupported model type '%s' (only BPE is supported)",
                  mty ? mty : "?");
  if (!cJSON_IsObject(vocab)) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: BPE model without vocab object");
  if (merges && !cJSON_IsArray(merges)) return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: merges must be an array");
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  /* id range */
  int64_t max_id = -1;
  size_t nv = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, vocab) {
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e8)
      return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: bad vocab id for '%s'", it->string ? it->string : "?");
    if ((int64_t)it->valuedouble > max_id) max_id = (int64_t)it->valuedouble;
    nv++;
  }
  cJSON_ArrayForEach(it, added) {
    double id = jnum(it, "id", -1);
    if (id < 0 || id > 1e8 || !jstr(it, "content"))
      return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: bad added_tokens entry");
    if ((int64_t)id > max_id) max_id = (int64_t)id;
  }
  t->n_ids = (int32_t)(max_id + 1);
  t->id_tok = sm_xcalloc((size_t)t->n_ids + 1, sizeof(char *));
  t->id_len = sm_xcalloc((size_t)t->n_ids + 1, sizeof(uint32_t));
  t->id_special = sm_xcalloc((size_t)t->n_ids + 1, 1);
  t->vkeys = sm_xcalloc(nv + 1, sizeof(char *));
  t->vkey_len = sm_xcalloc(nv + 1, sizeof(uint32_t));
  cJSON_ArrayForEach(it, vocab) {
    size_t kl;
    char *k = tok_str(t, it->string ? it->string : "", &kl);
    int32_t id = (int32_t)it->valuedouble;
    t->vkey_len[t->n_vkeys] = (uint32_t)kl;
    t->vkeys[t->n_vkeys++] = k;
    sm_smap_put(&t->vocab, k, kl, id);
    t->id_tok[id] = k;
    t->id_len[id] = (uint32_t)kl;
  }
  /* chars c such that "c\u2581" occurs inside a vocab token */
  for (size_t i = 0; i < t->n_vkeys; i++) {
    const char *k = t->vkeys[i];
    size_t kl = t->vkey_len[i];
    if (kl >= 3 && !memcmp(k, "\xE2\x96\x81", 3)) t->ms_chunk = true;
    for (size_t p = 1; p + 3 <= kl; p++) {
      if (memcmp(k + p, "\xE2\x96\x81", 3)) continue;
      size_t q = p - 1;
      while (q > 0 && ((uint8_t)k[q] & 0xC0) == 0x80) q--;
      uint32_t c;
      sm_utf8_dec(k + q, kl - q, &c);
      int j = 0;
      while (j < t->n_ms_prev && t->ms_prev[j] != c) j++;
      if (j == t->n_ms_prev) {
        if (t->n_ms_prev >= 4096) {
          t->ms_chunk = false;
          break;
        }
        t->ms_prev = sm_xrealloc(t->ms_prev, (size_t)(t->n_ms_prev + 1) * sizeof(uint32_t));
        t->ms_prev[t->n_ms_prev++] = c;
      }
    }
  }
  /* BPE options */
  t->byte_fallback = jbool(model, "byte_fallback", false);
  t->fuse_unk = jbool(model, "fuse_unk", false);
  t->ignore_merges = jbool(model, "ignore_merges", false);
  const char *unk = jstr(model, "unk_token");
  t->unk_id = -1;
  if (unk) {
    size_t ul;
    char *u = tok_str(t, unk, &ul);
    t->unk_id = sm_smap_get(&t->vocab, u, ul);
    free(u);
  }
  const char *cp = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
  if (cp && *cp) {
    t->cont_prefix = sm_xstrdup(cp);
    t->cont_prefix_len = strlen(cp);
  }
  if (ew && *ew) {
    t->eow_suffix = sm_xstrdup(ew);
    t->eow_suffix_len = strlen(ew);
  }
  for (int b = 0; b < 256; b++) {
    char nm[8];
    snprintf(nm, sizeof nm, "<0x%02X>", b);
    t->byte_ids[b] = sm_smap_get(&t->vocab, nm, 6);
  }
  /* merges */
  int32_t rank = 0;
  sm_buf tmp = {0};
  char *ma = NULL, *mb = NULL;
  cJSON_ArrayForEach(it, merges) {
    const char *a, *b;
    size_t al, bl;
    free(ma);
    free(mb);
    ma = mb = NULL;
    if (cJSON_IsString(it)) {
      size_t ml;
      ma = tok_str(t, it->valuestring, &ml);
      const char *sp = memchr(ma, ' ', ml);
      if (!sp) {
        free(ma);
        sm_buf_free(&tmp);
        return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: merge %d is not 'a b'", rank);
      }
      a = ma;
      al = (size_t)(sp - a);
      b = sp + 1;
      bl = ml - al - 1;
    } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
      a = ma = tok_str(t, cJSON_GetArrayItem(it, 0)->valuestring, &al);
      b = mb = tok_str(t, cJSON_GetArrayItem(it, 1)->valuestring, &bl);
    } else {
      sm_buf_free(&tmp); /* ma and mb were freed above */
      return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: merge %d has a bad format", rank);
    }
    int32_t ia = sm_smap_get(&t->vocab, a, al), ib = sm_smap_get(&t->vocab, b, bl);
    sm_buf_clear(&tmp);
    sm_buf_put(&tmp, a, al);
    size_t skip = (t->cont_prefix_len && bl >= t->cont_prefix_len && !memcmp(b, t->cont_prefix, t->cont_prefix_len))
                  ? t->cont_prefix_len
                  : 0;
    sm_buf_put(&tmp, b + skip, bl - skip);
    int32_t in = sm_smap_get(&t->vocab, tmp.p, tmp.n);
    if (ia < 0 || ib < 0 || in < 0) {
      sm_buf_free(&tmp);
      free(ma);
      free(mb);
      return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: merge %d refers to tokens not in the vocab", rank);
    }
    if (!sm_pmap_get(&t->merges, ia, ib)) sm_pmap_put(&t->merges, ia, ib, rank, in);
    rank++;
  }
  free(ma);
  free(mb);
  sm_buf_free(&tmp);
  /* normalizer (needed before the added tokens) */
  const cJSON *j;
  if ((j = cJSON_GetObjectItemCaseSensitive(root, "normalizer")) && !cJSON_IsNull(j)) {
    t->normalizer = sm_xcalloc(1, sizeof(sm_norm));
    if ((st = parse_norm(j, t->normalizer))) return st;
  }
  if ((j = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")) && !cJSON_IsNull(j)) {
    t->pretok = sm_xcalloc(1, sizeof(sm_pretok));
    if ((st = parse_pretok(j, t->pretok, &t->uses_bytelevel))) return st;
  }
  if ((j = cJSON_GetObjectItemCaseSensitive(root, "decoder")) && !cJSON_IsNull(j)) {
    t->decoder = sm_xcalloc(1, sizeof(sm_decoder));
    if ((st = parse_decoder(j, t->decoder))) return st;
    t->dec_bytefallback = has_bytefallback(t->decoder);
  }
  /* added tokens */
  memset(t->trie_raw.root, 0xff, sizeof t->trie_raw.root);
  memset(t->trie_norm.root, 0xff, sizeof t->trie_norm.root);
  t->added = sm_xcalloc((size_t)cJSON_GetArraySize(added) + 1, sizeof(sm_added));
  /* HF re-derives added-token ids on load (AddedVocabulary::add_tokens): a content already known
   * keeps its id, a new one gets the next id after the model vocab / the largest added id */
  int64_t max_added = -1;
  cJSON_ArrayForEach(it, added) {
    sm_added *a = &t->added[t->n_added];
    a->content = tok_str(t, jstr(it, "content"), &a->len);
    int32_t known = sm_smap_get(&t->added_map, a->content, a->len);
    if (known < 0) known = sm_smap_get(&t->vocab, a->content, a->len);
    if (known >= 0) a->id = known;
    else a->id = (int32_t)((max_added >= (int64_t)nv || nv == 0) ? max_added + 1 : (int64_t)nv);
    if (a->id >= t->n_ids) {
      free(a->content);
      return sm_err(SMELT_ERR_FORMAT, "tokenizer.json: added token ids are inconsistent");
    }
    if (a->id > max_added) max_added = a->id;
    a->special = jbool(it, "special", false);
    a->single_word = jbool(it, "single_word", false);
    a->lstrip = jbool(it, "lstrip", false);
    a->rstrip = jbool(it, "rstrip", false);
    a->normalized = jbool(it, "normalized", !a->special);
    t->id_tok[a->id] = a->content;
    t->id_len[a->id] = (uint32_t)a->len;
    t->id_special[a->id] = a->special;
    sm_smap_put(&t->added_map, a->content, a->len, a->id);
    if (a->normalized && t->normalizer) {
      sm_buf nb = {0};
      sm_normalize(t->normalizer, a->content, a->len, &nb);
      trie_insert(&t->trie_norm, nb.p ? nb.p : "", nb.n, t->n_added);
      sm_buf_free(&nb);
    } else trie_insert(a->normalized ? &t->trie_norm : &t->trie_raw, a->content, a->len, t->n_added);
    t->n_added++;
  }
  /* the post-processor's ids are checked against the vocabulary and the added tokens */
  if ((j = cJSON_GetObjectItemCaseSensitive(root, "post_processor")) && !cJSON_IsNull(j)) {
    t->post = sm_xcalloc(1, sizeof(sm_post));
    if ((st = parse_post(t, j, t->post))) return st;
  }
  return SMELT_OK;
}

smelt_status sm_tok_load_files(const char *tokenizer_json, const char *tokenizer_config_json, smelt_tokenizer **out) {
  if (!tokenizer_json || !out) return sm_err(SMELT_ERR_INVALID, "sm_tok_load_files: NULL argument");
  *out = NULL;
  sm_bl_init();
  if (!sm_file_exists(tokenizer_json)) return sm_err(SMELT_ERR_IO, "tokenizer file not found: %s", tokenizer_json);
  char *buf;
  size_t len;
  smelt_status st = sm_read_file(tokenizer_json, &buf, &len);
  if (st) return st;
  uint32_t nul = 0;
  if ((st = nul_sentinel(buf, len, &nul))) {
    free(buf);
    return st;
  }
  cJSON *root = cJSON_ParseWithLength(buf, len);
  free(buf);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return sm_err(SMELT_ERR_FORMAT, "%s: invalid JSON", tokenizer_json);
  }
  smelt_tokenizer *t = sm_xcalloc(1, sizeof *t);
  t->nul_cp = nul;
  pthread_mutex_init(&t->cache_mu, NULL);
  t->cache = sm_xcalloc(SM_CACHE_SLOTS, sizeof(sm_cache_ent));
  st = load_json(t, root);
  cJSON_Delete(root);
  if (!st) {
    char *dir = dir_of(tokenizer_config_json ? tokenizer_config_json : tokenizer_json);
    st = load_config(t, tokenizer_config_json, dir);
    free(dir);
  }
  if (st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", sm_errmsg());
    smelt_tokenizer_free(t);
    return sm_err(st, "%s", msg);
  }
  *out = t;
  return SMELT_OK;
}

smelt_status smelt_tokenizer_load(const char *model_dir, smelt_tokenizer **out) {
  if (!model_dir || !out) return sm_err(SMELT_ERR_INVALID, "smelt_tokenizer_load: NULL argument");
  *out = NULL;
  char *tj = sm_path_join(model_dir, "tokenizer.json");
  char *tc = sm_path_join(model_dir, "tokenizer_config.json");
  char *jt = sm_path_join(model_dir, "chat_template.jinja");
  smelt_status st;
  if ((st = sm_regular_or_absent(tj)) || (st = sm_regular_or_absent(tc)) || (st = sm_regular_or_absent(jt))) {
    /* a FIFO or device: refused (sm_err set) */
  } else if (!sm_file_exists(tj)) st = sm_err(SMELT_ERR_IO, "no tokenizer.json in %s", model_dir);
  else st = sm_tok_load_files(tj, tc, out);
  free(jt);
  free(tj);
  free(tc);
  return st;
}

void smelt_tokenizer_free(smelt_tokenizer *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n_vkeys; i++) free(t->vkeys[i]);
  free(t->vkeys);
  free(t->vkey_len);
  free(t->id_tok);
  free(t->id_len);
  free(t->id_special);
  sm_smap_free(&t->vocab);
  sm_smap_free(&t->added_map);
  sm_pmap_free(&t->merges);
  free(t->cont_prefix);
  free(t->eow_suffix);
  free(t->ms_prev);
  for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
  free(t->added);
  free(t->trie_raw.nodes);
  free(t->trie_norm.nodes);
  if (t->normalizer) {
    free_norm(t->normalizer);
    free(t->normalizer);
  }
  if (t->pretok) {
    free_pretok(t->pretok);
    free(t->pretok);
  }
  if (t->post) {
    free_post(t->post);
    free(t->post);
  }
  if (t->decoder) {
    free_decoder(t->decoder);
    free(t->decoder);
  }
  free(t->bos_token);
  free(t->eos_token);
  free(t->chat_template);
  for (int i = 0; i < t->n_tmpl; i++) {
    free(t->tmpl_names[i]);
    free(t->tmpl_bodies[i]);
  }
  free(t->tmpl_names);
  free(t->tmpl_bodies);
  if (t->cache) {
    for (size_t i = 0; i < SM_CACHE_SLOTS; i++) {
      free(t->cache[i].word);
      free(t->cache[i].ids);
    }
    free(t->cache);
  }
  pthread_mutex_destroy(&t->cache_mu);
  free(t);
}

smelt_status smelt_tokenize(const smelt_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                            size_t *n_ids) {
  if (!t || !ids || !n_ids || (!text && len)) return sm_err(SMELT_ERR_INVALID, "smelt_tokenize: NULL argument");
  return sm_tok_encode(t, text, len, add_special, ids, n_ids);
}

int32_t smelt_tokenizer_vocab_size(const smelt_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t sm_tok_token_id(const smelt_tokenizer *t, const char *token) {
  if (!t || !token) return -1;
  size_t n = strlen(token);
  int32_t id = sm_smap_get(&t->added_map, token, n);
  return id >= 0 ? id : sm_smap_get(&t->vocab, token, n);
}
const char *sm_tok_id_to_token(const smelt_tokenizer *t, int32_t id) {
  return (t && id >= 0 && id < t->n_ids) ? t->id_tok[id] : NULL;
}
const char *sm_tok_id_token(const smelt_tokenizer *t, int32_t id, size_t *len) {
  if (!t || id < 0 || id >= t->n_ids || !t->id_tok[id]) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = t->id_len[id];
  return t->id_tok[id];
}
bool sm_tok_is_special(const smelt_tokenizer *t, int32_t id) {
  return t && id >= 0 && id < t->n_ids && t->id_special[id];
}
const char *sm_tok_bos_token(const smelt_tokenizer *t) { return t ? t->bos_token : NULL; }
const char *sm_tok_eos_token(const smelt_tokenizer *t) { return t ? t->eos_token : NULL; }
const char *sm_tok_chat_template(const smelt_tokenizer *t, const char *name) {
  if (!t) return NULL;
  if (!name || !strcmp(name, "default")) return t->chat_template;
  for (int i = 0; i < t->n_tmpl; i++)
    if (!strcmp(t->tmpl_names[i], name)) return t->tmpl_bodies[i];
  return NULL;
}
static bool post_adds_prefix(const sm_post *p) {
  if (!p) return false;
  if (p->type == POST_SEQ) {
    for (int i = 0; i < p->nkids; i++)
      if (post_adds_prefix(&p->kids[i])) return true;
    return false;
  }
  return p->npre > 0;
}
bool sm_tok_adds_bos(const smelt_tokenizer *t) { return t && post_adds_prefix(t->post); }
