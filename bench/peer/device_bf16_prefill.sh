#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): bf16 prefill and decode side by
# side, smelt's Llama-3.1-8B-shaped bf16 synthetic checkpoint (`smelt bench --synthetic 8b --bits 0`)
# against llama.cpp on a random BF16 GGUF of the same shape (bench/peer/make_gguf.py --bf16,
# `llama-bench -ngl 99 -fa 1 -p 512,2048 -n 128 -r 3`), smelt with `-p 512` and `-p 2048`, `-n 32 -r 3`;
# two rounds, alternating. The GGUF is 16 GB and takes the host under a minute to write; llama.cpp's
# CUDA build about 4 minutes on 24 cores. A tree from bench/peer/pack_llamacpp.sh (unpacked into
# LLAMA_CPP_DIR) needs LLAMA_CMAKE_FLAGS="-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF".
# usage: bash bench/peer/device_bf16_prefill.sh BUILD_DIR LLAMA_CPP_DIR [LLAMA_BUILD_DIR] (SHAPE=1b: the 1B shape)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}; L=${2:-llamacpp}; LB=${3:-build-llama}; SH=${SHAPE:-8b}
T0=$(date +%s)
if [ ! -x $LB/bin/llama-bench ]; then
  (bash bench/peer/build_llamacpp.sh $L $LB cuda 12 $OUT llama-bench; echo $? >$OUT/llama-build.rc) &
fi
(python3 bench/peer/make_gguf.py $L $SH /tmp/$SH-bf16.gguf --bf16 >$OUT/gguf-$SH-bf16.log 2>&1 || echo "gguf $SH bf16 failed") &
if [ ! -x "$B/smelt" ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a >$OUT/smelt-cmake.log 2>&1 &&
    cmake --build $B -j4 --target smelt >$OUT/smelt-build.log 2>&1 || { tail -20 $OUT/smelt-build.log; exit 1; }
fi
$B/smelt bench --synthetic $SH --bits 0 --device cuda --dir /tmp -p 16 -n 2 >/dev/null 2>&1 # the checkpoint, written once
wait
echo "builds and models ($(( $(date +%s) - T0 )) s), llama.cpp build rc $(cat $OUT/llama-build.rc 2>/dev/null)"
nvidia-smi --query-gpu=name --format=csv,noheader
export LD_LIBRARY_PATH=$PWD/$LB/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for r in 1 2; do
  $LB/bin/llama-bench -m /tmp/$SH-bf16.gguf -ngl 99 -fa 1 -p 512,2048 -n 128 -r 3 2>&1 | tee -a $OUT/llama-$SH-bf16.log |
    grep -E "pp512|pp2048|tg128|error" | sed "s/^/[llama.cpp $SH bf16 r$r] /"
  for p in 512 2048; do
    $B/smelt bench --synthetic $SH --bits 0 --device cuda --dir /tmp -p $p -n 32 -r 3 2>&1 | grep -E "prefill " |
      sed "s/^/[smelt $SH bf16 -p $p r$r] /"
  done
done
rm -f /tmp/$SH-bf16.gguf
echo "done ($(( $(date +%s) - T0 )) s)"
