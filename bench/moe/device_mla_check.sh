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
#   3. the DeepSeek-V3 fixtures remade in tests/golden/fixtures with transformers as the reference
#      (tools/make_golden.py --keep-seed: the seeds they have), checked with the independent numpy forward
#      (tools/check_golden.py) and with smelt's golden test on the CPU and on CUDA (git diff shows the new
#      fixtures; commit them when everything passed)
# Without BUILD_DIR (or if it has no build) it configures and builds build-dev for sm_90.
# Logs go to $OUT (default /tmp/out); the summary ends the output. Exit 0 when every check passed.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}
if [ ! -x "$B/smelt" ]; then
  B=build-dev
  bash bench/cuda/build_smelt.sh $B $OUT/mla || exit 1
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/mla-gpu.txt
T0=$(date +%s)
SUM=$OUT/mla-summary.txt; : > $SUM
ok=1
note() { echo "$*" >> $SUM; }

# 3 (background): transformers references of the DeepSeek-V3 fixtures, made in a copy first: step 2 reads
# tests/golden/fixtures meanwhile
NAMES="deepseek_v3_q4_g64_bf16 deepseek_v3_kvb_q4_g64_f16"
FX=tests/golden/fixtures
rm -rf $OUT/golden-mla; mkdir -p $OUT/golden-mla
for n in $NAMES; do cp -r $FX/$n $OUT/golden-mla/; done
(PYTHONUNBUFFERED=1 timeout 90 python3 tools/make_golden.py --keep-seed --only "$(echo $NAMES | tr ' ' ',')" \
   $OUT/golden-mla >$OUT/mla-make-golden.log 2>&1
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

# 3: the transformers fixtures: the numpy forward, then smelt on the CPU and on CUDA
wait $MG
mgrc=$(cat $OUT/mla-make-golden.rc 2>/dev/null || echo none)
tail -6 $OUT/mla-make-golden.log
if [ "$mgrc" = 0 ] && grep -q transformers $OUT/golden-mla/deepseek_v3_q4_g64_bf16/manifest.json; then
  timeout 60 python3 tools/check_golden.py $(for n in $NAMES; do echo "$OUT/golden-mla/$n"; done) \
    >$OUT/mla-golden-numpy.log 2>&1
  r=$?
  tail -3 $OUT/mla-golden-numpy.log
  [ $r = 0 ] || ok=0
  note "check_golden.py (numpy) on the transformers fixtures: $([ $r = 0 ] && echo PASS || echo FAIL rc=$r)"
  for dev in cpu cuda; do
    SMELT_GOLDEN_DEVICE=$dev timeout 30 $B/tests/golden/test_golden $OUT/golden-mla $NAMES >$OUT/mla-golden-hf-$dev.log 2>&1
    r=$?
    grep -E "logits max_abs|greedy|FAIL" $OUT/mla-golden-hf-$dev.log | grep -v "decode\|KV" | sed "s/^/[hf $dev] /"
    [ $r = 0 ] || ok=0
    note "golden vs transformers on $dev: $([ $r = 0 ] && echo PASS || echo FAIL rc=$r), greedy 40/40: $(grep -c '40/40' $OUT/mla-golden-hf-$dev.log) of 2"
  done
  [ $ok = 1 ] && for n in $NAMES; do rm -rf $FX/$n; cp -r $OUT/golden-mla/$n $FX/; done &&
    note "the transformers fixtures are in $FX (git status shows them)"
else ok=0; note "golden vs transformers: no fixture made (make_golden rc $mgrc, $OUT/mla-make-golden.log)"; fi

echo "== MLA summary ($(cat $OUT/mla-gpu.txt), $(( $(date +%s) - T0 )) s) =="
cat $SUM
[ $ok = 1 ] && echo "ALL MLA CHECKS PASSED" || echo "SOME MLA CHECKS FAILED"
[ $ok = 1 ]
