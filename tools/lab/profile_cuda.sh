#!/usr/bin/env bash
# Profiles one decode step of the issue-8 benchmark model on the GPU machine:
#   tools/lab/profile_cuda.sh [WORKDIR] [make options, e.g. DEPS=.deps]
# Writes to $OUT (else WORKDIR): time.csv (ncu, every kernel of two decode steps, durations;
# tools/lab/ncu_summary.py sums them per kernel) and full.txt (ncu's full sections for SKIP..+N
# consecutive kernels, one layer's worth by default: stall reasons, occupancy, throughput;
# FN=0 skips it).
set -euo pipefail
W=${1:-/tmp/sluice-bench}
shift || true
O=${OUT:-$W}
mkdir -p "$W" "$O"
make CUDA=1 -j"$(nproc)" "$@" build-cuda/bench_cuda >/dev/null
[ -d "$W/src" ] || python3 tools/make_synth.py "$W/src" --preset qwen3-30b-a3b --zero-experts 2>/dev/null
[ -d "$W/int4" ] || build-cuda/bench_cuda pack "$W/src" "$W/int4"
RUN="build-cuda/bench_cuda run $W/int4 cuda resident 0 1 8"
NCU="ncu --clock-control none --cache-control none"
$NCU --metrics gpu__time_duration.sum --csv --launch-skip "${SKIP:-1500}" --launch-count "${STEP:-900}" \
    $RUN >"$O/time.csv"
python3 tools/lab/ncu_summary.py "$O/time.csv"
[ "${FN:-12}" = 0 ] && exit 0
$NCU --set full --launch-skip "${FSKIP:-1500}" --launch-count "${FN:-12}" $RUN >"$O/full.txt" 2>&1
grep -E '^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Dynamic Shared' "$O/full.txt" | head -300
