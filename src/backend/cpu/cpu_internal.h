/* Private interface of the CPU backend: thread pool and per-ISA kernel tables. */
#ifndef SM_CPU_INTERNAL_H
#define SM_CPU_INTERNAL_H
#include "backend/backend.h"

/* ---- thread pool: persistent workers, the caller runs as thread 0 ---- */
typedef struct sm_pool sm_pool;
typedef void (*sm_pool_fn)(void *ctx, int tid, int nth);
sm_pool *sm_pool_create(int n_threads);
void sm_pool_destroy(sm_pool *p);
int sm_pool_size(const sm_pool *p);
/* Runs fn(ctx, tid, nth) on every thread (tid 0 = caller) and waits for all. */
void sm_pool_run(sm_pool *p, sm_pool_fn fn, void *ctx);

/* ---- kernels ---- */
/* Prepared activation for a matvec: x permuted into the order the ISA's unpacker
 * produces (per group), plus per-group sums of x (for the bias term). */
typedef struct {
  const sm_weight *w;
  const float *xp;   /* [cols] permuted x (or x itself) */
  const float *xsum; /* [cols/gs] */
  /* int8 path (see matvec_i8): x quantized per weight group, x ~= xs[g] * xq[k] */
  const int8_t *xq; /* [cols] in the kernel's order */
  const float *xs;  /* [cols/gs] */
  bool gfni;        /* matvec_i8 of 4-bit weights may use GFNI (the backend's choice) */
} sm_mv_arg;

typedef struct {
  const char *name;
  int panel; /* rows per packed panel in gemm (multiple of the vector width) */
  /* size in floats of xp / xsum scratch needed for prep_x */
  void (*prep_x)(const sm_weight *w, const float *x, float *xp, float *xsum);
  /* y[r - r0] = W[r] . x for r in [r0, r1) (y indexed from r0) */
  void (*matvec)(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y);
  /* Dequantize rows [r0, r0+nr) (nr <= panel), columns [k0, k0+kc), into the packed
   * panel layout dst[k][panel] (rows >= nr are zero). tmp: panel*kc floats of scratch. */
  void (*pack_panel)(const sm_weight *w, int64_t r0, int nr, int64_t k0, int kc, float *dst, float *tmp);
  /* y[t][0..nr) += sum_k x[t][k] * P[k][0..nr) for t < nt; x row stride ldx, y row stride ldy */
  void (*gemm_panel)(const float *P, int kc, const float *x, int64_t ldx, int nt, float *y, int64_t ldy, int nr);
  float (*dot)(const float *a, const float *b, int n);
  void (*axpy)(float *y, float a, const float *x, int n); /* y += a*x */
  void (*scal)(float *y, float a, int n);                 /* y *= a */
  /* elementwise (out may alias g or y): out = silu(g)*u, gelu_tanh(g)*u, y = cap*tanh(y/cap) */
  void (*silu_mul)(float *out, const float *g, const float *u, size_t n);
  void (*gelu_mul)(float *out, const float *g, const float *u, size_t n);
  void (*softcap)(float *y, float cap, size_t n);
  /* Optional int8-activation matvec (decode). i8_ok(w): this CPU and weight shape are
   * supported (NULL: never). prep_xq quantizes x per weight group g to int8 with
   * xs[g] = max|x_g| / 127, xq = rint(x * (127 / max|x_g|)) (float arithmetic, |xq| <= 127;
   * xq = 0 for an all-zero group), stores xq in the
   * kernel's order and the exact float group sums in xsum. matvec_i8 then computes
   * y[r] = sum_g scale[r,g] * xs[g] * (sum_j q_rj xq_j) + bias[r,g] * xsum[g]
   * in the integer domain, so |y - W.x| <= sum_g |scale[r,g]| * xs[g]/2 * sum_j q_rj
   * (+ float rounding). */
  /* Optional attention tiles (NULL: loops over dot/axpy). Rows i < nq of q (row stride ldq),
   * key/value rows kr[j], vr[j] (j < np) of head_dim hd:
   *   att_scores: s[i*lds + j] = q_i . k_j
   *   att_pv:     acc[i*hd + d] += sum_j p[i*ldp + j] * v_j[d]
   * Each K/V row is loaded once per call and used for all nq rows (GQA heads sharing a KV
   * head and the tokens of a prefill tile). */
  void (*att_scores)(const float *q, int ldq, int nq, const float *const *kr, int np, int hd, float *s, int lds);
  void (*att_pv)(const float *p, int ldp, int nq, const float *const *vr, int np, int hd, float *acc);
  bool (*i8_ok)(const sm_weight *w);
  void (*prep_xq)(const sm_weight *w, const float *x, int8_t *xq, float *xs, float *xsum);
  void (*matvec_i8)(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y);
} sm_cpu_kern;

/* y[n][rows] = x . W^T for a weight in an MLX microscaling mode (cpu_mxq.c) */
void sm_cpu_mxq_matmul(sm_pool *pool, const sm_cpu_kern *k, const sm_weight *w, const float *x, int n, float *y);

/* ys[i][0..rows) = ws[i] . xs[i] for i < nw: one-token matvecs of different weights and inputs (the chosen
 * experts of a decode step) in one dispatch of the backend's threads (cpu_backend.c) */
