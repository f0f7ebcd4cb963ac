/* The vision towers' state (private to src/vision): configuration, weights and scratch of the
 * vision encoder and projector of each family, loaded by vision_load.c and run by vit.c. */
#ifndef SM_VISION_VIT_H
#define SM_VISION_VIT_H
#include "model/model.h"
#include "vision/preprocess.h"
#include "vision/vision.h"

typedef enum {
  SM_VIT_QWEN25 = 1, /* Qwen2.5-VL: RMSNorm, gated SiLU MLP, window attention, patch merger */
  SM_VIT_QWEN3,      /* Qwen3-VL: LayerNorm, GELU-tanh MLP, learned positions (interpolated), deepstack */
  SM_VIT_SIGLIP,     /* Gemma 3: SigLIP encoder, average pool, RMSNorm and projection */
  SM_VIT_PIXTRAL,    /* Mistral 3: Pixtral encoder, RMSNorm, patch merger, two-layer projector */
  SM_VIT_IDEFICS3,   /* Idefics3, SmolVLM: SigLIP encoder over tiles, pixel shuffle, projection */
  SM_VIT_QWEN2,      /* Qwen2-VL: LayerNorm, quick-GELU MLP, full attention, patch merger (LayerNorm) */
} sm_vit_kind;

/* one encoder block; a NULL bias / norm pointer: none */
typedef struct {
  sm_weight qkv, q, k, v, o; /* fused qkv (Qwen): q, k, v are its row views */
  float *qb, *kb, *vb, *ob;
  float *n1w, *n1b, *n2w, *n2b;
  sm_weight fc1, fc2; /* plain MLP (GELU) */
  float *fc1b, *fc2b;
  sm_weight gate, up, down; /* gated MLP (SiLU) */
  float *gateb, *upb, *downb;
} sm_vit_layer;

/* Qwen's patch merger: norm (over H per patch, or over 4H after the shuffle), fc1, GELU, fc2 */
typedef struct {
  bool post_norm, rms;
  float *nw, *nb;
  sm_weight fc1, fc2;
  float *fc1b, *fc2b;
} sm_vit_merger;

struct sm_vision {
  sm_vit_kind kind;
  smelt_model *m;
  sm_backend *be;
  sm_imgproc proc;
  char desc[160];
  /* encoder */
  int hidden, heads, head_dim, inter, layers, patch, temporal, merge, out_dim; /* merge: Idefics3's scale_factor */
  bool layernorm, gated; /* LayerNorm with bias (else RMSNorm); gated SiLU MLP (else GELU-tanh) */
  float eps;
  sm_weight patch_w; /* [hidden][patch_k]: conv weight, columns in (t, y, x, c) order */
  int patch_k;
  float *patch_b;
  sm_vit_layer *L;
  /* 2-D RoPE (Qwen, Pixtral): frequency table and axis of each frequency (backend buffers) */
  float *rope_inv;
  int32_t *rope_axis;
  /* Qwen2.5-VL window attention */
  int window;       /* pixels */
  bool *full_layer; /* [layers] */
  /* Qwen3-VL: learned positions (host, float32) interpolated per image; deepstack */
  float *pos_host;
  int pos_side;
  int n_deep;
  int *deep_layer; /* [n_deep] block indexes */
  sm_vit_merger merger, *deep;
  /* SigLIP (Gemma 3, Idefics3) */
  float *pos_embed; /* backend [n_pos][hidden] */
  float *post_w, *post_b;
  float *mm_norm;    /* Gemma RMSNorm (1 + w) */
  sm_weight mm_proj; /* [out_dim][hidden]; Idefics3's connector [out_dim][hidden * merge^2] */
  int mm_side;       /* tokens per side after the pool (16) or the pixel shuffle (of a frame) */
  int side;          /* patches per side (64; Idefics3: of the position table, image_size / patch) */
  /* Pixtral / Mistral 3 */
  float *ln_pre;
  int feature_layer; /* hidden state used: after this many blocks */
  float *proj_norm;
  float proj_eps;
  sm_weight merge_w; /* [hidden][4*hidden], columns in (k, c) order */
  sm_weight lin1, lin2;
  float *lin1b, *lin2b;
  /* tokens */
  int32_t image_token, vision_start, vision_end; /* Qwen */
  int32_t boi, eoi;                              /* Gemma 3 */
  int32_t img_break, img_end;                    /* Pixtral */
  size_t weight_bytes;
  /* cache of encoded images and scratch (engine thread) */
  sm_venc *cache;
  size_t cache_bytes, cache_max;
  uint64_t tick;
  float *buf[10];
  size_t buf_cap[10];
  int32_t *ibuf[3];
  size_t ibuf_cap[3];
  /* backend buffers the tower owns */
  void **owned;
  int n_owned;
  float **host_owned;
  int n_host_owned;
};

/* vision_load.c */
void *sm_vit_own(sm_vision *v, void *backend_buf);
/* vit.c */
void sm_vit_cache_clear(sm_vision *v);

#endif
