#!/usr/bin/env bash
# sluice and llama.cpp's CUDA build on the same GGUF files, alternated in one session
# (docs/BENCHMARKS.md 12.3): llama-bench pp512/tg128 with every layer on the GPU against sluice's
# 512-token prompt and 128 decoded tokens, resident; then the experts in host RAM (sluice: 32
# experts a layer cached on the GPU; llama.cpp: -ot exps=CPU with 16 threads).
#
#   LLAMA=path/to/llama-bench tools/bench_gguf_cuda.sh [ROUNDS] FILE.gguf...
#
# llama.cpp for the GPU: its source (../shared/bench/README.md) configured with -DGGML_CUDA=ON
# -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON, target llama-bench. Files: make_gguf.py
# --preset bench-A (Q8_0, Q4_0), llama-quantize --allow-requantize for Q4_K_M.
set -euo pipefail
ROUNDS=${1:-3}
shift
BIN=${BIN:-build-cuda/sluice}
LLAMA=${LLAMA:?set LLAMA to llama-bench built with GGML_CUDA}
IDS=$(seq -s, 1 512)
for r in $(seq "$ROUNDS"); do
    for f in "$@"; do
        q=$(basename "$f" .gguf)
        "$LLAMA" -m "$f" -ngl 99 -p 512 -n 128 -r 1 2>/dev/null | grep -E "pp512|tg128" |
            awk -F'|' -v q="$q" '{print "llama.cpp", q, $(NF-2), $(NF-1)}'
        echo "sluice    $q $("$BIN" generate "$f" --ids "$IDS" -n 129 --experts resident 2>&1 >/dev/null | tail -n 1)"
    done
done
for f in "$@"; do
    q=$(basename "$f" .gguf)
    "$LLAMA" -m "$f" -ngl 99 -ot exps=CPU -t 16 -p 512 -n 64 -r 1 2>/dev/null | grep -E "pp512|tg64" |
        awk -F'|' -v q="$q" '{print "llama.cpp exps=CPU", q, $(NF-2), $(NF-1)}'
    echo "sluice gpu-experts 32 $q $("$BIN" generate "$f" --ids "$IDS" -n 65 --experts resident --gpu-experts 32 2>&1 >/dev/null | tail -n 1)"
done
