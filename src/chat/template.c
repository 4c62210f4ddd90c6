/* Chat template recognition and native rendering (see template.h). */
#include "chat/template.h"

#include <jansson.h>
#include <sys/stat.h>
#include <time.h>

#include "format/gguf.h"

/* DeepSeek's turn markers (U+FF5C bars, U+2581 for the spaces): the text of added tokens. */
#define DS_BOS       "<｜begin▁of▁sentence｜>"
#define DS_EOS       "<｜end▁of▁sentence｜>"
#define DS_USER      "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"

const char *sl_chat_template_kind_name(sl_template_kind kind) {
    switch (kind) {
    case SL_TEMPLATE_CHATML: return "ChatML";
    case SL_TEMPLATE_HARMONY: return "harmony (gpt-oss)";
    case SL_TEMPLATE_GEMMA4: return "Gemma 4";
    case SL_TEMPLATE_GEMMA: return "Gemma";
    case SL_TEMPLATE_GLM: return "GLM-4.5";
    case SL_TEMPLATE_DEEPSEEK: return "DeepSeek";
    case SL_TEMPLATE_LLAMA4: return "Llama-4";
    case SL_TEMPLATE_MISTRAL: return "Mistral [INST]";
    case SL_TEMPLATE_TULU: return "Tulu";
    default: return "none (raw text)";
    }
}

int sl_chat_supports_tools(const sl_chat_template *t) {
    return t->kind == SL_TEMPLATE_CHATML;
}

/*
 * tojson as transformers defines it for chat templates: Python's json.dumps(v,
 * ensure_ascii=False). jansson's json_dumps has the same separators and key order but writes
 * control characters as \u001B (Python: \u001b) and reals with 17 digits (Python: the
 * shortest text that reads back the same, 0.1 and 1e-05), hence this writer.
 */
typedef struct json_buf {
    char *s;
    size_t len, cap;
    int oom;
} json_buf;

static void jb_put(json_buf *b, const char *s, size_t n) {
    if (!b->oom && sl_append(&b->s, &b->len, &b->cap, s, n)) b->oom = 1;
}

static void jb_str(json_buf *b, const char *s, size_t n) {
    jb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = c == '"'    ? "\\\""
                        : c == '\\' ? "\\\\"
                        : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t"
                        : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f"
                                    : NULL;
        if (!e && c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c), e = esc;
        if (e)
            jb_put(b, e, strlen(e));
        else
            jb_put(b, s + i, 1);
    }
    jb_put(b, "\"", 1);
}

/* Python's repr of a finite double: the fewest significant digits that read back as x, in
 * fixed notation for decimal exponents -4 to 15 (always with a fraction, "2.0"), else as
 * "1.5e-05" / "1e+16" (a sign and at least two exponent digits). */
static void jb_real(json_buf *b, double x) {
    char sci[40], digits[24], out[48];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, x);
        if (strtod(sci, NULL) == x) break;
    }
    snprintf(sci, sizeof sci, "%.*e", p - 1, x); /* [-]d[.ddd]e[+-]xx */
    const char *q = sci;
    size_t o = 0, n = 0;
    if (*q == '-') out[o++] = '-', q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[n++] = *q;
    while (n > 1 && digits[n - 1] == '0')
        n--;
    const int exp = atoi(q + 1);
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            o += (size_t)snprintf(out + o, sizeof out - o, "0.");
            for (int i = 0; i < -exp - 1; i++)
                out[o++] = '0';
            memcpy(out + o, digits, n), o += n;
        } else {
            for (int i = 0; i <= exp; i++)
                out[o++] = (size_t)i < n ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < n)
                memcpy(out + o, digits + exp + 1, n - (size_t)exp - 1), o += n - (size_t)exp - 1;
            else
                out[o++] = '0';
        }
    } else {
        out[o++] = digits[0];
        if (n > 1) out[o++] = '.', memcpy(out + o, digits + 1, n - 1), o += n - 1;
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+',
                              exp < 0 ? -exp : exp);
    }
    jb_put(b, out, o);
}

static void jb_value(json_buf *b, const json_t *v) {
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *x;
        int first = 1;
        jb_put(b, "{", 1);
        json_object_foreach((json_t *)v, key, x) {
            if (!first) jb_put(b, ", ", 2);
            first = 0;
            jb_str(b, key, strlen(key));
            jb_put(b, ": ", 2);
            jb_value(b, x);
        }
        jb_put(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        jb_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) jb_put(b, ", ", 2);
            jb_value(b, json_array_get(v, i));
        }
        jb_put(b, "]", 1);
        break;
    case JSON_STRING: jb_str(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        jb_put(b, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)));
        break;
    case JSON_REAL: jb_real(b, json_real_value(v)); break;
    case JSON_TRUE: jb_put(b, "true", 4); break;
    case JSON_FALSE: jb_put(b, "false", 5); break;
    default: jb_put(b, "null", 4); break;
    }
}

