#!/usr/bin/env python3
"""Write a random-weight F16 GGUF of a Llama shape, for llama.cpp's llama-quantize and llama-bench:
no network, no real weights. The GGUF (version 3) is written here with struct and numpy, so it
does not depend on the gguf-py version of a llama.cpp checkout.

usage: make_gguf.py OUT.gguf [1b|8b]

The vocabulary is a synthetic SentencePiece-style one of the model's size (128256): <unk>, <s>,
</s>, the 256 byte tokens, then placeholder pieces. llama-bench feeds random token ids, so only its
size matters. The weights are pieces of one block of N(0, 0.02) values at random offsets (fast to
write; a benchmark only needs realistic magnitudes)."""
import struct
import sys

import numpy as np

SHAPES = {  # Llama-3.2-1B (tied embeddings) and Llama-3.1-8B
    "1b": dict(hidden=2048, layers=16, ffn=8192, heads=32, kv=8, vocab=128256, tied=True),
    "8b": dict(hidden=4096, layers=32, ffn=14336, heads=32, kv=8, vocab=128256, tied=False),
}
ALIGN = 32
T_UINT32, T_INT32, T_FLOAT32, T_STRING, T_ARRAY = 4, 5, 6, 8, 9
GGML_F32, GGML_F16 = 0, 1


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, val):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        return out + struct.pack("<I", val)
    if vtype == T_FLOAT32:
        return out + struct.pack("<f", val)
    if vtype == T_STRING:
        return out + gstr(val)
    etype, items = val
    out += struct.pack("<IQ", etype, len(items))
    if etype == T_STRING:
        return out + b"".join(gstr(s) for s in items)
    fmt = {T_INT32: "i", T_FLOAT32: "f"}[etype]
    return out + struct.pack("<%d%s" % (len(items), fmt), *items)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    name = sys.argv[2] if len(sys.argv) > 2 else "1b"
    sh = SHAPES[name]
    h, hd, V = sh["hidden"], sh["hidden"] // sh["heads"], sh["vocab"]
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, byte
    tokens += ["\u2581t%d" % i for i in range(len(tokens), V)]
    types += [1] * (V - len(types))
    kvs = [
        kv("general.architecture", T_STRING, "llama"),
        kv("general.name", T_STRING, "random-llama-" + name),
        kv("general.file_type", T_UINT32, 1),  # mostly F16
        kv("general.alignment", T_UINT32, ALIGN),
        kv("llama.context_length", T_UINT32, 8192),
        kv("llama.embedding_length", T_UINT32, h),
        kv("llama.block_count", T_UINT32, sh["layers"]),
        kv("llama.feed_forward_length", T_UINT32, sh["ffn"]),
        kv("llama.attention.head_count", T_UINT32, sh["heads"]),
        kv("llama.attention.head_count_kv", T_UINT32, sh["kv"]),
        kv("llama.rope.dimension_count", T_UINT32, hd),
        kv("llama.vocab_size", T_UINT32, V),
        kv("llama.rope.freq_base", T_FLOAT32, 500000.0),
        kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, 1e-5),
        kv("tokenizer.ggml.model", T_STRING, "llama"),
        kv("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens)),
        kv("tokenizer.ggml.scores", T_ARRAY, (T_FLOAT32, [-float(i) for i in range(V)])),
        kv("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, types)),
        kv("tokenizer.ggml.unknown_token_id", T_UINT32, 0),
        kv("tokenizer.ggml.bos_token_id", T_UINT32, 1),
        kv("tokenizer.ggml.eos_token_id", T_UINT32, 2),
    ]
    # (name, numpy shape (rows, cols) or (n,), ggml type)
    tensors = [("token_embd.weight", (V, h), GGML_F16)]
    for l in range(sh["layers"]):
        p = "blk.%d." % l
        tensors += [
            (p + "attn_norm.weight", (h,), GGML_F32),
            (p + "attn_q.weight", (h, h), GGML_F16),
            (p + "attn_k.weight", (sh["kv"] * hd, h), GGML_F16),
            (p + "attn_v.weight", (sh["kv"] * hd, h), GGML_F16),
            (p + "attn_output.weight", (h, h), GGML_F16),
            (p + "ffn_norm.weight", (h,), GGML_F32),
            (p + "ffn_gate.weight", (sh["ffn"], h), GGML_F16),
            (p + "ffn_up.weight", (sh["ffn"], h), GGML_F16),
            (p + "ffn_down.weight", (h, sh["ffn"]), GGML_F16),
        ]
    tensors.append(("output_norm.weight", (h,), GGML_F32))
    if not sh["tied"]:
        tensors.append(("output.weight", (V, h), GGML_F16))

    def nbytes(shape, t):
        return int(np.prod(shape)) * (4 if t == GGML_F32 else 2)

    def pad(n):
        return (ALIGN - n % ALIGN) % ALIGN

    infos, off = b"", 0
    for tname, shape, t in tensors:
        dims = list(reversed(shape))  # ne0 = columns
        infos += gstr(tname) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", t, off)
        off += nbytes(shape, t) + pad(nbytes(shape, t))
    head = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    rng = np.random.default_rng(42)
    block = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02).astype(np.float16)
    with open(out, "wb") as f:
        f.write(head + b"\0" * pad(len(head)))
        for tname, shape, t in tensors:
            n = int(np.prod(shape))
            if t == GGML_F32:
                data = np.ones(n, dtype=np.float32).tobytes()
            else:
                data = np.resize(np.roll(block, int(rng.integers(1 << 24))), n).tobytes()
            f.write(data + b"\0" * pad(len(data)))


if __name__ == "__main__":
    main()
