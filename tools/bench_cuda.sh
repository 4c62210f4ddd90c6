#!/usr/bin/env bash
# The CUDA benchmark of issue 8, run on the GPU machine in one go:
#   tools/bench_cuda.sh [WORKDIR] [make options, e.g. DEPS=.deps]
# Builds the library with CUDA, writes a synthetic Qwen3-30B-A3B-shape checkpoint (48 layers;
# experts zero-valued, as holes of a sparse source: make_synth.py --zero-experts), packs it at
# int4, measures the device's memory and PCIe bandwidth (tools/membw_cuda.cu), then decodes:
#   1. CUDA, everything resident in GPU memory (then once without programmatic dependent
#      launches and once with decode steps as CUDA graphs, for comparison);
#   2. CUDA, experts in host RAM (resident, pinned), a GPU cache of 25% of them (32 of 128);
#   3. the CPU backend on the same machine.
set -euo pipefail
W=${1:-/tmp/sluice-bench}
shift || true
mkdir -p "$W"
make CUDA=1 -j"$(nproc)" "$@" build-cuda/bench_cuda >/dev/null
nvcc -O2 -o "$W/membw_cuda" tools/membw_cuda.cu
"$W/membw_cuda"
[ -d "$W/src" ] || python3 tools/make_synth.py "$W/src" --preset qwen3-30b-a3b --zero-experts 2>/dev/null
[ -d "$W/int4" ] || build-cuda/bench_cuda pack "$W/src" "$W/int4"
B=build-cuda/bench_cuda
for r in 1 2 3; do $B run "$W/int4" cuda resident 0 128 128; done
SL_NO_PDL=1 $B run "$W/int4" cuda resident 0 128 128   # without dependent launches
SL_GRAPHS=1 $B run "$W/int4" cuda resident 0 128 128
for r in 1 2 3; do $B run "$W/int4" cuda resident 32 128 128; done
$B run "$W/int4" cpu resident 0 128 32 "$(nproc)"
