/* Vision-language packagings (family.h): the LM of these checkpoints is a registered text family under
 * "language_model." (mlx-vlm's and mlx-lm's layout), next to a vision tower under the skip prefixes,
 * which src/vision loads for gemma3, mistral3, qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe, qwen3_5,
 * qwen3_5_moe, idefics3 and smolvlm (image input). */
#include <string.h>
#include "model/family.h"

bool sm_vlm_images(const char *t) {
  return t && (!strcmp(t, "gemma3") || !strcmp(t, "mistral3") || !strcmp(t, "qwen2_5_vl") || !strcmp(t, "qwen3_vl") ||
               !strcmp(t, "qwen2_vl") || !strcmp(t, "qwen3_vl_moe") || !strcmp(t, "qwen3_5") ||
               !strcmp(t, "qwen3_5_moe") || !strcmp(t, "idefics3") || !strcmp(t, "smolvlm"));
}

static const char *const vision_skip[] = {"vision_tower.", "multi_modal_projector.", NULL};
/* Idefics3 / SmolVLM: mlx-vlm's sanitize maps model.text_model.* to language_model.* (no "model." level) */
static const char *const idefics3_skip[] = {"vision_model.", "connector.", NULL};

static const sm_config_defaults gemma3_defaults = {.type = "gemma3", .text_type = "gemma3_text"};
const sm_vlm_packaging sm_vlm_gemma3 = {
  .model_type = "gemma3",
  .description = "Gemma 3 vision-language checkpoints (text model: gemma3_text)",
  .example = "mlx-community/gemma-3-4b-it-4bit",
  .defaults = &gemma3_defaults,
  .lm_prefix = "language_model.",
  .skip = vision_skip,
};

static const sm_config_defaults mistral3_defaults = {.type = "mistral3", .text_type = "mistral"};
const sm_vlm_packaging sm_vlm_mistral3 = {
  .model_type = "mistral3",
  .description = "Mistral Small 3.1/3.2, Ministral 3 (text model: mistral, ministral3)",
  .example = "mlx-community/Mistral-Small-3.2-24B-Instruct-2506-4bit",
  .defaults = &mistral3_defaults,
  .lm_prefix = "language_model.",
  .skip = vision_skip,
};

static const sm_config_defaults qwen2_5_vl_defaults = {.type = "qwen2_5_vl", .text_type = "qwen2_5_vl_text"};
const sm_vlm_packaging sm_vlm_qwen2_5_vl = {
  .model_type = "qwen2_5_vl",
  .description = "Qwen2.5-VL (text model: qwen2_5_vl_text)",
  .example = "mlx-community/Qwen2.5-VL-3B-Instruct-4bit",
  .defaults = &qwen2_5_vl_defaults,
  .lm_prefix = "language_model.",
  .skip = vision_skip,
};

static const sm_config_defaults qwen2_vl_defaults = {.type = "qwen2_vl", .text_type = "qwen2_vl_text"};
const sm_vlm_packaging sm_vlm_qwen2_vl = {
  .model_type = "qwen2_vl",
  .description = "Qwen2-VL (text model: qwen2_vl_text)",
  .example = "mlx-community/Qwen2-VL-2B-Instruct-4bit",
  .defaults = &qwen2_vl_defaults,
  .lm_prefix = "language_model.",
  .skip = vision_skip,
};

static const sm_config_defaults qwen3_vl_defaults = {.type = "qwen3_vl", .text_type = "qwen3_vl_text"};
const sm_vlm_packaging sm_vlm_qwen3_vl = {
  .model_type = "qwen3_vl",
  .description = "Qwen3-VL (text model: qwen3_vl_text)",
  .example = "mlx-community/Qwen3-VL-4B-Instruct-4bit",
  .defaults = &qwen3_vl_defaults,
  .lm_prefix = "language_model.",
  .skip = vision_skip,
};

