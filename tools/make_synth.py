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
    # Qwen3.5-397B-A17B layer shapes (Gated DeltaNet 3 : 1 gated attention); 60 layers in the
    # real model, so pass --layers (4 is one full cycle of the layer pattern).
    "qwen3.5-397b-a17b": dict(model_type="qwen3_5_moe_text", vocab_size=248320, hidden_size=4096,
                              num_attention_heads=32, num_key_value_heads=2, head_dim=256,
                              linear_num_key_heads=16, linear_num_value_heads=64,
                              linear_key_head_dim=128, linear_value_head_dim=128,
                              linear_conv_kernel_dim=4, full_attention_interval=4,
                              num_experts=512, num_experts_per_tok=10, moe_intermediate_size=1024,
                              shared_expert_intermediate_size=1024, num_hidden_layers=60),
    # Qwen4-Exp layer shapes: hidden 2560, 4 hyper-connection streams, 512 experts, top-10,
    # expert size 640, PLE on layer 1 (one-indexed) with 16 hashed n-gram heads. The real n-gram
    # table has ~20M rows per head (ngram_vocab_size_base); pass --ngram-base to size the table
    # on disk. Indexer sizes are not published: these are plausible values.
    "qwen4-exp": dict(model_type="qwen4_exp_text", vocab_size=248320, hidden_size=2560,
                      num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                      linear_num_key_heads=16, linear_num_value_heads=32,
                      linear_key_head_dim=128, linear_value_head_dim=128,
                      linear_conv_kernel_dim=4, full_attention_interval=4,
                      num_experts=512, num_experts_per_tok=10, moe_intermediate_size=640,
                      shared_expert_intermediate_size=640, num_hidden_layers=40,
                      hc_count=4, hc_lowrank=320, ple_layer_ids=[1], ngram_size=3,
                      heads_per_ngram=8, ngram_vocab_size_base=20000000,
                      make_ngram_vocab_size_divisible_by=128, ple_conv_kernel_size=4,
                      indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=128,
                      indexer_budget=2048, indexer_compress_ratio=16, eos_token_id=248044),
    # gpt-oss-120b layer shapes: 36 layers alternating sliding (128) / full attention with sinks,
    # 128 experts top-4 stored in MXFP4 as the official checkpoint (*_blocks, *_scales).
    "gpt-oss-120b": dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880,
                         num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                         num_local_experts=128, num_experts_per_tok=4, intermediate_size=2880,
                         sliding_window=128, num_hidden_layers=36, attention_bias=True),
    # DeepSeek-V3 / R1 layer shapes: MLA (q LoRA 1536, KV latent 512 + 64 RoPE dims), 256
    # experts top-8 in 8 groups (4 kept), one shared expert, the first 3 of 61 layers dense.
    "deepseek-v3": dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=7168,
                        num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
                        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                        v_head_dim=128, n_routed_experts=256, num_experts_per_tok=8, n_group=8,
                        topk_group=4, n_shared_experts=1, routed_scaling_factor=2.5,
                        moe_intermediate_size=2048, intermediate_size=18432,
                        first_k_dense_replace=3, norm_topk_prob=True, num_hidden_layers=61),
    # Tiny layers with the real Qwen vocabulary: end-to-end tests of the text commands.
    "tiny-qwen-vocab": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=32,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                            intermediate_size=32, norm_topk_prob=True, num_hidden_layers=2),
    # Small, with every matrix's K a multiple of 64, so that a GPU's int4 GEMVs take their int8
    # activation path (test_cuda_model; the transformers fixtures have hidden size 48).
    "tiny-k64": dict(model_type="qwen3_moe", vocab_size=1024, hidden_size=128,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=16,
                     num_experts_per_tok=4, moe_intermediate_size=128, intermediate_size=256,
                     norm_topk_prob=True, num_hidden_layers=2),
    # A tiny shape for smoke tests.
    "tiny": dict(model_type="qwen3_moe", vocab_size=512, hidden_size=64, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, intermediate_size=96, norm_topk_prob=True,
                 num_hidden_layers=2),
}


def next_primes(base, skip, count):
    """The primes >= base, after skipping `skip` of them: each n-gram head's vocabulary."""
    def is_prime(v):
        if v < 2 or v % 2 == 0:
            return v == 2
        return all(v % d for d in range(3, int(v ** 0.5) + 1, 2))
    out, p = [], base - 1
    while len(out) < skip + count:
        p += 1
        while not is_prime(p):
            p += 1
        out.append(p)
    return out[skip:]


