#!/usr/bin/env bash
# Makes the quantised GGUF fixtures and llama.cpp's logits for them (tests/fixtures/gguf_quant).
#
#   tools/make_gguf_quant_refs.sh LLAMA_SRC LLAMA_BUILD OUTDIR
#
# LLAMA_SRC: a llama.cpp source tree (gguf-py/, include/, ggml/include/), LLAMA_BUILD its build
# directory with bin/llama-quantize and bin/libllama.so (../shared/bench/README.md builds both
# from the npm package node-llama-cpp). Needs /usr/bin/python3 with numpy and a C compiler.
#
# 1. tools/make_gguf_quant_fixture.py writes a random-weight qwen3moe model in F32 whose every
#    matrix has rows of a multiple of 256 (the K-quants' block), with a 128-token prompt.
# 2. llama-quantize --pure turns it into one file per type: every matrix of that type
#    (norms and the router stay F32, as llama-quantize keeps them).
# 3. tools/llama_ref_logits.c, linked against libllama, runs each file on llama.cpp's CPU
#    backend: the logits of the prompt (T x V float32; the last 32 rows kept) and 16 greedy ids
#    through its KV cache.
# tests/fixtures/gguf_quant holds the outputs but f32.gguf (tests/cli_test.sh runs them).
set -eu
SRC=$1 BUILD=$2 OUT=$3
PY=/usr/bin/python3
mkdir -p "$OUT"
PYTHONPATH="$SRC/gguf-py" $PY "$(dirname "$0")/make_gguf_quant_fixture.py" "$OUT/f32.gguf" "$OUT/prompt.json"
cc -O2 -o "$OUT/llama_ref_logits" "$(dirname "$0")/llama_ref_logits.c" -I"$SRC/include" \
    -I"$SRC/ggml/include" -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin"
ids=$($PY -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids"])))' "$OUT/prompt.json")
# TYPES="IQ4_NL" makes only those (the model and prompt are the same every run: seeded).
for t in ${TYPES:-F32 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS IQ4_NL MXFP4_MOE}; do
    f="$OUT/$(echo "$t" | tr 'A-Z' 'a-z').gguf"
    [ "$t" = F32 ] || "$BUILD/bin/llama-quantize" --pure "$OUT/f32.gguf" "$f" "$t" >"$OUT/quantize-$t.log" 2>&1
    "$OUT/llama_ref_logits" "$f" "$ids" 16 "${f%.gguf}.logits.f32" "${f%.gguf}.greedy.txt" 2>"$OUT/ref-$t.log"
    # The tests keep the last 32 rows of the prompt's logits (their size stays small).
    $PY -c 'import sys; d = open(sys.argv[1], "rb").read(); open(sys.argv[1], "wb").write(d[-32 * 4 * int(sys.argv[2]):])' \
        "${f%.gguf}.logits.f32" 288
    echo "$t: $(stat -c %s "$f") bytes, greedy $(cat "${f%.gguf}.greedy.txt")"
done
