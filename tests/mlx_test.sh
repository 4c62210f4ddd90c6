#!/usr/bin/env bash
# MLX checkpoints (mlx-lm's quantised safetensors), made from the transformers fixtures at test
# time by tools/make_mlx_fixture.py together with their dequantised twins (float32, w = scale *
# q + bias): sluice on the MLX directory against sluice on the twin, relative L2 of the logits
# <= 1e-4 and the same greedy ids (int4 on float activations, --int4-float-act: the exact
# product; the default int8 activations only round x); experts resident and streamed from the
# files give the mapped bits; refusals of what is not supported.
set -u
BIN=${1:-build/sluice}
FIX=${2:-tests/fixtures}
PY=${PYTHON:-python3}
. "$(dirname "$0")/lib.sh"

json_ids() { "$PY" -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids"])))' "$1"; }

# rel_l2 A B: relative L2 distance of two T x V float32 files, printed.
rel_l2() {
    "$PY" - "$1" "$2" <<'PY'
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype="<f4").astype(np.float64)
b = np.fromfile(sys.argv[2], dtype="<f4").astype(np.float64)
print(np.linalg.norm(a - b) / np.linalg.norm(b) if a.shape == b.shape else "inf")
PY
}

if ! "$PY" -c 'import numpy' 2>/dev/null; then
    echo "mlx: no numpy for $PY (set PYTHON): skipped"
    exit 0
fi

# case NAME SRC ARGS...: the MLX checkpoint of SRC (make_mlx_fixture.py ARGS) against its twin.
mlx_case() {
    local name=$1 src=$FIX/$2
    shift 2
    local mlx=$TMP/$name.mlx deq=$TMP/$name.deq
    if ! "$PY" tools/make_mlx_fixture.py "$src" "$mlx" "$deq" "$@" 2>"$TMP/err"; then
        bad "mlx $name: make_mlx_fixture.py: $(head -c 300 "$TMP/err")"
        return
    fi
    local ids
    ids=$(json_ids "$src/ref.json")
    if "$BIN" logits "$mlx" --ids "$ids" --out "$TMP/m.f32" --int4-float-act 2>"$TMP/err" &&
        "$BIN" logits "$deq" --ids "$ids" --out "$TMP/d.f32" 2>>"$TMP/err"; then
        local e
        e=$(rel_l2 "$TMP/m.f32" "$TMP/d.f32")
        if "$PY" -c "import sys; sys.exit(0 if float('$e') <= 1e-4 else 1)"; then
            ok "mlx $name: logits within $e of the dequantised twin"
        else
            bad "mlx $name: logits $e from the dequantised twin"
        fi
    else
        bad "mlx $name: logits: $(head -c 300 "$TMP/err")"
    fi
    local g1 g2
    g1=$("$BIN" generate "$mlx" --ids "$ids" -n 8 --int4-float-act 2>/dev/null | tail -n 1)
    g2=$("$BIN" generate "$deq" --ids "$ids" -n 8 2>/dev/null | tail -n 1)
    if [ -n "$g1" ] && [ "$g1" = "$g2" ]; then
        ok "mlx $name: greedy ids of the twin ($g1)"
    else
        bad "mlx $name: greedy '$g1', twin '$g2'"
    fi
    # experts read from the safetensors files (codes, scales, biases as pieces): the mapped bits
    # in every mode and cache size
    local k e same=1
    if [ "${STREAM:-1}" = 1 ]; then
        k=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_experts_per_tok"])' "$src/config.json")
        e=$("$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("num_experts") or c["num_local_experts"])' "$src/config.json")
        "$BIN" logits "$mlx" --ids "$ids" --out "$TMP/map.f32" 2>/dev/null
        for mode in "--experts resident" "--experts stream --cache-experts $k" \
            "--experts stream --cache-experts $k --cache-policy lru --batch 3" \
            "--experts stream --direct-io --cache-experts $((k + 1))" "--experts stream --cache-experts $e"; do
            # shellcheck disable=SC2086
            "$BIN" logits "$mlx" --ids "$ids" --out "$TMP/mode.f32" $mode 2>"$TMP/err" &&
                cmp -s "$TMP/map.f32" "$TMP/mode.f32" || { same=0; bad "mlx $name $mode: $(head -c 300 "$TMP/err")"; }
        done
        [ $same = 1 ] && ok "mlx $name: resident and streamed experts give the mapped bits"
    fi
    # the default int4 path (int8 activations where the CPU has VNNI) runs and is finite
    case " $* " in *" --bits 4 "*) ;; *) return ;; esac
    if "$BIN" logits "$mlx" --ids "$ids" --out "$TMP/m8.f32" 2>"$TMP/err" &&
        "$PY" -c 'import sys, numpy as np; sys.exit(0 if np.isfinite(np.fromfile(sys.argv[1], dtype="<f4")).all() else 1)' "$TMP/m8.f32"; then
        ok "mlx $name: default int4 path"
    else
        bad "mlx $name: default path: $(head -c 300 "$TMP/err")"
    fi
}

