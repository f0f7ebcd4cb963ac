/* Packed weights of the int8-activation matmuls (layout in cpu_internal.h, "packed weights"):
 * repacking an MLX affine-quantized weight once at load (prepare_weight), unpacking a row block
 * into the int8-GEMM operand layout, and the scalar reference of the canonical int8 arithmetic
 * that every int8 kernel (decode matvec, VNNI GEMM, AMX GEMM) reproduces bit for bit. */
#include "backend/cpu/cpu_internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The packed copy; with huge, 2 MiB-aligned and marked for transparent huge pages when it is that
 * large (fewer TLB misses while decode streams it; a no-op where THP is off; where the kernel
 * compacts memory for it, a slower load). */
void *sm_cpu_alloc_huge(size_t n, bool huge_pages) {
  const size_t huge = (size_t)2 << 20;
  if (n < huge || !huge_pages) return sm_aligned_alloc(n);
  void *p = NULL;
  if (posix_memalign(&p, huge, (n + huge - 1) / huge * huge)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
  return p;
}

static void put_scale(uint8_t *dst, int i, const void *src, size_t si, int es, bool present) {
  if (es == 4) {
    float v = present ? ((const float *)src)[si] : 0.f;
    memcpy(dst + 4 * i, &v, 4);
  } else {
    uint16_t v = present ? ((const uint16_t *)src)[si] : 0;
    memcpy(dst + 2 * i, &v, 2);
  }
}

/* one super block (16 rows x 32 codes) of codes c[r][j] into its bit planes at dst: every byte
 * written once (byte 4r+i of a plane vector gathers column i of its quads) */
static void pack_sb(const uint8_t c[16][32], int bits, uint8_t *dst) {
  uint8_t *p2 = dst + (bits == 6 ? 256 : 0), *p1 = dst + (bits == 5 ? 256 : 128);
  for (int r = 0; r < 16; r++)
    for (int i = 0; i < 4; i++) {
      const int o = r * 4 + i;
      const uint8_t *q = &c[r][i]; /* q[4v] = code of quad v, column i */
      if (bits == 8) {
        for (int v = 0; v < 8; v++) dst[v * 64 + o] = q[4 * v];
        continue;
      }
      if (bits == 4 || bits == 5 || bits == 6)
        for (int v = 0; v < 4; v++) dst[v * 64 + o] = (uint8_t)((q[4 * v] & 15) | (q[4 * (v + 4)] & 15) << 4);
      if (bits == 2 || bits == 3 || bits == 6) {
        const int sh = bits == 6 ? 4 : 0; /* the 2-plane holds bits sh, sh+1 */
        for (int v = 0; v < 2; v++)
          p2[v * 64 + o] = (uint8_t)((q[4 * v] >> sh & 3) | (q[4 * (v + 2)] >> sh & 3) << 2 |
                                     (q[4 * (v + 4)] >> sh & 3) << 4 | (q[4 * (v + 6)] >> sh & 3) << 6);
      }
      if (bits == 3 || bits == 5) {
        const int sh = bits == 5 ? 4 : 2; /* the 1-plane holds bit sh */
        unsigned m = 0;
        for (int v = 0; v < 8; v++) m |= (unsigned)(q[4 * v] >> sh & 1) << v;
        p1[o] = (uint8_t)m;
      }
    }
}

/* the 32 codes (bits each) of the little-endian bit stream starting at the byte src */
static void codes32(const uint8_t *src, int bits, uint8_t *c) {
  if (bits == 8) {
    memcpy(c, src, 32);
    return;
  }
  if (bits == 4) {
    for (int j = 0; j < 16; j++) {
      c[2 * j] = src[j] & 15;
      c[2 * j + 1] = src[j] >> 4;
    }
    return;
  }
  const unsigned mask = (1u << bits) - 1;
  uint64_t buf = 0;
  int nb = 0;
  for (int j = 0; j < 32; j++) {
    while (nb < bits) {
      buf |= (uint64_t)*src++ << nb;
      nb += 8;
    }
    c[j] = (uint8_t)(buf & mask);
    buf >>= bits;
    nb -= bits;
  }
}

void sm_cpu_unpack_sb_ref(const uint8_t *src, int bits, uint8_t q[8][64]) {
  const uint8_t *p4 = src, *p2 = src + (bits == 6 ? 256 : 0), *p1 = src + (bits == 5 ? 256 : 128);
  for (int v = 0; v < 8; v++)
    for (int o = 0; o < 64; o++) {
      unsigned x = 0;
      switch (bits) {
        case 8: x = src[v * 64 + o]; break;
        case 4: x = (p4[(v % 4) * 64 + o] >> (4 * (v / 4))) & 15; break;
        case 2: x = (p2[(v % 2) * 64 + o] >> (2 * (v / 2))) & 3; break;
        case 6:
          x = ((p4[(v % 4) * 64 + o] >> (4 * (v / 4))) & 15) | (((p2[(v % 2) * 64 + o] >> (2 * (v / 2))) & 3) << 4);
          break;
        case 5: x = ((p4[(v % 4) * 64 + o] >> (4 * (v / 4))) & 15) | (((p1[o] >> v) & 1) << 4); break;
        case 3: x = ((p2[(v % 2) * 64 + o] >> (2 * (v / 2))) & 3) | (((p1[o] >> v) & 1) << 2); break;
        default: break;
      }
      q[v][o] = (uint8_t)x;
    }
}

bool sm_cpu_packable(const sm_weight *w) {
  if (!w || !w->data || !w->scales || w->rows <= 0 || w->cols <= 0) return false;
  if (!(w->bits == 2 || w->bits == 3 || w->bits == 4 || w->bits == 5 || w->bits == 6 || w->bits == 8)) return false;
  if (!(w->group_size == 32 || w->group_size == 64 || w->group_size == 128) || w->cols % w->group_size) return false;
  return w->dtype == SM_DT_F32 || w->dtype == SM_DT_F16 || w->dtype == SM_DT_BF16;
}

typedef struct {
  const sm_weight *w;
  sm_cpu_packed *p;
} pack_ctx;

static void pack_rb(const sm_weight *w, const sm_cpu_packed *p, int64_t rb) {
  const int64_t K = w->cols, ng = p->ng;
  const int bits = w->bits, gs = w->group_size, es = p->es;
  const size_t rowb = (size_t)K * (size_t)bits / 8;
  uint8_t c[16][32];
  for (int64_t g = 0; g < ng; g++) {
    uint8_t *dst = p->data + (size_t)rb * p->rbbytes + (size_t)g * p->gbytes;
    for (int r = 0; r < 16; r++) {
      const int64_t row = rb * 16 + r;
      const bool ok = row < w->rows;
      put_scale(dst, r, w->scales, (size_t)(row * ng + g), es, ok);
      put_scale(dst + 16 * es, r, w->biases, (size_t)(row * ng + g), es, ok && w->biases);
    }
    for (int s = 0; s < gs / 32; s++) {
      for (int r = 0; r < 16; r++) {
        const int64_t row = rb * 16 + r;
        /* code g*gs + 32s starts at a byte: 32 codes are 4*bits bytes */
        if (row < w->rows)
          codes32((const uint8_t *)w->data + (size_t)row * rowb + (size_t)(g * gs + s * 32) * bits / 8, bits, c[r]);
        else memset(c[r], 0, 32);
      }
      pack_sb(c, bits, dst + 32 * es + (size_t)s * 64 * (size_t)bits);
    }
  }
}

/* thread tid packs (and so first touches: its NUMA node holds the pages) the same static share of
 * row blocks that it reads in a NUMA-placed decode (cpu_matmul.c) */
static void pack_job(void *v, int tid, int nth) {
  pack_ctx *c = v;
  const int64_t nrb = c->p->nrb;
  for (int64_t rb = nrb * tid / nth; rb < nrb * (tid + 1) / nth; rb++) pack_rb(c->w, c->p, rb);
}

sm_cpu_packed *sm_cpu_pack(const sm_weight *w, sm_pool *pool, bool huge_pages) {
  if (!sm_cpu_packable(w)) return NULL;
  sm_cpu_packed *p = sm_xcalloc(1, sizeof *p);
  p->rows = w->rows;
  p->cols = w->cols;
  p->bits = w->bits;
  p->gs = w->group_size;
  p->sdt = w->dtype;
  p->es = w->dtype == SM_DT_F32 ? 4 : 2;
  p->nrb = (w->rows + 15) / 16;
  p->ng = w->cols / w->group_size;
  p->gbytes = (size_t)32 * (size_t)p->es + (size_t)2 * (size_t)p->gs * (size_t)p->bits;
  p->rbbytes = (size_t)p->ng * p->gbytes;
  p->data = sm_cpu_alloc_huge((size_t)p->nrb * p->rbbytes, huge_pages);
  if (!p->data) {
    free(p);
    return NULL;
  }
  pack_ctx c = {.w = w, .p = p};
  if (pool) sm_pool_run(pool, pack_job, &c);
  else pack_job(&c, 0, 1);
  return p;
}

void sm_cpu_packed_free(sm_cpu_packed *p) {
  if (!p) return;
  free(p->data);
  free(p);
}

static float ld_scale(const uint8_t *p, int i, int es, sm_dtype dt) {
  if (es == 4) {
    float v;
    memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return dt == SM_DT_F16 ? sm_f16_to_f32(h) : sm_bf16_to_f32(h);
}

void sm_cpu_unpack_rb_ref(const sm_cpu_packed *p, int64_t rb, uint8_t *U, float *SC, float *BI) {
  uint8_t q[8][64];
  for (int64_t g = 0; g < p->ng; g++) {
    const uint8_t *src = p->data + (size_t)rb * p->rbbytes + (size_t)g * p->gbytes;
    for (int r = 0; r < 16; r++) {
      SC[g * 16 + r] = ld_scale(src, r, p->es, p->sdt);
      BI[g * 16 + r] = ld_scale(src + 16 * p->es, r, p->es, p->sdt);
    }
    for (int s = 0; s < p->gs / 32; s++) {
      sm_cpu_unpack_sb_ref(src + 32 * p->es + (size_t)s * 64 * (size_t)p->bits, p->bits, q);
      memcpy(U + ((size_t)g * (size_t)p->gs + (size_t)s * 32) * 16, q, sizeof q);
    }
  }
}

float sm_cpu_sum16(const float l[16]) {
  float s8[8], s4[4], s2[2];
  for (int i = 0; i < 8; i++) s8[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
  for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
  return s2[0] + s2[1];
}

void sm_cpu_quant_x_ref(const float *x, int64_t K, int gs, int8_t *xq, float *xs, float *xsum) {
  for (int64_t g = 0; g < K / gs; g++) {
    const float *xg = x + g * gs;
    float lane[16] = {0}, mx = 0.f;
    for (int j = 0; j < gs; j++) {
      lane[j % 16] += xg[j];
      float a = fabsf(xg[j]);
      if (a > mx) mx = a;
    }
    xsum[g] = sm_cpu_sum16(lane);
    xs[g] = mx / 127.f;
    const float inv = mx > 0.f ? 127.f / mx : 0.f;
    for (int j = 0; j < gs; j++) {
      volatile float t = xg[j] * inv; /* one rounding, as the vector code: no contraction */
      xq[g * gs + j] = (int8_t)lrintf(t);
    }
  }
}

void sm_cpu_i8_ref(const sm_weight *w, const float *x, int n, float *y) {
  const int64_t M = w->rows, K = w->cols, gs = w->group_size, ng = K / gs;
  const size_t rowb = (size_t)K * (size_t)w->bits / 8;
  int8_t *xq = sm_xmalloc((size_t)K);
  float *xs = sm_xmalloc(sizeof(float) * (size_t)ng), *xsum = sm_xmalloc(sizeof(float) * (size_t)ng);
  for (int t = 0; t < n; t++) {
    sm_cpu_quant_x_ref(x + (size_t)t * (size_t)K, K, (int)gs, xq, xs, xsum);
    for (int64_t r = 0; r < M; r++) {
      const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rowb;
      float acc = 0.f, bacc = 0.f;
      for (int64_t g = 0; g < ng; g++) {
        int32_t d = 0;
        for (int64_t j = g * gs; j < (g + 1) * gs; j++) d += (int32_t)sm_cpu_getq(row, j, w->bits) * xq[j];
        const size_t si = (size_t)(r * ng + g);
        volatile float c = sm_cpu_ldf(w->scales, si, w->dtype) * xs[g];
        acc = fmaf((float)d, c, acc);
        bacc = fmaf(w->biases ? sm_cpu_ldf(w->biases, si, w->dtype) : 0.f, xsum[g], bacc);
      }
      y[(size_t)t * (size_t)M + (size_t)r] = acc + bacc;
    }
  }
  free(xq);
  free(xs);
  free(xsum);
}