char *sl_chat_tojson(const json_t *v) {
    json_buf b = {0};
    jb_value(&b, v);
    if (b.oom || !b.s) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

void sl_chat_template_from_source(const char *jinja, sl_chat_template *t) {
    memset(t, 0, sizeof *t);
    if (jinja && strstr(jinja, DS_USER) && strstr(jinja, DS_ASSISTANT)) {
        t->kind = SL_TEMPLATE_DEEPSEEK;
        t->join_system = strstr(jinja, "is_first_sp") != NULL;
        t->strip_think = strstr(jinja, "</think>") != NULL;
        return;
    }
    /* GLM-4.5 / 4.6: "[gMASK]<sop>", then "<|user|>\n" turns with the "/nothink" switch (GLM-4.7
     * and later lay turns out otherwise and are not recognised) */
    if (jinja && strstr(jinja, "[gMASK]<sop>") && strstr(jinja, "<|user|>\n") &&
        strstr(jinja, "/nothink") && strstr(jinja, "<|assistant|>")) {
        t->kind = SL_TEMPLATE_GLM;
        t->thinking_switch = 1;
        return;
    }
    if (jinja && strstr(jinja, "<|turn>")) {
        t->kind = SL_TEMPLATE_GEMMA4;
        t->thinking_switch = strstr(jinja, "enable_thinking") != NULL;
        /* Jinja string literals: '<|channel>thought\n<channel|>' and '<|think|>\n' */
        t->empty_thought = strstr(jinja, "'<|channel>thought\\n<channel|>'") != NULL;
        t->think_newline = strstr(jinja, "'<|think|>\\n'") != NULL;
        return;
    }
    if (jinja && strstr(jinja, "<start_of_turn>")) {
        t->kind = SL_TEMPLATE_GEMMA;
        return;
    }
    if (jinja && strstr(jinja, "<|start|>") && strstr(jinja, "<|message|>") &&
        strstr(jinja, "<|channel|>")) {
        t->kind = SL_TEMPLATE_HARMONY;
        return;
    }
    if (jinja && strstr(jinja, "<|header_start|>") && strstr(jinja, "<|eot|>")) {
        t->kind = SL_TEMPLATE_LLAMA4;
        return;
    }
    /* Mixtral-8x7B-Instruct's two revisions: "[INST] " and " [/INST]" as Jinja literals (Llama
     * 2's <<SYS>> form and the later Mistral formats with [SYSTEM_PROMPT] or tools differ) */
    if (jinja && strstr(jinja, "' [/INST]'") && !strstr(jinja, "<<SYS>>") &&
        !strstr(jinja, "[SYSTEM_PROMPT]") && !strstr(jinja, "[AVAILABLE_TOOLS]")) {
        t->kind = SL_TEMPLATE_MISTRAL;
        t->inst_space = strstr(jinja, "' [INST] '") != NULL;
        t->tpl_bos = 1;
        return;
    }
    /* Tulu: a newline, not an eos, ends a user turn (Zephyr's, which writes eos there, is not
     * this one); the Jinja source holds "\n" as two characters */
    if (jinja && strstr(jinja, "'<|user|>\\n' + message['content'] + '\\n'") &&
        strstr(jinja, "'<|assistant|>\\n'")) {
        t->kind = SL_TEMPLATE_TULU;
        t->tpl_bos = strstr(jinja, "{{ bos_token }}") != NULL;
        return;
    }
    if (!jinja || !strstr(jinja, "<|im_start|>")) return;
    t->kind = SL_TEMPLATE_CHATML;
    /* Qwen3-Coder: calls as "<function=NAME>" with "<parameter=P>" values */
    if (strstr(jinja, "<function=") && strstr(jinja, "<parameter="))
        t->tool_form = SL_TOOL_FORM_XML;
    t->thinking_switch = strstr(jinja, "enable_thinking") != NULL;
    t->recent_think = strstr(jinja, "last_query_index") != NULL;
    static const char *const defaults[] = {
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        "You are a helpful assistant.",
    };
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (strstr(jinja, defaults[i])) {
            snprintf(t->default_system, sizeof t->default_system, "%s", defaults[i]);
            break;
        }
}

sl_status sl_chat_template_from_name(const char *name, sl_chat_template *t, sl_error *err) {
    memset(t, 0, sizeof *t);
    if (!strcmp(name, "raw")) return SL_OK;
    if (!strcmp(name, "deepseek")) {
        t->kind = SL_TEMPLATE_DEEPSEEK;
        t->join_system = 1;
        return SL_OK;
    }
    if (!strcmp(name, "gemma4") || !strcmp(name, "gemma")) {
        t->kind = name[5] ? SL_TEMPLATE_GEMMA4 : SL_TEMPLATE_GEMMA;
        t->thinking_switch = t->think_newline = name[5] != 0;
        return SL_OK;
    }
    if (!strcmp(name, "harmony")) {
        t->kind = SL_TEMPLATE_HARMONY;
        return SL_OK;
    }
    if (!strcmp(name, "llama4")) {
        t->kind = SL_TEMPLATE_LLAMA4;
        return SL_OK;
    }
    if (!strcmp(name, "mistral")) {
        t->kind = SL_TEMPLATE_MISTRAL;
        t->inst_space = t->tpl_bos = 1;
        snprintf(t->bos, sizeof t->bos, "<s>");
        snprintf(t->eos, sizeof t->eos, "</s>");
        return SL_OK;
    }
    if (!strcmp(name, "tulu")) {
        t->kind = SL_TEMPLATE_TULU;
        snprintf(t->eos, sizeof t->eos, "<|endoftext|>");
        return SL_OK;
    }
    t->kind = SL_TEMPLATE_CHATML;
    if (!strcmp(name, "chatml")) return SL_OK;
    if (!strcmp(name, "chatml-think")) {
        t->thinking_switch = t->recent_think = 1;
        return SL_OK;
    }
    if (!strcmp(name, "qwen3-coder")) {
        t->tool_form = SL_TOOL_FORM_XML;
        return SL_OK;
    }
    if (!strcmp(name, "glm")) {
        t->kind = SL_TEMPLATE_GLM;
        t->thinking_switch = 1;
        return SL_OK;
    }
    return sl_fail(
        err, SL_ERR_ARG,
        "unknown chat template '%s' (chatml, chatml-think, qwen3-coder, harmony, gemma4, "
        "gemma, glm, deepseek, llama4, mistral, tulu or raw)",
        name);
}

/* A special token's text in tokenizer_config.json: a string, or an AddedToken's "content"
 * (null or absent: empty, as Jinja renders an undefined bos_token). */
static void token_text(json_t *root, const char *key, char *out, size_t cap) {
    json_t *v = json_object_get(root, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    snprintf(out, cap, "%s", json_is_string(v) ? json_string_value(v) : "");
}

sl_status sl_chat_template_detect(const char *dir, sl_chat_template *t, sl_error *err) {
    char path[4096];
    struct stat sb;
    memset(t, 0, sizeof *t);
    if (sl_gguf_is_file(dir)) {
        sl_gguf_file f = {0};
        sl_status st = sl_gguf_open(&f, dir, err);
        if (!st) st = sl_chat_template_from_gguf(&f, t, err);
        sl_gguf_close(&f);
        return st;
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    const int jinja_file = stat(path, &sb) == 0;
    if (jinja_file) {
        char *text = NULL;
        sl_status st = sl_read_file(path, &text, NULL, err);
        if (st) return st;
        sl_chat_template_from_source(text, t);
        free(text);
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (stat(path, &sb) != 0) return SL_OK;
    json_t *root;
    sl_error e2 = {0};
    /* beside chat_template.jinja it only gives the bos and eos texts: unreadable, none */
    sl_status st = sl_json_load_file(path, &root, jinja_file ? &e2 : err);
    if (st) return jinja_file ? SL_OK : st;
    json_t *ct = json_object_get(root, "chat_template");
    if (json_is_array(ct)) { /* [{"name": "default", "template": "..."}, ...] */
        size_t i;
        json_t *v, *pick = NULL;
        json_array_foreach(ct, i, v) {
            const char *nm = json_string_value(json_object_get(v, "name"));
            if (!pick || (nm && !strcmp(nm, "default"))) pick = json_object_get(v, "template");
        }
        ct = pick;
    }
    if (!jinja_file) sl_chat_template_from_source(json_string_value(ct), t);
    token_text(root, "bos_token", t->bos, sizeof t->bos);
    token_text(root, "eos_token", t->eos, sizeof t->eos);
    json_decref(root);
    return SL_OK;
}

/* The text of the token whose id a GGUF key holds ("" when absent or out of range). */
static void gguf_token_text(const sl_gguf_file *f, const char *key, char *out, size_t cap) {
    const sl_gguf_kv *toks;
    sl_error e = {0};
    int64_t id;
    out[0] = '\0';
    if (!sl_gguf_find_kv(f, key) || !sl_gguf_find_kv(f, "tokenizer.ggml.tokens") ||
        sl_gguf_get_i64(f, key, &id, &e) ||
        sl_gguf_get_arr(f, "tokenizer.ggml.tokens", SL_GGUF_STRING, &toks, &e) || id < 0 ||
        (uint64_t)id >= toks->n)
        return;
    const sl_gguf_str s = sl_gguf_arr_str(toks, (uint64_t)id);
    if (s.len < cap) snprintf(out, cap, "%.*s", (int)s.len, s.s);
}

sl_status sl_chat_template_from_gguf(const sl_gguf_file *f, sl_chat_template *t, sl_error *err) {
    memset(t, 0, sizeof *t);
    if (!sl_gguf_find_kv(f, "tokenizer.chat_template")) return SL_OK;
    sl_gguf_str s;
    sl_status st = sl_gguf_get_str(f, "tokenizer.chat_template", &s, err);
    if (st) return st;
    char *src = malloc((size_t)s.len + 1); /* the file's string has no NUL */
    if (!src) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", f->path);
    memcpy(src, s.s, (size_t)s.len);
    src[s.len] = '\0';
    sl_chat_template_from_source(src, t);
    free(src);
    gguf_token_text(f, "tokenizer.ggml.bos_token_id", t->bos, sizeof t->bos);
    gguf_token_text(f, "tokenizer.ggml.eos_token_id", t->eos, sizeof t->eos);
    return SL_OK;
}

/*
 * Rendering walks the conversation once and hands every piece to a sink, marked as the
 * template's own text (role headers, <|im_start|>, <|im_end|>, the think block) or a
 * message's content: sl_chat_render joins them into a string, sl_chat_encode also keeps
 * where the contents lie so that only the template's text can become control tokens.
 */
typedef struct chat_sink {
    void (*put)(struct chat_sink *k, const char *s, size_t n, int content);
    int oom; /* a piece could not be made: sl_chat_encode fails (sl_chat_render lacks it) */
} chat_sink;

static void put_tpl(chat_sink *k, const char *s) {
    k->put(k, s, strlen(s), 0);
}

/* An earlier assistant turn without its reasoning: text after "</think>", leading
 * newlines dropped. */
static const char *strip_think(const char *s) {
    const char *end = strstr(s, "</think>");
    if (!end) return s;
    end += 8;
    while (*end == '\n')
        end++;
    return end;
}

/* DeepSeek's template: BOS, the system prompt, then the user and assistant turns (other roles
 * render nothing: its tool turns are not supported). */
static void render_deepseek(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                            int add_generation_prompt, chat_sink *k) {
    put_tpl(k, DS_BOS);
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(msgs[i].role, "system")) last = i;
    for (int32_t i = 0, first = 1; i < n; i++) {
        if (strcmp(msgs[i].role, "system") || (!t->join_system && i != last)) continue;
        if (!first) put_tpl(k, "\n\n");
        k->put(k, msgs[i].content, strlen(msgs[i].content), 1);
        first = 0;
    }
    for (int32_t i = 0; i < n; i++) {
        const char *text = msgs[i].content;
        if (!strcmp(msgs[i].role, "user")) {
            put_tpl(k, DS_USER);
            k->put(k, text, strlen(text), 1);
        } else if (!strcmp(msgs[i].role, "assistant")) {
            if (t->strip_think) { /* content.split('</think>')[-1] */
                for (const char *p = strstr(text, "</think>"); p; p = strstr(text, "</think>"))
                    text = p + 8;
            }
            put_tpl(k, DS_ASSISTANT);
            k->put(k, text, strlen(text), 1);
            put_tpl(k, DS_EOS);
        }
    }
    if (add_generation_prompt) put_tpl(k, DS_ASSISTANT);
}

/* s[0..n) without leading and trailing whitespace (Python's str.strip()), into *b, *e. */
static void strip_ws(const char *s, size_t n, const char **b, const char **e) {
    const char *p = s, *q = s + n;
    while (p < q && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
        p++;
    while (q > p && (q[-1] == ' ' || q[-1] == '\n' || q[-1] == '\t' || q[-1] == '\r'))
        q--;
    *b = p, *e = q;
}

/*
 * GLM-4.5's template (chat_template.jinja of zai-org/GLM-4.5, text messages): an assistant
 * message holding "<think>...</think>" is split into its reasoning (kept only after the last
 * user turn) and its answer; the answer and reasoning are stripped of surrounding whitespace.
 */
static void render_glm(const sl_chat_msg *msgs, int32_t n, int add_generation_prompt,
                       int enable_thinking, chat_sink *k) {
    int32_t last_user = -1;
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(msgs[i].role, "user")) last_user = i;
    put_tpl(k, "[gMASK]<sop>");
    for (int32_t i = 0; i < n; i++) {
        const char *c = msgs[i].content, *role = msgs[i].role;
        const size_t len = strlen(c);
        if (!strcmp(role, "user")) {
            put_tpl(k, "<|user|>\n");
            k->put(k, c, len, 1);
            static const char nt[] = "/nothink";
            if (!enable_thinking && !(len >= 8 && !strcmp(c + len - 8, nt))) put_tpl(k, nt);
        } else if (!strcmp(role, "assistant")) {
            put_tpl(k, "<|assistant|>");
            const char *ans = c, *ans_end = c + len, *rb = c, *re = c;
            const char *close = strstr(c, "</think>");
            if (close) { /* reasoning: before the first </think>, after the last <think> */
                const char *last_close = close;
                for (const char *p; (p = strstr(last_close + 8, "</think>"));)
                    last_close = p;
                re = close;
                while (re > c && re[-1] == '\n')
                    re--;
                rb = c;
                for (const char *p = c; (p = strstr(p, "<think>")) && p < re; p += 7)
                    rb = p + 7;
                while (rb < re && *rb == '\n')
                    rb++;
                ans = last_close + 8;
                while (*ans == '\n')
                    ans++;
            }
            const char *sb, *se;
            strip_ws(rb, (size_t)(re - rb), &sb, &se);
            if (i > last_user && se > sb) {
                put_tpl(k, "\n<think>");
                k->put(k, sb, (size_t)(se - sb), 1);
                put_tpl(k, "</think>");
            } else {
                put_tpl(k, "\n<think></think>");
            }
            strip_ws(ans, (size_t)(ans_end - ans), &sb, &se);
            if (se > sb) {
                put_tpl(k, "\n");
                k->put(k, sb, (size_t)(se - sb), 1);
            }
        } else if (!strcmp(role, "system")) {
            put_tpl(k, "<|system|>\n");
            k->put(k, c, len, 1);
        } /* other roles (tool results) render nothing without their structure */
    }
    if (add_generation_prompt) {
        put_tpl(k, "<|assistant|>");
        if (!enable_thinking) put_tpl(k, "\n<think></think>");
    }
}

/* The kept part [*a, *b) of the piece of s starting at p (up to the next "<channel|>", or the
 * end): what comes before a "<|channel>" in it, all of it when it has none. Returns where the
 * next piece starts, or NULL after the last. */
static const char *thought_piece(const char *p, const char **a, const char **b) {
    const char *close = strstr(p, "<channel|>"), *end = close ? close : p + strlen(p);
    const char *open = strstr(p, "<|channel>");
    *a = p, *b = open && open < end ? open : end;
    return close ? close + 10 : NULL;
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Gemma 4's strip_thinking: the kept parts of every piece between "<channel|>"s, joined, then
 * trimmed. Two passes: where the join's first and last non-space characters are, then the
 * kept parts clipped to them. */
static void put_stripped(chat_sink *k, const char *s) {
    const char *first = NULL, *last = NULL, *a, *b;
    for (const char *p = s; p;) {
        p = thought_piece(p, &a, &b);
        for (const char *c = a; c < b; c++)
            if (!is_space(*c)) {
                if (!first) first = c;
                last = c + 1;
            }
    }
    if (!first) return;
    for (const char *p = s; p;) {
        p = thought_piece(p, &a, &b);
        if (a < first) a = first;
        if (b > last) b = last;
        if (a < b) k->put(k, a, (size_t)(b - a), 1);
    }
}

/* A message's content as Jinja's `| trim` leaves it (ASCII whitespace off both ends). */
static void put_trimmed(chat_sink *k, const char *s, size_t n) {
    while (n && is_space(s[0]))
        s++, n--;
    while (n && is_space(s[n - 1]))
        n--;
    k->put(k, s, n, 1);
}

static int is_system(const sl_chat_msg *m) {
    return !strcmp(m->role, "system") || !strcmp(m->role, "developer");
}

/* Gemma 4's template for text conversations (no tools, one assistant message a turn). */
static void render_gemma4(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                          int add_generation_prompt, int enable_thinking, chat_sink *k) {
    const int think = t->thinking_switch && enable_thinking, sys = n > 0 && is_system(&msgs[0]);
    put_tpl(k, "<bos>");
    if (think || sys) {
        put_tpl(k, "<|turn>system\n");
        if (think) put_tpl(k, t->think_newline ? "<|think|>\n" : "<|think|>");
        if (sys) put_trimmed(k, msgs[0].content, strlen(msgs[0].content));
        put_tpl(k, "<turn|>\n");
    }
    for (int32_t i = sys; i < n; i++) {
        const int model = !strcmp(msgs[i].role, "assistant");
        put_tpl(k, "<|turn>");
        put_tpl(k, model ? "model" : msgs[i].role);
        put_tpl(k, "\n");
        if (model)
            put_stripped(k, msgs[i].content);
        else
            put_trimmed(k, msgs[i].content, strlen(msgs[i].content));
        put_tpl(k, "<turn|>\n");
    }
    if (add_generation_prompt) {
        put_tpl(k, "<|turn>model\n");
        if (t->empty_thought && !think) put_tpl(k, "<|channel>thought\n<channel|>");
    }
}

/* Gemma 2 and 3: a system message opens the first turn, followed by a blank line. */
static void render_gemma(const sl_chat_msg *msgs, int32_t n, int add_generation_prompt,
                         chat_sink *k) {
    const int sys = n > 0 && is_system(&msgs[0]);
    put_tpl(k, "<bos>");
    for (int32_t i = sys; i < n; i++) {
        put_tpl(k, "<start_of_turn>");
        put_tpl(k, !strcmp(msgs[i].role, "assistant") ? "model" : msgs[i].role);
        put_tpl(k, "\n");
        if (sys && i == 1) {
            k->put(k, msgs[0].content, strlen(msgs[0].content), 1);
            put_tpl(k, "\n\n");
        }
        put_trimmed(k, msgs[i].content, strlen(msgs[i].content));
        put_tpl(k, "<end_of_turn>\n");
    }
    if (add_generation_prompt) put_tpl(k, "<start_of_turn>model\n");
}

/* The final channel's text of an assistant reply as the model wrote it (its analysis and any
 * earlier message dropped, the terminator too): what harmony keeps of an earlier turn. A reply
 * decoded without its special tokens reads "analysis...assistantfinal...": the text after the
 * last "assistantfinal". A text without channels is returned whole; *n receives its length. */
static const char *harmony_final(const char *s, size_t *n) {
    const char *p = s, *f;
    while ((f = strstr(p, "<|channel|>final<|message|>")))
        p = f + strlen("<|channel|>final<|message|>");
    if (p == s && (f = strstr(s, "<|message|>"))) p = f + strlen("<|message|>");
    if (p == s && !strncmp(s, "analysis", 8))
        while ((f = strstr(p, "assistantfinal")))
            p = f + strlen("assistantfinal");
    size_t len = strlen(p);
    static const char *const ends[] = {"<|return|>", "<|end|>", "<|call|>"};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        const size_t m = strlen(ends[i]);
        if (len >= m && !memcmp(p + len - m, ends[i], m)) len -= m;
    }
    *n = len;
    return p;
}

static void render_harmony(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                           int add_generation_prompt, chat_sink *k) {
    char date[16];
    if (t->date[0]) {
        snprintf(date, sizeof date, "%s", t->date);
    } else {
        const time_t now = time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm) || !strftime(date, sizeof date, "%Y-%m-%d", &tm))
            snprintf(date, sizeof date, "1970-01-01");
    }
    put_tpl(k, "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
               "OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ");
    put_tpl(k, date);
    put_tpl(k, "\n\nReasoning: ");
    put_tpl(k, t->reasoning[0] ? t->reasoning : "medium");
    put_tpl(k, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
               "every message.<|end|>");
    int32_t i = 0;
    if (n > 0 && (!strcmp(msgs[0].role, "system") || !strcmp(msgs[0].role, "developer"))) {
        if (msgs[0].content[0]) {
            put_tpl(k, "<|start|>developer<|message|># Instructions\n\n");
            k->put(k, msgs[0].content, strlen(msgs[0].content), 1);
            put_tpl(k, "\n\n<|end|>");
        }
        i = 1;
    }
    for (; i < n; i++) {
        const char *text = msgs[i].content;
        if (!strcmp(msgs[i].role, "user")) {
            put_tpl(k, "<|start|>user<|message|>");
            k->put(k, text, strlen(text), 1);
            put_tpl(k, "<|end|>");
        } else if (!strcmp(msgs[i].role, "assistant")) {
            size_t len;
            const char *fin = harmony_final(text, &len);
            put_tpl(k, "<|start|>assistant<|channel|>final<|message|>");
            k->put(k, fin, len, 1);
            put_tpl(k, i == n - 1 && !add_generation_prompt ? "<|return|>" : "<|end|>");
        }
    }
    if (add_generation_prompt) put_tpl(k, "<|start|>assistant");
}

/* Llama-4's template: the text starts with BOS (the template writes it, the tokenizer adds
 * none); a first system message is trimmed (Jinja's trim), the others are as they are. */
static void render_llama4(const sl_chat_msg *msgs, int32_t n, int add_generation_prompt,
                          chat_sink *k) {
    put_tpl(k, "<|begin_of_text|>");
    for (int32_t i = 0; i < n; i++) {
        const char *text = msgs[i].content;
        size_t len = strlen(text);
        if (i == 0 && !strcmp(msgs[i].role, "system")) {
            while (len && strchr(" \t\n\r\f\v", *text))
                text++, len--;
            while (len && strchr(" \t\n\r\f\v", text[len - 1]))
                len--;
        }
        put_tpl(k, "<|header_start|>");
        put_tpl(k, msgs[i].role);
        put_tpl(k, "<|header_end|>\n\n");
        k->put(k, text, len, 1);
        put_tpl(k, "<|eot|>");
    }
    if (add_generation_prompt) put_tpl(k, "<|header_start|>assistant<|header_end|>\n\n");
}

/* Mixtral's [INST] template: a first system message opens the first user turn; other roles
 * render nothing (the template refuses them). The generation prompt is the user turn's end. */
static void render_mistral(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                           chat_sink *k) {
    const int sys = n > 0 && is_system(&msgs[0]);
    put_tpl(k, t->bos);
    for (int32_t i = sys; i < n; i++) {
        const char *text = msgs[i].content;
        if (!strcmp(msgs[i].role, "user")) {
            put_tpl(k, t->inst_space ? " [INST] " : "[INST] ");
            if (sys && i == 1) {
                k->put(k, msgs[0].content, strlen(msgs[0].content), 1);
                put_tpl(k, "\n\n");
            }
            k->put(k, text, strlen(text), 1);
            put_tpl(k, " [/INST]");
        } else if (!strcmp(msgs[i].role, "assistant")) {
            if (t->inst_space) put_tpl(k, " ");
            k->put(k, text, strlen(text), 1);
            put_tpl(k, t->eos);
        }
    }
}

/* Tulu's template: every role but system, user and assistant renders nothing; the generation
 * prompt follows a last message only (the template writes it inside its loop). */
static void render_tulu(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                        int add_generation_prompt, chat_sink *k) {
    if (t->tpl_bos) put_tpl(k, t->bos);
    for (int32_t i = 0; i < n; i++) {
        const char *text = msgs[i].content, *role = msgs[i].role;
        const int assistant = !strcmp(role, "assistant");
        if (!assistant && strcmp(role, "user") && strcmp(role, "system")) continue;
        put_tpl(k, assistant               ? "<|assistant|>\n"
                   : !strcmp(role, "user") ? "<|user|>\n"
                                           : "<|system|>\n");
        k->put(k, text, strlen(text), 1);
        if (assistant) put_tpl(k, t->eos);
        if (!assistant || i < n - 1) put_tpl(k, "\n");
    }
    if (add_generation_prompt && n > 0) put_tpl(k, "<|assistant|>\n");
}

/* Qwen3's last_query_index: the last user message that is a query, not tool results a client
 * sent back as a user message ("<tool_response>...</tool_response>"); n - 1 when none is. */
static int32_t last_query(const sl_chat_msg *msgs, int32_t n) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    for (int32_t i = n - 1; i >= 0; i--) {
        const char *c = msgs[i].content;
        const size_t len = strlen(c);
        if (strcmp(msgs[i].role, "user")) continue;
        if (!strncmp(c, open, sizeof open - 1) && len >= sizeof close - 1 &&
            !strcmp(c + len - (sizeof close - 1), close))
            continue;
        return i;
    }
    return n - 1;
}

