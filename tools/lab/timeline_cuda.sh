#!/usr/bin/env bash
# A timeline of decode steps of the issue-8 benchmark model, on the GPU machine (which has no
# Nsight Systems): tools/lab/trace_cuda.c records kernels and runtime calls through CUPTI.
#   tools/lab/timeline_cuda.sh [WORKDIR] [make options, e.g. DEPS=.deps]
# Writes $OUT/trace.csv (else WORKDIR) and prints tools/lab/trace_summary.py's per-kernel durations,
# gaps and host leads. Env: SLOTS (GPU expert slots, 0 = all), DECODE (tokens, 32), and
# whatever the run should see (SL_GRAPHS=1, SL_NO_PDL=1).
set -euo pipefail
W=${1:-/tmp/sluice-bench}
shift || true
O=${OUT:-$W}
mkdir -p "$W" "$O"
CUDA=$(dirname "$(dirname "$(command -v nvcc)")")
make CUDA=1 -j"$(nproc)" "$@" build-cuda/bench_cuda >/dev/null
LIB=$(dirname "$(find "$CUDA"/ -name 'libcupti.so' | head -1)")
INC=$(dirname "$(find "$CUDA"/ -name cupti.h | head -1)")
cc -O2 -shared -fPIC -I"$INC" -o "$W/trace_cuda.so" tools/lab/trace_cuda.c -L"$LIB" -lcupti
[ -d "$W/src" ] || python3 tools/make_synth.py "$W/src" --preset qwen3-30b-a3b --zero-experts 2>/dev/null
[ -d "$W/int4" ] || build-cuda/bench_cuda pack "$W/src" "$W/int4"
TRACE_OUT="$O/trace.csv" LD_PRELOAD="$W/trace_cuda.so" LD_LIBRARY_PATH="$LIB:${LD_LIBRARY_PATH:-}" \
    build-cuda/bench_cuda run "$W/int4" cuda resident "${SLOTS:-0}" 16 "${DECODE:-32}"
python3 tools/lab/trace_summary.py "$O/trace.csv" 0.5
