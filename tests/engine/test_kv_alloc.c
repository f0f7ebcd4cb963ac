/* The memory estimate (smelt inspect, --estimate-memory, the server's model budget) counts exactly the
 * KV bytes the engine allocates, for every KV cache type: sm_kv_alloc's backend allocations are
 * summed through a wrapper of the backend's alloc and compared with sm_store_estimate's kv_bytes. */
#include <string.h>
#include "backend/backend.h"
#include "model/model.h"
#include "store/store.h"
#include "../test_util.h"

static void *(*g_alloc)(sm_backend *be, size_t bytes);
static size_t g_bytes;
static void *counting_alloc(sm_backend *be, size_t bytes) {
  g_bytes += bytes;
  return g_alloc(be, bytes);
}

int main(int argc, char **argv) {
  const char *src = argc > 1 ? argv[1] : ".";
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/models/smelt-tiny", src);
  const smelt_kv_type types[] = {SMELT_KV_F16, SMELT_KV_BF16, SMELT_KV_F32, SMELT_KV_Q8_0, SMELT_KV_Q4_0};
  size_t per_tok[5] = {0};
  enum { BLOCKS = 5, BS = 16 };
  for (int i = 0; i < 5; i++) {
    smelt_model_params p;
    smelt_model_params_default(&p);
    p.device = SMELT_DEVICE_CPU;
    p.kv_type = types[i];
    p.max_context = 256;
    smelt_model *m = NULL;
    if (smelt_model_load(dir, &p, &m)) {
      CHECK(0, "load %s: %s", smelt_kv_type_name(types[i]), smelt_last_error());
      continue;
    }
    sm_mem_estimate est;
    CHECK(sm_store_estimate(dir, BLOCKS * BS, types[i], false, &est) == SMELT_OK, "estimate: %s", smelt_last_error());
    g_alloc = m->be->alloc;
    m->be->alloc = counting_alloc;
    g_bytes = 0;
    sm_kv_cache kv;
    CHECK(sm_kv_alloc(m, BLOCKS, BS, 0, &kv) == SMELT_OK, "kv alloc: %s", smelt_last_error());
    m->be->alloc = g_alloc;
    printf("KV %-4s: %zu bytes a token allocated, %llu estimated\n", smelt_kv_type_name(types[i]),
           g_bytes / (BLOCKS * BS), (unsigned long long)est.kv_bytes_per_token);
    CHECK(g_bytes == est.kv_bytes && est.kv_bytes == est.kv_bytes_per_token * BLOCKS * BS,
          "%s: allocated %zu bytes, estimated %llu", smelt_kv_type_name(types[i]), g_bytes,
          (unsigned long long)est.kv_bytes);
    per_tok[i] = g_bytes / (BLOCKS * BS);
    sm_kv_free(m, &kv);
    smelt_model_free(m);
  }
  /* the types' sizes against each other: bf16 = f16 = f32 / 2; q8_0 ~ 17/32 of f16 and q4_0 ~ 9/32 (the
   * built-in model's head_dim of 64 needs no padding: 64 + 4 and 32 + 4 bytes a head row) */
  CHECK(per_tok[1] == per_tok[0] && per_tok[2] == 2 * per_tok[0], "f16 %zu bf16 %zu f32 %zu", per_tok[0], per_tok[1],
        per_tok[2]);
  CHECK(per_tok[3] * 128 == per_tok[0] * 68 && per_tok[4] * 128 == per_tok[0] * 36, "f16 %zu q8_0 %zu q4_0 %zu",
        per_tok[0], per_tok[3], per_tok[4]);
  TEST_END();
}
