/* Minimal safetensors writer (for synthetic benchmark models and tests). */
#ifndef SM_ST_WRITE_H
#define SM_ST_WRITE_H
#include "format/safetensors.h"

typedef struct sm_st_writer sm_st_writer;
sm_st_writer *sm_stw_new(void);
/* Add a tensor; data is copied unless fill != NULL, in which case fill(user, dst, nbytes)
 * is called while writing (for large synthetic tensors). */
void sm_stw_add(sm_st_writer *w, const char *name, sm_dtype dt, int ndim, const int64_t *shape, const void *data,
                void (*fill)(void *user, void *dst, size_t nbytes, const char *name), void *user);
smelt_status sm_stw_write(sm_st_writer *w, const char *path);
void sm_stw_free(sm_st_writer *w);

#endif
