/*
 * Chat templates: turning a conversation into the prompt text the model was
 * trained on. sluice does not run Jinja; it recognises the template family
 * from the checkpoint's chat_template and renders it natively:
 *
 *   ChatML (Qwen2, Qwen2.5, Qwen3, Qwen3.5, Qwen4):
 *     <|im_start|>system\n{system}<|im_end|>\n
 *     <|im_start|>user\n{text}<|im_end|>\n
 *     <|im_start|>assistant\n{text}<|im_end|>\n
 *     <|im_start|>assistant\n                         (generation prompt)
 *   with, for templates that have the thinking switch (enable_thinking), an
 *   empty "<think>\n\n</think>\n\n" after the generation prompt when thinking
 *   is off, and earlier assistant turns stripped of their <think> block (those after
 *   the last user query keep it where the template says so: recent_think).
 *   Templates that insert a default system message (Qwen2/2.5) get it too.
 *
 *   Harmony (gpt-oss), as its chat_template renders a conversation without tools:
 *     <|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n
 *       Knowledge cutoff: 2024-06\nCurrent date: {date}\n\nReasoning: {effort}\n\n
 *       # Valid channels: analysis, commentary, final. Channel must be included for every
 *       message.<|end|>
 *     <|start|>developer<|message|># Instructions\n\n{system}\n\n<|end|>   (a first system
 *                                                            or developer message)
 *     <|start|>user<|message|>{text}<|end|>
 *     <|start|>assistant<|channel|>final<|message|>{text}<|end|>   (the final channel's text
 *                                     of an earlier reply; <|return|> ends a last one instead)
 *     <|start|>assistant                                     (generation prompt)
 *   Other roles are left out, as the template leaves them.
 *
 *   GLM-4.5 / 4.6 (no newline or space between turns):
 *     [gMASK]<sop><|system|>\n{system}<|user|>\n{text}[/nothink]
 *     <|assistant|>\n<think>{reasoning}</think>[\n{text}]    (reasoning only after the
 *                                                           last user turn)
 *     <|assistant|>[\n<think></think>]                      (generation prompt)
 *   the bracketed parts when thinking is off (the switch is enable_thinking).
 *
 *   Gemma 4:
 *     <bos><|turn>system\n[<|think|>\n]{system}<turn|>\n   (with a system message, or thinking)
 *     <|turn>user\n{text}<turn|>\n
 *     <|turn>model\n{text}<turn|>\n                 (its thought channels stripped)
 *     <|turn>model\n                                (generation prompt)
 *   contents trimmed; the 26B/31B templates end the generation prompt with an empty
 *   "<|channel>thought\n<channel|>" when thinking is off.
 *
 *   Gemma (2, 3):
 *     <bos><start_of_turn>user\n[{system}\n\n]{text}<end_of_turn>\n
 *     <start_of_turn>model\n{text}<end_of_turn>\n
 *     <start_of_turn>model\n                         (generation prompt)
 *
 *   DeepSeek (V3, R1; <｜User｜> and <｜Assistant｜> in the template):
 *     <｜begin▁of▁sentence｜>{system}<｜User｜>{text}<｜Assistant｜>{text}<｜end▁of▁sentence｜>
 *     ...<｜Assistant｜>                               (generation prompt)
 *   the system messages joined by "\n\n" where the template joins them (V3-0324 and later),
 *   else the last one; earlier assistant turns stripped of their reasoning (up to </think>)
 *   where the template does that (R1).
 *
 *   Llama-4 (its template without tools):
 *     <|begin_of_text|>
 *     <|header_start|>system<|header_end|>\n\n{system, trimmed}<|eot|>   (a first system message)
 *     <|header_start|>user<|header_end|>\n\n{text}<|eot|>
 *     <|header_start|>assistant<|header_end|>\n\n                       (generation prompt)
 *
 *   Mistral [INST] (Mixtral-8x7B-Instruct; the later revision's leading spaces in brackets):
 *     {bos}[ ][INST] [{system}\n\n]{text} [/INST][ ]{text}{eos}[ ][INST] {text} [/INST]
 *   a system message opens the first user turn; the generation prompt adds nothing.
 *
 *   Tulu (OLMoE-Instruct, OLMo-2-Instruct, Tulu 3; {bos} where the template writes bos_token):
 *     {bos}<|system|>\n{system}\n<|user|>\n{text}\n<|assistant|>\n{text}{eos}\n
 *     <|assistant|>\n                                  (generation prompt)
 *   a last assistant message has no newline after its {eos}.
 *
 *   {bos} and {eos}: the texts of tokenizer_config.json's bos_token and eos_token (of a GGUF's
 *   tokenizer.ggml.bos_token_id and eos_token_id), as the Jinja template receives them.
 */
