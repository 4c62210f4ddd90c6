#!/usr/bin/env python3
"""Tiny random-weight reference checkpoints of the MoE families of issue 27 (gpt_oss, deepseek_v3,
glm4_moe, qwen3_vl_moe, mixtral, olmoe, llama4, gemma4), made by transformers.

Usage:  python3 tools/make_fixtures_fam.py OUTDIR [--only a,b]

Needs torch, transformers (written against 5.17), safetensors, numpy; runs on the CPU in float32
with eager attention and eager experts. Reuses tools/make_fixtures.py's helpers.

Per case OUTDIR/<case>/:
  config.json (+ generation_config.json)  as save_pretrained writes them
  model.safetensors                       BF16, exactly the values the reference used
  ref.json      ids (40 tokens), greedy (8 new ids through generate(), i.e. the KV cache),
                ids_long (130 tokens) and greedy_long, router and top-2 gaps, the case's notes
  logits.f32            T x V float32 LE logits of one forward over ids
  logits_long_tail.f32  the last 16 rows of one forward over ids_long

Every parameter is perturbed (norm weights around their init, biases, attention sinks, router
correction biases and scales, per-layer inputs), and a weight seed / prompt is kept only when
every router decision of the short prompt and its continuation has a margin above GAP (the
family's own selection score: softmax probability, sigmoid + correction bias with groups, or the
raw logit). gpt_oss_mxfp4 holds gpt_oss_a's model with its experts in the MXFP4 layout of the
official checkpoints (*_blocks, *_scales): the experts are drawn MXFP4-exact, so both files hold
the same numbers and share one reference.
"""

import copy
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
from make_fixtures_next import write_ref  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

log = mf.log
GAP = 1e-3
T_SHORT, T_LONG, N_GEN, TAIL = 40, 130, 8, 16
V = 128

NOIDS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)