/* An assistant message's text as Qwen3's template splits it when it holds "</think>": the
 * reasoning [*rb, *re) (before the first "</think>", after the last "<think>" there, newlines
 * off both ends) and the answer (after the last "</think>", leading newlines off), returned.
 * Without "</think>": no reasoning, the text whole. */
static const char *split_think(const char *s, const char **rb, const char **re) {
    const char *first = strstr(s, "</think>");
    *rb = *re = s;
    if (!first) return s;
    const char *e = first, *b = s;
    while (e > s && e[-1] == '\n')
        e--;
    for (const char *p = s; (p = strstr(p, "<think>")) && p + 7 <= e; p += 7)
        b = p + 7;
    while (b < e && *b == '\n')
        b++;
    *rb = b, *re = e;
    const char *last = first;
    for (const char *p; (p = strstr(last + 8, "</think>"));)
        last = p;
    last += 8;
    while (*last == '\n')
        last++;
    return last;
}

/*
 * Qwen3-Coder's tool layout (SL_TOOL_FORM_XML), as its template renders it:
 *
 *   <|im_start|>system\n{system, or "You are Qwen, a helpful AI assistant that can interact
 *     with a computer to solve tasks."}\n\n# Tools\n\nYou have access to the following
 *     functions:\n\n<tools>\n<function>\n<name>{name}</name>\n<description>{description}
 *     </description>\n<parameters>\n<parameter>\n<name>{p}</name>\n<type>{type}</type>
 *     \n<description>{d}</description>[\n<{key}>{value}</{key}>...]\n</parameter>...
 *     [\n<{key}>{value}</{key}>...]\n</parameters>[\n<{key}>{value}</{key}>...]\n</function>
 *     ...\n</tools>\n\n{the fixed instructions}<|im_end|>\n
 *   <|im_start|>assistant[\n{text, trimmed}\n]\n<tool_call>\n<function={name}>\n
 *     <parameter={key}>\n{value}\n</parameter>\n...</function>\n</tool_call><|im_end|>\n
 *   <|im_start|>user\n<tool_response>\n{result}\n</tool_response>\n<tool_response>...
 *     </tool_response>\n<|im_end|>\n              (a run of "tool" messages: one user turn)
 *
 * The [\n<{key}>...] parts are the schema's other keys in their order, an object or array as
 * tojson writes it, anything else as Python's str() (True, None, 0.5); a value of a call's
 * arguments likewise; descriptions trimmed as Python's str.strip().
 */
