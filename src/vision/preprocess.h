/* The image processors of the vision-language families, as their Hugging Face (slow, Pillow-based)
 * image processors compute pixel values: Qwen2-VL's dynamic resolution (smart_resize to multiples of
 * patch * merge within min_pixels..max_pixels, bicubic), Gemma 3's fixed square (SigLIP, bilinear)
 * Pixtral's longest-edge fit to multiples of the patch (bicubic) and Idefics3 / SmolVLM's tiles (the
 * longest edge resized, then to multiples of the tile, split into tiles plus the whole image at tile
 * size; Lanczos); then rescale (float64, rounded to float32) and normalize (float32), as
 * transformers' rescale() and normalize() do. */
#ifndef SM_VISION_PREPROCESS_H
#define SM_VISION_PREPROCESS_H
#include <cjson/cJSON.h>
#include "vision/image.h"

typedef enum {
  SM_IMGPROC_QWEN = 1, /* Qwen2VLImageProcessor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) */
  SM_IMGPROC_FIXED,    /* resize to height x width (Gemma3ImageProcessor, SigLIP) */
  SM_IMGPROC_PIXTRAL,  /* PixtralImageProcessor (Mistral 3) */
  SM_IMGPROC_IDEFICS3, /* Idefics3ImageProcessor, SmolVLMImageProcessor */
} sm_imgproc_kind;

typedef struct {
  sm_imgproc_kind kind;
  sm_resample resample;
  bool do_resize, do_rescale, do_normalize;
  double rescale_factor;
  float mean[3], std[3];
  int patch;                   /* QWEN: patch_size; PIXTRAL: the resize multiple (patch_size * spatial_merge_size) */
  int merge, temporal;         /* QWEN: merge_size, temporal_patch_size */
  long min_pixels, max_pixels; /* QWEN */
  int height, width;           /* FIXED */
  bool pan_and_scan;           /* FIXED (Gemma 3): crops of wide or tall images besides the whole image */
  int pas_min_crop, pas_max_crops;
  double pas_min_ratio;
  int longest_edge; /* PIXTRAL, IDEFICS3 (size.longest_edge) */
  int tile;         /* IDEFICS3: max_image_size.longest_edge, the side of every frame */
  bool splitting;   /* IDEFICS3: do_image_splitting */
} sm_imgproc;

/* The class defaults of a kind (QWEN: patch 14, Qwen2-VL's min/max pixels; FIXED: 896 x 896;
 * PIXTRAL: longest edge 1024, patch 16; IDEFICS3: longest edge 4 * 364, tiles of 364, Lanczos). */
void sm_imgproc_defaults(sm_imgproc_kind kind, sm_imgproc *out);
/* Override the defaults in *p with the members of a preprocessor_config.json object (and the
 * "image_processor" member of processor_config.json, which wins; either may be NULL). Bad values
 * give SMELT_ERR_FORMAT naming the member. */
smelt_status sm_imgproc_parse(const cJSON *preprocessor, const cJSON *processor, sm_imgproc *p);

/* The size (height x width) the processor resizes an h x w image to (IDEFICS3: the size it is split
 * from); SMELT_ERR_INVALID (with the processor's reason) for images it refuses (Qwen: aspect ratio
 * above 200). */
smelt_status sm_imgproc_target(const sm_imgproc *p, int h, int w, int *out_h, int *out_w);

/* Gemma3ImageProcessor.pan_and_scan's crops of an h x w image: 0 (none), or the count ncw * nch of
 * crops of cw x ch pixels at (x * cw, y * ch), row-major, the last of a row or column cut at the
 * image's edge. */
int sm_imgproc_pan_scan(const sm_imgproc *p, int h, int w, int *cw, int *ch, int *ncw, int *nch);
/* Those crops of img as images (*out malloc'd, *n of them; none: *out NULL, *n 0), in the processor's
 * order; SMELT_ERR_INVALID where one would be empty (the processor fails there too). */
smelt_status sm_imgproc_crops(const sm_imgproc *p, const sm_image *img, sm_image **out, int *n);

/* Idefics3 / SmolVLM's sizes for an h x w image: (h1, w1) after the longest-edge resize, (h2, w2)
 * after the resize to multiples of the tile, and the tile grid (rows x cols; 0 x 0: the image is one
 * frame of its own). */
void sm_imgproc_idefics3_sizes(const sm_imgproc *p, int h, int w, int *h1, int *w1, int *h2, int *w2, int *rows,
                               int *cols);

/* Normalized pixel values of one image, channels first: px[f][c][y][x], c < 3, f < frames (IDEFICS3:
 * the rows x cols tiles row-major, then the whole image; one frame otherwise). */
typedef struct {
  int h, w;
  int frames;     /* 1, or IDEFICS3's tiles + 1 */
  int rows, cols; /* IDEFICS3: the tile grid (0 x 0 without tiles) */
  float *px;      /* malloc'd, frames * 3 * h * w floats */
} sm_pixels;
smelt_status sm_imgproc_run(const sm_imgproc *p, const sm_image *im, sm_pixels *out);
void sm_pixels_free(sm_pixels *px);

/* Qwen2-VL's flattened patches (the processor's pixel_values for one image): rows in the order
 * (h/merge, w/merge, merge, merge) over the patch grid, each row C x temporal x patch x patch with
 * the image repeated over the temporal axis. out: (h/patch)*(w/patch) rows of 3*temporal*patch^2
 * floats (malloc'd). */
float *sm_qwen_patchify(const sm_pixels *px, int patch, int merge, int temporal);

#endif
