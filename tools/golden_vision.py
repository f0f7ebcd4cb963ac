#!/usr/bin/env python3
"""Golden fixtures of the vision-language families: tiny random vision towers next to tiny random
language models, in the MLX layout mlx-vlm writes, with one image, its prompt and reference outputs.

Per fixture (tests/golden/vision/<name>/):
  config.json, preprocessor_config.json, model.safetensors, tokenizer.json, tokenizer_config.json
  (smolvlm: processor_config.json too)
  image.jpg           the image (tests/vision/data/images/rgb_45x30.jpg)
  embeddings.f32      the image's embeddings [n_embd, hidden] (+ Qwen3-VL / Qwen3-VL-MoE deepstack rows after them)
  logits.f32          logits of every prompt position [T, vocab]
  manifest.json       the prompt text, its ids (images expanded as the processor expands them), the
                      image spans, 40 greedy ids with their top-2 margins, tolerances; smolvlm also
                      n_frames (tiles + global image), split [rows, cols] of the tiles ([0, 0]: one
                      frame), image_seq_len (tokens a frame), special_tokens; its image_size is one
                      frame's [S, S], embedding_grid one frame's token grid, embedding_rows
                      n_frames * image_seq_len (frames in the processor's order), span [first <image>
                      token, one past the last]; the mixtures of experts (qwen3_vl_moe) also route_min_margin
                      (the smallest gap between the last chosen and the first unchosen expert's router
                      probability over every token and MoE layer of the prompt and the greedy continuation)
                      and route_min_margin_prompt (the prompt's own tokens)

The families (written from transformers' modeling code, float64, on the dequantized weights):
  qwen2_5_vl  ViT (RMSNorm, gated SiLU MLP, 2-D RoPE, window attention with one full block), patch
              merger; M-RoPE positions in the language model
  qwen2_vl    ViT (LayerNorm, quick-GELU MLP fc1/fc2, 2-D RoPE, every block full attention), patch merger
              (LayerNorm ln_q); the text model of qwen2_5_vl_vision (M-RoPE) packaged as model_type qwen2_vl
  qwen3_vl    ViT (LayerNorm, GELU-tanh MLP, interpolated learned positions, 2-D RoPE), patch merger,
              deepstack mergers added after the first decoder layers; interleaved M-RoPE
  qwen3_vl_moe qwen3_vl's tower (vision_config model_type qwen3_vl_moe) next to a Qwen3-VL-MoE text model
              (text_config model_type qwen3_vl_moe_text: Qwen3 blocks, q/k head norms, every MLP a mixture of
              experts with softmax top-k routing renormalized, interleaved M-RoPE, deepstack); its experts
              stacked as mlx-vlm's sanitize leaves them (switch_mlp.{gate,up,down}_proj [E, I, H] / [E, H, I]),
              its routers 8-bit g64 (mlx-vlm's quant_predicate), its head untied as in Qwen3-VL-30B-A3B
  qwen3_5     Qwen3.5 (natively multimodal): qwen3_vl's tower without deepstack (vision_config model_type qwen3_5,
              deepstack_visual_indexes []) next to a Qwen3.5 hybrid text model (text_config qwen3_5_text: Gated
              DeltaNet layers and gated attention layers with partial rotary, (1 + w) norms stored as 1 + w as
              mlx-vlm's sanitize leaves them, conv1d [C, K, 1]); interleaved M-RoPE on the attention layers' rotary
              dims, image rows into the embeddings (no deepstack)
  gemma3      SigLIP encoder, average pool, (1 + w) RMSNorm, projection; the image's tokens attend
              each other in both directions
  mistral3    Pixtral encoder (2-D RoPE, RMSNorm, gated SiLU), RMSNorm, 2x2 patch merger, projector
  smolvlm     Idefics3 / SmolVLM: the image split into tiles plus a global image (the SmolVLM image
              processor), a SigLIP encoder per frame (bucketized learned positions), pixel shuffle
              (scale 2), a projection; a llama text model under language_model.* without the "model."
              level (mlx-vlm's sanitize), lm_head untied; config.json top level model_type "smolvlm"

Two references:
  default (--numpy)  this file's float64 numpy forward (vision) + tools/check_golden.py's forward (text)
  --transformers     transformers' own classes (Qwen2_5_VLForConditionalGeneration, ...), float32,
                     CPU, eager attention, the slow (Pillow) image processors: run on a machine with
                     torch and transformers 5.x; the numpy reference is checked against it and the
                     fixture's reference becomes transformers.

Usage: python3 tools/golden_vision.py [--transformers] [--only NAME[,NAME]] [OUTDIR]
       (OUTDIR default tests/golden/vision; numpy and Pillow needed: python3-numpy python3-pil)
"""
import copy
import json
import math
import os
import re
import shutil
import sys
import traceback

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_golden  # noqa: E402
import make_golden  # noqa: E402
import mlxq  # noqa: E402
import vision_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = os.path.join(ROOT, "tests", "vision", "data", "images", "rgb_45x30.jpg")
N_GEN = 40
Q32 = {"group_size": 32, "bits": 4}
QWEN = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5")  # the Qwen families: grid pixels, M-RoPE,
# model.visual
# a family whose vision tower is another's (the same modules, names and forward; Qwen3.5's: Qwen3-VL's without deepstack)
TOWER = {"qwen3_vl_moe": "qwen3_vl", "qwen3_5": "qwen3_vl"}
# the text model type a config.json names -> the check_golden family of the same forward (the numpy reference runs
# the twin; make_golden writes its weights): Qwen3-VL-MoE's text model is qwen3_moe's blocks (q/k head norms, the
# mixture on every layer with decoder_sparse_step 1, softmax top-k renormalized: Qwen3VLMoeTextTopKRouter always
# renormalizes, the fixture's norm_topk_prob says so too) with interleaved M-RoPE positions (rope_pos) and deepstack
TEXT_TWIN = {"qwen3_vl_moe_text": "qwen3_moe"}

# Qwen2-VL's text model is Qwen2.5-VL's (transformers' Qwen2VLTextModel: qwen2 blocks, q/k/v biases, M-RoPE):
# check_golden's forward reads a flat qwen2_vl config.json as the qwen2_5_vl_text family
check_golden.VLM_TEXT_TYPE.setdefault("qwen2_vl", "qwen2_5_vl_text")

# special tokens of each fixture's tokenizer (256 byte tokens, then these: added tokens take the ids
# after the vocabulary, as the tokenizers library assigns them)
SPECIAL = {
    "qwen2_5_vl": {"<|vision_start|>": 256, "<|vision_end|>": 257, "<|image_pad|>": 258},
    "qwen2_vl": {"<|vision_start|>": 256, "<|vision_end|>": 257, "<|image_pad|>": 258},
    "qwen3_vl": {"<|vision_start|>": 256, "<|vision_end|>": 257, "<|image_pad|>": 258},
    "qwen3_vl_moe": {"<|vision_start|>": 256, "<|vision_end|>": 257, "<|image_pad|>": 258},
    "qwen3_5": {"<|vision_start|>": 256, "<|vision_end|>": 257, "<|image_pad|>": 258},
    "gemma3": {"<start_of_image>": 256, "<end_of_image>": 257, "<image_soft_token>": 258},
    "mistral3": {"[IMG]": 256, "[IMG_BREAK]": 257, "[IMG_END]": 258},
    "smolvlm": dict([("<fake_token_around_image>", 256), ("<image>", 257), ("<global-img>", 258)] +
                    [("<row_%d_col_%d>" % (r, c), 259 + 3 * (r - 1) + (c - 1))
                     for r in (1, 2, 3) for c in (1, 2, 3)] +
                    [("<end_of_utterance>", 268)]),
}

# the text model of the SmolVLM fixture (not a make_golden fixture: no text golden of its own). mlx-vlm's
# Idefics3 language model is a plain llama (head_dim hidden / heads, RoPE without scaling, lm_head always
# there); one per-module quantization override, named like the tensors (language_model.layers...)
SMOLVLM_LM = dict(name="smolvlm_text_q4_g64_bf16", model_type="llama", dtype="bfloat16", head_gain=3.0,
                  cfg=dict(vocab_size=272, tie_word_embeddings=False, head_dim=16, rope_theta=100000.0,
                           attention_bias=False, mlp_bias=False, rms_norm_eps=1e-5),
                  quant={"group_size": 64, "bits": 4},
                  overrides={"model.layers.1.mlp.down_proj": {"group_size": 32, "bits": 8}},
                  vlm=dict(model_type="smolvlm", layout="text_config"), flat_lm=True)

# the text model of the Qwen3-VL-MoE fixture (not a make_golden fixture): make_golden writes it as its qwen3_moe family
# (the same tensors: q/k head norms, router mlp.gate, experts stacked under mlp.switch_mlp as mlx-vlm's sanitize
# leaves Qwen3-VL-MoE's fused experts.gate_up_proj / down_proj), config.json names it config_type. Every layer a
# mixture (decoder_sparse_step 1, mlp_only_layers []), top 2 of 4; moe_intermediate_size 128: a multiple of the group
# size (down_proj is quantized along it) and unlike hidden (64) and 2 * itself unlike hidden, so that no expert tensor
# is square in its last two axes (a transposed layout cannot pass unnoticed, here or in a runtime). Routers 8-bit g64
# (mlx-vlm's quant_predicate for qwen3_vl_moe: mlp.gate); the head untied (Qwen3-VL-30B-A3B's)
QWEN3_VL_MOE_LM = dict(name="qwen3_vl_moe_text_q4_g64_bf16", model_type="qwen3_moe", config_type="qwen3_vl_moe_text",
                       dtype="bfloat16", head_gain=2.0,
                       cfg=dict(head_dim=16, tie_word_embeddings=False, rope_theta=5000000.0, attention_bias=False,
                                rms_norm_eps=1e-6, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                                norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3],
                                              "mrope_interleaved": True}),
                       quant={"group_size": 64, "bits": 4},
                       overrides=make_golden.router_overrides("mlp.gate", 2),
                       vlm=dict(model_type="qwen3_vl_moe", layout="text_config"))

