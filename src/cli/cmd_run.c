/* `sluice run MODEL -p TEXT`: one prompt, its reply streamed to stdout. */
#include <stdio.h>
#include <string.h>

#include "cli/text_opts.h"

static const char run_help[] =
    "usage: sluice run MODEL (-p TEXT | -f FILE) [options]\n"
    "\n"
    "Streams the model's reply to the prompt (or, with --raw or for models without a\n"
    "chat template, the continuation of the text), then one statistics line on stderr.\n"
    "A reply that reaches the end of the context stops there, with a notice.\n"
    "MODEL is a Hugging Face checkpoint directory or a sluice pack with tokenizer.json,\n"
    "or a GGUF file.\n"
    "\n"
    "  -p, --prompt TEXT      the prompt\n"
    "  -f, --file FILE        read the prompt from FILE ('-' for standard input)\n"
    "  --raw                  no chat template: the text is the prompt\n" TEXT_HELP CLI_MODEL_HELP;

int cli_run(int argc, char **argv) {
    text_opts o = {.think = 1, .max_tokens = 512, .repeat_last_n = 64, .sp = sl_sampler_defaults()};
    const char *model;
    int r = text_parse(argc, argv, run_help, 1, &o, &model);
    if (r) return r == 2 ? 0 : 1;
    char *file_text = NULL;
    if (o.file) {
        sl_error err = {0};
        const char *path = strcmp(o.file, "-") ? o.file : "/dev/stdin";
        if (sl_read_file(path, &file_text, NULL, &err)) return cli_error("%s", err.msg);
        o.prompt = file_text;
    }
    text_ctx t = {0};
    int rc = text_init(&t, &o, model);
    if (!rc) {
        sl_chat_msg msgs[2];
        int32_t n = 0;
        if (o.system) msgs[n++] = (sl_chat_msg){.role = "system", .content = o.system};
        msgs[n++] = (sl_chat_msg){.role = "user", .content = o.prompt};
        rc = text_encode(&t, msgs, n);
        const int32_t ctx = sl_session_max_ctx(t.g.seq.s);
        if (!rc && (int64_t)t.ids.n + 1 > ctx)
            rc = cli_error("the prompt (%zu tokens) does not fit the context of %d tokens (one "
                           "more is needed to reply; see --ctx)",
                           t.ids.n, ctx);
    }
    if (!rc) {
        if (t.g.tpl.kind == SL_TEMPLATE_RAW) fputs(o.prompt, stdout); /* a continuation */
        sl_gen_result res;
        rc = text_reply(&t, stdout, &res);
        if (!rc && res.ctx_full)
            fprintf(stderr,
                    "sluice: the reply reached the end of the context (%d tokens) and stops "
                    "there (a larger --ctx gives more room)\n",
                    sl_session_max_ctx(t.g.seq.s));
        if (!rc) rc = text_finish(&t);
    }
    text_free(&t);
    free(file_text);
    return rc;
}
