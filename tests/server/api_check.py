#!/usr/bin/env python3
"""Deterministic checks of issue 29's API on a trained model (models/kjv-moe), for
tests/server/server_test.sh: /tokenize and /detokenize, /v1/models' context length,
logit_bias, logprobs (chat and completions, streamed and not), continuous batching (each
of more concurrent requests than --parallel the same as it alone), and response_format's JSON
(json_object, json_schema) by constrained decoding. Prints "ok NAME" /
"FAIL NAME: why"; exits 1 on any failure.

  api_check.py BASE_URL CTX    CTX: the --ctx-size the server runs with
"""
import json
import math
import sys
import urllib.request

URL, CTX = sys.argv[1], int(sys.argv[2])
failed = 0


def check(name, cond, why=""):
    global failed
    if cond:
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name}: {why}")


def post(path, body):
    req = urllib.request.Request(URL + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def stream(path, body):
    """The chunks of a streamed answer, up to [DONE]."""
    req = urllib.request.Request(URL + path, json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            line = line.decode().strip()
            if line == "data: [DONE]":
                return chunks
            if line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    raise AssertionError("no [DONE]")


# ---- /tokenize, /detokenize
text = ("And it came to pass, when the LORD had spoken unto Moses in the wilderness of Sinai, "
        "that the children of Israel journeyed — «ünïcödé» 中文 ✓ 🎉 " * 2)
ids = post("/tokenize", {"content": text})["tokens"]
back = post("/detokenize", {"tokens": ids})["content"]
check(f"/tokenize then /detokenize round-trips {len(text)} characters ({len(ids)} ids)",
      len(text) >= 128 and all(isinstance(i, int) for i in ids) and back == text,
      f"{back!r} != {text!r}")
check("/tokenize takes 'prompt' and 'text' too",
      post("/tokenize", {"prompt": text})["tokens"] == ids == post("/tokenize", {"text": text})["tokens"])
special = post("/tokenize", {"content": "<|endoftext|>"})["tokens"]
plain = post("/tokenize", {"content": "<|endoftext|>", "parse_special": False})["tokens"]
check("/tokenize: special tokens' text parsed unless parse_special is false",
      len(special) == 1 and len(plain) > 1 and
      post("/detokenize", {"tokens": plain})["content"] == "<|endoftext|>", f"{special} {plain}")

# ---- /v1/models: the context the server runs with
with urllib.request.urlopen(URL + "/v1/models", timeout=10) as r:
    m = json.load(r)["data"][0]
with urllib.request.urlopen(URL + "/v1/models/" + m["id"], timeout=10) as r:
    one = json.load(r)
check(f"/v1/models: max_model_len {CTX} and meta.n_ctx, n_ctx_train",
      m["max_model_len"] == CTX and m["meta"]["n_ctx"] == CTX and m["meta"]["n_ctx_train"] >= CTX
      and one == m, json.dumps(m))

# ---- logprobs, chat: greedy picks the most likely token, which tops its own list
msgs = [{"role": "user", "content": "In the beginning"}]
chat = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0,
                                     "logprobs": True, "top_logprobs": 5})
c = chat["choices"][0]
content = c["logprobs"]["content"]
good = len(content) == chat["usage"]["completion_tokens"] > 0
for e in content:
    tops = e["top_logprobs"]
    good &= len(tops) == 5 and tops[0]["token"] == e["token"]
    good &= abs(e["logprob"] - max(t["logprob"] for t in tops)) < 1e-6
    good &= all(a["logprob"] >= b["logprob"] for a, b in zip(tops, tops[1:]))
    good &= sum(math.exp(t["logprob"]) for t in tops) <= 1 + 1e-6 and e["logprob"] <= 0
    good &= bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
check("chat logprobs: greedy token = top of top_logprobs, sorted, sum exp <= 1, bytes",
      good, json.dumps(content[:2]))
check("chat logprobs: the tokens spell the reply",
      "".join(e["token"] for e in content) == c["message"]["content"], json.dumps(c))
chunks = stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0,
                                         "logprobs": True, "top_logprobs": 5})
streamed = [e for ch in chunks for e in ((ch["choices"][0].get("logprobs") or {}).get("content") or [])]
check("chat logprobs streamed: the same entries", streamed == content,
      f"{len(streamed)} vs {len(content)}")
plain = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0})
check("chat without logprobs: logprobs null, same text",
      plain["choices"][0]["logprobs"] is None and
      plain["choices"][0]["message"]["content"] == c["message"]["content"])
