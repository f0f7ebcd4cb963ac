/* Encoding pipeline: added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_norm.h"
#include "tokenizer/unicode_props.h"

typedef struct {
  size_t off, len;
  int32_t id;
  bool first;
} piece; /* id >= 0: an added token */
typedef struct {
  piece *v;
  size_t n, cap;
  sm_buf buf;
} plist;
typedef struct {
  int32_t *v;
  size_t n, cap;
} ivec;
typedef struct {
  int32_t rank, pos, id;
} hent;

typedef struct {
  pcre2_match_data *md;
  /* BPE scratch */
  int32_t *sid, *slen, *sprev, *snext;
  size_t scap;
  hent *heap;
  size_t hcap;
  sm_buf tmp, tmp2;
} ctx;

static void pl_add(plist *l, size_t off, size_t len, int32_t id, bool first) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 64;
    l->v = sm_xrealloc(l->v, l->cap * sizeof(piece));
  }
  l->v[l->n++] = (piece){off, len, id, first};
}
static void pl_add_str(plist *l, const char *s, size_t len, bool first) {
  size_t off = l->buf.n;
  sm_buf_put(&l->buf, s, len);
  pl_add(l, off, len, -1, first);
}
static void pl_free(plist *l) {
  free(l->v);
  sm_buf_free(&l->buf);
  memset(l, 0, sizeof *l);
}
static void pl_reset(plist *l) {
  l->n = 0;
  sm_buf_clear(&l->buf);
}
static void iv_push(ivec *v, int32_t x) {
  if (v->n == v->cap) {
    v->cap = v->cap ? v->cap * 2 : 256;
    v->v = sm_xrealloc(v->v, v->cap * sizeof(int32_t));
  }
  v->v[v->n++] = x;
}

bool sm_re_find(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, size_t start, size_t *ms, size_t *me) {
  int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
  if (rc < 0) return false;
  PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
  *ms = ov[0];
  *me = ov[1];
  return true;
}

static inline size_t clen_at(const char *s, size_t n, size_t i) {
  uint8_t c = (uint8_t)s[i];
  size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  return i + l > n ? n - i : l;
}

/* ---- matches of a pattern: (start,end) pairs, non-overlapping, in order ---- */
typedef struct {
  size_t s, e;
} rng;
typedef struct {
  rng *v;
  size_t n, cap;
} rvec;
static void rv_add(rvec *r, size_t s, size_t e) {
  if (r->n == r->cap) {
    r->cap = r->cap ? r->cap * 2 : 64;
    r->v = sm_xrealloc(r->v, r->cap * sizeof(rng));
  }
  r->v[r->n++] = (rng){s, e};
}
static void find_pattern(const sm_pattern *p, ctx *c, const char *s, size_t n, rvec *out) {
  out->n = 0;
  if (p->kind == PAT_STRING) {
    if (!p->litlen) return;
    size_t i = 0;
    while (i + p->litlen <= n) {
      const char *f = memmem(s + i, n - i, p->lit, p->litlen);
      if (!f) break;
      size_t st = (size_t)(f - s);
      rv_add(out, st, st + p->litlen);
      i = st + p->litlen;
    }
    return;
  }
  size_t i = 0, ms, me;
  while (i <= n && sm_re_find(p->re, c->md, s, n, i, &ms, &me)) {
    if (me == ms) {
      if (ms >= n) break;
      i = ms + clen_at(s, n, ms);
      continue;
    } /* empty matches split nothing */
    rv_add(out, ms, me);
    i = me;
  }
}
typedef bool (*cpred)(uint32_t c, uint32_t arg);
static void find_pred(cpred f, uint32_t arg, const char *s, size_t n, rvec *out) {
  out->n = 0;
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    int l = sm_utf8_dec(s + i, n - i, &cp);
    if (f(cp, arg)) rv_add(out, i, i + (size_t)l);
    i += (size_t)l;
  }
}

