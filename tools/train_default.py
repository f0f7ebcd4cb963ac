#!/usr/bin/env python3
"""Train smelt's embedded default model (smelt-tiny) and its speculative-decoding draft.

Input : the corpus made by tools/prepare_corpus.py (.dev/corpus/train.txt.xz, heldout.txt)
Output: OUT/smelt-tiny/        4-bit (group 64) MLX checkpoint + tokenizer + eval.json
        OUT/smelt-tiny-bf16/   the same model, unquantized bf16
        OUT/smelt-tiny-draft/  a smaller model, same tokenizer, 4-bit g64
Needs torch, transformers, tokenizers (run on the GPU box):
  python3 tools/train_default.py --corpus .dev/corpus --out models \
      --main-seconds 210 --draft-seconds 70
"""
import argparse
import json
import lzma
import math
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlxq  # noqa: E402

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CTX = 512

MAIN = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
            num_key_value_heads=2, head_dim=64)
DRAFT = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=3,
             num_key_value_heads=1, head_dim=64)


def log(*a):
    print("[%7.1fs]" % (time.time() - T0), *a, flush=True)


T0 = time.time()


def train_tokenizer(docs, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)])
    return tok


def hf_config(arch, vocab, ids):
    c = dict(arch)
    c.update(vocab_size=vocab, max_position_embeddings=CTX, rms_norm_eps=1e-5, rope_theta=10000.0,
             rope_scaling=None, hidden_act="silu", tie_word_embeddings=True, attention_bias=False,
             mlp_bias=False, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
             pad_token_id=ids["pad"], initializer_range=0.02, model_type="llama",
             architectures=["LlamaForCausalLM"], torch_dtype="bfloat16")
    return c


