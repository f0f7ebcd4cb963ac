#!/usr/bin/env python3
"""Independent check of the embedded default model (numpy only): dequantize a model dir,
run the float64 llama forward from tools/check_golden.py on held-out token ids and compare
the perplexity with the torch reference recorded in models/smelt-tiny/eval.json.

Usage: python3 tools/check_default.py MODEL_DIR IDS_JSON [EVAL_LABEL]
  IDS_JSON: heldout.txt encoded with the model's tokenizer.json (add_special_tokens=True),
            e.g. by tests/node's @anush008/tokenizers.
  EVAL_LABEL: key in eval.json "results" (default: chosen from the dir name).
Checks the 'window128_first1024' measurement (8 windows of 128 tokens).
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_golden  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    mdir, ids_path = sys.argv[1], sys.argv[2]
    base = os.path.basename(os.path.normpath(mdir))
    label = sys.argv[3] if len(sys.argv) > 3 else {
        "smelt-tiny": "smelt-tiny (4-bit g64)", "smelt-tiny-bf16": "smelt-tiny-bf16",
        "smelt-tiny-draft": "smelt-tiny-draft (4-bit g64)"}[base]
    ev = json.load(open(os.path.join(ROOT, "models", "smelt-tiny", "eval.json")))
    ref = ev["results"][label]["window128_first1024"]
    ids = json.load(open(ids_path))[: ref["max_tokens"]]
    cfg, W = check_golden.load_weights(mdir)
    nll, n = 0.0, 0
    for i in range(0, len(ids), ref["window"]):
        chunk = ids[i:i + ref["window"]]
        lg = check_golden.forward(cfg, W, chunk)[:-1]
        lg = lg - lg.max(-1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        nll -= lp[np.arange(len(chunk) - 1), chunk[1:]].sum()
        n += len(chunk) - 1
    ppl = math.exp(nll / n)
    ok = n == ref["scored_tokens"] and abs(ppl - ref["ppl"]) / ref["ppl"] < 1e-3
    print("%s: numpy ppl %.4f over %d tokens, torch reference %.4f -> %s"
          % (label, ppl, n, ref["ppl"], "OK" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
