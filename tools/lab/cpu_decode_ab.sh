#!/bin/bash
# Issue 28 (docs/BENCHMARKS.md 5.1): llama-bench on a Q4_0 (or Q8_0) bench-A GGUF and two sluice
# binaries (BASE, NEW) on the int4 (int8) pack of the same shapes, alternated (the sluice pair in
# alternating order), prefill 128 and decode after a 128-token prompt:
#   BASE=/tmp/sluice-base NEW=build/sluice ROUNDS=5 TH=2 tools/lab/cpu_decode_ab.sh
#   GGUF=/tmp/m/a-q8.gguf PACK=/tmp/synth/b8-q8 ... for int8
# Before each engine runs, the other's file leaves the page cache (posix_fadvise DONTNEED;
# EVICT=0 keeps it): the int8 pair (5.6 GB GGUF, 5.6 GB pack, 5.6 GB resident copy) does not fit
# a 23 GiB VM beside each other, and reclaim then rereads weights mid-run (decode at 3-7 tok/s).
LL=${LL:-/tmp/nlc-bundle/build/bin/llama-bench}
GGUF=${GGUF:-/tmp/m/a-q4.gguf}
PACK=${PACK:-/tmp/synth/b8-q4}
BASE=${BASE:-/tmp/sluice-base}
NEW=${NEW:-build/sluice}
TH=${TH:-2}
IDS=$(seq -s, 1 128)
evict() {
    [ "${EVICT:-1}" = 1 ] || return 0
    python3 -c '
import os, sys
for p in sys.argv[1:]:
    fs = [os.path.join(p, f) for f in os.listdir(p)] if os.path.isdir(p) else [p]
    for f in fs:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)' "$@"
}
for r in $(seq "${ROUNDS:-5}"); do
    if [ $((r % 2)) = 1 ]; then order="$BASE $NEW"; else order="$NEW $BASE"; fi
    evict "$PACK"
    "$LL" -m "$GGUF" -t "$TH" -p 128 -n 64 -d 0,128 -r 1 2>/dev/null | grep -E "pp128 |tg64 @ d128" |
        awk -F'|' -v r="$r" '{print r, "llama.cpp", $(NF-2), $(NF-1)}'
    evict "$GGUF"
    for b in $order; do
        echo "$r $b $("$b" generate "$PACK" --ids "$IDS" -n 65 -t "$TH" --experts resident 2>&1 >/dev/null | tail -1)"
    done
done
