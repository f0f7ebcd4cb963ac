#!/bin/bash
# llama.cpp side by side with smelt on the GPU machine (docs/benchmarks.md): builds llama-bench and
# llama-batched-bench from a llama.cpp source tree (CUDA, sm_90), writes random-weight Q4_0 GGUFs of the
# Llama-3.1-8B and 3.2-1B shapes (make_gguf.py) and runs prefill at 512 / 4,096 / 16,384 tokens and
# decode after 4,096 and 16,384 (batched-bench's eval time of one sequence).
# usage (repo root): bash bench/peer/llamacpp.sh LLAMA_CPP_DIR
set -e
SRC=$1
bash bench/peer/build_llamacpp.sh $SRC $SRC/build cuda 16 /tmp llama-bench llama-batched-bench
L=$SRC/build/bin
export LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in 8b 1b; do [ -f /tmp/m$s.gguf ] || python3 bench/peer/make_gguf.py $SRC $s /tmp/m$s.gguf; done
$L/llama-bench -m /tmp/m8b.gguf -ngl 99 -fa 1 -p 512,4096,16384 -n 128 -r 2
$L/llama-bench -m /tmp/m1b.gguf -ngl 99 -fa 1 -p 16384 -n 128 -r 2
for d in 4096 16384; do
  $L/llama-batched-bench -m /tmp/m8b.gguf -ngl 99 -fa -c $((d + 256)) -npp $d -ntg 128 -npl 1 2>&1 | grep "eval time"
done