zero = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "temperature": 0, "logprobs": True})
check("chat logprobs without top_logprobs: empty lists",
      all(e["top_logprobs"] == [] for e in zero["choices"][0]["logprobs"]["content"]), json.dumps(zero))

# A stop string cuts the reply: the entries end with the token that reached into it.
full = c["message"]["content"]
cut = next((i for i in range(3, len(full) - 2) if full[i] == " "), None)
if cut is not None:
    stop = full[cut:cut + 2]
    cut = full.index(stop)
    sc = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0,
                                       "logprobs": True, "stop": [stop]})["choices"][0]
    toks = [e["token"] for e in sc["logprobs"]["content"]]
    check("chat logprobs with a stop string: the entries cover the cut reply, no more",
          sc["message"]["content"] == full[:cut] and "".join(toks).startswith(full[:cut]) and
          len("".join(toks[:-1])) < cut, f"{stop!r}: {toks} for {sc['message']['content']!r}")
else:
    check("chat logprobs with a stop string", False, f"no space in {full!r}")

# ---- logprobs, completions (legacy shape)
req = {"prompt": "And it came to pass", "max_tokens": 10, "temperature": 0, "logprobs": 3}
comp = post("/v1/completions", req)
c = comp["choices"][0]
lp = c["logprobs"]
off, good = 0, len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == \
    len(lp["text_offset"]) == comp["usage"]["completion_tokens"]
for tok, l, top, o in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"]):
    good &= o == off and abs(l - max(top.values())) < 1e-6 and top.get(tok) == l
    good &= sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
    off += len(tok.encode())
check("completions logprobs: tokens, token_logprobs, top_logprobs, text_offset",
      good and "".join(lp["tokens"]) == c["text"], json.dumps(lp))
chunks = stream("/v1/completions", req)
st = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
for ch in chunks:
    for k in st:
        st[k] += (ch["choices"][0]["logprobs"] or {}).get(k, [])
check("completions logprobs streamed: the same", st == lp, json.dumps(st))
# Sampling at a temperature: the figures are of the distribution at that temperature.
hot = post("/v1/completions", {**req, "max_tokens": 1, "temperature": 0.5})
cold = post("/v1/completions", {**req, "max_tokens": 1, "temperature": 2.0})
h, k = hot["choices"][0]["logprobs"], cold["choices"][0]["logprobs"]
check("completions logprobs: temperature sharpens or flattens the distribution",
      max(h["top_logprobs"][0].values()) > max(k["top_logprobs"][0].values()),
      f"{h} {k}")

# ---- logit_bias: +100 forces a token (greedy and sampled), -100 bans the favourite
target = post("/tokenize", {"content": " without"})["tokens"]
forced = post("/v1/completions", {"prompt": "And it came to pass", "max_tokens": 4,
                                  "temperature": 0, "logit_bias": {str(target[0]): 100},
                                  "logprobs": 1})
check("logit_bias +100 forces the token under greedy (its logprob ~0)",
      len(target) == 1 and forced["choices"][0]["text"] == " without" * 4 and
      all(x > -1e-3 for x in forced["choices"][0]["logprobs"]["token_logprobs"]), json.dumps(forced))
sampled = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 1,
                                        "seed": 3, "logit_bias": {str(target[0]): 100}})
check("logit_bias +100 forces the token when sampling",
      sampled["choices"][0]["message"]["content"] == " without" * 4, json.dumps(sampled))
first = comp["choices"][0]["logprobs"]["tokens"][0]
fid = post("/tokenize", {"content": first})["tokens"]
banned = post("/v1/completions", {**req, "max_tokens": 1, "logit_bias": {str(fid[0]): -100}})
check("logit_bias -100 bans the greedy choice: the runner-up comes",
      len(fid) == 1 and banned["choices"][0]["logprobs"]["tokens"][0] ==
      sorted(lp["top_logprobs"][0].items(), key=lambda kv: -kv[1])[1][0], json.dumps(banned))

# ---- continuous batching: requests generating together (and joining, leaving, waiting for a
# place) each give what they give alone: greedy and seeded sampling, short and long prompts,
# free text and JSON (response_format).
import threading

verses = ["And God said, Let there be light: and there was light.",
          "In the beginning God created the heaven and the earth.",
          "And the LORD spake unto Moses, saying,",
          "Blessed are the meek: for they shall inherit the earth."]
