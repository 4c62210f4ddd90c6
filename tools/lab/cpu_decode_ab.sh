#!/bin/bash
# Issue 28 (docs/BENCHMARKS.md 5.1): llama-bench on a Q4_0 bench-A GGUF and two sluice binaries
# (BASE, NEW) on the int4 pack of the same shapes, alternated (the sluice pair in alternating
# order), prefill 128 and decode after a 128-token prompt:
#   BASE=/tmp/sluice-base NEW=build/sluice ROUNDS=5 TH=2 tools/lab/cpu_decode_ab.sh
LL=${LL:-/tmp/nlc-bundle/build/bin/llama-bench}
GGUF=${GGUF:-/tmp/m/a-q4.gguf}
PACK=${PACK:-/tmp/synth/b8-q4}
BASE=${BASE:-/tmp/sluice-base}
NEW=${NEW:-build/sluice}
TH=${TH:-2}
IDS=$(seq -s, 1 128)
for r in $(seq "${ROUNDS:-5}"); do
    if [ $((r % 2)) = 1 ]; then order="$BASE $NEW"; else order="$NEW $BASE"; fi
    "$LL" -m "$GGUF" -t "$TH" -p 128 -n 64 -d 0,128 -r 1 2>/dev/null | grep -E "pp128 |tg64 @ d128" |
        awk -F'|' -v r="$r" '{print r, "llama.cpp", $(NF-2), $(NF-1)}'
    for b in $order; do
        echo "$r $b $("$b" generate "$PACK" --ids "$IDS" -n 65 -t "$TH" --experts resident 2>&1 >/dev/null | tail -1)"
    done
done
