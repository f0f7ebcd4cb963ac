#!/usr/bin/env python3
"""Independent check of a golden fixture (numpy only, no torch):
re-read model.safetensors, dequantize the MLX-packed weights with a generic bit-stream
unpacker (independent of the packer in tools/mlxq.py), run a float64 forward pass written from
the transformers modeling code of each family, and compare with the recorded logits and greedy ids.

Families (config model_type): llama, mistral, ministral3, qwen2, qwen3, smollm3, granite, gemma,
gemma2, gemma3_text, phi3, olmo2, olmo3, exaone4, glm4, cohere2, and the text models of the
vision-language packagings gemma3, mistral3, qwen2_5_vl, qwen3_vl (weights under "language_model.",
vision tensors ignored). RoPE: default, linear, llama3, dynamic, yarn, longrope, mrope (text
positions), partial and interleaved rotary, per-layer theta, NoPE layers.

RoPE types whose frequencies depend on the sequence length (dynamic, longrope) follow transformers'
generate(): the prompt is one forward (its length sets the frequencies of all prompt tokens), every
later token is its own forward (seq_len = position + 1).

Usage: python3 tools/check_golden.py tests/golden/fixtures/<name> [...]
       python3 tools/check_golden.py --all        (every dir under tests/golden/fixtures)
Exit status 0 when every fixture matches. forward() is also used by make_golden.py --numpy.
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # ctest treats 77 as "skipped"
    print("numpy not available: skipping")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the text model type of a vision-language packaging whose text_config does not name it
VLM_TEXT_TYPE = {"gemma3": "gemma3_text", "mistral3": "mistral", "qwen2_5_vl": "qwen2_5_vl_text",
                 "qwen3_vl": "qwen3_vl_text"}


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


def quant_params(q, module):
    p = q.get(module)
    if p is None and module.startswith("language_model."):
        p = q.get(module[len("language_model."):])
    if p is None:
        p = q.get("language_model." + module)
    if not isinstance(p, dict):
        p = {"group_size": q["group_size"], "bits": q["bits"]}
    return p["group_size"], p["bits"]


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
            G, B = quant_params(q, module)
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


# ----------------------------------------------------------------------------------- config

def text_config(cfg):
    """(text config dict, text model_type, outer vlm type or None)"""
    tc = cfg.get("text_config")
    outer = cfg.get("model_type")
    if isinstance(tc, dict):
        mt = tc.get("model_type") or VLM_TEXT_TYPE[outer]
        return tc, mt, (outer if outer != mt else None)
    if "vision_config" in cfg:
        return cfg, VLM_TEXT_TYPE[outer], outer
    return cfg, outer, None


def rope_params(tc):
    """transformers-v5-style: one dict for full-attention layers (+ the sliding layers' theta)"""
    rp = tc.get("rope_parameters")
    rs = tc.get("rope_scaling")
    full, slide = {}, {}
    if isinstance(rs, dict):
        full = dict(rs)
    elif isinstance(rp, dict):
        if isinstance(rp.get("full_attention"), dict):
            full = dict(rp["full_attention"])
            slide = dict(rp.get("sliding_attention") or {})
        else:
            full = dict(rp)
    t = full.get("rope_type", full.get("type", "default"))
    full["rope_type"] = "default" if t in (None, "mrope") else t
    full.setdefault("rope_theta", tc.get("rope_theta", 10000.0))
    return full, slide


class Fam:
    """what transformers' modeling code of a family does, as flags"""

    def __init__(self, mt, tc):
        self.mt = mt
        self.gemma = mt in ("gemma", "gemma2", "gemma3_text")
        self.block = {"gemma2": "sandwich", "gemma3_text": "sandwich", "glm4": "glm4", "olmo2": "post",
                      "olmo3": "post", "exaone4": "post", "cohere2": "parallel"}.get(mt, "pre")
        self.norm_offset = 1.0 if self.gemma else 0.0
        self.layernorm = mt == "cohere2"
        self.fused_qkv = mt == "phi3"
        self.fused_gate_up = mt in ("phi3", "glm4")
        self.qk_norm = {"qwen3": "head", "qwen3_vl_text": "head", "gemma3_text": "head", "exaone4": "head",
                        "olmo2": "full", "olmo3": "full"}.get(mt)
        self.interleaved = mt in ("glm4", "cohere2")
        self.act = "gelu_tanh" if self.gemma else "silu"
        act = tc.get("hidden_activation" if self.gemma else "hidden_act")
        if act is not None:
            self.act = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                        "gelu_fast": "gelu_tanh"}[act]
        # biases: which projections get them when attention_bias is true
        ab = bool(tc.get("attention_bias", False))
        self.qkv_bias = mt in ("qwen2", "qwen2_5_vl_text") or (ab and mt not in (
            "mistral", "ministral3", "phi3", "exaone4"))
        self.o_bias = ab and mt not in ("mistral", "ministral3", "phi3", "exaone4", "qwen2", "qwen2_5_vl_text", "glm4")