# Gemma 4's own RoPE per layer kind (transformers' default, as the MoE checkpoints have it).
GEMMA4_ROPE = {"full_attention": dict(rope_type="proportional", rope_theta=1000000.0,
                                      partial_rotary_factor=0.25),
               "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}

# gemma4_a's model; gemma4_vlm holds the same text model.
GEMMA4_A = dict(vocab_size=V, hidden_size=64, intermediate_size=32, moe_intermediate_size=16,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                enable_moe_block=True, num_experts=6, top_k_experts=2,
                hidden_size_per_layer_input=16, vocab_size_per_layer_input=V,
                layer_types=["sliding_attention", "full_attention", "sliding_attention",
                             "full_attention"],
                global_head_dim=32, sliding_window=16,
                final_logit_softcapping=30.0, rms_norm_eps=1e-6, max_position_embeddings=8192,
                tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=0,
                rope_parameters=GEMMA4_ROPE)

CASES = [
    # gpt-oss-20b/120b: alternating sliding (128) / full layers, YaRN (factor 32 over 4096),
    # sinks, biases; E=4 k=2 here. Sliding window 8 so that 40 tokens cross it.
    dict(name="gpt_oss_a", mt="gpt_oss", seed=27100, mxfp4="gpt_oss_mxfp4",
         cfg=dict(vocab_size=V, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                  num_experts_per_tok=2, sliding_window=8, rms_norm_eps=1e-5,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                  max_position_embeddings=131072, tie_word_embeddings=False, attention_bias=True,
                  rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                       beta_fast=32.0, beta_slow=1.0, truncate=False,
                                       original_max_position_embeddings=4096))),
    # DeepSeek-V3/R1: q LoRA, group-limited routing (here 4 groups of 2, 2 kept), one dense layer
    # first, YaRN with mscale, interleaved RoPE (rope_interleave), shared expert.
    dict(name="deepseek_v3_a", mt="deepseek_v3", seed=27200,
         cfg=dict(vocab_size=V, hidden_size=64, intermediate_size=48, moe_intermediate_size=16,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                  n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5,
                  kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16,
                  v_head_dim=12, n_group=4, topk_group=2, num_experts_per_tok=2,
                  first_k_dense_replace=1, norm_topk_prob=True, rms_norm_eps=1e-6,
                  max_position_embeddings=163840, tie_word_embeddings=False, rope_interleave=True,
                  rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                       beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                       mscale_all_dim=1.0, original_max_position_embeddings=4096))),
    # DeepSeek-V2-Lite / Kimi-K2 style: no q LoRA, one group, scaling 2.827, all layers MoE,
    # default RoPE, rope_interleave off (the other variant of the flag).
    dict(name="deepseek_v3_b", mt="deepseek_v3", seed=27300,
         cfg=dict(vocab_size=V, hidden_size=48, intermediate_size=64, moe_intermediate_size=16,
                  num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3,
                  n_shared_experts=2, n_routed_experts=8, routed_scaling_factor=2.827,
                  kv_lora_rank=24, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                  v_head_dim=16, n_group=1, topk_group=1, num_experts_per_tok=3,
                  first_k_dense_replace=0, norm_topk_prob=True, rms_norm_eps=1e-6,
                  max_position_embeddings=4096, tie_word_embeddings=False, rope_interleave=False,
                  rope_parameters=dict(rope_type="default", rope_theta=50000.0))),
    # GLM-4.5: partial RoPE 0.5, qk norm, attention bias, sigmoid routing with correction bias,
    # shared expert, first layer dense; 6 heads of 16 on a hidden size of 64.
    dict(name="glm4_moe_a", mt="glm4_moe", seed=27400,
         cfg=dict(vocab_size=V, hidden_size=64, intermediate_size=48, moe_intermediate_size=16,
                  num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                  n_shared_experts=1, n_routed_experts=6, routed_scaling_factor=2.5, n_group=1,
                  topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
                  norm_topk_prob=True, use_qk_norm=True, attention_bias=True, rms_norm_eps=1e-5,
                  max_position_embeddings=131072, tie_word_embeddings=False,
                  partial_rotary_factor=0.5,
                  rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                       partial_rotary_factor=0.5))),
    dict(name="mixtral_a", mt="mixtral", seed=27500,
         cfg=dict(vocab_size=V, hidden_size=48, intermediate_size=16, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_local_experts=6,
                  num_experts_per_tok=2, rms_norm_eps=1e-5, sliding_window=None,
                  max_position_embeddings=32768, tie_word_embeddings=False,
                  rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # OLMoE-1B-7B: full-width q/k norms, no top-k renormalisation, 64 experts top-8 (8/3 here).
    dict(name="olmoe_a", mt="olmoe", seed=27600,
         cfg=dict(vocab_size=V, hidden_size=48, intermediate_size=16, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=4, num_experts=8,
                  num_experts_per_tok=3, norm_topk_prob=False, clip_qkv=None, rms_norm_eps=1e-5,
                  max_position_embeddings=4096, tie_word_embeddings=False,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Qwen3-VL-30B-A3B: the text model of the vision-language checkpoint; interleaved M-RoPE.
    dict(name="qwen3_vl_moe_a", mt="qwen3_vl_moe", text_mt="qwen3_vl_moe_text", seed=27700, vlm=True,
         cfg=dict(vocab_size=V, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_experts=6, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                  norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=False,
                  rope_parameters=dict(rope_type="default", rope_theta=5000000.0,
                                       mrope_section=[4, 2, 2], mrope_interleaved=True)),
         vision=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                     patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                     num_position_embeddings=16, deepstack_visual_indexes=[0])),
    # Llama-4 Scout style: every layer MoE (top-1 sigmoid, input-scaled) + shared expert, 3 chunked
    # RoPE layers then a NoPE full layer with temperature tuning, qk L2 norm, llama3 RoPE scaling.
    # chunk 16 and floor_scale 16 so that 130 tokens cross both.
    dict(name="llama4_a", mt="llama4_text", seed=27800,
         cfg=dict(vocab_size=V, hidden_size=64, intermediate_size=16, intermediate_size_mlp=48,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1,
                  no_rope_layer_interval=4, attention_chunk_size=16, attn_temperature_tuning=True,
                  floor_scale=16, attn_scale=0.1, use_qk_norm=True, rms_norm_eps=1e-5,
                  max_position_embeddings=131072, tie_word_embeddings=False,
                  rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=16.0,
                                       low_freq_factor=1.0, high_freq_factor=1.0,
                                       original_max_position_embeddings=8192))),
    # Llama-4 Maverick style text weights (MoE on every other layer, no qk norm) in the
    # ConditionalGeneration wrapper.
    dict(name="llama4_vlm", mt="llama4_text", seed=27900, vlm=True,
         cfg=dict(vocab_size=V, hidden_size=64, intermediate_size=16, intermediate_size_mlp=32,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                  no_rope_layer_interval=4, attention_chunk_size=16, attn_temperature_tuning=True,
                  floor_scale=16, attn_scale=0.1, use_qk_norm=False, rms_norm_eps=1e-5,
                  max_position_embeddings=131072, tie_word_embeddings=False,
                  rope_parameters=dict(rope_type="default", rope_theta=500000.0)),
         vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, image_size=16, patch_size=8, vision_output_dim=32,
                     projector_input_dim=32, projector_output_dim=32, pixel_shuffle_ratio=0.5)),
    # Gemma-4 with the MoE block: sliding / full layers with their own RoPE and head dim (the
    # last layer is always full), per-layer inputs, soft-capping. The router scales its normed
    # input by H^-0.5, hence the larger router_sigma.
    dict(name="gemma4_a", mt="gemma4_text", seed=28000, router_sigma=12.0, cfg=GEMMA4_A),
    # The other switches: no per-layer inputs, keys as values (attention_k_eq_v), no soft-capping.
    dict(name="gemma4_b", mt="gemma4_text", seed=28100, router_sigma=10.0,
         cfg=dict(vocab_size=V, hidden_size=48, intermediate_size=48, moe_intermediate_size=16,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                  enable_moe_block=True, num_experts=6, top_k_experts=2,
                  hidden_size_per_layer_input=0, vocab_size_per_layer_input=V,
                  attention_k_eq_v=True, global_head_dim=32, num_global_key_value_heads=1,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                  sliding_window=12, final_logit_softcapping=None, rms_norm_eps=1e-6,
                  max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=None,
                  eos_token_id=None, pad_token_id=0,
                  rope_parameters=GEMMA4_ROPE)),
    # The Gemma-4 E-models' switches beside the MoE block: the last two layers attend the K/V of
    # the last earlier layer of their kind (num_kv_shared_layers) through a double-wide MLP.
    dict(name="gemma4_c", mt="gemma4_text", seed=28200, router_sigma=12.0,
         cfg=dict(vocab_size=V, hidden_size=48, intermediate_size=24, moe_intermediate_size=16,
                  num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  enable_moe_block=True, num_experts=6, top_k_experts=2,
                  hidden_size_per_layer_input=8, vocab_size_per_layer_input=V,
                  num_kv_shared_layers=2, use_double_wide_mlp=True,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention",
                               "sliding_attention", "full_attention"],
                  global_head_dim=32, sliding_window=10, final_logit_softcapping=20.0,
                  rms_norm_eps=1e-6, max_position_embeddings=8192, tie_word_embeddings=True,
                  bos_token_id=None, eos_token_id=None, pad_token_id=0,
                  rope_parameters=GEMMA4_ROPE)),
    # gemma4_a's text model in Gemma4ForConditionalGeneration (model.language_model.*), no towers.
    dict(name="gemma4_vlm", mt="gemma4_text", seed=28300, router_sigma=12.0, vlm=True,
         cfg=GEMMA4_A),
]

FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


# ---------------------------------------------------------------------------------------------
def make_config(case):
    kw = dict(NOIDS)
    kw.update(copy.deepcopy(case["cfg"]))  # the cases share GEMMA4_ROPE and GEMMA4_A
    return AutoConfig.for_model(case.get("text_mt", case["mt"]), **kw)


def vlm_config(case, text_cfg):
    mt = case["mt"]
    if mt == "qwen3_vl_moe":
        Cfg = transformers.Qwen3VLMoeConfig
        vis = dict(case["vision"], out_hidden_size=text_cfg.hidden_size)
        return Cfg(text_config=text_cfg.to_dict(), vision_config=vis,
                   image_token_id=V - 3, video_token_id=V - 2, vision_start_token_id=V - 4,
                   vision_end_token_id=V - 1, tie_word_embeddings=False)
    if mt == "llama4_text":
        Cfg = transformers.Llama4Config
        return Cfg(text_config=text_cfg.to_dict(), vision_config=dict(case["vision"]),
                   boi_token_index=V - 4, eoi_token_index=V - 3, image_token_index=V - 2,
                   tie_word_embeddings=False)
    if mt == "gemma4_text":
        return transformers.Gemma4Config(text_config=text_cfg.to_dict(), vision_config=None,
                                         audio_config=None, tie_word_embeddings=True)
    raise ValueError(mt)


