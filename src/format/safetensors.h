/* safetensors reader: mmap'd single files and sharded checkpoints
 * (model.safetensors.index.json). Tensor data pointers point into the maps and
 * stay valid until sm_st_close(). */
#ifndef SM_SAFETENSORS_H
#define SM_SAFETENSORS_H
#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  SM_DT_F32 = 0,
  SM_DT_F16,
  SM_DT_BF16,
  SM_DT_F64,
  SM_DT_U8,
  SM_DT_I8,
  SM_DT_U16,
  SM_DT_I16,
  SM_DT_U32,
  SM_DT_I32,
  SM_DT_U64,
  SM_DT_I64,
  SM_DT_BOOL,
  SM_DT_COUNT,
  /* not safetensors types: the quantized KV cache formats (src/backend/kv_quant.h) */
  SM_DT_Q8_0 = 64,
  SM_DT_Q4_0
} sm_dtype;

size_t sm_dtype_size(sm_dtype t);
const char *sm_dtype_name(sm_dtype t);

#define SM_ST_MAX_DIMS 8
typedef struct {
  char *name;
  sm_dtype dtype;
  int ndim;
  int64_t shape[SM_ST_MAX_DIMS];
  const void *data; /* into the mmap */
  size_t nbytes;
  int file; /* index of the shard it came from */
} sm_tensor;

typedef struct sm_st sm_st;

/* Open a model directory (model.safetensors.index.json, or every *.safetensors in it)
 * or a single .safetensors file. Validates headers: JSON syntax, dtypes, shapes vs
 * byte ranges, offsets inside the file, no overlaps, duplicate names across shards. */
smelt_status sm_st_open(const char *path, sm_st **out);
/* The same; copy = true reads the files into memory instead of mapping them (--no-mmap). */
smelt_status sm_st_open_opts(const char *path, bool copy, sm_st **out);
/* Parse one safetensors image already in memory (no copy; used by the fuzzer and tests). */
smelt_status sm_st_parse_buffer(const void *data, size_t size, sm_st **out);
void sm_st_close(sm_st *st);

size_t sm_st_count(const sm_st *st);
const sm_tensor *sm_st_at(const sm_st *st, size_t i);
const sm_tensor *sm_st_find(const sm_st *st, const char *name); /* NULL if absent */
/* Sum of all tensor byte sizes. */
size_t sm_st_total_bytes(const sm_st *st);

#ifdef __cplusplus
}
#endif
#endif
