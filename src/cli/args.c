/* Table-driven option parsing (see args.h). Hand-written rather than getopt_long: getopt cannot
 * take llama.cpp's multi-letter short options (-ngl, -md, -fa), does not range-check, and its
 * messages name neither the option's other spellings nor a likely intended one. */
#include "cli/args.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the i-th spelling of a "|"-separated list into out; false past the end */
static bool spelling(const char *names, int i, char *out, size_t n) {
  const char *p = names;
  for (; i > 0; i--) {
    p = strchr(p, '|');
    if (!p) return false;
    p++;
  }
  size_t l = strcspn(p, "|");
  if (l + 1 > n) l = n - 1;
  memcpy(out, p, l);
  out[l] = 0;
  return true;
}

static bool has_spelling(const char *names, const char *s) {
  char b[64];
  for (int i = 0; spelling(names, i, b, sizeof b); i++)
    if (!strcmp(b, s)) return true;
  return false;
}

/* "-t/--threads" */
static void display_name(const sm_arg *a, char *out, size_t n) {
  out[0] = 0;
  char b[64];
  size_t used = 0;
  for (int i = 0; spelling(a->names, i, b, sizeof b) && i < 2; i++)
    used += (size_t)snprintf(out + used, used < n ? n - used : 0, "%s%s", i ? "/" : "", b);
}

static bool takes_value(sm_arg_kind k) {
  return k == SM_ARG_INT || k == SM_ARG_FLOAT || k == SM_ARG_STR || k == SM_ARG_FN || k == SM_ARG_IGNORED_VALUE;
}

static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 99;
  size_t d[64][64];
  for (size_t i = 0; i <= la; i++) d[i][0] = i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      size_t c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
        c = d[i - 2][j - 2] + 1;
      d[i][j] = c;
    }
  return d[la][lb];
}

void sm_args_suggest(const sm_arg *args, int n_args, const char *given, char *out, size_t n) {
  out[0] = 0;
  const char *g = given;
  while (*g == '-') g++;
  char eqless[64];
  snprintf(eqless, sizeof eqless, "%s", g);
  char *eq = strchr(eqless, '=');
  if (eq) *eq = 0;
  size_t gl = strlen(eqless);
  if (!gl) return;
  size_t best = 99;
  char best_s[2][64] = {"", ""};
  for (int i = 0; i < n_args; i++) {
    if (args[i].kind == SM_ARG_SECTION) continue;
    char b[64];
    for (int k = 0; spelling(args[i].names, k, b, sizeof b); k++) {
      const char *s = b;
      while (*s == '-') s++;
      size_t d = edit_distance(eqless, s);
      if (gl >= 3 && !strncmp(s, eqless, gl)) d = d < 1 ? d : 1; /* a prefix of a long name */
      if (d < best) {
        best = d;
        snprintf(best_s[0], 64, "%s", b);
        best_s[1][0] = 0;
      } else if (d == best && !best_s[1][0] && strcmp(best_s[0], b)) snprintf(best_s[1], 64, "%s", b);
    }
  }
  size_t limit = gl <= 3 ? 1 : gl / 3 + 1;
  if (best > limit) return;
  if (best_s[1][0]) snprintf(out, n, "%s or %s", best_s[0], best_s[1]);
  else snprintf(out, n, "%s", best_s[0]);
}

void sm_args_help(FILE *f, const char *cmd, const sm_arg *args, int n_args, const char *usage_line) {
  fprintf(f, "usage: smelt %s %s\n", cmd, usage_line);
  for (int i = 0; i < n_args; i++) {
    const sm_arg *a = &args[i];
    if (a->kind == SM_ARG_SECTION) {
      fprintf(f, "\n%s\n", a->help);
      continue;
    }
    if (!a->help) continue;
    char left[128] = "", b[64];
    size_t used = 0;
    bool has_short = spelling(a->names, 0, b, sizeof b) && b[1] != '-';
    if (!has_short) used += (size_t)snprintf(left, sizeof left, "    ");
    for (int k = 0; spelling(a->names, k, b, sizeof b); k++)
      used += (size_t)snprintf(left + used, used < sizeof left ? sizeof left - used : 0, "%s%s", k ? ", " : "", b);
    if (a->meta && (takes_value(a->kind) || a->kind == SM_ARG_IGNORED_OPTVALUE))
      snprintf(left + used, used < sizeof left ? sizeof left - used : 0,
               a->kind == SM_ARG_IGNORED_OPTVALUE ? " [%s]" : " %s", a->meta);
    if (strlen(left) <= 26) fprintf(f, "  %-28s%s\n", left, a->help);
    else fprintf(f, "  %s\n  %-28s%s\n", left, "", a->help);
  }
}

