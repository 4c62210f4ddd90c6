#!/usr/bin/env bash
# End-to-end checks of `sluice serve` on a free loopback port, with a tiny random
# Qwen3-MoE and the real Qwen3 tokenizer (ChatML): the official `openai` and
# `@anthropic-ai/sdk` npm clients (streaming and not), error cases with curl, cancellation on disconnect, a bounded
# load test with the server's RSS compared before and after, and SIGTERM finishing
# the request in flight. Then the server as a local service (issue 24): the Host check
# and CORS, API keys, the wait queue, half-closed and slow clients, a failing forward,
# the bounded shutdown, and a short soak (tools/lab/soak_server.py). Generated text is
# noise; the protocol is what is checked. Loopback only.
set -u
BIN=$(realpath "${1:-build/sluice}")
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
. "$HERE/../lib.sh"
t_start=$(date +%s)

# The official clients, in this folder (pinned by package-lock.json).
if [ ! -f "$HERE/node_modules/openai/package.json" ] || [ ! -f "$HERE/node_modules/@anthropic-ai/sdk/package.json" ]; then
    (cd "$HERE" && npm install --no-audit --no-fund --loglevel=error) >"$TMP/npm.log" 2>&1 ||
        { cat "$TMP/npm.log"; echo "FAIL npm install (openai, @anthropic-ai/sdk)"; exit 1; }
fi
"${PYTHON:-python3}" "$HERE/../../tools/make_synth.py" "$TMP/tq" --preset tiny-qwen-vocab >/dev/null 2>&1 &&
    cp "$HERE/../tokenizer/qwen3/tokenizer.json" "$TMP/tq/" || { echo "FAIL tiny model"; exit 1; }

