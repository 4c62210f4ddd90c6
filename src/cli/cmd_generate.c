/*
 * `sluice generate MODEL --ids 1,2,3 -n N`: a greedy continuation through the incremental
 * KV-cache path, printed as ids.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/ids_opts.h"

/* generate's also: the names llama.cpp users type */
static const struct option generate_opts[] = {
    {"ids", required_argument, 0, OPT_IDS},
    {"n-predict", required_argument, 0, 'n'},
    {"seed", required_argument, 0, 's'},
    {"repeat-last-n", required_argument, 0, OPT_REPEAT_LAST_N},
    {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

static const char generate_help[] =
    "usage: sluice generate MODEL --ids 1,2,3 -n N [options]\n"
    "\n"
    "Decodes N tokens greedily (argmax) through the incremental KV-cache path and\n"
    "prints the new ids, comma-separated, on the last line of stdout. One line of\n"
    "statistics goes to stderr. MODEL is a Hugging Face checkpoint, a sluice pack or a\n"
    "GGUF file.\n"
    "A context too short for N stops early, with a notice: the ids made are printed.\n"
    "\n"
    "  --ids LIST             comma-separated prompt token ids\n"
    "  -n, --n-predict N      new tokens (default 16); the first comes from the prompt's\n"
    "                         logits, each goes through the model (decode N tok)\n"
    "  --ignore-eos           accepted: generate never stops at EOS\n"
    "  -s, --seed N, --repeat-last-n N   accepted with a warning: greedy has no use for them\n"
    "  (--ctx defaults to the prompt plus N, at most the model's max_position_embeddings;\n"
    "  a prompt longer than the context is refused)\n" CLI_MODEL_HELP;

int cli_generate(int argc, char **argv) {
    ids_opts o = {.n_new = 16};
    const char *model;
    int r = ids_parse(argc, argv, generate_help, ":hn:s:" CLI_MODEL_SHORTOPTS, generate_opts, &o,
                      &model);
    if (r) return r == 2 ? 0 : 1;
    int32_t *ids, n, max_position, vocab;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    /* The first new id comes from the prompt's last logits, with no position of its own: a
     * prompt that fills the context still gives one (and the notice below). */
    const int known = ids_config_limits(model, &max_position, &vocab);
    if (known && ids_prompt_fits(ids, n, vocab, o.m.ctx ? o.m.ctx : max_position, o.m.ctx != 0))
        return free(ids), 1;
    sl_model *m = cli_load_model(model, &o.m.mp);
    if (!m) return free(ids), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    int rc = 1;
    sl_error err = {0};
    sl_session *s = NULL;
    int32_t *out = malloc(((size_t)o.n_new + 1) * sizeof(int32_t));
    float *logits = malloc((size_t)info.vocab_size * sizeof(float));
    /* By default the context stops at the model's positions, as run's does: decoding past them
     * takes an explicit --ctx (and gets cli_model_report's warning). */
    const int64_t ctx =
        o.m.ctx ? o.m.ctx : SL_CLI_MIN(SL_CLI_MIN(n + o.n_new, info.max_position), INT32_MAX);
    sl_session_params sp = {.max_ctx = (int32_t)ctx, .max_batch = (int32_t)o.m.batch};
    if (!known && ids_prompt_fits(ids, n, info.vocab_size, o.m.ctx ? o.m.ctx : info.max_position,
                                  o.m.ctx != 0))
        goto done;
    if (!out || !logits) {
        cli_error("out of memory");
        goto done;
    }
    if (sl_session_create(m, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_model_report(m, &o.m, sl_session_max_ctx(s));
    if (sl_session_forward(s, ids, n, logits, 0, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    /* Every new id goes through the model, the last one too, as in run, chat and serve (whose
     * KV cache keeps the reply for the next turn): -n N is N new ids, N decode steps, and the
     * statistics line says "decode N tok" in all of them. */
    int64_t made = 0;
    while (made < o.n_new) {
        out[made] = sl_argmax(logits, info.vocab_size);
        made++;
        if (sl_session_pos(s) == sl_session_max_ctx(s)) break; /* context full */
        if (sl_session_forward(s, &out[made - 1], 1, logits, 0, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
    }
    if (made < o.n_new)
        fprintf(stderr,
                "sluice: the context of %d tokens is full: stopped after %lld of %lld new ids "
                "(a larger --ctx gives more)\n",
                sl_session_max_ctx(s), (long long)made, (long long)o.n_new);
    cli_print_summary(m, stderr);
    for (int64_t i = 0; i < made; i++)
        printf("%s%d", i ? "," : "", out[i]);
    printf("\n");
    rc = cli_model_finish(m, &o.m);
done:
    free(out);
    free(logits);
    sl_session_free(s);
    sl_model_free(m);
    free(ids);
    return rc;
}
