/* Chat templates: recognition from Jinja sources and exact ChatML renderings. */
#include "chat/template.h"
#include "test.h"

static const sl_chat_msg conv[] = {
    {"system", "Be brief."},
    {"user", "Hi"},
    {"assistant", "<think>\nsaying hello\n</think>\n\nHello!"},
    {"user", "2+2?"},
};

TEST(test_chatml_render) {
    sl_chat_template t;
    sl_error err = {0};
    char buf[1024];
    CHECK(sl_chat_template_from_name("chatml", &t, &err) == SL_OK);
    size_t n = sl_chat_render(&t, conv + 1, 1, 1, 0, buf, sizeof buf);
    const char *want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    CHECKF(!strcmp(buf, want) && n == strlen(want), "%s", buf);
    /* Qwen3: thinking switch; earlier reasoning dropped; empty think block when off. */
    sl_chat_template_from_source("{%- if enable_thinking is defined %}<|im_start|>...", &t);
    CHECK(t.kind == SL_TEMPLATE_CHATML && t.thinking_switch && !t.default_system[0]);
    sl_chat_render(&t, conv, 4, 1, 0, buf, sizeof buf);
    want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
           "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECKF(!strcmp(buf, want), "%s", buf);
    sl_chat_render(&t, conv + 1, 1, 1, 1, buf, sizeof buf);
    CHECKF(!strcmp(buf, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), "%s", buf);
    /* Qwen2.5: a default system message when none is given. */
    sl_chat_template_from_source("<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
                                 "You are a helpful assistant.<|im_end|>",
                                 &t);
    sl_chat_render(&t, conv + 1, 1, 0, 0, buf, sizeof buf);
    want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
           "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n";
    CHECKF(!strcmp(buf, want), "%s", buf);
    /* A short buffer: truncated but terminated, and the full length reported. */
    char small[8];
    n = sl_chat_render(&t, conv + 1, 1, 1, 0, small, sizeof small);
    CHECK(n > sizeof small && strlen(small) == sizeof small - 1);
    /* Raw: the text itself; unknown names refused; no template found means raw. */
    CHECK(sl_chat_template_from_name("raw", &t, &err) == SL_OK && t.kind == SL_TEMPLATE_RAW);
    sl_chat_render(&t, conv + 1, 1, 1, 0, buf, sizeof buf);
    CHECK(!strcmp(buf, "Hi"));
    CHECK(sl_chat_template_from_name("llama3", &t, &err) == SL_ERR_ARG);
    sl_chat_template_from_source("{{ bos_token }}[INST]", &t);
    CHECK(t.kind == SL_TEMPLATE_RAW);
}

TEST(test_chat_template_detect) {
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/tplmodel", test_tmpdir());
    snprintf(path, sizeof path, "mkdir -p '%s'", dir);
    CHECK(system(path) == 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    const char *cfg =
        "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, "
        "{\"name\": \"default\", \"template\": \"<|im_start|>{{ enable_thinking }}\"}]}";
    test_write_file(path, cfg, strlen(cfg));
    sl_chat_template t;
    sl_error err = {0};
    CHECK(sl_chat_template_detect(dir, &t, &err) == SL_OK);
    CHECK(t.kind == SL_TEMPLATE_CHATML && t.thinking_switch);
    test_write_file(path, "{not json", 9);
    CHECK(sl_chat_template_detect(dir, &t, &err) == SL_ERR_FORMAT);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir); /* takes precedence */
    test_write_file(path, "<|im_start|>", 12);
    err = (sl_error){0};
    CHECK(sl_chat_template_detect(dir, &t, &err) == SL_OK && t.kind == SL_TEMPLATE_CHATML &&
          !t.thinking_switch);
    CHECK(sl_chat_template_detect("/nonexistent", &t, &err) == SL_OK && t.kind == SL_TEMPLATE_RAW);
}
