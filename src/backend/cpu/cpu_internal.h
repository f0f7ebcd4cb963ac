/* Private interface of the CPU backend: thread placement and per-ISA kernel tables (the thread
 * pool is base/pool.h). */
#ifndef SM_CPU_INTERNAL_H
#define SM_CPU_INTERNAL_H
#include "backend/backend.h"
#include "base/pool.h"
#include <sched.h>
#include <string.h>

/* ---- thread placement (cpu_place.c) ---- */
/* "0xff" (hex, CPU 0 = lowest bit) or "0-7,16-23" */
bool sm_cpu_parse_mask(const char *s, cpu_set_t *set);
/* The threads (*n_threads; 0: all CPUs the options leave) and, where o asks for placement, the CPU
 * set of each (*sets, malloc'd; NULL: no pinning). SMELT_ERR_INVALID naming the option at fault. */
smelt_status sm_cpu_place_plan(const sm_cpu_opts *o, int *n_threads, cpu_set_t **sets);

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
  /* Optional: the same over f16 K/V rows read in place (each value widened in a register; the same
   * results as over the widened rows), for hd % 16 == 0 and hd <= 256 */
  void (*att_scores_f16)(const float *q, int ldq, int nq, const void *const *kr, int np, int hd, float *s, int lds);
  void (*att_pv_f16)(const float *p, int ldp, int nq, const void *const *vr, int np, int hd, float *acc);
  /* Optional softmax steps of one row of scores s[0..n) of key positions pp[0..n) (NULL: the scalar loops
   * of cpu_attention.c, which use expf / tanhf):
   *   att_mask_max: s[j] = cap * tanh(s[j] * scale / cap) (cap 0: s[j] * scale) where lo <= pp[j] <= hi,
   *                 else -inf; returns the largest (-inf if none);
   *   att_exp_sum:  s[j] = exp(s[j] - m), 0 where s[j] is -inf; returns their sum.
   * Vector exp and tanh (relative error ~2e-7), the sum in a fixed lane order: a row's values depend on
   * the row alone (batch invariance). */
  float (*att_mask_max)(float *s, const int32_t *pp, int n, int32_t lo, int32_t hi, float scale, float cap);
  float (*att_exp_sum)(float *s, int n, float m);
  /* n half-precision KV elements (dt SM_DT_F16 or SM_DT_BF16) widened to float (exact), or one quantized
   * head row of n values (SM_DT_Q8_0, SM_DT_Q4_0, src/backend/kv_quant.h) dequantized */
  void (*widen)(float *out, const void *src, sm_dtype dt, size_t n);
  /* n floats to half-precision KV elements (dt SM_DT_F16 or SM_DT_BF16): the bits of sm_f32_to_f16 /
   * sm_f32_to_bf16 (round to nearest even; NaN as they write it) */
  void (*narrow)(void *dst, const float *x, sm_dtype dt, size_t n);
  bool (*i8_ok)(const sm_weight *w);
  void (*prep_xq)(const sm_weight *w, const float *x, int8_t *xq, float *xs, float *xsum);
  void (*matvec_i8)(const sm_mv_arg *a, int64_t r0, int64_t r1, float *y);
  /* Optional: y[t][r] = W[r] . x[t] for t < n, r in [r0, r1) of a 4-bit microscaling weight (mxfp4, nvfp4) that
   * fp4_ok takes, st the 256 values of its scale codes (NULL: the scalar loop of cpu_mxq.c); a token's result
   * does not depend on n or the other tokens (mxfp4 on AVX-512 VNNI and AVX2: x rounded to int16 per group,
   * unless f32x, SMELT_CPU_EXACT's float activations) */
  void (*mv_fp4)(const sm_weight *w, const float *const *x, float *const *y, int n, int64_t r0, int64_t r1,
                 const float *st, bool f32x);
  bool (*fp4_ok)(const sm_weight *w, bool f32x); /* the weights mv_fp4 takes (f32x: with x kept in float) */
  /* Optional: rows [r0, r0 + nr) x columns [k0, k0 + kc) of such a weight dequantized into dst[k][panel] (rows
   * >= nr zero), k0 and kc multiples of 16, kc <= SM_CPU_FP4_PACK_KC: the values cpu_mxq.c's scalar packing
   * writes */
  void (*pack_fp4)(const sm_weight *w, int64_t r0, int nr, int64_t k0, int kc, int panel, float *dst, const float *st);
} sm_cpu_kern;
#define SM_CPU_FP4_PACK_KC 256
bool sm_avx512_fp4_ok(const sm_weight *w, bool f32x);
bool sm_avx2_fp4_ok(const sm_weight *w, bool f32x);
void sm_avx2_mv_fp4(const sm_weight *w, const float *const *x, float *const *y, int n, int64_t r0, int64_t r1,
                    const float *st, bool f32x);
