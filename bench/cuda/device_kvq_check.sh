#!/bin/bash
# Quantized KV caches (-ctk q8_0 / q4_0) on the GPU machine: they run on the CPU backend only, so this
# checks that CUDA refuses them with a clear error (never garbage), runs the KV-type CUDA tests, and
# measures decode tok/s at depth with each cache: CUDA f16 (8B 4-bit shape), CPU f16 against q8_0
# (1B 4-bit shape, all cores). Prints a summary table and "RESULT: OK" or "RESULT: FAIL (...)".
# usage (repo root, after `source bench/cuda/device_env.sh`): bash bench/cuda/device_kvq_check.sh [BUILD_DIR]
# BUILD_DIR (default build-dev) is built as the lead builds it when it has no smelt binary.
B=${1:-build-dev}
set -o pipefail
fail=()
if [ ! -x "$B/smelt" ]; then
  bash bench/cuda/build_smelt.sh "$B" /tmp/kvq || { echo "RESULT: FAIL (build)"; exit 1; }
fi
t0=$(date +%s)
D=${KVQ_DIR:-/tmp/kvq-synth}
mkdir -p "$D"

echo "== CUDA tests of the KV types (kv_quality_cuda: perplexity per type on CUDA, q8_0 refused; golden_cuda)"
(cd "$B" && timeout 100 ctest -R "^(kv_quality_cuda|golden_cuda)$" --output-on-failure >/tmp/kvq-ctest.log 2>&1)
rc=$?
grep -E "Test +#|tests passed|perplexity|cuda q8_0" /tmp/kvq-ctest.log | sed 's/^/  /'
grep -q "Skipped" /tmp/kvq-ctest.log && fail+=("a CUDA test skipped: no GPU?")
[ $rc = 0 ] || fail+=("CUDA tests (log /tmp/kvq-ctest.log)")

echo "== -ctk q8_0 / q4_0 on CUDA: refused with a clear error"
for t in q8_0 q4_0; do
  err=$(timeout 30 "$B/smelt" perplexity -m models/smelt-tiny -f tests/golden/heldout.txt -c 256 --device cuda -ctk $t 2>&1)
  rc=$?
  msg=$(echo "$err" | grep -m1 "not supported on cuda")
  if [ $rc != 0 ] && [ -n "$msg" ]; then echo "  $t: exit $rc: $msg"
  else echo "  $t: exit $rc, output: $(echo "$err" | tail -2)"; fail+=("$t on cuda not refused"); fi
done

# bench SHAPE DEVICE KV PROMPT GEN -> "prefill decode" tok/s (or "- -")
bench() {
  local j
  j=$(timeout 60 "$B/smelt" bench --synthetic $1 --bits 4 --device $2 -ctk $3 --dir "$D" -p $4 -n $5 --json 2>/tmp/kvq-bench.err)
  if [ $? != 0 ] || [ -z "$j" ]; then echo "- -"; return 1; fi
  python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f %.1f" % (j["prefill_tok_s"], j["decode_tok_s"]))' "$j"
}
echo "== decode tok/s at depth (one run each; -n tokens decoded after a -p token prompt)"
printf "  %-6s %-9s %-5s %14s %14s %14s %14s\n" backend shape KV "prefill p512" "decode p512" "prefill p4096" "decode p4096"
row() { # backend shape kv gen
  local a b
  a=$(bench $2 $1 $3 512 $4) || fail+=("bench $1 $2 $3 p512: $(tail -1 /tmp/kvq-bench.err)")
  b=$(bench $2 $1 $3 4096 $4) || fail+=("bench $1 $2 $3 p4096: $(tail -1 /tmp/kvq-bench.err)")
  set -- "$1" "$2" "$3" $a $b
  printf "  %-6s %-9s %-5s %14s %14s %14s %14s\n" "$1" "$2 q4" "$3" "$4" "$5" "$6" "$7"
}
row cuda 8b f16 64
printf "  %-6s %-9s %-5s %s\n" cuda "8b q4" q8_0 "refused: KV type q8_0 is not supported on cuda yet"
row cpu 1b f16 16
row cpu 1b q8_0 16
row cpu 1b q4_0 16
echo "($(( $(date +%s) - t0 )) s)"
if [ ${#fail[@]} = 0 ]; then echo "RESULT: OK"; else
  printf -v msg '%s; ' "${fail[@]}"; echo "RESULT: FAIL (${msg%; })"; exit 1; fi