# start NAME [options]: starts a server of $MODEL_DIR (default the tiny model) on a free
# port (--port 0), sets PID, URL.
start() {
    local name=$1
    shift
    "$BIN" serve "${MODEL_DIR:-$TMP/tq}" --chat-template chatml --port 0 -t 1 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    PID=$!
    PIDS+=("$PID")
    for _ in $(seq 100); do
        grep -q "listening on" "$TMP/$name.err" && break
        sleep 0.1
    done
    URL=$(grep -o 'http://[0-9.:]*' "$TMP/$name.err" | head -n 1)
    [ -n "$URL" ] || { bad "$name: server did not start: $(cat "$TMP/$name.err")"; return 1; }
}
stop() { kill -TERM "$1" 2>/dev/null; wait "$1" 2>/dev/null; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
metric() { curl -s "$URL/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

# raw MODE ARGS...: one check of tests/server/raw_client.py (socket-level clients), counted.
raw() {
    local out
    if out=$($PY "$HERE/raw_client.py" "$@" 2>&1); then ok "${out#ok   }"; else bad "${out#FAIL }"; fi
}

# expect NAME STATUS PATTERN CURL-ARGS...: the HTTP status and a body matching PATTERN.
expect() {
    local name=$1 want=$2 pat=$3
    shift 3
    local got
    got=$(curl -s -o "$TMP/body" -w '%{http_code}' "$@")
    if [ "$got" = "$want" ] && grep -q -- "$pat" "$TMP/body"; then
        ok "$name"
    else
        bad "$name: status $got (want $want), body $(head -c 300 "$TMP/body")"
    fi
}

# ---- command line
if "$BIN" serve --help | grep -q "usage: sluice serve"; then ok "serve --help"; else bad "serve --help"; fi
if "$BIN" serve 2>&1 | grep -q "missing MODEL"; then ok "serve without a model"; else bad "serve without a model"; fi
if "$BIN" serve "$TMP/tq" --port 99999 2>&1 | grep -q "invalid --port"; then ok "bad --port"; else bad "bad --port"; fi
if "$BIN" serve "$TMP/nonexistent" --port 0 2>&1 | grep -q "No such file"; then ok "bad model"; else bad "bad model"; fi
# Every option of issue 24 is in --help.
missing=""
for o in --api-key-file --cors --queue --queue-timeout --header-timeout --max-connections \
    --max-connections-per-ip --shutdown-timeout; do
    "$BIN" serve --help | grep -q -- "^  $o " || missing="$missing $o"
done
[ -z "$missing" ] && ok "serve --help lists the new options" || bad "serve --help lacks$missing"
# An empty key would turn on authentication that an empty bearer passes: refused.
if SLUICE_API_KEY= "$BIN" serve "$TMP/tq" --port 0 2>&1 | grep -q "SLUICE_API_KEY is set but empty"; then
    ok "empty SLUICE_API_KEY: refused"
else
    bad "empty SLUICE_API_KEY"
fi
printf '\n' >"$TMP/empty.key"
if "$BIN" serve "$TMP/tq" --port 0 --api-key-file "$TMP/empty.key" 2>&1 | grep -q "the first line is empty"; then
    ok "empty --api-key-file: refused"
else
    bad "empty --api-key-file"
fi
if "$BIN" serve "$TMP/tq" --port 0 --api-key-file "$TMP/none.key" 2>&1 | grep -q "none.key: No such file"; then
    ok "missing --api-key-file: named"
else
    bad "missing --api-key-file"
fi

# ---- the API through the official client
start main --ctx-size 1024 || exit 1
MAIN=$PID
MAIN_URL=$URL
node "$HERE/client.mjs" api "$URL/v1" >"$TMP/api.log" 2>&1
cat "$TMP/api.log"
pass=$((pass + $(grep -c '^ok' "$TMP/api.log")))
fail=$((fail + $(grep -c '^FAIL' "$TMP/api.log")))
grep -q "^ok" "$TMP/api.log" || bad "openai client produced nothing"
# The Anthropic Messages API (/v1/messages) through its official client.
node "$HERE/anthropic_client.mjs" api "$URL" >"$TMP/anthropic.log" 2>&1
cat "$TMP/anthropic.log"
pass=$((pass + $(grep -c '^ok' "$TMP/anthropic.log")))
fail=$((fail + $(grep -c '^FAIL' "$TMP/anthropic.log")))
grep -q "^ok" "$TMP/anthropic.log" || bad "anthropic client produced nothing"

# A port in use is a clear error. Asked for all interfaces without a key, the server warns
# first, before the bind (which fails on the port in use: nothing ever listens beyond loopback).
port=${URL##*:}
"$BIN" serve "$TMP/tq" --chat-template chatml --host 0.0.0.0 --port "$port" >/dev/null 2>"$TMP/any.err"
if grep -q "cannot listen on 0.0.0.0:$port: Address already in use" "$TMP/any.err"; then
    ok "port in use"
else
    bad "port in use: $(cat "$TMP/any.err")"
fi
if grep -q "warning: listening on 0.0.0.0 without an API key" "$TMP/any.err"; then
    ok "--host 0.0.0.0 without a key warns"
else
    bad "--host 0.0.0.0 warning: $(cat "$TMP/any.err")"
fi

# ---- bad input with curl: OpenAI error objects, and the server stays up
J=(-H 'Content-Type: application/json')
expect "GET /health" 200 '"status":"ok"' "$URL/health"
expect "GET /v1/models" 200 '"object":"list"' "$URL/v1/models"
# DNS rebinding: a page whose name points at 127.0.0.1 sends its own name as Host.
expect "foreign Host: 403" 403 '"code":"host_not_allowed"' -H "Host: evil.example:$port" "$URL/v1/models"
expect "foreign Host on /health too: 403" 403 'host_not_allowed' -H "Host: 127.0.0.1.evil.example" "$URL/health"
raw bytes "$port"
expect "Host localhost:PORT" 200 '"object":"list"' -H "Host: localhost:$port" "$URL/v1/models"
expect "Host [::1]:PORT" 200 '"object":"list"' -H "Host: [::1]:$port" "$URL/v1/models"
# No --cors: no CORS header, and a preflight is a wrong method.
if curl -s -D - -o /dev/null -H 'Origin: http://evil.example' "$URL/v1/models" | grep -qi '^access-control'; then
    bad "no CORS headers without --cors"
else
    ok "no CORS headers without --cors"
fi
expect "OPTIONS without --cors: 405" 405 'method not allowed' -X OPTIONS -H 'Origin: http://evil.example' \
    -H 'Access-Control-Request-Method: POST' "$URL/v1/chat/completions"
expect "chat prompt longer than the context: 400" 400 'context_length_exceeded' "${J[@]}" \
    -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$(printf 'river %.0s' $(seq 1100))\"}]}" "$URL/v1/chat/completions"
expect "malformed JSON: 400" 400 '"type":"invalid_request_error"' "${J[@]}" -d '{"messages": [' "$URL/v1/chat/completions"
expect "body not an object: 400" 400 'JSON object' "${J[@]}" -d '[1, 2]' "$URL/v1/chat/completions"
expect "wrong type (temperature): 400" 400 '"param":"temperature"' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}' "$URL/v1/chat/completions"
expect "wrong type (messages): 400" 400 '"param":"messages"' "${J[@]}" -d '{"messages":"hi"}' "$URL/v1/chat/completions"
expect "wrong type (stream): 400" 400 '"param":"stream"' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"stream":"yes"}' "$URL/v1/chat/completions"
expect "out of range (max_tokens 0): 400" 400 '"param":"max_tokens"' "${J[@]}" \
    -d '{"prompt":"x","max_tokens":0}' "$URL/v1/completions"
expect "invalid UTF-8: 400" 400 'invalid JSON' "${J[@]}" --data-binary $'{"prompt":"\xff\xfe"}' "$URL/v1/completions"
$PY -c 'import json; print(json.dumps({"prompt": "river " * 3000, "max_tokens": 4}))' >"$TMP/long.json"
expect "prompt longer than the context: 400 with the numbers" 400 'maximum context length is 1024 tokens.*3001 tokens' \
    "${J[@]}" --data-binary @"$TMP/long.json" "$URL/v1/completions"
head -c $((9 << 20)) /dev/zero | tr '\0' ' ' >"$TMP/big.txt"
expect "body over the limit: 413" 413 'max-body' "${J[@]}" --data-binary @"$TMP/big.txt" "$URL/v1/completions"
expect "chunked body over the limit: 413" 413 'max-body' "${J[@]}" -H 'Transfer-Encoding: chunked' \
    --data-binary @"$TMP/big.txt" "$URL/v1/completions"
expect "unknown route: 404" 404 'Invalid URL' "$URL/v1/embeddings"
# /v1/messages: errors in Anthropic's shape ({"type":"error","error":{"type":...,"message":...}}).
AE='"type":"error","error":{"type":"invalid_request_error","message":'
M='"messages":[{"role":"user","content":"Hi"}]'
expect "messages: max_tokens missing: 400" 400 "$AE\"max_tokens: Field required\"" "${J[@]}" \
    -d "{\"model\":\"m\",$M}" "$URL/v1/messages"
expect "messages: malformed JSON: 400" 400 "$AE\"invalid JSON" "${J[@]}" -d '{"messages": [' "$URL/v1/messages"
expect "messages: role system in messages: 400" 400 "$AE.*top-level 'system' field" "${J[@]}" \
    -d '{"model":"m","max_tokens":4,"messages":[{"role":"system","content":"x"},{"role":"user","content":"Hi"}]}' "$URL/v1/messages"
expect "messages: unknown role: 400" 400 "$AE\"messages\[0\].role 'tool' is not supported" "${J[@]}" \
    -d '{"model":"m","max_tokens":4,"messages":[{"role":"tool","content":"x"}]}' "$URL/v1/messages"
expect "messages: a final assistant message (prefill): 400" 400 "$AE.*prefill" "${J[@]}" \
    -d "{\"model\":\"m\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hel\"}]}" "$URL/v1/messages"
expect "messages: a tool_use block: 400" 400 "$AE.*'tool_use' are not supported" "${J[@]}" \
    -d '{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}' "$URL/v1/messages"
expect "messages: temperature above 1: 400" 400 "$AE\"'temperature' must be between 0 and 1" "${J[@]}" \
    -d "{\"model\":\"m\",\"max_tokens\":4,\"temperature\":1.5,$M}" "$URL/v1/messages"
expect "messages: stop_sequences not an array: 400" 400 "$AE\"stop_sequences: must be an array" "${J[@]}" \
    -d "{\"model\":\"m\",\"max_tokens\":4,\"stop_sequences\":\"x\",$M}" "$URL/v1/messages"
$PY -c 'import json; print(json.dumps({"model": "m", "messages": [{"role": "user", "content": "river " * 3000}]}))' >"$TMP/long_msg.json"
expect "count_tokens: a prompt longer than the context is counted" 200 '^{"input_tokens":30[0-9][0-9]}$' "${J[@]}" \
    --data-binary @"$TMP/long_msg.json" "$URL/v1/messages/count_tokens"
expect "count_tokens: no messages: 400 in Anthropic's shape" 400 "$AE\"messages: must be a non-empty array" "${J[@]}" \
    -d '{"model":"m"}' "$URL/v1/messages/count_tokens"
expect "messages: wrong method: 405 in Anthropic's shape" 405 '"type":"error","error":{"type":"invalid_request_error"' "$URL/v1/messages"
expect "messages: body over the limit: 413 request_too_large" 413 '"type":"request_too_large"' "${J[@]}" \
    --data-binary @"$TMP/big.txt" "$URL/v1/messages"
expect "messages: thinking blocks of earlier turns are skipped" 200 '"type":"message"' "${J[@]}" \
    -d '{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Hello"}]},{"role":"user","content":"Again"}]}' "$URL/v1/messages"
curl -sN "${J[@]}" -d "{\"model\":\"m\",\"max_tokens\":3,\"stream\":true,$M}" "$URL/v1/messages" >"$TMP/msg.sse"
if [ "$(head -n 1 "$TMP/msg.sse")" = "event: message_start" ] && grep -q '^data: {"type":"message_start","message":{"id":"msg_' "$TMP/msg.sse" &&
    [ "$(grep -c '^event: ' "$TMP/msg.sse")" = "$(grep -c '^data: ' "$TMP/msg.sse")" ] &&
    [ "$(tail -n 3 "$TMP/msg.sse" | head -n 2 | tr '\n' ' ')" = 'event: message_stop data: {"type":"message_stop"} ' ] &&
    ! grep -q DONE "$TMP/msg.sse"; then
    ok "messages SSE: event: NAME / data: JSON pairs, message_start to message_stop"
else
    bad "messages SSE: $(head -c 400 "$TMP/msg.sse")"
fi
# ---- issue 29: /tokenize, /detokenize, the context in /v1/models, logit_bias, logprobs: every
# bad field a 400 naming it (the working cases on the trained model, further down)
expect "/v1/models: max_model_len (--ctx-size)" 200 '"max_model_len":1024,"meta":{"n_ctx":1024,' "$URL/v1/models"
expect "/tokenize" 200 '^{"tokens":\[[0-9,]*\]}$' "${J[@]}" -d '{"content":"The river","add_special":true}' "$URL/tokenize"
expect "/detokenize" 200 '^{"content":"The river"}$' "${J[@]}" -d '{"tokens":[785,14796]}' "$URL/detokenize"
expect "/tokenize: malformed JSON: 400" 400 '"type":"invalid_request_error"' "${J[@]}" -d '{"content":' "$URL/tokenize"
expect "/tokenize: content not a string: 400" 400 '"param":"content"' "${J[@]}" -d '{"content":[1]}' "$URL/tokenize"
expect "/tokenize: no content: 400" 400 '"param":"content"' "${J[@]}" -d '{}' "$URL/tokenize"
expect "/tokenize: add_special not a boolean: 400" 400 '"param":"add_special"' "${J[@]}" -d '{"content":"x","add_special":1}' "$URL/tokenize"
expect "/tokenize: body not an object: 400" 400 'JSON object' "${J[@]}" -d '[1]' "$URL/tokenize"
expect "/tokenize: GET: 405" 405 'method not allowed' "$URL/tokenize"
expect "/detokenize: tokens not an array: 400" 400 '"param":"tokens"' "${J[@]}" -d '{"tokens":"1 2"}' "$URL/detokenize"
expect "/detokenize: an id past the vocabulary: 400" 400 'tokens\[1\] must be a token id in \[0, ' "${J[@]}" -d '{"tokens":[1,999999]}' "$URL/detokenize"
expect "/detokenize: a negative id: 400" 400 '"param":"tokens"' "${J[@]}" -d '{"tokens":[-1]}' "$URL/detokenize"
expect "/detokenize: a non-integer id: 400" 400 '"param":"tokens"' "${J[@]}" -d '{"tokens":[1.5]}' "$URL/detokenize"
for b in '{"x":1}' '{"1.5":1}' '{"999999":1}' '{"-3":1}' '{"5":100.5}' '{"5":-101}' '{"5":"1"}' '[1]'; do
    expect "logit_bias $b: 400" 400 '"param":"logit_bias"' "${J[@]}" -d "{\"prompt\":\"x\",\"logit_bias\":$b}" "$URL/v1/completions"
done
# A message that quotes the request, cut by its length limit inside a character: still a 400
# (its JSON once failed to build, and the answer was a 500 "out of memory").
expect "logit_bias with a long non-ASCII key: 400" 400 '"param":"logit_bias"' "${J[@]}" \
    -d "{\"prompt\":\"x\",\"logit_bias\":{\"$(printf '中%.0s' $(seq 20))\":1}}" "$URL/v1/completions"
expect "a long non-ASCII role: 400" 400 '"param":"messages"' "${J[@]}" \
    -d "{\"messages\":[{\"role\":\"$(printf '中%.0s' $(seq 300))\",\"content\":\"x\"}]}" "$URL/v1/chat/completions"
expect "logit_bias on chat: 400 too" 400 '"param":"logit_bias"' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":200}}' "$URL/v1/chat/completions"
# response_format: JSON by constrained decoding (tests/server/api_check.py checks the documents
# on a trained model); a schema the constraint cannot honour is a 400 naming the keyword.
for f in '"json"' '{}' '{"type":"xml"}' '{"type":"json_schema"}' \
         '{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"a"}}}' \
         '{"type":"json_schema","json_schema":{"name":"x","schema":{"$ref":"#/$defs/a"}}}' \
         '{"type":"json_schema","json_schema":{"name":"x","schema":{"anyOf":[{}]}}}' \
         '{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"strin"}}}'; do
    expect "response_format $f: 400" 400 '"param":"response_format"' "${J[@]}" \
        -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":$f}" "$URL/v1/chat/completions"
done
expect "response_format with pattern: 400 naming it" 400 "keyword 'pattern' is not supported" "${J[@]}" \
    -d '{"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"a"}}}}' "$URL/v1/completions"
expect "response_format json_object with ignore_eos: 400" 400 '"param":"ignore_eos"' "${J[@]}" \
    -d '{"prompt":"x","ignore_eos":true,"response_format":{"type":"json_object"}}' "$URL/v1/completions"
expect "response_format json_object: 200" 200 '"text":"' "${J[@]}" \
    -d '{"prompt":"x","max_tokens":6,"response_format":{"type":"json_object"}}' "$URL/v1/completions"
expect "response_format json_schema: 200" 200 '"content":"' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":6,"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}}}}' "$URL/v1/chat/completions"
expect "response_format text: 200" 200 '"choices"' "${J[@]}" \
    -d '{"prompt":"x","max_tokens":2,"response_format":{"type":"text"}}' "$URL/v1/completions"
