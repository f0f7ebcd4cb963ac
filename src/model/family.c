/* The family registry (family.h): the list of entries and lookups. Each entry is defined in its
 * fam_*.c file. */
#include "model/family.h"
#include <string.h>

extern const sm_family sm_family_llama, sm_family_mistral, sm_family_qwen2, sm_family_qwen3;
extern const sm_family sm_family_gemma, sm_family_gemma2, sm_family_gemma3_text, sm_family_phi3;

static const sm_family *const g_families[] = {
  &sm_family_llama, &sm_family_mistral, &sm_family_qwen2, &sm_family_qwen3,
  /* known configs, not runnable yet */
  &sm_family_gemma, &sm_family_gemma2, &sm_family_gemma3_text, &sm_family_phi3,
};

const sm_family *sm_family_find(const char *model_type) {
  if (!model_type) return NULL;
  for (size_t i = 0; i < SM_ARRAY_LEN(g_families); i++) {
    const sm_family *f = g_families[i];
    if (!strcmp(f->model_type, model_type)) return f;
    for (const char *const *a = f->aliases; a && *a; a++)
      if (!strcmp(*a, model_type)) return f;
  }
  return NULL;
}

const sm_family *sm_family_runnable(const char *model_type) {
  const sm_family *f = sm_family_find(model_type);
  return f && f->names && f->recipe ? f : NULL;
}

const sm_family *const *sm_family_all(size_t *n) {
  *n = SM_ARRAY_LEN(g_families);
  return g_families;
}

const sm_config_defaults *sm_family_defaults(const char *model_type) {
  const sm_family *f = sm_family_find(model_type);
  return f ? f->defaults : NULL;
}

smelt_status sm_family_config_load(const char *model_dir, sm_config *out) {
  return sm_config_load(model_dir, sm_family_defaults, out);
}

const char *sm_family_runnable_list(void) {
  static char list[512];
  if (!list[0])
    for (size_t i = 0; i < SM_ARRAY_LEN(g_families); i++) {
      if (!g_families[i]->recipe) continue;
      if (list[0]) strncat(list, ", ", sizeof list - strlen(list) - 1);
      strncat(list, g_families[i]->model_type, sizeof list - strlen(list) - 1);
    }
  return list;
}

void sm_family_layer_spec(const sm_family *f, const sm_config *c, int layer, sm_layer_spec *out) {
  memset(out, 0, sizeof *out);
  (void)layer;
  if (f->recipe->window == SM_WIN_ALL) out->window = c->sliding_window;
}
