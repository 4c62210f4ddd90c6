#!/usr/bin/env python3
"""Block-wise FP8 (Hugging Face's fine-grained FP8) <-> float, for sluice's tests.

Usage:
  python3 tools/fp8_convert.py dequantize IN OUT   # FP8 checkpoint -> its float twin
  python3 tools/fp8_convert.py quantize IN OUT [BR BC]  # float -> FP8 (blocks BR x BC, 128 x 128)

Standard library only (the tests run it with whatever python3 is on PATH), for tiny
checkpoints: one model.safetensors in, one out; config.json (and generation_config.json) are
copied, with quantization_config dropped (dequantize) or added (quantize).

dequantize: every F8_E4M3 tensor X with its X_scale_inv S (F32, one per 128 x 128 block)
becomes the F32 tensor w[r][c] = float32(fp8[r][c] * S[r // br][c // bc]): the product of an
e4m3 value (4 significant bits) and a float32 is exact in a double, so one rounding to float32,
as sluice's kernels do. The scale tensors are dropped; everything else is copied as it is.

quantize: the 2-D weights of linear layers (names ending in "proj.weight", the router and
shared_expert_gate kept) become e4m3 codes with per-block scale amax / 448, as the official
conversion does (round to nearest, ties to even, saturating at 448), stored as weight_scale_inv.
"""

import bisect
import json
import math
import os
import shutil
import struct
import sys

FP8_MAX = 448.0


def e4m3_value(b):
    if b & 0x7F == 0x7F:
        return float("nan")
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    return s * (m / 8.0 * 2.0**-6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))


E4M3 = [e4m3_value(b) for b in range(256)]
POS = E4M3[:0x7F]  # codes 0 .. 0x7e, increasing


def e4m3_code(v):
    """The nearest e4m3 code of v (ties to even), saturating at +-448."""
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if a >= FP8_MAX:
        return sign | 0x7E
    i = bisect.bisect_right(POS, a) - 1
    if i < 0x7E:
        dl, dh = a - POS[i], POS[i + 1] - a
        if dh < dl or (dh == dl and i & 1):
            i += 1
    return sign | i


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        out[name] = (h["dtype"], h["shape"], data[b:e])
    return out, meta


def write_st(path, tensors, meta=None):
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        dt, shape, raw = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if meta:
        header["__metadata__"] = meta
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def bf16_to_f32_list(raw):
    h = struct.unpack("<%dH" % (len(raw) // 2), raw)
    return struct.unpack("<%df" % len(h), struct.pack("<%dI" % len(h), *[x << 16 for x in h]))


def floats(dt, raw):
    if dt == "F32":
        return struct.unpack("<%df" % (len(raw) // 4), raw)
    if dt == "BF16":
        return bf16_to_f32_list(raw)
    raise ValueError("dtype %s" % dt)


def block_size(cfg):
    q = cfg.get("quantization_config") or {}
    bs = q.get("weight_block_size") or [128, 128]
    return int(bs[0]), int(bs[1])


def dequantize(tensors, br, bc):
    out = {}
    for name, (dt, shape, raw) in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if dt != "F8_E4M3":
            out[name] = (dt, shape, raw)
            continue
        sdt, sshape, sraw = tensors[name + "_scale_inv"]
        assert sdt == "F32", name
        cols = shape[-1]
        rows = len(raw) // cols
        rpm = shape[-2]  # rows per matrix (3-D: experts stacked)
        ncb = sshape[-1]
        srpm = sshape[-2]
        sc = struct.unpack("<%df" % (len(sraw) // 4), sraw)
        vals = []
        for r in range(rows):
            mat, rr = divmod(r, rpm)
            srow = (mat * srpm + rr // br) * ncb
            row = raw[r * cols : (r + 1) * cols]
            vals.extend(E4M3[b] * sc[srow + c // bc] for c, b in enumerate(row))
        out[name] = ("F32", shape, struct.pack("<%df" % len(vals), *vals))
    return out


def quantizable(name, shape):
    return (
        len(shape) == 2
        and name.endswith("proj.weight")
        and "shared_expert_gate" not in name
        and not name.endswith("mlp.gate.weight")
    )


def quantize(tensors, br, bc):
    out = {}
    for name, (dt, shape, raw) in tensors.items():
        if not quantizable(name, shape):
            out[name] = (dt, shape, raw)
            continue
        w = floats(dt, raw)
        R, C = shape
        nrb, ncb = -(-R // br), -(-C // bc)
        scales = []
        for i in range(nrb):
            for j in range(ncb):
                amax = 0.0
                for r in range(i * br, min(R, (i + 1) * br)):
                    base = r * C
                    for c in range(j * bc, min(C, (j + 1) * bc)):
                        amax = max(amax, abs(w[base + c]))
                scales.append(f32(amax / FP8_MAX) if amax > 0 else 1.0)
        codes = bytearray(R * C)
        for r in range(R):
            base = r * C
            for c in range(C):
                s = scales[(r // br) * ncb + c // bc]
                codes[base + c] = e4m3_code(f32(w[base + c] / s))
        out[name] = ("F8_E4M3", shape, bytes(codes))
        out[name + "_scale_inv"] = ("F32", [nrb, ncb], struct.pack("<%df" % len(scales), *scales))
    return out


def main():
    if len(sys.argv) not in (4, 6) or sys.argv[1] not in ("dequantize", "quantize"):
        sys.exit(__doc__)
    mode, src, dst = sys.argv[1:4]
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    tensors, meta = read_st(os.path.join(src, "model.safetensors"))
    if mode == "dequantize":
        br, bc = block_size(cfg)
        out = dequantize(tensors, br, bc)
        cfg.pop("quantization_config", None)
    else:
        br, bc = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) == 6 else (128, 128)
        out = quantize(tensors, br, bc)
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [br, bc],
        }
    write_st(os.path.join(dst, "model.safetensors"), out, meta)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    g = os.path.join(src, "generation_config.json")
    if os.path.exists(g):
        shutil.copy(g, dst)


if __name__ == "__main__":
    main()