# Tools (ChatML). The tiny model cannot call tools: the request's prompt is what is checked
# (as many ids as Qwen3's template rendering of the same conversation, from
# tests/unit/data/qwen3_tools.json, which test_template.c compares byte for byte), and every
# malformed field is a 400.
$PY - "$HERE/../unit/data/qwen3_tools.json" "$TMP" <<'PYEOF'
import json, sys
c = [c for c in json.load(open(sys.argv[1])) if c["name"] == "calls_results_no_system"][0]
with open(sys.argv[2] + "/tools_req.json", "w") as f:
    json.dump({"messages": c["messages"], "tools": c["tools"], "max_tokens": 1}, f)
with open(sys.argv[2] + "/tools_tok.json", "w") as f:
    json.dump({"content": c["expected"], "parse_special": True}, f)
# The same conversation in the Anthropic shapes: tools {name, description, input_schema}, the
# calls as tool_use blocks, the results as tool_result blocks of one user message.
msgs = []
for m in c["messages"]:
    if m["role"] == "assistant":
        msgs.append({"role": "assistant", "content": ([{"type": "text", "text": m["content"]}] if m["content"] else []) + [
            {"type": "tool_use", "id": t["id"], "name": t["function"]["name"],
             "input": json.loads(t["function"]["arguments"])} for t in m["tool_calls"]]})
    elif m["role"] == "tool":
        b = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
        if msgs[-1]["role"] == "user" and isinstance(msgs[-1]["content"], list):
            msgs[-1]["content"].append(b)
        else:
            msgs.append({"role": "user", "content": [b]})
    else:
        msgs.append(m)
tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in c["tools"]]
with open(sys.argv[2] + "/tools_msg.json", "w") as f:
    json.dump({"model": "m", "messages": msgs, "tools": tools, "max_tokens": 1}, f)
PYEOF
got=$(curl -s "${J[@]}" -d @"$TMP/tools_req.json" "$URL/v1/chat/completions" |
    $PY -c 'import json, sys; print(json.load(sys.stdin)["usage"]["prompt_tokens"])' 2>&1)
want=$(curl -s "${J[@]}" -d @"$TMP/tools_tok.json" "$URL/tokenize" |
    $PY -c 'import json, sys; print(len(json.load(sys.stdin)["tokens"]))' 2>&1)
[ -n "$got" ] && [ "$got" = "$want" ] && ok "tools: the prompt is Qwen3's rendering ($got tokens)" ||
    bad "tools: prompt_tokens $got, the template's rendering $want"
got=$(curl -s "${J[@]}" -d @"$TMP/tools_msg.json" "$URL/v1/messages" |
    $PY -c 'import json, sys; print(json.load(sys.stdin)["usage"]["input_tokens"])' 2>&1)
