#!/usr/bin/env python3
"""Writes a synthetic random-weight Hugging Face checkpoint with real layer shapes.

For benchmarks only: the weights are random BF16 (or F32) numbers, so the output
is noise, but every matrix has the size of the real model's, so time and bytes
moved are real. Needs only numpy (Debian: python3-numpy, run with /usr/bin/python3).

    /usr/bin/python3 tools/make_synth.py OUT --preset qwen3-30b-a3b --layers 4
"""
import argparse
import json
import os
import sys

import numpy as np

PRESETS = {
    # Qwen3-30B-A3B layer shapes.
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                          intermediate_size=6144, norm_topk_prob=True, num_hidden_layers=48),
    # Tiny layers with the real Qwen vocabulary: end-to-end tests of the text commands.
    "tiny-qwen-vocab": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=32,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                            intermediate_size=32, norm_topk_prob=True, num_hidden_layers=2),
    # A tiny shape for smoke tests.
    "tiny": dict(model_type="qwen3_moe", vocab_size=512, hidden_size=64, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, intermediate_size=96, norm_topk_prob=True,
                 num_hidden_layers=2),
}


class Writer:
    """Streams tensors into one safetensors file without holding them all in memory."""

    def __init__(self, path, specs):
        self.path = path
        header, off = {}, 0
        for name, (dtype, shape) in specs.items():
            n = int(np.prod(shape)) * (2 if dtype == "BF16" else 4)
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        header["__metadata__"] = {"format": "pt"}
        hjson = json.dumps(header, separators=(",", ":")).encode()
        hjson += b" " * ((8 - len(hjson) % 8) % 8)
        self.f = open(path, "wb")
        self.f.write(len(hjson).to_bytes(8, "little"))
        self.f.write(hjson)

    def put(self, arr):
        self.f.write(arr.tobytes())

    def close(self):
        self.f.close()


def bf16(rng, shape, scale):
    """Random BF16 values (normal * scale), as uint16 bit patterns."""
    x = (rng.standard_normal(size=shape, dtype=np.float32) * scale).view(np.uint32)
    return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, help="override num_hidden_layers")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = dict(PRESETS[a.preset])
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    cfg.update(rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
               hidden_act="silu", tie_word_embeddings=False, decoder_sparse_step=1,
               mlp_only_layers=[], architectures=["Qwen3MoeForCausalLM"], torch_dtype="bfloat16")
    V, H, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, I = cfg["num_experts"], cfg["moe_intermediate_size"]

    specs = {"model.embed_tokens.weight": ("BF16", (V, H)), "model.norm.weight": ("BF16", (H,)),
             "lm_head.weight": ("BF16", (V, H))}
    for l in range(L):
        p = f"model.layers.{l}."
        specs[p + "input_layernorm.weight"] = ("BF16", (H,))
        specs[p + "post_attention_layernorm.weight"] = ("BF16", (H,))
        specs[p + "self_attn.q_proj.weight"] = ("BF16", (nh * hd, H))
        specs[p + "self_attn.k_proj.weight"] = ("BF16", (nkv * hd, H))
        specs[p + "self_attn.v_proj.weight"] = ("BF16", (nkv * hd, H))
        specs[p + "self_attn.o_proj.weight"] = ("BF16", (H, nh * hd))
        specs[p + "self_attn.q_norm.weight"] = ("BF16", (hd,))
        specs[p + "self_attn.k_norm.weight"] = ("BF16", (hd,))
        specs[p + "mlp.gate.weight"] = ("BF16", (E, H))
        specs[p + "mlp.experts.gate_up_proj"] = ("BF16", (E, 2 * I, H))
        specs[p + "mlp.experts.down_proj"] = ("BF16", (E, H, I))

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    rng = np.random.default_rng(a.seed)
    w = Writer(os.path.join(a.out, "model.safetensors"), specs)
    for i, (name, (_, shape)) in enumerate(specs.items()):
        if name.endswith("norm.weight"):
            arr = np.full(shape, 0x3F80, dtype=np.uint16)  # 1.0 in BF16
        elif name.endswith("mlp.gate.weight"):
            arr = bf16(rng, shape, 0.05)
        else:
            arr = bf16(rng, shape, 0.02)
        w.put(arr)
        print(f"\r[{i + 1}/{len(specs)}] {name}".ljust(70), end="", file=sys.stderr, flush=True)
    w.close()
    print(f"\nwrote {a.out} ({os.path.getsize(os.path.join(a.out, 'model.safetensors')) / 1e9:.2f} GB)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
