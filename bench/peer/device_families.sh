#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): dense families' decode and
# prefill, smelt against llama.cpp side by side (docs/benchmarks.md): the Phi-4-mini and
# Mistral-Small-24B shapes at 4 bits (random weights; llama.cpp: random Q4_0 GGUFs of the same shapes
# from bench/peer/make_gguf.py, `llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 2`), and smelt alone for
# SHAPES (default "gemma3-4b 8b"; the llama.cpp tree here predates Gemma 3).
# usage: bash bench/peer/device_families.sh BUILD_DIR LLAMA_CPP_DIR [LLAMA_BUILD_DIR]
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}; L=${2:-llamacpp}; LB=${3:-build-llama}
T0=$(date +%s)
if [ ! -x $LB/bin/llama-bench ]; then
  (bash bench/peer/build_llamacpp.sh $L $LB cuda 10 $OUT llama-bench; echo $? >$OUT/llama-build.rc) &
fi
(for sh in phi4-mini mistral-small-24b; do python3 bench/peer/make_gguf.py $L $sh /tmp/$sh.gguf >$OUT/gguf-$sh.log 2>&1 || echo "gguf $sh failed"; done) &
[ -x "$B/smelt" ] || bash bench/cuda/build_smelt.sh $B $OUT/smelt 16 || exit 1
wait
echo "builds and models ($(( $(date +%s) - T0 )) s)"
nvidia-smi --query-gpu=name --format=csv,noheader
export LD_LIBRARY_PATH=$PWD/$LB/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for sh in phi4-mini mistral-small-24b; do
  $LB/bin/llama-bench -m /tmp/$sh.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 2 2>&1 | tee $OUT/llama-$sh.log | grep -E "pp512|tg128|error" | sed "s/^/[llama.cpp $sh] /"
  $B/smelt bench --synthetic $sh --bits 4 --device cuda --dir /tmp -p 512 -n 128 -r 2 2>&1 | grep -E "decode |prefill |roofline" | sed "s/^/[smelt $sh] /"
  rm -f /tmp/$sh.gguf
done
for sh in ${SHAPES:-gemma3-4b 8b}; do
  $B/smelt bench --synthetic $sh --bits 4 --device cuda --dir /tmp -p 512 -n 128 -r 2 2>&1 | grep -E "decode |prefill |roofline" | sed "s/^/[smelt $sh] /"
done
echo "done ($(( $(date +%s) - T0 )) s)"
