#!/bin/bash
# smelt vs llama.cpp on this machine's CPU, side by side (docs/cpu.md): Llama-3.2-1B shape, 4-bit,
# prefill of 512 tokens and decode of 64, at 16 and 8 threads (THREADS), plus the CPU backend's
# correctness tests on this CPU (the AMX kernels are tested only where the CPU has AMX).
#
# usage (repo root): bash bench/cpu/device_cpu.sh LLAMA_CPP_SRC
#   LLAMA_CPP_SRC  a llama.cpp source checkout; without one (or with "-") smelt runs alone
# environment: THREADS ("16 8"), SHAPES ("1b"; "1b 8b" adds the 8B shape: +3-4 min), REPS (3),
#   VARIANTS (tuning entries tried on decode at the first thread count, "|"-separated; default
#   "SMELT_CPU_MV_CHUNKS=0|SMELT_CPU_PREFETCH=4096|SMELT_CPU_HUGEPAGES=1"; "-" for none),
#   OUT (/tmp/out: logs and results.md)
# llama.cpp runs random Q4_0 GGUFs of the same shapes (bench/peer/make_gguf.py, every tensor Q4_0
# as smelt's 4 bits everywhere). Needs cmake, a C/C++ compiler, python3 with numpy, and smelt's
# Debian build dependencies (on the GPU machine: build-cudadeps/deps.tar.xz, as bench/cuda/device_env.sh
# unpacks them). About 5 minutes for the 1B shape on 16 cores. bench/cpu/device_check.sh is the
# short version (16 threads, both shapes, within 150 s after the builds).
set -o pipefail
LL=${1:-}
[ "$LL" = "-" ] && LL=
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
THREADS=${THREADS:-16 8}; SHAPES=${SHAPES:-1b}; REPS=${REPS:-3}
J=$(nproc)
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
[ -e build-cudadeps/deps.tar.xz ] || [ -d build-cudadeps/debs ] && source bench/cuda/device_env.sh
PY=python3
$PY -c "import numpy" 2>/dev/null || PY=/usr/bin/python3

{ lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket|^NUMA node|^L2|^L3"
  echo "ISA: $(grep -m1 -o -wE 'avx512f|avx512_vnni|avx512_bf16|avx_vnni|amx_tile|amx_int8|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  free -g | head -2; } | tee $OUT/machine.txt

# ---- builds (smelt and llama.cpp at once) ----
B=build-cpu
( cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=OFF >$OUT/smelt-cmake.log 2>&1 &&
  cmake --build $B -j$J --target smelt test_cpu_int8 test_cpu_backend test_cpu_place >$OUT/smelt-build.log 2>&1 ) &
SP=$!
if [ -n "$LL" ]; then
  LB=$OUT/llama-build
  bash bench/peer/build_llamacpp.sh "$LL" $LB cpu $J $OUT llama-bench &
  LP=$!
fi
wait $SP || { el "smelt build failed"; tail -n 30 $OUT/smelt-build.log $OUT/smelt-cmake.log; exit 1; }
el "smelt built"
if [ -n "$LL" ]; then
  if wait $LP; then el "llama.cpp built"; else el "llama.cpp build failed (smelt only)"; tail -n 20 $OUT/llama-build.log $OUT/llama-cmake.log; LL=; fi
fi

# ---- the CPU backend's tests on this CPU ----
for t in test_cpu_int8 test_cpu_place test_cpu_backend; do
  timeout 300 $B/tests/backend/$t >$OUT/$t.log 2>&1; rc=$?
  el "$t rc=$rc: $(grep -E 'amx|AMX|skip|FAIL|passed|FAILURES' $OUT/$t.log | head -12 | tr '\n' ';')"
done

# ---- models ----
qbench=""
for sh in $SHAPES; do
  if [ -n "$LL" ]; then
    Q=/tmp/m$sh.gguf # bench/cuda/device_long.sh's file names: made once for both
    [ -s $Q ] || timeout 300 $PY bench/peer/make_gguf.py "$LL" $sh $Q >$OUT/gguf-$sh.log 2>&1 ||
      { el "make_gguf $sh failed"; tail $OUT/gguf-$sh.log; rm -f $Q; }
    el "$sh Q4_0 GGUF: $(du -h $Q 2>/dev/null | cut -f1)"
  fi
done

# ---- benchmarks ----
echo "shape threads smelt_pp smelt_tg probe_gbs roofline_pct llama_pp llama_tg" >$OUT/results.tsv
for sh in $SHAPES; do
  for t in $THREADS; do
    js=$OUT/smelt-$sh-t$t.json
    timeout 600 $B/smelt bench --synthetic $sh --bits 4 --device cpu -t $t -p 512 -n 64 -r $REPS --dir /tmp --json >$js 2>$OUT/smelt-$sh-t$t.err
    sp=$($PY -c "import json,sys; d=json.load(open('$js')); print('%.1f %.1f %.1f %.1f' % (d['prefill_tok_s'], d['decode_tok_s'], d['bandwidth_gb_s'], d['decode_tok_s']/d['roofline_tok_s']*100 if d['roofline_tok_s'] else 0))" 2>/dev/null || echo "- - - -")
    el "smelt $sh t=$t: prefill / decode tok/s, probe GB/s, decode % of roofline: $sp"
    lp="- -"
    if [ -n "$LL" ] && [ -s /tmp/m$sh.gguf ]; then
      lj=$OUT/llama-$sh-t$t.json
      timeout 600 $LB/bin/llama-bench -m /tmp/m$sh.gguf -p 512 -n 64 -t $t -r $REPS -o json >$lj 2>$OUT/llama-$sh-t$t.err
      lp=$($PY -c "
import json; d=json.load(open('$lj'))
pp=[r['avg_ts'] for r in d if r.get('n_prompt')==512 and r.get('n_gen')==0]
tg=[r['avg_ts'] for r in d if r.get('n_gen')==64 and r.get('n_prompt')==0]
print('%.1f %.1f' % (pp[0], tg[0]))" 2>/dev/null || echo "- -")
      el "llama.cpp $sh t=$t: pp512 / tg64 tok/s: $lp"
    fi
    echo "$sh $t $sp $lp" >>$OUT/results.tsv
  done
  # at the first thread count: prefill without AMX (VNNI), the code before packed weights
  # (SMELT_CPU_PACK=0: float prefill, unpacked int8 decode), decode with other tuning values
  t=${THREADS%% *}
  vb() { # env-setting label bench-args...
    local v=$1; shift
    env $v timeout 300 $B/smelt bench --synthetic $sh --bits 4 --device cpu -t $t --dir /tmp "$@" 2>&1 |
      grep -E "^prefill|^decode" | sed "s/^/[$sh t=$t $v] /" | tee -a $OUT/variants.txt
  }
  vb SMELT_CPU_AMX=0 -p 512 -n 4 -r 2
  vb SMELT_CPU_PACK=0 -p 512 -n 64 -r 2
  IFS='|' read -ra vs <<< "${VARIANTS:-SMELT_CPU_MV_CHUNKS=0|SMELT_CPU_PREFETCH=4096|SMELT_CPU_HUGEPAGES=1}"
  for v in "${vs[@]}"; do [ "$v" != "-" ] && vb "$v" -p 64 -n 64 -r 2; done
done

# ---- the table ----
$PY - $OUT/results.tsv <<'EOF' | tee $OUT/results.md
import sys
rows = [l.split() for l in open(sys.argv[1])][1:]
def f(x):
    try: return float(x)
    except ValueError: return None
def r(a, b): return "%.2fx" % (a / b) if a and b else "-"
print("| shape | threads | smelt prefill 512 | llama.cpp pp512 | ratio | smelt decode | llama.cpp tg64 | ratio "
      "| read probe GB/s | smelt decode / roofline |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for sh, t, spp, stg, bw, roof, lpp, ltg in rows:
    spp, stg, lpp, ltg = f(spp), f(stg), f(lpp), f(ltg)
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s%% |" % (sh, t, spp or "-", lpp or "-", r(spp, lpp),
          stg or "-", ltg or "-", r(stg, ltg), bw, roof))
EOF
el "done (logs in $OUT)"