[ -n "$got" ] && [ "$got" = "$want" ] && ok "messages with tools: the same prompt as the OpenAI route ($got tokens)" ||
    bad "messages with tools: input_tokens $got, the template's rendering $want"
MT='"model":"m","max_tokens":2,"messages":[{"role":"user","content":"x"}]'
for b in '"tools":{}' '"tools":[{"name":"a b","input_schema":{}}]' '"tools":[{"name":"a"}]' \
    '"tools":[{"name":"a","input_schema":{},"description":3}]' '"tools":[{"type":"web_search_20250305","name":"web_search"}]' \
    '"tool_choice":{"type":"any"}' '"tool_choice":{"type":"tool","name":"a"}' '"tool_choice":"auto"' \
    '"tool_choice":{"type":"auto","disable_parallel_tool_use":1}'; do
    expect "messages: $b: 400" 400 "$AE" "${J[@]}" -d "{$MT,$b}" "$URL/v1/messages"
done
for m in '{"role":"user","content":[{"type":"tool_result","content":"r"}]}' \
    '{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":5}]}' \
    '{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":"yes"}]}' \
    '{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image"}]}]}' \
    '{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[]}]},{"role":"user","content":"x"}' \
    '{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]},{"role":"user","content":"x"}' \
    '{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f\"","input":{}}]},{"role":"user","content":"x"}'; do
    expect "messages: $m: 400" 400 "$AE" "${J[@]}" -d "{\"model\":\"m\",\"max_tokens\":2,\"messages\":[$m]}" "$URL/v1/messages"
done
TU='"messages":[{"role":"user","content":"x"}],"max_tokens":2'
TF='{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}'
for b in '"tools":{}' '"tools":[{"type":"x"}]' '"tools":[{"type":"function"}]' \
    '"tools":[{"type":"function","function":{"name":"a b"}}]' \
    '"tools":[{"type":"function","function":{"name":"a","description":3}}]' \
    '"tools":[{"type":"function","function":{"name":"a","parameters":[]}}]'; do
    expect "tools $b: 400" 400 '"param":"tools"' "${J[@]}" -d "{$TU,$b}" "$URL/v1/chat/completions"
done
for b in '"required"' '{"type":"function","function":{"name":"get_weather"}}' 3; do
    expect "tool_choice $b: 400" 400 '"param":"tool_choice"' "${J[@]}" -d "{$TU,\"tools\":[$TF],\"tool_choice\":$b}" \
        "$URL/v1/chat/completions"
done
expect "tools, stream: 200" 200 '"finish_reason":"length"' "${J[@]}" \
    -d "{$TU,\"tools\":[$TF],\"stream\":true}" "$URL/v1/chat/completions"
# A reply that opens calls and never closes them ("<tool_call>" forced by logit_bias): the
# stream holds it back from the first "<tool_call>" and, at the end, sends it as the text it
# is, the same content as the answer not streamed.
TB="$TU,\"temperature\":0,\"max_tokens\":3,\"logit_bias\":{\"151657\":100},\"tools\":[$TF]"
whole=$(curl -s "${J[@]}" -d "{$TB}" "$URL/v1/chat/completions" |
    $PY -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' 2>&1)
streamed=$(curl -sN "${J[@]}" -d "{$TB,\"stream\":true}" "$URL/v1/chat/completions" | $PY -c '
import json, sys
ev = [json.loads(l[6:]) for l in sys.stdin if l.startswith("data: {")]
print("".join(e["choices"][0]["delta"].get("content") or "" for e in ev), ev[-1]["choices"][0]["finish_reason"])' 2>&1)
[ "$whole" = "<tool_call><tool_call><tool_call>" ] && [ "$streamed" = "$whole length" ] &&
    ok "tools, stream: unfinished calls come back as text" || bad "tools, stream: '$streamed' vs '$whole'"
expect "tools, tool_choice none, stream: 200" 200 '\[DONE\]' "${J[@]}" \
    -d "{$TU,\"tools\":[$TF],\"tool_choice\":\"none\",\"stream\":true}" "$URL/v1/chat/completions"
expect "tools, tool_choice auto: 200" 200 '"finish_reason":"length"' "${J[@]}" \
    -d "{$TU,\"tools\":[$TF],\"tool_choice\":\"auto\"}" "$URL/v1/chat/completions"
expect "tools on /v1/completions: 400" 400 '"param":"tools"' "${J[@]}" \
    -d "{\"prompt\":\"x\",\"tools\":[$TF]}" "$URL/v1/completions"
for m in '{"role":"tool","content":"r","tool_call_id":3}' '{"role":"tool"}' \
    '{"role":"assistant","tool_calls":{}}' '{"role":"assistant","tool_calls":[{"type":"x","function":{"name":"a","arguments":"{}"}}]}' \
    '{"role":"assistant","tool_calls":[{"function":{"name":"a\"","arguments":"{}"}}]}' \
    '{"role":"assistant","tool_calls":[{"function":{"name":"a","arguments":5}}]}'; do
    expect "message $m: 400" 400 '"param":"messages"' "${J[@]}" \
        -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},$m],\"max_tokens\":2}" "$URL/v1/chat/completions"
done
expect "top_logprobs 21: 400" 400 "'top_logprobs' must be between 0 and 20" "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}' "$URL/v1/chat/completions"
expect "top_logprobs without logprobs: 400" 400 '"param":"top_logprobs"' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}' "$URL/v1/chat/completions"
expect "chat logprobs not a boolean: 400" 400 '"param":"logprobs"' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"logprobs":3}' "$URL/v1/chat/completions"
expect "completions logprobs 21: 400" 400 "'logprobs' must be between 0 and 20" "${J[@]}" \
    -d '{"prompt":"x","logprobs":21}' "$URL/v1/completions"
expect "completions logprobs true (an integer is wanted): 400" 400 '"param":"logprobs"' "${J[@]}" \
    -d '{"prompt":"x","logprobs":true}' "$URL/v1/completions"
expect "wrong method: 405" 405 'method not allowed' -X DELETE "$URL/v1/models"
expect "non-streaming completion with curl" 200 '"finish_reason":"length"' "${J[@]}" \
    -d '{"prompt":"The river","max_tokens":3,"temperature":0}' "$URL/v1/completions"
