#!/usr/bin/python3
"""Writes random-weight GGUF v3 files of real MoE layer shapes, for llama.cpp side by sides.

The counterpart of tools/make_synth.py (which writes the Hugging Face checkpoint sluice reads):
the same shapes, as llama.cpp's converter (convert_hf_to_gguf.py) would lay them out, so that
llama-bench and sluice run the same layers. Own code (no gguf-py); needs numpy only (Debian:
python3-numpy, run with /usr/bin/python3). The weights are noise: only sizes, types and shapes
are real, so time and bytes moved are.

Presets and the llama.cpp architecture they write:

  bench-A, tiny    "qwen3moe": Qwen3-30B-A3B layer shapes (bench-A: 8 layers), docs/BENCHMARKS.md 12
  gpt-oss-120b     "gpt-oss": hidden 2880, 64 query / 8 KV heads of 64, attention sinks, layers
                   alternating sliding-window (128, even layers) and full, YaRN (factor 32),
                   biases on q/k/v/o, on the router and on every expert projection, 128 experts
                   top-4 of size 2880 (gate and up split as the converter splits gate_up_proj),
                   vocabulary 201088; 36 layers in the real model
  deepseek-v3      "deepseek2": hidden 7168, MLA (q LoRA 1536, KV latent 512, RoPE 64, nope 128,
                   v 128, 128 heads; kv_b written split and transposed as attn_k_b / attn_v_b,
                   the converter's layout for the absorbed MLA), 256 experts top-8 in 8 groups
                   (4 kept), sigmoid gating with exp_probs_b (e_score_correction_bias), weights
                   normalised then scaled by 2.5, one shared expert, expert size 2048, the first
                   3 layers dense (18432), vocabulary 129280; 61 layers in the real model. With
                   --layers N the dense count is min(3, N - 2), as tools/make_synth.py does.

Types: each --out is TYPES:PATH, TYPES = CORE or CORE+EXPERTS, each one of f32, bf16, q8_0,
q4_0, mxfp4 (mxfp4 only for the experts). CORE is every other large matrix (embeddings, head,
attention, dense and shared FFN); norms, biases, sinks and routers are F32 as the converter
writes them. One pass writes every --out.

  bf16+mxfp4   gpt-oss as the official checkpoint is: MXFP4 experts, the rest BF16 (sluice's
               `pack --quant keep` of make_synth.py's gpt-oss checkpoint)
  q4_0         Q4_0 everywhere (4.5 bits a weight, the size of sluice's int4: group-64 affine with
               BF16 scale and bias; sluice's `pack --quant int4` of make_synth.py's DeepSeek-V3)

Fill: "gauss" quantises N(0, 0.02) numbers (slow: the bench-A files of section 12);
"pool" (the default for gpt-oss-120b and deepseek-v3) copies slices of a 64 MB pool of random
blocks with sane scales, at disk speed. --zero-experts leaves the routed experts' data as holes
of a sparse file (they read as zeros: Q4_0/Q8_0 blocks of scale 0, MXFP4 blocks of scale 2^-127),
so a file of many GB of experts takes seconds and no disk; time per token does not change.

  make_gguf_synth.py --preset bench-A --out q8_0:/tmp/m/a-q8_0.gguf --out q4_0:/tmp/m/a-q4_0.gguf
  make_gguf_synth.py --preset gpt-oss-120b --layers 8 --zero-experts --out bf16+mxfp4:/m/gptoss.gguf
  make_gguf_synth.py --preset deepseek-v3 --layers 5 --zero-experts --out q4_0:/m/dsv3.gguf
  make_gguf_synth.py --preset deepseek-v3 --layers 3 --vocab 2048 --out q4_0:/tmp/t.gguf  # a check

Facts (tensor names and shapes, metadata keys and types) are from llama.cpp's src/llama-arch.cpp,
src/models/{openai-moe,deepseek2}.cpp, gguf-py/gguf/constants.py and conversion/{gpt_oss,deepseek,
base}.py (node-llama-cpp 3.22.1's llama.cpp).
"""
import argparse
import os
import struct
import sys
import time