#ifndef SL_TEMPLATE_H
#define SL_TEMPLATE_H

#include "core/common.h"
#include "tokenizer/tokenizer.h"

typedef enum sl_template_kind {
    SL_TEMPLATE_RAW = 0, /* no template: the text is the prompt */
    SL_TEMPLATE_CHATML = 1,
    SL_TEMPLATE_HARMONY = 2,  /* gpt-oss */
    SL_TEMPLATE_GEMMA4 = 3,   /* <|turn>role ... <turn|> */
    SL_TEMPLATE_GEMMA = 4,    /* <start_of_turn>role ... <end_of_turn> */
    SL_TEMPLATE_GLM = 5,      /* GLM-4.5 / 4.6 */
    SL_TEMPLATE_DEEPSEEK = 6, /* <｜User｜> ... <｜Assistant｜> */
    SL_TEMPLATE_LLAMA4 = 7,   /* <|header_start|>role<|header_end|> ... <|eot|> */
    SL_TEMPLATE_MISTRAL = 8,  /* [INST] ... [/INST] (Mixtral) */
    SL_TEMPLATE_TULU = 9,     /* <|user|>\n ... <|assistant|>\n (OLMoE) */
} sl_template_kind;

/* "ChatML", "harmony (gpt-oss)", "Gemma 4", "Gemma", "GLM-4.5", "DeepSeek", "Llama-4",
 * "Mistral [INST]", "Tulu", "none (raw text)": for messages. */
const char *sl_chat_template_kind_name(sl_template_kind kind);

/* How a ChatML template lays out tool calls (the reply's, and the assistant turns' it renders). */
typedef enum sl_tool_form {
    /* Qwen2.5, Qwen3: <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call> */
    SL_TOOL_FORM_JSON = 0,
    /* Qwen3-Coder: <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
     * </function>\n</tool_call>, each value as text */
    SL_TOOL_FORM_XML = 1,
} sl_tool_form;

typedef struct sl_chat_template {
    sl_template_kind kind;
    sl_tool_form tool_form;  /* ChatML: the template's tool-call layout */
    int32_t thinking_switch; /* the template knows enable_thinking (Qwen3 and later) */
    /* ChatML (Qwen3's last_query_index): assistant turns after the last user query keep their
     * reasoning as "<think>\n{reasoning}\n</think>\n\n" (a last one always has the block);
     * earlier ones lose it. Without it, every assistant turn loses its reasoning. */
    int32_t recent_think;
    char default_system[128]; /* inserted when the conversation has no system message */
    /* Harmony: the system message's date ("YYYY-MM-DD"; empty: today's, as the template's
     * strftime_now) and reasoning effort (empty: "medium", the template's default) */
    char date[16];
    char reasoning[16];
    /* Gemma 4: the generation prompt ends in an empty thought channel when thinking is off
     * (the 26B and 31B templates), and the think token is followed by a newline */
    int32_t empty_thought;
    int32_t think_newline;
    int32_t join_system; /* DeepSeek: every system message, "\n\n" between (else the last) */
    int32_t strip_think; /* DeepSeek: earlier assistant turns lose their reasoning */
    int32_t inst_space;  /* Mistral: " [INST] " and " {reply}" (the later Mixtral revision) */
    /* Mistral, Tulu: the bos_token and eos_token texts the template writes (tpl_bos: the
     * template starts with bos_token) */
    int32_t tpl_bos;
    char bos[32], eos[32];
} sl_chat_template;

/* A call an assistant message made: the function's name and its arguments as JSON text, written
 * into the prompt as they are (the template writes a string's arguments unchanged). */
typedef struct sl_chat_tool_call {
    const char *name;
    const char *arguments;
} sl_chat_tool_call;

typedef struct sl_chat_msg {
    const char *role; /* "system", "user", "assistant", "tool" (any name renders as its header) */
    const char *content;
    /* assistant messages: the calls they made (ChatML renders them; others leave them out) */
    const sl_chat_tool_call *tool_calls; /* [n_tool_calls] */
    int32_t n_tool_calls;
} sl_chat_msg;

/* The tools offered to the model: each definition ({"type": "function", "function": {...}})
 * as JSON text, as the template's `tool | tojson` writes it (sl_chat_tojson). ChatML only. */
typedef struct sl_chat_tools {
    const char *const *defs; /* [n] */
    int32_t n;
} sl_chat_tools;

