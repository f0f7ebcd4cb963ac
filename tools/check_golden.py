#!/usr/bin/env python3
"""Independent check of a golden fixture (numpy only, no torch):
re-read model.safetensors, dequantize the MLX-packed weights with a generic bit-stream
unpacker (independent of the packer in tools/mlxq.py), run a float64 forward pass written from
the transformers modeling code of each family, and compare with the recorded logits and greedy ids.

Families (config model_type): llama, mistral, ministral3, qwen2, qwen3, smollm3, granite, gemma,
gemma2, gemma3_text, phi3, olmo2, olmo3, exaone4, glm4, cohere2, the mixtures of experts qwen3_moe,
qwen2_moe, mixtral, gpt_oss and glm4_moe (stacked experts, routing as transformers' code, attention sinks),
and the text models of the vision-language packagings gemma3, mistral3, qwen2_5_vl, qwen3_vl, qwen3_5 (weights
under "language_model.", vision tensors ignored). Hybrid families (recurrent layers next to attention, each
recurrence run token by token from a zero state, as transformers' recurrent reference functions do):
qwen3_5_text and qwen3_next (Gated DeltaNet, gated attention), lfm2 (gated short convolution),
nemotron_h and granitemoehybrid (Mamba-2), and the hybrid mixtures of experts qwen3_5_moe_text and
qwen3_next (softmax routing, shared expert with its sigmoid gate) and lfm2_moe (sigmoid routing steered by
expert_bias). Gemma 4 (gemma4_text, and the gemma4 vision-language packaging): plain-weight RMSNorms, q/k norms
and an unweighted v norm, attention scale 1, a global head size on full-attention layers (attention_k_eq_v: their
values the raw k_proj output), proportional RoPE, KV sharing across the last num_kv_shared_layers layers,
double-wide MLPs there, per-layer inputs, layer_scalar, final softcap, and enable_moe_block (the 26B-A4B
layers: a softmax-routed mixture of experts with per-expert scales beside every dense MLP). Quantization: MLX
affine and the microscaling modes mxfp4, mxfp8, nvfp4 (per module). RoPE: default, linear, llama3, dynamic,
yarn, longrope, mrope (text positions), partial and interleaved rotary, per-layer theta, NoPE layers.

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
VLM_TEXT_TYPE = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "mistral3": "mistral", "qwen2_5_vl": "qwen2_5_vl_text",
                 "qwen3_vl": "qwen3_vl_text", "qwen3_5": "qwen3_5_text",
                 "qwen3_5_moe": "qwen3_5_moe_text"}
# hybrid families: recurrent layers (Gated DeltaNet, short convolution, Mamba-2) next to attention
HYBRID = ("qwen3_5_text", "qwen3_next", "lfm2", "nemotron_h", "granitemoehybrid", "qwen3_5_moe_text", "lfm2_moe")
# a hybrid MoE family: the layers of its dense twin, with mixtures of experts as MLPs
HYBRID_BASE = {"qwen3_5_moe_text": "qwen3_5_text", "lfm2_moe": "lfm2"}


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
        elif dt == "U8":
            arr = np.frombuffer(raw, np.uint8)
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


MODE_SHAPE = {"mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}  # MLX's group size, bits per mode


def quant_params(q, module):
    """(group_size, bits, mode) of a module: the block's, or its entry's read as MLX's to_quantized(**entry)
    (a missing mode is affine; missing bits / group size are that mode's defaults)"""
    p = q.get(module)
    if p is None and module.startswith("language_model."):
        p = q.get(module[len("language_model."):])
    if p is None:
        p = q.get("language_model." + module)
    if isinstance(p, dict):
        mode = p.get("mode", "affine")
        G, B = MODE_SHAPE[mode] if mode != "affine" else (64, 4)
        return p.get("group_size", G), p.get("bits", B), mode
    mode = q.get("mode", "affine")
    return q.get("group_size", 64), q.get("bits", 4), mode


# the values of MLX's microscaling codes (mlx/backend/cpu/quantized.cpp, metal fp8.h): written out here from
# their definitions (E8M0 2^(c-127), 255 = inf; E4M3 via half precision: no NaN, 0x7F = 480; FP4 E2M1 table)
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def e4m3(c):
    c = np.asarray(c, dtype=np.int64)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.where(c & 128, -v, v)


def dequant(arr, scales, biases, G, B, mode):
    """one [rows, packed] weight -> float64 [rows, in]"""
    in_dim = arr.shape[1] * 32 // B
    assert scales.shape == (arr.shape[0], in_dim // G), (scales.shape, in_dim, G)
    codes = unpack_rows(arr, B, in_dim)
    assert codes.max() < (1 << B)
    if mode == "affine":
        return codes * np.repeat(scales.astype(np.float64), G, axis=1) + np.repeat(biases.astype(np.float64), G, axis=1)
    el = FP4[codes] if B == 4 else e4m3(codes)
    sc = np.asarray(scales, dtype=np.int64)
    sv = e4m3(sc) if mode == "nvfp4" else np.where(sc == 255, np.inf, 2.0 ** (sc - 127.0))
    return el * np.repeat(sv, G, axis=1)


def weights_from_st(cfg, st):
    """float64 weights by MLX name from a safetensors dict (dequantized; stacked experts stay 3-D)"""
    q = cfg.get("quantization")
    W = {}
    for name, arr in st.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is not None and module + ".scales" in st:
            assert q is not None, "quantized tensor without a quantization block"
            G, B, mode = quant_params(q, module)
            assert (mode == "affine") == (module + ".biases" in st), (name, mode)
            sc = st[module + ".scales"]
            bi = st.get(module + ".biases")
            if arr.ndim == 3:
                W[name] = np.stack([dequant(arr[e], sc[e], None if bi is None else bi[e], G, B, mode)
                                    for e in range(arr.shape[0])])
            else:
                W[name] = dequant(arr, sc, bi, G, B, mode)
        else:
            W[name] = arr.astype(np.float64)
    return W


def load_weights(fdir):
    cfg = json.load(open(os.path.join(fdir, "config.json")))
    st = read_safetensors(os.path.join(fdir, "model.safetensors"))
    return cfg, weights_from_st(cfg, st)


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
                        "olmo2": "full", "olmo3": "full", "qwen3_moe": "head"}.get(mt)
        if mt == "glm4_moe" and tc.get("use_qk_norm", False):
            self.qk_norm = "head"
        self.moe = MOE.get(mt)
        self.sinks = mt == "gpt_oss"
        self.interleaved = mt in ("glm4", "cohere2")
        self.act = "gelu_tanh" if self.gemma else "silu"
        act = tc.get("hidden_activation" if self.gemma else "hidden_act")
        if act is not None:
            self.act = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                        "gelu_fast": "gelu_tanh"}[act]
        # biases: which projections get them when attention_bias is true
        ab = bool(tc.get("attention_bias", mt == "gpt_oss"))
        self.qkv_bias = mt in ("qwen2", "qwen2_5_vl_text", "qwen2_moe") or (ab and mt not in (
            "mistral", "ministral3", "phi3", "exaone4", "mixtral"))
        self.o_bias = ab and mt not in ("mistral", "ministral3", "phi3", "exaone4", "qwen2", "qwen2_5_vl_text", "glm4",
                                        "qwen2_moe", "mixtral", "glm4_moe")


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
        elif mt == "gpt_oss":
            lt = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
        elif mt in ("qwen2", "qwen3", "qwen2_5_vl_text", "qwen3_vl_text", "qwen2_moe", "qwen3_moe"):
            use = tc.get("use_sliding_window", False) and sw is not None
            mwl = tc.get("max_window_layers", 28)
            lt = ["sliding_attention" if use and i >= mwl else "full_attention" for i in range(n)]
        elif mt in ("mistral", "ministral3", "phi3", "mixtral"):
            lt = ["sliding_attention" if sw else "full_attention" for i in range(n)]
        else:
            lt = ["full_attention"] * n
    out = []
    for i in range(n):
        sliding = lt[i] == "sliding_attention"
        window = sw if (sliding and sw) else 0
        if mt == "smollm3" and not tc.get("use_sliding_window", False):
            window = 0
        if mt in ("qwen2", "qwen3", "qwen2_5_vl_text", "qwen3_vl_text", "qwen2_moe", "qwen3_moe") and \
                not tc.get("use_sliding_window", False):
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
                                                    0.5 if fam.mt in ("glm4", "glm4_moe") else 1.0))
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

