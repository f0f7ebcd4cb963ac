#!/bin/bash
# On the GPU machine (repo root, after `source bench/cuda/device_env.sh`): a mixture-of-experts shape's decode
# and prefill, smelt against llama.cpp side by side in one call (docs/moe.md, docs/benchmarks.md).
# usage: bash bench/moe/device_speed.sh BUILD_DIR LLAMA_CPP [SHAPE]
#   LLAMA_CPP: a llama.cpp source tree, or a tarball of one (bench/peer/pack_llamacpp.sh), unpacked into
#   build-llama/src and built with LLAMA_CMAKE_FLAGS="-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
#   SHAPE: 30b-a3b (default): `smelt bench --synthetic qwen3-30b-a3b --bits 4` (random 4-bit g64 weights)
#     against a random Q4_0 GGUF of the same shape (bench/peer/make_gguf.py 30b-a3b);
#     gpt-oss-20b: `smelt bench --synthetic gpt-oss-20b --bits 8` (mxfp4 experts, the rest 8-bit) against
#     make_gguf.py's gpt-oss-20b (MXFP4 experts, Q8_0 elsewhere).
#   Both: prefill 512 and 128 decode steps, two rounds after both builds are done (llama-bench -fa 1 -r 3,
#   smelt -r 3).
# Without BUILD_DIR (or if it has no build) it configures and builds build-dev for sm_90.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}; L=${2:-llamacpp}; SHAPE=${3:-30b-a3b}
case $SHAPE in
  30b-a3b) SYN="qwen3-30b-a3b --bits 4" ;;
  gpt-oss-20b) SYN="gpt-oss-20b --bits 8" ;;
  *) echo "device_speed.sh: shape '$SHAPE': expected 30b-a3b or gpt-oss-20b" >&2; exit 2 ;;
esac
T0=$(date +%s)
# the two models (about 17 GB each for 30b-a3b) go to memory when /dev/shm holds them: written to the
# GPU machine's disk they took over 250 s
D=/tmp
[ "$(df --output=avail -k /dev/shm 2>/dev/null | tail -1)" -gt 50000000 ] 2>/dev/null && D=/dev/shm
if [ -f "$L" ]; then # a tarball
  mkdir -p build-llama/src
  [ -f build-llama/src/CMakeLists.txt ] || tar xJf "$L" -C build-llama/src || exit 1
  L=build-llama/src
  export LLAMA_CMAKE_FLAGS="${LLAMA_CMAKE_FLAGS:--DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
fi
# llama.cpp builds in the background while smelt builds and the models are written (the deps' pkg-config
# paths are smelt's only)
(env -u PKG_CONFIG_LIBDIR -u PKG_CONFIG bash bench/peer/build_llamacpp.sh $L $L/build cuda 12 $OUT llama-bench
 echo $? >$OUT/llama-build.rc) &
LB=$!
GG=$D/moe-$SHAPE.gguf
(python3 bench/peer/make_gguf.py $L $SHAPE $GG >$OUT/gguf.log 2>&1; echo $? >$OUT/gguf.rc) &
GP=$!
if [ ! -x "$B/smelt" ]; then
  B=build-dev
  bash bench/cuda/build_smelt.sh $B $OUT/smelt 8 || exit 1
fi
echo "smelt built ($(( $(date +%s) - T0 )) s)"
$B/smelt bench --synthetic $SYN --device cpu -t 4 --dir $D -p 1 -n 2 >$OUT/write.log 2>&1 || { tail -3 $OUT/write.log; exit 1; }
wait $GP; wait $LB
echo "llama.cpp build rc $(cat $OUT/llama-build.rc), gguf rc $(cat $OUT/gguf.rc) ($(( $(date +%s) - T0 )) s)"
[ "$(cat $OUT/llama-build.rc)" = 0 ] || tail -20 $OUT/llama-cmake.log $OUT/llama-build.log
tail -3 $OUT/gguf.log
nvidia-smi --query-gpu=name --format=csv,noheader
LBIN=$(find $L/build -name llama-bench -type f | head -1)
export LD_LIBRARY_PATH=$(dirname "$LBIN")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for r in 1 2; do
  $B/smelt bench --synthetic $SYN --device cuda --dir $D -p 512 -n 128 -r 3 2>&1 | tee $OUT/smelt-$r.log |
    grep -E "prefill|decode|roofline" | sed "s/^/[round $r smelt] /"
  $LBIN -m $GG -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | tee $OUT/llama-$r.log | grep -E "pp512|tg128|error" |
    sed "s/^/[round $r llama.cpp] /"
  sd=$(grep -Eo 'decode +128 tokens: [0-9.]+' $OUT/smelt-$r.log | grep -Eo '[0-9.]+$')
  sp=$(grep -Eo 'prefill +512 tokens: [0-9.]+' $OUT/smelt-$r.log | grep -Eo '[0-9.]+$')
  lp=$(grep -E "pp512" $OUT/llama-$r.log | awk -F'|' '{print $(NF-1)}' | grep -Eo '^ *[0-9.]+' | tr -d ' ')
  ld=$(grep -E "tg128" $OUT/llama-$r.log | awk -F'|' '{print $(NF-1)}' | grep -Eo '^ *[0-9.]+' | tr -d ' ')
  echo "== $SHAPE round $r: smelt decode $sd tok/s, llama.cpp $ld -> $(python3 -c "print(round($sd/$ld,2))" 2>/dev/null)x;" \
       "prefill 512: smelt $sp, llama.cpp $lp -> $(python3 -c "print(round($sp/$lp,2))" 2>/dev/null)x ($(( $(date +%s) - T0 )) s)"
done
rm -f $GG
[ $D = /dev/shm ] && rm -rf $D/smelt-bench-*
