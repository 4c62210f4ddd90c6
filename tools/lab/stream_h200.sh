#!/usr/bin/env bash
# Issue 30 on the H200 host, experts on its own disk: Qwen3.5-397B-A17B layer shapes (4 layers,
# int4, 14.5 GB of experts) written and packed to the local disk, routed by the trained model's
# trace (tests/fixtures/trace/e512), decoded with a slot cache of 10%, 25% and 50% of the experts,
# cold (--direct-io), each I/O feature alone and all together; the disk's O_DIRECT bandwidth
# and the compute bound (every expert in memory) beside them.
#   MODE=cuda: the CUDA backend, GPU expert slots = host slots (the disk feeds the host slots,
#              pinned, and each miss copies to the GPU as its read lands)
#   MODE=cpu:  the CPU backend on 2 pinned cores (taskset -c 0,1): a quiet machine
#   PREP=1:    only build (and for cuda run make test-cuda), synthesize and pack, then stop: the
#              table in a second call while the machine is still warm
#   WARM=W:    a W-token prompt through the decode path first (steady state, not a cold cache)
# The disk is probed with tools/lab/disk_bw.c (the host has no fio).
# Carry .deps.txz (tools/cuda_deps.sh).   OUT=/some/dir MODE=cuda|cpu [N=32] [ROUNDS=1]
. tools/lab/device_env.sh
S=build-cuda/sluice
( [ -d $W/q35-int4 ] || { python3 tools/make_synth.py $W/q35 --preset qwen3.5-397b-a17b --layers 4 \
    --zero-experts > /dev/null && echo synth done; } ) > $OUT/synth.log 2>&1 &
PS=$!
if [ "$MODE" = cuda ]; then
    [ -x $S ] || { make CUDA=1 -j14 $S > $OUT/build.log 2>&1; el "built $?"; grep -E ' error' $OUT/build.log | head; }
    if [ -n "${PREP:-}" ]; then
        make CUDA=1 -j14 test-cuda > $OUT/test_cuda.log 2>&1; el "test-cuda $?"
        grep -E 'passed|failed|FAIL' $OUT/test_cuda.log | tail -8
    fi
else # the CPU backend needs no CUDA build
    S=build/sluice
    make -j14 $S > $OUT/build.log 2>&1; el "built $?"; grep -E ' error' $OUT/build.log | head
fi
[ -x build-cuda/disk_bw ] || cc -O2 -o build-cuda/disk_bw tools/lab/disk_bw.c -I$DEPS/include $DEPS/lib/liburing.a
export DISK_PROBE=$PWD/build-cuda/disk_bw
wait $PS
if [ ! -d $W/q35-int4 ]; then
    $S pack $W/q35 $W/q35-int4 --quant int4 > $OUT/pack.log 2>&1; el "packed $?"; rm -rf $W/q35
fi
[ -f $W/e512.sltrace ] || xz -dc tests/fixtures/trace/e512.sltrace.xz > $W/e512.sltrace
df -h $W | tail -1
[ -n "${PREP:-}" ] && { el prepared; exit 0; }
export OMP_WAIT_POLICY=passive # spinning OpenMP threads starve the readers (BENCHMARKS 18)
if [ "$MODE" = cuda ]; then
    EXTRA="--backend cuda" GPU=1 TASK="" T=16 P10=1
else
    EXTRA="--backend cpu" GPU=0 TASK="taskset -c 0,1" T=2 P10=""
fi
# the compute bound: every expert in memory, the same routing
COMP=$($TASK $S generate $W/q35-int4 --ids $(seq -s, 101 116) -n ${N:-32} -t $T --experts resident \
    --route-replay $W/e512.sltrace --stats $EXTRA 2>&1 >/dev/null | awk '/^decode steps/ {gsub(/\(/, "", $4); print $4}')
el "compute bound (--experts resident): $COMP tok/s" | tee -a $OUT/table_$MODE.txt
for slots in ${SLOTS:-51 128 256}; do
    g=""; [ $GPU = 1 ] && g="--gpu-experts $slots"
    el "slots $slots" | tee -a $OUT/table_$MODE.txt
    BIN=$S N=${N:-32} T=$T TASKSET="$TASK" COMP=$COMP \
        tools/bench_stream_trace.sh $W/q35-int4 $W/e512.sltrace $slots ${ROUNDS:-1} \
        "base=--io-engine threads --no-overlap $EXTRA $g" \
        "overlap=--io-engine threads $EXTRA $g" \
        "prefetch4=--io-engine threads --no-overlap --prefetch 4 $EXTRA $g" \
        "uring=--io-engine uring --no-overlap $EXTRA $g" \
        "all=--io-engine uring --prefetch 4 $EXTRA $g" \
        ${P10:+"all_p10=--io-engine uring --prefetch 10 $EXTRA $g"} 2>>$OUT/rounds.log | tee -a $OUT/table_$MODE.txt
done
el done