# ----------------------------------------------------------------------------------- mixtures of experts

# per family: the router and stacked experts (mlx-lm's names), the routing (transformers' SparseMoeBlock /
# router code), shared experts
MOE = {
    "qwen3_moe": dict(router="mlp.gate", experts="mlp.switch_mlp", route="softmax"),
    "qwen2_moe": dict(router="mlp.gate", experts="mlp.switch_mlp", route="softmax", shared="mlp.shared_expert",
                      shared_gate="mlp.shared_expert_gate"),
    "mixtral": dict(router="block_sparse_moe.gate", experts="block_sparse_moe.switch_mlp", route="softmax_norm"),
    "gpt_oss": dict(router="mlp.router", experts="mlp.experts", route="topk_softmax", bias=True),
    "glm4_moe": dict(router="mlp.gate", experts="mlp.switch_mlp", route="sigmoid", shared="mlp.shared_experts",
                     correction="mlp.gate.e_score_correction_bias"),
    "deepseek_v3": dict(router="mlp.gate", experts="mlp.switch_mlp", route="sigmoid", shared="mlp.shared_experts",
                        correction="mlp.gate.e_score_correction_bias"),
    # Qwen3NextSparseMoeBlock (Qwen3_5MoeSparseMoeBlock: the same, its router always renormalizes: the text
    # config has no norm_topk_prob)
    "qwen3_next": dict(router="mlp.gate", experts="mlp.switch_mlp", route="softmax", shared="mlp.shared_expert",
                       shared_gate="mlp.shared_expert_gate", norm_default=True),
    "qwen3_5_moe_text": dict(router="mlp.gate", experts="mlp.switch_mlp", route="softmax", shared="mlp.shared_expert",
                             shared_gate="mlp.shared_expert_gate", norm_default=True),
    # Lfm2MoeSparseMoeBlock: sigmoid scores; expert_bias (use_expert_bias) only steers the choice; the chosen
    # scores over their sum + 1e-6, times routed_scaling_factor
    "lfm2_moe": dict(router="feed_forward.gate", experts="feed_forward.switch_mlp", route="sigmoid",
                     correction="feed_forward.expert_bias", norm_eps=1e-6),
}
ROUTE_MARGINS = []  # the smallest gap between the k-th and (k+1)-th choice score of each routing (seed search)