class Writer:
    """Streams tensors into one safetensors file without holding them all in memory."""

    def __init__(self, path, specs):
        self.path = path
        header, off = {}, 0
        for name, (dtype, shape) in specs.items():
            n = int(np.prod(shape)) * {"BF16": 2, "U8": 1}.get(dtype, 4)
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

    def hole(self, nbytes):
        """Skips nbytes: they read back as zeros and take no disk space (a sparse file)."""
        self.f.seek(nbytes, os.SEEK_CUR)

    def close(self):
        self.f.truncate(self.f.tell())
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
    ap.add_argument("--zero-experts", action="store_true",
                    help="leave the routed experts' weights (and PLE n-gram tables) zero, as holes in "
                         "a sparse file: the BF16 source of a 512-expert model does not fit on disk "
                         "otherwise. Bytes moved and time per token are unchanged; the output is "
                         "still noise.")
    ap.add_argument("--ngram-base", type=int, help="override ngram_vocab_size_base (table rows)")
    a = ap.parse_args()
    cfg = dict(PRESETS[a.preset])
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    if a.ngram_base:
        cfg["ngram_vocab_size_base"] = a.ngram_base
    if cfg["model_type"] in ("gpt_oss", "deepseek_v3"):
        return write_other(a, cfg)
    qwen4 = cfg["model_type"] == "qwen4_exp_text"
    hybrid = cfg["model_type"] in ("qwen3_5_moe_text", "qwen4_exp_text")
    cfg.update(rms_norm_eps=1e-6, max_position_embeddings=40960, hidden_act="silu",
               tie_word_embeddings=False, torch_dtype="bfloat16")
    V, H, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, I = cfg["num_experts"], cfg["moe_intermediate_size"]
    if hybrid:
        cfg.update(architectures=["Qwen4ExpForCausalLM" if qwen4 else "Qwen3_5MoeForCausalLM"],
                   rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                        partial_rotary_factor=0.25),
                   layer_types=["full_attention" if (l + 1) % cfg["full_attention_interval"] == 0
                                else "linear_attention" for l in range(L)])
    else:
        cfg.update(rope_theta=1000000.0, decoder_sparse_step=1, mlp_only_layers=[],
                   architectures=["Qwen3MoeForCausalLM"])

    specs = {"model.embed_tokens.weight": ("BF16", (V, H)), "lm_head.weight": ("BF16", (V, H))}
    hc = cfg.get("hc_count", 0)

    def hyper(p, inject):  # a hyper-connection's gated residual (Qwen4-Exp)
        specs[p + "hc_norm.weight"] = ("BF16", (hc * H,))
        specs[p + "input_mix_weight_down.weight"] = ("BF16", (cfg["hc_lowrank"], hc * H))
        specs[p + "input_mix_weight_up.weight"] = ("BF16", (hc * H, cfg["hc_lowrank"]))
        if inject:
            specs[p + "block_inject_weight.weight"] = ("BF16", (hc, hc * H))

    if qwen4:
        hyper("model.hyper_connection_mixer.", False)
    else:
        specs["model.norm.weight"] = ("BF16", (H,))
    for l in range(L):
        p = f"model.layers.{l}."
        if qwen4:
            hyper(p + "attn_hyper_connection.", True)
            hyper(p + "mlp_hyper_connection.", True)
        else:
            specs[p + "input_layernorm.weight"] = ("BF16", (H,))
            specs[p + "post_attention_layernorm.weight"] = ("BF16", (H,))
        if qwen4 and l + 1 in cfg["ple_layer_ids"]:
            G = (cfg["ngram_size"] - 1) * cfg["heads_per_ngram"]
            rows = 0  # the heads' prime vocabularies are each >= the base; pad like transformers
            base = cfg["ngram_vocab_size_base"]
            rows = sum(next_primes(base, cfg["ple_layer_ids"].index(l + 1) * G, G))
            div = cfg["make_ngram_vocab_size_divisible_by"]
            rows = (rows + div - 1) // div * div
            D = H  # ple_embed_dim defaults to hidden_size
            q = p + "ple."
            specs[q + "ple_embedding.ngram_embedding.weight"] = ("BF16", (rows, D // G))
            specs[q + "key_proj.weight"] = ("BF16", (hc * H, D))
            specs[q + "value_proj.weight"] = ("BF16", (H, D))
            for n in ("norm_key", "norm_query", "norm_conv"):
                specs[q + n + ".weight"] = ("BF16", (hc * H,))
            specs[q + "conv1d.weight"] = ("BF16", (hc * H, 1, cfg["ple_conv_kernel_size"]))
        if hybrid and cfg["layer_types"][l] == "linear_attention":
            nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
            kd, vd = nk * cfg["linear_key_head_dim"], nv * cfg["linear_value_head_dim"]
            q = p + "linear_attn."
            specs[q + "in_proj_qkv.weight"] = ("BF16", (2 * kd + vd, H))
            specs[q + "in_proj_z.weight"] = ("BF16", (vd, H))
            specs[q + "in_proj_b.weight"] = ("BF16", (nv, H))
            specs[q + "in_proj_a.weight"] = ("BF16", (nv, H))
            specs[q + "conv1d.weight"] = ("BF16", (2 * kd + vd, 1, cfg["linear_conv_kernel_dim"]))
            specs[q + "A_log"] = ("BF16", (nv,))
            specs[q + "dt_bias"] = ("BF16", (nv,))
            specs[q + "norm.weight"] = ("BF16", (cfg["linear_value_head_dim"],))
            specs[q + "out_proj.weight"] = ("BF16", (H, vd))
        else:
            qrows = (2 if hybrid else 1) * nh * hd  # gated attention: [query | gate] per head
            specs[p + "self_attn.q_proj.weight"] = ("BF16", (qrows, H))
            specs[p + "self_attn.k_proj.weight"] = ("BF16", (nkv * hd, H))
            specs[p + "self_attn.v_proj.weight"] = ("BF16", (nkv * hd, H))
            specs[p + "self_attn.o_proj.weight"] = ("BF16", (H, nh * hd))
            specs[p + "self_attn.q_norm.weight"] = ("BF16", (hd,))
            specs[p + "self_attn.k_norm.weight"] = ("BF16", (hd,))
            if qwen4:
                ih, ihd = cfg["indexer_n_heads"], cfg["indexer_head_dim"]
                specs[p + "self_attn.indexer.index_qk_proj.weight"] = ("BF16", ((ih + 1) * ihd, H))
                specs[p + "self_attn.indexer.q_layernorm.weight"] = ("BF16", (ihd,))
                specs[p + "self_attn.indexer.k_layernorm.weight"] = ("BF16", (ihd,))
        specs[p + "mlp.gate.weight"] = ("BF16", (E, H))
        if hybrid:
            Is = cfg["shared_expert_intermediate_size"]
            specs[p + "mlp.shared_expert.gate_proj.weight"] = ("BF16", (Is, H))
            specs[p + "mlp.shared_expert.up_proj.weight"] = ("BF16", (Is, H))
            specs[p + "mlp.shared_expert.down_proj.weight"] = ("BF16", (H, Is))
            specs[p + "mlp.shared_expert_gate.weight"] = ("BF16", (1, H))
        specs[p + "mlp.experts.gate_up_proj"] = ("BF16", (E, 2 * I, H))
        specs[p + "mlp.experts.down_proj"] = ("BF16", (E, H, I))

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    rng = np.random.default_rng(a.seed)
    w = Writer(os.path.join(a.out, "model.safetensors"), specs)
    for i, (name, (_, shape)) in enumerate(specs.items()):
        if a.zero_experts and (".mlp.experts." in name or ".ngram_embedding." in name):
            w.hole(int(np.prod(shape)) * 2)
            continue
        if name.endswith("norm.weight") and hybrid:
            arr = bf16(rng, shape, 0.1)  # (1 + w) norms, and the gated norm's w near 0.1
        elif name.endswith("norm.weight"):
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


def write_other(a, cfg):
    """gpt-oss and DeepSeek-V3: their own tensor names (transformers'), written like main's."""
    cfg.update(max_position_embeddings=131072, tie_word_embeddings=False, torch_dtype="bfloat16",
               hidden_act="silu")
    V, H, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    specs = {"model.embed_tokens.weight": ("BF16", (V, H)), "lm_head.weight": ("BF16", (V, H)),
             "model.norm.weight": ("BF16", (H,))}
    if cfg["model_type"] == "gpt_oss":
        nkv, hd, E, I = cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_local_experts"], cfg["intermediate_size"]
        cfg.update(architectures=["GptOssForCausalLM"], rms_norm_eps=1e-5,
                   layer_types=["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(L)],
                   rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                        beta_fast=32.0, beta_slow=1.0, truncate=False,
                                        original_max_position_embeddings=4096),
                   quantization_config=dict(quant_method="mxfp4", modules_to_not_convert=[
                       "model.layers.*.self_attn", "model.layers.*.mlp.router",
                       "model.embed_tokens", "lm_head"]))
        for l in range(L):
            p = f"model.layers.{l}."
            specs[p + "input_layernorm.weight"] = ("BF16", (H,))
            specs[p + "post_attention_layernorm.weight"] = ("BF16", (H,))
            for n, rows, cols in (("q", nh * hd, H), ("k", nkv * hd, H), ("v", nkv * hd, H), ("o", H, nh * hd)):
                specs[p + f"self_attn.{n}_proj.weight"] = ("BF16", (rows, cols))
                specs[p + f"self_attn.{n}_proj.bias"] = ("BF16", (rows,))
            specs[p + "self_attn.sinks"] = ("BF16", (nh,))
            specs[p + "mlp.router.weight"] = ("BF16", (E, H))
            specs[p + "mlp.router.bias"] = ("BF16", (E,))
            specs[p + "mlp.experts.gate_up_proj_blocks"] = ("U8", (E, 2 * I, H // 32, 16))
            specs[p + "mlp.experts.gate_up_proj_scales"] = ("U8", (E, 2 * I, H // 32))
            specs[p + "mlp.experts.gate_up_proj_bias"] = ("BF16", (E, 2 * I))
            specs[p + "mlp.experts.down_proj_blocks"] = ("U8", (E, H, I // 32, 16))
            specs[p + "mlp.experts.down_proj_scales"] = ("U8", (E, H, I // 32))
            specs[p + "mlp.experts.down_proj_bias"] = ("BF16", (E, H))
    else:
        E, I, Id = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
        qr, kr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
        rd, nd, vd = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        cfg["first_k_dense_replace"] = min(cfg["first_k_dense_replace"], max(L - 2, 0))
        cfg.update(architectures=["DeepseekV3ForCausalLM"], rms_norm_eps=1e-6, rope_interleave=True,
                   max_position_embeddings=163840,
                   rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                        beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                        original_max_position_embeddings=4096))
        for l in range(L):
            p = f"model.layers.{l}."
            specs[p + "input_layernorm.weight"] = ("BF16", (H,))
            specs[p + "post_attention_layernorm.weight"] = ("BF16", (H,))
            q = p + "self_attn."
            specs[q + "q_a_proj.weight"] = ("BF16", (qr, H))
            specs[q + "q_a_layernorm.weight"] = ("BF16", (qr,))
            specs[q + "q_b_proj.weight"] = ("BF16", (nh * (nd + rd), qr))
            specs[q + "kv_a_proj_with_mqa.weight"] = ("BF16", (kr + rd, H))
            specs[q + "kv_a_layernorm.weight"] = ("BF16", (kr,))
            specs[q + "kv_b_proj.weight"] = ("BF16", (nh * (nd + vd), kr))
            specs[q + "o_proj.weight"] = ("BF16", (H, nh * vd))
            if l < cfg["first_k_dense_replace"]:
                for n, rows, cols in (("gate", Id, H), ("up", Id, H), ("down", H, Id)):
                    specs[p + f"mlp.{n}_proj.weight"] = ("BF16", (rows, cols))
                continue
            specs[p + "mlp.gate.weight"] = ("BF16", (E, H))
            specs[p + "mlp.gate.e_score_correction_bias"] = ("F32", (E,))
            Is = I * cfg["n_shared_experts"]
            for n, rows, cols in (("gate", Is, H), ("up", Is, H), ("down", H, Is)):
                specs[p + f"mlp.shared_experts.{n}_proj.weight"] = ("BF16", (rows, cols))
            for e in range(E):
                for n, rows, cols in (("gate", I, H), ("up", I, H), ("down", H, I)):
                    specs[p + f"mlp.experts.{e}.{n}_proj.weight"] = ("BF16", (rows, cols))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    rng = np.random.default_rng(a.seed)
    w = Writer(os.path.join(a.out, "model.safetensors"), specs)
    for i, (name, (dtype, shape)) in enumerate(specs.items()):
        nbytes = int(np.prod(shape)) * {"BF16": 2, "U8": 1}.get(dtype, 4)
        if a.zero_experts and ".mlp.experts." in name and not name.endswith("_scales"):
            w.hole(nbytes)
            continue
        if name.endswith("_blocks"):  # random FP4 codes
            w.put(rng.integers(0, 256, size=shape, dtype=np.uint8))
        elif name.endswith("_scales"):  # e8m0: weights of about 2^-6
            w.put(rng.integers(119, 124, size=shape, dtype=np.uint8))
        elif dtype == "F32":
            w.put((rng.standard_normal(size=shape, dtype=np.float32) * 0.01).astype(np.float32))
        elif name.endswith("norm.weight"):
            w.put(np.full(shape, 0x3F80, dtype=np.uint16))
        elif name.endswith("mlp.gate.weight") or name.endswith("router.weight"):
            w.put(bf16(rng, shape, 0.05))
        else:
            w.put(bf16(rng, shape, 0.02))
        print(f"\r[{i + 1}/{len(specs)}] {name}".ljust(70), end="", file=sys.stderr, flush=True)
    w.close()
    print(f"\nwrote {a.out} ({os.path.getsize(os.path.join(a.out, 'model.safetensors')) / 1e9:.2f} GB)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
