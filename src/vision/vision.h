/* The vision tower of a vision-language checkpoint and what images become in a prompt.
 *
 * sm_vision (vit.h) is loaded with the model when the checkpoint has its vision tensors: Qwen2-VL,
 * Qwen2.5-VL and Qwen3-VL (ViT with 2-D RoPE, window attention, patch merger, deepstack), Gemma 3 (SigLIP, average
 * pool, projection), Mistral 3 (Pixtral ViT, patch merger, projector) and Idefics3 / SmolVLM (SigLIP
 * over the image's tiles and the whole image, pixel shuffle, projection). An image becomes an
 * sm_vimage: its pixel values and layout (any thread), then, on the engine thread, its embeddings in
 * the language model's hidden size, computed on the model's backend and kept in an LRU cache keyed by
 * the image's content hash (a repeated image is not encoded again).
 *
 * In a prompt an image is a span of tokens: the family's placeholder tokens, some of which take the
 * image's embedding rows (runs) instead of their token embeddings; Qwen's language models rotate the
 * span with 3-axis (M-RoPE) positions. */
#ifndef SM_VISION_H
#define SM_VISION_H
#include <stdatomic.h>
#include "base/base.h"
#include "vision/image.h"

typedef struct sm_vision sm_vision;
typedef struct smelt_model smelt_model;
typedef struct smelt_tokenizer smelt_tokenizer;

/* An encoded image in the vision cache (engine thread; pins: atomic, any thread). */
typedef struct sm_venc {
  uint8_t hash[32];
  int n_embd, dim; /* rows of embeddings, LM hidden size */
  float *embd;     /* backend buffer n_embd x dim */
  int n_deep;      /* Qwen3-VL deepstack: rows added after the first n_deep decoder layers */
  float **deep;    /* [n_deep] backend buffers n_embd x dim */
  size_t bytes;
  _Atomic int pins;
  uint64_t last_use;
  struct sm_venc *next;
} sm_venc;

/* One image prepared for a model. */
typedef struct sm_vimage {
  _Atomic int refs;
  uint8_t hash[32];         /* of the source image, the processor settings and the layout */
  int h, w;                 /* resized */
  int gh, gw;               /* patch grid */
  int n_embd;               /* embedding rows */
  int rows, cols;           /* the grid of embedding rows (Qwen: merged grid; Pixtral: merged rows x cols; Gemma: 16x16;
                       Idefics3: the tile grid, 0 x 0 without tiles) */
  int frames;               /* images of h x w encoded apart (Idefics3: tiles + the whole image; else 1) */
  float *px;                /* pixel values [frames][3][h][w] (freed once encoded) */
  sm_venc *enc;             /* set by sm_vision_encode (one pin) */
  struct sm_vimage **crops; /* Gemma 3's pan and scan: the crops, each an image of its own (owned) */
  int n_crops;
} sm_vimage;

/* Load the vision tower of m's checkpoint (the loader calls it when the packaging's vision tensors are
 * present; ctx: the loader's record of the tensors taken). */
typedef struct sm_load_ctx sm_load_ctx;
smelt_status sm_vision_load(smelt_model *m, sm_load_ctx *ctx, sm_vision **out);
void sm_vision_free(sm_vision *v);
/* the model's tokenizer, for the ids of tokens only it names (Pixtral's [IMG_BREAK], [IMG_END]) */
void sm_vision_set_tokenizer(sm_vision *v, const smelt_tokenizer *tok);
/* prefixes of the tensors a vision tower of this packaging has ("vision_tower.", ...) */
bool sm_vision_tensor(const char *name);
size_t sm_vision_weight_bytes(const sm_vision *v);
/* e.g. "qwen2_5_vl: ViT 32 blocks, 1280 wide, patch 14, merge 2" */
const char *sm_vision_describe(const sm_vision *v);

/* Preprocess an image for v (pixel values, layout, hash; with Gemma 3's pan and scan on, its crops
 * as images of their own in im->crops); thread-safe, no backend work. Errors: SMELT_ERR_INVALID for
 * images the processor refuses. */
smelt_status sm_vimage_new(const sm_vision *v, const sm_image *im, sm_vimage **out);
void sm_vimage_ref(sm_vimage *im);
void sm_vimage_unref(sm_vimage *im);
/* the spans n images take in a prompt: one each, and one for each pan-and-scan crop */
int sm_vision_span_count(sm_vimage *const *imgs, int n);

/* Encode on the model's backend (engine thread): sets im->enc, from the cache when an image with the
 * same hash was encoded before. */
smelt_status sm_vision_encode(sm_vision *v, sm_vimage *im);

/* ---- prompts (vision_prompt.c) ---- */
/* One image's tokens in a prompt: [t0, t1) is its span (placeholders, breaks, its start/end tokens
 * where the family has them); its embedding rows go, in order, to the runs of image tokens inside. */
typedef struct sm_mm_span {
  int t0, t1;
  sm_vimage *img; /* a reference */
} sm_mm_span;

/* The text a chat template renders for one image (the content part {"type": "image"}), as the
 * family's template does: "<|vision_start|><|image_pad|><|vision_end|>", "<start_of_image>", "[IMG]". */
const char *sm_vision_marker(const sm_vision *v);
/* Tokenize a rendered prompt holding n_img image markers (sm_vision_marker, in order of imgs): each
 * marker is expanded as the family's processor expands it (Qwen: n_embd image pads; Gemma 3: the
 * image sequence with its newlines; Pixtral: rows of [IMG] with [IMG_BREAK], [IMG_END]), the text
 * tokenized as a whole, and each image's span located. *ids and *spans malloc'd (spans hold
 * references). A marker count different from n_img is SMELT_ERR_INVALID. */
smelt_status sm_vision_tokenize(const sm_vision *v, const smelt_tokenizer *tok, const char *prompt, bool add_special,
                                sm_vimage *const *imgs, int n_img, int32_t **ids, int *n_ids, sm_mm_span **spans);
/* Locate the spans of n_img images in token ids (the image tokens of each, in order; each image's
 * count must equal its n_embd). Gemma 3's pan-and-scan crops have spans of their own after their
 * image's: sm_vision_span_count spans in all (also from sm_vision_tokenize). *spans malloc'd,
 * holding references. */
smelt_status sm_vision_spans(const sm_vision *v, const int32_t *ids, int n, sm_vimage *const *imgs, int n_img,
                             sm_mm_span **spans);
/* Whether token id takes an embedding row inside a span (the image token: Qwen's image pad, Gemma's
 * soft token, Pixtral's [IMG]) */
bool sm_vision_is_image_token(const sm_vision *v, int32_t id);
/* M-RoPE (Qwen-VL): 3-axis rope positions of tokens [0, n) holding the spans (rpos: 3 x n, axis-major),
 * as transformers' get_rope_index; *next: the position of a token appended after them. Other
 * families: rpos NULL is returned false. */
bool sm_vision_mrope(const sm_vision *v, const int32_t *ids, int n, const sm_mm_span *spans, int n_spans, int32_t *rpos,
                     int32_t *next);
/* Gemma 3: the tokens of an image attend to each other in both directions during prefill. */
bool sm_vision_bidirectional(const sm_vision *v);

#endif
