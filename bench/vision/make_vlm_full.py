#!/usr/bin/env python3
"""A whole random-weight vision-language checkpoint for time-to-first-token measurements: the vision
tower and projector of a bench/vision/make_synth.py checkpoint (real tower shapes, one-layer text
stand-in) with the text model replaced by a full-depth synthetic one of `smelt bench --synthetic SHAPE
--bits 4 --dir DIR` (the same hidden size), its tensors renamed under "language_model." as mlx-vlm
writes them. Weights are random: only the time of the computation means anything.

  python3 bench/vision/make_vlm_full.py VSYNTH_DIR TEXT_SYNTH_DIR OUT_DIR
  e.g. make_synth.py qwen2_5_vl_7b /tmp/v; smelt bench --synthetic qwen2.5-7b --bits 4 --dir /tmp ...;
       make_vlm_full.py /tmp/v /tmp/smelt-bench-qwen2.5-7b-q4-g64 /tmp/qwen2_5_vl_7b_full
"""
import json
import os
import shutil
import struct
import sys

# Qwen2.5-VL's chat template (its tokenizer_config.json's, without the video branch), for the server's
# chat completions: the random-weight checkpoints of make_synth.py ship none
QWEN_VL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or "
    "'image_url' in content %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'text' "
    "or 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

TEXT_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "vocab_size", "max_position_embeddings", "max_window_layers", "head_dim", "rope_theta", "tie_word_embeddings")


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    vdir, tdir, out = sys.argv[1:]
    vpath, tpath = os.path.join(vdir, "model.safetensors"), os.path.join(tdir, "model.safetensors")
    vh, vbase = header(vpath)
    th, tbase = header(tpath)
    vcfg = json.load(open(os.path.join(vdir, "config.json")))
    tcfg = json.load(open(os.path.join(tdir, "config.json")))
    if vcfg.get("hidden_size", vcfg.get("text_config", {}).get("hidden_size")) != tcfg["hidden_size"]:
        sys.exit("make_vlm_full: the text model's hidden size %d differs from the projector's output" % tcfg["hidden_size"])
    # (name, source file, source offset, length, dtype, shape): the tower from vdir, the text model from tdir
    parts = [(k, vpath, vbase + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0], v["dtype"], v["shape"])
             for k, v in vh.items() if k != "__metadata__" and not k.startswith("language_model.")]
    parts += [("language_model." + k, tpath, tbase + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0],
               v["dtype"], v["shape"]) for k, v in th.items() if k != "__metadata__"]
    hdr, off = {"__metadata__": {"format": "mlx"}}, 0
    for name, _, _, n, dt, shape in parts:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(hdr, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        srcs = {}
        for _, src, so, n, _, _ in parts:
            g = srcs.setdefault(src, open(src, "rb"))
            g.seek(so)
            while n:
                b = g.read(min(n, 1 << 26))
                f.write(b)
                n -= len(b)
    for k in TEXT_KEYS:
        if k in tcfg:
            vcfg[k] = tcfg[k]
            if isinstance(vcfg.get("text_config"), dict):
                vcfg["text_config"][k] = tcfg[k]
    json.dump(vcfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    for f in os.listdir(vdir):
        if f not in ("model.safetensors", "config.json"):
            shutil.copy(os.path.join(vdir, f), os.path.join(out, f))
    tc_path = os.path.join(out, "tokenizer_config.json")
    tc = json.load(open(tc_path)) if os.path.exists(tc_path) else {}
    if not tc.get("chat_template") and vcfg.get("model_type") == "qwen2_5_vl":
        tc["chat_template"] = QWEN_VL_TEMPLATE
        json.dump(tc, open(tc_path, "w"))
    print("%s: %d tensors, %.2f GB" % (out, len(parts), (off + len(hb) + 8) / 1e9))


if __name__ == "__main__":
    main()