# echo: the prompt's text (as given, or its ids' text) before the reply, streamed (a first chunk
# of it) or not; with logprobs a 400 (the prompt's are not computed), on chat a 400
plain=$($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$TMP/body")
echoed=$(curl -s "${J[@]}" -d '{"prompt":"The river","max_tokens":3,"temperature":0,"echo":true}' "$URL/v1/completions" |
    $PY -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>&1)
ids=$(curl -s "${J[@]}" -d '{"prompt":[785,14796],"max_tokens":3,"temperature":0,"echo":true}' "$URL/v1/completions" |
    $PY -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>&1)
streamed=$(curl -sN "${J[@]}" -d '{"prompt":"The river","max_tokens":3,"temperature":0,"echo":true,"stream":true}' \
    "$URL/v1/completions" | $PY -c '
import json, sys
ev = [json.loads(l[6:]) for l in sys.stdin if l.startswith("data: {")]
print(ev[0]["choices"][0]["text"] + "|" + "".join(e["choices"][0]["text"] for e in ev[1:]))' 2>&1)
if [ "$echoed" = "The river$plain" ] && [ "$ids" = "$echoed" ] && [ "$streamed" = "The river|$plain" ]; then
    ok "completions echo: the prompt's text first, streamed or not, from text or ids"
else
    bad "echo: '$echoed' / '$ids' / '$streamed' (reply '$plain')"
fi
expect "echo with logprobs: 400" 400 "prompt's log-probabilities are not computed.*\"param\":\"echo\"" "${J[@]}" \
    -d '{"prompt":"x","echo":true,"logprobs":2}' "$URL/v1/completions"
expect "echo on chat: 400" 400 "only supported by /v1/completions" "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"echo":true}' "$URL/v1/chat/completions"
expect "echo not a boolean: 400" 400 '"param":"echo"' "${J[@]}" -d '{"prompt":"x","echo":1}' "$URL/v1/completions"
curl -sN "${J[@]}" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0,"stream":true}' \
    "$URL/v1/chat/completions" >"$TMP/sse"
if grep -q '^data: {"id":"chatcmpl-' "$TMP/sse" && [ "$(tail -n 2 "$TMP/sse" | head -n 1)" = "data: [DONE]" ]; then
    ok "SSE stream ends with data: [DONE]"
else
    bad "SSE stream: $(tail -c 300 "$TMP/sse")"
fi
if curl -s "$URL/metrics" | grep -q '^sluice_http_requests_total{code="400"} [1-9]' &&
    curl -s "$URL/metrics" | grep -q '^sluice_expert_hit_ratio ' &&
    curl -s "$URL/metrics" | grep -q '^sluice_queue_length 0'; then
    ok "GET /metrics (Prometheus text)"
else
    bad "metrics: $(curl -s "$URL/metrics" | head -c 400)"
fi
# Latency histograms: a first token per reply, the gaps between the others; +Inf holds them all.
T1=$(metric sluice_time_to_first_token_seconds_count)
TI=$(metric sluice_inter_token_latency_seconds_count)
TIN=$(metric 'sluice_inter_token_latency_seconds_bucket{le="+Inf"}')
if [ "${T1:-0}" -ge 1 ] && [ "${TI:-0}" -ge "${T1:-0}" ] && [ "$TIN" = "$TI" ] &&
    awk -v s="$(metric sluice_time_to_first_token_seconds_sum)" 'BEGIN {exit !(s > 0)}'; then
    ok "metrics: time to first token ($T1) and inter-token latency ($TI) histograms"
else
    bad "latency histograms: ttft count '$T1', itl count '$TI', +Inf '$TIN'"
fi
# A list of prompts: one is a prompt, more are refused naming the field (n=1 per request).
expect "prompt: a list of one string" 200 '"object":"text_completion"' "${J[@]}" \
    -d '{"prompt":["The river"],"max_tokens":2}' "$URL/v1/completions"
expect "prompt: a list of one token-id list" 200 '"prompt_tokens":3,' "${J[@]}" \
    -d '{"prompt":[[1,2,3]],"max_tokens":2}' "$URL/v1/completions"
expect "prompt: a list of 3 strings: 400" 400 'a list of 3 prompts is not supported; send one prompt per request.*"param":"prompt"' \
    "${J[@]}" -d '{"prompt":["a","b","c"],"max_tokens":2}' "$URL/v1/completions"
expect "prompt: a list of 2 token-id lists: 400" 400 'a list of 2 prompts is not supported.*"param":"prompt"' \
    "${J[@]}" -d '{"prompt":[[1,2],[3]],"max_tokens":2}' "$URL/v1/completions"
# Response ids never repeat across restarts: the first ids of two servers started at once.
# Ids made of the start second and a counter would repeat within a second, and differ only in
# the second's digits otherwise: so no 8 of the first 16 hex digits (64 random bits) may agree
# at the same place.
first_id() {
    curl -s "${J[@]}" -d '{"prompt":"x","max_tokens":1}' "$1/v1/completions" | grep -o '"id":"[^"]*"'
}
ids=()
for k in 1 2; do
    "$BIN" serve "$TMP/tq" --chat-template chatml --port 0 -t 1 >/dev/null 2>"$TMP/ids$k.err" &
    PIDS+=("$!")
done
for k in 1 2; do
    for _ in $(seq 100); do grep -q "listening on" "$TMP/ids$k.err" && break; sleep 0.1; done
    ids+=("$(first_id "$(grep -o 'http://[0-9.:]*' "$TMP/ids$k.err" | head -n 1)")")
done
stop "${PIDS[-1]}"
stop "${PIDS[-2]}"
a=${ids[0]#*cmpl-} b=${ids[1]#*cmpl-} same=0
for i in $(seq 0 8); do [ "${a:i:8}" = "${b:i:8}" ] && same=1; done
if [[ ${ids[0]} =~ ^\"id\":\"cmpl-[0-9a-f]{17,}\"$ ]] && [ -n "${ids[1]}" ] && [ $same = 0 ]; then
    ok "response ids differ across restarts (${ids[0]}, ${ids[1]})"
else
    bad "response ids across restarts: '${ids[0]}' '${ids[1]}'"
fi

# ---- a client that goes away cancels its generation: a stream at its next write, a
# non-streaming request when the connection is reset (sampling 100,000 tokens from the full
# 152k vocabulary at temperature 1 takes minutes)
before=$(metric 'sluice_completions_total{finish_reason="cancelled"}')
node "$HERE/client.mjs" abort "$URL/v1" >"$TMP/abort.log" 2>&1 || bad "abort client: $(cat "$TMP/abort.log")"
$PY "$HERE/raw_client.py" reset "$port" 0.3 >/dev/null
sleep 0.5
after=$(metric 'sluice_completions_total{finish_reason="cancelled"}')
if [ "$((after - before))" -eq 2 ] && [ "$(metric sluice_requests_running)" = 0 ]; then
    ok "disconnects (a dropped stream, a reset) cancel the generation"
else
    bad "cancel on disconnect: cancelled $before -> $after, running $(metric sluice_requests_running)"
fi
# ... but a client that half-closes its socket after the request (shutdown(SHUT_WR)) has not
# gone: it reads the whole answer.
raw halfclose "$port" plain
raw halfclose "$port" stream

# ---- load: 200 requests, 8 at a time, no failures, no memory growth
node "$HERE/client.mjs" load "$URL/v1" 60 8 >"$TMP/warm.log" 2>&1 || bad "warm-up: $(cat "$TMP/warm.log")"
rss0=$(rss_kb "$PID")
node "$HERE/client.mjs" load "$URL/v1" 200 8 >"$TMP/load.log" 2>&1
cat "$TMP/load.log"
grep -q '^ok' "$TMP/load.log" && ok "load test" || bad "load test"
rss1=$(rss_kb "$PID")
# A connection thread may get a new malloc arena in any window: a one-time step of a MB or
# two (2.4 MB seen once in a make test run). A leak grows every window, so growth is checked
# again over a second window of 200 requests and must show in both to fail.
if [ "$((rss1 - rss0))" -ge 2048 ]; then
    node "$HERE/client.mjs" load "$URL/v1" 200 8 >"$TMP/load2.log" 2>&1
    rss2=$(rss_kb "$PID")
else
    rss2=$rss1
fi
if [ "$((rss1 - rss0))" -lt 2048 ] || [ "$((rss2 - rss1))" -lt 2048 ]; then
    ok "no memory growth over 200 requests (RSS $rss0 -> $rss1 -> $rss2 kB)"
else
    bad "memory growth: RSS $rss0 -> $rss1 -> $rss2 kB"
fi
# 32 clients at once with the default --parallel 4: the others wait for a place (--queue).
node "$HERE/client.mjs" load "$URL/v1" 64 32 >"$TMP/load32.log" 2>&1
grep -q '^ok' "$TMP/load32.log" && ok "32 clients at once, default options: $(cut -c6- "$TMP/load32.log")" ||
    bad "32 at once: $(head -c 400 "$TMP/load32.log")"
# A stream whose text is slow to come gets ': keep-alive' comments every 2 s (so that a client
# that closed is noticed while it waits); curl shows them. Here the text is held back for a stop
# string of 4,000 bytes while 150 tokens are sampled over the 151,936 ids of the tiny model's
# flat distribution (tens of ms each). The official client, streaming beside it, reads its own.
STOP=$(printf 'z%.0s' $(seq 4000))
curl -sN "${J[@]}" -d '{"prompt":"x","max_tokens":150,"temperature":1,"ignore_eos":true,"stream":true,"stop":"'"$STOP"'"}' \
    "$URL/v1/completions" >"$TMP/hb.sse" &
HB=$!
node "$HERE/client.mjs" stream "$URL/v1" >"$TMP/hb.log" 2>&1 &
NODE=$!
wait "$HB" "$NODE"
if grep -q '^: keep-alive$' "$TMP/hb.sse" && [ "$(tail -n 2 "$TMP/hb.sse" | head -n 1)" = "data: [DONE]" ] &&
    grep -q '^ok' "$TMP/hb.log"; then
    ok "a stream whose text is held back gets ': keep-alive' comments; the openai client streams beside it"
else
    bad "keep-alive comments: $(head -c 300 "$TMP/hb.sse") / $(cat "$TMP/hb.log")"
fi
expect "still healthy after all that" 200 '"status":"ok"' "$URL/health"

# ---- SIGTERM: the request in flight finishes, new connections are refused, exit 0
curl -sN "${J[@]}" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":600,"temperature":0,"ignore_eos":true,"stream":true}' \
    "$URL/v1/chat/completions" >"$TMP/term.sse" &
CURL=$!
for _ in $(seq 50); do [ -s "$TMP/term.sse" ] && break; sleep 0.05; done
kill -TERM "$MAIN"
sleep 0.2
if curl -s -m 2 "$URL/health" >/dev/null; then bad "new connections refused while stopping"; else ok "new connections refused while stopping"; fi
wait "$CURL"
wait "$MAIN"
rc=$?
if [ $rc -eq 0 ] && grep -q '"finish_reason":"length"' "$TMP/term.sse" && [ "$(tail -n 2 "$TMP/term.sse" | head -n 1)" = "data: [DONE]" ] &&
    grep -q "sluice serve: stopped" "$TMP/main.err"; then
    ok "SIGTERM finishes the request in flight, then exits 0"
else
    bad "SIGTERM: rc $rc, stream end $(tail -c 200 "$TMP/term.sse"), log $(tail -n 3 "$TMP/main.err")"
fi

# ---- issue 29 on the trained demo model, where greedy choices mean something: /tokenize and
# /detokenize round-trip, logprobs (greedy token on top, sums, streamed = whole), logit_bias
MODEL_DIR="$HERE/../../models/kjv-moe" start kjv -c 256 || exit 1
$PY "$HERE/api_check.py" "$URL" 256 >"$TMP/api_check.log" 2>&1
cat "$TMP/api_check.log"
pass=$((pass + $(grep -c '^ok' "$TMP/api_check.log")))
fail=$((fail + $(grep -c '^FAIL' "$TMP/api_check.log")))
grep -q "^ok" "$TMP/api_check.log" || bad "api_check.py produced nothing"
stop "$PID"

# ---- a reply that reaches the end of the context ends with finish_reason "length", having
# used every position the prompt left (-c: llama.cpp's name for --ctx-size)
start small -c 48 --api-key cmdl1ne-k3y || exit 1
if tr '\0' ' ' <"/proc/$PID/cmdline" | grep -q cmdl1ne-k3y; then
    bad "--api-key still shows in /proc/PID/cmdline (ps)"
else
    ok "--api-key is blanked out of /proc/PID/cmdline (ps)"
fi
expect "reply to the end of the context: finish_reason length" 200 '"finish_reason":"length"' "${J[@]}" \
    -H 'Authorization: Bearer cmdl1ne-k3y' -d '{"messages":[{"role":"user","content":"Hi"}],"temperature":0,"ignore_eos":true}' "$URL/v1/chat/completions"
if $PY -c 'import json,sys; u=json.load(open(sys.argv[1]))["usage"]; sys.exit(u["total_tokens"] != 48)' "$TMP/body"; then
    ok "the reply filled the context (48 tokens in all)"
else
    bad "context end usage: $(head -c 400 "$TMP/body")"
fi
stop "$PID"

# ---- slow clients and a soak: connections that trickle their headers or say nothing are
# closed after --header-timeout while everything else is answered, and one address cannot
# hold more than --max-connections-per-ip (64)
start slow --header-timeout 2 --max-body 1M --shutdown-timeout 1 || exit 1
port=${URL##*:}
raw perip "$port" 64
# The soak (tools/lab/soak_server.py): valid requests of every kind with bursts of 24, dropped
# streams, resets, malformed and oversized bodies, foreign Hosts, and 8 connections at a time
# trickling headers or silent. No valid request may fail, no hostile one be answered wrongly.
$PY "$HERE/../../tools/lab/soak_server.py" --url "$URL" --pid "$PID" --duration "${SOAK_S:-15}" \
    --slow 8 --burst-every 5 --header-timeout 2 --max-body 1M >"$TMP/soak.log" 2>&1
soak_rc=$?
sed 's/^/    /' "$TMP/soak.log"
[ $soak_rc -eq 0 ] && ok "soak: $(tail -n 1 "$TMP/soak.log" | cut -c7-)" || bad "soak: $(tail -n 1 "$TMP/soak.log")"
if [ "$(metric sluice_connections_cut_total)" -ge 8 ]; then
    ok "slow connections cut: $(metric sluice_connections_cut_total) (sluice_connections_cut_total)"
else
    bad "connections cut: $(metric sluice_connections_cut_total)"
fi
# SIGTERM with requests that would run for minutes: they are cancelled after --shutdown-timeout
# (the stream ends with an error event, the other gets 503) and the server exits 0.
curl -sN "${J[@]}" -d '{"prompt":"x","max_tokens":100000,"temperature":1,"ignore_eos":true,"stream":true}' \
    "$URL/v1/completions" >"$TMP/hang.sse" &
C1=$!
curl -s "${J[@]}" -d '{"prompt":"x","max_tokens":100000,"temperature":1,"ignore_eos":true}' "$URL/v1/completions" >"$TMP/hang.json" &
C2=$!
for _ in $(seq 50); do [ -s "$TMP/hang.sse" ] && break; sleep 0.05; done
t0=$(date +%s%N)
kill -TERM "$PID"
wait "$PID"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
wait "$C1" "$C2"
if [ $rc -eq 0 ] && [ $ms -lt 4000 ] && grep -q '"code":"shutting_down"' "$TMP/hang.sse" &&
    [ "$(tail -n 2 "$TMP/hang.sse" | head -n 1)" = "data: [DONE]" ] && grep -q '"code":"shutting_down"' "$TMP/hang.json"; then
    ok "SIGTERM with requests hanging: cancelled after --shutdown-timeout 1, exit 0 in $ms ms"
else
    bad "SIGTERM bound: rc $rc in $ms ms, stream $(tail -c 200 "$TMP/hang.sse"), other $(cat "$TMP/hang.json")"
fi

# ---- a forward that fails answers 500 with the library's message, and leaves nothing of
# itself in the KV prefix cache. The server runs under the fault shim of tests/fault, which
# flips a byte in the first expert read of layer 1 (a corrupt copy of an intact file, caught by
# the pack's checksums: the issue's case); later an expert file is cut short under it (a
# failed read). After each, the same request computes everything again (nothing cached) and
# gets the same text.
"$BIN" pack "$TMP/tq" "$TMP/tqp" >/dev/null 2>&1 && cp "$TMP/tq/tokenizer.json" "$TMP/tqp/" || bad "pack"
cc -std=c11 -O2 -fPIC -shared "$HERE/../fault/shim.c" -o "$TMP/shim.so" -ldl 2>"$TMP/shim.err" ||
    bad "building tests/fault/shim.c: $(cat "$TMP/shim.err")"
LD_PRELOAD="$TMP/shim.so" SLUICE_FAULT_FILE=experts-001 SLUICE_FAULT=flip SLUICE_FAULT_AFTER=1 \
    SLUICE_FAULT_COUNT=1 MODEL_DIR=$TMP/tqp start fault --experts stream --cache-experts 2 -c 40000 \
    --shutdown-timeout 1 || exit 1
R='{"prompt":"The river flows into the","max_tokens":16,"temperature":0}'
# same_text A B: the same text, B computed from scratch
same_text() {
    $PY - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
sys.exit(not (a["choices"][0]["text"] and a["choices"][0]["text"] == b["choices"][0]["text"]
              and b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0))
PY
}
expect "a corrupt read (checksum): 500 with the message" 500 '"type":"server_error"' "${J[@]}" -d "$R" "$URL/v1/completions"
curl -s "${J[@]}" -d "$R" "$URL/v1/completions" >"$TMP/ref.json"
cp "$TMP/tqp/experts-000.bin" "$TMP/e0" && cp "$TMP/tqp/experts-001.bin" "$TMP/e1"
truncate -s 4096 "$TMP/tqp/experts-000.bin" "$TMP/tqp/experts-001.bin"
expect "a failed read: 500 with the message" 500 '"type":"server_error"' "${J[@]}" -d "$R" "$URL/v1/completions"
curl -sN "${J[@]}" -d '{"prompt":"Once upon a time","max_tokens":16,"temperature":0,"stream":true}' "$URL/v1/completions" >"$TMP/fault.sse"
if grep -q '^data: {"error":{"message":"[^"]' "$TMP/fault.sse" && [ "$(tail -n 2 "$TMP/fault.sse" | head -n 1)" = "data: [DONE]" ]; then
    ok "a failed read while streaming: an error event, then [DONE]"
else
    bad "failed read while streaming: $(tail -c 300 "$TMP/fault.sse")"
fi
curl -sN "${J[@]}" -d '{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Once"}]}' "$URL/v1/messages" >"$TMP/fault_msg.sse"
if [ "$(tail -n 3 "$TMP/fault_msg.sse" | head -n 1)" = "event: error" ] &&
    grep -q '^data: {"type":"error","error":{"type":"api_error","message":"[^"]' "$TMP/fault_msg.sse"; then
    ok "a failed read while streaming /v1/messages: an error event (api_error)"
else
    bad "failed read while streaming /v1/messages: $(tail -c 300 "$TMP/fault_msg.sse")"
fi
cp "$TMP/e0" "$TMP/tqp/experts-000.bin" && cp "$TMP/e1" "$TMP/tqp/experts-001.bin"
curl -s "${J[@]}" -d "$R" "$URL/v1/completions" >"$TMP/after.json"
if same_text "$TMP/ref.json" "$TMP/after.json" && $PY -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["usage"]["prompt_tokens_details"]["cached_tokens"] != 0)' "$TMP/ref.json"; then
    ok "after each failed forward the prefix cache is empty and the text the same"
else
    bad "after a failed forward: $(head -c 300 "$TMP/ref.json") then $(head -c 300 "$TMP/after.json")"
fi
[ "$(metric sluice_generation_errors_total)" = 4 ] && ok "sluice_generation_errors_total 4" || bad "generation errors: $(metric sluice_generation_errors_total)"
# SIGTERM while the worker is inside one long forward (a 39,000-token prefill takes far longer
# than the bound, like a hung read): the process does not wait for it.
$PY -c 'import json; print(json.dumps({"prompt": [(i * 7919) % 150000 for i in range(39000)], "max_tokens": 1}))' >"$TMP/huge.json"
curl -s "${J[@]}" --data-binary @"$TMP/huge.json" "$URL/v1/completions" >"$TMP/huge.out" &
C1=$!
sleep 0.5
t0=$(date +%s%N)
kill -TERM "$PID"
wait "$PID"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
wait "$C1"
if [ $rc -eq 1 ] && [ $ms -lt 5500 ] && grep -q "did not come back from its forward" "$TMP/fault.err" &&
    grep -q '"code":"shutting_down"' "$TMP/huge.out"; then
    ok "SIGTERM with the model stuck in a forward: exit in $ms ms without waiting for it"
else
    bad "SIGTERM with a stuck forward: rc $rc in $ms ms, answer $(head -c 200 "$TMP/huge.out"), log $(tail -n 3 "$TMP/fault.err")"
fi

# ---- --api-key-file, --cors, --parallel and --queue (503 when both are full)
printf 's3cret\r\n' >"$TMP/key"
start keyed --api-key-file "$TMP/key" --parallel 1 --queue 1 --queue-timeout 1 \
    --cors http://localhost:3000 --cors http://127.0.0.1:5173 || exit 1
K=(-H 'Authorization: Bearer s3cret')
expect "no key: 401" 401 'invalid_api_key' "${J[@]}" -d '{"prompt":"x","max_tokens":1}' "$URL/v1/completions"
expect "wrong key: 401" 401 'invalid_api_key' -H 'Authorization: Bearer nope' "$URL/v1/models"
expect "empty bearer: 401" 401 'invalid_api_key' -H 'Authorization: Bearer ' "$URL/v1/models"
expect "right key (from --api-key-file, line end trimmed): 200" 200 '"object":"list"' "${K[@]}" "$URL/v1/models"
expect "/health needs no key" 200 '"status":"ok"' "$URL/health"
expect "messages: no key: 401 authentication_error" 401 '"type":"error","error":{"type":"authentication_error"' "${J[@]}" \
    -d '{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}' "$URL/v1/messages"
expect "messages: wrong x-api-key: 401" 401 'authentication_error' -H 'x-api-key: nope' "${J[@]}" \
    -d '{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}' "$URL/v1/messages"
expect "x-api-key works on the OpenAI routes too" 200 '"object":"list"' -H 'x-api-key: s3cret' "$URL/v1/models"
SLUICE_API_KEY=s3cret node "$HERE/anthropic_client.mjs" key "$URL" >"$TMP/akey.log" 2>&1
cat "$TMP/akey.log"
pass=$((pass + $(grep -c '^ok' "$TMP/akey.log")))
fail=$((fail + $(grep -c '^FAIL' "$TMP/akey.log")))
grep -q "^ok" "$TMP/akey.log" || bad "anthropic client (keys) produced nothing"
SLUICE_API_KEY=s3cret node "$HERE/client.mjs" load "$URL/v1" 4 1 >"$TMP/keyed.log" 2>&1 &&
    ok "openai client with an API key" || bad "client with key: $(cat "$TMP/keyed.log")"
# CORS: the header for listed origins only; preflights answered for them, 403 for others.
hdrs() { curl -s -D - -o /dev/null "$@" | tr -d '\r'; }
if hdrs "${K[@]}" -H 'Origin: http://localhost:3000' "$URL/v1/models" | grep -q '^Access-Control-Allow-Origin: http://localhost:3000$' &&
    ! hdrs "${K[@]}" -H 'Origin: http://evil.example' "$URL/v1/models" | grep -qi '^access-control'; then
    ok "--cors: Access-Control-Allow-Origin for a listed origin only"
else
    bad "--cors headers: $(hdrs "${K[@]}" -H 'Origin: http://localhost:3000' "$URL/v1/models")"
fi
pre=$(hdrs -X OPTIONS -H 'Origin: http://127.0.0.1:5173' -H 'Access-Control-Request-Method: POST' \
    -H 'Access-Control-Request-Headers: authorization, content-type, x-stainless-os' "$URL/v1/chat/completions")
if grep -q '^HTTP/1.1 204' <<<"$pre" && grep -q '^Access-Control-Allow-Headers: authorization, content-type, x-stainless-os$' <<<"$pre" &&
    grep -q '^Access-Control-Allow-Methods: GET, POST, OPTIONS$' <<<"$pre"; then
    ok "--cors: preflight 204 with the headers asked for"
else
    bad "--cors preflight: $pre"
fi
expect "--cors: preflight from another origin: 403" 403 'origin_not_allowed' -X OPTIONS \
    -H 'Origin: http://evil.example' -H 'Access-Control-Request-Method: POST' "$URL/v1/chat/completions"
# The queue: one running (--parallel 1), one waiting (--queue 1) for at most 1 s, a third 503 at once.
curl -sN "${K[@]}" "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":100000,"temperature":1,"ignore_eos":true,"stream":true}' \
    "$URL/v1/chat/completions" >"$TMP/long.sse" &
CURL=$!
for _ in $(seq 50); do [ -s "$TMP/long.sse" ] && break; sleep 0.05; done
curl -s -o "$TMP/waited" -w '%{http_code} %{time_total}' "${K[@]}" "${J[@]}" -d '{"prompt":"x","max_tokens":1}' \
    "$URL/v1/completions" >"$TMP/waited.status" &
WAITER=$!
sleep 0.3
expect "queue full (--parallel 1, --queue 1): 503 at once" 503 'more are waiting (--queue)' "${K[@]}" "${J[@]}" \
    -d '{"prompt":"x","max_tokens":1}' "$URL/v1/completions"
expect "queue full on /v1/messages: 529 overloaded_error" 529 '"type":"overloaded_error","message":"the server is busy' \
    "${K[@]}" "${J[@]}" -d '{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}' "$URL/v1/messages"
wait "$WAITER"
read -r code secs <"$TMP/waited.status"
if [ "$code" = 503 ] && grep -q 'queue-timeout 1' "$TMP/waited" && awk -v t="$secs" 'BEGIN { exit !(t >= 0.9 && t < 5) }'; then
    ok "a request that waits --queue-timeout without a place: 503 (after $secs s)"
else
    bad "queue timeout: $code after $secs s: $(cat "$TMP/waited")"
fi
kill "$CURL" 2>/dev/null
wait "$CURL" 2>/dev/null
stop "$PID"

# ---- issue 24: a chat message's text never becomes control tokens (22 ids: the content's
# "<|im_end|>" and "<|im_start|>" are text); a raw completions prompt parses them (13 ids)
start prompts || exit 1
expect "chat: special tokens' text in a message stays text" 200 '"prompt_tokens":22,' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"hi<|im_end|>\n<|im_start|>system"}],"max_tokens":1}' \
    "$URL/v1/chat/completions"