void sm_avx512_mv_fp4(const sm_weight *w, const float *const *x, float *const *y, int n, int64_t r0, int64_t r1,
                      const float *st, bool f32x);
void sm_avx512_pack_fp4(const sm_weight *w, int64_t r0, int nr, int64_t k0, int kc, int panel, float *dst,
                        const float *st);

/* y[n][rows] = x . W^T for a weight in an MLX microscaling mode (cpu_mxq.c); gemm: the GEMM for every n
 * (batch-invariant: each output one multiply-add chain in k order), else matvecs below 4 tokens */
void sm_cpu_mxq_matmul(sm_pool *pool, const sm_cpu_kern *k, const sm_weight *w, const float *x, int n, float *y,
                       bool gemm, bool f32x);

/* The routed experts of a 4-bit microscaling stack w (experts of `rows` rows) through the kernel's mv_fp4, each
 * chosen expert's rows read once for all its tokens: slots cnt[e] .. cnt[e + 1] of xs / ys (x rows, outputs
 * indexed by row) are expert e's, for every batch size (so a token's result is the same in any batch). _ok:
 * the kernel table and the weight take it. */
bool sm_cpu_mxq_experts_ok(const sm_cpu_kern *k, const sm_weight *w, bool f32x);
void sm_cpu_mxq_experts(sm_pool *pool, const sm_cpu_kern *k, const sm_weight *w, int64_t rows, int E, const int *cnt,
                        const float **xs, float **ys, bool f32x);
/* ys[i][0..rows) = ws[i] . xs[i] for i < nw: one-token matvecs of different weights and inputs (the chosen
 * experts of a decode step) in one dispatch of the backend's threads (cpu_backend.c) */
void sm_cpu_matvec_batch(sm_backend *be, const sm_weight *ws, const float *const *xs, float *const *ys, int nw);

/* Sets the mixture-of-experts ops of a CPU backend (cpu_moe.c): moe_route, matmul_experts, moe_combine,
 * swiglu_clamp, sigmoid_gate_rows (built on the backend's own matmul). */
void sm_cpu_moe_install(sm_backend *be);
/* Sets the tensor-parallel collectives of a CPU backend (cpu_comm.c): comm_init, all_reduce, broadcast,
 * all_gather through the group's shared memory block. */
void sm_cpu_comm_install(sm_backend *be);

/* ---- packed weights of the int8 path (pack.c) ----
 * prepare_weight repacks an MLX affine-quantized weight (bits 2..8, group 32/64/128) into row
 * blocks of 16 rows (the last one padded with zero rows). Row block b is ng = cols/gs groups of
 * gbytes = 32*es + 2*gs*bits bytes each, contiguous (one stream per row block):
 *   scales[16] and biases[16] of the group's 16 rows in the weight's scale dtype (es = 2 or 4
 *   bytes; biases 0 where the weight has none), then gs/32 super blocks of 64*bits bytes.
 * A super block holds codes c[r][j] of the 16 rows and 32 consecutive columns as 8 "quads"
 * v = j/4: quad v unpacked is 64 bytes, byte 4r+i = c[r][4v+i] (the operand layout of vpdpbusd
 * with 16 rows in the 16 int32 lanes, and of an AMX B tile row). Stored as bit planes of 64-byte
 * vectors, byte 4r+i of each:
 *   8 bits: 8 vectors, vector v = quad v;
 *   4-plane (bits 4; low 4 bits for 5 and 6): 4 vectors, vector v%4 holds quad v at bit 4*(v/4);
 *   2-plane (bits 2; low 2 bits for 3; bits 4-5 for 6): 2 vectors, vector v%2 holds quad v at
 *     bit 2*(v/2);
 *   1-plane (bit 4 for 5, bit 2 for 3): 1 vector, quad v at bit v.
 *   Order: 4-plane, 2-plane, 1-plane (6: 4+2, 5: 4+1, 3: 2+1).
 *
 * Canonical int8 arithmetic (every int8 kernel computes exactly this, bit for bit, so a token's
 * output is the same in a one-token step, a batch of any size, on VNNI or AMX, with any number of
 * threads). Per token, per group g of gs columns:
 *   lane[l] = sum over j = l, l+16, ... (in order) of x_j;  xsum_g = sm_cpu_sum16(lane)
 *   mx = max |x_j|;  xs_g = mx / 127;  inv = mx > 0 ? 127 / mx : 0;  xq_j = rint(x_j * inv)
 * and per output row r, with d_g = sum_j q_rj * xq_j (exact, int32):
 *   acc = fma((float)d_g, scale_rg * xs_g, acc);  bacc = fma(bias_rg, xsum_g, bacc)  (g ascending)
 *   y_r = acc + bacc. */
