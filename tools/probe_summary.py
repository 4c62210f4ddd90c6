#!/usr/bin/env python3
"""Summarises an in-kernel probe (tools/probe_cuda.sh; CU_PROBE in cuda_common.cuh). The block
records are grouped into launches (a tag, and starts less than GAP us apart), and for each
kind of kernel it prints the medians over its launches of: blocks; span (first block start to
last block exit); adds (its last exit minus the previous launch's: what it adds to the chain of
kernels, as in tools/trace_summary.py); pre (a block's start to its wait's return, median
block); post (that return to the block's last thread's exit: median block and slowest block).
Times from clock64 cycles, at the clock rate the records give against globaltimer.
   tools/probe_summary.py probe.bin [FRACTION_TO_SKIP=0.5]"""
import collections, statistics, struct, sys

GAP = 15000  # ns: a kernel kind recurs once a layer (~48 us at Qwen3-30B-A3B shapes)
NAMES = {11: "gemv_fast R1 (o-proj)", 12: "gemv_fast R2", 14: "gemv_fast R4 (LM head)",
         21: "gemv_fast_batch R1 (q/k/v)", 22: "gemv_fast_batch R2", 24: "gemv_fast_batch R4",
         30: "router_gemv", 31: "router_cluster", 41: "moe_gate_up R1", 42: "moe_gate_up R2", 44: "moe_gate_up R4",
         51: "moe_down_sum R1", 52: "moe_down_sum R2", 54: "moe_down_sum R4",
         58: "moe_down_sum R8", 60: "attn_kernel", 61: "attn_kernel + prep",
         70: "add_rmsnorm_kernel", 71: "rmsnorm_kernel", 80: "embed_kernel", 90: "l2_ahead_kernel"}

data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack_from("<I", data)
recs = [struct.unpack_from("<QQIIHHI", data, 4 + 32 * i) for i in range(n)]
if not recs:
    sys.exit("no records")
long = [r[3] / (r[1] - r[0]) for r in recs if r[1] - r[0] > 3000 and r[3] > 0]
ghz = statistics.median(long) if long else 1.98  # cycles per ns
recs.sort(key=lambda r: r[0])
t_skip = recs[0][0] + (recs[-1][0] - recs[0][0]) * float(sys.argv[2] if len(sys.argv) > 2 else 0.5)
launches, open_by_tag = [], {}
for r in recs:
    if r[0] < t_skip:
        continue
    g = open_by_tag.get(r[4])
    if g is None or r[0] - g[-1][0] > GAP:
        g = []
        launches.append((r[4], g))
        open_by_tag[r[4]] = g
    g.append(r)
rows = collections.defaultdict(lambda: collections.defaultdict(list))
prev_end = None
for tag, g in sorted(launches, key=lambda l: max(r[1] for r in l[1])):
    end = max(r[1] for r in g)
    m = rows[tag]
    m["blocks"].append(len(g))
    m["span"].append((end - min(r[0] for r in g)) / 1e3)
    if prev_end is not None:
        m["adds"].append((end - prev_end) / 1e3)
    prev_end = end
    m["pre"].append(statistics.median(r[2] for r in g) / ghz / 1e3)
    post = [(r[3] - r[2]) / ghz / 1e3 for r in g]
    m["post"].append(statistics.median(post))
    m["post_max"].append(max(post))
med = lambda v: statistics.median(v) if v else float("nan")
print(f"{n} block records, {len(launches)} launches after the first "
      f"{float(sys.argv[2] if len(sys.argv) > 2 else 0.5):.0%} of the time; clock {ghz:.3f} GHz")
print(f"{'launches':>8} {'blocks':>6} {'span':>6} {'adds':>6} {'pre':>6} {'post':>6} {'slowest':>7}  kernel (us, medians)")
for tag, m in sorted(rows.items(), key=lambda x: -len(x[1]["span"]) * med(x[1]["adds"])):
    print(f"{len(m['span']):8d} {med(m['blocks']):6.0f} {med(m['span']):6.2f} {med(m['adds']):6.2f}"
          f" {med(m['pre']):6.2f} {med(m['post']):6.2f} {med(m['post_max']):7.2f}  {NAMES.get(tag, tag)}")