static int bad(const char *cmd, const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "smelt %s: ", cmd);
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  return 2;
}

static int set_value(const char *cmd, const sm_arg *a, const char *val) {
  char name[96];
  display_name(a, name, sizeof name);
  char *end;
  switch (a->kind) {
    case SM_ARG_INT: {
      errno = 0;
      long long v = strtoll(val, &end, 10);
      if (!*val || *end) return bad(cmd, "%s: '%s' is not a whole number", name, val);
      if (errno == ERANGE || v < a->lo || v > a->hi) {
        fprintf(stderr, "smelt %s: %s: %s is out of range (%.0f to %.0f)\n", cmd, name, val, a->lo, a->hi);
        return 2;
      }
      *(int *)a->dst = (int)v;
      return 0;
    }
    case SM_ARG_FLOAT: {
      double v = strtod(val, &end);
      if (!*val || *end) return bad(cmd, "%s: '%s' is not a number", name, val);
      if (!isfinite(v)) return bad(cmd, "%s: '%s' is not a finite number", name, val);
      if (v < a->lo || v > a->hi) {
        fprintf(stderr, "smelt %s: %s: %s is out of range (%g to %g)\n", cmd, name, val, a->lo, a->hi);
        return 2;
      }
      *(float *)a->dst = (float)v;
      return 0;
    }
    case SM_ARG_STR: *(const char **)a->dst = val; return 0;
    case SM_ARG_FN: {
      char err[256] = "";
      if (!a->fn(val, a->dst, err, sizeof err)) {
        fprintf(stderr, "smelt %s: %s: %s\n", cmd, name, err[0] ? err : "bad value");
        return 2;
      }
      return 0;
    }
    default: return 0;
  }
}

int sm_args_parse(const char *cmd, const sm_arg *args, int n_args, int argc, char **argv, const char **pos, int max_pos,
                  int *n_pos, const char *usage_line) {
  *n_pos = 0;
  bool only_pos = false;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (only_pos || arg[0] != '-' || !arg[1]) {
      if (*n_pos >= max_pos)
        return bad(cmd, "unexpected argument '%s'%s", arg, max_pos ? " (quote a prompt with spaces)" : "");
      pos[(*n_pos)++] = arg;
      continue;
    }
    if (!strcmp(arg, "--")) {
      only_pos = true;
      continue;
    }
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
      sm_args_help(stdout, cmd, args, n_args, usage_line);
      return 1;
    }
    char name[96];
    const char *inline_val = NULL;
    snprintf(name, sizeof name, "%s", arg);
    if (arg[1] == '-') {
      char *eq = strchr(name, '=');
      if (eq) {
        *eq = 0;
        inline_val = arg + (eq - name) + 1;
      }
    }
    const sm_arg *a = NULL;
    for (int k = 0; k < n_args && !a; k++)
      if (args[k].kind != SM_ARG_SECTION && has_spelling(args[k].names, name)) a = &args[k];
    if (!a) {
      char sug[160];
      sm_args_suggest(args, n_args, name, sug, sizeof sug);
      if (sug[0]) fprintf(stderr, "smelt %s: unknown option '%s'; did you mean %s?\n", cmd, name, sug);
      else fprintf(stderr, "smelt %s: unknown option '%s' (smelt %s --help lists the options)\n", cmd, name, cmd);
      return 2;
    }
    if (a->seen) *a->seen = true;
    const char *val = inline_val;
    if (takes_value(a->kind) && !val) {
      if (i + 1 >= argc) {
        fprintf(stderr, "smelt %s: %s needs a value%s%s\n", cmd, name, a->meta ? " " : "", a->meta ? a->meta : "");
        return 2;
      }
      val = argv[++i];
    }
    if (!takes_value(a->kind) && a->kind != SM_ARG_IGNORED_OPTVALUE && inline_val)
      return bad(cmd, "%s takes no value (got '%s')", name, inline_val);
    switch (a->kind) {
      case SM_ARG_FLAG: *(bool *)a->dst = true; break;
      case SM_ARG_IGNORED_OPTVALUE:
        if (!val && i + 1 < argc && a->meta) {
          char c[32];
          for (int k = 0; spelling(a->meta, k, c, sizeof c); k++)
            if (!strcmp(c, argv[i + 1])) {
              val = argv[++i];
              break;
            }
        }
        /* fall through */
      case SM_ARG_IGNORED:
      case SM_ARG_IGNORED_VALUE:
        fprintf(stderr, "smelt %s: %s%s%s ignored: %s\n", cmd, name, val ? " " : "", val ? val : "",
                a->help ? a->help : "");
        break;
      default: {
        int r = set_value(cmd, a, val);
        if (r) return r;
      }
    }
  }
  return 0;
}
