#!/usr/bin/env python3
"""Reference block choices of torch.topk on the CPU with ties (for QSA's sl_qsa_pick).

Usage:  python3 tools/make_topk_ties.py OUT.json      (needs torch; ran on the GPU machine's CPU)

torch.topk breaks ties by the order its selection algorithm leaves equal scores in, not by
index; QSA's indexer scores blocks through relu, so equal (zero) scores are common and the
blocks chosen among them change the output.  Each case: n scores that are small integers
(JSON stays exact: the score is the integer itself), many of them equal, k, and the sorted
indices torch.topk(scores, k).indices returned for float32 scores.  Sizes cover the
nth_element path (64 k > n) and the partial_sort path (64 k <= n).
"""
import json
import sys

import torch

g = torch.Generator().manual_seed(1234)
cases = []


def add(n, k, levels, zero_share):
    v = torch.randint(1, levels + 1, (n,), generator=g)
    z = torch.rand(n, generator=g) < zero_share
    v[z] = 0
    idx = v.float().topk(k).indices.tolist()
    cases.append([k, v.tolist(), sorted(idx)])


for i in range(1500):
    n = int(torch.randint(2, 70, (1,), generator=g))
    k = int(torch.randint(1, min(n, 13), (1,), generator=g)) if n > 1 else 1
    add(n, k, [1, 2, 3, 5, 50][i % 5], [0.3, 0.6, 0.9, 0.97][i % 4])
for i in range(60):  # partial_sort: 64 k <= n
    k = 1 + i % 4
    add(64 * k + int(torch.randint(0, 40, (1,), generator=g)), k, [1, 3, 50][i % 3], [0.5, 0.9][i % 2])
for i in range(40):  # deep recursions: long runs of equal scores
    n = int(torch.randint(100, 250, (1,), generator=g))
    add(n, int(torch.randint(1, 4, (1,), generator=g)), 2, 0.95)
with open(sys.argv[1], "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases}, f, separators=(",", ":"))
print("%d cases" % len(cases))