static const sm_config_defaults qwen3_vl_moe_defaults = {.type = "qwen3_vl_moe", .text_type = "qwen3_vl_moe_text"};
const sm_vlm_packaging sm_vlm_qwen3_vl_moe = {
  .model_type = "qwen3_vl_moe",
  .description = "Qwen3-VL-MoE (text model: qwen3_vl_moe_text)",
  .example = "mlx-community/Qwen3-VL-30B-A3B-Instruct-4bit",
  .defaults = &qwen3_vl_moe_defaults,
  .lm_prefix = "language_model.",
  .skip = vision_skip,
};

/* Gemma 4: the text model under "language_model.model." (mlx-lm's and mlx-vlm's sanitize); the vision and
 * audio towers and their embedders are skipped (text only) */
static const char *const gemma4_skip[] = {"vision_tower.",
                                          "multi_modal_projector.",
                                          "audio_tower.",
                                          "embed_audio.",
                                          "embed_vision.",
                                          "vision_embedder.",
                                          NULL};
static const sm_config_defaults gemma4_defaults = {.type = "gemma4", .text_type = "gemma4_text"};
const sm_vlm_packaging sm_vlm_gemma4 = {
  .model_type = "gemma4",
  .description = "Gemma 4 checkpoints (text model: gemma4_text; no image or audio input)",
  .example = "mlx-community/gemma-4-e2b-it-4bit",
  .defaults = &gemma4_defaults,
  .lm_prefix = "language_model.",
  .skip = gemma4_skip,
};

/* Qwen3.5 / 3.6: mlx-lm and mlx-vlm write the text model under "language_model." (mlx-lm drops the vision
 * tower; mlx-vlm keeps Qwen3-VL's, without deepstack) */
static const sm_config_defaults qwen3_5_defaults = {.type = "qwen3_5", .text_type = "qwen3_5_text"};
const sm_vlm_packaging sm_vlm_qwen3_5 = {
  .model_type = "qwen3_5",
  .description = "Qwen3.5 / 3.6 (text model: qwen3_5_text)",
  .example = "mlx-community/Qwen3.5-9B-4bit",
  .defaults = &qwen3_5_defaults,
  .lm_prefix = "language_model.",
  .skip = vision_skip,
};
static const sm_config_defaults qwen3_5_moe_defaults = {.type = "qwen3_5_moe", .text_type = "qwen3_5_moe_text"};
const sm_vlm_packaging sm_vlm_qwen3_5_moe = {
  .model_type = "qwen3_5_moe",
  .description = "Qwen3.5 / 3.6 MoE (text model: qwen3_5_moe_text)",
  .example = "mlx-community/Qwen3.5-35B-A3B-4bit",
  .defaults = &qwen3_5_moe_defaults,
  .lm_prefix = "language_model.",
  .skip = vision_skip,
};

/* Idefics3 and SmolVLM / SmolVLM2 (SigLIP tiles, pixel-shuffle connector, a llama text model) */
static const sm_config_defaults idefics3_defaults = {.type = "idefics3", .text_type = "llama"};
const sm_vlm_packaging sm_vlm_idefics3 = {
  .model_type = "idefics3",
  .description = "Idefics3, SmolVLM (text model: llama)",
  .example = "mlx-community/SmolVLM-256M-Instruct-bf16",
  .defaults = &idefics3_defaults,
  .lm_prefix = "language_model.",
  .lm_root = "",
  .skip = idefics3_skip,
};
static const sm_config_defaults smolvlm_defaults = {.type = "smolvlm", .text_type = "llama"};
const sm_vlm_packaging sm_vlm_smolvlm = {
  .model_type = "smolvlm",
  .description = "SmolVLM2 (text model: llama)",
  .example = "mlx-community/SmolVLM2-2.2B-Instruct-mlx",
  .defaults = &smolvlm_defaults,
  .lm_prefix = "language_model.",
  .lm_root = "",
  .skip = idefics3_skip,
};
