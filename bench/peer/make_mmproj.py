#!/usr/bin/env python3
"""A random-weight mmproj GGUF (llama.cpp's multimodal projector file, read by tools/mtmd/clip.cpp) with
the vision-tower shapes of smelt's synthetic image-encoding checkpoints (bench/vision/make_synth.py), for
llama-mtmd-cli side by side with bench/vision. Weights f16, norms and biases f32 (as convert_hf_to_gguf.py
writes an f16 mmproj: patch embedding f16, position embedding f32). Uses gguf-py from a llama.cpp tree.

  qwen2.5-vl-7b  Qwen2.5-VL-7B's ViT (projector "qwen2.5vl_merger"): 32 blocks, 1280 wide, SwiGLU MLP 3420
                 with biases, RMSNorm, 16 heads, patch 14 with temporal patch 2 (two conv halves
                 v.patch_embd.weight and .weight.1), window attention with full attention in blocks
                 7/15/23/31 (clip.vision.n_wa_pattern = 8; the 112-pixel window is clip.cpp's default),
                 merger: RMSNorm, 2x2 merge, MLP 5120 -> 5120 -> 3584
  gemma3-4b      Gemma 3 4B's SigLIP (projector "gemma3"): 27 layers, 1152 wide, GELU MLP 4304, 16 heads,
                 patch 14, 896 x 896 (4096 patches, learned position embedding), average-pooled 4x4 to
                 256 tokens, RMSNorm and projection to 2560

--tiny: the same graph, 4 blocks (2 for gemma3), 128 wide, MLP 256, 2 heads, projection to 256 (the text
dimension of make_gguf.py's --tiny shapes), for a quick check on a CPU.

usage: make_mmproj.py LLAMA_CPP_DIR qwen2.5-vl-7b|gemma3-4b OUT.gguf [--tiny]
"""
import sys

import numpy as np

args = [a for a in sys.argv[1:] if a != "--tiny"]
TINY = len(args) != len(sys.argv) - 1
if len(args) != 3:
    sys.exit(__doc__.rsplit("\n\n", 1)[-1].strip())
sys.path.insert(0, args[0] + "/gguf-py")
try:  # gguf-py's vocab module imports sentencepiece, which this script does not use
    import sentencepiece  # noqa: F401
except ImportError:
    import types
    sys.modules["sentencepiece"] = types.SimpleNamespace(SentencePieceProcessor=None)
import gguf  # noqa: E402

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
SHAPES = {
    "qwen2.5-vl-7b": dict(proj="qwen2.5vl_merger", layers=32, dim=1280, ffn=3420, heads=16, patch=14,
                          image=560, out=3584, fullatt=[7, 15, 23, 31], merge=2, mean=CLIP_MEAN, std=CLIP_STD,
                          eps=1e-6),
    "gemma3-4b": dict(proj="gemma3", layers=27, dim=1152, ffn=4304, heads=16, patch=14, image=896, out=2560,
                      mean=[0.5] * 3, std=[0.5] * 3, eps=1e-6),
}
if args[1] not in SHAPES:
    sys.exit("make_mmproj.py: unknown shape '%s' (%s)" % (args[1], "|".join(SHAPES)))
s = dict(SHAPES[args[1]])
if TINY:
    s.update(dim=128, ffn=256, heads=2, out=256)
    if "fullatt" in s:
        s.update(layers=4, fullatt=[1, 3])
    else:
        s.update(layers=2)
QWEN = s["proj"] == "qwen2.5vl_merger"
rng = np.random.default_rng(7)
w = gguf.GGUFWriter(args[2], "clip")
w.add_type(gguf.GGUFType.MMPROJ)
w.add_name(args[1] + (" tiny" if TINY else "") + " random mmproj")
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
w.add_clip_has_vision_encoder(True)
w.add_clip_projector_type(s["proj"])
w.add_vision_projection_dim(s["out"])
w.add_vision_image_size(s["image"])
w.add_vision_patch_size(s["patch"])
w.add_vision_embedding_length(s["dim"])
w.add_vision_feed_forward_length(s["ffn"])
w.add_vision_block_count(s["layers"])
w.add_vision_head_count(s["heads"])
w.add_vision_image_mean(s["mean"])
w.add_vision_image_std(s["std"])
w.add_vision_attention_layernorm_eps(s["eps"])
if QWEN:
    w.add_vision_use_silu(True)
    # convert_hf_to_gguf.py: n_wa_pattern = fullatt_block_indexes[0] + 1, evenly spaced
    w.add_vision_n_wa_pattern(s["fullatt"][0] + 1)  # spatial merge 2: clip.cpp's default, not written
else:
    w.add_vision_use_gelu(True)


def f16(name, *shape):
    """random weight (numpy shape = PyTorch's [out, in, ...]), scaled 1/sqrt(fan-in), stored f16"""
    fan = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    a = rng.standard_normal(shape, dtype=np.float32)
    a *= np.float32(1.0 / np.sqrt(fan))
    w.add_tensor(name, a.astype(np.float16))


def f32(name, n, ones=False):
    w.add_tensor(name, np.ones(n, np.float32) if ones else 0.02 * rng.standard_normal(n, dtype=np.float32))


D, F, P = s["dim"], s["ffn"], s["patch"]
if QWEN:  # HF Conv3d [D, 3, 2, P, P] split along time into two Conv2d halves, no bias
    f16("v.patch_embd.weight", D, 3, P, P)
    f16("v.patch_embd.weight.1", D, 3, P, P)
else:
    f16("v.patch_embd.weight", D, 3, P, P)
    f32("v.patch_embd.bias", D)
    n_pos = (s["image"] // P) ** 2
    w.add_tensor("v.position_embd.weight", 0.02 * rng.standard_normal((n_pos, D), dtype=np.float32))
for i in range(s["layers"]):
    p = "v.blk.%d." % i
    f32(p + "ln1.weight", D, ones=True)
    if not QWEN:
        f32(p + "ln1.bias", D)
    for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
        f16(p + t + ".weight", D, D)
        f32(p + t + ".bias", D)
    f32(p + "ln2.weight", D, ones=True)
    if not QWEN:
        f32(p + "ln2.bias", D)
    if QWEN:  # SwiGLU: gate_proj, up_proj, down_proj, all with biases
        f16(p + "ffn_gate.weight", F, D)
        f32(p + "ffn_gate.bias", F)
    f16(p + "ffn_up.weight", F, D)
    f32(p + "ffn_up.bias", F)
    f16(p + "ffn_down.weight", D, F)
    f32(p + "ffn_down.bias", D)
if QWEN:  # merger: ln_q (RMSNorm) -> 2x2 merge -> mlp.0 (GELU) -> mlp.2
    M = D * s["merge"] ** 2
    f32("v.post_ln.weight", D, ones=True)
    f16("mm.0.weight", M, M)
    f32("mm.0.bias", M)
    f16("mm.2.weight", s["out"], M)
    f32("mm.2.bias", s["out"])
else:  # SigLIP post_layernorm; Gemma 3 projector: RMSNorm (weight + 1 folded in) and [D, out] matrix
    f32("v.post_ln.weight", D, ones=True)
    f32("v.post_ln.bias", D)
    f32("mm.soft_emb_norm.weight", D, ones=True)
    f16("mm.input_projection.weight", D, s["out"])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