/* Split s (a piece) given the matches, following HF NormalizedString::split; appends kept sub-pieces. */
static void split_by(const char *s, size_t n, bool first, const rvec *m, int behavior, bool invert, plist *out) {
  /* segments covering the string: (start, end, is_match) */
  size_t cap = 2 * m->n + 2, ns = 0;
  struct seg {
    size_t s, e;
    bool m;
  } sbuf1[64], sbuf2[64];
  struct seg *sg = cap <= 64 ? sbuf1 : sm_xmalloc(cap * sizeof *sg);
  size_t prev = 0;
  for (size_t i = 0; i < m->n; i++) {
    if (m->v[i].s > prev) sg[ns++] = (struct seg){prev, m->v[i].s, false};
    sg[ns++] = (struct seg){m->v[i].s, m->v[i].e, true};
    prev = m->v[i].e;
  }
  if (prev < n || ns == 0) sg[ns++] = (struct seg){prev, n, false};
  if (invert)
    for (size_t i = 0; i < ns; i++) sg[i].m = !sg[i].m;
  /* result: (s, e, remove) */
  struct seg *r = cap <= 64 ? sbuf2 : sm_xmalloc(cap * sizeof *r);
  size_t nr = 0;
  bool pm = false;
  switch (behavior) {
    case SPLIT_ISOLATED:
      for (size_t i = 0; i < ns; i++) r[nr++] = (struct seg){sg[i].s, sg[i].e, false};
      break;
    case SPLIT_REMOVED:
      for (size_t i = 0; i < ns; i++) r[nr++] = sg[i];
      break;
    case SPLIT_CONTIGUOUS:
      for (size_t i = 0; i < ns; i++) {
        if (sg[i].m == pm && nr) r[nr - 1].e = sg[i].e;
        else r[nr++] = (struct seg){sg[i].s, sg[i].e, false};
        pm = sg[i].m;
      }
      break;
    case SPLIT_MERGED_PREV:
      for (size_t i = 0; i < ns; i++) {
        if (sg[i].m && !pm && nr) r[nr - 1].e = sg[i].e;
        else r[nr++] = (struct seg){sg[i].s, sg[i].e, false};
        pm = sg[i].m;
      }
      break;
    case SPLIT_MERGED_NEXT:
      for (size_t k = ns; k-- > 0;) {
        if (sg[k].m && !pm && nr) r[nr - 1].s = sg[k].s;
        else r[nr++] = (struct seg){sg[k].s, sg[k].e, false};
        pm = sg[k].m;
      }
      for (size_t i = 0; i < nr / 2; i++) {
        struct seg t = r[i];
        r[i] = r[nr - 1 - i];
        r[nr - 1 - i] = t;
      }
      break;
  }
  for (size_t i = 0; i < nr; i++) {
    if (r[i].m || r[i].e <= r[i].s) continue;
    pl_add_str(out, s + r[i].s, r[i].e - r[i].s, first && r[i].s == 0);
  }
  if (sg != sbuf1) free(sg);
  if (r != sbuf2) free(r);
}

