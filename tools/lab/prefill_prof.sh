#!/usr/bin/env bash
# Where a GPU prefill goes (issue 28), in one device call without llama.cpp: builds sluice, an
# 8-layer Qwen3-30B-A3B int4 pack (zero experts), times a 512-token prefill with and without
# dependent launch (--cuda-no-pdl), and writes CUPTI kernel tables of both (without dependent
# launch each kernel's duration is its own; with it, read the "adds" column). Carry .deps.txz.
# TESTS=1: make test-cuda and the families on CUDA first; BENCH=NAME: test_cuda bench NAME;
# NCU=REGEX: Nsight Compute's sections for kernels matching REGEX in test_cuda bench $BENCH (the
# first NCU_SKIP such launches skipped); FAM=0: make test-cuda without the families.
#   OUT=/some/dir [TESTS=1] [BENCH=imma] [NCU=imma_gemm_batch] tools/lab/prefill_prof.sh
. tools/lab/device_env.sh
( [ -d $W/src8 ] || python3 tools/make_synth.py $W/src8 --preset qwen3-30b-a3b --layers 8 --zero-experts ) > $OUT/synth.log 2>&1 &
PS=$!
make CUDA=1 -j16 build-cuda/sluice build-cuda/test_cuda build-cuda/test_cuda_model build-cuda/test_cuda_blocks > $OUT/build.log 2>&1; echo rc=$? >> $OUT/build.log
el "built: $(tail -1 $OUT/build.log)"; grep -E "error" $OUT/build.log | head -20
if [ "${TESTS:-0}" = 1 ]; then
  timeout 200 make CUDA=1 test-cuda > $OUT/test_cuda.log 2>&1; echo rc=$? >> $OUT/test_cuda.log
  el "test-cuda: $(grep -E 'passed|failed|rc=' $OUT/test_cuda.log | tail -6 | tr '\n' ' ')"
  grep -E "FAIL|mismatch|differ" $OUT/test_cuda.log | head -30
  [ "${FAM:-1}" = 1 ] && PYTHON=python3 timeout 150 bash tests/fam_test.sh build-cuda/sluice > $OUT/fam_cuda.log 2>&1; echo rc=$? >> $OUT/fam_cuda.log
  el "fam on cuda: $(grep 'fam:' $OUT/fam_cuda.log) $(tail -1 $OUT/fam_cuda.log)"; grep FAIL $OUT/fam_cuda.log | head
fi
if [ -n "${BENCH:-}" ]; then
  timeout 120 build-cuda/test_cuda bench $BENCH > $OUT/bench.log 2>&1; echo rc=$? >> $OUT/bench.log
  el "bench done"; cat $OUT/bench.log | head -60
fi
NCUB=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "${NCU:-}" ]; then
  if [ -n "$NCUB" ]; then
    timeout 150 $NCUB --kernel-name "regex:$NCU" --launch-skip ${NCU_SKIP:-0} --launch-count 2 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section MemoryWorkloadAnalysis_Tables \
      build-cuda/test_cuda bench ${BENCH:-imma} > $OUT/ncu.txt 2>&1
    el "ncu rc=$?"; grep -E "imma|attn|Throughput|Bank|Shared|Pipe|Occupancy|Registers|Shared Memory Config|Stall|Warp Cycles|Issued|Block Limit|Eligible|No Eligible|One or More" $OUT/ncu.txt | head -90
  else el "no ncu"; fi
fi
wait $PS; el "synth: $(tail -1 $OUT/synth.log)"
[ -d $W/int4 ] || build-cuda/sluice pack $W/src8 $W/int4 --quant int4 > $OUT/pack.log 2>&1
el "packed $(du -sh $W/int4 | cut -f1)"
IDS=$(seq -s, 1 512)
for r in 1 2 3; do
  for v in pdl nopdl; do
    f=; [ $v = nopdl ] && f=--cuda-no-pdl
    echo "$r $v $(build-cuda/sluice generate $W/int4 --ids "$IDS" -n 8 --experts resident $f 2>&1 >/dev/null | grep prompt)" | tee -a $OUT/ab.txt
  done
done
CUDA=$(dirname "$(dirname "$(command -v nvcc)")")
LIB=$(dirname "$(find "$CUDA"/ -name 'libcupti.so' | head -1)"); INC=$(dirname "$(find "$CUDA"/ -name cupti.h | head -1)")
cc -O2 -shared -fPIC -I"$INC" -o $W/trace_cuda.so tools/lab/trace_cuda.c -L"$LIB" -lcupti
for v in pdl nopdl; do
  f=; [ $v = nopdl ] && f=--cuda-no-pdl
  TRACE_OUT=$OUT/trace.csv LD_PRELOAD=$W/trace_cuda.so LD_LIBRARY_PATH="$LIB:$LD_LIBRARY_PATH" \
    build-cuda/sluice generate $W/int4 --ids "$IDS" -n 1 --experts resident $f > /dev/null 2>&1
  python3 tools/lab/trace_summary.py $OUT/trace.csv 0 > $OUT/trace_$v.txt 2>&1; rm -f $OUT/trace.csv
  echo "== $v"; head -45 $OUT/trace_$v.txt
done
el done
