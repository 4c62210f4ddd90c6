#!/usr/bin/env bash
# Issue 31 on one H200 call: make test-cuda (the split's bitwise checks on one GPU among them),
# then Qwen3.5-397B-A17B layer shapes (LAYERS layers, int4, experts resident on the GPU) run
# whole and split into PARTS partitions, CUDA backends of their own on one GPU (--parts), and
# over the host's GPUs (--gpus) where it has more than one, and one GPU with a quarter of the
# experts cached on it, the rest in host RAM (host25): prefill of a PROMPT-token prompt,
# then N decode steps, ROUNDS alternated rounds, medians. The cost of crossing a boundary is
# what a token takes more than unsplit: 1/tok/s(split) - 1/tok/s(whole), per boundary.
# The issue's 60 layers take ~220 GB packed: more than these machines' disks; LAYERS=24 fits
# the two-GPU machine's 128 GB.
# Carry .deps.txz (tools/cuda_deps.sh).   OUT=/some/dir [LAYERS=4] [PARTS="2 4"] [ROUNDS=2]
. tools/lab/device_env.sh
export NCCL_NVLS_ENABLE=0 # never NVLink multicast on these hosts
S=build-cuda/sluice M=$W/q31-int4
LAYERS=${LAYERS:-4} PROMPT=${PROMPT:-512} N=${N:-64} ROUNDS=${ROUNDS:-2}
( [ -d $M ] || { python3 tools/make_synth.py $W/q31 --preset qwen3.5-397b-a17b --layers $LAYERS \
    --zero-experts > /dev/null && echo synth done; } ) > $OUT/synth.log 2>&1 &
PS=$!
[ -x $S ] || { make CUDA=1 -j14 $S > $OUT/build.log 2>&1; el "built $?"; grep -E ' error' $OUT/build.log | head; }
if [ -z "${NO_TEST:-}" ]; then
    make CUDA=1 -j14 test-cuda > $OUT/test_cuda.log 2>&1; el "test-cuda $?"
    grep -E 'partitions|passed|failed|FAIL' $OUT/test_cuda.log | tail -12
fi
wait $PS
[ -d $M ] || { $S pack $W/q31 $M --quant int4 > $OUT/pack.log 2>&1; el "packed $?"; rm -rf $W/q31; }
GPUS=$(nvidia-smi -L | wc -l)
# the baseline a model too large for one GPU has: one GPU caching a quarter of each layer's
# experts, the rest in host RAM (--experts resident keeps them all there, pinned)
E=$(python3 -c "import json; print(json.load(open('$M/manifest.json'))['config'].get('num_experts', 512))" 2>/dev/null || echo 512)
CONFIGS=("whole=" "host25=--gpu-experts $((E / 4))")
for p in ${PARTS:-2 4}; do CONFIGS+=("parts$p=--parts $p"); done
for g in $(seq 2 "$GPUS"); do CONFIGS+=("gpus$g=--gpus $g"); done
IDS=$(seq -s, 101 $((100 + PROMPT)))
declare -A PF DC
for r in $(seq 1 "$ROUNDS"); do
    for c in "${CONFIGS[@]}"; do
        label=${c%%=*} flags=${c#*=}
        # shellcheck disable=SC2086
        line=$($S generate $M --ids "$IDS" -n "$N" --backend cuda --experts resident --stats -v $flags 2>&1 >/dev/null |
            awk '/partitions:/ {sub(/^sluice: /, ""); split_line = $0}
                 /^prompt tokens/ {gsub(/\(/, "", $4); pf = $4}
                 /^decode steps/ {gsub(/\(/, "", $4); dc = $4}
                 END {printf "%s %s %s\n", pf, dc, split_line}')
        el "round $r $label: $line" >> $OUT/rounds.log
        PF[$label]+="$(echo "$line" | awk '{print $1}')"$'\n'
        DC[$label]+="$(echo "$line" | awk '{print $2}')"$'\n'
    done
done
median() { grep . | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
w_pf=$(printf '%s' "${PF[whole]}" | median) w_dc=$(printf '%s' "${DC[whole]}" | median)
{
    echo "Qwen3.5-397B shapes, $LAYERS layers int4, experts resident; prompt $PROMPT, then $N decode steps; $ROUNDS rounds, medians; $GPUS GPU(s)"
    printf '%-8s %12s %12s %16s %16s\n' config prefill_tok/s decode_tok/s prefill_us/b/tok decode_us/b/tok
    for c in "${CONFIGS[@]}"; do
        label=${c%%=*}
        pf=$(printf '%s' "${PF[$label]}" | median) dc=$(printf '%s' "${DC[$label]}" | median)
        case $label in parts* | gpus*) b=$(( $(echo "$label" | tr -dc 0-9) - 1 )) ;; *) b=0 ;; esac
        awk -v l="$label" -v pf="$pf" -v dc="$dc" -v wp="$w_pf" -v wd="$w_dc" -v b="$b" 'BEGIN {
            cp = (b > 0 && pf > 0 && wp > 0) ? (1e6 / pf - 1e6 / wp) / b : 0
            cd = (b > 0 && dc > 0 && wd > 0) ? (1e6 / dc - 1e6 / wd) / b : 0
            printf "%-8s %12s %12s %16.2f %16.2f\n", l, pf, dc, cp, cd }'
    done
} | tee $OUT/split_table.txt
el done
