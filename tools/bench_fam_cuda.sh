#!/usr/bin/env bash
# Issue 27 on the H200: sluice and llama.cpp side by side on gpt-oss-120b and DeepSeek-V3 layer
# shapes with fewer layers (8 and 5 by default: the device disk is 64 GB and the whole run must
# fit in one 10-minute call), all in one call on a bare machine:
#
#   1. builds llama.cpp's llama-bench with CUDA from the trimmed source (LLAMA_SRC, as
#      .ab/h200_setup.sh) and sluice (make CUDA=1) in the background, while
#   2. tools/make_synth.py writes the Hugging Face checkpoints sluice packs (gpt-oss: `pack
#      --quant keep`, its MXFP4 experts and BF16 rest; DeepSeek-V3: `pack --quant int4`) and
#      tools/make_gguf_synth.py the GGUFs of the same shapes for llama.cpp (gpt-oss: bf16+mxfp4,
#      as the official checkpoint; DeepSeek-V3: q4_0, the size of sluice's int4). Routed experts
#      are zeros (sparse holes where the format allows): time per token does not depend on them.
#   3. runs, alternated, ROUNDS rounds of: llama-bench -ngl 99 -p PP -n TG | sluice generate
#      (PP-token prompt, TG decoded tokens) resident on the GPU | llama-bench with the experts
#      in host RAM (-ot exps=CPU -t 16) | sluice with the experts in host RAM and a GPU cache
#      of GPU_FRAC % of them per layer (--gpu-experts);
#   4. prints medians of prefill and decode tok/s and the ratio sluice / llama.cpp.
#
#   OUT=/some/dir tools/bench_fam_cuda.sh          # in the device call: $OUT is set
#
# Needs in the tree: .deps.txz (sluice's libraries for the bare machine) and LLAMA_SRC
# (default .ab/llama-src.txz), both ignored by git: carry them. Expected time on the H200: about
# 3.5 minutes of builds with the models written meanwhile, then 4-5 minutes of runs. A round
# that would start after LIMIT seconds is skipped (the medians are of the rounds that ran).
# Models are kept under W (build-cuda/fam, ignored by git): a second call on the same machine
# skips what exists. Knobs (environment): GO_LAYERS DS_LAYERS ROUNDS PP TG GPU_FRAC LIMIT
# MODELS ("go ds") JOBS; for a check on a CPU machine: SKIP_BUILD=1 BIN=build/sluice
# LLB=/path/to/llama-bench BACKEND=cpu (and small layer counts, PP and TG).
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/bench_fam_out}
W=${W:-build-cuda/fam}
GO_LAYERS=${GO_LAYERS:-8}
DS_LAYERS=${DS_LAYERS:-5}
ROUNDS=${ROUNDS:-3}
PP=${PP:-512}
TG=${TG:-64}
GPU_FRAC=${GPU_FRAC:-25}
LIMIT=${LIMIT:-540}
RUN_LIMIT=${RUN_LIMIT:-150}
MODELS=${MODELS:-go ds}
JOBS=${JOBS:-$(nproc)}
BACKEND=${BACKEND:-cuda}
LLAMA_SRC=${LLAMA_SRC:-.ab/llama-src.txz}
BIN=${BIN:-build-cuda/sluice}
LLB=${LLB:-build-cuda/ll/build/bin/llama-bench}
PY=${PY:-python3}
mkdir -p "$OUT" "$W"
el() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/progress.log"; }
left() { echo $((LIMIT - ($(date +%s) - T0))); }

# ---------------------------------------------------------------- builds (background)
if [ -z "${SKIP_BUILD:-}" ]; then
    if [ -f .deps.txz ]; then tar xJf .deps.txz && export DEPS=$PWD/.deps; fi
    if [ ! -x "$LLB" ]; then
        (
            mkdir -p build-cuda/ll
            tar xJf "$LLAMA_SRC" -C build-cuda/ll
            sed -i '/miniaudio/d' build-cuda/ll/vendor/CMakeLists.txt
            sed -i -E '/add_subdirectory\((mtmd|tts|cvector-generator|export-lora|results|fit-params|imatrix|completion|batched-bench|tokenize|gguf-split|perplexity)\)/d' build-cuda/ll/tools/CMakeLists.txt
            cmake -S build-cuda/ll -B build-cuda/ll/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
                -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
                -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF &&
                cmake --build build-cuda/ll/build --target llama-bench -j "$((JOBS - 1))"
        ) > "$OUT/llama_build.log" 2>&1 &
        PID_LL=$!
    fi
    make CUDA=1 -j8 "$BIN" > "$OUT/sluice_build.log" 2>&1 &
    PID_SL=$!
