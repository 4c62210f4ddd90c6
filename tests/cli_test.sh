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

# pack / verify and the expert-store options, end to end.
ids=$(json_field "$M/ref.json" ids)
greedy=$(json_field "$M/ref.json" greedy)
if "$BIN" pack "$M" "$TMP/p8" --quant int8 2>/dev/null && "$BIN" verify "$TMP/p8" | grep -q OK; then
    ok "pack + verify"
else
    bad "pack + verify"
fi
"$BIN" generate "$M" --ids "$ids" -n 6 --experts mapped >"$TMP/g0" 2>/dev/null
for mode in "resident" "stream --cache-experts 2" "stream --cache-mem 1M --cache-policy lru --io-threads 2"; do
    "$BIN" generate "$TMP/p8" --ids "$ids" -n 6 --experts $mode >"$TMP/g1" 2>"$TMP/err"
    "$BIN" generate "$TMP/p8" --ids "$ids" -n 6 >"$TMP/g2" 2>/dev/null
    if cmp -s "$TMP/g1" "$TMP/g2" && grep -q "experts hit" "$TMP/err"; then ok "int8 --experts $mode"; else bad "int8 --experts $mode"; fi
done
if "$BIN" generate "$TMP/p8" --ids "$ids" -n 4 --experts stream --cache-experts 2 --stats \
    --router-hist "$TMP/h.json" >/dev/null 2>"$TMP/err" && grep -q "expert bytes read" "$TMP/err" &&
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert sum(map(sum,(l["counts"] for l in d["layers"]))) > 0' "$TMP/h.json"; then
    ok "--stats and --router-hist"
else
    bad "--stats and --router-hist $(cat "$TMP/err")"
fi
"$BIN" pack "$M" "$TMP/pb" --quant bf16 2>/dev/null
got=$("$BIN" generate "$TMP/pb" --ids "$ids" -n 12 --experts stream --cache-experts 2 2>/dev/null | tail -n 1)
if [ "$got" = "$greedy" ]; then ok "bf16 pack streams the reference greedy ids"; else bad "bf16 pack greedy: $got"; fi
got=$("$BIN" generate "$TMP/pb" --ids "$ids" -n 12 --batch 1 --experts stream --cache-experts 3 2>/dev/null | tail -n 1)
if [ "$got" = "$greedy" ]; then ok "--batch 1 (prompt through the decode path)"; else bad "--batch 1: $got"; fi
expect_fail "pack bad quant" "invalid --quant" "$BIN" pack "$M" "$TMP/x" --quant int3
expect_fail "pack missing out" "SRC and OUT" "$BIN" pack "$M"
expect_fail "pack a pack" "already packed" "$BIN" pack "$TMP/p8" "$TMP/x"
expect_fail "stream on HF dir" "packed model" "$BIN" generate "$M" --ids 1 --experts stream
expect_fail "cache too small" "smaller than" "$BIN" generate "$TMP/p8" --ids 1 --experts stream --cache-experts 1
expect_fail "bad cache size" "invalid --cache-mem" "$BIN" generate "$TMP/p8" --ids 1 --experts stream --cache-mem 12Q
expect_fail "cache without stream" "need --experts stream" "$BIN" generate "$TMP/p8" --ids 1 --cache-experts 4
expect_fail "bad experts mode" "invalid --experts" "$BIN" generate "$TMP/p8" --ids 1 --experts disk
printf 'x' | dd of="$TMP/p8/experts-000.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
expect_fail "verify tampered" "experts-000.bin: SHA-256 mismatch" "$BIN" verify "$TMP/p8"
if "$BIN" inspect "$TMP/p8" >"$TMP/out" 2>&1 && grep -q "experts int8" "$TMP/out" &&
    grep -q "qwen3_moe" "$TMP/out"; then ok "inspect"; else bad "inspect $(cat "$TMP/out")"; fi
expect_fail "inspect no model" "config.json" "$BIN" inspect "$TMP"
# Qwen4-Exp: PLE tables and an eos list reported
if "$BIN" inspect "$FIX/qwen4_exp_b" >"$TMP/out" 2>&1 && grep -q "PLE *2 layer" "$TMP/out" &&
    grep -q "end of turn *7, 9" "$TMP/out"; then ok "inspect qwen4_exp"; else bad "inspect qwen4_exp $(cat "$TMP/out")"; fi
