#!/usr/bin/python3
"""A tiny random Qwen3-MoE checkpoint in Hugging Face's block-wise FP8, for sluice's tests.

Usage:  /usr/bin/python3 tools/make_fp8_fixture.py OUTDIR [--twin TWINDIR]

numpy only. Writes OUTDIR/{config.json, generation_config.json, model.safetensors}: the layout
of the official Qwen3-*-FP8 checkpoints, every linear layer's weight F8_E4M3 [out, in] with
weight_scale_inv F32 [ceil(out / 128), ceil(in / 128)] and the quantization_config those carry;
embeddings, lm_head, norms, the router (mlp.gate) stay BF16. The dimensions cross block
boundaries (hidden 144, q rows 144, experts' rows 48 and columns 48: partial blocks) and every
tensor is perturbed (norms too). The router is scaled up so that its choices are decisive.

Quantisation as the official conversion does it: per 128 x 128 block, scale = amax / 448, codes
= round-to-nearest-even(w / scale) in e4m3fn (saturating), scale stored as weight_scale_inv.

--twin writes the dequantised float32 twin as well (tools/fp8_convert.py dequantize, which the
tests run themselves: the twin is not committed).
"""

import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_convert import write_st  # noqa: E402  (the tools' safetensors writer)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 144, 3, 1, 48
MOE_I, EXPERTS, TOPK, LAYERS, VOCAB = 48, 4, 2, 2, 128
BLOCK = 128
SEED = 2026


def e4m3_values():
    v = np.zeros(256, np.float64)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        x = m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v[b] = -x if b & 0x80 else x
    v[0x7F] = v[0xFF] = np.nan
    return v


E4M3 = e4m3_values()
POS = E4M3[:0x7F]  # codes 0 .. 0x7e, increasing


def to_e4m3(x):
    """Nearest e4m3fn codes (ties to even), saturating at +-448, of a float32 array."""
    a = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    i = np.clip(np.searchsorted(POS, a, side="right") - 1, 0, 0x7E)
    j = np.minimum(i + 1, 0x7E)
    dl, dh = a - POS[i], POS[j] - a
    up = (j > i) & ((dh < dl) | ((dh == dl) & (i % 2 == 1)))
    code = np.where(up, j, i).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def quantize(w):
    R, C = w.shape
    nr, nc = -(-R // BLOCK), -(-C // BLOCK)
    scale = np.ones((nr, nc), np.float32)
    codes = np.zeros((R, C), np.uint8)
    for i in range(nr):
        for j in range(nc):
            blk = w[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK]
            amax = np.float32(np.abs(blk).max())
            s = np.float32(amax / np.float32(448.0)) if amax > 0 else np.float32(1.0)
            scale[i, j] = s
            codes[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK] = to_e4m3(
                (blk / s).astype(np.float32)
            )
    return codes, scale


def bf16(x):
    u = np.asarray(x, np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
    return u.astype(np.uint16)


def write_model(path, tensors):
    write_st(path, {name: (dt, list(arr.shape), arr.tobytes()) for name, (dt, arr) in tensors.items()},
             {"format": "pt"})


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--twin"):
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(SEED)
    t = {}
    not_converted = ["lm_head"]

    def lin(name, rows, cols, std=None):
        w = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(std or cols**-0.5)
        codes, scale = quantize(w)
        t[name + ".weight"] = ("F8_E4M3", codes)
        t[name + ".weight_scale_inv"] = ("F32", scale)

    def norm(name, n):
        t[name] = ("BF16", bf16(1.0 + 0.1 * rng.standard_normal(n)))

    t["model.embed_tokens.weight"] = ("BF16", bf16(rng.standard_normal((VOCAB, HIDDEN))))
    t["lm_head.weight"] = ("BF16", bf16(rng.standard_normal((VOCAB, HIDDEN)) * HIDDEN**-0.5 * 4))
    norm("model.norm.weight", HIDDEN)
    for l in range(LAYERS):
        p = "model.layers.%d." % l
        norm(p + "input_layernorm.weight", HIDDEN)
        norm(p + "post_attention_layernorm.weight", HIDDEN)
        norm(p + "self_attn.q_norm.weight", HEAD_DIM)
        norm(p + "self_attn.k_norm.weight", HEAD_DIM)
        lin(p + "self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN)
        lin(p + "self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN)
        lin(p + "self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN)
        lin(p + "self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM)
        # a router whose logits spread widely: its top-k does not hinge on rounding
        t[p + "mlp.gate.weight"] = ("BF16", bf16(rng.standard_normal((EXPERTS, HIDDEN)) * 0.5))
        not_converted.append(p + "mlp.gate")
        for e in range(EXPERTS):
            q = p + "mlp.experts.%d." % e
            lin(q + "gate_proj", MOE_I, HIDDEN)
            lin(q + "up_proj", MOE_I, HIDDEN)
            lin(q + "down_proj", HIDDEN, MOE_I)
    write_model(os.path.join(out, "model.safetensors"), t)

    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "decoder_sparse_step": 1,
        "dtype": "bfloat16",
        "eos_token_id": None,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 96,
        "max_position_embeddings": 512,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": MOE_I,
        "norm_topk_prob": True,
        "num_attention_heads": HEADS,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOPK,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "output_router_logits": False,
        "pad_token_id": None,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "modules_to_not_convert": not_converted,
            "quant_method": "fp8",
            "weight_block_size": [BLOCK, BLOCK],
        },
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "use_cache": True}, f, indent=2)
        f.write("\n")
    if len(sys.argv) == 4:
        conv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp8_convert.py")
        subprocess.check_call([sys.executable, conv, "dequantize", out, sys.argv[3]])


if __name__ == "__main__":
    main()
