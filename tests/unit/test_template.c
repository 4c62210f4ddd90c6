/* Chat templates: recognition from Jinja sources and exact ChatML renderings. */
#include "chat/genconfig.h"
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

TEST(test_generation_config) {
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/genmodel", test_tmpdir());
    snprintf(path, sizeof path, "mkdir -p '%s'", dir);
    CHECK(system(path) == 0);
    sl_gen_config g;
    sl_error err = {0};
    CHECK(sl_gen_config_load(dir, &g, &err) == SL_OK && g.n_eos == 0 && g.temperature < 0);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    const char *js = "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, "
                     "151643], \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95}";
    test_write_file(path, js, strlen(js));
    CHECK(sl_gen_config_load(dir, &g, &err) == SL_OK);
    CHECK(g.n_eos == 2 && sl_gen_config_is_eos(&g, 151645) && sl_gen_config_is_eos(&g, 151643));
    CHECK(!sl_gen_config_is_eos(&g, 1) && g.bos == 151643);
    CHECK(fabsf(g.temperature - 0.6f) < 1e-6f && g.top_k == 20 && fabsf(g.top_p - 0.95f) < 1e-6f);
    js = "{\"eos_token_id\": 7, \"do_sample\": false, \"temperature\": 0.7}";
    test_write_file(path, js, strlen(js));
    CHECK(sl_gen_config_load(dir, &g, &err) == SL_OK && g.n_eos == 1 && g.eos[0] == 7);
    CHECK(g.temperature < 0); /* greedy models keep their sampling keys out of play */
    test_write_file(path, "{oops", 5);
    CHECK(sl_gen_config_load(dir, &g, &err) == SL_ERR_FORMAT);
}
