/* Weights on the device: upload and repacking (cu_weight_upload: the layouts of cuda_common.cuh),
 * dequantization of row ranges to bf16/f16 (the GEMM path of larger batches, cuda_gemm.cu), and
 * embedding rows. */
#include <stdio.h>
#include <string.h>
#include "backend/cuda/cuda_ldst.cuh"
#include "backend/cuda/cuda_weights.cuh"

static bool ck(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  sm_err(SMELT_ERR_BACKEND, "cuda: %s: %s", what, cudaGetErrorString(e));
  return false;
}

/* upload helpers: natural -> fast word order, and (scale, bias) interleave */
__global__ void k_permute_words(uint32_t *dst, const uint32_t *src, int64_t rows, int64_t W) {
  int64_t total = rows * W;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / W, u = i % W;
    dst[r * W + cu_qfast_store_index(u, W)] = src[i];
  }
}
__global__ void k_pair16(uint32_t *dst, const uint16_t *s, const uint16_t *b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = (uint32_t)s[i] | ((uint32_t)(b ? b[i] : 0) << 16);
}
__global__ void k_pair32(float2 *dst, const float *s, const float *b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = make_float2(s[i], b ? b[i] : 0.f);
}

/* mm[0] = min(mm[0], the bytes of p), mm[1] = max(mm[1], them) */
__global__ void k_u8_range(const uint8_t *p, size_t n, int *mm) {
  int lo = 255, hi = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const int v = p[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  for (int o = 16; o; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMin(mm, lo);
    atomicMax(mm + 1, hi);
  }
}


bool cu_weight_ok(const sm_weight *w) {
  if (!w || !w->data || w->rows <= 0 || w->cols <= 0 || w->rows > INT32_MAX || w->cols > INT32_MAX) return false;
  if (w->bits == 0) return w->dtype == SM_DT_F32 || w->dtype == SM_DT_F16 || w->dtype == SM_DT_BF16;
  if (w->qmode != SM_QMODE_AFFINE) /* microscaling (cuda_mxq.cuh) */
    return w->qmode > 0 && w->qmode < SM_QMODE_COUNT && w->bits == sm_qmode_bits((sm_qmode)w->qmode) &&
           w->group_size == sm_qmode_group((sm_qmode)w->qmode) && w->cols % w->group_size == 0 &&
           (w->cols * w->bits / 8) % 4 == 0 && w->scales && w->dtype == SM_DT_U8;
  if (!(w->bits == 2 || w->bits == 3 || w->bits == 4 || w->bits == 5 || w->bits == 6 || w->bits == 8)) return false;
  if (!(w->group_size == 32 || w->group_size == 64 || w->group_size == 128)) return false;
  if (w->cols % w->group_size || !w->scales) return false;
  return w->dtype == SM_DT_F32 || w->dtype == SM_DT_F16 || w->dtype == SM_DT_BF16;
}

void cu_weight_free(cu_weight *cw) {
  if (!cw) return;
  if (cw->q) cudaFree(cw->q);
  if (cw->sb) cudaFree(cw->sb);
  free(cw);
}

smelt_status cu_weight_upload(const cu_ctx *cx, const sm_weight *w, int q4_mode, cu_weight **out) {
  *out = NULL;
  if (!w) return sm_err(SMELT_ERR_INVALID, "cuda: NULL weight");
  if (!cu_weight_ok(w))
    return sm_err(SMELT_ERR_UNSUPPORTED, "cuda: unsupported weight (rows %lld cols %lld bits %d group %d dtype %d)",
                  (long long)w->rows, (long long)w->cols, w->bits, w->group_size, (int)w->dtype);
  cudaStream_t s = cx->s;
  cu_weight *cw = (cu_weight *)sm_xcalloc(1, sizeof *cw);
  cw->rows = w->rows; cw->cols = w->cols; cw->bits = w->bits; cw->gs = w->group_size; cw->dtype = w->dtype;
  cw->sbk = w->dtype == SM_DT_F32 ? SBK_F32 : w->dtype == SM_DT_F16 ? SBK_F16 : SBK_BF16;
  const size_t es = sm_dtype_size(w->dtype);
  /* All uploads go through the backend's stream: a plain cudaMemcpy from pageable memory may return
   * before its DMA lands, and that stream (non-blocking) does not wait for the legacy stream. */
  void *tmp = NULL, *ts = NULL, *tb = NULL;
  smelt_status st = SMELT_OK;
  if (w->qmode != SM_QMODE_AFFINE) { /* microscaling: the codes and scale codes as they are */
    const size_t bytes = (size_t)w->rows * (size_t)w->cols * (size_t)w->bits / 8;
    const size_t sbytes = (size_t)w->rows * (size_t)(w->cols / w->group_size);
    cw->kind = CW_MXQ;
    cw->qmode = w->qmode;
    if (cudaMalloc(&cw->q, bytes) != cudaSuccess || cudaMalloc(&cw->sb, sbytes) != cudaSuccess) goto oom;
    if (!ck(cudaMemcpyAsync(cw->q, w->data, bytes, cudaMemcpyHostToDevice, s), "weight upload") ||
        !ck(cudaMemcpyAsync(cw->sb, w->scales, sbytes, cudaMemcpyHostToDevice, s), "scales upload"))
      goto fail;
    int *mm = NULL, hm[2] = {255, 0};
    if (w->qmode == SM_QMODE_MXFP4) { /* the scale codes' range (cu_qmma_experts' f16 decode) */
      if (cudaMalloc(&mm, sizeof hm) != cudaSuccess) goto oom;
      tmp = mm;
      cudaMemcpyAsync(mm, hm, sizeof hm, cudaMemcpyHostToDevice, s);
      const unsigned nb = cu_ew_blocks(sbytes);
      k_u8_range<<<nb < 1024 ? nb : 1024, 256, 0, s>>>((const uint8_t *)cw->sb, sbytes, mm);
      cudaMemcpyAsync(hm, mm, sizeof hm, cudaMemcpyDeviceToHost, s);
    }
    if (!ck(cudaStreamSynchronize(s), "weight upload")) goto fail;
    cw->mx_f16 = mm && hm[0] >= 89 && hm[1] <= 128;
  } else if (w->bits == 0) {
    size_t bytes = (size_t)w->rows * (size_t)w->cols * es;
    cw->kind = CW_DENSE;
    if (cudaMalloc(&cw->q, bytes) != cudaSuccess) goto oom;
    if (!ck(cudaMemcpyAsync(cw->q, w->data, bytes, cudaMemcpyHostToDevice, s), "weight upload")) goto fail;
    if (!ck(cudaStreamSynchronize(s), "weight upload")) goto fail;
  } else {
    const size_t bytes = (size_t)w->rows * (size_t)w->cols * (size_t)w->bits / 8;
    const int64_t G = w->cols / w->group_size, nsb = w->rows * G;
    cw->kind = (w->bits == 2 || w->bits == 4 || w->bits == 8) ? CW_QFAST : CW_QGEN;
    /* 4-bit: natural word order for the int8-activation dp4a kernels (cuda_q4.cu k_mvq4) when
     * the weight is large (>= 32Mi elements: gate/up/down/lm_head of an 8B model); smaller ones
     * keep the permuted fp32 kernel, faster at n = 1 there (bench/cuda/mvbench.cu, docs/cuda.md).
     * q4_mode (tuning q4) 0: never, 2: every 4-bit weight. */
    if (w->bits == 4 && (q4_mode == 2 || (q4_mode == 1 && w->rows * w->cols >= ((int64_t)1 << 20)))) cw->kind = CW_Q4;
    if (cudaMalloc(&cw->q, bytes) != cudaSuccess) goto oom;
    if (cw->kind == CW_QFAST) {
      if (cudaMalloc(&tmp, bytes) != cudaSuccess) goto oom;
      if (!ck(cudaMemcpyAsync(tmp, w->data, bytes, cudaMemcpyHostToDevice, s), "weight upload")) goto fail;
      const int64_t W = w->cols * w->bits / 32;
      k_permute_words<<<cu_ew_blocks(bytes / 4), 256, 0, s>>>((uint32_t *)cw->q, (const uint32_t *)tmp, w->rows, W);
    } else if (!ck(cudaMemcpyAsync(cw->q, w->data, bytes, cudaMemcpyHostToDevice, s), "weight upload")) goto fail;
    const size_t sbytes = (size_t)nsb * es;
    if (cudaMalloc(&cw->sb, (size_t)nsb * (cw->sbk == SBK_F32 ? 8 : 4)) != cudaSuccess) goto oom;
    if (cudaMalloc(&ts, sbytes) != cudaSuccess) goto oom;
    if (w->biases && cudaMalloc(&tb, sbytes) != cudaSuccess) goto oom;
    if (!ck(cudaMemcpyAsync(ts, w->scales, sbytes, cudaMemcpyHostToDevice, s), "scales upload")) goto fail;
    if (tb && !ck(cudaMemcpyAsync(tb, w->biases, sbytes, cudaMemcpyHostToDevice, s), "biases upload")) goto fail;
    if (cw->sbk == SBK_F32)
      k_pair32<<<cu_ew_blocks((size_t)nsb), 256, 0, s>>>((float2 *)cw->sb, (const float *)ts, (const float *)tb, nsb);
    else
      k_pair16<<<cu_ew_blocks((size_t)nsb), 256, 0, s>>>((uint32_t *)cw->sb, (const uint16_t *)ts, (const uint16_t *)tb, nsb);
    if (!ck(cudaStreamSynchronize(s), "weight repack")) goto fail;
  }
  if (tmp) cudaFree(tmp);
  if (ts) cudaFree(ts);
  if (tb) cudaFree(tb);
  *out = cw;
  return SMELT_OK;
oom:
  cudaGetLastError();
  st = sm_err(SMELT_ERR_OOM, "cuda: out of device memory for a %lldx%lld weight", (long long)w->rows, (long long)w->cols);
  goto cleanup;
fail:
  st = SMELT_ERR_BACKEND;
cleanup:
  if (tmp) cudaFree(tmp);
  if (ts) cudaFree(ts);
  if (tb) cudaFree(tb);
  cu_weight_free(cw);
  return st;
}


/* fast path: one thread per natural word of a QFAST weight */
template <int BITS, typename O, bool PERM>
__global__ void k_dequant_qfast(cu_weight w, int64_t r0, int64_t nr, O *__restrict__ out) {
  constexpr int E = 32 / BITS;
  const int64_t W = w.cols / E, G = w.cols / w.gs;
  const int64_t total = nr * W;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t rr = i / W, u = i % W, r = r0 + rr;
    uint32_t wd = __ldg((const uint32_t *)w.q + r * W + (PERM ? cu_qfast_store_index(u, W) : u));
    float2 p = load_sb_rt(w.sb, r * G + (u * E) / w.gs, w.sbk);
    O o[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
      float v = p.x * (float)((wd >> (e * BITS)) & ((1u << BITS) - 1)) + p.y;
      o[e] = (O)v;
    }
    O *dst = out + rr * w.cols + u * E;
    if (E * sizeof(O) % 16 == 0) {
#pragma unroll
      for (int k = 0; k < (int)(E * sizeof(O) / 16); k++) ((uint4 *)dst)[k] = ((const uint4 *)o)[k];
    } else {
#pragma unroll
      for (int e = 0; e < E; e++) dst[e] = o[e];
    }
  }
}
template <typename O>
__global__ void k_dequant_gen(cu_weight w, int64_t r0, int64_t nr, O *__restrict__ out) {
  const int64_t total = nr * w.cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t rr = i / w.cols, j = i % w.cols;
    out[i] = (O)dq_elem(w, r0 + rr, j);
  }
}

