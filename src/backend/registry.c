/* The backend registry: which backends this build has and how to make one (backend.h). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backend/backend.h"
#ifdef SMELT_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

static atomic_bool g_cuda_touched;
bool sm_backend_cuda_touched(void) { return atomic_load(&g_cuda_touched); }

int sm_backend_gpu_count(void) {
#ifdef SMELT_HAVE_CUDA
  /* asked in a child, which CUDA is initialized in, not this process (a fork would not carry it) */
  fflush(stdout);
  fflush(stderr);
  const pid_t p = fork();
  if (p == 0) {
    const int n = sm_cuda_device_count();
    _exit(n > 200 ? 200 : n);
  }
  int ws = 0;
  if (p < 0 || waitpid(p, &ws, 0) != p || !WIFEXITED(ws)) return 0;
  return WEXITSTATUS(ws);
#else
  return 0;
#endif
}

const char *sm_mm_role_name(sm_mm_role r) {
  static const char *const names[SM_MM_ROLES] = {"other",       "q",         "k",           "v",           "o",
                                                 "gate",        "up",        "down",        "lm_head",     "router",
                                                 "expert_gate", "expert_up", "expert_down", "shared_gate", "attn_gate",
                                                 "rec_in",      "rec_out",   "mla_uk",      "mla_uv",      "ple"};
  return (unsigned)r < SM_MM_ROLES ? names[r] : "?";
}

sm_backend *sm_backend_create(smelt_device dev, int index, int threads) {
  sm_cpu_opts o = {.n_threads = threads, .poll = 50};
  return sm_backend_create_opts(dev, index, &o, NULL);
}

sm_backend *sm_backend_create_opts(smelt_device dev, int index, const sm_cpu_opts *cpu, const sm_backend_opts *opts) {
  const sm_backend_opts def = {0};
  if (!opts) opts = &def;
  switch (dev) {
    case SMELT_DEVICE_CUDA:
#ifdef SMELT_HAVE_CUDA
      atomic_store(&g_cuda_touched, true);
      return sm_cuda_backend_create_opts(index, opts);
#else
      sm_err(SMELT_ERR_UNSUPPORTED, "this smelt was built without CUDA");
      return NULL;
#endif
    case SMELT_DEVICE_AUTO:
#ifdef SMELT_HAVE_CUDA
    {
      atomic_store(&g_cuda_touched, true);
      sm_backend *be = sm_cuda_backend_create_opts(index, opts);
      if (be) return be;
    }
#endif
      /* fall through */
    case SMELT_DEVICE_CPU: {
      sm_cpu_opts o = *cpu;
      o.batch_invariant = o.batch_invariant || opts->batch_invariant;
      sm_backend *be = sm_cpu_backend_create_opts(&o);
      if (!be) sm_err(SMELT_ERR_BACKEND, "cannot create the CPU backend: %s", sm_errmsg());
      return be;
    }
  }
  sm_err(SMELT_ERR_INVALID, "unknown device kind %d", (int)dev);
  return NULL;
}
