#!/usr/bin/env bash
# GPU prefill on the H200 in one device call (issue 28, docs/BENCHMARKS.md 15.1): builds sluice and
# llama.cpp (CUDA) from .llama-src.txz (the trimmed node-llama-cpp source; ../shared/bench), writes
# Qwen3-30B-A3B shapes (8 and 48 layers, zero experts) for both, runs make test-cuda, the families
# on CUDA, test_cuda bench, and a 512-token prefill of both engines. Carry .deps.txz
# (tools/cuda_deps.sh) and .llama-src.txz. tools/lab/prefill_sbs.sh follows on the same machine:
# SBS=1 runs it in the same call with the time left (QUICK=1: without the families on CUDA and
# the kernel benchmarks, to leave it more; BENCH='NAME ...': only test_cuda's benchmarks so named).
# TESTS=0: without make test-cuda (a second call on the machine the first left warm); LLAMA=0:
# sluice alone (prefill_sbs.sh then runs sluice's side only).
#   OUT=/some/dir [QUICK=1] [SBS=1] [BENCH='attention imma'] [TESTS=0] [LLAMA=0] tools/lab/prefill_cuda.sh
. tools/lab/device_env.sh
LLB=build-cuda/ll/build/bin/llama-bench
if [ ! -x $LLB ] && [ "${LLAMA:-1}" = 1 ]; then (
  mkdir -p build-cuda/ll; tar xJf .llama-src.txz -C build-cuda/ll
  sed -i '/miniaudio/d' build-cuda/ll/vendor/CMakeLists.txt 2>/dev/null
  sed -i -E '/add_subdirectory\((mtmd|tts|cvector-generator|export-lora|results|fit-params|imatrix|completion|batched-bench|tokenize|gguf-split|perplexity|server|cli|rpc|tuning|quantize|ui)\)/d' build-cuda/ll/tools/CMakeLists.txt
  cmake -S build-cuda/ll -B build-cuda/ll/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF && \
  cmake --build build-cuda/ll/build --target llama-bench -j 10 ) > $OUT/llama_build.log 2>&1 &
fi
PL=${!:-}
( [ -d $W/src8 ] || python3 tools/make_synth.py $W/src8 --preset qwen3-30b-a3b --layers 8 --zero-experts
  [ -f $W/a8.gguf ] || python3 tools/make_gguf_synth.py --preset bench-A --layers 8 --zero-experts --out q4_0:$W/a8.gguf
  echo synth8 done
  [ -d $W/src48 ] || python3 tools/make_synth.py $W/src48 --preset qwen3-30b-a3b --layers 48 --zero-experts
  [ -f $W/a48.gguf ] || python3 tools/make_gguf_synth.py --preset bench-A --layers 48 --zero-experts --out q4_0:$W/a48.gguf
  echo synth48 done ) > $OUT/synth.log 2>&1 &
PS=$!
make CUDA=1 -j8 build-cuda/sluice build-cuda/test_cuda build-cuda/test_cuda_model build-cuda/test_cuda_blocks > $OUT/build.log 2>&1; echo rc=$? >> $OUT/build.log
el "built: $(tail -1 $OUT/build.log)"; grep -E "error" $OUT/build.log | head -20
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 make CUDA=1 test-cuda > $OUT/test_cuda.log 2>&1; echo rc=$? >> $OUT/test_cuda.log
  el "test-cuda: $(grep -E 'passed|failed|rc=' $OUT/test_cuda.log | tail -6 | tr '\n' ' ')"
  grep -E "FAIL|mismatch|differ" $OUT/test_cuda.log | head -30
fi
if [ "${QUICK:-0}" != 1 ]; then
  PYTHON=python3 timeout 150 bash tests/fam_test.sh build-cuda/sluice > $OUT/fam_cuda.log 2>&1; echo rc=$? >> $OUT/fam_cuda.log
  el "fam on cuda: $(grep 'fam:' $OUT/fam_cuda.log) $(tail -1 $OUT/fam_cuda.log)"; grep FAIL $OUT/fam_cuda.log | head
  for b in ${BENCH:-all}; do
    [ $b = all ] && b=
    timeout 150 build-cuda/test_cuda bench $b >> $OUT/bench.log 2>&1; echo rc=$? >> $OUT/bench.log
  done
  el "bench done"; grep -v "^CUDA op" $OUT/bench.log | head -70
fi
while kill -0 $PS 2>/dev/null && ! grep -q "synth8 done" $OUT/synth.log; do sleep 2; done; el "synth8 done"
[ -d $W/int4 ] || build-cuda/sluice pack $W/src8 $W/int4 --quant int4 > $OUT/pack.log 2>&1
el "packed $(du -sh $W/int4 | cut -f1)"
IDS=$(seq -s, 1 512)
for r in $([ "${QUICK:-0}" = 1 ] && echo 1 || echo 1 2); do
  for v in tc f32act; do
    f=; [ $v = f32act ] && f=--cuda-int4-float-act
    echo "$r $v $(build-cuda/sluice generate $W/int4 --ids "$IDS" -n 8 --experts resident $f 2>&1 >/dev/null | grep prompt)" | tee -a $OUT/ab.txt
  done
done
[ "${LLAMA:-1}" = 1 ] && { wait $PL; el "llama build: $(tail -2 $OUT/llama_build.log | tr '\n' ' ') $(ls -la $LLB 2>&1)"; }
[ -x $LLB ] && $LLB -m $W/a8.gguf -ngl 99 -p 512 -n 0 -r 3 2>&1 | grep -E "pp512|error" | tee -a $OUT/ab.txt
wait $PS; el "synth48: $(tail -1 $OUT/synth.log)"
[ $(( $(date +%s) - T0 )) -lt 500 ] && [ ! -d $W/int4-48 ] && build-cuda/sluice pack $W/src48 $W/int4-48 --quant int4 > $OUT/pack48.log 2>&1
el "done; $(du -sh $W/* | tr '\n' ' '); $(df -h . | tail -1)"
[ "${SBS:-0}" = 1 ] && LIMIT=$(( ${CALL_LIMIT:-580} - ($(date +%s) - T0) )) bash tools/lab/prefill_sbs.sh
