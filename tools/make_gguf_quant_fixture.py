#!/usr/bin/python3
"""A random-weight qwen3moe GGUF in F32 for the quantised-type fixtures.

Usage:  PYTHONPATH=LLAMA_SRC/gguf-py make_gguf_quant_fixture.py OUT.gguf PROMPT.json

Every matrix has rows of 256 elements (hidden 256, 4 heads of 64, expert size 256), so that
llama-quantize can give it any type, K-quants included: one layer of attention (2 KV heads,
q/k norms) and 4 routed experts (top 2), a 288-token byte-level BPE vocabulary (a token per
byte, then the 32 pairs of the letters a..d and a..h as merges; Qwen2's pre-tokenizer). Weights are N(0, 1/K) so activations stay of order one and the logits
spread (a clear greedy choice); norms are 1 + N(0, 0.1). PROMPT.json gets 128 random ids.
"""
import json
import sys

import numpy as np
import gguf

from make_gguf_fixtures import bytes_to_unicode  # GPT-2's byte-to-character map

H, NH, NKV, HD, E, K_USED, I, V, LAYERS = 256, 4, 2, 64, 4, 2, 256, 288, 1


def main():
    out, prompt = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(2026)

    def mat(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(out, "qwen3moe")
    w.add_name("sluice-quant-fixture")
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(K_USED)
    w.add_expert_feed_forward_length(I)
    w.add_file_type(0)
    b2u = bytes_to_unicode()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    pairs = [(a, b) for a in "abcd" for b in "abcdefgh"]
    w.add_token_list([b2u[b] for b in range(256)] + [a + b for a, b in pairs])
    w.add_token_types([1] * V)
    w.add_token_merges(["%s %s" % p for p in pairs])
    w.add_add_bos_token(False)

    w.add_tensor("token_embd.weight", (rng.standard_normal((V, H))).astype(np.float32))
    for l in range(LAYERS):
        p = "blk.%d." % l
        w.add_tensor(p + "attn_norm.weight", norm(H))
        w.add_tensor(p + "attn_q.weight", mat(NH * HD, H))
        w.add_tensor(p + "attn_k.weight", mat(NKV * HD, H))
        w.add_tensor(p + "attn_v.weight", mat(NKV * HD, H))
        w.add_tensor(p + "attn_output.weight", mat(H, NH * HD))
        w.add_tensor(p + "attn_q_norm.weight", norm(HD))
        w.add_tensor(p + "attn_k_norm.weight", norm(HD))
        w.add_tensor(p + "ffn_norm.weight", norm(H))
        w.add_tensor(p + "ffn_gate_inp.weight", (2.0 * mat(E, H)).astype(np.float32))
        w.add_tensor(p + "ffn_gate_exps.weight", np.stack([mat(I, H) for _ in range(E)]))
        w.add_tensor(p + "ffn_up_exps.weight", np.stack([mat(I, H) for _ in range(E)]))
        w.add_tensor(p + "ffn_down_exps.weight", np.stack([mat(H, I) for _ in range(E)]))
    w.add_tensor("output_norm.weight", norm(H))
    w.add_tensor("output.weight", (4.0 * mat(V, H)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ids = [int(x) for x in rng.integers(0, V, 128)]
    with open(prompt, "w") as f:
        json.dump({"ids": ids}, f)


if __name__ == "__main__":
    main()
