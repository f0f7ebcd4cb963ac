#!/usr/bin/env python3
"""Speculative decoding in `smelt serve` (issue 27): with a draft model (-md smelt-tiny-draft) or
n-gram prompt lookup (--spec-type ngram-simple), greedy and seeded outputs equal those of a
server without speculation, for several prompts sent together (continuous batching, other
sequences without drafts in the same step), with rejections (speculative.p_min 0), the prefix
cache (every prompt is sent more than once), stop strings, streaming and max_tokens boundaries;
the /metrics counters move.

Equality needs one-token and batched steps to round alike: on the CPU the test runs with
SMELT_CPU_BATCH_INVARIANT=1 (docs/cpu.md). On CUDA (SMELT_SPEC_DEVICE=cuda; exit 77 without a
GPU) one-token and multi-token kernels round differently: a greedy output may leave the plain one
only where the plain output's two best tokens are within NEAR_TIE of each other (checked with
logprobs); the differing fraction is printed.

usage: test_spec.py SMELT_BIN MODELS_DIR [--bench N] [-- SERVER_ARGS...]
  --bench N: no checks; N concurrent requests of 128 tokens, generated tok/s with and without
  speculation (a measurement for the docs, not a test)
  SERVER_ARGS: more options for every server (e.g. -t 1)
"""
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import srvlib
from srvlib import FAILS, check

BIN, MODELS = sys.argv[1], sys.argv[2]
BENCH = int(sys.argv[sys.argv.index("--bench") + 1]) if "--bench" in sys.argv else 0

EXTRA = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
DEVICE = os.environ.get("SMELT_SPEC_DEVICE", "cpu")
STRICT = DEVICE == "cpu"
NEAR_TIE = 0.1  # nats between the two best tokens where CUDA rounding may pick either


class Server(srvlib.Server):
    def __init__(self, *args):
        env = dict(os.environ, SMELT_CPU_BATCH_INVARIANT=os.environ.get("SMELT_CPU_BATCH_INVARIANT", "1"))
        super().__init__(BIN, ["-m", MODELS + "/smelt-tiny", "--device", DEVICE, "-np", "8", "-t", "1", *EXTRA, *args],
                         env=env, wait_s=60, device=DEVICE)

    def complete(self, body):
        return json.loads(self.post("/v1/completions", body))


PROMPTS = ["In the beginning God created", "The module defines the following functions:", "And it came to pass",
           "Once upon a time", "def main():", "Return the current process's"]
# repeats itself: n-gram lookup finds its continuations in the prompt
REPEAT = ("The module defines the following functions: os.path.join, os.path.split, os.path.exists. "
          "The module defines the following functions: os.path.join, os.path.split, os.path.exists. "
          "The module defines the following functions:")
GREEDY = {"temperature": 0}
SEEDED = {"temperature": 0.8, "top_p": 0.95, "seed": 1234}


def run_all(srv, bodies):
    """every body sent at once; the parsed responses in order"""
    with ThreadPoolExecutor(len(bodies)) as ex:
        return list(ex.map(srv.complete, bodies))


def body(prompt, mode, n=40, **kw):
    b = {"prompt": prompt, "max_tokens": n}
    b.update(mode)
    b.update(kw)
    return b


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1


def compare(label, plain, spec, plain_lp=None):
    """plain / spec: responses of the same requests; True when all texts are equal"""
    same = 0
    for i, (a, b) in enumerate(zip(plain, spec)):
        ta, tb = a["choices"][0]["text"], b["choices"][0]["text"]
        if ta == tb and a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"] and \
                a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"]:
            same += 1
            continue
        if STRICT:
            check(False, "%s, request %d: outputs differ\n  plain: %r\n  spec:  %r" % (label, i, ta, tb))
        elif plain_lp is not None:  # CUDA, greedy: the divergence must be at a near tie
            lp = plain_lp[i]["choices"][0]["logprobs"]
            pos, off, k = first_diff(ta.encode(), tb.encode()), lp["text_offset"], 0
            while k + 1 < len(off) and off[k + 1] - off[0] <= pos:  # the token where the bytes differ
                k += 1
            top = sorted(lp["top_logprobs"][k].values(), reverse=True)
            gap = top[0] - top[1] if len(top) > 1 else 99
            print("  %s request %d: differs from token %d, plain top-2 gap %.4f nats" % (label, i, k, gap))
            check(gap < NEAR_TIE, "%s request %d: diverges at token %d where the top-2 gap is %.4f nats (not a tie)"
                  % (label, i, k, gap))
    print("%s: %d of %d outputs equal" % (label, same, len(plain)), flush=True)
    return same == len(plain)


def counters(srv):
    return srv.metric("smelt_spec_draft_tokens_total"), srv.metric("smelt_spec_accepted_tokens_total")


