#!/usr/bin/env python3
"""Soak test of `sluice serve`: a mixed, hostile load for a given time, on loopback only.

    tools/lab/soak_server.py --duration 300 -- build/sluice serve MODEL [serve options]
    tools/lab/soak_server.py --duration 300 --url http://127.0.0.1:8080 --pid PID

With a command after `--`, the server is started here (on a free port: --port 0 is
added), watched, and stopped with SIGTERM at the end, which must exit 0 within
--stop-within seconds. Otherwise it drives the server at --url, and samples the
memory of --pid when given.

Workers loop over a weighted mix of requests until the time is up:
  valid     chat, completions and Anthropic messages, streamed and not, keep-alive
            series, half-closed sockets (shutdown(SHUT_WR) after the request), GET /health,
            /metrics,
            and every --burst-every seconds a burst of --burst valid requests at once
  hostile   streams dropped mid-way, non-streaming requests reset (SO_LINGER 0),
            malformed JSON and wrong field types (400), prompts longer than the
            context (400), unknown routes and methods (404/405), bodies over
            --max-body (413, declared or chunked), a foreign Host header (403),
            connections that trickle their headers or say nothing (must be closed by
            the server within --header-timeout + 3 s)
A valid request fails when it gets anything but a complete 200 answer; a hostile one
is an anomaly when the server answers other than expected, and every refusal must be
a 4xx whose body is a JSON error with a message (never a 5xx or a dropped
connection). The server's VmRSS, threads and open descriptors are sampled every
--sample-every seconds; the report gives the RSS drift after warm-up. Before the
load and after it, the same greedy requests (temperature 0) must get the same text:
the load left no state behind (KV cache, prefix reuse, sampler) that changes answers.
Prints a report; exits 1 when any valid request failed or any anomaly was seen.

Python 3 standard library only. Every socket operation has a timeout, the run is bounded
by --duration and --max-requests, and only loopback addresses are accepted.
"""
import argparse
import http.client
import ipaddress
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

IO_TIMEOUT = 180.0  # one socket operation: above the server's default --queue-timeout


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.valid = {}    # scenario -> [ok, failed]
        self.hostile = {}  # scenario -> [as expected, anomalies]
        self.failures = []  # the first few, with why
        self.n = 0
        self.bursts = 0

    def count(self, table, name, good, why=None):
        with self.lock:
            row = table.setdefault(name, [0, 0])
            row[0 if good else 1] += 1
            self.n += 1
            if not good and len(self.failures) < 20:
                self.failures.append(f"{name}: {why}")

    def valid_result(self, name, good, why=None):
        self.count(self.valid, name, good, why)

    def hostile_result(self, name, good, why=None):
        self.count(self.hostile, name, good, why)


# ---------------------------------------------------------------- raw HTTP

class Target:
    def __init__(self, host, port, api_key, max_body, header_timeout):
        self.host, self.port = host, port
        self.api_key = api_key
        self.max_body = max_body
        self.header_timeout = header_timeout
        self.ctx, self.n_vocab = 8192, 32000  # read from /v1/models when it says

    def connect(self, timeout=IO_TIMEOUT):
        return socket.create_connection((self.host, self.port), timeout=timeout)

    def head(self, method, path, length=None, extra=""):
        h = f"{method} {path} HTTP/1.1\r\nHost: {self.host_header()}\r\nConnection: close\r\n"
        if self.api_key:
            h += f"Authorization: Bearer {self.api_key}\r\n"
        if length is not None:
            h += f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
        return (h + extra + "\r\n").encode()

    def host_header(self):
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def read_until_close(s, limit=64 << 20):
    out = bytearray()
    while len(out) < limit:
        d = s.recv(65536)
        if not d:
            break
        out += d
    return bytes(out)


