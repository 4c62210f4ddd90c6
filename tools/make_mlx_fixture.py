#!/usr/bin/python3
"""Turns a Hugging Face MoE checkpoint (a tests/fixtures case) into an MLX one, as mlx-lm's
convert would write it, and writes its dequantised twin.

    make_mlx_fixture.py SRC MLX_DIR DEQ_DIR [--bits 4] [--group 64] [--sdtype bf16]
                        [--layout switch|experts] [--router-bits 8]

MLX_DIR: config.json with "quantization" (and "quantization_config") {group_size, bits} plus
per-module overrides for the routers (mlp.gate, shared_expert_gate: --router-bits, groups of
64, as mlx-lm's qwen MoE models ask); model.safetensors where every Linear and Embedding whose
input dim is a multiple of the group is quantised (X.weight U32 codes, X.scales, X.biases in
--sdtype), the rest kept as they were. Routed experts fused as
model.layers.N.mlp.switch_mlp.{gate,up,down}_proj [E, out, in] (--layout switch), or one set
per expert (--layout experts).

DEQ_DIR: the same model in float32 safetensors, Hugging Face names and per-expert layout, with
every quantised weight replaced by w = scale * q + bias (float32 arithmetic on the stored
scale and bias): what the MLX checkpoint means, for a parity test against it.

Quantisation follows mlx.core.quantize (affine): per group of the row, scale = (max - min) /
(2^bits - 1) (at least 1e-7), negated unless |min| > |max|; edge = min if |min| > |max| else
max; q0 = round(edge / scale); if q0 != 0: scale = edge / q0, bias = edge, else bias = 0; then
q = clip(round((w - bias) / scale), 0, 2^bits - 1). mlx computes in the model's dtype; here the
arithmetic is float32 and scale and bias are rounded to --sdtype before the codes are taken,
so the codes are exactly those of the stored scale and bias. numpy only.
"""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_convert import read_st, write_st  # noqa: E402  (the tools' safetensors reader/writer)

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32}


def read_safetensors(path):
    out = {}
    for name, (dt, shape, raw) in read_st(path)[0].items():
        a = np.frombuffer(raw, dtype=ST_DTYPES[dt]).reshape(shape)
        if dt == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = (np.asarray(a, dtype=np.float32), dt)
    return out


def read_checkpoint(src):
    index = os.path.join(src, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(src, f)))
    return tensors


def to_bf16_bits(a):
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def round_to(a, sdtype):
    """float32 values rounded to sdtype, and the array to store."""
    if sdtype == "F32":
        return a.astype(np.float32), a.astype(np.float32)
    if sdtype == "F16":
        h = a.astype(np.float16)
        return h.astype(np.float32), h
    b = to_bf16_bits(a)
    return (b.astype(np.uint32) << 16).view(np.float32), b


def write_safetensors(path, tensors):
    write_st(path, {name: (dt, list(arr.shape), np.ascontiguousarray(arr).tobytes())
                    for name, (arr, dt) in tensors.items()}, {"format": "mlx"})


