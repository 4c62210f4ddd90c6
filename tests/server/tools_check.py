#!/usr/bin/env python3
"""The prompts of tool conversations through both routes of `sluice serve`.

    tools_check.py URL CASES.json

For each conversation of CASES.json (tools/tool_template_ref.py: messages,
tools, and the Jinja template's rendering in "expected"), the prompt of
/v1/chat/completions and, where the conversation has an Anthropic form, of
/v1/messages (tools as {name, description, input_schema}, calls as tool_use
blocks, results as tool_result blocks) must have as many tokens as the
rendering (/tokenize): the server renders what the template renders, through
either API. (A function's keys other than name, description and parameters have
no place in Anthropic's tool shape: with those, the /v1/messages prompt is
compared with the chat prompt of the tools without them.) Prints "ok NAME" /
"FAIL NAME ..." lines.
"""
import json
import sys
import urllib.error
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def anthropic(case):
    """The case as a /v1/messages body, or None when it has no Anthropic form (a system message
    after the first, a tool result first, a conversation not ending with a user turn)."""
    msgs, system, out = case["messages"], None, []
    if msgs[0]["role"] == "system":
        system, msgs = msgs[0]["content"], msgs[1:]
    for m in msgs:
        if m["role"] == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m["content"] else []
            blocks += [{"type": "tool_use", "id": t["id"], "name": t["function"]["name"],
                        "input": json.loads(t["function"]["arguments"])} for t in m.get("tool_calls", [])]
            out.append({"role": "assistant", "content": blocks or m["content"]})
        elif m["role"] == "tool":
            if not out:
                return None
            b = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(b)
            else:
                out.append({"role": "user", "content": [b]})
        elif m["role"] == "user":
            out.append({"role": "user", "content": m["content"]})
        else:
            return None
    if out[-1]["role"] != "user":
        return None
    body = {"model": "m", "max_tokens": 1, "messages": out}
    if system is not None:
        body["system"] = system
    if case["tools"]:
        body["tools"] = [{"name": t["function"]["name"], **({"description": t["function"]["description"]}
                          if "description" in t["function"] else {}),
                          "input_schema": t["function"].get("parameters", {"type": "object"})}
                         for t in case["tools"]]
    return body


def main():
    url, path = sys.argv[1], sys.argv[2]
    failed = 0
    for case in json.load(open(path, encoding="utf-8")):
        name = case["name"]
        want = len(post(url + "/tokenize", {"content": case["expected"], "parse_special": True})["tokens"])
        body = {"messages": case["messages"], "max_tokens": 1}
        if case["tools"]:
            body["tools"] = case["tools"]
        got = post(url + "/v1/chat/completions", body).get("usage", {}).get("prompt_tokens")
        checks = [("chat", got)]
        a = anthropic(case)
        if a:
            checks.append(("messages", post(url + "/v1/messages", a).get("usage", {}).get("input_tokens")))
            plain = [{"type": "function", "function": {k: v for k, v in t["function"].items()
                                                       if k in ("name", "description", "parameters")}}
                     for t in case["tools"]]
            if plain != case["tools"]:
                want_a = post(url + "/v1/chat/completions", dict(body, tools=plain))["usage"]["prompt_tokens"]
                checks[-1] = ("messages", checks[-1][1], want_a)
        for route, n, *other in checks:
            w, what = (other[0], "the chat prompt of its tools' Anthropic shape") if other else (
                want, "the template's rendering")
            if n == w:
                print(f"ok   {name}: the {route} prompt is {what} ({n} tokens)")
            else:
                failed += 1
                print(f"FAIL {name}: {route} prompt {n} tokens, {what} {w}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