def is_moe_layer(mt, tc, i):
    if mt in ("qwen3_moe", "qwen2_moe"):
        return i not in (tc.get("mlp_only_layers") or []) and (i + 1) % tc.get("decoder_sparse_step", 1) == 0
    if mt == "qwen3_next":
        return (tc.get("num_experts") or 0) > 0 and i not in (tc.get("mlp_only_layers") or []) and \
            (i + 1) % tc.get("decoder_sparse_step", 1) == 0
    if mt == "lfm2_moe":
        return i >= tc.get("num_dense_layers", 2)
    if mt == "granitemoehybrid":
        return (tc.get("num_local_experts") or 0) > 0
    if mt == "nemotron_h":
        return False  # its MoE layers are layers of their own ("E" in hybrid_override_pattern)
    if mt in HYBRID and mt != "qwen3_5_moe_text":
        return False
    if mt == "glm4_moe":
        return i >= tc.get("first_k_dense_replace", 1)
    if mt == "deepseek_v3":
        return i >= tc.get("first_k_dense_replace", 3) and i % tc.get("moe_layer_freq", 1) == 0
    return True


def top(v, k):
    """indices of the k largest, descending, ties to the lower index (torch.topk on distinct values)"""
    order = np.argsort(-v, kind="stable")
    if len(v) > k:
        ROUTE_MARGINS.append(float(v[order[k - 1]] - v[order[k]]))
    return order[:k]


def route(spec, tc, logits, corr):
    """(experts, weights) of one token"""
    k = tc["num_experts_per_tok"]
    r = spec["route"]
    if r in ("softmax", "softmax_norm"):
        p = np.exp(logits - logits.max())
        p /= p.sum()
        ids = top(p, k)
        w = p[ids]
        if r == "softmax_norm" or tc.get("norm_topk_prob", spec.get("norm_default", False)):
            w = w / w.sum()
        return ids, w
    if r == "topk_softmax":
        ids = top(logits, k)
        e = np.exp(logits[ids] - logits[ids].max())
        return ids, e / e.sum()
    s = 1 / (1 + np.exp(-logits))  # sigmoid routing, group-limited choice with the correction bias
    choice = s + corr
    G, kg = tc.get("n_group", 1), tc.get("topk_group", 1)
    per = len(s) // G
    gs = np.array([np.sort(choice[g * per:(g + 1) * per])[-2:].sum() for g in range(G)])
    keep = top(gs, kg) if G > kg else np.arange(G)
    mask = np.zeros(len(s), dtype=bool)
    for g in keep:
        mask[g * per:(g + 1) * per] = True
    ids = top(np.where(mask, choice, 0.0), k)
    w = s[ids]
    if tc.get("norm_topk_prob", True):
        w = w / (w.sum() + spec.get("norm_eps", 1e-20))
    return ids, w * tc.get("routed_scaling_factor", 1.0)


def moe_forward(sp, W, p, h, tc, actf):
    """a mixture-of-experts MLP (sp: its MOE entry) of the layer whose MLX names start with p"""
    lg = h @ W[p + sp["router"] + ".weight"].T
    if sp.get("bias"):
        lg = lg + W[p + sp["router"] + ".bias"]
    corr = W[p + sp["correction"]] if sp.get("correction") and p + sp["correction"] in W else 0.0
    ex = p + sp["experts"] + "."
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        ids, wts = route(sp, tc, lg[t], corr)
        for e, w in zip(ids, wts):
            g = W[ex + "gate_proj.weight"][e] @ h[t]
            u = W[ex + "up_proj.weight"][e] @ h[t]
            if sp.get("bias"):  # gpt-oss: biases and the clamped SwiGLU
                g, u = g + W[ex + "gate_proj.bias"][e], u + W[ex + "up_proj.bias"][e]
                lim, alpha = tc.get("swiglu_limit", 7.0), tc.get("swiglu_alpha", 1.702)
                g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
                y = W[ex + "down_proj.weight"][e] @ (g / (1 + np.exp(-alpha * g)) * (u + 1))
                y = y + W[ex + "down_proj.bias"][e]
            else:
                y = W[ex + "down_proj.weight"][e] @ (actf(g) * u)
            out[t] += w * y
    if sp.get("shared") and p + sp["shared"] + ".gate_proj.weight" in W:
        sh = p + sp["shared"] + "."
        y = (actf(h @ W[sh + "gate_proj.weight"].T) * (h @ W[sh + "up_proj.weight"].T)) @ \
            W[sh + "down_proj.weight"].T
        if sp.get("shared_gate"):
            y = y / (1 + np.exp(-(h @ W[p + sp["shared_gate"] + ".weight"].T)))
        out = out + y
    return out


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
    if mt == "gemma4_text":
        if any(a is not None for a in (embeds, rope_pos, deepstack, groups)):
            raise NotImplementedError("gemma4_text: image inputs")
        return forward_gemma4(cfg, W, ids, tc)
    if mt in HYBRID:
        if deepstack is not None or groups is not None:
            raise NotImplementedError("%s: deepstack / image groups in a hybrid model" % mt)
        return forward_hybrid(cfg, W, ids, tc, mt, embeds=embeds, rope_pos=rope_pos)
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
            if fam.sinks:  # gpt-oss: a sink logit per head joins the softmax, its share is dropped
                sk = W[p + "self_attn.sinks"][:, None, None]
                m = np.maximum(s.max(-1, keepdims=True), sk)
                s = np.exp(s - m)
                s /= s.sum(-1, keepdims=True) + np.exp(sk - m)
            else:
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd)
            return lin("self_attn.o_proj", o, fam.o_bias)

        def mla_attention(h):
            """DeepSeek-V3 (transformers' DeepseekV3Attention): queries through the q LoRA (or q_proj), the
            compressed KV and the shared rotated key from kv_a_proj_with_mqa, keys and values per head from
            kv_b_proj (or mlx-lm's split of it, embed_q / unembed_out), interleaved RoPE on the rope dims"""
            dn, dr, dc, dv = tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["kv_lora_rank"], tc["v_head_dim"]
            ab = bool(tc.get("attention_bias", False))
            if tc.get("q_lora_rank"):
                q = rmsnorm(lin("self_attn.q_a_proj", h, ab), W[p + "self_attn.q_a_layernorm.weight"], 1e-6)
                q = lin("self_attn.q_b_proj", q)
            else:
                q = lin("self_attn.q_proj", h)
            q = q.reshape(T, nh, dn + dr)
            kv = lin("self_attn.kv_a_proj_with_mqa", h, ab)
            c = rmsnorm(kv[:, :dc], W[p + "self_attn.kv_a_layernorm.weight"], 1e-6)
            if p + "self_attn.embed_q.weight" in W:
                kn = np.einsum("tc,hcn->thn", c, W[p + "self_attn.embed_q.weight"])
                v = np.einsum("tc,hvc->thv", c, W[p + "self_attn.unembed_out.weight"])
            else:
                kvb = W[p + "self_attn.kv_b_proj.weight"].reshape(nh, dn + dv, dc)
                kn = np.einsum("tc,hnc->thn", c, kvb[:, :dn])
                v = np.einsum("tc,hvc->thv", c, kvb[:, dn:])
            rp, _ = rope_params(tc)
            if rp["rope_type"] == "yarn":
                rp.setdefault("original_max_position_embeddings", tc["max_position_embeddings"])
            inv, af = inv_freq(rp, dr, tc, T)
            cos, sin = np.cos(pos[:, None] * inv) * af, np.sin(pos[:, None] * inv) * af
            qpe = apply_rope(q[..., dn:], cos, sin, dr, True)
            kpe = apply_rope(kv[:, None, dc:], cos, sin, dr, True)[:, 0]
            scale = (dn + dr) ** -0.5
            msa = rp.get("mscale_all_dim") if rp["rope_type"] != "default" else None
            if msa and rp.get("factor", 1.0) > 1:
                ms = 0.1 * msa * math.log(rp["factor"]) + 1.0
                scale = scale * ms * ms
            s = (np.einsum("thd,shd->hts", q[..., :dn], kn) + np.einsum("thd,sd->hts", qpe, kpe)) * scale
            s = s + np.triu(np.full((T, T), -np.inf), 1)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shv->thv", s, v).reshape(T, nh * dv)
            return lin("self_attn.o_proj", o, ab)

        if mt == "deepseek_v3":
            attention = mla_attention  # noqa: F811

        def moe(h):
            return moe_forward(fam.moe, W, p, h, tc, lambda g: act(fam, g))

        def mlp(h):
            if fam.moe and is_moe_layer(mt, tc, i):
                return moe(h)
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


