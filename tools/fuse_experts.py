#!/usr/bin/env python3
"""Rewrites a Hugging Face checkpoint's routed experts from the per-expert layout
(mlp.experts.{e}.{gate,up,down}_proj.weight) into the fused 3-D layout transformers 5
keeps in memory (mlp.experts.gate_up_proj [E, 2I, H], gate rows first;
mlp.experts.down_proj [E, H, I]). With --in-out, into the fused layout transposed, in x out,
as the published Qwen3-VL-MoE checkpoints hold it (gate_up_proj [E, H, 2I], gate columns
first; down_proj [E, I, H]); the source may then be fused already. Values are unchanged, so a
fixture's reference logits stay valid. Standard library only.

    python3 tools/fuse_experts.py [--in-out] SRC_DIR DST_DIR
"""
import json
import os
import re
import shutil
import struct
import sys

ES = {"F32": 4, "F16": 2, "BF16": 2}


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def transpose(blob, rows, cols, es):
    """A row-major [rows, cols] matrix of es-byte elements as [cols, rows]."""
    out = bytearray(len(blob))
    for r in range(rows):
        for c in range(cols):
            o, i = (c * rows + r) * es, (r * cols + c) * es
            out[o:o + es] = blob[i:i + es]
    return bytes(out)


def main():
    args = sys.argv[1:]
    in_out = "--in-out" in args
    src, dst = [a for a in args if a != "--in-out"]
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    header, data = read_st(os.path.join(src, "model.safetensors"))
    meta = header.pop("__metadata__", {"format": "pt"})
    per = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    fused = re.compile(r"^(.*\.mlp\.experts)\.(gate_up|down)_proj$")
    # experts[prefix][e] = {"gate": blob [I, H], "up": ..., "down": blob [H, I]}, as nn.Linear
    experts, out, dims = {}, {}, {}
    for key, t in header.items():
        blob = data[t["data_offsets"][0]:t["data_offsets"][1]]
        m, f = per.match(key), fused.match(key) if in_out else None
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = blob
            if m.group(3) == "gate":
                dims[m.group(1)] = (t["dtype"], t["shape"][0], t["shape"][1])
        elif f:
            E, R, C = t["shape"]
            n = len(blob) // E
            for e in range(E):
                d = experts.setdefault(f.group(1), {}).setdefault(e, {})
                b = blob[e * n:(e + 1) * n]
                if f.group(2) == "down":
                    d["down"] = b
                else:
                    d["gate"], d["up"] = b[:n // 2], b[n // 2:]
                    dims[f.group(1)] = (t["dtype"], R // 2, C)
        else:
            out[key] = (t["dtype"], t["shape"], blob)
    for prefix, parts in experts.items():
        n = len(parts)
        dtype, inter, hidden = dims[prefix]
        es = ES[dtype]
        gu = [parts[e]["gate"] + parts[e]["up"] for e in range(n)]
        down = [parts[e]["down"] for e in range(n)]
        if in_out:
            gu = [transpose(b, 2 * inter, hidden, es) for b in gu]
            down = [transpose(b, hidden, inter, es) for b in down]
        gshape = [n, hidden, 2 * inter] if in_out else [n, 2 * inter, hidden]
        dshape = [n, inter, hidden] if in_out else [n, hidden, inter]
        out[prefix + ".gate_up_proj"] = (dtype, gshape, b"".join(gu))
        out[prefix + ".down_proj"] = (dtype, dshape, b"".join(down))
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
    print(f"{dst}: fused {len(experts)} expert layers{' in x out' if in_out else ''}")


if __name__ == "__main__":
    main()