#define CODER_SYSTEM                                                                               \
    "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."
#define CODER_INSTRUCTIONS                                                                         \
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"  \
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"    \
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"  \
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"      \
    "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...>"        \
    "</function> block must be nested within <tool_call></tool_call> XML tags\n- Required "        \
    "parameters MUST be specified\n- You may provide optional reasoning for your function call "   \
    "in natural language BEFORE the function call, but NOT after\n- If there is no function "      \
    "call available, answer the question like normal with your current knowledge and do not "      \
    "tell the user about function calls\n</IMPORTANT>"

/* The length of the whitespace character (as Python's str.isspace) at p (end: the text's end),
 * or 0. */
static size_t py_space(const unsigned char *p, const unsigned char *end) {
    const size_t n = (size_t)(end - p);
    if (n >= 1 && ((*p >= 0x09 && *p <= 0x0d) || (*p >= 0x1c && *p <= 0x20))) return 1;
    if (n >= 2 && p[0] == 0xc2 && (p[1] == 0x85 || p[1] == 0xa0)) return 2;
    if (n < 3) return 0;
    const uint32_t c = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
    if (c == 0xe19a80 || (c >= 0xe28080 && c <= 0xe2808a) || c == 0xe280a8 || c == 0xe280a9 ||
        c == 0xe280af || c == 0xe2819f || c == 0xe38080)
        return 3;
    return 0;
}