def bench(n):
    servers = [("plain", []), ("draft model", ["-md", MODELS + "/smelt-tiny-draft", "--draft-max", "4"]),
               ("n-gram", ["--spec-type", "ngram-simple", "--draft-max", "4"])]
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(n)]
    base = None
    for name, args in servers:
        srv = Server("-np", str(max(8, n)), *args)
        try:
            run_all(srv, [body(p, GREEDY, 8) for p in prompts[:2]])  # warm up
            t0 = time.time()
            out = run_all(srv, [body(p, GREEDY, 128, ignore_eos=True) for p in prompts])
            dt = time.time() - t0
            toks = sum(r["usage"]["completion_tokens"] for r in out)
            d, a = counters(srv)
            texts = [r["choices"][0]["text"] for r in out]
            eq = "" if base is None else ", %d/%d outputs equal to plain" % (
                sum(x == y for x, y in zip(texts, base)), n)
            if base is None:
                base = texts
            rate = " acceptance %.2f" % (a / d) if d else ""
            print("%-12s %d requests x 128 tokens: %.1f generated tok/s%s%s" % (name, n, toks / dt, rate, eq),
                  flush=True)
        finally:
            srv.stop()


def bad_flags():
    """refused at start with exit status 2 (1: a model that cannot be found) and a message naming the flag"""
    for args, code, what in ((["--draft-max", "99"], 2, "--draft-max"), (["--spec-type", "eagle"], 2, "--spec-type"),
                             (["--draft-max", "2", "--draft-min", "5"], 2, "--draft-min"),
                             (["-md", MODELS + "/smelt-tiny-draft", "--spec-type", "ngram-simple"], 2, "-md"),
                             (["--spec-type", "draft"], 2, "-md"), (["--draft-p-min", "2"], 2, "--draft-p-min"),
                             (["-md", MODELS + "/no-such-model", "--offline"], 1, "no-such-model")):
        r = subprocess.run([BIN, "serve", "-m", MODELS + "/smelt-tiny", "--port", "0", *args], capture_output=True,
                           timeout=60, text=True)
        check(r.returncode == code and what in r.stderr,
              "serve %s: exit %d (want %d), %r" % (" ".join(args), r.returncode, code, r.stderr[-300:]))