# ----------------------------------------------------------------------------------- Gemma 4

def gemma4_layers(tc):
    """per layer of a gemma4_text model (transformers' Gemma4TextAttention / Gemma4TextMLP, mlx-lm's
    gemma4_text): full (bool), head_dim (global_head_dim on full layers), kv_heads (num_global_key_value_heads
    on full layers with attention_k_eq_v), k_eq_v (values = the raw k_proj output), src (the layer whose
    K/V it attends: itself, or for the last num_kv_shared_layers layers the last non-shared layer of its
    type), window (sliding layers: sliding_window), ffn (MLP width: twice intermediate_size on the shared
    layers with use_double_wide_mlp), moe (enable_moe_block: every layer's dense MLP has the mixture of experts
    beside it, Gemma4TextDecoderLayer's router / experts)"""
    n = tc["num_hidden_layers"]
    moe = bool(tc.get("enable_moe_block"))
    if moe and not (tc.get("num_experts") and tc.get("top_k_experts") and tc.get("moe_intermediate_size")):
        raise ValueError("gemma4_text: enable_moe_block without num_experts / top_k_experts / moe_intermediate_size")
    if tc.get("attention_bias"):
        raise NotImplementedError("gemma4_text: attention_bias")
    lt = tc.get("layer_types")
    if lt is None:  # transformers' default: 5 sliding then 1 full
        lt = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    hd = tc["head_dim"]
    ghd = tc.get("global_head_dim") or hd
    nkv = tc.get("num_key_value_heads") or tc["num_attention_heads"]
    S = tc.get("num_kv_shared_layers") or 0
    first_shared = n - S
    out = []
    for i in range(n):
        full = lt[i] == "full_attention"
        keqv = bool(tc.get("attention_k_eq_v")) and full
        kv = (tc.get("num_global_key_value_heads") or nkv) if keqv else nkv
        src = i
        if S > 0 and i >= first_shared:
            src = max(j for j in range(first_shared) if lt[j] == lt[i])
        shared = src != i
        F = tc["intermediate_size"] * (2 if tc.get("use_double_wide_mlp") and shared else 1)
        out.append(dict(full=full, head_dim=ghd if full else hd, kv_heads=kv, k_eq_v=keqv, src=src,
                        window=0 if full else (tc.get("sliding_window") or 0), ffn=F,
                        type=lt[i], moe=moe))
    return out


