#!/usr/bin/env bash
# sluice serve against llama-server -np N on the same GGUF under N concurrent streaming clients
# (issue 29), measured by load_bench.py; a side-by-side table of medians.
#
#   tools/lab/load_compare.sh GGUF [ROUNDS]
#   tools/lab/load_compare.sh --table DIR [MIN_CORES]   (the table again from a run's JSON files;
#       with MIN_CORES only the runs whose server used that many cores: the unstarved ones)
#
# For each N in $NS both servers are started on the same file (both memory-map it, so they share
# the page cache and neither evicts the other), then load_bench.py runs ROUNDS times against
# each, alternating which goes first (this machine is shared and noisy: a single run means
# little, the median of alternated runs does), then both are stopped: llama-server's slot count
# is fixed at start. The servers idle while the other is measured.
#
# Environment (defaults in brackets):
#   NS ["1 4 16"]  R [2] requests per client   PT [128] prompt tokens   GEN [64] tokens a reply
#   THREADS [2]    CTX [512] context per sequence (llama-server gets -c N*CTX, one slot each)
#   SLUICE [build/sluice]   LLAMA_SERVER [/tmp/nlc-bundle/build/bin/llama-server]
#   SLUICE_FLAGS: added to `sluice serve` (e.g. --experts stream --cache-mem 1G)
#   SLUICE_MODEL [GGUF]: what sluice serves instead (its int4 pack of the same shapes: the same
#     bits per weight as Q4_0; add --tokenizer to SLUICE_FLAGS when it has none)
#   SLUICE_PARALLEL ["--parallel N"]: how N reaches sluice (N sequences decoding together)
#   LLAMA_FLAGS: added to llama-server        OUT [a new /tmp directory]: logs and JSON
#   ENGINES ["llama sluice"]: one of them alone to measure only it
set -euo pipefail
G=${1:?usage: load_compare.sh GGUF [ROUNDS] | --table DIR}
ROUNDS=${2:-3}
NS=${NS:-"1 4 16"}
R=${R:-2}
PT=${PT:-128}
GEN=${GEN:-64}
THREADS=${THREADS:-2}
CTX=${CTX:-512}
SLUICE=${SLUICE:-build/sluice}
LLAMA_SERVER=${LLAMA_SERVER:-/tmp/nlc-bundle/build/bin/llama-server}
ENGINES=${ENGINES:-"llama sluice"}
OUT=${OUT:-$(mktemp -d /tmp/load_compare.XXXXXX)}
PORT_L=${PORT_L:-18181}
PORT_S=${PORT_S:-18182}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"

