/* CPU backend tests: every op against a plain double-precision reference on random
 * data, for every ISA path this machine supports (scalar, avx2, avx512).
 * Quantized weights are produced by an independent quantizer written here after
 * MLX's affine quantize (mlx/backend/cpu/quantized.cpp: values packed low bits first
 * into uint32 words for 2/4/8 bits, into 3-byte (3, 6 bits) or 5-byte (5 bits)
 * little-endian packs otherwise), so a packing mismatch fails the matmul tests.
 *
 * Error bounds (checked):
 *   matmul / embed: |y - ref| <= 1e-5 * sum_k |x_k * w_rk| + 1e-30     (float accumulation)
 *   matmul on the int8-activation decode path (n < 4 tokens, VNNI kernels; off with
 *   SMELT_CPU_EXACT=1): x is rounded per weight group g to xs_g * xq with
 *   xs_g = max_{k in g} |x_k| / 127 and integer xq, so |x_k - xs_g xq_k| <= xs_g / 2; the
 *   weight part scale*q is exact and the bias term uses exact float sums of x, hence
 *     |y_r - ref_r| <= sum_g xs_g/2 * sum_{k in g} |w_rk - bias_rg|  (= |scale_rg| q_rk)
 *                      + 1e-5 * sum_k |x_k| (|w_rk - bias_rg| + |bias_rg|)   (float rounding)
 *   rmsnorm, layernorm, rope, elementwise: |y - ref| <= 1e-5 * max(1, |ref|); rope_ext 2e-5
 *   attention: |y - ref| <= 1e-5 * max(1, max|V|) */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/kv_quant.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail = 0;
#define CHECK(c, ...) \
  do { \
    if (!(c)) { \
      g_fail++; \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__); \
      printf("\n"); \
    } \
  } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* [0,1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static size_t dts(sm_dtype t) { return t == SM_DT_F32 ? 4 : 2; }
static void st_f(void *p, size_t i, sm_dtype t, float v) {
  if (t == SM_DT_F32) ((float *)p)[i] = v;
  else if (t == SM_DT_F16) ((uint16_t *)p)[i] = sm_f32_to_f16(v);
  else ((uint16_t *)p)[i] = sm_f32_to_bf16(v);
}
static double ld_f(const void *p, size_t i, sm_dtype t) {
  if (t == SM_DT_F32) return ((const float *)p)[i];
  if (t == SM_DT_F16) return sm_f16_to_f32(((const uint16_t *)p)[i]);
  return sm_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* A test weight plus its exact dequantized values (double). */
typedef struct {
  sm_weight w;
  void *data, *scales, *biases;
  double *deq;
} tw;

/* MLX-style affine quantize of wf[rows][cols]: returns packed data in MLX layout. */
static void make_quant(tw *t, int64_t rows, int64_t cols, int bits, int gs, sm_dtype sdt) {
  float *wf = malloc(sizeof(float) * rows * cols);
  for (int64_t i = 0; i < rows * cols; i++) wf[i] = frand(-1.f, 1.f) * (i % 7 == 0 ? 3.f : 1.f);
  int64_t ng = cols / gs;
  size_t rowbytes = (size_t)cols * bits / 8;
  uint8_t *out = calloc(rows * rowbytes, 1); /* exact size: over-reads show up under ASan */
  t->scales = malloc(dts(sdt) * rows * ng);
  t->biases = malloc(dts(sdt) * rows * ng);
  t->deq = malloc(sizeof(double) * rows * cols);
  int n_bins = (1 << bits) - 1;
  int pow2 = (bits & (bits - 1)) == 0;
  int el_per_pack = pow2 ? 32 / bits : (bits == 6 ? 4 : 8);
  int bytes_per_pack = pow2 ? 4 : (bits == 5 ? 5 : 3);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t g = 0; g < ng; g++) {
      const float *wg = wf + r * cols + g * gs;
      float mn = wg[0], mx = wg[0];
      for (int j = 1; j < gs; j++) {
        if (wg[j] < mn) mn = wg[j];
        if (wg[j] > mx) mx = wg[j];
      }
      float scale = (mx - mn) / n_bins;
      if (scale < 1e-7f) scale = 1e-7f;
      size_t si = r * ng + g;
      st_f(t->scales, si, sdt, scale);
      st_f(t->biases, si, sdt, mn);
      double s = ld_f(t->scales, si, sdt), b = ld_f(t->biases, si, sdt); /* as stored */
      uint8_t *gp = out + r * rowbytes + (size_t)g * gs * bits / 8;
      for (int p = 0; p < gs / el_per_pack; p++) {
        uint64_t pack = 0;
        for (int k = 0; k < el_per_pack; k++) {
          int j = p * el_per_pack + k;
          double qv = rint((wg[j] - b) / s);
          if (qv < 0) qv = 0;
          if (qv > n_bins) qv = n_bins;
          pack |= (uint64_t)qv << (k * bits);
          t->deq[r * cols + g * gs + j] = s * qv + b;
        }
        for (int by = 0; by < bytes_per_pack; by++) gp[p * bytes_per_pack + by] = (uint8_t)(pack >> (8 * by));
      }
    }
  }
  free(wf);
  t->data = out;
  t->w = (sm_weight){.rows = rows,
                     .cols = cols,
                     .bits = bits,
                     .group_size = gs,
                     .dtype = sdt,
                     .data = out,
                     .scales = t->scales,
                     .biases = t->biases};
}

static void make_dense(tw *t, int64_t rows, int64_t cols, sm_dtype dt) {
  t->data = malloc(dts(dt) * rows * cols);
  t->deq = malloc(sizeof(double) * rows * cols);
  for (int64_t i = 0; i < rows * cols; i++) {
    st_f(t->data, i, dt, frand(-1.f, 1.f));
    t->deq[i] = ld_f(t->data, i, dt);
  }
  t->scales = t->biases = NULL;
  t->w = (sm_weight){.rows = rows, .cols = cols, .bits = 0, .dtype = dt, .data = t->data};
}
static void free_tw(tw *t) {
  free(t->data);
  free(t->scales);
  free(t->biases);
  free(t->deq);
}

