/* Chat template recognition and native rendering (see template.h). */
#include "chat/template.h"

#include <jansson.h>
#include <sys/stat.h>

void sl_chat_template_from_source(const char *jinja, sl_chat_template *t) {
    memset(t, 0, sizeof *t);
    if (!jinja || !strstr(jinja, "<|im_start|>")) return;
    t->kind = SL_TEMPLATE_CHATML;
    t->thinking_switch = strstr(jinja, "enable_thinking") != NULL;
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
    t->kind = SL_TEMPLATE_CHATML;
    if (!strcmp(name, "chatml")) return SL_OK;
    if (!strcmp(name, "chatml-think")) {
        t->thinking_switch = 1;
        return SL_OK;
    }
    return sl_fail(err, SL_ERR_ARG, "unknown chat template '%s' (chatml, chatml-think or raw)",
                   name);
}

sl_status sl_chat_template_detect(const char *dir, sl_chat_template *t, sl_error *err) {
    char path[4096];
    struct stat sb;
    memset(t, 0, sizeof *t);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (stat(path, &sb) == 0) {
        char *text = NULL;
        sl_status st = sl_read_file(path, &text, NULL, err);
        if (st) return st;
        sl_chat_template_from_source(text, t);
        free(text);
        return SL_OK;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (stat(path, &sb) != 0) return SL_OK;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return sl_fail(err, SL_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
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
    sl_chat_template_from_source(json_string_value(ct), t);
    json_decref(root);
    return SL_OK;
}

/* Appends to out as snprintf would, tracking the full length in *len. */
static void put(char *out, size_t cap, size_t *len, const char *s, size_t n) {
    if (*len < cap) memcpy(out + *len, s, SL_MIN(n, cap - 1 - SL_MIN(*len, cap - 1)));
    *len += n;
}

static void puts_(char *out, size_t cap, size_t *len, const char *s) {
    put(out, cap, len, s, strlen(s));
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

size_t sl_chat_render(const sl_chat_template *t, const sl_chat_msg *msgs, int32_t n,
                      int add_generation_prompt, int enable_thinking, char *out, size_t cap) {
    size_t len = 0;
    if (t->kind == SL_TEMPLATE_RAW) {
        for (int32_t i = 0; i < n; i++)
            puts_(out, cap, &len, msgs[i].content);
    } else {
        if (t->default_system[0] && (n == 0 || strcmp(msgs[0].role, "system") != 0)) {
            puts_(out, cap, &len, "<|im_start|>system\n");
            puts_(out, cap, &len, t->default_system);
            puts_(out, cap, &len, "<|im_end|>\n");
        }
        for (int32_t i = 0; i < n; i++) {
            const char *text = msgs[i].content;
            if (t->thinking_switch && !strcmp(msgs[i].role, "assistant")) text = strip_think(text);
            puts_(out, cap, &len, "<|im_start|>");
            puts_(out, cap, &len, msgs[i].role);
            puts_(out, cap, &len, "\n");
            puts_(out, cap, &len, text);
            puts_(out, cap, &len, "<|im_end|>\n");
        }
        if (add_generation_prompt) {
            puts_(out, cap, &len, "<|im_start|>assistant\n");
            if (t->thinking_switch && !enable_thinking)
                puts_(out, cap, &len, "<think>\n\n</think>\n\n");
        }
    }
    if (cap) out[SL_MIN(len, cap - 1)] = '\0';
    return len;
}