/* ---- normalizers ---- */
static void norm_replace(const sm_pattern *p, const char *content, size_t clen, const char *s, size_t n, sm_buf *out,
                         pcre2_match_data *md) {
  size_t i = 0, last = 0;
  if (p->kind == PAT_STRING) {
    if (!p->litlen) {
      sm_buf_put(out, s, n);
      return;
    }
    while (i + p->litlen <= n) {
      const char *f = memmem(s + i, n - i, p->lit, p->litlen);
      if (!f) break;
      size_t st = (size_t)(f - s);
      sm_buf_put(out, s + last, st - last);
      sm_buf_put(out, content, clen);
      i = last = st + p->litlen;
    }
  } else {
    size_t ms, me;
    while (i <= n && sm_re_find(p->re, md, s, n, i, &ms, &me)) {
      if (me == ms) {
        if (ms >= n) break;
        i = ms + clen_at(s, n, ms);
        continue;
      }
      sm_buf_put(out, s + last, ms - last);
      sm_buf_put(out, content, clen);
      i = last = me;
    }
  }
  sm_buf_put(out, s + last, n - last);
}
static void normalize_rec(const sm_norm *nm, const char *s, size_t n, sm_buf *out, pcre2_match_data *md) {
  switch (nm->type) {
    case NORM_NFC: sm_unorm(SM_NFC, s, n, out); return;
    case NORM_NFD: sm_unorm(SM_NFD, s, n, out); return;
    case NORM_NFKC: sm_unorm(SM_NFKC, s, n, out); return;
    case NORM_NFKD: sm_unorm(SM_NFKD, s, n, out); return;
    case NORM_LOWER: sm_unorm_lowercase(s, n, out); return;
    case NORM_STRIP: {
      size_t a = 0, b = n;
      if (nm->left)
        while (a < b) {
          uint32_t cp;
          int l = sm_utf8_dec(s + a, b - a, &cp);
          if (!sm_uc_is_whitespace(cp)) break;
          a += (size_t)l;
        }
      if (nm->right)
        while (b > a) {
          size_t k = b - 1;
          while (k > a && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
          uint32_t cp;
          sm_utf8_dec(s + k, b - k, &cp);
          if (!sm_uc_is_whitespace(cp)) break;
          b = k;
        }
      sm_buf_put(out, s + a, b - a);
      return;
    }
    case NORM_REPLACE: norm_replace(&nm->pat, nm->str, nm->slen, s, n, out, md); return;
    case NORM_PREPEND:
      if (n) sm_buf_put(out, nm->str, nm->slen);
      sm_buf_put(out, s, n);
      return;
    case NORM_STRIP_ACCENTS: sm_unorm_strip_accents(s, n, out); return;
    case NORM_SEQ: {
      sm_buf a = {0}, b = {0};
      sm_buf_put(&a, s, n);
      for (int k = 0; k < nm->nkids; k++) {
        sm_buf_clear(&b);
        normalize_rec(&nm->kids[k], a.p ? a.p : "", a.n, &b, md);
        sm_buf t = a;
        a = b;
        b = t;
      }
      sm_buf_put(out, a.p ? a.p : "", a.n);
      sm_buf_free(&a);
      sm_buf_free(&b);
      return;
    }
    default: sm_buf_put(out, s, n);
  }
}
void sm_normalize(const sm_norm *nm, const char *s, size_t n, sm_buf *out) {
  pcre2_match_data *md = pcre2_match_data_create(4, NULL);
  normalize_rec(nm, s, n, out, md);
  pcre2_match_data_free(md);
}

/* ---- added tokens (HF AddedVocabulary::find_matches) ---- */
static size_t trie_longest(const sm_trie *tr, const char *s, size_t n, size_t i, int32_t *tok) {
  int32_t node = tr->root[(uint8_t)s[i]];
  size_t best = 0;
  *tok = -1;
  size_t j = i + 1;
  while (node >= 0) {
    if (tr->nodes[node].tok >= 0) {
      best = j - i;
      *tok = tr->nodes[node].tok;
    }
    if (j >= n) break;
    uint8_t c = (uint8_t)s[j];
    int32_t ch = tr->nodes[node].child;
    while (ch >= 0 && tr->nodes[ch].c != c) ch = tr->nodes[ch].sibling;
    node = ch;
    j++;
  }
  return best;
}
static bool is_word_char(uint32_t c) { return sm_uc_is_alnum(c) || c == '_'; }
static void split_added(const smelt_tokenizer *t, const sm_trie *tr, const char *s, size_t n, bool first, plist *out) {
  if (!tr->any) {
    pl_add_str(out, s, n, first);
    return;
  }
  size_t start_off = 0, i = 0;
  while (i < n) {
    if (tr->root[(uint8_t)s[i]] < 0) {
      i++;
      continue;
    }
    int32_t ti;
    size_t ml = trie_longest(tr, s, n, i, &ti);
    if (!ml) {
      i++;
      continue;
    }
    const sm_added *a = &t->added[ti];
    size_t st = i, sp = i + ml;
    i = sp;
    if (a->single_word) {
      bool start_space = true, stop_space = true;
      if (st > 0) {
        size_t k = st - 1;
        while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
        uint32_t cp;
        sm_utf8_dec(s + k, n - k, &cp);
        start_space = !is_word_char(cp);
      }
      if (sp < n) {
        uint32_t cp;
        sm_utf8_dec(s + sp, n - sp, &cp);
        stop_space = !is_word_char(cp);
      }
      if (!start_space || !stop_space) continue;
    }
    if (a->lstrip) {
      size_t ns = st;
      while (ns > 0) {
        size_t k = ns - 1;
        while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
        uint32_t cp;
        sm_utf8_dec(s + k, n - k, &cp);
        if (!sm_uc_is_whitespace(cp)) break;
        ns = k;
      }
      st = ns > start_off ? ns : start_off;
    }
    if (a->rstrip) {
      while (sp < n) {
        uint32_t cp;
        int l = sm_utf8_dec(s + sp, n - sp, &cp);
        if (!sm_uc_is_whitespace(cp)) break;
        sp += (size_t)l;
      }
      i = sp;
    }
    if (start_off < st) pl_add_str(out, s + start_off, st - start_off, first && start_off == 0);
    pl_add(out, 0, 0, a->id, false);
    start_off = sp;
  }
  if (start_off < n) pl_add_str(out, s + start_off, n - start_off, first && start_off == 0);
}

/* ---- pre-tokenizers ---- */
static pcre2_code *gpt2_re, *ws_re;
static pthread_once_t re_once = PTHREAD_ONCE_INIT;
static pcre2_code *compile_re(const char *pat) {
  int err;
  PCRE2_SIZE eo;
  sm_buf tr = SM_BUF_INIT;
  sm_uc_translate_regex(pat, &tr);
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)sm_buf_str(&tr), tr.n, PCRE2_UTF | PCRE2_UCP, &err, &eo, NULL);
  sm_buf_free(&tr);
  if (re) pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  return re;
}
static void re_init(void) {
  gpt2_re = compile_re("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
  ws_re = compile_re("\\w+|[^\\w\\s]+");
}
static bool pred_eq(uint32_t c, uint32_t a) { return c == a; }
static bool pred_ws(uint32_t c, uint32_t a) {
  (void)a;
  return sm_uc_is_whitespace(c);
}
static bool pred_num(uint32_t c, uint32_t a) {
  (void)a;
  return sm_uc_is_numeric(c);
}
static bool pred_punct(uint32_t c, uint32_t a) {
  (void)a;
  return sm_hf_is_punctuation(c);
}

static void pretok_apply(const sm_pretok *p, ctx *c, plist *in, plist *out);
static void pretok_piece(const sm_pretok *p, ctx *c, const char *s, size_t n, bool first, plist *out) {
  rvec m = {0};
  switch (p->type) {
    case PT_SPLIT:
      find_pattern(&p->pat, c, s, n, &m);
      split_by(s, n, first, &m, p->behavior, p->invert, out);
      break;
    case PT_DIGITS:
      find_pred(pred_num, 0, s, n, &m);
      split_by(s, n, first, &m, p->individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, false, out);
      break;
    case PT_WHITESPACE: {
      size_t i = 0, ms, me;
      while (i < n && sm_re_find(ws_re, c->md, s, n, i, &ms, &me)) {
        if (me == ms) {
          i = ms + clen_at(s, n, ms);
          continue;
        }
        rv_add(&m, ms, me);
        i = me;
      }
      split_by(s, n, first, &m, SPLIT_REMOVED, true, out);
      break;
    }
    case PT_WHITESPACE_SPLIT:
      find_pred(pred_ws, 0, s, n, &m);
      split_by(s, n, first, &m, SPLIT_REMOVED, false, out);
      break;
    case PT_CHAR_DELIM:
      find_pred(pred_eq, p->repl, s, n, &m);
      split_by(s, n, first, &m, SPLIT_REMOVED, false, out);
      break;
    case PT_PUNCT:
      find_pred(pred_punct, 0, s, n, &m);
      split_by(s, n, first, &m, p->behavior, false, out);
      break;
    case PT_METASPACE: {
      sm_buf *b = &c->tmp2;
      sm_buf_clear(b);
      bool starts = false;
      for (size_t i = 0; i < n; i++)
        if (s[i] == ' ') {
          starts = true;
          break;
        }
      (void)starts;
      /* replace ' ' by the replacement */
      sm_buf r = {0};
      for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') sm_buf_put(&r, p->repl_s, (size_t)p->repl_len);
        else sm_buf_putc(&r, s[i]);
      }
      bool has = r.n >= (size_t)p->repl_len && memcmp(r.p, p->repl_s, (size_t)p->repl_len) == 0;
      if ((p->prepend_scheme == PREPEND_ALWAYS && !has) || (p->prepend_scheme == PREPEND_FIRST && !has && first))
        sm_buf_put(b, p->repl_s, (size_t)p->repl_len);
      sm_buf_put(b, r.p ? r.p : "", r.n);
      sm_buf_free(&r);
      if (p->split) {
        find_pred(pred_eq, p->repl, b->p, b->n, &m);
        split_by(b->p, b->n, first, &m, SPLIT_MERGED_NEXT, false, out);
      } else if (b->n) pl_add_str(out, b->p, b->n, first);
      break;
    }
    case PT_BYTELEVEL: {
      const char *src = s;
      size_t sn = n;
      sm_buf *b = &c->tmp2;
      if (p->add_prefix_space && !(n && s[0] == ' ')) {
        sm_buf_clear(b);
        sm_buf_putc(b, ' ');
        sm_buf_put(b, s, n);
        src = b->p;
        sn = b->n;
      }
      plist *dst = out;
      rng whole = {0, sn};
      const rng *rs = &whole;
      size_t nr = sn ? 1 : 0;
      if (p->use_regex) {
        size_t i = 0, ms, me;
        while (i < sn && sm_re_find(gpt2_re, c->md, src, sn, i, &ms, &me)) {
          if (me == ms) {
            i = ms + clen_at(src, sn, ms);
            continue;
          }
          if (ms > i) rv_add(&m, i, ms);
          rv_add(&m, ms, me);
          i = me;
        }
        if (i < sn) rv_add(&m, i, sn);
        rs = m.v;
        nr = m.n;
      }
      for (size_t k = 0; k < nr; k++) {
        const uint8_t *q = (const uint8_t *)src + rs[k].s;
        size_t ln = rs[k].e - rs[k].s;
        size_t off = dst->buf.n;
        sm_buf_reserve(&dst->buf, ln * 2);
        for (size_t j = 0; j < ln; j++) {
          memcpy(dst->buf.p + dst->buf.n, sm_bl_enc[q[j]], 2);
          dst->buf.n += sm_bl_enc_len[q[j]];
        }
        dst->buf.p[dst->buf.n] = 0; /* keep sm_buf's terminator */
        pl_add(dst, off, dst->buf.n - off, -1, first && rs[k].s == 0);
      }
      break;
    }
    case PT_SEQ: {
      plist a = {0}, b = {0};
      pl_add_str(&a, s, n, first);
      for (int k = 0; k < p->nkids; k++) {
        pl_reset(&b);
        pretok_apply(&p->kids[k], c, &a, &b);
        plist t = a;
        a = b;
        b = t;
      }
      for (size_t k = 0; k < a.n; k++) pl_add_str(out, a.buf.p + a.v[k].off, a.v[k].len, a.v[k].first);
      pl_free(&a);
      pl_free(&b);
      break;
    }
    default:
      if (n) pl_add_str(out, s, n, first);
  }
  free(m.v);
}
static void pretok_apply(const sm_pretok *p, ctx *c, plist *in, plist *out) {
  for (size_t k = 0; k < in->n; k++) {
    piece pc = in->v[k];
    if (pc.id >= 0) {
      pl_add(out, 0, 0, pc.id, false);
      continue;
    }
    pretok_piece(p, c, in->buf.p + pc.off, pc.len, pc.first, out);
  }
}