PIDS=()
stop_all() { # only the servers started here, by their ids
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
trap stop_all EXIT

wait_health() { # url pid log: both servers answer 200 on /health once the model is loaded
    for _ in $(seq 600); do
        curl -sf -o /dev/null "$1/health" && return 0
        kill -0 "$2" 2>/dev/null || { echo "server died, log $3:" >&2; tail -20 "$3" >&2; return 1; }
        sleep 1
    done
    echo "server did not come up, log $3" >&2
    return 1
}

start() { # engine N
    local log="$OUT/$1-n$2.log"
    if [ "$1" = llama ]; then
        # -c is shared by the slots (kv_unified off: CTX each); no web UI, no prompt cache
        # reuse across slots beyond what -np does by default (the prompts differ anyway)
        "$LLAMA_SERVER" -m "$G" -t "$THREADS" -np "$2" -c $(($2 * CTX)) --port "$PORT_L" \
            --host 127.0.0.1 --no-webui ${LLAMA_FLAGS:-} >"$log" 2>&1 &
        PIDS+=($!)
        PID_L=$!
        wait_health "http://127.0.0.1:$PORT_L" $! "$log"
    else
        # The queue and request timeouts are raised: with one request generating at a time,
        # the 16th client of a round waits behind the other 15's (120 s by default).
        local par=${SLUICE_PARALLEL:-"--parallel $2"}
        "$SLUICE" serve "${SLUICE_MODEL:-$G}" -t "$THREADS" -c "$CTX" $par --queue-timeout 3600 --timeout 3600 \
            --port "$PORT_S" --quiet ${SLUICE_FLAGS:-} >"$log" 2>&1 &
        PIDS+=($!)
        PID_S=$!
        wait_health "http://127.0.0.1:$PORT_S" $! "$log"
    fi
}

bench() { # engine N round
    local port=$PORT_L pid=${PID_L:-}
    [ "$1" = sluice ] && port=$PORT_S pid=${PID_S:-}
    ${PYTHON:-/usr/bin/python3} "$HERE/load_bench.py" --url "http://127.0.0.1:$port" -n "$2" -r "$R" --prompt-tokens "$PT" \
        --max-tokens "$GEN" --seed "$3" --label "$1" --pid "$pid" --json "$OUT/$1-n$2-r$3.json" \
        >"$OUT/$1-n$2-r$3.txt" 2>&1 || true # failures are in the JSON, counted in the table
    echo "round $3 $(head -1 "$OUT/$1-n$2-r$3.txt")"
}

table() { # DIR [MIN_CORES]
/usr/bin/python3 - "$1" "${2:-0}" <<'EOF'
# The table: per engine and N, the median over rounds of each figure; with MIN_CORES, only the
# runs whose server got at least that many cores (the others were starved by other work on this
# shared machine: their figures measure the neighbours).
import glob, json, os, re, statistics, sys
rows, min_cores, dropped = {}, float(sys.argv[2]), 0
for f in glob.glob(os.path.join(sys.argv[1], "*-n*-r*.json")):
    e, n = re.match(r"(\w+)-n(\d+)-r\d+\.json", os.path.basename(f)).groups()
    r = json.load(open(f))
    if min_cores and (r.get("server_cores_used") or 0) < min_cores:
        dropped += 1
        continue
    rows.setdefault((int(n), e), []).append(r)
if min_cores:
    print(f"runs whose server got >= {min_cores:g} cores ({dropped} others left out):")
def med(rs, k, s=1.0):
    v = [r[k] for r in rs if r.get(k) is not None]
    return statistics.median(v) * s if v else None
def f(v, d=1):
    return "-" if v is None else f"{v:.{d}f}"
print("| N | engine | runs | aggregate tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | failures | expert MB/token | server cores used | load avg |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (n, e) in sorted(rows):
    rs = rows[(n, e)]
    print(f"| {n} | {e} | {len(rs)} | {f(med(rs, 'aggregate_decode_tok_s'))} "
          f"| {f(med(rs, 'ttft_p50_s', 1e3), 0)} / {f(med(rs, 'ttft_p99_s', 1e3), 0)} "
          f"| {f(med(rs, 'itl_p50_s', 1e3))} / {f(med(rs, 'itl_p99_s', 1e3))} "
          f"| {sum(r['failures'] for r in rs)} | {f(med(rs, 'expert_bytes_per_token', 1e-6))} "
          f"| {f(med(rs, 'server_cores_used'), 2)} | {f(med(rs, 'loadavg_1m_end'))} |")
ns = sorted({n for n, _ in rows})
for n in ns:
    s, l = rows.get((n, "sluice")), rows.get((n, "llama"))
    if s and l:
        a, b = med(s, "aggregate_decode_tok_s"), med(l, "aggregate_decode_tok_s")
        if a and b:
            print(f"N={n}: sluice / llama-server aggregate {a / b:.2f}x")
s1 = rows.get((1, "sluice"))
for n in ns:
    s = rows.get((n, "sluice"))
    if s and s1 and n > 1:
        a, b = med(s, "aggregate_decode_tok_s"), med(s1, "aggregate_decode_tok_s")
        if a and b:
            print(f"N={n}: sluice aggregate {a / b:.2f}x its single-client rate")
EOF
}
if [ "$G" = --table ]; then
    table "${2:?--table DIR [MIN_CORES]}" "${3:-0}"
    exit 0
fi

echo "load_compare: $G, N in $NS, $ROUNDS rounds, R=$R PT=$PT GEN=$GEN -t $THREADS; output in $OUT"
for n in $NS; do
    for e in $ENGINES; do start "$e" "$n"; done
    for r in $(seq "$ROUNDS"); do
        order=$ENGINES
        [ $((r % 2)) = 0 ] && order=$(echo "$ENGINES" | tr ' ' '\n' | tac | tr '\n' ' ')
        for e in $order; do bench "$e" "$n" "$r"; done
    done
    stop_all
done
table "$OUT"
table "$OUT" "$(echo "$THREADS * 0.75" | bc -l)" # the runs that got 3/4 of their threads' cores