template <typename O> static void dequant_rows(const cu_weight *w, int64_t r0, int64_t nr, O *o, unsigned blocks,
                                               int threads, cudaStream_t s) {
  if (w->kind == CW_Q4) {
    k_dequant_qfast<4, O, false><<<blocks, threads, 0, s>>>(*w, r0, nr, o);
  } else if (w->kind == CW_QFAST) {
    if (w->bits == 4) k_dequant_qfast<4, O, true><<<blocks, threads, 0, s>>>(*w, r0, nr, o);
    else if (w->bits == 8) k_dequant_qfast<8, O, true><<<blocks, threads, 0, s>>>(*w, r0, nr, o);
    else k_dequant_qfast<2, O, true><<<blocks, threads, 0, s>>>(*w, r0, nr, o);
  } else {
    k_dequant_gen<O><<<blocks, threads, 0, s>>>(*w, r0, nr, o);
  }
}

void cu_dequant_rows(const cu_weight *w, int64_t r0, int64_t nr, void *out, bool to_f16, cudaStream_t s) {
  if (nr <= 0) return;
  if (w->kind == CW_MXQ) { cu_mxq_dequant_rows(w, r0, nr, out, to_f16, s); return; }
  const int threads = 256;
  const bool qf = w->kind == CW_QFAST || w->kind == CW_Q4;
  int64_t work = qf ? nr * (w->cols * w->bits / 32) : nr * w->cols;
  int64_t blocks = (work + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;
  if (to_f16) dequant_rows(w, r0, nr, (__half *)out, (unsigned)blocks, threads, s);
  else dequant_rows(w, r0, nr, (__nv_bfloat16 *)out, (unsigned)blocks, threads, s);
}

__global__ void k_embed(cu_weight w, const int32_t *__restrict__ tokens, float *__restrict__ out) {
  const int t = blockIdx.x;
  pdl_trigger();
  pdl_wait();
  const int32_t tok = tokens[t];
  float *o = out + (int64_t)t * w.cols;
  for (int64_t j = threadIdx.x; j < w.cols; j += blockDim.x)
    o[j] = (tok < 0 || tok >= w.rows) ? 0.f : dq_elem(w, tok, j);
}

void cu_embed(const cu_ctx *cx, const cu_weight *w, const int32_t *tokens, int n_tokens, float *out) {
  if (n_tokens <= 0) return;
  cu_launch(cx, k_embed, dim3(n_tokens), dim3(256), 0, *w, tokens, out);
}