static double g_worst_mm = 0, g_worst_i8 = 0, g_worst_i8_rel = 0;
static int g_n_i8 = 0;
static void check_matmul(sm_backend *be, tw *t, int n, const char *what) {
  int64_t M = t->w.rows, K = t->w.cols;
  float *x = malloc(sizeof(float) * n * K), *y = malloc(sizeof(float) * n * M);
  for (int64_t i = 0; i < n * K; i++) x[i] = frand(-1.f, 1.f) * (i % 13 == 0 ? 4.f : 1.f);
  for (int64_t i = 0; i < n * M; i++) y[i] = NAN;
  CHECK(be->prepare_weight(be, &t->w) == SMELT_OK, "prepare %s: %s", what, sm_errmsg());
  be->matmul(be, SM_MM_OTHER, &t->w, x, n, y);
  const bool i8 = sm_cpu_backend_uses_i8(be, &t->w, n);
  const int gs = t->w.bits ? t->w.group_size : (int)K;
  double worst = 0, worst_b = 0;
  for (int i = 0; i < n; i++)
    for (int64_t r = 0; r < M; r++) {
      double ref = 0, mag = 0, bound = 0, mag2 = 0;
      for (int64_t k = 0; k < K; k++) {
        double p = (double)x[i * K + k] * t->deq[r * K + k];
        ref += p;
        mag += fabs(p);
      }
      if (i8) {
        /* ref8: the int8 arithmetic as specified in cpu_internal.h, in double from the
         * float-rounded xq (float inv = 127/max, xq = rint(x*inv)): the kernel must match
         * it to float rounding, and ref8 must be within the rounding bound of ref */
        double ref8 = 0;
        for (int64_t g = 0; g < K / gs; g++) {
          size_t si = (size_t)(r * (K / gs) + g);
          double sq = 0, sc = ld_f(t->w.scales, si, t->w.dtype),
                 b = t->w.biases ? ld_f(t->w.biases, si, t->w.dtype) : 0;
          float mxf = 0.f;
          for (int j = 0; j < gs; j++) mxf = fmaxf(mxf, fabsf(x[i * K + g * gs + j]));
          float inv = mxf > 0.f ? 127.f / mxf : 0.f;
          double xsg = (double)(mxf / 127.f), dq = 0, xsum = 0;
          for (int j = 0; j < gs; j++) {
            float xf = x[i * K + g * gs + j];
            double wq = fabs(t->deq[r * K + g * gs + j] - b), qv = rint((t->deq[r * K + g * gs + j] - b) / sc);
            dq += qv * rintf(xf * inv);
            xsum += xf;
            sq += wq;
            mag2 += fabs(xf) * (wq + fabs(b));
          }
          ref8 += sc * xsg * dq + b * xsum;
          bound += xsg / 2.0 * sq;
        }
        double e = fabs(y[i * M + r] - ref), b = bound * (1 + 1e-4) + 1e-5 * mag2 + 1e-30;
        double e8 = fabs(y[i * M + r] - ref8), b8 = 1e-5 * mag2 + 1e-30;
        if (!(e <= b)) {
          worst_b = INFINITY;
          CHECK(0, "matmul %s n=%d row %lld: int8 err %.3g > bound %.3g", what, n, (long long)r, e, b);
        } else if (e / b > worst_b) worst_b = e / b;
        if (!(e8 <= b8))
          CHECK(0, "matmul %s n=%d row %lld: differs from the int8 arithmetic by %.3g > %.3g", what, n, (long long)r,
                e8, b8);
        if (e / (mag + 1e-30) > g_worst_i8_rel) g_worst_i8_rel = e / (mag + 1e-30);
        continue;
      }
      double e = fabs(y[i * M + r] - ref) / (mag + 1e-30);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : (e > worst ? e : worst);
    }
  if (i8) {
    g_n_i8++;
    if (worst_b > g_worst_i8) g_worst_i8 = worst_b;
  }
  if (worst > g_worst_mm) g_worst_mm = worst;
  CHECK(worst <= 1e-5, "matmul %s n=%d: rel err %.3g", what, n, worst);
  be->release_weight(be, &t->w);
  free(x);
  free(y);
}

static void test_matmul(sm_backend *be) {
  static const int bitsv[] = {2, 3, 4, 5, 6, 8}, gsv[] = {32, 64, 128};
  static const sm_dtype dtv[] = {SM_DT_F16, SM_DT_BF16, SM_DT_F32};
  static const int rowsv[] = {1, 5, 37, 67, 33};
  int ci = 0;
  char what[128];
  for (int bi = 0; bi < 6; bi++)
    for (int gi = 0; gi < 3; gi++)
      for (int di = 0; di < 3; di++, ci++) {
        int gs = gsv[gi];
        int64_t rows = rowsv[ci % 5], cols = (int64_t)gs * (1 + ci % 4) * (gs == 32 ? 3 : 1);
        tw t;
        make_quant(&t, rows, cols, bitsv[bi], gs, dtv[di]);
        snprintf(what, sizeof what, "q%d g%d dt%d %lldx%lld", bitsv[bi], gs, (int)dtv[di], (long long)rows,
                 (long long)cols);
        check_matmul(be, &t, 1, what);
        check_matmul(be, &t, 2, what);
        check_matmul(be, &t, 7, what);
        free_tw(&t);
      }
  /* bigger shapes: threaded matvec, several K chunks with a remainder, panel edges */
  for (int bi = 0; bi < 6; bi++) {
    tw t;
    make_quant(&t, 70 + bi, 640, bitsv[bi], 64, SM_DT_BF16);
    snprintf(what, sizeof what, "q%d big", bitsv[bi]);
    check_matmul(be, &t, 1, what);
    check_matmul(be, &t, 13, what);
    free_tw(&t);
  }
  {
    tw t;
    make_quant(&t, 300, 2048, 4, 64, SM_DT_F16);
    check_matmul(be, &t, 1, "q4 300x2048");
    check_matmul(be, &t, 20, "q4 300x2048");
    free_tw(&t);
  }
  /* int8 path shapes: odd numbers of 128-blocks, a partial 16-group window, odd rows */
  {
    static const int64_t sh[][4] = {{4, 896, 64, 3},   {8, 1152, 32, 7},  {4, 2176, 128, 5}, {8, 640, 64, 9},
                                    {8, 1088, 32, 11}, {8, 1280, 128, 6}, {4, 1536, 32, 4}};
    static const sm_dtype sdt[] = {SM_DT_F16, SM_DT_BF16, SM_DT_F32};
    for (int s = 0; s < 7; s++) {
      tw t;
      make_quant(&t, sh[s][3], sh[s][1], (int)sh[s][0], (int)sh[s][2], sdt[s % 3]);
      snprintf(what, sizeof what, "q%d g%d %lldx%lld", (int)sh[s][0], (int)sh[s][2], (long long)sh[s][3],
               (long long)sh[s][1]);
      check_matmul(be, &t, 1, what);
      check_matmul(be, &t, 3, what);
      free_tw(&t);
    }
  }
  /* every bit width x group size x scale dtype at sizes around the int8 threshold (cols 576-2176; >= 1024 takes the int8 path): odd row
   * counts (NR-row tails), odd numbers of 64-element blocks, partial 16-group windows;
   * n = 1, 2 (decode, int8 path where supported) and 7 (gemm) */
  {
    static const int64_t colsv[] = {576, 1088, 2176, 704, 1216, 640};
    static const int rowsv8[] = {1, 3, 6, 9, 13, 5, 2};
    int si = 0;
    for (int bi = 0; bi < 6; bi++)
      for (int gi = 0; gi < 3; gi++)
        for (int di = 0; di < 3; di++, si++) {
          int gs = gsv[gi];
          int64_t cols = colsv[si % 6];
          if (cols % gs) cols += gs - cols % gs;
          int64_t rows = rowsv8[si % 7];
          tw t;
          make_quant(&t, rows, cols, bitsv[bi], gs, dtv[di]);
          snprintf(what, sizeof what, "i8 q%d g%d dt%d %lldx%lld", bitsv[bi], gs, (int)dtv[di], (long long)rows,
                   (long long)cols);
          check_matmul(be, &t, 1, what);
          check_matmul(be, &t, 2, what);
          if (si % 3 == 0) check_matmul(be, &t, 7, what);
          free_tw(&t);
        }
  }
  /* dense, odd sizes */
  static const int64_t dshape[][2] = {{3, 37}, {17, 300}, {40, 513}, {65, 16}};
  for (int di = 0; di < 3; di++)
    for (int s = 0; s < 4; s++) {
      tw t;
      make_dense(&t, dshape[s][0], dshape[s][1], dtv[di]);
      snprintf(what, sizeof what, "dense dt%d %lldx%lld", (int)dtv[di], (long long)dshape[s][0],
               (long long)dshape[s][1]);
      check_matmul(be, &t, 1, what);
      check_matmul(be, &t, 9, what);
      free_tw(&t);
    }
  /* unsupported weights are rejected */
  tw t;
  make_quant(&t, 4, 64, 4, 64, SM_DT_F16);
  sm_weight bad = t.w;
  bad.bits = 7;
  CHECK(be->prepare_weight(be, &bad) != SMELT_OK, "bits=7 accepted");
  bad = t.w;
  bad.group_size = 48;
  CHECK(be->prepare_weight(be, &bad) != SMELT_OK, "group 48 accepted");
  /* row view */
  sm_weight v = sm_weight_rows(&t.w, 1, 2);
  float row[64];
  sm_weight_row_f32(&v, 1, row);
  double e = 0;
  for (int j = 0; j < 64; j++) e = fmax(e, fabs(row[j] - t.deq[2 * 64 + j]));
  CHECK(e < 1e-6, "sm_weight_rows/row_f32 err %g", e);
  free_tw(&t);
}

