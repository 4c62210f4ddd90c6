#!/usr/bin/env bash
# Resident decode and prefill of a packed model next to llama.cpp on the same shapes,
# interleaved in one session (the machine is noisy): llama-bench pp128/tg64, then sluice
# with a 128-token prompt and 64 generated tokens, REPS times each.
#
#   tools/bench_resident.sh PACK GGUF [REPS]
set -euo pipefail
PACK=$1
GGUF=$2
REPS=${3:-3}
BIN=${BIN:-build/sluice}
LLAMA=${LLAMA:-/tmp/nlc-bundle/build/bin/llama-bench}
IDS=$(seq -s, 1 128)
for i in $(seq "$REPS"); do
    "$LLAMA" -m "$GGUF" -t 2 -p 128 -n 64 -r 1 2>/dev/null | grep -E "pp128|tg64" | awk -F'|' '{print "llama.cpp", $(NF-2), $(NF-1)}'
    "$BIN" generate "$PACK" --ids "$IDS" -n 65 -t 2 --experts resident 2>&1 >/dev/null | sed 's/^/sluice    /'
done
