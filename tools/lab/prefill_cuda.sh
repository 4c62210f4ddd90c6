#!/usr/bin/env bash
# GPU prefill on the H200 in one device call (issue 28, docs/BENCHMARKS.md 15.1): builds with CUDA,
# runs make test-cuda and the families on CUDA, writes and packs Qwen3-30B-A3B shapes (8 layers,
# int4), alternates a 512-token prefill on tensor cores, on the float32 tiles
# (--cuda-no-tensor-cores) and with CUDA_MODULE_LOADING=EAGER, then prints a CUPTI per-kernel
# table of one prefill (tools/lab/trace_cuda.c). Carry .deps.txz (tools/cuda_deps.sh).
#   OUT=/some/dir tools/lab/prefill_cuda.sh
set -u
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/progress.log; }
W=build-cuda/q30; mkdir -p $W
tar xJf .deps.txz; export DEPS=$PWD/.deps
export LD_LIBRARY_PATH=$DEPS/lib:${LD_LIBRARY_PATH:-}
[ -d $W/src ] || (python3 tools/make_synth.py $W/src --preset qwen3-30b-a3b --layers 8 --zero-experts > $OUT/synth.log 2>&1) &
PS=$!
make CUDA=1 -j16 build-cuda/sluice build-cuda/test_cuda build-cuda/test_cuda_model build-cuda/test_cuda_blocks > $OUT/build.log 2>&1; echo rc=$? >> $OUT/build.log
el "built: $(tail -1 $OUT/build.log)"; grep -E "error:" $OUT/build.log | head -20
timeout 120 make CUDA=1 test-cuda > $OUT/test_cuda.log 2>&1; echo rc=$? >> $OUT/test_cuda.log
el "test-cuda: $(grep -E 'passed|failed' $OUT/test_cuda.log | tail -4 | tr '\n' ' ')"
grep -E "FAIL" $OUT/test_cuda.log | head -30
PYTHON=python3 timeout 120 bash tests/fam_test.sh build-cuda/sluice > $OUT/fam_cuda.log 2>&1; echo rc=$? >> $OUT/fam_cuda.log
el "fam on cuda: $(grep 'fam:' $OUT/fam_cuda.log)"; grep FAIL $OUT/fam_cuda.log | head
wait $PS
[ -d $W/int4 ] || build-cuda/sluice pack $W/src $W/int4 --quant int4 > $OUT/pack.log 2>&1
el "packed"
IDS=$(seq -s, 1 512)
for r in 1 2; do
  for v in tc fma eager; do
    f=; e=; [ $v = fma ] && f=--cuda-no-tensor-cores; [ $v = eager ] && e="env CUDA_MODULE_LOADING=EAGER"
    echo "$r $v $($e build-cuda/sluice generate $W/int4 --ids "$IDS" -n 8 --experts resident $f 2>&1 >/dev/null | grep prompt)" | tee -a $OUT/ab.txt
  done
done
el "ab done"
CUDA=$(dirname "$(dirname "$(command -v nvcc)")")
LIB=$(dirname "$(find "$CUDA"/ -name 'libcupti.so' | head -1)")
INC=$(dirname "$(find "$CUDA"/ -name cupti.h | head -1)")
cc -O2 -shared -fPIC -I"$INC" -o $W/trace_cuda.so tools/lab/trace_cuda.c -L"$LIB" -lcupti && \
TRACE_OUT=$OUT/trace.csv LD_PRELOAD=$W/trace_cuda.so LD_LIBRARY_PATH="$LIB:$LD_LIBRARY_PATH" \
  build-cuda/sluice generate $W/int4 --ids "$IDS" -n 1 --experts resident > /dev/null 2>&1
python3 tools/lab/trace_summary.py $OUT/trace.csv 0 > $OUT/trace_sum.txt 2>&1; head -30 $OUT/trace_sum.txt
rm -f $OUT/trace.csv
el done