def gemma4_inv_freq(tc, layer):
    """Gemma4TextRotaryEmbedding's inverse frequencies of a layer type over the layer's whole head: default
    (1 / theta^(2i/d)), or proportional (modeling_rope_utils: the first int(partial * d // 2) frequencies
    1 / theta^(2i/d), the rest 0, all over factor)"""
    rp = dict((tc.get("rope_parameters") or {}).get(layer["type"]) or {})
    if not rp:  # transformers' Gemma4TextConfig defaults
        rp = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0} if layer["full"] \
            else {"rope_type": "default", "rope_theta": 10000.0}
    d = layer["head_dim"]
    base = rp.get("rope_theta", 10000.0)
    t = rp.get("rope_type", "default")
    if t == "default":
        return 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if t == "proportional":
        angles = int(rp.get("partial_rotary_factor", 1.0) * d // 2)
        inv = np.zeros(d // 2)
        inv[:angles] = 1.0 / (base ** (np.arange(0, 2 * angles, 2, dtype=np.float64) / d))
        return inv / rp.get("factor", 1.0)
    raise ValueError("gemma4_text: rope type %s not handled" % t)


def gelu_tanh(g):
    return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))


def gemma4_moe(W, p, x, tc, eps):
    """the mixture-of-experts half of a Gemma 4 MoE layer's feed-forward (transformers' Gemma4TextRouter /
    Gemma4TextExperts, mlx-lm's Router / Experts), on x, the residual stream after attention: the router reads
    RMSNorm(x) (no weight) * router.scale * hidden^-1/2, projects it to one score per expert, softmax, the top
    top_k_experts (torch.topk: the routing margin recorded in ROUTE_MARGINS), their probabilities renormalized to
    sum 1 and times router.per_expert_scale; the experts (GELU-tanh GLU, moe_intermediate_size wide; MLX names
    experts.switch_glu.gate_proj / up_proj / down_proj, transformers' gate_up_proj split in halves) run on
    pre_feedforward_layernorm_2(x); their weighted sum, before post_feedforward_layernorm_2"""
    H, k = x.shape[-1], tc["top_k_experts"]
    r = rmsnorm(x, 1.0, eps) * W[p + "router.scale"] * H ** -0.5
    lg = r @ W[p + "router.proj.weight"].T
    pes = W[p + "router.per_expert_scale"]
    h = rmsnorm(x, W[p + "pre_feedforward_layernorm_2.weight"], eps)
    ex = p + "experts.switch_glu."
    wg, wu, wd = (W[ex + m + ".weight"] for m in ("gate_proj", "up_proj", "down_proj"))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        pr = np.exp(lg[t] - lg[t].max())
        pr /= pr.sum()
        ids = top(pr, k)
        wts = pr[ids] / pr[ids].sum() * pes[ids]
        for e, w in zip(ids, wts):
            out[t] += w * (wd[e] @ (gelu_tanh(wg[e] @ h[t]) * (wu[e] @ h[t])))
    return out


def forward_gemma4(cfg, W, ids, tc):
    """logits [T, vocab] of a gemma4_text model (float64), as transformers' Gemma4ForCausalLM computes them
    (modeling_gemma4.py): RMSNorm x * (mean(x^2) + eps)^-0.5 * w (plain w); the embedding times sqrt(hidden);
    per-layer inputs ((RMSNorm(per_layer_model_projection(x) / sqrt(hidden)) + the per-layer table's rows times
    sqrt(P)) / sqrt(2)); per layer: q/k RMSNorm per head, v RMSNorm without weight, RoPE (rotate-half) over the
    whole head, attention scale 1, causal with the sliding window on sliding layers, K/V of the source layer on
    KV-shared layers; sandwich norms; GELU-tanh MLP (enable_moe_block: post_feedforward_layernorm_1 of it plus
    post_feedforward_layernorm_2 of the mixture of experts, gemma4_moe, both before post_feedforward_layernorm);
    the per-layer input gate; times layer_scalar; final norm, tied head, final_logit_softcapping"""
    pre = "language_model." if any(k.startswith("language_model.") for k in W) else ""
    m = pre + "model."
    H, n, nh = tc["hidden_size"], tc["num_hidden_layers"], tc["num_attention_heads"]
    eps = tc.get("rms_norm_eps", 1e-6)
    P = tc.get("hidden_size_per_layer_input") or 0
    ids = np.asarray(ids)
    T = len(ids)
    layers = gemma4_layers(tc)
    pos = np.arange(T, dtype=np.float64)
    x = W[m + "embed_tokens.weight"][ids] * math.sqrt(H)
    if P:
        tok = W[m + "embed_tokens_per_layer.weight"][ids].reshape(T, n, P) * math.sqrt(P)
        proj = (x @ W[m + "per_layer_model_projection.weight"].T) * H ** -0.5
        proj = rmsnorm(proj.reshape(T, n, P), W[m + "per_layer_projection_norm.weight"], eps)
        pli = (proj + tok) * 2.0 ** -0.5
    kv = {}
    for i, ly in enumerate(layers):
        p = m + "layers.%d." % i
        d = ly["head_dim"]
        inv = gemma4_inv_freq(tc, ly)
        cos, sin = np.cos(pos[:, None] * inv), np.sin(pos[:, None] * inv)

        def lin(name, inp):
            return inp @ W[p + name + ".weight"].T

        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = rmsnorm(lin("self_attn.q_proj", h).reshape(T, nh, d), W[p + "self_attn.q_norm.weight"], eps)
        q = apply_rope(q, cos, sin, d, False)
        if ly["src"] == i:
            k = lin("self_attn.k_proj", h).reshape(T, ly["kv_heads"], d)
            v = k if ly["k_eq_v"] else lin("self_attn.v_proj", h).reshape(T, ly["kv_heads"], d)
            k = apply_rope(rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps), cos, sin, d, False)
            v = rmsnorm(v, 1.0, eps)
            kv[i] = (k, v)
        k, v = kv[ly["src"]]
        rep = nh // k.shape[1]
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * 1.0 + np.triu(np.full((T, T), -np.inf), 1)
        if ly["window"]:
            s = s + np.tril(np.full((T, T), -np.inf), -ly["window"])
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = lin("self_attn.o_proj", np.einsum("hts,shd->thd", s, v).reshape(T, nh * d))
        x = x + rmsnorm(o, W[p + "post_attention_layernorm.weight"], eps)
        h = rmsnorm(x, W[p + "pre_feedforward_layernorm.weight"], eps)
        y = lin("mlp.down_proj", gelu_tanh(lin("mlp.gate_proj", h)) * lin("mlp.up_proj", h))
        if ly["moe"]:
            y = rmsnorm(y, W[p + "post_feedforward_layernorm_1.weight"], eps) + \
                rmsnorm(gemma4_moe(W, p, x, tc, eps), W[p + "post_feedforward_layernorm_2.weight"], eps)
        x = x + rmsnorm(y, W[p + "post_feedforward_layernorm.weight"], eps)
        if P:
            g = gelu_tanh(lin("per_layer_input_gate", x)) * pli[:, i, :]
            x = x + rmsnorm(lin("per_layer_projection", g), W[p + "post_per_layer_input_norm.weight"], eps)
        x = x * W[p + "layer_scalar"]
    x = rmsnorm(x, W[m + "norm.weight"], eps)
    head = W.get(pre + "lm_head.weight")
    if head is None or tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True)):
        head = W[m + "embed_tokens.weight"]
    logits = x @ head.T
    cap = tc.get("final_logit_softcapping")
    if cap:
        logits = np.tanh(logits / cap) * cap
    return logits