def quantize(w, bits, group, sdtype):
    """w [..., out, in] float32 -> (codes U32 [..., out, in*bits/32], scales, biases (stored),
    dequantised float32 w)."""
    shape = w.shape
    n_bins = float((1 << bits) - 1)
    g = w.reshape(-1, shape[-1] // group, group).astype(np.float32)
    w_max = g.max(axis=-1, keepdims=True)
    w_min = g.min(axis=-1, keepdims=True)
    mask = np.abs(w_min) > np.abs(w_max)
    scales = np.maximum((w_max - w_min) / np.float32(n_bins), np.float32(1e-7)).astype(np.float32)
    scales = np.where(mask, scales, -scales)
    edge = np.where(mask, w_min, w_max)
    q0 = np.round(edge / scales)
    safe_q0 = np.where(q0 != 0, q0, 1).astype(np.float32)
    scales = np.where(q0 != 0, edge / safe_q0, scales).astype(np.float32)
    biases = np.where(q0 == 0, np.float32(0), edge).astype(np.float32)
    scales, s_store = round_to(scales, sdtype)
    biases, b_store = round_to(biases, sdtype)
    q = np.clip(np.round((g - biases) / scales), 0, n_bins).astype(np.uint8)
    deq = (scales * q.astype(np.float32) + biases).astype(np.float32).reshape(shape)
    q = q.reshape(-1, shape[-1])
    if bits == 4:
        q = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    codes = np.ascontiguousarray(q).view(np.uint32).reshape(shape[:-1] + (shape[-1] * bits // 32,))
    gshape = shape[:-1] + (shape[-1] // group,)
    return codes, s_store.reshape(gshape), b_store.reshape(gshape), deq


def hf_experts(tensors, prefix):
    """{(layer, proj): [E, out, in]} from per-expert or fused (gate_up_proj) HF tensors, and the
    names they came from."""
    out, used = {}, set()
    per = re.compile(re.escape(prefix) + r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+_proj)\.weight$")
    fused = re.compile(re.escape(prefix) + r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
    parts = {}
    for name, (a, _) in tensors.items():
        m = per.match(name)
        if m:
            parts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = a
            used.add(name)
            continue
        m = fused.match(name)
        if m:
            l = int(m.group(1))
            used.add(name)
            if m.group(2) == "gate_up_proj":
                i = a.shape[1] // 2
                out[(l, "gate_proj")], out[(l, "up_proj")] = a[:, :i], a[:, i:]
            else:
                out[(l, "down_proj")] = a
    for key, d in parts.items():
        out[key] = np.stack([d[e] for e in sorted(d)])
    return out, used


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("mlx_dir")
    ap.add_argument("deq_dir")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--sdtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--layout", default="switch", choices=["switch", "experts"])
    ap.add_argument("--router-bits", type=int, default=8)
    args = ap.parse_args()
    sdtype = args.sdtype.upper()
    cfg = json.load(open(os.path.join(args.src, "config.json")))
    tensors = read_checkpoint(args.src)
    prefix = "model.language_model." if any(n.startswith("model.language_model.") for n in tensors) \
        else "model."
    # mlx-lm's names: the text model under "model."
    renamed = {}
    for n, v in tensors.items():
        renamed["model." + n[len(prefix):] if n.startswith(prefix) else n] = v
    tensors, prefix = renamed, "model."
    experts, used = hf_experts(tensors, prefix)

    # every float matrix (name, array) in mlx-lm's layout
    mats = {n: a for n, (a, _) in tensors.items() if n not in used}
    if args.layout == "switch":
        for (l, p), a in experts.items():
            mats[f"model.layers.{l}.mlp.switch_mlp.{p}.weight"] = a
    else:
        for (l, p), a in experts.items():
            for e in range(a.shape[0]):
                mats[f"model.layers.{l}.mlp.experts.{e}.{p}.weight"] = a[e]

    quant = {"group_size": args.group, "bits": args.bits}
    mlx_out, deq_out = {}, {}
    for name, a in sorted(mats.items()):
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        bits, group = args.bits, args.group
        if mod and (mod.endswith("mlp.gate") or mod.endswith("shared_expert_gate")):
            bits, group = args.router_bits, 64
        if mod and a.ndim >= 2 and a.shape[-1] % group == 0:
            if (bits, group) != (args.bits, args.group):
                quant[mod] = {"group_size": group, "bits": bits}
            codes, s, b, deq = quantize(a, bits, group, sdtype)
            mlx_out[name] = (codes, "U32")
            mlx_out[mod + ".scales"] = (s, sdtype)
            mlx_out[mod + ".biases"] = (b, sdtype)
        else:
            deq = a
            src_dt = tensors[name][1] if name in tensors else "F32"  # stacked experts: F32
            mlx_out[name] = (to_bf16_bits(a), "BF16") if src_dt == "BF16" else \
                (a.astype(np.float16), "F16") if src_dt == "F16" else (a.astype(np.float32), "F32")
        # the twin: Hugging Face names, one set per expert
        m = re.match(r"model\.layers\.(\d+)\.mlp\.switch_mlp\.(\w+)\.weight$", name)
        if m:
            for e in range(deq.shape[0]):
                deq_out[f"model.layers.{m.group(1)}.mlp.experts.{e}.{m.group(2)}.weight"] = \
                    (np.ascontiguousarray(deq[e], dtype=np.float32), "F32")
        else:
            deq_out[name] = (np.ascontiguousarray(deq, dtype=np.float32), "F32")

    for d in (args.mlx_dir, args.deq_dir):
        os.makedirs(d, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if os.path.exists(os.path.join(args.src, f)):
                shutil.copy(os.path.join(args.src, f), d)
    mcfg = dict(cfg)
    mcfg["quantization"] = quant
    mcfg["quantization_config"] = quant
    json.dump(mcfg, open(os.path.join(args.mlx_dir, "config.json"), "w"), indent=2)
    json.dump(cfg, open(os.path.join(args.deq_dir, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(args.mlx_dir, "model.safetensors"), mlx_out)
    write_safetensors(os.path.join(args.deq_dir, "model.safetensors"), deq_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
