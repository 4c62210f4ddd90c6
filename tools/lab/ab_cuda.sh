#!/usr/bin/env bash
# Side-by-side decode benchmark of variants of this tree on the GPU machine: every variant is built
# first (those with extra nvcc flags in their own copy of the tree, in parallel), then the
# benchmark model decodes with each in turn, ROUNDS times round (each round starting one variant
# further on), so the machine's drift hits all alike; then once each through a 25% GPU expert
# cache. Prints each run and the medians.
#   tools/lab/ab_cuda.sh WORKDIR ROUNDS 'NAME|NVCC FLAGS|ENV[|TREE]' ...
# e.g. tools/lab/ab_cuda.sh /tmp/w 3 'main||' 'graphs||SL_GRAPHS=1' 'nopdl||SL_NO_PDL=1' 'b|||.ab/b'
# TREE: build from that copy of a tree instead (another branch, which the GPU machine cannot
# check out: here, `mkdir -p .ab/b && git archive b | tar -x -C .ab/b`, .ab in .git/info/exclude,
# and carry .ab). MAKE_OPTS (e.g. DEPS=.deps) goes to every make.
set -uo pipefail
W=${1:?workdir}
ROUNDS=${2:?rounds}
shift 2
[ $# -ge 1 ] || { echo "usage: $0 WORKDIR ROUNDS 'NAME|NVCC FLAGS|ENV' ..." >&2; exit 2; }
mkdir -p "$W"
export LD_LIBRARY_PATH=$PWD/.deps/lib:${LD_LIBRARY_PATH:-}
declare -A BIN ENVS RES BUILT
NAMES=()
J=$(( $(nproc) / ($# + 1) + 1 ))
for v in "$@"; do
    IFS='|' read -r name flags envs tree <<<"$v"
    for f in $flags; do # a setting put in the flags field would reach nvcc, not the run
        [ "${f#-}" != "$f" ] || { echo "$name: nvcc flag '$f' does not start with '-' (ENV is the third field)" >&2; exit 2; }
    done
    NAMES+=("$name")
    ENVS[$name]=$envs
    if [ -z "$flags" ] && [ -z "$tree" ]; then
        BIN[$name]=$PWD/build-cuda/bench_cuda
        continue
    fi
    if [ -n "${BUILT[$flags|$tree]:-}" ]; then # the same build as an earlier variant's
        BIN[$name]=${BUILT[$flags|$tree]}
        continue
    fi
    d=/tmp/ab-$name
    BUILT[$flags|$tree]=$d/build-cuda/bench_cuda
    rm -rf "$d" && mkdir -p "$d"
    tar --exclude=./build --exclude=./build-cuda --exclude=./.ab -cf - . | (cd "$d" && tar xf -)
    if [ -n "$tree" ]; then
        src=$(cd "$tree" && pwd) || exit 1
        # without the tree's own build outputs: objects built there without the variant's flags
        # would count as up to date
        (cd "$d" && rm -rf src include tests tools Makefile && cp -r "$src"/. . && rm -rf build build-cuda)
    fi
    BIN[$name]=$d/build-cuda/bench_cuda
    (cd "$d" && NVFLAGS="-O3 ${flags:-}" make CUDA=1 -j"$J" ${MAKE_OPTS:-} build-cuda/bench_cuda >/dev/null) &
done
make CUDA=1 -j"$J" ${MAKE_OPTS:-} build-cuda/bench_cuda >/dev/null &
[ -d "$W/src" ] || python3 tools/make_synth.py "$W/src" --preset qwen3-30b-a3b --zero-experts >/dev/null 2>&1 &
wait
for n in "${NAMES[@]}"; do [ -x "${BIN[$n]}" ] || { echo "$n: build failed" >&2; exit 1; }; done
[ -d "$W/int4" ] || build-cuda/bench_cuda pack "$W/src" "$W/int4" >/dev/null
rate() { grep -o 'decode 128 tok [0-9.]*' | awk '{print $4}'; }
for r in $(seq "$ROUNDS"); do
    # each round starts one variant further on, so no variant always runs first (or after the same one)
    for i in $(seq 0 $((${#NAMES[@]} - 1))); do
        n=${NAMES[$(( (i + r - 1) % ${#NAMES[@]} ))]}
        t=$(env ${ENVS[$n]} "${BIN[$n]}" run "$W/int4" cuda resident 0 128 128 | rate)
        echo "round $r  $n  resident  $t tok/s"
        RES[$n]="${RES[$n]:-} $t"
    done
done
for n in "${NAMES[@]}"; do
    t=$(env ${ENVS[$n]} "${BIN[$n]}" run "$W/int4" cuda resident 32 128 128 | rate)
    echo "$n  25% GPU cache  $t tok/s"
done
for n in "${NAMES[@]}"; do
    echo "$n  resident median $(tr ' ' '\n' <<<"${RES[$n]}" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') tok/s"
done
