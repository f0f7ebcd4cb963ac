/* The CUDA backend's ops with explicit shapes (attention_seg, rope_axes, gelu, gather_rows, copy) and
 * its attention with widened spans (sm_batch.attn_span: bidirectional image tokens) against the CPU
 * backend. Exits 77 (ctest SKIP) without CUDA or a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../test_util.h"
#include "backend/backend.h"

#ifndef SMELT_HAVE_CUDA
int main(void) {
  printf("SKIP: built without CUDA\n");
  return 77;
}
#else

static sm_backend *G, *C, *G32; /* G32: SMELT_CUDA_ATTN_FA=0, the f32 kernels */
static uint64_t g_rng = 0x5eed;
static float frand(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}
static void fill(float *p, size_t n, float a) {
  for (size_t i = 0; i < n; i++) p[i] = a * frand();
}
static void *dup_dev(const void *h, size_t bytes) {
  void *d = G->alloc(G, bytes);
  G->upload(G, d, h, bytes);
  return d;
}
static float *get_from(sm_backend *be, const float *d, size_t n) {
  float *h = malloc(n * 4);
  be->download(be, h, d, n * 4);
  return h;
}
static float *get(const float *d, size_t n) { return get_from(G, d, n); }
static double rel_l2(const float *a, const float *b, size_t n) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < n; i++) {
    const double d = (double)a[i] - b[i];
    if (d != d) return INFINITY;
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return sqrt(num / den);
}

static void test_attention_seg(int n, int nh, int nkv, int hd, const int32_t *seg, int n_seg) {
  const size_t nq = (size_t)n * nh * hd, nk = (size_t)n * nkv * hd;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *o = malloc(nq * 4);
  fill(q, nq, 2.f);
  fill(k, nk, 2.f);
  fill(v, nk, 1.f);
  float *dq = dup_dev(q, nq * 4), *dk = dup_dev(k, nk * 4), *dv = dup_dev(v, nk * 4), *dout = G->alloc(G, nq * 4);
  const float scale = 1.f / sqrtf((float)hd);
  C->attention_seg(C, o, q, k, v, n, nh, nkv, hd, scale, seg, n_seg);
  G->attention_seg(G, dout, dq, dk, dv, n, nh, nkv, hd, scale, seg, n_seg);
  float *h = get(dout, nq);
  const double e = rel_l2(h, o, nq);
  /* head dims that are multiples of 8 up to 128 run on tensor cores (f16 operands) */
  const bool tc = hd % 8 == 0 && hd <= 128;
  CHECK(e < (tc ? 2e-3 : 1e-5), "attention_seg n %d heads %d/%d hd %d segments %d: rel err %g", n, nh, nkv, hd, n_seg,
        e);
  /* the f32 kernel (SMELT_CUDA_ATTN_FA=0) stays exact, and differs from the tensor-core one where that ran */
  G32->attention_seg(G32, dout, dq, dk, dv, n, nh, nkv, hd, scale, seg, n_seg);
  float *h32 = get_from(G32, dout, nq);
  const double e32 = rel_l2(h32, o, nq);
  CHECK(e32 < 1e-5, "attention_seg f32 kernel n %d hd %d: rel err %g", n, hd, e32);
  CHECK(tc == (rel_l2(h, h32, nq) > 0), "attention_seg hd %d: tensor-core path %s", hd, tc ? "did not run" : "ran");
  free(h32);
  free(h);
  free(q);
  free(k);
  free(v);
  free(o);
  G->free(G, dq);
  G->free(G, dk);
  G->free(G, dv);
  G->free(G, dout);
}

