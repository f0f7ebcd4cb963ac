#!/bin/bash
# The hybrid mixture-of-experts golden fixtures (qwen3_5_moe, qwen3_next with experts, lfm2_moe) on the GPU
# machine: remakes them in tests/golden/fixtures with transformers as the reference (tools/make_golden.py
# --keep-seed: the seeds they have, no seed search), checks them with the independent numpy forward
# (tools/check_golden.py), then runs smelt's golden test on them on the CPU and on CUDA.
# usage (repo root, after `source bench/cuda/device_env.sh`): bash bench/hybrid/device_golden_moe.sh [BUILD_DIR]
#   BUILD_DIR   a CUDA build (default build-dev); configured and built here only when it has no test_golden
# Logs go to $OUT (default /tmp/out). The last lines are a summary; RESULT: PASS when every step passed.
# The remade fixtures are left in tests/golden/fixtures (their manifests name transformers as the reference)
# for the lead to commit.
set -o pipefail
B=${1:-build-dev}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
NAMES="qwen3_5_moe_q4_g64_bf16 qwen3_5_moe_bf16 qwen3_next_moe_q4_g64_bf16 lfm2_moe_q4_g64_bf16"
FX=tests/golden/fixtures
if [ ! -x "$B/tests/golden/test_golden" ]; then
  echo "building $B ..."
  bash bench/cuda/build_smelt.sh "$B" "$OUT/golden-moe" || exit 1
fi
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
SUM=()
FAIL=0
ref_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['reference'][:60])" "$FX/$1/manifest.json" 2>/dev/null; }

# 1. transformers reference (float32, CPU, eager attention) for the four fixtures, in place
PYTHONUNBUFFERED=1 timeout 150 python3 tools/make_golden.py --keep-seed --only "$(echo $NAMES | tr ' ' ',')" "$FX" \
  >"$OUT/golden-moe-make.log" 2>&1
rc=$?
[ $rc = 0 ] || FAIL=1
sed -n '/^fixture /,$p' "$OUT/golden-moe-make.log" | sed 's/^/  /'
grep -E "config keys not accepted|NOTE" "$OUT/golden-moe-make.log" | sed 's/^/  /'
[ $rc = 0 ] || grep -E "Error|error" "$OUT/golden-moe-make.log" | tail -6 | sed 's/^/  make_golden: /'
SUM+=("make_golden.py (transformers): rc $rc$([ $rc = 124 ] && echo ': timed out')")
for n in $NAMES; do SUM+=("  $n reference: $(ref_of $n)"); done

# 2. the numpy float64 forward against them (independent of transformers and of smelt)
timeout 60 python3 tools/check_golden.py $(for n in $NAMES; do echo "$FX/$n"; done) >"$OUT/golden-moe-numpy.log" 2>&1
rc=$?
[ $rc = 0 ] || FAIL=1
sed 's/^/  /' "$OUT/golden-moe-numpy.log"
SUM+=("check_golden.py (numpy): $(tail -1 "$OUT/golden-moe-numpy.log") (rc $rc)")

# 3. smelt against them: CPU, then CUDA
for dev in cpu cuda; do
  log="$OUT/golden-moe-$dev.log"
  if [ $dev = cuda ]; then export SMELT_GOLDEN_DEVICE=cuda; else unset SMELT_GOLDEN_DEVICE; fi
  timeout 120 "$B/tests/golden/test_golden" "$FX" $NAMES >"$log" 2>&1
  rc=$?
  [ $rc = 0 ] || FAIL=1
  grep -E "logits max_abs|greedy:" "$log" | grep -v " KV " | sed "s/^/  $dev: /"
  grep -E "^FAIL" "$log" | head -10 | sed "s/^/  $dev: /"
  greedy=$(grep -E "greedy:" "$log" | awk '{print $1" "$3}' | tr '\n' ' ')
  SUM+=("smelt golden on $dev: $(grep -E "^[0-9]+ passed, [0-9]+ failed" "$log" | tail -1) (rc $rc$([ $rc = 77 ] && echo ': skipped')); greedy: ${greedy:-none}")
done
unset SMELT_GOLDEN_DEVICE

echo "== hybrid MoE golden fixtures (${GPU:-no GPU}, $(( $(date +%s) - T0 )) s) =="
for s in "${SUM[@]}"; do echo "$s"; done
echo "fixtures remade in place: git status --short $FX"
git status --short "$FX" 2>/dev/null | sed 's/^/  /'
[ $FAIL = 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL (logs in $OUT)"
exit $FAIL
