#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): speculative decoding in
# `smelt serve` on CUDA with the built-in model. 1) tests/server/test_spec.py on CUDA: outputs with
# a draft model (smelt-tiny-draft) and with n-gram lookup against a server without speculation
# (greedy outputs may differ only at a near tie of the plain output's two best tokens, since
# CUDA's one-token and multi-token kernels round differently; the count of equal outputs is
# printed per group). 2) generated tok/s with and without speculation, 1 and 16 concurrent
# requests of 128 greedy tokens, with the fraction of outputs equal to plain decoding.
# usage: bash bench/server/device_spec_check.sh [BUILD_DIR]   (built here when it has no smelt)
set -o pipefail
B=${1:-build-dev}
if [ ! -x "$B/smelt" ]; then
  cmake -S . -B "$B" -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >/tmp/spec-cmake.log 2>&1 &&
    cmake --build "$B" -j16 --target smelt >/tmp/spec-build.log 2>&1 || {
    tail -n 30 /tmp/spec-cmake.log /tmp/spec-build.log
    exit 1
  }
fi
echo "== 1. speculative == plain on CUDA (tests/server/test_spec.py)"
SMELT_SPEC_DEVICE=cuda timeout 75 python3 tests/server/test_spec.py "$B/smelt" models
rc=$?
echo "test_spec.py exit status: $rc (0 passed, 77 no GPU, else failed)"
echo "== 2. speed on CUDA (built-in model, 128 greedy tokens per request)"
for n in 1 16; do
  SMELT_SPEC_DEVICE=cuda timeout 20 python3 tests/server/test_spec.py "$B/smelt" models --bench $n
done
exit $rc
