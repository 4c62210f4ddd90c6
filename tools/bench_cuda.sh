#!/usr/bin/env bash
# The CUDA benchmark of issue 8, run on the GPU machine in one go:
#   tools/bench_cuda.sh [WORKDIR]
# Builds sluice with CUDA, writes a synthetic Qwen3-30B-A3B-shape checkpoint (48 layers, int4
# experts zero-valued as holes of a sparse source, see make_synth.py --zero-experts), packs it,
# measures the device's memory and PCIe bandwidth (tools/membw_cuda.cu), then decodes:
#   1. CUDA, everything resident in GPU memory;
#   2. CUDA, experts in host RAM (resident, pinned), a GPU cache of 25% of them (32 of 128);
#   3. the CPU backend on the same machine.
set -euo pipefail
W=${1:-/tmp/sluice-bench}
mkdir -p "$W"
make CUDA=1 -j"$(nproc)" build-cuda/sluice >/dev/null
nvcc -O2 -o "$W/membw_cuda" tools/membw_cuda.cu
"$W/membw_cuda"
[ -d "$W/src" ] || python3 tools/make_synth.py "$W/src" --preset qwen3-30b-a3b --zero-experts 2>/dev/null
[ -d "$W/int4" ] || build-cuda/sluice pack "$W/src" "$W/int4" --quant int4 2>/dev/null
B=build-cuda/sluice
IDS=$(seq -s, 101 228) # a 128-token prompt
run() { echo "== $*"; "$B" generate "$W/int4" --ids "$IDS" --stats "$@" 2>&1 >/dev/null | grep -E \
    "prompt tokens|decode steps|expert requests|GPU expert|bytes read|time:|router|expert I/O|compute|other"; }
for r in 1 2 3; do run -n 128 --backend cuda --experts resident; done
for r in 1 2 3; do run -n 128 --backend cuda --experts resident --gpu-experts 32; done
run -n 32 --backend cpu --experts resident -t "$(nproc)"
