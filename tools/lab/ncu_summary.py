#!/usr/bin/env python3
"""Sums an ncu --csv run of gpu__time_duration.sum per kernel (a profile of decode steps):
   ncu --metrics gpu__time_duration.sum --csv ... > prof.csv; tools/lab/ncu_summary.py prof.csv"""
import collections, csv, sys

SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
head, agg, total = None, collections.defaultdict(lambda: [0, 0.0]), 0.0
for row in csv.reader(open(sys.argv[1])):
    if "Kernel Name" in row:
        head = row
        continue
    if not head or len(row) != len(head):
        continue
    d = dict(zip(head, row))
    if d.get("Metric Name") != "gpu__time_duration.sum":
        continue
    us = float(d["Metric Value"].replace(",", "")) * SCALE.get(d["Metric Unit"], 1.0)
    name = d["Kernel Name"].split("(")[0][:60]
    agg[name][0] += 1
    agg[name][1] += us
    total += us
print(f"{sum(a[0] for a in agg.values())} kernels, {total:.1f} us")
for name, (n, us) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{n:6d} {us:10.1f} us {us / n:8.2f} us each  {name}")
