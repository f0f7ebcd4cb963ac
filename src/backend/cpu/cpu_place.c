/* Thread placement of the CPU backend (the options llama.cpp has: --cpu-mask, --numa
 * distribute|isolate): which CPUs each pool thread may run on. NUMA nodes come from sysfs
 * (/sys/devices/system/node/node*\/cpulist); a machine without that directory is one node. */
#include "backend/cpu/cpu_internal.h"
#include <ctype.h>
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "0-7,16-23" into set; false on a syntax error */
static bool parse_list(const char *s, cpu_set_t *set) {
  CPU_ZERO(set);
  while (*s) {
    char *end;
    long a = strtol(s, &end, 10);
    if (end == s || a < 0 || a >= CPU_SETSIZE) return false;
    long b = a;
    s = end;
    if (*s == '-') {
      b = strtol(s + 1, &end, 10);
      if (end == s + 1 || b < a || b >= CPU_SETSIZE) return false;
      s = end;
    }
    for (long i = a; i <= b; i++) CPU_SET((int)i, set);
    if (*s == ',') s++;
    else if (*s && !isspace((unsigned char)*s)) return false;
    else
      while (isspace((unsigned char)*s)) s++;
  }
  return true;
}

/* A hex mask as llama.cpp's --cpu-mask ("0xF0" or "f0"; CPU 0 = lowest bit), or a CPU list with
 * ranges as its --cpu-range ("0-7,16-23"; one CPU: "5-5"); false on a syntax error or an empty set */
bool sm_cpu_parse_mask(const char *s, cpu_set_t *set) {
  CPU_ZERO(set);
  if (!s || !*s) return false;
  const bool hex = !strncmp(s, "0x", 2) || !strncmp(s, "0X", 2) || !strpbrk(s, ",-");
  if (!hex) return parse_list(s, set) && CPU_COUNT(set) > 0;
  const char *p = s + (!strncmp(s, "0x", 2) || !strncmp(s, "0X", 2) ? 2 : 0);
  size_t n = strlen(p);
  if (!n) return false;
  for (size_t i = 0; i < n; i++) {
    char ch = p[n - 1 - i];
    if (!isxdigit((unsigned char)ch)) return false;
    int v = isdigit((unsigned char)ch) ? ch - '0' : tolower((unsigned char)ch) - 'a' + 10;
    for (int b = 0; b < 4; b++)
      if (v >> b & 1) {
        if (4 * i + (size_t)b >= CPU_SETSIZE) return false;
        CPU_SET((int)(4 * i + (size_t)b), set);
      }
  }
  return CPU_COUNT(set) > 0;
}

/* NUMA nodes' CPU sets (at most max); the count, 0 if sysfs has none */
static int numa_nodes(cpu_set_t *nodes, int max) {
  int n = 0;
  for (int node = 0; node < 1024 && n < max; node++) {
    char path[96], buf[4096];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
    FILE *f = fopen(path, "r");
    if (!f) {
      if (node > 64) break;
      continue; /* node numbers may have gaps */
    }
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    if (ok && parse_list(buf, &nodes[n]) && CPU_COUNT(&nodes[n]) > 0) n++;
  }
  return n;
}

smelt_status sm_cpu_place_plan(const sm_cpu_opts *o, int *n_threads, cpu_set_t **sets) {
  *sets = NULL;
  cpu_set_t allowed, base;
  if (sched_getaffinity(0, sizeof allowed, &allowed)) CPU_ZERO(&allowed);
  if (CPU_COUNT(&allowed) == 0)
    for (int i = 0; i < CPU_SETSIZE; i++) CPU_SET(i, &allowed);
  base = allowed;
  const bool masked = o && o->cpu_mask && *o->cpu_mask;
  if (masked) {
    cpu_set_t m;
    if (!sm_cpu_parse_mask(o->cpu_mask, &m))
      return sm_err(SMELT_ERR_INVALID, "--cpu-mask %s: expected a hex mask (0xff) or a CPU list (0-7,16-23)",
                    o->cpu_mask);
    CPU_AND(&base, &m, &allowed);
    if (!CPU_EQUAL(&base, &m)) {
      for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &m) && !CPU_ISSET(i, &allowed))
          return sm_err(SMELT_ERR_INVALID, "--cpu-mask %s: CPU %d is not available to this process", o->cpu_mask, i);
    }
  }
  const int numa = o ? o->numa : SMELT_NUMA_NONE;
  enum { MAXN = 64 };
  cpu_set_t nodes[MAXN];
  int nn = numa != SMELT_NUMA_NONE ? numa_nodes(nodes, MAXN) : 0;
  if (numa == SMELT_NUMA_ISOLATE && nn > 0) {
    /* the node of the CPU this thread runs on now */
    int cpu = sched_getcpu(), pick = 0;
    for (int i = 0; i < nn; i++)
      if (cpu >= 0 && CPU_ISSET(cpu, &nodes[i])) pick = i;
    cpu_set_t t;
    CPU_AND(&t, &base, &nodes[pick]);
    if (CPU_COUNT(&t) == 0) return sm_err(SMELT_ERR_INVALID, "--numa isolate: no usable CPU on NUMA node %d", pick);
    base = t;
    nn = 0;
  }
  int n = *n_threads;
  if (n <= 0) n = CPU_COUNT(&base);
  if (n > 256) n = 256;
  *n_threads = n;
  if (!masked && numa == SMELT_NUMA_NONE) return SMELT_OK; /* no pinning */
  cpu_set_t *s = sm_xcalloc((size_t)n, sizeof(cpu_set_t));
  int list[CPU_SETSIZE], nl = 0;
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &base)) list[nl++] = i;
  if (numa == SMELT_NUMA_DISTRIBUTE && nn > 1) {
    /* thread i on node i % nodes (the node's usable CPUs) */
    int used = 0;
    for (int i = 0; i < n; i++) {
      cpu_set_t t;
      for (int tries = 0; tries < nn; tries++) {
        CPU_AND(&t, &base, &nodes[(i + tries) % nn]);
        if (CPU_COUNT(&t)) break;
      }
      s[i] = t;
      used += CPU_COUNT(&t) > 0;
    }
    if (used < n) {
      free(s);
      return sm_err(SMELT_ERR_INVALID, "--numa distribute: no usable CPU on the NUMA nodes");
    }
  } else if (masked) {
    /* one CPU per thread, in the mask's order (round-robin past its end) */
    for (int i = 0; i < n; i++) {
      CPU_ZERO(&s[i]);
      CPU_SET(list[i % nl], &s[i]);
    }
  } else {
    for (int i = 0; i < n; i++) s[i] = base; /* isolate (or one node): all threads on the node's CPUs */
  }
  *sets = s;
  return SMELT_OK;
}