/* s[0..*n) trimmed as Python's str.strip() (Jinja's trim): its start, *n its new length. */
static const char *py_strip(const char *s, size_t *n) {
    const unsigned char *b = (const unsigned char *)s, *e = b + *n;
    for (size_t w; b < e && (w = py_space(b, e));)
        b += w;
    while (e > b) {
        size_t w = 0;
        for (size_t back = 1; back <= 3 && !w && (size_t)(e - b) >= back; back++)
            if ((w = py_space(e - back, e)) != back) w = 0;
        if (!w) break;
        e -= w;
    }
    *n = (size_t)(e - b);
    return (const char *)b;
}

/* Python's repr of a string: single quotes unless it holds one and no double quote; the quote,
 * backslash and control characters escaped (other characters Python deems unprintable are
 * rare in schemas and kept as they are). */
static void py_repr_str(json_buf *b, const char *s, size_t n) {
    const char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    jb_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == (unsigned char)q || c == '\\')
            esc[0] = '\\', esc[1] = (char)c, esc[2] = 0;
        else if (c == '\n' || c == '\r' || c == '\t')
            snprintf(esc, sizeof esc, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : 't');
        else if (c < 0x20 || c == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", c);
        else if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] <= 0xa0) /* C1, no-break */
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned char)s[++i]);
        else
            esc[0] = 0;
        if (esc[0])
            jb_put(b, esc, strlen(esc));
        else
            jb_put(b, s + i, 1);
    }
    jb_put(b, &q, 1);
}

