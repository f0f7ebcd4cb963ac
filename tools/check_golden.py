#!/usr/bin/env python3
"""Independent check of a golden fixture (numpy only, no torch):
re-read model.safetensors, dequantize the MLX-packed weights with a generic bit-stream
unpacker (independent of the packer in tools/mlxq.py), run a float64 forward pass of the
llama-family architecture (llama / mistral / qwen2 / qwen3: RMSNorm, RoPE incl. llama3
scaling, GQA, q/k-norm, qkv bias, SwiGLU, tied or untied head) and compare with the
recorded transformers logits and greedy ids.

Usage: python3 tools/check_golden.py tests/golden/fixtures/<name> [...]
       python3 tools/check_golden.py --all        (every dir under tests/golden/fixtures)
Exit status 0 when every fixture matches.
"""
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # ctest treats 77 as "skipped"
    print("numpy not available: skipping")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a: base + b]
        dt, shape = info["dtype"], info["shape"]
        if dt == "BF16":
            arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, "<f2")
        elif dt == "F32":
            arr = np.frombuffer(raw, "<f4")
        elif dt == "U32":
            arr = np.frombuffer(raw, "<u4")
        else:
            raise ValueError("unsupported dtype %s for %s" % (dt, name))
        out[name] = arr.reshape(shape)
    return out


def unpack_rows(packed, bits, in_dim):
    """Element j of a row = bits [j*bits, (j+1)*bits) of the row's little-endian bit stream."""
    rows = packed.shape[0]
    by = np.ascontiguousarray(packed.astype("<u4")).view(np.uint8).reshape(rows, -1)
    bitsarr = np.unpackbits(by, axis=1, bitorder="little")[:, : in_dim * bits]
    bitsarr = bitsarr.reshape(rows, in_dim, bits).astype(np.int64)
    return (bitsarr * (1 << np.arange(bits, dtype=np.int64))).sum(axis=2)


def load_weights(fdir):
    cfg = json.load(open(os.path.join(fdir, "config.json")))
    st = read_safetensors(os.path.join(fdir, "model.safetensors"))
    q = cfg.get("quantization")
    W = {}
    for name, arr in st.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is not None and module + ".scales" in st:
            assert q is not None, "quantized tensor without a quantization block"
            p = q.get(module, None)
            if not isinstance(p, dict):
                p = {"group_size": q["group_size"], "bits": q["bits"]}
            G, B = p["group_size"], p["bits"]
            scales = st[module + ".scales"].astype(np.float64)
            biases = st[module + ".biases"].astype(np.float64)
            in_dim = arr.shape[1] * 32 // B
            assert scales.shape == (arr.shape[0], in_dim // G), (name, scales.shape, in_dim, G)
            codes = unpack_rows(arr, B, in_dim)
            assert codes.max() < (1 << B)
            W[name] = codes * np.repeat(scales, G, axis=1) + np.repeat(biases, G, axis=1)
        else:
            W[name] = arr.astype(np.float64)
    return cfg, W


def inv_freq(cfg, d):
    inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.get("rope_scaling")
    if rs:
        t = rs.get("rope_type", rs.get("type"))
        if t == "llama3":
            factor, lf, hf = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
            old = rs["original_max_position_embeddings"]
            wl = 2 * np.pi / inv
            res = []
            for f, w in zip(inv, wl):
                if w < old / hf:
                    res.append(f)
                elif w > old / lf:
                    res.append(f / factor)
                else:
                    s = (old / w - lf) / (hf - lf)
                    res.append((1 - s) * f / factor + s * f)
            inv = np.array(res)
        elif t == "linear":
            inv = inv / rs["factor"]
        elif t not in (None, "default"):
            raise ValueError("rope type %s not handled" % t)
    return inv


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def forward(cfg, W, ids):
    H = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    T = len(ids)
    x = W["model.embed_tokens.weight"][ids]
    inv = inv_freq(cfg, hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)
    sin = np.concatenate([np.sin(ang)] * 2, -1)

    def rope(v):  # v [T, heads, hd], rotate-half convention
        h1, h2 = v[..., : hd // 2], v[..., hd // 2:]
        rot = np.concatenate([-h2, h1], -1)
        return v * cos[:, None, :] + rot * sin[:, None, :]

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)

        def lin(name, inp):
            y = inp @ W[p + name + ".weight"].T
            if p + name + ".bias" in W:
                y = y + W[p + name + ".bias"]
            return y
        qv = lin("self_attn.q_proj", h).reshape(T, nh, hd)
        kv = lin("self_attn.k_proj", h).reshape(T, nkv, hd)
        vv = lin("self_attn.v_proj", h).reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:
            qv = rmsnorm(qv, W[p + "self_attn.q_norm.weight"], eps)
            kv = rmsnorm(kv, W[p + "self_attn.k_norm.weight"], eps)
        qv, kv = rope(qv), rope(kv)
        rep = nh // nkv
        kv = np.repeat(kv, rep, axis=1)
        vv = np.repeat(vv, rep, axis=1)
        att = np.einsum("thd,shd->hts", qv, kv) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, vv).reshape(T, nh * hd)
        x = x + lin("self_attn.o_proj", o)
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = lin("mlp.gate_proj", h)
        u = lin("mlp.up_proj", h)
        x = x + lin("mlp.down_proj", g / (1 + np.exp(-g)) * u)
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings"):
        head = W["model.embed_tokens.weight"]
    return x @ head.T


def check(fdir):
    man = json.load(open(os.path.join(fdir, "manifest.json")))
    cfg, W = load_weights(fdir)
    ref = np.fromfile(os.path.join(fdir, man["logits_file"]), "<f4").reshape(man["logits_shape"])
    got = forward(cfg, W, man["prompt_ids"])
    err = np.abs(got - ref).max()
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    tol = man["tolerances"]["f32"]
    ok = err <= tol["max_abs"] and rel <= tol["rel_l2"]
    # greedy: must agree until the first step whose recorded margin is a near-tie
    seq = list(man["prompt_ids"])
    gen_ok = True
    n_cmp = 0
    for step, want in enumerate(man["greedy_ids"]):
        lg = forward(cfg, W, seq)[-1]
        got_id = int(np.argmax(lg))
        if got_id != want:
            gen_ok = man["greedy_top2_margins"][step] < man["tolerances"]["greedy_margin_min"]
            break
        n_cmp += 1
        seq.append(want)
    print("%-24s logits max_abs %.2e rel_l2 %.2e  greedy %d/%d  %s" %
          (man["name"], err, rel, n_cmp, len(man["greedy_ids"]), "OK" if ok and gen_ok else "FAIL"))
    return ok and gen_ok


def main():
    args = sys.argv[1:]
    if not args or args == ["--all"]:
        base = os.path.join(ROOT, "tests", "golden", "fixtures")
        args = [os.path.join(base, d) for d in sorted(os.listdir(base))
                if os.path.isfile(os.path.join(base, d, "manifest.json"))]
    results = [check(d) for d in args]
    n_ok = sum(results)
    print("%d passed, %d failed" % (n_ok, len(results) - n_ok))
    sys.exit(0 if all(results) and results else 1)


if __name__ == "__main__":
    main()