/* ---- BPE ---- */
static void heap_push(ctx *c, size_t *hn, hent e) {
  if (*hn == c->hcap) {
    c->hcap = c->hcap ? c->hcap * 2 : 256;
    c->heap = sm_xrealloc(c->heap, c->hcap * sizeof(hent));
  }
  size_t i = (*hn)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    hent q = c->heap[p];
    if (q.rank < e.rank || (q.rank == e.rank && q.pos <= e.pos)) break;
    c->heap[i] = q;
    i = p;
  }
  c->heap[i] = e;
}
static hent heap_pop(ctx *c, size_t *hn) {
  hent top = c->heap[0];
  hent e = c->heap[--(*hn)];
  size_t i = 0, n = *hn;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    hent best = e;
    if (l < n && (c->heap[l].rank < best.rank || (c->heap[l].rank == best.rank && c->heap[l].pos < best.pos))) {
      m = l;
      best = c->heap[l];
    }
    if (r < n && (c->heap[r].rank < best.rank || (c->heap[r].rank == best.rank && c->heap[r].pos < best.pos))) {
      m = r;
      best = c->heap[r];
    }
    if (m == i) break;
    c->heap[i] = c->heap[m];
    i = m;
  }
  if (n) c->heap[i] = e;
  return top;
}

static void bpe_word(const smelt_tokenizer *t, ctx *c, const char *w, size_t n, ivec *out, bool shortcut) {
  if (shortcut && t->ignore_merges) {
    int32_t id = sm_smap_get(&t->vocab, w, n);
    if (id >= 0) {
      iv_push(out, id);
      return;
    }
  }
  uint64_t h = 0;
  sm_cache_ent *ce = NULL;
  smelt_tokenizer *tm = (smelt_tokenizer *)t;
  if (n <= 128) {
    h = sm_hash_bytes(w, n);
    ce = &tm->cache[h & (SM_CACHE_SLOTS - 1)];
    pthread_mutex_lock(&tm->cache_mu);
    if (ce->word && ce->h == h && ce->wlen == n && memcmp(ce->word, w, n) == 0) {
      for (uint32_t k = 0; k < ce->nids; k++) iv_push(out, ce->ids[k]);
      pthread_mutex_unlock(&tm->cache_mu);
      return;
    }
    pthread_mutex_unlock(&tm->cache_mu);
  }
  if (c->scap < n + 1) {
    c->scap = n + 64;
    c->sid = sm_xrealloc(c->sid, c->scap * sizeof(int32_t));
    c->slen = sm_xrealloc(c->slen, c->scap * sizeof(int32_t));
    c->sprev = sm_xrealloc(c->sprev, c->scap * sizeof(int32_t));
    c->snext = sm_xrealloc(c->snext, c->scap * sizeof(int32_t));
  }
  int32_t ns = 0;
#define ADD_SYM(ID, LEN) \
  do { \
    c->sid[ns] = (ID); \
    c->slen[ns] = (int32_t)(LEN); \
    ns++; \
  } while (0)
  int32_t unk = -1;
  size_t unk_len = 0;
  bool affix = t->cont_prefix_len || t->eow_suffix_len;
  for (size_t i = 0; i < n;) {
    size_t l = clen_at(w, n, i);
    const char *key = w + i;
    size_t klen = l;
    if (affix) {
      sm_buf *b = &c->tmp;
      sm_buf_clear(b);
      if (i > 0 && t->cont_prefix_len) sm_buf_put(b, t->cont_prefix, t->cont_prefix_len);
      sm_buf_put(b, w + i, l);
      if (i + l == n && t->eow_suffix_len) sm_buf_put(b, t->eow_suffix, t->eow_suffix_len);
      key = b->p;
      klen = b->n;
    }
    int32_t id = sm_smap_get(&t->vocab, key, klen);
    if (id >= 0) {
      if (unk >= 0) {
        ADD_SYM(unk, unk_len);
        unk = -1;
      }
      ADD_SYM(id, l);
    } else {
      bool done = false;
      if (t->byte_fallback) {
        bool all = true;
        for (size_t k = 0; k < klen; k++)
          if (t->byte_ids[(uint8_t)key[k]] < 0) {
            all = false;
            break;
          }
        if (all) {
          if ((size_t)ns + klen > c->scap) { /* prefix/suffix may grow the symbol count */
            c->scap = ns + klen + n + 64;
            c->sid = sm_xrealloc(c->sid, c->scap * sizeof(int32_t));
            c->slen = sm_xrealloc(c->slen, c->scap * sizeof(int32_t));
            c->sprev = sm_xrealloc(c->sprev, c->scap * sizeof(int32_t));
            c->snext = sm_xrealloc(c->snext, c->scap * sizeof(int32_t));
          }
          for (size_t k = 0; k < klen; k++) ADD_SYM(t->byte_ids[(uint8_t)key[k]], 1);
          done = true;
        }
      }
      if (!done && t->unk_id >= 0) {
        if (unk >= 0 && t->fuse_unk) unk_len += l;
        else {
          if (unk >= 0) ADD_SYM(unk, unk_len);
          unk = t->unk_id;
          unk_len = l;
        }
      }
    }
    i += l;
  }
  if (unk >= 0) ADD_SYM(unk, unk_len);
#undef ADD_SYM
  for (int32_t i = 0; i < ns; i++) {
    c->sprev[i] = i - 1;
    c->snext[i] = i + 1 < ns ? i + 1 : -1;
  }
  size_t hn = 0;
  for (int32_t i = 0; i + 1 < ns; i++) {
    const sm_pmap_ent *e = sm_pmap_get(&t->merges, c->sid[i], c->sid[i + 1]);
    if (e) heap_push(c, &hn, (hent){e->rank, i, e->id});
  }
  while (hn) {
    hent top = heap_pop(c, &hn);
    int32_t p = top.pos;
    if (c->slen[p] == 0) continue;
    int32_t nx = c->snext[p];
    if (nx < 0) continue;
    const sm_pmap_ent *e = sm_pmap_get(&t->merges, c->sid[p], c->sid[nx]);
    if (!e || e->id != top.id) continue;
    c->sid[p] = top.id;
    c->slen[p] += c->slen[nx];
    c->slen[nx] = 0;
    c->snext[p] = c->snext[nx];
    if (c->snext[nx] >= 0) c->sprev[c->snext[nx]] = p;
    if (c->sprev[p] >= 0) {
      const sm_pmap_ent *e2 = sm_pmap_get(&t->merges, c->sid[c->sprev[p]], c->sid[p]);
      if (e2) heap_push(c, &hn, (hent){e2->rank, c->sprev[p], e2->id});
    }
    if (c->snext[p] >= 0) {
      const sm_pmap_ent *e2 = sm_pmap_get(&t->merges, c->sid[p], c->sid[c->snext[p]]);
      if (e2) heap_push(c, &hn, (hent){e2->rank, p, e2->id});
    }
  }
  size_t first_out = out->n;
  for (int32_t i = ns ? 0 : -1; i >= 0; i = c->snext[i]) iv_push(out, c->sid[i]);
  if (ce) {
    size_t k = out->n - first_out;
    int32_t *ids = sm_xmalloc((k ? k : 1) * sizeof(int32_t));
    if (k) memcpy(ids, out->v + first_out, k * sizeof(int32_t)); /* a word may give no ids */
    char *wc = sm_xmalloc(n ? n : 1);
    memcpy(wc, w, n);
    pthread_mutex_lock(&tm->cache_mu);
    free(ce->word);
    free(ce->ids);
    ce->word = wc;
    ce->wlen = (uint32_t)n;
    ce->h = h;
    ce->ids = ids;
    ce->nids = (uint32_t)k;
    pthread_mutex_unlock(&tm->cache_mu);
  }
}

