#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): the mixture-of-experts checks.
# usage: bash bench/moe/device_check.sh BUILD_DIR
#   1. test_cuda_backend moe (the MoE ops, microscaling weights and whole synthetic MoE models vs the
#      CPU backend, with and without fusion and graphs), then the ctests golden_cuda (every fixture, the
#      MoE ones too, on CUDA), cuda_fusions, op_sequence, cpu_moe, format_test_mxq, format_test_config_moe
#   2. the MoE golden fixtures regenerated with transformers (tools/make_golden.py, CPU, in the
#      background during 1) into $OUT/golden-moe and checked with test_golden on the CPU and on CUDA
#   3. smelt bench, random weights (written in the background during 1 and 2): Qwen3-30B-A3B shape
#      4-bit g64 and gpt-oss-20b shape (mxfp4 experts, the rest 8-bit), prefill 512 and 128 decode
#      steps on CUDA
# Without BUILD_DIR (or if it has no build) it configures and builds build-dev for sm_90.
# Logs go to $OUT (default /tmp/out); the summary ends the output. Exit 0 when every check passed.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}
if [ ! -x "$B/smelt" ]; then
  B=build-dev
  bash bench/cuda/build_smelt.sh $B $OUT/moe || exit 1
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/moe-gpu.txt
T0=$(date +%s)
SUM=$OUT/moe-summary.txt; : > $SUM
ok=1
note() { echo "$*" >> $SUM; }

# 2 (background): transformers references of the MoE fixtures
MOE_FX=qwen3_moe_q4_g64_bf16,qwen2_moe_q4_g64_bf16,mixtral_q4_g64_f16,gpt_oss_mxfp4_q8_bf16,gpt_oss_q4_g64_f16,glm4_moe_q4_g64_bf16
rm -rf $OUT/golden-moe; mkdir -p $OUT/golden-moe
(timeout 100 python3 tools/make_golden.py --seeds 6 --only $MOE_FX $OUT/golden-moe >$OUT/moe-make-golden.log 2>&1
 echo $? > $OUT/moe-make-golden.rc) &
MG=$!

# 3 (background): write the random-weight benchmark models (CPU, one 1-token smoke run each)
(for sh in "qwen3-30b-a3b 4" "gpt-oss-20b 8"; do set -- $sh
   timeout 120 $B/smelt bench --synthetic $1 --bits $2 --device cpu -t 4 --dir /tmp -p 1 -n 2 >$OUT/moe-write-$1.log 2>&1
 done) &
WR=$!

# 1: ctests
SMELT_CPU_EXACT=1 timeout 90 $B/tests/cuda/test_cuda_backend moe >$OUT/moe-cuda-backend.log 2>&1
rb=$?
grep -E "^moe model|FAIL|passed, " $OUT/moe-cuda-backend.log | tail -24
if [ $rb = 0 ]; then note "test_cuda_backend moe: PASS ($(grep -E "passed, " $OUT/moe-cuda-backend.log | tail -1), $(grep -c "^moe model" $OUT/moe-cuda-backend.log) model comparisons)"
else ok=0; note "test_cuda_backend moe: FAIL rc=$rb ($(grep -c FAIL $OUT/moe-cuda-backend.log) failed checks, $OUT/moe-cuda-backend.log)"; fi
(cd $B && timeout 60 ctest -R "^(golden_cuda|cuda_fusions|op_sequence|cpu_moe|format_test_mxq|format_test_config_moe)$" \
  -V >$OUT/moe-ctest.log 2>&1)
rc=$?
grep -E "tests passed|Passed|Failed|\*\*\*|SKIP|Timeout" $OUT/moe-ctest.log | grep -vE "^ +Start" | tail -14
if [ $rc = 0 ]; then note "ctest      PASS ($(grep -Eo '[0-9]+% tests passed.*' $OUT/moe-ctest.log))"
else ok=0; note "ctest      FAIL rc=$rc: $(grep -E 'Failed|Timeout|\*\*\*' $OUT/moe-ctest.log | grep -Eo '[a-z_]+ \.+\**[A-Za-z ]+' | tr '\n' ';')"; fi
for f in qwen3_moe qwen2_moe mixtral gpt_oss glm4_moe; do
  l=$(grep -E "^ *[0-9]*: *${f}_" $OUT/moe-ctest.log | grep -c "40/40")
  [ "$l" -gt 0 ] && note "golden_cuda $f: $l fixture(s) with 40/40 greedy tokens on CUDA"
done

# 2: check the transformers fixtures
wait $MG
mgrc=$(cat $OUT/moe-make-golden.rc 2>/dev/null || echo none)
tail -12 $OUT/moe-make-golden.log
n=$(ls -d $OUT/golden-moe/*/ 2>/dev/null | wc -l)
if [ "$n" -gt 0 ]; then
  for dev in cpu cuda; do
    SMELT_GOLDEN_DEVICE=$dev timeout 30 $B/tests/golden/test_golden $OUT/golden-moe >$OUT/moe-golden-hf-$dev.log 2>&1
    r=$?
    grep -E "logits max_abs|greedy" $OUT/moe-golden-hf-$dev.log | grep -v "decode\|KV" | sed "s/^/[hf $dev] /"
    [ $r = 0 ] || ok=0
    note "golden vs transformers on $dev: $([ $r = 0 ] && echo PASS || echo FAIL rc=$r), $n fixtures (make_golden rc $mgrc), greedy 40/40: $(grep -c '40/40' $OUT/moe-golden-hf-$dev.log)"
  done
else ok=0; note "golden vs transformers: no fixture made (make_golden rc $mgrc, $OUT/moe-make-golden.log)"; fi
echo "tests took $(( $(date +%s) - T0 )) s"

# 3: speed
wait $WR
bench() { # shape bits tag
  local t=$(date +%s)
  timeout 80 $B/smelt bench --synthetic $1 --bits $2 --device cuda --dir /tmp -p 512 -n 128 >$OUT/moe-bench-$1.log 2>&1
  local r=$?
  grep -E "prefill |decode |roofline" $OUT/moe-bench-$1.log | sed "s/^/[$3] /"
  if [ $r = 0 ]; then
    note "$(echo "$3: $(grep -Eo 'prefill +512 tokens: [0-9.]+ tok/s' $OUT/moe-bench-$1.log), $(grep -Eo 'decode +128 tokens: [0-9.]+ tok/s' $OUT/moe-bench-$1.log), $(grep -Eo '[0-9.]+ MB of weights' $OUT/moe-bench-$1.log) per token, $(grep -Eo 'decode at [0-9.]+% of roofline' $OUT/moe-bench-$1.log) ($(( $(date +%s) - t )) s)" | tr -s ' ')"
  else ok=0; note "$3: FAIL rc=$r: $(tail -2 $OUT/moe-bench-$1.log | tr '\n' ' ')"; fi
}
bench qwen3-30b-a3b 4 "qwen3-30b-a3b 4-bit"
bench gpt-oss-20b 8 "gpt-oss-20b mxfp4+q8"
rm -rf /tmp/smelt-bench-qwen3-30b-a3b-q4-g64 /tmp/smelt-bench-gpt-oss-20b-q8-g64

echo "== MoE summary ($(cat $OUT/moe-gpu.txt), $(( $(date +%s) - T0 )) s) =="
cat $SUM
[ $ok = 1 ] && echo "ALL MOE CHECKS PASSED" || echo "SOME MOE CHECKS FAILED"
[ $ok = 1 ]
