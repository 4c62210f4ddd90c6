#!/usr/bin/env bash
# Side-by-side CPU decode of two sluice binaries on one pack, alternated ROUNDS times (the
# machine drifts; alternating spreads it over both), then the medians. Three runs a round:
#   resident   128-token prompt, 64 decode steps, every expert in memory
#   stream     256-token random prompt, 32 decode steps, --cache-experts 16 (warm page cache)
#   cold       the same with the pack's pages dropped first (posix_fadvise DONTNEED)
# usage: tools/lab/ab_cpu.sh PACK ROUNDS NAME=BIN NAME=BIN
set -euo pipefail
PACK=$1
ROUNDS=$2
shift 2
PY=${PYTHON:-python3}
IDS=$(seq -s, 1 128)
RAND=$("$PY" -c "import random; random.seed(2); print(','.join(str(random.randrange(151936)) for _ in range(256)))")
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

drop_cache() {
    "$PY" - "$PACK" <<'PY'
import os, sys
for name in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}

# "prompt 128 tok, X tok/s | decode 64 tok, Y tok/s | ..." -> "X Y"
speeds() { sed -n 's/^prompt [0-9]* tok, \([0-9.]*\) tok\/s | decode [0-9]* tok, \([0-9.]*\) tok\/s.*/\1 \2/p' | tail -1; }

for r in $(seq "$ROUNDS"); do
    # each round starts one variant further on
    vs=("$@")
    for ((i = 0; i < $#; i++)); do
        v=${vs[$(((i + r) % $#))]}
        name=${v%%=*} bin=${v#*=}
        s=$("$bin" generate "$PACK" --ids "$IDS" -n 65 -t 2 --experts resident 2>&1 >/dev/null | speeds)
        echo "$name resident $s" | tee -a "$OUT"
        s=$("$bin" generate "$PACK" --ids "$RAND" -n 33 -t 2 --experts stream --cache-experts 16 2>&1 >/dev/null | speeds)
        echo "$name stream $s" | tee -a "$OUT"
        drop_cache
        s=$("$bin" generate "$PACK" --ids "$RAND" -n 33 -t 2 --experts stream --cache-experts 16 2>&1 >/dev/null | speeds)
        echo "$name cold $s" | tee -a "$OUT"
    done
done
echo "medians (prefill, decode tok/s):"
"$PY" - "$OUT" <<'PY'
import sys, statistics
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4:
        runs.setdefault((f[0], f[1]), []).append((float(f[2]), float(f[3])))
for (name, kind), v in sorted(runs.items(), key=lambda x: (x[0][1], x[0][0])):
    print(f"  {kind:9s} {name:10s} prefill {statistics.median(p for p, _ in v):8.2f}"
          f"  decode {statistics.median(d for _, d in v):7.2f}  ({len(v)} runs)")
PY
