#!/usr/bin/env python3
"""Summarises a tools/lab/trace_cuda.c timeline (decode steps): per kernel its count, median
duration, median gap since the previous kernel ended (negative: dependent launch started it
earlier), median "adds" (its end minus the previous kernel's end: what it adds to the chain,
the figure that counts when dependent launch overlaps kernels; the adds sum to the span) and
median lead (its start minus the end of the host call that launched it: near zero means the
GPU waited for the host); then the GPU's busy share of the span and the host's time per
launch.
   tools/lab/trace_summary.py trace.csv [FRACTION_TO_SKIP=0.5]"""
import collections, statistics, subprocess, sys

kern, api = [], {}
for line in open(sys.argv[1]):
    kind, s, e, corr, name = line.rstrip("\n").split(",", 4)
    if kind == "K":
        kern.append((int(s) / 1e3, int(e) / 1e3, int(corr), name))
    else:
        api[int(corr)] = (int(s) / 1e3, int(e) / 1e3)
kern.sort()
kern = kern[int(len(kern) * float(sys.argv[2] if len(sys.argv) > 2 else 0.5)):]
names = sorted({k[3] for k in kern})
try:
    dem = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.split("\n")
except (OSError, subprocess.CalledProcessError):
    dem = names
short = {n: d.split("(")[0].replace("void ", "")[:44] for n, d in zip(names, dem)}
agg = collections.defaultdict(lambda: ([], [], [], []))
busy, reach, prev_end, host = 0.0, kern[0][0], None, []
for s, e, corr, n in kern:
    a = agg[short[n]]
    a[0].append(e - s)
    if prev_end is not None:
        a[1].append(s - prev_end)
        a[3].append(e - prev_end)
    if corr in api:
        a[2].append(s - api[corr][1])
        host.append(api[corr][1] - api[corr][0])
    busy += max(0.0, e - max(s, reach))
    reach, prev_end = max(reach, e), e
span = kern[-1][1] - kern[0][0]
med = lambda v: statistics.median(v) if v else float("nan")
print(f"{len(kern)} kernels over {span:.1f} us: GPU busy {busy:.1f} us ({100 * busy / span:.1f}%),"
      f" host {med(host):.2f} us per launch call (median)")
print(f"{'count':>6} {'total us':>9} {'median':>7} {'gap':>6} {'adds':>6} {'lead':>7}  kernel")
for n, (d, g, l, ad) in sorted(agg.items(), key=lambda x: -sum(x[1][0])):
    print(f"{len(d):6d} {sum(d):9.1f} {med(d):7.2f} {med(g):6.2f} {med(ad):6.2f} {med(l):7.1f}  {n}")
