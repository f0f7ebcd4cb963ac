#!/bin/bash
# Build on the GPU machine and run the CUDA tests and benchmarks.
# usage (repo root): bash bench/cuda/device_run.sh [test] [mv] [b1] [b8q4] [b8bf16] ...
# (mv: quantized matvec microbenchmark; b1old/b8q4old: the same benches with SMELT_CUDA_Q4=0;
#  n8/n1: ncu per-kernel times of decode steps (NCU_SKIP/NCU_COUNT, summarize with
#  bench/cuda/ncu_summary.py); clab: SMELT_CUDA_ATTN_CL A/B; hwab: SMELT_CUDA_ATTN_HW A/B; bab: SMELT_CUDA_ATTN_B sweep; b1cfg/b8cfg/qlong/qwarps/b8attn/b1attn/bfcfg: sweeps of the tuning
#  variables SMELT_CUDA_Q4CFG/Q4LONG/Q4WARPS/ATTN_S/MV2; b8nopdl/b1nopdl: SMELT_CUDA_PDL=0;
#  sw8/sw1: one 8B/1B decode bench per entry of SW="ENV=v ENV2=w|ENV=x" (SW_BITS, SW_P), e.g.
#  SW="SMELT_CUDA_SKIP=0|SMELT_CUDA_SKIP=2" for the in-graph cost of attention (SMELT_CUDA_SKIP2: the
#  same with the fusions kept on, see docs/benchmarks.md);
#  mvq: n = 1 matvec microbenchmark per SW entry; mvrab: SMELT_CUDA_MVR / _MVR_GLU / _MLP A/B (8B, 1B);
#  trace: the -DSMELT_CUDA_TRACE build's timeline of one 8B attention launch and one MLP launch (SW as above);
#  kern: ctest cuda_kernels' binary alone; tl: SMELT_CUDA_TL step timelines of 8B / 1B 4-bit and 8B bf16;
#  SW_TO / KERN_TO: per-run timeouts in s)
# Needs the Debian packages in build-cudadeps/debs (see device_env.sh). Logs go to $OUT.
set -o pipefail
export SMELT_CUDA_STATS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
source bench/cuda/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
B=build-dev
if [ ! -x $B/smelt ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >$OUT/cmake.log 2>&1 || { tail -30 $OUT/cmake.log; exit 1; }
fi
t0=$(date +%s)
cmake --build $B -j16 --target smelt test_cuda_backend test_cuda_kernels cuda_mvbench test_golden test_sample_op >$OUT/build.log 2>&1 || { grep -E "error|Error" $OUT/build.log | head -40; tail -20 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
for stage in "$@"; do
  case $stage in
    test) (cd $B && timeout 300 ctest -R "cuda|sample_op" --output-on-failure 2>&1 | tee $OUT/ctest.log | grep -v "cuda stats" | tail -40) ;;
    mv) timeout 240 $B/tests/cuda/cuda_mvbench 64 2>&1 | tee -a $OUT/mvbench.txt ;;
    mvq) # n = 1 matvec microbenchmark per entry of SW (as sw8), e.g. SW="SMELT_CUDA_MVT=0|SMELT_CUDA_MVT=1"
      IFS='|' read -ra ents <<< "${SW:-SMELT_CUDA_MVT=1}"
      for ent in "${ents[@]}"; do env $ent MVB_QUICK=1 timeout 120 $B/tests/cuda/cuda_mvbench 64 2>&1 | grep -v "^device" | sed "s/^/[mvq $ent] /" | tee -a $OUT/mvq.txt; done ;;
    b1old) SMELT_CUDA_Q4=0 timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | sed 's/^/[Q4=0] /' | tee -a $OUT/bench.txt ;;
    b8q4old) SMELT_CUDA_Q4=0 timeout 400 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | sed 's/^/[Q4=0] /' | tee -a $OUT/bench.txt ;;
    b1all) SMELT_CUDA_Q4=1 timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | sed 's/^/[Q4=1] /' | tee -a $OUT/bench.txt ;;
    b8q4all) SMELT_CUDA_Q4=1 timeout 400 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | sed 's/^/[Q4=1] /' | tee -a $OUT/bench.txt ;;
    b8dec) SMELT_CUDA_ATTN_DEC=1 timeout 400 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | sed 's/^/[attn_dec] /' | tee -a $OUT/bench.txt ;;
    b8nodec) SMELT_CUDA_ATTN_DEC=0 SMELT_CUDA_NORMQ=0 timeout 400 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | sed 's/^/[old attn+norm] /' | tee -a $OUT/bench.txt ;;
    b1) timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | tee -a $OUT/bench.txt ;;
    b8q4) timeout 400 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | tee -a $OUT/bench.txt ;;
    b8bf16) timeout 500 $B/smelt bench --synthetic 8b --bits 0 --device cuda --dir /tmp -p 512 -n 128 2>&1 | tee -a $OUT/bench.txt ;;
    b8q8) timeout 400 $B/smelt bench --synthetic 8b --bits 8 --device cuda --dir /tmp -p 512 -n 128 2>&1 | tee -a $OUT/bench.txt ;;
    p1) SMELT_CUDA_PROFILE=1 timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 32 2>&1 | tee -a $OUT/prof.txt ;;
    p8) SMELT_CUDA_PROFILE=1 timeout 300 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 32 2>&1 | tee -a $OUT/prof.txt ;;
    n8|n1) # per-kernel GPU time of graph-replayed decode steps (ncu, one metric, no cache flush)
      sh=8b; [ $stage = n1 ] && sh=1b
      timeout 400 ncu --graph-profiling node --cache-control none --clock-control none --metrics gpu__time_duration.sum \
        --csv --launch-skip ${NCU_SKIP:-1500} --launch-count ${NCU_COUNT:-700} \
        $B/smelt bench --synthetic $sh --bits ${NCU_BITS:-4} --device cuda --dir /tmp -p 1 -n 8 >$OUT/ncu-$sh.csv 2>$OUT/ncu-$sh.err
      echo "ncu $sh rc=$? $(wc -l < $OUT/ncu-$sh.csv) lines"; tail -3 $OUT/ncu-$sh.err ;;
    b8nopdl) SMELT_CUDA_PDL=0 timeout 400 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | sed 's/^/[PDL=0] /' | tee -a $OUT/bench.txt ;;
    b1nopdl) SMELT_CUDA_PDL=0 timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | sed 's/^/[PDL=0] /' | tee -a $OUT/bench.txt ;;
    b8cfg) for cfg in ${Q4CFGS:-14 24 44 18 28}; do SMELT_CUDA_Q4CFG=$cfg timeout 300 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep decode | sed "s/^/[Q4CFG=$cfg] /" | tee -a $OUT/bench.txt; done ;;
    bfcfg) for cfg in ${MV2CFGS:-4,7 8,7 8,6 4,6 8,5}; do SMELT_CUDA_MV2=$cfg timeout 300 $B/smelt bench --synthetic 8b --bits 0 --device cuda --dir /tmp -p 64 -n 128 2>&1 | grep decode | sed "s/^/[MV2=$cfg] /" | tee -a $OUT/bench.txt; done ;;
    b1cfg) for cfg in ${Q4CFGS1:-12 14 22 24 18}; do SMELT_CUDA_Q4CFG=$cfg timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep "decode " | sed "s/^/[1b Q4CFG=$cfg] /" | tee -a $OUT/bench.txt; done ;;
    b8attn) for sp in ${ATTN_SS:-8 16 32}; do SMELT_CUDA_ATTN_S=$sp timeout 300 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep "decode " | sed "s/^/[8b ATTN_S=$sp] /" | tee -a $OUT/bench.txt; done ;;
    qlong) for cfg in ${QLONGS:-22 12}; do for sh in 1b 8b; do SMELT_CUDA_Q4LONG=$cfg timeout 300 $B/smelt bench --synthetic $sh --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep "decode " | sed "s/^/[$sh Q4LONG=$cfg] /" | tee -a $OUT/bench.txt; done; done ;;
    qwarps) for w in ${QWARPS:-4000 8000 16000 2000}; do for sh in 1b 8b; do SMELT_CUDA_Q4WARPS=$w timeout 300 $B/smelt bench --synthetic $sh --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep "decode " | sed "s/^/[$sh Q4WARPS=$w] /" | tee -a $OUT/bench.txt; done; done ;;
    b1attn) for sp in ${ATTN_SS:-8 16 32}; do SMELT_CUDA_ATTN_S=$sp timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep "decode " | sed "s/^/[1b ATTN_S=$sp] /" | tee -a $OUT/bench.txt; done ;;
    clab) # decode attention split combine: cluster of 16 / 8 splits vs global memory (SMELT_CUDA_ATTN_CL)
      for i in 1 2; do for cl in 16 8 0; do for sh in 1b 8b; do SMELT_CUDA_ATTN_CL=$cl timeout 300 $B/smelt bench --synthetic $sh --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep "decode " | sed "s/^/[$sh ATTN_CL=$cl] /" | tee -a $OUT/bench.txt; done; done; done ;;
    hwab) # decode attention for hd <= 64: half-warp positions on / off (SMELT_CUDA_ATTN_HW), 1B
      for i in 1 2; do for hw in 1 0; do SMELT_CUDA_ATTN_HW=$hw timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep "decode " | sed "s/^/[1b ATTN_HW=$hw] /" | tee -a $OUT/bench.txt; done; done ;;
    bab) # decode attention positions a batch (SMELT_CUDA_ATTN_B 8 / 12 / 16), 8B 4-bit and bf16
      for b in 12 8 16; do for bits in 4 0; do SMELT_CUDA_ATTN_B=$b timeout 300 $B/smelt bench --synthetic 8b --bits $bits --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep -E "decode " | sed "s/^/[8b bits $bits ATTN_B=$b] /" | tee -a $OUT/bench.txt; done; done ;;
    sw8|sw1) # SW="ENV=v ENV2=w|ENV=x|..." : one 8B (sw8) / 1B (sw1) 4-bit decode bench per entry
      sh=8b; [ $stage = sw1 ] && sh=1b
      IFS='|' read -ra ents <<< "${SW:-SMELT_CUDA_SKIP=0}"
      for ent in "${ents[@]}"; do env $ent timeout ${SW_TO:-300} $B/smelt bench --synthetic $sh --bits ${SW_BITS:-4} --device cuda --dir /tmp -p ${SW_P:-512} -n 128 2>&1 | grep -E "decode |GPU" | sed "s/^/[$sh $ent] /" | tee -a $OUT/bench.txt; done ;;
    trace) # timeline of one 8B decode layer around attention (SMELT_CUDA_TRACE build in build-trace; SW entries as sw8)
      [ -x build-trace/smelt ] || cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS=-DSMELT_CUDA_TRACE >$OUT/cmake-trace.log 2>&1
      cmake --build build-trace -j16 --target smelt >$OUT/build-trace.log 2>&1 || { grep -E "error" $OUT/build-trace.log | head; tail -5 $OUT/build-trace.log; }
      IFS='|' read -ra ents <<< "${SW:-SMELT_CUDA_TRACE_L=2000}"
      for ent in "${ents[@]}"; do env $ent timeout 300 build-trace/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p ${SW_P:-512} -n 128 2>&1 | grep -E "decode |GPU|trace|mlp|^  " | sed "s/^/[trace $ent] /" | tee -a $OUT/trace.txt; done ;;
    mvrab) # k_mvr defaults vs the sixth session's kernels vs the opt-in GLU epilogue, 8B and 1B, interleaved
      for i in 1 2; do
        for ent in "SMELT_CUDA_MVR=-1" "SMELT_CUDA_MVR=0" "SMELT_CUDA_MVR_GLU=1" "SMELT_CUDA_MVR_GLU=2" "SMELT_CUDA_MVR_GLU=1 SMELT_CUDA_MVR_RT=2" "SMELT_CUDA_MVR=28 SMELT_CUDA_MVR_NW=4" "SMELT_CUDA_MLP=1" "SMELT_CUDA_MLP=2" "SMELT_CUDA_MLP=3"; do
          env $ent timeout 300 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep -E "decode |GPU" | sed "s/^/[8b $ent] /" | tee -a $OUT/bench.txt
        done
        for ent in "SMELT_CUDA_MVR=-1" "SMELT_CUDA_MVR=0" "SMELT_CUDA_MVR=20" "SMELT_CUDA_MVR=20 SMELT_CUDA_MVR_GLU=1" "SMELT_CUDA_MVR=20 SMELT_CUDA_MVR_GLU=2" "SMELT_CUDA_MLP=1" "SMELT_CUDA_MLP=2" "SMELT_CUDA_MLP=3"; do
          env $ent timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | grep -E "decode |GPU" | sed "s/^/[1b $ent] /" | tee -a $OUT/bench.txt
        done
      done ;;
    tl) # GPU timeline of the pipelined decode steps (SMELT_CUDA_TL=1): upload, graph, sampling, period
      for sh in "8b 4" "1b 4" "8b 0"; do set -- $sh; SMELT_CUDA_TL=1 timeout 500 $B/smelt bench --synthetic $1 --bits $2 --device cuda --dir /tmp -p ${SW_P:-512} -n 128 2>&1 | grep -E "timeline|decode " | sed "s/^/[tl $1 bits $2] /" | tee -a $OUT/bench.txt; done ;;
    kern) (timeout ${KERN_TO:-240} $B/tests/cuda/test_cuda_kernels 2>&1 | tee $OUT/kern.log | grep -E "FAIL|checks" | tail -40) ;;
    nograph) SMELT_CUDA_GRAPHS=0 timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 128 2>&1 | tee -a $OUT/bench.txt ;;
    *) echo "unknown stage $stage" ;;
  esac
done