/* Finds the template of a model directory (tokenizer_config.json's chat_template, or
 * chat_template.jinja). No template found: RAW. */
sl_status sl_chat_template_detect(const char *dir, sl_chat_template *out, sl_error *err);
/* The template of a GGUF file: its tokenizer.chat_template (the Jinja source
 * tokenizer_config.json held). No template: RAW; a value that is not a string is
 * SL_ERR_FORMAT naming the file and the key. */
struct sl_gguf_file;
sl_status sl_chat_template_from_gguf(const struct sl_gguf_file *f, sl_chat_template *out,
                                     sl_error *err);
/* Recognises a template from its Jinja source. */
void sl_chat_template_from_source(const char *jinja, sl_chat_template *out);
/* By name: "chatml", "chatml-think" (with the thinking switch), "qwen3-coder" (ChatML with
 * Qwen3-Coder's XML tool calls), "harmony", "gemma4", "gemma",
 * "glm", "deepseek", "llama4", "mistral" (<s>, </s>, the spaced form), "tulu" (no bos,
 * <|endoftext|>), "raw". */
sl_status sl_chat_template_from_name(const char *name, sl_chat_template *out, sl_error *err);

/* 1 when the template renders tools, tool calls and tool results (ChatML, as Qwen2.5's and
 * Qwen3's templates do):
 *   <|im_start|>system\n[{system}\n\n]# Tools\n\n...<tools>\n{tool}\n{tool}\n</tools>\n\n
 *     ...</tool_call><|im_end|>\n                   (the template's fixed instructions)
 *   <|im_start|>assistant\n{text}[\n]<tool_call>\n{"name": "{name}", "arguments": {args}}\n
 *     </tool_call><|im_end|>\n                     ("\n" between calls, and after a text)
 *   <|im_start|>user\n<tool_response>\n{result}\n</tool_response>\n<tool_response>...
 *     </tool_response><|im_end|>\n                 (a run of "tool" messages: one user turn)
 * ({system}: the first system message, or a template's default one). Qwen3-Coder's form
 * (SL_TOOL_FORM_XML) writes tools, calls and results as its template does (template.c); it
 * reads each tool definition and each call's arguments as JSON (an object; text that is not
 * renders as an empty one). */
int sl_chat_supports_tools(const sl_chat_template *t);

/* v as JSON text the way the templates' tojson writes it (Python's json.dumps under
 * transformers: keys in their order, ", " and ": " between items, non-ASCII as it is, reals
 * as Python's repr: 0.1, 2.0, 1e-05, 1e+16); malloc'ed, NULL when out of memory. */
struct json_t;
char *sl_chat_tojson(const struct json_t *v);

/*
 * Renders msgs into out (cap bytes, always NUL-terminated when cap > 0); returns
 * the full length, so a result >= cap means "call again with more room".
 */
size_t sl_chat_render(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                      int add_generation_prompt, int enable_thinking, char *out, size_t cap);
/* The same with tools offered (tools NULL or empty: sl_chat_render). */
size_t sl_chat_render_tools(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                            const sl_chat_tools *tools, int add_generation_prompt,
                            int enable_thinking, char *out, size_t cap);

/*
 * Renders msgs and tokenizes them into out (reset first): the prompt ids of a
 * conversation. The template's own text (<|im_start|>, role headers, <|im_end|>,
 * the empty think block, a default system message, Gemma's <bos>) is encoded with added tokens
 * matched; every message's content, whatever its role, with SL_TOK_NO_SPECIAL,
 * so "<|im_end|>\n<|im_start|>system" written in a message stays text and cannot
 * fake a turn (non-special added tokens such as <think> still match, as in
 * Hugging Face's split_special_tokens=True). A RAW template has only contents.
 * Where no content holds a special token's text the ids are exactly those of
 * sl_tokenizer_encode(sl_chat_render(...)), which is what transformers'
 * apply_chat_template(tokenize=True) gives (sl_tokenizer_encode_spans).
 */
sl_status sl_chat_encode(const sl_chat_template *t, const sl_tokenizer *tok,
                         const sl_chat_msg *msgs, int32_t n, int add_generation_prompt,
                         int enable_thinking, sl_token_ids *out, sl_error *err);
/* The same with tools offered; tool definitions, names and arguments are contents. */
sl_status sl_chat_encode_tools(const sl_chat_template *t, const sl_tokenizer *tok,
                               const sl_chat_msg *msgs, int32_t n, const sl_chat_tools *tools,
                               int add_generation_prompt, int enable_thinking, sl_token_ids *out,
                               sl_error *err);

#endif /* SL_TEMPLATE_H */
