/* Subcommands of the smelt binary. Each returns the process exit code. */
#ifndef SM_CLI_H
#define SM_CLI_H
#include "engine/engine.h"

int sm_cmd_run(int argc, char **argv);        /* cmd_run.c: chat REPL / one-shot */
int sm_cmd_generate(int argc, char **argv);   /* cmd_run.c */
int sm_cmd_bench(int argc, char **argv);      /* cmd_bench.c */
int sm_cmd_perplexity(int argc, char **argv); /* cmd_bench.c */
int sm_cmd_serve(int argc, char **argv);      /* cmd_serve.c */
int sm_cmd_inspect(int argc, char **argv);    /* cmd_store.c */
int sm_cmd_list(int argc, char **argv);       /* cmd_store.c */
int sm_cmd_rm(int argc, char **argv);         /* cmd_store.c */
int sm_cmd_arch(int argc, char **argv);       /* cmd_store.c */
int sm_cmd_pull(int argc, char **argv);       /* cmd_store.c */

/* env.c: the environment into the library's settings (read nowhere else) */
/* The store settings from HOME, SMELT_CACHE_DIR, HF_* ... (sm_store_configure); call once at
 * startup. 0, or 2 after a message on stderr when a variable has a bad value. */
int sm_cli_configure_store(void);
/* SMELT_HOST_SAMPLE=1 -> p->host_sample, SMELT_PIPELINE=0 -> !p->pipeline, SMELT_PIPELINE=always -> p->pipeline_always
 * (other fields untouched) */
void sm_cli_engine_env(sm_engine_params *p);

/* kvtype.c: the values of --cache-type-k and --cache-type-v (either may be NULL: not given) into
 * *out (untouched when neither is given); 0, or 2 after a message on stderr */
int sm_cli_kv_type(const char *cmd, const char *k, const char *v, smelt_kv_type *out);
/* -ctk / -ctv (llama.cpp's spellings) into --cache-type-k / --cache-type-v, for getopt_long */
void sm_cli_kv_alias(int argc, char **argv); /* -ctk, -ctv, -tp: their long names (getopt_long) */
#define SM_CLI_KV_HELP \
  "  -ctk, --cache-type-k T   KV cache element type: f16 (default), bf16, f32, or q8_0 / q4_0 (8 / 4 bits\n" \
  "                           in groups of 32; -ctv / --cache-type-v: the same; K and V share one type)\n"
#endif