static void test_small_ops(void) {
  /* rope_axes: 3 axes (M-RoPE), 2 axes with a repeated table (vision) */
  const int n = 37, nh = 5, hd = 80, rot = 64, half = rot / 2;
  const size_t N = (size_t)n * nh * hd;
  float *x = malloc(N * 4), inv[32];
  int32_t axis[32], pos[3 * 37];
  fill(x, N, 1.f);
  for (int i = 0; i < half; i++) {
    inv[i] = powf(1000.f, -(float)i / half);
    axis[i] = i % 3;
  }
  for (int i = 0; i < 3 * n; i++) pos[i] = (i * 131) % 900;
  float *dx = dup_dev(x, N * 4), *dinv = dup_dev(inv, sizeof inv);
  int32_t *dax = dup_dev(axis, sizeof axis), *dpos = dup_dev(pos, sizeof pos);
  C->rope_axes(C, x, n, nh, hd, rot, inv, axis, pos);
  G->rope_axes(G, dx, n, nh, hd, rot, dinv, dax, dpos);
  float *h = get(dx, N);
  CHECK(rel_l2(h, x, N) < 1e-5, "rope_axes: rel err %g", rel_l2(h, x, N));
  free(h);
  /* gelu (the three forms), gather_rows, copy */
  const size_t M = 100003;
  float *a = malloc(M * 4), *r = malloc(M * 4);
  fill(a, M, 5.f);
  float *da = dup_dev(a, M * 4), *dr = G->alloc(G, M * 4);
  for (int t = SM_GELU_ERF; t <= SM_GELU_QUICK; t++) {
    C->gelu(C, r, a, M, t);
    G->gelu(G, dr, da, M, t);
    h = get(dr, M);
    CHECK(rel_l2(h, r, M) < 1e-6, "gelu (kind %d): rel err %g", t, rel_l2(h, r, M));
    free(h);
  }
  int32_t idx[7] = {5, 0, 36, 36, 12, 1, 30};
  int32_t *didx = dup_dev(idx, sizeof idx);
  const int dim = nh * hd;
  float *gr = malloc(7 * (size_t)dim * 4), *dg = G->alloc(G, 7 * (size_t)dim * 4);
  C->gather_rows(C, gr, x, idx, 7, dim);
  G->gather_rows(G, dg, dx, didx, 7, dim);
  h = get(dg, 7 * (size_t)dim);
  CHECK(rel_l2(h, gr, 7 * (size_t)dim) < 1e-5, "gather_rows");
  free(h);
  G->copy(G, dr, da + 3, 5000 * sizeof(float));
  h = get(dr, 5000);
  CHECK(!memcmp(h, a + 3, 5000 * 4), "copy");
  free(h);
  G->free(G, dx);
  G->free(G, dinv);
  G->free(G, dax);
  G->free(G, dpos);
  G->free(G, da);
  G->free(G, dr);
  G->free(G, didx);
  G->free(G, dg);
  free(x);
  free(a);
  free(r);
  free(gr);
}

/* attention over a paged cache with attn_span: a prefill of n tokens of one sequence (a cached prefix
 * of p0 positions) where tokens [g0, g1) see each other, next to a decoding sequence */
static void test_attention_span(int nh, int nkv, int hd, int window, int p0, int n, int g0, int g1) {
  const int bs = 16, max_blocks = 64, n_blocks = 128, row = nkv * hd, nt = n + 1;
  int32_t *tok = calloc(nt, 4), *pos = malloc(nt * 4), *seq = malloc(nt * 4), *span = malloc(2 * nt * 4);
  int32_t table[2 * 64];
  for (int i = 0; i < 2 * max_blocks; i++) table[i] = (i * 37) % n_blocks;
  for (int t = 0; t < n; t++) {
    pos[t] = p0 + t;
    seq[t] = 0;
    const bool in = pos[t] >= g0 && pos[t] < g1;
    span[2 * t] = in ? g0 : pos[t];
    span[2 * t + 1] = in ? g1 - 1 : pos[t];
  }
  pos[n] = 50;
  seq[n] = 1;
  span[2 * n] = span[2 * n + 1] = 50;
  sm_batch b = {.n_tokens = nt,
                .tokens = tok,
                .pos = pos,
                .seq = seq,
                .n_seqs = 2,
                .max_blocks = max_blocks,
                .block_table = table,
                .attn_span = span};
  const size_t cache = (size_t)n_blocks * bs * row;
  float *kc = malloc(cache * 4);
  fill(kc, cache, 1.f);
  void *ck[1] = {malloc(cache * 4)}, *cv[1] = {malloc(cache * 4)}, *gk[1], *gv[1];
  memcpy(ck[0], kc, cache * 4);
  fill(kc, cache, 1.f);
  memcpy(cv[0], kc, cache * 4);
  gk[0] = dup_dev(ck[0], cache * 4);
  gv[0] = dup_dev(cv[0], cache * 4);
  sm_kv_cache kvc = {.n_layers = 1,
                     .n_kv_heads = nkv,
                     .head_dim = hd,
                     .block_size = bs,
                     .n_blocks = n_blocks,
                     .dtype = SM_DT_F32,
                     .k = ck,
                     .v = cv};
  sm_kv_cache kvg = kvc;
  kvg.k = gk;
  kvg.v = gv;
  const size_t nq = (size_t)nt * nh * hd, nk = (size_t)nt * row;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *o = malloc(nq * 4);
  fill(q, nq, 2.f);
  fill(k, nk, 1.f);
  fill(v, nk, 1.f);
  float *dq = dup_dev(q, nq * 4), *dk = dup_dev(k, nk * 4), *dv = dup_dev(v, nk * 4), *dout = G->alloc(G, nq * 4);
  CHECK(C->set_batch(C, &b) == SMELT_OK && G->set_batch(G, &b) == SMELT_OK, "set_batch: %s", smelt_last_error());
  C->kv_store(C, &kvc, 0, k, v);
  G->kv_store(G, &kvg, 0, dk, dv);
  const float scale = 1.f / sqrtf((float)hd);
  C->attention(C, o, q, &kvc, 0, nh, scale, window, 0.f);
  G->attention(G, dout, dq, &kvg, 0, nh, scale, window, 0.f);
  float *h = get(dout, nq);
  const double e = rel_l2(h, o, nq);
  /* prefill attention runs on tensor cores (f16/bf16 operands) where the head dim has an instance */
  const bool fa = hd == 64 || hd == 80 || hd == 96 || hd == 128 || hd == 256;
  CHECK(e < (fa ? 2e-3 : 1e-5), "attention with spans heads %d/%d hd %d window %d group [%d, %d): rel err %g", nh, nkv,
        hd, window, g0, g1, e);
  /* the span matters: the same batch without it differs */
  b.attn_span = NULL;
  CHECK(C->set_batch(C, &b) == SMELT_OK, "set_batch");
  float *o2 = malloc(nq * 4);
  C->attention(C, o2, q, &kvc, 0, nh, scale, window, 0.f);
  CHECK(rel_l2(o2, o, nq) > 1e-3, "attention spans change the result (%g)", rel_l2(o2, o, nq));
  free(o2);
  free(h);
  free(q);
  free(k);
  free(v);
  free(o);
  free(kc);
  free(tok);
  free(pos);
  free(seq);
  free(span);
  free(ck[0]);
  free(cv[0]);
  G->free(G, gk[0]);
  G->free(G, gv[0]);
  G->free(G, dq);
  G->free(G, dk);
  G->free(G, dv);
  G->free(G, dout);
}

