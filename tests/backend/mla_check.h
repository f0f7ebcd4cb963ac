/* A check of a backend's attention_mla (backend.h) against a double-precision reference on the host: two
 * sequences over shuffled 4-position blocks, a prefill batch of both then a decode batch, the cache of dtype dt
 * (the reference reads the rows as the cache holds them). Shared by tests/backend (CPU) and tests/cuda. Returns
 * max |out - ref| / max(1, max |ref|) over both steps, or -1 when the backend failed. */
#ifndef SM_TEST_MLA_CHECK_H
#define SM_TEST_MLA_CHECK_H
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"

static inline float mla_round(float x, sm_dtype dt) {
  if (dt == SM_DT_F16) return sm_f16_to_f32(sm_f32_to_f16(x));
  if (dt == SM_DT_BF16) return sm_bf16_to_f32(sm_f32_to_bf16(x));
  return x;
}

static inline float mla_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((*s >> 40) % 20001) / 10000.0f - 1.0f;
}

static inline double mla_check(sm_backend *be, int nh, int dc, int dr, sm_dtype dt) {
  enum { BS = 4, NB = 8, MAXB = 4 };
  const int D = dc + dr, lens[2] = {10, 6};
  const int32_t table[2 * MAXB] = {5, 2, 7, -1, 0, 6, -1, -1}; /* seq 0: blocks 5 2 7, seq 1: 0 6 */
  sm_kv_cache kv = {.n_layers = 2, .n_kv_heads = 1, .head_dim = D, .block_size = BS, .n_blocks = NB, .dtype = dt};
  void *bufs[2] = {NULL, NULL}, *vb[2];
  const size_t cache_bytes = (size_t)NB * BS * sm_dtype_size(dt) * (size_t)D;
  bufs[1] = be->alloc(be, cache_bytes);
  vb[0] = NULL;
  vb[1] = bufs[1];
  kv.k = bufs;
  kv.v = vb;
  const int layer = 1;
  /* all tokens: seq 0 positions 0..10, seq 1 positions 0..6 (the last of each in the decode step) */
  const int ntot = lens[0] + 1 + lens[1] + 1;
  uint64_t rs = 42;
  float *ql = malloc(sizeof(float) * (size_t)ntot * nh * dc), *qp = malloc(sizeof(float) * (size_t)ntot * nh * dr);
  float *c = malloc(sizeof(float) * (size_t)ntot * dc), *kp = malloc(sizeof(float) * (size_t)ntot * dr);
  for (size_t i = 0; i < (size_t)ntot * nh * dc; i++) ql[i] = mla_rand(&rs) * 0.3f;
  for (size_t i = 0; i < (size_t)ntot * nh * dr; i++) qp[i] = mla_rand(&rs);
  for (size_t i = 0; i < (size_t)ntot * dc; i++) c[i] = mla_rand(&rs);
  for (size_t i = 0; i < (size_t)ntot * dr; i++) kp[i] = mla_rand(&rs);
  /* token order: step 1 = seq 0 positions 0..9 then seq 1 positions 0..5; step 2 = seq 0 pos 10, seq 1 pos 6 */
  int32_t seq[32], pos[32];
  int n = 0;
  for (int s = 0; s < 2; s++)
    for (int p = 0; p < lens[s]; p++) seq[n] = s, pos[n++] = p;
  for (int s = 0; s < 2; s++) seq[n] = s, pos[n++] = lens[s];
  const float scale = 1.0f / sqrtf((float)(dc / 4 + dr));
  const size_t fq = sizeof(float) * (size_t)nh;
  float *dql = be->alloc(be, fq * dc * ntot), *dqp = be->alloc(be, fq * dr * ntot);
  float *dc_ = be->alloc(be, sizeof(float) * (size_t)dc * ntot),
        *dkp = be->alloc(be, sizeof(float) * (size_t)dr * ntot);
  float *dout = be->alloc(be, fq * dc * ntot), *out = malloc(fq * dc * ntot);
  be->upload(be, dql, ql, fq * dc * ntot);
  be->upload(be, dqp, qp, fq * dr * ntot);
  be->upload(be, dc_, c, sizeof(float) * (size_t)dc * ntot);
  be->upload(be, dkp, kp, sizeof(float) * (size_t)dr * ntot);
  int32_t tok[32] = {0};
  double worst = 0;
  for (int step = 0; step < 2; step++) {
    const int t0 = step ? lens[0] + lens[1] : 0, nt = step ? 2 : lens[0] + lens[1];
    sm_batch b = {.n_tokens = nt,
                  .tokens = tok,
                  .pos = pos + t0,
                  .seq = seq + t0,
                  .n_seqs = 2,
                  .max_blocks = MAXB,
                  .block_table = table};
    if (be->set_batch(be, &b) != SMELT_OK) return -1;
    be->attention_mla(be, dout + (size_t)t0 * nh * dc, dql + (size_t)t0 * nh * dc, dqp + (size_t)t0 * nh * dr,
                      dc_ + (size_t)t0 * dc, dkp + (size_t)t0 * dr, &kv, layer, nh, dr, scale);
    be->download(be, out + (size_t)t0 * nh * dc, dout + (size_t)t0 * nh * dc, fq * dc * nt);
    for (int i = t0; i < t0 + nt; i++)
      for (int h = 0; h < nh; h++) {
        /* the rows of positions 0..pos[i] of seq[i]: tokens j with that sequence and position */
        double sc[16], mx = -1e300, z = 0, ref[1024] = {0}, big = 1;
        int js[16], nj = 0;
        for (int j = 0; j < ntot; j++)
          if (seq[j] == seq[i] && pos[j] <= pos[i]) js[nj++] = j;
        for (int u = 0; u < nj; u++) {
          const int j = js[u];
          double d = 0;
          for (int e = 0; e < dc; e++)
            d += (double)ql[((size_t)i * nh + h) * dc + e] * mla_round(c[(size_t)j * dc + e], dt);
          for (int e = 0; e < dr; e++)
            d += (double)qp[((size_t)i * nh + h) * dr + e] * mla_round(kp[(size_t)j * dr + e], dt);
          sc[u] = d * scale;
          if (sc[u] > mx) mx = sc[u];
        }
        for (int u = 0; u < nj; u++) z += sc[u] = exp(sc[u] - mx);
        for (int u = 0; u < nj; u++)
          for (int e = 0; e < dc; e++) ref[e] += sc[u] / z * mla_round(c[(size_t)js[u] * dc + e], dt);
        double err = 0;
        for (int e = 0; e < dc; e++) {
          err = fmax(err, fabs(out[((size_t)i * nh + h) * dc + e] - ref[e]));
          big = fmax(big, fabs(ref[e]));
        }
        if (!(err / big <= worst)) worst = err / big; /* NaN propagates */
      }
  }
  be->free(be, dql);
  be->free(be, dqp);
  be->free(be, dc_);
  be->free(be, dkp);
  be->free(be, dout);
  be->free(be, bufs[1]);
  free(ql);
  free(qp);
  free(c);
  free(kp);
  free(out);
  return worst;
}
#endif
