#!/usr/bin/env bash
# End-to-end checks of the command-line contract:
#   sluice logits MODEL --ids ... --out FILE   -> T x V float32 LE, matching transformers
#   sluice generate MODEL --ids ... -n N       -> new ids, comma-separated, last stdout line
# plus --help everywhere and one clear error line (non-zero exit) for bad input.
set -u
BIN=${1:-build/sluice}
FIX=${2:-tests/fixtures}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# expect_fail NAME PATTERN CMD...: non-zero exit, exactly one stderr line matching PATTERN.
expect_fail() {
    local name=$1 pat=$2
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne 0 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "$pat" "$TMP/err"; then
        ok "$name"
    else
        bad "$name (rc=$rc, stderr: $(head -c 300 "$TMP/err"))"
    fi
}

json_field() { python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))[sys.argv[2]])))' "$@"; }

for dir in "$FIX"/*/; do
    dir=${dir%/}
    [ -f "$dir/ref.json" ] || continue
    name=$(basename "$dir")
    ids=$(json_field "$dir/ref.json" ids)
    greedy=$(json_field "$dir/ref.json" greedy)
    n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["greedy"]))' "$dir/ref.json")
    got=$("$BIN" generate "$dir" --ids "$ids" -n "$n" 2>/dev/null | tail -n 1)
    if [ "$got" = "$greedy" ]; then ok "generate $name"; else bad "generate $name: got '$got' want '$greedy'"; fi
    if "$BIN" logits "$dir" --ids "$ids" --out "$TMP/l.f32" 2>"$TMP/err" &&
        python3 - "$TMP/l.f32" "$dir/logits.f32" <<'PY'; then
import array, math, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
b.frombytes(open(sys.argv[2], "rb").read())
assert len(a) == len(b), (len(a), len(b))
num = sum((x - y) ** 2 for x, y in zip(a, b))
den = sum(y * y for y in b)
sys.exit(0 if math.sqrt(num / den) <= 1e-4 else 1)
PY
        ok "logits $name"
    else
        bad "logits $name $(cat "$TMP/err")"
    fi
done

M="$FIX/qwen3_gqa_untied"
for cmd in "" logits generate; do
    if "$BIN" $cmd --help >"$TMP/out" 2>&1 && grep -q usage "$TMP/out"; then ok "help '$cmd'"; else bad "help '$cmd'"; fi
done
if "$BIN" --version | grep -q '^sluice '; then ok "version"; else bad "version"; fi
expect_fail "unknown command" "unknown command" "$BIN" frobnicate
expect_fail "unknown flag" "unknown option" "$BIN" generate "$M" --ids 1 --bogus
expect_fail "missing value" "needs a value" "$BIN" generate "$M" --ids
expect_fail "missing model" "missing MODEL" "$BIN" generate --ids 1
expect_fail "missing ids" "missing --ids" "$BIN" generate "$M"
expect_fail "bad ids" "invalid --ids" "$BIN" generate "$M" --ids 1,x,3
expect_fail "empty id" "invalid --ids" "$BIN" generate "$M" --ids 1,,3
expect_fail "bad -n" "invalid -n" "$BIN" generate "$M" --ids 1 -n -4
expect_fail "id out of vocab" "outside the vocabulary" "$BIN" generate "$M" --ids 1,99999999 -n 1
expect_fail "ctx too small" "context full" "$BIN" generate "$M" --ids 1,2,3 -n 4 --ctx 2
expect_fail "missing out" "missing --out" "$BIN" logits "$M" --ids 1
expect_fail "no such model" "No such file" "$BIN" generate /nonexistent --ids 1
expect_fail "not a model" "config.json" "$BIN" generate "$TMP" --ids 1
mkdir -p "$TMP/trunc"
cp "$M/config.json" "$TMP/trunc/"
head -c 3000 "$M/model.safetensors" >"$TMP/trunc/model.safetensors"
expect_fail "truncated weights" "model.safetensors" "$BIN" generate "$TMP/trunc" --ids 1
expect_fail "unwritable out" "cannot write" "$BIN" logits "$M" --ids 1 --out /nonexistent/dir/x

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
