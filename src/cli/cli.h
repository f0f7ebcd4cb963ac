/* Subcommands of the smelt binary. Each returns the process exit code. */
#ifndef SM_CLI_H
#define SM_CLI_H

int sm_cmd_run(int argc, char **argv);      /* cmd_run.c: chat REPL / one-shot */
int sm_cmd_generate(int argc, char **argv); /* cmd_run.c */
int sm_cmd_bench(int argc, char **argv);    /* cmd_bench.c */
int sm_cmd_perplexity(int argc, char **argv); /* cmd_bench.c */
int sm_cmd_serve(int argc, char **argv);    /* cmd_serve.c */
int sm_cmd_inspect(int argc, char **argv);  /* cmd_store.c */
int sm_cmd_list(int argc, char **argv);     /* cmd_store.c */
int sm_cmd_rm(int argc, char **argv);       /* cmd_store.c */
int sm_cmd_arch(int argc, char **argv);     /* cmd_store.c */
int sm_cmd_pull(int argc, char **argv);     /* cmd_store.c */

#endif
