#!/bin/bash
# Tensor parallelism on a GPU machine with 2 or 4 GPUs: builds smelt (with NCCL: the CUDA toolkit's, else
# the one PyTorch ships), runs the split-model test on the GPUs, then decode and prefill of synthetic
# shapes on 1, 2 (and 4) GPUs in one call, so the ratios compare like with like.
# usage (repo root, after `source bench/cuda/device_env.sh`):
#   bash bench/parallel/device_tp.sh BUILD_DIR OUT_DIR [SHAPE:BITS ...]   (default: 8b:0 8b:4)
# (test_tp cuda also splits its models by layers); env SPLIT=pp: the benches and the generation split by layers
# (-pp N) instead of by heads (-tp N); TESTS=REGEX: also these ctest tests; AB_SHAPE, STATS_SHAPE, PROF_SHAPE: one shape again on all GPUs with
# NCCL-only all-reduces, with SMELT_CUDA_STATS=1, or with per-op profiles on 1 and 2 GPUs (PROF_SHAPE)
set -u
B=$1 O=$2
shift 2
SHAPES=${*:-8b:0 8b:4}
mkdir -p "$O" /tmp/synth
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines (KINDS.md)
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ -z "${NCCL_HOME:-}" ]; then
  N=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  if [ -n "$N" ]; then
    mkdir -p /tmp/nccl/lib
    ln -sf "$N/include" /tmp/nccl/include
    ln -sf "$N"/lib/libnccl.so.2 /tmp/nccl/lib/libnccl.so
    ln -sf "$N"/lib/libnccl.so.2 /tmp/nccl/lib/libnccl.so.2
    export NCCL_HOME=/tmp/nccl LD_LIBRARY_PATH=/tmp/nccl/lib:${LD_LIBRARY_PATH:-}
  fi
fi
echo "NCCL: ${NCCL_HOME:-/usr/local/cuda}"
bash bench/cuda/build_smelt.sh "$B" "$O/build" 32 || exit 1
grep -i nccl "$O/build-cmake.log"
NG=$(nvidia-smi -L | wc -l)
nvidia-smi topo -m | head -8
echo "== test_tp cuda"
timeout 600 "$B/tests/model/test_tp" cuda "$PWD" 2>&1 | tail -14
[ -n "${TESTS:-}" ] && (cd "$B" && ctest -R "$TESTS" --output-on-failure 2>&1 | tail -8)
S=$B/smelt
X=-${SPLIT:-tp}
for sb in $SHAPES; do
  sh=${sb%%:*} bits=${sb##*:}
  for tp in 1 2 4; do
    [ "$tp" -gt "$NG" ] && continue
    echo "== $sh bits $bits ${X#-} $tp"
    timeout 900 "$S" bench --synthetic "$sh" --bits "$bits" --device cuda -p 512 -n 128 -r 3 $X "$tp" --dir /tmp/synth 2>&1 |
      grep -v "^\s*$" | tail -6
  done
done
echo "== greedy generation of the built-in model, 1 and $NG GPUs"
P="Write a short story about a lighthouse keeper who finds a message in a bottle."
"$S" generate -p "$P" -n 64 --temp 0 --device cuda >"$O/gen1.txt" 2>/dev/null
"$S" generate -p "$P" -n 64 --temp 0 --device cuda $X "$NG" >"$O/gen$NG.txt" 2>"$O/gen$NG.err"
if cmp -s "$O/gen1.txt" "$O/gen$NG.txt"; then echo "identical ($(wc -w <"$O/gen1.txt") words)"; else
  echo "DIFFER"; head -c 400 "$O/gen1.txt"; echo; head -c 400 "$O/gen$NG.txt"; tail -3 "$O/gen$NG.err"; fi
if [ -n "${AB_SHAPE:-}" ]; then
  echo "== $AB_SHAPE tp $NG, NCCL all-reduce only (SMELT_CUDA_COMM_AR=0)"
  SMELT_CUDA_COMM_AR=0 timeout 900 "$S" bench --synthetic "${AB_SHAPE%%:*}" --bits "${AB_SHAPE##*:}" --device cuda -p 512 \
    -n 128 -r 3 -tp "$NG" --dir /tmp/synth 2>&1 | grep -E "prefill|decode"
fi
if [ -n "${STATS_SHAPE:-}" ]; then
  echo "== $STATS_SHAPE tp $NG, SMELT_CUDA_STATS=1"
  SMELT_CUDA_STATS=1 timeout 900 "$S" bench --synthetic "${STATS_SHAPE%%:*}" --bits "${STATS_SHAPE##*:}" --device cuda \
    -p 512 -n 128 -tp "$NG" --dir /tmp/synth 2>&1 | grep -E "decode |cuda stats" | head -12
fi
if [ -n "${PROF_SHAPE:-}" ]; then
  for tp in 1 2; do
    SMELT_CUDA_PROFILE=1 timeout 900 "$S" bench --synthetic "${PROF_SHAPE%%:*}" --bits "${PROF_SHAPE##*:}" --device cuda \
      -p 512 -n 64 -tp "$tp" --dir /tmp/synth >"$O/prof-tp$tp.txt" 2>&1
  done
  echo "== profiles in prof-tp1.txt, prof-tp2.txt"
fi
