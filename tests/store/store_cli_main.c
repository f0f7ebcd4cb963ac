/* Test driver: dispatches `store_cli <cmd> args...` to the store subcommands of
 * src/cli/cmd_store.c, so the store CLI is testable without the rest of the binary. */
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: store_cli inspect|list|rm|arch|pull ...\n"); return 2; }
  static const struct { const char *name; int (*fn)(int, char **); } cmds[] = {
    {"inspect", sm_cmd_inspect}, {"list", sm_cmd_list}, {"rm", sm_cmd_rm}, {"arch", sm_cmd_arch}, {"pull", sm_cmd_pull},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "store_cli: unknown command %s\n", argv[1]);
  return 2;
}