# The text commands on a tiny random model with the real Qwen3 tokenizer.
if "${PYTHON:-python3}" tools/make_synth.py "$TMP/tq" --preset tiny-qwen-vocab 2>/dev/null; then
    cp tests/tokenizer/qwen3/tokenizer.json "$TMP/tq/"
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --chat-template chatml >"$TMP/r1" 2>"$TMP/err"
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --chat-template chatml >"$TMP/r2" 2>/dev/null
    if [ -s "$TMP/r1" ] && cmp -s "$TMP/r1" "$TMP/r2" && grep -q "decode 12 tok" "$TMP/err"; then
        ok "run: greedy is reproducible, stats line"
    else
        bad "run greedy $(cat "$TMP/err")"
    fi
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 1.5 --top-k 50 --seed 7 >"$TMP/s1" 2>/dev/null
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 1.5 --top-k 50 --seed 7 >"$TMP/s2" 2>/dev/null
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 1.5 --top-k 50 --seed 8 >"$TMP/s3" 2>/dev/null
    if cmp -s "$TMP/s1" "$TMP/s2" && ! cmp -s "$TMP/s1" "$TMP/s3"; then ok "run: same seed, same text"; else bad "run seeds"; fi
    stop=$(head -c 3 "$TMP/r1" | tail -c 2)
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --chat-template chatml --stop "$stop" >"$TMP/r3" 2>/dev/null
    if [ "$(wc -c <"$TMP/r3")" -lt "$(wc -c <"$TMP/r1")" ] && ! grep -qF -- "$stop" "$TMP/r3"; then
        ok "run: --stop ends the reply before the stop string"
    else
        bad "run --stop '$stop': $(cat "$TMP/r3")"
    fi
    printf 'Hello' >"$TMP/prompt.txt"
    "$BIN" run "$TMP/tq" -f "$TMP/prompt.txt" -n 12 --chat-template chatml >"$TMP/r4" 2>/dev/null
    if cmp -s "$TMP/r1" "$TMP/r4"; then ok "run -f FILE"; else bad "run -f"; fi
    printf 'Hi\n/help\n/stats\n/reset\nHi\n/exit\n' |
        "$BIN" chat "$TMP/tq" -n 6 --chat-template chatml >"$TMP/c1" 2>"$TMP/err"
    if grep -q "commands:" "$TMP/c1" && grep -q "expert requests" "$TMP/c1" &&
        grep -q "(new conversation)" "$TMP/c1"; then
        ok "chat (piped): /help /stats /reset /exit"
    else
        bad "chat piped $(cat "$TMP/err")"
    fi
    # The same through a pseudo-terminal (libedit line editing).
    if command -v script >/dev/null; then
        printf 'Hi\n/exit\n' | script -qec "$BIN chat $TMP/tq -n 6 --chat-template chatml" /dev/null \
            >"$TMP/c2" 2>&1
        if grep -q "sluice chat" "$TMP/c2" && grep -q "prompt .* tok" "$TMP/c2"; then
            ok "chat on a terminal"
        else
            bad "chat pty: $(tail -c 400 "$TMP/c2")"
        fi
    fi
    # Ctrl-C stops a long reply and returns to the prompt, which still works.
    if command -v script >/dev/null; then
        (printf 'Hi\n'; sleep 3; printf '\003'; sleep 1; printf '/exit\n') |
            timeout 60 script -qec "$BIN chat $TMP/tq -n 100000 --ctx 32768 --chat-template chatml" \
                /dev/null >"$TMP/c3" 2>&1
        if grep -q "(stopped)" "$TMP/c3" && grep -q "prompt .* tok" "$TMP/c3"; then
            ok "chat: Ctrl-C stops the reply, not the program"
        else
            bad "chat Ctrl-C: $(tail -c 300 "$TMP/c3")"
        fi
    fi
    expect_fail "run without prompt" "-p TEXT or -f FILE" "$BIN" run "$TMP/tq"
    expect_fail "run bad temp" "invalid --temp" "$BIN" run "$TMP/tq" -p x --temp -1
    expect_fail "run no tokenizer" "tokenizer" "$BIN" run "$M" -p x
    expect_fail "run bad template" "unknown chat template" "$BIN" run "$TMP/tq" -p x --chat-template llama
else
    bad "could not make the tiny model (python3-numpy missing?)"
fi
# tokenize: the contract checked against Hugging Face tokenizers' ids.
if "$BIN" tokenize tests/tokenizer/qwen3/tokenizer.json --jsonl tests/tokenizer/corpus.jsonl >"$TMP/ids" 2>"$TMP/err" &&
    python3 - "$TMP/ids" tests/tokenizer/qwen3_ids.jsonl <<'PY'; then
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
sys.exit(0 if a == b and len(a) > 0 else 1)
PY
    ok "tokenize --jsonl matches the reference ids"
else
    bad "tokenize $(cat "$TMP/err")"
fi
expect_fail "tokenize missing input" "one of --jsonl" "$BIN" tokenize tests/tokenizer/qwen3/tokenizer.json
expect_fail "tokenize bad file" "cannot open" "$BIN" tokenize tests/tokenizer/qwen3/tokenizer.json --jsonl /nonexistent
# The default model (make run): verifies, streams text with a cache of half its experts.
if "$BIN" verify models/kjv-moe >/dev/null 2>&1 &&
    "$BIN" run models/kjv-moe --raw -p "And it came to pass" -n 40 --temp 0.8 --seed 1 \
        --experts stream --cache-experts 4 >"$TMP/d1" 2>"$TMP/err" &&
    grep -q "^And it came to pass" "$TMP/d1" && grep -q "experts hit" "$TMP/err" &&
    [ "$(wc -w <"$TMP/d1")" -gt 25 ]; then
    ok "default model: verify and stream text"
else
    bad "default model $(cat "$TMP/err")"
fi
for cmd in pack verify inspect run chat tokenize; do
    if "$BIN" $cmd --help >"$TMP/out" 2>&1 && grep -q usage "$TMP/out"; then ok "help '$cmd'"; else bad "help '$cmd'"; fi
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
