#!/usr/bin/env bash
# End-to-end checks of the command-line contract:
#   sluice logits MODEL --ids ... --out FILE   -> T x V float32 LE, matching transformers
#   sluice generate MODEL --ids ... -n N       -> new ids, comma-separated, last stdout line
# plus --help everywhere and one clear error line (non-zero exit) for bad input.
set -u
BIN=${1:-build/sluice}
FIX=${2:-tests/fixtures}
# make's python3, which has numpy (tools/deps.sh pick-python): the one first on the PATH may be
# a version manager's shim, which costs tens of ms at each of the many calls here.
PY=${PYTHON:-python3}
. "$(dirname "$0")/lib.sh"

json_field() { "$PY" -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))[sys.argv[2]])))' "$@"; }

# logits_close NAME FILE REF [BOUND]: relative L2 distance of two T x V float32 files at most
# BOUND (1e-4).
logits_close() {
    "$PY" - "$2" "$3" "${4:-1e-4}" <<'PY'
import array, math, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
b.frombytes(open(sys.argv[2], "rb").read())
assert len(a) == len(b), (len(a), len(b))
num = sum((x - y) ** 2 for x, y in zip(a, b))
den = sum(y * y for y in b)
sys.exit(0 if math.sqrt(num / den) <= float(sys.argv[3]) else 1)
PY
}