def parse_response(raw):
    """(status, headers dict, body bytes) of a whole HTTP/1.1 response read until close."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ValueError(f"no header end in {raw[:200]!r}")
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    if not m:
        raise ValueError(f"bad status line {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, rest = bytearray(), body
        while True:
            size_line, sep, rest = rest.partition(b"\r\n")
            if not sep:
                raise ValueError("chunked body cut short")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out += rest[:size]
            rest = rest[size + 2:]
        body = bytes(out)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if len(body) < n:
            raise ValueError(f"body cut short: {len(body)} of {n} bytes")
        body = body[:n]
    return int(m.group(1)), headers, body


def exchange(t, method, path, body=None, half_close=False, extra=""):
    data = json.dumps(body).encode() if body is not None else b""
    s = t.connect()
    try:
        s.sendall(t.head(method, path, len(data) if body is not None else None, extra) + data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return parse_response(read_until_close(s))
    finally:
        s.close()


def error_message(data):
    """The message of a JSON error body (OpenAI's or Anthropic's shape), or None."""
    try:
        e = json.loads(data).get("error")
        m = e.get("message") if isinstance(e, dict) else None
        return m if isinstance(m, str) and m else None
    except (ValueError, AttributeError):
        return None


def sse_events(body):
    """The data: payloads of an SSE body (comments and blank lines skipped)."""
    return [line[6:] for line in body.decode("utf-8").split("\n") if line.startswith("data: ")]


# ---------------------------------------------------------------- requests

WORDS = ("river stone light water the of and a to in is was it for on with as by at from "
         "north winter garden bridge quiet story number seven").split()


def prompt_text(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)))


def sampling(rng):
    p = {"max_tokens": rng.randint(1, 12)}
    r = rng.random()
    if r < 0.5:
        p["temperature"] = 0
    elif r < 0.8:
        p.update(temperature=0.8, top_k=40, seed=rng.randint(0, 1 << 30))
    else:
        p.update(temperature=1.0, top_p=0.9, min_p=0.05)
    if rng.random() < 0.2:
        p["stop"] = [rng.choice(WORDS)]
    return p


def valid_body(rng, chat, stream):
    b = sampling(rng)
    if chat:
        msgs = [{"role": "user", "content": prompt_text(rng)}]
        if rng.random() < 0.3:
            msgs.insert(0, {"role": "system", "content": "Be brief."})
        b["messages"] = msgs
    else:
        b["prompt"] = prompt_text(rng)
    if stream:
        b["stream"] = True
        if rng.random() < 0.5:
            b["stream_options"] = {"include_usage": True}
    return b


def check_answer(status, body, chat, stream):
    """None when a complete answer, else why not."""
    if status != 200:
        return f"status {status}: {body[:200]!r}"
    if stream:
        ev = sse_events(body)
        if not ev or ev[-1] != "[DONE]":
            return f"stream without [DONE]: {body[-200:]!r}"
        finish = None
        for e in ev[:-1]:
            d = json.loads(e)
            if "error" in d:
                return f"error event {e[:200]}"
            for c in d.get("choices", []):
                finish = c.get("finish_reason") or finish
        return None if finish in ("stop", "length") else f"no finish_reason in {body[-200:]!r}"
    d = json.loads(body)
    c = d["choices"][0]
    text = c["message"]["content"] if chat else c["text"]
    if not isinstance(text, str) or c["finish_reason"] not in ("stop", "length"):
        return f"bad answer {body[:200]!r}"
    if d["usage"]["total_tokens"] != d["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"]:
        return f"bad usage {d['usage']}"
    return None


def messages_body(rng, stream):
    """An Anthropic Messages request (/v1/messages)."""
    b = {"model": "m", "max_tokens": rng.randint(1, 12),
         "messages": [{"role": "user", "content": [{"type": "text", "text": prompt_text(rng)}]}]}
    if rng.random() < 0.5:
        b["temperature"] = 0
    if rng.random() < 0.3:
        b["system"] = "Be brief."
    if rng.random() < 0.2:
        b["stop_sequences"] = [rng.choice(WORDS)]
    if stream:
        b["stream"] = True
    return b


def check_message(status, body, stream):
    """None when a complete Anthropic answer, else why not."""
    if status != 200:
        return f"status {status}: {body[:200]!r}"
    if stream:
        ev = [json.loads(e) for e in sse_events(body)]
        kinds = [e["type"] for e in ev]
        if not kinds or kinds[0] != "message_start" or kinds[-1] != "message_stop":
            return f"stream not from message_start to message_stop: {body[-200:]!r}"
        if "error" in kinds:
            return f"error event {body[-200:]!r}"
        return None
    d = json.loads(body)
    if d["type"] != "message" or d["content"][-1]["type"] != "text" or d["stop_reason"] not in (
            "end_turn", "max_tokens", "stop_sequence"):
        return f"bad answer {body[:200]!r}"
    return None


def do_valid(t, st, rng, half_close=False):
    r, stream = rng.random(), rng.random() < 0.5
    kind = "chat" if r < 0.45 else "messages" if r < 0.65 else "completions"
    name = ("halfclose " if half_close else "") + kind + (" stream" if stream else "")
    path = {"chat": "/v1/chat/completions", "messages": "/v1/messages",
            "completions": "/v1/completions"}[kind]
    try:
        if kind == "messages":
            status, _, body = exchange(t, "POST", path, messages_body(rng, stream), half_close)
            why = check_message(status, body, stream)
        else:
            chat = kind == "chat"
            status, _, body = exchange(t, "POST", path, valid_body(rng, chat, stream), half_close)
            why = check_answer(status, body, chat, stream)
    except Exception as e:  # a reset, a timeout, a cut answer: all failures of a valid request
        why = f"{type(e).__name__}: {e}"
    st.valid_result(name, why is None, why)


def do_keepalive(t, st, rng):
    """Three requests on one connection (http.client keeps it alive)."""
    c = http.client.HTTPConnection(t.host, t.port, timeout=IO_TIMEOUT)
    headers = {"Content-Type": "application/json"}
    if t.api_key:
        headers["Authorization"] = f"Bearer {t.api_key}"
    why = None
    try:
        for _ in range(3):
            b = valid_body(rng, True, False)
            c.request("POST", "/v1/chat/completions", json.dumps(b), headers)
            r = c.getresponse()
            why = check_answer(r.status, r.read(), True, False)
            if why:
                break
        c.request("GET", "/health")
        r = c.getresponse()
        if not why and (r.status != 200 or b'"status"' not in r.read()):
            why = f"/health on a kept-alive connection: {r.status}"
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    finally:
        c.close()
    st.valid_result("keep-alive x3 + health", why is None, why)


def do_get(t, st, rng):
    path = rng.choice(["/health", "/metrics", "/v1/models"])
    try:
        status, _, body = exchange(t, "GET", path)
        why = None if status == 200 and body else f"status {status}"
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    st.valid_result(f"GET {path}", why is None, why)


def do_drop_stream(t, st, rng):
    """A stream dropped after a few bytes: the server cancels it and goes on."""
    b = valid_body(rng, True, True)
    b.update(max_tokens=200, ignore_eos=True)
    s = t.connect()
    try:
        data = json.dumps(b).encode()
        s.sendall(t.head("POST", "/v1/chat/completions", len(data)) + data)
        got = b""
        while len(got) < 12:  # the status line's start, then some more or not
            d = s.recv(12 - len(got))
            if not d:
                break
            got += d
        if rng.random() < 0.5:
            got += s.recv(rng.randint(1, 4096))
        good, why = got.startswith(b"HTTP/1.1 200"), got[:100]
    except Exception as e:
        good, why = False, f"{type(e).__name__}: {e}"
    finally:
        s.close()
    st.hostile_result("stream dropped mid-way", good, why)


def do_reset(t, st, rng):
    b = valid_body(rng, False, False)
    b.update(max_tokens=200, ignore_eos=True)
    s = t.connect()
    data = json.dumps(b).encode()
    s.sendall(t.head("POST", "/v1/completions", len(data)) + data)
    time.sleep(rng.random() * 0.3)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    st.hostile_result("non-streaming request reset", True)


MALFORMED = [
    b'{"messages": [',
    b'[1, 2, 3]',
    b'{"messages": "hi"}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
    b'{"messages": [{"role": "wizard", "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}',
    b'{"messages": [{"role": "user", "content": "x"}], "n": 3}',
    b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
    b'{"prompt": "\xff\xfe"}',
    b'{"prompt": [1, 2, 99999999]}',
    b'{"prompt": 1e999}',
    b'{"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i"]}',
    b'[' * 5000 + b']' * 5000,
    # wrong types of otherwise valid fields
    b'{"prompt": "x", "max_tokens": "ten"}',
    b'{"prompt": "x", "stream": "yes"}',
    b'{"prompt": {"text": "x"}}',
    b'{"prompt": "x", "stop": 5}',
    b'{"prompt": "x", "seed": "s"}',
    b'{"prompt": "x", "top_p": [1]}',
    b'{"prompt": "x", "ignore_eos": 1}',
    b'{"messages": [{"role": "user", "content": 7}]}',
    b'{"messages": [{"role": "user"}]}',
    b'{"messages": {"role": "user", "content": "x"}}',
    b'{"prompt": "x", "stream_options": []}',
    b'{"prompt": null}',
    b'',
    b'\x00\x01\x02',
]
# ... and bodies wrong for /v1/messages only (Anthropic's), besides those above.
MALFORMED_MESSAGES = [
    b'{"messages": [{"role": "user", "content": "x"}]}',  # no max_tokens
    b'{"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}',
    b'{"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{}]}',
    b'{"max_tokens": 4, "messages": [{"role": "assistant", "content": "x"}]}',
    b'{"max_tokens": 4, "system": 5, "messages": [{"role": "user", "content": "x"}]}',
    b'{"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}',
    b'{"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}',
]


def do_malformed(t, st, rng):
    path = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/messages"])
    body = rng.choice(MALFORMED + (MALFORMED_MESSAGES if path == "/v1/messages" else []))
    s = t.connect()
    try:
        s.sendall(t.head("POST", path, len(body)) + body)
        status, _, data = parse_response(read_until_close(s))
        good = status == 400 and error_message(data) is not None
        why = f"{body[:40]!r} -> {status} {data[:150]!r}"
    except Exception as e:
        good, why = False, f"{body[:40]!r}: {type(e).__name__}: {e}"
    finally:
        s.close()
    st.hostile_result("malformed body: 400", good, why)


def do_long_prompt(t, st, rng):
    """A prompt longer than the context (t.ctx tokens): 400 context_length_exceeded, streamed
    or not, on each route; as text (each word at least one token) or as token ids."""
    n = t.ctx + rng.randint(1, t.ctx)
    path = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/messages"])
    text = " ".join(rng.choice(WORDS) for _ in range(n))
    if path == "/v1/completions":
        b = {"prompt": [rng.randint(1, t.n_vocab - 1) for _ in range(n)]
             if rng.random() < 0.5 else text}
    else:
        b = {"messages": [{"role": "user", "content": text}]}
    b["max_tokens"] = rng.randint(1, 12)
    if rng.random() < 0.5:
        b["stream"] = True
    try:
        status, _, data = exchange(t, "POST", path, b)
        good = status == 400 and error_message(data) is not None
        why = f"{path} {n} words/ids -> {status} {data[:150]!r}"
    except Exception as e:
        good, why = False, f"{path}: {type(e).__name__}: {e}"
    st.hostile_result("prompt over the context: 400", good, why)


UNKNOWN = [("GET", "/v1/nope"), ("POST", "/v2/chat/completions"), ("GET", "/"),
           ("POST", "/v1/embeddings"), ("DELETE", "/v1/completions"), ("GET", "/v1/chat/completions"),
           ("PUT", "/health"), ("POST", "/metrics"), ("PATCH", "/v1/models"),
           ("GET", "/v1/models/../../etc/passwd"), ("GET", "/%00"), ("POST", "/v1/completions/x")]


def do_unknown_route(t, st, rng):
    method, path = rng.choice(UNKNOWN)
    body = {"prompt": "x"} if rng.random() < 0.5 else None
    try:
        status, _, data = exchange(t, method, path, body)
        good = status in (400, 404, 405) and error_message(data) is not None
        why = f"{method} {path} -> {status} {data[:150]!r}"
    except Exception as e:
        good, why = False, f"{method} {path}: {type(e).__name__}: {e}"
    st.hostile_result("unknown route/method: 404/405", good, why)


def do_oversized(t, st, rng):
    """A body over --max-body: declared (answered before it is sent) or chunked (read to the
    limit, then refused)."""
    s = t.connect()
    try:
        if rng.random() < 0.7:
            s.sendall(t.head("POST", "/v1/completions", t.max_body + 1 + rng.randint(0, 1 << 20)))
            name = "declared body over --max-body: 413"
        else:
            name = "chunked body over --max-body: 413"
            h = t.head("POST", "/v1/completions", None,
                       "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")
            s.sendall(h)
            piece = b" " * 65536
            chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
            try:
                for _ in range(t.max_body // len(piece) + 2):
                    s.sendall(chunk)
                s.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the server may answer and close before the end
        status, _, data = parse_response(read_until_close(s))
        good, why = status == 413 and error_message(data) is not None, f"{status} {data[:150]!r}"
    except Exception as e:
        good, why = False, f"{type(e).__name__}: {e}"
    finally:
        s.close()
    st.hostile_result(name, good, why)


def do_bad_host(t, st, rng):
    s = t.connect()
    try:
        host = rng.choice([b"evil.example", b"evil.example:8080", b"127.0.0.1.nip.io", b"[::2]:80",
                           b"ev\xffil", b"localhost:99999", b"[::1"])
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        status, _, data = parse_response(read_until_close(s))
        good = status == 403 and error_message(data) is not None
        why = f"Host {host}: {status} {data[:100]!r}"
    except Exception as e:
        good, why = False, f"{type(e).__name__}: {e}"
    finally:
        s.close()
    st.hostile_result("foreign Host header: 403", good, why)


def do_slow(t, st, rng):
    """Trickle header bytes (or send nothing): the server must close the connection within
    --header-timeout (plus the watchdog's tick and some slack)."""
    silent = rng.random() < 0.3
    name = "silent connection closed in time" if silent else "trickled headers closed in time"
    limit = t.header_timeout + 3
    s = t.connect(timeout=1)
    t0 = time.time()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100000
    i, closed = 0, False
    try:
        while time.time() - t0 < limit + 2:
            if not silent:
                s.send(head[i:i + 1])
                i += 1
            try:
                if s.recv(1024) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
    except OSError:
        closed = True
    finally:
        s.close()
    took = time.time() - t0
    st.hostile_result(name, closed and took <= limit, f"closed={closed} after {took:.1f} s")


# ---------------------------------------------------------------- the run

MIX = [  # (weight, action)
    (22, "valid"), (8, "halfclose"), (5, "keepalive"), (6, "get"),
    (6, "drop"), (5, "reset"), (10, "malformed"), (2, "oversized"), (3, "badhost"),
    (3, "longprompt"), (3, "unknown"),
]


def worker(t, st, seed, stop_at, max_requests):
    rng = random.Random(seed)
    total = sum(w for w, _ in MIX)
    while time.time() < stop_at and st.n < max_requests:
        r, action = rng.uniform(0, total), None
        for w, a in MIX:
            r -= w
            if r <= 0:
                action = a
                break
        action = action or "valid"
        if action == "valid":
            do_valid(t, st, rng)
        elif action == "halfclose":
            do_valid(t, st, rng, half_close=True)
        elif action == "keepalive":
            do_keepalive(t, st, rng)
        elif action == "get":
            do_get(t, st, rng)
        elif action == "drop":
            do_drop_stream(t, st, rng)
        elif action == "reset":
            do_reset(t, st, rng)
        elif action == "malformed":
            do_malformed(t, st, rng)
        elif action == "oversized":
            do_oversized(t, st, rng)
        elif action == "badhost":
            do_bad_host(t, st, rng)
        elif action == "longprompt":
            do_long_prompt(t, st, rng)
        elif action == "unknown":
            do_unknown_route(t, st, rng)


def slow_worker(t, st, seed, stop_at):
    rng = random.Random(seed)
    # Each slow connection takes up to --header-timeout + 3 s: none starts that would outlast
    # the run, so that the run ends on time.
    while time.time() + t.header_timeout + 4 < stop_at:
        do_slow(t, st, rng)


def burster(t, st, seed, stop_at, size, every):
    rng = random.Random(seed)
    while time.time() + every < stop_at:
        time.sleep(every)
        threads = [threading.Thread(target=do_valid, args=(t, st, random.Random(rng.random())))
                   for _ in range(size)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        with st.lock:
            st.bursts += 1


def proc_sample(pid):
    """(VmRSS kB, threads, open descriptors) of pid, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        rss = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))
        threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, threads, fds
    except (OSError, AttributeError):
        return None


def sampler(pid, every, stop, samples):
    t0 = time.time()
    while not stop.is_set():
        s = proc_sample(pid)
        if s:
            samples.append((time.time() - t0,) + s)
        stop.wait(every)


def metric(t, name):
    try:
        status, _, body = exchange(t, "GET", "/metrics")
        m = re.search(rf"^{re.escape(name)} (\S+)$", body.decode(), re.M)
        return float(m.group(1)) if m else None
    except Exception:
        return None


def model_limits(t):
    """(context length, vocabulary size) from /v1/models, None for what it does not say."""
    try:
        status, _, body = exchange(t, "GET", "/v1/models")
        m = json.loads(body)["data"][0]
        meta = m.get("meta") or {}
        return m.get("max_model_len") or meta.get("n_ctx"), meta.get("n_vocab")
    except Exception:
        return None, None


GREEDY = [  # (path, body): temperature 0, so the same text every time on an unchanged server
    ("/v1/completions", {"prompt": "In the beginning", "max_tokens": 32, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Who was the first king?"}],
                              "max_tokens": 32, "temperature": 0}),
    ("/v1/completions", {"prompt": "And the LORD said", "max_tokens": 24, "temperature": 0,
                         "stream": True}),
]


def greedy_answers(t):
    """The texts of the GREEDY requests (an error text in place of a failed one)."""
    out = []
    for path, body in GREEDY:
        try:
            status, _, data = exchange(t, "POST", path, body)
            if status != 200:
                out.append(f"<status {status}>")
            elif body.get("stream"):
                out.append("".join(json.loads(e)["choices"][0].get("text") or ""
                                   for e in sse_events(data)[:-1] if json.loads(e).get("choices")))
            else:
                c = json.loads(data)["choices"][0]
                out.append(c["message"]["content"] if "message" in c else c["text"])
        except Exception as e:
            out.append(f"<{type(e).__name__}: {e}>")
    return out


def start_server(cmd, log_path):
    log = open(log_path, "w")
    p = subprocess.Popen(cmd + ["--port", "0"], stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(600):
        time.sleep(0.1)
        with open(log_path) as f:
            m = re.search(r"listening on http://(\[[^\]]+\]|[^:/]+):(\d+)", f.read())
        if m:
            return p, m.group(1).strip("[]"), int(m.group(2))
        if p.poll() is not None:
            break
    p.kill()
    sys.exit(f"soak: the server did not start; its log:\n{open(log_path).read()[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (http://127.0.0.1:PORT)")
    ap.add_argument("--pid", type=int, help="its process, for the memory samples")
    ap.add_argument("--duration", type=float, default=60, help="seconds of load (default 60)")
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=6, help="request loops at once (default 6)")
    ap.add_argument("--slow", type=int, default=2, help="slow connections at once (default 2)")
    ap.add_argument("--burst", type=int, default=24, help="requests per burst (default 24)")
    ap.add_argument("--burst-every", type=float, default=10, help="seconds (default 10)")
    ap.add_argument("--max-body", default="8M", help="the server's --max-body (default 8M)")
    ap.add_argument("--header-timeout", type=float, default=10,
                    help="the server's --header-timeout (default 10)")
    ap.add_argument("--api-key", default=os.environ.get("SLUICE_API_KEY"))
    ap.add_argument("--sample-every", type=float, default=10, help="seconds (default 10)")
    ap.add_argument("--stop-within", type=float, default=15,
                    help="with a command: SIGTERM must end it within this (default 15)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "sluice-soak-server.log"),
                    help="with a command: its stderr (default: in the temporary directory, not the tree)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- sluice serve MODEL ...")
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    max_body = int(float(a.max_body[:-1]) * units[a.max_body[-1].upper()]) \
        if a.max_body[-1:].upper() in units else int(a.max_body)

    proc = None
    if cmd:
        proc, host, port = start_server(cmd, a.log)
        pid = proc.pid
    elif a.url:
        u = urllib.parse.urlparse(a.url)
        host, port, pid = u.hostname, u.port or 80, a.pid
    else:
        ap.error("give --url, or a server command after --")
    try:
        if not ipaddress.ip_address(socket.gethostbyname(host) if ":" not in host else host).is_loopback:
            raise ValueError
    except ValueError:
        sys.exit(f"soak: {host} is not a loopback address: this tool only drives local servers")

    t = Target(host, port, a.api_key, max_body, a.header_timeout)
    ctx, n_vocab = model_limits(t)
    t.ctx, t.n_vocab = ctx or t.ctx, n_vocab or t.n_vocab
    greedy_before = greedy_answers(t)
    st = Stats()
    t_start = time.time()
    stop_at = t_start + a.duration
    samples, stop_sampling = [], threading.Event()
    threads = []
    if pid:
        threads.append(threading.Thread(target=sampler, args=(pid, a.sample_every, stop_sampling, samples)))
    threads += [threading.Thread(target=worker, args=(t, st, a.seed * 1000 + i, stop_at, a.max_requests))
                for i in range(a.workers)]
    threads += [threading.Thread(target=slow_worker, args=(t, st, a.seed * 2000 + i, stop_at))
                for i in range(a.slow)]
    if a.burst > 0:
        threads.append(threading.Thread(target=burster,
                                        args=(t, st, a.seed, stop_at, a.burst, a.burst_every)))
    for th in threads:
        th.daemon = True
        th.start()
    for th in threads[1 if pid else 0:]:
        th.join(timeout=max(0.0, stop_at - time.time()) + IO_TIMEOUT + a.header_timeout + 10)
    stuck = sum(th.is_alive() for th in threads[1 if pid else 0:])
    elapsed = time.time() - t_start

    # After the load: the server is idle again and answers.
    time.sleep(1)
    anomalies = []
    if stuck:
        anomalies.append(f"{stuck} client threads did not finish (a request hung past {IO_TIMEOUT:.0f} s)")
    running = metric(t, "sluice_requests_running")
    open_conns = metric(t, "sluice_connections_open")
    try:
        health = exchange(t, "GET", "/health")[0]
    except Exception as e:
        health = f"{type(e).__name__}: {e}"
    if health != 200:
        anomalies.append(f"/health after the load: {health}")
    if running not in (0, None):
        anomalies.append(f"sluice_requests_running {running} after the load")
    greedy_after = greedy_answers(t)
    for (path, _), x, y in zip(GREEDY, greedy_before, greedy_after):
        if x != y or x.startswith("<"):
            anomalies.append(f"greedy {path}: {x[:80]!r} before the load, {y[:80]!r} after")
    stop_sampling.set()
    if pid:
        s = proc_sample(pid)
        if s:
            samples.append((time.time() - t_start,) + s)

    stop_rc = None
    if proc:
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            stop_rc = proc.wait(timeout=a.stop_within)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stop_rc = "killed"
        took = time.time() - t0
        if stop_rc != 0:
            anomalies.append(f"SIGTERM: exit {stop_rc} after {took:.1f} s (within {a.stop_within} s wanted)")

    # ---- report
    n_valid = sum(r[0] + r[1] for r in st.valid.values())
    failed_valid = sum(r[1] for r in st.valid.values())
    n_hostile = sum(r[0] + r[1] for r in st.hostile.values())
    bad_hostile = sum(r[1] for r in st.hostile.values())
    print(f"soak: {elapsed:.0f} s against {host}:{port}, {st.n} requests "
          f"({st.n / max(elapsed, 1e-9):.1f}/s): {n_valid} valid, {n_hostile} hostile, "
          f"{st.bursts} bursts of {a.burst}")
    for title, table in (("valid", st.valid), ("hostile", st.hostile)):
        for name in sorted(table):
            good, bad = table[name]
            print(f"  {title:8s} {name:44s} {good:7d} ok {bad:5d} {'failed' if title == 'valid' else 'anomalies'}")
    if samples:
        rss = [x[1] for x in samples]
        warm = next((x[1] for x in samples if x[0] >= min(30, elapsed / 4)), rss[0])
        print(f"  server RSS (kB): start {rss[0]}, after warm-up {warm}, end {rss[-1]}, max {max(rss)} "
              f"({len(samples)} samples every {a.sample_every:g} s)")
        # The second half's drift is the leak test: per-thread malloc arenas grow for a while
        # (up to one per connection thread at the bursts' peak), then level off.
        half = next((x[1] for x in samples if x[0] >= samples[-1][0] / 2), rss[0])
        print(f"  RSS drift after warm-up: {rss[-1] - warm:+d} kB ({(rss[-1] - warm) / warm * 100:+.1f}%); "
              f"over the second half: {rss[-1] - half:+d} kB ({(rss[-1] - half) / half * 100:+.1f}%)")
        step = max(1, len(samples) // 10)  # the trend: a leak climbs, arenas level off
        print("  RSS trend (s: kB): " + ", ".join(f"{x[0]:.0f}: {x[1]}" for x in samples[::step]))
        print(f"  server threads: start {samples[0][2]}, end {samples[-1][2]}, max {max(x[2] for x in samples)}; "
              f"open descriptors: start {samples[0][3]}, end {samples[-1][3]}, max {max(x[3] for x in samples)}")
    if open_conns is not None:
        print(f"  connections open after the load: {open_conns:.0f}")
    print(f"  greedy answers after the load: "
          f"{sum(x == y for x, y in zip(greedy_before, greedy_after))} of {len(GREEDY)} identical "
          f"to before (context {t.ctx}, vocabulary {t.n_vocab})")
    if proc:
        print(f"  SIGTERM: exit status {stop_rc}")
    for f in st.failures:
        print(f"  first failures: {f}")
    for an in anomalies:
        print(f"  ANOMALY: {an}")
    good = failed_valid == 0 and bad_hostile == 0 and not anomalies
    print(f"soak: {n_valid - failed_valid} passed, {failed_valid} failed (valid requests); "
          f"{bad_hostile} hostile anomalies; {'OK' if good else 'FAILED'}")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
