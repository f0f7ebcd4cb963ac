"""MLX-format writing helpers (numpy only): affine quantization exactly as MLX's
mx.quantize (mlx/backend/cpu/quantized.cpp `quantize`), MLX bit packing, bf16
conversion and a minimal safetensors writer.

Quantization (per group of G consecutive elements along the input dim), all in float32:
    n_bins = 2^bits - 1, eps = 1e-7
    w_min, w_max = group min/max
    mask  = |w_min| > |w_max|
    scale = max((w_max - w_min) / n_bins, eps);  scale = mask ? scale : -scale
    edge  = mask ? w_min : w_max
    q0    = rint(edge / scale);  bias = 0
    if q0 != 0: scale = edge / q0; bias = edge
    q     = clip(rint((w - bias) / scale), 0, n_bins)
    stored scales/biases: cast to the model dtype (bf16 / f16)
    dequantized weight: w' = scale * q + bias   (with the stored, rounded scale and bias)
Note that scales can be negative.

Packing: each row is a little-endian bit stream in uint32 words; element j of a row
occupies bits [j*bits, (j+1)*bits).  For bits 2/4/8 that is word j/(32/bits), shift
(j % (32/bits))*bits; for 3/5/6 MLX writes packs of 8 (3, 5 bits) or 4 (6 bits)
elements as 3/5/3 little-endian bytes, which is the same bit stream.
"""
import json
import struct