# check_ref NAME MODEL REFDIR: greedy ids and logits of MODEL against REFDIR's transformers run.
check_ref() {
    local name=$1 model=$2 dir=$3
    ids=$(json_field "$dir/ref.json" ids)
    greedy=$(json_field "$dir/ref.json" greedy)
    n=$("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["greedy"]))' "$dir/ref.json")
    got=$("$BIN" generate "$model" --ids "$ids" -n "$n" 2>/dev/null | tail -n 1)
    if [ "$got" = "$greedy" ]; then ok "generate $name"; else bad "generate $name: got '$got' want '$greedy'"; fi
    if "$BIN" logits "$model" --ids "$ids" --out "$TMP/l.f32" 2>"$TMP/err" &&
        logits_close "$name" "$TMP/l.f32" "$dir/logits.f32"; then
        ok "logits $name"
    else
        bad "logits $name $(cat "$TMP/err")"
    fi
}

# pack_keeps NAME GGUF IDS REF K: `sluice pack GGUF OUT` keeps the GGUF's types (issue 26); the
# pack passes verify and gives REF (the GGUF's own logits) bit for bit, its experts mapped,
# resident and streamed through K slots.
pack_keeps() {
    local name=$1 g=$2 ids=$3 ref=$4 k=$5 out="$TMP/pk-$1" same=1 mode
    if ! "$BIN" pack "$g" "$out" 2>"$TMP/err" || ! "$BIN" verify "$out" >/dev/null 2>>"$TMP/err"; then
        bad "pack $name: $(cat "$TMP/err")"
        return
    fi
    for mode in "" "--experts resident" "--experts stream --cache-experts $k"; do
        # shellcheck disable=SC2086
        "$BIN" logits "$out" --ids "$ids" --out "$TMP/pk.f32" $mode 2>"$TMP/err" &&
            cmp -s "$ref" "$TMP/pk.f32" || { same=0; bad "pack $name ${mode:-mapped}: other bits $(cat "$TMP/err")"; }
    done
    [ $same = 1 ] && ok "pack $name: the GGUF's bits (mapped, resident, streamed)"
    rm -rf "$out"
}

# check_modes NAME MODEL REFDIR MODE...: MODEL's logits in each mode (its experts read from its
# files by the store, through caches down to one token's top-k) are the mapped run's bits.
check_modes() {
    local name=$1 model=$2 dir=$3 same=1
    shift 3
    k=$("$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config", c)["num_experts_per_tok"])' "$dir/config.json")
    ids=$(json_field "$dir/ref.json" ids)
    "$BIN" logits "$model" --ids "$ids" --out "$TMP/mapped.f32" 2>/dev/null
    for mode in "$@"; do
        mode=${mode//K1/$((k + 1))}
        mode=${mode//K/$k}
        # shellcheck disable=SC2086
        "$BIN" logits "$model" --ids "$ids" --out "$TMP/mode.f32" $mode 2>"$TMP/err" &&
            cmp -s "$TMP/mapped.f32" "$TMP/mode.f32" || { same=0; bad "$name $mode: $(cat "$TMP/err")"; }
    done
    [ $same = 1 ] && ok "$name: resident and streamed experts give the mapped bits"
}

# check_parts NAME MODEL REFDIR: the pipeline split (--parts, logical partitions on the CPU)
# gives the unsplit bits: logits split in 2 and 3 (as many as there are layers), mapped and
# streamed through top-k slots in chunks of 3, and the greedy ids through the KV cache.
check_parts() {
    local name=$1 model=$2 dir=$3 same=1 P layers mode k
    layers=$("$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config", c)["num_hidden_layers"])' "$dir/config.json")
    k=$("$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config", c)["num_experts_per_tok"])' "$dir/config.json")
    ids=$(json_field "$dir/ref.json" ids)
    "$BIN" logits "$model" --ids "$ids" --out "$TMP/p1.f32" 2>/dev/null
    want=$("$BIN" generate "$model" --ids "$ids" -n 4 2>/dev/null | tail -n 1)
    for P in 2 3; do
        [ "$P" -le "$layers" ] || continue
        for mode in "" "--experts stream --cache-experts K --batch 3"; do
            mode=${mode//K/$k}
            # shellcheck disable=SC2086
            "$BIN" logits "$model" --ids "$ids" --out "$TMP/pp.f32" --parts $P $mode 2>"$TMP/err" &&
                cmp -s "$TMP/p1.f32" "$TMP/pp.f32" || { same=0; bad "$name --parts $P $mode: $(cat "$TMP/err")"; }
        done
        got=$("$BIN" generate "$model" --ids "$ids" -n 4 --parts $P 2>"$TMP/err" | tail -n 1)
        [ -n "$want" ] && [ "$got" = "$want" ] || { same=0; bad "$name --parts $P generate: got '$got' want '$want'"; }
    done
    [ $same = 1 ] && ok "$name: split over 2 and 3 partitions, the unsplit bits"
}

for dir in "$FIX"/*/; do
    dir=${dir%/}
    [ -f "$dir/ref.json" ] || continue
    check_ref "$(basename "$dir")" "$dir" "$dir"
    # A Hugging Face directory's experts streamed from its safetensors files.
    check_modes "$(basename "$dir")" "$dir" "$dir" "--experts resident" \
        "--experts stream --cache-experts K --batch 3"
    check_parts "$(basename "$dir")" "$dir" "$dir"
done
expect_fail "--parts 0" "invalid --parts" "$BIN" logits "$FIX/qwen3_gqa_untied" --ids 1 --out "$TMP/l.f32" --parts 0
expect_fail "--parts past the layers" "4 partitions of a model of 3 layers: give 1 to 3" \
    "$BIN" logits "$FIX/qwen3_gqa_untied" --ids 1 --out "$TMP/l.f32" --parts 4
expect_fail "--gpus on the CPU backend" "partitions on GPUs of their own need the CUDA backend" \
    "$BIN" logits "$FIX/qwen3_gqa_untied" --ids 1 --out "$TMP/l.f32" --gpus 2 --backend cpu
expect_fail "--gpus 0" "invalid --gpus" "$BIN" logits "$FIX/qwen3_gqa_untied" --ids 1 --out "$TMP/l.f32" --gpus 0
expect_fail "--part-mem too small" "does not fit in 2 partitions: .* on partition 0, whose budget is 0.1 MiB" \
    "$BIN" logits "$FIX/qwen3_gqa_untied" --ids 1 --out "$TMP/l.f32" --parts 2 --part-mem 100K
# 2 boundaries, the residual and the FFN output at each, in 5 forward calls (a prompt, 4 steps)
if "$BIN" generate "$FIX/qwen3_gqa_untied" --ids 1,2,3,4 -n 4 --parts 3 --stats 2>&1 |
    grep -q "^split  *20 moves between partitions"; then
    ok "--stats counts the moves between partitions"
else
    bad "--stats with --parts 3: not 20 moves between partitions"
fi
if "$BIN" logits "$FIX/qwen3_gqa_untied" --ids 1 --out "$TMP/l.f32" --parts 2 --part-mem 1M -v 2>&1 |
    grep -q "sluice: 2 partitions: layers 0-"; then
    ok "-v names the partitions' layers"
else
    bad "-v with --parts: no partitions line"
fi
# GGUF files llama.cpp's converter made of the fixtures (tests/fixtures/gguf/README.md): the
# same weights, so the same transformers reference.
for f in "$FIX"/gguf/*.gguf; do
    base=$(basename "$f" .gguf)
    dir="$FIX/${base%.*}"
    check_ref "gguf $base" "$f" "$dir"
    # Experts streamed from the GGUF file itself: the same bits in every mode and cache size.
    check_modes "gguf $base" "$f" "$dir" "--experts resident" "--experts stream --cache-experts K" \
        "--experts stream --cache-experts K --cache-policy lru --batch 3" \
        "--experts stream --direct-io --cache-experts K1"
    pack_keeps "$base" "$f" "$ids" "$TMP/mapped.f32" "$k"
done

# next_ref NAME FILE SRC KEY=JSON...: a GGUF file that llama.cpp reads otherwise than its
# source's config.json says (tests/fixtures/gguf_next/README.md) against that source run by
# sluice with the config as llama.cpp reads the file (KEY=JSON edits): logits within 1e-5 and
# the same greedy ids (the KV-cache path).
next_ref() {
    local name=$1 f=$2 src=$3 ref="$TMP/ref-$1"
    shift 3
    mkdir -p "$ref" && ln -sf "$(cd "$src" && pwd)/model.safetensors" "$ref/"
    "$PY" - "$src/config.json" "$ref/config.json" "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    c[k] = json.loads(v)
json.dump(c, open(sys.argv[2], "w"))
PY
    local ids n want got
    ids=$(json_field "$src/ref.json" ids)
    n=$("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["greedy"]))' "$src/ref.json")
    want=$("$BIN" generate "$ref" --ids "$ids" -n "$n" 2>/dev/null | tail -n 1)
    got=$("$BIN" generate "$f" --ids "$ids" -n "$n" 2>"$TMP/err" | tail -n 1)
    if [ -n "$want" ] && [ "$got" = "$want" ]; then ok "generate gguf $name"; else bad "generate gguf $name: got '$got' want '$want' $(cat "$TMP/err")"; fi
    if "$BIN" logits "$ref" --ids "$ids" --out "$TMP/want.f32" 2>"$TMP/err" &&
        "$BIN" logits "$f" --ids "$ids" --out "$TMP/l.f32" 2>>"$TMP/err" &&
        logits_close "$name" "$TMP/l.f32" "$TMP/want.f32" 1e-5; then
        ok "logits gguf $name"
    else
        bad "logits gguf $name $(cat "$TMP/err")"
    fi
}
GGUF_MODES=("--experts resident" "--experts stream --cache-experts K"
    "--experts stream --cache-experts K --cache-policy lru --batch 3"
    "--experts stream --direct-io --cache-experts K1")
# qwen3next: llama.cpp always renormalises the top-k weights (the fixture's config does not).
next_ref qwen3_next_b "$FIX/gguf_next/qwen3_next_b.bf16.gguf" "$FIX/qwen3_next_b" norm_topk_prob=true
check_modes "gguf qwen3_next_b" "$FIX/gguf_next/qwen3_next_b.bf16.gguf" "$FIX/qwen3_next_b" "${GGUF_MODES[@]}"
# An MTP layer, which the converter appends to the blocks by default, is no layer of the model.
mkdir -p "$TMP/gg" # (not in $TMP itself: later tests take it for a directory without a model)
"$PY" tests/gguf_mutate.py "$FIX/gguf_next/qwen3_next_b.bf16.gguf" "$TMP/gg/mtp.gguf" mtp
if "$BIN" logits "$TMP/gg/mtp.gguf" --ids "$(json_field "$FIX/qwen3_next_b/ref.json" ids)" \
    --out "$TMP/mtp.f32" 2>"$TMP/err" && cmp -s "$TMP/mapped.f32" "$TMP/mtp.f32"; then
    ok "gguf: an MTP layer (nextn_predict_layers) is not run"
else
    bad "gguf MTP layer: $(cat "$TMP/err")"
fi
# qwen4exp: a sigmoid output gate, and no compress ratio (the converter writes one only for
# layers called full_attention): dense attention; then with a ratio, the QSA indexer (its
# q and k projections apart).
next_ref qwen4_exp_a "$FIX/gguf_next/qwen4_exp_a.bf16.gguf" "$FIX/qwen4_exp_a" \
    output_gate_type='"sigmoid"' indexer_n_heads=0
check_modes "gguf qwen4_exp_a" "$FIX/gguf_next/qwen4_exp_a.bf16.gguf" "$FIX/qwen4_exp_a" "${GGUF_MODES[@]}"
"$PY" tests/gguf_mutate.py "$FIX/gguf_next/qwen4_exp_a.bf16.gguf" "$TMP/gg/qwen4_exp_qsa.gguf" qsa
next_ref qwen4_exp_a-qsa "$TMP/gg/qwen4_exp_qsa.gguf" "$FIX/qwen4_exp_a" output_gate_type='"sigmoid"'
# inspect's lines about the model of a hybrid GGUF file are its Hugging Face source's.
model_lines() { "$BIN" inspect "$1" 2>&1 | grep -E '^(architecture|layers|hidden|experts|vocabulary|PLE) '; }
for p in gguf/qwen3_5_moe_text gguf_next/qwen3_next_b gguf_next/qwen4_exp_a; do
    want=$(model_lines "$FIX/$(basename "$p")")
    got=$(model_lines "$FIX/$p.bf16.gguf")
    if [ -n "$want" ] && [ "$got" = "$want" ]; then ok "gguf inspect $(basename "$p")"; else bad "gguf inspect $(basename "$p"): $got"; fi
done

M="$FIX/qwen3_gqa_untied"
for cmd in "" logits generate perplexity; do
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
expect_fail "ctx too small" "longer than the context of 2 tokens (--ctx)" "$BIN" generate "$M" --ids 1,2,3 -n 4 --ctx 2
# llama.cpp habits: options of several letters after one dash are unknown options (with a
# hint where sluice has another way), not "-n gl"; attached short values still work.
expect_fail "-ngl: unknown option with a hint" "unknown option '-ngl'.*--gpu-experts" \
    "$BIN" generate "$M" --ids 1 -ngl 99
expect_fail "--n-gpu-layers: the same hint" "unknown option '--n-gpu-layers'.*--backend cuda" \
    "$BIN" run "$M" -p x --n-gpu-layers 99
expect_fail "-temp: did you mean --temp" "did you mean '--temp'" "$BIN" run "$M" -p x -temp 0.5
expect_fail "-m and a MODEL operand" "given with -m" "$BIN" generate -m "$M" "$M" --ids 1
ids=$(json_field "$M/ref.json" ids)
nids=$(echo "$ids" | tr ',' '\n' | wc -l)
"$BIN" generate "$M" --ids "$ids" -n 5 >"$TMP/g5" 2>/dev/null
if "$BIN" generate -m "$M" --ids "$ids" -n5 -c $((nids + 5)) >"$TMP/g5m" 2>/dev/null && cmp -s "$TMP/g5" "$TMP/g5m" &&
    "$BIN" generate --model "$M" --ids "$ids" --n-predict 5 --ctx-size 512 2>/dev/null | cmp -s - "$TMP/g5"; then
    ok "generate -m/--model, -n5/--n-predict, -c/--ctx-size"
else
    bad "generate llama.cpp-style flags"
fi
# A context too short for -n: the ids that fit (prompt + new = ctx + 1, the last one not run
# through the model) are printed, with a notice, exit 0.
if "$BIN" generate "$M" --ids "$ids" -n 5 --ctx $((nids + 2)) >"$TMP/gc" 2>"$TMP/err" &&
    [ "$(tail -n 1 "$TMP/gc")" = "$(tail -n 1 "$TMP/g5" | cut -d, -f1-3)" ] &&
    grep -q "context of $((nids + 2)) tokens is full: stopped after 3 of 5" "$TMP/err"; then
    ok "generate past the context prints the ids it made"
else
    bad "generate past the context: $(cat "$TMP/gc" "$TMP/err")"
fi
if "$BIN" generate "$M" --ids 1 -n 1 --ctx 600 2>&1 >/dev/null | grep -q "longer than the model's 512 positions"; then
    ok "--ctx past max_position_embeddings warns"
else
    bad "--ctx past max_position_embeddings"
fi
"$BIN" logits "$M" --ids "$ids" --out "$TMP/lf.f32" 2>/dev/null
if "$BIN" logits "$M" --ids "$ids" --out - -v >"$TMP/lo.f32" 2>"$TMP/err" && cmp -s "$TMP/lf.f32" "$TMP/lo.f32" &&
    grep -q "qwen3_moe, 3 layers" "$TMP/err"; then
    ok "logits --out - writes the logits alone to stdout (-v to stderr)"
else
    bad "logits --out -: $(head -c 300 "$TMP/err")"
fi
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
for mode in "resident" "stream --cache-experts 2" "stream --cache-mem 1M --cache-policy lru --io-threads 2" \
    "stream --cache-experts 2 --no-overlap" "stream --cache-experts 2 --io-engine threads --direct-io" \
    "stream --cache-mem auto"; do
    "$BIN" generate "$TMP/p8" --ids "$ids" -n 6 --experts $mode >"$TMP/g1" 2>"$TMP/err"
    "$BIN" generate "$TMP/p8" --ids "$ids" -n 6 >"$TMP/g2" 2>/dev/null
    if cmp -s "$TMP/g1" "$TMP/g2" && grep -q "experts hit" "$TMP/err"; then ok "int8 --experts $mode"; else bad "int8 --experts $mode"; fi
done
if "$BIN" generate "$TMP/p8" --ids "$ids" -n 4 --experts stream --cache-experts 2 --stats \
    --router-hist "$TMP/h.json" >/dev/null 2>"$TMP/err" && grep -q "expert bytes read" "$TMP/err" &&
    "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert sum(map(sum,(l["counts"] for l in d["layers"]))) > 0' "$TMP/h.json"; then
    ok "--stats and --router-hist"
else
    bad "--stats and --router-hist $(cat "$TMP/err")"
fi
# Routing traces (issue 30): --router-trace writes every token's picks at every MoE layer; the
# same picks whether the prompt runs as one chunk or token by token, counted as --router-hist
# counts them; trace-replay of the engine's policy and slots gives the run's own hit rate, and
# its optimum the one --stats prints.
if "$BIN" generate "$TMP/p8" --ids "$ids" -n 8 --experts stream --cache-experts 2 --stats \
    --router-hist "$TMP/th.json" --router-trace "$TMP/t.sltrace" >"$TMP/tg" 2>"$TMP/err" &&
    "$BIN" generate "$TMP/p8" --ids "$ids" -n 8 --batch 1 --router-trace "$TMP/t1.sltrace" \
        >"$TMP/tg1" 2>/dev/null && cmp -s "$TMP/tg" "$TMP/tg1" &&
    "$PY" - "$TMP/t.sltrace" "$TMP/t1.sltrace" "$TMP/th.json" <<'PY'
import json, struct, sys
def load(path):
    b = open(path, "rb").read()
    assert b[:8] == b"SLTRACE1"
    nl, ne, k, res = struct.unpack_from("<IIII", b, 8)
    at, rows, steps = 24, {}, set()
    while at < len(b):
        step, layer, kind, n = struct.unpack_from("<IHBB", b, at)
        ids = struct.unpack_from("<%dH" % n, b, at + 8)
        assert kind == 0 and n == k and all(e < ne for e in ids)
        rows.setdefault(layer, []).append(ids)
        steps.add(step)
        at += 8 + 2 * n
    return rows, len(steps)
chunked, n_chunked = load(sys.argv[1])
single, n_single = load(sys.argv[2])
tokens = len(single[min(single)])
assert chunked == single, "picks differ between chunked and token-by-token prefill"
assert all(len(v) == tokens for v in chunked.values()) and n_single == tokens and n_chunked < tokens
hist = {l["layer"]: l["counts"] for l in json.load(open(sys.argv[3]))["layers"]}
for l, v in chunked.items():
    counts = [0] * len(hist[l])
    for ids in v:
        for e in ids:
            counts[e] += 1
    assert counts == hist[l], (l, counts, hist[l])
PY
then
    ok "--router-trace: a record a token and MoE layer, chunked = token by token = --router-hist"
else
    bad "--router-trace $(cat "$TMP/err")"
fi
engine=$(grep -o "hits [0-9]* ([0-9.]*%)" "$TMP/err" | head -n 1 | grep -o "[0-9.]*%")
oracle=$(grep "optimal (Belady)" "$TMP/err" | grep -o "[0-9.]*%")
"$BIN" trace-replay "$TMP/t.sltrace" --cache-experts 2 --policy decay >"$TMP/tr" 2>&1
row=$(grep " decay " "$TMP/tr")
if [ -n "$engine" ] && [ -n "$oracle" ] && [ "$(echo "$row" | awk '{print $3}')" = "$engine" ] &&
    [ "$(echo "$row" | awk '{print $6}')" = "$oracle" ]; then
    ok "trace-replay: the run's hit rate ($engine) and --stats's optimum ($oracle)"
else
    bad "trace-replay: engine '$engine' oracle '$oracle', replay: $(cat "$TMP/tr")"
fi
if "$BIN" trace-replay "$TMP/t1.sltrace" >"$TMP/tr" 2>&1 && [ "$(grep -c " lfu \| lru \| decay " "$TMP/tr")" -eq 9 ] &&
    "$BIN" trace-replay --help | grep -q -- "--prefetch"; then
    ok "trace-replay: every policy at 10/25/50% of the experts; --help"
else
    bad "trace-replay default table: $(cat "$TMP/tr")"
fi
# Pre-gating's predictions go into the trace too (kind 1): replayed, the recall --stats gives.
if "$BIN" generate "$TMP/p8" --ids "$ids" -n 12 --experts stream --cache-experts 3 --prefetch 2 \
    --stats --router-trace "$TMP/tp.sltrace" >/dev/null 2>"$TMP/err" &&
    "$BIN" trace-replay "$TMP/tp.sltrace" --cache-experts 3 --policy decay --prefetch >"$TMP/tr" 2>&1; then
    want=$(grep "pre-gating" "$TMP/err" | grep -o "recall [0-9.]*%" | grep -o "[0-9.]*%")
    got=$(grep " decay " "$TMP/tr" | awk '{print $12}')
    if [ -n "$want" ] && [ "$got" = "$want" ]; then
        ok "--router-trace with --prefetch: predictions replayed at the run's recall ($want)"
    else
        bad "--router-trace predictions: recall '$got', want '$want': $(cat "$TMP/tr")"
    fi
else
    bad "--router-trace --prefetch: $(cat "$TMP/err" "$TMP/tr")"
fi
# The default policy earns its place on a trained model's routing (tests/fixtures/trace): at 10,
# 25 and 50% of the experts, decay above LRU above LFU, and the optimum above all.
if xz -dc "$FIX/trace/e128.sltrace.xz" >"$TMP/e128.sltrace" &&
    "$BIN" trace-replay "$TMP/e128.sltrace" >"$TMP/tr" 2>&1 &&
    awk '$2 ~ /^(lfu|lru|decay)$/ { h[$2] = $3 + 0; b = $6 + 0 }
         $2 == "decay" { n++; if (!(h["decay"] > h["lru"] && h["lru"] > h["lfu"] && b > h["decay"])) bad = 1 }
         END { exit !(n == 3 && !bad) }' "$TMP/tr"; then
    ok "trace-replay on a trained model's trace: decay > lru > lfu, Belady above"
else
    bad "trace-replay e128: $(cat "$TMP/tr")"
fi
head -c 30 "$TMP/t.sltrace" >"$TMP/cut.sltrace"
expect_fail "trace-replay: a cut record" "cut.sltrace: truncated record at byte 24" \
    "$BIN" trace-replay "$TMP/cut.sltrace"
expect_fail "--router-trace: unwritable" "cannot create the routing trace" \
    "$BIN" generate "$TMP/p8" --ids 1 -n 1 --router-trace /nonexistent/dir/t.sltrace
# --route-replay of a run's own trace is that run, bit for bit (the trace's picks are the routers'),
# and pre-gating reads ahead without changing a bit, from the routers or from the trace.
if "$BIN" generate "$TMP/p8" --ids "$ids" -n 8 --experts stream --cache-experts 2 \
    --route-replay "$TMP/t.sltrace" >"$TMP/tr1" 2>"$TMP/err" && cmp -s "$TMP/tg" "$TMP/tr1" &&
    "$BIN" generate "$TMP/p8" --ids "$ids" -n 8 --experts stream --cache-experts 2 --prefetch 2 \
        --stats >"$TMP/tr2" 2>"$TMP/err2" && cmp -s "$TMP/tg" "$TMP/tr2" &&
    grep -q "pre-gating .* recall" "$TMP/err2" &&
    "$BIN" generate "$TMP/p8" --ids "$ids" -n 8 --experts stream --cache-experts 2 --prefetch 2 \
        --route-replay "$TMP/t.sltrace" >"$TMP/tr3" 2>/dev/null && cmp -s "$TMP/tg" "$TMP/tr3"; then
    ok "--route-replay of the run's own trace, and --prefetch: the same ids"
else
    bad "--route-replay / --prefetch: $(cat "$TMP/err" "$TMP/err2")"
fi
xz -dc tests/fixtures/trace/e128.sltrace.xz >"$TMP/e128.sltrace"
expect_fail "--route-replay: another model's trace" "a trace of 128 experts, 8 a token" \
    "$BIN" generate "$TMP/p8" --ids 1 -n 1 --route-replay "$TMP/e128.sltrace"
"$BIN" pack "$M" "$TMP/pb" --quant bf16 2>/dev/null
got=$("$BIN" generate "$TMP/pb" --ids "$ids" -n 12 --experts stream --cache-experts 2 2>/dev/null | tail -n 1)
if [ "$got" = "$greedy" ]; then ok "bf16 pack streams the reference greedy ids"; else bad "bf16 pack greedy: $got"; fi
got=$("$BIN" generate "$TMP/pb" --ids "$ids" -n 12 --batch 1 --experts stream --cache-experts 3 2>/dev/null | tail -n 1)
if [ "$got" = "$greedy" ]; then ok "--batch 1 (prompt through the decode path)"; else bad "--batch 1: $got"; fi
# io_uring where built in (the default with --direct-io), the same ids; the engine and
# --cache-mem auto's budget said
if "$BIN" generate "$TMP/p8" --ids "$ids" -n 6 --experts stream --cache-experts 2 --io-engine uring \
    -v >"$TMP/g1" 2>"$TMP/err"; then
    if cmp -s "$TMP/g1" "$TMP/g2" && grep -q "expert reads: io_uring" "$TMP/err"; then
        ok "--io-engine uring"
    else
        bad "--io-engine uring: $(cat "$TMP/err")"
    fi
elif grep -q "no io_uring" "$TMP/err"; then
    ok "--io-engine uring: refused by a build without liburing"
else
    bad "--io-engine uring: $(cat "$TMP/err")"
fi
if "$BIN" generate "$TMP/p8" --ids "$ids" -n 2 --experts stream --cache-mem auto 2>&1 >/dev/null |
    grep -q "cache-mem auto: [0-9.]* GiB of [0-9.]* GiB available -> [0-9]* slots a layer"; then
    ok "--cache-mem auto says its budget"
else
    bad "--cache-mem auto"
fi
expect_fail "io-engine bad" "invalid --io-engine" "$BIN" generate "$TMP/p8" --ids 1 --experts stream --io-engine aio
expect_fail "pack bad quant" "invalid --quant" "$BIN" pack "$M" "$TMP/x" --quant int3
expect_fail "pack missing out" "SRC and OUT" "$BIN" pack "$M"
expect_fail "pack a pack" "already packed" "$BIN" pack "$TMP/p8" "$TMP/x"
expect_fail "cache too small" "smaller than" "$BIN" generate "$TMP/p8" --ids 1 --experts stream --cache-experts 1
# A budget below top-k experts per layer: the smallest --cache-mem that works, in the units
# --cache-mem takes, and that value works.
expect_fail "cache-mem too small: the least that works" "--cache-mem must be at least [0-9.]*[KMG] (top-k 2 experts x [0-9]* layers x" \
    "$BIN" generate "$TMP/p8" --ids 1 --experts stream --cache-mem 1K
least=$(grep -o "at least [0-9.]*[KMG]" "$TMP/err" | cut -d' ' -f3)
if [ -n "$least" ] && "$BIN" generate "$TMP/p8" --ids 1 -n 2 --experts stream --cache-mem "$least" >/dev/null 2>&1; then
    ok "--cache-mem $least (the value the error gave) works"
else
    bad "--cache-mem '$least' from the error"
fi
# Options that do nothing here warn and go on.
if "$BIN" generate "$TMP/p8" --ids "$ids" -n 6 --cache-policy lru --io-threads 2 --gpu-experts 2 \
    --cuda-no-tensor-cores --backend cpu >"$TMP/g1" 2>"$TMP/err" &&
    cmp -s "$TMP/g1" "$TMP/g2" && grep -q "warning: --cache-policy does nothing without --experts stream" "$TMP/err" &&
    grep -q "warning: --io-threads does nothing without --experts stream" "$TMP/err" &&
    grep -q "warning: --gpu-experts does nothing on the CPU backend" "$TMP/err" &&
    grep -q "warning: --cuda-no-tensor-cores does nothing on the CPU backend" "$TMP/err"; then
    ok "stream-only and CUDA-only options warn without stream / CUDA"
else
    bad "options that do nothing: $(cat "$TMP/err")"
fi
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
if "$PY" tools/make_synth.py "$TMP/tq" --preset tiny-qwen-vocab 2>/dev/null; then
    cp tests/tokenizer/qwen3/tokenizer.json "$TMP/tq/"
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --chat-template chatml >"$TMP/r1" 2>"$TMP/err"
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --chat-template chatml >"$TMP/r2" 2>/dev/null
    if [ -s "$TMP/r1" ] && cmp -s "$TMP/r1" "$TMP/r2" && grep -q "decode 12 tok" "$TMP/err"; then
        ok "run: greedy is reproducible, stats line"
    else
        bad "run greedy $(cat "$TMP/err")"
    fi
    # A raw prompt starts with the BOS the tokenizer adds (tokenizer_config.json's add_bos_token
    # here; Qwen's adds none), once; a chat template writes its own.
    mkdir -p "$TMP/tqb" && ln -sf "$TMP"/tq/* "$TMP/tqb/" &&
        echo '{"add_bos_token": true, "bos_token": "<|endoftext|>"}' >"$TMP/tqb/tokenizer_config.json"
    ptok() { "$BIN" run "$@" -n 1 2>&1 >/dev/null | grep -o 'prompt [0-9]* tok'; }
    if [ "$(ptok "$TMP/tq" --raw -p Hello)" = "prompt 1 tok" ] &&
        [ "$(ptok "$TMP/tqb" --raw -p Hello)" = "prompt 2 tok" ] &&
        [ "$(ptok "$TMP/tqb" --raw -p '<|endoftext|>Hello')" = "prompt 2 tok" ] &&
        [ "$(ptok "$TMP/tqb" -p Hello --chat-template chatml)" = "$(ptok "$TMP/tq" -p Hello --chat-template chatml)" ]; then
        ok "run --raw: the tokenizer's BOS first (add_bos_token), once; none added to a template"
    else
        bad "raw prompt BOS"
    fi
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 1.5 --top-k 50 --seed 7 >"$TMP/s1" 2>/dev/null
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 1.5 --top-k 50 --seed 7 >"$TMP/s2" 2>/dev/null
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 1.5 --top-k 50 --seed 8 >"$TMP/s3" 2>/dev/null
    if cmp -s "$TMP/s1" "$TMP/s2" && ! cmp -s "$TMP/s1" "$TMP/s3"; then ok "run: same seed, same text"; else bad "run seeds"; fi
    # -n N is N new tokens in run and generate alike (the first from the prompt's logits), and
    # the statistics line counts them all.
    if "$BIN" generate "$TMP/tq" --ids 9707,11 -n 12 2>&1 >/dev/null | grep -q "decode 12 tok"; then
        ok "generate -n 12 and run -n 12 both say decode 12 tok"
    else
        bad "generate -n 12 decode count"
    fi
    # No --seed: a random seed, which -v and --stats show and which repeats the run.
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 0.8 -v >"$TMP/s4" 2>"$TMP/err"
    seed=$(grep -o "^seed [0-9]*" "$TMP/err" | cut -d' ' -f2)
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 0.8 -s "$seed" >"$TMP/s5" 2>/dev/null
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --temp 0.8 --stats >"$TMP/s6" 2>"$TMP/err6"
    if [ -n "$seed" ] && cmp -s "$TMP/s4" "$TMP/s5" && ! cmp -s "$TMP/s4" "$TMP/s6" &&
        grep -q "^seed [0-9]* (--seed" "$TMP/err6" && grep -q "qwen3_moe, .* layers" "$TMP/err"; then
        ok "run: random default seed, shown by -v and --stats, repeats the run with -s"
    else
        bad "run default seed '$seed' $(cat "$TMP/err")"
    fi
    # --repeat-last-n 0: the penalties see nothing (greedy as without them)
    if "$BIN" run "$TMP/tq" -p "Hello" -n 12 --chat-template chatml --repeat-penalty 5 \
        --repeat-last-n 0 2>/dev/null | cmp -s - "$TMP/r1" &&
        "$BIN" run "$TMP/tq" -p "Hello" -n 4 --repeat-penalty 1.3 --repeat-last-n -1 >/dev/null 2>&1; then
        ok "run --repeat-last-n 0 and -1"
    else
        bad "run --repeat-last-n"
    fi
    if "$BIN" run "$TMP/tq" --raw -p "Hello" -n 1 --system "Be brief." 2>&1 >/dev/null |
        grep -q "warning: --system does nothing with a raw prompt"; then
        ok "run: --system with a raw prompt warns"
    else
        bad "run --system with --raw"
    fi
    # A reply reaching the end of the context stops there with a notice, exit 0.
    if "$BIN" run "$TMP/tq" -p "Hello" -n 100 --ctx 24 --ignore-eos --chat-template chatml >"$TMP/r5" 2>"$TMP/err" &&
        grep -q "reached the end of the context (24 tokens)" "$TMP/err" && [ -s "$TMP/r5" ]; then
        ok "run: stops at the end of the context with a notice"
    else
        bad "run at the end of the context: $(cat "$TMP/err")"
    fi
    stop=$(head -c 3 "$TMP/r1" | tail -c 2)
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --chat-template chatml --stop "$stop" >"$TMP/r3" 2>/dev/null
    if [ "$(wc -c <"$TMP/r3")" -lt "$(wc -c <"$TMP/r1")" ] && ! grep -qF -- "$stop" "$TMP/r3"; then
        ok "run: --stop ends the reply before the stop string"
    else
        bad "run --stop '$stop': $(cat "$TMP/r3")"
    fi
    # --logit-bias: +100 forces a token (785, "The", every time); a bias given again replaces
    # the first (0: the greedy reply of no bias)
    "$BIN" run "$TMP/tq" -p "Hello" -n 3 --chat-template chatml --logit-bias 785=100 >"$TMP/b1" 2>/dev/null
    if [ "$(cat "$TMP/b1")" = "TheTheThe" ]; then ok "run: --logit-bias ID=100 forces the token"; else bad "--logit-bias 785=100: $(cat "$TMP/b1")"; fi
    "$BIN" run "$TMP/tq" -p "Hello" -n 12 --chat-template chatml --logit-bias 785=100 --logit-bias 785=0 >"$TMP/b2" 2>/dev/null
    if cmp -s "$TMP/r1" "$TMP/b2"; then ok "run: a later --logit-bias of the same id replaces it"; else bad "--logit-bias 785=0 after 100: $(cat "$TMP/b2")"; fi
    expect_fail "run --logit-bias without a bias" "invalid --logit-bias '5' (expected ID=BIAS" "$BIN" run "$TMP/tq" -p x --logit-bias 5
    expect_fail "run --logit-bias out of range" "invalid --logit-bias '5=101'" "$BIN" run "$TMP/tq" -p x --logit-bias 5=101
    expect_fail "run --logit-bias not a number" "invalid --logit-bias '5=x'" "$BIN" run "$TMP/tq" -p x --logit-bias 5=x
    expect_fail "run --logit-bias past the vocabulary" "the vocabulary has 151936 ids" "$BIN" run "$TMP/tq" -p x --logit-bias 151936=1
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
    # A conversation longer than the context goes on without its oldest turns (said once);
    # a message that cannot fit even alone is refused and the chat goes on; at the end --stats
    # and --router-hist as in run.
    long=$(printf 'river %.0s' $(seq 80))
    printf 'Hi\nHello there\n%s\nHow are you\nWhat now\n' "$long" |
        "$BIN" chat "$TMP/tq" --ctx 48 -n 20 --ignore-eos --chat-template chatml --system "Be brief." \
            --stats --router-hist "$TMP/ch.json" >"$TMP/c4" 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c "oldest turns are dropped" "$TMP/err")" -eq 1 ] &&
        grep -q "not sent" "$TMP/err" && grep -q "decode 80 tok" "$TMP/err" &&
        grep -q "^--- sluice statistics ---" "$TMP/err" &&
        "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert sum(map(sum,(l["counts"] for l in d["layers"]))) > 0' "$TMP/ch.json"; then
        ok "chat past the context: oldest turns dropped, too long refused, --stats --router-hist"
    else
        bad "chat past the context (rc $rc): $(cat "$TMP/err")"
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
    # Ctrl-C stops a long reply and returns to the prompt, which still works. It is sent once
    # the reply is under way (the banner, then some of the reply's text, seen in the output),
    # not after a fixed time: a loaded machine may still be loading the model then.
    if command -v script >/dev/null; then
        : >"$TMP/c3"
        (printf 'Hi\n'
            for _ in $(seq 500); do grep -q "sluice chat:" "$TMP/c3" && break; sleep 0.1; done
            at=$(wc -c <"$TMP/c3")
            for _ in $(seq 300); do [ "$(wc -c <"$TMP/c3")" -gt $((at + 40)) ] && break; sleep 0.1; done
            printf '\003'; sleep 1; printf '/exit\n') |
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
    expect_fail "run no tokenizer" "no tokenizer.json: pass --tokenizer PATH" "$BIN" run "$M" -p x
    expect_fail "chat no tokenizer" "no tokenizer.json: pass --tokenizer PATH" "$BIN" chat "$M" </dev/null
    expect_fail "run bad template" "unknown chat template" "$BIN" run "$TMP/tq" -p x --chat-template llama
else
    bad "could not make the tiny model (python3-numpy missing?)"
fi
# tokenize: the contract checked against Hugging Face tokenizers' ids.
if "$BIN" tokenize tests/tokenizer/qwen3/tokenizer.json --jsonl tests/tokenizer/corpus.jsonl >"$TMP/ids" 2>"$TMP/err" &&
    "$PY" - "$TMP/ids" tests/tokenizer/qwen3_ids.jsonl <<'PY'; then
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

# ---- issue 23 (part 4): pack's output directory, what a MODEL path is, inspect's units,
# detokenize and tokenize --pieces.
cp -r "$M" "$TMP/ck" # a copy: nothing may ever be written into tests/fixtures
expect_fail "pack OUT = SRC" "is the checkpoint being packed" "$BIN" pack "$TMP/ck" "$TMP/ck/."
expect_fail "pack --force OUT = SRC" "is the checkpoint being packed" "$BIN" pack "$TMP/ck" "$TMP/ck" --force
if [ ! -e "$TMP/ck/core.bin" ] && [ ! -e "$TMP/ck/manifest.json" ]; then ok "pack OUT = SRC writes nothing"; else bad "pack wrote into SRC"; fi
expect_fail "pack OUT inside SRC" "inside the checkpoint" "$BIN" pack "$TMP/ck" "$TMP/ck/packed" --force
expect_fail "pack OUT holding SRC" "holds the checkpoint" "$BIN" pack "$TMP/ck" "$TMP" --force
mkdir -p "$TMP/full" && echo x >"$TMP/full/notes.txt"
expect_fail "pack into a non-empty OUT" "is not empty.*--force" "$BIN" pack "$TMP/ck" "$TMP/full"
if "$BIN" pack "$TMP/ck" "$TMP/full" --force 2>/dev/null && "$BIN" verify "$TMP/full" | grep -q OK &&
    "$BIN" pack "$TMP/ck" "$TMP/full" --force --quant int4 2>/dev/null && "$BIN" verify "$TMP/full" | grep -q OK; then
    ok "pack --force writes over a non-empty OUT (twice)"
else
    bad "pack --force"
fi
expect_fail "verify a Hugging Face checkpoint" "is a Hugging Face checkpoint, not a sluice pack: verify checks packs made by 'sluice pack'" \
    "$BIN" verify "$M"
cp -r "$TMP/full" "$TMP/nocore" && rm "$TMP/nocore/core.bin"
expect_fail "verify a pack without core.bin" "nocore: core.bin is missing" "$BIN" verify "$TMP/nocore"
expect_fail "load a pack without core.bin" "nocore: core.bin is missing" "$BIN" generate "$TMP/nocore" --ids 1
F="$TMP/ck/config.json"
W="config.json is a file: MODEL is the directory that holds the model, give $TMP/ck"
expect_fail "inspect: a file as MODEL names its directory" "$W" "$BIN" inspect "$F"
expect_fail "verify: a file as MODEL names its directory" "$W" "$BIN" verify "$F"
expect_fail "generate: a file as MODEL names its directory" "$W" "$BIN" generate "$F" --ids 1
expect_fail "logits: a file as MODEL names its directory" "$W" "$BIN" logits "$F" --ids 1 --out "$TMP/l.f32"
expect_fail "pack: a file as SRC names its directory" "$W" "$BIN" pack "$F" "$TMP/pk"
printf 'GGUF\3\0\0\0' >"$TMP/model-Q4_K_M.gguf"
# A split set (llama-gguf-split --split-max-tensors 12 of the BF16 file): the same bits, mapped
# or streamed, from its first part; a missing part is named.
S="$FIX/gguf/split/qwen3_prefix_sharded-00001-of-00003.gguf"
ids=$(json_field "$FIX/qwen3_prefix_sharded/ref.json" ids)
"$BIN" logits "$FIX/gguf/qwen3_prefix_sharded.bf16.gguf" --ids "$ids" --out "$TMP/whole.f32" 2>/dev/null
if "$BIN" logits "$S" --ids "$ids" --out "$TMP/split.f32" 2>"$TMP/err" && cmp -s "$TMP/whole.f32" "$TMP/split.f32" &&
    "$BIN" logits "$S" --ids "$ids" --out "$TMP/split.f32" --experts stream --cache-experts 4 2>"$TMP/err" &&
    cmp -s "$TMP/whole.f32" "$TMP/split.f32"; then
    ok "gguf: a split set gives the bits of the whole file (mapped and streamed)"
else
    bad "gguf split set: $(cat "$TMP/err")"
fi
mkdir -p "$TMP/split2" && cp "$FIX"/gguf/split/*-0000[12]-of-00003.gguf "$TMP/split2/"
expect_fail "gguf: a split set with a part missing names it" "qwen3_prefix_sharded-00003-of-00003.gguf: " \
    "$BIN" generate "$TMP/split2/qwen3_prefix_sharded-00001-of-00003.gguf" --ids 1
# A GGUF's tokenizer and template come from its metadata (byte tokens here: "hi" is 104, 105).
Q="$FIX/gguf/qwen3_prefix_sharded.bf16.gguf"
printf '"hi"\n' >"$TMP/hi.jsonl"
if [ "$("$BIN" tokenize "$Q" --jsonl "$TMP/hi.jsonl" 2>&1)" = "[104, 105]" ] &&
    "$BIN" run "$Q" --raw -p "hi there" -n 4 --temp 0 >"$TMP/out" 2>"$TMP/err" &&
    "$BIN" inspect "$Q" 2>&1 | grep -q "^tokenizer      from the GGUF metadata, 256 ids" &&
    "$BIN" inspect "$Q" 2>&1 | grep -q "^chat template  ChatML"; then
    ok "gguf: tokenizer and chat template from the metadata (tokenize, run, inspect)"
else
    bad "gguf tokenizer: $(cat "$TMP/err")"
fi
# Every quantised type against llama.cpp on the same file (tests/fixtures/gguf_quant: llama.cpp
# quantised it and ran it): logits within 2e-2 (relative L2; llama.cpp rounds activations
# differently), and its greedy continuation wherever sluice's top-2 gap allows.
QD="$FIX/gguf_quant"
qids=$(json_field "$QD/prompt.json" ids)
for f in "$QD"/*.gguf; do
    t=$(basename "$f" .gguf)
    g=$(cat "$QD/$t.greedy.txt")
    if "$BIN" logits "$f" --ids "$qids" --out "$TMP/qp.f32" 2>"$TMP/err" &&
        "$BIN" logits "$f" --ids "$qids,$g" --out "$TMP/qf.f32" 2>>"$TMP/err" &&
        "$PY" tests/gguf_quant_check.py 288 2e-2 "$TMP/qp.f32" "$QD/$t.logits.f32" "$TMP/qf.f32" \
            "$QD/$t.greedy.txt" >"$TMP/qc" 2>&1; then
        ok "gguf $t against llama.cpp: $(cat "$TMP/qc")"
    else
        bad "gguf $t against llama.cpp: $(cat "$TMP/qc" "$TMP/err")"
    fi
    # its experts streamed through the smallest cache: the mapped bits
    "$BIN" logits "$f" --ids "$qids" --out "$TMP/qs.f32" --experts stream --cache-experts 2 --batch 7 \
        2>/dev/null && cmp -s "$TMP/qp.f32" "$TMP/qs.f32" || bad "gguf $t streamed: other bits"
    pack_keeps "$t" "$f" "$qids" "$TMP/qp.f32" 2
done
# Types mixed across layers and within an expert (tests/fixtures/gguf_mixed): the default backend
# against the CPU's (within 1e-2: the CPU rounds Q4_0/Q8_0 activations to int8, CUDA does not),
# and streamed experts against mapped ones, bitwise.
M3="$FIX/gguf_mixed/qwen3_mixed.gguf"
if "$BIN" logits "$M3" --ids "$qids" --out "$TMP/m1.f32" 2>"$TMP/err" &&
    "$BIN" logits "$M3" --ids "$qids" --out "$TMP/m2.f32" --backend cpu 2>>"$TMP/err" &&
    "$BIN" logits "$M3" --ids "$qids" --out "$TMP/m3.f32" --experts stream --cache-experts 4 2>>"$TMP/err" &&
    cmp -s "$TMP/m1.f32" "$TMP/m3.f32" && logits_close mixed "$TMP/m1.f32" "$TMP/m2.f32" 1e-2; then
    ok "gguf: types mixed across layers (default backend = CPU, streamed = mapped)"
else
    bad "gguf mixed types: $(cat "$TMP/err")"
fi
pack_keeps "qwen3_mixed" "$M3" "$qids" "$TMP/m1.f32" 4
# A GGUF's pack: quantised weights are never quantised again; F32 ones quantise as the checkpoint
# they were converted from does (the same int8 pack, bit for bit); the tokenizer, template and
# eos ids travel into the pack's files; a flipped byte fails verify, naming layer and expert.
expect_fail "pack --quant on a quantised GGUF is refused" \
    "q4_k.gguf: the weights are already quantised (tensor '.*' is Q4_K).*drop --quant int4" \
    "$BIN" pack "$QD/q4_k.gguf" "$TMP/pq" --quant int4
[ -e "$TMP/pq" ] && bad "refused pack left $TMP/pq"
ids=$(json_field "$FIX/qwen3_prefix_sharded/ref.json" ids)
if "$BIN" pack "$FIX/gguf/qwen3_prefix_sharded.f32.gguf" "$TMP/pg8" --quant int8 2>"$TMP/err" &&
    "$BIN" pack "$FIX/qwen3_prefix_sharded" "$TMP/ph8" --quant int8 2>>"$TMP/err" &&
    "$BIN" logits "$TMP/pg8" --ids "$ids" --out "$TMP/g8.f32" 2>>"$TMP/err" &&
    "$BIN" logits "$TMP/ph8" --ids "$ids" --out "$TMP/h8.f32" 2>>"$TMP/err" && cmp -s "$TMP/g8.f32" "$TMP/h8.f32"; then
    ok "pack --quant int8 of an F32 GGUF: the checkpoint's int8 pack, bit for bit"
else
    bad "pack --quant int8 of an F32 GGUF: $(cat "$TMP/err")"
fi
printf '"hi there, <|im_start|>user 42"\n' >"$TMP/tk.jsonl"
"$PY" tests/gguf_mutate.py "$Q" "$TMP/eos.gguf" eos
"$BIN" pack "$TMP/eos.gguf" "$TMP/pgt" 2>/dev/null
if [ "$("$BIN" tokenize "$TMP/pgt" --jsonl "$TMP/tk.jsonl" 2>&1)" = "$("$BIN" tokenize "$Q" --jsonl "$TMP/tk.jsonl" 2>&1)" ] &&
    "$BIN" inspect "$TMP/pgt" 2>&1 | grep -q "^tokenizer      tokenizer.json, 256 ids" &&
    "$BIN" inspect "$TMP/pgt" 2>&1 | grep -q "^chat template  ChatML" &&
    "$BIN" inspect "$TMP/pgt" 2>&1 | grep -q "^end of turn    7$" &&
    "$PY" -c 'import json,sys; assert json.load(open(sys.argv[1]))["temperature"] == 0.625' "$TMP/pgt/generation_config.json"; then
    ok "pack of a GGUF: its tokenizer, chat template and end of turn in the pack's files"
else
    bad "pack of a GGUF: tokenizer, template or eos differ"
fi
"$BIN" pack "$QD/q6_k.gguf" "$TMP/pgd" 2>/dev/null
"$PY" - "$TMP/pgd/experts-000.bin" <<'PY'
import sys
f = open(sys.argv[1], "r+b")
f.seek(4096 + 5000)
b = f.read(1)
f.seek(4096 + 5000)
f.write(bytes([b[0] ^ 0x40]))
PY
expect_fail "verify a damaged GGUF pack names layer and expert" \
    "experts-000.bin: SHA-256 mismatch.*layer 0, expert 0: checksum mismatch" "$BIN" verify "$TMP/pgd"
G="$FIX/gguf/qwen3_prefix_sharded.f32.gguf"
for w in embd experts arch type cut; do "$PY" tests/gguf_mutate.py "$G" "$TMP/bad-$w.gguf" $w; done
expect_fail "gguf: metadata that disagrees with a tensor names file and tensor" \
    "bad-embd.gguf: tensor 'token_embd.weight': expected shape \\[400, 48\\], got \\[400, 64\\]" "$BIN" generate "$TMP/bad-embd.gguf" --ids 1
expect_fail "gguf: an expert count the router disagrees with" \
    "bad-experts.gguf: tensor 'blk.0.ffn_gate_inp.weight': expected shape \\[17, 64\\]" "$BIN" logits "$TMP/bad-experts.gguf" --ids 1 --out "$TMP/x.f32"
expect_fail "gguf: an architecture sluice does not run" \
    "bad-arch.gguf: architecture 'llama99x' is not one sluice runs from GGUF (it runs: qwen2moe" "$BIN" inspect "$TMP/bad-arch.gguf"
expect_fail "gguf: an unknown tensor type" \
    "bad-type.gguf: tensor 'blk.0.attn_q.weight': unknown or unsupported ggml type 99" "$BIN" generate "$TMP/bad-type.gguf" --ids 1
expect_fail "gguf: a truncated file names the tensor cut" \
    "bad-cut.gguf: tensor 'blk.1.attn_v.weight': F32 bytes .* run past the end of the data section" "$BIN" generate "$TMP/bad-cut.gguf" --ids 1 --experts stream
expect_fail "inspect a truncated .gguf file" "model-Q4_K_M.gguf: 8 bytes, too short for a GGUF file" \
    "$BIN" inspect "$TMP/model-Q4_K_M.gguf"
mkdir -p "$TMP/gguf" && cp "$TMP/model-Q4_K_M.gguf" "$TMP/gguf/"
expect_fail "generate on a directory of .gguf files" "holds only GGUF files: give the GGUF file itself .*model-Q4_K_M.gguf" "$BIN" generate "$TMP/gguf" --ids 1
expect_fail "pack a directory of .gguf files" "holds only GGUF files" "$BIN" pack "$TMP/gguf" "$TMP/pg"
# run, chat and serve read the tokenizer before the model: the same one line first
expect_fail "run on a truncated .gguf file" "model-Q4_K_M.gguf: 8 bytes, too short for a GGUF file" "$BIN" run "$TMP/model-Q4_K_M.gguf" -p hi
expect_fail "chat on a directory of .gguf files" "holds only GGUF files" "$BIN" chat "$TMP/gguf" </dev/null
expect_fail "serve on a model's file" "is a file: MODEL is the directory that holds the model" \
    "$BIN" serve "$FIX/qwen2_odd/config.json" --port 0
expect_fail "pack with -ngl" "unknown option '-ngl'" "$BIN" pack a b -ngl 99
# perplexity: a base run's predictions saved, then the same model against them (KL 0, every
# top-1 the same), and a base of another --ctx-size refused.
D="$FIX/demo_kjv"
for i in 1 2 3 4 5 6; do
    echo "In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep."
done >"$TMP/text.txt"
if "$BIN" perplexity "$D" -f "$TMP/text.txt" -c 64 --chunks 2 --kl-base "$TMP/base.kl" >"$TMP/p1" 2>/dev/null &&
    grep -q "^perplexity  *[0-9.]* +/- [0-9.]* (62 tokens scored in 2 chunks of 64)" "$TMP/p1" &&
    "$BIN" perplexity "$D" -f "$TMP/text.txt" -c 64 --chunks 2 --kl-base "$TMP/base.kl" --kl --experts mapped >"$TMP/p2" 2>/dev/null &&
    grep -q "^KL divergence  0.000000 " "$TMP/p2" && grep -q "^same top-1     100.000%" "$TMP/p2"; then
    ok "perplexity: a base run saved, the same model against it has KL 0"
else
    bad "perplexity: $(cat "$TMP/p1" "$TMP/p2" 2>&1 | head -c 600)"
fi
expect_fail "perplexity: a base of another --ctx-size" "base.kl is not a base run of this text" \
    "$BIN" perplexity "$D" -f "$TMP/text.txt" -c 32 --chunks 2 --kl-base "$TMP/base.kl" --kl
expect_fail "perplexity: --kl without --kl-base" "--kl needs --kl-base FILE" "$BIN" perplexity "$D" -f "$TMP/text.txt" --kl
expect_fail "perplexity: a text shorter than a chunk" "fewer than one chunk of 400" "$BIN" perplexity "$D" -f "$TMP/text.txt" -c 400
if "$BIN" inspect models/kjv-moe >"$TMP/out" 2>&1 && ! grep -q " 0\.00 " "$TMP/out" &&
    grep -q "resident core [0-9.]* MB; one expert [0-9.]* KB; all experts [0-9.]* MB" "$TMP/out" &&
    grep -q "per token *at most [0-9.]* MB read" "$TMP/out"; then
    ok "inspect: sizes in a unit that fits (no 0.00 GB)"
else
    bad "inspect units: $(cat "$TMP/out")"
fi
TOK=tests/tokenizer/qwen3/tokenizer.json
if [ "$("$BIN" detokenize "$TOK" --ids 9707,11,220,99489)" = "Hello, 世界" ] &&
    [ "$("$BIN" detokenize tests/tokenizer/qwen3 --ids 9707,11)" = "Hello," ]; then
    ok "detokenize --ids (a tokenizer.json or a model directory)"
else
    bad "detokenize --ids: $("$BIN" detokenize "$TOK" --ids 9707,11,220,99489 2>&1)"
fi
# tokenize --jsonl | detokenize --jsonl - gives the corpus back; comma-separated lines too.
"$BIN" tokenize "$TOK" --jsonl tests/tokenizer/corpus.jsonl >"$TMP/ids" 2>/dev/null
"$BIN" detokenize "$TOK" --jsonl - <"$TMP/ids" >"$TMP/back" 2>"$TMP/err"
tr -d '[] ' <"$TMP/ids" | "$BIN" detokenize "$TOK" --jsonl - >"$TMP/back2" 2>>"$TMP/err"
if "$PY" - "$TMP/back" tests/tokenizer/corpus.jsonl "$TMP/back2" <<'PY'; then
import json, sys, unicodedata
a, b, c = ([json.loads(l) for l in open(f, encoding="utf-8")] for f in sys.argv[1:4])
b = [unicodedata.normalize("NFC", t) for t in b]  # the Qwen3 tokenizer normalises to NFC
sys.exit(0 if a == b == c and len(a) > 10 else 1)
PY
    ok "detokenize --jsonl: the inverse of tokenize --jsonl (JSON arrays and comma-separated lines)"
else
    bad "detokenize round trip $(head -c 300 "$TMP/err")"
fi
expect_fail "detokenize an id outside the vocabulary" "--ids: tokenizer: token id 999999 is not in the vocabulary (size 151669)" \
    "$BIN" detokenize "$TOK" --ids 5,999999
printf '[1, 2]\n[3, 999999]\n' >"$TMP/bad.jsonl"
expect_fail "detokenize --jsonl: an id outside the vocabulary, with file and line" "bad.jsonl:2: tokenizer: token id 999999 is not in the vocabulary" \
    "$BIN" detokenize "$TOK" --jsonl "$TMP/bad.jsonl"
expect_fail "detokenize --jsonl: not ids" "-:1: expected a JSON array of token ids or comma-separated ids" \
    sh -c "echo 'hello world' | '$BIN' detokenize '$TOK' --jsonl -"
expect_fail "detokenize --jsonl: not an id" "-:1: item 2 is not a token id" sh -c "echo '[1, -2]' | '$BIN' detokenize '$TOK' --jsonl -"
expect_fail "detokenize without ids" "one of --ids 1,2,3 or --jsonl FILE" "$BIN" detokenize "$TOK"
expect_fail "detokenize bad --ids" "invalid --ids" "$BIN" detokenize "$TOK" --ids 1,x
# tokenize --pieces: the ids of plain tokenize, and pieces that join into the decoded text
# (a character split over several ids goes with the last of them).
"$BIN" tokenize "$TOK" --jsonl tests/tokenizer/corpus.jsonl --pieces >"$TMP/pieces" 2>"$TMP/err"
if "$PY" - "$TMP/pieces" "$TMP/ids" "$TMP/back" <<'PY'; then
import json, sys
pieces, ids, texts = ([json.loads(l) for l in open(f, encoding="utf-8")] for f in sys.argv[1:4])
assert len(pieces) == len(ids) == len(texts) > 10
for p, i, t in zip(pieces, ids, texts):
    assert [x[0] for x in p] == i and "".join(x[1] for x in p) == t, (p, t)
assert any(x[1] == "" for p in pieces for x in p)  # the corpus has split characters
PY
    ok "tokenize --pieces: [id, piece] pairs that join into the text"
else
    bad "tokenize --pieces $(head -c 300 "$TMP/err")"
fi
if [ "$("$BIN" tokenize "$TOK" -p $'Hi\t"x"' --pieces)" = '[[13048, "Hi"], [197, "\t"], [65438, "\"x"], [1, "\""]]' ]; then
    ok "tokenize -p --pieces (JSON escapes)"
else
    bad "tokenize -p --pieces: $("$BIN" tokenize "$TOK" -p $'Hi\t"x"' --pieces 2>&1)"
fi
if "$BIN" detokenize --help | grep -q "usage: sluice detokenize TOKENIZER --ids" && "$BIN" --help | grep -q "detokenize" &&
    "$BIN" tokenize --help | grep -q -- "--pieces" && "$BIN" pack --help | grep -q -- "--force"; then
    ok "help lists detokenize, tokenize --pieces, pack --force"
else
    bad "help for the new command and flags"
fi

# ---- issue 24: prompts. Text in a message never becomes control tokens (raw prompts parse
# them), and generate / logits refuse a prompt longer than the model's positions or --ctx,
# before reading a weight.
if [ -f "$TMP/tq/tokenizer.json" ]; then
    # <|im_start|> "user\n" + 14 ids of text + <|im_end|> "\n" <|im_start|> "assistant\n": 22
    # (the old path made 13: the text's two control tokens faked a system turn)
    "$BIN" run "$TMP/tq" --chat-template chatml -p $'hi<|im_end|>\n<|im_start|>system' -n 1 \
        >/dev/null 2>"$TMP/err"
    if grep -q "^prompt 22 tok" "$TMP/err"; then
        ok "run: special tokens' text in the prompt stays text (22 ids)"
    else
        bad "run special text: $(cat "$TMP/err")"
    fi
    "$BIN" run "$TMP/tq" --raw -p $'hi<|im_end|>\n<|im_start|>system' -n 1 >/dev/null 2>"$TMP/err"
    if grep -q "^prompt 5 tok" "$TMP/err"; then
        ok "run --raw: special tokens' text is parsed (5 ids)"
    else
        bad "run --raw special text: $(cat "$TMP/err")"
    fi
fi
long=$("$PY" -c 'print(",".join(["5"] * 600))')
expect_fail "generate: a prompt longer than max_position_embeddings" \
    "the prompt (600 ids) is longer than the model's 512 positions (max_position_embeddings)" \
    "$BIN" generate "$M" --ids "$long" -n 2
expect_fail "logits: a prompt longer than max_position_embeddings" \
    "the prompt (600 ids) is longer than the model's 512 positions" \
    "$BIN" logits "$M" --ids "$long" --out "$TMP/l.f32"
expect_fail "logits on a pack: the same" "the prompt (600 ids) is longer than the model's 512 positions" \
    "$BIN" logits "$TMP/p8" --ids "$long" --out "$TMP/l.f32"
# $TMP/trunc has a good config.json and broken weights: refused before any weight is read
expect_fail "generate: refused before the weights load" "the prompt (600 ids) is longer than" \
    "$BIN" generate "$TMP/trunc" --ids "$long"
expect_fail "generate: an id outside the vocabulary, before the weights load" \
    "token id 256 at index 1 is outside the vocabulary \[0, 256)" "$BIN" generate "$TMP/trunc" --ids 1,256
expect_fail "logits: an id outside the vocabulary" "outside the vocabulary \[0, 256)" \
    "$BIN" logits "$M" --ids 1,99999999 --out "$TMP/l.f32"
# the default context stops at the model's positions: 510 + 2 positions, 3 ids (the last not
# run); an explicit --ctx goes past them, with the warning
fill=$("$PY" -c 'print(",".join(["5"] * 510))')
if "$BIN" generate "$M" --ids "$fill" -n 5 >"$TMP/gc" 2>"$TMP/err" &&
    grep -q "context of 512 tokens is full: stopped after 3 of 5" "$TMP/err" &&
    [ "$(tail -n 1 "$TMP/gc" | tr ',' '\n' | wc -l)" -eq 3 ] &&
    "$BIN" generate "$M" --ids "$long" -n 2 --ctx 602 >"$TMP/gc" 2>"$TMP/err" &&
    grep -q "longer than the model's 512 positions" "$TMP/err" &&
    [ "$(tail -n 1 "$TMP/gc" | tr ',' '\n' | wc -l)" -eq 2 ]; then
    ok "generate: the default context ends at max_position_embeddings; --ctx goes past"
else
    bad "generate context at max_position: $(cat "$TMP/err")"
fi

# issue 24: non-finite. A checkpoint whose weights overflow (a norm at the largest bf16; the
# config is valid) gives NaN logits: every command fails with one line naming the position,
# and prints no ids, writes no logits file.
cp -r "$FIX/demo_kjv" "$TMP/nf"
"$PY" - "$TMP/nf/model.safetensors" model.layers.0.post_attention_layernorm.weight <<'PY'
import json, struct, sys
path, name = sys.argv[1], sys.argv[2]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    a, b = json.loads(f.read(n))[name]["data_offsets"]
    f.seek(8 + n + a)
    f.write(b"\x7f\x7f" * ((b - a) // 2))  # BF16 3.39e38
PY
NF="non-finite logits at position"
expect_fail "non-finite: generate prints no ids" "$NF 2 (logit 0 is NaN, and the hidden state too): the layers' outputs overflowed, so the weights or config.json may be corrupt" \
    "$BIN" generate "$TMP/nf" --ids 1,2,3 -n 4
if [ -s "$TMP/out" ]; then bad "non-finite: generate stdout: $(head -c 200 "$TMP/out")"; fi
expect_fail "non-finite: logits" "$NF 0 (logit 0 is NaN" "$BIN" logits "$TMP/nf" --ids 1,2,3 --out "$TMP/nf.f32"
if [ -e "$TMP/nf.f32" ]; then bad "non-finite: logits wrote $TMP/nf.f32"; fi
expect_fail "non-finite: run" "$NF 0 (logit 0 is NaN" "$BIN" run "$TMP/nf" -p "And" -n 4 --raw
# A config.json number that makes the math undefined is refused at load, naming key and range.
cp -r "$M" "$TMP/eps" && sed -i 's/"rms_norm_eps": 1e-06/"rms_norm_eps": -1/' "$TMP/eps/config.json"
expect_fail "non-finite: rms_norm_eps -1 refused" "config.json: 'rms_norm_eps' = -1 is out of range \[1.4013e-45, 3.40282e+38\]" \
    "$BIN" generate "$TMP/eps" --ids 1,2,3 -n 4

# A FIFO in place of tokenizer.json is refused at once (read through sl_read_file), never waited on
mkdir -p "$TMP/fifo" && cp "$FIX/qwen2_odd/config.json" "$TMP/fifo/" && mkfifo "$TMP/fifo/tokenizer.json"
expect_fail "a FIFO as tokenizer.json" "tokenizer.json: not a regular file" timeout 10 "$BIN" tokenize "$TMP/fifo" -p hi

# FP8 checkpoints (Hugging Face's block-wise F8_E4M3 with weight_scale_inv, tests/fixtures/fp8_qwen3
# from tools/make_fp8_fixture.py) against their dequantised float32 twins (tools/fp8_convert.py):
# within 1e-4, the same greedy ids, and in fact the same bits (the CPU kernel's contract).
CONV="$(dirname "$0")/../tools/fp8_convert.py"
F8="$FIX/fp8_qwen3"
check_fp8_twin() {
    local name=$1 fp8=$2 twin=$3 ids=$4
    "$BIN" logits "$fp8" --ids "$ids" --out "$TMP/f8.f32" 2>"$TMP/err" &&
        "$BIN" logits "$twin" --ids "$ids" --out "$TMP/tw.f32" 2>>"$TMP/err" &&
        logits_close "$name" "$TMP/f8.f32" "$TMP/tw.f32" 1e-4 && ok "fp8 $name: logits within 1e-4 of the twin" ||
        bad "fp8 $name: logits $(cat "$TMP/err")"
    # the CPU's contract (CUDA sums FP8 and float32 rows in other orders: within 1e-4 above)
    "$BIN" logits "$fp8" --ids "$ids" --out "$TMP/f8c.f32" --backend cpu 2>/dev/null &&
        "$BIN" logits "$twin" --ids "$ids" --out "$TMP/twc.f32" --backend cpu 2>/dev/null &&
        cmp -s "$TMP/f8c.f32" "$TMP/twc.f32" && ok "fp8 $name: the twin's bits on the CPU" ||
        bad "fp8 $name: not the twin's bits on the CPU"
    a=$("$BIN" generate "$fp8" --ids "$ids" -n 8 2>/dev/null | tail -n 1)
    b=$("$BIN" generate "$twin" --ids "$ids" -n 8 2>/dev/null | tail -n 1)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "fp8 $name: greedy $a" || bad "fp8 $name: greedy '$a' vs the twin's '$b'"
}
if "$PY" "$CONV" dequantize "$F8" "$TMP/f8twin"; then
    check_fp8_twin qwen3_moe "$F8" "$TMP/f8twin" 3,17,101,44,9,127,0,64,33,5
else
    bad "fp8: tools/fp8_convert.py dequantize"
fi
# qwen2_moe (shared expert): a fixture quantised to FP8 here, against its own twin
if "$PY" "$CONV" quantize "$FIX/qwen2_odd" "$TMP/q2f8" && "$PY" "$CONV" dequantize "$TMP/q2f8" "$TMP/q2tw"; then
    check_fp8_twin qwen2_moe "$TMP/q2f8" "$TMP/q2tw" "$(json_field "$FIX/qwen2_odd/ref.json" ids)"
else
    bad "fp8: tools/fp8_convert.py quantize"
fi
# deepseek_v3 (multi-head latent attention) at 128 x 128: W_UK^T is kv_b_proj widened to F32, as
# its blocks do not tile this model's heads (test_mla checks the FP8 copy made where they do)
DS="$FIX/fam/deepseek_v3_a"
if "$PY" "$CONV" quantize "$DS" "$TMP/ds8" && "$PY" "$CONV" dequantize "$TMP/ds8" "$TMP/ds8tw"; then
    check_fp8_twin deepseek_v3 "$TMP/ds8" "$TMP/ds8tw" "$(json_field "$DS/ref.json" ids)"
else
    bad "fp8: tools/fp8_convert.py quantize deepseek_v3"
fi
# experts read from the safetensors files themselves (codes and block scales, piece by piece)
"$BIN" logits "$F8" --ids 3,17,101,44,9 --out "$TMP/mapped.f32" 2>/dev/null
same=1
for mode in "--experts resident" "--experts stream --cache-experts 2" \
    "--experts stream --cache-experts 2 --cache-policy lru --batch 3" "--experts stream --direct-io --cache-experts 3"; do
    # shellcheck disable=SC2086
    "$BIN" logits "$F8" --ids 3,17,101,44,9 --out "$TMP/mode.f32" $mode 2>"$TMP/err" &&
        cmp -s "$TMP/mapped.f32" "$TMP/mode.f32" || { same=0; bad "fp8 $mode: $(cat "$TMP/err")"; }
done
[ $same = 1 ] && ok "fp8: resident and streamed experts give the mapped bits"
"$BIN" inspect "$F8" >"$TMP/out" 2>&1 && grep -q "experts F8_E4M3 with 128x128 block scales 8.002 bpw" "$TMP/out" &&
    ok "fp8: inspect names the type" || bad "fp8: inspect: $(grep types "$TMP/out")"
# pack dequantises, then quantises: the twin's pack, byte for byte in its logits
if "$BIN" pack "$F8" "$TMP/f8p" --quant int8 2>/dev/null && "$BIN" pack "$TMP/f8twin" "$TMP/twp" --quant int8 2>/dev/null &&
    "$BIN" logits "$TMP/f8p" --ids 3,17,101 --out "$TMP/a.f32" 2>/dev/null &&
    "$BIN" logits "$TMP/twp" --ids 3,17,101 --out "$TMP/b.f32" 2>/dev/null && cmp -s "$TMP/a.f32" "$TMP/b.f32"; then
    ok "fp8: pack --quant int8 gives the twin's pack"
else
    bad "fp8: pack --quant int8"
fi
expect_fail "fp8: pack --quant bf16 refused" "an FP8 checkpoint .* packs with --quant int8 or --quant int4" \
    "$BIN" pack "$F8" "$TMP/f8bf" --quant bf16
[ -e "$TMP/f8bf" ] && bad "fp8: refused pack left $TMP/f8bf"
# bad input: one clear line naming the file and the tensor
fp8_edit() { # fp8_edit DIR PYTHON: a copy of the fixture, its tensors t (name -> (dtype, shape, raw)) edited
    rm -rf "$1" && cp -r "$F8" "$1" &&
        "$PY" - "$1" "$CONV" "$2" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("conv", sys.argv[2])
conv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conv)
path = sys.argv[1] + "/model.safetensors"
t, meta = conv.read_st(path)
exec(sys.argv[3])
conv.write_st(path, t, meta)
PY
}
Q="model.layers.1.self_attn.q_proj.weight"
fp8_edit "$TMP/f8a" "del t['$Q' + '_scale_inv']"
expect_fail "fp8: missing weight_scale_inv" "model.safetensors: tensor '$Q' is F8_E4M3 but '${Q}_scale_inv' is missing" \
    "$BIN" logits "$TMP/f8a" --ids 1 --out "$TMP/x.f32"
fp8_edit "$TMP/f8b" "d, s, r = t['$Q' + '_scale_inv']; t['$Q' + '_scale_inv'] = (d, [4, 1], r)"
expect_fail "fp8: mis-shaped weight_scale_inv" "model.safetensors: tensor '${Q}_scale_inv': expected F32 \[2, 2\] (blocks of 128 x 128 over $Q), got F32 \[4, 1\]" \
    "$BIN" logits "$TMP/f8b" --ids 1 --out "$TMP/x.f32"
rm -rf "$TMP/f8c" && cp -r "$F8" "$TMP/f8c" && sed -i 's/"fmt": "e4m3"/"fmt": "e5m2"/' "$TMP/f8c/config.json"
expect_fail "fp8: fmt e5m2 refused" "config.json: quantization_config.fmt 'e5m2' is not supported" \
    "$BIN" generate "$TMP/f8c" --ids 1 -n 1
rm -rf "$TMP/f8d" && cp -r "$F8" "$TMP/f8d" &&
    "$PY" -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); c["quantization_config"]["weight_block_size"]=[128]; json.dump(c, open(p, "w"))' "$TMP/f8d/config.json"
expect_fail "fp8: weight_block_size of one number" "config.json: quantization_config.weight_block_size must be two positive integers" \
    "$BIN" inspect "$TMP/f8d"

finish "cli test"
