/* Command-line options described by a table: every spelling of an option (long, short and
 * llama.cpp's multi-letter short ones such as -ngl), --name=value, numeric values checked against
 * a range that the error message names, options accepted but ignored with a one-line notice,
 * "did you mean" for unknown options, and the --help text, all from the same table. */
#ifndef SM_CLI_ARGS_H
#define SM_CLI_ARGS_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
  SM_ARG_FLAG,             /* bool *dst = true */
  SM_ARG_INT,              /* int *dst, in [lo, hi] */
  SM_ARG_FLOAT,            /* float *dst, finite, in [lo, hi] */
  SM_ARG_STR,              /* const char **dst */
  SM_ARG_FN,               /* fn(value, dst, err, errlen) parses it; false = bad value (err says why) */
  SM_ARG_IGNORED,          /* accepted, does nothing here: a notice on stderr (help says why) */
  SM_ARG_IGNORED_VALUE,    /* the same, with a value */
  SM_ARG_IGNORED_OPTVALUE, /* the same, with an optional value out of `choices` */
  SM_ARG_SECTION,          /* not an option: a heading in --help */
} sm_arg_kind;

typedef struct {
  const char *names; /* spellings, "|"-separated: "-t|--threads" (the first long one names it in errors) */
  sm_arg_kind kind;
  void *dst;
  double lo, hi;    /* SM_ARG_INT / SM_ARG_FLOAT range (inclusive) */
  const char *meta; /* value name in --help ("N"); choices ("on|off|auto") for IGNORED_OPTVALUE */
  const char *help; /* NULL: not listed in --help (an alias spelling) */
  bool (*fn)(const char *val, void *dst, char *err, size_t errlen);
  bool *seen; /* set when the option is given (may be NULL) */
} sm_arg;

/* Parse argv[1..argc) (argv[0] is the command name used in messages, e.g. "run"). Arguments that
 * are not options go to pos[0..*n_pos) (at most max_pos, else an error); "--" ends the options.
 * Returns 0 ok, 1 when --help was printed (the caller exits 0), 2 on a usage error (printed). */
int sm_args_parse(const char *cmd, const sm_arg *args, int n_args, int argc, char **argv, const char **pos, int max_pos,
                  int *n_pos, const char *usage_line);
void sm_args_help(FILE *f, const char *cmd, const sm_arg *args, int n_args, const char *usage_line);
/* Spellings of args that are closest to `given` (edit distance), for "did you mean"; "" if none. */
void sm_args_suggest(const sm_arg *args, int n_args, const char *given, char *out, size_t n);

#endif
