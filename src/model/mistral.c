/* Mistral: llama architecture, optional sliding window (config sliding_window). */
#include "model/model.h"
const sm_family sm_family_mistral = { .model_type = "mistral" };