FIXTURES = [
    dict(name="qwen2_5_vl_vision", lm="qwen2_5_vl_q4_g64_bf16", seed=31,
         vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
                     spatial_merge_size=2, temporal_patch_size=2, in_chans=3, window_size=16, hidden_act="silu",
                     fullatt_block_indexes=[1], model_type="qwen2_5_vl"),
         top=dict(image_token_id=258, vision_start_token_id=256, vision_end_token_id=257),
         proc=dict(min_pixels=64, max_pixels=960, patch_size=4, merge_size=2, temporal_patch_size=2,
                   image_mean=vision_ref.CLIP_MEAN, image_std=vision_ref.CLIP_STD),
         quant=["vision_tower.blocks.0.attn.qkv", "vision_tower.blocks.2.mlp.up_proj"],
         prompt="Hi <|vision_start|><|image_pad|><|vision_end|>what?"),
    # Qwen2-VL: the text model of qwen2_5_vl_vision's LM fixture (qwen2 blocks, M-RoPE, flat layout), packaged as
    # model_type qwen2_vl (vlm_type: this file's copy of the LM fixture, make_golden's own unchanged); the tower
    # is Qwen2-VL's (vision_config hidden_size = the LM's hidden size, the merger's output; embed_dim the ViT's)
    dict(name="qwen2_vl_vision", lm="qwen2_5_vl_q4_g64_bf16", vlm_type="qwen2_vl", text_model_type="qwen2_vl_text",
         seed=58,
         vision=dict(model_type="qwen2_vl", depth=3, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=1.5,
                     patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
                     hidden_act="quick_gelu"),
         top=dict(image_token_id=258, vision_start_token_id=256, vision_end_token_id=257),
         proc=dict(min_pixels=64, max_pixels=960, patch_size=4, merge_size=2, temporal_patch_size=2,
                   image_mean=vision_ref.CLIP_MEAN, image_std=vision_ref.CLIP_STD),
         quant=["vision_tower.blocks.1.attn.qkv"],
         prompt="Hi <|vision_start|><|image_pad|><|vision_end|>what?"),
    dict(name="qwen3_vl_vision", lm="qwen3_vl_q4_g64_f16", seed=32,
         vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
                     spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=16,
                     deepstack_visual_indexes=[0, 2], hidden_act="gelu_pytorch_tanh", model_type="qwen3_vl"),
         top=dict(image_token_id=258, vision_start_token_id=256, vision_end_token_id=257),
         proc=dict(size={"shortest_edge": 64, "longest_edge": 960}, patch_size=4, merge_size=2,
                   temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3),
         quant=["vision_tower.blocks.1.attn.proj"],
         prompt="<|vision_start|><|image_pad|><|vision_end|>Say it"),
    # Qwen3-VL-MoE (Qwen3-VL-30B-A3B's layout): qwen3_vl_vision's tower, vision_config model_type qwen3_vl_moe (as the
    # released config.json names it; transformers reads it as qwen3_vl_moe_vision); QWEN3_VL_MOE_LM's text model
    dict(name="qwen3_vl_moe_vision", lm=QWEN3_VL_MOE_LM, seed=832,
         vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
                     spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=16,
                     deepstack_visual_indexes=[0, 2], hidden_act="gelu_pytorch_tanh", model_type="qwen3_vl_moe"),
         top=dict(image_token_id=258, vision_start_token_id=256, vision_end_token_id=257),
         proc=dict(size={"shortest_edge": 64, "longest_edge": 960}, patch_size=4, merge_size=2,
                   temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3),
         quant=["vision_tower.blocks.1.attn.proj"],
         prompt="<|vision_start|><|image_pad|><|vision_end|>Say it"),
    # Qwen3.5 (natively multimodal, model_type qwen3_5): Qwen3-VL's tower without deepstack (vision_config model_type
    # qwen3_5 as the released config.json names it, deepstack_visual_indexes []) next to make_golden's qwen3_5 hybrid
    # text model (its fixture's weights layout and quantization), three fields changed so that the image's M-RoPE
    # positions show in the logits: head_dim 32 (rotary dims 32 * 0.25 = 8: 4 frequencies, room for all three axes,
    # interleaved T H W T by mrope_section [2, 1, 1]; head_dim 16 leaves 2, no W axis), full_attention_interval 2
    # (Gated DeltaNet on layers 0 and 2, gated attention on 1 and 3), rope_theta 1000 (at 1e7 the H and W
    # frequencies of 4 are 0.018 and 3e-4 rad a position: a wrong W position moves no logit by 5e-4). The seed:
    # every greedy margin >= 0.1, no special or eos id generated; swapping the H and W positions moves the prompt
    # logits by up to 2.6, W = T by 0.6, the sectioned (not interleaved) layout by 0.7, text positions by 5.5
    dict(name="qwen3_5_vision", lm="qwen3_5_q4_g64_bf16", seed=175,
         vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
                     spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=16,
                     deepstack_visual_indexes=[], hidden_act="gelu_pytorch_tanh", model_type="qwen3_5"),
         text=dict(head_dim=32, full_attention_interval=2,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25,
                                    "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
         top=dict(image_token_id=258, vision_start_token_id=256, vision_end_token_id=257),
         proc=dict(size={"shortest_edge": 64, "longest_edge": 960}, patch_size=4, merge_size=2,
                   temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3),
         quant=["vision_tower.blocks.1.attn.proj"],
         prompt="Hi <|vision_start|><|image_pad|><|vision_end|>Say it"),
    dict(name="gemma3_vision", lm="gemma3_vlm_q4_g64_bf16", seed=33,
         vision=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=2, patch_size=4, image_size=32, layer_norm_eps=1e-6,
                     hidden_act="gelu_pytorch_tanh"),
         top=dict(image_token_index=258, boi_token_index=256, eoi_token_index=257, mm_tokens_per_image=16),
         proc=dict(size={"height": 32, "width": 32}, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                   do_pan_and_scan=None),
         text=dict(sliding_window=64),
         quant=["vision_tower.vision_model.encoder.layers.1.mlp.fc1"],
         prompt="Look<start_of_image>ok"),
    dict(name="mistral3_vision", lm="mistral3_vlm_q4_g64_bf16", seed=34,
         vision=dict(model_type="pixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=2, head_dim=16, patch_size=4, image_size=64, rope_theta=10000.0,
                     hidden_act="silu", num_channels=3),
         top=dict(image_token_index=256, spatial_merge_size=2, vision_feature_layer=-1,
                  multimodal_projector_bias=True, projector_hidden_act="gelu"),
         proc=dict(size={"longest_edge": 40}, patch_size={"height": 4, "width": 4}, resample=3,
                   image_mean=vision_ref.CLIP_MEAN, image_std=vision_ref.CLIP_STD),
         quant=["vision_tower.vision_model.transformer.layers.0.feed_forward.gate_proj",
                "multi_modal_projector.linear_2"],
         prompt="[IMG]Tell"),
    dict(name="smolvlm_vision", lm=SMOLVLM_LM, seed=91,
         vision=dict(model_type="smolvlm_vision", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=2, patch_size=8, image_size=32, layer_norm_eps=1e-6,
                     hidden_act="gelu_pytorch_tanh", num_channels=3),
         top=dict(scale_factor=2, image_token_id=257),
         proc={"image_processor_type": "SmolVLMImageProcessor", "size": {"longest_edge": 96},
               "max_image_size": {"longest_edge": 32}, "do_image_splitting": True, "resample": 1,
               "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True, "do_rescale": True,
               "rescale_factor": 0.00392156862745098, "do_normalize": True, "do_pad": True},
         processor={"image_seq_len": 4, "processor_class": "SmolVLMProcessor"},
         quant=["vision_model.encoder.layers.1.mlp.fc1", "connector.modality_projection.proj"],
         prompt="User:<image>Describe<end_of_utterance>\nAssistant:"),
]


# ----------------------------------------------------------------- the vision towers' state dicts

