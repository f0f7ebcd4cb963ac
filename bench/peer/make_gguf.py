#!/usr/bin/env python3
"""A random-weight GGUF of a Llama shape in Q4_0, for llama.cpp side by side with smelt's synthetic
checkpoints (`smelt bench --synthetic 8b --bits 4`): same layer shapes, a placeholder SentencePiece
vocabulary of the same size. Uses gguf-py from a llama.cpp source tree.
Shapes mistral-small-24b (Mistral-Small-24B, "llama" architecture) and phi4-mini (Phi-4-mini: llama.cpp's
"phi3" architecture with fused qkv and gate/up, 96 of 128 head dims rotated; without longrope's factor
tensors, which this architecture reads for whole-head rotation only, and with an untied output matrix of
the same size as smelt's tied one) match `smelt bench --synthetic mistral-small-24b|phi4-mini`.
Shape 30b-a3b is Qwen3-30B-A3B's (`smelt bench --synthetic qwen3-30b-a3b`) as llama.cpp's "llama"
architecture with experts (Mixtral's graph: 128 experts, 8 a token, softmax routing); it lacks only the
per-head q/k RMS norms of qwen3_moe (2 x 4,608 values a layer).

usage: make_gguf.py LLAMA_CPP_DIR 1b|8b|mistral-small-24b|phi4-mini|30b-a3b OUT.gguf
"""
import sys

import numpy as np

sys.path.insert(0, sys.argv[1] + "/gguf-py")
try:  # gguf-py's vocab module imports sentencepiece, which this script does not use
    import sentencepiece  # noqa: F401
except ImportError:
    import types
    sys.modules["sentencepiece"] = types.SimpleNamespace(SentencePieceProcessor=None)
import gguf  # noqa: E402

SHAPES = {
    "1b": dict(layers=16, dim=2048, ffn=8192, heads=32, kv_heads=8, vocab=128256),
    "8b": dict(layers=32, dim=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256),
    "mistral-small-24b": dict(layers=40, dim=5120, ffn=32768, heads=32, kv_heads=8, vocab=131072, head_dim=128),
    "phi4-mini": dict(layers=32, dim=3072, ffn=8192, heads=24, kv_heads=8, vocab=200064, arch="phi3", rot=96),
    "30b-a3b": dict(layers=48, dim=2048, ffn=768, heads=32, kv_heads=4, vocab=151936, head_dim=128,
                    experts=128, experts_used=8),
}
s = SHAPES[sys.argv[2]]
rng = np.random.default_rng(7)
ARCH = s.get("arch", "llama")
w = gguf.GGUFWriter(sys.argv[3], ARCH)
hd = s.get("head_dim", s["dim"] // s["heads"])
E = s.get("experts", 0)
w.add_context_length(131072)
w.add_embedding_length(s["dim"])
w.add_block_count(s["layers"])
w.add_feed_forward_length(s["ffn"])
w.add_head_count(s["heads"])
w.add_head_count_kv(s["kv_heads"])
w.add_rope_dimension_count(s.get("rot", hd))
if ARCH == "phi3":
    w.add_sliding_window(131072)  # this llama.cpp requires it of phi3 models of 128k context
if "head_dim" in s:
    w.add_key_length(hd)
    w.add_value_length(hd)
if E:
    w.add_expert_count(E)
    w.add_expert_used_count(s["experts_used"])
w.add_rope_freq_base(500000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
V = s["vocab"]
toks, types = [b"<unk>", b"<s>", b"</s>"], [2, 3, 3]
toks += [("<0x%02X>" % b).encode() for b in range(256)]
types += [6] * 256
toks += [("\u2581t%d" % i).encode() for i in range(V - len(toks))]
types += [1] * (V - len(types))
w.add_tokenizer_model("llama")
w.add_token_list(toks)
w.add_token_scores([0.0] * V)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)


def q4_0(rows, cols, n=0):
    """Q4_0 rows (n > 0: n stacked matrices): blocks of 32 weights = f16 scale + 16 bytes of nibbles
    (weights (q - 8) * scale)"""
    nb = cols // 32
    lead = (n,) if n else ()
    a = rng.integers(0, 256, size=lead + (rows, nb, 18), dtype=np.uint8)
    a[..., 0:2] = np.frombuffer(np.float16(0.0125).tobytes(), dtype=np.uint8)
    return a.reshape(lead + (rows, nb * 18))


def add_q(name, rows, cols, n=0):
    w.add_tensor(name, q4_0(rows, cols, n), raw_dtype=gguf.GGMLQuantizationType.Q4_0)


def add_norm(name, n):
    w.add_tensor(name, np.ones(n, dtype=np.float32))


d, f, kv, qd = s["dim"], s["ffn"], s["kv_heads"] * hd, s["heads"] * hd
add_q("token_embd.weight", V, d)
add_norm("output_norm.weight", d)
add_q("output.weight", V, d)
for i in range(s["layers"]):
    p = "blk.%d." % i
    add_norm(p + "attn_norm.weight", d)
    if ARCH == "phi3":
        add_q(p + "attn_qkv.weight", qd + 2 * kv, d)
    else:
        add_q(p + "attn_q.weight", qd, d)
        add_q(p + "attn_k.weight", kv, d)
        add_q(p + "attn_v.weight", kv, d)
    add_q(p + "attn_output.weight", d, qd)
    add_norm(p + "ffn_norm.weight", d)
    if ARCH == "phi3":
        add_q(p + "ffn_up.weight", 2 * f, d)
        add_q(p + "ffn_down.weight", d, f)
    elif E:
        w.add_tensor(p + "ffn_gate_inp.weight", rng.standard_normal((E, d), dtype=np.float32) * 0.02)
        add_q(p + "ffn_gate_exps.weight", f, d, E)
        add_q(p + "ffn_up_exps.weight", f, d, E)
        add_q(p + "ffn_down_exps.weight", d, f, E)
    else:
        add_q(p + "ffn_gate.weight", f, d)
        add_q(p + "ffn_up.weight", f, d)
        add_q(p + "ffn_down.weight", d, f)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