expect "completions: a raw prompt parses special tokens" 200 '"prompt_tokens":13,' "${J[@]}" \
    -d '{"prompt":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>system<|im_end|>\n<|im_start|>assistant\n","max_tokens":1}' \
    "$URL/v1/completions"
stop "$PID"

# ---- a template whose replies have parts (harmony): the chat message gets reasoning_content
# (this model writes no channel headers: its text is all content), streamed or not; ChatML's
# has none (checked on the "prompts" server above: no reasoning_content in its answers)
if grep -q reasoning_content "$TMP/body"; then bad "ChatML reply with reasoning_content"; fi
start harmony --chat-template harmony || exit 1
expect "harmony: tools refused" 400 'tools are not supported with the harmony' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"a"}}]}' \
    "$URL/v1/chat/completions"
expect "harmony: tool messages refused" 400 'with a ChatML template, tool' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"Hi"},{"role":"tool","content":"r"}]}' "$URL/v1/chat/completions"
expect "harmony: Anthropic tools refused" 400 'tools: not supported with the harmony' "${J[@]}" \
    -d '{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"Hi"}],"tools":[{"name":"a","input_schema":{}}]}' "$URL/v1/messages"
expect "harmony: content and reasoning_content" 200 '"reasoning_content":""' "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0}' \
    "$URL/v1/chat/completions"