int main(void) {
  G = sm_cuda_backend_create(0);
  if (!G) {
    printf("SKIP: no usable CUDA device (%s)\n", smelt_last_error());
    return 77;
  }
  C = sm_cpu_backend_create(0);
  setenv("SMELT_CUDA_ATTN_FA", "0", 1);
  G32 = sm_cuda_backend_create(0);
  unsetenv("SMELT_CUDA_ATTN_FA");
  CHECK(G32 != NULL, "second CUDA backend: %s", smelt_last_error());
  if (!G32) TEST_END();
  const int32_t one[] = {0, 1000}, win[] = {0, 64, 128, 192, 200, 256, 320, 384}, odd[] = {0, 1, 33, 34, 100};
  test_attention_seg(1000, 16, 16, 80, one, 1);                      /* Qwen2.5-VL ViT head */
  test_attention_seg(384, 16, 16, 80, win, 7);                       /* windows (one short) */
  test_attention_seg(100, 4, 2, 72, odd, 4);                         /* SigLIP head dim, GQA, 1-token segment */
  test_attention_seg(257, 16, 16, 64, (const int32_t[]){0, 257}, 1); /* Pixtral */
  test_attention_seg(50, 2, 2, 16, (const int32_t[]){0, 20, 50}, 2);
  test_attention_seg(130, 8, 8, 128, (const int32_t[]){0, 130}, 1);
  test_attention_seg(300, 4, 4, 80, (const int32_t[]){0, 37, 101, 150, 230, 300}, 5); /* windows across blocks */
  test_attention_seg(1100, 4, 4, 72, (const int32_t[]){0, 1100}, 1);                  /* SigLIP: many key steps */
  test_attention_seg(70, 2, 2, 36, (const int32_t[]){0, 70}, 1);                      /* the f32 kernel only */
  test_small_ops();
  test_attention_span(8, 4, 64, 0, 0, 300, 10, 266); /* Gemma-like: 256 image tokens after a prefix */
  test_attention_span(8, 4, 256, 20, 5, 80, 20, 60); /* a window shorter than the group */
  test_attention_span(4, 2, 16, 0, 30, 40, 20, 50);  /* the group started in the cache */
  C->destroy(C);
  G32->destroy(G32);
  G->destroy(G);
  TEST_END();
}
#endif
