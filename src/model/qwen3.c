/* Qwen3: llama architecture with per-head RMSNorm on q and k (before RoPE), no biases. */
#include "model/model.h"
const sm_family sm_family_qwen3 = { .model_type = "qwen3", .qk_norm = true };