static sm_batch mk_batch(int n, int32_t *tok, int32_t *pos, int32_t *seq, int n_seqs, int max_blocks, int32_t *table,
                         int n_out, int32_t *out_rows) {
  return (sm_batch){.n_tokens = n,
                    .tokens = tok,
                    .pos = pos,
                    .seq = seq,
                    .n_seqs = n_seqs,
                    .max_blocks = max_blocks,
                    .block_table = table,
                    .n_out = n_out,
                    .out_rows = out_rows};
}

/* matmul_group (a layer's q/k/v, gate/up in one dispatch) gives the bits of a matmul each, for every weight
 * kind it takes on its own path (packed int8, unpacked int8 and float rows, dense) and the ones it hands to
 * matmul (microscaling aside, a batch of tokens) */
static void test_matmul_group(sm_backend *be) {
  static const int64_t sh[][3] = {/* rows, bits (0: dense f32), group */ {96, 4, 64},
                                  {32, 4, 64},
                                  {40, 8, 32},
                                  {20, 4, 32},
                                  {70, 3, 64},
                                  {16, 0, 0}};
  /* the weights of a set (-1: none) and their cols: packed int8 (q4, q8); narrow rows (unpacked); 3-bit and
   * dense beside a packed one */
  static const int sets[][4] = {{0, 1, 2, 2048}, {3, 3, -1, 256}, {1, 4, 5, 2048}};
  for (int set = 0; set < 3; set++)
    for (int n = 1; n <= 3; n += 2) {
      const int64_t K = sets[set][3];
      const int nw = sets[set][2] < 0 ? 2 : 3;
      tw t[3];
      const sm_weight *ws[3];
      float *yg[3], *ys[3];
      sm_mm_role roles[3] = {SM_MM_Q, SM_MM_K, SM_MM_V};
      for (int i = 0; i < nw; i++) {
        const int64_t *q = sh[sets[set][i]];
        if (q[1]) make_quant(&t[i], q[0], K, (int)q[1], (int)q[2], SM_DT_BF16);
        else {
          memset(&t[i], 0, sizeof t[i]);
          float *wf = malloc(sizeof(float) * q[0] * K);
          for (int64_t k = 0; k < q[0] * K; k++) wf[k] = frand(-1.f, 1.f);
          t[i].data = wf;
          t[i].w = (sm_weight){.data = wf, .rows = q[0], .cols = K, .dtype = SM_DT_F32};
        }
        CHECK(be->prepare_weight(be, &t[i].w) == SMELT_OK, "prepare group weight %d: %s", i, sm_errmsg());
        ws[i] = &t[i].w;
        yg[i] = malloc(sizeof(float) * n * q[0]);
        ys[i] = malloc(sizeof(float) * n * q[0]);
      }
      float *x = malloc(sizeof(float) * n * K);
      for (int64_t k = 0; k < n * K; k++) x[k] = frand(-1.f, 1.f) * (k % 11 == 0 ? 3.f : 1.f);
      be->matmul_group(be, roles, ws, x, n, yg, nw);
      for (int i = 0; i < nw; i++) be->matmul(be, roles[i], ws[i], x, n, ys[i]);
      for (int i = 0; i < nw; i++)
        CHECK(!memcmp(yg[i], ys[i], sizeof(float) * n * ws[i]->rows), "matmul_group set %d n=%d weight %d differs", set,
              n, i);
      for (int i = 0; i < nw; i++) {
        be->release_weight(be, &t[i].w);
        if (t[i].deq) free_tw(&t[i]);
        else free(t[i].data);
        free(yg[i]);
        free(ys[i]);
      }
      free(x);
    }
}

