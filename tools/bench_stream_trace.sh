#!/usr/bin/env bash
# Streaming decode on a trained model's routing (issue 30): a pack streamed from a cold page
# cache with --direct-io, its routers replaced by a routing trace (--route-replay), each
# configuration against the bounds: the disk's (its O_DIRECT bandwidth at depth, over the bytes
# a decode step of the first configuration reads: no read ahead, nothing wasted) and the
# compute's (the same run with every expert in memory). The disk: DISK_PROBE if set (a build of
# tools/lab/disk_bw.c, for machines without fio), else fio where installed (apt-get install fio),
# else tools/lab/disk_bw.py (Python threads: lower, ~60% of fio's figure here).
#
#   tools/bench_stream_trace.sh PACK TRACE SLOTS ROUNDS CONFIG...
#     SLOTS    slots per layer (--cache-experts), e.g. 51 (10% of 512)
#     CONFIG   label=flags, e.g. base="--no-overlap --io-engine threads" all="--prefetch 10"
#   env: BIN (build/sluice), N (decode tokens, 32), T (threads, 2), TASKSET (e.g. "taskset -c 0,1"),
#        COMPUTE=1 (also the compute bound: --experts resident), COMPUTE_FLAGS (its extra flags),
#        COMP (the compute bound in tok/s, measured before), WARM (see IDS below)
#
# Rounds alternate the configurations (a,b,c,a,b,c,...); each line gives the median of the
# rounds. The disk is measured each round.
set -euo pipefail
PACK=$1 TRACE=$2 SLOTS=$3 ROUNDS=$4
shift 4
BIN=${BIN:-build/sluice}
N=${N:-32}
T=${T:-2}
# WARM=W: a W-token prompt through the decode path (--batch 1), so the timed steps meet a cache
# in its steady state instead of an empty one
IDS=$(seq -s, 101 $((100 + ${WARM:-16})))
PROMPT_BATCH=${WARM:+--batch 1}

drop_cache() {
    python3 - "$PACK" <<'PY'
import os, sys
for name in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}
disk_mbs() { # O_DIRECT reads of 8 MiB (an expert blob's size) at random offsets, 32 in flight
    local f
    f=$(ls "$PACK"/experts-*.bin | head -1)
    if [ -n "${DISK_PROBE:-}" ]; then # tools/lab/disk_bw.c, the same reads through io_uring
        "$DISK_PROBE" "$f" 8 32 4
    elif command -v fio >/dev/null; then
        fio --name=disk --filename="$f" --readonly --direct=1 --ioengine=io_uring --rw=randread \
            --bs=8M --iodepth=32 --runtime=4 --time_based --output-format=terse 2>/dev/null |
            awk -F';' '{printf "%.0f\n", $7 * 1.024 / 1000 * 1000 / 1000}'
    else
        python3 tools/lab/disk_bw.py "$PACK"/experts-*.bin --qd 32 --block 8M --seconds 4
    fi
}
run() { # flags... -> "tok/s hit% MB/step readMB/s recall%"
    drop_cache
    ${TASKSET:-} "$BIN" generate "$PACK" --ids "$IDS" -n "$N" -t "$T" --experts stream \
        --cache-experts "$SLOTS" --direct-io --route-replay "$TRACE" --stats $PROMPT_BATCH "$@" 2>&1 >/dev/null |
        awk '/^decode steps/ {gsub(/\(/, "", $4); tps = $4}
             /^expert requests/ {gsub(/[()%]/, "", $6); hit = $6}
             /per decode step/ {mb = $4}
             /^expert bytes read/ {gsub(/\(/, "", $11); bw = $11}
             /pre-gating/ {gsub(/[%,]/, "", $9); rec = $9}
             END {printf "%s %s %s %s %s\n", tps, hit, mb, bw, rec == "" ? "-" : rec}'
}
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

declare -A RES
DISK=()
for r in $(seq 1 "$ROUNDS"); do
    DISK+=("$(disk_mbs)")
    for c in "$@"; do
        label=${c%%=*} flags=${c#*=}
        # shellcheck disable=SC2086
        line=$(run $flags)
        echo "round $r $label: $line" >&2
        RES[$label]+="$line"$'\n'
    done
done
disk=$(printf '%s\n' "${DISK[@]}" | median)
echo "disk (O_DIRECT, 8 MiB): $disk MB/s (rounds: ${DISK[*]})"
comp=${COMP:-}
if [ -n "${COMPUTE:-}" ]; then # every expert in memory: the compute's bound
    comp=$(${TASKSET:-} "$BIN" generate "$PACK" --ids "$IDS" -n "$N" -t "$T" --experts resident \
        --route-replay "$TRACE" --stats ${COMPUTE_FLAGS:-} 2>&1 >/dev/null | awk '/^decode steps/ {gsub(/\(/, "", $4); print $4}')
    echo "compute bound (--experts resident): $comp tok/s"
fi
printf '%-12s %8s %6s %9s %10s %8s %10s %8s\n' config tok/s hit% MB/step read_MB/s recall% disk_bound of_bound
first=${1%%=*} bound=""
for c in "$@"; do
    label=${c%%=*}
    col() { printf '%s' "${RES[$label]}" | awk -v k="$1" 'NF {print $k}' | median; }
    tps=$(col 1) hit=$(col 2) mb=$(col 3) bw=$(col 4) rec=$(printf '%s' "${RES[$label]}" | awk 'NF {print $5}' | head -1)
    [ "$label" = "$first" ] && bound=$(awk -v d="$disk" -v m="$mb" -v c="${comp:-0}" \
        'BEGIN {b = (m > 0 ? d / m : 0); if (c > 0 && c < b) b = c; printf "%.2f", b}')
    pct=$(awk -v t="$tps" -v b="$bound" 'BEGIN {printf "%.0f%%", (b > 0 ? 100 * t / b : 0)}')
    printf '%-12s %8s %6s %9s %10s %8s %10s %8s\n' "$label" "$tps" "$hit" "$mb" "$bw" "$rec" "$bound" "$pct"
done
