/* AMX INT8 GEMM of the int8 path (Sapphire Rapids and later): tokens x packed weights with the
 * tile unit, the canonical arithmetic of cpu_internal.h bit for bit (the tiles give the exact
 * int32 group dot products; the float epilogue is the same per-row chain as the VNNI kernels).
 *
 * Tiles: C0..C3 (tmm0-3) = 16 tokens x 16 rows of 4 row blocks, int32; A (tmm4) = 16 tokens x
 * KS int8 activations (rows of xq, signed); B (tmm5/6) = KS/4 quads x 16 rows x 4 codes (the
 * unpacked row block, unsigned): TDPBSUD. KS = 32 for 32-column groups, else 64; after each group
 * the C tiles go to memory and the epilogue scales them into float accumulators.
 *
 * Linux gives a process the tile data state only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM);
 * sm_amx_ok asks once and says no if the CPU or the kernel can't. Compiled for the AMX target
 * only; used after that check.
 *
 * With SM_AMX_EMULATE defined (tests/backend/amx_emu.c) the tile instructions are emulated in C
 * after Intel's definitions (and shape rules, whose violation aborts), and the functions get an _emu
 * suffix: the test runs this file's tiling, strides and epilogue on any AVX-512 CPU. */
#if defined(__x86_64__) && defined(__linux__) && defined(SM_AMX_EMULATE)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include "backend/cpu/cpu_internal.h"
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#define sm_amx_gemm sm_amx_gemm_emu
#define sm_amx_release sm_amx_release_emu
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg;
static _Thread_local struct {
  tilecfg cfg;
  uint8_t tm[8][16][64];
} emu;
static void emu_load(int t, const void *p, size_t stride) {
  if (!emu.cfg.palette || emu.cfg.rows[t] > 16 || emu.cfg.colsb[t] > 64) abort();
  memset(emu.tm[t], 0, sizeof emu.tm[t]);
  for (int r = 0; r < emu.cfg.rows[t]; r++)
    memcpy(emu.tm[t][r], (const uint8_t *)p + (size_t)r * stride, emu.cfg.colsb[t]);
}
static void emu_store(int t, void *p, size_t stride) {
  if (!emu.cfg.palette) abort();
  for (int r = 0; r < emu.cfg.rows[t]; r++) memcpy((uint8_t *)p + (size_t)r * stride, emu.tm[t][r], emu.cfg.colsb[t]);
}
/* TDPBSUD: c[m][n] += sum_k sum_i int8(a[m][4k+i]) * uint8(b[k][4n+i]) */
static void emu_dpbsud(int c, int a, int b) {
  const tilecfg *g = &emu.cfg;
  if (!g->palette || g->rows[a] != g->rows[c] || g->colsb[a] / 4 != g->rows[b] || g->colsb[b] != g->colsb[c] ||
      g->colsb[a] % 4)
    abort();
  for (int m = 0; m < g->rows[c]; m++)
    for (int n = 0; n < g->colsb[c] / 4; n++) {
      int32_t acc;
      memcpy(&acc, &emu.tm[c][m][4 * n], 4);
      for (int k = 0; k < g->colsb[a] / 4; k++)
        for (int i = 0; i < 4; i++) acc += (int32_t)(int8_t)emu.tm[a][m][4 * k + i] * (int32_t)emu.tm[b][k][4 * n + i];
      memcpy(&emu.tm[c][m][4 * n], &acc, 4);
    }
}
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbsud
#define _tile_loadconfig(p) memcpy(&emu.cfg, (p), sizeof emu.cfg)
#define _tile_release() memset(&emu, 0, sizeof emu)
#define _tile_zero(i) memset(emu.tm[i], 0, sizeof emu.tm[i])
#define _tile_loadd(t, p, s) emu_load(t, p, (size_t)(s))
#define _tile_stored(t, p, s) emu_store(t, p, (size_t)(s))
#define _tile_dpbsud(c, a, b) emu_dpbsud(c, a, b)
#elif defined(__x86_64__) && defined(__linux__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,amx-tile,amx-int8,xsave")
#include "backend/cpu/cpu_internal.h"
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILECFG 17
#define XFEATURE_XTILEDATA 18

static bool amx_probe(void) {
  __builtin_cpu_init();
  if (!sm_i8avx512_ok() || !__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
  if (!__builtin_cpu_supports("xsave")) return false;
  /* the OS manages the tile state (XCR0 bits 17, 18) */
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  if (!(c & (1u << 27))) return false; /* OSXSAVE */
  const unsigned long long xcr0 = _xgetbv(0);
  if ((xcr0 & (3ull << XFEATURE_XTILECFG)) != (3ull << XFEATURE_XTILECFG)) return false;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) return false;
  unsigned long long perm = 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm)) return false;
  return (perm & (1ull << XFEATURE_XTILEDATA)) != 0;
}

