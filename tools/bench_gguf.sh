#!/usr/bin/env bash
# sluice and llama.cpp on the same GGUF file, alternated in one session (docs/BENCHMARKS.md
# section 12): llama-bench pp128/tg64, then sluice with a 128-token prompt and 64 generated
# tokens (the file memory-mapped, as llama.cpp maps it), REPS times each.
#
#   tools/bench_gguf.sh GGUF [REPS] [sluice flags, e.g. --experts stream --cache-experts 32]
set -euo pipefail
G=$1
REPS=${2:-3}
shift $(($# < 2 ? $# : 2))
BIN=${BIN:-build/sluice}
LLAMA=${LLAMA:-/tmp/nlc-bundle/build/bin/llama-bench}
IDS=$(seq -s, 1 128)
for i in $(seq "$REPS"); do
    "$LLAMA" -m "$G" -t 2 -p 128 -n 64 -r 1 2>/dev/null | grep -E "pp128|tg64" | awk -F'|' '{print "llama.cpp", $(NF-2), $(NF-1)}'
    "$BIN" generate "$G" --ids "$IDS" -n 65 -t 2 "$@" 2>&1 >/dev/null | sed 's/^/sluice    /'
done