def layer_kinds(fam, tc, n):
    """per layer: (sliding, window, rope) with rope None (NoPE), "full" or "local" """
    mt = fam.mt
    sw = tc.get("sliding_window")
    lt = tc.get("layer_types")
    if isinstance(tc.get("sliding_window_pattern"), str) and lt is None:
        pat = tc["sliding_window_pattern"]
        lt = ["sliding_attention" if pat[i % len(pat)] == "L" else "full_attention" for i in range(n)]
    nrl = tc.get("no_rope_layers")
    if mt == "smollm3" and nrl is None:
        iv = tc.get("no_rope_layer_interval", 4)
        nrl = [int((i + 1) % iv != 0) for i in range(n)]
    if lt is None:
        if mt in ("gemma2",):
            lt = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
        elif mt in ("gemma3_text", "cohere2", "exaone4"):
            p = tc.get("sliding_window_pattern", {"gemma3_text": 6, "cohere2": 4, "exaone4": 4}[mt])
            lt = ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(n)]
        elif mt == "olmo3":
            lt = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
        elif mt == "smollm3":
            use = tc.get("use_sliding_window", False) and sw is not None
            lt = ["sliding_attention" if use and not nrl[i] else "full_attention" for i in range(n)]
        elif mt in ("qwen2", "qwen3", "qwen2_5_vl_text", "qwen3_vl_text"):
            use = tc.get("use_sliding_window", False) and sw is not None
            mwl = tc.get("max_window_layers", 28)
            lt = ["sliding_attention" if use and i >= mwl else "full_attention" for i in range(n)]
        elif mt in ("mistral", "ministral3", "phi3"):
            lt = ["sliding_attention" if sw else "full_attention" for i in range(n)]
        else:
            lt = ["full_attention"] * n
    out = []
    for i in range(n):
        sliding = lt[i] == "sliding_attention"
        window = sw if (sliding and sw) else 0
        if mt == "smollm3" and not tc.get("use_sliding_window", False):
            window = 0
        if mt in ("qwen2", "qwen3", "qwen2_5_vl_text", "qwen3_vl_text") and not tc.get("use_sliding_window", False):
            window = 0
        rope = "full"
        if mt == "cohere2":
            rope = "full" if (sliding and sw) else None
        elif mt == "exaone4":
            rope = "full" if (sw is None or sliding) else None
        elif mt == "smollm3":
            rope = "full" if nrl[i] else None
        if rope and sliding and mt in ("gemma3_text", "olmo3"):
            rope = "local"
        out.append((sliding, window, rope))
    return out


# ----------------------------------------------------------------------------------- RoPE

