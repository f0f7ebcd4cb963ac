#!/bin/bash
# Hybrid recurrent models on the GPU machine: the CUDA tests of the recurrent ops and hybrid models
# (CUDA vs the CPU backend), the hybrid golden fixtures on CUDA, and speed:
#   - Qwen3.5-9B text-model shape, 4-bit g64, CUDA: prefill 512 and 4,096 tokens (with the achieved
#     matmul TFLOP/s and its ratio to the GPU's dense f16 tensor peak), batch-1 decode and its ratio to
#     the bandwidth roofline (issue target >= 60%);
#   - LFM2-1.2B shape, 4-bit g64, CPU: batch-1 decode and its ratio to the roofline (target >= 70%).
# usage (repo root, after `source bench/cuda/device_env.sh`): bash bench/hybrid/device_check.sh [BUILD_DIR] [golden]
#   BUILD_DIR   a CUDA build (default build-dev); configured and built here only when it has no smelt binary
#   golden      also regenerate the seven hybrid fixtures with transformers (tools/make_golden.py) into
#               $OUT/fixtures and check smelt (CPU and CUDA) against them (not timed into the 150 s)
# Logs go to $OUT (default /tmp/out). The last lines are a summary; RESULT: PASS when every test passed.
set -o pipefail
B=${1:-build-dev}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ ! -x "$B/smelt" ]; then
  echo "building $B ..."
  bash bench/cuda/build_smelt.sh "$B" "$OUT/hybrid" || exit 1
fi
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
SUM=()
FAIL=0

# 1. CUDA vs CPU: recurrent ops (conv1d, ssm_scan, gated_delta, gated_rmsnorm, ...) and every hybrid
#    family's synthetic model (prefill logits, batched decode with mixed lengths), in the test passes
#    that exercise them (fused and unfused, with and without graphs)
timeout 120 "$B/tests/cuda/test_cuda_backend" hybrid >"$OUT/hybrid-cuda-backend.log" 2>&1
rc=$?
grep -E "^hybrid |FAIL" "$OUT/hybrid-cuda-backend.log" | sed 's/^/  /' | head -40
line=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$OUT/hybrid-cuda-backend.log" | tail -1)
[ $rc = 0 ] || FAIL=1
SUM+=("test_cuda_backend hybrid: ${line:-no summary} (rc $rc$([ $rc = 77 ] && echo ': skipped, no GPU'))")

# 2. the hybrid golden fixtures on CUDA, and the fusion counts
FXH=/tmp/smelt-hybrid-fixtures
rm -rf "$FXH" && mkdir -p "$FXH"
for f in tests/golden/fixtures/{qwen3_5,qwen3_next,lfm2,nemotron_h,granitemoehybrid}_*; do ln -s "$PWD/$f" "$FXH/"; done
SMELT_GOLDEN_DEVICE=cuda timeout 120 "$B/tests/golden/test_golden" "$FXH" >"$OUT/hybrid-golden-cuda.log" 2>&1
rc=$?
grep -E "^(qwen3_5|qwen3_next|lfm2|nemotron_h|granitemoehybrid)" "$OUT/hybrid-golden-cuda.log" | grep -E "logits max_abs|greedy" |
  grep -v "KV " | sed 's/^/  /'
greedy=$(grep -E "^(qwen3_5|qwen3_next|lfm2|nemotron_h|granitemoehybrid).*greedy" "$OUT/hybrid-golden-cuda.log" |
  awk '{print $1" "$3}' | tr '\n' ' ')
line=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$OUT/hybrid-golden-cuda.log" | tail -1)
[ $rc = 0 ] || FAIL=1
SUM+=("golden on CUDA, $(ls "$FXH" | wc -l) hybrid fixtures: ${line:-no summary} (rc $rc$([ $rc = 77 ] && echo ': skipped, no GPU')); greedy: ${greedy:-none}")
(cd "$B" && timeout 60 ctest -R "^(cuda_fusions|op_sequence)$" --output-on-failure >"$OUT/hybrid-ctest.log" 2>&1)
rc=$?
[ $rc = 0 ] || FAIL=1
SUM+=("ctest cuda_fusions op_sequence: $(grep -E "tests passed" "$OUT/hybrid-ctest.log" | tail -1) (rc $rc)")
echo "tests done after $(( $(date +%s) - T0 )) s"

