#!/usr/bin/env python3
"""Copy transformers' modeling sources of the issue-27 families to OUT and write OUT/facts.txt:
a tiny model per family (module tree, state_dict and save_pretrained key/shape lists, config.json)."""
import json, os, shutil, sys, tempfile, traceback
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
facts = open(os.path.join(out, "facts.txt"), "w")
def fact(*a):
    print(*a, file=facts, flush=True)
base = os.path.join(os.path.dirname(transformers.__file__), "models")
fams = ["gpt_oss", "deepseek_v3", "glm4_moe", "qwen3_vl_moe", "mixtral", "olmoe", "llama4", "gemma4", "gemma3n", "kimi_k2", "glm4v_moe"]
fact("transformers", transformers.__version__, "torch", torch.__version__)
fact("models dirs:", sorted(os.listdir(base)))
for d in fams:
    p = os.path.join(base, d)
    if os.path.isdir(p):
        for f in os.listdir(p):
            if f.endswith(".py"):
                shutil.copy(os.path.join(p, f), os.path.join(out, d + "__" + f))
for mod in ("integrations/mxfp4.py", "integrations/finegrained_fp8.py", "integrations/moe.py", "conversion_mapping.py",
            "modeling_rope_utils.py", "integrations/sdpa_attention.py", "masking_utils.py", "activations.py"):
    p = os.path.join(os.path.dirname(transformers.__file__), mod)
    if os.path.exists(p):
        shutil.copy(p, os.path.join(out, mod.replace("/", "__")))
tiny = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, max_position_embeddings=512)
for mt in ["gpt_oss", "deepseek_v3", "glm4_moe", "qwen3_vl_moe", "mixtral", "olmoe", "llama4_text", "llama4", "gemma4_text", "gemma4"]:
    fact("\n\n######## %s" % mt)
    try:
        c = AutoConfig.for_model(mt)
        fact("default config:", c.to_json_string())
    except Exception:
        fact("for_model failed:", traceback.format_exc()); continue
    try:
        tc = c.get_text_config()
        for k, v in tiny.items():
            if hasattr(tc, k):
                setattr(tc, k, v)
        for k in ("num_local_experts", "n_routed_experts", "num_experts"):
            if hasattr(tc, k):
                setattr(tc, k, 8)
        for k in ("layer_types",):
            if getattr(tc, k, None) is not None:
                setattr(tc, k, list(getattr(tc, k))[:4])
        if hasattr(tc, "n_group"): tc.n_group = 2; tc.topk_group = 1
        if hasattr(tc, "first_k_dense_replace"): tc.first_k_dense_replace = 1
        if hasattr(tc, "kv_lora_rank"): tc.kv_lora_rank = 32; tc.q_lora_rank = 48; tc.qk_rope_head_dim = 8; tc.qk_nope_head_dim = 16; tc.v_head_dim = 16
        if hasattr(tc, "num_experts_per_tok"): tc.num_experts_per_tok = 2
        if hasattr(tc, "vision_config"): pass
        try:
            m = AutoModelForCausalLM.from_config(c, attn_implementation="eager", dtype=torch.float32)
        except Exception:
            fact("CausalLM from_config failed:", traceback.format_exc())
            from transformers import AutoModel
            m = AutoModel.from_config(c)
        fact("class", type(m).__name__)
        fact("module tree:\n", m)
        fact("state_dict:")
        for k, v in m.state_dict().items():
            fact("  %s %s %s" % (k, tuple(v.shape), v.dtype))
        tmp = tempfile.mkdtemp()
        m.save_pretrained(tmp)
        fact("saved files:", sorted(os.listdir(tmp)))
        fact("config.json:", open(os.path.join(tmp, "config.json")).read())
        from safetensors import safe_open
        for f in sorted(os.listdir(tmp)):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(tmp, f), "pt") as sf:
                    for k in sf.keys():
                        fact("  saved %s %s" % (k, tuple(sf.get_slice(k).get_shape())))
        ids = torch.randint(0, 100, (1, 8))
        with torch.no_grad():
            fact("forward ok", tuple(m(input_ids=ids).logits.shape))
    except Exception:
        fact("failed:", traceback.format_exc())
fact("done")
