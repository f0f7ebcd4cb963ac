#!/bin/bash
# A/B of the working tree against a reference tree, interleaved, on the GPU machine.
# Before the device call, here: mkdir -p ab-ref && git archive REV CMakeLists.txt cmake src include | tar -x -C ab-ref
# (an untracked directory travels with the working tree). Then: bash bench/cuda/ab_head.sh
# AB_ROUNDS (default "1 2 3"), AB_LONG=1: also 8B after a 2,200-token prompt, AB_BF16=1: also 8B bf16.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
REF=${REF:-ab-ref}
[ -f $REF/CMakeLists.txt ] || { echo "no reference tree in $REF"; exit 1; }
bash bench/cuda/device_run.sh >/dev/null 2>&1 || { echo "build of the working tree failed"; exit 1; }
source bench/cuda/device_env.sh
if [ ! -x build-ref/smelt ]; then
  cmake -S $REF -B build-ref -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a >$OUT/cmake-ref.log 2>&1 || { tail $OUT/cmake-ref.log; exit 1; }
  cmake --build build-ref -j16 --target smelt >$OUT/build-ref.log 2>&1 || { tail $OUT/build-ref.log; exit 1; }
fi
run() { # build shape bits prompt
  timeout 300 $1/smelt bench --synthetic $2 --bits $3 --device cuda --dir /tmp -p $4 -n 128 2>&1 | grep -E "decode |prefill " | tr '\n' ' ' | sed "s#^#[$1 $2 bits $3 p$4] #"; echo
}
for i in ${AB_ROUNDS:-1 2 3}; do
  for b in build-dev build-ref; do run $b 8b 4 512; done
  for b in build-dev build-ref; do run $b 1b 4 512; done
done | tee -a $OUT/ab.txt
[ -n "$AB_LONG" ] && for b in build-dev build-ref; do run $b 8b 4 2200; done | tee -a $OUT/ab.txt
[ -n "$AB_BF16" ] && for b in build-dev build-ref; do run $b 8b 0 512; done | tee -a $OUT/ab.txt
