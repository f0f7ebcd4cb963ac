/* Shared bodies of the fuzz targets (libFuzzer entry points and the fuzz_smoke replay test).
 * Each returns normally on any input; a violated invariant calls FUZZ_FAIL (trap under
 * libFuzzer so the crash is recorded, a counted failure in fuzz_smoke). */
#ifndef SM_FUZZ_TARGETS_H
#define SM_FUZZ_TARGETS_H
#include "format/config.h"
#include "model/family.h"
#include "format/safetensors.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef FUZZ_FAIL
#define FUZZ_FAIL(msg) __builtin_trap()
#endif

static volatile unsigned g_fuzz_sink;

/* parse a safetensors image and walk every tensor */
__attribute__((unused)) static void fuzz_safetensors_one(const uint8_t *data, size_t size) {
  sm_st *st = NULL;
  smelt_status rc = sm_st_parse_buffer(data, size, &st);
  if (rc != SMELT_OK) {
    if (st) FUZZ_FAIL("failed parse returned an object");
    if (!sm_errmsg()[0]) FUZZ_FAIL("failed parse without a message");
    return;
  }
  size_t total = 0;
  for (size_t i = 0; i < sm_st_count(st); i++) {
    const sm_tensor *t = sm_st_at(st, i);
    if (!t || !t->name) {
      FUZZ_FAIL("missing tensor");
      continue;
    }
    if (sm_st_find(st, t->name) != t) FUZZ_FAIL("lookup mismatch");
    if (t->ndim < 0 || t->ndim > SM_ST_MAX_DIMS || (unsigned)t->dtype >= SM_DT_COUNT) FUZZ_FAIL("bad dims/dtype");
    uint64_t n = sm_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] < 0) FUZZ_FAIL("negative dim");
      n *= (uint64_t)t->shape[d]; /* cannot overflow: the parser checked */
    }
    if (n != t->nbytes) FUZZ_FAIL("nbytes != shape * dtype size");
    const uint8_t *p = t->data;
    if (p < data || p > data + size || t->nbytes > (size_t)(data + size - p)) FUZZ_FAIL("data outside the buffer");
    if (t->nbytes) g_fuzz_sink += p[0] + p[t->nbytes - 1]; /* ASan checks these reads */
    total += t->nbytes;
  }
  if (total != sm_st_total_bytes(st)) FUZZ_FAIL("total bytes");
  if (sm_st_at(st, sm_st_count(st)) != NULL) FUZZ_FAIL("at() past the end");
  sm_st_close(st);
}

/* input: config.json text, optionally followed by a NUL byte and generation_config.json text */
__attribute__((unused)) static void fuzz_config_one(const uint8_t *data, size_t size) {
  const char *cfg = (const char *)data, *gen = NULL;
  size_t clen = size, glen = 0;
  const char *z = memchr(data, 0, size);
  if (z) {
    clen = (size_t)(z - cfg);
    gen = z + 1;
    glen = size - clen - 1;
  }
  sm_config c;
  smelt_status rc = sm_config_parse(cfg, clen, gen, glen, sm_family_defaults, &c);
  if (rc != SMELT_OK) {
    if (c.json) FUZZ_FAIL("failed parse kept json");
    if (!sm_errmsg()[0]) FUZZ_FAIL("failed parse without a message");
    return;
  }
  if (c.hidden_size <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 || c.head_dim <= 0 ||
      c.vocab_size <= 0 || c.num_hidden_layers <= 0 || c.intermediate_size <= 0 || c.max_position_embeddings <= 0 ||
      c.num_attention_heads % c.num_key_value_heads || c.partial_rotary_dim <= 0 || c.partial_rotary_dim > c.head_dim ||
      c.n_eos < 0 || c.n_eos > 16 || !(c.rms_norm_eps > 0) || !(c.rope_theta > 0) || c.sliding_window < 0)
    FUZZ_FAIL("accepted config violates invariants");
  if (memchr(c.model_type, 0, sizeof c.model_type) == NULL || memchr(c.hidden_act, 0, sizeof c.hidden_act) == NULL)
    FUZZ_FAIL("unterminated string");
  static const char *mods[] = {"model.embed_tokens",
                               "lm_head",
                               "model.layers.0.mlp.down_proj.weight",
                               "language_model.model.layers.0.self_attn.q_proj",
                               "",
                               "x"};
  for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
    int b = -1, g = -1;
    sm_config_quant_for(&c, mods[i], &b, &g);
    if (b != 0 && !(b >= 2 && b <= 8 && (g == 32 || g == 64 || g == 128))) FUZZ_FAIL("bad quant params");
    if (b == 0 && g != 0) FUZZ_FAIL("group size without bits");
  }
  sm_config_free(&c);
}
#endif
