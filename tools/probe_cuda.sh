#!/usr/bin/env bash
# In-kernel probe of decode steps of the issue-8 benchmark model, on the GPU machine: builds a
# copy of this tree with nvcc -DCU_PROBE (each block of the probed kernels records its start,
# its wait's return and its end; cuda_common.cuh), decodes with it and prints
# tools/probe_summary.py's per-kernel figures. Unlike tools/timeline_cuda.sh it keeps dependent
# launch on, and it shows what a kernel does after its wait.
#   tools/probe_cuda.sh [WORKDIR] [make options, e.g. DEPS=.deps]
# Writes $OUT/probe.bin (else WORKDIR). Env: SLOTS (GPU expert slots, 0 = all), DECODE (32), and
# whatever the run should see.
set -euo pipefail
W=${1:-/tmp/sluice-bench}
shift || true
O=${OUT:-$W}
mkdir -p "$W" "$O"
export LD_LIBRARY_PATH=$PWD/.deps/lib:${LD_LIBRARY_PATH:-}
D=/tmp/probe-$(basename "$PWD") # one a tree, so two trees can build at once
rm -rf "$D" && mkdir -p "$D"
tar --exclude=./build --exclude=./build-cuda --exclude=./.ab -cf - . | (cd "$D" && tar xf -)
(cd "$D" && NVFLAGS="-O3 -DCU_PROBE" make CUDA=1 -j"$(nproc)" "$@" build-cuda/bench_cuda >/dev/null)
[ -d "$W/src" ] || python3 tools/make_synth.py "$W/src" --preset qwen3-30b-a3b --zero-experts 2>/dev/null
[ -d "$W/int4" ] || "$D/build-cuda/bench_cuda" pack "$W/src" "$W/int4"
SLUICE_CUDA_PROBE="$O/probe.bin" "$D/build-cuda/bench_cuda" run "$W/int4" cuda resident "${SLOTS:-0}" 16 "${DECODE:-32}"
python3 tools/probe_summary.py "$O/probe.bin" 0.5