def make_model(c, dtype=None):
    from transformers import AutoConfig, AutoModelForCausalLM
    kw = {k: v for k, v in c.items() if k not in ("model_type", "architectures", "torch_dtype", "rope_scaling")}
    cfg = AutoConfig.for_model("llama", **kw)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    d = c["head_dim"]
    want = 1.0 / (c["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d))
    have = model.model.rotary_emb.inv_freq.detach().cpu().double().numpy()
    assert np.allclose(have, want, rtol=1e-5), (have, want)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (c["num_attention_heads"] * d, c["hidden_size"])
    return model


def add_dropout(model, p):
    """Residual-branch dropout (after o_proj and after the MLP) for training only; HF Llama
    has none, and the corpus is small (~3.6M tokens) so the model overfits without it."""
    import torch.nn.functional as F

    def hook(mod, inp, out):
        return F.dropout(out, p, mod.training)
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


def train(c, data, val, seconds, label, seed, lr=2e-3, batch=64, dropout=0.0):
    import torch
    torch.manual_seed(seed)
    dev = "cuda"
    model = make_model(c).to(dev)
    if dropout > 0:
        add_dropout(model, dropout)
    n_params = sum(p.numel() for p in model.parameters())
    log(label, "params", n_params)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=True)
    data_t = torch.from_numpy(data.astype(np.int64)).to(dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    warm = 150
    total = None
    step = 0
    best = (float("inf"), None, 0)
    t_start = time.time()
    hist = []

    def val_loss():
        model.eval()
        losses = []
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            vt = torch.from_numpy(val.astype(np.int64)).to(dev)
            n = (len(vt) - 1) // CTX
            for i in range(0, n, 32):
                idx = torch.arange(i, min(n, i + 32), device=dev)[:, None] * CTX + torch.arange(CTX + 1, device=dev)
                xb = vt[idx]
                out = model(input_ids=xb[:, :-1]).logits.float()
                losses.append(torch.nn.functional.cross_entropy(
                    out.reshape(-1, out.shape[-1]), xb[:, 1:].reshape(-1), reduction="sum").item())
            model.train()
            return sum(losses) / (n * CTX)

    model.train()
    while True:
        if step == 10:
            torch.cuda.synchronize()
            t_start = time.time()
        if total is None and step == 60:
            torch.cuda.synchronize()
            per = (time.time() - t_start) / 50
            total = max(200, int(seconds / per))
            log(label, "%.1f ms/step -> %d steps" % (per * 1000, total))
        if total is not None and step >= total:
            break
        tot = total or 10 ** 9
        if step < warm:
            cur = lr * (step + 1) / warm
        else:
            cur = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, tot - warm)))))
        for g in opt.param_groups:
            g["lr"] = cur
        off = torch.randint(0, len(data_t) - CTX - 1, (batch,), device=dev, generator=gen)
        xb = data_t[off[:, None] + torch.arange(CTX + 1, device=dev)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=xb[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if total is not None and (step % 250 == 0 or step == total):
            vl = val_loss()
            hist.append((step, round(loss.item(), 4), round(vl, 4)))
            log(label, "step %d/%d train %.3f val %.3f (ppl %.2f) lr %.2e" % (step, total, loss.item(), vl,
                                                                             math.exp(vl), cur))
            if vl < best[0]:
                best = (vl, {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}, step)
    log(label, "best val %.4f at step %d" % (best[0], best[2]))
    sd = best[1]
    return sd, {"params": n_params, "steps": step, "best_step": best[2], "best_val_loss": best[0],
                "history": hist, "batch": batch, "ctx": CTX, "lr": lr, "dropout": dropout,
                "weight_decay": 0.1, "train_seconds_budget": seconds}


def export(c, sd, outdir, tok_files, quant):
    """Write an MLX-format checkpoint; returns the float32 weights the runtime sees."""
    os.makedirs(outdir, exist_ok=True)
    tensors, used = {}, {}
    for name, t in sd.items():
        if name == "lm_head.weight" and c["tie_word_embeddings"]:
            continue
        w = t.numpy().astype(np.float32)
        if w.ndim == 2:
            used[name] = mlxq.add_linear(tensors, name[: -len(".weight")], w, "bfloat16", quant)
        else:
            wr = mlxq.round_to_dtype(w, "bfloat16")
            dt, raw = mlxq.encode_dtype(wr, "bfloat16")
            tensors[name] = (dt, wr.shape, raw)
            used[name] = wr
    used["lm_head.weight"] = used["model.embed_tokens.weight"]
    mlxq.write_safetensors(os.path.join(outdir, "model.safetensors"), tensors, {"format": "mlx"})
    cfg = dict(c)
    if quant:
        cfg["quantization"] = dict(quant)
        cfg["quantization_config"] = dict(quant)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name, content in tok_files.items():
        with open(os.path.join(outdir, name), "w") as f:
            f.write(content)
    return used


def ppl_torch(c, weights, ids, window=CTX, max_tokens=None):
    """Perplexity in float32 (no TF32): ids split into consecutive non-overlapping windows of
    `window` tokens; each window is a fresh sequence; every token but a window's first is scored."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = make_model(c).float().cuda().eval()
    missing, unexpected = model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()}, strict=False)
    assert not unexpected and not [m for m in missing if "rotary" not in m], (missing, unexpected)
    if max_tokens:
        ids = ids[:max_tokens]
    nll, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids), window):
            chunk = ids[i:i + window]
            if len(chunk) < 2:
                continue
            x = torch.tensor([chunk], device="cuda")
            lg = model(input_ids=x).logits[0].double()
            nll += torch.nn.functional.cross_entropy(lg[:-1], x[0, 1:], reduction="sum").item()
            n += len(chunk) - 1
    return math.exp(nll / n), n, model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=".dev/corpus")
    ap.add_argument("--out", default="models")
    ap.add_argument("--main-seconds", type=float, default=210)
    ap.add_argument("--draft-seconds", type=float, default=70)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    import torch
    from transformers import GenerationConfig

    with lzma.open(os.path.join(args.corpus, "train.txt.xz"), "rt", encoding="utf-8") as f:
        text = f.read()
    heldout = open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8").read()
    # documents were joined with blank lines; chapters/pages start with a title line
    paras = [p for p in text.split("\n\n") if p.strip()]
    log("corpus chars", len(text), "paragraphs", len(paras))
    tok = train_tokenizer(paras, args.vocab)
    V = tok.get_vocab_size()
    ids = {"bos": tok.token_to_id("<|bos|>"), "eos": tok.token_to_id("<|eos|>"),
           "pad": tok.token_to_id("<|pad|>"), "im_end": tok.token_to_id("<|im_end|>")}
    log("tokenizer vocab", V, ids)
    # training stream: paragraphs shuffled in blocks of 64 consecutive ones (keeps local
    # coherence), each paragraph = text + "\n\n"; a block starts with <|bos|>, ends with <|eos|>
    enc = tok.encode_batch([p + "\n\n" for p in paras], add_special_tokens=False)
    rng = np.random.default_rng(0)
    blocks = [list(range(i, min(len(paras), i + 64))) for i in range(0, len(paras), 64)]
    order = rng.permutation(len(blocks))
    n_val = max(4, len(blocks) // 50)
    streams = {"train": [], "val": []}
    for j, bi in enumerate(order):
        dst = streams["val" if j < n_val else "train"]
        dst.append(ids["bos"])
        for pi in blocks[bi]:
            dst.extend(enc[pi].ids)
        dst.append(ids["eos"])
    train_ids = np.array(streams["train"], dtype=np.int32)
    val_ids = np.array(streams["val"], dtype=np.int32)
    log("train tokens", len(train_ids), "val tokens", len(val_ids),
        "chars/token %.2f" % (len(text) / len(train_ids)))

    tok_json = tok.to_str(pretty=True)
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|im_end|>",
        "pad_token": "<|pad|>", "unk_token": None, "add_bos_token": True, "add_eos_token": False,
        "model_max_length": CTX, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(tok.token_to_id(s)): {"content": s, "special": True, "lstrip": False,
                                                          "rstrip": False, "normalized": False,
                                                          "single_word": False} for s in SPECIALS},
    }
    gen_cfg = {"bos_token_id": ids["bos"], "eos_token_id": [ids["eos"], ids["im_end"]],
               "pad_token_id": ids["pad"], "do_sample": True, "temperature": 0.8, "top_p": 0.95,
               "max_new_tokens": 256}
    tok_files = {"tokenizer.json": tok_json, "tokenizer_config.json": json.dumps(tok_cfg, indent=2),
                 "generation_config.json": json.dumps(gen_cfg, indent=2),
                 "special_tokens_map.json": json.dumps({"bos_token": "<|bos|>", "eos_token": "<|im_end|>",
                                                        "pad_token": "<|pad|>"}, indent=2)}

    cmain = hf_config(MAIN, V, ids)
    cdraft = hf_config(DRAFT, V, ids)
    # main model's eos for chat use: <|im_end|>; <|eos|> ends plain documents (both in generation_config)
    sd_main, info_main = train(cmain, train_ids, val_ids, args.main_seconds, "main", 1, dropout=0.2)
    sd_draft, info_draft = train(cdraft, train_ids, val_ids, args.draft_seconds, "draft", 2, lr=3e-3,
                                 dropout=0.1)

    out = args.out
    for d in ("smelt-tiny", "smelt-tiny-bf16", "smelt-tiny-draft"):
        shutil.rmtree(os.path.join(out, d), ignore_errors=True)
    q4 = {"group_size": 64, "bits": 4}
    w_q4 = export(cmain, sd_main, os.path.join(out, "smelt-tiny"), tok_files, q4)
    w_bf = export(cmain, sd_main, os.path.join(out, "smelt-tiny-bf16"), tok_files, None)
    w_dr = export(cdraft, sd_draft, os.path.join(out, "smelt-tiny-draft"), tok_files, q4)

    held_ids = tok.encode(heldout, add_special_tokens=True).ids
    log("heldout tokens", len(held_ids))
    ev = {"heldout_file": "tests/golden/heldout.txt", "heldout_tokens": len(held_ids),
          "method": "tokenizer.json encode(heldout.txt, add_special_tokens=True) (one <|bos|> first); "
                    "ids split into consecutive non-overlapping windows of `window` tokens, each run as "
                    "a fresh sequence from position 0; every token except a window's first is scored; "
                    "ppl = exp(mean NLL). Computed with transformers LlamaForCausalLM in float32 "
                    "(TF32 off) from the weights exactly as stored (bf16, or 4-bit dequantized).",
          "results": {}}
    fp32_master = {k: v.numpy() for k, v in sd_main.items()}
    for label, c, w in (("smelt-tiny-bf16", cmain, w_bf), ("smelt-tiny (4-bit g64)", cmain, w_q4),
                        ("smelt-tiny-draft (4-bit g64)", cdraft, w_dr),
                        ("main fp32 master weights", cmain, fp32_master)):
        r = {}
        for window, mx, key in ((512, None, "window512_all"), (128, 1024, "window128_first1024")):
            p, n, _ = ppl_torch(c, w, held_ids, window, mx)
            r[key] = {"ppl": round(p, 4), "scored_tokens": n, "window": window, "max_tokens": mx}
        ev["results"][label] = r
        log("ppl", label, r)
    # samples from the 4-bit model (dequantized, float32)
    _, _, model = ppl_torch(cmain, w_q4, held_ids[:4], 512)
    samples = []
    for prompt in ["In the beginning", "The Python interpreter", "Jesus said to them,",
                   "A list is a sequence of"]:
        x = torch.tensor([tok.encode(prompt).ids], device="cuda")
        for mode, kw in (("greedy", dict(do_sample=False)),
                         ("sampled t=0.8 top_p=0.95 seed=0", dict(do_sample=True, temperature=0.8, top_p=0.95))):
            torch.manual_seed(0)
            g = GenerationConfig(max_new_tokens=48, eos_token_id=[ids["eos"], ids["im_end"]],
                                 pad_token_id=ids["pad"], **kw)
            y = model.generate(x, generation_config=g)[0, x.shape[1]:].tolist()
            samples.append({"prompt": prompt, "mode": mode, "ids": y, "text": tok.decode(y)})
            log(mode, repr(prompt), "->", repr(tok.decode(y)))
    ev["samples_4bit"] = samples
    ev["training"] = {"main": info_main, "draft": info_draft, "train_tokens": int(len(train_ids)),
                      "val_tokens": int(len(val_ids)), "vocab": V,
                      "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    with open(os.path.join(out, "smelt-tiny", "eval.json"), "w") as f:
        json.dump(ev, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