def vision_spec(fx):
    """[(MLX name, shape, kind)] of the tower and projector; kind: lin, vec, bias, conv, emb, raw"""
    v, mt = fx["vision"], tower_type(fx)
    T = fx.get("text_hidden", 64)  # the language model's hidden size
    if mt == "qwen2_vl":  # embed_dim: the ViT's width; hidden_size: the merger's output (the LM's)
        H, I = v["embed_dim"], int(v["embed_dim"] * v["mlp_ratio"])
        assert v["hidden_size"] == T, (v["hidden_size"], T)
    else:
        H, I = v["hidden_size"], v["intermediate_size"]
    out = []

    def lin(name, rows, cols, bias=True):
        out.append((name + ".weight", (rows, cols), "lin"))
        if bias:
            out.append((name + ".bias", (rows,), "bias"))

    def vec(name, n, kind="vec"):
        out.append((name, (n,), kind))

    def siglip(e):
        """SigLIP's embeddings, encoder and post-LayerNorm under root e (Gemma 3, SmolVLM)"""
        p = v["patch_size"]
        out.append((e + "embeddings.patch_embedding.weight", (H, p, p, 3), "conv"))
        vec(e + "embeddings.patch_embedding.bias", H, "bias")
        out.append((e + "embeddings.position_embedding.weight", ((v["image_size"] // p) ** 2, H), "emb"))
        for i in range(v["num_hidden_layers"]):
            b = e + "encoder.layers.%d." % i
            for nm in ("layer_norm1", "layer_norm2"):
                vec(b + nm + ".weight", H)
                vec(b + nm + ".bias", H, "bias")
            for nm in ("q_proj", "k_proj", "v_proj", "out_proj"):
                lin(b + "self_attn." + nm, H, H)
            lin(b + "mlp.fc1", I, H)
            lin(b + "mlp.fc2", H, I)
        vec(e + "post_layernorm.weight", H)
        vec(e + "post_layernorm.bias", H, "bias")
    if mt == "qwen2_vl":  # Qwen2VisionTransformerPretrainedModel, as mlx-vlm names it
        p, t = v["patch_size"], v["temporal_patch_size"]
        out.append(("vision_tower.patch_embed.proj.weight", (H, t, p, p, 3), "conv"))
        for i in range(v["depth"]):
            b = "vision_tower.blocks.%d." % i
            for nm in ("norm1", "norm2"):
                vec(b + nm + ".weight", H)
                vec(b + nm + ".bias", H, "bias")
            lin(b + "attn.qkv", 3 * H, H)
            lin(b + "attn.proj", H, H)
            lin(b + "mlp.fc1", I, H)
            lin(b + "mlp.fc2", H, I)
        M = 4 * H
        vec("vision_tower.merger.ln_q.weight", H)
        vec("vision_tower.merger.ln_q.bias", H, "bias")
        lin("vision_tower.merger.mlp.0", M, M)
        lin("vision_tower.merger.mlp.2", T, M)
    elif mt in ("qwen2_5_vl", "qwen3_vl"):
        p, t = v["patch_size"], v["temporal_patch_size"]
        out.append(("vision_tower.patch_embed.proj.weight", (H, t, p, p, 3), "conv"))
        if mt == "qwen3_vl":
            vec("vision_tower.patch_embed.proj.bias", H, "bias")
            out.append(("vision_tower.pos_embed.weight", (v["num_position_embeddings"], H), "emb"))
        for i in range(v["depth"]):
            b = "vision_tower.blocks.%d." % i
            for nm in ("norm1", "norm2"):
                vec(b + nm + ".weight", H)
                if mt == "qwen3_vl":
                    vec(b + nm + ".bias", H, "bias")
            lin(b + "attn.qkv", 3 * H, H)
            lin(b + "attn.proj", H, H)
            if mt == "qwen2_5_vl":
                lin(b + "mlp.gate_proj", I, H)
                lin(b + "mlp.up_proj", I, H)
                lin(b + "mlp.down_proj", H, I)
            else:
                lin(b + "mlp.linear_fc1", I, H)
                lin(b + "mlp.linear_fc2", H, I)
        M = 4 * H
        mergers = [("vision_tower.merger.", H)]
        for k in range(len(v.get("deepstack_visual_indexes", []))):
            mergers.append(("vision_tower.deepstack_merger_list.%d." % k, M))
        for pre, nd in mergers:
            if mt == "qwen2_5_vl":
                vec(pre + "ln_q.weight", nd)
                lin(pre + "mlp.0", M, M)
                lin(pre + "mlp.2", T, M)
            else:
                vec(pre + "norm.weight", nd)
                vec(pre + "norm.bias", nd, "bias")
                lin(pre + "linear_fc1", M, M)
                lin(pre + "linear_fc2", T, M)
    elif mt == "gemma3":
        siglip("vision_tower.vision_model.")
        vec("multi_modal_projector.mm_soft_emb_norm.weight", H, "gemma_norm")
        out.append(("multi_modal_projector.mm_input_projection_weight", (H, T), "raw"))
    elif mt == "smolvlm":
        siglip("vision_model.")
        sf = fx["top"]["scale_factor"]
        lin("connector.modality_projection.proj", T, H * sf * sf, bias=False)
    else:
        p = v["patch_size"]
        e = "vision_tower.vision_model."
        out.append((e + "patch_conv.weight", (H, p, p, 3), "conv"))
        vec(e + "ln_pre.weight", H)
        for i in range(v["num_hidden_layers"]):
            b = e + "transformer.layers.%d." % i
            vec(b + "attention_norm.weight", H)
            vec(b + "ffn_norm.weight", H)
            for nm in ("q_proj", "k_proj", "v_proj", "o_proj"):
                lin(b + "attention." + nm, H, H, bias=False)
            lin(b + "feed_forward.gate_proj", I, H, bias=False)
            lin(b + "feed_forward.up_proj", I, H, bias=False)
            lin(b + "feed_forward.down_proj", H, I, bias=False)
        vec("multi_modal_projector.norm.weight", H)
        lin("multi_modal_projector.patch_merger.merging_layer", H, 4 * H, bias=False)
        lin("multi_modal_projector.linear_1", T, H, bias=fx["top"]["multimodal_projector_bias"])
        lin("multi_modal_projector.linear_2", T, T, bias=fx["top"]["multimodal_projector_bias"])
    return out


def fx_type(fx):
    return {"qwen2_5_vl_vision": "qwen2_5_vl", "qwen2_vl_vision": "qwen2_vl", "qwen3_vl_vision": "qwen3_vl",
            "qwen3_vl_moe_vision": "qwen3_vl_moe", "qwen3_5_vision": "qwen3_5", "gemma3_vision": "gemma3",
            "mistral3_vision": "mistral3", "smolvlm_vision": "smolvlm"}[fx["name"]]


def tower_type(fx):
    """the family whose vision tower the fixture's is (qwen3_vl_moe: qwen3_vl's)"""
    return TOWER.get(fx_type(fx), fx_type(fx))


def vision_weights(fx, rng, dtype, tensors):
    """random tower weights into tensors (MLX layout); returns name -> float64 weight as the model sees it"""
    W = {}
    for name, shape, kind in vision_spec(fx):
        if kind == "vec":
            w = 1.0 + 0.2 * rng.standard_normal(shape)
        elif kind == "gemma_norm":
            w = 0.2 * rng.standard_normal(shape)
        elif kind == "bias":
            w = 0.2 * rng.standard_normal(shape)
        elif kind == "emb":
            w = 0.5 * rng.standard_normal(shape)
        elif kind == "conv":
            w = rng.standard_normal(shape) / math.sqrt(np.prod(shape[1:]))
        else:
            w = 1.2 * rng.standard_normal(shape) / math.sqrt(shape[-1] if kind == "lin" else shape[0])
        w = w.astype(np.float32)
        if kind == "lin":
            module = name[: -len(".weight")]
            W[name] = mlxq.add_linear(tensors, module, w, dtype, Q32 if module in fx["quant"] else None)
        else:
            wr = mlxq.round_to_dtype(w, dtype)
            dt, raw = mlxq.encode_dtype(wr, dtype)
            tensors[name] = (dt, wr.shape, raw)
            W[name] = wr
        W[name] = np.asarray(W[name], dtype=np.float64)
    return W


# ----------------------------------------------------------------- numpy forward of the towers

def rms(x, w, eps, off=0.0):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (w + off)


def ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def gelu(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def quick_gelu(x):
    """transformers' QuickGELUActivation (ACT2FN["quick_gelu"]): x * sigmoid(1.702 x)"""
    return x / (1 + np.exp(-1.702 * x))


def rot_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def attend(q, k, v, cu, scale):
    """q, k, v [n, heads, hd]; attention without a mask within segments cu (boundaries)"""
    out = np.zeros_like(q)
    for a, b in zip(cu[:-1], cu[1:]):
        if b <= a:
            continue
        s = np.einsum("thd,shd->hts", q[a:b], k[a:b]) * scale
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        out[a:b] = np.einsum("hts,shd->thd", s, v[a:b])
    return out


def lin(W, name, x, bias=True):
    y = x @ W[name + ".weight"].T
    if bias and name + ".bias" in W:
        y = y + W[name + ".bias"]
    return y


def conv_flat(W, name):
    """MLX conv weight [out, (t,) y, x, c] -> [out, c*(t)*y*x], the row order of HF's pixel patches"""
    w = W[name]
    if w.ndim == 5:
        return w.transpose(0, 4, 1, 2, 3).reshape(w.shape[0], -1)
    return w.transpose(0, 3, 1, 2).reshape(w.shape[0], -1)


def qwen_tower(fx, W, pv, grid):
    """transformers' Qwen2VisionTransformerPretrainedModel / Qwen2_5_VisionTransformerPretrainedModel /
    Qwen3VLVisionModel (Qwen3VLMoeVisionModel: the same) on one image"""
    v, mt = fx["vision"], tower_type(fx)
    H, nh = v["embed_dim" if mt == "qwen2_vl" else "hidden_size"], v["num_heads"]
    hd = H // nh
    ms = v["spatial_merge_size"]
    t, gh, gw = grid
    x = pv @ conv_flat(W, "vision_tower.patch_embed.proj.weight").T
    if mt == "qwen3_vl":
        x = x + W["vision_tower.patch_embed.proj.bias"]
        # fast_pos_embed_interpolate
        S = int(round(math.sqrt(v["num_position_embeddings"])))
        pe = W["vision_tower.pos_embed.weight"]
        hi = np.linspace(0, S - 1, gh)
        wi = np.linspace(0, S - 1, gw)
        hf, wf = hi.astype(int), wi.astype(int)
        hc, wc = np.minimum(hf + 1, S - 1), np.minimum(wf + 1, S - 1)
        dh, dw = hi - hf, wi - wf
        grid_pe = ((1 - dh)[:, None, None] * (1 - dw)[None, :, None] * pe[(hf[:, None] * S + wf[None, :])] +
                   (1 - dh)[:, None, None] * dw[None, :, None] * pe[(hf[:, None] * S + wc[None, :])] +
                   dh[:, None, None] * (1 - dw)[None, :, None] * pe[(hc[:, None] * S + wf[None, :])] +
                   dh[:, None, None] * dw[None, :, None] * pe[(hc[:, None] * S + wc[None, :])])
        grid_pe = grid_pe.reshape(gh // ms, ms, gw // ms, ms, H).transpose(0, 2, 1, 3, 4).reshape(-1, H)
        x = x + grid_pe
    # rot_pos_emb
    hpos = np.repeat(np.arange(gh)[:, None], gw, 1).reshape(gh // ms, ms, gw // ms, ms).transpose(0, 2, 1, 3).ravel()
    wpos = np.repeat(np.arange(gw)[None, :], gh, 0).reshape(gh // ms, ms, gw // ms, ms).transpose(0, 2, 1, 3).ravel()
    dim = hd // 2
    inv = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    emb = np.concatenate([hpos[:, None] * inv[None], wpos[:, None] * inv[None]], 1)
    emb = np.concatenate([emb, emb], 1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    n = gh * gw
    mu = ms * ms
    cu = [0, n]
    win_cu, window_index = cu, np.arange(n // mu)
    if mt == "qwen2_5_vl":  # get_window_index
        vws = v["window_size"] // ms // v["patch_size"]
        lh, lw = gh // ms, gw // ms
        index = np.arange(lh * lw).reshape(lh, lw)
        pad_h, pad_w = vws - lh % vws, vws - lw % vws
        nwh, nww = (lh + pad_h) // vws, (lw + pad_w) // vws
        ip = np.pad(index, ((0, pad_h), (0, pad_w)), constant_values=-100)
        ip = ip.reshape(nwh, vws, nww, vws).transpose(0, 2, 1, 3).reshape(nwh * nww, vws, vws)
        seqlens = (ip != -100).sum((1, 2))
        flat = ip.ravel()
        window_index = flat[flat != -100]
        win_cu = [0] + list(np.cumsum(seqlens) * mu)
        win_cu = [c for i, c in enumerate(win_cu) if i == 0 or c != win_cu[i - 1]]
        x = x.reshape(n // mu, mu, -1)[window_index].reshape(n, -1)
        cos = cos.reshape(n // mu, mu, 1, -1)[window_index].reshape(n, 1, -1)
        sin = sin.reshape(n // mu, mu, 1, -1)[window_index].reshape(n, 1, -1)
    deep = []
    for i in range(v["depth"]):
        b = "vision_tower.blocks.%d." % i
        if mt == "qwen2_5_vl":
            h = rms(x, W[b + "norm1.weight"], 1e-6)
        else:
            h = ln(x, W[b + "norm1.weight"], W[b + "norm1.bias"], 1e-6)
        qkv = lin(W, b + "attn.qkv", h).reshape(n, 3, nh, hd)
        q, k, vv = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        q = q * cos + rot_half(q) * sin
        k = k * cos + rot_half(k) * sin
        full = mt != "qwen2_5_vl" or i in v["fullatt_block_indexes"]
        o = attend(q, k, vv, cu if full else win_cu, hd ** -0.5).reshape(n, H)
        x = x + lin(W, b + "attn.proj", o)
        if mt == "qwen2_5_vl":
            h = rms(x, W[b + "norm2.weight"], 1e-6)
            x = x + lin(W, b + "mlp.down_proj", silu(lin(W, b + "mlp.gate_proj", h)) * lin(W, b + "mlp.up_proj", h))
        elif mt == "qwen2_vl":  # VisionMlp: fc2(act(fc1(x))), act = ACT2FN[hidden_act]
            assert v["hidden_act"] == "quick_gelu", v["hidden_act"]
            h = ln(x, W[b + "norm2.weight"], W[b + "norm2.bias"], 1e-6)
            x = x + lin(W, b + "mlp.fc2", quick_gelu(lin(W, b + "mlp.fc1", h)))
        else:
            h = ln(x, W[b + "norm2.weight"], W[b + "norm2.bias"], 1e-6)
            x = x + lin(W, b + "mlp.linear_fc2", gelu_tanh(lin(W, b + "mlp.linear_fc1", h)))
        if mt == "qwen3_vl" and i in v["deepstack_visual_indexes"]:
            pre = "vision_tower.deepstack_merger_list.%d." % v["deepstack_visual_indexes"].index(i)
            y = ln(x.reshape(-1, mu * H), W[pre + "norm.weight"], W[pre + "norm.bias"], 1e-6)
            deep.append(lin(W, pre + "linear_fc2", gelu(lin(W, pre + "linear_fc1", y))))
    if mt == "qwen2_5_vl":
        y = rms(x, W["vision_tower.merger.ln_q.weight"], 1e-6).reshape(-1, mu * H)
        y = lin(W, "vision_tower.merger.mlp.2", gelu(lin(W, "vision_tower.merger.mlp.0", y)))
        y = y[np.argsort(window_index)]
    elif mt == "qwen2_vl":  # PatchMerger: LayerNorm ln_q per patch, the merge unit's patches concatenated, MLP
        y = ln(x, W["vision_tower.merger.ln_q.weight"], W["vision_tower.merger.ln_q.bias"], 1e-6).reshape(-1, mu * H)
        y = lin(W, "vision_tower.merger.mlp.2", gelu(lin(W, "vision_tower.merger.mlp.0", y)))
    else:
        y = ln(x, W["vision_tower.merger.norm.weight"], W["vision_tower.merger.norm.bias"], 1e-6).reshape(-1, mu * H)
        y = lin(W, "vision_tower.merger.linear_fc2", gelu(lin(W, "vision_tower.merger.linear_fc1", y)))
    return y, deep


def siglip_tower(fx, W, px):
    """transformers' SiglipVisionModel + Gemma3MultiModalProjector; px [3, S, S]"""
    v = fx["vision"]
    H, nh, p = v["hidden_size"], v["num_attention_heads"], v["patch_size"]
    hd = H // nh
    side = v["image_size"] // p
    e = "vision_tower.vision_model."
    patches = px.reshape(3, side, p, side, p).transpose(1, 3, 0, 2, 4).reshape(side * side, -1)
    x = patches @ conv_flat(W, e + "embeddings.patch_embedding.weight").T + W[e + "embeddings.patch_embedding.bias"]
    x = x + W[e + "embeddings.position_embedding.weight"]
    n = side * side
    for i in range(v["num_hidden_layers"]):
        b = e + "encoder.layers.%d." % i
        h = ln(x, W[b + "layer_norm1.weight"], W[b + "layer_norm1.bias"], v["layer_norm_eps"])
        q = lin(W, b + "self_attn.q_proj", h).reshape(n, nh, hd)
        k = lin(W, b + "self_attn.k_proj", h).reshape(n, nh, hd)
        vv = lin(W, b + "self_attn.v_proj", h).reshape(n, nh, hd)
        x = x + lin(W, b + "self_attn.out_proj", attend(q, k, vv, [0, n], hd ** -0.5).reshape(n, H))
        h = ln(x, W[b + "layer_norm2.weight"], W[b + "layer_norm2.bias"], v["layer_norm_eps"])
        x = x + lin(W, b + "mlp.fc2", gelu_tanh(lin(W, b + "mlp.fc1", h)))
    x = ln(x, W[e + "post_layernorm.weight"], W[e + "post_layernorm.bias"], v["layer_norm_eps"])
    tps = int(round(math.sqrt(fx["top"]["mm_tokens_per_image"])))
    k = side // tps
    pooled = x.reshape(tps, k, tps, k, H).mean((1, 3)).reshape(tps * tps, H)
    normed = rms(pooled, W["multi_modal_projector.mm_soft_emb_norm.weight"], v["layer_norm_eps"], 1.0)
    return normed @ W["multi_modal_projector.mm_input_projection_weight"], []


def pixtral_tower(fx, W, px):
    """transformers' PixtralVisionModel + Mistral3MultiModalProjector; px [3, h, w]"""
    v, top = fx["vision"], fx["top"]
    H, nh, p = v["hidden_size"], v["num_attention_heads"], v["patch_size"]
    hd = v["head_dim"]
    gh, gw = px.shape[1] // p, px.shape[2] // p
    e = "vision_tower.vision_model."
    patches = px.reshape(3, gh, p, gw, p).transpose(1, 3, 0, 2, 4).reshape(gh * gw, -1)
    x = patches @ conv_flat(W, e + "patch_conv.weight").T
    x = rms(x, W[e + "ln_pre.weight"], 1e-5)
    # PixtralRotaryEmbedding
    freqs = 1.0 / (v["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    hh, ww = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    ang = np.concatenate([hh.reshape(-1, 1) * freqs[None, ::2], ww.reshape(-1, 1) * freqs[None, 1::2]], 1)
    ang = np.concatenate([ang, ang], 1)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    n = gh * gw
    layers = v["num_hidden_layers"] + 1 + top["vision_feature_layer"] if top["vision_feature_layer"] < 0 else top["vision_feature_layer"]
    for i in range(layers):
        b = e + "transformer.layers.%d." % i
        h = rms(x, W[b + "attention_norm.weight"], 1e-5)
        q = lin(W, b + "attention.q_proj", h).reshape(n, nh, hd)
        k = lin(W, b + "attention.k_proj", h).reshape(n, nh, hd)
        vv = lin(W, b + "attention.v_proj", h).reshape(n, nh, hd)
        q = q * cos + rot_half(q) * sin
        k = k * cos + rot_half(k) * sin
        x = x + lin(W, b + "attention.o_proj", attend(q, k, vv, [0, n], hd ** -0.5).reshape(n, H))
        h = rms(x, W[b + "ffn_norm.weight"], 1e-5)
        x = x + lin(W, b + "feed_forward.down_proj",
                    silu(lin(W, b + "feed_forward.gate_proj", h)) * lin(W, b + "feed_forward.up_proj", h))
    x = rms(x, W["multi_modal_projector.norm.weight"], fx["text_eps"])
    # Mistral3PatchMerger: unfold 2x2 (channel-major features), merging_layer
    g = x.reshape(gh // 2, 2, gw // 2, 2, H).transpose(0, 2, 4, 1, 3).reshape(-1, H * 4)
    y = lin(W, "multi_modal_projector.patch_merger.merging_layer", g, bias=False)
    y = lin(W, "multi_modal_projector.linear_2", gelu(lin(W, "multi_modal_projector.linear_1", y)))
    return y, []



def torch_arange_f32(start, end, step):
    """torch.arange(start, end, step) in float32 as its CPU kernel's scalar path computes it: the length
    ceil((end - start) / step) and each value start + i * step in double, rounded to float32 (the vectorized
    path rounds a block's base first: it can differ by an ulp for long ranges)"""
    n = max(int(math.ceil((end - start) / step)), 0)
    return np.array([start + step * i for i in range(n)], dtype=np.float64).astype(np.float32)


def idefics3_position_ids(nb_h, nb_w, n_side):
    """Idefics3VisionEmbeddings / SmolVLMVisionEmbeddings: the position ids of a frame whose unpadded part has
    nb_h x nb_w patches, its fractional coordinates bucketized (right=True) into the n_side x n_side grid of the
    position embedding: boundaries = arange(1/n, 1, 1/n), coords = arange(0, 1 - 1e-6, 1/nb) (1/nb a float32
    tensor), all float32. A full frame (nb = n_side) gives 0 .. n_side^2 - 1 for n_side 26, 27, 32 (the released
    models), but not for every n_side (float32 rounding: e.g. 25, 29, 31 repeat ids)."""
    boundaries = torch_arange_f32(1 / n_side, 1.0, 1 / n_side)

    def coords(nb):
        step = float(np.float32(1.0) / np.float32(nb))
        return np.searchsorted(boundaries, torch_arange_f32(0.0, 1 - 1e-6, step), side="right")
    bh, bw = coords(nb_h), coords(nb_w)
    assert len(bh) == nb_h and len(bw) == nb_w, (nb_h, nb_w, len(bh), len(bw))
    return (bh[:, None] * n_side + bw[None, :]).ravel()


def pixel_shuffle(x, s):
    """SmolVLMConnector.pixel_shuffle / Idefics3Connector.pixel_shuffle of one frame's [seq, D] states, the
    same view / permute / reshape steps: token (i, j) of the (side/s)^2 grid gets the s x s block's states
    concatenated row by row, [(r * s + c) * D + d]"""
    seq, D = x.shape
    h = w = int(seq ** 0.5)
    x = x.reshape(h, w, D).reshape(h, w // s, D * s)
    x = x.transpose(1, 0, 2).reshape(w // s, h // s, D * s * s)
    return x.transpose(1, 0, 2).reshape(seq // (s * s), D * s * s)


def idefics3_tower(fx, W, frames):
    """transformers' SmolVLMVisionTransformer (Idefics3VisionTransformer) + SmolVLMConnector on the processor's
    frames [F, 3, S, S] (tiles, then the global image): each frame its own sequence (no padding: every patch
    attended, positions from the bucketing), post_layernorm, pixel shuffle, projection; [F * S^2/(p s)^2, T]"""
    v = fx["vision"]
    H, nh, p = v["hidden_size"], v["num_attention_heads"], v["patch_size"]
    hd = H // nh
    eps = v["layer_norm_eps"]
    n_side = v["image_size"] // p
    sf = fx["top"]["scale_factor"]
    e = "vision_model."
    conv = conv_flat(W, e + "embeddings.patch_embedding.weight")
    out = []
    for px in frames:
        gh, gw = px.shape[1] // p, px.shape[2] // p
        n = gh * gw
        patches = px.reshape(3, gh, p, gw, p).transpose(1, 3, 0, 2, 4).reshape(n, -1)
        x = patches @ conv.T + W[e + "embeddings.patch_embedding.bias"]
        x = x + W[e + "embeddings.position_embedding.weight"][idefics3_position_ids(gh, gw, n_side)]
        for i in range(v["num_hidden_layers"]):
            b = e + "encoder.layers.%d." % i
            h = ln(x, W[b + "layer_norm1.weight"], W[b + "layer_norm1.bias"], eps)
            q = lin(W, b + "self_attn.q_proj", h).reshape(n, nh, hd)
            k = lin(W, b + "self_attn.k_proj", h).reshape(n, nh, hd)
            vv = lin(W, b + "self_attn.v_proj", h).reshape(n, nh, hd)
            x = x + lin(W, b + "self_attn.out_proj", attend(q, k, vv, [0, n], hd ** -0.5).reshape(n, H))
            h = ln(x, W[b + "layer_norm2.weight"], W[b + "layer_norm2.bias"], eps)
            x = x + lin(W, b + "mlp.fc2", gelu_tanh(lin(W, b + "mlp.fc1", h)))
        x = ln(x, W[e + "post_layernorm.weight"], W[e + "post_layernorm.bias"], eps)
        out.append(lin(W, "connector.modality_projection.proj", pixel_shuffle(x, sf), bias=False))
    return np.concatenate(out, 0), []


# ----------------------------------------------------------------- prompts

def tokenizer_json(fx):
    """byte-level BPE without merges: every byte a token, the family's special tokens added"""
    b2u = {}
    n = 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            b2u[b] = chr(b)
        else:
            b2u[b] = chr(256 + n)
            n += 1
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for s, i in SPECIAL[fx_type(fx)].items()]
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
                      "vocab": {b2u[b]: b for b in range(256)}, "merges": []}}


def tokenize(fx, text):
    """ids of text with this tokenizer: special tokens whole, every other byte its own token"""
    sp = SPECIAL[fx_type(fx)]
    out = []
    i = 0
    while i < len(text):
        for s, tid in sp.items():
            if text.startswith(s, i):
                out.append(tid)
                i += len(s)
                break
        else:
            out.extend(text[i].encode())
            i += 1
    return out


def expand(fx, prompt, rows, cols):
    """the processor's expansion of the image marker (transformers' *Processor.__call__)"""
    mt = fx_type(fx)
    if mt in QWEN:
        return prompt.replace("<|image_pad|>", "<|image_pad|>" * (rows * cols))
    if mt == "gemma3":
        return prompt.replace("<start_of_image>", "\n\n<start_of_image>" + "<image_soft_token>" * (rows * cols) +
                              "<end_of_image>\n\n")
    if mt == "smolvlm":  # rows, cols: the split (0, 0: one frame); processing_smolvlm's get_image_prompt_string
        n = fx["processor"]["image_seq_len"]
        fake, img, glob = "<fake_token_around_image>", "<image>", "<global-img>"
        s = ""
        if rows or cols:
            assert rows <= 3 and cols <= 3, "the tokenizer has <row_r_col_c> for r, c <= 3"
            for r in range(rows):
                for c in range(cols):
                    s += fake + "<row_%d_col_%d>" % (r + 1, c + 1) + img * n
                s += "\n"
            s += "\n"
        s += fake + glob + img * n + fake
        parts = prompt.split(img)
        assert len(parts) == 2, "one image"
        return parts[0] + s + parts[1]
    rows_txt = ["[IMG]" * cols + "[IMG_BREAK]"] * rows
    s = "".join(rows_txt)
    s = s[: -len("[IMG_BREAK]")] + "[IMG_END]"
    return prompt.replace("[IMG]", s, 1)


def get_rope_index(ids, image_token, rows, cols):
    """transformers' Qwen2_5_VLModel.get_rope_index for one image (grid t = 1)"""
    T = len(ids)
    st = ids.index(image_token)
    pos = np.zeros((3, T), dtype=np.int64)
    pos[:, :st] = np.arange(st)
    h = np.repeat(np.arange(rows), cols)
    w = np.tile(np.arange(cols), rows)
    n = rows * cols
    pos[0, st:st + n] = st
    pos[1, st:st + n] = st + h
    pos[2, st:st + n] = st + w
    nxt = st + max(rows, cols)
    rest = T - (st + n)
    pos[:, st + n:] = nxt + np.arange(rest)
    return pos, nxt + rest - T


# ----------------------------------------------------------------- one fixture

def lm_fixture(fx):
    if isinstance(fx["lm"], dict):  # a text model of this file's own (SMOLVLM_LM)
        g = dict(fx["lm"])
        g["cfg"] = dict(g["cfg"], **fx.get("text", {}))
        return g
    for f in make_golden.FIXTURES:
        if f["name"] == fx["lm"]:
            g = dict(f)
            g["cfg"] = dict(f["cfg"], **fx.get("text", {}))
            if "vlm_type" in fx:  # the same text model in another packaging (qwen2_vl): this copy's, not make_golden's
                g["vlm"] = dict(f["vlm"], model_type=fx["vlm_type"])
            return g
    raise KeyError(fx["lm"])


def packaging_config(g, c):
    """config.json of the text model as make_golden.smelt_config writes it; a packaging make_golden has no stand-in
    vision config for (qwen2_vl, flat) laid out the same way by hand (build() puts the fixture's vision_config)"""
    v = g["vlm"]
    if v["model_type"] in make_golden.VISION_CONFIG:
        return make_golden.smelt_config(g, c)
    assert v["layout"] == "flat", v
    out = dict(c)
    out["model_type"] = v["model_type"]
    out["vision_config"] = None
    out["torch_dtype"] = g["dtype"]
    return out


def build(fx, seed):
    g = lm_fixture(fx)
    c = make_golden.text_config_dict(g)
    rng = np.random.default_rng(seed)
    spec = make_golden.state_spec(g["model_type"], c)
    raw = make_golden.random_weights(spec, c, rng, g.get("embed_init", 1.0), g.get("layer_init", 1.0),
                                     g.get("head_gain", 1.0))
    tensors, used = make_golden.build_tensors(g, c, spec, raw, rng)
    for name, _ in make_golden.VISION_TENSORS.get(g["vlm"]["model_type"], []):  # the text fixtures' stand-ins
        tensors.pop(name, None)
    Wv = vision_weights(fx, rng, g["dtype"], tensors)
    if fx_type(fx) == "smolvlm":
        return build_smolvlm(fx, g, c, tensors, used, Wv)
    if "config_type" in g:
        return build_moe(fx, g, c, tensors, used, Wv)
    if g["model_type"] in check_golden.HYBRID:
        return build_hybrid(fx, g, c, tensors, used, Wv)
    cfg = packaging_config(g, c)
    cfg["vision_config"] = dict(fx["vision"])
    cfg.update(fx["top"])
    if g["quant"] is not None:
        qb = dict(g["quant"])
        for m in fx["quant"]:
            qb[m] = dict(Q32)
        cfg["quantization"] = qb
        cfg["quantization_config"] = qb
    W = {make_golden.mlx_name(g, k): v.astype(np.float64) for k, v in used.items()
         if k != "lm_head.weight" or not c.get("tie_word_embeddings", False)}
    W.update(Wv)
    return g, c, cfg, tensors, W


def smolvlm_name(name):
    """mlx-vlm's Idefics3 / SmolVLM names: the text model's tensors directly under language_model. (its
    sanitize drops transformers' "model." level: language_model.layers..., language_model.lm_head)"""
    if name.startswith("language_model.model."):
        return "language_model." + name[len("language_model.model."):]
    return name


def build_smolvlm(fx, g, c, tensors, used, Wv):
    """config.json (model_type smolvlm, text_config llama, vision_config) and the tensors under mlx-vlm's names;
    W keeps check_golden's names (language_model.model.*) for the text forward. The quantization block (and its
    overrides) name the modules as the tensors do; the written file is read back and dequantized as
    check_golden reads a fixture, and must give W."""
    cfg = {"model_type": "smolvlm", "text_config": dict(c), "vision_config": dict(fx["vision"]),
           "tie_word_embeddings": False, "torch_dtype": g["dtype"]}
    cfg.update(fx["top"])
    tensors = {smolvlm_name(k): v for k, v in tensors.items()}
    if g["quant"] is not None:
        qb = {smolvlm_name(k): v for k, v in make_golden.quant_block(g).items()}
        for m in fx["quant"]:
            qb[m] = dict(Q32)
        for k in qb:
            if isinstance(qb[k], dict) and k + ".scales" not in tensors:
                raise RuntimeError("quantization entry %s names no quantized tensor" % k)
        cfg["quantization"] = qb
        cfg["quantization_config"] = qb
    W = {make_golden.mlx_name(g, k): v.astype(np.float64) for k, v in used.items()}
    W.update(Wv)
    back = check_golden.weights_from_st(cfg, make_golden.st_arrays(tensors))
    want = {smolvlm_name(k): v for k, v in W.items()}
    if set(back) != set(want):
        raise RuntimeError("written tensors %s, reference %s" % (sorted(set(back) - set(want))[:4],
                                                                 sorted(set(want) - set(back))[:4]))
    for k, v in want.items():
        if back[k].shape != v.shape or np.abs(back[k] - v).max() > 0:
            raise RuntimeError("%s read back differs from the reference weight" % k)
    return g, c, cfg, tensors, W


def build_moe(fx, g, c, tensors, used, Wv):
    """a text model written by make_golden as its twin family (g["model_type"], qwen3_moe) under the type config.json
    names (g["config_type"], qwen3_vl_moe_text): config.json as mlx-vlm reads Qwen3-VL-MoE (text_config,
    vision_config, the top-level tie flag the text config's), the quantization block with the routers' overrides
    under the tensors' names (language_model.model.layers.N.mlp.gate). The written tensors are checked against
    mlx-lm's MoE layout (make_golden.check_layout: router, experts stacked [E, rows, cols] under mlp.switch_mlp, no
    per-expert names), read back and dequantized as check_golden reads a fixture (W: the stacked experts 3-D, as
    check_golden's MoE forward takes them), and must give the reference's weights."""
    make_golden.check_layout(g, c, tensors)
    c = dict(c, model_type=g["config_type"])
    cfg = {"model_type": g["vlm"]["model_type"], "text_config": dict(c), "vision_config": dict(fx["vision"]),
           "tie_word_embeddings": c.get("tie_word_embeddings", False), "torch_dtype": g["dtype"]}
    cfg.update(fx["top"])
    if g["quant"] is not None:
        qb = make_golden.quant_block(g)
        for m in fx["quant"]:
            qb[m] = dict(Q32)
        for k in qb:
            if isinstance(qb[k], dict) and k + ".scales" not in tensors:
                raise RuntimeError("quantization entry %s names no quantized tensor" % k)
        cfg["quantization"] = qb
        cfg["quantization_config"] = qb
    W = check_golden.weights_from_st(cfg, make_golden.st_arrays(tensors))
    want = {make_golden.mlx_name(g, k): v for k, v in used.items()
            if k != "lm_head.weight" or not c.get("tie_word_embeddings", False)}
    want.update(Wv)
    names = set()
    for k, v in want.items():
        m = make_golden.EXPERT_RE.match(k[len("language_model."):]) if k.startswith("language_model.") else None
        if m:  # one expert's projection: its row of the stack
            name = "language_model." + m.group(1) + make_golden.MOE_MLX[g["model_type"]] + m.group(4) + "." + m.group(5)
            got = W[name][int(m.group(3))]
        else:
            name = k
            got = W[k]
        names.add(name)
        if got.shape != v.shape or np.abs(got - v).max() > 0:
            raise RuntimeError("%s read back differs from the reference weight" % k)
    if names != set(W):
        raise RuntimeError("written tensors %s, reference %s" % (sorted(set(W) - names)[:4],
                                                                 sorted(names - set(W))[:4]))
    return g, c, cfg, tensors, W


def build_hybrid(fx, g, c, tensors, used, Wv):
    """a hybrid text model (Qwen3.5: Gated DeltaNet + gated attention) as make_golden writes it (mlx-lm's / mlx-vlm's
    sanitized layout: language_model.model.*, the (1 + w) norms stored as 1 + w, conv1d [C, K, 1], A_log float32)
    next to the tower: config.json as make_golden.smelt_config packages it (model_type qwen3_5, text_config
    qwen3_5_text) with the fixture's vision_config and special tokens, the quantization block under the tensors'
    names. W: the written tensors read back and dequantized as check_golden reads a fixture (what its hybrid forward
    takes: norms 1 + w, conv [C, K, 1]), checked against the reference weights make_golden built (HF layout)"""
    cfg = packaging_config(g, c)
    cfg["vision_config"] = dict(fx["vision"])
    cfg.update(fx["top"])
    if g["quant"] is not None:
        qb = make_golden.quant_block(g)
        for m in fx["quant"]:
            qb[m] = dict(Q32)
        for k in qb:
            if isinstance(qb[k], dict) and k + ".scales" not in tensors:
                raise RuntimeError("quantization entry %s names no quantized tensor" % k)
        cfg["quantization"] = qb
        cfg["quantization_config"] = qb
    W = check_golden.weights_from_st(cfg, make_golden.st_arrays(tensors))
    want = {}
    for k, v in used.items():
        if k == "lm_head.weight" and c.get("tie_word_embeddings", False):
            continue
        v = np.asarray(v, dtype=np.float64)
        if make_golden.zero_centered(g["model_type"], k):
            v = v + 1.0
        elif v.ndim == 3:  # depthwise conv [C, 1, K] -> mlx [C, K, 1]
            v = v.transpose(0, 2, 1)
        want[make_golden.mlx_name(g, k)] = v
    want.update(Wv)
    if set(W) != set(want):
        raise RuntimeError("written tensors %s, reference %s" % (sorted(set(W) - set(want))[:4],
                                                                 sorted(set(want) - set(W))[:4]))
    for k, v in want.items():
        if W[k].shape != v.shape or np.abs(W[k] - v).max() > 0:
            raise RuntimeError("%s read back differs from the reference weight" % k)
    return g, c, cfg, tensors, W


def hybrid_hf_weight(g, k, w):
    """transformers' value of a W entry of a hybrid text model (mlx layout, as check_golden takes it): the (1 + w)
    norms back to w (Qwen3_5RMSNorm scales by 1 + weight), the depthwise conv [C, K, 1] back to nn.Conv1d's [C, 1, K]"""
    if not k.startswith("language_model."):
        return w
    hf = k[len("language_model."):]
    if make_golden.zero_centered(g["model_type"], hf):
        return w - 1.0
    if hf.endswith("conv1d.weight") and w.ndim == 3:
        return w.transpose(0, 2, 1)
    return w


def smolvlm_pixels(fx):
    """the SmolVLM image processor's frames [F, 3, S, S] (tools/vision_ref.py), rows, cols of the split"""
    img = Image.open(IMAGE).convert("RGB")
    p = fx["proc"]
    frames, rows, cols, _ = vision_ref.idefics3_frames(img, p["size"]["longest_edge"],
                                                       p["max_image_size"]["longest_edge"], p["do_image_splitting"],
                                                       p["image_mean"], p["image_std"], resample=p["resample"])
    return np.asarray(frames, dtype=np.float64), rows, cols


def pixels(fx):
    img = Image.open(IMAGE).convert("RGB")
    p, mt = fx["proc"], tower_type(fx)
    if mt in ("qwen2_5_vl", "qwen2_vl"):
        pv, (h, w) = vision_ref.qwen_pixels(img, p["patch_size"], p["merge_size"], p["temporal_patch_size"],
                                            p["min_pixels"], p["max_pixels"], p["image_mean"], p["image_std"])
    elif mt == "qwen3_vl":
        pv, (h, w) = vision_ref.qwen_pixels(img, p["patch_size"], p["merge_size"], p["temporal_patch_size"],
                                            p["size"]["shortest_edge"], p["size"]["longest_edge"], p["image_mean"],
                                            p["image_std"])
    elif mt == "gemma3":
        pv, (h, w) = vision_ref.fixed_pixels(img, p["size"]["height"], p["size"]["width"])
    else:
        pv, (h, w) = vision_ref.pixtral_pixels(img, p["size"]["longest_edge"],
                                               p["patch_size"]["height"] * fx["top"]["spatial_merge_size"])
    return np.asarray(pv, dtype=np.float64), h, w


def forward_config(cfg):
    """the config check_golden's forward runs: cfg, or a copy whose text model type is its TEXT_TWIN"""
    tc = cfg.get("text_config")
    if not isinstance(tc, dict) or tc.get("model_type") not in TEXT_TWIN:
        return cfg
    out = copy.deepcopy(cfg)
    out["text_config"]["model_type"] = TEXT_TWIN[tc["model_type"]]
    return out


def numpy_reference(fx, g, c, cfg, W):
    mt = fx_type(fx)
    cfg = forward_config(cfg)
    fx["text_eps"] = c["rms_norm_eps"]
    split = None
    if mt != "smolvlm":
        pv, h, w = pixels(fx)
    if mt == "smolvlm":  # frames (tiles, global image): split = [rows, cols] of the tiles
        frames, srows, scols = smolvlm_pixels(fx)
        split = [srows, scols]
        h, w = frames.shape[2], frames.shape[3]
        emb, deep = idefics3_tower(fx, W, frames)
        rows = cols = h // fx["vision"]["patch_size"] // fx["top"]["scale_factor"]  # each frame's token grid
        assert len(emb) == len(frames) * fx["processor"]["image_seq_len"], (len(emb), len(frames))
    elif mt in QWEN:
        p = fx["vision"]["patch_size"]
        emb, deep = qwen_tower(fx, W, pv, (1, h // p, w // p))
        rows, cols = h // p // 2, w // p // 2
    elif mt == "gemma3":
        emb, deep = siglip_tower(fx, W, pv)
        rows = cols = int(round(math.sqrt(fx["top"]["mm_tokens_per_image"])))
    else:
        emb, deep = pixtral_tower(fx, W, pv)
        rows, cols = h // fx["vision"]["patch_size"] // 2, w // fx["vision"]["patch_size"] // 2
    text = expand(fx, fx["prompt"], *(split or (rows, cols)))
    ids = tokenize(fx, text)
    img_tok = SPECIAL[mt][{"qwen2_5_vl": "<|image_pad|>", "qwen2_vl": "<|image_pad|>", "qwen3_vl": "<|image_pad|>",
                           "qwen3_vl_moe": "<|image_pad|>", "qwen3_5": "<|image_pad|>", "gemma3": "<image_soft_token>",
                           "mistral3": "[IMG]", "smolvlm": "<image>"}[mt]]
    img_rows = [i for i, t in enumerate(ids) if t == img_tok]
    assert len(img_rows) == len(emb), (len(img_rows), len(emb))
    kw = dict(embeds=(img_rows, emb))
    delta = 0
    if mt in QWEN:
        kw["rope_pos"], delta = get_rope_index(ids, img_tok, rows, cols)
    if deep:
        kw["deepstack"] = [(img_rows, d) for d in deep]
    if mt == "gemma3":
        kw["groups"] = [1 if t == img_tok else 0 for t in ids]
    check_golden.ROUTE_MARGINS.clear()  # the mixtures of experts' routing margins (none for the dense models)
    logits = check_golden.forward(cfg, W, ids, **kw)
    route_prompt = min(check_golden.ROUTE_MARGINS) if check_golden.ROUTE_MARGINS else None
    seq, margins = list(ids), []
    for _ in range(N_GEN):
        k2 = dict(kw)
        if "rope_pos" in kw:
            T = len(seq)
            rp = np.concatenate([kw["rope_pos"], np.repeat((np.arange(len(ids), T) + delta)[None], 3, 0)], 1)
            k2["rope_pos"] = rp
        if "groups" in kw:
            k2["groups"] = kw["groups"] + [0] * (len(seq) - len(ids))
        lg = check_golden.forward(cfg, W, seq, len(ids), **k2)[-1]
        top2 = np.sort(lg)[-2:]
        margins.append(float(top2[1] - top2[0]))
        seq.append(int(np.argmax(lg)))
    span = [img_rows[0], img_rows[-1] + 1 + (1 if mt == "mistral3" else 0)]
    out = dict(ids=ids, text=text, emb=emb, deep=deep, logits=logits, gen=seq[len(ids):], margins=margins,
               rows=rows, cols=cols, span=span, h=h, w=w)
    if route_prompt is not None:  # every step recomputes the whole sequence: the prompt's and the continuation's
        out.update(route_prompt=route_prompt, route=min(check_golden.ROUTE_MARGINS))
    if split is not None:
        out.update(split=split, n_frames=len(frames), frames=frames)
    return out


def write(fx, outdir, g, c, cfg, tensors, ref, reference):
    d = os.path.join(outdir, fx["name"])
    tmp = d + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    mlxq.write_safetensors(os.path.join(tmp, "model.safetensors"), tensors, {"format": "mlx"})
    json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"), indent=1)
    json.dump(fx["proc"], open(os.path.join(tmp, "preprocessor_config.json"), "w"), indent=1)
    if "processor" in fx:
        json.dump(fx["processor"], open(os.path.join(tmp, "processor_config.json"), "w"), indent=1)
    json.dump(tokenizer_json(fx), open(os.path.join(tmp, "tokenizer.json"), "w"), indent=1)
    json.dump({"bos_token": None, "eos_token": None}, open(os.path.join(tmp, "tokenizer_config.json"), "w"))
    shutil.copy(IMAGE, os.path.join(tmp, "image.jpg"))
    e = np.concatenate([ref["emb"]] + list(ref["deep"]), 0).astype("<f4")
    e.tofile(os.path.join(tmp, "embeddings.f32"))
    ref["logits"].astype("<f4").tofile(os.path.join(tmp, "logits.f32"))
    man = {"name": fx["name"], "model_type": cfg["model_type"],
           "text_model_type": fx.get("text_model_type", c["model_type"]), "dtype": g["dtype"],
           "prompt": fx["prompt"], "prompt_expanded": ref["text"], "prompt_ids": ref["ids"], "image": "image.jpg",
           "image_size": [ref["h"], ref["w"]], "embedding_rows": len(ref["emb"]), "embedding_grid": [ref["rows"], ref["cols"]],
           "deepstack": len(ref["deep"]), "hidden": c["hidden_size"], "span": ref["span"],
           "logits_shape": [len(ref["ids"]), c["vocab_size"]], "greedy_ids": ref["gen"],
           "greedy_top2_margins": ref["margins"], "reference": reference,
           "tolerances": {"f32": {"embeddings_max_abs": 2e-3, "max_abs": 2e-3, "rel_l2": 1e-4},
                          "reduced": {"embeddings_max_abs": 0.1, "max_abs": 0.25, "rel_l2": 3e-2},
                          "greedy_margin_min": 0.05}}
    if "route" in ref:  # mixtures of experts: the numpy reference's routing margins (seed choice: no near-tie)
        man.update(route_min_margin=ref["route"], route_min_margin_prompt=ref["route_prompt"])
    if "split" in ref:  # smolvlm: image_size is one frame's; embedding_grid one frame's token grid
        man.update(n_frames=ref["n_frames"], split=ref["split"], image_seq_len=fx["processor"]["image_seq_len"],
                   special_tokens=SPECIAL[fx_type(fx)])
        assert man["embedding_rows"] == ref["n_frames"] * fx["processor"]["image_seq_len"]
    json.dump(man, open(os.path.join(tmp, "manifest.json"), "w"), indent=1)
    size = sum(os.path.getsize(os.path.join(tmp, x)) for x in os.listdir(tmp))
    shutil.rmtree(d, ignore_errors=True)
    os.rename(tmp, d)
    return size


def smolvlm_hf_name(k):
    """transformers' SmolVLMForConditionalGeneration name of a W key"""
    if k == "language_model.lm_head.weight":
        return "lm_head.weight"
    if k.startswith("language_model.model."):
        return "model.text_model." + k[len("language_model.model."):]
    if k.startswith("vision_model.") or k.startswith("connector."):
        return "model." + k
    raise KeyError(k)


def smolvlm_transformers_inputs(fx, model, img, ref):
    """pixel values of transformers' SmolVLM image processor (Pillow) with the fixture's settings, checked
    against the numpy frames; the model's image features checked against the reference embeddings; the
    processor's prompt expansion (processing_smolvlm.get_image_prompt_string) against ours"""
    import torch
    p = fx["proc"]
    cls = vision_ref.slow_image_processor("SmolVLMImageProcessor")
    ip = cls(size=p["size"], max_image_size=p["max_image_size"], do_image_splitting=p["do_image_splitting"],
             resample=p["resample"], image_mean=p["image_mean"], image_std=p["image_std"],
             rescale_factor=p["rescale_factor"], do_pad=p["do_pad"])
    inp = ip(images=[img], return_tensors="pt", return_row_col_info=True)
    pv = inp["pixel_values"].float()
    rows = int(np.asarray(inp["rows"]).ravel()[0])
    cols = int(np.asarray(inp["cols"]).ravel()[0])
    if tuple(pv.shape) != (1,) + ref["frames"].shape or [rows, cols] != ref["split"]:
        raise RuntimeError("%s: pixel values %s, split %s; the reference %s, %s" % (
            cls.__name__, tuple(pv.shape), [rows, cols], ref["frames"].shape, ref["split"]))
    perr = float(np.abs(pv[0].double().numpy() - ref["frames"]).max())
    print("  %s vs numpy frames: max |diff| %.2e, split %d x %d" % (cls.__name__, perr, rows, cols))
    if perr > 1e-6:
        raise RuntimeError("the image processor and the reference frames differ (%.3g)" % perr)
    mask = inp["pixel_attention_mask"]
    with torch.no_grad():
        feats = model.model.get_image_features(pixel_values=pv, pixel_attention_mask=mask)
    if not isinstance(feats, torch.Tensor):  # an output object (pooler_output: after the connector) or a tuple
        feats = next((getattr(feats, a) for a in ("pooler_output", "image_embeds", "last_hidden_state")
                      if getattr(feats, a, None) is not None), None) if not isinstance(feats, (tuple, list)) \
            else feats[0]
    if feats is not None and feats.numel() == ref["emb"].size:
        ferr = float(np.abs(feats.reshape(ref["emb"].shape).double().numpy() - ref["emb"]).max())
        print("  transformers vs numpy: image features max |diff| %.2e" % ferr)
        if ferr > 2e-3:
            raise RuntimeError("transformers' image features and the numpy reference differ (%.3g)" % ferr)
    else:
        print("  NOTE: could not compare the image features (%s)" % (None if feats is None else tuple(feats.shape)))
    try:
        from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string
        s = get_image_prompt_string(rows, cols, fx["processor"]["image_seq_len"],
                                    fake_token_around_image="<fake_token_around_image>", image_token="<image>",
                                    global_image_token="<global-img>")
        a, b = fx["prompt"].split("<image>")
        print("  processing_smolvlm's expansion: %s" % ("the same" if a + s + b == ref["text"] else "DIFFERENT"))
        if a + s + b != ref["text"]:
            raise RuntimeError("the prompt expansion differs from processing_smolvlm's: %r" % (a + s + b))
    except ImportError as e:
        print("  NOTE: processing_smolvlm.get_image_prompt_string not importable (%s)" % e)
    return dict(pixel_values=pv, pixel_attention_mask=mask)


def moe_config(mt, tc, vc, kw):
    """AutoConfig.for_model for Qwen3-VL-MoE; a text config key a strict transformers config class refuses (the
    fixture's norm_topk_prob: Qwen3VLMoeTextConfig has no such field, its router always renormalizes) is dropped and
    reported, as make_golden.hf_config does"""
    from transformers import AutoConfig
    tc = dict(tc)
    dropped = []
    for _ in range(20):
        try:
            hcfg = AutoConfig.for_model(mt, text_config=tc, vision_config=vc, **kw)
            break
        except TypeError as e:
            bad = [k for k in tc if k != "model_type" and "'%s'" % k in str(e)]
            if not bad:
                raise
            for k in bad:
                tc.pop(k)
                dropped.append(k)
    else:
        raise RuntimeError("could not build a %s config" % mt)
    if dropped:
        print("  text config keys not accepted by transformers' %s config: %s" % (mt, dropped))
    t = hcfg.text_config
    got = (getattr(t, "num_experts", None), getattr(t, "num_experts_per_tok", None),
           getattr(t, "moe_intermediate_size", None), getattr(t, "decoder_sparse_step", None),
           list(getattr(t, "mlp_only_layers", None) or []))
    want = (tc["num_experts"], tc["num_experts_per_tok"], tc["moe_intermediate_size"], tc["decoder_sparse_step"],
            list(tc["mlp_only_layers"]))
    if got != want:
        raise RuntimeError("transformers' %s text config: experts %s, the fixture's %s" % (mt, got, want))
    return hcfg


def hf_experts(experts, have):
    """transformers' fused expert parameters of mlx-vlm's stacked ones (experts: layer prefix -> {gate, up, down}:
    [E, I, H], [E, I, H], [E, H, I]). Qwen3VLMoeTextExperts (transformers 5) holds gate_up_proj [E, 2I, H] (gate's
    rows, then up's: F.linear(x, gate_up_proj[e]).chunk(2)) and down_proj [E, H, I]; Hugging Face checkpoints and
    transformers 4.57 hold them transposed ([E, H, 2I] with gate's columns first, [E, I, H]: x @ gate_up_proj[e]),
    which mlx-vlm's sanitize splits and transposes. Whichever layout the model at hand has (have: its state dict),
    told apart by the shapes: the fixture keeps I != H and 2I != H, so no expert tensor is square"""
    import torch
    out = {}
    for pre, d in sorted(experts.items()):
        parts = {"gate_up_proj": np.concatenate([d["gate"], d["up"]], axis=1), "down_proj": d["down"]}
        for nm, t in parts.items():
            hk = "model.language_model." + pre + "experts." + nm
            if hk not in have:
                raise RuntimeError("no transformers parameter %s (its experts: %s)" % (
                    hk, [n for n in have if pre + "experts" in n][:4]))
            shape = tuple(have[hk].shape)
            if t.shape[1] == t.shape[2]:
                raise RuntimeError("%s: square expert matrices %s, the layout cannot be told" % (hk, t.shape))
            if tuple(t.shape) == shape:
                layout = "[E, out, in] (F.linear)"
            elif tuple(t.transpose(0, 2, 1).shape) == shape:
                t, layout = t.transpose(0, 2, 1), "[E, in, out] (x @ W)"
            else:
                raise RuntimeError("%s: shape %s, transformers %s" % (hk, tuple(t.shape), shape))
            if pre == "layers.0.mlp.":
                print("  transformers' %s: %s %s" % (nm, shape, layout))
            out[hk] = torch.tensor(np.ascontiguousarray(t), dtype=torch.float32)
    return out


def qwen3_5_config(g, c, tc, vc, kw):
    """AutoConfig.for_model("qwen3_5") (Qwen3_5Config: Qwen3_5TextConfig, Qwen3_5VisionConfig; the vision_config's
    model_type "qwen3_5" is read as qwen3_5_vision, as for the released checkpoints). The text config's rope_scaling
    None is left out (Qwen3.5 reads rope_parameters); a key a strict config class refuses (e.g. the vision config's
    deepstack_visual_indexes: Qwen3.5's tower has no deepstack) is dropped and reported, never one the forward
    depends on; then the layer types, head_dim and the rope dict the text model will use are checked"""
    from transformers import AutoConfig
    tc, vc = copy.deepcopy(tc), copy.deepcopy(vc)
    if "rope_scaling" in tc and tc["rope_scaling"] is None:
        tc.pop("rope_scaling")
    keep = {"model_type", "rope_parameters", "head_dim", "full_attention_interval", "layer_types", "hidden_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "rms_norm_eps", "depth", "num_heads", "out_hidden_size", "patch_size",
            "spatial_merge_size", "temporal_patch_size", "num_position_embeddings", "hidden_act", "in_channels"}
    dropped = []
    for _ in range(20):
        try:
            hcfg = AutoConfig.for_model("qwen3_5", text_config=tc, vision_config=vc, **kw)
            break
        except TypeError as e:
            bad = [(nm, d, k) for nm, d in (("text", tc), ("vision", vc)) for k in d if "'%s'" % k in str(e)]
            if not bad or any(k in keep for _, _, k in bad):
                raise
            for nm, d, k in bad:
                d.pop(k)
                dropped.append("%s.%s" % (nm, k))
    else:
        raise RuntimeError("could not build a qwen3_5 config")
    if dropped:
        print("  config keys not accepted by transformers' qwen3_5 config: %s" % dropped)
    t = hcfg.text_config
    want_types = ["full_attention" if k == "attention" else "linear_attention"
                  for k in check_golden.hybrid_layer_types(c["model_type"], c, c["num_hidden_layers"])]
    rp = dict(getattr(t, "rope_parameters", None) or {})
    want_rp = c["rope_parameters"]
    got = (list(t.layer_types), t.head_dim, list(rp.get("mrope_section") or []), rp.get("partial_rotary_factor"),
           rp.get("rope_theta"))
    want = (want_types, c["head_dim"], list(want_rp["mrope_section"]), want_rp["partial_rotary_factor"],
            want_rp["rope_theta"])
    if got != want:
        raise RuntimeError("transformers' qwen3_5 text config: (layer types, head_dim, mrope_section, partial rotary, "
                           "theta) %s, the fixture's %s" % (got, want))
    return hcfg


def qwen3_5_check_model(model, c):
    """the model AutoModelForImageTextToText made of the qwen3_5 config: Qwen3_5ForConditionalGeneration, a tower
    without deepstack, the text rotary embedding's frequencies (partial: head_dim * partial_rotary_factor / 2 of them)
    and M-RoPE sections those of the numpy reference"""
    if type(model).__name__ != "Qwen3_5ForConditionalGeneration":
        raise RuntimeError("AutoModelForImageTextToText made a %s" % type(model).__name__)
    deep = [n for n in model.state_dict() if "deepstack" in n]
    if deep:
        raise RuntimeError("the qwen3_5 tower has deepstack parameters %s" % deep[:2])
    rot = model.model.language_model.rotary_emb
    rp = c["rope_parameters"]
    n = int(c["head_dim"] * rp["partial_rotary_factor"])
    inv = 1.0 / (rp["rope_theta"] ** (np.arange(0, n, 2, dtype=np.float64) / n))
    got = rot.inv_freq.double().numpy()
    if got.shape != inv.shape or np.abs(got - inv).max() > 1e-6 * inv.max() or \
            list(getattr(rot, "mrope_section", [])) != list(rp["mrope_section"]):
        raise RuntimeError("transformers' text rotary embedding: inv_freq %s, mrope_section %s; the reference %s, %s" % (
            got, getattr(rot, "mrope_section", None), inv, rp["mrope_section"]))
    print("  %s: text rotary %d frequencies, mrope_section %s (interleaved), layer types %s" % (
        type(model).__name__, len(got), list(rot.mrope_section), list(model.config.text_config.layer_types)))


def image_features_check(model, extra, ref):
    """the model's image features (get_image_features: the tower and its merger) against the numpy reference's"""
    import torch
    with torch.no_grad():
        f = model.model.get_image_features(extra["pixel_values"], extra["image_grid_thw"])
    f = getattr(f, "pooler_output", f)
    if isinstance(f, (list, tuple)):
        f = torch.cat(list(f), 0)
    f = f.reshape(-1, f.shape[-1]).double().numpy()
    if f.shape != ref["emb"].shape:
        raise RuntimeError("transformers' image features %s, the reference's %s" % (f.shape, ref["emb"].shape))
    ferr = float(np.abs(f - ref["emb"]).max())
    print("  transformers vs numpy: image features max |diff| %.2e" % ferr)
    if ferr > 2e-3:
        raise RuntimeError("transformers' image features and the numpy reference differ (%.3g)" % ferr)


def qwen3_5_recompute(model, extra, ref, greedy, margins):
    """generate() and the numpy greedy ids differ: greedy by full recomputation (the image in every forward,
    mm_token_type_ids 0 on the generated tokens), as make_golden's reference does where generate() differs (it may
    suppress the config's eos id under min_new_tokens, which no runtime does): the recomputation wins"""
    import torch
    seq, rmarg = list(ref["ids"]), []
    with torch.no_grad():
        for _ in range(N_GEN):
            kw = dict(extra, mm_token_type_ids=torch.tensor([[1 if t == 258 else 0 for t in ref["ids"]] +
                                                             [0] * (len(seq) - len(ref["ids"]))]))
            last = model(input_ids=torch.tensor([seq]), **kw).logits[0, -1].double().numpy()
            top2 = np.sort(last)[-2:]
            rmarg.append(float(top2[1] - top2[0]))
            seq.append(int(np.argmax(last)))
    gen = seq[len(ref["ids"]):]
    print("  NOTE: generate() and the numpy greedy ids differ; full recomputation %s numpy: using the recomputation" % (
        "equals" if gen == ref["gen"] else "also differs from"))
    return gen, rmarg


def transformers_reference(fx, g, c, cfg, W, ref):
    """the same model in transformers (float32): image features and logits, compared with the numpy
    reference; returns the transformers logits/greedy ids (the fixture's reference then)"""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForImageTextToText
    mt = fx_type(fx)
    # copies: transformers' config classes rewrite nested dicts (rope_scaling) in place
    tc = copy.deepcopy({k: v for k, v in c.items() if k not in ("architectures", "torch_dtype")})
    if "text_model_type" in fx:  # Qwen2-VL: the text sub-config is Qwen2VLTextConfig ("qwen2_vl_text")
        tc["model_type"] = fx["text_model_type"]
    vc = copy.deepcopy(fx["vision"])
    if mt == "gemma3":  # Gemma 3's SigLIP has no pooling head
        vc["vision_use_head"] = False
    kw = {k: v for k, v in fx["top"].items()}
    # transformers 5 ties by the top-level flag: the fixture's own
    kw["tie_word_embeddings"] = bool(c.get("tie_word_embeddings", False)) and mt != "smolvlm"
    try:
        if mt == "qwen3_vl_moe":
            hcfg = moe_config(mt, tc, vc, kw)
        elif mt == "qwen3_5":
            hcfg = qwen3_5_config(g, c, tc, vc, kw)
        else:
            hcfg = AutoConfig.for_model(mt, text_config=tc, vision_config=vc, **kw)
    except Exception as e:  # noqa: BLE001
        # Qwen2-VL's mlp_ratio is an int in the released configs (4); a strictly typed Qwen2VLVisionConfig may refuse
        # the fixture's 1.5: build it with an int, then set the ratio past the type check (the modeling code only
        # takes int(embed_dim * mlp_ratio)); the fc1 shape is checked below and by the state dict
        if mt != "qwen2_vl" or isinstance(vc.get("mlp_ratio"), int):
            raise
        print("  NOTE: %s refused mlp_ratio %r (%s: %s): set past the check" % (
            mt, vc["mlp_ratio"], type(e).__name__, str(e)[:160]))
        hcfg = AutoConfig.for_model(mt, text_config=tc, vision_config=dict(vc, mlp_ratio=int(vc["mlp_ratio"])), **kw)
        object.__setattr__(hcfg.vision_config, "mlp_ratio", vc["mlp_ratio"])
    model = AutoModelForImageTextToText.from_config(hcfg, attn_implementation="eager").float().eval()
    if mt == "smolvlm" and type(model).__name__ != "SmolVLMForConditionalGeneration":
        raise RuntimeError("AutoModelForImageTextToText made a %s" % type(model).__name__)
    if mt == "qwen2_vl":
        fc1 = model.model.visual.blocks[0].mlp.fc1.out_features
        if type(model).__name__ != "Qwen2VLForConditionalGeneration" or fc1 != int(vc["embed_dim"] * vc["mlp_ratio"]):
            raise RuntimeError("AutoModelForImageTextToText made a %s (fc1 %d)" % (type(model).__name__, fc1))
    if mt == "qwen3_vl_moe" and type(model).__name__ != "Qwen3VLMoeForConditionalGeneration":
        raise RuntimeError("AutoModelForImageTextToText made a %s" % type(model).__name__)
    if mt == "qwen3_5":
        qwen3_5_check_model(model, c)
    names = list(model.state_dict().keys())
    sd = {}
    experts = {}  # mlx-vlm's stacked experts, by layer: fused back into transformers' layout below
    for k, w in W.items():
        hk = k
        m = re.match(r"^language_model\.model\.(layers\.\d+\.mlp\.)switch_mlp\.(gate|up|down)_proj\.weight$", k)
        if m:
            experts.setdefault(m.group(1), {})[m.group(2)] = w
            continue
        if mt == "smolvlm":  # exact names: language_model.model.* (check_golden's) -> model.text_model.*
            hk = smolvlm_hf_name(k)
            cand = [n for n in names if n == hk]
        else:
            if k.startswith("language_model."):
                hk = k[len("language_model."):]
                hk = hk.replace("model.", "model.language_model.", 1) if hk.startswith("model.") else hk
            elif k.startswith("vision_tower."):
                hk = ("model.visual." + k[len("vision_tower."):]) if mt in QWEN else \
                    "model.vision_tower." + k[len("vision_tower."):]
            elif k.startswith("multi_modal_projector."):
                hk = "model." + k
            cand = [n for n in names if n == hk] or [n for n in names if n.endswith(hk.split("model.", 1)[-1])]
            if not cand:  # transformers 5's SigLIP / Pixtral towers have no vision_model level
                hk2 = hk.replace(".vision_model.", ".", 1)
                cand = [n for n in names if n == hk2]
        if not cand:
            raise RuntimeError("no transformers parameter for %s (%s)" % (k, hk))
        if g["model_type"] in check_golden.HYBRID:  # (1 + w) norms, conv1d layout: transformers' own
            w = hybrid_hf_weight(g, k, w)
        t = torch.tensor(w, dtype=torch.float32)
        target = model.state_dict()[cand[0]]
        if t.ndim in (4, 5) and tuple(t.shape) != tuple(target.shape):  # MLX conv layout -> PyTorch
            t = t.permute(0, t.ndim - 1, *range(1, t.ndim - 1)).contiguous()
        if tuple(t.shape) != tuple(target.shape):
            raise RuntimeError("%s: shape %s, transformers %s" % (k, tuple(t.shape), tuple(target.shape)))
        sd[cand[0]] = t
    sd.update(hf_experts(experts, model.state_dict()))
    if kw["tie_word_embeddings"] and "lm_head.weight" in names and "lm_head.weight" not in sd:
        emb = [k for k in W if k.endswith("embed_tokens.weight")]
        sd["lm_head.weight"] = torch.tensor(W[emb[0]], dtype=torch.float32)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary" not in m and "inv_freq" not in m and "position_ids" not in m]
    if missing or unexpected:
        raise RuntimeError("state dict: missing %s, unexpected %s" % (missing[:6], unexpected[:6]))
    img = Image.open(IMAGE).convert("RGB")
    if mt in QWEN:
        Qwen2VLImageProcessor = vision_ref.slow_image_processor("Qwen2VLImageProcessor")
        p = fx["proc"]
        lo = p.get("min_pixels", p.get("size", {}).get("shortest_edge"))
        hi = p.get("max_pixels", p.get("size", {}).get("longest_edge"))
        ip = Qwen2VLImageProcessor(patch_size=p["patch_size"], merge_size=p["merge_size"],
                                   temporal_patch_size=p["temporal_patch_size"], min_pixels=lo, max_pixels=hi,
                                   image_mean=p["image_mean"], image_std=p["image_std"])
        inp = ip(images=[img], return_tensors="pt")
        extra = dict(pixel_values=inp["pixel_values"].float(), image_grid_thw=inp["image_grid_thw"])
        # transformers 5 takes the image tokens' places for M-RoPE from the processor's mm_token_type_ids
        extra["mm_token_type_ids"] = torch.tensor([[1 if t == 258 else 0 for t in ref["ids"]]])
        if mt == "qwen3_5":
            image_features_check(model, extra, ref)
    elif mt == "smolvlm":
        extra = smolvlm_transformers_inputs(fx, model, img, ref)
    elif mt == "gemma3":
        Gemma3ImageProcessor = vision_ref.slow_image_processor("Gemma3ImageProcessor")
        ip = Gemma3ImageProcessor(size=fx["proc"]["size"])
        inp = ip(images=[img], return_tensors="pt")
        extra = dict(pixel_values=inp["pixel_values"].float(),
                     token_type_ids=torch.tensor([[1 if t == 258 else 0 for t in ref["ids"]]]))
    else:
        PixtralImageProcessor = vision_ref.slow_image_processor("PixtralImageProcessor")
        ip = PixtralImageProcessor(size=fx["proc"]["size"],
                                   patch_size={"height": 4 * fx["top"]["spatial_merge_size"],
                                               "width": 4 * fx["top"]["spatial_merge_size"]})
        inp = ip(images=[img], return_tensors="pt")
        extra = dict(pixel_values=inp["pixel_values"].float(), image_sizes=torch.tensor(inp["image_sizes"]))
    ids = torch.tensor([ref["ids"]])
    with torch.no_grad():
        out = model(input_ids=ids, **extra)
        logits = out.logits[0].double().numpy()
        gen = model.generate(input_ids=ids, **extra, do_sample=False, max_new_tokens=N_GEN, min_new_tokens=N_GEN,
                             eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    greedy = gen.sequences[0, len(ref["ids"]):].tolist()
    margins = [float(np.diff(np.sort(s[0].double().numpy())[-2:])[0]) for s in gen.scores]
    if mt == "qwen3_5" and greedy != ref["gen"]:
        greedy, margins = qwen3_5_recompute(model, extra, ref, greedy, margins)
    err = float(np.abs(logits - ref["logits"]).max())
    print("  transformers vs numpy: logits max |diff| %.2e, greedy %s" % (err, "equal" if greedy == ref["gen"] else "DIFFERENT"))
    if err > 2e-3:
        diagnose(mt, model, extra, ref, ids, logits, cfg, W)
        raise RuntimeError("transformers and the numpy reference differ (%.3g)" % err)
    return logits, greedy, margins, "transformers %s / torch %s, float32, CPU, eager attention, slow image processors" % (
        transformers.__version__, torch.__version__)


def diagnose(mt, model, extra, ref, ids, logits, cfg, W):
    """where transformers and the numpy reference part: the image features, the text-only logits, the
    rope positions (Qwen), the first differing prompt position"""
    import torch
    bad = np.nonzero(np.abs(logits - ref["logits"]).max(1) > 2e-3)[0]
    print("  first differing prompt position %d of %d (image rows %s)" % (bad[0], len(ref["ids"]), ref["span"]))
    try:
        with torch.no_grad():
            if mt in QWEN:
                f = model.model.get_image_features(extra["pixel_values"], extra["image_grid_thw"])
            elif mt == "mistral3":
                f = model.model.get_image_features(extra["pixel_values"], image_sizes=extra["image_sizes"])
            else:
                f = model.model.get_image_features(extra["pixel_values"])
        f = getattr(f, "pooler_output", f)
        if isinstance(f, (list, tuple)):
            f = f[0]
        if isinstance(f, (list, tuple)):
            f = torch.cat(list(f), 0)
        f = f.reshape(-1, f.shape[-1]).double().numpy()
        print("  image features: shape %s, max |diff| %.3g" % (f.shape, np.abs(f - ref["emb"]).max()))
    except Exception as e:  # noqa: BLE001
        print("  image features: %s: %s" % (type(e).__name__, str(e)[:200]))
    try:
        t = [i for i in ref["ids"] if i < 256][:12]
        with torch.no_grad():
            hl = model(input_ids=torch.tensor([t])).logits[0].double().numpy()
        nl = check_golden.forward(forward_config(cfg), W, t)
        print("  text-only logits (%d tokens): max |diff| %.3g" % (len(t), np.abs(hl - nl).max()))
    except Exception as e:  # noqa: BLE001
        print("  text-only logits: %s: %s" % (type(e).__name__, str(e)[:200]))
    if mt in QWEN:
        try:
            if mt == "qwen3_5":  # get_rope_index(input_ids, mm_token_type_ids, image_grid_thw, ...)
                pos, _ = model.model.get_rope_index(ids, mm_token_type_ids=extra["mm_token_type_ids"],
                                                    image_grid_thw=extra["image_grid_thw"],
                                                    attention_mask=torch.ones_like(ids))
            else:
                pos, _ = model.model.get_rope_index(ids, extra["image_grid_thw"], None,
                                                    attention_mask=torch.ones_like(ids))
            mine, _ = get_rope_index(ref["ids"], ref["ids"][ref["span"][0]], ref["rows"], ref["cols"])
            print("  rope index: transformers %s, equal %s" % (tuple(pos.shape), bool(np.array_equal(pos[:, 0].numpy(), mine))))
        except Exception as e:  # noqa: BLE001
            print("  rope index: %s: %s" % (type(e).__name__, str(e)[:200]))


def main():
    args = sys.argv[1:]
    use_tf = "--transformers" in args
    args = [a for a in args if a != "--transformers"]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = set(args[i + 1].split(","))
        del args[i:i + 2]
    outdir = args[0] if args else os.path.join(ROOT, "tests", "golden", "vision")
    os.makedirs(outdir, exist_ok=True)
    results = []
    for fx in FIXTURES:
        if only and fx["name"] not in only:
            continue
        print("== %s" % fx["name"], flush=True)
        try:
            g, c, cfg, tensors, W = build(fx, fx["seed"])
            ref = numpy_reference(fx, g, c, cfg, W)
            reference = "numpy float64 forward of tools/golden_vision.py and tools/check_golden.py (not transformers)"
            if use_tf:
                ref["logits"], ref["gen"], ref["margins"], reference = transformers_reference(fx, g, c, cfg, W, ref)
            size = write(fx, outdir, g, c, cfg, tensors, ref, reference)
            results.append((fx["name"], True, "%d bytes, %d prompt tokens, %d image rows, min margin %.3f" % (
                size, len(ref["ids"]), len(ref["emb"]), min(ref["margins"]))))
        except Exception as e:
            traceback.print_exc()
            results.append((fx["name"], False, "%s: %s" % (type(e).__name__, str(e)[:300])))
    for name, ok, det in results:
        print("%-20s %-6s %s" % (name, "ok" if ok else "FAILED", det))
    sys.exit(0 if all(ok for _, ok, _ in results) else 1)


if __name__ == "__main__":
    main()
