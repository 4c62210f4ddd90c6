#!/usr/bin/env bash
# Batched decode on the CPU (issue 29) where the machine is quiet (the GPU machine's host, two
# cores pinned): bench-A shapes (Qwen3-30B-A3B layers, 8 of them, random weights, int4), B = 1,
# 4, 16 sequences decoding together after 64-token prompts, 2 threads, alternated ROUNDS times:
# aggregate tokens/s and where a step's time goes. Carry .deps.txz.
#   OUT=/some/dir [ROUNDS=2] tools/lab/batch_cpu.sh
. tools/lab/device_env.sh
B=build/bench_cuda
make -j16 DEPS=$DEPS $B > $OUT/build.log 2>&1; el "built $?"; grep -E ' error' $OUT/build.log | head
[ -d $W/srcA ] || python3 tools/make_synth.py $W/srcA --preset qwen3-30b-a3b --layers 8 > $OUT/synth.log 2>&1
el "synth $(tail -1 $OUT/synth.log)"
[ -d $W/int4-A ] || $B pack $W/srcA $W/int4-A; el packed
echo "check: $(SL_BATCH=4 SL_BATCH_CHECK=1 taskset -c 0,1 $B run $W/int4-A cpu resident 0 64 4 2 2>&1 | grep 'batch check')" | tee $OUT/rates.txt
for r in $(seq ${ROUNDS:-2}); do
  for b in 1 4 16; do
    echo "round $r B $b: $(SL_BATCH=$b taskset -c 0,1 $B run $W/int4-A cpu resident 0 64 16 2 2>&1 | grep -E '^batch|decode .* tok/s|a step' | cut -c1-150 | tr '\n' ' ')"
  done
done | tee -a $OUT/rates.txt
el done
