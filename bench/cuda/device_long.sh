#!/bin/bash
# Long prompts side by side (docs/benchmarks.md, issue 34): smelt and llama.cpp on the Llama-3.1-8B
# shape at 4 bits, prefill of PP tokens (default 4096 16384 65536) and decode at those depths, the 1B
# shape at 16,384, in one call on the GPU machine.
# usage (repo root, after `source bench/cuda/device_env.sh`): bash bench/cuda/device_long.sh BUILD_DIR LLAMA_CPP_DIR
#   smelt: `smelt bench --synthetic 8b --bits 4 -p N -n 128` (f16 KV). llama.cpp: random Q4_0 GGUFs of
#   the same shapes (bench/peer/make_gguf.py), `llama-bench -fa 1 -p N -r 1`, decode at depth from
#   `llama-batched-bench`'s eval time of one sequence.
#   SW="ENV=v|ENV=w": smelt's decode runs once per entry (A/B of tuning values).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${1:-build-dev}; L=${2:-llamacpp}
PP=${PP:-4096 16384 65536}
T0=$(date +%s)
(bash bench/peer/build_llamacpp.sh $L $L/build cuda 10 $OUT llama-bench llama-batched-bench; echo $? >$OUT/llama-build.rc) &
LB=$!
(for s in 8b 1b; do python3 bench/peer/make_gguf.py $L $s /tmp/m$s.gguf || exit 1; done >$OUT/gguf.log 2>&1; echo $? >$OUT/gguf.rc) &
GG=$!
if [ ! -x "$B/smelt" ]; then
  bash bench/cuda/build_smelt.sh $B $OUT/smelt 6 || exit 1
fi
echo "smelt built ($(( $(date +%s) - T0 )) s)"
nvidia-smi --query-gpu=name --format=csv,noheader
sb() { # shape prompt tag [env]
  env $4 timeout 300 $B/smelt bench --synthetic $1 --bits 4 --device cuda --dir /tmp -p $2 -n ${NG:-128} 2>&1 |
    grep -E "prefill |decode |roofline" | sed "s/^/[smelt $3] /" | tee -a $OUT/smelt-long.txt
}
IFS='|' read -ra ents <<< "${SW:-X=0}"
for p in $PP; do
  for ent in "${ents[@]}"; do NG=$([ $p -gt 32768 ] && echo 64 || echo 128) sb 8b $p "8b p$p $ent" "$ent"; done
done
sb 1b 16384 "1b p16384"
wait $GG; wait $LB
echo "llama.cpp build rc $(cat $OUT/llama-build.rc), gguf rc $(cat $OUT/gguf.rc) ($(( $(date +%s) - T0 )) s)"
export LD_LIBRARY_PATH=$L/build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
LBIN=$L/build/bin
$LBIN/llama-bench -m /tmp/m8b.gguf -ngl 99 -fa 1 -p $(echo $PP | tr ' ' ',') -n 128 -r 1 2>&1 | tee $OUT/llama-long.txt |
  grep -E "model|pp|tg|error"
$LBIN/llama-bench -m /tmp/m1b.gguf -ngl 99 -fa 1 -p 16384 -n 0 -r 1 2>&1 | tee -a $OUT/llama-long.txt | grep -E "pp|error"
for d in $PP; do
  echo "llama.cpp decode after $d: $($LBIN/llama-batched-bench -m /tmp/m8b.gguf -ngl 99 -fa -c $((d + 256)) -npp $d \
    -ntg 128 -npl 1 2>&1 | grep -E 'eval time|error' | head -2)" | tee -a $OUT/llama-long.txt
done
echo "done ($(( $(date +%s) - T0 )) s)"