# ----------------------------------------------------------------------------------- hybrid models

def silu(x):
    return x / (1 + np.exp(-x))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def hybrid_layer_types(mt, tc, n):
    """per layer: "attention", "recurrent" or "mlp" (transformers' config classes)"""
    mt = HYBRID_BASE.get(mt, mt)
    lt = tc.get("layer_types") or tc.get("layers_block_type")
    pat = tc.get("hybrid_override_pattern")
    if mt == "nemotron_h" and pat is not None and lt is None:
        lt = [{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}[ch] for ch in pat]
    if lt is None:
        if mt in ("qwen3_5_text", "qwen3_next"):
            iv = tc.get("full_attention_interval", 4)
            lt = ["linear_attention" if (i + 1) % iv else "full_attention" for i in range(n)]
        elif mt == "lfm2":
            fa = tc.get("full_attn_idxs")
            fa = range(n) if fa is None else fa
            lt = ["full_attention" if i in fa else "conv" for i in range(n)]
        else:
            lt = ["mamba"] * n
    kind = {"full_attention": "attention", "attention": "attention", "linear_attention": "recurrent",
            "mamba": "recurrent", "conv": "recurrent", "mlp": "mlp"}
    return [kind[t] for t in lt]


def causal_conv(x, w, b=None):
    """depthwise causal conv over time: x [T, C], w [C, K] (zero history), + bias"""
    T, C = x.shape
    K = w.shape[1]
    xp = np.concatenate([np.zeros((K - 1, C)), x], axis=0)
    y = np.zeros((T, C))
    for j in range(K):
        y += xp[j:j + T] * w[:, j]
    return y + (b if b is not None else 0)


def conv_weight(W, name):
    w = W[name]  # MLX: [C, K, 1]
    return w.reshape(w.shape[0], -1)


def sdpa(q, k, v, scale):
    """causal attention: q [T, nh, hd], k/v [T, nkv, hd]"""
    T, nh, hd = q.shape
    rep = nh // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum("thd,shd->hts", q, k) * scale + np.triu(np.full((T, T), -np.inf), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd)


def rope_half(v, pos, theta, rot):
    """rotate-half RoPE on the first rot dims of v [T, heads, hd] (default RoPE)"""
    inv = 1.0 / (theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    v = v.copy()
    h = rot // 2
    a, b = v[..., :h].copy(), v[..., h:rot].copy()
    v[..., :h] = a * c - b * s
    v[..., h:rot] = a * s + b * c
    return v


def gated_delta_net(W, p, h, tc, mt, eps):
    """Qwen3_5GatedDeltaNet / Qwen3NextGatedDeltaNet with torch_recurrent_gated_delta_rule"""
    T = h.shape[0]
    nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    dk, dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    r = nv // nk
    if mt == "qwen3_next":  # fix_query_key_value_ordering: grouped per key head
        qkvz = (h @ W[p + "in_proj_qkvz.weight"].T).reshape(T, nk, 2 * dk + 2 * r * dv)
        q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
        v, z = qkvz[..., 2 * dk:2 * dk + r * dv], qkvz[..., 2 * dk + r * dv:]
        ba = (h @ W[p + "in_proj_ba.weight"].T).reshape(T, nk, 2 * r)
        b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
        mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1)
        z = z.reshape(T, nv, dv)
    else:
        mixed = h @ W[p + "in_proj_qkv.weight"].T
        z = (h @ W[p + "in_proj_z.weight"].T).reshape(T, nv, dv)
        b = h @ W[p + "in_proj_b.weight"].T
        a = h @ W[p + "in_proj_a.weight"].T
    mixed = silu(causal_conv(mixed, conv_weight(W, p + "conv1d.weight")))
    q = mixed[:, :nk * dk].reshape(T, nk, dk)
    k = mixed[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
    v = mixed[:, 2 * nk * dk:].reshape(T, nv, dv)
    beta = 1 / (1 + np.exp(-b))
    g = -np.exp(W[p + "A_log"]) * softplus(a + W[p + "dt_bias"])
    q, k = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)  # repeat_interleave
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / math.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    S = np.zeros((nv, dk, dv))
    out = np.zeros((T, nv, dv))
    for t in range(T):
        S = S * np.exp(g[t])[:, None, None]
        kv_mem = (S * k[t][:, :, None]).sum(1)
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = (S * q[t][:, :, None]).sum(1)
    # Qwen3_5RMSNormGated: normalized, weighted, then times silu(gate)
    out = rmsnorm(out, W[p + "norm.weight"], eps) * silu(z)
    return out.reshape(T, nv * dv) @ W[p + "out_proj.weight"].T


