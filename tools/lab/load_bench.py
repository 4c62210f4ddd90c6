#!/usr/bin/env python3
"""Load benchmark of an OpenAI-compatible server: N concurrent streaming clients (issue 29).

    tools/lab/load_bench.py --url http://127.0.0.1:8080 -n 4 -r 4 --prompt-tokens 128 --max-tokens 64

Each of N client threads sends R streaming requests back to back, each with a prompt of
exactly --prompt-tokens token ids (a list of ids, so that both engines see the same tokens
whatever their tokenizers do with text) and max_tokens with ignore_eos (sluice and llama-server
both honour it), so that every request decodes the same number of tokens. The prompts differ
per request (seeded random ids): with one shared prompt both engines would serve the prefill
from their prompt caches and the time to first token would measure nothing.

From the SSE stream, the arrival time of every token:
  aggregate decode tok/s  tokens that arrived while all N clients were active (from the
                          moment the last client sent its first request to the moment the
                          first client got its last token) per second of that window: what N
                          users sharing the server get together, prefills and queueing included
  TTFT p50/p99            from sending a request to its first token
  ITL p50/p99             between consecutive tokens of one reply
  failures                requests that did not end in a complete 200 stream
A chunk can carry several tokens (a server that fell behind, or bytes held back until a UTF-8
character is complete): a chunk's tokens are counted from its `tokens` (llama-server) or
logprobs entries when present, else as one, and the usage's completion_tokens settles the
reply's total (the remainder counted at its last chunk); `tokens_per_chunk` in the JSON shows
how often that happened.

With sluice's /metrics, the expert bytes read per generated token over the run (the deltas of
sluice_expert_bytes_read_total and sluice_completion_tokens_total: the prefills' reads are in
it, as issue 29's goal counts them). sluice counts bytes it reads itself, so it is 0 unless the
experts are streamed (--experts stream --cache-experts N); mapped files fault in unseen.

Prints one line of results, then one line of JSON (--json FILE also writes it there).
Python 3 standard library only; loopback or not, it only sends what it is told to.
"""
import argparse
import http.client
import json
import math
import os
import random
import re
import statistics
import sys
import threading
import time
import urllib.parse


def pct(xs, p):
    """The p-th percentile (nearest rank on the sorted values), None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def cpu_seconds(pid):
    """User + system CPU seconds of process pid (all its threads), None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError):
        return None


def get_metrics(host, port, headers):
    """{name: value} of the unlabelled samples of GET /metrics, or None without one."""
    try:
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", "/metrics", headers=headers)
        r = c.getresponse()
        body = r.read().decode("utf-8", "replace")
        c.close()
        if r.status != 200:
            return None
    except OSError:
        return None
    out = {}
    for m in re.finditer(r"^([A-Za-z_:][A-Za-z0-9_:]*) (\S+)$", body, re.M):
        try:
            out[m.group(1)] = float(m.group(2))
        except ValueError:
            pass
    return out


class Reply:
    """One request's outcome: when it was sent, its token arrivals [(t, k tokens)], error."""

    def __init__(self, client, index, t_send):
        self.client, self.index, self.t_send = client, index, t_send
        self.arrivals = []
        self.chunks = 0
        self.usage_tokens = None
        self.error = None


def chunk_tokens(d, chat):
    """(text, token count) of one stream chunk."""
    ch = (d.get("choices") or [{}])[0] if d.get("choices") else {}
    text = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
    k = None
    if isinstance(d.get("tokens"), list):  # llama-server with return_tokens
        k = len(d["tokens"])
    lp = ch.get("logprobs")
    if k is None and isinstance(lp, dict):
        if isinstance(lp.get("content"), list):  # chat form (and llama-server's completions)
            k = len(lp["content"])
        elif isinstance(lp.get("tokens"), list):  # legacy completions form
            k = len(lp["tokens"])
    if k is None:
        k = 1 if text else 0
    return text, k


