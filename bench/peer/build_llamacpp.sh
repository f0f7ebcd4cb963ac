#!/bin/bash
# Builds llama.cpp from a source tree for the side-by-side benchmarks (bench/cuda/device_long.sh,
# bench/moe/device_speed.sh, bench/cpu/device_check.sh and device_cpu.sh):
# one configuration per backend, Release, no curl, no tests; logs llama-cmake.log and
# llama-build.log in LOG_DIR. Exit status: the build's.
#   cuda: GGML_CUDA for sm_90 (the GPU machines' H100 and H200)
#   cpu:  CPU only, GGML_NATIVE, no server
# LLAMA_CMAKE_FLAGS: more cmake flags, e.g. -DGGML_CPU_AARCH64=OFF (the February 2025 tree's runtime
# repacking of Q4_0 aborts in the CPU decode of mixtures of experts, GGML_ASSERT in ggml-cpu-aarch64.cpp)
# usage: bash bench/peer/build_llamacpp.sh SRC BUILD_DIR cuda|cpu JOBS LOG_DIR TARGET...
set -o pipefail
SRC=$1 BD=$2 KIND=$3 J=$4 LOG=$5
shift 5
case $KIND in
  cuda) FLAGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" ;;
  cpu) FLAGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_BUILD_SERVER=OFF" ;;
  *) echo "build_llamacpp.sh: '$KIND': expected cuda or cpu" >&2; exit 2 ;;
esac
mkdir -p "$LOG"
cmake -S "$SRC" -B "$BD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF $FLAGS ${LLAMA_CMAKE_FLAGS:-} \
  >"$LOG/llama-cmake.log" 2>&1 &&
  cmake --build "$BD" -j"$J" --target "$@" >"$LOG/llama-build.log" 2>&1
