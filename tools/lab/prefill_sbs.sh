#!/usr/bin/env bash
# Side by side (issue 28), on the machine tools/lab/prefill_cuda.sh left warm (its builds and
# models): llama.cpp and sluice alternated at 8 and 48 layers, 512 / 4,096 / 16,384-token
# prompts, decode, experts in host RAM (llama.cpp -ot exps=CPU; sluice --gpu-experts 32 of 128),
# a CUPTI kernel table; medians in $OUT/summary.txt.   OUT=/some/dir tools/lab/prefill_sbs.sh
. tools/lab/device_env.sh
LLB=build-cuda/ll/build/bin/llama-bench; S=build-cuda/sluice
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
[ -d $W/int4-48 ] || { build-cuda/sluice pack $W/src48 $W/int4-48 --quant int4 > $OUT/pack48.log 2>&1; el "packed 48"; }
# llama L mode pp tg extra...
llama() { local L=$1 m=$2 pp=$3 tg=$4; shift 4
  [ -x $LLB ] || return 0
  local g=$W/a8.gguf; [ $L = 48 ] && g=$W/a48.gguf
  $LLB -m $g -p $pp -n $tg -r 1 -o jsonl "$@" 2>$OUT/ll.err | python3 -c '
import sys, json
for l in sys.stdin:
    try: j = json.loads(l)
    except ValueError: continue
    k = "pp%d" % j["n_prompt"] if j["n_prompt"] else "tg%d" % j["n_gen"]
    print(sys.argv[1], sys.argv[2], k, "llama.cpp", "%.2f" % j["avg_ts"])' $L $m | tee -a $OUT/sbs.txt
  [ ${PIPESTATUS[0]} = 0 ] || tail -3 $OUT/ll.err; }
sluice() { local L=$1 m=$2 pp=$3 tg=$4; shift 4
  local p=$W/int4; [ $L = 48 ] && p=$W/int4-48
  local line; line=$($S generate $p --ids "$(seq -s, 1 $pp)" -n $((tg + 1)) "$@" 2>&1 >/dev/null | grep prompt)
  echo "$L $m pp$pp sluice $(echo "$line" | sed -E 's/.*prompt [0-9]+ tok, ([0-9.]+) tok.s.*/\1/')" | tee -a $OUT/sbs.txt
  [ $tg -gt 0 ] && echo "$L $m tg$tg sluice $(echo "$line" | sed -E 's/.*decode [0-9]+ tok, ([0-9.]+) tok.s.*/\1/')" | tee -a $OUT/sbs.txt; }
# in the order of what matters most, while the call has time
if [ -d $W/int4-48 ]; then
  for r in 1 2; do
    [ $(left) -gt 60 ] || break
    if [ $r = 1 ]; then llama 48 res 512 64 -ngl 99; sluice 48 res 512 64 --experts resident
    else sluice 48 res 512 64 --experts resident; llama 48 res 512 64 -ngl 99; fi
  done
  el "48 res done"
  if [ $(left) -gt 90 ]; then
    llama 48 host 512 32 -ngl 99 -ot exps=CPU -t 16; sluice 48 host 512 32 --gpu-experts 32
  fi
  el "host done"
fi
for r in 1 2 3; do
  [ $(left) -gt 30 ] || break
  llama 8 res 512 0 -ngl 99; sluice 8 res 512 0 --experts resident
done
el "8 layers done"
if [ -d $W/int4-48 ]; then
  for pp in 4096 16384; do
    [ $(left) -gt 80 ] || break
    llama 48 res $pp 0 -ngl 99; sluice 48 res $pp 0 --experts resident
  done
  el "long done"
fi
if [ $(left) -gt 40 ]; then
  CUDA=$(dirname "$(dirname "$(command -v nvcc)")")
  LIB=$(dirname "$(find "$CUDA"/ -name 'libcupti.so' | head -1)"); INC=$(dirname "$(find "$CUDA"/ -name cupti.h | head -1)")
  cc -O2 -shared -fPIC -I"$INC" -o $W/trace_cuda.so tools/lab/trace_cuda.c -L"$LIB" -lcupti && \
  TRACE_OUT=$OUT/trace.csv LD_PRELOAD=$W/trace_cuda.so LD_LIBRARY_PATH="$LIB:$LD_LIBRARY_PATH" \
    $S generate $W/int4 --ids "$(seq -s, 1 512)" -n 1 --experts resident > /dev/null 2>&1
  python3 tools/lab/trace_summary.py $OUT/trace.csv 0 > $OUT/trace_sum.txt 2>&1; head -40 $OUT/trace_sum.txt; rm -f $OUT/trace.csv
fi
python3 - $OUT/sbs.txt <<'PY' | tee $OUT/summary.txt
import sys, statistics as st, collections as c
d = c.defaultdict(list)
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) == 5:
        try: d[tuple(f[:4])].append(float(f[4]))
        except ValueError: pass
keys = sorted({k[:3] for k in d})
for k in keys:
    a, b = d.get(k + ("llama.cpp",), []), d.get(k + ("sluice",), [])
    ma = st.median(a) if a else float('nan'); mb = st.median(b) if b else float('nan')
    print(f"{k[0]:>3} layers {k[1]:5} {k[2]:8} llama.cpp {ma:10.1f} ({len(a)})  sluice {mb:10.1f} ({len(b)})  ratio {mb/ma:5.2f}")
PY
el done