mlx_case q3-4b-g64 qwen3_prefix_sharded --bits 4 --group 64 --layout switch
mlx_case q2-8b-g32-experts qwen2_gqa_untied --bits 8 --group 32 --layout experts
mlx_case q2-8b-g64-f32 qwen2_gqa_untied --bits 8 --group 64 --sdtype f32 --layout switch
# (larger: its experts' pieces are as the others', so not streamed here)
STREAM=0 mlx_case kjv-4b-g128-f16 demo_kjv --bits 4 --group 128 --sdtype f16 --layout switch

M=$TMP/q3-4b-g64.mlx
if "$BIN" inspect "$M" >"$TMP/out" 2>&1 && grep -q "(MLX)" "$TMP/out" &&
    grep -q "attention Q4 4.50 bpw" "$TMP/out" && grep -q "router Q8 8.50 bpw" "$TMP/out"; then
    ok "mlx inspect: source MLX, types and bits per weight"
else
    bad "mlx inspect: $(head -c 600 "$TMP/out")"
fi

# refusals, naming the file and tensor
cfg_edit() { # cfg_edit DIR PYTHON-EXPR-ON-q: a copy of M with its quantization edited
    rm -rf "$1" && cp -r "$M" "$1" &&
        "$PY" - "$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
q = c["quantization"]
exec(sys.argv[2])
c["quantization_config"] = q
json.dump(c, open(sys.argv[1], "w"))
PY
}
ids=$(json_ids "$FIX/qwen3_prefix_sharded/ref.json")
cfg_edit "$TMP/bad" 'q["bits"] = 3'
expect_fail "mlx: 3 bits refused" "model.safetensors: tensor 'lm_head.weight': MLX 3-bit" \
    "$BIN" logits "$TMP/bad" --ids "$ids" --out "$TMP/x.f32"
cfg_edit "$TMP/bad" 'q["mode"] = "mxfp4"'
expect_fail "mlx: mode mxfp4 refused" "config.json: MLX quantization mode 'mxfp4'" \
    "$BIN" logits "$TMP/bad" --ids "$ids" --out "$TMP/x.f32"
cfg_edit "$TMP/bad" 'q["group_size"] = 32'
expect_fail "mlx: scales that disagree with the group size refused" \
    "tensor 'lm_head.weight': 64 columns in groups of 32 (4 bits) need 2 scales per row, the file has 1" \
    "$BIN" logits "$TMP/bad" --ids "$ids" --out "$TMP/x.f32"
cfg_edit "$TMP/bad" 'q["group_size"] = 16'
expect_fail "mlx: group size 16 refused" "MLX group size 16" \
    "$BIN" logits "$TMP/bad" --ids "$ids" --out "$TMP/x.f32"

finish "mlx"