import numpy as np

from make_gguf_fixtures import bytes_to_unicode  # GPT-2's byte-to-character map

# ---------------------------------------------------------------- GGUF basics
GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32

T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, \
    T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)

GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16, GGML_MXFP4 = 0, 1, 2, 8, 30, 39
QK = 32
# (elements, bytes) of one block; the float types are blocks of one element
BLOCK = {GGML_F32: (1, 4), GGML_BF16: (1, 2), GGML_Q8_0: (32, 2 + 32), GGML_Q4_0: (32, 2 + 16),
         GGML_MXFP4: (32, 1 + 16)}
QNAME = {"f32": GGML_F32, "bf16": GGML_BF16, "q8_0": GGML_Q8_0, "q4_0": GGML_Q4_0,
         "mxfp4": GGML_MXFP4}
# general.file_type (llama_ftype) by the experts' type
FTYPE = {GGML_F32: 0, GGML_BF16: 32, GGML_Q8_0: 7, GGML_Q4_0: 2, GGML_MXFP4: 38}

PRESETS = {
    # Qwen3-30B-A3B layer shapes, 8 layers
    "bench-A": dict(arch="qwen3moe", n_layer=8, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                    n_expert=128, n_expert_used=8, n_ff_exp=768, n_vocab=151936,
                    rope_theta=1e6, eps=1e-6, n_ctx=4096, fill="gauss"),
    # tiny smoke-test model
    "tiny": dict(arch="qwen3moe", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
                 n_expert=8, n_expert_used=2, n_ff_exp=128, n_vocab=151936,
                 rope_theta=1e6, eps=1e-6, n_ctx=4096, fill="gauss"),
    # gpt-oss-120b (openai/gpt-oss-120b config.json)
    "gpt-oss-120b": dict(arch="gpt-oss", n_layer=36, n_embd=2880, n_head=64, n_head_kv=8,
                         head_dim=64, n_expert=128, n_expert_used=4, n_ff_exp=2880,
                         n_vocab=201088, sliding_window=128, rope_theta=150000.0,
                         yarn_factor=32.0, yarn_orig_ctx=4096, yarn_beta_fast=32.0,
                         yarn_beta_slow=1.0, eps=1e-5, n_ctx=131072, fill="pool"),
    # DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json)
    "deepseek-v3": dict(arch="deepseek2", n_layer=61, n_embd=7168, n_head=128, q_lora=1536,
                        kv_lora=512, rope_dim=64, nope_dim=128, v_dim=128, n_expert=256,
                        n_expert_used=8, n_group=8, topk_group=4, n_ff_exp=2048, n_shared=1,
                        n_ff=18432, n_dense_lead=3, routed_scale=2.5, n_vocab=129280,
                        rope_theta=10000.0, yarn_factor=40.0, yarn_orig_ctx=4096,
                        yarn_beta_fast=32.0, yarn_beta_slow=1.0, mscale_all_dim=1.0, eps=1e-6,
                        n_ctx=163840, fill="pool"),
}


def s_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = s_str(key) + struct.pack("<I", vtype)
    if vtype == T_STRING:
        out += s_str(value)
    elif vtype == T_UINT32:
        out += struct.pack("<I", value)
    elif vtype == T_INT32:
        out += struct.pack("<i", value)
    elif vtype == T_FLOAT32:
        out += struct.pack("<f", value)
    elif vtype == T_BOOL:
        out += struct.pack("<B", 1 if value else 0)
    elif vtype == T_UINT64:
        out += struct.pack("<Q", value)
    else:
        raise ValueError(vtype)
    return out


