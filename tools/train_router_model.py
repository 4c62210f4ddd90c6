#!/usr/bin/env python3
"""Train a Qwen3-MoE-style model long enough that its routers specialise, and write its
routing traces for sluice's cache studies (`sluice trace-replay`, `--route-replay`).

Usage:  PYTHONUNBUFFERED=1 python3 tools/train_router_model.py OUTDIR --data DIR
            [--experts 128] [--top-k 8] [--layers 16] [--hidden 512] [--expert-inter 256]
            [--train-seconds 240] [--trace-tokens 8192] [--tokenizer FILE]

Needs a CUDA GPU, torch, tokenizers, numpy. DIR holds train.txt and heldout.txt from
tools/prepare_corpus.sh (documents separated by <|endoftext|> lines).

The model: byte-level BPE (8192), L decoder layers of RMSNorm, attention (RoPE, QK-norm, causal)
and a routed MoE: softmax router, top-k, weights renormalised over the k picks (Qwen3-MoE's
norm_topk_prob), SwiGLU experts, Switch-style load-balancing loss. Trained with bf16 autocast,
AdamW and a cosine schedule for a fixed time.

Writes into OUTDIR:
  trace.sltrace    the held-out documents in turn, the first TRACE_PER_DOC tokens of each,
                   teacher-forced in one causal window per document; for each token (one step)
                   and MoE layer a kind-0 record (the router's top-k in rank order) and, from
                   layer 1 on, a kind-1 record (that layer's router applied to the previous
                   layer's MoE input: the pre-gating prediction sluice can make before the layer
                   runs). Format: src/moe/trace.h.
  stats.json       held-out perplexity, load balance per layer, how many experts consecutive
                   tokens share, the pre-gating recall of several predictors
  tokenizer.json, train_log.txt
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

T0 = time.time()
LOG = []


def log(*a):
    s = "[%6.1fs] %s" % (time.time() - T0, " ".join(str(x) for x in a))
    print(s, flush=True)
    LOG.append(s)


EOT = "<|endoftext|>"
VOCAB = 8192
SEQ = 512
TRACE_PER_DOC = 512


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d.strip("\n") for d in f.read().split("\n" + EOT + "\n") if d.strip()]


def train_tokenizer(docs):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=[EOT],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(docs, trainer=tr)
    return tok


def encode_docs(tok, docs):
    eot = tok.token_to_id(EOT)
    out = []
    for e in tok.encode_batch(docs, add_special_tokens=False):
        out.append(np.asarray(e.ids + [eot], dtype=np.int32))
    return out


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.w.to(x.dtype)


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Attn(torch.nn.Module):
    def __init__(self, H, nh):
        super().__init__()
        self.nh, self.hd = nh, H // nh
        self.qkv = torch.nn.Linear(H, 3 * H, bias=False)
        self.o = torch.nn.Linear(H, H, bias=False)
        self.qn, self.kn = RMSNorm(self.hd), RMSNorm(self.hd)

    def forward(self, x, cos, sin):
        B, S, H = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.nh, self.hd).unbind(2)
        q, k = rope(self.qn(q), cos, sin), rope(self.kn(k), cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, S, H))


class MoE(torch.nn.Module):
    def __init__(self, H, E, k, I):
        super().__init__()
        self.E, self.k, self.I = E, k, I
        self.router = torch.nn.Linear(H, E, bias=False)
        s = 1.0 / math.sqrt(H)
        self.w_gu = torch.nn.Parameter(torch.randn(E, H, 2 * I) * s)
        self.w_d = torch.nn.Parameter(torch.randn(E, I, H) * (1.0 / math.sqrt(I)))

    def route(self, x):
        logits = self.router(x).float()
        p = logits.softmax(-1)
        w, ids = p.topk(self.k, -1)
        return p, w / w.sum(-1, keepdim=True), ids

    def forward(self, x, cap_factor):
        shp = x.shape
        x = x.reshape(-1, shp[-1])
        N, E, k = x.shape[0], self.E, self.k
        p, w, ids = self.route(x)
        flat = ids.reshape(-1)                                   # [N k]
        # Switch-style balance: fraction routed times mean probability, per expert
        frac = torch.bincount(flat, minlength=E).float() / (N * k)
        aux = E * (frac * p.mean(0)).sum()
        # capacity dispatch: each expert takes its first C rows (token order); the rest drop
        C = max(1, int(math.ceil(N * k / E * cap_factor))) if cap_factor > 0 else N
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.empty_like(flat)
        pos[order] = torch.arange(flat.numel(), device=x.device) - starts[flat[order]]
        keep = pos < C
        slot = flat * C + pos
        rows = torch.arange(N, device=x.device).repeat_interleave(k)
        buf = x.new_zeros(E * C, shp[-1])
        buf[slot[keep]] = x[rows[keep]]
        gu = torch.bmm(buf.view(E, C, -1), self.w_gu.to(x.dtype))
        g, u = gu.split(self.I, -1)
        y = torch.bmm(F.silu(g) * u, self.w_d.to(x.dtype)).view(E * C, -1)
        out = x.new_zeros(N, shp[-1]).float()
        contrib = y[slot[keep]].float() * w.reshape(-1)[keep].unsqueeze(1)
        out.index_add_(0, rows[keep], contrib)
        return out.to(x.dtype).view(shp), aux, ids


class Block(torch.nn.Module):
    def __init__(self, H, nh, E, k, I):
        super().__init__()
        self.n1, self.n2 = RMSNorm(H), RMSNorm(H)
        self.attn = Attn(H, nh)
        self.moe = MoE(H, E, k, I)


class Model(torch.nn.Module):
    def __init__(self, L, H, nh, E, k, I):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, H)
        self.blocks = torch.nn.ModuleList([Block(H, nh, E, k, I) for _ in range(L)])
        self.nf = RMSNorm(H)
        self.head = torch.nn.Linear(H, VOCAB, bias=False)
        hd = H // nh
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd // 2).float() / (hd // 2)))
        t = torch.arange(SEQ).float()
        f = torch.outer(t, inv)
        self.register_buffer("cos", f.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", f.sin()[None, :, None, :], persistent=False)

    def forward(self, ids, cap_factor=1.5, record=None):
        S = ids.shape[1]
        cos, sin = self.cos[:, :S].to(torch.bfloat16), self.sin[:, :S].to(torch.bfloat16)
        h = self.emb(ids)
        aux = 0.0
        for b in self.blocks:
            h = h + b.attn(b.n1(h), cos, sin)
            x = b.n2(h)
            if record is not None:
                record.append((h, x))
            y, a, _ = b.moe(x, cap_factor)
            aux = aux + a
            h = h + y
        if record is not None:
            record.append((h, None))
        return self.head(self.nf(h)), aux / len(self.blocks)


def write_trace(path, L, E, k, kinds):
    """kinds: list of (step, layer, kind, ids[n]) in file order."""
    with open(path, "wb") as f:
        f.write(struct.pack("<8sIIII", b"SLTRACE1", L, E, k, 0))
        for step, layer, kind, ids in kinds:
            f.write(struct.pack("<IHBB", step, layer, kind, len(ids)))
            f.write(np.asarray(ids, dtype="<u2").tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--data", required=True)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--expert-inter", type=int, default=256)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--aux", type=float, default=0.01)
    ap.add_argument("--train-seconds", type=float, default=240)
    ap.add_argument("--trace-docs", type=int, default=16)
    ap.add_argument("--tokenizer", default=None, help="reuse this tokenizer.json")
    ap.add_argument("--smoke", action="store_true", help="a few steps, tiny, for a first check")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    dev = "cuda"
    from tokenizers import Tokenizer
    train_docs = read_docs(os.path.join(a.data, "train.txt"))
    held_docs = read_docs(os.path.join(a.data, "heldout.txt"))
    if a.tokenizer:
        tok = Tokenizer.from_file(a.tokenizer)
    else:
        tok = train_tokenizer(train_docs)
        log("tokenizer trained")
    tok.save(os.path.join(a.out, "tokenizer.json"))
    train = np.concatenate(encode_docs(tok, train_docs))
    held = encode_docs(tok, held_docs)
    log("train tokens %d, held-out documents %d (%d tokens)" % (len(train), len(held), sum(map(len, held))))

    L, H, E, k, I = a.layers, a.hidden, a.experts, a.top_k, a.expert_inter
    if a.smoke:
        L, H, E, k, I = 2, 128, 16, 4, 64
    model = Model(L, H, a.heads, E, k, I).to(dev)
    n_par = sum(p.numel() for p in model.parameters())
    n_act = n_par - sum(b.moe.w_gu.numel() + b.moe.w_d.numel() for b in model.blocks) * (1 - k / E)
    log("model: %d layers, hidden %d, %d experts top-%d, expert inter %d: %.0fM parameters, %.0fM active"
        % (L, H, E, k, I, n_par / 1e6, n_act / 1e6))
    dec, nodec = [], []
    for n, p in model.named_parameters():
        (nodec if p.dim() < 2 or n.endswith(".w") else dec).append(p)
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": 0.1}, {"params": nodec, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=True)
    tr = torch.from_numpy(train.astype(np.int64))
    n_win = (len(tr) - 1) // SEQ
    budget = 5 if a.smoke else a.train_seconds
    step, t_start = 0, time.time()
    g = torch.Generator().manual_seed(1)
    while True:
        el = time.time() - t_start
        if el >= budget:
            break
        frac = min(1.0, el / budget)
        lr = a.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, n_win, (a.batch,), generator=g) * SEQ
        w = torch.stack([tr[i:i + SEQ + 1] for i in idx.tolist()]).to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, aux = model(w[:, :-1])
            lm = F.cross_entropy(logits.float().reshape(-1, VOCAB), w[:, 1:].reshape(-1))
            loss = lm + a.aux * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            log("step %5d  lm %.3f  aux %.3f  lr %.2e  %.0f tok/s" %
                (step, lm.item(), aux.item(), lr, (step + 1) * a.batch * SEQ / max(1e-9, time.time() - t_start)))
        step += 1
    log("trained %d steps, %.1f M tokens" % (step, step * a.batch * SEQ / 1e6))

    # held-out perplexity and routing, no token dropped
    model.eval()
    nll, cnt = 0.0, 0
    recs = []
    counts = np.zeros((L, E), np.int64)
    share, share_n = np.zeros(L), 0
    pred_hits = {"prev_input": np.zeros(L), "prev_output": np.zeros(L), "prev_input_2k": np.zeros(L)}
    pred_n = 0
    step_id = 0
    docs = held[:a.trace_docs]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for d in held:
            x = torch.from_numpy(d[:SEQ + 1].astype(np.int64)).to(dev)[None]
            logits, _ = model(x[:, :-1], cap_factor=0)
            nll += F.cross_entropy(logits.float()[0], x[0, 1:], reduction="sum").item()
            cnt += x.shape[1] - 1
        for d in docs:
            x = torch.from_numpy(d[:TRACE_PER_DOC].astype(np.int64)).to(dev)[None]
            rec = []
            model(x, cap_factor=0, record=rec)
            S = x.shape[1]
            picks, preds = [], []
            for l, b in enumerate(model.blocks):
                _, _, ids = b.moe.route(rec[l][1][0])
                picks.append(ids.cpu().numpy())
                if l > 0:
                    pb = model.blocks[l - 1]
                    # the pre-gating predictions for layer l, all from before layer l runs
                    _, _, p_in = b.moe.route(rec[l - 1][1][0])                   # l-1's MoE input
                    p_in2 = torch.topk(b.moe.router(rec[l - 1][1][0]).float(), 2 * k, -1).indices
                    h_after = rec[l - 1][0][0] + pb.moe(rec[l - 1][1], 0)[0][0]  # l-1's output
                    _, _, p_out = b.moe.route(b.n2(h_after))
                    preds.append(p_in.cpu().numpy())
                    for name, pr in (("prev_input", p_in), ("prev_input_2k", p_in2), ("prev_output", p_out)):
                        pr = pr.cpu().numpy()
                        pred_hits[name][l] += sum(len(set(pr[t]) & set(picks[l][t])) for t in range(S))
                else:
                    preds.append(None)
            pred_n += S
            for t in range(S):
                for l in range(L):
                    if l > 0:
                        recs.append((step_id, l, 1, preds[l][t].tolist()))
                    recs.append((step_id, l, 0, picks[l][t].tolist()))
                    counts[l, picks[l][t]] += 1
                    if t > 0:
                        share[l] += len(set(picks[l][t]) & set(picks[l][t - 1]))
                step_id += 1
            share_n += S - 1
    ppl = math.exp(nll / cnt)
    # a unigram baseline on the same held-out tokens
    uni = np.bincount(train, minlength=VOCAB).astype(np.float64) + 1
    uni /= uni.sum()
    ht = np.concatenate([d[1:SEQ + 1] for d in held])
    ppl_uni = math.exp(-np.log(uni[ht]).mean())
    write_trace(os.path.join(a.out, "trace.sltrace"), L, E, k, recs)
    mean = counts.sum(1, keepdims=True) / E
    load = counts / mean
    st = {
        "model": dict(layers=L, hidden=H, experts=E, top_k=k, expert_inter=I, params_m=n_par / 1e6,
                      active_m=n_act / 1e6, steps=step, train_tokens_m=step * a.batch * SEQ / 1e6),
        "heldout_ppl": ppl, "unigram_ppl": ppl_uni,
        "trace_tokens": step_id,
        "load_max_over_mean_per_layer": load.max(1).round(2).tolist(),
        "load_cv_per_layer": (counts.std(1) / mean[:, 0]).round(3).tolist(),
        "experts_unused_per_layer": (counts == 0).sum(1).tolist(),
        "experts_for_half_the_picks_per_layer": [int(np.searchsorted(np.cumsum(np.sort(c)[::-1]) / c.sum(), 0.5) + 1) for c in counts],
        "consecutive_shared_of_k_per_layer": (share / share_n).round(3).tolist(),
        "consecutive_shared_random": k * k / E,
        "pregate_recall_per_layer": {n: (v / (pred_n * k)).round(3).tolist() for n, v in pred_hits.items()},
    }
    for n in ("prev_input", "prev_input_2k", "prev_output"):
        st["pregate_recall_mean_" + n] = float((pred_hits[n][1:] / (pred_n * k)).mean())
    st["consecutive_shared_mean"] = float((share / share_n).mean())
    log("held-out ppl %.2f (unigram %.1f); consecutive tokens share %.2f of %d experts (random %.2f); "
        "pre-gating recall: prev input %.3f, prev input top-2k %.3f, prev output %.3f" %
        (ppl, ppl_uni, st["consecutive_shared_mean"], k, k * k / E, st["pregate_recall_mean_prev_input"],
         st["pregate_recall_mean_prev_input_2k"], st["pregate_recall_mean_prev_output"]))
    log("load max/mean per layer:", st["load_max_over_mean_per_layer"])
    with open(os.path.join(a.out, "stats.json"), "w") as f:
        json.dump(st, f, indent=1)
    with open(os.path.join(a.out, "train_log.txt"), "w") as f:
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