/* v as Python's str() of the value json.loads gives (Jinja's `| string`): a string as it is,
 * True / False / None, reals as repr; lists and dicts as their repr. */
static void py_str(json_buf *b, const json_t *v, int repr) {
    switch (json_typeof(v)) {
    case JSON_STRING:
        if (repr)
            py_repr_str(b, json_string_value(v), json_string_length(v));
        else
            jb_put(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_TRUE: jb_put(b, "True", 4); break;
    case JSON_FALSE: jb_put(b, "False", 5); break;
    case JSON_NULL: jb_put(b, "None", 4); break;
    case JSON_ARRAY:
        jb_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) jb_put(b, ", ", 2);
            py_str(b, json_array_get(v, i), 1);
        }
        jb_put(b, "]", 1);
        break;
    case JSON_OBJECT: {
        const char *key;
        json_t *x;
        int first = 1;
        jb_put(b, "{", 1);
        json_object_foreach((json_t *)v, key, x) {
            if (!first) jb_put(b, ", ", 2);
            first = 0;
            py_repr_str(b, key, strlen(key));
            jb_put(b, ": ", 2);
            py_str(b, x, 1);
        }
        jb_put(b, "}", 1);
        break;
    }
    default: jb_value(b, v); break; /* numbers: as tojson writes them */
    }
}

/* A value as the template writes it: an object or array as tojson, else Python's str();
 * trim: stripped as Jinja's trim. Content (the client's text). */
static void put_value(chat_sink *k, const json_t *v, int trim) {
    json_buf b = {0};
    if (json_is_object(v) || json_is_array(v))
        jb_value(&b, v);
    else
        py_str(&b, v, 0);
    k->oom |= b.oom;
    size_t n = b.len;
    const char *s = b.s && trim ? py_strip(b.s, &n) : b.s;
    if (s) k->put(k, s, n, 1);
    free(b.s);
}

/* A JSON text the caller made (a tool definition, a call's arguments) as a value: NULL when it
 * is not JSON (out of memory: k->oom). */
static json_t *load_json(chat_sink *k, const char *text) {
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &e);
    if (!v && json_error_code(&e) == json_error_out_of_memory) k->oom = 1;
    return v;
}

/* "\n<{key}>{value}</{key}>" for each key of obj (when it is an object) not in skip. */
static void put_extra_keys(chat_sink *k, const json_t *obj, const char *const *skip) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int skipped = 0;
        for (const char *const *p = skip; *p && !skipped; p++)
            skipped = !strcmp(key, *p);
        if (skipped) continue;
        put_tpl(k, "\n<");
        k->put(k, key, strlen(key), 1);
        put_tpl(k, ">");
        put_value(k, v, 0);
        put_tpl(k, "</");
        k->put(k, key, strlen(key), 1);
        put_tpl(k, ">");
    }
}