static bool ms_blocked(const smelt_tokenizer *t, uint32_t c) {
  for (int i = 0; i < t->n_ms_prev; i++)
    if (t->ms_prev[i] == c) return true;
  return false;
}
/* BPE of one pre-tokenized word; long SentencePiece-style words are cut at boundaries no merge can cross */
static void model_word(const smelt_tokenizer *t, ctx *c, const char *w, size_t n, ivec *out) {
  if (!t->ms_chunk || n < 8) {
    bpe_word(t, c, w, n, out, true);
    return;
  }
  if (t->ignore_merges) {
    int32_t id = sm_smap_get(&t->vocab, w, n);
    if (id >= 0) {
      iv_push(out, id);
      return;
    }
  }
  size_t a = 0;
  uint32_t prev = 0x2581;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int l = sm_utf8_dec(w + i, n - i, &cp);
    if (cp == 0x2581 && i > a && !ms_blocked(t, prev)) {
      bpe_word(t, c, w + a, i - a, out, false);
      a = i;
    }
    prev = cp;
    i += (size_t)l;
  }
  bpe_word(t, c, w + a, n - a, out, a == 0);
}

static void post_apply(const sm_post *p, ivec *body, ivec *res) {
  switch (p->type) {
    case POST_TEMPLATE:
    case POST_BERT:
      for (int i = 0; i < p->npre; i++) iv_push(res, p->pre[i]);
      for (size_t i = 0; i < body->n; i++) iv_push(res, body->v[i]);
      for (int i = 0; i < p->npost; i++) iv_push(res, p->post[i]);
      return;
    case POST_SEQ: {
      ivec a = {0};
      for (size_t i = 0; i < body->n; i++) iv_push(&a, body->v[i]);
      for (int k = 0; k < p->nkids; k++) {
        ivec b = {0};
        post_apply(&p->kids[k], &a, &b);
        free(a.v);
        a = b;
      }
      for (size_t i = 0; i < a.n; i++) iv_push(res, a.v[i]);
      free(a.v);
      return;
    }
    default:
      for (size_t i = 0; i < body->n; i++) iv_push(res, body->v[i]);
  }
}

