/* Tokenizer utilities: UTF-8, hash maps, byte-level alphabet. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_props.h"

int sm_utf8_dec(const char *s, size_t n, uint32_t *cp) {
  const uint8_t *u = (const uint8_t *)s;
  uint8_t c = u[0];
  if (c < 0x80 || n < 2) {
    *cp = c;
    return 1;
  }
  if (c < 0xE0) {
    *cp = ((uint32_t)(c & 0x1F) << 6) | (u[1] & 0x3F);
    return 2;
  }
  if (c < 0xF0 || n < 4) {
    if (n < 3) {
      *cp = c;
      return 1;
    }
    *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    return 3;
  }
  *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
  return 4;
}

/* length of the valid sequence at s, or -k where k (>=1) is the maximal invalid subpart */
static int utf8_check(const uint8_t *s, size_t n) {
  uint8_t c = s[0];
  if (c < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) {
    need = 2;
    lo = 0xA0;
  } else if (c >= 0xE1 && c <= 0xEC) need = 2;
  else if (c == 0xED) {
    need = 2;
    hi = 0x9F;
  } else if (c >= 0xEE && c <= 0xEF) need = 2;
  else if (c == 0xF0) {
    need = 3;
    lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else if (c == 0xF4) {
    need = 3;
    hi = 0x8F;
  } else return -1;
  for (int i = 1; i <= need; i++) {
    if ((size_t)i >= n) return -i;
    uint8_t x = s[i];
    if (i == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return -i;
  }
  return need + 1;
}
bool sm_utf8_valid(const char *s, size_t n) {
  const uint8_t *u = (const uint8_t *)s;
  size_t i = 0;
  while (i < n) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    int k = utf8_check(u + i, n - i);
    if (k < 0) return false;
    i += (size_t)k;
  }
  return true;
}
void sm_utf8_lossy(sm_buf *out, const char *s, size_t n) {
  const uint8_t *u = (const uint8_t *)s;
  size_t i = 0, run = 0;
  sm_buf_reserve(out, n);
  while (i < n) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    int k = utf8_check(u + i, n - i);
    if (k > 0) {
      i += (size_t)k;
      continue;
    }
    sm_buf_put(out, s + run, i - run);
    sm_buf_put(out, "\xEF\xBF\xBD", 3);
    i += (size_t)(-k);
    run = i;
  }
  sm_buf_put(out, s + run, n - run);
}

bool sm_uc_is_whitespace(uint32_t c) {
  if (c >= 0x09 && c <= 0x0D) return true;
  switch (c) {
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}
bool sm_uc_is_numeric(uint32_t c) { return sm_uc_rust_is_numeric(c); }
bool sm_uc_is_alnum(uint32_t c) { return sm_uc_rust_is_alphanumeric(c); }

/* ---- hashing / maps ---- */
uint64_t sm_hash_bytes(const void *p, size_t n) {
  const uint8_t *s = p;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t x;
    memcpy(&x, s, 8);
    h = (h ^ x) * 0x100000001B3ull;
    h ^= h >> 29;
    s += 8;
    n -= 8;
  }
  uint64_t x = 0;
  memcpy(&x, s, n);
  h = (h ^ x) * 0x100000001B3ull;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}
