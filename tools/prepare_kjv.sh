#!/usr/bin/env bash
# The demo model's training text: the King James Bible (public domain) from Debian's
# bible-kjv package, one verse per line without the references; the last 5% of the
# verses (most of Revelation's neighbours: Jude, Revelation and the end of the
# epistles) are held out for perplexity.
#
#   tools/prepare_kjv.sh OUTDIR      -> OUTDIR/train.txt, OUTDIR/heldout.txt
set -euo pipefail
out=${1:?usage: tools/prepare_kjv.sh OUTDIR}
command -v bible >/dev/null || { apt-get update && apt-get install -y bible-kjv bible-kjv-text; }
mkdir -p "$out"
bible -f "Ge1:1-Re22:21" | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$out/all.txt"
n=$(wc -l < "$out/all.txt")
keep=$(( n * 95 / 100 ))
head -n "$keep" "$out/all.txt" > "$out/train.txt"
tail -n +"$((keep + 1))" "$out/all.txt" > "$out/heldout.txt"
rm "$out/all.txt"
wc -l "$out/train.txt" "$out/heldout.txt"