def one_request(a, host, port, headers, client, index, prompt):
    body = {"max_tokens": a.max_tokens, "stream": True, "ignore_eos": True,
            "temperature": a.temperature, "stream_options": {"include_usage": True}}
    if a.model:
        body["model"] = a.model
    if a.extra:
        body.update(json.loads(a.extra))
    chat = a.endpoint == "chat"
    if chat:  # chat has no token-id prompt: the ids' text is only approximately N tokens
        body["messages"] = [{"role": "user", "content": " ".join(f"w{t}" for t in prompt)}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    data = json.dumps(body).encode()
    rep = Reply(client, index, time.perf_counter())
    done = False
    try:
        c = http.client.HTTPConnection(host, port, timeout=a.timeout)
        c.request("POST", path, data, headers)
        r = c.getresponse()
        if r.status != 200:
            rep.error = f"status {r.status}: {r.read()[:200]!r}"
            c.close()
            return rep
        counted, last_t = 0, None
        while True:
            line = r.readline()  # returns as soon as a line is in (chunked peek), not at EOF
            if not line:
                break
            now = time.perf_counter()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                break
            d = json.loads(payload)
            last_t = now
            if "error" in d:
                rep.error = f"error event {payload[:200]!r}"
                break
            if isinstance(d.get("usage"), dict) and d["usage"].get("completion_tokens") is not None:
                rep.usage_tokens = int(d["usage"]["completion_tokens"])
            _, k = chunk_tokens(d, chat)
            if k:
                rep.arrivals.append([now, k])
                rep.chunks += 1
                counted += k
        c.close()
        if not done and not rep.error:
            rep.error = "stream ended without [DONE]"
        # The usage settles the count: tokens missing from the chunks arrived with the last
        # one; chunks beyond it (held-back bytes of a token flushed at the end) carry none.
        if rep.usage_tokens is not None and (rep.arrivals or last_t is not None):
            if rep.usage_tokens > counted:
                if not rep.arrivals:  # all text held back to the end (random-weight bytes)
                    rep.arrivals.append([last_t, 0])
                    rep.chunks += 1
                rep.arrivals[-1][1] += rep.usage_tokens - counted
            extra = counted - rep.usage_tokens
            while extra > 0 and rep.arrivals:
                cut = min(extra, rep.arrivals[-1][1])
                rep.arrivals[-1][1] -= cut
                extra -= cut
                if rep.arrivals[-1][1] == 0:
                    rep.arrivals.pop()
                    rep.chunks -= 1
        n = sum(k for _, k in rep.arrivals)
        if not rep.error and a.ignore_eos_check and n != a.max_tokens:
            rep.error = f"{n} tokens instead of {a.max_tokens} (ignore_eos not honoured?)"
    except (OSError, http.client.HTTPException, ValueError) as e:
        rep.error = f"{type(e).__name__}: {e}"
    return rep


def client_loop(a, host, port, headers, client, out, start_evt):
    rng = random.Random(a.seed * 100003 + client)
    start_evt.wait()
    for i in range(a.requests):
        prompt = [rng.randint(a.id_min, a.id_max) for _ in range(a.prompt_tokens)]
        out.append(one_request(a, host, port, headers, client, i, prompt))


def summarize(a, replies, t0, t1, m0, m1):
    ok = [r for r in replies if not r.error and r.arrivals]
    fails = [r for r in replies if r.error or not r.arrivals]
    ttft = [r.arrivals[0][0] - r.t_send for r in ok]
    itl = []
    for r in ok:  # a chunk of k tokens after a gap g: k gaps of g/k
        for (tp, _), (tc, k) in zip(r.arrivals, r.arrivals[1:]):
            itl += [(tc - tp) / k] * k
    # The window where all N clients were active (a request of theirs in flight, queued or
    # generating): from the last client's first send to the first client's last token. A
    # server that serves one request at a time still has all N active (waiting in its queue).
    by_client = {}
    for r in ok:
        by_client.setdefault(r.client, []).append(r)
    win = None
    if len(by_client) == a.clients:
        w0 = max(min(x.t_send for x in rs) for rs in by_client.values())
        w1 = min(max(x.arrivals[-1][0] for x in rs) for rs in by_client.values())
        if w1 > w0:
            win = (w0, w1)
    tokens = sum(k for r in ok for _, k in r.arrivals)
    agg = None
    if win:
        n = sum(k for r in ok for t, k in r.arrivals if win[0] < t <= win[1])
        agg = n / (win[1] - win[0])
    chunks = sum(r.chunks for r in ok)
    res = {
        "url": a.url, "endpoint": a.endpoint, "label": a.label, "clients": a.clients,
        "requests_per_client": a.requests, "prompt_tokens": a.prompt_tokens,
        "max_tokens": a.max_tokens, "requests": len(replies), "failures": len(fails),
        "first_failures": [f"client {r.client} #{r.index}: {r.error}" for r in fails[:5]],
        "tokens": tokens, "wall_s": t1 - t0,
        "aggregate_decode_tok_s": agg,
        "window_s": (win[1] - win[0]) if win else None,
        "overall_tok_s": tokens / (t1 - t0) if t1 > t0 else None,
        "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "itl_p50_s": pct(itl, 50), "itl_p99_s": pct(itl, 99),
        "itl_mean_s": statistics.fmean(itl) if itl else None,
        "tokens_per_chunk": tokens / chunks if chunks else None,
        "expert_bytes_per_token": None, "server_completion_tokens": None,
    }
    if m0 and m1 and "sluice_expert_bytes_read_total" in m1:
        dt = m1.get("sluice_completion_tokens_total", 0) - m0.get("sluice_completion_tokens_total", 0)
        db = m1["sluice_expert_bytes_read_total"] - m0.get("sluice_expert_bytes_read_total", 0)
        res["server_completion_tokens"] = dt
        res["expert_bytes_per_token"] = db / dt if dt > 0 else None
        res["expert_bytes_read"] = db
        hits = m1.get("sluice_expert_hits_total", 0) - m0.get("sluice_expert_hits_total", 0)
        reqs = m1.get("sluice_expert_requests_total", 0) - m0.get("sluice_expert_requests_total", 0)
        res["expert_hit_ratio"] = hits / reqs if reqs > 0 else None
    return res


def fmt(v, scale=1.0, d=1):
    return "-" if v is None else f"{v * scale:.{d}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("-n", "--clients", type=int, default=1, help="concurrent clients (default 1)")
    ap.add_argument("-r", "--requests", type=int, default=4,
                    help="requests per client, back to back (default 4)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length (default 128)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per reply (default 64)")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                    help="completions (token-id prompts, exact length; default) or chat")
    ap.add_argument("--id-min", type=int, default=1000,
                    help="prompt ids drawn from [id-min, id-max] (default 1000..30000: plain "
                         "tokens, no specials)")
    ap.add_argument("--id-max", type=int, default=30000)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--model", help="the request's model field (llama-server ignores it)")
    ap.add_argument("--extra", help="JSON object merged into every request body")
    ap.add_argument("--no-eos-check", dest="ignore_eos_check", action="store_false",
                    help="do not count a reply shorter than --max-tokens as a failure")
    ap.add_argument("--warmup", type=int, default=1,
                    help="requests sent alone before the measurement (default 1): page cache, "
                         "first-touch allocations")
    ap.add_argument("--timeout", type=float, default=600, help="socket timeout, s (default 600)")
    ap.add_argument("--api-key")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="", help="a name carried into the JSON")
    ap.add_argument("--pid", type=int,
                    help="the server's process: its CPU seconds over the run are reported, "
                         "as cores used (on a shared machine, whether it got its threads)")
    ap.add_argument("--json", help="also write the JSON result to this file")
    a = ap.parse_args()

    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = f"Bearer {a.api_key}"

    wrng = random.Random(-a.seed)
    for i in range(a.warmup):
        w = one_request(a, host, port, headers, -1, i,
                        [wrng.randint(a.id_min, a.id_max) for _ in range(a.prompt_tokens)])
        if w.error:
            sys.exit(f"load_bench: the warm-up request failed: {w.error}")

    m0 = get_metrics(host, port, headers)
    load0, cpu0 = loadavg(), cpu_seconds(a.pid) if a.pid else None
    replies, start_evt = [], threading.Event()
    per_client = [[] for _ in range(a.clients)]
    threads = [threading.Thread(target=client_loop,
                                args=(a, host, port, headers, c, per_client[c], start_evt), daemon=True)
               for c in range(a.clients)]
    for th in threads:
        th.start()
    t0 = time.perf_counter()
    start_evt.set()
    for th in threads:
        th.join()
    t1 = time.perf_counter()
    m1 = get_metrics(host, port, headers)
    cpu1 = cpu_seconds(a.pid) if a.pid else None
    for pc in per_client:
        replies += pc
    res = summarize(a, replies, t0, t1, m0, m1)
    # The machine's state: a loaded one (another build, test suite) makes the figures noise.
    res["loadavg_1m_start"], res["loadavg_1m_end"] = load0, loadavg()
    res["server_cores_used"] = (cpu1 - cpu0) / (t1 - t0) if cpu0 is not None and cpu1 is not None else None

    print(f"{a.label + ': ' if a.label else ''}N={a.clients} R={a.requests} "
          f"prompt={a.prompt_tokens} gen={a.max_tokens}: "
          f"aggregate {fmt(res['aggregate_decode_tok_s'])} tok/s "
          f"(overall {fmt(res['overall_tok_s'])}), "
          f"TTFT p50/p99 {fmt(res['ttft_p50_s'], 1e3, 0)}/{fmt(res['ttft_p99_s'], 1e3, 0)} ms, "
          f"ITL p50/p99 {fmt(res['itl_p50_s'], 1e3, 1)}/{fmt(res['itl_p99_s'], 1e3, 1)} ms, "
          f"{res['failures']} failures of {res['requests']}, "
          f"tok/chunk {fmt(res['tokens_per_chunk'], 1, 2)}, load {fmt(res['loadavg_1m_end'])}"
          + (f", server cores {fmt(res['server_cores_used'], 1, 2)}"
             if res["server_cores_used"] is not None else "")
          + (f", expert MB/token {fmt(res['expert_bytes_per_token'], 1e-6, 1)}"
             if res["expert_bytes_per_token"] is not None else ""))
    for f in res["first_failures"]:
        print(f"  failure: {f}")
    line = json.dumps(res)
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    sys.exit(1 if res["failures"] else 0)


if __name__ == "__main__":
    main()
