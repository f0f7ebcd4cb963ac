#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): deterministic mode on CUDA
# with the built-in model.
#  1. tests/engine/test_deterministic on CUDA (the cuda_deterministic test): 48 requests (greedy and
#     seeded) through the engine together vs alone, default and deterministic mode; perplexity token by
#     token through the one-token decode path vs prefill;
#  2. the same through HTTP: 48 greedy /v1/completions sent together, then one at a time, against
#     `smelt serve` with and without --deterministic (fraction of texts that differ);
#  3. perplexity of the held-out text (first 3,000 tokens' worth) by prefill and by `--decode`;
#  4. the speed cost: bench_server_load at concurrency 16 (64 requests, 128 tokens, 64-word prompts)
#     with and without --deterministic;
#  5. the same for one sequence: smelt bench (prefill and decode tok/s).
# usage: bash bench/server/device_det_check.sh [BUILD_DIR]   (builds build-dev when BUILD_DIR is missing)
set -o pipefail
B=${1:-}
if [ -z "$B" ] || [ ! -x "$B/smelt" ]; then
  B=${B:-build-dev}
  bash bench/cuda/build_smelt.sh $B /tmp/det || exit 1
fi
T=/tmp/det-check
mkdir -p $T
M=models/smelt-tiny
DEV=${DET_DEVICE:-cuda} # cpu: a smoke run of this script without a GPU
fail=0

echo "== 1. engine: 48 requests together vs alone, perplexity decode vs prefill (cuda_deterministic)"
SMELT_DET_DEVICE=$DEV timeout 200 $B/tests/engine/test_deterministic . >$T/test.txt 2>&1
rc=$?
cat $T/test.txt
[ $rc = 0 ] || { echo "cuda_deterministic: FAILED (exit $rc)"; fail=1; }

serve() { # serve [--deterministic]: starts smelt serve on port 18090, waits until it answers
  $B/smelt serve -m $M --device $DEV -np 48 -c 512 --port 18090 "$@" >$T/serve.log 2>&1 &
  SP=$!
  for i in $(seq 1 120); do
    curl -sf http://127.0.0.1:18090/health >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  echo "smelt serve did not start:"; tail -5 $T/serve.log; return 1
}
stop() { kill $SP 2>/dev/null; wait $SP 2>/dev/null; }

http_check() { # prints "N of 48 differ"
  python3 - <<'EOF'
import json, urllib.request
from concurrent.futures import ThreadPoolExecutor
words = "the river city light morning garden stone window music paper road winter table market".split()
prompts = [" ".join(words[(i * 5 + j * 3) % len(words)] for j in range(8 + i % 24)) for i in range(48)]
def ask(p):
    body = json.dumps({"prompt": p, "max_tokens": 48, "temperature": 0}).encode()
    r = urllib.request.Request("http://127.0.0.1:18090/v1/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r, timeout=120))["choices"][0]["text"]
with ThreadPoolExecutor(48) as ex:
    together = list(ex.map(ask, prompts))
alone = [ask(p) for p in prompts]
print(f"{sum(a != b for a, b in zip(together, alone))} of 48 differ")
EOF
}

echo "== 2. HTTP: 48 greedy /v1/completions together vs one at a time"
for mode in default deterministic; do
  if [ $mode = default ]; then serve; else serve --deterministic; fi || { fail=1; continue; }
  r=$(http_check 2>&1 | tail -1)
  echo "  $mode mode: $r"
  eval "http_$mode=\"\$r\""
  stop
done

echo "== 3. perplexity, held-out text (window 256): prefill vs token by token (smelt perplexity --decode)"
head -c 12000 tests/golden/heldout.txt >$T/heldout.txt
for mode in "" "--deterministic"; do
  p=$($B/smelt perplexity -m $M -f $T/heldout.txt -c 256 --device $DEV $mode 2>/dev/null | tail -1)
  d=$($B/smelt perplexity -m $M -f $T/heldout.txt -c 256 --device $DEV --decode $mode 2>/dev/null | tail -1)
  echo "  ${mode:-default}: $p | $d"
done

echo "== 4. speed: bench_server_load, concurrency 16, 64 requests, 128 tokens, 64-word prompts"
for mode in default deterministic; do
  if [ $mode = default ]; then serve; else serve --deterministic; fi || { fail=1; continue; }
  $B/bench/server/bench_server_load --url http://127.0.0.1:18090 --concurrency 16 --requests-per-level 64 \
    --max-tokens 128 --prompt-words 64 >$T/load-$mode.txt 2>&1
  stop
  tps=$(awk '$1 == 16 { print $3 }' $T/load-$mode.txt)
  echo "  $mode mode: ${tps:-?} generated tok/s ($(awk '$1 == 16 { print "p50 latency " $4 " s, errors " $6 }' $T/load-$mode.txt))"
  eval "tps_$mode=\"\$tps\""
done

echo "== 5. speed, one sequence: smelt bench -p 256 -n 128 -r 3"
for mode in default deterministic; do
  f=""; [ $mode = deterministic ] && f=--deterministic
  $B/smelt bench -m $M --device $DEV -p 256 -n 128 -r 3 $f 2>/dev/null | grep -E "^(prefill|decode) " >$T/bench-$mode.txt
  sed "s/^/  $mode: /" $T/bench-$mode.txt
done

echo "== summary (built-in model, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
grep -E "mode: .*requests differ" $T/test.txt | sed 's/^/  engine, /'
echo "  HTTP greedy, default mode: ${http_default:-?}"
echo "  HTTP greedy, deterministic mode: ${http_deterministic:-?}"
grep -E "perplexity" $T/test.txt | sed 's/^/  /'
if [ -n "$tps_default" ] && [ -n "$tps_deterministic" ]; then
  echo "  speed at concurrency 16: default $tps_default tok/s, deterministic $tps_deterministic tok/s ($(awk -v a=$tps_default -v b=$tps_deterministic 'BEGIN { printf "%.2fx", b / a }'))"
fi
for mode in default deterministic; do
  echo "  one sequence, $mode: $(awk '{ printf "%s %s tok/s  ", $1, $4 }' $T/bench-$mode.txt)"
done
case "$http_deterministic" in "0 of 48 differ") ;; *) fail=1 ;; esac
[ $fail = 0 ] && echo "RESULT: ok" || echo "RESULT: FAILED"
exit $fail