def build_model(case):
    config = make_config(case)
    if case.get("vlm"):
        vc = vlm_config(case, config)
        Cls = {"qwen3_vl_moe": transformers.Qwen3VLMoeForConditionalGeneration,
               "llama4_text": transformers.Llama4ForConditionalGeneration,
               "gemma4_text": transformers.Gemma4ForConditionalGeneration}[case["mt"]]
        vc._attn_implementation = "eager"
        m = Cls._from_config(vc, attn_implementation="eager", dtype=torch.float32)
    else:
        m = AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                             dtype=torch.float32)
    m = m.float().eval()
    mf.force_eager(m)
    return m


def text_config(m):
    return m.config.get_text_config()


ROUTER_W = ("mlp.gate.weight", "mlp.router.weight", "feed_forward.router.weight",
            "router.proj.weight")


def perturb(m, seed, case, mxfp4=False):
    """Every parameter, and the buffers a checkpoint carries (router correction biases, layer
    scalars), gets a deterministic random value, BF16-exact (MXFP4-exact for the experts of an
    MXFP4 case)."""
    g = torch.Generator().manual_seed(seed)
    tc = text_config(m)
    H = tc.hidden_size
    tied = bool(getattr(tc, "tie_word_embeddings", False) or getattr(m.config, "tie_word_embeddings", False))
    kinds = {}
    sd_names = set(m.state_dict().keys())
    items = list(m.named_parameters())
    items += [(n, b) for n, b in m.named_buffers() if n in sd_names and
              ("e_score_correction_bias" in n or "layer_scalar" in n)]
    with torch.no_grad():
        for name, p in items:
            shape = tuple(p.shape)
            r = torch.randn(shape, generator=g, dtype=torch.float32)
            base = name.rsplit(".", 1)[-1]
            if "norm" in name.rsplit(".", 2)[-2] and base in ("weight", "scale"):
                if torch.all(p == 0):
                    v, kd = 0.3 * r, "norm(1+w)"
                else:
                    v, kd = 1.0 + 0.3 * r, "norm"
            elif "e_score_correction_bias" in name:
                v, kd = 0.1 * r, "correction_bias"
            elif "layer_scalar" in name:
                v, kd = 0.75 + 0.5 * torch.rand(shape, generator=g), "layer_scalar"
            elif name.endswith("per_expert_scale") or name.endswith("router.scale"):
                v, kd = 1.0 + 0.3 * r, "router_scale"
            elif name.endswith("sinks"):
                v, kd = r, "sinks"
            elif name.endswith(".bias") or name.endswith("_bias"):
                v, kd = 0.2 * r, "bias"
            elif any(name.endswith(s) for s in ROUTER_W):
                v, kd = r * (case.get("router_sigma", 1.5) / math.sqrt(H)), "router"
            elif name.endswith("embed_tokens.weight"):
                v, kd = r * (0.05 if tied else 0.5), "embed"
            elif "embed_tokens_per_layer" in name:
                v, kd = r * 0.5, "embed_per_layer"
            elif name.endswith("lm_head.weight"):
                v, kd = r * (1.0 / math.sqrt(H)), "lm_head"
            else:
                fan_in = shape[-1]
                if case["mt"] in ("gpt_oss",) and name.endswith("_proj") and len(shape) == 3:
                    fan_in = shape[1]  # gpt-oss stores experts in x out
                if case["mt"] == "llama4_text" and name.endswith("experts.gate_up_proj"):
                    fan_in = shape[1]
                if case["mt"] == "llama4_text" and name.endswith("experts.down_proj"):
                    fan_in = shape[1]
                v, kd = r * (0.7 / math.sqrt(fan_in)), "linear"
                if mxfp4 and ".experts." in name and name.endswith("_proj"):
                    v, kd = mxfp4_exact(v), "linear(mxfp4)"
            kinds[name] = kd
            p.copy_(v.to(torch.bfloat16).to(torch.float32))
    return kinds


