/* smelt command-line entry point: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"
#include "smelt.h"

static void usage(FILE *f) {
  fprintf(f,
          "smelt %s — run MLX-format LLMs on CPU and NVIDIA GPUs\n\n"
          "usage: smelt <command> [options]\n\n"
          "commands:\n"
          "  run [MODEL] [-p PROMPT]   chat with a model (REPL, or one-shot with -p); no MODEL = built-in model\n"
          "  generate -m MODEL -p TEXT raw text completion, prints speed and peak memory\n"
          "  serve -m MODEL            OpenAI-compatible HTTP server (also installed as smelt-server)\n"
          "  bench                     prefill/decode speed and memory-bandwidth roofline\n"
          "  perplexity -m MODEL -f F  perplexity of a text file\n"
          "  inspect -m MODEL          memory estimate: weights, KV cache, fits or not\n"
          "  list | rm | pull | arch   manage the model store / list supported architectures\n\n"
          "MODEL is a directory, owner/name, or a bare name (-> mlx-community/<name>).\n"
          "Run 'smelt <command> --help' for the options of a command.\n",
          SMELT_VERSION);
}

int main(int argc, char **argv) {
  const int rank = smelt_tp_rank_main(argc, argv); /* a tensor-parallel rank of another smelt (src/model/tp.c) */
  if (rank >= 0) return rank;
  if (sm_cli_configure_store()) return 2;
  const char *base = strrchr(argv[0], '/');
  base = base ? base + 1 : argv[0];
  if (!strcmp(base, "smelt-server")) {
    argv[0] = "serve";
    return sm_cmd_serve(argc, argv);
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("smelt %s\n", SMELT_VERSION);
    return 0;
  }
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {
    {"run", sm_cmd_run},
    {"generate", sm_cmd_generate},
    {"serve", sm_cmd_serve},
    {"bench", sm_cmd_bench},
    {"perplexity", sm_cmd_perplexity},
    {"inspect", sm_cmd_inspect},
    {"list", sm_cmd_list},
    {"ls", sm_cmd_list},
    {"rm", sm_cmd_rm},
    {"arch", sm_cmd_arch},
    {"pull", sm_cmd_pull},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "smelt: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