bool sm_amx_ok(void) {
  static _Atomic int have = -1;
  int h = atomic_load(&have);
  if (h < 0) {
    h = amx_probe();
    atomic_store(&have, h);
  }
  return h == 1;
}

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg;
#endif

#if defined(__x86_64__) && defined(__linux__)
static _Thread_local int cfg_ks; /* K step of the configuration this thread has loaded (0: none) */
static void configure(int ks) {
  if (cfg_ks == ks) return;
  tilecfg c __attribute__((aligned(64)));
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int j = 0; j < 4; j++) {
    c.rows[j] = 16;
    c.colsb[j] = 64;
  }
  c.rows[4] = 16;
  c.colsb[4] = (uint16_t)ks;
  for (int j = 5; j < 7; j++) {
    c.rows[j] = (uint8_t)(ks / 4);
    c.colsb[j] = 64;
  }
  _tile_loadconfig(&c);
  cfg_ks = ks;
}

void sm_amx_release(void) {
  if (cfg_ks) {
    _tile_release();
    cfg_ks = 0;
  }
}

#define AMX_STEP(J, BT) \
  if (nrb > J) { \
    _tile_loadd(BT, U + (size_t)J * 16 * (size_t)K + (size_t)(k0 / 4) * 64, 64); \
    _tile_dpbsud(J, 4, BT); \
  }

void sm_amx_gemm(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb0, int nrb, int t0,
                 int t1, float *y, int64_t ldy, void *work) {
  const sm_cpu_packed *p = a->p;
  const int64_t K = p->cols, ng = p->ng;
  const int gs = p->gs, ks = gs == 32 ? 32 : 64;
  configure(ks);
  int32_t *C = work;                           /* [4][16][16] */
  float *acc = (float *)((char *)work + 4096); /* [4][16][16] */
  for (int tt = t0; tt < t1; tt += 16) {
    const int nt = t1 - tt < 16 ? t1 - tt : 16;
    memset(acc, 0, sizeof(float) * 4 * 256);
    const int8_t *xq = a->xq + (size_t)tt * (size_t)K;
    for (int64_t g = 0; g < ng; g++) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k0 = g * gs; k0 < (g + 1) * gs; k0 += ks) {
        _tile_loadd(4, xq + k0, K);
        AMX_STEP(0, 5)
        AMX_STEP(1, 6)
        AMX_STEP(2, 5)
        AMX_STEP(3, 6)
      }
      _tile_stored(0, C, 64);
      if (nrb > 1) _tile_stored(1, C + 256, 64);
      if (nrb > 2) _tile_stored(2, C + 512, 64);
      if (nrb > 3) _tile_stored(3, C + 768, 64);
      const float *xs = a->xs + (size_t)tt * (size_t)ng + (size_t)g;
      for (int j = 0; j < nrb; j++) {
        const __m512 sc = _mm512_load_ps(SC + ((size_t)j * (size_t)ng + (size_t)g) * 16);
        const int32_t *cj = C + j * 256;
        float *aj = acc + j * 256;
        for (int t = 0; t < nt; t++) {
          const __m512 c = _mm512_mul_ps(sc, _mm512_set1_ps(xs[(size_t)t * (size_t)ng]));
          _mm512_store_ps(aj + t * 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cj + t * 16)), c,
                                                       _mm512_load_ps(aj + t * 16)));
        }
      }
    }
    for (int j = 0; j < nrb; j++) {
      const int64_t rb = rb0 + j, nv = p->rows - rb * 16;
      const __mmask16 m = nv >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nv) - 1);
      const float *bij = BI + (size_t)j * (size_t)ng * 16;
      for (int t = 0; t < nt; t++) {
        const float *xsum = a->xsum + (size_t)(tt + t) * (size_t)ng;
        __m512 bacc = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++)
          bacc = _mm512_fmadd_ps(_mm512_load_ps(bij + g * 16), _mm512_set1_ps(xsum[g]), bacc);
        _mm512_mask_storeu_ps(y + (size_t)(tt + t) * (size_t)ldy + (size_t)rb * 16, m,
                              _mm512_add_ps(_mm512_load_ps(acc + j * 256 + t * 16), bacc));
      }
    }
  }
}
#else
#include "backend/cpu/cpu_internal.h"
bool sm_amx_ok(void) { return false; }
void sm_amx_release(void) {}
void sm_amx_gemm(const sm_i8_arg *a, const uint8_t *U, const float *SC, const float *BI, int64_t rb0, int nrb, int t0,
                 int t1, float *y, int64_t ldy, void *work) {
  (void)a;
  (void)U;
  (void)SC;
  (void)BI;
  (void)rb0;
  (void)nrb;
  (void)t0;
  (void)t1;
  (void)y;
  (void)ldy;
  (void)work;
}
#endif