def mamba2(W, p, h, tc, mt, eps):
    """Mamba-2 mixer (Zamba2MambaMixer / BambaMixer torch_forward, token by token)"""
    T = h.shape[0]
    if mt == "nemotron_h":
        nh, P, N, G = tc["mamba_num_heads"], tc["mamba_head_dim"], tc["ssm_state_size"], tc["n_groups"]
    else:
        nh, N, G = tc["mamba_n_heads"], tc["mamba_d_state"], tc["mamba_n_groups"]
        P = tc.get("mamba_d_head", "auto")
        if P == "auto":
            P = tc.get("mamba_expand", 2) * tc["hidden_size"] // nh
    I = nh * P
    lim = tc.get("time_step_limit", (0.0, float("inf")))
    proj = h @ W[p + "in_proj.weight"].T
    if p + "in_proj.bias" in W:
        proj = proj + W[p + "in_proj.bias"]
    gate, xbc, dt = proj[:, :I], proj[:, I:proj.shape[1] - nh], proj[:, proj.shape[1] - nh:]
    xbc = silu(causal_conv(xbc, conv_weight(W, p + "conv1d.weight"), W.get(p + "conv1d.bias")))
    x, B, C = xbc[:, :I].reshape(T, nh, P), xbc[:, I:I + G * N].reshape(T, G, N), xbc[:, I + G * N:].reshape(T, G, N)
    dt = np.clip(softplus(dt + W[p + "dt_bias"]), lim[0], lim[1])
    A = -np.exp(W[p + "A_log"])
    hg = np.arange(nh) // (nh // G)
    S = np.zeros((nh, P, N))
    y = np.zeros((T, nh, P))
    for t in range(T):
        S = np.exp(dt[t] * A)[:, None, None] * S + (dt[t][:, None] * x[t])[:, :, None] * B[t][hg][:, None, :]
        y[t] = (S * C[t][hg][:, None, :]).sum(-1) + W[p + "D"][:, None] * x[t]
    y = y.reshape(T, I) * silu(gate)
    gs = I // G if mt == "nemotron_h" else I  # Nemotron-H: one norm per group
    yg = y.reshape(T, I // gs, gs)
    y = (yg / np.sqrt((yg * yg).mean(-1, keepdims=True) + eps)).reshape(T, I) * W[p + "norm.weight"]
    out = y @ W[p + "out_proj.weight"].T
    if p + "out_proj.bias" in W:
        out = out + W[p + "out_proj.bias"]
    return out


def forward_hybrid(cfg, W, ids, tc, mt, embeds=None, rope_pos=None):
    """logits [T, vocab] of a hybrid model's prompt ids (float64). Images (Qwen3.5, tools/golden_vision.py):
    embeds = (rows, [len(rows), hidden]) input embeddings of those rows; rope_pos [3, T]: M-RoPE positions of
    the attention layers (the rope dict's mrope_section, interleaved, on the partial rotary dims; without
    them, text positions: the M-RoPE of three equal positions is the plain RoPE)"""
    moe_mt, mt = mt, HYBRID_BASE.get(mt, mt)  # the MoE variants: the layers of the dense family
    pre = "language_model." if any(k.startswith("language_model.") for k in W) else ""
    root = pre + ("backbone." if mt == "nemotron_h" else "model.")
    H, nh = tc["hidden_size"], tc["num_attention_heads"]
    nkv = tc.get("num_key_value_heads") or nh
    hd = tc.get("head_dim") or H // nh
    if mt in ("lfm2", "granitemoehybrid"):
        hd = H // nh
    eps = tc.get("rms_norm_eps", tc.get("norm_eps", tc.get("layer_norm_epsilon", 1e-6)))
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    rp, _ = rope_params(tc)
    theta = rp["rope_theta"] if "rope_theta" in rp else tc.get("rope_theta", tc.get("theta", 10000.0))
    n = tc["num_hidden_layers"]
    if mt == "nemotron_h" and tc.get("hybrid_override_pattern"):
        n = len(tc["hybrid_override_pattern"])
    kinds = hybrid_layer_types(mt, tc, n)
    mult = mt == "granitemoehybrid"
    x = W[root + ("embeddings.weight" if mt == "nemotron_h" else "embed_tokens.weight")][ids].copy()
    if mult:
        x = x * tc.get("embedding_multiplier", 1.0)
    if embeds is not None:
        x[np.asarray(embeds[0])] = embeds[1]
    if rope_pos is not None and mt != "qwen3_5_text":
        raise NotImplementedError("%s: M-RoPE positions" % mt)
    resid = tc.get("residual_multiplier", 1.0) if mult else 1.0
    # Qwen3-Next/3.5's RMSNorms scale by (1 + w): the MLX converter stored 1 + w, which is what W holds
    for i, kind in enumerate(kinds):
        p = root + "layers.%d." % i

        def lin(name, inp):
            return inp @ W[p + name + ".weight"].T + (W[p + name + ".bias"] if p + name + ".bias" in W else 0)

        def attention(h, a):
            if mt in ("qwen3_5_text", "qwen3_next"):  # q_proj: per head q | gate
                qg = lin(a + "q_proj", h).reshape(T, nh, 2 * hd)
                q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
            else:
                q, gate = lin(a + "q_proj", h).reshape(T, nh, hd), None
            k = lin(a + "k_proj", h).reshape(T, nkv, hd)
            v = lin(a + "v_proj", h).reshape(T, nkv, hd)
            qn = {"lfm2": "q_layernorm", "qwen3_5_text": "q_norm", "qwen3_next": "q_norm"}.get(mt)
            if qn:
                q = rmsnorm(q, W[p + a + qn + ".weight"], eps)
                k = rmsnorm(k, W[p + a + qn.replace("q_", "k_") + ".weight"], eps)
            rope = mt in ("lfm2", "qwen3_5_text", "qwen3_next") or (
                mt == "granitemoehybrid" and tc.get("position_embedding_type") == "rope")
            if rope:
                prf = rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 1.0))
                if mt in ("qwen3_5_text", "qwen3_next") and "partial_rotary_factor" not in rp and \
                        "partial_rotary_factor" not in tc:
                    prf = 0.25
                rot = int(hd * prf)
                if rope_pos is not None:
                    # Qwen3_5TextRotaryEmbedding: M-RoPE always interleaved (it reads no mrope_interleaved),
                    # mrope_section [11, 11, 10] when the rope dict has none; rotate-half on the rot dims
                    mr = dict(tc.get("rope_scaling") or tc.get("rope_parameters") or {})
                    mr.setdefault("mrope_section", [11, 11, 10])
                    mr["mrope_interleaved"] = True
                    mc, ms = mrope_tables({"rope_parameters": mr, "rope_theta": theta}, rot, rope_pos)
                    q, k = apply_rope(q, mc, ms, rot, False), apply_rope(k, mc, ms, rot, False)
                else:
                    q, k = rope_half(q, pos, theta, rot), rope_half(k, pos, theta, rot)
            scale = tc.get("attention_multiplier", 1.0) if mult else hd ** -0.5
            o = sdpa(q, k, v, scale)
            if gate is not None:
                o = o * (1 / (1 + np.exp(-gate)))
            return lin(a + ("out_proj" if mt == "lfm2" else "o_proj"), o)

        def mlp(h):
            if is_moe_layer(moe_mt, tc, i):
                if moe_mt not in MOE:
                    raise NotImplementedError("%s: layer %d is a mixture of experts, which this forward does not "
                                              "have for the family" % (moe_mt, i))
                return moe_forward(MOE[moe_mt], W, p, h, tc, silu)
            if moe_mt == "lfm2_moe":  # mlx-lm's sanitize names w1 / w3 / w2 as gate / up / down
                return lin("feed_forward.down_proj", silu(lin("feed_forward.gate_proj", h)) * lin("feed_forward.up_proj", h))
            if mt == "nemotron_h":
                u = np.maximum(lin("mixer.up_proj", h), 0)
                return lin("mixer.down_proj", u * u)
            if mt == "lfm2":
                return lin("feed_forward.w2", silu(lin("feed_forward.w1", h)) * lin("feed_forward.w3", h))
            return lin("mlp.down_proj", silu(lin("mlp.gate_proj", h)) * lin("mlp.up_proj", h))

        if mt == "nemotron_h":  # one block per layer
            h = rmsnorm(x, W[p + "norm.weight"], eps)
            if kind == "recurrent":
                x = x + mamba2(W, p + "mixer.", h, tc, mt, eps)
            elif kind == "attention":
                x = x + attention(h, "mixer.")
            else:
                x = x + mlp(h)
            continue
        n1, n2 = ("operator_norm", "ffn_norm") if mt == "lfm2" else ("input_layernorm", "post_attention_layernorm")
        h = rmsnorm(x, W[p + n1 + ".weight"], eps)
        if kind == "attention":
            r = attention(h, "self_attn.")
        elif mt == "lfm2":  # Lfm2ShortConv: conv(B * x), times C
            bcx = lin("conv.in_proj", h)
            Bm, Cm, xx = bcx[:, :H], bcx[:, H:2 * H], bcx[:, 2 * H:]
            r = lin("conv.out_proj", Cm * causal_conv(Bm * xx, conv_weight(W, p + "conv.conv.weight"),
                                                      W.get(p + "conv.conv.bias")))
        elif mt == "granitemoehybrid":
            r = mamba2(W, p + "mamba.", h, tc, mt, eps)
        else:
            r = gated_delta_net(W, p + "linear_attn.", h, tc, mt, eps)
        x = x + resid * r
        x = x + resid * mlp(rmsnorm(x, W[p + n2 + ".weight"], eps))
    x = rmsnorm(x, W[root + {"lfm2": "embedding_norm", "nemotron_h": "norm_f"}.get(mt, "norm") + ".weight"], eps)
    head = W.get(pre + "lm_head.weight")
    if head is None or tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", mt == "lfm2")):
        head = W[root + ("embeddings.weight" if mt == "nemotron_h" else "embed_tokens.weight")]
    logits = x @ head.T
    if mult:
        logits = logits / tc.get("logits_scaling", 1.0)
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