smelt_status sm_tok_encode(const smelt_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                           size_t *n_ids) {
  pthread_once(&re_once, re_init);
  if (!gpt2_re || !ws_re) return sm_err(SMELT_ERR_BACKEND, "tokenizer: failed to compile built-in regexes");
  ctx c = {0};
  c.md = pcre2_match_data_create(4, NULL);
  sm_buf clean = {0};
  if (!sm_utf8_valid(text, len)) {
    sm_utf8_lossy(&clean, text, len);
    text = clean.p;
    len = clean.n;
  }
  plist a = {0}, b = {0};
  /* 1. split out non-normalized added tokens on the raw text */
  split_added(t, &t->trie_raw, text ? text : "", len, true, &a);
  /* 2. normalize each remaining piece, then split out normalized added tokens */
  sm_buf nb = {0};
  for (size_t k = 0; k < a.n; k++) {
    piece pc = a.v[k];
    if (pc.id >= 0) {
      pl_add(&b, 0, 0, pc.id, false);
      continue;
    }
    const char *s = a.buf.p + pc.off;
    size_t n = pc.len;
    if (t->normalizer) {
      sm_buf_clear(&nb);
      normalize_rec(t->normalizer, s, n, &nb, c.md);
      s = nb.p ? nb.p : "";
      n = nb.n;
    }
    if (!n) continue;
    split_added(t, &t->trie_norm, s, n, pc.first, &b);
  }
  sm_buf_free(&nb);
  /* 3. pre-tokenize */
  plist *words = &b;
  if (t->pretok) {
    pl_reset(&a);
    pretok_apply(t->pretok, &c, &b, &a);
    words = &a;
  }
  /* 4. model */
  ivec body = {0};
  for (size_t k = 0; k < words->n; k++) {
    piece pc = words->v[k];
    if (pc.id >= 0) {
      iv_push(&body, pc.id);
      continue;
    }
    if (pc.len) model_word(t, &c, words->buf.p + pc.off, pc.len, &body);
  }
  /* 5. post-process */
  ivec res = {0};
  if (add_special && t->post) {
    post_apply(t->post, &body, &res);
    free(body.v);
  } else res = body;
  pl_free(&a);
  pl_free(&b);
  sm_buf_free(&clean);
  pcre2_match_data_free(c.md);
  free(c.sid);
  free(c.slen);
  free(c.sprev);
  free(c.snext);
  free(c.heap);
  sm_buf_free(&c.tmp);
  sm_buf_free(&c.tmp2);
  if (!res.v) res.v = sm_xmalloc(sizeof(int32_t));
  *ids = res.v;
  *n_ids = res.n;
  return SMELT_OK;
}