import numpy as np


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit pattern (uint16)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounding = ((u >> 16) & 1) + 0x7FFF
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_bits_to_f32(b):
    b = np.ascontiguousarray(b, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_to_dtype(x, dtype):
    """Round float32 values to the storage dtype and return them as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bfloat16":
        return bf16_bits_to_f32(f32_to_bf16_bits(x)).reshape(x.shape)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "float32":
        return x.copy()
    raise ValueError(dtype)


def encode_dtype(x, dtype):
    """float32 array -> (safetensors dtype string, raw little-endian bytes)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bfloat16":
        return "BF16", f32_to_bf16_bits(x).astype("<u2").tobytes()
    if dtype == "float16":
        return "F16", x.astype("<f2").tobytes()
    if dtype == "float32":
        return "F32", x.astype("<f4").tobytes()
    raise ValueError(dtype)


def mlx_quantize(w, group_size, bits, dtype):
    """w: float32 [out, in] already rounded to the model dtype.
    Returns (q uint32 [out, in] codes, scales f32 [out, in/G] (dtype-rounded),
    biases f32 [out, in/G] (dtype-rounded))."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    out_dim, in_dim = w.shape
    assert in_dim % group_size == 0, (w.shape, group_size)
    g = w.reshape(-1, group_size)
    n_bins = np.float32((1 << bits) - 1)
    eps = np.float32(1e-7)
    w_max = g.max(axis=1)
    w_min = g.min(axis=1)
    mask = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, eps).astype(np.float32)
    scale = np.where(mask, scale, -scale).astype(np.float32)
    edge = np.where(mask, w_min, w_max).astype(np.float32)
    q0 = np.rint(edge / scale).astype(np.float32)
    nz = q0 != 0
    safe_q0 = np.where(nz, q0, np.float32(1))
    scale = np.where(nz, edge / safe_q0, scale).astype(np.float32)
    bias = np.where(nz, edge, np.float32(0)).astype(np.float32)
    q = np.rint((g - bias[:, None]) / scale[:, None]).astype(np.float32)
    q = np.clip(q, np.float32(0), n_bins).astype(np.uint32)
    scales = round_to_dtype(scale, dtype).reshape(out_dim, in_dim // group_size)
    biases = round_to_dtype(bias, dtype).reshape(out_dim, in_dim // group_size)
    return q.reshape(out_dim, in_dim), scales, biases


def mlx_dequantize_codes(q, scales, biases, group_size):
    out_dim, in_dim = q.shape
    s = np.repeat(scales.astype(np.float32), group_size, axis=1)
    b = np.repeat(biases.astype(np.float32), group_size, axis=1)
    return (s * q.astype(np.float32) + b).astype(np.float32)


def mlx_pack(q, bits):
    """q: uint32 codes [out, in] -> uint32 [out, in*bits/32] (LE bit stream per row)."""
    out_dim, in_dim = q.shape
    assert (in_dim * bits) % 32 == 0
    q = q.astype(np.uint64)
    if 32 % bits == 0:
        per = 32 // bits
        qq = q.reshape(out_dim, in_dim // per, per)
        words = np.zeros((out_dim, in_dim // per), dtype=np.uint64)
        for k in range(per):
            words |= qq[:, :, k] << np.uint64(k * bits)
        return words.astype(np.uint32)
    # 3/5/6 bits: packs of `per` elements into `nbytes` little-endian bytes, as MLX does
    per = 8 if bits in (3, 5) else 4
    nbytes = per * bits // 8
    qq = q.reshape(out_dim, in_dim // per, per)
    acc = np.zeros((out_dim, in_dim // per), dtype=np.uint64)
    for k in range(per):
        acc |= qq[:, :, k] << np.uint64(k * bits)
    by = np.zeros((out_dim, in_dim // per, nbytes), dtype=np.uint8)
    for i in range(nbytes):
        by[:, :, i] = ((acc >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.uint8)
    return by.reshape(out_dim, -1).view("<u4").astype(np.uint32)


def mlx_extract_bits_reference(packed_u32_row, bits, n):
    """Unpack one row exactly like MLX's CPU extract_bits() byte formulas (3/5/6 bits)
    or its shift loop (2/4/8); used to self-test mlx_pack."""
    w = np.ascontiguousarray(packed_u32_row, dtype="<u4").view(np.uint8)
    out = []
    if bits in (2, 4, 8):
        for byte in w:
            wi = int(byte)
            for _ in range(8 // bits):
                out.append(wi & ((1 << bits) - 1))
                wi >>= bits
    elif bits == 3:
        for p in range(0, len(w), 3):
            a, b, c = (int(v) for v in w[p:p + 3])
            out += [a & 0x7, (a & 0x38) >> 3, ((a & 0xc0) >> 6) + ((b & 0x1) << 2), (b & 0xe) >> 1,
                    (b & 0x70) >> 4, ((b & 0x80) >> 7) + ((c & 0x3) << 1), (c & 0x1c) >> 2, (c & 0xe0) >> 5]
    elif bits == 5:
        for p in range(0, len(w), 5):
            a, b, c, d, e = (int(v) for v in w[p:p + 5])
            out += [a & 0x1f, ((a & 0xe0) >> 5) + ((b & 0x3) << 3), (b & 0x7c) >> 2,
                    ((b & 0x80) >> 7) + ((c & 0xf) << 1), ((c & 0xf0) >> 4) + ((d & 0x1) << 4),
                    (d & 0x3e) >> 1, ((d & 0xc0) >> 6) + ((e & 0x7) << 2), (e & 0xf8) >> 3]
    elif bits == 6:
        for p in range(0, len(w), 3):
            a, b, c = (int(v) for v in w[p:p + 3])
            out += [a & 0x3f, ((a >> 6) & 0x03) + ((b & 0x0f) << 2), ((b >> 4) & 0x0f) + ((c & 0x03) << 4),
                    (c >> 2) & 0x3f]
    return np.array(out[:n], dtype=np.uint32)


def self_test():
    rng = np.random.default_rng(0)
    for bits in (2, 3, 4, 5, 6, 8):
        q = rng.integers(0, 1 << bits, size=(3, 128), dtype=np.uint32)
        p = mlx_pack(q, bits)
        assert p.shape == (3, 128 * bits // 32), (bits, p.shape)
        for r in range(3):
            got = mlx_extract_bits_reference(p[r], bits, 128)
            assert np.array_equal(got, q[r]), bits
    # microscaling: the packer and the independent unpacker agree; values within the mode's rounding
    for mode in MODES:
        w2 = rng.normal(size=(3, 64)).astype(np.float32)
        packed, sc, deq = mx_quantize(w2, mode)
        assert np.array_equal(mx_dequantize(packed, sc, mode, 64), deq), mode
        assert np.abs(deq - w2).max() <= 0.26 * np.abs(w2).max(), (mode, np.abs(deq - w2).max())
    assert e4m3_value(0x7F) == 480 and e4m3_value(0x01) == 2.0 ** -9 and e8m0_value(0) == 2.0 ** -127
    # quantize: most dequantized values within half a step of the input.  (Not all: MLX
    # snaps the scale so that the group's edge value is exact, which can clip the other end.)
    w = round_to_dtype(rng.normal(size=(4, 128)).astype(np.float32), "bfloat16")
    for bits in (2, 3, 4, 5, 6, 8):
        q, s, b = mlx_quantize(w, 64, bits, "float32")
        d = mlx_dequantize_codes(q, s, b, 64)
        step = np.repeat(np.abs(s), 64, axis=1)
        ok = np.abs(d - w) <= 0.5001 * step + 1e-6
        assert ok.mean() > 0.9, (bits, ok.mean())
    return True


# ------------------------------------------------------------------ microscaling modes (mxfp4, mxfp8, nvfp4)

FP4_LUT = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
MODES = {"mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}


def e4m3_value(c):
    """FP8 E4M3 code -> value as MLX's CPU/Metal code decodes it (no NaN: 0x7F is 480)"""
    c = np.asarray(c, dtype=np.int64)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.where(c & 128, -v, v)


def e8m0_value(c):
    c = np.asarray(c, dtype=np.int64)
    return np.where(c == 255, np.inf, 2.0 ** (c.astype(np.float64) - 127))


def e4m3_encode(x):
    """nearest E4M3 code of each value (ties to the lower code), saturating at 448, as a lookup"""
    codes = np.arange(256)
    vals = e4m3_value(codes)
    ok = (codes & 0x7F) != 0x7F  # MLX never writes 0x7F (its encoder saturates to 0x7E)
    codes, vals = codes[ok], vals[ok]
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    d = np.abs(x[:, None] - vals[None, :])
    d = d + (vals[None, :] == 0) * (np.signbit(vals)[None, :] != np.signbit(x)[:, None]) * 1e-30
    return codes[np.argmin(d, axis=1)].astype(np.uint8)


def mx_quantize(w, mode):
    """MLX's fp_quantize (mlx/ops.cpp, the CPU path), in float32: per group scale = max|w| / (6 or 448), an
    E8M0 code round(log2(scale)) + 127 (scale 0: code 127) or, for nvfp4, the E4M3 code of the scale; the
    elements w / scale as the nearest FP4 code (first of equals) or E4M3 code. Returns (packed uint32 [out,
    in*bits/32], scale codes uint8 [out, in/group], dequantized float64 [out, in])."""
    bits, gs = MODES[mode]
    w = np.ascontiguousarray(w, dtype=np.float32)
    rows, cols = w.shape
    g = w.reshape(-1, gs)
    amax = np.abs(g).max(axis=1).astype(np.float32)
    scale = amax / np.float32(6.0 if bits == 4 else 448.0)
    if gs == 16:
        sc = e4m3_encode(scale)
        sv = e4m3_value(sc)
    else:
        with np.errstate(divide="ignore"):
            e = np.where(scale == 0, 0, np.rint(np.log2(np.where(scale == 0, 1, scale))))
        e = np.clip(e, -127, 127)
        sc = (e + 127).astype(np.uint8)
        sv = e8m0_value(sc)
    wq = g / np.where(sv == 0, 1, sv)[:, None]
    if bits == 4:
        q = np.argmin(np.abs(wq[..., None] - FP4_LUT.astype(np.float64)), axis=-1).astype(np.uint8)
        deq = FP4_LUT[q].astype(np.float64) * sv[:, None]
        q = q.reshape(rows, cols)
        packed = np.zeros((rows, cols // 8), dtype=np.uint64)
        for k in range(8):
            packed |= q[:, k::8].astype(np.uint64) << np.uint64(4 * k)
        packed = packed.astype(np.uint32)
    else:
        q = e4m3_encode(wq).reshape(-1, gs)
        deq = e4m3_value(q) * sv[:, None]
        packed = np.ascontiguousarray(q.reshape(rows, cols)).view("<u4").astype(np.uint32)
    return packed, sc.reshape(rows, cols // gs), deq.reshape(rows, cols)


def mx_dequantize(packed, scales, mode, in_dim):
    """packed uint32 [out, in*bits/32] and scale codes -> float64 [out, in] (independent of mx_quantize)"""
    bits, gs = MODES[mode]
    by = np.ascontiguousarray(packed.astype("<u4")).view(np.uint8).reshape(packed.shape[0], -1)
    if bits == 4:
        codes = np.stack([by & 15, by >> 4], axis=-1).reshape(by.shape[0], -1)[:, :in_dim]
        el = FP4_LUT[codes].astype(np.float64)
    else:
        el = e4m3_value(by[:, :in_dim])
    sv = e4m3_value(scales) if mode == "nvfp4" else e8m0_value(scales)
    return el * np.repeat(sv, gs, axis=1)


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> (dtype_str, shape, raw bytes). Names are written sorted."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    names = sorted(tensors)
    for n in names:
        dt, shape, raw = tensors[n]
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            f.write(tensors[n][2])


def add_linear(tensors, name, w, dtype, qparams):
    """Store weight `name` (float32 [out,in], or [n, out, in] stacked experts) either quantized
    (qparams={'group_size','bits'[,'mode']}) or plain in dtype.  Returns the float32 weight the model
    actually sees (dequantized)."""
    w = round_to_dtype(w, dtype)
    if w.ndim == 3:  # stacked experts: each [out, in] quantized alike, the results stacked
        parts = [{} for _ in range(w.shape[0])]
        deq = np.stack([add_linear(parts[e], name, w[e], dtype, qparams) for e in range(w.shape[0])])
        for sfx in (".weight", ".scales", ".biases"):
            if name + sfx in parts[0]:
                dt, shape, _ = parts[0][name + sfx]
                tensors[name + sfx] = (dt, (w.shape[0],) + tuple(shape), b"".join(p[name + sfx][2] for p in parts))
        return deq
    if not qparams:
        dt, raw = encode_dtype(w, dtype)
        tensors[name + ".weight"] = (dt, w.shape, raw)
        return w
    if qparams.get("mode", "affine") != "affine":
        packed, sc, deq = mx_quantize(w, qparams["mode"])
        tensors[name + ".weight"] = ("U32", packed.shape, packed.astype("<u4").tobytes())
        tensors[name + ".scales"] = ("U8", sc.shape, sc.astype(np.uint8).tobytes())
        return deq.astype(np.float32)
    G, B = qparams["group_size"], qparams["bits"]
    q, s, b = mlx_quantize(w, G, B, dtype)
    packed = mlx_pack(q, B)
    tensors[name + ".weight"] = ("U32", packed.shape, packed.astype("<u4").tobytes())
    dt, raw = encode_dtype(s, dtype)
    tensors[name + ".scales"] = (dt, s.shape, raw)
    dt, raw = encode_dtype(b, dtype)
    tensors[name + ".biases"] = (dt, b.shape, raw)
    return mlx_dequantize_codes(q, s, b, G)


if __name__ == "__main__":
    print("self_test", self_test())
