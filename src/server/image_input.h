/* Images of an API request (private to src/server): the URLs of its image content parts (api.h)
 * become images prepared for the model's vision tower: data: URLs with base64 data always; http(s)
 * URLs only where the server allows them (--allow-image-urls), fetched with size and time limits;
 * local files (file:// URLs or absolute paths) only inside the directory of --allow-image-files.
 * Every refusal is a 400 naming the part and the reason. */
#ifndef SM_SERVER_IMAGE_INPUT_H
#define SM_SERVER_IMAGE_INPUT_H
#include "server/api.h"
#include "vision/vision.h"

typedef struct {
  bool allow_urls;       /* fetch http(s) image URLs */
  const char *files_dir; /* read files under this directory (a real path, no trailing '/'); NULL: none */
  size_t max_bytes;      /* an encoded image (data or download) */
  long timeout_s;        /* a download */
  sm_image_limits lim;   /* decoded size */
} sm_image_policy;

void sm_image_policy_default(sm_image_policy *p);

/* The request's images (req->image_urls, in order) decoded and prepared for v. *out: n references
 * (sm_vimage_unref each, free the array). v NULL: a 400 saying that model_id does not take images
 * (why: the model's note, may be NULL). */
bool sm_request_images(const sm_vision *v, const char *model_id, const char *why, const sm_image_policy *pol,
                       const sm_api_request *req, sm_vimage ***out, sm_api_error *err);

/* Standard base64 (RFC 4648, padding optional) into *out (malloc'd); false on a character outside
 * the alphabet or misplaced padding. */
bool sm_base64_decode(const char *s, size_t len, unsigned char **out, size_t *out_len);

#endif
