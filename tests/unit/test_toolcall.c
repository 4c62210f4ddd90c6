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

/* Qwen3-Coder's XML form: values converted by the offered tool's schema types. */
static sl_tool_calls parse_xml(const char *s, const sl_chat_tools *tools) {
    sl_tool_calls c;
    sl_error err = {0};
    if (sl_tool_calls_read(SL_TOOL_FORM_XML, tools, s, strlen(s), &c, &err) != SL_OK)
        memset(&c, 0, sizeof c);
    return c;
}

TEST(test_toolcall_xml) {
    static const char *const defs[] = {
        "{\"type\": \"function\", \"function\": {\"name\": \"run\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"cmd\": {\"type\": \"string\"}, \"n\": {\"type\": "
        "\"integer\"}, \"x\": {\"type\": \"number\"}, \"dry\": {\"type\": \"boolean\"}, \"env\": "
        "{\"type\": \"object\"}, \"args\": {\"type\": [\"array\", \"null\"]}, \"id\": {\"type\": "
        "[\"integer\", \"string\"]}, \"free\": {}}}}}",
        "{\"name\": \"bare\"}", /* an Anthropic-shaped or bare definition reads too */
    };
    const sl_chat_tools tools = {defs, 2};
    /* the template's own layout, every kind of value */
    sl_tool_calls c = parse_xml(
        "Running it.\n<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n  x\n</parameter>\n"
        "<parameter=n>\n42\n</parameter>\n<parameter=x>\n2.5\n</parameter>\n<parameter=dry>\nTrue"
        "\n</parameter>\n<parameter=env>\n{\"A\": \"b\"}\n</parameter>\n<parameter=args>\nnull\n"
        "</parameter>\n<parameter=id>\nabc\n</parameter>\n<parameter=free>\n7\n</parameter>\n"
        "<parameter=other>\n{}\n</parameter>\n</function>\n</tool_call>",
        &tools);
    CHECK(c.n == 1 && !strcmp(c.content, "Running it.") && !strcmp(c.calls[0].name, "run"));
    CHECKF(c.n == 1 &&
               !strcmp(c.calls[0].arguments,
                       "{\"cmd\": \"ls -la\\n  x\", \"n\": 42, \"x\": 2.5, \"dry\": true, "
                       "\"env\": {\"A\": \"b\"}, \"args\": null, \"id\": \"abc\", \"free\": "
                       "\"7\", \"other\": \"{}\"}"),
           "%s", c.n ? c.calls[0].arguments : "");
    sl_tool_calls_free(&c);

    /* values that do not read as their type stay strings; "null" of a string is the text */
    c = parse_xml("<tool_call><function=run><parameter=n>4x</parameter><parameter=x>inf"
                  "</parameter><parameter=dry>yes</parameter><parameter=cmd>null</parameter>"
                  "<parameter=env>[1]</parameter><parameter=id>7</parameter></function>"
                  "</tool_call>",
                  &tools);
    CHECKF(c.n == 1 &&
               !strcmp(c.calls[0].arguments,
                       "{\"n\": \"4x\", \"x\": \"inf\", \"dry\": \"yes\", \"cmd\": \"null\", "
                       "\"env\": \"[1]\", \"id\": 7}"),
           "%s", c.n ? c.calls[0].arguments : "");
    sl_tool_calls_free(&c);

    /* two calls, one of a tool not offered (strings), no tools at all */
    const char *two = "<tool_call>\n<function=bare>\n</function>\n</tool_call>\n<tool_call>\n"
                      "<function=other>\n<parameter=a>\n1\n</parameter>\n</function>\n"
                      "</tool_call>";
    c = parse_xml(two, &tools);
    CHECK(c.n == 2 && c.content_len == 0 && !strcmp(c.calls[0].name, "bare") &&
          !strcmp(c.calls[0].arguments, "{}") && !strcmp(c.calls[1].name, "other") &&
          !strcmp(c.calls[1].arguments, "{\"a\": \"1\"}"));
    sl_tool_calls_free(&c);
    c = parse_xml(two, NULL);
    CHECK(c.n == 2);
    sl_tool_calls_free(&c);

    /* blocks that are not calls stay text; the JSON form is not read in the XML one */
    static const char *const bad[] = {
        "<tool_call>\n{\"name\": \"run\", \"arguments\": {}}\n</tool_call>",
        "<tool_call><function=>\n</function></tool_call>",
        "<tool_call><function=run></tool_call>",
        "<tool_call><function=run><parameter=a>1</function></tool_call>",
        "<tool_call><function=run></function>x</tool_call>",
        "<tool_call>x<function=run></function></tool_call>",
        "<tool_call><function=a b\n></function></tool_call>",
        "<tool_call><function=run><parameter=>1</parameter></function></tool_call>",
        "<tool_call><function=run>junk<parameter=a>1</parameter></function></tool_call>",
        "<tool_call>\n<function=run>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_ca",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = parse_xml(bad[i], &tools);
        CHECKF(c.n == 0 && !strcmp(c.content, bad[i]), "case %zu: n=%d", i, c.n);
        sl_tool_calls_free(&c);
    }
    /* ... and the XML form is not read in the JSON one */
    sl_error err = {0};
    const char *xml = "<tool_call><function=run></function></tool_call>";
    CHECK(sl_tool_calls_read(SL_TOOL_FORM_JSON, &tools, xml, strlen(xml), &c, &err) == SL_OK &&
          c.n == 0);
    sl_tool_calls_free(&c);
}
