#!/usr/bin/env bash
# The CPU benchmark set (issue 3), in one session (docs/BENCHMARKS.md sections 5 and 6 quote its output).
# Needs: build/sluice; packs /tmp/synth/b8-q8 and b8-q4 of the bench-A shapes
#   /usr/bin/python3 tools/make_synth.py /tmp/synth/bench8 --layers 8
#   build/sluice pack /tmp/synth/bench8 /tmp/synth/b8-q8 --quant int8   (and int4)
# and llama.cpp's llama-bench with /tmp/m/a-q{8,4}.gguf (../shared/bench/README.md).
set -uo pipefail
BIN=${BIN:-build/sluice}
S=/tmp/synth
drop() { python3 -c '
import os, sys
for d in sys.argv[1:]:
    for n in os.listdir(d):
        fd = os.open(os.path.join(d, n), os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
' "$@"; }
stats() { grep -E "prompt tokens|decode steps|hits|bytes read|per prompt|per decode|expert I/O|expert compute"; }
RAND=$(python3 -c "import random; random.seed(2); print(','.join(str(random.randrange(151936)) for _ in range(256)))")

echo "### 1. resident, side by side with llama.cpp"
for q in 8 4; do
    echo "--- int$q vs Q${q}_0"
    tools/bench_resident.sh $S/b8-q$q /tmp/m/a-q$q.gguf 3
done

echo "### 2. streamed decode, cache of 16 of 128 experts per layer (about 1/8 of the experts)"
for q in 8 4; do
    for io in "--direct-io" ""; do
        drop $S/b8-q$q
        echo "--- int$q cold page cache $io"
        $BIN generate $S/b8-q$q --ids "$RAND" -n 33 -t 2 --experts stream --cache-experts 16 $io --stats 2>&1 >/dev/null | stats
    done
    echo "--- int$q warm page cache"
    $BIN generate $S/b8-q$q --ids "$RAND" -n 33 -t 2 --experts stream --cache-experts 16 --stats 2>&1 >/dev/null | stats
done

echo "### 3. expert bytes per token: prompt token by token (decode path) vs chunks of 128 and 256"
for b in 1 128 256; do
    echo "--- int8 --batch $b"
    $BIN generate $S/b8-q8 --ids "$RAND" -n 1 -t 2 --batch $b --experts stream --cache-experts 16 --direct-io --stats 2>&1 >/dev/null | stats
done

echo "### 4. everything cached: streamed vs resident decode (same run shape)"
for q in 8 4; do
    for mode in "stream" "resident" "stream" "resident"; do
        echo "--- int$q $mode"
        $BIN generate $S/b8-q$q --ids "$RAND" -n 65 -t 2 --experts $mode 2>&1 >/dev/null
    done
done