static void test_elementwise(sm_backend *be) {
  const size_t n = 100003; /* big enough for the threaded path, odd */
  float *a = malloc(n * 4), *b = malloc(n * 4), *y = malloc(n * 4);
  for (int round = 0; round < 2; round++) {
    size_t m = round ? n : 37;
    for (size_t i = 0; i < m; i++) {
      a[i] = frand(-8, 8) * (i % 97 == 3 ? 15.f : 1.f);
      b[i] = frand(-2, 2);
    } /* some in +-120 */
    double w = 0;
    be->silu_mul(be, y, a, b, m);
    for (size_t i = 0; i < m; i++) {
      double g = a[i], r = g / (1 + exp(-g)) * b[i];
      w = fmax(w, fabs(y[i] - r) / fmax(1, fabs(r)));
    }
    CHECK(w < 1e-5, "silu_mul err %g", w);
    memcpy(y, a, m * 4);
    be->silu_mul(be, y, y, b, m); /* aliasing */
    w = 0;
    for (size_t i = 0; i < m; i++) {
      double g = a[i], r = g / (1 + exp(-g)) * b[i];
      w = fmax(w, fabs(y[i] - r) / fmax(1, fabs(r)));
    }
    CHECK(w < 1e-5, "silu_mul alias err %g", w);
    be->gelu_mul(be, y, a, b, m);
    w = 0;
    for (size_t i = 0; i < m; i++) {
      double g = a[i], r = 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * b[i];
      w = fmax(w, fabs(y[i] - r) / fmax(1, fabs(r)));
    }
    CHECK(w < 1e-5, "gelu_mul err %g", w);
    memcpy(y, a, m * 4);
    be->add(be, y, b, m);
    w = 0;
    for (size_t i = 0; i < m; i++) w = fmax(w, fabs(y[i] - ((double)a[i] + b[i])));
    CHECK(w < 1e-5, "add err %g", w);
    memcpy(y, a, m * 4);
    be->scale(be, y, 0.37f, m);
    w = 0;
    for (size_t i = 0; i < m; i++) w = fmax(w, fabs(y[i] - a[i] * 0.37) / fmax(1, fabs(a[i])));
    CHECK(w < 1e-5, "scale err %g", w);
    memcpy(y, a, m * 4);
    be->softcap(be, y, 3.0f, m);
    w = 0;
    for (size_t i = 0; i < m; i++) w = fmax(w, fabs(y[i] - 3.0 * tanh(a[i] / 3.0)));
    CHECK(w < 1e-5, "softcap err %g", w);
  }
  /* add_rows */
  int rows = 301, dim = 333;
  float *yy = malloc(sizeof(float) * rows * dim), *y0 = malloc(sizeof(float) * rows * dim), bb[333];
  for (int i = 0; i < rows * dim; i++) y0[i] = yy[i] = frand(-1, 1);
  for (int j = 0; j < dim; j++) bb[j] = frand(-1, 1);
  be->add_rows(be, yy, bb, rows, dim);
  double w = 0;
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < dim; j++) w = fmax(w, fabs(yy[r * dim + j] - ((double)y0[r * dim + j] + bb[j])));
  CHECK(w < 1e-6, "add_rows err %g", w);
  /* rmsnorm */
  for (int off = 0; off < 2; off++) {
    float *wt = malloc(sizeof(float) * dim);
    for (int j = 0; j < dim; j++) wt[j] = frand(-1, 1);
    be->rmsnorm(be, yy, y0, wt, rows, dim, 1e-5f, (float)off);
    w = 0;
    for (int r = 0; r < rows; r++) {
      double ss = 0;
      for (int j = 0; j < dim; j++) ss += (double)y0[r * dim + j] * y0[r * dim + j];
      double inv = 1 / sqrt(ss / dim + 1e-5);
      for (int j = 0; j < dim; j++) {
        double ref = y0[r * dim + j] * inv * (wt[j] + off);
        w = fmax(w, fabs(yy[r * dim + j] - ref) / fmax(1, fabs(ref)));
      }
    }
    CHECK(w < 1e-5, "rmsnorm off=%d err %g", off, w);
    memcpy(yy, y0, sizeof(float) * rows * dim);
    be->rmsnorm(be, yy, yy, wt, rows, dim, 1e-5f, (float)off); /* in place */
    double w2 = 0;
    float *tmp = malloc(sizeof(float) * rows * dim);
    be->rmsnorm(be, tmp, y0, wt, rows, dim, 1e-5f, (float)off);
    for (int i = 0; i < rows * dim; i++) w2 = fmax(w2, fabs(tmp[i] - yy[i]));
    CHECK(w2 == 0, "rmsnorm in-place differs %g", w2);
    free(tmp);
    free(wt);
  }
  free(yy);
  free(y0);
  free(a);
  free(b);
  free(y);
}

static void test_rope_embed_gather(sm_backend *be) {
  enum { NT = 9, NH = 3, HD = 40, ROT = 24 };
  int32_t tok[NT], pos[NT], seq[NT], out_rows[3] = {8, 0, 4}, table[1] = {0};
  for (int t = 0; t < NT; t++) {
    tok[t] = (t * 7) % 50;
    pos[t] = t * 1000 + 3;
    seq[t] = 0;
  }
  tok[5] = 4999; /* out of range for a 50-row embedding -> zeros */
  sm_batch b = mk_batch(NT, tok, pos, seq, 1, 1, table, 3, out_rows);
  CHECK(be->set_batch(be, &b) == SMELT_OK, "set_batch");
  /* destroy the caller's arrays: the backend must have copied them */
  int32_t pos_copy[NT];
  memcpy(pos_copy, pos, sizeof pos);
  memset(pos, 0x7f, sizeof pos);
  memset(tok, 0x7f, sizeof tok);
  float x[NT * NH * HD], x0[NT * NH * HD], inv[ROT / 2];
  for (int i = 0; i < NT * NH * HD; i++) x0[i] = x[i] = frand(-1, 1);
  for (int i = 0; i < ROT / 2; i++) inv[i] = powf(10000.f, -2.f * i / ROT);
  be->rope(be, x, NH, HD, ROT, inv);
  double w = 0;
  for (int t = 0; t < NT; t++)
    for (int h = 0; h < NH; h++) {
      const float *v0 = x0 + (t * NH + h) * HD;
      float *v = x + (t * NH + h) * HD;
      for (int i = 0; i < HD; i++) {
        double ref;
        if (i < ROT / 2) {
          double a = (double)((float)pos_copy[t] * inv[i]);
          ref = v0[i] * cos(a) - v0[i + ROT / 2] * sin(a);
        } else if (i < ROT) {
          double a = (double)((float)pos_copy[t] * inv[i - ROT / 2]);
          ref = v0[i - ROT / 2] * sin(a) + v0[i] * cos(a);
        } else ref = v0[i];
        w = fmax(w, fabs(v[i] - ref));
      }
    }
  CHECK(w < 1e-5, "rope err %g", w);
  /* embed: 4-bit quantized and bf16 dense */
  for (int kind = 0; kind < 2; kind++) {
    tw t;
    if (kind == 0) make_quant(&t, 50, 128, 4, 32, SM_DT_F16);
    else make_dense(&t, 50, 128, SM_DT_BF16);
    float *o = malloc(sizeof(float) * NT * 128);
    be->embed(be, &t.w, o);
    double e = 0;
    for (int i = 0; i < NT; i++) {
      int tk = (i * 7) % 50;
      for (int j = 0; j < 128; j++) e = fmax(e, fabs(o[i * 128 + j] - (i == 5 ? 0.0 : t.deq[tk * 128 + j])));
    }
    CHECK(e < 1e-6, "embed kind %d err %g", kind, e);
    free(o);
    free_tw(&t);
  }
  /* gather_out */
  float src[NT * 5], dst[3 * 5];
  for (int i = 0; i < NT * 5; i++) src[i] = (float)i;
  be->gather_out(be, dst, src, 5);
  int ok = 1;
  int32_t orow[3] = {8, 0, 4};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++) ok &= dst[i * 5 + j] == src[orow[i] * 5 + j];
  CHECK(ok, "gather_out");
  /* invalid batches are rejected */
  int32_t bad_seq[NT] = {0, 0, 0, 0, 0, 0, 0, 0, 3};
  sm_batch bb = mk_batch(NT, tok, pos_copy, bad_seq, 1, 1, table, 0, NULL);
  CHECK(be->set_batch(be, &bb) != SMELT_OK, "bad seq accepted");
  int32_t bad_out[1] = {NT};
  bb = mk_batch(NT, tok, pos_copy, seq, 1, 1, table, 1, bad_out);
  CHECK(be->set_batch(be, &bb) != SMELT_OK, "bad out_rows accepted");
}

/* Paged attention: two sequences with shuffled blocks, GQA, causal, window, softcap. */
/* nh query heads over nkv KV heads of head_dim hd (GQA groups, MQA with > 16 heads per KV
 * head, head_dim not a multiple of 16); a prefill of P0 tokens then a mixed batch */
/* layernorm (with and without bias, in place) and rope_ext (position rows, mscale, the Llama-4
 * query scaling) against double references */
