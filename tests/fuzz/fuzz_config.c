/* libFuzzer target: config.json (+ NUL + generation_config.json) parser. */
#include "fuzz_targets.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_config_one(data, size);
  return 0;
}
