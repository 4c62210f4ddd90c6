#!/usr/bin/env python3
"""Socket-level clients for tests/server/server_test.sh: what curl and the openai client
cannot do (half-close, reset, hold many connections; tools/lab/soak_server.py trickles).
Loopback only; every socket operation has a timeout. Prints "ok NAME" / "FAIL NAME: why"; exits 1 on failure.

  raw_client.py halfclose PORT stream|plain   request, shutdown(SHUT_WR), read the whole answer
  raw_client.py reset PORT SECONDS            long non-streaming request, reset after SECONDS
  raw_client.py perip PORT LIMIT              LIMIT idle connections, then one more: refused
  raw_client.py bytes PORT                    bytes that are not UTF-8 in the Host and the URL
"""
import json
import socket
import struct
import sys
import time

HOST = "127.0.0.1"


def ok(name):
    print(f"ok   {name}")


def fail(name, why):
    print(f"FAIL {name}: {why}")
    sys.exit(1)


def request(path, body, extra=""):
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{extra}\r\n")
    return head.encode() + data


def read_all(s, limit_s):
    s.settimeout(limit_s)
    out = b""
    while True:
        d = s.recv(65536)
        if not d:
            return out
        out += d


def halfclose(port, mode):
    stream = mode == "stream"
    name = f"half-closed client ({'streaming' if stream else 'not streaming'}) gets the whole answer"
    body = {"prompt": "The river", "max_tokens": 24, "temperature": 1, "top_k": 40,
            "ignore_eos": True, "stream": stream}
    s = socket.create_connection((HOST, port), timeout=10)
    s.sendall(request("/v1/completions", body, "Connection: close\r\n"))
    s.shutdown(socket.SHUT_WR)  # what `curl -T`-less scripts, nc -N and friends do
    t0 = time.time()
    data = read_all(s, 60).decode(errors="replace")
    s.close()
    if not data.startswith("HTTP/1.1 200"):
        fail(name, data[:300])
    if stream:
        good = "data: [DONE]" in data and '"finish_reason":"length"' in data
    else:
        good = '"completion_tokens":24' in data
    if not good:
        fail(name, data[-300:])
    ok(f"{name} ({time.time() - t0:.1f} s)")


def reset(port, seconds):
    """A client that goes away with a reset (SO_LINGER 0) while its non-streaming request
    generates: the server notices and cancels."""
    body = {"prompt": "The river", "max_tokens": 100000, "temperature": 1, "ignore_eos": True}
    s = socket.create_connection((HOST, port), timeout=10)
    s.sendall(request("/v1/completions", body))
    time.sleep(seconds)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    ok("reset a non-streaming request")


def perip(port, limit):
    name = f"connection {limit + 1} from one address is refused (--max-connections-per-ip {limit})"
    conns = [socket.create_connection((HOST, port), timeout=5) for _ in range(limit)]
    time.sleep(0.3)
    extra = socket.create_connection((HOST, port), timeout=5)
    extra.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    try:
        data = read_all(extra, 5)
    except OSError:
        data = b""
    extra.close()
    if data.startswith(b"HTTP/1.1 200"):
        fail(name, "it was answered")
    for s in conns[:2]:  # room again: a new one is answered (once the server has seen them go)
        s.close()
    for _ in range(20):
        time.sleep(0.25)
        again = socket.create_connection((HOST, port), timeout=5)
        again.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        try:
            data = read_all(again, 5)
        except OSError:
            data = b""
        again.close()
        if data.startswith(b"HTTP/1.1 200"):
            break
    for s in conns[2:]:
        s.close()
    if not data.startswith(b"HTTP/1.1 200"):
        fail(name, f"after closing two, /health got {data[:100]!r}")
    ok(name)


def raw_status(port, request):
    s = socket.create_connection((HOST, port), timeout=10)
    s.sendall(request)
    data = read_all(s, 10)
    s.close()
    return data.split(b"\r\n", 1)[0], data.rpartition(b"\r\n\r\n")[2]


def bytes_(port):
    """Bytes that are not UTF-8 in the Host and the URL: the error is still the right one."""
    for name, req, want in [
        ("Host", b"GET /health HTTP/1.1\r\nHost: ev\xffil\r\nConnection: close\r\n\r\n", b" 403 "),
        ("URL", b"GET /v1/\xff\xfe HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", b" 404 "),
    ]:
        status, body = raw_status(port, req)
        if want not in status or b'"error"' not in body:
            fail(f"not UTF-8 in the {name}", f"{status!r} {body[:200]!r}")
    ok("bytes that are not UTF-8 in the Host or the URL: 403, 404 (an error object, not a 500)")


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "halfclose":
        halfclose(port, sys.argv[3])
    elif mode == "reset":
        reset(port, float(sys.argv[3]))
    elif mode == "bytes":
        bytes_(port)
    elif mode == "perip":
        perip(port, int(sys.argv[3]))
    else:
        fail(mode, "unknown mode")


if __name__ == "__main__":
    main()
