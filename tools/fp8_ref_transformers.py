#!/usr/bin/env python3
"""transformers' reference for an FP8 fixture (tests/fixtures/fp8_qwen3, tools/make_fp8_fixture.py).

Usage:  python3 tools/fp8_ref_transformers.py [FIXDIR] [--n N]

Needs torch, transformers (written against 5.17), safetensors, numpy; runs on the CPU in
float32 (eager attention and experts). Writes, next to the fixture's weights, what
tools/make_fixtures.py writes for the other fixtures:
  ref.json     {"ids", "greedy", "vocab_size", "min_top2_gap", "min_router_gap", ...}
  logits.f32   float32 LE logits of one forward over ids, T x V
which tests/cli_test.sh (check_ref) and test_cuda_model then check sluice against.

The reference model is float32 with the dequantised weights w = float32(fp8 * weight_scale_inv)
per 128 x 128 block (the state dict dequantised here, written as a float32 twin that
from_pretrained loads: the weights sluice multiplies by, exactly). transformers' own FP8 path
(FineGrainedFP8Config(dequantize=True)) is also tried, for information: its relative L2
distance to the reference goes into ref.json as "hf_fp8_dequantize_rel_l2" (it dequantises to
the model's dtype, so it is not the reference itself).
"""

import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GenerationConfig

N_NEW = 12
IDS_SEED = 4242
T_PROMPT = 130  # 128+ tokens: the KV-cache path past short prompts


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def force_eager(m):
    for meth in ("set_attn_implementation", "set_experts_implementation"):
        f = getattr(m, meth, None)
        if f is not None:
            try:
                f("eager")
            except Exception as e:
                log("  %s('eager') failed: %r" % (meth, e))


def load_float32(path, **extra):
    variants = [
        dict(attn_implementation="eager", experts_implementation="eager", dtype=torch.float32),
        dict(attn_implementation="eager", dtype=torch.float32),
        dict(attn_implementation="eager", torch_dtype=torch.float32),
    ]
    err = None
    for kw in variants:
        try:
            m = AutoModelForCausalLM.from_pretrained(path, **kw, **extra)
            break
        except Exception as e:
            log("  (loader variant %s failed: %r)" % (sorted(kw), e))
            err = e
    else:
        raise err
    m = m.float().eval()
    force_eager(m)
    return m


def dequantize(sd, br, bc):
    out = {}
    for k, v in sd.items():
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            s = sd[k + "_scale_inv"].float()
            R, C = v.shape
            full = s.repeat_interleave(br, 0)[:R].repeat_interleave(bc, 1)[:, :C]
            # float32 product of an e4m3 value and a float32: rounded once, as sluice does
            out[k] = (v.float() * full).contiguous()
        else:
            out[k] = v.float().contiguous()
    return out


def greedy(m, ids, n):
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n,
                          eos_token_id=None, pad_token_id=0, bos_token_id=None)
    inp = ids[None, :]
    out = m.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=gc,
                     output_logits=True, return_dict_in_generate=True)
    seq = out.sequences[0, ids.shape[0]:].tolist()
    steps = torch.stack([l[0] for l in out.logits]).float()
    return seq, steps


def top2_gap(l2d):
    s = torch.topk(l2d.float(), 2, dim=-1).values
    return (s[:, 0] - s[:, 1]).min().item()


def router_gap(m, ids, k):
    """Smallest gap between the k-th and (k+1)-th router probability over the prompt's tokens."""
    gaps = []

    def hook(mod, args, out):
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        p = torch.softmax(x @ mod.weight.float().t(), dim=-1)
        s = torch.sort(p, dim=-1, descending=True).values
        gaps.append((s[:, k - 1] - s[:, k]).min().item())

    hs = [mod.register_forward_hook(hook) for name, mod in m.named_modules()
          if name.endswith("mlp.gate") and hasattr(mod, "weight")]
    with torch.no_grad():
        m(ids[None, :])
    for h in hs:
        h.remove()
    return min(gaps) if gaps else float("nan")


def main():
    args = [a for a in sys.argv[1:]]
    n = N_NEW
    if "--n" in args:
        i = args.index("--n")
        n = int(args[i + 1])
        del args[i : i + 2]
    fix = args[0] if args else "tests/fixtures/fp8_qwen3"
    with open(os.path.join(fix, "config.json")) as f:
        cfg = json.load(f)
    q = cfg.get("quantization_config") or {}
    br, bc = (q.get("weight_block_size") or [128, 128])[:2]
    sd = {}
    for name in sorted(os.listdir(fix)):
        if name.endswith(".safetensors"):
            sd.update(load_file(os.path.join(fix, name)))
    twin = tempfile.mkdtemp(prefix="fp8-twin-")
    try:
        save_file(dequantize(sd, br, bc), os.path.join(twin, "model.safetensors"),
                  metadata={"format": "pt"})
        c2 = dict(cfg)
        c2.pop("quantization_config", None)
        c2["dtype"] = "float32"
        with open(os.path.join(twin, "config.json"), "w") as f:
            json.dump(c2, f, indent=2)
        m = load_float32(twin)
    finally:
        shutil.rmtree(twin, ignore_errors=True)

    V, k = cfg["vocab_size"], cfg["num_experts_per_tok"]
    g = torch.Generator().manual_seed(IDS_SEED)
    ids = torch.randint(0, V, (T_PROMPT,), generator=g)
    with torch.no_grad():
        logits = m(ids[None, :]).logits[0].float()
    seq, steps = greedy(m, ids, n)
    ref = {
        "ids": ids.tolist(),
        "greedy": seq,
        "vocab_size": V,
        "min_top2_gap": min(top2_gap(logits), top2_gap(steps)),
        "min_router_gap": router_gap(m, ids, k),
        "logits_shape": list(logits.shape),
        "store_dtype": "fp8_e4m3 (block %dx%d, weight_scale_inv)" % (br, bc),
        "layout": "per_expert",
        "tensor_prefix": "model.",
        "reference": "float32 model of the dequantised weights (fp8 * weight_scale_inv, rounded once)",
        "transformers_version": transformers.__version__,
    }
    # transformers' own FP8 loading, for information only
    try:
        from transformers import FineGrainedFP8Config

        mq = load_float32(fix, quantization_config=FineGrainedFP8Config(dequantize=True))
        with torch.no_grad():
            lq = mq(ids[None, :]).logits[0].float()
        ref["hf_fp8_dequantize_rel_l2"] = (torch.linalg.norm(lq - logits) / torch.linalg.norm(logits)).item()
    except Exception as e:
        log("FineGrainedFP8Config(dequantize=True) failed: %r" % (e,))
        ref["hf_fp8_dequantize_rel_l2"] = "failed: %s" % type(e).__name__
    logits.numpy().astype("<f4").tofile(os.path.join(fix, "logits.f32"))
    with open(os.path.join(fix, "ref.json"), "w") as f:
        f.write("{\n" + ",\n".join(" %s: %s" % (json.dumps(kk), json.dumps(v)) for kk, v in ref.items()) + "\n}\n")
    log("wrote %s/ref.json and logits.f32: greedy %s, min top-2 gap %.3g, min router gap %.3g"
        % (fix, seq, ref["min_top2_gap"], ref["min_router_gap"]))
    if not (ref["min_top2_gap"] > 1e-3 and ref["min_router_gap"] > 1e-3):
        log("warning: a gap below 1e-3: the greedy ids or the routing may hinge on rounding")


if __name__ == "__main__":
    main()
