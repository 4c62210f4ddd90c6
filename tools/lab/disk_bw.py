#!/usr/bin/env python3
"""The disk's O_DIRECT read bandwidth at a queue depth, as the expert store reads: blocks at
random aligned offsets of the given files, QD threads each with one read in flight (os.preadv
releases the GIL), for a few seconds. The streaming benchmarks' disk bound.

    tools/lab/disk_bw.py FILE... [--qd 16] [--block 2M] [--seconds 4]   -> "MB/s"
"""
import argparse, mmap, os, random, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("files", nargs="+")
ap.add_argument("--qd", type=int, default=16)
ap.add_argument("--block", default="2M")
ap.add_argument("--seconds", type=float, default=4)
a = ap.parse_args()
unit = {"K": 1 << 10, "M": 1 << 20}
bs = int(a.block[:-1]) * unit[a.block[-1]] if a.block[-1] in unit else int(a.block)
fds = [(os.open(f, os.O_RDONLY | os.O_DIRECT), os.path.getsize(f)) for f in a.files]
total = [0] * a.qd
stop = time.time() + a.seconds


def worker(i):
    buf = mmap.mmap(-1, bs)  # page-aligned
    rng = random.Random(i)
    while time.time() < stop:
        fd, size = fds[rng.randrange(len(fds))]
        off = rng.randrange(0, max(1, size - bs)) // 4096 * 4096
        total[i] += os.preadv(fd, [buf], off)


t0 = time.time()
th = [threading.Thread(target=worker, args=(i,)) for i in range(a.qd)]
for t in th:
    t.start()
for t in th:
    t.join()
print("%.0f" % (sum(total) / (time.time() - t0) / 1e6))
