#!/bin/bash
# Build on the GPU machine and run the CUDA tests and benchmarks (docs/cuda.md).
# usage (repo root): bash bench/cuda/device_run.sh [stage ...]
#   test    the CUDA ctests (and the golden / sampling ones on CUDA)
#   b1 b8q4 b8q8 b8bf16   bench of the Llama-3.2-1B / 3.1-8B shapes (4-bit, 8-bit, bf16), 512-token prompt
#   long    8B 4-bit decode after 2,200 and 4,000 prompt tokens
#   pp      long prompts: 8B 4-bit prefill and decode at depth for PP (default 4096 16384) tokens, 1B at 16384
#   kv      8B 4-bit decode with each KV cache type (f16, bf16, f32) at 512 and 4,000 prompt tokens
#   pl      per-op GPU profile of an 8B 4-bit PL-token prefill (default 16384): attention's share
#   tl      the GPU timeline of pipelined decode steps (SMELT_CUDA_STATS=2), 8B / 1B 4-bit and 8B bf16
#   p1 p8   per-op GPU profile (SMELT_CUDA_PROFILE=1; graphs off)
#   n1 n8   ncu per-kernel times of graph-replayed decode steps (NCU_SKIP / NCU_COUNT)
#   sw1 sw8 one 1B / 8B 4-bit decode bench per entry of SW="ENV=v ENV2=w|ENV=x" (SW_BITS, SW_P)
#   mv      the quantized matvec microbenchmark (cuda_mvbench)
#   mm      the batched 4-bit matmul microbenchmark (cuda_mmbench), tensor-core kernel and cuBLAS path
#   kern    test_cuda_kernels alone
# Needs the Debian packages of build-cudadeps/deps.tar.xz (device_env.sh). Logs go to $OUT.
set -o pipefail
export SMELT_CUDA_STATS=${SMELT_CUDA_STATS:-1}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
source bench/cuda/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
B=build-dev
if [ ! -f $B/build.ninja ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a >$OUT/cmake.log 2>&1 || { tail -30 $OUT/cmake.log; exit 1; }
fi
t0=$(date +%s)
cmake --build $B -j16 >$OUT/build.log 2>&1 || { grep -E "error|Error" $OUT/build.log | head -40; tail -20 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
bench() { # shape bits prompt [tag]   (BENCH_ARGS: more smelt bench options, e.g. -ctk f32)
  timeout ${BENCH_TO:-400} $B/smelt bench --synthetic $1 --bits $2 --device cuda --dir /tmp -p $3 -n 128 $BENCH_ARGS 2>&1 | grep -E "decode |prefill |roofline|GPU|cuda stats: kernel" | sed "s/^/[${4:-$1 bits $2 p$3}] /" | tee -a $OUT/bench.txt
}
for stage in "$@"; do
  case $stage in
    test) (cd $B && timeout 500 ctest -R "cuda|golden|sample_op|op_sequence" --output-on-failure 2>&1 | tee $OUT/ctest.log | grep -v "cuda stats" | tail -40) ;;
    b1) bench 1b 4 512 ;;
    b8q4) bench 8b 4 512 ;;
    b8q8) bench 8b 8 512 ;;
    b8bf16) bench 8b 0 512 ;;
    long) bench 8b 4 2200; bench 8b 4 4000 ;;
    kv) for t in f16 bf16 f32; do for p in 512 4000; do BENCH_ARGS="-ctk $t" bench 8b 4 $p "8b kv $t p$p"; done; done ;;
    pp) for p in ${PP:-4096 16384}; do bench 8b 4 $p; done; bench 1b 4 16384 ;;
    pl) SMELT_CUDA_PROFILE=1 timeout 300 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p ${PL:-16384} -n 4 2>&1 | tee -a $OUT/prof-long.txt | grep -vE "^\[" | head -40 ;;
    tl) for sh in "8b 4" "1b 4" "8b 0"; do set -- $sh; SMELT_CUDA_STATS=2 bench $1 $2 ${SW_P:-512} "tl $1 bits $2"; done ;;
    p1) SMELT_CUDA_PROFILE=1 timeout 300 $B/smelt bench --synthetic 1b --bits 4 --device cuda --dir /tmp -p 512 -n 32 2>&1 | tee -a $OUT/prof.txt ;;
    p8) SMELT_CUDA_PROFILE=1 timeout 300 $B/smelt bench --synthetic 8b --bits 4 --device cuda --dir /tmp -p 512 -n 32 2>&1 | tee -a $OUT/prof.txt ;;
    n8|n1) sh=8b; [ $stage = n1 ] && sh=1b
      timeout 400 ncu --graph-profiling node --cache-control none --clock-control none --metrics gpu__time_duration.sum \
        --csv --launch-skip ${NCU_SKIP:-1500} --launch-count ${NCU_COUNT:-700} \
        $B/smelt bench --synthetic $sh --bits ${NCU_BITS:-4} --device cuda --dir /tmp -p 1 -n 8 >$OUT/ncu-$sh.csv 2>$OUT/ncu-$sh.err
      echo "ncu $sh rc=$? $(wc -l < $OUT/ncu-$sh.csv) lines (summary: bench/cuda/ncu_summary.py)" ;;
    sw8|sw1) sh=8b; [ $stage = sw1 ] && sh=1b
      IFS='|' read -ra ents <<< "${SW:-X=0}"
      for ent in "${ents[@]}"; do env $ent bash -c "$(declare -f bench); B=$B OUT=$OUT bench $sh ${SW_BITS:-4} ${SW_P:-512} '$sh $ent'"; done ;;
    mv) timeout 240 $B/tests/cuda/cuda_mvbench 64 2>&1 | tee -a $OUT/mvbench.txt ;;
    mm) for q in 256 0; do echo "SMELT_CUDA_QMMA=$q"; SMELT_CUDA_QMMA=$q timeout 120 $B/tests/cuda/cuda_mmbench 17,32,64,128,256; done 2>&1 | tee -a $OUT/mmbench.txt ;;
    kern) (timeout ${KERN_TO:-240} $B/tests/cuda/test_cuda_kernels 2>&1 | tee $OUT/kern.log | grep -E "FAIL|checks" | tail -40) ;;
    *) echo "unknown stage $stage" ;;
  esac
done
