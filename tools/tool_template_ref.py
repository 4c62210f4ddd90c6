#!/usr/bin/env python3
"""Reference renderings of tool conversations through Qwen3's chat templates.

Renders a few conversations with tools, tool calls and tool results through the
Jinja chat_template of Qwen3 (Qwen/Qwen3-30B-A3B's tokenizer_config.json) and of
Qwen3-Coder (Qwen/Qwen3-Coder-30B-A3B-Instruct's, as vLLM's
examples/tool_chat_template_qwen3coder.jinja carries it) with jinja2, set up as
transformers' apply_chat_template sets it up (trim_blocks, lstrip_blocks, and a
tojson that is json.dumps(ensure_ascii=False), keys in their order), and writes
them with their inputs to tests/unit/data/qwen3_tools.json and
qwen3_coder_tools.json, which test_template.c renders natively and compares
byte for byte. A call's arguments are JSON text in the files (as the OpenAI API
sends them); Qwen3-Coder's template gets them as dicts (as vLLM gives them).

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

QWEN3_CODER_TEMPLATE = r"""{% macro render_extra_keys(json_dict, handled_keys) %}
    {%- if json_dict is mapping %}
        {%- for json_key in json_dict if json_key not in handled_keys %}
            {%- if json_dict[json_key] is mapping or (json_dict[json_key] is sequence and json_dict[json_key] is not string) %}
                {{- '\n<' ~ json_key ~ '>' ~ (json_dict[json_key] | tojson | safe) ~ '</' ~ json_key ~ '>' }}
            {%- else %}
                {{-'\n<' ~ json_key ~ '>' ~ (json_dict[json_key] | string) ~ '</' ~ json_key ~ '>' }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{% endmacro %}

{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{%- if not tools is defined %}
    {%- set tools = [] %}
{%- endif %}

{%- if system_message is defined %}
    {{- "<|im_start|>system\n" + system_message }}
{%- else %}
    {%- if tools is iterable and tools | length > 0 %}
        {{- "<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer to solve tasks." }}
    {%- endif %}
{%- endif %}
{%- if tools is iterable and tools | length > 0 %}
    {{- "\n\n# Tools\n\nYou have access to the following functions:\n\n" }}
    {{- "<tools>" }}
    {%- for tool in tools %}
        {%- if tool.function is defined %}
            {%- set tool = tool.function %}
        {%- endif %}
        {{- "\n<function>\n<name>" ~ tool.name ~ "</name>" }}
        {%- if tool.description is defined %}
            {{- '\n<description>' ~ (tool.description | trim) ~ '</description>' }}
        {%- endif %}
        {{- '\n<parameters>' }}
        {%- if tool.parameters is defined and tool.parameters is mapping and tool.parameters.properties is defined and tool.parameters.properties is mapping %}
            {%- for param_name, param_fields in tool.parameters.properties|items %}
                {{- '\n<parameter>' }}
                {{- '\n<name>' ~ param_name ~ '</name>' }}
                {%- if param_fields.type is defined %}
                    {{- '\n<type>' ~ (param_fields.type | string) ~ '</type>' }}
                {%- endif %}
                {%- if param_fields.description is defined %}
                    {{- '\n<description>' ~ (param_fields.description | trim) ~ '</description>' }}
                {%- endif %}
                {%- set handled_keys = ['name', 'type', 'description'] %}
                {{- render_extra_keys(param_fields, handled_keys) }}
                {{- '\n</parameter>' }}
            {%- endfor %}
        {%- endif %}
        {% set handled_keys = ['type', 'properties'] %}
        {{- render_extra_keys(tool.parameters, handled_keys) }}
        {{- '\n</parameters>' }}
        {%- set handled_keys = ['type', 'name', 'description', 'parameters'] %}
        {{- render_extra_keys(tool, handled_keys) }}
        {{- '\n</function>' }}
    {%- endfor %}
    {{- "\n</tools>" }}
    {{- '\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' }}
{%- endif %}
{%- if system_message is defined %}
    {{- '<|im_end|>\n' }}
{%- else %}
    {%- if tools is iterable and tools | length > 0 %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message.role == "assistant" and message.tool_calls is defined and message.tool_calls is iterable and message.tool_calls | length > 0 %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content is defined and message.content is string and message.content | trim | length > 0 %}
            {{- '\n' + message.content | trim + '\n' }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
            {%- if tool_call.arguments is defined %}
                {%- for args_name, args_value in tool_call.arguments|items %}
                    {{- '<parameter=' + args_name + '>\n' }}
                    {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                    {{- args_value }}
                    {{- '\n</parameter>\n' }}
                {%- endfor %}
            {%- endif %}
            {{- '</function>\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "user" or message.role == "system" or message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user\n' }}
        {%- endif %}
        {{- '<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>\n' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

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


# Qwen3-Coder: every kind of argument value, schemas with other keys and lists of types,
# descriptions to trim, tool results first after the system message.
SHELL = {"type": "function", "function": {
    "name": "run", "description": "  Run a shell command.\n\u00a0",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "description": " The command\t"},
        "timeout": {"type": "number", "default": 30.0, "minimum": 0.5},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "dry": {"type": "boolean", "default": False, "nullable": True, "x": None},
        "args": {"type": ["array", "null"], "items": {"type": "string"}},
        "mode": {"enum": ["a", "b's", "c\"d"], "title": "Mode \u00e9"}},
        "required": ["command"], "additionalProperties": False},
    "strict": True}}
BARE = {"type": "function", "function": {"name": "ping"}}

CODER_CASES = [
    {"name": "coder_system_tools", "tools": [WEATHER, SHELL],
     "messages": [{"role": "system", "content": "You code."},
                  {"role": "user", "content": "Weather in Paris?"}]},
    {"name": "coder_default_system_calls_results", "tools": [WEATHER, SHELL, BARE, NUMBERS],
     "messages": [{"role": "user", "content": "Paris and Rome?"},
                  {"role": "assistant", "content": "  Checking both.\n",
                   "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}"),
                                  call("run", "{\"command\": \"ls -la\\n\", \"timeout\": 2.5, "
                                       "\"dry\": true, \"args\": [\"-x\", 1], \"env\": {\"A\": \"b\"}, "
                                       "\"n\": 3, \"z\": null, \"big\": 1e16, \"neg\": false}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
                  {"role": "tool", "tool_call_id": "call_2", "content": "total 0"},
                  {"role": "assistant", "content": "Done."},
                  {"role": "user", "content": "Again?"}]},
    {"name": "coder_no_tools", "tools": [],
     "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "<think>x</think>Hello"},
                  {"role": "user", "content": "More"}]},
    {"name": "coder_tool_first_and_empty_calls", "tools": [BARE],
     "messages": [{"role": "system", "content": "S"},
                  {"role": "tool", "tool_call_id": "call_1", "content": "orphan"},
                  {"role": "user", "content": "Ping."},
                  {"role": "assistant", "content": "",
                   "tool_calls": [call("ping", "{}"), call("ping", "{}")]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "pong"},
                  {"role": "system", "content": "Later."}]},
    {"name": "coder_no_user", "tools": [],
     "messages": [{"role": "user", "content": "Hi"}]},
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
    write(os.path.join(here, "..", "tests", "unit", "data", "qwen3_tools.json"), out)
    tpl = env.from_string(QWEN3_CODER_TEMPLATE)
    out = []
    for c in CODER_CASES:
        msgs = [dict(m, tool_calls=[dict(t, function=dict(t["function"], arguments=json.loads(
            t["function"]["arguments"]))) for t in m["tool_calls"]]) if "tool_calls" in m else m
            for m in c["messages"]]
        kw = {"tools": c["tools"]} if c["tools"] else {}
        text = tpl.render(messages=msgs, add_generation_prompt=True, bos_token="",
                          eos_token="<|im_end|>", **kw)
        out.append(dict(c, expected=text))
    write(os.path.join(here, "..", "tests", "unit", "data", "qwen3_coder_tools.json"), out)


def write(path, cases):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path), file=sys.stderr)


if __name__ == "__main__":
    main()
