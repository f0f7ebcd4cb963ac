/* Images in sequences (private to src/engine): the spans of a sequence's tokens that take image
 * embeddings, their keys in the prefix cache, Qwen-VL's 3-axis rope positions, and what a step's
 * batch needs of them (mm.c). engine.c calls these hooks; a sequence without images has mm NULL and
 * costs nothing. */
#ifndef SM_ENGINE_MM_H
#define SM_ENGINE_MM_H
#include "engine/engine.h"
#include "vision/vision.h"

typedef struct sm_seq_mm {
  sm_mm_span *spans; /* ascending, references held */
  int n_spans;
  int32_t *keys; /* [cap] prefix-cache key of each token: the token, or a pseudo-id from the image hash */
  int32_t *rpos; /* [3][cap] (axis stride cap) M-RoPE positions, NULL when the model has none */
  int cap;
  int32_t delta; /* rope position - index of tokens appended after the spans */
} sm_seq_mm;

/* step scratch of the batch's image rows (engine-owned) */
typedef struct sm_mm_scratch {
  sm_batch_embd *embd;
  int n_embd, cap_embd;
  const float **deep; /* n_deep pointers per run */
  int cap_deep;
  int32_t *rpos; /* [3][n_tokens] */
  int cap_rpos;
  int32_t *span; /* [n_tokens][2] attention spans (bidirectional images) */
  int cap_span;
} sm_mm_scratch;

void sm_seq_mm_free(sm_seq_mm *mm);
sm_seq_mm *sm_seq_mm_dup(const sm_seq_mm *mm);
/* tokens [old_n, n) were appended (tok: all n tokens) */
void sm_seq_mm_appended(sm_seq_mm *mm, const int32_t *tok, int old_n, int n);
/* attach spans over tokens of tok[0, n_tok) not computed yet (after any spans attached before) */
smelt_status sm_seq_set_media_impl(sm_seq_mm **out, const smelt_model *m, const int32_t *tok, int n_tok, int n_done,
                                   const sm_mm_span *spans, int n_spans);
/* how many of the first n_have tokens of a sequence (mm may be NULL) equal the prompt ids with the
 * images of spans, by prefix-cache keys; never ending inside an image span */
int sm_mm_common_prefix(const sm_seq_mm *mm, const int32_t *tok, int n_have, const int32_t *ids, int n,
                        const sm_mm_span *spans, int n_spans);
/* the sequence was truncated to len tokens */
void sm_seq_mm_truncated(sm_seq_mm *mm, const smelt_model *m, const int32_t *tok, int len);
/* Bidirectional spans (Gemma 3): the largest count <= want of pending tokens from done that does not
 * end inside a span (a span is computed in one step); -1 when a span starting at done is longer
 * than budget. */
int sm_seq_mm_take(const sm_seq_mm *mm, const smelt_model *m, int done, int want, int budget);
/* before a step: encode the images of spans that tokens [p0, p1) touch */
smelt_status sm_seq_mm_encode(sm_seq_mm *mm, smelt_model *m, int p0, int p1);
/* The batch rows [row, row + p1 - p0) are tokens [p0, p1) of a sequence: add their image runs to sc,
 * (M-RoPE) their positions at rpos + row (axis stride n_total) and (bidirectional images) their
 * attention spans at span + 2 row. mm may be NULL (text only); rpos and span may be NULL. */
void sm_mm_batch_rows(sm_mm_scratch *sc, const sm_seq_mm *mm, const smelt_model *m, const int32_t *tok, int p0, int p1,
                      int row, int n_total, int32_t *rpos, int32_t *span);
/* after the rows of all sequences: the runs' deepstack pointers */
void sm_mm_batch_done(sm_mm_scratch *sc);
void sm_mm_scratch_free(sm_mm_scratch *sc);

#endif
