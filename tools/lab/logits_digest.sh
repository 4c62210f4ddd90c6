#!/usr/bin/env bash
# Prints one digest line per (fixture, path, mode): the sha256 of the logits and of the greedy
# ids, for comparing two builds bit for bit (a refactor must leave every line the same).
# usage: tools/lab/logits_digest.sh BIN [BACKEND [FIXTURE...]] > digests.txt
#   BIN      a sluice binary;  BACKEND  cpu (default) | cuda;  FIXTURE  names under tests/fixtures
#   (default: all; several processes, one fixture each, run in parallel: their outputs
#   concatenated in the order of the names match a run over all)
set -euo pipefail
BIN=$1
BE=${2:-cpu}
shift $(($# >= 2 ? 2 : $#))
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
extra=()
if [ "$BE" = cuda ]; then extra=(--backend cuda); else extra=(--backend cpu); fi

digest() { # NAME FILE...
    local name=$1
    shift
    printf '%-40s %s\n' "$name" "$(cat "$@" | sha256sum | cut -c1-16)"
}

run_one() { # LABEL MODEL IDS ARGS...
    local label=$1 model=$2 ids=$3
    shift 3
    if "$BIN" logits "$model" --ids "$ids" --out "$TMP/l.f32" "${extra[@]}" "$@" 2>"$TMP/err"; then
        digest "$label logits" "$TMP/l.f32"
    else
        echo "$label logits FAILED: $(head -c 200 "$TMP/err")"
    fi
    if "$BIN" generate "$model" --ids "$ids" -n 12 "${extra[@]}" "$@" >"$TMP/g.txt" 2>"$TMP/err"; then
        digest "$label greedy" "$TMP/g.txt"
    else
        echo "$label greedy FAILED: $(head -c 200 "$TMP/err")"
    fi
}

dirs=()
if [ $# -gt 0 ]; then
    for f in "$@"; do dirs+=("$ROOT/tests/fixtures/$f/"); done
else
    dirs=("$ROOT"/tests/fixtures/*/)
fi
for dir in "${dirs[@]}"; do
    [ -f "$dir/config.json" ] || continue
    name=$(basename "$dir")
    read -r ids long k < <("$PY" - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
ref = json.load(open(d + "/ref.json"))
V = ref.get("vocab_size") or json.load(open(d + "/config.json")).get("vocab_size", 256)
ids = ref["ids"]
long = [(i * 37 + 11) % min(V, 250) for i in range(150)]
c = json.load(open(d + "/config.json"))
c = c.get("text_config", c)
k = c.get("num_experts_per_tok") or c.get("moe_top_k") or 2
print(",".join(map(str, ids)), ",".join(map(str, long)), k)
PY
)
    run_one "$name hf" "$dir" "$ids"
    run_one "$name hf long" "$dir" "$long"
    run_one "$name hf long b1" "$dir" "$long" --batch 7
    if "$BIN" pack "$dir" "$TMP/p" --force >/dev/null 2>"$TMP/err"; then
        for mode in resident mapped; do
            run_one "$name pack $mode" "$TMP/p" "$long" --experts $mode
        done
        run_one "$name pack stream min" "$TMP/p" "$long" --experts stream --cache-experts "$k"
        run_one "$name pack stream lru" "$TMP/p" "$long" --experts stream --cache-experts $((k + 1)) --cache-policy lru
        run_one "$name pack stream 5" "$TMP/p" "$long" --experts stream --cache-experts $((k + 3)) --batch 9
        if [ "$BE" = cuda ]; then
            run_one "$name pack gpu 2" "$TMP/p" "$long" --experts stream --cache-experts $((k + 2)) --gpu-experts "$k"
            run_one "$name pack gpu 3 res" "$TMP/p" "$long" --experts resident --gpu-experts 3
            run_one "$name pack gpu graphs" "$TMP/p" "$long" --experts resident --cuda-graphs
        fi
        rm -rf "$TMP/p"
    else
        echo "$name pack FAILED: $(head -c 200 "$TMP/err")"
    fi
done