/* One tool definition in Qwen3-Coder's XML. */
static void put_coder_tool(chat_sink *k, const char *def) {
    json_t *root = load_json(k, def), *tool = root;
    if (json_object_get(tool, "function")) tool = json_object_get(tool, "function");
    json_t *name = json_object_get(tool, "name"), *desc = json_object_get(tool, "description");
    json_t *params = json_object_get(tool, "parameters");
    json_t *props = json_object_get(params, "properties");
    static const char *const param_skip[] = {"name", "type", "description", NULL};
    static const char *const params_skip[] = {"type", "properties", NULL};
    static const char *const tool_skip[] = {"type", "name", "description", "parameters", NULL};
    put_tpl(k, "\n<function>\n<name>");
    if (name) put_value(k, name, 0);
    put_tpl(k, "</name>");
    if (desc) {
        put_tpl(k, "\n<description>");
        put_value(k, desc, 1);
        put_tpl(k, "</description>");
    }
    put_tpl(k, "\n<parameters>");
    const char *pname;
    json_t *pf;
    if (json_is_object(props)) json_object_foreach(props, pname, pf) {
            put_tpl(k, "\n<parameter>\n<name>");
            k->put(k, pname, strlen(pname), 1);
            put_tpl(k, "</name>");
            json_t *type = json_object_get(pf, "type"), *d = json_object_get(pf, "description");
            if (type) { /* `| string`: a list of types as Python writes a list */
                json_buf b = {0};
                py_str(&b, type, 0);
                k->oom |= b.oom;
                put_tpl(k, "\n<type>");
                if (b.s) k->put(k, b.s, b.len, 1);
                put_tpl(k, "</type>");
                free(b.s);
            }
            if (d) {
                put_tpl(k, "\n<description>");
                put_value(k, d, 1);
                put_tpl(k, "</description>");
            }
            put_extra_keys(k, pf, param_skip);
            put_tpl(k, "\n</parameter>");
        }
    put_extra_keys(k, params, params_skip);
    put_tpl(k, "\n</parameters>");
    put_extra_keys(k, tool, tool_skip);
    put_tpl(k, "\n</function>");
    json_decref(root);
}

/* An assistant turn with calls in Qwen3-Coder's XML (the message has n_tool_calls > 0). */
static void put_coder_calls(chat_sink *k, const sl_chat_msg *m) {
    size_t n = strlen(m->content);
    const char *text = py_strip(m->content, &n);
    put_tpl(k, "<|im_start|>");
    put_tpl(k, m->role);
    if (n) {
        put_tpl(k, "\n");
        k->put(k, text, n, 1);
        put_tpl(k, "\n");
    }
    for (int32_t c = 0; c < m->n_tool_calls; c++) {
        put_tpl(k, "\n<tool_call>\n<function=");
        k->put(k, m->tool_calls[c].name, strlen(m->tool_calls[c].name), 1);
        put_tpl(k, ">\n");
        json_t *args = load_json(k, m->tool_calls[c].arguments), *v;
        const char *key;
        json_object_foreach(args, key, v) {
            put_tpl(k, "<parameter=");
            k->put(k, key, strlen(key), 1);
            put_tpl(k, ">\n");
            put_value(k, v, 0);
            put_tpl(k, "\n</parameter>\n");
        }
        json_decref(args);
        put_tpl(k, "</function>\n</tool_call>");
    }
    put_tpl(k, "<|im_end|>\n");
}

/* Qwen3-Coder's template (ChatML with SL_TOOL_FORM_XML): no reasoning, no default system
 * message without tools. */
