#!/usr/bin/env python3
"""Reference renderings of tool conversations through Qwen3's chat template.

Renders a few conversations with tools, tool calls and tool results through the
Jinja chat_template of Qwen3 (Qwen/Qwen3-30B-A3B's tokenizer_config.json) with
jinja2, set up as transformers' apply_chat_template sets it up (trim_blocks,
lstrip_blocks, and a tojson that is json.dumps(ensure_ascii=False), keys in
their order), and writes them with their inputs to
tests/unit/data/qwen3_tools.json, which test_template.c renders natively and
compares byte for byte.

    python3 tools/tool_template_ref.py      (needs python3-jinja2)
"""
import json
import os
import sys

import jinja2

# The template is data here: the text the checkpoint carries, which sluice emulates.
QWEN3_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n{%- endfor %}\n"
    "{%- for message in messages %}\n    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n    {%- else %}\n        {%- set content = '' %}\n"
    "    {%- endif %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n"
    "            {%- if '</think>' in content %}\n"
    "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}\n            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n            {%- endif %}\n"
    "        {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n                {%- endif %}\n"
    "                {%- if tool_call.function %}\n                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n"
    "        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n        {{- content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}"
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Recherche plein texte — «citations»\tet\nlignes / chemins \\ ok",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer", "default": 10, "minimum": 1},
        "exact": {"type": "boolean", "default": False}, "tags": {"type": ["array", "null"],
        "items": {"type": "string"}}}, "required": ["query"], "additionalProperties": False}}}

# Reals and control characters, where jansson's own writer differs from json.dumps
NUMBERS = {"type": "function", "function": {
    "name": "scale", "description": "Escapes \x1b\x01\x7f and \u2028 / \"q\"",
    "parameters": {"type": "object", "properties": {"x": {"type": "number", "minimum": 0.1,
        "maximum": 1e16, "multipleOf": 1e-05, "default": 2.0, "examples": [
            -0.0, 0.0, 123456789.123, 1.5e300, 5e-324, 0.0001, 1e15, 1.7976931348623157e308,
            -2.5e-7, 100.5, 1e22, 3]}}}}}


def call(name, args):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}


CASES = [
    {"name": "system_tools_think_off", "tools": [WEATHER], "enable_thinking": False,
     "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Weather in Paris?"}]},
    {"name": "calls_results_no_system", "tools": [WEATHER, SEARCH], "enable_thinking": True,
     "messages": [{"role": "user", "content": "Paris and Rome?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}"),
                                  call("get_weather", "{\"city\": \"Rome\", \"unit\": \"celsius\"}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 18}"},
                  {"role": "tool", "tool_call_id": "call_2", "content": "21 C, sunny"}]},
    {"name": "content_and_calls_multi_turn", "tools": [SEARCH], "enable_thinking": False,
     "messages": [{"role": "system", "content": "You search."},
                  {"role": "user", "content": "Find \"moe\"."},
                  {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\nSearching.",
                   "tool_calls": [call("search", "{\"query\": \"moe\", \"limit\": 3}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "3 hits"},
                  {"role": "assistant", "content": "Found 3."},
                  {"role": "user", "content": "Thanks."},
                  {"role": "system", "content": "Later note."},
                  {"role": "user", "content": "Again?"}]},
    {"name": "tool_turns_without_tools", "tools": [], "enable_thinking": False,
     "messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Calling.",
                   "tool_calls": [call("f", "{}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]},
    {"name": "multi_step_keeps_recent_reasoning", "tools": [WEATHER], "enable_thinking": True,
     "messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "<think>\nold\n</think>\n\nHello."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "<think>\nI should call it.\n</think>\n\n",
                   "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
                  {"role": "assistant", "content": "No reasoning here.",
                   "tool_calls": [call("get_weather", "{\"city\": \"Lyon\"}")]},
                  {"role": "tool", "tool_call_id": "call_2", "content": "20 C"},
                  {"role": "user", "content": "<tool_response>\nlate\n</tool_response>"},
                  {"role": "assistant", "content": "<think>a</think><think>\n\nb\n</think>\n\n\nIt is 18 C.</think>x"}]},
    {"name": "last_assistant_gets_block", "tools": [], "enable_thinking": True,
     "messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "\nHello."}]},
    {"name": "numbers_and_escapes", "tools": [NUMBERS], "enable_thinking": False,
     "messages": [{"role": "user", "content": "Scale it."}]},
    {"name": "last_assistant_newlines_and_call", "tools": [WEATHER], "enable_thinking": False,
     "messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "\n\n",
                   "tool_calls": [call("get_weather", "{\"city\": \"Oslo\"}")]}]},
]


def main():
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    tpl = env.from_string(QWEN3_TEMPLATE)
    out = []
    for c in CASES:
        text = tpl.render(messages=c["messages"], tools=c["tools"] or None, add_generation_prompt=True,
                          enable_thinking=c["enable_thinking"], bos_token="", eos_token="<|im_end|>")
        out.append(dict(c, expected=text))
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "unit", "data", "qwen3_tools.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path), file=sys.stderr)


if __name__ == "__main__":
    main()
