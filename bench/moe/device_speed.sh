#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): Qwen3-30B-A3B-shape decode and
# prefill, smelt against llama.cpp side by side (docs/moe.md).
# usage: bash bench/moe/device_speed.sh BUILD_DIR LLAMA_CPP_DIR
#   smelt: `smelt bench --synthetic qwen3-30b-a3b --bits 4` (random 4-bit g64 weights), prefill 512 and
#   128 decode steps. llama.cpp: llama-bench on a random Q4_0 GGUF of the same shape
#   (bench/peer/make_gguf.py 30b-a3b), -p 512 -n 128, flash attention on.
# Without BUILD_DIR (or if it has no build) it configures and builds build-dev for sm_90.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}; L=${2:-llamacpp}
T0=$(date +%s)
# llama.cpp builds in the background while smelt builds and its model is written
(bash bench/peer/build_llamacpp.sh $L $L/build cuda 12 $OUT llama-bench; echo $? >$OUT/llama-build.rc) &
LB=$!
(python3 bench/peer/make_gguf.py $L 30b-a3b /tmp/m30b.gguf >$OUT/gguf.log 2>&1; echo $? >$OUT/gguf.rc) &
GG=$!
if [ ! -x "$B/smelt" ]; then
  B=build-dev
  bash bench/cuda/build_smelt.sh $B $OUT/smelt 8 || exit 1
fi
echo "smelt built ($(( $(date +%s) - T0 )) s)"
nvidia-smi --query-gpu=name --format=csv,noheader
$B/smelt bench --synthetic qwen3-30b-a3b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | tee $OUT/smelt-30b.log |
  grep -E "prefill|decode|roofline"
wait $GG; wait $LB
echo "llama.cpp build rc $(cat $OUT/llama-build.rc), gguf rc $(cat $OUT/gguf.rc) ($(( $(date +%s) - T0 )) s)"
tail -3 $OUT/gguf.log
export LD_LIBRARY_PATH=$L/build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
$L/build/bin/llama-bench -m /tmp/m30b.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 2 2>&1 | tee $OUT/llama-30b.log | grep -E "model|pp512|tg128|error"
sd=$(grep -Eo 'decode +128 tokens: [0-9.]+' $OUT/smelt-30b.log | grep -Eo '[0-9.]+$')
sp=$(grep -Eo 'prefill +512 tokens: [0-9.]+' $OUT/smelt-30b.log | grep -Eo '[0-9.]+$')
lp=$(grep -E "pp512" $OUT/llama-30b.log | awk -F'|' '{print $(NF-1)}' | grep -Eo '^ *[0-9.]+' | tr -d ' ')
ld=$(grep -E "tg128" $OUT/llama-30b.log | awk -F'|' '{print $(NF-1)}' | grep -Eo '^ *[0-9.]+' | tr -d ' ')
echo "== 30B-A3B shape: smelt decode $sd tok/s, llama.cpp $ld -> $(python3 -c "print(round($sd/$ld,2))" 2>/dev/null)x;" \
     "prefill 512: smelt $sp, llama.cpp $lp -> $(python3 -c "print(round($sp/$lp,2))" 2>/dev/null)x ($(( $(date +%s) - T0 )) s)"
rm -f /tmp/m30b.gguf