def inv_freq(rp, dim, tc, seq_len):
    """modeling_rope_utils: (inverse frequencies, attention factor) for a rope parameter dict"""
    base = rp["rope_theta"]
    t = rp.get("rope_type", "default")
    arange = np.arange(0, dim, 2, dtype=np.float64)
    inv = 1.0 / (base ** (arange / dim))
    af = 1.0
    if t == "default":
        pass
    elif t == "linear":
        inv = inv / rp["factor"]
    elif t == "llama3":
        factor, lf, hf = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        wl = 2 * np.pi / inv
        out = np.where(wl > old / lf, inv / factor, inv)
        smooth = (old / wl - lf) / (hf - lf)
        smoothed = (1 - smooth) * out / factor + smooth * out
        mid = ~(wl < old / hf) & ~(wl > old / lf)
        inv = np.where(mid, smoothed, out)
    elif t == "dynamic":
        mp = tc["max_position_embeddings"]
        sl = max(seq_len, mp)
        b2 = base * ((rp["factor"] * sl / mp) - (rp["factor"] - 1)) ** (dim / (dim - 2))
        inv = 1.0 / (b2 ** (arange / dim))
    elif t == "yarn":
        factor = rp["factor"]
        orig = rp["original_max_position_embeddings"]
        af = rp.get("attention_factor")
        ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        if af is None:
            af = get_mscale(factor, ms) / get_mscale(factor, msa) if (ms and msa) else get_mscale(factor)
        bf = rp.get("beta_fast") or 32
        bs = rp.get("beta_slow") or 1

        def corr(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
        lo, hi = corr(bf), corr(bs)
        if rp.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extra = 1.0 - ramp
        pos = base ** (arange / dim)
        inv = (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra
    elif t in ("longrope", "su"):
        orig = rp["original_max_position_embeddings"]
        factor = rp.get("factor") or tc["max_position_embeddings"] / orig
        af = rp.get("attention_factor")
        if af is None:
            af = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = np.array(rp["long_factor"] if seq_len > orig else rp["short_factor"], dtype=np.float64)
        inv = 1.0 / (ext * base ** (arange / dim))
    else:
        raise ValueError("rope type %s not handled" % t)
    return inv, af


def rope_tables(fam, tc, T, n_prefill):
    """cos/sin [T, rot/2] (already times the attention factor) of the full and local RoPE"""
    hd = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
    if fam.mt == "cohere2":
        hd = tc["hidden_size"] // tc["num_attention_heads"]
    full, slide = rope_params(tc)
    prf = full.get("partial_rotary_factor", tc.get("partial_rotary_factor",
                                                    0.5 if fam.mt == "glm4" else 1.0))
    rot = int(hd * prf)
    # Phi-3's original_max_position_embeddings attribute (class default 4096) wins over the rope dict's
    if full["rope_type"] in ("llama3", "yarn", "longrope", "su"):
        top = tc.get("original_max_position_embeddings", 4096 if fam.mt == "phi3" else None)
        if top is not None:
            full["original_max_position_embeddings"] = top
        full.setdefault("original_max_position_embeddings", tc["max_position_embeddings"])
    out = {}
    for kind in ("full", "local"):
        if kind == "full":
            rp = full
        elif fam.mt == "gemma3_text":
            rp = {"rope_type": "default", "rope_theta": slide.get("rope_theta", tc.get("rope_local_base_freq", 10000.0))}
        else:  # olmo3: no scaling on sliding layers
            rp = {"rope_type": "default", "rope_theta": full["rope_theta"]}
        cos = np.zeros((T, rot // 2))
        sin = np.zeros((T, rot // 2))
        for t in range(T):
            sl = n_prefill if t < n_prefill else t + 1
            inv, af = inv_freq(rp, rot, tc, sl)
            cos[t] = np.cos(t * inv) * af
            sin[t] = np.sin(t * inv) * af
        out[kind] = (cos, sin)
    return hd, rot, out


def apply_rope(v, cos, sin, rot, interleaved):
    """v [T, heads, hd]: the first rot dims rotated (rotate-half, or pairs (2i, 2i+1))"""
    v = v.copy()
    c, s = cos[:, None, :], sin[:, None, :]
    if interleaved:
        a, b = v[..., 0:rot:2].copy(), v[..., 1:rot:2].copy()
        v[..., 0:rot:2] = a * c - b * s
        v[..., 1:rot:2] = a * s + b * c
    else:
        h = rot // 2
        a, b = v[..., :h].copy(), v[..., h:rot].copy()
        v[..., :h] = a * c - b * s
        v[..., h:rot] = a * s + b * c
    return v


# ----------------------------------------------------------------------------------- forward

def rmsnorm(x, w, eps, offset=0.0):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (w + offset)


def layernorm(x, w, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w


def act(fam, g):
    if fam.act == "gelu_tanh":
        return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    return g / (1 + np.exp(-g))


def mrope_tables(tc, rot, rope_pos):
    """M-RoPE (Qwen-VL): cos/sin [T, rot/2] of 3-axis positions rope_pos [3, T]; frequency i takes the
    position of its axis: mrope_section in order, or (mrope_interleaved, Qwen3-VL) axes 1 and 2 on
    every third frequency below 3 * section"""
    rp = tc.get("rope_scaling") or tc.get("rope_parameters") or {}
    sec = rp["mrope_section"]
    inv = 1.0 / (tc.get("rope_theta", rp.get("rope_theta", 10000.0)) ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    half = rot // 2
    if rp.get("mrope_interleaved"):
        axis = [1 if i % 3 == 1 and i < 3 * sec[1] else 2 if i % 3 == 2 and i < 3 * sec[2] else 0 for i in range(half)]
    else:
        axis = [0 if i < sec[0] else 1 if i < sec[0] + sec[1] else 2 for i in range(half)]
    ang = np.stack([np.asarray(rope_pos)[axis[i]] * inv[i] for i in range(half)], axis=1)
    return np.cos(ang), np.sin(ang)


def forward(cfg, W, ids, n_prefill=None, embeds=None, rope_pos=None, deepstack=None, groups=None):
    """logits [T, vocab] of ids (float64). n_prefill: the prompt length (see the module comment).
    Images (tools/golden_vision.py): embeds = (rows, [len(rows), hidden]) input embeddings of those rows
    (not scaled); rope_pos [3, T]: M-RoPE positions; deepstack: per decoder layer l, (rows, values)
    added after it; groups [T]: image group of each token (0: none), whose tokens attend each other
    in both directions (Gemma 3)."""
    tc, mt, outer = text_config(cfg)
    fam = Fam(mt, tc)
    pre = "language_model." if any(k.startswith("language_model.") for k in W) else ""
    H = tc["hidden_size"]
    nh = tc["num_attention_heads"]
    nkv = tc.get("num_key_value_heads") or nh
    eps = tc.get("rms_norm_eps", tc.get("layer_norm_eps", 1e-6))
    T = len(ids)
    n_prefill = T if n_prefill is None else n_prefill
    hd, rot, ropes = rope_tables(fam, tc, T, n_prefill)
    kinds = layer_kinds(fam, tc, tc["num_hidden_layers"])

    def norm(x, name):
        if fam.layernorm:
            return layernorm(x, W[name], eps)
        return rmsnorm(x, W[name], eps, fam.norm_offset)

    x = W[pre + "model.embed_tokens.weight"][ids].copy()
    if fam.gemma:
        x = x * math.sqrt(H)
    if embeds is not None:
        x[np.asarray(embeds[0])] = embeds[1]
    if rope_pos is not None:
        ropes = {"full": mrope_tables(tc, rot, rope_pos)}
    if mt == "granite":
        x = x * tc.get("embedding_multiplier", 1.0)
    if mt == "gemma2" or mt == "gemma3_text":
        scaling = tc.get("query_pre_attn_scalar", 256) ** -0.5
    elif mt == "granite":
        scaling = tc.get("attention_multiplier", 1.0)
    else:
        scaling = hd ** -0.5
    softcap = tc.get("attn_logit_softcapping") if mt in ("gemma2", "gemma3_text") else None
    resid = tc.get("residual_multiplier", 1.0) if mt == "granite" else 1.0
    pos = np.arange(T)

    for i, (sliding, window, rope) in enumerate(kinds):
        p = pre + "model.layers.%d." % i

        def lin(name, inp, bias=False):
            y = inp @ W[p + name + ".weight"].T
            if bias:
                y = y + W[p + name + ".bias"]
            return y

        def attention(h):
            if fam.fused_qkv:
                qkv = lin("self_attn.qkv_proj", h)
                q, k, v = qkv[:, :nh * hd], qkv[:, nh * hd:(nh + nkv) * hd], qkv[:, (nh + nkv) * hd:]
            else:
                q = lin("self_attn.q_proj", h, fam.qkv_bias)
                k = lin("self_attn.k_proj", h, fam.qkv_bias)
                v = lin("self_attn.v_proj", h, fam.qkv_bias)
            if fam.qk_norm == "full":
                q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
                k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
            q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
            if fam.qk_norm == "head":
                q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps, fam.norm_offset)
                k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps, fam.norm_offset)
            if rope:
                cos, sin = ropes[rope]
                q = apply_rope(q, cos, sin, rot, fam.interleaved)
                k = apply_rope(k, cos, sin, rot, fam.interleaved)
            if mt == "ministral3":
                rp, _ = rope_params(tc)
                beta = rp.get("llama_4_scaling_beta")
                if beta:
                    orig = rp["original_max_position_embeddings"]
                    q = q * (1 + beta * np.log(1 + np.floor(pos / orig)))[:, None, None]
            rep = nh // nkv
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("thd,shd->hts", q, k) * scaling
            if softcap:
                s = np.tanh(s / softcap) * softcap
            mask = np.triu(np.full((T, T), -np.inf), 1)
            if window:
                mask = mask + np.tril(np.full((T, T), -np.inf), -window)
            if groups is not None:
                g = np.asarray(groups)
                mask[(g[:, None] == g[None, :]) & (g[:, None] != 0)] = 0.0
            s = s + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd)
            return lin("self_attn.o_proj", o, fam.o_bias)

        def mlp(h):
            if fam.fused_gate_up:
                gu = lin("mlp.gate_up_proj", h)
                g, u = gu[:, :gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
            else:
                g, u = lin("mlp.gate_proj", h), lin("mlp.up_proj", h)
            return lin("mlp.down_proj", act(fam, g) * u)

        if fam.block == "pre":
            x = x + resid * attention(norm(x, p + "input_layernorm.weight"))
            x = x + resid * mlp(norm(x, p + "post_attention_layernorm.weight"))
        elif fam.block == "sandwich":
            x = x + norm(attention(norm(x, p + "input_layernorm.weight")), p + "post_attention_layernorm.weight")
            x = x + norm(mlp(norm(x, p + "pre_feedforward_layernorm.weight")), p + "post_feedforward_layernorm.weight")
        elif fam.block == "glm4":
            x = x + norm(attention(norm(x, p + "input_layernorm.weight")), p + "post_self_attn_layernorm.weight")
            x = x + norm(mlp(norm(x, p + "post_attention_layernorm.weight")), p + "post_mlp_layernorm.weight")
        elif fam.block == "post":
            x = x + norm(attention(x), p + "post_attention_layernorm.weight")
            x = x + norm(mlp(x), p + "post_feedforward_layernorm.weight")
        elif fam.block == "parallel":
            h = norm(x, p + "input_layernorm.weight")
            x = x + attention(h) + mlp(h)
        if deepstack is not None and i < len(deepstack):
            x[np.asarray(deepstack[i][0])] += deepstack[i][1]
    x = norm(x, pre + "model.norm.weight")
    head = W.get(pre + "lm_head.weight")
    if head is None or tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True)):
        head = W[pre + "model.embed_tokens.weight"]
    logits = x @ head.T
    if mt == "granite":
        logits = logits / tc.get("logits_scaling", 1.0)
    if mt == "cohere2":
        logits = logits * tc.get("logit_scale", 0.0625)
    fs = tc.get("final_logit_softcapping") if mt in ("gemma2", "gemma3_text") else None
    if fs:
        logits = np.tanh(logits / fs) * fs
    return logits


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
    n_prompt = len(man["prompt_ids"])
    seq = list(man["prompt_ids"])
    gen_ok = True
    n_cmp = 0
    for step, want in enumerate(man["greedy_ids"]):
        lg = forward(cfg, W, seq, n_prompt)[-1]
        got_id = int(np.argmax(lg))
        if got_id != want:
            gen_ok = man["greedy_top2_margins"][step] < man["tolerances"]["greedy_margin_min"]
            break
        n_cmp += 1
        seq.append(want)
    self_ref = "numpy" in man.get("reference", "")
    print("%-28s logits max_abs %.2e rel_l2 %.2e  greedy %d/%d  %s%s" %
          (man["name"], err, rel, n_cmp, len(man["greedy_ids"]), "OK" if ok and gen_ok else "FAIL",
           "  (reference: this forward)" if self_ref else ""))
    return ok and gen_ok


def main():
    args = sys.argv[1:]
    if not args or args == ["--all"]:
        base = os.path.join(ROOT, "tests", "golden", "fixtures")
        args = [os.path.join(base, d) for d in sorted(os.listdir(base))
                if os.path.isfile(os.path.join(base, d, "manifest.json"))]
    results = []
    for d in args:
        try:
            results.append(check(d))
        except Exception as e:  # one broken fixture must not hide the others
            print("%-28s ERROR %s: %s" % (os.path.basename(d.rstrip("/")), type(e).__name__, e))
            results.append(False)
    n_ok = sum(results)
    print("%d passed, %d failed" % (n_ok, len(results) - n_ok))
    sys.exit(0 if all(results) and results else 1)


if __name__ == "__main__":
    main()
