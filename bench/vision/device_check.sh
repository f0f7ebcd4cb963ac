#!/bin/bash
# Image input on the GPU machine: the CUDA ctests of the vision ops and the golden vision fixtures on
# CUDA (with the CUDA text goldens and fusion counts: the attention kernels take image spans), then
# the time to encode one image with random-weight towers of real shapes (bench/vision/make_synth.py):
# Qwen2.5-VL-7B's ViT on a 1024x768 image (999 tokens) and Gemma 3 4B's SigLIP at 896x896 (256 tokens).
# usage (repo root, after `source bench/cuda/device_env.sh`): bash bench/vision/device_check.sh [BUILD_DIR]
#   BUILD_DIR (default build-dev) is built as below when it does not exist.
set -o pipefail
B=${1:-build-dev}
T=${TMPDIR:-/tmp}
if [ ! -d "$B" ]; then
  cmake -S . -B "$B" -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >"$T/vision-cmake.log" 2>&1 &&
    cmake --build "$B" -j16 >"$T/vision-build.log" 2>&1 || { tail -n 30 "$T/vision-build.log" "$T/vision-cmake.log"; exit 1; }
fi
[ -x "$B/bench/vision/bench_vision" ] || { cmake -S . -B "$B" >/dev/null && cmake --build "$B" -j16 --target bench_vision >/dev/null; } || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fail=0

echo "== ctest (CUDA): vision ops, golden vision fixtures, text goldens, fusions"
(cd "$B" && timeout 100 ctest -j4 -R '^(cuda_encoder|golden_vision_cuda|golden_cuda|cuda_fusions)$' \
  --output-on-failure >"$T/vision-ctest.log" 2>&1)
rc=$?
grep -E "Test +#|tests passed|tests failed" "$T/vision-ctest.log"
grep -E "golden_vision|max_abs|greedy" "$T/vision-ctest.log" | grep -iE "fail|differ" | head -20
if grep -q "Skipped" "$T/vision-ctest.log"; then fail=1; echo "ctest: tests SKIPPED (no GPU or no CUDA build?)"; fi
[ $rc = 0 ] || { fail=1; echo "ctest FAILED (rc $rc; log $T/vision-ctest.log):"; grep -E "FAIL|CHECK|error" "$T/vision-ctest.log" | head -30; }

echo "== image encoding (random weights, bf16 towers, CUDA)"
summary=()
for s in "qwen2_5_vl_7b 1024 768" "gemma3_4b 896 896"; do
  set -- $s
  d=$T/vsynth-$1
  if [ ! -f "$d/model.safetensors" ]; then
    timeout 60 python3 bench/vision/make_synth.py $1 "$d" || { echo "$1: make_synth FAILED"; fail=1; continue; }
  fi
  line=$(timeout 60 "$B/bench/vision/bench_vision" "$d" $2 $3 16 cuda 2>&1 | tee /dev/stderr | grep "^image ")
  [ -n "$line" ] || { echo "$1: bench FAILED"; fail=1; continue; }
  summary+=("$1: $line")
done

echo "== summary"
grep -E "tests passed|tests failed" "$T/vision-ctest.log"
for l in "${summary[@]}"; do echo "$l"; done
[ $fail = 0 ] && echo "VISION DEVICE CHECK: OK" || echo "VISION DEVICE CHECK: FAILED"
exit $fail