static void smap_grow(sm_smap *m) {
  size_t nc = m->cap ? m->cap * 2 : 1024;
  sm_smap_ent *ne = sm_xcalloc(nc, sizeof *ne);
  for (size_t i = 0; i < m->cap; i++) {
    sm_smap_ent *e = &m->e[i];
    if (!e->k) continue;
    size_t j = sm_hash_bytes(e->k, e->klen) & (nc - 1);
    while (ne[j].k) j = (j + 1) & (nc - 1);
    ne[j] = *e;
  }
  free(m->e);
  m->e = ne;
  m->cap = nc;
}
void sm_smap_put(sm_smap *m, const char *k, size_t klen, int32_t v) {
  if ((m->n + 1) * 2 > m->cap) smap_grow(m);
  size_t j = sm_hash_bytes(k, klen) & (m->cap - 1);
  while (m->e[j].k) {
    if (m->e[j].klen == klen && memcmp(m->e[j].k, k, klen) == 0) {
      m->e[j].v = v;
      return;
    }
    j = (j + 1) & (m->cap - 1);
  }
  m->e[j].k = k;
  m->e[j].klen = (uint32_t)klen;
  m->e[j].v = v;
  m->n++;
}
int32_t sm_smap_get(const sm_smap *m, const char *k, size_t klen) {
  if (!m->cap) return -1;
  size_t j = sm_hash_bytes(k, klen) & (m->cap - 1);
  while (m->e[j].k) {
    if (m->e[j].klen == klen && memcmp(m->e[j].k, k, klen) == 0) return m->e[j].v;
    j = (j + 1) & (m->cap - 1);
  }
  return -1;
}
void sm_smap_free(sm_smap *m) {
  free(m->e);
  memset(m, 0, sizeof *m);
}

static inline uint64_t pair_hash(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}
#define PMAP_EMPTY UINT64_MAX
static void pmap_grow(sm_pmap *m) {
  size_t nc = m->cap ? m->cap * 2 : 1024;
  sm_pmap_ent *ne = sm_xmalloc(nc * sizeof *ne);
  for (size_t i = 0; i < nc; i++) ne[i].k = PMAP_EMPTY;
  for (size_t i = 0; i < m->cap; i++) {
    if (m->e[i].k == PMAP_EMPTY) continue;
    size_t j = pair_hash(m->e[i].k) & (nc - 1);
    while (ne[j].k != PMAP_EMPTY) j = (j + 1) & (nc - 1);
    ne[j] = m->e[i];
  }
  free(m->e);
  m->e = ne;
  m->cap = nc;
}
void sm_pmap_put(sm_pmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
  if ((m->n + 1) * 2 > m->cap) pmap_grow(m);
  uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  size_t j = pair_hash(k) & (m->cap - 1);
  while (m->e[j].k != PMAP_EMPTY) {
    if (m->e[j].k == k) {
      m->e[j].rank = rank;
      m->e[j].id = id;
      return;
    }
    j = (j + 1) & (m->cap - 1);
  }
  m->e[j].k = k;
  m->e[j].rank = rank;
  m->e[j].id = id;
  m->n++;
}
const sm_pmap_ent *sm_pmap_get(const sm_pmap *m, int32_t a, int32_t b) {
  if (!m->cap) return NULL;
  uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  size_t j = pair_hash(k) & (m->cap - 1);
  while (m->e[j].k != PMAP_EMPTY) {
    if (m->e[j].k == k) return &m->e[j];
    j = (j + 1) & (m->cap - 1);
  }
  return NULL;
}
void sm_pmap_free(sm_pmap *m) {
  free(m->e);
  memset(m, 0, sizeof *m);
}

/* ---- GPT-2 byte-level alphabet ---- */
char sm_bl_enc[256][3];
uint8_t sm_bl_enc_len[256];
static int16_t bl_dec[512];
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;
static void bl_init_once(void) {
  for (int i = 0; i < 512; i++) bl_dec[i] = -1;
  int n = 0;
  for (int b = 0; b < 256; b++) {
    bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    bl_dec[cp] = (int16_t)b;
    if (cp < 0x80) {
      sm_bl_enc[b][0] = (char)cp;
      sm_bl_enc_len[b] = 1;
    } else {
      sm_bl_enc[b][0] = (char)(0xC0 | (cp >> 6));
      sm_bl_enc[b][1] = (char)(0x80 | (cp & 0x3F));
      sm_bl_enc_len[b] = 2;
    }
  }
}
void sm_bl_init(void) { pthread_once(&bl_once, bl_init_once); }
int sm_bl_dec(uint32_t cp) { return cp < 512 ? bl_dec[cp] : -1; }