jobs = []
for i in range(10):
    prompt = " ".join(verses[(i + k) % 4] for k in range(1 + 2 * (i % 4)))  # 12 to ~115 tokens
    body = {"prompt": prompt, "max_tokens": 24 + 5 * i, "logprobs": 1}
    body.update({"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "seed": 100 + i})
    if i % 3 == 0:  # each sequence's own JSON constraint, beside free text
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "v", "schema": {
            "type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["n"]}}} if i % 2 else {"type": "json_object"}
    jobs.append(body)


def run(body):
    c = post("/v1/completions", body)["choices"][0]
    return c["text"], c["logprobs"]["token_logprobs"]


def metric(name):
    with urllib.request.urlopen(URL + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


alone = [run(b) for b in jobs]
steps0, rows0 = metric("sluice_decode_steps_total"), metric("sluice_decode_rows_total")
together = [None] * len(jobs)


def worker(i):
    together[i] = run(jobs[i])


threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
for th in threads:
    th.start()
for th in threads:
    th.join()
steps, rows = metric("sluice_decode_steps_total") - steps0, metric("sluice_decode_rows_total") - rows0
same = [i for i in range(len(jobs)) if together[i] == alone[i]]
check(f"{len(jobs)} requests at once: each the same text and logprobs as alone "
      f"({int(rows)} tokens in {int(steps)} decode steps, {rows / max(steps, 1):.1f} a step)",
      len(same) == len(jobs) and rows > 1.5 * steps,
      f"differ: {[i for i in range(len(jobs)) if i not in same]}, steps {steps}, rows {rows}")

# ---- response_format: a model of plain text made to write JSON (of a schema) by the mask
def valid(schema, v):
    """The keywords the constraint supports, read as JSON Schema reads them."""
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
             "integer": int, "number": (int, float)}
    t = schema.get("type")
    if t is not None and not any(isinstance(v, types[x]) and not (isinstance(v, bool) and x in
                                 ("integer", "number")) for x in (t if isinstance(t, list) else [t])):
        return False
    if "enum" in schema and v not in schema["enum"]:
        return False
    if isinstance(v, dict):
        props = schema.get("properties", {})
        if any(k not in v for k in schema.get("required", [])):
            return False
        if props and any(k not in props for k in v):
            return False  # additionalProperties: false
        return all(valid(props.get(k, {}), x) for k, x in v.items())
    if isinstance(v, list):
        return len(v) <= schema.get("maxItems", len(v)) and all(valid(schema.get("items", {}), x) for x in v)
    return True


verse = {"type": "object", "additionalProperties": False, "required": ["book", "chapter", "verse"],
         "properties": {"book": {"enum": ["Genesis", "Exodus", "Psalms"]},
                        "chapter": {"type": "integer"}, "verse": {"type": "integer"},
                        "holy": {"type": "boolean"},
                        "words": {"type": "array", "items": {"type": "string"}, "maxItems": 2}}}
scalars = {"type": "object", "required": ["book", "holy"],
           "properties": {"book": {"enum": ["Genesis", "Exodus"]}, "n": {"type": "number"},
                          "holy": {"type": ["boolean", "null"]}}}
cases = [("chat", {"type": "json_object"}, {"type": "object"}, 0),
         ("chat", {"type": "json_schema", "json_schema": {"name": "verse", "strict": True, "schema": verse}}, verse, 0),
         ("completions", {"type": "json_object"}, {"type": "object"}, 0),
         ("completions", {"type": "json_schema", "json_schema": {"name": "verse", "schema": verse}}, verse, 0),
         ("chat", {"type": "json_schema", "json_schema": {"name": "s", "schema": scalars}}, scalars, 1.0)]
for path, rf, schema, temp in cases:
    body = {"max_tokens": 200, "temperature": temp, "seed": 7, "response_format": rf}
    if path == "chat":
        body["messages"] = msgs
    else:
        body["prompt"] = "And it came to pass"
    r = post("/v1/" + ("chat/completions" if path == "chat" else "completions"), body)["choices"][0]
    text = r["message"]["content"] if path == "chat" else r["text"]
    try:
        doc = json.loads(text)
    except ValueError as e:
        doc = e
    name = f"{path} response_format {rf['type']} (temperature {temp})"
    check(f"{name}: the reply parses and validates, finish_reason stop",
          r["finish_reason"] == "stop" and not isinstance(doc, ValueError) and valid(schema, doc),
          f"{r['finish_reason']}: {text!r}")
    chunks = stream("/v1/" + ("chat/completions" if path == "chat" else "completions"), body)
    st = "".join((ch["choices"][0].get("delta", {}).get("content") if path == "chat" else
                  ch["choices"][0].get("text")) or "" for ch in chunks)
    check(f"{name} streamed: the same text", st == text, f"{st!r} vs {text!r}")

sys.exit(1 if failed else 0)
