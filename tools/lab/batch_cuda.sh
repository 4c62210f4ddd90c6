#!/usr/bin/env bash
# Batched decode (sl_batch_decode, issue 29) on the H200 in one call: builds bench_cuda, checks
# batch rows against each sequence decoded alone on fixtures of each attention kind (counts of
# rows that differ, the largest relative L2, argmax changes: a step of several rows takes the
# prompt's kernels on CUDA), then Qwen3-30B-A3B shapes (48 layers, int4, zero experts) decoding
# B = 1, 4, 16, 64 sequences together after 128-token prompts, resident and with a GPU expert
# cache of 32 slots a layer (25%) fed from host memory: aggregate tokens/s and bytes copied a
# token. Carry .deps.txz.     OUT=/some/dir [SLOTS="0 32"] tools/lab/batch_cuda.sh
. tools/lab/device_env.sh
B=build-cuda/bench_cuda
( [ -d $W/src48 ] || python3 tools/make_synth.py $W/src48 --preset qwen3-30b-a3b --zero-experts
  echo synth done ) > $OUT/synth.log 2>&1 &
PS=$!
make CUDA=1 -j12 $B > $OUT/build.log 2>&1; el "built $?"; grep -E ' error' $OUT/build.log | head
for f in qwen3_gqa_untied qwen3_next_a qwen3_5_moe_text fam/deepseek_v3_a fam/gpt_oss_a fam/llama4_a \
         fam/gemma4_a; do
  echo "$f: $(SL_BATCH=3 SL_BATCH_CHECK=1 $B run tests/fixtures/$f cuda resident 0 9 12 2>&1 | grep -E 'batch check|rror')"
done | tee $OUT/check.txt
wait $PS; el "$(tail -1 $OUT/synth.log)"
[ -d $W/int4-48 ] || $B pack $W/src48 $W/int4-48
el packed
echo "int4-48: $(SL_BATCH=4 SL_BATCH_CHECK=1 $B run $W/int4-48 cuda resident 0 128 8 2>&1 | grep 'batch check')" | tee -a $OUT/check.txt
for slots in ${SLOTS:-0 32}; do
  for b in 1 4 16 64; do
    echo "slots $slots B $b: $(SL_BATCH=$b $B run $W/int4-48 cuda resident $slots 128 64 2>&1 | grep -E '^batch|decode .* tok/s' | head -2 | tr '\n' ' ')"
  done
done | tee $OUT/rates.txt
el done
