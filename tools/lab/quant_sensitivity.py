#!/usr/bin/env python3
"""How far a fixture's logits move when some of its weights move: a copy of the checkpoint
(F32) whose tensors matching REGEX are replaced by what `sluice pack --quant int8|int4` makes
of them (sl_quantize_row replayed: groups of 64 per row, min rounded down to BF16 as the bias,
(max - bias) / qmax rounded up to BF16 as the scale), or given Gaussian noise of relative size
EPS (noiseEPS), both run in float by `sluice logits` against the unchanged copy. Prints the
relative L2 of the logits and, with -v, each tensor's own relative error.

    python3 tools/lab/quant_sensitivity.py [-v] BIN CASE int8|int4|noiseEPS REGEX [SCALE...]

SCALE: multiply the matching tensors of the base model first, e.g. 'q_norm=0.25' (the same
change in both runs). numpy: /usr/bin/python3. What it found: tests/fixtures/fam/README.md.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "fam")


def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    out = {}
    for k, v in json.loads(b[8:8 + n]).items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, {"F32": np.float32, "F16": np.float16, "I64": np.int64,
                                    "U8": np.uint8}[v["dtype"]])
        out[k] = a.reshape(v["shape"]).astype(np.float64) if a.dtype != np.int64 else a
    return out


def save(path, tensors):
    hdr, blobs, off = {}, [], 0
    for k, a in tensors.items():
        dt = "I64" if a.dtype == np.int64 else "F32"
        b = (a if dt == "I64" else a.astype(np.float32)).tobytes()
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16(v, up):
    """The nearest BF16 at or above (up) / at or below v, as float64 (v finite)."""
    f = v.astype(np.float32)
    f = np.where(f > v if not up else f < v, np.nextafter(f, np.float32(np.inf if up else -np.inf)), f)
    u = f.view(np.uint32)
    h = u >> 16
    inexact = (u & 0xFFFF) != 0
    h = np.where(inexact & ((u >> 31 == 0) if up else (u >> 31 == 1)), h + 1, h)
    return (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def quantise(w, qmax):
    """A [..., K] array as sluice's pack stores and reads it back."""
    out = np.empty_like(w)
    for k0 in range(0, w.shape[-1], 64):
        g = w[..., k0:k0 + 64]
        b = bf16(g.min(-1), up=False)
        r = g.max(-1) - b
        s = np.where(r > 0, bf16(np.where(r > 0, r, 1.0) / qmax, up=True), 1.0)
        q = np.clip(np.floor((g - b[..., None]) / s[..., None] + 0.5), 0, qmax)
        out[..., k0:k0 + 64] = q * s[..., None] + b[..., None]
    return out


def logits(binary, case, tensors, tmp, tag):
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    for f in os.listdir(os.path.join(FIX, case)):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(FIX, case, f), d)
    save(os.path.join(d, "model.safetensors"), tensors)
    ids = ",".join(map(str, json.load(open(os.path.join(d, "ref.json")))["ids"]))
    subprocess.run([binary, "logits", d, "--ids", ids, "--out", d + "/l.f32"], check=True,
                   stderr=subprocess.DEVNULL)
    return np.fromfile(d + "/l.f32", np.float32).astype(np.float64)


def main():
    args = sys.argv[1:]
    verbose = "-v" in args
    args = [a for a in args if a != "-v"]
    binary, case, how, pat = args[:4]
    base = load(os.path.join(FIX, case, "model.safetensors"))
    for sc in args[4:]:
        p, f = sc.rsplit("=", 1)
        for k in base:
            if re.search(p, k):
                base[k] = base[k] * float(f)
    rng = np.random.default_rng(int(os.environ.get("SEED", "1")))
    moved = dict(base)
    for k, a in base.items():
        if a.ndim < 2 or a.dtype == np.int64 or not re.search(pat, k):
            continue
        if how.startswith("noise"):
            moved[k] = a + float(how[5:]) * np.sqrt((a ** 2).mean()) * rng.standard_normal(a.shape)
        else:
            moved[k] = quantise(a, {"int8": 255, "int4": 15}[how])
        if verbose:
            print("%-64s %s rel %.4g" % (k, list(a.shape),
                                         np.linalg.norm(moved[k] - a) / np.linalg.norm(a)))
    with tempfile.TemporaryDirectory() as tmp:
        a = logits(binary, case, base, tmp, "base")
        b = logits(binary, case, moved, tmp, "moved")
    print("logits rel L2 %.4g" % (np.linalg.norm(a - b) / np.linalg.norm(a)))


if __name__ == "__main__":
    main()
