/* The CPU backend's multi-head latent attention (backend.h attention_mla) against a double-precision
 * reference (mla_check.h): paged blocks of two sequences, prefill then decode, f32 / f16 / bf16 latent caches. */
#include "backend/backend.h"
#include "mla_check.h"
#include "../test_util.h"

int main(void) {
  sm_backend *be = sm_cpu_backend_create(2);
  CHECK(be && be->attention_mla, "cpu backend with attention_mla");
  if (!be) TEST_END();
  const sm_dtype dts[3] = {SM_DT_F32, SM_DT_F16, SM_DT_BF16};
  const int shapes[3][3] = {{5, 64, 16}, {16, 512, 64}, {1, 32, 8}}; /* heads, kv_lora_rank, rope dims */
  for (int s = 0; s < 3; s++)
    for (int d = 0; d < 3; d++) {
      const double e = mla_check(be, shapes[s][0], shapes[s][1], shapes[s][2], dts[d]);
      CHECK(e >= 0 && e < 1e-5, "attention_mla %d heads, dc %d, dr %d, dtype %s: error %.3g", shapes[s][0],
            shapes[s][1], shapes[s][2], sm_dtype_name(dts[d]), e);
    }
  be->destroy(be);
  TEST_END();
}