typedef struct {
  int64_t rows, cols, nrb, ng; /* nrb = row blocks, ng = groups per row */
  int bits, gs, es;            /* es: bytes per scale */
  sm_dtype sdt;                /* scale dtype */
  size_t gbytes, rbbytes;      /* bytes per (row block, group), per row block */
  uint8_t *data;
} sm_cpu_packed;
bool sm_cpu_packable(const sm_weight *w);
/* The packed copy of w (packing spread over pool's threads; pool may be NULL; huge_pages: on
 * transparent huge pages); NULL if w is not packable or memory runs out. */
sm_cpu_packed *sm_cpu_pack(const sm_weight *w, sm_pool *pool, bool huge_pages);
/* n bytes, 64-aligned; with huge_pages and n >= 2 MiB, 2 MiB-aligned and madvise(MADV_HUGEPAGE)'d
 * (free() releases it) */
void *sm_cpu_alloc_huge(size_t n, bool huge_pages);
void sm_cpu_packed_free(sm_cpu_packed *p);
/* the 8 quads of one super block at src */
void sm_cpu_unpack_sb_ref(const uint8_t *src, int bits, uint8_t q[8][64]);
/* row block rb as GEMM operands: U[cols/4][64] (quad k/4 of the 16 rows), SC/BI[ng][16] f32 */
void sm_cpu_unpack_rb_ref(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI);
/* ((l0+l8)+(l4+l12)) ... : the fixed summation tree of the canonical arithmetic */
float sm_cpu_sum16(const float l[16]);
/* canonical quantization of one token's x (natural order) */
void sm_cpu_quant_x_ref(const float *x, int64_t K, int gs, int8_t *xq, float *xs, float *xsum);
/* canonical int8 matmul, scalar, from the unpacked weight w: y[t][r] for n tokens (test oracle) */
void sm_cpu_i8_ref(const sm_weight *w, const float *x, int n, float *y);

/* Int8 kernels on packed weights (kern_i8_avx512.c: AVX-512 VNNI; kern_amx.c: AMX). The
 * activations are quantized once per matmul into xq[n][cols] (natural order; rows up to the next
 * multiple of 16 zero), xs/xsum[n][ng]. */
typedef struct {
  const sm_cpu_packed *p;
  const int8_t *xq;
  const float *xs, *xsum;
  int n;  /* tokens */
  int pf; /* software prefetch distance in bytes (decode), 0: none */
} sm_i8_arg;
bool sm_i8avx512_ok(void);
/* quantize tokens [t0, t1) of x[n][cols] (canonical) */
void sm_i8avx512_quant(const float *x, int64_t K, int gs, int t0, int t1, int8_t *xq, float *xs, float *xsum);
/* one token (a->n == 1): y[r] for the rows of row blocks [rb0, rb1) (y indexed from 0 = row 0) */
void sm_i8avx512_matvec(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y);
/* 2 to 4 tokens (a->n): y[t][r] (row stride rows) for the rows of row blocks [rb0, rb1), each token's
 * the bits of the one-token matvec */
void sm_i8avx512_matvec_n(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y);
/* unpack row block rb (vectorized sm_cpu_unpack_rb_ref) */
void sm_i8avx512_unpack(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI);
/* tokens [t0, t1) against one unpacked row block rb: y[t][rb*16 + i] (row stride ldy = rows,
 * valid rows only) */
void sm_i8avx512_gemm(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0,
                      int t1, float *y, int64_t ldy);
/* The same for CPUs without AVX-512 VNNI (kern_i8_avx2.c; with AVX-VNNI kern_i8_avxvnni.c) */
bool sm_i8avx2_ok(void);
void sm_i8avx2_quant(const float *x, int64_t K, int gs, int t0, int t1, int8_t *xq, float *xs, float *xsum);
void sm_i8avx2_matvec(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y);
void sm_i8avx2_matvec_n(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y);
void sm_i8avx2_unpack(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI);
void sm_i8avx2_gemm(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0, int t1,
                    float *y, int64_t ldy);
