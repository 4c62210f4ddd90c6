#!/usr/bin/env python3
"""Train sluice's small demo MoE model (qwen2_moe, sigmoid-gated shared expert) on the KJV Bible.

Usage:  PYTHONUNBUFFERED=1 python3 tools/train_demo.py OUTDIR [--data DIR] [--train-seconds S]

Needs a CUDA GPU, torch, transformers (written against 5.17), tokenizers, safetensors, numpy.
Input: DIR/train.txt and DIR/heldout.txt (one verse per line), made by tools/prepare_kjv.sh
from Debian's bible-kjv package (default DIR: .data/kjv).

Writes into OUTDIR:
  tokenizer.json, tokenizer_config.json   byte-level BPE, vocab 2048, <|endoftext|> = EOS
  config.json, generation_config.json, model.safetensors   (bf16, Hugging Face format)
  ref.json, logits.f32    reference for sluice's parity test (CPU, float32, eager attention
                          and eager experts, computed from the reloaded saved checkpoint)
  quality.json            held-out perplexity vs a unigram baseline, samples
  train_log.txt           training progress
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

T_START = time.time()
LOG_LINES = []


def log(*args):
    s = " ".join(str(a) for a in args)
    s = "[%6.1fs] %s" % (time.time() - T_START, s)
    print(s, flush=True)
    LOG_LINES.append(s)


# ---------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------
VOCAB = 2048
EOT = "<|endoftext|>"
SEQ = 256
BATCH = 64
LR_MAX = 2e-3
LR_MIN = 1e-4
WARMUP = 100
WD = 0.1
BETAS = (0.9, 0.95)
EVAL_EVERY = 100
PATIENCE = 100        # evals without improvement before stopping (the best state is kept anyway)
MAX_EPOCHS = 8        # schedule length cap, in passes over the training stream (8 beat 14 and an early-stopped 30)
REF_PROMPT = "In the beginning God created"
REF_NEW = 24
SAMPLE_PROMPTS = ["And it came to pass", "The LORD is my shepherd", "Blessed are"]
SAMPLE_NEW = 60

MODEL_CFG = dict(
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, intermediate_size=512, moe_intermediate_size=192,
    shared_expert_intermediate_size=384, num_experts=8, num_experts_per_tok=2,
    norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
    max_position_embeddings=512, tie_word_embeddings=True, rms_norm_eps=1e-6,
    output_router_logits=True, router_aux_loss_coef=0.01, use_sliding_window=False,
    bos_token_id=None, pad_token_id=None,
)
ROPE_THETA = 10000.0


# ---------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------
def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [l.rstrip("\n") for l in f if l.strip()]


def train_tokenizer(lines):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, min_frequency=2, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((l + "\n" for l in lines), trainer=trainer)
    return tok


def encode_stream(tok, lines):
    """Encodes "\n".join(lines) + "\n" (every verse ends with a newline). Chunks end on a
    newline, which is always its own pre-token, so chunked encoding equals whole encoding."""
    chunks = []
    step = 500
    for i in range(0, len(lines), step):
        chunks.append("".join(l + "\n" for l in lines[i:i + step]))
    encs = tok.encode_batch(chunks, add_special_tokens=False)
    ids = []
    for e in encs:
        ids.extend(e.ids)
    return np.asarray(ids, dtype=np.int64)


def token_byte_lengths(tok):
    """Bytes per token id: a ByteLevel token string has one character per byte."""
    n = tok.get_vocab_size()
    lens = np.zeros(max(n, VOCAB), dtype=np.int64)
    specials = {EOT}
    for i in range(n):
        t = tok.id_to_token(i)
        if t is None or t in specials:
            lens[i] = 0
        else:
            lens[i] = len(t)
    return lens


# ---------------------------------------------------------------------------
# model helpers
# ---------------------------------------------------------------------------
def make_config(eos_id):
    from transformers import AutoConfig
    kw = dict(MODEL_CFG)
    kw["eos_token_id"] = eos_id
    try:
        c = AutoConfig.for_model("qwen2_moe", rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA}, **kw)
    except Exception as e:
        log("make_config: rope_parameters rejected (%r); using rope_theta" % (e,))
        c = AutoConfig.for_model("qwen2_moe", rope_theta=ROPE_THETA, **kw)
    return c


def set_experts_impl(m, val):
    f = getattr(m, "set_experts_implementation", None)
    if f is not None:
        f(val)
    elif hasattr(m.config, "_experts_implementation"):
        m.config._experts_implementation = val


def force_eager(m):
    for meth, val in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        f = getattr(m, meth, None)
        if f is not None:
            try:
                f(val)
            except Exception as e:
                log("  %s(%r) failed: %r" % (meth, val, e))
        elif meth == "set_experts_implementation" and hasattr(m.config, "_experts_implementation"):
            m.config._experts_implementation = val


def impl_names(m):
    c = m.config
    return (getattr(c, "_attn_implementation", None), getattr(c, "_experts_implementation", None))


def load_reference_model(path):
    from transformers import AutoModelForCausalLM
    variants = [
        dict(attn_implementation="eager", experts_implementation="eager", dtype=torch.float32),
        dict(attn_implementation="eager", dtype=torch.float32),
        dict(attn_implementation="eager", torch_dtype=torch.float32),
    ]
    err = None
    for kw in variants:
        try:
            m, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kw)
            break
        except Exception as e:
            log("  (loader variant %s failed: %r)" % (sorted(kw), e))
            err = e
    else:
        raise err
    m = m.float().eval()
    force_eager(m)
    return m, info


def lm_and_aux(model, w, coef):
    """w: (B, SEQ+1) token windows. Returns (lm_loss, aux_loss or None)."""
    x = w[:, :-1]
    y = w[:, 1:]
    out = model(input_ids=x, output_router_logits=True, use_cache=False)
    logits = out.logits
    lm = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
    aux = getattr(out, "aux_loss", None)
    return lm, aux


@torch.no_grad()
def heldout_nll(model, held, device, autocast, batch=64):
    """Non-overlapping windows of SEQ tokens; predicts tokens 1..SEQ-1 of each window.
    Returns (sum of nats, number of predicted tokens, predicted-target array)."""
    n = (len(held) // SEQ) * SEQ
    wins = torch.from_numpy(held[:n].reshape(-1, SEQ)).to(device)
    tot = 0.0
    cnt = 0
    was_training = model.training
    model.eval()
    for i in range(0, wins.shape[0], batch):
        w = wins[i:i + batch]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=w[:, :-1], use_cache=False)
        lg = out.logits.float()
        nll = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
        tot += nll.item()
        cnt += w[:, 1:].numel()
    if was_training:
        model.train()
    targets = held[:n].reshape(-1, SEQ)[:, 1:].reshape(-1)
    return tot, cnt, targets


def lr_at(step, total_steps):
    if step < WARMUP:
        return LR_MAX * (step + 1) / WARMUP
    p = min(1.0, (step - WARMUP) / max(1, total_steps - WARMUP))
    return LR_MIN + 0.5 * (LR_MAX - LR_MIN) * (1 + math.cos(math.pi * p))


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------
def main():
    try:
        _main()
    finally:
        if LOG_LINES and len(sys.argv) > 1 and os.path.isdir(sys.argv[1]):
            with open(os.path.join(sys.argv[1], "train_log.txt"), "w") as f:
                f.write("\n".join(LOG_LINES) + "\n")


def _main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--data", default=".data/kjv")
    ap.add_argument("--train-seconds", type=float, default=240.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-epochs", type=float, default=MAX_EPOCHS,
                    help="cosine schedule length cap, in passes over the training tokens")
    ap.add_argument("--patience", type=int, default=PATIENCE, help="evals without improvement before stopping")
    ap.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    args = ap.parse_args()
    log("args:", vars(args))
    outdir = args.outdir
    os.makedirs(outdir, exist_ok=True)

    import transformers
    import tokenizers
    log("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__,
        "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    # ---- data + tokenizer ----
    train_lines = read_lines(os.path.join(args.data, "train.txt"))
    held_lines = read_lines(os.path.join(args.data, "heldout.txt"))
    log("lines: train %d, heldout %d" % (len(train_lines), len(held_lines)))
    tok = train_tokenizer(train_lines)
    eos_id = tok.token_to_id(EOT)
    log("tokenizer: vocab %d, %s = %d" % (tok.get_vocab_size(), EOT, eos_id))
    assert tok.get_vocab_size() <= VOCAB
    tok.save(os.path.join(outdir, "tokenizer.json"))
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": EOT,
            "pad_token": EOT,
            "bos_token": None,
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": MODEL_CFG["max_position_embeddings"],
        }, f, indent=2)
    train_ids = encode_stream(tok, train_lines)
    held_ids = encode_stream(tok, held_lines)
    blen = token_byte_lengths(tok)
    train_bytes = sum(len((l + "\n").encode("utf-8")) for l in train_lines)
    log("tokens: train %d (%.3f bytes/token), heldout %d" % (len(train_ids), train_bytes / len(train_ids), len(held_ids)))
    if int(blen[train_ids].sum()) != train_bytes:
        log("WARNING: token byte lengths sum to %d, text has %d bytes" % (int(blen[train_ids].sum()), train_bytes))
    rt = tok.decode(tok.encode(train_lines[0] + "\n").ids)
    if rt != train_lines[0] + "\n":
        log("WARNING: round trip differs: %r" % (rt,))

    # ---- model ----
    from transformers import AutoModelForCausalLM
    cfg = make_config(eos_id)
    model = None
    for kw in (dict(attn_implementation="sdpa", dtype=torch.float32),
               dict(attn_implementation="sdpa", torch_dtype=torch.float32),
               dict(attn_implementation="sdpa"), dict()):
        try:
            model = AutoModelForCausalLM.from_config(cfg, **kw)
            break
        except Exception as e:
            log("  (from_config variant %s failed: %r)" % (sorted(kw), e))
    model = model.float().to(device)
    try:
        model.tie_weights()
    except Exception as e:
        log("tie_weights failed: %r" % (e,))
    tied = model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    nparam = sum(p.numel() for p in model.parameters())
    log("model: %s params %.3fM, tied %s, impl %s" % (type(model).__name__, nparam / 1e6, tied, impl_names(model)))
    assert tied, "lm_head is not tied to the embeddings"
    coef = MODEL_CFG["router_aux_loss_coef"]

    stream = torch.from_numpy(train_ids).to(device)
    held_np = held_ids

    def batch():
        idx = torch.randint(0, len(train_ids) - SEQ - 1, (BATCH,), device=device)
        return stream[idx[:, None] + torch.arange(SEQ + 1, device=device)[None, :]]

    decay, no_decay = [], []
    for n_, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt_kw = dict(lr=LR_MAX, betas=BETAS)
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                                 {"params": no_decay, "weight_decay": 0.0}], fused=True, **opt_kw)
    except Exception as e:
        log("fused AdamW unavailable (%r)" % (e,))
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                                 {"params": no_decay, "weight_decay": 0.0}], **opt_kw)

    # pick an experts backend that trains under bf16 autocast
    model.train()
    chosen = None
    for impl in (None, "batched_mm", "eager"):
        try:
            if impl is not None:
                set_experts_impl(model, impl)
            w = batch()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                lm, aux = lm_and_aux(model, w, coef)
                loss = lm + (coef * aux if aux is not None else 0.0)
            loss.backward()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            chosen = impl_names(model)
            log("experts backend for training: %s (probe loss %.4f, aux %s)" % (chosen, lm.item(), None if aux is None else round(float(aux), 4)))
            break
        except Exception as e:
            log("experts backend %r failed in training: %r" % (impl, e))
            opt.zero_grad(set_to_none=True)
    assert chosen is not None

    # ---- training loop ----
    max_steps_epochs = int(args.max_epochs * len(train_ids) / (BATCH * SEQ))
    total_steps = max_steps_epochs  # revised after timing the first steps
    best = (float("inf"), -1)
    best_state = None
    bad_evals = 0
    step = 0
    t0 = time.time()
    timed = False
    lm_ema = None
    history = []
    stop_reason = "time"
    while True:
        el = time.time() - t0
        if not timed and step == 60:
            torch.cuda.synchronize()
            el = time.time() - t0
            rate = step / el
            total_steps = max(WARMUP + 100, min(max_steps_epochs, int(rate * args.train_seconds * 0.97)))
            timed = True
            log("rate %.2f steps/s -> total_steps %d (epoch cap %d)" % (rate, total_steps, max_steps_epochs))
        if step >= total_steps:
            stop_reason = "steps"
            break
        if el > args.train_seconds * 1.05:
            stop_reason = "time"
            break
        lr = lr_at(step, total_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        w = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lm, aux = lm_and_aux(model, w, coef)
            loss = lm + (coef * aux if aux is not None else 0.0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 50 == 0:
            lmv = lm.item()
            lm_ema = lmv if lm_ema is None else 0.8 * lm_ema + 0.2 * lmv
            if step % 100 == 0:
                log("step %5d lr %.2e train lm %.4f (ema %.4f) aux %s  %.1fs" % (
                    step, lr, lmv, lm_ema, None if aux is None else "%.4f" % float(aux), time.time() - t0))
        if step % args.eval_every == 0 or step == total_steps:
            tot, cnt, _ = heldout_nll(model, held_np, device, autocast=True)
            hl = tot / cnt
            history.append(dict(step=step, heldout=hl, train_ema=lm_ema, t=time.time() - t0))
            improved = hl < best[0] - 1e-4
            if improved:
                best = (hl, step)
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                bad_evals = 0
            else:
                bad_evals += 1
            log("eval step %5d heldout %.4f (ppl %.2f) best %.4f@%d" % (step, hl, math.exp(hl), best[0], best[1]))
            if bad_evals >= args.patience:
                stop_reason = "heldout stopped improving"
                break
    train_s = time.time() - t0
    log("training stopped (%s) at step %d after %.1fs; best heldout %.4f at step %d" % (
        stop_reason, step, train_s, best[0], best[1]))
    if best_state is not None and best[1] != step:
        tot, cnt, _ = heldout_nll(model, held_np, device, autocast=True)
        if tot / cnt > best[0]:
            model.load_state_dict(best_state)
            log("restored best state from step %d" % best[1])

    # ---- round to bf16 and save ----
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.config.output_router_logits = False
    model.config.use_cache = True
    ms = model.to(torch.bfloat16).cpu()
    ms.save_pretrained(outdir)
    from transformers import GenerationConfig
    gc = GenerationConfig(eos_token_id=eos_id, bos_token_id=None, pad_token_id=eos_id)
    gc.save_pretrained(outdir)
    del ms, model, best_state, opt
    torch.cuda.empty_cache()

    from safetensors import safe_open
    st_files = sorted(f for f in os.listdir(outdir) if f.endswith(".safetensors"))
    dtypes = set()
    nkeys = 0
    try:
        for fn in st_files:
            with safe_open(os.path.join(outdir, fn), framework="pt") as sf:
                for k in sf.keys():
                    dtypes.add(str(sf.get_slice(k).get_dtype()))
                    nkeys += 1
    except Exception as e:
        log("safetensors dtype check failed: %r" % (e,))
    st_size = sum(os.path.getsize(os.path.join(outdir, f)) for f in st_files)
    log("saved %s: %d tensors, dtypes %s, %.2f MB" % (st_files, nkeys, sorted(dtypes), st_size / 1e6))
    if st_size >= 15e6:
        log("WARNING: safetensors >= 15 MB")

    # ---- reference (CPU, float32, eager) from the saved checkpoint ----
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    ref_model, info = load_reference_model(outdir)
    log("reference model: impl %s, loading info %s" % (impl_names(ref_model), {k: v for k, v in info.items() if v}))
    ids = tok.encode(REF_PROMPT, add_special_tokens=False).ids
    inp = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        logits = ref_model(input_ids=inp, use_cache=False).logits[0].float()
    logits.numpy().astype("<f4").tofile(os.path.join(outdir, "logits.f32"))
    gcg = GenerationConfig(do_sample=False, max_new_tokens=REF_NEW, min_new_tokens=REF_NEW,
                           eos_token_id=None, pad_token_id=0, bos_token_id=None)
    out = ref_model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=gcg,
                             output_logits=True, return_dict_in_generate=True)
    greedy = out.sequences[0, len(ids):].tolist()
    step_logits = torch.stack([l[0] for l in out.logits]).float()
    s = torch.topk(torch.cat([logits, step_logits]), 2, dim=-1).values
    min_gap = (s[:, 0] - s[:, 1]).min().item()
    ref = {"ids": ids, "greedy": greedy, "vocab_size": VOCAB, "min_top2_gap": min_gap,
           "logits_shape": [len(ids), VOCAB], "prompt": REF_PROMPT,
           "greedy_text": tok.decode(greedy), "transformers_version": transformers.__version__}
    with open(os.path.join(outdir, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    log("ref: ids %s greedy %s min_top2_gap %.4g" % (ids, greedy, min_gap))
    log("ref greedy text: %r" % (REF_PROMPT + tok.decode(greedy)))

    # ---- quality ----
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu_model = ref_model.to(device)  # float32, eager
    tot, cnt, targets = heldout_nll(gpu_model, held_np, device, autocast=False)
    nbytes = int(blen[targets].sum())
    counts = np.bincount(train_ids, minlength=VOCAB).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    uni_tot = float(-logp[targets].sum())
    q = {
        "heldout_tokens_predicted": cnt, "heldout_bytes_predicted": nbytes,
        "model_nll_per_token": tot / cnt, "model_ppl_per_token": math.exp(tot / cnt),
        "model_bits_per_byte": tot / math.log(2) / nbytes,
        "unigram_nll_per_token": uni_tot / cnt, "unigram_ppl_per_token": math.exp(uni_tot / cnt),
        "unigram_bits_per_byte": uni_tot / math.log(2) / nbytes,
        "train_steps": step, "train_seconds": train_s, "stop_reason": stop_reason,
        "best_heldout_step": best[1], "train_tokens_seen": step * BATCH * SEQ,
        "train_stream_tokens": int(len(train_ids)), "bytes_per_token_train": train_bytes / len(train_ids),
        "params": nparam, "experts_backend_training": chosen, "history": history,
        "safetensors_bytes": st_size, "safetensors_dtypes": sorted(dtypes),
    }
    log("heldout: model ppl %.3f/token, %.4f bits/byte; unigram ppl %.2f/token, %.4f bits/byte" % (
        q["model_ppl_per_token"], q["model_bits_per_byte"], q["unigram_ppl_per_token"], q["unigram_bits_per_byte"]))
    samples = []
    q["samples"] = samples
    with open(os.path.join(outdir, "quality.json"), "w") as f:
        json.dump(q, f, indent=1)
    for i, p in enumerate(SAMPLE_PROMPTS):
        try:
            pid = tok.encode(p, add_special_tokens=False).ids
            pin = torch.tensor([pid], dtype=torch.long, device=device)
            torch.manual_seed(100 + i)
            g = GenerationConfig(do_sample=True, temperature=0.8, top_p=0.95, top_k=VOCAB, max_new_tokens=SAMPLE_NEW,
                                 eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None)
            o = gpu_model.generate(input_ids=pin, attention_mask=torch.ones_like(pin), generation_config=g)
            text = p + tok.decode(o[0, len(pid):].tolist())
        except Exception as e:
            log("sample %d failed: %r" % (i, e))
            continue
        samples.append({"prompt": p, "seed": 100 + i, "text": text})
        log("sample %d: %r" % (i, text))
    q["samples"] = samples
    with open(os.path.join(outdir, "quality.json"), "w") as f:
        json.dump(q, f, indent=1)
    log("files:", {f: os.path.getsize(os.path.join(outdir, f)) for f in sorted(os.listdir(outdir))})
    log("DONE")


if __name__ == "__main__":
    main()