def kv_arr(key, etype, values):
    out = s_str(key) + struct.pack("<I", T_ARRAY) + struct.pack("<IQ", etype, len(values))
    if etype == T_STRING:
        out += b"".join(s_str(v) for v in values)
    elif etype == T_INT32:
        out += np.asarray(values, dtype="<i4").tobytes()
    else:
        raise ValueError(etype)
    return out


def pad(n, a=ALIGN):
    return (a - n % a) % a


# ---------------------------------------------------------------- tokenizer
def make_vocab(n_vocab, specials):
    """Synthetic byte-level BPE vocab: 256 single-byte tokens, then unique
    multi-char strings over the byte alphabet (so every token decodes to bytes),
    then the special tokens at the end."""
    b2u = bytes_to_unicode()
    alpha = [b2u[b] for b in range(256)]
    n_normal = n_vocab - len(specials)
    assert n_normal >= 256, "vocabulary too small (at least 256 + specials)"
    tokens = list(alpha)
    # 2-char tokens, then 3-char tokens
    i = 0
    while len(tokens) < n_normal:
        if i < 256 * 256:
            a, b = divmod(i, 256)
            tokens.append(alpha[a] + alpha[b])
        else:
            j = i - 256 * 256
            a, r = divmod(j, 256 * 256)
            b, c = divmod(r, 256)
            tokens.append(alpha[a % 256] + alpha[b] + alpha[c])
        i += 1
    types = [1] * len(tokens)  # LLAMA_TOKEN_TYPE_NORMAL
    tokens += specials
    types += [3] * len(specials)  # CONTROL
    assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
    # merges: the first 2-char tokens, "x y" -> "xy" (all present in vocab)
    merges = []
    for t in tokens[256:min(256 + 4096, n_normal)]:
        merges.append(t[0] + " " + t[1])
    return tokens, types, merges


