#!/usr/bin/env python3
"""Synthetic routing traces (src/moe/trace.h's format) with the structure real routers show,
for judging expert-cache policies before traces of a trained model exist:

  - skewed popularity: per layer and topic, expert weights follow a Zipf law (exponent --zipf)
    over a random order of the experts;
  - drift: the text changes topic now and then (a new document every --doc tokens on average),
    and each topic has its own order, so what is popular moves; topics recur;
  - temporal locality: each token keeps each of the previous token's experts at that layer with
    probability --repeat, the rest drawn by popularity;
  - prefill: each document starts with a prompt of --prompt tokens as one chunk (one step);
  - predictions (kind 1, --recall R): each token's picks with each id swapped for a popular other
    one with probability 1 - R, written before the layer's picks.

Plain Python (no numpy): tools/lab/trace_synth.py OUT [--tokens N] [--layers L] ...
"""
import argparse
import bisect
import random
import struct


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--topics", type=int, default=8)
    ap.add_argument("--doc", type=int, default=1000, help="mean tokens per document")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens (one chunk) a document")
    ap.add_argument("--repeat", type=float, default=0.35)
    ap.add_argument("--recall", type=float, default=0.0, help="write predictions of this recall")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    E, K, L = a.experts, a.k, a.layers
    zipf = [1.0 / (r + 1) ** a.zipf for r in range(E)]
    # cumulative weights per (topic, layer): expert order a random permutation
    cum = []
    for _t in range(a.topics):
        per = []
        for _l in range(L):
            order = list(range(E))
            rng.shuffle(order)
            w = [0.0] * E
            for rank, e in enumerate(order):
                w[e] = zipf[rank]
            c, s = [], 0.0
            for x in w:
                s += x
                c.append(s)
            per.append(c)
        cum.append(per)

    def draw(c, have):
        while True:
            e = bisect.bisect_left(c, rng.random() * c[-1])
            e = min(e, E - 1)
            if e not in have:
                return e

    out = bytearray(b"SLTRACE1" + struct.pack("<IIII", L, E, K, 0))
    prev = [None] * L
    topic = rng.randrange(a.topics)
    step, done, left = 0, 0, 0
    while done < a.tokens:
        chunk = 1
        if left <= 0:  # a new document: a topic, and its prompt as one chunk
            topic = rng.randrange(a.topics)
            left = max(1, int(rng.expovariate(1.0 / a.doc)))
            chunk = min(a.prompt, a.tokens - done)
            prev = [None] * L
        for l in range(L):
            c = cum[topic][l]
            picks = []
            for _ in range(chunk):
                have = []
                if prev[l]:
                    for e in prev[l]:
                        if rng.random() < a.repeat:
                            have.append(e)
                while len(have) < K:
                    have.append(draw(c, have))
                rng.shuffle(have)
                picks.append(have)
                prev[l] = have
            if a.recall > 0:
                for p in picks:
                    q = []
                    for e in p:
                        if rng.random() >= a.recall:
                            e = draw(c, p + q)
                        if e not in q:
                            q.append(e)
                    out += struct.pack("<IHBB", step, l, 1, len(q)) + struct.pack("<%dH" % len(q), *q)
            for p in picks:
                out += struct.pack("<IHBB", step, l, 0, len(p)) + struct.pack("<%dH" % len(p), *p)
        step += 1
        done += chunk
        left -= chunk
    with open(a.out, "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main()