def mxfp4_exact(v):
    """Rounds an expert tensor stored in x out ([E, in, out], gpt-oss) to MXFP4 values: blocks of
    32 along `in` share a power-of-two scale."""
    E, K, N = v.shape
    w = v.transpose(1, 2).reshape(E, N, K // 32, 32)
    amax = w.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    e = torch.floor(torch.log2(amax / 6.0)) + 1  # 6 * 2^e >= amax
    q = w / torch.pow(2.0, e)
    mags = FP4[:8]
    idx = (q.abs()[..., None] - mags).abs().argmin(-1)
    out = mags[idx] * torch.sign(q) * torch.pow(2.0, e)
    return out.reshape(E, N, K).transpose(1, 2).contiguous()


def mxfp4_pack(v):
    """[E, in, out] MXFP4-exact -> blocks [E, out, in/32, 16] uint8 and scales [E, out, in/32]
    uint8 (e8m0), as transformers' dequantiser reads them (low nibble = even element)."""
    E, K, N = v.shape
    w = v.transpose(1, 2).reshape(E, N, K // 32, 32)
    amax = w.abs().amax(-1, keepdim=True)
    # the smallest power of two that keeps the block's largest value within 6
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp(min=1e-30) / 6.0)),
                    torch.zeros_like(amax))
    q = w / torch.pow(2.0, e)
    mag = (q.abs()[..., None] - FP4[:8]).abs().argmin(-1)
    code = mag + 8 * ((q < 0) & (mag > 0)).long()
    back = FP4[code] * torch.pow(2.0, e)
    assert torch.equal(back, w), "not MXFP4-exact"
    code = code.to(torch.uint8)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).contiguous()
    scales = (e[..., 0] + 127).to(torch.uint8).contiguous()
    return blocks, scales


