#!/bin/bash
# Image requests side by side on the GPU machine, Qwen2.5-VL-7B shape (random weights): smelt serve (4-bit
# g64 text model, bf16 tower: bench/vision/make_synth.py + `smelt bench --synthetic qwen2.5-7b` joined by
# make_vlm_full.py) against llama.cpp (Q4_0 text model, f16 mmproj: bench/vision/device_peer_llama.sh
# builds it and runs llama-mtmd-cli). Each server answers bench/vision/ttft.py: one-token chat requests
# with a different 1024x768 PNG each, 5 one at a time (time to first token) and 16 together (images/s).
# usage (repo root): bash bench/vision/device_ttft.sh LLAMA_SRC_TARBALL   (OUT: logs, default /tmp/out)
set -o pipefail
TAR=${1:?usage: device_ttft.sh LLAMA_SRC_TARBALL}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source bench/cuda/device_env.sh
B=build-dev M=/tmp/vfull
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 )) s"; }
[ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/ttft-cmake.log" 2>&1
cmake --build $B -j16 --target smelt >"$OUT/ttft-build.log" 2>&1 || { grep -A3 error "$OUT/ttft-build.log" | head -30; exit 1; }
echo "smelt built ($(el))"
(
  [ -f $M/model.safetensors ] && exit 0
  python3 bench/vision/make_synth.py qwen2_5_vl_7b /tmp/vsynth-qwen2_5_vl_7b &&
    $B/smelt bench --synthetic qwen2.5-7b --bits 4 --device cuda --dir /tmp -p 16 -n 2 &&
    python3 bench/vision/make_vlm_full.py /tmp/vsynth-qwen2_5_vl_7b /tmp/smelt-bench-qwen2.5-7b-q4-g64 $M
) >"$OUT/ttft-synth.log" 2>&1 &
SY=$!
RUNS=${RUNS:-3} bash bench/vision/device_peer_llama.sh "$TAR" /tmp/llb /tmp/llm 2>&1 | tail -n 8
wait $SY || { tail -n 5 "$OUT/ttft-synth.log"; echo "TTFT: FAILED (smelt's checkpoint)"; exit 1; }
health() { python3 -c "
import sys, time, urllib.request
for i in range(480):
    try:
        if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status == 200: sys.exit(0)
    except Exception: pass
    time.sleep(0.5)
sys.exit(1)"; }
fail=0
$B/smelt serve -m $M --device cuda -np 16 -c 2048 --port 18090 >"$OUT/ttft-smelt.log" 2>&1 &
SP=$!
{ health 18090 && timeout 200 python3 bench/vision/ttft.py http://127.0.0.1:18090 --label smelt; } || fail=1
kill -INT $SP; sleep 2; kill $SP 2>/dev/null; wait $SP 2>/dev/null
L=/tmp/llb/build/bin
LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} $L/llama-server -m /tmp/llm/qwen2.5-vl-7b-q4_0.gguf \
  --mmproj /tmp/llm/mmproj-qwen2.5-vl-7b-f16.gguf -ngl 99 -np 16 -c 32768 --port 18091 >"$OUT/ttft-llama.log" 2>&1 &
LP=$!
{ health 18091 && timeout 200 python3 bench/vision/ttft.py http://127.0.0.1:18091 --label llama-server; } || fail=1
kill $LP; wait $LP 2>/dev/null
echo "total $(el)"
[ $fail = 0 ] && echo "TTFT: OK" || echo "TTFT: FAILED (logs in $OUT)"
exit $fail
