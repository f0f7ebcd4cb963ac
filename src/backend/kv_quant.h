/* The KV cache's row formats: bytes of one head's row of head_dim values for every cache element type,
 * and the quantized types q8_0 and q4_0 (llama.cpp's block formats, laid out per head).
 *
 * A quantized head row is self-contained: the codes of its head_dim values, then one f16 scale d per
 * group of SM_KV_QGROUP (32) values (the last group may be shorter), padded to a multiple of 4 bytes.
 *   q8_0: code q in [-127, 127] (int8), x = q * d, d = max|x| / 127
 *   q4_0: code q in [0, 15] (two per byte, value 2i in the low nibble of byte i), x = (q - 8) * d,
 *         d = -m / 8 with m the group's value of largest magnitude (so m itself is exact)
 * The scale is f16 and finite (a group beyond its range saturates); a NaN value is stored as 0.
 * A position's row is n_kv_heads head rows, so paged blocks, the prefix cache, forks and prompt
 * cache files move quantized rows by copying bytes like any other type. */
#ifndef SM_KV_QUANT_H
#define SM_KV_QUANT_H
#include <stdbool.h>
#include <stddef.h>
#include "format/safetensors.h"
#ifdef __cplusplus
extern "C" {
#endif

#define SM_KV_QGROUP 32

static inline bool sm_kv_quantized(sm_dtype dt) { return dt == SM_DT_Q8_0 || dt == SM_DT_Q4_0; }
/* bytes of one head's row of head_dim values in a cache of dt (0 for a type a cache cannot have) */
size_t sm_kv_head_bytes(sm_dtype dt, int head_dim);
/* offset of the f16 scales in a quantized head row */
size_t sm_kv_scale_offset(sm_dtype dt, int head_dim);
/* a cache type's name as the flags spell it: f32, f16, bf16, q8_0, q4_0 ("?" otherwise) */
const char *sm_kv_dtype_name(sm_dtype dt);
/* the element type of a cache of the public type t (SM_DT_COUNT for a value outside the enum), and back */
sm_dtype sm_kv_dtype_of(smelt_kv_type t);
smelt_kv_type sm_kv_type_of(sm_dtype dt);

/* x[0..head_dim) into one quantized head row at dst (dt q8_0 or q4_0) */
void sm_kv_quantize_row(void *dst, sm_dtype dt, const float *x, int head_dim);
/* one quantized head row back to floats (the reference; the CPU kernels' widen has fast paths) */
void sm_kv_dequantize_row(float *out, const void *src, sm_dtype dt, int head_dim);
/* the same for values [i0, head_dim) of the row only (out[i0..head_dim)): the tail a fast path leaves */
void sm_kv_dequantize_tail(float *out, const void *src, sm_dtype dt, int head_dim, int i0);

#ifdef __cplusplus
}
#endif
#endif
