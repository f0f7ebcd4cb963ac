#!/usr/bin/env bash
# Fresh machine: install dependencies, build, run every test; then build everything again with
# ASan+UBSan (CPU only, build-asan/) and run every test there. Warnings are errors in both builds.
# SMELT_TEST_ASAN=0 skips the sanitizer pass (a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."
# CUDA (no GPU here: the kernels must compile, their tests skip) for sm_80 only, half the compile time of
# the default sm_80 + sm_90a: the GPU machine builds sm_90a (bench/cuda/device_run.sh)
# style: the C sources as .clang-format writes them (scripts/format.sh)
if ! command -v clang-format-14 >/dev/null && ! clang-format --version 2>/dev/null | grep -q "version 14"; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-format-14
fi
if ! scripts/format.sh --check; then echo "test.sh: the files above are not formatted (run scripts/format.sh)" >&2; exit 1; fi
SMELT_CMAKE_FLAGS="-DSMELT_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=80 ${SMELT_CMAKE_FLAGS:-}" scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 --timeout 900
[ "${SMELT_TEST_ASAN:-1}" = 0 ] && exit 0
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=OFF -DSMELT_SANITIZE=ON -DSMELT_WERROR=ON >/dev/null
cmake --build build-asan -j"$(nproc)"
# a sanitizer report ends the process with a non-zero status (-fno-sanitize-recover), so the test fails
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1"
ctest --test-dir build-asan --output-on-failure -j2 --timeout 900
