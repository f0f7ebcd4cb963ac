/* Families whose config.json smelt reads (for `inspect` and memory estimates) but which it does
 * not run yet: no tensor names, no recipe. Loading one fails with "unsupported model family". */
#include "model/family.h"

static const sm_config_defaults gemma_defaults = {
  .type = "gemma", .vocab = 256000, .hidden = 3072, .inter = 24576, .layers = 28, .heads = 16, .kv = 16,
  .head_dim = 256, .max_pos = 8192, .eps = 1e-6f, .theta = 10000.f, .act = "gelu_pytorch_tanh", .tie = true,
  .bos = 2, .eos = 1, .gemma_act = true,
};
const sm_family sm_family_gemma = { .model_type = "gemma", .description = "Gemma", .defaults = &gemma_defaults };

static const sm_config_defaults gemma2_defaults = {
  .type = "gemma2", .vocab = 256000, .hidden = 2304, .inter = 9216, .layers = 26, .heads = 8, .kv = 4,
  .head_dim = 256, .max_pos = 8192, .eps = 1e-6f, .theta = 10000.f, .act = "gelu_pytorch_tanh", .tie = true,
  .sw_mode = 1, .sliding = 4096, .bos = 2, .eos = 1, .final_softcap = 30.f, .attn_softcap = 50.f, .qpas = 256.f,
  .sw_pattern = 2, .gemma_act = true,
};
const sm_family sm_family_gemma2 = { .model_type = "gemma2", .description = "Gemma 2", .defaults = &gemma2_defaults };

static const sm_config_defaults gemma3_text_defaults = {
  .type = "gemma3_text", .vocab = 262208, .hidden = 2304, .inter = 9216, .layers = 26, .heads = 8, .kv = 4,
  .head_dim = 256, .max_pos = 131072, .eps = 1e-6f, .theta = 1000000.f, .act = "gelu_pytorch_tanh", .tie = true,
  .sw_mode = 1, .sliding = 4096, .bos = 2, .eos = 1, .qpas = 256.f, .sw_pattern = 6, .local_theta = 10000.f,
  .gemma_act = true,
};
static const char *const gemma3_aliases[] = { "gemma3", NULL };
const sm_family sm_family_gemma3_text = {
  .model_type = "gemma3_text", .aliases = gemma3_aliases, .description = "Gemma 3", .defaults = &gemma3_text_defaults,
};

static const sm_config_defaults phi3_defaults = {
  .type = "phi3", .vocab = 32064, .hidden = 3072, .inter = 8192, .layers = 32, .heads = 32, .max_pos = 4096,
  .eps = 1e-5f, .theta = 10000.f, .act = "silu", .sw_mode = 1, .bos = 1, .eos = 32000,
};
const sm_family sm_family_phi3 = { .model_type = "phi3", .description = "Phi-3 / Phi-4", .defaults = &phi3_defaults };