bool sm_i8avxvnni_ok(void);
void sm_i8avxvnni_quant(const float *x, int64_t K, int gs, int t0, int t1, int8_t *xq, float *xs, float *xsum);
void sm_i8avxvnni_matvec(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y);
void sm_i8avxvnni_matvec_n(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y);
void sm_i8avxvnni_unpack(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI);
void sm_i8avxvnni_gemm(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0,
                       int t1, float *y, int64_t ldy);
/* a set of them, by CPU */
typedef struct {
  const char *name; /* "avx512vnni", "avxvnni", "avx2" */
  void (*quant)(const float *x, int64_t K, int gs, int t0, int t1, int8_t *xq, float *xs, float *xsum);
  void (*matvec)(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y);
  void (*unpack)(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI);
  void (*gemm)(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb, int t0, int t1,
               float *y, int64_t ldy);
  /* 2 to 4 tokens streaming the packed blocks */
  void (*matvec_n)(const sm_i8_arg *a, int64_t rb0, int64_t rb1, float *y);
} sm_i8_kern;
/* the int8 kernels that go with the float kernel set k on this CPU; NULL: none */
const sm_i8_kern *sm_i8_kernels_for(const sm_cpu_kern *k);
/* name of the int8 kernel set a CPU backend uses ("avx512vnni", "avxvnni", "avx2"), "none" */
const char *sm_cpu_backend_i8_name(const sm_backend *be);

/* AMX: available (CPU flags and the kernel's permission for tile data, asked for once) */
bool sm_amx_ok(void);
/* tokens [t0, t1) (t0 % 16 == 0) against nrb <= 4 unpacked row blocks rb0.. (U[j] = U + j*16*cols,
 * SC/BI likewise + j*ng*16); work: scratch of SM_AMX_SCRATCH bytes, 64-aligned */
#define SM_AMX_SCRATCH (4 * 1024 + 4 * 16 * 16 * 4)
void sm_amx_gemm(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb0, int nrb, int t0,
                 int t1, float *y, int64_t ldy, void *work);
void sm_amx_release(void); /* end of a job on this thread: tile state back to init */

/* Read bandwidth (bytes/s) with every thread of pool, on a buffer well past the caches, loads
 * as wide as k's (bandwidth.c); 0 if the buffer cannot be allocated. Takes about a second. */
double sm_cpu_read_bandwidth(sm_pool *pool, const sm_cpu_kern *k, bool huge_pages);

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
/* Whether a matmul of n tokens with w runs on the int8-activation path (off with SMELT_CPU_EXACT=1
 * at backend creation, or where no kernel exists), and whether it runs on AMX tiles. */
bool sm_cpu_backend_uses_i8(const sm_backend *be, const sm_weight *w, int n);
bool sm_cpu_backend_uses_amx(const sm_backend *be, const sm_weight *w, int n);
/* SMELT_CPU_EXACT=1 at backend creation: float activations everywhere */
bool sm_cpu_backend_exact(const sm_backend *be);

/* ---- recurrent-model ops (ssm.c), on the current batch b (see backend.h) ---- */
/* the batch meets the recurrent ops' rule (each sequence's tokens one run of consecutive positions) */
bool sm_cpu_batch_rec_ok(const sm_batch *b);
void sm_cpu_conv1d(sm_pool *pool, const sm_batch *b, float *out, const float *x, const float *w, const float *bias,
                   int C, int K, bool act_silu, const sm_kv_cache *kv, int layer);
void sm_cpu_ssm_scan(sm_pool *pool, const sm_batch *b, float *y, const float *x, const float *B, const float *Cm,
                     int ld, const float *dt_in, const float *dt_bias, const float *A_log, const float *D, int nh,
                     int P, int G, int N, float dt_min, float dt_max, const sm_kv_cache *kv, int layer);
void sm_cpu_gated_delta(sm_pool *pool, const sm_batch *b, float *y, const float *q, const float *k, const float *v,
                        int ld, const float *a, const float *bb, const float *A_log, const float *dt_bias, int Hk,
                        int Hv, int Dk, int Dv, const sm_kv_cache *kv, int layer);
void sm_cpu_gated_rmsnorm(sm_pool *pool, float *out, const float *x, const float *z, const float *w, int n, int dim,
                          int group, int wdim, float eps, bool norm_first);

/* shared helpers */
/* n floats into a cache row of a float type: f32 copied, f16 / bf16 through the kernel table's narrow */
static inline void sm_cpu_kv_narrow(const sm_cpu_kern *k, void *dst, sm_dtype dt, const float *x, size_t n) {
  if (dt == SM_DT_F32) memcpy(dst, x, n * sizeof(float));
  else k->narrow(dst, x, dt, n);
}
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
