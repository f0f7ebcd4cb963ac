#!/usr/bin/env python3
"""`smelt bench --synthetic test --device cpu` with -t 1 and -t 2 (logic checks, no timing claims):
  - the JSON reports the threads the CPU backend computes with (-t honoured);
  - a positive measured bandwidth, and roofline_tok_s = bandwidth / (weight + KV bytes per token),
    roofline_ratio = decode_tok_s / roofline_tok_s (recomputed here);
  - decode of this tiny model stays under the bandwidth roofline (ratio <= 1);
  - -r 3: min <= median <= max, and the text output prints the three;
  - --batch 3: the JSON's batch figures (positive, min <= median <= max) and the text output's batch line;
  - bad input (-t abc, -r 0, -ctk q5_1, -ctk f16 -ctv f32, an unknown SMELT_CPU_ISA) exits non-zero with a
    message naming it.

usage: test_bench_cli.py /path/to/smelt TMPDIR
"""
import json
import os
import subprocess
import sys

SMELT, TMP = sys.argv[1], sys.argv[2]
FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def bench(*args, env=None):
    cmd = [SMELT, "bench", "--synthetic", "test", "--device", "cpu", "-p", "48", "-n", "24", "--dir", TMP] + list(args)
    e = dict(os.environ)
    for k in ("SMELT_CPU_ISA", "SMELT_CPU_EXACT", "SMELT_CPU_NO_GFNI", "SMELT_DEVICE"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=240)
    return p.returncode, p.stdout, p.stderr


def close(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


os.makedirs(TMP, exist_ok=True)
for threads in (1, 2):
    rc, out, err = bench("-t", str(threads), "-r", "3", "--json")
    check(rc == 0, "-t %d: exit %d: %s" % (threads, rc, err))
    if rc != 0:
        continue
    j = json.loads(out)
    print("-t %d:" % threads, {k: j[k] for k in ("threads", "decode_tok_s", "bandwidth_gb_s", "roofline_ratio")})
    check(j["backend"] == "cpu", "backend %s" % j["backend"])
    check(j["threads"] == threads, "-t %d: the backend computes with %s threads" % (threads, j["threads"]))
    check(j["repeat"] == 3, "repeat %s" % j["repeat"])
    bw, per_tok = j["bandwidth_gb_s"] * 1e9, j["weight_bytes_per_token"] + j["kv_bytes_per_token"]
    check(bw > 0, "-t %d: no bandwidth measured" % threads)
    check(per_tok > 0, "weight bytes per token %s" % per_tok)
    check(j["kv_type"] == "f16" and j["kv_bytes_per_token"] > 0, "KV %s: %s bytes per token" % (j["kv_type"], j["kv_bytes_per_token"]))
    if bw > 0 and per_tok > 0:
        check(close(j["roofline_tok_s"], bw / per_tok), "roofline %s != %s / %s" % (j["roofline_tok_s"], bw, per_tok))
        check(close(j["roofline_ratio"], j["decode_tok_s"] / j["roofline_tok_s"]),
              "ratio %s != %s / %s" % (j["roofline_ratio"], j["decode_tok_s"], j["roofline_tok_s"]))
    check(0 < j["roofline_ratio"] <= 1.0, "-t %d: decode at %.1f%% of the roofline" % (threads, 100 * j["roofline_ratio"]))
    for k in ("prefill_tok_s", "decode_tok_s"):
        check(0 < j[k + "_min"] <= j[k] <= j[k + "_max"], "%s: min %s median %s max %s" % (k, j[k + "_min"], j[k],
                                                                                         j[k + "_max"]))

rc, out, err = bench("-t", "2", "-r", "3")
check(rc == 0, "text output: exit %d: %s" % (rc, err))
check("2 threads" in out, "text output names the threads: %s" % out)
check("median of 3 runs" in out and "% of roofline" in out, "text output: %s" % out)

rc, out, err = bench("-t", "2", "-r", "3", "--batch", "3", "--json")
check(rc == 0, "--batch 3: exit %d: %s" % (rc, err))
if rc == 0:
    j = json.loads(out)
    check(j.get("batch") == 3, "--batch 3: batch %s" % j.get("batch"))
    check(j.get("batch_prefill_tok_s", 0) > 0, "--batch 3: batch prefill %s" % j.get("batch_prefill_tok_s"))
    check(0 < j.get("batch_decode_tok_s_min", 0) <= j.get("batch_decode_tok_s", 0) <= j.get("batch_decode_tok_s_max", 0),
          "--batch 3: batch decode min/median/max %s %s %s" % (j.get("batch_decode_tok_s_min"),
                                                              j.get("batch_decode_tok_s"), j.get("batch_decode_tok_s_max")))
rc, out, err = bench("-t", "1", "--batch", "2")
check(rc == 0 and "batch      2 sequences" in out, "--batch 2 text output: exit %d: %s %s" % (rc, out, err))
rc, out, err = bench("-t", "1")
check(rc == 0 and "batch " not in out, "no --batch: a batch line: %s" % out)

for args, env, word in ((["--batch", "0"], None, "--batch"), (["--batch", "5000"], None, "--batch"),
                        (["-t", "abc"], None, "-t"), (["-r", "0"], None, "-r"),
                        (["-ctk", "q5_1"], None, "q5_1"), (["-ctk", "f16", "-ctv", "f32"], None, "--cache-type-v f32"),
                        (["-t", "1"], {"SMELT_CPU_ISA": "sse9"}, "SMELT_CPU_ISA")):
    rc, out, err = bench(*args, env=env)
    check(rc != 0 and word in err, "%s %s: exit %d, stderr %r" % (args, env, rc, err))

if FAILS:
    print("%d check(s) failed" % len(FAILS))
    sys.exit(1)
print("bench cli tests passed")