static void test_layernorm_rope_ext(sm_backend *be) {
  enum { R = 5, D = 48 };
  float x[R * D], w[D], bi[D], y[R * D];
  for (int i = 0; i < R * D; i++) x[i] = frand(-2, 2) + (i % D == 3 ? 5.f : 0.f); /* a mean far from 0 */
  for (int j = 0; j < D; j++) {
    w[j] = frand(0.5f, 1.5f);
    bi[j] = frand(-1, 1);
  }
  for (int withb = 0; withb < 2; withb++) {
    be->layernorm(be, y, x, w, withb ? bi : NULL, R, D, 1e-5f);
    double e = 0;
    for (int r = 0; r < R; r++) {
      double mu = 0, var = 0;
      for (int j = 0; j < D; j++) mu += x[r * D + j];
      mu /= D;
      for (int j = 0; j < D; j++) var += (x[r * D + j] - mu) * (x[r * D + j] - mu);
      var /= D;
      for (int j = 0; j < D; j++) {
        double ref = (x[r * D + j] - mu) / sqrt(var + 1e-5) * w[j] + (withb ? bi[j] : 0.0);
        e = fmax(e, fabs(y[r * D + j] - ref) / fmax(1.0, fabs(ref)));
      }
    }
    CHECK(e < 1e-5, "layernorm (bias %d) err %g", withb, e);
  }
  memcpy(y, x, sizeof x);
  be->layernorm(be, y, y, w, bi, R, D, 1e-5f);
  float y2[R * D];
  be->layernorm(be, y2, x, w, bi, R, D, 1e-5f);
  CHECK(!memcmp(y, y2, sizeof y), "layernorm in place differs");

  enum { NT = 7, NH = 2, HD = 20, ROT = 12, NROWS = 3, POS0 = 10 };
  int32_t tok[NT] = {0}, pos[NT] = {0, 9, 10, 11, 12, 40, 95}, seq[NT] = {0}, table[1] = {0};
  sm_batch b = mk_batch(NT, tok, pos, seq, 1, 1, table, 0, NULL);
  CHECK(be->set_batch(be, &b) == SMELT_OK, "set_batch");
  float inv[NROWS * ROT / 2];
  for (int r = 0; r < NROWS; r++)
    for (int i = 0; i < ROT / 2; i++) inv[r * ROT / 2 + i] = powf(10000.f, -2.f * i / ROT) / (1.f + r);
  for (int variant = 0; variant < 2; variant++) {
    sm_rope_ext e = {inv, ROT, NROWS, POS0, 1.19f, variant ? 0.1f : 0.f, variant ? 32 : 0};
    float v[NT * NH * HD], v0[NT * NH * HD];
    for (int i = 0; i < NT * NH * HD; i++) v0[i] = v[i] = frand(-1, 1);
    be->rope_ext(be, v, NH, HD, &e);
    double err = 0;
    for (int t = 0; t < NT; t++) {
      const int p = pos[t], row = p < POS0 ? 0 : (p - POS0 + 1 < NROWS - 1 ? p - POS0 + 1 : NROWS - 1);
      const double all = variant ? 1.0 + 0.1 * log(1.0 + floor(p / 32.0)) : 1.0;
      for (int h = 0; h < NH; h++) {
        const float *a = v0 + (t * NH + h) * HD;
        for (int i = 0; i < HD; i++) {
          double ref;
          if (i < ROT) {
            const int k = i < ROT / 2 ? i : i - ROT / 2;
            const double ang = (double)((float)p * inv[row * ROT / 2 + k]);
            ref = i < ROT / 2 ? a[i] * cos(ang) - a[i + ROT / 2] * sin(ang) : a[k] * sin(ang) + a[i] * cos(ang);
            ref *= 1.19;
          } else ref = a[i];
          ref *= all;
          err = fmax(err, fabs(v[(t * NH + h) * HD + i] - ref) / fmax(1.0, fabs(ref)));
        }
      }
    }
    CHECK(err < 2e-5, "rope_ext (variant %d) err %g", variant, err);
  }
}

/* a value as a KV cache of type dt stores it */
static float kv_round(float v, sm_dtype dt) {
  if (dt == SM_DT_F16) return sm_f16_to_f32(sm_f32_to_f16(v));
  if (dt == SM_DT_BF16) return sm_bf16_to_f32(sm_f32_to_bf16(v));
  return v;
}

/* rows of hd random values in [-1, 1] that a cache of dt holds exactly: rounded for f16 / bf16; for
 * q8_0 / q4_0 codes times a power-of-two scale per group of 32, the group's extreme code present
 * once (127 for q8_0, -8 for q4_0), so that quantizing gives back this scale and these codes */
static void kv_fill(float *x, int rows, int hd, sm_dtype dt) {
  if (!sm_kv_quantized(dt)) {
    for (size_t i = 0; i < (size_t)rows * hd; i++) x[i] = kv_round(frand(-1, 1), dt);
    return;
  }
  const bool q8 = dt == SM_DT_Q8_0;
  for (int r = 0; r < rows; r++)
    for (int g0 = 0; g0 < hd; g0 += SM_KV_QGROUP) {
      const int n = hd - g0 < SM_KV_QGROUP ? hd - g0 : SM_KV_QGROUP, top = (int)(urand() * n);
      const float d = q8 ? 1.f / 128 : 1.f / 8; /* codes up to 127 / 8: values up to about 1 */
      float *g = x + (size_t)r * hd + g0;
      for (int i = 0; i < n; i++) {
        const int c = q8 ? (int)(urand() * 253) - 126 : (int)(urand() * 15) - 7; /* [-126, 126] / [-7, 7] */
        g[i] = (float)c * d;
      }
      g[top] = q8 ? (urand() < 0.5 ? 127.f : -127.f) * d : -8.f * d;
    }
}

/* quantized head rows: the quantizer's error bound on random data, exact codes given back, the row
 * sizes, and every kernel table's widen equal to the reference dequantizer */
