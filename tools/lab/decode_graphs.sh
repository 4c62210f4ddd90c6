#!/usr/bin/env bash
# GPU decode with steps replayed as CUDA graphs (issue 28 part 3) in one H200 call: builds this
# tree (and, with OLD=DIR, another tree's bench_cuda beside it: a copy made here with
# `git archive REV src include Makefile tools tests/cuda | tar -x -C .ab/old`, carried with .ab),
# runs make test-cuda (TESTS=0: not), writes Qwen3-30B-A3B shapes (48 layers, zero experts), then
# alternates bench_cuda's decode (128-token prompt, 128 steps) eager, as graphs (SL_GRAPHS=1) and
# with the old tree, ROUNDS times; then says where replayed steps stop matching
# (SL_CUDA_GRAPH_TRACE) and prints a CUPTI timeline summary of each mode (tools/lab/trace_cuda.c).
# Carry .deps.txz (tools/cuda_deps.sh).   OUT=/some/dir [OLD=.ab/old] [ROUNDS=3] tools/lab/decode_graphs.sh
. tools/lab/device_env.sh
B=build-cuda/bench_cuda
( [ -d $W/src48 ] || python3 tools/make_synth.py $W/src48 --preset qwen3-30b-a3b --zero-experts
  echo synth done ) > $OUT/synth.log 2>&1 &
PS=$!
if [ -n "${OLD:-}" ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old && cp -r "$OLD"/. /tmp/old/
  (cd /tmp/old && make CUDA=1 -j6 DEPS=$DEPS build-cuda/bench_cuda > $OUT/old_build.log 2>&1) &
  PO=$!
fi
make CUDA=1 -j12 build-cuda/sluice build-cuda/test_cuda build-cuda/test_cuda_model \
  build-cuda/test_cuda_blocks $B > $OUT/build.log 2>&1; el "built $?"; grep -E ' error' $OUT/build.log | head
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 make CUDA=1 test-cuda > $OUT/test_cuda.log 2>&1
  el "test-cuda $?: $(grep -E 'passed|failed' $OUT/test_cuda.log | tail -6 | tr '\n' ' ')"
  grep -E 'FAIL|graph steps|window' $OUT/test_cuda.log | head -40
fi
wait $PS; el "$(tail -1 $OUT/synth.log)"
[ -d $W/int4-48 ] || $B pack $W/src48 $W/int4-48
if [ -n "${OLD:-}" ]; then
  wait $PO; el "old built: $(ls /tmp/old/$B 2>&1)"
  [ -d $W/int4-48-old ] || /tmp/old/$B pack $W/src48 $W/int4-48-old
fi
rate() { grep -o 'decode 128 tok [0-9.]*' | awk '{print $4}'; }
run() { case $1 in
  eager) $B run $W/int4-48 cuda resident 0 128 128 ;;
  graphs) SL_GRAPHS=1 $B run $W/int4-48 cuda resident 0 128 128 ;;
  old) /tmp/old/$B run $W/int4-48-old cuda resident 0 128 128 ;;
  esac; }
V="eager graphs"; [ -n "${OLD:-}" ] && V="$V old"
for r in $(seq ${ROUNDS:-3}); do
  for v in $V; do echo "round $r $v $(run $v 2>&1 | tee -a $OUT/runs.log | rate)" | tee -a $OUT/ab.txt; done
  V="${V#* } ${V%% *}" # the next round starts one variant further on
done
for v in $V; do
  echo "$v median $(grep " $v " $OUT/ab.txt | awk '{print $4}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
done | tee -a $OUT/ab.txt
SL_GRAPHS=1 SL_CUDA_GRAPH_TRACE=1 $B run $W/int4-48 cuda resident 0 128 64 2>&1 | sort | uniq -c | sort -rn | head -8
CUDA=$(dirname "$(dirname "$(command -v nvcc)")")
LIB=$(dirname "$(find "$CUDA"/ -name 'libcupti.so' | head -1)"); INC=$(dirname "$(find "$CUDA"/ -name cupti.h | head -1)")
cc -O2 -shared -fPIC -I"$INC" -o $W/trace_cuda.so tools/lab/trace_cuda.c -L"$LIB" -lcupti
for v in eager graphs; do
  e=; [ $v = graphs ] && e=SL_GRAPHS=1
  env $e TRACE_OUT=$OUT/trace_$v.csv LD_PRELOAD=$W/trace_cuda.so LD_LIBRARY_PATH="$LIB:$LD_LIBRARY_PATH" \
    $B run $W/int4-48 cuda resident 0 128 64 > /dev/null 2>&1
  python3 tools/lab/trace_summary.py $OUT/trace_$v.csv 0.5 > $OUT/trace_$v.txt 2>&1; rm -f $OUT/trace_$v.csv
  echo "== $v"; head -24 $OUT/trace_$v.txt
done
el done
