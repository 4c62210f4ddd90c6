#!/usr/bin/env python3
"""Rewrites a Hugging Face checkpoint's routed experts from the per-expert layout
(mlp.experts.{e}.{gate,up,down}_proj.weight) into the fused 3-D layout transformers 5
keeps in memory (mlp.experts.gate_up_proj [E, 2I, H], gate rows first;
mlp.experts.down_proj [E, H, I]). Values are unchanged, so a fixture's reference
logits stay valid. Standard library only.

    python3 tools/fuse_experts.py SRC_DIR DST_DIR
"""
import json
import os
import re
import shutil
import struct
import sys


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def main():
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    header, data = read_st(os.path.join(src, "model.safetensors"))
    meta = header.pop("__metadata__", {"format": "pt"})
    pat = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    experts, out = {}, {}
    for key, t in header.items():
        m = pat.match(key)
        blob = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = (t, blob)
        else:
            out[key] = (t["dtype"], t["shape"], blob)
    for prefix, parts in experts.items():
        n = 1 + max(e for e, _ in parts)
        g0 = parts[(0, "gate")][0]
        inter, hidden = g0["shape"]
        gu = b"".join(parts[(e, "gate")][1] + parts[(e, "up")][1] for e in range(n))
        down = b"".join(parts[(e, "down")][1] for e in range(n))
        out[prefix + ".gate_up_proj"] = (g0["dtype"], [n, 2 * inter, hidden], gu)
        out[prefix + ".down_proj"] = (g0["dtype"], [n, hidden, inter], down)
    hdr, blobs, off = {"__metadata__": meta}, [], 0
    for key in sorted(out):
        dtype, shape, blob = out[key]
        hdr[key] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    hj = json.dumps(hdr, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for b in blobs:
            f.write(b)
    print(f"{dst}: fused {len(experts)} expert layers")


if __name__ == "__main__":
    main()