static void test_kv_quant_rows(sm_backend *be) {
  const int hds[] = {32, 40, 64, 80, 128, 256};
  const sm_dtype dts[] = {SM_DT_Q8_0, SM_DT_Q4_0};
  /* q8_0: codes + f16 scales, padded to 4 bytes; q4_0: nibbles + scales */
  CHECK(sm_kv_head_bytes(SM_DT_Q8_0, 128) == 136 && sm_kv_head_bytes(SM_DT_Q4_0, 128) == 72, "head row bytes hd 128");
  CHECK(sm_kv_head_bytes(SM_DT_Q8_0, 80) == 88 && sm_kv_head_bytes(SM_DT_Q4_0, 80) == 48, "head row bytes hd 80");
  CHECK(sm_kv_head_bytes(SM_DT_Q8_0, 40) == 44 && sm_kv_head_bytes(SM_DT_F16, 40) == 80, "head row bytes hd 40");
  const sm_cpu_kern *k = sm_cpu_backend_kern(be);
  for (size_t di = 0; di < 2; di++)
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
      const sm_dtype dt = dts[di];
      const int hd = hds[hi];
      float x[256], y[256], z[256], w[256];
      uint8_t row[512];
      /* random data: q8_0 within half a step (max|x| / 127) of every value; q4_0's step is max|x| / 8
       * and its codes reach -8 on the extreme's side but only +7 on the other, where a value beyond
       * 7.5 steps is off by up to a step (llama.cpp's q4_0 does the same) */
      for (int i = 0; i < hd; i++) x[i] = (float)(frand(-1, 1) * (i % 7 == 0 ? 3 : 1));
      sm_kv_quantize_row(row, dt, x, hd);
      sm_kv_dequantize_row(y, row, dt, hd);
      double worst = 0;
      for (int g0 = 0; g0 < hd; g0 += SM_KV_QGROUP) {
        double amax = 0;
        for (int i = g0; i < hd && i < g0 + SM_KV_QGROUP; i++) amax = fmax(amax, fabs(x[i]));
        const double step = dt == SM_DT_Q8_0 ? amax / 127 : amax / 8;
        for (int i = g0; i < hd && i < g0 + SM_KV_QGROUP; i++) worst = fmax(worst, fabs(x[i] - y[i]) / step);
      }
      const double bound = dt == SM_DT_Q8_0 ? 0.5 : 1.0;
      CHECK(worst <= bound + 2e-3, "%s hd %d: error %.4f steps (bound %.1f and the f16 scale's rounding)",
            sm_kv_dtype_name(dt), hd, worst, bound);
      /* exactly representable rows come back exactly */
      kv_fill(z, 1, hd, dt);
      sm_kv_quantize_row(row, dt, z, hd);
      sm_kv_dequantize_row(y, row, dt, hd);
      CHECK(!memcmp(y, z, sizeof(float) * (size_t)hd), "%s hd %d: representable values not exact", sm_kv_dtype_name(dt),
            hd);
      /* the kernel table's widen (its fast paths) against the reference */
      sm_kv_quantize_row(row, dt, x, hd);
      sm_kv_dequantize_row(y, row, dt, hd);
      k->widen(w, row, dt, (size_t)hd);
      CHECK(!memcmp(w, y, sizeof(float) * (size_t)hd), "%s hd %d: %s widen differs from the reference",
            sm_kv_dtype_name(dt), hd, k->name);
    }
}

/* the kernel table's narrow (floats to the f16 / bf16 elements of a KV cache) against sm_f32_to_f16 /
 * sm_f32_to_bf16, bit for bit: random values of every magnitude, ties of both roundings, the largest and
 * past the largest finite halves, subnormal results, infinities, NaNs with payloads (a NaN in every
 * position of a vector), at lengths that leave tails */
static void test_kv_narrow(sm_backend *be) {
  const sm_cpu_kern *k = sm_cpu_backend_kern(be);
  enum { N = 203 };
  float x[N];
  uint16_t got[N + 1], want[N + 1];
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                              0x7f800001u, 0x7fbfffffu, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0x47800000u,
                              0x387fc000u, 0x33800000u, 0x33000000u, 0x33000001u, 0x00000001u, 0x3f808000u,
                              0x3f818000u, 0x3f800fffu, 0x3f801000u, 0x3f803000u, 0x7f7fffffu, 0xc77fe000u};
  for (int round = 0; round < 40; round++) {
    for (int i = 0; i < N; i++) {
      union {
        uint32_t u;
        float f;
      } v;
      v.u = (uint32_t)(urand() * 4294967296.0);
      if (round % 2) v.f = frand(-1.f, 1.f) * ldexpf(1.f, (int)(urand() * 40) - 28); /* finite, f16's range */
      x[i] = v.f;
    }
    for (size_t j = 0; j < SM_ARRAY_LEN(special); j++) { /* the special values at positions that move */
      union {
        uint32_t u;
        float f;
      } v = {.u = special[j]};
      x[(round * 7 + (int)j * 9) % N] = v.f;
    }
    const int n = N - round % 17;
    for (int dt = 0; dt < 2; dt++) {
      const sm_dtype t = dt ? SM_DT_BF16 : SM_DT_F16;
      got[n] = want[n] = 0x5a5a;
      k->narrow(got, x, t, (size_t)n);
      for (int i = 0; i < n; i++) want[i] = dt ? sm_f32_to_bf16(x[i]) : sm_f32_to_f16(x[i]);
      int bad = -1;
      for (int i = 0; i <= n && bad < 0; i++)
        if (got[i] != want[i]) bad = i;
      CHECK(bad < 0, "%s narrow to %s, n %d: element %d is 0x%04x, want 0x%04x (x = %a)", k->name, sm_kv_dtype_name(t),
            n, bad, bad >= 0 ? got[bad] : 0, bad >= 0 ? want[bad] : 0, bad >= 0 && bad < n ? (double)x[bad] : 0.0);
    }
  }
}

/* Attention against a double reference on the values the cache holds (f32, or f16/bf16-rounded:
 * the kernels widen them exactly), and batch invariance: each token of the mixed batch, run again
 * alone as a one-token step, gives the same bits. The decoding token sits past many key segments
 * (ATT_SEG, 64 positions): alone, with fewer items than threads, its segments run as separate work
 * items. */
