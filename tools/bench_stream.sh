#!/usr/bin/env bash
# Streaming benchmark: decode a packed model whose experts exceed the cache budget,
# with a cold page cache (pages of the pack dropped with posix_fadvise) and a warm one.
#
#   tools/bench_stream.sh PACK CACHE_MEM [TOKENS] [extra sluice flags...]
#
# Prints sluice's --stats table for each run. Run it on an otherwise idle machine.
set -euo pipefail
PACK=$1
MEM=$2
N=${3:-32}
shift $(( $# >= 3 ? 3 : $# ))
BIN=${BIN:-build/sluice}
IDS=$(seq -s, 1 16)

drop_cache() { # evict the pack's pages from the page cache (no root needed for clean pages)
    python3 - "$PACK" <<'PY'
import os, sys
for name in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}

echo "== cold page cache: $PACK, --cache-mem $MEM, $N tokens $*"
drop_cache
"$BIN" generate "$PACK" --ids "$IDS" -n "$N" -t 2 --experts stream --cache-mem "$MEM" --stats "$@" >/dev/null
echo "== warm page cache (same run again)"
"$BIN" generate "$PACK" --ids "$IDS" -n "$N" -t 2 --experts stream --cache-mem "$MEM" --stats "$@" >/dev/null
