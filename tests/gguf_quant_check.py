#!/usr/bin/env python3
"""Checks sluice against llama.cpp on one quantised GGUF fixture (tests/fixtures/gguf_quant).

  gguf_quant_check.py V BOUND SLUICE_PROMPT.f32 LLAMA_PROMPT.f32 SLUICE_FORCED.f32 GREEDY_IDS

SLUICE_PROMPT / LLAMA_PROMPT: the prompt's logits (T x V float32) from each engine, or only the
last rows of the prompt in LLAMA_PROMPT (those are compared); their relative L2 distance must be
at most BOUND (llama.cpp quantises activations, sluice's kernels
round differently: the engines agree to a type's own precision, not bit for bit).
SLUICE_FORCED: sluice's logits over the prompt followed by llama.cpp's greedy ids (teacher
forcing); at each of those positions sluice's argmax must be llama.cpp's next greedy id
wherever sluice's own top-2 gap exceeds the rounding both engines may differ by (4 BOUND times
the row's largest |logit|): the same greedy continuation where the gap allows.
Prints the distance and the agreement on one line; exit status 1 on a failure.
"""
import array
import math
import sys


def rows(path, V):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    assert len(a) % V == 0, path
    return [a[i:i + V] for i in range(0, len(a), V)]


def main():
    V, bound = int(sys.argv[1]), float(sys.argv[2])
    s, l = rows(sys.argv[3], V), rows(sys.argv[4], V)
    forced = rows(sys.argv[5], V)
    greedy = [int(x) for x in open(sys.argv[6]).read().strip().split(",")]
    T = len(s)
    s = s[T - len(l):]
    num = sum((x - y) ** 2 for a, b in zip(s, l) for x, y in zip(a, b))
    den = sum(y * y for b in l for y in b)
    rel = math.sqrt(num / den)
    checked = agree = 0
    for i, want in enumerate(greedy):
        r = forced[T - 1 + i]
        top = sorted(range(V), key=lambda v: -r[v])[:2]
        gap = r[top[0]] - r[top[1]]
        if gap <= 4 * bound * max(abs(x) for x in r):
            continue
        checked += 1
        agree += top[0] == want
    ok = rel <= bound and agree == checked
    print("rel L2 %.2e (bound %.0e); greedy %d/%d where the gap allows (of %d)"
          % (rel, bound, agree, checked, len(greedy)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
