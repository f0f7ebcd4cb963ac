/* The KV cache type flags shared by the commands: llama-server's --cache-type-k / -ctk and
 * --cache-type-v / -ctv (one type for both: smelt keeps K and V in the same element type). */
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"

void sm_cli_kv_alias(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-ctk")) argv[i] = "--cache-type-k";
    else if (!strcmp(argv[i], "-ctv")) argv[i] = "--cache-type-v";
    else if (!strcmp(argv[i], "-tp")) argv[i] = "--tensor-parallel";
    else if (!strcmp(argv[i], "-pp")) argv[i] = "--pipeline-parallel";
  }
}

int sm_cli_kv_type(const char *cmd, const char *k, const char *v, smelt_kv_type *out) {
  if (k && v && strcmp(k, v) != 0) {
    fprintf(stderr,
            "smelt %s: --cache-type-k %s and --cache-type-v %s differ; smelt keeps K and V in one type "
            "(f16, bf16, f32, q8_0 or q4_0)\n",
            cmd, k, v);
    return 2;
  }
  const char *t = k ? k : v;
  if (!t) return 0;
  if (smelt_kv_type_parse(t, out) != SMELT_OK) {
    fprintf(stderr, "smelt %s: %s\n", cmd, smelt_last_error());
    return 2;
  }
  return 0;
}
