#!/usr/bin/env python3
"""Pipelined steps in `smelt serve` (issue 27): a step launched before the previous step's tokens are
read back, its continuing sequences' input tokens taken on the device, gives the outputs of the
step-by-step loop (SMELT_PIPELINE=0) for requests sent together: greedy and seeded sampling, max_tokens
of 1 to 40, stop strings, EOS, streaming, more requests than sequences (admitted while a step is in
flight), the prefix cache, and requests whose choices need the host first (logprobs, n > 1), which
end the pipeline for their steps, and a KV cache too small for the requests together (a launch runs out
of blocks: the newest request is preempted and recomputed). A client that hangs up mid-stream leaves no
KV blocks behind, and smelt_fed_tokens_total counts the fed tokens (none without pipelining).

Equality needs one-token and batched steps to round alike, and a batch's composition changes with
pipelining (a sequence that ends stays one step longer): the CPU servers run with
SMELT_CPU_BATCH_INVARIANT=1 (docs/cpu.md) and SMELT_PIPELINE=always (the CPU backend runs every step to
its end, so it pipelines only when asked); on CUDA (SMELT_PIPE_DEVICE=cuda, exit 77 without a GPU) the
servers run with --deterministic and pipeline by default.

usage: test_pipeline.py SMELT_BIN MODELS_DIR
"""
import http.client
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import srvlib
from srvlib import FAILS, check

BIN, MODELS = sys.argv[1], sys.argv[2]
DEVICE = os.environ.get("SMELT_PIPE_DEVICE", "cpu")


class Server(srvlib.Server):
    def __init__(self, pipeline, *args):
        env = dict(os.environ, SMELT_CPU_BATCH_INVARIANT="1")
        env["SMELT_PIPELINE"] = ("always" if DEVICE == "cpu" else "1") if pipeline else "0"
        dev = ["--deterministic"] if DEVICE != "cpu" else []
        super().__init__(BIN, ["-m", MODELS + "/smelt-tiny", "--device", DEVICE, "-np", "4", "-t", "1", *dev, *args],
                         env=env, wait_s=60, device=DEVICE)

    def complete(self, body):
        if body.get("stream"):
            return self.stream(body)
        return json.loads(self.post("/v1/completions", body))

    def stream(self, body, hang_up_after=None):
        """a streamed completion as one response (text, finish_reason, usage); hang_up_after: close the
        connection after that many chunks and return None"""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True, stream_options={"include_usage": True})),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        text, finish, usage, chunks = "", None, None, 0
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                c.sock.close()
                c.close()
                return None
            for ch in ev.get("choices", []):
                text += ch.get("text", "")
                finish = ch.get("finish_reason") or finish
            usage = ev.get("usage") or usage
        c.close()
        return {"choices": [{"text": text, "finish_reason": finish}], "usage": usage}


PROMPTS = ["In the beginning God created", "The module defines the following functions:", "And it came to pass",
           "Once upon a time", "def main():", "Return the current process's"]
GREEDY = {"temperature": 0}
SEEDED = {"temperature": 0.8, "top_p": 0.95, "seed": 1234}


def run_all(srv, bodies):
    with ThreadPoolExecutor(len(bodies)) as ex:
        return list(ex.map(srv.complete, bodies))


def summary(r):
    c = r["choices"]
    return [(x.get("text"), x.get("finish_reason")) for x in c], r["usage"]["completion_tokens"]


def compare(label, a, b):
    same = 0
    for i, (x, y) in enumerate(zip(a, b)):
        if summary(x) == summary(y):
            same += 1
        else:
            check(False, "%s, request %d: outputs differ\n  step by step: %r\n  pipelined:    %r"
                  % (label, i, summary(x), summary(y)))
    print("%s: %d of %d outputs equal" % (label, same, len(a)), flush=True)


def bodies(stop):
    out = []
    for i, p in enumerate(PROMPTS * 2):
        mode = GREEDY if i % 2 == 0 else SEEDED
        b = {"prompt": p, "max_tokens": [1, 2, 5, 17, 40, 33][i % 6]}
        b.update(mode)
        if i % 4 == 3:
            b["ignore_eos"] = True
        if i == 7:
            b["stop"] = [stop]
        if i in (2, 9):
            b["stream"] = True
        out.append(b)
    return out


def wait_idle(srv, what):
    for _ in range(100):
        if srv.metric("smelt_kv_cache_blocks_used") == 0:
            return
        time.sleep(0.1)
    check(False, "%s: %s KV blocks still held by live sequences" % (what, srv.metric("smelt_kv_cache_blocks_used")))


def main():
    step = Server(False)
    pipe = Server(True)
    try:
        # a stop string the model's greedy text really contains
        t = step.complete({"prompt": PROMPTS[1], "max_tokens": 24, **GREEDY})["choices"][0]["text"]
        stop = t[len(t) // 2:len(t) // 2 + 3] or "e"
        bs = bodies(stop)
        for rnd in range(2):  # the second round reuses the prompts' blocks from the prefix cache
            compare("mixed round %d" % rnd, run_all(step, bs), run_all(pipe, bs))
        # steps with choices that need the host (logprobs, n > 1) between pipelined ones
        host = [dict(bs[0], max_tokens=20), dict(bs[1], max_tokens=20, logprobs=2),
                dict(bs[4], max_tokens=30, n=2, seed=7), dict(bs[5], max_tokens=30)]
        compare("with host steps", run_all(step, host), run_all(pipe, host))
        fed = pipe.metric("smelt_fed_tokens_total")
        check(fed is not None and fed > 0, "pipelined server: smelt_fed_tokens_total %s" % fed)
        check(step.metric("smelt_fed_tokens_total") == 0, "SMELT_PIPELINE=0: tokens were fed")
        print("fed tokens: %d" % fed)
        # clients that hang up mid-stream while others run
        long_b = {"prompt": PROMPTS[3], "max_tokens": 200, "ignore_eos": True, **GREEDY}
        with ThreadPoolExecutor(6) as ex:
            hung = [ex.submit(pipe.stream, long_b, 3) for _ in range(3)]
            kept = [ex.submit(pipe.complete, b) for b in bs[:3]]
            for h in hung:
                h.result()
            after = [k.result() for k in kept]
        compare("beside hang-ups", run_all(step, bs[:3]), after)
        wait_idle(pipe, "after hang-ups")
        compare("after hang-ups", run_all(step, bs), run_all(pipe, bs))
        wait_idle(pipe, "at the end")
        for srv, name in ((step, "step"), (pipe, "pipe")):
            check(srv.p.poll() is None, "%s server died:\n%s" % (name, srv.text()[-2000:]))
    finally:
        step.stop()
        pipe.stop()
    # a KV cache too small for the requests together: a launch runs out of blocks (its placeholders are
    # taken back, the launch in flight collected, the newest request preempted and recomputed later)
    tiny = Server(True, "--kv-blocks", "10", "-c", "160")
    try:
        long_bs = [{"prompt": p, "max_tokens": 60, "ignore_eos": True, **(GREEDY if i % 2 else SEEDED)}
                   for i, p in enumerate(PROMPTS[:4])]
        ref_srv = Server(False)
        try:
            ref = run_all(ref_srv, long_bs)
        finally:
            ref_srv.stop()
        compare("preempted", ref, run_all(tiny, long_bs))
        pre = tiny.metric("smelt_preemptions_total")
        check(pre is not None and pre > 0, "small KV cache: no preemption (%s)" % pre)
        print("preemptions: %d" % pre)
        wait_idle(tiny, "after preemptions")
    finally:
        tiny.stop()
    if FAILS:
        print("%d failures" % len(FAILS), file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