static void test_attention_cfg(sm_backend *be, const int NH, const int NKV, const int HD, sm_dtype dt) {
  enum { BS = 32, NB = 144, MAXB = 72, L = 2 };
  const int KW = NKV * HD;
  sm_kv_cache kv = {.n_layers = L, .n_kv_heads = NKV, .head_dim = HD, .block_size = BS, .n_blocks = NB, .dtype = dt};
  void *kk[L], *vv[L];
  for (int l = 0; l < L; l++) {
    kk[l] = be->alloc(be, sizeof(float) * NB * BS * KW);
    vv[l] = be->alloc(be, sizeof(float) * NB * BS * KW);
  }
  kv.k = kk;
  kv.v = vv;
  int32_t table[2 * MAXB];
  int perm[NB];
  for (int i = 0; i < NB; i++) perm[i] = i;
  for (int i = NB - 1; i > 0; i--) {
    int j = (int)(urand() * (i + 1));
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int i = 0; i < 2 * MAXB; i++) table[i] = perm[i];
  /* logical history */
  enum { P0 = 2200, P1 = 150 }; /* P1 > 2 chunks: windowed rows of a tile start in different chunks */
  float *K0 = malloc(sizeof(float) * (P0 + 1) * KW), *V0 = malloc(sizeof(float) * (P0 + 1) * KW);
  float *K1 = malloc(sizeof(float) * P1 * KW), *V1 = malloc(sizeof(float) * P1 * KW);
  kv_fill(K0, (P0 + 1) * NKV, HD, dt);
  kv_fill(V0, (P0 + 1) * NKV, HD, dt);
  kv_fill(K1, P1 * NKV, HD, dt);
  kv_fill(V1, P1 * NKV, HD, dt);
  const int layer = 1;
  /* batch 1: prefill seq 0 positions [0, P0) */
  {
    int32_t *tok = calloc(P0, 4), *pos = malloc(P0 * 4), *seq = calloc(P0, 4);
    for (int p = 0; p < P0; p++) pos[p] = p;
    sm_batch b = mk_batch(P0, tok, pos, seq, 2, MAXB, table, 0, NULL);
    CHECK(be->set_batch(be, &b) == SMELT_OK, "set_batch 1");
    be->kv_store(be, &kv, layer, K0, V0);
    free(tok);
    free(pos);
    free(seq);
  }
  /* batch 2: seq 0 decodes position P0, seq 1 prefills [0, P1) */
  enum { NT = 1 + P1 };
  int32_t tok[NT] = {0}, pos[NT], seq[NT];
  pos[0] = P0;
  seq[0] = 0;
  for (int p = 0; p < P1; p++) {
    pos[1 + p] = p;
    seq[1 + p] = 1;
  }
  float *kb = malloc(sizeof(float) * NT * KW), *vb = malloc(sizeof(float) * NT * KW);
  memcpy(kb, K0 + (size_t)P0 * KW, sizeof(float) * KW);
  memcpy(vb, V0 + (size_t)P0 * KW, sizeof(float) * KW);
  memcpy(kb + KW, K1, sizeof(float) * P1 * KW);
  memcpy(vb + KW, V1, sizeof(float) * P1 * KW);
  sm_batch b = mk_batch(NT, tok, pos, seq, 2, MAXB, table, 0, NULL);
  CHECK(be->set_batch(be, &b) == SMELT_OK, "set_batch 2");
  be->kv_store(be, &kv, layer, kb, vb);
  float *q = malloc(sizeof(float) * NT * NH * HD), *out = malloc(sizeof(float) * NT * NH * HD);
  for (int i = 0; i < NT * NH * HD; i++) q[i] = frand(-1, 1);
  struct {
    int window;
    float softcap;
  } cfg[] = {{0, 0}, {64, 0}, {0, 5.0f}, {3, 2.0f}};
  double *o = malloc(sizeof(double) * HD), *sc = malloc(sizeof(double) * (P0 + 1));
  for (int c = 0; c < 4; c++) {
    float scale = 1.0f / sqrtf(HD) * 2.0f;
    be->attention(be, out, q, &kv, layer, NH, scale, cfg[c].window, cfg[c].softcap);
    double w = 0;
    for (int t = 0; t < NT; t++)
      for (int h = 0; h < NH; h++) {
        int kvh = h / (NH / NKV), ps = pos[t];
        int lo = cfg[c].window > 0 ? (ps - cfg[c].window + 1 > 0 ? ps - cfg[c].window + 1 : 0) : 0;
        double m = -1e300, l = 0;
        for (int d = 0; d < HD; d++) o[d] = 0;
        for (int p = lo; p <= ps; p++) {
          const float *kr = (seq[t] == 0 ? K0 : K1) + (size_t)p * KW;
          double s = 0;
          for (int d = 0; d < HD; d++) s += (double)q[((size_t)t * NH + h) * HD + d] * kr[kvh * HD + d];
          s *= scale;
          if (cfg[c].softcap > 0) s = cfg[c].softcap * tanh(s / cfg[c].softcap);
          sc[p] = s;
          if (s > m) m = s;
        }
        for (int p = lo; p <= ps; p++) {
          const float *vr = (seq[t] == 0 ? V0 : V1) + (size_t)p * KW;
          double e = exp(sc[p] - m);
          l += e;
          for (int d = 0; d < HD; d++) o[d] += e * vr[kvh * HD + d];
        }
        for (int d = 0; d < HD; d++) w = fmax(w, fabs(out[((size_t)t * NH + h) * HD + d] - o[d] / l));
      }
    CHECK(w < 1e-5, "attention %dq/%dkv hd%d dt%d cfg %d (window %d softcap %g) err %g", NH, NKV, HD, (int)dt, c,
          cfg[c].window, cfg[c].softcap, w);
    /* every token alone (a decode step at its position): the same bits as in the batch */
    int differ = 0;
    float *one = malloc(sizeof(float) * NH * HD);
    for (int t = 0; t < NT; t += t < 2 || t > NT - 3 ? 1 : 3) { /* every third token, and the ends */
      sm_batch b1 = mk_batch(1, tok + t, pos + t, seq + t, 2, MAXB, table, 0, NULL);
      be->set_batch(be, &b1);
      be->attention(be, one, q + (size_t)t * NH * HD, &kv, layer, NH, scale, cfg[c].window, cfg[c].softcap);
      if (memcmp(one, out + (size_t)t * NH * HD, sizeof(float) * NH * HD)) differ++;
    }
    free(one);
    CHECK(!differ, "attention %dq/%dkv hd%d dt%d cfg %d: %d tokens differ alone vs in the batch", NH, NKV, HD, (int)dt,
          c, differ);
    be->set_batch(be, &b);
  }
  for (int l = 0; l < L; l++) {
    be->free(be, kk[l]);
    be->free(be, vv[l]);
  }
  free(K0);
  free(V0);
  free(K1);
  free(V1);
  free(kb);
  free(vb);
  free(q);
  free(out);
  free(o);
  free(sc);
}
static void test_attention(sm_backend *be) {
  test_attention_cfg(be, 8, 2, 64, SM_DT_F32);  /* GQA 4 */
  test_attention_cfg(be, 6, 6, 40, SM_DT_F32);  /* MHA, head_dim % 16 != 0 */
  test_attention_cfg(be, 20, 1, 32, SM_DT_F32); /* MQA: 20 heads on one KV head */
  test_attention_cfg(be, 16, 2, 128, SM_DT_F32);
  test_attention_cfg(be, 8, 2, 64, SM_DT_F16); /* half-precision caches: widened by the kernels */
  test_attention_cfg(be, 6, 6, 40, SM_DT_BF16);
  test_attention_cfg(be, 80, 1, 32, SM_DT_F16); /* MQA with more query heads than rows per item */
  test_attention_cfg(be, 8, 2, 64, SM_DT_Q8_0); /* quantized caches: dequantized by the kernels */
  test_attention_cfg(be, 6, 6, 40, SM_DT_Q8_0); /* a last group of 8 values */
  test_attention_cfg(be, 16, 2, 128, SM_DT_Q4_0);
  test_attention_cfg(be, 6, 6, 40, SM_DT_Q4_0);
}
/* four threads: a GQA decode alone has two items, so its segments run as work items of their own */
static void test_attention_threads(void) {
  sm_backend *be = sm_cpu_backend_create(4);
  CHECK(be != NULL, "create (4 threads)");
  if (!be) return;
  test_attention_cfg(be, 8, 2, 64, SM_DT_F16);
  test_attention_cfg(be, 16, 2, 128, SM_DT_F32);
  test_attention_cfg(be, 6, 6, 40, SM_DT_Q8_0); /* six items: whole items alone too */
  be->destroy(be);
}

/* The backend's tuning table (SMELT_CPU_*, read at creation): bad values refuse the creation with
 * a message naming the variable; SMELT_CPU_NO_GFNI changes the 4-bit int8 kernel, not its
 * results; the thread count is the one asked for. */
