#!/usr/bin/env python3
"""Random-weight vision-language checkpoints with real vision-tower shapes, for timing image encoding
(bench/vision/bench_vision.c). The vision tower and projector have the shapes of a real model
(bfloat16, dense, as mlx-vlm leaves the tower of most 4-bit conversions); the language model is a
one- or two-layer stand-in of the real hidden size (the projector's output), 4-bit. Weights are
random: only the time of the computation means anything.

  qwen2_5_vl_7b  Qwen2.5-VL-7B's ViT: 32 blocks, 1280 wide, MLP 3420, 16 heads, patch 14, windows of
                 112 pixels (full attention in blocks 7, 15, 23, 31), merger to 3584
  gemma3_4b      Gemma 3 4B's SigLIP: 27 layers, 1152 wide, MLP 4304, 16 heads, patch 14, 896 x 896,
                 pooled to 256 tokens, projection to 2560

Usage: python3 bench/vision/make_synth.py NAME OUTDIR   (numpy; tools/ of this repository)
"""
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import golden_vision  # noqa: E402
import make_golden  # noqa: E402
import mlxq  # noqa: E402
import vision_ref  # noqa: E402

SHAPES = {
    "qwen2_5_vl_7b": dict(
        name="qwen2_5_vl_vision", lm="qwen2_5_vl_q4_g64_bf16", text_hidden=3584,
        text=dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
                  intermediate_size=256, num_hidden_layers=1, max_window_layers=1,
                  rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_chans=3, window_size=112,
                    hidden_act="silu", fullatt_block_indexes=[7, 15, 23, 31], model_type="qwen2_5_vl"),
        top=dict(image_token_id=258, vision_start_token_id=256, vision_end_token_id=257),
        proc=dict(min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2, temporal_patch_size=2,
                  image_mean=vision_ref.CLIP_MEAN, image_std=vision_ref.CLIP_STD)),
    "gemma3_4b": dict(
        name="gemma3_vision", lm="gemma3_vlm_q4_g64_bf16", text_hidden=2560,
        text=dict(hidden_size=2560, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                  query_pre_attn_scalar=256, intermediate_size=256, num_hidden_layers=2, sliding_window=64),
        vision=dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304,
                    num_hidden_layers=27, num_attention_heads=16, patch_size=14, image_size=896,
                    layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh"),
        top=dict(image_token_index=258, boi_token_index=256, eoi_token_index=257, mm_tokens_per_image=256),
        proc=dict(size={"height": 896, "width": 896}, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                  do_pan_and_scan=None)),
}


def bf16(x):
    """float32 -> bfloat16 bytes (truncation: random weights need no rounding)"""
    return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit("usage: make_synth.py %s OUTDIR" % "|".join(SHAPES))
    fx, out = dict(SHAPES[sys.argv[1]], quant=[]), sys.argv[2]
    rng = np.random.default_rng(7)
    g = golden_vision.lm_fixture(fx)
    c = make_golden.text_config_dict(g)
    spec = make_golden.state_spec(g["model_type"], c)
    raw = make_golden.random_weights(spec, c, rng, g.get("embed_init", 1.0), g.get("layer_init", 1.0),
                                     g.get("head_gain", 1.0))
    tensors, _ = make_golden.build_tensors(g, c, spec, raw, rng)
    for name, _ in make_golden.VISION_TENSORS[g["vlm"]["model_type"]]:
        tensors.pop(name, None)
    for name, shape, kind in golden_vision.vision_spec(fx):
        if kind in ("vec",):
            w = np.ones(shape, np.float32)
        elif kind in ("bias", "gemma_norm"):
            w = 0.02 * rng.standard_normal(shape, dtype=np.float32)
        else:
            fan = shape[-1] if kind == "lin" else (int(np.prod(shape[1:])) if kind == "conv" else shape[0])
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / math.sqrt(fan))
        tensors[name] = ("BF16", shape, bf16(w))
    cfg = make_golden.smelt_config(g, c)
    cfg["vision_config"] = dict(fx["vision"])
    cfg.update(fx["top"])
    if g["quant"] is not None:
        cfg["quantization"] = dict(g["quant"])
        cfg["quantization_config"] = dict(g["quant"])
    os.makedirs(out, exist_ok=True)
    mlxq.write_safetensors(os.path.join(out, "model.safetensors"), tensors, {"format": "mlx"})
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump(fx["proc"], open(os.path.join(out, "preprocessor_config.json"), "w"), indent=1)
    json.dump(golden_vision.tokenizer_json(fx), open(os.path.join(out, "tokenizer.json"), "w"), indent=1)
    json.dump({"bos_token": None, "eos_token": None}, open(os.path.join(out, "tokenizer_config.json"), "w"))
    n = sum(len(t[2]) for k, t in tensors.items() if k.startswith(("vision_tower.", "multi_modal_projector.")))
    print("%s: %s (vision tower and projector %.0f MB)" % (sys.argv[1], out, n / 1e6))


if __name__ == "__main__":
    main()
