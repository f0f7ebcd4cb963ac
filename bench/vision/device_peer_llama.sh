#!/bin/bash
# llama.cpp's image encoding side by side with bench/vision (the smelt side: bench/vision/device_check.sh),
# on the GPU machine: builds llama.cpp (CUDA, sm_90) from a pruned source tarball, makes random-weight
# GGUFs of Qwen2.5-VL-7B (text Q4_0 by bench/peer/make_gguf.py, mmproj f16 by bench/peer/make_mmproj.py:
# the ViT shapes of make_synth.py's qwen2_5_vl_7b) and runs `llama-mtmd-cli -ngl 99` on a 1024x768 PNG
# (999 image tokens, as smelt's run) RUNS times, printing per run (one process each, after clip's warmup)
# the image encode time (this tree's mtmd-cli: "mtmd batch encoding done in N ms", the vision tower and
# merger; older trees: "image slice encoded in N ms"), the decode of the image tokens by the text model
# ("image decoded ... in N ms") and llama_perf's prompt eval time (text and image tokens; it includes the
# encode, so it is the time to the first token less sampling) and eval time (-lv 4 shows llama_perf).
# Resumable within the 10-minute command limit: the extraction, the configure (BUILD_DIR/build.ninja or
# Makefile) and the GGUFs are skipped when present, and `cmake --build` picks up where it stopped; when a
# run is cut off, run it again.
# usage (repo root): bash bench/vision/device_peer_llama.sh LLAMA_SRC_TARBALL BUILD_DIR OUTDIR
#   e.g. bash bench/vision/device_peer_llama.sh .dev/llsrc-new.tar.xz /tmp/llb /tmp/llm
#   MODELS="qwen2.5-vl-7b gemma3-4b" adds Gemma 3 4B (896x896, 256 tokens); RUNS (default 3); JOBS (16);
#   LLAMA_ARGS: more llama-mtmd-cli flags (e.g. "-fa on").
set -o pipefail
TAR=$1 BD=$2 OUT=$3
[ -n "$OUT" ] || { echo "usage: $0 LLAMA_SRC_TARBALL BUILD_DIR OUTDIR" >&2; exit 2; }
MODELS=${MODELS:-qwen2.5-vl-7b}
RUNS=${RUNS:-3}
J=${JOBS:-16}
mkdir -p "$OUT" "$BD" || exit 1
BD=$(cd "$BD" && pwd) OUT=$(cd "$OUT" && pwd)
SRC=$BD/src
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
fail() { echo "LLAMA PEER: FAILED ($*)"; exit 1; }

# 1. source
if [ ! -f "$SRC/.extracted" ]; then
  rm -rf "$SRC" && mkdir -p "$SRC" && tar -C "$SRC" -xJf "$TAR" && touch "$SRC/.extracted" ||
    fail "extracting $TAR"
fi

# 2. GGUFs in the background while llama.cpp builds (written to .tmp, renamed when complete)
gguf() { # script shape file
  [ -s "$3" ] && return 0
  python3 "$1" "$SRC" "$2" "$3.tmp" >"$3.log" 2>&1 && mv "$3.tmp" "$3"
}
(
  rc=0
  for m in $MODELS; do
    gguf bench/peer/make_gguf.py "$m" "$OUT/$m-q4_0.gguf" || rc=1
    gguf bench/peer/make_mmproj.py "$m" "$OUT/mmproj-$m-f16.gguf" || rc=1
  done
  echo $rc >"$OUT/gguf.rc"
) &
GG=$!

# 3. build (configure once; the build resumes)
B=$BD/build
if [ ! -f "$B/build.ninja" ] && [ ! -f "$B/Makefile" ]; then
  G=; command -v ninja >/dev/null && G="-G Ninja"
  cmake -S "$SRC" -B "$B" $G -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    >"$OUT/llama-cmake.log" 2>&1 || { tail -n 30 "$OUT/llama-cmake.log"; rm -f "$B/build.ninja" "$B/Makefile"; fail "cmake"; }
fi
echo "llama.cpp: building ($(el))"
cmake --build "$B" -j"$J" --target llama-mtmd-cli llama-server >>"$OUT/llama-build.log" 2>&1 ||
  { grep -E "error|Error" "$OUT/llama-build.log" | tail -n 20; fail "build, log $OUT/llama-build.log"; }
echo "llama.cpp: built ($(el))"
wait $GG
[ "$(cat "$OUT/gguf.rc" 2>/dev/null)" = 0 ] || { tail -n 5 "$OUT"/*.gguf.log; fail "making the GGUFs"; }
echo "GGUFs ready ($(el)): $(cd "$OUT" && ls -s --block-size=M ./*.gguf | tr '\n' ' ')"

# 4. images (PNG by hand: zlib + crc32)
python3 - "$OUT" <<'EOF' || fail "making the PNGs"
import struct, sys, zlib
import numpy as np
def png(path, w, h):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x ^ y) & 255)], -1).astype(np.uint8)
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
png(sys.argv[1] + "/img-1024x768.png", 1024, 768)
png(sys.argv[1] + "/img-896x896.png", 896, 896)
EOF

# 5. runs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
export LD_LIBRARY_PATH=$B/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0
for m in $MODELS; do
  case $m in gemma3*) img=$OUT/img-896x896.png ;; *) img=$OUT/img-1024x768.png ;; esac
  echo "== llama.cpp $m: llama-mtmd-cli -ngl 99, $(basename "$img"), $RUNS runs"
  ok=0
  for r in $(seq 1 "$RUNS"); do
    log=$OUT/mtmd-$m-run$r.log
    timeout 300 "$B/bin/llama-mtmd-cli" -m "$OUT/$m-q4_0.gguf" --mmproj "$OUT/mmproj-$m-f16.gguf" \
      --image "$img" -p "describe" -n 4 -ngl 99 -c 4096 --temp 0 -lv 4 ${LLAMA_ARGS:-} >"$log" 2>&1
    rc=$?
    enc=$(grep -oE "(mtmd batch encoding done|image slice encoded) in [0-9]+ ms" "$log" | grep -oE "[0-9]+ ms" | tr '\n' ' ')
    dec=$(grep -oE "image decoded \(batch [0-9/]+\) in [0-9]+ ms" "$log" | grep -oE "in [0-9]+ ms" | sed 's/in //' | tr '\n' '+')
    ntok=$(grep -oE "n_tokens_batch = [0-9]+" "$log" | awk '{s += $3} END {if (NR) print s}')
    pe=$(grep -oE "prompt eval time = +[0-9.]+ ms / +[0-9]+ tokens" "$log" | tr -s ' ')
    ev=$(grep -E "llama_perf_context_print: +eval time" "$log" | grep -oE "= +[0-9.]+ ms / +[0-9]+ runs" | tr -s ' ')
    if [ $rc = 0 ] && [ -n "$enc" ]; then
      ok=$((ok + 1))
      echo "[llama $m run $r] image encode ${enc}| image decode (${ntok:-?} tokens) ${dec%+} | prompt eval ${pe#prompt eval time = } | eval ${ev#= }"
    else
      status=1
      echo "[llama $m run $r] FAILED (rc $rc, log $log):"
      grep -iE "error|fail|abort|assert" "$log" | head -n 10
    fi
  done
  [ $ok = "$RUNS" ] && echo "LLAMA PEER: OK $m ($ok/$RUNS runs)" || echo "LLAMA PEER: FAILED $m ($ok/$RUNS runs)"
done
echo "total $(el)"
exit $status