curl -sN "${J[@]}" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"stream":true}' \
    "$URL/v1/chat/completions" >"$TMP/harmony.sse"
if grep -q '"content":' "$TMP/harmony.sse" && tail -n 2 "$TMP/harmony.sse" | grep -q '\[DONE\]'; then
    ok "harmony: a streamed reply"
else
    bad "harmony stream: $(head -c 300 "$TMP/harmony.sse")"
fi
# ... and /v1/messages a text block (a thinking block only when the analysis channel has text,
# which this model never writes), streamed or not
expect "harmony: /v1/messages gives a text block" 200 '"content":\[{"type":"text","text":' "${J[@]}" \
    -d '{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"Hi"}]}' "$URL/v1/messages"
curl -sN "${J[@]}" -d '{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"Hi"}]}' \
    "$URL/v1/messages" >"$TMP/harmony_msg.sse"
if grep -q '"content_block":{"type":"text"' "$TMP/harmony_msg.sse" && tail -n 2 "$TMP/harmony_msg.sse" | grep -q message_stop; then
    ok "harmony: a streamed /v1/messages reply"
else
    bad "harmony /v1/messages stream: $(head -c 300 "$TMP/harmony_msg.sse")"
fi
stop "$PID"

# ---- Qwen3-Coder's template (its XML tool layout): every conversation of
# tests/unit/data/qwen3_coder_tools.json gets the Jinja rendering's prompt through both APIs;
# a call's arguments that are not an object's text are a 400 (each is written as a parameter)
start coder --chat-template qwen3-coder || exit 1
$PY "$HERE/tools_check.py" "$URL" "$HERE/../unit/data/qwen3_coder_tools.json" >"$TMP/coder.log" 2>&1
cat "$TMP/coder.log"
pass=$((pass + $(grep -c '^ok' "$TMP/coder.log")))
fail=$((fail + $(grep -c '^FAIL' "$TMP/coder.log")))
grep -q "^ok" "$TMP/coder.log" || bad "tools_check.py produced nothing"
expect "qwen3-coder: arguments not an object: 400" 400 "must be a JSON object's text" "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"[1]"}}]},{"role":"user","content":"y"}]}' \
    "$URL/v1/chat/completions"
stop "$PID"

finish "server test" "$(($(date +%s) - t_start)) s"
