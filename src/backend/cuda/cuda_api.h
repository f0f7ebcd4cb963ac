/* What the CUDA backend tells its callers beyond the op table (benchmarks, tests): the device's
 * name and what the executor did (fusions fired, ops run unfused, launches of a captured decode
 * graph). C header. */
#ifndef SM_CUDA_API_H
#define SM_CUDA_API_H
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SM_CUDA_STATS_MAX 48
typedef struct {
  int n_fusions; /* entries of the fusion table, in order */
  const char *fusion[SM_CUDA_STATS_MAX];
  long fused_last[SM_CUDA_STATS_MAX]; /* fired in the last executed (eager or captured) forward */
  long fused_all[SM_CUDA_STATS_MAX];
  int n_op_types;
  const char *op[SM_CUDA_STATS_MAX];    /* op types */
  long unfused_last[SM_CUDA_STATS_MAX]; /* run alone in the last executed forward, by op type */
  int graph_nodes_last;                 /* kernel launches of the last captured graph */
  long graph_launches, captures, eager_forwards;
  long gsample_steps;                                /* greedy samples taken inside the decode graph */
  long gmeta_steps;                                  /* fed steps whose batch metadata rode as kernel parameters */
  long mvq4, mvr, guq4, mlp, mlp_dnorm, attn_decode; /* launches issued (replays not counted) */
  long attn_decb;                                    /* of them decode attention on k_attn_decb */
  long qwg_prep;                                     /* the wgmma kernel's own conversions of x */
} sm_cuda_stats;

void sm_cuda_get_stats(sm_backend *be, sm_cuda_stats *out);
const char *sm_cuda_device_name(sm_backend *be, char *buf, size_t n);
int sm_cuda_device_count(void); /* GPUs this process sees (0 on an error); initializes CUDA here */
/* the tuning value name (an SMELT_CUDA_* variable) of this backend */
int sm_cuda_tune_value(sm_backend *be, const char *name);

#ifdef __cplusplus
}
#endif
#endif
