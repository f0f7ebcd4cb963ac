/* The routing of one token by one warp (moe_route, backend.h; the algorithm of the reference
 * sm_moe_route_row): softmax, top-k softmax or sigmoid scores (with the correction bias and the
 * group-limited choice), k rounds of a warp arg-max (ties to the lower expert index), the chosen
 * weights normalized and scaled. k_route (cuda_moe.cu) runs it a warp a token; the experts' gate/up
 * kernel (cuda_moe_mv.cu) runs it in every block that needs the token's experts, so that routing
 * takes no launch of its own in decode. One function for both: the same bits either way. */
#ifndef SM_CUDA_ROUTE_CUH
#define SM_CUDA_ROUTE_CUH
#include <math.h>
#include <stdint.h>
#include "backend/backend.h"

/* a moe_route op: logits [n][E] -> ids, wts [n][k] */
struct cu_route {
  const float *logits, *corr, *es; /* es: per-expert weight scale (Gemma 4) or NULL */
  int32_t *ids;
  float *wts;
  int kind, E, k, norm, ng, tkg;
  float scale, eps;
};
#define CU_ROUTE_MAX_K 64
#define CU_ROUTE_MAX_GROUPS 64

/* one warp: routes token t. sm: 2 E floats of shared memory; sel: k ints of shared memory that hold
 * the chosen experts afterwards (visible to the warp; other warps after a barrier). Lane 0 writes
 * the token's ids and weights when write. */
static __device__ void cu_route_token(const cu_route &r, int t, float *sm, int *sel, bool write) {
  __shared__ float gsc[CU_ROUTE_MAX_GROUPS];
  __shared__ int kept[CU_ROUTE_MAX_GROUPS];
  const int E = r.E, k = r.k, kind = r.kind, lane = threadIdx.x & 31;
  float *p = sm, *ch = sm + E;
  const float *l = r.logits + (int64_t)t * E;
  if (kind == SM_ROUTE_SOFTMAX) {
    float mx = -INFINITY, z = 0.f;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int e = lane; e < E; e += 32) z += p[e] = expf(l[e] - mx);
    for (int o = 16; o; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
    for (int e = lane; e < E; e += 32) ch[e] = p[e] = p[e] / z;
  } else if (kind == SM_ROUTE_TOPK_SOFTMAX) {
    for (int e = lane; e < E; e += 32) ch[e] = p[e] = l[e];
  } else {
    for (int e = lane; e < E; e += 32) {
      p[e] = 1.f / (1.f + expf(-l[e]));
      ch[e] = p[e] + (r.corr ? r.corr[e] : 0.f);
    }
  }
  __syncwarp();
  if (kind == SM_ROUTE_SIGMOID && r.ng > 1) { /* the topk_group groups of the largest top-2 sums stay */
    const int ng = r.ng, per = E / ng;
    for (int g = lane; g < ng; g += 32) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; e++) {
        const float v = ch[e];
        if (v > b1) { b2 = b1; b1 = v; } else if (v > b2) b2 = v;
      }
      gsc[g] = b1 + b2;
      kept[g] = 0;
    }
    __syncwarp();
    for (int j = 0; j < r.tkg; j++) {
      float bv = -INFINITY;
      int bi = 0x7fffffff;
      for (int g = lane; g < ng; g += 32)
        if (!kept[g] && (gsc[g] > bv || (gsc[g] == bv && g < bi))) { bv = gsc[g]; bi = g; }
      for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
      }
      if (lane == 0 && bi < ng) kept[bi] = 1;
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
      if (!kept[e / per]) ch[e] = 0.f;
    __syncwarp();
  }
  for (int j = 0; j < k; j++) { /* a chosen expert's score becomes NaN, which no comparison picks again */
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32) {
      const float v = ch[e];
      if (v > bv || (v == bv && e < bi)) { bv = v; bi = e; }
    }
    for (int o = 16; o; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) {
      sel[j] = bi < E ? bi : 0;
      ch[sel[j]] = __int_as_float(0x7fc00000);
    }
    __syncwarp();
  }
  if (lane == 0 && write) {
    float w[CU_ROUTE_MAX_K], sum = 0.f;
    if (kind == SM_ROUTE_TOPK_SOFTMAX) {
      const float mx = l[sel[0]];
      float z = 0.f;
      for (int j = 0; j < k; j++) z += w[j] = expf(l[sel[j]] - mx);
      for (int j = 0; j < k; j++) sum += w[j] /= z;
    } else {
      for (int j = 0; j < k; j++) sum += w[j] = p[sel[j]];
      if (kind == SM_ROUTE_SIGMOID && r.norm) sum += r.eps;
    }
    for (int j = 0; j < k; j++) {
      float v = w[j];
      if (r.norm && kind != SM_ROUTE_TOPK_SOFTMAX) v /= sum;
      r.ids[(int64_t)t * k + j] = sel[j];
      r.wts[(int64_t)t * k + j] = v * r.scale * (r.es ? r.es[sel[j]] : 1.f);
    }
  }
}
#endif