fi

# ---------------------------------------------------------------- models (background)
declare -A LAYERS=([go]=$GO_LAYERS [ds]=$DS_LAYERS)
declare -A PRESET=([go]=gpt-oss-120b [ds]=deepseek-v3)
declare -A GGUF_TYPES=([go]=bf16+mxfp4 [ds]=q4_0)
declare -A PACK_QUANT=([go]=keep [ds]=int4)
declare -A NEXP=([go]=128 [ds]=256)
declare -A PID_HF
for m in $MODELS; do
    n=${LAYERS[$m]}
    if [ ! -f "$W/$m-$n.gguf" ]; then
        $PY tools/make_gguf_synth.py --preset "${PRESET[$m]}" --layers "$n" --zero-experts \
            --out "${GGUF_TYPES[$m]}:$W/$m-$n.gguf.tmp" > "$OUT/gguf_$m.log" 2>&1 &&
            mv "$W/$m-$n.gguf.tmp" "$W/$m-$n.gguf" &
    fi
    if [ ! -f "$W/$m-$n-pack.done" ] && [ ! -f "$W/$m-$n-hf.done" ]; then
        rm -rf "$W/$m-$n-hf"
        $PY tools/make_synth.py "$W/$m-$n-hf" --preset "${PRESET[$m]}" --layers "$n" \
            --zero-experts > "$OUT/synth_$m.log" 2>&1 && touch "$W/$m-$n-hf.done" &
        PID_HF[$m]=$!
    fi
done
if [ -n "${PID_SL:-}" ]; then
    wait "$PID_SL" || { el "sluice build FAILED"; tail -20 "$OUT/sluice_build.log"; }
    el "sluice built"
fi
for m in $MODELS; do # a pack needs sluice and its checkpoint
    n=${LAYERS[$m]}
    [ -f "$W/$m-$n-pack.done" ] && continue
    [ -n "${PID_HF[$m]:-}" ] && wait "${PID_HF[$m]}"
    el "$m: checkpoint written ($(du -sh "$W/$m-$n-hf" | cut -f1) on disk), packing"
    (
        rm -rf "$W/$m-$n-pack"
        "$BIN" pack "$W/$m-$n-hf" "$W/$m-$n-pack" --quant "${PACK_QUANT[$m]}" > "$OUT/pack_$m.log" 2>&1 &&
            touch "$W/$m-$n-pack.done" && rm -rf "$W/$m-$n-hf" "$W/$m-$n-hf.done"
    ) &
done
wait # packs, GGUFs, llama.cpp
el "ready: $(df -h "$W" | tail -1 | awk '{print $3 " used, " $4 " free"}')"
[ -x "$LLB" ] || { el "llama-bench missing"; tail -30 "$OUT/llama_build.log"; }
for m in $MODELS; do
    n=${LAYERS[$m]}
    [ -f "$W/$m-$n-pack.done" ] || { el "$m: no pack"; tail -5 "$OUT/pack_$m.log" "$OUT/synth_$m.log"; }
    [ -f "$W/$m-$n.gguf" ] || { el "$m: no GGUF"; tail -5 "$OUT/gguf_$m.log"; }
    el "$m: pack $(du -sh "$W/$m-$n-pack" 2> /dev/null | cut -f1), GGUF $(du -sh --apparent-size "$W/$m-$n.gguf" 2> /dev/null | cut -f1) ($(du -sh "$W/$m-$n.gguf" 2> /dev/null | cut -f1) on disk)"
done
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader

# ---------------------------------------------------------------- medians
summary() {
    $PY - "$RES" "$GO_LAYERS" "$DS_LAYERS" "$GPU_FRAC" "$PP" "$TG" << 'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
num = lambda x: f"{x:,.0f}" if x >= 100 else f"{x:.1f}"
go_l, ds_l, frac, pp, tg = sys.argv[2:7]
name = {"go": f"gpt-oss-120b shapes, {go_l} layers (bf16 + MXFP4 experts)",
        "ds": f"DeepSeek-V3 shapes, {ds_l} layers (int4 / Q4_0)"}
mode = {"resident": "all on the GPU",
        "host": f"experts in host RAM (sluice: GPU cache of {frac}% a layer; llama.cpp: -ot exps=CPU -t 16)"}
print(f"\nmedians (tok/s) of prefill pp{pp} and decode tg{tg}; sluice decodes after its pp{pp} prompt")
print("| model | mode | llama.cpp pp / tg | sluice pp / tg | sluice / llama.cpp | rounds |")
print("|---|---|---|---|---|---|")
for m in ("go", "ds"):
    for md in ("resident", "host"):
        sel = {e: [r for r in rows if r[1] == m and r[2] == md and r[3] == e]
               for e in ("llama.cpp", "sluice")}
        if not any(sel.values()):
            continue
        med = {e: (statistics.median(float(r[4]) for r in v) if v else 0.0,
                   statistics.median(float(r[5]) for r in v) if v else 0.0)
               for e, v in sel.items()}
        (lp, lt), (sp, st) = med["llama.cpp"], med["sluice"]
        ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"
        notes = sorted({r[6] for r in sel["sluice"] if r[6] != "-"})
        print(f"| {name[m]} | {mode[md]} | {num(lp)} / {num(lt)} | {num(sp)} / {num(st)} | "
              f"{ratio(sp, lp)} / {ratio(st, lt)} | {len(sel['llama.cpp'])}+{len(sel['sluice'])} |"
              + (f" {' '.join(notes)}" if notes else ""))
EOF
}

# ---------------------------------------------------------------- runs
IDS=$(seq -s, 1 "$PP")
RES=$OUT/results.tsv # round model mode engine prefill decode note
: > "$RES"
llama() { # model mode gguf round extra-args...
    local m=$1 mode=$2 f=$3 r=$4
    shift 4
    local log=$OUT/llama_${m}_${mode}_$r.jsonl
    timeout "$RUN_LIMIT" "$LLB" -m "$f" -p "$PP" -n "$TG" -r 1 -o jsonl "$@" > "$log" 2> "${log%.jsonl}.err" ||
        { echo "llama-bench $m $mode failed:"; tail -n 5 "${log%.jsonl}.err"; }
    $PY - "$log" "$r" "$m" "$mode" >> "$RES" << 'EOF'
import json, sys
pp = tg = 0.0
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j["n_gen"] == 0: pp = j["avg_ts"]
    else: tg = j["avg_ts"]
print(sys.argv[2], sys.argv[3], sys.argv[4], "llama.cpp", f"{pp:.1f}", f"{tg:.2f}", "-", sep="\t")
EOF
    tail -n 1 "$RES"
}
sluice() { # model mode pack round extra-args...
    local m=$1 mode=$2 p=$3 r=$4
    shift 4
    local log=$OUT/sluice_${m}_${mode}_$r.log
    timeout "$RUN_LIMIT" "$BIN" generate "$p" --ids "$IDS" -n "$TG" --experts resident \
        --backend "$BACKEND" --stats "$@" > /dev/null 2> "$log" ||
        { echo "sluice $m $mode failed:"; tail -n 5 "$log"; }
    $PY - "$log" "$r" "$m" "$mode" >> "$RES" << 'EOF'
import re, sys
t = open(sys.argv[1], errors="replace").read()
pp = re.search(r"prompt tokens +\d+ \(([\d.]+) tok/s", t)
tg = re.search(r"decode steps +\d+ \(([\d.]+) tok/s", t)
gc = re.search(r"GPU expert cache .*hits \d+ \(([\d.]+)%\)", t)
print(sys.argv[2], sys.argv[3], sys.argv[4], "sluice", pp.group(1) if pp else "0",
      tg.group(1) if tg else "0", f"gpu-cache-hit {gc.group(1)}%" if gc else "-", sep="\t")
EOF
    tail -n 1 "$RES"
}
for r in $(seq "$ROUNDS"); do
    for m in $MODELS; do
        n=${LAYERS[$m]}
        f=$W/$m-$n.gguf p=$W/$m-$n-pack
        if [ "$(left)" -lt 60 ]; then
            el "round $r $m skipped: $(left) s left of LIMIT"
            continue
        fi
        el "round $r: $m"
        llama "$m" resident "$f" "$r" -ngl 99
        sluice "$m" resident "$p" "$r"
        llama "$m" host "$f" "$r" -ngl 99 -ot exps=CPU -t 16
        sluice "$m" host "$p" "$r" --gpu-experts $((NEXP[$m] * GPU_FRAC / 100))
    done
    [ "$r" -lt "$ROUNDS" ] && summary
done
el "runs done"
summary
el done
