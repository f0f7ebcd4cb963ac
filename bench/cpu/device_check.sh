#!/bin/bash
# The CPU backend's check on the GPU machine's host CPU (16 cores, AMX; docs/cpu.md): its tests on
# real AMX / VNNI hardware, then smelt's CPU prefill of 512 tokens and decode of 64 at 16 threads on
# the Llama-3.2-1B and 3.1-8B shapes at 4 bits, side by side with a CPU-only llama.cpp (GGML_NATIVE,
# random Q4_0 GGUFs of the same shapes from bench/peer/make_gguf.py) where its source is there, and
# the ratios: smelt / llama.cpp, and decode against the read-bandwidth probe's roofline.
#
# usage (repo root): bash bench/cpu/device_check.sh [BUILD_DIR [LLAMA_CPP_DIR]]
#   BUILD_DIR      a smelt build (default build-dev; configured and built here, CUDA on, when it has
#                  no smelt binary)
#   LLAMA_CPP_DIR  llama.cpp source (default ./llamacpp; smelt runs alone without one); built once
#                  CPU-only into LLAMA_BUILD (default LLAMA_CPP_DIR/build-cpu)
# environment: THREADS (16), SHAPES ("1b 8b"), OUT (/tmp/out: logs, results.md), BUDGET (150:
#   seconds for the tests and measurements, builds and model files excluded; a step that would not
#   fit is skipped, and said so)
# Prints one table; each step's log is in $OUT.
set -o pipefail
B=${1:-build-dev}
LL=${2:-llamacpp}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; rm -f $OUT/skipped.txt
T=${THREADS:-16}; BUDGET=${BUDGET:-150}; SHAPES=${SHAPES:-1b 8b}
J=$(nproc)
[ -e build-cudadeps/deps.tar.xz ] || [ -d build-cudadeps/debs ] && source bench/cuda/device_env.sh
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
PY=python3
$PY -c "import numpy" 2>/dev/null || PY=/usr/bin/python3
{ lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket|^NUMA node\(s\)|^L3"
  echo "ISA: $(grep -m1 -o -wE 'avx512f|avx512_vnni|avx512_bf16|avx_vnni|amx_tile|amx_int8|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
} | tee $OUT/machine.txt

# ---- builds (not counted in BUDGET) ----
if [ ! -x $B/smelt ]; then
  el "building smelt in $B"
  bash bench/cuda/build_smelt.sh $B $OUT/smelt $J || { el "smelt build failed"; exit 1; }
fi
LB=
if [ -f "$LL/CMakeLists.txt" ]; then
  LB=${LLAMA_BUILD:-$LL/build-cpu}
  if [ ! -x $LB/bin/llama-bench ]; then
    el "building llama.cpp (CPU only, GGML_NATIVE) in $LB"
    bash bench/peer/build_llamacpp.sh $LL $LB cpu $J $OUT llama-bench ||
      { el "llama.cpp build failed: smelt alone"; tail -n 20 $OUT/llama-build.log $OUT/llama-cmake.log; LB=; }
  fi
  [ -n "$LB" ] && export LD_LIBRARY_PATH=$LB/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  el "no llama.cpp source at '$LL': smelt alone"
fi

# ---- model files (not counted): smelt's synthetic checkpoints in /tmp (a short bench writes
# them and pages them in), the GGUFs alongside (the same files bench/cuda/device_long.sh uses) ----
for sh in $SHAPES; do
  [ -n "$LB" ] && [ ! -s /tmp/m$sh.gguf ] && { $PY bench/peer/make_gguf.py $LL $sh /tmp/m$sh.gguf >$OUT/gguf-$sh.log 2>&1 ||
    { el "make_gguf $sh failed"; tail -5 $OUT/gguf-$sh.log; rm -f /tmp/m$sh.gguf; }; } &
  timeout 600 $B/smelt bench --synthetic $sh --bits 4 --device cpu -t $T -p 8 -n 2 -r 1 --dir /tmp >$OUT/setup-$sh.log 2>&1 ||
    { el "smelt setup $sh failed"; tail -5 $OUT/setup-$sh.log; }
  wait
done
el "models ready: $(for sh in $SHAPES; do ls -d /tmp/smelt-bench-$sh-q4-g64 /tmp/m$sh.gguf; done 2>/dev/null | tr '\n' ' ')"

# ---- tests and measurements: BUDGET seconds from here ----
TS=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - TS) )); }
fits() { # seconds: is there that much left?
  [ $(left) -ge $1 ] && return 0
  el "skipped (needs ~$1 s, $(left) s left): $2"; echo "skipped: $2" >>$OUT/skipped.txt; return 1
}
(cd $B && timeout 100 ctest -R "^(cpu_int8|cpu_place|cpu_backend|kv_quality)$" -j4 --timeout 90 --output-on-failure >$OUT/ctest.log 2>&1)
TRC=$?
el "CPU tests rc=$TRC: $(grep -E 'tests passed|Failed|Timeout' $OUT/ctest.log | tr '\n' ';')"
LT=$B/Testing/Temporary/LastTest.log
AMX="$(grep -c '+amx threads=[0-9]*: ok' $LT 2>/dev/null) ok, $(grep -c '+amx threads=[0-9]*: FAILED' $LT 2>/dev/null) failed"
grep -q "skip AMX" $LT 2>/dev/null && AMX="not tested ($(grep -m1 -o 'skip AMX.*' $LT))"
el "AMX kernel on this CPU's tiles (test_cpu_int8, thread counts): $AMX"

