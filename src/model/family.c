#include "model/model.h"
#include <string.h>

/* Each family file defines one descriptor. */
extern const sm_family sm_family_llama, sm_family_mistral, sm_family_qwen2, sm_family_qwen3;

static const sm_family *const g_families[] = {
  &sm_family_llama, &sm_family_mistral, &sm_family_qwen2, &sm_family_qwen3,
};

const sm_family *sm_family_find(const char *model_type) {
  for (size_t i = 0; i < SM_ARRAY_LEN(g_families); i++)
    if (strcmp(g_families[i]->model_type, model_type) == 0) return g_families[i];
  return NULL;
}

const char *const *sm_family_names(void) {
  static const char *names[SM_ARRAY_LEN(g_families) + 1];
  for (size_t i = 0; i < SM_ARRAY_LEN(g_families); i++) names[i] = g_families[i]->model_type;
  return names;
}
