/* Tuning tables. Every value a backend can be tuned with is one row of its backend's table
 * {environment variable, field, default, range, doc, flags}; the table is read once when a
 * backend instance is created, into that instance's tuning struct (ints only). Nothing else in
 * a backend reads the environment, and no tuning value lives in a process-global variable.
 *
 * Flags: SM_TUNE_USER marks the few user-facing knobs (documented in docs/; a test checks
 * that). SM_TUNE_DEV marks diagnostics that change results (kernels left out, forced
 * variants): they are read only in developer builds (cmake -DSMELT_DEV=ON); a release build
 * ignores them with a one-line notice on stderr. Values outside [min, max], or that are not
 * integers, fail the backend's creation with a message naming the variable. An entry with names
 * also accepts those words (the value is the word's index; sm_tune_describe prints the word). */
#ifndef SM_TUNING_H
#define SM_TUNING_H
#include <stddef.h>
#include "base/base.h"
#include "base/strbuf.h"
#ifdef __cplusplus
extern "C" {
#endif

enum { SM_TUNE_USER = 1, SM_TUNE_DEV = 2 };

/* a per-device default: used when the device's arch (e.g. CUDA compute capability 90) is >= arch;
 * the first matching entry wins, so list the newest arch first; {0, 0} ends the list */
typedef struct {
  int arch, value;
} sm_tune_arch;

typedef struct {
  const char *name;         /* environment variable, e.g. "SMELT_CUDA_GRAPHS" */
  size_t offset;            /* offsetof the int field in the tuning struct */
  int def, min, max;        /* default when no arch entry matches; accepted range */
  unsigned flags;           /* SM_TUNE_* */
  const char *doc;          /* one line */
  sm_tune_arch arch[3];     /* per-device defaults */
  const char *const *names; /* optional, NULL-terminated: names[v] is value v's word */
} sm_tune_entry;

/* Fill the struct at out from the table: the per-arch default, overridden by the environment.
 * arch: the device's (CUDA: major * 10 + minor; CPU: 0). */
smelt_status sm_tune_read(const sm_tune_entry *t, size_t n, int arch, void *out);
/* the default an entry takes on a device of this arch */
int sm_tune_default(const sm_tune_entry *e, int arch);
/* whether this build reads SM_TUNE_DEV entries */
bool sm_tune_dev_build(void);
/* "NAME=value" for every entry whose value differs from its default on this arch, space-separated
 * (for benchmark headers and logs; empty when all are defaults) */
void sm_tune_describe(const sm_tune_entry *t, size_t n, int arch, const void *vals, sm_buf *out);

#ifdef __cplusplus
}
#endif
#endif
