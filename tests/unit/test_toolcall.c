/* Tool calls read back from generated text (chat/toolcall.c). */
#include "chat/toolcall.h"
#include "test.h"

static sl_tool_calls parse(const char *s) {
    sl_tool_calls c;
    sl_error err = {0};
    if (sl_tool_calls_parse(s, strlen(s), &c, &err) != SL_OK) memset(&c, 0, sizeof c);
    return c;
}

TEST(test_toolcall_parse) {
    /* one call after a text: the newline before the block is not content */
    sl_tool_calls c = parse("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", "
                            "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    CHECK(c.n == 1 && !strcmp(c.content, "Let me look.") && c.content_len == 12);
    CHECK(c.n == 1 && !strcmp(c.calls[0].name, "get_weather"));
    CHECKF(c.n == 1 && !strcmp(c.calls[0].arguments, "{\"city\": \"Paris\"}"), "%s",
           c.n ? c.calls[0].arguments : "");
    sl_tool_calls_free(&c);

    /* several calls, nested braces and braces inside strings, key order kept */
    c = parse("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"z\": {\"y\": [1, {\"x\": \"}{\"}]},"
              " \"b\": null}}\n</tool_call>\n<tool_call>{\"arguments\":{},\"name\":\"b\"}"
              "</tool_call>");
    CHECK(c.n == 2 && c.content_len == 0 && !strcmp(c.content, ""));
    CHECKF(c.n == 2 && !strcmp(c.calls[0].arguments, "{\"z\": {\"y\": [1, {\"x\": \"}{\"}]}, "
                                                     "\"b\": null}"),
           "%s", c.n ? c.calls[0].arguments : "");
    CHECK(c.n == 2 && !strcmp(c.calls[1].name, "b") && !strcmp(c.calls[1].arguments, "{}"));
    sl_tool_calls_free(&c);

    /* malformed blocks stay text; the good one between them is read */
    static const char *const bad[] = {
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}\n</tool_call>", /* JSON */
        "<tool_call>{\"name\": \"a\"}</tool_call>",                               /* no arguments */
        "<tool_call>{\"name\": \"a\", \"arguments\": \"{}\"}</tool_call>",        /* a string */
        "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",                /* name */
        "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",             /* empty name */
        "<tool_call>[1]</tool_call>",
        "<tool_call></tool_call>",
        "<tool_call>{\"name\": \"a\", \"arguments\": {}} x</tool_call>", /* trailing text */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[512];
        snprintf(buf, sizeof buf,
                 "%s<tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>%s", bad[i],
                 bad[i]);
        c = parse(buf);
        char want[512];
        snprintf(want, sizeof want, "%s%s", bad[i], bad[i]);
        CHECKF(c.n == 1 && !strcmp(c.calls[0].name, "ok") && !strcmp(c.content, want),
               "case %zu: n=%d content=%s", i, c.n, c.content ? c.content : "");
        sl_tool_calls_free(&c);
    }

    /* truncated: generation stopped inside a block, which stays text as it is */
    static const char *const cut[] = {
        "Sure.\n<tool_call>\n{\"name\": \"a\", \"argu",
        "Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_ca",
        "Sure.\n<tool_call>",
        "Sure.\n<tool_",
        "",
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        c = parse(cut[i]);
        CHECKF(c.n == 0 && !strcmp(c.content, cut[i]), "cut %zu", i);
        sl_tool_calls_free(&c);
    }

    /* an unclosed block before a whole one: the whole one is the call */
    c = parse("<tool_call>{\"name\": \"x\"\n<tool_call>{\"name\": \"y\", \"arguments\": {}}"
              "</tool_call>");
    CHECK(c.n == 1 && !strcmp(c.calls[0].name, "y") &&
          !strcmp(c.content, "<tool_call>{\"name\": \"x\""));
    sl_tool_calls_free(&c);

    /* a NUL inside the text is kept (the length, not strlen, bounds the text) */
    sl_error err = {0};
    CHECK(sl_tool_calls_parse("a\0b", 3, &c, &err) == SL_OK && c.content_len == 3 &&
          !memcmp(c.content, "a\0b", 3));
    sl_tool_calls_free(&c);
}
