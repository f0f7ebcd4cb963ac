/* Qwen2 / Qwen2.5: llama architecture with biases on the q/k/v projections. */
#include "model/model.h"
const sm_family sm_family_qwen2 = { .model_type = "qwen2", .qkv_bias = true };