# per architecture: tokenizer.ggml.pre (a pre-tokenizer llama.cpp knows) and special tokens
TOKENIZER = {
    "qwen3moe": ("qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    "gpt-oss": ("gpt-4o", ["<|startoftext|>", "<|return|>", "<|endoftext|>"]),
    "deepseek2": ("deepseek-v3", ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜pad｜>"]),
}


# ---------------------------------------------------------------- quantizers ("gauss" fill)
def quant_q8_0(x):
    """x: float32 array, last dim multiple of 32 -> bytes (ggml block_q8_0)."""
    xb = x.reshape(-1, QK)
    amax = np.abs(xb).max(axis=1)
    d = amax / 127.0
    idv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.rint(xb * idv[:, None]).astype(np.int8)  # round half to even vs ggml roundf: irrelevant here
    out = np.empty((xb.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quant_q4_0(x):
    """ggml quantize_row_q4_0_ref: d = max/-8 (max = signed value of largest |x|),
    q = clamp(int(x/d + 8.5), 0..15); low nibbles = elements 0..15, high = 16..31."""
    xb = x.reshape(-1, QK)
    idx = np.abs(xb).argmax(axis=1)
    mx = xb[np.arange(xb.shape[0]), idx]
    d = mx / -8.0
    idv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(15, (xb * idv[:, None] + 8.5).astype(np.int8)).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    out = np.empty((xb.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = packed
    return out.tobytes()


def to_bf16(x):
    """float32 -> BF16 bytes, rounded to nearest even."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


QUANT_FN = {GGML_Q8_0: quant_q8_0, GGML_Q4_0: quant_q4_0, GGML_BF16: to_bf16,
            GGML_F32: lambda x: x.astype("<f4").tobytes()}


# ---------------------------------------------------------------- random block pools ("pool" fill)
POOL_BYTES = 64 << 20


def make_pool(gtype, rng):
    """POOL_BYTES of random blocks of gtype whose values are about 0.02 in size (no NaN, no inf):
    a tensor is written as slices of it from random block offsets."""
    nb = BLOCK[gtype][1]
    nblk = POOL_BYTES // nb
    raw = rng.integers(0, 256, size=(nblk, nb), dtype=np.uint8)
    # Codes symmetric about zero: a mean in every weight (Q4_0's nibbles 0..15 minus 8 average
    # -0.5) adds one common direction to every output, and the logits stop depending on the token.
    if gtype == GGML_Q8_0:  # int8 codes uniform in [-127, 127] (rms ~73): d = 0.02 / 73
        q = raw[:, 2:]
        q[q == 0x80] = 0
        raw[:, 0:2] = np.full(nblk, 0.02 / 73, dtype="<f2").view(np.uint8).reshape(-1, 2)
    elif gtype == GGML_Q4_0:  # nibbles 1..15 minus 8 (and 0 as 8: rms ~4.3): d = 0.02 / 4.3
        q = raw[:, 2:]
        lo, hi = q & 15, q >> 4
        lo[lo == 0] = 8
        hi[hi == 0] = 8
        raw[:, 2:] = lo | (hi << 4)
        raw[:, 0:2] = np.full(nblk, 0.02 / 4.3, dtype="<f2").view(np.uint8).reshape(-1, 2)
    elif gtype == GGML_MXFP4:  # E2M1 codes (rms ~2.9) times 2^(e - 127), e in 119..122
        raw[:, 0] = 119 + (raw[:, 0] & 3)
    elif gtype == GGML_BF16:  # sign and mantissa random, exponent 119..122: |x| in [2^-8, 2^-4)
        u = raw.view("<u2")
        u[:] = (u & 0x807F) | ((119 + ((u >> 7) & 3)) << 7)
    elif gtype == GGML_F32:
        raw = (rng.standard_normal(nblk, dtype=np.float32) * 0.02).astype("<f4").view(np.uint8)
        raw = raw.reshape(nblk, 4)
    return raw.reshape(-1)


# ---------------------------------------------------------------- model layout
# Roles: "norm" (F32 ones), "f32" (small F32: routers, biases, sinks, N(0, std)), "core" (large
# matrices in the CORE type), "exps" (routed experts, EXPERTS type).
def tensor_list(h):
    """[(name, ne (fastest first), role, std)]"""
    arch = h["arch"]
    E, V, L = h["n_embd"], h["n_vocab"], h["n_layer"]
    X, F = h["n_expert"], h["n_ff_exp"]
    t = [("token_embd.weight", (E, V), "core", 0), ("output_norm.weight", (E,), "norm", 0),
         ("output.weight", (E, V), "core", 0)]
    for i in range(L):
        p = f"blk.{i}."
        if arch == "qwen3moe":
            D, H, HKV = h["head_dim"], h["n_head"], h["n_head_kv"]
            t += [
                (p + "attn_norm.weight", (E,), "norm", 0),
                (p + "attn_q.weight", (E, H * D), "core", 0),
                (p + "attn_k.weight", (E, HKV * D), "core", 0),
                (p + "attn_v.weight", (E, HKV * D), "core", 0),
                (p + "attn_output.weight", (H * D, E), "core", 0),
                (p + "attn_q_norm.weight", (D,), "norm", 0),
                (p + "attn_k_norm.weight", (D,), "norm", 0),
                (p + "ffn_norm.weight", (E,), "norm", 0),
                (p + "ffn_gate_inp.weight", (E, X), "f32", 0.02),
                (p + "ffn_gate_exps.weight", (E, F, X), "exps", 0),
                (p + "ffn_up_exps.weight", (E, F, X), "exps", 0),
                (p + "ffn_down_exps.weight", (F, E, X), "exps", 0),
            ]
        elif arch == "gpt-oss":
            D, H, HKV = h["head_dim"], h["n_head"], h["n_head_kv"]
            t += [
                (p + "attn_norm.weight", (E,), "norm", 0),
                (p + "attn_q.weight", (E, H * D), "core", 0),
                (p + "attn_q.bias", (H * D,), "f32", 0.02),
                (p + "attn_k.weight", (E, HKV * D), "core", 0),
                (p + "attn_k.bias", (HKV * D,), "f32", 0.02),
                (p + "attn_v.weight", (E, HKV * D), "core", 0),
                (p + "attn_v.bias", (HKV * D,), "f32", 0.02),
                (p + "attn_output.weight", (H * D, E), "core", 0),
                (p + "attn_output.bias", (E,), "f32", 0.02),
                (p + "attn_sinks.weight", (H,), "f32", 1.0),
                (p + "post_attention_norm.weight", (E,), "norm", 0),
                (p + "ffn_gate_inp.weight", (E, X), "f32", 0.05),
                (p + "ffn_gate_inp.bias", (X,), "f32", 0.05),
                (p + "ffn_gate_exps.weight", (E, F, X), "exps", 0),
                (p + "ffn_gate_exps.bias", (F, X), "f32", 0.02),
                (p + "ffn_up_exps.weight", (E, F, X), "exps", 0),
                (p + "ffn_up_exps.bias", (F, X), "f32", 0.02),
                (p + "ffn_down_exps.weight", (F, E, X), "exps", 0),
                (p + "ffn_down_exps.bias", (E, X), "f32", 0.02),
            ]
        elif arch == "deepseek2":
            H, qr, kr = h["n_head"], h["q_lora"], h["kv_lora"]
            rd, nd, vd = h["rope_dim"], h["nope_dim"], h["v_dim"]
            t += [
                (p + "attn_norm.weight", (E,), "norm", 0),
                (p + "attn_q_a_norm.weight", (qr,), "norm", 0),
                (p + "attn_kv_a_norm.weight", (kr,), "norm", 0),
                (p + "attn_q_a.weight", (E, qr), "core", 0),
                (p + "attn_q_b.weight", (qr, H * (nd + rd)), "core", 0),
                (p + "attn_kv_a_mqa.weight", (E, kr + rd), "core", 0),
                # kv_b_proj [H * (nd + vd), kr] split per head: k_b transposed, v_b as it is
                (p + "attn_k_b.weight", (nd, kr, H), "core", 0),
                (p + "attn_v_b.weight", (kr, vd, H), "core", 0),
                (p + "attn_output.weight", (H * vd, E), "core", 0),
                (p + "ffn_norm.weight", (E,), "norm", 0),
            ]
            if i < h["n_dense_lead"]:
                Fd = h["n_ff"]
                t += [(p + "ffn_gate.weight", (E, Fd), "core", 0),
                      (p + "ffn_up.weight", (E, Fd), "core", 0),
                      (p + "ffn_down.weight", (Fd, E), "core", 0)]
            else:
                Fs = F * h["n_shared"]
                t += [
                    (p + "ffn_gate_inp.weight", (E, X), "f32", 0.05),
                    (p + "exp_probs_b.bias", (X,), "f32", 0.01),
                    (p + "ffn_gate_exps.weight", (E, F, X), "exps", 0),
                    (p + "ffn_up_exps.weight", (E, F, X), "exps", 0),
                    (p + "ffn_down_exps.weight", (F, E, X), "exps", 0),
                    (p + "ffn_gate_shexp.weight", (E, Fs), "core", 0),
                    (p + "ffn_up_shexp.weight", (E, Fs), "core", 0),
                    (p + "ffn_down_shexp.weight", (Fs, E), "core", 0),
                ]
        else:
            raise ValueError(arch)
    return t


def tensor_type(ne, role, core_t, exps_t):
    if role in ("norm", "f32"):
        return GGML_F32
    gt = exps_t if role == "exps" else core_t
    if BLOCK[gt][0] > 1 and ne[0] % BLOCK[gt][0] != 0:
        return GGML_F32  # a row that fits no block (tiny custom shapes only)
    return gt


def nbytes(ne, gtype):
    n = int(np.prod(ne))
    per, nb = BLOCK[gtype]
    assert n % per == 0
    return n // per * nb


def arch_meta(h):
    """The architecture's keys, as llama.cpp's converter writes them (types included)."""
    a = h["arch"]
    m = [
        kv(f"{a}.block_count", T_UINT32, h["n_layer"]),
        kv(f"{a}.context_length", T_UINT32, h["n_ctx"]),
        kv(f"{a}.embedding_length", T_UINT32, h["n_embd"]),
        kv(f"{a}.attention.head_count", T_UINT32, h["n_head"]),
        kv(f"{a}.rope.freq_base", T_FLOAT32, h["rope_theta"]),
        kv(f"{a}.attention.layer_norm_rms_epsilon", T_FLOAT32, h["eps"]),
        kv(f"{a}.expert_count", T_UINT32, h["n_expert"]),
        kv(f"{a}.expert_used_count", T_UINT32, h["n_expert_used"]),
        kv(f"{a}.expert_feed_forward_length", T_UINT32, h["n_ff_exp"]),
    ]
    if "yarn_factor" in h:
        m += [
            kv(f"{a}.rope.scaling.type", T_STRING, "yarn"),
            kv(f"{a}.rope.scaling.factor", T_FLOAT32, h["yarn_factor"]),
            kv(f"{a}.rope.scaling.original_context_length", T_UINT32, h["yarn_orig_ctx"]),
            kv(f"{a}.rope.scaling.yarn_beta_fast", T_FLOAT32, h["yarn_beta_fast"]),
            kv(f"{a}.rope.scaling.yarn_beta_slow", T_FLOAT32, h["yarn_beta_slow"]),
        ]
    if a == "qwen3moe":
        m += [
            # dense FFN size is unused by qwen3moe; Qwen3-30B-A3B config has 6144
            kv(f"{a}.feed_forward_length", T_UINT32, h["n_ff_exp"] * h["n_expert_used"]),
            kv(f"{a}.attention.head_count_kv", T_UINT32, h["n_head_kv"]),
            kv(f"{a}.attention.key_length", T_UINT32, h["head_dim"]),
            kv(f"{a}.attention.value_length", T_UINT32, h["head_dim"]),
        ]
    elif a == "gpt-oss":
        m += [
            kv(f"{a}.feed_forward_length", T_UINT32, h["n_ff_exp"]),  # intermediate_size
            kv(f"{a}.attention.head_count_kv", T_UINT32, h["n_head_kv"]),
            kv(f"{a}.attention.key_length", T_UINT32, h["head_dim"]),
            kv(f"{a}.attention.value_length", T_UINT32, h["head_dim"]),
            # the pattern is llama.cpp's default for gpt-oss: even layers sliding, odd full
            kv(f"{a}.attention.sliding_window", T_UINT32, h["sliding_window"]),
        ]
    elif a == "deepseek2":
        kr, rd = h["kv_lora"], h["rope_dim"]
        m += [
            kv(f"{a}.feed_forward_length", T_UINT32, h["n_ff"]),
            kv(f"{a}.attention.head_count_kv", T_UINT32, 1),  # MLA as MQA over the latent
            kv(f"{a}.leading_dense_block_count", T_UINT32, h["n_dense_lead"]),
            kv(f"{a}.vocab_size", T_UINT32, h["n_vocab"]),
            kv(f"{a}.attention.q_lora_rank", T_UINT32, h["q_lora"]),
            kv(f"{a}.attention.kv_lora_rank", T_UINT32, kr),
            kv(f"{a}.attention.key_length", T_UINT32, kr + rd),
            kv(f"{a}.attention.value_length", T_UINT32, kr),
            kv(f"{a}.attention.key_length_mla", T_UINT32, h["nope_dim"] + rd),
            kv(f"{a}.attention.value_length_mla", T_UINT32, h["v_dim"]),
            kv(f"{a}.expert_shared_count", T_UINT32, h["n_shared"]),
            kv(f"{a}.expert_weights_scale", T_FLOAT32, h["routed_scale"]),
            kv(f"{a}.expert_weights_norm", T_BOOL, True),
            kv(f"{a}.expert_group_count", T_UINT32, h["n_group"]),
            kv(f"{a}.expert_group_used_count", T_UINT32, h["topk_group"]),
            kv(f"{a}.expert_gating_func", T_UINT32, 2),  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
            kv(f"{a}.rope.dimension_count", T_UINT32, rd),
            # 0.1 * mscale_all_dim: the converter's legacy encoding (llama.cpp divides by 0.1)
            kv(f"{a}.rope.scaling.yarn_log_multiplier", T_FLOAT32, 0.1 * h["mscale_all_dim"]),
        ]
    return m


def header_bytes(h, name, tensors, gtypes, vocab, ftype):
    arch = h["arch"]
    tokens, types, merges = vocab
    pre, specials = TOKENIZER[arch]
    nv = h["n_vocab"]
    meta = [
        kv("general.architecture", T_STRING, arch),
        kv("general.name", T_STRING, name),
        kv("general.alignment", T_UINT32, ALIGN),
        kv("general.file_type", T_UINT32, ftype),
    ] + arch_meta(h) + [
        kv("tokenizer.ggml.model", T_STRING, "gpt2"),
        kv("tokenizer.ggml.pre", T_STRING, pre),
        kv_arr("tokenizer.ggml.tokens", T_STRING, tokens),
        kv_arr("tokenizer.ggml.token_type", T_INT32, types),
        kv_arr("tokenizer.ggml.merges", T_STRING, merges),
        kv("tokenizer.ggml.bos_token_id", T_UINT32, nv - 3),
        kv("tokenizer.ggml.eos_token_id", T_UINT32, nv - (1 if arch == "qwen3moe" else 2)),
        kv("tokenizer.ggml.padding_token_id", T_UINT32, nv - (3 if arch == "qwen3moe" else 1)),
        kv("tokenizer.ggml.add_bos_token", T_BOOL, False),
    ]
    infos = []
    off = 0
    offsets = []
    for (tname, ne, _, _), gt in zip(tensors, gtypes):
        info = s_str(tname) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        info += struct.pack("<IQ", gt, off)
        infos.append(info)
        offsets.append(off)
        sz = nbytes(ne, gt)
        off += sz + pad(sz)
    hdr = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(meta))
    hdr += b"".join(meta) + b"".join(infos)
    hdr += b"\0" * pad(len(hdr))
    return hdr, offsets, off


def parse_types(spec):
    core, _, exps = spec.partition("+")
    core_t, exps_t = QNAME[core], QNAME[exps or core]
    if core_t == GGML_MXFP4:
        raise SystemExit("mxfp4 is for the experts only: use CORE+mxfp4 (e.g. bf16+mxfp4)")
    return core_t, exps_t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="bench-A", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="override n_layer")
    ap.add_argument("--vocab", type=int, default=None, help="override n_vocab (quick checks)")
    ap.add_argument("--experts", type=int, default=None, help="override n_expert (quick checks)")
    ap.add_argument("--out", action="append", required=True,
                    help="TYPES:PATH, TYPES = CORE[+EXPERTS] from f32,bf16,q8_0,q4_0,mxfp4")
    ap.add_argument("--zero-experts", action="store_true",
                    help="routed experts as holes of a sparse file (zeros)")
    ap.add_argument("--fill", choices=("gauss", "pool"), help="default: the preset's")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--std", type=float, default=0.02, help="gauss fill: the weights' std")
    ap.add_argument("--chunk", type=int, default=1 << 24, help="gauss fill: elements per chunk")
    a = ap.parse_args()

    h = dict(PRESETS[a.preset])
    if a.layers:
        h["n_layer"] = a.layers
    if a.vocab:
        h["n_vocab"] = a.vocab
    if a.experts:
        h["n_expert"] = a.experts
    if "n_dense_lead" in h:  # as tools/make_synth.py: at least two MoE layers when it can
        h["n_dense_lead"] = min(h["n_dense_lead"], max(h["n_layer"] - 2, 0))
    fill = a.fill or h["fill"]
    tensors = tensor_list(h)
    vocab = make_vocab(h["n_vocab"], TOKENIZER[h["arch"]][1])
    rng = np.random.default_rng(a.seed)
    outs, pools = [], {}
    for spec in a.out:
        q, path = spec.split(":", 1)
        core_t, exps_t = parse_types(q)
        if fill == "gauss" and GGML_MXFP4 in (core_t, exps_t):
            raise SystemExit("--fill gauss has no MXFP4 quantiser: use --fill pool")
        gtypes = [tensor_type(ne, role, core_t, exps_t) for (_, ne, role, _) in tensors]
        hdr, offsets, data_sz = header_bytes(h, f"{a.preset}-{q}-random", tensors, gtypes, vocab,
                                             FTYPE[exps_t])
        f = open(path, "wb")
        f.write(hdr)
        outs.append(dict(f=f, path=path, gtypes=gtypes, data0=len(hdr), offsets=offsets,
                         total=len(hdr) + data_sz))
        if fill == "pool":
            for gt in set(gtypes):
                if gt not in pools:
                    pools[gt] = make_pool(gt, rng)
        print(f"{path}: {h['arch']}, {h['n_layer']} layers, header {len(hdr)} B, "
              f"total {(len(hdr) + data_sz) / 2**30:.3f} GiB", flush=True)

    t0 = time.time()
    done = 0
    total_el = sum(int(np.prod(ne)) for _, ne, _, _ in tensors)
    for ti, (tname, ne, role, std) in enumerate(tensors):
        n = int(np.prod(ne))
        for o in outs:
            o["f"].seek(o["data0"] + o["offsets"][ti])
        if role == "exps" and a.zero_experts:
            pass  # a hole: the final truncate sizes the file
        elif role == "norm":
            blob = np.ones(n, dtype="<f4").tobytes()
            for o in outs:
                o["f"].write(blob)
        elif role == "f32":
            blob = (rng.standard_normal(n, dtype=np.float32) * std).astype("<f4").tobytes()
            for o in outs:
                o["f"].write(blob)
        elif fill == "gauss":
            row = ne[0]
            rows_per_chunk = max(1, a.chunk // row)
            nrows = n // row
            r = 0
            while r < nrows:
                k = min(rows_per_chunk, nrows - r)
                x = rng.standard_normal(k * row, dtype=np.float32)
                x *= a.std
                for o in outs:
                    o["f"].write(QUANT_FN[o["gtypes"][ti]](x))
                r += k
        else:
            for o in outs:
                gt = o["gtypes"][ti]
                pool, bs = pools[gt], BLOCK[gt][1]
                left = nbytes(ne, gt)
                while left:
                    start = int(rng.integers(0, len(pool) // bs)) * bs
                    k = min(left, len(pool) - start)
                    o["f"].write(memoryview(pool)[start:start + k])
                    left -= k
        done += n
        if ti % 12 == 0 or ti == len(tensors) - 1:
            el = time.time() - t0
            print(f"  [{ti + 1}/{len(tensors)}] {tname} {ne}  {done / total_el * 100:.1f}%  {el:.0f}s",
                  flush=True)
    for o in outs:
        o["f"].truncate(o["total"])
        o["f"].close()
        assert os.path.getsize(o["path"]) == o["total"], (o["path"], os.path.getsize(o["path"]), o["total"])
        print(f"wrote {o['path']} ({o['total'] / 2**30:.3f} GiB, "
              f"{os.stat(o['path']).st_blocks * 512 / 2**30:.3f} GiB on disk) in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