static void test_tuning(void) {
  static const struct {
    const char *var, *val;
  } bad[] = {{"SMELT_CPU_ISA", "sse9"},         {"SMELT_CPU_ISA", "7"},        {"SMELT_CPU_EXACT", "yes"},
             {"SMELT_CPU_NO_GFNI", "2"},        {"SMELT_CPU_PACK", "-1"},      {"SMELT_CPU_AMX", "on"},
             {"SMELT_CPU_AMX_MIN_N", "1"},      {"SMELT_CPU_MV_CHUNKS", "65"}, {"SMELT_CPU_PREFETCH", "x"},
             {"SMELT_CPU_BATCH_INVARIANT", "2"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv(bad[i].var, bad[i].val, 1);
    sm_backend *be = sm_cpu_backend_create(1);
    CHECK(!be && strstr(sm_errmsg(), bad[i].var), "%s=%s: created=%d, message '%s'", bad[i].var, bad[i].val, be != NULL,
          sm_errmsg());
    if (be) be->destroy(be);
    unsetenv(bad[i].var);
  }
  sm_backend *be = sm_cpu_backend_create(2);
  CHECK(be && be->n_threads == 2, "n_threads %d, asked for 2", be ? be->n_threads : -1);
  if (be) be->destroy(be);
  /* one-token 4-bit matmul on the int8 path: the same floats with and without GFNI */
  tw t;
  make_quant(&t, 96, 1024, 4, 64, SM_DT_BF16);
  float x[1024], y[2][96];
  for (int k = 0; k < 1024; k++) x[k] = frand(-1.f, 1.f);
  for (int no_gfni = 0; no_gfni <= 1; no_gfni++) {
    if (no_gfni) setenv("SMELT_CPU_NO_GFNI", "1", 1);
    be = sm_cpu_backend_create(1);
    CHECK(be != NULL, "create (SMELT_CPU_NO_GFNI=%d): %s", no_gfni, sm_errmsg());
    if (!be) break;
    be->matmul(be, SM_MM_OTHER, &t.w, x, 1, y[no_gfni]);
    be->destroy(be);
    unsetenv("SMELT_CPU_NO_GFNI");
  }
  CHECK(!memcmp(y[0], y[1], sizeof y[0]), "SMELT_CPU_NO_GFNI=1 changed a 4-bit matmul's result");
  free_tw(&t);
}

/* Batch-invariant mode (sm_cpu_opts.batch_invariant): every token's matmul output in a batch of n (at any
 * row) equals, bit for bit, its output alone, for dense and quantized weights on the float path (dense,
 * rows under I8_MIN_COLS columns) and on the int8 path (packed); prints how many (weight, n, row) cases
 * differ without the mode (the float path's matvec and GEMM round differently). */
static void test_batch_invariant(int nth) {
  enum { NMAX = 13 };
  sm_cpu_opts o = {.n_threads = nth, .poll = 50};
  int base_diff = 0, cases = 0;
  for (int inv = 0; inv <= 1; inv++) {
    o.batch_invariant = inv;
    sm_backend *be = sm_cpu_backend_create_opts(&o);
    CHECK(be && be->batch_invariant == (inv != 0), "create (batch_invariant %d)", inv);
    if (!be) continue;
    for (int kind = 0; kind < 4; kind++) {
      tw t;
      if (kind == 0) make_dense(&t, 70, 96, SM_DT_F32);
      else if (kind == 1) make_dense(&t, 33, 200, SM_DT_BF16);
      else if (kind == 2) make_quant(&t, 48, 512, 4, 64, SM_DT_F16);
      else make_quant(&t, 40, 1024, 4, 64, SM_DT_BF16);
      const int64_t M = t.w.rows, K = t.w.cols;
      CHECK(be->prepare_weight(be, &t.w) == SMELT_OK, "prepare: %s", sm_errmsg());
      float *x = malloc(sizeof(float) * NMAX * K), *y1 = malloc(sizeof(float) * NMAX * M);
      float *yn = malloc(sizeof(float) * NMAX * M);
      for (int64_t i = 0; i < NMAX * K; i++) x[i] = frand(-1.f, 1.f);
      for (int r = 0; r < NMAX; r++) be->matmul(be, SM_MM_OTHER, &t.w, x + r * K, 1, y1 + r * M);
      static const int ns[] = {2, 3, 4, 5, 7, 13};
      for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const int n = ns[a], r0 = NMAX - n; /* the batch is rows r0 .. NMAX-1 */
        be->matmul(be, SM_MM_OTHER, &t.w, x + r0 * K, n, yn);
        for (int r = 0; r < n; r++) {
          const bool same = !memcmp(yn + r * M, y1 + (r0 + r) * M, sizeof(float) * M);
          if (inv) CHECK(same, "batch-invariant: weight %d, row %d of %d differs from the row alone", kind, r, n);
          else {
            base_diff += !same;
            cases++;
          }
        }
      }
      free(x);
      free(y1);
      free(yn);
      be->release_weight(be, &t.w);
      free_tw(&t);
    }
    be->destroy(be);
  }
  printf("%-6s threads=%d: batch-invariant matmuls equal alone; default mode: %d of %d rows differ\n",
         getenv("SMELT_CPU_ISA"), nth, base_diff, cases);
}

int main(void) {
  static const char *isas[] = {"scalar", "avx2", "avx512"};
  int ran = 0;
  for (int i = 0; i < 3; i++) {
    if (!sm_cpu_kernels_by_name(isas[i])) {
      printf("skip %s (not supported by this CPU)\n", isas[i]);
      continue;
    }
    setenv("SMELT_CPU_ISA", isas[i], 1);
    const bool has_i8 = sm_cpu_kernels_by_name(isas[i])->i8_ok != NULL;
    for (int exact = 0; exact <= (has_i8 ? 1 : 0); exact++)
      for (int nth = 1; nth <= 2; nth++) {
        if (exact) setenv("SMELT_CPU_EXACT", "1", 1);
        else unsetenv("SMELT_CPU_EXACT");
        sm_backend *be = sm_cpu_backend_create(nth);
        CHECK(be != NULL, "create");
        if (!be) continue;
        CHECK(!strcmp(sm_cpu_backend_isa(be), isas[i]), "isa %s selected %s", isas[i], sm_cpu_backend_isa(be));
        int f0 = g_fail;
        g_worst_mm = g_worst_i8 = g_worst_i8_rel = 0;
        g_n_i8 = 0;
        test_matmul(be);
        test_matmul_group(be);
        if (exact) CHECK(g_n_i8 == 0, "SMELT_CPU_EXACT=1 still used the int8 path");
        test_elementwise(be);
        test_rope_embed_gather(be);
        test_layernorm_rope_ext(be);
        test_attention(be);
        test_kv_quant_rows(be);
        test_kv_narrow(be);
        if (!exact) test_batch_invariant(nth);
        printf("%-6s threads=%d%s: %s (worst matmul rel err %.2g", isas[i], nth, exact ? " exact" : "",
               g_fail == f0 ? "ok" : "FAILED", g_worst_mm);
        if (g_n_i8)
          printf("; int8 path: %d matmuls, worst err/bound %.3f, worst err/sum|x w| %.2g", g_n_i8, g_worst_i8,
                 g_worst_i8_rel);
        printf(")\n");
        be->destroy(be);
        ran++;
      }
    unsetenv("SMELT_CPU_EXACT");
  }
  unsetenv("SMELT_CPU_ISA");
  test_attention_threads();
  test_tuning();
  sm_backend *be = sm_cpu_backend_create(0);
  printf("default: %s\n", sm_cpu_backend_isa(be));
  be->destroy(be);
  printf(g_fail ? "%d FAILURES\n" : "all passed\n", g_fail);
  return g_fail || !ran;
}