void sm_cpu_matvec_batch(sm_backend *be, const sm_weight *ws, const float *const *xs, float *const *ys, int nw);

/* Sets the mixture-of-experts ops of a CPU backend (cpu_moe.c): moe_route, matmul_experts, moe_combine,
 * swiglu_clamp, sigmoid_gate_rows (built on the backend's own matmul). */
void sm_cpu_moe_install(sm_backend *be);

/* Read bandwidth (bytes/s) with every thread of pool, on a buffer well past the caches, loads
 * as wide as k's (bandwidth.c); 0 if the buffer cannot be allocated. Takes about a second. */
double sm_cpu_read_bandwidth(sm_pool *pool, const sm_cpu_kern *k);

/* AVX-512 VNNI int8 kernels (kern_avx512vnni.c); i8 functions of the avx512 table. */
bool sm_avx512vnni_i8_ok(const sm_weight *w);
void sm_avx512vnni_prep_xq(const sm_weight *w, const float *x, int8_t *xq, float *xs, float *xsum);
void sm_avx512vnni_matvec_i8(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y);
/* AVX-512 VBMI int8 kernels for 2/3/5/6-bit weights (kern_avx512vbmi.c), called by
 * sm_avx512vnni_matvec_i8 where sm_avx512vbmi_ok() (cols % 64 == 0, x in natural order). */
bool sm_avx512vbmi_ok(void);
void sm_avx512vbmi_matvec_i8(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y);

extern const sm_cpu_kern sm_cpu_kern_scalar;
extern const sm_cpu_kern sm_cpu_kern_avx2;
extern const sm_cpu_kern sm_cpu_kern_avx512;

/* Kernel table for the best ISA of this CPU (the backend's SMELT_CPU_ISA tuning entry may pick
 * another). */
const sm_cpu_kern *sm_cpu_best_kernels(void);
/* Table by name ("scalar", "avx2", "avx512") if the CPU supports it, else NULL. */
const sm_cpu_kern *sm_cpu_kernels_by_name(const char *name);
/* Whether the CPU has GFNI (the 4-bit int8 matvec unpacks nibbles with it). */
bool sm_cpu_has_gfni(void);

/* A CPU backend's pool and kernel table (for the ops of cpu_encoder.c). */
sm_pool *sm_cpu_backend_pool(sm_backend *be);
const sm_cpu_kern *sm_cpu_backend_kern(sm_backend *be);
/* cpu_encoder.c: installs the ops that read no batch state (attention_seg, rope_axes, gelu,
 * gather_rows, copy) into a CPU backend's table */
void sm_cpu_encoder_ops(sm_backend *b);

/* Name of the kernel set a CPU backend uses ("avx512", "avx2", "scalar"). */
const char *sm_cpu_backend_isa(const sm_backend *be);
/* Whether a decode matvec (n < 4 tokens) with w runs on the int8-activation path
 * (off with SMELT_CPU_EXACT=1 at backend creation, or where no kernel exists). */
bool sm_cpu_backend_uses_i8(const sm_backend *be, const sm_weight *w);

/* ---- recurrent-model ops (ssm.c), on the current batch b (see backend.h) ---- */
/* the batch meets the recurrent ops' rule (each sequence's tokens one run of consecutive positions) */
bool sm_cpu_batch_rec_ok(const sm_batch *b);
void sm_cpu_conv1d(sm_pool *pool, const sm_batch *b, float *out, const float *x, const float *w, const float *bias,
                   int C, int K, bool act_silu, const sm_kv_cache *kv, int layer);
void sm_cpu_ssm_scan(sm_pool *pool, const sm_batch *b, float *y, const float *x, const float *B, const float *Cm, int ld,
                     const float *dt_in, const float *dt_bias, const float *A_log, const float *D, int nh, int P, int G,
                     int N, float dt_min, float dt_max, const sm_kv_cache *kv, int layer);
void sm_cpu_gated_delta(sm_pool *pool, const sm_batch *b, float *y, const float *q, const float *k, const float *v, int ld,
                        const float *a, const float *bb, const float *A_log, const float *dt_bias, int Hk, int Hv, int Dk,
                        int Dv, const sm_kv_cache *kv, int layer);
void sm_cpu_gated_rmsnorm(sm_pool *pool, float *out, const float *x, const float *z, const float *w, int n, int dim,
                          int group, int wdim, float eps, bool norm_first);

/* shared helpers */
static inline float sm_cpu_ldf(const void *p, size_t i, sm_dtype t) {
  switch (t) {
  case SM_DT_F32: return ((const float *)p)[i];
  case SM_DT_F16: return sm_f16_to_f32(((const uint16_t *)p)[i]);
  case SM_DT_BF16: return sm_bf16_to_f32(((const uint16_t *)p)[i]);
  default: return 0.f;
  }
}
/* extract element j of a little-endian bit stream (bits <= 8) */
static inline uint32_t sm_cpu_getq(const uint8_t *row, int64_t j, int bits) {
  uint64_t bit = (uint64_t)j * (uint64_t)bits;
  uint32_t v = row[bit >> 3];
  if ((bit & 7) + (uint64_t)bits > 8) v |= (uint32_t)row[(bit >> 3) + 1] << 8;
  return (v >> (bit & 7)) & ((1u << bits) - 1);
}

#endif
