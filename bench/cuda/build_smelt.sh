#!/bin/bash
# Configures (Release, sm_90: the GPU machines' H100 and H200) and builds smelt in BUILD_DIR for the
# device scripts; logs LOG_PREFIX-cmake.log and LOG_PREFIX-build.log. A new build directory gets Ninja
# when it is installed; an existing one keeps its generator. On failure: the logs' tails, exit 1.
# usage (repo root): bash bench/cuda/build_smelt.sh BUILD_DIR LOG_PREFIX [JOBS (default 16)]
set -o pipefail
B=$1 P=$2 J=${3:-16}
G=()
[ ! -f "$B/CMakeCache.txt" ] && command -v ninja >/dev/null && G=(-G Ninja)
cmake -S . -B "$B" "${G[@]}" -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >"$P-cmake.log" 2>&1 &&
  cmake --build "$B" -j"$J" >"$P-build.log" 2>&1 || { tail -n 30 "$P-build.log" "$P-cmake.log"; exit 1; }
