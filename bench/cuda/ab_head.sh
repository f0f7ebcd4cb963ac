#!/bin/bash
# A/B of the working tree against a reference tree, interleaved, on the GPU machine.
# Before the device call, here: mkdir -p ab-ref && git archive HEAD CMakeLists.txt src include | tar -x -C ab-ref
# (an untracked directory travels with the working tree). Then: bash bench/cuda/ab_head.sh
# AB_ROUNDS (default "1 2"), AB_EXTRA ("ENV=v ..." entries run with the working tree only).
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
REF=${REF:-ab-ref}
[ -f $REF/CMakeLists.txt ] || { echo "no reference tree in $REF"; exit 1; }
bash bench/cuda/device_run.sh >/dev/null 2>&1 || { echo "build of the working tree failed"; exit 1; }
source bench/cuda/device_env.sh
cmake -S $REF -B build-ref -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >$OUT/cmake-ref.log 2>&1 || { tail $OUT/cmake-ref.log; exit 1; }
cmake --build build-ref -j16 --target smelt >$OUT/build-ref.log 2>&1 || { tail $OUT/build-ref.log; exit 1; }
run() { # build shape prompt env...
  local b=$1 sh=$2 p=$3; shift 3
  env "$@" timeout 120 $b/smelt bench --synthetic $sh --bits 4 --device cuda --dir /tmp -p $p -n 128 2>&1 | grep -E "decode " | sed "s#^#[$b $sh p$p $*] #"
}
for i in ${AB_ROUNDS:-1 2}; do
  for b in build-dev build-ref; do run $b 8b 512 X=0; done
  for b in build-dev build-ref; do run $b 1b 512 X=0; done
done
for b in build-dev build-ref; do run $b 8b 2200 X=0; done
for e in ${AB_EXTRA:-}; do run build-dev 8b 512 $e; done