# 3. speed (bench --json: one line of JSON)
bench() { # shape device prompt gen -> json line in $OUT/hybrid-bench-<shape>-<device>-p<prompt>.json
  local f="$OUT/hybrid-bench-$1-$2-p$3.json"
  timeout ${BENCH_TO:-90} "$B/smelt" bench --synthetic "$1" --bits 4 --device "$2" --dir /tmp -p "$3" -n "$4" --json \
    >"$f" 2>"${f%.json}.err" || { local rc=$?; echo "  bench $1 $2 p$3 failed (rc $rc): $(tail -3 "${f%.json}.err")"; FAIL=1; return 1; }
}
peak=989  # TFLOP/s, dense f16 tensor cores: H100 SXM / H200
case "$GPU" in *PCIe*) peak=756 ;; esac
report() { # json label
  python3 - "$1" "$2" "$peak" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
label, peak = sys.argv[2], float(sys.argv[3])
# matmul FLOPs per token: 2 per weight parameter read by a decode step (4-bit g64 with 16-bit scale and
# bias: 0.5 + 4/64 bytes a parameter)
params = j["weight_bytes_per_token"] / 0.5625
tflops = j["prefill_tok_s"] * 2 * params / 1e12
s = (f"{label}: prefill {j['prompt_tokens']} tok {j['prefill_tok_s']:.0f} tok/s"
     + (f" (~{tflops:.0f} TFLOP/s matmul, {100 * tflops / peak:.1f}% of {peak:.0f} f16 peak)" if j["backend"] == "cuda" else "")
     + f"; decode {j['decode_tok_s']:.2f} tok/s, {100 * j['roofline_ratio']:.1f}% of roofline"
     + f" ({j['weight_bytes_per_token'] / 1e6:.0f} MB weights + {j.get('state_bytes_per_token', 0) / 1e6:.1f} MB state"
     + f" per token, {j['bandwidth_gb_s']:.0f} GB/s)")
print(s)
EOF
}
if bench qwen3.5-9b cuda 512 128; then SUM+=("$(report "$OUT/hybrid-bench-qwen3.5-9b-cuda-p512.json" "qwen3.5-9b q4 cuda")"); fi
if bench qwen3.5-9b cuda 4096 64; then SUM+=("$(report "$OUT/hybrid-bench-qwen3.5-9b-cuda-p4096.json" "qwen3.5-9b q4 cuda")"); fi
if bench lfm2-1.2b cpu 64 64; then SUM+=("$(report "$OUT/hybrid-bench-lfm2-1.2b-cpu-p64.json" "lfm2-1.2b q4 cpu")"); fi
echo "speed done after $(( $(date +%s) - T0 )) s"

# 4. optional: the hybrid fixtures from transformers, smelt checked against them
if [ "$2" = golden ]; then
  FX="$OUT/fixtures"
  rm -rf "$FX"
  if timeout 300 python3 tools/make_golden.py --only qwen3_5_q4_g64_bf16,qwen3_next_q4_g64_f16,lfm2_q4_g64_bf16,nemotron_h_q4_g64_bf16,granitemoehybrid_q4_g64_f16,qwen3_5_bf16,nemotron_h_bf16 \
      "$FX" >"$OUT/hybrid-make-golden.log" 2>&1; then
    python3 tools/check_golden.py "$FX"/* >"$OUT/hybrid-check-golden.log" 2>&1; c1=$?
    "$B/tests/golden/test_golden" "$FX" >"$OUT/hybrid-golden-tf-cpu.log" 2>&1; c2=$?
    SMELT_GOLDEN_DEVICE=cuda "$B/tests/golden/test_golden" "$FX" >"$OUT/hybrid-golden-tf-cuda.log" 2>&1; c3=$?
    [ $c1 = 0 ] && [ $c2 = 0 ] && [ $c3 = 0 ] || FAIL=1
    SUM+=("transformers fixtures in $FX: check_golden rc $c1, smelt cpu rc $c2, smelt cuda rc $c3 (logs hybrid-*golden*)")
  else
    FAIL=1
    SUM+=("make_golden.py with transformers failed: $(tail -3 "$OUT/hybrid-make-golden.log" | tr '\n' ' ')")
  fi
fi

echo "== hybrid device check ($GPU, $(( $(date +%s) - T0 )) s) =="
for s in "${SUM[@]}"; do echo "$s"; done
[ $FAIL = 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL (logs in $OUT)"
exit $FAIL