echo "shape smelt_pp smelt_tg probe_gbs bytes_tok llama_pp llama_tg" >$OUT/results.tsv
for sh in $SHAPES; do
  if [ $sh = 1b ]; then R=3 NEED=25 LNEED=20; else R=2 NEED=45 LNEED=45; fi
  sp="- - - -"
  if fits $NEED "smelt $sh"; then
    js=$OUT/smelt-$sh.json
    timeout $(left) $B/smelt bench --synthetic $sh --bits 4 --device cpu -t $T -p 512 -n 64 -r $R --dir /tmp --json \
      >$js 2>$OUT/smelt-$sh.err
    sp=$($PY -c "import json; d=json.load(open('$js')); print('%.1f %.2f %.1f %.0f' % (d['prefill_tok_s'], d['decode_tok_s'],
d['bandwidth_gb_s'], d['weight_bytes_per_token'] + d['kv_bytes_per_token']))" 2>/dev/null || echo "- - - -")
    el "smelt $sh: prefill / decode tok/s, probe GB/s, bytes per token: $sp"
  fi
  lp="- -"
  if [ -n "$LB" ] && [ -s /tmp/m$sh.gguf ] && fits $LNEED "llama.cpp $sh"; then
    lj=$OUT/llama-$sh.json
    timeout $(left) $LB/bin/llama-bench -m /tmp/m$sh.gguf -p 512 -n 64 -t $T -r $R -o json >$lj 2>$OUT/llama-$sh.err
    lp=$($PY -c "
import json; d=json.load(open('$lj'))
pp=[r['avg_ts'] for r in d if r.get('n_prompt')==512 and r.get('n_gen')==0]
tg=[r['avg_ts'] for r in d if r.get('n_gen')==64 and r.get('n_prompt')==0]
print('%.1f %.2f' % (pp[0], tg[0]))" 2>/dev/null || echo "- -")
    el "llama.cpp $sh: pp512 / tg64 tok/s: $lp"
  fi
  echo "$sh $sp $lp" >>$OUT/results.tsv
done
# with time to spare: 1B prefill on VNNI alone (no AMX tiles), to show what AMX adds
if fits 15 "1b prefill with SMELT_CPU_AMX=0"; then
  SMELT_CPU_AMX=0 timeout $(left) $B/smelt bench --synthetic 1b --bits 4 --device cpu -t $T -p 512 -n 4 -r 2 --dir /tmp \
    2>&1 | grep -E "^prefill" | sed "s/^/[1b SMELT_CPU_AMX=0] /" | tee $OUT/variants.txt
fi
el "measurements took $(( $(date +%s) - TS )) s (budget $BUDGET)"

# ---- the table ----
echo "== smelt vs llama.cpp, CPU, $T threads, 4-bit (smelt MLX g64 / llama.cpp Q4_0), prefill 512, decode 64 =="
$PY - $OUT/results.tsv <<'EOF' | tee $OUT/results.md
import sys
rows = [l.split() for l in open(sys.argv[1])][1:]
def f(x):
    try: return float(x)
    except ValueError: return None
def r(a, b): return "%.2fx" % (a / b) if a and b else "-"
def pct(tg, bw, nb): return "%.0f%%" % (100 * tg * nb / (bw * 1e9)) if tg and bw and nb else "-"
print("| shape | smelt prefill | llama.cpp pp512 | ratio | smelt decode | llama.cpp tg64 | ratio | read probe GB/s "
      "| smelt decode / roofline | llama.cpp decode / roofline |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for sh, spp, stg, bw, nb, lpp, ltg in rows:
    spp, stg, bw, nb, lpp, ltg = f(spp), f(stg), f(bw), f(nb), f(lpp), f(ltg)
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (sh, spp or "-", lpp or "-", r(spp, lpp), stg or "-",
          ltg or "-", r(stg, ltg), bw or "-", pct(stg, bw, nb), pct(ltg, bw, nb)))
EOF
echo "roofline: smelt's bytes per decode token (weights + K/V) over the probe's read bandwidth, for both"
echo "targets (issue 31): 1B prefill >= 1.20x, decode >= 1.10x and >= 80% of the probe"
[ -s $OUT/skipped.txt ] && { echo "skipped for time:"; cat $OUT/skipped.txt; }
[ $TRC = 0 ] && echo "CPU tests: passed; AMX: $AMX" || echo "CPU tests: FAILED (rc=$TRC, $OUT/ctest.log); AMX: $AMX"
