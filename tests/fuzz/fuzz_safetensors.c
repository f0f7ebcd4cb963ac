/* libFuzzer target: safetensors header parser (build with -DSMELT_FUZZ=ON, clang). */
#include "fuzz_targets.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_safetensors_one(data, size);
  return 0;
}
