/*
 * Tool calls in a generated reply, as ChatML models write them, in one of two forms
 * (sl_tool_form, the template's):
 *
 *   JSON (Qwen2.5, Qwen3):
 *     Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n
 *     </tool_call>
 *   every <tool_call>...</tool_call> block whose body is a JSON object {"name": string,
 *   "arguments": object} is a call;
 *
 *   XML (Qwen3-Coder):
 *     Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n
 *     </parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>
 *   every block that is one <function=NAME> of <parameter=P> values is a call, each value
 *   converted to JSON by the offered tool's schema type for P ("days": {"type": "integer"}
 *   gives 3, not "3"; a list of types: the first the text reads as) and kept as a string where
 *   no type is given or the text does not read as it;
 *
 * the text outside the calls' blocks is the content. A block that does not read so (bad JSON,
 * a missing field, no closing tag as when generation stopped early) stays in the content as
 * text.
 */
#ifndef SL_TOOLCALL_H
#define SL_TOOLCALL_H

#include "chat/template.h"

typedef struct sl_tool_call {
    char *name;
    char *arguments; /* the arguments object as JSON text (sl_chat_tojson's layout) */
} sl_tool_call;

typedef struct sl_tool_calls {
    char *content; /* the text outside the calls, trimmed of whitespace when there are calls */
    size_t content_len;
    sl_tool_call *calls; /* [n] */
    int32_t n;
} sl_tool_calls;

/* Parses text[0..len) into out (its fields owned by out: sl_tool_calls_free). The only
 * failure is SL_ERR_NOMEM; out is then empty. The JSON form (sl_tool_calls_read). */
sl_status sl_tool_calls_parse(const char *text, size_t len, sl_tool_calls *out, sl_error *err);
/* The same in the template's form; tools (may be NULL): the tools offered, whose parameter
 * schemas give the XML form's values their JSON types. */
sl_status sl_tool_calls_read(sl_tool_form form, const sl_chat_tools *tools, const char *text,
                             size_t len, sl_tool_calls *out, sl_error *err);
void sl_tool_calls_free(sl_tool_calls *c);

#endif /* SL_TOOLCALL_H */