static void render_coder(const sl_chat_msg *msgs, int32_t n, const sl_chat_tools *tools,
                         int add_generation_prompt, chat_sink *k) {
    const int sys = n > 0 && !strcmp(msgs[0].role, "system");
    if (sys || tools) {
        put_tpl(k, "<|im_start|>system\n");
        if (sys)
            k->put(k, msgs[0].content, strlen(msgs[0].content), 1);
        else
            put_tpl(k, CODER_SYSTEM);
    }
    if (tools) {
        put_tpl(k, "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
        for (int32_t i = 0; i < tools->n; i++)
            put_coder_tool(k, tools->defs[i]);
        put_tpl(k, "\n</tools>" CODER_INSTRUCTIONS);
    }
    if (sys || tools) put_tpl(k, "<|im_end|>\n");
    for (int32_t i = sys; i < n; i++) {
        const sl_chat_msg *m = &msgs[i];
        if (!strcmp(m->role, "assistant") && m->n_tool_calls > 0) {
            put_coder_calls(k, m);
        } else if (!strcmp(m->role, "tool")) {
            /* the template's loop.previtem: none for the first message after the system */
            if (i > sys && strcmp(msgs[i - 1].role, "tool")) put_tpl(k, "<|im_start|>user\n");
            put_tpl(k, "<tool_response>\n");
            k->put(k, m->content, strlen(m->content), 1);
            put_tpl(k, "\n</tool_response>\n");
            if (i == n - 1 || strcmp(msgs[i + 1].role, "tool")) put_tpl(k, "<|im_end|>\n");
        } else {
            put_tpl(k, "<|im_start|>");
            put_tpl(k, m->role);
            put_tpl(k, "\n");
            k->put(k, m->content, strlen(m->content), 1);
            put_tpl(k, "<|im_end|>\n");
        }
    }
    if (add_generation_prompt) put_tpl(k, "<|im_start|>assistant\n");
}

/* ChatML (see sl_chat_supports_tools for its tool layout). */
static void render_chatml(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                          const sl_chat_tools *tools, int add_generation_prompt,
                          int enable_thinking, chat_sink *k) {
    const int sys = n > 0 && !strcmp(msgs[0].role, "system");
    if (tools) {
        put_tpl(k, "<|im_start|>system\n");
        if (sys || t->default_system[0]) {
            if (sys)
                k->put(k, msgs[0].content, strlen(msgs[0].content), 1);
            else
                put_tpl(k, t->default_system);
            put_tpl(k, "\n\n");
        }
        put_tpl(k, "# Tools\n\nYou may call one or more functions to assist with the user "
                   "query.\n\nYou are provided with function signatures within <tools></tools> "
                   "XML tags:\n<tools>");
        for (int32_t i = 0; i < tools->n; i++) {
            put_tpl(k, "\n");
            k->put(k, tools->defs[i], strlen(tools->defs[i]), 1);
        }
        put_tpl(k, "\n</tools>\n\nFor each function call, return a json object with function "
                   "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                   "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                   "</tool_call><|im_end|>\n");
    } else if (t->default_system[0] && !sys) {
        put_tpl(k, "<|im_start|>system\n");
        put_tpl(k, t->default_system); /* the template's text, not a message */
        put_tpl(k, "<|im_end|>\n");
    }
    const int32_t query = t->recent_think ? last_query(msgs, n) : 0;
    for (int32_t i = tools && sys; i < n; i++) {
        const sl_chat_msg *m = &msgs[i];
        const char *text = m->content;
        if (!strcmp(m->role, "tool")) { /* a run of results is one user turn */
            if (i == 0 || strcmp(msgs[i - 1].role, "tool")) put_tpl(k, "<|im_start|>user");
            put_tpl(k, "\n<tool_response>\n");
            k->put(k, text, strlen(text), 1);
            put_tpl(k, "\n</tool_response>");
            if (i == n - 1 || strcmp(msgs[i + 1].role, "tool")) put_tpl(k, "<|im_end|>\n");
            continue;
        }
        const char *rb = NULL, *re = NULL;
        if (t->recent_think && !strcmp(m->role, "assistant")) {
            text = split_think(text, &rb, &re);
            if (i <= query || (i < n - 1 && rb == re)) rb = NULL; /* the reasoning is dropped */
        } else if (t->thinking_switch && !strcmp(m->role, "assistant")) {
            text = strip_think(text);
        }
        put_tpl(k, "<|im_start|>");
        put_tpl(k, m->role);
        put_tpl(k, "\n");
        const int has_text = text[0] != '\0'; /* before the newlines the think block drops */
        if (rb) {
            put_tpl(k, "<think>\n");
            k->put(k, rb, (size_t)(re - rb), 1);
            put_tpl(k, "\n</think>\n\n");
            while (*text == '\n')
                text++;
        }
        k->put(k, text, strlen(text), 1);
        for (int32_t c = 0; c < m->n_tool_calls; c++) {
            if (c > 0 || has_text) put_tpl(k, "\n");
            put_tpl(k, "<tool_call>\n{\"name\": \"");
            k->put(k, m->tool_calls[c].name, strlen(m->tool_calls[c].name), 1);
            put_tpl(k, "\", \"arguments\": ");
            k->put(k, m->tool_calls[c].arguments, strlen(m->tool_calls[c].arguments), 1);
            put_tpl(k, "}\n</tool_call>");
        }
        put_tpl(k, "<|im_end|>\n");
    }
    if (add_generation_prompt) {
        put_tpl(k, "<|im_start|>assistant\n");
        if (t->thinking_switch && !enable_thinking) put_tpl(k, "<think>\n\n</think>\n\n");
    }
}

/* tools: NULL when none are offered (only ChatML renders them). */
static void render(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                   const sl_chat_tools *tools, int add_generation_prompt, int enable_thinking,
                   chat_sink *k) {
    if (tools && tools->n <= 0) tools = NULL;
    if (t->kind == SL_TEMPLATE_DEEPSEEK) {
        render_deepseek(t, msgs, n, add_generation_prompt, k);
        return;
    }
    if (t->kind == SL_TEMPLATE_GLM) {
        render_glm(msgs, n, add_generation_prompt, enable_thinking, k);
        return;
    }
    if (t->kind == SL_TEMPLATE_GEMMA4) {
        render_gemma4(t, msgs, n, add_generation_prompt, enable_thinking, k);
        return;
    }
    if (t->kind == SL_TEMPLATE_GEMMA) {
        render_gemma(msgs, n, add_generation_prompt, k);
        return;
    }
    if (t->kind == SL_TEMPLATE_HARMONY) {
        render_harmony(t, msgs, n, add_generation_prompt, k);
        return;
    }
    if (t->kind == SL_TEMPLATE_LLAMA4) {
        render_llama4(msgs, n, add_generation_prompt, k);
        return;
    }
    if (t->kind == SL_TEMPLATE_MISTRAL) {
        render_mistral(t, msgs, n, k);
        return;
    }
    if (t->kind == SL_TEMPLATE_TULU) {
        render_tulu(t, msgs, n, add_generation_prompt, k);
        return;
    }
    if (t->kind == SL_TEMPLATE_RAW) {
        for (int32_t i = 0; i < n; i++)
            k->put(k, msgs[i].content, strlen(msgs[i].content), 1);
        return;
    }
    if (t->tool_form == SL_TOOL_FORM_XML)
        render_coder(msgs, n, tools, add_generation_prompt, k);
    else
        render_chatml(t, msgs, n, tools, add_generation_prompt, enable_thinking, k);
}

/* sl_chat_render's sink: appends as snprintf would, tracking the full length. */
typedef struct text_sink {
    chat_sink k;
    char *out;
    size_t cap, len;
} text_sink;

static void text_put(chat_sink *k, const char *s, size_t n, int content) {
    text_sink *t = (text_sink *)k;
    (void)content;
    if (t->len < t->cap)
        memcpy(t->out + t->len, s, SL_MIN(n, t->cap - 1 - SL_MIN(t->len, t->cap - 1)));
    t->len += n;
}

size_t sl_chat_render_tools(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                            const sl_chat_tools *tools, int add_generation_prompt,
                            int enable_thinking, char *out, size_t cap) {
    text_sink k = {{text_put, 0}, out, cap, 0};
    render(t, msgs, n, tools, add_generation_prompt, enable_thinking, &k.k);
    if (cap) out[SL_MIN(k.len, cap - 1)] = '\0';
    return k.len;
}

size_t sl_chat_render(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                      int add_generation_prompt, int enable_thinking, char *out, size_t cap) {
    return sl_chat_render_tools(t, msgs, n, NULL, add_generation_prompt, enable_thinking, out, cap);
}

/* sl_chat_encode's sink: the text in a growing buffer, and one span per piece (the
 * tokenizer merges neighbours of equal flags). */
typedef struct span_sink {
    chat_sink k;
    char *text;
    size_t len, cap;
    sl_tok_span *spans;
    size_t n_spans, spans_cap;
} span_sink;

static void span_put(chat_sink *k, const char *s, size_t n, int content) {
    span_sink *t = (span_sink *)k;
    if (k->oom || n == 0) return;
    if (t->len + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n)
            cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p) {
            k->oom = 1;
            return;
        }
        t->text = p;
        t->cap = cap;
    }
    if (t->n_spans == t->spans_cap) {
        size_t cap = t->spans_cap ? 2 * t->spans_cap : 16;
        sl_tok_span *p = realloc(t->spans, cap * sizeof *p);
        if (!p) {
            k->oom = 1;
            return;
        }
        t->spans = p;
        t->spans_cap = cap;
    }
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->spans[t->n_spans++] = (sl_tok_span){n, content ? SL_TOK_NO_SPECIAL : 0};
}

sl_status sl_chat_encode(const sl_chat_template *t, const sl_tokenizer *tok,
                         const sl_chat_msg *msgs, int32_t n, int add_generation_prompt,
                         int enable_thinking, sl_token_ids *out, sl_error *err) {
    return sl_chat_encode_tools(t, tok, msgs, n, NULL, add_generation_prompt, enable_thinking, out,
                                err);
}

sl_status sl_chat_encode_tools(const sl_chat_template *t, const sl_tokenizer *tok,
                               const sl_chat_msg *msgs, int32_t n, const sl_chat_tools *tools,
                               int add_generation_prompt, int enable_thinking, sl_token_ids *out,
                               sl_error *err) {
    span_sink k = {.k = {span_put}};
    out->n = 0;
    render(t, msgs, n, tools, add_generation_prompt, enable_thinking, &k.k);
    sl_status st =
        k.k.oom ? sl_fail(err, SL_ERR_NOMEM, "out of memory rendering the conversation")
                : sl_tokenizer_encode_spans(tok, k.text, k.len, k.spans, k.n_spans, out, err);
    free(k.text);
    free(k.spans);
    return st;
}
