#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): the multi-head latent attention
# checks (DeepSeek-V3 / Kimi-K2 / GLM-4.7-Flash, src/model/mla.c, backend op attention_mla).
# usage: bash bench/moe/device_mla_check.sh BUILD_DIR
#   1. test_cuda_backend mla: the CUDA attention_mla against the double-precision reference (f32 / f16 / bf16
#      latent caches, 1 to 16 heads, kv_lora_rank up to 512), then synthetic DeepSeek-V3 models (embed_q /
#      unembed_out 4-bit, kv_b_proj bf16, a plain q_proj) and GLM-4.7-Flash CUDA vs CPU, prefill and decode,
#      in three backend passes (defaults; no fusion and no graphs; int8-activation 4-bit kernels)
#   2. ctest on this build: golden_cuda (the deepseek_v3 fixtures among every other on CUDA), golden,
#      mla, cpu_mla, op_sequence, format_test_config_moe
#   3. the DeepSeek-V3 fixtures regenerated with transformers (tools/make_golden.py) into $OUT/golden-mla and
#      checked with test_golden on the CPU and on CUDA
# Without BUILD_DIR (or if it has no build) it configures and builds build-dev for sm_90.
# Logs go to $OUT (default /tmp/out); the summary ends the output. Exit 0 when every check passed.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}
if [ ! -x "$B/smelt" ]; then
  B=build-dev
  cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release >$OUT/mla-cmake.log 2>&1 &&
    cmake --build $B -j16 >$OUT/mla-build.log 2>&1 || { tail -30 $OUT/mla-build.log; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/mla-gpu.txt
T0=$(date +%s)
SUM=$OUT/mla-summary.txt; : > $SUM
ok=1
note() { echo "$*" >> $SUM; }

# 3 (background): transformers references of the DeepSeek-V3 fixtures
FX=deepseek_v3_q4_g64_bf16,deepseek_v3_kvb_q4_g64_f16
rm -rf $OUT/golden-mla; mkdir -p $OUT/golden-mla
(timeout 90 python3 tools/make_golden.py --seeds 6 --only $FX $OUT/golden-mla >$OUT/mla-make-golden.log 2>&1
 echo $? > $OUT/mla-make-golden.rc) &
MG=$!

# 1: the op and the models, CUDA vs reference / CPU
SMELT_CPU_EXACT=1 timeout 80 $B/tests/cuda/test_cuda_backend mla >$OUT/mla-cuda-backend.log 2>&1
rb=$?
grep -E "^pass:|^attention_mla|^moe model|FAIL|passed, " $OUT/mla-cuda-backend.log | tail -60
if [ $rb = 0 ]; then note "test_cuda_backend mla: PASS ($(grep -E "passed, " $OUT/mla-cuda-backend.log | tail -1); $(grep -c "^attention_mla" $OUT/mla-cuda-backend.log) op checks, $(grep -c "^moe model" $OUT/mla-cuda-backend.log) model comparisons)"
else ok=0; note "test_cuda_backend mla: FAIL rc=$rb ($(grep -c FAIL $OUT/mla-cuda-backend.log) failed checks, $OUT/mla-cuda-backend.log)"; fi

# 2: ctests of this build
(cd $B && timeout 60 ctest -R "^(golden_cuda|golden|mla|cpu_mla|op_sequence|format_test_config_moe)$" -V \
  >$OUT/mla-ctest.log 2>&1)
rc=$?
grep -E "deepseek_v3.*(logits max_abs|greedy)|tests passed|\*\*\*Failed|Timeout" $OUT/mla-ctest.log | grep -v "KV \|decode" | tail -14
if [ $rc = 0 ]; then note "ctest      PASS ($(grep -Eo '[0-9]+% tests passed.*' $OUT/mla-ctest.log))"
else ok=0; note "ctest      FAIL rc=$rc: $(grep -E 'Failed|Timeout|\*\*\*' $OUT/mla-ctest.log | grep -Eo '[a-z_]+ \.+\**[A-Za-z ]+' | tr '\n' ';')"; fi

# 3: the transformers fixtures, CPU and CUDA
wait $MG
mgrc=$(cat $OUT/mla-make-golden.rc 2>/dev/null || echo none)
tail -6 $OUT/mla-make-golden.log
n=$(ls -d $OUT/golden-mla/*/ 2>/dev/null | wc -l)
if [ "$n" -gt 0 ]; then
  for dev in cpu cuda; do
    SMELT_GOLDEN_DEVICE=$dev timeout 30 $B/tests/golden/test_golden $OUT/golden-mla >$OUT/mla-golden-hf-$dev.log 2>&1
    # the fixture-count check of a full fixture set does not apply to this directory of two
    nf=$(grep -c "FAIL" $OUT/mla-golden-hf-$dev.log); nc=$(grep -c "expected fixtures for" $OUT/mla-golden-hf-$dev.log)
    grep -E "logits max_abs|greedy|FAIL" $OUT/mla-golden-hf-$dev.log | grep -v "decode\|KV\|expected fixtures" | sed "s/^/[hf $dev] /"
    [ $((nf - nc)) = 0 ] || ok=0
    note "golden vs transformers on $dev: $([ $((nf - nc)) = 0 ] && echo PASS || echo "FAIL ($((nf - nc)) checks)"), $n fixtures (make_golden rc $mgrc), greedy 40/40: $(grep -c '40/40' $OUT/mla-golden-hf-$dev.log)"
  done
else ok=0; note "golden vs transformers: no fixture made (make_golden rc $mgrc, $OUT/mla-make-golden.log)"; fi

echo "== MLA summary ($(cat $OUT/mla-gpu.txt), $(( $(date +%s) - T0 )) s) =="
cat $SUM
[ $ok = 1 ] && echo "ALL MLA CHECKS PASSED" || echo "SOME MLA CHECKS FAILED"
[ $ok = 1 ]