# ---------------------------------------------------------------------------------------------
class RouterTap:
    """Captures each router's input and scores it as the family selects experts."""

    def __init__(self, m):
        self.caps, self.hooks = [], []
        for name, mod in m.named_modules():
            cls = type(mod).__name__
            if cls.endswith("Router"):
                target = mod.proj if hasattr(mod, "proj") else mod  # gemma4: after its norm
                self.hooks.append(target.register_forward_pre_hook(self._mk(name, mod)))

    def _mk(self, name, mod):
        def pre(_m, args):
            x = args[0]
            self.caps.append((mod, x.detach().reshape(-1, x.shape[-1]).float().clone()))
        return pre

    def clear(self):
        self.caps = []

    @staticmethod
    def margin(mod, x):
        cls = type(mod).__name__
        w = (mod.proj.weight if hasattr(mod, "proj") else mod.weight).float()
        b = getattr(mod, "bias", None)
        logits = F.linear(x, w, b.float() if isinstance(b, torch.Tensor) else None)
        k = getattr(mod, "top_k", None) or getattr(mod.config, "top_k_experts", None)
        if hasattr(mod, "e_score_correction_bias"):
            s = logits.sigmoid() + mod.e_score_correction_bias.float()
            G, kg = mod.num_group, mod.topk_group
            worst = float("inf")
            if G > 1:
                gs = s.view(-1, G, s.shape[-1] // G).topk(2, dim=-1)[0].sum(-1)
                gss = gs.sort(-1, descending=True).values
                worst = (gss[:, kg - 1] - gss[:, kg]).min().item()
                keep = gs.topk(kg, dim=-1)[1]
                mask = torch.zeros_like(gs).scatter_(1, keep, 1).bool()
                mask = mask[:, :, None].expand(-1, G, s.shape[-1] // G).reshape(s.shape)
                s = s.masked_fill(~mask, -1e9)
            ss = s.sort(-1, descending=True).values
            return min(worst, (ss[:, k - 1] - ss[:, k]).min().item())
        if cls in ("GptOssTopKRouter", "Llama4Router"):
            sel = logits
        else:
            sel = F.softmax(logits, dim=-1)
        ss = sel.sort(-1, descending=True).values
        return (ss[:, k - 1] - ss[:, k]).min().item()

    def min_gap(self):
        return min([self.margin(mod, x) for mod, x in self.caps] or [float("inf")])

    def remove(self):
        for h in self.hooks:
            h.remove()


def forward_logits(m, ids):
    with torch.no_grad():
        return m(input_ids=ids[None, :]).logits[0].float()


def evaluate(m, tap, ids, gate=True):
    T = ids.shape[0]
    tap.clear()
    forward_logits(m, ids)
    rg = tap.min_gap()
    if gate and rg <= GAP:
        return dict(ok=False, score=rg)
    with torch.no_grad():
        greedy, step = mf.greedy_generate(m, ids, N_GEN)
    full = torch.cat([ids, torch.tensor(greedy, dtype=ids.dtype)])
    tap.clear()
    lf = forward_logits(m, full)
    rg_full = tap.min_gap()
    rows = lf[T - 1:T - 1 + N_GEN]
    consistent = rows.argmax(-1).tolist() == greedy
    score = min(rg_full, mf.top2_gap(step), mf.top2_gap(rows))
    ok = consistent and score > GAP and len(set(greedy)) >= 3
    return dict(ok=ok, score=score, greedy=greedy, router_gap=rg_full, gen_gap=mf.top2_gap(step),
                consistent=consistent, step_vs_full=(rows - step).abs().max().item())


def save_pretrained_files(m, outdir):
    tmp = tempfile.mkdtemp(prefix="fxf_")
    try:
        ms = copy.deepcopy(m).to(torch.bfloat16)
        ms.save_pretrained(tmp)
        sd = mf.read_dir_tensors(tmp)
        files = mf.write_weights(sd, outdir, 1)
        for extra in ("config.json", "generation_config.json"):
            if os.path.exists(os.path.join(tmp, extra)):
                shutil.copy(os.path.join(tmp, extra), os.path.join(outdir, extra))
                files.append(extra)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return files, sd


def reload_check(outdir, ids, ref, cls=None, **kw):
    try:
        if cls is None:
            m2 = AutoModelForCausalLM.from_pretrained(outdir, attn_implementation="eager",
                                                      dtype=torch.float32, **kw)
        else:
            m2 = cls.from_pretrained(outdir, attn_implementation="eager", dtype=torch.float32, **kw)
        m2 = m2.float().eval()
        mf.force_eager(m2)
        d = (forward_logits(m2, ids) - ref).abs().max().item()
        return dict(loaded=True, cls=type(m2).__name__, maxdiff=d, ok=d == 0.0)
    except Exception as e:
        return dict(loaded=False, error=repr(e)[:500], ok=False)


def build_case(case, outroot):
    name = case["name"]
    log("=== %s (%s) ===" % (name, case["mt"]))
    t0 = time.time()
    m = build_model(case)
    tc = text_config(m)
    k = getattr(tc, "num_experts_per_tok", None) or getattr(tc, "top_k_experts", None)
    tap = RouterTap(m)
    log("  class %s, %d routers, k=%s" % (type(m).__name__, len(tap.hooks), k))
    hi = V - 5 if case.get("vlm") else V  # prompts hold no image/video token ids
    chosen = best = None
    for ws in range(8):
        wseed = case["seed"] + ws
        if ws:
            m2 = build_model(case)
            tap.remove()
            m, tap = m2, RouterTap(m2)
        kinds = perturb(m, wseed, case, mxfp4=bool(case.get("mxfp4")))
        gp = torch.Generator().manual_seed(wseed * 7919 + 13)
        for _ in range(40):
            ids = torch.randint(0, hi, (T_SHORT,), generator=gp, dtype=torch.long)
            r = evaluate(m, tap, ids)
            r["wseed"], r["ids"] = wseed, ids.tolist()
            if "greedy" in r and (best is None or r["score"] > best["score"]):
                best = r
            if r["ok"]:
                chosen = r
                break
            if time.time() - t0 > 60:
                break
        if chosen or time.time() - t0 > 60:
            break
    if chosen is None:
        if best is None:
            raise RuntimeError("no prompt passed the router check")
        log("  WARNING: best score %.3g" % best["score"])
        chosen = best
    ids = torch.tensor(chosen["ids"], dtype=torch.long)
    # the long prompt: the best of a few (its routers are rarely all above GAP)
    gp = torch.Generator().manual_seed(case["seed"] * 31 + 7)
    lbest = None
    for _ in range(6):
        lids = torch.randint(0, hi, (T_LONG,), generator=gp, dtype=torch.long)
        r = evaluate(m, tap, lids, gate=False)
        if lbest is None or (r["consistent"], r["score"]) > (lbest[1]["consistent"], lbest[1]["score"]):
            lbest = (lids, r)
        if r["ok"]:
            break
    lids, lr = lbest
    tap.remove()
    ref_logits = forward_logits(m, ids).contiguous()
    long_logits = forward_logits(m, lids)
    outdir = os.path.join(outroot, name)
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    files, sd = save_pretrained_files(m, outdir)
    cls = type(m) if case.get("vlm") else None
    verify = reload_check(outdir, ids, ref_logits, cls)
    log("  verify: %s" % verify)
    ref_logits.numpy().astype("<f4").tofile(os.path.join(outdir, "logits.f32"))
    long_logits[-TAIL:].contiguous().numpy().astype("<f4").tofile(os.path.join(outdir, "logits_long_tail.f32"))
    ref = {
        "ids": ids.tolist(), "greedy": chosen["greedy"], "ids_long": lids.tolist(),
        "greedy_long": lr["greedy"], "vocab_size": V, "long_tail_rows": TAIL,
        "min_router_gap": chosen["router_gap"], "min_top2_gap": chosen["gen_gap"],
        "long_router_gap": lr["router_gap"], "long_consistent": lr["consistent"],
        "step_vs_full": chosen["step_vs_full"], "weight_seed": chosen["wseed"],
        "model_class": type(m).__name__, "model_type": case["mt"],
        "transformers_version": transformers.__version__, "perturbed": sorted(set(kinds.values())),
    }
    write_ref(outdir, ref)
    out = dict(name=name, secs=round(time.time() - t0, 1), verify=verify,
               router_gap=chosen["router_gap"], gen_gap=chosen["gen_gap"],
               long_router_gap=lr["router_gap"], long_consistent=lr["consistent"],
               bytes=sum(os.path.getsize(os.path.join(outdir, f)) for f in os.listdir(outdir)))
    if case.get("mxfp4"):
        out["mxfp4"] = build_mxfp4(case, m, sd, ids, ref_logits, outroot, outdir)
    return out


def build_mxfp4(case, m, sd, ids, ref_logits, outroot, srcdir):
    """The same model with its experts as the official gpt-oss checkpoints store them."""
    name = case["mxfp4"]
    outdir = os.path.join(outroot, name)
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    q = {}
    for key, t in sd.items():
        if key.endswith("experts.gate_up_proj") or key.endswith("experts.down_proj"):
            blocks, scales = mxfp4_pack(t.float())
            q[key + "_blocks"], q[key + "_scales"] = blocks, scales
        else:
            q[key] = t.contiguous()
    save_file(q, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(srcdir, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for f in ("generation_config.json", "ref.json", "logits.f32", "logits_long_tail.f32"):
        if os.path.exists(os.path.join(srcdir, f)):
            shutil.copy(os.path.join(srcdir, f), os.path.join(outdir, f))
    verify = {}
    try:
        from transformers import Mxfp4Config
        verify = reload_check(outdir, ids, ref_logits, None,
                              quantization_config=Mxfp4Config(dequantize=True))
    except Exception as e:
        verify = dict(loaded=False, error=repr(e)[:500], ok=False)
    log("  %s verify: %s" % (name, verify))
    return dict(verify=verify, bytes=sum(os.path.getsize(os.path.join(outdir, f)) for f in os.listdir(outdir)))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    outroot = sys.argv[1]
    only = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None
    os.makedirs(outroot, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("FX_THREADS", "2")))
    torch.use_deterministic_algorithms(True, warn_only=True)
    transformers.logging.set_verbosity_error()
    log("transformers %s torch %s" % (transformers.__version__, torch.__version__))
    results = []
    for case in CASES:
        if only and case["name"] not in only:
            continue
        try:
            results.append(build_case(case, outroot))
        except Exception:
            tb = traceback.format_exc()
            log(tb)
            results.append(dict(name=case["name"], error=tb[-1500:]))
        log("  -> %s" % json.dumps(results[-1])[:600])
    with open(os.path.join(outroot, "summary-fam.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
