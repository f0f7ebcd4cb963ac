/* Test driver: dispatches `store_cli <cmd> args...` to the store subcommands of
 * src/cli/cmd_store.c, so the store CLI is testable without the rest of the binary. */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "cli/cli.h"
#include "store/store.h"

/* `store_cli resolve REF`: what run/generate do with -m (auto-download on first use) */
static int cmd_resolve(int argc, char **argv) {
  char *dir = NULL;
  if (sm_store_resolve(argc > 1 ? argv[1] : NULL, true, &dir)) {
    fprintf(stderr, "resolve: %s\n", sm_errmsg());
    return 1;
  }
  puts(dir);
  free(dir);
  return 0;
}

int main(int argc, char **argv) {
  if (sm_cli_configure_store()) return 2;
  if (argc < 2) {
    fprintf(stderr, "usage: store_cli inspect|list|rm|arch|pull ...\n");
    return 2;
  }
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {
    {"inspect", sm_cmd_inspect}, {"list", sm_cmd_list}, {"rm", sm_cmd_rm},
    {"arch", sm_cmd_arch},       {"pull", sm_cmd_pull}, {"resolve", cmd_resolve},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "store_cli: unknown command %s\n", argv[1]);
  return 2;
}