def main():
    if BENCH:
        bench(BENCH)
        return
    bad_flags()
    plain = Server()
    draft = Server("-md", MODELS + "/smelt-tiny-draft", "--draft-max", "4")
    ngram = Server("--spec-type", "ngram-simple", "--draft-max", "4")
    try:
        lp = {"logprobs": 2} if not STRICT else {}
        for mode_name, mode in (("greedy", GREEDY), ("seeded", SEEDED)):
            bodies = [body(p, mode, **(lp if mode is GREEDY else {})) for p in PROMPTS]
            ref = run_all(plain, bodies)
            plain_lp = ref if (lp and mode is GREEDY) else None
            for rnd in range(2):  # the second round reuses the prompts' KV from the prefix cache
                compare("draft %s round %d" % (mode_name, rnd), ref, run_all(draft, bodies), plain_lp)
            # every draft proposal verified (rejections happen)
            compare("draft p_min 0 %s" % mode_name, ref,
                    run_all(draft, [dict(b, **{"speculative.p_min": 0}) for b in bodies]), plain_lp)
            compare("ngram %s" % mode_name, ref, run_all(ngram, bodies), plain_lp)
        d0, a0 = counters(draft)
        check(d0 and d0 > 0 and 0 < a0 <= d0, "draft model: drafted %s, accepted %s" % (d0, a0))
        rate = draft.metric("smelt_spec_acceptance_rate")
        check(rate is not None and abs(rate - a0 / max(d0, 1)) < 1e-3, "acceptance rate %s vs %s/%s" % (rate, a0, d0))
        print("draft model: %d drafted, %d accepted (%.2f)" % (d0, a0, a0 / max(d0, 1)))
        check(plain.metric("smelt_spec_draft_tokens_total") == 0, "no drafts without speculation")

        # n-gram lookup on a prompt that repeats itself
        rep = [body(REPEAT, GREEDY, 40), body(REPEAT, SEEDED, 40), body(REPEAT + " os.path", GREEDY, 40)]
        n0 = counters(ngram)
        compare("ngram repetitive", run_all(plain, rep), run_all(ngram, rep))
        n1 = counters(ngram)
        check(n1[1] - n0[1] > 0, "n-gram lookup accepted nothing on a repetitive prompt (%s -> %s)" % (n0, n1))
        print("n-gram: %d drafted, %d accepted in all" % n1)

        # speculative.n_max 0: this request is decoded one token a step
        c0 = counters(draft)
        r = draft.complete(body(PROMPTS[0], GREEDY, **{"speculative.n_max": 0}))
        check(counters(draft) == c0, "speculative.n_max 0 still drafted: %s -> %s" % (c0, counters(draft)))
        check(r["choices"][0]["text"] == plain.complete(body(PROMPTS[0], GREEDY))["choices"][0]["text"],
              "speculative.n_max 0: output differs")
        code = 0
        try:
            draft.complete(body(PROMPTS[0], GREEDY, **{"speculative.n_max": 99}))
        except urllib.error.HTTPError as e:
            code = e.code
        check(code == 400, "speculative.n_max 99 -> %d, want 400" % code)

        # max_tokens boundaries: exactly n tokens, the same text, for n around the draft length
        for srv, name in ((draft, "draft"), (ngram, "ngram")):
            bodies = [body(PROMPTS[1] if srv is draft else REPEAT, GREEDY, n, ignore_eos=True)
                      for n in (1, 2, 3, 4, 5, 6, 9)]
            got = run_all(srv, bodies)
            for b, g in zip(bodies, got):
                check(g["usage"]["completion_tokens"] == b["max_tokens"],
                      "%s max_tokens %d: %d tokens" % (name, b["max_tokens"], g["usage"]["completion_tokens"]))
            compare("%s max_tokens" % name, run_all(plain, bodies), got)

        # stop strings: the answer ends where the stop string starts in the answer without it
        # (and equals plain decoding's on the CPU)
        for srv, name in ((draft, "draft"), (ngram, "ngram")):
            full = srv.complete(body(PROMPTS[1], GREEDY, 64))["choices"][0]["text"]
            for stop in (full[20:26], full[33:36], full[5:6]):
                if not stop.strip():
                    continue
                b = body(PROMPTS[1], GREEDY, 64, stop=[stop])
                got = srv.complete(b)["choices"][0]
                check(got["text"] == full[:full.find(stop)] and got["finish_reason"] == "stop",
                      "%s stop %r: %r, want %r" % (name, stop, got["text"], full[:full.find(stop)]))
                if STRICT:
                    want = plain.complete(b)["choices"][0]["text"]
                    check(got["text"] == want, "%s stop %r: %r vs plain %r" % (name, stop, got["text"], want))

        # streaming: the deltas add up to the non-streamed text
        b = body(PROMPTS[2], SEEDED, 40)
        want = (plain if STRICT else draft).complete(b)["choices"][0]["text"]
        raw = draft.post("/v1/completions", dict(b, stream=True))
        text = "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in raw.splitlines()
                       if ln.startswith("data: {"))
        check(text == want, "streamed %r vs plain %r" % (text, want))

        # chat endpoint, several choices of one request (decoded without drafts) next to drafted ones
        cb = {"messages": [{"role": "user", "content": "Tell me about the module."}], "max_tokens": 32,
              "temperature": 0}
        want = json.loads(plain.post("/v1/chat/completions", cb))["choices"][0]["message"]["content"]
        got = json.loads(draft.post("/v1/chat/completions", cb))["choices"][0]["message"]["content"]
        check(got == want or not STRICT, "chat: %r vs %r" % (got, want))
        nb = dict(body(PROMPTS[3], SEEDED, 24), n=2)
        both = run_all(draft, [nb, body(PROMPTS[4], GREEDY)])
        ref = run_all(plain, [nb, body(PROMPTS[4], GREEDY)])
        check([c["text"] for c in both[0]["choices"]] == [c["text"] for c in ref[0]["choices"]] or not STRICT,
              "n=2 next to a drafted request: outputs differ")
        compare("drafted next to n=2", ref[1:], both[1:])
        # a KV cache too small for every request at once (32 blocks of 16 tokens: one context; 6
        # requests of ~106 tokens need 42): preemption (drafts dropped with the sequences,
        # recomputed on readmission) keeps the outputs
        tight = Server("-md", MODELS + "/smelt-tiny-draft", "--draft-max", "4", "--kv-blocks", "32")
        try:
            bodies = [body(p, GREEDY, 100, ignore_eos=True) for p in PROMPTS]
            compare("draft, KV cache of 32 blocks", run_all(plain, bodies), run_all(tight, bodies))
            pre = tight.metric("smelt_preemptions_total")
            print("preemptions with 32 KV blocks: %s" % pre)
            # on the GPU the requests may finish before they all hold blocks at once: counted, not required
            check(pre and pre > 0 or not STRICT, "no preemption with 32 KV blocks: the case was not exercised")
        finally:
            tight.stop()
    finally:
        for s in (plain, draft, ngram):
            s.stop()
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        sys.exit(1)
    print("all speculative decoding checks passed (%s)" % DEVICE)


main()
